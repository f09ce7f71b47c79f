/* The node executor (see exec.h): context, call, check, accumulate. On the
 * hot path of every backward: no allocation of its own (contexts, specs
 * and gradient arrays live on the stack), one private scope per backward
 * call, and the in-place accumulation inlined. */
#include "tape/exec.h"

#include "backend/parallel.h" /* tg__add_into */

/* When the sweep holds the only reference to dst and to its storage (not
 * a view of another gradient, not a tensor anyone else can see, not
 * recorded on a tape), the sum is written into dst itself: the add kernel
 * with the same operands in the same order, so the same bits, without a
 * new buffer per contribution (a weight used at every step of an RNN gets
 * one per step). Kernels read contiguous operands only, so src must be
 * contiguous too (a broadcast gradient, stride 0, is not). */
static inline bool sole_holder(const tg_tensor *t, const tg_tensor *src)
{
    return t->refcount == 1 && t->storage->refcount == 1 && t->contiguous && src->contiguous &&
           !t->scope_owned && !t->tape && t != src && t->storage != src->storage &&
           t->dtype == src->dtype && t->backend == src->backend &&
           tg__same_shape(t->ndim, t->shape, src->ndim, src->shape);
}

static inline tg_status accumulate(tg_tensor **dst, tg_tensor *src)
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

tg_status tg__grad_accumulate(tg_tensor **dst, tg_tensor *src)
{
    return accumulate(dst, src);
}

tg_status tg__exec_forward(const tg_node *n, tg_tensor *const *args, tg_tensor **extra,
                           int *nextra, uint64_t *ns, tg_tensor **out)
{
    tg_spec in_spec[TG_OP_MAX_INPUTS], out_spec = {0};
    for (int i = 0; i < n->nin; i++) tg__spec_of(args[i], &in_spec[i]);
    *out = NULL;
    tg_status st = n->op->shape(n->op, &n->attrs, args, &out_spec);
    if (st) return st;
    tg_op_ctx ctx = tg__op_ctx(n->op, &n->attrs, n->nin, args, in_spec, NULL, &out_spec,
                               n->backend, tg__node_needs(n), extra, nextra, true);
    uint64_t t0 = ns ? tg__now_ns() : 0;
    *out = n->op->forward(&ctx, args);
    if (ns) *ns += tg__now_ns() - t0;
    if (!*out) return tg_last_error() ? tg_last_error() : TG_ERR_INTERNAL;
    return TG_OK;
}

static tg_status bad_grad(const tg_node *n, const tg_spec *want, const char *what, int i)
{
    char a[96];
    return tg__err(TG_ERR_INTERNAL, "backward of '%s' returned %s for input #%d (expected %s %s)",
                   n->op->name, what, i + 1, tg_dtype_name(want->dtype),
                   tg_shape_str(want->ndim, want->shape, a, sizeof a));
}

tg_status tg__exec_backward(const tg_node *n, tg_tensor *const *in, const tg_spec *in_spec,
                            tg_tensor *out, const tg_spec *out_spec, tg_tensor **extra,
                            int *nextra, tg_tensor *gout, tg_tensor **const *dst, uint64_t *ns)
{
    unsigned needs = tg__node_needs(n);
    tg_tensor *gin[TG_OP_MAX_INPUTS] = {0};
    tg_op_ctx ctx = tg__op_ctx(n->op, &n->attrs, n->nin, in, in_spec, out, out_spec, n->backend,
                               needs, extra, nextra, false);
    tg_scope_begin();
    uint64_t t0 = ns ? tg__now_ns() : 0;
    tg_status st = n->op->backward(&ctx, gout, gin);
    if (ns) *ns += tg__now_ns() - t0;
    /* gin entries are borrowed (scope-owned or gout itself): take our own
     * references before the scope releases its tensors. */
    for (int i = 0; i < n->nin; i++) tg_tensor_retain(gin[i]);
    tg_scope_end();
    if (st == TG_OK) {
        for (int i = 0; i < n->nin && st == TG_OK; i++) {
            if (!(needs & (1u << i))) continue;
            const tg_tensor *g = gin[i];
            if (!g)
                st = bad_grad(n, &in_spec[i], "no gradient", i);
            else if (g->dtype != in_spec[i].dtype ||
                     !tg__same_shape(g->ndim, g->shape, in_spec[i].ndim, in_spec[i].shape))
                st = bad_grad(n, &in_spec[i], "a gradient of the wrong dtype or shape", i);
        }
    } else if (tg_last_error() == TG_OK) {
        tg__err(st, "backward of '%s' failed", n->op->name);
    }
    for (int i = 0; i < n->nin; i++) {
        if (st != TG_OK || !(needs & (1u << i))) {
            tg_tensor_release(gin[i]);
            continue;
        }
        st = accumulate(dst[i], gin[i]);
    }
    return st;
}
