/* ref backend: max and avg 2-d pooling and their gradients. Plain loops;
 * avg sums accumulate in double for both float types. */
#include <math.h>

#include "backend/kernels.h"

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

DEF_POOL(f32, float)
DEF_POOL(f64, double)

void tg__ref_pool_register(void)
{
#define SET(KID, fn)                                                               \
    tg__kernel_set(TG_K_##KID, TG_BACKEND_REF, TG_F32, (tg_kernel_fn)fn##_f32);    \
    tg__kernel_set(TG_K_##KID, TG_BACKEND_REF, TG_F64, (tg_kernel_fn)fn##_f64);
    SET(MAX_POOL2D, max_pool2d)
    SET(MAX_POOL2D_GRAD, max_pool2d_grad)
    SET(AVG_POOL2D, avg_pool2d)
    SET(AVG_POOL2D_GRAD, avg_pool2d_grad)
#undef SET
}
