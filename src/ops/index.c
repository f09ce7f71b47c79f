/* Indexing and selection: index_select, gather and embedding, with the
 * scatter-add adjoints index_select_backward and gather_backward, and the
 * selections where(cond, a, b) and masked_fill(x, mask, value).
 *
 * The scatter-add ops are differentiable (their adjoint is the
 * select/gather again), so double backward works. Index tensors are i64;
 * entries are checked against the indexed size in forward (TG_ERR_INVALID
 * naming the op, the position and the range). Argument numbers in messages
 * follow the public functions (x #1, dim #2, index #3). Movement ops accept
 * every dtype; gradients need floating.
 *
 * where/masked_fill conditions and masks are i64 or of the data's dtype,
 * nonzero meaning true (NaN is true), broadcasting. Their gradients are
 * routed with where / masked_fill themselves, so a second backward works;
 * a floating condition gets a zero gradient (the output is piecewise
 * constant in it). */
#include <stdlib.h>
#include <string.h>

#include "ops/helpers.h"

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

/* ---- index_select(x, idx) along attrs.ints[0]; idx 1-d (or 0-d) i64.
 * index_select_backward(g, idx): attrs.ints = {dim, size of x along dim}. */
static tg_status isel_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                            tg_spec *out)
{
    int d;
    if (tg__need_dims(op, in[0]) || need_i64(op, 3, in[1])) return tg_last_error();
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
    int d = tg__dim_attr(ctx->attrs, x->ndim);
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
    if (tg__need_dims(op, in[0])) return TG_ERR_SHAPE;
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
    int d = tg__dim_attr(ctx->attrs, in[0]->ndim);
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
    in[1] = tg__sample_index(rng, 1, &c[k].s[d], c[k].size);
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
    int d = tg__dim_attr(ctx->attrs, xs->ndim);
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
    in[1] = tg__sample_index(rng, k == 3 ? 0 : 1, &c[k].nidx, c[k].s[d]);
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
    if (tg__need_dims(op, in[0]) || need_i64(op, 3, in[1])) return tg_last_error();
    if (tg__norm_dim(op, 2, a->ints[0], in[0]->ndim, &d)) return TG_ERR_INVALID;
    if (gather_check(op, in[0]->ndim, in[0]->shape, d, in[1], 3)) return TG_ERR_SHAPE;
    tg__spec_of(in[1], out);
    out->dtype = in[0]->dtype;
    return TG_OK;
}

static tg_tensor *gather_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *x = in[0], *idx = in[1];
    int d = tg__dim_attr(ctx->attrs, x->ndim);
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
    in[1] = tg__sample_index(rng, gather_cases[k].n, gather_cases[k].i,
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
    tg_op_attrs a = {.nints = xs->ndim, .target = tg__dim_attr(ctx->attrs, xs->ndim)};
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
    tg_tensor *in[2] = {tg_reshape(g, 2, nd), tg_reshape(ids, 1, &n)};
    gin[0] = in[0] && in[1] ? tg__call_into(&tg__op_index_select_backward, 2, in, &a,
                                            tg__op_ctx_take_sink(ctx, 0))
                            : NULL;
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
    in[1] = tg__sample_index(rng, c[k].n, c[k].ids, c[k].v);
    return (in[0] && in[1]) ? 2 : -1;
}

const tg_op tg__op_embedding = {
    .name = "embedding", .doc = "y[..., :] = weight[ids[...], :]", .arity = 2,
    .shape = emb_shape, .forward = emb_fwd, .backward = emb_bwd, .cost = TG_COST_MEMORY_BOUND,
    .saves = TG_SAVE_INPUT(1), .sample = emb_sample,
};


/* cond/mask dtype: i64 or the data's. argi names it in the message. */
static tg_status need_mask_dtype(const tg_op *op, int argi, const tg_tensor *m,
                                 const tg_tensor *data)
{
    if (m->dtype == TG_I64 || m->dtype == data->dtype) return TG_OK;
    return tg__err(TG_ERR_DTYPE, "bad argument #%d to '%s' (%s condition; need i64 or the data's "
                                 "dtype %s)", argi, op->name, tg_dtype_name(m->dtype),
                   tg_dtype_name(data->dtype));
}

/* Gradient for a floating condition input: zeros of its spec. */
static tg_status cond_grad(tg_op_ctx *ctx, int i, tg_tensor **gin)
{
    if (!tg_op_ctx_needs_grad(ctx, i)) return TG_OK;
    gin[i] = tg__full(tg_op_ctx_input_spec(ctx, i), ctx->backend, 0.0);
    return gin[i] ? TG_OK : tg_last_error();
}

/* Cases for the conditions: i64 0/1 entries, or (floating) nonzero only so
 * that the central differences never flip a selection. */
static tg_tensor *sample_cond(tg_rng *rng, int ndim, const int64_t *shape, bool floating)
{
    if (floating) return tg__sample_away_from_zero(rng, ndim, shape, 0.5, 2.0);
    return tg__sample_index(rng, ndim, shape, 2);
}

/* ---- where(cond, a, b) */
static tg_status where_shape(const tg_op *op, const tg_op_attrs *attrs, tg_tensor *const *in,
                             tg_spec *out)
{
    (void)attrs;
    if (in[1]->dtype != TG_I64 && tg__need_float(op, 2, in[1])) return TG_ERR_DTYPE;
    if (in[2]->dtype != in[1]->dtype)
        return tg__err(TG_ERR_DTYPE, "bad argument #3 to '%s' (%s, but argument #2 is %s; "
                                     "convert with tg_cast)", op->name,
                       tg_dtype_name(in[2]->dtype), tg_dtype_name(in[1]->dtype));
    if (need_mask_dtype(op, 1, in[0], in[1])) return TG_ERR_DTYPE;
    return tg__broadcast3(op, 3, in, out);
}

static tg_tensor *where_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_tensor *out = tg_op_ctx_new_output(ctx);
    if (!out) return NULL;
    tg_bcast3 bc;
    tg__bcast3_desc(ctx->out_spec, 3, in, &bc);
    TG_KERNEL(tg_where_fn, TG_K_WHERE, out)(&bc, tg__tensor_ptr(in[0]), in[0]->dtype,
                                            tg__tensor_ptr(in[1]), tg__tensor_ptr(in[2]),
                                            tg__tensor_ptr(out));
    return out;
}

/* ga = where(cond, g, 0), gb = where(cond, 0, g), each summed back to the
 * operand's shape. */
static tg_status where_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    tg_tensor *cond = tg_op_ctx_input(ctx, 0);
    tg_tensor *zero = tg__scalar(g->dtype, g->backend, 0.0);
    if (tg_op_ctx_needs_grad(ctx, 1)) {
        gin[1] = tg__unbroadcast(tg_where(cond, g, zero), tg_op_ctx_input_spec(ctx, 1));
        if (!gin[1]) return tg_last_error();
    }
    if (tg_op_ctx_needs_grad(ctx, 2)) {
        gin[2] = tg__unbroadcast(tg_where(cond, zero, g), tg_op_ctx_input_spec(ctx, 2));
        if (!gin[2]) return tg_last_error();
    }
    return cond_grad(ctx, 0, gin);
}

static int where_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const struct { int n[3]; int64_t s[3][3]; bool fcond; } c[] = {
        {{2, 2, 2}, {{3, 4}, {3, 4}, {3, 4}}, false},
        {{2, 1, 2}, {{3, 1}, {4}, {3, 4}}, false},
        {{3, 2, 0}, {{2, 3, 4}, {3, 4}, {0}}, false},
        {{1, 2, 2}, {{4}, {3, 4}, {3, 1}}, true},
    };
    (void)a;
    if (k >= 4) return 0;
    in[0] = sample_cond(rng, c[k].n[0], c[k].s[0], c[k].fcond);
    in[1] = tg__sample_uniform(rng, c[k].n[1], c[k].s[1], -2.0, 2.0);
    in[2] = tg__sample_uniform(rng, c[k].n[2], c[k].s[2], -2.0, 2.0);
    return (in[0] && in[1] && in[2]) ? 3 : -1;
}

const tg_op tg__op_where = {
    .name = "where", .doc = "y = cond != 0 ? a : b (broadcasting)", .arity = 3,
    .shape = where_shape, .forward = where_fwd, .backward = where_bwd,
    .cost = TG_COST_MEMORY_BOUND, .saves = TG_SAVE_INPUT(0), .sample = where_sample,
};

/* ---- masked_fill(x, mask; value = attrs.scalar) */
static tg_status masked_fill_shape(const tg_op *op, const tg_op_attrs *attrs,
                                   tg_tensor *const *in, tg_spec *out)
{
    (void)attrs;
    if (in[0]->dtype != TG_I64 && tg__need_float(op, 1, in[0])) return TG_ERR_DTYPE;
    if (need_mask_dtype(op, 2, in[1], in[0])) return TG_ERR_DTYPE;
    return tg__broadcast3(op, 2, in, out);
}

static tg_tensor *masked_fill_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_tensor *out = tg_op_ctx_new_output(ctx);
    if (!out) return NULL;
    tg_bcast3 bc;
    tg__bcast3_desc(ctx->out_spec, 2, in, &bc);
    TG_KERNEL(tg_masked_fill_fn, TG_K_MASKED_FILL, out)(&bc, tg__tensor_ptr(in[0]),
                                                        tg__tensor_ptr(in[1]), in[1]->dtype,
                                                        ctx->attrs->scalar, tg__tensor_ptr(out));
    return out;
}

static tg_status masked_fill_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    if (tg_op_ctx_needs_grad(ctx, 0)) {
        gin[0] = tg__unbroadcast(tg_masked_fill(g, tg_op_ctx_input(ctx, 1), 0.0),
                                     tg_op_ctx_input_spec(ctx, 0));
        if (!gin[0]) return tg_last_error();
    }
    return cond_grad(ctx, 1, gin);
}

static int masked_fill_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const struct { int n[2]; int64_t s[2][3]; bool fmask; } c[] = {
        {{2, 2}, {{3, 4}, {3, 4}}, false},
        {{2, 1}, {{3, 4}, {4}}, false},
        {{2, 3}, {{3, 1}, {2, 3, 4}}, false},
        {{1, 1}, {{5}, {5}}, true},
    };
    if (k >= 4) return 0;
    a->scalar = k == 1 ? -7.5 : 3.25;
    in[0] = tg__sample_uniform(rng, c[k].n[0], c[k].s[0], -2.0, 2.0);
    in[1] = sample_cond(rng, c[k].n[1], c[k].s[1], c[k].fmask);
    return (in[0] && in[1]) ? 2 : -1;
}

const tg_op tg__op_masked_fill = {
    .name = "masked_fill", .doc = "y = mask != 0 ? value : x (broadcasting)", .arity = 2,
    .shape = masked_fill_shape, .forward = masked_fill_fwd, .backward = masked_fill_bwd,
    .cost = TG_COST_MEMORY_BOUND, .saves = TG_SAVE_INPUT(1), .sample = masked_fill_sample,
};


/* ---- public wrappers */

/* Checks the whole list up front, so messages name the list position,
 * then joins neighbours pairwise until one tensor is left. */
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

tg_tensor *tg_where(tg_tensor *cond, tg_tensor *a, tg_tensor *b)
{
    tg_tensor *in[3] = {cond, a, b};
    return tg_op_call(&tg__op_where, 3, in, NULL);
}

tg_tensor *tg_masked_fill(tg_tensor *x, tg_tensor *mask, double value)
{
    tg_op_attrs a = {.scalar = value};
    return tg__call2(&tg__op_masked_fill, x, mask, &a);
}
