/* Binary elementwise ops, all broadcasting (NumPy rules): arithmetic
 * (add, sub, mul, div) with its backward, the elementwise minimum and
 * maximum, and the non-differentiable comparisons gt and eq. Every forward
 * runs one broadcasting kernel (tg__binary_kernel, split across threads);
 * every gradient is summed back to its input's shape (tg__unbroadcast). */
#include "ops/helpers.h"

/* ---- arithmetic */
static tg_tensor *binary_fwd(tg_op_ctx *ctx, tg_tensor *const *in, tg_kernel_id kid)
{
    tg_tensor *out = tg_op_ctx_new_output(ctx);
    if (out) tg__binary_kernel(kid, ctx->out_spec, in[0], in[1], tg__tensor_ptr(out));
    return out;
}

static tg_status finish(tg_tensor **gin, const tg_op_ctx *ctx)
{
    for (int i = 0; i < 2; i++)
        if (tg_op_ctx_needs_grad(ctx, i) && !gin[i]) return tg_last_error();
    return TG_OK;
}

static tg_status add_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    if (tg_op_ctx_needs_grad(ctx, 0)) gin[0] = tg__unbroadcast(g, tg_op_ctx_input_spec(ctx, 0));
    if (tg_op_ctx_needs_grad(ctx, 1)) gin[1] = tg__unbroadcast(g, tg_op_ctx_input_spec(ctx, 1));
    return finish(gin, ctx);
}

static tg_status sub_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    if (tg_op_ctx_needs_grad(ctx, 0)) gin[0] = tg__unbroadcast(g, tg_op_ctx_input_spec(ctx, 0));
    if (tg_op_ctx_needs_grad(ctx, 1)) gin[1] = tg__unbroadcast(tg_neg(g), tg_op_ctx_input_spec(ctx, 1));
    return finish(gin, ctx);
}

/* Whether g's first element is exactly 1 (f32, f64). */
static bool is_one(const tg_tensor *g)
{
    const void *p = tg__tensor_ptr(g);
    if (g->dtype == TG_F32) return *(const float *)p == 1.0f;
    if (g->dtype == TG_F64) return *(const double *)p == 1.0;
    return false;
}

/* g * v. A gradient that is one value broadcast (a sum's backward hands
 * down a stride-0 view) multiplies as a 0-d tensor, through the kernel's
 * scalar path, instead of being materialised first: the same products.
 * Under create_graph, when that value is an untracked 1 (the seed of a
 * sum's backward), the product is v itself, bit for bit: v is returned,
 * and neither this sweep nor the next one through the record runs a pass
 * of multiplications by 1. (Only where v records: there nothing writes a
 * gradient in place, so the gradient may be the forward value itself.) */
static tg_tensor *grad_times(tg_tensor *g, tg_tensor *v)
{
    bool bcast = g->numel > 1 && tg__same_shape(g->ndim, g->shape, v->ndim, v->shape);
    for (int d = 0; d < g->ndim && bcast; d++) bcast = g->strides[d] == 0;
    if (!bcast) return tg_mul(g, v);
    if (tg__records(v) && !g->tape && v->contiguous && v->dtype == g->dtype &&
        v->backend == g->backend && is_one(g))
        return tg__scope_track(tg_tensor_retain(v));
    tg_tensor *s = tg__scope_track(tg__tensor_view(g, 0, NULL, NULL, g->offset));
    return s ? tg_mul(v, s) : NULL;
}

/* a and b are one tensor's values (x * x): same data, layout and dtype. */
static bool same_values(const tg_tensor *a, const tg_tensor *b)
{
    if (a == b) return true;
    if (a->storage != b->storage || a->offset != b->offset || a->dtype != b->dtype ||
        !tg__same_shape(a->ndim, a->shape, b->ndim, b->shape))
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->strides[d] != b->strides[d]) return false;
    return true;
}

/* g * v written over g, when the engine gives g up (tg_op_ctx's
 * gout_scratch: g is untracked), nothing records the product (under
 * create_graph a tracked v must make a recorded mul) and nothing
 * broadcasts: the kernel with the operands in grad_times's order, so the
 * same products, without a new buffer. The caller's last use of g. */
static tg_tensor *grad_times_over(tg_op_ctx *ctx, tg_tensor *g, tg_tensor *v)
{
    if (!ctx->gout_scratch || tg__records(v) || !v->contiguous || v->dtype != g->dtype ||
        v->backend != g->backend || !tg__same_shape(g->ndim, g->shape, v->ndim, v->shape))
        return grad_times(g, v);
    ctx->gout_scratch = false;
    tg_spec sp;
    tg__spec_of(g, &sp);
    tg__binary_kernel(TG_K_MUL, &sp, g, v, tg__tensor_ptr(g));
    return tg__scope_track(tg_tensor_retain(g));
}

static tg_status mul_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    tg_tensor *a = tg_op_ctx_input(ctx, 0), *b = tg_op_ctx_input(ctx, 1);
    bool need0 = tg_op_ctx_needs_grad(ctx, 0), need1 = tg_op_ctx_needs_grad(ctx, 1);
    bool same = same_values(a, b);
    /* g is read last by the last product made: that one may go over it. */
    if (need0)
        gin[0] = tg__unbroadcast(need1 && !same ? grad_times(g, b) : grad_times_over(ctx, g, b),
                                 tg_op_ctx_input_spec(ctx, 0));
    /* x * x: both gradients are g * x, the same products: made once. */
    if (need1 && gin[0] && same)
        gin[1] = gin[0];
    else if (need1)
        gin[1] = tg__unbroadcast(grad_times_over(ctx, g, a), tg_op_ctx_input_spec(ctx, 1));
    return finish(gin, ctx);
}

/* d(a/b)/da = 1/b; d(a/b)/db = -a/b^2. */
static tg_status div_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    tg_tensor *a = tg_op_ctx_input(ctx, 0), *b = tg_op_ctx_input(ctx, 1);
    if (tg_op_ctx_needs_grad(ctx, 0)) gin[0] = tg__unbroadcast(tg_div(g, b), tg_op_ctx_input_spec(ctx, 0));
    if (tg_op_ctx_needs_grad(ctx, 1))
        gin[1] = tg__unbroadcast(tg_neg(tg_div(tg_mul(g, a), tg_mul(b, b))),
                             tg_op_ctx_input_spec(ctx, 1));
    return finish(gin, ctx);
}

/* Cases cover equal shapes, row/column broadcasts, rank promotion and a
 * scalar operand. b is kept away from zero for div. */
static int binary_sample(int k, tg_rng *rng, tg_tensor **in, bool b_nonzero)
{
    static const struct { int na; int64_t a[3]; int nb; int64_t b[3]; } cases[] = {
        {2, {3, 4}, 2, {3, 4}}, {2, {3, 4}, 1, {4}}, {2, {3, 1}, 2, {1, 4}},
        {3, {2, 3, 4}, 2, {3, 1}}, {1, {5}, 0, {0}}, {0, {0}, 2, {2, 3}},
    };
    if (k >= (int)(sizeof cases / sizeof cases[0])) return 0;
    in[0] = tg__sample_uniform(rng, cases[k].na, cases[k].a, -2.0, 2.0);
    in[1] = b_nonzero ? tg__sample_away_from_zero(rng, cases[k].nb, cases[k].b, 0.5, 2.0)
                      : tg__sample_uniform(rng, cases[k].nb, cases[k].b, -2.0, 2.0);
    return (in[0] && in[1]) ? 2 : -1;
}

#define BINARY_OP(lname, KID, math, saves_, nonzero)                                \
    static tg_tensor *lname##_fwd(tg_op_ctx *ctx, tg_tensor *const *in)             \
    {                                                                               \
        return binary_fwd(ctx, in, KID);                                            \
    }                                                                               \
    static int lname##_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)  \
    {                                                                               \
        (void)a;                                                                    \
        return binary_sample(k, rng, in, nonzero);                                  \
    }                                                                               \
    const tg_op tg__op_##lname = {                                                  \
        .name = #lname, .doc = math, .arity = 2, .shape = tg__shape_broadcast_float, \
        .forward = lname##_fwd, .backward = lname##_bwd, .cost = TG_COST_MEMORY_BOUND, \
        .saves = saves_, .flags = TG_OP_POINTWISE, .sample = lname##_sample,        \
    };

BINARY_OP(add, TG_K_ADD, "y = a + b", 0, false)
BINARY_OP(sub, TG_K_SUB, "y = a - b", 0, false)
BINARY_OP(mul, TG_K_MUL, "y = a * b", TG_SAVE_INPUT(0) | TG_SAVE_INPUT(1), false)
BINARY_OP(div, TG_K_DIV, "y = a / b", TG_SAVE_INPUT(0) | TG_SAVE_INPUT(1), true)

/* ---- comparisons: non-differentiable, any matching dtype */
static tg_status cmp_shape(const tg_op *op, const tg_op_attrs *attrs, tg_tensor *const *in,
                           tg_spec *out)
{
    (void)attrs;
    if (tg__need_same_dtype(op, in[0], in[1])) return TG_ERR_DTYPE;
    return tg__broadcast_spec(op, in[0], in[1], out);
}
static tg_tensor *gt_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    return binary_fwd(ctx, in, TG_K_GT);
}
static tg_tensor *eq_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    return binary_fwd(ctx, in, TG_K_EQ);
}
const tg_op tg__op_gt = {
    .name = "gt", .doc = "y = [a > b]", .arity = 2, .shape = cmp_shape, .forward = gt_fwd,
    .nondifferentiable = true, .cost = TG_COST_MEMORY_BOUND,
};
const tg_op tg__op_eq = {
    .name = "eq", .doc = "y = [a == b]", .arity = 2, .shape = cmp_shape, .forward = eq_fwd,
    .nondifferentiable = true, .cost = TG_COST_MEMORY_BOUND,
};

/* ---- minimum / maximum: the gradient goes to the selected operand, to a
 * on ties. b is selected where b < a (minimum) / b > a (maximum). */
static tg_status minmax_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin, bool is_max)
{
    tg_tensor *a = tg_op_ctx_input(ctx, 0), *b = tg_op_ctx_input(ctx, 1);
    tg_tensor *b_wins = is_max ? tg_gt(b, a) : tg_gt(a, b);
    if (tg_op_ctx_needs_grad(ctx, 0)) {
        gin[0] = tg__unbroadcast(tg_masked_fill(g, b_wins, 0.0), tg_op_ctx_input_spec(ctx, 0));
        if (!gin[0]) return tg_last_error();
    }
    if (tg_op_ctx_needs_grad(ctx, 1)) {
        tg_tensor *zero = tg__scalar(g->dtype, g->backend, 0.0);
        gin[1] = tg__unbroadcast(tg_where(b_wins, g, zero), tg_op_ctx_input_spec(ctx, 1));
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
        return binary_fwd(ctx, in, KID);                                            \
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
tg_tensor *tg_add(tg_tensor *a, tg_tensor *b) { return tg__call2(&tg__op_add, a, b, NULL); }
tg_tensor *tg_sub(tg_tensor *a, tg_tensor *b) { return tg__call2(&tg__op_sub, a, b, NULL); }
tg_tensor *tg_mul(tg_tensor *a, tg_tensor *b) { return tg__call2(&tg__op_mul, a, b, NULL); }
tg_tensor *tg_div(tg_tensor *a, tg_tensor *b) { return tg__call2(&tg__op_div, a, b, NULL); }
tg_tensor *tg_gt(tg_tensor *a, tg_tensor *b) { return tg__call2(&tg__op_gt, a, b, NULL); }
tg_tensor *tg_eq(tg_tensor *a, tg_tensor *b) { return tg__call2(&tg__op_eq, a, b, NULL); }
tg_tensor *tg_minimum(tg_tensor *a, tg_tensor *b) { return tg__call2(&tg__op_minimum, a, b, NULL); }
tg_tensor *tg_maximum(tg_tensor *a, tg_tensor *b) { return tg__call2(&tg__op_maximum, a, b, NULL); }
