/* State shared by the reverse sweep (backward.c) and the pointwise
 * regions it hands to region.c. */
#ifndef TG_TAPE_SWEEP_H
#define TG_TAPE_SWEEP_H

#include "tape/tape_internal.h"

/* State of one backward: gradient slots and, for recompute nodes, the
 * values rematerialised so far (each once, freed when the sweep passes
 * the node that produced it: every consumer comes later in the record, so
 * it has been processed by then). */
typedef struct sweep_state {
    tg_tape *tape;
    tg_tensor **grads;                      /* [nslots] */
    tg_tensor **vals;                       /* [nnodes] or NULL */
    tg_tensor *(*extra)[TG_OP_MAX_EXTRA];   /* [nnodes] */
    int *nextra;                            /* [nnodes] */
} sweep_state;

/* *dst += src (taking src's reference); *dst may be NULL. */
TG_INTERNAL tg_status tg__grad_accumulate(tg_tensor **dst, tg_tensor *src);
/* Borrowed value of node j's output, rematerialised once if needed. */
TG_INTERNAL tg_status tg__sweep_value_of(sweep_state *s, int64_t j, tg_tensor **out);
/* Borrowed value of input i of node n for a recompute. */
TG_INTERNAL tg_status tg__sweep_input_value(sweep_state *s, const tg_node *n, int i,
                                            tg_tensor **out);
/* Pointwise regions (region.c). A run of pointwise nodes ending at the
 * recompute node top, spanning at most TG_REGION_SPAN nodes of the
 * record, that backward may run in cache-sized blocks. tg__region_find
 * returns its lowest node (top itself when there is no run) and lists in
 * hoist, highest first, the nodes in the span that are not in the run and
 * that the sweep must process first. tg__region_run then runs the run; g
 * is top's gradient (borrowed). On success the gradients of the run's
 * inputs are in s->grads and its nodes are consumed. */
#define TG_REGION_SPAN 128
TG_INTERNAL int64_t tg__region_find(sweep_state *s, int64_t top, int64_t *hoist, int *nhoist);
TG_INTERNAL tg_status tg__region_run(sweep_state *s, int64_t lo, int64_t top, tg_tensor *g);

#endif
