/* dp.c - `tapegrad bench dp`: data-parallel training throughput on worker
 * threads (tg_replicas), in samples per second, for the mlp and the lstm
 * (cell by cell, and as the layer: one lstm op for the sequence).
 * Each round times, interleaved:
 *   plain    one tape, tg_backward, 1 thread (the ordinary loop)
 *   1w       tg_replicas_step with 1 worker, 1 thread
 *   1w+blas  1 worker, OpenBLAS and the pool at every cpu (tg_set_num_threads)
 *   Nw       N workers (2..--workers), one thread each
 *   N apart  N independent trainers side by side (--workers of them), each
 *            with its own copy of the model, tape and optimizer, training
 *            on its shard of the batch with the plain loop: no sharing and
 *            no reduce, so their throughput is what N cores give N shards
 *            on this machine, the ceiling of N workers
 * Every step is zero_grad + forward + backward (+ reduce) + an SGD step
 * (fused into the reduce for the replicas: tg_replicas_opts.optim).
 * With N > 1 the mlp's weight gradients are made in the reduce, from the
 * workers' activations (replicas.h), so its reduce share includes them.
 * Ratios are medians of per-round ratios to 1w. Before timing, the N-worker
 * gradient is checked against the 1-worker one. The MPI counterpart runs
 * under mpirun (`tapegrad bench dp --mpi`, dist.c). */
#define _GNU_SOURCE /* pthread_setaffinity_np: the per-core rounds */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define DP_MAX_VARIANTS 8

typedef struct dp_model {
    const char *name, *desc;
    int64_t batch;
    tg_params *ps;
    tg_linear *fc[3];
    tg_lstm_cell *cell;
    tg_lstm_layer *seq;
    tg_tensor *x, *y; /* y: labels (mlp) or NULL */
} dp_model;

/* mlp: the suite's 784-512-512-10 ReLU MLP, batch 128, cross-entropy.
 * lstm: the suite's cell 32 -> 128 over 32 steps, batch 32, x stored
 * (B, T*I) so the batch is dim 0; loss mean(h^2 + c^2) / 2.
 * lstm-seq: the same model as tg_lstm_layer (the same parameters and
 * draws), all 32 steps one lstm op on x seen as (T, B, I). */
enum { DP_MLP, DP_LSTM, DP_LSTM_SEQ };

#define DP_T 32
#define DP_I 32
#define DP_H 128

static tg_tensor *dp_loss(void *ud, const tg_replica_info *info, int n, tg_tensor *const *in)
{
    const dp_model *m = ud;
    (void)n;
    if (m->seq) {
        tg_tensor *x = tg_reshape(in[0], 3, (int64_t[]){info->rows, DP_T, DP_I}), *h, *c;
        if (tg_lstm_layer_forward(m->seq, tg_transpose(x, 0, 1), NULL, NULL, NULL, &h, &c))
            return NULL;
        return tg_mul_scalar(tg_add(tg_mean(tg_mul(h, h)), tg_mean(tg_mul(c, c))), 0.5);
    }
    if (!m->cell) {
        tg_tensor *h = tg_relu(tg_linear_forward(m->fc[0], in[0]));
        h = tg_relu(tg_linear_forward(m->fc[1], h));
        return tg_cross_entropy(tg_linear_forward(m->fc[2], h), in[1]);
    }
    int64_t b = info->rows;
    tg_tensor *h = tg_zeros(TG_F32, 2, (int64_t[]){b, DP_H}),
              *c = tg_zeros(TG_F32, 2, (int64_t[]){b, DP_H});
    for (int t = 0; t < DP_T && h; t++) {
        tg_tensor *xt = tg_narrow(in[0], 1, (int64_t)t * DP_I, DP_I);
        if (tg_lstm_cell_forward(m->cell, xt, h, c, &h, &c)) return NULL;
    }
    return tg_mul_scalar(tg_add(tg_mean(tg_mul(h, h)), tg_mean(tg_mul(c, c))), 0.5);
}

static void dp_model_free(dp_model *m)
{
    for (int i = 0; i < 3; i++) tg_linear_free(m->fc[i]);
    tg_lstm_cell_free(m->cell);
    tg_lstm_layer_free(m->seq);
    tg_tensor_release(m->x);
    tg_tensor_release(m->y);
    tg_params_free(m->ps);
}

static int dp_model_new(dp_model *m, int kind, int64_t batch, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    tg_rng rng;
    tg_rng_seed(&rng, 77);
    m->ps = tg_params_new();
    bool ok = m->ps != NULL;
    if (kind == DP_MLP) {
        m->name = "mlp";
        m->desc = "784-512-512-10 ReLU, cross-entropy";
        m->batch = BENCH_MLP_BATCH;
        const int *d = bench_mlp_dims;
        for (int i = 0; i < 3 && ok; i++) {
            char name[8] = {'f', 'c', (char)('1' + i), 0};
            ok = (m->fc[i] = tg_linear_new(m->ps, name, d[i], d[i + 1], true, TG_F32, &rng));
        }
        if (ok) ok = (m->x = tg_rand_normal(&rng, TG_F32, 2, (int64_t[]){m->batch, d[0]}, 0, 1));
        tg_tensor *u = ok ? tg_rand_uniform(&rng, TG_F64, 1, (int64_t[]){m->batch}, 0, d[3] - 1e-9)
                          : NULL;
        if (ok) ok = u && (m->y = tg_cast(u, TG_I64));
        tg_tensor_release(u);
    } else {
        bool seq = kind == DP_LSTM_SEQ;
        m->name = seq ? "lstm-seq" : "lstm";
        m->desc = seq ? "LSTM layer 32->128 (one lstm op), 32 steps, mean(h^2+c^2)/2"
                      : "LSTM cell 32->128, 32 steps, mean(h^2+c^2)/2";
        m->batch = batch;
        if (seq)
            ok = ok && (m->seq = tg_lstm_layer_new(m->ps, "lstm", DP_I, DP_H, TG_F32, &rng));
        else
            ok = ok && (m->cell = tg_lstm_cell_new(m->ps, "lstm", DP_I, DP_H, TG_F32, &rng));
        if (ok)
            ok = (m->x = tg_rand_normal(&rng, TG_F32, 2, (int64_t[]){m->batch, DP_T * DP_I}, 0, 1));
    }
    if (!ok) {
        dp_model_free(m);
        return bench_lib_fail(err, errlen, "dp model");
    }
    return 0;
}

/* One of the independent trainers of the `N apart` variant. Trainer 0
 * runs on the timing thread; the others each on a thread of their own
 * that lives as long as the trainers (so that, like a replica worker, it
 * keeps its per-thread caches from one sample to the next). */
typedef struct dp_trainer {
    dp_model m;
    tg_optim *opt;
    tg_tape *tape;
    tg_tensor *in[2]; /* its shard of the batch (views), in[1] NULL for the lstm */
    int64_t rows;
    tg_status st;
    pthread_t thread;
    bool started;
    struct dp_apart *set;
} dp_trainer;

/* The handshake between the timing thread and the trainers' threads. */
typedef struct dp_apart {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t round;   /* bumped to start a sample */
    long reps;        /* steps per trainer in this sample */
    int pending;      /* trainers' threads still running this sample */
    bool quit;
} dp_apart;

typedef struct dp_ctx {
    dp_model m;
    tg_optim *opt;
    tg_tape *tape;            /* plain */
    tg_replicas *rep[DP_MAX_VARIANTS]; /* by worker count */
    int nvar;
    int workers[DP_MAX_VARIANTS], threads[DP_MAX_VARIANTS];
    bool plain[DP_MAX_VARIANTS], apart[DP_MAX_VARIANTS];
    dp_trainer *tr; /* the `N apart` variant's trainers, ntr of them */
    int ntr;
    dp_apart apart_sync;
    double reduce_s[DP_MAX_VARIANTS], compute_s[DP_MAX_VARIANTS];
    int deferred[DP_MAX_VARIANTS]; /* weights made in the reduce (last step) */
    int refused[DP_MAX_VARIANTS];  /* weights that could not be (the BLAS's rounding) */
    long steps[DP_MAX_VARIANTS];
} dp_ctx;

static int dp_inputs(const dp_ctx *c, tg_tensor **in)
{
    in[0] = c->m.x;
    in[1] = c->m.y;
    return c->m.y ? 2 : 1;
}

/* One step of the plain loop: zero_grad, forward and backward on one tape,
 * the SGD step. */
static tg_status dp_plain_step(dp_model *m, tg_optim *opt, tg_tape *tape, int64_t rows, int n,
                               tg_tensor *const *in)
{
    tg_optim_zero_grad(opt);
    tg_scope_begin();
    tg_replica_info info = {.workers = 1, .tape = tape, .rows = rows};
    tg_tensor *loss = dp_loss(m, &info, n, in);
    tg_status st = loss ? tg_backward(loss) : tg_last_error();
    tg_scope_end();
    tg_tape_reset(tape);
    return st ? st : tg_optim_step(opt);
}

static tg_status dp_step(dp_ctx *c, int v)
{
    tg_tensor *in[2];
    int n = dp_inputs(c, in);
    if (c->plain[v]) return dp_plain_step(&c->m, c->opt, c->tape, c->m.batch, n, in);
    tg_optim_zero_grad(c->opt);
    /* The optimizer's update is fused into the replicas' reduce. */
    tg_status st = tg_replicas_step(c->rep[v], n, in, dp_loss, &c->m, NULL);
    double comp, red;
    tg_replicas_last_timing(c->rep[v], &comp, &red);
    c->deferred[v] = tg_replicas_last_deferred(c->rep[v]);
    c->refused[v] = tg_replicas_last_refused(c->rep[v]);
    c->compute_s[v] += comp;
    c->reduce_s[v] += red;
    c->steps[v]++;
    return st;
}

/* reps plain-loop steps of one independent trainer. */
static void dp_trainer_steps(dp_trainer *t, long reps)
{
    t->st = TG_OK;
    int n = t->in[1] ? 2 : 1;
    for (long i = 0; i < reps && !t->st; i++)
        t->st = dp_plain_step(&t->m, t->opt, t->tape, t->rows, n, t->in);
}

/* A trainer's thread: one sample per round, until quit. */
static void *dp_trainer_main(void *arg)
{
    dp_trainer *t = arg;
    dp_apart *a = t->set;
    uint64_t seen = 0; /* the thread count is the sample's (dp_sample sets it: global) */
    for (;;) {
        pthread_mutex_lock(&a->mu);
        while (!a->quit && a->round == seen) pthread_cond_wait(&a->go, &a->mu);
        if (a->quit) {
            pthread_mutex_unlock(&a->mu);
            return NULL;
        }
        seen = a->round;
        long reps = a->reps;
        pthread_mutex_unlock(&a->mu);
        dp_trainer_steps(t, reps);
        pthread_mutex_lock(&a->mu);
        if (--a->pending == 0) pthread_cond_signal(&a->done);
        pthread_mutex_unlock(&a->mu);
    }
}

/* The `N apart` variant: every trainer runs reps steps at once, trainer 0
 * on this thread. */
static int dp_sample_apart(dp_ctx *c, long reps)
{
    dp_apart *a = &c->apart_sync;
    pthread_mutex_lock(&a->mu);
    a->reps = reps;
    a->pending = c->ntr - 1;
    a->round++;
    pthread_cond_broadcast(&a->go);
    pthread_mutex_unlock(&a->mu);
    dp_trainer_steps(&c->tr[0], reps);
    pthread_mutex_lock(&a->mu);
    while (a->pending > 0) pthread_cond_wait(&a->done, &a->mu);
    pthread_mutex_unlock(&a->mu);
    for (int k = 0; k < c->ntr; k++)
        if (c->tr[k].st) return -1;
    return 0;
}

static int dp_sample(void *ctx, int v, long reps)
{
    dp_ctx *c = ctx;
    if (tg_set_num_threads(c->threads[v])) return -1;
    if (c->apart[v]) return dp_sample_apart(c, reps);
    for (long i = 0; i < reps; i++)
        if (dp_step(c, v)) return -1;
    return 0;
}

/* The trainers of the `N apart` variant: n copies of the model (the same
 * seed, so the same parameters), each with the rows a worker of n would
 * get, and the threads of trainers 1..n-1. */
static int dp_trainers_new(dp_ctx *c, int kind, int n)
{
    dp_apart *a = &c->apart_sync;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->go, NULL);
    pthread_cond_init(&a->done, NULL);
    c->tr = calloc((size_t)n, sizeof *c->tr);
    if (!c->tr) return -1;
    c->ntr = n;
    char err[256];
    for (int k = 0; k < n; k++) {
        dp_trainer *t = &c->tr[k];
        t->set = a;
        if (dp_model_new(&t->m, kind, c->m.batch, err, sizeof err)) return -1;
        int64_t r0 = c->m.batch * k / n;
        t->rows = c->m.batch * (k + 1) / n - r0;
        t->opt = tg_optim_new(t->m.ps, &(tg_optim_opts){.kind = TG_OPTIM_SGD, .lr = 1e-6});
        t->tape = tg_tape_new(NULL);
        t->in[0] = tg_narrow(t->m.x, 0, r0, t->rows);
        t->in[1] = t->m.y ? tg_narrow(t->m.y, 0, r0, t->rows) : NULL;
        if (!t->opt || !t->tape || !t->in[0] || (t->m.y && !t->in[1]) ||
            tg_params_requires_grad(t->m.ps, t->tape))
            return -1;
        if (k > 0) {
            if (pthread_create(&t->thread, NULL, dp_trainer_main, t)) return -1;
            t->started = true;
        }
    }
    return 0;
}

static void dp_trainers_free(dp_ctx *c)
{
    if (!c->tr) return;
    dp_apart *a = &c->apart_sync;
    pthread_mutex_lock(&a->mu);
    a->quit = true;
    pthread_cond_broadcast(&a->go);
    pthread_mutex_unlock(&a->mu);
    for (int k = 0; k < c->ntr; k++) {
        dp_trainer *t = &c->tr[k];
        if (t->started) pthread_join(t->thread, NULL);
        tg_tensor_release(t->in[0]);
        tg_tensor_release(t->in[1]);
        tg_tape_free(t->tape);
        tg_optim_free(t->opt);
        dp_model_free(&t->m);
    }
    free(c->tr);
    c->tr = NULL;
    c->ntr = 0;
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->go);
    pthread_cond_destroy(&a->done);
}

/* 1 worker with the calling thread (where a 1-worker step runs) pinned to
 * cpu `cpu`: the per-core rounds. */
static int dp_sample_on(void *ctx, int cpu, long reps)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set)) return -1;
    return dp_sample(ctx, 1, reps);
}

/* The 1-worker step pinned to each cpu in turn, in interleaved rounds: on a
 * machine whose cores run at different speeds (this VM's do, and which one
 * is slower changes), N workers are held to the slowest core's pace. Prints
 * the per-core medians and what the slowest core alone leaves of N times
 * the fastest core's throughput. The thread's affinity is restored. */
static void dp_per_core(dp_ctx *c, int ncpu, int workers, bool quick)
{
    enum { MAX_CPUS = 8 };
    cpu_set_t saved;
    if (ncpu > MAX_CPUS) ncpu = MAX_CPUS;
    if (pthread_getaffinity_np(pthread_self(), sizeof saved, &saved)) return;
    int cpus[MAX_CPUS], n = 0;
    for (int k = 0; k < ncpu; k++)
        if (CPU_ISSET(k, &saved)) cpus[n++] = k;
    if (n < 2) {
        printf("  1 worker pinned: this process may use one CPU only\n");
        return;
    }
    int runs = quick ? 3 : 7;
    long reps[MAX_CPUS];
    double *t[MAX_CPUS] = {0};
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        ok = (t[i] = calloc((size_t)runs, sizeof(double))) != NULL &&
             !bench_calibrate(dp_sample_on, c, cpus[i], quick ? 2e6 : 2e7, &reps[i]);
    }
    if (ok) ok = !bench_rounds(dp_sample_on, c, n, cpus, reps, 1, runs, t);
    pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);
    if (!ok)
        printf("  1 worker pinned: could not time it (%s)\n",
               tg_last_error() ? tg_last_error_message() : "pinning the thread failed");
    if (ok) {
        double fast = INFINITY, slow = 0;
        printf("  1 worker pinned:");
        for (int i = 0; i < n; i++) {
            double ms = bench_stat_of(t[i], runs).median / 1e6;
            printf("%s cpu %d %.3f ms/step", i ? "," : "", cpus[i], ms);
            fast = fmin(fast, ms);
            slow = fmax(slow, ms);
        }
        int w = workers < n ? workers : n;
        printf("; the slowest core caps %d workers at %.2fx of 1 worker on the fastest\n", w,
               w * fast / slow);
    }
    for (int i = 0; i < n; i++) free(t[i]);
}

/* Sample of the batch-size bound: 0, the plain loop on the whole batch;
 * 1, trainer 0 of the `N apart` set alone, on a worker's rows. */
static int dp_sample_alone(void *ctx, int which, long reps)
{
    dp_ctx *c = ctx;
    if (which == 0) return dp_sample(ctx, 0, reps);
    dp_trainer_steps(&c->tr[0], reps);
    return c->tr[0].st ? -1 : 0;
}

/* What the batch's split leaves of N workers' speed-up before they share a
 * machine: one trainer alone on a worker's rows (B / N) against the plain
 * loop on the whole batch B, in interleaved rounds. A step's fixed costs
 * (per op, and per GEMM call: OpenBLAS packs the weight operand on every
 * call, whatever the rows) do not shrink with the rows, so N workers reach
 * at most t(B) / t(B / N) of 1, and two trainers apart (the ceiling) less
 * where they contend for the machine. */
static void dp_alone(dp_ctx *c, int workers, bool quick)
{
    int runs = quick ? 3 : 7, which[2] = {0, 1};
    long reps[2];
    double *t[2] = {calloc((size_t)runs, sizeof(double)), calloc((size_t)runs, sizeof(double))};
    bool ok = t[0] && t[1];
    for (int i = 0; i < 2 && ok; i++)
        ok = !bench_calibrate(dp_sample_alone, c, i, quick ? 2e6 : 2e7, &reps[i]);
    if (ok) ok = !bench_rounds(dp_sample_alone, c, 2, which, reps, 1, runs, t);
    if (!ok) {
        printf("  1 trainer alone: could not time it (%s)\n",
               tg_last_error() ? tg_last_error_message() : "out of memory");
    } else {
        double whole = bench_stat_of(t[0], runs).median / 1e6;
        double part = bench_stat_of(t[1], runs).median / 1e6;
        printf("  1 trainer alone on %lld rows: %.3f ms/step against %.3f on %lld; the split "
               "caps %d workers at %.2fx of 1\n",
               (long long)c->tr[0].rows, part, whole, (long long)c->m.batch, workers, whole / part);
    }
    free(t[0]);
    free(t[1]);
}

/* The largest |g - ref| over n values, relative to the largest |ref|. */
static double dp_worst_diff(const float *ref, const float *g, int64_t n)
{
    double gmax = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) gmax = fmax(gmax, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(g[i] - ref[i]) / fmax(gmax, 1e-30));
    return worst;
}

/* The flat gradient of one replica step of variant v (caller frees). */
static float *dp_grad(dp_ctx *c, int v, int64_t *n)
{
    tg_tensor *in[2];
    int k = dp_inputs(c, in);
    tg_optim_zero_grad(c->opt);
    if (tg_set_num_threads(c->threads[v]) ||
        tg_replicas_step(c->rep[v], k, in, dp_loss, &c->m, NULL))
        return NULL;
    tg_tensor *g = tg_params_flat_grad(c->m.ps, TG_F32);
    float *out = g ? bench_copy_f32(g) : NULL;
    *n = g ? tg_tensor_numel(g) : 0;
    tg_tensor_release(g);
    return out;
}

static int dp_run(int kind, int64_t batch, int max_workers, bool quick)
{
    dp_ctx c = {0};
    char err[512] = "";
    int rc = 1;
    int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu < 1) ncpu = 1;
    if (dp_model_new(&c.m, kind, batch, err, sizeof err)) {
        fprintf(stderr, "tapegrad bench dp: %s\n", err);
        return 1;
    }
    c.opt = tg_optim_new(c.m.ps, &(tg_optim_opts){.kind = TG_OPTIM_SGD, .lr = 1e-6});
    c.tape = tg_tape_new(NULL);
    bool ok = c.opt && c.tape && !tg_params_requires_grad(c.m.ps, c.tape);
    /* Variants: plain, 1w, 1w+blas (when there are several cpus), 2w.. */
    c.plain[c.nvar] = true, c.workers[c.nvar] = 1, c.threads[c.nvar++] = 1;
    c.workers[c.nvar] = 1, c.threads[c.nvar++] = 1;
    if (ncpu > 1) c.workers[c.nvar] = 1, c.threads[c.nvar++] = ncpu;
    for (int w = 2; w <= max_workers && c.nvar < DP_MAX_VARIANTS - 1; w++)
        c.workers[c.nvar] = w, c.threads[c.nvar++] = 1;
    if (max_workers > 1) {
        c.apart[c.nvar] = true, c.workers[c.nvar] = max_workers, c.threads[c.nvar++] = 1;
        ok = ok && !dp_trainers_new(&c, kind, max_workers);
    }
    for (int v = 0; v < c.nvar && ok; v++)
        if (!c.plain[v] && !c.apart[v])
            ok = (c.rep[v] = tg_replicas_new(c.m.ps, &(tg_replicas_opts){.workers = c.workers[v],
                                                                         .optim = c.opt}));
    if (!ok) {
        fprintf(stderr, "tapegrad bench dp: setup: %s\n", tg_last_error_message());
        goto out;
    }
    /* Check: every variant's gradient against 1 worker's. */
    int64_t n = 0, n2 = 0;
    tg_optim_set_lr(c.opt, 0); /* the fused update leaves the parameters as they are */
    float *g1 = dp_grad(&c, 1, &n);
    double worst = 0;
    for (int v = 2; v < c.nvar && g1; v++) {
        if (c.apart[v]) continue;
        float *g = dp_grad(&c, v, &n2);
        if (!g || n2 != n) {
            free(g);
            free(g1);
            g1 = NULL;
            break;
        }
        worst = fmax(worst, dp_worst_diff(g1, g, n));
        free(g);
    }
    if (!g1 || worst > 1e-4) {
        fprintf(stderr, "tapegrad bench dp: %s: gradient check failed (%s; worst %.3g)\n",
                c.m.name, g1 ? "mismatch" : tg_last_error_message(), worst);
        free(g1);
        goto out;
    }
    free(g1);
    tg_optim_set_lr(c.opt, 1e-6);
    /* Two sets of interleaved rounds: every variant on one thread per
     * worker, then 1 worker against 1 worker with OpenBLAS threads. Kept
     * apart because OpenBLAS's threads spin (sched_yield) for a while
     * after their last call, taking a core from the next variant. */
    int set[2][DP_MAX_VARIANTS], nset[2] = {0, 0};
    set[0][nset[0]++] = 1; /* the reference first: 1 worker */
    for (int v = 0; v < c.nvar; v++)
        if (c.threads[v] == 1 && v != 1) set[0][nset[0]++] = v;
    set[1][nset[1]++] = 1;
    for (int v = 0; v < c.nvar; v++)
        if (c.threads[v] > 1) set[1][nset[1]++] = v;
    int runs = quick ? 3 : 11; /* at most 64 (the ratio array) */
    double *t[DP_MAX_VARIANTS] = {0}, ratio_of[DP_MAX_VARIANTS] = {0};
    bench_stat stat_of[DP_MAX_VARIANTS];
    bool mem = true;
    for (int v = 0; v < c.nvar; v++) mem &= (t[v] = calloc((size_t)runs, sizeof(double))) != NULL;
    for (int k = 0; k < 2 && mem && nset[k] > 1; k++) {
        long reps[DP_MAX_VARIANTS];
        double *tk[DP_MAX_VARIANTS];
        nanosleep(&(struct timespec){.tv_nsec = 300000000}, NULL);
        for (int i = 0; i < nset[k]; i++) {
            tk[i] = t[set[k][i]];
            if (bench_calibrate(dp_sample, &c, set[k][i], quick ? 2e6 : 5e7, &reps[i])) {
                fprintf(stderr, "tapegrad bench dp: calibration: %s\n", tg_last_error_message());
                goto out;
            }
        }
        for (int i = 0; i < nset[k]; i++) {
            int v = set[k][i];
            c.compute_s[v] = c.reduce_s[v] = 0;
            c.steps[v] = 0;
        }
        if (bench_rounds(dp_sample, &c, nset[k], set[k], reps, 1, runs, tk)) {
            fprintf(stderr, "tapegrad bench dp: timing: %s\n", tg_last_error_message());
            goto out;
        }
        for (int i = 0; i < nset[k]; i++) {
            double ratio[64];
            for (int r = 0; r < runs; r++) ratio[r] = tk[0][r] / tk[i][r];
            int v = set[k][i];
            if (k == 1 && i == 0) continue; /* 1 worker: reported from the first set */
            ratio_of[v] = bench_median(ratio, runs);
            stat_of[v] = bench_stat_of(tk[i], runs);
        }
    }
    if (!mem) {
        fprintf(stderr, "tapegrad bench dp: out of memory\n");
        goto out;
    }
    printf("%-5s batch %lld: %s; check: worst gradient difference %.2g of max |g|\n", c.m.name,
           (long long)c.m.batch, c.m.desc, worst);
    for (int v = 0; v < c.nvar; v++) {
        char what[32];
        if (c.plain[v])
            snprintf(what, sizeof what, "plain tape");
        else if (c.apart[v])
            snprintf(what, sizeof what, "%d apart, 1 thr", c.workers[v]);
        else
            snprintf(what, sizeof what, "%d worker%s, %d thr", c.workers[v],
                     c.workers[v] > 1 ? "s" : "", c.threads[v]);
        double red = c.steps[v] ? 100.0 * c.reduce_s[v] / (c.compute_s[v] + c.reduce_s[v]) : 0;
        printf("  %-20s %10.3f ms/step %10.0f samples/s %7.2fx", what, stat_of[v].median / 1e6,
               (double)c.m.batch / (stat_of[v].median / 1e9), ratio_of[v]);
        if (!c.plain[v] && !c.apart[v]) printf("   reduce+update %4.1f%%", red);
        if (!c.plain[v] && !c.apart[v] && c.deferred[v])
            printf(" (with %d weight gradient%s made in it)", c.deferred[v],
                   c.deferred[v] > 1 ? "s" : "");
        if (!c.plain[v] && !c.apart[v] && c.refused[v])
            printf(" (%d weight gradient%s not made in it: this BLAS's chained GEMMs round "
                   "differently)", c.refused[v], c.refused[v] > 1 ? "s" : "");
        if (c.apart[v]) {
            /* What the workers of the same count reach of it. */
            double of = 0;
            for (int u = 0; u < c.nvar; u++)
                if (!c.plain[u] && !c.apart[u] && c.threads[u] == 1 &&
                    c.workers[u] == c.workers[v] && ratio_of[v] > 0)
                    of = ratio_of[u] / ratio_of[v];
            printf("   (the ceiling: no sharing, no reduce; %d workers reach %.0f%% of it)",
                   c.workers[v], 100 * of);
        }
        printf("%s\n", c.threads[v] > 1 ? "  (own rounds against 1 worker)" : "");
    }
    if (max_workers > 1) {
        tg_set_num_threads(1);
        dp_alone(&c, max_workers, quick);
        dp_per_core(&c, ncpu, max_workers, quick);
    }
    rc = 0;
out:
    for (int v = 0; v < c.nvar; v++) free(t[v]);
    for (int v = 0; v < c.nvar; v++) tg_replicas_free(c.rep[v]);
    dp_trainers_free(&c);
    tg_optim_free(c.opt);
    tg_tape_free(c.tape);
    dp_model_free(&c.m);
    return rc;
}

int bench_dp_cli(const bench_opts *o, int max_workers)
{
    bench_env env;
    bench_env_get(&env);
    bench_print_env(stdout, &env);
    int prev = tg_num_threads();
    printf("data-parallel train steps on worker threads (tg_replicas): zero_grad, forward,\n"
           "backward, reduce, SGD step; median over interleaved rounds; ratios are the\n"
           "throughput against 1 worker on 1 thread in the same rounds%s\n\n",
           o->quick ? " (quick: not a measurement)" : "");
    /* The lstm (cell by cell, and as one lstm op) at the suite's batch of
     * 32, and at 128, where each worker's ops have four times the rows over
     * the same fixed cost per op. */
    int failed = dp_run(DP_MLP, BENCH_MLP_BATCH, max_workers, o->quick);
    for (int b = 32; b <= 128; b *= 4)
        failed += dp_run(DP_LSTM, b, max_workers, o->quick) +
                  dp_run(DP_LSTM_SEQ, b, max_workers, o->quick);
    tg_set_num_threads(prev);
    return failed ? 1 : 0;
}

/* ---- `tapegrad bench dp --mpi`, under mpirun: the same models across MPI
 * ranks (tg_dist). Each round times, on every rank in step:
 *   1 process  rank 0 alone, the whole global batch on the plain loop
 *              (the others wait at the closing barrier)
 *   N ranks    a shard each, tg_dist_backward without overlap (every
 *              bucket all-reduced after the backward)
 *   N overlap  the same with tg_dist_attach: buckets start during the sweep
 * A sample is reps steps between two barriers; rank 0 reports. The
 * all-reduce time is what the no-overlap steps wait after their backward;
 * the overlap fraction is the share of it the overlapped steps hide. */
#ifdef TG_HAVE_MPI
#include <tapegrad/dist.h>

enum { DPM_ALONE, DPM_SYNC, DPM_OVERLAP, DPM_NVAR };

typedef struct dpm_ctx {
    dp_model m;
    tg_optim *opt;
    tg_tape *tape;
    tg_dist *d;
    int rank, size;
    tg_tensor *shard[2]; /* this rank's rows of x and y */
    int64_t rows;
    tg_dist_stats sum[DPM_NVAR];
    long steps[DPM_NVAR];
} dpm_ctx;

static tg_status dpm_step(dpm_ctx *c, int v)
{
    tg_optim_zero_grad(c->opt);
    tg_scope_begin();
    tg_status st;
    if (v == DPM_ALONE) {
        tg_tensor *in[2] = {c->m.x, c->m.y};
        tg_replica_info info = {.workers = 1, .tape = c->tape, .rows = c->m.batch};
        tg_tensor *loss = dp_loss(&c->m, &info, c->m.y ? 2 : 1, in);
        st = loss ? tg_backward(loss) : tg_last_error();
    } else {
        tg_replica_info info = {.workers = 1, .tape = c->tape, .rows = c->rows};
        tg_tensor *loss = dp_loss(&c->m, &info, c->m.y ? 2 : 1, c->shard);
        st = tg_dist_backward(c->d, loss);
        tg_dist_stats s;
        if (!st && !tg_dist_last_stats(c->d, &s)) {
            c->sum[v].allreduce_s += s.allreduce_s;
            c->sum[v].exposed_s += s.exposed_s;
            c->sum[v].backward_s += s.backward_s;
            c->sum[v].bytes = s.bytes;
            c->sum[v].buckets = s.buckets;
            c->steps[v]++;
        }
    }
    tg_scope_end();
    tg_tape_reset(c->tape);
    return st ? st : tg_optim_step(c->opt);
}

/* The overlap on or off: the tape's gradient-ready function is tg_dist's
 * (tg_dist_attach) or none, and then every bucket starts after the sweep. */
static tg_status dpm_mode(dpm_ctx *c, int v)
{
    if (v == DPM_OVERLAP) return tg_dist_attach(c->d, c->m.ps, c->tape);
    return tg_tape_set_grad_ready(c->tape, NULL, NULL);
}

/* One sample of v on every rank: reps steps between two barriers; the
 * ns per step as rank 0 saw it (-1 on failure, agreed). */
static double dpm_sample(dpm_ctx *c, int v, long reps)
{
    int bad = dpm_mode(c, v) != TG_OK;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = bench_now_ns();
    if (v != DPM_ALONE || c->rank == 0)
        for (long i = 0; i < reps && !bad; i++) bad = dpm_step(c, v) != TG_OK;
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    double t1 = bench_now_ns();
    return bad ? -1 : (t1 - t0) / (double)reps;
}

/* The flat gradient of one step of v with the learning rate at 0 (caller
 * frees). */
static float *dpm_grad(dpm_ctx *c, int v, int64_t *n)
{
    tg_optim_set_lr(c->opt, 0);
    float *out = NULL;
    if (dpm_mode(c, v) == TG_OK && dpm_step(c, v) == TG_OK) {
        tg_tensor *g = tg_params_flat_grad(c->m.ps, TG_F32);
        out = g ? bench_copy_f32(g) : NULL;
        *n = g ? tg_tensor_numel(g) : 0;
        tg_tensor_release(g);
    }
    tg_optim_set_lr(c->opt, 1e-6);
    return out;
}

static int dpm_run(int kind, int64_t batch, bool quick, int rank, int size)
{
    dpm_ctx c = {.rank = rank, .size = size};
    char err[512] = "";
    int rc = 1, bad = 0;
    if (dp_model_new(&c.m, kind, batch, err, sizeof err)) {
        fprintf(stderr, "tapegrad bench dp --mpi: rank %d: %s\n", rank, err);
        bad = 1;
    }
    if (!bad) {
        int64_t b = c.m.batch, lo = b * rank / size, hi = b * (rank + 1) / size;
        c.rows = hi - lo;
        c.shard[0] = tg_narrow(c.m.x, 0, lo, c.rows);
        c.shard[1] = c.m.y ? tg_narrow(c.m.y, 0, lo, c.rows) : NULL;
        c.opt = tg_optim_new(c.m.ps, &(tg_optim_opts){.kind = TG_OPTIM_SGD, .lr = 1e-6});
        c.tape = tg_tape_new(NULL);
        bad = !c.shard[0] || (c.m.y && !c.shard[1]) || !c.opt || !c.tape ||
              tg_params_requires_grad(c.m.ps, c.tape) ||
              tg_dist_new(MPI_COMM_WORLD, &(tg_dist_opts){.timeout_s = 120}, &c.d) ||
              tg_dist_broadcast(c.d, c.m.ps, c.opt);
        if (bad) fprintf(stderr, "tapegrad bench dp --mpi: rank %d: setup: %s\n", rank,
                         tg_last_error_message());
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (bad) goto out;
    /* Check: the ranks' averaged gradient against the whole batch's. */
    double worst = 0;
    int64_t n1 = 0, n2 = 0;
    float *g1 = dpm_grad(&c, DPM_ALONE, &n1);
    for (int v = DPM_SYNC; v <= DPM_OVERLAP; v++) {
        float *g = dpm_grad(&c, v, &n2);
        worst = (!g || !g1 || n1 != n2) ? INFINITY : fmax(worst, dp_worst_diff(g1, g, n1));
        free(g);
    }
    free(g1);
    MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (!(worst <= 1e-4)) {
        if (rank == 0)
            fprintf(stderr, "tapegrad bench dp --mpi: %s: gradient check failed (worst %.3g)\n",
                    c.m.name, worst);
        goto out;
    }
    /* Steps per sample from rank 0's warm-up of the slowest variant. */
    double one = 0;
    for (int w = 0; w < 3; w++)
        for (int v = 0; v < DPM_NVAR; v++) {
            double ns = dpm_sample(&c, v, 1);
            if (ns < 0) goto fail;
            if (v == DPM_ALONE) one = ns;
        }
    long reps = (long)((quick ? 5e6 : 6e7) / fmax(one, 1));
    if (reps < 1) reps = 1;
    MPI_Bcast(&reps, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    int runs = quick ? 3 : 11;
    double t[DPM_NVAR][64];
    memset(c.sum, 0, sizeof c.sum);
    memset(c.steps, 0, sizeof c.steps);
    for (int r = 0; r < runs; r++)
        for (int v = 0; v < DPM_NVAR; v++)
            if ((t[v][r] = dpm_sample(&c, v, reps)) < 0) goto fail;
    if (rank == 0) {
        printf("%-5s global batch %lld: %s; check: worst gradient difference %.2g of max |g|\n",
               c.m.name, (long long)c.m.batch, c.m.desc, worst);
        double sync_ar = c.steps[DPM_SYNC] ? c.sum[DPM_SYNC].exposed_s / c.steps[DPM_SYNC] : 0;
        for (int v = 0; v < DPM_NVAR; v++) {
            double ratio[64];
            for (int r = 0; r < runs; r++) ratio[r] = t[DPM_ALONE][r] / t[v][r];
            bench_stat s = bench_stat_of(t[v], runs);
            char what[40];
            if (v == DPM_ALONE)
                snprintf(what, sizeof what, "1 process, plain");
            else
                snprintf(what, sizeof what, "%d rank%s, %s", size, size > 1 ? "s" : "",
                         v == DPM_SYNC ? "no overlap" : "overlap");
            printf("  %-22s %9.3f ms/step %9.0f samples/s %6.2fx", what, s.median / 1e6,
                   (double)c.m.batch / (s.median / 1e9), bench_median(ratio, runs));
            if (v != DPM_ALONE && c.steps[v]) {
                double k = (double)c.steps[v];
                printf("   all-reduce %.3f ms, exposed %.3f ms", c.sum[v].allreduce_s / k * 1e3,
                       c.sum[v].exposed_s / k * 1e3);
                if (v == DPM_OVERLAP && sync_ar > 0)
                    printf(", overlap %.0f%%",
                           100 * fmax(0, 1 - (c.sum[v].exposed_s / k) / sync_ar));
            }
            printf("\n");
        }
        printf("  (%d buckets, %.2f MB per step and rank)\n", c.sum[DPM_OVERLAP].buckets,
               (double)c.sum[DPM_OVERLAP].bytes / 1e6);
    }
    rc = 0;
    goto out;
fail:
    if (rank == 0)
        fprintf(stderr, "tapegrad bench dp --mpi: %s: a step failed: %s\n", c.m.name,
                tg_last_error_message());
out:
    tg_dist_free(c.d);
    tg_tensor_release(c.shard[0]);
    tg_tensor_release(c.shard[1]);
    tg_optim_free(c.opt);
    tg_tape_free(c.tape);
    dp_model_free(&c.m);
    return rc;
}

int bench_dp_mpi_cli(const bench_opts *o)
{
    int inited = 0, rank = 0, size = 1;
    MPI_Initialized(&inited);
    if (!inited && MPI_Init(NULL, NULL) != MPI_SUCCESS) {
        fprintf(stderr, "tapegrad bench dp --mpi: MPI_Init failed\n");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int prev = tg_num_threads();
    tg_set_num_threads(1); /* one rank per core */
    if (rank == 0) {
        bench_env env;
        bench_env_get(&env);
        bench_print_env(stdout, &env);
        printf("data-parallel train steps across %d MPI rank%s (tg_dist), 1 thread each:\n"
               "zero_grad, forward, backward, all-reduce, SGD step; median over interleaved\n"
               "rounds; ratios are the throughput against 1 process on the whole batch in the\n"
               "same rounds%s\n\n",
               size, size > 1 ? "s" : "", o->quick ? " (quick: not a measurement)" : "");
        fflush(stdout);
    }
    int failed = dpm_run(DP_MLP, BENCH_MLP_BATCH, o->quick, rank, size);
    for (int b = 32; b <= 128; b *= 4)
        failed += dpm_run(DP_LSTM, b, o->quick, rank, size) +
                  dpm_run(DP_LSTM_SEQ, b, o->quick, rank, size);
    tg_set_num_threads(prev);
    if (!inited) MPI_Finalize();
    return failed ? 1 : 0;
}
#else
int bench_dp_mpi_cli(const bench_opts *o)
{
    (void)o;
    fprintf(stderr, "tapegrad bench dp --mpi: this build has no MPI (install libopenmpi-dev "
                    "openmpi-bin, then 'meson setup --reconfigure build')\n");
    return 2;
}
#endif
