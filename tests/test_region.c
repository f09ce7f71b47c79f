/* Pointwise regions: backward runs a chain of TG_OP_POINTWISE ops over
 * large tensors block by block (src/tape/region.c). The gradients must be
 * those of the whole-tensor sweep (tg_tape_opts.plain_backward) bitwise,
 * under NONE and BALANCED, on large tensors (with a partial last block)
 * and small ones (always the plain path); the blocked path must not
 * rematerialise whole tensors; a failing backward inside a region must
 * leave the leaves untouched and leak nothing. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tapegrad.h>

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

/* ---- a user op flagged pointwise: y = x / (1 + |x|); its backward fails
 * while fail_backward is set. */
static bool fail_backward;

static tg_tensor *ss_forward(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    const double *x = tg_tensor_data(in[0]);
    double *o = tg_tensor_data(y);
    for (int64_t i = 0; i < tg_tensor_numel(in[0]); i++) o[i] = x[i] / (1.0 + fabs(x[i]));
    return y;
}

static tg_status ss_backward(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin)
{
    if (fail_backward) return tg_error_set(TG_ERR_INVALID, "ss_pointwise: backward refused");
    tg_tensor *x = tg_op_ctx_input(ctx, 0);
    tg_tensor *absx = tg_add(tg_relu(x), tg_relu(tg_neg(x)));
    gin[0] = tg_mul(gout, tg_pow_scalar(tg_add_scalar(absx, 1.0), -2.0));
    return gin[0] ? TG_OK : tg_last_error();
}

static int ss_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *attrs)
{
    (void)attrs;
    if (k >= 1) return 0;
    in[0] = tg_scope_keep(tg_rand_uniform(rng, TG_F64, 1, SHAPE(6), -3.0, 3.0));
    return in[0] ? 1 : -1;
}

static const tg_op *ss_op(void)
{
    const tg_op *op = tg_op_find("ss_pointwise");
    if (op) return op;
    static const tg_op def = {
        .name = "ss_pointwise", .doc = "y = x / (1 + |x|)", .arity = 1, .shape = tg_op_shape_same,
        .forward = ss_forward, .backward = ss_backward, .cost = TG_COST_MEMORY_BOUND,
        .saves = TG_SAVE_INPUT(0), .flags = TG_OP_POINTWISE, .sample = ss_sample,
    };
    cr_assert_eq(tg_op_register(&def), TG_OK, "%s", tg_last_error_message());
    return tg_op_find("ss_pointwise");
}

/* A graph with fan-out, a constant operand of full size, a broadcast
 * scalar, a user op, and a value (b) that a later non-pointwise consumer
 * (mean) also reads, so the region starts with a gradient from outside. */
static tg_tensor *graph(tg_tensor *x, tg_tensor *y, tg_tensor *c, tg_tensor *s)
{
    const tg_op *ss = ss_op();
    tg_tensor *a = tg_mul(x, y);
    tg_tensor *b = tg_tanh(a);
    tg_tensor *e = tg_exp(tg_neg(x));
    tg_tensor *d = tg_div(b, tg_add_scalar(e, 2.0));
    tg_tensor *f = tg_sub(d, tg_mul(c, x));
    tg_tensor *u = tg_op_call(ss, 1, &f, NULL);
    tg_tensor *h = tg_maximum(tg_gelu(u), tg_mul(y, s));
    tg_tensor *k = tg_sigmoid(tg_pow_scalar(tg_add_scalar(tg_abs(h), 0.5), 1.5));
    return tg_add(tg_sum(tg_mul(k, h)), tg_mean(b));
}

/* graph()'s inputs, the same values on every call (n of each, s a
 * scalar), x and y leaves of a new tape with policy and plain_backward. */
typedef struct graph_inputs {
    tg_tensor *x, *y, *c, *s;
    tg_tape *tape;
} graph_inputs;

static graph_inputs inputs(tg_checkpoint_policy policy, bool plain, int64_t n)
{
    tg_rng rng;
    tg_rng_seed(&rng, 5);
    graph_inputs in = {
        .x = tg_rand_uniform(&rng, TG_F64, 1, SHAPE(n), -2.0, 2.0),
        .y = tg_rand_uniform(&rng, TG_F64, 1, SHAPE(n), -2.0, 2.0),
        .c = tg_rand_uniform(&rng, TG_F64, 1, SHAPE(n), -1.0, 1.0),
        .s = tg_full(TG_F64, 0, NULL, 0.3),
        .tape = tg_tape_new(&(tg_tape_opts){.policy = policy, .plain_backward = plain}),
    };
    cr_assert_eq(tg_requires_grad(in.tape, in.x), TG_OK);
    cr_assert_eq(tg_requires_grad(in.tape, in.y), TG_OK);
    return in;
}

static void inputs_free(graph_inputs *in)
{
    tg_tape_free(in->tape);
    tg_tensor_release(in->x);
    tg_tensor_release(in->y);
    tg_tensor_release(in->c);
    tg_tensor_release(in->s);
}

typedef struct run_out {
    double *gx, *gy;
    size_t backward_peak; /* tensor storage added at peak during backward */
    int64_t recomputes;
} run_out;

static char backward_msg[256];

static run_out run(tg_checkpoint_policy policy, bool plain, int64_t n, tg_status *bst)
{
    graph_inputs in = inputs(policy, plain, n);
    tg_tensor *x = in.x, *y = in.y, *c = in.c, *s = in.s;
    tg_tape *tape = in.tape;
    run_out r = {0};
    tg_scope_begin();
    tg_tensor *loss = graph(x, y, c, s);
    cr_assert_not_null(loss, "%s", tg_last_error_message());
    size_t before = tg_mem_current_bytes();
    tg_mem_reset_peak();
    *bst = tg_backward(loss);
    snprintf(backward_msg, sizeof backward_msg, "%s", tg_last_error_message());
    r.backward_peak = tg_mem_peak_bytes() - before;
    tg_scope_end();
    r.recomputes = tg_tape_recompute_count(tape);
    if (*bst == TG_OK) {
        r.gx = malloc((size_t)n * sizeof(double));
        r.gy = malloc((size_t)n * sizeof(double));
        cr_assert_eq(tg_tensor_copy_out(tg_grad(x), r.gx, (size_t)n * sizeof(double)), TG_OK);
        cr_assert_eq(tg_tensor_copy_out(tg_grad(y), r.gy, (size_t)n * sizeof(double)), TG_OK);
    } else {
        cr_expect_null(tg_grad(x), "a failed backward must not reach a leaf");
        cr_expect_null(tg_grad(y), "a failed backward must not reach a leaf");
    }
    inputs_free(&in);
    return r;
}

static void expect_same(const run_out *a, const run_out *b, int64_t n, const char *what)
{
    cr_expect_eq(memcmp(a->gx, b->gx, (size_t)n * sizeof(double)), 0, "%s: d/dx differs", what);
    cr_expect_eq(memcmp(a->gy, b->gy, (size_t)n * sizeof(double)), 0, "%s: d/dy differs", what);
}

static void free_out(run_out *r)
{
    free(r->gx);
    free(r->gy);
}

Test(region, blocked_backward_gives_nones_gradients_bitwise_without_whole_recomputed_tensors)
{
    size_t mem0 = tg_mem_current_bytes();
    /* 8192 f64 per block: 12 whole blocks and a partial one. */
    const int64_t n = 12 * 8192 + 1000;
    tg_status st;
    run_out plain = run(TG_CHECKPOINT_NONE, true, n, &st);
    cr_assert_eq(st, TG_OK, "%s", tg_last_error_message());
    run_out none = run(TG_CHECKPOINT_NONE, false, n, &st);
    cr_assert_eq(st, TG_OK, "%s", tg_last_error_message());
    run_out bal = run(TG_CHECKPOINT_BALANCED, false, n, &st);
    cr_assert_eq(st, TG_OK, "%s", tg_last_error_message());
    run_out bal_plain = run(TG_CHECKPOINT_BALANCED, true, n, &st);
    cr_assert_eq(st, TG_OK, "%s", tg_last_error_message());
    expect_same(&plain, &none, n, "none, blocked");
    expect_same(&plain, &bal, n, "balanced, blocked");
    expect_same(&plain, &bal_plain, n, "balanced, plain");
    cr_expect_gt(bal.recomputes, 5, "the chain was recomputed (%lld forwards)",
                 (long long)bal.recomputes);
    /* The blocked path writes whole only the two leaf gradients; the plain
     * path rematerialises each recomputed value whole (n doubles apiece, a
     * dozen of them) and NONE's plain backward makes a whole gradient per
     * node. Blocks cost under 4 MB. */
    size_t whole = (size_t)n * sizeof(double);
    cr_expect_leq(bal.backward_peak, 2 * whole + ((size_t)4 << 20),
                  "backward peak %zu bytes: more than the two leaf gradients (%zu each)",
                  bal.backward_peak, whole);
    cr_expect_lt(bal.backward_peak, bal_plain.backward_peak, "balanced blocked %zu vs plain %zu",
                 bal.backward_peak, bal_plain.backward_peak);
    cr_expect_lt(none.backward_peak, plain.backward_peak, "none blocked %zu vs plain %zu",
                 none.backward_peak, plain.backward_peak);
    free_out(&plain);
    free_out(&none);
    free_out(&bal);
    free_out(&bal_plain);
    cr_expect_eq(tg_mem_current_bytes(), mem0);
}

Test(region, small_tensors_take_the_plain_path_with_the_same_gradients)
{
    const int64_t n = 1000;
    tg_status st;
    run_out none = run(TG_CHECKPOINT_NONE, false, n, &st);
    cr_assert_eq(st, TG_OK, "%s", tg_last_error_message());
    run_out bal = run(TG_CHECKPOINT_BALANCED, false, n, &st);
    cr_assert_eq(st, TG_OK, "%s", tg_last_error_message());
    expect_same(&none, &bal, n, "balanced, plain");
    free_out(&none);
    free_out(&bal);
}

Test(region, a_failing_backward_inside_a_region_leaves_the_leaves_untouched)
{
    size_t mem0 = tg_mem_current_bytes();
    const int64_t n = 4 * 8192;
    const tg_checkpoint_policy pol[2] = {TG_CHECKPOINT_NONE, TG_CHECKPOINT_BALANCED};
    for (int p = 0; p < 2; p++) {
        tg_status st;
        fail_backward = true;
        run_out bad = run(pol[p], false, n, &st);
        fail_backward = false;
        cr_expect_eq(st, TG_ERR_INVALID, "policy %d: got %s", p, tg_strerror(st));
        cr_expect(strstr(backward_msg, "ss_pointwise") != NULL, "%s", backward_msg);
        cr_expect_eq(tg_mem_current_bytes(), mem0, "storage leaked by the failed backward");
        run_out good = run(pol[p], false, n, &st);
        cr_expect_eq(st, TG_OK, "%s", tg_last_error_message());
        free_out(&bad);
        free_out(&good);
    }
    cr_expect_eq(tg_mem_current_bytes(), mem0);
}

/* With two threads the blocks of a run are split between them; the
 * gradients are those of one thread bitwise, and a backward failing on
 * the pool's thread reports its error on the caller's. */
Test(region, blocks_on_two_threads_give_one_threads_gradients_and_errors)
{
    const int64_t n = 16 * 8192; /* f64: 16 blocks */
    int prev = tg_num_threads();
    const tg_checkpoint_policy pol[2] = {TG_CHECKPOINT_NONE, TG_CHECKPOINT_BALANCED};
    for (int p = 0; p < 2; p++) {
        tg_status st;
        cr_assert_eq(tg_set_num_threads(1), TG_OK);
        run_out one = run(pol[p], false, n, &st);
        cr_assert_eq(st, TG_OK, "%s", tg_last_error_message());
        cr_assert_eq(tg_set_num_threads(2), TG_OK);
        for (int rep = 0; rep < 3; rep++) {
            run_out two = run(pol[p], false, n, &st);
            cr_assert_eq(st, TG_OK, "%s", tg_last_error_message());
            expect_same(&one, &two, n, p ? "balanced, 2 threads" : "none, 2 threads");
            free_out(&two);
        }
        size_t mem0 = tg_mem_current_bytes();
        fail_backward = true;
        run_out bad = run(pol[p], false, n, &st);
        fail_backward = false;
        cr_expect_eq(st, TG_ERR_INVALID, "policy %d: got %s", p, tg_strerror(st));
        cr_expect(strstr(backward_msg, "ss_pointwise: backward refused") != NULL, "%s",
                  backward_msg);
        free_out(&bad);
        cr_expect_eq(tg_mem_current_bytes(), mem0, "storage leaked by the failed backward");
        free_out(&one);
    }
    cr_assert_eq(tg_set_num_threads(prev), TG_OK);
}

/* tg_grad_of runs regions too (when it neither records nor retains):
 * gradients of x and y bitwise those of tg_backward and of the node-by-node
 * sweep, under NONE and BALANCED; asking for an interior value inside the
 * run, or only for x, or with retain, gives what the plain sweep gives. */
static double *grad_of_run(tg_checkpoint_policy policy, bool plain, int64_t n, int which,
                           bool retain)
{
    graph_inputs in = inputs(policy, plain, n);
    tg_tensor *x = in.x, *y = in.y, *c = in.c, *s = in.s;
    tg_tape *tape = in.tape;
    tg_scope_begin();
    tg_tensor *b = tg_tanh(tg_mul(x, y)); /* graph()'s first two ops, recorded again below */
    tg_tensor *loss = tg_add(graph(x, y, c, s), tg_sum(tg_mul(b, b)));
    cr_assert_not_null(loss, "%s", tg_last_error_message());
    tg_tensor *want[3] = {x, y, b}, *g[3] = {0};
    tg_grad_opts o = {.retain = retain};
    int nw = which == 0 ? 3 : which == 1 ? 1 : 2; /* x, y, b / x / x, y */
    cr_assert_eq(tg_grad_of(1, &loss, NULL, nw, want, g, &o), TG_OK, "%s",
                 tg_last_error_message());
    double *out = malloc((size_t)(3 * n) * sizeof *out);
    cr_assert_not_null(out);
    for (int k = 0; k < 3; k++)
        if (k < nw)
            cr_assert_eq(tg_tensor_copy_out(g[k], out + k * n, (size_t)n * sizeof(double)), TG_OK);
        else
            memset(out + k * n, 0, (size_t)n * sizeof(double));
    if (which == 2 && !retain && !plain) {
        /* the same gradients as tg_backward leaves in x and y */
        tg_tape_reset(tape);
        tg_tensor *b2 = tg_tanh(tg_mul(x, y));
        tg_tensor *l2 = tg_add(graph(x, y, c, s), tg_sum(tg_mul(b2, b2)));
        cr_assert_eq(tg_backward(l2), TG_OK, "%s", tg_last_error_message());
        for (int k = 0; k < 2; k++) {
            double *v = malloc((size_t)n * sizeof *v);
            cr_assert_eq(tg_tensor_copy_out(tg_grad(want[k]), v, (size_t)n * sizeof(double)),
                         TG_OK);
            cr_expect(memcmp(v, out + k * n, (size_t)n * sizeof(double)) == 0,
                      "tg_grad_of and tg_backward differ for input %d", k);
            free(v);
        }
    }
    tg_scope_end();
    inputs_free(&in);
    return out;
}

Test(region, grad_of_through_regions_gives_the_plain_sweeps_gradients_bitwise)
{
    const int64_t n = 12 * 8192 + 1000;
    const tg_checkpoint_policy pol[2] = {TG_CHECKPOINT_NONE, TG_CHECKPOINT_BALANCED};
    size_t mem0 = tg_mem_current_bytes();
    for (int p = 0; p < 2; p++)
        for (int which = 0; which < 3; which++)
            for (int retain = 0; retain < 2; retain++) {
                double *blocked = grad_of_run(pol[p], false, n, which, retain);
                double *plain = grad_of_run(pol[p], true, n, which, retain);
                cr_expect(memcmp(blocked, plain, (size_t)(3 * n) * sizeof(double)) == 0,
                          "policy %d, inputs %d, retain %d: blocked and plain differ", p, which,
                          retain);
                free(blocked);
                free(plain);
            }
    cr_expect_eq(tg_mem_current_bytes(), mem0);
}

/* The second sweep of a Hessian-vector product records nothing, so it runs
 * in regions too, through the fused gradient ops the first sweep recorded
 * under create_graph (tanh_backward, sigmoid_backward, exp_backward,
 * softplus_backward: flagged pointwise like their maps; softplus's takes
 * its composite f''). Hv must be the plain sweep's bitwise, and the
 * blocked sweep must write whole only what leaves the run: the gradient of
 * x, not one gradient per recorded op. */
static double *hvp_run(bool plain, int64_t n, size_t *sweep_peak)
{
    tg_tape_opts o = {.plain_backward = plain};
    tg_tape *tape = tg_tape_new(&o);
    tg_rng rng;
    tg_rng_seed(&rng, 41);
    tg_tensor *x = tg_rand_uniform(&rng, TG_F64, 1, SHAPE(n), -1.5, 1.5);
    tg_tensor *v = tg_rand_uniform(&rng, TG_F64, 1, SHAPE(n), -1, 1);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    tg_scope_begin();
    tg_tensor *h = tg_mul(tg_tanh(tg_add_scalar(tg_mul(x, x), 1.0)), tg_sigmoid(x));
    h = tg_add(h, tg_softplus(tg_exp(tg_mul_scalar(x, 0.5)), 1.0, 20.0));
    tg_tensor *loss = tg_sum(h), *g = NULL, *hv = NULL;
    tg_grad_opts cg = {.create_graph = true};
    cr_assert_eq(tg_grad_of(1, &loss, NULL, 1, &x, &g, &cg), TG_OK, "%s",
                 tg_last_error_message());
    tg_tensor *s = tg_sum(tg_mul(g, v));
    cr_assert_not_null(s, "%s", tg_last_error_message());
    size_t before = tg_mem_current_bytes();
    tg_mem_reset_peak();
    cr_assert_eq(tg_grad_of(1, &s, NULL, 1, &x, &hv, NULL), TG_OK, "%s",
                 tg_last_error_message());
    *sweep_peak = tg_mem_peak_bytes() - before;
    double *out = malloc((size_t)n * sizeof *out);
    cr_assert_not_null(out);
    cr_assert_eq(tg_tensor_copy_out(hv, out, (size_t)n * sizeof(double)), TG_OK);
    tg_scope_end();
    tg_tensor_release(x);
    tg_tensor_release(v);
    tg_tape_free(tape);
    return out;
}

Test(region, hessian_vector_products_sweep_the_recorded_backward_in_blocks)
{
    const int64_t n = 48 * 8192 + 1000; /* 3.1 MB a tensor */
    size_t mem0 = tg_mem_current_bytes(), blocked_peak, plain_peak;
    double *blocked = hvp_run(false, n, &blocked_peak);
    double *plain = hvp_run(true, n, &plain_peak);
    cr_expect(memcmp(blocked, plain, (size_t)n * sizeof(double)) == 0,
              "blocked and plain Hessian-vector products differ");
    size_t whole = (size_t)n * sizeof(double);
    cr_expect_leq(blocked_peak, whole + ((size_t)3 << 20),
                  "second sweep peak %zu bytes: more than Hv (%zu) and the blocks",
                  blocked_peak, whole);
    cr_expect_gt(plain_peak, 3 * whole, "plain second sweep peak %zu", plain_peak);
    free(blocked);
    free(plain);
    cr_expect_eq(tg_mem_current_bytes(), mem0);
}

/* ---- random pointwise graphs: leaves x, y, z of n elements and a
 * constant c, then k ops drawn from every kind of pointwise op the
 * registry has built in (maps with one or two parameters, the linear
 * maps, the four arithmetic ops, minimum and maximum, a broadcast scalar
 * operand), each on values drawn from all made so far (fan-out, a value
 * read by ops far apart, an input used twice as in x * x). The loss adds
 * the sum of the last value times x to the mean of a random earlier one,
 * so that a run can start with a gradient from outside it. Operands are kept in
 * ranges where no op overflows: every result goes through tanh before it
 * is reused where a map could blow it up. */
static tg_tensor *random_op(tg_rng *rng, tg_tensor **v, int nv, tg_tensor *s)
{
    tg_tensor *a = v[tg_rng_next(rng) % (uint64_t)nv], *b = v[tg_rng_next(rng) % (uint64_t)nv];
    tg_tensor *t = tg_tanh(a); /* in (-1, 1) */
    switch (tg_rng_next(rng) % 22) {
    case 0: return tg_add(a, b);
    case 1: return tg_sub(a, b);
    case 2: return tg_mul(a, b);
    case 3: return tg_mul(a, a);
    case 4: return tg_div(a, tg_add_scalar(tg_mul(b, b), 1.0));
    case 5: return tg_maximum(a, b);
    case 6: return tg_minimum(a, tg_mul(b, s));
    case 7: return tg_neg(a);
    case 8: return tg_add_scalar(a, -0.25);
    case 9: return tg_mul_scalar(a, 1.5);
    case 10: return tg_exp(t);
    case 11: return tg_log(tg_add_scalar(tg_mul(t, t), 0.5));
    case 12: return tg_sqrt(tg_add_scalar(tg_mul(a, a), 0.1));
    case 13: return tg_sigmoid(a);
    case 14: return tg_relu(a);
    case 15: return tg_abs(a);
    case 16: return tg_gelu(t);
    case 17: return tg_silu(t);
    case 18: return tg_sin(a);
    case 19: return tg_leaky_relu(a, 0.1);
    case 20: return tg_clamp(a, -0.5, 0.75);
    default: return tg_softplus(t, 2.0, 20.0);
    }
}

/* The gradients of x, y and z (3n values, caller frees) for graph `seed`
 * on a tape with policy and plain_backward. */
static double *random_graph_grads(uint64_t seed, tg_dtype dt, int64_t n,
                                  tg_checkpoint_policy policy, bool plain)
{
    tg_rng rng;
    tg_rng_seed(&rng, 1000 + seed);
    tg_tape *tape = tg_tape_new(&(tg_tape_opts){.policy = policy, .plain_backward = plain});
    tg_tensor *leaf[3];
    for (int i = 0; i < 3; i++) {
        leaf[i] = tg_rand_uniform(&rng, dt, 1, SHAPE(n), -2.0, 2.0);
        cr_assert_eq(tg_requires_grad(tape, leaf[i]), TG_OK);
    }
    tg_tensor *c = tg_rand_uniform(&rng, dt, 1, SHAPE(n), -1.0, 1.0);
    tg_tensor *s = tg_full(dt, 0, NULL, 0.7);
    tg_scope_begin();
    tg_tensor *v[40] = {leaf[0], leaf[1], leaf[2], c};
    int nv = 4, k = 8 + (int)(tg_rng_next(&rng) % 24);
    for (int i = 0; i < k; i++) {
        v[nv] = random_op(&rng, v, nv, s);
        cr_assert_not_null(v[nv], "seed %llu: %s", (unsigned long long)seed,
                           tg_last_error_message());
        nv++;
    }
    tg_tensor *other = v[4 + tg_rng_next(&rng) % (uint64_t)(nv - 5)];
    /* Times x: the loss always depends on a leaf. */
    tg_tensor *loss = tg_add(tg_sum(tg_mul(v[nv - 1], leaf[0])), tg_mean(other));
    cr_assert_eq(tg_backward(loss), TG_OK, "seed %llu: %s", (unsigned long long)seed,
                 tg_last_error_message());
    tg_scope_end();
    double *g = calloc(3 * (size_t)n, sizeof *g);
    for (int i = 0; i < 3; i++) {
        tg_tensor *gi = tg_grad(leaf[i]);
        if (!gi) continue; /* no path from the loss: zeros either way */
        tg_scope_begin();
        tg_tensor *g64 = tg_cast(gi, TG_F64);
        cr_assert_eq(tg_tensor_copy_out(g64, g + (size_t)i * (size_t)n,
                                        (size_t)n * sizeof *g),
                     TG_OK);
        tg_scope_end();
    }
    for (int i = 0; i < 3; i++) tg_tensor_release(leaf[i]);
    tg_tensor_release(c);
    tg_tensor_release(s);
    tg_tape_free(tape);
    return g;
}

/* 40 graphs, f32 and f64 alternately, over 40000 elements (two 64 KiB
 * blocks and a partial third in f32, four and a partial fifth in f64):
 * the blocked sweep's gradients are the plain sweep's, bit for bit, under
 * NONE and BALANCED. */
Test(region, random_pointwise_graphs_give_the_plain_sweeps_gradients_bitwise)
{
    const int64_t n = 40000;
    const tg_checkpoint_policy pol[2] = {TG_CHECKPOINT_NONE, TG_CHECKPOINT_BALANCED};
    for (uint64_t seed = 0; seed < 40; seed++) {
        tg_dtype dt = seed % 2 ? TG_F64 : TG_F32;
        for (int p = 0; p < 2; p++) {
            double *plain = random_graph_grads(seed, dt, n, pol[p], true);
            double *blocked = random_graph_grads(seed, dt, n, pol[p], false);
            size_t bad = 0;
            while (bad < 3 * (size_t)n && memcmp(&plain[bad], &blocked[bad], sizeof(double)) == 0)
                bad++;
            cr_expect_eq(bad, 3 * (size_t)n,
                         "seed %llu (%s, policy %d): leaf %zu element %zu: %.17g (blocked) "
                         "vs %.17g (plain)",
                         (unsigned long long)seed, dt == TG_F64 ? "f64" : "f32", (int)pol[p],
                         bad / (size_t)n, bad % (size_t)n, bad < 3 * (size_t)n ? blocked[bad] : 0,
                         bad < 3 * (size_t)n ? plain[bad] : 0);
            free(plain);
            free(blocked);
        }
    }
}
