/* tapegrad/gradcheck.h - numerical gradient checking.
 * Included by <tapegrad.h>; do not include directly. */
#ifndef TAPEGRAD_GRADCHECK_H
#define TAPEGRAD_GRADCHECK_H

#include "tensor.h"

/* Builds the output from the inputs with tg_* ops. Returns a new reference
 * (or a scope-owned one) or NULL with the last error set. */
typedef tg_tensor *(*tg_gradcheck_fn)(void *userdata, int n, tg_tensor *const *inputs);

typedef struct tg_gradcheck_opts {
    double eps;        /* central-difference step (default 1e-6) */
    double atol;       /* pass if |analytic - numeric| <= atol + rtol*|numeric| */
    double rtol;       /* defaults 1e-7 and 1e-5 */
    int fast;          /* nonzero: compare random directional derivatives only */
    int directions;    /* fast mode: number of random directions (default 4) */
    uint64_t seed;     /* seed for the output weights and the directions */
} tg_gradcheck_opts;

typedef struct tg_gradcheck_result {
    bool checked;        /* false for inputs that are not floating (targets) */
    bool passed;
    double max_abs_err;  /* max |analytic - numeric| */
    double max_rel_err;  /* max |a - n| / max(|n|, 1e-12) over checked entries */
    int64_t worst_index; /* flat index (fast mode: direction) failing worst */
} tg_gradcheck_result;

/* Checks d(sum(w * fn(x)))/dx for each floating input x, where w is a fixed
 * random weight tensor (so every output element counts), by central
 * differences in f64 against tg_backward. All floating inputs must be f64
 * (TG_ERR_DTYPE) and are left unchanged. results has n entries (may be NULL).
 * Returns TG_OK when every checked input passes, TG_ERR_GRADCHECK when one
 * fails (results say which; the message gives both sides at the worst
 * index, and a NaN on either side makes the errors NaN, never 0), or the
 * error of fn or backward. */
tg_status tg_gradcheck(tg_gradcheck_fn fn, void *userdata, int n,
                       tg_tensor *const *inputs, const tg_gradcheck_opts *opts,
                       tg_gradcheck_result *results);

/* Second derivatives: checks h(x, v) = J(x)^T v, the gradient of fn at x
 * seeded with v (the floating inputs' gradients flattened and joined), with
 * tg_gradcheck over the inputs and v: its analytic gradient comes from a
 * create_graph sweep (tg_grad_of) differentiated again, its numeric one
 * from central differences of h (each evaluation a first-order sweep on a
 * private tape). v is a fixed random tensor of fn's output shape (f64,
 * entries in [-1, 1), seeded by opts->seed). opts as tg_gradcheck's (fast
 * mode: random directions). results has n + 1 entries (may be NULL): the
 * inputs, then v. At most 15 inputs, all floating ones f64. Returns as
 * tg_gradcheck does. */
tg_status tg_gradgradcheck(tg_gradcheck_fn fn, void *userdata, int n,
                           tg_tensor *const *inputs, const tg_gradcheck_opts *opts,
                           tg_gradcheck_result *results);

/* Summary of tg_gradcheck_op over every case of one registered op. */
typedef struct tg_op_check {
    int cases;           /* cases run (0: the op has no .sample) */
    int failed;          /* cases with an input failing the check */
    double max_abs_err;  /* worst over all cases and inputs */
    double max_rel_err;
    int worst_case;      /* case index of max_abs_err, -1 if none */
    int worst_input;
} tg_op_check;

/* Gradchecks a registered differentiable op on every case its .sample
 * function makes, with inputs created on backend. TG_ERR_INVALID if the op
 * has no backward or backend does not exist, TG_ERR_NOT_FOUND if it has no sample (no cases),
 * TG_ERR_GRADCHECK if a case fails (report says which). */
struct tg_op;
tg_status tg_gradcheck_op(const struct tg_op *op, tg_backend backend,
                          const tg_gradcheck_opts *opts, tg_op_check *report);
/* The same with tg_gradgradcheck on every case: the op's second
 * derivatives (report's inputs count the seed v as input n). */
tg_status tg_gradgradcheck_op(const struct tg_op *op, tg_backend backend,
                              const tg_gradcheck_opts *opts, tg_op_check *report);

#endif
