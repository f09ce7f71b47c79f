/* What op files may use: kernel lookup, shape-rule helpers, the built-in
 * list. Op files include this header; dispatch includes no op file. */
#ifndef TG_DISPATCH_H
#define TG_DISPATCH_H

#include "backend/kernels.h"
#include "backend/parallel.h"
#include "core/opctx.h"

/* Defined by src/ops/builtins.c: every built-in op, NULL-terminated. */
extern const tg_op *const tg__builtin_ops[];

/* The kernel for (id, the tensor's backend and dtype), cast to type. */
#define TG_KERNEL(type, id, t) ((type)tg__kernel((id), (t)->backend, (t)->dtype))

/* Shape-rule helpers: each records a "bad argument" error naming op. */
TG_INTERNAL tg_status tg__need_float(const tg_op *op, int argi, const tg_tensor *t);
TG_INTERNAL tg_status tg__need_same_dtype(const tg_op *op, const tg_tensor *a, const tg_tensor *b);
/* NumPy broadcast of a and b's shapes into out (dtype of a). */
TG_INTERNAL tg_status tg__broadcast_spec(const tg_op *op, const tg_tensor *a, const tg_tensor *b,
                                         tg_spec *out);
/* Whether shape (n) broadcasts to target (m). */
TG_INTERNAL bool tg__broadcasts_to(int n, const int64_t *shape, int m, const int64_t *target);
/* Normalises dim (negative from the end) against ndim. */
TG_INTERNAL tg_status tg__norm_dim(const tg_op *op, int argi, int64_t dim, int ndim, int *out);
/* (outer, n, inner) split of shape around dim. */
TG_INTERNAL void tg__split_dim(int ndim, const int64_t *shape, int dim, int64_t *outer, int64_t *n,
                               int64_t *inner);
/* Shared shape rule: one floating input, output of the same spec. */
TG_INTERNAL tg_status tg__shape_same_float(const tg_op *op, const tg_op_attrs *attrs,
                                           tg_tensor *const *in, tg_spec *out);
/* Shared shape rule: two inputs of one floating dtype, broadcast. */
TG_INTERNAL tg_status tg__shape_broadcast_float(const tg_op *op, const tg_op_attrs *attrs,
                                                tg_tensor *const *in, tg_spec *out);

/* Convenience for public wrappers. */
TG_INTERNAL tg_tensor *tg__call1(const tg_op *op, tg_tensor *x, const tg_op_attrs *attrs);
TG_INTERNAL tg_tensor *tg__call2(const tg_op *op, tg_tensor *a, tg_tensor *b,
                                 const tg_op_attrs *attrs);
/* tg_op_call whose forward writes into `into` (a gradient sink a backward
 * took, tg__op_ctx_take_sink) when the call records nothing and into is
 * contiguous with the output's dtype, shape and backend; else a plain
 * call. into may be NULL. */
TG_INTERNAL tg_tensor *tg__call_into(const tg_op *op, int n, tg_tensor *const *in,
                                     const tg_op_attrs *attrs, tg_tensor *into);


/* Contiguous copy of t (not scope-tracked, untracked), or a new reference
 * to t itself when it is already contiguous. */
TG_INTERNAL tg_tensor *tg__contiguous_raw(tg_tensor *t);

/* Releases the copies among args[0..n) (bit i of copied). */
static inline void tg__op_args_release(int n, tg_tensor **args, unsigned copied)
{
    if (!copied) return;
    for (int i = 0; i < n; i++)
        if (copied & (1u << i)) tg_tensor_release(args[i]);
}

/* What op's forward reads for in[0..n): contiguous inputs, so the
 * caller's own tensors where they are (borrowed: the caller holds them for
 * the call) and copies of strided views (owned, bit i of *copied), unless
 * the op takes strided inputs. Dispatch and replay (tape/replay.c) both
 * call it. On failure the copies made are released, the error recorded. */
static TG_ALWAYS_INLINE tg_status tg__op_args(const tg_op *op, int n, tg_tensor *const *in,
                                              tg_tensor **args, unsigned *copied)
{
    *copied = 0;
    for (int i = 0; i < n; i++) {
        if (in[i]->contiguous || (op->flags & TG_OP_STRIDED_INPUTS)) {
            args[i] = in[i];
            continue;
        }
        args[i] = tg__contiguous_raw(in[i]);
        if (!args[i]) {
            tg__op_args_release(i, args, *copied);
            return tg_last_error() ? tg_last_error() : TG_ERR_NOMEM;
        }
        *copied |= 1u << i;
    }
    return TG_OK;
}

#endif
