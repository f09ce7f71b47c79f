/* Dispatch: the one place where ops, kernels and the tape meet.
 * validate -> autodiff check -> shape rule -> kernel (forward) -> record. */

#include "dispatch/dispatch.h"
#include "tape/tape_internal.h"

tg_tensor *tg__contiguous_raw(tg_tensor *t)
{
    if (t->contiguous) return tg_tensor_retain(t);
    tg_tensor *c = tg__tensor_empty(t->dtype, t->ndim, t->shape, t->backend);
    if (!c) return NULL;
    tg_copy_strided_fn copy = TG_KERNEL(tg_copy_strided_fn, TG_K_COPY_STRIDED, t);
    copy(t->ndim, t->shape, t->strides, tg__tensor_ptr(t), tg__tensor_ptr(c),
         tg_dtype_size(t->dtype));
    return c;
}

/* Checks that every input is present, on one backend and one live tape.
 * Sets tracked[i] and *tape. Inlined into tg_op_call: the loops are over
 * at most TG_OP_MAX_INPUTS inputs. */
static inline tg_status validate(const tg_op *op, int n, tg_tensor *const *in,
                                 bool tracked[TG_OP_MAX_INPUTS], tg_tape **tape, tg_tape **replay,
                                 unsigned *needs)
{
    *tape = NULL;
    *replay = NULL;
    *needs = 0;
    for (int i = 0; i < n; i++)
        if (!in[i]) return tg__err_null(op->name, i + 1);
    if (!(op->flags & TG_OP_MIXED_BACKENDS)) {
        for (int i = 1; i < n; i++)
            if (in[i]->backend != in[0]->backend)
                return tg__err(TG_ERR_DEVICE, "bad argument #%d to '%s' (on backend '%s', but "
                                              "argument #1 is on '%s'; move one with "
                                              "tg_to_device)", i + 1, op->name,
                               tg_backend_name(in[i]->backend), tg_backend_name(in[0]->backend));
    }
    bool recording = !tg__grad_disabled && !op->nondifferentiable;
    /* All TG_OP_MAX_INPUTS of them: a store of constant size (a loop over
     * n became a call to memset, 16 instructions of every op call). */
    memset(tracked, 0, TG_OP_MAX_INPUTS * sizeof *tracked);
    if (!recording) {
        /* Not recorded, but a replay must run it again (a comparison of
         * a replay input). */
        if (!tg__grad_disabled) *replay = tg__replay_tape_of(n, in);
        return TG_OK;
    }
    for (int i = 0; i < n; i++) {
        const tg_tensor *t = in[i];
        if (!t->tape) continue;
        /* tg__tensor_live, inlined */
        if (t->tape->dead || (!t->is_leaf && t->gen != t->tape->gen))
            return tg__err_stale(op->name, i + 1, t);
        if (*tape && *tape != t->tape)
            return tg__err(TG_ERR_TAPE, "bad argument #%d to '%s' (recorded on a different tape "
                                        "than an earlier argument)", i + 1, op->name);
        *tape = t->tape;
        tracked[i] = true;
        *needs |= (unsigned)!t->nograd << i;
    }
    if (*tape && !op->backward) {
        if (!*needs) { /* replay inputs only: no gradient to take */
            memset(tracked, 0, TG_OP_MAX_INPUTS * sizeof *tracked);
            *replay = tg__replay_capturing(*tape) ? *tape : NULL;
            *tape = NULL;
            return TG_OK;
        }
        int first = 0; /* the first input that needs a gradient */
        while (!(*needs & (1u << first))) first++;
        if (tg__backward_of)
            return tg__err(TG_ERR_NOT_DIFFERENTIABLE,
                           "op '%s' is not marked for autodiff: input %d requires grad, in the "
                           "backward of '%s' recorded for create_graph (that op has no second "
                           "derivative)", op->name, first, tg__backward_of);
        return tg__err(TG_ERR_NOT_DIFFERENTIABLE,
                       "op '%s' is not marked for autodiff: input %d requires grad (detach it "
                       "with tg_detach, or register a backward)", op->name, first);
    }
    return TG_OK;
}

const tg_op_attrs tg__zero_attrs;

/* tg_op_call, with into (NULL, or a contiguous tensor of the output's
 * spec) as the buffer tg_op_ctx_new_output hands forward when the call
 * records nothing. */
static TG_ALWAYS_INLINE tg_tensor *call(const tg_op *op, int n, tg_tensor *const *in,
                                        const tg_op_attrs *attrs, tg_tensor *into)
{
    if (!op) {
        tg__err(TG_ERR_NULL, "bad argument #1 to 'op_call' (NULL op)");
        return NULL;
    }
    tg__registry_ready();
    if (n > 0 && !in) {
        tg__err(TG_ERR_NULL, "bad argument #3 to 'op_call' (NULL input array for '%s')", op->name);
        return NULL;
    }
    if (n != op->arity) {
        tg__err(TG_ERR_INVALID, "bad argument #2 to 'op_call' ('%s' takes %d inputs, got %d)",
                op->name, op->arity, n);
        return NULL;
    }
    if (!attrs) attrs = &tg__zero_attrs;
    tg_tensor *sub[TG_OP_MAX_INPUTS];
    if (tg__replica_active && n > 0) in = tg__replica_args(tg__replica_active, n, in, sub);
    bool tracked[TG_OP_MAX_INPUTS];
    tg_tape *tape, *replay;
    unsigned needs;
    if (validate(op, n, in, tracked, &tape, &replay, &needs)) return NULL;

    tg_spec in_spec[TG_OP_MAX_INPUTS], out_spec;
    for (int i = 0; i < n; i++) tg__spec_of(in[i], &in_spec[i]);
    memset(&out_spec, 0, sizeof out_spec);
    if (op->shape(op, attrs, in, &out_spec) != TG_OK) {
        if (tg_last_error() == TG_OK)
            tg__err(TG_ERR_SHAPE, "shape rule of '%s' rejected its inputs", op->name);
        return NULL;
    }

    tg_tensor *args[TG_OP_MAX_INPUTS];
    unsigned copied;
    if (tg__op_args(op, n, in, args, &copied)) return NULL;
    tg_tensor *extra[TG_OP_MAX_EXTRA] = {0};
    int nextra = 0;
    tg_op_ctx ctx = tg__op_ctx(op, attrs, n, args, in_spec, NULL, &out_spec,
                               n ? in[0]->backend : tg_default_backend(), needs, extra, &nextra,
                               true);
    if (into && !tape && !replay && into->contiguous && into->backend == ctx.backend &&
        into->dtype == out_spec.dtype &&
        tg__same_shape(into->ndim, into->shape, out_spec.ndim, out_spec.shape))
        ctx.reuse = into;

    /* A forward built from tg_* ops must not record its inner ops. */
    bool prev_grad_off = tg__grad_disabled;
    tg__grad_disabled = true;
    uint64_t t0 = (tape && tape->profiling) ? tg__now_ns() : 0;
    tg__in_op++;
    tg_tensor *out = op->forward(&ctx, args);
    tg__in_op--;
    uint64_t elapsed = t0 ? tg__now_ns() - t0 : 0;
    tg__grad_disabled = prev_grad_off;
    if (out) {
        /* A view of a leaf (or of such a view) costs the tape nothing. */
        for (int i = 0; i < n; i++)
            if (out->storage == in[i]->storage && (in[i]->is_leaf || in[i]->leaf_view))
                out->leaf_view = true;
    }
    if (out && tape && tape->opts.anomaly && tg__anomaly_forward(tape, op, n, in, out)) {
        tg_tensor_release(out);
        out = NULL;
    }
    if (out && tape) {
        size_t saved_before = tape->saved_bytes;
        /* Save what forward saw (contiguous copies included), so backward
         * reads the same values. */
        if (tg__tape_record(tape, op, attrs, n, in, args, tracked, out, extra, nextra) != TG_OK) {
            tg_tensor_release(out);
            out = NULL;
        } else {
            nextra = 0; /* the node owns them now */
            if (t0)
                tg__profile_forward(tape, op, elapsed,
                                    tape->saved_bytes > saved_before
                                        ? tape->saved_bytes - saved_before : 0);
            if (tg__replay_capturing(tape)) replay = tape;
        }
    }
    if (out && replay &&
        tg__replay_capture(replay, op, attrs, n, in, tracked, out, replay == tape) != TG_OK) {
        tg_tensor_release(out);
        out = NULL;
    }
    if (!out && tg_last_error() == TG_OK) tg__err(TG_ERR_INTERNAL, "forward of '%s' failed", op->name);
    for (int i = 0; i < nextra; i++) tg_tensor_release(extra[i]);
    tg__op_args_release(n, args, copied);
    return tg__scope_track(out);
}

tg_tensor *tg_op_call(const tg_op *op, int n, tg_tensor *const *in, const tg_op_attrs *attrs)
{
    return call(op, n, in, attrs, NULL);
}

tg_tensor *tg__call_into(const tg_op *op, int n, tg_tensor *const *in, const tg_op_attrs *attrs,
                         tg_tensor *into)
{
    return call(op, n, in, attrs, into);
}

tg_tensor *tg__call1(const tg_op *op, tg_tensor *x, const tg_op_attrs *attrs)
{
    tg_tensor *in[1] = {x};
    return tg_op_call(op, 1, in, attrs);
}

tg_tensor *tg__call2(const tg_op *op, tg_tensor *a, tg_tensor *b, const tg_op_attrs *attrs)
{
    tg_tensor *in[2] = {a, b};
    return tg_op_call(op, 2, in, attrs);
}

/* ---- shape-rule helpers */
tg_status tg__need_float(const tg_op *op, int argi, const tg_tensor *t)
{
    if (tg__is_float(t->dtype)) return TG_OK;
    return tg__err(TG_ERR_DTYPE, "bad argument #%d to '%s' (%s tensor; need f32 or f64)", argi,
                   op->name, tg_dtype_name(t->dtype));
}

tg_status tg__need_same_dtype(const tg_op *op, const tg_tensor *a, const tg_tensor *b)
{
    if (a->dtype == b->dtype) return TG_OK;
    return tg__err(TG_ERR_DTYPE, "bad argument #2 to '%s' (%s, but argument #1 is %s; convert "
                                 "with tg_cast)", op->name, tg_dtype_name(b->dtype),
                   tg_dtype_name(a->dtype));
}

bool tg__broadcasts_to(int n, const int64_t *shape, int m, const int64_t *target)
{
    if (n > m) return false;
    for (int i = 0; i < n; i++) {
        int64_t s = shape[n - 1 - i], t = target[m - 1 - i];
        if (s != t && s != 1) return false;
    }
    return true;
}

tg_status tg__broadcast_spec(const tg_op *op, const tg_tensor *a, const tg_tensor *b, tg_spec *out)
{
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    out->dtype = a->dtype;
    out->ndim = nd;
    for (int i = 0; i < nd; i++) {
        int ia = a->ndim - nd + i, ib = b->ndim - nd + i;
        int64_t sa = ia >= 0 ? a->shape[ia] : 1, sb = ib >= 0 ? b->shape[ib] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            char s1[96], s2[96];
            return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (shapes %s and %s do not "
                                         "broadcast: dim %d is %lld vs %lld)", op->name,
                           tg_shape_str(a->ndim, a->shape, s1, sizeof s1),
                           tg_shape_str(b->ndim, b->shape, s2, sizeof s2), i, (long long)sa,
                           (long long)sb);
        }
        out->shape[i] = sa == 1 ? sb : sa;
    }
    return TG_OK;
}

/* True when r, left-padded with 1s, is 1 on a prefix of out's dims and
 * equal to out on the rest: r is one row repeated over the leading dims. */
tg_status tg__norm_dim(const tg_op *op, int argi, int64_t dim, int ndim, int *out)
{
    int64_t d = dim < 0 ? dim + ndim : dim;
    if (d < 0 || d >= (ndim ? ndim : 1) || (ndim == 0 && d != 0))
        return tg__err(TG_ERR_INVALID, "bad argument #%d to '%s' (dim %lld out of range for %d "
                                       "dims)", argi, op->name, (long long)dim, ndim);
    *out = (int)d;
    return TG_OK;
}

void tg__split_dim(int ndim, const int64_t *shape, int dim, int64_t *outer, int64_t *n,
                   int64_t *inner)
{
    *outer = 1;
    *inner = 1;
    *n = ndim ? shape[dim] : 1;
    for (int i = 0; i < dim; i++) *outer *= shape[i];
    for (int i = dim + 1; i < ndim; i++) *inner *= shape[i];
}

tg_status tg__shape_same_float(const tg_op *op, const tg_op_attrs *attrs, tg_tensor *const *in,
                               tg_spec *out)
{
    (void)attrs;
    if (tg__need_float(op, 1, in[0])) return TG_ERR_DTYPE;
    tg__spec_of(in[0], out);
    return TG_OK;
}

tg_status tg__shape_broadcast_float(const tg_op *op, const tg_op_attrs *attrs,
                                    tg_tensor *const *in, tg_spec *out)
{
    (void)attrs;
    if (tg__need_float(op, 1, in[0]) || tg__need_float(op, 2, in[1]) ||
        tg__need_same_dtype(op, in[0], in[1]))
        return TG_ERR_DTYPE;
    return tg__broadcast_spec(op, in[0], in[1], out);
}
