/* ref backend: im2col/col2im for convolution and the per-channel sum of
 * bias gradients. Plain loops; sums accumulate in double for both float
 * types. */
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

/* The short-reduction products, as the ref GEMM makes them (double sums,
 * the bias or the accumulated value added last): the same values as a
 * bias fill and a GEMM with beta 1, or beta 0 without a bias. */
#define DEF_CONV_SHORT(SFX, T)                                                     \
    static void conv_short_fwd_##SFX(int64_t m, int64_t k, int64_t l, const void *wv, \
                                     const void *xv, const void *bv, bool relu, void *yv) \
    {                                                                              \
        const T *w = wv, *x = xv, *b = bv;                                         \
        T *y = yv;                                                                 \
        for (int64_t i = 0; i < m; i++)                                            \
            for (int64_t j = 0; j < l; j++) {                                      \
                double acc = 0.0;                                                  \
                for (int64_t p = 0; p < k; p++) acc += (double)w[i * k + p] * x[p * l + j]; \
                T v = (T)(b ? acc + (double)b[i] : acc);                           \
                y[i * l + j] = relu && v <= 0 ? (T)0 : v;                          \
            }                                                                      \
    }                                                                              \
    static void conv_short_wgrad_##SFX(int64_t m, int64_t n, int64_t l, const void *av, \
                                       const void *bv, bool accumulate, void *cv)  \
    {                                                                              \
        const T *a = av, *b = bv;                                                  \
        T *c = cv;                                                                 \
        for (int64_t i = 0; i < m; i++)                                            \
            for (int64_t j = 0; j < n; j++) {                                      \
                double acc = 0.0;                                                  \
                for (int64_t p = 0; p < l; p++) acc += (double)a[i * l + p] * b[j * l + p]; \
                double prev = accumulate ? (double)c[i * n + j] : 0.0;             \
                c[i * n + j] = (T)(acc + prev);                                    \
            }                                                                      \
    }

DEF_IM2COL(f32, float)
DEF_IM2COL(f64, double)
DEF_CHANNEL_SUM(f32, float)
DEF_CHANNEL_SUM(f64, double)
DEF_CONV_SHORT(f32, float)
DEF_CONV_SHORT(f64, double)

void tg__ref_conv_register(void)
{
#define SET(KID, fn)                                                               \
    tg__kernel_set(TG_K_##KID, TG_BACKEND_REF, TG_F32, (tg_kernel_fn)fn##_f32);    \
    tg__kernel_set(TG_K_##KID, TG_BACKEND_REF, TG_F64, (tg_kernel_fn)fn##_f64);
    SET(IM2COL, im2col)
    SET(COL2IM, col2im)
    SET(CHANNEL_SUM, channel_sum)
    SET(CONV_SHORT_FWD, conv_short_fwd)
    SET(CONV_SHORT_WGRAD, conv_short_wgrad)
#undef SET
}
