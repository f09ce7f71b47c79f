/* hvp.c - `tapegrad bench hvp`: the Hessian-vector product of a workload's
 * loss with respect to all its parameters, timed against the workload's
 * own fwd+bwd in the same interleaved rounds (median of the per-round
 * ratios). One HVP is: the forward, tg_grad_of with create_graph, the
 * inner product <g, v> with a fixed random v, and tg_grad_of of that (the
 * second sweep goes back through the recorded backward and the forward).
 * Workloads: mlp and elementwise, as the higher-order issue asks. */
#include <math.h>
#include <stdlib.h>

#include "bench.h"

#define HVP_MAX_PARAMS 16

typedef struct hvp_ctx {
    bench_session s;
    int np;
    tg_tensor *p[HVP_MAX_PARAMS];
    tg_tensor *v[HVP_MAX_PARAMS];
    double hv_norm; /* |Hv| of the last HVP */
} hvp_ctx;

/* One HVP; with norm, also |Hv| (the check run before timing: the timed
 * steps compute the product only). */
static tg_status hvp_step(hvp_ctx *c, bool norm)
{
    tg_scope_begin();
    tg_tensor *loss = c->s.wl->forward(c->s.st, c->s.tape, false), *g[HVP_MAX_PARAMS],
              *hv[HVP_MAX_PARAMS];
    tg_status st = loss ? TG_OK : tg_last_error();
    tg_grad_opts first = {.create_graph = true, .allow_unused = true};
    if (!st) st = tg_grad_of(1, &loss, NULL, c->np, c->p, g, &first);
    tg_tensor *s = NULL;
    for (int i = 0; i < c->np && !st; i++) {
        if (!tg_tensor_requires_grad(g[i])) continue;
        tg_tensor *t = tg_sum(tg_mul(g[i], c->v[i]));
        s = s ? tg_add(s, t) : t;
        if (!s) st = tg_last_error();
    }
    tg_grad_opts second = {.allow_unused = true};
    if (!st && s) st = tg_grad_of(1, &s, NULL, c->np, c->p, hv, &second);
    if (!st && s && norm) {
        double n2 = 0, x;
        for (int i = 0; i < c->np && !st; i++)
            if (!(st = tg_tensor_item(tg_sum(tg_mul(hv[i], hv[i])), &x))) n2 += x;
        c->hv_norm = sqrt(n2);
    }
    tg_scope_end();
    tg_tape_reset(c->s.tape);
    return st;
}

static int hvp_sample(void *ctx, int variant, long reps)
{
    hvp_ctx *c = ctx;
    for (long i = 0; i < reps; i++) {
        tg_status st = variant == 0 ? bench_session_step(&c->s, BENCH_STEP_FWD_BWD, NULL)
                                    : hvp_step(c, false);
        if (st) return -1;
    }
    return 0;
}

int bench_hvp(const bench_opts *o, const bench_workload *wl, bench_hvp_result *r, char *err,
              size_t errlen)
{
    hvp_ctx c = {0};
    r->wl = wl;
    int rc = -1;
    if (bench_session_open(&c.s, wl, NULL, err, errlen)) goto out;
    c.np = tg_params_count(c.s.ps);
    if (c.np > HVP_MAX_PARAMS) {
        bench_fail(err, errlen, "%s: %d parameters (at most %d)", wl->name, c.np, HVP_MAX_PARAMS);
        goto out;
    }
    tg_rng rng;
    tg_rng_seed(&rng, 2024);
    for (int i = 0; i < c.np; i++) {
        c.p[i] = tg_params_at(c.s.ps, i);
        c.v[i] = tg_rand_uniform(&rng, tg_tensor_dtype(c.p[i]), tg_tensor_ndim(c.p[i]),
                                 tg_tensor_shape(c.p[i]), -1.0, 1.0);
        if (!c.v[i]) {
            bench_lib_fail(err, errlen, "hvp direction");
            goto out;
        }
    }
    if (hvp_step(&c, true)) {
        bench_lib_fail(err, errlen, "hvp");
        goto out;
    }
    r->hv_norm = c.hv_norm;
    if (!isfinite(r->hv_norm)) {
        bench_fail(err, errlen, "%s: |Hv| is %g", wl->name, r->hv_norm);
        goto out;
    }
    long reps[2];
    if (bench_calibrate(hvp_sample, &c, 1, o->quick ? 1e6 : 2e7, &reps[1]) ||
        bench_calibrate(hvp_sample, &c, 0, o->quick ? 1e6 : 2e7, &reps[0])) {
        bench_lib_fail(err, errlen, "calibration");
        goto out;
    }
    r->runs = o->quick ? 3 : 11;
    double *t[2] = {calloc((size_t)r->runs, sizeof(double)), calloc((size_t)r->runs, sizeof(double))};
    double *ratio = calloc((size_t)r->runs, sizeof(double));
    if (!t[0] || !t[1] || !ratio) {
        bench_fail(err, errlen, "out of memory");
    } else if (bench_rounds(hvp_sample, &c, 2, NULL, reps, 1, r->runs, t)) {
        bench_lib_fail(err, errlen, "timing");
    } else {
        for (int k = 0; k < r->runs; k++) ratio[k] = t[1][k] / t[0][k];
        r->ratio = bench_median(ratio, r->runs);
        r->fwd_bwd = bench_stat_of(t[0], r->runs);
        r->hvp = bench_stat_of(t[1], r->runs);
        rc = 0;
    }
    free(t[0]);
    free(t[1]);
    free(ratio);
out:
    for (int i = 0; i < c.np && i < HVP_MAX_PARAMS; i++) tg_tensor_release(c.v[i]);
    bench_session_close(&c.s);
    return rc;
}

int bench_hvp_cli(const bench_opts *o)
{
    static const char *const names[2] = {"mlp", "elementwise"};
    bench_env env;
    bench_env_get(&env);
    bench_print_env(stdout, &env);
    printf("Hessian-vector product of the loss w.r.t. every parameter (forward, create_graph\n"
           "sweep, second sweep) against the workload's fwd+bwd, interleaved rounds, median of\n"
           "the per-round ratios%s\n\n", o->quick ? " (quick: not a measurement)" : "");
    printf("%-12s %12s %12s %10s %6s %12s\n", "workload", "fwd+bwd ms", "hvp ms", "hvp/grad",
           "runs", "|Hv|");
    int failed = 0;
    for (int k = 0; k < 2; k++) {
        bench_hvp_result r = {0};
        char err[512] = "";
        if (bench_hvp(o, bench_workload_find(names[k]), &r, err, sizeof err)) {
            fprintf(stderr, "tapegrad bench hvp: %s\n", err);
            failed++;
            continue;
        }
        printf("%-12s %12.3f %12.3f %9.2fx %6d %12.5g\n", names[k], r.fwd_bwd.median / 1e6,
               r.hvp.median / 1e6, r.ratio, r.runs, r.hv_norm);
        fflush(stdout);
    }
    return failed ? 1 : 0;
}
