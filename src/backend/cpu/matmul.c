/* cpu backend: GEMM through OpenBLAS. Transposed operands are passed as
 * CblasTrans with their stored leading dimension: nothing is copied.
 *
 * OpenBLAS splits a GEMM across its threads from m*n*k > 262144 on; on the
 * 2-core machine this was tuned on, a second thread made the GEMMs of the
 * rnn workload (32x128x128) and the thin ones of conv's linear layer
 * (64x10x10816: a side of 10) 1.2-2.3x slower, and helped from about
 * m*n*k = 2M with m, n and k at least 32 (0.52-0.86x; 128x128x128 broke
 * even). With k = 10 (64x10816x10) the split alone was 0.82x, but the
 * conv step around it ran 1.2x slower on two threads than on one. A short
 * reduction splits badly too: an LSTM's weight gradient at batch 32
 * (512x128x32) took 1.7-1.9x its one-thread time on two, and with it the
 * LSTM step (bench_policies lstm) ran 1.2x slower at two threads than at
 * one (Zen 5); k of at least 64 for a split made it 0.83-0.87x its time
 * and level with one thread. So a GEMM below that runs on one thread
 * whatever the count (the count is read per call, so a count set through
 * OpenBLAS itself is followed, and put back after). Its bits are then
 * those of one thread at any count (OpenBLAS's threaded path can differ in
 * the last bit: the rnn gradient did). A GEMM that will be split first parks the elementwise pool's
 * spinning workers (core/pool.c). The benchmark's raw GEMMs make the same
 * choice through tg__gemm_threads_begin/end. */
#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/kernels.h"
#include "core/pool.h"

#define GEMM_SPLIT_MNK ((double)(1 << 21))
#define GEMM_SPLIT_SIDE 32
#define GEMM_SPLIT_K 64
/* OpenBLAS 0.3 runs these on one thread by itself (m*n*k <= 65536 *
 * GEMM_MULTITHREAD_THRESHOLD, 4 in Debian's build): nothing to choose,
 * and the tiny workload's GEMMs (~0.3 us) would feel the choosing. */
#define GEMM_OWN_SINGLE_MNK 262144u

/* m*n*k <= GEMM_OWN_SINGLE_MNK in integers: m*n cannot overflow (each
 * below 2^31, as blasint takes them), and when it is at most 2^18 neither
 * can its product with k. */
static inline bool gemm_small(int64_t m, int64_t n, int64_t k)
{
    uint64_t mn = (uint64_t)m * (uint64_t)n;
    return mn <= GEMM_OWN_SINGLE_MNK && mn * (uint64_t)k <= GEMM_OWN_SINGLE_MNK;
}

/* Whether a GEMM that is not small is one OpenBLAS may split across its
 * threads (tg__gemm_threads_begin). */
static inline bool gemm_splits(int64_t m, int64_t n, int64_t k)
{
    return (double)m * (double)n * (double)k >= GEMM_SPLIT_MNK && m >= GEMM_SPLIT_SIDE &&
           n >= GEMM_SPLIT_SIDE && k >= GEMM_SPLIT_K;
}

#if TG_HAVE_OPENBLAS_THREADS
/* OpenBLAS's thread count is one number for the whole process, read when
 * a call starts. Lowering it around one thread's GEMM would make another
 * thread's GEMM that starts meanwhile run on one thread, with other bits
 * than the same run alone (a test training on four threads at once saw
 * it in about one run of sixteen). So while the count is above 1, every
 * GEMM that is not small holds gemm_lock from its choice to its end: a
 * split one runs at the count, a lowered one alone. toggle_seq is odd
 * while the count is lowered, so that a GEMM reading 1 can tell a count
 * of 1 (no lock: nothing lowers it, as with worker threads or
 * OPENBLAS_NUM_THREADS=1) from one lowered for the moment. */
static pthread_mutex_t gemm_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint toggle_seq;
#define GEMM_LOCKED (-1) /* begin's return: the lock held, the count as it was */
#endif

/* OpenBLAS's thread count as set, not as lowered for a moment around
 * another thread's GEMM (then 2: more than one, for all a caller knows). */
static int blas_count_settled(void)
{
#if TG_HAVE_OPENBLAS_THREADS
    unsigned s1 = atomic_load(&toggle_seq);
    int threads = openblas_get_num_threads();
    unsigned s2 = atomic_load(&toggle_seq);
    return s1 == s2 && !(s1 & 1u) ? threads : 2;
#else
    return 1;
#endif
}

int tg__gemm_threads_begin(int64_t m, int64_t n, int64_t k)
{
#if TG_HAVE_OPENBLAS_THREADS
    if (gemm_small(m, n, k) || blas_count_settled() <= 1) return 0;
    pthread_mutex_lock(&gemm_lock);
    int threads = openblas_get_num_threads(); /* as set: nothing lowers it now */
    if (threads <= 1) return GEMM_LOCKED;
    if (gemm_splits(m, n, k)) {
        tg__pool_park(); /* OpenBLAS's threads need the cores the pool spins on */
        return GEMM_LOCKED;
    }
    atomic_fetch_add(&toggle_seq, 1u);
    openblas_set_num_threads(1);
    return threads;
#else
    (void)m, (void)n, (void)k;
    return 0;
#endif
}

void tg__gemm_threads_end(int threads)
{
#if TG_HAVE_OPENBLAS_THREADS
    if (threads == 0) return;
    if (threads > 0) {
        openblas_set_num_threads(threads);
        atomic_fetch_add(&toggle_seq, 1u);
    }
    pthread_mutex_unlock(&gemm_lock);
#else
    (void)threads;
#endif
}

static void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                  const void *b, int64_t ldb, double beta, void *c, int64_t ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)k, 1.0f, a, (blasint)(lda ? lda : 1), b,
                (blasint)(ldb ? ldb : 1), (float)beta, c, (blasint)(ldc ? ldc : 1));
}

static void dgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                  const void *b, int64_t ldb, double beta, void *c, int64_t ldc)
{
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)k, 1.0, a, (blasint)(lda ? lda : 1), b,
                (blasint)(ldb ? ldb : 1), beta, c, (blasint)(ldc ? ldc : 1));
}

/* A GEMM that is not small, with its thread choice: out of line, so that
 * the small ones' path stays a plain call. */
#if defined(__GNUC__)
__attribute__((noinline))
#endif
static void gemm_chosen(tg_gemm_fn f, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                        const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
                        void *c, int64_t ldc)
{
    int threads = tg__gemm_threads_begin(m, n, k);
    f(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
    tg__gemm_threads_end(threads);
}

/* Thin products, where OpenBLAS spends its time packing a long operand
 * for a handful of outputs, run on the conv_short kernels (cpu/conv.c),
 * all operands dense:
 * - C (m, n) = [C +] A (m, k) B (n, k)^T with n <= THIN_N and k >= THIN_LONG
 *   (a classifier head's forward: 64 x 10 x 10816 took 0.65-0.68x of
 *   OpenBLAS's time in a scratch program, 128 x 9 x 512 0.78x), as the
 *   weight-gradient kernel's dot products;
 * - C (m, n) = A (m, k) B (k, n) with k <= THIN_N and n >= THIN_LONG (its
 *   input gradient: 64 x 10816 x 10 took 0.52-0.58x), as the forward
 *   kernel's rows.
 * At n = 12, k = 256 they were slower than OpenBLAS (1.2-1.35x), hence the
 * bounds. Their bits are the kernels' (kernels.h), the same on every CPU;
 * they run on the calling thread (such GEMMs do anyway: a side below 32). */
#define THIN_N 10
#define THIN_LONG 512

static bool gemm_thin(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a,
                      int64_t lda, const void *b, int64_t ldb, double beta, void *c,
                      int64_t ldc, tg_dtype dt)
{
    if (ta || m < 1) return false;
    if (tb && n <= THIN_N && k >= THIN_LONG && lda == k && ldb == k && ldc == n &&
        (beta == 0.0 || beta == 1.0)) {
        ((tg_conv_short_wgrad_fn)tg__kernel(TG_K_CONV_SHORT_WGRAD, TG_BACKEND_CPU, dt))(
            m, n, k, a, b, beta == 1.0, c);
        return true;
    }
    if (!tb && k >= 1 && k <= THIN_N && n >= THIN_LONG && lda == k && ldb == n && ldc == n &&
        beta == 0.0) {
        ((tg_conv_short_fwd_fn)tg__kernel(TG_K_CONV_SHORT_FWD, TG_BACKEND_CPU, dt))(
            m, k, n, a, b, NULL, false, c);
        return true;
    }
    return false;
}

/* The kernel table's entries: a small GEMM straight to BLAS, a thin one on
 * tapegrad's kernels, the others through the thread choice. */
#define GEMM_ENTRY(name, raw, dt)                                                                 \
    static void name(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a,          \
                     int64_t lda, const void *b, int64_t ldb, double beta, void *c, int64_t ldc) \
    {                                                                                           \
        if (m == 0 || n == 0) return;                                                           \
        if (!gemm_small(m, n, k)) {                                                             \
            if (gemm_thin(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, dt)) return;           \
            gemm_chosen(raw, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);                    \
            return;                                                                             \
        }                                                                                       \
        raw(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);                                     \
    }

GEMM_ENTRY(gemm_f32, sgemm, TG_F32)
GEMM_ENTRY(gemm_f64, dgemm, TG_F64)

/* ---- A GEMM that adds into its result (tg__gemm_adds_exactly).
 *
 * OpenBLAS applies beta to C first (beta 0: zeros), then adds each block of
 * the reduction's product into C, alpha times it, with one rounding: with
 * the whole reduction in one block (k at most GEMM_Q: 320 floats and 256
 * doubles for the Haswell kernels, 384 for SkylakeX's; a scratch program
 * found the first differing sums just above those), a beta-1 call gives
 * c + p where the beta-0 call gives p, so the sweep's add of the two
 * (c + p) has the same bits. The one difference: a product of exactly -0
 * comes out +0 at beta 0 (0 + -0), so where c is also -0 the sweep's sum
 * is +0 and the GEMM's -0; c can only be -0 when every contribution before
 * was -0 and some came from elsewhere than a beta-0 GEMM. Hence the bound
 * EXACT_K, well below any GEMM_Q of OpenBLAS's x86 kernels, a one-thread
 * call (OpenBLAS's threaded blocking may differ), and a probe, once per
 * dtype, of the kernel the table holds at k = EXACT_K. */
#define EXACT_K 128

static pthread_once_t exact_once = PTHREAD_ONCE_INIT;
static bool exact_ok[2]; /* f32, f64 */

static bool probe_exact(tg_gemm_fn gemm, size_t es)
{
    enum { M = 40, N = 24, K = EXACT_K, TOTAL = K * (M + N) + 3 * M * N };
    char *base = malloc((size_t)TOTAL * es);
    if (!base) return false;
    uint64_t u = 0x2545f4914f6cdd1dULL;
    for (int i = 0; i < TOTAL; i++) {
        u ^= u << 13, u ^= u >> 7, u ^= u << 17;
        double v = (double)(u >> 11) / 9007199254740992.0 - 0.5;
        if (es == 4)
            ((float *)base)[i] = (float)v;
        else
            ((double *)base)[i] = v;
    }
    char *a = base, *b = a + (size_t)K * M * es, *c0 = b + (size_t)K * N * es;
    char *c1 = c0 + (size_t)M * N * es, *p = c1 + (size_t)M * N * es;
    memcpy(c1, c0, (size_t)M * N * es);
    /* The weight gradient's call: a (K, M) transposed, b (K, N). */
    gemm(true, false, M, N, K, a, M, b, N, 0.0, p, N);
    gemm(true, false, M, N, K, a, M, b, N, 1.0, c1, N);
    for (int i = 0; i < M * N; i++) {
        if (es == 4)
            ((float *)c0)[i] = ((float *)c0)[i] + ((float *)p)[i];
        else
            ((double *)c0)[i] = ((double *)c0)[i] + ((double *)p)[i];
    }
    bool same = memcmp(c0, c1, (size_t)M * N * es) == 0;
    free(base);
    return same;
}

static void exact_probe(void)
{
    exact_ok[0] = probe_exact(gemm_f32, sizeof(float));
    exact_ok[1] = probe_exact(gemm_f64, sizeof(double));
}

bool tg__gemm_adds_exactly(tg_backend backend, tg_dtype dtype, int64_t m, int64_t n, int64_t k)
{
    if (dtype != TG_F32 && dtype != TG_F64) return false;
    if (backend == TG_BACKEND_REF) /* sums in double, rounded once to the dtype */
        return dtype == TG_F64;
    if (backend != TG_BACKEND_CPU || k < 1 || k > EXACT_K) return false;
    /* Not where OpenBLAS may split it across threads (gemm_chosen). */
    if (gemm_splits(m, n, k) && blas_count_settled() > 1) return false; /* never small */
    pthread_once(&exact_once, exact_probe);
    return exact_ok[dtype == TG_F64];
}

int tg__blas_threads(void)
{
#if TG_HAVE_OPENBLAS_THREADS
    return openblas_get_num_threads();
#else
    return 1;
#endif
}

void tg__blas_set_threads(int n)
{
#if TG_HAVE_OPENBLAS_THREADS
    pthread_mutex_lock(&gemm_lock); /* not while a GEMM has it lowered */
    openblas_set_num_threads(n);
    pthread_mutex_unlock(&gemm_lock);
#else
    (void)n;
#endif
}

void tg__cpu_matmul_register(void)
{
    tg__kernel_set(TG_K_GEMM, TG_BACKEND_CPU, TG_F32, (tg_kernel_fn)gemm_f32);
    tg__kernel_set(TG_K_GEMM, TG_BACKEND_CPU, TG_F64, (tg_kernel_fn)gemm_f64);
}
