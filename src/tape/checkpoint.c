/* Checkpoint policies: what each recorded op keeps for backward.
 *
 * This file decides, op by op as the tape records it, which nodes save and
 * which are recomputed (tg__tape_choose) and where a recompute node's
 * inputs are kept (tg__checkpoint_place); recompute.c re-runs them.
 *
 * NONE saves what each op's backward reads. A *recompute* node saves
 * nothing of its own; backward re-runs its forward (recompute.c) from the
 * values of its inputs, which are leaves, untracked inputs it retains, the
 * outputs of other recompute nodes (recomputed in turn) or checkpoints:
 * outputs of saving nodes, kept once at the producer for all its recompute
 * consumers.
 *
 * BALANCED makes every memory-bound op a recompute node, unless an input is
 * untracked (not on the tape): then it saves as under NONE.
 * Segments (tg_checkpoint_begin/end) make every op inside a recompute node,
 * so only the values that enter a segment are kept.
 * BUDGET(bytes) is BALANCED under a cap, decided op by op in recording
 * order: memory-bound ops recompute (as under BALANCED) and compute-bound
 * ops save while what they save fits in what is left of the budget. An op
 * whose preferred choice does not fit takes the next that does: recompute
 * with checkpoints, recompute re-running saving producers from their saves
 * (no checkpoints), save. If none fits, optional checkpoints (those of
 * producers that can be re-run from their saves) are dropped, newest
 * first, to make room; if that is not enough either, recording fails with
 * TG_ERR_BUDGET at that op (the tape stays usable). Guarantee: tg_tape_saved_bytes never exceeds the budget at any
 * point. Everything can be recomputed from the leaves, so the least budget
 * a graph needs is the bytes of its untracked inputs (data) plus the
 * checkpoints its recompute nodes force.
 *
 * A recompute node whose producer saves its own output (TG_SAVE_OUTPUT)
 * reads the value there instead of keeping a checkpoint. Under BUDGET, when
 * a checkpoint does not fit, a producer that keeps all its inputs (matmul
 * saves both; affine saves x and W and borrows its leaf bias) is re-run
 * from them instead. */
#include <math.h>

#include "tape/tape_internal.h"

/* Bytes a saving node would keep (what NONE charges). */
static size_t save_cost(const tg_op *op, int nin, tg_tensor *const *seen, const tg_tensor *out,
                        tg_tensor *const *extra, int nextra)
{
    size_t b = 0;
    for (int i = 0; i < nin; i++)
        if (op->saves & TG_SAVE_INPUT(i)) b += tg__kept_bytes(seen[i]);
    if (op->saves & TG_SAVE_OUTPUT) b += tg__tensor_bytes(out);
    for (int i = 0; i < nextra; i++) b += tg__kept_bytes(extra[i]);
    return b;
}

bool tg__node_keeps_inputs(const tg_node *n)
{
    for (int i = 0; i < n->nin; i++)
        if (!n->in_saved[i] && !n->in_val[i]) return false;
    return true;
}

/* Bytes a recompute node makes the tape keep: retained untracked inputs,
 * and (with checkpoints) the outputs of saving producers. */
static size_t recompute_cost(const tg_tape *tape, int nin, tg_tensor *const *in,
                             const bool *tracked, bool checkpoints)
{
    size_t b = 0;
    for (int i = 0; i < nin; i++) {
        bool dup = false;
        for (int k = 0; k < i; k++) dup = dup || in[k] == in[i];
        if (dup) continue;
        if (tracked[i] && !in[i]->is_leaf) {
            const tg_node *p = &tape->nodes[in[i]->node];
            if (p->ckpt || p->out_saved) continue;
            if (p->recompute) { /* a segment boundary is kept */
                if (p->segment && p->segment != tape->segment_id) b += tg__kept_bytes(in[i]);
                continue;
            }
            if (checkpoints || !tg__node_keeps_inputs(p)) b += tg__kept_bytes(in[i]);
        } else if (!tracked[i]) {
            b += tg__kept_bytes(in[i]);
        }
    }
    return b;
}

typedef struct {
    size_t cost;
    bool recompute, ckpt;
} budget_option;

static size_t budget_left(const tg_tape *tape)
{
    return tape->opts.budget_bytes > tape->saved_bytes ? tape->opts.budget_bytes - tape->saved_bytes
                                                       : 0;
}

/* Checkpoints whose producer can be re-run from its own saves are
 * optional: BUDGET drops them, newest first, to make room. */
static size_t reclaimable(const tg_tape *tape)
{
    size_t b = 0;
    for (int64_t i = 0; i < tape->nnodes; i++) {
        const tg_node *p = &tape->nodes[i];
        if (p->ckpt && tg__node_keeps_inputs(p)) b += tg__kept_bytes(p->ckpt);
    }
    return b;
}

static void evict(tg_tape *tape, size_t need)
{
    size_t freed = 0;
    for (int64_t i = tape->nnodes - 1; i >= 0 && freed < need; i--) {
        tg_node *p = &tape->nodes[i];
        if (!p->ckpt || !tg__node_keeps_inputs(p)) continue;
        size_t b = tg__kept_bytes(p->ckpt);
        tg_tensor_release(p->ckpt);
        p->ckpt = NULL;
        p->saved_bytes -= b;
        tape->saved_bytes -= b;
        freed += b;
    }
}

tg_status tg__tape_choose(tg_tape *tape, const tg_op *op, int nin, tg_tensor *const *in,
                          tg_tensor *const *seen, const bool *tracked, tg_tensor *out,
                          tg_tensor *const *extra, int nextra, bool *recompute, bool *checkpoints)
{
    *recompute = tape->segment_depth > 0;
    *checkpoints = true;
    switch (tape->opts.policy) {
    case TG_CHECKPOINT_NONE:
        return TG_OK;
    case TG_CHECKPOINT_BALANCED:
        if (op->cost != TG_COST_MEMORY_BOUND) return TG_OK;
        for (int i = 0; i < nin; i++)
            if (!tracked[i]) return TG_OK; /* "save instead" */
        *recompute = true;
        return TG_OK;
    case TG_CHECKPOINT_BUDGET: {
        size_t save = save_cost(op, nin, seen, out, extra, nextra);
        size_t remat = recompute_cost(tape, nin, in, tracked, true);
        size_t lean = recompute_cost(tape, nin, in, tracked, false);
        bool all_tracked = true;
        for (int i = 0; i < nin; i++) all_tracked = all_tracked && tracked[i];
        bool prefer = *recompute || (op->cost == TG_COST_MEMORY_BOUND && all_tracked);
        /* Options in order of preference: cost, recompute?, checkpoints? */
        budget_option opt[3];
        int n = 0;
        if (!prefer) opt[n++] = (budget_option){save, false, true};
        opt[n++] = (budget_option){remat, true, true};
        opt[n++] = (budget_option){lean, true, false};
        if (prefer && !*recompute) opt[n++] = (budget_option){save, false, true};
        for (int pass = 0; pass < 2; pass++) {
            for (int k = 0; k < n; k++) {
                size_t left = budget_left(tape);
                if (opt[k].cost > left && (pass == 0 || opt[k].cost > left + reclaimable(tape)))
                    continue;
                if (opt[k].cost > left) evict(tape, opt[k].cost - left);
                *recompute = opt[k].recompute;
                *checkpoints = opt[k].ckpt;
                return TG_OK;
            }
        }
        return tg__err(TG_ERR_BUDGET, "op '%s' needs %zu bytes kept for backward (%zu if "
                                      "recomputed), but the tape's budget of %zu bytes has %zu "
                                      "left", op->name, save, lean, tape->opts.budget_bytes,
                       budget_left(tape));
    }
    }
    return TG_OK;
}

/* Where a new recompute node n (its inputs in, tracked per tracked[])
 * finds its inputs' values in backward, and what that makes the tape keep:
 * a leaf is borrowed (the leaf list holds it), an untracked input
 * retained, and an interior input is read from its producer: recomputed in
 * turn, or kept there once as a checkpoint for every recompute consumer
 * (checkpoints: from saving producers; see tg__tape_choose), as a
 * segment's boundary, or where BALANCED cuts a chain. Sets n->chain. */
void tg__checkpoint_place(tg_tape *tape, tg_node *n, tg_tensor *const *in, const bool *tracked,
                          bool checkpoints)
{
    n->chain = 1;
    for (int i = 0; i < n->nin; i++) {
        if (n->in_node[i] >= 0) {
            tg_node *p = &tape->nodes[n->in_node[i]];
            bool saving = !p->recompute && (checkpoints || !tg__node_keeps_inputs(p));
            /* A value leaving a segment is that segment's boundary: kept,
             * so backward re-runs one segment at a time. */
            bool boundary = p->recompute && p->segment && p->segment != n->segment;
            /* BALANCED, outside segments: a chain of recompute nodes (an
             * LSTM's cell state, step after step) is cut every
             * TG_BALANCED_MAX_CHAIN nodes, so backward never has to
             * rematerialise more than that many values back to a kept one
             * before it can free any. */
            bool cut = p->recompute && !p->segment && !n->segment &&
                       tape->opts.policy == TG_CHECKPOINT_BALANCED &&
                       p->chain >= TG_BALANCED_MAX_CHAIN;
            if ((saving || boundary || cut) && !p->ckpt && !p->out_saved) {
                p->ckpt = tg_tensor_retain(in[i]);
                p->ckpt_ver = in[i]->storage->version;
                tg__tape_charge(tape, p, tg__kept_bytes(in[i]));
            }
            if (p->recompute && !p->ckpt && p->chain + 1 > n->chain) n->chain = p->chain + 1;
        } else if (tracked[i]) {
            n->in_val[i] = in[i]; /* a leaf: the leaf list holds it */
        } else {
            n->in_val[i] = tg_tensor_retain(in[i]);
            n->in_val_owned[i] = true;
            tg__tape_charge(tape, n, tg__kept_bytes(in[i]));
        }
    }
}

tg_status tg_checkpoint_begin(tg_tape *tape)
{
    if (!tape) return tg__err(TG_ERR_NULL, "bad argument #1 to 'checkpoint_begin' (NULL tape)");
    if (tape->dead) return tg__err(TG_ERR_STALE, "bad argument #1 to 'checkpoint_begin' (tape was freed)");
    if (tape->segment_depth++ == 0) tape->segment_id = ++tape->nsegments;
    return TG_OK;
}

tg_status tg_checkpoint_end(tg_tape *tape)
{
    if (!tape) return tg__err(TG_ERR_NULL, "bad argument #1 to 'checkpoint_end' (NULL tape)");
    if (tape->segment_depth == 0)
        return tg__err(TG_ERR_INVALID, "tg_checkpoint_end without a matching tg_checkpoint_begin");
    if (--tape->segment_depth == 0) tape->segment_id = 0;
    return TG_OK;
}

tg_tensor *tg_checkpoint(tg_tape *tape, tg_segment_fn fn, void *userdata, tg_tensor *x)
{
    if (!fn) {
        tg__err(TG_ERR_NULL, "bad argument #2 to 'checkpoint' (NULL function)");
        return NULL;
    }
    if (!x) {
        tg__err_null("checkpoint", 4);
        return NULL;
    }
    if (tg_checkpoint_begin(tape)) return NULL;
    tg_tensor *y = fn(userdata, 0, x);
    tg_checkpoint_end(tape);
    return y;
}

/* How tg_checkpoint_sequential groups n stages into k groups (nsegments,
 * default ceil(sqrt(n)), at most n): the first k - 1 groups are segments,
 * sizes as equal as possible (the longer first); the last group, the tail,
 * is recorded outside any segment, as under the tape's policy, and has
 * max(1, ceil(n / k) - 1) stages. k <= 1: no segment at all.
 *
 * Why the tail: its ops run last in the forward and first in backward, so
 * recomputing them buys little (PyTorch's checkpoint_sequential does not
 * either): backward would rematerialise them right away. Leaving it
 * unsegmented saves one forward of tail stages in time. In saved bytes a
 * segment costs its input (the previous group's output, kept as a
 * boundary, or the retained data), while the tail keeps what NONE keeps
 * for its stages, c boundary-sized values a stage (c = 2 for matmul ->
 * add -> relu: matmul's input and relu's output). The saved peak is then
 * (k - 1) + c * tail boundaries instead of k. A tail as long as a segment
 * (PyTorch's choice) costs no more at backward's peak than one segment's
 * rematerialisation would, but its saves count for the whole step; one
 * stage shorter keeps the saved peak of a 16-stage Linear + ReLU stack at
 * 9 of NONE's 32 activations (under a third; segments 5, 4, 4, tail 3),
 * for 13 stages recomputed instead of 16. */
tg_tensor *tg_checkpoint_sequential(tg_tape *tape, int nlayers, int nsegments, tg_segment_fn fn,
                                    void *userdata, tg_tensor *x)
{
    if (!tape || !fn) {
        tg__err(TG_ERR_NULL, "bad argument to 'checkpoint_sequential' (NULL %s)",
                tape ? "function" : "tape");
        return NULL;
    }
    if (nlayers < 0) {
        tg__err(TG_ERR_INVALID, "bad argument #2 to 'checkpoint_sequential' (%d layers)", nlayers);
        return NULL;
    }
    int k = nsegments > 0 ? nsegments : (int)ceil(sqrt((double)nlayers));
    if (k > nlayers) k = nlayers;
    int nseg = 0, tail = nlayers;
    if (k > 1) {
        int per = (nlayers + k - 1) / k;
        nseg = k - 1;
        tail = per > 1 ? per - 1 : 1;
    }
    int body = nlayers - tail; /* >= nseg: every segment gets a stage */
    tg_tensor *h = x;
    int l = 0;
    for (int g = 0; g < nseg && h; g++) {
        int end = l + body / nseg + (g < body % nseg);
        if (tg_checkpoint_begin(tape)) return NULL;
        for (; l < end && h; l++) h = fn(userdata, l, h);
        tg_checkpoint_end(tape);
    }
    for (; l < nlayers && h; l++) h = fn(userdata, l, h); /* the tail */
    return h;
}

int64_t tg_tape_recompute_count(const tg_tape *tape)
{
    return tape ? tape->recomputes : 0;
}
