/* ref backend: unary maps y = f(x; p) and their fused gradients
 * gx = gy * f'(s), plain loops written for clarity. They are the oracle
 * the cpu backend is tested against. */
#include <math.h>

#include "backend/kernels.h"

#define SQRT1_2 0.70710678118654752440 /* 1 / sqrt(2) */
#define INV_SQRT_2PI 0.39894228040143267794

/* One scalar definition per map, instantiated for float and double. */
#define DEF_UNARY(name, T, expr)                                                   \
    static void name(int64_t n, const void *xv, void *yv, double p)                \
    {                                                                              \
        const T *x = xv;                                                           \
        T *y = yv;                                                                 \
        (void)p;                                                                   \
        for (int64_t i = 0; i < n; i++) {                                          \
            T v = x[i];                                                            \
            y[i] = (T)(expr);                                                      \
        }                                                                          \
    }

#define DEF_GRAD(name, T, expr)                                                    \
    static void name(int64_t n, const void *sv, const void *gyv, void *gxv, double p) \
    {                                                                              \
        const T *s = sv, *gy = gyv;                                                \
        T *gx = gxv;                                                               \
        (void)p;                                                                   \
        for (int64_t i = 0; i < n; i++) {                                          \
            T v = s[i], g = gy[i];                                                 \
            gx[i] = (T)(expr);                                                     \
        }                                                                          \
    }

#define DEF_GG(name, T, expr)                                                      \
    static void name(int64_t n, const void *sv, const void *gyv, const void *ggv, void *gsv, \
                     double p)                                                     \
    {                                                                              \
        const T *s = sv, *gy = gyv, *gg = ggv;                                     \
        T *gs = gsv;                                                               \
        (void)p;                                                                   \
        for (int64_t i = 0; i < n; i++) {                                          \
            T v = s[i], g = gg[i] * gy[i];                                         \
            (void)v;                                                               \
            gs[i] = (T)(expr);                                                     \
        }                                                                          \
    }

#define DEF_UNARY2(name, T, expr)                                                  \
    static void name(int64_t n, const void *xv, void *yv, double p, double q)      \
    {                                                                              \
        const T *x = xv;                                                           \
        T *y = yv;                                                                 \
        for (int64_t i = 0; i < n; i++) {                                          \
            double v = (double)x[i];                                               \
            y[i] = (T)(expr);                                                      \
        }                                                                          \
    }
#define DEF_GRAD2(name, T, expr)                                                   \
    static void name(int64_t n, const void *sv, const void *gyv, void *gxv, double p, \
                     double q)                                                     \
    {                                                                              \
        const T *s = sv, *gy = gyv;                                                \
        T *gx = gxv;                                                               \
        for (int64_t i = 0; i < n; i++) {                                          \
            double v = (double)s[i], g = (double)gy[i];                            \
            gx[i] = (T)(expr);                                                     \
        }                                                                          \
    }

#define UNARY_SET(T, SFX, EXPF, LOGF, SQRTF, TANHF, POWF)                          \
    DEF_UNARY(neg_##SFX, T, -v)                                                    \
    DEF_UNARY(exp_##SFX, T, EXPF(v))                                               \
    DEF_UNARY(log_##SFX, T, LOGF(v))                                               \
    DEF_UNARY(sqrt_##SFX, T, SQRTF(v))                                             \
    DEF_UNARY(tanh_##SFX, T, TANHF(v))                                             \
    DEF_UNARY(sigmoid_##SFX, T, v >= 0 ? (T)1 / ((T)1 + EXPF(-v)) : EXPF(v) / ((T)1 + EXPF(v))) \
    DEF_UNARY(relu_##SFX, T, v <= 0 ? (T)0 : v)                                     \
    DEF_UNARY(pow_##SFX, T, POWF(v, (T)p))                                         \
    DEF_UNARY(adds_##SFX, T, v + (T)p)                                             \
    DEF_UNARY(muls_##SFX, T, v * (T)p)                                             \
    DEF_GRAD(exp_grad_##SFX, T, g * v)             /* s = y */                     \
    DEF_GRAD(log_grad_##SFX, T, g / v)             /* s = x */                     \
    DEF_GRAD(sqrt_grad_##SFX, T, g * (T)0.5 / v)   /* s = y */                     \
    DEF_GRAD(tanh_grad_##SFX, T, g * ((T)1 - v * v)) /* s = y */                   \
    DEF_GRAD(sigmoid_grad_##SFX, T, g * v * ((T)1 - v)) /* s = y */                \
    DEF_GRAD(relu_grad_##SFX, T, v <= 0 ? (T)0 : g) /* s = y */                     \
    DEF_GRAD(pow_grad_##SFX, T, g * (T)p * POWF(v, (T)p - (T)1)) /* s = x */      \
    DEF_GG(exp_gg_##SFX, T, g)                           /* f' = y */              \
    DEF_GG(log_gg_##SFX, T, -g / (v * v))                /* f' = 1/x */            \
    DEF_GG(sqrt_gg_##SFX, T, g * (T)-0.5 / (v * v))      /* f' = 1/(2y) */         \
    DEF_GG(tanh_gg_##SFX, T, g * (T)-2 * v)              /* f' = 1 - y^2 */        \
    DEF_GG(sigmoid_gg_##SFX, T, g * ((T)1 - (T)2 * v))   /* f' = y (1 - y) */      \
    DEF_GG(pow_gg_##SFX, T, g * (T)(p * (p - 1)) * POWF(v, (T)p - (T)2)) /* f' = p x^(p-1) */

UNARY_SET(float, f32, expf, logf, sqrtf, tanhf, powf)
UNARY_SET(double, f64, exp, log, sqrt, tanh, pow)

/* Stable logistic, softplus and clamp on doubles (ties of clamp keep the
 * gradient: lo <= x <= hi passes it, like PyTorch). */
static double sigm(double v)
{
    return v >= 0 ? 1.0 / (1.0 + exp(-v)) : exp(v) / (1.0 + exp(v));
}
static double softplus(double v, double beta, double thr)
{
    double b = beta * v;
    return b > thr ? v : (fmax(b, 0.0) + log1p(exp(-fabs(b)))) / beta;
}
static double clamp(double v, double lo, double hi)
{
    double t = v < lo ? lo : v;
    return t > hi ? hi : t;
}

#define ACTIVATION_SET(T, SFX, EXPF, ERFF, FABSF)                                       \
    DEF_UNARY(abs_##SFX, T, FABSF(v))                                              \
    DEF_UNARY(gelu_##SFX, T, (T)0.5 * v * ((T)1 + ERFF(v * (T)SQRT1_2)))          \
    DEF_UNARY(silu_##SFX, T, v * (T)sigm((double)v))                               \
    DEF_UNARY(leaky_##SFX, T, v > 0 ? v : v * (T)p)                                \
    DEF_GRAD(abs_grad_##SFX, T, v > 0 ? g : (v < 0 ? -g : (T)0))                   \
    DEF_GRAD(gelu_grad_##SFX, T,                                                   \
             g * ((T)0.5 * ((T)1 + ERFF(v * (T)SQRT1_2)) +                         \
                  v * (T)INV_SQRT_2PI * EXPF((T)-0.5 * v * v)))                    \
    DEF_GRAD(silu_grad_##SFX, T, g * (T)(sigm((double)v) * (1.0 + (double)v * (1.0 - sigm((double)v))))) \
    DEF_GRAD(leaky_grad_##SFX, T, v > 0 ? g : g * (T)p)                            \
    DEF_UNARY2(clamp_##SFX, T, clamp(v, p, q))                                     \
    DEF_UNARY2(softplus_##SFX, T, softplus(v, p, q))                               \
    DEF_GRAD2(clamp_grad_##SFX, T, (v >= p && v <= q) ? g : 0.0)                   \
    DEF_GRAD2(softplus_grad_##SFX, T, p * v > q ? g : g * sigm(p * v))

ACTIVATION_SET(float, f32, expf, erff, fabsf)
ACTIVATION_SET(double, f64, exp, erf, fabs)

#define TRIG_SET(T, SFX, SINF, COSF)                                               \
    DEF_UNARY(sin_##SFX, T, SINF(v))                                               \
    DEF_UNARY(cos_##SFX, T, COSF(v))                                               \
    DEF_GRAD(sin_grad_##SFX, T, g * COSF(v))  /* s = x */                          \
    DEF_GRAD(cos_grad_##SFX, T, -g * SINF(v)) /* s = x */

TRIG_SET(float, f32, sinf, cosf)
TRIG_SET(double, f64, sin, cos)

void tg__ref_unary_register(void)
{
    const tg_backend R = TG_BACKEND_REF;
#define SET2(K, name)                                                              \
    tg__kernel_set(TG_K_##K, R, TG_F32, (tg_kernel_fn)name##_f32);                 \
    tg__kernel_set(TG_K_##K, R, TG_F64, (tg_kernel_fn)name##_f64);
    SET2(NEG, neg) SET2(EXP, exp) SET2(LOG, log) SET2(SQRT, sqrt) SET2(TANH, tanh)
    SET2(SIGMOID, sigmoid) SET2(RELU, relu) SET2(POW, pow) SET2(ADD_SCALAR, adds)
    SET2(MUL_SCALAR, muls)
    SET2(EXP_GRAD, exp_grad) SET2(LOG_GRAD, log_grad) SET2(SQRT_GRAD, sqrt_grad)
    SET2(TANH_GRAD, tanh_grad) SET2(SIGMOID_GRAD, sigmoid_grad) SET2(RELU_GRAD, relu_grad)
    SET2(POW_GRAD, pow_grad)
    SET2(ABS, abs) SET2(GELU, gelu) SET2(SILU, silu) SET2(LEAKY_RELU, leaky)
    SET2(ABS_GRAD, abs_grad) SET2(GELU_GRAD, gelu_grad) SET2(SILU_GRAD, silu_grad)
    SET2(LEAKY_RELU_GRAD, leaky_grad)
    SET2(CLAMP, clamp) SET2(SOFTPLUS, softplus) SET2(CLAMP_GRAD, clamp_grad)
    SET2(SOFTPLUS_GRAD, softplus_grad)
    SET2(SIN, sin) SET2(COS, cos) SET2(SIN_GRAD, sin_grad) SET2(COS_GRAD, cos_grad)
    SET2(EXP_GG, exp_gg) SET2(LOG_GG, log_gg) SET2(SQRT_GG, sqrt_gg) SET2(TANH_GG, tanh_gg)
    SET2(SIGMOID_GG, sigmoid_gg) SET2(POW_GG, pow_gg)
#undef SET2
}
