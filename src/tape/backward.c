/* The reverse sweep. Gradients live in a slot array for the duration of one
 * backward; each node's output gradient is consumed (and freed) when the
 * node is processed, so intermediate gradients and saved tensors go as soon
 * as nothing needs them. Leaf gradients are accumulated only after the sweep
 * succeeds, so a failing backward changes no leaf. */
#include <stdlib.h>
#include <string.h>

#include "tape/tape_internal.h"

/* Kernel-free accumulation: dst += src through the public add op (the tape
 * knows no kernel). In place when dst is exclusively ours. */
static tg_status accumulate(tg_tensor **dst, tg_tensor *src)
{
    if (!*dst) {
        *dst = src;
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

static tg_status run_node(tg_tape *tape, tg_node *n, tg_tensor *gout, tg_tensor **grads)
{
    tg_tensor *gin[TG_OP_MAX_INPUTS] = {0};
    unsigned needs = 0;
    for (int i = 0; i < n->nin; i++)
        if (n->in_slot[i] >= 0) needs |= 1u << i;
    if (!needs) return TG_OK;
    int nextra = n->nextra;
    tg_op_ctx ctx = {
        .op = n->op, .attrs = &n->attrs, .nin = n->nin, .in = n->in_saved,
        .in_spec = n->in_spec, .out = n->out_saved, .out_spec = &n->out_spec,
        .backend = n->backend, .needs = needs, .extra = n->extra, .nextra = &nextra,
        .forward = false,
    };
    tg_scope_begin();
    tg_status st = n->op->backward(&ctx, gout, gin);
    /* gin entries are borrowed (scope-owned or gout itself): take our own
     * references before the scope releases its tensors. */
    for (int i = 0; i < n->nin; i++) tg_tensor_retain(gin[i]);
    tg_scope_end();
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
        tg_status ast = accumulate(&grads[n->in_slot[i]], gin[i]);
        if (ast != TG_OK && st == TG_OK) st = ast;
    }
    (void)tape;
    return st;
}

static tg_status sweep(tg_tensor *out, tg_tensor *seed)
{
    tg_tape *tape = out->tape;
    int32_t root = tg__tape_slot(out);
    if (root < 0) return TG_ERR_NOMEM;
    tg_tensor **grads = calloc((size_t)tape->nslots, sizeof *grads);
    if (!grads) return tg__err(TG_ERR_NOMEM, "out of memory for %d gradient slots", tape->nslots);
    grads[root] = tg_tensor_retain(seed);
    bool prev = tg_grad_set_enabled(false);
    tg_status st = TG_OK;
    for (int64_t i = out->is_leaf ? -1 : out->node; i >= 0 && st == TG_OK; i--) {
        tg_node *n = &tape->nodes[i];
        tg_tensor *g = grads[n->out_slot];
        if (!g) continue;
        if (n->consumed) {
            st = tg__err(TG_ERR_STALE, "backward through '%s' a second time: its saved tensors "
                                       "were freed by an earlier tg_backward", n->op->name);
            break;
        }
        grads[n->out_slot] = NULL;
        st = run_node(tape, n, g, grads);
        tg_tensor_release(g);
        if (st == TG_OK) tg__node_release_saved(tape, n);
    }
    if (st == TG_OK) {
        for (int32_t i = 0; i < tape->nleaves; i++) {
            tg_tensor *leaf = tape->leaves[i];
            tg_tensor *g = grads[leaf->slot];
            if (!g) continue;
            grads[leaf->slot] = NULL;
            if (!leaf->grad && (!g->contiguous || g->scope_owned || g->refcount > 1 ||
                                g->storage->refcount > 1)) {
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
