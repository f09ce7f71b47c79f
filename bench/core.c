/* core.c - the two figures that say what tapegrad costs:
 *   (a) the fixed cost per op of recording and differentiating it, on
 *       1-element tensors where the arithmetic is nothing (the chain
 *       workload);
 *   (b) the overhead over raw OpenBLAS on an MLP whose time is all GEMM
 *       (the mlp workload, against its own raw GEMMs).
 * Each result is checked against the workload's plain-C reference (loss
 * and gradient) before anything is timed. Times are CLOCK_MONOTONIC
 * medians over interleaved rounds after warm-up (suite.c's measurement).
 * The bench_core executable prints both; the suite's chain workload
 * reports (a) beside its own figures. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/* The check's worst relative error, loss or gradient. */
static double check_error(const bench_result *r)
{
    return r->have_grad_check ? fmax(r->loss_rel_err, r->grad_rel_err) : r->loss_rel_err;
}

/* Opens wl without an optimizer (policy none) and runs the suite's checks
 * on it; *res is scratch for them. */
static int open_checked(bench_session *s, const bench_workload *wl, bench_result *res,
                        double *check_err, char *err, size_t errlen)
{
    memset(res, 0, sizeof *res);
    res->wl = wl;
    if (bench_session_open(s, wl, NULL, err, errlen)) return -1;
    if (bench_session_check(s, res)) return bench_fail(err, errlen, "%s: %s", wl->name, res->error);
    *check_err = check_error(res);
    return 0;
}

/* ---- (a) tanh chain */
typedef enum { CHAIN_TAPE, CHAIN_FWD, CHAIN_PLAIN, CHAIN_NKIND } chain_kind;

typedef struct {
    bench_session s;
    float x0;
} chain_bench;

/* The plain C baseline's sink: the volatile input and sink keep the
 * compiler from hoisting the chain out of the repetitions. */
static volatile float plain_sink;

/* reps repetitions of kind: the recorded chain and its backward (the
 * leaf's gradient dropped first, as a training step does; without it the
 * leaf would also pay an accumulate per repetition), the chain with grad
 * mode off, or the chain and its derivative in plain C. */
static int chain_sample(void *ctx, int kind, long reps)
{
    chain_bench *b = ctx;
    if (kind == CHAIN_PLAIN) {
        for (long r = 0; r < reps; r++) {
            float yv, gv;
            bench_chain_plain(*(volatile float *)&b->x0, &yv, &gv); /* not hoistable */
            plain_sink = yv + gv;
        }
        return 0;
    }
    bool prev = tg_grad_set_enabled(kind != CHAIN_FWD);
    int rc = bench_session_sample(&b->s, kind == CHAIN_FWD ? BENCH_STEP_FWD : BENCH_STEP_FWD_BWD,
                                  reps);
    tg_grad_set_enabled(prev);
    return rc;
}

int bench_chain(const bench_opts *opts, bench_chain_result *res, char *err, size_t errlen)
{
    bool quick = opts && opts->quick;
    int runs = quick ? 5 : 15, warm = quick ? 1 : 3;
    double target_ns = quick ? 2e6 : 2e7; /* per timed sample */
    memset(res, 0, sizeof *res);
    res->ops = BENCH_CHAIN_OPS;
    res->runs = runs;

    chain_bench b = {.x0 = 0.5f};
    bench_result check;
    double per_op[CHAIN_NKIND][32], *t[CHAIN_NKIND] = {per_op[0], per_op[1], per_op[2]};
    long reps[CHAIN_NKIND];
    int rc = -1;
    tg_backend prev_backend = tg_set_default_backend(TG_BACKEND_CPU);
    if (open_checked(&b.s, &bench_wl_chain, &check, &res->check_err, err, errlen)) goto out;
    if (tg_tensor_copy_out(tg_params_at(b.s.ps, 0), &b.x0, sizeof b.x0)) goto lib;
    /* Each kind as many repetitions as make a sample last target_ns, for
     * the clock and scheduler noise not to matter. */
    for (int k = 0; k < CHAIN_NKIND; k++)
        if (bench_calibrate(chain_sample, &b, k, target_ns, &reps[k])) goto lib;
    if (bench_rounds(chain_sample, &b, CHAIN_NKIND, NULL, reps, warm, runs, t)) goto lib;
    res->fwd_bwd_ns = bench_median(t[CHAIN_TAPE], runs) / BENCH_CHAIN_OPS;
    res->fwd_only_ns = bench_median(t[CHAIN_FWD], runs) / BENCH_CHAIN_OPS;
    res->plain_ns = bench_median(t[CHAIN_PLAIN], runs) / BENCH_CHAIN_OPS;
    res->ratio_vs_plain = res->fwd_bwd_ns / res->plain_ns;
    res->ratio_vs_fwd = res->fwd_bwd_ns / res->fwd_only_ns;
    rc = 0;
    goto out;
lib:
    bench_lib_fail(err, errlen, "tanh chain");
out:
    bench_session_close(&b.s);
    tg_set_default_backend(prev_backend);
    return rc;
}

void bench_print_chain(FILE *f, const bench_chain_result *r)
{
    fprintf(f,
            "(a) tanh chain: %d ops on a 1-element f32 tensor, cpu backend "
            "(median of %d runs)\n",
            r->ops, r->runs);
    fprintf(f, "    record + backward   %9.1f ns/op\n", r->fwd_bwd_ns);
    fprintf(f, "    forward, grad off   %9.1f ns/op   record+backward / forward = %.1fx\n",
            r->fwd_only_ns, r->ratio_vs_fwd);
    fprintf(f, "    plain C tanhf+deriv %9.2f ns/op   tapegrad / plain C = %.1fx\n", r->plain_ns,
            r->ratio_vs_plain);
}

/* ---- (b) MLP */
int bench_mlp(const bench_opts *opts, bench_mlp_result *res, char *err, size_t errlen)
{
    bool quick = opts && opts->quick;
    enum { TG_STEP, RAW_STEP, TG_FWD, RAW_FWD, NVAR };
    /* Interleaved in this order so drift in clock speed hits all alike. */
    static const int variant[NVAR] = {BENCH_STEP_FWD_BWD, BENCH_GEMM_ALL, BENCH_STEP_FWD,
                                      BENCH_GEMM_FWD};
    const bench_workload *wl = &bench_wl_mlp;
    int runs = quick ? 20 : 40, warm = quick ? 2 : 5;
    memset(res, 0, sizeof *res);
    res->batch = BENCH_MLP_BATCH;
    res->in = bench_mlp_dims[0];
    res->hidden = bench_mlp_dims[1];
    res->classes = bench_mlp_dims[3];
    res->runs = runs;
    res->flops_fwd = wl->gemm_flops_fwd;
    res->flops_total = wl->gemm_flops_all;

    bench_session s;
    bench_result check;
    int rc = -1;
    double *t[NVAR] = {0};
    tg_backend prev = tg_set_default_backend(TG_BACKEND_CPU);
    if (open_checked(&s, wl, &check, &res->check_err, err, errlen)) goto out;
    for (int v = 0; v < NVAR; v++)
        if (!(t[v] = malloc((size_t)runs * sizeof(double)))) {
            bench_fail(err, errlen, "mlp: out of memory");
            goto out;
        }
    if (bench_rounds(bench_session_sample, &s, NVAR, variant, NULL, warm, runs, t)) {
        bench_lib_fail(err, errlen, "mlp step");
        goto out;
    }
    res->tg_step_ms = bench_median(t[TG_STEP], runs) * 1e-6;
    res->raw_step_ms = bench_median(t[RAW_STEP], runs) * 1e-6;
    res->tg_fwd_ms = bench_median(t[TG_FWD], runs) * 1e-6;
    res->raw_fwd_ms = bench_median(t[RAW_FWD], runs) * 1e-6;
    res->tg_gflops = res->flops_total / (res->tg_step_ms * 1e6);
    res->raw_gflops = res->flops_total / (res->raw_step_ms * 1e6);
    res->ratio = res->tg_step_ms / res->raw_step_ms;
    res->fwd_ratio = res->tg_fwd_ms / res->raw_fwd_ms;
    rc = 0;
out:
    for (int v = 0; v < NVAR; v++)
        free(t[v]);
    bench_session_close(&s);
    tg_set_default_backend(prev);
    return rc;
}

void bench_print_mlp(FILE *f, const bench_mlp_result *r)
{
    fprintf(f,
            "(b) MLP %d-%d-%d-%d ReLU, batch %d, f32, cpu backend, cross-entropy "
            "(median of %d runs)\n",
            r->in, r->hidden, r->hidden, r->classes, r->batch, r->runs);
    fprintf(f, "    checked against a plain C + cblas_sgemm reference: max rel error %.2g\n",
            r->check_err);
    fprintf(f, "                                 time    GFLOP/s\n");
    fprintf(f, "    tapegrad forward+backward %8.3f ms %8.1f\n", r->tg_step_ms, r->tg_gflops);
    fprintf(f, "    raw sgemm, same 8 GEMMs   %8.3f ms %8.1f   tapegrad/raw = %.3f\n",
            r->raw_step_ms, r->raw_gflops, r->ratio);
    fprintf(f, "    tapegrad forward          %8.3f ms %8.1f\n", r->tg_fwd_ms,
            r->flops_fwd / (r->tg_fwd_ms * 1e6));
    fprintf(f, "    raw sgemm, 3 forward      %8.3f ms %8.1f   tapegrad/raw = %.3f\n",
            r->raw_fwd_ms, r->flops_fwd / (r->raw_fwd_ms * 1e6), r->fwd_ratio);
}

/* ---- JSON pieces (objects without the key) */
void bench_json_chain(FILE *f, const bench_chain_result *c)
{
    fprintf(f,
            "{\"ops\": %d, \"runs\": %d, \"fwd_bwd_ns_per_op\": %.6g, "
            "\"fwd_only_ns_per_op\": %.6g, \"plain_c_ns_per_op\": %.6g, "
            "\"ratio_vs_plain_c\": %.6g, \"ratio_vs_fwd_only\": %.6g, "
            "\"check_error\": %.6g}",
            c->ops, c->runs, c->fwd_bwd_ns, c->fwd_only_ns, c->plain_ns, c->ratio_vs_plain,
            c->ratio_vs_fwd, c->check_err);
}

void bench_json_mlp(FILE *f, const bench_mlp_result *m)
{
    fprintf(f,
            "{\"batch\": %d, \"dims\": [%d, %d, %d, %d], \"runs\": %d, "
            "\"flops_forward\": %.0f, \"flops_step\": %.0f, "
            "\"tapegrad_step_ms\": %.6g, \"raw_sgemm_step_ms\": %.6g, "
            "\"tapegrad_forward_ms\": %.6g, \"raw_sgemm_forward_ms\": %.6g, "
            "\"tapegrad_step_gflops\": %.6g, \"raw_sgemm_step_gflops\": %.6g, "
            "\"ratio_step\": %.6g, \"ratio_forward\": %.6g, \"check_rel_error\": %.6g}",
            m->batch, m->in, m->hidden, m->hidden, m->classes, m->runs, m->flops_fwd,
            m->flops_total, m->tg_step_ms, m->raw_step_ms, m->tg_fwd_ms, m->raw_fwd_ms,
            m->tg_gflops, m->raw_gflops, m->ratio, m->fwd_ratio, m->check_err);
}
