/* Losses composed from registered ops, so their gradients come from ops
 * that the registry sweep checks. Each builds its expression in a private
 * scope and hands the 0-d result to the caller's. */
#include <math.h>

#include "core/internal.h"

static tg_tensor *finish(tg_tensor *y)
{
    tg_scope_keep(y);
    tg_scope_end();
    return tg__scope_track(y);
}

static tg_tensor *bad(tg_status st, const char *msg)
{
    tg_error_set(st, "%s", msg);
    return NULL;
}

/* logp[n, t_n] as (N). */
static tg_tensor *picked(tg_tensor *logp, tg_tensor *targets)
{
    int64_t n = tg_tensor_dim(targets, 0);
    tg_tensor *idx = tg_reshape(targets, 2, (int64_t[]){n, 1});
    return tg_reshape(tg_gather(logp, 1, idx), 1, &n);
}

/* Weighted mean of per-sample losses l (N) with sample weights sw (N). */
static tg_tensor *weighted_mean(tg_tensor *l, tg_tensor *sw)
{
    return sw ? tg_div(tg_sum(tg_mul(l, sw)), tg_sum(sw)) : tg_mean(l);
}

static bool check_targets(const char *op, tg_tensor *logp, tg_tensor *targets, tg_tensor *weight)
{
    if (!logp || !targets) {
        tg__err_null(op, logp ? 2 : 1);
        return false;
    }
    if (tg_tensor_ndim(logp) != 2 || tg_tensor_ndim(targets) != 1 ||
        tg_tensor_dim(targets, 0) != tg_tensor_dim(logp, 0)) {
        char a[96], b[96];
        tg_error_set(TG_ERR_SHAPE, "bad argument #2 to '%s' (input %s needs (N, C) and targets %s "
                                   "(N))", op,
                     tg_shape_str(tg_tensor_ndim(logp), tg_tensor_shape(logp), a, sizeof a),
                     tg_shape_str(tg_tensor_ndim(targets), tg_tensor_shape(targets), b, sizeof b));
        return false;
    }
    if (tg_tensor_dtype(targets) != TG_I64) {
        tg_error_set(TG_ERR_DTYPE, "bad argument #2 to '%s' (targets are %s; need i64)", op,
                     tg_dtype_name(tg_tensor_dtype(targets)));
        return false;
    }
    if (weight && (tg_tensor_ndim(weight) != 1 || tg_tensor_dim(weight, 0) != tg_tensor_dim(logp, 1))) {
        tg_error_set(TG_ERR_SHAPE, "bad argument #3 to '%s' (class weights need shape (C) = (%lld))",
                     op, (long long)tg_tensor_dim(logp, 1));
        return false;
    }
    return true;
}

tg_tensor *tg_loss_nll(tg_tensor *logp, tg_tensor *targets, tg_tensor *weight)
{
    if (!check_targets("loss_nll", logp, targets, weight)) return NULL;
    tg_scope_begin();
    tg_tensor *sw = weight ? tg_index_select(weight, 0, targets) : NULL;
    return finish(weighted_mean(tg_neg(picked(logp, targets)), sw));
}

tg_tensor *tg_loss_cross_entropy(tg_tensor *logits, tg_tensor *targets,
                                 const tg_cross_entropy_opts *opts)
{
    double eps = opts ? opts->label_smoothing : 0.0;
    tg_tensor *weight = opts ? opts->weight : NULL;
    if (!(eps >= 0.0 && eps <= 1.0))
        return bad(TG_ERR_INVALID, "bad argument #3 to 'loss_cross_entropy' (label smoothing "
                                   "outside [0, 1])");
    if (!check_targets("loss_cross_entropy", logits, targets, weight)) return NULL;
    if (eps == 0.0 && !weight) return tg_cross_entropy(logits, targets); /* fused */
    tg_scope_begin();
    int64_t C = tg_tensor_dim(logits, 1);
    tg_tensor *logp = tg_log_softmax(logits, 1);
    tg_tensor *sw = weight ? tg_index_select(weight, 0, targets) : NULL;
    tg_tensor *nll = weighted_mean(tg_neg(picked(logp, targets)), sw);
    if (eps == 0.0) return finish(nll);
    /* smooth_n = -sum_c w_c logp[n, c] / C, normalised like the nll term. */
    int dims[1] = {1};
    tg_tensor *wl = weight ? tg_mul(logp, weight) : logp;
    tg_tensor *smooth = tg_mul_scalar(tg_sum_dims(wl, 1, dims, false), -1.0 / (double)C);
    tg_tensor *sm = sw ? tg_div(tg_sum(smooth), tg_sum(sw)) : tg_mean(smooth);
    return finish(tg_add(tg_mul_scalar(nll, 1.0 - eps), tg_mul_scalar(sm, eps)));
}

tg_tensor *tg_loss_mse(tg_tensor *pred, tg_tensor *target)
{
    return tg_mse_loss(pred, target);
}

tg_tensor *tg_loss_bce_with_logits(tg_tensor *x, tg_tensor *y, tg_tensor *pos_weight)
{
    if (!x || !y) {
        tg__err_null("loss_bce_with_logits", x ? 2 : 1);
        return NULL;
    }
    if (!tg__same_shape(x->ndim, x->shape, y->ndim, y->shape))
        return bad(TG_ERR_SHAPE, "bad argument #2 to 'loss_bce_with_logits' (targets must have "
                                 "the shape of the logits)");
    tg_scope_begin();
    /* log(1 + e^-|x|) + max(-x, 0) = log(1 + e^-x), without overflow. */
    tg_tensor *sp = tg_add(tg_log(tg_add_scalar(tg_exp(tg_neg(tg_abs(x))), 1.0)),
                           tg_relu(tg_neg(x)));
    tg_tensor *lw = pos_weight ? tg_add_scalar(tg_mul(tg_add_scalar(pos_weight, -1.0), y), 1.0) : NULL;
    tg_tensor *l = tg_add(tg_mul(tg_add_scalar(tg_neg(y), 1.0), x), lw ? tg_mul(lw, sp) : sp);
    return finish(tg_mean(l));
}

tg_tensor *tg_loss_huber(tg_tensor *pred, tg_tensor *target, double delta)
{
    if (!(delta > 0.0) || !isfinite(delta))
        return bad(TG_ERR_INVALID, "bad argument #3 to 'loss_huber' (delta must be positive)");
    if (!pred || !target) {
        tg__err_null("loss_huber", pred ? 2 : 1);
        return NULL;
    }
    tg_scope_begin();
    tg_tensor *d = tg_sub(pred, target);
    tg_tensor *a = tg_abs(d);
    tg_tensor *quad = tg_mul_scalar(tg_mul(d, d), 0.5);
    tg_tensor *lin = tg_mul_scalar(tg_add_scalar(a, -0.5 * delta), delta);
    tg_tensor *small = a ? tg_gt(tg_full(a->dtype, 0, NULL, delta), a) : NULL;
    if (small && small->backend != a->backend) small = tg_to_device(small, a->backend);
    return finish(tg_mean(tg_where(small, quad, lin)));
}
