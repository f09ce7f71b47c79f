/* ref backend: reductions, dim-wise kernels (softmax, max) and the fused
 * cross-entropy. Accumulation is in double for both float types, so the
 * reference is at least as accurate as any faster kernel. */
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

#define DEF_DIMS(SFX, T, EXPF, LOGF)                                               \
    static void softmax_##SFX(int64_t outer, int64_t n, int64_t inner, const void *xv, void *yv) \
    {                                                                              \
        const T *x = xv;                                                           \
        T *y = yv;                                                                 \
        for (int64_t o = 0; o < outer; o++)                                        \
            for (int64_t k = 0; k < inner; k++) {                                  \
                const T *xr = x + o * n * inner + k;                               \
                T *yr = y + o * n * inner + k;                                     \
                double mx = -INFINITY, sum = 0.0;                                  \
                for (int64_t i = 0; i < n; i++) mx = fmax(mx, (double)xr[i * inner]); \
                for (int64_t i = 0; i < n; i++) sum += exp((double)xr[i * inner] - mx); \
                for (int64_t i = 0; i < n; i++)                                    \
                    yr[i * inner] = (T)(exp((double)xr[i * inner] - mx) / sum);    \
            }                                                                      \
    }                                                                              \
    static void log_softmax_##SFX(int64_t outer, int64_t n, int64_t inner, const void *xv, void *yv) \
    {                                                                              \
        const T *x = xv;                                                           \
        T *y = yv;                                                                 \
        for (int64_t o = 0; o < outer; o++)                                        \
            for (int64_t k = 0; k < inner; k++) {                                  \
                const T *xr = x + o * n * inner + k;                               \
                T *yr = y + o * n * inner + k;                                     \
                double mx = -INFINITY, sum = 0.0;                                  \
                for (int64_t i = 0; i < n; i++) mx = fmax(mx, (double)xr[i * inner]); \
                for (int64_t i = 0; i < n; i++) sum += exp((double)xr[i * inner] - mx); \
                double lse = mx + log(sum);                                        \
                for (int64_t i = 0; i < n; i++) yr[i * inner] = (T)((double)xr[i * inner] - lse); \
            }                                                                      \
    }                                                                              \
    /* gx = y * (gy - sum(gy * y)) */                                              \
    static void softmax_grad_##SFX(int64_t outer, int64_t n, int64_t inner, const void *yv, \
                                   const void *gyv, void *gxv)                     \
    {                                                                              \
        const T *y = yv, *gy = gyv;                                                \
        T *gx = gxv;                                                               \
        for (int64_t o = 0; o < outer; o++)                                        \
            for (int64_t k = 0; k < inner; k++) {                                  \
                int64_t base = o * n * inner + k;                                  \
                double dot = 0.0;                                                  \
                for (int64_t i = 0; i < n; i++)                                    \
                    dot += (double)gy[base + i * inner] * (double)y[base + i * inner]; \
                for (int64_t i = 0; i < n; i++)                                    \
                    gx[base + i * inner] = (T)((double)y[base + i * inner] *       \
                                               ((double)gy[base + i * inner] - dot)); \
            }                                                                      \
    }                                                                              \
    /* gx = gy - exp(y) * sum(gy) */                                               \
    static void log_softmax_grad_##SFX(int64_t outer, int64_t n, int64_t inner, const void *yv, \
                                       const void *gyv, void *gxv)                 \
    {                                                                              \
        const T *y = yv, *gy = gyv;                                                \
        T *gx = gxv;                                                               \
        for (int64_t o = 0; o < outer; o++)                                        \
            for (int64_t k = 0; k < inner; k++) {                                  \
                int64_t base = o * n * inner + k;                                  \
                double sum = 0.0;                                                  \
                for (int64_t i = 0; i < n; i++) sum += (double)gy[base + i * inner]; \
                for (int64_t i = 0; i < n; i++)                                    \
                    gx[base + i * inner] = (T)((double)gy[base + i * inner] -      \
                                               exp((double)y[base + i * inner]) * sum); \
            }                                                                      \
    }                                                                              \
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
    static void ce_fwd_##SFX(int64_t N, int64_t C, const void *xv, const int64_t *t, void *lv, \
                             void *lossv)                                          \
    {                                                                              \
        T *lp = lv;                                                                \
        log_softmax_##SFX(N, C, 1, xv, lv);                                        \
        double acc = 0.0;                                                          \
        for (int64_t i = 0; i < N; i++) acc -= (double)lp[i * C + t[i]];           \
        *(T *)lossv = (T)(N ? acc / (double)N : 0.0);                              \
    }                                                                              \
    static void ce_bwd_##SFX(int64_t N, int64_t C, const void *lv, const int64_t *t, double scale, \
                             void *gxv)                                            \
    {                                                                              \
        const T *lp = lv;                                                          \
        T *gx = gxv;                                                               \
        for (int64_t i = 0; i < N; i++)                                            \
            for (int64_t j = 0; j < C; j++)                                        \
                gx[i * C + j] = (T)((exp((double)lp[i * C + j]) - (j == t[i] ? 1.0 : 0.0)) * scale); \
    }

DEF_REDUCE(f32, float)
DEF_REDUCE(f64, double)
DEF_REDUCE(i64, int64_t)
DEF_DIMS(f32, float, expf, logf)
DEF_DIMS(f64, double, exp, log)

void tg__ref_reduce_register(void)
{
    const tg_backend R = TG_BACKEND_REF;
#define SET2(K, name)                                                              \
    tg__kernel_set(TG_K_##K, R, TG_F32, (tg_kernel_fn)name##_f32);                       \
    tg__kernel_set(TG_K_##K, R, TG_F64, (tg_kernel_fn)name##_f64);
    SET2(REDUCE_SUM, reduce_sum) SET2(SOFTMAX, softmax) SET2(LOG_SOFTMAX, log_softmax)
    SET2(SOFTMAX_GRAD, softmax_grad) SET2(LOG_SOFTMAX_GRAD, log_softmax_grad)
    SET2(MAX_DIM, max_dim) SET2(MAX_DIM_GRAD, max_grad) SET2(CE_FWD, ce_fwd) SET2(CE_BWD, ce_bwd)
#undef SET2
    tg__kernel_set(TG_K_REDUCE_SUM, R, TG_I64, (tg_kernel_fn)reduce_sum_i64);
}
