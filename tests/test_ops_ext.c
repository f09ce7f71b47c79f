/* test_ops_ext.c - the extended ops of the training issue: forward values
 * (and gradients where the rule matters) against hand-computed numbers on
 * both backends, the cpu backend against ref on random inputs, and the
 * error paths by exact status code. Each check runs once per backend inside
 * a scope and must give back every byte it allocated. Gradient checks
 * against central differences are the registry sweep's job. */
#include <criterion/criterion.h>
#include <tapegrad.h>

#include "test_util.h"

#include <math.h>
#include <string.h>

/* Tensor literals (T64, T32, I64) and EXPECT / EXPECT0 come from test_util.h. */
/* EXPECT_ERR(call, status, "text in the message") */
#define EXPECT_ERR(call, st, needle) expect_error(__LINE__, (call), (st), (needle))

static void expect_error(int line, tg_tensor *got, tg_status st, const char *needle)
{
    const char *be = tg_backend_name(tu_cur);
    cr_assert_null(got, "line %d [%s]: expected %s, got a tensor", line, be, tg_strerror(st));
    cr_assert_eq(tg_last_error(), st, "line %d [%s]: status %s (%s), expected %s", line, be,
                 tg_strerror(tg_last_error()), tg_last_error_message(), tg_strerror(st));
    cr_assert(strstr(tg_last_error_message(), needle) != NULL,
              "line %d [%s]: message \"%s\" lacks \"%s\"", line, be, tg_last_error_message(),
              needle);
    tg_error_clear();
}

#define EXT_TEST(name)                                                                             \
    static void check_##name(void);                                                                \
    Test(ops_ext, name)                                                                            \
    {                                                                                              \
        tu_on_both_backends(check_##name);                                                         \
    }                                                                                              \
    static void check_##name(void)

/* ---- gradients: d sum(w * y) / d x for the marked leaves, w = weights or
 * ones. The tape lives for one check. */
static tg_tape *tape;

static void track(tg_tensor *x)
{
    if (!tape) tape = tg_tape_new(NULL);
    cr_assert_not_null(tape);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK, "%s", tg_last_error_message());
}

static void backward_sum(tg_tensor *y, tg_tensor *w)
{
    cr_assert_not_null(y, "[%s] %s", tg_backend_name(tu_cur), tg_last_error_message());
    tg_tensor *l = tg_sum(w ? tg_mul(y, w) : y);
    cr_assert_not_null(l, "%s", tg_last_error_message());
    cr_assert_eq(tg_backward(l), TG_OK, "[%s] %s", tg_backend_name(tu_cur),
                 tg_last_error_message());
}

static void done_tape(void)
{
    tg_tape_free(tape);
    tape = NULL;
}

/* ---- elementwise unary */

EXT_TEST(abs_values_and_sign_gradient_with_zero_at_zero)
{
    tg_tensor *x = T64((4), -1.5, 0, 2, -0.25);
    EXPECT(tg_abs(x), (4), 1e-15, 1.5, 0, 2, 0.25);
    EXPECT(tg_abs(T32((2), -3, 4)), (2), 1e-7, 3, 4);
    track(x);
    backward_sum(tg_abs(x), NULL);
    EXPECT(tg_grad(x), (4), 1e-15, -1, 0, 1, -1);
    done_tape();
}

EXT_TEST(clamp_values_open_bounds_and_gradient_inside_the_closed_range)
{
    tg_tensor *x = T64((5), -2, -1, 0.5, 1, 3);
    EXPECT(tg_clamp(x, -1, 1), (5), 1e-15, -1, -1, 0.5, 1, 1);
    EXPECT(tg_clamp(x, -INFINITY, 0), (5), 1e-15, -2, -1, 0, 0, 0);
    EXPECT(tg_clamp(x, 0, INFINITY), (5), 1e-15, 0, 0, 0.5, 1, 3);
    EXPECT(tg_clamp(x, 2, 1), (5), 1e-15, 1, 1, 1, 1, 1); /* lo > hi: hi, as PyTorch */
    EXPECT(tg_clamp(T64((1), NAN), -1, 1), (1), 0, NAN);
    EXPECT(tg_clamp(T32((3), -5, 0.25, 5), -1, 1), (3), 1e-7, -1, 0.25, 1);
    track(x);
    backward_sum(tg_clamp(x, -1, 1), NULL);
    EXPECT(tg_grad(x), (5), 1e-15, 0, 1, 1, 1, 0);
    done_tape();
}

EXT_TEST(gelu_is_the_exact_erf_form_with_its_derivative)
{
    tg_tensor *x = T64((4), -1, 0, 1, 2);
    EXPECT(tg_gelu(x), (4), 1e-14, -0.15865525393145707, 0, 0.8413447460685429,
           1.9544997361036416);
    EXPECT(tg_gelu(T32((2), 1, 2)), (2), 1e-6, 0.8413447460685429, 1.9544997361036416);
    track(x);
    backward_sum(tg_gelu(x), NULL);
    EXPECT(tg_grad(x), (4), 1e-14, -0.08331547058768629, 0.5, 1.0833154705876864,
           1.085231801078197);
    done_tape();
}

EXT_TEST(silu_values_and_derivative)
{
    tg_tensor *x = T64((3), -1, 0, 2);
    EXPECT(tg_silu(x), (3), 1e-14, -0.2689414213699951, 0, 1.7615941559557646);
    EXPECT(tg_silu(T64((2), -1000, 1000)), (2), 1e-15, 0, 1000); /* no overflow */
    track(x);
    backward_sum(tg_silu(x), NULL);
    EXPECT(tg_grad(x), (3), 1e-14, 0.07232948812851325, 0.5, 1.0907842487848955);
    done_tape();
}

EXT_TEST(sin_and_cos_values_and_derivatives_in_radians)
{
    tg_tensor *x = T64((4), 0, 0.5, -1.25, 3.0);
    EXPECT(tg_sin(x), (4), 1e-15, 0, 0.479425538604203, -0.9489846193555862, 0.1411200080598672);
    EXPECT(tg_cos(x), (4), 1e-15, 1, 0.8775825618903728, 0.3153223623952687, -0.9899924966004454);
    EXPECT(tg_sin(T32((2), 1.5707963267948966, 0)), (2), 1e-7, 1, 0);
    track(x);
    backward_sum(tg_sin(x), NULL); /* d sin = cos */
    EXPECT(tg_grad(x), (4), 1e-15, 1, 0.8775825618903728, 0.3153223623952687, -0.9899924966004454);
    done_tape();
    x = T64((4), 0, 0.5, -1.25, 3.0);
    track(x);
    backward_sum(tg_cos(x), NULL); /* d cos = -sin */
    EXPECT(tg_grad(x), (4), 1e-15, 0, -0.479425538604203, 0.9489846193555862, -0.1411200080598672);
    done_tape();
}

EXT_TEST(leaky_relu_scales_the_negative_side_and_its_gradient)
{
    tg_tensor *x = T64((4), -2, 3, -0.5, 0);
    EXPECT(tg_leaky_relu(x, 0.1), (4), 1e-15, -0.2, 3, -0.05, 0);
    EXPECT(tg_leaky_relu(T32((2), -4, 4), 0.25), (2), 1e-7, -1, 4);
    track(x);
    backward_sum(tg_leaky_relu(x, 0.1), NULL);
    EXPECT(tg_grad(x), (4), 1e-15, 0.1, 1, 0.1, 0.1);
    done_tape();
}

EXT_TEST(softplus_with_beta_and_the_linear_threshold_like_pytorch)
{
    tg_tensor *x = T64((4), 0, 1, 25, -30);
    EXPECT(tg_softplus(x, 1, 20), (4), 1e-14, 0.6931471805599453, 1.3132616875182228, 25,
           9.357622968840175e-14);
    /* beta 2, threshold 1: 2 * 0.25 <= 1 is smooth, 2 * 1 > 1 is linear. */
    EXPECT(tg_softplus(T64((2), 0.25, 1), 2, 1), (2), 1e-14, 0.48703849209005334, 1);
    /* Stable far below the threshold: no e^(beta x) overflow. */
    EXPECT(tg_softplus(T64((1), 800), 1, 1e9), (1), 1e-15, 800);
    EXPECT(tg_softplus(T32((1), 1), 1, 20), (1), 1e-6, 1.3132616875182228);
    tg_tensor *y = T64((2), 0.5, 1);
    track(y);
    backward_sum(tg_softplus(y, 2, 1), NULL);
    EXPECT(tg_grad(y), (2), 1e-14, 0.7310585786300049, 1); /* sigmoid(1); past threshold: 1 */
    done_tape();
}

/* ---- dropout */

EXT_TEST(dropout_zeroes_about_p_and_scales_the_rest_reproducibly)
{
    int64_t n = 4000;
    tg_tensor *x = tg_ones(TG_F64, 1, &n);
    tg_rng r1, r2;
    tg_rng_seed(&r1, 99);
    tg_rng_seed(&r2, 99);
    tg_tensor *y1 = tg_dropout(x, 0.25, true, &r1);
    tg_tensor *y2 = tg_dropout(x, 0.25, true, &r2);
    tg_tensor *y3 = tg_dropout(x, 0.25, true, &r1); /* next draw: another mask */
    cr_assert(y1 && y2 && y3, "%s", tg_last_error_message());
    const double *a = tg_tensor_data(y1), *b = tg_tensor_data(y2), *c = tg_tensor_data(y3);
    int64_t zeros = 0, differ = 0;
    for (int64_t i = 0; i < n; i++) {
        cr_assert(a[i] == 0.0 || fabs(a[i] - 1.0 / 0.75) < 1e-15, "y[%lld] = %g", (long long)i, a[i]);
        cr_assert(a[i] == b[i], "same seed, different mask at %lld", (long long)i);
        zeros += a[i] == 0.0;
        differ += a[i] != c[i];
    }
    cr_expect(zeros > 0.2 * (double)n && zeros < 0.3 * (double)n, "%lld zeros of %lld",
              (long long)zeros, (long long)n);
    cr_expect(differ > 0, "successive calls drew the same mask");
    /* The mean is preserved in expectation: E[y] = 1. */
    double mean = 0.0;
    tg_tensor_item(tg_mean(y1), &mean);
    cr_expect(fabs(mean - 1.0) < 0.06, "mean %g", mean);
}

EXT_TEST(dropout_backward_uses_the_forward_mask_and_is_identity_in_evaluation)
{
    tg_tensor *x = T64((2, 5), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10);
    tg_rng rng;
    tg_rng_seed(&rng, 7);
    /* Evaluation (and p == 0): the same values; rng untouched (NULL is fine). */
    EXPECT(tg_dropout(x, 0.5, false, NULL), (2, 5), 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10);
    EXPECT(tg_dropout(x, 0.0, true, NULL), (2, 5), 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10);
    EXPECT(tg_dropout(x, 1.0, true, &rng), (2, 5), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    track(x);
    tg_tensor *y = tg_dropout(x, 0.5, true, &rng);
    backward_sum(y, NULL);
    const double *xv = tg_tensor_data(x), *yv = tg_tensor_data(y);
    const double *gv = tg_tensor_data(tg_grad(x));
    for (int i = 0; i < 10; i++)
        cr_assert(fabs(gv[i] * xv[i] - yv[i]) < 1e-12 && (gv[i] == 0.0 || gv[i] == 2.0),
                  "grad[%d] = %g for y = %g, x = %g", i, gv[i], yv[i], xv[i]);
    /* Not training, the gradient passes unchanged. */
    tg_tensor *x2 = T64((3), 1, 2, 3);
    track(x2);
    backward_sum(tg_dropout(x2, 0.5, false, NULL), T64((3), 4, 5, 6));
    EXPECT(tg_grad(x2), (3), 0, 4, 5, 6);
    done_tape();
}

Test(ops_ext, dropout_draws_the_same_mask_on_both_backends)
{
    int64_t n = 64;
    double v[2][64];
    for (int b = 0; b < 2; b++) {
        tg_backend prev = tg_set_default_backend(b ? TG_BACKEND_CPU : TG_BACKEND_REF);
        tg_rng rng;
        tg_rng_seed(&rng, 5);
        tg_tensor *x = tg_ones(TG_F32, 1, &n);
        tg_tensor *y = tg_dropout(x, 0.4, true, &rng);
        cr_assert_not_null(y, "%s", tg_last_error_message());
        tg_tensor *y64 = tg_cast(y, TG_F64);
        cr_assert_eq(tg_tensor_copy_out(y64, v[b], sizeof v[b]), TG_OK);
        tg_tensor_release(y64);
        tg_tensor_release(y);
        tg_tensor_release(x);
        tg_set_default_backend(prev);
    }
    for (int i = 0; i < n; i++) cr_expect(v[0][i] == v[1][i], "element %d", i);
}

/* ---- selection */

EXT_TEST(where_selects_with_i64_and_floating_conditions_and_broadcasts)
{
    tg_tensor *a = T64((3), 1, 2, 3), *b = T64((3), 10, 20, 30);
    EXPECT(tg_where(I64((3), 1, 0, 5), a, b), (3), 0, 1, 20, 3);
    EXPECT(tg_where(T64((3), 0, -2, NAN), a, b), (3), 0, 10, 2, 3); /* nonzero, NaN: true */
    /* (2,1) x (3) x () -> (2,3) */
    EXPECT(tg_where(I64((2, 1), 1, 0), a, tg_scalar(TG_F64, -1)), (2, 3), 0, 1, 2, 3, -1, -1, -1);
    EXPECT(tg_where(I64((2), 0, 1), I64((2), 7, 8), I64((2), -7, -8)), (2), 0, -7, 8);
    EXPECT(tg_where(T32((2), 1, 0), T32((2), 0.5, 1.5), T32((2), 2.5, 3.5)), (2), 0, 0.5, 3.5);
    /* Gradients: a gets g where true, b where false, summed over broadcasts. */
    tg_tensor *ga = T64((3), 1, 2, 3), *gb = T64((1), 0);
    track(ga);
    track(gb);
    backward_sum(tg_where(I64((2, 3), 1, 0, 1, 1, 1, 0), ga, gb), T64((2, 3), 1, 2, 3, 4, 5, 6));
    EXPECT(tg_grad(ga), (3), 1e-15, 5, 5, 3);
    EXPECT(tg_grad(gb), (1), 1e-15, 8);
    done_tape();
}

EXT_TEST(masked_fill_replaces_masked_entries_and_blocks_their_gradient)
{
    tg_tensor *x = T64((2, 2), 1, 2, 3, 4);
    EXPECT(tg_masked_fill(x, I64((2, 2), 0, 1, 0, 1), -1), (2, 2), 0, 1, -1, 3, -1);
    EXPECT(tg_masked_fill(x, I64((2), 1, 0), 9), (2, 2), 0, 9, 2, 9, 4);
    EXPECT(tg_masked_fill(x, T64((2, 1), 0, 0.5), -INFINITY), (2, 2), 0, 1, 2, -INFINITY,
           -INFINITY);
    EXPECT(tg_masked_fill(I64((3), 4, 5, 6), I64((3), 1, 0, 0), -1), (3), 0, -1, 5, 6);
    track(x);
    backward_sum(tg_masked_fill(x, I64((2), 0, 1), 0), T64((2, 2), 1, 2, 3, 4));
    EXPECT(tg_grad(x), (2, 2), 1e-15, 1, 0, 3, 0);
    done_tape();
}

EXT_TEST(minimum_and_maximum_broadcast_propagate_nan_and_route_ties_to_a)
{
    tg_tensor *a = T64((3), 1, 5, 3), *b = T64((3), 2, 4, 3);
    EXPECT(tg_minimum(a, b), (3), 0, 1, 4, 3);
    EXPECT(tg_maximum(a, b), (3), 0, 2, 5, 3);
    EXPECT(tg_maximum(T64((2, 2), -1, 2, 3, -4), tg_scalar(TG_F64, 0)), (2, 2), 0, 0, 2, 3, 0);
    EXPECT(tg_minimum(T64((2, 1), 1, 4), T64((3), 0, 2, 5)), (2, 3), 0, 0, 1, 1, 0, 2, 4);
    EXPECT(tg_maximum(T64((2), NAN, 1), T64((2), 0, NAN)), (2), 0, NAN, NAN);
    EXPECT(tg_minimum(T32((2), 1.5, -2), T32((2), 0.5, 3)), (2), 0, 0.5, -2);
    track(a);
    track(b);
    backward_sum(tg_maximum(a, b), NULL);
    EXPECT(tg_grad(a), (3), 0, 0, 1, 1);
    EXPECT(tg_grad(b), (3), 0, 1, 0, 0);
    done_tape();
}

/* ---- reductions */

EXT_TEST(min_dim_takes_the_first_minimum_and_scatters_its_gradient)
{
    tg_tensor *x = T64((2, 3), 3, 1, 2, 0, 5, -1);
    EXPECT(tg_min_dim(x, 1, false), (2), 0, 1, -1);
    EXPECT(tg_min_dim(x, 0, true), (1, 3), 0, 0, 1, -1);
    EXPECT(tg_min_dim(x, -1, true), (2, 1), 0, 1, -1);
    EXPECT0(tg_min_dim(T64((3), 2, NAN, 1), 0, false), 0, NAN);
    tg_tensor *t = T64((2, 2), 1, 1, 4, 4); /* ties: the first */
    track(t);
    backward_sum(tg_min_dim(t, 1, false), T64((2), 3, 5));
    EXPECT(tg_grad(t), (2, 2), 0, 3, 0, 5, 0);
    done_tape();
}

EXT_TEST(logsumexp_is_stable_for_large_and_infinite_inputs)
{
    EXPECT(tg_logsumexp(T64((1, 3), 1, 2, 3), 1, false), (1), 1e-14, 3.4076059644443806);
    EXPECT(tg_logsumexp(T64((2, 2), 1000, 1000, -1000, -1000), 1, true), (2, 1), 1e-14,
           1000.6931471805599, -999.30685281944);
    EXPECT(tg_logsumexp(T64((2, 2), -INFINITY, 0, -INFINITY, 0), 0, false), (2), 0, -INFINITY, 0.6931471805599453);
    EXPECT0(tg_logsumexp(T32((3), 1, 2, 3), 0, false), 1e-6, 3.4076059644443806);
    EXPECT0(tg_logsumexp(tg_scalar(TG_F64, 2.5), 0, false), 1e-15, 2.5);
    /* The gradient is softmax along the dim. */
    tg_tensor *x = T64((3), 0, 0.6931471805599453, 1.0986122886681098); /* log 1, 2, 3 */
    track(x);
    backward_sum(tg_logsumexp(x, 0, false), NULL);
    EXPECT(tg_grad(x), (3), 1e-14, 1.0 / 6, 2.0 / 6, 3.0 / 6);
    done_tape();
}

EXT_TEST(var_and_std_with_correction_dims_and_keepdim)
{
    tg_tensor *x = T64((4), 1, 2, 3, 4);
    EXPECT0(tg_var(x, 0, NULL, 1, false), 1e-15, 1.6666666666666667);
    EXPECT0(tg_var(x, 0, NULL, 0, false), 1e-15, 1.25);
    EXPECT0(tg_std(x, 0, NULL, 1, false), 1e-15, 1.2909944487358056);
    EXPECT(tg_std(x, 1, DIMS(0), 0, true), (1), 1e-15, 1.118033988749895);
    tg_tensor *m = T64((2, 3), 1, 2, 3, 4, 6, 8);
    EXPECT(tg_var(m, 1, DIMS(1), 1, false), (2), 1e-15, 1, 4);
    EXPECT(tg_var(m, 1, DIMS(-2), 0, true), (1, 3), 1e-15, 2.25, 4, 6.25);
    EXPECT(tg_std(m, 2, DIMS(0, 1), 1, true), (1, 1), 1e-14, 2.6076809620810595);
    EXPECT0(tg_var(T32((3), 1, 2, 6), 0, NULL, 1, false), 1e-6, 7);
    /* Accurate for a large offset (two passes). */
    EXPECT0(tg_var(T64((3), 1e9 + 1, 1e9 + 2, 1e9 + 3), 0, NULL, 1, false), 1e-12, 1);
    /* N <= correction: inf/NaN like PyTorch, not an error. */
    EXPECT0(tg_var(T64((1), 5), 0, NULL, 1, false), 0, NAN);
    /* Gradients: var -> 2 (x - mean) / (N - c); std -> (x - mean) / ((N - c) std). */
    track(x);
    backward_sum(tg_var(x, 0, NULL, 0, false), NULL);
    EXPECT(tg_grad(x), (4), 1e-15, -0.75, -0.25, 0.25, 0.75);
    done_tape();
    tg_tensor *s = T64((2), 1, 3);
    track(s);
    backward_sum(tg_std(s, 0, NULL, 0, false), NULL); /* std = 1 */
    EXPECT(tg_grad(s), (2), 1e-15, -0.5, 0.5);
    done_tape();
}

/* ---- joining and indexing */

EXT_TEST(concat_joins_along_any_dim_and_splits_the_gradient)
{
    tg_tensor *a = T64((2, 1), 1, 2), *b = T64((2, 2), 3, 4, 5, 6);
    tg_tensor *ab[2] = {a, b};
    EXPECT(tg_concat(2, ab, 1), (2, 3), 0, 1, 3, 4, 2, 5, 6);
    EXPECT(tg_concat(2, ab, -1), (2, 3), 0, 1, 3, 4, 2, 5, 6);
    tg_tensor *r[2] = {T64((1, 2), 1, 2), T64((2, 2), 3, 4, 5, 6)};
    EXPECT(tg_concat(2, r, 0), (3, 2), 0, 1, 2, 3, 4, 5, 6);
    /* Five pieces (an odd count through the tree), one of them empty. */
    tg_tensor *v[5] = {T64((1), 0), T64((2), 1, 2), tg_zeros(TG_F64, 1, SHAPE(0)), T64((1), 3),
                       T64((3), 4, 5, 6)};
    EXPECT(tg_concat(5, v, 0), (7), 0, 0, 1, 2, 3, 4, 5, 6);
    EXPECT(tg_concat(1, v, 0), (1), 0, 0);
    tg_tensor *iv[2] = {I64((2), 1, 2), I64((1), 3)};
    EXPECT(tg_concat(2, iv, 0), (3), 0, 1, 2, 3);
    track(v[1]);
    track(v[4]);
    backward_sum(tg_concat(5, v, 0), T64((7), 1, 2, 3, 4, 5, 6, 7));
    EXPECT(tg_grad(v[1]), (2), 0, 2, 3);
    EXPECT(tg_grad(v[4]), (3), 0, 5, 6, 7);
    done_tape();
}

EXT_TEST(narrow_is_a_view_with_negative_starts_and_a_zero_padded_gradient)
{
    tg_tensor *x = T64((3, 4), 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11);
    tg_tensor *n = tg_narrow(x, 1, 1, 2);
    EXPECT(n, (3, 2), 0, 1, 2, 5, 6, 9, 10);
    cr_expect(!tg_tensor_is_contiguous(n), "a column slice is a strided view");
    EXPECT(tg_narrow(x, 0, -2, 2), (2, 4), 0, 4, 5, 6, 7, 8, 9, 10, 11);
    tu_expect_shape(tg_narrow(x, 0, 1, 0), 2, SHAPE(0, 4));
    /* Of a strided view: the transpose's rows are x's columns. */
    EXPECT(tg_narrow(tg_transpose(x, 0, 1), 0, 2, 1), (1, 3), 0, 2, 6, 10);
    EXPECT(tg_add(n, tg_scalar(TG_F64, 0.5)), (3, 2), 0, 1.5, 2.5, 5.5, 6.5, 9.5, 10.5);
    track(x);
    backward_sum(tg_narrow(x, 1, 1, 2), T64((3, 2), 1, 2, 3, 4, 5, 6));
    EXPECT(tg_grad(x), (3, 4), 0, 0, 1, 2, 0, 0, 3, 4, 0, 0, 5, 6, 0);
    done_tape();
}

EXT_TEST(index_select_picks_slices_and_scatter_adds_repeated_indices)
{
    tg_tensor *x = T64((3, 2), 0, 1, 2, 3, 4, 5);
    EXPECT(tg_index_select(x, 0, I64((3), 2, 0, 2)), (3, 2), 0, 4, 5, 0, 1, 4, 5);
    EXPECT(tg_index_select(x, 1, I64((3), 1, 1, 0)), (3, 3), 0, 1, 1, 0, 3, 3, 2, 5, 5, 4);
    tu_expect_shape(tg_index_select(x, -2, tg_zeros(TG_I64, 1, SHAPE(0))), 2, SHAPE(0, 2));
    EXPECT(tg_index_select(I64((4), 10, 11, 12, 13), 0, I64((2), 3, 0)), (2), 0, 13, 10);
    EXPECT(tg_index_select(T32((3), 0.5, 1.5, 2.5), 0, I64((1), 1)), (1), 0, 1.5);
    track(x);
    backward_sum(tg_index_select(x, 0, I64((3), 2, 0, 2)), T64((3, 2), 1, 2, 3, 4, 5, 6));
    EXPECT(tg_grad(x), (3, 2), 0, 3, 4, 0, 0, 6, 8);
    done_tape();
}

EXT_TEST(gather_picks_along_a_dim_and_scatter_adds_its_gradient)
{
    tg_tensor *x = T64((2, 3), 1, 2, 3, 4, 5, 6);
    EXPECT(tg_gather(x, 1, I64((2, 2), 2, 0, 1, 1)), (2, 2), 0, 3, 1, 5, 5);
    EXPECT(tg_gather(x, 0, I64((1, 3), 1, 0, 1)), (1, 3), 0, 4, 2, 6);
    EXPECT(tg_gather(x, -1, I64((1, 1), 2)), (1, 1), 0, 3); /* smaller than x outside dim */
    EXPECT(tg_gather(x, 0, I64((3, 1), 1, 1, 0)), (3, 1), 0, 4, 4, 1); /* larger along dim */
    track(x);
    backward_sum(tg_gather(x, 1, I64((2, 2), 2, 0, 1, 1)), T64((2, 2), 1, 2, 3, 4));
    EXPECT(tg_grad(x), (2, 3), 0, 2, 0, 1, 0, 7, 0);
    done_tape();
}

EXT_TEST(embedding_looks_up_rows_for_any_id_shape_and_accumulates_gradients)
{
    tg_tensor *w = T64((4, 2), 0, 1, 10, 11, 20, 21, 30, 31);
    EXPECT(tg_embedding(w, I64((2, 2), 0, 3, 3, 1)), (2, 2, 2), 0, 0, 1, 30, 31, 30, 31, 10, 11);
    EXPECT(tg_embedding(w, I64((3), 2, 2, 0)), (3, 2), 0, 20, 21, 20, 21, 0, 1);
    EXPECT(tg_embedding(w, tg_scalar(TG_I64, 1)), (2), 0, 10, 11);
    track(w);
    backward_sum(tg_embedding(w, I64((2, 2), 0, 3, 3, 1)), T64((2, 2, 2), 1, 2, 3, 4, 5, 6, 7, 8));
    EXPECT(tg_grad(w), (4, 2), 0, 1, 2, 7, 8, 0, 0, 8, 10);
    done_tape();
}

/* ---- cpu against ref on random inputs (ref is the oracle) */

typedef tg_tensor *(*unary_fn)(tg_tensor *);
static tg_tensor *leaky(tg_tensor *x) { return tg_leaky_relu(x, 0.03); }
static tg_tensor *clamp1(tg_tensor *x) { return tg_clamp(x, -0.5, 0.75); }
static tg_tensor *softplus2(tg_tensor *x) { return tg_softplus(x, 2.0, 3.0); }
static tg_tensor *lse1(tg_tensor *x) { return tg_logsumexp(x, 1, false); }
static tg_tensor *var01(tg_tensor *x) { return tg_var(x, 2, DIMS(0, 2), 1, true); }
static tg_tensor *min2(tg_tensor *x) { return tg_min_dim(x, 2, false); }
static tg_tensor *maxhalf(tg_tensor *x)
{
    return tg_maximum(x, tg_narrow(x, 0, 1, 1)); /* (3,4,5) vs (1,4,5) */
}
static tg_tensor *minfull(tg_tensor *x) { return tg_minimum(x, tg_mul_scalar(x, -1.0)); }
static tg_tensor *maxscalar(tg_tensor *x) { return tg_maximum(x, tg_mul_scalar(tg_sum(x), 0.01)); }

Test(ops_ext, cpu_matches_ref_on_random_inputs_in_f32_and_f64)
{
    static const unary_fn fns[] = {tg_abs, tg_gelu, tg_silu, leaky, clamp1, softplus2,
                                   lse1, var01, min2, maxhalf, minfull, maxscalar,
                                   tg_sin, tg_cos};
    static const char *names[] = {"abs", "gelu", "silu", "leaky_relu", "clamp", "softplus",
                                  "logsumexp", "var", "min_dim", "maximum", "minimum",
                                  "maximum with a scalar", "sin", "cos"};
    const int64_t shape[3] = {3, 4, 5};
    for (int dt = 0; dt < 2; dt++)
        for (size_t f = 0; f < sizeof fns / sizeof fns[0]; f++) {
            double out[2][60];
            int64_t n = 0;
            for (int b = 0; b < 2; b++) {
                tg_backend prev = tg_set_default_backend(b ? TG_BACKEND_CPU : TG_BACKEND_REF);
                tg_scope_begin();
                tg_rng rng;
                tg_rng_seed(&rng, 1234 + f);
                tg_tensor *x = tg_rand_normal(&rng, dt ? TG_F64 : TG_F32, 3, shape, 0.0, 2.0);
                tg_tensor *y = fns[f](x);
                cr_assert_not_null(y, "%s: %s", names[f], tg_last_error_message());
                n = tg_tensor_numel(y);
                for (int64_t i = 0; i < n; i++) tg_tensor_get(y, i, &out[b][i]);
                tg_scope_end();
                tg_set_default_backend(prev);
            }
            for (int64_t i = 0; i < n; i++)
                cr_expect(fabs(out[0][i] - out[1][i]) <= (dt ? 1e-14 : 1e-6) * fmax(1, fabs(out[0][i])),
                          "%s (%s) element %lld: ref %.17g cpu %.17g", names[f], dt ? "f64" : "f32",
                          (long long)i, out[0][i], out[1][i]);
        }
}

/* ---- errors */

EXT_TEST(wrong_dtypes_fail_with_dtype_errors_naming_the_op)
{
    tg_tensor *i = I64((3), 1, 2, 3), *x = T64((3), 1, 2, 3), *f = T32((3), 1, 2, 3);
    EXPECT_ERR(tg_abs(i), TG_ERR_DTYPE, "'abs'");
    EXPECT_ERR(tg_gelu(i), TG_ERR_DTYPE, "'gelu'");
    EXPECT_ERR(tg_softplus(i, 1, 20), TG_ERR_DTYPE, "'softplus'");
    EXPECT_ERR(tg_minimum(x, f), TG_ERR_DTYPE, "'minimum'");
    EXPECT_ERR(tg_where(f, x, x), TG_ERR_DTYPE, "argument #1 to 'where'");
    EXPECT_ERR(tg_where(i, x, f), TG_ERR_DTYPE, "argument #3 to 'where'");
    EXPECT_ERR(tg_masked_fill(x, f, 0), TG_ERR_DTYPE, "'masked_fill'");
    EXPECT_ERR(tg_var(i, 0, NULL, 1, false), TG_ERR_DTYPE, "'var'");
    EXPECT_ERR(tg_index_select(x, 0, x), TG_ERR_DTYPE, "need i64");
    EXPECT_ERR(tg_gather(x, 0, f), TG_ERR_DTYPE, "'gather'");
    EXPECT_ERR(tg_embedding(T64((2, 2), 1, 2, 3, 4), x), TG_ERR_DTYPE, "'embedding'");
    EXPECT_ERR(tg_embedding(I64((2, 2), 1, 2, 3, 4), i), TG_ERR_DTYPE, "'embedding'");
    tg_tensor *xf[2] = {x, f};
    EXPECT_ERR(tg_concat(2, xf, 0), TG_ERR_DTYPE, "tensor 1 is f32");
}

EXT_TEST(bad_dims_and_parameters_fail_with_invalid_argument)
{
    tg_tensor *x = T64((2, 3), 1, 2, 3, 4, 5, 6);
    EXPECT_ERR(tg_min_dim(x, 2, false), TG_ERR_INVALID, "'min_dim'");
    EXPECT_ERR(tg_logsumexp(x, -3, false), TG_ERR_INVALID, "'logsumexp'");
    EXPECT_ERR(tg_var(x, 2, DIMS(1, -1), 1, false), TG_ERR_INVALID, "listed twice");
    EXPECT_ERR(tg_std(x, 1, DIMS(5), 1, false), TG_ERR_INVALID, "'std'");
    EXPECT_ERR(tg_var(x, 0, NULL, -1, false), TG_ERR_INVALID, "correction");
    EXPECT_ERR(tg_index_select(x, 2, I64((1), 0)), TG_ERR_INVALID, "'index_select'");
    EXPECT_ERR(tg_gather(x, -3, I64((2, 3), 0, 0, 0, 0, 0, 0)), TG_ERR_INVALID, "'gather'");
    EXPECT_ERR(tg_narrow(x, 2, 0, 1), TG_ERR_INVALID, "'narrow'");
    EXPECT_ERR(tg_narrow(x, 1, 2, 2), TG_ERR_INVALID, "outside dim 1 of size 3");
    EXPECT_ERR(tg_narrow(x, 1, -4, 1), TG_ERR_INVALID, "'narrow'");
    EXPECT_ERR(tg_narrow(x, 0, 0, -1), TG_ERR_INVALID, "'narrow'");
    tg_tensor *xx[2] = {x, x};
    EXPECT_ERR(tg_concat(2, xx, 2), TG_ERR_INVALID, "'concat'");
    EXPECT_ERR(tg_concat(0, xx, 0), TG_ERR_INVALID, "'concat'");
    EXPECT_ERR(tg_clamp(x, NAN, 1), TG_ERR_INVALID, "'clamp'");
    EXPECT_ERR(tg_softplus(x, 0, 20), TG_ERR_INVALID, "beta");
    EXPECT_ERR(tg_dropout(x, 1.5, true, NULL), TG_ERR_INVALID, "'dropout'");
    EXPECT_ERR(tg_dropout(x, -0.1, false, NULL), TG_ERR_INVALID, "'dropout'");
    EXPECT_ERR(tg_dropout(x, 0.5, true, NULL), TG_ERR_NULL, "generator");
}

EXT_TEST(indices_out_of_range_fail_with_invalid_argument_naming_op_and_position)
{
    tg_tensor *x = T64((3, 2), 0, 1, 2, 3, 4, 5);
    EXPECT_ERR(tg_index_select(x, 0, I64((3), 0, 3, 1)), TG_ERR_INVALID,
               "bad argument #3 to 'index_select' (index 3 at position 1 outside [0, 3))");
    EXPECT_ERR(tg_index_select(x, 1, I64((1), -1)), TG_ERR_INVALID, "index -1 at position 0");
    EXPECT_ERR(tg_gather(x, 1, I64((3, 1), 0, 2, 1)), TG_ERR_INVALID,
               "bad argument #3 to 'gather' (index 2 at position 1 outside [0, 2))");
    EXPECT_ERR(tg_embedding(x, I64((2, 2), 0, 1, 2, 3)), TG_ERR_INVALID,
               "bad argument #2 to 'embedding' (index 3 at position 3 outside [0, 3))");
    /* A failed forward records nothing: the tape stays usable. */
    track(x);
    EXPECT_ERR(tg_embedding(x, I64((1), 7)), TG_ERR_INVALID, "'embedding'");
    cr_assert_eq(tg_tape_node_count(tape), 0);
    backward_sum(tg_embedding(x, I64((1), 2)), NULL);
    EXPECT(tg_grad(x), (3, 2), 0, 0, 0, 0, 0, 1, 1);
    done_tape();
}

EXT_TEST(shape_mismatches_fail_with_shape_errors)
{
    tg_tensor *x = T64((2, 3), 1, 2, 3, 4, 5, 6);
    EXPECT_ERR(tg_where(I64((2), 1, 0), x, x), TG_ERR_SHAPE, "'where'");
    EXPECT_ERR(tg_maximum(x, T64((2), 1, 2)), TG_ERR_SHAPE, "'maximum'");
    EXPECT_ERR(tg_masked_fill(x, I64((4), 1, 0, 1, 0), 0), TG_ERR_SHAPE, "'masked_fill'");
    tg_tensor *bad[3] = {x, x, T64((3, 3), 1, 2, 3, 4, 5, 6, 7, 8, 9)};
    EXPECT_ERR(tg_concat(3, bad, 1), TG_ERR_SHAPE, "tensor 2 has shape [3,3]");
    EXPECT_ERR(tg_concat(1, (tg_tensor *[]){tg_scalar(TG_F64, 1)}, 0), TG_ERR_SHAPE, "'concat'");
    EXPECT_ERR(tg_index_select(x, 0, I64((1, 1), 0)), TG_ERR_SHAPE, "1-d");
    EXPECT_ERR(tg_gather(x, 0, I64((2), 0, 1)), TG_ERR_SHAPE, "'gather'");
    EXPECT_ERR(tg_gather(x, 0, I64((1, 4), 0, 0, 0, 0)), TG_ERR_SHAPE, "does not fit");
    EXPECT_ERR(tg_embedding(T64((4), 1, 2, 3, 4), I64((1), 0)), TG_ERR_SHAPE, "(V, D)");
    EXPECT_ERR(tg_min_dim(tg_zeros(TG_F64, 1, SHAPE(0)), 0, false), TG_ERR_SHAPE, "'min_dim'");
}

EXT_TEST(null_inputs_keep_the_first_error)
{
    tg_tensor *x = T64((2), 1, 2);
    tg_tensor *idx = I64((1), 0);
    /* Each call gets the NULL result of a failing exp(NULL): the first error
     * (naming 'exp') must survive every op that follows. */
    tg_tensor *r[24];
    int k = 0;
    tg_error_clear();
    tg_tensor *bad = tg_exp(NULL);
    cr_assert_null(bad);
    r[k++] = tg_abs(bad);
    r[k++] = tg_clamp(bad, NAN, 0); /* even with a bad bound */
    r[k++] = tg_gelu(bad);
    r[k++] = tg_silu(bad);
    r[k++] = tg_leaky_relu(bad, 0.1);
    r[k++] = tg_softplus(bad, -1, 20);
    r[k++] = tg_dropout(bad, 0.5, true, NULL);
    r[k++] = tg_where(bad, x, x);
    r[k++] = tg_where(idx, x, bad);
    r[k++] = tg_masked_fill(x, bad, 0);
    r[k++] = tg_minimum(bad, x);
    r[k++] = tg_maximum(x, bad);
    r[k++] = tg_min_dim(bad, 0, false);
    r[k++] = tg_logsumexp(bad, 0, false);
    r[k++] = tg_var(bad, -1, NULL, 1, false);
    r[k++] = tg_std(bad, 0, NULL, 1, false);
    r[k++] = tg_concat(2, (tg_tensor *[]){x, bad}, 0);
    r[k++] = tg_narrow(bad, 0, 0, 1);
    r[k++] = tg_index_select(x, 0, bad);
    r[k++] = tg_gather(bad, 0, idx);
    r[k++] = tg_embedding(bad, idx);
    for (int i = 0; i < k; i++) cr_expect_null(r[i], "call %d returned a tensor", i);
    cr_expect_eq(tg_last_error(), TG_ERR_NULL);
    cr_expect(strstr(tg_last_error_message(), "'exp'") != NULL, "first error lost: %s",
              tg_last_error_message());
    tg_error_clear();
    /* Without an earlier error, a NULL input names the op itself. */
    EXPECT_ERR(tg_gather(NULL, 0, idx), TG_ERR_NULL, "'gather'");
    EXPECT_ERR(tg_concat(2, (tg_tensor *[]){x, NULL}, 0), TG_ERR_NULL, "'concat'");
}

