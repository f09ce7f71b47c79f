/* tapegrad/functional.h - derivatives of a function as values: VJP, JVP,
 * Hessian-vector product, Jacobian, Hessian (docs/higher-order.md).
 * Included by <tapegrad.h>; do not include directly.
 *
 * Each helper evaluates f on a tape of its own, at views of the given
 * points marked as its leaves (the caller's tensors are not tracked,
 * changed or needed to be leaves of anything), and returns untracked
 * results that follow the op-result rule: owned by the innermost scope if
 * one is open, else new references the caller releases. f is called once
 * per helper call, with grad recording on, and must build its result from
 * its arguments with tg_* ops (a new reference or a scope-owned one).
 * Results have the dtype of the point (gradients) or of f's output. At
 * most TG_FUNC_MAX_INPUTS points. Errors: TG_ERR_NULL (f, an array or a
 * point NULL), TG_ERR_INVALID (n), TG_ERR_DTYPE (a point or f's output not
 * floating), TG_ERR_SHAPE / TG_ERR_SEED (a vector of the wrong shape, f
 * not scalar where it must be), or f's own error; on error every output
 * pointer is set to NULL. */
#ifndef TAPEGRAD_FUNCTIONAL_H
#define TAPEGRAD_FUNCTIONAL_H

#include "tensor.h"

#define TG_FUNC_MAX_INPUTS 16

/* y = f(x[0], ..., x[n-1]). */
typedef tg_tensor *(*tg_func)(void *userdata, int n, tg_tensor *const *x);

/* y = f(x) and vjp[i] = J_i^T v, J_i = dy/dx[i]. v has y's shape and dtype
 * (NULL: y must hold one element; v = 1). y may be NULL (not wanted). */
tg_status tg_vjp(tg_func f, void *userdata, int n, tg_tensor *const *x, const tg_tensor *v,
                 tg_tensor **y, tg_tensor **vjp);
/* y = f(x) and jvp = sum_i J_i v[i] (y's shape), v[i] with x[i]'s shape
 * and dtype. Computed by two reverse sweeps (the double-VJP
 * construction): g(u) = J^T u is recorded with create_graph for a zero
 * seed u, and J v is the gradient of <g(u), v> with respect to u. */
tg_status tg_jvp(tg_func f, void *userdata, int n, tg_tensor *const *x, tg_tensor *const *v,
                 tg_tensor **y, tg_tensor **jvp);
/* Scalar f: y = f(x) and hvp[i] = sum_j H_ij v[j], H the Hessian: the
 * gradient of <grad f(x), v>, one create_graph sweep then one more. */
tg_status tg_hvp(tg_func f, void *userdata, int n, tg_tensor *const *x, tg_tensor *const *v,
                 tg_tensor **y, tg_tensor **hvp);
/* jac[i] = dy/dx[i], of shape y.shape ++ x[i].shape (at most TG_MAX_DIMS
 * dims, else TG_ERR_SHAPE): one reverse sweep per element of y, over one
 * record. For small functions. */
tg_status tg_jacobian(tg_func f, void *userdata, int n, tg_tensor *const *x, tg_tensor **jac);
/* Scalar f: hess[i * n + j] = d^2 f / dx[i] dx[j], of shape
 * x[i].shape ++ x[j].shape: one create_graph sweep, then one sweep per
 * element of the gradient. For small functions. */
tg_status tg_hessian(tg_func f, void *userdata, int n, tg_tensor *const *x, tg_tensor **hess);

#endif
