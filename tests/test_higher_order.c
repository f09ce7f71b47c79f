/* Second-order and functional autodiff: create_graph, tg_grad_of, retain,
 * the functional helpers, gradgradcheck, and their misuse. Values are
 * checked against closed forms and against central differences of
 * first-order gradients, in f64. */
#include <math.h>
#include <string.h>

#include "test_util.h"

TestSuite(higher_order, .init = tu_scope_setup, .fini = tu_scope_teardown);

static const tg_tape_opts policies[4] = {
    {.policy = TG_CHECKPOINT_NONE},
    {.policy = TG_CHECKPOINT_BALANCED},
    {.policy = TG_CHECKPOINT_BUDGET, .budget_bytes = 1 << 20},
    {.policy = TG_CHECKPOINT_NONE, .plain_backward = true},
};

/* f(x) = sum(tanh(x) * exp(x)): f' = (1 - t^2) e + t e,
 * f'' = -2 t (1 - t^2) e + 2 (1 - t^2) e + t e. */
static double fprime(double v)
{
    double t = tanh(v), e = exp(v);
    return (1 - t * t) * e + t * e;
}

static double fsecond(double v)
{
    double t = tanh(v), e = exp(v), d = 1 - t * t;
    return -2 * t * d * e + 2 * d * e + t * e;
}

Test(higher_order, second_derivative_of_a_composite_matches_the_closed_form_under_every_policy)
{
    const double xs[4] = {0.3, -0.7, 1.2, 0.05};
    for (int p = 0; p < 4; p++) {
        tg_tape *tape = tg_tape_new(&policies[p]);
        tg_tensor *x = T64((4), 0.3, -0.7, 1.2, 0.05);
        cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
        tg_tensor *y = tg_sum(tg_mul(tg_tanh(x), tg_exp(x))), *g, *h;
        tg_grad_opts o = {.create_graph = true};
        cr_assert_eq(tg_grad_of(1, &y, NULL, 1, &x, &g, &o), TG_OK, "%s", tg_last_error_message());
        cr_assert(tg_tensor_requires_grad(g), "create_graph must return a tracked gradient");
        tg_tensor *s = tg_sum(g);
        cr_assert_eq(tg_grad_of(1, &s, NULL, 1, &x, &h, NULL), TG_OK, "%s", tg_last_error_message());
        cr_assert_not(tg_tensor_requires_grad(h));
        double *gv = tu_values(g), *hv = tu_values(h);
        for (int i = 0; i < 4; i++) {
            cr_assert_float_eq(gv[i], fprime(xs[i]), 1e-13, "policy %d f'(%g)", p, xs[i]);
            cr_assert_float_eq(hv[i], fsecond(xs[i]), 1e-13, "policy %d f''(%g)", p, xs[i]);
        }
        free(gv);
        free(hv);
        /* tg_grad_of accumulates into no leaf */
        cr_assert_null(tg_grad(x));
        cr_assert_eq(tg_last_error(), TG_ERR_NO_GRAD);
        tg_error_clear();
        tg_tape_free(tape);
    }
}

/* Regression (found by the torch HVP goldens): x's gradient gets an
 * untracked constant, contiguous and held by the sweep alone, from sum(3 x)
 * first (recorded last, swept first), then a tracked 2 x c from the product.
 * The in-place accumulation must not absorb the tracked one into the
 * constant: d/dx <grad, v> = 2 c v, not 0. Under every policy, through
 * tg_grad_of and through tg_backward_ex's leaf gradient. */
Test(higher_order, a_tracked_contribution_added_to_a_constant_gradient_stays_tracked)
{
    const double xs[3] = {0.5, -1.0, 2.0}, cs[3] = {1.5, 2.0, -0.5}, vs[3] = {1.0, -2.0, 0.25};
    for (int p = 0; p < 4; p++) {
        for (int leafpath = 0; leafpath < 2; leafpath++) {
            tg_tape *tape = tg_tape_new(&policies[p]);
            tg_tensor *x = T64((3), 0.5, -1.0, 2.0), *c = T64((3), 1.5, 2.0, -0.5);
            tg_tensor *v = T64((3), 1.0, -2.0, 0.25);
            cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
            tg_tensor *a = tg_sum(tg_mul(tg_mul(x, x), c));
            tg_tensor *b = tg_sum(tg_mul_scalar(x, 3.0));
            tg_tensor *y = tg_add(a, b), *g = NULL, *h = NULL;
            tg_grad_opts o = {.create_graph = true};
            if (leafpath) {
                cr_assert_eq(tg_backward_ex(y, NULL, &o), TG_OK, "%s", tg_last_error_message());
                g = tg_grad(x);
            } else {
                cr_assert_eq(tg_grad_of(1, &y, NULL, 1, &x, &g, &o), TG_OK, "%s",
                             tg_last_error_message());
            }
            cr_assert(g && tg_tensor_requires_grad(g), "policy %d path %d: untracked gradient", p,
                      leafpath);
            tg_tensor *s = tg_sum(tg_mul(g, v));
            cr_assert_eq(tg_grad_of(1, &s, NULL, 1, &x, &h, NULL), TG_OK, "%s",
                         tg_last_error_message());
            double *gv = tu_values(g), *hv = tu_values(h);
            for (int i = 0; i < 3; i++) {
                cr_expect_float_eq(gv[i], 2 * xs[i] * cs[i] + 3, 1e-15, "policy %d grad[%d]", p,
                                   i);
                cr_expect_float_eq(hv[i], 2 * cs[i] * vs[i], 1e-15, "policy %d hvp[%d]", p, i);
            }
            free(gv);
            free(hv);
            tg_tape_free(tape);
        }
    }
}

Test(higher_order, third_derivative_by_three_sweeps)
{
    /* f = sum(x^4 / 4): f''' = 6 x */
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = T64((3), 0.5, -1.5, 2.0);
    tg_requires_grad(tape, x);
    tg_tensor *y = tg_sum(tg_mul_scalar(tg_pow_scalar(x, 4.0), 0.25)), *g1, *g2, *g3;
    tg_grad_opts o = {.create_graph = true};
    cr_assert_eq(tg_grad_of(1, &y, NULL, 1, &x, &g1, &o), TG_OK, "%s", tg_last_error_message());
    tg_tensor *s1 = tg_sum(g1);
    cr_assert_eq(tg_grad_of(1, &s1, NULL, 1, &x, &g2, &o), TG_OK, "%s", tg_last_error_message());
    tg_tensor *s2 = tg_sum(g2);
    cr_assert_eq(tg_grad_of(1, &s2, NULL, 1, &x, &g3, NULL), TG_OK, "%s", tg_last_error_message());
    tu_expect_values(g1, VALS(0.125, -3.375, 8.0), 3, 1e-14);
    tu_expect_values(g2, VALS(0.75, 6.75, 12.0), 3, 1e-14);
    tu_expect_values(g3, VALS(3.0, -9.0, 12.0), 3, 1e-14);
    tg_tape_free(tape);
}

/* A small MLP with a softmax cross-entropy loss, as the function of its
 * two weights (x, targets fixed): built by hand so that the same graph can
 * be recorded under each policy. */
typedef struct {
    tg_tensor *x, *t;
} mlp_data;

static tg_tensor *mlp_loss(void *ud, int n, tg_tensor *const *w)
{
    (void)n;
    mlp_data *d = ud;
    tg_tensor *h = tg_tanh(tg_matmul(d->x, w[0]));
    tg_tensor *z = tg_matmul(h, w[1]);
    return tg_add(tg_sum(tg_mul(z, z)), tg_sum(tg_sigmoid(z)));
}

static void mlp_setup(mlp_data *d, tg_tensor **w)
{
    tg_rng r;
    tg_rng_seed(&r, 5);
    d->x = tg_rand_uniform(&r, TG_F64, 2, SHAPE(4, 3), -1.0, 1.0);
    d->t = NULL;
    w[0] = tg_rand_uniform(&r, TG_F64, 2, SHAPE(3, 5), -0.8, 0.8);
    w[1] = tg_rand_uniform(&r, TG_F64, 2, SHAPE(5, 2), -0.8, 0.8);
}

/* HVP of mlp_loss at w along v, recorded with tape options o. */
static void mlp_hvp_seg(const tg_tape_opts *o, bool seg, mlp_data *d, tg_tensor *const *w0,
                        tg_tensor *const *v, double **out);

static void mlp_hvp(const tg_tape_opts *o, mlp_data *d, tg_tensor *const *w0, tg_tensor *const *v,
                    double **out)
{
    mlp_hvp_seg(o, false, d, w0, v, out);
}

/* seg: the forward inside one checkpoint segment. */
static void mlp_hvp_seg(const tg_tape_opts *o, bool seg, mlp_data *d, tg_tensor *const *w0,
                        tg_tensor *const *v, double **out)
{
    tg_tape *tape = tg_tape_new(o);
    tg_tensor *w[2];
    for (int i = 0; i < 2; i++) {
        w[i] = tg_detach(w0[i]);
        cr_assert_eq(tg_requires_grad(tape, w[i]), TG_OK);
    }
    if (seg) tg_checkpoint_begin(tape);
    tg_tensor *y = mlp_loss(d, 2, w), *g[2], *hv[2];
    if (seg) tg_checkpoint_end(tape);
    tg_grad_opts go = {.create_graph = true};
    cr_assert_eq(tg_grad_of(1, &y, NULL, 2, w, g, &go), TG_OK, "%s", tg_last_error_message());
    tg_tensor *s = tg_add(tg_sum(tg_mul(g[0], v[0])), tg_sum(tg_mul(g[1], v[1])));
    cr_assert_eq(tg_grad_of(1, &s, NULL, 2, w, hv, NULL), TG_OK, "%s", tg_last_error_message());
    out[0] = tu_values(hv[0]);
    out[1] = tu_values(hv[1]);
    tg_tape_free(tape);
}

Test(higher_order, hvp_of_an_mlp_is_bitwise_equal_across_policies_and_matches_differences)
{
    mlp_data d;
    tg_tensor *w[2], *v[2];
    mlp_setup(&d, w);
    tg_rng r;
    tg_rng_seed(&r, 9);
    v[0] = tg_rand_uniform(&r, TG_F64, 2, SHAPE(3, 5), -1.0, 1.0);
    v[1] = tg_rand_uniform(&r, TG_F64, 2, SHAPE(5, 2), -1.0, 1.0);
    double *ref[2];
    mlp_hvp(&policies[0], &d, w, v, ref);
    for (int p = 1; p < 5; p++) {
        double *got[2];
        /* p == 4: NONE with the forward in a checkpoint segment */
        mlp_hvp_seg(&policies[p % 4], p == 4, &d, w, v, got);
        cr_assert(memcmp(got[0], ref[0], 15 * sizeof(double)) == 0 &&
                      memcmp(got[1], ref[1], 10 * sizeof(double)) == 0,
                  "policy %d: HVP differs from NONE's", p);
        free(got[0]);
        free(got[1]);
    }
    /* Against (grad(w + eps v) - grad(w - eps v)) / 2 eps, the gradients by
     * first-order tg_vjp. */
    const double eps = 1e-5;
    tg_tensor *gp[2], *gm[2], *wp[2], *wm[2];
    for (int i = 0; i < 2; i++) {
        wp[i] = tg_add(w[i], tg_mul_scalar(v[i], eps));
        wm[i] = tg_sub(w[i], tg_mul_scalar(v[i], eps));
    }
    cr_assert_eq(tg_vjp(mlp_loss, &d, 2, wp, NULL, NULL, gp), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_vjp(mlp_loss, &d, 2, wm, NULL, NULL, gm), TG_OK, "%s", tg_last_error_message());
    for (int i = 0; i < 2; i++) {
        double *a = tu_values(gp[i]), *b = tu_values(gm[i]);
        for (int k = 0; k < (i ? 10 : 15); k++) {
            double fd = (a[k] - b[k]) / (2 * eps);
            cr_assert(fabs(fd - ref[i][k]) <= 1e-7 * fmax(1.0, fabs(fd)),
                      "w%d[%d]: HVP %.12g, differences %.12g", i, k, ref[i][k], fd);
        }
        free(a);
        free(b);
        free(ref[i]);
    }
    /* tg_hvp gives the same bits as the hand-written double sweep */
    tg_tensor *hv[2];
    cr_assert_eq(tg_hvp(mlp_loss, &d, 2, w, v, NULL, hv), TG_OK, "%s", tg_last_error_message());
    double *again[2];
    mlp_hvp(&policies[0], &d, w, v, again);
    double *h0 = tu_values(hv[0]), *h1 = tu_values(hv[1]);
    cr_assert(memcmp(h0, again[0], 15 * sizeof(double)) == 0 &&
              memcmp(h1, again[1], 10 * sizeof(double)) == 0);
    free(h0);
    free(h1);
    free(again[0]);
    free(again[1]);
}

Test(higher_order, create_graph_backward_gives_tracked_leaf_gradients_that_backward_again)
{
    /* f = sum(x^3): after backward(create_graph) x.grad = 3x^2 (tracked);
     * backward(sum(x.grad)) then adds 6x into it: 3x^2 + 6x. */
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = T64((3), 1.0, -2.0, 0.5);
    tg_requires_grad(tape, x);
    tg_tensor *y = tg_sum(tg_mul(tg_mul(x, x), x));
    tg_grad_opts o = {.create_graph = true};
    cr_assert_eq(tg_backward_ex(y, NULL, &o), TG_OK, "%s", tg_last_error_message());
    tg_tensor *g = tg_grad(x);
    cr_assert(tg_tensor_requires_grad(g));
    tu_expect_values(g, VALS(3.0, 12.0, 0.75), 3, 1e-15);
    tg_tensor *gs = tg_sum(g);
    tg_tensor_retain(g); /* the leaf's grad is replaced by the sum below */
    cr_assert_eq(tg_backward(gs), TG_OK, "%s", tg_last_error_message());
    tu_expect_values(tg_grad(x), VALS(3.0 + 6.0, 12.0 - 12.0, 0.75 + 3.0), 3, 1e-15);
    tu_expect_values(g, VALS(3.0, 12.0, 0.75), 3, 1e-15);
    tg_tensor_release(g);
    tg_tape_free(tape);
}

Test(higher_order, gradients_of_interior_tensors_and_several_seeded_outputs)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = T64((2), 0.5, -1.0);
    tg_requires_grad(tape, x);
    tg_tensor *h = tg_mul(x, x);      /* interior */
    tg_tensor *a = tg_sum(tg_exp(h)); /* outputs a and b */
    tg_tensor *b = tg_mul_scalar(h, 3.0);
    tg_tensor *outs[2] = {a, b}, *seeds[2] = {NULL, T64((2), 1.0, 2.0)}, *ins[2] = {h, x}, *gr[2];
    cr_assert_eq(tg_grad_of(2, outs, seeds, 2, ins, gr, NULL), TG_OK, "%s", tg_last_error_message());
    /* d/dh = e^h + 3 seed_b; d/dx = 2x d/dh */
    double dh0 = exp(0.25) + 3.0, dh1 = exp(1.0) + 6.0;
    tu_expect_values(gr[0], VALS(dh0, dh1), 2, 1e-14);
    tu_expect_values(gr[1], VALS(2 * 0.5 * dh0, -2.0 * dh1), 2, 1e-14);
    cr_assert_null(tg_grad(x));
    tg_error_clear();
    tg_tape_free(tape);
}

Test(higher_order, retain_allows_a_second_sweep_and_its_absence_is_stale)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = T64((2), 0.5, -1.0), *g1, *g2;
    tg_requires_grad(tape, x);
    tg_tensor *y = tg_sum(tg_tanh(x));
    tg_grad_opts keep = {.retain = true};
    cr_assert_eq(tg_grad_of(1, &y, NULL, 1, &x, &g1, &keep), TG_OK);
    cr_assert_eq(tg_grad_of(1, &y, NULL, 1, &x, &g2, NULL), TG_OK, "%s", tg_last_error_message());
    double *a = tu_values(g1), *b = tu_values(g2);
    cr_assert(memcmp(a, b, 2 * sizeof(double)) == 0);
    free(a);
    free(b);
    /* the record is gone now: tanh's backward reads its saved output */
    cr_assert_eq(tg_grad_of(1, &y, NULL, 1, &x, &g2, NULL), TG_ERR_STALE);
    tu_expect_message_has("'tanh'");
    cr_assert_null(g2);
    cr_assert_eq(tg_backward(y), TG_ERR_STALE);
    tg_error_clear();
    /* the tape is still usable after a reset */
    tg_tape_reset(tape);
    y = tg_sum(tg_tanh(x));
    cr_assert_eq(tg_backward(y), TG_OK, "%s", tg_last_error_message());
    tg_tape_free(tape);
}

Test(higher_order, nodes_that_save_nothing_are_never_stale)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = T64((3), 1.0, 2.0, 3.0);
    tg_requires_grad(tape, x);
    tg_tensor *y = tg_sum(tg_add_scalar(tg_mul_scalar(x, 2.0), 1.0));
    cr_assert_eq(tg_backward(y), TG_OK);
    cr_assert_eq(tg_backward(y), TG_OK, "%s", tg_last_error_message());
    tu_expect_values(tg_grad(x), VALS(4.0, 4.0, 4.0), 3, 0);
    tg_tape_free(tape);
}

Test(higher_order, tg_grad_of_misuse_gives_specific_codes_and_leaves_the_tape_usable)
{
    tg_tape *tape = tg_tape_new(NULL), *other = tg_tape_new(NULL);
    tg_tensor *x = T64((2), 0.5, -1.0), *z = T64((2), 1.0, 2.0), *u = T64((2), 3.0, 4.0);
    tg_requires_grad(tape, x);
    tg_requires_grad(tape, z);
    tg_requires_grad(other, u);
    tg_tensor *y = tg_sum(tg_tanh(x)), *v = tg_tanh(x), *g[2] = {x, x};
    tg_grad_opts keep = {.retain = true};
    cr_assert_eq(tg_grad_of(0, &y, NULL, 1, &x, g, &keep), TG_ERR_INVALID);
    cr_assert_null(g[0]);
    cr_assert_eq(tg_grad_of(1, NULL, NULL, 1, &x, g, &keep), TG_ERR_INVALID);
    cr_assert_eq(tg_grad_of(1, &y, NULL, 0, &x, g, &keep), TG_ERR_INVALID);
    cr_assert_eq(tg_grad_of(1, &y, NULL, 1, &x, NULL, &keep), TG_ERR_INVALID);
    tg_tensor *nul = NULL;
    cr_assert_eq(tg_grad_of(1, &nul, NULL, 1, &x, g, &keep), TG_ERR_NULL);
    cr_assert_eq(tg_grad_of(1, &y, NULL, 1, &nul, g, &keep), TG_ERR_NULL);
    tg_tensor *c = T64((1), 2.0);
    cr_assert_eq(tg_grad_of(1, &c, NULL, 1, &x, g, &keep), TG_ERR_NO_GRAD);
    cr_assert_eq(tg_grad_of(1, &y, NULL, 1, &c, g, &keep), TG_ERR_NO_GRAD);
    tu_expect_message_has("not tracked");
    cr_assert_eq(tg_grad_of(1, &y, NULL, 1, &u, g, &keep), TG_ERR_TAPE);
    cr_assert_eq(tg_grad_of(1, &v, NULL, 1, &x, g, &keep), TG_ERR_SEED);
    tg_tensor *bad_seed = T64((3), 1, 1, 1), *seeds[1] = {bad_seed};
    cr_assert_eq(tg_grad_of(1, &v, seeds, 1, &x, g, &keep), TG_ERR_SHAPE);
    seeds[0] = T32((2), 1, 1);
    cr_assert_eq(tg_grad_of(1, &v, seeds, 1, &x, g, &keep), TG_ERR_SHAPE);
    /* z is not reached from y */
    tg_tensor *ins[2] = {x, z};
    cr_assert_eq(tg_grad_of(1, &y, NULL, 2, ins, g, &keep), TG_ERR_NO_GRAD);
    tu_expect_message_has("input 1 is not reached");
    cr_assert(g[0] == NULL && g[1] == NULL);
    tg_grad_opts unused = {.retain = true, .allow_unused = true};
    cr_assert_eq(tg_grad_of(1, &y, NULL, 2, ins, g, &unused), TG_OK, "%s", tg_last_error_message());
    tu_expect_values(g[1], VALS(0.0, 0.0), 2, 0);
    /* after all of it the record still sweeps */
    cr_assert_eq(tg_backward(y), TG_OK, "%s", tg_last_error_message());
    double t0 = tanh(0.5), t1 = tanh(-1.0);
    tu_expect_values(tg_grad(x), VALS(1 - t0 * t0, 1 - t1 * t1), 2, 1e-15);
    /* a stale output after a reset */
    tg_tape_reset(tape);
    cr_assert_eq(tg_grad_of(1, &y, NULL, 1, &x, g, NULL), TG_ERR_STALE);
    tg_error_clear();
    tg_tape_free(tape);
    tg_tape_free(other);
}

/* A user op whose backward calls an unmarked op: first order works, a
 * create_graph sweep fails at dispatch naming both. */
static tg_tensor *twice_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    (void)ctx;
    return tg_tensor_retain(tg_mul_scalar(in[0], 2.0));
}

static tg_status plain_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                             tg_spec *out)
{
    (void)op;
    (void)a;
    out->dtype = tg_tensor_dtype(in[0]);
    out->ndim = tg_tensor_ndim(in[0]);
    memcpy(out->shape, tg_tensor_shape(in[0]), (size_t)out->ndim * sizeof(int64_t));
    return TG_OK;
}

static const tg_op opaque_op = {.name = "test_opaque_scale", .arity = 2, .shape = plain_shape,
                                .forward = twice_fwd};

static tg_tensor *scaled_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    (void)ctx;
    return tg_tensor_retain(tg_mul(in[0], in[0]));
}

static tg_status scaled_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    tg_tensor *in[2] = {tg_op_ctx_input(ctx, 0), g};
    gin[0] = tg_op_call(tg_op_find("test_opaque_scale"), 2, in, NULL);
    if (gin[0]) gin[0] = tg_mul(gin[0], in[0]);
    return gin[0] ? TG_OK : tg_last_error();
}

static const tg_op square_op = {.name = "test_square_opaque_bwd", .arity = 1,
                                .shape = plain_shape, .forward = scaled_fwd,
                                .backward = scaled_bwd, .saves = TG_SAVE_INPUT(0)};

Test(higher_order, an_unmarked_op_in_a_recorded_backward_fails_naming_the_forward_op)
{
    cr_assert_eq(tg_op_register(&opaque_op), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_op_register(&square_op), TG_OK, "%s", tg_last_error_message());
    const tg_op *sq = tg_op_find("test_square_opaque_bwd");
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = T64((2), 1.5, -2.0), *g;
    tg_requires_grad(tape, x);
    tg_tensor *in[1] = {x};
    tg_tensor *y = tg_sum(tg_op_call(sq, 1, in, NULL));
    tg_grad_opts o = {.create_graph = true};
    cr_assert_eq(tg_grad_of(1, &y, NULL, 1, &x, &g, &o), TG_ERR_NOT_DIFFERENTIABLE);
    tu_expect_message_has("'test_opaque_scale'");
    tu_expect_message_has("in the backward of 'test_square_opaque_bwd'");
    cr_assert_null(g);
    /* first order still works on the same record (create_graph kept it) */
    cr_assert_eq(tg_grad_of(1, &y, NULL, 1, &x, &g, NULL), TG_OK, "%s", tg_last_error_message());
    tu_expect_values(g, VALS(2 * 1.5 * 1.5, 2 * -2.0 * -2.0), 2, 1e-15);
    tg_tape_free(tape);
}

/* ---- functional helpers */
static tg_tensor *vec_fn(void *ud, int n, tg_tensor *const *x)
{
    (void)ud;
    (void)n;
    /* [x0 x1, sin(x0) + x1^2, exp(x1)] */
    tg_tensor *a = tg_narrow(x[0], 0, 0, 1), *b = tg_narrow(x[0], 0, 1, 1);
    tg_tensor *p[3] = {tg_mul(a, b), tg_add(tg_sin(a), tg_mul(b, b)), tg_exp(b)};
    return tg_concat(3, p, 0);
}

Test(higher_order, jacobian_and_jvp_match_the_closed_form)
{
    const double a = 0.4, b = -0.9;
    tg_tensor *x = T64((2), a, b), *jac, *jv, *y, *vjp;
    cr_assert_eq(tg_jacobian(vec_fn, NULL, 1, &x, &jac), TG_OK, "%s", tg_last_error_message());
    EXPECT(jac, (3, 2), 1e-15, b, a, cos(a), 2 * b, 0.0, exp(b));
    tg_tensor *v = T64((2), 0.3, 2.0);
    cr_assert_eq(tg_jvp(vec_fn, NULL, 1, &x, &v, &y, &jv), TG_OK, "%s", tg_last_error_message());
    EXPECT(jv, (3), 1e-15, 0.3 * b + 2.0 * a, 0.3 * cos(a) + 4.0 * b, 2.0 * exp(b));
    EXPECT(y, (3), 1e-15, a * b, sin(a) + b * b, exp(b));
    cr_assert_not(tg_tensor_requires_grad(jv));
    tg_tensor *u = T64((3), 1.0, -1.0, 0.5);
    cr_assert_eq(tg_vjp(vec_fn, NULL, 1, &x, u, NULL, &vjp), TG_OK, "%s", tg_last_error_message());
    EXPECT(vjp, (2), 1e-15, b - cos(a), a - 2 * b + 0.5 * exp(b));
}

static tg_tensor *quartic(void *ud, int n, tg_tensor *const *x)
{
    (void)ud;
    (void)n;
    /* sum(x^2 w) + sum(x)^2 ... as f(x, w) = sum(w * x * x) */
    return tg_sum(tg_mul(x[1], tg_mul(x[0], x[0])));
}

Test(higher_order, hessian_blocks_match_the_closed_form)
{
    tg_tensor *x = T64((2), 1.5, -0.5), *w = T64((2), 2.0, 3.0), *pts[2] = {x, w}, *H[4];
    cr_assert_eq(tg_hessian(quartic, NULL, 2, pts, H), TG_OK, "%s", tg_last_error_message());
    /* d2/dx2 = diag(2w), d2/dxdw = diag(2x), d2/dw2 = 0 */
    EXPECT(H[0], (2, 2), 0, 4.0, 0.0, 0.0, 6.0);
    EXPECT(H[1], (2, 2), 0, 3.0, 0.0, 0.0, -1.0);
    EXPECT(H[2], (2, 2), 0, 3.0, 0.0, 0.0, -1.0);
    EXPECT(H[3], (2, 2), 0, 0.0, 0.0, 0.0, 0.0);
    tg_tensor *v[2] = {T64((2), 1.0, 1.0), T64((2), 0.0, 1.0)}, *hv[2], *y;
    cr_assert_eq(tg_hvp(quartic, NULL, 2, pts, v, &y, hv), TG_OK, "%s", tg_last_error_message());
    EXPECT(hv[0], (2), 0, 4.0, 6.0 - 1.0);
    EXPECT(hv[1], (2), 0, 3.0, -1.0);
    EXPECT0(y, 0, 2.0 * 2.25 + 3.0 * 0.25);
}

static tg_tensor *returns_null(void *ud, int n, tg_tensor *const *x)
{
    (void)ud;
    (void)n;
    (void)x;
    return NULL;
}

Test(higher_order, functional_misuse_gives_specific_codes)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_scope_begin();
    tg_tensor *x = T64((2), 1.0, 2.0), *r[4] = {x, x, x, x}, *y = x, *i64 = I64((2), 1, 2);
    cr_assert_eq(tg_vjp(NULL, NULL, 1, &x, NULL, &y, r), TG_ERR_NULL);
    cr_assert_null(y);
    cr_assert_eq(tg_vjp(quartic, NULL, 0, &x, NULL, NULL, r), TG_ERR_INVALID);
    cr_assert_eq(tg_vjp(quartic, NULL, 1, NULL, NULL, NULL, r), TG_ERR_NULL);
    cr_assert_eq(tg_vjp(quartic, NULL, 1, &x, NULL, NULL, NULL), TG_ERR_NULL);
    cr_assert_eq(tg_jacobian(quartic, NULL, 1, &i64, r), TG_ERR_DTYPE);
    cr_assert_eq(tg_vjp(returns_null, NULL, 1, &x, NULL, NULL, r), TG_ERR_INTERNAL);
    cr_assert_null(r[0]);
    /* vec_fn is not scalar: a seed is needed, and HVP / Hessian refuse it */
    cr_assert_eq(tg_vjp(vec_fn, NULL, 1, &x, NULL, NULL, r), TG_ERR_SEED);
    tg_tensor *bad = T64((2), 1, 1);
    cr_assert_eq(tg_vjp(vec_fn, NULL, 1, &x, bad, NULL, r), TG_ERR_SHAPE);
    cr_assert_eq(tg_hvp(vec_fn, NULL, 1, &x, &x, NULL, r), TG_ERR_SEED);
    cr_assert_eq(tg_hessian(vec_fn, NULL, 1, &x, r), TG_ERR_SEED);
    tg_tensor *short_v = T64((1), 1);
    cr_assert_eq(tg_jvp(vec_fn, NULL, 1, &x, &short_v, NULL, r), TG_ERR_SHAPE);
    cr_assert_eq(tg_jvp(vec_fn, NULL, 1, &x, NULL, NULL, r), TG_ERR_NULL);
    cr_assert_null(r[0]);
    tg_error_clear();
    tg_scope_end();
    tu_expect_no_leaks(mem0);
}

Test(higher_order, helpers_leave_the_points_and_grad_mode_alone)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = T64((2), 0.5, 0.25), *w = T64((2), 1.0, 2.0), *pts[2] = {x, w}, *H[4];
    tg_requires_grad(tape, x); /* a leaf of the caller's tape is fine */
    bool prev = tg_grad_set_enabled(false);
    cr_assert_eq(tg_hessian(quartic, NULL, 2, pts, H), TG_OK, "%s", tg_last_error_message());
    cr_assert_not(tg_grad_enabled());
    tg_grad_set_enabled(prev);
    cr_assert_eq(tg_tape_node_count(tape), 0);
    cr_assert_null(tg_grad(x));
    tg_error_clear();
    tu_expect_values(x, VALS(0.5, 0.25), 2, 0);
    tg_tape_free(tape);
}

/* ---- gradgradcheck */
static tg_tensor *smooth(void *ud, int n, tg_tensor *const *x)
{
    (void)ud;
    (void)n;
    return tg_mul(tg_sigmoid(x[0]), tg_tanh(tg_mul(x[0], x[1])));
}

/* x^2 whose backward detaches its saved input: first derivatives right,
 * second wrong (the dependence of 2x on x is cut). */
static tg_tensor *cut_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    (void)ctx;
    return tg_tensor_retain(tg_mul(in[0], in[0]));
}

static tg_status cut_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    gin[0] = tg_mul(g, tg_mul_scalar(tg_detach(tg_op_ctx_input(ctx, 0)), 2.0));
    return gin[0] ? TG_OK : tg_last_error();
}

static const tg_op cut_op = {.name = "test_cut_square", .arity = 1, .shape = plain_shape,
                             .forward = cut_fwd, .backward = cut_bwd,
                             .saves = TG_SAVE_INPUT(0)};

static tg_tensor *call_cut(void *ud, int n, tg_tensor *const *x)
{
    (void)n;
    tg_tensor *in[1] = {x[0]};
    return tg_op_call(ud, 1, in, NULL);
}

Test(higher_order, gradgradcheck_passes_a_smooth_function_and_catches_a_cut_second_derivative)
{
    tg_tensor *x = T64((3), 0.3, -0.8, 1.1), *w = T64((3), 0.5, 1.5, -0.7), *in[2] = {x, w};
    tg_gradcheck_result res[3];
    cr_assert_eq(tg_gradgradcheck(smooth, NULL, 2, in, NULL, res), TG_OK, "%s",
                 tg_last_error_message());
    for (int i = 0; i < 3; i++) cr_assert(res[i].checked && res[i].passed, "entry %d", i);
    tg_gradcheck_opts fast = {.fast = 1, .seed = 3};
    cr_assert_eq(tg_gradgradcheck(smooth, NULL, 2, in, &fast, res), TG_OK, "%s",
                 tg_last_error_message());

    cr_assert_eq(tg_op_register(&cut_op), TG_OK, "%s", tg_last_error_message());
    const tg_op *op = tg_op_find("test_cut_square");
    cr_assert_eq(tg_gradcheck(call_cut, (void *)op, 1, &x, NULL, res), TG_OK,
                 "first order is right: %s", tg_last_error_message());
    cr_assert_eq(tg_gradgradcheck(call_cut, (void *)op, 1, &x, NULL, res), TG_ERR_GRADCHECK);
    cr_assert_not(res[0].passed, "d/dx of 2 x v must be 2 v, the cut graph gives 0");
    cr_assert(res[1].passed, "d/dv (2 x) is right");
    cr_assert_eq(tg_gradgradcheck(call_cut, (void *)op, 1, &x, &fast, res), TG_ERR_GRADCHECK);
    tg_error_clear();
    tg_tensor *f32 = T32((2), 1, 2);
    cr_assert_eq(tg_gradgradcheck(smooth, NULL, 1, &f32, NULL, NULL), TG_ERR_DTYPE);
    cr_assert_eq(tg_gradgradcheck(NULL, NULL, 1, &x, NULL, NULL), TG_ERR_NULL);
    cr_assert_eq(tg_gradgradcheck(smooth, NULL, 0, &x, NULL, NULL), TG_ERR_INVALID);
    cr_assert_eq(tg_gradgradcheck_op(NULL, TG_BACKEND_REF, NULL, NULL), TG_ERR_NULL);
    cr_assert_eq(tg_gradgradcheck_op(tg_op_find("gt"), TG_BACKEND_REF, NULL, NULL),
                 TG_ERR_INVALID);
    tg_error_clear();
}

/* ---- HVPs of composite models against central differences of their
 * gradients (f64; the gradients by first-order tg_vjp). */
typedef struct {
    tg_tensor *x, *t, *c;
} model_data;

/* MLP with tanh and a softmax cross-entropy: w0 (3, 6), w1 (6, 4). */
static tg_tensor *model_mlp_ce(void *ud, int n, tg_tensor *const *w)
{
    (void)n;
    model_data *d = ud;
    tg_tensor *h = tg_tanh(tg_matmul(d->x, w[0]));
    return tg_cross_entropy(tg_matmul(h, w[1]), d->t);
}

/* One attention head with a layer norm: q, k, v = x Wq, x Wk, x Wv (5, 4),
 * softmax(q k^T / 2) v, layer-normed, weighted by c. */
static tg_tensor *model_attention(void *ud, int n, tg_tensor *const *w)
{
    (void)n;
    model_data *d = ud;
    tg_tensor *q = tg_matmul(d->x, w[0]), *k = tg_matmul(d->x, w[1]), *v = tg_matmul(d->x, w[2]);
    tg_tensor *a = tg_softmax(tg_mul_scalar(tg_matmul(q, tg_transpose(k, 0, 1)), 0.5), 1);
    tg_tensor *o = tg_layer_norm(tg_matmul(a, v), 1, NULL, NULL, 1e-5);
    return tg_sum(tg_mul(o, d->c));
}

/* A tanh RNN unrolled over the 4 rows of x (each (1, 3)): wx (3, 5), wh (5, 5);
 * the loss is log_softmax of the last state at the target. */
static tg_tensor *model_rnn(void *ud, int n, tg_tensor *const *w)
{
    (void)n;
    model_data *d = ud;
    tg_tensor *h = NULL;
    for (int s = 0; s < 4; s++) {
        tg_tensor *in = tg_matmul(tg_narrow(d->x, 0, s, 1), w[0]);
        h = tg_tanh(h ? tg_add(in, tg_matmul(h, w[1])) : in);
    }
    return tg_neg(tg_sum(tg_mul(tg_log_softmax(h, 1), d->c)));
}

/* A conv, an average pool, a batch norm and a max pool: w (3, 1, 3, 3), b (3). */
static tg_tensor *model_cnn(void *ud, int n, tg_tensor *const *w)
{
    (void)n;
    model_data *d = ud;
    tg_conv2d_opts co = {.padding = {1, 1}};
    tg_pool2d_opts avg = {.kernel = {2, 2}}, mx = {.kernel = {2, 2}};
    tg_tensor *y = tg_sigmoid(tg_conv2d(d->x, w[0], w[1], &co));
    y = tg_batch_norm(tg_avg_pool2d(y, &avg), NULL, NULL, NULL, NULL, true, 0.1, 1e-5);
    return tg_sum(tg_mul(tg_max_pool2d(tg_mul(y, y), &mx), d->c));
}

static void expect_hvp_matches_differences(const char *what, tg_func f, void *ud, int n,
                                           tg_tensor *const *w, uint64_t seed)
{
    tg_rng r;
    tg_rng_seed(&r, seed);
    tg_tensor *v[4], *hv[4], *gp[4], *gm[4], *wp[4], *wm[4];
    const double eps = 1e-5;
    for (int i = 0; i < n; i++) {
        v[i] = tg_rand_uniform(&r, TG_F64, tg_tensor_ndim(w[i]), tg_tensor_shape(w[i]), -1, 1);
        wp[i] = tg_add(w[i], tg_mul_scalar(v[i], eps));
        wm[i] = tg_sub(w[i], tg_mul_scalar(v[i], eps));
    }
    cr_assert_eq(tg_hvp(f, ud, n, w, v, NULL, hv), TG_OK, "%s: %s", what, tg_last_error_message());
    cr_assert_eq(tg_vjp(f, ud, n, wp, NULL, NULL, gp), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_vjp(f, ud, n, wm, NULL, NULL, gm), TG_OK, "%s", tg_last_error_message());
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double *h = tu_values(hv[i]), *a = tu_values(gp[i]), *b = tu_values(gm[i]);
        for (int64_t k = 0; k < tg_tensor_numel(w[i]); k++) {
            double fd = (a[k] - b[k]) / (2 * eps), e = fabs(fd - h[k]) / fmax(1.0, fabs(fd));
            worst = fmax(worst, e);
            cr_assert(e <= 1e-7, "%s: w%d[%lld]: HVP %.12g, differences %.12g", what, i,
                      (long long)k, h[k], fd);
        }
        free(h);
        free(a);
        free(b);
    }
    cr_log_info("%s: HVP vs differences of gradients, worst relative error %.2e", what, worst);
}

Test(higher_order, hvps_of_composite_models_match_differences_of_gradients)
{
    tg_rng r;
    tg_rng_seed(&r, 21);
    model_data d = {.x = tg_rand_uniform(&r, TG_F64, 2, SHAPE(5, 3), -1, 1),
                    .t = I64((5), 0, 3, 1, 1, 2)};
    tg_tensor *mlp[2] = {tg_rand_uniform(&r, TG_F64, 2, SHAPE(3, 6), -1, 1),
                         tg_rand_uniform(&r, TG_F64, 2, SHAPE(6, 4), -1, 1)};
    expect_hvp_matches_differences("mlp + cross-entropy", model_mlp_ce, &d, 2, mlp, 1);

    d.c = tg_rand_uniform(&r, TG_F64, 2, SHAPE(5, 4), -1, 1);
    tg_tensor *att[3];
    for (int i = 0; i < 3; i++) att[i] = tg_rand_uniform(&r, TG_F64, 2, SHAPE(3, 4), -1, 1);
    expect_hvp_matches_differences("attention + layer norm", model_attention, &d, 3, att, 2);

    model_data rd = {.x = tg_rand_uniform(&r, TG_F64, 2, SHAPE(4, 3), -1, 1),
                     .c = T64((1, 5), 0, 0, 1, 0, 0)};
    tg_tensor *rnn[2] = {tg_rand_uniform(&r, TG_F64, 2, SHAPE(3, 5), -0.8, 0.8),
                         tg_rand_uniform(&r, TG_F64, 2, SHAPE(5, 5), -0.8, 0.8)};
    expect_hvp_matches_differences("rnn, 4 steps", model_rnn, &rd, 2, rnn, 3);

    model_data cd = {.x = tg_rand_uniform(&r, TG_F64, 4, SHAPE(2, 1, 6, 6), -1, 1),
                     .c = tg_rand_uniform(&r, TG_F64, 4, SHAPE(2, 3, 1, 1), -1, 1)};
    tg_tensor *cnn[2] = {tg_rand_uniform(&r, TG_F64, 4, SHAPE(3, 1, 3, 3), -1, 1),
                         tg_rand_uniform(&r, TG_F64, 1, SHAPE(3), -0.5, 0.5)};
    expect_hvp_matches_differences("conv + pools + batch norm", model_cnn, &cd, 2, cnn, 4);
}

Test(higher_order, tg_backward_ex_misuse_and_options)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = T64((2), 0.5, -1.0), *c = T64((1), 1.0);
    tg_requires_grad(tape, x);
    tg_tensor *v = tg_tanh(x), *y = tg_sum(v);
    tg_grad_opts keep = {.retain = true};
    cr_assert_eq(tg_backward_ex(NULL, NULL, &keep), TG_ERR_NULL);
    cr_assert_eq(tg_backward_ex(c, NULL, &keep), TG_ERR_NO_GRAD);
    cr_assert_eq(tg_backward_ex(v, NULL, &keep), TG_ERR_SEED);
    tg_tensor *bad = T64((3), 1, 1, 1);
    cr_assert_eq(tg_backward_ex(v, bad, &keep), TG_ERR_SHAPE);
    cr_assert_null(tg_grad(x));
    tg_error_clear();
    /* retain twice: the gradient doubles, then a plain backward still works once */
    cr_assert_eq(tg_backward_ex(y, NULL, &keep), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_backward_ex(y, NULL, &keep), TG_OK, "%s", tg_last_error_message());
    double t0 = tanh(0.5), t1 = tanh(-1.0);
    tu_expect_values(tg_grad(x), VALS(2 * (1 - t0 * t0), 2 * (1 - t1 * t1)), 2, 1e-15);
    cr_assert_eq(tg_backward_ex(y, NULL, NULL), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_backward_ex(y, NULL, NULL), TG_ERR_STALE);
    tg_error_clear();
    tg_tape_free(tape);
}

/* Under create_graph, the product a sum's backward hands a mul (its seed
 * of 1, broadcast) is the other factor itself: d sum(a*b) / da is b, the
 * same tensor, with no node recorded for it, and the Hessian-vector
 * product through it is bitwise the one through a recorded product by an
 * explicit (materialised) seed of ones, under every policy (those that
 * drop b hand back its recomputed copy). A seed of 2 is multiplied. */
Test(higher_order, a_sums_seed_of_one_hands_the_other_factor_itself)
{
    const int64_t n = 1000;
    tg_rng rng;
    tg_rng_seed(&rng, 17);
    tg_tensor *x = tg_rand_uniform(&rng, TG_F64, 1, (int64_t[]){n}, -1.5, 1.5);
    tg_tensor *v = tg_rand_uniform(&rng, TG_F64, 1, (int64_t[]){n}, -1, 1);
    tg_tensor *ones = tg_full(TG_F64, 1, (int64_t[]){n}, 1.0);
    double *hv[2];
    int64_t recorded[2];
    for (int pol = 0; pol < 4; pol++) {
        for (int explicit_seed = 0; explicit_seed < 2; explicit_seed++) {
            tg_tape *tape = tg_tape_new(&policies[pol]);
            cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
            tg_tensor *a = tg_tanh(x), *b = tg_sigmoid(tg_mul(x, x));
            tg_tensor *p = tg_mul(a, b);
            tg_tensor *out = explicit_seed ? p : tg_sum(p), *g[2];
            tg_tensor *want[2] = {a, x};
            tg_grad_opts cg = {.create_graph = true};
            int64_t before = tg_tape_node_count(tape);
            cr_assert_eq(tg_grad_of(1, &out, explicit_seed ? &ones : NULL, 2, want, g, &cg), TG_OK,
                         "%s", tg_last_error_message());
            recorded[explicit_seed] = tg_tape_node_count(tape) - before;
            if (!explicit_seed && (pol == 0 || pol == 3)) {
                cr_expect_eq(g[0], b, "policy %d: d sum(a*b)/da is not b itself", pol);
            } else if (!explicit_seed) {
                /* BALANCED and BUDGET drop b and recompute it for the backward:
                 * the factor handed back is that recomputed copy, b's bits. */
                double gb[1000], bb[1000];
                cr_assert_eq(tg_tensor_copy_out(g[0], gb, sizeof gb), TG_OK);
                cr_assert_eq(tg_tensor_copy_out(b, bb, sizeof bb), TG_OK);
                cr_expect_eq(memcmp(gb, bb, sizeof gb), 0, "policy %d: d sum(a*b)/da is not b",
                             pol);
            } else {
                cr_expect_neq(g[0], b);
            }
            tg_tensor *s = tg_sum(tg_mul(g[1], v)), *h = NULL;
            cr_assert_eq(tg_grad_of(1, &s, NULL, 1, &x, &h, NULL), TG_OK, "%s",
                         tg_last_error_message());
            hv[explicit_seed] = malloc((size_t)n * sizeof(double));
            cr_assert_eq(tg_tensor_copy_out(h, hv[explicit_seed], (size_t)n * sizeof(double)),
                         TG_OK);
            tg_tape_free(tape);
        }
        cr_expect_eq(memcmp(hv[0], hv[1], (size_t)n * sizeof(double)), 0,
                     "policy %d: Hv through the elided product differs from Hv through a recorded "
                     "one", pol);
        cr_expect_eq(recorded[1] - recorded[0], 2,
                     "nodes recorded: %lld with the sum, %lld without", (long long)recorded[0],
                     (long long)recorded[1]);
        static double first[1000];
        if (pol == 0)
            memcpy(first, hv[0], sizeof first);
        else
            cr_expect_eq(memcmp(first, hv[0], sizeof first), 0,
                         "policy %d: Hv differs from NONE's", pol);
        free(hv[0]);
        free(hv[1]);
    }
    /* A seed of 2 is a product. */
    tg_tape *tape = tg_tape_new(NULL);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    tg_tensor *a = tg_tanh(x), *b = tg_sigmoid(x), *out = tg_sum(tg_mul(a, b)), *g = NULL;
    tg_tensor *two = tg_scalar(TG_F64, 2.0);
    tg_grad_opts cg = {.create_graph = true};
    cr_assert_eq(tg_grad_of(1, &out, &two, 1, &a, &g, &cg), TG_OK, "%s", tg_last_error_message());
    cr_expect_neq(g, b);
    double g0, b0;
    cr_assert_eq(tg_tensor_get(g, 0, &g0), TG_OK);
    cr_assert_eq(tg_tensor_get(b, 0, &b0), TG_OK);
    cr_expect_eq(g0, 2.0 * b0);
    tg_tape_free(tape);
}
