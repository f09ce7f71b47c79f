/* Guards against silently wrong gradients: versions (a value written
 * between forward and backward fails backward with TG_ERR_MODIFIED under
 * every policy, leaving leaf gradients as they were), anomaly mode
 * (TG_ERR_NONFINITE naming the op, its node, the shapes and the label),
 * labels, and NaN propagation through the piecewise ops. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tapegrad.h>

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

enum { NONE, BALANCED, BUDGET, SEGMENTS, NPOLICIES };
static const char *const policy_names[NPOLICIES] = {"none", "balanced", "budget", "segments"};

static tg_tape *tape_for(int policy)
{
    tg_tape_opts o = {0};
    if (policy == BALANCED) o.policy = TG_CHECKPOINT_BALANCED;
    if (policy == BUDGET) {
        o.policy = TG_CHECKPOINT_BUDGET;
        o.budget_bytes = 1 << 20;
    }
    tg_tape *t = tg_tape_new(&o);
    cr_assert_not_null(t, "%s", tg_last_error_message());
    return t;
}

static tg_tensor *vec3(double a, double b, double c)
{
    tg_tensor *t = tg_tensor_from_data(TG_F64, 1, SHAPE(3), (const double[]){a, b, c});
    cr_assert_not_null(t, "%s", tg_last_error_message());
    return t;
}

/* loss = sum(tanh(x) * x * c): mul keeps x (a leaf) and tanh's output. */
static tg_tensor *forward(tg_tape *tape, int policy, tg_tensor *x, tg_tensor *c, tg_tensor **y)
{
    if (policy == SEGMENTS) cr_assert_eq(tg_checkpoint_begin(tape), TG_OK);
    *y = tg_tanh(x);
    tg_tensor *h = tg_mul(tg_mul(*y, x), c);
    if (policy == SEGMENTS) cr_assert_eq(tg_checkpoint_end(tape), TG_OK);
    tg_tensor *loss = tg_sum(h);
    cr_assert_not_null(loss, "%s", tg_last_error_message());
    return loss;
}

/* The documented hand-written SGD step, done one step too early: the
 * leaf's data is changed between forward and backward. */
Test(versions, a_leaf_written_before_backward_fails_it_under_every_policy)
{
    for (int p = 0; p < NPOLICIES; p++) {
        tg_tape *tape = tape_for(p);
        tg_tensor *x = vec3(0.5, -1.0, 2.0), *c = vec3(1.0, 2.0, 3.0), *y;
        cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
        tg_scope_begin();
        tg_tensor *loss = forward(tape, p, x, c, &y);
        uint32_t v0 = tg_tensor_version(x);
        double *xd = tg_tensor_data(x);
        xd[0] -= 0.1; /* SGD too early */
        cr_assert_eq(tg_tensor_version(x), v0 + 1, "tg_tensor_data must bump the version");
        cr_assert_eq(tg_backward(loss), TG_ERR_MODIFIED, "%s: %s", policy_names[p],
                     tg_last_error_message());
        const char *msg = tg_last_error_message();
        cr_expect(strstr(msg, "'mul'") || strstr(msg, "'tanh'"), "%s: %s", policy_names[p], msg);
        cr_expect(strstr(msg, "a leaf") != NULL, "%s: %s", policy_names[p], msg);
        char want[64];
        snprintf(want, sizeof want, "version %u when recorded, %u now", v0, v0 + 1);
        cr_expect(strstr(msg, want) != NULL, "%s: %s", policy_names[p], msg);
        /* No leaf gradient was touched. */
        cr_expect_null(tg_grad(x), "%s: the failed backward left a gradient", policy_names[p]);
        tg_error_clear();
        tg_scope_end();
        /* The tape stays usable: record again, and backward works. */
        tg_tape_reset(tape);
        tg_scope_begin();
        loss = forward(tape, p, x, c, &y);
        cr_expect_eq(tg_backward(loss), TG_OK, "%s: %s", policy_names[p], tg_last_error_message());
        cr_expect_not_null(tg_grad(x));
        tg_scope_end();
        tg_tensor_release(x);
        tg_tensor_release(c);
        tg_tape_free(tape);
    }
}

/* Writing into the output tanh keeps for its backward. */
Test(versions, a_saved_output_written_before_backward_fails_it_under_every_policy)
{
    for (int p = 0; p < NPOLICIES; p++) {
        tg_tape *tape = tape_for(p);
        tg_tensor *x = vec3(0.5, -1.0, 2.0), *c = vec3(1.0, 2.0, 3.0), *y;
        cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
        tg_scope_begin();
        /* loss = sum(tanh(x) * c): only tanh reads its own output. */
        if (p == SEGMENTS) cr_assert_eq(tg_checkpoint_begin(tape), TG_OK);
        y = tg_tanh(x);
        tg_tensor *h = tg_mul(y, c);
        if (p == SEGMENTS) cr_assert_eq(tg_checkpoint_end(tape), TG_OK);
        tg_tensor *loss = tg_sum(h);
        cr_assert_not_null(loss);
        double *yd = tg_tensor_data(y);
        yd[1] = 0.5;
        cr_assert_eq(tg_backward(loss), TG_ERR_MODIFIED, "%s: %s", policy_names[p],
                     tg_last_error_message());
        const char *msg = tg_last_error_message();
        cr_expect(strstr(msg, "'tanh'") != NULL, "%s: %s", policy_names[p], msg);
        cr_expect(strstr(msg, "its output") != NULL, "%s: %s", policy_names[p], msg);
        cr_expect(strstr(msg, "version 0 when recorded, 1 now") != NULL, "%s: %s",
                  policy_names[p], msg);
        cr_expect_null(tg_grad(x));
        tg_error_clear();
        tg_scope_end();
        tg_tensor_release(x);
        tg_tensor_release(c);
        tg_tape_free(tape);
    }
}

Test(versions, reads_and_writes_after_backward_are_fine)
{
    tg_tape *tape = tape_for(NONE);
    tg_tensor *x = vec3(0.5, -1.0, 2.0), *c = vec3(1.0, 2.0, 3.0), *y;
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    tg_scope_begin();
    tg_tensor *loss = forward(tape, NONE, x, c, &y);
    /* A read-only look at saved values changes nothing. */
    const double *yd = tg_tensor_data_ro(y);
    const double *xd = tg_tensor_data_ro(x);
    cr_assert(yd && xd);
    cr_expect_eq(tg_tensor_version(x), 0u);
    double l;
    cr_assert_eq(tg_tensor_item(loss, &l), TG_OK);
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    double g0;
    cr_assert_eq(tg_tensor_get(tg_grad(x), 0, &g0), TG_OK);
    /* d/dx (tanh(x) x c) = c (tanh x + x (1 - tanh^2 x)) */
    double t = tanh(0.5);
    cr_expect_float_eq(g0, 1.0 * (t + 0.5 * (1 - t * t)), 1e-15);
    /* The SGD step after backward: a write, and nothing complains. */
    double *w = tg_tensor_data(x);
    w[0] -= 0.1 * g0;
    tg_scope_end();
    tg_tape_reset(tape);
    tg_tensor_release(x);
    tg_tensor_release(c);
    tg_tape_free(tape);
}

/* The write paths of the training kit bump versions too. */
Test(versions, initialisers_and_optimizer_steps_bump_the_version)
{
    tg_tensor *w = tg_zeros(TG_F32, 2, SHAPE(2, 3));
    uint32_t v = tg_tensor_version(w);
    cr_assert_eq(tg_init_constant(w, 0.5), TG_OK);
    cr_expect_eq(tg_tensor_version(w), v + 1);
    tg_rng rng;
    tg_rng_seed(&rng, 1);
    cr_assert_eq(tg_init_uniform(w, &rng, -1, 1), TG_OK);
    cr_expect_eq(tg_tensor_version(w), v + 2);
    tg_tensor_release(w);

    tg_params *ps = tg_params_new();
    tg_tensor *p = tg_params_add(ps, "w", TG_F32, 1, SHAPE(3));
    cr_assert_not_null(p, "%s", tg_last_error_message());
    tg_tape *tape = tape_for(NONE);
    cr_assert_eq(tg_params_requires_grad(ps, tape), TG_OK);
    tg_optim_opts oo = tg_optim_defaults(TG_OPTIM_SGD);
    oo.lr = 0.1;
    tg_optim *opt = tg_optim_new(ps, &oo);
    cr_assert_not_null(opt, "%s", tg_last_error_message());
    tg_scope_begin();
    tg_tensor *loss = tg_sum(tg_mul(p, p));
    cr_assert_eq(tg_backward(loss), TG_OK);
    tg_scope_end();
    /* A second forward, then a step before its backward: the step writes
     * the parameter mul keeps. */
    tg_tape_reset(tape);
    tg_scope_begin();
    loss = tg_sum(tg_mul(p, p));
    uint32_t before = tg_tensor_version(p);
    cr_assert_eq(tg_optim_step(opt), TG_OK);
    cr_expect_gt(tg_tensor_version(p), before);
    cr_expect_eq(tg_backward(loss), TG_ERR_MODIFIED, "%s", tg_last_error_message());
    tg_error_clear();
    tg_scope_end();
    tg_optim_free(opt);
    tg_params_free(ps);
    tg_tape_free(tape);
}

/* ---- anomaly mode and labels */

Test(anomaly, log_of_a_negative_number_is_named_with_its_label)
{
    tg_tape *tape = tape_for(NONE);
    cr_assert_eq(tg_tape_set_anomaly(tape, true), TG_OK);
    cr_assert(tg_tape_anomaly(tape));
    tg_tensor *x = vec3(-1.0, 0.0, 1.0);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    cr_assert_eq(tg_tape_label_push(tape, "encoder"), TG_OK);
    cr_assert_eq(tg_tape_label_push(tape, "layer2"), TG_OK);
    cr_expect_str_eq(tg_tape_label(tape), "encoder/layer2");
    tg_scope_begin();
    tg_tensor *e = tg_exp(x); /* finite: recorded */
    cr_assert_not_null(e);
    int64_t nodes = tg_tape_node_count(tape);
    tg_tensor *l = tg_log(x);
    cr_expect_null(l);
    cr_expect_eq(tg_last_error(), TG_ERR_NONFINITE);
    const char *msg = tg_last_error_message();
    cr_expect(strstr(msg, "'log'") != NULL, "%s", msg);
    cr_expect(strstr(msg, "node 1") != NULL, "%s", msg);
    cr_expect(strstr(msg, "encoder/layer2") != NULL, "%s", msg);
    cr_expect(strstr(msg, "NaN at element 0") != NULL, "%s", msg);
    cr_expect(strstr(msg, "inputs: f64 [3]") != NULL, "%s", msg);
    cr_expect_eq(tg_tape_node_count(tape), nodes, "the failing op must record nothing");
    tg_error_clear();
    cr_assert_eq(tg_tape_label_pop(tape), TG_OK);
    cr_expect_str_eq(tg_tape_label(tape), "encoder");
    cr_assert_eq(tg_tape_label_pop(tape), TG_OK);
    cr_expect_null(tg_tape_label(tape));
    cr_expect_eq(tg_tape_label_pop(tape), TG_ERR_SCOPE);
    tg_error_clear();
    /* The tape is still usable. */
    cr_expect_eq(tg_backward(tg_sum(e)), TG_OK, "%s", tg_last_error_message());
    tg_scope_end();
    tg_tensor_release(x);
    tg_tape_free(tape);
}

Test(anomaly, off_by_default_the_nan_loss_goes_through)
{
    tg_tape *tape = tape_for(NONE);
    cr_expect_not(tg_tape_anomaly(tape));
    tg_tensor *x = vec3(-1.0, 0.0, 1.0);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    tg_scope_begin();
    tg_tensor *loss = tg_sum(tg_log(x));
    cr_assert_not_null(loss);
    double v;
    cr_assert_eq(tg_tensor_item(loss, &v), TG_OK);
    cr_expect(isnan(v));
    cr_expect_eq(tg_backward(loss), TG_OK);
    tg_scope_end();
    tg_tensor_release(x);
    tg_tape_free(tape);
}

/* sqrt(0) is finite, its gradient 1/(2 sqrt 0) is not: the backward is
 * blamed, with the label of the forward op, and no leaf changes. */
Test(anomaly, an_infinite_gradient_names_the_backward_that_made_it)
{
    tg_tape_opts o = {.anomaly = true};
    tg_tape *tape = tg_tape_new(&o);
    cr_assert(tg_tape_anomaly(tape));
    tg_tensor *x = vec3(0.0, 1.0, 4.0);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    tg_scope_begin();
    cr_assert_eq(tg_tape_label_push(tape, "head"), TG_OK);
    tg_tensor *loss = tg_sum(tg_sqrt(x));
    cr_assert_eq(tg_tape_label_pop(tape), TG_OK);
    cr_assert_not_null(loss, "%s", tg_last_error_message());
    cr_expect_eq(tg_backward(loss), TG_ERR_NONFINITE);
    const char *msg = tg_last_error_message();
    cr_expect(strstr(msg, "backward of 'sqrt'") != NULL, "%s", msg);
    cr_expect(strstr(msg, "recorded under 'head'") != NULL, "%s", msg);
    cr_expect(strstr(msg, "+inf at element 0") != NULL, "%s", msg);
    cr_expect_null(tg_grad(x));
    tg_error_clear();
    tg_scope_end();
    tg_tensor_release(x);
    tg_tape_free(tape);
}

Test(labels, bad_names_and_null_tapes_are_refused)
{
    tg_tape *tape = tape_for(NONE);
    cr_expect_eq(tg_tape_label_push(NULL, "a"), TG_ERR_NULL);
    cr_expect_eq(tg_tape_label_push(tape, NULL), TG_ERR_NULL);
    cr_expect_eq(tg_tape_label_push(tape, ""), TG_ERR_INVALID);
    cr_expect_eq(tg_tape_label_push(tape, "a/b"), TG_ERR_INVALID);
    char long_name[80];
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    cr_expect_eq(tg_tape_label_push(tape, long_name), TG_ERR_INVALID);
    for (int i = 0; i < 32; i++) cr_assert_eq(tg_tape_label_push(tape, "d"), TG_OK);
    cr_expect_eq(tg_tape_label_push(tape, "d"), TG_ERR_INVALID);
    cr_expect_null(tg_tape_label(NULL));
    cr_expect_eq(tg_tape_set_anomaly(NULL, true), TG_ERR_NULL);
    tg_error_clear();
    tg_tape_free(tape);
}

/* ---- NaN propagation, as PyTorch does */

static void expect_nan_out(tg_tensor *(*f)(tg_tensor *), const char *name)
{
    for (int b = 0; b < 2; b++) {
        tg_tensor *x = tg_tensor_from_data(TG_F32, 1, SHAPE(3), (const float[]){NAN, -1.0f, 2.0f});
        cr_assert_not_null(x);
        tg_tensor *xb = tg_to_device(x, b ? TG_BACKEND_CPU : TG_BACKEND_REF);
        cr_assert_not_null(xb, "%s", tg_last_error_message());
        tg_tensor *y = f(xb);
        cr_assert_not_null(y, "%s: %s", name, tg_last_error_message());
        double v;
        cr_assert_eq(tg_tensor_get(y, 0, &v), TG_OK);
        cr_expect(isnan(v), "%s(NaN) on %s gave %g", name, b ? "cpu" : "ref", v);
        tg_tensor_release(y);
        tg_tensor_release(xb);
        tg_tensor_release(x);
    }
}

static tg_tensor *relu_of(tg_tensor *x) { return tg_relu(x); }
static tg_tensor *clamp_of(tg_tensor *x) { return tg_clamp(x, -0.5, 0.5); }
static tg_tensor *leaky_of(tg_tensor *x) { return tg_leaky_relu(x, 0.01); }
static tg_tensor *max_of(tg_tensor *x) { return tg_max_dim(x, 0, false); }
static tg_tensor *maximum_of(tg_tensor *x)
{
    tg_tensor *z0 = tg_zeros(TG_F32, 1, SHAPE(3));
    tg_tensor *z = tg_to_device(z0, tg_tensor_backend(x));
    tg_tensor_release(z0);
    tg_tensor *m = tg_maximum(x, z);
    tg_tensor_release(z);
    return m;
}

Test(nan, relu_clamp_max_and_friends_propagate_nan)
{
    expect_nan_out(relu_of, "relu");
    expect_nan_out(clamp_of, "clamp");
    expect_nan_out(leaky_of, "leaky_relu");
    expect_nan_out(max_of, "max");
    expect_nan_out(maximum_of, "maximum");
}

/* ---- hooks */

static tg_status double_it(tg_tensor *grad, tg_tensor **replace, void *ud)
{
    int *calls = ud;
    (*calls)++;
    *replace = tg_mul_scalar(grad, 2.0);
    return *replace ? TG_OK : tg_last_error();
}

/* loss = sum(tanh(x) * c); a hook on tanh(x) doubles the gradient flowing
 * into it, so x's gradient doubles, under every policy. */
Test(hooks, a_hook_on_a_result_replaces_its_gradient_under_every_policy)
{
    for (int p = 0; p < NPOLICIES; p++) {
        double g[2][3];
        for (int hooked = 0; hooked < 2; hooked++) {
            tg_tape *tape = tape_for(p);
            tg_tensor *x = vec3(0.5, -1.0, 2.0), *c = vec3(1.0, 2.0, 3.0);
            cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
            tg_scope_begin();
            if (p == SEGMENTS) cr_assert_eq(tg_checkpoint_begin(tape), TG_OK);
            tg_tensor *y = tg_tanh(x);
            int calls = 0;
            if (hooked) cr_assert_eq(tg_tensor_hook_add(y, double_it, &calls), TG_OK);
            tg_tensor *h = tg_mul(y, c);
            if (p == SEGMENTS) cr_assert_eq(tg_checkpoint_end(tape), TG_OK);
            cr_assert_eq(tg_backward(tg_sum(h)), TG_OK, "%s: %s", policy_names[p],
                         tg_last_error_message());
            cr_expect_eq(calls, hooked, "%s", policy_names[p]);
            for (int i = 0; i < 3; i++)
                cr_assert_eq(tg_tensor_get(tg_grad(x), i, &g[hooked][i]), TG_OK);
            tg_scope_end();
            tg_tensor_release(x);
            tg_tensor_release(c);
            tg_tape_free(tape);
        }
        for (int i = 0; i < 3; i++)
            cr_expect_eq(g[1][i], 2.0 * g[0][i], "%s: element %d: %g vs 2 * %g", policy_names[p], i,
                         g[1][i], g[0][i]);
    }
}

static tg_status clip_to_one(tg_tensor *leaf, void *ud)
{
    int *calls = ud;
    (*calls)++;
    tg_tensor *g = tg_grad(leaf);
    double *d = tg_tensor_data(g);
    for (int64_t i = 0; i < tg_tensor_numel(g); i++) d[i] = d[i] > 1 ? 1 : d[i];
    return TG_OK;
}

static tg_status refuse(tg_tensor *grad, tg_tensor **replace, void *ud)
{
    (void)grad;
    (void)replace;
    (void)ud;
    return tg_error_set(TG_ERR_INVALID, "refused by the test's hook");
}

static tg_status wrong_shape(tg_tensor *grad, tg_tensor **replace, void *ud)
{
    (void)grad;
    (void)ud;
    *replace = tg_zeros(TG_F64, 1, SHAPE(2));
    return TG_OK;
}

Test(hooks, leaf_hooks_run_before_and_after_accumulation_and_failures_change_nothing)
{
    tg_tape *tape = tape_for(NONE);
    tg_tensor *x = vec3(0.5, -1.0, 2.0), *c = vec3(1.0, 2.0, 3.0);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    int before = 0, after = 0;
    cr_assert_eq(tg_tensor_hook_add(x, double_it, &before), TG_OK);
    cr_assert_eq(tg_leaf_hook_add(x, clip_to_one, &after), TG_OK);
    cr_expect_eq(tg_leaf_hook_add(c, clip_to_one, &after), TG_ERR_NO_GRAD);
    tg_error_clear();
    tg_scope_begin();
    cr_assert_eq(tg_backward(tg_sum(tg_mul(x, c))), TG_OK, "%s", tg_last_error_message());
    cr_expect_eq(before, 1);
    cr_expect_eq(after, 1);
    double want[3] = {1.0, 1.0, 1.0}; /* 2c clipped to 1 */
    for (int i = 0; i < 3; i++) {
        double v;
        cr_assert_eq(tg_tensor_get(tg_grad(x), i, &v), TG_OK);
        cr_expect_eq(v, want[i]);
    }
    tg_scope_end();
    tg_tape_reset(tape);
    /* Leaf hooks survive a reset; a failing hook fails backward with its
     * status and leaves the gradient as it was. */
    tg_tensor *y;
    tg_scope_begin();
    tg_tensor *loss = forward(tape, NONE, x, c, &y);
    cr_assert_eq(tg_tensor_hook_add(y, refuse, NULL), TG_OK);
    cr_expect_eq(tg_backward(loss), TG_ERR_INVALID);
    cr_expect(strstr(tg_last_error_message(), "refused by the test's hook") != NULL, "%s",
              tg_last_error_message());
    double v;
    cr_assert_eq(tg_tensor_get(tg_grad(x), 0, &v), TG_OK);
    cr_expect_eq(v, 1.0);
    tg_error_clear();
    tg_scope_end();
    tg_tape_reset(tape);
    tg_scope_begin();
    loss = forward(tape, NONE, x, c, &y);
    cr_assert_eq(tg_tensor_hook_add(y, wrong_shape, NULL), TG_OK);
    cr_expect_eq(tg_backward(loss), TG_ERR_SHAPE, "%s", tg_last_error_message());
    tg_error_clear();
    tg_scope_end();
    tg_tape_hooks_clear(tape);
    tg_tape_reset(tape);
    tg_tensor_release(x);
    tg_tensor_release(c);
    tg_tape_free(tape);
}

typedef struct {
    int pre, post;
    char ops[8][16];
} node_log;

static tg_status log_pre(const tg_node_info *n, tg_tensor *gout, void *ud)
{
    node_log *l = ud;
    cr_assert_not_null(gout);
    if (l->pre < 8) snprintf(l->ops[l->pre], sizeof l->ops[0], "%s", n->op);
    l->pre++;
    return TG_OK;
}

static tg_status log_post(const tg_node_info *n, tg_tensor *const *gin, void *ud)
{
    node_log *l = ud;
    cr_assert_leq(n->nin, 4);
    cr_assert(gin[0] || (n->nin > 1 && gin[1]), "no input gradient after '%s'", n->op);
    l->post++;
    return TG_OK;
}

Test(hooks, node_hooks_see_every_node_in_reverse_order)
{
    for (int p = 0; p < NPOLICIES; p++) {
        tg_tape *tape = tape_for(p);
        node_log l = {0};
        cr_assert_eq(tg_tape_set_node_hooks(tape, log_pre, log_post, &l), TG_OK);
        tg_tensor *x = vec3(0.5, -1.0, 2.0), *c = vec3(1.0, 2.0, 3.0), *y;
        cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
        tg_scope_begin();
        tg_tensor *loss = forward(tape, p, x, c, &y); /* tanh, mul, mul, sum */
        cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
        cr_expect_eq(l.pre, 4, "%s", policy_names[p]);
        cr_expect_eq(l.post, 4, "%s", policy_names[p]);
        cr_expect_str_eq(l.ops[0], "sum");
        cr_expect_str_eq(l.ops[3], "tanh");
        tg_scope_end();
        tg_tensor_release(x);
        tg_tensor_release(c);
        tg_tape_free(tape);
    }
}

/* Saved values packed into plain malloc'd copies (the bytes), unpacked
 * into new tensors: the same gradients bit for bit, nothing left over. */
typedef struct {
    int packed, unpacked, freed;
    bool fail_pack;
} pack_stats;

typedef struct {
    tg_dtype dtype;
    int ndim;
    int64_t shape[8];
    size_t nbytes;
    unsigned char data[];
} blob;

static tg_status pack_copy(tg_tensor *saved, void **out, void *ud)
{
    pack_stats *s = ud;
    if (s->fail_pack) return tg_error_set(TG_ERR_IO, "pack refused");
    size_t nbytes = (size_t)tg_tensor_numel(saved) * tg_dtype_size(tg_tensor_dtype(saved));
    blob *b = malloc(sizeof *b + nbytes);
    cr_assert_not_null(b);
    b->dtype = tg_tensor_dtype(saved);
    b->ndim = tg_tensor_ndim(saved);
    for (int d = 0; d < b->ndim; d++) b->shape[d] = tg_tensor_shape(saved)[d];
    b->nbytes = nbytes;
    cr_assert_eq(tg_tensor_copy_out(saved, b->data, nbytes), TG_OK);
    s->packed++;
    *out = b;
    return TG_OK;
}

static tg_tensor *unpack_copy(void *h, void *ud)
{
    pack_stats *s = ud;
    blob *b = h;
    s->unpacked++;
    return tg_tensor_from_data(b->dtype, b->ndim, b->shape, b->data);
}

static void free_copy(void *h, void *ud)
{
    pack_stats *s = ud;
    s->freed++;
    free(h);
}

Test(hooks, packed_saved_values_give_the_same_gradients_under_every_policy)
{
    for (int p = 0; p < NPOLICIES; p++) {
        double g[2][3];
        for (int hooked = 0; hooked < 2; hooked++) {
            tg_tape *tape = tape_for(p);
            pack_stats s = {0};
            if (hooked)
                cr_assert_eq(tg_tape_set_saved_hooks(tape, pack_copy, unpack_copy, free_copy, &s),
                             TG_OK);
            tg_tensor *x = vec3(0.5, -1.0, 2.0), *c = vec3(1.0, 2.0, 3.0), *y;
            cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
            tg_scope_begin();
            tg_tensor *loss = forward(tape, p, x, c, &y);
            if (hooked && p == NONE) {
                cr_expect_gt(s.packed, 0);
                cr_expect_eq(tg_tape_saved_bytes(tape), 0, "packed values are the hook's");
                cr_expect_eq(tg_tape_set_saved_hooks(tape, NULL, NULL, NULL, NULL), TG_ERR_INVALID);
                tg_error_clear();
            }
            cr_assert_eq(tg_backward(loss), TG_OK, "%s: %s", policy_names[p],
                         tg_last_error_message());
            cr_expect_eq(s.unpacked, s.packed, "%s", policy_names[p]);
            cr_expect_eq(s.freed, s.packed, "%s", policy_names[p]);
            for (int i = 0; i < 3; i++)
                cr_assert_eq(tg_tensor_get(tg_grad(x), i, &g[hooked][i]), TG_OK);
            tg_scope_end();
            tg_tensor_release(x);
            tg_tensor_release(c);
            tg_tape_free(tape);
        }
        cr_expect_arr_eq(g[0], g[1], sizeof g[0], "%s", policy_names[p]);
    }
}

Test(hooks, a_failing_pack_fails_the_op_and_a_reset_frees_what_was_packed)
{
    tg_tape *tape = tape_for(NONE);
    pack_stats s = {0};
    cr_assert_eq(tg_tape_set_saved_hooks(tape, pack_copy, NULL, free_copy, &s), TG_ERR_NULL);
    cr_assert_eq(tg_tape_set_saved_hooks(tape, pack_copy, unpack_copy, free_copy, &s), TG_OK);
    tg_tensor *x = vec3(0.5, -1.0, 2.0);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    tg_scope_begin();
    tg_tensor *y = tg_tanh(tg_mul_scalar(x, 2.0)); /* tanh packs its output */
    cr_assert_not_null(y);
    cr_expect_eq(s.packed, 1);
    s.fail_pack = true;
    int64_t nodes = tg_tape_node_count(tape);
    cr_expect_null(tg_tanh(y));
    cr_expect_eq(tg_last_error(), TG_ERR_IO);
    cr_expect_eq(tg_tape_node_count(tape), nodes);
    tg_error_clear();
    tg_scope_end();
    tg_tape_reset(tape); /* never swept: the handle is freed */
    cr_expect_eq(s.freed, 1);
    cr_expect_eq(s.unpacked, 0);
    tg_tensor_release(x);
    tg_tape_free(tape);
}

/* Under create_graph a hook's replacement is recorded, and the hook runs
 * again when the second sweep passes y: with f = sum(y^2), y = tanh x, the
 * first gradient is doubled once and its derivative through y doubled once
 * more (PyTorch's tensor hooks do the same): 4 times the unhooked one. */
Test(hooks, hooks_work_under_create_graph)
{
    tg_tape *tape = tape_for(NONE);
    tg_tensor *x = vec3(0.5, -1.0, 2.0);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    double h[2];
    for (int hooked = 0; hooked < 2; hooked++) {
        tg_scope_begin();
        tg_tensor *y = tg_tanh(x);
        int calls = 0;
        if (hooked) cr_assert_eq(tg_tensor_hook_add(y, double_it, &calls), TG_OK);
        tg_tensor *loss = tg_sum(tg_mul(y, y)), *g, *gg;
        tg_grad_opts o = {.create_graph = true};
        cr_assert_eq(tg_grad_of(1, &loss, NULL, 1, &x, &g, &o), TG_OK, "%s", tg_last_error_message());
        cr_assert(tg_tensor_requires_grad(g));
        tg_grad_opts o2 = {0};
        cr_assert_eq(tg_grad_of(1, (tg_tensor *[]){tg_sum(g)}, NULL, 1, &x, &gg, &o2), TG_OK, "%s",
                     tg_last_error_message());
        cr_assert_eq(tg_tensor_get(gg, 0, &h[hooked]), TG_OK);
        tg_scope_end();
        tg_tape_reset(tape);
    }
    cr_expect_float_eq(h[1], 4.0 * h[0], 1e-14, "%g vs 4 * %g", h[1], h[0]);
    tg_tensor_release(x);
    tg_tape_free(tape);
}
