/* tapegrad/registry.h - the op registry and user-defined ops.
 * Included by <tapegrad.h>; do not include directly.
 *
 * Every op is an entry: name, arity, shape rule, forward, and either a
 * backward or the non-differentiable mark. An entry with neither is
 * *unmarked*: calling it on an input that requires grad fails with
 * TG_ERR_NOT_DIFFERENTIABLE, naming the op and the input. */
#ifndef TAPEGRAD_REGISTRY_H
#define TAPEGRAD_REGISTRY_H

#include "status.h"
#include "tensor.h"

#define TG_OP_MAX_INPUTS 4

typedef enum tg_cost_class {
    TG_COST_MEMORY_BOUND = 0,  /* elementwise, reshape: cheap to recompute */
    TG_COST_COMPUTE_BOUND = 1  /* matmul, conv: keep saved inputs */
} tg_cost_class;

/* Attributes of one call, stored by value in the tape node. */
typedef struct tg_op_attrs {
    double scalar;              /* pow exponent, scalar operand */
    int64_t ints[TG_MAX_DIMS];  /* dims, permutation or shape */
    int nints;
    int flag;                   /* keepdim and similar */
    int target;                 /* to_device backend / cast dtype */
} tg_op_attrs;

/* Dtype and shape of an input or the output. */
typedef struct tg_spec {
    tg_dtype dtype;
    int ndim;
    int64_t shape[TG_MAX_DIMS];
} tg_spec;

typedef struct tg_op tg_op;
typedef struct tg_op_ctx tg_op_ctx;

/* Shape rule: check dtypes/shapes of in (arity entries, never NULL), fill
 * out, or return an error after tg_error_set(). */
typedef tg_status (*tg_shape_fn)(const tg_op *op, const tg_op_attrs *attrs,
                                 tg_tensor *const *in, tg_spec *out);
/* Forward: return a new untracked tensor of the inferred spec (usually from
 * tg_op_ctx_new_output) or NULL after tg_error_set(). Inputs are contiguous
 * unless the op has TG_OP_STRIDED_INPUTS. */
typedef tg_tensor *(*tg_forward_fn)(tg_op_ctx *ctx, tg_tensor *const *in);
/* Backward: for each input i with tg_op_ctx_needs_grad(ctx, i), set gin[i]
 * to d(loss)/d(input i) (a tensor of that input's spec), computed with tg_*
 * ops or written into tg_op_ctx_new_grad(ctx, i); leave the others NULL. Runs in its own scope with grad recording off;
 * gin entries are borrowed (results of tg_* ops, or gout itself): the engine
 * takes its own reference, so a backward never retains or releases. */
typedef tg_status (*tg_backward_fn)(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin);
/* Gradcheck cases: for case k (0, 1, ...) create the inputs (f64 for
 * floating ones, on the default backend) and attrs; return the number of
 * inputs, 0 when k is past the last case, or -1 on error. The inputs are
 * the caller's: new references or scope-owned ones (the public creation
 * functions), both are fine. */
typedef int (*tg_sample_fn)(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *attrs);

/* Bits of tg_op.saves: what backward reads through the ctx. */
#define TG_SAVE_INPUT(i) (1u << (i))
#define TG_SAVE_OUTPUT (1u << 8)
/* Bits of tg_op.flags. */
#define TG_OP_STRIDED_INPUTS (1u << 0) /* forward accepts strided views */
#define TG_OP_MIXED_BACKENDS (1u << 1) /* inputs may live on other backends */
/* Element k of the output depends only on element k of each input (inputs
 * of the output's element count, or single elements), and backward's
 * gradients likewise; forward and backward make no random draws and save
 * no extra tensors. Under a recomputing policy, backward may then run a
 * chain of such ops on cache-sized slices (1-d views of contiguous
 * elements, scalars as 0-d views) instead of whole tensors, on several
 * threads at once (disjoint slices): forward and backward must then keep
 * no unsynchronised state of their own. */
#define TG_OP_POINTWISE (1u << 2)

struct tg_op {
    const char *name;
    const char *doc;        /* one line: the math */
    int arity;              /* 1..TG_OP_MAX_INPUTS */
    tg_shape_fn shape;
    tg_forward_fn forward;
    tg_backward_fn backward;   /* NULL: non-differentiable or unmarked */
    bool nondifferentiable;    /* outputs are never tracked */
    tg_cost_class cost;
    unsigned saves;            /* TG_SAVE_* */
    unsigned flags;            /* TG_OP_* */
    tg_sample_fn sample;       /* gradcheck cases; an op with a backward and no cases
                                  fails the registry sweep (tapegrad gradcheck) */
};

typedef enum tg_ad_mark { TG_AD_BACKWARD, TG_AD_NONDIFFERENTIABLE, TG_AD_UNMARKED } tg_ad_mark;

/* Registry iteration and lookup. Entries are never removed; pointers stay
 * valid for the life of the process. */
int tg_op_count(void);
const tg_op *tg_op_at(int i);
const tg_op *tg_op_find(const char *name);
tg_ad_mark tg_op_mark(const tg_op *op);
const char *tg_ad_mark_name(tg_ad_mark mark); /* "yes", "non-differentiable", "unmarked" */
const char *tg_cost_name(tg_cost_class cost);  /* "memory-bound", "compute-bound" */

/* Copies def (name and doc strings included) into the registry. TG_ERR_EXISTS if the name
 * is taken, TG_ERR_INVALID if a field is missing or contradictory (both a
 * backward and the non-differentiable mark, arity out of range). */
tg_status tg_op_register(const tg_op *def);

/* Runs op through dispatch: validate, check the autodiff mark, forward,
 * record. attrs may be NULL (zeroed). */
tg_tensor *tg_op_call(const tg_op *op, int n, tg_tensor *const *in,
                      const tg_op_attrs *attrs);

/* ---- For forward and backward functions. */
const tg_op_attrs *tg_op_ctx_attrs(const tg_op_ctx *ctx);
/* Input i as saved (backward: only those in saves; else NULL). Borrowed. */
tg_tensor *tg_op_ctx_input(const tg_op_ctx *ctx, int i);
/* Spec of input i (always available). */
const tg_spec *tg_op_ctx_input_spec(const tg_op_ctx *ctx, int i);
/* Backward: the saved output (TG_SAVE_OUTPUT), as an untracked tensor. */
tg_tensor *tg_op_ctx_output(const tg_op_ctx *ctx);
const tg_spec *tg_op_ctx_output_spec(const tg_op_ctx *ctx);
bool tg_op_ctx_needs_grad(const tg_op_ctx *ctx, int i);
tg_backend tg_op_ctx_backend(const tg_op_ctx *ctx);
/* Forward: a new uninitialised, contiguous output of the inferred spec. */
tg_tensor *tg_op_ctx_new_output(tg_op_ctx *ctx);
/* Backward: an uninitialised, contiguous buffer of input i's spec for its
 * gradient, borrowed like a tg_* result (set gin[i] to it once every
 * element is written). Where input i is a parameter whose set holds a
 * gradient buffer for it and no gradient has reached it yet, this is that
 * buffer, so the gradient is written once, in place (docs/api.md, gradient
 * sinks); otherwise a new tensor. NULL after tg_error_set() on a NULL ctx,
 * an input out of range, or a call from a forward. */
tg_tensor *tg_op_ctx_new_grad(tg_op_ctx *ctx, int i);
/* A ready shape rule (a tg_shape_fn) for ops whose output has the dtype and
 * shape of input 0, any dtype; it checks nothing else. */
tg_status tg_op_shape_same(const tg_op *op, const tg_op_attrs *attrs, tg_tensor *const *in,
                           tg_spec *out);
/* Forward: keep an extra tensor for backward (retained); returns its slot or
 * -1. Backward: tg_op_ctx_saved(ctx, slot), borrowed. At most 4. Under
 * create_graph (docs/higher-order.md) these are untracked constants: a
 * backward that must differentiate again recomputes from the tracked
 * inputs any float value of them that depends on the inputs. */
int tg_op_ctx_save(tg_op_ctx *ctx, tg_tensor *t);
tg_tensor *tg_op_ctx_saved(const tg_op_ctx *ctx, int slot);

/* Records an error as the calling thread's last error (for shape rules,
 * forward and backward functions of user ops). Returns status. */
tg_status tg_error_set(tg_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#endif
