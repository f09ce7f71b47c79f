/* Recompute: the values a recompute node's backward reads, made again
 * during the sweep from what the checkpoint policy kept (checkpoint.c
 * decides what that is). A value is rematerialised at most once per
 * backward, through the node executor, and dropped as soon as the sweep
 * has passed its producer. */
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

tg_status tg__sweep_values_init(sweep_state *s, int64_t top)
{
    if (top < 0 || !any_recompute(s->tape, top)) return TG_OK;
    s->vals = calloc((size_t)(top + 1), sizeof *s->vals);
    s->extra = calloc((size_t)(top + 1), sizeof *s->extra);
    s->nextra = calloc((size_t)(top + 1), sizeof *s->nextra);
    if (!s->vals || !s->extra || !s->nextra) {
        free(s->vals);
        free(s->extra);
        free(s->nextra);
        s->vals = NULL;
        s->extra = NULL;
        s->nextra = NULL;
        return tg__err(TG_ERR_NOMEM, "out of memory for recompute state");
    }
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
    s->vals = NULL;
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
    if (!st) s->tape->recomputes++;
    for (int i = 0; i < n->nin; i++) tg_tensor_release(args[i]);
    return st;
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
