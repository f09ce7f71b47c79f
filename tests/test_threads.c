/* Elementwise kernels split across the thread pool give exactly the
 * single-thread results (each element is computed by the same code, only
 * on another thread), for every split path: unary, fused grad, binary
 * same-shape, scalar and row broadcasts. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <tapegrad.h>

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

static float *run(int threads, tg_tensor *x, tg_tensor *row, tg_tensor *s, size_t *n)
{
    cr_assert_eq(tg_set_num_threads(threads), TG_OK);
    cr_assert_eq(tg_num_threads(), threads);
    tg_tape *tape = tg_tape_new(NULL);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    tg_scope_begin();
    tg_tensor *y = tg_mul(tg_add(tg_tanh(x), row), tg_sigmoid(tg_mul(x, s)));
    tg_tensor *z = tg_sub(tg_exp(tg_mul_scalar(y, 0.1)), tg_relu(tg_add(row, y)));
    cr_assert_eq(tg_backward(tg_sum(z)), TG_OK, "%s", tg_last_error_message());
    *n = (size_t)tg_tensor_numel(z);
    float *out = malloc(2 * *n * sizeof *out);
    tg_tensor_copy_out(z, out, *n * sizeof *out);
    tg_tensor_copy_out(tg_grad(x), out + *n, *n * sizeof *out);
    tg_scope_end();
    tg_grad_zero(x);
    tg_tape_free(tape);
    return out;
}

Test(threads, split_kernels_match_one_thread_bitwise)
{
    int before = tg_num_threads();
    tg_rng rng;
    tg_rng_seed(&rng, 8);
    tg_tensor *x = tg_rand_uniform(&rng, TG_F32, 2, SHAPE(512, 1031), -3, 3);
    tg_tensor *row = tg_rand_uniform(&rng, TG_F32, 1, SHAPE(1031), -1, 1);
    tg_tensor *s = tg_scalar(TG_F32, 0.7);
    size_t n1, n2;
    float *one = run(1, x, row, s, &n1), *two = run(2, x, row, s, &n2), *four = run(4, x, row, s, &n2);
    cr_assert_eq(n1, n2);
    cr_assert_eq(memcmp(one, two, 2 * n1 * sizeof(float)), 0, "2 threads differ from 1");
    cr_assert_eq(memcmp(one, four, 2 * n1 * sizeof(float)), 0, "4 threads differ from 1");
    free(one);
    free(two);
    free(four);
    cr_assert_eq(tg_set_num_threads(0), TG_ERR_INVALID);
    cr_assert_eq(tg_set_num_threads(before), TG_OK);
    tg_tensor_release(x);
    tg_tensor_release(row);
    tg_tensor_release(s);
}
