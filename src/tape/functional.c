/* Functional autodiff (tapegrad/functional.h): each helper records f on a
 * private tape at views of the points, then asks tg_grad_of for what it
 * needs, once (VJP), twice (JVP, HVP: the first sweep with create_graph)
 * or once per element (Jacobian, Hessian, over one retained record).
 * Everything it makes lives in one scope of its own; results are detached
 * views, retained past that scope and handed to the caller's. */
#include <string.h>

#include "core/internal.h"

typedef struct fcall {
    const char *who;
    tg_tape *tape;
    int n;
    tg_tensor *xs[TG_FUNC_MAX_INPUTS]; /* leaves of tape: views of the points */
    tg_tensor *y;
    bool prev_grad;
} fcall;

static tg_status check_points(const char *who, tg_func f, int n, tg_tensor *const *x)
{
    if (!f) return tg__err(TG_ERR_NULL, "bad argument #1 to '%s' (NULL function)", who);
    if (n < 1 || n > TG_FUNC_MAX_INPUTS)
        return tg__err(TG_ERR_INVALID, "bad argument #3 to '%s' (%d points; need 1..%d)", who, n,
                       TG_FUNC_MAX_INPUTS);
    if (!x) return tg__err(TG_ERR_NULL, "bad argument #4 to '%s' (NULL array of points)", who);
    for (int i = 0; i < n; i++) {
        if (!x[i]) return tg__err(TG_ERR_NULL, "bad argument #4 to '%s' (point %d is NULL)", who, i);
        if (!tg__is_float(x[i]->dtype))
            return tg__err(TG_ERR_DTYPE, "bad argument #4 to '%s' (point %d is %s; need f32 or "
                                         "f64)", who, i, tg_dtype_name(x[i]->dtype));
    }
    return TG_OK;
}

/* Vectors v[0..n) of the points' shapes and dtypes. */
static tg_status check_vectors(const char *who, int n, tg_tensor *const *x, tg_tensor *const *v)
{
    if (!v) return tg__err(TG_ERR_NULL, "bad argument #5 to '%s' (NULL array of vectors)", who);
    for (int i = 0; i < n; i++) {
        char a[96], b[96];
        if (!v[i]) return tg__err(TG_ERR_NULL, "bad argument #5 to '%s' (vector %d is NULL)", who, i);
        if (v[i]->dtype != x[i]->dtype || v[i]->backend != x[i]->backend ||
            !tg__same_shape(v[i]->ndim, v[i]->shape, x[i]->ndim, x[i]->shape))
            return tg__err(TG_ERR_SHAPE, "bad argument #5 to '%s' (vector %d is %s %s on %s, point "
                                         "%s %s on %s)", who, i, tg_dtype_name(v[i]->dtype),
                           tg_shape_str(v[i]->ndim, v[i]->shape, a, sizeof a),
                           tg_backend_name(v[i]->backend), tg_dtype_name(x[i]->dtype),
                           tg_shape_str(x[i]->ndim, x[i]->shape, b, sizeof b),
                           tg_backend_name(x[i]->backend));
    }
    return TG_OK;
}

/* Opens the helper's scope and tape and evaluates y = f(xs). */
static tg_status fcall_begin(fcall *c, const char *who, tg_func f, void *ud, int n,
                             tg_tensor *const *x)
{
    memset(c, 0, sizeof *c);
    c->who = who;
    c->n = n;
    c->prev_grad = tg_grad_set_enabled(true);
    tg_scope_begin();
    c->tape = tg_tape_new(NULL);
    if (!c->tape) return TG_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        c->xs[i] = tg_detach(x[i]);
        if (!c->xs[i]) return tg_last_error();
        tg_status st = tg_requires_grad(c->tape, c->xs[i]);
        if (st) return st;
    }
    tg_error_clear();
    c->y = f(ud, n, c->xs);
    if (!c->y)
        return tg_last_error() ? tg_last_error()
                               : tg__err(TG_ERR_INTERNAL, "'%s': the function returned NULL", who);
    if (!c->y->scope_owned) tg__scope_track(c->y);
    if (!tg__is_float(c->y->dtype))
        return tg__err(TG_ERR_DTYPE, "'%s': the function returned a %s tensor; need f32 or f64",
                       who, tg_dtype_name(c->y->dtype));
    return TG_OK;
}

/* Closes the helper. On success (st == TG_OK) outs[0..nout) are results
 * borrowed from the helper's scope: each becomes a detached view that
 * outlives it, handed to the caller's scope. On failure, or if that fails,
 * every outs[k] is NULL and nothing is left behind. */
static tg_status fcall_end(fcall *c, tg_status st, int nout, tg_tensor **outs)
{
    int kept = 0;
    for (; kept < nout && !st; kept++) {
        tg_tensor *d = tg_detach(outs[kept]);
        if (!d) st = tg_last_error() ? tg_last_error() : TG_ERR_NOMEM;
        outs[kept] = d ? tg_tensor_retain(d) : NULL;
    }
    if (st)
        while (kept--) tg_tensor_release(outs[kept]);
    tg_scope_end();
    tg_tape_free(c->tape);
    tg_grad_set_enabled(c->prev_grad);
    for (int k = 0; k < nout && !st; k++) {
        if (tg__scope_track(outs[k])) continue;
        /* The caller's scope could not grow (outs[k] is released): those
         * already in it go with it, the rest are released here. */
        for (int j = k + 1; j < nout; j++) tg_tensor_release(outs[j]);
        st = TG_ERR_NOMEM;
    }
    if (st)
        for (int k = 0; k < nout; k++) outs[k] = NULL;
    return st;
}

static tg_tensor *zeros_as(tg_dtype dt, int ndim, const int64_t *shape, tg_backend be)
{
    tg_tensor *z = tg__tensor_empty(dt, ndim, shape, be);
    if (z) memset(tg__tensor_ptr(z), 0, (size_t)z->numel * tg_dtype_size(dt));
    return tg__scope_track(z);
}

/* A tensor shaped like t, zero but for a 1 at flat index k. */
static tg_tensor *one_hot(const tg_tensor *t, int64_t k)
{
    tg_tensor *e = zeros_as(t->dtype, t->ndim, t->shape, t->backend);
    if (!e) return NULL;
    if (t->dtype == TG_F32)
        ((float *)tg__tensor_ptr(e))[k] = 1.0f;
    else
        ((double *)tg__tensor_ptr(e))[k] = 1.0;
    return e;
}

/* sum_i <a[i], b[i]> over the a[i] that are tracked (the others are
 * constant zeros); NULL with *st = TG_OK when none is. */
static tg_tensor *inner(int n, tg_tensor *const *a, tg_tensor *const *b, tg_status *st)
{
    tg_tensor *s = NULL;
    *st = TG_OK;
    for (int i = 0; i < n; i++) {
        if (!tg_tensor_requires_grad(a[i])) continue;
        tg_tensor *t = tg_sum(tg_mul(a[i], b[i]));
        s = s ? tg_add(s, t) : t;
        if (!s) {
            *st = tg_last_error();
            return NULL;
        }
    }
    return s;
}

/* grads of out (seed: NULL for one element) w.r.t. the helper's points. */
static tg_status grads_of(fcall *c, tg_tensor *out, tg_tensor *seed, bool create, tg_tensor **g)
{
    if (!tg_tensor_requires_grad(out)) {
        /* out does not depend on the points */
        for (int i = 0; i < c->n; i++) {
            g[i] = zeros_as(c->xs[i]->dtype, c->xs[i]->ndim, c->xs[i]->shape, c->xs[i]->backend);
            if (!g[i]) return tg_last_error();
        }
        return TG_OK;
    }
    tg_grad_opts o = {.create_graph = create, .retain = true, .allow_unused = true};
    tg_tensor *seeds[1] = {seed};
    return tg_grad_of(1, &out, seed ? seeds : NULL, c->n, c->xs, g, &o);
}

tg_status tg_vjp(tg_func f, void *ud, int n, tg_tensor *const *x, const tg_tensor *v,
                 tg_tensor **y, tg_tensor **vjp)
{
    static const char *who = "vjp";
    if (y) *y = NULL;
    if (!vjp) return tg__err(TG_ERR_NULL, "bad argument #7 to '%s' (NULL result array)", who);
    for (int i = 0; i < n && i < TG_FUNC_MAX_INPUTS; i++) vjp[i] = NULL;
    tg_status st = check_points(who, f, n, x);
    if (st) return st;
    fcall c;
    tg_tensor *outs[TG_FUNC_MAX_INPUTS + 1] = {0};
    st = fcall_begin(&c, who, f, ud, n, x);
    if (!st && v) {
        char a[96], b[96];
        if (v->dtype != c.y->dtype || v->backend != c.y->backend ||
            !tg__same_shape(v->ndim, v->shape, c.y->ndim, c.y->shape))
            st = tg__err(TG_ERR_SHAPE, "bad argument #5 to '%s' (v is %s %s on %s, f's output %s %s "
                                       "on %s)", who, tg_dtype_name(v->dtype),
                         tg_shape_str(v->ndim, v->shape, a, sizeof a), tg_backend_name(v->backend),
                         tg_dtype_name(c.y->dtype), tg_shape_str(c.y->ndim, c.y->shape, b, sizeof b),
                         tg_backend_name(c.y->backend));
    } else if (!st && c.y->numel != 1) {
        st = tg__err(TG_ERR_SEED, "'%s': f's output has %lld elements; pass v", who,
                     (long long)c.y->numel);
    }
    if (!st) st = grads_of(&c, c.y, (tg_tensor *)v, false, outs);
    outs[n] = c.y;
    st = fcall_end(&c, st, y ? n + 1 : n, outs);
    for (int i = 0; i < n; i++) vjp[i] = outs[i];
    if (y) *y = outs[n];
    return st;
}

tg_status tg_jvp(tg_func f, void *ud, int n, tg_tensor *const *x, tg_tensor *const *v,
                 tg_tensor **y, tg_tensor **jvp)
{
    static const char *who = "jvp";
    if (y) *y = NULL;
    if (!jvp) return tg__err(TG_ERR_NULL, "bad argument #7 to '%s' (NULL result)", who);
    *jvp = NULL;
    tg_status st = check_points(who, f, n, x);
    if (!st) st = check_vectors(who, n, x, v);
    if (st) return st;
    fcall c;
    tg_tensor *outs[2] = {0}, *g[TG_FUNC_MAX_INPUTS];
    st = fcall_begin(&c, who, f, ud, n, x);
    tg_tensor *u = NULL;
    if (!st) {
        /* g(u) = J^T u is linear in u: any u will do, zero is cheapest. */
        u = zeros_as(c.y->dtype, c.y->ndim, c.y->shape, c.y->backend);
        st = u ? tg_requires_grad(c.tape, u) : tg_last_error();
    }
    if (!st && tg_tensor_requires_grad(c.y)) {
        tg_grad_opts o = {.create_graph = true, .allow_unused = true};
        tg_tensor *seeds[1] = {u};
        st = tg_grad_of(1, &c.y, seeds, n, c.xs, g, &o);
        tg_tensor *s = st ? NULL : inner(n, g, v, &st);
        if (!st && s) {
            tg_grad_opts o2 = {.allow_unused = true};
            st = tg_grad_of(1, &s, NULL, 1, &u, &outs[0], &o2);
        }
    }
    if (!st && !outs[0]) {
        outs[0] = zeros_as(c.y->dtype, c.y->ndim, c.y->shape, c.y->backend);
        if (!outs[0]) st = tg_last_error();
    }
    outs[1] = c.y;
    st = fcall_end(&c, st, y ? 2 : 1, outs);
    *jvp = outs[0];
    if (y) *y = outs[1];
    return st;
}

tg_status tg_hvp(tg_func f, void *ud, int n, tg_tensor *const *x, tg_tensor *const *v,
                 tg_tensor **y, tg_tensor **hvp)
{
    static const char *who = "hvp";
    if (y) *y = NULL;
    if (!hvp) return tg__err(TG_ERR_NULL, "bad argument #7 to '%s' (NULL result array)", who);
    for (int i = 0; i < n && i < TG_FUNC_MAX_INPUTS; i++) hvp[i] = NULL;
    tg_status st = check_points(who, f, n, x);
    if (!st) st = check_vectors(who, n, x, v);
    if (st) return st;
    fcall c;
    tg_tensor *outs[TG_FUNC_MAX_INPUTS + 1] = {0}, *g[TG_FUNC_MAX_INPUTS];
    st = fcall_begin(&c, who, f, ud, n, x);
    if (!st && c.y->numel != 1)
        st = tg__err(TG_ERR_SEED, "'%s': f must be scalar (its output has %lld elements)", who,
                     (long long)c.y->numel);
    if (!st) st = grads_of(&c, c.y, NULL, true, g);
    tg_tensor *s = st ? NULL : inner(n, g, v, &st);
    if (!st) st = grads_of(&c, s ? s : g[0], NULL, false, outs);
    outs[n] = c.y;
    st = fcall_end(&c, st, y ? n + 1 : n, outs);
    for (int i = 0; i < n; i++) hvp[i] = outs[i];
    if (y) *y = outs[n];
    return st;
}

/* dst (rows of row_elems elements) gets src at row k. */
static void put_row(tg_tensor *dst, int64_t k, const tg_tensor *src)
{
    size_t es = tg_dtype_size(dst->dtype), bytes = (size_t)src->numel * es;
    tg_tensor_copy_out(src, (char *)tg__tensor_ptr(dst) + (size_t)k * bytes, bytes);
}

/* A zeroed result of shape a ++ b. */
static tg_status outer_shape(const char *who, const tg_tensor *a, const tg_tensor *b, tg_dtype dt,
                             tg_tensor **out)
{
    int nd = a->ndim + b->ndim;
    if (nd > TG_MAX_DIMS)
        return tg__err(TG_ERR_SHAPE, "'%s': the result would have %d dims (at most %d)", who, nd,
                       TG_MAX_DIMS);
    int64_t shape[TG_MAX_DIMS];
    memcpy(shape, a->shape, (size_t)a->ndim * sizeof *shape);
    memcpy(shape + a->ndim, b->shape, (size_t)b->ndim * sizeof *shape);
    *out = zeros_as(dt, nd, shape, b->backend);
    return *out ? TG_OK : tg_last_error();
}

tg_status tg_jacobian(tg_func f, void *ud, int n, tg_tensor *const *x, tg_tensor **jac)
{
    static const char *who = "jacobian";
    if (!jac) return tg__err(TG_ERR_NULL, "bad argument #5 to '%s' (NULL result array)", who);
    for (int i = 0; i < n && i < TG_FUNC_MAX_INPUTS; i++) jac[i] = NULL;
    tg_status st = check_points(who, f, n, x);
    if (st) return st;
    fcall c;
    tg_tensor *outs[TG_FUNC_MAX_INPUTS] = {0}, *g[TG_FUNC_MAX_INPUTS];
    st = fcall_begin(&c, who, f, ud, n, x);
    for (int i = 0; i < n && !st; i++) st = outer_shape(who, c.y, c.xs[i], c.xs[i]->dtype, &outs[i]);
    for (int64_t k = 0; k < c.y->numel && !st && tg_tensor_requires_grad(c.y); k++) {
        tg_scope_begin();
        tg_tensor *e = one_hot(c.y, k);
        st = e ? grads_of(&c, c.y, e, false, g) : tg_last_error();
        for (int i = 0; i < n && !st; i++) put_row(outs[i], k, g[i]);
        tg_scope_end();
    }
    st = fcall_end(&c, st, n, outs);
    for (int i = 0; i < n; i++) jac[i] = outs[i];
    return st;
}

tg_status tg_hessian(tg_func f, void *ud, int n, tg_tensor *const *x, tg_tensor **hess)
{
    static const char *who = "hessian";
    if (!hess) return tg__err(TG_ERR_NULL, "bad argument #5 to '%s' (NULL result array)", who);
    for (int i = 0; i < n * n && i < TG_FUNC_MAX_INPUTS * TG_FUNC_MAX_INPUTS; i++) hess[i] = NULL;
    tg_status st = check_points(who, f, n, x);
    if (st) return st;
    fcall c;
    tg_tensor *outs[TG_FUNC_MAX_INPUTS * TG_FUNC_MAX_INPUTS] = {0}, *g[TG_FUNC_MAX_INPUTS],
              *h[TG_FUNC_MAX_INPUTS];
    st = fcall_begin(&c, who, f, ud, n, x);
    if (!st && c.y->numel != 1)
        st = tg__err(TG_ERR_SEED, "'%s': f must be scalar (its output has %lld elements)", who,
                     (long long)c.y->numel);
    for (int i = 0; i < n && !st; i++)
        for (int j = 0; j < n && !st; j++)
            st = outer_shape(who, c.xs[i], c.xs[j], c.xs[j]->dtype, &outs[i * n + j]);
    if (!st) st = grads_of(&c, c.y, NULL, true, g);
    for (int i = 0; i < n && !st; i++) {
        /* Row e of block (i, j): d g_i[e] / d x_j; nothing if g_i is
         * constant (the block stays zero). */
        for (int64_t e = 0; e < g[i]->numel && !st && tg_tensor_requires_grad(g[i]); e++) {
            tg_scope_begin();
            tg_tensor *oh = one_hot(g[i], e);
            st = oh ? grads_of(&c, g[i], oh, false, h) : tg_last_error();
            for (int j = 0; j < n && !st; j++) put_row(outs[i * n + j], e, h[j]);
            tg_scope_end();
        }
    }
    st = fcall_end(&c, st, n * n, outs);
    for (int k = 0; k < n * n; k++) hess[k] = outs[k];
    return st;
}
