/* tapegrad/params.h - named parameter sets, their gradients, clipping and
 * initialisers. Included by <tapegrad.h>; do not include directly.
 *
 * A parameter set keeps the values of all its trainable parameters of one
 * dtype in ONE flat buffer, and their gradients in a second flat buffer of
 * the same layout, so zeroing, clipping, optimizer steps and saving are
 * single loops. Each parameter is a borrowed tensor that is a contiguous
 * view into the value buffer; use it in ops like any tensor.
 *
 * Gradients: a backward writes a parameter's gradient straight into its
 * view of the flat gradient buffer when the parameter has none yet (its
 * gradient sink; docs/api.md), else the tape accumulates the gradient as a
 * tensor of its own (tg_grad). Every function below that reads gradients
 * first *syncs* them:
 * a leaf gradient that is not yet the parameter's view into the flat
 * gradient buffer is copied there and replaced by that view (same values),
 * so afterwards tg_grad(param) and the flat buffer are the same memory and
 * clipping or scaling the flat buffer is what tg_grad shows. A parameter
 * with no gradient (tg_grad_zero, or never reached by a backward) reads as
 * zeros in the flat buffer and is skipped by optimizer steps, as in
 * PyTorch. Gradients accumulate across backward calls until zero_grad, which
 * is how gradient accumulation over micro-batches works (optim.h). */
#ifndef TAPEGRAD_PARAMS_H
#define TAPEGRAD_PARAMS_H

#include "tape.h"

/* Opaque named parameter set. */
typedef struct tg_params tg_params;

/* New empty set (tensors on the thread's default backend). NULL on OOM. */
tg_params *tg_params_new(void);
/* Frees the set and releases its tensors; a parameter tensor that someone
 * else retained stays valid (and keeps the flat buffer alive). No-op on
 * NULL. An optimizer over ps must not be used afterwards (tg_optim_free
 * still may be called, in either order). */
void tg_params_free(tg_params *ps);

/* Adds a trainable parameter (f32 or f64), zero-initialised, and returns it:
 * a borrowed contiguous view into the flat buffer, valid while ps lives.
 * Names are unique, non-empty, at most 255 bytes, and may not start with
 * "optim/" or be "__metadata__" (reserved in parameter files).
 * TG_ERR_EXISTS for a duplicate name, TG_ERR_INVALID for a bad name,
 * TG_ERR_DTYPE for i64. Growing the buffer moves it: data pointers from
 * tg_tensor_data taken before the last add are invalid (tensors are not). */
tg_tensor *tg_params_add(tg_params *ps, const char *name, tg_dtype dtype, int ndim,
                         const int64_t *shape);
/* Adds a buffer: state saved and loaded with the parameters but never
 * marked as a leaf nor optimised (running statistics, counters). Any dtype,
 * i64 included. Same rules as tg_params_add. */
tg_tensor *tg_params_add_buffer(tg_params *ps, const char *name, tg_dtype dtype, int ndim,
                                const int64_t *shape);

/* Number of entries (parameters and buffers, in order of addition). */
int tg_params_count(const tg_params *ps);
/* Entry i (borrowed), its name, and whether it is trainable; NULL/false
 * with TG_ERR_INVALID if i is out of range. */
tg_tensor *tg_params_at(const tg_params *ps, int i);
const char *tg_params_name(const tg_params *ps, int i);
bool tg_params_trainable(const tg_params *ps, int i);
/* Index of the entry called name, or -1 with TG_ERR_NOT_FOUND. */
int tg_params_index(const tg_params *ps, const char *name);
/* Entry called name (borrowed), or NULL with TG_ERR_NOT_FOUND. */
tg_tensor *tg_params_find(const tg_params *ps, const char *name);
/* Total number of trainable elements (all dtypes). */
int64_t tg_params_numel(const tg_params *ps);

/* Marks every trainable parameter as a leaf of tape (see tg_requires_grad;
 * call again for a new tape after freeing the old one). */
tg_status tg_params_requires_grad(tg_params *ps, tg_tape *tape);

/* New reference: a 1-d view over all trainable values of dtype (numel
 * elements, possibly 0), in order of addition. Syncs gradients first for
 * the _grad variant. NULL with TG_ERR_NOT_FOUND if ps has no trainable
 * parameter of dtype. Valid until the next tg_params_add (then make a new
 * one). */
tg_tensor *tg_params_flat(tg_params *ps, tg_dtype dtype);
tg_tensor *tg_params_flat_grad(tg_params *ps, tg_dtype dtype);

/* Moves every leaf gradient into the flat gradient buffer (see above).
 * Called by everything that reads gradients; idempotent and cheap. */
tg_status tg_params_sync_grad(tg_params *ps);
/* Drops every parameter's gradient (tg_grad_zero): the next backward starts
 * from nothing. The flat buffers are not touched (the next backward writes
 * into them; a sync zero-fills what no backward reached), so a view of one
 * that you hold reads zeros only after the next sync. */
void tg_params_zero_grad(tg_params *ps);
/* grad *= factor for every parameter that has a gradient (e.g. 1/k after
 * accumulating k micro-batches). */
tg_status tg_params_scale_grad(tg_params *ps, double factor);
/* Global L2 norm of all gradients, sqrt(sum g^2), accumulated in f64.
 * 0 if no parameter has a gradient; -1 with the last error set on failure. */
double tg_params_grad_norm(tg_params *ps);
/* Global-norm clipping as torch.nn.utils.clip_grad_norm_: with
 * total = grad_norm, every gradient is multiplied by
 * min(1, max_norm / (total + 1e-6)). Stores total in *total_norm if not
 * NULL. TG_ERR_INVALID if max_norm is not positive and finite, or if total
 * is NaN or infinite (then the gradients are left unchanged). */
tg_status tg_params_clip_grad_norm(tg_params *ps, double max_norm, double *total_norm);

/* ---- Initialisers, from the seeded generator. Each fills a contiguous
 * floating tensor in place (any tensor, not only parameters) and returns
 * TG_ERR_DTYPE for i64, TG_ERR_INVALID for a strided view. Samples are drawn
 * in f64 in row-major order, then rounded to the dtype, like
 * tg_rand_uniform/tg_rand_normal, so a seed gives the same values
 * everywhere. */

/* Nonlinearities for tg_init_gain (torch.nn.init.calculate_gain). */
typedef enum tg_nonlinearity {
    TG_NONLIN_LINEAR = 0, /* 1 (also for conv and identity) */
    TG_NONLIN_SIGMOID,    /* 1 */
    TG_NONLIN_TANH,       /* 5/3 */
    TG_NONLIN_RELU,       /* sqrt(2) */
    TG_NONLIN_LEAKY_RELU  /* sqrt(2 / (1 + slope^2)) */
} tg_nonlinearity;

/* Recommended gain; param is the leaky_relu negative slope (ignored by the
 * others). */
double tg_init_gain(tg_nonlinearity nonlinearity, double param);

/* Fans as in PyTorch for a weight of shape [out, in, k...]: receptive field
 * r = prod(k...), fan_in = in * r, fan_out = out * r. TG_ERR_SHAPE for
 * fewer than 2 dims. */
tg_status tg_init_fans(const tg_tensor *t, int64_t *fan_in, int64_t *fan_out);

typedef enum tg_fan_mode { TG_FAN_IN = 0, TG_FAN_OUT = 1 } tg_fan_mode;

tg_status tg_init_constant(tg_tensor *t, double value);
tg_status tg_init_zeros(tg_tensor *t);
/* U(lo, hi) and N(mean, std^2). */
tg_status tg_init_uniform(tg_tensor *t, tg_rng *rng, double lo, double hi);
tg_status tg_init_normal(tg_tensor *t, tg_rng *rng, double mean, double std);
/* Glorot: std = gain * sqrt(2 / (fan_in + fan_out)); the uniform variant
 * samples U(-a, a) with a = sqrt(3) * std. */
tg_status tg_init_xavier_uniform(tg_tensor *t, tg_rng *rng, double gain);
tg_status tg_init_xavier_normal(tg_tensor *t, tg_rng *rng, double gain);
/* He: std = gain / sqrt(fan) with fan = fan_in or fan_out; uniform samples
 * U(-a, a) with a = sqrt(3) * std. For ReLU pass
 * tg_init_gain(TG_NONLIN_RELU, 0). */
tg_status tg_init_kaiming_uniform(tg_tensor *t, tg_rng *rng, tg_fan_mode mode, double gain);
tg_status tg_init_kaiming_normal(tg_tensor *t, tg_rng *rng, tg_fan_mode mode, double gain);

#endif
