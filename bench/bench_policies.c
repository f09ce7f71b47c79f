/* bench_policies: time and memory per checkpoint policy on the three
 * workloads of the checkpointing issue and a wide MLP, each ratio taken
 * against NONE in the same run (medians of interleaved runs,
 * CLOCK_MONOTONIC). Memory: the tape's saved peak; the process's tensor
 * peak with the forward held by one scope until after backward; the same
 * with a lean forward that releases every intermediate once used; and
 * the forwards backward re-ran.
 *   elementwise: sum(tanh(x*x + 1) * sigmoid(x)), x 1M f32 (a leaf)
 *   deep:        16 x (Linear 1024 + ReLU), batch 256, f32, mean loss
 *   wide:        16 x (Linear 256 + ReLU), batch 2048, f32, mean loss
 *   lstm:        LSTM cell, input 32, hidden 128, batch 32, 32 steps
 * Policies: none, balanced, budget (half of NONE's saved peak, or the least
 * multiple of 1/32 of it above that BUDGET fits), segments
 * (tg_checkpoint_sequential, sqrt(n) groups, the last a shorter unsegmented
 * tail; the elementwise chain as one segment). Before timing, every
 * policy's gradients are compared with NONE's and must be bitwise equal.
 * Usage: bench_policies [--quick] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tapegrad.h>
#include <time.h>

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
enum { NONE, BALANCED, BUDGET, SEGMENTS, NPOL };
static const char *const pol_names[NPOL] = {"none", "balanced", "budget", "segments"};

typedef struct {
    const char *name;
    int nparams;
    tg_tensor *p[40];
    tg_tensor *x;
    tg_params *ps;
    tg_lstm_cell *cell;
    tg_tensor *xs[32];
} workload;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static tg_tensor *deep_layer(void *ud, int l, tg_tensor *h)
{
    workload *w = ud;
    return tg_relu(tg_add(tg_matmul(h, w->p[2 * l]), w->p[2 * l + 1]));
}

static tg_tensor *lstm_step(void *ud, int t, tg_tensor *hc)
{
    workload *w = ud;
    tg_tensor *h2, *c2;
    tg_tensor *h = tg_narrow(hc, 1, 0, 128), *c = tg_narrow(hc, 1, 128, 128);
    if (tg_lstm_cell_forward(w->cell, w->xs[t], h, c, &h2, &c2)) return NULL;
    tg_tensor *both[2] = {h2, c2};
    return tg_concat(2, both, 1);
}

static tg_tensor *elem(void *ud, int l, tg_tensor *x)
{
    (void)ud;
    (void)l;
    /* Sequenced (C leaves the order of a call's arguments open), in the
     * order elem_lean records. */
    tg_tensor *c = tg_tanh(tg_add_scalar(tg_mul(x, x), 1.0));
    return tg_sum(tg_mul(c, tg_sigmoid(x)));
}

/* The elementwise chain with every intermediate released once used (the
 * caller owns what it keeps out of the scope): the forward holds at most
 * three 4 MB values, and only what the policy saves outlives it. */
static tg_tensor *elem_lean(void *ud, int l, tg_tensor *x)
{
    (void)ud;
    (void)l;
    tg_tensor *a = tg_scope_keep(tg_mul(x, x));
    tg_tensor *b = tg_scope_keep(tg_add_scalar(a, 1.0));
    tg_tensor_release(a);
    tg_tensor *c = tg_scope_keep(tg_tanh(b));
    tg_tensor_release(b);
    tg_tensor *d = tg_scope_keep(tg_sigmoid(x));
    tg_tensor *e = tg_scope_keep(tg_mul(c, d));
    tg_tensor_release(c);
    tg_tensor_release(d);
    tg_tensor *y = tg_sum(e);
    tg_tensor_release(e);
    return y;
}

/* A stage in its own scope: its intermediates die at its end, the caller
 * owns its output, and its input dies here unless it is the workload's
 * (a stage's input is the previous stage's output, owned by us). */
static tg_segment_fn lean_inner;
static tg_tensor *lean_stage(void *ud, int l, tg_tensor *h)
{
    workload *w = ud;
    tg_scope_begin();
    tg_tensor *out = tg_scope_keep(lean_inner(ud, l, h));
    tg_scope_end();
    if (h != w->x) tg_tensor_release(h);
    return out;
}

static int64_t last_recomputes; /* forwards the last run's backward re-ran */

static size_t gradient_count(const workload *w)
{
    size_t n = 0;
    for (int i = 0; i < w->nparams; i++) n += (size_t)tg_tensor_numel(w->p[i]);
    return n;
}

static tg_tensor *stages(tg_tape *tape, workload *w, int pol, bool lean, int n, tg_segment_fn fn)
{
    lean_inner = fn;
    tg_segment_fn f = lean ? lean_stage : fn;
    if (pol == SEGMENTS) return tg_checkpoint_sequential(tape, n, 0, f, w, w->x);
    tg_tensor *h = w->x;
    for (int l = 0; l < n && h; l++) h = f(w, l, h);
    return h;
}

/* One forward+backward under policy; returns seconds, fills the saved
 * peak and the process's tensor-memory peak above the baseline. Lean:
 * intermediates are released as soon as they are used (the stages run
 * in their own scopes), so the policies' savings show in the peak;
 * otherwise one scope holds the whole step's values until it ends. */
/* While set, a BUDGET run that fails with TG_ERR_BUDGET returns -1
 * instead of ending the program (the search for a budget that fits). */
static bool probing;

static double run(workload *w, int pol, size_t budget, bool lean, size_t *saved, size_t *mem,
                  double **grads)
{
    tg_tape_opts o = {0};
    if (pol == BALANCED) o.policy = TG_CHECKPOINT_BALANCED;
    if (pol == BUDGET) {
        o.policy = TG_CHECKPOINT_BUDGET;
        o.budget_bytes = budget;
    }
    tg_tape *tape = tg_tape_new(&o);
    for (int i = 0; i < w->nparams; i++) tg_requires_grad(tape, w->p[i]);
    size_t base = tg_mem_current_bytes();
    tg_mem_reset_peak();
    double t0 = now_s();
    tg_scope_begin();
    tg_tensor *loss, *last = NULL;
    if (!strcmp(w->name, "elementwise")) {
        tg_segment_fn f = lean ? elem_lean : elem;
        loss = pol == SEGMENTS ? tg_checkpoint(tape, f, w, w->x) : f(w, 0, w->x);
        if (lean) loss = tg_scope_keep(loss);
        last = loss;
    } else if (!strcmp(w->name, "deep") || !strcmp(w->name, "wide")) {
        last = stages(tape, w, pol, lean, 16, deep_layer);
        loss = tg_mean(last);
    } else {
        tg_tensor *hc = stages(tape, w, pol, lean, 32, lstm_step);
        last = hc;
        loss = tg_mean(tg_mul(hc, hc));
    }
    if (saved) *saved = tg_tape_saved_peak_bytes(tape);
    if (!loss || tg_backward(loss)) {
        if (probing && tg_last_error() == TG_ERR_BUDGET) {
            tg_scope_end();
            if (lean) tg_tensor_release(last);
            for (int i = 0; i < w->nparams; i++) tg_grad_zero(w->p[i]);
            tg_tape_free(tape);
            tg_error_clear();
            return -1.0;
        }
        fprintf(stderr, "bench_policies: %s under %s: %s\n", w->name, pol_names[pol],
                tg_last_error_message());
        exit(1);
    }
    tg_scope_end();
    if (lean) tg_tensor_release(last); /* owned: kept out of the scopes */
    last_recomputes = tg_tape_recompute_count(tape); /* a new tape: all this backward's */
    double t = now_s() - t0;
    if (mem) *mem = tg_mem_peak_bytes() - base;
    if (grads) {
        double *g = malloc(gradient_count(w) * sizeof *g), *q = g;
        for (int i = 0; i < w->nparams; i++) {
            tg_scope_begin();
            tg_tensor *g64 = tg_cast(tg_grad(w->p[i]), TG_F64);
            tg_tensor_copy_out(g64, q, (size_t)tg_tensor_numel(g64) * 8);
            q += tg_tensor_numel(g64);
            tg_scope_end();
        }
        *grads = g;
    }
    for (int i = 0; i < w->nparams; i++) tg_grad_zero(w->p[i]);
    tg_tape_free(tape);
    return t;
}

static void setup(workload *w, const char *name, tg_rng *rng)
{
    memset(w, 0, sizeof *w);
    w->name = name;
    if (!strcmp(name, "elementwise")) {
        w->x = tg_rand_uniform(rng, TG_F32, 1, SHAPE(1 << 20), -2, 2);
        w->p[0] = w->x;
        w->nparams = 1;
    } else if (!strcmp(name, "deep") || !strcmp(name, "wide")) {
        /* wide: activations (2 MB each) outweigh the weights (256 KB) */
        bool deep = !strcmp(name, "deep");
        int64_t width = deep ? 1024 : 256, batch = deep ? 256 : 2048;
        for (int l = 0; l < 16; l++) {
            w->p[2 * l] = tg_rand_normal(rng, TG_F32, 2, SHAPE(width, width), 0,
                                         sqrt(2.0 / (double)width));
            w->p[2 * l + 1] = tg_zeros(TG_F32, 1, SHAPE(width));
        }
        w->nparams = 32;
        w->x = tg_rand_normal(rng, TG_F32, 2, SHAPE(batch, width), 0, 1);
    } else {
        w->ps = tg_params_new();
        w->cell = tg_lstm_cell_new(w->ps, "lstm", 32, 128, TG_F32, rng);
        for (int i = 0; i < tg_params_count(w->ps); i++) w->p[w->nparams++] = tg_params_at(w->ps, i);
        for (int t = 0; t < 32; t++) w->xs[t] = tg_rand_normal(rng, TG_F32, 2, SHAPE(32, 32), 0, 1);
        w->x = tg_zeros(TG_F32, 2, SHAPE(32, 256));
    }
}

static void teardown(workload *w)
{
    if (w->ps) {
        tg_lstm_cell_free(w->cell);
        tg_params_free(w->ps);
        for (int t = 0; t < 32; t++) tg_tensor_release(w->xs[t]);
        tg_tensor_release(w->x);
        return;
    }
    for (int i = 0; i < w->nparams; i++)
        if (w->p[i] != w->x) tg_tensor_release(w->p[i]);
    tg_tensor_release(w->x);
}

enum { MAX_RUNS = 101 };

int main(int argc, char **argv)
{
    static const char *const names[4] = {"elementwise", "deep", "wide", "lstm"};
    /* [--quick] [WORKLOAD...]: all four workloads unless some are named */
    bool quick = false, want[4] = {false, false, false, false}, any = false;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--quick")) {
            quick = true;
            continue;
        }
        int k = 0;
        while (k < 4 && strcmp(argv[a], names[k])) k++;
        if (k == 4) {
            fprintf(stderr, "usage: bench_policies [--quick] [elementwise|deep|wide|lstm ...]\n");
            return 2;
        }
        want[k] = any = true;
    }
    int runs = quick ? 3 : 11;
    tg_rng rng;
    tg_rng_seed(&rng, 7);
    int nth = tg_num_threads();
    printf("checkpoint policies: median of %d-%d interleaved runs (more for shorter steps), f32, "
           "cpu backend, %d thread%s (OPENBLAS_NUM_THREADS), allocator %s%s\n",
           runs, quick ? runs : MAX_RUNS, nth, nth == 1 ? "" : "s", tg_mem_allocator(),
           quick ? " (quick: not a measurement)" : "");
    printf("%-12s %-9s %10s %8s %14s %14s %12s %10s\n", "workload", "policy", "fwd+bwd ms",
           "x none", "saved peak MB", "tensor peak MB", "lean peak MB", "recomputes");
    for (int k = 0; k < 4; k++) {
        if (any && !want[k]) continue;
        workload w;
        setup(&w, names[k], &rng);
        size_t saved[NPOL], mem[NPOL];
        double *g[NPOL];
        run(&w, NONE, 0, false, &saved[NONE], &mem[NONE], &g[NONE]);
        int64_t remade[NPOL];
        remade[NONE] = last_recomputes;
        /* Half of NONE's saved peak; where BUDGET's greedy choice cannot meet
         * that (it spends the budget on the ops recorded first, and the
         * LSTM's later steps still need their untracked inputs kept), the
         * least multiple of 1/32 of NONE's peak above it that both forwards
         * fit, printed with the table. */
        size_t budget = saved[NONE] / 2;
        probing = true;
        while (budget < saved[NONE] &&
               (run(&w, BUDGET, budget, false, NULL, NULL, NULL) < 0 ||
                run(&w, BUDGET, budget, true, NULL, NULL, NULL) < 0))
            budget += saved[NONE] / 32;
        probing = false;
        size_t half = saved[NONE] / 2;
        for (int p = 1; p < NPOL; p++) {
            run(&w, p, budget, false, &saved[p], &mem[p], &g[p]);
            remade[p] = last_recomputes;
        }
        size_t n = gradient_count(&w), lean[NPOL];
        for (int p = 0; p < NPOL; p++) {
            double *gl = NULL;
            run(&w, p, budget, true, NULL, &lean[p], &gl);
            if (memcmp(g[NONE], gl, n * sizeof(double))) {
                fprintf(stderr, "bench_policies: %s: %s gradients (lean forward) differ from "
                        "none's\n", names[k], pol_names[p]);
                return 1;
            }
            free(gl);
        }
        for (int p = 1; p < NPOL; p++)
            if (memcmp(g[NONE], g[p], n * sizeof(double))) {
                fprintf(stderr, "bench_policies: %s: %s gradients differ from none's\n", names[k],
                        pol_names[p]);
                return 1;
            }
        for (int p = 0; p < NPOL; p++) free(g[p]);
        /* At least `runs` rounds, more for short steps (up to MAX_RUNS, about
         * a second of NONE's steps), so that a 5 ms step's median rests on
         * more than a few samples of a noisy machine. */
        double t[NPOL][MAX_RUNS], t1 = run(&w, NONE, budget, false, NULL, NULL, NULL);
        int nr = quick ? runs : (int)(1.0 / t1);
        nr = nr < runs ? runs : nr > MAX_RUNS ? MAX_RUNS : nr;
        for (int r = 0; r < nr; r++)
            for (int p = 0; p < NPOL; p++) t[p][r] = run(&w, p, budget, false, NULL, NULL, NULL);
        double med[NPOL];
        for (int p = 0; p < NPOL; p++) {
            qsort(t[p], (size_t)nr, sizeof(double), cmp);
            med[p] = t[p][nr / 2];
        }
        for (int p = 0; p < NPOL; p++)
            printf("%-12s %-9s %10.3f %8.3f %14.3f %14.3f %12.3f %10lld\n", names[k], pol_names[p],
                   1e3 * med[p], med[p] / med[NONE], saved[p] / 1e6, mem[p] / 1e6, lean[p] / 1e6,
                   (long long)remade[p]);
        if (budget != half)
            printf("%-12s (budget %.3f MB, %zu/32 of none's saved peak: half does not fit)\n",
                   names[k], budget / 1e6, 16 + (budget - half) / (saved[NONE] / 32));
        teardown(&w);
    }
    return 0;
}
