/* cpu backend: the binary arithmetic (add, sub, mul, div) and minimum /
 * maximum as unit-stride loops the compiler vectorizes: equal shapes, a
 * scalar b, and a row broadcast either way, the common cases
 * of a layer's bias and of a gradient's accumulation. Every other
 * broadcast runs ref's kernel, kept at registration: ref walks every
 * broadcast with a carry per dim. */
#include "backend/cpu/loops.h"

/* ref's kernels, [dtype][add, sub, mul, div, minimum, maximum] */
static tg_binary_fn ref_binary[2][6];

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

/* NaN in either operand gives NaN (the first one's), as ref does. */
#define MIN_EXPR(x, y) ((x) != (x) ? (x) : ((y) != (y) ? (y) : ((x) <= (y) ? (x) : (y))))
#define MAX_EXPR(x, y) ((x) != (x) ? (x) : ((y) != (y) ? (y) : ((x) >= (y) ? (x) : (y))))
DEF_BIN(minimum_f32, 4, float, TG_F32, MIN_EXPR(x, y))
DEF_BIN(maximum_f32, 5, float, TG_F32, MAX_EXPR(x, y))
DEF_BIN(minimum_f64, 4, double, TG_F64, MIN_EXPR(x, y))
DEF_BIN(maximum_f64, 5, double, TG_F64, MAX_EXPR(x, y))

/* The x * x and product-rule accumulation of a fused call's backward
 * (tg_mul_add_fn): one pass where mul and add kernels make two or three.
 * The loop per case keeps the branches out of the vectorised body. */
#define DEF_MUL_ADD(name, T)                                                        \
    TG_CLONES static void name(int64_t n, const void *pv, const void *gv, const void *av, \
                               void *ov, bool twice)                                \
    {                                                                               \
        const T *p = pv, *g = gv, *a = av;                                          \
        T *o = ov;                                                                  \
        if (p && twice) {                                                           \
            for (int64_t i = 0; i < n; i++) {                                       \
                T t = g[i] * a[i];                                                  \
                o[i] = (T)((T)(p[i] + t) + t);                                      \
            }                                                                       \
        } else if (p) {                                                             \
            for (int64_t i = 0; i < n; i++) o[i] = (T)(p[i] + (T)(g[i] * a[i]));      \
        } else if (twice) {                                                         \
            for (int64_t i = 0; i < n; i++) {                                       \
                T t = g[i] * a[i];                                                  \
                o[i] = (T)(t + t);                                                  \
            }                                                                       \
        } else {                                                                    \
            for (int64_t i = 0; i < n; i++) o[i] = (T)(g[i] * a[i]);                \
        }                                                                           \
    }
DEF_MUL_ADD(mul_add_f32, float)
DEF_MUL_ADD(mul_add_f64, double)

void tg__cpu_binary_register(void)
{
    const tg_backend C = TG_BACKEND_CPU;
    static const tg_kernel_id ids[6] = {TG_K_ADD, TG_K_SUB, TG_K_MUL, TG_K_DIV, TG_K_MINIMUM,
                                        TG_K_MAXIMUM};
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 6; k++)
            ref_binary[d][k] = (tg_binary_fn)tg__kernel(ids[k], TG_BACKEND_REF, (tg_dtype)d);
#define SET2(K, name)                                                               \
    tg__kernel_set(TG_K_##K, C, TG_F32, (tg_kernel_fn)name##_f32);                  \
    tg__kernel_set(TG_K_##K, C, TG_F64, (tg_kernel_fn)name##_f64);
    SET2(ADD, add) SET2(SUB, sub) SET2(MUL, mul) SET2(DIV, div)
    SET2(MINIMUM, minimum) SET2(MAXIMUM, maximum) SET2(MUL_ADD, mul_add)
#undef SET2
}
