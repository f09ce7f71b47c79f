/* The general reverse sweep: gradients of chosen outputs with chosen seeds,
 * kept record (retain), recorded backward (create_graph), results handed to
 * the caller (tg_grad_of) or accumulated into the leaves (tg_backward_ex).
 *
 * tg_backward's sweep (backward.c) stays the fast path of first-order
 * training; this one runs every node on whole tensors (no pointwise
 * blocks: a block's slice cannot stand for a tracked value) and, under
 * create_graph, with recording on, so that the ops a backward calls are
 * recorded on the same tape like any forward op.
 *
 * What a backward reads must then be the tracked values of its node's
 * inputs and output, not untracked copies, or the second derivative would
 * miss their dependence on the leaves. NONE hands the saved tensors, which
 * are those values (or contiguous copies of them); recompute policies hand
 * values made again. Each is replaced by a tracked tensor standing for the
 * node's own input or output: the tensor itself where it is that, the leaf
 * for a leaf, else an alias (a view with the record of the value it equals:
 * its slot and producing node). The backward ops are then recorded against
 * the same slots under every policy, in the same order, so second-order
 * gradients are bitwise the same whatever was saved. */
#include <stdlib.h>
#include <string.h>

#include "tape/sweep.h"

TG_THREAD_LOCAL const char *tg__backward_of;

typedef struct graph_sweep {
    sweep_state s;
    bool create, retain;
    int32_t nslots;        /* slots when the sweep began: all it indexes */
    tg_tensor **leaf_of;   /* [nslots] the leaf owning a slot (borrowed), create only */
    bool *want;            /* [nslots] requested slots (tg_grad_of), NULL: every leaf */
    tg_tensor **got;       /* [nslots] their gradients (tg_grad_of) */
    bool *reach;           /* [top + 1] the node's backward leads to a wanted slot */
} graph_sweep;

/* A tracked tensor on tape with v's data standing for the value of slot
 * (made by node, -1 for a leaf). New reference. */
static tg_tensor *alias_of(tg_tape *tape, tg_tensor *v, int64_t node, int32_t slot)
{
    tg_tensor *a = tg__tensor_view(v, v->ndim, v->shape, v->strides, v->offset);
    if (!a) return NULL;
    tg__tape_ref(tape);
    a->tape = tape;
    a->gen = tape->gen;
    a->slot = slot;
    a->node = node;
    a->is_leaf = false;
    a->leaf_view = v->leaf_view;
    return a;
}

/* *pv (a new reference to the value node n's backward reads for input i,
 * or NULL) becomes a tracked tensor standing for that input. */
static tg_status track_input(graph_sweep *g, const tg_node *n, int i, tg_tensor **pv)
{
    tg_tensor *v = *pv;
    int32_t slot = n->in_slot[i];
    if (!v || slot < 0) return TG_OK; /* untracked at recording: a constant */
    if (v->tape == g->s.tape && tg__tensor_live(v) && v->slot == slot) return TG_OK;
    tg_tensor *t;
    if (n->in_node[i] < 0) {
        /* A leaf: the leaf itself, made contiguous by a recorded op if the
         * backward needs it so (it then stands for the leaf as an alias
         * would). */
        tg_tensor *leaf = g->leaf_of[slot];
        if (!leaf)
            return tg__err(TG_ERR_INTERNAL, "backward of '%s': no leaf for input #%d", n->op->name,
                           i + 1);
        if (leaf->contiguous || (n->op->flags & TG_OP_STRIDED_INPUTS)) {
            t = tg_tensor_retain(leaf);
        } else {
            tg_scope_begin();
            t = tg_tensor_retain(tg_contiguous(leaf));
            tg_scope_end();
            if (!t) return tg_last_error();
        }
    } else {
        t = alias_of(g->s.tape, v, n->in_node[i], slot);
        if (!t) return TG_ERR_NOMEM;
    }
    tg_tensor_release(v);
    *pv = t;
    return TG_OK;
}

/* Node idx's backward on gout (borrowed), its input gradients accumulated
 * into their slots. The node is copied: a recorded backward appends nodes,
 * which may move the array. */
static tg_status graph_node(graph_sweep *g, int64_t idx, tg_tensor *gout)
{
    sweep_state *s = &g->s;
    tg_node nd = s->tape->nodes[idx];
    unsigned needs = tg__node_needs(&nd);
    if (!needs) return TG_OK;
    tg_tensor **dst[TG_OP_MAX_INPUTS];
    for (int i = 0; i < nd.nin; i++) dst[i] = nd.in_slot[i] >= 0 ? &s->grads[nd.in_slot[i]] : NULL;
    tg_tensor *args[TG_OP_MAX_INPUTS] = {0}, *out = NULL;
    tg_tensor **extra = nd.extra;
    int nextra = nd.nextra;
    unsigned saves = nd.op->saves;
    tg_status st = TG_OK;
    /* Values are looked up (and recomputed) untracked. */
    bool prev = tg_grad_set_enabled(false);
    if (!nd.recompute) {
        for (int i = 0; i < nd.nin; i++) args[i] = tg_tensor_retain(nd.in_saved[i]);
        out = tg_tensor_retain(nd.out_saved);
    } else {
        tg_tensor *v = NULL;
        s->ctx = nd.segment;
        if ((saves & TG_SAVE_OUTPUT) || nd.remake_extra) st = tg__sweep_value_of(s, idx, &v);
        if (!st && nd.remake_extra && !s->vals[idx] && s->nextra[idx] == 0)
            st = tg__sweep_rematerialize(s, idx);
        if (!st) st = tg__sweep_input_args(s, &nd, saves, args);
        if (!st && (saves & TG_SAVE_OUTPUT)) out = tg_tensor_retain(v);
        extra = s->extra[idx];
        nextra = s->nextra[idx];
    }
    tg_grad_set_enabled(prev);
    if (!st && g->create) {
        for (int i = 0; i < nd.nin && !st; i++) st = track_input(g, &nd, i, &args[i]);
        if (!st && out && !(out->tape == s->tape && tg__tensor_live(out) && out->slot == nd.out_slot)) {
            tg_tensor *a = alias_of(s->tape, out, idx, nd.out_slot);
            tg_tensor_release(out);
            out = a;
            if (!a) st = TG_ERR_NOMEM;
        }
    }
    if (!st) {
        uint64_t ns = 0, *pns = s->tape->profiling ? &ns : NULL;
        const char *outer = tg__backward_of;
        tg__backward_of = nd.op->name;
        tg_spec spec_buf[TG_OP_MAX_INPUTS];
        st = tg__exec_backward(s->tape, &nd, needs, args, tg__node_in_specs(s->tape, &nd, spec_buf), out, tg__node_out_spec(s->tape, &nd),
                               extra, &nextra, gout, dst, NULL, pns);
        tg__backward_of = outer;
        if (pns) tg__profile_backward(s->tape, nd.op, ns);
    }
    if (!st && s->tape->watch) st = tg__tape_watch_after(s->tape, idx, &nd, dst);
    for (int i = 0; i < nd.nin; i++) tg_tensor_release(args[i]);
    tg_tensor_release(out);
    return st;
}

/* Which nodes lead to a wanted slot: node j does when one of its inputs is
 * wanted or comes from a node that does. */
static tg_status mark_reach(graph_sweep *g, int64_t top)
{
    g->reach = calloc((size_t)(top + 1), sizeof *g->reach);
    if (!g->reach) return tg__err(TG_ERR_NOMEM, "out of memory for %lld sweep flags",
                                  (long long)(top + 1));
    const tg_node *nodes = g->s.tape->nodes;
    for (int64_t j = 0; j <= top; j++) {
        const tg_node *n = &nodes[j];
        for (int i = 0; i < n->nin && !g->reach[j]; i++)
            g->reach[j] = (n->in_slot[i] >= 0 && g->want[n->in_slot[i]]) ||
                          (n->in_node[i] >= 0 && g->reach[n->in_node[i]]);
    }
    return TG_OK;
}

/* The fewest members a region needs here. The second sweep of an HVP
 * (elementwise workload) met runs of two (an accumulating add and a mul)
 * with two outside targets: block by block they cost more than they saved
 * (HVP 8.7 against 7.7 ms node by node); with three or more they pay. */
#define REGION_MIN_MEMBERS 3

/* The lowest node of a pointwise region ending at top (tg__region_find),
 * or top: only a sweep that records nothing and keeps nothing takes one,
 * and only where every node of the run leads to a wanted slot and none
 * makes one (a member's gradient never leaves its blocks). */
static int64_t region_of(graph_sweep *g, int64_t top, int64_t *hoist, int *nhoist)
{
    *nhoist = 0;
    if (g->create || g->retain || g->s.tape->watch) return top;
    int64_t lo = tg__region_at(&g->s, top, hoist, nhoist);
    if (top - lo + 1 - *nhoist < REGION_MIN_MEMBERS) {
        *nhoist = 0;
        return top;
    }
    const tg_node *nodes = g->s.tape->nodes;
    for (int64_t j = lo; j <= top; j++)
        if ((g->want && g->want[nodes[j].out_slot]) || (g->reach && !g->reach[j])) {
            *nhoist = 0;
            return top;
        }
    return lo;
}

static tg_status run_sweep(graph_sweep *g, int64_t top)
{
    sweep_state *s = &g->s;
    tg_tape *tape = s->tape;
    tg_status st = TG_OK;
    for (int64_t i = top; i >= 0 && st == TG_OK; i--) {
        int32_t oslot = tape->nodes[i].out_slot;
        tg_tensor *gi = s->grads[oslot];
        if (g->want && g->want[oslot] && gi) g->got[oslot] = tg_tensor_retain(gi);
        if (gi && (!g->reach || g->reach[i])) {
            const tg_node *n = &tape->nodes[i];
            if (n->consumed && n->needs_state) {
                st = tg__err(TG_ERR_STALE, "backward through '%s' a second time: its saved "
                                           "tensors were freed by an earlier backward (keep "
                                           "them with retain or create_graph)", n->op->name);
                break;
            }
            s->grads[oslot] = NULL;
            if (tape->nhooks) st = tg__hooks_grad(tape, oslot, NULL, &gi);
            int64_t hoist[TG_REGION_SPAN];
            int nhoist = 0;
            int64_t lo = st ? i : region_of(g, i, hoist, &nhoist);
            if (lo < i) {
                /* As tg_backward: the hoisted nodes, then the run block
                 * by block (region.c), with the same bits as node by node. */
                for (int h = 0; h < nhoist && st == TG_OK; h++) {
                    tg_node *m = &tape->nodes[hoist[h]];
                    tg_tensor *gm = s->grads[m->out_slot];
                    if (!gm) continue;
                    if (g->want && g->want[m->out_slot]) g->got[m->out_slot] = tg_tensor_retain(gm);
                    s->grads[m->out_slot] = NULL;
                    if (!g->reach || g->reach[hoist[h]]) st = graph_node(g, hoist[h], gm);
                    tg_tensor_release(gm);
                    if (st == TG_OK) tg__node_release_saved(tape, m);
                }
                if (st == TG_OK) st = tg__region_run(s, lo, i, gi);
                tg_tensor_release(gi);
                for (int64_t j = i; j > lo; j--) tg__sweep_drop(s, j);
                i = lo;
            } else {
                if (!st && tape->watch) st = tg__hooks_node_pre(tape, i, gi);
                if (!st) st = graph_node(g, i, gi);
                tg_tensor_release(gi);
                if (st == TG_OK && !g->retain) tg__node_release_saved(tape, &tape->nodes[i]);
            }
        } else if (gi) {
            s->grads[oslot] = NULL; /* leads to nothing asked for */
            tg_tensor_release(gi);
        }
        tg__sweep_drop(s, i);
    }
    return st;
}

/* Checks one output and its seed (NULL: out has one element, seed 1) for
 * op, argument k (0-based) of n. */
static tg_status check_output(const char *op, int k, tg_tensor *out, const tg_tensor *seed,
                              tg_tape **tape)
{
    if (!out) return tg__err(TG_ERR_NULL, "bad argument to '%s' (output %d is NULL)", op, k);
    if (!out->tape)
        return tg__err(TG_ERR_NO_GRAD, "bad argument to '%s' (output %d does not require grad: "
                                       "no input of it was marked with tg_requires_grad)", op, k);
    if (!tg__tensor_live(out))
        return tg__err(TG_ERR_STALE, "bad argument to '%s' (output %d was recorded before "
                                     "tg_tape_reset, or its tape was freed)", op, k);
    if (*tape && *tape != out->tape)
        return tg__err(TG_ERR_TAPE, "bad argument to '%s' (output %d is on a different tape than "
                                    "output 0)", op, k);
    *tape = out->tape;
    char a[96], b[96];
    if (!seed) {
        if (out->numel != 1)
            return tg__err(TG_ERR_SEED, "bad argument to '%s' (output %d of shape %s is not a "
                                        "scalar; pass a seed)", op, k,
                           tg_shape_str(out->ndim, out->shape, a, sizeof a));
        return TG_OK;
    }
    if (seed->backend != out->backend)
        return tg__err(TG_ERR_DEVICE, "bad argument to '%s' (seed %d on backend '%s', output on "
                                      "'%s')", op, k, tg_backend_name(seed->backend),
                       tg_backend_name(out->backend));
    if (seed->dtype != out->dtype || !tg__same_shape(seed->ndim, seed->shape, out->ndim, out->shape))
        return tg__err(TG_ERR_SHAPE, "bad argument to '%s' (seed %d is %s %s, output %s %s)", op, k,
                       tg_dtype_name(seed->dtype), tg_shape_str(seed->ndim, seed->shape, a, sizeof a),
                       tg_dtype_name(out->dtype), tg_shape_str(out->ndim, out->shape, b, sizeof b));
    return TG_OK;
}

static tg_tensor *ones_like(const tg_tensor *t)
{
    tg_tensor *one = tg__tensor_empty(t->dtype, t->ndim, t->shape, t->backend);
    if (!one) return NULL;
    if (t->dtype == TG_F32)
        *(float *)tg__tensor_ptr(one) = 1.0f;
    else
        *(double *)tg__tensor_ptr(one) = 1.0;
    return one;
}

static tg_tensor *zeros_like(const tg_tensor *t)
{
    tg_tensor *z = tg__tensor_empty(t->dtype, t->ndim, t->shape, t->backend);
    if (z) memset(tg__tensor_ptr(z), 0, (size_t)z->numel * tg_dtype_size(z->dtype));
    return z;
}

static void graph_free(graph_sweep *g, int64_t top)
{
    tg__sweep_values_free(&g->s, top);
    if (g->s.grads)
        for (int32_t i = 0; i < g->nslots; i++) tg_tensor_release(g->s.grads[i]);
    if (g->got)
        for (int32_t i = 0; i < g->nslots; i++) tg_tensor_release(g->got[i]);
    free(g->s.grads);
    free(g->got);
    free(g->want);
    free(g->leaf_of);
    free(g->reach);
}

/* Seeds the roots and allocates the state; top: highest root node. */
static tg_status graph_init(graph_sweep *g, tg_tape *tape, int nout, tg_tensor *const *outs,
                            tg_tensor *const *seeds, const tg_grad_opts *opts, int64_t *top)
{
    memset(g, 0, sizeof *g);
    g->s.tape = tape;
    g->create = opts && opts->create_graph;
    g->retain = g->create || (opts && opts->retain);
    *top = -1;
    for (int k = 0; k < nout; k++) {
        if (tg__tape_slot(outs[k]) < 0) return TG_ERR_NOMEM;
        if (!outs[k]->is_leaf && outs[k]->node > *top) *top = outs[k]->node;
    }
    tg_status vst = tg__tape_check_writes(tape, *top);
    if (!vst && tape->npacks) vst = tg__hooks_unpack(tape, *top);
    if (vst) return vst;
    g->nslots = tape->nslots;
    g->s.grads = calloc((size_t)g->nslots, sizeof *g->s.grads);
    if (!g->s.grads)
        return tg__err(TG_ERR_NOMEM, "out of memory for %d gradient slots", g->nslots);
    if (g->create) {
        g->leaf_of = calloc((size_t)g->nslots, sizeof *g->leaf_of);
        if (!g->leaf_of) return tg__err(TG_ERR_NOMEM, "out of memory for the sweep's leaf map");
        for (int32_t i = 0; i < tape->nleaves; i++) g->leaf_of[tape->leaves[i]->slot] = tape->leaves[i];
    }
    if (tg__sweep_values_init(&g->s, *top)) return TG_ERR_NOMEM;
    for (int k = 0; k < nout; k++) {
        tg_tensor *sd = seeds && seeds[k] ? tg_tensor_retain(seeds[k]) : ones_like(outs[k]);
        if (!sd) return TG_ERR_NOMEM;
        tg_status st = tg__grad_accumulate(&g->s.grads[outs[k]->slot], sd);
        if (st) return st;
    }
    return TG_OK;
}

/* Leaf gradients into leaf->grad, as tg_backward does (backward.c); a
 * tracked one (create_graph) is kept as it is, with its record. */
static tg_status accumulate_leaves(graph_sweep *g, int32_t nleaves)
{
    tg_tape *tape = g->s.tape;
    for (int32_t i = 0; i < nleaves && tape->nhooks; i++) {
        tg_tensor *leaf = tape->leaves[i];
        tg_status st = TG_OK;
        if (g->s.grads[leaf->slot])
            st = tg__hooks_grad(tape, leaf->slot, leaf, &g->s.grads[leaf->slot]);
        if (st) return st;
    }
    for (int32_t i = 0; i < nleaves; i++) {
        tg_tensor *leaf = tape->leaves[i];
        tg_tensor *gr = g->s.grads[leaf->slot];
        if (!gr) continue;
        g->s.grads[leaf->slot] = NULL;
        if (!leaf->grad && !gr->tape &&
            (!gr->contiguous || gr->scope_owned || gr->refcount > 1 ||
             atomic_load_explicit(&gr->storage->refcount, memory_order_relaxed) > 1)) {
            tg_tensor *copy = tg__tensor_empty(gr->dtype, gr->ndim, gr->shape, gr->backend);
            if (!copy) {
                tg_tensor_release(gr);
                return TG_ERR_NOMEM;
            }
            tg_tensor_copy_out(gr, tg__tensor_ptr(copy), copy->storage->nbytes);
            tg_tensor_release(gr);
            gr = copy;
        }
        tg_status st = tg__grad_accumulate(&leaf->grad, gr);
        if (st) return st;
    }
    return TG_OK;
}

tg_status tg_backward_ex(tg_tensor *out, const tg_tensor *seed, const tg_grad_opts *opts)
{
    tg_tape *tape = NULL;
    tg_status st = check_output("backward_ex", 0, out, seed, &tape);
    if (st) return st;
    if (!opts || (!opts->create_graph && !opts->retain))
        return seed ? tg_backward_seed(out, seed) : tg_backward(out);
    graph_sweep g;
    int64_t top;
    tg_tensor *seeds[1] = {(tg_tensor *)seed};
    bool prev = tg_grad_set_enabled(opts->create_graph);
    st = graph_init(&g, tape, 1, &out, seeds, opts, &top);
    int32_t nleaves = tape->nleaves; /* the forward's: a recorded backward adds none */
    if (!st) st = run_sweep(&g, top);
    tg__sweep_values_free(&g.s, top);
    if (!st) st = accumulate_leaves(&g, nleaves);
    if (!st && tape->nleaf_hooks) st = tg__hooks_leaves(tape);
    tg_grad_set_enabled(prev);
    graph_free(&g, top);
    return st;
}

tg_status tg_grad_of(int nout, tg_tensor *const *outs, tg_tensor *const *seeds, int nin,
                     tg_tensor *const *inputs, tg_tensor **grads, const tg_grad_opts *opts)
{
    static const char *op = "grad_of";
    if (grads)
        for (int j = 0; j < nin; j++) grads[j] = NULL;
    if (nout < 1 || !outs)
        return tg__err(TG_ERR_INVALID, "bad argument #1 to '%s' (%d outputs%s; need at least 1)",
                       op, nout, outs ? "" : " in a NULL array");
    if (nin < 1 || !inputs || !grads)
        return tg__err(TG_ERR_INVALID, "bad argument #4 to '%s' (%d inputs%s; need at least 1 and "
                                       "an array for their gradients)", op, nin,
                       inputs ? "" : " in a NULL array");
    tg_tape *tape = NULL;
    for (int k = 0; k < nout; k++) {
        tg_status st = check_output(op, k, outs[k], seeds ? seeds[k] : NULL, &tape);
        if (st) return st;
    }
    for (int j = 0; j < nin; j++) {
        const tg_tensor *x = inputs[j];
        if (!x) return tg__err(TG_ERR_NULL, "bad argument to '%s' (input %d is NULL)", op, j);
        if (!x->tape || !tg__tensor_live(x))
            return tg__err(x->tape ? TG_ERR_STALE : TG_ERR_NO_GRAD,
                           "bad argument to '%s' (input %d is %s)", op, j,
                           x->tape ? "stale: recorded before tg_tape_reset, or its tape was freed"
                                   : "not tracked: neither a leaf nor a recorded result");
        if (x->tape != tape)
            return tg__err(TG_ERR_TAPE, "bad argument to '%s' (input %d is on a different tape "
                                        "than the outputs)", op, j);
    }
    for (int j = 0; j < nin; j++)
        if (tg__tape_slot(inputs[j]) < 0) return TG_ERR_NOMEM;
    graph_sweep g;
    int64_t top;
    bool prev = tg_grad_set_enabled(opts && opts->create_graph);
    tg_status st = graph_init(&g, tape, nout, outs, seeds, opts, &top);
    if (!st) {
        g.want = calloc((size_t)g.nslots, sizeof *g.want);
        g.got = calloc((size_t)g.nslots, sizeof *g.got);
        if (!g.want || !g.got) st = tg__err(TG_ERR_NOMEM, "out of memory for the sweep's inputs");
    }
    if (!st) {
        for (int j = 0; j < nin; j++) g.want[inputs[j]->slot] = true;
        st = mark_reach(&g, top);
    }
    if (!st) st = run_sweep(&g, top);
    tg__sweep_values_free(&g.s, top);
    if (!st) {
        /* Leaves (and outputs that are inputs too, never passed by the
         * sweep) keep their gradient in the slot. */
        for (int32_t i = 0; i < g.nslots; i++)
            if (g.want[i] && !g.got[i] && g.s.grads[i]) g.got[i] = tg_tensor_retain(g.s.grads[i]);
        for (int j = 0; j < nin && !st; j++) {
            tg_tensor *r = g.got[inputs[j]->slot];
            if (r) {
                r = tg_tensor_retain(r);
                if (tape->nhooks && inputs[j]->is_leaf)
                    st = tg__hooks_grad(tape, inputs[j]->slot, inputs[j], &r);
            } else if (opts && opts->allow_unused) {
                r = zeros_like(inputs[j]);
                if (!r) st = TG_ERR_NOMEM;
            } else {
                st = tg__err(TG_ERR_NO_GRAD, "'%s': input %d is not reached from the outputs "
                                             "(set allow_unused for zeros)", op, j);
            }
            grads[j] = r;
        }
    }
    tg_grad_set_enabled(prev);
    graph_free(&g, top);
    if (st) {
        for (int j = 0; j < nin; j++) {
            tg_tensor_release(grads[j]);
            grads[j] = NULL;
        }
        return st;
    }
    for (int j = 0; j < nin; j++) {
        if (tg__scope_track(grads[j])) continue;
        /* The scope could not grow (the tensor is released): those already
         * handed to it go with it. */
        for (int k = 0; k < nin; k++) grads[k] = NULL;
        return TG_ERR_NOMEM;
    }
    return TG_OK;
}
