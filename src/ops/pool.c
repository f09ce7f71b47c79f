/* 2-d max and average pooling over NCHW inputs, each with a fused backward
 * op. The backward ops are linear in gy and have backwards of their own
 * (avg: avg_pool2d again, its adjoint; max: a gather at the saved argmax),
 * so both pools are differentiable to any order.
 *
 * attrs layout, shared by the four ops:
 *   ints[0..5] = kernel h, kernel w, stride h, stride w, padding h,
 *                padding w (stride is explicit here; tg_*_pool2d maps 0 to
 *                the kernel size)
 *   ints[6..7] = backward ops only: H, W of the input they reconstruct
 *   flag       = avg only: nonzero excludes padded cells from the divisor
 *                (PyTorch's count_include_pad=False)
 * max_pool2d saves the i64 argmax of each window (flat in its H*W plane) as
 * extra slot 0 and nothing else; avg_pool2d saves nothing. */
#include <string.h>

#include "ops/helpers.h"

/* Each pool's backward calls its backward op, defined after it with its
 * cases; avg_pool2d_backward's backward calls avg_pool2d. */
extern const tg_op tg__op_max_pool2d_backward, tg__op_avg_pool2d_backward, tg__op_avg_pool2d;

static tg_pool2d_geom pool_geom(const tg_op_attrs *a, int64_t N, int64_t C, int64_t H, int64_t W)
{
    tg_pool2d_geom g = {
        .P = N * C, .H = H, .W = W, .KH = a->ints[0], .KW = a->ints[1],
        .sh = a->ints[2], .sw = a->ints[3], .ph = a->ints[4], .pw = a->ints[5],
        .exclude_pad = a->flag != 0,
    };
    int64_t sh = H + 2 * g.ph - g.KH, sw = W + 2 * g.pw - g.KW;
    g.OH = sh < 0 ? 0 : sh / g.sh + 1;
    g.OW = sw < 0 ? 0 : sw / g.sw + 1;
    return g;
}

static tg_status check_attrs(const tg_op *op, const tg_op_attrs *a)
{
    const int64_t *v = a->ints;
    if (v[0] >= 1 && v[1] >= 1 && v[2] >= 1 && v[3] >= 1 && v[4] >= 0 && v[5] >= 0 &&
        2 * v[4] <= v[0] && 2 * v[5] <= v[1])
        return TG_OK;
    return tg__err(TG_ERR_INVALID, "bad argument #2 to '%s' (kernel %lldx%lld, stride %lldx%lld, "
                                   "padding %lldx%lld: need kernel and stride >= 1 and 0 <= "
                                   "padding <= kernel / 2)", op->name, (long long)v[0],
                   (long long)v[1], (long long)v[2], (long long)v[3], (long long)v[4],
                   (long long)v[5]);
}

/* ---- forward ops: x (N, C, H, W) -> (N, C, OH, OW) */
static tg_status pool_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                            tg_spec *out)
{
    const tg_tensor *x = in[0];
    char s[96];
    if (tg__need_float(op, 1, x)) return TG_ERR_DTYPE;
    if (x->ndim != 4)
        return tg__err(TG_ERR_SHAPE, "bad argument #1 to '%s' (input %s; need (N, C, H, W))",
                       op->name, tg_shape_str(x->ndim, x->shape, s, sizeof s));
    if (check_attrs(op, a)) return TG_ERR_INVALID;
    tg_pool2d_geom g = pool_geom(a, x->shape[0], x->shape[1], x->shape[2], x->shape[3]);
    if (g.OH < 1 || g.OW < 1)
        return tg__err(TG_ERR_SHAPE, "bad argument #1 to '%s' (input %s padded by %lldx%lld is "
                                     "smaller than the %lldx%lld window)", op->name,
                       tg_shape_str(x->ndim, x->shape, s, sizeof s), (long long)g.ph,
                       (long long)g.pw, (long long)g.KH, (long long)g.KW);
    out->dtype = x->dtype;
    out->ndim = 4;
    out->shape[0] = x->shape[0];
    out->shape[1] = x->shape[1];
    out->shape[2] = g.OH;
    out->shape[3] = g.OW;
    return TG_OK;
}

/* ---- backward ops: output (N, C, H, W) from gy (N, C, OH, OW), H and W
 * in ints[6..7]; argi_gy is gy's position. */
static tg_status pool_bwd_spec(const tg_op *op, const tg_op_attrs *a, const tg_tensor *gy,
                               int argi_gy, tg_spec *out)
{
    char s[96];
    if (tg__need_float(op, argi_gy, gy)) return TG_ERR_DTYPE;
    if (check_attrs(op, a)) return TG_ERR_INVALID;
    if (gy->ndim != 4)
        return tg__err(TG_ERR_SHAPE, "bad argument #%d to '%s' (gradient %s; need 4 dims)",
                       argi_gy, op->name, tg_shape_str(gy->ndim, gy->shape, s, sizeof s));
    tg_pool2d_geom g = pool_geom(a, gy->shape[0], gy->shape[1], a->ints[6], a->ints[7]);
    if (g.OH != gy->shape[2] || g.OW != gy->shape[3] || g.OH < 1 || g.OW < 1)
        return tg__err(TG_ERR_SHAPE, "bad argument #%d to '%s' (gradient %s does not pool a "
                                     "%lldx%lld input)", argi_gy, op->name,
                       tg_shape_str(gy->ndim, gy->shape, s, sizeof s), (long long)a->ints[6],
                       (long long)a->ints[7]);
    out->dtype = gy->dtype;
    out->ndim = 4;
    out->shape[0] = gy->shape[0];
    out->shape[1] = gy->shape[1];
    out->shape[2] = a->ints[6];
    out->shape[3] = a->ints[7];
    return TG_OK;
}

/* The forward attrs plus the input's H, W, for a backward op. */
static tg_op_attrs bwd_attrs(const tg_op_ctx *ctx)
{
    const tg_spec *xs = tg_op_ctx_input_spec(ctx, 0);
    tg_op_attrs a = *ctx->attrs;
    a.nints = 8;
    a.ints[6] = xs->shape[2];
    a.ints[7] = xs->shape[3];
    return a;
}

/* ---- max_pool2d */
static tg_tensor *max_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *x = in[0];
    tg_pool2d_geom g = pool_geom(ctx->attrs, x->shape[0], x->shape[1], x->shape[2], x->shape[3]);
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    tg_tensor *idx = y ? tg__tensor_empty(TG_I64, 4, ctx->out_spec->shape, x->backend) : NULL;
    if (!idx) {
        tg_tensor_release(y);
        return NULL;
    }
    TG_KERNEL(tg_max_pool2d_fn, TG_K_MAX_POOL2D, x)(&g, tg__tensor_ptr(x), tg__tensor_ptr(y),
                                                    tg__tensor_ptr(idx));
    if (ctx->needs) tg_op_ctx_save(ctx, idx);
    tg_tensor_release(idx);
    return y;
}

static tg_status max_bwd_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                               tg_spec *out)
{
    if (in[0]->dtype != TG_I64)
        return tg__err(TG_ERR_DTYPE, "bad argument #1 to '%s' (indices are %s; need i64)",
                       op->name, tg_dtype_name(in[0]->dtype));
    if (!tg__same_shape(in[0]->ndim, in[0]->shape, in[1]->ndim, in[1]->shape))
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (gradient and indices differ in "
                                     "shape)", op->name);
    return pool_bwd_spec(op, a, in[1], 2, out);
}

static tg_tensor *max_bwd_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_spec *os = ctx->out_spec;
    tg_pool2d_geom g = pool_geom(ctx->attrs, os->shape[0], os->shape[1], os->shape[2], os->shape[3]);
    tg_tensor *gx = tg_op_ctx_new_output(ctx);
    if (!gx) return NULL;
    TG_KERNEL(tg_max_pool2d_grad_fn, TG_K_MAX_POOL2D_GRAD, in[1])(
        &g, tg__tensor_ptr(in[0]), tg__tensor_ptr(in[1]), tg__tensor_ptr(gx));
    return gx;
}

static tg_status max_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    tg_op_attrs a = bwd_attrs(ctx);
    gin[0] = tg__call2(&tg__op_max_pool2d_backward, tg_op_ctx_saved(ctx, 0), g, &a);
    return gin[0] ? TG_OK : tg_last_error();
}

/* Cases (distinct values, so no window has a tie): non-overlapping 2x2;
 * overlapping 3x3 stride 2 with padding; unequal kernel/stride/padding. */
static const struct pool_case {
    int64_t x[4];
    int64_t ints[6];
    int flag;
} max_cases[] = {
    {{1, 2, 4, 4}, {2, 2, 2, 2, 0, 0}, 0},
    {{2, 1, 5, 5}, {3, 3, 2, 2, 1, 1}, 0},
    {{1, 2, 4, 5}, {3, 2, 1, 2, 1, 0}, 0},
};

/* The forward attrs of case c with H, W of its input, and a random gy of
 * its output's shape, for the backward ops' cases. */
static tg_tensor *bwd_case(tg_rng *rng, const struct pool_case *c, tg_op_attrs *a)
{
    a->nints = 8;
    memcpy(a->ints, c->ints, sizeof c->ints);
    a->ints[6] = c->x[2];
    a->ints[7] = c->x[3];
    a->flag = c->flag;
    tg_pool2d_geom g = pool_geom(a, c->x[0], c->x[1], c->x[2], c->x[3]);
    return tg__sample_uniform(rng, 4, TG_SHAPE(c->x[0], c->x[1], g.OH, g.OW), -1.0, 1.0);
}

/* Linear in gy: the adjoint of the scatter to idx is the gather of gg at
 * idx, in each (N, C) plane flattened. The indices are constants. */
static tg_status max_bwd_bwd(tg_op_ctx *ctx, tg_tensor *gg, tg_tensor **gin)
{
    const tg_spec *ys = tg_op_ctx_input_spec(ctx, 1);
    if (!tg_op_ctx_needs_grad(ctx, 1)) return TG_OK;
    int64_t N = ys->shape[0], C = ys->shape[1], L = ys->shape[2] * ys->shape[3];
    tg_tensor *idx = tg_reshape(tg_op_ctx_input(ctx, 0), 3, TG_SHAPE(N, C, L));
    tg_tensor *plane = tg_reshape(gg, 3, TG_SHAPE(N, C, gg->shape[2] * gg->shape[3]));
    gin[1] = tg_reshape(tg_gather(plane, 2, idx), 4, ys->shape);
    return gin[1] ? TG_OK : tg_last_error();
}

/* Cases: the max_pool2d geometries, with indices anywhere in the plane (the
 * op is linear in gy for any indices; repeats accumulate). */
static int max_bwd_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    if (k >= (int)(sizeof max_cases / sizeof max_cases[0])) return 0;
    const struct pool_case *c = &max_cases[k];
    in[1] = bwd_case(rng, c, a);
    in[0] = in[1] ? tg__sample_index(rng, 4, in[1]->shape, c->x[2] * c->x[3]) : NULL;
    return (in[0] && in[1]) ? 2 : -1;
}

const tg_op tg__op_max_pool2d_backward = {
    .name = "max_pool2d_backward", .doc = "gx = gy scattered to each window's argmax",
    .arity = 2, .shape = max_bwd_shape, .forward = max_bwd_fwd, .backward = max_bwd_bwd,
    .cost = TG_COST_MEMORY_BOUND, .saves = TG_SAVE_INPUT(0), .sample = max_bwd_sample,
};

static int max_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    if (k >= (int)(sizeof max_cases / sizeof max_cases[0])) return 0;
    a->nints = 6;
    memcpy(a->ints, max_cases[k].ints, sizeof max_cases[k].ints);
    in[0] = tg__sample_distinct(rng, 4, max_cases[k].x);
    return in[0] ? 1 : -1;
}

const tg_op tg__op_max_pool2d = {
    .name = "max_pool2d", .doc = "y = max of x over each 2-d window", .arity = 1,
    .shape = pool_shape, .forward = max_fwd, .backward = max_bwd, .cost = TG_COST_MEMORY_BOUND,
    .sample = max_sample,
};

/* ---- avg_pool2d */
static tg_tensor *avg_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *x = in[0];
    tg_pool2d_geom g = pool_geom(ctx->attrs, x->shape[0], x->shape[1], x->shape[2], x->shape[3]);
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    TG_KERNEL(tg_avg_pool2d_fn, TG_K_AVG_POOL2D, x)(&g, tg__tensor_ptr(x), tg__tensor_ptr(y));
    return y;
}

static tg_status avg_bwd_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                               tg_spec *out)
{
    return pool_bwd_spec(op, a, in[0], 1, out);
}

static tg_tensor *avg_bwd_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_spec *os = ctx->out_spec;
    tg_pool2d_geom g = pool_geom(ctx->attrs, os->shape[0], os->shape[1], os->shape[2], os->shape[3]);
    tg_tensor *gx = tg_op_ctx_new_output(ctx);
    if (!gx) return NULL;
    TG_KERNEL(tg_avg_pool2d_grad_fn, TG_K_AVG_POOL2D_GRAD, in[0])(&g, tg__tensor_ptr(in[0]),
                                                                  tg__tensor_ptr(gx));
    return gx;
}

static tg_status avg_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    tg_op_attrs a = bwd_attrs(ctx);
    gin[0] = tg__call1(&tg__op_avg_pool2d_backward, g, &a);
    return gin[0] ? TG_OK : tg_last_error();
}

/* Cases: as for max, plus padding excluded from the divisor. */
static const struct pool_case avg_cases[] = {
    {{1, 2, 4, 4}, {2, 2, 2, 2, 0, 0}, 0},
    {{2, 1, 5, 5}, {3, 3, 2, 2, 1, 1}, 0},
    {{1, 2, 4, 5}, {3, 2, 1, 2, 1, 0}, 0},
    {{1, 1, 5, 4}, {3, 3, 2, 1, 1, 1}, 1},
};

/* Linear in gy, the adjoint of avg_pool2d: its own adjoint is avg_pool2d
 * with the same attrs. */
static tg_status avg_bwd_bwd(tg_op_ctx *ctx, tg_tensor *gg, tg_tensor **gin)
{
    tg_op_attrs a = *ctx->attrs;
    a.nints = 6;
    a.ints[6] = a.ints[7] = 0;
    gin[0] = tg__call1(&tg__op_avg_pool2d, gg, &a);
    return gin[0] ? TG_OK : tg_last_error();
}

static int avg_bwd_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    if (k >= (int)(sizeof avg_cases / sizeof avg_cases[0])) return 0;
    in[0] = bwd_case(rng, &avg_cases[k], a);
    return in[0] ? 1 : -1;
}

const tg_op tg__op_avg_pool2d_backward = {
    .name = "avg_pool2d_backward", .doc = "gx = gy spread evenly over each window", .arity = 1,
    .shape = avg_bwd_shape, .forward = avg_bwd_fwd, .backward = avg_bwd_bwd,
    .cost = TG_COST_MEMORY_BOUND, .sample = avg_bwd_sample,
};

static int avg_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    if (k >= (int)(sizeof avg_cases / sizeof avg_cases[0])) return 0;
    a->nints = 6;
    memcpy(a->ints, avg_cases[k].ints, sizeof avg_cases[k].ints);
    a->flag = avg_cases[k].flag;
    in[0] = tg__sample_uniform(rng, 4, avg_cases[k].x, -1.0, 1.0);
    return in[0] ? 1 : -1;
}

const tg_op tg__op_avg_pool2d = {
    .name = "avg_pool2d", .doc = "y = mean of x over each 2-d window", .arity = 1,
    .shape = pool_shape, .forward = avg_fwd, .backward = avg_bwd, .cost = TG_COST_MEMORY_BOUND,
    .sample = avg_sample,
};

/* ---- public wrappers */
static tg_tensor *pool_call(const tg_op *op, tg_tensor *x, const tg_pool2d_opts *o)
{
    if (!x) {
        tg__err_null(op->name, 1);
        return NULL;
    }
    if (!o) {
        tg__err(TG_ERR_NULL, "bad argument #2 to '%s' (NULL options; the kernel size is "
                             "required)", op->name);
        return NULL;
    }
    tg_op_attrs a = {.nints = 6, .flag = o->exclude_pad};
    for (int i = 0; i < 2; i++) {
        a.ints[i] = o->kernel[i];
        a.ints[2 + i] = o->stride[i] ? o->stride[i] : o->kernel[i];
        a.ints[4 + i] = o->padding[i];
    }
    return tg__call1(op, x, &a);
}

tg_tensor *tg_max_pool2d(tg_tensor *x, const tg_pool2d_opts *opts)
{
    return pool_call(&tg__op_max_pool2d, x, opts);
}

tg_tensor *tg_avg_pool2d(tg_tensor *x, const tg_pool2d_opts *opts)
{
    return pool_call(&tg__op_avg_pool2d, x, opts);
}
