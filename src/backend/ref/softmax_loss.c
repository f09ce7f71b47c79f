/* ref backend: softmax, log_softmax, their gradients and the fused
 * cross-entropy, along n of x seen as (outer, n, inner). Accumulation is
 * in double for both float types. */
#include <math.h>

#include "backend/kernels.h"

#define DEF_SOFTMAX(SFX, T, EXPF, LOGF)                                            \
    /* The row's max and sum(exp(x - max)), the stable form both use. */    \
    static void row_stats_##SFX(const T *xr, int64_t n, int64_t inner, double *mx, double *sum) \
    {                                                                              \
        double m = -INFINITY, s = 0.0;                                             \
        for (int64_t i = 0; i < n; i++) m = fmax(m, (double)xr[i * inner]);        \
        for (int64_t i = 0; i < n; i++) s += exp((double)xr[i * inner] - m);       \
        *mx = m;                                                                   \
        *sum = s;                                                                  \
    }                                                                              \
    static void softmax_##SFX(int64_t outer, int64_t n, int64_t inner, const void *xv, void *yv) \
    {                                                                              \
        const T *x = xv;                                                           \
        T *y = yv;                                                                 \
        for (int64_t o = 0; o < outer; o++)                                        \
            for (int64_t k = 0; k < inner; k++) {                                  \
                const T *xr = x + o * n * inner + k;                               \
                T *yr = y + o * n * inner + k;                                     \
                double mx, sum;                                                    \
                row_stats_##SFX(xr, n, inner, &mx, &sum);                          \
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
                double mx, sum;                                                    \
                row_stats_##SFX(xr, n, inner, &mx, &sum);                          \
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

DEF_SOFTMAX(f32, float, expf, logf)
DEF_SOFTMAX(f64, double, exp, log)

void tg__ref_softmax_loss_register(void)
{
    const tg_backend R = TG_BACKEND_REF;
#define SET2(K, name)                                                              \
    tg__kernel_set(TG_K_##K, R, TG_F32, (tg_kernel_fn)name##_f32);                 \
    tg__kernel_set(TG_K_##K, R, TG_F64, (tg_kernel_fn)name##_f64);
    SET2(SOFTMAX, softmax) SET2(LOG_SOFTMAX, log_softmax) SET2(SOFTMAX_GRAD, softmax_grad)
    SET2(LOG_SOFTMAX_GRAD, log_softmax_grad) SET2(CE_FWD, ce_fwd) SET2(CE_BWD, ce_bwd)
#undef SET2
}
