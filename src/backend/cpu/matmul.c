/* cpu backend: GEMM through OpenBLAS. Transposed operands are passed as
 * CblasTrans with their stored leading dimension: nothing is copied.
 *
 * OpenBLAS splits a GEMM across its threads from m*n*k > 262144 on; on the
 * 2-core machine this was tuned on, a second thread made the GEMMs of the
 * rnn workload (32x128x128) and the thin ones of conv's linear layer
 * (64x10x10816: a side of 10) 1.2-2.3x slower, and helped from about
 * m*n*k = 2M with m, n and k at least 32 (0.52-0.86x; 128x128x128 broke
 * even). With k = 10 (64x10816x10) the split alone was 0.82x, but the
 * conv step around it ran 1.2x slower on two threads than on one. So a
 * GEMM below that runs on one thread whatever the count (the count is
 * read per call, so a count set through OpenBLAS itself is followed, and
 * put back after). Its bits are then those of one thread at any count
 * (OpenBLAS's threaded path can differ in the last bit: the rnn gradient
 * did). A GEMM that will be split first parks the elementwise pool's
 * spinning workers (core/pool.c). The benchmark's raw GEMMs make the same
 * choice through tg__gemm_threads_begin/end. */
#include <cblas.h>

#include "backend/kernels.h"
#include "core/pool.h"

#define GEMM_SPLIT_MNK ((double)(1 << 21))
#define GEMM_SPLIT_SIDE 32
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

int tg__gemm_threads_begin(int64_t m, int64_t n, int64_t k)
{
#if TG_HAVE_OPENBLAS_THREADS
    if (gemm_small(m, n, k)) return 0;
    if ((double)m * (double)n * (double)k >= GEMM_SPLIT_MNK && m >= GEMM_SPLIT_SIDE &&
        n >= GEMM_SPLIT_SIDE && k >= GEMM_SPLIT_SIDE) {
        tg__pool_park(); /* OpenBLAS's threads need the cores the pool spins on */
        return 0;
    }
    int threads = openblas_get_num_threads();
    if (threads <= 1) return 0;
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
    if (threads) openblas_set_num_threads(threads);
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

/* The kernel table's entries: a small GEMM straight to BLAS, the others
 * through the thread choice. */
#define GEMM_ENTRY(name, raw)                                                                     \
    static void name(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a,          \
                     int64_t lda, const void *b, int64_t ldb, double beta, void *c, int64_t ldc) \
    {                                                                                           \
        if (m == 0 || n == 0) return;                                                           \
        if (!gemm_small(m, n, k)) {                                                             \
            gemm_chosen(raw, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);                    \
            return;                                                                             \
        }                                                                                       \
        raw(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);                                     \
    }

GEMM_ENTRY(gemm_f32, sgemm)
GEMM_ENTRY(gemm_f64, dgemm)

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
    openblas_set_num_threads(n);
#else
    (void)n;
#endif
}

void tg__cpu_matmul_register(void)
{
    tg__kernel_set(TG_K_GEMM, TG_BACKEND_CPU, TG_F32, (tg_kernel_fn)gemm_f32);
    tg__kernel_set(TG_K_GEMM, TG_BACKEND_CPU, TG_F64, (tg_kernel_fn)gemm_f64);
}
