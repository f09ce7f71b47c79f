/* Indexing and joining: concat, narrow (a view), index_select, gather and
 * embedding, with the scatter-add adjoints index_select_backward and
 * gather_backward.
 *
 * concat is one binary op ("concat"(a, b) along attrs.ints[0]); tg_concat
 * joins n tensors by applying it over a balanced tree (log2 n levels of
 * copies), so TG_OP_MAX_INPUTS stays 4. narrow's backward pads the
 * gradient with zeros through concat, and concat's backward narrows: both
 * stay differentiable. The scatter-add ops are differentiable too (their
 * adjoint is the select/gather again), so double backward works.
 *
 * Index tensors are i64; entries are checked against the indexed size in
 * forward (TG_ERR_INVALID naming the op, the position and the range).
 * Argument numbers in messages follow the public functions (x #1, dim #2,
 * index #3). Movement ops accept every dtype; gradients need floating. */
#include <stdlib.h>
#include <string.h>

#include "ops/ext_common.h"

static tg_status check_index(const tg_op *op, int argi, const tg_tensor *idx, int64_t hi)
{
    const int64_t *p = tg__tensor_ptr(idx);
    for (int64_t i = 0; i < idx->numel; i++)
        if (p[i] < 0 || p[i] >= hi)
            return tg__err(TG_ERR_INVALID, "bad argument #%d to '%s' (index %lld at position %lld "
                                           "outside [0, %lld))", argi, op->name, (long long)p[i],
                           (long long)i, (long long)hi);
    return TG_OK;
}

static tg_status need_i64(const tg_op *op, int argi, const tg_tensor *t)
{
    if (t->dtype == TG_I64) return TG_OK;
    return tg__err(TG_ERR_DTYPE, "bad argument #%d to '%s' (%s indices; need i64)", argi, op->name,
                   tg_dtype_name(t->dtype));
}

static tg_status need_dims(const tg_op *op, const tg_tensor *x)
{
    if (x->ndim > 0) return TG_OK;
    return tg__err(TG_ERR_SHAPE, "bad argument #1 to '%s' (0-d tensor; needs at least 1 dim)",
                   op->name);
}

/* ---- concat(a, b) along attrs.ints[0] */
static tg_status concat_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                              tg_spec *out)
{
    int d;
    if (tg__need_same_dtype(op, in[0], in[1])) return TG_ERR_DTYPE;
    if (need_dims(op, in[0])) return TG_ERR_SHAPE;
    if (tg__norm_dim(op, 3, a->ints[0], in[0]->ndim, &d)) return TG_ERR_INVALID;
    bool ok = in[1]->ndim == in[0]->ndim;
    for (int i = 0; ok && i < in[0]->ndim; i++)
        if (i != d && in[0]->shape[i] != in[1]->shape[i]) ok = false;
    if (!ok) {
        char s1[96], s2[96];
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (shapes %s and %s differ outside "
                                     "dim %d)", op->name,
                       tg_shape_str(in[0]->ndim, in[0]->shape, s1, sizeof s1),
                       tg_shape_str(in[1]->ndim, in[1]->shape, s2, sizeof s2), d);
    }
    tg__spec_of(in[0], out);
    out->shape[d] += in[1]->shape[d];
    return TG_OK;
}

static tg_tensor *concat_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    int d = tg__ext_dim(ctx->attrs, in[0]->ndim);
    int64_t outer, na, nb, inner;
    tg__split_dim(in[0]->ndim, in[0]->shape, d, &outer, &na, &inner);
    nb = in[1]->shape[d];
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    TG_KERNEL(tg_concat_fn, TG_K_CONCAT, y)(outer, na, nb, inner, tg__tensor_ptr(in[0]),
                                            tg__tensor_ptr(in[1]), tg__tensor_ptr(y),
                                            tg_dtype_size(y->dtype));
    return y;
}

static tg_status concat_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    const tg_spec *a = tg_op_ctx_input_spec(ctx, 0), *b = tg_op_ctx_input_spec(ctx, 1);
    int d = tg__ext_dim(ctx->attrs, a->ndim);
    if (tg_op_ctx_needs_grad(ctx, 0) && !(gin[0] = tg_narrow(g, d, 0, a->shape[d])))
        return tg_last_error();
    if (tg_op_ctx_needs_grad(ctx, 1) && !(gin[1] = tg_narrow(g, d, a->shape[d], b->shape[d])))
        return tg_last_error();
    return TG_OK;
}

static int concat_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const struct { int n; int64_t a[3], b[3]; int dim; } c[] = {
        {2, {2, 3}, {2, 4}, 1}, {2, {3, 2}, {1, 2}, 0}, {3, {2, 3, 4}, {2, 1, 4}, -2},
        {1, {3}, {5}, 0},
    };
    if (k >= 4) return 0;
    a->nints = 1;
    a->ints[0] = c[k].dim;
    in[0] = tg__sample_uniform(rng, c[k].n, c[k].a, -1.0, 1.0);
    in[1] = tg__sample_uniform(rng, c[k].n, c[k].b, -1.0, 1.0);
    return (in[0] && in[1]) ? 2 : -1;
}

const tg_op tg__op_concat = {
    .name = "concat", .doc = "y = a ++ b along dim", .arity = 2, .shape = concat_shape,
    .forward = concat_fwd, .backward = concat_bwd, .cost = TG_COST_MEMORY_BOUND,
    .sample = concat_sample,
};

/* ---- narrow: attrs.ints = {dim, start, length}, start may be negative
 * (from the end). A strided view of x. */
static tg_status narrow_args(const tg_op *op, const tg_op_attrs *a, const tg_tensor *x, int *dim,
                             int64_t *start, int64_t *len)
{
    if (need_dims(op, x)) return TG_ERR_SHAPE;
    if (tg__norm_dim(op, 2, a->ints[0], x->ndim, dim)) return TG_ERR_INVALID;
    int64_t size = x->shape[*dim];
    *start = a->ints[1] < 0 ? a->ints[1] + size : a->ints[1];
    *len = a->ints[2];
    if (*start < 0 || *start > size || *len < 0 || *len > size - *start)
        return tg__err(TG_ERR_INVALID, "bad argument #3 to '%s' (start %lld, length %lld outside "
                                       "dim %d of size %lld)", op->name, (long long)a->ints[1],
                       (long long)a->ints[2], *dim, (long long)size);
    return TG_OK;
}

static tg_status narrow_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                              tg_spec *out)
{
    int d;
    int64_t start, len;
    if (narrow_args(op, a, in[0], &d, &start, &len)) return tg_last_error();
    tg__spec_of(in[0], out);
    out->shape[d] = len;
    return TG_OK;
}

static tg_tensor *narrow_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *x = in[0];
    int d = 0;
    int64_t start = 0, len = 0;
    narrow_args(ctx->op, ctx->attrs, x, &d, &start, &len); /* valid: checked by the shape rule */
    return tg__tensor_view(x, x->ndim, ctx->out_spec->shape, x->strides,
                           x->offset + start * x->strides[d]);
}

/* gx = zeros(before) ++ g ++ zeros(after) along dim. */
static tg_status narrow_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    const tg_spec *xs = tg_op_ctx_input_spec(ctx, 0);
    int d = tg__ext_dim(ctx->attrs, xs->ndim);
    int64_t size = xs->shape[d], len = ctx->attrs->ints[2];
    int64_t start = ctx->attrs->ints[1] < 0 ? ctx->attrs->ints[1] + size : ctx->attrs->ints[1];
    tg_tensor *parts[3];
    int n = 0;
    tg_spec z = *xs;
    if (start > 0) {
        z.shape[d] = start;
        parts[n++] = tg__ext_full(&z, g->backend, 0.0);
    }
    parts[n++] = g;
    if (size - start - len > 0) {
        z.shape[d] = size - start - len;
        parts[n++] = tg__ext_full(&z, g->backend, 0.0);
    }
    gin[0] = n == 1 ? g : tg_concat(n, parts, d);
    return gin[0] ? TG_OK : tg_last_error();
}

static int narrow_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const struct { int n; int64_t s[3]; int64_t dim, start, len; } c[] = {
        {2, {4, 5}, 1, 1, 3}, {2, {4, 5}, 0, -3, 2}, {3, {2, 3, 4}, 2, 0, 4}, {3, {2, 6, 3}, -2, 4, 2},
    };
    if (k >= 4) return 0;
    a->nints = 3;
    a->ints[0] = c[k].dim;
    a->ints[1] = c[k].start;
    a->ints[2] = c[k].len;
    in[0] = tg__sample_uniform(rng, c[k].n, c[k].s, -1.0, 1.0);
    return in[0] ? 1 : -1;
}

const tg_op tg__op_narrow = {
    .name = "narrow", .doc = "y = x[.., start:start+length, ..] along dim (view)", .arity = 1,
    .shape = narrow_shape, .forward = narrow_fwd, .backward = narrow_bwd,
    .cost = TG_COST_MEMORY_BOUND, .flags = TG_OP_STRIDED_INPUTS, .sample = narrow_sample,
};

/* ---- index_select(x, idx) along attrs.ints[0]; idx 1-d (or 0-d) i64.
 * index_select_backward(g, idx): attrs.ints = {dim, size of x along dim}. */
static tg_status isel_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                            tg_spec *out)
{
    int d;
    if (need_dims(op, in[0]) || need_i64(op, 3, in[1])) return tg_last_error();
    if (tg__norm_dim(op, 2, a->ints[0], in[0]->ndim, &d)) return TG_ERR_INVALID;
    if (in[1]->ndim > 1)
        return tg__err(TG_ERR_SHAPE, "bad argument #3 to '%s' (%d-d index; need 1-d)", op->name,
                       in[1]->ndim);
    tg__spec_of(in[0], out);
    out->shape[d] = in[1]->numel;
    return TG_OK;
}

static tg_tensor *isel_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *x = in[0];
    int d = tg__ext_dim(ctx->attrs, x->ndim);
    int64_t outer, n, inner;
    tg__split_dim(x->ndim, x->shape, d, &outer, &n, &inner);
    if (check_index(ctx->op, 3, in[1], n)) return NULL;
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    TG_KERNEL(tg_index_select_fn, TG_K_INDEX_SELECT, x)(outer, n, inner, tg__tensor_ptr(x),
                                                        tg__tensor_ptr(in[1]), in[1]->numel,
                                                        tg__tensor_ptr(y), tg_dtype_size(x->dtype));
    return y;
}

static tg_status iadd_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                            tg_spec *out)
{
    int d;
    if (tg__need_float(op, 1, in[0]) || need_i64(op, 2, in[1])) return TG_ERR_DTYPE;
    if (need_dims(op, in[0])) return TG_ERR_SHAPE;
    if (tg__norm_dim(op, 2, a->ints[0], in[0]->ndim, &d)) return TG_ERR_INVALID;
    if (in[1]->ndim > 1 || in[1]->numel != in[0]->shape[d] || a->ints[1] < 0)
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (%lld indices for a gradient of "
                                     "size %lld along dim %d, target size %lld)", op->name,
                       (long long)in[1]->numel, (long long)in[0]->shape[d], d,
                       (long long)a->ints[1]);
    tg__spec_of(in[0], out);
    out->shape[d] = a->ints[1];
    return TG_OK;
}

static tg_tensor *iadd_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    int d = tg__ext_dim(ctx->attrs, in[0]->ndim);
    int64_t outer, nidx, inner, n = ctx->attrs->ints[1];
    tg__split_dim(in[0]->ndim, in[0]->shape, d, &outer, &nidx, &inner);
    if (check_index(ctx->op, 2, in[1], n)) return NULL;
    tg_tensor *gx = tg_op_ctx_new_output(ctx);
    if (!gx) return NULL;
    TG_KERNEL(tg_index_add_fn, TG_K_INDEX_ADD, gx)(outer, n, inner, tg__tensor_ptr(in[0]),
                                                   tg__tensor_ptr(in[1]), nidx, tg__tensor_ptr(gx));
    return gx;
}

static tg_status iadd_bwd(tg_op_ctx *ctx, tg_tensor *gg, tg_tensor **gin)
{
    gin[0] = tg_index_select(gg, (int)ctx->attrs->ints[0], tg_op_ctx_input(ctx, 1));
    return gin[0] ? TG_OK : tg_last_error();
}

static int iadd_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const struct { int n; int64_t s[3]; int dim; int64_t size; } c[] = {
        {2, {3, 4}, 1, 6}, {2, {5, 2}, 0, 3}, {3, {2, 3, 2}, -2, 4},
    };
    if (k >= 3) return 0;
    int d = c[k].dim < 0 ? c[k].dim + c[k].n : c[k].dim;
    a->nints = 2;
    a->ints[0] = c[k].dim;
    a->ints[1] = c[k].size;
    in[0] = tg__sample_uniform(rng, c[k].n, c[k].s, -1.0, 1.0);
    in[1] = tg__ext_sample_index(rng, 1, &c[k].s[d], c[k].size);
    return (in[0] && in[1]) ? 2 : -1;
}

const tg_op tg__op_index_select_backward = {
    .name = "index_select_backward", .doc = "gx = 0; gx[.., idx[j], ..] += g[.., j, ..]",
    .arity = 2, .shape = iadd_shape, .forward = iadd_fwd, .backward = iadd_bwd,
    .cost = TG_COST_MEMORY_BOUND, .saves = TG_SAVE_INPUT(1), .sample = iadd_sample,
};

static tg_status isel_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    const tg_spec *xs = tg_op_ctx_input_spec(ctx, 0);
    int d = tg__ext_dim(ctx->attrs, xs->ndim);
    tg_tensor *idx = tg_op_ctx_input(ctx, 1);
    if (idx->ndim == 0) idx = tg_reshape(idx, 1, (const int64_t[]){1});
    tg_op_attrs a = {.nints = 2, .ints = {d, xs->shape[d]}};
    gin[0] = tg__call2(&tg__op_index_select_backward, g, idx, &a);
    return gin[0] ? TG_OK : tg_last_error();
}

static int isel_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const struct { int n; int64_t s[3]; int dim; int64_t nidx; } c[] = {
        {2, {4, 3}, 0, 6}, {2, {3, 5}, 1, 2}, {3, {2, 4, 3}, -2, 5}, {1, {5}, 0, 1},
    };
    if (k >= 4) return 0;
    int d = c[k].dim < 0 ? c[k].dim + c[k].n : c[k].dim;
    a->nints = 1;
    a->ints[0] = c[k].dim;
    in[0] = tg__sample_uniform(rng, c[k].n, c[k].s, -1.0, 1.0);
    in[1] = tg__ext_sample_index(rng, k == 3 ? 0 : 1, &c[k].nidx, c[k].s[d]);
    return (in[0] && in[1]) ? 2 : -1;
}

const tg_op tg__op_index_select = {
    .name = "index_select", .doc = "y = x[.., idx[j], ..] along dim", .arity = 2,
    .shape = isel_shape, .forward = isel_fwd, .backward = isel_bwd,
    .cost = TG_COST_MEMORY_BOUND, .saves = TG_SAVE_INPUT(1), .sample = isel_sample,
};

/* ---- gather(x, idx) along attrs.ints[0]: idx has x's ndim and fits in x
 * outside dim. gather_backward(g, idx): attrs.ints = x's shape, target =
 * dim. */
static tg_status gather_check(const tg_op *op, int ndim, const int64_t *xshape, int d,
                              const tg_tensor *idx, int argi)
{
    bool ok = idx->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        if (i != d && idx->shape[i] > xshape[i]) ok = false;
    if (ok) return TG_OK;
    char s1[96], s2[96];
    return tg__err(TG_ERR_SHAPE, "bad argument #%d to '%s' (index %s does not fit %s outside dim "
                                 "%d)", argi, op->name, tg_shape_str(idx->ndim, idx->shape, s1, sizeof s1),
                   tg_shape_str(ndim, xshape, s2, sizeof s2), d);
}

static tg_status gather_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                              tg_spec *out)
{
    int d;
    if (need_dims(op, in[0]) || need_i64(op, 3, in[1])) return tg_last_error();
    if (tg__norm_dim(op, 2, a->ints[0], in[0]->ndim, &d)) return TG_ERR_INVALID;
    if (gather_check(op, in[0]->ndim, in[0]->shape, d, in[1], 3)) return TG_ERR_SHAPE;
    tg__spec_of(in[1], out);
    out->dtype = in[0]->dtype;
    return TG_OK;
}

static tg_tensor *gather_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *x = in[0], *idx = in[1];
    int d = tg__ext_dim(ctx->attrs, x->ndim);
    if (check_index(ctx->op, 3, idx, x->shape[d])) return NULL;
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    TG_KERNEL(tg_gather_fn, TG_K_GATHER, x)(x->ndim, idx->shape, x->shape, d, tg__tensor_ptr(x),
                                            tg__tensor_ptr(idx), tg__tensor_ptr(y),
                                            tg_dtype_size(x->dtype));
    return y;
}

static tg_status scatter_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                               tg_spec *out)
{
    if (tg__need_float(op, 1, in[0]) || need_i64(op, 2, in[1])) return TG_ERR_DTYPE;
    if (a->nints != in[0]->ndim || a->nints < 1 || a->target < 0 || a->target >= a->nints ||
        !tg__same_shape(in[0]->ndim, in[0]->shape, in[1]->ndim, in[1]->shape))
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (gradient, indices and the %d-d "
                                     "target shape do not match)", op->name, a->nints);
    if (tg__check_shape(op->name, a->nints, a->ints)) return TG_ERR_SHAPE;
    if (gather_check(op, a->nints, a->ints, a->target, in[1], 2)) return TG_ERR_SHAPE;
    out->dtype = in[0]->dtype;
    out->ndim = a->nints;
    memcpy(out->shape, a->ints, sizeof out->shape);
    return TG_OK;
}

static tg_tensor *scatter_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_spec *o = ctx->out_spec;
    int d = ctx->attrs->target;
    if (check_index(ctx->op, 2, in[1], o->shape[d])) return NULL;
    tg_tensor *gx = tg_op_ctx_new_output(ctx);
    if (!gx) return NULL;
    TG_KERNEL(tg_scatter_add_fn, TG_K_SCATTER_ADD, gx)(o->ndim, in[1]->shape, o->shape, d,
                                                       tg__tensor_ptr(in[0]), tg__tensor_ptr(in[1]),
                                                       tg__tensor_ptr(gx));
    return gx;
}

static tg_status scatter_bwd(tg_op_ctx *ctx, tg_tensor *gg, tg_tensor **gin)
{
    gin[0] = tg_gather(gg, ctx->attrs->target, tg_op_ctx_input(ctx, 1));
    return gin[0] ? TG_OK : tg_last_error();
}

/* Cases shared by gather and gather_backward: x shape, index shape, dim. */
static const struct { int n; int64_t x[3], i[3]; int dim; } gather_cases[] = {
    {2, {3, 4}, {3, 2}, 1}, {2, {3, 4}, {5, 4}, 0}, {3, {2, 3, 4}, {2, 2, 3}, -1},
    {3, {2, 3, 4}, {1, 6, 4}, 1},
};
#define NGATHER ((int)(sizeof gather_cases / sizeof gather_cases[0]))

static int gather_case(int k, tg_rng *rng, tg_tensor **in, int *d)
{
    *d = gather_cases[k].dim < 0 ? gather_cases[k].dim + gather_cases[k].n : gather_cases[k].dim;
    in[1] = tg__ext_sample_index(rng, gather_cases[k].n, gather_cases[k].i,
                                 gather_cases[k].x[*d]);
    return in[1] ? 0 : -1;
}

static int scatter_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    int d;
    if (k >= NGATHER) return 0;
    if (gather_case(k, rng, in, &d)) return -1;
    a->nints = gather_cases[k].n;
    memcpy(a->ints, gather_cases[k].x, sizeof gather_cases[k].x);
    a->target = d;
    in[0] = tg__sample_uniform(rng, gather_cases[k].n, gather_cases[k].i, -1.0, 1.0);
    return in[0] ? 2 : -1;
}

const tg_op tg__op_gather_backward = {
    .name = "gather_backward", .doc = "gx = 0; gx[i with dim -> idx[i]] += g[i]", .arity = 2,
    .shape = scatter_shape, .forward = scatter_fwd, .backward = scatter_bwd,
    .cost = TG_COST_MEMORY_BOUND, .saves = TG_SAVE_INPUT(1), .sample = scatter_sample,
};

static tg_status gather_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    const tg_spec *xs = tg_op_ctx_input_spec(ctx, 0);
    tg_op_attrs a = {.nints = xs->ndim, .target = tg__ext_dim(ctx->attrs, xs->ndim)};
    memcpy(a.ints, xs->shape, sizeof a.ints);
    gin[0] = tg__call2(&tg__op_gather_backward, g, tg_op_ctx_input(ctx, 1), &a);
    return gin[0] ? TG_OK : tg_last_error();
}

static int gather_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    int d;
    if (k >= NGATHER) return 0;
    if (gather_case(k, rng, in, &d)) return -1;
    a->nints = 1;
    a->ints[0] = gather_cases[k].dim;
    in[0] = tg__sample_uniform(rng, gather_cases[k].n, gather_cases[k].x, -1.0, 1.0);
    return in[0] ? 2 : -1;
}

const tg_op tg__op_gather = {
    .name = "gather", .doc = "y[i] = x[i with dim -> idx[i]]", .arity = 2, .shape = gather_shape,
    .forward = gather_fwd, .backward = gather_bwd, .cost = TG_COST_MEMORY_BOUND,
    .saves = TG_SAVE_INPUT(1), .sample = gather_sample,
};

/* ---- embedding(weight (V, D), ids (...)) -> (..., D): rows of weight. */
static tg_status emb_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                           tg_spec *out)
{
    (void)a;
    char s[96];
    if (tg__need_float(op, 1, in[0]) || need_i64(op, 2, in[1])) return TG_ERR_DTYPE;
    if (in[0]->ndim != 2)
        return tg__err(TG_ERR_SHAPE, "bad argument #1 to '%s' (weight %s; need (V, D))", op->name,
                       tg_shape_str(in[0]->ndim, in[0]->shape, s, sizeof s));
    if (in[1]->ndim >= TG_MAX_DIMS)
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (%d-d ids leave no room for the "
                                     "embedding dim)", op->name, in[1]->ndim);
    tg__spec_of(in[1], out);
    out->dtype = in[0]->dtype;
    out->shape[out->ndim++] = in[0]->shape[1];
    return TG_OK;
}

static tg_tensor *emb_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *w = in[0], *ids = in[1];
    if (check_index(ctx->op, 2, ids, w->shape[0])) return NULL;
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    TG_KERNEL(tg_index_select_fn, TG_K_INDEX_SELECT, w)(1, w->shape[0], w->shape[1],
                                                        tg__tensor_ptr(w), tg__tensor_ptr(ids),
                                                        ids->numel, tg__tensor_ptr(y),
                                                        tg_dtype_size(w->dtype));
    return y;
}

/* gw = index_select_backward over dim 0 of g (N, D) with the N flat ids. */
static tg_status emb_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    const tg_spec *ws = tg_op_ctx_input_spec(ctx, 0);
    tg_tensor *ids = tg_op_ctx_input(ctx, 1);
    int64_t n = ids->numel, nd[2] = {n, ws->shape[1]};
    tg_op_attrs a = {.nints = 2, .ints = {0, ws->shape[0]}};
    gin[0] = tg__call2(&tg__op_index_select_backward, tg_reshape(g, 2, nd), tg_reshape(ids, 1, &n),
                       &a);
    return gin[0] ? TG_OK : tg_last_error();
}

static int emb_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const struct { int64_t v, d; int n; int64_t ids[3]; } c[] = {
        {5, 3, 1, {7}}, {4, 2, 2, {2, 3}}, {6, 4, 0, {0}},
    };
    (void)a;
    if (k >= 3) return 0;
    int64_t ws[2] = {c[k].v, c[k].d};
    in[0] = tg__sample_uniform(rng, 2, ws, -1.0, 1.0);
    in[1] = tg__ext_sample_index(rng, c[k].n, c[k].ids, c[k].v);
    return (in[0] && in[1]) ? 2 : -1;
}

const tg_op tg__op_embedding = {
    .name = "embedding", .doc = "y[..., :] = weight[ids[...], :]", .arity = 2,
    .shape = emb_shape, .forward = emb_fwd, .backward = emb_bwd, .cost = TG_COST_MEMORY_BOUND,
    .saves = TG_SAVE_INPUT(1), .sample = emb_sample,
};

/* ---- public wrappers */

/* Checks the whole list up front, so messages name the list position,
 * then joins neighbours pairwise until one tensor is left. */
tg_tensor *tg_concat(int n, tg_tensor *const *xs, int dim)
{
    if (n < 1 || !xs) {
        tg__err(TG_ERR_INVALID, "bad argument #1 to 'concat' (%d tensors; need at least 1)", n);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!xs[i]) {
            tg__err_null("concat", 2);
            return NULL;
        }
    const tg_tensor *x0 = xs[0];
    int d;
    if (need_dims(&tg__op_concat, x0) || tg__norm_dim(&tg__op_concat, 3, dim, x0->ndim, &d))
        return NULL;
    for (int i = 1; i < n; i++) {
        const tg_tensor *x = xs[i];
        bool ok = x->ndim == x0->ndim;
        for (int j = 0; ok && j < x0->ndim; j++)
            if (j != d && x->shape[j] != x0->shape[j]) ok = false;
        char s1[96], s2[96];
        if (x->dtype != x0->dtype) {
            tg__err(TG_ERR_DTYPE, "bad argument #2 to 'concat' (tensor %d is %s, tensor 0 is %s)",
                    i, tg_dtype_name(x->dtype), tg_dtype_name(x0->dtype));
            return NULL;
        }
        if (!ok) {
            tg__err(TG_ERR_SHAPE, "bad argument #2 to 'concat' (tensor %d has shape %s, tensor 0 "
                                  "%s: all dims but %d must match)", i,
                    tg_shape_str(x->ndim, x->shape, s1, sizeof s1),
                    tg_shape_str(x0->ndim, x0->shape, s2, sizeof s2), d);
            return NULL;
        }
    }
    if (n == 1) return tg_contiguous(xs[0]);
    tg_tensor **level = malloc((size_t)n * sizeof *level);
    if (!level) {
        tg__err(TG_ERR_NOMEM, "out of memory in 'concat'");
        return NULL;
    }
    memcpy(level, xs, (size_t)n * sizeof *level);
    tg_op_attrs a = {.nints = 1, .ints = {d}};
    tg_scope_begin(); /* intermediates die here; only the result leaves */
    int m = n;
    while (m > 1) {
        int k = 0;
        for (int i = 0; i + 1 < m; i += 2) {
            level[k] = tg__call2(&tg__op_concat, level[i], level[i + 1], &a);
            if (!level[k]) {
                m = 0;
                break;
            }
            k++;
        }
        if (m == 0) break;
        if (m % 2) level[k++] = level[m - 1];
        m = k;
    }
    tg_tensor *y = m == 1 ? tg_scope_keep(level[0]) : NULL;
    tg_scope_end();
    free(level);
    return tg__scope_track(y);
}

tg_tensor *tg_narrow(tg_tensor *x, int dim, int64_t start, int64_t length)
{
    tg_op_attrs a = {.nints = 3, .ints = {dim, start, length}};
    return tg__call1(&tg__op_narrow, x, &a);
}

tg_tensor *tg_index_select(tg_tensor *x, int dim, tg_tensor *index)
{
    tg_op_attrs a = {.nints = 1, .ints = {dim}};
    return tg__call2(&tg__op_index_select, x, index, &a);
}

tg_tensor *tg_gather(tg_tensor *x, int dim, tg_tensor *index)
{
    tg_op_attrs a = {.nints = 1, .ints = {dim}};
    return tg__call2(&tg__op_gather, x, index, &a);
}

tg_tensor *tg_embedding(tg_tensor *weight, tg_tensor *ids)
{
    return tg__call2(&tg__op_embedding, weight, ids, NULL);
}
