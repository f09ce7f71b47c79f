/* Reductions: sum and mean (all dims or a list, keepdim), max and min
 * along a dim (gradient to the first maximum / minimum, through one
 * scatter op max_dim_backward), argmax (non-differentiable), logsumexp
 * along a dim (stable), and var / std over a list of dims with a
 * correction (0: population, 1: unbiased / Bessel).
 *
 * Attrs: sum, mean, var, std: ints[0..nints) the dims (nints == 0: all),
 * flag keepdim; var / std: scalar the correction. max_dim, min_dim,
 * argmax, logsumexp: ints[0] the dim, flag keepdim. Backward functions are
 * tg_* ops, and the scatter's own backward is a gather, so every
 * derivative order works. */
#include <string.h>

#include "ops/helpers.h"

/* Output spec of a reduction over the dims in mask. */
static void reduced_spec(const tg_tensor *x, const bool *mask, bool keep, tg_spec *out)
{
    out->dtype = x->dtype;
    out->ndim = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (!mask[d])
            out->shape[out->ndim++] = x->shape[d];
        else if (keep)
            out->shape[out->ndim++] = 1;
    }
}

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
    reduced_spec(x, mask, a->flag, out);
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
    tg__run_sum(&r, x, tg__tensor_ptr(y));
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

/* max_dim / min_dim forward: the values, and the first arg-extremum's
 * index kept for backward (extra slot 0). */
static tg_tensor *dim_select_fwd(tg_op_ctx *ctx, tg_tensor *const *in, tg_kernel_id kid)
{
    tg_tensor *x = in[0];
    int64_t outer, n, inner;
    tg__split_dim(x->ndim, x->shape, tg__dim_attr(ctx->attrs, x->ndim), &outer, &n, &inner);
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    tg_tensor *idx = y ? tg__tensor_empty(TG_I64, ctx->out_spec->ndim, ctx->out_spec->shape,
                                          x->backend) : NULL;
    if (!idx) {
        tg_tensor_release(y);
        return NULL;
    }
    TG_KERNEL(tg_dim_max_fn, kid, x)(outer, n, inner, tg__tensor_ptr(x), tg__tensor_ptr(y),
                                     tg__tensor_ptr(idx));
    if (ctx->needs) tg_op_ctx_save(ctx, idx);
    tg_tensor_release(idx);
    return y;
}

static tg_tensor *max_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    return dim_select_fwd(ctx, in, TG_K_MAX_DIM);
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
    /* The target shape and dim come from attrs, unchecked through
     * tg_op_call (fuzz/fuzz_ops): the indices must fill it outside dim. */
    if (tg__check_shape(op->name, a->nints, a->ints)) return TG_ERR_SHAPE;
    int64_t outer, n, inner;
    if (a->nints < 1 || a->target < 0 || a->target >= a->nints)
        return tg__err(TG_ERR_INVALID, "bad argument to '%s' (dim %d of a %d-d target)", op->name,
                       a->target, a->nints);
    tg__split_dim(a->nints, a->ints, a->target, &outer, &n, &inner);
    if (outer * inner != in[0]->numel)
        return tg__err(TG_ERR_SHAPE, "bad argument #1 to '%s' (%lld indices for %lld positions "
                                     "outside dim %d)", op->name, (long long)in[0]->numel,
                       (long long)(outer * inner), a->target);
    out->dtype = in[1]->dtype;
    out->ndim = a->nints;
    memcpy(out->shape, a->ints, sizeof out->shape);
    return TG_OK;
}
static tg_tensor *max_bwd_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    int64_t outer, n, inner;
    tg__split_dim(ctx->out_spec->ndim, ctx->out_spec->shape, ctx->attrs->target, &outer, &n, &inner);
    const int64_t *idx = tg__tensor_ptr(in[0]);
    for (int64_t i = 0; i < in[0]->numel; i++)
        if (idx[i] < 0 || idx[i] >= n) {
            tg__err(TG_ERR_INVALID, "bad argument #1 to '%s' (index %lld at position %lld outside "
                                    "[0, %lld))", ctx->op->name, (long long)idx[i], (long long)i,
                    (long long)n);
            return NULL;
        }
    tg_tensor *gx = tg_op_ctx_new_output(ctx);
    if (!gx) return NULL;
    TG_KERNEL(tg_dim_scatter_fn, TG_K_MAX_DIM_GRAD, in[1])(outer, n, inner, tg__tensor_ptr(in[0]),
                                                           tg__tensor_ptr(in[1]),
                                                           tg__tensor_ptr(gx));
    return gx;
}
/* Linear in gy: the adjoint of the scatter to idx along dim is the gather
 * of gg at idx (in keepdim form) along dim. The indices are constants. */
static tg_status max_bwd_bwd(tg_op_ctx *ctx, tg_tensor *gg, tg_tensor **gin)
{
    const tg_spec *ys = tg_op_ctx_input_spec(ctx, 1);
    const tg_op_attrs *a = ctx->attrs;
    int64_t ks[TG_MAX_DIMS];
    if (!tg_op_ctx_needs_grad(ctx, 1)) return TG_OK;
    memcpy(ks, a->ints, sizeof ks);
    ks[a->target] = 1;
    tg_tensor *idx = tg_reshape(tg_op_ctx_input(ctx, 0), (int)a->nints, ks);
    gin[1] = tg_reshape(tg_gather(gg, (int)a->target, idx), ys->ndim, ys->shape);
    return gin[1] ? TG_OK : tg_last_error();
}

/* Cases: x shape, dim, keepdim; indices random along dim (any index works,
 * the op is linear in gy). */
static int max_bwd_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const struct { int n; int64_t x[3]; int dim; bool keep; } c[] = {
        {2, {4, 5}, 1, false}, {2, {4, 5}, 0, true}, {3, {2, 3, 4}, 1, false}, {1, {5}, 0, false},
    };
    if (k >= 4) return 0;
    int64_t ys[TG_MAX_DIMS];
    int ny = 0;
    for (int d = 0; d < c[k].n; d++)
        if (d != c[k].dim || c[k].keep) ys[ny++] = d == c[k].dim ? 1 : c[k].x[d];
    a->nints = c[k].n;
    memcpy(a->ints, c[k].x, sizeof c[k].x);
    a->target = c[k].dim;
    in[0] = tg__sample_index(rng, ny, ys, c[k].x[c[k].dim]);
    in[1] = tg__sample_uniform(rng, ny, ys, -1.0, 1.0);
    return (in[0] && in[1]) ? 2 : -1;
}

const tg_op tg__op_max_dim_backward = {
    .name = "max_dim_backward", .doc = "gx = gy scattered to the argmax", .arity = 2,
    .shape = max_bwd_shape, .forward = max_bwd_fwd, .backward = max_bwd_bwd,
    .cost = TG_COST_MEMORY_BOUND, .saves = TG_SAVE_INPUT(0), .sample = max_bwd_sample,
};

/* The backward that scatters the gradient to the saved indices (extra
 * slot 0; attrs.ints[0] the dim), shared by max_dim and min_dim. */
static tg_status dim_select_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    const tg_spec *x = tg_op_ctx_input_spec(ctx, 0);
    tg_op_attrs a = {.nints = x->ndim};
    memcpy(a.ints, x->shape, sizeof a.ints);
    a.target = (int)(ctx->attrs->ints[0] < 0 ? ctx->attrs->ints[0] + x->ndim : ctx->attrs->ints[0]);
    gin[0] = tg__call2(&tg__op_max_dim_backward, tg_op_ctx_saved(ctx, 0), g, &a);
    return gin[0] ? TG_OK : tg_last_error();
}

/* Cases of max_dim and min_dim: distinct values, no ties. */
static int dim_select_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
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
    .forward = max_fwd, .backward = dim_select_bwd, .cost = TG_COST_MEMORY_BOUND,
    .sample = dim_select_sample,
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

/* g reshaped to the keepdim form of a reduction of spec x over mask. */
static tg_tensor *keep_form(tg_tensor *g, const tg_spec *x, const bool *mask)
{
    int64_t ks[TG_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) ks[d] = mask[d] ? 1 : x->shape[d];
    return tg_reshape(g, x->ndim, ks);
}

/* ---- min_dim */
static tg_status one_dim_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                               tg_spec *out, bool nonempty)
{
    const tg_tensor *x = in[0];
    bool mask[TG_MAX_DIMS] = {0};
    int d;
    if (tg__need_float(op, 1, x)) return TG_ERR_DTYPE;
    if (nonempty && (x->ndim == 0 || x->numel == 0))
        return tg__err(TG_ERR_SHAPE, "bad argument #1 to '%s' (needs a non-empty tensor with at "
                                     "least 1 dim)", op->name);
    if (tg__norm_dim(op, 2, a->ints[0], x->ndim, &d)) return TG_ERR_INVALID;
    if (x->ndim) mask[d] = true;
    reduced_spec(x, mask, a->flag, out);
    return TG_OK;
}

static tg_status min_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                           tg_spec *out)
{
    return one_dim_shape(op, a, in, out, true);
}

static tg_tensor *min_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    return dim_select_fwd(ctx, in, TG_K_MIN_DIM);
}

const tg_op tg__op_min_dim = {
    .name = "min_dim", .doc = "y = min of x along dim", .arity = 1, .shape = min_shape,
    .forward = min_fwd, .backward = dim_select_bwd, .cost = TG_COST_MEMORY_BOUND,
    .sample = dim_select_sample,
};

/* ---- logsumexp: y = m + log sum_i e^(x_i - m), m = max_i x_i. An empty
 * dim gives -inf. */
static tg_status lse_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                           tg_spec *out)
{
    return one_dim_shape(op, a, in, out, false);
}

static tg_tensor *lse_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_tensor *x = in[0];
    int64_t outer, n, inner;
    tg__split_dim(x->ndim, x->shape, tg__dim_attr(ctx->attrs, x->ndim), &outer, &n, &inner);
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    TG_KERNEL(tg_dim_fn, TG_K_LOGSUMEXP, x)(outer, n, inner, tg__tensor_ptr(x), tg__tensor_ptr(y));
    return y;
}

/* gx = g * e^(x - y) = g * softmax(x), in keepdim form. */
static tg_status lse_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    const tg_spec *xs = tg_op_ctx_input_spec(ctx, 0);
    bool mask[TG_MAX_DIMS] = {0};
    if (xs->ndim) mask[tg__dim_attr(ctx->attrs, xs->ndim)] = true;
    tg_tensor *y = keep_form(tg_op_ctx_output(ctx), xs, mask);
    tg_tensor *p = tg_exp(tg_sub(tg_op_ctx_input(ctx, 0), y));
    gin[0] = tg_mul(p, keep_form(g, xs, mask));
    return gin[0] ? TG_OK : tg_last_error();
}

static int lse_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const struct { int n; int64_t s[3]; int dim; int keep; } c[] = {
        {2, {3, 5}, -1, 0}, {2, {3, 5}, 0, 1}, {3, {2, 3, 4}, 1, 0}, {0, {0}, 0, 0},
    };
    if (k >= 4) return 0;
    a->nints = 1;
    a->ints[0] = c[k].dim;
    a->flag = c[k].keep;
    in[0] = tg__sample_uniform(rng, c[k].n, c[k].s, -3.0, 3.0);
    return in[0] ? 1 : -1;
}

const tg_op tg__op_logsumexp = {
    .name = "logsumexp", .doc = "y = log sum_i e^x_i along dim (max subtracted)", .arity = 1,
    .shape = lse_shape, .forward = lse_fwd, .backward = lse_bwd, .cost = TG_COST_MEMORY_BOUND,
    .saves = TG_SAVE_INPUT(0) | TG_SAVE_OUTPUT, .sample = lse_sample,
};

/* ---- var / std over dims: var = sum (x - mean)^2 / max(0, N - correction).
 * Two passes (mean, then squared deviations) for accuracy. */
static tg_status dims_mask(const tg_op *op, const tg_op_attrs *a, int ndim, bool *mask)
{
    memset(mask, 0, TG_MAX_DIMS * sizeof *mask);
    if (a->nints == 0) {
        for (int d = 0; d < ndim; d++) mask[d] = true;
        return TG_OK;
    }
    for (int i = 0; i < a->nints; i++) {
        int d;
        if (tg__norm_dim(op, 2, a->ints[i], ndim, &d)) return TG_ERR_INVALID;
        if (ndim == 0) continue;
        if (mask[d])
            return tg__err(TG_ERR_INVALID, "bad argument #2 to '%s' (dim %d listed twice)",
                           op->name, d);
        mask[d] = true;
    }
    return TG_OK;
}

static tg_status var_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                           tg_spec *out)
{
    bool mask[TG_MAX_DIMS];
    if (tg__need_float(op, 1, in[0])) return TG_ERR_DTYPE;
    if (dims_mask(op, a, in[0]->ndim, mask)) return TG_ERR_INVALID;
    reduced_spec(in[0], mask, a->flag, out);
    return TG_OK;
}

/* Number of elements reduced into each output, and 1 / max(0, N - c). */
static int64_t var_count(const bool *mask, const tg_spec *x)
{
    int64_t n = 1;
    for (int d = 0; d < x->ndim; d++)
        if (mask[d]) n *= x->shape[d];
    return n;
}
static double var_scale(int64_t n, double correction)
{
    double div = (double)n - correction;
    return 1.0 / (div > 0.0 ? div : 0.0); /* inf: PyTorch's inf/nan for N <= correction */
}

static tg_tensor *var_like_fwd(tg_op_ctx *ctx, tg_tensor *const *in, bool take_sqrt)
{
    tg_tensor *x = in[0];
    tg_reduce r = {.ndim = x->ndim};
    memcpy(r.shape, x->shape, sizeof r.shape);
    dims_mask(ctx->op, ctx->attrs, x->ndim, r.reduce);
    int64_t n = var_count(r.reduce, ctx->in_spec);
    tg_spec ks = {.dtype = x->dtype, .ndim = x->ndim};
    for (int d = 0; d < x->ndim; d++) ks.shape[d] = r.reduce[d] ? 1 : x->shape[d];
    tg_tensor *mean = tg__tensor_empty_spec(&ks, x->backend);
    tg_tensor *dev = mean ? tg__tensor_empty(x->dtype, x->ndim, x->shape, x->backend) : NULL;
    tg_tensor *y = dev ? tg_op_ctx_new_output(ctx) : NULL;
    if (!y) {
        tg_tensor_release(mean);
        tg_tensor_release(dev);
        return NULL;
    }
    tg__run_sum(&r, x, tg__tensor_ptr(mean));
    TG_KERNEL(tg_unary_fn, TG_K_MUL_SCALAR, x)(mean->numel, tg__tensor_ptr(mean),
                                               tg__tensor_ptr(mean), n ? 1.0 / (double)n : 0.0);
    tg_spec xs;
    tg__spec_of(x, &xs);
    tg_bcast bc;
    tg__bcast_desc(&xs, x, mean, &bc);
    TG_KERNEL(tg_binary_fn, TG_K_SUB, x)(&bc, tg__tensor_ptr(x), tg__tensor_ptr(mean),
                                         tg__tensor_ptr(dev));
    tg__bcast_desc(&xs, dev, dev, &bc);
    TG_KERNEL(tg_binary_fn, TG_K_MUL, x)(&bc, tg__tensor_ptr(dev), tg__tensor_ptr(dev),
                                         tg__tensor_ptr(dev));
    tg__run_sum(&r, dev, tg__tensor_ptr(y));
    TG_KERNEL(tg_unary_fn, TG_K_MUL_SCALAR, x)(y->numel, tg__tensor_ptr(y), tg__tensor_ptr(y),
                                               var_scale(n, ctx->attrs->scalar));
    if (take_sqrt)
        TG_KERNEL(tg_unary_fn, TG_K_SQRT, x)(y->numel, tg__tensor_ptr(y), tg__tensor_ptr(y), 0.0);
    tg_tensor_release(mean);
    tg_tensor_release(dev);
    return y;
}

/* d var / dx = 2 (x - mean) / (N - c); d std / dx = (x - mean) / ((N - c) std). */
static tg_status var_like_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin, bool is_std)
{
    const tg_spec *xs = tg_op_ctx_input_spec(ctx, 0);
    tg_tensor *x = tg_op_ctx_input(ctx, 0);
    bool mask[TG_MAX_DIMS];
    dims_mask(ctx->op, ctx->attrs, xs->ndim, mask);
    int64_t n = var_count(mask, xs);
    double s = var_scale(n, ctx->attrs->scalar);
    tg_op_attrs ma = *ctx->attrs;
    ma.flag = 1;
    tg_tensor *dev = tg_sub(x, tg__call1(&tg__op_mean, x, &ma));
    tg_tensor *gk = keep_form(g, xs, mask);
    if (is_std)
        gin[0] = tg_mul(tg_mul_scalar(dev, s), tg_div(gk, keep_form(tg_op_ctx_output(ctx), xs, mask)));
    else
        gin[0] = tg_mul(tg_mul_scalar(dev, 2.0 * s), gk);
    return gin[0] ? TG_OK : tg_last_error();
}

static int var_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const int64_t shape[3] = {2, 3, 4};
    switch (k) {
    case 0: a->scalar = 1.0; break;                                              /* all */
    case 1: a->nints = 1; a->ints[0] = 1; a->scalar = 1.0; break;
    case 2: a->nints = 2; a->ints[0] = 0; a->ints[1] = 2; a->scalar = 0.0; break;
    case 3: a->nints = 1; a->ints[0] = -1; a->flag = 1; a->scalar = 1.0; break;
    case 4: a->nints = 2; a->ints[0] = 0; a->ints[1] = 1; a->flag = 1; a->scalar = 0.0; break;
    default: return 0;
    }
    in[0] = tg__sample_uniform(rng, 3, shape, -1.0, 1.0);
    return in[0] ? 1 : -1;
}

static tg_tensor *var_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    return var_like_fwd(ctx, in, false);
}
static tg_status var_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    return var_like_bwd(ctx, g, gin, false);
}
static tg_tensor *std_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    return var_like_fwd(ctx, in, true);
}
static tg_status std_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    return var_like_bwd(ctx, g, gin, true);
}

const tg_op tg__op_var = {
    .name = "var", .doc = "y = sum over dims (x - mean)^2 / (N - correction)", .arity = 1,
    .shape = var_shape, .forward = var_fwd, .backward = var_bwd, .cost = TG_COST_MEMORY_BOUND,
    .saves = TG_SAVE_INPUT(0), .sample = var_sample,
};
const tg_op tg__op_std = {
    .name = "std", .doc = "y = sqrt(var over dims, with correction)", .arity = 1,
    .shape = var_shape, .forward = std_fwd, .backward = std_bwd, .cost = TG_COST_MEMORY_BOUND,
    .saves = TG_SAVE_INPUT(0) | TG_SAVE_OUTPUT, .sample = var_sample,
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
        /* An explicit empty list reduces nothing: a copy with the same
         * shape, after the op's own dtype check (so errors name it). */
        if (tg__need_float(op, 1, x)) return NULL;
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

tg_tensor *tg_min_dim(tg_tensor *x, int dim, bool keepdim)
{
    tg_op_attrs a = {.nints = 1, .ints = {dim}, .flag = keepdim};
    return tg__call1(&tg__op_min_dim, x, &a);
}

tg_tensor *tg_logsumexp(tg_tensor *x, int dim, bool keepdim)
{
    tg_op_attrs a = {.nints = 1, .ints = {dim}, .flag = keepdim};
    return tg__call1(&tg__op_logsumexp, x, &a);
}

static tg_tensor *call_var(const tg_op *op, tg_tensor *x, int ndims, const int *dims,
                           int correction, bool keepdim)
{
    tg_op_attrs a = {.flag = keepdim, .scalar = (double)correction};
    if (!x) return tg__call1(op, x, &a); /* keeps the pending error */
    if (ndims < 0 || ndims > TG_MAX_DIMS || (ndims > 0 && !dims)) {
        tg__err(TG_ERR_INVALID, "bad argument #2 to '%s' (%d dims)", op->name, ndims);
        return NULL;
    }
    if (correction < 0) {
        tg__err(TG_ERR_INVALID, "bad argument #4 to '%s' (correction %d < 0)", op->name,
                correction);
        return NULL;
    }
    a.nints = ndims;
    for (int i = 0; i < ndims; i++) a.ints[i] = dims[i];
    return tg__call1(op, x, &a);
}

tg_tensor *tg_var(tg_tensor *x, int ndims, const int *dims, int correction, bool keepdim)
{
    return call_var(&tg__op_var, x, ndims, dims, correction, keepdim);
}

tg_tensor *tg_std(tg_tensor *x, int ndims, const int *dims, int correction, bool keepdim)
{
    return call_var(&tg__op_std, x, ndims, dims, correction, keepdim);
}
