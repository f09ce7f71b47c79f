/* The node executor: the one way the tape runs a recorded op again. The
 * reverse sweep (backward.c), recompute (recompute.c) and the blocked
 * pointwise runs (region.c) all call an op's forward or backward through
 * here: it builds the call context (tg__op_ctx), calls the entry's
 * function pointer, checks what came back and accumulates the gradients.
 * It knows nothing of where the values come from (saved, recomputed, a
 * block's slice): its callers hand them in. It is written here, inline,
 * because it runs once per node of every sweep: a tanh on one element
 * costs ~100 ns fwd+bwd, and the out-of-line calls cost ~2% of that. No
 * allocation of its own: contexts, specs and gradient arrays live on the
 * stack, with one private scope per backward call. */
#ifndef TG_TAPE_EXEC_H
#define TG_TAPE_EXEC_H

#include "backend/parallel.h" /* tg__add_into */
#include "tape/tape_internal.h"

/* Inputs of n that need a gradient: bit i set when input i has a slot. */
static inline unsigned tg__node_needs(const tg_node *n)
{
    unsigned needs = 0;
    for (int i = 0; i < n->nin; i++)
        if (n->in_slot[i] >= 0) needs |= 1u << i;
    return needs;
}

/* When the sweep holds the only reference to dst (tg__held_only: under
 * create_graph an untracked first contribution, a constant, must not
 * absorb a tracked one, so src must be untracked too), the sum is written
 * into dst itself: the add kernel with the same operands in the same
 * order, so the same bits, without a new buffer per contribution (a weight
 * used at every step of an RNN gets one per step). src may be dst itself
 * (x * x hands one gradient g x to both inputs): its two references are
 * then the sweep's. Kernels read contiguous operands only, so src must be
 * contiguous too (a broadcast gradient, stride 0, is not). */
static inline bool tg__sole_holder(const tg_tensor *t, const tg_tensor *src)
{
    if (t == src) return tg__held_only(t, 2);
    return tg__held_only(t, 1) && src->contiguous && !src->tape && t->storage != src->storage &&
           t->dtype == src->dtype && t->backend == src->backend &&
           tg__same_shape(t->ndim, t->shape, src->ndim, src->shape);
}

/* Whether a backward may overwrite its incoming gradient g: the sweep
 * holds its only reference (tg__held_only), and no node hook or anomaly
 * check reads it afterwards. */
static inline bool tg__gout_scratch(const struct tg_tape *tape, const tg_tensor *g)
{
    return g && tg__held_only(g, 1) && !tape->watch;
}

/* *dst += src, taking src's reference; *dst may be NULL (then it becomes
 * src). In place (tg__add_into) where the sum may overwrite *dst, else
 * through the public add op: the same kernel, operands and order either
 * way, so the same bits. */
static inline tg_status tg__grad_accumulate(tg_tensor **dst, tg_tensor *src)
{
    if (!*dst) {
        *dst = src;
        return TG_OK;
    }
    if (tg__sole_holder(*dst, src)) {
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

/* Re-runs n's forward on args (one borrowed value per input, contiguous
 * unless the op takes strided inputs): their specs and the shape rule's
 * output spec make the context, as dispatch made it when recording. What
 * forward saves goes to extra (TG_OP_MAX_EXTRA slots), counted in
 * *nextra. ns: NULL, or (profiling) the forward's time is added to it.
 * *out: new reference; on failure NULL and the error is recorded. */
static inline tg_status tg__exec_forward(const struct tg_tape *tape, const tg_node *n,
                                         tg_tensor *const *args, tg_tensor **extra, int *nextra,
                                         uint64_t *ns, tg_tensor **out)
{
    const tg_op_attrs *attrs = tg__node_attrs(tape, n);
    tg_spec in_spec[TG_OP_MAX_INPUTS], out_spec = {0};
    for (int i = 0; i < n->nin; i++) tg__spec_of(args[i], &in_spec[i]);
    *out = NULL;
    tg_status st = n->op->shape(n->op, attrs, args, &out_spec);
    if (st) return st;
    tg_op_ctx ctx = tg__op_ctx(n->op, attrs, n->nin, args, in_spec, NULL, &out_spec,
                               (tg_backend)n->backend, tg__node_needs(n), extra, nextra, true);
    uint64_t t0 = ns ? tg__now_ns() : 0;
    tg__in_op++;
    *out = n->op->forward(&ctx, args);
    tg__in_op--;
    if (ns) *ns += tg__now_ns() - t0;
    if (!*out) return tg_last_error() ? tg_last_error() : TG_ERR_INTERNAL;
    return TG_OK;
}

static inline tg_status tg__bad_grad(const tg_node *n, const tg_spec *want, const char *what, int i)
{
    char a[96];
    return tg__err(TG_ERR_INTERNAL, "backward of '%s' returned %s for input #%d (expected %s %s)",
                   n->op->name, what, i + 1, tg_dtype_name(want->dtype),
                   tg_shape_str(want->ndim, want->shape, a, sizeof a));
}

/* Runs n's backward (needs: tg__node_needs(n), which its callers have
 * already) on the output gradient gout (borrowed), with in
 * (in_spec), out (out_spec), extra and *nextra as in tg__op_ctx's
 * backward case, all borrowed. For each input i that needs a gradient
 * (tg__node_needs) the gradient must come back with in_spec[i]'s dtype
 * and shape, else TG_ERR_INTERNAL naming the op and the input; when all
 * do, each is accumulated into *dst[i] (tg__grad_accumulate), in input
 * order. On failure nothing is accumulated into any dst (unless the
 * accumulation itself fails midway) and the error is recorded. ns: as in
 * tg__exec_forward, for the backward call.
 *
 * sink: NULL, or per input the gradient sink of the leaf whose slot dst[i]
 * is (NULL: none; backward.c). Where *dst[i] is still empty the backward
 * is offered it (tg__op_ctx_take_sink: the first input of that slot only,
 * so two inputs never both write it); where *dst[i] is the sink, the
 * gradient is added into it in place, as into a sum the sweep owns. */
static TG_ALWAYS_INLINE tg_status tg__exec_backward(const struct tg_tape *tape, const tg_node *n,
                                                    unsigned needs, tg_tensor *const *in,
                                                    const tg_spec *in_spec, tg_tensor *out,
                                                    const tg_spec *out_spec, tg_tensor **extra,
                                                    int *nextra, tg_tensor *gout,
                                                    tg_tensor **const *dst,
                                                    tg_tensor *const *sink, uint64_t *ns)
{
    tg_tensor *gin[TG_OP_MAX_INPUTS] = {0}, *offer[TG_OP_MAX_INPUTS];
    tg_op_ctx ctx = tg__op_ctx(n->op, tg__node_attrs(tape, n), n->nin, in, in_spec, out, out_spec, (tg_backend)n->backend,
                               needs, extra, nextra, false);
    ctx.gout_scratch = tg__gout_scratch(tape, gout);
    if (sink) {
        for (int i = 0; i < n->nin; i++) {
            offer[i] = (needs & (1u << i)) && sink[i] && !*dst[i] ? sink[i] : NULL;
            for (int k = 0; k < i && offer[i]; k++)
                if (dst[k] == dst[i]) offer[i] = NULL;
        }
        ctx.sink = offer;
    }
    tg__node_slots slots = {dst, sink};
    ctx.slots = &slots; /* for tg__op_ctx_take_accum */
    tg__scope_begin_inline();
    uint64_t t0 = ns ? tg__now_ns() : 0;
    tg__in_op++;
    tg_status st = n->op->backward(&ctx, gout, gin);
    tg__in_op--;
    if (ns) *ns += tg__now_ns() - t0;
    needs &= ctx.needs; /* an op may take an input's gradient over (replicas.c) */
    /* gin entries are borrowed (scope-owned or gout itself): take our own
     * references before the scope releases its tensors. */
    for (int i = 0; i < n->nin; i++) tg_tensor_retain(gin[i]);
    tg__scope_end_inline();
    if (st == TG_OK) {
        for (int i = 0; i < n->nin && st == TG_OK; i++) {
            if (!(needs & (1u << i))) continue;
            const tg_tensor *g = gin[i];
            if (!g)
                st = tg__bad_grad(n, &in_spec[i], "no gradient", i);
            else if (g->dtype != in_spec[i].dtype ||
                     !tg__same_shape(g->ndim, g->shape, in_spec[i].ndim, in_spec[i].shape))
                st = tg__bad_grad(n, &in_spec[i], "a gradient of the wrong dtype or shape", i);
        }
    } else if (tg_last_error() == TG_OK) {
        tg__err(st, "backward of '%s' failed", n->op->name);
    }
    for (int i = 0; i < n->nin; i++) {
        if (st != TG_OK || !(needs & (1u << i))) {
            tg_tensor_release(gin[i]);
            continue;
        }
        if (ctx.accum_taken & (1u << i)) { /* the backward added it into *dst[i] itself */
            if (gin[i] != *dst[i]) st = tg__bad_grad(n, &in_spec[i], "another tensor", i);
            tg_tensor_release(gin[i]);
            continue;
        }
        if (sink && sink[i] && *dst[i] == sink[i] && gin[i] != sink[i] && gin[i]->contiguous &&
            !gin[i]->tape && gin[i]->backend == sink[i]->backend &&
            gin[i]->storage != sink[i]->storage) {
            tg__add_into(sink[i], gin[i]);
            tg_tensor_release(gin[i]);
            continue;
        }
        st = tg__grad_accumulate(dst[i], gin[i]);
    }
    return st;
}

#endif
