/* The one list of built-in ops: adding an op means defining its entry in
 * its family file and naming it here. Dispatch reads this list. */
#include "dispatch/dispatch.h"

#define TG_BUILTIN_OPS(X)                                                           \
    X(add) X(sub) X(mul) X(div) X(neg) X(exp) X(log) X(sqrt) X(tanh) X(sigmoid)     \
    X(relu) X(pow_scalar) X(add_scalar) X(mul_scalar) X(gt) X(eq)                   \
    X(sum) X(mean) X(max_dim) X(argmax)                                             \
    X(reshape) X(permute) X(expand) X(sum_to) X(contiguous) X(to_device) X(cast)    \
    X(matmul) X(affine) X(softmax) X(log_softmax) X(cross_entropy) X(mse_loss)                \
    X(exp_backward) X(log_backward) X(sqrt_backward) X(tanh_backward)               \
    X(sigmoid_backward) X(relu_backward) X(pow_backward) X(max_dim_backward)        \
    X(softmax_backward) X(log_softmax_backward) X(cross_entropy_backward)           \
    TG_BUILTIN_EXT_OPS(X) TG_BUILTIN_NN_OPS(X)

/* Extended elementwise/reduction/indexing ops (src/ops/ext_*.c). */
#define TG_BUILTIN_EXT_OPS(X)                                                       \
    X(abs) X(abs_backward) X(gelu) X(gelu_backward) X(silu) X(silu_backward)        \
    X(leaky_relu) X(leaky_relu_backward) X(clamp) X(clamp_backward)                 \
    X(softplus) X(softplus_backward) X(dropout)                                     \
    X(where) X(masked_fill) X(minimum) X(maximum)                                   \
    X(min_dim) X(logsumexp) X(var) X(std)                                           \
    X(concat) X(narrow) X(index_select) X(index_select_backward) X(gather)          \
    X(gather_backward) X(embedding)

/* Neural-network ops: conv, pooling, normalisation (src/ops/nn_*.c). */
#define TG_BUILTIN_NN_OPS(X)                                                        \
    X(conv2d) X(conv2d_backward_input) X(conv2d_backward_weight) X(bias_grad)       \
    X(max_pool2d) X(max_pool2d_backward) X(avg_pool2d) X(avg_pool2d_backward)       \
    X(layer_norm) X(layer_norm_backward) X(layer_norm_backward_weight)              \
    X(batch_norm) X(batch_norm_backward) X(batch_norm_backward_weight)

#define TG__DECLARE(name) extern const tg_op tg__op_##name;
TG_BUILTIN_OPS(TG__DECLARE)
#undef TG__DECLARE

const tg_op *const tg__builtin_ops[] = {
#define TG__ENTRY(name) &tg__op_##name,
    TG_BUILTIN_OPS(TG__ENTRY)
#undef TG__ENTRY
    NULL,
};
