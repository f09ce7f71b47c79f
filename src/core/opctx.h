/* The per-call context handed to an op's forward and backward functions.
 * Dispatch makes it for forward; the tape's node executor (tape/exec.h)
 * for recompute and backward. Both make it with tg__op_ctx below, the one
 * place that fills it. Accessors live in src/dispatch/opctx.c. */
#ifndef TG_CORE_OPCTX_H
#define TG_CORE_OPCTX_H

#include "core/internal.h"

#define TG_OP_MAX_EXTRA 4

/* All zero: the attrs of a call made without any (dispatch.c). */
TG_INTERNAL extern const tg_op_attrs tg__zero_attrs;

/* A node's gradient slots in a sweep: per input, the slot its gradient
 * goes to (NULL where none), and the leaf's sink for that slot (sink
 * NULL: none; tape/exec.h). */
typedef struct tg__node_slots {
    tg_tensor **const *dst;
    tg_tensor *const *sink;
} tg__node_slots;

struct tg_op_ctx {
    const tg_op *op;
    const tg_op_attrs *attrs;
    int nin;
    tg_tensor *const *in;      /* forward: the inputs; backward: saved (may be NULL) */
    const tg_spec *in_spec;
    tg_tensor *out;            /* backward: saved output or NULL */
    const tg_spec *out_spec;
    tg_backend backend;
    /* Bit i: input i needs a gradient. Backward: an op that takes input
     * i's gradient over (a replica worker's deferred weight gradient,
     * replicas.c) clears bit i, and the engine then expects none. */
    unsigned needs;
    tg_tensor **extra;         /* TG_OP_MAX_EXTRA slots */
    int *nextra;
    bool forward;
    /* Replay (tape/replay.c): the recorded output, handed out once by
     * tg_op_ctx_new_output so that forward writes into it; else NULL. */
    tg_tensor *reuse;
    /* Backward: the gradient the engine passes in is its own to drop after
     * the call (no other reference to it or its storage, contiguous,
     * untracked, no hook watching): a pointwise backward may write its
     * result over it instead of allocating (built-in ops only; see
     * map_bwd and mul_bwd). */
    bool gout_scratch;
    /* Backward: where sink[i] is set, the engine offers it as input i's
     * gradient buffer (the leaf's gradient sink, backward.c): an op that
     * makes that gradient whole in a new tensor may write it there instead
     * (tg_op_ctx_new_grad, tg__op_ctx_take_sink). Taken at most once. NULL
     * when nothing is offered. */
    tg_tensor **sink;
    /* Backward, in a sweep's node executor (else NULL): the node's gradient
     * slots, which tg__op_ctx_take_accum reads; accum_taken has bit i set
     * once input i's sum is taken. */
    const struct tg__node_slots *slots;
    unsigned accum_taken;
};

/* The context of one call of op on nin inputs in (specs in_spec, output
 * spec out_spec) on backend; needs: bit i, input i needs a gradient.
 * forward: extra/nextra are TG_OP_MAX_EXTRA slots that tg_op_ctx_save
 * fills (*nextra counts them), out is NULL. Backward: in holds what the
 * node keeps (NULL where it keeps nothing), out its kept output or NULL,
 * extra/nextra what its forward saved (extra may be NULL with *nextra 0).
 * Nothing is retained; every pointer must outlive the call. */
static inline tg_op_ctx tg__op_ctx(const tg_op *op, const tg_op_attrs *attrs, int nin,
                                   tg_tensor *const *in, const tg_spec *in_spec, tg_tensor *out,
                                   const tg_spec *out_spec, tg_backend backend, unsigned needs,
                                   tg_tensor **extra, int *nextra, bool forward)
{
    return (tg_op_ctx){
        .op = op, .attrs = attrs, .nin = nin, .in = in, .in_spec = in_spec, .out = out,
        .out_spec = out_spec, .backend = backend, .needs = needs, .extra = extra,
        .nextra = nextra, .forward = forward, .reuse = NULL, .gout_scratch = false,
        .sink = NULL, .slots = NULL, .accum_taken = 0,
    };
}

/* Backward: the buffer offered for input i's gradient (borrowed), now
 * taken, or NULL where none is offered (or it was taken). Its dtype and
 * shape are input i's spec; a taker must write every element of it. */
static inline tg_tensor *tg__op_ctx_take_sink(tg_op_ctx *ctx, int i)
{
    if (!ctx->sink || i < 0 || i >= ctx->nin || !ctx->sink[i]) return NULL;
    tg_tensor *t = ctx->sink[i];
    ctx->sink[i] = NULL;
    return t;
}

/* Backward: the running sum of input i's gradient (borrowed) that this
 * call's gradient would be added to in place: the leaf's sink holding the
 * sum, or a sum only the sweep holds, in a slot no other input of the node
 * shares; NULL where there is none (or it was taken). An op whose kernel
 * adds into its output with the add kernel's bits (a GEMM with beta 1,
 * tg__gemm_adds_exactly) may take it: add its gradient into every element
 * of it itself and hand it back as gin[i], saving a buffer and a pass. */
static inline tg_tensor *tg__op_ctx_accum_of(const tg_op_ctx *ctx, int i)
{
    const tg__node_slots *s = ctx->slots;
    if (!s || i < 0 || i >= ctx->nin || !(ctx->needs & (1u << i)) ||
        (ctx->accum_taken & (1u << i)) || !s->dst[i])
        return NULL;
    tg_tensor *d = *s->dst[i];
    if (!d || (!(s->sink && s->sink[i] == d) && !tg__held_only(d, 1))) return NULL;
    for (int k = 0; k < ctx->nin; k++)
        if (k != i && s->dst[k] == s->dst[i]) return NULL;
    return d;
}

/* The same, now taken: the caller must add its gradient into it, as the
 * add kernel adds (sum + gradient, one rounding), and set gin[i] to it. */
static inline tg_tensor *tg__op_ctx_take_accum(tg_op_ctx *ctx, int i)
{
    tg_tensor *d = tg__op_ctx_accum_of(ctx, i);
    if (d) ctx->accum_taken |= 1u << i;
    return d;
}

#endif
