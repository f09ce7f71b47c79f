/* test_optim.c - optimizers, schedules and gradient accumulation.
 *
 * Hand-computed checks: a parameter p = [1, 2] (f64) with the fixed
 * gradient g = [0.5, -1] (the loss is sum(p * g)), a few steps of each
 * optimizer, every value derived in the comment above its test.
 * Golden checks: tools/torch_optim_golden.py trains a linear layer with MSE
 * for 10 steps of torch.optim in f64 (tests/golden_optim/<name>.txt); the
 * same run here must match every loss and parameter to 1e-10 relative. */
#include <criterion/criterion.h>
#include <tapegrad.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GOLDEN_OPTIM_DIR TG_GOLDEN_DIR "/../golden_optim"

static const double P0[2] = {1.0, 2.0};
static const double G[2] = {0.5, -1.0};

/* Runs `steps` steps of o on p = P0 with gradient G; out[k] = p after k+1. */
static void const_grad_run(tg_optim_opts o, int steps, double out[][2])
{
    tg_params *ps = tg_params_new();
    tg_tensor *p = tg_params_add(ps, "p", TG_F64, 1, (int64_t[]){2});
    memcpy(tg_tensor_data(p), P0, sizeof P0);
    tg_tensor *g = tg_tensor_from_data(TG_F64, 1, (int64_t[]){2}, G);
    tg_optim *opt = tg_optim_new(ps, &o);
    cr_assert_not_null(opt, "%s", tg_last_error_message());
    tg_tape *tape = tg_tape_new(NULL);
    cr_assert_eq(tg_params_requires_grad(ps, tape), TG_OK);
    for (int k = 0; k < steps; k++) {
        tg_optim_zero_grad(opt);
        tg_scope_begin();
        cr_assert_eq(tg_backward(tg_sum(tg_mul(p, g))), TG_OK, "%s", tg_last_error_message());
        tg_scope_end();
        tg_tape_reset(tape);
        cr_assert_eq(tg_optim_step(opt), TG_OK, "%s", tg_last_error_message());
        memcpy(out[k], tg_tensor_data(p), sizeof out[k]);
    }
    cr_assert_eq(tg_optim_step_count(opt), steps);
    tg_tape_free(tape);
    tg_tensor_release(g);
    tg_optim_free(opt);
    tg_params_free(ps);
}

static void expect_steps(tg_optim_opts o, int steps, const double want[][2])
{
    double got[8][2];
    const_grad_run(o, steps, got);
    for (int k = 0; k < steps; k++)
        for (int i = 0; i < 2; i++)
            cr_expect(fabs(got[k][i] - want[k][i]) <= 1e-12, "step %d p[%d]: got %.17g want %.17g",
                      k + 1, i, got[k][i], want[k][i]);
}

/* SGD lr 0.1: p -= 0.1 g each step: [1 - .05k, 2 + .1k]. */
Test(optim, sgd_plain_steps_by_hand)
{
    tg_optim_opts o = tg_optim_defaults(TG_OPTIM_SGD);
    o.lr = 0.1;
    expect_steps(o, 3, (const double[][2]){{0.95, 2.1}, {0.9, 2.2}, {0.85, 2.3}});
}

/* SGD lr 0.1, momentum 0.9, weight decay 0.1: d = g + 0.1 p.
 * 1: d = [.6, -.8], buf = d, p = [.94, 2.08]
 * 2: d = [.594, -.792], buf = .9[.6,-.8] + d = [1.134, -1.512],
 *    p = [.94 - .1134, 2.08 + .1512] = [.8266, 2.2312]
 * 3: d = [.58266, -.77688], buf = .9[1.134,-1.512] + d = [1.60326, -2.13768],
 *    p = [.8266 - .160326, 2.2312 + .213768] = [.666274, 2.444968] */
Test(optim, sgd_momentum_weight_decay_by_hand)
{
    tg_optim_opts o = tg_optim_defaults(TG_OPTIM_SGD);
    o.lr = 0.1, o.momentum = 0.9, o.weight_decay = 0.1;
    expect_steps(o, 3, (const double[][2]){{0.94, 2.08}, {0.8266, 2.2312}, {0.666274, 2.444968}});
}

/* Nesterov, lr 0.1, momentum 0.9: buf_1 = g, buf_2 = 1.9g, buf_3 = 2.71g;
 * step uses g + .9 buf: 1.9g, 2.71g, 3.439g, so p -= .19g, .271g, .3439g:
 * p1 = [.905, 2.19], p2 = [.7695, 2.461], p3 = [.59755, 2.8049] */
Test(optim, sgd_nesterov_by_hand)
{
    tg_optim_opts o = tg_optim_defaults(TG_OPTIM_SGD);
    o.lr = 0.1, o.momentum = 0.9, o.nesterov = true;
    expect_steps(o, 3, (const double[][2]){{0.905, 2.19}, {0.7695, 2.461}, {0.59755, 2.8049}});
}

/* Dampening 0.5, momentum 0.9: the first buffer is g undamped (PyTorch),
 * then buf = .9 buf + .5 g: g, 1.4g, 1.76g; p -= .1 buf:
 * p1 = [.95, 2.1], p2 = [.88, 2.24], p3 = [.792, 2.416] */
Test(optim, sgd_dampening_skips_first_step_by_hand)
{
    tg_optim_opts o = tg_optim_defaults(TG_OPTIM_SGD);
    o.lr = 0.1, o.momentum = 0.9, o.dampening = 0.5;
    expect_steps(o, 3, (const double[][2]){{0.95, 2.1}, {0.88, 2.24}, {0.792, 2.416}});
}

/* Adam lr 0.1 with a constant gradient: m_t = (1 - .9^t) g and
 * v_t = (1 - .999^t) g^2, so the bias-corrected step is always
 * .1 * g / (|g| + 1e-8): p[0] moves by -.1 * .5/.50000001 = -.099999998,
 * p[1] by +.1 * 1/1.00000001 = +.099999999 (to 1e-16):
 * p_k = [1 - .099999998k, 2 + .099999999k] */
Test(optim, adam_constant_gradient_by_hand)
{
    tg_optim_opts o = tg_optim_defaults(TG_OPTIM_ADAM);
    o.lr = 0.1;
    expect_steps(o, 3,
                 (const double[][2]){{0.900000002, 2.099999999},
                                     {0.800000004, 2.199999998},
                                     {0.700000006, 2.299999997}});
}

/* AdamW lr 0.1, wd 0.1: p *= 1 - .01 first, then the Adam step above:
 * p1 = [.99 - .099999998, 1.98 + .099999999] = [.890000002, 2.079999999]
 * p2 = [.99 * .890000002 - .099999998, .99 * 2.079999999 + .099999999]
 *    = [.78110000398, 2.15919999801]
 * p3 = [.99 * .78110000398 - .099999998, .99 * 2.15919999801 + .099999999]
 *    = [.6732890059402, 2.2376079970299] */
Test(optim, adamw_decoupled_decay_by_hand)
{
    tg_optim_opts o = tg_optim_defaults(TG_OPTIM_ADAMW);
    o.lr = 0.1, o.weight_decay = 0.1;
    expect_steps(o, 3,
                 (const double[][2]){{0.890000002, 2.079999999},
                                     {0.78110000398, 2.15919999801},
                                     {0.6732890059402, 2.2376079970299}});
}

/* Adam lr 0.1 with L2 weight decay 0.1 (g1 = g + .1 p), two steps:
 * 1: g1 = [.6, -.8]; the first step is .1 g1/(|g1| + 1e-8):
 *    p1 = [1 - .1 * .6/.60000001, 2 + .1 * .8/.80000001]
 *       = [.9000000016666667, 2.09999999875]
 * 2: g2 = g + .1 p1 = [.59000000016666667, -.79000000012500000];
 *    m = .09 g1 + .1 g2 = [.113, -.151] (+1e-11 terms), v = .000999 g1^2 + .001 g2^2
 *    = [.00070774, .00126346] (+...), bc1 = .19, bc2 = .001999;
 *    p2 = p1 - (.1/.19) m / (sqrt(v/.001999) + 1e-8) = [.80004734048833, 2.19996523331594]
 *    (evaluated to 40 digits with Python's decimal module) */
Test(optim, adam_l2_weight_decay_by_hand)
{
    tg_optim_opts o = tg_optim_defaults(TG_OPTIM_ADAM);
    o.lr = 0.1, o.weight_decay = 0.1;
    expect_steps(o, 2,
                 (const double[][2]){{0.9000000016666667, 2.09999999875},
                                     {0.80004734048833082, 2.1999652333159374}});
}

/* RMSprop lr .01, alpha .99: s1 = .01 g^2, avg = .1|g| + 1e-8, so
 * p1 = p - .01 g/(.1|g| + 1e-8) = [1 - .05/.05000001, 2 + .01/.10000001]
 *    = [.90000001999999600, 2.0999999900000010];
 * s2 = .0199 g^2, avg = sqrt(.0199)|g| + 1e-8 = [.0705336798..., .1410673597...]:
 * p2 = p1 - .01 g/avg = [.82911190954941227, 2.1708881054757092] */
Test(optim, rmsprop_by_hand)
{
    tg_optim_opts o = tg_optim_defaults(TG_OPTIM_RMSPROP);
    expect_steps(o, 2,
                 (const double[][2]){{0.900000019999996, 2.099999990000001},
                                     {0.82911190954941227, 2.1708881054757092}});
}

/* RMSprop centered, alpha .9, momentum .9, lr .01:
 * 1: s = .1 g^2, a = .1 g, s - a^2 = .09 g^2, avg = .3|g| + 1e-8,
 *    buf = g/avg = [.5/.15000001, -1/.30000001] = [3.3333331111, -3.3333332222]
 *    p1 = p - .01 buf = [.96666666888889, 2.03333333222222]
 * 2: s = .19 g^2, a = .19 g, s - a^2 = .1539 g^2, avg = sqrt(.1539)|g| + 1e-8,
 *    g/avg = ±1/sqrt(.1539) (less 1e-8 terms) = ±2.549063..., buf = .9 buf1 + g/avg
 *    = [5.549063..., -5.549063...],
 *    p2 = p1 - .01 buf = [.91117603509170, 2.08882396766918] */
Test(optim, rmsprop_centered_momentum_by_hand)
{
    tg_optim_opts o = tg_optim_defaults(TG_OPTIM_RMSPROP);
    o.alpha = 0.9, o.momentum = 0.9, o.centered = true;
    expect_steps(o, 2,
                 (const double[][2]){{0.96666666888888875, 2.0333333322222225},
                                     {0.91117603509170464, 2.0888239676691787}});
}

Test(optim, bad_options_fail_with_invalid)
{
    tg_params *ps = tg_params_new();
    tg_optim_opts o = tg_optim_defaults(TG_OPTIM_SGD);
    o.nesterov = true; /* without momentum */
    cr_expect_null(tg_optim_new(ps, &o));
    cr_expect_eq(tg_last_error(), TG_ERR_INVALID);
    cr_expect(strstr(tg_last_error_message(), "Nesterov") != NULL);
    o = tg_optim_defaults(TG_OPTIM_ADAM);
    o.beta1 = 1.0;
    cr_expect_null(tg_optim_new(ps, &o));
    cr_expect(strstr(tg_last_error_message(), "beta1") != NULL);
    o = tg_optim_defaults(TG_OPTIM_RMSPROP);
    o.lr = -1;
    cr_expect_null(tg_optim_new(ps, &o));
    cr_expect_null(tg_optim_new(NULL, NULL));
    cr_expect_eq(tg_last_error(), TG_ERR_NULL);
    tg_optim *opt = tg_optim_new(ps, NULL);
    cr_assert_not_null(opt);
    cr_expect_eq(tg_optim_kind_of(opt), TG_OPTIM_SGD);
    cr_expect_eq(tg_optim_set_lr(opt, NAN), TG_ERR_INVALID);
    cr_expect_eq(tg_optim_set_lr(opt, 0.25), TG_OK);
    cr_expect_eq(tg_optim_lr(opt), 0.25);
    cr_expect_eq(tg_optim_options(opt).lr, 0.25);
    tg_error_clear();
    tg_optim_free(opt);
    tg_params_free(ps);
}

/* A parameter no backward reached keeps its value, its state and its step
 * count (PyTorch skips params whose .grad is None); one added after the
 * optimizer was made is picked up with fresh state. */
Test(optim, parameters_without_gradient_are_skipped_and_late_ones_picked_up)
{
    tg_params *ps = tg_params_new();
    tg_tensor *a = tg_params_add(ps, "a", TG_F64, 1, (int64_t[]){2});
    tg_tensor *b = tg_params_add(ps, "b", TG_F64, 1, (int64_t[]){2});
    tg_init_constant(a, 1.0);
    tg_init_constant(b, 1.0);
    tg_optim_opts o = tg_optim_defaults(TG_OPTIM_ADAMW);
    o.lr = 0.1, o.weight_decay = 0.1;
    tg_optim *opt = tg_optim_new(ps, &o);
    tg_tensor *c = tg_params_add(ps, "c", TG_F64, 1, (int64_t[]){2});
    tg_init_constant(c, 1.0);
    tg_tape *tape = tg_tape_new(NULL);
    tg_params_requires_grad(ps, tape);
    tg_scope_begin();
    cr_assert_eq(tg_backward(tg_add(tg_sum(a), tg_sum(c))), TG_OK);
    tg_scope_end();
    cr_assert_eq(tg_optim_step(opt), TG_OK, "%s", tg_last_error_message());
    double va, vb, vc;
    tg_tensor_get(a, 0, &va);
    tg_tensor_get(b, 0, &vb);
    tg_tensor_get(c, 0, &vc);
    /* AdamW step with g = 1: p = .99 - .1/(1 + 1e-8) */
    double want = 0.99 - 0.1 / (1.0 + 1e-8);
    cr_expect(fabs(va - want) < 1e-15, "a %.17g", va);
    cr_expect_eq(vb, 1.0, "b has no gradient: no decay either");
    cr_expect(fabs(vc - want) < 1e-15, "c %.17g", vc);
    tg_tape_free(tape);
    tg_optim_free(opt);
    tg_params_free(ps);
}

/* Two equal micro-batches with mean losses, accumulated and scaled by 1/2,
 * give the full-batch gradient and the same SGD step. */
Test(optim, gradient_accumulation_matches_the_full_batch)
{
    const double xs[4][3] = {{1, 2, 3}, {-1, 0.5, 2}, {0.25, -2, 1}, {3, 1, -1}};
    const double ys[4] = {1, -2, 0.5, 3};
    double after[2][3];
    for (int mode = 0; mode < 2; mode++) {
        tg_params *ps = tg_params_new();
        tg_tensor *w = tg_params_add(ps, "w", TG_F64, 2, (int64_t[]){3, 1});
        tg_init_constant(w, 0.5);
        tg_optim_opts o = tg_optim_defaults(TG_OPTIM_SGD);
        o.lr = 0.05;
        tg_optim *opt = tg_optim_new(ps, &o);
        tg_tape *tape = tg_tape_new(NULL);
        tg_params_requires_grad(ps, tape);
        tg_optim_zero_grad(opt);
        int k = mode == 0 ? 1 : 2, rows = 4 / k;
        for (int m = 0; m < k; m++) {
            tg_scope_begin();
            tg_tensor *x = tg_tensor_from_data(TG_F64, 2, (int64_t[]){rows, 3}, xs[m * rows]);
            tg_tensor *y = tg_tensor_from_data(TG_F64, 2, (int64_t[]){rows, 1}, &ys[m * rows]);
            cr_assert_eq(tg_backward(tg_mse_loss(tg_matmul(x, w), y)), TG_OK);
            tg_scope_end();
            tg_tape_reset(tape); /* leaves keep their gradients */
        }
        cr_assert_eq(tg_optim_accumulate_scale(opt, k), TG_OK);
        cr_assert_eq(tg_optim_step(opt), TG_OK);
        memcpy(after[mode], tg_tensor_data(w), sizeof after[mode]);
        cr_expect_eq(tg_optim_accumulate_scale(opt, 0), TG_ERR_INVALID);
        tg_tape_free(tape);
        tg_optim_free(opt);
        tg_params_free(ps);
    }
    for (int i = 0; i < 3; i++)
        cr_expect(fabs(after[0][i] - after[1][i]) < 1e-14, "w[%d]: %.17g vs %.17g", i, after[0][i],
                  after[1][i]);
    cr_expect(after[0][0] != 0.5, "the step moved w");
    tg_error_clear();
}

Test(optim, f32_parameters_follow_the_f64_trajectory)
{
    double want[3][2];
    tg_optim_opts o = tg_optim_defaults(TG_OPTIM_ADAM);
    o.lr = 0.1, o.weight_decay = 0.1;
    const_grad_run(o, 3, want);
    tg_params *ps = tg_params_new();
    tg_tensor *p = tg_params_add(ps, "p", TG_F32, 1, (int64_t[]){2});
    float *pd = tg_tensor_data(p);
    pd[0] = 1.0f, pd[1] = 2.0f;
    tg_tensor *g = tg_tensor_from_data(TG_F32, 1, (int64_t[]){2}, (float[]){0.5f, -1.0f});
    tg_optim *opt = tg_optim_new(ps, &o);
    tg_tape *tape = tg_tape_new(NULL);
    tg_params_requires_grad(ps, tape);
    for (int k = 0; k < 3; k++) {
        tg_optim_zero_grad(opt);
        tg_scope_begin();
        tg_backward(tg_sum(tg_mul(p, g)));
        tg_scope_end();
        tg_tape_reset(tape);
        cr_assert_eq(tg_optim_step(opt), TG_OK);
        for (int i = 0; i < 2; i++)
            cr_expect(fabs(pd[i] - want[k][i]) < 1e-6, "step %d: %g vs %g", k + 1, pd[i],
                      want[k][i]);
    }
    tg_tape_free(tape);
    tg_tensor_release(g);
    tg_optim_free(opt);
    tg_params_free(ps);
}

/* ---- Schedules */
static double at(tg_lr_schedule s, int64_t step)
{
    return tg_lr_schedule_at(&s, step);
}

#define NEAR(a, b) (fabs((a) - (b)) < 1e-15)

/* StepLR(step_size 3, gamma .5) from 0.1: .1 for steps 0-2, .05 for 3-5,
 * .025 at 6. */
Test(optim, step_decay_schedule)
{
    tg_lr_schedule s = {.base_lr = 0.1, .decay = TG_LR_STEP, .step_size = 3, .gamma = 0.5};
    cr_expect(NEAR(at(s, 0), 0.1) && NEAR(at(s, 2), 0.1));
    cr_expect(NEAR(at(s, 3), 0.05) && NEAR(at(s, 5), 0.05));
    cr_expect(NEAR(at(s, 6), 0.025));
    s.step_size = 0;
    cr_expect_eq(at(s, 1), -1.0);
    cr_expect_eq(tg_last_error(), TG_ERR_INVALID);
    tg_error_clear();
}

/* Cosine from 1 to eta_min .1 over t_max 10: .1 + .9 (1 + cos(pi t/10))/2:
 * t=0: 1, t=5: .55, t=10: .1, held at .1 afterwards; t=2.5 would be
 * .1 + .45 (1 + cos(pi/4)). */
Test(optim, cosine_schedule)
{
    tg_lr_schedule s = {.base_lr = 1.0, .decay = TG_LR_COSINE, .t_max = 10, .eta_min = 0.1};
    cr_expect(NEAR(at(s, 0), 1.0));
    cr_expect(NEAR(at(s, 5), 0.55), "%.17g", at(s, 5));
    cr_expect(NEAR(at(s, 10), 0.1));
    cr_expect(NEAR(at(s, 25), 0.1));
    cr_expect(NEAR(at(s, 2), 0.1 + 0.45 * (1.0 + cos(3.14159265358979323846 / 5))));
}

/* Warmup 4 steps from factor .25 to base .2, then cosine over 8 steps to 0:
 * steps 0..3: .2 (.25 + .75 k/4) = .05, .0875, .125, .1625; step 4 (cosine
 * t=0): .2; step 8 (t=4): .1; step 12 (t=8): 0. */
Test(optim, warmup_then_cosine_schedule_sets_the_optimizer_lr)
{
    tg_lr_schedule s = {.base_lr = 0.2,
                        .warmup_steps = 4,
                        .warmup_start_factor = 0.25,
                        .decay = TG_LR_COSINE,
                        .t_max = 8};
    const double want[] = {0.05, 0.0875, 0.125, 0.1625, 0.2};
    for (int k = 0; k < 5; k++)
        cr_expect(NEAR(at(s, k), want[k]), "step %d: %g", k, at(s, k));
    cr_expect(NEAR(at(s, 8), 0.1));
    cr_expect(NEAR(at(s, 12), 0.0));
    tg_params *ps = tg_params_new();
    tg_params_add(ps, "w", TG_F64, 0, NULL);
    tg_optim *opt = tg_optim_new(ps, NULL);
    for (int k = 0; k < 5; k++) {
        cr_assert_eq(tg_optim_schedule(opt, &s), TG_OK);
        cr_expect(NEAR(tg_optim_lr(opt), want[k]), "step %d: lr %g", k, tg_optim_lr(opt));
        cr_assert_eq(tg_optim_step(opt), TG_OK);
    }
    cr_expect_eq(tg_optim_step_count(opt), 5);
    tg_optim_free(opt);
    tg_params_free(ps);
}

/* ---- PyTorch golden trajectories */
typedef struct golden {
    char *text, *cur;
} golden;

static char *tok(golden *g)
{
    char *t = strtok_r(g->cur, " \n", &g->cur);
    cr_assert_not_null(t, "golden file ended early");
    return t;
}

static double num(golden *g)
{
    char *end, *t = tok(g);
    double v = strtod(t, &end);
    cr_assert(*end == '\0', "bad number '%s'", t);
    return v;
}

static void expect_word(golden *g, const char *w)
{
    char *t = tok(g);
    cr_assert_str_eq(t, w);
}

/* Reads "tensor <name> f64 ndim dims... \n values" into a new tensor. */
static tg_tensor *read_tensor(golden *g, const char *name)
{
    expect_word(g, "tensor");
    expect_word(g, name);
    expect_word(g, "f64");
    int ndim = (int)num(g);
    int64_t shape[8], n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d] = (int64_t)num(g);
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = num(g);
    tg_tensor *t = tg_tensor_from_data(TG_F64, ndim, shape, v);
    free(v);
    return t;
}

static void parse_opts(golden *g, tg_optim_opts *o)
{
    expect_word(g, "opts");
    expect_word(g, "kind");
    const char *kinds[] = {"sgd", "adam", "adamw", "rmsprop"};
    char *k = tok(g);
    int kind = -1;
    for (int i = 0; i < 4; i++)
        if (!strcmp(k, kinds[i])) kind = i;
    cr_assert(kind >= 0, "unknown kind %s", k);
    *o = tg_optim_defaults((tg_optim_kind)kind);
    struct {
        const char *key;
        double *d;
        bool *b;
    } f[] = {{"lr", &o->lr, NULL},
             {"weight_decay", &o->weight_decay, NULL},
             {"momentum", &o->momentum, NULL},
             {"dampening", &o->dampening, NULL},
             {"nesterov", NULL, &o->nesterov},
             {"beta1", &o->beta1, NULL},
             {"beta2", &o->beta2, NULL},
             {"eps", &o->eps, NULL},
             {"amsgrad", NULL, &o->amsgrad},
             {"alpha", &o->alpha, NULL},
             {"centered", NULL, &o->centered}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        expect_word(g, f[i].key);
        double v = num(g);
        if (f[i].d)
            *f[i].d = v;
        else
            *f[i].b = v != 0.0;
    }
}

static void expect_close(const char *what, int step, tg_tensor *t, golden *g)
{
    for (int64_t i = 0; i < tg_tensor_numel(t); i++) {
        double got, want = num(g);
        tg_tensor_get(t, i, &got);
        cr_expect(fabs(got - want) <= 1e-10 * fmax(fabs(want), 1e-3),
                  "%s[%lld] after step %d: got %.17g, torch %.17g", what, (long long)i, step, got,
                  want);
    }
}

static void run_golden(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.txt", GOLDEN_OPTIM_DIR, name);
    FILE *fp = fopen(path, "rb");
    cr_assert_not_null(fp, "cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    rewind(fp);
    golden g = {.text = malloc((size_t)len + 1)};
    cr_assert_eq(fread(g.text, 1, (size_t)len, fp), (size_t)len);
    fclose(fp);
    g.text[len] = '\0';
    g.cur = g.text;
    expect_word(&g, "optim");
    expect_word(&g, name);
    tg_optim_opts o;
    parse_opts(&g, &o);
    tg_tensor *x = read_tensor(&g, "x"), *y = read_tensor(&g, "y");
    tg_tensor *w0 = read_tensor(&g, "W"), *b0 = read_tensor(&g, "b");
    tg_params *ps = tg_params_new();
    tg_tensor *W = tg_params_add(ps, "W", TG_F64, 2, tg_tensor_shape(w0));
    tg_tensor *b = tg_params_add(ps, "b", TG_F64, 1, tg_tensor_shape(b0));
    tg_tensor_copy_out(w0, tg_tensor_data(W), 12 * sizeof(double));
    tg_tensor_copy_out(b0, tg_tensor_data(b), 3 * sizeof(double));
    tg_optim *opt = tg_optim_new(ps, &o);
    cr_assert_not_null(opt, "%s", tg_last_error_message());
    tg_tape *tape = tg_tape_new(NULL);
    tg_params_requires_grad(ps, tape);
    for (int step = 1; step <= 10; step++) {
        expect_word(&g, "step");
        cr_assert_eq((int)num(&g), step);
        expect_word(&g, "loss");
        double want_loss = num(&g), loss_v;
        tg_optim_zero_grad(opt);
        tg_scope_begin();
        tg_tensor *loss = tg_mse_loss(tg_add(tg_matmul(x, tg_transpose(W, 0, 1)), b), y);
        cr_assert_not_null(loss, "%s", tg_last_error_message());
        tg_tensor_item(loss, &loss_v);
        cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
        tg_scope_end();
        tg_tape_reset(tape);
        cr_expect(fabs(loss_v - want_loss) <= 1e-10 * fabs(want_loss),
                  "loss at step %d: %.17g "
                  "vs torch %.17g",
                  step, loss_v, want_loss);
        cr_assert_eq(tg_optim_step(opt), TG_OK, "%s", tg_last_error_message());
        expect_word(&g, "W");
        expect_close("W", step, W, &g);
        expect_word(&g, "b");
        expect_close("b", step, b, &g);
    }
    tg_tape_free(tape);
    tg_optim_free(opt);
    tg_params_free(ps);
    tg_tensor_release(x);
    tg_tensor_release(y);
    tg_tensor_release(w0);
    tg_tensor_release(b0);
    free(g.text);
}

#define GOLDEN_OPTIMS(X)                                                                           \
    X(adam)                                                                                        \
    X(adam_l2_amsgrad) X(adamw) X(adamw_amsgrad) X(sgd_nesterov_wd) X(sgd_momentum_dampening)      \
        X(rmsprop) X(rmsprop_centered_momentum)

#define GOLDEN_TEST(name)                                                                          \
    Test(optim, name##_matches_torch_over_10_steps)                                                \
    {                                                                                              \
        run_golden(#name);                                                                         \
    }
GOLDEN_OPTIMS(GOLDEN_TEST)

/* Every file in the directory has a test above. */
Test(optim, every_golden_file_has_a_test)
{
#define GOLDEN_NAME(name) #name ".txt",
    const char *names[] = {GOLDEN_OPTIMS(GOLDEN_NAME)};
    DIR *d = opendir(GOLDEN_OPTIM_DIR);
    cr_assert_not_null(d);
    int files = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n < 4 || strcmp(e->d_name + n - 4, ".txt")) continue;
        files++;
        bool known = false;
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            known |= !strcmp(names[i], e->d_name);
        cr_expect(known, "%s has no test", e->d_name);
    }
    closedir(d);
    cr_expect_eq(files, (int)(sizeof names / sizeof names[0]));
}

/* A run of parameters large enough to be split across the elementwise pool
 * updates to the same bits as on one thread, for every kind. */
Test(optim, split_step_matches_one_thread_bitwise)
{
    int prev = tg_num_threads();
    for (int kind = 0; kind < TG_OPTIM_KIND_COUNT; kind++) {
        float *out[2];
        for (int run = 0; run < 2; run++) {
            cr_assert_eq(tg_set_num_threads(run ? 2 : 1), TG_OK);
            tg_rng rng;
            tg_rng_seed(&rng, 3);
            tg_params *ps = tg_params_new();
            tg_tensor *w = tg_params_add(ps, "w", TG_F32, 2, (int64_t[]){700, 300});
            cr_assert_eq(tg_init_normal(w, &rng, 0, 1), TG_OK);
            tg_optim_opts o = tg_optim_defaults((tg_optim_kind)kind);
            o.momentum = kind == TG_OPTIM_SGD || kind == TG_OPTIM_RMSPROP ? 0.9 : 0;
            tg_optim *opt = tg_optim_new(ps, &o);
            tg_tape *tape = tg_tape_new(NULL);
            tg_params_requires_grad(ps, tape);
            for (int s = 0; s < 3; s++) {
                tg_scope_begin();
                cr_assert_eq(tg_backward(tg_sum(tg_mul(tg_tanh(w), w))), TG_OK);
                cr_assert_eq(tg_optim_step(opt), TG_OK);
                tg_optim_zero_grad(opt);
                tg_scope_end();
                tg_tape_reset(tape);
            }
            out[run] = malloc(700 * 300 * sizeof(float));
            cr_assert_eq(tg_tensor_copy_out(w, out[run], 700 * 300 * sizeof(float)), TG_OK);
            tg_tape_free(tape);
            tg_optim_free(opt);
            tg_params_free(ps);
        }
        cr_assert_eq(memcmp(out[0], out[1], 700 * 300 * sizeof(float)), 0, "kind %d", kind);
        free(out[0]);
        free(out[1]);
    }
    tg_set_num_threads(prev);
}
