/* test_fused.c - fused pointwise functions (tg_fused_new, tg_fused_call).
 *
 * A fused call must give the output and the input gradients of running
 * its function's ops one by one, bit for bit: the same kernels on the same
 * operands, and each value's gradient summed in the sweep's order. The
 * functions below use every kind of step (each unary map, the linear maps,
 * add, sub, mul, a value squared, fan-out, an unused input, a kept last
 * value); the sizes cover one block, a partial last block and several
 * blocks split across two threads; the seeds are a sum's broadcast one
 * and a random tensor. Then the errors, the checkpoint policies, second
 * derivatives and the lifetime of the program. */
#include <criterion/criterion.h>
#include <tapegrad.h>

#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the functions */
static tg_tensor *f_chain(void *ud, int n, tg_tensor *const *in)
{
    (void)ud, (void)n;
    tg_tensor *x = in[0];
    return tg_mul(tg_tanh(tg_add_scalar(tg_mul(x, x), 1.0)), tg_sigmoid(x));
}

/* Every map once, on values kept in their domains (log and sqrt of
 * 1.5 + sigmoid, pow of exp), and a square of a value nothing else reads.
 * Ends with a kept value (tanh). */
static tg_tensor *f_maps(void *ud, int n, tg_tensor *const *in)
{
    (void)ud, (void)n;
    tg_tensor *x = in[0];
    tg_tensor *pos = tg_add_scalar(tg_sigmoid(x), 1.5);
    tg_tensor *a = tg_add(tg_log(pos), tg_sqrt(pos));
    tg_tensor *b = tg_add(tg_pow_scalar(tg_exp(tg_mul_scalar(x, 0.5)), 1.5), tg_abs(x));
    tg_tensor *c = tg_add(tg_gelu(x), tg_silu(tg_neg(x)));
    tg_tensor *d = tg_add(tg_leaky_relu(x, 0.1), tg_clamp(x, -0.5, 0.7));
    tg_tensor *e = tg_add(tg_softplus(x, 2.0, 1.0), tg_add(tg_sin(x), tg_cos(x)));
    tg_tensor *s = tg_add(tg_add(a, b), tg_add(tg_add(tg_mul(c, c), d), tg_add(e, tg_relu(x))));
    return tg_tanh(tg_mul_scalar(s, 0.25));
}

/* Two inputs: sub, products of both, fan-out of each. */
static tg_tensor *f_two(void *ud, int n, tg_tensor *const *in)
{
    (void)ud, (void)n;
    tg_tensor *a = in[0], *b = in[1];
    tg_tensor *p = tg_mul(a, b);
    return tg_sub(tg_mul(tg_exp(tg_mul_scalar(a, -0.5)), b), tg_tanh(tg_add(p, tg_neg(b))));
}

/* Three inputs, the second unused. */
static tg_tensor *f_three(void *ud, int n, tg_tensor *const *in)
{
    (void)ud, (void)n;
    return tg_add(tg_mul(tg_softplus(in[0], 1.0, 20.0), in[2]), tg_sigmoid(in[2]));
}

typedef struct fcase {
    const char *name;
    tg_fused_fn fn;
    int n;
} fcase;

static const fcase cases[] = {
    {"chain", f_chain, 1}, {"maps", f_maps, 1}, {"two", f_two, 2}, {"three", f_three, 3}};

static bool same_bits(const tg_tensor *a, const tg_tensor *b)
{
    size_t bytes = (size_t)tg_tensor_numel(a) * (tg_tensor_dtype(a) == TG_F32 ? 4 : 8);
    if (tg_tensor_numel(a) != tg_tensor_numel(b) || tg_tensor_dtype(a) != tg_tensor_dtype(b))
        return false;
    char *x = malloc(bytes + 1), *y = malloc(bytes + 1);
    cr_assert(x && y);
    cr_assert_eq(tg_tensor_copy_out(a, x, bytes), TG_OK);
    cr_assert_eq(tg_tensor_copy_out(b, y, bytes), TG_OK);
    bool same = memcmp(x, y, bytes) == 0;
    free(x);
    free(y);
    return same;
}

/* Runs fc fused (fused) or op by op on copies of in, seeds backward with
 * seed (NULL: the sum's), and returns the output and gradients (new
 * references). */
static void run_case(const fcase *fc, tg_fused *f, bool fused, tg_tensor *const *in,
                     const tg_tensor *seed, const tg_tape_opts *opts, tg_tensor **out,
                     tg_tensor **grads)
{
    tg_tape *tape = tg_tape_new(opts);
    tg_tensor *x[3];
    for (int i = 0; i < fc->n; i++) {
        x[i] = tg_detach(in[i]);
        cr_assert(x[i]);
        x[i] = tg_contiguous(x[i]);
        x[i] = tg_add_scalar(x[i], 0.0); /* a leaf of its own */
        cr_assert_eq(tg_requires_grad(tape, x[i]), TG_OK, "%s", tg_last_error_message());
    }
    tg_scope_begin();
    tg_tensor *y = fused ? tg_fused_call(f, fc->n, x) : fc->fn(NULL, fc->n, x);
    cr_assert(y, "%s %s: %s", fc->name, fused ? "fused" : "ops", tg_last_error_message());
    tg_status st = seed ? tg_backward_seed(y, seed) : tg_backward(tg_sum(y));
    cr_assert_eq(st, TG_OK, "%s: %s", fc->name, tg_last_error_message());
    *out = tg_tensor_retain(y);
    for (int i = 0; i < fc->n; i++) grads[i] = tg_tensor_retain(tg_grad(x[i]));
    tg_scope_end();
    tg_tape_free(tape);
}

static void compare_case(const fcase *fc, tg_dtype dt, int ndim, const int64_t *shape,
                         bool random_seed, int threads)
{
    tg_rng rng;
    tg_rng_seed(&rng, 42);
    tg_scope_begin();
    tg_tensor *in[3];
    for (int i = 0; i < fc->n; i++) in[i] = tg_rand_uniform(&rng, dt, ndim, shape, -1.5, 1.5);
    tg_tensor *seed = random_seed ? tg_rand_uniform(&rng, dt, ndim, shape, -1, 1) : NULL;
    tg_fused *f = tg_fused_new(fc->fn, NULL, fc->n);
    cr_assert(f, "%s: %s", fc->name, tg_last_error_message());
    int prev = tg_num_threads();
    tg_set_num_threads(threads);
    tg_tensor *yo, *yf, *go[3], *gf[3];
    run_case(fc, f, false, in, seed, NULL, &yo, go);
    run_case(fc, f, true, in, seed, NULL, &yf, gf);
    tg_set_num_threads(prev);
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    cr_expect(same_bits(yo, yf), "%s %s, %lld elements, %d threads: output differs", fc->name,
              tg_dtype_name(dt), (long long)n, threads);
    for (int i = 0; i < fc->n; i++) {
        if (!go[i]) { /* an input the function does not use: zeros from the call */
            cr_expect(gf[i] && tu_item(tg_sum(tg_abs(gf[i]))) == 0.0,
                      "%s: unused input %d", fc->name, i);
            continue;
        }
        cr_expect(same_bits(go[i], gf[i]), "%s %s, %lld elements, %s seed, %d threads: "
                  "gradient %d differs", fc->name, tg_dtype_name(dt), (long long)n,
                  random_seed ? "random" : "sum's", threads, i);
    }
    tg_tensor_release(yo);
    tg_tensor_release(yf);
    for (int i = 0; i < fc->n; i++) tg_tensor_release(go[i]), tg_tensor_release(gf[i]);
    tg_fused_free(f);
    tg_scope_end();
}

Test(fused, calls_give_the_ops_outputs_and_gradients_bit_for_bit)
{
    size_t mem0 = tg_mem_current_bytes();
    static const struct { int ndim; int64_t shape[2]; } sizes[] = {
        {1, {1}}, {2, {3, 5}}, {1, {4097}}, {2, {300, 1001}}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int dt = 0; dt < 2; dt++)
            for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++)
                for (int seed = 0; seed < 2; seed++)
                    compare_case(&cases[c], dt ? TG_F64 : TG_F32, sizes[z].ndim, sizes[z].shape,
                                 seed, 1);
    /* Large enough to split across the pool's threads. */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        compare_case(&cases[c], TG_F32, 1, SHAPE(1 << 20), false, 2);
    cr_expect_eq(tg_mem_current_bytes(), mem0, "leak");
}

/* Products whose operands have gradients already when the sweep reaches
 * them (the sweep goes from the last step to the first; the statements
 * order the steps, as C leaves the order of a call's arguments open):
 * x * x and x * y before tanh(x) and exp(y) read x and y, and the seed
 * passing through a product (the sum's seed of 1). Their
 * contributions are added as the sweep adds them, in one pass. */
static tg_tensor *f_square_after(void *ud, int n, tg_tensor *const *in)
{
    (void)ud, (void)n;
    tg_tensor *x = in[0];
    tg_tensor *q = tg_mul(x, x);
    tg_tensor *t = tg_tanh(x);
    return tg_mul(t, q);
}

static tg_tensor *f_product_after(void *ud, int n, tg_tensor *const *in)
{
    (void)ud, (void)n;
    tg_tensor *x = in[0], *y = in[1];
    tg_tensor *p = tg_mul(x, y);
    tg_tensor *q = tg_mul(x, x);
    tg_tensor *s = tg_add(p, tg_exp(y));
    return tg_mul(s, tg_add(q, tg_tanh(x)));
}

Test(fused, products_add_their_contributions_as_the_sweep_does_on_both_backends)
{
    size_t mem0 = tg_mem_current_bytes();
    static const fcase more[] = {{"square_after", f_square_after, 1},
                                 {"product_after", f_product_after, 2}};
    tg_backend prev = tg_default_backend();
    for (int be = 0; be < 2; be++) {
        tg_set_default_backend(be ? TG_BACKEND_CPU : TG_BACKEND_REF);
        for (size_t c = 0; c < sizeof more / sizeof more[0]; c++)
            for (int dt = 0; dt < 2; dt++)
                for (int seed = 0; seed < 2; seed++)
                    compare_case(&more[c], dt ? TG_F64 : TG_F32, 2, SHAPE(37, 129), seed, 1);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            compare_case(&cases[c], TG_F32, 2, SHAPE(3, 5), true, 1);
    }
    tg_set_default_backend(prev);
    cr_expect_eq(tg_mem_current_bytes(), mem0, "leak");
}

Test(fused, a_call_records_one_node_and_keeps_no_more_than_the_ops)
{
    tg_fused *f = tg_fused_new(f_chain, NULL, 1);
    cr_assert(f);
    cr_expect_eq(tg_fused_ops(f), 5, "x*x, +1, tanh, sigmoid, *: %d", tg_fused_ops(f));
    size_t kept[2];
    for (int fused = 0; fused < 2; fused++) {
        tg_tape *tape = tg_tape_new(NULL);
        tg_scope_begin();
        tg_tensor *x = tg_full(TG_F32, 1, SHAPE(10000), 0.3);
        cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
        tg_tensor *y = fused ? tg_fused_call(f, 1, &x) : f_chain(NULL, 1, &x);
        cr_assert(y);
        if (fused) cr_expect_eq(tg_tape_node_count(tape), 1);
        kept[fused] = tg_tape_saved_bytes(tape);
        tg_scope_end();
        tg_tape_free(tape);
    }
    /* The ops keep t and s (tanh's and sigmoid's outputs, mul's inputs:
     * the same tensors) and the leaf x, which the tape does not count; the
     * call keeps x, a row each of t and s, and its program. */
    cr_expect(kept[1] <= kept[0] + 4096, "fused keeps %zu bytes, the ops %zu", kept[1], kept[0]);
    cr_expect(kept[1] >= 2 * 40000, "fused keeps %zu bytes: t and s are 80000", kept[1]);
    tg_fused_free(f);
}

/* ---- the fused sum: tg_fused_sum against tg_sum of the ops */

/* How a sum's backward is run: the loss times scale (1: the loss's own
 * seed, which finds the gradients a recorded fused sum made with its
 * forward; else its forward runs again), on parameters of a set (their
 * gradients land in the set's flat buffer) or plain leaves, once or twice
 * over the same record (retained; the gradients add up). */
typedef struct sum_run {
    double scale;
    bool params, twice;
} sum_run;

/* loss = sum(fc(in)) by the ops and tg_sum (sum_fused false) or by
 * tg_fused_sum, backward as sr says; the loss and the gradients (new
 * references). */
static void run_sum(const fcase *fc, tg_fused *f, bool sum_fused, tg_tensor *const *in,
                    const sum_run *sr, tg_tensor **loss, tg_tensor **grads)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_params *ps = sr->params ? tg_params_new() : NULL;
    tg_tensor *x[3];
    tg_scope_begin();
    for (int i = 0; i < fc->n; i++) {
        if (ps) {
            static const char *const names[] = {"a", "b", "c"};
            x[i] = tg_params_add(ps, names[i], tg_tensor_dtype(in[i]), tg_tensor_ndim(in[i]),
                                 tg_tensor_shape(in[i]));
            cr_assert(x[i], "%s", tg_last_error_message());
            size_t es = tg_tensor_dtype(in[i]) == TG_F32 ? 4 : 8;
            size_t bytes = (size_t)tg_tensor_numel(in[i]) * es;
            cr_assert_eq(tg_tensor_copy_out(in[i], tg_tensor_data(x[i]), bytes), TG_OK);
        } else {
            x[i] = tg_scope_keep(tg_add_scalar(tg_contiguous(tg_detach(in[i])), 0.0));
            cr_assert(x[i]);
            cr_assert_eq(tg_requires_grad(tape, x[i]), TG_OK, "%s", tg_last_error_message());
        }
    }
    if (ps) {
        cr_assert_eq(tg_params_requires_grad(ps, tape), TG_OK);
        cr_assert(tg_params_flat_grad(ps, tg_tensor_dtype(in[0])));
    }
    tg_tensor *l = sum_fused ? tg_fused_sum(f, fc->n, x) : tg_sum(fc->fn(NULL, fc->n, x));
    cr_assert(l, "%s: %s", fc->name, tg_last_error_message());
    cr_expect_eq(tg_tensor_ndim(l), 0);
    tg_tensor *seeded = sr->scale == 1.0 ? l : tg_mul_scalar(l, sr->scale);
    tg_grad_opts keep = {.retain = true};
    for (int k = 0; k < (sr->twice ? 2 : 1); k++)
        cr_assert_eq(tg_backward_ex(seeded, NULL, sr->twice ? &keep : NULL), TG_OK, "%s: %s",
                     fc->name, tg_last_error_message());
    *loss = tg_tensor_retain(l);
    for (int i = 0; i < fc->n; i++) grads[i] = tg_contiguous(tg_grad(x[i])); /* a copy */
    for (int i = 0; i < fc->n; i++) grads[i] = grads[i] ? tg_tensor_retain(grads[i]) : NULL;
    tg_scope_end();
    tg_tape_free(tape);
    if (ps) {
        tg_params_free(ps);
    } else {
        for (int i = 0; i < fc->n; i++) tg_tensor_release(x[i]);
    }
}

/* The fused sum of fc on in against the ops' tg_sum, run every way of
 * sum_run: the loss and every gradient bit for bit. */
static void expect_same_sum(const fcase *fc, tg_tensor *const *in, int threads, const char *what)
{
    tg_fused *f = tg_fused_new(fc->fn, NULL, fc->n);
    cr_assert(f, "%s: %s", fc->name, tg_last_error_message());
    int prev = tg_num_threads();
    tg_set_num_threads(threads);
    static const sum_run runs[] = {
        {1.0, false, false}, {0.75, false, false}, {1.0, true, false}, {1.0, false, true}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        tg_tensor *lo, *lf, *go[3], *gf[3];
        run_sum(fc, f, false, in, &runs[r], &lo, go);
        run_sum(fc, f, true, in, &runs[r], &lf, gf);
        cr_expect(same_bits(lo, lf), "%s %s, %d threads, run %zu: the sum differs (%.17g vs "
                  "%.17g)", fc->name, what, threads, r, tu_item(lo), tu_item(lf));
        for (int i = 0; i < fc->n; i++) {
            if (go[i])
                cr_expect(gf[i] && same_bits(go[i], gf[i]), "%s %s, %d threads, run %zu: "
                          "gradient %d differs", fc->name, what, threads, r, i);
            tg_tensor_release(go[i]);
            tg_tensor_release(gf[i]);
        }
        tg_tensor_release(lo);
        tg_tensor_release(lf);
    }
    tg_set_num_threads(prev);
    tg_fused_free(f);
}

/* The input's values, kept: the fused sum of x * 1 is tg_sum(x)'s. */
static tg_tensor *f_times_one(void *ud, int n, tg_tensor *const *in)
{
    (void)ud, (void)n;
    return tg_mul_scalar(in[0], 1.0);
}

Test(fused, a_fused_sum_gives_tg_sums_bits_and_its_gradients)
{
    size_t mem0 = tg_mem_current_bytes();
    static const struct { int ndim; int64_t shape[2]; } sizes[] = {
        {0, {0}}, {1, {1}}, {2, {3, 5}}, {1, {4097}}, {2, {300, 1001}}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int dt = 0; dt < 2; dt++)
            for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
                tg_rng rng;
                tg_rng_seed(&rng, 7 + z);
                tg_scope_begin();
                tg_tensor *in[3];
                for (int i = 0; i < cases[c].n; i++)
                    in[i] = tg_rand_uniform(&rng, dt ? TG_F64 : TG_F32, sizes[z].ndim,
                                            sizes[z].shape, -1.5, 1.5);
                char what[64];
                snprintf(what, sizeof what, "%s, size %zu", dt ? "f64" : "f32", z);
                expect_same_sum(&cases[c], in, 1, what);
                if (z == 4) expect_same_sum(&cases[c], in, 2, what);
                tg_scope_end();
            }
    /* 1M f32 values that the exact pass takes (the chain's results lie in
     * (0, 1.3)), on one thread and split across two. */
    tg_scope_begin();
    tg_rng rng;
    tg_rng_seed(&rng, 3);
    tg_tensor *x = tg_rand_uniform(&rng, TG_F32, 1, SHAPE(1 << 20), 0.25, 1.5);
    expect_same_sum(&cases[0], &x, 1, "1M");
    expect_same_sum(&cases[0], &x, 2, "1M");
    tg_scope_end();
    cr_expect_eq(tg_mem_current_bytes(), mem0, "leak");
}

/* Values whose sum depends on the order: 2^60, 1 and -2^60 four and
 * twelve places apart. tg_sum's chain adds the three in one accumulator
 * and loses the 1 (0); in 16 lanes 2^60 and -2^60 cancel and the 1
 * survives. The fused sum cannot show these exact, so it must write the
 * result and give the chain's 0, on one thread and on two, wherever the
 * pattern lies (the first block, the last, a block in the middle). */
Test(fused, a_fused_sum_of_values_not_exact_gives_the_chains_bits)
{
    size_t mem0 = tg_mem_current_bytes();
    const fcase one = {"times_one", f_times_one, 1};
    static const int64_t at[] = {0, 600000, (1 << 20) - 100};
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
        tg_scope_begin();
        float *v = calloc(1 << 20, sizeof *v);
        cr_assert(v);
        for (int64_t j = 0; j < at[k]; j++) v[j] = 1.0f;
        v[at[k]] = 0x1p60f, v[at[k] + 4] = 1.0f, v[at[k] + 16] = -0x1p60f;
        tg_tensor *x = tg_tensor_from_data(TG_F32, 1, SHAPE(1 << 20), v);
        free(v);
        cr_assert(x);
        if (k == 0) /* the chain loses the 1 */
            cr_expect_eq(tu_item(tg_sum(x)), 0.0, "tg_sum: %.17g", tu_item(tg_sum(x)));
        expect_same_sum(&one, &x, 1, "pattern");
        expect_same_sum(&one, &x, 2, "pattern");
        tg_scope_end();
    }
    cr_expect_eq(tg_mem_current_bytes(), mem0, "leak");
}

/* A recorded fused sum keeps its input's gradient for a seed of 1 (made
 * with the forward) where the ops keep t and s; with more inputs needing
 * gradients than values kept (x * y + z keeps none), it keeps nothing
 * and its backward runs the forward again. Never more than the ops. */
static tg_tensor *f_affine(void *ud, int n, tg_tensor *const *in)
{
    (void)ud, (void)n;
    return tg_add(tg_mul(in[0], in[1]), in[2]);
}

Test(fused, a_fused_sum_keeps_no_more_than_the_ops)
{
    const fcase chain = {"chain", f_chain, 1}, affine = {"affine", f_affine, 3};
    const fcase *fcs[] = {&chain, &affine};
    for (int c = 0; c < 2; c++) {
        tg_fused *f = tg_fused_new(fcs[c]->fn, NULL, fcs[c]->n);
        cr_assert(f);
        size_t kept[2];
        for (int fused = 0; fused < 2; fused++) {
            tg_tape *tape = tg_tape_new(NULL);
            tg_scope_begin();
            tg_tensor *x[3];
            for (int i = 0; i < fcs[c]->n; i++) {
                x[i] = tg_full(TG_F32, 1, SHAPE(10000), 0.3 + 0.1 * i);
                cr_assert_eq(tg_requires_grad(tape, x[i]), TG_OK);
            }
            tg_tensor *l = fused ? tg_fused_sum(f, fcs[c]->n, x)
                                 : tg_sum(fcs[c]->fn(NULL, fcs[c]->n, x));
            cr_assert(l, "%s", tg_last_error_message());
            kept[fused] = tg_tape_saved_bytes(tape);
            cr_expect_eq(tg_backward(l), TG_OK);
            tg_scope_end();
            tg_tape_free(tape);
        }
        cr_expect(kept[1] <= kept[0] + 4096, "%s: the fused sum keeps %zu bytes, the ops %zu",
                  fcs[c]->name, kept[1], kept[0]);
        if (c == 0)
            cr_expect(kept[1] >= 40000 && kept[1] < 80000, "chain: %zu bytes, x's gradient "
                      "is 40000", kept[1]);
        else
            cr_expect(kept[1] < 4096, "affine: %zu bytes kept, none expected", kept[1]);
        tg_fused_free(f);
    }
}

Test(fused, a_fused_sum_records_one_node_with_the_sums_value_and_gradient)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_fused *f = tg_fused_new(f_chain, NULL, 1);
    cr_assert(f);
    tg_tape *tape = tg_tape_new(NULL);
    tg_scope_begin();
    tg_tensor *a = tg_full(TG_F32, 2, SHAPE(2, 3), 0.5);
    cr_assert_eq(tg_requires_grad(tape, a), TG_OK);
    tg_tensor *l = tg_fused_sum(f, 1, &a);
    cr_assert(l, "%s", tg_last_error_message());
    cr_expect_eq(tg_tape_node_count(tape), 1);

    /* 6 * tanh(1.25) * sigmoid(0.5), and its gradient at 0.5:
     * s (1 - t^2) 2x + t s (1 - s) each */
    double t = tanh(1.25), s = 1 / (1 + exp(-0.5));
    cr_expect(fabs(tu_item(l) - 6 * t * s) < 1e-5, "%.9g", tu_item(l));
    cr_assert_eq(tg_backward(l), TG_OK);
    double g = s * (1 - t * t) + t * s * (1 - s);
    tu_expect_values(tg_grad(a), (double[]){g, g, g, g, g, g}, 6, 1e-5);
    tg_scope_end();
    tg_tape_free(tape);
    tg_fused_free(f);
    cr_expect_eq(tg_mem_current_bytes(), mem0, "leak");
}

/* ---- errors */
static tg_tensor *f_sum(void *ud, int n, tg_tensor *const *in)
{
    (void)ud, (void)n;
    return tg_sum(tg_tanh(in[0]));
}

static tg_tensor *f_outside(void *ud, int n, tg_tensor *const *in)
{
    (void)n;
    return tg_mul(in[0], (tg_tensor *)ud);
}

static tg_tensor *f_identity(void *ud, int n, tg_tensor *const *in)
{
    (void)ud, (void)n;
    return in[0];
}

static tg_tensor *f_null(void *ud, int n, tg_tensor *const *in)
{
    (void)ud, (void)n, (void)in;
    tg_error_set(TG_ERR_SHAPE, "the user's own failure");
    return NULL;
}

static tg_tensor *f_long(void *ud, int n, tg_tensor *const *in)
{
    (void)ud, (void)n;
    tg_tensor *x = in[0];
    for (int i = 0; i < TG_FUSED_MAX_OPS + 1; i++) x = tg_add_scalar(x, 1.0);
    return x;
}

static tg_tensor *f_untracked(void *ud, int n, tg_tensor *const *in)
{
    (void)ud, (void)n, (void)in;
    return tg_full(TG_F64, 1, SHAPE(1), 2.0);
}

Test(fused, compiling_a_function_it_cannot_run_fails_naming_why)
{
    size_t mem0 = tg_mem_current_bytes();
    cr_expect_null(tg_fused_new(NULL, NULL, 1));
    cr_expect_eq(tg_last_error(), TG_ERR_NULL);
    cr_expect_null(tg_fused_new(f_chain, NULL, 0));
    cr_expect_eq(tg_last_error(), TG_ERR_INVALID);
    cr_expect_null(tg_fused_new(f_chain, NULL, TG_FUSED_MAX_INPUTS + 1));
    cr_expect_eq(tg_last_error(), TG_ERR_INVALID);
    cr_expect_null(tg_fused_new(f_sum, NULL, 1));
    cr_expect_eq(tg_last_error(), TG_ERR_UNSUPPORTED);
    cr_expect(strstr(tg_last_error_message(), "'sum'"), "%s", tg_last_error_message());
    tg_tensor *c = tg_full(TG_F64, 1, SHAPE(1), 3.0);
    cr_expect_null(tg_fused_new(f_outside, c, 1));
    cr_expect_eq(tg_last_error(), TG_ERR_UNSUPPORTED);
    cr_expect(strstr(tg_last_error_message(), "not one of the function's inputs"), "%s",
              tg_last_error_message());
    tg_tensor_release(c);
    cr_expect_null(tg_fused_new(f_identity, NULL, 1));
    cr_expect_eq(tg_last_error(), TG_ERR_UNSUPPORTED);
    cr_expect_null(tg_fused_new(f_untracked, NULL, 1));
    cr_expect_eq(tg_last_error(), TG_ERR_UNSUPPORTED);
    cr_expect_null(tg_fused_new(f_null, NULL, 1));
    cr_expect_eq(tg_last_error(), TG_ERR_SHAPE);
    cr_expect(strstr(tg_last_error_message(), "the user's own failure"));
    cr_expect_null(tg_fused_new(f_long, NULL, 1));
    cr_expect_eq(tg_last_error(), TG_ERR_INVALID);
    cr_expect_eq(tg_fused_ops(NULL), 0);
    tg_fused_free(NULL);
    cr_expect_eq(tg_mem_current_bytes(), mem0, "leak");
}

Test(fused, bad_calls_fail_with_the_ops_statuses_and_leave_the_tape_usable)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_fused *f1 = tg_fused_new(f_chain, NULL, 1), *f2 = tg_fused_new(f_two, NULL, 2);
    cr_assert(f1 && f2);
    tg_tape *tape = tg_tape_new(NULL);
    tg_scope_begin();
    tg_tensor *a = tg_full(TG_F32, 2, SHAPE(2, 3), 0.5), *b = tg_full(TG_F32, 1, SHAPE(6), 0.5);
    tg_tensor *d = tg_full(TG_F64, 2, SHAPE(2, 3), 0.5);
    tg_tensor *i64 = tg_arange(TG_I64, 0, 6, 1);
    cr_assert_eq(tg_requires_grad(tape, a), TG_OK);
    tg_error_clear(); /* a NULL argument keeps a pending error: none here */
    cr_expect_null(tg_fused_call(NULL, 1, &a));
    cr_expect_eq(tg_last_error(), TG_ERR_NULL);
    cr_expect_null(tg_fused_call(f1, 2, (tg_tensor *[]){a, a}));
    cr_expect_eq(tg_last_error(), TG_ERR_INVALID);
    tg_error_clear();
    cr_expect_null(tg_fused_call(f1, 1, NULL));
    cr_expect_eq(tg_last_error(), TG_ERR_NULL);
    tg_error_clear();
    cr_expect_null(tg_fused_call(f2, 2, (tg_tensor *[]){a, NULL}));
    cr_expect_eq(tg_last_error(), TG_ERR_NULL);
    cr_expect_null(tg_fused_call(f2, 2, (tg_tensor *[]){a, b}));
    cr_expect_eq(tg_last_error(), TG_ERR_SHAPE);
    cr_expect_null(tg_fused_call(f2, 2, (tg_tensor *[]){a, d}));
    cr_expect_eq(tg_last_error(), TG_ERR_DTYPE);
    cr_expect_null(tg_fused_call(f1, 1, &i64));
    cr_expect_eq(tg_last_error(), TG_ERR_DTYPE);
    /* The fused sum's, named for it. */
    tg_error_clear();
    cr_expect_null(tg_fused_sum(NULL, 1, &a));
    cr_expect_eq(tg_last_error(), TG_ERR_NULL);
    cr_expect(strstr(tg_last_error_message(), "fused_sum"), "%s", tg_last_error_message());
    cr_expect_null(tg_fused_sum(f1, 2, (tg_tensor *[]){a, a}));
    cr_expect_eq(tg_last_error(), TG_ERR_INVALID);
    tg_error_clear();
    cr_expect_null(tg_fused_sum(f1, 1, NULL));
    cr_expect_eq(tg_last_error(), TG_ERR_NULL);
    cr_expect_null(tg_fused_sum(f2, 2, (tg_tensor *[]){a, b}));
    cr_expect_eq(tg_last_error(), TG_ERR_SHAPE);
    cr_expect_null(tg_fused_sum(f1, 1, &i64));
    cr_expect_eq(tg_last_error(), TG_ERR_DTYPE);
    cr_expect_eq(tg_tape_node_count(tape), 0);
    /* A program tensor that is not one, through the registry, to the
     * call's op and the sum's. */
    for (int sum = 0; sum < 2; sum++) {
        const tg_op *op = tg_op_find(sum ? "fused_sum_1" : "fused_pointwise_1");
        cr_assert(op);
        static const int64_t bad[][8] = {
            {0, 1, 1, 3, 0, -1, 0, 0},                             /* no magic */
            {0x7467667573656431, 2, 1, 3, 0, -1, 0, 0},            /* two inputs */
            {0x7467667573656431, 1, 2, 3, 0, -1, 0, 0},            /* two steps, room for one */
            {0x7467667573656431, 1, 1, 99, 0, -1, 0, 0},           /* unknown step */
            {0x7467667573656431, 1, 1, 3, 1, -1, 0, 0},            /* reads itself */
            {0x7467667573656431, 1, 1, 20, 0, 5, 0, 0},            /* mul of input 0 and 5 */
            {0x7467667573656431, 1, 1, 3, 0, 0, 0, 0},             /* a map with two operands */
        };
        for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
            tg_tensor *p = tg_tensor_from_data(TG_I64, 1, SHAPE(8), bad[k]);
            cr_assert(p);
            cr_expect_null(tg_op_call(op, 2, (tg_tensor *[]){a, p}, NULL), "program %zu ran", k);
            cr_expect_eq(tg_last_error(), TG_ERR_INVALID, "program %zu: %s", k,
                         tg_last_error_message());
            cr_expect(strstr(tg_last_error_message(), "not a fused program"), "%s",
                      tg_last_error_message());
        }
    }
    /* The tape and the tensors still work. */
    tg_tensor *y = tg_fused_call(f1, 1, &a);
    cr_assert(y, "%s", tg_last_error_message());
    cr_expect_eq(tg_backward(tg_sum(y)), TG_OK);
    cr_expect(tg_grad(a));
    tg_scope_end();
    tg_tape_free(tape);
    tg_fused_free(f1);
    tg_fused_free(f2);
    cr_expect_eq(tg_mem_current_bytes(), mem0, "leak");
}

/* ---- policies, second order, lifetime */

/* Two vectors of n values in [-1, 1) from seed, for f_two. */
static void rand_pair(uint64_t seed, tg_dtype dt, int64_t n, tg_tensor **in)
{
    tg_rng rng;
    tg_rng_seed(&rng, seed);
    for (int i = 0; i < 2; i++) {
        in[i] = tg_rand_uniform(&rng, dt, 1, &n, -1, 1);
        cr_assert(in[i]);
    }
}

Test(fused, every_checkpoint_policy_gives_the_same_gradients)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_fused *f = tg_fused_new(f_two, NULL, 2);
    cr_assert(f);
    tg_scope_begin();
    tg_tensor *in[2];
    rand_pair(7, TG_F32, 20000, in);
    const fcase fc = {"two", f_two, 2};
    tg_tensor *y0, *g0[2];
    run_case(&fc, f, true, in, NULL, NULL, &y0, g0);
    const tg_tape_opts pol[] = {{.policy = TG_CHECKPOINT_BALANCED},
                                {.policy = TG_CHECKPOINT_BUDGET, .budget_bytes = 200000}};
    for (size_t p = 0; p < sizeof pol / sizeof pol[0]; p++) {
        tg_tensor *y, *g[2];
        run_case(&fc, f, true, in, NULL, &pol[p], &y, g);
        cr_expect(same_bits(y, y0) && same_bits(g[0], g0[0]) && same_bits(g[1], g0[1]),
                  "policy %zu", p);
        tg_tensor_release(y);
        tg_tensor_release(g[0]);
        tg_tensor_release(g[1]);
    }
    tg_tensor_release(y0);
    tg_tensor_release(g0[0]);
    tg_tensor_release(g0[1]);
    tg_scope_end();
    tg_fused_free(f);
    cr_expect_eq(tg_mem_current_bytes(), mem0, "leak");
}

static tg_fused *seg_f;

static tg_tensor *seg_fn(void *ud, int layer, tg_tensor *x)
{
    (void)ud, (void)layer;
    return tg_sigmoid(tg_fused_call(seg_f, 1, &x));
}

Test(fused, a_call_inside_a_checkpoint_segment_is_rerun_in_backward)
{
    size_t mem0 = tg_mem_current_bytes();
    seg_f = tg_fused_new(f_maps, NULL, 1);
    cr_assert(seg_f);
    tg_tensor *g[2];
    for (int seg = 0; seg < 2; seg++) {
        tg_tape *tape = tg_tape_new(NULL);
        tg_scope_begin();
        tg_tensor *x = tg_arange(TG_F64, -2, 2, 0.0008);
        cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
        tg_tensor *y = seg ? tg_checkpoint(tape, seg_fn, NULL, x) : seg_fn(NULL, 0, x);
        cr_assert(y, "%s", tg_last_error_message());
        cr_assert_eq(tg_backward(tg_sum(y)), TG_OK, "%s", tg_last_error_message());
        if (seg) cr_expect_gt(tg_tape_recompute_count(tape), 0);
        g[seg] = tg_tensor_retain(tg_grad(x));
        tg_scope_end();
        tg_tape_free(tape);
    }
    cr_expect(same_bits(g[0], g[1]));
    tg_tensor_release(g[0]);
    tg_tensor_release(g[1]);
    tg_fused_free(seg_f);
    cr_expect_eq(tg_mem_current_bytes(), mem0, "leak");
}

Test(fused, second_derivatives_match_the_ops)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_fused *f = tg_fused_new(f_two, NULL, 2);
    cr_assert(f);
    tg_scope_begin();
    tg_tensor *in[2];
    rand_pair(3, TG_F64, 50, in);
    tg_tensor *a0 = in[0], *b0 = in[1], *hv[2];
    for (int fused = 0; fused < 2; fused++) {
        tg_tape *tape = tg_tape_new(NULL);
        tg_tensor *a = tg_add_scalar(a0, 0.0), *b = tg_add_scalar(b0, 0.0);
        cr_assert_eq(tg_requires_grad(tape, a), TG_OK);
        cr_assert_eq(tg_requires_grad(tape, b), TG_OK);
        tg_tensor *ab[2] = {a, b};
        tg_tensor *y = fused ? tg_fused_call(f, 2, ab) : f_two(NULL, 2, ab);
        tg_tensor *ga[2];
        tg_grad_opts o = {.create_graph = true};
        cr_assert_eq(tg_grad_of(1, &(tg_tensor *){tg_sum(y)}, NULL, 2, (tg_tensor *[]){a, b}, ga,
                                &o),
                     TG_OK, "%s", tg_last_error_message());
        /* d/da of sum(ga[0] * ga[1]): a mixed second derivative. */
        tg_tensor *h[1];
        cr_assert_eq(tg_grad_of(1, &(tg_tensor *){tg_sum(tg_mul(ga[0], ga[1]))}, NULL, 1, &a, h,
                                NULL),
                     TG_OK, "%s", tg_last_error_message());
        hv[fused] = tg_tensor_retain(h[0]);
        tg_tape_free(tape);
    }
    double *q = tu_values(hv[0]);
    tu_expect_values(hv[1], q, 50, 1e-12);
    free(q);
    tg_tensor_release(hv[0]);
    tg_tensor_release(hv[1]);
    tg_scope_end();
    tg_fused_free(f);
    cr_expect_eq(tg_mem_current_bytes(), mem0, "leak");
}

Test(fused, freeing_the_function_before_backward_is_safe)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_fused *f = tg_fused_new(f_chain, NULL, 1);
    cr_assert(f);
    tg_tape *tape = tg_tape_new(NULL);
    tg_scope_begin();
    tg_tensor *x = tg_arange(TG_F32, -1, 1, 1.0 / 4500);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    tg_tensor *y = tg_fused_call(f, 1, &x);
    cr_assert(y);
    tg_fused_free(f);
    cr_expect_eq(tg_backward(tg_sum(y)), TG_OK, "%s", tg_last_error_message());
    tg_tensor *g = tg_grad(x);
    cr_assert(g);
    double v;
    cr_assert_eq(tg_tensor_get(g, 4500, &v), TG_OK);
    cr_expect(isfinite(v) && v != 0.0);
    tg_scope_end();
    tg_tape_free(tape);
    cr_expect_eq(tg_mem_current_bytes(), mem0, "leak");
}

/* The loss of a and x through f (a new reference, outside any scope):
 * tg_sum of the call, or the fused sum. */
static tg_tensor *replay_loss(tg_fused *f, bool sum, tg_tensor *a, tg_tensor *x)
{
    tg_tensor *in[] = {a, x};
    if (sum) return tg_fused_sum(f, 2, in);
    tg_tensor *y = tg_fused_call(f, 2, in), *l = tg_sum(y);
    tg_tensor_release(y);
    return l;
}

static void replay_case(bool sum)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_fused *f = tg_fused_new(f_two, NULL, 2);
    cr_assert(f);
    tg_rng rng;
    tg_rng_seed(&rng, 11);
    tg_tensor *a = tg_rand_uniform(&rng, TG_F32, 1, SHAPE(30000), -1, 1);
    tg_tensor *x = tg_rand_uniform(&rng, TG_F32, 1, SHAPE(30000), -1, 1);
    tg_tensor *x2 = tg_rand_uniform(&rng, TG_F32, 1, SHAPE(30000), -1, 1);
    tg_tape *rt = tg_tape_new(&(tg_tape_opts){.replay = true});
    cr_assert_eq(tg_requires_grad(rt, a), TG_OK);
    cr_assert_eq(tg_tape_input(rt, x), TG_OK, "%s", tg_last_error_message());
    tg_tensor *loss = replay_loss(f, sum, a, x);
    cr_assert(loss, "%s", tg_last_error_message());
    cr_assert_eq(tg_tape_replay(rt, 1, &x, &x2), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    tg_tensor *g_replay = tg_tensor_retain(tg_grad(a));
    /* Recorded afresh on the new values. */
    tg_tape *t2 = tg_tape_new(NULL);
    tg_tensor *b = tg_add_scalar(a, 0.0);
    tg_tensor *b2 = tg_detach(b);
    cr_assert_eq(tg_requires_grad(t2, b2), TG_OK, "%s", tg_last_error_message());
    tg_tensor *l2 = replay_loss(f, sum, b2, x2);
    cr_assert_eq(tg_backward(l2), TG_OK, "%s", tg_last_error_message());
    cr_expect(same_bits(g_replay, tg_grad(b2)), "sum %d", sum);
    cr_expect(same_bits(loss, l2), "sum %d", sum);
    tg_tensor *rel[] = {g_replay, l2, b2, b, loss, a, x, x2};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) tg_tensor_release(rel[i]);
    tg_tape_free(t2);
    tg_tape_free(rt);
    tg_fused_free(f);
    cr_expect_eq(tg_mem_current_bytes(), mem0, "leak");
}

Test(fused, a_replayed_call_gives_the_gradients_of_recording_again)
{
    replay_case(false);
    replay_case(true);
}
