/* tapegrad/layers.h - layers and losses built on the public ops.
 * Included by <tapegrad.h>; do not include directly.
 *
 * A layer adds its parameters to a tg_params set under "<name>.<field>"
 * (PyTorch's names and layouts, so parameter files move between the two)
 * and initialises them from the seeded generator as PyTorch does by
 * default; re-initialise with tg_init_* on the tensors the accessors give.
 * Layers are opaque; free them before the parameter set. A forward returns
 * a new reference (scope-owned inside a scope) or NULL with the last error
 * set, like every op. */
#ifndef TAPEGRAD_LAYERS_H
#define TAPEGRAD_LAYERS_H

#include "nn.h"
#include "params.h"

/* ---- Linear: y = x W^T + b, W (out, in), b (out). x (..., in). The
 * transpose is a view handed to BLAS as a flag. Init: W, b ~ U(-k, k),
 * k = 1/sqrt(in). */
typedef struct tg_linear tg_linear;
tg_linear *tg_linear_new(tg_params *ps, const char *name, int64_t in, int64_t out, bool bias,
                         tg_dtype dtype, tg_rng *rng);
tg_tensor *tg_linear_forward(const tg_linear *l, tg_tensor *x);
tg_tensor *tg_linear_weight(const tg_linear *l); /* borrowed */
tg_tensor *tg_linear_bias(const tg_linear *l);   /* borrowed, NULL without bias */
void tg_linear_free(tg_linear *l);

/* ---- Conv2d: tg_conv2d with W (out, in/groups, kh, kw), b (out). Init:
 * U(-k, k), k = 1/sqrt(in/groups * kh * kw). opts may be NULL (defaults). */
typedef struct tg_conv2d_layer tg_conv2d_layer;
tg_conv2d_layer *tg_conv2d_layer_new(tg_params *ps, const char *name, int64_t in, int64_t out,
                                     int kh, int kw, const tg_conv2d_opts *opts, bool bias,
                                     tg_dtype dtype, tg_rng *rng);
tg_tensor *tg_conv2d_layer_forward(const tg_conv2d_layer *l, tg_tensor *x);
/* tg_relu(tg_conv2d_layer_forward(l, x)) as one conv2d_relu op (nn.h):
 * the same values and gradients, bit for bit, a pass over the output
 * fewer. */
tg_tensor *tg_conv2d_layer_forward_relu(const tg_conv2d_layer *l, tg_tensor *x);
tg_tensor *tg_conv2d_layer_weight(const tg_conv2d_layer *l);
void tg_conv2d_layer_free(tg_conv2d_layer *l);

/* ---- LayerNorm over the last ndims dims of the given shape; weight 1,
 * bias 0 (both trainable). */
typedef struct tg_layer_norm_layer tg_layer_norm_layer;
tg_layer_norm_layer *tg_layer_norm_layer_new(tg_params *ps, const char *name, int ndims,
                                             const int64_t *shape, double eps, tg_dtype dtype);
tg_tensor *tg_layer_norm_layer_forward(const tg_layer_norm_layer *l, tg_tensor *x);
void tg_layer_norm_layer_free(tg_layer_norm_layer *l);

/* ---- BatchNorm over channel dim 1 of (N, C) or (N, C, ...): weight 1,
 * bias 0, and buffers running_mean 0, running_var 1 saved with the
 * parameters (PyTorch's names). training selects batch or running
 * statistics (tg_batch_norm). */
typedef struct tg_batch_norm_layer tg_batch_norm_layer;
tg_batch_norm_layer *tg_batch_norm_layer_new(tg_params *ps, const char *name, int64_t channels,
                                             double momentum, double eps, tg_dtype dtype);
tg_tensor *tg_batch_norm_layer_forward(const tg_batch_norm_layer *l, tg_tensor *x, bool training);
void tg_batch_norm_layer_free(tg_batch_norm_layer *l);

/* ---- Sequential: modules applied in order to one tensor, run as the
 * stages of tg_checkpoint_sequential (tape.h): each in a scope of its own,
 * each output released once the next module has run, so that beside what
 * the tape saves the forward holds one module's values at a time and the
 * process's peak follows the checkpoint policy. nsegments as there: 1 for
 * no segment (tape may then be NULL), 0 for ceil(sqrt(n)) groups, k for k,
 * -s for binomial checkpointing with s slots.
 * The container borrows its modules (free them after it, or before if it
 * is not run again) and must outlive the tape's backward when segmented
 * (backward re-runs the stages through it). Add functions: TG_ERR_NULL for
 * a NULL container or module. A map is any tg_tensor *(*)(tg_tensor *)
 * (tg_relu, tg_tanh, tg_sigmoid, tg_gelu, ...); flatten reshapes (N, ...)
 * to (N, rest); a stage is fn(userdata, index in the container, x). */
typedef struct tg_sequential tg_sequential;
tg_sequential *tg_sequential_new(void);
tg_status tg_sequential_add_linear(tg_sequential *s, const tg_linear *l);
tg_status tg_sequential_add_conv2d(tg_sequential *s, const tg_conv2d_layer *l);
tg_status tg_sequential_add_layer_norm(tg_sequential *s, const tg_layer_norm_layer *l);
tg_status tg_sequential_add_map(tg_sequential *s, tg_tensor *(*f)(tg_tensor *x));
tg_status tg_sequential_add_flatten(tg_sequential *s);
tg_status tg_sequential_add_stage(tg_sequential *s, tg_segment_fn fn, void *userdata);
int tg_sequential_count(const tg_sequential *s); /* 0 for NULL */
tg_tensor *tg_sequential_forward(const tg_sequential *s, tg_tape *tape, int nsegments,
                                 tg_tensor *x);
void tg_sequential_free(tg_sequential *s);

/* ---- Embedding: rows of W (count, dim) for i64 ids; init N(0, 1). */
typedef struct tg_embedding_layer tg_embedding_layer;
tg_embedding_layer *tg_embedding_layer_new(tg_params *ps, const char *name, int64_t count,
                                           int64_t dim, tg_dtype dtype, tg_rng *rng);
tg_tensor *tg_embedding_layer_forward(const tg_embedding_layer *l, tg_tensor *ids);
void tg_embedding_layer_free(tg_embedding_layer *l);

/* ---- Recurrent cells (PyTorch's RNNCell and LSTMCell). Weights
 * weight_ih (G*hidden, in), weight_hh (G*hidden, hidden), biases bias_ih,
 * bias_hh (G*hidden), G = 1 (RNN) or 4 (LSTM, gates i, f, g, o); init
 * U(-k, k), k = 1/sqrt(hidden). x (B, in), h and c (B, hidden).
 *   RNN:  h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh)
 *   LSTM: i, f, g, o = split(x W_ih^T + b_ih + h W_hh^T + b_hh);
 *         c' = sigmoid(f) c + sigmoid(i) tanh(g); h' = sigmoid(o) tanh(c') */
typedef struct tg_rnn_cell tg_rnn_cell;
tg_rnn_cell *tg_rnn_cell_new(tg_params *ps, const char *name, int64_t in, int64_t hidden,
                             tg_dtype dtype, tg_rng *rng);
tg_tensor *tg_rnn_cell_forward(const tg_rnn_cell *cell, tg_tensor *x, tg_tensor *h);
void tg_rnn_cell_free(tg_rnn_cell *cell);

typedef struct tg_lstm_cell tg_lstm_cell;
tg_lstm_cell *tg_lstm_cell_new(tg_params *ps, const char *name, int64_t in, int64_t hidden,
                               tg_dtype dtype, tg_rng *rng);
/* Sets *h_out and *c_out (new references / scope-owned). TG_OK or the
 * error; both NULL on failure. */
tg_status tg_lstm_cell_forward(const tg_lstm_cell *cell, tg_tensor *x, tg_tensor *h, tg_tensor *c,
                               tg_tensor **h_out, tg_tensor **c_out);
void tg_lstm_cell_free(tg_lstm_cell *cell);

/* ---- LSTM over a sequence (PyTorch's nn.LSTM, one layer, batch_first
 * false): the LSTM cell's parameters (the same names, shapes, init and
 * draws, so a cell and a layer of one name share parameter files) and one
 * tg_lstm op (nn.h) for all T steps. x (T, B, in) or, unbatched, (T, in);
 * h0 and c0 (B, hidden) / (hidden), or NULL for zeros. Sets, where not
 * NULL, *out (T, B, hidden) to h_1..h_T and *h_n, *c_n (B, hidden) to the
 * final state: views of the op's result (new references / scope-owned).
 * TG_OK or the error, every asked output NULL on failure. */
typedef struct tg_lstm_layer tg_lstm_layer;
tg_lstm_layer *tg_lstm_layer_new(tg_params *ps, const char *name, int64_t in, int64_t hidden,
                                 tg_dtype dtype, tg_rng *rng);
tg_status tg_lstm_layer_forward(const tg_lstm_layer *l, tg_tensor *x, tg_tensor *h0,
                                tg_tensor *c0, tg_tensor **out, tg_tensor **h_n,
                                tg_tensor **c_n);
/* The tg_lstm options its forwards pass (NULL: the defaults, which a new
 * layer has). TG_ERR_NULL for a NULL layer. */
tg_status tg_lstm_layer_set_opts(tg_lstm_layer *l, const tg_lstm_opts *opts);
void tg_lstm_layer_free(tg_lstm_layer *l);

/* ---- Losses, reduced to a 0-d mean as PyTorch's reduction='mean'. */

/* Cross-entropy of logits (N, C) against i64 targets (N). opts may be
 * NULL. With class weights w (C): sum_n w[t_n] l_n / sum_n w[t_n]. With
 * label smoothing e: l_n = (1 - e) (-logp[n, t_n]) + e/C sum_c -logp[n, c]
 * (weighted by w[c] when given), PyTorch's definition. */
typedef struct tg_cross_entropy_opts {
    double label_smoothing; /* in [0, 1] */
    tg_tensor *weight;      /* (C) or NULL */
} tg_cross_entropy_opts;
tg_tensor *tg_loss_cross_entropy(tg_tensor *logits, tg_tensor *targets,
                                 const tg_cross_entropy_opts *opts);
/* Negative log-likelihood of log-probabilities logp (N, C): the weighted
 * mean of -logp[n, t_n] (weight (C) or NULL). */
tg_tensor *tg_loss_nll(tg_tensor *logp, tg_tensor *targets, tg_tensor *weight);
/* mean((pred - target)^2). */
tg_tensor *tg_loss_mse(tg_tensor *pred, tg_tensor *target);
/* Binary cross-entropy on logits x and targets y in [0, 1] (same shape),
 * stable: mean((1 - y) x + (1 + (p - 1) y) (log(1 + e^-|x|) + max(-x, 0))),
 * p = pos_weight (broadcast over the last dim) or 1 when NULL. */
tg_tensor *tg_loss_bce_with_logits(tg_tensor *x, tg_tensor *y, tg_tensor *pos_weight);
/* Huber: mean of d^2 / 2 where |d| < delta, else delta (|d| - delta / 2),
 * d = pred - target; delta > 0. */
tg_tensor *tg_loss_huber(tg_tensor *pred, tg_tensor *target, double delta);

#endif
