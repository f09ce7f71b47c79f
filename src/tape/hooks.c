/* Hooks: user callbacks on gradients (per tensor, per leaf after
 * accumulation), around each node's backward, and on the values nodes
 * save (pack at recording, unpack when backward starts).
 *
 * Gradient hooks are matched by slot and generation for recorded results
 * and by pointer for leaves; the sweeps (backward.c, grad.c) call them on
 * a node's output gradient just before its backward runs, and on a leaf's
 * gradient just before it is added into the leaf. Packed handles live in
 * a side table, so nodes carry no hook state of their own. */
#include <stdlib.h>

#include "tape/tape_internal.h"

struct tg__grad_hook {
    tg_tensor *leaf; /* retained; NULL for a recorded result */
    int32_t slot;
    uint32_t gen;
    tg_grad_hook fn;
    void *ud;
};

struct tg__leaf_hook {
    tg_tensor *leaf; /* retained */
    tg_leaf_hook fn;
    void *ud;
};

#define HOOKS "the tape's hooks" /* for tg__tape_grow's message */

struct tg__packed {
    int64_t node;
    int which; /* input index, or nin for the output */
    void *h;
};

static tg_status check_live(const tg_tensor *t, const char *op)
{
    if (!t) return tg__err_null(op, 1);
    if (!t->tape)
        return tg__err(TG_ERR_NO_GRAD, "bad argument #1 to '%s' (tensor is not tracked: neither "
                                       "a leaf nor a recorded result)", op);
    if (!tg__tensor_live(t)) return tg__err_stale(op, 1, t);
    return TG_OK;
}

tg_status tg_tensor_hook_add(tg_tensor *t, tg_grad_hook fn, void *userdata)
{
    tg_status st = check_live(t, "tensor_hook_add");
    if (st) return st;
    if (!fn) return tg__err_null("tensor_hook_add", 2);
    tg_tape *tape = t->tape;
    int32_t slot = tg__tape_slot(t);
    if (slot < 0) return TG_ERR_NOMEM;
    int64_t cap = tape->caphooks;
    st = tg__tape_grow((void **)&tape->hooks, &cap, tape->nhooks + 1, sizeof *tape->hooks,
                       HOOKS);
    if (st) return st;
    tape->caphooks = (int32_t)cap;
    tape->hooks[tape->nhooks++] = (struct tg__grad_hook){
        .leaf = t->is_leaf ? tg_tensor_retain(t) : NULL, .slot = slot, .gen = tape->gen,
        .fn = fn, .ud = userdata};
    tape->any_hooks = true;
    return TG_OK;
}

tg_status tg_leaf_hook_add(tg_tensor *leaf, tg_leaf_hook fn, void *userdata)
{
    tg_status st = check_live(leaf, "leaf_hook_add");
    if (st) return st;
    if (!leaf->is_leaf)
        return tg__err(TG_ERR_INVALID, "bad argument #1 to 'leaf_hook_add' (not a leaf: a "
                                       "recorded result takes tg_tensor_hook_add)");
    if (!fn) return tg__err_null("leaf_hook_add", 2);
    tg_tape *tape = leaf->tape;
    int64_t cap = tape->capleaf_hooks;
    st = tg__tape_grow((void **)&tape->leaf_hooks, &cap, tape->nleaf_hooks + 1,
                       sizeof *tape->leaf_hooks, HOOKS);
    if (st) return st;
    tape->capleaf_hooks = (int32_t)cap;
    tape->leaf_hooks[tape->nleaf_hooks++] =
        (struct tg__leaf_hook){.leaf = tg_tensor_retain(leaf), .fn = fn, .ud = userdata};
    return TG_OK;
}

tg_status tg_tape_set_node_hooks(tg_tape *tape, tg_node_pre_hook pre, tg_node_post_hook post,
                                 void *userdata)
{
    tg_status st = tg__tape_check(tape, "tape_set_node_hooks");
    if (st) return st;
    tape->pre = pre;
    tape->post = post;
    tape->node_ud = userdata;
    tape->watch = tape->opts.anomaly || pre || post;
    tape->any_hooks = tape->nhooks > 0 || pre || post;
    return TG_OK;
}

tg_status tg_tape_set_saved_hooks(tg_tape *tape, tg_pack_hook pack, tg_unpack_hook unpack,
                                  tg_packed_free free_fn, void *userdata)
{
    tg_status st = tg__tape_check(tape, "tape_set_saved_hooks");
    if (st) return st;
    if (tape->npacks)
        return tg__err(TG_ERR_INVALID, "bad argument #1 to 'tape_set_saved_hooks' (the tape "
                                       "holds %lld packed values: run backward or reset first)",
                       (long long)tape->npacks);
    if (pack && (!unpack || !free_fn))
        return tg__err(TG_ERR_NULL, "bad argument #%d to 'tape_set_saved_hooks' (a pack hook "
                                    "needs unpack and free_fn)", unpack ? 4 : 3);
    tape->pack = pack;
    tape->unpack = pack ? unpack : NULL;
    tape->pfree = pack ? free_fn : NULL;
    tape->pack_ud = pack ? userdata : NULL;
    return TG_OK;
}

tg_status tg_tape_set_grad_ready(tg_tape *tape, tg_grad_ready_fn fn, void *userdata)
{
    tg_status st = tg__tape_check(tape, "tape_set_grad_ready");
    if (st) return st;
    tape->ready = fn;
    tape->ready_ud = fn ? userdata : NULL;
    return TG_OK;
}

bool tg__tape_grads_observed(const tg_tape *tape)
{
    return tape->any_hooks || tape->nleaf_hooks || tape->watch || tape->ready;
}

void tg_tape_hooks_clear(tg_tape *tape)
{
    if (!tape) return;
    for (int32_t i = 0; i < tape->nhooks; i++) tg_tensor_release(tape->hooks[i].leaf);
    for (int32_t i = 0; i < tape->nleaf_hooks; i++) tg_tensor_release(tape->leaf_hooks[i].leaf);
    tape->nhooks = 0;
    tape->nleaf_hooks = 0;
    tape->any_hooks = tape->pre || tape->post;
}

void tg__hooks_reset(tg_tape *tape)
{
    int32_t keep = 0;
    for (int32_t i = 0; i < tape->nhooks; i++)
        if (tape->hooks[i].leaf) tape->hooks[keep++] = tape->hooks[i];
    tape->nhooks = keep;
    tape->any_hooks = keep > 0 || tape->pre || tape->post;
}

void tg__hooks_free(tg_tape *tape)
{
    tg_tape_hooks_clear(tape);
    free(tape->hooks);
    free(tape->leaf_hooks);
    tape->hooks = NULL;
    tape->leaf_hooks = NULL;
    tape->caphooks = tape->capleaf_hooks = 0;
    free(tape->packs);
    tape->packs = NULL;
    tape->cappacks = 0;
}

/* ---- saved-tensor hooks */

static bool packable(const tg_tensor *t)
{
    return t && !t->is_leaf && !t->leaf_view;
}

tg_status tg__hooks_pack(tg_tape *tape, const tg_op *op, int nin, tg_tensor *const *seen,
                         const tg_tensor *out, void **handles, unsigned *mask)
{
    *mask = 0;
    for (int i = 0; i <= nin; i++) {
        bool want = i < nin ? (op->saves & TG_SAVE_INPUT(i)) && packable(seen[i])
                            : (op->saves & TG_SAVE_OUTPUT) && packable(out);
        if (!want) continue;
        handles[i] = NULL;
        tg_scope_begin();
        tg_status st = tape->pack(i < nin ? seen[i] : (tg_tensor *)out, &handles[i], tape->pack_ud);
        tg_scope_end();
        if (st) {
            for (int k = 0; k < i; k++)
                if (*mask & (1u << k)) tape->pfree(handles[k], tape->pack_ud);
            *mask = 0;
            if (tg_last_error() == TG_OK)
                tg__err(st, "the tape's pack hook failed on what '%s' saves", op->name);
            return st;
        }
        *mask |= 1u << i;
    }
    return TG_OK;
}

tg_status tg__hooks_file(tg_tape *tape, int64_t idx, int nin, void **handles, unsigned mask)
{
    int n = 0;
    for (int i = 0; i <= nin; i++) n += (mask >> i) & 1u;
    tg_status st = tg__tape_grow((void **)&tape->packs, &tape->cappacks, tape->npacks + n,
                                 sizeof *tape->packs, HOOKS);
    if (st) {
        for (int i = 0; i <= nin; i++)
            if (mask & (1u << i)) tape->pfree(handles[i], tape->pack_ud);
        return st;
    }
    for (int i = 0; i <= nin; i++)
        if (mask & (1u << i))
            tape->packs[tape->npacks++] = (struct tg__packed){.node = idx, .which = i, .h = handles[i]};
    return TG_OK;
}

tg_status tg__hooks_unpack(tg_tape *tape, int64_t top)
{
    tg_status st = TG_OK;
    int64_t keep = 0;
    for (int64_t k = 0; k < tape->npacks; k++) {
        struct tg__packed *p = &tape->packs[k];
        if (p->node > top || st) {
            tape->packs[keep++] = *p;
            continue;
        }
        tg_node *n = &tape->nodes[p->node];
        const tg_spec *want = p->which < n->nin ? tg__node_in_spec(tape, n, p->which)
                                                : tg__node_out_spec(tape, n);
        tg_scope_begin();
        tg_tensor *t = tg_tensor_retain(tape->unpack(p->h, tape->pack_ud));
        tg_scope_end();
        if (!t) {
            st = tg_last_error() ? tg_last_error() : TG_ERR_INVALID;
            if (tg_last_error() == TG_OK)
                tg__err(st, "the tape's unpack hook returned NULL for what '%s' (node %lld) saved",
                        n->op->name, (long long)p->node);
            tape->packs[keep++] = *p;
            continue;
        }
        if (t->dtype != want->dtype || t->backend != (tg_backend)n->backend ||
            !tg__same_shape(t->ndim, t->shape, want->ndim, want->shape)) {
            char a[96], b[96];
            st = tg__err(TG_ERR_SHAPE, "the tape's unpack hook gave %s %s for what '%s' (node %lld) "
                                       "saved as %s %s", tg_dtype_name(t->dtype),
                         tg_shape_str(t->ndim, t->shape, a, sizeof a), n->op->name,
                         (long long)p->node, tg_dtype_name(want->dtype),
                         tg_shape_str(want->ndim, want->shape, b, sizeof b));
            tg_tensor_release(t);
            tape->packs[keep++] = *p;
            continue;
        }
        if (p->which < n->nin)
            n->in_saved[p->which] = t;
        else
            n->out_saved = t;
        tape->pfree(p->h, tape->pack_ud);
    }
    tape->npacks = keep;
    return st;
}

void tg__hooks_drop_packed(tg_tape *tape)
{
    for (int64_t k = 0; k < tape->npacks; k++) tape->pfree(tape->packs[k].h, tape->pack_ud);
    tape->npacks = 0;
}

/* ---- gradient and node hooks */

tg_status tg__hooks_grad(tg_tape *tape, int32_t slot, const tg_tensor *leaf, tg_tensor **g)
{
    for (int32_t k = 0; k < tape->nhooks; k++) {
        const struct tg__grad_hook *h = &tape->hooks[k];
        if (leaf ? h->leaf != leaf : (h->leaf || h->gen != tape->gen || h->slot != slot))
            continue;
        tg_tensor *rep = NULL;
        tg_scope_begin();
        tg_status st = h->fn(*g, &rep, h->ud);
        tg_tensor_retain(rep);
        tg_scope_end();
        if (st) {
            tg_tensor_release(rep);
            if (tg_last_error() == TG_OK) tg__err(st, "a gradient hook failed");
            return st;
        }
        if (!rep) continue;
        if (rep->dtype != (*g)->dtype || rep->backend != (*g)->backend ||
            !tg__same_shape(rep->ndim, rep->shape, (*g)->ndim, (*g)->shape)) {
            char a[96], b[96];
            tg_status bad = tg__err(TG_ERR_SHAPE, "a gradient hook replaced a %s %s gradient with %s %s",
                           tg_dtype_name((*g)->dtype),
                           tg_shape_str((*g)->ndim, (*g)->shape, a, sizeof a),
                           tg_dtype_name(rep->dtype), tg_shape_str(rep->ndim, rep->shape, b, sizeof b));
            tg_tensor_release(rep);
            return bad;
        }
        tg_tensor_release(*g);
        *g = rep;
    }
    return TG_OK;
}

tg_status tg__hooks_leaves(tg_tape *tape)
{
    for (int32_t k = 0; k < tape->nleaf_hooks; k++) {
        const struct tg__leaf_hook *h = &tape->leaf_hooks[k];
        if (!h->leaf->grad || h->leaf->tape != tape) continue;
        tg_scope_begin();
        tg_status st = h->fn(h->leaf, h->ud);
        tg_scope_end();
        if (st) {
            if (tg_last_error() == TG_OK) tg__err(st, "a leaf hook failed");
            return st;
        }
    }
    return TG_OK;
}

static tg_node_info info_of(const tg_tape *tape, int64_t idx)
{
    const tg_node *n = &tape->nodes[idx];
    return (tg_node_info){.op = n->op->name, .node = idx, .label = tg__tape_label_of(tape, n),
                          .nin = n->nin};
}

tg_status tg__hooks_node_pre(tg_tape *tape, int64_t idx, tg_tensor *gout)
{
    if (!tape->pre) return TG_OK;
    tg_node_info info = info_of(tape, idx);
    tg_scope_begin();
    tg_status st = tape->pre(&info, gout, tape->node_ud);
    tg_scope_end();
    if (st && tg_last_error() == TG_OK) tg__err(st, "the pre-backward hook failed at '%s'", info.op);
    return st;
}

tg_status tg__hooks_node_post(tg_tape *tape, int64_t idx, tg_tensor **const *dst)
{
    if (!tape->post) return TG_OK;
    tg_node_info info = info_of(tape, idx);
    tg_tensor *gin[TG_OP_MAX_INPUTS] = {0};
    for (int i = 0; i < info.nin; i++) gin[i] = dst[i] ? *dst[i] : NULL;
    tg_scope_begin();
    tg_status st = tape->post(&info, gin, tape->node_ud);
    tg_scope_end();
    if (st && tg_last_error() == TG_OK) tg__err(st, "the post-backward hook failed at '%s'", info.op);
    return st;
}

tg_status tg__tape_watch_after(tg_tape *tape, int64_t idx, const tg_node *n, tg_tensor **const *dst)
{
    tg_status st = TG_OK;
    if (tape->opts.anomaly)
        for (int i = 0; i < n->nin && !st; i++)
            if (dst[i] && *dst[i]) st = tg__anomaly_grad(tape, idx, n, i + 1, *dst[i]);
    if (!st && tape->post) st = tg__hooks_node_post(tape, idx, dst);
    return st;
}
