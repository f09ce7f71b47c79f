/* custom_op.c - register a user op, use it in a graph, gradcheck it.
 *
 * softsign(x) = x / (1 + |x|), softsign'(x) = 1 / (1 + |x|)^2.
 * The forward is a raw kernel on tg_tensor_data; the backward is written
 * with tg_* ops (so it goes through dispatch like any other op); .sample
 * gives tg_gradcheck_op its cases. A second entry, "softsign_unmarked",
 * has no backward: on a tracked input it fails with
 * TG_ERR_NOT_DIFFERENTIABLE, and the tape stays usable.
 *
 * Usage: example_custom_op. Exits 0 when every check passes. */
#include <math.h>
#include <stdio.h>

#include <tapegrad.h>

/* Shape rule: one floating input, output of the same dtype and shape. */
static tg_status softsign_shape(const tg_op *op, const tg_op_attrs *attrs, tg_tensor *const *in,
                                tg_spec *out)
{
    (void)attrs;
    tg_dtype dt = tg_tensor_dtype(in[0]);
    if (dt != TG_F32 && dt != TG_F64)
        return tg_error_set(TG_ERR_DTYPE, "bad argument #1 to '%s' (%s tensor; need f32 or f64)",
                            op->name, tg_dtype_name(dt));
    out->dtype = dt;
    out->ndim = tg_tensor_ndim(in[0]);
    for (int i = 0; i < out->ndim; i++) out->shape[i] = tg_tensor_dim(in[0], i);
    return TG_OK;
}

/* Forward: y = x / (1 + |x|) on raw buffers. Dispatch hands the forward
 * contiguous inputs (no TG_OP_STRIDED_INPUTS), so tg_tensor_data works. */
static tg_tensor *softsign_forward(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_tensor *y = tg_op_ctx_new_output(ctx); /* same spec as x */
    if (!y) return NULL;
    int64_t n = tg_tensor_numel(in[0]);
    if (tg_tensor_dtype(in[0]) == TG_F64) {
        const double *x = tg_tensor_data(in[0]);
        double *o = tg_tensor_data(y);
        for (int64_t i = 0; i < n; i++) o[i] = x[i] / (1.0 + fabs(x[i]));
    } else {
        const float *x = tg_tensor_data(in[0]);
        float *o = tg_tensor_data(y);
        for (int64_t i = 0; i < n; i++) o[i] = x[i] / (1.0f + fabsf(x[i]));
    }
    return y;
}

/* Backward: gx = gy / (1 + |x|)^2, with |x| = relu(x) + relu(-x). x is the
 * saved input (TG_SAVE_INPUT(0)). gin[0] is borrowed: the engine takes its
 * own reference, so nothing here is retained or released. */
static tg_status softsign_backward(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin)
{
    if (!tg_op_ctx_needs_grad(ctx, 0)) return TG_OK;
    tg_tensor *x = tg_op_ctx_input(ctx, 0);
    tg_tensor *absx = tg_add(tg_relu(x), tg_relu(tg_neg(x)));
    gin[0] = tg_mul(gout, tg_pow_scalar(tg_add_scalar(absx, 1.0), -2.0));
    return gin[0] ? TG_OK : tg_last_error(); /* errors are sticky: one check */
}

/* Gradcheck cases: f64 inputs on the default backend, several shapes.
 * The inputs are new references that tg_gradcheck_op releases, so keep
 * them out of any open scope. */
static int softsign_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *attrs)
{
    static const int64_t shapes[3][2] = {{7, 1}, {3, 4}, {1, 5}};
    (void)attrs;
    if (k >= 3) return 0;
    in[0] = tg_scope_keep(tg_rand_uniform(rng, TG_F64, 2, shapes[k], -3.0, 3.0));
    return in[0] ? 1 : -1;
}

static const tg_op softsign_def = {
    .name = "softsign",
    .doc = "y = x / (1 + |x|)",
    .arity = 1,
    .shape = softsign_shape,
    .forward = softsign_forward,
    .backward = softsign_backward,
    .cost = TG_COST_MEMORY_BOUND,
    .saves = TG_SAVE_INPUT(0),
    .sample = softsign_sample,
};

/* The same op with neither a backward nor the non-differentiable mark. */
static const tg_op unmarked_def = {
    .name = "softsign_unmarked",
    .doc = "y = x / (1 + |x|), no backward",
    .arity = 1,
    .shape = softsign_shape,
    .forward = softsign_forward,
    .cost = TG_COST_MEMORY_BOUND,
};

static const tg_op *softsign_op;

static tg_tensor *softsign(tg_tensor *x)
{
    return tg_op_call(softsign_op, 1, &x, NULL);
}

/* Composite for tg_gradcheck: f(x, w) = softsign(x w) * rowsum(x). The
 * function returns a new reference; its own scope releases the
 * intermediates (tg_gradcheck does not open one around the analytic pass). */
static tg_tensor *composite(void *userdata, int n, tg_tensor *const *in)
{
    (void)userdata;
    (void)n;
    int64_t col[2] = {tg_tensor_dim(in[0], 0), 1};
    tg_scope_begin();
    tg_tensor *rows = tg_sum_to(in[0], 2, col); /* row sums, (N, 1) */
    tg_tensor *y = tg_scope_keep(tg_mul(softsign(tg_matmul(in[0], in[1])), rows));
    tg_scope_end();
    return y;
}

static int fail(const char *what)
{
    fprintf(stderr, "custom_op: %s: %s (%s)\n", what, tg_strerror(tg_last_error()),
            tg_last_error_message());
    return 1;
}

int main(void)
{
    if (tg_op_register(&softsign_def) != TG_OK) return fail("tg_op_register(softsign)");
    if (tg_op_register(&unmarked_def) != TG_OK) return fail("tg_op_register(softsign_unmarked)");
    softsign_op = tg_op_find("softsign");
    const tg_op *unmarked = tg_op_find("softsign_unmarked");
    if (!softsign_op || !unmarked) return fail("tg_op_find");
    printf("registered '%s' (%s, backward: %s, %s); registry has %d ops\n", softsign_op->name,
           softsign_op->doc, tg_ad_mark_name(tg_op_mark(softsign_op)),
           tg_cost_name(softsign_op->cost), tg_op_count());

    /* 1. A small graph: loss = sum(softsign(x) * 2), d/dx = 2 / (1 + |x|)^2. */
    int status = 0;
    tg_tape *tape = tg_tape_new(NULL);
    const double xs[4] = {-2.0, -0.5, 0.25, 3.0};
    int64_t shape[1] = {4};
    tg_tensor *x = tg_tensor_from_data(TG_F64, 1, shape, xs);
    if (!tape || !x || tg_requires_grad(tape, x) != TG_OK) return fail("setup");
    tg_scope_begin();
    tg_tensor *loss = tg_sum(tg_mul_scalar(softsign(x), 2.0));
    if (!loss || tg_backward(loss) != TG_OK) return fail("forward/backward");
    const double *g = tg_tensor_data(tg_grad(x));
    for (int i = 0; i < 4; i++) {
        double want = 2.0 / ((1.0 + fabs(xs[i])) * (1.0 + fabs(xs[i])));
        printf("  x = %5.2f  softsign'(x) * 2 = %.6f  (expected %.6f)\n", xs[i], g[i], want);
        if (fabs(g[i] - want) > 1e-12) status = 1;
    }
    tg_scope_end();
    tg_tape_reset(tape);
    tg_grad_zero(x);

    /* 2. The unmarked op on a tracked input fails at dispatch... */
    tg_tensor *bad = tg_op_call(unmarked, 1, &x, NULL);
    if (bad || tg_last_error() != TG_ERR_NOT_DIFFERENTIABLE) {
        fprintf(stderr, "custom_op: expected TG_ERR_NOT_DIFFERENTIABLE\n");
        status = 1;
    }
    printf("unmarked op on a tracked input: %s: %s\n", tg_strerror(tg_last_error()),
           tg_last_error_message());
    tg_error_clear();
    /* ...runs on a detached copy, and the same tape is still usable. */
    tg_scope_begin();
    tg_tensor *xd = tg_detach(x);
    tg_tensor *ok = tg_op_call(unmarked, 1, &xd, NULL);
    tg_tensor *again = tg_sum(softsign(x));
    if (!ok || tg_tensor_requires_grad(ok) || !again || tg_backward(again) != TG_OK) {
        status = fail("unmarked op on a detached input / tape reuse");
    } else {
        printf("same op on tg_detach(x) runs (untracked); tape reused: %lld nodes\n",
               (long long)tg_tape_node_count(tape));
    }
    tg_scope_end();
    tg_tensor_release(x);
    tg_tape_free(tape);

    /* 3. Gradcheck the registered op over its .sample cases, on both backends. */
    for (int b = 0; b < TG_BACKEND_COUNT; b++) {
        tg_op_check rep;
        tg_status st = tg_gradcheck_op(softsign_op, (tg_backend)b, NULL, &rep);
        printf("tg_gradcheck_op(softsign, %s): %s, %d cases, %d failed, max abs err %.2e, "
               "max rel err %.2e\n", tg_backend_name((tg_backend)b), tg_strerror(st), rep.cases,
               rep.failed, rep.max_abs_err, rep.max_rel_err);
        if (st != TG_OK) status = fail("tg_gradcheck_op");
    }

    /* 4. Gradcheck a composite that uses it, with tg_gradcheck. */
    tg_rng rng;
    tg_rng_seed(&rng, 42);
    int64_t sa[2] = {3, 4}, sb[2] = {4, 2};
    tg_tensor *in[2] = {tg_rand_normal(&rng, TG_F64, 2, sa, 0.0, 1.0),
                        tg_rand_normal(&rng, TG_F64, 2, sb, 0.0, 1.0)};
    tg_gradcheck_result res[2];
    tg_status st = tg_gradcheck(composite, NULL, 2, in, NULL, res);
    for (int i = 0; i < 2; i++)
        printf("tg_gradcheck(composite) input %d: %s, max abs err %.2e, max rel err %.2e\n", i,
               res[i].passed ? "passed" : "FAILED", res[i].max_abs_err, res[i].max_rel_err);
    if (st != TG_OK) status = fail("tg_gradcheck");
    tg_tensor_release(in[0]);
    tg_tensor_release(in[1]);

    printf("%s\n", status ? "FAILED" : "OK");
    return status;
}
