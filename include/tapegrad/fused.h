/* tapegrad/fused.h - fused pointwise functions.
 * Included by <tapegrad.h>; do not include directly. docs/api.md has the
 * details and docs/benchmarks.md what they save.
 *
 * Eager ops write every result to memory, and a chain of elementwise ops
 * over large tensors spends its time streaming those results in and out.
 * A fused function runs such a chain block by block instead: the
 * intermediate values stay in cache, and only the result and the values
 * the ops' backward reads are written; its backward runs block by block
 * too. Write the chain as a function of its inputs, compile it once, call
 * it like an op:
 *
 *     static tg_tensor *chain(void *ud, int n, tg_tensor *const *in)
 *     {
 *         tg_tensor *x = in[0];
 *         return tg_mul(tg_tanh(tg_add_scalar(tg_mul(x, x), 1.0)), tg_sigmoid(x));
 *     }
 *     tg_fused *f = tg_fused_new(chain, NULL, 1);
 *     ...
 *     tg_tensor *y = tg_fused_call(f, 1, &x);   (each step)
 *
 * What a function may use: the unary maps (exp, log, sqrt, tanh, sigmoid,
 * relu, pow_scalar, abs, gelu, silu, leaky_relu, clamp, softplus, sin,
 * cos, neg, add_scalar, mul_scalar) and add, sub and mul of two values of
 * the call's shape; constants enter as the scalars of add_scalar and
 * mul_scalar. tg_fused_new runs fn once on one-element inputs and records
 * what it does, so fn must apply the same ops whatever the values and
 * shapes (no branches on data).
 *
 * The result and, where the inputs' gradients come from the call alone,
 * the gradients are bitwise those of running fn's ops one by one (the
 * same kernels on the same operands, sums in the sweep's order; but that
 * a product seeded with 1 hands on a signaling NaN operand unquieted). The
 * call records one node, which keeps its inputs and what the ops would
 * keep; backward through it works under every checkpoint policy and to
 * any order (create_graph runs the ops' own backward as recorded ops). */
#ifndef TAPEGRAD_FUSED_H
#define TAPEGRAD_FUSED_H
#include "tensor.h"

#define TG_FUSED_MAX_INPUTS 3
#define TG_FUSED_MAX_OPS 64

typedef tg_tensor *(*tg_fused_fn)(void *userdata, int n, tg_tensor *const *in);
typedef struct tg_fused tg_fused;

/* Compiles fn over n inputs (1..TG_FUSED_MAX_INPUTS). NULL on error:
 * TG_ERR_NULL (fn), TG_ERR_INVALID (n), TG_ERR_UNSUPPORTED naming the
 * first op fn applies that a fused function cannot run, or reading a
 * tensor that is not one of its inputs (or returning an input, or an
 * untracked tensor), TG_ERR_INVALID for more than TG_FUSED_MAX_OPS ops,
 * fn's own error if it returns NULL, TG_ERR_NOMEM. */
tg_fused *tg_fused_new(tg_fused_fn fn, void *userdata, int n);
/* fn's ops applied to in[0..n), which must share one float dtype, shape
 * and backend (any layout): a new result, like any op's (scope-owned in a
 * scope; tracked when an input requires grad). Errors as an op's:
 * TG_ERR_NULL, TG_ERR_INVALID (n not the compiled count), TG_ERR_DTYPE,
 * TG_ERR_SHAPE, TG_ERR_DEVICE. */
tg_tensor *tg_fused_call(const tg_fused *f, int n, tg_tensor *const *in);
/* The sum of every element of tg_fused_call(f, n, in), as tg_sum gives it
 * (bit for bit, and so its gradients), without writing the result where
 * it can: a loss that ends a chain. A 0-d tensor; errors as
 * tg_fused_call's. On the cpu in f32 the blocks' results are summed as
 * they are made when the values can be shown to sum exactly (what
 * tg_sum's fast pass needs); otherwise, and for f64, the result is
 * written and summed as tg_sum sums it, which costs one more forward
 * pass where the first could not show it. Recorded, the forward also
 * makes the inputs' gradients for a seed of 1 and keeps them (where they
 * are no more than the values the backward would read): a loss's
 * backward then only hands them on; another seed runs the forward again.
 * The gradients are bitwise those of tg_sum(tg_fused_call(...)). */
tg_tensor *tg_fused_sum(const tg_fused *f, int n, tg_tensor *const *in);
/* The number of ops in the compiled program (fn's ops that reach its
 * result); 0 for NULL. */
int tg_fused_ops(const tg_fused *f);
/* Frees f; nodes that recorded calls keep what their backward needs.
 * No-op on NULL. Nothing in f changes after tg_fused_new: threads may call
 * it at once. */
void tg_fused_free(tg_fused *f);
#endif
