/* Replay (src/tape/replay.c): a forward recorded once on a tape made with
 * opts.replay runs again on new input values through tg_tape_replay. The
 * loss and the gradients after each replay must be bitwise those of
 * recording the same forward again on those values, under every
 * checkpoint policy and in segments; the program must follow views,
 * comparisons of the inputs (ops the tape does not record) and pointwise
 * regions; and every misuse gets its own status with the tape left
 * usable. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <tapegrad.h>

#include "test_util.h"

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define NBATCH 3

TestSuite(replay, .init = tu_scope_setup, .fini = tu_scope_teardown);

typedef struct model {
    tg_tensor *p[4]; /* w1 (16, 8), b1 (16), w2 (4, 16), b2 (4) */
    tg_tape *tape;   /* for segments */
    int variant;     /* 0 plain, 1 one segment, 2 tg_checkpoint_sequential */
} model;

static tg_tensor *layer(void *ud, int k, tg_tensor *h)
{
    model *m = ud;
    tg_tensor *z = tg_affine(h, m->p[2 * k], m->p[2 * k + 1]);
    return k == 0 ? tg_tanh(z) : z;
}

/* Loss of the model on (x, y): cross-entropy of a 8-16-4 tanh MLP; the
 * hidden layer's rows are masked by x[:, 0] > 0 (a comparison, not
 * recorded) and the input goes through a view (a transpose twice). */
static tg_tensor *model_loss(model *m, tg_tensor *x, tg_tensor *y)
{
    tg_tensor *xv = tg_transpose(tg_transpose(x, 0, 1), 0, 1);
    tg_tensor *h;
    if (m->variant == 2) {
        h = tg_checkpoint_sequential(m->tape, 2, 2, layer, m, xv);
    } else {
        if (m->variant == 1) tg_checkpoint_begin(m->tape);
        h = layer(m, 0, xv);
        if (m->variant == 1) tg_checkpoint_end(m->tape);
        tg_tensor *zero = tg_zeros(tg_tensor_dtype(x), 2, SHAPE(1, 1));
        tg_tensor *mask = tg_gt(tg_narrow(xv, 1, 0, 1), zero);
        h = layer(m, 1, tg_add(tg_mul(h, mask), tg_mul_scalar(h, 0.5)));
    }
    return tg_cross_entropy(h, y);
}

static void model_init(model *m, tg_dtype dt, int variant)
{
    tg_rng r;
    tg_rng_seed(&r, 11);
    const int64_t s[4][2] = {{16, 8}, {16, 0}, {4, 16}, {4, 0}};
    for (int i = 0; i < 4; i++)
        m->p[i] = tg_tensor_retain(tg_rand_normal(&r, dt, s[i][1] ? 2 : 1, s[i], 0, 0.5));
    m->variant = variant;
}

static void model_free(model *m)
{
    tu_release_all(m->p, 4);
}

typedef struct batches {
    tg_tensor *x[NBATCH], *y[NBATCH];
} batches;

static void batches_init(batches *b, tg_dtype dt, int64_t rows)
{
    tg_rng r;
    tg_rng_seed(&r, 5);
    for (int k = 0; k < NBATCH; k++) {
        b->x[k] = tg_tensor_retain(tg_rand_normal(&r, dt, 2, SHAPE(rows, 8), 0, 1));
        b->y[k] = tg_tensor_retain(
            tg_cast(tg_rand_uniform(&r, TG_F64, 1, SHAPE(rows), 0, 3.999), TG_I64));
    }
}

static void batches_free(batches *b)
{
    tu_release_all(b->x, NBATCH);
    tu_release_all(b->y, NBATCH);
}

/* Element 0 of an f64 tensor. */
static double first(const tg_tensor *t)
{
    return ((const double *)tg_tensor_data_ro(t))[0];
}

static bool same_bits(const tg_tensor *a, const tg_tensor *b)
{
    size_t n = (size_t)tg_tensor_numel(a) * (tg_tensor_dtype(a) == TG_F32 ? 4 : 8);
    return tg_tensor_numel(a) == tg_tensor_numel(b) &&
           memcmp(tg_tensor_data_ro(a), tg_tensor_data_ro(b), n) == 0;
}

/* Records batch k on a fresh tape per batch (the reference) and replays
 * it on one replay tape; compares loss and gradients bit for bit. */
static void check_replay(tg_dtype dt, tg_tape_opts opts, int variant)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_scope_begin();
    model m;
    model_init(&m, dt, variant);
    batches b;
    batches_init(&b, dt, 6);
    tg_tensor *ref_loss[NBATCH], *ref_grad[NBATCH][4];
    for (int k = 0; k < NBATCH; k++) {
        m.tape = tg_tape_new(&opts);
        for (int i = 0; i < 4; i++) cr_assert_eq(tg_requires_grad(m.tape, m.p[i]), TG_OK);
        tg_scope_begin();
        tg_tensor *loss = model_loss(&m, b.x[k], b.y[k]);
        cr_assert_not_null(loss, "%s", tg_last_error_message());
        ref_loss[k] = tg_tensor_retain(tg_detach(loss));
        cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
        tg_scope_end();
        for (int i = 0; i < 4; i++) {
            ref_grad[k][i] = tg_tensor_retain(tg_detach(tg_grad(m.p[i])));
            tg_grad_zero(m.p[i]);
        }
        tg_tape_free(m.tape);
    }

    opts.replay = true;
    m.tape = tg_tape_new(&opts);
    for (int i = 0; i < 4; i++) cr_assert_eq(tg_requires_grad(m.tape, m.p[i]), TG_OK);
    tg_tensor *x = tg_tensor_retain(tg_zeros(dt, 2, SHAPE(6, 8)));
    tg_tensor *y = tg_tensor_retain(tg_zeros(TG_I64, 1, SHAPE(6)));
    cr_assert_eq(tg_tape_input(m.tape, x), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_tape_input(m.tape, y), TG_OK, "%s", tg_last_error_message());
    cr_assert_not(tg_tensor_requires_grad(x));
    tg_scope_begin();
    tg_tensor *loss = tg_tensor_retain(model_loss(&m, x, y)); /* recorded on zeros */
    cr_assert_not_null(loss, "%s", tg_last_error_message());
    tg_scope_end();
    cr_assert_gt(tg_tape_replay_steps(m.tape), tg_tape_node_count(m.tape),
                 "the program also holds the comparison, which the tape does not record");
    tg_tensor *in[2] = {x, y};
    for (int k = 0; k < NBATCH; k++) {
        tg_tensor *val[2] = {b.x[k], b.y[k]};
        cr_assert_eq(tg_tape_replay(m.tape, 2, in, val), TG_OK, "%s", tg_last_error_message());
        cr_assert(same_bits(loss, ref_loss[k]), "batch %d: loss %.17g, recorded %.17g", k,
                  tu_item(loss), tu_item(ref_loss[k]));
        cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
        for (int i = 0; i < 4; i++) {
            cr_assert(same_bits(tg_grad(m.p[i]), ref_grad[k][i]), "batch %d: gradient %d differs",
                      k, i);
            tg_grad_zero(m.p[i]);
        }
        cr_assert_null(tg_grad(x));
    }
    tg_tensor_release(loss);
    tg_tensor_release(x);
    tg_tensor_release(y);
    tg_tape_free(m.tape);
    for (int k = 0; k < NBATCH; k++) {
        tg_tensor_release(ref_loss[k]);
        tu_release_all(ref_grad[k], 4);
    }
    batches_free(&b);
    model_free(&m);
    tg_scope_end();
    tu_expect_no_leaks(mem0);
}

Test(replay, bitwise_equal_to_recording_none)
{
    check_replay(TG_F64, (tg_tape_opts){.policy = TG_CHECKPOINT_NONE}, 0);
    check_replay(TG_F32, (tg_tape_opts){.policy = TG_CHECKPOINT_NONE}, 0);
}

Test(replay, bitwise_equal_to_recording_balanced)
{
    check_replay(TG_F64, (tg_tape_opts){.policy = TG_CHECKPOINT_BALANCED}, 0);
}

Test(replay, bitwise_equal_to_recording_budget)
{
    /* A budget below what NONE keeps: some nodes recompute. */
    check_replay(TG_F64, (tg_tape_opts){.policy = TG_CHECKPOINT_BUDGET, .budget_bytes = 900}, 0);
}

Test(replay, bitwise_equal_to_recording_segments)
{
    check_replay(TG_F64, (tg_tape_opts){0}, 1);
    check_replay(TG_F64, (tg_tape_opts){0}, 2);
    check_replay(TG_F32, (tg_tape_opts){.policy = TG_CHECKPOINT_BALANCED}, 2);
}

Test(replay, anomaly_mode)
{
    check_replay(TG_F64, (tg_tape_opts){.anomaly = true}, 0);
}

/* A pointwise chain over 300k floats: backward runs it in blocks
 * (region.c) both ways. */
Test(replay, pointwise_region)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_scope_begin();
    tg_rng r;
    tg_rng_seed(&r, 3);
    tg_tensor *w = tg_rand_normal(&r, TG_F32, 1, SHAPE(300000), 0, 1);
    tg_tensor *vals[2] = {tg_rand_normal(&r, TG_F32, 1, SHAPE(300000), 0, 1),
                          tg_rand_normal(&r, TG_F32, 1, SHAPE(300000), 0, 1)};
    tg_tensor *ref[2];
    for (int k = 0; k < 2; k++) {
        tg_tape *t = tg_tape_new(NULL);
        cr_assert_eq(tg_requires_grad(t, w), TG_OK);
        tg_scope_begin();
        tg_tensor *v = vals[k];
        cr_assert_eq(tg_backward(tg_sum(tg_mul(tg_tanh(tg_add_scalar(tg_mul(v, w), 1.0)),
                                               tg_sigmoid(w)))), TG_OK);
        tg_scope_end();
        ref[k] = tg_tensor_retain(tg_detach(tg_grad(w)));
        tg_grad_zero(w);
        tg_tape_free(t);
    }
    /* Unfused, the calls' backward runs as a pointwise region; fused, as
     * one fused call (runs_of_pointwise_calls_fuse_bitwise below). */
    for (int unfused = 0; unfused < 2; unfused++) {
        tg_tape *t = tg_tape_new(&(tg_tape_opts){.replay = true, .replay_unfused = unfused});
        tg_tensor *x = tg_zeros(TG_F32, 1, SHAPE(300000));
        cr_assert_eq(tg_requires_grad(t, w), TG_OK);
        cr_assert_eq(tg_tape_input(t, x), TG_OK);
        tg_scope_begin();
        tg_tensor *loss = tg_tensor_retain(
            tg_sum(tg_mul(tg_tanh(tg_add_scalar(tg_mul(x, w), 1.0)), tg_sigmoid(w))));
        tg_scope_end();
        for (int k = 0; k < 2; k++) {
            /* Values written in place count too (values NULL). */
            memcpy(tg_tensor_data(x), tg_tensor_data_ro(vals[k]), 300000 * sizeof(float));
            cr_assert_eq(tg_tape_replay(t, 1, &x, NULL), TG_OK, "%s", tg_last_error_message());
            /* fused: six calls; or five, once the sum came out of the run
             * (these values need not sum exactly block by block) */
            int64_t fused = tg_tape_replay_fused_steps(t);
            cr_assert(unfused ? fused == 0 : k == 0 ? fused == 6 : fused == 6 || fused == 5,
                      "pass %d: %lld fused", k, (long long)fused);
            cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
            cr_assert(same_bits(tg_grad(w), ref[k]), "pass %d: gradient differs", k);
            tg_grad_zero(w);
        }
        tg_tensor_release(loss);
        tg_tape_free(t);
    }
    tu_release_all(ref, 2);
    tg_scope_end();
    tu_expect_no_leaks(mem0);
}

/* The tape forgets the program on tg_tape_reset; a new record makes a new
 * one (here with another batch size). */
Test(replay, reset_drops_the_program)
{
    tg_tape *t = tg_tape_new(&(tg_tape_opts){.replay = true});
    tg_tensor *w = tg_ones(TG_F64, 1, SHAPE(3));
    tg_tensor *x = tg_ones(TG_F64, 1, SHAPE(3));
    cr_assert_eq(tg_requires_grad(t, w), TG_OK);
    cr_assert_eq(tg_tape_input(t, x), TG_OK);
    cr_assert_not_null(tg_sum(tg_mul(x, w)));
    cr_assert_eq(tg_tape_replay_steps(t), 2);
    tg_tape_reset(t);
    cr_assert_eq(tg_tape_replay_steps(t), 0);
    cr_assert_eq(tg_tape_replay(t, 1, &x, NULL), TG_ERR_INVALID);
    tu_expect_message_has("nothing recorded");
    tg_tensor *x2 = tg_full(TG_F64, 1, SHAPE(5), 2.0);
    tg_tensor *w2 = tg_ones(TG_F64, 1, SHAPE(5));
    cr_assert_eq(tg_requires_grad(t, w2), TG_OK);
    cr_assert_eq(tg_tape_input(t, x2), TG_OK);
    tg_tensor *loss = tg_sum(tg_mul(x2, w2));
    cr_assert_eq(tg_tape_replay(t, 1, &x2, NULL), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_backward(loss), TG_OK);
    cr_assert_float_eq(first(tg_grad(w2)), 2.0, 0.0);
    tg_tape_free(t);
}

Test(replay, misuse)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_scope_begin();
    tg_tape *plain = tg_tape_new(NULL);
    tg_tape *t = tg_tape_new(&(tg_tape_opts){.replay = true});
    tg_tape *other = tg_tape_new(&(tg_tape_opts){.replay = true});
    tg_tensor *w = tg_full(TG_F64, 2, SHAPE(2, 3), 0.5);
    tg_tensor *x = tg_ones(TG_F64, 2, SHAPE(2, 3));

    cr_assert_eq(tg_tape_input(NULL, x), TG_ERR_NULL);
    cr_assert_eq(tg_tape_input(t, NULL), TG_ERR_NULL);
    cr_assert_eq(tg_tape_input(plain, x), TG_ERR_INVALID);
    tu_expect_message_has("opts.replay");
    cr_assert_eq(tg_tape_input(t, tg_transpose(x, 0, 1)), TG_ERR_INVALID);
    tu_expect_message_has("strided");
    cr_assert_eq(tg_requires_grad(t, w), TG_OK);
    cr_assert_eq(tg_tape_input(t, w), TG_ERR_INVALID);
    tu_expect_message_has("requires grad");
    cr_assert_eq(tg_tape_input(other, w), TG_ERR_TAPE);
    cr_assert_eq(tg_tape_input(t, x), TG_OK);
    cr_assert_eq(tg_tape_input(t, x), TG_OK, "marking twice is fine");

    cr_assert_eq(tg_tape_replay(NULL, 0, NULL, NULL), TG_ERR_NULL);
    cr_assert_eq(tg_tape_replay(plain, 0, NULL, NULL), TG_ERR_INVALID);
    cr_assert_eq(tg_tape_replay(t, 0, NULL, NULL), TG_ERR_INVALID);
    tu_expect_message_has("nothing recorded");

    tg_tensor *loss = tg_sum(tg_mul(tg_exp(x), w));
    cr_assert_not_null(loss, "%s", tg_last_error_message());
    cr_assert_eq(tg_tape_replay(t, -1, NULL, NULL), TG_ERR_INVALID);
    cr_assert_eq(tg_tape_replay(t, 1, NULL, NULL), TG_ERR_INVALID);
    tg_tensor *in[1] = {w};
    cr_assert_eq(tg_tape_replay(t, 1, in, NULL), TG_ERR_INVALID);
    tu_expect_message_has("tg_tape_input");
    in[0] = NULL;
    cr_assert_eq(tg_tape_replay(t, 1, in, NULL), TG_ERR_NULL);
    in[0] = x;
    tg_tensor *val[1] = {NULL};
    cr_assert_eq(tg_tape_replay(t, 1, in, val), TG_ERR_NULL);
    val[0] = tg_ones(TG_F64, 2, SHAPE(3, 2));
    cr_assert_eq(tg_tape_replay(t, 1, in, val), TG_ERR_SHAPE);
    tu_expect_message_has("new shape needs a new record");
    val[0] = tg_ones(TG_F32, 2, SHAPE(2, 3));
    cr_assert_eq(tg_tape_replay(t, 1, in, val), TG_ERR_DTYPE);

    /* None of that touched the record: backward still works. */
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    double g1 = first(tg_grad(w));
    cr_assert_float_eq(g1, exp(1.0), 1e-15);
    tg_grad_zero(w);

    /* A strided value is gathered; the replayed gradient follows it. */
    val[0] = tg_transpose(tg_full(TG_F64, 2, SHAPE(3, 2), 2.0), 0, 1);
    cr_assert_eq(tg_tape_replay(t, 1, in, val), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    cr_assert_float_eq(first(tg_grad(w)), exp(2.0), 1e-14);
    tg_grad_zero(w);

    /* A failing replay (anomaly mode: a non-finite value) drops the record;
     * the next replay works. */
    cr_assert_eq(tg_tape_set_anomaly(t, true), TG_OK);
    val[0] = tg_full(TG_F64, 2, SHAPE(2, 3), 1000.0);
    cr_assert_eq(tg_tape_replay(t, 1, in, val), TG_ERR_NONFINITE);
    cr_assert_eq(tg_tape_node_count(t), 0);
    cr_assert_eq(tg_backward(loss), TG_ERR_STALE);
    val[0] = tg_full(TG_F64, 2, SHAPE(2, 3), 0.0);
    cr_assert_eq(tg_tape_replay(t, 1, in, val), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    cr_assert_float_eq(first(tg_grad(w)), 1.0, 0.0);

    tg_tape_free(t);
    tg_tape_free(other);
    tg_tape_free(plain);
    tg_scope_end();
    tg_error_clear();
    tu_expect_no_leaks(mem0);
}

/* A create_graph backward records its own ops, which are not part of the
 * forward: the program must not grow, not even by the comparisons such a
 * backward makes (softplus's backward masks with tg_gt), and a replay
 * after it must still work. (Ops the user then records on the tracked
 * gradient do join the program: they are the user's forward.) */
Test(replay, create_graph_backward_leaves_the_program_alone)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_scope_begin();
    tg_tape *t = tg_tape_new(&(tg_tape_opts){.replay = true});
    tg_tensor *w = tg_full(TG_F64, 1, SHAPE(4), 0.5);
    tg_tensor *x = tg_full(TG_F64, 1, SHAPE(4), 1.0);
    cr_assert_eq(tg_requires_grad(t, w), TG_OK);
    cr_assert_eq(tg_tape_input(t, x), TG_OK);
    tg_tensor *loss = tg_sum(tg_softplus(tg_mul(x, w), 1.0, 20.0));
    cr_assert_not_null(loss, "%s", tg_last_error_message());
    int64_t steps = tg_tape_replay_steps(t);
    tg_tensor *g = NULL;
    cr_assert_eq(tg_grad_of(1, &loss, NULL, 1, &w, &g, &(tg_grad_opts){.create_graph = true}),
                 TG_OK, "%s", tg_last_error_message());
    cr_assert(tg_tensor_requires_grad(g));
    cr_assert_eq(tg_tape_replay_steps(t), steps);
    cr_assert_eq(tg_tape_replay(t, 1, &x, NULL), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_tape_replay_steps(t), steps);
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    double s = 1.0 / (1.0 + exp(-0.5)); /* d softplus(x w) / dw = x sigmoid(x w) */
    cr_assert_float_eq(first(tg_grad(w)), s, 1e-15);
    tg_tape_free(t);
    tg_scope_end();
    tu_expect_no_leaks(mem0);
}

/* A copy of t's values (a new reference), untracked. */
static tg_tensor *copy_of(const tg_tensor *t)
{
    return tg_tensor_retain(tg_tensor_from_data(tg_tensor_dtype(t), tg_tensor_ndim(t),
                                                tg_tensor_shape(t), tg_tensor_data_ro(t)));
}

/* Loss and gradients of recording the model afresh on copies of m's
 * parameters (the reference for one replayed step). */
static void record_afresh(const model *m, tg_tensor *x, tg_tensor *y, tg_tensor **loss_out,
                          tg_tensor *grad[4])
{
    model c = {.variant = 0};
    for (int i = 0; i < 4; i++) c.p[i] = copy_of(m->p[i]);
    c.tape = tg_tape_new(NULL);
    for (int i = 0; i < 4; i++) cr_assert_eq(tg_requires_grad(c.tape, c.p[i]), TG_OK);
    tg_scope_begin();
    tg_tensor *loss = model_loss(&c, x, y);
    cr_assert_not_null(loss, "%s", tg_last_error_message());
    *loss_out = tg_tensor_retain(tg_detach(loss));
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    tg_scope_end();
    for (int i = 0; i < 4; i++) grad[i] = tg_tensor_retain(tg_detach(tg_grad(c.p[i])));
    tg_tape_free(c.tape);
    model_free(&c);
}

/* Under NONE, from the second replay on, the replay keeps the record the
 * last one made and gives its nodes back their saves instead of recording
 * them again. It must stay bitwise a new record across what a training
 * loop does between replays: parameters written in place (an optimizer
 * step), a backward that retains the record, a create_graph backward that
 * appends nodes; saved bytes as a new record's; and a saved value written
 * after the replay is still caught by backward. */
Test(replay, a_kept_record_stays_bitwise_a_new_one)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_scope_begin();
    model m;
    model_init(&m, TG_F64, 0);
    batches b;
    batches_init(&b, TG_F64, 6);
    m.tape = tg_tape_new(&(tg_tape_opts){.replay = true});
    for (int i = 0; i < 4; i++) cr_assert_eq(tg_requires_grad(m.tape, m.p[i]), TG_OK);
    tg_tensor *x = tg_tensor_retain(tg_zeros(TG_F64, 2, SHAPE(6, 8)));
    tg_tensor *y = tg_tensor_retain(tg_zeros(TG_I64, 1, SHAPE(6)));
    cr_assert_eq(tg_tape_input(m.tape, x), TG_OK);
    cr_assert_eq(tg_tape_input(m.tape, y), TG_OK);
    tg_scope_begin();
    tg_tensor *loss = tg_tensor_retain(model_loss(&m, x, y));
    tg_scope_end();
    cr_assert_not_null(loss, "%s", tg_last_error_message());
    int64_t nodes = tg_tape_node_count(m.tape);
    size_t replay_saved = 0;
    tg_tensor *in[2] = {x, y};
    for (int step = 0; step < 8; step++) {
        int k = step % NBATCH;
        tg_tensor *val[2] = {b.x[k], b.y[k]}, *ref_loss, *ref_grad[4];
        record_afresh(&m, b.x[k], b.y[k], &ref_loss, ref_grad);
        cr_assert_eq(tg_tape_replay(m.tape, 2, in, val), TG_OK, "%s", tg_last_error_message());
        cr_assert_eq(tg_tape_node_count(m.tape), nodes, "step %d", step);
        /* The first replay records again: what it saves, every later
         * one must (a record on fresh data tensors counts them too: not
         * comparable). */
        if (step == 0) replay_saved = tg_tape_saved_bytes(m.tape);
        cr_assert_eq(tg_tape_saved_bytes(m.tape), replay_saved, "step %d: saved %zu, first %zu",
                     step, tg_tape_saved_bytes(m.tape), replay_saved);
        cr_assert_gt(replay_saved, 0);
        cr_assert(same_bits(loss, ref_loss), "step %d: loss differs", step);
        bool retain = step % 3 == 1, create = step == 5;
        if (create) {
            /* Appends the backward's nodes: the next replay records again. */
            tg_tensor *g[4];
            cr_assert_eq(tg_grad_of(1, &loss, NULL, 4, m.p, g,
                                    &(tg_grad_opts){.create_graph = true}), TG_OK, "%s",
                         tg_last_error_message());
            cr_assert_gt(tg_tape_node_count(m.tape), nodes);
            /* create_graph differentiates through recorded ops, not the
             * fused first-order kernels: the same values to rounding. */
            for (int i = 0; i < 4; i++) {
                double *want = tu_values(ref_grad[i]);
                tu_expect_values(g[i], want, tg_tensor_numel(g[i]), 1e-13);
                free(want);
            }
        } else {
            cr_assert_eq(tg_backward_ex(loss, NULL, &(tg_grad_opts){.retain = retain}), TG_OK,
                         "%s", tg_last_error_message());
            for (int i = 0; i < 4; i++)
                cr_assert(same_bits(tg_grad(m.p[i]), ref_grad[i]), "step %d: gradient %d differs",
                          step, i);
        }
        /* The optimizer's step: every parameter written in place. */
        for (int i = 0; i < 4; i++) {
            double *p = tg_tensor_data(m.p[i]);
            cr_assert_not_null(p);
            for (int64_t j = 0; j < tg_tensor_numel(m.p[i]); j++) p[j] *= 0.9375;
            tg_grad_zero(m.p[i]);
        }
        tg_tensor_release(ref_loss);
        tu_release_all(ref_grad, 4);
    }
    /* A value the record saved, written between replay and backward. */
    cr_assert_eq(tg_tape_replay(m.tape, 2, in, NULL), TG_OK, "%s", tg_last_error_message());
    double *w = tg_tensor_data(m.p[2]);
    w[0] += 1.0;
    cr_assert_eq(tg_backward(loss), TG_ERR_MODIFIED);
    tg_error_clear();
    cr_assert_eq(tg_tape_replay(m.tape, 2, in, NULL), TG_OK, "%s", tg_last_error_message());
    /* A write elsewhere makes backward check every version: the kept
     * record's must be those of the values the replay read. */
    tg_tensor *other = tg_zeros(TG_F64, 1, SHAPE(2));
    ((double *)tg_tensor_data(other))[0] = 1.0;
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    tg_tensor_release(loss);
    tg_tensor_release(x);
    tg_tensor_release(y);
    tg_tape_free(m.tape);
    batches_free(&b);
    model_free(&m);
    tg_scope_end();
    tu_expect_no_leaks(mem0);
}

/* Binomial checkpointing (tg_checkpoint_sequential with nsegments -s:
 * nested segments, re-run level by level) replays too: 12 stages of
 * tanh(affine), 3 and 2 slots, under NONE and BALANCED, replayed on
 * alternating batches, each backward bitwise the gradients of recording
 * the plain forward anew on that batch. */
enum { BN_L = 12, BN_W = 16, BN_B = 8 };

static tg_tensor *bn_stage(void *ud, int l, tg_tensor *h)
{
    tg_tensor **p = ud;
    return tg_tanh(tg_affine(h, p[2 * l], p[2 * l + 1]));
}

static double *bn_grads(tg_tensor **p)
{
    enum { N = BN_L * (BN_W * BN_W + BN_W) };
    double *g = malloc(N * sizeof *g), *at = g;
    for (int i = 0; i < 2 * BN_L; i++) {
        int64_t n = tg_tensor_numel(p[i]);
        cr_assert_eq(tg_tensor_copy_out(tg_grad(p[i]), at, (size_t)n * sizeof *at), TG_OK);
        at += n;
        tg_grad_zero(p[i]);
    }
    return g;
}

Test(replay, binomial_checkpointing_replays_bitwise)
{
    enum { N = BN_L * (BN_W * BN_W + BN_W) };
    tg_rng r;
    tg_rng_seed(&r, 13);
    tg_tensor *p[2 * BN_L], *x[2];
    for (int l = 0; l < BN_L; l++) {
        p[2 * l] = tg_rand_normal(&r, TG_F64, 2, SHAPE(BN_W, BN_W), 0, 0.4);
        p[2 * l + 1] = tg_rand_normal(&r, TG_F64, 1, SHAPE(BN_W), 0, 0.1);
    }
    for (int k = 0; k < 2; k++) x[k] = tg_rand_normal(&r, TG_F64, 2, SHAPE(BN_B, BN_W), 0, 1);
    double *want[2];
    for (int k = 0; k < 2; k++) {
        tg_tape *t = tg_tape_new(NULL);
        for (int i = 0; i < 2 * BN_L; i++) cr_assert_eq(tg_requires_grad(t, p[i]), TG_OK);
        cr_assert_eq(tg_backward(tg_sum(tg_checkpoint_sequential(t, BN_L, 1, bn_stage, p, x[k]))),
                     TG_OK);
        want[k] = bn_grads(p);
        tg_tape_free(t);
    }
    for (int v = 0; v < 4; v++) {
        tg_tape_opts o = {.replay = true,
                          .policy = v & 1 ? TG_CHECKPOINT_BALANCED : TG_CHECKPOINT_NONE};
        int slots = v < 2 ? 3 : 2;
        tg_tape *t = tg_tape_new(&o);
        tg_tensor *in = tg_mul_scalar(x[0], 1.0); /* its own storage: replay writes into it */
        cr_assert_eq(tg_tape_input(t, in), TG_OK);
        for (int i = 0; i < 2 * BN_L; i++) cr_assert_eq(tg_requires_grad(t, p[i]), TG_OK);
        tg_tensor *loss = tg_sum(tg_checkpoint_sequential(t, BN_L, -slots, bn_stage, p, in));
        cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
        cr_assert_gt(tg_tape_recompute_count(t), 0);
        double *g = bn_grads(p);
        cr_expect_eq(memcmp(g, want[0], N * sizeof *g), 0, "variant %d: recorded", v);
        free(g);
        for (int k = 1; k <= 3; k++) {
            cr_assert_eq(tg_tape_replay(t, 1, &in, &x[k % 2]), TG_OK, "%s",
                         tg_last_error_message());
            cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
            g = bn_grads(p);
            cr_expect_eq(memcmp(g, want[k % 2], N * sizeof *g), 0, "variant %d, replay %d", v, k);
            free(g);
        }
        tg_tape_free(t);
    }
    for (int k = 0; k < 2; k++) free(want[k]);
}

/* A conv2d_relu model (conv2d_relu, flatten, affine, cross-entropy)
 * replays bitwise equal to recording afresh, under NONE (from the second
 * replay on, the kept record gets its saves back: conv2d_relu keeps its
 * output) and BALANCED. */
static tg_tensor *cnn_loss(tg_tensor *const *p, tg_tensor *x, tg_tensor *y)
{
    tg_tensor *h = tg_conv2d_relu(x, p[0], p[1], &(tg_conv2d_opts){.padding = {1, 1}});
    h = tg_reshape(h, 2, SHAPE(tg_tensor_shape(x)[0], 4 * 6 * 6));
    return tg_cross_entropy(tg_affine(h, p[2], p[3]), y);
}

static void check_conv_relu_replay(tg_checkpoint_policy policy)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_scope_begin();
    tg_rng r;
    tg_rng_seed(&r, 23);
    const int64_t s[4][4] = {{4, 1, 3, 3}, {4}, {3, 144}, {3}};
    const int nd[4] = {4, 1, 2, 1};
    tg_tensor *p[4], *x[NBATCH], *y[NBATCH];
    for (int i = 0; i < 4; i++)
        p[i] = tg_tensor_retain(tg_rand_normal(&r, TG_F64, nd[i], s[i], 0, 0.5));
    for (int k = 0; k < NBATCH; k++) {
        x[k] = tg_tensor_retain(tg_rand_normal(&r, TG_F64, 4, SHAPE(5, 1, 6, 6), 0, 1));
        y[k] = tg_tensor_retain(
            tg_cast(tg_rand_uniform(&r, TG_F64, 1, SHAPE(5), 0, 2.999), TG_I64));
    }
    tg_tape_opts opts = {.policy = policy};
    tg_tensor *ref[NBATCH][4];
    for (int k = 0; k < NBATCH; k++) {
        tg_tape *t = tg_tape_new(&opts);
        for (int i = 0; i < 4; i++) cr_assert_eq(tg_requires_grad(t, p[i]), TG_OK);
        tg_scope_begin();
        cr_assert_eq(tg_backward(cnn_loss(p, x[k], y[k])), TG_OK, "%s", tg_last_error_message());
        tg_scope_end();
        for (int i = 0; i < 4; i++) {
            ref[k][i] = tg_tensor_retain(tg_detach(tg_grad(p[i])));
            tg_grad_zero(p[i]);
        }
        tg_tape_free(t);
    }
    opts.replay = true;
    tg_tape *t = tg_tape_new(&opts);
    for (int i = 0; i < 4; i++) cr_assert_eq(tg_requires_grad(t, p[i]), TG_OK);
    tg_tensor *xi = tg_tensor_retain(tg_zeros(TG_F64, 4, SHAPE(5, 1, 6, 6)));
    tg_tensor *yi = tg_tensor_retain(tg_zeros(TG_I64, 1, SHAPE(5)));
    cr_assert_eq(tg_tape_input(t, xi), TG_OK);
    cr_assert_eq(tg_tape_input(t, yi), TG_OK);
    tg_scope_begin();
    tg_tensor *loss = tg_tensor_retain(cnn_loss(p, xi, yi));
    tg_scope_end();
    cr_assert_not_null(loss, "%s", tg_last_error_message());
    tg_tensor *in[2] = {xi, yi};
    for (int rep = 0; rep < 2; rep++)
        for (int k = 0; k < NBATCH; k++) {
            tg_tensor *val[2] = {x[k], y[k]};
            cr_assert_eq(tg_tape_replay(t, 2, in, val), TG_OK, "%s", tg_last_error_message());
            cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
            for (int i = 0; i < 4; i++) {
                cr_expect(same_bits(tg_grad(p[i]), ref[k][i]), "pass %d, batch %d: gradient %d",
                          rep, k, i);
                tg_grad_zero(p[i]);
            }
        }
    tg_tensor_release(loss);
    tg_tensor_release(xi);
    tg_tensor_release(yi);
    tg_tape_free(t);
    for (int k = 0; k < NBATCH; k++) {
        tu_release_all(ref[k], 4);
        tg_tensor_release(x[k]);
        tg_tensor_release(y[k]);
    }
    tu_release_all(p, 4);
    tg_scope_end();
    tu_expect_no_leaks(mem0);
}

Test(replay, conv2d_relu_replays_bitwise_none)
{
    check_conv_relu_replay(TG_CHECKPOINT_NONE);
}

Test(replay, conv2d_relu_replays_bitwise_balanced)
{
    check_conv_relu_replay(TG_CHECKPOINT_BALANCED);
}

/* The lstm op (one node with an extra saved tensor, its gate rows, or
 * none with remake_gates) replays bitwise: loss and the gradients of s0, w
 * and b on new inputs, against a fresh recording of each, with and without
 * a recomputing policy. */
static tg_lstm_opts seq_opts;

static tg_tensor *seq_loss(tg_tensor *x, tg_tensor *const *p, tg_tensor *wy)
{
    return tg_sum(tg_mul(tg_lstm(x, p[0], p[1], p[2], &seq_opts), wy));
}

static void check_lstm_replay(tg_checkpoint_policy policy, bool remake)
{
    seq_opts.remake_gates = remake;
    size_t mem0 = tg_mem_current_bytes();
    tg_scope_begin();
    tg_rng r;
    tg_rng_seed(&r, 4);
    /* T 5, B 3, I 2, H 4 */
    tg_tensor *p[3] = {tg_rand_uniform(&r, TG_F64, 3, SHAPE(2, 3, 4), -1, 1),
                       tg_rand_uniform(&r, TG_F64, 2, SHAPE(16, 6), -0.7, 0.7),
                       tg_rand_uniform(&r, TG_F64, 1, SHAPE(16), -0.5, 0.5)};
    tg_tensor *wy = tg_rand_uniform(&r, TG_F64, 4, SHAPE(2, 5, 3, 4), -1, 1);
    tg_tensor *xs[NBATCH];
    for (int k = 0; k < NBATCH; k++) xs[k] = tg_rand_uniform(&r, TG_F64, 3, SHAPE(5, 3, 2), -2, 2);
    tg_tape_opts opts = {.policy = policy};
    tg_tensor *ref[NBATCH][4];
    for (int k = 0; k < NBATCH; k++) {
        tg_tape *tape = tg_tape_new(&opts);
        for (int i = 0; i < 3; i++) cr_assert_eq(tg_requires_grad(tape, p[i]), TG_OK);
        tg_tensor *loss = seq_loss(xs[k], p, wy);
        cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
        ref[k][0] = tg_detach(loss);
        for (int i = 0; i < 3; i++) {
            ref[k][i + 1] = tg_detach(tg_grad(p[i]));
            tg_grad_zero(p[i]);
        }
        tg_tape_free(tape);
    }
    opts.replay = true;
    tg_tape *tape = tg_tape_new(&opts);
    for (int i = 0; i < 3; i++) cr_assert_eq(tg_requires_grad(tape, p[i]), TG_OK);
    tg_tensor *x = tg_zeros(TG_F64, 3, SHAPE(5, 3, 2));
    cr_assert_eq(tg_tape_input(tape, x), TG_OK, "%s", tg_last_error_message());
    tg_tensor *loss = seq_loss(x, p, wy);
    cr_assert_not_null(loss, "%s", tg_last_error_message());
    for (int k = 0; k < NBATCH; k++) {
        cr_assert_eq(tg_tape_replay(tape, 1, &x, &xs[k]), TG_OK, "%s", tg_last_error_message());
        cr_assert(same_bits(loss, ref[k][0]), "batch %d: loss %.17g, recorded %.17g", k,
                  tu_item(loss), tu_item(ref[k][0]));
        cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
        for (int i = 0; i < 3; i++) {
            cr_assert(same_bits(tg_grad(p[i]), ref[k][i + 1]), "batch %d: gradient %d differs",
                      k, i);
            tg_grad_zero(p[i]);
        }
    }
    tg_tape_free(tape);
    tg_scope_end();
    tu_expect_no_leaks(mem0);
}

Test(replay, lstm_replays_bitwise_none)
{
    check_lstm_replay(TG_CHECKPOINT_NONE, false);
}

Test(replay, lstm_replays_bitwise_balanced)
{
    check_lstm_replay(TG_CHECKPOINT_BALANCED, false);
}

Test(replay, lstm_remaking_its_gates_replays_bitwise)
{
    check_lstm_replay(TG_CHECKPOINT_NONE, true);
}

/* ---- Fused runs: a replay runs a run of pointwise calls over a large
 * shape as one fused call where nothing outside the run can see its
 * middle results. The loss, the gradients and every value the user holds
 * must stay bitwise those of recording again, and the fused steps and
 * nodes are counted exactly. Each forward names its steps' order in
 * statements (C leaves the order of a call's arguments open). */
typedef tg_tensor *(*fz_fn)(tg_tensor *const *p, tg_tensor *d, tg_tensor **keep);

/* mul, add_scalar, tanh, sigmoid, mul, sum: all six fused (p0 read twice,
 * only inside); keep: tanh's result. */
static tg_tensor *fz_chain(tg_tensor *const *p, tg_tensor *d, tg_tensor **keep)
{
    tg_tensor *a = tg_mul(d, p[0]);
    tg_tensor *t = tg_tanh(tg_add_scalar(a, 1.0));
    if (keep) *keep = t;
    tg_tensor *s = tg_sigmoid(p[0]);
    return tg_sum(tg_mul(t, s));
}

/* Seven calls on three inputs, and their mean: a fused sum whose forward
 * makes the gradients for the mean's seed, then the mean's factor (two
 * nodes). */
static tg_tensor *fz_three(tg_tensor *const *p, tg_tensor *d, tg_tensor **keep)
{
    (void)keep;
    tg_tensor *e = tg_exp(tg_mul_scalar(p[0], -0.5));
    tg_tensor *q = tg_mul(p[0], p[1]);
    tg_tensor *f = tg_mul(e, tg_add(p[1], d));
    tg_tensor *r = tg_sub(f, tg_tanh(q));
    return tg_mean(r);
}

/* p0 read by two calls of the run and by a mean outside it: the four
 * calls of mul, tanh, mul, sum do not fuse as one (the mean's gradient
 * would come between theirs); mul and tanh (one read of p0 each) and mul
 * and sum do. */
static tg_tensor *fz_outside(tg_tensor *const *p, tg_tensor *d, tg_tensor **keep)
{
    (void)keep;
    tg_tensor *t = tg_tanh(tg_mul(p[0], d));
    tg_tensor *u = tg_mul(t, p[0]);
    tg_tensor *s = tg_sum(u);
    return tg_add(s, tg_mean(p[0]));
}

/* a = p0 d is read by sum_dims after the run: the run starts after it
 * (tanh, sigmoid, mul, sum fused). */
static tg_tensor *fz_cut(tg_tensor *const *p, tg_tensor *d, tg_tensor **keep)
{
    (void)keep;
    tg_tensor *a = tg_mul(p[0], d);
    tg_tensor *b = tg_sigmoid(tg_tanh(a));
    tg_tensor *s = tg_sum(tg_mul(b, p[1]));
    return tg_add(s, tg_sum_dims(a, 1, (const int[]){0}, false));
}

typedef struct fz_case {
    const char *name;
    fz_fn f;
    int64_t fused, nodes; /* after each replay, where it fuses */
    int64_t unfused_nodes; /* where it runs every call */
    /* Once a run stops ending with its sum or mean (in f32 on the cpu, a
     * fused sum whose values could not be shown to sum exactly: these
     * random values may or may not be): a_sum_that_cannot_be_shown_exact
     * below checks when. */
    int64_t unsummed_fused, unsummed_nodes;
} fz_case;

/* Records f on a fresh tape per batch (the reference), then replays one
 * record of it on both batches; compares loss, gradients and (hold) the
 * kept middle result bit for bit, and the fused steps and nodes with
 * want_fused and want_nodes. */
static void check_fused_replay(const fz_case *c, tg_dtype dt, tg_backend be, int64_t n,
                               tg_tape_opts opts, bool hold, int64_t want_fused,
                               int64_t want_nodes)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_backend prev = tg_set_default_backend(be);
    tg_scope_begin();
    tg_rng r;
    tg_rng_seed(&r, 17);
    tg_tensor *p[2], *vals[2], *ref_loss[2], *ref_g[2][2], *ref_keep[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) p[i] = tg_rand_uniform(&r, dt, 1, SHAPE(n), -1.5, 1.5);
    for (int k = 0; k < 2; k++) vals[k] = tg_rand_uniform(&r, dt, 1, SHAPE(n), -1.5, 1.5);
    for (int k = 0; k < 2; k++) {
        tg_tape *t = tg_tape_new(NULL);
        for (int i = 0; i < 2; i++) cr_assert_eq(tg_requires_grad(t, p[i]), TG_OK);
        tg_scope_begin();
        tg_tensor *keep = NULL;
        tg_tensor *loss = c->f(p, vals[k], hold ? &keep : NULL);
        cr_assert(loss, "%s: %s", c->name, tg_last_error_message());
        cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
        ref_loss[k] = copy_of(loss);
        if (keep) ref_keep[k] = copy_of(keep);
        tg_scope_end();
        for (int i = 0; i < 2; i++) {
            /* an unused parameter has no gradient: zeros stand for it */
            tg_tensor *g = tg_grad(p[i]);
            ref_g[k][i] = g ? copy_of(g) : tg_tensor_retain(tg_zeros(dt, 1, SHAPE(n)));
            tg_grad_zero(p[i]);
        }
        tg_tape_free(t);
    }
    opts.replay = true;
    tg_tape *t = tg_tape_new(&opts);
    tg_tensor *d = tg_zeros(dt, 1, SHAPE(n)), *keep = NULL;
    cr_assert_eq(tg_tape_input(t, d), TG_OK);
    for (int i = 0; i < 2; i++) cr_assert_eq(tg_requires_grad(t, p[i]), TG_OK);
    tg_scope_begin();
    tg_tensor *loss = tg_tensor_retain(c->f(p, d, hold ? &keep : NULL));
    tg_tensor_retain(keep);
    tg_scope_end();
    /* Two replays, then one in anomaly mode (every call again: a fused
     * run's middle results are made anew) and one after it (fused). */
    for (int r = 0; r < 4; r++) {
        int k = r % 2;
        bool anomaly = r == 2;
        cr_assert_eq(tg_tape_set_anomaly(t, anomaly), TG_OK);
        cr_assert_eq(tg_tape_replay(t, 1, &d, &vals[k]), TG_OK, "%s", tg_last_error_message());
        int64_t fused = anomaly ? 0 : want_fused;
        int64_t nodes = anomaly ? c->unfused_nodes : want_nodes;
        if (r > 0 && want_fused && dt == TG_F32 && be == TG_BACKEND_CPU &&
            tg_tape_replay_fused_steps(t) == c->unsummed_fused && !anomaly) {
            fused = c->unsummed_fused; /* the sum came out of the run */
            nodes = c->unsummed_nodes;
        }
        cr_expect_eq(tg_tape_replay_fused_steps(t), fused, "%s %s %s n %lld, replay %d: %lld fused",
                     c->name, tg_dtype_name(dt), tg_backend_name(be), (long long)n, r,
                     (long long)tg_tape_replay_fused_steps(t));
        cr_expect_eq(tg_tape_node_count(t), nodes, "%s, replay %d: %lld nodes", c->name, r,
                     (long long)tg_tape_node_count(t));
        cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
        cr_expect(same_bits(loss, ref_loss[k]), "%s %s %s, batch %d: loss differs", c->name,
                  tg_dtype_name(dt), tg_backend_name(be), k);
        for (int i = 0; i < 2; i++) {
            tg_tensor *g = tg_grad(p[i]);
            cr_expect(g ? same_bits(g, ref_g[k][i]) : tu_item(tg_sum(tg_abs(ref_g[k][i]))) == 0,
                      "%s %s %s, batch %d: gradient %d differs", c->name, tg_dtype_name(dt),
                      tg_backend_name(be), k, i);
            tg_grad_zero(p[i]);
        }
        if (keep)
            cr_expect(same_bits(keep, ref_keep[k]), "%s, batch %d: the kept value is stale",
                      c->name, k);
    }
    tg_tensor_release(loss);
    tg_tensor_release(keep);
    tg_tape_free(t);
    tu_release_all(ref_loss, 2);
    tu_release_all(ref_keep, 2);
    for (int k = 0; k < 2; k++) tu_release_all(ref_g[k], 2);
    tg_scope_end();
    tg_set_default_backend(prev);
    tu_expect_no_leaks(mem0);
}

static const fz_case fz_cases[] = {
    {"chain", fz_chain, 6, 1, 6, 5, 2},
    {"three", fz_three, 8, 2, 8, 7, 2},
    {"outside", fz_outside, 4, 4, 6, 2, 5},
    {"cut", fz_cut, 4, 4, 7, 3, 5},
};

Test(replay, runs_of_pointwise_calls_fuse_bitwise_on_both_backends)
{
    for (size_t c = 0; c < sizeof fz_cases / sizeof fz_cases[0]; c++)
        for (int dt = 0; dt < 2; dt++)
            for (int be = 0; be < 2; be++)
                check_fused_replay(&fz_cases[c], dt ? TG_F64 : TG_F32,
                                   be ? TG_BACKEND_CPU : TG_BACKEND_REF, 5000, (tg_tape_opts){0},
                                   false, fz_cases[c].fused, fz_cases[c].nodes);
}

Test(replay, runs_fuse_bitwise_under_balanced_and_not_under_a_budget)
{
    /* BALANCED decides for the fused call's node as for any other: keep
     * its values, or run it again in backward. A budget is not fused: a
     * fused call keeps other bytes than its calls (its program, a sum's
     * gradient), and with a budget of 0 bytes it could not be recorded
     * where the calls can. */
    static const tg_tape_opts budgets[] = {
        {.policy = TG_CHECKPOINT_BUDGET, .budget_bytes = 30000},
        {.policy = TG_CHECKPOINT_BUDGET, .budget_bytes = 0}};
    for (size_t c = 0; c < sizeof fz_cases / sizeof fz_cases[0]; c++)
        for (int dt = 0; dt < 2; dt++) {
            tg_dtype d = dt ? TG_F64 : TG_F32;
            check_fused_replay(&fz_cases[c], d, TG_BACKEND_CPU, 5000,
                               (tg_tape_opts){.policy = TG_CHECKPOINT_BALANCED}, false,
                               fz_cases[c].fused, fz_cases[c].nodes);
            for (int k = 0; k < 2; k++)
                check_fused_replay(&fz_cases[c], d, TG_BACKEND_CPU, 5000, budgets[k], false, 0,
                                   fz_cases[c].unfused_nodes);
        }
}

Test(replay, a_run_whose_middle_result_the_user_holds_is_not_fused)
{
    /* The user keeps tanh's result: the calls run one by one (six nodes)
     * and it holds each replay's values. */
    check_fused_replay(&fz_cases[0], TG_F32, TG_BACKEND_CPU, 5000, (tg_tape_opts){0}, true, 0,
                       6);
}

Test(replay, small_shapes_and_replay_unfused_run_every_call)
{
    for (size_t c = 0; c < sizeof fz_cases / sizeof fz_cases[0]; c++) {
        /* below 4096 elements a fused call costs more than it saves */
        int64_t nodes = c == 0 ? 6 : c == 1 ? 8 : c == 2 ? 6 : 7;
        check_fused_replay(&fz_cases[c], TG_F32, TG_BACKEND_CPU, 4095, (tg_tape_opts){0}, false,
                           0, nodes);
        check_fused_replay(&fz_cases[c], TG_F64, TG_BACKEND_CPU, 5000,
                           (tg_tape_opts){.replay_unfused = true}, false, 0, nodes);

    }
}

/* ---- Random programs: pointwise calls (maps, and add, sub and mul of
 * any two values, the same one twice included) mixed with calls that are
 * not fused steps (div, softmax), middle results the user sometimes keeps,
 * and a loss of sums and means of several values, in both dtypes, on both
 * backends, under NONE and BALANCED. Each replay must give recording's
 * loss, gradients and kept values bit for bit. */
#define RP_VALS 24

typedef struct rp_prog {
    int n;               /* calls */
    int kind[RP_VALS];   /* 0 map, 1 add, 2 sub, 3 mul, 4 div, 5 softmax */
    int map[RP_VALS];    /* kind 0: which map */
    int a[RP_VALS], b[RP_VALS];
    bool keep[RP_VALS];
    int loss[3];         /* sum of value loss[0], mean of loss[1], sum of loss[2] */
} rp_prog;

static uint64_t rp_next(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static void rp_prog_make(rp_prog *g, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15u + 1;
    memset(g, 0, sizeof *g);
    g->n = 3 + (int)(rp_next(&s) % (RP_VALS - 6));
    for (int j = 0; j < g->n; j++) {
        int have = 3 + j; /* p0, p1, d, then the calls' results */
        int r = (int)(rp_next(&s) % 16);
        g->kind[j] = r < 8 ? 0 : r < 10 ? 1 : r < 11 ? 2 : r < 14 ? 3 : r < 15 ? 4 : 5;
        g->map[j] = (int)(rp_next(&s) % 8);
        /* mostly the latest values: chains, with fan-out now and then */
        int back = (int)(rp_next(&s) % 4 == 0 ? rp_next(&s) % (uint64_t)have
                                               : rp_next(&s) % (uint64_t)(have < 3 ? have : 3));
        g->a[j] = have - 1 - back;
        g->b[j] = rp_next(&s) % 5 == 0 ? g->a[j] : (int)(rp_next(&s) % (uint64_t)have);
        g->keep[j] = rp_next(&s) % 9 == 0;
    }
    int last = 3 + g->n - 1;
    g->loss[0] = last;
    g->loss[1] = (int)(rp_next(&s) % (uint64_t)(last + 1));
    g->loss[2] = (int)(rp_next(&s) % (uint64_t)(last + 1));
}

static tg_tensor *rp_map(int m, tg_tensor *x)
{
    switch (m) {
    case 0: return tg_tanh(x);
    case 1: return tg_sigmoid(x);
    case 2: return tg_sin(x);
    case 3: return tg_add_scalar(x, 0.25);
    case 4: return tg_mul_scalar(x, 0.5);
    case 5: return tg_silu(x);
    case 6: return tg_neg(x);
    default: return tg_softplus(x, 1.0, 20.0);
    }
}

/* The program on p0, p1 and d; kept[j]: call j's result where keep[j]. */
static tg_tensor *rp_prog_run(const rp_prog *g, tg_tensor *p0, tg_tensor *p1, tg_tensor *d,
                              tg_tensor **kept)
{
    tg_tensor *v[3 + RP_VALS] = {p0, p1, d};
    for (int j = 0; j < g->n; j++) {
        tg_tensor *a = v[g->a[j]], *b = v[g->b[j]], *y;
        switch (g->kind[j]) {
        case 0: y = rp_map(g->map[j], a); break;
        case 1: y = tg_add(a, b); break;
        case 2: y = tg_sub(a, b); break;
        case 3: y = tg_mul(a, b); break;
        case 4: y = tg_div(a, tg_add_scalar(tg_mul(b, b), 1.0)); break;
        default: y = tg_softmax(a, 1); break;
        }
        cr_assert(y, "call %d: %s", j, tg_last_error_message());
        v[3 + j] = y;
        kept[j] = g->keep[j] ? y : NULL;
    }
    tg_tensor *l = tg_add(tg_sum(v[g->loss[0]]), tg_mean(v[g->loss[1]]));
    l = tg_add(l, tg_sum(v[g->loss[2]]));
    /* p0 always reaches the loss; p1 only through the calls (or not at
     * all: then it has no gradient, fused or not). */
    (void)p1;
    return tg_add(l, tg_mean(p0));
}

Test(replay, random_programs_replay_fused_bitwise)
{
    size_t mem0 = tg_mem_current_bytes();
    int64_t fused_total = 0;
    const int64_t shape[2] = {40, 128}; /* 5120 elements */
    for (uint64_t seed = 1; seed <= 120; seed++) {
        rp_prog g;
        rp_prog_make(&g, seed);
        tg_dtype dt = seed % 3 == 0 ? TG_F64 : TG_F32;
        tg_backend prev = tg_set_default_backend(seed % 4 == 1 ? TG_BACKEND_REF : TG_BACKEND_CPU);
        tg_scope_begin();
        tg_rng r;
        tg_rng_seed(&r, seed);
        tg_tensor *p[2], *vals[2], *ref[2][3], *ref_kept[2][RP_VALS];
        for (int i = 0; i < 2; i++) p[i] = tg_rand_uniform(&r, dt, 2, shape, -1.2, 1.2);
        for (int k = 0; k < 2; k++) vals[k] = tg_rand_uniform(&r, dt, 2, shape, -1.2, 1.2);
        for (int k = 0; k < 2; k++) {
            tg_tape *t = tg_tape_new(NULL);
            for (int i = 0; i < 2; i++) cr_assert_eq(tg_requires_grad(t, p[i]), TG_OK);
            tg_scope_begin();
            tg_tensor *kept[RP_VALS];
            tg_tensor *loss = rp_prog_run(&g, p[0], p[1], vals[k], kept);
            cr_assert_eq(tg_backward(loss), TG_OK, "seed %llu: %s", (unsigned long long)seed,
                         tg_last_error_message());
            ref[k][0] = copy_of(loss);
            for (int j = 0; j < g.n; j++) ref_kept[k][j] = kept[j] ? copy_of(kept[j]) : NULL;
            tg_scope_end();
            for (int i = 0; i < 2; i++) {
                tg_tensor *gr = tg_grad(p[i]);
                ref[k][1 + i] = gr ? copy_of(gr) : NULL;
                tg_grad_zero(p[i]);
            }
            tg_tape_free(t);
        }
        tg_checkpoint_policy pol = seed % 5 == 2 ? TG_CHECKPOINT_BALANCED : TG_CHECKPOINT_NONE;
        tg_tape *t = tg_tape_new(&(tg_tape_opts){.replay = true, .policy = pol});
        tg_tensor *d = tg_zeros(dt, 2, shape), *kept[RP_VALS];
        cr_assert_eq(tg_tape_input(t, d), TG_OK);
        for (int i = 0; i < 2; i++) cr_assert_eq(tg_requires_grad(t, p[i]), TG_OK);
        tg_scope_begin();
        tg_tensor *loss = tg_tensor_retain(rp_prog_run(&g, p[0], p[1], d, kept));
        for (int j = 0; j < g.n; j++) tg_tensor_retain(kept[j]);
        tg_scope_end();
        for (int k = 0; k < 2; k++) {
            cr_assert_eq(tg_tape_replay(t, 1, &d, &vals[k]), TG_OK, "%s",
                         tg_last_error_message());
            fused_total += tg_tape_replay_fused_steps(t);
            cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
            cr_expect(same_bits(loss, ref[k][0]), "seed %llu, batch %d: loss differs",
                      (unsigned long long)seed, k);
            for (int i = 0; i < 2; i++) {
                tg_tensor *gr = tg_grad(p[i]);
                cr_expect(gr ? ref[k][1 + i] && same_bits(gr, ref[k][1 + i]) : !ref[k][1 + i],
                          "seed %llu, batch %d: gradient %d differs (%s, recording %s)",
                          (unsigned long long)seed, k, i, gr ? "made" : "none",
                          ref[k][1 + i] ? "made" : "none");
                tg_grad_zero(p[i]);
            }
            for (int j = 0; j < g.n; j++)
                if (kept[j])
                    cr_expect(same_bits(kept[j], ref_kept[k][j]),
                              "seed %llu, batch %d: kept value %d differs",
                              (unsigned long long)seed, k, j);
        }
        tg_tensor_release(loss);
        for (int j = 0; j < g.n; j++) tg_tensor_release(kept[j]);
        tg_tape_free(t);
        for (int k = 0; k < 2; k++) {
            tu_release_all(ref[k], 3);
            for (int j = 0; j < g.n; j++) tg_tensor_release(ref_kept[k][j]);
        }
        tg_scope_end();
        tg_set_default_backend(prev);
    }
    /* The programs exercise fusion: many of their calls ran fused. */
    cr_expect_gt(fused_total, 400, "only %lld steps ran fused", (long long)fused_total);
    tu_expect_no_leaks(mem0);
}

/* A fused run's middle results are nobody's after it ran: the program lets
 * go of them, so a replay tape holds the chain's five middle values less
 * than one that runs every call. */
static size_t fz_held_bytes(bool unfused, int64_t n)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_scope_begin();
    tg_tensor *p[2] = {tg_full(TG_F32, 1, SHAPE(n), 0.5), tg_full(TG_F32, 1, SHAPE(n), 0.25)};
    tg_tensor *d = tg_full(TG_F32, 1, SHAPE(n), 0.75);
    tg_tape *t = tg_tape_new(&(tg_tape_opts){.replay = true, .replay_unfused = unfused});
    cr_assert_eq(tg_tape_input(t, d), TG_OK);
    for (int i = 0; i < 2; i++) cr_assert_eq(tg_requires_grad(t, p[i]), TG_OK);
    tg_scope_begin();
    tg_tensor *loss = tg_tensor_retain(fz_chain(p, d, NULL));
    tg_scope_end();
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(tg_tape_replay(t, 1, &d, NULL), TG_OK, "%s", tg_last_error_message());
        cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
        tg_grad_zero(p[0]);
    }
    size_t held = tg_mem_current_bytes() - mem0;
    tg_tensor_release(loss);
    tg_tape_free(t);
    tg_scope_end();
    return held;
}

Test(replay, a_fused_run_lets_go_of_its_middle_results)
{
    size_t mem0 = tg_mem_current_bytes();
    const int64_t n = 100000;
    size_t fused = fz_held_bytes(false, n), unfused = fz_held_bytes(true, n);
    /* Both hold p0, p1 and d, n floats each; call by call, also the results
     * of mul, add_scalar, tanh, sigmoid and mul; fused, the program's
     * words instead (a few hundred bytes). */
    const size_t v = (size_t)n * sizeof(float);
    cr_expect_geq(unfused, 8 * v, "held %zu bytes running every call", unfused);
    cr_expect_geq(fused, 3 * v, "held %zu bytes fused", fused);
    cr_expect_lt(fused, 3 * v + 4096, "held %zu bytes fused", fused);
    tu_expect_no_leaks(mem0);
}

/* A call recorded after a fused replay grows the program: the next replay
 * plans it again, with the run's middle results made anew first, and runs
 * the new call on the new loss. */
Test(replay, a_program_that_grows_after_a_fused_replay_is_planned_again)
{
    size_t mem0 = tg_mem_current_bytes();
    tg_scope_begin();
    const int64_t n = 6000;
    tg_rng r;
    tg_rng_seed(&r, 5);
    tg_tensor *p[2] = {tg_rand_uniform(&r, TG_F32, 1, SHAPE(n), -1, 1),
                       tg_rand_uniform(&r, TG_F32, 1, SHAPE(n), -1, 1)};
    tg_tensor *vals[2] = {tg_rand_uniform(&r, TG_F32, 1, SHAPE(n), -1, 1),
                          tg_rand_uniform(&r, TG_F32, 1, SHAPE(n), -1, 1)};
    /* the reference: the chain recorded afresh on the second batch */
    tg_tape *t = tg_tape_new(NULL);
    cr_assert_eq(tg_requires_grad(t, p[0]), TG_OK);
    tg_tensor *ref = tg_tensor_retain(fz_chain(p, vals[1], NULL));
    cr_assert_eq(tg_backward(ref), TG_OK);
    tg_tensor *ref_g = tg_tensor_retain(tg_detach(tg_grad(p[0])));
    tg_grad_zero(p[0]);
    tg_tape_free(t);

    t = tg_tape_new(&(tg_tape_opts){.replay = true});
    tg_tensor *d = tg_zeros(TG_F32, 1, SHAPE(n));
    cr_assert_eq(tg_tape_input(t, d), TG_OK);
    cr_assert_eq(tg_requires_grad(t, p[0]), TG_OK);
    tg_scope_begin();
    tg_tensor *loss = tg_tensor_retain(fz_chain(p, d, NULL));
    tg_scope_end();
    cr_assert_eq(tg_tape_replay(t, 1, &d, &vals[0]), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_tape_replay_fused_steps(t), 6);
    int64_t steps = tg_tape_replay_steps(t);
    tg_scope_begin();
    tg_tensor *twice = tg_tensor_retain(tg_mul_scalar(loss, 2.0)); /* joins the program */
    tg_scope_end();
    cr_assert_eq(tg_tape_replay_steps(t), steps + 1);
    cr_assert_eq(tg_tape_replay(t, 1, &d, &vals[1]), TG_OK, "%s", tg_last_error_message());
    cr_expect_eq(tg_tape_replay_fused_steps(t), 6);
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    cr_expect(same_bits(loss, ref), "loss differs");
    cr_expect_eq(tu_item(twice), 2.0 * tu_item(ref), "the new call did not see the new loss");
    cr_expect(same_bits(tg_grad(p[0]), ref_g), "gradient differs");
    tg_tensor_release(ref);
    tg_tensor_release(ref_g);
    tg_tensor_release(twice);
    tg_tensor_release(loss);
    tg_tape_free(t);
    tg_scope_end();
    tu_expect_no_leaks(mem0);
}

/* Second order through a fused run: create_graph differentiates the fused
 * call's node by recorded ops (fused.c), the ops' own backward in the
 * sweep's order; the gradients it returns and what they differentiate to
 * are recording's, bit for bit. */
Test(replay, a_fused_run_differentiates_twice_as_recording_does)
{
    size_t mem0 = tg_mem_current_bytes();
    const int64_t n = 5000;
    for (size_t c = 0; c < sizeof fz_cases / sizeof fz_cases[0]; c++)
        for (int dt = 0; dt < 2; dt++) {
            tg_dtype dtype = dt ? TG_F64 : TG_F32;
            tg_scope_begin();
            tg_rng r;
            tg_rng_seed(&r, 9 + c);
            tg_tensor *p[2] = {tg_rand_uniform(&r, dtype, 1, SHAPE(n), -1, 1),
                               tg_rand_uniform(&r, dtype, 1, SHAPE(n), -1, 1)};
            tg_tensor *v = tg_rand_uniform(&r, dtype, 1, SHAPE(n), -1, 1);
            tg_tensor *dv = tg_rand_uniform(&r, dtype, 1, SHAPE(n), -1, 1);
            tg_tensor *g1[2][2], *hv[2];
            for (int replay = 0; replay < 2; replay++) {
                tg_tape *t = tg_tape_new(&(tg_tape_opts){.replay = replay != 0});
                tg_tensor *d = copy_of(dv); /* the replay's input: a tensor of its own */
                if (replay) cr_assert_eq(tg_tape_input(t, d), TG_OK);
                for (int i = 0; i < 2; i++) cr_assert_eq(tg_requires_grad(t, p[i]), TG_OK);
                tg_scope_begin();
                tg_tensor *loss = tg_tensor_retain(fz_cases[c].f(p, d, NULL));
                tg_scope_end();
                if (replay) {
                    cr_assert_eq(tg_tape_replay(t, 1, &d, NULL), TG_OK, "%s",
                                 tg_last_error_message());
                    cr_assert_eq(tg_tape_replay_fused_steps(t), fz_cases[c].fused);
                }
                tg_tensor *g[2];
                tg_grad_opts o = {.create_graph = true, .allow_unused = true};
                cr_assert_eq(tg_grad_of(1, &loss, NULL, 2, p, g, &o), TG_OK, "%s",
                             tg_last_error_message());
                tg_tensor *h;
                tg_tensor *s = tg_sum(tg_mul(g[0], v));
                cr_assert_eq(tg_grad_of(1, &s, NULL, 1, &p[0], &h, NULL), TG_OK, "%s",
                             tg_last_error_message());
                for (int i = 0; i < 2; i++) g1[replay][i] = copy_of(g[i]);
                hv[replay] = copy_of(h);
                tg_tensor_release(loss);
                tg_tensor_release(d);
                tg_tape_free(t);
            }
            for (int i = 0; i < 2; i++)
                cr_expect(same_bits(g1[0][i], g1[1][i]), "%s %s: first order %d differs",
                          fz_cases[c].name, tg_dtype_name(dtype), i);
            /* Second order: to rounding. Differentiating the fused call's
             * recorded backward again may add in another order than the
             * calls' (the outside case differs in its last bits). */
            double *q = tu_values(hv[0]);
            tu_expect_values(hv[1], q, n, dt ? 1e-13 : 1e-6);
            free(q);
            for (int k = 0; k < 2; k++) tu_release_all(g1[k], 2);
            tu_release_all(hv, 2);
            tg_scope_end();
        }
    tu_expect_no_leaks(mem0);
}

/* A run that ends in a sum runs as a fused sum, which sums its values as
 * they are made where it can show that sum exact (tg_sum's fast pass: the
 * range of |x| narrow enough); where it cannot, it runs its forward again
 * to write them. A replay then ends the run before the sum from the next
 * replay on: one fused call writes the values once and the sum runs as
 * recorded. tanh(x) * y with x in [0.5, 1.5] sums exactly; with one x of
 * 1e-7 (a range of 1e7 over 5000 values) it cannot be shown to. */
static tg_tensor *tanh_times(tg_tensor *const *p, tg_tensor *d, tg_tensor **keep)
{
    (void)keep;
    tg_tensor *t = tg_tanh(p[0]);
    return tg_sum(tg_mul(t, d));
}

Test(replay, a_sum_that_cannot_be_shown_exact_comes_out_of_its_run)
{
    size_t mem0 = tg_mem_current_bytes();
    const int64_t n = 5000;
    for (int wide = 0; wide < 2; wide++) {
        tg_scope_begin();
        tg_rng r;
        tg_rng_seed(&r, 4);
        tg_tensor *p[2] = {tg_rand_uniform(&r, TG_F32, 1, SHAPE(n), 0.5, 1.5), NULL};
        p[1] = p[0];
        tg_tensor *y = tg_rand_uniform(&r, TG_F32, 1, SHAPE(n), 0.5, 1.5);
        if (wide) ((float *)tg_tensor_data(p[0]))[17] = 1e-7f;
        /* the reference: recorded afresh */
        tg_tape *t = tg_tape_new(NULL);
        cr_assert_eq(tg_requires_grad(t, p[0]), TG_OK);
        tg_tensor *ref = tg_tensor_retain(tanh_times(p, y, NULL));
        cr_assert_eq(tg_backward(ref), TG_OK);
        tg_tensor *ref_g = copy_of(tg_grad(p[0]));
        tg_grad_zero(p[0]);
        tg_tape_free(t);
        t = tg_tape_new(&(tg_tape_opts){.replay = true});
        tg_tensor *d = copy_of(y);
        cr_assert_eq(tg_tape_input(t, d), TG_OK);
        cr_assert_eq(tg_requires_grad(t, p[0]), TG_OK);
        tg_scope_begin();
        tg_tensor *loss = tg_tensor_retain(tanh_times(p, d, NULL));
        tg_scope_end();
        for (int k = 0; k < 3; k++) {
            cr_assert_eq(tg_tape_replay(t, 1, &d, NULL), TG_OK, "%s", tg_last_error_message());
            /* tanh, mul, sum in one fused sum; wide, from the second replay
             * on tanh and mul in one fused call and the sum as recorded */
            int64_t want = wide && k > 0 ? 2 : 3, nodes = wide && k > 0 ? 2 : 1;
            cr_expect_eq(tg_tape_replay_fused_steps(t), want, "wide %d, replay %d: %lld fused",
                         wide, k, (long long)tg_tape_replay_fused_steps(t));
            cr_expect_eq(tg_tape_node_count(t), nodes, "wide %d, replay %d: %lld nodes", wide, k,
                         (long long)tg_tape_node_count(t));
            cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
            cr_expect(same_bits(loss, ref), "wide %d, replay %d: loss differs", wide, k);
            cr_expect(same_bits(tg_grad(p[0]), ref_g), "wide %d, replay %d: gradient differs",
                      wide, k);
            tg_grad_zero(p[0]);
        }
        tg_tensor_release(loss);
        tg_tensor_release(d);
        tg_tensor_release(ref);
        tg_tensor_release(ref_g);
        tg_tape_free(t);
        tg_scope_end();
    }
    tu_expect_no_leaks(mem0);
}
