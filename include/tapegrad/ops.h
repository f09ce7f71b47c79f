/* tapegrad/ops.h - the built-in ops. Included by <tapegrad.h>.
 *
 * Every op returns a new reference (scope-owned inside a scope), or NULL with
 * the last error set. An op given a NULL input returns NULL and keeps the
 * error already recorded. If any input requires grad (and grad mode is on)
 * the result is recorded on the input's tape. Binary ops broadcast by NumPy
 * rules and need equal dtypes and backends. Floating ops reject i64. Dims may
 * be negative (counted from the end). */
#ifndef TAPEGRAD_OPS_H
#define TAPEGRAD_OPS_H

#include "tensor.h"

/* Elementwise, broadcasting. */
tg_tensor *tg_add(tg_tensor *a, tg_tensor *b); /* a + b */
tg_tensor *tg_sub(tg_tensor *a, tg_tensor *b); /* a - b */
tg_tensor *tg_mul(tg_tensor *a, tg_tensor *b); /* a * b */
tg_tensor *tg_div(tg_tensor *a, tg_tensor *b); /* a / b */

/* Elementwise unary. */
tg_tensor *tg_neg(tg_tensor *x);     /* -x */
tg_tensor *tg_exp(tg_tensor *x);     /* e^x */
tg_tensor *tg_log(tg_tensor *x);     /* ln x */
tg_tensor *tg_sqrt(tg_tensor *x);    /* sqrt x */
tg_tensor *tg_tanh(tg_tensor *x);    /* tanh x */
tg_tensor *tg_sigmoid(tg_tensor *x); /* 1 / (1 + e^-x) */
tg_tensor *tg_relu(tg_tensor *x);    /* max(0, x); gradient 0 at x == 0 */
tg_tensor *tg_pow_scalar(tg_tensor *x, double p); /* x^p */
tg_tensor *tg_add_scalar(tg_tensor *x, double s); /* x + s */
tg_tensor *tg_mul_scalar(tg_tensor *x, double s); /* x * s */

/* Comparisons (non-differentiable: results are never tracked). 1 where
 * a > b (resp. a == b), else 0, in the inputs' dtype; broadcasting. */
tg_tensor *tg_gt(tg_tensor *a, tg_tensor *b);
tg_tensor *tg_eq(tg_tensor *a, tg_tensor *b);

/* Reductions. Sums accumulate in f64. The mean of zero elements is 0. */
tg_tensor *tg_sum(tg_tensor *x);  /* sum of all elements, 0-d */
tg_tensor *tg_mean(tg_tensor *x); /* mean of all elements, 0-d */
/* Sum/mean over the ndims listed dims; keepdim keeps them with size 1.
 * ndims == 0 reduces nothing (a copy of x). */
tg_tensor *tg_sum_dims(tg_tensor *x, int ndims, const int *dims, bool keepdim);
tg_tensor *tg_mean_dims(tg_tensor *x, int ndims, const int *dims, bool keepdim);
/* Max along dim; the gradient goes to the first maximal element. */
tg_tensor *tg_max_dim(tg_tensor *x, int dim, bool keepdim);
/* Index of the first maximum along dim, i64 (non-differentiable). */
tg_tensor *tg_argmax(tg_tensor *x, int dim, bool keepdim);

/* Shape ops. reshape of contiguous data is a view (one size may be -1);
 * transpose/permute are strided views; expand broadcasts to shape (a view);
 * sum_to sums a tensor down to a shape it broadcasts to. contiguous copies
 * a strided view into fresh row-major storage. */
tg_tensor *tg_reshape(tg_tensor *x, int ndim, const int64_t *shape);
tg_tensor *tg_transpose(tg_tensor *x, int dim0, int dim1);
tg_tensor *tg_permute(tg_tensor *x, int ndim, const int *perm);
tg_tensor *tg_expand(tg_tensor *x, int ndim, const int64_t *shape);
tg_tensor *tg_sum_to(tg_tensor *x, int ndim, const int64_t *shape);
tg_tensor *tg_contiguous(tg_tensor *x);

/* Matrix product. 2-d: (m,k) x (k,n) -> (m,n). N-d: batched over leading
 * dims with broadcasting; 1-d operands are not accepted. A transposed view of
 * a contiguous matrix is passed to BLAS as a transpose flag, never copied. */
tg_tensor *tg_matmul(tg_tensor *a, tg_tensor *b);

/* softmax(x)_i = e^x_i / sum_j e^x_j along dim; log_softmax is its log,
 * computed stably (max subtracted). */
tg_tensor *tg_softmax(tg_tensor *x, int dim);
tg_tensor *tg_log_softmax(tg_tensor *x, int dim);

/* Losses, mean over the batch. cross_entropy: logits (N, C) floating,
 * targets (N) i64 in [0, C); fused log-softmax + NLL. mse: mean((a - b)^2). */
tg_tensor *tg_cross_entropy(tg_tensor *logits, tg_tensor *targets);
tg_tensor *tg_mse_loss(tg_tensor *pred, tg_tensor *target);

/* Copy to another backend; differentiable (the gradient moves back). */
tg_tensor *tg_to_device(tg_tensor *x, tg_backend backend);
/* Convert dtype between f32 and f64 (differentiable), or to/from i64
 * (non-differentiable use only). */
tg_tensor *tg_cast(tg_tensor *x, tg_dtype dtype);

#endif
