/* test_scope.c - scopes: ownership of returned tensors, keep, nesting,
 * misuse, and a training loop whose memory returns to the same level. */
#include <criterion/criterion.h>
#include <tapegrad.h>

#include "test_util.h"

#include <math.h>
#include <string.h>

Test(scope, tensors_created_in_a_scope_are_released_at_its_end)
{
    size_t base = tg_mem_current_bytes();
    cr_assert_eq(tg_scope_depth(), 0);
    tg_scope_begin();
    cr_assert_eq(tg_scope_depth(), 1);
    tg_tensor *a = tg_ones(TG_F64, 2, SHAPE(10, 10));
    tg_tensor *b = tg_full(TG_F64, 2, SHAPE(10, 10), 2.0);
    tg_tensor *c = tg_exp(tg_add(tg_mul(a, b), a)); /* three more results */
    cr_assert_not_null(c);
    cr_assert_eq(tg_mem_current_bytes(), base + 5 * 800, "%zu bytes over base",
                 tg_mem_current_bytes() - base);
    cr_assert_eq(tg_scope_end(), TG_OK);
    cr_assert_eq(tg_scope_depth(), 0);
    cr_assert_eq(tg_mem_current_bytes(), base, "%zu bytes leaked", tg_mem_current_bytes() - base);
}

Test(scope, every_kind_of_result_is_owned_by_the_scope)
{
    size_t base = tg_mem_current_bytes();
    tg_rng rng;
    tg_rng_seed(&rng, 3);
    tg_scope_begin();
    tg_tensor *x = tg_rand_normal(&rng, TG_F64, 2, SHAPE(3, 4), 0.0, 1.0);
    (void)tg_rand_uniform(&rng, TG_F32, 1, SHAPE(5), 0.0, 1.0);
    (void)tg_tensor_from_data(TG_F64, 1, SHAPE(2), VALS(1, 2));
    (void)tg_zeros(TG_I64, 1, SHAPE(4));
    (void)tg_scalar(TG_F64, 1.0);
    (void)tg_arange(TG_F64, 0, 10, 1);
    (void)tg_detach(x);
    (void)tg_transpose(x, 0, 1);
    (void)tg_contiguous(tg_transpose(x, 0, 1));
    (void)tg_reshape(x, 1, SHAPE(12));
    (void)tg_matmul(x, tg_transpose(x, 0, 1));
    (void)tg_softmax(x, 1);
    (void)tg_sum_dims(x, 1, (const int[]){0}, true);
    (void)tg_argmax(x, 1, false);
    (void)tg_to_device(x, TG_BACKEND_REF);
    (void)tg_cast(x, TG_F32);
    cr_assert_gt(tg_mem_current_bytes(), base);
    cr_assert_eq(tg_scope_end(), TG_OK);
    cr_assert_eq(tg_mem_current_bytes(), base, "%zu bytes leaked", tg_mem_current_bytes() - base);
}

Test(scope, keep_moves_a_tensor_out_of_the_scope)
{
    size_t base = tg_mem_current_bytes();
    tg_scope_begin();
    tg_tensor *a = tg_full(TG_F64, 1, SHAPE(4), 3.0);
    tg_tensor *b = tg_mul(a, a);
    cr_assert_eq(tg_scope_keep(b), b);
    cr_assert_eq(tg_scope_end(), TG_OK);
    cr_assert_eq(tg_mem_current_bytes(), base + 32, "a should be gone and b kept");
    double v;
    cr_assert_eq(tg_tensor_get(b, 3, &v), TG_OK);
    cr_assert(fabs(v - 9.0) < 1e-15, "kept value %g", v);
    tg_tensor_release(b);
    cr_assert_eq(tg_mem_current_bytes(), base);
}

Test(scope, keep_of_an_unowned_tensor_is_a_no_op)
{
    size_t base = tg_mem_current_bytes();
    tg_tensor *outside = tg_ones(TG_F64, 1, SHAPE(2));
    tg_scope_begin();
    cr_assert_eq(tg_scope_keep(outside), outside);
    cr_assert_null(tg_scope_keep(NULL));
    cr_assert_eq(tg_scope_end(), TG_OK);
    cr_assert_eq(tg_mem_current_bytes(), base + 16, "the scope released a tensor it never owned");
    tg_tensor_release(outside);
    cr_assert_eq(tg_mem_current_bytes(), base);
    /* outside any scope keep does nothing either */
    tg_tensor *t = tg_ones(TG_F64, 1, SHAPE(2));
    cr_assert_eq(tg_scope_keep(t), t);
    tg_tensor_release(t);
    cr_assert_eq(tg_mem_current_bytes(), base);
}

Test(scope, retained_scope_tensors_outlive_the_scope)
{
    size_t base = tg_mem_current_bytes();
    tg_scope_begin();
    tg_tensor *a = tg_full(TG_F64, 1, SHAPE(2), 5.0);
    tg_tensor_retain(a);
    tg_scope_end();
    tg_tensor *s = tg_sum(a); /* outside any scope: the caller owns it */
    cr_assert(fabs(tu_item(s) - 10.0) < 1e-15);
    tg_tensor_release(s);
    tg_tensor_release(a);
    cr_assert_eq(tg_mem_current_bytes(), base);
}

Test(scope, nested_scopes_release_only_their_own_tensors)
{
    size_t base = tg_mem_current_bytes();
    tg_scope_begin();
    tg_tensor *outer = tg_full(TG_F64, 1, SHAPE(8), 1.5);
    tg_scope_begin();
    cr_assert_eq(tg_scope_depth(), 2);
    tg_tensor *inner = tg_mul_scalar(outer, 2.0);
    tg_tensor *kept = tg_add(inner, outer);
    tg_scope_keep(kept); /* now owned by the caller, not by either scope */
    cr_assert_eq(tg_mem_current_bytes(), base + 3 * 64);
    cr_assert_eq(tg_scope_end(), TG_OK);
    cr_assert_eq(tg_scope_depth(), 1);
    cr_assert_eq(tg_mem_current_bytes(), base + 2 * 64, "inner scope released the wrong set");
    /* outer's tensor is still alive and usable */
    double v;
    cr_assert_eq(tg_tensor_get(outer, 7, &v), TG_OK);
    cr_assert(fabs(v - 1.5) < 1e-15);
    cr_assert_eq(tg_tensor_get(kept, 0, &v), TG_OK);
    cr_assert(fabs(v - 4.5) < 1e-15, "kept %g", v);
    cr_assert_eq(tg_scope_end(), TG_OK);
    cr_assert_eq(tg_mem_current_bytes(), base + 64);
    tg_tensor_release(kept);
    cr_assert_eq(tg_mem_current_bytes(), base);
}

Test(scope, keep_in_an_inner_scope_of_an_outer_tensor_leaves_it_with_the_outer)
{
    size_t base = tg_mem_current_bytes();
    tg_scope_begin();
    tg_tensor *outer = tg_ones(TG_F64, 1, SHAPE(4));
    tg_scope_begin();
    cr_assert_eq(tg_scope_keep(outer), outer);
    tg_scope_end();
    double v;
    cr_assert_eq(tg_tensor_get(outer, 0, &v), TG_OK);
    tg_scope_end();
    cr_assert_eq(tg_mem_current_bytes(), base, "the outer scope did not release it");
}

Test(scope, deep_nesting_balances)
{
    size_t base = tg_mem_current_bytes();
    for (int i = 0; i < 100; i++) {
        tg_scope_begin();
        (void)tg_ones(TG_F64, 1, SHAPE(4));
    }
    cr_assert_eq(tg_scope_depth(), 100);
    for (int i = 0; i < 100; i++) cr_assert_eq(tg_scope_end(), TG_OK, "end %d", i);
    cr_assert_eq(tg_scope_depth(), 0);
    cr_assert_eq(tg_mem_current_bytes(), base, "%zu bytes leaked", tg_mem_current_bytes() - base);
    tg_error_clear();
    cr_assert_eq(tg_scope_end(), TG_ERR_SCOPE);
}

Test(scope, each_of_100_nested_scopes_releases_its_own_tensors)
{
    /* Deep nesting (recursive model code) must keep the semantics at every
     * level: each tg_scope_end releases exactly what its scope created. */
    enum { DEPTH = 100 };
    size_t base = tg_mem_current_bytes();
    for (int i = 0; i < DEPTH; i++) {
        tg_scope_begin();
        (void)tg_zeros(TG_F64, 1, SHAPE(1));
    }
    cr_assert_eq(tg_mem_current_bytes(), base + DEPTH * 8);
    for (int i = DEPTH; i > 0; i--) {
        cr_assert_eq(tg_scope_end(), TG_OK, "end at depth %d", i);
        cr_assert_eq(tg_scope_depth(), i - 1);
        cr_assert_eq(tg_mem_current_bytes(), base + (size_t)(i - 1) * 8,
                     "after ending the scope at depth %d: %zu bytes over base, expected %d", i,
                     tg_mem_current_bytes() - base, (i - 1) * 8);
    }
}

Test(scope, keep_works_in_a_deeply_nested_scope)
{
    size_t base = tg_mem_current_bytes();
    for (int i = 0; i < 80; i++) tg_scope_begin();
    tg_tensor *t = tg_scope_keep(tg_ones(TG_F64, 1, SHAPE(2)));
    for (int i = 0; i < 80; i++) tg_scope_end();
    cr_assert_eq(tg_mem_current_bytes(), base + 16, "the kept tensor was released");
    tg_tensor_release(t);
    cr_assert_eq(tg_mem_current_bytes(), base);
}

Test(scope, end_without_begin_fails_with_scope)
{
    tg_error_clear();
    cr_assert_eq(tg_scope_end(), TG_ERR_SCOPE);
    cr_assert_eq(tg_last_error(), TG_ERR_SCOPE);
    cr_assert_gt(strlen(tg_last_error_message()), 0);
    cr_assert_eq(tg_scope_depth(), 0);
    tg_scope_begin();
    cr_assert_eq(tg_scope_end(), TG_OK);
    tg_error_clear();
    cr_assert_eq(tg_scope_end(), TG_ERR_SCOPE);
}

Test(scope, many_tensors_in_one_scope_are_all_released)
{
    size_t base = tg_mem_current_bytes();
    tg_scope_begin();
    tg_tensor *acc = tg_zeros(TG_F64, 1, SHAPE(16));
    for (int i = 0; i < 5000; i++) acc = tg_add_scalar(acc, 1.0);
    cr_assert(fabs(tu_item(tg_sum(acc)) - 16 * 5000.0) < 1e-9);
    tg_scope_end();
    cr_assert_eq(tg_mem_current_bytes(), base, "%zu bytes leaked", tg_mem_current_bytes() - base);
}

/* A linear model y = x W + b trained by gradient descent on an exactly
 * representable target; each step is one scope of nested expressions. */
Test(scope, training_loop_memory_returns_to_the_same_level_each_step)
{
    tg_rng rng;
    tg_rng_seed(&rng, 17);
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *W = tg_rand_normal(&rng, TG_F64, 2, SHAPE(3, 2), 0.0, 0.5);
    tg_tensor *b = tg_zeros(TG_F64, 1, SHAPE(2));
    tg_tensor *x = tg_rand_uniform(&rng, TG_F64, 2, SHAPE(8, 3), -1.0, 1.0);
    tg_tensor *Wtrue = tg_tensor_from_data(TG_F64, 2, SHAPE(3, 2), VALS(1, -1, 0.5, 2, -0.5, 0));
    tg_scope_begin();
    tg_tensor *y = tg_scope_keep(tg_add_scalar(tg_matmul(x, Wtrue), 0.25));
    tg_scope_end();
    cr_assert_not_null(y);
    cr_assert_eq(tg_requires_grad(tape, W), TG_OK);
    cr_assert_eq(tg_requires_grad(tape, b), TG_OK);

    size_t level = 0;
    double first = 0.0, last = 0.0;
    for (int step = 0; step < 50; step++) {
        tg_scope_begin();
        tg_tensor *h = tg_add(tg_matmul(x, W), b);
        tg_tensor *loss = tg_add(tg_mse_loss(h, y),
                                 tg_mul_scalar(tg_sum(tg_mul(W, W)), 1e-4)); /* weight decay */
        cr_assert_not_null(loss, "step %d: %s", step, tg_last_error_message());
        double lv = tu_item(loss);
        if (step == 0) first = lv;
        last = lv;
        cr_assert_eq(tg_backward(loss), TG_OK, "step %d: %s", step, tg_last_error_message());
        tg_tensor *params[2] = {W, b};
        for (int p = 0; p < 2; p++) {
            double *w = tg_tensor_data(params[p]);
            const double *g = tg_tensor_data(tg_grad(params[p]));
            cr_assert(w && g, "step %d param %d", step, p);
            for (int64_t i = 0; i < tg_tensor_numel(params[p]); i++) w[i] -= 0.3 * g[i];
            tg_grad_zero(params[p]);
        }
        tg_tape_reset(tape);
        cr_assert_eq(tg_scope_end(), TG_OK);
        cr_assert_eq(tg_tape_node_count(tape), 0);
        size_t now = tg_mem_current_bytes();
        if (step == 0)
            level = now;
        else
            cr_assert_eq(now, level, "step %d: memory %zu, step 0 left %zu", step, now, level);
    }
    cr_assert_lt(last, 0.2 * first, "the loop did not train: %g -> %g", first, last);
    tg_tape_free(tape);
    tg_tensor_release(W);
    tg_tensor_release(b);
    tg_tensor_release(x);
    tg_tensor_release(Wtrue);
    tg_tensor_release(y);
}

Test(scope, training_loop_without_reset_still_frees_everything_at_scope_end)
{
    /* Backward frees saved tensors as it goes, so even without a reset the
     * only growth per step is the node array of the tape, not tensor data. */
    size_t base = tg_mem_current_bytes();
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *w = tg_full(TG_F64, 1, SHAPE(64), 0.5);
    tg_requires_grad(tape, w);
    size_t level = 0;
    for (int step = 0; step < 20; step++) {
        tg_scope_begin();
        tg_tensor *loss = tg_sum(tg_tanh(tg_mul(w, tg_exp(w))));
        cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
        tg_grad_zero(w);
        tg_scope_end();
        if (step == 0)
            level = tg_mem_current_bytes();
        else
            cr_assert_eq(tg_mem_current_bytes(), level, "step %d", step);
    }
    tg_tape_free(tape);
    tg_tensor_release(w);
    cr_assert_eq(tg_mem_current_bytes(), base);
}

/* The backward runs every node inside a scope of its own, opened and
 * closed inline on the common path (src/core/internal.h) and through
 * tg_scope_begin / tg_scope_end otherwise: outside any scope, as the
 * outermost scope after a long one grew the list past 4096 entries, and
 * at the depths where the marks outgrow their first array (64). Each
 * gives the same gradient bits, leaves the depth as it was and the
 * memory where it started. */
static void grad_at_depth(int depth, tg_tensor *x, double *g)
{
    int before = tg_scope_depth();
    for (int i = 0; i < depth; i++) tg_scope_begin();
    tg_tape *tape = tg_tape_new(NULL);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    tg_tensor *t[5];
    t[0] = tg_mul(x, x);
    t[1] = tg_tanh(t[0]);
    t[2] = tg_sigmoid(x);
    t[3] = tg_mul(t[1], t[2]);
    t[4] = tg_sum(t[3]);
    cr_assert_not_null(t[4], "%s", tg_last_error_message());
    cr_assert_eq(tg_backward(t[4]), TG_OK, "depth %d: %s", depth, tg_last_error_message());
    cr_assert_eq(tg_tensor_copy_out(tg_grad(x), g, 8 * sizeof *g), TG_OK);
    for (int i = 0; depth == 0 && i < 5; i++) tg_tensor_release(t[i]); /* no scope owns them */
    for (int i = 0; i < depth; i++) cr_assert_eq(tg_scope_end(), TG_OK);
    tg_tape_free(tape);
    cr_assert_eq(tg_scope_depth(), before, "depth %d: scopes left open", depth);
    tg_grad_zero(x);
}

Test(scope, backward_keeps_its_bits_and_balance_at_every_depth)
{
    tg_tensor *x = tg_tensor_from_data(TG_F64, 1, SHAPE(8),
                                       (const double[]){-2, -1, -0.5, 0, 0.25, 0.5, 1, 3});
    cr_assert_not_null(x);
    size_t base = tg_mem_current_bytes();
    double want[8], got[8];
    grad_at_depth(1, x, want);
    static const int depths[] = {0, 2, 63, 64, 65, 66, 100};
    for (size_t k = 0; k < sizeof depths / sizeof *depths; k++) {
        grad_at_depth(depths[k], x, got);
        cr_expect_eq(memcmp(got, want, sizeof got), 0, "depth %d: other gradient bits", depths[k]);
    }
    /* A long scope first: the outermost end then may free the list. */
    tg_scope_begin();
    tg_tensor *acc = tg_zeros(TG_F64, 1, SHAPE(2));
    for (int i = 0; i < 5000; i++) acc = tg_add_scalar(acc, 1.0);
    cr_assert_eq(tg_scope_end(), TG_OK);
    grad_at_depth(0, x, got);
    cr_expect_eq(memcmp(got, want, sizeof got), 0, "after a long scope: other gradient bits");
    grad_at_depth(1, x, got);
    cr_expect_eq(memcmp(got, want, sizeof got), 0, "after a long scope: other gradient bits");
    cr_expect_eq(tg_mem_current_bytes(), base, "%zu bytes left", tg_mem_current_bytes() - base);
    tg_tensor_release(x);
}
