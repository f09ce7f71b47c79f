/* test_tape.c - the tape: leaves, recording, backward, accumulation, reset,
 * staleness, seeds, saved-byte accounting and failure atomicity. */
#include <criterion/criterion.h>
#include <tapegrad.h>

#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static tg_tensor *leaf(tg_tape *tape, int64_t n, const double *v)
{
    tg_tensor *t = tu_vec(n, v);
    cr_assert_eq(tg_requires_grad(tape, t), TG_OK, "%s", tg_last_error_message());
    return t;
}

static void expect_grad(const tg_tensor *x, const double *want, int64_t n)
{
    tg_tensor *g = tg_grad(x);
    cr_assert_not_null(g, "no gradient: %s", tg_last_error_message());
    tu_expect_values(g, want, n, 1e-12);
}

TestSuite(tape, .init = tu_scope_setup, .fini = tu_scope_teardown);

/* ---- leaves and tracking */

Test(tape, leaves_and_interior_results_require_grad_and_plain_tensors_do_not)
{
    tg_tape *tape = tg_tape_new(NULL);
    cr_assert_not_null(tape);
    tg_tensor *x = leaf(tape, 3, VALS(1, 2, 3));
    tg_tensor *c = tu_vec(3, VALS(4, 5, 6));
    cr_assert(tg_tensor_requires_grad(x));
    cr_assert(tg_tensor_is_leaf(x));
    cr_assert_not(tg_tensor_requires_grad(c));
    cr_assert_not(tg_tensor_is_leaf(c));
    tg_tensor *y = tg_mul(x, c);
    cr_assert(tg_tensor_requires_grad(y));
    cr_assert_not(tg_tensor_is_leaf(y));
    cr_assert_eq(tg_tape_node_count(tape), 1);
    tg_tensor *z = tg_mul(c, c); /* no tracked input: nothing recorded */
    cr_assert_not(tg_tensor_requires_grad(z));
    cr_assert_eq(tg_tape_node_count(tape), 1);
    tu_expect_values(y, VALS(4, 10, 18), 3, 1e-15);
    tg_tape_free(tape);
}

Test(tape, marking_a_leaf_twice_on_the_same_tape_is_ok)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 2, VALS(1, 2));
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    tg_backward(tg_sum(tg_mul(x, x)));
    expect_grad(x, VALS(2, 4), 2);
    tg_tape_free(tape);
}

Test(tape, marking_an_interior_result_as_a_leaf_fails_with_invalid)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 2, VALS(1, 2));
    tg_tensor *y = tg_exp(x);
    cr_assert_eq(tg_requires_grad(tape, y), TG_ERR_INVALID);
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    cr_assert_not(tg_tensor_is_leaf(y));
    tg_tape_free(tape);
}

Test(tape, marking_a_leaf_of_another_tape_fails_with_tape)
{
    tg_tape *t1 = tg_tape_new(NULL), *t2 = tg_tape_new(NULL);
    tg_tensor *x = leaf(t1, 2, VALS(1, 2));
    cr_assert_eq(tg_requires_grad(t2, x), TG_ERR_TAPE);
    tg_tape_free(t1);
    tg_tape_free(t2);
}

Test(tape, requires_grad_with_null_arguments_fails_with_null)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = tu_vec(1, VALS(1));
    cr_assert_eq(tg_requires_grad(NULL, x), TG_ERR_NULL);
    tg_error_clear();
    cr_assert_eq(tg_requires_grad(tape, NULL), TG_ERR_NULL);
    tg_tape_free(tape);
}

/* ---- backward */

Test(tape, backward_of_a_scalar_leaf_gives_gradient_one)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = tg_scalar(TG_F64, 3.0);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    cr_assert_eq(tg_backward(x), TG_OK, "%s", tg_last_error_message());
    expect_grad(x, VALS(1), 1);
    tg_tape_free(tape);
}

Test(tape, backward_fills_gradients_of_a_small_graph)
{
    /* L = sum(a * b + exp(a)); dL/da = b + e^a, dL/db = a */
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *a = leaf(tape, 3, VALS(0.5, -1.0, 2.0));
    tg_tensor *b = leaf(tape, 3, VALS(3.0, 4.0, -5.0));
    tg_tensor *loss = tg_sum(tg_add(tg_mul(a, b), tg_exp(a)));
    cr_assert_not_null(loss, "%s", tg_last_error_message());
    double want_loss = 1.5 - 4.0 - 10.0 + exp(0.5) + exp(-1.0) + exp(2.0);
    cr_assert(fabs(tu_item(loss) - want_loss) < 1e-12, "loss %.17g", tu_item(loss));
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    expect_grad(a, VALS(3.0 + exp(0.5), 4.0 + exp(-1.0), -5.0 + exp(2.0)), 3);
    expect_grad(b, VALS(0.5, -1.0, 2.0), 3);
    tg_tape_free(tape);
}

Test(tape, fan_out_accumulates_every_use_of_an_input)
{
    /* x used three times: L = sum(x * x + x) -> dL/dx = 2x + 1 */
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 4, VALS(1, -2, 0.5, 3));
    tg_tensor *loss = tg_sum(tg_add(tg_mul(x, x), x));
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    expect_grad(x, VALS(3, -3, 2, 7), 4);
    tg_tape_free(tape);
}

Test(tape, fan_out_through_an_interior_tensor_accumulates)
{
    /* y = 2x used twice: L = sum(y * y) + sum(y) -> dL/dx = 2 * (2y + 1) */
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 2, VALS(1, -1));
    tg_tensor *y = tg_mul_scalar(x, 2.0);
    tg_tensor *loss = tg_add(tg_sum(tg_mul(y, y)), tg_sum(y));
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    expect_grad(x, VALS(10, -6), 2);
    tg_tape_free(tape);
}

Test(tape, gradients_accumulate_across_two_passes_until_grad_zero)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 2, VALS(1.5, -2.0));
    cr_assert_eq(tg_backward(tg_sum(tg_mul(x, x))), TG_OK);
    expect_grad(x, VALS(3.0, -4.0), 2);
    cr_assert_eq(tg_backward(tg_sum(tg_mul(x, x))), TG_OK, "%s", tg_last_error_message());
    expect_grad(x, VALS(6.0, -8.0), 2);
    tg_grad_zero(x);
    tg_error_clear();
    cr_assert_null(tg_grad(x));
    cr_assert_eq(tg_last_error(), TG_ERR_NO_GRAD);
    cr_assert_eq(tg_backward(tg_sum(tg_mul(x, x))), TG_OK);
    expect_grad(x, VALS(3.0, -4.0), 2);
    tg_tape_free(tape);
}

Test(tape, grad_of_a_non_leaf_or_unreached_leaf_fails_with_no_grad)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 2, VALS(1, 2));
    tg_tensor *unused = leaf(tape, 2, VALS(3, 4));
    tg_tensor *y = tg_mul(x, x);
    cr_assert_eq(tg_backward(tg_sum(y)), TG_OK);
    tg_error_clear();
    cr_assert_null(tg_grad(y));
    cr_assert_eq(tg_last_error(), TG_ERR_NO_GRAD);
    tg_error_clear();
    cr_assert_null(tg_grad(unused));
    cr_assert_eq(tg_last_error(), TG_ERR_NO_GRAD);
    tg_tape_free(tape);
}

Test(tape, no_grad_mode_returns_untracked_results_and_records_nothing)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 2, VALS(1, 2));
    cr_assert(tg_grad_enabled());
    bool prev = tg_grad_set_enabled(false);
    cr_assert(prev);
    cr_assert_not(tg_grad_enabled());
    tg_tensor *y = tg_mul(x, x);
    tu_expect_values(y, VALS(1, 4), 2, 1e-15);
    cr_assert_not(tg_tensor_requires_grad(y));
    cr_assert_eq(tg_tape_node_count(tape), 0);
    tg_error_clear();
    cr_assert_eq(tg_backward(tg_sum(y)), TG_ERR_NO_GRAD);
    cr_assert_eq(tg_grad_set_enabled(prev), false);
    cr_assert(tg_grad_enabled());
    tg_tensor *z = tg_mul(x, x);
    cr_assert(tg_tensor_requires_grad(z));
    cr_assert_eq(tg_tape_node_count(tape), 1);
    tg_tape_free(tape);
}

Test(tape, detach_cuts_the_graph)
{
    /* L = sum(x * detach(x)): the detached factor is a constant, so dL/dx = x. */
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 3, VALS(1, -2, 4));
    tg_tensor *d = tg_detach(x);
    cr_assert_not_null(d);
    cr_assert_not(tg_tensor_requires_grad(d));
    cr_assert_not(tg_tensor_is_leaf(d));
    tu_expect_values(d, VALS(1, -2, 4), 3, 1e-15);
    cr_assert_eq(tg_backward(tg_sum(tg_mul(x, d))), TG_OK, "%s", tg_last_error_message());
    expect_grad(x, VALS(1, -2, 4), 3);
    /* a detached interior result is untracked too */
    tg_tensor *e = tg_detach(tg_exp(x));
    cr_assert_not(tg_tensor_requires_grad(e));
    tg_error_clear();
    cr_assert_eq(tg_backward(tg_sum(e)), TG_ERR_NO_GRAD);
    tg_tape_free(tape);
}

Test(tape, detach_shares_storage_with_its_source)
{
    tg_tensor *x = tu_vec(2, VALS(1, 2));
    size_t before = tg_mem_current_bytes();
    tg_tensor *d = tg_detach(x);
    cr_assert_eq(tg_mem_current_bytes(), before);
    double *p = tg_tensor_data(x);
    p[1] = 9.0;
    tu_expect_values(d, VALS(1, 9), 2, 1e-15);
}

/* ---- reset */

Test(tape, reset_releases_nodes_and_leaves_keep_grads_and_are_reusable)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 100, (const double[100]){0});
    tg_tensor *y = leaf(tape, 100, (const double[100]){0});
    double *px = tg_tensor_data(x), *py = tg_tensor_data(y);
    for (int i = 0; i < 100; i++) {
        px[i] = 0.01 * i;
        py[i] = 1.0 + i;
    }
    tg_tensor *loss = tg_sum(tg_exp(tg_mul(x, y))); /* exp keeps its output */
    cr_assert_gt(tg_tape_node_count(tape), 0);
    cr_assert_gt(tg_tape_saved_bytes(tape), 0);
    tg_tape_reset(tape);
    cr_assert_eq(tg_tape_node_count(tape), 0);
    cr_assert_eq(tg_tape_saved_bytes(tape), 0);
    cr_assert_eq(tg_tape_saved_peak_bytes(tape), 0);
    cr_assert_not(tg_tensor_requires_grad(loss), "interior result survived the reset");
    cr_assert(tg_tensor_requires_grad(x));
    cr_assert(tg_tensor_is_leaf(x));

    /* next pass on the same leaves */
    loss = tg_sum(tg_mul(x, y));
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    tg_tensor *gx = tg_grad(x);
    cr_assert_not_null(gx);
    const double *g = tg_tensor_data(gx);
    for (int i = 0; i < 100; i++) cr_assert(fabs(g[i] - py[i]) < 1e-12, "grad x[%d]", i);

    /* a reset keeps the gradients, and the next backward accumulates */
    tg_tape_reset(tape);
    cr_assert_not_null(tg_grad(x));
    const double *gy = tg_tensor_data(tg_grad(y));
    cr_assert_not_null(gy);
    for (int i = 0; i < 100; i++) cr_assert(fabs(gy[i] - px[i]) < 1e-12, "grad y[%d]", i);
    loss = tg_sum(tg_mul(x, y));
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    g = tg_tensor_data(tg_grad(x));
    for (int i = 0; i < 100; i++) cr_assert(fabs(g[i] - 2.0 * py[i]) < 1e-12, "grad x[%d]", i);
    tg_tape_free(tape);
}

/* The tape keeps each distinct spec once, across resets, until more than
 * 65536 of them pile up; the reset after that forgets them all. A leaf
 * recorded before (it remembers its spec's id) must then record afresh:
 * with a stale id its gradient would come back with the wrong shape. */
Test(tape, a_reset_after_many_distinct_shapes_keeps_leaves_recording_correctly)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 3, (const double[]){1, -2, 3});
    tg_tensor *w = T64((2, 2), 1, 2, 3, 4);
    cr_assert_eq(tg_requires_grad(tape, w), TG_OK);
    cr_assert_eq(tg_backward(tg_add(tg_sum(tg_mul(x, x)), tg_sum(w))), TG_OK, "%s",
                 tg_last_error_message());
    tg_tape_reset(tape);
    tg_grad_zero(x);
    tg_grad_zero(w);
    /* 70000 zero-element leaves of distinct shapes (0, k) */
    for (int64_t k = 1; k <= 70000; k++) {
        tg_scope_begin();
        tg_tensor *z = tg_zeros(TG_F64, 2, (const int64_t[]){0, k});
        cr_assert_eq(tg_requires_grad(tape, z), TG_OK);
        cr_assert_not_null(tg_neg(z), "shape (0, %lld): %s", (long long)k, tg_last_error_message());
        tg_scope_end();
        if (k % 10000 == 0) tg_tape_reset(tape); /* the pool lives on: only a reset clears */
    }
    tg_tape_reset(tape); /* past 65536 specs: the pool is cleared */
    /* x and w again: (0, 1) and (0, 2) now own the first ids */
    tg_scope_begin();
    tg_tensor *z = tg_zeros(TG_F64, 2, (const int64_t[]){0, 1});
    cr_assert_eq(tg_requires_grad(tape, z), TG_OK);
    cr_assert_not_null(tg_neg(z));
    cr_assert_not_null(tg_neg(tg_zeros(TG_F64, 2, (const int64_t[]){0, 2})));
    tg_scope_end();
    tg_tensor *loss = tg_add(tg_sum(tg_mul(x, x)), tg_sum(tg_mul_scalar(w, 3.0)));
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    expect_grad(x, (const double[]){2, -4, 6}, 3);
    tg_tensor *gw = tg_grad(w);
    cr_assert_not_null(gw);
    cr_assert_eq(tg_tensor_ndim(gw), 2);
    tu_expect_values(gw, (const double[]){3, 3, 3, 3}, 4, 1e-12);
    tg_tape_free(tape);
}

Test(tape, reset_frees_saved_tensor_memory)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 1000, (const double[1000]){0});
    size_t before = tg_mem_current_bytes();
    tg_scope_begin();
    (void)tg_exp(tg_mul(x, x));
    tg_scope_end();
    /* the results are gone but the tape still holds what backward needs */
    cr_assert_gt(tg_mem_current_bytes(), before);
    /* mul's inputs are the leaf (held by its owner: not counted); exp
     * keeps its 8000-byte output */
    cr_assert_eq(tg_tape_saved_bytes(tape), 8000);
    tg_tape_reset(tape);
    cr_assert_eq(tg_mem_current_bytes(), before, "%zu bytes left after reset",
                 tg_mem_current_bytes() - before);
    tg_tape_free(tape);
}

/* A backward releases what the nodes it sweeps saved; tg_tape_reset skips
 * its walk of the record only when nothing is left. Two cases it must not
 * skip: a branch the backward did not reach, and a checkpoint a recompute
 * node placed on a node the backward had already released. */
Test(tape, reset_releases_what_a_backward_left)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 1000, (const double[1000]){0});
    /* x's gradient first, so that what follows adds no lasting memory. */
    tg_scope_begin();
    cr_assert_eq(tg_backward(tg_sum(tg_exp(x))), TG_OK, "%s", tg_last_error_message());
    tg_scope_end();
    tg_tape_reset(tape);
    size_t before = tg_mem_current_bytes();
    tg_scope_begin();
    tg_tensor *a = tg_exp(x);
    (void)tg_exp(tg_mul_scalar(x, 2.0)); /* not reached by the backward */
    cr_assert_eq(tg_backward(tg_sum(a)), TG_OK, "%s", tg_last_error_message());
    tg_scope_end();
    cr_assert_eq(tg_tape_saved_bytes(tape), 8000, "the other branch's exp keeps its output");
    tg_tape_reset(tape);
    cr_expect_eq(tg_mem_current_bytes(), before, "%zu bytes left after reset (unreached branch)",
                 tg_mem_current_bytes() - before);

    tg_scope_begin();
    tg_tensor *y = tg_exp(x);
    cr_assert_eq(tg_backward(tg_sum(y)), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_tape_saved_bytes(tape), 0);
    cr_assert_eq(tg_checkpoint_begin(tape), TG_OK);
    tg_tensor *z = tg_tanh(y); /* recomputed from y: y is kept at exp's node */
    cr_assert_eq(tg_checkpoint_end(tape), TG_OK);
    cr_assert_not_null(z, "%s", tg_last_error_message());
    cr_assert_eq(tg_tape_saved_bytes(tape), 8000, "y kept as exp's checkpoint");
    tg_scope_end();
    tg_tape_reset(tape);
    cr_expect_eq(tg_mem_current_bytes(), before, "%zu bytes left after reset (late checkpoint)",
                 tg_mem_current_bytes() - before);

    /* Every node consumed, and the checkpoint still held: the second sweep
     * stops at y, so the node that keeps it is not swept again. */
    tg_scope_begin();
    y = tg_mul_scalar(x, 2.0);
    cr_assert_eq(tg_backward(tg_sum(y)), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_checkpoint_begin(tape), TG_OK);
    tg_tensor *s = tg_sum(tg_tanh(y));
    cr_assert_eq(tg_checkpoint_end(tape), TG_OK);
    tg_tensor *gy = NULL;
    cr_assert_eq(tg_grad_of(1, &s, NULL, 1, &y, &gy, NULL), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_tape_saved_bytes(tape), 8000, "y kept as mul_scalar's checkpoint");
    cr_assert_not_null(gy);
    tg_scope_end();
    tg_tape_reset(tape);
    cr_expect_eq(tg_mem_current_bytes(), before,
                 "%zu bytes left after reset (late checkpoint, every node consumed)",
                 tg_mem_current_bytes() - before);
    tg_tape_free(tape);
}

Test(tape, interior_tensor_from_before_a_reset_fails_with_stale_in_a_new_op)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 2, VALS(1, 2));
    tg_tensor *y = tg_mul(x, x);
    tg_tape_reset(tape);
    tu_expect_values(y, VALS(1, 4), 2, 1e-15); /* still readable as data */
    tg_error_clear();
    cr_assert_null(tg_add(y, x));
    cr_assert_eq(tg_last_error(), TG_ERR_STALE);
    cr_assert(strstr(tg_last_error_message(), "'add'") != NULL, "message: %s",
              tg_last_error_message());
    tg_error_clear();
    cr_assert_null(tg_exp(y));
    cr_assert_eq(tg_last_error(), TG_ERR_STALE);
    tg_error_clear();
    cr_assert_eq(tg_backward(tg_sum(x)), TG_OK, "the tape is still usable: %s",
                 tg_last_error_message());
    expect_grad(x, VALS(1, 1), 2);
    tg_tape_free(tape);
}

Test(tape, backward_of_a_loss_from_before_a_reset_fails_with_stale)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 2, VALS(1, 2));
    tg_tensor *loss = tg_sum(tg_mul(x, x));
    tg_tape_reset(tape);
    cr_assert_eq(tg_backward(loss), TG_ERR_STALE);
    tg_error_clear();
    cr_assert_null(tg_grad(x));
    tg_tape_free(tape);
}

Test(tape, second_backward_on_the_same_graph_fails_with_stale)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 2, VALS(1, 2));
    tg_tensor *loss = tg_sum(tg_mul(x, x));
    cr_assert_eq(tg_backward(loss), TG_OK);
    tg_error_clear();
    cr_assert_eq(tg_backward(loss), TG_ERR_STALE);
    cr_assert_eq(tg_last_error(), TG_ERR_STALE);
    expect_grad(x, VALS(2, 4), 2); /* not accumulated twice */
    tg_tape_free(tape);
}

Test(tape, backward_on_an_untracked_tensor_fails_with_no_grad)
{
    tg_tensor *x = tu_vec(2, VALS(1, 2));
    tg_error_clear();
    cr_assert_eq(tg_backward(tg_sum(x)), TG_ERR_NO_GRAD);
    cr_assert_eq(tg_last_error(), TG_ERR_NO_GRAD);
    tg_error_clear();
    cr_assert_eq(tg_backward(NULL), TG_ERR_NULL);
}

Test(tape, non_scalar_loss_without_seed_fails_with_seed)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 3, VALS(1, 2, 3));
    tg_tensor *y = tg_mul(x, x);
    cr_assert_eq(tg_backward(y), TG_ERR_SEED);
    cr_assert(strstr(tg_last_error_message(), "[3]") != NULL, "message: %s",
              tg_last_error_message());
    tg_error_clear();
    cr_assert_null(tg_grad(x));
    /* the record is intact: seeding works afterwards */
    tg_tensor *seed = tu_vec(3, VALS(1, 10, 100));
    cr_assert_eq(tg_backward_seed(y, seed), TG_OK, "%s", tg_last_error_message());
    expect_grad(x, VALS(2, 40, 600), 3); /* 2x * seed */
    tu_expect_values(seed, VALS(1, 10, 100), 3, 1e-15);
    tg_tape_free(tape);
}

Test(tape, seed_of_the_wrong_shape_fails_with_shape)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 3, VALS(1, 2, 3));
    tg_tensor *y = tg_mul(x, x);
    cr_assert_eq(tg_backward_seed(y, tu_vec(2, VALS(1, 1))), TG_ERR_SHAPE);
    tg_error_clear();
    cr_assert_eq(tg_backward_seed(y, NULL), TG_ERR_NULL);
    tg_tape_free(tape);
}

Test(tape, seed_gradient_is_not_aliased_by_a_leaf)
{
    /* y = x + 0 passes the seed straight through; the leaf must copy it. */
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 2, VALS(1, 2));
    tg_tensor *seed = tu_vec(2, VALS(3, 4));
    cr_assert_eq(tg_backward_seed(tg_add_scalar(x, 0.0), seed), TG_OK);
    double *p = tg_tensor_data(seed);
    p[0] = 1000.0;
    expect_grad(x, VALS(3, 4), 2);
    tg_tape_free(tape);
}

Test(tape, inputs_from_two_different_tapes_fail_with_tape)
{
    tg_tape *t1 = tg_tape_new(NULL), *t2 = tg_tape_new(NULL);
    tg_tensor *x = leaf(t1, 2, VALS(1, 2));
    tg_tensor *y = leaf(t2, 2, VALS(3, 4));
    tg_error_clear();
    cr_assert_null(tg_mul(x, y));
    cr_assert_eq(tg_last_error(), TG_ERR_TAPE);
    cr_assert(strstr(tg_last_error_message(), "'mul'") != NULL, "message: %s",
              tg_last_error_message());
    tg_error_clear();
    cr_assert_null(tg_add(tg_exp(x), tg_exp(y)));
    cr_assert_eq(tg_last_error(), TG_ERR_TAPE);
    cr_assert_eq(tg_tape_node_count(t1), 1);
    cr_assert_eq(tg_tape_node_count(t2), 1);
    tg_tape_free(t1);
    tg_tape_free(t2);
}

/* ---- saved bytes */

Test(tape, saved_bytes_are_what_the_ops_save)
{
    tg_tape *tape = tg_tape_new(NULL);
    double zeros[100] = {0};
    tg_tensor *a = leaf(tape, 100, zeros);
    tg_tensor *b = leaf(tape, 100, zeros);
    cr_assert_eq(tg_tape_saved_bytes(tape), 0);
    tg_tensor *m = tg_mul(a, b); /* saves both inputs: leaves, which cost nothing */
    cr_assert_eq(tg_tape_saved_bytes(tape), 0, "mul saved %zu", tg_tape_saved_bytes(tape));
    tg_tensor *m2 = tg_mul(m, m); /* saves its interior input twice: 2 * 100 * 8 */
    cr_assert_eq(tg_tape_saved_bytes(tape), 1600, "mul saved %zu", tg_tape_saved_bytes(tape));
    tg_tensor *s = tg_add(m2, a); /* saves nothing */
    cr_assert_eq(tg_tape_saved_bytes(tape), 1600, "add saved %zu",
                 tg_tape_saved_bytes(tape) - 1600);
    tg_tensor *e = tg_exp(s); /* saves its output */
    cr_assert_eq(tg_tape_saved_bytes(tape), 2400);
    tg_tensor *l = tg_log(e); /* saves its input */
    cr_assert_eq(tg_tape_saved_bytes(tape), 3200);
    tg_tensor *loss = tg_sum(l); /* saves nothing */
    cr_assert_eq(tg_tape_saved_bytes(tape), 3200);
    cr_assert_eq(tg_tape_saved_peak_bytes(tape), 3200);
    cr_assert_eq(tg_tape_node_count(tape), 6);
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_tape_saved_bytes(tape), 0, "backward left %zu saved bytes",
                 tg_tape_saved_bytes(tape));
    cr_assert_eq(tg_tape_saved_peak_bytes(tape), 3200);
    tg_tape_free(tape);
}

Test(tape, saved_bytes_of_f32_matmul_count_both_operands)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *a = tg_zeros(TG_F32, 2, SHAPE(2, 3));
    tg_tensor *b = tg_zeros(TG_F32, 2, SHAPE(3, 4));
    cr_assert_eq(tg_requires_grad(tape, a), TG_OK);
    tg_tensor *c = tg_matmul(a, b);
    cr_assert_not_null(c);
    /* b (untracked) is kept; the leaf a is its owner's */
    cr_assert_eq(tg_tape_saved_bytes(tape), 12 * 4, "matmul saved %zu",
                 tg_tape_saved_bytes(tape));
    tg_tape_free(tape);
}

/* ---- failure atomicity */

static tg_tensor *copy_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    memcpy(tg_tensor_data(y), tg_tensor_data(in[0]),
           (size_t)tg_tensor_numel(y) * tg_dtype_size(tg_tensor_dtype(y)));
    return y;
}

static tg_status failing_bwd(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin)
{
    (void)ctx;
    (void)gout;
    (void)gin;
    return tg_error_set(TG_ERR_UNSUPPORTED, "failing_copy has a deliberately failing backward");
}

static int copy_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    (void)a;
    if (k > 0) return 0;
    in[0] = tg_rand_uniform(rng, TG_F64, 1, SHAPE(3), -1.0, 1.0);
    return in[0] ? 1 : -1;
}

Test(tape, failing_backward_leaves_leaf_grads_untouched)
{
    const tg_op def = {
        .name = "failing_copy", .doc = "y = x; backward fails", .arity = 1, .shape = tg_op_shape_same,
        .forward = copy_fwd, .backward = failing_bwd, .sample = copy_sample,
    };
    cr_assert_eq(tg_op_register(&def), TG_OK, "%s", tg_last_error_message());
    const tg_op *op = tg_op_find("failing_copy");
    cr_assert_not_null(op);

    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 2, VALS(1, 2));
    tg_tensor *w = leaf(tape, 2, VALS(5, 7));
    cr_assert_eq(tg_backward(tg_sum(tg_mul(x, w))), TG_OK);
    expect_grad(x, VALS(5, 7), 2);
    expect_grad(w, VALS(1, 2), 2);

    /* L = sum(x * w + failing_copy(x)): the mul path reaches x and w before
     * the failing node runs, but no leaf may change. */
    tg_tensor *in[1] = {x};
    tg_tensor *c = tg_op_call(op, 1, in, NULL);
    cr_assert_not_null(c, "%s", tg_last_error_message());
    tg_tensor *loss = tg_sum(tg_add(tg_mul(x, w), c));
    cr_assert_not_null(loss);
    tg_error_clear();
    cr_assert_eq(tg_backward(loss), TG_ERR_UNSUPPORTED);
    cr_assert_eq(tg_last_error(), TG_ERR_UNSUPPORTED);
    cr_assert(strstr(tg_last_error_message(), "deliberately") != NULL, "message: %s",
              tg_last_error_message());
    expect_grad(x, VALS(5, 7), 2);
    expect_grad(w, VALS(1, 2), 2);

    /* and the tape still works after a reset */
    tg_tape_reset(tape);
    cr_assert_eq(tg_backward(tg_sum(w)), TG_OK, "%s", tg_last_error_message());
    expect_grad(w, VALS(2, 3), 2);
    tg_tape_free(tape);
}

/* ---- freeing */

Test(tape, tape_free_keeps_tensors_readable_and_interiors_stale)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 2, VALS(1, 2));
    tg_tensor *y = tg_mul(x, x);
    cr_assert_eq(tg_backward(tg_sum(y)), TG_OK);
    tg_tape_free(tape);
    tu_expect_values(y, VALS(1, 4), 2, 1e-15);
    cr_assert_not(tg_tensor_requires_grad(y));
    tg_error_clear();
    cr_assert_null(tg_exp(y));
    cr_assert_eq(tg_last_error(), TG_ERR_STALE);
    /* its leaves keep their gradients but are no longer tracked */
    cr_assert_not(tg_tensor_requires_grad(x));
    expect_grad(x, VALS(2, 4), 2);
    tg_error_clear();
    cr_assert_null(tg_mul(x, x));
    cr_assert_eq(tg_last_error(), TG_ERR_STALE);
    /* ... until marked on another tape */
    tg_tape *t2 = tg_tape_new(NULL);
    cr_assert_eq(tg_requires_grad(t2, x), TG_OK, "%s", tg_last_error_message());
    tg_grad_zero(x);
    cr_assert_eq(tg_backward(tg_sum(tg_mul_scalar(x, 3.0))), TG_OK, "%s", tg_last_error_message());
    expect_grad(x, VALS(3, 3), 2);
    tg_tape_free(t2);
}

Test(tape, free_and_reset_accept_null)
{
    tg_tape_free(NULL);
    tg_tape_reset(NULL);
    cr_assert_eq(tg_tape_node_count(NULL), 0);
    cr_assert_eq(tg_tape_saved_bytes(NULL), 0);
}

Test(tape, backward_into_a_consumed_subgraph_fails_with_stale_and_keeps_grads)
{
    /* z is shared by two losses; the first backward frees z's saved inputs,
     * so the second fails when it reaches z and must not touch the leaves. */
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 2, VALS(1, 2));
    tg_tensor *w = leaf(tape, 2, VALS(3, 4));
    tg_tensor *z = tg_mul(x, w);
    tg_tensor *loss1 = tg_sum(z);
    tg_tensor *loss2 = tg_sum(tg_mul(z, x));
    cr_assert_eq(tg_backward(loss1), TG_OK);
    expect_grad(x, VALS(3, 4), 2);
    expect_grad(w, VALS(1, 2), 2);
    tg_error_clear();
    cr_assert_eq(tg_backward(loss2), TG_ERR_STALE);
    cr_assert(strstr(tg_last_error_message(), "'mul'") != NULL, "message: %s",
              tg_last_error_message());
    expect_grad(x, VALS(3, 4), 2);
    expect_grad(w, VALS(1, 2), 2);
    tg_tape_free(tape);
}

Test(tape, f32_graphs_get_f32_gradients)
{
    tg_tape *tape = tg_tape_new(NULL);
    const float v[3] = {0.5f, -1.0f, 2.0f};
    tg_tensor *x = tg_tensor_from_data(TG_F32, 1, SHAPE(3), v);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    tg_tensor *loss = tg_mean(tg_mul(x, x)); /* d/dx = 2x / 3 */
    cr_assert_eq(tg_tensor_dtype(loss), TG_F32);
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    tg_tensor *g = tg_grad(x);
    cr_assert_not_null(g);
    cr_assert_eq(tg_tensor_dtype(g), TG_F32);
    tu_expect_values(g, VALS(1.0 / 3, -2.0 / 3, 4.0 / 3), 3, 1e-6);
    tg_tape_free(tape);
}

Test(tape, leaf_gradients_are_contiguous_and_writable)
{
    /* sum's backward is a stride-0 expand; the leaf must still get its own
     * contiguous buffer so an optimizer can read it through tg_tensor_data. */
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 3, VALS(1, 2, 3));
    cr_assert_eq(tg_backward(tg_mul_scalar(tg_sum(x), 2.0)), TG_OK);
    tg_tensor *g = tg_grad(x);
    cr_assert(tg_tensor_is_contiguous(g));
    double *p = tg_tensor_data(g);
    cr_assert_not_null(p);
    p[0] = 5.0;
    tu_expect_values(g, VALS(5, 2, 2), 3, 1e-15);
    tg_tape_free(tape);
}

/* A second backward adds into the leaf's gradient in place while the leaf
 * holds the only reference (the borrowed pointer stays valid and shows the
 * sum); a gradient the caller retained is a snapshot: it keeps its values
 * and the leaf gets the sum as a new tensor. */
Test(tape, second_backward_adds_in_place_unless_the_gradient_is_retained)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = leaf(tape, 2, VALS(1.5, -2.0));
    cr_assert_eq(tg_backward(tg_sum(tg_mul(x, x))), TG_OK);
    tg_tensor *g1 = tg_grad(x);
    cr_assert_eq(tg_backward(tg_sum(tg_mul(x, x))), TG_OK, "%s", tg_last_error_message());
    cr_expect_eq(tg_grad(x), g1, "the sole-held gradient was replaced, not added into");
    expect_grad(x, VALS(6.0, -8.0), 2);
    tg_tensor *snap = tg_tensor_retain(tg_grad(x));
    cr_assert_eq(tg_backward(tg_sum(tg_mul(x, x))), TG_OK, "%s", tg_last_error_message());
    cr_expect_neq(tg_grad(x), snap, "a retained gradient was written in place");
    expect_grad(x, VALS(9.0, -12.0), 2);
    double v[2];
    cr_assert_eq(tg_tensor_copy_out(snap, v, sizeof v), TG_OK);
    cr_expect(v[0] == 6.0 && v[1] == -8.0, "the snapshot changed to %g %g", v[0], v[1]);
    tg_tensor_release(snap);
    tg_tape_free(tape);
}

/* ---- Gradient-ready notification (tg_tape_set_grad_ready). */
typedef struct {
    int n;
    tg_tensor *leaf[8];
    double first[8]; /* the gradient's first element when notified, NaN if NULL */
    int nodes_seen[8];
    int nodes;       /* nodes swept so far (post hook) */
    int fail_at;     /* notification index that fails, -1 none */
} ready_log;

static double first_elem(const tg_tensor *t)
{
    double *v = tu_values(t), x = v[0];
    free(v);
    return x;
}

static tg_status log_ready(tg_tensor *leaf, const tg_tensor *grad, void *ud)
{
    ready_log *l = ud;
    if (l->n == l->fail_at) return TG_ERR_INVALID;
    l->leaf[l->n] = leaf;
    l->first[l->n] = grad ? first_elem(grad) : NAN;
    l->nodes_seen[l->n++] = l->nodes;
    return TG_OK;
}

static tg_status count_node(const tg_node_info *node, tg_tensor *const *gin, void *ud)
{
    (void)node;
    (void)gin;
    ((ready_log *)ud)->nodes++;
    return TG_OK;
}

Test(tape, grad_ready_notifies_each_leaf_once_its_gradient_is_whole)
{
    /* loss = sum(tanh(tanh(a * x) * b) * c) + 0 * u: a is read first (its
     * gradient completes last), c last; u feeds a branch that adds zero. */
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = T64((3), 0.5, -1.0, 2.0);
    tg_tensor *a = T64((3), 0.3, 0.2, 0.1), *b = T64((3), 1.5, -0.5, 0.7),
              *c = T64((3), 2.0, 1.0, -1.0), *u = T64((1), 4.0);
    tg_tensor *leaves[] = {a, b, c, u};
    for (int i = 0; i < 4; i++) cr_assert_eq(tg_requires_grad(tape, leaves[i]), TG_OK);
    ready_log log = {.fail_at = -1};
    cr_assert_eq(tg_tape_set_grad_ready(tape, log_ready, &log), TG_OK);
    cr_assert_eq(tg_tape_set_node_hooks(tape, NULL, count_node, &log), TG_OK);
    tg_scope_begin();
    tg_tensor *main_path = tg_sum(tg_mul(tg_tanh(tg_mul(tg_tanh(tg_mul(a, x)), b)), c));
    tg_tensor *loss = tg_add(main_path, tg_sum(tg_mul_scalar(u, 0.0)));
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    int total = log.nodes;
    cr_assert_eq(log.n, 4, "one notification per leaf the record uses, got %d", log.n);
    /* u's branch is recorded last, so it completes first; then c, b, a. */
    tg_tensor *order[] = {u, c, b, a};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(log.leaf[i], order[i], "notification %d", i);
        cr_assert_eq(log.first[i], first_elem(tg_grad(order[i])), "leaf %d: the whole gradient",
                     i);
    }
    cr_assert(log.nodes_seen[1] < total && log.nodes_seen[2] < total,
              "c and b are notified while the sweep goes on (%d, %d of %d nodes)",
              log.nodes_seen[1], log.nodes_seen[2], total);
    tg_scope_end();
    tg_tape_reset(tape);

    /* A failing notification fails the backward and changes no leaf. */
    double ga = first_elem(tg_grad(a));
    log = (ready_log){.fail_at = 2};
    tg_scope_begin();
    loss = tg_sum(tg_mul(tg_tanh(tg_mul(tg_tanh(tg_mul(a, x)), b)), c));
    cr_assert_eq(tg_backward(loss), TG_ERR_INVALID);
    cr_assert_eq(first_elem(tg_grad(a)), ga);
    tg_scope_end();
    tg_tape_reset(tape);
    /* Off again: nothing is called. */
    cr_assert_eq(tg_tape_set_grad_ready(tape, NULL, NULL), TG_OK);
    log = (ready_log){.fail_at = 0};
    tg_scope_begin();
    cr_assert_eq(tg_backward(tg_sum(tg_mul(a, x))), TG_OK);
    cr_assert_eq(log.n, 0);
    tg_scope_end();
    cr_assert_eq(tg_tape_set_grad_ready(NULL, log_ready, NULL), TG_ERR_NULL);
    tg_tape_free(tape); /* the leaves belong to the suite's scope */
}

/* ---- Backwards that write over the gradient they are handed.
 *
 * A pointwise backward (tanh, sigmoid, ...) and mul's may write their
 * result over the incoming gradient when the sweep holds the only
 * reference to it (tg_op_ctx's gout_scratch); anomaly mode turns that off.
 * The same function is differentiated both ways: every gradient must come
 * out bitwise the same, and an interior gradient the caller asked for
 * (which the sweep keeps a reference to) must not be overwritten. */
#define SCRATCH_N 300

static tg_tensor *scratch_model(tg_tape *tape, const double *xv, const double *wv, tg_tensor **x,
                                tg_tensor **w, tg_tensor **h)
{
    *x = leaf(tape, SCRATCH_N, xv);
    *w = leaf(tape, SCRATCH_N, wv);
    *h = tg_mul(tg_sigmoid(*x), *w);  /* mul: both inputs need gradients */
    tg_tensor *sq = tg_mul(*x, *x);   /* x * x: one product, two uses */
    tg_tensor *t = tg_tanh(*h);
    return tg_sum(tg_mul(tg_exp(tg_mul(t, sq)), t));
}

static void scratch_run(bool anomaly, bool interior, const double *xv, const double *wv,
                        double *gx, double *gw, double *gh)
{
    tg_tape *tape = tg_tape_new(&(tg_tape_opts){.anomaly = anomaly});
    tg_tensor *x, *w, *h;
    tg_tensor *loss = scratch_model(tape, xv, wv, &x, &w, &h);
    cr_assert_not_null(loss, "%s", tg_last_error_message());
    if (!interior) {
        cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
        cr_assert_eq(tg_tensor_copy_out(tg_grad(x), gx, SCRATCH_N * sizeof(double)), TG_OK);
        cr_assert_eq(tg_tensor_copy_out(tg_grad(w), gw, SCRATCH_N * sizeof(double)), TG_OK);
    } else {
        tg_tensor *in[3] = {x, w, h}, *g[3];
        cr_assert_eq(tg_grad_of(1, &loss, NULL, 3, in, g, NULL), TG_OK, "%s",
                     tg_last_error_message());
        double *out[3] = {gx, gw, gh};
        for (int i = 0; i < 3; i++) /* scope-owned */
            cr_assert_eq(tg_tensor_copy_out(g[i], out[i], SCRATCH_N * sizeof(double)), TG_OK);
    }
    tg_tape_free(tape);
}

Test(tape, backwards_over_their_incoming_gradient_keep_the_bits)
{
    double xv[SCRATCH_N], wv[SCRATCH_N];
    for (int i = 0; i < SCRATCH_N; i++) {
        xv[i] = sin(0.37 * i) * 1.3;
        wv[i] = cos(0.11 * i) * 0.9 + 0.05;
    }
    static double gx[4][SCRATCH_N], gw[4][SCRATCH_N], gh[2][SCRATCH_N];
    scratch_run(true, false, xv, wv, gx[0], gw[0], NULL);  /* nothing written over */
    scratch_run(false, false, xv, wv, gx[1], gw[1], NULL);
    scratch_run(true, true, xv, wv, gx[2], gw[2], gh[0]);
    scratch_run(false, true, xv, wv, gx[3], gw[3], gh[1]);
    for (int k = 1; k < 4; k++) {
        cr_expect(memcmp(gx[0], gx[k], sizeof gx[0]) == 0, "x's gradient differs in run %d", k);
        cr_expect(memcmp(gw[0], gw[k], sizeof gw[0]) == 0, "w's gradient differs in run %d", k);
    }
    cr_expect(memcmp(gh[0], gh[1], sizeof gh[0]) == 0,
              "the interior gradient asked for was overwritten");
    /* And the values are the derivative: d/dh of sum(exp(tanh(h) x^2) tanh(h)). */
    for (int i = 0; i < SCRATCH_N; i++) {
        double s = 1 / (1 + exp(-xv[i])), h = s * wv[i], t = tanh(h), q = xv[i] * xv[i];
        double e = exp(t * q), dt = e * q * t + e, want = dt * (1 - t * t);
        cr_expect(fabs(gh[1][i] - want) <= 1e-12 * fmax(1, fabs(want)),
                  "dL/dh[%d] = %.17g, want %.17g", i, gh[1][i], want);
    }
}
