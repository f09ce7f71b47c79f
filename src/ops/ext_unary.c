/* Extended elementwise maps: abs, clamp, gelu (exact erf form), silu,
 * leaky_relu, softplus, and dropout.
 *
 * Each map f runs one kernel forward and backs up through a fused op
 * "<name>_backward"(x, gy) -> gy * f'(x). Unlike the core fused backward
 * ops these are differentiable themselves (in gy they are linear, in x the
 * derivative is gy * f''(x), written with tg_* ops), so the sweep checks
 * them and a double backward works.
 *
 * Attrs: scalar is the first parameter (leaky_relu slope, clamp lo,
 * softplus beta); clamp's hi and softplus's threshold travel as bits in
 * ints[0] (tg__ext_put_f64). dropout: scalar p, flag training, ints[0] the
 * mask seed. */
#include <math.h>

#include "ops/ext_common.h"

static tg_tensor *map_fwd(tg_op_ctx *ctx, tg_tensor *const *in, tg_kernel_id kid, bool two)
{
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    const tg_op_attrs *a = ctx->attrs;
    if (two)
        TG_KERNEL(tg_unary2_fn, kid, in[0])(in[0]->numel, tg__tensor_ptr(in[0]), tg__tensor_ptr(y),
                                            a->scalar, tg__ext_get_f64(a, 0));
    else
        TG_KERNEL(tg_unary_fn, kid, in[0])(in[0]->numel, tg__tensor_ptr(in[0]), tg__tensor_ptr(y),
                                           a->scalar);
    return y;
}

/* ---- fused gradient ops (x, gy) -> gx */
static tg_status grad_shape(const tg_op *op, const tg_op_attrs *attrs, tg_tensor *const *in,
                            tg_spec *out)
{
    (void)attrs;
    if (tg__need_float(op, 1, in[0]) || tg__need_same_dtype(op, in[0], in[1])) return TG_ERR_DTYPE;
    if (!tg__same_shape(in[0]->ndim, in[0]->shape, in[1]->ndim, in[1]->shape)) {
        char s1[96], s2[96];
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (gradient %s differs from the "
                                     "input's %s)", op->name,
                       tg_shape_str(in[1]->ndim, in[1]->shape, s1, sizeof s1),
                       tg_shape_str(in[0]->ndim, in[0]->shape, s2, sizeof s2));
    }
    tg__spec_of(in[0], out);
    return TG_OK;
}

static tg_tensor *grad_fwd(tg_op_ctx *ctx, tg_tensor *const *in, tg_kernel_id kid, bool two)
{
    tg_tensor *gx = tg_op_ctx_new_output(ctx);
    if (!gx) return NULL;
    const tg_op_attrs *a = ctx->attrs;
    if (two)
        TG_KERNEL(tg_grad2_fn, kid, in[0])(in[0]->numel, tg__tensor_ptr(in[0]),
                                           tg__tensor_ptr(in[1]), tg__tensor_ptr(gx), a->scalar,
                                           tg__ext_get_f64(a, 0));
    else
        TG_KERNEL(tg_grad_fn, kid, in[0])(in[0]->numel, tg__tensor_ptr(in[0]), tg__tensor_ptr(in[1]),
                                          tg__tensor_ptr(gx), a->scalar);
    return gx;
}

/* f''(x) as tg_* ops (NULL for piecewise-linear maps: f'' = 0). */
typedef tg_tensor *(*second_fn)(tg_tensor *x, const tg_op_attrs *a);

/* gelu: f''(x) = phi(x) (2 - x^2), phi the standard normal density. */
static tg_tensor *gelu_f2(tg_tensor *x, const tg_op_attrs *a)
{
    (void)a;
    tg_tensor *x2 = tg_mul(x, x);
    tg_tensor *phi = tg_mul_scalar(tg_exp(tg_mul_scalar(x2, -0.5)), 0.39894228040143267794);
    return tg_mul(phi, tg_add_scalar(tg_neg(x2), 2.0));
}
/* silu: f''(x) = s (1 - s) (2 + x (1 - 2 s)), s = sigmoid(x). */
static tg_tensor *silu_f2(tg_tensor *x, const tg_op_attrs *a)
{
    (void)a;
    tg_tensor *s = tg_sigmoid(x);
    tg_tensor *ds = tg_mul(s, tg_add_scalar(tg_neg(s), 1.0));
    return tg_mul(ds, tg_add_scalar(tg_mul(x, tg_add_scalar(tg_mul_scalar(s, -2.0), 1.0)), 2.0));
}
/* softplus: f''(x) = beta s (1 - s), s = sigmoid(beta x); 0 past the
 * threshold, where f is the identity. */
static tg_tensor *softplus_f2(tg_tensor *x, const tg_op_attrs *a)
{
    tg_tensor *bx = tg_mul_scalar(x, a->scalar);
    tg_tensor *s = tg_sigmoid(bx);
    tg_tensor *f2 = tg_mul_scalar(tg_mul(s, tg_add_scalar(tg_neg(s), 1.0)), a->scalar);
    tg_tensor *thr = x ? tg__ext_scalar(x->dtype, x->backend, tg__ext_get_f64(a, 0)) : NULL;
    return tg_masked_fill(f2, tg_gt(bx, thr), 0.0);
}

/* d gx / d gy = f'(x) (the op again); d gx / d x = gy f''(x). */
static tg_status grad_bwd(tg_op_ctx *ctx, tg_tensor *gg, tg_tensor **gin, const tg_op *self,
                          second_fn f2)
{
    tg_tensor *x = tg_op_ctx_input(ctx, 0), *gy = tg_op_ctx_input(ctx, 1);
    if (tg_op_ctx_needs_grad(ctx, 0)) {
        gin[0] = f2 ? tg_mul(tg_mul(gg, gy), f2(x, ctx->attrs))
                    : tg__ext_full(tg_op_ctx_input_spec(ctx, 0), ctx->backend, 0.0);
        if (!gin[0]) return tg_last_error();
    }
    if (tg_op_ctx_needs_grad(ctx, 1)) {
        gin[1] = tg__call2(self, x, gg, ctx->attrs);
        if (!gin[1]) return tg_last_error();
    }
    return TG_OK;
}

/* Cases of a map: shapes (7), (3,4), (2,3,2) and a scalar, entries in
 * [lo, hi) away from the kinks; attrs from the map's parameter list. */
typedef struct map_params {
    double lo, hi;
    int nkinks;
    double kinks[2][2]; /* [case parity]: where f' jumps, for those params */
    bool two;
    double p[2], q[2];  /* parameters, alternating between cases */
} map_params;

static int map_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a, const map_params *m)
{
    static const struct { int n; int64_t s[3]; } shapes[4] = {
        {1, {7}}, {2, {3, 4}}, {3, {2, 3, 2}}, {0, {0}},
    };
    if (k >= 4) return 0;
    a->scalar = m->p[k % 2];
    if (m->two) tg__ext_put_f64(a, 0, m->q[k % 2]);
    in[0] = tg__ext_sample_avoiding(rng, shapes[k].n, shapes[k].s, m->lo, m->hi, m->nkinks,
                                    m->kinks[k % 2], 0.05);
    return in[0] ? 1 : -1;
}

/* Cases of a fused gradient op: x as for the map, gy uniform in [-1, 1). */
static int grad_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a, const map_params *m)
{
    if (k >= 2) return 0;
    int n = map_sample(k + 1, rng, in, a, m);
    if (n != 1) return n;
    in[1] = tg__sample_uniform(rng, in[0]->ndim, in[0]->shape, -1.0, 1.0);
    return in[1] ? 2 : -1;
}

/* One map and its fused gradient op. SAVES of the map: its input. */
#define MAP_OP(lname, KID, GKID, TWO, F2, math, gmath, ...)                         \
    static const map_params lname##_params = {__VA_ARGS__};                         \
    extern const tg_op tg__op_##lname##_backward;                                   \
    static tg_tensor *lname##_backward_fwd(tg_op_ctx *ctx, tg_tensor *const *in)    \
    {                                                                               \
        return grad_fwd(ctx, in, GKID, TWO);                                        \
    }                                                                               \
    static tg_status lname##_backward_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin) \
    {                                                                               \
        return grad_bwd(ctx, g, gin, &tg__op_##lname##_backward, F2);               \
    }                                                                               \
    static int lname##_backward_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a) \
    {                                                                               \
        return grad_sample(k, rng, in, a, &lname##_params);                         \
    }                                                                               \
    const tg_op tg__op_##lname##_backward = {                                       \
        .name = #lname "_backward", .doc = gmath, .arity = 2, .shape = grad_shape,  \
        .forward = lname##_backward_fwd, .backward = lname##_backward_bwd,          \
        .cost = TG_COST_MEMORY_BOUND, .saves = TG_SAVE_INPUT(0) | TG_SAVE_INPUT(1), \
        .sample = lname##_backward_sample,                                          \
    };                                                                              \
    static tg_tensor *lname##_fwd(tg_op_ctx *ctx, tg_tensor *const *in)             \
    {                                                                               \
        return map_fwd(ctx, in, KID, TWO);                                          \
    }                                                                               \
    static tg_status lname##_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)     \
    {                                                                               \
        gin[0] = tg__call2(&tg__op_##lname##_backward, tg_op_ctx_input(ctx, 0), g, ctx->attrs); \
        return gin[0] ? TG_OK : tg_last_error();                                    \
    }                                                                               \
    static int lname##_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)  \
    {                                                                               \
        return map_sample(k, rng, in, a, &lname##_params);                          \
    }                                                                               \
    const tg_op tg__op_##lname = {                                                  \
        .name = #lname, .doc = math, .arity = 1, .shape = tg__shape_same_float,     \
        .forward = lname##_fwd, .backward = lname##_bwd, .cost = TG_COST_MEMORY_BOUND, \
        .saves = TG_SAVE_INPUT(0), .flags = TG_OP_POINTWISE, .sample = lname##_sample, \
    };

MAP_OP(abs, TG_K_ABS, TG_K_ABS_GRAD, false, NULL, "y = |x|", "gx = gy * sign(x)",
       .lo = -2.0, .hi = 2.0, .nkinks = 1)
MAP_OP(gelu, TG_K_GELU, TG_K_GELU_GRAD, false, gelu_f2, "y = x * Phi(x) = x/2 (1 + erf(x/sqrt 2))",
       "gx = gy * (Phi(x) + x phi(x))", .lo = -3.0, .hi = 3.0)
MAP_OP(silu, TG_K_SILU, TG_K_SILU_GRAD, false, silu_f2, "y = x * sigmoid(x)",
       "gx = gy * s (1 + x (1 - s)), s = sigmoid(x)", .lo = -4.0, .hi = 4.0)
MAP_OP(leaky_relu, TG_K_LEAKY_RELU, TG_K_LEAKY_RELU_GRAD, false, NULL,
       "y = x > 0 ? x : slope * x", "gx = gy * (x > 0 ? 1 : slope)", .lo = -2.0, .hi = 2.0,
       .nkinks = 1, .p = {0.01, 0.2})
MAP_OP(clamp, TG_K_CLAMP, TG_K_CLAMP_GRAD, true, NULL, "y = min(max(x, lo), hi)",
       "gx = gy * [lo <= x <= hi]", .lo = -2.0, .hi = 2.0, .nkinks = 2, .two = true,
       .kinks = {{-0.5, 0.7}, {-1.2, 0.3}}, .p = {-0.5, -1.2}, .q = {0.7, 0.3})
MAP_OP(softplus, TG_K_SOFTPLUS, TG_K_SOFTPLUS_GRAD, true, softplus_f2,
       "y = log(1 + e^(beta x)) / beta; x where beta x > threshold",
       "gx = gy * sigmoid(beta x); gy past the threshold", .lo = -3.0, .hi = 3.0,
       .nkinks = 1, .kinks = {{20.0}, {0.5}}, .two = true, .p = {1.0, 2.0},
       .q = {20.0, 1.0})

/* ---- dropout: y = x * mask, mask = 1/(1-p) with probability 1-p, else 0,
 * drawn from the seed in attrs (so a recompute draws the same mask). The
 * mask is kept for backward (slot 0). Identity (a view) when not training
 * or p == 0. */
static tg_status dropout_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                               tg_spec *out)
{
    if (tg__need_float(op, 1, in[0])) return TG_ERR_DTYPE;
    if (!(a->scalar >= 0.0 && a->scalar <= 1.0))
        return tg__err(TG_ERR_INVALID, "bad argument #2 to '%s' (p = %g outside [0, 1])", op->name,
                       a->scalar);
    tg__spec_of(in[0], out);
    return TG_OK;
}

static bool dropout_active(const tg_op_attrs *a)
{
    return a->flag && a->scalar > 0.0;
}

static tg_tensor *dropout_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_tensor *x = in[0];
    const tg_op_attrs *a = ctx->attrs;
    if (!dropout_active(a)) return tg__tensor_view(x, x->ndim, x->shape, x->strides, x->offset);
    double scale = a->scalar < 1.0 ? 1.0 / (1.0 - a->scalar) : 0.0;
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    tg_tensor *mask = y ? tg__tensor_empty_spec(ctx->out_spec, x->backend) : NULL;
    if (!mask) {
        tg_tensor_release(y);
        return NULL;
    }
    TG_KERNEL(tg_dropout_mask_fn, TG_K_DROPOUT_MASK, x)(x->numel, (uint64_t)a->ints[0], a->scalar,
                                                        scale, tg__tensor_ptr(mask));
    tg_bcast bc;
    tg__bcast_desc(ctx->out_spec, x, mask, &bc);
    TG_KERNEL(tg_binary_fn, TG_K_MUL, x)(&bc, tg__tensor_ptr(x), tg__tensor_ptr(mask),
                                         tg__tensor_ptr(y));
    if (ctx->needs) tg_op_ctx_save(ctx, mask);
    tg_tensor_release(mask);
    return y;
}

static tg_status dropout_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    gin[0] = dropout_active(ctx->attrs) ? tg_mul(g, tg_op_ctx_saved(ctx, 0)) : g;
    return gin[0] ? TG_OK : tg_last_error();
}

static int dropout_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const struct { int n; int64_t s[3]; double p; int train; } c[] = {
        {2, {4, 5}, 0.3, 1}, {3, {2, 3, 2}, 0.5, 1}, {2, {3, 4}, 0.5, 0}, {1, {6}, 0.0, 1},
    };
    if (k >= 4) return 0;
    a->scalar = c[k].p;
    a->flag = c[k].train;
    a->nints = 1;
    a->ints[0] = (int64_t)(tg_rng_next(rng) >> 1);
    in[0] = tg__sample_uniform(rng, c[k].n, c[k].s, -2.0, 2.0);
    return in[0] ? 1 : -1;
}

const tg_op tg__op_dropout = {
    .name = "dropout", .doc = "y = x * mask / (1 - p), mask ~ Bernoulli(1 - p) from a seed",
    .arity = 1, .shape = dropout_shape, .forward = dropout_fwd, .backward = dropout_bwd,
    .cost = TG_COST_MEMORY_BOUND, .sample = dropout_sample,
};

/* ---- public wrappers */
tg_tensor *tg_abs(tg_tensor *x) { return tg__call1(&tg__op_abs, x, NULL); }
tg_tensor *tg_gelu(tg_tensor *x) { return tg__call1(&tg__op_gelu, x, NULL); }
tg_tensor *tg_silu(tg_tensor *x) { return tg__call1(&tg__op_silu, x, NULL); }

tg_tensor *tg_leaky_relu(tg_tensor *x, double slope)
{
    tg_op_attrs a = {.scalar = slope};
    return tg__call1(&tg__op_leaky_relu, x, &a);
}

tg_tensor *tg_clamp(tg_tensor *x, double lo, double hi)
{
    if (x && (isnan(lo) || isnan(hi))) {
        tg__err(TG_ERR_INVALID, "bad argument #%d to 'clamp' (bound is NaN)", isnan(lo) ? 2 : 3);
        return NULL;
    }
    tg_op_attrs a = {.scalar = lo, .nints = 1};
    tg__ext_put_f64(&a, 0, hi);
    return tg__call1(&tg__op_clamp, x, &a);
}

tg_tensor *tg_softplus(tg_tensor *x, double beta, double threshold)
{
    if (x && (!(beta > 0.0) || isnan(threshold))) {
        tg__err(TG_ERR_INVALID, "bad argument #%d to 'softplus' (beta %g, threshold %g; need "
                                "beta > 0)", !(beta > 0.0) ? 2 : 3, beta, threshold);
        return NULL;
    }
    tg_op_attrs a = {.scalar = beta, .nints = 1};
    tg__ext_put_f64(&a, 0, threshold);
    return tg__call1(&tg__op_softplus, x, &a);
}

tg_tensor *tg_dropout(tg_tensor *x, double p, bool training, tg_rng *rng)
{
    tg_op_attrs a = {.scalar = p, .flag = training, .nints = 1};
    if (x && training && p > 0.0 && p <= 1.0) {
        if (!rng) {
            tg__err(TG_ERR_NULL, "bad argument #4 to 'dropout' (NULL generator while training)");
            return NULL;
        }
        a.ints[0] = (int64_t)(tg_rng_next(rng) >> 1);
    }
    return tg__call1(&tg__op_dropout, x, &a);
}
