/* Elementwise kernels split across the thread pool give exactly the
 * single-thread results (each element is computed by the same code, only
 * on another thread), for every split path: unary, fused grad, binary
 * same-shape, scalar and row broadcasts. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tapegrad.h>
#include <unistd.h>

#include "backend/kernels.h" /* tg__blas_set_threads */
#include "core/pool.h"       /* tg__pool_jobs: that the splits happened */

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
    /* 4.2 MB a tensor: split even when the pool's workers sleep (below
     * 4 MiB only a pool already awake splits; backend/parallel.c). */
    tg_tensor *x = tg_rand_uniform(&rng, TG_F32, 2, SHAPE(1024, 1031), -3, 3);
    tg_tensor *row = tg_rand_uniform(&rng, TG_F32, 1, SHAPE(1031), -1, 1);
    tg_tensor *s = tg_scalar(TG_F32, 0.7);
    size_t n1, n2;
    float *one = run(1, x, row, s, &n1);
    uint64_t jobs = tg__pool_jobs();
    float *two = run(2, x, row, s, &n2);
    cr_assert_gt(tg__pool_jobs(), jobs, "nothing was split on 2 threads");
    jobs = tg__pool_jobs();
    float *four = run(4, x, row, s, &n2);
    cr_assert_gt(tg__pool_jobs(), jobs, "nothing was split on 4 threads");
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

/* Resident set size in bytes (Linux). */
static long rss_bytes(void)
{
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    cr_assert_not_null(f);
    cr_assert_eq(fscanf(f, "%ld %ld", &pages, &rss), 2);
    fclose(f);
    return rss * sysconf(_SC_PAGESIZE);
}

/* Fills the thread's header cache (300 tensors freed) and its scope array,
 * leaving one scope open: exiting must end it. */
static void *short_lived(void *arg)
{
    (void)arg;
    tg_tensor *t[300];
    tg_scope_begin();
    for (int i = 0; i < 300; i++) t[i] = tg_tensor_retain(tg_scalar(TG_F64, i));
    for (int i = 0; i < 300; i++) tg_tensor_release(t[i]);
    tg_scope_begin();
    tg_scalar(TG_F32, 1.0);
    return NULL;
}

/* Under a sanitizer, freed memory is held back (ASan's quarantine) and RSS
 * says nothing: there LeakSanitizer finds what a thread left behind. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define RSS_MEANINGFUL 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define RSS_MEANINGFUL 0
#endif
#endif
#ifndef RSS_MEANINGFUL
#define RSS_MEANINGFUL 1
#endif

/* Issue 15 item 1: a thread's header cache and scope arrays are freed when
 * it exits (they leaked about 85 KB per thread: 1,000 threads, 85 MB). */
Test(threads, exiting_threads_leave_no_per_thread_memory_behind)
{
    for (int round = 0; round < 2; round++) {
        long before = rss_bytes();
        for (int i = 0; i < 500; i++) {
            pthread_t th;
            cr_assert_eq(pthread_create(&th, NULL, short_lived, NULL), 0);
            cr_assert_eq(pthread_join(th, NULL), 0);
        }
        long grown = rss_bytes() - before;
        /* The first round may grow the allocator's arenas once. */
        if (round == 1 && RSS_MEANINGFUL)
            cr_assert_lt(grown, 8l << 20, "500 threads grew RSS by %ld KB", grown >> 10);
    }
    cr_assert_eq(tg_mem_current_bytes(), 0);
}

/* A thread keeps the large buffers it frees in a cache of its own (600
 * buffers of 64 KiB here: past its 512 slots, the rest go to the shared
 * cache) and hands them to the shared cache when it exits. Each thread
 * below gets back what the one before it left, filled with its own
 * values; a thread whose exit lost its cache would leave 32 MB behind. */
#define BIG_N 600
#define BIG_ELEMS (16384 + 16)

static void *big_buffers(void *arg)
{
    double *seen = arg;
    static tg_tensor *t[BIG_N];
    for (int i = 0; i < BIG_N; i++) t[i] = tg_full(TG_F32, 1, SHAPE(BIG_ELEMS), (double)i);
    *seen = 0;
    for (int i = 0; i < BIG_N; i++) {
        const float *p = t[i] ? tg_tensor_data_ro(t[i]) : NULL;
        *seen += p && p[0] == (float)i && p[BIG_ELEMS - 1] == (float)i;
    }
    for (int i = 0; i < BIG_N; i++) tg_tensor_release(t[i]);
    return NULL;
}

Test(threads, a_thread_hands_its_cached_buffers_on_when_it_exits)
{
    size_t base = tg_mem_current_bytes();
    long before = 0;
    for (int i = 0; i < 12; i++) {
        if (i == 2) before = rss_bytes();
        pthread_t th;
        double seen = -1;
        cr_assert_eq(pthread_create(&th, NULL, big_buffers, &seen), 0);
        cr_assert_eq(pthread_join(th, NULL), 0);
        cr_assert_eq(seen, BIG_N, "thread %d: %g of %d tensors held their values", i, seen,
                     BIG_N);
    }
    long grown = rss_bytes() - before;
    if (RSS_MEANINGFUL)
        cr_assert_lt(grown, 8l << 20, "10 threads grew RSS by %ld KB", grown >> 10);
    /* And the main thread takes them on the same way. */
    double seen = -1;
    big_buffers(&seen);
    cr_assert_eq(seen, BIG_N);
    cr_assert_eq(tg_mem_current_bytes(), base);
    tg_mem_trim();
}

/* ---- One tape per thread (docs/api.md, "Threads"): each thread owns its
 * model, optimizer, tape and data; what they share is the library's
 * process-wide state (registry, kernel tables, memory accounting, buffer
 * cache) and the elementwise pool, which the tanh of a (256, 4096) f32
 * activation (4 MiB) is split across, between GEMMs that OpenBLAS splits
 * (and that park the pool's workers first). Every thread must end with
 * the losses of the same run made alone. */
typedef struct {
    uint64_t seed;
    int steps;
    double loss[8];
    tg_status st;
} trainer;

static void *train_alone(void *arg)
{
    trainer *t = arg;
    tg_rng rng;
    tg_rng_seed(&rng, t->seed);
    tg_params *ps = tg_params_new();
    tg_linear *l1 = tg_linear_new(ps, "fc1", 64, 4096, true, TG_F32, &rng);
    tg_linear *l2 = tg_linear_new(ps, "fc2", 4096, 10, true, TG_F32, &rng);
    tg_optim *opt = tg_optim_new(ps, NULL);
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = tg_rand_normal(&rng, TG_F32, 2, SHAPE(256, 64), 0, 1);
    int64_t labels[256];
    for (int i = 0; i < 256; i++) labels[i] = (int64_t)(tg_rng_next(&rng) % 10);
    tg_tensor *y = tg_tensor_from_data(TG_I64, 1, SHAPE(256), labels);
    t->st = (l2 && opt && tape && x && y) ? tg_params_requires_grad(ps, tape) : tg_last_error();
    for (int k = 0; k < t->steps && !t->st; k++) {
        tg_scope_begin();
        tg_optim_zero_grad(opt);
        tg_tensor *h = tg_tanh(tg_linear_forward(l1, x));
        tg_tensor *loss = tg_cross_entropy(tg_linear_forward(l2, h), y);
        t->st = loss ? tg_backward(loss) : tg_last_error();
        if (!t->st) t->st = tg_tensor_item(loss, &t->loss[k]);
        tg_scope_end();
        tg_tape_reset(tape);
        if (!t->st) t->st = tg_optim_step(opt);
    }
    tg_tensor_release(x);
    tg_tensor_release(y);
    tg_tape_free(tape);
    tg_optim_free(opt);
    tg_linear_free(l1);
    tg_linear_free(l2);
    tg_params_free(ps);
    return NULL;
}

Test(threads, one_tape_per_thread_trains_concurrently_as_it_trains_alone)
{
    int before = tg_num_threads();
    cr_assert_eq(tg_set_num_threads(2), TG_OK);
    enum { N = 4 };
    trainer alone[2] = {{.seed = 1, .steps = 8}, {.seed = 2, .steps = 8}}, t[N];
    uint64_t jobs = tg__pool_jobs();
    for (int i = 0; i < 2; i++) {
        train_alone(&alone[i]);
        cr_assert_eq(alone[i].st, TG_OK, "%s", tg_last_error_message());
    }
    cr_assert_gt(tg__pool_jobs(), jobs, "the tanh was never split");
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        t[i] = (trainer){.seed = (uint64_t)(1 + i % 2), .steps = 8};
        cr_assert_eq(pthread_create(&th[i], NULL, train_alone, &t[i]), 0);
    }
    for (int i = 0; i < N; i++) cr_assert_eq(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(t[i].st, TG_OK, "thread %d: %s", i, tg_strerror(t[i].st));
        cr_assert_eq(memcmp(t[i].loss, alone[i % 2].loss, sizeof t[i].loss), 0,
                     "thread %d: losses differ from the run made alone", i);
    }
    cr_assert_lt(t[0].loss[7], t[0].loss[0], "training lowers the loss");
    cr_assert_eq(tg_mem_current_bytes(), 0);
    cr_assert_eq(tg_set_num_threads(before), TG_OK);
}

/* One tg_fused shared by threads: each calls it (tg_fused_call and
 * tg_fused_sum in turn) on its own tensors and tape at once; every
 * thread's output and gradient are those of a call made alone. */
static tg_tensor *fused_chain(void *ud, int n, tg_tensor *const *in)
{
    (void)ud, (void)n;
    tg_tensor *x = in[0];
    return tg_mul(tg_tanh(tg_add_scalar(tg_mul(x, x), 1.0)), tg_sigmoid(x));
}

typedef struct fused_job {
    const tg_fused *f;
    double out_sum, grad_sum;
    tg_status st;
} fused_job;

static void *fused_alone(void *arg)
{
    fused_job *j = arg;
    tg_rng rng;
    tg_rng_seed(&rng, 9);
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = tg_rand_uniform(&rng, TG_F32, 1, SHAPE(50000), -2, 2);
    j->st = tape && x ? tg_requires_grad(tape, x) : tg_last_error();
    for (int k = 0; k < 20 && !j->st; k++) {
        tg_scope_begin();
        tg_grad_zero(x);
        tg_tensor *y = k % 2 ? NULL : tg_fused_call(j->f, 1, &x); /* odd k: the fused sum */
        tg_tensor *s = k % 2 ? tg_fused_sum(j->f, 1, &x) : y ? tg_sum(y) : NULL;
        j->st = s ? tg_backward(s) : tg_last_error();
        if (!j->st) j->st = tg_tensor_item(s, &j->out_sum);
        if (!j->st) j->st = tg_tensor_item(tg_sum(tg_grad(x)), &j->grad_sum);
        tg_scope_end();
        tg_tape_reset(tape);
    }
    tg_tensor_release(x);
    tg_tape_free(tape);
    return NULL;
}

Test(threads, threads_share_one_fused_function)
{
    tg_fused *f = tg_fused_new(fused_chain, NULL, 1);
    cr_assert(f, "%s", tg_last_error_message());
    enum { N = 4 };
    fused_job alone = {.f = f}, t[N];
    fused_alone(&alone);
    cr_assert_eq(alone.st, TG_OK, "%s", tg_last_error_message());
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        t[i] = (fused_job){.f = f};
        cr_assert_eq(pthread_create(&th[i], NULL, fused_alone, &t[i]), 0);
    }
    for (int i = 0; i < N; i++) cr_assert_eq(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(t[i].st, TG_OK, "thread %d: %s", i, tg_strerror(t[i].st));
        cr_assert(t[i].out_sum == alone.out_sum && t[i].grad_sum == alone.grad_sum,
                  "thread %d: %.17g %.17g against %.17g %.17g", i, t[i].out_sum, t[i].grad_sum,
                  alone.out_sum, alone.grad_sum);
    }
    tg_fused_free(f);
    cr_assert_eq(tg_mem_current_bytes(), 0);
}

/* One forward and backward of the registered op `name` on in[0..nin)
 * (each marked on a new tape) at a thread count, with OpenBLAS kept on one
 * thread (its own split of a GEMM may give other bits, api.md's Threads,
 * so the pool's split is what differs): the output and every input's
 * gradient, one after the other, in a malloc'd buffer of *n floats; *split:
 * the op's forward ran pool jobs. */
static float *op_run(const char *name, int threads, int nin, tg_tensor *const *in, tg_tensor *w,
                     size_t *n, bool *split)
{
    cr_assert_eq(tg_set_num_threads(threads), TG_OK);
    tg__blas_set_threads(1);
    tg_tape *tape = tg_tape_new(NULL);
    for (int i = 0; i < nin; i++) cr_assert_eq(tg_requires_grad(tape, in[i]), TG_OK);
    tg_scope_begin();
    uint64_t jobs = tg__pool_jobs();
    tg_tensor *y = tg_op_call(tg_op_find(name), nin, in, NULL);
    cr_assert_not_null(y, "%s", tg_last_error_message());
    *split = tg__pool_jobs() > jobs; /* the op's own forward */
    cr_assert_eq(tg_backward(tg_sum(tg_mul(y, w))), TG_OK, "%s", tg_last_error_message());
    tg_tensor *parts[TG_OP_MAX_INPUTS + 1] = {y};
    for (int i = 0; i < nin; i++) parts[i + 1] = tg_grad(in[i]);
    *n = 0;
    for (int i = 0; i <= nin; i++) *n += (size_t)tg_tensor_numel(parts[i]);
    float *out = malloc(*n * sizeof *out), *p = out;
    cr_assert_not_null(out);
    for (int i = 0; i <= nin; i++) {
        size_t k = (size_t)tg_tensor_numel(parts[i]);
        cr_assert_eq(tg_tensor_copy_out(parts[i], p, k * sizeof *p), TG_OK);
        p += k;
    }
    tg_scope_end();
    for (int i = 0; i < nin; i++) tg_grad_zero(in[i]);
    tg_tape_free(tape);
    return out;
}

/* op_run at 1 and 2 threads: a split at 2 only, and the same bits. */
static void expect_split_bitwise(const char *name, int nin, tg_tensor *const *in, tg_tensor *w)
{
    int before = tg_num_threads();
    size_t n1, n2;
    bool split1, split2;
    float *one = op_run(name, 1, nin, in, w, &n1, &split1);
    float *two = op_run(name, 2, nin, in, w, &n2, &split2);
    cr_assert(!split1, "%s: a split on 1 thread", name);
    cr_assert(split2, "%s: the forward was not split on 2 threads", name);
    cr_assert_eq(n1, n2);
    size_t first = 0;
    while (first < n1 && one[first] == two[first]) first++;
    cr_assert_eq(first, n1, "%s: 2 threads differ from 1 first at %zu of %zu: %.9g against %.9g",
                 name, first, n1, first < n1 ? one[first] : 0.0, first < n1 ? two[first] : 0.0);
    free(one);
    free(two);
    cr_assert_eq(tg_set_num_threads(before), TG_OK);
}

/* lstm_gates splits its rows across the pool when they are large: the
 * output and both gradients are bitwise those of one thread. */
Test(threads, lstm_gates_split_across_threads_matches_one_thread_bitwise)
{
    tg_rng rng;
    tg_rng_seed(&rng, 12);
    /* z of 1000 x 4 x 300 floats, 4.8 MB: split even when the pool sleeps. */
    tg_tensor *in[2] = {tg_rand_uniform(&rng, TG_F32, 2, SHAPE(1000, 1200), -4, 4),
                        tg_rand_uniform(&rng, TG_F32, 2, SHAPE(1000, 300), -2, 2)};
    tg_tensor *w = tg_rand_uniform(&rng, TG_F32, 3, SHAPE(2, 1000, 300), -1, 1);
    expect_split_bitwise("lstm_gates", 2, in, w);
    for (int i = 0; i < 2; i++) tg_tensor_release(in[i]);
    tg_tensor_release(w);
}

/* The lstm op splits each step's gates across the pool in the same way:
 * its output and the gradients of all four inputs are bitwise those of one
 * thread. */
Test(threads, lstm_split_across_threads_matches_one_thread_bitwise)
{
    tg_rng rng;
    tg_rng_seed(&rng, 13);
    /* T 2, B 512, I 4, H 512: each step's z is 4 MiB. */
    tg_tensor *in[4] = {
        tg_rand_uniform(&rng, TG_F32, 3, SHAPE(2, 512, 4), -1, 1),
        tg_rand_uniform(&rng, TG_F32, 3, SHAPE(2, 512, 512), -1, 1),
        tg_rand_uniform(&rng, TG_F32, 2, SHAPE(2048, 516), -0.05, 0.05),
        tg_rand_uniform(&rng, TG_F32, 1, SHAPE(2048), -0.5, 0.5),
    };
    tg_tensor *w = tg_rand_uniform(&rng, TG_F32, 4, SHAPE(2, 2, 512, 512), -1, 1);
    expect_split_bitwise("lstm", 4, in, w);
    for (int i = 0; i < 4; i++) tg_tensor_release(in[i]);
    tg_tensor_release(w);
}
