/* Kernel ids and signatures of the extended elementwise, reduction and
 * indexing ops (src/ops/ext_*.c). Included by backend/kernels.h only.
 * Same conventions as there: plain functions on contiguous raw buffers,
 * floating kernels registered for f32 and f64, movement kernels (elem
 * argument) registered for every dtype. Inputs are assumed valid (indices
 * in range): the op files check them first. */
#ifndef TG_BACKEND_KERNELS_EXT_H
#define TG_BACKEND_KERNELS_EXT_H

#define TG_EXT_KERNELS(X)                                                          \
    X(ABS) X(GELU) X(SILU) X(LEAKY_RELU)     /* tg_unary_fn (p: slope) */          \
    X(ABS_GRAD) X(GELU_GRAD) X(SILU_GRAD) X(LEAKY_RELU_GRAD) /* tg_grad_fn, s = x */ \
    X(CLAMP) X(SOFTPLUS)                     /* tg_unary2_fn */                    \
    X(CLAMP_GRAD) X(SOFTPLUS_GRAD)           /* tg_grad2_fn, s = x */              \
    X(MINIMUM) X(MAXIMUM)                    /* tg_binary_fn */                    \
    X(WHERE)                                 /* tg_where_fn */                     \
    X(MASKED_FILL)                           /* tg_masked_fill_fn */               \
    X(MIN_DIM)                               /* tg_dim_max_fn */                   \
    X(LOGSUMEXP)                             /* tg_dim_fn, y is (outer, inner) */  \
    X(DROPOUT_MASK)                          /* tg_dropout_mask_fn */              \
    X(CONCAT)                                /* tg_concat_fn, every dtype */       \
    X(INDEX_SELECT)                          /* tg_index_select_fn, every dtype */ \
    X(INDEX_ADD)                             /* tg_index_add_fn */                 \
    X(GATHER)                                /* tg_gather_fn, every dtype */       \
    X(SCATTER_ADD)                           /* tg_scatter_add_fn */

/* Unary maps with two parameters: clamp (p = lo, q = hi), softplus
 * (p = beta, q = threshold). out may alias x. */
typedef void (*tg_unary2_fn)(int64_t n, const void *x, void *y, double p, double q);
typedef void (*tg_grad2_fn)(int64_t n, const void *s, const void *gy, void *gx, double p,
                            double q);

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

/* Dropout mask of n elements: scale with probability 1 - p, else 0, drawn
 * from a tg_rng seeded with seed (the same on every backend). */
typedef void (*tg_dropout_mask_fn)(int64_t n, uint64_t seed, double p, double scale, void *mask);

/* out (outer, na + nb, inner) = a (outer, na, inner) ++ b (outer, nb, inner). */
typedef void (*tg_concat_fn)(int64_t outer, int64_t na, int64_t nb, int64_t inner, const void *a,
                             const void *b, void *out, size_t elem);
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

#endif
