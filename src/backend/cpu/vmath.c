/* cpu backend: f32 exp, tanh, sigmoid and cross-entropy as branch-free polynomial loops
 * the compiler vectorizes (libm's scalar calls dominated elementwise
 * workloads). Cephes' single-precision schemes: exp by n ln2 + r range
 * reduction and 1 + r + r^2 P(r), P of degree 5, tanh by an odd polynomial below
 * 0.625 and 1 - 2 / (e^2|x| + 1) above. Errors stay within a few ulp of
 * libm's, which the ref-vs-cpu tests check (ref keeps libm); over every
 * 97th bit pattern, against double libm, exp is within 1.0 ulp, tanh 1.3
 * and sigmoid 2.3 (2.4 on baseline). The exp op covers the whole float
 * range (subnormal results, +inf on overflow); sigmoid and cross-entropy
 * clamp e^x to the normal range. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/kernels.h"

/* Selects on float compares (clamps, relu) only become vector blends when
 * the compiler may ignore FP exception flags, which nothing here reads. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

/* The loops are compiled three times: for AVX-512 and for AVX2 (both
 * with fused multiply-adds in the polynomials), and for the baseline ISA
 * (separate multiplies and adds), and registration picks the widest the
 * CPU runs. Floating point contraction is otherwise off (-std=c11), so the
 * two FMA variants do the same IEEE operations in the same order and give
 * bitwise the same results; baseline differs from them by rounding only
 * (within a few ulp). The choice is made once per process, so every
 * tensor a process computes goes through the same variant. */
#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define TG_VMATH_MULTI 1
#endif

/* Branch-free scalar cores; selects are bit blends so every variant
 * vectorizes (the compiler would not if-convert the ternaries). */
static inline float bits_f(int32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

static inline int32_t f_bits(float f)
{
    int32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

/* m is all ones or all zeros: m ? x : y */
static inline float blend(int32_t m, float x, float y)
{
    return bits_f((f_bits(x) & m) | (f_bits(y) & ~m));
}

/* Smallest and largest bit pattern of |x[i]| over m > 0 floats; for
 * non-negative floats the integer order of the bits is the numeric order,
 * and NaNs come above +inf. Integer min/max reductions vectorize. */
#define ABS_RANGE(ATTR, SFX)                                                        \
    ATTR static inline void abs_range_##SFX(int64_t m, const float *restrict x,     \
                                            int32_t *lo_out, int32_t *hi_out)       \
    {                                                                               \
        int32_t lo = INT32_MAX, hi = 0;                                             \
        for (int64_t i = 0; i < m; i++) {                                           \
            int32_t b = f_bits(x[i]) & INT32_MAX;                                   \
            lo = b < lo ? b : lo;                                                   \
            hi = b > hi ? b : hi;                                                   \
        }                                                                           \
        *lo_out = lo, *hi_out = hi;                                                 \
    }

/* The body of an elementwise loop over n floats xv -> yv, run per chunk of
 * CHUNK with m, x, y and the chunk's |x| range lo, hi in scope. */
#define CHUNKS(SFX, ...)                                                            \
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {                                     \
        int64_t m = n - i0 < CHUNK ? n - i0 : CHUNK;                                \
        const float *restrict x = (const float *)xv + i0;                           \
        float *restrict y = (float *)yv + i0;                                       \
        int32_t lo, hi;                                                             \
        abs_range_##SFX(m, x, &lo, &hi);                                            \
        (void)lo;                                                                   \
        __VA_ARGS__                                                                 \
    }

#define VMATH_CORES(SFX, MADD)                                                          \
    /* e^x = 2^n e^r: n, the nearest integer to x log2(e), by the 1.5 * 2^23     \
     * rounding constant (whose low mantissa bits then hold n); r = x - n ln2     \
     * in two steps; e^r by a degree-6 polynomial, returned with n. Unsigned     \
     * arithmetic, so that a NaN's garbage n is not undefined behaviour. */      \
    static inline float exp_poly_##SFX(float x, int32_t *n_out)                     \
    {                                                                               \
        float t = MADD(x, 1.44269504088896341f, 12582912.0f);                       \
        float n = t - 12582912.0f;                                                  \
        *n_out = (int32_t)((uint32_t)f_bits(t) - 0x4B400000u);                      \
        float r = MADD(n, 2.12194440e-4f, MADD(-n, 0.693359375f, x));               \
        float y = 1.9875691500e-4f;                                                 \
        y = MADD(y, r, 1.3981999507e-3f);                                           \
        y = MADD(y, r, 8.3334519073e-3f);                                           \
        y = MADD(y, r, 4.1665795894e-2f);                                           \
        y = MADD(y, r, 1.6666665459e-1f);                                           \
        y = MADD(y, r, 5.0000001201e-1f);                                           \
        return MADD(y * r, r, r) + 1.0f;                                            \
    }                                                                               \
    /* e^x for x in [-87.33654, 88.37626] (or NaN): 2^n, n in [-126, 127],        \
     * built in the exponent field. */                                              \
    static inline float exp_clamped_##SFX(float x)                                  \
    {                                                                               \
        int32_t n;                                                                  \
        float y = exp_poly_##SFX(x, &n);                                            \
        return y * bits_f((int32_t)(((uint32_t)n + 127u) << 23));                   \
    }                                                                               \
    /* Sigmoid's and cross-entropy's e^x: clamped to the normal range. */           \
    static inline float exp_core_##SFX(float x)                                     \
    {                                                                               \
        x = blend(-(int32_t)(x > 88.37626f), 88.37626f, x);                         \
        x = blend(-(int32_t)(x < -87.33654f), -87.33654f, x);                       \
        return exp_clamped_##SFX(x);                                                \
    }                                                                               \
    /* The exp op's e^x over the whole float range: x is clamped to [-104, 89]      \
     * (outside it the result is 0 or +inf anyway) and 2^n, n in [-150, 128],       \
     * is applied as two normal factors, so results near overflow are finite        \
     * where they should be, overflow gives +inf and tiny ones round once into      \
     * the subnormals. */                                                           \
    static inline float exp_full_##SFX(float x)                                     \
    {                                                                               \
        x = blend(-(int32_t)(x > 89.0f), 89.0f, x);                                 \
        x = blend(-(int32_t)(x < -104.0f), -104.0f, x);                             \
        int32_t n;                                                                  \
        float y = exp_poly_##SFX(x, &n);                                            \
        int32_t n1 = n >> 1, n2 = n - n1;                                           \
        float s1 = bits_f((int32_t)(((uint32_t)n1 + 127u) << 23));                  \
        float s2 = bits_f((int32_t)(((uint32_t)n2 + 127u) << 23));                  \
        return (y * s1) * s2;                                                       \
    }                                                                               \
    /* tanh below |x| = 0.625: an odd polynomial in x. */                           \
    static inline float tanh_small_##SFX(float x)                                   \
    {                                                                               \
        float z = x * x;                                                            \
        float p = -5.70498872745e-3f;                                               \
        p = MADD(p, z, 2.06390887954e-2f);                                          \
        p = MADD(p, z, -5.37397155531e-2f);                                         \
        p = MADD(p, z, 1.33314422036e-1f);                                          \
        p = MADD(p, z, -3.33332819422e-1f);                                         \
        return MADD(p * z, x, x);                                                   \
    }                                                                               \
    /* tanh from |x| = 0.625: sign(x) (1 - 2 / (e^2|x| + 1)). */                    \
    static inline float tanh_big_##SFX(float x)                                     \
    {                                                                               \
        int32_t sign = f_bits(x) & INT32_MIN;                                       \
        /* 2|x| >= 0 (or NaN): only the upper clamp can apply */                    \
        float t = 2.0f * bits_f(f_bits(x) & INT32_MAX);                             \
        float e = exp_clamped_##SFX(blend(-(int32_t)(t > 88.37626f), 88.37626f, t)); \
        return bits_f(f_bits(1.0f - 2.0f / (e + 1.0f)) ^ sign);                     \
    }                                                                               \
    /* The same for 0.625 <= |x| < 44, where e^2|x| needs no clamp. */             \
    static inline float tanh_mid_##SFX(float x)                                     \
    {                                                                               \
        int32_t sign = f_bits(x) & INT32_MIN;                                       \
        float e = exp_clamped_##SFX(2.0f * bits_f(f_bits(x) & INT32_MAX));          \
        return bits_f(f_bits(1.0f - 2.0f / (e + 1.0f)) ^ sign);                     \
    }                                                                               \
    static inline float tanh_core_##SFX(float x)                                    \
    {                                                                               \
        float a = bits_f(f_bits(x) & INT32_MAX);                                    \
        return blend(-(int32_t)(a < 0.625f), tanh_small_##SFX(x), tanh_big_##SFX(x)); \
    }                                                                               \
    static inline float tanh_mixed_##SFX(float x) /* |x| < 44 */                    \
    {                                                                               \
        float a = bits_f(f_bits(x) & INT32_MAX);                                    \
        return blend(-(int32_t)(a < 0.625f), tanh_small_##SFX(x), tanh_mid_##SFX(x)); \
    }

#define VMATH_LOOPS(SFX, ATTR, MADD)                                                \
    ABS_RANGE(ATTR, SFX)                                                            \
    VMATH_CORES(SFX, MADD)                                                          \
    /* The elementwise loops go over chunks of CHUNK floats, first finding the      \
     * smallest and largest |x| of the chunk from the bits (NaN compares above      \
     * every number, as it does in the cores' blends). A chunk that lies            \
     * within one regime runs a loop with only that regime's formula: the same      \
     * bits as the general core, without its clamps or its other branch.            \
     * Most activations never come near exp's clamps, and tanh's inputs often       \
     * all lie on one side of 0.625. */                                             \
    ATTR static void exp_f32_##SFX(int64_t n, const void *xv, void *yv, double p)   \
    {                                                                               \
        (void)p;                                                                    \
        CHUNKS(SFX, if (hi < EXP_SAFE_BITS) /* e^x normal: no clamp, one 2^n factor */ \
                        for (int64_t i = 0; i < m; i++) y[i] = exp_clamped_##SFX(x[i]); \
                    else for (int64_t i = 0; i < m; i++) y[i] = exp_full_##SFX(x[i]);) \
    }                                                                               \
    ATTR static void tanh_f32_##SFX(int64_t n, const void *xv, void *yv, double p)  \
    {                                                                               \
        (void)p;                                                                    \
        CHUNKS(SFX, if (lo >= TANH_SPLIT_BITS && hi < TANH_NOCLAMP_BITS)            \
                        for (int64_t i = 0; i < m; i++) y[i] = tanh_mid_##SFX(x[i]);    \
                    else if (lo >= TANH_SPLIT_BITS)                                     \
                        for (int64_t i = 0; i < m; i++) y[i] = tanh_big_##SFX(x[i]);    \
                    else if (hi < TANH_SPLIT_BITS)                                      \
                        for (int64_t i = 0; i < m; i++) y[i] = tanh_small_##SFX(x[i]);  \
                    else if (hi < TANH_NOCLAMP_BITS)                                    \
                        for (int64_t i = 0; i < m; i++) y[i] = tanh_mixed_##SFX(x[i]);  \
                    else for (int64_t i = 0; i < m; i++) y[i] = tanh_core_##SFX(x[i]);) \
    }                                                                               \
    /* 1 / (1 + e^-x); e^-x saturates at e^88.4 for very negative x, giving ~0. */  \
    ATTR static void sigmoid_f32_##SFX(int64_t n, const void *xv, void *yv, double p) \
    {                                                                               \
        (void)p;                                                                    \
        CHUNKS(SFX, if (hi < EXP_SAFE_BITS)                                         \
                        for (int64_t i = 0; i < m; i++)                                 \
                            y[i] = 1.0f / (1.0f + exp_clamped_##SFX(-x[i]));            \
                    else for (int64_t i = 0; i < m; i++)                                \
                            y[i] = 1.0f / (1.0f + exp_core_##SFX(-x[i]));)              \
    }                                                                               \
    /* Cross-entropy rows: logp = (x - max) - log(sum e^(x - max)), the sum in      \
     * double (8 lanes, then their sum); loss = mean of -logp[target]. */           \
    ATTR static void ce_fwd_f32_##SFX(int64_t N, int64_t C, const void *xv, const int64_t *t, \
                                      void *lv, void *lossv)                        \
    {                                                                               \
        const float *x = xv;                                                        \
        float *lp = lv;                                                             \
        double acc = 0.0;                                                           \
        for (int64_t i = 0; i < N; i++) {                                           \
            const float *restrict xr = x + i * C;                                   \
            float *restrict yr = lp + i * C;                                        \
            /* the max in 16 lanes (exact: any order gives it), then the   \
             * sum of e^(x - max) in 8 double lanes: no serial chain of    \
             * compares or double adds along the row */                    \
            float ml[16];                                                           \
            for (int k = 0; k < 16; k++) ml[k] = -INFINITY;                         \
            int64_t j = 0;                                                          \
            for (; j + 16 <= C; j += 16)                                            \
                for (int k = 0; k < 16; k++) ml[k] = xr[j + k] > ml[k] ? xr[j + k] : ml[k]; \
            for (; j < C; j++) ml[0] = xr[j] > ml[0] ? xr[j] : ml[0];               \
            float mx = ml[0];                                                       \
            for (int k = 1; k < 16; k++) mx = ml[k] > mx ? ml[k] : mx;              \
            for (j = 0; j < C; j++) yr[j] = xr[j] - mx;                             \
            double sl[8] = {0};                                                     \
            for (int64_t j0 = 0; j0 < C; j0 += CE_CHUNK) {                          \
                float e[CE_CHUNK];                                                  \
                int64_t m = C - j0 < CE_CHUNK ? C - j0 : CE_CHUNK, k = 0;           \
                for (int64_t q = 0; q < m; q++) e[q] = exp_core_##SFX(yr[j0 + q]);  \
                for (; k + 8 <= m; k += 8)                                          \
                    for (int l = 0; l < 8; l++) sl[l] += (double)e[k + l];          \
                for (; k < m; k++) sl[0] += (double)e[k];                           \
            }                                                                       \
            double sum = ((sl[0] + sl[1]) + (sl[2] + sl[3])) + ((sl[4] + sl[5]) + (sl[6] + sl[7])); \
            float lse = (float)log(sum);                                            \
            for (int64_t j = 0; j < C; j++) yr[j] -= lse;                           \
            acc -= (double)yr[t[i]];                                                \
        }                                                                           \
        *(float *)lossv = (float)(N ? acc / (double)N : 0.0);                       \
    }                                                                               \
    /* gx = (e^logp - onehot(t)) * scale */                                         \
    ATTR static void ce_bwd_f32_##SFX(int64_t N, int64_t C, const void *lv, const int64_t *t, \
                                      double scale, void *gxv)                      \
    {                                                                               \
        const float *restrict lp = lv;                                              \
        float *restrict gx = gxv;                                                   \
        const float sc = (float)scale;                                              \
        for (int64_t i = 0; i < N * C; i++) gx[i] = exp_core_##SFX(lp[i]);          \
        for (int64_t i = 0; i < N; i++) gx[i * C + t[i]] -= 1.0f;                   \
        for (int64_t i = 0; i < N * C; i++) gx[i] *= sc;                            \
    }

#define CE_CHUNK 256
#define CHUNK 1024                 /* floats per range check (4 KiB) */
#define TANH_SPLIT_BITS 0x3F200000 /* 0.625f */
#define TANH_NOCLAMP_BITS 0x42300000 /* 44.0f: below it e^2|x| < e^88, no clamp */
#define EXP_SAFE_BITS 0x42AEAC4F   /* 87.33654f: |x| below it needs no clamp */
#define MADD_SEPARATE(a, b, c) ((a) * (b) + (c))
#define MADD_FUSED(a, b, c) __builtin_fmaf((a), (b), (c))
VMATH_LOOPS(base, , MADD_SEPARATE)
#ifdef TG_VMATH_MULTI
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#pragma GCC optimize("no-trapping-math")
VMATH_LOOPS(avx2, , MADD_FUSED)
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx512bw,fma,prefer-vector-width=512")
#pragma GCC optimize("no-trapping-math")
VMATH_LOOPS(avx512, , MADD_FUSED)
#pragma GCC pop_options
#endif

typedef struct vmath_set {
    const char *isa;
    tg_unary_fn exp, tanh, sigmoid;
    tg_ce_fwd_fn ce_fwd;
    tg_ce_bwd_fn ce_bwd;
} vmath_set;

static const vmath_set sets[] = {
#ifdef TG_VMATH_MULTI
    {"avx512", exp_f32_avx512, tanh_f32_avx512, sigmoid_f32_avx512, ce_fwd_f32_avx512,
     ce_bwd_f32_avx512},
    {"avx2", exp_f32_avx2, tanh_f32_avx2, sigmoid_f32_avx2, ce_fwd_f32_avx2,
     ce_bwd_f32_avx2},
#endif
    {"baseline", exp_f32_base, tanh_f32_base, sigmoid_f32_base, ce_fwd_f32_base,
     ce_bwd_f32_base},
};
enum { NSETS = sizeof sets / sizeof sets[0] };

static const char *vmath_isa = "baseline";

static bool cpu_runs(const char *isa)
{
#ifdef TG_VMATH_MULTI
    __builtin_cpu_init();
    if (!strcmp(isa, "avx512"))
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
    if (!strcmp(isa, "avx2")) return __builtin_cpu_supports("avx2");
#endif
    return !strcmp(isa, "baseline");
}

static void install(const vmath_set *v)
{
    tg__kernel_set(TG_K_EXP, TG_BACKEND_CPU, TG_F32, (tg_kernel_fn)v->exp);
    tg__kernel_set(TG_K_TANH, TG_BACKEND_CPU, TG_F32, (tg_kernel_fn)v->tanh);
    tg__kernel_set(TG_K_SIGMOID, TG_BACKEND_CPU, TG_F32, (tg_kernel_fn)v->sigmoid);
    tg__kernel_set(TG_K_CE_FWD, TG_BACKEND_CPU, TG_F32, (tg_kernel_fn)v->ce_fwd);
    tg__kernel_set(TG_K_CE_BWD, TG_BACKEND_CPU, TG_F32, (tg_kernel_fn)v->ce_bwd);
    vmath_isa = v->isa;
}

const char *tg_cpu_vector_isa(void)
{
    tg__backend_init();
    return vmath_isa;
}

tg_status tg_cpu_set_vector_isa(const char *isa)
{
    if (!isa) return tg__err(TG_ERR_NULL, "bad argument #1 to 'cpu_set_vector_isa' (NULL name)");
    tg__backend_init();
    for (int i = 0; i < NSETS; i++) {
        if (strcmp(sets[i].isa, isa)) continue;
        if (!cpu_runs(isa))
            return tg__err(TG_ERR_UNSUPPORTED, "bad argument #1 to 'cpu_set_vector_isa' (this "
                                               "CPU does not run %s)", isa);
        install(&sets[i]);
        return TG_OK;
    }
    return tg__err(TG_ERR_INVALID, "bad argument #1 to 'cpu_set_vector_isa' ('%s' is not one of "
                                   "avx512, avx2, baseline%s)", isa,
                   NSETS == 1 ? "; this build has only baseline" : "");
}

/* The widest set the CPU runs, capped by TAPEGRAD_VMATH (benchmarks). */
void tg__cpu_vmath_register(void)
{
    const char *cap = getenv("TAPEGRAD_VMATH");
    int first = 0;
    for (int i = 0; cap && i < NSETS; i++)
        if (!strcmp(sets[i].isa, cap)) first = i;
    for (int i = first; i < NSETS; i++) {
        if (cpu_runs(sets[i].isa)) {
            install(&sets[i]);
            return;
        }
    }
}
