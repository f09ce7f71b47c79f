/* Accessors of tg_op_ctx for forward and backward functions. */
#include "dispatch/dispatch.h"

const tg_op_attrs *tg_op_ctx_attrs(const tg_op_ctx *ctx)
{
    return ctx->attrs;
}

tg_tensor *tg_op_ctx_input(const tg_op_ctx *ctx, int i)
{
    return (i >= 0 && i < ctx->nin) ? ctx->in[i] : NULL;
}

const tg_spec *tg_op_ctx_input_spec(const tg_op_ctx *ctx, int i)
{
    return (i >= 0 && i < ctx->nin) ? &ctx->in_spec[i] : NULL;
}

tg_tensor *tg_op_ctx_output(const tg_op_ctx *ctx)
{
    return ctx->out;
}

const tg_spec *tg_op_ctx_output_spec(const tg_op_ctx *ctx)
{
    return ctx->out_spec;
}

bool tg_op_ctx_needs_grad(const tg_op_ctx *ctx, int i)
{
    return i >= 0 && i < ctx->nin && (ctx->needs & (1u << i));
}

tg_backend tg_op_ctx_backend(const tg_op_ctx *ctx)
{
    return ctx->backend;
}

tg_tensor *tg_op_ctx_new_output(tg_op_ctx *ctx)
{
    if (ctx->reuse) {
        tg_tensor *t = tg_tensor_retain(ctx->reuse);
        ctx->reuse = NULL;
        return t;
    }
    return tg__tensor_empty_spec(ctx->out_spec, ctx->backend);
}

tg_tensor *tg_op_ctx_new_grad(tg_op_ctx *ctx, int i)
{
    if (!ctx) {
        tg__err(TG_ERR_NULL, "bad argument #1 to 'op_ctx_new_grad' (NULL context)");
        return NULL;
    }
    if (ctx->forward || i < 0 || i >= ctx->nin) {
        tg__err(TG_ERR_INVALID, "bad argument #2 to 'op_ctx_new_grad' (%s)",
                ctx->forward ? "called from a forward" : "no such input");
        return NULL;
    }
    tg_tensor *t = tg__op_ctx_take_sink(ctx, i);
    t = t ? tg_tensor_retain(t) : tg__tensor_empty_spec(&ctx->in_spec[i], ctx->backend);
    return tg__scope_track(t);
}

tg_status tg_op_shape_same(const tg_op *op, const tg_op_attrs *attrs, tg_tensor *const *in,
                           tg_spec *out)
{
    (void)op, (void)attrs;
    tg__spec_of(in[0], out);
    return TG_OK;
}

int tg_op_ctx_save(tg_op_ctx *ctx, tg_tensor *t)
{
    if (!ctx->forward || !t || *ctx->nextra >= TG_OP_MAX_EXTRA) return -1;
    ctx->extra[*ctx->nextra] = tg_tensor_retain(t);
    return (*ctx->nextra)++;
}

tg_tensor *tg_op_ctx_saved(const tg_op_ctx *ctx, int slot)
{
    return (slot >= 0 && slot < *ctx->nextra) ? ctx->extra[slot] : NULL;
}
