/* test_sinks.c - gradient sinks: a backward writes a parameter's gradient
 * straight into its set's flat gradient buffer (docs/api.md, "Gradient
 * sinks"). The gradients are bitwise those of plain leaves under every
 * policy; a failing backward leaves no gradient and zeros in the buffer;
 * accumulation, zeroing, hooks and a parameter outliving its set keep their
 * meaning; and the step allocates nothing for the parameters' gradients. */
#include <criterion/criterion.h>
#include <tapegrad.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* ---- the model: a conv layer, two affine layers sharing W2 and b2 (so
 * their gradients arrive twice), a pointwise chain over 5 blocks of f64
 * (a region's target) and a product of a leaf with itself. */
enum { P_W1, P_B1, P_W2, P_B2, P_K, P_CB, P_P, P_Q, NPARAM };

static const char *const names[NPARAM] = {"W1", "b1", "W2", "b2", "K", "cb", "p", "q"};
static const int nd[NPARAM] = {2, 1, 2, 1, 4, 1, 1, 1};
static const int64_t shapes[NPARAM][4] = {
    {16, 8}, {16}, {16, 16}, {16}, {4, 1, 3, 3}, {4}, {5 * 8192}, {3},
};

static int64_t numel_of(int k)
{
    int64_t n = 1;
    for (int i = 0; i < nd[k]; i++) n *= shapes[k][i];
    return n;
}

/* Deterministic values in [-1, 1). */
static void fill(double *v, int64_t n, uint64_t seed)
{
    uint64_t s = seed * 2654435761u + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (double)(s >> 11) / 4503599627370496.0 - 1.0;
    }
}

static tg_tensor *model(tg_tensor *const *P)
{
    double xv[4 * 8], iv[2 * 36];
    fill(xv, 32, 101);
    fill(iv, 72, 102);
    tg_tensor *x = tg_tensor_from_data(TG_F64, 2, SHAPE(4, 8), xv);
    tg_tensor *img = tg_tensor_from_data(TG_F64, 4, SHAPE(2, 1, 6, 6), iv);
    tg_tensor *s1 = tg_sum(tg_relu(tg_conv2d(img, P[P_K], P[P_CB], NULL)));
    tg_tensor *h = tg_tanh(tg_affine(x, P[P_W1], P[P_B1]));
    tg_tensor *h2 = tg_tanh(tg_affine(h, P[P_W2], P[P_B2]));
    tg_tensor *s2 = tg_sum(tg_affine(h2, P[P_W2], P[P_B2]));
    tg_tensor *p = P[P_P];
    tg_tensor *s3 = tg_sum(tg_mul(tg_tanh(tg_add_scalar(tg_mul(p, p), 1.0)), tg_sigmoid(p)));
    tg_tensor *s4 = tg_sum(tg_mul(P[P_Q], P[P_Q]));
    return tg_add(tg_add(s1, s2), tg_add(s3, s4));
}

typedef struct grads {
    double *g[NPARAM];
    bool in_place[NPARAM]; /* tg_grad's data is the flat buffer's */
} grads;

static void grads_free(grads *r)
{
    for (int k = 0; k < NPARAM; k++) free(r->g[k]);
}

static double *copy_grad(const tg_tensor *t)
{
    int64_t n = tg_tensor_numel(t);
    double *v = malloc((size_t)n * sizeof *v);
    cr_assert_not_null(v);
    cr_assert_eq(tg_tensor_copy_out(t, v, (size_t)n * sizeof *v), TG_OK);
    return v;
}

/* A parameter set holding the model's parameters (values from fill). */
static tg_params *make_set(tg_tensor **P)
{
    tg_params *ps = tg_params_new();
    cr_assert_not_null(ps);
    for (int k = 0; k < NPARAM; k++) {
        P[k] = tg_params_add(ps, names[k], TG_F64, nd[k], shapes[k]);
        cr_assert_not_null(P[k], "%s", tg_last_error_message());
        fill(tg_tensor_data(P[k]), numel_of(k), (uint64_t)k);
    }
    return ps;
}

/* One backward of the model, on the parameters of a set (use_set) or on
 * plain leaves with the same values. */
static grads run(bool use_set, const tg_tape_opts *opts)
{
    grads r = {0};
    tg_tensor *P[NPARAM];
    tg_params *ps = NULL;
    tg_tape *tape = tg_tape_new(opts);
    cr_assert_not_null(tape);
    tg_scope_begin();
    if (use_set) {
        ps = make_set(P);
        cr_assert_eq(tg_params_requires_grad(ps, tape), TG_OK);
    } else {
        for (int k = 0; k < NPARAM; k++) {
            double *v = malloc((size_t)numel_of(k) * sizeof *v);
            fill(v, numel_of(k), (uint64_t)k);
            P[k] = tg_scope_keep(tg_tensor_from_data(TG_F64, nd[k], shapes[k], v));
            free(v);
            cr_assert_eq(tg_requires_grad(tape, P[k]), TG_OK);
        }
    }
    tg_tensor *flat = use_set ? tg_params_flat_grad(ps, TG_F64) : NULL;
    cr_assert_eq(tg_backward(model(P)), TG_OK, "%s", tg_last_error_message());
    int64_t at = 0;
    for (int k = 0; k < NPARAM; k++) {
        tg_tensor *g = tg_grad(P[k]);
        cr_assert_not_null(g, "no gradient on %s", names[k]);
        r.g[k] = copy_grad(g);
        r.in_place[k] = flat && tg_tensor_data_ro(g) == (const double *)tg_tensor_data_ro(flat) + at;
        at += numel_of(k);
    }
    tg_scope_end(); /* releases flat, scope-owned */
    tg_tape_free(tape);
    if (ps) {
        tg_params_free(ps);
    } else {
        for (int k = 0; k < NPARAM; k++) {
            tg_grad_zero(P[k]);
            tg_tensor_release(P[k]);
        }
    }
    return r;
}

Test(sinks, parameter_gradients_land_in_the_flat_buffer_with_plain_leaves_bits)
{
    size_t mem0 = tg_mem_current_bytes();
    const tg_tape_opts opts[] = {
        {.policy = TG_CHECKPOINT_NONE},
        {.policy = TG_CHECKPOINT_BALANCED},
        {.policy = TG_CHECKPOINT_NONE, .plain_backward = true},
        {.policy = TG_CHECKPOINT_BALANCED, .plain_backward = true},
    };
    for (size_t o = 0; o < sizeof opts / sizeof opts[0]; o++) {
        grads plain = run(false, &opts[o]), set = run(true, &opts[o]);
        for (int k = 0; k < NPARAM; k++)
            cr_expect_eq(memcmp(plain.g[k], set.g[k], (size_t)numel_of(k) * sizeof(double)), 0,
                         "opts %zu: %s's gradient differs from a plain leaf's", o, names[k]);
        /* Written in place: the affine layers' (W2 and b2 twice, the second
         * added into the first), the convolution's and the pointwise
         * region's (p's, blocked backward only: the whole-tensor backward
         * of mul and sigmoid makes new tensors); q's comes from mul's
         * backward as a new tensor and is copied in by the next sync. */
        const bool want[NPARAM] = {true, true, true, true, true, true, !opts[o].plain_backward,
                                   false};
        for (int k = 0; k < NPARAM; k++)
            cr_expect_eq(set.in_place[k], want[k], "opts %zu: %s %s in place", o, names[k],
                         set.in_place[k] ? "written" : "not written");
        for (int k = 0; k < NPARAM; k++) cr_expect(!plain.in_place[k]);
        grads_free(&plain);
        grads_free(&set);
    }
    cr_expect_eq(tg_mem_current_bytes(), mem0, "storage leaked");
}

/* ---- a user op whose backward fails on demand, recorded before the
 * affine layer so that the sweep reaches it after W's and b's gradients
 * were written into their sinks. */
static bool refuse;

static tg_tensor *twice_forward(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    const double *x = tg_tensor_data_ro(in[0]);
    double *o = tg_tensor_data(y);
    for (int64_t i = 0; i < tg_tensor_numel(in[0]); i++) o[i] = 2.0 * x[i];
    return y;
}

static tg_status twice_backward(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin)
{
    (void)ctx;
    if (refuse) return tg_error_set(TG_ERR_INVALID, "sink_twice: backward refused");
    gin[0] = tg_mul_scalar(gout, 2.0);
    return gin[0] ? TG_OK : tg_last_error();
}

static const tg_op *twice_op(void)
{
    const tg_op *op = tg_op_find("sink_twice");
    if (op) return op;
    static const tg_op def = {
        .name = "sink_twice", .doc = "y = 2 x", .arity = 1, .shape = tg_op_shape_same,
        .forward = twice_forward, .backward = twice_backward, .cost = TG_COST_MEMORY_BOUND,
    };
    cr_assert_eq(tg_op_register(&def), TG_OK, "%s", tg_last_error_message());
    return tg_op_find("sink_twice");
}

/* loss = sum(twice(q)) + sum(affine(x, W, b)) on a set of W (3x2), b (3),
 * q (2); returns the backward's status. */
static tg_status fail_step(tg_tensor *W, tg_tensor *b, tg_tensor *q)
{
    tg_scope_begin();
    tg_tensor *in[1] = {q};
    tg_tensor *t = tg_op_call(twice_op(), 1, in, NULL);
    tg_tensor *x = T64((2, 2), 1, 2, 3, 4);
    tg_tensor *loss = tg_add(tg_sum(t), tg_sum(tg_affine(x, W, b)));
    cr_assert_not_null(loss, "%s", tg_last_error_message());
    tg_status st = tg_backward(loss);
    tg_scope_end();
    return st;
}

Test(sinks, a_failing_backward_leaves_no_gradient_and_zeros_in_the_buffer)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_params *ps = tg_params_new();
    tg_tensor *W = tg_params_add(ps, "W", TG_F64, 2, SHAPE(3, 2));
    tg_tensor *b = tg_params_add(ps, "b", TG_F64, 1, SHAPE(3));
    tg_tensor *q = tg_params_add(ps, "q", TG_F64, 1, SHAPE(2));
    for (int k = 0; k < 3; k++) {
        tg_tensor *t = k == 0 ? W : k == 1 ? b : q;
        fill(tg_tensor_data(t), tg_tensor_numel(t), (uint64_t)k + 7);
    }
    tg_tape *tape = tg_tape_new(NULL);
    cr_assert_eq(tg_params_requires_grad(ps, tape), TG_OK);
    tg_tensor *flat = tg_params_flat_grad(ps, TG_F64);
    const double *fg = tg_tensor_data_ro(flat);

    refuse = true;
    tg_status st = fail_step(W, b, q);
    refuse = false;
    cr_expect_eq(st, TG_ERR_INVALID, "got %s", tg_strerror(st));
    cr_expect(strstr(tg_last_error_message(), "sink_twice: backward refused") != NULL, "%s",
              tg_last_error_message());
    cr_expect_null(tg_grad(W));
    cr_expect_null(tg_grad(b));
    cr_expect_null(tg_grad(q));
    for (int i = 0; i < 11; i++) cr_expect_eq(fg[i], 0.0, "flat gradient [%d] = %g", i, fg[i]);

    /* The tape and the set work on: the same step now succeeds, W's
     * gradient in place: dW[o][i] = sum over the 2 rows of x[:, i]. */
    tg_tape_reset(tape);
    cr_assert_eq(fail_step(W, b, q), TG_OK, "%s", tg_last_error_message());
    cr_expect_eq(tg_tensor_data_ro(tg_grad(W)), (const void *)fg);
    for (int o = 0; o < 3; o++) {
        cr_expect_eq(fg[2 * o], 4.0);
        cr_expect_eq(fg[2 * o + 1], 6.0);
        cr_expect_eq(fg[6 + o], 2.0);
    }
    cr_expect_eq(fg[9], 0.0, "q's gradient is not in the buffer before a sync");
    tg_tensor_release(flat);
    flat = tg_params_flat_grad(ps, TG_F64); /* syncs q's */
    fg = tg_tensor_data_ro(flat);
    cr_expect_eq(fg[9], 2.0);
    cr_expect_eq(fg[10], 2.0);
    tg_tensor_release(flat);
    tg_tape_free(tape);
    tg_params_free(ps);
    cr_expect_eq(tg_mem_current_bytes(), mem0, "storage leaked");
    tg_error_clear();
}

static tg_status double_it(tg_tensor *grad, tg_tensor **replace, void *ud)
{
    (void)ud;
    *replace = tg_mul_scalar(grad, 2.0);
    return *replace ? TG_OK : tg_last_error();
}

Test(sinks, accumulation_zeroing_and_hooks_keep_their_meaning)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_params *ps = tg_params_new();
    tg_tensor *W = tg_params_add(ps, "W", TG_F64, 2, SHAPE(3, 2));
    tg_tensor *b = tg_params_add(ps, "b", TG_F64, 1, SHAPE(3));
    tg_tensor *q = tg_params_add(ps, "q", TG_F64, 1, SHAPE(2));
    tg_tape *tape = tg_tape_new(NULL);
    cr_assert_eq(tg_params_requires_grad(ps, tape), TG_OK);
    tg_tensor *flat = tg_params_flat_grad(ps, TG_F64);
    const double *fg = tg_tensor_data_ro(flat);
    /* Two backwards without zeroing: the second adds to the first. */
    for (int round = 1; round <= 2; round++) {
        cr_assert_eq(fail_step(W, b, q), TG_OK, "%s", tg_last_error_message());
        tg_tape_reset(tape);
    }
    tg_tensor_release(flat);
    flat = tg_params_flat_grad(ps, TG_F64);
    fg = tg_tensor_data_ro(flat);
    for (int o = 0; o < 3; o++) {
        cr_expect_eq(fg[2 * o], 8.0);
        cr_expect_eq(fg[2 * o + 1], 12.0);
        cr_expect_eq(fg[6 + o], 4.0);
    }
    cr_expect_eq(fg[9], 4.0);
    /* Zeroed: no gradient; the buffer reads zeros once synced (a held view
     * shows the buffer as of the last sync); the next backward writes in
     * place again. */
    tg_params_zero_grad(ps);
    cr_expect_null(tg_grad(W));
    cr_expect_eq(tg_params_sync_grad(ps), TG_OK);
    cr_expect_eq(fg[0], 0.0);
    cr_assert_eq(fail_step(W, b, q), TG_OK, "%s", tg_last_error_message());
    tg_tape_reset(tape);
    cr_expect_eq(tg_tensor_data_ro(tg_grad(W)), (const void *)fg);
    cr_expect_eq(fg[0], 4.0);
    /* A leaf hook that replaces the gradient: the replacement is the
     * gradient, and the sync puts it in the buffer. */
    tg_params_zero_grad(ps);
    cr_assert_eq(tg_tensor_hook_add(W, double_it, NULL), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(fail_step(W, b, q), TG_OK, "%s", tg_last_error_message());
    tg_tape_reset(tape);
    cr_expect_eq(tg_params_sync_grad(ps), TG_OK);
    cr_expect_eq(fg[0], 8.0);
    cr_expect_eq(fg[1], 12.0);
    cr_expect_eq(fg[6], 2.0, "b has no hook");
    tg_tensor_release(flat);
    tg_tape_free(tape);
    tg_params_free(ps);
    cr_expect_eq(tg_mem_current_bytes(), mem0, "storage leaked");
}

Test(sinks, a_parameter_outliving_its_set_gets_a_gradient_of_its_own)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_params *ps = tg_params_new();
    tg_tensor *W = tg_tensor_retain(tg_params_add(ps, "W", TG_F64, 2, SHAPE(3, 2)));
    tg_tensor *b = tg_tensor_retain(tg_params_add(ps, "b", TG_F64, 1, SHAPE(3)));
    tg_tensor *q = tg_tensor_retain(tg_params_add(ps, "q", TG_F64, 1, SHAPE(2)));
    tg_params_free(ps);
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *P[3] = {W, b, q};
    for (int k = 0; k < 3; k++) cr_assert_eq(tg_requires_grad(tape, P[k]), TG_OK);
    cr_assert_eq(fail_step(W, b, q), TG_OK, "%s", tg_last_error_message());
    double g[6];
    cr_assert_eq(tg_tensor_copy_out(tg_grad(W), g, sizeof g), TG_OK);
    for (int o = 0; o < 3; o++) {
        cr_expect_eq(g[2 * o], 4.0);
        cr_expect_eq(g[2 * o + 1], 6.0);
    }
    tg_tape_free(tape);
    for (int k = 0; k < 3; k++) {
        tg_grad_zero(P[k]);
        tg_tensor_release(P[k]);
    }
    cr_expect_eq(tg_mem_current_bytes(), mem0, "storage leaked");
}

/* The tensor peak of one step of a 256x256 affine layer above what was live
 * before it, with the weight in a set or a plain leaf: the set's step
 * allocates nothing for the weight's gradient (512 KiB). */
static size_t step_peak(bool use_set)
{
    tg_params *ps = NULL;
    tg_tensor *W, *b;
    tg_tape *tape = tg_tape_new(NULL);
    if (use_set) {
        ps = tg_params_new();
        W = tg_params_add(ps, "W", TG_F64, 2, SHAPE(256, 256));
        b = tg_params_add(ps, "b", TG_F64, 1, SHAPE(256));
        cr_assert_eq(tg_params_requires_grad(ps, tape), TG_OK);
    } else {
        W = tg_zeros(TG_F64, 2, SHAPE(256, 256));
        b = tg_zeros(TG_F64, 1, SHAPE(256));
        cr_assert_eq(tg_requires_grad(tape, W), TG_OK);
        cr_assert_eq(tg_requires_grad(tape, b), TG_OK);
        tg_scope_keep(W);
        tg_scope_keep(b);
    }
    fill(tg_tensor_data(W), 256 * 256, 3);
    tg_tensor *x = tg_scope_keep(tg_ones(TG_F64, 2, SHAPE(4, 256)));
    size_t before = tg_mem_current_bytes();
    tg_mem_reset_peak();
    tg_scope_begin();
    cr_assert_eq(tg_backward(tg_sum(tg_tanh(tg_affine(x, W, b)))), TG_OK, "%s",
                 tg_last_error_message());
    tg_scope_end();
    size_t peak = tg_mem_peak_bytes() - before;
    tg_tape_free(tape);
    tg_tensor_release(x);
    if (ps) {
        tg_params_free(ps);
    } else {
        tg_grad_zero(W);
        tg_grad_zero(b);
        tg_tensor_release(W);
        tg_tensor_release(b);
    }
    return peak;
}

Test(sinks, a_step_allocates_nothing_for_the_parameters_gradients)
{
    size_t mem0 = tg_mem_current_bytes();
    size_t plain = step_peak(false), set = step_peak(true);
    size_t wbytes = 256 * 256 * sizeof(double);
    cr_expect_geq(plain, wbytes, "plain leaves: peak %zu below the weight's gradient", plain);
    cr_expect_lt(set, wbytes / 8, "set: the step's peak is %zu bytes (plain leaves %zu)", set,
                 plain);
    cr_expect_eq(tg_mem_current_bytes(), mem0, "storage leaked");
}

/* ---- a user op whose backward makes its gradient with tg_op_ctx_new_grad:
 * y = 3 x. Its forward and backward also try the misuses. */
static tg_status new_grad_misuse;

static tg_tensor *thrice_forward(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_error_clear();
    if (tg_op_ctx_new_grad(ctx, 0) != NULL || tg_last_error() != TG_ERR_INVALID)
        new_grad_misuse = TG_ERR_INTERNAL;
    tg_error_clear();
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    const double *x = tg_tensor_data_ro(in[0]);
    double *o = tg_tensor_data(y);
    for (int64_t i = 0; i < tg_tensor_numel(in[0]); i++) o[i] = 3.0 * x[i];
    return y;
}

static tg_status thrice_backward(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin)
{
    if (tg_op_ctx_new_grad(ctx, 1) != NULL || tg_last_error() != TG_ERR_INVALID ||
        tg_op_ctx_new_grad(NULL, 0) != NULL || tg_last_error() != TG_ERR_NULL)
        new_grad_misuse = TG_ERR_INTERNAL;
    tg_error_clear();
    tg_tensor *g = tg_op_ctx_new_grad(ctx, 0);
    if (!g) return tg_last_error();
    double gv[8];
    cr_assert_leq(tg_tensor_numel(gout), 8);
    cr_assert_eq(tg_tensor_copy_out(gout, gv, sizeof gv), TG_OK);
    double *o = tg_tensor_data(g);
    for (int64_t i = 0; i < tg_tensor_numel(g); i++) o[i] = 3.0 * gv[i];
    gin[0] = g;
    return TG_OK;
}

static const tg_op *thrice_op(void)
{
    const tg_op *op = tg_op_find("sink_thrice");
    if (op) return op;
    static const tg_op def = {
        .name = "sink_thrice", .doc = "y = 3 x", .arity = 1, .shape = tg_op_shape_same,
        .forward = thrice_forward, .backward = thrice_backward, .cost = TG_COST_MEMORY_BOUND,
    };
    cr_assert_eq(tg_op_register(&def), TG_OK, "%s", tg_last_error_message());
    return tg_op_find("sink_thrice");
}

Test(sinks, a_user_op_writes_its_gradient_through_new_grad)
{
    size_t mem0 = tg_mem_current_bytes();
    new_grad_misuse = TG_OK;
    for (int use_set = 0; use_set < 2; use_set++) {
        tg_params *ps = NULL;
        tg_tensor *q;
        tg_tape *tape = tg_tape_new(NULL);
        if (use_set) {
            ps = tg_params_new();
            q = tg_params_add(ps, "q", TG_F64, 1, SHAPE(4));
            cr_assert_eq(tg_params_requires_grad(ps, tape), TG_OK);
        } else {
            q = tg_zeros(TG_F64, 1, SHAPE(4));
            cr_assert_eq(tg_requires_grad(tape, q), TG_OK);
        }
        double *qv = tg_tensor_data(q);
        for (int i = 0; i < 4; i++) qv[i] = i + 1;
        tg_tensor *flat = use_set ? tg_params_flat_grad(ps, TG_F64) : NULL;
        tg_scope_begin();
        tg_tensor *in[1] = {q};
        tg_tensor *y = tg_op_call(thrice_op(), 1, in, NULL);
        cr_assert_eq(tg_backward(tg_sum(tg_mul(y, y))), TG_OK, "%s", tg_last_error_message());
        tg_scope_end();
        /* d/dq sum((3q)^2) = 18 q */
        double g[4];
        cr_assert_eq(tg_tensor_copy_out(tg_grad(q), g, sizeof g), TG_OK);
        for (int i = 0; i < 4; i++) cr_expect_eq(g[i], 18.0 * (i + 1));
        if (use_set)
            cr_expect_eq(tg_tensor_data_ro(tg_grad(q)), tg_tensor_data_ro(flat),
                         "the op's gradient went into the sink");
        tg_tensor_release(flat);
        tg_tape_free(tape);
        if (ps) {
            tg_params_free(ps);
        } else {
            tg_grad_zero(q);
            tg_tensor_release(q);
        }
    }
    cr_expect_eq(new_grad_misuse, TG_OK, "a misuse of tg_op_ctx_new_grad was not refused");
    cr_expect_eq(tg_mem_current_bytes(), mem0, "storage leaked");
}

/* ---- embedding, layer norm and batch norm parameters: the same bits as
 * plain leaves, each gradient written into its sink. */
enum { N_E, N_LW, N_LB, N_BW, N_BB, NNORM };
static const int64_t norm_numel[NNORM] = {40, 4, 4, 4, 4};

static void norm_grads(bool use_set, double **out, bool *in_place)
{
    tg_tensor *P[NNORM];
    tg_params *ps = NULL;
    tg_tape *tape = tg_tape_new(NULL);
    const int64_t shp[NNORM][2] = {{10, 4}, {4}, {4}, {4}, {4}};
    const int ndim[NNORM] = {2, 1, 1, 1, 1};
    const char *nm[NNORM] = {"E", "lw", "lb", "bw", "bb"};
    if (use_set) ps = tg_params_new();
    for (int k = 0; k < NNORM; k++) {
        P[k] = use_set ? tg_params_add(ps, nm[k], TG_F64, ndim[k], shp[k])
                       : tg_zeros(TG_F64, ndim[k], shp[k]);
        cr_assert_not_null(P[k], "%s", tg_last_error_message());
        fill(tg_tensor_data(P[k]), norm_numel[k], (uint64_t)k + 30);
        if (!use_set) cr_assert_eq(tg_requires_grad(tape, P[k]), TG_OK);
    }
    if (use_set) cr_assert_eq(tg_params_requires_grad(ps, tape), TG_OK);
    tg_tensor *flat = use_set ? tg_params_flat_grad(ps, TG_F64) : NULL;
    tg_scope_begin();
    tg_tensor *ids = tg_tensor_from_data(TG_I64, 1, SHAPE(6), (const int64_t[]){3, 1, 3, 9, 0, 5});
    tg_tensor *h = tg_embedding(P[N_E], ids);
    h = tg_layer_norm(h, 1, P[N_LW], P[N_LB], 1e-5);
    h = tg_batch_norm(h, P[N_BW], P[N_BB], NULL, NULL, true, 0.1, 1e-5);
    tg_tensor *loss = tg_sum(tg_mul(tg_tanh(h), tg_sigmoid(h)));
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    tg_scope_end();
    int64_t at = 0;
    for (int k = 0; k < NNORM; k++) {
        out[k] = copy_grad(tg_grad(P[k]));
        in_place[k] = flat && tg_tensor_data_ro(tg_grad(P[k])) ==
                                  (const double *)tg_tensor_data_ro(flat) + at;
        at += norm_numel[k];
    }
    tg_tensor_release(flat);
    tg_tape_free(tape);
    if (ps) {
        tg_params_free(ps);
    } else {
        for (int k = 0; k < NNORM; k++) {
            tg_grad_zero(P[k]);
            tg_tensor_release(P[k]);
        }
    }
}

Test(sinks, embedding_and_norm_parameters_take_their_sinks)
{
    size_t mem0 = tg_mem_current_bytes();
    double *plain[NNORM], *set[NNORM];
    bool ip_plain[NNORM], ip_set[NNORM];
    norm_grads(false, plain, ip_plain);
    norm_grads(true, set, ip_set);
    /* Layer norm's bias gradient is a sum over the leading dims made by
     * tg_sum_dims, which takes no sink. */
    const bool want[NNORM] = {true, true, false, true, true};
    for (int k = 0; k < NNORM; k++) {
        cr_expect_eq(memcmp(plain[k], set[k], (size_t)norm_numel[k] * sizeof(double)), 0,
                     "parameter %d: bits differ from a plain leaf's", k);
        cr_expect_eq(ip_set[k], want[k], "parameter %d: in place %d", k, ip_set[k]);
        cr_expect(!ip_plain[k]);
        free(plain[k]);
        free(set[k]);
    }
    cr_expect_eq(tg_mem_current_bytes(), mem0, "storage leaked");
}

/* ---- Every differentiable op of the registry, every gradcheck case, on
 * both backends: with its floating inputs as parameters of a set (sinks)
 * and as plain leaves, the loss sum(op(...) * w) for fixed weights w gives
 * bitwise the same gradients. An op whose two plain runs already differ
 * (random draws) is counted and skipped. */
typedef struct case_out {
    int ok;        /* 1 ran, 0 skipped (no float output), -1 failed */
    int64_t len;
    double *g;     /* the float inputs' gradients end to end (NaN: none) */
    char msg[256];
} case_out;

static case_out run_case(const tg_op *op, int n, tg_tensor *const *in, const tg_op_attrs *attrs,
                         bool use_set)
{
    case_out r = {.ok = 1};
    tg_tape *tape = tg_tape_new(NULL);
    tg_params *ps = use_set ? tg_params_new() : NULL;
    tg_tensor *args[TG_OP_MAX_INPUTS] = {0};
    bool owned[TG_OP_MAX_INPUTS] = {0};
    for (int i = 0; i < n; i++) {
        args[i] = in[i];
        if (!tu_is_float(tg_tensor_dtype(in[i]))) continue;
        double *v = tu_values(in[i]);
        int nd = tg_tensor_ndim(in[i]);
        int64_t shp[8];
        for (int d = 0; d < nd; d++) shp[d] = tg_tensor_dim(in[i], d);
        if (use_set) {
            char nm[16];
            snprintf(nm, sizeof nm, "in%d", i);
            args[i] = tg_params_add(ps, nm, TG_F64, nd, shp);
            if (args[i]) memcpy(tg_tensor_data(args[i]), v, (size_t)tg_tensor_numel(in[i]) * 8);
        } else {
            args[i] = tg_tensor_from_data(TG_F64, nd, shp, v);
            owned[i] = true;
            if (args[i]) tg_requires_grad(tape, args[i]);
        }
        free(v);
        cr_assert_not_null(args[i], "%s input %d: %s", op->name, i, tg_last_error_message());
        r.len += tg_tensor_numel(in[i]);
    }
    if (use_set) cr_assert_eq(tg_params_requires_grad(ps, tape), TG_OK);
    tg_scope_begin();
    tg_tensor *out = tg_op_call(op, n, args, attrs);
    if (!out || !tu_is_float(tg_tensor_dtype(out)) || !tg_tensor_requires_grad(out)) {
        r.ok = out ? 0 : -1;
        if (!out) snprintf(r.msg, sizeof r.msg, "forward: %s", tg_last_error_message());
    } else {
        int64_t m = tg_tensor_numel(out);
        double *wv = malloc((size_t)(m ? m : 1) * sizeof *wv);
        fill(wv, m, 99);
        int nd = tg_tensor_ndim(out);
        int64_t shp[8];
        for (int d = 0; d < nd; d++) shp[d] = tg_tensor_dim(out, d);
        tg_backend be = tg_set_default_backend(tg_tensor_backend(out)); /* to_device */
        tg_tensor *wt = tu_tensor(tg_tensor_dtype(out), nd, shp, wv);
        tg_set_default_backend(be);
        free(wv);
        tg_status st = tg_backward(tg_sum(tg_mul(out, wt)));
        if (st) {
            r.ok = -1;
            snprintf(r.msg, sizeof r.msg, "backward: %s", tg_last_error_message());
        }
    }
    tg_scope_end();
    if (r.ok == 1) {
        r.g = malloc((size_t)(r.len ? r.len : 1) * sizeof *r.g);
        int64_t at = 0;
        for (int i = 0; i < n; i++) {
            if (!tu_is_float(tg_tensor_dtype(in[i]))) continue;
            int64_t k = tg_tensor_numel(args[i]);
            const tg_tensor *g = tg_grad(args[i]);
            if (g) {
                cr_assert_eq(tg_tensor_copy_out(g, r.g + at, (size_t)k * sizeof(double)), TG_OK);
            } else {
                for (int64_t j = 0; j < k; j++) r.g[at + j] = NAN;
            }
            at += k;
        }
    }
    tg_error_clear();
    tg_tape_free(tape);
    for (int i = 0; i < n; i++) {
        if (!owned[i]) continue;
        tg_grad_zero(args[i]);
        tg_tensor_release(args[i]);
    }
    if (ps) tg_params_free(ps);
    return r;
}

Test(sinks, every_registered_op_gives_plain_leaves_bits_with_sinks)
{
    size_t mem0 = tg_mem_current_bytes();
    const tg_backend bes[2] = {TG_BACKEND_REF, TG_BACKEND_CPU};
    int compared = 0, skipped_random = 0, ops = 0;
    for (int b = 0; b < 2; b++) {
        tg_backend prev = tg_set_default_backend(bes[b]);
        for (int oi = 0; oi < tg_op_count(); oi++) {
            const tg_op *op = tg_op_at(oi);
            if (!tu_op_has_backward(op) || !op->sample) continue;
            bool op_compared = false;
            for (int k = 0; k < 64; k++) {
                tg_tensor *in[TG_OP_MAX_INPUTS] = {0};
                tg_op_attrs attrs;
                memset(&attrs, 0, sizeof attrs);
                tg_rng rng;
                tg_rng_seed(&rng, 0x5eedu + 7919u * (uint64_t)k);
                int n = op->sample(k, &rng, in, &attrs);
                if (n <= 0) {
                    tu_release_all(in, TG_OP_MAX_INPUTS);
                    break;
                }
                case_out a = run_case(op, n, in, &attrs, false);
                case_out a2 = run_case(op, n, in, &attrs, false);
                case_out s = run_case(op, n, in, &attrs, true);
                cr_expect_neq(a.ok, -1, "%s case %d (%s), plain: %s", op->name, k,
                              tg_backend_name(bes[b]), a.msg);
                cr_expect_eq(s.ok, a.ok, "%s case %d (%s): with a set %d (%s), plain %d",
                             op->name, k, tg_backend_name(bes[b]), s.ok, s.msg, a.ok);
                if (a.ok == 1 && s.ok == 1 && a2.ok == 1) {
                    if (memcmp(a.g, a2.g, (size_t)a.len * sizeof(double)) != 0) {
                        skipped_random++;
                    } else {
                        cr_expect_eq(memcmp(a.g, s.g, (size_t)a.len * sizeof(double)), 0,
                                     "%s case %d (%s): gradients with a set differ from plain "
                                     "leaves'", op->name, k, tg_backend_name(bes[b]));
                        compared++;
                        op_compared = true;
                    }
                }
                free(a.g);
                free(a2.g);
                free(s.g);
                tu_release_all(in, TG_OP_MAX_INPUTS);
            }
            ops += op_compared;
        }
        tg_set_default_backend(prev);
    }
    cr_expect_gt(ops, 100, "ops compared over both backends: %d (cases %d, random skipped %d)",
                 ops, compared, skipped_random);
    cr_log_info("sinks sweep: %d op-backend pairs, %d cases compared, %d random cases skipped",
                ops, compared, skipped_random);
    cr_expect_eq(tg_mem_current_bytes(), mem0, "storage leaked");
}

/* A weight used at every step of a recurrence: each later affine's GEMM
 * adds its gradient into the sum so far itself (tg__gemm_adds_exactly),
 * in the flat buffer (a parameter) or in a sum only the sweep holds (a
 * plain leaf). The result must have the bits of the sweep's own sum: the
 * same steps with a fresh leaf each (one beta-0 GEMM each), added with
 * tg_add in the sweep's order, the last step first. Both float dtypes,
 * both backends, reductions of 1 to 128 rows (the bound of the GEMM's own
 * sum), one past it, and 512, past OpenBLAS's own blocks (GEMM_Q), where
 * a GEMM's sum would differ. */
static void recurrent_weight_case(tg_dtype dt, int64_t rows)
{
    enum { T = 5, IN = 24, OUT = 40 };
    tg_rng rng;
    tg_rng_seed(&rng, (uint64_t)rows);
    tg_tensor *x[T], *r[T];
    for (int t = 0; t < T; t++) {
        x[t] = tg_rand_uniform(&rng, dt, 2, SHAPE(rows, IN), -1, 1);
        r[t] = tg_rand_uniform(&rng, dt, 2, SHAPE(rows, OUT), -1, 1);
    }
    tg_tensor *w0 = tg_rand_uniform(&rng, dt, 2, SHAPE(OUT, IN), -1, 1);
    tg_tensor *b = tg_zeros(dt, 1, SHAPE(OUT));
    size_t nbytes = (size_t)(OUT * IN) * (dt == TG_F32 ? 4 : 8);
    /* The reference: one leaf per step. */
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *wt[T], *loss = NULL;
    for (int t = 0; t < T; t++) {
        wt[t] = tg_tensor_retain(tg_contiguous(w0));
        cr_assert_eq(tg_requires_grad(tape, wt[t]), TG_OK);
        tg_tensor *s = tg_sum(tg_mul(tg_affine(x[t], wt[t], b), r[t]));
        loss = loss ? tg_add(loss, s) : s;
    }
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    tg_tensor *want = tg_grad(wt[T - 1]);
    for (int t = T - 2; t >= 0; t--) want = tg_add(want, tg_grad(wt[t]));
    cr_assert_not_null(want, "%s", tg_last_error_message());
    char *wv = malloc(nbytes), *gv = malloc(nbytes);
    cr_assert_eq(tg_tensor_copy_out(want, wv, nbytes), TG_OK);
    tg_tape_free(tape);
    for (int t = 0; t < T; t++) tg_tensor_release(wt[t]);
    /* One weight, as a plain leaf and as a parameter. */
    for (int as_param = 0; as_param < 2; as_param++) {
        tape = tg_tape_new(NULL);
        tg_params *ps = NULL;
        tg_tensor *w;
        if (as_param) {
            ps = tg_params_new();
            w = tg_params_add(ps, "w", dt, 2, SHAPE(OUT, IN));
            cr_assert_not_null(w, "%s", tg_last_error_message());
            cr_assert_eq(tg_tensor_copy_out(w0, tg_tensor_data(w), nbytes), TG_OK);
            cr_assert_eq(tg_params_requires_grad(ps, tape), TG_OK);
        } else {
            w = tg_tensor_retain(tg_contiguous(w0));
            cr_assert_eq(tg_requires_grad(tape, w), TG_OK);
        }
        loss = NULL;
        for (int t = 0; t < T; t++) {
            tg_tensor *s = tg_sum(tg_mul(tg_affine(x[t], w, b), r[t]));
            loss = loss ? tg_add(loss, s) : s;
        }
        cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
        cr_assert_eq(tg_tensor_copy_out(tg_grad(w), gv, nbytes), TG_OK);
        cr_expect(memcmp(gv, wv, nbytes) == 0,
                  "%s %s, %lld rows, %s: the weight's gradient differs from the sum of the "
                  "steps' gradients", tg_dtype_name(dt), tg_backend_name(tu_cur),
                  (long long)rows, as_param ? "a parameter" : "a plain leaf");
        tg_tape_free(tape);
        if (as_param)
            tg_params_free(ps);
        else
            tg_tensor_release(w);
    }
    free(wv);
    free(gv);
}

static void recurrent_weight_sums(void)
{
    static const int64_t rows[] = {1, 3, 16, 128, 129, 512};
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
            recurrent_weight_case(d ? TG_F64 : TG_F32, rows[i]);
}

Test(sinks, a_weight_used_at_every_step_sums_its_gradient_with_the_sweeps_bits)
{
    tu_on_both_backends(recurrent_weight_sums);
}
