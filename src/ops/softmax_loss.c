/* Softmax and losses: softmax and log_softmax along a dim (attrs.ints[0]),
 * the fused cross-entropy over i64 class targets, and the MSE loss. */

#include "ops/helpers.h"

static tg_status softmax_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                               tg_spec *out)
{
    int d;
    if (tg__need_float(op, 1, in[0])) return TG_ERR_DTYPE;
    if (tg__norm_dim(op, 2, a->ints[0], in[0]->ndim, &d)) return TG_ERR_INVALID;
    tg__spec_of(in[0], out);
    return TG_OK;
}

static tg_tensor *dim_fwd(tg_op_ctx *ctx, tg_tensor *const *in, tg_kernel_id kid)
{
    int64_t outer, n, inner;
    tg__split_dim(in[0]->ndim, in[0]->shape, tg__dim_attr(ctx->attrs, in[0]->ndim), &outer, &n, &inner);
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    TG_KERNEL(tg_dim_fn, kid, in[0])(outer, n, inner, tg__tensor_ptr(in[0]), tg__tensor_ptr(y));
    return y;
}

/* Fused backward ops: (y, gy) -> gx along the same dim. */
static tg_status dim_grad_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                                tg_spec *out)
{
    /* Called through tg_op_call too: the same checks as softmax's own
     * (found by fuzz/fuzz_ops: an i64 input reached a missing kernel). */
    int d;
    if (tg__need_float(op, 1, in[0]) || tg__need_same_dtype(op, in[0], in[1])) return TG_ERR_DTYPE;
    if (tg__norm_dim(op, 3, a->ints[0], in[0]->ndim, &d)) return TG_ERR_INVALID;
    if (!tg__same_shape(in[0]->ndim, in[0]->shape, in[1]->ndim, in[1]->shape))
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (gradient shape differs from the "
                                     "saved output's)", op->name);
    tg__spec_of(in[0], out);
    return TG_OK;
}
static tg_tensor *dim_grad_fwd(tg_op_ctx *ctx, tg_tensor *const *in, tg_kernel_id kid)
{
    int64_t outer, n, inner;
    tg__split_dim(in[0]->ndim, in[0]->shape, tg__dim_attr(ctx->attrs, in[0]->ndim), &outer, &n, &inner);
    tg_tensor *gx = tg_op_ctx_new_output(ctx);
    if (!gx) return NULL;
    TG_KERNEL(tg_dim_grad_fn, kid, in[0])(outer, n, inner, tg__tensor_ptr(in[0]),
                                          tg__tensor_ptr(in[1]), tg__tensor_ptr(gx));
    return gx;
}

static int softmax_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const int64_t s2[2] = {3, 5}, s3[3] = {2, 3, 4};
    a->nints = 1;
    switch (k) {
    case 0: a->ints[0] = -1; in[0] = tg__sample_uniform(rng, 2, s2, -2, 2); break;
    case 1: a->ints[0] = 0; in[0] = tg__sample_uniform(rng, 2, s2, -2, 2); break;
    case 2: a->ints[0] = 1; in[0] = tg__sample_uniform(rng, 3, s3, -2, 2); break;
    default: return 0;
    }
    return in[0] ? 1 : -1;
}

/* The fused backward ops are differentiable themselves, written with tg_*
 * ops (a create_graph sweep records softmax's backward as one
 * softmax_backward node, which a later sweep then differentiates). Both
 * are linear in gy; gg is the gradient flowing into gx, sums run along the
 * dim (keepdim). */
extern const tg_op tg__op_softmax_backward, tg__op_log_softmax_backward;

/* gx = y (gy - s), s = sum(gy y): d/dy = gg (gy - s) - gy sum(gg y);
 * d/dgy = y (gg - sum(gg y)), softmax_backward(y, gg) again. */
static tg_status softmax_backward_bwd(tg_op_ctx *ctx, tg_tensor *gg, tg_tensor **gin)
{
    tg_tensor *y = tg_op_ctx_input(ctx, 0), *gy = tg_op_ctx_input(ctx, 1);
    int d = tg__dim_attr(ctx->attrs, y->ndim);
    if (tg_op_ctx_needs_grad(ctx, 0)) {
        tg_tensor *s = tg_sum_dims(tg_mul(gy, y), 1, &d, true);
        tg_tensor *sg = tg_sum_dims(tg_mul(gg, y), 1, &d, true);
        if (!(gin[0] = tg_sub(tg_mul(gg, tg_sub(gy, s)), tg_mul(gy, sg)))) return tg_last_error();
    }
    if (tg_op_ctx_needs_grad(ctx, 1) &&
        !(gin[1] = tg__call2(&tg__op_softmax_backward, y, gg, ctx->attrs)))
        return tg_last_error();
    return TG_OK;
}

/* gx = gy - e^y sum(gy): d/dy = -e^y gg sum(gy); d/dgy = gg - sum(gg e^y). */
static tg_status log_softmax_backward_bwd(tg_op_ctx *ctx, tg_tensor *gg, tg_tensor **gin)
{
    tg_tensor *y = tg_op_ctx_input(ctx, 0), *gy = tg_op_ctx_input(ctx, 1);
    int d = tg__dim_attr(ctx->attrs, y->ndim);
    tg_tensor *ey = tg_exp(y);
    if (!ey) return tg_last_error();
    if (tg_op_ctx_needs_grad(ctx, 0) &&
        !(gin[0] = tg_neg(tg_mul(tg_mul(ey, gg), tg_sum_dims(gy, 1, &d, true)))))
        return tg_last_error();
    if (tg_op_ctx_needs_grad(ctx, 1) &&
        !(gin[1] = tg_sub(gg, tg_sum_dims(tg_mul(gg, ey), 1, &d, true))))
        return tg_last_error();
    return TG_OK;
}

/* Cases of the fused ops: softmax's, with y the forward's output there
 * (the only y the op is called on) and gy in [-1, 1). */
static int dim_grad_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a,
                           tg_tensor *(*fwd)(tg_tensor *, int))
{
    int n = softmax_sample(k, rng, in, a);
    if (n != 1) return n;
    tg_tensor *x = in[0];
    in[0] = fwd(x, (int)a->ints[0]); /* scope-owned: the caller's scope */
    tg_tensor_release(x);
    if (!in[0]) return -1;
    in[1] = tg__sample_uniform(rng, in[0]->ndim, in[0]->shape, -1.0, 1.0);
    return in[1] ? 2 : -1;
}

#define SOFTMAX_OP(lname, KID, GKID, math, gmath)                                   \
    static tg_tensor *lname##_backward_fwd(tg_op_ctx *ctx, tg_tensor *const *in)    \
    {                                                                               \
        return dim_grad_fwd(ctx, in, GKID);                                         \
    }                                                                               \
    static int lname##_backward_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a) \
    {                                                                               \
        return dim_grad_sample(k, rng, in, a, tg_##lname);                          \
    }                                                                               \
    const tg_op tg__op_##lname##_backward = {                                       \
        .name = #lname "_backward", .doc = gmath, .arity = 2, .shape = dim_grad_shape, \
        .forward = lname##_backward_fwd, .backward = lname##_backward_bwd,          \
        .cost = TG_COST_MEMORY_BOUND, .saves = TG_SAVE_INPUT(0) | TG_SAVE_INPUT(1), \
        .sample = lname##_backward_sample,                                          \
    };                                                                              \
    static tg_tensor *lname##_fwd(tg_op_ctx *ctx, tg_tensor *const *in)             \
    {                                                                               \
        return dim_fwd(ctx, in, KID);                                               \
    }                                                                               \
    static tg_status lname##_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)     \
    {                                                                               \
        gin[0] = tg__call2(&tg__op_##lname##_backward, tg_op_ctx_output(ctx), g, ctx->attrs); \
        return gin[0] ? TG_OK : tg_last_error();                                    \
    }                                                                               \
    const tg_op tg__op_##lname = {                                                  \
        .name = #lname, .doc = math, .arity = 1, .shape = softmax_shape,            \
        .forward = lname##_fwd, .backward = lname##_bwd, .cost = TG_COST_MEMORY_BOUND, \
        .saves = TG_SAVE_OUTPUT, .sample = softmax_sample,                          \
    };

SOFTMAX_OP(softmax, TG_K_SOFTMAX, TG_K_SOFTMAX_GRAD, "y_i = e^x_i / sum_j e^x_j",
           "gx = y * (gy - sum(gy * y))")
SOFTMAX_OP(log_softmax, TG_K_LOG_SOFTMAX, TG_K_LOG_SOFTMAX_GRAD, "y_i = x_i - log sum_j e^x_j",
           "gx = gy - e^y * sum(gy)")

tg_tensor *tg_softmax(tg_tensor *x, int dim)
{
    tg_op_attrs a = {.nints = 1, .ints = {dim}};
    return tg__call1(&tg__op_softmax, x, &a);
}

tg_tensor *tg_log_softmax(tg_tensor *x, int dim)
{
    tg_op_attrs a = {.nints = 1, .ints = {dim}};
    return tg__call1(&tg__op_log_softmax, x, &a);
}

/* ---- cross-entropy: mean over N of -log_softmax(x)[target]. The node
 * saves the logits only; the first-order backward makes the
 * log-probabilities again with the forward's kernel (the same bits) and
 * runs one kernel on them. Keeping them too cost a second (N, C) tensor
 * per loss: on the rnn workload, a loss per step over 64 steps, 0.5 MB,
 * 1.22x PyTorch's peak (PyTorch keeps log_softmax's output only). */
static tg_status ce_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in, tg_spec *out)
{
    (void)a;
    char s1[96], s2[96];
    if (tg__need_float(op, 1, in[0])) return TG_ERR_DTYPE;
    if (in[1]->dtype != TG_I64)
        return tg__err(TG_ERR_DTYPE, "bad argument #2 to '%s' (targets are %s; need i64 class "
                                     "indices)", op->name, tg_dtype_name(in[1]->dtype));
    if (in[0]->ndim != 2 || in[1]->ndim != 1 || in[1]->shape[0] != in[0]->shape[0])
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (logits %s need shape (N, C) and "
                                     "targets %s shape (N))", op->name,
                       tg_shape_str(in[0]->ndim, in[0]->shape, s1, sizeof s1),
                       tg_shape_str(in[1]->ndim, in[1]->shape, s2, sizeof s2));
    if (in[0]->shape[1] == 0)
        return tg__err(TG_ERR_SHAPE, "bad argument #1 to '%s' (zero classes)", op->name);
    out->dtype = in[0]->dtype;
    out->ndim = 0;
    return TG_OK;
}

/* Every target a class index in [0, C): NULL with the error otherwise. */
static bool targets_ok(const tg_op *op, const tg_tensor *t, int64_t N, int64_t C)
{
    const int64_t *tp = tg__tensor_ptr(t);
    for (int64_t i = 0; i < N; i++)
        if (tp[i] < 0 || tp[i] >= C) {
            tg__err(TG_ERR_INVALID, "bad argument #2 to '%s' (target %lld at index %lld outside "
                                    "[0,%lld))", op->name, (long long)tp[i], (long long)i,
                    (long long)C);
            return false;
        }
    return true;
}

static tg_tensor *ce_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *x = in[0], *t = in[1];
    int64_t N = x->shape[0], C = x->shape[1];
    const int64_t *tp = tg__tensor_ptr(t);
    if (!targets_ok(ctx->op, t, N, C)) return NULL;
    tg_tensor *loss = tg_op_ctx_new_output(ctx);
    tg_tensor *logp = loss ? tg__tensor_empty(x->dtype, 2, x->shape, x->backend) : NULL;
    if (!logp) {
        tg_tensor_release(loss);
        return NULL;
    }
    TG_KERNEL(tg_ce_fwd_fn, TG_K_CE_FWD, x)(N, C, tg__tensor_ptr(x), tp, tg__tensor_ptr(logp),
                                            tg__tensor_ptr(loss));
    tg_tensor_release(logp);
    return loss;
}

/* cross_entropy_backward(logp, targets, g): (softmax - onehot) * g / N. */
static tg_status ce_bwd_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                              tg_spec *out)
{
    (void)a;
    /* Reachable through tg_op_call (fuzz/fuzz_ops): checked as in forward. */
    if (tg__need_float(op, 1, in[0])) return TG_ERR_DTYPE;
    if (in[1]->dtype != TG_I64 || in[2]->numel != 1 || in[0]->ndim != 2 ||
        in[2]->dtype != in[0]->dtype || in[1]->ndim != 1 || in[1]->shape[0] != in[0]->shape[0])
        return tg__err(TG_ERR_SHAPE, "bad arguments to '%s' (need (N,C) log-probabilities, (N) "
                                     "i64 targets and a scalar gradient)", op->name);
    tg__spec_of(in[0], out);
    return TG_OK;
}
static tg_tensor *ce_bwd_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *lp = in[0];
    int64_t N = lp->shape[0], C = lp->shape[1];
    if (!targets_ok(ctx->op, in[1], N, C)) return NULL;
    double g;
    tg_tensor_item(in[2], &g);
    tg_tensor *gx = tg_op_ctx_new_output(ctx);
    if (!gx) return NULL;
    TG_KERNEL(tg_ce_bwd_fn, TG_K_CE_BWD, lp)(N, C, tg__tensor_ptr(lp), tg__tensor_ptr(in[1]),
                                             N ? g / (double)N : 0.0, tg__tensor_ptr(gx));
    return gx;
}
const tg_op tg__op_cross_entropy_backward = {
    .name = "cross_entropy_backward", .doc = "gx = (softmax(x) - onehot(t)) * g / N",
    .arity = 3, .shape = ce_bwd_shape, .forward = ce_bwd_fwd, .cost = TG_COST_MEMORY_BOUND,
};

/* The same gradient as recorded tg_* ops, for a create_graph sweep: the
 * saved log-probabilities are an untracked extra, so softmax(x) is
 * recomputed from the tracked logits; onehot(t) is a constant. */
static tg_status ce_bwd_ops(tg_op_ctx *ctx, tg_tensor *x, tg_tensor *g, tg_tensor **gin)
{
    const tg_tensor *t = tg_op_ctx_input(ctx, 1);
    int64_t N = x->shape[0], C = x->shape[1];
    tg_spec xs;
    tg__spec_of(x, &xs);
    tg_tensor *onehot = tg__full(&xs, x->backend, 0.0);
    if (!onehot) return tg_last_error();
    const int64_t *tp = tg__tensor_ptr(t);
    void *op = tg__tensor_ptr(onehot);
    for (int64_t i = 0; i < N; i++) {
        if (x->dtype == TG_F32)
            ((float *)op)[i * C + tp[i]] = 1.0f;
        else
            ((double *)op)[i * C + tp[i]] = 1.0;
    }
    gin[0] = tg_mul(tg_sub(tg_softmax(x, 1), onehot), tg_mul_scalar(g, N ? 1.0 / (double)N : 0.0));
    return gin[0] ? TG_OK : tg_last_error();
}

static tg_status ce_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    if (tg_op_ctx_needs_grad(ctx, 1))
        return tg__err(TG_ERR_NOT_DIFFERENTIABLE, "op 'cross_entropy' has no gradient for its "
                                                  "i64 targets");
    /* The fused kernel records nothing: only when nothing would. */
    tg_tensor *x = tg_op_ctx_input(ctx, 0), *t = tg_op_ctx_input(ctx, 1);
    if (tg__records(x) || tg__records(g)) return ce_bwd_ops(ctx, x, g, gin);
    tg_tensor *lp = tg__tensor_empty(x->dtype, 2, x->shape, x->backend);
    if (!lp) return tg_last_error();
    double loss; /* the kernel writes one element of x's dtype: room for either */
    TG_KERNEL(tg_ce_fwd_fn, TG_K_CE_FWD, x)(x->shape[0], x->shape[1], tg__tensor_ptr(x),
                                            tg__tensor_ptr(t), tg__tensor_ptr(lp), &loss);
    tg_tensor *in[3] = {lp, t, g};
    gin[0] = tg_op_call(&tg__op_cross_entropy_backward, 3, in, NULL);
    tg_tensor_release(lp);
    return gin[0] ? TG_OK : tg_last_error();
}

static int ce_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const int64_t N[3] = {4, 1, 6}, C[3] = {3, 5, 10};
    (void)a;
    if (k >= 3) return 0;
    int64_t s[2] = {N[k], C[k]};
    in[0] = tg__sample_uniform(rng, 2, s, -2.0, 2.0);
    in[1] = tg__tensor_empty(TG_I64, 1, &N[k], tg_default_backend());
    if (!in[0] || !in[1]) return -1;
    int64_t *t = tg__tensor_ptr(in[1]);
    for (int64_t i = 0; i < N[k]; i++) t[i] = (int64_t)(tg_rng_next(rng) % (uint64_t)C[k]);
    return 2;
}

const tg_op tg__op_cross_entropy = {
    .name = "cross_entropy", .doc = "L = mean_n -log softmax(x_n)[t_n]", .arity = 2,
    .shape = ce_shape, .forward = ce_fwd, .backward = ce_bwd, .cost = TG_COST_MEMORY_BOUND,
    /* x: the log-probabilities are made again from it (first order) or
     * recorded as ops on it (create_graph, ce_bwd_ops). */
    .saves = TG_SAVE_INPUT(0) | TG_SAVE_INPUT(1), .sample = ce_sample,
};

tg_tensor *tg_cross_entropy(tg_tensor *logits, tg_tensor *targets)
{
    return tg__call2(&tg__op_cross_entropy, logits, targets, NULL);
}

/* ---- mse_loss: mean((a - b)^2), equal shapes. */
static tg_status mse_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in, tg_spec *out)
{
    (void)a;
    char s1[96], s2[96];
    if (tg__need_float(op, 1, in[0]) || tg__need_float(op, 2, in[1]) ||
        tg__need_same_dtype(op, in[0], in[1]))
        return TG_ERR_DTYPE;
    if (!tg__same_shape(in[0]->ndim, in[0]->shape, in[1]->ndim, in[1]->shape))
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (prediction %s and target %s "
                                     "differ)", op->name,
                       tg_shape_str(in[0]->ndim, in[0]->shape, s1, sizeof s1),
                       tg_shape_str(in[1]->ndim, in[1]->shape, s2, sizeof s2));
    out->dtype = in[0]->dtype;
    out->ndim = 0;
    return TG_OK;
}
static tg_tensor *mse_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *a = in[0], *b = in[1];
    tg_spec ds;
    tg__spec_of(a, &ds);
    tg_tensor *d = tg__tensor_empty_spec(&ds, a->backend);
    tg_tensor *loss = d ? tg_op_ctx_new_output(ctx) : NULL;
    if (!loss) {
        tg_tensor_release(d);
        return NULL;
    }
    tg_bcast bc;
    tg__bcast_desc(&ds, a, b, &bc);
    TG_KERNEL(tg_binary_fn, TG_K_SUB, a)(&bc, tg__tensor_ptr(a), tg__tensor_ptr(b), tg__tensor_ptr(d));
    TG_KERNEL(tg_binary_fn, TG_K_MUL, a)(&bc, tg__tensor_ptr(d), tg__tensor_ptr(d), tg__tensor_ptr(d));
    tg__run_sum_all(d, tg__tensor_ptr(loss)); /* d has a's shape */
    double n = (double)a->numel;
    TG_KERNEL(tg_unary_fn, TG_K_MUL_SCALAR, a)(1, tg__tensor_ptr(loss), tg__tensor_ptr(loss),
                                               n ? 1.0 / n : 0.0);
    tg_tensor_release(d);
    return loss;
}
/* d/da = 2 (a - b) g / n, d/db = -d/da. */
static tg_status mse_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    tg_tensor *a = tg_op_ctx_input(ctx, 0), *b = tg_op_ctx_input(ctx, 1);
    double n = (double)a->numel;
    tg_tensor *ga = tg_mul(tg_mul_scalar(tg_sub(a, b), n ? 2.0 / n : 0.0), g);
    if (!ga) return tg_last_error();
    if (tg_op_ctx_needs_grad(ctx, 0)) gin[0] = ga;
    if (tg_op_ctx_needs_grad(ctx, 1)) gin[1] = tg_neg(ga);
    return (tg_op_ctx_needs_grad(ctx, 1) && !gin[1]) ? tg_last_error() : TG_OK;
}
static int mse_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const int64_t s[2][2] = {{4, 3}, {7, 1}};
    (void)a;
    if (k >= 2) return 0;
    in[0] = tg__sample_uniform(rng, 2, s[k], -1.0, 1.0);
    in[1] = tg__sample_uniform(rng, 2, s[k], -1.0, 1.0);
    return (in[0] && in[1]) ? 2 : -1;
}
const tg_op tg__op_mse_loss = {
    .name = "mse_loss", .doc = "L = mean((a - b)^2)", .arity = 2, .shape = mse_shape,
    .forward = mse_fwd, .backward = mse_bwd, .cost = TG_COST_MEMORY_BOUND,
    .saves = TG_SAVE_INPUT(0) | TG_SAVE_INPUT(1), .sample = mse_sample,
};

tg_tensor *tg_mse_loss(tg_tensor *pred, tg_tensor *target)
{
    return tg__call2(&tg__op_mse_loss, pred, target, NULL);
}
