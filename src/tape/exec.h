/* The node executor: the one way the tape runs a recorded op again. The
 * reverse sweep (backward.c), recompute (recompute.c) and the blocked
 * pointwise runs (region.c) all call an op's forward or backward through
 * here: it builds the call context (tg__op_ctx), calls the entry's
 * function pointer, checks what came back and accumulates the gradients.
 * It knows nothing of where the values come from (saved, recomputed, a
 * block's slice): its callers hand them in. */
#ifndef TG_TAPE_EXEC_H
#define TG_TAPE_EXEC_H

#include "tape/tape_internal.h"

/* Inputs of n that need a gradient: bit i set when input i has a slot. */
static inline unsigned tg__node_needs(const tg_node *n)
{
    unsigned needs = 0;
    for (int i = 0; i < n->nin; i++)
        if (n->in_slot[i] >= 0) needs |= 1u << i;
    return needs;
}

/* Re-runs n's forward on args (one borrowed value per input, contiguous
 * unless the op takes strided inputs): their specs and the shape rule's
 * output spec make the context, as dispatch made it when recording. What
 * forward saves goes to extra (TG_OP_MAX_EXTRA slots), counted in
 * *nextra. ns: NULL, or (profiling) the forward's time is added to it.
 * *out: new reference; on failure NULL and the error is recorded. */
TG_INTERNAL tg_status tg__exec_forward(const tg_node *n, tg_tensor *const *args,
                                       tg_tensor **extra, int *nextra, uint64_t *ns,
                                       tg_tensor **out);

/* Runs n's backward on the output gradient gout (borrowed), with in
 * (in_spec), out (out_spec), extra and *nextra as in tg__op_ctx's
 * backward case, all borrowed. For each input i that needs a gradient
 * (tg__node_needs) the gradient must come back with in_spec[i]'s dtype
 * and shape, else TG_ERR_INTERNAL naming the op and the input; when all
 * do, each is accumulated into *dst[i] (tg__grad_accumulate), in input
 * order. On failure nothing is accumulated into any dst (unless the
 * accumulation itself fails midway) and the error is recorded. ns: as in
 * tg__exec_forward, for the backward call. */
TG_INTERNAL tg_status tg__exec_backward(const tg_node *n, tg_tensor *const *in,
                                        const tg_spec *in_spec, tg_tensor *out,
                                        const tg_spec *out_spec, tg_tensor **extra, int *nextra,
                                        tg_tensor *gout, tg_tensor **const *dst, uint64_t *ns);

/* *dst += src, taking src's reference; *dst may be NULL (then it becomes
 * src). In place (tg__add_into) where the sum may overwrite *dst, else
 * through the public add op: the same kernel, operands and order either
 * way, so the same bits. */
TG_INTERNAL tg_status tg__grad_accumulate(tg_tensor **dst, tg_tensor *src);

#endif
