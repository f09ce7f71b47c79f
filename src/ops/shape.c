/* Shape and movement ops: reshape (a view of contiguous data), permute and
 * transpose (strided views), expand (a stride-0 view), sum_to, contiguous,
 * to_device, cast, and the joins concat and narrow (a view).
 *
 * concat is one binary op ("concat"(a, b) along attrs.ints[0]); tg_concat
 * joins n tensors by applying it over a balanced tree (log2 n levels of
 * copies), so TG_OP_MAX_INPUTS stays 4. narrow's backward pads the
 * gradient with zeros through concat, and concat's backward narrows: both
 * stay differentiable. */
#include <stdlib.h>
#include <string.h>

#include "ops/helpers.h"

/* The shape in attrs.ints, checked as creation checks one (tg_op_call
 * hands it in unchecked: fuzz/fuzz_ops found a -1 in a 0-element reshape
 * reaching the kernels). */
static tg_status copy_shape_attr(const tg_op *op, const tg_op_attrs *a, tg_spec *out, tg_dtype dt)
{
    tg_status st = tg__check_shape(op->name, a->nints, a->ints);
    if (st) return st;
    out->dtype = dt;
    out->ndim = a->nints;
    memcpy(out->shape, a->ints, sizeof out->shape);
    return TG_OK;
}

/* ---- reshape: attrs.ints is the new shape (one -1 allowed, resolved by the
 * public wrapper). */
static tg_status reshape_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                               tg_spec *out)
{
    if (tg__check_shape(op->name, a->nints, a->ints)) return tg_last_error();
    if (tg__numel(a->nints, a->ints) != in[0]->numel) {
        char s1[96], s2[96];
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (cannot view %s (%lld elements) as %s)",
                       op->name, tg_shape_str(in[0]->ndim, in[0]->shape, s1, sizeof s1),
                       (long long)in[0]->numel, tg_shape_str(a->nints, a->ints, s2, sizeof s2));
    }
    return copy_shape_attr(op, a, out, in[0]->dtype);
}
static tg_tensor *reshape_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    int64_t strides[TG_MAX_DIMS];
    tg__contig_strides(ctx->out_spec->ndim, ctx->out_spec->shape, strides);
    return tg__tensor_view(in[0], ctx->out_spec->ndim, ctx->out_spec->shape, strides, in[0]->offset);
}
static tg_status reshape_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    const tg_spec *x = tg_op_ctx_input_spec(ctx, 0);
    gin[0] = tg_reshape(g, x->ndim, x->shape);
    return gin[0] ? TG_OK : tg_last_error();
}
static int reshape_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const int64_t s[3] = {2, 3, 4};
    static const int64_t to[3][3] = {{6, 4}, {24}, {4, 1, 6}};
    static const int nto[3] = {2, 1, 3};
    if (k >= 3) return 0;
    a->nints = nto[k];
    memcpy(a->ints, to[k], sizeof to[k]);
    in[0] = tg__sample_uniform(rng, 3, s, -1.0, 1.0);
    return in[0] ? 1 : -1;
}
const tg_op tg__op_reshape = {
    .name = "reshape", .doc = "y = x viewed with a new shape", .arity = 1, .shape = reshape_shape,
    .forward = reshape_fwd, .backward = reshape_bwd, .cost = TG_COST_MEMORY_BOUND,
    .sample = reshape_sample,
};

/* ---- permute: attrs.ints is the permutation. */
static tg_status permute_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                               tg_spec *out)
{
    bool seen[TG_MAX_DIMS] = {0};
    if (a->nints != in[0]->ndim)
        return tg__err(TG_ERR_INVALID, "bad argument #2 to '%s' (permutation of %d dims for a "
                                       "%d-d tensor)", op->name, a->nints, in[0]->ndim);
    out->dtype = in[0]->dtype;
    out->ndim = a->nints;
    for (int i = 0; i < a->nints; i++) {
        int64_t p = a->ints[i];
        if (p < 0 || p >= a->nints || seen[p])
            return tg__err(TG_ERR_INVALID, "bad argument #2 to '%s' (not a permutation: entry "
                                           "%d is %lld)", op->name, i, (long long)p);
        seen[p] = true;
        out->shape[i] = in[0]->shape[p];
    }
    return TG_OK;
}
static tg_tensor *permute_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    int64_t strides[TG_MAX_DIMS];
    for (int i = 0; i < ctx->attrs->nints; i++) strides[i] = in[0]->strides[ctx->attrs->ints[i]];
    return tg__tensor_view(in[0], ctx->out_spec->ndim, ctx->out_spec->shape, strides, in[0]->offset);
}
static tg_status permute_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    int inv[TG_MAX_DIMS];
    for (int i = 0; i < ctx->attrs->nints; i++) inv[ctx->attrs->ints[i]] = i;
    gin[0] = tg_permute(g, ctx->attrs->nints, inv);
    return gin[0] ? TG_OK : tg_last_error();
}
static int permute_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const int64_t s2[2] = {3, 4}, s3[3] = {2, 3, 4};
    switch (k) {
    case 0: a->nints = 2; a->ints[0] = 1; a->ints[1] = 0; in[0] = tg__sample_uniform(rng, 2, s2, -1, 1); break;
    case 1: a->nints = 3; a->ints[0] = 2; a->ints[1] = 0; a->ints[2] = 1; in[0] = tg__sample_uniform(rng, 3, s3, -1, 1); break;
    case 2: a->nints = 3; a->ints[0] = 0; a->ints[1] = 2; a->ints[2] = 1; in[0] = tg__sample_uniform(rng, 3, s3, -1, 1); break;
    default: return 0;
    }
    return in[0] ? 1 : -1;
}
const tg_op tg__op_permute = {
    .name = "permute", .doc = "y = x with dims reordered (strided view)", .arity = 1,
    .shape = permute_shape, .forward = permute_fwd, .backward = permute_bwd,
    .cost = TG_COST_MEMORY_BOUND, .flags = TG_OP_STRIDED_INPUTS, .sample = permute_sample,
};

/* ---- expand: broadcast to attrs.ints (a stride-0 view). */
static tg_status expand_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                              tg_spec *out)
{
    if (!tg__broadcasts_to(in[0]->ndim, in[0]->shape, a->nints, a->ints)) {
        char s1[96], s2[96];
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (%s does not broadcast to %s)",
                       op->name, tg_shape_str(in[0]->ndim, in[0]->shape, s1, sizeof s1),
                       tg_shape_str(a->nints, a->ints, s2, sizeof s2));
    }
    return copy_shape_attr(op, a, out, in[0]->dtype);
}
static tg_tensor *expand_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *x = in[0];
    int nd = ctx->out_spec->ndim;
    int64_t strides[TG_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
        int ix = x->ndim - nd + i;
        strides[i] = (ix >= 0 && x->shape[ix] != 1) ? x->strides[ix] : 0;
    }
    return tg__tensor_view(x, nd, ctx->out_spec->shape, strides, x->offset);
}
static tg_status expand_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    const tg_spec *x = tg_op_ctx_input_spec(ctx, 0);
    gin[0] = tg_sum_to(g, x->ndim, x->shape);
    return gin[0] ? TG_OK : tg_last_error();
}
static int expand_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const struct { int n; int64_t s[3]; int m; int64_t t[3]; } c[] = {
        {2, {3, 1}, 2, {3, 4}}, {1, {4}, 3, {2, 3, 4}}, {0, {0}, 2, {2, 2}},
    };
    if (k >= 3) return 0;
    a->nints = c[k].m;
    memcpy(a->ints, c[k].t, sizeof c[k].t);
    in[0] = tg__sample_uniform(rng, c[k].n, c[k].s, -1.0, 1.0);
    return in[0] ? 1 : -1;
}
const tg_op tg__op_expand = {
    .name = "expand", .doc = "y = x broadcast to a shape (view)", .arity = 1,
    .shape = expand_shape, .forward = expand_fwd, .backward = expand_bwd,
    .cost = TG_COST_MEMORY_BOUND, .flags = TG_OP_STRIDED_INPUTS, .sample = expand_sample,
};

/* ---- sum_to: the adjoint of expand. */
static tg_status sum_to_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                              tg_spec *out)
{
    if (tg__need_float(op, 1, in[0])) return TG_ERR_DTYPE;
    if (!tg__broadcasts_to(a->nints, a->ints, in[0]->ndim, in[0]->shape)) {
        char s1[96], s2[96];
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (%s does not broadcast to %s)",
                       op->name, tg_shape_str(a->nints, a->ints, s1, sizeof s1),
                       tg_shape_str(in[0]->ndim, in[0]->shape, s2, sizeof s2));
    }
    return copy_shape_attr(op, a, out, in[0]->dtype);
}
static tg_tensor *sum_to_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *x = in[0];
    tg_reduce r = {.ndim = x->ndim};
    memcpy(r.shape, x->shape, sizeof r.shape);
    int lead = x->ndim - ctx->out_spec->ndim;
    for (int d = 0; d < x->ndim; d++)
        r.reduce[d] = d < lead || (ctx->out_spec->shape[d - lead] == 1 && x->shape[d] != 1);
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    tg__run_sum(&r, x, tg__tensor_ptr(y));
    return y;
}
static tg_status sum_to_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    const tg_spec *x = tg_op_ctx_input_spec(ctx, 0);
    gin[0] = tg_expand(g, x->ndim, x->shape);
    return gin[0] ? TG_OK : tg_last_error();
}
static int sum_to_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const struct { int n; int64_t s[3]; int m; int64_t t[3]; } c[] = {
        {2, {3, 4}, 2, {3, 1}}, {3, {2, 3, 4}, 1, {4}}, {2, {2, 2}, 0, {0}}, {3, {2, 3, 4}, 3, {2, 1, 4}},
    };
    if (k >= 4) return 0;
    a->nints = c[k].m;
    memcpy(a->ints, c[k].t, sizeof c[k].t);
    in[0] = tg__sample_uniform(rng, c[k].n, c[k].s, -1.0, 1.0);
    return in[0] ? 1 : -1;
}
const tg_op tg__op_sum_to = {
    .name = "sum_to", .doc = "y = x summed down to a shape it broadcasts from", .arity = 1,
    .shape = sum_to_shape, .forward = sum_to_fwd, .backward = sum_to_bwd,
    .cost = TG_COST_MEMORY_BOUND, .sample = sum_to_sample,
};

/* ---- contiguous */
static tg_status same_spec(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                           tg_spec *out)
{
    (void)op;
    (void)a;
    tg__spec_of(in[0], out);
    return TG_OK;
}
static tg_tensor *contiguous_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    (void)ctx;
    tg_tensor *c = tg__contiguous_raw(in[0]);
    if (c == in[0]) { /* already contiguous: still a distinct result tensor */
        tg_tensor_release(c);
        c = tg__tensor_view(in[0], in[0]->ndim, in[0]->shape, in[0]->strides, in[0]->offset);
    }
    return c;
}
static tg_status pass_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    (void)ctx;
    gin[0] = g;
    return TG_OK;
}
static int contiguous_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const int64_t s[2] = {3, 4};
    (void)a;
    if (k >= 1) return 0;
    in[0] = tg__sample_uniform(rng, 2, s, -1.0, 1.0);
    return in[0] ? 1 : -1;
}
const tg_op tg__op_contiguous = {
    .name = "contiguous", .doc = "y = x in fresh row-major storage", .arity = 1,
    .shape = same_spec, .forward = contiguous_fwd, .backward = pass_bwd,
    .cost = TG_COST_MEMORY_BOUND, .flags = TG_OP_STRIDED_INPUTS, .sample = contiguous_sample,
};

/* ---- to_device: attrs.target the destination, attrs.flag the source. */
static tg_status to_device_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                                 tg_spec *out)
{
    if (a->target < 0 || a->target >= TG_BACKEND_COUNT)
        return tg__err(TG_ERR_INVALID, "bad argument #2 to '%s' (no backend %d)", op->name,
                       a->target);
    tg__spec_of(in[0], out);
    return TG_OK;
}
static tg_tensor *to_device_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *x = in[0];
    tg_tensor *y = tg__tensor_empty_spec(ctx->out_spec, (tg_backend)ctx->attrs->target);
    if (!y) return NULL;
    /* Both backends live in host memory: a plain gather moves the data. */
    TG_KERNEL(tg_copy_strided_fn, TG_K_COPY_STRIDED, x)(x->ndim, x->shape, x->strides,
                                                        tg__tensor_ptr(x), tg__tensor_ptr(y),
                                                        tg_dtype_size(x->dtype));
    return y;
}
static tg_status to_device_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    gin[0] = tg_to_device(g, (tg_backend)ctx->attrs->flag);
    return gin[0] ? TG_OK : tg_last_error();
}
static int to_device_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const int64_t s[2] = {2, 3};
    if (k >= 2) return 0;
    in[0] = tg__sample_uniform(rng, 2, s, -1.0, 1.0);
    if (!in[0]) return -1;
    a->flag = in[0]->backend;
    a->target = k == 0 ? (in[0]->backend == TG_BACKEND_CPU ? TG_BACKEND_REF : TG_BACKEND_CPU)
                       : in[0]->backend;
    return 1;
}
const tg_op tg__op_to_device = {
    .name = "to_device", .doc = "y = x copied to another backend", .arity = 1,
    .shape = to_device_shape, .forward = to_device_fwd, .backward = to_device_bwd,
    .cost = TG_COST_MEMORY_BOUND, .flags = TG_OP_STRIDED_INPUTS | TG_OP_MIXED_BACKENDS,
    .sample = to_device_sample,
};

/* ---- cast: attrs.target the dtype. Differentiable between f32 and f64. */
static tg_status cast_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                            tg_spec *out)
{
    if (tg__check_dtype(op->name, (tg_dtype)a->target)) return TG_ERR_DTYPE;
    tg__spec_of(in[0], out);
    out->dtype = (tg_dtype)a->target;
    return TG_OK;
}
static tg_tensor *cast_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    TG_KERNEL(tg_cast_fn, TG_K_CAST, y)(in[0]->numel, tg__tensor_ptr(in[0]), in[0]->dtype,
                                        tg__tensor_ptr(y));
    return y;
}
static tg_status cast_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    const tg_spec *x = tg_op_ctx_input_spec(ctx, 0);
    if (!tg__is_float(x->dtype) || !tg__is_float(g->dtype))
        return tg__err(TG_ERR_NOT_DIFFERENTIABLE, "op 'cast' is not differentiable from %s to %s",
                       tg_dtype_name(x->dtype), tg_dtype_name(g->dtype));
    gin[0] = tg_cast(g, x->dtype);
    return gin[0] ? TG_OK : tg_last_error();
}
static int cast_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const int64_t s[2] = {2, 3};
    if (k >= 1) return 0;
    a->target = TG_F64; /* f64 -> f64 keeps the check exact; f32 paths in ref/cpu tests */
    in[0] = tg__sample_uniform(rng, 2, s, -1.0, 1.0);
    return in[0] ? 1 : -1;
}
const tg_op tg__op_cast = {
    .name = "cast", .doc = "y = x converted to another dtype", .arity = 1, .shape = cast_shape,
    .forward = cast_fwd, .backward = cast_bwd, .cost = TG_COST_MEMORY_BOUND,
    .sample = cast_sample,
};

/* ---- concat(a, b) along attrs.ints[0] */
static tg_status concat_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                              tg_spec *out)
{
    int d;
    if (tg__need_same_dtype(op, in[0], in[1])) return TG_ERR_DTYPE;
    if (tg__need_dims(op, in[0])) return TG_ERR_SHAPE;
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
    int d = tg__dim_attr(ctx->attrs, in[0]->ndim);
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
    int d = tg__dim_attr(ctx->attrs, a->ndim);
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
    if (tg__need_dims(op, x)) return TG_ERR_SHAPE;
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
    int d = tg__dim_attr(ctx->attrs, xs->ndim);
    int64_t size = xs->shape[d], len = ctx->attrs->ints[2];
    int64_t start = ctx->attrs->ints[1] < 0 ? ctx->attrs->ints[1] + size : ctx->attrs->ints[1];
    if (g->contiguous && !tg__records(g)) {
        /* Into one buffer: per index of the dims before d, zeros, then
         * that block of g, then zeros (the concat below, without its
         * zero tensors). */
        if (!(gin[0] = tg_op_ctx_new_grad(ctx, 0))) return tg_last_error();
        size_t es = tg_dtype_size(g->dtype);
        size_t inner = (size_t)tg__numel(xs->ndim - d - 1, xs->shape + d + 1) * es;
        size_t blk = (size_t)size * inner, pre = (size_t)start * inner, mid = (size_t)len * inner;
        int64_t outer = tg__numel(d, xs->shape);
        char *rp = tg__tensor_ptr(gin[0]);
        const char *gp = tg__tensor_ptr(g);
        for (int64_t o = 0; o < outer; o++, rp += blk, gp += mid) {
            memset(rp, 0, pre);
            memcpy(rp + pre, gp, mid);
            memset(rp + pre + mid, 0, blk - pre - mid);
        }
        return TG_OK;
    }
    tg_tensor *parts[3];
    int n = 0;
    tg_spec z = *xs;
    if (start > 0) {
        z.shape[d] = start;
        parts[n++] = tg__full(&z, g->backend, 0.0);
    }
    parts[n++] = g;
    if (size - start - len > 0) {
        z.shape[d] = size - start - len;
        parts[n++] = tg__full(&z, g->backend, 0.0);
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

/* ---- public wrappers */
/* op on x with the target shape as its attrs, written into `into` where
 * tg__call_into takes it (NULL: a plain call). */
static tg_tensor *call_shape_into(const tg_op *op, tg_tensor *x, int ndim, const int64_t *shape,
                                  tg_tensor *into)
{
    if (tg__check_shape(op->name, ndim, shape)) return NULL;
    tg_op_attrs a = {.nints = ndim};
    for (int i = 0; i < ndim; i++) a.ints[i] = shape[i];
    return tg__call_into(op, 1, &x, &a, into);
}

static tg_tensor *call_shape(const tg_op *op, tg_tensor *x, int ndim, const int64_t *shape)
{
    return call_shape_into(op, x, ndim, shape, NULL);
}

tg_tensor *tg_reshape(tg_tensor *x, int ndim, const int64_t *shape)
{
    if (!x) {
        tg__err_null("reshape", 1);
        return NULL;
    }
    if (ndim < 0 || ndim > TG_MAX_DIMS || (ndim && !shape)) {
        tg__err(TG_ERR_SHAPE, "bad argument #2 to 'reshape' (ndim %d)", ndim);
        return NULL;
    }
    int64_t s[TG_MAX_DIMS] = {0}, known = 1;
    int infer = -1;
    for (int i = 0; i < ndim; i++) {
        s[i] = shape[i];
        if (s[i] == -1 && infer < 0)
            infer = i;
        else
            known *= s[i];
    }
    if (infer >= 0) {
        if (known <= 0 || x->numel % known) {
            char b[96];
            tg__err(TG_ERR_SHAPE, "bad argument #2 to 'reshape' (cannot infer -1 for %lld "
                                  "elements into %s)", (long long)x->numel,
                    tg_shape_str(ndim, shape, b, sizeof b));
            return NULL;
        }
        s[infer] = x->numel / known;
    }
    return call_shape(&tg__op_reshape, x, ndim, s);
}

tg_tensor *tg_expand(tg_tensor *x, int ndim, const int64_t *shape)
{
    return call_shape(&tg__op_expand, x, ndim, shape);
}

tg_tensor *tg_sum_to(tg_tensor *x, int ndim, const int64_t *shape)
{
    return call_shape(&tg__op_sum_to, x, ndim, shape);
}

tg_tensor *tg__sum_to_into(tg_tensor *x, int ndim, const int64_t *shape, tg_tensor *into)
{
    return call_shape_into(&tg__op_sum_to, x, ndim, shape, into);
}

tg_tensor *tg_permute(tg_tensor *x, int ndim, const int *perm)
{
    if (ndim < 0 || ndim > TG_MAX_DIMS || (ndim && !perm)) {
        tg__err(TG_ERR_INVALID, "bad argument #2 to 'permute' (ndim %d)", ndim);
        return NULL;
    }
    tg_op_attrs a = {.nints = ndim};
    for (int i = 0; i < ndim; i++) a.ints[i] = perm[i];
    return tg__call1(&tg__op_permute, x, &a);
}

tg_tensor *tg_transpose(tg_tensor *x, int dim0, int dim1)
{
    if (!x) {
        tg__err_null("transpose", 1);
        return NULL;
    }
    /* Checked here, so that an error names transpose and its arguments. */
    int d0, d1, perm[TG_MAX_DIMS];
    static const tg_op named = {.name = "transpose"};
    if (tg__norm_dim(&named, 2, dim0, x->ndim, &d0) || tg__norm_dim(&named, 3, dim1, x->ndim, &d1))
        return NULL;
    for (int i = 0; i < x->ndim; i++) perm[i] = i;
    perm[d0] = d1;
    perm[d1] = d0;
    return tg_permute(x, x->ndim, perm);
}

tg_tensor *tg_contiguous(tg_tensor *x)
{
    return tg__call1(&tg__op_contiguous, x, NULL);
}

tg_tensor *tg_to_device(tg_tensor *x, tg_backend backend)
{
    tg_op_attrs a = {.target = (int)backend, .flag = x ? (int)x->backend : 0};
    return tg__call1(&tg__op_to_device, x, &a);
}

tg_tensor *tg_cast(tg_tensor *x, tg_dtype dtype)
{
    tg_op_attrs a = {.target = (int)dtype};
    return tg__call1(&tg__op_cast, x, &a);
}

tg_tensor *tg_concat(int n, tg_tensor *const *xs, int dim)
{
    if (n < 1) {
        tg__err(TG_ERR_INVALID, "bad argument #1 to 'concat' (%d tensors; need at least 1)", n);
        return NULL;
    }
    if (!xs) {
        tg__err(TG_ERR_NULL, "bad argument #2 to 'concat' (NULL tensor array)");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!xs[i]) {
            tg__err_null("concat", 2);
            return NULL;
        }
    const tg_tensor *x0 = xs[0];
    int d;
    if (tg__need_dims(&tg__op_concat, x0) || tg__norm_dim(&tg__op_concat, 3, dim, x0->ndim, &d))
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
