/* Reductions: sum and mean (all dims or a list, keepdim), max along a dim
 * (gradient to the first maximum) and argmax (non-differentiable).
 * attrs.ints lists the reduced dims (nints == 0: all), attrs.flag keepdim. */
#include <string.h>

#include "ops/sample.h"

/* Normalises attrs' dims into a mask; fills the output spec. */
static tg_status reduce_spec(const tg_op *op, const tg_op_attrs *a, const tg_tensor *x,
                             bool *mask, tg_spec *out)
{
    memset(mask, 0, TG_MAX_DIMS * sizeof *mask);
    if (a->nints == 0) {
        for (int d = 0; d < x->ndim; d++) mask[d] = true;
    } else {
        for (int i = 0; i < a->nints; i++) {
            int d;
            if (tg__norm_dim(op, 2, a->ints[i], x->ndim, &d)) return TG_ERR_INVALID;
            if (mask[d])
                return tg__err(TG_ERR_INVALID, "bad argument #2 to '%s' (dim %d listed twice)",
                               op->name, d);
            mask[d] = true;
        }
    }
    out->dtype = x->dtype;
    out->ndim = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (!mask[d])
            out->shape[out->ndim++] = x->shape[d];
        else if (a->flag)
            out->shape[out->ndim++] = 1;
    }
    return TG_OK;
}

static tg_status sum_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                           tg_spec *out)
{
    bool mask[TG_MAX_DIMS];
    if (tg__need_float(op, 1, in[0])) return TG_ERR_DTYPE;
    return reduce_spec(op, a, in[0], mask, out);
}

static int64_t reduced_count(const tg_op_attrs *a, const tg_spec *x)
{
    int64_t n = 1;
    if (a->nints == 0) return tg__numel(x->ndim, x->shape);
    for (int i = 0; i < a->nints; i++) {
        int64_t d = a->ints[i] < 0 ? a->ints[i] + x->ndim : a->ints[i];
        n *= x->shape[d];
    }
    return n;
}

static tg_tensor *sum_like_fwd(tg_op_ctx *ctx, tg_tensor *const *in, double scale)
{
    tg_reduce r;
    tg_spec ignored;
    tg_tensor *x = in[0];
    r.ndim = x->ndim;
    memcpy(r.shape, x->shape, sizeof r.shape);
    reduce_spec(ctx->op, ctx->attrs, x, r.reduce, &ignored);
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    TG_KERNEL(tg_reduce_fn, TG_K_REDUCE_SUM, x)(&r, tg__tensor_ptr(x), tg__tensor_ptr(y));
    if (scale != 1.0)
        TG_KERNEL(tg_unary_fn, TG_K_MUL_SCALAR, y)(y->numel, tg__tensor_ptr(y), tg__tensor_ptr(y),
                                                   scale);
    return y;
}

/* Gradient of a reduction: g reshaped to keepdim form, broadcast back. */
static tg_tensor *expand_back(tg_op_ctx *ctx, tg_tensor *g)
{
    const tg_spec *x = tg_op_ctx_input_spec(ctx, 0);
    int64_t kshape[TG_MAX_DIMS];
    bool mask[TG_MAX_DIMS];
    tg_spec ignored;
    tg_op_attrs keep = *ctx->attrs;
    keep.flag = 1;
    tg_tensor fake = {.ndim = x->ndim, .dtype = x->dtype};
    memcpy(fake.shape, x->shape, sizeof fake.shape);
    reduce_spec(ctx->op, &keep, &fake, mask, &ignored);
    for (int d = 0; d < x->ndim; d++) kshape[d] = mask[d] ? 1 : x->shape[d];
    return tg_expand(tg_reshape(g, x->ndim, kshape), x->ndim, x->shape);
}

static tg_tensor *sum_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    return sum_like_fwd(ctx, in, 1.0);
}
static tg_status sum_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    gin[0] = expand_back(ctx, g);
    return gin[0] ? TG_OK : tg_last_error();
}

static tg_tensor *mean_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    int64_t n = reduced_count(ctx->attrs, &ctx->in_spec[0]);
    return sum_like_fwd(ctx, in, n ? 1.0 / (double)n : 0.0);
}
static tg_status mean_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    int64_t n = reduced_count(ctx->attrs, tg_op_ctx_input_spec(ctx, 0));
    gin[0] = expand_back(ctx, tg_mul_scalar(g, n ? 1.0 / (double)n : 0.0));
    return gin[0] ? TG_OK : tg_last_error();
}

/* Cases: all dims, one dim, two dims, keepdim, negative dims. */
static int reduce_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const int64_t shape[3] = {2, 3, 4};
    switch (k) {
    case 0: break;
    case 1: a->nints = 1; a->ints[0] = 1; break;
    case 2: a->nints = 2; a->ints[0] = 0; a->ints[1] = 2; break;
    case 3: a->nints = 1; a->ints[0] = -1; a->flag = 1; break;
    case 4: a->nints = 2; a->ints[0] = 0; a->ints[1] = 1; a->flag = 1; break;
    default: return 0;
    }
    in[0] = tg__sample_uniform(rng, 3, shape, -1.0, 1.0);
    return in[0] ? 1 : -1;
}

const tg_op tg__op_sum = {
    .name = "sum", .doc = "y = sum over dims of x", .arity = 1, .shape = sum_shape,
    .forward = sum_fwd, .backward = sum_bwd, .cost = TG_COST_MEMORY_BOUND, .sample = reduce_sample,
};
const tg_op tg__op_mean = {
    .name = "mean", .doc = "y = mean over dims of x", .arity = 1, .shape = sum_shape,
    .forward = mean_fwd, .backward = mean_bwd, .cost = TG_COST_MEMORY_BOUND,
    .sample = reduce_sample,
};

/* ---- max along one dim. attrs.ints[0] dim, attrs.flag keepdim. */
static tg_status dim_shape(const tg_op *op, const tg_op_attrs *a, const tg_tensor *x, int *dim,
                           tg_spec *out, tg_dtype dt)
{
    if (x->ndim == 0 || x->numel == 0)
        return tg__err(TG_ERR_SHAPE, "bad argument #1 to '%s' (needs a non-empty tensor with at "
                                     "least 1 dim)", op->name);
    if (tg__norm_dim(op, 2, a->ints[0], x->ndim, dim)) return TG_ERR_INVALID;
    out->dtype = dt;
    out->ndim = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (d != *dim)
            out->shape[out->ndim++] = x->shape[d];
        else if (a->flag)
            out->shape[out->ndim++] = 1;
    }
    return TG_OK;
}

static tg_status max_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                           tg_spec *out)
{
    int dim;
    if (tg__need_float(op, 1, in[0])) return TG_ERR_DTYPE;
    return dim_shape(op, a, in[0], &dim, out, in[0]->dtype);
}

static tg_tensor *max_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_tensor *x = in[0];
    int dim = (int)(ctx->attrs->ints[0] < 0 ? ctx->attrs->ints[0] + x->ndim : ctx->attrs->ints[0]);
    int64_t outer, n, inner;
    tg__split_dim(x->ndim, x->shape, dim, &outer, &n, &inner);
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    tg_tensor *idx = y ? tg__tensor_empty(TG_I64, ctx->out_spec->ndim, ctx->out_spec->shape,
                                          x->backend) : NULL;
    if (!idx) {
        tg_tensor_release(y);
        return NULL;
    }
    TG_KERNEL(tg_dim_max_fn, TG_K_MAX_DIM, x)(outer, n, inner, tg__tensor_ptr(x),
                                              tg__tensor_ptr(y), tg__tensor_ptr(idx));
    if (ctx->needs) tg_op_ctx_save(ctx, idx);
    tg_tensor_release(idx);
    return y;
}

/* max_dim_backward(idx, gy): scatter gy to the argmax positions.
 * attrs: ints = input shape, target = dim. */
static tg_status max_bwd_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                               tg_spec *out)
{
    if (in[0]->dtype != TG_I64)
        return tg__err(TG_ERR_DTYPE, "bad argument #1 to '%s' (indices must be i64)", op->name);
    if (tg__need_float(op, 2, in[1])) return TG_ERR_DTYPE;
    if (in[0]->numel != in[1]->numel)
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (gradient and indices differ in "
                                     "size)", op->name);
    out->dtype = in[1]->dtype;
    out->ndim = a->nints;
    memcpy(out->shape, a->ints, sizeof out->shape);
    return TG_OK;
}
static tg_tensor *max_bwd_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    int64_t outer, n, inner;
    tg__split_dim(ctx->out_spec->ndim, ctx->out_spec->shape, ctx->attrs->target, &outer, &n, &inner);
    tg_tensor *gx = tg_op_ctx_new_output(ctx);
    if (!gx) return NULL;
    TG_KERNEL(tg_dim_scatter_fn, TG_K_MAX_DIM_GRAD, in[1])(outer, n, inner, tg__tensor_ptr(in[0]),
                                                           tg__tensor_ptr(in[1]),
                                                           tg__tensor_ptr(gx));
    return gx;
}
const tg_op tg__op_max_dim_backward = {
    .name = "max_dim_backward", .doc = "gx = gy scattered to the argmax", .arity = 2,
    .shape = max_bwd_shape, .forward = max_bwd_fwd, .cost = TG_COST_MEMORY_BOUND,
};

tg_status tg__dim_select_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    const tg_spec *x = tg_op_ctx_input_spec(ctx, 0);
    tg_op_attrs a = {.nints = x->ndim};
    memcpy(a.ints, x->shape, sizeof a.ints);
    a.target = (int)(ctx->attrs->ints[0] < 0 ? ctx->attrs->ints[0] + x->ndim : ctx->attrs->ints[0]);
    gin[0] = tg__call2(&tg__op_max_dim_backward, tg_op_ctx_saved(ctx, 0), g, &a);
    return gin[0] ? TG_OK : tg_last_error();
}

int tg__dim_select_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const int64_t s2[2] = {4, 5}, s3[3] = {2, 3, 4};
    switch (k) {
    case 0: a->ints[0] = 1; in[0] = tg__sample_distinct(rng, 2, s2); break;
    case 1: a->ints[0] = 0; a->flag = 1; in[0] = tg__sample_distinct(rng, 2, s2); break;
    case 2: a->ints[0] = -2; in[0] = tg__sample_distinct(rng, 3, s3); break;
    default: return 0;
    }
    a->nints = 1;
    return in[0] ? 1 : -1;
}

const tg_op tg__op_max_dim = {
    .name = "max_dim", .doc = "y = max of x along dim", .arity = 1, .shape = max_shape,
    .forward = max_fwd, .backward = tg__dim_select_bwd, .cost = TG_COST_MEMORY_BOUND,
    .sample = tg__dim_select_sample,
};

static tg_status argmax_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                              tg_spec *out)
{
    int dim;
    if (tg__need_float(op, 1, in[0])) return TG_ERR_DTYPE;
    return dim_shape(op, a, in[0], &dim, out, TG_I64);
}
static tg_tensor *argmax_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_tensor *x = in[0];
    int dim = (int)(ctx->attrs->ints[0] < 0 ? ctx->attrs->ints[0] + x->ndim : ctx->attrs->ints[0]);
    int64_t outer, n, inner;
    tg__split_dim(x->ndim, x->shape, dim, &outer, &n, &inner);
    tg_tensor *idx = tg_op_ctx_new_output(ctx);
    if (!idx) return NULL;
    TG_KERNEL(tg_dim_max_fn, TG_K_MAX_DIM, x)(outer, n, inner, tg__tensor_ptr(x), NULL,
                                              tg__tensor_ptr(idx));
    return idx;
}
const tg_op tg__op_argmax = {
    .name = "argmax", .doc = "y = index of the first max along dim (i64)", .arity = 1,
    .shape = argmax_shape, .forward = argmax_fwd, .nondifferentiable = true,
    .cost = TG_COST_MEMORY_BOUND,
};

/* ---- public wrappers */
static tg_tensor *call_dims(const tg_op *op, tg_tensor *x, int ndims, const int *dims, bool keep)
{
    tg_op_attrs a = {.flag = keep};
    if (ndims < 0 || ndims > TG_MAX_DIMS || (ndims > 0 && !dims)) {
        tg__err(TG_ERR_INVALID, "bad argument #2 to '%s' (%d dims)", op->name, ndims);
        return NULL;
    }
    if (ndims == 0 && x) {
        /* An explicit empty list reduces nothing: a copy with the same shape. */
        return tg_mul_scalar(x, 1.0);
    }
    a.nints = ndims;
    for (int i = 0; i < ndims; i++) a.ints[i] = dims[i];
    return tg__call1(op, x, &a);
}

tg_tensor *tg_sum(tg_tensor *x)
{
    return tg__call1(&tg__op_sum, x, NULL);
}
tg_tensor *tg_mean(tg_tensor *x)
{
    return tg__call1(&tg__op_mean, x, NULL);
}
tg_tensor *tg_sum_dims(tg_tensor *x, int ndims, const int *dims, bool keepdim)
{
    return call_dims(&tg__op_sum, x, ndims, dims, keepdim);
}
tg_tensor *tg_mean_dims(tg_tensor *x, int ndims, const int *dims, bool keepdim)
{
    return call_dims(&tg__op_mean, x, ndims, dims, keepdim);
}
tg_tensor *tg_max_dim(tg_tensor *x, int dim, bool keepdim)
{
    tg_op_attrs a = {.nints = 1, .ints = {dim}, .flag = keepdim};
    return tg__call1(&tg__op_max_dim, x, &a);
}
tg_tensor *tg_argmax(tg_tensor *x, int dim, bool keepdim)
{
    tg_op_attrs a = {.nints = 1, .ints = {dim}, .flag = keepdim};
    return tg__call1(&tg__op_argmax, x, &a);
}
