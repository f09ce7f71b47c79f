/* State of one backward, shared by the reverse sweep (backward.c), the
 * recompute of dropped values (recompute.c) and the pointwise regions
 * (region.c). backward.c drives the other two; region.c reads values
 * through recompute.c; none calls back into backward.c. Nodes run through
 * the executor (exec.h). */
#ifndef TG_TAPE_SWEEP_H
#define TG_TAPE_SWEEP_H

#include "tape/exec.h"

/* Gradient slots and, for recompute nodes, the values rematerialised so
 * far (freed when the sweep passes the node that produced it, every
 * consumer coming later in the record, or earlier where nothing still
 * needs them: recompute.c). */
/* A leaf's gradient sink in one sweep (backward.c): its slot, the sink,
 * and whether a backward was offered it (so may have written it). */
typedef struct sweep_sink {
    int32_t slot;
    bool taken;
    tg_tensor *sink;
    tg_tensor *leaf;
} sweep_sink;

/* What a sweep knows of a recompute value (recompute.c): how many nodes
 * read it (uses), how many of those have not been re-run since it was
 * last rematerialised (left; reran: of a checkpoint's readers, how many
 * have been re-run from it), the depth of the shallowest segment its
 * value leaves (escape: of the innermost segment holding it and each
 * reader) and whether a backward reads it (its node's, or a recompute
 * reader's that saves that input). */
typedef struct sweep_use {
    int32_t uses, left, escape;
    int32_t reran; /* readers re-run from a saving node's checkpoint */
    bool bw_read;
} sweep_use;

typedef struct sweep_state {
    tg_tape *tape;
    tg_tensor **grads;                      /* [nslots] */
    tg_tensor **vals;                       /* [nnodes] or NULL */
    tg_tensor *(*extra)[TG_OP_MAX_EXTRA];   /* [nnodes] */
    int *nextra;                            /* [nnodes] */
    sweep_use *use;                         /* [nnodes] with vals */
    int32_t ctx; /* innermost segment of the node whose backward runs */
    bool hold;   /* drop no value early (a pointwise region plans on them) */
    sweep_sink *sinks;                      /* [nsinks] by slot, or NULL */
    int nsinks;
} sweep_state;

/* The sink of the leaf in slot (NULL: none); take: mark it as offered. */
static inline tg_tensor *tg__sweep_sink(sweep_state *s, int32_t slot, bool take)
{
    int lo = 0, hi = s->nsinks - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (s->sinks[mid].slot == slot) {
            if (take) s->sinks[mid].taken = true;
            return s->sinks[mid].sink;
        }
        if (s->sinks[mid].slot < slot)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

/* ---- recompute (recompute.c) */
/* Allocates s's recompute state for nodes 0..top when any of them is a
 * recompute node (else leaves it NULL). */
TG_INTERNAL tg_status tg__sweep_values_init(sweep_state *s, int64_t top);
/* Releases every value still held and the state itself. */
TG_INTERNAL void tg__sweep_values_free(sweep_state *s, int64_t top);
/* Releases node j's rematerialised value and extras (no-op without state). */
TG_INTERNAL void tg__sweep_drop(sweep_state *s, int64_t j);
/* Borrowed value of node j's output, rematerialised once if needed. */
TG_INTERNAL tg_status tg__sweep_value_of(sweep_state *s, int64_t j, tg_tensor **out);
/* Borrowed value of input i of node n for a recompute. */
TG_INTERNAL tg_status tg__sweep_input_value(sweep_state *s, const tg_node *n, int i,
                                            tg_tensor **out);
/* New references to the inputs of n in which (TG_SAVE_INPUT bits),
 * contiguous unless the op takes strided inputs (what dispatch handed
 * forward); NULL for the others. */
TG_INTERNAL tg_status tg__sweep_input_args(sweep_state *s, const tg_node *n, unsigned which,
                                           tg_tensor **args);
/* Re-runs node j's forward into s->vals[j] (and its extras). */
TG_INTERNAL tg_status tg__sweep_rematerialize(sweep_state *s, int64_t j);

/* ---- pointwise regions (region.c)
 * A run of pointwise nodes ending at the recompute node top, spanning at
 * most TG_REGION_SPAN nodes of the record, that backward may run in
 * cache-sized blocks. tg__region_find returns its lowest node (top itself
 * when there is no run) and lists in hoist, highest first, the nodes in
 * the span that are not in the run and that the sweep must process
 * first. tg__region_run then runs the run; g is top's gradient
 * (borrowed). On success the gradients of the run's inputs are in
 * s->grads and its nodes are consumed. */
#define TG_REGION_SPAN 128
TG_INTERNAL int64_t tg__region_find(sweep_state *s, int64_t top, int64_t *hoist, int *nhoist);
/* tg__region_find with its first test inline: most nodes' outputs are too
 * small to start a run, and the sweep asks at every node. */
static inline int64_t tg__region_at(sweep_state *s, int64_t top, int64_t *hoist, int *nhoist)
{
    if (!s->tape->nodes[top].region_size) {
        *nhoist = 0;
        return top;
    }
    return tg__region_find(s, top, hoist, nhoist);
}
TG_INTERNAL tg_status tg__region_run(sweep_state *s, int64_t lo, int64_t top, tg_tensor *g);

#endif
