/* ref backend: elementwise kernels, written as plain loops for clarity.
 * They are the oracle the cpu backend is tested against. */
#include <math.h>
#include <string.h>

#include "backend/kernels.h"

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

#define UNARY_SET(T, SFX, EXPF, LOGF, SQRTF, TANHF, POWF)                          \
    DEF_UNARY(neg_##SFX, T, -v)                                                    \
    DEF_UNARY(exp_##SFX, T, EXPF(v))                                               \
    DEF_UNARY(log_##SFX, T, LOGF(v))                                               \
    DEF_UNARY(sqrt_##SFX, T, SQRTF(v))                                             \
    DEF_UNARY(tanh_##SFX, T, TANHF(v))                                             \
    DEF_UNARY(sigmoid_##SFX, T, v >= 0 ? (T)1 / ((T)1 + EXPF(-v)) : EXPF(v) / ((T)1 + EXPF(v))) \
    DEF_UNARY(relu_##SFX, T, v > 0 ? v : (T)0)                                     \
    DEF_UNARY(pow_##SFX, T, POWF(v, (T)p))                                         \
    DEF_UNARY(adds_##SFX, T, v + (T)p)                                             \
    DEF_UNARY(muls_##SFX, T, v * (T)p)                                             \
    DEF_GRAD(exp_grad_##SFX, T, g * v)             /* s = y */                     \
    DEF_GRAD(log_grad_##SFX, T, g / v)             /* s = x */                     \
    DEF_GRAD(sqrt_grad_##SFX, T, g * (T)0.5 / v)   /* s = y */                     \
    DEF_GRAD(tanh_grad_##SFX, T, g * ((T)1 - v * v)) /* s = y */                   \
    DEF_GRAD(sigmoid_grad_##SFX, T, g * v * ((T)1 - v)) /* s = y */                \
    DEF_GRAD(relu_grad_##SFX, T, v > 0 ? g : (T)0) /* s = x */                     \
    DEF_GRAD(pow_grad_##SFX, T, g * (T)p * POWF(v, (T)p - (T)1)) /* s = x */

UNARY_SET(float, f32, expf, logf, sqrtf, tanhf, powf)
UNARY_SET(double, f64, exp, log, sqrt, tanh, pow)

/* Binary maps over a broadcast description; the out index walks row-major
 * and the input offsets follow with a carry per dim. */
#define DEF_BINARY(name, T, expr)                                                  \
    static void name(const tg_bcast *bc, const void *av, const void *bv, void *ov) \
    {                                                                              \
        const T *a = av, *b = bv;                                                  \
        T *o = ov;                                                                 \
        int64_t idx[TG_MAX_DIMS] = {0}, ia = 0, ib = 0;                            \
        for (int64_t i = 0; i < bc->n; i++) {                                      \
            T x = a[ia], y = b[ib];                                                \
            o[i] = (T)(expr);                                                      \
            for (int d = bc->ndim - 1; d >= 0; d--) {                              \
                ia += bc->sa[d];                                                   \
                ib += bc->sb[d];                                                   \
                if (++idx[d] < bc->shape[d]) break;                                \
                ia -= bc->sa[d] * bc->shape[d];                                    \
                ib -= bc->sb[d] * bc->shape[d];                                    \
                idx[d] = 0;                                                        \
            }                                                                      \
        }                                                                          \
    }

#define BINARY_SET(T, SFX)                                                         \
    DEF_BINARY(add_##SFX, T, x + y)                                                \
    DEF_BINARY(sub_##SFX, T, x - y)                                                \
    DEF_BINARY(mul_##SFX, T, x * y)                                                \
    DEF_BINARY(div_##SFX, T, x / y)                                                \
    DEF_BINARY(gt_##SFX, T, x > y ? 1 : 0)                                         \
    DEF_BINARY(eq_##SFX, T, x == y ? 1 : 0)

BINARY_SET(float, f32)
BINARY_SET(double, f64)
BINARY_SET(int64_t, i64)

static void fill_f32(int64_t n, void *y, double v)
{
    for (int64_t i = 0; i < n; i++) ((float *)y)[i] = (float)v;
}
static void fill_f64(int64_t n, void *y, double v)
{
    for (int64_t i = 0; i < n; i++) ((double *)y)[i] = v;
}
static void fill_i64(int64_t n, void *y, double v)
{
    for (int64_t i = 0; i < n; i++) ((int64_t *)y)[i] = (int64_t)v;
}

static double load(const void *x, tg_dtype dt, int64_t i)
{
    switch (dt) {
    case TG_F32: return ((const float *)x)[i];
    case TG_F64: return ((const double *)x)[i];
    default: return (double)((const int64_t *)x)[i];
    }
}
static void cast_f32(int64_t n, const void *x, tg_dtype xdt, void *y)
{
    for (int64_t i = 0; i < n; i++) ((float *)y)[i] = (float)load(x, xdt, i);
}
static void cast_f64(int64_t n, const void *x, tg_dtype xdt, void *y)
{
    for (int64_t i = 0; i < n; i++) ((double *)y)[i] = load(x, xdt, i);
}
static void cast_i64(int64_t n, const void *x, tg_dtype xdt, void *y)
{
    for (int64_t i = 0; i < n; i++) ((int64_t *)y)[i] = (int64_t)load(x, xdt, i);
}

static void copy_strided(int ndim, const int64_t *shape, const int64_t *strides, const void *src,
                         void *dst, size_t elem)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    int64_t idx[TG_MAX_DIMS] = {0}, off = 0;
    const char *s = src;
    char *o = dst;
    for (int64_t i = 0; i < n; i++) {
        memcpy(o + (size_t)i * elem, s + (size_t)off * elem, elem);
        for (int d = ndim - 1; d >= 0; d--) {
            off += strides[d];
            if (++idx[d] < shape[d]) break;
            off -= strides[d] * shape[d];
            idx[d] = 0;
        }
    }
}

TG_INTERNAL void tg__ref_reduce_register(void);
TG_INTERNAL void tg__ref_gemm_register(void);

void tg__backend_ref_register(void)
{
    const tg_backend R = TG_BACKEND_REF;
#define SET2(K, name)                                                              \
    tg__kernel_set(TG_K_##K, R, TG_F32, (tg_kernel_fn)name##_f32);                       \
    tg__kernel_set(TG_K_##K, R, TG_F64, (tg_kernel_fn)name##_f64);
    SET2(NEG, neg) SET2(EXP, exp) SET2(LOG, log) SET2(SQRT, sqrt) SET2(TANH, tanh)
    SET2(SIGMOID, sigmoid) SET2(RELU, relu) SET2(POW, pow) SET2(ADD_SCALAR, adds)
    SET2(MUL_SCALAR, muls)
    SET2(EXP_GRAD, exp_grad) SET2(LOG_GRAD, log_grad) SET2(SQRT_GRAD, sqrt_grad)
    SET2(TANH_GRAD, tanh_grad) SET2(SIGMOID_GRAD, sigmoid_grad) SET2(RELU_GRAD, relu_grad)
    SET2(POW_GRAD, pow_grad)
    SET2(ADD, add) SET2(SUB, sub) SET2(MUL, mul) SET2(DIV, div) SET2(GT, gt) SET2(EQ, eq)
    SET2(FILL, fill) SET2(CAST, cast)
#undef SET2
    tg__kernel_set(TG_K_ADD, R, TG_I64, (tg_kernel_fn)add_i64);
    tg__kernel_set(TG_K_SUB, R, TG_I64, (tg_kernel_fn)sub_i64);
    tg__kernel_set(TG_K_MUL, R, TG_I64, (tg_kernel_fn)mul_i64);
    tg__kernel_set(TG_K_DIV, R, TG_I64, (tg_kernel_fn)div_i64);
    tg__kernel_set(TG_K_GT, R, TG_I64, (tg_kernel_fn)gt_i64);
    tg__kernel_set(TG_K_EQ, R, TG_I64, (tg_kernel_fn)eq_i64);
    tg__kernel_set(TG_K_FILL, R, TG_I64, (tg_kernel_fn)fill_i64);
    tg__kernel_set(TG_K_CAST, R, TG_I64, (tg_kernel_fn)cast_i64);
    for (int d = 0; d < TG_DTYPE_COUNT; d++)
        tg__kernel_set(TG_K_COPY_STRIDED, R, (tg_dtype)d, (tg_kernel_fn)copy_strided);
    tg__ref_reduce_register();
    tg__ref_gemm_register();
}
