/* Elementwise ops: broadcasting binary arithmetic, unary maps, scalar
 * forms and comparisons, each with its backward. Unary backward runs one
 * fused kernel per op (gx = gy * f'(s)), registered as its own op
 * "<name>_backward" (differentiable ops built from it, user backward
 * functions and the backend tests call it through dispatch); the unary
 * ops' own backward runs that kernel directly where its operands are
 * contiguous (see fused_bwd). */
#include "ops/sample.h"

/* ---- fused unary backward ops: (s, gy) -> gx, s the saved input/output.
 * Unmarked: differentiating them (double backward) fails loudly. */
static tg_status grad_shape(const tg_op *op, const tg_op_attrs *attrs, tg_tensor *const *in,
                            tg_spec *out)
{
    (void)attrs;
    if (tg__need_float(op, 1, in[0]) || tg__need_same_dtype(op, in[0], in[1])) return TG_ERR_DTYPE;
    if (!tg__same_shape(in[0]->ndim, in[0]->shape, in[1]->ndim, in[1]->shape))
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (gradient shape differs from the "
                                     "saved tensor's)", op->name);
    tg__spec_of(in[0], out);
    return TG_OK;
}

/* The kernels that compute more than they stream: split across threads
 * from smaller sizes (tg__run_unary, tg__run_grad). */
static bool computes(tg_kernel_id kid)
{
    return kid == TG_K_EXP || kid == TG_K_LOG || kid == TG_K_TANH || kid == TG_K_SIGMOID ||
           kid == TG_K_POW || kid == TG_K_POW_GRAD;
}

/* gx = gy * f'(s) into gx, all three contiguous, of one dtype and shape. */
static void run_grad_kernel(tg_kernel_id kid, const tg_tensor *s, const tg_tensor *gy,
                            tg_tensor *gx, double scalar)
{
    tg__run_grad(TG_KERNEL(tg_grad_fn, kid, s), s->numel, tg__tensor_ptr(s), tg__tensor_ptr(gy),
                 tg__tensor_ptr(gx), scalar, tg__esize(s->dtype), computes(kid));
}

#define GRAD_OP(lname, KID, math)                                                   \
    static tg_tensor *lname##_backward_fwd(tg_op_ctx *ctx, tg_tensor *const *in)    \
    {                                                                               \
        tg_tensor *gx = tg_op_ctx_new_output(ctx);                                  \
        if (!gx) return NULL;                                                       \
        run_grad_kernel(KID, in[0], in[1], gx, ctx->attrs->scalar);                 \
        return gx;                                                                  \
    }                                                                               \
    const tg_op tg__op_##lname##_backward = {                                       \
        .name = #lname "_backward", .doc = math, .arity = 2, .shape = grad_shape,   \
        .forward = lname##_backward_fwd, .cost = TG_COST_MEMORY_BOUND,              \
    };

GRAD_OP(exp, TG_K_EXP_GRAD, "gx = gy * y (y = e^x)")
GRAD_OP(log, TG_K_LOG_GRAD, "gx = gy / x")
GRAD_OP(sqrt, TG_K_SQRT_GRAD, "gx = gy / (2 y)")
GRAD_OP(tanh, TG_K_TANH_GRAD, "gx = gy * (1 - y^2)")
GRAD_OP(sigmoid, TG_K_SIGMOID_GRAD, "gx = gy * y * (1 - y)")
GRAD_OP(relu, TG_K_RELU_GRAD, "gx = gy * [x > 0]")
GRAD_OP(pow, TG_K_POW_GRAD, "gx = gy * p * x^(p-1)")

/* ---- unary maps */
static tg_tensor *unary_fwd(tg_op_ctx *ctx, tg_tensor *const *in, tg_kernel_id kid)
{
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    tg__run_unary(TG_KERNEL(tg_unary_fn, kid, in[0]), in[0]->numel, tg__tensor_ptr(in[0]),
                  tg__tensor_ptr(y), ctx->attrs->scalar, tg__esize(in[0]->dtype), computes(kid));
    return y;
}

/* Backward through the fused op: s is the saved input or output. The
 * engine hands a backward a gout of its output's spec and s is the node's
 * own, so when both are contiguous (and on one backend) the kernel runs
 * here on a new tensor, without dispatch's checks and copies: on small
 * tensors those cost more than the kernel. Otherwise (a broadcast
 * gradient, say) through dispatch, which makes contiguous copies. */
static tg_status fused_bwd(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin, const tg_op *gop,
                           tg_kernel_id kid, bool from_output)
{
    tg_tensor *s = from_output ? tg_op_ctx_output(ctx) : tg_op_ctx_input(ctx, 0);
    if (s && gout && s->contiguous && gout->contiguous && s->dtype == gout->dtype &&
        s->backend == gout->backend &&
        tg__same_shape(s->ndim, s->shape, gout->ndim, gout->shape)) {
        tg_tensor *gx = tg__tensor_empty(s->dtype, s->ndim, s->shape, s->backend);
        if (!gx) return tg_last_error();
        run_grad_kernel(kid, s, gout, gx, ctx->attrs->scalar);
        gin[0] = tg__scope_track(gx);
        return TG_OK;
    }
    gin[0] = tg__call2(gop, s, gout, ctx->attrs);
    return gin[0] ? TG_OK : tg_last_error();
}

static int sample_unary(int k, tg_rng *rng, tg_tensor **in, double lo, double hi, bool away)
{
    static const int64_t shapes[3][3] = {{7, 0, 0}, {3, 4, 0}, {2, 3, 2}};
    if (k >= 4) return 0;
    if (k == 3) { /* scalar */
        in[0] = away ? tg__sample_away_from_zero(rng, 0, NULL, lo, hi)
                     : tg__sample_uniform(rng, 0, NULL, lo, hi);
    } else {
        in[0] = away ? tg__sample_away_from_zero(rng, k + 1, shapes[k], lo, hi)
                     : tg__sample_uniform(rng, k + 1, shapes[k], lo, hi);
    }
    return in[0] ? 1 : -1;
}

#define UNARY_OP(lname, KID, math, saves_, from_out, lo, hi, away)                 \
    static tg_tensor *lname##_fwd(tg_op_ctx *ctx, tg_tensor *const *in)             \
    {                                                                               \
        return unary_fwd(ctx, in, KID);                                             \
    }                                                                               \
    static tg_status lname##_bwd(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin)  \
    {                                                                               \
        return fused_bwd(ctx, gout, gin, &tg__op_##lname##_backward, KID##_GRAD, from_out); \
    }                                                                               \
    static int lname##_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)  \
    {                                                                               \
        (void)a;                                                                    \
        return sample_unary(k, rng, in, lo, hi, away);                              \
    }                                                                               \
    const tg_op tg__op_##lname = {                                                  \
        .name = #lname, .doc = math, .arity = 1, .shape = tg__shape_same_float,     \
        .forward = lname##_fwd, .backward = lname##_bwd, .cost = TG_COST_MEMORY_BOUND, \
        .saves = saves_, .flags = TG_OP_POINTWISE, .sample = lname##_sample,        \
    };

UNARY_OP(exp, TG_K_EXP, "y = e^x", TG_SAVE_OUTPUT, true, -2.0, 2.0, false)
UNARY_OP(log, TG_K_LOG, "y = ln x", TG_SAVE_INPUT(0), false, 0.2, 3.0, false)
UNARY_OP(sqrt, TG_K_SQRT, "y = sqrt x", TG_SAVE_OUTPUT, true, 0.2, 3.0, false)
UNARY_OP(tanh, TG_K_TANH, "y = tanh x", TG_SAVE_OUTPUT, true, -2.0, 2.0, false)
UNARY_OP(sigmoid, TG_K_SIGMOID, "y = 1 / (1 + e^-x)", TG_SAVE_OUTPUT, true, -3.0, 3.0, false)
UNARY_OP(relu, TG_K_RELU, "y = max(0, x)", TG_SAVE_INPUT(0), false, 0.05, 2.0, true)

/* pow: attrs.scalar is the exponent; bases sampled positive so any p works. */
static tg_tensor *pow_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    return unary_fwd(ctx, in, TG_K_POW);
}
static tg_status pow_bwd(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin)
{
    return fused_bwd(ctx, gout, gin, &tg__op_pow_backward, TG_K_POW_GRAD, false);
}
static int pow_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const double p[4] = {2.0, 3.0, -1.5, 0.5};
    a->scalar = p[k % 4];
    return sample_unary(k, rng, in, 0.3, 2.0, false);
}
const tg_op tg__op_pow_scalar = {
    .name = "pow_scalar", .doc = "y = x^p", .arity = 1, .shape = tg__shape_same_float,
    .forward = pow_fwd, .backward = pow_bwd, .cost = TG_COST_MEMORY_BOUND,
    .saves = TG_SAVE_INPUT(0), .flags = TG_OP_POINTWISE, .sample = pow_sample,
};

/* neg, add_scalar and mul_scalar need nothing saved. */
static tg_tensor *neg_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    return unary_fwd(ctx, in, TG_K_NEG);
}
static tg_status neg_bwd(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin)
{
    (void)ctx;
    gin[0] = tg_neg(gout);
    return gin[0] ? TG_OK : tg_last_error();
}
static int plain_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    a->scalar = k == 1 ? -0.75 : 2.5;
    return sample_unary(k, rng, in, -2.0, 2.0, false);
}
const tg_op tg__op_neg = {
    .name = "neg", .doc = "y = -x", .arity = 1, .shape = tg__shape_same_float,
    .forward = neg_fwd, .backward = neg_bwd, .cost = TG_COST_MEMORY_BOUND,
    .flags = TG_OP_POINTWISE, .sample = plain_sample,
};

static tg_tensor *add_scalar_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    return unary_fwd(ctx, in, TG_K_ADD_SCALAR);
}
static tg_status add_scalar_bwd(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin)
{
    (void)ctx;
    gin[0] = gout;
    return TG_OK;
}
const tg_op tg__op_add_scalar = {
    .name = "add_scalar", .doc = "y = x + s", .arity = 1, .shape = tg__shape_same_float,
    .forward = add_scalar_fwd, .backward = add_scalar_bwd, .cost = TG_COST_MEMORY_BOUND,
    .flags = TG_OP_POINTWISE, .sample = plain_sample,
};

static tg_tensor *mul_scalar_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    return unary_fwd(ctx, in, TG_K_MUL_SCALAR);
}
static tg_status mul_scalar_bwd(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin)
{
    gin[0] = tg_mul_scalar(gout, ctx->attrs->scalar);
    return gin[0] ? TG_OK : tg_last_error();
}
const tg_op tg__op_mul_scalar = {
    .name = "mul_scalar", .doc = "y = x * s", .arity = 1, .shape = tg__shape_same_float,
    .forward = mul_scalar_fwd, .backward = mul_scalar_bwd, .cost = TG_COST_MEMORY_BOUND,
    .flags = TG_OP_POINTWISE, .sample = plain_sample,
};

/* ---- binary, broadcasting */
void tg__binary_kernel(tg_kernel_id kid, const tg_spec *out_spec, const tg_tensor *a,
                       const tg_tensor *b, void *out)
{
    tg_bcast bc;
    tg__bcast_desc(out_spec, a, b, &bc);
    tg__run_binary(TG_KERNEL(tg_binary_fn, kid, a), &bc, tg__tensor_ptr((tg_tensor *)a),
                   tg__tensor_ptr((tg_tensor *)b), out, tg__esize(a->dtype));
}

static tg_tensor *binary_fwd(tg_op_ctx *ctx, tg_tensor *const *in, tg_kernel_id kid)
{
    tg_tensor *out = tg_op_ctx_new_output(ctx);
    if (out) tg__binary_kernel(kid, ctx->out_spec, in[0], in[1], tg__tensor_ptr(out));
    return out;
}

void tg__add_into(tg_tensor *dst, const tg_tensor *src)
{
    tg_spec sp;
    tg__spec_of(dst, &sp);
    tg__binary_kernel(TG_K_ADD, &sp, dst, src, tg__tensor_ptr(dst));
}

/* Reduces a gradient of the broadcast shape back to an input's shape. */
static tg_tensor *unbroadcast(tg_tensor *g, const tg_spec *to)
{
    if (!g) return NULL;
    if (tg__same_shape(g->ndim, g->shape, to->ndim, to->shape)) return g;
    return tg_sum_to(g, to->ndim, to->shape);
}

static tg_status finish(tg_tensor **gin, const tg_op_ctx *ctx)
{
    for (int i = 0; i < 2; i++)
        if (tg_op_ctx_needs_grad(ctx, i) && !gin[i]) return tg_last_error();
    return TG_OK;
}

static tg_status add_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    if (tg_op_ctx_needs_grad(ctx, 0)) gin[0] = unbroadcast(g, tg_op_ctx_input_spec(ctx, 0));
    if (tg_op_ctx_needs_grad(ctx, 1)) gin[1] = unbroadcast(g, tg_op_ctx_input_spec(ctx, 1));
    return finish(gin, ctx);
}

static tg_status sub_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    if (tg_op_ctx_needs_grad(ctx, 0)) gin[0] = unbroadcast(g, tg_op_ctx_input_spec(ctx, 0));
    if (tg_op_ctx_needs_grad(ctx, 1)) gin[1] = unbroadcast(tg_neg(g), tg_op_ctx_input_spec(ctx, 1));
    return finish(gin, ctx);
}

/* g * v. A gradient that is one value broadcast (a sum's backward hands
 * down a stride-0 view) multiplies as a 0-d tensor, through the kernel's
 * scalar path, instead of being materialised first: the same products. */
static tg_tensor *grad_times(tg_tensor *g, tg_tensor *v)
{
    bool bcast = g->numel > 1 && tg__same_shape(g->ndim, g->shape, v->ndim, v->shape);
    for (int d = 0; d < g->ndim && bcast; d++) bcast = g->strides[d] == 0;
    if (!bcast) return tg_mul(g, v);
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

static tg_status mul_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    tg_tensor *a = tg_op_ctx_input(ctx, 0), *b = tg_op_ctx_input(ctx, 1);
    if (tg_op_ctx_needs_grad(ctx, 0)) gin[0] = unbroadcast(grad_times(g, b), tg_op_ctx_input_spec(ctx, 0));
    /* x * x: both gradients are g * x, the same products: made once. */
    if (tg_op_ctx_needs_grad(ctx, 1) && gin[0] && same_values(a, b))
        gin[1] = gin[0];
    else if (tg_op_ctx_needs_grad(ctx, 1))
        gin[1] = unbroadcast(grad_times(g, a), tg_op_ctx_input_spec(ctx, 1));
    return finish(gin, ctx);
}

/* d(a/b)/da = 1/b; d(a/b)/db = -a/b^2. */
static tg_status div_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    tg_tensor *a = tg_op_ctx_input(ctx, 0), *b = tg_op_ctx_input(ctx, 1);
    if (tg_op_ctx_needs_grad(ctx, 0)) gin[0] = unbroadcast(tg_div(g, b), tg_op_ctx_input_spec(ctx, 0));
    if (tg_op_ctx_needs_grad(ctx, 1))
        gin[1] = unbroadcast(tg_neg(tg_div(tg_mul(g, a), tg_mul(b, b))),
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

/* ---- public wrappers */
tg_tensor *tg_add(tg_tensor *a, tg_tensor *b) { return tg__call2(&tg__op_add, a, b, NULL); }
tg_tensor *tg_sub(tg_tensor *a, tg_tensor *b) { return tg__call2(&tg__op_sub, a, b, NULL); }
tg_tensor *tg_mul(tg_tensor *a, tg_tensor *b) { return tg__call2(&tg__op_mul, a, b, NULL); }
tg_tensor *tg_div(tg_tensor *a, tg_tensor *b) { return tg__call2(&tg__op_div, a, b, NULL); }
tg_tensor *tg_gt(tg_tensor *a, tg_tensor *b) { return tg__call2(&tg__op_gt, a, b, NULL); }
tg_tensor *tg_eq(tg_tensor *a, tg_tensor *b) { return tg__call2(&tg__op_eq, a, b, NULL); }
tg_tensor *tg_neg(tg_tensor *x) { return tg__call1(&tg__op_neg, x, NULL); }
tg_tensor *tg_exp(tg_tensor *x) { return tg__call1(&tg__op_exp, x, NULL); }
tg_tensor *tg_log(tg_tensor *x) { return tg__call1(&tg__op_log, x, NULL); }
tg_tensor *tg_sqrt(tg_tensor *x) { return tg__call1(&tg__op_sqrt, x, NULL); }
tg_tensor *tg_tanh(tg_tensor *x) { return tg__call1(&tg__op_tanh, x, NULL); }
tg_tensor *tg_sigmoid(tg_tensor *x) { return tg__call1(&tg__op_sigmoid, x, NULL); }
tg_tensor *tg_relu(tg_tensor *x) { return tg__call1(&tg__op_relu, x, NULL); }

tg_tensor *tg_pow_scalar(tg_tensor *x, double p)
{
    tg_op_attrs a = {.scalar = p};
    return tg__call1(&tg__op_pow_scalar, x, &a);
}

tg_tensor *tg_add_scalar(tg_tensor *x, double s)
{
    tg_op_attrs a = {.scalar = s};
    return tg__call1(&tg__op_add_scalar, x, &a);
}

tg_tensor *tg_mul_scalar(tg_tensor *x, double s)
{
    tg_op_attrs a = {.scalar = s};
    return tg__call1(&tg__op_mul_scalar, x, &a);
}
