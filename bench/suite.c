/* suite.c - the measurement every bench program shares: sessions (a
 * workload with its tape and optimizer, one step of a variant, one step's
 * memory peak), calibration and interleaved rounds. bench_core and
 * bench_policies measure through these too. On them, the suite runs one
 * workload the same way for all of them:
 *   1. check: one fwd+bwd, the loss against the workload's plain-C
 *      reference (and the gradient where it has one), then a second
 *      fwd+bwd that must give a bitwise equal loss and gradient norm;
 *   2. memory: one fwd+bwd and one train step between tg_mem_reset_peak
 *      and tg_mem_peak_bytes, minus the storage live before;
 *   3. timing: warm-up rounds, then rounds that each time forward,
 *      forward+backward, train step and (GEMM-heavy workloads) the raw
 *      GEMMs, interleaved so that drift in clock speed or load hits all
 *      alike. A sample is `reps` iterations, reps chosen so a fwd+bwd
 *      sample lasts a few ms; figures are ms per iteration;
 *   4. optionally the profiler over a few more fwd+bwd steps.
 * Forward: the loss recorded on the tape, then the scope and tape
 * released (what a forward before backward costs). Forward+backward: the
 * leaves' gradients dropped (tg_grad_zero, as PyTorch's zero_grad with
 * set_to_none), forward, backward, release. Train step: tg_optim_zero_grad,
 * forward, backward, tg_optim_step (SGD, lr 1e-3), release. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

const char *bench_policy_name(bench_policy p)
{
    switch (p) {
    case BENCH_POLICY_BALANCED:
        return "balanced";
    case BENCH_POLICY_BUDGET:
        return "budget";
    case BENCH_POLICY_SEGMENTS:
        return "segments";
    case BENCH_POLICY_BINOMIAL:
        return "binomial";
    default:
        return "none";
    }
}

/* ---- sessions */
static void drop_grads(tg_params *ps)
{
    int n = tg_params_count(ps);
    for (int i = 0; i < n; i++)
        if (tg_params_trainable(ps, i)) tg_grad_zero(tg_params_at(ps, i));
}

tg_status bench_session_step(bench_session *s, bench_variant k, bench_step_info *info)
{
    if (k == BENCH_STEP_FWD_BWD) drop_grads(s->ps);
    if (k == BENCH_STEP_TRAIN) tg_optim_zero_grad(s->opt);
    tg_scope_begin();
    tg_tensor *owned = NULL;
    tg_tensor *loss = s->lean ? s->wl->forward_lean(s->st, s->tape, s->segments, &owned)
                              : s->wl->forward(s->st, s->tape, s->segments);
    tg_status st = loss ? TG_OK : tg_last_error();
    if (!loss && !st) st = TG_ERR_INTERNAL;
    if (!st && info) {
        info->nodes = tg_tape_node_count(s->tape);
        info->saved_fwd = tg_tape_saved_peak_bytes(s->tape);
        st = tg_tensor_item(loss, &info->loss);
    }
    if (!st && k != BENCH_STEP_FWD) st = tg_backward(loss);
    if (!st && info) {
        info->saved_peak = tg_tape_saved_peak_bytes(s->tape);
        info->recomputes = tg_tape_recompute_count(s->tape);
    }
    tg_scope_end();
    tg_tensor_release(owned);
    if (!st && k == BENCH_STEP_TRAIN) st = tg_optim_step(s->opt);
    tg_tape_reset(s->tape);
    return st;
}

tg_status bench_session_mem(bench_session *s, bench_variant k, size_t *peak,
                            bench_step_info *info)
{
    /* Drop gradients first so the baseline does not hold them. */
    drop_grads(s->ps);
    size_t base = tg_mem_current_bytes();
    tg_mem_reset_peak();
    tg_status st = bench_session_step(s, k, info);
    size_t top = tg_mem_peak_bytes();
    *peak = top > base ? top - base : 0;
    return st;
}

int bench_session_sample(void *ctx, int variant, long reps)
{
    bench_session *s = ctx;
    for (long i = 0; i < reps; i++) {
        if (variant <= BENCH_STEP_TRAIN) {
            if (bench_session_step(s, (bench_variant)variant, NULL)) return -1;
        } else {
            s->wl->gemm(s->st, variant == BENCH_GEMM_ALL);
        }
    }
    return 0;
}

static tg_tape *new_tape(bench_policy policy, size_t budget)
{
    tg_tape_opts to = {0};
    if (policy == BENCH_POLICY_BALANCED) to.policy = TG_CHECKPOINT_BALANCED;
    if (policy == BENCH_POLICY_BUDGET) {
        to.policy = TG_CHECKPOINT_BUDGET;
        to.budget_bytes = budget;
    }
    return tg_tape_new(&to);
}

int bench_session_retape(bench_session *s, bench_policy policy, size_t budget, char *err,
                         size_t errlen)
{
    tg_tape_free(s->tape);
    s->tape = new_tape(policy, budget);
    s->segments = bench_seg_mode(policy);
    if (!s->tape || tg_params_requires_grad(s->ps, s->tape))
        return bench_lib_fail(err, errlen, "setup");
    return 0;
}

int bench_session_open(bench_session *s, const bench_workload *wl, const bench_suite_opts *o,
                       char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->wl = wl;
    tg_error_clear();
    if (!(s->st = wl->setup(err, errlen))) return -1;
    s->ps = wl->params(s->st);
    if (!o) return bench_session_retape(s, BENCH_POLICY_NONE, 0, err, errlen);
    s->segments = bench_seg_mode(o->policy);
    s->tape = new_tape(o->policy, o->budget_bytes);
    tg_optim_opts oo = tg_optim_defaults(TG_OPTIM_SGD);
    oo.lr = 1e-3;
    s->opt = s->tape ? tg_optim_new(s->ps, &oo) : NULL;
    if (!s->opt || tg_params_requires_grad(s->ps, s->tape))
        return bench_lib_fail(err, errlen, "setup");
    return 0;
}

void bench_session_close(bench_session *s)
{
    tg_optim_free(s->opt);
    tg_tape_free(s->tape);
    if (s->st) s->wl->teardown(s->st);
    memset(s, 0, sizeof *s);
}

/* ---- rounds */
static int timed(bench_sample_fn fn, void *ctx, int variant, long reps, double *ns)
{
    double t0 = bench_now_ns();
    int rc = fn(ctx, variant, reps);
    *ns = bench_now_ns() - t0;
    return rc;
}

/* One sample, then (while too short to say much) four times as many
 * iterations, then as many as the last sample says make target_ns. */
int bench_calibrate(bench_sample_fn fn, void *ctx, int variant, double target_ns, long *reps)
{
    long n = 1;
    double ns = 0;
    if (timed(fn, ctx, variant, n, &ns)) return -1;
    while (ns < target_ns / 4 && n < 1000000) {
        n *= 4;
        if (timed(fn, ctx, variant, n, &ns)) return -1;
    }
    if (ns < target_ns) n = (long)ceil(target_ns * (double)n / fmax(ns, 1.0));
    *reps = n > 1000000 ? 1000000 : n;
    return 0;
}

int bench_rounds(bench_sample_fn fn, void *ctx, int nvar, const int *variant, const long *reps,
                 int warmup, int runs, double *const *t)
{
    for (int round = 0; round < warmup + runs; round++)
        for (int i = 0; i < nvar; i++) {
            long n = reps ? reps[i] : 1;
            double ns;
            if (timed(fn, ctx, variant ? variant[i] : i, n, &ns)) return -1;
            if (round >= warmup) t[i][round - warmup] = ns / (double)n;
        }
    return 0;
}

/* ---- one workload's run */
static int step_or_fail(bench_session *c, bench_variant k, bench_step_info *info, bench_result *r,
                        const char *what)
{
    if (bench_session_step(c, k, info) == TG_OK) return 0;
    return bench_lib_fail(r->error, sizeof r->error, what);
}

int bench_session_check(bench_session *c, bench_result *r)
{
    bench_step_info a = {0}, b = {0};
    if (step_or_fail(c, BENCH_STEP_FWD_BWD, &a, r, "forward+backward")) return -1;
    r->loss = a.loss;
    r->nodes = a.nodes;
    r->saved_peak_bytes = a.saved_peak;
    r->recomputes = a.recomputes;
    r->grad_norm = tg_params_grad_norm(c->ps);
    if (c->wl->check_grad) {
        r->have_grad_check = true;
        if (c->wl->check_grad(c->st, &r->grad_rel_err, r->error, sizeof r->error)) return -1;
    }
    if (c->wl->reference(c->st, &r->ref_loss, r->error, sizeof r->error)) return -1;
    r->loss_rel_err = fabs(r->loss - r->ref_loss) / fmax(fabs(r->ref_loss), 1e-6);
    if (!isfinite(r->loss) || !(r->loss_rel_err <= c->wl->check_tol))
        return bench_fail(r->error, sizeof r->error,
                          "loss %.9g disagrees with the plain-C reference %.9g (relative error "
                          "%.3g > %.1g)",
                          r->loss, r->ref_loss, r->loss_rel_err, c->wl->check_tol);
    if (!isfinite(r->grad_norm))
        return bench_fail(r->error, sizeof r->error, "gradient norm is %g", r->grad_norm);
    if (step_or_fail(c, BENCH_STEP_FWD_BWD, &b, r, "forward+backward")) return -1;
    double norm2 = tg_params_grad_norm(c->ps);
    r->grad_repeatable = memcmp(&a.loss, &b.loss, sizeof a.loss) == 0 &&
                         memcmp(&r->grad_norm, &norm2, sizeof norm2) == 0;
    if (!r->grad_repeatable)
        return bench_fail(r->error, sizeof r->error,
                          "two forward+backward runs differ: loss %.17g vs %.17g, gradient norm "
                          "%.17g vs %.17g",
                          a.loss, b.loss, r->grad_norm, norm2);
    return 0;
}

static int measure_memory(bench_session *c, bench_result *r)
{
    if (bench_session_mem(c, BENCH_STEP_FWD_BWD, &r->mem_peak_bytes, NULL) ||
        bench_session_mem(c, BENCH_STEP_TRAIN, &r->mem_train_peak_bytes, NULL))
        return bench_lib_fail(r->error, sizeof r->error, "memory step");
    return 0;
}

static int timing(bench_session *c, const bench_suite_opts *o, bench_result *r)
{
    int nvar = r->have_gemm ? 5 : 3;
    double *t[5] = {0};
    int rc = -1;
    r->runs = o->quick ? 5 : 20;
    r->warmup = o->quick ? 1 : 3;
    for (int v = 0; v < nvar; v++)
        if (!(t[v] = malloc((size_t)r->runs * sizeof(double)))) {
            bench_fail(r->error, sizeof r->error, "out of memory");
            goto out;
        }
    /* Calibrate on fwd+bwd: enough iterations per sample for the clock and
     * the scheduler not to matter; every variant runs as many. */
    long reps, all[5];
    if (bench_calibrate(bench_session_sample, c, BENCH_STEP_FWD_BWD, o->quick ? 1e6 : 4e6, &reps))
        goto lib;
    r->reps = (int)reps;
    for (int v = 0; v < nvar; v++)
        all[v] = reps;
    if (bench_rounds(bench_session_sample, c, nvar, NULL, all, r->warmup, r->runs, t)) goto lib;
    for (int v = 0; v < nvar; v++)
        for (int i = 0; i < r->runs; i++)
            t[v][i] *= 1e-6; /* ms */
    r->fwd = bench_stat_of(t[0], r->runs);
    r->fwd_bwd = bench_stat_of(t[1], r->runs);
    r->train = bench_stat_of(t[2], r->runs);
    if (r->have_gemm) {
        r->gemm_fwd = bench_stat_of(t[3], r->runs);
        r->gemm_all = bench_stat_of(t[4], r->runs);
        r->ratio_fwd = r->fwd.median / r->gemm_fwd.median;
        r->ratio_fwd_bwd = r->fwd_bwd.median / r->gemm_all.median;
    }
    rc = 0;
    goto out;
lib:
    bench_lib_fail(r->error, sizeof r->error, "timed step");
out:
    for (int v = 0; v < nvar; v++)
        free(t[v]);
    return rc;
}

static int cmp_rows(const void *a, const void *b)
{
    const tg_profile_row *x = a, *y = b;
    double tx = x->forward_ms + x->backward_ms + x->recompute_ms;
    double ty = y->forward_ms + y->backward_ms + y->recompute_ms;
    return (tx < ty) - (tx > ty);
}

static int profile(bench_session *c, const bench_suite_opts *o, bench_result *r)
{
    bench_profile *p = &r->profile;
    /* Enough steps that the table is not one step's noise, at most ~1 s. */
    double per = r->fwd_bwd.median > 0 ? r->fwd_bwd.median : 1;
    int steps = (int)fmin(o->quick ? 5 : 50, fmax(2, (o->quick ? 200 : 1000) / per));
    if (tg_tape_profile_enable(c->tape, true))
        return bench_lib_fail(r->error, sizeof r->error, "profile");
    tg_tape_profile_clear(c->tape);
    for (int i = 0; i < steps; i++)
        if (step_or_fail(c, BENCH_STEP_FWD_BWD, NULL, r, "profiled step")) return -1;
    int n = tg_tape_profile_rows(c->tape, p->rows, BENCH_PROFILE_ROWS);
    tg_tape_profile_enable(c->tape, false);
    p->nrows = n < BENCH_PROFILE_ROWS ? n : BENCH_PROFILE_ROWS;
    p->steps = steps;
    for (int i = 0; i < p->nrows; i++) {
        tg_profile_row *w = &p->rows[i];
        w->forward_ms /= steps;
        w->backward_ms /= steps;
        w->recompute_ms /= steps;
        w->saved_bytes /= (size_t)steps;
        /* every step records the same ops, so counts divide exactly */
        w->calls /= steps;
        w->backward_calls /= steps;
        w->recomputes /= steps;
    }
    qsort(p->rows, (size_t)p->nrows, sizeof p->rows[0], cmp_rows);
    r->have_profile = true;
    return 0;
}

int bench_run(const bench_workload *wl, const bench_suite_opts *o, bench_result *r)
{
    memset(r, 0, sizeof *r);
    r->wl = wl;
    r->have_gemm = wl->gemm != NULL;
    tg_backend prev = tg_set_default_backend(TG_BACKEND_CPU);
    bench_session c;
    int rc = -1;
    if (bench_session_open(&c, wl, o, r->error, sizeof r->error)) goto out;
    if (bench_session_check(&c, r) || measure_memory(&c, r) || timing(&c, o, r)) goto out;
    if (o->profile && profile(&c, o, r)) goto out;
    if (wl == &bench_wl_chain) {
        bench_opts bo = {.quick = o->quick};
        if (bench_chain(&bo, &r->chain, r->error, sizeof r->error)) goto out;
        r->have_chain = true;
    }
    rc = 0;
    r->ok = true;
out:
    bench_session_close(&c);
    tg_set_default_backend(prev);
    return rc;
}

int bench_write_dot(const bench_suite_opts *o, const char *path, char *err, size_t errlen)
{
    tg_backend prev = tg_set_default_backend(TG_BACKEND_CPU);
    bench_session c;
    int rc = -1;
    if (bench_session_open(&c, &bench_wl_mlp, o, err, errlen)) goto out;
    tg_scope_begin();
    tg_tensor *loss = c.wl->forward(c.st, c.tape, c.segments);
    tg_status st = loss ? tg_tape_export_dot(c.tape, path) : tg_last_error();
    tg_scope_end();
    tg_tape_reset(c.tape);
    if (st) {
        bench_lib_fail(err, errlen, "DOT export");
        goto out;
    }
    rc = 0;
out:
    bench_session_close(&c);
    tg_set_default_backend(prev);
    return rc;
}
