/* bench_pointwise: what the elementwise workload's fwd+bwd could cost under
 * other execution models, against its baseline, one fused pass (issue 17
 * asks for at most 1.5x of it; tapegrad's eager ops take about 3x).
 *
 * Every variant computes sum(tanh(x*x + 1) * sigmoid(x)) over the
 * workload's own 1M floats (bench_wl_elementwise's setup) and its gradient
 * with tapegrad's own vector kernels, called directly from the kernel
 * table on one thread (no tape, no dispatch, no allocation in the timed
 * loop), so that only the order of the work differs:
 *
 *   fused       the workload's baseline (bench/wl_small.c, its gemm entry):
 *               one pass in 2048-float chunks, the loss summed in 64 float
 *               lanes and the gradient s ((1 - t^2) 2x + t (1 - s)) in one
 *               loop;
 *   eager       each op a whole-tensor pass, as tapegrad's eager forward
 *               runs them (five 4 MB intermediates, the loss by sum_f32),
 *               then the blocked backward below;
 *   deferred    the forward evaluated block by block, as a deferred, fused
 *               forward would, writing only t and s, which the backward
 *               reads; the loss in 64 float lanes (not tapegrad's bits);
 *   exact sum   the same, the loss summed as sum_f32's chain sums it (four
 *               double accumulators carried from block to block: the loss's
 *               bits are tapegrad's);
 *   all written the deferred forward writing every result (a, b, t, s, e),
 *               as an engine that defers its eager ops must while any
 *               handle may still be read, then sum_f32 over e;
 *   recompute   the deferred forward writing nothing; the backward
 *               recomputes t and s in each block;
 *   tapegrad ops  the real thing: tg_mul, tg_add_scalar, tg_tanh,
 *               tg_sigmoid, tg_mul and tg_sum recorded on a tape, then
 *               tg_backward (what `tapegrad bench elementwise` times);
 *   tg_fused    the same loss through a fused function (tg_fused_new once,
 *               tg_fused_call and tg_sum each step; include/tapegrad/fused.h),
 *               recorded and swept the same way;
 *   tg_fused_sum  the same with the loss from tg_fused_sum, which sums the
 *               function's result block by block instead of writing it.
 *
 * The blocked backward runs, per block, the backward kernels tapegrad's
 * pointwise regions run (src/tape/region.c): mul's two products, tanh's
 * and sigmoid's fused gradient kernels, mul(x, x)'s two products and the
 * sums of the gradients that meet at x. The blocked variants run at 512,
 * 2048 and 16384 floats a block (16384: the regions' 64 KiB). `sum_f32`
 * (the kernel, which takes its exact 16-lane pass on these values: see
 * backend/cpu/reduce.c) and `sum, 64 lanes` time the loss's sum alone.
 *
 * Prints the median of ROUNDS interleaved rounds (each the best of REPS
 * calls) and the ratio to the fused pass. Pin it for stable figures:
 * `taskset -c 0 ./build/bench/bench_pointwise`. `--threads N` runs the
 * library rows on N threads (tg_set_num_threads); the others stay on one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/kernels.h"
#include "bench.h"
#include "core/internal.h"

#define N (1 << 20)
#define LANES 64
#define ROUNDS 9
#define REPS 5
#define MAX_BLOCK 16384

static tg_unary_fn k_tanh, k_sigmoid, k_add_scalar;
static tg_grad_fn k_tanh_grad, k_sigmoid_grad;
static tg_binary_fn k_mul, k_add;
static tg_reduce_fn k_sum;
static int64_t block;

/* The inputs, the saved values and the gradient (whole tensors). */
static float *x, *t_all, *s_all, *a_all, *b_all, *e_all, *gx;
static double sink;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void mul(int64_t n, const float *a, const float *b, float *out)
{
    tg_bcast bc = {.ndim = 1, .n = n, .shape = {n}, .sa = {1}, .sb = {1}, .same = true};
    k_mul(&bc, a, b, out);
}

static void add(int64_t n, const float *a, const float *b, float *out)
{
    tg_bcast bc = {.ndim = 1, .n = n, .shape = {n}, .sa = {1}, .sb = {1}, .same = true};
    k_add(&bc, a, b, out);
}

/* The fused pass's loss over one block of n elements (a multiple of
 * LANES, as every block here is): LANES partial sums. */
static float lane_sum(int64_t n, const float *t, const float *s)
{
    float acc[LANES] = {0};
    for (int64_t i = 0; i < n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += t[i + l] * s[i + l];
    float c = 0;
    for (int l = 0; l < LANES; l++) c += acc[l];
    return c;
}

/* The forward of one block: t = tanh(x*x + 1), s = sigmoid(x). */
static void block_forward(int64_t n, const float *xp, float *a, float *t, float *s)
{
    mul(n, xp, xp, a);
    k_add_scalar(n, a, a, 1.0);
    k_tanh(n, a, t, 0);
    k_sigmoid(n, xp, s, 0);
}

/* The backward of one block, op by op as a pointwise region runs it, with
 * gy = 1 from the sum: e = t*s gives gt = gy*s and gs = gy*t; tanh gives
 * gb = gt (1 - t^2); add_scalar passes gb on; x*x gives gb*x twice; sigmoid
 * gives gs s (1 - s); the three contributions to x are summed. */
static void block_backward(int64_t n, const float *xp, const float *t, const float *s, float *g)
{
    float ones[MAX_BLOCK], gt[MAX_BLOCK], gs[MAX_BLOCK], gb[MAX_BLOCK], g2[MAX_BLOCK];
    for (int64_t i = 0; i < n; i++) ones[i] = 1.0f;
    mul(n, ones, s, gt);
    mul(n, ones, t, gs);
    k_tanh_grad(n, t, gt, gb, 0);
    mul(n, gb, xp, g);
    mul(n, gb, xp, g2);
    add(n, g, g2, g);
    k_sigmoid_grad(n, s, gs, g2, 0);
    add(n, g, g2, g);
}

static void *wl; /* the workload's state */
static tg_tape *tape;
static tg_tensor *xl; /* a copy of x, a leaf on tape */
static tg_fused *fused_fn;

static tg_tensor *chain(void *ud, int n, tg_tensor *const *in)
{
    (void)ud, (void)n;
    tg_tensor *v = in[0];
    return tg_mul(tg_tanh(tg_add_scalar(tg_mul(v, v), 1.0)), tg_sigmoid(v));
}

/* One recorded step: forward through the ops (mode 0), the fused function
 * and tg_sum (1) or the fused sum (2), backward; the gradient read back
 * into gx. */
static void api_step(int mode)
{
    tg_grad_zero(xl);
    tg_scope_begin();
    tg_tensor *loss;
    if (mode == 2) {
        loss = tg_fused_sum(fused_fn, 1, &xl);
    } else {
        tg_tensor *y = mode ? tg_fused_call(fused_fn, 1, &xl) : chain(NULL, 1, &xl);
        loss = y ? tg_sum(y) : NULL;
    }
    double v = 0;
    if (!loss || tg_backward(loss) || tg_tensor_item(loss, &v)) {
        fprintf(stderr, "bench_pointwise: %s\n", tg_last_error_message());
        exit(1);
    }
    sink = v;
    tg_scope_end();
    tg_tape_reset(tape);
}

static void run_api_ops(void)
{
    api_step(0);
}

static void run_api_fused(void)
{
    api_step(1);
}

static void run_api_fused_sum(void)
{
    api_step(2);
}

static void run_fused(void)
{
    bench_wl_elementwise.gemm(wl, true);
}

static void backward_saved(void)
{
    for (int64_t o = 0; o < N; o += block) {
        int64_t n = N - o < block ? N - o : block;
        block_backward(n, x + o, t_all + o, s_all + o, gx + o);
    }
}

static void run_eager(void)
{
    tg_reduce r = {.ndim = 1, .shape = {N}, .reduce = {true}};
    float loss;
    k_sigmoid(N, x, s_all, 0);
    mul(N, x, x, a_all);
    k_add_scalar(N, a_all, b_all, 1.0);
    k_tanh(N, b_all, t_all, 0);
    mul(N, t_all, s_all, e_all);
    k_sum(&r, e_all, &loss);
    sink = loss;
    backward_saved();
}

static void run_deferred(void)
{
    float a[MAX_BLOCK];
    double total = 0;
    for (int64_t o = 0; o < N; o += block) {
        int64_t n = N - o < block ? N - o : block;
        block_forward(n, x + o, a, t_all + o, s_all + o);
        total += lane_sum(n, t_all + o, s_all + o);
    }
    sink = total;
    backward_saved();
}

/* sum_f32's order (backend/cpu/reduce.c): element j goes to accumulator
 * j % 4 in double, the four added pairwise at the end. Blocks are
 * multiples of 4 elements, so carrying the accumulators across blocks
 * gives sum_f32's bits. */
static void run_deferred_exact(void)
{
    float a[MAX_BLOCK], e[MAX_BLOCK];
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int64_t o = 0; o < N; o += block) {
        int64_t n = N - o < block ? N - o : block;
        block_forward(n, x + o, a, t_all + o, s_all + o);
        mul(n, t_all + o, s_all + o, e);
        for (int64_t j = 0; j < n; j += 4) {
            s0 += e[j];
            s1 += e[j + 1];
            s2 += e[j + 2];
            s3 += e[j + 3];
        }
    }
    sink = (float)((s0 + s1) + (s2 + s3));
    backward_saved();
}

/* A deferred forward that writes every result (a, b, t, s and e: what a
 * lazy engine writes when every handle may still be read), block by block,
 * then the loss by sum_f32 over the whole e. */
static void run_deferred_all(void)
{
    tg_reduce r = {.ndim = 1, .shape = {N}, .reduce = {true}};
    float loss;
    for (int64_t o = 0; o < N; o += block) {
        int64_t n = N - o < block ? N - o : block;
        mul(n, x + o, x + o, a_all + o);
        k_add_scalar(n, a_all + o, b_all + o, 1.0);
        k_tanh(n, b_all + o, t_all + o, 0);
        k_sigmoid(n, x + o, s_all + o, 0);
        mul(n, t_all + o, s_all + o, e_all + o);
    }
    k_sum(&r, e_all, &loss);
    sink = loss;
    backward_saved();
}

static void run_recompute(void)
{
    float a[MAX_BLOCK], t[MAX_BLOCK], s[MAX_BLOCK];
    double total = 0;
    for (int64_t o = 0; o < N; o += block) {
        int64_t n = N - o < block ? N - o : block;
        block_forward(n, x + o, a, t, s);
        total += lane_sum(n, t, s);
    }
    sink = total;
    for (int64_t o = 0; o < N; o += block) {
        int64_t n = N - o < block ? N - o : block;
        block_forward(n, x + o, a, t, s);
        block_backward(n, x + o, t, s, gx + o);
    }
}

static void run_sum_f32(void)
{
    tg_reduce r = {.ndim = 1, .shape = {N}, .reduce = {true}};
    float loss;
    k_sum(&r, t_all, &loss);
    sink = loss;
}

static void run_sum_lanes(void)
{
    float acc[LANES] = {0};
    for (int64_t i = 0; i < N; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += t_all[i + l];
    float c = 0;
    for (int l = 0; l < LANES; l++) c += acc[l];
    sink = c;
}

enum { NBLOCKS = 3 };
static const int64_t blocks[NBLOCKS] = {512, 2048, 16384};

typedef struct {
    const char *name;
    void (*fn)(void);
    int64_t block; /* 0: not blocked */
    double ms[ROUNDS];
} variant;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v)
{
    double s[ROUNDS];
    memcpy(s, v, sizeof s);
    qsort(s, ROUNDS, sizeof s[0], cmp_double);
    return s[ROUNDS / 2];
}

int main(int argc, char **argv)
{
    int threads = 1;
    if (argc == 3 && strcmp(argv[1], "--threads") == 0) threads = atoi(argv[2]);
    if ((argc != 1 && argc != 3) || threads < 1) {
        fprintf(stderr, "usage: bench_pointwise [--threads N]  (N: for the library rows)\n");
        return 2;
    }
    tg__backend_init();
    k_tanh = (tg_unary_fn)tg__kernel(TG_K_TANH, TG_BACKEND_CPU, TG_F32);
    k_sigmoid = (tg_unary_fn)tg__kernel(TG_K_SIGMOID, TG_BACKEND_CPU, TG_F32);
    k_add_scalar = (tg_unary_fn)tg__kernel(TG_K_ADD_SCALAR, TG_BACKEND_CPU, TG_F32);
    k_tanh_grad = (tg_grad_fn)tg__kernel(TG_K_TANH_GRAD, TG_BACKEND_CPU, TG_F32);
    k_sigmoid_grad = (tg_grad_fn)tg__kernel(TG_K_SIGMOID_GRAD, TG_BACKEND_CPU, TG_F32);
    k_mul = (tg_binary_fn)tg__kernel(TG_K_MUL, TG_BACKEND_CPU, TG_F32);
    k_add = (tg_binary_fn)tg__kernel(TG_K_ADD, TG_BACKEND_CPU, TG_F32);
    k_sum = (tg_reduce_fn)tg__kernel(TG_K_REDUCE_SUM, TG_BACKEND_CPU, TG_F32);
    char err[256];
    wl = bench_wl_elementwise.setup(err, sizeof err);
    tg_tensor *xt = wl ? tg_params_at(bench_wl_elementwise.params(wl), 0) : NULL;
    if (!xt || tg_tensor_numel(xt) != N) {
        fprintf(stderr, "bench_pointwise: %s\n", wl ? "the workload's x is not 1M floats" : err);
        return 1;
    }
    x = tg_tensor_data(xt);
    if (tg_set_num_threads(threads)) {
        fprintf(stderr, "bench_pointwise: %s\n", tg_last_error_message());
        return 1;
    }
    tape = tg_tape_new(NULL);
    fused_fn = tg_fused_new(chain, NULL, 1);
    xl = tg_tensor_from_data(TG_F32, 1, (int64_t[]){N}, x);
    if (!tape || !fused_fn || !xl || tg_requires_grad(tape, xl)) {
        fprintf(stderr, "bench_pointwise: %s\n", tg_last_error_message());
        return 1;
    }
    float **bufs[] = {&t_all, &s_all, &a_all, &b_all, &e_all, &gx};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        *bufs[i] = malloc(N * sizeof(float));
        if (!*bufs[i]) {
            fprintf(stderr, "bench_pointwise: out of memory\n");
            return 1;
        }
        memset(*bufs[i], 0, N * sizeof(float));
    }
    variant v[2 + 5 * NBLOCKS + 5];
    int nv = 0;
    v[nv++] = (variant){"fused", run_fused, 0, {0}};
    for (int b = 0; b < NBLOCKS; b++) {
        v[nv++] = (variant){"eager", run_eager, blocks[b], {0}};
        v[nv++] = (variant){"deferred", run_deferred, blocks[b], {0}};
        v[nv++] = (variant){"exact sum", run_deferred_exact, blocks[b], {0}};
        v[nv++] = (variant){"all written", run_deferred_all, blocks[b], {0}};
        v[nv++] = (variant){"recompute", run_recompute, blocks[b], {0}};
    }
    v[nv++] = (variant){"tapegrad ops", run_api_ops, 0, {0}};
    v[nv++] = (variant){"tg_fused", run_api_fused, 0, {0}};
    v[nv++] = (variant){"tg_fused_sum", run_api_fused_sum, 0, {0}};
    v[nv++] = (variant){"sum_f32", run_sum_f32, 0, {0}};
    v[nv++] = (variant){"sum, 64 lanes", run_sum_lanes, 0, {0}};
    for (int k = 0; k < nv; k++) { /* warm-up */
        block = v[k].block ? v[k].block : 2048;
        v[k].fn();
    }
    for (int r = 0; r < ROUNDS; r++)
        for (int k = 0; k < nv; k++) {
            block = v[k].block ? v[k].block : 2048;
            double best = 1e30;
            for (int i = 0; i < REPS; i++) {
                double t0 = now();
                v[k].fn();
                double dt = now() - t0;
                if (dt < best) best = dt;
            }
            v[k].ms[r] = best * 1e3;
        }
    printf("fwd+bwd of sum(tanh(x*x + 1) * sigmoid(x)) over 1M floats, one thread, tapegrad's "
           "kernels;\nmedian of %d interleaved rounds (each the best of %d), ms and ratio to "
           "the fused pass\n",
           ROUNDS, REPS);
    double fused = median(v[0].ms);
    for (int k = 0; k < nv; k++) {
        double m = median(v[k].ms);
        char label[48];
        if (v[k].block)
            snprintf(label, sizeof label, "%s, %lld", v[k].name, (long long)v[k].block);
        else
            snprintf(label, sizeof label, "%s", v[k].name);
        printf("  %-20s %8.3f ms  %5.2fx\n", label, m, m / fused);
    }
    printf("(blocked variants: floats a block; the two sums: the loss's sum alone; tapegrad ops "
           "and the tg_fused rows: the library's own step, recorded and swept, on %d thread%s)\n",
           threads, threads == 1 ? "" : "s");
    tg_fused_free(fused_fn);
    tg_tensor_release(xl);
    tg_tape_free(tape);
    bench_wl_elementwise.teardown(wl);
    return sink == 12345.678 ? 1 : 0; /* keeps the results alive */
}
