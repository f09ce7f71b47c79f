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
 * consumers. A recompute node whose producer saves its own output
 * (TG_SAVE_OUTPUT) reads the value there instead of keeping a checkpoint.
 *
 * Each op can be recorded three ways, each costing the tape an exact number
 * of bytes, computed before anything is kept (place_cost is a dry run of
 * tg__checkpoint_place):
 *   save   what NONE keeps for it (save_cost);
 *   remat  recompute, with a checkpoint at each saving producer (and, under
 *          BALANCED, at the end of a long recompute chain);
 *   lean   recompute, re-running producers that keep all their inputs
 *          (matmul; affine with a leaf bias) from those instead of keeping
 *          a checkpoint of their output.
 *
 * The NONE reference. The tape counts in none_bytes what NONE's tape would
 * have kept for the ops recorded since the last reset: the save cost of
 * each op outside segments (exactly what NONE charges it: NONE's
 * tg_tape_saved_bytes sums the same terms), and for an op inside a segment,
 * a recompute node under NONE too, what NONE would charge it
 * (none_segment_cost, which follows NONE's checkpoints in one flag per
 * node, none_kept). Outside a segment, BALANCED and BUDGET take a
 * recompute way only when
 *     saved_bytes + its cost <= none_bytes + save cost,
 * and otherwise save, which adds the same to both sides. Inside a segment
 * the remat way costs at most NONE's charge as long as saved_bytes stayed
 * within none_bytes: a producer whose output NONE keeps by then keeps it
 * here too (it saves the same output, or an earlier segment op took remat
 * and placed the same checkpoint; no checkpoint is dropped while nothing
 * else fails to fit), or is a recompute node outside segments, read at no
 * cost. So, by induction over the ops, saved_bytes <= none_bytes after
 * every op when the budget is at least NONE's: BALANCED never keeps more
 * than NONE, at any point, and BUDGET never refuses a budget of at least
 * NONE's bytes (saving, or remat in a segment, always fits). Backward
 * releasing saves lowers saved_bytes, not none_bytes (reset clears it).
 *
 * BALANCED: a memory-bound op whose inputs are all tracked is a remat
 * node if that keeps the inequality, else it saves; any other op saves.
 * Segments (tg_checkpoint_begin/end) make every op inside a recompute node
 * (remat; under BUDGET remat or lean), so only the values that enter a
 * segment are kept.
 * BUDGET(bytes): each op tries its ways in order of preference (lean only
 * where it costs less than remat: else it would only re-run more):
 *   memory-bound, all inputs tracked: remat, then lean and save, the
 *     cheaper first; on a tie save, unless saving would not keep the op's
 *     inputs (so recompute consumers would have to keep its output) and
 *     the budget could not also hold its output: then lean;
 *   any other op: save, remat, lean;
 *   inside a segment: remat, lean.
 * Saving is capped by the budget; a recompute way by the budget and,
 * outside segments, also by none_bytes + save cost. The op takes the first
 * way that fits under its cap. If none does, optional checkpoints (at
 * producers that can be re-run from what they keep, other than this op's
 * own producers) are dropped, newest first, just enough for the first way
 * that then fits. If none fits even so,
 * recording fails with TG_ERR_BUDGET at that op and the tape stays usable.
 * Guarantee: tg_tape_saved_bytes never exceeds the budget, at any point. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

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

/* Whether a recompute node in the outermost segment seg (0: none) reading
 * the output of p makes the tape keep that value at p: a checkpoint at a
 * saving producer (lean: only when p cannot be re-run from what it keeps),
 * an outermost segment's boundary (a nested one's boundaries are kept by
 * the backward that re-runs it, recompute.c), or where BALANCED cuts a
 * long chain of recompute nodes. */
static bool kept_at(const tg_tape *tape, const tg_node *p, int32_t seg, bool checkpoints)
{
    if (p->ckpt || p->out_saved) return false; /* kept already */
    if (!p->recompute) return checkpoints || !tg__node_keeps_inputs(p);
    if (p->segment) return tg__seg_root(tape, p->segment) != seg;
    /* BALANCED, outside segments: a chain of recompute nodes (an LSTM's
     * cell state, step after step) is cut every TG_BALANCED_MAX_CHAIN
     * nodes, so backward never has to rematerialise more than that many
     * values back to a kept one before it can free any. */
    return !seg && tape->opts.policy == TG_CHECKPOINT_BALANCED &&
           p->chain >= TG_BALANCED_MAX_CHAIN;
}

/* Bytes tg__checkpoint_place would charge for a recompute node on inputs
 * in (tracked per tracked[]), recorded now: the same walk, nothing kept. */
static size_t place_cost(const tg_tape *tape, int nin, tg_tensor *const *in, const bool *tracked,
                         bool checkpoints)
{
    size_t b = 0;
    for (int i = 0; i < nin; i++) {
        if (!tracked[i]) {
            b += tg__kept_bytes(in[i]); /* retained, once per input */
            continue;
        }
        if (in[i]->is_leaf) continue;
        bool dup = false; /* a producer is charged once, by its first input */
        for (int k = 0; k < i && !dup; k++)
            dup = tracked[k] && !in[k]->is_leaf && in[k]->node == in[i]->node;
        if (!dup && kept_at(tape, &tape->nodes[in[i]->node], tg__seg_root(tape, tape->segment_inner),
                            checkpoints))
            b += tg__kept_bytes(in[i]);
    }
    return b;
}

/* NONE's charge for an op recorded inside a segment, where NONE's tape
 * makes it a recompute node too: its untracked inputs, and each producer's
 * output unless NONE would keep it already (none_kept: it saves its output,
 * or an earlier segment op had it kept) or it is of the same segment. mark:
 * record that NONE now keeps those outputs. */
static size_t none_segment_cost(tg_tape *tape, int nin, tg_tensor *const *in, const bool *tracked,
                                bool mark)
{
    size_t b = 0;
    for (int i = 0; i < nin; i++) {
        if (!tracked[i]) {
            b += tg__kept_bytes(in[i]);
            continue;
        }
        if (in[i]->is_leaf) continue;
        tg_node *p = &tape->nodes[in[i]->node];
        bool dup = false;
        for (int k = 0; k < i && !dup; k++)
            dup = tracked[k] && !in[k]->is_leaf && in[k]->node == in[i]->node;
        if (dup || p->none_kept ||
            tg__seg_root(tape, p->segment) == tg__seg_root(tape, tape->segment_inner))
            continue;
        b += tg__kept_bytes(in[i]);
        if (mark) p->none_kept = true;
    }
    return b;
}

/* Whether node idx produces one of this op's tracked inputs. */
static bool feeds(int64_t idx, int nin, tg_tensor *const *in, const bool *tracked)
{
    for (int i = 0; i < nin; i++)
        if (tracked[i] && !in[i]->is_leaf && in[i]->node == idx) return true;
    return false;
}

/* Optional checkpoints: at producers that can be re-run from what they
 * keep, so BUDGET may drop them. Those of the op being recorded stay (its
 * costs were computed with them in place). */
static bool optional_ckpt(const tg_tape *tape, int64_t idx, int nin, tg_tensor *const *in,
                          const bool *tracked)
{
    const tg_node *p = &tape->nodes[idx];
    return p->ckpt && tg__node_keeps_inputs(p) && !feeds(idx, nin, in, tracked);
}

static size_t reclaimable(const tg_tape *tape, int nin, tg_tensor *const *in, const bool *tracked)
{
    size_t b = 0;
    for (int64_t i = 0; i < tape->nnodes; i++)
        if (optional_ckpt(tape, i, nin, in, tracked)) b += tg__kept_bytes(tape->nodes[i].ckpt);
    return b;
}

size_t tg__node_drop_ckpt(tg_tape *tape, tg_node *n)
{
    size_t b = tg__kept_bytes(n->ckpt);
    tg_tensor_release(n->ckpt);
    n->ckpt = NULL;
    n->saved_bytes -= b;
    tape->saved_bytes -= b;
    return b;
}

/* Drops optional checkpoints, newest first, until need bytes are freed. */
static void evict(tg_tape *tape, size_t need, int nin, tg_tensor *const *in, const bool *tracked)
{
    size_t freed = 0;
    for (int64_t i = tape->nnodes - 1; i >= 0 && freed < need; i--)
        if (optional_ckpt(tape, i, nin, in, tracked))
            freed += tg__node_drop_ckpt(tape, &tape->nodes[i]);
}

typedef struct {
    size_t cost, cap; /* bytes it adds; what saved_bytes may reach with it */
    bool recompute, ckpt;
} way;

/* The algorithm and its guarantee are in this file's header comment. */
tg_status tg__tape_choose(tg_tape *tape, const tg_op *op, int nin, tg_tensor *const *in,
                          tg_tensor *const *seen, const bool *tracked, tg_tensor *out,
                          tg_tensor *const *extra, int nextra, bool *recompute, bool *checkpoints,
                          size_t *none_add)
{
    bool segment = tape->segment_depth > 0;
    *recompute = segment;
    *checkpoints = true;
    *none_add = 0;
    if (tape->opts.policy == TG_CHECKPOINT_NONE) return TG_OK; /* no reference needed */
    bool all_tracked = true;
    for (int i = 0; i < nin; i++) all_tracked = all_tracked && tracked[i];
    bool prefer = segment || (op->cost == TG_COST_MEMORY_BOUND && all_tracked);
    size_t save = segment ? 0 : save_cost(op, nin, seen, out, extra, nextra);
    if (tape->opts.policy == TG_CHECKPOINT_BALANCED) {
        if (!prefer) {
            *none_add = save;
            return TG_OK;
        }
        if (segment) {
            *none_add = none_segment_cost(tape, nin, in, tracked, true);
            return TG_OK;
        }
        /* An op that saves nothing is re-run only where that keeps
         * nothing either: else it would keep its inputs for no saving of
         * its own (an add after a matmul, on the slack that
         * tg__checkpoint_adopt leaves). */
        size_t remat = place_cost(tape, nin, in, tracked, true);
        *recompute = (save > 0 || remat == 0) && tape->saved_bytes + remat <= tape->none_bytes + save;
        *none_add = save;
        return TG_OK;
    }
    /* BUDGET. Saving is capped by the budget; recomputing, outside
     * segments, also by NONE's total with this op saved. */
    size_t remat = place_cost(tape, nin, in, tracked, true);
    size_t lean = place_cost(tape, nin, in, tracked, false);
    size_t budget = tape->opts.budget_bytes;
    size_t rcap = !segment && tape->none_bytes + save < budget ? tape->none_bytes + save : budget;
    way w_save = {save, budget, false, true}, w_remat = {remat, rcap, true, true},
        w_lean = {lean, rcap, true, false};
    way ways[4];
    int n = 0;
    if (segment) {
        ways[n++] = w_remat;
        if (lean < remat) ways[n++] = w_lean;
    } else if (prefer) {
        /* On a tie between lean and save, save (nothing to re-run) unless
         * that would leave the op unable to re-run (an input neither saved
         * nor a leaf) and the budget could not also hold its output, which
         * each recompute consumer would then have to keep. */
        bool rerunnable = true;
        for (int i = 0; i < nin; i++)
            rerunnable = rerunnable && ((op->saves & TG_SAVE_INPUT(i)) || in[i]->is_leaf);
        bool tight = tape->saved_bytes + save + tg__kept_bytes(out) > budget;
        bool lean_first = lean < save || (lean == save && !rerunnable && tight);
        ways[n++] = w_remat;
        if (lean < remat && lean_first) ways[n++] = w_lean;
        ways[n++] = w_save;
        if (lean < remat && !lean_first) ways[n++] = w_lean;
    } else {
        ways[n++] = w_save;
        ways[n++] = w_remat;
        if (lean < remat) ways[n++] = w_lean;
    }
    /* First fit; then with optional checkpoints dropped. */
    const way *pick = NULL;
    size_t spare = 0;
    for (int pass = 0; pass < 2 && !pick; pass++) {
        if (pass == 1) spare = reclaimable(tape, nin, in, tracked);
        for (int k = 0; k < n && !pick; k++)
            if (tape->saved_bytes + ways[k].cost <= ways[k].cap + spare) pick = &ways[k];
    }
    if (pick && tape->saved_bytes + pick->cost > pick->cap)
        evict(tape, tape->saved_bytes + pick->cost - pick->cap, nin, in, tracked);
    if (!pick)
        return tg__err(TG_ERR_BUDGET, "op '%s' needs %zu bytes kept for backward (%zu if "
                                      "recomputed), but the tape's budget of %zu bytes has %zu "
                                      "left", op->name, segment ? lean : save,
                       lean < remat ? lean : remat, tape->opts.budget_bytes,
                       tape->opts.budget_bytes > tape->saved_bytes
                           ? tape->opts.budget_bytes - tape->saved_bytes : 0);
    *recompute = pick->recompute;
    *checkpoints = pick->ckpt;
    *none_add = segment ? none_segment_cost(tape, nin, in, tracked, true) : save;
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
            /* kept_at: a checkpoint at a saving producer, a segment's
             * boundary (backward re-runs one segment at a time) or
             * BALANCED's cut of a long chain. */
            if (kept_at(tape, p, tg__seg_root(tape, n->segment), checkpoints)) {
                p->ckpt = tg_tensor_retain(in[i]);
                if (p->consumed) tape->ckpt_late = true; /* tg_tape_reset must release it */
                p->ckpt_ver = in[i]->storage->version;
                tg__tape_charge(tape, p, tg__kept_bytes(in[i]));
            }
            if (p->ckpt && !p->recompute && p->ckpt_users < UINT16_MAX) p->ckpt_users++;
            if (p->recompute && !p->ckpt && p->chain + 1 > n->chain)
                n->chain = (int16_t)(p->chain < INT16_MAX ? p->chain + 1 : INT16_MAX);
        } else if (tracked[i]) {
            n->in_val[i] = in[i]; /* a leaf: the leaf list holds it */
        } else {
            n->in_val[i] = tg_tensor_retain(in[i]);
            n->in_val_owned |= (uint8_t)(1u << i);
            tg__tape_charge(tape, n, tg__kept_bytes(in[i]));
        }
    }
}

/* A recompute node p re-run only for its output (the op saves nothing
 * else, keeps no extras) whose output a later saving node saves: NONE
 * would have kept that output at p and at the saving node alike, the
 * same tensor. BALANCED or a segment chose to re-run p instead, keeping
 * the values p reads (a checkpoint at a saving producer: an affine's
 * output, for a relu) for it; now that the saving node keeps p's output
 * anyway, p keeps it too, uncharged (the saving node is charged for it,
 * as under NONE), is never re-run, and each checkpoint that p was the
 * last recompute reader of is released. Without this a Linear + ReLU
 * stack under BALANCED held each layer's affine output and relu output
 * (twice NONE's memory, 16 forwards re-run on deep) while the saved-bytes
 * count, which charges NONE for the shared tensor twice, read as NONE's.
 * The values backward reads are the same, so the gradients' bits are. */
static bool adoptable(const tg_node *p, const tg_tensor *t)
{
    return p->recompute && !p->consumed && !p->out_saved && !p->ckpt && !p->remake_extra &&
           p->op->saves == TG_SAVE_OUTPUT && t->storage->version == p->out_ver;
}

void tg__checkpoint_adopt(tg_tape *tape, tg_node *n, tg_tensor *const *in)
{
    for (int i = 0; i < n->nin; i++) {
        if (!n->in_saved[i] || n->in_node[i] < 0 || n->in_saved[i] != in[i]) continue;
        tg_node *p = &tape->nodes[n->in_node[i]];
        tg_tensor *keep = NULL;
        if (adoptable(p, in[i])) {
            keep = tg_tensor_retain(in[i]);
        } else if (p->recompute && p->out_view && p->op->saves == 0 && !p->consumed &&
                   p->in_node[0] >= 0 && in[i]->contiguous) {
            /* Through a view (a flatten before a linear layer): the saved
             * tensor is the view's output, which shares the storage of the
             * view's input, so that input's producer keeps it as a view
             * with its own shape (an in-place op also shares its input's
             * storage, but its write bumps the version adoptable checks).
             * This holds while the forward records, on the tensors ops
             * return; a create_graph backward records on stand-ins that
             * may be contiguous copies of a view's value (a transpose's,
             * re-run for the sweep), not sharing anything, and adopting
             * there gave wrong second-order gradients on a random graph:
             * tg__tape_record adopts only outside backward. */
            tg_node *q = &tape->nodes[p->in_node[0]];
            const tg_spec *sp = tg__node_out_spec(tape, q);
            if (!adoptable(q, in[i]) || sp->dtype != in[i]->dtype ||
                tg__numel(sp->ndim, sp->shape) != in[i]->numel)
                continue;
            int64_t strides[TG_MAX_DIMS];
            tg__contig_strides(sp->ndim, sp->shape, strides);
            keep = tg__tensor_view(in[i], sp->ndim, sp->shape, strides, in[i]->offset);
            p = q;
        }
        if (!keep) continue;
        p->out_saved = keep;
        for (int k = 0; k < p->nin; k++) {
            if (p->in_node[k] < 0) continue;
            tg_node *q = &tape->nodes[p->in_node[k]];
            if (q->recompute || !q->ckpt || q->ckpt_users == UINT16_MAX) continue;
            if (--q->ckpt_users == 0) tg__node_drop_ckpt(tape, q);
        }
    }
}

tg_status tg_checkpoint_begin(tg_tape *tape)
{
    tg_status st = tg__tape_check(tape, "checkpoint_begin");
    if (st) return st;
    if (tape->nsegments + 1 >= tape->capsegs) {
        if (tape->nsegments >= INT32_MAX / 2)
            return tg__err(TG_ERR_INVALID, "more than %d checkpoint segments on one tape",
                           INT32_MAX / 2);
        int32_t cap = tape->capsegs ? 2 * tape->capsegs : 16;
        tg__seg *p = realloc(tape->segs, (size_t)cap * sizeof *p);
        if (!p) return tg__err(TG_ERR_NOMEM, "out of memory for a checkpoint segment");
        p[0] = (tg__seg){0, 0, 0};
        tape->segs = p;
        tape->capsegs = cap;
    }
    if (tg__replay_capturing(tape) && (st = tg__replay_mark(tape, true))) return st;
    int32_t id = ++tape->nsegments, parent = tape->segment_inner;
    tape->segs[id] = (tg__seg){parent, parent ? tape->segs[parent].root : id,
                               tape->segment_depth + 1};
    tape->segment_depth++;
    tape->segment_inner = id;
    return TG_OK;
}

tg_status tg_checkpoint_end(tg_tape *tape)
{
    if (!tape) return tg__err(TG_ERR_NULL, "bad argument #1 to 'checkpoint_end' (NULL tape)");
    if (tape->segment_depth == 0)
        return tg__err(TG_ERR_INVALID, "tg_checkpoint_end without a matching tg_checkpoint_begin");
    tg_status st;
    if (tg__replay_capturing(tape) && (st = tg__replay_mark(tape, false))) return st;
    tape->segment_inner = tape->segs[tape->segment_inner].parent;
    tape->segment_depth--;
    return TG_OK;
}

/* Runs one stage, fn(userdata, layer, h), in a scope of its own: what the
 * stage makes and does not return is released when it returns (the tape
 * keeps what its policy saves), so the forward holds the stages' outputs
 * only, one at a time, as a lean forward written by hand does. Returns a
 * reference the caller owns (NULL on failure, the error recorded):
 *   - the output, moved out of the stage's scope if it is in it;
 *   - a new reference the stage returned (its contract's other case);
 *   - or, for a tensor the stage did not make (its input h, or one an outer
 *     scope owns), a new reference taken here. */
static tg_tensor *stage_run(tg_segment_fn fn, void *userdata, int layer, tg_tensor *h)
{
    tg_scope_begin();
    tg_tensor *y = fn(userdata, layer, h);
    if (y) {
        tg_scope_keep(y);
        /* Still scope-owned: an outer scope's. h is borrowed too (ours, or
         * the caller's input). */
        if (y->scope_owned || y == h) tg_tensor_retain(y);
    }
    tg_scope_end();
    if (!y && tg_last_error() == TG_OK)
        tg__err(TG_ERR_INTERNAL, "stage %d of a checkpointed model returned NULL", layer);
    return y;
}

/* The stages' last output: into the caller's scope if one is open (as an
 * op's result), else the new reference the caller owns. */
static tg_tensor *stage_result(tg_tensor *y)
{
    return tg_scope_depth() > 0 ? tg__scope_track(y) : y;
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
    tg_tensor *y = stage_run(fn, userdata, 0, x);
    tg_checkpoint_end(tape);
    return stage_result(y);
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
/* Binomial checkpointing (nsegments = -s): the stages as a tree of
 * nested segments, so that backward keeps at most s boundaries beside the
 * stage it differentiates, at the price of re-running each stage up to r
 * times (recompute.c re-runs nested segments level by level).
 *
 * A tree T(s, r) of s slots and r re-runs holds C(s + r, s) stages: its
 * children i = 0 .. s, in order, are trees T(s - i, r - 1), since while
 * backward works in child i, the outputs of children 0 .. i - 1 are held;
 * a tree with r = 0 or s = 0 is a single stage. The children sum to the
 * whole (sum over i of C(s - i + r - 1, s - i) = C(s + r, s)); the
 * stages are dealt out front first, so a short model uses few children.
 * At the top, the children are outermost segments, whose boundaries the
 * tape keeps from the forward on; deeper ones are nested segments, whose
 * boundaries exist only while backward re-runs their parent. This is the
 * schedule of Griewank's revolve in the form of nested segments. */
static int64_t tree_size(int s, int r)
{
    /* C(s + r, s), saturated past INT32_MAX. */
    int64_t c = 1;
    for (int k = 1; k <= s; k++) {
        c = c * (r + k) / k;
        if (c > INT32_MAX) return (int64_t)INT32_MAX + 1;
    }
    return c;
}

typedef struct tree_run {
    tg_tape *tape;
    tg_segment_fn fn;
    void *userdata;
    tg_tensor *h; /* the current stage's input */
    bool owned;   /* h is a reference owned here */
} tree_run;

static bool tree_stage(tree_run *t, int l)
{
    tg_tensor *y = stage_run(t->fn, t->userdata, l, t->h);
    if (t->owned) tg_tensor_release(t->h);
    t->h = y;
    t->owned = true;
    return y != NULL;
}

/* Stages l .. l + n - 1 as the tree T(s, r) (tree_size(s, r) >= n). */
static bool tree_run_stages(tree_run *t, int l, int n, int s, int r)
{
    if (n == 1) return tree_stage(t, l);
    int at = l;
    for (int i = 0; i <= s && at < l + n; i++) {
        int64_t cap = tree_size(s - i, r - 1), left = l + n - at;
        int size = (int)(left < cap ? left : cap);
        if (size > 1) {
            if (tg_checkpoint_begin(t->tape)) return false;
            bool ok = tree_run_stages(t, at, size, s - i, r - 1);
            tg_checkpoint_end(t->tape);
            if (!ok) return false;
        } else if (!tree_stage(t, at)) {
            return false;
        }
        at += size;
    }
    return true;
}

static tg_tensor *binomial_sequential(tg_tape *tape, int nlayers, int slots, tg_segment_fn fn,
                                      void *userdata, tg_tensor *x)
{
    int r = 0;
    while (tree_size(slots, r) < nlayers) r++;
    tree_run t = {tape, fn, userdata, x, false};
    if (!tree_run_stages(&t, 0, nlayers, slots, r)) {
        if (t.owned) tg_tensor_release(t.h);
        return NULL;
    }
    return stage_result(t.h);
}

tg_tensor *tg_checkpoint_sequential(tg_tape *tape, int nlayers, int nsegments, tg_segment_fn fn,
                                    void *userdata, tg_tensor *x)
{
    if (!fn || (!tape && nsegments != 1)) {
        tg__err(TG_ERR_NULL, "bad argument to 'checkpoint_sequential' (NULL %s)",
                fn ? "tape" : "function");
        return NULL;
    }
    if (nlayers < 0) {
        tg__err(TG_ERR_INVALID, "bad argument #2 to 'checkpoint_sequential' (%d layers)", nlayers);
        return NULL;
    }
    if (nlayers == 0) return x;
    if (nsegments < 0) {
        if (nsegments < -TG_CHECKPOINT_MAX_SLOTS) {
            tg__err(TG_ERR_INVALID, "bad argument #3 to 'checkpoint_sequential' (%d: binomial "
                                    "checkpointing takes 1 to %d slots)", nsegments,
                    TG_CHECKPOINT_MAX_SLOTS);
            return NULL;
        }
        return binomial_sequential(tape, nlayers, -nsegments, fn, userdata, x);
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
    /* h: the current stage's input; from stage 1 on a reference owned here
     * (stage 0's is the caller's x, borrowed). */
    tg_tensor *h = x;
    bool owned = false;
    int l = 0;
    for (int g = 0; g <= nseg && h; g++) {
        int end = g < nseg ? l + body / nseg + (g < body % nseg) : nlayers; /* last: the tail */
        if (g < nseg && tg_checkpoint_begin(tape)) {
            if (owned) tg_tensor_release(h);
            return NULL;
        }
        for (; l < end && h; l++) {
            tg_tensor *y = stage_run(fn, userdata, l, h);
            if (owned) tg_tensor_release(h);
            h = y;
            owned = true;
        }
        if (g < nseg) tg_checkpoint_end(tape);
    }
    return h ? stage_result(h) : NULL;
}

int64_t tg_tape_recompute_count(const tg_tape *tape)
{
    return tape ? tape->recomputes : 0;
}
