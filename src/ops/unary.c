/* Unary elementwise ops, all written one way.
 *
 * A map y = f(x; p[, q]) is one unary_def: its kernel (tg_unary_fn, or
 * tg_unary2_fn with a second parameter q), its fused gradient kernel
 * gx = gy * f'(s) (s the saved input, or the output where f' is cheaper
 * from it), whether each kernel computes more than it streams (then the
 * thread pool splits it from smaller sizes), f'' written with tg_* ops,
 * and its gradcheck cases. UNARY_MAP makes two registry ops of it:
 *  - "<name>": forward runs the kernel through tg__run_unary; backward runs
 *    the fused kernel directly where s and the gradient are contiguous
 *    (dispatch's checks and copies cost more than the kernel on small
 *    tensors), through dispatch otherwise;
 *  - "<name>_backward"(s, gy) -> gx: the fused op, itself differentiable
 *    (linear in gy; in s its derivative is gy * f''(s)), so the sweep
 *    gradchecks it and a double backward works.
 * The linear maps (neg, add_scalar, mul_scalar) have no fused op: their
 * backward is the map again.
 *
 * Attrs: scalar is the first parameter (pow's exponent, leaky_relu's slope,
 * clamp's lo, softplus's beta, the scalar of add_scalar / mul_scalar); the
 * second (clamp's hi, softplus's threshold) travels as bits in ints[0]
 * (tg__attrs_put_f64). */
#include <math.h>

#include "ops/helpers.h"

/* d f'(s) / ds as tg_* ops (NULL: 0, the piecewise-linear maps). */
typedef tg_tensor *(*second_fn)(tg_tensor *s, const tg_op_attrs *a);

typedef struct unary_def {
    tg_kernel_id kid, gkid; /* the map's kernel, its fused gradient kernel */
    tg_kernel_id ggkid;     /* gy * f''(s) times gg in one pass (0: none, f2 only) */
    bool two;               /* a second parameter q (tg_unary2_fn, tg_grad2_fn) */
    bool from_output;       /* the gradient kernel reads y (else x) */
    second_fn f2;
    /* gradcheck cases: shapes (7), (3,4), (2,3,2) and a scalar, entries in
     * [lo, hi) (|x| there with a random sign if away) at least 0.05 from
     * the kinks (by case parity); nparams: attrs from p[k % 4] (and
     * q[k % 4] if two). The fused op's cases take s in [s_lo, s_hi) when
     * s is the output (else as the map's x), gy in [-1, 1). */
    double lo, hi;
    bool away;
    int nkinks;
    double kinks[2][2];
    int nparams;
    double p[4], q[4];
    double s_lo, s_hi;
} unary_def;

static TG_ALWAYS_INLINE void run_map(const unary_def *d, const tg_tensor *x, tg_tensor *y, const tg_op_attrs *a)
{
    size_t es = tg__esize(x->dtype);
    if (d->two)
        tg__run_unary2(TG_KERNEL(tg_unary2_fn, d->kid, x), x->numel, tg__tensor_ptr(x),
                       tg__tensor_ptr(y), a->scalar, tg__attrs_get_f64(a, 0), es);
    else
        tg__run_unary(TG_KERNEL(tg_unary_fn, d->kid, x), x->numel, tg__tensor_ptr(x),
                      tg__tensor_ptr(y), a->scalar, es);
}

/* gx = gy * f'(s), all three contiguous, of one dtype and shape. */
static TG_ALWAYS_INLINE void run_grad(const unary_def *d, const tg_tensor *s, const tg_tensor *gy, tg_tensor *gx,
                     const tg_op_attrs *a)
{
    size_t es = tg__esize(s->dtype);
    if (d->two)
        tg__run_grad2(TG_KERNEL(tg_grad2_fn, d->gkid, s), s->numel, tg__tensor_ptr(s),
                      tg__tensor_ptr(gy), tg__tensor_ptr(gx), a->scalar, tg__attrs_get_f64(a, 0),
                      es);
    else
        tg__run_grad(TG_KERNEL(tg_grad_fn, d->gkid, s), s->numel, tg__tensor_ptr(s),
                     tg__tensor_ptr(gy), tg__tensor_ptr(gx), a->scalar, es);
}

static tg_tensor *map_fwd(tg_op_ctx *ctx, tg_tensor *const *in, const unary_def *d)
{
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (y) run_map(d, in[0], y, ctx->attrs);
    return y;
}

/* The map's backward through its fused op gop. The engine hands a
 * backward a gout of its output's spec and s is the node's own, so when
 * both are contiguous (and on one backend) the kernel runs here on a new
 * tensor, without dispatch; otherwise (a broadcast gradient, say) through
 * dispatch, which makes contiguous copies. The same kernel either way. */
static tg_status map_bwd(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin, const tg_op *gop,
                         const unary_def *d)
{
    tg_tensor *s = d->from_output ? tg_op_ctx_output(ctx) : tg_op_ctx_input(ctx, 0);
    if (s && gout && !tg__records(s) && !tg__records(gout) && s->contiguous && gout->contiguous &&
        s->dtype == gout->dtype &&
        s->backend == gout->backend &&
        tg__same_shape(s->ndim, s->shape, gout->ndim, gout->shape)) {
        /* Over gout when the engine gives it up (each element reads its
         * own gout element before writing it: the same values). */
        tg_tensor *gx = ctx->gout_scratch ? tg_tensor_retain(gout)
                                          : tg__tensor_empty(s->dtype, s->ndim, s->shape,
                                                             s->backend);
        if (!gx) return tg_last_error();
        run_grad(d, s, gout, gx, ctx->attrs);
        gin[0] = tg__scope_track(gx);
        return TG_OK;
    }
    gin[0] = tg__call2(gop, s, gout, ctx->attrs);
    return gin[0] ? TG_OK : tg_last_error();
}

/* ---- the fused gradient ops (s, gy) -> gx */
static tg_status grad_shape(const tg_op *op, const tg_op_attrs *attrs, tg_tensor *const *in,
                            tg_spec *out)
{
    (void)attrs;
    if (tg__need_float(op, 1, in[0]) || tg__need_same_dtype(op, in[0], in[1])) return TG_ERR_DTYPE;
    if (!tg__same_shape(in[0]->ndim, in[0]->shape, in[1]->ndim, in[1]->shape)) {
        char s1[96], s2[96];
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (gradient %s differs from the "
                                     "saved tensor's %s)", op->name,
                       tg_shape_str(in[1]->ndim, in[1]->shape, s1, sizeof s1),
                       tg_shape_str(in[0]->ndim, in[0]->shape, s2, sizeof s2));
    }
    tg__spec_of(in[0], out);
    return TG_OK;
}

static tg_tensor *grad_fwd(tg_op_ctx *ctx, tg_tensor *const *in, const unary_def *d)
{
    tg_tensor *gx = tg_op_ctx_new_output(ctx);
    if (gx) run_grad(d, in[0], in[1], gx, ctx->attrs);
    return gx;
}

/* s, gy and gg contiguous, of one dtype, backend and shape, none recording. */
static bool fused_gg_fits(const tg_tensor *s, const tg_tensor *gy, const tg_tensor *gg)
{
    if (!s || !gy || !gg || tg__records(s) || tg__records(gy) || tg__records(gg)) return false;
    const tg_tensor *t[2] = {gy, gg};
    for (int i = 0; i < 2; i++)
        if (!t[i]->contiguous || t[i]->dtype != s->dtype || t[i]->backend != s->backend ||
            !tg__same_shape(s->ndim, s->shape, t[i]->ndim, t[i]->shape))
            return false;
    return s->contiguous;
}

/* d gx / d gy = f'(s) (the op again); d gx / d s = gy f''(s). */
static tg_status grad_bwd(tg_op_ctx *ctx, tg_tensor *gg, tg_tensor **gin, const tg_op *self,
                          const unary_def *d)
{
    tg_tensor *s = tg_op_ctx_input(ctx, 0), *gy = tg_op_ctx_input(ctx, 1);
    if (tg_op_ctx_needs_grad(ctx, 0) && d->ggkid && fused_gg_fits(s, gy, gg)) {
        /* What the composite below records, in one pass when nothing
         * records (a second sweep that is not itself create_graph). */
        gin[0] = tg__tensor_empty(s->dtype, s->ndim, s->shape, s->backend);
        if (!gin[0]) return tg_last_error();
        tg__run_gradgrad(TG_KERNEL(tg_gradgrad_fn, d->ggkid, s), s->numel, tg__tensor_ptr(s),
                         tg__tensor_ptr(gy), tg__tensor_ptr(gg), tg__tensor_ptr(gin[0]),
                         ctx->attrs->scalar, tg__esize(s->dtype));
        gin[0] = tg__scope_track(gin[0]);
    } else if (tg_op_ctx_needs_grad(ctx, 0)) {
        gin[0] = d->f2 ? tg_mul(tg_mul(gg, gy), d->f2(s, ctx->attrs))
                       : tg__full(tg_op_ctx_input_spec(ctx, 0), ctx->backend, 0.0);
        if (!gin[0]) return tg_last_error();
    }
    if (tg_op_ctx_needs_grad(ctx, 1)) {
        gin[1] = tg__call2(self, s, gg, ctx->attrs);
        if (!gin[1]) return tg_last_error();
    }
    return TG_OK;
}

/* ---- gradcheck cases */
static int map_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a, const unary_def *d)
{
    static const struct { int n; int64_t s[3]; } shapes[4] = {
        {1, {7}}, {2, {3, 4}}, {3, {2, 3, 2}}, {0, {0}},
    };
    if (k >= 4) return 0;
    if (d->nparams) a->scalar = d->p[k % 4];
    if (d->two) tg__attrs_put_f64(a, 0, d->q[k % 4]);
    if (d->away)
        in[0] = tg__sample_away_from_zero(rng, shapes[k].n, shapes[k].s, d->lo, d->hi);
    else
        in[0] = tg__sample_avoiding(rng, shapes[k].n, shapes[k].s, d->lo, d->hi, d->nkinks,
                                    d->kinks[k % 2], 0.05);
    return in[0] ? 1 : -1;
}

static int grad_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a, const unary_def *d)
{
    if (k >= 2) return 0;
    int n;
    if (d->from_output) {
        unary_def out = *d;
        out.lo = d->s_lo;
        out.hi = d->s_hi;
        out.away = d->away; /* relu: s of either sign, away from its kink at 0 */
        out.nkinks = 0;
        n = map_sample(k + 1, rng, in, a, &out);
    } else {
        n = map_sample(k + 1, rng, in, a, d);
    }
    if (n != 1) return n;
    in[1] = tg__sample_uniform(rng, in[0]->ndim, in[0]->shape, -1.0, 1.0);
    return in[1] ? 2 : -1;
}

/* ---- f'' of the maps, with tg_* ops */
static tg_tensor *ones_like(tg_tensor *s)
{
    if (!s) return NULL;
    tg_spec sp;
    tg__spec_of(s, &sp);
    return tg__full(&sp, s->backend, 1.0);
}
/* exp: f'(y) = y. */
static tg_tensor *exp_f2(tg_tensor *y, const tg_op_attrs *a)
{
    (void)a;
    return ones_like(y);
}
/* log: f'(x) = 1/x, f'' = -1/x^2. */
static tg_tensor *log_f2(tg_tensor *x, const tg_op_attrs *a)
{
    (void)a;
    return tg_mul_scalar(tg_pow_scalar(x, -2.0), -1.0);
}
/* sqrt: f'(y) = 1/(2y), d/dy = -1/(2y^2). */
static tg_tensor *sqrt_f2(tg_tensor *y, const tg_op_attrs *a)
{
    (void)a;
    return tg_mul_scalar(tg_pow_scalar(y, -2.0), -0.5);
}
/* tanh: f'(y) = 1 - y^2, d/dy = -2y. */
static tg_tensor *tanh_f2(tg_tensor *y, const tg_op_attrs *a)
{
    (void)a;
    return tg_mul_scalar(y, -2.0);
}
/* sigmoid: f'(y) = y (1 - y), d/dy = 1 - 2y. */
static tg_tensor *sigmoid_f2(tg_tensor *y, const tg_op_attrs *a)
{
    (void)a;
    return tg_add_scalar(tg_mul_scalar(y, -2.0), 1.0);
}
/* pow: f'(x) = p x^(p-1), f'' = p (p-1) x^(p-2). */
static tg_tensor *pow_f2(tg_tensor *x, const tg_op_attrs *a)
{
    return tg_mul_scalar(tg_pow_scalar(x, a->scalar - 2.0), a->scalar * (a->scalar - 1.0));
}
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
    tg_tensor *thr = x ? tg__scalar(x->dtype, x->backend, tg__attrs_get_f64(a, 0)) : NULL;
    return tg_masked_fill(f2, tg_gt(bx, thr), 0.0);
}
/* sin: f'(x) = cos x, f'' = -sin x; cos: f' = -sin x, f'' = -cos x. */
static tg_tensor *sin_f2(tg_tensor *x, const tg_op_attrs *a)
{
    (void)a;
    return tg_neg(tg_sin(x));
}
static tg_tensor *cos_f2(tg_tensor *x, const tg_op_attrs *a)
{
    (void)a;
    return tg_neg(tg_cos(x));
}

/* One map and its fused gradient op, from the unary_def initialisers;
 * saves_: TG_SAVE_OUTPUT where from_output, else TG_SAVE_INPUT(0). */
#define UNARY_MAP(lname, opname, saves_, math, gmath, ...)                                  \
    static const unary_def lname##_def = {__VA_ARGS__};                             \
    extern const tg_op tg__op_##lname##_backward;                                   \
    static tg_tensor *lname##_backward_fwd(tg_op_ctx *ctx, tg_tensor *const *in)    \
    {                                                                               \
        return grad_fwd(ctx, in, &lname##_def);                                     \
    }                                                                               \
    static tg_status lname##_backward_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin) \
    {                                                                               \
        return grad_bwd(ctx, g, gin, &tg__op_##lname##_backward, &lname##_def);     \
    }                                                                               \
    static int lname##_backward_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a) \
    {                                                                               \
        return grad_sample(k, rng, in, a, &lname##_def);                            \
    }                                                                               \
    const tg_op tg__op_##lname##_backward = {                                       \
        .name = #lname "_backward", .doc = gmath, .arity = 2, .shape = grad_shape,  \
        .forward = lname##_backward_fwd, .backward = lname##_backward_bwd,          \
        .cost = TG_COST_MEMORY_BOUND, .saves = TG_SAVE_INPUT(0) | TG_SAVE_INPUT(1), \
        .flags = TG_OP_POINTWISE, .sample = lname##_backward_sample,                \
    };                                                                              \
    static tg_tensor *lname##_fwd(tg_op_ctx *ctx, tg_tensor *const *in)             \
    {                                                                               \
        return map_fwd(ctx, in, &lname##_def);                                      \
    }                                                                               \
    static tg_status lname##_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)     \
    {                                                                               \
        return map_bwd(ctx, g, gin, &tg__op_##lname##_backward, &lname##_def);      \
    }                                                                               \
    static int lname##_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)  \
    {                                                                               \
        return map_sample(k, rng, in, a, &lname##_def);                             \
    }                                                                               \
    const tg_op tg__op_##opname = {                                                 \
        .name = #opname, .doc = math, .arity = 1, .shape = tg__shape_same_float,    \
        .forward = lname##_fwd, .backward = lname##_bwd, .cost = TG_COST_MEMORY_BOUND, \
        .saves = saves_, .flags = TG_OP_POINTWISE, .sample = lname##_sample,        \
    };

UNARY_MAP(exp, exp, TG_SAVE_OUTPUT,
          "y = e^x", "gx = gy * y (y = e^x)", .kid = TG_K_EXP,
          .gkid = TG_K_EXP_GRAD, .ggkid = TG_K_EXP_GG, .from_output = true, .f2 = exp_f2, .lo = -2.0,
          .hi = 2.0, .s_lo = 0.1, .s_hi = 3.0)
UNARY_MAP(log, log, TG_SAVE_INPUT(0),
          "y = ln x", "gx = gy / x", .kid = TG_K_LOG, .gkid = TG_K_LOG_GRAD, .ggkid = TG_K_LOG_GG,
          .f2 = log_f2, .lo = 0.2, .hi = 3.0)
UNARY_MAP(sqrt, sqrt, TG_SAVE_OUTPUT,
          "y = sqrt x", "gx = gy / (2 y)", .kid = TG_K_SQRT,
          .gkid = TG_K_SQRT_GRAD, .ggkid = TG_K_SQRT_GG, .from_output = true, .f2 = sqrt_f2, .lo = 0.2, .hi = 3.0,
          .s_lo = 0.2, .s_hi = 3.0)
UNARY_MAP(tanh, tanh, TG_SAVE_OUTPUT,
          "y = tanh x", "gx = gy * (1 - y^2)", .kid = TG_K_TANH,
          .gkid = TG_K_TANH_GRAD, .ggkid = TG_K_TANH_GG, .from_output = true, .f2 = tanh_f2, .lo = -2.0,
          .hi = 2.0, .s_lo = -0.95, .s_hi = 0.95)
UNARY_MAP(sigmoid, sigmoid, TG_SAVE_OUTPUT,
          "y = 1 / (1 + e^-x)", "gx = gy * y * (1 - y)",
          .kid = TG_K_SIGMOID, .gkid = TG_K_SIGMOID_GRAD, .ggkid = TG_K_SIGMOID_GG, .from_output = true,
          .f2 = sigmoid_f2, .lo = -3.0, .hi = 3.0, .s_lo = 0.05, .s_hi = 0.95)
/* relu saves its output (y > 0 exactly when x > 0, so the same bits):
 * the input, a linear layer's output in most models, then need not outlive
 * the forward, and a layer costs one saved activation, not two. */
UNARY_MAP(relu, relu, TG_SAVE_OUTPUT,
          "y = max(0, x)", "gx = gy * [y > 0]", .kid = TG_K_RELU,
          .gkid = TG_K_RELU_GRAD, .from_output = true, .lo = 0.05, .hi = 2.0, .away = true,
          .s_lo = 0.05, .s_hi = 2.0)
/* pow: bases sampled positive so any p works. */
UNARY_MAP(pow, pow_scalar, TG_SAVE_INPUT(0),
          "y = x^p", "gx = gy * p * x^(p-1)", .kid = TG_K_POW,
          .gkid = TG_K_POW_GRAD, .ggkid = TG_K_POW_GG, .f2 = pow_f2, .lo = 0.3,
          .hi = 2.0, .nparams = 1, .p = {2.0, 3.0, -1.5, 0.5})
UNARY_MAP(abs, abs, TG_SAVE_INPUT(0),
          "y = |x|", "gx = gy * sign(x)", .kid = TG_K_ABS, .gkid = TG_K_ABS_GRAD,
          .lo = -2.0, .hi = 2.0, .nkinks = 1)
UNARY_MAP(gelu, gelu, TG_SAVE_INPUT(0),
          "y = x * Phi(x) = x/2 (1 + erf(x/sqrt 2))", "gx = gy * (Phi(x) + x phi(x))",
          .kid = TG_K_GELU, .gkid = TG_K_GELU_GRAD, .f2 = gelu_f2, .lo = -3.0, .hi = 3.0)
UNARY_MAP(silu, silu, TG_SAVE_INPUT(0),
          "y = x * sigmoid(x)", "gx = gy * s (1 + x (1 - s)), s = sigmoid(x)",
          .kid = TG_K_SILU, .gkid = TG_K_SILU_GRAD, .f2 = silu_f2, .lo = -4.0, .hi = 4.0)
UNARY_MAP(leaky_relu, leaky_relu, TG_SAVE_INPUT(0),
          "y = x > 0 ? x : slope * x", "gx = gy * (x > 0 ? 1 : slope)",
          .kid = TG_K_LEAKY_RELU, .gkid = TG_K_LEAKY_RELU_GRAD, .lo = -2.0, .hi = 2.0,
          .nkinks = 1, .nparams = 1, .p = {0.01, 0.2, 0.01, 0.2})
UNARY_MAP(clamp, clamp, TG_SAVE_INPUT(0),
          "y = min(max(x, lo), hi)", "gx = gy * [lo <= x <= hi]",
          .kid = TG_K_CLAMP, .gkid = TG_K_CLAMP_GRAD, .two = true, .lo = -2.0, .hi = 2.0,
          .nkinks = 2, .kinks = {{-0.5, 0.7}, {-1.2, 0.3}}, .nparams = 1,
          .p = {-0.5, -1.2, -0.5, -1.2}, .q = {0.7, 0.3, 0.7, 0.3})
UNARY_MAP(softplus, softplus, TG_SAVE_INPUT(0),
          "y = log(1 + e^(beta x)) / beta; x where beta x > threshold",
          "gx = gy * sigmoid(beta x); gy past the threshold", .kid = TG_K_SOFTPLUS,
          .gkid = TG_K_SOFTPLUS_GRAD, .two = true, .f2 = softplus_f2, .lo = -3.0, .hi = 3.0,
          .nkinks = 1, .kinks = {{20.0}, {0.5}},
          .nparams = 1, .p = {1.0, 2.0, 1.0, 2.0}, .q = {20.0, 1.0, 20.0, 1.0})
UNARY_MAP(sin, sin, TG_SAVE_INPUT(0),
          "y = sin x", "gx = gy * cos x", .kid = TG_K_SIN, .gkid = TG_K_SIN_GRAD, .f2 = sin_f2,
          .lo = -3.0, .hi = 3.0)
UNARY_MAP(cos, cos, TG_SAVE_INPUT(0),
          "y = cos x", "gx = -gy * sin x", .kid = TG_K_COS, .gkid = TG_K_COS_GRAD, .f2 = cos_f2,
          .lo = -3.0, .hi = 3.0)

/* ---- linear maps: no fused op, the backward is the map again */
static const unary_def linear_cases = {
    .lo = -2.0, .hi = 2.0, .nparams = 1, .p = {2.5, -0.75, 2.5, 2.5},
};

#define LINEAR_MAP(lname, KID, math)                                                \
    static const unary_def lname##_def = {.kid = KID};                              \
    static tg_tensor *lname##_fwd(tg_op_ctx *ctx, tg_tensor *const *in)             \
    {                                                                               \
        return map_fwd(ctx, in, &lname##_def);                                      \
    }                                                                               \
    static int lname##_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)  \
    {                                                                               \
        return map_sample(k, rng, in, a, &linear_cases);                            \
    }                                                                               \
    const tg_op tg__op_##lname = {                                                  \
        .name = #lname, .doc = math, .arity = 1, .shape = tg__shape_same_float,     \
        .forward = lname##_fwd, .backward = lname##_bwd, .cost = TG_COST_MEMORY_BOUND, \
        .flags = TG_OP_POINTWISE, .sample = lname##_sample,                         \
    };

static tg_status neg_bwd(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin)
{
    (void)ctx;
    gin[0] = tg_neg(gout);
    return gin[0] ? TG_OK : tg_last_error();
}
static tg_status add_scalar_bwd(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin)
{
    (void)ctx;
    gin[0] = gout;
    return TG_OK;
}
static tg_status mul_scalar_bwd(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin)
{
    gin[0] = tg_mul_scalar(gout, ctx->attrs->scalar);
    return gin[0] ? TG_OK : tg_last_error();
}

LINEAR_MAP(neg, TG_K_NEG, "y = -x")
LINEAR_MAP(add_scalar, TG_K_ADD_SCALAR, "y = x + s")
LINEAR_MAP(mul_scalar, TG_K_MUL_SCALAR, "y = x * s")

/* ---- the maps for the fused interpreter (helpers.h) */
static const struct {
    const tg_op *op, *gop;
    const unary_def *def;
} map_table[] = {
#define MAP_ENTRY(lname, opname) {&tg__op_##opname, &tg__op_##lname##_backward, &lname##_def},
    MAP_ENTRY(exp, exp) MAP_ENTRY(log, log) MAP_ENTRY(sqrt, sqrt) MAP_ENTRY(tanh, tanh)
    MAP_ENTRY(sigmoid, sigmoid) MAP_ENTRY(relu, relu) MAP_ENTRY(pow, pow_scalar)
    MAP_ENTRY(abs, abs) MAP_ENTRY(gelu, gelu) MAP_ENTRY(silu, silu)
    MAP_ENTRY(leaky_relu, leaky_relu) MAP_ENTRY(clamp, clamp) MAP_ENTRY(softplus, softplus)
    MAP_ENTRY(sin, sin) MAP_ENTRY(cos, cos)
#undef MAP_ENTRY
    {&tg__op_neg, NULL, &neg_def}, {&tg__op_add_scalar, NULL, &add_scalar_def},
    {&tg__op_mul_scalar, NULL, &mul_scalar_def},
};

bool tg__map_info_of(const tg_op *op, tg__map_info *out)
{
    for (size_t i = 0; i < sizeof map_table / sizeof map_table[0]; i++)
        if (map_table[i].op == op) {
            const unary_def *d = map_table[i].def;
            *out = (tg__map_info){.op = op, .gop = map_table[i].gop, .kid = d->kid,
                                  .gkid = d->gkid, .two = d->two, .from_output = d->from_output};
            return true;
        }
    return false;
}

/* ---- public wrappers */
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

tg_tensor *tg_abs(tg_tensor *x) { return tg__call1(&tg__op_abs, x, NULL); }
tg_tensor *tg_gelu(tg_tensor *x) { return tg__call1(&tg__op_gelu, x, NULL); }
tg_tensor *tg_silu(tg_tensor *x) { return tg__call1(&tg__op_silu, x, NULL); }
tg_tensor *tg_sin(tg_tensor *x) { return tg__call1(&tg__op_sin, x, NULL); }
tg_tensor *tg_cos(tg_tensor *x) { return tg__call1(&tg__op_cos, x, NULL); }

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
    tg__attrs_put_f64(&a, 0, hi);
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
    tg__attrs_put_f64(&a, 0, threshold);
    return tg__call1(&tg__op_softplus, x, &a);
}
