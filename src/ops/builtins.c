/* The one list of built-in ops, in registry order, by domain file. Adding
 * an op means defining its tg_op in its domain file and naming it here;
 * dispatch's registry reads this list and nothing else. */
#include "dispatch/dispatch.h"

#define TG_BUILTIN_OPS(X)                                                           \
    /* unary.c: maps, each with its fused gradient op */                            \
    X(exp) X(log) X(sqrt) X(tanh) X(sigmoid) X(relu) X(pow_scalar)                  \
    X(abs) X(gelu) X(silu) X(leaky_relu) X(clamp) X(softplus)                       \
    X(neg) X(add_scalar) X(mul_scalar)                                              \
    X(exp_backward) X(log_backward) X(sqrt_backward) X(tanh_backward)               \
    X(sigmoid_backward) X(relu_backward) X(pow_backward) X(abs_backward)            \
    X(gelu_backward) X(silu_backward) X(leaky_relu_backward) X(clamp_backward)      \
    X(softplus_backward)                                                            \
    X(sin) X(cos) X(sin_backward) X(cos_backward)                                   \
    /* binary.c */                                                                  \
    X(add) X(sub) X(mul) X(div) X(minimum) X(maximum) X(gt) X(eq)                   \
    /* reduce.c */                                                                  \
    X(sum) X(mean) X(max_dim) X(min_dim) X(max_dim_backward) X(argmax)              \
    X(logsumexp) X(var) X(std)                                                      \
    /* shape.c: views, movement, joins */                                           \
    X(reshape) X(permute) X(expand) X(sum_to) X(contiguous) X(to_device) X(cast)    \
    X(concat) X(narrow)                                                             \
    /* index.c: indexing and selection */                                           \
    X(index_select) X(index_select_backward) X(gather) X(gather_backward)           \
    X(embedding) X(where) X(masked_fill)                                            \
    /* matmul.c */                                                                  \
    X(matmul) X(affine)                                                             \
    /* softmax_loss.c */                                                            \
    X(softmax) X(log_softmax) X(softmax_backward) X(log_softmax_backward)           \
    X(cross_entropy) X(cross_entropy_backward) X(mse_loss)                          \
    /* conv.c */                                                                    \
    X(conv2d) X(conv2d_backward_input) X(conv2d_backward_weight) X(bias_grad)       \
    X(conv2d_relu)                                                                  \
    /* pool.c */                                                                    \
    X(max_pool2d) X(max_pool2d_backward) X(avg_pool2d) X(avg_pool2d_backward)       \
    /* norm.c */                                                                    \
    X(layer_norm) X(layer_norm_backward) X(layer_norm_backward_weight)              \
    X(batch_norm) X(batch_norm_backward) X(batch_norm_backward_weight)              \
    /* random.c */                                                                  \
    X(dropout)                                                                      \
    /* recurrent.c */                                                               \
    X(lstm_gates)                                                                   \
    X(lstm)                                                                         \
    /* fused.c */                                                                   \
    X(fused_pointwise_1) X(fused_pointwise_2) X(fused_pointwise_3)               \
    X(fused_sum_1) X(fused_sum_2) X(fused_sum_3)

#define TG__DECLARE(name) extern const tg_op tg__op_##name;
TG_BUILTIN_OPS(TG__DECLARE)
#undef TG__DECLARE

const tg_op *const tg__builtin_ops[] = {
#define TG__ENTRY(name) &tg__op_##name,
    TG_BUILTIN_OPS(TG__ENTRY)
#undef TG__ENTRY
    NULL,
};
