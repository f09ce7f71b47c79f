/* Random ops: dropout. Its randomness is a seed in the attrs, drawn by the
 * wrapper from the caller's generator, so a recompute draws the same mask. */
#include "ops/helpers.h"

/* ---- dropout: y = x * mask, mask = 1/(1-p) with probability 1-p, else 0,
 * drawn from the seed in attrs (so a recompute draws the same mask). The
 * mask is kept for backward (slot 0). Identity (a view) when not training
 * or p == 0. */
static tg_status dropout_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                               tg_spec *out)
{
    if (tg__need_float(op, 1, in[0])) return TG_ERR_DTYPE;
    if (!(a->scalar >= 0.0 && a->scalar <= 1.0))
        return tg__err(TG_ERR_INVALID, "bad argument #2 to '%s' (p = %g outside [0, 1])", op->name,
                       a->scalar);
    tg__spec_of(in[0], out);
    return TG_OK;
}

static bool dropout_active(const tg_op_attrs *a)
{
    return a->flag && a->scalar > 0.0;
}

static tg_tensor *dropout_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_tensor *x = in[0];
    const tg_op_attrs *a = ctx->attrs;
    if (!dropout_active(a)) return tg__tensor_view(x, x->ndim, x->shape, x->strides, x->offset);
    double scale = a->scalar < 1.0 ? 1.0 / (1.0 - a->scalar) : 0.0;
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    tg_tensor *mask = y ? tg__tensor_empty_spec(ctx->out_spec, x->backend) : NULL;
    if (!mask) {
        tg_tensor_release(y);
        return NULL;
    }
    TG_KERNEL(tg_dropout_mask_fn, TG_K_DROPOUT_MASK, x)(x->numel, (uint64_t)a->ints[0], a->scalar,
                                                        scale, tg__tensor_ptr(mask));
    tg_bcast bc;
    tg__bcast_desc(ctx->out_spec, x, mask, &bc);
    TG_KERNEL(tg_binary_fn, TG_K_MUL, x)(&bc, tg__tensor_ptr(x), tg__tensor_ptr(mask),
                                         tg__tensor_ptr(y));
    if (ctx->needs) tg_op_ctx_save(ctx, mask);
    tg_tensor_release(mask);
    return y;
}

static tg_status dropout_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    gin[0] = dropout_active(ctx->attrs) ? tg_mul(g, tg_op_ctx_saved(ctx, 0)) : g;
    return gin[0] ? TG_OK : tg_last_error();
}

static int dropout_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const struct { int n; int64_t s[3]; double p; int train; } c[] = {
        {2, {4, 5}, 0.3, 1}, {3, {2, 3, 2}, 0.5, 1}, {2, {3, 4}, 0.5, 0}, {1, {6}, 0.0, 1},
    };
    if (k >= 4) return 0;
    a->scalar = c[k].p;
    a->flag = c[k].train;
    a->nints = 1;
    a->ints[0] = (int64_t)(tg_rng_next(rng) >> 1);
    in[0] = tg__sample_uniform(rng, c[k].n, c[k].s, -2.0, 2.0);
    return in[0] ? 1 : -1;
}

const tg_op tg__op_dropout = {
    .name = "dropout", .doc = "y = x * mask / (1 - p), mask ~ Bernoulli(1 - p) from a seed",
    .arity = 1, .shape = dropout_shape, .forward = dropout_fwd, .backward = dropout_bwd,
    .cost = TG_COST_MEMORY_BOUND, .sample = dropout_sample,
};


/* ---- public wrapper */
tg_tensor *tg_dropout(tg_tensor *x, double p, bool training, tg_rng *rng)
{
    tg_op_attrs a = {.scalar = p, .flag = training, .nints = 1};
    if (x && training && p > 0.0 && p <= 1.0) {
        if (!rng) {
            tg__err(TG_ERR_NULL, "bad argument #4 to 'dropout' (NULL generator while training)");
            return NULL;
        }
        a.ints[0] = (int64_t)(tg_rng_next(rng) >> 1);
    }
    return tg__call1(&tg__op_dropout, x, &a);
}
