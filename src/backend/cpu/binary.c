/* cpu backend: minimum/maximum overrides (add/sub/mul/div are in
 * elementwise.c). Everything else runs ref's entries (copied into cpu's
 * table first). Why these: ref walks every broadcast with a carry
 * per dim, while the equal-shape and scalar cases are unit-stride loops the
 * compiler vectorizes (relu-like max(x, 0) clamps are common). */
#include "backend/kernels.h"

static tg_binary_fn ref_minmax[2][2]; /* [dtype][0 min, 1 max] */

#define DEF_MINMAX(name, KI, T, DT, CMP)                                            \
    static void name(const tg_bcast *bc, const void *av, const void *bv, void *ov)  \
    {                                                                               \
        const T *a = av, *b = bv;                                 \
        T *o = ov;                                                         \
        int64_t n = bc->n;                                                          \
        if (bc->same) {                                                             \
            for (int64_t i = 0; i < n; i++) {                                       \
                T x = a[i], y = b[i];                                               \
                o[i] = x != x ? x : (y != y ? y : (x CMP y ? x : y));               \
            }                                                                       \
        } else if (bc->b_scalar) {                                                  \
            const T y = b[0];                                                       \
            for (int64_t i = 0; i < n; i++) {                                       \
                T x = a[i];                                                         \
                o[i] = x != x ? x : (y != y ? y : (x CMP y ? x : y));               \
            }                                                                       \
        } else {                                                                    \
            ref_minmax[DT][KI](bc, av, bv, ov);                                     \
        }                                                                           \
    }

DEF_MINMAX(minimum_f32, 0, float, TG_F32, <=)
DEF_MINMAX(maximum_f32, 1, float, TG_F32, >=)
DEF_MINMAX(minimum_f64, 0, double, TG_F64, <=)
DEF_MINMAX(maximum_f64, 1, double, TG_F64, >=)

void tg__cpu_binary_register(void)
{
    const tg_backend C = TG_BACKEND_CPU;
    for (int d = 0; d < 2; d++) {
        ref_minmax[d][0] = (tg_binary_fn)tg__kernel(TG_K_MINIMUM, TG_BACKEND_REF, (tg_dtype)d);
        ref_minmax[d][1] = (tg_binary_fn)tg__kernel(TG_K_MAXIMUM, TG_BACKEND_REF, (tg_dtype)d);
    }
    tg__kernel_set(TG_K_MINIMUM, C, TG_F32, (tg_kernel_fn)minimum_f32);
    tg__kernel_set(TG_K_MAXIMUM, C, TG_F32, (tg_kernel_fn)maximum_f32);
    tg__kernel_set(TG_K_MINIMUM, C, TG_F64, (tg_kernel_fn)minimum_f64);
    tg__kernel_set(TG_K_MAXIMUM, C, TG_F64, (tg_kernel_fn)maximum_f64);
}
