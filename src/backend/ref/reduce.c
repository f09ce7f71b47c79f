/* ref backend: reductions (sum over dims) and dim-wise reductions (max,
 * min, logsumexp; x seen as (outer, n, inner)). Accumulation is in double
 * for both float types, so the reference is at least as accurate as any
 * faster kernel. */
#include <math.h>
#include <string.h>

#include "backend/kernels.h"

#define DEF_REDUCE(SFX, T)                                                         \
    static void reduce_sum_##SFX(const tg_reduce *r, const void *xv, void *yv)     \
    {                                                                              \
        const T *x = xv;                                                           \
        T *y = yv;                                                                 \
        int64_t ystr[TG_MAX_DIMS], n = 1, m = 1, s = 1;                            \
        for (int d = r->ndim - 1; d >= 0; d--) {                                   \
            ystr[d] = r->reduce[d] ? 0 : s;                                        \
            if (!r->reduce[d]) s *= r->shape[d];                                   \
            n *= r->shape[d];                                                      \
        }                                                                          \
        m = s;                                                                     \
        /* Accumulate per output element in double, then round once. */          \
        int64_t idx[TG_MAX_DIMS] = {0}, off = 0;                                   \
        double *tmp = NULL;                                                        \
        double small[64];                                                          \
        tmp = m <= 64 ? small : tg__data_alloc((size_t)m * sizeof(double));        \
        if (!tmp) return;                                                          \
        for (int64_t j = 0; j < m; j++) tmp[j] = 0.0;                              \
        for (int64_t i = 0; i < n; i++) {                                          \
            tmp[off] += (double)x[i];                                              \
            for (int d = r->ndim - 1; d >= 0; d--) {                               \
                off += ystr[d];                                                    \
                if (++idx[d] < r->shape[d]) break;                                 \
                off -= ystr[d] * r->shape[d];                                      \
                idx[d] = 0;                                                        \
            }                                                                      \
        }                                                                          \
        for (int64_t j = 0; j < m; j++) y[j] = (T)tmp[j];                          \
        if (tmp != small) tg__data_free(tmp, (size_t)m * sizeof(double));          \
    }

#define DEF_DIMS(SFX, T)                                                           \
    static void max_dim_##SFX(int64_t outer, int64_t n, int64_t inner, const void *xv, void *yv, \
                              int64_t *idx)                                        \
    {                                                                              \
        const T *x = xv;                                                           \
        T *y = yv;                                                                 \
        for (int64_t o = 0; o < outer; o++)                                        \
            for (int64_t k = 0; k < inner; k++) {                                  \
                const T *xr = x + o * n * inner + k;                               \
                int64_t best = 0;                                                  \
                for (int64_t i = 1; i < n; i++)                                    \
                    if (xr[i * inner] > xr[best * inner] || isnan((double)xr[i * inner])) { \
                        best = i;                                                  \
                        if (isnan((double)xr[i * inner])) break;                   \
                    }                                                              \
                if (y) y[o * inner + k] = xr[best * inner];                        \
                if (idx) idx[o * inner + k] = best;                                \
            }                                                                      \
    }                                                                              \
    static void max_grad_##SFX(int64_t outer, int64_t n, int64_t inner, const int64_t *idx, \
                               const void *gyv, void *gxv)                         \
    {                                                                              \
        const T *gy = gyv;                                                         \
        T *gx = gxv;                                                               \
        memset(gx, 0, (size_t)(outer * n * inner) * sizeof(T));                    \
        for (int64_t o = 0; o < outer; o++)                                        \
            for (int64_t k = 0; k < inner; k++)                                    \
                gx[o * n * inner + idx[o * inner + k] * inner + k] = gy[o * inner + k]; \
    }                                                                              \
    static void min_dim_##SFX(int64_t outer, int64_t n, int64_t inner, const void *xv, void *yv, \
                              int64_t *idx)                                        \
    {                                                                              \
        const T *x = xv;                                                           \
        T *y = yv;                                                                 \
        for (int64_t o = 0; o < outer; o++)                                        \
            for (int64_t k = 0; k < inner; k++) {                                  \
                const T *xr = x + o * n * inner + k;                               \
                int64_t best = 0;                                                  \
                for (int64_t i = 0; i < n && !isnan((double)xr[best * inner]); i++) \
                    if (xr[i * inner] < xr[best * inner] || isnan((double)xr[i * inner])) \
                        best = i;                                                  \
                if (y) y[o * inner + k] = xr[best * inner];                        \
                if (idx) idx[o * inner + k] = best;                                \
            }                                                                      \
    }                                                                              \
    /* y = m + log sum exp(x - m), m the max; -inf/+inf rows stay infinite. */    \
    static void logsumexp_##SFX(int64_t outer, int64_t n, int64_t inner, const void *xv, void *yv) \
    {                                                                              \
        const T *x = xv;                                                           \
        T *y = yv;                                                                 \
        for (int64_t o = 0; o < outer; o++)                                        \
            for (int64_t k = 0; k < inner; k++) {                                  \
                const T *xr = x + o * n * inner + k;                               \
                double mx = -INFINITY, sum = 0.0;                                  \
                for (int64_t i = 0; i < n; i++) mx = fmax(mx, (double)xr[i * inner]); \
                if (isinf(mx)) {                                                   \
                    y[o * inner + k] = (T)mx;                                      \
                    continue;                                                      \
                }                                                                  \
                for (int64_t i = 0; i < n; i++) sum += exp((double)xr[i * inner] - mx); \
                y[o * inner + k] = (T)(mx + log(sum));                             \
            }                                                                      \
    }

DEF_REDUCE(f32, float)
DEF_REDUCE(f64, double)
DEF_REDUCE(i64, int64_t)
DEF_DIMS(f32, float)
DEF_DIMS(f64, double)

void tg__ref_reduce_register(void)
{
    const tg_backend R = TG_BACKEND_REF;
#define SET2(K, name)                                                              \
    tg__kernel_set(TG_K_##K, R, TG_F32, (tg_kernel_fn)name##_f32);                 \
    tg__kernel_set(TG_K_##K, R, TG_F64, (tg_kernel_fn)name##_f64);
    SET2(REDUCE_SUM, reduce_sum) SET2(MAX_DIM, max_dim) SET2(MAX_DIM_GRAD, max_grad)
    SET2(MIN_DIM, min_dim) SET2(LOGSUMEXP, logsumexp)
#undef SET2
    tg__kernel_set(TG_K_REDUCE_SUM, R, TG_I64, (tg_kernel_fn)reduce_sum_i64);
}
