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
/* Whether op with attrs a sums every element of its input (1: tg_sum) or
 * takes their mean (2: tg_mean); 0 otherwise. A fused run may end with
 * either: a sum as tg_fused_sum, a mean as a fused sum whose forward makes
 * the gradients for the mean's seed (attrs.flag, the seed in
 * attrs.scalar), then the mean's factor. */
TG_INTERNAL int tg__fused_reduces_all(const tg_op *op, const tg_op_attrs *a);
/* For a mean of n elements of dtype dt on be: the factor mean applies
 * (scale) and the seed its backward gives the sum for a gradient of 1
 * (seed); returns the op that applies the factor (mul_scalar, attrs.scalar
 * the factor), as mean's forward and backward do. */
TG_INTERNAL const tg_op *tg__fused_mean_factor(tg_dtype dt, tg_backend be, int64_t n,
                                               double *scale, double *seed);
/* The registered op that runs a program of nin inputs: tg_fused_call's, or
 * (sum) tg_fused_sum's. Its inputs: the nin values, then the program. */
TG_INTERNAL const tg_op *tg__fused_op(int nin, bool sum);
/* Set by a fused sum's forward (cpu, f32) whose values could not be shown
 * to sum exactly block by block, so that it ran its forward again to write
 * them: replay then stops ending that run with its sum. Never cleared by
 * the ops. */
TG_INTERNAL extern TG_THREAD_LOCAL bool tg__fused_sum_reran;
#endif
