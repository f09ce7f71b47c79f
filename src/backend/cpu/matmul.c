/* cpu backend: GEMM through OpenBLAS. Transposed operands are passed as
 * CblasTrans with their stored leading dimension: nothing is copied. */
#include <cblas.h>

#include "backend/kernels.h"

static void gemm_f32(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                     const void *b, int64_t ldb, double beta, void *c, int64_t ldc)
{
    if (m == 0 || n == 0) return;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)k, 1.0f, a, (blasint)(lda ? lda : 1), b,
                (blasint)(ldb ? ldb : 1), (float)beta, c, (blasint)(ldc ? ldc : 1));
}

static void gemm_f64(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                     const void *b, int64_t ldb, double beta, void *c, int64_t ldc)
{
    if (m == 0 || n == 0) return;
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)k, 1.0, a, (blasint)(lda ? lda : 1), b,
                (blasint)(ldb ? ldb : 1), beta, c, (blasint)(ldc ? ldc : 1));
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
