/* ref backend: naive triple-loop GEMM, accumulating in double. */
#include "backend/kernels.h"

#define DEF_GEMM(SFX, T)                                                           \
    static void gemm_##SFX(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *av, \
                           int64_t lda, const void *bv, int64_t ldb, double beta, void *cv, \
                           int64_t ldc)                                            \
    {                                                                              \
        const T *a = av, *b = bv;                                                  \
        T *c = cv;                                                                 \
        for (int64_t i = 0; i < m; i++)                                            \
            for (int64_t j = 0; j < n; j++) {                                      \
                double acc = 0.0;                                                  \
                for (int64_t p = 0; p < k; p++) {                                  \
                    double x = ta ? a[p * lda + i] : a[i * lda + p];               \
                    double y = tb ? b[j * ldb + p] : b[p * ldb + j];               \
                    acc += x * y;                                                  \
                }                                                                  \
                double prev = beta != 0.0 ? beta * (double)c[i * ldc + j] : 0.0;   \
                c[i * ldc + j] = (T)(acc + prev);                                  \
            }                                                                      \
    }

DEF_GEMM(f32, float)
DEF_GEMM(f64, double)

void tg__ref_matmul_register(void)
{
    tg__kernel_set(TG_K_GEMM, TG_BACKEND_REF, TG_F32, (tg_kernel_fn)gemm_f32);
    tg__kernel_set(TG_K_GEMM, TG_BACKEND_REF, TG_F64, (tg_kernel_fn)gemm_f64);
}
