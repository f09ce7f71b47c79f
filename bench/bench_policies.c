/* bench_policies: time and memory per checkpoint policy on the three
 * workloads of the checkpointing issue and a wide MLP, each ratio taken
 * against NONE in the same run (medians of interleaved runs,
 * CLOCK_MONOTONIC). Memory: the tape's saved peak; the process's tensor
 * peak with the forward held by one scope until after backward; the same
 * with a lean forward that releases every intermediate once used; and
 * the forwards backward re-ran. The workloads are the benchmark
 * workloads (bench.h) of those names:
 *   elementwise: sum(tanh(x*x + 1) * sigmoid(x)), x 1M f32 (wl_small.c)
 *   deep:        16 x (Linear 1024 + ReLU), batch 256, f32, mean loss
 *   wide:        16 x (Linear 256 + ReLU), batch 2048, f32, mean loss
 *   lstm:        LSTM cell, input 32, hidden 128, batch 32, 32 steps
 *   lstm-seq:    the same LSTM as tg_lstm_layer (one lstm op for the steps)
 * Policies: none, balanced, budget (half of NONE's saved peak, or the least
 * multiple of 1/32 of it above that BUDGET fits), segments
 * (tg_checkpoint_sequential, sqrt(n) groups, the last a shorter unsegmented
 * tail; the elementwise chain as one segment). Before timing, every
 * policy's gradients are compared with NONE's and must be bitwise equal,
 * and the loss under NONE with the workload's plain-C reference.
 * Usage: bench_policies [--quick] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

enum { NONE = BENCH_POLICY_NONE, NPOL = BENCH_POLICY_BINOMIAL + 1 };
enum { NWL = 5 };
static const bench_workload *const workloads[NWL] = {&bench_wl_elementwise, &bench_wl_deep,
                                                     &bench_wl_wide, &bench_wl_lstm,
                                                     &bench_wl_lstm_seq};

typedef struct {
    bench_session s; /* no optimizer: its flat gradient buffer would change the peaks */
    size_t budget;   /* BENCH_POLICY_BUDGET's */
} pol_ctx;

static size_t gradient_count(tg_params *ps)
{
    size_t n = 0;
    for (int i = 0; i < tg_params_count(ps); i++) n += (size_t)tg_tensor_numel(tg_params_at(ps, i));
    return n;
}

/* Every parameter's gradient as f64, in order, in a new malloc'd array. */
static double *gradients(tg_params *ps)
{
    double *g = malloc(gradient_count(ps) * sizeof *g), *q = g;
    for (int i = 0; g && i < tg_params_count(ps); i++) {
        tg_scope_begin();
        tg_tensor *g64 = tg_cast(tg_grad(tg_params_at(ps, i)), TG_F64);
        tg_tensor_copy_out(g64, q, (size_t)tg_tensor_numel(g64) * 8);
        q += tg_tensor_numel(g64);
        tg_scope_end();
    }
    return g;
}

/* While set, a BUDGET run that fails with TG_ERR_BUDGET returns -1
 * instead of ending the program (the search for a budget that fits). */
static bool probing;

/* One forward+backward under policy p on a tape of its own: fills the
 * saved peak after the forward, the tensor-memory peak above the
 * baseline, the forwards backward re-ran and a copy of the gradients
 * (each may be NULL). Lean: intermediates are released as soon as they
 * are used (the workload's forward_lean), so the policies' savings show
 * in the peak; otherwise one scope holds the whole step's values until it
 * ends. */
static int run(pol_ctx *c, int p, bool lean, size_t *saved, size_t *mem, int64_t *recomputes,
               double **grads)
{
    char err[512];
    bench_step_info info = {0};
    size_t peak = 0;
    if (bench_session_retape(&c->s, (bench_policy)p, c->budget, err, sizeof err)) {
        fprintf(stderr, "bench_policies: %s under %s: %s\n", c->s.wl->name,
                bench_policy_name((bench_policy)p), err);
        exit(1);
    }
    c->s.lean = lean;
    if (bench_session_mem(&c->s, BENCH_STEP_FWD_BWD, &peak, &info)) {
        if (probing && tg_last_error() == TG_ERR_BUDGET) {
            tg_error_clear();
            return -1;
        }
        fprintf(stderr, "bench_policies: %s under %s: %s\n", c->s.wl->name,
                bench_policy_name((bench_policy)p), tg_last_error_message());
        exit(1);
    }
    if (saved) *saved = info.saved_fwd;
    if (mem) *mem = peak;
    if (recomputes) *recomputes = info.recomputes;
    if (grads) *grads = gradients(c->s.ps);
    return 0;
}

/* A bench_sample_fn: reps steps under policy p (timing holds the scope). */
static int sample(void *ctx, int p, long reps)
{
    for (long r = 0; r < reps; r++)
        if (run(ctx, p, false, NULL, NULL, NULL, NULL)) return -1;
    return 0;
}

enum { MAX_RUNS = 101 };

int main(int argc, char **argv)
{
    /* [--quick] [WORKLOAD...]: all five workloads unless some are named */
    bool quick = false, want[NWL] = {false}, any = false;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--quick")) {
            quick = true;
            continue;
        }
        int k = 0;
        while (k < NWL && strcmp(argv[a], workloads[k]->name)) k++;
        if (k == NWL) {
            fprintf(stderr, "usage: bench_policies [--quick] "
                            "[elementwise|deep|wide|lstm|lstm-seq ...]\n");
            return 2;
        }
        want[k] = any = true;
    }
    int runs = quick ? 3 : 11;
    tg_set_default_backend(TG_BACKEND_CPU);
    int nth = tg_num_threads();
    printf("checkpoint policies: median of %d-%d interleaved runs (more for shorter steps), f32, "
           "cpu backend, %d thread%s (OPENBLAS_NUM_THREADS), allocator %s%s\n",
           runs, quick ? runs : MAX_RUNS, nth, nth == 1 ? "" : "s", tg_mem_allocator(),
           quick ? " (quick: not a measurement)" : "");
    printf("%-12s %-9s %10s %8s %14s %14s %12s %10s\n", "workload", "policy", "fwd+bwd ms",
           "x none", "saved peak MB", "tensor peak MB", "lean peak MB", "recomputes");
    for (int k = 0; k < NWL; k++) {
        if (any && !want[k]) continue;
        const char *name = workloads[k]->name;
        pol_ctx c = {0};
        char err[512];
        if (bench_session_open(&c.s, workloads[k], NULL, err, sizeof err)) {
            fprintf(stderr, "bench_policies: %s: %s\n", name, err);
            return 1;
        }
        /* The loss against the workload's plain-C reference, and repeatable. */
        bench_result chk = {.wl = workloads[k]};
        if (bench_session_check(&c.s, &chk)) {
            fprintf(stderr, "bench_policies: %s: %s\n", name, chk.error);
            return 1;
        }
        size_t saved[NPOL], mem[NPOL];
        int64_t remade[NPOL];
        double *g[NPOL];
        run(&c, NONE, false, &saved[NONE], &mem[NONE], &remade[NONE], &g[NONE]);
        /* Half of NONE's saved peak; where BUDGET's greedy choice cannot meet
         * that (it spends the budget on the ops recorded first, and the
         * LSTM's later steps still need their untracked inputs kept), the
         * least multiple of 1/32 of NONE's peak above it that both forwards
         * fit, printed with the table. */
        size_t half = saved[NONE] / 2;
        c.budget = half;
        probing = true;
        while (c.budget < saved[NONE] &&
               (run(&c, BENCH_POLICY_BUDGET, false, NULL, NULL, NULL, NULL) < 0 ||
                run(&c, BENCH_POLICY_BUDGET, true, NULL, NULL, NULL, NULL) < 0))
            c.budget += saved[NONE] / 32;
        probing = false;
        for (int p = 1; p < NPOL; p++) run(&c, p, false, &saved[p], &mem[p], &remade[p], &g[p]);
        size_t n = gradient_count(c.s.ps), lean[NPOL];
        for (int p = 0; p < NPOL; p++) {
            double *gl = NULL;
            run(&c, p, true, NULL, &lean[p], NULL, &gl);
            if (memcmp(g[NONE], gl, n * sizeof(double))) {
                fprintf(stderr, "bench_policies: %s: %s gradients (lean forward) differ from "
                        "none's\n", name, bench_policy_name((bench_policy)p));
                return 1;
            }
            free(gl);
        }
        for (int p = 1; p < NPOL; p++)
            if (memcmp(g[NONE], g[p], n * sizeof(double))) {
                fprintf(stderr, "bench_policies: %s: %s gradients differ from none's\n", name,
                        bench_policy_name((bench_policy)p));
                return 1;
            }
        for (int p = 0; p < NPOL; p++) free(g[p]);
        /* At least `runs` rounds, more for short steps (up to MAX_RUNS, about
         * a second of NONE's steps), so that a 5 ms step's median rests on
         * more than a few samples of a noisy machine. */
        double t[NPOL][MAX_RUNS], *tp[NPOL], t1;
        for (int p = 0; p < NPOL; p++) tp[p] = t[p];
        if (bench_rounds(sample, &c, 1, (const int[]){NONE}, NULL, 0, 1, tp)) return 1;
        t1 = t[NONE][0] * 1e-9;
        int nr = quick ? runs : (int)(1.0 / t1);
        nr = nr < runs ? runs : nr > MAX_RUNS ? MAX_RUNS : nr;
        if (bench_rounds(sample, &c, NPOL, NULL, NULL, 0, nr, tp)) return 1;
        double med[NPOL];
        for (int p = 0; p < NPOL; p++) med[p] = bench_median(t[p], nr) * 1e-9;
        for (int p = 0; p < NPOL; p++)
            printf("%-12s %-9s %10.3f %8.3f %14.3f %14.3f %12.3f %10lld\n", name,
                   bench_policy_name((bench_policy)p), 1e3 * med[p], med[p] / med[NONE],
                   saved[p] / 1e6, mem[p] / 1e6, lean[p] / 1e6, (long long)remade[p]);
        if (c.budget != half)
            printf("%-12s (budget %.3f MB, %zu/32 of none's saved peak: half does not fit)\n",
                   name, c.budget / 1e6, 16 + (c.budget - half) / (saved[NONE] / 32));
        bench_session_close(&c.s);
    }
    return 0;
}
