/* Normalisation: layer norm and batch norm, each with a fused forward that
 * keeps its statistics and a fused backward.
 *
 * layer_norm(x, w, b): attrs.ints[0] = k, the number of trailing dims
 * normalised (x seen as (M, D), D their product); attrs.scalar = eps.
 * batch_norm(x, w, b): training statistics only; x seen as (N, C, S), S the
 * product of the dims after 1; attrs.scalar = eps.
 * Both save x and w, plus stats (2, R) in x's dtype as extra slot 0: row 0
 * the means, row 1 the rstd = 1 / sqrt(var + eps) (R = M rows or C
 * channels). Backward: gx by one fused op (<name>_backward(x, w, stats,
 * gy)), gw by another (<name>_backward_weight(x, stats, gy) = sum of
 * gy xhat); both are unmarked. gb is tg_sum_dims (layer norm) or bias_grad
 * (batch norm; defined in conv.c). The fused ops record nothing and read
 * the statistics, an untracked extra, so a create_graph sweep (anything
 * records) takes norm_bwd_ops instead: the same gradients from tg_* ops,
 * the statistics recomputed from the tracked x, so the norms have
 * derivatives of any order. The public wrappers pass ones / zeros for a
 * NULL weight / bias, so the ops always have three inputs.
 *
 * Running statistics are not op inputs (they are not differentiated, and
 * x, w, b and two running tensors would exceed TG_OP_MAX_INPUTS). While
 * tg_batch_norm calls the op, a per-thread sink receives the batch mean
 * and biased variance from the forward, and tg_batch_norm then updates the
 * running tensors. The sink is set only inside that call, so the op stays a
 * pure function of its inputs: gradcheck, a direct tg_op_call or a
 * recompute of the node in backward never touch running statistics.
 * Evaluation mode is no op of its own: y = x scale + shift with per-channel
 * scale = w / sqrt(running_var + eps), shift = b - running_mean scale,
 * built from recorded tg_* ops, so x, w and b get gradients there too. */
#include <string.h>

#include "ops/helpers.h"

static double value_at(const tg_tensor *t, int64_t i)
{
    const void *p = tg__tensor_ptr(t);
    return t->dtype == TG_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

static tg_status need_dtype_of(const tg_op *op, int argi, const tg_tensor *t, const tg_tensor *x)
{
    if (t->dtype == x->dtype) return TG_OK;
    return tg__err(TG_ERR_DTYPE, "bad argument #%d to '%s' (%s, but argument #1 is %s; convert "
                                 "with tg_cast)", argi, op->name, tg_dtype_name(t->dtype),
                   tg_dtype_name(x->dtype));
}

static tg_status need_eps(const tg_op *op, double eps)
{
    if (eps >= 0) return TG_OK;
    return tg__err(TG_ERR_INVALID, "bad argument to '%s' (eps %g; need eps >= 0)", op->name, eps);
}

/* Checks stats (2, R) of x's dtype. */
static tg_status need_stats(const tg_op *op, int argi, const tg_tensor *s, const tg_tensor *x,
                            int64_t R)
{
    if (need_dtype_of(op, argi, s, x)) return TG_ERR_DTYPE;
    if (s->numel != 2 * R)
        return tg__err(TG_ERR_SHAPE, "bad argument #%d to '%s' (statistics hold %lld values; need "
                                     "2 x %lld)", argi, op->name, (long long)s->numel,
                       (long long)R);
    return TG_OK;
}

static tg_status need_same_shape(const tg_op *op, int argi, const tg_tensor *t, const tg_tensor *x)
{
    char s1[96], s2[96];
    if (tg__same_shape(t->ndim, t->shape, x->ndim, x->shape)) return TG_OK;
    return tg__err(TG_ERR_SHAPE, "bad argument #%d to '%s' (gradient %s; input is %s)", argi,
                   op->name, tg_shape_str(t->ndim, t->shape, s1, sizeof s1),
                   tg_shape_str(x->ndim, x->shape, s2, sizeof s2));
}

/* ======== layer_norm */

/* (M, D) split of x with k trailing dims normalised. */
static void ln_split(const tg_spec *x, int64_t k, int64_t *M, int64_t *D)
{
    *M = tg__numel(x->ndim - (int)k, x->shape);
    *D = tg__numel((int)k, x->shape + x->ndim - k);
}

static tg_status ln_need_k(const tg_op *op, const tg_op_attrs *a, const tg_tensor *x)
{
    char s[96];
    if (a->ints[0] >= 1 && a->ints[0] <= x->ndim) return TG_OK;
    return tg__err(TG_ERR_INVALID, "bad argument #2 to '%s' (normalise the last %lld dims of "
                                   "input %s; need 1..%d)", op->name, (long long)a->ints[0],
                   tg_shape_str(x->ndim, x->shape, s, sizeof s), x->ndim);
}

static tg_status ln_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                          tg_spec *out)
{
    const tg_tensor *x = in[0];
    char s1[96], s2[96];
    if (tg__need_float(op, 1, x) || need_dtype_of(op, 3, in[1], x) || need_dtype_of(op, 4, in[2], x))
        return TG_ERR_DTYPE;
    if (ln_need_k(op, a, x) || need_eps(op, a->scalar)) return TG_ERR_INVALID;
    int k = (int)a->ints[0];
    const int64_t *tail = x->shape + x->ndim - k;
    for (int i = 1; i <= 2; i++)
        if (!tg__same_shape(in[i]->ndim, in[i]->shape, k, tail))
            return tg__err(TG_ERR_SHAPE, "bad argument #%d to '%s' (%s %s; need %s, the last %d "
                                         "dims of the input)", i + 2, op->name,
                           i == 1 ? "weight" : "bias",
                           tg_shape_str(in[i]->ndim, in[i]->shape, s1, sizeof s1),
                           tg_shape_str(k, tail, s2, sizeof s2), k);
    if (tg__numel(k, tail) == 0)
        return tg__err(TG_ERR_SHAPE, "bad argument #1 to '%s' (normalised dims of %s are empty)",
                       op->name, tg_shape_str(x->ndim, x->shape, s1, sizeof s1));
    tg__spec_of(x, out);
    return TG_OK;
}

static tg_tensor *ln_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *x = in[0];
    int64_t M, D;
    ln_split(&ctx->in_spec[0], ctx->attrs->ints[0], &M, &D);
    int64_t ss[2] = {2, M};
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    tg_tensor *st = y ? tg__tensor_empty(x->dtype, 2, ss, x->backend) : NULL;
    if (!st) {
        tg_tensor_release(y);
        return NULL;
    }
    char *sp = tg__tensor_ptr(st);
    TG_KERNEL(tg_layer_norm_fn, TG_K_LAYER_NORM, x)(M, D, ctx->attrs->scalar, tg__tensor_ptr(x),
                                                    tg__tensor_ptr(in[1]), tg__tensor_ptr(in[2]),
                                                    tg__tensor_ptr(y), sp,
                                                    sp + (size_t)M * tg_dtype_size(x->dtype));
    if (ctx->needs) tg_op_ctx_save(ctx, st);
    tg_tensor_release(st);
    return y;
}

/* layer_norm_backward(x, w, stats, gy) -> gx */
static tg_status ln_bwd_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                              tg_spec *out)
{
    const tg_tensor *x = in[0];
    if (tg__need_float(op, 1, x) || need_dtype_of(op, 2, in[1], x) || need_dtype_of(op, 4, in[3], x))
        return TG_ERR_DTYPE;
    if (ln_need_k(op, a, x)) return TG_ERR_INVALID;
    tg_spec xs;
    int64_t M, D;
    tg__spec_of(x, &xs);
    ln_split(&xs, a->ints[0], &M, &D);
    if (in[1]->numel != D)
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (weight of %lld values; need %lld)",
                       op->name, (long long)in[1]->numel, (long long)D);
    if (need_stats(op, 3, in[2], x, M) || need_same_shape(op, 4, in[3], x)) return tg_last_error();
    *out = xs;
    return TG_OK;
}

static tg_tensor *ln_bwd_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    int64_t M, D;
    ln_split(&ctx->in_spec[0], ctx->attrs->ints[0], &M, &D);
    tg_tensor *gx = tg_op_ctx_new_output(ctx);
    if (!gx) return NULL;
    char *sp = tg__tensor_ptr(in[2]);
    TG_KERNEL(tg_layer_norm_grad_fn, TG_K_LAYER_NORM_GRAD, in[0])(
        M, D, tg__tensor_ptr(in[0]), tg__tensor_ptr(in[1]), sp,
        sp + (size_t)M * tg_dtype_size(in[0]->dtype), tg__tensor_ptr(in[3]), tg__tensor_ptr(gx));
    return gx;
}

const tg_op tg__op_layer_norm_backward = {
    .name = "layer_norm_backward", .doc = "gx = rstd (gy w - mean(gy w) - xhat mean(gy w xhat))",
    .arity = 4, .shape = ln_bwd_shape, .forward = ln_bwd_fwd, .cost = TG_COST_MEMORY_BOUND,
};

/* layer_norm_backward_weight(x, stats, gy) -> gw (the last k dims of x) */
static tg_status ln_bwdw_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                               tg_spec *out)
{
    const tg_tensor *x = in[0];
    if (tg__need_float(op, 1, x) || need_dtype_of(op, 3, in[2], x)) return TG_ERR_DTYPE;
    if (ln_need_k(op, a, x)) return TG_ERR_INVALID;
    tg_spec xs;
    int64_t M, D;
    tg__spec_of(x, &xs);
    ln_split(&xs, a->ints[0], &M, &D);
    if (need_stats(op, 2, in[1], x, M) || need_same_shape(op, 3, in[2], x)) return tg_last_error();
    int k = (int)a->ints[0];
    out->dtype = x->dtype;
    out->ndim = k;
    memcpy(out->shape, x->shape + x->ndim - k, (size_t)k * sizeof *out->shape);
    return TG_OK;
}

static tg_tensor *ln_bwdw_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    int64_t M, D;
    ln_split(&ctx->in_spec[0], ctx->attrs->ints[0], &M, &D);
    tg_tensor *gw = tg_op_ctx_new_output(ctx);
    if (!gw) return NULL;
    char *sp = tg__tensor_ptr(in[1]);
    TG_KERNEL(tg_layer_norm_grad_w_fn, TG_K_LAYER_NORM_GRAD_W, in[0])(
        M, D, tg__tensor_ptr(in[0]), sp, sp + (size_t)M * tg_dtype_size(in[0]->dtype),
        tg__tensor_ptr(in[2]), tg__tensor_ptr(gw));
    return gw;
}

const tg_op tg__op_layer_norm_backward_weight = {
    .name = "layer_norm_backward_weight", .doc = "gw = sum over rows of gy xhat", .arity = 3,
    .shape = ln_bwdw_shape, .forward = ln_bwdw_fwd, .cost = TG_COST_MEMORY_BOUND,
};

/* gx and gw of a norm as recorded tg_* ops, for a create_graph sweep. The
 * saved statistics are an untracked extra: they are recomputed from the
 * tracked x over its nd dims (keepdim), so the record carries their
 * dependence on x. wb is w broadcastable against x; gw sums g xhat over
 * the nw dims wdims. */
static tg_status norm_bwd_ops(tg_op_ctx *ctx, tg_tensor *x, tg_tensor *wb, tg_tensor *g,
                              int nd, const int *dims, int nw, const int *wdims,
                              tg_tensor **gin)
{
    if (!tg_op_ctx_needs_grad(ctx, 0) && !tg_op_ctx_needs_grad(ctx, 1)) return TG_OK;
    tg_tensor *xc = tg_sub(x, tg_mean_dims(x, nd, dims, true));
    tg_tensor *var = tg_mean_dims(tg_mul(xc, xc), nd, dims, true);
    tg_tensor *rstd = tg_pow_scalar(tg_add_scalar(var, ctx->attrs->scalar), -0.5);
    tg_tensor *xhat = tg_mul(xc, rstd);
    if (!xhat) return tg_last_error();
    if (tg_op_ctx_needs_grad(ctx, 0)) {
        /* gx = rstd (gh - mean(gh) - xhat mean(gh xhat)), gh = g w. */
        tg_tensor *gh = tg_mul(g, wb);
        tg_tensor *c = tg_sub(gh, tg_mean_dims(gh, nd, dims, true));
        c = tg_sub(c, tg_mul(xhat, tg_mean_dims(tg_mul(gh, xhat), nd, dims, true)));
        if (!(gin[0] = tg_mul(rstd, c))) return tg_last_error();
    }
    if (tg_op_ctx_needs_grad(ctx, 1)) {
        tg_tensor *gw = tg_mul(g, xhat);
        if (!(gin[1] = nw ? tg_sum_dims(gw, nw, wdims, false) : gw)) return tg_last_error();
    }
    return TG_OK;
}

static tg_status ln_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    tg_tensor *x = tg_op_ctx_input(ctx, 0), *w = tg_op_ctx_input(ctx, 1);
    tg_tensor *st = tg_op_ctx_saved(ctx, 0);
    const tg_op_attrs *a = ctx->attrs;
    int k = (int)a->ints[0], lead = g->ndim - k, dims[TG_MAX_DIMS];
    for (int i = 0; i < lead; i++) dims[i] = i;
    /* The fused ops record nothing and read the untracked statistics: only
     * when nothing records. */
    if (tg__records(x) || tg__records(w) || tg__records(g)) {
        int ndims[TG_MAX_DIMS];
        for (int i = 0; i < k; i++) ndims[i] = lead + i;
        tg_status s = norm_bwd_ops(ctx, x, w, g, k, ndims, lead, dims, gin);
        if (s) return s;
    } else {
        if (tg_op_ctx_needs_grad(ctx, 0)) {
            tg_tensor *in[4] = {x, w, st, g};
            if (!(gin[0] = tg_op_call(&tg__op_layer_norm_backward, 4, in, a)))
                return tg_last_error();
        }
        if (tg_op_ctx_needs_grad(ctx, 1)) {
            tg_tensor *in[3] = {x, st, g};
            if (!(gin[1] = tg__call_into(&tg__op_layer_norm_backward_weight, 3, in, a,
                                         tg__op_ctx_take_sink(ctx, 1))))
                return tg_last_error();
        }
    }
    if (tg_op_ctx_needs_grad(ctx, 2)) {
        gin[2] = lead ? tg_sum_dims(g, lead, dims, false) : g;
        if (!gin[2]) return tg_last_error();
    }
    return TG_OK;
}

/* Cases: rows of a matrix; the last two dims of a 3-d tensor; a vector. */
static int ln_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const struct {
        int nd;
        int64_t x[3];
        int k;
    } c[] = {{2, {3, 4}, 1}, {3, {2, 3, 4}, 2}, {1, {5}, 1}};
    if (k >= 3) return 0;
    a->nints = 1;
    a->ints[0] = c[k].k;
    a->scalar = 1e-5;
    const int64_t *tail = c[k].x + c[k].nd - c[k].k;
    in[0] = tg__sample_uniform(rng, c[k].nd, c[k].x, -2.0, 2.0);
    in[1] = tg__sample_uniform(rng, c[k].k, tail, 0.5, 1.5);
    in[2] = tg__sample_uniform(rng, c[k].k, tail, -1.0, 1.0);
    return (in[0] && in[1] && in[2]) ? 3 : -1;
}

const tg_op tg__op_layer_norm = {
    .name = "layer_norm", .doc = "y = (x - mean) / sqrt(var + eps) w + b over the last k dims",
    .arity = 3, .shape = ln_shape, .forward = ln_fwd, .backward = ln_bwd,
    .cost = TG_COST_MEMORY_BOUND, .saves = TG_SAVE_INPUT(0) | TG_SAVE_INPUT(1),
    .sample = ln_sample,
};

tg_tensor *tg_layer_norm(tg_tensor *x, int ndims, tg_tensor *weight, tg_tensor *bias, double eps)
{
    if (!x) {
        tg__err_null("layer_norm", 1);
        return NULL;
    }
    tg_op_attrs a = {.nints = 1, .ints = {ndims}, .scalar = eps};
    if (ln_need_k(&tg__op_layer_norm, &a, x)) return NULL;
    const int64_t *tail = x->shape + x->ndim - ndims;
    tg_tensor *ones = weight ? NULL : tg__filled(x->dtype, ndims, tail, x->backend, 1.0);
    tg_tensor *zeros = bias ? NULL : tg__filled(x->dtype, ndims, tail, x->backend, 0.0);
    tg_tensor *y = NULL;
    if ((weight || ones) && (bias || zeros)) {
        tg_tensor *in[3] = {x, weight ? weight : ones, bias ? bias : zeros};
        y = tg_op_call(&tg__op_layer_norm, 3, in, &a);
    }
    tg_tensor_release(ones);
    tg_tensor_release(zeros);
    return y;
}

/* ======== batch_norm (training statistics) */

static void bn_split(const tg_spec *x, int64_t *N, int64_t *C, int64_t *S)
{
    *N = x->shape[0];
    *C = x->shape[1];
    *S = tg__numel(x->ndim - 2, x->shape + 2);
}

static tg_status bn_need_x(const tg_op *op, const tg_tensor *x)
{
    char s[96];
    if (x->ndim >= 2) return TG_OK;
    return tg__err(TG_ERR_SHAPE, "bad argument #1 to '%s' (input %s; need (N, C) or (N, C, ...))",
                   op->name, tg_shape_str(x->ndim, x->shape, s, sizeof s));
}

static tg_status bn_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                          tg_spec *out)
{
    const tg_tensor *x = in[0];
    char s1[96], s2[96];
    if (tg__need_float(op, 1, x) || need_dtype_of(op, 2, in[1], x) || need_dtype_of(op, 3, in[2], x))
        return TG_ERR_DTYPE;
    if (bn_need_x(op, x)) return TG_ERR_SHAPE;
    if (need_eps(op, a->scalar)) return TG_ERR_INVALID;
    for (int i = 1; i <= 2; i++)
        if (in[i]->ndim != 1 || in[i]->shape[0] != x->shape[1])
            return tg__err(TG_ERR_SHAPE, "bad argument #%d to '%s' (%s %s; input %s has %lld "
                                         "channels)", i + 1, op->name, i == 1 ? "weight" : "bias",
                           tg_shape_str(in[i]->ndim, in[i]->shape, s1, sizeof s1),
                           tg_shape_str(x->ndim, x->shape, s2, sizeof s2),
                           (long long)x->shape[1]);
    if (x->numel <= x->shape[1])
        return tg__err(TG_ERR_SHAPE, "bad argument #1 to '%s' (input %s: training needs more than "
                                     "one value per channel)", op->name,
                       tg_shape_str(x->ndim, x->shape, s1, sizeof s1));
    tg__spec_of(x, out);
    return TG_OK;
}

/* In conv.c: the sum over every dim but 1, the bias gradient. */
extern const tg_op tg__op_bias_grad;

/* The side channel of tg_batch_norm (see the top of the file). */
typedef struct bn_sink {
    double *var;     /* C biased batch variances, written by the forward */
    tg_tensor *stats; /* retained by the forward: row 0 the batch means */
} bn_sink;
static TG_THREAD_LOCAL bn_sink *bn_sink_cur;

static tg_tensor *bn_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *x = in[0];
    int64_t N, C, S;
    bn_split(&ctx->in_spec[0], &N, &C, &S);
    int64_t ss[2] = {2, C};
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    tg_tensor *st = y ? tg__tensor_empty(x->dtype, 2, ss, x->backend) : NULL;
    if (!st) {
        tg_tensor_release(y);
        return NULL;
    }
    bn_sink *sink = bn_sink_cur;
    char *sp = tg__tensor_ptr(st);
    TG_KERNEL(tg_batch_norm_fn, TG_K_BATCH_NORM, x)(N, C, S, ctx->attrs->scalar,
                                                    tg__tensor_ptr(x), tg__tensor_ptr(in[1]),
                                                    tg__tensor_ptr(in[2]), tg__tensor_ptr(y), sp,
                                                    sp + (size_t)C * tg_dtype_size(x->dtype),
                                                    sink ? sink->var : NULL);
    if (sink) sink->stats = tg_tensor_retain(st);
    if (ctx->needs) tg_op_ctx_save(ctx, st);
    tg_tensor_release(st);
    return y;
}

/* batch_norm_backward(x, w, stats, gy) -> gx */
static tg_status bn_bwd_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                              tg_spec *out)
{
    const tg_tensor *x = in[0];
    (void)a;
    if (tg__need_float(op, 1, x) || need_dtype_of(op, 2, in[1], x) || need_dtype_of(op, 4, in[3], x))
        return TG_ERR_DTYPE;
    if (bn_need_x(op, x)) return TG_ERR_SHAPE;
    if (in[1]->numel != x->shape[1])
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (weight of %lld values; need %lld)",
                       op->name, (long long)in[1]->numel, (long long)x->shape[1]);
    if (need_stats(op, 3, in[2], x, x->shape[1]) || need_same_shape(op, 4, in[3], x))
        return tg_last_error();
    tg__spec_of(x, out);
    return TG_OK;
}

static tg_tensor *bn_bwd_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    int64_t N, C, S;
    bn_split(&ctx->in_spec[0], &N, &C, &S);
    tg_tensor *gx = tg_op_ctx_new_output(ctx);
    if (!gx) return NULL;
    char *sp = tg__tensor_ptr(in[2]);
    TG_KERNEL(tg_batch_norm_grad_fn, TG_K_BATCH_NORM_GRAD, in[0])(
        N, C, S, tg__tensor_ptr(in[0]), tg__tensor_ptr(in[1]), sp,
        sp + (size_t)C * tg_dtype_size(in[0]->dtype), tg__tensor_ptr(in[3]), tg__tensor_ptr(gx));
    return gx;
}

const tg_op tg__op_batch_norm_backward = {
    .name = "batch_norm_backward", .doc = "gx = w rstd (gy - mean(gy) - xhat mean(gy xhat))",
    .arity = 4, .shape = bn_bwd_shape, .forward = bn_bwd_fwd, .cost = TG_COST_MEMORY_BOUND,
};

/* batch_norm_backward_weight(x, stats, gy) -> gw (C) */
static tg_status bn_bwdw_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                               tg_spec *out)
{
    const tg_tensor *x = in[0];
    (void)a;
    if (tg__need_float(op, 1, x) || need_dtype_of(op, 3, in[2], x)) return TG_ERR_DTYPE;
    if (bn_need_x(op, x)) return TG_ERR_SHAPE;
    if (need_stats(op, 2, in[1], x, x->shape[1]) || need_same_shape(op, 3, in[2], x))
        return tg_last_error();
    out->dtype = x->dtype;
    out->ndim = 1;
    out->shape[0] = x->shape[1];
    return TG_OK;
}

static tg_tensor *bn_bwdw_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    int64_t N, C, S;
    bn_split(&ctx->in_spec[0], &N, &C, &S);
    tg_tensor *gw = tg_op_ctx_new_output(ctx);
    if (!gw) return NULL;
    char *sp = tg__tensor_ptr(in[1]);
    TG_KERNEL(tg_batch_norm_grad_w_fn, TG_K_BATCH_NORM_GRAD_W, in[0])(
        N, C, S, tg__tensor_ptr(in[0]), sp, sp + (size_t)C * tg_dtype_size(in[0]->dtype),
        tg__tensor_ptr(in[2]), tg__tensor_ptr(gw));
    return gw;
}

const tg_op tg__op_batch_norm_backward_weight = {
    .name = "batch_norm_backward_weight", .doc = "gw = sum over (N, S) of gy xhat", .arity = 3,
    .shape = bn_bwdw_shape, .forward = bn_bwdw_fwd, .cost = TG_COST_MEMORY_BOUND,
};

static tg_status bn_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    tg_tensor *x = tg_op_ctx_input(ctx, 0), *w = tg_op_ctx_input(ctx, 1);
    tg_tensor *st = tg_op_ctx_saved(ctx, 0);
    /* As in ln_bwd: the fused ops (bias_grad too) only when nothing
     * records; else every dim but the channels' is reduced by tg_* ops. */
    if (tg__records(x) || tg__records(w) || tg__records(g)) {
        int nd = x->ndim - 1, dims[TG_MAX_DIMS];
        int64_t ws[TG_MAX_DIMS];
        for (int i = 0; i < x->ndim; i++) ws[i] = i == 1 ? x->shape[1] : 1;
        for (int i = 0; i < nd; i++) dims[i] = i ? i + 1 : 0;
        tg_status s = norm_bwd_ops(ctx, x, tg_reshape(w, x->ndim, ws), g, nd, dims, nd, dims,
                                   gin);
        if (s) return s;
        if (tg_op_ctx_needs_grad(ctx, 2) && !(gin[2] = tg_sum_dims(g, nd, dims, false)))
            return tg_last_error();
        return TG_OK;
    }
    if (tg_op_ctx_needs_grad(ctx, 0)) {
        tg_tensor *in[4] = {x, w, st, g};
        if (!(gin[0] = tg_op_call(&tg__op_batch_norm_backward, 4, in, ctx->attrs)))
            return tg_last_error();
    }
    if (tg_op_ctx_needs_grad(ctx, 1)) {
        tg_tensor *in[3] = {x, st, g};
        if (!(gin[1] = tg__call_into(&tg__op_batch_norm_backward_weight, 3, in, ctx->attrs,
                                     tg__op_ctx_take_sink(ctx, 1))))
            return tg_last_error();
    }
    if (tg_op_ctx_needs_grad(ctx, 2) &&
        !(gin[2] = tg__call_into(&tg__op_bias_grad, 1, &g, NULL, tg__op_ctx_take_sink(ctx, 2))))
        return tg_last_error();
    return TG_OK;
}

/* Cases: (N, C); NCHW; (N, C, L). */
static int bn_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const struct {
        int nd;
        int64_t x[4];
    } c[] = {{2, {4, 3}}, {4, {2, 3, 2, 2}}, {3, {3, 2, 5}}};
    if (k >= 3) return 0;
    a->scalar = 1e-5;
    in[0] = tg__sample_uniform(rng, c[k].nd, c[k].x, -2.0, 2.0);
    in[1] = tg__sample_uniform(rng, 1, &c[k].x[1], 0.5, 1.5);
    in[2] = tg__sample_uniform(rng, 1, &c[k].x[1], -1.0, 1.0);
    return (in[0] && in[1] && in[2]) ? 3 : -1;
}

const tg_op tg__op_batch_norm = {
    .name = "batch_norm", .doc = "y = (x - mean_c) / sqrt(var_c + eps) w_c + b_c (batch stats)",
    .arity = 3, .shape = bn_shape, .forward = bn_fwd, .backward = bn_bwd,
    .cost = TG_COST_MEMORY_BOUND, .saves = TG_SAVE_INPUT(0) | TG_SAVE_INPUT(1),
    .sample = bn_sample,
};

/* A weight or bias: (C) of x's dtype (checked here too for evaluation,
 * where no batch_norm op runs). */
static tg_status check_affine(const tg_tensor *t, int argi, const tg_tensor *x)
{
    char s1[96], s2[96];
    if (need_dtype_of(&tg__op_batch_norm, argi, t, x)) return TG_ERR_DTYPE;
    if (t->ndim == 1 && t->shape[0] == x->shape[1]) return TG_OK;
    return tg__err(TG_ERR_SHAPE, "bad argument #%d to 'batch_norm' (%s %s; input %s has %lld "
                                 "channels)", argi, argi == 2 ? "weight" : "bias",
                   tg_shape_str(t->ndim, t->shape, s1, sizeof s1),
                   tg_shape_str(x->ndim, x->shape, s2, sizeof s2), (long long)x->shape[1]);
}

/* A running tensor: (C), x's dtype and backend, contiguous, untracked. */
static tg_status check_running(tg_tensor *r, int argi, const tg_tensor *x)
{
    char s[96];
    if (tg_tensor_requires_grad(r))
        return tg__err(TG_ERR_INVALID, "bad argument #%d to 'batch_norm' (running statistics are "
                                       "updated in place and must not require grad)", argi);
    if (r->dtype != x->dtype)
        return tg__err(TG_ERR_DTYPE, "bad argument #%d to 'batch_norm' (%s running statistics for "
                                     "a %s input)", argi, tg_dtype_name(r->dtype),
                       tg_dtype_name(x->dtype));
    if (r->backend != x->backend)
        return tg__err(TG_ERR_DEVICE, "bad argument #%d to 'batch_norm' (running statistics on "
                                      "'%s', input on '%s')", argi, tg_backend_name(r->backend),
                       tg_backend_name(x->backend));
    if (r->ndim != 1 || r->shape[0] != x->shape[1])
        return tg__err(TG_ERR_SHAPE, "bad argument #%d to 'batch_norm' (running statistics %s; "
                                     "input has %lld channels)", argi,
                       tg_shape_str(r->ndim, r->shape, s, sizeof s), (long long)x->shape[1]);
    if (!r->contiguous)
        return tg__err(TG_ERR_INVALID, "bad argument #%d to 'batch_norm' (running statistics must "
                                       "be contiguous)", argi);
    return TG_OK;
}

/* r = (1 - m) r + m scale v, in r's dtype. */
static void running_update(tg_tensor *r, const double *v, double m, double scale)
{
    void *p = tg__tensor_ptr(r);
    for (int64_t c = 0; c < r->numel; c++) {
        if (r->dtype == TG_F32)
            ((float *)p)[c] = (float)((1 - m) * ((float *)p)[c] + m * scale * v[c]);
        else
            ((double *)p)[c] = (1 - m) * ((double *)p)[c] + m * scale * v[c];
    }
}

static tg_tensor *bn_train(tg_tensor *x, tg_tensor *w, tg_tensor *b, tg_tensor *rm,
                           tg_tensor *rv, double momentum, double eps)
{
    int64_t C = x->shape[1], sc[2] = {2, C};
    tg_tensor *ones = w ? NULL : tg__filled(x->dtype, 1, &C, x->backend, 1.0);
    tg_tensor *zeros = b ? NULL : tg__filled(x->dtype, 1, &C, x->backend, 0.0);
    /* Row 0: biased batch variances (from the forward); row 1: means. */
    tg_tensor *buf = tg__tensor_empty(TG_F64, 2, sc, x->backend);
    tg_tensor *y = NULL;
    bn_sink sink = {.var = buf ? tg__tensor_ptr(buf) : NULL, .stats = NULL};
    if ((w || ones) && (b || zeros) && buf) {
        tg_tensor *in[3] = {x, w ? w : ones, b ? b : zeros};
        tg_op_attrs a = {.scalar = eps};
        bn_sink_cur = &sink;
        y = tg_op_call(&tg__op_batch_norm, 3, in, &a);
        bn_sink_cur = NULL;
    }
    if (y && sink.stats) {
        double cnt = (double)(x->numel / C), *mean = sink.var + C;
        for (int64_t c = 0; c < C; c++) mean[c] = value_at(sink.stats, c);
        if (rm) running_update(rm, mean, momentum, 1.0);
        if (rv) running_update(rv, sink.var, momentum, cnt / (cnt - 1.0));
    }
    tg_tensor_release(sink.stats);
    tg_tensor_release(buf);
    tg_tensor_release(ones);
    tg_tensor_release(zeros);
    return y;
}

/* Evaluation: y = x scale + shift per channel, from recorded tg_* ops in a
 * private scope (the result is handed to the caller's scope, if any). */
static tg_tensor *bn_eval(tg_tensor *x, tg_tensor *w, tg_tensor *b, tg_tensor *rm,
                          tg_tensor *rv, double eps)
{
    int64_t shape[TG_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = i == 1 ? x->shape[1] : 1;
    tg_scope_begin();
    tg_tensor *scale = tg_pow_scalar(tg_add_scalar(rv, eps), -0.5);
    if (w) scale = tg_mul(w, scale);
    tg_tensor *shift = tg_mul(rm, scale);
    shift = b ? tg_sub(b, shift) : tg_neg(shift);
    tg_tensor *y = tg_add(tg_mul(x, tg_reshape(scale, x->ndim, shape)),
                          tg_reshape(shift, x->ndim, shape));
    tg_scope_keep(y);
    tg_scope_end();
    return tg__scope_track(y);
}

tg_tensor *tg_batch_norm(tg_tensor *x, tg_tensor *weight, tg_tensor *bias, tg_tensor *running_mean,
                         tg_tensor *running_var, bool training, double momentum, double eps)
{
    const tg_op *op = &tg__op_batch_norm;
    if (!x) {
        tg__err_null(op->name, 1);
        return NULL;
    }
    if (tg__need_float(op, 1, x) || bn_need_x(op, x)) return NULL;
    if (!training && (!running_mean || !running_var)) {
        /* Keep a pending error: the NULL may come from a failed expression. */
        if (tg_last_error() == TG_OK)
            tg__err(TG_ERR_NULL, "bad argument #%d to 'batch_norm' (evaluation needs running_mean "
                                 "and running_var)", running_mean ? 5 : 4);
        return NULL;
    }
    if ((weight && check_affine(weight, 2, x)) || (bias && check_affine(bias, 3, x)) ||
        (running_mean && check_running(running_mean, 4, x)) ||
        (running_var && check_running(running_var, 5, x)) || need_eps(op, eps))
        return NULL;
    if (!(momentum >= 0.0 && momentum <= 1.0)) {
        tg__err(TG_ERR_INVALID, "bad argument #7 to 'batch_norm' (momentum %g; need 0..1)",
                momentum);
        return NULL;
    }
    if (training) return bn_train(x, weight, bias, running_mean, running_var, momentum, eps);
    return bn_eval(x, weight, bias, running_mean, running_var, eps);
}
