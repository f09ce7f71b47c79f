/* Data-parallel steps on worker threads (tapegrad/replicas.h): gradients
 * against one backward over the whole batch, determinism, every checkpoint
 * policy, an LSTM, errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* An MLP in -> hidden (tanh) -> classes with cross-entropy, and a batch of
 * seeded data. */
typedef struct {
    tg_params *ps;
    tg_linear *l1, *l2;
    tg_tensor *x, *y; /* (rows, in) and (rows) i64 */
} model;

/* Hidden units of the models model_new makes. */
static int64_t hidden = 16;

static void model_new(model *m, tg_dtype dt, int64_t rows, uint64_t seed)
{
    tg_rng rng;
    tg_rng_seed(&rng, seed);
    m->ps = tg_params_new();
    m->l1 = tg_linear_new(m->ps, "fc1", 12, hidden, true, dt, &rng);
    m->l2 = tg_linear_new(m->ps, "fc2", hidden, 5, true, dt, &rng);
    cr_assert(m->l1 && m->l2, "%s", tg_last_error_message());
    m->x = tg_rand_normal(&rng, dt, 2, SHAPE(rows, 12), 0, 1);
    tg_tensor *u = tg_rand_uniform(&rng, TG_F64, 1, SHAPE(rows), 0, 1);
    tg_tensor *scaled = tg_mul_scalar(u, 4.999);
    m->y = tg_cast(scaled, TG_I64);
    tg_tensor_release(scaled);
    tg_tensor_release(u);
    cr_assert(m->x && m->y, "%s", tg_last_error_message());
}

/* Every value (grad: gradient) of ps's flat buffer of dtype dt, copied. */
static double *flat_values(tg_params *ps, tg_dtype dt, bool grad)
{
    tg_scope_begin();
    tg_tensor *f = grad ? tg_params_flat_grad(ps, dt) : tg_params_flat(ps, dt);
    double *v = tu_values(f);
    tg_scope_end();
    return v;
}

static void model_free(model *m)
{
    tg_tensor_release(m->x);
    tg_tensor_release(m->y);
    tg_linear_free(m->l1);
    tg_linear_free(m->l2);
    tg_params_free(m->ps);
}

static tg_tensor *hidden_layer(void *ud, int layer, tg_tensor *h)
{
    const model *m = ud;
    (void)layer;
    return tg_tanh(tg_linear_forward(m->l1, h));
}

static bool use_segments;
/* Adds sum(W1 * W1) / 64 to the loss: the record then reads fc1's weight
 * twice. */
static bool use_penalty;
/* Also takes the gradient of the loss with respect to the hidden layer
 * (tg_grad_of: it sweeps fc2's node, whose weight gradient it discards)
 * before returning the loss. */
static bool use_grad_of;

static tg_tensor *mlp_loss(void *ud, const tg_replica_info *info, int n, tg_tensor *const *in)
{
    const model *m = ud;
    cr_assert_eq(n, 2);
    cr_assert_eq(tg_tensor_dim(in[0], 0), info->rows);
    tg_tensor *h = use_segments ? tg_checkpoint(info->tape, hidden_layer, ud, in[0])
                                : hidden_layer(ud, 0, in[0]);
    tg_tensor *loss = tg_cross_entropy(tg_linear_forward(m->l2, h), in[1]);
    if (use_grad_of) {
        tg_tensor *gh = NULL;
        cr_assert_eq(tg_grad_of(1, &loss, NULL, 1, &h, &gh, &(tg_grad_opts){.retain = true}),
                     TG_OK, "%s", tg_last_error_message());
        cr_assert(tg_tensor_numel(gh) == tg_tensor_numel(h));
    }
    if (use_penalty) {
        tg_tensor *w = tg_linear_weight(m->l1);
        loss = tg_add(loss, tg_mul_scalar(tg_sum(tg_mul(w, w)), 1.0 / 64));
    }
    return loss;
}

/* The flat gradient of m after one backward over the whole batch on a
 * tape with policy p (caller frees). */
static double *whole_batch_grad(model *m, tg_checkpoint_policy p, int64_t *numel)
{
    tg_tape_opts o = {.policy = p, .budget_bytes = 1 << 20};
    tg_tape *tape = tg_tape_new(&o);
    cr_assert_eq(tg_params_requires_grad(m->ps, tape), TG_OK);
    tg_scope_begin();
    tg_replica_info info = {.workers = 1, .tape = tape, .rows = tg_tensor_dim(m->x, 0)};
    tg_tensor *loss = mlp_loss(m, &info, 2, (tg_tensor *[]){m->x, m->y});
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    tg_tensor *flat = tg_params_flat_grad(m->ps, tg_tensor_dtype(m->x));
    *numel = tg_tensor_numel(flat);
    double *g = tu_values(flat);
    tg_scope_end();
    tg_params_zero_grad(m->ps);
    tg_tape_free(tape);
    return g;
}

/* The flat gradient after one replica step with n workers. */
static double *replica_grad(model *m, int workers, tg_checkpoint_policy p, double *loss)
{
    tg_replicas_opts o = {.workers = workers,
                          .tape = {.policy = p, .budget_bytes = 1 << 20}};
    tg_replicas *r = tg_replicas_new(m->ps, &o);
    cr_assert(r, "%s", tg_last_error_message());
    tg_params_zero_grad(m->ps);
    cr_assert_eq(tg_replicas_step(r, 2, (tg_tensor *[]){m->x, m->y}, mlp_loss, m, loss), TG_OK,
                 "%s", tg_last_error_message());
    tg_tensor *flat = tg_params_flat_grad(m->ps, tg_tensor_dtype(m->x));
    double *g = tu_values(flat);
    tg_tensor_release(flat);
    tg_params_zero_grad(m->ps);
    tg_replicas_free(r);
    return g;
}

Test(replicas, one_worker_is_bitwise_one_backward_over_the_batch)
{
    for (int d = 0; d < 2; d++) {
        model m;
        model_new(&m, d ? TG_F64 : TG_F32, 37, 5);
        int64_t n;
        double *want = whole_batch_grad(&m, TG_CHECKPOINT_NONE, &n);
        double loss;
        double *got = replica_grad(&m, 1, TG_CHECKPOINT_NONE, &loss);
        cr_assert_eq(memcmp(want, got, (size_t)n * sizeof *got), 0, "dtype %d", d);
        cr_assert(loss > 0.5 && loss < 5, "loss %g", loss);
        free(want);
        free(got);
        model_free(&m);
    }
}

Test(replicas, n_workers_match_the_whole_batch_and_repeat_bitwise)
{
    for (int d = 0; d < 2; d++) {
        tg_dtype dt = d ? TG_F64 : TG_F32;
        double tol = d ? 1e-12 : 2e-6;
        model m;
        model_new(&m, dt, 64, 9);
        int64_t n;
        double *want = whole_batch_grad(&m, TG_CHECKPOINT_NONE, &n);
        double gmax = 0;
        for (int64_t i = 0; i < n; i++) gmax = fmax(gmax, fabs(want[i]));
        cr_assert(gmax > 1e-3, "a gradient worth comparing (max %g)", gmax);
        for (int w = 2; w <= 5; w++) {
            double l1, l2;
            double *a = replica_grad(&m, w, TG_CHECKPOINT_NONE, &l1);
            double *b = replica_grad(&m, w, TG_CHECKPOINT_NONE, &l2);
            cr_assert_eq(memcmp(a, b, (size_t)n * sizeof *a), 0, "%d workers: runs differ", w);
            cr_assert_eq(l1, l2);
            for (int64_t i = 0; i < n; i++)
                cr_assert(fabs(a[i] - want[i]) <= tol * fmax(1, gmax),
                          "%s, %d workers, element %lld: %.17g vs %.17g", tg_dtype_name(dt), w,
                          (long long)i, a[i], want[i]);
            free(a);
            free(b);
        }
        free(want);
        model_free(&m);
    }
}

/* The flat gradients of plain backwards over each of nw shards of m's
 * batch, split as the replicas split it (caller frees each). */
static void shard_grads(model *m, tg_dtype dt, int nw, double **g)
{
    int64_t rows = tg_tensor_dim(m->x, 0);
    for (int k = 0; k < nw; k++) {
        int64_t r0 = rows * k / nw, rk = rows * (k + 1) / nw - r0;
        tg_tape *tape = tg_tape_new(NULL);
        cr_assert_eq(tg_params_requires_grad(m->ps, tape), TG_OK);
        tg_scope_begin();
        tg_tensor *xs = tg_narrow(m->x, 0, r0, rk), *ys = tg_narrow(m->y, 0, r0, rk);
        tg_replica_info info = {.workers = 1, .tape = tape, .rows = rk};
        tg_tensor *loss = mlp_loss(m, &info, 2, (tg_tensor *[]){xs, ys});
        cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
        tg_scope_end();
        g[k] = flat_values(m->ps, dt, true);
        tg_params_zero_grad(m->ps);
        tg_tape_free(tape);
    }
}

/* got is, bitwise in dt, 0.5 g[0] + 0.5 g[1] (two workers' mean). */
static void expect_mean_of_halves(tg_dtype dt, const double *got, double *const *g, int64_t n,
                                  int run)
{
    for (int64_t i = 0; i < n; i++) {
        double want;
        if (dt == TG_F64) {
            want = 0.5 * g[0][i];
            want += 0.5 * g[1][i];
        } else {
            float w = 0.5f * (float)g[0][i];
            w += 0.5f * (float)g[1][i];
            want = w;
        }
        cr_assert_eq(memcmp(&got[i], &want, sizeof want), 0,
                     "%s, run %d, element %lld: %.17g vs %.17g", tg_dtype_name(dt), run,
                     (long long)i, got[i], want);
    }
}

/* One replica step of m's mlp from zeroed gradients (it must succeed);
 * then its flat gradient is, bitwise in dt, the mean of the halves' g. */
static void step_expect_mean_of_halves(tg_replicas *r, model *m, tg_dtype dt, double *const *g,
                                       int64_t n, int run)
{
    tg_params_zero_grad(m->ps);
    cr_assert_eq(tg_replicas_step(r, 2, (tg_tensor *[]){m->x, m->y}, mlp_loss, m, NULL), TG_OK,
                 "%s", tg_last_error_message());
    double *got = flat_values(m->ps, dt, true);
    expect_mean_of_halves(dt, got, g, n, run);
    free(got);
}

/* Two workers' sum is s0 g0 + s1 g1 in float, taken in worker order, where
 * g0 and g1 are plain backwards over each half of the batch: bitwise,
 * whether worker 0's gradient went through a tensor of its own or
 * straight into the flat buffer (its gradient sinks). */
Test(replicas, two_workers_sum_the_halves_gradients_to_the_bit)
{
    model m;
    model_new(&m, TG_F32, 64, 21);
    int64_t n = tg_params_numel(m.ps);
    double *half[2];
    shard_grads(&m, TG_F32, 2, half);
    for (int rep = 0; rep < 2; rep++) {
        double l;
        double *got = replica_grad(&m, 2, TG_CHECKPOINT_NONE, &l);
        expect_mean_of_halves(TG_F32, got, half, n, rep);
        free(got);
    }
    free(half[0]);
    free(half[1]);
    model_free(&m);
}

/* Whether a refused deferral fails the test: tests/blas_kernels.sh sets
 * TG_TEST_NO_REFUSALS where the BLAS is an OpenBLAS whose kernel families
 * all chain this file's shapes exactly at one of the library's cuts. */
static bool refusals_fail(void)
{
    const char *v = getenv("TG_TEST_NO_REFUSALS");
    return v && *v && strcmp(v, "0") != 0;
}

/* Deferred weight gradients (replicas.h): where a step makes a weight's
 * gradient from the workers' activations in the reduce, the bits are
 * those of s0 g0 + s1 g1 + ... taken in worker order over the shards'
 * plain gradients, as where it does not; which steps defer. Whether a
 * shape's chained GEMMs are exact is the BLAS's affair (the check refuses
 * the others), so the count asserted is deferred + refused, and no refusal
 * at all under TG_TEST_NO_REFUSALS: on every kernel family of OpenBLAS
 * 0.3.21 nothing here is refused (on Haswell and Zen only after the cut of
 * 16 rows fails and 12 passes, which the first step of each case goes
 * through). */
Test(replicas, deferred_weight_gradients_keep_the_bits)
{
    static const struct {
        int workers;
        tg_grad_reduce reduce;
        bool penalty, anomaly, grad_of;
        int deferred; /* parameters made from activations */
    } cases[] = {
        {2, TG_REDUCE_MEAN, false, false, false, 2}, {4, TG_REDUCE_MEAN, false, false, false, 2},
        {3, TG_REDUCE_SUM, false, false, false, 2},  {3, TG_REDUCE_MEAN, false, false, false, 0},
        {2, TG_REDUCE_MEAN, true, false, false, 1},  {2, TG_REDUCE_MEAN, false, true, false, 0},
        /* A sweep of the loss function's own (tg_grad_of) defers nothing. */
        {2, TG_REDUCE_MEAN, false, false, true, 2},
    };
    hidden = 40;
    for (int d = 0; d < 2; d++)
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            tg_dtype dt = d ? TG_F64 : TG_F32;
            int nw = cases[c].workers;
            use_penalty = cases[c].penalty;
            use_grad_of = cases[c].grad_of;
            model m;
            model_new(&m, dt, 64, 40 + c);
            int64_t n = tg_params_numel(m.ps), rows = 64;
            double *g[4];
            shard_grads(&m, dt, nw, g);
            tg_replicas *r = tg_replicas_new(m.ps, &(tg_replicas_opts){
                .workers = nw, .reduce = cases[c].reduce});
            cr_assert(r, "%s", tg_last_error_message());
            if (cases[c].anomaly)
                cr_assert_eq(tg_tape_set_anomaly(tg_replicas_tape(r, 1), true), TG_OK);
            for (int rep = 0; rep < 2; rep++) {
                tg_params_zero_grad(m.ps);
                cr_assert_eq(tg_replicas_step(r, 2, (tg_tensor *[]){m.x, m.y}, mlp_loss, &m, NULL),
                             TG_OK, "%s", tg_last_error_message());
                int dfr = tg_replicas_last_deferred(r), rf = tg_replicas_last_refused(r);
                cr_assert_eq(dfr + rf, cases[c].deferred, "case %zu: %d deferred, %d refused", c,
                             dfr, rf);
                if (rf)
                    fprintf(stderr, "test_replicas: %s case %zu, run %d: the BLAS refused %d "
                                    "deferral(s)\n", tg_dtype_name(dt), c, rep, rf);
                cr_assert(!rf || !refusals_fail(), "%s case %zu: %d refused",
                          tg_dtype_name(dt), c, rf);
                double *got = flat_values(m.ps, dt, true);
                for (int64_t i = 0; i < n; i++) {
                    double want;
                    if (d) {
                        double acc = 0;
                        for (int k = 0; k < nw; k++) {
                            int64_t rk = rows * (k + 1) / nw - rows * k / nw;
                            double s = cases[c].reduce == TG_REDUCE_MEAN ? (double)rk / rows : 1;
                            acc = k ? acc + s * g[k][i] : s * g[k][i];
                        }
                        want = acc;
                    } else {
                        float acc = 0;
                        for (int k = 0; k < nw; k++) {
                            int64_t rk = rows * (k + 1) / nw - rows * k / nw;
                            float s = cases[c].reduce == TG_REDUCE_MEAN ? (float)rk / rows : 1;
                            acc = k ? acc + s * (float)g[k][i] : s * (float)g[k][i];
                        }
                        want = acc;
                    }
                    cr_assert_eq(memcmp(&got[i], &want, sizeof want), 0,
                                 "%s, case %zu, run %d, element %lld: %.17g vs %.17g",
                                 tg_dtype_name(dt), c, rep, (long long)i, got[i], want);
                }
                free(got);
            }
            /* A second step adding to the gradients: nothing deferred. */
            cr_assert_eq(tg_replicas_step(r, 2, (tg_tensor *[]){m.x, m.y}, mlp_loss, &m, NULL),
                         TG_OK);
            cr_assert_eq(tg_replicas_last_deferred(r), 0);
            cr_assert_eq(tg_replicas_last_refused(r), 0);
            for (int k = 0; k < nw; k++) free(g[k]);
            tg_replicas_free(r);
            model_free(&m);
        }
    use_penalty = use_grad_of = false;
    hidden = 16;
}

/* Shards of 6144 rows: OpenBLAS here (0.3.21, SkylakeX) splits a GEMM's
 * inner dimension that long, so adding the second worker's product into
 * the first's (beta 1) rounds differently from adding whole gradients, the
 * step's check on random data fails and the workers make their own weight
 * gradients. Whichever way a BLAS goes, the bits are the plain sum's, and
 * the verdict holds from step to step. */
Test(replicas, a_shape_whose_chained_gemms_round_differently_is_not_deferred)
{
    model m;
    model_new(&m, TG_F32, 12288, 77);
    int64_t n = tg_params_numel(m.ps);
    double *g[2];
    shard_grads(&m, TG_F32, 2, g);
    tg_replicas *r = tg_replicas_new(m.ps, &(tg_replicas_opts){.workers = 2});
    int first = -1;
    for (int rep = 0; rep < 2; rep++) {
        step_expect_mean_of_halves(r, &m, TG_F32, g, n, rep);
        int d = tg_replicas_last_deferred(r);
        cr_assert_eq(d + tg_replicas_last_refused(r), 2);
        if (rep == 0) first = d;
        cr_assert_eq(d, first, "the verdict changed: %d then %d", first, d);
    }
    free(g[0]);
    free(g[1]);
    tg_replicas_free(r);
    model_free(&m);
}

/* The ref backend's GEMM sums each element in double and adds C in double:
 * chained in f64 it is exact (the sum of two doubles rounded once, either
 * way), in f32 it is not (the second term is not rounded to float before
 * it is added). So on any machine its f64 steps defer and its f32 steps
 * are refused, with the plain sum's bits both ways. */
Test(replicas, on_the_ref_backend_f64_defers_and_f32_is_refused)
{
    tg_backend prev = tg_set_default_backend(TG_BACKEND_REF);
    hidden = 40;
    for (int d = 0; d < 2; d++) {
        tg_dtype dt = d ? TG_F64 : TG_F32;
        model m;
        model_new(&m, dt, 64, 90 + d);
        int64_t n = tg_params_numel(m.ps);
        double *g[2];
        shard_grads(&m, dt, 2, g);
        tg_replicas *r = tg_replicas_new(m.ps, &(tg_replicas_opts){.workers = 2});
        cr_assert(r, "%s", tg_last_error_message());
        for (int rep = 0; rep < 3; rep++) {
            step_expect_mean_of_halves(r, &m, dt, g, n, rep);
            cr_assert_eq(tg_replicas_last_deferred(r), d ? 2 : 0, "%s", tg_dtype_name(dt));
            cr_assert_eq(tg_replicas_last_refused(r), d ? 0 : 2, "%s", tg_dtype_name(dt));
        }
        free(g[0]);
        free(g[1]);
        tg_replicas_free(r);
        model_free(&m);
    }
    hidden = 16;
    tg_set_default_backend(prev);
}

Test(replicas, every_checkpoint_policy_gives_the_same_bits)
{
    model m;
    model_new(&m, TG_F64, 40, 3);
    double l;
    double *base = replica_grad(&m, 2, TG_CHECKPOINT_NONE, &l);
    int64_t n = tg_params_numel(m.ps);
    const tg_checkpoint_policy pol[] = {TG_CHECKPOINT_BALANCED, TG_CHECKPOINT_BUDGET};
    for (int i = 0; i < 2; i++) {
        double *g = replica_grad(&m, 2, pol[i], &l);
        cr_assert_eq(memcmp(base, g, (size_t)n * sizeof *g), 0, "policy %d", (int)pol[i]);
        free(g);
    }
    use_segments = true;
    double *g = replica_grad(&m, 2, TG_CHECKPOINT_NONE, &l);
    use_segments = false;
    cr_assert_eq(memcmp(base, g, (size_t)n * sizeof *g), 0, "segments");
    free(g);
    free(base);
    model_free(&m);
}

Test(replicas, gradients_accumulate_and_a_small_batch_idles_workers)
{
    model m;
    model_new(&m, TG_F64, 2, 4);
    int64_t n;
    double *want = whole_batch_grad(&m, TG_CHECKPOINT_NONE, &n);
    tg_replicas *r = tg_replicas_new(m.ps, &(tg_replicas_opts){.workers = 3});
    cr_assert(r);
    tg_params_zero_grad(m.ps);
    for (int step = 0; step < 2; step++)
        cr_assert_eq(tg_replicas_step(r, 2, (tg_tensor *[]){m.x, m.y}, mlp_loss, &m, NULL), TG_OK,
                     "%s", tg_last_error_message());
    tg_tensor *flat = tg_params_flat_grad(m.ps, TG_F64);
    double *got = tu_values(flat);
    for (int64_t i = 0; i < n; i++)
        cr_assert(fabs(got[i] - 2 * want[i]) <= 1e-12 * fmax(1, fabs(want[i])), "element %lld",
                  (long long)i);
    /* tg_grad of a parameter is its view of the flat buffer. */
    tg_tensor *w = tg_linear_weight(m.l1);
    cr_assert_eq(tg_requires_grad(tg_replicas_tape(r, 0), w), TG_OK);
    double *gw = tu_values(tg_grad(w));
    cr_assert_eq(gw[0], got[0]);
    free(gw);
    free(got);
    free(want);
    tg_tensor_release(flat);
    tg_replicas_free(r);
    model_free(&m);
}

/* An LSTM over a short sequence: x (rows, T, in), loss = mean of the last
 * hidden state's squares; the cell in a loop, or the layer (one lstm op
 * on x seen as (T, rows, in)). */
typedef struct {
    tg_params *ps;
    tg_lstm_cell *cell;
    tg_lstm_layer *layer;
} lstm_model;

static tg_tensor *lstm_loss(void *ud, const tg_replica_info *info, int n, tg_tensor *const *in)
{
    const lstm_model *m = ud;
    (void)n;
    int64_t rows = info->rows, steps = tg_tensor_dim(in[0], 1);
    tg_tensor *h = tg_zeros(TG_F64, 2, SHAPE(rows, 6)), *c = tg_zeros(TG_F64, 2, SHAPE(rows, 6));
    if (m->layer) {
        if (tg_lstm_layer_forward(m->layer, tg_transpose(in[0], 0, 1), NULL, NULL, NULL, &h,
                                  NULL))
            return NULL;
        return tg_mean(tg_mul(h, h));
    }
    for (int64_t t = 0; t < steps; t++) {
        tg_tensor *xt = tg_reshape(tg_narrow(in[0], 1, t, 1), 2, SHAPE(rows, 3));
        if (tg_lstm_cell_forward(m->cell, xt, h, c, &h, &c)) return NULL;
    }
    return tg_mean(tg_mul(h, h));
}

static void check_lstm_replicas(bool layer)
{
    tg_rng rng;
    tg_rng_seed(&rng, 11);
    lstm_model m = {.ps = tg_params_new()};
    if (layer)
        m.layer = tg_lstm_layer_new(m.ps, "cell", 3, 6, TG_F64, &rng);
    else
        m.cell = tg_lstm_cell_new(m.ps, "cell", 3, 6, TG_F64, &rng);
    tg_tensor *x = tg_rand_normal(&rng, TG_F64, 3, SHAPE(10, 5, 3), 0, 1);
    cr_assert((m.cell || m.layer) && x);
    tg_tape *tape = tg_tape_new(NULL);
    tg_params_requires_grad(m.ps, tape);
    tg_scope_begin();
    tg_replica_info info = {.workers = 1, .tape = tape, .rows = 10};
    cr_assert_eq(tg_backward(lstm_loss(&m, &info, 1, &x)), TG_OK, "%s", tg_last_error_message());
    double *want = flat_values(m.ps, TG_F64, true);
    tg_scope_end();
    tg_params_zero_grad(m.ps);
    tg_tape_free(tape);
    tg_replicas *r = tg_replicas_new(m.ps, &(tg_replicas_opts){.workers = 2});
    double *first = NULL;
    for (int rep = 0; rep < 2; rep++) {
        tg_params_zero_grad(m.ps); /* a step adds to the gradients */
        cr_assert_eq(tg_replicas_step(r, 1, &x, lstm_loss, &m, NULL), TG_OK, "%s",
                     tg_last_error_message());
        tg_tensor *flat = tg_params_flat_grad(m.ps, TG_F64);
        double *got = tu_values(flat);
        for (int64_t i = 0; i < tg_tensor_numel(flat); i++) {
            cr_assert(fabs(got[i] - want[i]) <= 1e-12, "element %lld: %g vs %g", (long long)i,
                      got[i], want[i]);
            if (first)
                cr_assert(got[i] == first[i], "element %lld: %.17g, then %.17g", (long long)i,
                          first[i], got[i]);
        }
        tg_tensor_release(flat);
        if (first) free(got);
        else first = got;
    }
    free(first);
    free(want);
    tg_tensor_release(x);
    tg_replicas_free(r);
    tg_lstm_cell_free(m.cell);
    tg_lstm_layer_free(m.layer);
    tg_params_free(m.ps);
}

Test(replicas, lstm_gradients_match_the_whole_batch)
{
    check_lstm_replicas(false);
}

Test(replicas, lstm_layer_gradients_match_the_whole_batch_and_repeat_bitwise)
{
    check_lstm_replicas(true);
}

static tg_tensor *fails_on_worker_1(void *ud, const tg_replica_info *info, int n,
                                    tg_tensor *const *in)
{
    if (info->worker == 1) return tg_add(in[0], tg_ones(TG_F64, 1, SHAPE(99)));
    return mlp_loss(ud, info, n, in);
}

static tg_tensor *not_scalar(void *ud, const tg_replica_info *info, int n, tg_tensor *const *in)
{
    const model *m = ud;
    (void)info;
    (void)n;
    return tg_linear_forward(m->l1, in[0]);
}

Test(replicas, errors_name_the_worker_and_change_no_gradient)
{
    model m;
    model_new(&m, TG_F64, 8, 2);
    tg_replicas *r = tg_replicas_new(m.ps, &(tg_replicas_opts){.workers = 2});
    cr_assert(r);
    tg_tensor *in[] = {m.x, m.y};
    /* One good step first: a failing one must leave these. */
    cr_assert_eq(tg_replicas_step(r, 2, in, mlp_loss, &m, NULL), TG_OK);
    double *before = flat_values(m.ps, TG_F64, true);
    cr_assert_eq(tg_replicas_step(r, 2, in, fails_on_worker_1, &m, NULL), TG_ERR_SHAPE);
    tu_expect_message_has("worker 1: ");
    tu_expect_message_has("'add'");
    cr_assert_eq(tg_replicas_step(r, 2, in, not_scalar, &m, NULL), TG_ERR_SEED);
    tu_expect_message_has("worker 0: ");
    double *after = flat_values(m.ps, TG_F64, true);
    cr_assert_eq(memcmp(before, after, (size_t)tg_params_numel(m.ps) * sizeof *after), 0);
    /* Argument errors. */
    cr_assert_eq(tg_replicas_step(NULL, 2, in, mlp_loss, &m, NULL), TG_ERR_NULL);
    cr_assert_eq(tg_replicas_step(r, 2, in, NULL, &m, NULL), TG_ERR_NULL);
    cr_assert_eq(tg_replicas_step(r, 0, in, mlp_loss, &m, NULL), TG_ERR_INVALID);
    cr_assert_eq(tg_replicas_step(r, 2, (tg_tensor *[]){m.x, NULL}, mlp_loss, &m, NULL),
                 TG_ERR_NULL);
    tg_tensor *short_y = tg_narrow(m.y, 0, 0, 3);
    cr_assert_eq(tg_replicas_step(r, 2, (tg_tensor *[]){m.x, short_y}, mlp_loss, &m, NULL),
                 TG_ERR_SHAPE);
    tu_expect_message_has("input 1 has 3 rows, input 0 has 8");
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *xt = tg_detach(m.x);
    tg_requires_grad(tape, xt);
    cr_assert_eq(tg_replicas_step(r, 2, (tg_tensor *[]){xt, m.y}, mlp_loss, &m, NULL),
                 TG_ERR_INVALID);
    cr_assert_null(tg_replicas_new(m.ps, &(tg_replicas_opts){.workers = 0}));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    cr_assert_null(tg_replicas_new(NULL, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
    /* Still usable. */
    tg_error_clear();
    tg_params_zero_grad(m.ps);
    cr_assert_eq(tg_replicas_step(r, 2, in, mlp_loss, &m, NULL), TG_OK, "%s",
                 tg_last_error_message());
    tg_tape_free(tape);
    tg_tensor_release(xt);
    tg_tensor_release(short_y);
    free(before);
    free(after);
    tg_replicas_free(r);
    model_free(&m);
}

Test(replicas, two_workers_train_as_one)
{
    /* Adam steps on the same batches: the parameters stay within rounding
     * of the single-worker run. */
    model a, b;
    model_new(&a, TG_F64, 32, 21);
    model_new(&b, TG_F64, 32, 21);
    tg_optim *oa = tg_optim_new(a.ps, &(tg_optim_opts){.kind = TG_OPTIM_ADAM, .lr = 1e-2,
                                                       .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8});
    tg_optim *ob = tg_optim_new(b.ps, &(tg_optim_opts){.kind = TG_OPTIM_ADAM, .lr = 1e-2,
                                                       .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8});
    tg_replicas *ra = tg_replicas_new(a.ps, NULL);
    tg_replicas *rb = tg_replicas_new(b.ps, &(tg_replicas_opts){.workers = 2});
    double first = 0, last = 0;
    for (int s = 0; s < 20; s++) {
        double la, lb;
        tg_optim_zero_grad(oa);
        tg_optim_zero_grad(ob);
        cr_assert_eq(tg_replicas_step(ra, 2, (tg_tensor *[]){a.x, a.y}, mlp_loss, &a, &la), TG_OK);
        cr_assert_eq(tg_replicas_step(rb, 2, (tg_tensor *[]){b.x, b.y}, mlp_loss, &b, &lb), TG_OK);
        cr_assert(fabs(la - lb) <= 1e-10, "step %d: loss %g vs %g", s, la, lb);
        cr_assert_eq(tg_optim_step(oa), TG_OK);
        cr_assert_eq(tg_optim_step(ob), TG_OK);
        if (s == 0) first = la;
        last = la;
    }
    cr_assert(last < 0.8 * first, "trains: %g -> %g", first, last);
    double *pa = flat_values(a.ps, TG_F64, false), *pb = flat_values(b.ps, TG_F64, false);
    for (int64_t i = 0; i < tg_params_numel(a.ps); i++)
        cr_assert(fabs(pa[i] - pb[i]) <= 1e-9, "parameter %lld", (long long)i);
    free(pa);
    free(pb);
    tg_replicas_free(ra);
    tg_replicas_free(rb);
    tg_optim_free(oa);
    tg_optim_free(ob);
    model_free(&a);
    model_free(&b);
}

/* The optimizer's update fused into the replicas' reduce (each block
 * updated as soon as it is summed): the bits of tg_optim_step, for every
 * optimizer, both float types, and parameters of one reduce block and of
 * several (hidden 300: fc1 has 3600 weights), each split across the 3
 * workers at an element that is not a block's. */
Test(replicas, fused_optimizer_update_gives_the_bits_of_optim_step)
{
    const tg_dtype dts[2] = {TG_F32, TG_F64};
    const int64_t widths[2] = {16, 300};
    for (int c = 0; c < 8; c++)
        for (int kind = 0; kind < TG_OPTIM_KIND_COUNT; kind++) {
            tg_dtype dt = dts[c % 2];
            hidden = widths[c / 2 % 2];
            /* 3 workers sum whole gradients; 2 defer the weights'. */
            int nw = c < 4 ? 3 : 2;
            model a, b;
            model_new(&a, dt, 48, 31);
            model_new(&b, dt, 48, 31);
            tg_optim_opts o = tg_optim_defaults((tg_optim_kind)kind);
            o.lr = 1e-2;
            o.momentum = kind == TG_OPTIM_SGD ? 0.9 : 0;
            tg_optim *oa = tg_optim_new(a.ps, &o), *ob = tg_optim_new(b.ps, &o);
            tg_replicas *ra = tg_replicas_new(a.ps, &(tg_replicas_opts){.workers = nw,
                                                                         .optim = oa});
            tg_replicas *rb = tg_replicas_new(b.ps, &(tg_replicas_opts){.workers = nw});
            cr_assert(ra && rb, "%s", tg_last_error_message());
            for (int s = 0; s < 4; s++) {
                tg_optim_zero_grad(oa);
                tg_optim_zero_grad(ob);
                cr_assert_eq(tg_replicas_step(ra, 2, (tg_tensor *[]){a.x, a.y}, mlp_loss, &a,
                                              NULL),
                             TG_OK, "%s", tg_last_error_message());
                cr_assert_eq(tg_replicas_step(rb, 2, (tg_tensor *[]){b.x, b.y}, mlp_loss, &b,
                                              NULL),
                             TG_OK);
                cr_assert_eq(tg_replicas_last_deferred(ra) + tg_replicas_last_refused(ra),
                             nw == 2 ? 2 : 0);
                cr_assert(!tg_replicas_last_refused(ra) || !refusals_fail());
                cr_assert_eq(tg_optim_step(ob), TG_OK);
            }
            cr_assert_eq(tg_optim_step_count(oa), 4);
            int64_t n = tg_params_numel(a.ps);
            for (int grad = 0; grad < 2; grad++) {
                double *pa = flat_values(a.ps, dt, grad), *pb = flat_values(b.ps, dt, grad);
                cr_assert_eq(memcmp(pa, pb, (size_t)n * sizeof *pa), 0,
                             "kind %d, %s, hidden %lld: the %s differ", kind,
                             tg_dtype_name(dt), (long long)hidden,
                             grad ? "gradients" : "parameters");
                free(pa);
                free(pb);
            }
            tg_replicas_free(ra);
            tg_replicas_free(rb);
            /* An optimizer over another set is refused. */
            cr_assert_null(tg_replicas_new(a.ps, &(tg_replicas_opts){.workers = 2, .optim = ob}));
            cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
            tg_error_clear();
            tg_optim_free(oa);
            tg_optim_free(ob);
            model_free(&a);
            model_free(&b);
        }
    hidden = 16;
}
