/* tapegrad/nn.h - neural-network ops: convolution, pooling,
 * normalisation, the LSTM step's gates. Included by <tapegrad.h>; do not include directly.
 * Conventions as in ops.h (new references, sticky NULLs, recording).
 * Images are NCHW: x (N, C, H, W), floating, contiguous or not. Optional
 * tensors (bias, norm weights) may be NULL; a NULL there means "absent",
 * so check a nested expression passed in such a slot yourself. */
#ifndef TAPEGRAD_NN_H
#define TAPEGRAD_NN_H

#include "tensor.h"

/* Convolution options, by pointer; NULL or a zeroed struct gives the
 * defaults: stride 1, padding 0, dilation 1, groups 1. Index 0 is the
 * height, 1 the width. */
typedef struct tg_conv2d_opts {
    int stride[2];   /* >= 1; 0 means 1 */
    int padding[2];  /* >= 0, zero padding on both sides */
    int dilation[2]; /* >= 1; 0 means 1 */
    int groups;      /* >= 1, divides C and O; 0 means 1 */
} tg_conv2d_opts;

/* y[n,o] = b[o] + sum_{c,i,j} w[o,c,i,j] x[n, g*C/G + c, oh*s + i*d - p, ...]
 * (cross-correlation, as in PyTorch). x (N, C, H, W), w (O, C/groups, KH,
 * KW), bias (O) or NULL; y (N, O, OH, OW) with
 * OH = (H + 2 pad - dil (KH - 1) - 1) / stride + 1 (floor), likewise OW.
 * TG_ERR_SHAPE when channels do not match, TG_ERR_INVALID for bad opts. */
tg_tensor *tg_conv2d(tg_tensor *x, tg_tensor *w, tg_tensor *bias, const tg_conv2d_opts *opts);
/* tg_relu(tg_conv2d(x, w, bias, opts)) as one op (conv2d_relu), with the
 * same values and gradients, bit for bit, to any order. It rectifies each
 * image's output while it is in cache and never holds the output before
 * the relu: a pass over the output and a tensor of its size fewer. The
 * node keeps x, w and y. tg_sequential uses it for a conv2d module followed
 * by a tg_relu map. */
tg_tensor *tg_conv2d_relu(tg_tensor *x, tg_tensor *w, tg_tensor *bias,
                          const tg_conv2d_opts *opts);

/* Pooling options, by pointer (required). padding <= kernel / 2. */
typedef struct tg_pool2d_opts {
    int kernel[2];   /* >= 1 */
    int stride[2];   /* >= 1; 0 means the kernel size (PyTorch's default) */
    int padding[2];  /* >= 0 */
    /* avg_pool2d only. false (default): padded cells count in the divisor,
     * PyTorch's count_include_pad=True; true: divide by the number of
     * in-bounds cells. */
    bool exclude_pad;
} tg_pool2d_opts;

/* y[n,c,oh,ow] = max of x over the window (padding is -inf). x (N, C, H, W),
 * y (N, C, OH, OW), OH = (H + 2 pad - kernel) / stride + 1 (floor). The
 * gradient goes to the first maximal cell of each window. */
tg_tensor *tg_max_pool2d(tg_tensor *x, const tg_pool2d_opts *opts);
/* y[n,c,oh,ow] = mean of x over the window (padding is 0; divisor as in
 * opts->exclude_pad). Shapes as for max_pool2d. */
tg_tensor *tg_avg_pool2d(tg_tensor *x, const tg_pool2d_opts *opts);

/* The LSTM cell's pointwise half as one op (lstm_gates): z (B, 4H) holds
 * the gates' pre-activations i, f, g, o in that order along dim 1, c (B, H)
 * the cell state, both of one floating dtype. Returns y (2, B, H) with
 * y[1] = c' = sigmoid(f) c + sigmoid(i) tanh(g) and
 * y[0] = h' = sigmoid(o) tanh(c'); tg_narrow along dim 0 (and a reshape)
 * takes them apart as views. One node and one pass where the composed ops
 * make thirteen; the node keeps z and c. Differentiable to any order.
 * tg_lstm_cell_forward (layers.h) uses it. */
tg_tensor *tg_lstm_gates(tg_tensor *z, tg_tensor *c);

/* T steps of an LSTM as one op (lstm): x (T, ..., I) the inputs (the dims
 * between T and I are the batch, B rows), s0 (2, ..., H) the initial state
 * (s0[0] = h0, s0[1] = c0, the batch dims of x), w (4H, I + H) the weights
 * [W_ih | W_hh] side by side (gates i, f, g, o along dim 0), b (4H) the
 * bias (PyTorch's b_ih + b_hh), all of one floating dtype. Step t makes
 * z_t = x_t W_ih^T + b + h_{t-1} W_hh^T, then h_t and c_t as
 * tg_lstm_gates(z_t, c_{t-1}). Returns y (2, T, ..., H): y[0] holds h_1..h_T
 * (the output sequence), y[1] c_1..c_T; the final state is y[:, T-1].
 * One node where the cell's ops record eight a step: the input projections
 * of all steps are one GEMM, and backward makes the gradients of w, b and x
 * in one GEMM each over all T*B rows, leaving two GEMMs a step (h_{t-1}
 * W_hh^T forward, its gradient backward). The node keeps x, s0, w, b, y and
 * every z_t (6H + I values a row and step), or with opts->remake_gates all
 * but the z_t (2H + I): backward then makes each chunk's z rows again from
 * x, w and the h_{t-1} in y, one GEMM per weight over the chunk (about a
 * third more GEMM work, in large GEMMs). opts may be NULL (keep them).
 * Differentiable to any order. tg_lstm_layer_forward (layers.h) uses it. */
typedef struct tg_lstm_opts {
    bool remake_gates;
} tg_lstm_opts;
tg_tensor *tg_lstm(tg_tensor *x, tg_tensor *s0, tg_tensor *w, tg_tensor *b,
                   const tg_lstm_opts *opts);

/* y = (x - mean) / sqrt(var + eps) * weight + bias, mean and biased var
 * over the last ndims dims of x (1 <= ndims <= ndim). weight and bias have
 * the shape of those dims, or are NULL (1 and 0). eps >= 0. */
tg_tensor *tg_layer_norm(tg_tensor *x, int ndims, tg_tensor *weight, tg_tensor *bias, double eps);

/* y = (x - mean_c) / sqrt(var_c + eps) * weight_c + bias_c per channel c,
 * for x (N, C) or (N, C, *) (e.g. NCHW). weight, bias (C) or NULL.
 * training: mean_c, var_c are the batch statistics over every dim but 1
 * (biased var; needs more than one value per channel); then, if given,
 * running_mean and running_var (C) are updated in place,
 * r = (1 - momentum) r + momentum s, with the unbiased batch var. Evaluation
 * (!training): the running statistics are used and are required. Running
 * tensors are plain untracked tensors of x's dtype and backend (never
 * differentiated; TG_ERR_INVALID if one requires grad); gradients flow to x,
 * weight and bias. */
tg_tensor *tg_batch_norm(tg_tensor *x, tg_tensor *weight, tg_tensor *bias, tg_tensor *running_mean,
                         tg_tensor *running_var, bool training, double momentum, double eps);

#endif
