/* The reverse sweep. Gradients live in a slot array for the duration of one
 * backward; each node's output gradient is consumed (and freed) when the
 * node is processed, so intermediate gradients and saved tensors go as soon
 * as nothing needs them. Leaf gradients are accumulated only after the sweep
 * succeeds, so a failing backward changes no leaf.
 *
 * Gradient sinks. A leaf that a parameter set owns carries its view of the
 * set's flat gradient buffer (gsink). When such a leaf has no gradient yet,
 * the sweep offers that view to the first backward that makes the leaf's
 * gradient whole (tg_op_ctx_new_grad, tg__call_into, a pointwise region's
 * target), adds later contributions into it in place, and at the end makes
 * it the leaf's gradient: the step allocates nothing for the parameters'
 * gradients, and tg_params_sync_grad finds them in place. The values and
 * the order of every sum are the ones a new tensor would get, so the bits
 * are the same. While the leaf has no gradient its region of the flat
 * buffer holds nothing anyone reads (sync zero-fills it); a failing
 * backward zero-fills the regions it was offered, so it still changes no
 * leaf and leaves zeros there. */
#include <stdlib.h>
#include <string.h>

#include "tape/sweep.h"

/* The sinks of n's leaf inputs whose gradient slot is empty (offered:
 * marked taken) or holds the sink already (added into in place), in
 * sinkv; NULL when there are none. */
static TG_NOINLINE tg_tensor *const *node_sinks(sweep_state *s, const tg_node *n,
                                                tg_tensor **const *dst, tg_tensor **sinkv)
{
    bool any = false;
    for (int i = 0; i < n->nin; i++) {
        sinkv[i] = NULL;
        if (n->in_node[i] >= 0 || n->in_slot[i] < 0) continue;
        tg_tensor *k = tg__sweep_sink(s, n->in_slot[i], !*dst[i]);
        if (k && (!*dst[i] || *dst[i] == k)) {
            sinkv[i] = k;
            any = true;
        }
    }
    return any ? sinkv : NULL;
}

/* Whether leaf l has a gsink this sweep may use: no gradient yet, and the
 * sink contiguous with the leaf's dtype, backend and shape. */
static bool sink_usable(const tg_tensor *l)
{
    const tg_tensor *k = l->gsink;
    return k && !l->grad && l->slot >= 0 && k->contiguous && k->dtype == l->dtype &&
           k->backend == l->backend && tg__same_shape(k->ndim, k->shape, l->ndim, l->shape);
}

/* The sweep's sinks: every leaf of the tape with a usable gsink, sorted by
 * slot, in buf (cap entries) or, past that, a new array (*nsinks 0 and
 * NULL when there are none or it cannot be had: the sweep then allocates
 * as usual). */
static sweep_sink *sinks_init(const tg_tape *tape, sweep_sink *buf, int cap, int *nsinks)
{
    int n = 0;
    *nsinks = 0;
    for (int32_t i = 0; i < tape->nleaves; i++) n += sink_usable(tape->leaves[i]);
    if (!n) return NULL;
    sweep_sink *v = n <= cap ? buf : malloc((size_t)n * sizeof *v);
    if (!v) return NULL;
    int m = 0;
    for (int32_t i = 0; i < tape->nleaves && m < n; i++) {
        tg_tensor *l = tape->leaves[i];
        if (!sink_usable(l)) continue;
        int j = m++;
        for (; j > 0 && v[j - 1].slot > l->slot; j--) v[j] = v[j - 1];
        v[j] = (sweep_sink){.slot = l->slot, .taken = false, .sink = l->gsink, .leaf = l};
    }
    *nsinks = m;
    return v;
}

/* After a failed sweep: zero-fill every sink a backward was offered whose
 * leaf did not take it as its gradient. */
static void sinks_clear(const sweep_state *s)
{
    for (int k = 0; k < s->nsinks; k++) {
        const sweep_sink *e = &s->sinks[k];
        if (e->taken && e->leaf->grad != e->sink)
            memset(tg__tensor_ptr(e->sink), 0, (size_t)e->sink->numel * tg__esize(e->sink->dtype));
    }
}

/* Runs node idx's backward on its output gradient gout through the
 * executor, its gradients accumulated into their slots. A saving node
 * hands the executor what it saved; a recompute node what NONE would have
 * saved, rematerialised (recompute.c): the inputs in saves, and the output
 * (with the extras its forward keeps) where saves has it or the forward
 * keeps extras. */
static TG_ALWAYS_INLINE tg_status run_node_impl(sweep_state *s, int64_t idx, tg_tensor *gout,
                                                bool sunk)
{
    tg_node *n = &s->tape->nodes[idx];
    unsigned needs = tg__node_needs(n);
    if (!needs) return TG_OK;
    tg_tensor **dst[TG_OP_MAX_INPUTS];
    for (int i = 0; i < n->nin; i++) dst[i] = n->in_slot[i] >= 0 ? &s->grads[n->in_slot[i]] : NULL;
    /* Only a node with a leaf input can meet a sink: most nodes of a
     * sweep over a parameter set's leaves (an RNN's, a chain's) have none,
     * and pay one compare per input for it. */
    tg_tensor *sinkv[TG_OP_MAX_INPUTS], *const *sink = NULL;
    for (int i = 0; sunk && i < n->nin; i++)
        if (n->in_node[i] < 0 && n->in_slot[i] >= 0) {
            sink = node_sinks(s, n, dst, sinkv);
            break;
        }
    uint64_t ns = 0, *pns = s->tape->profiling ? &ns : NULL;
    tg_status st = s->tape->watch ? tg__hooks_node_pre(s->tape, idx, gout) : TG_OK;
    if (st) return st;
    tg_spec spec_buf[TG_OP_MAX_INPUTS];
    const tg_spec *in_spec = tg__node_in_specs(s->tape, n, spec_buf);
    const tg_spec *out_spec = tg__node_out_spec(s->tape, n);
    if (!n->recompute) {
        int nextra = n->nextra;
        st = tg__exec_backward(s->tape, n, needs, n->in_saved, in_spec, n->out_saved, out_spec, n->extra,
                               &nextra, gout, dst, sink, pns);
    } else {
        unsigned saves = n->op->saves;
        tg_tensor *args[TG_OP_MAX_INPUTS], *out = NULL;
        s->ctx = n->segment;
        if ((saves & TG_SAVE_OUTPUT) || n->remake_extra) st = tg__sweep_value_of(s, idx, &out);
        /* A kept output (a checkpoint, or a segment's boundary) comes
         * without the extras its forward keeps (max_pool2d's indices,
         * batch_norm's statistics): run the forward again for them. */
        if (!st && n->remake_extra && !s->vals[idx] && s->nextra[idx] == 0)
            st = tg__sweep_rematerialize(s, idx);
        if (!st) st = tg__sweep_input_args(s, n, saves, args);
        if (st) return st;
        st = tg__exec_backward(s->tape, n, needs, args, in_spec, (saves & TG_SAVE_OUTPUT) ? out : NULL,
                               out_spec, s->extra[idx], &s->nextra[idx], gout, dst, sink, pns);
        for (int i = 0; i < n->nin; i++) tg_tensor_release(args[i]);
    }
    if (pns) tg__profile_backward(s->tape, n->op, ns);
    if (st == TG_OK && s->tape->watch) st = tg__tape_watch_after(s->tape, idx, n, dst);
    return st;
}

/* run_node without sinks (the sweep's usual case, compiled as before
 * sinks existed) and with them (a sweep over a parameter set's leaves). */
static tg_status run_node(sweep_state *s, int64_t idx, tg_tensor *gout)
{
    return run_node_impl(s, idx, gout, false);
}

static TG_NOINLINE tg_status run_node_sunk(sweep_state *s, int64_t idx, tg_tensor *gout)
{
    return run_node_impl(s, idx, gout, true);
}

/* Gradient-ready notification (tg_tape_set_grad_ready): the leaves of the
 * record, latest first use first. A leaf's gradient is whole once the sweep
 * has passed the earliest node that reads it. */
typedef struct ready_list {
    tg_tensor **leaf;
    int64_t *first; /* earliest node reading the leaf, -1 if none up to top */
    int32_t n, next;
} ready_list;

static tg_status ready_init(tg_tape *tape, int64_t top, ready_list *r)
{
    r->n = r->next = 0;
    r->leaf = NULL;
    r->first = NULL;
    if (!tape->nleaves) return TG_OK;
    int64_t *first = malloc((size_t)tape->nslots * sizeof *first);
    r->leaf = malloc((size_t)tape->nleaves * sizeof *r->leaf);
    r->first = malloc((size_t)tape->nleaves * sizeof *r->first);
    if (!first || !r->leaf || !r->first) {
        free(first);
        free(r->leaf);
        free(r->first);
        return tg__err(TG_ERR_NOMEM, "out of memory for the gradient-ready list");
    }
    for (int32_t i = 0; i < tape->nslots; i++) first[i] = -1;
    for (int64_t j = top; j >= 0; j--) {
        const tg_node *n = &tape->nodes[j];
        for (int i = 0; i < n->nin; i++)
            if (n->in_slot[i] >= 0) first[n->in_slot[i]] = j;
    }
    /* Insertion by first use, latest first (a handful of leaves). */
    for (int32_t i = 0; i < tape->nleaves; i++) {
        tg_tensor *leaf = tape->leaves[i];
        int64_t f = first[leaf->slot];
        int32_t k = r->n++;
        while (k > 0 && r->first[k - 1] < f) {
            r->leaf[k] = r->leaf[k - 1];
            r->first[k] = r->first[k - 1];
            k--;
        }
        r->leaf[k] = leaf;
        r->first[k] = f;
    }
    free(first);
    return TG_OK;
}

/* Notifies every leaf not yet notified whose earliest reader is at or
 * after node i (i = -1: all that are left). */
static tg_status ready_fire(tg_tape *tape, ready_list *r, tg_tensor **grads, int64_t i)
{
    while (r->next < r->n && r->first[r->next] >= i) {
        tg_tensor *leaf = r->leaf[r->next++];
        tg_status st = tape->ready(leaf, grads[leaf->slot], tape->ready_ud);
        if (st) return st;
    }
    return TG_OK;
}

/* Zeroed gradient slots for a sweep: the tape's kept array when free. */
static tg_tensor **grads_take(tg_tape *tape, int32_t n, bool *pooled)
{
    *pooled = false;
    if (!tape->sweep_busy) {
        if (tape->sweep_cap < n) {
            free(tape->sweep_grads);
            tape->sweep_grads = malloc((size_t)n * sizeof *tape->sweep_grads);
            tape->sweep_cap = tape->sweep_grads ? n : 0;
        }
        if (tape->sweep_grads) {
            memset(tape->sweep_grads, 0, (size_t)n * sizeof *tape->sweep_grads);
            tape->sweep_busy = true;
            *pooled = true;
            return tape->sweep_grads;
        }
    }
    return calloc((size_t)n, sizeof(tg_tensor *));
}

static void grads_give(tg_tape *tape, tg_tensor **grads, bool pooled)
{
    if (pooled)
        tape->sweep_busy = false;
    else
        free(grads);
}

static tg_status sweep(tg_tensor *out, tg_tensor *seed)
{
    tg_tape *tape = out->tape;
    int32_t root = tg__tape_slot(out);
    if (root < 0) return TG_ERR_NOMEM;
    int64_t top = out->is_leaf ? -1 : out->node;
    tg_status vst = tg__tape_check_writes(tape, top);
    if (!vst && tape->npacks) vst = tg__hooks_unpack(tape, top);
    if (vst) return vst;
    sweep_state s = {.tape = tape};
    bool pooled;
    s.grads = grads_take(tape, tape->nslots, &pooled);
    if (!s.grads) return tg__err(TG_ERR_NOMEM, "out of memory for %d gradient slots", tape->nslots);
    if (tg__sweep_values_init(&s, top)) {
        grads_give(tape, s.grads, pooled);
        return TG_ERR_NOMEM;
    }
    sweep_sink sink_buf[16];
    s.sinks = sinks_init(tape, sink_buf, (int)(sizeof sink_buf / sizeof *sink_buf), &s.nsinks);
    const bool sunk = s.nsinks > 0; /* in a register, as notify below */
    tg_tensor **grads = s.grads;
    grads[root] = tg_tensor_retain(seed);
    bool prev = tg_grad_set_enabled(false);
    ready_list ready = {0};
    tg_status st = tape->ready ? ready_init(tape, top, &ready) : TG_OK;
    const bool notify = ready.n > 0; /* in a register, not reloaded per node */
    for (int64_t i = top; i >= 0 && st == TG_OK; i--) {
        tg_node *n = &tape->nodes[i];
        tg_tensor *g = grads[n->out_slot];
        if (g) {
            if (n->consumed && n->needs_state) {
                st = tg__err(TG_ERR_STALE, "backward through '%s' a second time: its saved "
                                           "tensors were freed by an earlier tg_backward (keep "
                                           "them with tg_backward_ex's retain)", n->op->name);
                break;
            }
            grads[n->out_slot] = NULL;
            if (tape->nhooks && (st = tg__hooks_grad(tape, n->out_slot, NULL, &g))) {
                tg_tensor_release(g);
                break;
            }
            int64_t hoist[TG_REGION_SPAN];
            int nhoist = 0;
            int64_t lo = tg__region_at(&s, i, hoist, &nhoist);
            if (lo < i) {
                /* A run of pointwise recompute nodes: recomputed and
                 * differentiated block by block (region.c), after the
                 * nodes among them that belong before it. */
                for (int h = 0; h < nhoist && st == TG_OK; h++) {
                    tg_node *m = &tape->nodes[hoist[h]];
                    tg_tensor *gm = grads[m->out_slot];
                    if (!gm) continue;
                    grads[m->out_slot] = NULL;
                    st = sunk ? run_node_sunk(&s, hoist[h], gm) : run_node(&s, hoist[h], gm);
                    tg_tensor_release(gm);
                    if (st == TG_OK) tg__node_release_saved(tape, m);
                }
                if (st == TG_OK) st = tg__region_run(&s, lo, i, g);
                tg_tensor_release(g);
                for (int64_t j = i; j > lo; j--) tg__sweep_drop(&s, j);
                i = lo;
                n = &tape->nodes[i];
            } else {
                st = sunk ? run_node_sunk(&s, i, g) : run_node(&s, i, g);
                tg_tensor_release(g);
                if (st == TG_OK) tg__node_release_saved(tape, n);
            }
        }
        tg__sweep_drop(&s, i);
        if (notify && st == TG_OK) st = ready_fire(tape, &ready, grads, i);
    }
    if (notify && st == TG_OK) st = ready_fire(tape, &ready, grads, -1);
    free(ready.leaf);
    free(ready.first);
    tg__sweep_values_free(&s, top);
    /* Leaf gradient hooks first, on every leaf, so that a failing one
     * leaves every leaf as it was. */
    for (int32_t i = 0; i < tape->nleaves && st == TG_OK && tape->nhooks; i++) {
        tg_tensor *leaf = tape->leaves[i];
        if (grads[leaf->slot]) st = tg__hooks_grad(tape, leaf->slot, leaf, &grads[leaf->slot]);
    }
    if (st == TG_OK) {
        for (int32_t i = 0; i < tape->nleaves; i++) {
            tg_tensor *leaf = tape->leaves[i];
            tg_tensor *g = grads[leaf->slot];
            if (!g) continue;
            grads[leaf->slot] = NULL;
            if (!leaf->grad && g != leaf->gsink &&
                (!g->contiguous || g->scope_owned || g->refcount > 1 ||
                 atomic_load_explicit(&g->storage->refcount, memory_order_relaxed) > 1)) {
                /* A leaf's gradient is contiguous and its own: never a view
                 * or a tensor someone else holds (the seed). */
                tg_tensor *copy = tg__tensor_empty(g->dtype, g->ndim, g->shape, g->backend);
                if (!copy) {
                    tg_tensor_release(g);
                    st = TG_ERR_NOMEM;
                    break;
                }
                tg_tensor_copy_out(g, tg__tensor_ptr(copy), copy->storage->nbytes);
                tg_tensor_release(g);
                g = copy;
            }
            st = tg__grad_accumulate(&leaf->grad, g);
            if (st != TG_OK) break;
        }
    }
    if (st != TG_OK && s.nsinks) sinks_clear(&s);
    if (s.sinks != sink_buf) free(s.sinks);
    if (st == TG_OK && tape->nleaf_hooks) st = tg__hooks_leaves(tape);
    for (int32_t i = 0; i < tape->nslots; i++) tg_tensor_release(grads[i]);
    grads_give(tape, grads, pooled);
    tg_grad_set_enabled(prev);
    return st;
}

static tg_status check_root(const char *op, tg_tensor *out)
{
    if (!out) return tg__err_null(op, 1);
    if (!out->tape)
        return tg__err(TG_ERR_NO_GRAD, "bad argument #1 to '%s' (tensor does not require grad: "
                                       "no input of it was marked with tg_requires_grad)", op);
    if (!tg__tensor_live(out)) return tg__err_stale(op, 1, out);
    return TG_OK;
}

tg_status tg_backward(tg_tensor *loss)
{
    tg_status st = check_root("backward", loss);
    if (st) return st;
    if (loss->numel != 1) {
        char s[96];
        return tg__err(TG_ERR_SEED, "bad argument #1 to 'backward' (loss of shape %s is not a "
                                    "scalar; pass a seed gradient to tg_backward_seed)",
                       tg_shape_str(loss->ndim, loss->shape, s, sizeof s));
    }
    tg_tensor *seed = tg__tensor_empty(loss->dtype, loss->ndim, loss->shape, loss->backend);
    if (!seed) return TG_ERR_NOMEM;
    if (loss->dtype == TG_F32)
        *(float *)tg__tensor_ptr(seed) = 1.0f;
    else
        *(double *)tg__tensor_ptr(seed) = 1.0;
    st = sweep(loss, seed);
    tg_tensor_release(seed);
    return st;
}

tg_status tg_backward_seed(tg_tensor *out, const tg_tensor *seed)
{
    tg_status st = check_root("backward_seed", out);
    if (st) return st;
    if (!seed) return tg__err_null("backward_seed", 2);
    char a[96], b[96];
    if (seed->backend != out->backend)
        return tg__err(TG_ERR_DEVICE, "bad argument #2 to 'backward_seed' (seed on backend '%s', "
                                      "output on '%s')", tg_backend_name(seed->backend),
                       tg_backend_name(out->backend));
    if (seed->dtype != out->dtype ||
        !tg__same_shape(seed->ndim, seed->shape, out->ndim, out->shape))
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to 'backward_seed' (seed %s %s on %s, "
                                     "output %s %s on %s)",
                       tg_dtype_name(seed->dtype), tg_shape_str(seed->ndim, seed->shape, a, sizeof a),
                       tg_backend_name(seed->backend), tg_dtype_name(out->dtype),
                       tg_shape_str(out->ndim, out->shape, b, sizeof b),
                       tg_backend_name(out->backend));
    return sweep(out, (tg_tensor *)seed);
}

tg_tensor *tg_grad(const tg_tensor *t)
{
    if (!t) {
        tg__err_null("grad", 1);
        return NULL;
    }
    if (!t->is_leaf) {
        tg__err(TG_ERR_NO_GRAD, "bad argument #1 to 'grad' (not a leaf: mark it with "
                                "tg_requires_grad)");
        return NULL;
    }
    if (!t->grad) {
        tg__err(TG_ERR_NO_GRAD, "bad argument #1 to 'grad' (no backward has reached this leaf yet)");
        return NULL;
    }
    return t->grad;
}

void tg_grad_zero(tg_tensor *t)
{
    if (!t || !t->grad) return;
    tg_tensor_release(t->grad);
    t->grad = NULL;
}

tg_tensor *tg_detach(tg_tensor *t)
{
    if (!t) {
        tg__err_null("detach", 1);
        return NULL;
    }
    return tg__scope_track(tg__tensor_view(t, t->ndim, t->shape, t->strides, t->offset));
}
