/* test_registry_sweep.c - every differentiable op in the registry is
 * gradient-checked.
 *
 * The sweep walks the registry (tg_op_count / tg_op_at). Each op marked
 * TG_AD_BACKWARD must have a .sample; every case it yields (k = 0, 1, ...
 * until it returns 0) is checked with tg_gradcheck (f64 central differences,
 * the default tolerances atol 1e-7, rtol 1e-5) through tg_op_call, on the
 * ref and on the cpu backend (the default backend is set before sample runs,
 * since samples create their tensors there). Fast (directional) mode runs
 * once per op and backend as well.
 *
 * The coverage check is a function (ops_lacking_cases) so that it can itself
 * be tested: a user op registered with a backward but no sample must show up
 * in it. Likewise a user op with a deliberately wrong backward must make the
 * per-op check fail, so the sweep is known to be able to fail.
 *
 * Around the sweep: the binary elementwise samples include broadcasting
 * shapes; each input gets the same gradient when it is the only one tracked
 * (the backward's needs_grad branches) as when all are; non-differentiable
 * ops return untracked results on tracked inputs; unmarked ops (the fused
 * *_backward ops) fail with TG_ERR_NOT_DIFFERENTIABLE naming op and input.
 *
 * Every test releases what it creates and ends with tu_expect_no_leaks: tensor
 * storage (tg_mem_current_bytes) is back where it started and, in
 * AddressSanitizer builds, LeakSanitizer finds nothing. */
#include <criterion/criterion.h>
#include <tapegrad.h>

#include "test_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CASES 64  /* a sample still yielding cases past this is broken */
#define LOG_CAP 16384 /* bytes of failure text kept per sweep */
#define MAX_LACKING 64

static const tg_backend backends[2] = {TG_BACKEND_REF, TG_BACKEND_CPU};

/* ---- Failure log: the sweep helpers append one line per failure and count
 * them, so that tests can assert both that a clean sweep logs nothing and
 * that a broken op is reported with the right details. */
typedef struct sweep_log {
    int failures;
    size_t len;
    char text[LOG_CAP];
} sweep_log;

#if defined(__GNUC__)
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define PRINTF_LIKE(f, a)
#endif
static void log_fail(sweep_log *lg, const char *fmt, ...) PRINTF_LIKE(2, 3);
static void log_fail(sweep_log *lg, const char *fmt, ...)
{
    lg->failures++;
    if (lg->len + 2 >= sizeof lg->text) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(lg->text + lg->len, sizeof lg->text - lg->len - 1, fmt, ap);
    va_end(ap);
    if (w < 0) return;
    lg->len += (size_t)w;
    if (lg->len > sizeof lg->text - 2) lg->len = sizeof lg->text - 2;
    lg->text[lg->len++] = '\n';
    lg->text[lg->len] = '\0';
}

/* ---- The function handed to tg_gradcheck: one call of the op. */
typedef struct op_call {
    const tg_op *op;
    tg_op_attrs attrs;
} op_call;

static tg_tensor *call_op(void *userdata, int n, tg_tensor *const *inputs)
{
    const op_call *c = userdata;
    return tg_op_call(c->op, n, inputs, &c->attrs);
}

/* Sample case k of op on the current default backend, with the contract
 * checked: n == arity, every input present, on the default backend, and f64
 * when floating. Returns n (> 0), 0 past the last case, or -1 (logged). */
static int sample_case(const tg_op *op, int k, tg_tensor **in, tg_op_attrs *attrs, sweep_log *lg)
{
    tg_rng rng;
    tg_rng_seed(&rng, 0x5eedu + 7919u * (uint64_t)k);
    memset(attrs, 0, sizeof *attrs);
    for (int i = 0; i < TG_OP_MAX_INPUTS; i++)
        in[i] = NULL;
    tg_error_clear();
    int n = op->sample(k, &rng, in, attrs);
    tg_backend be = tg_default_backend();
    if (n == 0) {
        tu_release_all(in, TG_OP_MAX_INPUTS);
        return 0;
    }
    if (n < 0 || n != op->arity) {
        log_fail(lg, "op '%s' case %d on %s: sample returned %d (arity %d): %s", op->name, k,
                 tg_backend_name(be), n, op->arity, tg_last_error_message());
        tu_release_all(in, TG_OP_MAX_INPUTS);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const char *bad = NULL;
        if (!in[i])
            bad = "is NULL";
        else if (tg_tensor_backend(in[i]) != be)
            bad = "is not on the default backend";
        else if (tu_is_float(tg_tensor_dtype(in[i])) && tg_tensor_dtype(in[i]) != TG_F64)
            bad = "is floating but not f64";
        if (bad) {
            log_fail(lg, "op '%s' case %d on %s: sample input %d %s", op->name, k,
                     tg_backend_name(be), i, bad);
            tu_release_all(in, TG_OP_MAX_INPUTS);
            return -1;
        }
    }
    return n;
}

/* Gradient-checks the cases of op on backend be: every case in full mode,
 * only case 0 in fast mode. Failures are logged naming the op, case,
 * backend, input and errors. Returns the number of cases that ran. */
static int check_op_on(const tg_op *op, tg_backend be, bool fast, int order, sweep_log *lg)
{
    const char *mode = order == 2 ? (fast ? " (second order, fast mode)" : " (second order)")
                                  : (fast ? " (fast mode)" : "");
    tg_backend prev = tg_set_default_backend(be);
    int ncases = 0, k;
    for (k = 0; k < MAX_CASES; k++) {
        tg_tensor *in[TG_OP_MAX_INPUTS];
        op_call c = {.op = op};
        int n = sample_case(op, k, in, &c.attrs, lg);
        if (n <= 0) break;
        tg_gradcheck_opts o = {.eps = 1e-6,
                               .atol = 1e-7,
                               .rtol = 1e-5,
                               .fast = fast,
                               .directions = 6,
                               .seed = 17u + (uint64_t)k};
        /* second order: tg_gradgradcheck, whose last entry is the seed */
        tg_gradcheck_result res[TG_OP_MAX_INPUTS + 1];
        memset(res, 0, sizeof res);
        tg_error_clear();
        tg_status st = order == 2 ? tg_gradgradcheck(call_op, &c, n, in, &o, res)
                                  : tg_gradcheck(call_op, &c, n, in, &o, res);
        int nres = order == 2 ? n + 1 : n;
        ncases++;
        int nchecked = 0;
        for (int i = 0; i < nres; i++)
            nchecked += res[i].checked;
        if (st == TG_ERR_GRADCHECK) {
            int named = 0;
            for (int i = 0; i < nres; i++) {
                if (!res[i].checked || res[i].passed) continue;
                named++;
                log_fail(lg,
                         "op '%s' case %d on %s%s: input %d: max abs err %.3g, max rel err "
                         "%.3g (worst %s %lld)",
                         op->name, k, tg_backend_name(be), mode, i, res[i].max_abs_err,
                         res[i].max_rel_err, fast ? "direction" : "index",
                         (long long)res[i].worst_index);
            }
            if (!named)
                log_fail(lg, "op '%s' case %d on %s%s: TG_ERR_GRADCHECK but no input failed: %s",
                         op->name, k, tg_backend_name(be), mode, tg_last_error_message());
        } else if (st != TG_OK) {
            log_fail(lg, "op '%s' case %d on %s%s: gradcheck returned %s: %s", op->name, k,
                     tg_backend_name(be), mode, tg_strerror(st), tg_last_error_message());
        } else if (nchecked == 0) {
            log_fail(lg, "op '%s' case %d on %s%s: no input was gradient-checked", op->name, k,
                     tg_backend_name(be), mode);
        }
        tu_release_all(in, n);
        if (fast) break;
    }
    if (k == MAX_CASES)
        log_fail(lg, "op '%s' on %s: sample still yields cases at k = %d (never returns 0)",
                 op->name, tg_backend_name(be), MAX_CASES);
    tg_set_default_backend(prev);
    return ncases;
}

/* ---- Coverage: names of the differentiable ops that lack gradcheck cases
 * (no .sample, or a sample whose case 0 yields nothing or fails). Fills
 * names (up to cap) and returns how many lack cases. */
static int ops_lacking_cases(const char **names, int cap)
{
    int nlack = 0;
    for (int i = 0; i < tg_op_count(); i++) {
        const tg_op *op = tg_op_at(i);
        if (!op || tg_op_mark(op) != TG_AD_BACKWARD) continue;
        bool lacking = op->sample == NULL;
        if (!lacking) {
            tg_tensor *in[TG_OP_MAX_INPUTS] = {0};
            tg_op_attrs attrs;
            memset(&attrs, 0, sizeof attrs);
            tg_rng rng;
            tg_rng_seed(&rng, 1);
            int n = op->sample(0, &rng, in, &attrs);
            lacking = n <= 0;
            tu_release_all(in, TG_OP_MAX_INPUTS);
        }
        if (lacking) {
            if (nlack < cap) names[nlack] = op->name;
            nlack++;
        }
    }
    tg_error_clear();
    return nlack;
}

/* The sweep: every differentiable op on both backends. covered[i] (one per
 * registry index, may be NULL) records which ops were checked on both.
 * Returns the number of such ops; *ncases counts the cases that ran. */
static int run_sweep(bool fast, int order, sweep_log *lg, bool *covered, int *ncases)
{
    int nops = 0;
    *ncases = 0;
    for (int i = 0; i < tg_op_count(); i++) {
        const tg_op *op = tg_op_at(i);
        if (covered) covered[i] = false;
        if (!op) {
            log_fail(lg, "tg_op_at(%d) returned NULL: %s", i, tg_last_error_message());
            continue;
        }
        if (tg_op_mark(op) != TG_AD_BACKWARD) continue;
        if (!op->sample) {
            log_fail(lg, "op '%s' has no gradcheck cases", op->name);
            continue;
        }
        int on_both = 0;
        for (int b = 0; b < 2; b++) {
            int nc = check_op_on(op, backends[b], fast, order, lg);
            if (nc == 0)
                log_fail(lg, "op '%s' has no gradcheck cases on %s", op->name,
                         tg_backend_name(backends[b]));
            else
                on_both++;
            *ncases += nc;
        }
        if (on_both == 2) {
            nops++;
            if (covered) covered[i] = true;
        }
    }
    return nops;
}

static int count_differentiable(void)
{
    int n = 0;
    for (int i = 0; i < tg_op_count(); i++)
        if (tg_op_mark(tg_op_at(i)) == TG_AD_BACKWARD) n++;
    return n;
}

/* No list of op names here: the sweep takes whatever the registry holds. That
 * no built-in silently goes, or loses its backward, is the ops_md test's job
 * (docs/ops.md is the registry's committed snapshot, marks included). */

/* ---- The sweep itself. */
/* Runs the sweep in a mode (fast, order) and expects no failure (what is
 * a gradcheck or gradgradcheck) and every differentiable op checked on
 * both backends; *ncases gets the cases run. Returns the ops checked. */
static int expect_clean_sweep(bool fast, int order, const char *what, int *ncases)
{
    sweep_log *lg = calloc(1, sizeof *lg);
    cr_assert(lg != NULL);
    int nops = run_sweep(fast, order, lg, NULL, ncases);
    cr_expect_eq(lg->failures, 0, "%d %s failure(s):\n%s", lg->failures, what, lg->text);
    cr_expect_eq(nops, count_differentiable(),
                 "checked %d ops on both backends, registry has %d "
                 "differentiable ones",
                 nops, count_differentiable());
    free(lg);
    return nops;
}

Test(sweep, every_differentiable_op_passes_gradcheck_on_both_backends)
{
    size_t mem0 = tg_mem_current_bytes();
    int ncases = 0;
    int nops = expect_clean_sweep(false, 1, "gradcheck", &ncases);
    cr_expect_gt(nops, 0, "the registry has no differentiable op");
    cr_expect_geq(ncases, 2 * nops, "only %d cases over %d ops", ncases, nops);
    cr_log_info("sweep: %d differentiable ops, %d gradcheck cases passed (both backends)", nops,
                ncases);
    tu_expect_no_leaks(mem0);
}

Test(sweep, every_differentiable_op_passes_fast_directional_gradcheck_on_both_backends)
{
    size_t mem0 = tg_mem_current_bytes();
    int ncases = 0;
    int nops = expect_clean_sweep(true, 1, "fast-mode gradcheck", &ncases);
    cr_expect_eq(ncases, 2 * nops, "fast mode runs once per op and backend: %d cases, %d ops",
                 ncases, nops);
    tu_expect_no_leaks(mem0);
}

/* Second order: no differentiable op is first-order only. */
Test(sweep, every_differentiable_op_passes_gradgradcheck_on_both_backends)
{
    size_t mem0 = tg_mem_current_bytes();
    int ncases = 0;
    int nops = expect_clean_sweep(false, 2, "gradgradcheck", &ncases);
    cr_expect_geq(ncases, 2 * nops, "only %d cases over %d ops", ncases, nops);
    cr_log_info("sweep: %d differentiable ops, %d gradgradcheck cases passed (both backends)",
                nops, ncases);
    tu_expect_no_leaks(mem0);
}

Test(sweep, every_differentiable_op_passes_fast_gradgradcheck_on_both_backends)
{
    size_t mem0 = tg_mem_current_bytes();
    int ncases = 0;
    int nops = expect_clean_sweep(true, 2, "fast gradgradcheck", &ncases);
    cr_expect_eq(ncases, 2 * nops, "fast mode runs once per op and backend: %d cases, %d ops",
                 ncases, nops);
    tu_expect_no_leaks(mem0);
}

/* ---- Second-order results under each checkpoint policy: the HVP-like
 * d<J^T v, w>/dx of one op call, recorded under NONE, BALANCED, BUDGET,
 * and inside a tg_checkpoint segment, must be bitwise the same. Returns
 * the values, all float inputs' results joined (malloc'd), *len their
 * count; NULL when the op has no second-order path for this case (the
 * output does not depend on the inputs). */
static double *second_order_values(const op_call *c, int n, tg_tensor *const *in, int variant,
                                   int64_t *len, sweep_log *lg)
{
    static const tg_tape_opts opts[4] = {
        {.policy = TG_CHECKPOINT_NONE},
        {.policy = TG_CHECKPOINT_BALANCED},
        {.policy = TG_CHECKPOINT_BUDGET, .budget_bytes = 1 << 24},
        {.policy = TG_CHECKPOINT_NONE},
    };
    tg_scope_begin();
    tg_tape *tape = tg_tape_new(&opts[variant]);
    tg_tensor *x[TG_OP_MAX_INPUTS], *xf[TG_OP_MAX_INPUTS], *g[TG_OP_MAX_INPUTS],
        *h[TG_OP_MAX_INPUTS];
    int nf = 0;
    for (int i = 0; i < n; i++) {
        x[i] = in[i];
        if (!tu_is_float(tg_tensor_dtype(in[i]))) continue;
        x[i] = tg_contiguous(tg_detach(in[i]));
        x[i] = tg_add_scalar(x[i], 0.0); /* a copy of its own */
        cr_assert_eq(tg_requires_grad(tape, x[i]), TG_OK, "%s", tg_last_error_message());
        xf[nf++] = x[i];
    }
    if (variant == 3) tg_checkpoint_begin(tape);
    tg_tensor *y = tg_op_call(c->op, n, x, &c->attrs);
    if (variant == 3) tg_checkpoint_end(tape);
    cr_assert_not_null(y, "'%s': %s", c->op->name, tg_last_error_message());
    double *out = NULL;
    *len = 0;
    if (tg_tensor_requires_grad(y) && tu_is_float(tg_tensor_dtype(y))) {
        tg_rng r;
        tg_rng_seed(&r, 99);
        tg_tensor *v = tg_cast(tg_rand_uniform(&r, TG_F64, tg_tensor_ndim(y), tg_tensor_shape(y),
                                               -1.0, 1.0),
                               tg_tensor_dtype(y));
        v = tg_to_device(v, tg_tensor_backend(y));
        tg_grad_opts o = {.create_graph = true, .allow_unused = true};
        tg_tensor *s = NULL;
        if (tg_grad_of(1, &y, &v, nf, xf, g, &o) != TG_OK) {
            log_fail(lg, "op '%s' under policy %d: %s", c->op->name, variant,
                     tg_last_error_message());
            nf = 0;
        }
        for (int i = 0; i < nf; i++) {
            if (!tg_tensor_requires_grad(g[i])) continue;
            tg_tensor *w = tg_to_device(tg_rand_uniform(&r, TG_F64, tg_tensor_ndim(g[i]),
                                                        tg_tensor_shape(g[i]), -1.0, 1.0),
                                        tg_tensor_backend(g[i]));
            tg_tensor *t = tg_sum(tg_mul(g[i], w));
            s = s ? tg_add(s, t) : t;
        }
        if (s) {
            tg_grad_opts o2 = {.allow_unused = true};
            if (tg_grad_of(1, &s, NULL, nf, xf, h, &o2) != TG_OK) {
                log_fail(lg, "op '%s' under policy %d, second sweep: %s", c->op->name, variant,
                         tg_last_error_message());
                nf = 0;
            }
            int64_t total = 0;
            for (int i = 0; i < nf; i++) total += tg_tensor_numel(h[i]);
            out = malloc((size_t)(total ? total : 1) * sizeof *out);
            for (int i = 0; i < nf; i++) {
                double *hv = tu_values(h[i]);
                memcpy(out + *len, hv, (size_t)tg_tensor_numel(h[i]) * sizeof *out);
                *len += tg_tensor_numel(h[i]);
                free(hv);
            }
        }
    }
    tg_tape_free(tape);
    tg_scope_end();
    return out;
}

/* Calls fn on every case of every differentiable op with cases, on both
 * backends (the default backend set to each), releasing the inputs after
 * it; ctx is fn's. */
typedef void (*case_fn)(const op_call *c, int k, int n, tg_tensor **in, tg_backend be,
                        sweep_log *lg, void *ctx);

static void for_each_case(case_fn fn, void *ctx, sweep_log *lg)
{
    for (int i = 0; i < tg_op_count(); i++) {
        const tg_op *op = tg_op_at(i);
        if (tg_op_mark(op) != TG_AD_BACKWARD || !op->sample) continue;
        for (int b = 0; b < 2; b++) {
            tg_backend prev = tg_set_default_backend(backends[b]);
            for (int k = 0; k < MAX_CASES; k++) {
                tg_tensor *in[TG_OP_MAX_INPUTS];
                op_call c = {.op = op};
                int n = sample_case(op, k, in, &c.attrs, lg);
                if (n <= 0) break;
                fn(&c, k, n, in, backends[b], lg, ctx);
                tu_release_all(in, n);
            }
            tg_set_default_backend(prev);
        }
    }
}

static void compare_policies(const op_call *c, int k, int n, tg_tensor **in, tg_backend be,
                             sweep_log *lg, void *ctx)
{
    int *compared = ctx;
    int64_t len0, len;
    double *ref = second_order_values(c, n, in, 0, &len0, lg);
    for (int v = 1; v < 4 && ref; v++) {
        double *got = second_order_values(c, n, in, v, &len, lg);
        if (!got || len != len0 || memcmp(got, ref, (size_t)len * sizeof *got) != 0)
            log_fail(lg, "op '%s' case %d on %s: second order under policy %d differs from "
                         "NONE's", c->op->name, k, tg_backend_name(be), v);
        free(got);
    }
    *compared += ref != NULL;
    free(ref);
}

Test(sweep, second_order_results_are_bitwise_equal_under_every_policy)
{
    size_t mem0 = tg_mem_current_bytes();
    sweep_log *lg = calloc(1, sizeof *lg);
    cr_assert(lg != NULL);
    int compared = 0;
    for_each_case(compare_policies, &compared, lg);
    cr_expect_eq(lg->failures, 0, "%d failure(s):\n%s", lg->failures, lg->text);
    cr_expect_gt(compared, count_differentiable(), "only %d cases compared", compared);
    free(lg);
    tu_expect_no_leaks(mem0);
}

Test(sweep, sweep_covers_exactly_the_differentiable_ops_in_the_registry)
{
    size_t mem0 = tg_mem_current_bytes();
    int total = tg_op_count();
    cr_assert_gt(total, 0);
    bool *covered = calloc((size_t)total, sizeof *covered);
    sweep_log *lg = calloc(1, sizeof *lg);
    cr_assert(covered != NULL && lg != NULL);
    int ncases = 0;
    int nops = run_sweep(true, 1, lg, covered, &ncases);
    int ndiff = 0;
    for (int i = 0; i < total; i++) {
        const tg_op *op = tg_op_at(i);
        bool diff = tg_op_mark(op) == TG_AD_BACKWARD;
        ndiff += diff;
        cr_expect_eq(covered[i], diff, "op '%s' (%s): covered by the sweep = %d", op->name,
                     tg_ad_mark_name(tg_op_mark(op)), (int)covered[i]);
    }
    cr_expect_eq(nops, ndiff, "sweep covered %d ops, registry has %d differentiable", nops, ndiff);
    cr_expect_eq(lg->failures, 0, "%s", lg->text);
    const char *lack[MAX_LACKING];
    int nlack = ops_lacking_cases(lack, MAX_LACKING);
    cr_expect_eq(nlack, 0, "%d built-in differentiable op(s) lack gradcheck cases, first '%s'",
                 nlack, nlack ? lack[0] : "");
    free(covered);
    free(lg);
    tu_expect_no_leaks(mem0);
}

/* ---- Tests of the sweep itself, with user ops (y = 3x, f64 only). They
 * live in their own suite, which Criterion runs after "sweep": the ops they
 * register stay in the registry, which matters only under --no-fork. */
static tg_status triple_shape(const tg_op *op, const tg_op_attrs *attrs, tg_tensor *const *in,
                              tg_spec *out)
{
    (void)attrs;
    if (tg_tensor_dtype(in[0]) != TG_F64)
        return tg_error_set(TG_ERR_DTYPE, "bad argument #1 to '%s' (need f64)", op->name);
    out->dtype = TG_F64;
    out->ndim = tg_tensor_ndim(in[0]);
    memcpy(out->shape, tg_tensor_shape(in[0]), (size_t)out->ndim * sizeof(int64_t));
    return TG_OK;
}

static tg_tensor *triple_forward(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    const double *x = tg_tensor_data(in[0]);
    double *p = tg_tensor_data(y);
    for (int64_t i = 0; i < tg_tensor_numel(y); i++)
        p[i] = 3.0 * x[i];
    return y;
}

static tg_status triple_backward_right(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin)
{
    (void)ctx;
    gin[0] = tg_mul_scalar(gout, 3.0);
    return gin[0] ? TG_OK : tg_last_error();
}

/* Deliberately wrong: d(3x)/dx is 3, not 2. */
static tg_status triple_backward_wrong(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin)
{
    (void)ctx;
    gin[0] = tg_mul_scalar(gout, 2.0);
    return gin[0] ? TG_OK : tg_last_error();
}

static int triple_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *attrs)
{
    (void)attrs;
    if (k >= 1) return 0;
    in[0] = tg_rand_uniform(rng, TG_F64, 2, (const int64_t[]){3, 4}, -1.0, 1.0);
    return in[0] ? 1 : -1;
}

static int empty_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *attrs)
{
    (void)k;
    (void)rng;
    (void)in;
    (void)attrs;
    return 0;
}

static tg_op triple_def(const char *name)
{
    tg_op def = {.name = name,
                 .doc = "y = 3x",
                 .arity = 1,
                 .shape = triple_shape,
                 .forward = triple_forward,
                 .cost = TG_COST_MEMORY_BOUND};
    return def;
}

static bool in_list(const char *const *names, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0) return true;
    return false;
}

Test(sweep_selftest, coverage_check_flags_a_user_op_with_a_backward_but_no_gradcheck_cases)
{
    size_t mem0 = tg_mem_current_bytes();
    const char *lack[MAX_LACKING];
    cr_assert_eq(ops_lacking_cases(lack, MAX_LACKING), 0, "built-ins already lack cases: '%s'",
                 lack[0]);
    int before = tg_op_count();

    tg_op no_sample = triple_def("sweep_selftest_op_without_gradcheck_cases");
    no_sample.backward = triple_backward_right;
    cr_assert_eq(tg_op_register(&no_sample), TG_OK, "%s", tg_last_error_message());
    tg_op no_cases = triple_def("sweep_selftest_op_whose_sample_yields_nothing");
    no_cases.backward = triple_backward_right;
    no_cases.sample = empty_sample;
    cr_assert_eq(tg_op_register(&no_cases), TG_OK, "%s", tg_last_error_message());
    /* Not differentiable: needs no cases and must not be flagged. */
    tg_op nondiff = triple_def("sweep_selftest_nondifferentiable_op_without_sample");
    nondiff.nondifferentiable = true;
    cr_assert_eq(tg_op_register(&nondiff), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_op_count(), before + 3);

    int nlack = ops_lacking_cases(lack, MAX_LACKING);
    cr_expect_eq(nlack, 2, "ops lacking cases: %d", nlack);
    cr_expect(in_list(lack, nlack, "sweep_selftest_op_without_gradcheck_cases"));
    cr_expect(in_list(lack, nlack, "sweep_selftest_op_whose_sample_yields_nothing"));
    cr_expect(!in_list(lack, nlack, "sweep_selftest_nondifferentiable_op_without_sample"));

    /* And the sweep itself fails, naming the op. */
    sweep_log *lg = calloc(1, sizeof *lg);
    cr_assert(lg != NULL);
    int ncases = 0;
    int nops = run_sweep(true, 1, lg, NULL, &ncases);
    cr_expect_eq(nops, count_differentiable() - 2);
    cr_expect_geq(lg->failures, 2, "%s", lg->text);
    cr_expect(strstr(lg->text, "op 'sweep_selftest_op_without_gradcheck_cases' has no gradcheck "
                               "cases") != NULL,
              "sweep log:\n%s", lg->text);
    cr_expect(strstr(lg->text, "op 'sweep_selftest_op_whose_sample_yields_nothing' has no "
                               "gradcheck cases") != NULL,
              "sweep log:\n%s", lg->text);
    cr_expect(strstr(lg->text, "sweep_selftest_nondifferentiable") == NULL, "%s", lg->text);
    free(lg);
    tu_expect_no_leaks(mem0);
}

Test(sweep_selftest, per_op_check_fails_for_a_user_op_with_a_wrong_backward_and_passes_a_right_one)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_op wrong = triple_def("sweep_selftest_op_with_wrong_backward");
    wrong.backward = triple_backward_wrong;
    wrong.sample = triple_sample;
    tg_op right = triple_def("sweep_selftest_op_with_right_backward");
    right.backward = triple_backward_right;
    right.sample = triple_sample;
    cr_assert_eq(tg_op_register(&wrong), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_op_register(&right), TG_OK, "%s", tg_last_error_message());
    const tg_op *wop = tg_op_find("sweep_selftest_op_with_wrong_backward");
    const tg_op *rop = tg_op_find("sweep_selftest_op_with_right_backward");
    cr_assert(wop != NULL && rop != NULL);

    for (int fast = 0; fast < 2; fast++)
        for (int b = 0; b < 2; b++) {
            sweep_log *lg = calloc(1, sizeof *lg);
            cr_assert(lg != NULL);
            cr_expect_eq(check_op_on(rop, backends[b], fast, 1, lg), 1);
            cr_expect_eq(lg->failures, 0, "%s", lg->text);
            memset(lg, 0, sizeof *lg);
            cr_expect_eq(check_op_on(wop, backends[b], fast, 1, lg), 1);
            cr_expect_eq(lg->failures, 1, "%s", lg->text);
            char want[160];
            snprintf(want, sizeof want,
                     "op 'sweep_selftest_op_with_wrong_backward' case 0 on %s%s: "
                     "input 0: max abs err ",
                     tg_backend_name(backends[b]), fast ? " (fast mode)" : "");
            cr_expect(strstr(lg->text, want) != NULL, "want \"%s\" in:\n%s", want, lg->text);
            cr_expect(strstr(lg->text, "max rel err") != NULL, "%s", lg->text);
            free(lg);
        }
    tu_expect_no_leaks(mem0);
}

/* Gradients of sum(w * op(inputs)) for the inputs in mask (bit i: input i
 * is tracked), each a new reference in g[i] (NULL for the others). w is
 * fixed by seed. Failures are logged. */
static void grads_with_mask(const op_call *c, int k, int n, tg_tensor *const *in, unsigned mask,
                            tg_tensor **g, sweep_log *lg)
{
    const char *bn = tg_backend_name(tg_default_backend());
    tg_tensor *leaf[TG_OP_MAX_INPUTS] = {0};
    tg_tape *tape = tg_tape_new(NULL);
    cr_assert(tape != NULL);
    for (int i = 0; i < n; i++) {
        g[i] = NULL;
        leaf[i] = tg_to_device(in[i], tg_tensor_backend(in[i])); /* a private copy */
        cr_assert(leaf[i] != NULL, "%s", tg_last_error_message());
        if (mask & (1u << i)) cr_assert_eq(tg_requires_grad(tape, leaf[i]), TG_OK);
    }
    tg_error_clear();
    tg_tensor *y = tg_op_call(c->op, n, leaf, &c->attrs);
    if (!y) {
        log_fail(lg, "op '%s' case %d on %s, tracked mask %#x: %s", c->op->name, k, bn, mask,
                 tg_last_error_message());
    } else {
        tg_rng rng;
        tg_rng_seed(&rng, 77);
        tg_backend prev = tg_set_default_backend(tg_tensor_backend(y)); /* to_device moves y */
        tg_tensor *w = tg_rand_uniform(&rng, tg_tensor_dtype(y), tg_tensor_ndim(y),
                                       tg_tensor_shape(y), 0.5, 1.5);
        tg_set_default_backend(prev);
        cr_assert(w != NULL, "%s", tg_last_error_message());
        tg_status st = tg_backward_seed(y, w);
        if (st != TG_OK)
            log_fail(lg, "op '%s' case %d on %s, tracked mask %#x: backward %s: %s", c->op->name, k,
                     bn, mask, tg_strerror(st), tg_last_error_message());
        for (int i = 0; i < n && st == TG_OK; i++) {
            if (!(mask & (1u << i))) continue;
            g[i] = tg_grad(leaf[i]);
            if (!g[i])
                log_fail(lg, "op '%s' case %d on %s, tracked mask %#x: no gradient for input %d",
                         c->op->name, k, bn, mask, i);
            tg_tensor_retain(g[i]);
        }
        tg_tensor_release(w);
    }
    tg_tensor_release(y);
    tu_release_all(leaf, n);
    tg_tape_free(tape);
}

static void compare_single_input(const op_call *c, int k, int n, tg_tensor **in, tg_backend be,
                                 sweep_log *lg, void *ctx)
{
    int *ncompared = ctx;
    unsigned all = 0;
    for (int j = 0; j < n; j++)
        if (tu_is_float(tg_tensor_dtype(in[j]))) all |= 1u << j;
    tg_tensor *gall[TG_OP_MAX_INPUTS], *gone[TG_OP_MAX_INPUTS];
    grads_with_mask(c, k, n, in, all, gall, lg);
    for (int j = 0; j < n; j++) {
        if (!(all & (1u << j)) || all == (1u << j) || !gall[j]) continue;
        grads_with_mask(c, k, n, in, 1u << j, gone, lg);
        if (gone[j]) {
            int64_t m = tg_tensor_numel(gall[j]);
            double worst = 0.0;
            for (int64_t e = 0; e < m; e++) {
                double u = 0, v = 0;
                tg_tensor_get(gall[j], e, &u);
                tg_tensor_get(gone[j], e, &v);
                double err = fabs(u - v) / fmax(1.0, fabs(u));
                if (!(err <= worst)) worst = isnan(err) ? INFINITY : err;
            }
            if (!(worst <= 1e-13) || tg_tensor_numel(gone[j]) != m)
                log_fail(lg,
                         "op '%s' case %d on %s: input %d alone gets a gradient "
                         "differing by %.3g (relative) from all tracked",
                         c->op->name, k, tg_backend_name(be), j, worst);
            (*ncompared)++;
        }
        tu_release_all(gone, n);
    }
    tu_release_all(gall, n);
}

/* Backward functions skip inputs that need no gradient: the branch taken
 * when only input j is tracked must give the same gradient as when all
 * are (the same kernels run, so to 1e-13 relative). */
Test(sweep, each_input_gets_the_same_gradient_when_it_is_the_only_one_tracked)
{
    size_t mem0 = tg_mem_current_bytes();
    sweep_log *lg = calloc(1, sizeof *lg);
    cr_assert(lg != NULL);
    int ncompared = 0;
    for_each_case(compare_single_input, &ncompared, lg);
    cr_expect_eq(lg->failures, 0, "%d failure(s):\n%s", lg->failures, lg->text);
    cr_expect_gt(ncompared, 0);
    cr_log_info("single-input gradients: %d compared", ncompared);
    free(lg);
    tu_expect_no_leaks(mem0);
}

/* Does op (binary) broadcast a (3,1) against a (4) into a (3,4)? Asked of
 * the op itself, on untracked f64 inputs: the registry has no attribute for
 * it (TG_OP_POINTWISE allows ops that take only equal shapes and scalars). */
static bool broadcasts(const tg_op *op)
{
    tg_tensor *in[2] = {tg_ones(TG_F64, 2, (const int64_t[]){3, 1}),
                        tg_ones(TG_F64, 1, (const int64_t[]){4})};
    cr_assert(in[0] && in[1], "%s", tg_last_error_message());
    tg_tensor *y = tg_op_call(op, 2, in, NULL);
    bool ok = y && tg_tensor_ndim(y) == 2 && tg_tensor_shape(y)[0] == 3 &&
              tg_tensor_shape(y)[1] == 4;
    tg_tensor_release(y);
    tu_release_all(in, 2);
    tg_error_clear();
    return ok;
}

/* The binary elementwise ops of the registry: two inputs, pointwise, with a
 * backward, and broadcasting (add, sub, mul, div, minimum, maximum today). */
static bool is_binary_broadcasting(const tg_op *op)
{
    return op->arity == 2 && (op->flags & TG_OP_POINTWISE) && tu_op_has_backward(op) &&
           broadcasts(op);
}

Test(sweep, binary_elementwise_samples_include_shapes_that_broadcast)
{
    size_t mem0 = tg_mem_current_bytes();
    int nbinary = 0;
    for (int j = 0; j < tg_op_count(); j++) {
        const tg_op *op = tg_op_at(j);
        if (!is_binary_broadcasting(op)) continue;
        nbinary++;
        cr_assert(op->sample != NULL, "op '%s' has no gradcheck cases", op->name);
        sweep_log lg = {0};
        int nbroadcast = 0, nrank = 0, ncases = 0;
        for (int k = 0; k < MAX_CASES; k++) {
            tg_tensor *in[TG_OP_MAX_INPUTS];
            tg_op_attrs attrs;
            int n = sample_case(op, k, in, &attrs, &lg);
            if (n <= 0) break;
            ncases++;
            cr_expect_eq(n, 2);
            int na = tg_tensor_ndim(in[0]), nb = tg_tensor_ndim(in[1]);
            bool same = na == nb && memcmp(tg_tensor_shape(in[0]), tg_tensor_shape(in[1]),
                                           (size_t)na * sizeof(int64_t)) == 0;
            if (!same) {
                /* It must really broadcast: the op accepts it. */
                tg_error_clear();
                tg_tensor *y = tg_op_call(op, 2, in, &attrs);
                cr_expect(y != NULL, "op '%s' case %d: shapes do not broadcast: %s", op->name, k,
                          tg_last_error_message());
                tg_tensor_release(y);
                nbroadcast++;
                if (na != nb) nrank++;
            }
            tu_release_all(in, n);
        }
        cr_expect_eq(lg.failures, 0, "%s", lg.text);
        cr_expect_geq(ncases, 1, "op '%s' has no gradcheck cases", op->name);
        cr_expect_geq(nbroadcast, 1, "op '%s': no case with broadcasting shapes", op->name);
        cr_expect_geq(nrank, 1, "op '%s': no case with inputs of different rank", op->name);
    }
    /* add, sub, mul, div at least: finding none would mean the probe broke. */
    cr_expect_geq(nbinary, 4, "only %d broadcasting binary ops found", nbinary);
    tu_expect_no_leaks(mem0);
}

/* ---- Autodiff marks. */

Test(sweep, nondifferentiable_ops_return_untracked_results_on_tracked_inputs)
{
    size_t mem0 = tg_mem_current_bytes();
    static const char *const known[] = {"gt", "eq", "argmax"};
    for (int j = 0; j < 3; j++) {
        tg_error_clear();
        const tg_op *op = tg_op_find(known[j]);
        cr_assert(op != NULL, "%s", tg_last_error_message());
        cr_expect_eq(tg_op_mark(op), TG_AD_NONDIFFERENTIABLE, "op '%s' is marked '%s'", op->name,
                     tg_ad_mark_name(tg_op_mark(op)));
    }
    for (int b = 0; b < 2; b++) {
        tg_backend prev = tg_set_default_backend(backends[b]);
        tg_rng rng;
        tg_rng_seed(&rng, 42);
        tg_tape *tape = tg_tape_new(NULL);
        cr_assert(tape != NULL);
        tg_tensor *x = tg_rand_uniform(&rng, TG_F64, 2, (const int64_t[]){3, 4}, -1.0, 1.0);
        tg_tensor *y = tg_rand_uniform(&rng, TG_F64, 1, (const int64_t[]){4}, -1.0, 1.0);
        cr_assert(x && y);
        cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
        cr_assert_eq(tg_requires_grad(tape, y), TG_OK);
        tg_error_clear();
        tg_tensor *g = tg_gt(x, y);
        tg_tensor *e = tg_eq(x, x);
        tg_tensor *a = tg_argmax(x, 1, false);
        tg_tensor *outs[3] = {g, e, a};
        const char *names[3] = {"gt", "eq", "argmax"};
        for (int j = 0; j < 3; j++) {
            cr_expect(outs[j] != NULL, "%s on %s: %s", names[j], tg_backend_name(backends[b]),
                      tg_last_error_message());
            if (!outs[j]) continue;
            cr_expect(!tg_tensor_requires_grad(outs[j]), "%s on %s returned a tracked result",
                      names[j], tg_backend_name(backends[b]));
            cr_expect(!tg_tensor_is_leaf(outs[j]));
        }
        cr_expect_eq(tg_last_error(), TG_OK, "%s", tg_last_error_message());
        cr_expect_eq(tg_tape_node_count(tape), 0, "non-differentiable ops recorded %lld nodes",
                     (long long)tg_tape_node_count(tape));
        /* The tu_values are right too: gt against the broadcast row, eq of x
         * with itself all ones, argmax the first maximum of each row. */
        if (g && e && a) {
            double *xv = tu_values(x), *yv = tu_values(y), *gv = tu_values(g), *ev = tu_values(e);
            double *av = tu_values(a);
            cr_expect_eq(tg_tensor_dtype(a), TG_I64);
            cr_expect_eq(tg_tensor_dtype(g), TG_F64);
            for (int r = 0; r < 3; r++) {
                int best = 0;
                for (int c = 0; c < 4; c++) {
                    double want = xv[r * 4 + c] > yv[c] ? 1.0 : 0.0;
                    cr_expect(fabs(gv[r * 4 + c] - want) < 1e-15, "gt[%d,%d]", r, c);
                    cr_expect(fabs(ev[r * 4 + c] - 1.0) < 1e-15, "eq[%d,%d]", r, c);
                    if (xv[r * 4 + c] > xv[r * 4 + best]) best = c;
                }
                cr_expect(fabs(av[r] - best) < 0.5, "argmax row %d: %g, want %d", r, av[r], best);
            }
            free(xv);
            free(yv);
            free(gv);
            free(ev);
            free(av);
        }
        /* An untracked result mixed back in still lets gradients flow to x:
         * d sum(gt(x, y) * x) / dx = gt(x, y). */
        tg_tensor *m = g ? tg_mul(g, x) : NULL;
        tg_tensor *l = m ? tg_sum(m) : NULL;
        cr_expect(l != NULL, "%s", tg_last_error_message());
        if (l) {
            cr_expect_eq(tg_backward(l), TG_OK, "%s", tg_last_error_message());
            tg_tensor *gx = tg_grad(x);
            cr_expect(gx != NULL, "%s", tg_last_error_message());
            if (gx) {
                double *gxv = tu_values(gx), *gv = tu_values(g);
                for (int j = 0; j < 12; j++)
                    cr_expect(fabs(gxv[j] - gv[j]) < 1e-15, "grad[%d]", j);
                free(gxv);
                free(gv);
            }
        }
        tg_tensor_release(l);
        tg_tensor_release(m);
        for (int j = 0; j < 3; j++)
            tg_tensor_release(outs[j]);
        tg_tensor_release(x);
        tg_tensor_release(y);
        tg_tape_free(tape);
        tg_set_default_backend(prev);
    }
    /* Every non-differentiable op in the registry, on tracked (3,4) f64
     * inputs with zeroed attrs: it never fails by its mark, records
     * nothing, and what it returns is untracked. */
    int nnondiff = 0, nreturned = 0;
    for (int i = 0; i < tg_op_count(); i++) {
        const tg_op *op = tg_op_at(i);
        if (tg_op_mark(op) != TG_AD_NONDIFFERENTIABLE) continue;
        nnondiff++;
        for (int b = 0; b < 2; b++) {
            tg_backend prev = tg_set_default_backend(backends[b]);
            tg_rng rng;
            tg_rng_seed(&rng, 3);
            tg_tape *tape = tg_tape_new(NULL);
            cr_assert(tape != NULL);
            tg_tensor *in[TG_OP_MAX_INPUTS] = {0};
            for (int j = 0; j < op->arity; j++) {
                in[j] = tg_rand_normal(&rng, TG_F64, 2, (const int64_t[]){3, 4}, 0.0, 1.0);
                cr_assert(in[j] != NULL);
                cr_assert_eq(tg_requires_grad(tape, in[j]), TG_OK);
            }
            tg_op_attrs attrs;
            memset(&attrs, 0, sizeof attrs);
            tg_error_clear();
            tg_tensor *out = tg_op_call(op, op->arity, in, &attrs);
            cr_expect_neq(tg_last_error(), TG_ERR_NOT_DIFFERENTIABLE, "op '%s' on %s: %s", op->name,
                          tg_backend_name(backends[b]), tg_last_error_message());
            if (out) {
                nreturned++;
                cr_expect(!tg_tensor_requires_grad(out), "op '%s' on %s returned a tracked result",
                          op->name, tg_backend_name(backends[b]));
            }
            cr_expect_eq(tg_tape_node_count(tape), 0, "op '%s' recorded a node", op->name);
            tg_tensor_release(out);
            tu_release_all(in, op->arity);
            tg_tape_free(tape);
            tg_set_default_backend(prev);
        }
    }
    cr_expect_geq(nnondiff, 3);
    cr_expect_geq(nreturned, 6, "gt, eq and argmax accept (3,4) inputs on both backends");
    tg_error_clear();
    tu_expect_no_leaks(mem0);
}

/* Valid inputs for each unmarked built-in (the fused backward ops), on the
 * default backend: n inputs or -1 for an op this test does not know. */
static int unmarked_case(const char *name, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const int64_t s[2] = {3, 4};
    memset(a, 0, sizeof *a);
    if (strcmp(name, "softmax_backward") == 0 || strcmp(name, "log_softmax_backward") == 0) {
        tg_tensor *x = tg_rand_normal(rng, TG_F64, 2, s, 0.0, 1.0);
        a->nints = 1;
        a->ints[0] = 1;
        in[0] = name[0] == 's' ? tg_softmax(x, 1) : tg_log_softmax(x, 1);
        in[1] = tg_rand_normal(rng, TG_F64, 2, s, 0.0, 1.0);
        tg_tensor_release(x);
        return 2;
    }
    if (strcmp(name, "max_dim_backward") == 0) {
        tg_tensor *x = tg_rand_normal(rng, TG_F64, 2, s, 0.0, 1.0);
        in[0] = tg_argmax(x, 1, false);
        in[1] = tg_rand_normal(rng, TG_F64, 1, (const int64_t[]){3}, 0.0, 1.0);
        a->nints = 2;
        a->ints[0] = 3;
        a->ints[1] = 4;
        a->target = 1;
        tg_tensor_release(x);
        return 2;
    }
    if (strcmp(name, "cross_entropy_backward") == 0) {
        static const int64_t t[3] = {0, 3, 1};
        tg_tensor *x = tg_rand_normal(rng, TG_F64, 2, s, 0.0, 1.0);
        in[0] = tg_log_softmax(x, 1);
        in[1] = tg_tensor_from_data(TG_I64, 1, (const int64_t[]){3}, t);
        in[2] = tg_scalar(TG_F64, 0.7);
        tg_tensor_release(x);
        return 3;
    }
    return -1;
}

Test(sweep, unmarked_ops_fail_with_not_differentiable_on_tracked_inputs)
{
    static const int64_t s34[2] = {3, 4};
    size_t mem0 = tg_mem_current_bytes();
    int nunmarked = 0, nchecked = 0;
    for (int i = 0; i < tg_op_count(); i++) {
        const tg_op *op = tg_op_at(i);
        if (tg_op_mark(op) != TG_AD_UNMARKED) continue;
        nunmarked++;
        for (int b = 0; b < 2; b++) {
            tg_backend prev = tg_set_default_backend(backends[b]);
            const char *bn = tg_backend_name(backends[b]);
            tg_rng rng;
            tg_rng_seed(&rng, 7);
            tg_tensor *in[TG_OP_MAX_INPUTS] = {0};
            tg_op_attrs attrs;
            int n = unmarked_case(op->name, &rng, in, &attrs);
            bool known = n >= 0;
            if (known) {
                cr_expect_eq(n, op->arity, "unmarked op '%s': case has %d inputs, arity %d",
                             op->name, n, op->arity);
                if (n != op->arity) {
                    tu_release_all(in, TG_OP_MAX_INPUTS);
                    tg_set_default_backend(prev);
                    continue;
                }
                /* On untracked inputs the call is valid ... */
                tg_error_clear();
                tg_tensor *y = tg_op_call(op, n, in, &attrs);
                cr_expect(y != NULL, "op '%s' on %s fails even untracked: %s", op->name, bn,
                          tg_last_error_message());
                tg_tensor_release(y);
            } else {
                /* An op this test has no valid inputs for (a later family):
                 * the mark is checked at dispatch before any shape rule, so
                 * plain f64 inputs show it. */
                n = op->arity;
                for (int j = 0; j < n; j++) {
                    in[j] = tg_rand_normal(&rng, TG_F64, 2, s34, 0.0, 1.0);
                    cr_assert(in[j] != NULL, "%s", tg_last_error_message());
                }
            }
            /* ... and with any floating input tracked it fails by its mark. */
            for (int j = 0; j < n; j++) {
                if (!tu_is_float(tg_tensor_dtype(in[j]))) continue;
                tg_tape *tape = tg_tape_new(NULL);
                cr_assert(tape != NULL);
                tg_tensor *args[TG_OP_MAX_INPUTS];
                for (int m = 0; m < n; m++)
                    args[m] = m == j ? tg_to_device(in[m], backends[b]) : tg_tensor_retain(in[m]);
                cr_assert(args[j] != NULL, "%s", tg_last_error_message());
                cr_assert_eq(tg_requires_grad(tape, args[j]), TG_OK);
                tg_error_clear();
                tg_tensor *z = tg_op_call(op, n, args, &attrs);
                cr_expect(z == NULL, "op '%s' on %s accepted tracked input %d", op->name, bn, j);
                tg_tensor_release(z);
                cr_expect_eq(tg_last_error(), TG_ERR_NOT_DIFFERENTIABLE,
                             "op '%s' on %s, tracked input %d: %s (%s)", op->name, bn, j,
                             tg_strerror(tg_last_error()), tg_last_error_message());
                char quoted[96];
                snprintf(quoted, sizeof quoted, "'%s'", op->name);
                cr_expect(strstr(tg_last_error_message(), quoted) != NULL,
                          "message does not name the op: %s", tg_last_error_message());
                char input[32];
                snprintf(input, sizeof input, "input %d", j);
                cr_expect(strstr(tg_last_error_message(), input) != NULL,
                          "message does not name %s: %s", input, tg_last_error_message());
                cr_expect_eq(tg_tape_node_count(tape), 0);
                /* The tape stays usable. */
                tg_error_clear();
                tg_tensor *m = tg_mul_scalar(args[j], 2.0);
                tg_tensor *l = m ? tg_sum(m) : NULL;
                cr_expect(l != NULL, "%s", tg_last_error_message());
                if (l) cr_expect_eq(tg_backward(l), TG_OK, "%s", tg_last_error_message());
                tg_tensor *gj = tg_grad(args[j]);
                cr_expect(gj != NULL, "tape unusable after the failed call: %s",
                          tg_last_error_message());
                if (gj) {
                    double v = 0.0;
                    cr_expect_eq(tg_tensor_get(gj, 0, &v), TG_OK);
                    cr_expect(fabs(v - 2.0) < 1e-15, "gradient %g, want 2", v);
                }
                tg_tensor_release(l);
                tg_tensor_release(m);
                tu_release_all(args, n);
                tg_tape_free(tape);
                nchecked++;
            }
            tu_release_all(in, n);
            tg_set_default_backend(prev);
        }
    }
    cr_expect_geq(nchecked, 2 * nunmarked);
    cr_expect_gt(nunmarked, 0, "the registry has no unmarked op to check");
    tg_error_clear();
    tu_expect_no_leaks(mem0);
}
