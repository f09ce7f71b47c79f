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

/* Unary maps y = f(x; p), out may alias x. */
#define TG_UNARY_KERNELS(X) \
    X(NEG) X(EXP) X(LOG) X(SQRT) X(TANH) X(SIGMOID) X(RELU) X(POW) X(ADD_SCALAR) X(MUL_SCALAR)
/* Fused unary backward: gx = gy * f'(s), s the saved input or output. */
#define TG_GRAD_KERNELS(X) \
    X(EXP_GRAD) X(LOG_GRAD) X(SQRT_GRAD) X(TANH_GRAD) X(SIGMOID_GRAD) X(RELU_GRAD) X(POW_GRAD)
/* Broadcasting binary maps out = a op b. */
#define TG_BINARY_KERNELS(X) X(ADD) X(SUB) X(MUL) X(DIV) X(GT) X(EQ)

/* Kernels with their own signatures (named below). */
#define TG_OTHER_KERNELS(X)                                                        \
    X(REDUCE_SUM)       /* tg_reduce_fn */                                         \
    X(MAX_DIM)          /* tg_dim_max_fn */                                        \
    X(MAX_DIM_GRAD)     /* tg_dim_scatter_fn */                                    \
    X(GEMM)             /* tg_gemm_fn */                                           \
    X(SOFTMAX)          /* tg_dim_fn */                                            \
    X(LOG_SOFTMAX)      /* tg_dim_fn */                                            \
    X(SOFTMAX_GRAD)     /* tg_dim_grad_fn */                                       \
    X(LOG_SOFTMAX_GRAD) /* tg_dim_grad_fn */                                       \
    X(CE_FWD)           /* tg_ce_fwd_fn */                                         \
    X(CE_BWD)           /* tg_ce_bwd_fn */                                         \
    X(COPY_STRIDED)     /* tg_copy_strided_fn */                                   \
    X(FILL)             /* tg_fill_fn */                                           \
    X(CAST)             /* tg_cast_fn, registered under the destination dtype */

/* Kernel families kept in their own headers (ids, signatures). */
#include "backend/kernels_ext.h"
#include "backend/kernels_nn.h"

#define TG_ALL_KERNELS(X)                                                          \
    TG_UNARY_KERNELS(X) TG_GRAD_KERNELS(X) TG_BINARY_KERNELS(X) TG_OTHER_KERNELS(X) \
    TG_EXT_KERNELS(X) TG_NN_KERNELS(X)

typedef enum tg_kernel_id {
#define TG__KID(name) TG_K_##name,
    TG_ALL_KERNELS(TG__KID)
#undef TG__KID
    TG_KERNEL_COUNT
} tg_kernel_id;

typedef void (*tg_unary_fn)(int64_t n, const void *x, void *y, double p);
typedef void (*tg_grad_fn)(int64_t n, const void *s, const void *gy, void *gx, double p);

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
typedef void (*tg_binary_fn)(const tg_bcast *bc, const void *a, const void *b, void *out);

/* Sum of x (shape[ndim]) over the dims with reduce[d] set, into y (the
 * shape with those dims 1, contiguous). y is overwritten. */
typedef struct tg_reduce {
    int ndim;
    int64_t shape[TG_MAX_DIMS];
    bool reduce[TG_MAX_DIMS];
} tg_reduce;
typedef void (*tg_reduce_fn)(const tg_reduce *r, const void *x, void *y);

/* Dim kernels see x as (outer, n, inner) and work along n. */
typedef void (*tg_dim_fn)(int64_t outer, int64_t n, int64_t inner, const void *x, void *y);
typedef void (*tg_dim_grad_fn)(int64_t outer, int64_t n, int64_t inner, const void *y,
                               const void *gy, void *gx);
/* y (outer, inner) = max along n, idx its first position; y may be NULL
 * (argmax). */
typedef void (*tg_dim_max_fn)(int64_t outer, int64_t n, int64_t inner, const void *x, void *y,
                              int64_t *idx);
/* gx (outer, n, inner) = 0 except gx[idx] = gy. */
typedef void (*tg_dim_scatter_fn)(int64_t outer, int64_t n, int64_t inner, const int64_t *idx,
                                  const void *gy, void *gx);

/* C (m,n) = op(A) op(B) + beta C, row-major; op(A) is (m,k): A is stored
 * (m,k) with leading dim lda, or (k,m) when ta. Likewise B. */
typedef void (*tg_gemm_fn)(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a,
                           int64_t lda, const void *b, int64_t ldb, double beta, void *c,
                           int64_t ldc);

/* Cross-entropy over (N, C) logits and i64 targets: logp = log_softmax,
 * loss = mean of -logp[target]. Backward: gx = (exp(logp) - onehot) * scale. */
typedef void (*tg_ce_fwd_fn)(int64_t N, int64_t C, const void *x, const int64_t *t, void *logp,
                             void *loss);
typedef void (*tg_ce_bwd_fn)(int64_t N, int64_t C, const void *logp, const int64_t *t,
                             double scale, void *gx);

/* Gathers a strided view (element strides) into contiguous dst; elem is the
 * element size in bytes. */
typedef void (*tg_copy_strided_fn)(int ndim, const int64_t *shape, const int64_t *strides,
                                   const void *src, void *dst, size_t elem);
typedef void (*tg_fill_fn)(int64_t n, void *y, double v);
typedef void (*tg_cast_fn)(int64_t n, const void *x, tg_dtype xdt, void *y);

/* The table stores every kernel as this type; TG_KERNEL casts it back. */
typedef void (*tg_kernel_fn)(void);

/* Lookup: never NULL once the ref set is registered (cpu falls back). */
TG_INTERNAL tg_kernel_fn tg__kernel(tg_kernel_id id, tg_backend backend, tg_dtype dtype);
TG_INTERNAL void tg__kernel_set(tg_kernel_id id, tg_backend backend, tg_dtype dtype,
                                tg_kernel_fn fn);
TG_INTERNAL const char *tg__kernel_name(tg_kernel_id id);
/* Registration entry points of each backend (called once, ref first). */
TG_INTERNAL void tg__backend_ref_register(void);
TG_INTERNAL void tg__backend_cpu_register(void);
/* Per-family registration, called by the two above. */
TG_INTERNAL void tg__ref_ext_register(void);
TG_INTERNAL void tg__cpu_ext_register(void);
TG_INTERNAL void tg__ref_nn_register(void);
TG_INTERNAL void tg__cpu_nn_register(void);
TG_INTERNAL void tg__backend_init(void);
/* OpenBLAS's thread count (1 with another BLAS), and setting it. */
TG_INTERNAL int tg__blas_threads(void);
TG_INTERNAL void tg__blas_set_threads(int n);

#endif
