/* test_ops.c - forward values of every built-in op against hand-computed
 * results on small inputs, on both backends. Each check runs once per
 * backend inside a scope, and must give back every byte it allocated. */
#include <criterion/criterion.h>
#include <tapegrad.h>

#include "test_util.h"

#include <math.h>
#include <string.h>

#define EULER 2.718281828459045

/* Tensor literals (T64, T32) and EXPECT / EXPECT0 come from test_util.h. */

static tg_tensor *targets(int64_t n, const int64_t *v)
{
    tg_tensor *t = tg_tensor_from_data(TG_I64, 1, &n, v);
    cr_assert_not_null(t);
    return t;
}

#define OPS_TEST(name)                                                                             \
    static void check_##name(void);                                                                \
    Test(ops, name)                                                                                \
    {                                                                                              \
        tu_on_both_backends(check_##name);                                                         \
    }                                                                                              \
    static void check_##name(void)

/* ---- elementwise binary, broadcasting */

OPS_TEST(add_of_equal_shapes)
{
    EXPECT(tg_add(T64((3), 1, 2, 3), T64((3), 10, 20, 30)), (3), 1e-15, 11, 22, 33);
    EXPECT(tg_add(T32((2), 0.5, -1.5), T32((2), 0.25, 0.5)), (2), 1e-7, 0.75, -1.0);
}

OPS_TEST(add_broadcasts_a_row_and_a_column)
{
    tg_tensor *col = T64((3, 1), 1, 2, 3);
    tg_tensor *row = T64((4), 10, 20, 30, 40);
    EXPECT(tg_add(col, row), (3, 4), 1e-15,
           11, 21, 31, 41,
           12, 22, 32, 42,
           13, 23, 33, 43);
    EXPECT(tg_add(row, col), (3, 4), 1e-15,
           11, 21, 31, 41,
           12, 22, 32, 42,
           13, 23, 33, 43);
}

OPS_TEST(add_broadcasts_a_matrix_and_a_row_and_a_scalar)
{
    tg_tensor *m = T64((2, 3), 1, 2, 3, 4, 5, 6);
    EXPECT(tg_add(m, T64((3), 100, 200, 300)), (2, 3), 1e-15, 101, 202, 303, 104, 205, 306);
    EXPECT(tg_add(m, tg_scalar(TG_F64, 0.5)), (2, 3), 1e-15, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5);
    EXPECT(tg_add(tg_scalar(TG_F64, 0.5), m), (2, 3), 1e-15, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5);
    /* rank promotion in 3-d: (2,1,3) + (2,1) -> (2,2,3) */
    tg_tensor *a = T64((2, 1, 3), 1, 2, 3, 4, 5, 6);
    tg_tensor *b = T64((2, 1), 10, 20);
    EXPECT(tg_add(a, b), (2, 2, 3), 1e-15,
           11, 12, 13, 21, 22, 23,
           14, 15, 16, 24, 25, 26);
}

OPS_TEST(add_of_a_strided_view_reads_it_in_logical_order)
{
    tg_tensor *m = T64((2, 3), 1, 2, 3, 4, 5, 6);
    tg_tensor *mt = tg_transpose(m, 0, 1); /* (3,2): 1 4 / 2 5 / 3 6 */
    EXPECT(tg_add(mt, T64((2), 0, 10)), (3, 2), 1e-15, 1, 14, 2, 15, 3, 16);
}

OPS_TEST(sub_mul_div_elementwise_and_broadcast)
{
    tg_tensor *a = T64((3), 5, 7, 9);
    tg_tensor *b = T64((3), 1, 2, 3);
    EXPECT(tg_sub(a, b), (3), 1e-15, 4, 5, 6);
    EXPECT(tg_sub(b, a), (3), 1e-15, -4, -5, -6);
    EXPECT(tg_mul(a, b), (3), 1e-15, 5, 14, 27);
    EXPECT(tg_div(T64((3), 1, 4, 9), T64((3), 2, 8, -3)), (3), 1e-15, 0.5, 0.5, -3);
    tg_tensor *col = T64((2, 1), 2, -1);
    tg_tensor *m = T64((2, 3), 1, 2, 3, 4, 5, 6);
    EXPECT(tg_mul(col, m), (2, 3), 1e-15, 2, 4, 6, -4, -5, -6);
    EXPECT(tg_sub(m, col), (2, 3), 1e-15, -1, 0, 1, 5, 6, 7);
    EXPECT(tg_div(m, col), (2, 3), 1e-15, 0.5, 1, 1.5, -4, -5, -6);
    EXPECT(tg_div(tg_scalar(TG_F64, 1.0), T64((2), 4, -8)), (2), 1e-15, 0.25, -0.125);
    EXPECT(tg_mul(T32((2, 2), 1, 2, 3, 4), T32((2), 0.5, -2)), (2, 2), 1e-7, 0.5, -4, 1.5, -8);
}

/* ---- elementwise unary */

OPS_TEST(neg_exp_log_sqrt)
{
    EXPECT(tg_neg(T64((3), 1, -2, 0)), (3), 1e-15, -1, 2, 0);
    EXPECT(tg_exp(T64((3), 0, 1, -1)), (3), 1e-15, 1, EULER, 1.0 / EULER);
    EXPECT(tg_log(T64((3), 1, EULER, 0.5)), (3), 1e-15, 0, 1, -0.6931471805599453);
    EXPECT(tg_sqrt(T64((3), 4, 2, 0)), (3), 1e-15, 2, 1.4142135623730951, 0);
    EXPECT(tg_exp(T32((2), 0, 2)), (2), 1e-6, 1, 7.38905609893065);
    EXPECT(tg_log(T32((1), 10)), (1), 1e-6, 2.302585092994046);
}

OPS_TEST(tanh_values_and_saturation)
{
    EXPECT(tg_tanh(T64((5), 0, 0.5, -2, 50, -50)), (5), 1e-15, 0, 0.46211715726000974,
           -0.9640275800758169, 1, -1);
    EXPECT(tg_tanh(T32((2), 0.5, -20)), (2), 1e-6, 0.46211715726000974, -1);
}

OPS_TEST(sigmoid_values_including_large_negative_inputs)
{
    EXPECT(tg_sigmoid(T64((3), 0, 2, -2)), (3), 1e-15, 0.5, 0.8807970779778823,
           0.11920292202211755);
    /* No overflow: e^1000 is inf, the result must still be 0 and 1. */
    tg_tensor *big = tg_sigmoid(T64((4), -1000, 1000, -745, 745));
    EXPECT(big, (4), 1e-300, 0, 1, 0, 1);
    /* and accurate in the far tail, not just clamped */
    double v;
    tg_tensor *tail = tg_sigmoid(T64((1), -30));
    cr_assert_eq(tg_tensor_get(tail, 0, &v), TG_OK);
    cr_assert(fabs(v - 9.357622968839299e-14) <= 1e-12 * 9.357622968839299e-14,
              "[%s] sigmoid(-30) = %.17g", tg_backend_name(tu_cur), v);
    tg_tensor *f = tg_sigmoid(T32((3), -100, -1000, 100));
    for (int64_t i = 0; i < 3; i++) {
        cr_assert_eq(tg_tensor_get(f, i, &v), TG_OK);
        cr_assert(isfinite(v), "[%s] f32 sigmoid element %lld is %g", tg_backend_name(tu_cur),
                  (long long)i, v);
    }
    EXPECT(f, (3), 1e-7, 0, 0, 1);
}

OPS_TEST(relu_zeroes_negatives_and_zero)
{
    EXPECT(tg_relu(T64((4), -1, 0, 2.5, -0.0)), (4), 1e-15, 0, 0, 2.5, 0);
    EXPECT(tg_relu(T32((2), -3, 3)), (2), 1e-15, 0, 3);
}

OPS_TEST(pow_add_and_mul_by_a_scalar)
{
    EXPECT(tg_pow_scalar(T64((3), 2, 3, 4), 2.0), (3), 1e-15, 4, 9, 16);
    EXPECT(tg_pow_scalar(T64((2), 4, 9), 0.5), (2), 1e-15, 2, 3);
    EXPECT(tg_pow_scalar(T64((2), 2, 4), -1.0), (2), 1e-15, 0.5, 0.25);
    EXPECT(tg_pow_scalar(T64((2), -2, 3), 3.0), (2), 1e-15, -8, 27);
    EXPECT(tg_add_scalar(T64((2), 1, 2), 0.5), (2), 1e-15, 1.5, 2.5);
    EXPECT(tg_add_scalar(T64((2), 1, 2), -3.0), (2), 1e-15, -2, -1);
    EXPECT(tg_mul_scalar(T64((2), 1, -2), 3.0), (2), 1e-15, 3, -6);
    EXPECT(tg_mul_scalar(T32((2), 1, -2), 0.5), (2), 1e-7, 0.5, -1);
    EXPECT(tg_pow_scalar(T32((2), 3, 0.5), 2.0), (2), 1e-6, 9, 0.25);
}

OPS_TEST(unary_ops_on_a_scalar_and_an_empty_tensor)
{
    EXPECT0(tg_exp(tg_scalar(TG_F64, 0.0)), 1e-15, 1.0);
    EXPECT0(tg_neg(tg_scalar(TG_F64, 2.0)), 1e-15, -2.0);
    tg_tensor *e = tg_exp(tg_zeros(TG_F64, 2, SHAPE(0, 3)));
    cr_assert_not_null(e, "[%s] %s", tg_backend_name(tu_cur), tg_last_error_message());
    cr_assert_eq(tg_tensor_numel(e), 0);
    cr_assert_eq(tg_tensor_dim(e, 1), 3);
}

/* ---- comparisons */

OPS_TEST(gt_and_eq_give_ones_and_zeros_in_the_input_dtype)
{
    tg_tensor *g = tg_gt(T64((3), 1, 5, 3), T64((3), 2, 2, 3));
    EXPECT(g, (3), 1e-15, 0, 1, 0);
    cr_assert_eq(tg_tensor_dtype(g), TG_F64);
    tg_tensor *e = tg_eq(T64((3), 1, 2, 3), T64((3), 1, 0, 3));
    EXPECT(e, (3), 1e-15, 1, 0, 1);
    /* broadcasting against a scalar, f32 */
    tg_tensor *gs = tg_gt(T32((2, 2), -1, 0, 1, 2), tg_scalar(TG_F32, 0.0));
    EXPECT(gs, (2, 2), 1e-15, 0, 0, 1, 1);
    cr_assert_eq(tg_tensor_dtype(gs), TG_F32);
    /* i64 (labels): eq of predictions and targets */
    const int64_t p[4] = {0, 2, 1, 1}, t[4] = {0, 1, 1, 2};
    tg_tensor *ei = tg_eq(targets(4, p), targets(4, t));
    EXPECT(ei, (4), 1e-15, 1, 0, 1, 0);
    cr_assert_eq(tg_tensor_dtype(ei), TG_I64);
}

/* ---- reductions */

OPS_TEST(sum_and_mean_of_all_elements_are_zero_dimensional)
{
    tg_tensor *m = T64((2, 3), 1, 2, 3, 4, 5, 6);
    EXPECT0(tg_sum(m), 1e-15, 21);
    EXPECT0(tg_mean(m), 1e-15, 3.5);
    EXPECT0(tg_sum(T32((4), 0.5, 0.25, 0.125, 0.125)), 1e-7, 1.0);
    EXPECT0(tg_sum(tg_scalar(TG_F64, 4.0)), 1e-15, 4.0);
    EXPECT0(tg_sum(tg_zeros(TG_F64, 1, SHAPE(0))), 1e-15, 0.0);
    /* sum of a strided view */
    EXPECT0(tg_sum(tg_transpose(m, 0, 1)), 1e-15, 21);
}

OPS_TEST(sum_dims_with_and_without_keepdim)
{
    tg_tensor *m = T64((2, 3), 1, 2, 3, 4, 5, 6);
    EXPECT(tg_sum_dims(m, 1, DIMS(1), true), (2, 1), 1e-15, 6, 15);
    EXPECT(tg_sum_dims(m, 1, DIMS(1), false), (2), 1e-15, 6, 15);
    EXPECT(tg_sum_dims(m, 1, DIMS(0), true), (1, 3), 1e-15, 5, 7, 9);
    EXPECT(tg_sum_dims(m, 1, DIMS(-2), false), (3), 1e-15, 5, 7, 9);
    EXPECT(tg_sum_dims(m, 2, DIMS(0, 1), true), (1, 1), 1e-15, 21);
    tg_tensor *c = tg_reshape(tg_arange(TG_F64, 0, 24, 1), 3, SHAPE(2, 3, 4));
    /* over dims 0 and 2: out[j] = sum_i sum_k (12 i + 4 j + k) = 2*4*4j + 4*12 + 2*6 */
    EXPECT(tg_sum_dims(c, 2, DIMS(0, 2), false), (3), 1e-15, 60, 92, 124);
    EXPECT(tg_sum_dims(c, 2, DIMS(2, 0), true), (1, 3, 1), 1e-15, 60, 92, 124);
}

OPS_TEST(mean_dims_with_and_without_keepdim)
{
    tg_tensor *m = T64((2, 3), 1, 2, 3, 4, 5, 6);
    EXPECT(tg_mean_dims(m, 1, DIMS(0), true), (1, 3), 1e-15, 2.5, 3.5, 4.5);
    EXPECT(tg_mean_dims(m, 1, DIMS(-1), false), (2), 1e-15, 2, 5);
    EXPECT0(tg_mean_dims(m, 2, DIMS(0, 1), false), 1e-15, 3.5);
    tg_tensor *c = tg_reshape(tg_arange(TG_F64, 0, 24, 1), 3, SHAPE(2, 3, 4));
    EXPECT(tg_mean_dims(c, 2, DIMS(0, 2), true), (1, 3, 1), 1e-15, 7.5, 11.5, 15.5);
    EXPECT(tg_mean_dims(T32((2, 2), 1, 2, 3, 5), 1, DIMS(1), false), (2), 1e-7, 1.5, 4);
}

OPS_TEST(max_dim_values_with_and_without_keepdim)
{
    tg_tensor *m = T64((2, 3), 1, 5, 3, 7, 2, 7);
    EXPECT(tg_max_dim(m, 1, false), (2), 1e-15, 5, 7);
    EXPECT(tg_max_dim(m, -1, true), (2, 1), 1e-15, 5, 7);
    EXPECT(tg_max_dim(m, 0, false), (3), 1e-15, 7, 5, 7);
    EXPECT(tg_max_dim(m, 0, true), (1, 3), 1e-15, 7, 5, 7);
    EXPECT0(tg_max_dim(T64((3), -4, -2, -9), 0, false), 1e-15, -2);
    tg_tensor *c = tg_reshape(tg_arange(TG_F64, 0, 24, 1), 3, SHAPE(2, 3, 4));
    EXPECT(tg_max_dim(c, 1, false), (2, 4), 1e-15, 8, 9, 10, 11, 20, 21, 22, 23);
    EXPECT(tg_max_dim(T32((2, 2), 1, -1, -3, -2), 1, false), (2), 1e-15, 1, -2);
}

OPS_TEST(argmax_returns_the_first_max_on_ties_as_i64)
{
    tg_tensor *m = T64((2, 4), 1, 3, 3, 2, 4, 4, 0, 4);
    tg_tensor *a = tg_argmax(m, 1, false);
    EXPECT(a, (2), 1e-15, 1, 0);
    cr_assert_eq(tg_tensor_dtype(a), TG_I64);
    EXPECT(tg_argmax(m, 1, true), (2, 1), 1e-15, 1, 0);
    EXPECT(tg_argmax(m, 0, false), (4), 1e-15, 1, 1, 0, 1);
    EXPECT(tg_argmax(T64((2, 2), 1, 3, 1, 2), 0, false), (2), 1e-15, 0, 0);
    EXPECT0(tg_argmax(T32((5), 2, 2, 2, 2, 2), 0, false), 1e-15, 0);
    EXPECT0(tg_argmax(T64((3), -5, -1, -1), -1, false), 1e-15, 1);
}

/* ---- shape ops */

OPS_TEST(reshape_keeps_row_major_order)
{
    tg_tensor *m = T64((2, 3), 1, 2, 3, 4, 5, 6);
    EXPECT(tg_reshape(m, 2, SHAPE(3, 2)), (3, 2), 1e-15, 1, 2, 3, 4, 5, 6);
    EXPECT(tg_reshape(m, 3, SHAPE(1, -1, 2)), (1, 3, 2), 1e-15, 1, 2, 3, 4, 5, 6);
    EXPECT(tg_reshape(tg_scalar(TG_F64, 7), 2, SHAPE(1, 1)), (1, 1), 1e-15, 7);
    EXPECT0(tg_reshape(T64((1), 7), 0, NULL), 1e-15, 7);
    /* of a strided view: the logical order, in fresh storage */
    tg_tensor *r = tg_reshape(tg_transpose(m, 0, 1), 1, SHAPE(6));
    EXPECT(r, (6), 1e-15, 1, 4, 2, 5, 3, 6);
}

OPS_TEST(transpose_swaps_two_dims_as_a_view)
{
    tg_tensor *c = tg_reshape(tg_arange(TG_F64, 0, 24, 1), 3, SHAPE(2, 3, 4));
    tg_tensor *t = tg_transpose(c, 0, 2); /* (4,3,2): t[i][j][k] = c[k][j][i] */
    cr_assert_not_null(t);
    cr_assert_not(tg_tensor_is_contiguous(t));
    double want[24];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 2; k++) want[(i * 3 + j) * 2 + k] = 12 * k + 4 * j + i;
    tu_expect_tensor(__LINE__, t, 3, SHAPE(4, 3, 2), want, 24, 1e-15);
    EXPECT(tg_transpose(T64((2, 2), 1, 2, 3, 4), -1, -2), (2, 2), 1e-15, 1, 3, 2, 4);
    EXPECT(tg_transpose(T64((2, 2), 1, 2, 3, 4), 1, 1), (2, 2), 1e-15, 1, 2, 3, 4);
}

OPS_TEST(permute_reorders_dims)
{
    tg_tensor *c = tg_reshape(tg_arange(TG_F64, 0, 24, 1), 3, SHAPE(2, 3, 4));
    tg_tensor *p = tg_permute(c, 3, DIMS(2, 0, 1)); /* p[i][j][k] = c[j][k][i] */
    double want[24];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 3; k++) want[(i * 2 + j) * 3 + k] = 12 * j + 4 * k + i;
    tu_expect_tensor(__LINE__, p, 3, SHAPE(4, 2, 3), want, 24, 1e-15);
    /* permuting back gives the original */
    tg_tensor *back = tg_permute(p, 3, DIMS(1, 2, 0));
    double orig[24];
    for (int i = 0; i < 24; i++) orig[i] = i;
    tu_expect_tensor(__LINE__, back, 3, SHAPE(2, 3, 4), orig, 24, 1e-15);
    cr_assert(tg_tensor_is_contiguous(back));
}

OPS_TEST(expand_broadcasts_to_a_shape_as_a_view)
{
    tg_tensor *col = T64((3, 1), 1, 2, 3);
    size_t before = tg_mem_current_bytes();
    tg_tensor *e = tg_expand(col, 2, SHAPE(3, 4));
    cr_assert_eq(tg_mem_current_bytes(), before, "[%s] expand copied", tg_backend_name(tu_cur));
    EXPECT(e, (3, 4), 1e-15, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    EXPECT(tg_expand(T64((2), 5, 6), 3, SHAPE(2, 1, 2)), (2, 1, 2), 1e-15, 5, 6, 5, 6);
    EXPECT(tg_expand(tg_scalar(TG_F64, 9), 2, SHAPE(2, 2)), (2, 2), 1e-15, 9, 9, 9, 9);
    /* an expanded view feeds other ops correctly */
    EXPECT(tg_mul(e, T64((4), 1, 10, 100, 1000)), (3, 4), 1e-15, 1, 10, 100, 1000, 2, 20, 200,
           2000, 3, 30, 300, 3000);
    tg_error_clear();
    cr_assert_null(tg_expand(col, 2, SHAPE(2, 4)));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_error_clear();
}

OPS_TEST(sum_to_sums_down_to_a_broadcastable_shape)
{
    tg_tensor *m = T64((2, 3), 1, 2, 3, 4, 5, 6);
    EXPECT(tg_sum_to(m, 2, SHAPE(1, 3)), (1, 3), 1e-15, 5, 7, 9);
    EXPECT(tg_sum_to(m, 1, SHAPE(3)), (3), 1e-15, 5, 7, 9);
    EXPECT(tg_sum_to(m, 2, SHAPE(2, 1)), (2, 1), 1e-15, 6, 15);
    EXPECT0(tg_sum_to(m, 0, NULL), 1e-15, 21);
    EXPECT(tg_sum_to(m, 2, SHAPE(2, 3)), (2, 3), 1e-15, 1, 2, 3, 4, 5, 6);
    tg_tensor *c = tg_reshape(tg_arange(TG_F64, 0, 24, 1), 3, SHAPE(2, 3, 4));
    EXPECT(tg_sum_to(c, 3, SHAPE(2, 1, 4)), (2, 1, 4), 1e-15, 12, 15, 18, 21, 48, 51, 54, 57);
    tg_error_clear();
    cr_assert_null(tg_sum_to(m, 1, SHAPE(2)));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_error_clear();
}

OPS_TEST(contiguous_copies_a_strided_view_into_row_major_storage)
{
    tg_tensor *m = T64((2, 3), 1, 2, 3, 4, 5, 6);
    tg_tensor *t = tg_transpose(m, 0, 1);
    tg_tensor *c = tg_contiguous(t);
    EXPECT(c, (3, 2), 1e-15, 1, 4, 2, 5, 3, 6);
    cr_assert(tg_tensor_is_contiguous(c));
    const double *p = tg_tensor_data(c);
    cr_assert_not_null(p);
    const double want[6] = {1, 4, 2, 5, 3, 6};
    for (int i = 0; i < 6; i++) cr_assert(fabs(p[i] - want[i]) < 1e-15, "data[%d]", i);
    /* a copy: writing the source does not change it */
    double *src = tg_tensor_data(m);
    src[1] = 100;
    EXPECT(c, (3, 2), 1e-15, 1, 4, 2, 5, 3, 6);
    /* of an already contiguous tensor: same values */
    EXPECT(tg_contiguous(m), (2, 3), 1e-15, 1, 100, 3, 4, 5, 6);
    /* of an expanded view */
    EXPECT(tg_contiguous(tg_expand(T64((2), 1, 2), 2, SHAPE(2, 2))), (2, 2), 1e-15, 1, 2, 1, 2);
}

/* ---- matmul */

/* out (batch..., m, n) of a (..., m, k) and b (..., k, n) with NumPy
 * broadcasting of the batch dims (both given with the same rank here). */
static void ref_matmul(int nb, const int64_t *ba, const int64_t *bb, int64_t m, int64_t k,
                       int64_t n, const double *a, const double *b, double *out)
{
    int64_t bo[TG_MAX_DIMS], nbatch = 1;
    for (int i = 0; i < nb; i++) {
        bo[i] = ba[i] > bb[i] ? ba[i] : bb[i];
        nbatch *= bo[i];
    }
    for (int64_t bi = 0; bi < nbatch; bi++) {
        int64_t rem = bi, ia = 0, ib = 0, sa = 1, sb = 1;
        for (int d = nb - 1; d >= 0; d--) {
            int64_t idx = rem % bo[d];
            rem /= bo[d];
            ia += (ba[d] == 1 ? 0 : idx) * sa;
            ib += (bb[d] == 1 ? 0 : idx) * sb;
            sa *= ba[d];
            sb *= bb[d];
        }
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double acc = 0;
                for (int64_t p = 0; p < k; p++)
                    acc += a[(ia * m + i) * k + p] * b[(ib * k + p) * n + j];
                out[(bi * m + i) * n + j] = acc;
            }
    }
}

OPS_TEST(matmul_of_two_matrices)
{
    EXPECT(tg_matmul(T64((2, 2), 1, 2, 3, 4), T64((2, 2), 5, 6, 7, 8)), (2, 2), 1e-15, 19, 22,
           43, 50);
    /* (2,3) x (3,1) */
    EXPECT(tg_matmul(T64((2, 3), 1, 2, 3, 4, 5, 6), T64((3, 1), 1, 0, -1)), (2, 1), 1e-15, -2, -2);
    /* (1,3) x (3,2) */
    EXPECT(tg_matmul(T64((1, 3), 1, 2, 3), T64((3, 2), 1, 2, 3, 4, 5, 6)), (1, 2), 1e-15, 22, 28);
    EXPECT(tg_matmul(T32((2, 2), 1, 2, 3, 4), T32((2, 2), 0.5, 0, 0, 2)), (2, 2), 1e-6, 0.5, 4,
           1.5, 8);
    /* inner dim 0 gives zeros */
    tg_tensor *z = tg_matmul(tg_ones(TG_F64, 2, SHAPE(2, 0)), tg_ones(TG_F64, 2, SHAPE(0, 3)));
    EXPECT(z, (2, 3), 1e-15, 0, 0, 0, 0, 0, 0);
}

OPS_TEST(matmul_with_transposed_operands)
{
    tg_tensor *a = T64((3, 2), 1, 4, 2, 5, 3, 6); /* a^T = [[1,2,3],[4,5,6]] */
    tg_tensor *b = T64((2, 3), 1, 3, 5, 2, 4, 6); /* b^T = [[1,2],[3,4],[5,6]] */
    /* a^T b^T = [[22,28],[49,64]] */
    EXPECT(tg_matmul(tg_transpose(a, 0, 1), tg_transpose(b, 0, 1)), (2, 2), 1e-15, 22, 28, 49,
           64);
    /* a^T a = [[14,32],[32,77]]... as (2,3)x(3,2) */
    EXPECT(tg_matmul(tg_transpose(a, 0, 1), a), (2, 2), 1e-15, 14, 32, 32, 77);
    /* a a^T (3,2)x(2,3) */
    EXPECT(tg_matmul(a, tg_transpose(a, 0, 1)), (3, 3), 1e-15, 17, 22, 27, 22, 29, 36, 27, 36, 45);
}

OPS_TEST(matmul_batched_with_a_shared_matrix)
{
    /* (2,2,3) x (3,2) -> (2,2,2) */
    tg_tensor *a = tg_reshape(tg_arange(TG_F64, 0, 12, 1), 3, SHAPE(2, 2, 3));
    tg_tensor *b = T64((3, 2), 1, 0, 0, 1, 1, 1);
    EXPECT(tg_matmul(a, b), (2, 2, 2), 1e-15, 2, 3, 8, 9, 14, 15, 20, 21);
    /* (2,2) x (2,2,2): the matrix is broadcast on the left */
    tg_tensor *c = tg_reshape(tg_arange(TG_F64, 0, 8, 1), 3, SHAPE(2, 2, 2));
    EXPECT(tg_matmul(T64((2, 2), 1, 1, 0, 1), c), (2, 2, 2), 1e-15, 2, 4, 2, 3, 10, 12, 6, 7);
}

OPS_TEST(matmul_batched_broadcasts_batch_dims)
{
    /* (2,1,2,3) x (4,3,2) -> (2,4,2,2) */
    double av[12], bv[24], want[32];
    for (int i = 0; i < 12; i++) av[i] = 0.5 * i - 2;
    for (int i = 0; i < 24; i++) bv[i] = (i % 5) - 1.5;
    tg_tensor *a = tg_tensor_from_data(TG_F64, 4, SHAPE(2, 1, 2, 3), av);
    tg_tensor *b = tg_tensor_from_data(TG_F64, 3, SHAPE(4, 3, 2), bv);
    ref_matmul(2, SHAPE(2, 1), SHAPE(1, 4), 2, 3, 2, av, bv, want);
    tu_expect_tensor(__LINE__, tg_matmul(a, b), 4, SHAPE(2, 4, 2, 2), want, 32, 1e-14);
    /* (1,2,2) x (3,2,2) -> (3,2,2) */
    tg_tensor *c = T64((1, 2, 2), 1, 2, 3, 4);
    tg_tensor *d = tg_reshape(tg_arange(TG_F64, 0, 12, 1), 3, SHAPE(3, 2, 2));
    EXPECT(tg_matmul(c, d), (3, 2, 2), 1e-15,
           4, 7, 8, 15,
           16, 19, 36, 43,
           28, 31, 64, 71);
}

OPS_TEST(matmul_of_a_batched_transposed_view)
{
    /* x (2,3,2) viewed as x^T (2,2,3) times y (3,1) */
    tg_tensor *x = tg_reshape(tg_arange(TG_F64, 0, 12, 1), 3, SHAPE(2, 3, 2));
    tg_tensor *y = T64((3, 1), 1, 2, 3);
    /* batch 0: x0^T = [[0,2,4],[1,3,5]] -> [16, 22]; batch 1: [[6,8,10],[7,9,11]] -> [52, 58] */
    EXPECT(tg_matmul(tg_transpose(x, -1, -2), y), (2, 2, 1), 1e-15, 16, 22, 52, 58);
    /* a permuted batch layout that is neither form is copied first */
    tg_tensor *p = tg_permute(x, 3, DIMS(1, 0, 2)); /* (3,2,2) */
    double xv[12], pv[12], want[12];
    for (int i = 0; i < 12; i++) xv[i] = i;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 2; k++) pv[(i * 2 + j) * 2 + k] = xv[(j * 3 + i) * 2 + k];
    const double id2[4] = {2, 0, 0, 3};
    ref_matmul(1, SHAPE(3), SHAPE(1), 2, 2, 2, pv, id2, want);
    tu_expect_tensor(__LINE__, tg_matmul(p, T64((2, 2), 2, 0, 0, 3)), 3, SHAPE(3, 2, 2), want, 12,
                     1e-15);
}

/* ---- softmax family and losses */

OPS_TEST(softmax_rows_sum_to_one_and_match_hand_values)
{
    tg_tensor *x = T64((2, 3), 1, 2, 3, 0, 0, 0);
    tg_tensor *s = tg_softmax(x, 1);
    EXPECT(s, (2, 3), 1e-15, 0.09003057317038046, 0.24472847105479767, 0.6652409557748219,
           1.0 / 3, 1.0 / 3, 1.0 / 3);
    EXPECT(tg_sum_dims(s, 1, DIMS(1), false), (2), 1e-15, 1, 1);
    /* along dim 0 the columns sum to one */
    tg_tensor *s0 = tg_softmax(x, 0);
    EXPECT(tg_sum_dims(s0, 1, DIMS(0), false), (3), 1e-15, 1, 1, 1);
    EXPECT(s0, (2, 3), 1e-15, 0.7310585786300049, 0.8807970779778823, 0.9525741268224334,
           0.2689414213699951, 0.11920292202211755, 0.04742587317756678);
    /* huge inputs do not overflow */
    EXPECT(tg_softmax(T64((3), 1000, 1001, 1002), 0), (3), 1e-15, 0.09003057317038046,
           0.24472847105479767, 0.6652409557748219);
    EXPECT(tg_softmax(T32((3), 1, 2, 3), -1), (3), 1e-6, 0.09003057317038046,
           0.24472847105479767, 0.6652409557748219);
    /* a 3-d middle dim */
    tg_tensor *c = tg_softmax(tg_reshape(tg_arange(TG_F64, 0, 24, 1), 3, SHAPE(2, 3, 4)), 1);
    tg_tensor *cs = tg_sum_dims(c, 1, DIMS(1), false);
    double ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    tu_expect_tensor(__LINE__, cs, 2, SHAPE(2, 4), ones, 8, 1e-14);
}

OPS_TEST(log_softmax_is_stable_for_large_inputs)
{
    /* log_softmax([1,2,3]) = [1,2,3] - 3 - log(1 + e^-1 + e^-2) */
    EXPECT(tg_log_softmax(T64((3), 1, 2, 3), 0), (3), 1e-15, -2.40760596444438,
           -1.4076059644443804, -0.4076059644443803);
    /* Shifted by 1000 the answer is the same; e^1000 would overflow without
     * the max subtracted. Rounding at magnitude 1000 allows ~1e-13. */
    EXPECT(tg_log_softmax(T64((3), 1000, 1001, 1002), 0), (3), 1e-12, -2.40760596444438,
           -1.4076059644443804, -0.4076059644443803);
    EXPECT(tg_log_softmax(T64((2, 3), 1, 2, 3, 1000, 1001, 1002), 1), (2, 3), 1e-12,
           -2.40760596444438, -1.4076059644443804, -0.4076059644443803, -2.40760596444438,
           -1.4076059644443804, -0.4076059644443803);
    /* e^-1000 underflows, but the log-probability is still -1000, not -inf */
    EXPECT(tg_log_softmax(T64((2), -1000, 0), 0), (2), 1e-15, -1000, 0);
    EXPECT(tg_log_softmax(T32((3), 1000, 1001, 1002), 0), (3), 1e-5, -2.40760596444438,
           -1.4076059644443804, -0.4076059644443803);
}

OPS_TEST(cross_entropy_matches_the_hand_computed_mean)
{
    const int64_t t[2] = {2, 0};
    tg_tensor *logits = T64((2, 3), 1, 2, 3, 1, 1, 1);
    /* row 0: -log softmax([1,2,3])[2]; row 1: log 3 */
    EXPECT0(tg_cross_entropy(logits, targets(2, t)), 1e-14, 0.7531091265562451);
    tg_tensor *l32 = tg_cross_entropy(T32((2, 3), 1, 2, 3, 1, 1, 1), targets(2, t));
    EXPECT0(l32, 1e-6, 0.7531091265562451);
    cr_assert_eq(tg_tensor_dtype(l32), TG_F32);
    /* equals -mean of the picked log_softmax entries */
    tg_tensor *ls = tg_log_softmax(logits, 1);
    double a, b;
    tg_tensor_get(ls, 2, &a);
    tg_tensor_get(ls, 3, &b);
    EXPECT0(tg_cross_entropy(logits, targets(2, t)), 1e-14, -(a + b) / 2);
}

OPS_TEST(cross_entropy_is_finite_for_huge_logits)
{
    const int64_t t[2] = {0, 0};
    tg_tensor *logits = T64((2, 2), 1e4, 0, 0, 1e4);
    tg_tensor *l = tg_cross_entropy(logits, targets(2, t));
    double v = tu_item(l);
    cr_assert(isfinite(v), "[%s] loss %g", tg_backend_name(tu_cur), v);
    EXPECT0(l, 1e-12, 5000.0);
    tg_tensor *l32 = tg_cross_entropy(T32((2, 2), 1e4, 0, 0, 1e4), targets(2, t));
    v = tu_item(l32);
    cr_assert(isfinite(v), "[%s] f32 loss %g", tg_backend_name(tu_cur), v);
    EXPECT0(l32, 1e-6, 5000.0);
}

OPS_TEST(mse_loss_is_the_mean_squared_difference)
{
    EXPECT0(tg_mse_loss(T64((3), 1, 2, 3), T64((3), 1, 0, 5)), 1e-15, 8.0 / 3.0);
    EXPECT0(tg_mse_loss(T64((2, 2), 1, 2, 3, 4), T64((2, 2), 1, 2, 3, 4)), 1e-15, 0.0);
    EXPECT0(tg_mse_loss(T32((2), 0.5, -0.5), T32((2), 0, 0)), 1e-7, 0.25);
    tg_error_clear();
    cr_assert_null(tg_mse_loss(T64((3), 1, 2, 3), T64((1), 1)));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_error_clear();
}

/* ---- moving and converting */

OPS_TEST(to_device_moves_values_to_the_other_backend)
{
    tg_backend other = tu_cur == TG_BACKEND_CPU ? TG_BACKEND_REF : TG_BACKEND_CPU;
    tg_tensor *x = T64((2, 2), 1, 2, 3, 4);
    tg_tensor *y = tg_to_device(x, other);
    cr_assert_not_null(y);
    cr_assert_eq(tg_tensor_backend(y), other);
    double v;
    for (int i = 0; i < 4; i++) {
        tg_tensor_get(y, i, &v);
        cr_assert(fabs(v - (i + 1)) < 1e-15, "element %d", i);
    }
    /* and back; a strided view is moved in logical order */
    EXPECT(tg_to_device(y, tu_cur), (2, 2), 1e-15, 1, 2, 3, 4);
    tg_tensor *t = tg_to_device(tg_transpose(x, 0, 1), other);
    EXPECT(tg_to_device(t, tu_cur), (2, 2), 1e-15, 1, 3, 2, 4);
    /* to the same backend: a copy */
    EXPECT(tg_to_device(x, tu_cur), (2, 2), 1e-15, 1, 2, 3, 4);
    tg_error_clear();
    cr_assert_null(tg_to_device(x, (tg_backend)5));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID); /* a bad argument, not a device mismatch */
    tg_error_clear();
}

OPS_TEST(cast_converts_between_dtypes)
{
    tg_tensor *x = T64((3), 1.5, -2.25, 3);
    tg_tensor *f = tg_cast(x, TG_F32);
    EXPECT(f, (3), 1e-15, 1.5, -2.25, 3);
    cr_assert_eq(tg_tensor_dtype(f), TG_F32);
    tg_tensor *d = tg_cast(T32((2), 0.1, 3), TG_F64);
    EXPECT(d, (2), 1e-15, (double)0.1f, 3);
    cr_assert_eq(tg_tensor_dtype(d), TG_F64);
    /* to i64 truncates toward zero; from i64 is exact */
    tg_tensor *i = tg_cast(T64((3), 1.7, -2.7, 5), TG_I64);
    EXPECT(i, (3), 1e-15, 1, -2, 5);
    cr_assert_eq(tg_tensor_dtype(i), TG_I64);
    tg_tensor *back = tg_cast(i, TG_F64);
    EXPECT(back, (3), 1e-15, 1, -2, 5);
    cr_assert_eq(tg_tensor_dtype(back), TG_F64);
    /* of a strided view */
    EXPECT(tg_cast(tg_transpose(T64((2, 2), 1, 2, 3, 4), 0, 1), TG_F32), (2, 2), 1e-15, 1, 3, 2, 4);
}

/* ---- a few gradients whose rules are documented in ops.h */

OPS_TEST(relu_gradient_is_zero_at_zero)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = T64((3), -1, 0, 2);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    cr_assert_eq(tg_backward(tg_sum(tg_relu(x))), TG_OK, "%s", tg_last_error_message());
    EXPECT(tg_grad(x), (3), 1e-15, 0, 0, 1);
    tg_tape_free(tape);
}

OPS_TEST(max_dim_gradient_goes_to_the_first_maximum)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = T64((2, 3), 1, 5, 5, 7, 7, 7);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    cr_assert_eq(tg_backward(tg_sum(tg_max_dim(x, 1, false))), TG_OK, "%s",
                 tg_last_error_message());
    EXPECT(tg_grad(x), (2, 3), 1e-15, 0, 1, 0, 1, 0, 0);
    tg_tape_free(tape);
}

OPS_TEST(broadcast_gradients_are_summed_back_to_the_input_shapes)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *col = T64((3, 1), 1, 2, 3);
    tg_tensor *row = T64((4), 1, 10, 100, 1000);
    tg_requires_grad(tape, col);
    tg_requires_grad(tape, row);
    /* L = sum(col * row): dL/dcol = sum(row), dL/drow = sum(col) */
    cr_assert_eq(tg_backward(tg_sum(tg_mul(col, row))), TG_OK, "%s", tg_last_error_message());
    EXPECT(tg_grad(col), (3, 1), 1e-15, 1111, 1111, 1111);
    EXPECT(tg_grad(row), (4), 1e-15, 6, 6, 6, 6);
    tg_tape_free(tape);
}

OPS_TEST(matmul_gradients_match_the_closed_form)
{
    /* L = sum(A B): dA = 1 B^T (row sums of B), dB = A^T 1 (column sums of A) */
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *A = T64((2, 3), 1, 2, 3, 4, 5, 6);
    tg_tensor *B = T64((3, 2), 1, -1, 2, 0.5, 0, 3);
    tg_requires_grad(tape, A);
    tg_requires_grad(tape, B);
    cr_assert_eq(tg_backward(tg_sum(tg_matmul(A, B))), TG_OK, "%s", tg_last_error_message());
    EXPECT(tg_grad(A), (2, 3), 1e-15, 0, 2.5, 3, 0, 2.5, 3);
    EXPECT(tg_grad(B), (3, 2), 1e-15, 5, 5, 7, 7, 9, 9);
    tg_tape_free(tape);
}

OPS_TEST(cross_entropy_gradient_is_softmax_minus_onehot_over_n)
{
    tg_tape *tape = tg_tape_new(NULL);
    const int64_t t[2] = {2, 0};
    tg_tensor *x = T64((2, 3), 1, 2, 3, 1, 1, 1);
    tg_requires_grad(tape, x);
    cr_assert_eq(tg_backward(tg_cross_entropy(x, targets(2, t))), TG_OK, "%s",
                 tg_last_error_message());
    EXPECT(tg_grad(x), (2, 3), 1e-14, 0.09003057317038046 / 2, 0.24472847105479767 / 2,
           (0.6652409557748219 - 1) / 2, (1.0 / 3 - 1) / 2, 1.0 / 6, 1.0 / 6);
    tg_tape_free(tape);
}

OPS_TEST(to_device_gradient_moves_back)
{
    tg_backend other = tu_cur == TG_BACKEND_CPU ? TG_BACKEND_REF : TG_BACKEND_CPU;
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = T64((2), 1, 2);
    tg_requires_grad(tape, x);
    tg_tensor *y = tg_to_device(x, other);
    cr_assert(tg_tensor_requires_grad(y));
    cr_assert_eq(tg_backward(tg_sum(tg_mul(y, y))), TG_OK, "%s", tg_last_error_message());
    EXPECT(tg_grad(x), (2), 1e-15, 2, 4);
    tg_tape_free(tape);
}

/* x * x: mul's backward makes g * x once for both inputs; the gradient is
 * still 2 x g exactly across pointwise blocks (20000 f64 are three 64 KiB
 * blocks), with the two operands distinct reshape views (two headers over
 * the same data). */
OPS_TEST(square_by_mul_has_gradient_two_x)
{
    enum { N = 20000 };
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = tg_arange(TG_F64, -1.0, 1.0, 2.0 / N);
    cr_assert_eq(tg_tensor_numel(x), N);
    tg_requires_grad(tape, x);
    tg_tensor *v = tg_reshape(x, 2, SHAPE(100, 200)); /* another header, the same values */
    cr_assert_eq(tg_backward(tg_sum(tg_mul_scalar(tg_mul(v, tg_reshape(x, 2, SHAPE(100, 200))),
                                                  3.0))), TG_OK, "%s", tg_last_error_message());
    const double *g = tg_tensor_data(tg_grad(x)), *xv = tg_tensor_data(x);
    size_t bad = 0;
    for (int i = 0; i < N; i++) bad += g[i] != 6.0 * xv[i];
    cr_expect_eq(bad, 0, "[%s] %zu of %d gradients differ from 6 x", tg_backend_name(tu_cur), bad,
                 N);
    tg_tape_free(tape);
}

/* affine(x, W, b) is matmul(x, W^T) + b as one node: for 2-d x its output
 * and its three gradients are bitwise those of the three-node graph; a
 * 3-d x gives the 2-d results of its flattened rows; bad shapes, dtypes
 * and NULL fail with the op named. */
static void affine_pair(tg_tensor *x, tg_tensor *w, tg_tensor *b, bool fused, tg_tensor **y,
                        tg_tensor **g)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *in[3] = {x = tg_detach(x), w = tg_detach(w), b = tg_detach(b)};
    for (int i = 0; i < 3; i++) tg_requires_grad(tape, in[i]);
    *y = fused ? tg_affine(x, w, b) : tg_add(tg_matmul(x, tg_transpose(w, 0, 1)), b);
    cr_assert(*y, "%s", tg_last_error_message());
    tg_tensor_retain(*y);
    cr_assert_eq(tg_backward(tg_sum(tg_mul(*y, *y))), TG_OK, "%s", tg_last_error_message());
    for (int i = 0; i < 3; i++) {
        g[i] = tg_tensor_retain(tg_grad(in[i]));
        tg_grad_zero(in[i]);
    }
    tg_tape_free(tape);
}

static void expect_same_bits(const tg_tensor *a, const tg_tensor *b, const char *what)
{
    int64_t n = tg_tensor_numel(a);
    cr_assert_eq(n, tg_tensor_numel(b), "%s: %lld vs %lld elements", what, (long long)n,
                 (long long)tg_tensor_numel(b));
    const double *p = tg_tensor_data((tg_tensor *)a), *q = tg_tensor_data((tg_tensor *)b);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += memcmp(&p[i], &q[i], sizeof p[i]) != 0;
    cr_expect_eq(bad, 0, "[%s] %s: %lld of %lld elements differ", tg_backend_name(tu_cur), what,
                 (long long)bad, (long long)n);
}

OPS_TEST(affine_is_matmul_then_add_as_one_node)
{
    tg_rng rng;
    tg_rng_seed(&rng, 11);
    tg_tensor *x = tg_rand_uniform(&rng, TG_F64, 2, SHAPE(7, 5), -1, 1);
    tg_tensor *w = tg_rand_uniform(&rng, TG_F64, 2, SHAPE(3, 5), -1, 1);
    tg_tensor *b = tg_rand_uniform(&rng, TG_F64, 1, SHAPE(3), -1, 1);
    tg_tensor *y[2], *g[2][3];
    for (int f = 0; f < 2; f++) affine_pair(x, w, b, f == 1, &y[f], g[f]);
    expect_same_bits(y[1], y[0], "output");
    const char *names[3] = {"gx", "gW", "gb"};
    for (int i = 0; i < 3; i++) expect_same_bits(g[1][i], g[0][i], names[i]);
    for (int f = 0; f < 2; f++) {
        tg_tensor_release(y[f]);
        for (int i = 0; i < 3; i++) tg_tensor_release(g[f][i]);
    }
    /* 3-d x: the rows of (2, 3, 5) are those of (6, 5) */
    tg_tensor *x3 = tg_rand_uniform(&rng, TG_F64, 3, SHAPE(2, 3, 5), -1, 1);
    tg_tensor *y3 = tg_affine(x3, w, b);
    cr_assert(y3, "%s", tg_last_error_message());
    cr_expect(tg_tensor_ndim(y3) == 3 && tg_tensor_shape(y3)[2] == 3);
    tg_tensor *y2 = tg_affine(tg_reshape(x3, 2, SHAPE(6, 5)), w, b);
    const double *p = tg_tensor_data(y3), *q = tg_tensor_data(y2);
    for (int i = 0; i < 18; i++) cr_expect_float_eq(p[i], q[i], 1e-15, "element %d", i);
    /* 1-d x: one row */
    tg_tensor *y1 = tg_affine(tg_reshape(x3, 1, SHAPE(30)), w, b);
    cr_expect_null(y1);
    cr_expect_eq(tg_last_error(), TG_ERR_SHAPE);
    cr_expect(strstr(tg_last_error_message(), "'affine'") != NULL, "%s", tg_last_error_message());
    cr_expect_eq(tg_tensor_numel(tg_affine(tg_narrow(tg_reshape(x3, 1, SHAPE(30)), 0, 0, 5), w,
                                           b)), 3);
    /* errors */
    tg_tensor *w4 = tg_rand_uniform(&rng, TG_F64, 2, SHAPE(3, 4), -1, 1);
    cr_expect_null(tg_affine(x, w4, b));
    cr_expect_eq(tg_last_error(), TG_ERR_SHAPE);
    cr_expect(strstr(tg_last_error_message(), "W [3,4]") != NULL, "%s", tg_last_error_message());
    tg_tensor *b32 = tg_rand_uniform(&rng, TG_F32, 1, SHAPE(3), -1, 1);
    cr_expect_null(tg_affine(x, w, b32));
    cr_expect_eq(tg_last_error(), TG_ERR_DTYPE);
    tg_error_clear(); /* a NULL input keeps an earlier error (the one that made it) */
    cr_expect_null(tg_affine(x, NULL, b));
    cr_expect_eq(tg_last_error(), TG_ERR_NULL);
    cr_expect(strstr(tg_last_error_message(), "#2 to 'affine'") != NULL, "%s",
              tg_last_error_message());
    tg_error_clear(); /* the open scope owns every tensor above */
}
