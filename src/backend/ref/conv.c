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

/* The short-reduction products are, on ref, its own GEMM: the forward a
 * bias fill, the GEMM with beta 1 (0 without a bias) and relu's kernel; the
 * weight gradient the GEMM with beta 1 where it accumulates. */
#define DEF_CONV_SHORT(SFX, T, DT)                                                 \
    static void conv_short_fwd_##SFX(int64_t m, int64_t k, int64_t l, const void *wv, \
                                     const void *xv, const void *bv, bool relu, void *yv) \
    {                                                                              \
        const T *b = bv;                                                           \
        T *y = yv;                                                                 \
        for (int64_t i = 0; b && i < m; i++)                                       \
            for (int64_t j = 0; j < l; j++) y[i * l + j] = b[i];                   \
        ((tg_gemm_fn)tg__kernel(TG_K_GEMM, TG_BACKEND_REF, DT))(                   \
            false, false, m, l, k, wv, k, xv, l, b ? 1.0 : 0.0, yv, l);            \
        if (relu)                                                                  \
            ((tg_unary_fn)tg__kernel(TG_K_RELU, TG_BACKEND_REF, DT))(m * l, yv, yv, 0.0); \
    }                                                                              \
    static void conv_short_wgrad_##SFX(int64_t m, int64_t n, int64_t l, const void *av, \
                                       const void *bv, bool accumulate, void *cv)  \
    {                                                                              \
        ((tg_gemm_fn)tg__kernel(TG_K_GEMM, TG_BACKEND_REF, DT))(                   \
            false, true, m, n, l, av, l, bv, l, accumulate ? 1.0 : 0.0, cv, n);    \
    }

DEF_IM2COL(f32, float)
DEF_IM2COL(f64, double)
DEF_CHANNEL_SUM(f32, float)
DEF_CHANNEL_SUM(f64, double)
DEF_CONV_SHORT(f32, float, TG_F32)
DEF_CONV_SHORT(f64, double, TG_F64)

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
