/* test_errors.c - status codes, the per-thread last error and its messages,
 * and the autodiff marks of the op registry (unmarked user ops above all). */
#include <criterion/criterion.h>
#include <tapegrad.h>

#include "test_util.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

TestSuite(errors, .init = tu_scope_setup, .fini = tu_scope_teardown);

/* ---- status codes and the last error */

Test(errors, strerror_is_non_empty_and_distinct_for_every_code)
{
    for (int i = 0; i < TG_STATUS_COUNT_; i++) {
        const char *s = tg_strerror((tg_status)i);
        cr_assert_not_null(s, "code %d", i);
        cr_assert_gt(strlen(s), 0, "code %d has an empty string", i);
        cr_assert_str_neq(s, "unknown status", "code %d", i);
        for (int j = 0; j < i; j++)
            cr_assert_str_neq(s, tg_strerror((tg_status)j), "codes %d and %d share \"%s\"", i, j, s);
    }
    cr_assert_str_eq(tg_strerror(TG_OK), "success");
    cr_assert_str_eq(tg_strerror(TG_STATUS_COUNT_), "unknown status");
    cr_assert_str_eq(tg_strerror((tg_status)-1), "unknown status");
}

Test(errors, no_error_at_thread_start_and_message_is_empty)
{
    cr_assert_eq(tg_last_error(), TG_OK);
    cr_assert_not_null(tg_last_error_message());
    cr_assert_str_eq(tg_last_error_message(), "");
}

Test(errors, error_clear_forgets_code_and_message)
{
    cr_assert_null(tg_exp(NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
    cr_assert_gt(strlen(tg_last_error_message()), 0);
    tg_error_clear();
    cr_assert_eq(tg_last_error(), TG_OK);
    cr_assert_str_eq(tg_last_error_message(), "");
}

Test(errors, errors_are_sticky_across_successful_calls)
{
    cr_assert_null(tg_exp(NULL));
    tg_tensor *x = tu_vec(2, VALS(1, 2));
    tg_tensor *y = tg_mul(x, x);
    cr_assert_not_null(y);
    cr_assert_eq(tg_last_error(), TG_ERR_NULL, "a successful call cleared the error");
    tu_expect_message_has("'exp'");
}

Test(errors, error_set_records_a_user_error)
{
    cr_assert_eq(tg_error_set(TG_ERR_UNSUPPORTED, "custom %d", 42), TG_ERR_UNSUPPORTED);
    cr_assert_eq(tg_last_error(), TG_ERR_UNSUPPORTED);
    cr_assert_str_eq(tg_last_error_message(), "custom 42");
}

/* ---- NULL propagation */

Test(errors, null_propagation_is_sticky_and_names_the_first_op)
{
    tg_tensor *x = tu_vec(2, VALS(1, 2));
    tg_tensor *y = tu_vec(2, VALS(3, 4));
    tg_tensor *r = tg_add(tg_mul(NULL, x), y);
    cr_assert_null(r);
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
    tu_expect_message_has("'mul'");
    tu_expect_message_has("#1");
    cr_assert(strstr(tg_last_error_message(), "'add'") == NULL,
              "the outer op overwrote the first error: %s", tg_last_error_message());
}

Test(errors, null_propagation_keeps_the_first_non_null_error)
{
    /* The first failure is a shape error; the NULL it produces must not
     * turn it into TG_ERR_NULL further out. */
    tg_tensor *a = tu_vec(3, VALS(1, 2, 3));
    tg_tensor *b = tu_vec(2, VALS(1, 2));
    tg_tensor *r = tg_exp(tg_sum(tg_mul(tg_add(a, b), a)));
    cr_assert_null(r);
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tu_expect_message_has("'add'");
}

Test(errors, null_second_argument_names_argument_two)
{
    tg_tensor *x = tu_vec(2, VALS(1, 2));
    cr_assert_null(tg_sub(x, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
    tu_expect_message_has("#2");
    tu_expect_message_has("'sub'");
}

Test(errors, null_into_accessors_and_backward_fails_with_null)
{
    double v;
    cr_assert_eq(tg_tensor_item(NULL, &v), TG_ERR_NULL);
    tg_error_clear();
    cr_assert_eq(tg_tensor_copy_out(NULL, &v, sizeof v), TG_ERR_NULL);
    tg_error_clear();
    cr_assert_null(tg_tensor_data(NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
    tg_error_clear();
    cr_assert_eq(tg_backward(NULL), TG_ERR_NULL);
    tg_error_clear();
    cr_assert_null(tg_reshape(NULL, 1, SHAPE(2)));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
    tg_error_clear();
    cr_assert_null(tg_transpose(NULL, 0, 1));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
    tg_error_clear();
    cr_assert_null(tg_to_device(NULL, TG_BACKEND_REF));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
}

/* ---- argument errors */

Test(errors, shapes_that_do_not_broadcast_fail_with_shape_naming_both)
{
    tg_tensor *a = tg_zeros(TG_F64, 2, SHAPE(2, 3));
    tg_tensor *b = tg_zeros(TG_F64, 1, SHAPE(4));
    cr_assert_null(tg_add(a, b));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tu_expect_message_has("'add'");
    tu_expect_message_has("[2,3]");
    tu_expect_message_has("[4]");
    tg_error_clear();
    cr_assert_null(tg_mul(tg_zeros(TG_F64, 2, SHAPE(3, 2)), tg_zeros(TG_F64, 2, SHAPE(2, 3))));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tu_expect_message_has("[3,2]");
    tu_expect_message_has("[2,3]");
}

Test(errors, matmul_inner_dim_mismatch_fails_with_shape)
{
    cr_assert_null(tg_matmul(tg_zeros(TG_F64, 2, SHAPE(2, 3)), tg_zeros(TG_F64, 2, SHAPE(4, 2))));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tu_expect_message_has("[2,3]");
    tu_expect_message_has("[4,2]");
    tg_error_clear();
    cr_assert_null(tg_matmul(tg_zeros(TG_F64, 1, SHAPE(3)), tg_zeros(TG_F64, 2, SHAPE(3, 2))));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
}

Test(errors, mismatched_dtypes_fail_with_dtype)
{
    tg_tensor *a = tg_zeros(TG_F32, 1, SHAPE(2));
    tg_tensor *b = tg_zeros(TG_F64, 1, SHAPE(2));
    cr_assert_null(tg_add(a, b));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
    tu_expect_message_has("f32");
    tu_expect_message_has("f64");
    tg_error_clear();
    cr_assert_null(tg_matmul(tg_zeros(TG_F32, 2, SHAPE(2, 2)), tg_zeros(TG_F64, 2, SHAPE(2, 2))));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
}

Test(errors, i64_into_a_floating_op_fails_with_dtype)
{
    tg_tensor *i = tg_arange(TG_I64, 0, 4, 1);
    cr_assert_null(tg_tanh(i));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
    tu_expect_message_has("'tanh'");
    tu_expect_message_has("i64");
    const char *names[] = {"exp", "sum", "softmax"};
    tg_tensor *r[3];
    tg_error_clear();
    r[0] = tg_exp(i);
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE, "%s", names[0]);
    tg_error_clear();
    r[1] = tg_sum(i);
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE, "%s", names[1]);
    tg_error_clear();
    r[2] = tg_softmax(i, 0);
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE, "%s", names[2]);
    for (int k = 0; k < 3; k++) cr_assert_null(r[k], "%s accepted i64", names[k]);
}

Test(errors, tensors_on_two_backends_fail_with_device_naming_both)
{
    tg_backend prev = tg_set_default_backend(TG_BACKEND_REF);
    tg_tensor *a = tg_ones(TG_F64, 1, SHAPE(2));
    tg_set_default_backend(TG_BACKEND_CPU);
    tg_tensor *b = tg_ones(TG_F64, 1, SHAPE(2));
    tg_set_default_backend(prev);
    cr_assert_null(tg_add(a, b));
    cr_assert_eq(tg_last_error(), TG_ERR_DEVICE);
    tu_expect_message_has("'ref'");
    tu_expect_message_has("'cpu'");
    tu_expect_message_has("'add'");
    /* moving one fixes it */
    tg_error_clear();
    tg_tensor *c = tg_add(tg_to_device(a, TG_BACKEND_CPU), b);
    tu_expect_values(c, VALS(2, 2), 2, 1e-15);
    cr_assert_eq(tg_last_error(), TG_OK);
}

Test(errors, cross_entropy_with_an_out_of_range_target_fails_with_invalid)
{
    tg_tensor *logits = tg_zeros(TG_F64, 2, SHAPE(2, 3));
    const int64_t bad[2] = {0, 3}, neg[2] = {-1, 0};
    tg_tensor *t1 = tg_tensor_from_data(TG_I64, 1, SHAPE(2), bad);
    tg_tensor *t2 = tg_tensor_from_data(TG_I64, 1, SHAPE(2), neg);
    cr_assert_null(tg_cross_entropy(logits, t1));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tu_expect_message_has("'cross_entropy'");
    tu_expect_message_has("3");
    tg_error_clear();
    cr_assert_null(tg_cross_entropy(logits, t2));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tu_expect_message_has("-1");
}

Test(errors, cross_entropy_with_floating_targets_fails_with_dtype)
{
    tg_tensor *logits = tg_zeros(TG_F64, 2, SHAPE(2, 3));
    tg_tensor *t = tg_zeros(TG_F64, 1, SHAPE(2));
    cr_assert_null(tg_cross_entropy(logits, t));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
}

Test(errors, out_of_range_dims_fail_with_invalid)
{
    tg_tensor *x = tg_zeros(TG_F64, 2, SHAPE(2, 3));
    cr_assert_null(tg_softmax(x, 2));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tg_error_clear();
    cr_assert_null(tg_max_dim(x, -3, false));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tg_error_clear();
    cr_assert_null(tg_sum_dims(x, 1, (const int[]){5}, false));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tg_error_clear();
    cr_assert_null(tg_transpose(x, 0, 2));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tg_error_clear();
    cr_assert_null(tg_permute(x, 2, (const int[]){0, 0}));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
}

/* ---- the op registry and autodiff marks */

static tg_status f64_same_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                                tg_spec *out)
{
    (void)a;
    for (int i = 0; i < op->arity; i++)
        if (tg_tensor_dtype(in[i]) != TG_F64)
            return tg_error_set(TG_ERR_DTYPE, "bad argument #%d to '%s' (need f64)", i + 1,
                                op->name);
    out->dtype = TG_F64;
    out->ndim = tg_tensor_ndim(in[0]);
    for (int i = 0; i < out->ndim; i++) out->shape[i] = tg_tensor_shape(in[0])[i];
    return TG_OK;
}

/* foo(x) = 2x + 1 */
static tg_tensor *foo_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    const double *x = tg_tensor_data(in[0]);
    double *p = tg_tensor_data(y);
    for (int64_t i = 0; i < tg_tensor_numel(y); i++) p[i] = 2.0 * x[i] + 1.0;
    return y;
}

/* bar(x, y) = x - y */
static tg_tensor *bar_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    const double *a = tg_tensor_data(in[0]), *b = tg_tensor_data(in[1]);
    double *p = tg_tensor_data(y);
    for (int64_t i = 0; i < tg_tensor_numel(y); i++) p[i] = a[i] - b[i];
    return y;
}

static tg_status foo_bwd(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin)
{
    (void)ctx;
    gin[0] = tg_mul_scalar(gout, 2.0);
    return gin[0] ? TG_OK : tg_last_error();
}

static int foo_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    (void)a;
    if (k > 0) return 0;
    in[0] = tg_rand_uniform(rng, TG_F64, 1, SHAPE(3), -1.0, 1.0);
    return in[0] ? 1 : -1;
}

static const tg_op foo_def = {
    .name = "foo", .doc = "y = 2x + 1 (unmarked)", .arity = 1, .shape = f64_same_shape,
    .forward = foo_fwd,
};

static const tg_op *register_foo(void)
{
    cr_assert_eq(tg_op_register(&foo_def), TG_OK, "%s", tg_last_error_message());
    const tg_op *op = tg_op_find("foo");
    cr_assert_not_null(op);
    cr_assert_eq(tg_op_mark(op), TG_AD_UNMARKED);
    cr_assert_str_eq(tg_ad_mark_name(tg_op_mark(op)), "unmarked");
    return op;
}

Test(errors, unmarked_op_on_a_tracked_input_fails_with_op_name)
{
    const tg_op *foo = register_foo();
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = tu_vec(3, VALS(1, 2, 3));
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    tg_tensor *in[1] = {x};
    size_t mem = tg_mem_current_bytes();
    tg_tensor *y = tg_op_call(foo, 1, in, NULL);
    cr_assert_null(y);
    cr_assert_eq(tg_last_error(), TG_ERR_NOT_DIFFERENTIABLE);
    tu_expect_message_has("op 'foo' is not marked for autodiff: input 0 requires grad");
    cr_assert_eq(tg_tape_node_count(tape), 0, "the failed call left a node");
    cr_assert_eq(tg_mem_current_bytes(), mem, "the failed call leaked tensor data");

    /* the same tape is still usable: L = sum(x * x) -> dL/dx = 2x */
    tg_error_clear();
    tg_tensor *loss = tg_sum(tg_mul(x, x));
    cr_assert_not_null(loss, "%s", tg_last_error_message());
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    tu_expect_values(tg_grad(x), VALS(2, 4, 6), 3, 1e-12);
    cr_assert_eq(tg_last_error(), TG_OK);
    tg_tape_free(tape);
}

Test(errors, unmarked_op_on_an_interior_tracked_input_fails_too)
{
    const tg_op *foo = register_foo();
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = tu_vec(2, VALS(1, 2));
    tg_requires_grad(tape, x);
    tg_tensor *in[1] = {tg_exp(x)};
    cr_assert_null(tg_op_call(foo, 1, in, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_NOT_DIFFERENTIABLE);
    tu_expect_message_has("'foo'");
    cr_assert_eq(tg_tape_node_count(tape), 1);
    tg_tape_free(tape);
}

Test(errors, unmarked_op_names_the_tracked_input_by_index)
{
    const tg_op bar = {
        .name = "bar", .doc = "y = a - b (unmarked)", .arity = 2, .shape = f64_same_shape,
        .forward = bar_fwd,
    };
    cr_assert_eq(tg_op_register(&bar), TG_OK);
    const tg_op *op = tg_op_find("bar");
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *a = tu_vec(2, VALS(5, 6));
    tg_tensor *b = tu_vec(2, VALS(1, 2));
    tg_requires_grad(tape, b);
    tg_tensor *in[2] = {a, b};
    cr_assert_null(tg_op_call(op, 2, in, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_NOT_DIFFERENTIABLE);
    tu_expect_message_has("op 'bar' is not marked for autodiff: input 1 requires grad");
    tg_tape_free(tape);
}

Test(errors, unmarked_op_on_an_untracked_or_detached_input_runs)
{
    const tg_op *foo = register_foo();
    tg_tensor *u = tu_vec(3, VALS(1, -2, 0.5));
    tg_tensor *in[1] = {u};
    tg_tensor *y = tg_op_call(foo, 1, in, NULL);
    tu_expect_values(y, VALS(3, -3, 2), 3, 1e-15);
    cr_assert_not(tg_tensor_requires_grad(y));

    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = tu_vec(2, VALS(4, 5));
    tg_requires_grad(tape, x);
    tg_tensor *din[1] = {tg_detach(x)};
    tg_tensor *z = tg_op_call(foo, 1, din, NULL);
    tu_expect_values(z, VALS(9, 11), 2, 1e-15);
    cr_assert_not(tg_tensor_requires_grad(z));
    cr_assert_eq(tg_tape_node_count(tape), 0);
    cr_assert_eq(tg_last_error(), TG_OK);

    /* in no-grad mode a tracked input is fine as well */
    bool prev = tg_grad_set_enabled(false);
    tg_tensor *xin[1] = {x};
    tg_tensor *w = tg_op_call(foo, 1, xin, NULL);
    tg_grad_set_enabled(prev);
    tu_expect_values(w, VALS(9, 11), 2, 1e-15);
    tg_tape_free(tape);
}

Test(errors, unmarked_op_shape_rule_errors_come_through)
{
    const tg_op *foo = register_foo();
    tg_tensor *in[1] = {tg_zeros(TG_F32, 1, SHAPE(2))};
    cr_assert_null(tg_op_call(foo, 1, in, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
    tu_expect_message_has("'foo'");
}

Test(errors, user_op_with_a_backward_is_recorded_and_differentiated)
{
    tg_op def = foo_def;
    def.name = "foo_with_backward";
    def.backward = foo_bwd;
    def.sample = foo_sample;
    cr_assert_eq(tg_op_register(&def), TG_OK, "%s", tg_last_error_message());
    const tg_op *op = tg_op_find("foo_with_backward");
    cr_assert_eq(tg_op_mark(op), TG_AD_BACKWARD);
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = tu_vec(2, VALS(1, 3));
    tg_requires_grad(tape, x);
    tg_tensor *in[1] = {x};
    tg_tensor *y = tg_op_call(op, 1, in, NULL);
    tu_expect_values(y, VALS(3, 7), 2, 1e-15);
    cr_assert(tg_tensor_requires_grad(y));
    /* L = sum(foo(x)^2) -> dL/dx = 2 foo(x) * 2 */
    cr_assert_eq(tg_backward(tg_sum(tg_mul(y, y))), TG_OK, "%s", tg_last_error_message());
    tu_expect_values(tg_grad(x), VALS(12, 28), 2, 1e-12);
    tg_tape_free(tape);
}

Test(errors, nondifferentiable_user_op_on_a_tracked_input_gives_an_untracked_result)
{
    tg_op def = foo_def;
    def.name = "foo_nondiff";
    def.nondifferentiable = true;
    cr_assert_eq(tg_op_register(&def), TG_OK, "%s", tg_last_error_message());
    const tg_op *op = tg_op_find("foo_nondiff");
    cr_assert_eq(tg_op_mark(op), TG_AD_NONDIFFERENTIABLE);
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = tu_vec(2, VALS(1, 3));
    tg_requires_grad(tape, x);
    tg_tensor *in[1] = {x};
    tg_tensor *y = tg_op_call(op, 1, in, NULL);
    tu_expect_values(y, VALS(3, 7), 2, 1e-15);
    cr_assert_not(tg_tensor_requires_grad(y));
    cr_assert_eq(tg_tape_node_count(tape), 0);
    tg_tape_free(tape);
}

Test(errors, register_rejects_a_duplicate_name_with_exists)
{
    cr_assert_eq(tg_op_register(&foo_def), TG_OK);
    int n = tg_op_count();
    cr_assert_eq(tg_op_register(&foo_def), TG_ERR_EXISTS);
    cr_assert_eq(tg_last_error(), TG_ERR_EXISTS);
    tu_expect_message_has("'foo'");
    cr_assert_eq(tg_op_count(), n);
    tg_op builtin = foo_def;
    builtin.name = "matmul";
    tg_error_clear();
    cr_assert_eq(tg_op_register(&builtin), TG_ERR_EXISTS);
}

Test(errors, register_rejects_backward_plus_nondifferentiable_with_invalid)
{
    tg_op def = foo_def;
    def.name = "both_marks";
    def.backward = foo_bwd;
    def.sample = foo_sample;
    def.nondifferentiable = true;
    cr_assert_eq(tg_op_register(&def), TG_ERR_INVALID);
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tg_error_clear();
    cr_assert_null(tg_op_find("both_marks"));
    cr_assert_eq(tg_last_error(), TG_ERR_NOT_FOUND);
}

Test(errors, register_rejects_arity_out_of_range_with_invalid)
{
    tg_op def = foo_def;
    def.name = "arity_zero";
    def.arity = 0;
    cr_assert_eq(tg_op_register(&def), TG_ERR_INVALID);
    def.name = "arity_five";
    def.arity = TG_OP_MAX_INPUTS + 1;
    tg_error_clear();
    cr_assert_eq(tg_op_register(&def), TG_ERR_INVALID);
    def.arity = -1;
    tg_error_clear();
    cr_assert_eq(tg_op_register(&def), TG_ERR_INVALID);
    tg_error_clear();
    cr_assert_null(tg_op_find("arity_zero"));
    cr_assert_null(tg_op_find("arity_five"));
}

Test(errors, register_rejects_missing_fields)
{
    cr_assert_eq(tg_op_register(NULL), TG_ERR_NULL);
    tg_op def = foo_def;
    def.name = NULL;
    tg_error_clear();
    cr_assert_eq(tg_op_register(&def), TG_ERR_INVALID);
    def.name = "";
    tg_error_clear();
    cr_assert_eq(tg_op_register(&def), TG_ERR_INVALID);
    def.name = "no_forward";
    def.forward = NULL;
    tg_error_clear();
    cr_assert_eq(tg_op_register(&def), TG_ERR_INVALID);
    def.forward = foo_fwd;
    def.shape = NULL;
    tg_error_clear();
    cr_assert_eq(tg_op_register(&def), TG_ERR_INVALID);
}

Test(errors, register_copies_the_definition_and_its_name)
{
    char name[16] = "copied_op";
    tg_op def = foo_def;
    def.name = name;
    cr_assert_eq(tg_op_register(&def), TG_OK);
    strcpy(name, "scribbled");
    def.arity = 3;
    const tg_op *op = tg_op_find("copied_op");
    cr_assert_not_null(op);
    cr_assert_str_eq(op->name, "copied_op");
    cr_assert_eq(op->arity, 1);
    tg_error_clear();
    cr_assert_null(tg_op_find("scribbled"));
    cr_assert_eq(tg_last_error(), TG_ERR_NOT_FOUND);
}

Test(errors, op_call_with_the_wrong_number_of_inputs_fails_with_invalid)
{
    const tg_op *foo = register_foo();
    tg_tensor *in[2] = {tu_vec(1, VALS(1)), tu_vec(1, VALS(2))};
    cr_assert_null(tg_op_call(foo, 2, in, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tg_error_clear();
    cr_assert_null(tg_op_call(NULL, 1, in, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
}

Test(errors, builtin_marks_match_the_design)
{
    cr_assert_eq(tg_op_mark(tg_op_find("add")), TG_AD_BACKWARD);
    cr_assert_eq(tg_op_mark(tg_op_find("matmul")), TG_AD_BACKWARD);
    cr_assert_eq(tg_op_mark(tg_op_find("argmax")), TG_AD_NONDIFFERENTIABLE);
    cr_assert_eq(tg_op_mark(tg_op_find("gt")), TG_AD_NONDIFFERENTIABLE);
    cr_assert_eq(tg_op_mark(tg_op_find("eq")), TG_AD_NONDIFFERENTIABLE);
    cr_assert_str_eq(tg_ad_mark_name(TG_AD_BACKWARD), "yes");
    cr_assert_str_eq(tg_ad_mark_name(TG_AD_NONDIFFERENTIABLE), "non-differentiable");
    cr_assert_eq(tg_op_find("matmul")->cost, TG_COST_COMPUTE_BOUND);
    cr_assert_str_eq(tg_cost_name(TG_COST_COMPUTE_BOUND), "compute-bound");
    cr_assert_str_eq(tg_cost_name(TG_COST_MEMORY_BOUND), "memory-bound");
    tg_error_clear();
    cr_assert_null(tg_op_find("no_such_op"));
    cr_assert_eq(tg_last_error(), TG_ERR_NOT_FOUND);
}

Test(errors, comparisons_on_tracked_inputs_are_untracked)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = tu_vec(3, VALS(1, 5, 3));
    tg_requires_grad(tape, x);
    tg_tensor *g = tg_gt(x, tu_vec(3, VALS(2, 2, 2)));
    tu_expect_values(g, VALS(0, 1, 1), 3, 1e-15);
    cr_assert_not(tg_tensor_requires_grad(g));
    tg_tensor *am = tg_argmax(x, 0, false);
    cr_assert_not(tg_tensor_requires_grad(am));
    cr_assert_eq(tg_tape_node_count(tape), 0);
    tg_tape_free(tape);
}

Test(errors, registry_iteration_covers_every_entry)
{
    int n = tg_op_count();
    cr_assert_gt(n, 30);
    for (int i = 0; i < n; i++) {
        const tg_op *op = tg_op_at(i);
        cr_assert_not_null(op, "entry %d", i);
        cr_assert_eq(tg_op_find(op->name), op, "entry %d '%s'", i, op->name);
    }
    tg_error_clear();
    cr_assert_null(tg_op_at(n));
    cr_assert_eq(tg_last_error(), TG_ERR_NOT_FOUND);
}

/* ---- per-thread state */

struct thread_result {
    tg_status before, after;
    char message[256];
};

static void *fail_on_a_thread(void *arg)
{
    struct thread_result *r = arg;
    r->before = tg_last_error();
    (void)tg_exp(NULL);
    r->after = tg_last_error();
    strncpy(r->message, tg_last_error_message(), sizeof r->message - 1);
    return NULL;
}

Test(errors, last_error_is_per_thread)
{
    /* main thread has a shape error pending */
    cr_assert_null(tg_add(tg_zeros(TG_F64, 1, SHAPE(2)), tg_zeros(TG_F64, 1, SHAPE(3))));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    struct thread_result r = {0};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, fail_on_a_thread, &r), 0);
    cr_assert_eq(pthread_join(th, NULL), 0);
    cr_assert_eq(r.before, TG_OK, "the thread saw the main thread's error");
    cr_assert_eq(r.after, TG_ERR_NULL);
    cr_assert(strstr(r.message, "'exp'") != NULL, "thread message: %s", r.message);
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE, "the thread's error leaked into the main thread");
    tu_expect_message_has("'add'");
}

/* ---- Issue 15 items 11-13: messages that name the right op and problem. */

/* |x| as sqrt(x * x): at 0 the analytic gradient is inf * 0 = NaN, the
 * numeric one 0. */
static tg_tensor *abs_by_sqrt(void *ud, int n, tg_tensor *const *in)
{
    (void)ud;
    (void)n;
    return tg_sqrt(tg_mul(in[0], in[0]));
}

Test(errors, gradcheck_of_a_nan_gradient_says_nan_and_where)
{
    tg_tensor *x = T64((3), 1, 0, 2);
    tg_gradcheck_result res[1];
    cr_assert_eq(tg_gradcheck(abs_by_sqrt, NULL, 1, &x, NULL, res), TG_ERR_GRADCHECK);
    cr_assert(isnan(res[0].max_abs_err), "max abs error %g", res[0].max_abs_err);
    cr_assert_eq(res[0].worst_index, 1);
    tu_expect_message_has("nan, max rel error ");
    tu_expect_message_has("worst at index 1: analytic ");
    tu_expect_message_has("nan, numeric 0 (NaN)");
    tg_error_clear();
}

Test(errors, transpose_errors_name_transpose_and_its_arguments)
{
    tg_tensor *x = T64((2, 2), 1, 2, 3, 4);
    cr_assert_null(tg_transpose(x, 0, 5));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tu_expect_message_has("bad argument #3 to 'transpose' (dim 5 out of range for 2 dims)");
    tg_error_clear();
    cr_assert_null(tg_transpose(x, -3, 0));
    tu_expect_message_has("bad argument #2 to 'transpose' (dim -3");
    tg_error_clear();
}

Test(errors, empty_dims_on_i64_name_the_reduction)
{
    tg_tensor *x = I64((2), 1, 2);
    cr_assert_null(tg_sum_dims(x, 0, NULL, false));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
    tu_expect_message_has("to 'sum'");
    tg_error_clear();
    cr_assert_null(tg_mean_dims(x, 0, NULL, true));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
    tu_expect_message_has("to 'mean'");
    tg_error_clear();
}

Test(errors, null_arrays_fail_with_null_not_a_count)
{
    cr_assert_null(tg_concat(2, NULL, 0));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
    tu_expect_message_has("bad argument #2 to 'concat' (NULL tensor array)");
    tg_error_clear();
    const tg_op *relu = tg_op_find("relu");
    cr_assert_not_null(relu);
    cr_assert_null(tg_op_call(relu, 1, NULL, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
    tu_expect_message_has("bad argument #3 to 'op_call' (NULL input array for 'relu')");
    tg_error_clear();
    tg_tensor *x = T64((1), 1);
    cr_assert_null(tg_to_device(x, (tg_backend)5));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tu_expect_message_has("bad argument #2 to 'to_device' (no backend 5)");
    tg_error_clear();
}

Test(errors, an_invalid_backend_is_an_error_everywhere)
{
    tg_backend before = tg_default_backend();
    cr_assert_eq(tg_set_default_backend((tg_backend)7), before);
    cr_assert_eq(tg_default_backend(), before);
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tu_expect_message_has("bad argument #1 to 'set_default_backend' (no backend 7)");
    tg_error_clear();
    tg_op_check rep;
    cr_assert_eq(tg_gradcheck_op(tg_op_find("relu"), (tg_backend)7, NULL, &rep), TG_ERR_INVALID);
    tu_expect_message_has("bad argument #2 to 'gradcheck_op' (no backend 7)");
    cr_assert_eq(rep.cases, 0);
    cr_assert_eq(tg_gradgradcheck_op(tg_op_find("relu"), (tg_backend)-1, NULL, NULL),
                 TG_ERR_INVALID);
    tg_error_clear();
}

/* ---- Registry entries called directly (tg_op_call) check what their
 * public wrappers would have checked: each case reached a missing kernel
 * or wrote out of bounds before (found by fuzz/fuzz_ops). */
static tg_tensor *call(const char *name, int n, tg_tensor *a, tg_tensor *b, tg_tensor *c,
                       const tg_op_attrs *attrs)
{
    tg_tensor *in[3] = {a, b, c};
    const tg_op *op = tg_op_find(name);
    cr_assert_not_null(op, "%s", name);
    return tg_op_call(op, n, in, attrs);
}

Test(errors, internal_backward_ops_called_directly_check_their_inputs)
{
    tg_tensor *i = I64((2, 2), 0, 1, 1, 0), *f = T64((2, 2), 0.1, 0.2, 0.3, 0.4);
    tg_op_attrs dim0 = {.nints = 1, .ints = {0}};
    cr_assert_null(call("softmax_backward", 2, i, i, NULL, &dim0));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
    tu_expect_message_has("'softmax_backward'");
    tg_error_clear();
    tg_op_attrs dim5 = {.nints = 1, .ints = {5}};
    cr_assert_null(call("log_softmax_backward", 2, f, f, NULL, &dim5));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tu_expect_message_has("(dim 5 out of range for 2 dims)");
    tg_error_clear();

    /* max_dim_backward(idx, gy): the indices must fit the target shape. */
    tg_tensor *idx = I64((2), 0, 7), *gy = T64((2), 1, 1);
    tg_op_attrs tgt = {.nints = 2, .ints = {2, 3}, .target = 1};
    cr_assert_null(call("max_dim_backward", 2, idx, gy, NULL, &tgt));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tu_expect_message_has("(index 7 at position 1 outside [0, 3))");
    tg_error_clear();
    tg_op_attrs bad_dim = {.nints = 2, .ints = {2, 3}, .target = 4};
    cr_assert_null(call("max_dim_backward", 2, idx, gy, NULL, &bad_dim));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tg_error_clear();
    tg_op_attrs huge = {.nints = 2, .ints = {2, -8}, .target = 0};
    cr_assert_null(call("max_dim_backward", 2, idx, gy, NULL, &huge));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_error_clear();

    /* cross_entropy_backward(logp, targets, g) */
    tg_tensor *t = I64((2), 0, 9), *g = tg_scalar(TG_F64, 1);
    cr_assert_null(call("cross_entropy_backward", 3, i, t, tg_scalar(TG_I64, 1), NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
    tg_error_clear();
    cr_assert_null(call("cross_entropy_backward", 3, f, t, g, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tu_expect_message_has("(target 9 at index 1 outside [0,2))");
    tg_error_clear();
    cr_assert_null(call("cross_entropy_backward", 3, f, I64((3), 0, 0, 0), g, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_error_clear();

    /* reshape's shape attribute is checked as a creation shape. */
    tg_tensor *empty = tg_zeros(TG_F64, 1, SHAPE(0));
    tg_op_attrs neg = {.nints = 2, .ints = {-1, 0}};
    cr_assert_null(call("reshape", 1, empty, NULL, NULL, &neg));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tu_expect_message_has("bad argument to 'reshape' (dim 0 has negative size -1)");
    tg_error_clear();
    tg_op_attrs neg2 = {.nints = 2, .ints = {-2, -1}};
    cr_assert_null(call("expand", 1, T64((1), 1), NULL, NULL, &neg2));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_error_clear(); /* the suite's scope releases the tensors */
}
