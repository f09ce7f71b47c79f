/* ref backend: layer and batch norm with their gradients. Plain loops;
 * statistics accumulate in double for both float types, so this stays the
 * oracle for any faster kernel. */
#include <math.h>

#include "backend/kernels.h"

/* Layer norm: one row of D at a time, two passes for the variance. */
#define DEF_LAYER_NORM(SFX, T)                                                     \
    static void layer_norm_##SFX(int64_t M, int64_t D, double eps, const void *xv, \
                                 const void *wv, const void *bv, void *yv, void *meanv, \
                                 void *rstdv)                                      \
    {                                                                              \
        const T *x = xv, *w = wv, *b = bv;                                         \
        T *y = yv, *mean = meanv, *rstd = rstdv;                                   \
        for (int64_t m = 0; m < M; m++) {                                          \
            const T *xr = x + m * D;                                               \
            double mu = 0.0, var = 0.0;                                            \
            for (int64_t d = 0; d < D; d++) mu += (double)xr[d];                   \
            mu /= (double)D;                                                       \
            for (int64_t d = 0; d < D; d++) var += ((double)xr[d] - mu) * ((double)xr[d] - mu); \
            double rs = 1.0 / sqrt(var / (double)D + eps);                         \
            mean[m] = (T)mu;                                                       \
            rstd[m] = (T)rs;                                                       \
            for (int64_t d = 0; d < D; d++)                                        \
                y[m * D + d] = (T)(((double)xr[d] - mu) * rs * (double)w[d] + (double)b[d]); \
        }                                                                          \
    }                                                                              \
    static void layer_norm_grad_##SFX(int64_t M, int64_t D, const void *xv, const void *wv, \
                                      const void *meanv, const void *rstdv, const void *gyv, \
                                      void *gxv)                                   \
    {                                                                              \
        const T *x = xv, *w = wv, *mean = meanv, *rstd = rstdv, *gy = gyv;         \
        T *gx = gxv;                                                               \
        for (int64_t m = 0; m < M; m++) {                                          \
            double mu = (double)mean[m], rs = (double)rstd[m], a = 0.0, c = 0.0;   \
            const T *xr = x + m * D, *gr = gy + m * D;                             \
            for (int64_t d = 0; d < D; d++) {                                      \
                double g = (double)gr[d] * (double)w[d];                           \
                a += g;                                                            \
                c += g * ((double)xr[d] - mu) * rs;                                \
            }                                                                      \
            a /= (double)D;                                                        \
            c /= (double)D;                                                        \
            for (int64_t d = 0; d < D; d++) {                                      \
                double xh = ((double)xr[d] - mu) * rs;                             \
                gx[m * D + d] = (T)(rs * ((double)gr[d] * (double)w[d] - a - xh * c)); \
            }                                                                      \
        }                                                                          \
    }                                                                              \
    /* Columns in blocks of 256 so rows are read contiguously. */                  \
    static void layer_norm_grad_w_##SFX(int64_t M, int64_t D, const void *xv, const void *meanv, \
                                        const void *rstdv, const void *gyv, void *gwv) \
    {                                                                              \
        const T *x = xv, *mean = meanv, *rstd = rstdv, *gy = gyv;                  \
        T *gw = gwv;                                                               \
        for (int64_t d0 = 0; d0 < D; d0 += 256) {                                  \
            int64_t nd = D - d0 < 256 ? D - d0 : 256;                              \
            double acc[256] = {0};                                                 \
            for (int64_t m = 0; m < M; m++) {                                      \
                double mu = (double)mean[m], rs = (double)rstd[m];                 \
                const T *xr = x + m * D + d0, *gr = gy + m * D + d0;               \
                for (int64_t d = 0; d < nd; d++) acc[d] += (double)gr[d] * ((double)xr[d] - mu) * rs; \
            }                                                                      \
            for (int64_t d = 0; d < nd; d++) gw[d0 + d] = (T)acc[d];               \
        }                                                                          \
    }

/* Batch norm: channel c of x (N, C, S) is N runs of S contiguous values. */
#define DEF_BATCH_NORM(SFX, T)                                                     \
    static void batch_norm_##SFX(int64_t N, int64_t C, int64_t S, double eps, const void *xv, \
                                 const void *wv, const void *bv, void *yv, void *meanv, \
                                 void *rstdv, double *var_out)                     \
    {                                                                              \
        const T *x = xv, *w = wv, *b = bv;                                         \
        T *y = yv, *mean = meanv, *rstd = rstdv;                                   \
        double cnt = (double)(N * S);                                              \
        for (int64_t c = 0; c < C; c++) {                                          \
            double mu = 0.0, var = 0.0;                                            \
            for (int64_t n = 0; n < N; n++)                                        \
                for (int64_t s = 0; s < S; s++) mu += (double)x[(n * C + c) * S + s]; \
            mu /= cnt;                                                             \
            for (int64_t n = 0; n < N; n++)                                        \
                for (int64_t s = 0; s < S; s++) {                                  \
                    double d = (double)x[(n * C + c) * S + s] - mu;                \
                    var += d * d;                                                  \
                }                                                                  \
            var /= cnt;                                                            \
            double rs = 1.0 / sqrt(var + eps), sc = rs * (double)w[c], sh = (double)b[c]; \
            mean[c] = (T)mu;                                                       \
            rstd[c] = (T)rs;                                                       \
            if (var_out) var_out[c] = var;                                         \
            for (int64_t n = 0; n < N; n++)                                        \
                for (int64_t s = 0; s < S; s++) {                                  \
                    int64_t i = (n * C + c) * S + s;                               \
                    y[i] = (T)(((double)x[i] - mu) * sc + sh);                     \
                }                                                                  \
        }                                                                          \
    }                                                                              \
    static void batch_norm_grad_##SFX(int64_t N, int64_t C, int64_t S, const void *xv, \
                                      const void *wv, const void *meanv, const void *rstdv, \
                                      const void *gyv, void *gxv)                  \
    {                                                                              \
        const T *x = xv, *w = wv, *mean = meanv, *rstd = rstdv, *gy = gyv;         \
        T *gx = gxv;                                                               \
        double cnt = (double)(N * S);                                              \
        for (int64_t c = 0; c < C; c++) {                                          \
            double mu = (double)mean[c], rs = (double)rstd[c], a = 0.0, k = 0.0;   \
            for (int64_t n = 0; n < N; n++)                                        \
                for (int64_t s = 0; s < S; s++) {                                  \
                    int64_t i = (n * C + c) * S + s;                               \
                    a += (double)gy[i];                                            \
                    k += (double)gy[i] * ((double)x[i] - mu) * rs;                 \
                }                                                                  \
            a /= cnt;                                                              \
            k /= cnt;                                                              \
            double sc = (double)w[c] * rs;                                         \
            for (int64_t n = 0; n < N; n++)                                        \
                for (int64_t s = 0; s < S; s++) {                                  \
                    int64_t i = (n * C + c) * S + s;                               \
                    double xh = ((double)x[i] - mu) * rs;                          \
                    gx[i] = (T)(sc * ((double)gy[i] - a - xh * k));                \
                }                                                                  \
        }                                                                          \
    }                                                                              \
    static void batch_norm_grad_w_##SFX(int64_t N, int64_t C, int64_t S, const void *xv, \
                                        const void *meanv, const void *rstdv, const void *gyv, \
                                        void *gwv)                                 \
    {                                                                              \
        const T *x = xv, *mean = meanv, *rstd = rstdv, *gy = gyv;                  \
        T *gw = gwv;                                                               \
        for (int64_t c = 0; c < C; c++) {                                          \
            double mu = (double)mean[c], rs = (double)rstd[c], k = 0.0;            \
            for (int64_t n = 0; n < N; n++)                                        \
                for (int64_t s = 0; s < S; s++) {                                  \
                    int64_t i = (n * C + c) * S + s;                               \
                    k += (double)gy[i] * ((double)x[i] - mu) * rs;                 \
                }                                                                  \
            gw[c] = (T)k;                                                          \
        }                                                                          \
    }

DEF_LAYER_NORM(f32, float)
DEF_LAYER_NORM(f64, double)
DEF_BATCH_NORM(f32, float)
DEF_BATCH_NORM(f64, double)

void tg__ref_norm_register(void)
{
#define SET(KID, fn)                                                               \
    tg__kernel_set(TG_K_##KID, TG_BACKEND_REF, TG_F32, (tg_kernel_fn)fn##_f32);    \
    tg__kernel_set(TG_K_##KID, TG_BACKEND_REF, TG_F64, (tg_kernel_fn)fn##_f64);
    SET(LAYER_NORM, layer_norm)
    SET(LAYER_NORM_GRAD, layer_norm_grad)
    SET(LAYER_NORM_GRAD_W, layer_norm_grad_w)
    SET(BATCH_NORM, batch_norm)
    SET(BATCH_NORM_GRAD, batch_norm_grad)
    SET(BATCH_NORM_GRAD_W, batch_norm_grad_w)
#undef SET
}
