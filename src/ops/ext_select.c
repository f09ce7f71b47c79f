/* Selection ops: where(cond, a, b), masked_fill(x, mask, value) and the
 * elementwise minimum / maximum, all broadcasting. Conditions and masks are
 * i64 or of the data's dtype, nonzero meaning true (NaN is true). Their
 * gradients are routed with where / masked_fill themselves, so a second
 * backward works; a floating condition gets a zero gradient (the output is
 * piecewise constant in it). */
#include "ops/ext_common.h"

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
    gin[i] = tg__ext_full(tg_op_ctx_input_spec(ctx, i), ctx->backend, 0.0);
    return gin[i] ? TG_OK : tg_last_error();
}

/* Cases for the conditions: i64 0/1 entries, or (floating) nonzero only so
 * that the central differences never flip a selection. */
static tg_tensor *sample_cond(tg_rng *rng, int ndim, const int64_t *shape, bool floating)
{
    if (floating) return tg__sample_away_from_zero(rng, ndim, shape, 0.5, 2.0);
    return tg__ext_sample_index(rng, ndim, shape, 2);
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
    return tg__ext_broadcast3(op, 3, in, out);
}

static tg_tensor *where_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_tensor *out = tg_op_ctx_new_output(ctx);
    if (!out) return NULL;
    tg_bcast3 bc;
    tg__ext_bcast3_desc(ctx->out_spec, 3, in, &bc);
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
    tg_tensor *zero = tg__ext_scalar(g->dtype, g->backend, 0.0);
    if (tg_op_ctx_needs_grad(ctx, 1)) {
        gin[1] = tg__ext_unbroadcast(tg_where(cond, g, zero), tg_op_ctx_input_spec(ctx, 1));
        if (!gin[1]) return tg_last_error();
    }
    if (tg_op_ctx_needs_grad(ctx, 2)) {
        gin[2] = tg__ext_unbroadcast(tg_where(cond, zero, g), tg_op_ctx_input_spec(ctx, 2));
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
    return tg__ext_broadcast3(op, 2, in, out);
}

static tg_tensor *masked_fill_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_tensor *out = tg_op_ctx_new_output(ctx);
    if (!out) return NULL;
    tg_bcast3 bc;
    tg__ext_bcast3_desc(ctx->out_spec, 2, in, &bc);
    TG_KERNEL(tg_masked_fill_fn, TG_K_MASKED_FILL, out)(&bc, tg__tensor_ptr(in[0]),
                                                        tg__tensor_ptr(in[1]), in[1]->dtype,
                                                        ctx->attrs->scalar, tg__tensor_ptr(out));
    return out;
}

static tg_status masked_fill_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    if (tg_op_ctx_needs_grad(ctx, 0)) {
        gin[0] = tg__ext_unbroadcast(tg_masked_fill(g, tg_op_ctx_input(ctx, 1), 0.0),
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

/* ---- minimum / maximum: the gradient goes to the selected operand, to a
 * on ties. b is selected where b < a (minimum) / b > a (maximum). */
static tg_tensor *minmax_fwd(tg_op_ctx *ctx, tg_tensor *const *in, tg_kernel_id kid)
{
    tg_tensor *out = tg_op_ctx_new_output(ctx);
    if (!out) return NULL;
    tg_bcast bc;
    tg__bcast_desc(ctx->out_spec, in[0], in[1], &bc);
    TG_KERNEL(tg_binary_fn, kid, in[0])(&bc, tg__tensor_ptr(in[0]), tg__tensor_ptr(in[1]),
                                        tg__tensor_ptr(out));
    return out;
}

static tg_status minmax_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin, bool is_max)
{
    tg_tensor *a = tg_op_ctx_input(ctx, 0), *b = tg_op_ctx_input(ctx, 1);
    tg_tensor *b_wins = is_max ? tg_gt(b, a) : tg_gt(a, b);
    if (tg_op_ctx_needs_grad(ctx, 0)) {
        gin[0] = tg__ext_unbroadcast(tg_masked_fill(g, b_wins, 0.0), tg_op_ctx_input_spec(ctx, 0));
        if (!gin[0]) return tg_last_error();
    }
    if (tg_op_ctx_needs_grad(ctx, 1)) {
        tg_tensor *zero = tg__ext_scalar(g->dtype, g->backend, 0.0);
        gin[1] = tg__ext_unbroadcast(tg_where(b_wins, g, zero), tg_op_ctx_input_spec(ctx, 1));
        if (!gin[1]) return tg_last_error();
    }
    return TG_OK;
}

/* f64 entries near multiples of 0.1 (a: within 0.01) or halfway between
 * them (b): every pair is at least 0.04 apart, so no case sits on a tie. */
static tg_tensor *sample_grid(tg_rng *rng, int ndim, const int64_t *shape, bool half)
{
    tg_tensor *t = tg__sample_uniform(rng, ndim, shape, 0.0, 1.0);
    if (!t) return NULL;
    double *p = tg__tensor_ptr(t);
    for (int64_t i = 0; i < t->numel; i++) {
        double step = (double)(int64_t)(p[i] * 40.0) - 20.0;
        p[i] = 0.1 * step + (half ? 0.05 : 0.02 * (tg_rng_double(rng) - 0.5));
    }
    return t;
}

static int minmax_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const struct { int na; int64_t a[3]; int nb; int64_t b[3]; } c[] = {
        {2, {3, 4}, 2, {3, 4}}, {2, {3, 4}, 1, {4}}, {2, {3, 1}, 2, {1, 4}},
        {3, {2, 3, 4}, 2, {3, 1}}, {1, {5}, 0, {0}},
    };
    (void)a;
    if (k >= 5) return 0;
    in[0] = sample_grid(rng, c[k].na, c[k].a, false);
    in[1] = sample_grid(rng, c[k].nb, c[k].b, true);
    return (in[0] && in[1]) ? 2 : -1;
}

#define MINMAX_OP(lname, KID, IS_MAX, math)                                         \
    static tg_tensor *lname##_fwd(tg_op_ctx *ctx, tg_tensor *const *in)             \
    {                                                                               \
        return minmax_fwd(ctx, in, KID);                                            \
    }                                                                               \
    static tg_status lname##_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)     \
    {                                                                               \
        return minmax_bwd(ctx, g, gin, IS_MAX);                                     \
    }                                                                               \
    const tg_op tg__op_##lname = {                                                  \
        .name = #lname, .doc = math, .arity = 2, .shape = tg__shape_broadcast_float, \
        .forward = lname##_fwd, .backward = lname##_bwd, .cost = TG_COST_MEMORY_BOUND, \
        .saves = TG_SAVE_INPUT(0) | TG_SAVE_INPUT(1), .flags = TG_OP_POINTWISE,     \
        .sample = minmax_sample,                                                    \
    };

MINMAX_OP(minimum, TG_K_MINIMUM, false, "y = min(a, b) (broadcasting; NaN propagates)")
MINMAX_OP(maximum, TG_K_MAXIMUM, true, "y = max(a, b) (broadcasting; NaN propagates)")

/* ---- public wrappers */
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

tg_tensor *tg_minimum(tg_tensor *a, tg_tensor *b) { return tg__call2(&tg__op_minimum, a, b, NULL); }
tg_tensor *tg_maximum(tg_tensor *a, tg_tensor *b) { return tg__call2(&tg__op_maximum, a, b, NULL); }
