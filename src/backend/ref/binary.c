/* ref backend: binary maps (arithmetic, compares, minimum/maximum), plain
 * loops written for clarity. */
#include "backend/kernels.h"

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

/* minimum / maximum (NaN propagates) */
DEF_BINARY(minimum_f32, float, x != x ? x : (y != y ? y : (x <= y ? x : y)))
DEF_BINARY(minimum_f64, double, x != x ? x : (y != y ? y : (x <= y ? x : y)))
DEF_BINARY(maximum_f32, float, x != x ? x : (y != y ? y : (x >= y ? x : y)))
DEF_BINARY(maximum_f64, double, x != x ? x : (y != y ? y : (x >= y ? x : y)))

#define DEF_MUL_ADD(name, T)                                                       \
    static void name(int64_t n, const void *pv, const void *gv, const void *av, void *ov, \
                     bool twice)                                                   \
    {                                                                              \
        const T *p = pv, *g = gv, *a = av;                                         \
        T *o = ov;                                                                 \
        for (int64_t i = 0; i < n; i++) {                                          \
            T t = g[i] * a[i];                                                     \
            T r = p ? (T)(p[i] + t) : t;                                           \
            o[i] = twice ? (T)(r + t) : r;                                         \
        }                                                                          \
    }
DEF_MUL_ADD(mul_add_f32, float)
DEF_MUL_ADD(mul_add_f64, double)

void tg__ref_binary_register(void)
{
    const tg_backend R = TG_BACKEND_REF;
#define SET2(K, name)                                                              \
    tg__kernel_set(TG_K_##K, R, TG_F32, (tg_kernel_fn)name##_f32);                 \
    tg__kernel_set(TG_K_##K, R, TG_F64, (tg_kernel_fn)name##_f64);
    SET2(ADD, add) SET2(SUB, sub) SET2(MUL, mul) SET2(DIV, div) SET2(GT, gt) SET2(EQ, eq)
    SET2(MINIMUM, minimum) SET2(MAXIMUM, maximum) SET2(MUL_ADD, mul_add)
#undef SET2
    tg__kernel_set(TG_K_ADD, R, TG_I64, (tg_kernel_fn)add_i64);
    tg__kernel_set(TG_K_SUB, R, TG_I64, (tg_kernel_fn)sub_i64);
    tg__kernel_set(TG_K_MUL, R, TG_I64, (tg_kernel_fn)mul_i64);
    tg__kernel_set(TG_K_DIV, R, TG_I64, (tg_kernel_fn)div_i64);
    tg__kernel_set(TG_K_GT, R, TG_I64, (tg_kernel_fn)gt_i64);
    tg__kernel_set(TG_K_EQ, R, TG_I64, (tg_kernel_fn)eq_i64);
}
