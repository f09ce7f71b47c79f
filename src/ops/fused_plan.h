/* Fused programs built from outside fused.c: tape/replay.c turns a run of
 * recorded pointwise op calls into one fused call (docs/replay.md). */
#ifndef TG_OPS_FUSED_PLAN_H
#define TG_OPS_FUSED_PLAN_H

#include "dispatch/dispatch.h"

/* Whether op can be a step of a fused program (a unary map, or add, sub
 * or mul of two values of the call's shape). */
TG_INTERNAL bool tg__fused_can_step(const tg_op *op);
/* A program over nin inputs (1..TG_FUSED_MAX_INPUTS) of n steps
 * (1..TG_FUSED_MAX_OPS), on backend be: step j applies op[j] with attrs[j]
 * to refs a[j] and b[j] (0..nin-1 the inputs, nin + i step i's value; b[j]
 * -1 for a map), as tg_fused_new would compile the same calls. NULL with
 * the error recorded when a step cannot be fused or memory runs out. */
TG_INTERNAL tg_tensor *tg__fused_program(int nin, int n, const tg_op *const *op,
                                         const tg_op_attrs *const *attrs, const int *a,
                                         const int *b, tg_backend be);
/* Whether op with attrs a sums every element of its input (tg_sum): a
 * fused run may end with it. */
TG_INTERNAL bool tg__fused_sums_all(const tg_op *op, const tg_op_attrs *a);
/* The registered op that runs a program of nin inputs: tg_fused_call's, or
 * (sum) tg_fused_sum's. Its inputs: the nin values, then the program. */
TG_INTERNAL const tg_op *tg__fused_op(int nin, bool sum);
#endif
