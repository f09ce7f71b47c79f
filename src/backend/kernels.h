/* Backend kernels: plain functions on raw buffers, looked up per
 * (kernel, backend, dtype). They know neither the tape nor the registry.
 * ref registers a complete set first; cpu overrides what it speeds up.
 * All kernels of a kind share one signature. Buffers are contiguous unless
 * a signature says otherwise; outputs never alias inputs except where noted
 * (elementwise kernels allow out == an input). */
#ifndef TG_BACKEND_KERNELS_H
#define TG_BACKEND_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/internal.h"

/* Kernel ids, one X-macro list in id order, each run of ids tagged with the
 * section below (and the file of each backend) that holds it, and the
 * signature its kernels share. The order is the historical one, kept as it
 * was: no value is stored or compared, but every object file that names an
 * id keeps its code. A new id can go anywhere. */
#define TG_ALL_KERNELS(X)                                                          \
    /* unary: tg_unary_fn, out may alias x */                                      \
    X(NEG) X(EXP) X(LOG) X(SQRT) X(TANH) X(SIGMOID) X(RELU) X(POW) X(ADD_SCALAR)   \
    X(MUL_SCALAR)                                                                  \
    /* unary: tg_grad_fn, gx = gy * f'(s), s the saved input or output */          \
    X(EXP_GRAD) X(LOG_GRAD) X(SQRT_GRAD) X(TANH_GRAD) X(SIGMOID_GRAD) X(RELU_GRAD) \
    X(POW_GRAD)                                                                    \
    /* binary: tg_binary_fn */                                                     \
    X(ADD) X(SUB) X(MUL) X(DIV) X(GT) X(EQ)                                        \
    /* reduce */                                                                   \
    X(REDUCE_SUM)       /* tg_reduce_fn */                                         \
    X(MAX_DIM)          /* tg_dim_max_fn */                                        \
    X(MAX_DIM_GRAD)     /* tg_dim_scatter_fn */                                    \
    /* matmul */                                                                   \
    X(GEMM)             /* tg_gemm_fn */                                           \
    /* softmax_loss */                                                             \
    X(SOFTMAX)          /* tg_dim_fn */                                            \
    X(LOG_SOFTMAX)      /* tg_dim_fn */                                            \
    X(SOFTMAX_GRAD)     /* tg_dim_grad_fn */                                       \
    X(LOG_SOFTMAX_GRAD) /* tg_dim_grad_fn */                                       \
    X(CE_FWD)           /* tg_ce_fwd_fn */                                         \
    X(CE_BWD)           /* tg_ce_bwd_fn */                                         \
    /* shape */                                                                    \
    X(COPY_STRIDED)     /* tg_copy_strided_fn */                                   \
    X(FILL)             /* tg_fill_fn */                                           \
    X(CAST)             /* tg_cast_fn, registered under the destination dtype */   \
    /* unary */                                                                    \
    X(ABS) X(GELU) X(SILU) X(LEAKY_RELU)     /* tg_unary_fn (p: slope) */          \
    X(ABS_GRAD) X(GELU_GRAD) X(SILU_GRAD) X(LEAKY_RELU_GRAD) /* tg_grad_fn, s = x */ \
    X(CLAMP) X(SOFTPLUS)                     /* tg_unary2_fn */                    \
    X(CLAMP_GRAD) X(SOFTPLUS_GRAD)           /* tg_grad2_fn, s = x */              \
    /* binary */                                                                   \
    X(MINIMUM) X(MAXIMUM)                    /* tg_binary_fn */                    \
    /* index */                                                                    \
    X(WHERE)                                 /* tg_where_fn */                     \
    X(MASKED_FILL)                           /* tg_masked_fill_fn */               \
    /* reduce */                                                                   \
    X(MIN_DIM)                               /* tg_dim_max_fn */                   \
    X(LOGSUMEXP)                             /* tg_dim_fn, y is (outer, inner) */  \
    /* random */                                                                   \
    X(DROPOUT_MASK)                          /* tg_dropout_mask_fn */              \
    /* shape */                                                                    \
    X(CONCAT)                                /* tg_concat_fn, every dtype */       \
    /* index */                                                                    \
    X(INDEX_SELECT)                          /* tg_index_select_fn, every dtype */ \
    X(INDEX_ADD)                             /* tg_index_add_fn */                 \
    X(GATHER)                                /* tg_gather_fn, every dtype */       \
    X(SCATTER_ADD)                           /* tg_scatter_add_fn */               \
    /* conv */                                                                     \
    X(IM2COL)             /* tg_im2col_fn */                                       \
    X(COL2IM)             /* tg_col2im_fn */                                       \
    /* pool */                                                                     \
    X(MAX_POOL2D)         /* tg_max_pool2d_fn */                                   \
    X(MAX_POOL2D_GRAD)    /* tg_max_pool2d_grad_fn */                              \
    X(AVG_POOL2D)         /* tg_avg_pool2d_fn */                                   \
    X(AVG_POOL2D_GRAD)    /* tg_avg_pool2d_grad_fn */                              \
    /* norm */                                                                     \
    X(LAYER_NORM)         /* tg_layer_norm_fn */                                   \
    X(LAYER_NORM_GRAD)    /* tg_layer_norm_grad_fn */                              \
    X(LAYER_NORM_GRAD_W)  /* tg_layer_norm_grad_w_fn */                            \
    X(BATCH_NORM)         /* tg_batch_norm_fn */                                   \
    X(BATCH_NORM_GRAD)    /* tg_batch_norm_grad_fn */                              \
    X(BATCH_NORM_GRAD_W)  /* tg_batch_norm_grad_w_fn */                            \
    /* conv */                                                                     \
    X(CHANNEL_SUM)        /* tg_channel_sum_fn */                                  \
    /* unary */                                                                    \
    X(SIN) X(COS)         /* tg_unary_fn */                                        \
    X(SIN_GRAD) X(COS_GRAD) /* tg_grad_fn, s = x */                                \
    /* unary: tg_gradgrad_fn, gs = gg * gy * d f'(s) / ds, s as for _GRAD */       \
    X(EXP_GG) X(LOG_GG) X(SQRT_GG) X(TANH_GG) X(SIGMOID_GG) X(POW_GG)           \
    /* conv */                                                                     \
    X(CONV_SHORT_FWD)     /* tg_conv_short_fwd_fn */                               \
    X(CONV_SHORT_WGRAD)   /* tg_conv_short_wgrad_fn */                             \
    /* binary */                                                                   \
    X(MUL_ADD)            /* tg_mul_add_fn */

typedef enum tg_kernel_id {
#define TG__KID(name) TG_K_##name,
    TG_ALL_KERNELS(TG__KID)
#undef TG__KID
    TG_KERNEL_COUNT
} tg_kernel_id;

/* ---- unary (unary.c; cpu: unary.c, vmath.c) ------------------------------ */

/* Unary maps y = f(x; p), out may alias x. */
typedef void (*tg_unary_fn)(int64_t n, const void *x, void *y, double p);
typedef void (*tg_grad_fn)(int64_t n, const void *s, const void *gy, void *gx, double p);
/* Unary maps with two parameters: clamp (p = lo, q = hi), softplus
 * (p = beta, q = threshold). out may alias x. */
typedef void (*tg_unary2_fn)(int64_t n, const void *x, void *y, double p, double q);
typedef void (*tg_grad2_fn)(int64_t n, const void *s, const void *gy, void *gx, double p,
                            double q);
/* The fused gradient's derivative in s: gs = gg * gy * d f'(s) / ds (gg the
 * gradient of gx). out may alias an input. */
typedef void (*tg_gradgrad_fn)(int64_t n, const void *s, const void *gy, const void *gg,
                               void *gs, double p);

/* ---- binary (binary.c) ----------------------------------------------------- */

/* Broadcast description: out has shape[ndim] (contiguous); a and b are read
 * at element strides sa/sb (0 on broadcast dims). */
typedef struct tg_bcast {
    int ndim;
    int64_t n;
    int64_t shape[TG_MAX_DIMS];
    int64_t sa[TG_MAX_DIMS], sb[TG_MAX_DIMS];
    bool same;      /* a, b and out all contiguous with the same shape */
    bool b_scalar;  /* b is one element, a contiguous like out */
    /* Row broadcasts: out is (n / inner, inner); a_row: a is the inner
     * row repeated, b full; b_row: the reverse (a bias add). 0 if not. */
    int64_t a_row, b_row;
} tg_bcast;
/* out = a op b; minimum/maximum propagate NaN. */
typedef void (*tg_binary_fn)(const tg_bcast *bc, const void *a, const void *b, void *out);
/* A product's gradient contributions summed as the sweep sums them, in one
 * pass over contiguous buffers: with t = g * a (rounded), out = p + t, then
 * out + t again when twice (the two contributions of x * x); p NULL: the
 * first contribution is t itself. Each operation rounds as the add and mul
 * kernels round (no contraction), so the bits are theirs. out may alias p. */
typedef void (*tg_mul_add_fn)(int64_t n, const void *p, const void *g, const void *a, void *out,
                              bool twice);

/* ---- reduce (reduce.c) ------------------------------------------------------ */

/* Sum of x (shape[ndim]) over the dims with reduce[d] set, into y (the
 * shape with those dims 1, contiguous). y is overwritten. */
typedef struct tg_reduce {
    int ndim;
    int64_t shape[TG_MAX_DIMS];
    bool reduce[TG_MAX_DIMS];
} tg_reduce;
typedef void (*tg_reduce_fn)(const tg_reduce *r, const void *x, void *y);
/* The cpu f32 row sum's fast pass (cpu/reduce.c): the sum of x[0..n) in
 * *out and true when every order of adding the row in double is exact (so
 * the result is bitwise the four-accumulator chain's); false, *out
 * untouched, when that cannot be shown (the range of |x| too wide for n,
 * an infinity or a NaN). Exposed for the tests. */
TG_INTERNAL bool tg__row_sum_exact_f32(const float *x, int64_t n, double *out);
/* The same pass over parts of a row of n elements: init, add each part
 * (false: the row cannot be shown exact; stop), merge the parts' states
 * (false likewise), then the value. */
#define TG_EXACT_LANES 16
typedef struct tg__exact_sum {
    double lane[TG_EXACT_LANES];
    uint32_t lo, hi; /* smallest nonzero |x| bit pattern minus 1; largest */
} tg__exact_sum;
TG_INTERNAL void tg__exact_sum_init(tg__exact_sum *s);
TG_INTERNAL bool tg__exact_sum_add(tg__exact_sum *s, const float *x, int64_t len, int64_t n);
TG_INTERNAL bool tg__exact_sum_merge(tg__exact_sum *into, const tg__exact_sum *from, int64_t n);
TG_INTERNAL double tg__exact_sum_value(const tg__exact_sum *s);
/* The row's sum from nparts parts' states (ok[p]: what add returned for
 * part p): true and *out where every part held and so does their merge
 * (merged into part[0]); false, *out untouched, else. */
TG_INTERNAL bool tg__exact_sum_parts(tg__exact_sum *part, const bool *ok, int nparts, int64_t n,
                                     double *out);

/* Dim kernels see x as (outer, n, inner) and work along n (logsumexp and
 * the softmax family too). */
typedef void (*tg_dim_fn)(int64_t outer, int64_t n, int64_t inner, const void *x, void *y);
/* y (outer, inner) = max (min) along n, idx its first position; y may be
 * NULL (argmax). */
typedef void (*tg_dim_max_fn)(int64_t outer, int64_t n, int64_t inner, const void *x, void *y,
                              int64_t *idx);
/* gx (outer, n, inner) = 0 except gx[idx] = gy. */
typedef void (*tg_dim_scatter_fn)(int64_t outer, int64_t n, int64_t inner, const int64_t *idx,
                                  const void *gy, void *gx);

/* ---- softmax_loss (softmax_loss.c; cpu: vmath.c) ---------------------------- */

/* softmax / log_softmax are tg_dim_fn; their backward: */
typedef void (*tg_dim_grad_fn)(int64_t outer, int64_t n, int64_t inner, const void *y,
                               const void *gy, void *gx);
/* Cross-entropy over (N, C) logits and i64 targets: logp = log_softmax,
 * loss = mean of -logp[target]. Backward: gx = (exp(logp) - onehot) * scale. */
typedef void (*tg_ce_fwd_fn)(int64_t N, int64_t C, const void *x, const int64_t *t, void *logp,
                             void *loss);
typedef void (*tg_ce_bwd_fn)(int64_t N, int64_t C, const void *logp, const int64_t *t,
                             double scale, void *gx);

/* ---- shape: movement, fill, cast (shape.c) ---------------------------------- */

/* Gathers a strided view (element strides) into contiguous dst; elem is the
 * element size in bytes. */
typedef void (*tg_copy_strided_fn)(int ndim, const int64_t *shape, const int64_t *strides,
                                   const void *src, void *dst, size_t elem);
typedef void (*tg_fill_fn)(int64_t n, void *y, double v);
typedef void (*tg_cast_fn)(int64_t n, const void *x, tg_dtype xdt, void *y);
/* out (outer, na + nb, inner) = a (outer, na, inner) ++ b (outer, nb, inner). */
typedef void (*tg_concat_fn)(int64_t outer, int64_t na, int64_t nb, int64_t inner, const void *a,
                             const void *b, void *out, size_t elem);

/* ---- index: selection and indexing (index.c) -------------------------------- */
/* Movement kernels (elem argument) are registered for every dtype. Inputs
 * are assumed valid (indices in range): the op files check them first. */

/* Three-operand broadcast: out has shape[ndim] (contiguous); operand k is
 * read at element strides s[k] (0 on broadcast dims). */
typedef struct tg_bcast3 {
    int ndim;
    int64_t n;
    int64_t shape[TG_MAX_DIMS];
    int64_t s[3][TG_MAX_DIMS];
} tg_bcast3;
/* out = cond != 0 ? a : b; operands 0, 1, 2 of bc are cond, a, b. cond is
 * of cond_dtype (the kernel's dtype or i64); NaN counts as true. */
typedef void (*tg_where_fn)(const tg_bcast3 *bc, const void *cond, tg_dtype cond_dtype,
                            const void *a, const void *b, void *out);
/* out = mask != 0 ? value : x; operands 0, 1 of bc are x, mask. */
typedef void (*tg_masked_fill_fn)(const tg_bcast3 *bc, const void *x, const void *mask,
                                  tg_dtype mask_dtype, double value, void *out);
/* y (outer, nidx, inner) = x (outer, n, inner) at idx[j] along n. */
typedef void (*tg_index_select_fn)(int64_t outer, int64_t n, int64_t inner, const void *x,
                                   const int64_t *idx, int64_t nidx, void *y, size_t elem);
/* gx (outer, n, inner) = 0, then gx[:, idx[j], :] += g[:, j, :]. */
typedef void (*tg_index_add_fn)(int64_t outer, int64_t n, int64_t inner, const void *g,
                                const int64_t *idx, int64_t nidx, void *gx);
/* y[i] = x[i with coordinate dim replaced by idx[i]]; y and idx have shape
 * ishape[ndim], x has xshape[ndim]. */
typedef void (*tg_gather_fn)(int ndim, const int64_t *ishape, const int64_t *xshape, int dim,
                             const void *x, const int64_t *idx, void *y, size_t elem);
/* The adjoint: gx (xshape) = 0, then gx[i with dim -> idx[i]] += g[i]. */
typedef void (*tg_scatter_add_fn)(int ndim, const int64_t *ishape, const int64_t *xshape, int dim,
                                  const void *g, const int64_t *idx, void *gx);

/* ---- matmul (matmul.c) ------------------------------------------------------ */

/* C (m,n) = op(A) op(B) + beta C, row-major; op(A) is (m,k): A is stored
 * (m,k) with leading dim lda, or (k,m) when ta. Likewise B. */
typedef void (*tg_gemm_fn)(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a,
                           int64_t lda, const void *b, int64_t ldb, double beta, void *c,
                           int64_t ldc);
/* OpenBLAS's thread count (1 with another BLAS), and setting it (cpu/matmul.c). */
TG_INTERNAL int tg__blas_threads(void);
TG_INTERNAL void tg__blas_set_threads(int n);
/* The thread choice for one m x n x k GEMM (cpu/matmul.c): before it,
 * begin decides whether the GEMM may run as OpenBLAS decides (small ones,
 * which it keeps on one thread itself, or large ones it may split, the
 * pool's workers then parked first) or on one thread, the count set aside
 * meanwhile; while the count is above 1 it also takes a process-wide lock
 * that end releases, so that no thread's GEMM starts while another has
 * the count lowered. Pass end what begin returned. */
TG_INTERNAL int tg__gemm_threads_begin(int64_t m, int64_t n, int64_t k);
TG_INTERNAL void tg__gemm_threads_end(int threads);
/* Whether backend's TG_K_GEMM of dtype, called with beta 1 and alpha 1 for
 * an m x n result over a reduction of k (tg_gemm_fn's m, n, k), writes
 * c + (the product), rounded once, bit for bit what the add kernel makes
 * of c and the same GEMM's beta-0 result (cpu/matmul.c): so a gradient
 * summed by the GEMM itself has the bits of one summed by the sweep. */
TG_INTERNAL bool tg__gemm_adds_exactly(tg_backend backend, tg_dtype dtype, int64_t m, int64_t n,
                                       int64_t k);

/* ---- conv (conv.c) ---------------------------------------------------------- */

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
/* y (C) = sum of x (N, C, S) over N and S (overwritten): bias gradients. */
typedef void (*tg_channel_sum_fn)(int64_t N, int64_t C, int64_t S, const void *x, void *y);
/* The products of a convolution whose reduction is short (few input
 * channels times taps: the op takes them for K <= TG_CONV_SHORT_K), where a
 * BLAS GEMM spends its time packing its operands. Every matrix is dense
 * row-major. The forward: y (m, l) = bias + w (m, k) x (k, l), then, where
 * relu, relu's values (v <= 0 -> 0, NaN kept); y is overwritten. bias NULL:
 * nothing added (the input gradient's product, W^T gy). */
typedef void (*tg_conv_short_fwd_fn)(int64_t m, int64_t k, int64_t l, const void *w,
                                     const void *x, const void *bias, bool relu, void *y);
/* The weight gradient's product for one image: c (m, n) = a (m, l) b (n, l)^T,
 * plus c where accumulate. */
typedef void (*tg_conv_short_wgrad_fn)(int64_t m, int64_t n, int64_t l, const void *a,
                                       const void *b, bool accumulate, void *c);
#define TG_CONV_SHORT_K 32

/* ---- pool (pool.c) ---------------------------------------------------------- */

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

/* ---- norm (norm.c) ---------------------------------------------------------- */

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

/* ---- random (random.c) ------------------------------------------------------ */

/* Dropout mask of n elements: scale with probability 1 - p, else 0, drawn
 * from a tg_rng seeded with seed (the same on every backend). */
typedef void (*tg_dropout_mask_fn)(int64_t n, uint64_t seed, double p, double scale, void *mask);

/* ---- the table (kernels.c) -------------------------------------------------- */

/* The table stores every kernel as this type; TG_KERNEL casts it back. */
typedef void (*tg_kernel_fn)(void);

/* The table itself (kernels.c), read inline by tg__kernel. */
TG_INTERNAL extern tg_kernel_fn tg__kernel_table[TG_KERNEL_COUNT][TG_BACKEND_COUNT][TG_DTYPE_COUNT];
/* Lookup: never NULL once the ref set is registered (cpu falls back).
 * Inline: two calls per recorded op (forward and backward kernels). */
static inline tg_kernel_fn tg__kernel(tg_kernel_id id, tg_backend backend, tg_dtype dtype)
{
    return tg__kernel_table[id][backend][dtype];
}
TG_INTERNAL void tg__kernel_set(tg_kernel_id id, tg_backend backend, tg_dtype dtype,
                                tg_kernel_fn fn);
TG_INTERNAL const char *tg__kernel_name(tg_kernel_id id);
/* Fills the table once (pthread_once): every ref domain's registration,
 * then cpu's entries copied from ref's, then every cpu domain's overrides
 * (the two lists in kernels.c). The only caller of the register functions;
 * the backend's public entry points (tg_num_threads, tg_cpu_set_vector_isa)
 * call it first. */
TG_INTERNAL void tg__backend_init(void);

#endif
