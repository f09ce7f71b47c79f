/* Kernel ids and signatures of the neural-network ops: convolution,
 * pooling, normalisation (src/ops/nn_*.c). Included by backend/kernels.h
 * only. */
#ifndef TG_BACKEND_KERNELS_NN_H
#define TG_BACKEND_KERNELS_NN_H

#define TG_NN_KERNELS(X)                                                           \
    X(IM2COL)             /* tg_im2col_fn */                                       \
    X(COL2IM)             /* tg_col2im_fn */                                       \
    X(MAX_POOL2D)         /* tg_max_pool2d_fn */                                   \
    X(MAX_POOL2D_GRAD)    /* tg_max_pool2d_grad_fn */                              \
    X(AVG_POOL2D)         /* tg_avg_pool2d_fn */                                   \
    X(AVG_POOL2D_GRAD)    /* tg_avg_pool2d_grad_fn */                              \
    X(LAYER_NORM)         /* tg_layer_norm_fn */                                   \
    X(LAYER_NORM_GRAD)    /* tg_layer_norm_grad_fn */                              \
    X(LAYER_NORM_GRAD_W)  /* tg_layer_norm_grad_w_fn */                            \
    X(BATCH_NORM)         /* tg_batch_norm_fn */                                   \
    X(BATCH_NORM_GRAD)    /* tg_batch_norm_grad_fn */                              \
    X(BATCH_NORM_GRAD_W)  /* tg_batch_norm_grad_w_fn */                            \
    X(CHANNEL_SUM)        /* tg_channel_sum_fn */

#include <stdbool.h>
#include <stdint.h>

/* One image plane group seen by im2col: C channels of H x W, a KH x KW
 * kernel with stride, zero padding and dilation, giving OH x OW outputs. */
typedef struct tg_conv2d_geom {
    int64_t C, H, W, KH, KW, OH, OW;
    int64_t sh, sw, ph, pw, dh, dw;
} tg_conv2d_geom;

/* col (C*KH*KW, OH*OW) = the receptive fields of x (C, H, W), row
 * (c*KH + i)*KW + j holding x[c, oh*sh - ph + i*dh, ow*sw - pw + j*dw]
 * (0 outside). col is overwritten. */
typedef void (*tg_im2col_fn)(const tg_conv2d_geom *g, const void *x, void *col);
/* The adjoint of im2col: x (C, H, W) += col scattered back (overlapping
 * fields add up). */
typedef void (*tg_col2im_fn)(const tg_conv2d_geom *g, const void *col, void *x);

/* Pooling over P = N*C planes of H x W with a KH x KW window; padded cells
 * are -inf for max and 0 for avg. exclude_pad: avg divides by the number of
 * in-bounds cells instead of the window clipped to the padded input
 * (PyTorch's count_include_pad=False / True). */
typedef struct tg_pool2d_geom {
    int64_t P, H, W, KH, KW, OH, OW;
    int64_t sh, sw, ph, pw;
    bool exclude_pad;
} tg_pool2d_geom;

/* y (P, OH, OW) = window max; idx its first position, flat in the H*W
 * plane (NaN wins, as in PyTorch). */
typedef void (*tg_max_pool2d_fn)(const tg_pool2d_geom *g, const void *x, void *y, int64_t *idx);
/* gx (P, H, W) = 0, then gx[p, idx] += gy for every output. */
typedef void (*tg_max_pool2d_grad_fn)(const tg_pool2d_geom *g, const int64_t *idx, const void *gy,
                                      void *gx);
typedef void (*tg_avg_pool2d_fn)(const tg_pool2d_geom *g, const void *x, void *y);
/* gx (P, H, W) = 0, then each gy spread evenly over its window. */
typedef void (*tg_avg_pool2d_grad_fn)(const tg_pool2d_geom *g, const void *gy, void *gx);

/* Layer norm over rows: x (M, D); mean, rstd (M) with
 * rstd = 1 / sqrt(var + eps) (biased var); y = (x - mean) rstd w + b. */
typedef void (*tg_layer_norm_fn)(int64_t M, int64_t D, double eps, const void *x, const void *w,
                                 const void *b, void *y, void *mean, void *rstd);
/* gx = rstd (gyw - mean(gyw) - xhat mean(gyw xhat)) per row, gyw = gy w. */
typedef void (*tg_layer_norm_grad_fn)(int64_t M, int64_t D, const void *x, const void *w,
                                      const void *mean, const void *rstd, const void *gy,
                                      void *gx);
/* gw (D) = sum over rows of gy xhat (overwritten). */
typedef void (*tg_layer_norm_grad_w_fn)(int64_t M, int64_t D, const void *x, const void *mean,
                                        const void *rstd, const void *gy, void *gw);

/* Batch norm with batch statistics: x (N, C, S); per channel c over (N, S):
 * mean, rstd (C) as above; var (C doubles, biased) if not NULL. */
typedef void (*tg_batch_norm_fn)(int64_t N, int64_t C, int64_t S, double eps, const void *x,
                                 const void *w, const void *b, void *y, void *mean, void *rstd,
                                 double *var);
/* gx = w rstd (gy - mean(gy) - xhat mean(gy xhat)), means over (N, S). */
typedef void (*tg_batch_norm_grad_fn)(int64_t N, int64_t C, int64_t S, const void *x,
                                      const void *w, const void *mean, const void *rstd,
                                      const void *gy, void *gx);
/* gw (C) = sum over (N, S) of gy xhat (overwritten). */
typedef void (*tg_batch_norm_grad_w_fn)(int64_t N, int64_t C, int64_t S, const void *x,
                                        const void *mean, const void *rstd, const void *gy,
                                        void *gw);

/* y (C) = sum of x (N, C, S) over N and S (overwritten): bias gradients. */
typedef void (*tg_channel_sum_fn)(int64_t N, int64_t C, int64_t S, const void *x, void *y);

#endif
