/* cpu backend: elementwise loops shaped so the compiler vectorizes them
 * (restrict pointers, unit stride, no calls). Broadcasts other than the
 * two common fast paths fall back to the ref kernel kept in the table. */
#include <string.h>

#include "backend/kernels.h"

/* Selects on float compares (clamps, relu) only become vector blends when
 * the compiler may ignore FP exception flags, which nothing here reads. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

static tg_binary_fn ref_binary[TG_DTYPE_COUNT][6];

/* The loops below are compiled for AVX-512, AVX2 and baseline x86-64, the
 * CPU's best picked at load time (an ifunc). Their arithmetic is exact
 * IEEE operations, not contracted into FMAs (ISO C mode), so every variant
 * gives the same bits: unlike the math kernels (vmath.c), no choice of
 * variant is exposed. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__ELF__) && \
    !defined(__SANITIZE_ADDRESS__)
#define TG_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TG_CLONES
#endif

#define DEF_BIN(name, KI, T, DT, expr)                                              \
    TG_CLONES static void name(const tg_bcast *bc, const void *av, const void *bv, void *ov)  \
    {                                                                               \
        const T *a = av, *b = bv;                                                   \
        T *o = ov;                                                                  \
        int64_t n = bc->n;                                                          \
        if (bc->same) {                                                             \
            for (int64_t i = 0; i < n; i++) {                                       \
                T x = a[i], y = b[i];                                               \
                o[i] = (T)(expr);                                                   \
            }                                                                       \
        } else if (bc->b_scalar) {                                                  \
            const T y = b[0];                                                       \
            for (int64_t i = 0; i < n; i++) {                                       \
                T x = a[i];                                                         \
                o[i] = (T)(expr);                                                   \
            }                                                                       \
        } else if (bc->b_row) {                                                     \
            const int64_t m = bc->b_row;                                            \
            for (int64_t r = 0; r < n; r += m) {                                    \
                const T *ar = a + r;                                                \
                T *orow = o + r;                                                    \
                for (int64_t j = 0; j < m; j++) {                                   \
                    T x = ar[j], y = b[j];                                          \
                    orow[j] = (T)(expr);                                            \
                }                                                                   \
            }                                                                       \
        } else if (bc->a_row) {                                                     \
            const int64_t m = bc->a_row;                                            \
            for (int64_t r = 0; r < n; r += m) {                                    \
                const T *br = b + r;                                                \
                T *orow = o + r;                                                    \
                for (int64_t j = 0; j < m; j++) {                                   \
                    T x = a[j], y = br[j];                                          \
                    orow[j] = (T)(expr);                                            \
                }                                                                   \
            }                                                                       \
        } else {                                                                    \
            ref_binary[DT][KI](bc, av, bv, ov);                                     \
        }                                                                           \
    }

#define BIN_SET(T, SFX, DT)                                                         \
    DEF_BIN(add_##SFX, 0, T, DT, x + y)                                             \
    DEF_BIN(sub_##SFX, 1, T, DT, x - y)                                             \
    DEF_BIN(mul_##SFX, 2, T, DT, x * y)                                             \
    DEF_BIN(div_##SFX, 3, T, DT, x / y)

BIN_SET(float, f32, TG_F32)
BIN_SET(double, f64, TG_F64)

#define DEF_MAP(name, T, expr)                                                      \
    TG_CLONES static void name(int64_t n, const void *xv, void *yv, double p)                 \
    {                                                                               \
        const T *x = xv;                                                            \
        T *y = yv;                                                                  \
        const T q = (T)p;                                                           \
        (void)q;                                                                    \
        for (int64_t i = 0; i < n; i++) {                                           \
            T v = x[i];                                                             \
            y[i] = (T)(expr);                                                       \
        }                                                                           \
    }

#define DEF_GRADMAP(name, T, expr)                                                  \
    TG_CLONES static void name(int64_t n, const void *sv, const void *gyv, void *gxv, double p) \
    {                                                                               \
        const T *s = sv, *gy = gyv;                                                 \
        T *gx = gxv;                                                                \
        (void)p;                                                                    \
        for (int64_t i = 0; i < n; i++) {                                           \
            T v = s[i], g = gy[i];                                                  \
            gx[i] = (T)(expr);                                                      \
        }                                                                           \
    }

#define MAP_SET(T, SFX)                                                             \
    DEF_MAP(neg_##SFX, T, -v)                                                       \
    DEF_MAP(relu_##SFX, T, v > 0 ? v : (T)0)                                        \
    DEF_MAP(adds_##SFX, T, v + q)                                                   \
    DEF_MAP(muls_##SFX, T, v * q)                                                   \
    DEF_GRADMAP(tanh_grad_##SFX, T, g * ((T)1 - v * v))                             \
    DEF_GRADMAP(sigmoid_grad_##SFX, T, g * v * ((T)1 - v))                          \
    DEF_GRADMAP(relu_grad_##SFX, T, v > 0 ? g : (T)0)                               \
    DEF_GRADMAP(exp_grad_##SFX, T, g * v)

MAP_SET(float, f32)
MAP_SET(double, f64)

/* Strided gather into contiguous dst, a row (last dim) at a time: rows of
 * stride 1 are memcpy, stride 0 (a broadcast, e.g. a sum's gradient) a
 * fill, others a typed strided loop. */
#define DEF_COPY(name, T)                                                           \
    static void name(int ndim, const int64_t *shape, const int64_t *strides, const char *src, \
                     T *dst, int64_t n)                                             \
    {                                                                               \
        int64_t inner = ndim ? shape[ndim - 1] : 1, s = ndim ? strides[ndim - 1] : 0; \
        int64_t idx[TG_MAX_DIMS] = {0}, off = 0;                                    \
        if (inner == 0) return;                                                     \
        for (int64_t r = 0; r < n; r += inner) {                                    \
            const T *row = (const T *)src + off;                                    \
            T *out = dst + r;                                                       \
            if (s == 1) {                                                           \
                memcpy(out, row, (size_t)inner * sizeof(T));                        \
            } else if (s == 0) {                                                    \
                const T v = row[0];                                                 \
                for (int64_t j = 0; j < inner; j++) out[j] = v;                     \
            } else {                                                                \
                for (int64_t j = 0; j < inner; j++) out[j] = row[j * s];            \
            }                                                                       \
            for (int d = ndim - 2; d >= 0; d--) {                                   \
                off += strides[d];                                                  \
                if (++idx[d] < shape[d]) break;                                     \
                off -= strides[d] * shape[d];                                       \
                idx[d] = 0;                                                         \
            }                                                                       \
        }                                                                           \
    }

DEF_COPY(copy4, uint32_t)
DEF_COPY(copy8, uint64_t)

static tg_copy_strided_fn ref_copy;

static void copy_strided(int ndim, const int64_t *shape, const int64_t *strides, const void *src,
                         void *dst, size_t elem)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    if (n == 0) return;
    if (elem == 4)
        copy4(ndim, shape, strides, src, dst, n);
    else if (elem == 8)
        copy8(ndim, shape, strides, src, dst, n);
    else
        ref_copy(ndim, shape, strides, src, dst, elem);
}

void tg__cpu_elementwise_register(void)
{
    ref_copy = (tg_copy_strided_fn)tg__kernel(TG_K_COPY_STRIDED, TG_BACKEND_REF, TG_F32);
    for (int d = 0; d < TG_DTYPE_COUNT; d++)
        tg__kernel_set(TG_K_COPY_STRIDED, TG_BACKEND_CPU, (tg_dtype)d, (tg_kernel_fn)copy_strided);
    const tg_backend C = TG_BACKEND_CPU;
    static const tg_kernel_id bin_ids[4] = {TG_K_ADD, TG_K_SUB, TG_K_MUL, TG_K_DIV};
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 4; k++)
            ref_binary[d][k] = (tg_binary_fn)tg__kernel(bin_ids[k], TG_BACKEND_REF, (tg_dtype)d);
#define SET2(K, name)                                                               \
    tg__kernel_set(TG_K_##K, C, TG_F32, (tg_kernel_fn)name##_f32);                        \
    tg__kernel_set(TG_K_##K, C, TG_F64, (tg_kernel_fn)name##_f64);
    SET2(ADD, add) SET2(SUB, sub) SET2(MUL, mul) SET2(DIV, div)
    SET2(NEG, neg) SET2(RELU, relu) SET2(ADD_SCALAR, adds) SET2(MUL_SCALAR, muls)
    SET2(TANH_GRAD, tanh_grad) SET2(SIGMOID_GRAD, sigmoid_grad) SET2(RELU_GRAD, relu_grad)
    SET2(EXP_GRAD, exp_grad)
#undef SET2
}
