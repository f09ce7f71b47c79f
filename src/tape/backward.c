/* The reverse sweep. Gradients live in a slot array for the duration of one
 * backward; each node's output gradient is consumed (and freed) when the
 * node is processed, so intermediate gradients and saved tensors go as soon
 * as nothing needs them. Leaf gradients are accumulated only after the sweep
 * succeeds, so a failing backward changes no leaf. */
#include <stdlib.h>
#include <string.h>

#include "tape/sweep.h"

/* dst += src (taking src's reference). When the sweep holds the only
 * reference to dst and to its storage (not a view of another gradient,
 * not a tensor anyone else can see, not recorded on a tape), the sum is
 * written into dst itself: the add kernel with the same operands in the
 * same order, so the same bits, without a new buffer per contribution (a
 * weight used at every step of an RNN gets one per step). Kernels read
 * contiguous operands only, so src must be contiguous too (a broadcast
 * gradient, stride 0, is not). Otherwise through the public add op. */
static bool sole_holder(const tg_tensor *t, const tg_tensor *src)
{
    return t->refcount == 1 && t->storage->refcount == 1 && t->contiguous && src->contiguous &&
           !t->scope_owned && !t->tape && t != src && t->storage != src->storage &&
           t->dtype == src->dtype && t->backend == src->backend &&
           tg__same_shape(t->ndim, t->shape, src->ndim, src->shape);
}

static tg_status accumulate(tg_tensor **dst, tg_tensor *src)
{
    if (!*dst) {
        *dst = src;
        return TG_OK;
    }
    if (sole_holder(*dst, src)) {
        tg__add_into(*dst, src);
        tg_tensor_release(src);
        return TG_OK;
    }
    /* A private scope: the sum must not land in the caller's open scope. */
    tg_scope_begin();
    tg_tensor *sum = tg_tensor_retain(tg_add(*dst, src));
    tg_scope_end();
    tg_tensor_release(src);
    if (!sum) return tg_last_error();
    tg_tensor_release(*dst);
    *dst = sum;
    return TG_OK;
}

static void opname_err(const tg_node *n, const char *what, int i)
{
    char a[96], b[96];
    tg__err(TG_ERR_INTERNAL, "backward of '%s' returned %s for input #%d (expected %s %s)",
            n->op->name, what, i + 1, tg_dtype_name(n->in_spec[i].dtype),
            tg_shape_str(n->in_spec[i].ndim, n->in_spec[i].shape, a, sizeof a));
    (void)b;
}

tg_status tg__grad_accumulate(tg_tensor **dst, tg_tensor *src)
{
    return accumulate(dst, src);
}


/* Borrowed value of input i of node n for a recompute. */
tg_status tg__sweep_input_value(sweep_state *s, const tg_node *n, int i, tg_tensor **out)
{
    if (n->in_saved[i] || n->in_val[i]) {
        *out = n->in_saved[i] ? n->in_saved[i] : n->in_val[i];
        return TG_OK;
    }
    if (n->in_node[i] >= 0) return tg__sweep_value_of(s, n->in_node[i], out);
    return tg__err(TG_ERR_INTERNAL, "recompute of '%s': input #%d was not kept", n->op->name, i + 1);
}

/* Contiguous references to the inputs of n in which (TG_SAVE_INPUT bits;
 * what dispatch hands forward), through the public contiguous op where a
 * value is a strided view; NULL for the others. */
static tg_status input_args(sweep_state *s, const tg_node *n, unsigned which, tg_tensor **args)
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

/* Re-runs the forward of node j through its entry's function pointers. */
static tg_status rematerialize(sweep_state *s, int64_t j)
{
    tg_node *n = &s->tape->nodes[j];
    tg_tensor *args[TG_OP_MAX_INPUTS];
    tg_status st = input_args(s, n, ~0u, args);
    if (st) return st;
    tg_spec in_spec[TG_OP_MAX_INPUTS], out_spec = {0};
    unsigned needs = 0;
    for (int i = 0; i < n->nin; i++) {
        tg__spec_of(args[i], &in_spec[i]);
        if (n->in_slot[i] >= 0) needs |= 1u << i;
    }
    st = n->op->shape(n->op, &n->attrs, args, &out_spec);
    if (!st) {
        tg_op_ctx ctx = tg__op_ctx(n->op, &n->attrs, n->nin, args, in_spec, NULL, &out_spec,
                                   n->backend, needs, s->extra[j], &s->nextra[j], true);
        uint64_t t0 = s->tape->profiling ? tg__now_ns() : 0;
        s->vals[j] = n->op->forward(&ctx, args);
        if (t0) tg__profile_recompute(s->tape, n->op, tg__now_ns() - t0);
        if (!s->vals[j]) st = tg_last_error() ? tg_last_error() : TG_ERR_INTERNAL;
        else s->tape->recomputes++;
    }
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
        tg_status st = rematerialize(s, j);
        if (st) return st;
    }
    *out = s->vals[j];
    return TG_OK;
}

static void drop_values(sweep_state *s, int64_t j)
{
    if (!s->vals) return;
    tg_tensor_release(s->vals[j]);
    s->vals[j] = NULL;
    for (int k = 0; k < s->nextra[j]; k++) tg_tensor_release(s->extra[j][k]);
    s->nextra[j] = 0;
}

static tg_status run_node(sweep_state *s, int64_t idx, tg_tensor *gout)
{
    tg_node *n = &s->tape->nodes[idx];
    tg_tensor *gin[TG_OP_MAX_INPUTS] = {0};
    tg_tensor *args[TG_OP_MAX_INPUTS] = {0};
    unsigned needs = 0;
    for (int i = 0; i < n->nin; i++)
        if (n->in_slot[i] >= 0) needs |= 1u << i;
    if (!needs) return TG_OK;
    int nextra = n->nextra;
    tg_op_ctx ctx = tg__op_ctx(n->op, &n->attrs, n->nin, n->in_saved, n->in_spec, n->out_saved,
                               &n->out_spec, n->backend, needs, n->extra, &nextra, false);
    tg_status st = TG_OK;
    if (n->recompute) {
        /* Rematerialise what backward reads, as NONE would have saved it:
         * the inputs in saves, and the output (with the extras its forward
         * keeps) where saves has it or the forward keeps extras. */
        tg_tensor *out = NULL;
        if ((n->op->saves & TG_SAVE_OUTPUT) || n->remake_extra)
            st = tg__sweep_value_of(s, idx, &out);
        /* A kept output (a checkpoint, or a segment's boundary) comes
         * without the extras its forward keeps (max_pool2d's indices,
         * batch_norm's statistics): run the forward again for them. */
        if (!st && n->remake_extra && !s->vals[idx] && s->nextra[idx] == 0)
            st = rematerialize(s, idx);
        if (!st) st = input_args(s, n, n->op->saves, args);
        if (st) return st;
        ctx.in = args;
        ctx.out = (n->op->saves & TG_SAVE_OUTPUT) ? out : NULL;
        ctx.extra = s->extra[idx];
        ctx.nextra = &s->nextra[idx];
    }
    tg_scope_begin();
    uint64_t t0 = s->tape->profiling ? tg__now_ns() : 0;
    st = n->op->backward(&ctx, gout, gin);
    if (t0) tg__profile_backward(s->tape, n->op, tg__now_ns() - t0);
    /* gin entries are borrowed (scope-owned or gout itself): take our own
     * references before the scope releases its tensors. */
    for (int i = 0; i < n->nin; i++) tg_tensor_retain(gin[i]);
    tg_scope_end();
    for (int i = 0; i < n->nin; i++) tg_tensor_release(args[i]);
    if (st == TG_OK) {
        for (int i = 0; i < n->nin && st == TG_OK; i++) {
            if (!(needs & (1u << i))) continue;
            const tg_tensor *g = gin[i];
            if (!g) {
                opname_err(n, "no gradient", i);
                st = TG_ERR_INTERNAL;
            } else if (g->dtype != n->in_spec[i].dtype ||
                       !tg__same_shape(g->ndim, g->shape, n->in_spec[i].ndim,
                                       n->in_spec[i].shape)) {
                opname_err(n, "a gradient of the wrong dtype or shape", i);
                st = TG_ERR_INTERNAL;
            }
        }
    } else if (tg_last_error() == TG_OK) {
        tg__err(st, "backward of '%s' failed", n->op->name);
    }
    for (int i = 0; i < n->nin; i++) {
        if (st != TG_OK || !(needs & (1u << i))) {
            tg_tensor_release(gin[i]);
            continue;
        }
        tg_status ast = accumulate(&s->grads[n->in_slot[i]], gin[i]);
        if (ast != TG_OK && st == TG_OK) st = ast;
    }
    return st;
}

static bool any_recompute(const tg_tape *tape, int64_t upto)
{
    for (int64_t i = 0; i <= upto; i++)
        if (tape->nodes[i].recompute) return true;
    return false;
}

static tg_status sweep(tg_tensor *out, tg_tensor *seed)
{
    tg_tape *tape = out->tape;
    int32_t root = tg__tape_slot(out);
    if (root < 0) return TG_ERR_NOMEM;
    int64_t top = out->is_leaf ? -1 : out->node;
    sweep_state s = {.tape = tape};
    s.grads = calloc((size_t)tape->nslots, sizeof *s.grads);
    if (!s.grads) return tg__err(TG_ERR_NOMEM, "out of memory for %d gradient slots", tape->nslots);
    if (top >= 0 && any_recompute(tape, top)) {
        s.vals = calloc((size_t)(top + 1), sizeof *s.vals);
        s.extra = calloc((size_t)(top + 1), sizeof *s.extra);
        s.nextra = calloc((size_t)(top + 1), sizeof *s.nextra);
        if (!s.vals || !s.extra || !s.nextra) {
            free(s.vals);
            free(s.extra);
            free(s.nextra);
            free(s.grads);
            return tg__err(TG_ERR_NOMEM, "out of memory for recompute state");
        }
    }
    tg_tensor **grads = s.grads;
    grads[root] = tg_tensor_retain(seed);
    bool prev = tg_grad_set_enabled(false);
    tg_status st = TG_OK;
    for (int64_t i = top; i >= 0 && st == TG_OK; i--) {
        tg_node *n = &tape->nodes[i];
        tg_tensor *g = grads[n->out_slot];
        if (g) {
            if (n->consumed) {
                st = tg__err(TG_ERR_STALE, "backward through '%s' a second time: its saved "
                                           "tensors were freed by an earlier tg_backward",
                             n->op->name);
                break;
            }
            grads[n->out_slot] = NULL;
            int64_t hoist[TG_REGION_SPAN];
            int nhoist = 0;
            int64_t lo = tg__region_find(&s, i, hoist, &nhoist);
            if (lo < i) {
                /* A run of pointwise recompute nodes: recomputed and
                 * differentiated block by block (region.c), after the
                 * nodes among them that belong before it. */
                for (int h = 0; h < nhoist && st == TG_OK; h++) {
                    tg_node *m = &tape->nodes[hoist[h]];
                    tg_tensor *gm = grads[m->out_slot];
                    if (!gm) continue;
                    grads[m->out_slot] = NULL;
                    st = run_node(&s, hoist[h], gm);
                    tg_tensor_release(gm);
                    if (st == TG_OK) tg__node_release_saved(tape, m);
                }
                if (st == TG_OK) st = tg__region_run(&s, lo, i, g);
                tg_tensor_release(g);
                for (int64_t j = i; j > lo; j--) drop_values(&s, j);
                i = lo;
                n = &tape->nodes[i];
            } else {
                st = run_node(&s, i, g);
                tg_tensor_release(g);
                if (st == TG_OK) tg__node_release_saved(tape, n);
            }
        }
        drop_values(&s, i);
    }
    if (s.vals) {
        for (int64_t i = 0; i <= top; i++) drop_values(&s, i);
        free(s.vals);
        free(s.extra);
        free(s.nextra);
    }
    if (st == TG_OK) {
        for (int32_t i = 0; i < tape->nleaves; i++) {
            tg_tensor *leaf = tape->leaves[i];
            tg_tensor *g = grads[leaf->slot];
            if (!g) continue;
            grads[leaf->slot] = NULL;
            if (!leaf->grad && (!g->contiguous || g->scope_owned || g->refcount > 1 ||
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
            st = accumulate(&leaf->grad, g);
            if (st != TG_OK) break;
        }
    }
    for (int32_t i = 0; i < tape->nslots; i++) tg_tensor_release(grads[i]);
    free(grads);
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
