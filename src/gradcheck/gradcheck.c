/* Numerical gradient checking by central differences in f64.
 *
 * The checked function is L(x) = sum(w * f(x)) with w a fixed random
 * weight, so every output element contributes with a distinct weight.
 * Analytic: one tg_backward_seed(f(x), w). Numeric: for each element
 * (L(x + eps e_i) - L(x - eps e_i)) / 2eps, evaluated with grad mode off
 * on private copies of the inputs. Fast mode replaces the per-element loop
 * by a few random directions v: (L(x + eps v) - L(x - eps v)) / 2eps is
 * compared with <grad, v>. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

typedef struct {
    tg_gradcheck_fn fn;
    void *ud;
    int n;
    tg_tensor **x; /* untracked private copies */
    tg_tensor *w;
} problem;

/* L at the current values of the private copies. */
static tg_status eval_loss(problem *p, double *out)
{
    tg_scope_begin();
    tg_tensor *y = p->fn(p->ud, p->n, p->x);
    tg_tensor *l = y ? tg_sum(tg_mul(y, p->w)) : NULL;
    tg_status st = l ? tg_tensor_item(l, out) : tg_last_error();
    if (!st && !l) st = TG_ERR_INTERNAL;
    if (y && !y->scope_owned) tg_tensor_release(y);
    tg_scope_end();
    return st;
}

static tg_tensor *copy_of(const tg_tensor *t)
{
    tg_tensor *c = tg__tensor_empty(t->dtype, t->ndim, t->shape, t->backend);
    if (c) tg_tensor_copy_out(t, tg__tensor_ptr(c), c->storage->nbytes);
    return c;
}

/* The two sides at an input's worst index, for the failure message. */
typedef struct {
    double analytic, numeric;
} worst_pair;

/* A NaN on either side is the worst error there is: the maxima become NaN
 * and stay NaN (a plain `>` would skip it and report an error of 0). */
static void result_update(tg_gradcheck_result *r, double a, double num, int64_t idx,
                          const tg_gradcheck_opts *o, double *worst, worst_pair *wp)
{
    double err = fabs(a - num);
    double rel = err / fmax(fabs(num), 1e-12);
    double ratio = err / (o->atol + o->rtol * fabs(num));
    if (!isnan(r->max_abs_err) && (err > r->max_abs_err || isnan(err))) r->max_abs_err = err;
    if (!isnan(r->max_rel_err) && ((rel > r->max_rel_err && err > 0) || isnan(rel)))
        r->max_rel_err = rel;
    if (ratio > *worst || (isnan(ratio) && *worst != INFINITY)) {
        *worst = isnan(ratio) ? INFINITY : ratio;
        r->worst_index = idx;
        wp->analytic = a;
        wp->numeric = num;
    }
    if (!(ratio <= 1.0)) r->passed = false;
}

tg_status tg_gradcheck(tg_gradcheck_fn fn, void *ud, int n, tg_tensor *const *inputs,
                       const tg_gradcheck_opts *opts, tg_gradcheck_result *results)
{
    tg_gradcheck_opts o = {.eps = 1e-6, .atol = 1e-7, .rtol = 1e-5, .directions = 4, .seed = 1};
    if (opts) {
        o = *opts;
        if (o.eps <= 0) o.eps = 1e-6;
        if (o.atol <= 0) o.atol = 1e-7;
        if (o.rtol <= 0) o.rtol = 1e-5;
        if (o.directions <= 0) o.directions = 4;
    }
    if (!fn) return tg__err(TG_ERR_NULL, "bad argument #1 to 'gradcheck' (NULL function)");
    if (n < 1 || n > 16 || !inputs)
        return tg__err(TG_ERR_INVALID, "bad argument #3 to 'gradcheck' (%d inputs; need 1..16)", n);
    for (int i = 0; i < n; i++) {
        if (!inputs[i]) return tg__err_null("gradcheck", 4);
        if (inputs[i]->dtype == TG_F32)
            return tg__err(TG_ERR_DTYPE, "bad argument #4 to 'gradcheck' (input %d is f32; "
                                         "gradcheck needs f64 inputs)", i);
    }
    tg_tensor *x[16] = {0}, *leaf[16] = {0};
    tg_gradcheck_result res[16];
    worst_pair wp[16] = {{0, 0}};
    memset(res, 0, sizeof res);
    tg_tape *tape = tg_tape_new(NULL);
    tg_status st = tape ? TG_OK : TG_ERR_NOMEM;
    bool prev_grad = tg_grad_set_enabled(true);
    for (int i = 0; i < n && !st; i++) {
        x[i] = copy_of(inputs[i]);
        leaf[i] = copy_of(inputs[i]);
        if (!x[i] || !leaf[i]) st = TG_ERR_NOMEM;
        res[i].checked = tg__is_float(inputs[i]->dtype);
        res[i].passed = true;
        res[i].worst_index = -1;
        if (!st && res[i].checked) st = tg_requires_grad(tape, leaf[i]);
    }
    problem p = {.fn = fn, .ud = ud, .n = n, .x = x, .w = NULL};
    tg_tensor *y = NULL;
    if (!st) {
        /* fn may build nested expressions: own its result, drop the rest. */
        tg_scope_begin();
        y = fn(ud, n, leaf);
        if (y && y->scope_owned) tg_tensor_retain(y);
        tg_scope_end();
        if (!y) st = tg_last_error() ? tg_last_error() : TG_ERR_INTERNAL;
    }
    if (!st && !tg__is_float(y->dtype))
        st = tg__err(TG_ERR_DTYPE, "gradcheck: function returned a %s tensor", tg_dtype_name(y->dtype));
    tg_rng rng;
    tg_rng_seed(&rng, o.seed);
    if (!st) {
        p.w = tg__tensor_empty(y->dtype, y->ndim, y->shape, y->backend);
        if (!p.w) st = TG_ERR_NOMEM;
        else
            for (int64_t i = 0; i < y->numel; i++) {
                /* w has y's dtype: an f32 output (e.g. a cast) gets f32 weights. */
                double wi = 0.5 + tg_rng_double(&rng);
                if (y->dtype == TG_F32)
                    ((float *)tg__tensor_ptr(p.w))[i] = (float)wi;
                else
                    ((double *)tg__tensor_ptr(p.w))[i] = wi;
            }
    }
    if (!st && !tg_tensor_requires_grad(y)) {
        /* Output does not depend on any checked input: all gradients are 0. */
    } else if (!st) {
        st = tg_backward_seed(y, p.w);
    }
    tg_tensor_release(y);
    tg_grad_set_enabled(false);
    for (int i = 0; i < n && !st; i++) {
        if (!res[i].checked) continue;
        tg_tensor *g = leaf[i]->grad;
        double *xv = tg__tensor_ptr(x[i]);
        double worst = 0.0;
        if (!o.fast) {
            for (int64_t j = 0; j < x[i]->numel && !st; j++) {
                double keep = xv[j], lp, lm;
                xv[j] = keep + o.eps;
                st = eval_loss(&p, &lp);
                xv[j] = keep - o.eps;
                if (!st) st = eval_loss(&p, &lm);
                xv[j] = keep;
                double a = g ? ((double *)tg__tensor_ptr(g))[j] : 0.0;
                if (!st) result_update(&res[i], a, (lp - lm) / (2 * o.eps), j, &o, &worst, &wp[i]);
            }
        } else {
            int64_t m = x[i]->numel;
            double *v = malloc((size_t)(m ? m : 1) * sizeof *v), *keep = malloc((size_t)(m ? m : 1) * sizeof *keep);
            if (!v || !keep) st = tg__err(TG_ERR_NOMEM, "out of memory in gradcheck");
            for (int d = 0; d < o.directions && !st; d++) {
                double a = 0.0, lp, lm;
                for (int64_t j = 0; j < m; j++) {
                    v[j] = tg_rng_gauss(&rng);
                    keep[j] = xv[j];
                    a += (g ? ((double *)tg__tensor_ptr(g))[j] : 0.0) * v[j];
                }
                for (int64_t j = 0; j < m; j++) xv[j] = keep[j] + o.eps * v[j];
                st = eval_loss(&p, &lp);
                for (int64_t j = 0; j < m; j++) xv[j] = keep[j] - o.eps * v[j];
                if (!st) st = eval_loss(&p, &lm);
                for (int64_t j = 0; j < m; j++) xv[j] = keep[j];
                if (!st) result_update(&res[i], a, (lp - lm) / (2 * o.eps), d, &o, &worst, &wp[i]);
            }
            free(v);
            free(keep);
        }
    }
    tg_grad_set_enabled(prev_grad);
    bool all = true;
    for (int i = 0; i < n; i++) {
        if (res[i].checked && !res[i].passed) all = false;
        tg_tensor_release(x[i]);
        tg_tensor_release(leaf[i]);
    }
    tg_tensor_release(p.w);
    tg_tape_free(tape);
    if (results) memcpy(results, res, (size_t)n * sizeof *results);
    if (st) return st;
    if (!all) {
        for (int i = 0; i < n; i++)
            if (res[i].checked && !res[i].passed)
                return tg__err(TG_ERR_GRADCHECK, "gradcheck: input %d: max abs error %.3g, max rel "
                                                 "error %.3g; worst at %s %lld: analytic %.6g, "
                                                 "numeric %.6g%s", i, res[i].max_abs_err,
                               res[i].max_rel_err, o.fast ? "direction" : "index",
                               (long long)res[i].worst_index, wp[i].analytic, wp[i].numeric,
                               isnan(wp[i].analytic) || isnan(wp[i].numeric) ? " (NaN)" : "");
    }
    return TG_OK;
}

/* ---- second order
 * The function checked is h(x, v) = J(x)^T v (tg_grad_of of fn at x with
 * seed v), the floating inputs' gradients flattened and joined: its
 * gradient with respect to x is the second derivative of fn contracted
 * with v, with respect to v fn's Jacobian again. tg_gradcheck checks it
 * like any function: the analytic side differentiates the gradients that
 * a create_graph sweep recorded, the numeric side differences h, which is
 * evaluated on a private tape of its own. */
typedef struct {
    tg_gradcheck_fn fn;
    void *ud;
    tg_dtype ydtype;
} vjp_problem;

static tg_tensor *vjp_fn(void *ud, int m, tg_tensor *const *in)
{
    vjp_problem *p = ud;
    int n = m - 1, nf = 0;
    bool analytic = tg_grad_enabled();
    for (int i = 0; i < n; i++) analytic = analytic && (!tg__is_float(in[i]->dtype) ||
                                                       tg_tensor_requires_grad(in[i]));
    tg_tape *tape = NULL;
    tg_tensor *xs[16] = {0}, *xf[16], *g[16] = {0}, *flat[16], *out = NULL;
    bool prev = tg_grad_set_enabled(true);
    tg_scope_begin();
    if (!analytic) tape = tg_tape_new(NULL);
    tg_status st = analytic || tape ? TG_OK : TG_ERR_NOMEM;
    for (int i = 0; i < n && !st; i++) {
        xs[i] = in[i];
        if (!tg__is_float(in[i]->dtype)) continue;
        if (!analytic) {
            xs[i] = tg__scope_track(copy_of(in[i]));
            st = xs[i] ? tg_requires_grad(tape, xs[i]) : TG_ERR_NOMEM;
        }
        xf[nf++] = xs[i];
    }
    tg_tensor *y = st ? NULL : p->fn(p->ud, n, xs);
    if (!st && !y) st = tg_last_error() ? tg_last_error() : TG_ERR_INTERNAL;
    if (y && !y->scope_owned) tg__scope_track(y);
    if (!st && tg_tensor_requires_grad(y)) {
        tg_tensor *v = in[n]->dtype == y->dtype ? in[n] : tg_cast(in[n], y->dtype);
        tg_grad_opts go = {.create_graph = analytic, .allow_unused = true};
        st = v ? tg_grad_of(1, &y, &v, nf, xf, g, &go) : tg_last_error();
    } else if (!st) {
        /* y does not depend on x: h is 0 */
        for (int i = 0; i < nf && !st; i++) {
            g[i] = tg_zeros(xf[i]->dtype, xf[i]->ndim, xf[i]->shape);
            if (!g[i]) st = tg_last_error();
        }
    }
    for (int i = 0; i < nf && !st; i++) {
        flat[i] = tg_reshape(g[i], 1, (int64_t[]){xf[i]->numel});
        if (!flat[i]) st = tg_last_error();
    }
    if (!st) {
        out = nf == 1 ? flat[0] : tg_concat(nf, flat, 0);
        if (!out) st = tg_last_error();
    }
    /* Numeric side: an untracked copy, which outlives the private tape. */
    if (out) out = analytic ? tg_tensor_retain(out) : copy_of(out);
    tg_scope_end();
    tg_tape_free(tape);
    tg_grad_set_enabled(prev);
    return out;
}

tg_status tg_gradgradcheck(tg_gradcheck_fn fn, void *ud, int n, tg_tensor *const *inputs,
                           const tg_gradcheck_opts *opts, tg_gradcheck_result *results)
{
    if (!fn) return tg__err(TG_ERR_NULL, "bad argument #1 to 'gradgradcheck' (NULL function)");
    if (n < 1 || n > 15 || !inputs)
        return tg__err(TG_ERR_INVALID, "bad argument #3 to 'gradgradcheck' (%d inputs; need 1..15)",
                       n);
    for (int i = 0; i < n; i++) {
        if (!inputs[i]) return tg__err_null("gradgradcheck", 4);
        if (inputs[i]->dtype == TG_F32)
            return tg__err(TG_ERR_DTYPE, "bad argument #4 to 'gradgradcheck' (input %d is f32; "
                                         "gradgradcheck needs f64 inputs)", i);
    }
    /* y's spec, for the seed v: one untracked evaluation. */
    bool prev = tg_grad_set_enabled(false);
    tg_scope_begin();
    tg_tensor *y = fn(ud, n, inputs);
    tg_spec ys = {0};
    tg_backend yb = TG_BACKEND_REF;
    if (y) {
        tg__spec_of(y, &ys);
        yb = y->backend;
        if (!y->scope_owned) tg_tensor_release(y);
    }
    tg_status st = y ? TG_OK : (tg_last_error() ? tg_last_error() : TG_ERR_INTERNAL);
    tg_scope_end();
    tg_grad_set_enabled(prev);
    if (st) return st;
    if (!tg__is_float(ys.dtype))
        return tg__err(TG_ERR_DTYPE, "gradgradcheck: function returned a %s tensor",
                       tg_dtype_name(ys.dtype));
    tg_tensor *v = tg__tensor_empty(TG_F64, ys.ndim, ys.shape, yb);
    if (!v) return TG_ERR_NOMEM;
    tg_rng rng;
    tg_rng_seed(&rng, (opts ? opts->seed : 1) + 777);
    for (int64_t i = 0; i < v->numel; i++)
        ((double *)tg__tensor_ptr(v))[i] = 2.0 * tg_rng_double(&rng) - 1.0;
    tg_tensor *in[16];
    for (int i = 0; i < n; i++) in[i] = inputs[i];
    in[n] = v;
    vjp_problem p = {.fn = fn, .ud = ud, .ydtype = ys.dtype};
    tg_gradcheck_result res[16];
    memset(res, 0, sizeof res);
    st = tg_gradcheck(vjp_fn, &p, n + 1, in, opts, res);
    tg_tensor_release(v);
    if (results) memcpy(results, res, (size_t)(n + 1) * sizeof *results);
    return st;
}

/* ---- one registered op over all its sample cases */
typedef struct {
    const tg_op *op;
    tg_op_attrs attrs;
} op_case;

static tg_tensor *call_op(void *ud, int n, tg_tensor *const *in)
{
    op_case *c = ud;
    return tg_op_call(c->op, n, in, &c->attrs);
}

static tg_status check_op(const char *who, int order, const tg_op *op, tg_backend backend,
                          const tg_gradcheck_opts *opts, tg_op_check *report)
{
    tg_op_check rep = {.worst_case = -1, .worst_input = -1};
    if (report) *report = rep;
    if (!op) return tg__err(TG_ERR_NULL, "bad argument #1 to '%s' (NULL op)", who);
    if ((unsigned)backend >= TG_BACKEND_COUNT)
        return tg__err(TG_ERR_INVALID, "bad argument #2 to '%s' (no backend %d)", who,
                       (int)backend);
    if (!op->backward)
        return tg__err(TG_ERR_INVALID, "bad argument #1 to '%s' (op '%s' is not "
                                       "differentiable)", who, op->name);
    if (!op->sample)
        return tg__err(TG_ERR_NOT_FOUND, "op '%s' has no gradcheck cases (.sample is NULL)",
                       op->name);
    tg_rng rng;
    tg_rng_seed(&rng, opts ? opts->seed + 12345 : 12345);
    tg_backend prev = tg_set_default_backend(backend);
    tg_status st = TG_OK, first_fail = TG_OK;
    char fail_msg[512] = "";
    for (int k = 0; k < 64 && st == TG_OK; k++) {
        tg_tensor *in[TG_OP_MAX_INPUTS] = {0};
        op_case c = {.op = op};
        /* A sample may return scope-owned tensors (made with the public
         * API) or its own references: end up owning one reference each. */
        tg_scope_begin();
        int n = op->sample(k, &rng, in, &c.attrs);
        for (int i = 0; i < TG_OP_MAX_INPUTS; i++)
            if (in[i] && in[i]->scope_owned) tg_tensor_retain(in[i]);
        tg_scope_end();
        if (n == 0) {
            for (int i = 0; i < TG_OP_MAX_INPUTS; i++) tg_tensor_release(in[i]);
            break;
        }
        if (n < 0 || n > TG_OP_MAX_INPUTS) {
            st = tg__err(TG_ERR_INTERNAL, "sample of op '%s' failed for case %d", op->name, k);
        } else {
            tg_gradcheck_result res[TG_OP_MAX_INPUTS + 1];
            tg_status cst = order == 2 ? tg_gradgradcheck(call_op, &c, n, in, opts, res)
                                       : tg_gradcheck(call_op, &c, n, in, opts, res);
            int nres = order == 2 ? n + 1 : n; /* second order: the seed too */
            rep.cases++;
            if (cst == TG_ERR_GRADCHECK) {
                rep.failed++;
                if (!first_fail) {
                    first_fail = cst;
                    snprintf(fail_msg, sizeof fail_msg, "op '%s' case %d on %s: %s", op->name, k,
                             tg_backend_name(backend), tg_last_error_message());
                }
            } else if (cst != TG_OK) {
                st = cst;
            }
            /* res is filled only when the check itself ran. */
            for (int i = 0; i < nres && (cst == TG_OK || cst == TG_ERR_GRADCHECK); i++) {
                if (!res[i].checked) continue;
                if (res[i].max_abs_err >= rep.max_abs_err) {
                    rep.max_abs_err = res[i].max_abs_err;
                    rep.worst_case = k;
                    rep.worst_input = i;
                }
                if (res[i].max_rel_err > rep.max_rel_err) rep.max_rel_err = res[i].max_rel_err;
            }
        }
        for (int i = 0; i < TG_OP_MAX_INPUTS; i++) tg_tensor_release(in[i]);
    }
    tg_set_default_backend(prev);
    if (report) *report = rep;
    if (st) return st;
    if (rep.cases == 0)
        return tg__err(TG_ERR_NOT_FOUND, "op '%s' has no gradcheck cases (sample returned none)",
                       op->name);
    if (first_fail) return tg__err(TG_ERR_GRADCHECK, "%s", fail_msg);
    return TG_OK;
}

tg_status tg_gradcheck_op(const tg_op *op, tg_backend backend, const tg_gradcheck_opts *opts,
                          tg_op_check *report)
{
    return check_op("gradcheck_op", 1, op, backend, opts, report);
}

tg_status tg_gradgradcheck_op(const tg_op *op, tg_backend backend, const tg_gradcheck_opts *opts,
                              tg_op_check *report)
{
    return check_op("gradgradcheck_op", 2, op, backend, opts, report);
}
