/* ref backend: kernels of the nn op family (see backend/kernels.h):
 * im2col/col2im for convolution, max/avg pooling, layer and batch norm.
 * Plain loops; statistics and sums accumulate in double for both float
 * types, so this stays the oracle for any faster kernel. */
#include <math.h>

#include "backend/kernels.h"

/* Receptive-field walk shared by im2col (gather) and col2im (scatter-add). */
#define DEF_IM2COL(SFX, T)                                                         \
    static void im2col_##SFX(const tg_conv2d_geom *g, const void *xv, void *colv)  \
    {                                                                              \
        const T *x = xv;                                                           \
        T *col = colv;                                                             \
        int64_t L = g->OH * g->OW;                                                 \
        for (int64_t c = 0; c < g->C; c++)                                         \
            for (int64_t i = 0; i < g->KH; i++)                                    \
                for (int64_t j = 0; j < g->KW; j++) {                              \
                    T *row = col + ((c * g->KH + i) * g->KW + j) * L;              \
                    for (int64_t oh = 0; oh < g->OH; oh++) {                       \
                        int64_t ih = oh * g->sh - g->ph + i * g->dh;               \
                        T *r = row + oh * g->OW;                                   \
                        if (ih < 0 || ih >= g->H) {                                \
                            for (int64_t ow = 0; ow < g->OW; ow++) r[ow] = 0;      \
                            continue;                                              \
                        }                                                          \
                        const T *xr = x + (c * g->H + ih) * g->W;                  \
                        for (int64_t ow = 0; ow < g->OW; ow++) {                   \
                            int64_t iw = ow * g->sw - g->pw + j * g->dw;           \
                            r[ow] = (iw >= 0 && iw < g->W) ? xr[iw] : (T)0;        \
                        }                                                          \
                    }                                                              \
                }                                                                  \
    }                                                                              \
    static void col2im_##SFX(const tg_conv2d_geom *g, const void *colv, void *xv)  \
    {                                                                              \
        const T *col = colv;                                                       \
        T *x = xv;                                                                 \
        int64_t L = g->OH * g->OW;                                                 \
        for (int64_t c = 0; c < g->C; c++)                                         \
            for (int64_t i = 0; i < g->KH; i++)                                    \
                for (int64_t j = 0; j < g->KW; j++) {                              \
                    const T *row = col + ((c * g->KH + i) * g->KW + j) * L;        \
                    for (int64_t oh = 0; oh < g->OH; oh++) {                       \
                        int64_t ih = oh * g->sh - g->ph + i * g->dh;               \
                        if (ih < 0 || ih >= g->H) continue;                        \
                        const T *r = row + oh * g->OW;                             \
                        T *xr = x + (c * g->H + ih) * g->W;                        \
                        for (int64_t ow = 0; ow < g->OW; ow++) {                   \
                            int64_t iw = ow * g->sw - g->pw + j * g->dw;           \
                            if (iw >= 0 && iw < g->W) xr[iw] += r[ow];             \
                        }                                                          \
                    }                                                              \
                }                                                                  \
    }

/* Window bounds of output (oh, ow), clipped to the input; *pool is the
 * window clipped to the padded input (PyTorch's divisor with padding). */
static void pool_window(const tg_pool2d_geom *g, int64_t oh, int64_t ow, int64_t *h0, int64_t *h1,
                        int64_t *w0, int64_t *w1, int64_t *pool)
{
    int64_t hs = oh * g->sh - g->ph, ws = ow * g->sw - g->pw;
    int64_t he = hs + g->KH, we = ws + g->KW;
    if (he > g->H + g->ph) he = g->H + g->ph;
    if (we > g->W + g->pw) we = g->W + g->pw;
    *pool = (he - hs) * (we - ws);
    *h0 = hs < 0 ? 0 : hs;
    *w0 = ws < 0 ? 0 : ws;
    *h1 = he > g->H ? g->H : he;
    *w1 = we > g->W ? g->W : we;
}

static double pool_divisor(const tg_pool2d_geom *g, int64_t h0, int64_t h1, int64_t w0,
                           int64_t w1, int64_t pool)
{
    int64_t n = g->exclude_pad ? (h1 - h0) * (w1 - w0) : pool;
    return n > 0 ? (double)n : 1.0;
}

#define DEF_POOL(SFX, T)                                                           \
    static void max_pool2d_##SFX(const tg_pool2d_geom *g, const void *xv, void *yv, int64_t *idx) \
    {                                                                              \
        const T *x = xv;                                                           \
        T *y = yv;                                                                 \
        int64_t HW = g->H * g->W, OL = g->OH * g->OW;                              \
        for (int64_t p = 0; p < g->P; p++)                                         \
            for (int64_t oh = 0; oh < g->OH; oh++)                                 \
                for (int64_t ow = 0; ow < g->OW; ow++) {                           \
                    int64_t h0, h1, w0, w1, pool, best_i = -1;                     \
                    T best = 0;                                                    \
                    pool_window(g, oh, ow, &h0, &h1, &w0, &w1, &pool);             \
                    for (int64_t ih = h0; ih < h1; ih++)                           \
                        for (int64_t iw = w0; iw < w1; iw++) {                     \
                            T v = x[p * HW + ih * g->W + iw];                      \
                            if (best_i < 0 || v > best || (isnan(v) && !isnan(best))) { \
                                best = v;                                          \
                                best_i = ih * g->W + iw;                           \
                            }                                                      \
                        }                                                          \
                    y[p * OL + oh * g->OW + ow] = best_i < 0 ? (T)-INFINITY : best; \
                    idx[p * OL + oh * g->OW + ow] = best_i < 0 ? 0 : best_i;       \
                }                                                                  \
    }                                                                              \
    static void max_pool2d_grad_##SFX(const tg_pool2d_geom *g, const int64_t *idx, \
                                      const void *gyv, void *gxv)                  \
    {                                                                              \
        const T *gy = gyv;                                                         \
        T *gx = gxv;                                                               \
        int64_t HW = g->H * g->W, OL = g->OH * g->OW;                              \
        for (int64_t i = 0; i < g->P * HW; i++) gx[i] = 0;                         \
        for (int64_t p = 0; p < g->P; p++)                                         \
            for (int64_t o = 0; o < OL; o++) gx[p * HW + idx[p * OL + o]] += gy[p * OL + o]; \
    }                                                                              \
    static void avg_pool2d_##SFX(const tg_pool2d_geom *g, const void *xv, void *yv) \
    {                                                                              \
        const T *x = xv;                                                           \
        T *y = yv;                                                                 \
        int64_t HW = g->H * g->W, OL = g->OH * g->OW;                              \
        for (int64_t p = 0; p < g->P; p++)                                         \
            for (int64_t oh = 0; oh < g->OH; oh++)                                 \
                for (int64_t ow = 0; ow < g->OW; ow++) {                           \
                    int64_t h0, h1, w0, w1, pool;                                  \
                    double s = 0.0;                                                \
                    pool_window(g, oh, ow, &h0, &h1, &w0, &w1, &pool);             \
                    for (int64_t ih = h0; ih < h1; ih++)                           \
                        for (int64_t iw = w0; iw < w1; iw++) s += (double)x[p * HW + ih * g->W + iw]; \
                    y[p * OL + oh * g->OW + ow] = (T)(s / pool_divisor(g, h0, h1, w0, w1, pool)); \
                }                                                                  \
    }                                                                              \
    static void avg_pool2d_grad_##SFX(const tg_pool2d_geom *g, const void *gyv, void *gxv) \
    {                                                                              \
        const T *gy = gyv;                                                         \
        T *gx = gxv;                                                               \
        int64_t HW = g->H * g->W, OL = g->OH * g->OW;                              \
        for (int64_t i = 0; i < g->P * HW; i++) gx[i] = 0;                         \
        for (int64_t p = 0; p < g->P; p++)                                         \
            for (int64_t oh = 0; oh < g->OH; oh++)                                 \
                for (int64_t ow = 0; ow < g->OW; ow++) {                           \
                    int64_t h0, h1, w0, w1, pool;                                  \
                    pool_window(g, oh, ow, &h0, &h1, &w0, &w1, &pool);             \
                    T v = (T)((double)gy[p * OL + oh * g->OW + ow] /               \
                              pool_divisor(g, h0, h1, w0, w1, pool));              \
                    for (int64_t ih = h0; ih < h1; ih++)                           \
                        for (int64_t iw = w0; iw < w1; iw++) gx[p * HW + ih * g->W + iw] += v; \
                }                                                                  \
    }

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

#define DEF_CHANNEL_SUM(SFX, T)                                                    \
    static void channel_sum_##SFX(int64_t N, int64_t C, int64_t S, const void *xv, void *yv) \
    {                                                                              \
        const T *x = xv;                                                           \
        T *y = yv;                                                                 \
        for (int64_t c = 0; c < C; c++) {                                          \
            double acc = 0.0;                                                      \
            for (int64_t n = 0; n < N; n++) {                                      \
                const T *r = x + (n * C + c) * S;                                  \
                for (int64_t s = 0; s < S; s++) acc += (double)r[s];               \
            }                                                                      \
            y[c] = (T)acc;                                                         \
        }                                                                          \
    }

DEF_IM2COL(f32, float)
DEF_IM2COL(f64, double)
DEF_POOL(f32, float)
DEF_POOL(f64, double)
DEF_LAYER_NORM(f32, float)
DEF_LAYER_NORM(f64, double)
DEF_BATCH_NORM(f32, float)
DEF_BATCH_NORM(f64, double)
DEF_CHANNEL_SUM(f32, float)
DEF_CHANNEL_SUM(f64, double)

void tg__ref_nn_register(void)
{
#define SET(KID, fn)                                                               \
    tg__kernel_set(TG_K_##KID, TG_BACKEND_REF, TG_F32, (tg_kernel_fn)fn##_f32);    \
    tg__kernel_set(TG_K_##KID, TG_BACKEND_REF, TG_F64, (tg_kernel_fn)fn##_f64);
    SET(IM2COL, im2col)
    SET(COL2IM, col2im)
    SET(MAX_POOL2D, max_pool2d)
    SET(MAX_POOL2D_GRAD, max_pool2d_grad)
    SET(AVG_POOL2D, avg_pool2d)
    SET(AVG_POOL2D_GRAD, avg_pool2d_grad)
    SET(LAYER_NORM, layer_norm)
    SET(LAYER_NORM_GRAD, layer_norm_grad)
    SET(LAYER_NORM_GRAD_W, layer_norm_grad_w)
    SET(BATCH_NORM, batch_norm)
    SET(BATCH_NORM_GRAD, batch_norm_grad)
    SET(BATCH_NORM_GRAD_W, batch_norm_grad_w)
    SET(CHANNEL_SUM, channel_sum)
#undef SET
}
