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

/* y = x W^T + b, a linear layer's map as one op: x (..., in), W (out, in),
 * b (out) -> (..., out), one floating dtype. Results and gradients are
 * bitwise those of tg_add(tg_matmul(x, tg_transpose(W, 0, 1)), b) for 2-d
 * x; the tape records one node instead of three. */
tg_tensor *tg_affine(tg_tensor *x, tg_tensor *w, tg_tensor *b);

/* softmax(x)_i = e^x_i / sum_j e^x_j along dim; log_softmax is its log,
 * computed stably (max subtracted). */
tg_tensor *tg_softmax(tg_tensor *x, int dim);
tg_tensor *tg_log_softmax(tg_tensor *x, int dim);

/* Losses, mean over the batch. cross_entropy: logits (N, C) floating,
 * targets (N) i64 in [0, C); fused log-softmax + NLL. mse: mean((a - b)^2). */
tg_tensor *tg_cross_entropy(tg_tensor *logits, tg_tensor *targets);
tg_tensor *tg_mse_loss(tg_tensor *pred, tg_tensor *target);

/* Copy to another backend; differentiable (the gradient moves back).
 * TG_ERR_INVALID for a backend that does not exist. */
tg_tensor *tg_to_device(tg_tensor *x, tg_backend backend);
/* Convert dtype between f32 and f64 (differentiable), or to/from i64
 * (non-differentiable use only). Float -> i64 truncates toward zero and
 * saturates: NaN -> 0, >= 2^63 (inf too) -> INT64_MAX, <= -2^63 -> INT64_MIN. */
tg_tensor *tg_cast(tg_tensor *x, tg_dtype dtype);

/* ---- extended ops (training issue) ---------------------------------------
 * Same conventions as above. Gradients at kinks: at x == 0 abs gives 0 and
 * leaky_relu gives slope; clamp passes the gradient where lo <= x <= hi;
 * minimum/maximum give it to a on ties.
 * Conditions and masks are i64 or of the data's dtype, nonzero = true. */

/* Elementwise unary, floating. */
tg_tensor *tg_abs(tg_tensor *x);                    /* |x| */
/* min(max(x, lo), hi); -INFINITY / INFINITY leave a side open. NaN bounds:
 * TG_ERR_INVALID. lo > hi gives hi everywhere (as PyTorch). */
tg_tensor *tg_clamp(tg_tensor *x, double lo, double hi);
tg_tensor *tg_gelu(tg_tensor *x);                   /* x Phi(x) = x/2 (1 + erf(x / sqrt 2)) */
tg_tensor *tg_silu(tg_tensor *x);                   /* x sigmoid(x) */
tg_tensor *tg_sin(tg_tensor *x);                    /* sin x (radians) */
tg_tensor *tg_cos(tg_tensor *x);                    /* cos x (radians) */
tg_tensor *tg_leaky_relu(tg_tensor *x, double slope); /* x > 0 ? x : slope x */
/* log(1 + e^(beta x)) / beta, and x itself where beta x > threshold (as
 * PyTorch; its defaults are beta 1, threshold 20). beta > 0, else
 * TG_ERR_INVALID. */
tg_tensor *tg_softplus(tg_tensor *x, double beta, double threshold);
/* Training: x * m / (1 - p), m_i ~ Bernoulli(1 - p) drawn from a seed
 * taken from rng (one tg_rng_next per call, so successive calls differ and
 * a run is reproducible from rng's seed); the mask is kept for backward
 * (and a recompute draws the same one). p == 1 gives zeros. Not training,
 * or p == 0: the identity (a view of x; rng is not used, may be NULL).
 * p outside [0, 1]: TG_ERR_INVALID; NULL rng while training: TG_ERR_NULL. */
tg_tensor *tg_dropout(tg_tensor *x, double p, bool training, tg_rng *rng);

/* Selection, broadcasting. */
/* cond != 0 ? a : b. a and b share a dtype (floating or i64); cond is i64
 * or of a's dtype (NaN counts as true). */
tg_tensor *tg_where(tg_tensor *cond, tg_tensor *a, tg_tensor *b);
/* mask != 0 ? value : x, broadcast over x and mask. */
tg_tensor *tg_masked_fill(tg_tensor *x, tg_tensor *mask, double value);
tg_tensor *tg_minimum(tg_tensor *a, tg_tensor *b); /* min(a, b); NaN propagates */
tg_tensor *tg_maximum(tg_tensor *a, tg_tensor *b); /* max(a, b); NaN propagates */

/* Reductions. */
/* Min along dim; the gradient goes to the first minimal element. */
tg_tensor *tg_min_dim(tg_tensor *x, int dim, bool keepdim);
/* log sum_i e^x_i along dim, computed as m + log sum e^(x_i - m), m the
 * max (so large x does not overflow); an empty dim gives -inf. */
tg_tensor *tg_logsumexp(tg_tensor *x, int dim, bool keepdim);
/* sum (x - mean)^2 / (N - correction) over the ndims listed dims (ndims
 * == 0: over all elements; dims may then be NULL), N the number of reduced
 * elements; correction 1 is the unbiased estimate, 0 the population
 * variance (N <= correction gives inf/NaN, as PyTorch). std = sqrt(var). */
tg_tensor *tg_var(tg_tensor *x, int ndims, const int *dims, int correction, bool keepdim);
tg_tensor *tg_std(tg_tensor *x, int ndims, const int *dims, int correction, bool keepdim);

/* Joining and indexing. Index tensors are i64; an entry outside the
 * indexed dim fails with TG_ERR_INVALID naming the op and the position.
 * These ops accept every dtype (gradients need floating). */
/* The n tensors of xs (not retained; same dtype, same shape outside dim)
 * joined along dim into a new tensor. Recorded as n - 1 binary "concat"
 * nodes over a balanced tree; n == 1 gives a copy. */
tg_tensor *tg_concat(int n, tg_tensor *const *xs, int dim);
/* x[.., start : start + length, ..] along dim, a view sharing x's storage
 * (start < 0 counts from the end). The range must lie inside the dim. */
tg_tensor *tg_narrow(tg_tensor *x, int dim, int64_t start, int64_t length);
/* x with dim replaced by the entries of 1-d index: y[.., j, ..] =
 * x[.., index[j], ..]. Gradient: scatter-add (repeated indices add up). */
tg_tensor *tg_index_select(tg_tensor *x, int dim, tg_tensor *index);
/* y[i] = x[i with coordinate dim replaced by index[i]]; index has x's ndim
 * and no larger size than x outside dim; y has index's shape. Gradient:
 * scatter-add. */
tg_tensor *tg_gather(tg_tensor *x, int dim, tg_tensor *index);
/* Rows of weight (V, D) floating for the ids (any shape, i64 in [0, V)):
 * result ids.shape + (D). Gradient to weight: scatter-add of the rows. */
tg_tensor *tg_embedding(tg_tensor *weight, tg_tensor *ids);

#endif
