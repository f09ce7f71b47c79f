/* Recompute: the values a recompute node's backward reads, made again
 * during the sweep from what the checkpoint policy kept (checkpoint.c
 * decides what that is), through the node executor.
 *
 * A rematerialised value is held until the sweep passes its producer,
 * except one that nothing will read again once every node reading it has
 * been re-run: it is dropped then, so that a chain re-run from a kept
 * value holds two of its values at a time, not all of them. Such a value
 * is one that
 *   - no backward reads (an affine's output, which only the relu after it
 *     reads, to be re-run; the relu keeps its own output): dropped when
 *     the nodes reading it have been re-run;
 *   - or lies inside a nested segment that the node whose backward runs
 *     is not in, and does not leave it (its escape depth is deeper than
 *     the segment the two share): a re-run for a later sibling segment
 *     passes through it to reach that sibling's input, keeps the values
 *     that leave each segment (its boundaries) and drops the rest; the
 *     sweep re-runs it again, from the boundary before it, when it
 *     reaches that segment.
 * Nested segments thus trade forwards for memory level by level, as
 * binomial checkpointing does (tg_checkpoint_sequential with a negative
 * nsegments): a value can be rematerialised more than once per backward,
 * once per level that re-runs it, and each time from the same inputs by
 * the same forward, so with the same bits. */
#include <stdlib.h>

#include "tape/sweep.h"

/* A tape without recompute nodes (NONE outside segments) is not walked:
 * at 10^6 nodes the walk alone read 250 MB. */
static bool any_recompute(const tg_tape *tape, int64_t upto)
{
    if (tape->nrecompute == 0) return false;
    for (int64_t i = 0; i <= upto; i++)
        if (tape->nodes[i].recompute) return true;
    return false;
}

/* Whether input i of n reads the same producer as an input before it
 * (x * x): a reader counts once per producer. */
static bool read_before(const tg_node *n, int i)
{
    for (int k = 0; k < i; k++)
        if (n->in_node[k] == n->in_node[i]) return true;
    return false;
}

/* Readers, escape depth and backward reads of every value up to top (see
 * sweep_use): only recompute nodes read their inputs' values from the
 * producers (a saving node keeps what its backward reads). */
static void uses_init(sweep_state *s, int64_t top)
{
    const tg_tape *tape = s->tape;
    const tg_node *nodes = tape->nodes;
    for (int64_t j = 0; j <= top; j++) {
        const tg_node *n = &nodes[j];
        sweep_use *u = &s->use[j];
        u->escape = n->segment ? tape->segs[n->segment].depth : 0;
        u->bw_read = u->bw_read || (n->op->saves & TG_SAVE_OUTPUT) || n->remake_extra;
        if (!n->recompute) continue;
        for (int i = 0; i < n->nin; i++) {
            int32_t p = n->in_node[i];
            if (p < 0) continue;
            sweep_use *pu = &s->use[p];
            if (n->op->saves & TG_SAVE_INPUT(i)) pu->bw_read = true;
            if (read_before(n, i)) continue;
            pu->uses++;
            int32_t d = tg__seg_lca_depth(tape, nodes[p].segment, n->segment);
            if (d < pu->escape) pu->escape = d;
        }
    }
}

tg_status tg__sweep_values_init(sweep_state *s, int64_t top)
{
    if (top < 0 || !any_recompute(s->tape, top)) return TG_OK;
    s->vals = calloc((size_t)(top + 1), sizeof *s->vals);
    s->extra = calloc((size_t)(top + 1), sizeof *s->extra);
    s->nextra = calloc((size_t)(top + 1), sizeof *s->nextra);
    s->use = calloc((size_t)(top + 1), sizeof *s->use);
    if (!s->vals || !s->extra || !s->nextra || !s->use) {
        free(s->vals);
        free(s->extra);
        free(s->nextra);
        free(s->use);
        s->vals = NULL;
        s->extra = NULL;
        s->nextra = NULL;
        s->use = NULL;
        return tg__err(TG_ERR_NOMEM, "out of memory for recompute state");
    }
    uses_init(s, top);
    return TG_OK;
}

void tg__sweep_drop(sweep_state *s, int64_t j)
{
    if (!s->vals) return;
    tg_tensor_release(s->vals[j]);
    s->vals[j] = NULL;
    for (int k = 0; k < s->nextra[j]; k++) tg_tensor_release(s->extra[j][k]);
    s->nextra[j] = 0;
}

void tg__sweep_values_free(sweep_state *s, int64_t top)
{
    if (!s->vals) return;
    for (int64_t i = 0; i <= top; i++) tg__sweep_drop(s, i);
    free(s->vals);
    free(s->extra);
    free(s->nextra);
    free(s->use);
    s->vals = NULL;
    s->use = NULL;
}

tg_status tg__sweep_input_value(sweep_state *s, const tg_node *n, int i, tg_tensor **out)
{
    if (n->in_saved[i] || n->in_val[i]) {
        *out = n->in_saved[i] ? n->in_saved[i] : n->in_val[i];
        return TG_OK;
    }
    if (n->in_node[i] >= 0) return tg__sweep_value_of(s, n->in_node[i], out);
    return tg__err(TG_ERR_INTERNAL, "recompute of '%s': input #%d was not kept", n->op->name, i + 1);
}

/* Strided views go through the public contiguous op. */
tg_status tg__sweep_input_args(sweep_state *s, const tg_node *n, unsigned which, tg_tensor **args)
{
    tg_status st = TG_OK;
    for (int i = 0; i < n->nin; i++) args[i] = NULL;
    for (int i = 0; i < n->nin && !st; i++) {
        if (!(which & TG_SAVE_INPUT(i))) continue;
        tg_tensor *v;
        st = tg__sweep_input_value(s, n, i, &v);
        if (st) break;
        if (v->contiguous || (n->op->flags & TG_OP_STRIDED_INPUTS)) {
            args[i] = tg_tensor_retain(v);
        } else {
            tg_scope_begin();
            args[i] = tg_tensor_retain(tg_contiguous(v));
            tg_scope_end();
            if (!args[i]) st = tg_last_error();
        }
    }
    if (st)
        for (int i = 0; i < n->nin; i++) tg_tensor_release(args[i]);
    return st;
}

/* A checkpoint at a saving producer p, read by a re-run outside segments
 * (BALANCED's and BUDGET's recompute nodes; a segment's boundary is there
 * to be read again, level by level): once every recompute reader of p up
 * to the sweep's top has been re-run from it and no backward reads p's
 * value, the checkpoint is released, not held until the sweep passes p (a
 * relu re-run from a conv's output would otherwise hold both). Only where
 * p keeps its inputs: should anything ask for the
 * value again (a later backward from above this one's top, a pointwise
 * region), p is re-run from them, the same forward on the same values. */
static void ckpt_read(tg_tape *tape, int32_t p, sweep_use *u)
{
    tg_node *q = &tape->nodes[p];
    if (q->recompute || ++u->reran < u->uses || u->bw_read || !tg__node_keeps_inputs(q)) return;
    tg__node_drop_ckpt(tape, q);
}

tg_status tg__sweep_rematerialize(sweep_state *s, int64_t j)
{
    tg_node *n = &s->tape->nodes[j];
    tg_tensor *args[TG_OP_MAX_INPUTS];
    tg_status st = tg__sweep_input_args(s, n, ~0u, args);
    if (st) return st;
    uint64_t ns = 0;
    bool prof = s->tape->profiling;
    st = tg__exec_forward(s->tape, n, args, s->extra[j], &s->nextra[j], prof ? &ns : NULL, &s->vals[j]);
    if (prof) tg__profile_recompute(s->tape, n->op, ns);
    for (int i = 0; i < n->nin; i++) tg_tensor_release(args[i]);
    if (st) return st;
    s->tape->recomputes++;
    s->use[j].left = s->use[j].uses;
    /* The inputs this re-run was the last reader of, if nothing else
     * needs them (this file's header). */
    for (int i = 0; i < n->nin && !s->hold; i++) {
        int32_t p = n->in_node[i];
        if (p < 0 || read_before(n, i)) continue;
        sweep_use *u = &s->use[p];
        tg_tape *tape = s->tape;
        if (!s->vals[p]) {
            if (tape->nodes[p].ckpt && !n->segment) ckpt_read(tape, p, u);
            continue;
        }
        if (--u->left > 0) continue;
        if (!u->bw_read || tg__seg_lca_depth(tape, tape->nodes[p].segment, s->ctx) < u->escape)
            tg__sweep_drop(s, p);
    }
    return TG_OK;
}

tg_status tg__sweep_value_of(sweep_state *s, int64_t j, tg_tensor **out)
{
    tg_node *p = &s->tape->nodes[j];
    if (p->ckpt || p->out_saved) {
        *out = p->ckpt ? p->ckpt : p->out_saved;
        return TG_OK;
    }
    if (p->consumed || (!p->recompute && !tg__node_keeps_inputs(p)))
        return tg__err(TG_ERR_STALE, "recompute needs the output of '%s', which an earlier "
                                     "tg_backward freed", p->op->name);
    if (!s->vals[j]) {
        tg_status st = tg__sweep_rematerialize(s, j);
        if (st) return st;
    }
    *out = s->vals[j];
    return TG_OK;
}
