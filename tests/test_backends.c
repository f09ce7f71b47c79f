/* test_backends.c - the ref backend is the oracle for the cpu backend.
 *
 * Each case creates its inputs on ref, copies them to cpu (tg_to_device),
 * runs the op through tg_op_call on both and compares the outputs; for
 * differentiable ops the inputs are also marked requires_grad (one tape per
 * backend), backward is seeded with the same random tensor on both, and the
 * input gradients are compared. Every case runs twice: in f64, and with its
 * floating inputs cast to f32 (tg_cast). Tolerances, |cpu - ref| <=
 *   f64: 1e-12 * max(1, |ref|)       (inputs are O(1), so this is relative
 *                                      error 1e-12 with a floor at magnitude 1)
 *   f32: 1e-6 * S + 1e-5 * |ref|     (S = max(1, max |ref|) over the tensor:
 *                                      a norm-wise floor, since sgemm sums in
 *                                      f32 where ref sums in double)
 * i64 outputs (argmax) must match exactly.
 *
 * The cases: every sample of every op that has one (walking the registry),
 * explicit cases for the ops without a sample (gt, eq, argmax and the
 * unmarked fused *_backward ops, also walked from the registry so that a new
 * one cannot be missed), and larger sizes that take the cpu fast paths:
 * BLAS gemm (with transposed and row-strided view operands), same-shape,
 * scalar and row-broadcast elementwise loops, prefix/suffix sums. A view
 * operand is made on each backend from a copied base tensor (tg_to_device
 * would make it contiguous), and in backward the base is the leaf, so the
 * gradient also flows through the recorded permute. */
#include <criterion/criterion.h>
#include <tapegrad.h>

#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F64_RTOL 1e-12
#define F32_ATOL 1e-6
#define F32_RTOL 1e-5
#define MAX_CASES 64

typedef enum prec { PREC_F64, PREC_F32 } prec;
static const char *const prec_names[2] = {"f64", "f32"};

/* Worst error seen, as a fraction of the allowed error, per precision:
 * logged so the margin of each tolerance is visible. */
static double worst_ratio[2];

/* scale is max(1, max |ref|) over the tensor: f32 kernels may accumulate in
 * f32 (BLAS sgemm) where ref accumulates in double, so an entry that
 * cancels to near 0 carries an absolute error of the size of the terms
 * summed, not of the result. */
static double allowed(double want, double scale, prec p)
{
    return p == PREC_F64 ? F64_RTOL * fmax(1.0, fabs(want))
                         : F32_ATOL * scale + F32_RTOL * fabs(want);
}

/* Compares got (cpu) with want (ref): dtype, shape, then every element.
 * One expectation per tensor, naming what and the first mismatch. */
static bool compare(const tg_tensor *got, const tg_tensor *want, prec p, const char *what)
{
    char s1[96], s2[96];
    cr_expect(got != NULL && want != NULL, "%s: missing tensor", what);
    if (!got || !want) return false;
    tg_dtype dt = tg_tensor_dtype(want);
    int nd = tg_tensor_ndim(want);
    bool same_shape =
        tg_tensor_ndim(got) == nd &&
        memcmp(tg_tensor_shape(got), tg_tensor_shape(want), (size_t)nd * sizeof(int64_t)) == 0;
    cr_expect(same_shape && tg_tensor_dtype(got) == dt, "%s: cpu gives %s %s, ref %s %s", what,
              tg_dtype_name(tg_tensor_dtype(got)),
              tg_shape_str(tg_tensor_ndim(got), tg_tensor_shape(got), s1, sizeof s1),
              tg_dtype_name(dt), tg_shape_str(nd, tg_tensor_shape(want), s2, sizeof s2));
    if (!same_shape || tg_tensor_dtype(got) != dt) return false;
    int64_t n = tg_tensor_numel(want), bad = 0, first = -1;
    double max_err = 0.0, gv0 = 0.0, wv0 = 0.0;
    if (dt == TG_I64) {
        size_t nb = (size_t)(n ? n : 1) * sizeof(int64_t);
        int64_t *g = malloc(nb), *w = malloc(nb);
        cr_assert(g && w);
        cr_assert_eq(tg_tensor_copy_out(got, g, nb), TG_OK);
        cr_assert_eq(tg_tensor_copy_out(want, w, nb), TG_OK);
        for (int64_t i = 0; i < n; i++)
            if (g[i] != w[i]) {
                if (first < 0) first = i, gv0 = (double)g[i], wv0 = (double)w[i];
                bad++;
            }
        free(g);
        free(w);
        cr_expect_eq(bad, 0, "%s: %lld of %lld indices differ, first at %lld: cpu %g, ref %g", what,
                     (long long)bad, (long long)n, (long long)first, gv0, wv0);
        return bad == 0;
    }
    double *gv = malloc((size_t)(n ? n : 1) * sizeof *gv);
    double *wv = malloc((size_t)(n ? n : 1) * sizeof *wv);
    cr_assert(gv && wv);
    double scale = 1.0;
    for (int64_t i = 0; i < n; i++) {
        cr_assert_eq(tg_tensor_get(got, i, &gv[i]), TG_OK);
        cr_assert_eq(tg_tensor_get(want, i, &wv[i]), TG_OK);
        scale = fmax(scale, fabs(wv[i]));
    }
    for (int64_t i = 0; i < n; i++) {
        double g = gv[i], w = wv[i];
        double err = fabs(g - w), tol = allowed(w, scale, p);
        if (!(err <= tol)) { /* NaN fails too */
            if (first < 0) first = i, gv0 = g, wv0 = w;
            bad++;
        }
        if (err > max_err || isnan(err)) max_err = isnan(err) ? INFINITY : err;
        double ratio = isnan(err) ? INFINITY : err / tol;
        if (ratio > worst_ratio[p]) worst_ratio[p] = ratio;
    }
    free(gv);
    free(wv);
    cr_expect_eq(bad, 0,
                 "%s: %lld of %lld elements differ beyond %s tolerance (max abs err "
                 "%.3g), first at %lld: cpu %.17g, ref %.17g",
                 what, (long long)bad, (long long)n, prec_names[p], max_err, (long long)first, gv0,
                 wv0);
    return bad == 0;
}

/* An optional view applied to an input on each backend: tg_permute(perm). */
typedef struct view_spec {
    int n; /* 0: no view */
    int perm[TG_MAX_DIMS];
} view_spec;

/* Per-test counters. */
static int cases_run;

/* Runs op on inputs made from base (on ref, not modified) on both backends
 * in precision p, and compares outputs and, if backward, input gradients.
 * views (may be NULL) turns inputs into strided views on each side. */
static void run_case_prec(const tg_op *op, const char *label, int n, tg_tensor *const *base,
                          const view_spec *views, const tg_op_attrs *attrs, bool backward, prec p)
{
    char what[256];
    tg_tensor *leaf[2][TG_OP_MAX_INPUTS] = {{0}}, *in[2][TG_OP_MAX_INPUTS] = {{0}};
    tg_tensor *out[2] = {0}, *seed[2] = {0}, *seed_base = NULL;
    tg_tape *tape[2] = {0};
    const tg_backend be[2] = {TG_BACKEND_REF, TG_BACKEND_CPU};
    bool is_to_device = strcmp(op->name, "to_device") == 0;
    tg_op_attrs at[2] = {*attrs, *attrs};
    /* to_device's attrs name the source backend (for its backward). */
    if (is_to_device) at[1].flag = TG_BACKEND_CPU;

    tg_error_clear();
    for (int i = 0; i < n; i++) {
        tg_tensor *b = base[i];
        leaf[0][i] = (p == PREC_F32 && tu_is_float(tg_tensor_dtype(b))) ? tg_cast(b, TG_F32)
                                                                        : tg_to_device(b, be[0]);
        leaf[1][i] = leaf[0][i] ? tg_to_device(leaf[0][i], be[1]) : NULL;
        cr_assert(leaf[0][i] && leaf[1][i], "%s [%s]: copying input %d: %s", label, prec_names[p],
                  i, tg_last_error_message());
        cr_assert_eq(tg_tensor_backend(leaf[1][i]), TG_BACKEND_CPU);
    }
    for (int s = 0; s < 2 && backward; s++) {
        tape[s] = tg_tape_new(NULL);
        cr_assert(tape[s] != NULL);
        for (int i = 0; i < n; i++)
            if (tu_is_float(tg_tensor_dtype(leaf[s][i])))
                cr_assert_eq(tg_requires_grad(tape[s], leaf[s][i]), TG_OK, "%s",
                             tg_last_error_message());
    }
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < n; i++) {
            if (views && views[i].n) {
                in[s][i] = tg_permute(leaf[s][i], views[i].n, views[i].perm);
                cr_assert(in[s][i] != NULL, "%s: view of input %d: %s", label, i,
                          tg_last_error_message());
                cr_assert(!tg_tensor_is_contiguous(in[s][i]) || tg_tensor_numel(in[s][i]) <= 1,
                          "%s: view of input %d is contiguous: the case tests nothing", label, i);
            } else {
                in[s][i] = tg_tensor_retain(leaf[s][i]);
            }
        }

    for (int s = 0; s < 2; s++) {
        tg_error_clear();
        out[s] = tg_op_call(op, n, in[s], &at[s]);
        cr_expect(out[s] != NULL, "%s [%s] on %s: %s (%s)", label, prec_names[p],
                  tg_backend_name(be[s]), tg_strerror(tg_last_error()), tg_last_error_message());
    }
    if (out[0] && out[1]) {
        for (int s = 0; s < 2; s++) {
            tg_backend want = is_to_device ? (tg_backend)at[s].target : be[s];
            cr_expect_eq(tg_tensor_backend(out[s]), want, "%s [%s]: output of the %s run is on %s",
                         label, prec_names[p], tg_backend_name(be[s]),
                         tg_backend_name(tg_tensor_backend(out[s])));
        }
        snprintf(what, sizeof what, "%s [%s] output", label, prec_names[p]);
        compare(out[1], out[0], p, what);
    }

    if (backward && out[0] && out[1]) {
        for (int s = 0; s < 2; s++)
            cr_expect(tg_tensor_requires_grad(out[s]), "%s [%s] on %s: output is not tracked",
                      label, prec_names[p], tg_backend_name(be[s]));
        tg_rng rng;
        tg_rng_seed(&rng, 0xbac4u);
        tg_backend prev = tg_set_default_backend(TG_BACKEND_REF);
        seed_base = tg_rand_normal(&rng, tg_tensor_dtype(out[0]), tg_tensor_ndim(out[0]),
                                   tg_tensor_shape(out[0]), 0.0, 1.0);
        tg_set_default_backend(prev);
        cr_assert(seed_base != NULL, "%s", tg_last_error_message());
        for (int s = 0; s < 2; s++) {
            seed[s] = tg_to_device(seed_base, tg_tensor_backend(out[s]));
            cr_assert(seed[s] != NULL, "%s", tg_last_error_message());
            tg_error_clear();
            tg_status st = tg_backward_seed(out[s], seed[s]);
            cr_expect_eq(st, TG_OK, "%s [%s] backward on %s: %s (%s)", label, prec_names[p],
                         tg_backend_name(be[s]), tg_strerror(st), tg_last_error_message());
        }
        for (int i = 0; i < n; i++) {
            if (!tu_is_float(tg_tensor_dtype(leaf[0][i]))) continue;
            tg_tensor *g[2];
            for (int s = 0; s < 2; s++) {
                tg_error_clear();
                g[s] = tg_grad(leaf[s][i]);
                cr_expect(g[s] != NULL, "%s [%s] on %s: no gradient for input %d: %s", label,
                          prec_names[p], tg_backend_name(be[s]), i, tg_last_error_message());
                if (g[s])
                    cr_expect_eq(tg_tensor_backend(g[s]), be[s],
                                 "%s [%s]: gradient of input %d "
                                 "of the %s run is on %s",
                                 label, prec_names[p], i, tg_backend_name(be[s]),
                                 tg_backend_name(tg_tensor_backend(g[s])));
            }
            if (g[0] && g[1]) {
                snprintf(what, sizeof what, "%s [%s] gradient of input %d", label, prec_names[p],
                         i);
                compare(g[1], g[0], p, what);
            }
        }
    }

    for (int s = 0; s < 2; s++) {
        tg_tensor_release(seed[s]);
        tg_tensor_release(out[s]);
        tu_release_all(in[s], n);
        tu_release_all(leaf[s], n);
        tg_tape_free(tape[s]);
    }
    tg_tensor_release(seed_base);
    tg_error_clear();
}

static void run_case(const tg_op *op, const char *label, int n, tg_tensor *const *base,
                     const view_spec *views, const tg_op_attrs *attrs, bool backward)
{
    run_case_prec(op, label, n, base, views, attrs, backward, PREC_F64);
    run_case_prec(op, label, n, base, views, attrs, backward, PREC_F32);
    cases_run++;
}

static void log_margins(const char *test)
{
    cr_log_info("%s: %d cases; worst error / tolerance: f64 %.3g, f32 %.3g", test, cases_run,
                worst_ratio[PREC_F64], worst_ratio[PREC_F32]);
}

/* ---- Every op with gradcheck cases. */
Test(backends, every_sampled_op_gives_the_same_outputs_and_gradients_on_cpu_as_on_ref)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_set_default_backend(TG_BACKEND_REF);
    int nops = 0, nsampled = 0;
    for (int i = 0; i < tg_op_count(); i++) {
        const tg_op *op = tg_op_at(i);
        if (!op->sample) continue;
        nsampled++;
        int k;
        for (k = 0; k < MAX_CASES; k++) {
            tg_tensor *in[TG_OP_MAX_INPUTS] = {0};
            tg_op_attrs attrs;
            memset(&attrs, 0, sizeof attrs);
            tg_rng rng;
            tg_rng_seed(&rng, 31u + (uint64_t)k);
            tg_error_clear();
            int n = op->sample(k, &rng, in, &attrs);
            if (n == 0) break;
            cr_expect_eq(n, op->arity, "op '%s' case %d: sample returned %d: %s", op->name, k, n,
                         tg_last_error_message());
            if (n != op->arity) {
                tu_release_all(in, TG_OP_MAX_INPUTS);
                break;
            }
            for (int j = 0; j < n; j++)
                cr_assert(in[j] && tg_tensor_backend(in[j]) == TG_BACKEND_REF,
                          "op '%s' case %d: input %d is not on ref", op->name, k, j);
            char label[96];
            snprintf(label, sizeof label, "op '%s' case %d", op->name, k);
            run_case(op, label, n, in, NULL, &attrs, tg_op_mark(op) == TG_AD_BACKWARD);
            tu_release_all(in, n);
        }
        cr_expect_lt(k, MAX_CASES, "op '%s': sample never returns 0", op->name);
        cr_expect_gt(k, 0, "op '%s' has a sample but no cases", op->name);
        nops++;
    }
    cr_expect_eq(nops, nsampled);
    cr_expect_geq(nops, 29, "only %d ops have samples", nops);
    log_margins("sampled ops");
    cr_log_info("sampled ops: %d ops compared", nops);
    tu_expect_no_leaks(mem0);
}

/* ---- Explicit cases, described by data. */
typedef enum dkind {
    D_UNIFORM,     /* f64 uniform in [lo, hi) */
    D_NORMAL,      /* f64 N(lo, hi^2) */
    D_AWAY,        /* f64 |x| in [lo, hi), random sign */
    D_DISTINCT,    /* f64, entries at least 0.05 apart (max, argmax) */
    D_TIES,        /* f64 multiples of 0.5 in [-2, 2]: many equal entries */
    D_TIES_I64,    /* i64 in [-2, 2] */
    D_TARGETS,     /* i64 class indices in [0, hi) */
    D_SOFTMAX,     /* softmax(N(0,1), dim) */
    D_LOG_SOFTMAX, /* log_softmax(N(0,1), dim) */
    D_ARGMAX,      /* argmax(D_DISTINCT of shape, dim) (i64, dim dropped) */
} dkind;

typedef struct din {
    dkind kind;
    int ndim;
    int64_t shape[4];
    double lo, hi;
    int dim;
    view_spec view;
} din;

typedef struct bcase {
    const char *op;
    const char *label;
    int n;
    din in[TG_OP_MAX_INPUTS];
    tg_op_attrs attrs;
} bcase;

static tg_tensor *from_doubles(int ndim, const int64_t *shape, const double *v, int64_t n,
                               tg_dtype dt)
{
    if (dt == TG_F64) return tg_tensor_from_data(TG_F64, ndim, shape, v);
    int64_t *iv = malloc((size_t)(n ? n : 1) * sizeof *iv);
    cr_assert(iv != NULL);
    for (int64_t i = 0; i < n; i++)
        iv[i] = (int64_t)v[i];
    tg_tensor *t = tg_tensor_from_data(TG_I64, ndim, shape, iv);
    free(iv);
    return t;
}

/* Builds one input on the default backend (ref). */
static tg_tensor *make_input(const din *d, tg_rng *rng)
{
    int64_t n = 1;
    for (int i = 0; i < d->ndim; i++)
        n *= d->shape[i];
    switch (d->kind) {
    case D_UNIFORM:
        return tg_rand_uniform(rng, TG_F64, d->ndim, d->shape, d->lo, d->hi);
    case D_NORMAL:
        return tg_rand_normal(rng, TG_F64, d->ndim, d->shape, d->lo, d->hi);
    case D_SOFTMAX:
    case D_LOG_SOFTMAX: {
        tg_tensor *x = tg_rand_normal(rng, TG_F64, d->ndim, d->shape, 0.0, 1.0);
        tg_tensor *y = d->kind == D_SOFTMAX ? tg_softmax(x, d->dim) : tg_log_softmax(x, d->dim);
        tg_tensor_release(x);
        return y;
    }
    default:
        break;
    }
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    cr_assert(v != NULL);
    tg_dtype dt = TG_F64;
    for (int64_t i = 0; i < n; i++) {
        double u = tg_rng_double(rng);
        switch (d->kind) {
        case D_AWAY:
            v[i] = (d->lo + (d->hi - d->lo) * u) * ((tg_rng_next(rng) & 1) ? -1 : 1);
            break;
        case D_TIES:
            v[i] = floor(u * 9.0) * 0.5 - 2.0;
            break;
        case D_TIES_I64:
            v[i] = floor(u * 5.0) - 2.0;
            dt = TG_I64;
            break;
        case D_TARGETS:
            v[i] = floor(u * d->hi);
            dt = TG_I64;
            break;
        default:
            v[i] = ((double)i - (double)n / 2) * 0.1 + 0.02 * u;
            break; /* distinct */
        }
    }
    if (d->kind == D_DISTINCT || d->kind == D_ARGMAX)
        for (int64_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
            int64_t j = (int64_t)(tg_rng_next(rng) % (uint64_t)(i + 1));
            double t = v[i];
            v[i] = v[j];
            v[j] = t;
        }
    tg_tensor *t = from_doubles(d->ndim, d->shape, v, n, dt);
    free(v);
    if (d->kind == D_ARGMAX && t) {
        tg_tensor *idx = tg_argmax(t, d->dim, false);
        tg_tensor_release(t);
        t = idx;
    }
    return t;
}

/* Runs each case of the table; backward when the op is differentiable. */
static void run_table(const bcase *cases, int ncases)
{
    tg_set_default_backend(TG_BACKEND_REF);
    for (int c = 0; c < ncases; c++) {
        const bcase *bc = &cases[c];
        tg_error_clear();
        const tg_op *op = tg_op_find(bc->op);
        cr_expect(op != NULL, "case '%s': %s", bc->label, tg_last_error_message());
        if (!op) continue;
        cr_expect_eq(bc->n, op->arity, "case '%s': %d inputs for '%s'", bc->label, bc->n, op->name);
        if (bc->n != op->arity) continue;
        tg_rng rng;
        tg_rng_seed(&rng, 1000u + (uint64_t)c);
        tg_tensor *in[TG_OP_MAX_INPUTS] = {0};
        view_spec views[TG_OP_MAX_INPUTS];
        for (int i = 0; i < bc->n; i++) {
            in[i] = make_input(&bc->in[i], &rng);
            cr_assert(in[i] != NULL, "case '%s' input %d: %s", bc->label, i,
                      tg_last_error_message());
            views[i] = bc->in[i].view;
        }
        char label[160];
        snprintf(label, sizeof label, "%s: %s", op->name, bc->label);
        run_case(op, label, bc->n, in, views, &bc->attrs, tg_op_mark(op) == TG_AD_BACKWARD);
        tu_release_all(in, bc->n);
    }
}

#define NCASES(t) ((int)(sizeof(t) / sizeof((t)[0])))
#define U(lo_, hi_, nd, ...)                                                                       \
    {                                                                                              \
        .kind = D_UNIFORM, .ndim = nd, .shape = {__VA_ARGS__}, .lo = lo_, .hi = hi_                \
    }
#define N01(nd, ...)                                                                               \
    {                                                                                              \
        .kind = D_NORMAL, .ndim = nd, .shape = {__VA_ARGS__}, .lo = 0.0, .hi = 1.0                 \
    }
#define AWAY(nd, ...)                                                                              \
    {                                                                                              \
        .kind = D_AWAY, .ndim = nd, .shape = {__VA_ARGS__}, .lo = 0.5, .hi = 2.0                   \
    }
#define T_(kind_, nd, ...)                                                                         \
    {                                                                                              \
        .kind = kind_, .ndim = nd, .shape = { __VA_ARGS__ }                                        \
    }
#define TRANSPOSED(lo_, hi_, nd, ...)                                                              \
    {                                                                                              \
        .kind = D_UNIFORM, .ndim = nd, .shape = {__VA_ARGS__}, .lo = lo_, .hi = hi_, .view = {     \
            .n = nd,                                                                               \
            .perm = TRANSPOSE_PERM_##nd                                                            \
        }                                                                                          \
    }
#define TRANSPOSE_PERM_2                                                                           \
    {                                                                                              \
        1, 0                                                                                       \
    }
#define TRANSPOSE_PERM_3                                                                           \
    {                                                                                              \
        0, 2, 1                                                                                    \
    }

/* ---- Ops without a sample: comparisons and argmax. */
Test(backends, comparisons_and_argmax_give_the_same_results_on_cpu_as_on_ref)
{
    size_t mem0 = tg_mem_current_bytes();
    static const bcase cases[] = {
        {.op = "gt",
         .label = "(3,4) > (4) with ties",
         .n = 2,
         .in = {T_(D_TIES, 2, 3, 4), T_(D_TIES, 1, 4)}},
        {.op = "gt",
         .label = "(40,25) > (40,25)",
         .n = 2,
         .in = {T_(D_TIES, 2, 40, 25), T_(D_TIES, 2, 40, 25)}},
        {.op = "gt",
         .label = "(1000) > scalar",
         .n = 2,
         .in = {T_(D_TIES, 1, 1000), T_(D_TIES, 0, 0)}},
        {.op = "gt",
         .label = "(40,1) > (1,25)",
         .n = 2,
         .in = {T_(D_TIES, 2, 40, 1), T_(D_TIES, 2, 1, 25)}},
        {.op = "gt",
         .label = "i64 (5,6) > (6)",
         .n = 2,
         .in = {T_(D_TIES_I64, 2, 5, 6), T_(D_TIES_I64, 1, 6)}},
        {.op = "eq",
         .label = "(3,4) == (4) with ties",
         .n = 2,
         .in = {T_(D_TIES, 2, 3, 4), T_(D_TIES, 1, 4)}},
        {.op = "eq",
         .label = "(40,25) == (25)",
         .n = 2,
         .in = {T_(D_TIES, 2, 40, 25), T_(D_TIES, 1, 25)}},
        {.op = "eq",
         .label = "scalar == (1000)",
         .n = 2,
         .in = {T_(D_TIES, 0, 0), T_(D_TIES, 1, 1000)}},
        {.op = "eq",
         .label = "i64 (7) == (3,7)",
         .n = 2,
         .in = {T_(D_TIES_I64, 1, 7), T_(D_TIES_I64, 2, 3, 7)}},
        {.op = "argmax",
         .label = "(5,7) dim 1",
         .n = 1,
         .in = {T_(D_DISTINCT, 2, 5, 7)},
         .attrs = {.nints = 1, .ints = {1}}},
        {.op = "argmax",
         .label = "(5,7) dim 0 keepdim",
         .n = 1,
         .in = {T_(D_DISTINCT, 2, 5, 7)},
         .attrs = {.nints = 1, .ints = {0}, .flag = 1}},
        {.op = "argmax",
         .label = "(2,3,4) dim -1",
         .n = 1,
         .in = {T_(D_DISTINCT, 3, 2, 3, 4)},
         .attrs = {.nints = 1, .ints = {-1}}},
        {.op = "argmax",
         .label = "(6,9) ties dim 1 (first maximum)",
         .n = 1,
         .in = {T_(D_TIES, 2, 6, 9)},
         .attrs = {.nints = 1, .ints = {1}}},
        {.op = "argmax",
         .label = "(64,50) dim 0",
         .n = 1,
         .in = {T_(D_DISTINCT, 2, 64, 50)},
         .attrs = {.nints = 1, .ints = {0}}},
        {.op = "argmax",
         .label = "(16,32,8) dim 1",
         .n = 1,
         .in = {T_(D_DISTINCT, 3, 16, 32, 8)},
         .attrs = {.nints = 1, .ints = {1}}},
    };
    run_table(cases, NCASES(cases));
    /* These ops need explicit cases because they have no sample. */
    static const char *const names[] = {"gt", "eq", "argmax"};
    for (int i = 0; i < 3; i++) {
        tg_error_clear();
        const tg_op *op = tg_op_find(names[i]);
        cr_assert(op != NULL, "%s", tg_last_error_message());
        cr_expect_eq(tg_op_mark(op), TG_AD_NONDIFFERENTIABLE, "op '%s' is marked '%s'", op->name,
                     tg_ad_mark_name(tg_op_mark(op)));
    }
    for (int i = 0; i < tg_op_count(); i++) {
        const tg_op *op = tg_op_at(i);
        if (tg_op_mark(op) != TG_AD_NONDIFFERENTIABLE || op->sample) continue;
        bool known = false;
        for (int j = 0; j < 3; j++)
            known |= strcmp(names[j], op->name) == 0;
        if (!known)
            cr_log_info("non-differentiable op '%s' has no sample and no cpu/ref case here",
                        op->name);
    }
    log_margins("comparisons");
    tu_expect_no_leaks(mem0);
}

/* ---- The fused backward ops (unmarked): small and large, each of them. */
static const bcase fused_cases[] = {
    {.op = "exp_backward", .label = "(3,4)", .n = 2, .in = {U(0.1, 3.0, 2, 3, 4), N01(2, 3, 4)}},
    {.op = "exp_backward", .label = "(1000)", .n = 2, .in = {U(0.1, 3.0, 1, 1000), N01(1, 1000)}},
    {.op = "log_backward", .label = "(3,4)", .n = 2, .in = {U(0.2, 3.0, 2, 3, 4), N01(2, 3, 4)}},
    {.op = "log_backward", .label = "(1000)", .n = 2, .in = {U(0.2, 3.0, 1, 1000), N01(1, 1000)}},
    {.op = "sqrt_backward", .label = "(3,4)", .n = 2, .in = {U(0.2, 3.0, 2, 3, 4), N01(2, 3, 4)}},
    {.op = "sqrt_backward",
     .label = "(40,25)",
     .n = 2,
     .in = {U(0.2, 3.0, 2, 40, 25), N01(2, 40, 25)}},
    {.op = "tanh_backward",
     .label = "(3,4)",
     .n = 2,
     .in = {U(-0.95, 0.95, 2, 3, 4), N01(2, 3, 4)}},
    {.op = "tanh_backward",
     .label = "(1000)",
     .n = 2,
     .in = {U(-0.95, 0.95, 1, 1000), N01(1, 1000)}},
    {.op = "sigmoid_backward",
     .label = "(3,4)",
     .n = 2,
     .in = {U(0.05, 0.95, 2, 3, 4), N01(2, 3, 4)}},
    {.op = "sigmoid_backward",
     .label = "(1000)",
     .n = 2,
     .in = {U(0.05, 0.95, 1, 1000), N01(1, 1000)}},
    {.op = "relu_backward", .label = "(3,4)", .n = 2, .in = {AWAY(2, 3, 4), N01(2, 3, 4)}},
    {.op = "relu_backward", .label = "(1000)", .n = 2, .in = {AWAY(1, 1000), N01(1, 1000)}},
    {.op = "pow_backward",
     .label = "(3,4) p = 2.5",
     .n = 2,
     .in = {U(0.3, 2.0, 2, 3, 4), N01(2, 3, 4)},
     .attrs = {.scalar = 2.5}},
    {.op = "pow_backward",
     .label = "(1000) p = -1.5",
     .n = 2,
     .in = {U(0.3, 2.0, 1, 1000), N01(1, 1000)},
     .attrs = {.scalar = -1.5}},
    {.op = "max_dim_backward",
     .label = "(4,5) dim 1",
     .n = 2,
     .in = {{.kind = D_ARGMAX, .ndim = 2, .shape = {4, 5}, .dim = 1}, N01(1, 4)},
     .attrs = {.nints = 2, .ints = {4, 5}, .target = 1}},
    {.op = "max_dim_backward",
     .label = "(50,40) dim 0",
     .n = 2,
     .in = {{.kind = D_ARGMAX, .ndim = 2, .shape = {50, 40}, .dim = 0}, N01(1, 40)},
     .attrs = {.nints = 2, .ints = {50, 40}, .target = 0}},
    {.op = "max_dim_backward",
     .label = "(6,7,8) dim 1",
     .n = 2,
     .in = {{.kind = D_ARGMAX, .ndim = 3, .shape = {6, 7, 8}, .dim = 1}, N01(2, 6, 8)},
     .attrs = {.nints = 3, .ints = {6, 7, 8}, .target = 1}},
    {.op = "softmax_backward",
     .label = "(3,5) dim 1",
     .n = 2,
     .in = {{.kind = D_SOFTMAX, .ndim = 2, .shape = {3, 5}, .dim = 1}, N01(2, 3, 5)},
     .attrs = {.nints = 1, .ints = {1}}},
    {.op = "softmax_backward",
     .label = "(32,100) dim 0",
     .n = 2,
     .in = {{.kind = D_SOFTMAX, .ndim = 2, .shape = {32, 100}, .dim = 0}, N01(2, 32, 100)},
     .attrs = {.nints = 1, .ints = {0}}},
    {.op = "log_softmax_backward",
     .label = "(3,5) dim -1",
     .n = 2,
     .in = {{.kind = D_LOG_SOFTMAX, .ndim = 2, .shape = {3, 5}, .dim = -1}, N01(2, 3, 5)},
     .attrs = {.nints = 1, .ints = {-1}}},
    {.op = "log_softmax_backward",
     .label = "(8,16,12) dim 1",
     .n = 2,
     .in = {{.kind = D_LOG_SOFTMAX, .ndim = 3, .shape = {8, 16, 12}, .dim = 1}, N01(3, 8, 16, 12)},
     .attrs = {.nints = 1, .ints = {1}}},
    {.op = "cross_entropy_backward",
     .label = "(4,3)",
     .n = 3,
     .in = {{.kind = D_LOG_SOFTMAX, .ndim = 2, .shape = {4, 3}, .dim = 1},
            {.kind = D_TARGETS, .ndim = 1, .shape = {4}, .hi = 3},
            U(0.5, 1.5, 0, 0)}},
    {.op = "cross_entropy_backward",
     .label = "(64,10)",
     .n = 3,
     .in = {{.kind = D_LOG_SOFTMAX, .ndim = 2, .shape = {64, 10}, .dim = 1},
            {.kind = D_TARGETS, .ndim = 1, .shape = {64}, .hi = 10},
            U(0.5, 1.5, 0, 0)}},
};

Test(backends, fused_backward_ops_give_the_same_results_on_cpu_as_on_ref)
{
    size_t mem0 = tg_mem_current_bytes();
    run_table(fused_cases, NCASES(fused_cases));
    /* Each of these fused built-ins has a small and a large case here,
     * whether or not it has a backward of its own (those with one are
     * gradchecked by the sweep too). An unmarked op of a later family
     * without a case here is compared only through the backward of the op
     * that calls it: say so in the log. */
    static const char *const fused[] = {
        "max_dim_backward", "softmax_backward", "log_softmax_backward", "cross_entropy_backward",
    };
    for (int j = 0; j < NCASES(fused); j++) {
        tg_error_clear();
        const tg_op *op = tg_op_find(fused[j]);
        cr_expect(op != NULL, "fused op '%s' missing: %s", fused[j], tg_last_error_message());
    }
    for (int i = 0; i < tg_op_count(); i++) {
        const tg_op *op = tg_op_at(i);
        bool builtin = false;
        for (int j = 0; j < NCASES(fused); j++)
            builtin |= strcmp(fused[j], op->name) == 0;
        if (!builtin && (tg_op_mark(op) != TG_AD_UNMARKED || op->sample)) continue;
        int n = 0;
        for (int c = 0; c < NCASES(fused_cases); c++)
            n += strcmp(fused_cases[c].op, op->name) == 0;
        if (builtin)
            cr_expect_geq(n, 2, "unmarked op '%s' has %d cpu/ref cases (want small and large)",
                          op->name, n);
        else if (n == 0)
            cr_log_info("unmarked op '%s' has no explicit cpu/ref case here; it is compared "
                        "only through the backward that calls it",
                        op->name);
    }
    log_margins("fused backward ops");
    tu_expect_no_leaks(mem0);
}

/* ---- Larger sizes: the cpu fast paths. */
Test(backends, large_matmuls_through_blas_match_ref_including_transposed_and_strided_views)
{
    size_t mem0 = tg_mem_current_bytes();
    static const bcase cases[] = {
        {.op = "matmul",
         .label = "(64,48) @ (48,32)",
         .n = 2,
         .in = {U(-1, 1, 2, 64, 48), U(-1, 1, 2, 48, 32)}},
        {.op = "matmul",
         .label = "transpose((48,64)) @ (48,32)",
         .n = 2,
         .in = {TRANSPOSED(-1, 1, 2, 48, 64), U(-1, 1, 2, 48, 32)}},
        {.op = "matmul",
         .label = "(64,48) @ transpose((32,48))",
         .n = 2,
         .in = {U(-1, 1, 2, 64, 48), TRANSPOSED(-1, 1, 2, 32, 48)}},
        {.op = "matmul",
         .label = "transpose((48,64)) @ transpose((32,48))",
         .n = 2,
         .in = {TRANSPOSED(-1, 1, 2, 48, 64), TRANSPOSED(-1, 1, 2, 32, 48)}},
        {.op = "matmul",
         .label = "batched transpose((4,16,8)) @ (16,12)",
         .n = 2,
         .in = {TRANSPOSED(-1, 1, 3, 4, 16, 8), U(-1, 1, 2, 16, 12)}},
        {.op = "matmul",
         .label = "row-strided permute((8,4,16), 1,0,2) @ (4,16,12)",
         .n = 2,
         .in = {{.kind = D_UNIFORM,
                 .ndim = 3,
                 .shape = {8, 4, 16},
                 .lo = -1,
                 .hi = 1,
                 .view = {.n = 3, .perm = {1, 0, 2}}},
                U(-1, 1, 3, 4, 16, 12)}},
        {.op = "matmul",
         .label = "non-gemm layout permute((8,16,4), 2,0,1) @ (4,8,12)",
         .n = 2,
         .in = {{.kind = D_UNIFORM,
                 .ndim = 3,
                 .shape = {8, 16, 4},
                 .lo = -1,
                 .hi = 1,
                 .view = {.n = 3, .perm = {2, 0, 1}}},
                U(-1, 1, 3, 4, 16, 12)}},
        {.op = "matmul",
         .label = "broadcast batch (3,1,20,30) @ (5,30,10)",
         .n = 2,
         .in = {U(-1, 1, 4, 3, 1, 20, 30), U(-1, 1, 3, 5, 30, 10)}},
        {.op = "matmul",
         .label = "thin (66,600) @ transpose((10,600)): the cpu's dot kernel (n <= 10, k >= 512)",
         .n = 2,
         .in = {U(-1, 1, 2, 66, 600), TRANSPOSED(-1, 1, 2, 10, 600)}},
        {.op = "matmul",
         .label = "thin (66,600) @ transpose((11,600)): n = 11, through BLAS",
         .n = 2,
         .in = {U(-1, 1, 2, 66, 600), TRANSPOSED(-1, 1, 2, 11, 600)}},
        {.op = "matmul",
         .label = "thin (66,7) @ (7,700): the cpu's row kernel (k <= 10, n >= 512)",
         .n = 2,
         .in = {U(-1, 1, 2, 66, 7), U(-1, 1, 2, 7, 700)}},
        {.op = "affine",
         .label = "thin x (66,600), W (10,600), b (10): both thin kernels, forward and dx",
         .n = 3,
         .in = {U(-1, 1, 2, 66, 600), U(-1, 1, 2, 10, 600), U(-1, 1, 1, 10)}},
        {.op = "matmul",
         .label = "(1,48) @ (48,1)",
         .n = 2,
         .in = {U(-1, 1, 2, 1, 48), U(-1, 1, 2, 48, 1)}},
        {.op = "matmul",
         .label = "transposed-batch permute((16,4,8), 1,2,0) @ (4,16,12)",
         .n = 2,
         .in = {{.kind = D_UNIFORM,
                 .ndim = 3,
                 .shape = {16, 4, 8},
                 .lo = -1,
                 .hi = 1,
                 .view = {.n = 3, .perm = {1, 2, 0}}},
                U(-1, 1, 3, 4, 16, 12)}},
        {.op = "matmul",
         .label = "empty inner dim (3,0) @ (0,4)",
         .n = 2,
         .in = {U(-1, 1, 2, 3, 0), U(-1, 1, 2, 0, 4)}},
        {.op = "matmul",
         .label = "empty rows (0,3) @ (3,4)",
         .n = 2,
         .in = {U(-1, 1, 2, 0, 3), U(-1, 1, 2, 3, 4)}},
    };
    run_table(cases, NCASES(cases));
    log_margins("matmul");
    tu_expect_no_leaks(mem0);
}

Test(backends, large_broadcasting_elementwise_ops_match_ref_on_every_cpu_path)
{
    size_t mem0 = tg_mem_current_bytes();
    static const bcase cases[] = {
        {.op = "add",
         .label = "(1000) + (1000) same shape",
         .n = 2,
         .in = {U(-2, 2, 1, 1000), U(-2, 2, 1, 1000)}},
        {.op = "add",
         .label = "(1000) + scalar",
         .n = 2,
         .in = {U(-2, 2, 1, 1000), U(-2, 2, 0, 0)}},
        {.op = "add",
         .label = "scalar + (1000)",
         .n = 2,
         .in = {U(-2, 2, 0, 0), U(-2, 2, 1, 1000)}},
        {.op = "add",
         .label = "(40,25) + (25) row",
         .n = 2,
         .in = {U(-2, 2, 2, 40, 25), U(-2, 2, 1, 25)}},
        {.op = "add",
         .label = "(25) + (40,25) row on the left",
         .n = 2,
         .in = {U(-2, 2, 1, 25), U(-2, 2, 2, 40, 25)}},
        {.op = "add",
         .label = "(40,1) + (1,25) outer",
         .n = 2,
         .in = {U(-2, 2, 2, 40, 1), U(-2, 2, 2, 1, 25)}},
        {.op = "add",
         .label = "(40,25) + (40,1) column",
         .n = 2,
         .in = {U(-2, 2, 2, 40, 25), U(-2, 2, 2, 40, 1)}},
        {.op = "add",
         .label = "(10,10,10) + (10,1,10)",
         .n = 2,
         .in = {U(-2, 2, 3, 10, 10, 10), U(-2, 2, 3, 10, 1, 10)}},
        {.op = "add",
         .label = "(4,10,25) + (1,1,25) row",
         .n = 2,
         .in = {U(-2, 2, 3, 4, 10, 25), U(-2, 2, 3, 1, 1, 25)}},
        {.op = "add",
         .label = "(5,1,8) + (5,8) mixed",
         .n = 2,
         .in = {U(-2, 2, 3, 5, 1, 8), U(-2, 2, 2, 5, 8)}},
        {.op = "add",
         .label = "transpose((25,40)) + (40,25)",
         .n = 2,
         .in = {TRANSPOSED(-2, 2, 2, 25, 40), U(-2, 2, 2, 40, 25)}},
        {.op = "sub",
         .label = "(1000) - (1000)",
         .n = 2,
         .in = {U(-2, 2, 1, 1000), U(-2, 2, 1, 1000)}},
        {.op = "sub",
         .label = "(1000) - scalar",
         .n = 2,
         .in = {U(-2, 2, 1, 1000), U(-2, 2, 0, 0)}},
        {.op = "sub",
         .label = "(25) - (40,25)",
         .n = 2,
         .in = {U(-2, 2, 1, 25), U(-2, 2, 2, 40, 25)}},
        {.op = "mul",
         .label = "(1000) * (1000)",
         .n = 2,
         .in = {U(-2, 2, 1, 1000), U(-2, 2, 1, 1000)}},
        {.op = "mul",
         .label = "(40,25) * (25)",
         .n = 2,
         .in = {U(-2, 2, 2, 40, 25), U(-2, 2, 1, 25)}},
        {.op = "mul",
         .label = "(25) * (40,25)",
         .n = 2,
         .in = {U(-2, 2, 1, 25), U(-2, 2, 2, 40, 25)}},
        {.op = "mul",
         .label = "(1000) * scalar",
         .n = 2,
         .in = {U(-2, 2, 1, 1000), U(-2, 2, 0, 0)}},
        {.op = "div", .label = "(1000) / (1000)", .n = 2, .in = {U(-2, 2, 1, 1000), AWAY(1, 1000)}},
        {.op = "div", .label = "(40,25) / (25)", .n = 2, .in = {U(-2, 2, 2, 40, 25), AWAY(1, 25)}},
        {.op = "div", .label = "(25) / (40,25)", .n = 2, .in = {U(-2, 2, 1, 25), AWAY(2, 40, 25)}},
        {.op = "div", .label = "(1000) / scalar", .n = 2, .in = {U(-2, 2, 1, 1000), AWAY(0, 0)}},
        {.op = "div",
         .label = "(40,1) / (1,25)",
         .n = 2,
         .in = {U(-2, 2, 2, 40, 1), AWAY(2, 1, 25)}},
        {.op = "add",
         .label = "empty (0,4) + (4)",
         .n = 2,
         .in = {U(-2, 2, 2, 0, 4), U(-2, 2, 1, 4)}},
        {.op = "mul",
         .label = "empty (4) * (0,4)",
         .n = 2,
         .in = {U(-2, 2, 1, 4), U(-2, 2, 2, 0, 4)}},
        {.op = "sub",
         .label = "empty (3,0) - (3,1)",
         .n = 2,
         .in = {U(-2, 2, 2, 3, 0), U(-2, 2, 2, 3, 1)}},
        {.op = "mse_loss",
         .label = "(50,20)",
         .n = 2,
         .in = {U(-1, 1, 2, 50, 20), U(-1, 1, 2, 50, 20)}},
    };
    run_table(cases, NCASES(cases));
    log_margins("elementwise");
    tu_expect_no_leaks(mem0);
}

/* conv2d's products on cpu: a reduction of K <= TG_CONV_SHORT_K (32) runs on
 * the conv_short kernels (blocks of 4 output rows by 3 vectors of columns;
 * the weight gradient's 4 x 3 outputs), a longer one through BLAS; the
 * input gradient's reduction is over the output channels. The cases take
 * both sides of K = 32 and of 32 output channels, output rows and weight
 * columns that do not fill a block (6 = 4 + 1 + 1 rows, K = 8 = 3 + 3 + 1 +
 * 1), column tails past the last whole block and vector (81 = 3 x 24 + 9 =
 * 10 x 8 + 1 floats), groups, the workload's 1->16 3x3 on 28x28 (676 = 28 x
 * 24 + 4), and conv2d_relu (relu in registers) on the same shapes. */
#define CONV_ATTRS(s_, p_, g_)                                                                     \
    {                                                                                              \
        .nints = 6, .ints = {s_, s_, p_, p_, 1, 1}, .target = g_                                   \
    }
Test(backends, conv2d_on_both_sides_of_the_short_reduction_matches_ref)
{
    size_t mem0 = tg_mem_current_bytes();
    static const bcase cases[] = {
        {.op = "conv2d",
         .label = "(2,1,28,28) * (16,1,3,3): K = 9",
         .n = 3,
         .in = {U(-1, 1, 4, 2, 1, 28, 28), U(-1, 1, 4, 16, 1, 3, 3), U(-1, 1, 1, 16)},
         .attrs = CONV_ATTRS(1, 0, 1)},
        {.op = "conv2d",
         .label = "(2,2,10,10) * (6,2,2,2): K = 8, rows and columns in remainders",
         .n = 3,
         .in = {U(-1, 1, 4, 2, 2, 10, 10), U(-1, 1, 4, 6, 2, 2, 2), U(-1, 1, 1, 6)},
         .attrs = CONV_ATTRS(1, 0, 1)},
        {.op = "conv2d",
         .label = "(2,4,8,8) * (6,2,3,3), groups 2, padding 1: K = 18, 3 rows a group",
         .n = 3,
         .in = {U(-1, 1, 4, 2, 4, 8, 8), U(-1, 1, 4, 6, 2, 3, 3), U(-1, 1, 1, 6)},
         .attrs = CONV_ATTRS(1, 1, 2)},
        {.op = "conv2d",
         .label = "(2,3,9,9) * (5,3,3,3), stride 2, padding 1: K = 27",
         .n = 3,
         .in = {U(-1, 1, 4, 2, 3, 9, 9), U(-1, 1, 4, 5, 3, 3, 3), U(-1, 1, 1, 5)},
         .attrs = CONV_ATTRS(2, 1, 1)},
        {.op = "conv2d",
         .label = "(2,2,6,6) * (34,2,3,3): 34 output channels, the input gradient through BLAS",
         .n = 3,
         .in = {U(-1, 1, 4, 2, 2, 6, 6), U(-1, 1, 4, 34, 2, 3, 3), U(-1, 1, 1, 34)},
         .attrs = CONV_ATTRS(1, 0, 1)},
        {.op = "conv2d",
         .label = "(2,4,8,8) * (5,4,3,3): K = 36, through BLAS",
         .n = 3,
         .in = {U(-1, 1, 4, 2, 4, 8, 8), U(-1, 1, 4, 5, 4, 3, 3), U(-1, 1, 1, 5)},
         .attrs = CONV_ATTRS(1, 0, 1)},
        {.op = "conv2d_relu",
         .label = "(2,1,28,28) * (16,1,3,3): K = 9",
         .n = 3,
         .in = {U(-1, 1, 4, 2, 1, 28, 28), U(-1, 1, 4, 16, 1, 3, 3), U(-1, 1, 1, 16)},
         .attrs = CONV_ATTRS(1, 0, 1)},
        {.op = "conv2d_relu",
         .label = "(2,2,10,10) * (6,2,2,2): K = 8, rows and columns in remainders",
         .n = 3,
         .in = {U(-1, 1, 4, 2, 2, 10, 10), U(-1, 1, 4, 6, 2, 2, 2), U(-1, 1, 1, 6)},
         .attrs = CONV_ATTRS(1, 0, 1)},
        {.op = "conv2d_relu",
         .label = "(2,4,8,8) * (5,4,3,3): K = 36, through BLAS",
         .n = 3,
         .in = {U(-1, 1, 4, 2, 4, 8, 8), U(-1, 1, 4, 5, 4, 3, 3), U(-1, 1, 1, 5)},
         .attrs = CONV_ATTRS(1, 0, 1)},
    };
    run_table(cases, NCASES(cases));
    log_margins("conv2d");
    tu_expect_no_leaks(mem0);
}

Test(backends, large_unary_ops_match_ref_on_cpu)
{
    size_t mem0 = tg_mem_current_bytes();
    static const bcase cases[] = {
        {.op = "neg", .label = "(1000)", .n = 1, .in = {U(-2, 2, 1, 1000)}},
        {.op = "exp", .label = "(1000)", .n = 1, .in = {U(-2, 2, 1, 1000)}},
        {.op = "log", .label = "(1000)", .n = 1, .in = {U(0.2, 3, 1, 1000)}},
        {.op = "sqrt", .label = "(1000)", .n = 1, .in = {U(0.2, 3, 1, 1000)}},
        {.op = "tanh", .label = "(1000)", .n = 1, .in = {U(-2, 2, 1, 1000)}},
        {.op = "sigmoid", .label = "(1000)", .n = 1, .in = {U(-3, 3, 1, 1000)}},
        {.op = "relu", .label = "(1000)", .n = 1, .in = {AWAY(1, 1000)}},
        {.op = "relu",
         .label = "transpose((25,40))",
         .n = 1,
         .in = {{.kind = D_AWAY,
                 .ndim = 2,
                 .shape = {25, 40},
                 .lo = 0.05,
                 .hi = 2,
                 .view = {.n = 2, .perm = {1, 0}}}}},
        {.op = "pow_scalar",
         .label = "(1000) p = -1.5",
         .n = 1,
         .in = {U(0.3, 2, 1, 1000)},
         .attrs = {.scalar = -1.5}},
        {.op = "pow_scalar",
         .label = "(1000) p = 3",
         .n = 1,
         .in = {U(0.3, 2, 1, 1000)},
         .attrs = {.scalar = 3.0}},
        {.op = "add_scalar",
         .label = "(1000) + 2.5",
         .n = 1,
         .in = {U(-2, 2, 1, 1000)},
         .attrs = {.scalar = 2.5}},
        {.op = "mul_scalar",
         .label = "(1000) * -0.75",
         .n = 1,
         .in = {U(-2, 2, 1, 1000)},
         .attrs = {.scalar = -0.75}},
        {.op = "contiguous",
         .label = "transpose((25,40))",
         .n = 1,
         .in = {TRANSPOSED(-1, 1, 2, 25, 40)}},
        {.op = "cast",
         .label = "(1000) to f64",
         .n = 1,
         .in = {U(-1, 1, 1, 1000)},
         .attrs = {.target = TG_F64}},
        {.op = "cast",
         .label = "(1000) to f32",
         .n = 1,
         .in = {U(-1, 1, 1, 1000)},
         .attrs = {.target = TG_F32}},
    };
    run_table(cases, NCASES(cases));
    log_margins("unary");
    tu_expect_no_leaks(mem0);
}

Test(backends, large_reductions_and_dim_ops_match_ref_on_cpu)
{
    size_t mem0 = tg_mem_current_bytes();
    static const bcase cases[] = {
        {.op = "sum", .label = "(16,32,8) all dims", .n = 1, .in = {U(-1, 1, 3, 16, 32, 8)}},
        {.op = "sum",
         .label = "(16,32,8) dims 0,2",
         .n = 1,
         .in = {U(-1, 1, 3, 16, 32, 8)},
         .attrs = {.nints = 2, .ints = {0, 2}}},
        {.op = "sum",
         .label = "(16,32,8) dim 1 keepdim",
         .n = 1,
         .in = {U(-1, 1, 3, 16, 32, 8)},
         .attrs = {.nints = 1, .ints = {1}, .flag = 1}},
        {.op = "sum",
         .label = "(16,32,8) dims 0,1 (prefix)",
         .n = 1,
         .in = {U(-1, 1, 3, 16, 32, 8)},
         .attrs = {.nints = 2, .ints = {0, 1}}},
        {.op = "sum",
         .label = "(16,32,8) dims 1,2 keepdim (suffix)",
         .n = 1,
         .in = {U(-1, 1, 3, 16, 32, 8)},
         .attrs = {.nints = 2, .ints = {1, 2}, .flag = 1}},
        {.op = "sum",
         .label = "(16,32,8) dim -1 (rows)",
         .n = 1,
         .in = {U(-1, 1, 3, 16, 32, 8)},
         .attrs = {.nints = 1, .ints = {-1}}},
        {.op = "sum",
         .label = "(16,32,8) dim 0 (columns)",
         .n = 1,
         .in = {U(-1, 1, 3, 16, 32, 8)},
         .attrs = {.nints = 1, .ints = {0}}},
        {.op = "sum",
         .label = "(16,1,8) dims 0,1 (size-1 dim)",
         .n = 1,
         .in = {U(-1, 1, 3, 16, 1, 8)},
         .attrs = {.nints = 2, .ints = {0, 1}}},
        {.op = "sum",
         .label = "(2,1500) dim 0 (wide columns)",
         .n = 1,
         .in = {U(-1, 1, 2, 2, 1500)},
         .attrs = {.nints = 1, .ints = {0}}},
        {.op = "sum", .label = "(1000) all", .n = 1, .in = {U(-1, 1, 1, 1000)}},
        {.op = "sum",
         .label = "empty (0,3) dim 0",
         .n = 1,
         .in = {U(-1, 1, 2, 0, 3)},
         .attrs = {.nints = 1, .ints = {0}}},
        {.op = "sum",
         .label = "empty (3,0) dim 1",
         .n = 1,
         .in = {U(-1, 1, 2, 3, 0)},
         .attrs = {.nints = 1, .ints = {1}}},
        {.op = "sum",
         .label = "empty (3,0) dim 0",
         .n = 1,
         .in = {U(-1, 1, 2, 3, 0)},
         .attrs = {.nints = 1, .ints = {0}}},
        {.op = "sum", .label = "empty (0,3) all", .n = 1, .in = {U(-1, 1, 2, 0, 3)}},
        {.op = "mean",
         .label = "(16,32,8) dims 0,1",
         .n = 1,
         .in = {U(-1, 1, 3, 16, 32, 8)},
         .attrs = {.nints = 2, .ints = {0, 1}}},
        {.op = "mean",
         .label = "(16,32,8) dim 2 keepdim",
         .n = 1,
         .in = {U(-1, 1, 3, 16, 32, 8)},
         .attrs = {.nints = 1, .ints = {2}, .flag = 1}},
        {.op = "mean", .label = "(16,32,8) all", .n = 1, .in = {U(-1, 1, 3, 16, 32, 8)}},
        {.op = "sum_to",
         .label = "(16,32,8) to (32,8)",
         .n = 1,
         .in = {U(-1, 1, 3, 16, 32, 8)},
         .attrs = {.nints = 2, .ints = {32, 8}}},
        {.op = "sum_to",
         .label = "(16,32,8) to (16,1,1)",
         .n = 1,
         .in = {U(-1, 1, 3, 16, 32, 8)},
         .attrs = {.nints = 3, .ints = {16, 1, 1}}},
        {.op = "sum_to",
         .label = "(16,32,8) to (1,32,1)",
         .n = 1,
         .in = {U(-1, 1, 3, 16, 32, 8)},
         .attrs = {.nints = 3, .ints = {1, 32, 1}}},
        {.op = "expand",
         .label = "(32,1) to (16,32,8)",
         .n = 1,
         .in = {U(-1, 1, 2, 32, 1)},
         .attrs = {.nints = 3, .ints = {16, 32, 8}}},
        {.op = "max_dim",
         .label = "(64,50) dim 1",
         .n = 1,
         .in = {T_(D_DISTINCT, 2, 64, 50)},
         .attrs = {.nints = 1, .ints = {1}}},
        {.op = "max_dim",
         .label = "(16,32,8) dim 0 keepdim",
         .n = 1,
         .in = {T_(D_DISTINCT, 3, 16, 32, 8)},
         .attrs = {.nints = 1, .ints = {0}, .flag = 1}},
        {.op = "softmax",
         .label = "(32,100) dim 1",
         .n = 1,
         .in = {U(-3, 3, 2, 32, 100)},
         .attrs = {.nints = 1, .ints = {1}}},
        {.op = "softmax",
         .label = "(32,100) dim 0",
         .n = 1,
         .in = {U(-3, 3, 2, 32, 100)},
         .attrs = {.nints = 1, .ints = {0}}},
        {.op = "log_softmax",
         .label = "(8,16,12) dim 1",
         .n = 1,
         .in = {U(-3, 3, 3, 8, 16, 12)},
         .attrs = {.nints = 1, .ints = {1}}},
        {.op = "cross_entropy",
         .label = "(64,10)",
         .n = 2,
         .in = {U(-2, 2, 2, 64, 10), {.kind = D_TARGETS, .ndim = 1, .shape = {64}, .hi = 10}}},
        {.op = "reshape",
         .label = "(16,32,8) to (512,8)",
         .n = 1,
         .in = {U(-1, 1, 3, 16, 32, 8)},
         .attrs = {.nints = 2, .ints = {512, 8}}},
        {.op = "permute",
         .label = "(16,32,8) by 2,0,1",
         .n = 1,
         .in = {U(-1, 1, 3, 16, 32, 8)},
         .attrs = {.nints = 3, .ints = {2, 0, 1}}},
    };
    run_table(cases, NCASES(cases));
    log_margins("reductions");
    tu_expect_no_leaks(mem0);
}

/* ---- A transposed view operand against its contiguous copy, per backend
 * (the view goes to the GEMM as a transpose flag; the copy does not). */
static void matmul_view_vs_copy(const int64_t *sa, int na, const int *pa, const int64_t *sb, int nb,
                                const int *pb, const char *label)
{
    for (int p = 0; p < 2; p++)
        for (int b = 0; b < 2; b++) {
            tg_backend be = b ? TG_BACKEND_CPU : TG_BACKEND_REF;
            tg_backend prev = tg_set_default_backend(be);
            tg_rng rng;
            tg_rng_seed(&rng, 99);
            tg_dtype dt = p ? TG_F32 : TG_F64;
            tg_tensor *A = tg_rand_uniform(&rng, dt, na, sa, -1, 1);
            tg_tensor *B = tg_rand_uniform(&rng, dt, nb, sb, -1, 1);
            cr_assert(A && B, "%s", tg_last_error_message());
            tg_tensor *Av = pa ? tg_permute(A, na, pa) : tg_tensor_retain(A);
            tg_tensor *Bv = pb ? tg_permute(B, nb, pb) : tg_tensor_retain(B);
            cr_assert(Av && Bv, "%s", tg_last_error_message());
            cr_expect(!pa || !tg_tensor_is_contiguous(Av));
            cr_expect(!pb || !tg_tensor_is_contiguous(Bv));
            tg_tensor *Ac = tg_contiguous(Av), *Bc = tg_contiguous(Bv);
            cr_assert(Ac && Bc, "%s", tg_last_error_message());
            cr_expect(tg_tensor_is_contiguous(Ac) && tg_tensor_is_contiguous(Bc));
            tg_tensor *view = tg_matmul(Av, Bv), *copy = tg_matmul(Ac, Bc);
            cr_expect(view && copy, "%s on %s: %s", label, tg_backend_name(be),
                      tg_last_error_message());
            char what[160];
            snprintf(what, sizeof what, "%s on %s: matmul of views vs of contiguous copies", label,
                     tg_backend_name(be));
            if (view && copy) compare(view, copy, (prec)p, what);
            tg_tensor *to_release[] = {view, copy, Ac, Bc, Av, Bv, A, B};
            tu_release_all(to_release, 8);
            tg_set_default_backend(prev);
        }
}

Test(backends, matmul_of_a_transposed_view_matches_matmul_of_its_contiguous_copy)
{
    size_t mem0 = tg_mem_current_bytes();
    static const int t2[2] = {1, 0}, t3[3] = {0, 2, 1}, r3[3] = {1, 0, 2};
    matmul_view_vs_copy((const int64_t[]){48, 64}, 2, t2, (const int64_t[]){48, 32}, 2, NULL,
                        "transpose((48,64)) @ (48,32)");
    matmul_view_vs_copy((const int64_t[]){64, 48}, 2, NULL, (const int64_t[]){32, 48}, 2, t2,
                        "(64,48) @ transpose((32,48))");
    matmul_view_vs_copy((const int64_t[]){48, 64}, 2, t2, (const int64_t[]){32, 48}, 2, t2,
                        "transpose((48,64)) @ transpose((32,48))");
    matmul_view_vs_copy((const int64_t[]){4, 16, 8}, 3, t3, (const int64_t[]){4, 12, 16}, 3, t3,
                        "batched transpose((4,16,8)) @ transpose((4,12,16))");
    matmul_view_vs_copy((const int64_t[]){8, 4, 16}, 3, r3, (const int64_t[]){16, 12}, 2, NULL,
                        "permute((8,4,16), 1,0,2) @ (16,12)");
    tu_expect_no_leaks(mem0);
}

Test(backends, matmul_of_a_transposed_view_copies_nothing_on_cpu)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_backend prev = tg_set_default_backend(TG_BACKEND_CPU);
    tg_rng rng;
    tg_rng_seed(&rng, 5);
    tg_tensor *A = tg_rand_uniform(&rng, TG_F64, 2, (const int64_t[]){48, 64}, -1, 1);
    tg_tensor *B = tg_rand_uniform(&rng, TG_F64, 2, (const int64_t[]){32, 48}, -1, 1);
    tg_tensor *At = tg_transpose(A, 0, 1), *Bt = tg_transpose(B, 0, 1);
    cr_assert(A && B && At && Bt, "%s", tg_last_error_message());
    size_t before = tg_mem_current_bytes();
    tg_mem_reset_peak();
    tg_tensor *C = tg_matmul(At, Bt); /* (64,48) @ (48,32) */
    cr_assert(C != NULL, "%s", tg_last_error_message());
    size_t out_bytes = 64 * 32 * sizeof(double);
    cr_expect_eq(tg_mem_peak_bytes() - before, out_bytes,
                 "matmul of transposed views allocated %zu bytes at peak; its output is %zu",
                 tg_mem_peak_bytes() - before, out_bytes);
    tg_tensor *to_release[] = {C, At, Bt, A, B};
    tu_release_all(to_release, 5);
    tg_set_default_backend(prev);
    tu_expect_no_leaks(mem0);
}

/* The cpu backend's f32 exp/tanh/sigmoid loops are compiled per vector ISA.
 * The FMA variants (avx2, avx512) must give each other's bits exactly (the
 * same IEEE operations in the same order), and baseline (no FMA) must
 * agree with them to a few ulp: on both branches of tanh, the clamps of
 * exp, and a length whose tail is not a whole vector. */
Test(backends, vector_isa_variants_agree_and_the_fma_ones_bitwise)
{
    size_t mem0 = tg_mem_current_bytes();
    enum { N = 4099 };
    static float x[N];
    for (int i = 0; i < N; i++) x[i] = -100.0f + 200.0f * (float)i / (float)(N - 1);
    x[0] = 0.0f, x[1] = -0.0f, x[2] = 0.625f, x[3] = -0.625f, x[4] = 88.5f, x[5] = -88.0f;
    x[6] = 1e-8f, x[7] = -3.0e-39f;
    const char *const ops[3] = {"exp", "tanh", "sigmoid"};
    static float base[3][N], fused[3][N], got[N];
    const char *const isas[3] = {"baseline", "avx2", "avx512"};
    bool have_fused = false;
    const char *was = tg_cpu_vector_isa();
    tg_backend prev = tg_set_default_backend(TG_BACKEND_CPU);
    int ran = 0;
    for (int v = 0; v < 3; v++) {
        tg_status st = tg_cpu_set_vector_isa(isas[v]);
        if (v == 0) cr_assert_eq(st, TG_OK, "baseline must always be available");
        if (st == TG_ERR_UNSUPPORTED) continue;
        cr_assert_eq(st, TG_OK, "%s: %s", isas[v], tg_last_error_message());
        cr_assert_str_eq(tg_cpu_vector_isa(), isas[v]);
        ran++;
        for (int k = 0; k < 3; k++) {
            tg_tensor *t = tg_tensor_from_data(TG_F32, 1, (int64_t[]){N}, x);
            tg_tensor *y = k == 0 ? tg_exp(t) : k == 1 ? tg_tanh(t) : tg_sigmoid(t);
            cr_assert(y, "%s: %s", ops[k], tg_last_error_message());
            float *dst = v == 0 ? base[k] : !have_fused ? fused[k] : got;
            cr_assert_eq(tg_tensor_copy_out(y, dst, sizeof got), TG_OK);
            if (v > 0 && have_fused) {
                int first = -1;
                for (int i = 0; i < N && first < 0; i++)
                    if (memcmp(&got[i], &fused[k][i], sizeof got[i])) first = i;
                cr_expect_eq(first, -1, "%s under %s differs from avx2 at x = %.9g: %.9g vs %.9g",
                             ops[k], isas[v], first >= 0 ? x[first] : 0.0,
                             first >= 0 ? got[first] : 0.0, first >= 0 ? fused[k][first] : 0.0);
            }
            if (v > 0) {
                double worst = 0.0;
                int at = 0;
                for (int i = 0; i < N; i++) {
                    double d = fabs((double)dst[i] - (double)base[k][i]);
                    double tol = 4.0 * 1.2e-7 * fabs((double)base[k][i]) + 1e-37;
                    if (d / tol > worst) worst = d / tol, at = i;
                }
                cr_expect_leq(worst, 1.0, "%s under %s vs baseline at x = %.9g: %.9g vs %.9g",
                              ops[k], isas[v], x[at], dst[at], base[k][at]);
            }
            tg_tensor_release(y);
            tg_tensor_release(t);
        }
        if (v > 0) have_fused = true;
    }
    cr_log_info("vector ISA variants compared: %d (default %s)", ran, was);
    cr_expect_eq(tg_cpu_set_vector_isa("sse9"), TG_ERR_INVALID);
    cr_expect(strstr(tg_last_error_message(), "'sse9'") != NULL, "%s", tg_last_error_message());
    cr_expect_eq(tg_cpu_set_vector_isa(NULL), TG_ERR_NULL);
    cr_assert_eq(tg_cpu_set_vector_isa(was), TG_OK);
    tg_set_default_backend(prev);
    tu_expect_no_leaks(mem0);
}

/* The f32 exp/tanh/sigmoid loops check each 1024-float chunk's range of
 * |x| and run a loop without the clamps (or without tanh's other branch)
 * when the whole chunk allows it. Whichever loop computes an element, its
 * bits must be those of the general one: each element computed alone (a
 * one-element chunk always takes the narrow loop) is compared with the
 * same element inside chunks that mix the regimes. And exp covers the
 * whole float range: finite up to ln(FLT_MAX), +inf above it, subnormal
 * results rounded once, 0 far below, NaN kept. On every ISA variant. */
/* Inputs for the chunk test. Pattern 0: each 1024-float chunk in one
 * regime of |x| (the kernels' chunk), specials in the last. Pattern 1:
 * regimes that change away from chunk boundaries, single elements of
 * another regime inside long runs of one (where a run past its chunk must
 * stop), a NaN among them. */
static void regime_inputs(int pat, int ch, int n, float *x)
{
    for (int i = 0; i < n; i++) {
        float u = (float)((i * 7919) % 1000) / 1000.0f; /* [0, 1) scrambled */
        int c = i / ch;
        if (pat == 1) {
            if (i < 1500) x[i] = 0.7f + 10.0f * u;        /* |x| in [0.625, 44) */
            else if (i < 2300) x[i] = 1.2f * u - 0.6f;    /* |x| < 0.625 */
            else if (i < 3900) x[i] = -0.7f - 40.0f * u;
            else x[i] = 0.7f + 60.0f * u;                 /* also past 44 */
        } else if (c == 0) x[i] = 1.2f * u - 0.6f;        /* all |x| < 0.625 */
        else if (c == 1) x[i] = 0.7f + 10.0f * u;         /* all |x| >= 0.625 */
        else if (c == 2) x[i] = 8.0f * u - 4.0f;          /* mixed */
        else x[i] = 240.0f * u - 120.0f;                  /* past exp's clamps */
    }
    if (pat == 1) {
        /* Each of these is the first element outside its regime that a run past
         * a chunk meets: tanh's run of |x| in [0.625, 44) from 1024 meets 0.5,
         * its mixed run from the chunk after (|x| < 44) meets -60; the exp and
         * sigmoid run from 1024 meets 95, the one from the chunk after 1200's
         * meets the NaN. */
        x[1100] = 0.5f, x[1200] = 95.0f, x[2000] = 3.0f, x[3300] = -60.0f, x[3500] = NAN;
        x[n - 40] = -90.0f, x[n - 3] = 0.5f;
        return;
    }
    x[3 * ch + 1] = NAN, x[3 * ch + 2] = INFINITY, x[3 * ch + 3] = -INFINITY;
    x[3 * ch + 4] = 88.72f, x[3 * ch + 5] = 88.73f, x[3 * ch + 6] = -100.0f;
    x[3 * ch + 7] = -104.5f, x[n - 1] = 0.625f, x[n - 2] = -0.6249999f;
}

Test(backends, vector_math_chunks_give_each_element_the_same_bits)
{
    size_t mem0 = tg_mem_current_bytes();
    enum { CH = 1024, N = 4 * CH + 37 };
    static float x[N], whole[N];
    const char *const isas[3] = {"baseline", "avx2", "avx512"};
    const char *const ops[3] = {"exp", "tanh", "sigmoid"};
    const char *was = tg_cpu_vector_isa();
    tg_backend prev = tg_set_default_backend(TG_BACKEND_CPU);
    for (int v = 0; v < 3; v++) {
        tg_status st = tg_cpu_set_vector_isa(isas[v]);
        if (st == TG_ERR_UNSUPPORTED) continue;
        cr_assert_eq(st, TG_OK, "%s: %s", isas[v], tg_last_error_message());
        for (int k = 0; k < 6; k++) {
            int pat = k / 3, op = k % 3;
            regime_inputs(pat, CH, N, x);
            tg_tensor *t = tg_tensor_from_data(TG_F32, 1, (int64_t[]){N}, x);
            tg_tensor *y = op == 0 ? tg_exp(t) : op == 1 ? tg_tanh(t) : tg_sigmoid(t);
            cr_assert(y, "%s: %s", ops[op], tg_last_error_message());
            cr_assert_eq(tg_tensor_copy_out(y, whole, sizeof whole), TG_OK);
            tg_tensor_release(y);
            tg_tensor_release(t);
            int bad = 0, first = -1;
            float alone_first = 0.0f;
            for (int i = 0; i < N; i++) {
                tg_tensor *t1 = tg_tensor_from_data(TG_F32, 1, (int64_t[]){1}, &x[i]);
                tg_tensor *y1 = op == 0 ? tg_exp(t1) : op == 1 ? tg_tanh(t1) : tg_sigmoid(t1);
                float alone = NAN;
                cr_assert(y1 && tg_tensor_copy_out(y1, &alone, sizeof alone) == TG_OK);
                if (memcmp(&alone, &whole[i], sizeof alone)) {
                    if (first < 0) first = i, alone_first = alone;
                    bad++;
                }
                tg_tensor_release(y1);
                tg_tensor_release(t1);
            }
            cr_expect_eq(bad, 0, "%s under %s, pattern %d: %d elements differ alone and in their "
                         "chunk, first x = %.9g: %.9g vs %.9g", ops[op], isas[v], pat, bad,
                         first >= 0 ? x[first] : 0.0, (double)alone_first,
                         first >= 0 ? whole[first] : 0.0);
        }
        /* exp at the ends of the float range, against libm's float result */
        const float xe[] = {88.72f, 88.7228f, 88.73f, 89.0f, 1000.0f, INFINITY, -87.5f, -100.0f,
                            -103.9f, -104.5f, -1000.0f, -INFINITY, NAN};
        enum { NE = sizeof xe / sizeof xe[0] };
        float ye[NE];
        tg_tensor *te = tg_tensor_from_data(TG_F32, 1, (int64_t[]){NE}, xe);
        tg_tensor *ee = tg_exp(te);
        cr_assert_eq(tg_tensor_copy_out(ee, ye, sizeof ye), TG_OK);
        for (int i = 0; i < NE; i++) {
            float want = (float)exp((double)xe[i]);
            if (isnan(want)) {
                cr_expect(isnan(ye[i]), "exp(NaN) under %s is %g", isas[v], (double)ye[i]);
            } else if (isinf(want) || want == 0.0f) {
                cr_expect_eq(ye[i], want, "exp(%.9g) under %s is %.9g, want %.9g", (double)xe[i],
                             isas[v], (double)ye[i], (double)want);
            } else {
                /* two ulp of the result; a subnormal's ulp is 2^-149 */
                float ulp = nextafterf(want, INFINITY) - want;
                cr_expect_leq(fabsf(ye[i] - want), 2.0f * ulp, "exp(%.9g) under %s is %.9g, want "
                              "%.9g", (double)xe[i], isas[v], (double)ye[i], (double)want);
            }
        }
        tg_tensor_release(ee);
        tg_tensor_release(te);
    }
    cr_assert_eq(tg_cpu_set_vector_isa(was), TG_OK);
    tg_set_default_backend(prev);
    tu_expect_no_leaks(mem0);
}

/* ---- f32 row sums: the exact pass (cpu/reduce.c) keeps the chain's bits.
 *
 * The cpu row sum adds element j into double accumulator j % 4 and returns
 * (s0 + s1) + (s2 + s3). Long f32 rows first try a 16-lane pass that is
 * only taken where it can show that no addition rounds. chain_sum is that
 * order, written out here; the cases check the pass against it where it
 * must take the row, where it must refuse it (data whose sum depends on
 * the order: the lane order would give another answer), and through
 * tg_sum and tg_sum_dims on the cpu backend. */
#include "backend/kernels.h"
#include "core/pool.h" /* tg__pool_jobs: that a sum was split */

static float chain_sum(const float *x, int64_t n)
{
    double s[4] = {0, 0, 0, 0};
    int64_t body = n - n % 4;
    for (int64_t j = 0; j < n; j++) s[j < body ? j % 4 : 0] += x[j];
    return (float)((s[0] + s[1]) + (s[2] + s[3]));
}

static uint64_t sum_rng = 0x9e3779b97f4a7c15u;

static double sum_unit(void) /* [0, 1) */
{
    sum_rng ^= sum_rng << 13, sum_rng ^= sum_rng >> 7, sum_rng ^= sum_rng << 17;
    return (double)(sum_rng >> 11) * 0x1p-53;
}

static bool same_bits(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* tg_sum of x on the cpu backend, as a float. */
static float cpu_sum(const float *x, int64_t n)
{
    tg_backend prev = tg_set_default_backend(TG_BACKEND_CPU);
    tg_tensor *t = tg_tensor_from_data(TG_F32, 1, (int64_t[]){n}, x);
    tg_tensor *s = t ? tg_sum(t) : NULL;
    cr_assert(s, "%s", tg_last_error_message());
    float v;
    cr_assert_eq(tg_tensor_copy_out(s, &v, sizeof v), TG_OK);
    tg_tensor_release(s);
    tg_tensor_release(t);
    tg_set_default_backend(prev);
    return v;
}

Test(backends, f32_row_sums_take_the_exact_pass_only_where_it_keeps_the_chains_bits)
{
    size_t mem0 = tg_mem_current_bytes();
    enum { N = 300007 }; /* 73 chunks of 4096 and a partial one; not a multiple of 16 */
    float *x = malloc(N * sizeof *x);
    cr_assert(x);
    double got;

    /* Taken: values in [0.5, 2), any sign; and subnormals alone. */
    for (int64_t j = 0; j < N; j++)
        x[j] = (float)((sum_unit() < 0.5 ? -1 : 1) * (0.5 + 1.5 * sum_unit()));
    cr_assert(tg__row_sum_exact_f32(x, N, &got), "a row in [0.5, 2) is exact in any order");
    cr_expect(same_bits((float)got, chain_sum(x, N)), "%.9g vs %.9g", got, chain_sum(x, N));
    cr_expect(same_bits(cpu_sum(x, N), chain_sum(x, N)));
    for (int64_t j = 0; j < N; j++) x[j] = (float)(sum_unit() * 0x1p-127);
    cr_assert(tg__row_sum_exact_f32(x, N, &got), "subnormals are multiples of 2^-149");
    cr_expect(same_bits((float)got, chain_sum(x, N)));

    /* Zeros, negative ones included: +0, as the chain gives. */
    for (int64_t j = 0; j < N; j++) x[j] = j % 3 ? -0.0f : 0.0f;
    cr_assert(tg__row_sum_exact_f32(x, N, &got));
    cr_expect(same_bits((float)got, 0.0f) && same_bits(chain_sum(x, N), 0.0f));

    /* Refused: 2^60 at 0, 1 at 4, -2^60 at 16. The chain adds all three in
     * s0 and loses the 1 (2^60 + 1 rounds to 2^60): 0. In 16 lanes 0 and
     * 16 cancel and the 1 survives: 1. The pass must not answer. */
    memset(x, 0, N * sizeof *x);
    x[0] = 0x1p60f, x[4] = 1.0f, x[16] = -0x1p60f;
    cr_assert_not(tg__row_sum_exact_f32(x, N, &got));
    cr_expect(same_bits(chain_sum(x, N), 0.0f));
    cr_expect(same_bits(cpu_sum(x, N), 0.0f), "tg_sum gave %.9g", (double)cpu_sum(x, N));
    /* The same pattern in the last, partial chunk, after 73 chunks that
     * pass: refused there. */
    memset(x, 0, N * sizeof *x);
    for (int64_t j = 0; j < N - 100; j++) x[j] = 1.0f;
    x[N - 96] = 0x1p60f, x[N - 92] = 1.0f, x[N - 80] = -0x1p60f;
    cr_assert_not(tg__row_sum_exact_f32(x, N, &got));
    cr_expect(same_bits(cpu_sum(x, N), chain_sum(x, N)));
    /* A range too wide for the row's length: 1 and 2^-40 (each alone is
     * exact; together 2^-40 is below the accumulators' last bit). */
    for (int64_t j = 0; j < N; j++) x[j] = j % 2 ? 1.0f : 0x1p-40f;
    cr_assert_not(tg__row_sum_exact_f32(x, N, &got));
    cr_expect(same_bits(cpu_sum(x, N), chain_sum(x, N)));

    /* Infinities and NaN: refused; the chain's answer. */
    for (int64_t j = 0; j < N; j++) x[j] = 1.0f;
    x[N / 2] = INFINITY;
    cr_assert_not(tg__row_sum_exact_f32(x, N, &got));
    cr_expect(isinf(cpu_sum(x, N)) && cpu_sum(x, N) > 0);
    x[N / 3] = NAN;
    cr_assert_not(tg__row_sum_exact_f32(x, N, &got));
    cr_expect(isnan(cpu_sum(x, N)));

    /* Random rows whose range is near the bound for their length (max/min
     * up to 2^(52 - 23 - log2 n)): taken or not, tg_sum_dims gives each
     * row the chain's bits. */
    enum { ROWS = 6, COLS = 20000 };
    static float m[ROWS * COLS];
    int taken = 0;
    for (int r = 0; r < ROWS; r++) {
        int span = 10 + 2 * r; /* exponents [0, span): max/min up to 2^(span + 1) */
        for (int j = 0; j < COLS; j++)
            m[r * COLS + j] = (float)((sum_unit() < 0.5 ? -1 : 1) * (1 + sum_unit()) *
                                      ldexp(1.0, (int)(sum_unit() * span)));
        taken += tg__row_sum_exact_f32(m + r * COLS, COLS, &got);
    }
    cr_expect(taken > 0 && taken < ROWS, "rows taken: %d of %d (expected some, not all)", taken,
              ROWS);
    tg_backend prev = tg_set_default_backend(TG_BACKEND_CPU);
    tg_tensor *t = tg_tensor_from_data(TG_F32, 2, (int64_t[]){ROWS, COLS}, m);
    tg_tensor *s = t ? tg_sum_dims(t, 1, (int[]){1}, false) : NULL;
    cr_assert(s, "%s", tg_last_error_message());
    float rows[ROWS];
    cr_assert_eq(tg_tensor_copy_out(s, rows, sizeof rows), TG_OK);
    for (int r = 0; r < ROWS; r++)
        cr_expect(same_bits(rows[r], chain_sum(m + r * COLS, COLS)), "row %d: %.9g vs %.9g", r,
                  (double)rows[r], (double)chain_sum(m + r * COLS, COLS));
    tg_tensor_release(s);
    tg_tensor_release(t);
    tg_set_default_backend(prev);
    free(x);
    cr_expect_eq(tg_mem_current_bytes(), mem0, "leak");
}

/* On two threads a whole-row f32 sum of 1M floats is split into parts
 * that are summed apart and merged; where it cannot be shown exact the
 * kernel runs on one thread. Both give the chain's bits. */
Test(backends, split_f32_sums_keep_the_chains_bits)
{
    size_t mem0 = tg_mem_current_bytes();
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof *x);
    cr_assert(x);
    int prev = tg_num_threads();
    cr_assert_eq(tg_set_num_threads(2), TG_OK);
    for (int64_t j = 0; j < N; j++)
        x[j] = (float)((sum_unit() < 0.5 ? -1 : 1) * (0.5 + 1.5 * sum_unit()));
    uint64_t jobs = tg__pool_jobs();
    cr_expect(same_bits(cpu_sum(x, N), chain_sum(x, N)));
    cr_expect_gt(tg__pool_jobs(), jobs, "the sum was not split");
    memset(x, 0, N * sizeof *x);
    x[0] = 0x1p60f, x[4] = 1.0f, x[16] = -0x1p60f; /* the chain loses the 1: 0 */
    cr_expect(same_bits(cpu_sum(x, N), 0.0f), "tg_sum gave %.9g", (double)cpu_sum(x, N));
    x[0] = x[4] = x[16] = 0.0f;
    x[N - 8] = 0x1p60f, x[N - 4] = 1.0f, x[N - 1] = -0x1p60f; /* in the second part */
    cr_expect(same_bits(cpu_sum(x, N), chain_sum(x, N)));
    cr_assert_eq(tg_set_num_threads(prev), TG_OK);
    /* Parts that pass alone and not together: 1 and 2^-30 in a row of 2^20. */
    tg__exact_sum a, b;
    tg__exact_sum_init(&a);
    tg__exact_sum_init(&b);
    float one = 1.0f, tiny = 0x1p-30f;
    cr_expect(tg__exact_sum_add(&a, &one, 1, N));
    cr_expect(tg__exact_sum_add(&b, &tiny, 1, N));
    cr_expect_not(tg__exact_sum_merge(&a, &b, N));
    free(x);
    cr_expect_eq(tg_mem_current_bytes(), mem0, "leak");
}