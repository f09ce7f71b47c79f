/* cpu backend: sums over a prefix of dims (bias gradients, sum_to) or a
 * suffix (row sums) with unit-stride inner loops; other patterns fall back
 * to ref. Accumulators are double for both float types, like ref. */
#include <string.h>

#include "backend/kernels.h"

static tg_reduce_fn ref_sum[2];

/* Splits r into (outer, inner) if the reduced dims are exactly a prefix
 * (prefix = true) or a suffix (prefix = false) of the non-trivial dims. */
static bool split(const tg_reduce *r, bool prefix, int64_t *outer, int64_t *inner)
{
    int k = 0;
    *outer = *inner = 1;
    if (prefix) {
        while (k < r->ndim && (r->reduce[k] || r->shape[k] == 1)) *outer *= r->shape[k++];
        for (; k < r->ndim; k++) {
            if (r->reduce[k] && r->shape[k] != 1) return false;
            *inner *= r->shape[k];
        }
    } else {
        while (k < r->ndim && (!r->reduce[k] || r->shape[k] == 1)) *outer *= r->shape[k++];
        for (; k < r->ndim; k++) {
            if (!r->reduce[k] && r->shape[k] != 1) return false;
            *inner *= r->shape[k];
        }
    }
    return true;
}

#define DEF_SUM(SFX, T, DI)                                                         \
    static void sum_##SFX(const tg_reduce *r, const void *xv, void *yv)             \
    {                                                                               \
        const T *x = xv;                                                            \
        T *y = yv;                                                                  \
        int64_t outer, inner;                                                       \
        if (split(r, false, &outer, &inner)) { /* row sums */                       \
            for (int64_t o = 0; o < outer; o++) {                                   \
                const T *xr = x + o * inner;                                        \
                double s0 = 0, s1 = 0, s2 = 0, s3 = 0;                              \
                int64_t j = 0;                                                      \
                for (; j + 4 <= inner; j += 4) {                                    \
                    s0 += xr[j];                                                    \
                    s1 += xr[j + 1];                                                \
                    s2 += xr[j + 2];                                                \
                    s3 += xr[j + 3];                                                \
                }                                                                   \
                for (; j < inner; j++) s0 += xr[j];                                 \
                y[o] = (T)((s0 + s1) + (s2 + s3));                                  \
            }                                                                       \
            return;                                                                 \
        }                                                                           \
        if (split(r, true, &outer, &inner) && inner <= 65536) { /* column sums */  \
            double stack[1024];                                                     \
            double *acc = inner <= 1024 ? stack                                     \
                                        : tg__data_alloc((size_t)inner * sizeof(double)); \
            if (acc) {                                                              \
                for (int64_t j = 0; j < inner; j++) acc[j] = 0.0;                   \
                for (int64_t o = 0; o < outer; o++) {                               \
                    const T *xr = x + o * inner;                                    \
                    for (int64_t j = 0; j < inner; j++) acc[j] += xr[j];            \
                }                                                                   \
                for (int64_t j = 0; j < inner; j++) y[j] = (T)acc[j];               \
                if (acc != stack) tg__data_free(acc, (size_t)inner * sizeof(double)); \
                return;                                                             \
            }                                                                       \
        }                                                                           \
        ref_sum[DI](r, xv, yv);                                                     \
    }

DEF_SUM(f32, float, 0)
DEF_SUM(f64, double, 1)

void tg__cpu_reduce_register(void)
{
    ref_sum[0] = (tg_reduce_fn)tg__kernel(TG_K_REDUCE_SUM, TG_BACKEND_REF, TG_F32);
    ref_sum[1] = (tg_reduce_fn)tg__kernel(TG_K_REDUCE_SUM, TG_BACKEND_REF, TG_F64);
    tg__kernel_set(TG_K_REDUCE_SUM, TG_BACKEND_CPU, TG_F32, (tg_kernel_fn)sum_f32);
    tg__kernel_set(TG_K_REDUCE_SUM, TG_BACKEND_CPU, TG_F64, (tg_kernel_fn)sum_f64);
}
