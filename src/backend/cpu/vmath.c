/* cpu backend: f32 exp, tanh, sigmoid and cross-entropy as branch-free loops
 * (libm's scalar calls dominated elementwise workloads). exp (the op, and
 * inside sigmoid and tanh) by a 16-entry table scheme (below); tanh by
 * Cephes' odd polynomial below |x| = 0.625 and 1 - 2 / (e^2|x| + 1) above;
 * cross-entropy's exp by Cephes' n ln2 + r reduction and 1 + r + r^2 P(r),
 * P of degree 5. Against double libm, over every 97th float bit pattern:
 * exp within 0.68 ulp, tanh 1.31, sigmoid 2.42. The exp op covers the whole
 * float range (subnormal results, +inf on overflow). The ref-vs-cpu tests
 * check them against ref, which keeps libm. */
/* The first scheduling pass (off by default on x86) interleaves the
 * independent evaluations of a group of vectors (vmath_simd.h); it
 * reorders operations, it does not change one, so the bits stay those of
 * the scalar cores. For the whole file: GCC does not inline a function
 * into one compiled with other optimization options. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("schedule-insns", "sched-pressure")
#endif
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
#include <immintrin.h>
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

/* The exp op, sigmoid and tanh take e^x = 2^k 2^(j/16) e^r: n = 16k + j,
 * the nearest integer to x 16/ln2 (by the 1.5 * 2^23 rounding constant,
 * whose low mantissa bits then hold n), r = x - n ln2/16 in two steps
 * (|r| <= ln2/32), e^r - 1 by r (1 + r (1/2 + r/6)), 2^(j/16) from a
 * 16-entry table as a float and the float nearest the rest, and 2^k added
 * into the exponent field. Seven multiply-adds an element where Cephes'
 * scheme needs eleven; tanh's and sigmoid's loops are then bound by their
 * division as much as by the FMA unit. The AVX2 and AVX-512 variants look
 * the table up with register permutes (vmath_simd.h); the scalar cores
 * (baseline, and the tails of those loops) index it, with the same
 * arithmetic. Cross-entropy keeps Cephes' exp, whose loop the compiler
 * vectorizes as plain C. */
static const float texp_hi[16] = {
    1.000000000e+00f, 1.044273734e+00f, 1.090507746e+00f, 1.138788581e+00f,
    1.189207077e+00f, 1.241857767e+00f, 1.296839595e+00f, 1.354255557e+00f,
    1.414213538e+00f, 1.476826191e+00f, 1.542210817e+00f, 1.610490322e+00f,
    1.681792855e+00f, 1.756252170e+00f, 1.834008098e+00f, 1.915206552e+00f};
static const float texp_lo[16] = {
    0.000000000e+00f, 4.833470157e-08f,  -1.307753994e-08f, 5.386222313e-08f,
    3.797635273e-08f, 4.496838102e-08f,  -4.018999533e-08f, -1.012334927e-08f,
    2.420323497e-08f, -4.500898854e-08f, 8.070904833e-09f,  9.836217174e-09f,
    -2.475532668e-08f, -9.235770371e-09f, -1.123927795e-08f, 9.845328108e-09f};
#define TEXP_L16 2.308312035e+01f              /* 16 / ln 2 */
#define TEXP_C1 (0.693359375f / 16.0f)         /* ln2 / 16 = C1 - C2, C1 short */
#define TEXP_C2 (2.12194440e-4f / 16.0f)
#define TEXP_R3 1.66666672e-1f                 /* 1/6 */

/* Cephes' tanh below |x| = 0.625: x + x z (P0 + P1 z + ... + P4 z^4), z = x^2 */
#define TANH_P0 -3.33332819422e-1f
#define TANH_P1 1.33314422036e-1f
#define TANH_P2 -5.37397155531e-2f
#define TANH_P3 2.06390887954e-2f
#define TANH_P4 -5.70498872745e-3f

/* Smallest and largest bit pattern of |x[i]| over m > 0 floats; for
 * non-negative floats the integer order of the bits is the numeric order,
 * and NaNs come above +inf. Integer min/max reductions vectorize. */
#define ABS_RANGE(SFX)                                                              \
    static inline void abs_range_##SFX(int64_t m, const float *restrict x,     \
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

/* The body of an elementwise loop over n floats xv -> yv. It checks the
 * chunk of CHUNK floats at i (its |x| range lo, hi), and the body, for the
 * regime that range lies in, calls RUN(SFX, loop): the regime's loop over
 * the chunk, then its run past the chunk for as long as the data stays in
 * the regime (a test of each group's |x| in the same loop, cheaper than a
 * separate pass); the next chunk check comes where the run stops. */
#define CHUNKS(SFX, ...)                                                            \
    const float *xs = xv;                                                           \
    float *ys = yv;                                                                 \
    for (int64_t i = 0; i < n;) {                                                   \
        int64_t m = n - i < CHUNK ? n - i : CHUNK;                                  \
        int32_t lo, hi;                                                             \
        abs_range_##SFX(m, xs + i, &lo, &hi);                                       \
        (void)lo;                                                                   \
        __VA_ARGS__                                                                 \
    }
#define RUN(SFX, loop) (loop##_##SFX(m, xs + i, ys + i), i = loop##_run_##SFX(i + m, n, xs, ys))
#define ONCE(SFX, loop) (loop##_##SFX(m, xs + i, ys + i), i += m)

#define VMATH_CORES(SFX, MADD)                                                          \
    /* e^x = 2^n e^r: n, the nearest integer to x log2(e), by the 1.5 * 2^23     \
     * rounding constant (whose low mantissa bits then hold n); r = x - n ln2     \
     * in two steps; e^r by 1 + r + r^2 P(r), returned with n. Unsigned          \
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
    /* Cross-entropy's e^x (Cephes): clamped to the normal range. */               \
    static inline float exp_core_##SFX(float x)                                     \
    {                                                                               \
        x = blend(-(int32_t)(x > 88.37626f), 88.37626f, x);                         \
        x = blend(-(int32_t)(x < -87.33654f), -87.33654f, x);                       \
        return exp_clamped_##SFX(x);                                                \
    }                                                                               \
    /* 2^(j/16) e^r of the table scheme above, n = 16k + j returned. */            \
    static inline float texp_poly_##SFX(float x, int32_t *n_out)                    \
    {                                                                               \
        float t = MADD(x, TEXP_L16, 12582912.0f);                                   \
        float n = t - 12582912.0f;                                                  \
        int32_t ni = (int32_t)((uint32_t)f_bits(t) - 0x4B400000u);                  \
        float r = MADD(n, TEXP_C2, MADD(-n, TEXP_C1, x));                           \
        float p = MADD(MADD(TEXP_R3, r, 0.5f), r, 1.0f) * r;                        \
        float th = texp_hi[ni & 15];                                                \
        *n_out = ni;                                                                \
        return MADD(th, p, texp_lo[ni & 15]) + th;                                  \
    }                                                                               \
    /* e^x where the result is normal: |x| < 87, or x in [0, 88.37626]. */         \
    static inline float texp_fast_##SFX(float x)                                    \
    {                                                                               \
        int32_t n;                                                                  \
        float y = texp_poly_##SFX(x, &n);                                           \
        return bits_f((int32_t)((uint32_t)f_bits(y) + ((uint32_t)(n >> 4) << 23))); \
    }                                                                               \
    /* e^x over the whole float range: x clamped to [-104, 89] (outside it the     \
     * result is 0 or +inf anyway) and 2^k, k in [-151, 128], applied as two       \
     * normal factors, so results near overflow are finite where they should be,   \
     * overflow gives +inf and tiny results round once into the subnormals. For    \
     * normal results the same bits as texp_fast. */                              \
    static inline float texp_full_##SFX(float x)                                    \
    {                                                                               \
        x = blend(-(int32_t)(x > 89.0f), 89.0f, x);                                 \
        x = blend(-(int32_t)(x < -104.0f), -104.0f, x);                             \
        int32_t n;                                                                  \
        float y = texp_poly_##SFX(x, &n);                                           \
        int32_t k = n >> 4, k1 = k >> 1, k2 = k - k1;                               \
        float s1 = bits_f((int32_t)(((uint32_t)k1 + 127u) << 23));                  \
        float s2 = bits_f((int32_t)(((uint32_t)k2 + 127u) << 23));                  \
        return (y * s1) * s2;                                                       \
    }                                                                               \
    /* tanh below |x| = 0.625: an odd polynomial in x. */                           \
    static inline float tanh_small_##SFX(float x)                                   \
    {                                                                               \
        float z = x * x;                                                            \
        float p = TANH_P4;                                                          \
        p = MADD(p, z, TANH_P3);                                                    \
        p = MADD(p, z, TANH_P2);                                                    \
        p = MADD(p, z, TANH_P1);                                                    \
        p = MADD(p, z, TANH_P0);                                                    \
        return MADD(p * z, x, x);                                                   \
    }                                                                               \
    /* tanh from |x| = 0.625: sign(x) (1 - 2 / (e^2|x| + 1)). */                    \
    static inline float tanh_big_##SFX(float x)                                     \
    {                                                                               \
        int32_t sign = f_bits(x) & INT32_MIN;                                       \
        /* 2|x| >= 0 (or NaN): only the upper clamp can apply */                    \
        float t = 2.0f * bits_f(f_bits(x) & INT32_MAX);                             \
        float e = texp_fast_##SFX(blend(-(int32_t)(t > 88.37626f), 88.37626f, t));  \
        return bits_f(f_bits(1.0f - 2.0f / (e + 1.0f)) ^ sign);                     \
    }                                                                               \
    /* The same for 0.625 <= |x| < 44, where e^2|x| needs no clamp. */             \
    static inline float tanh_mid_##SFX(float x)                                     \
    {                                                                               \
        int32_t sign = f_bits(x) & INT32_MIN;                                       \
        float e = texp_fast_##SFX(2.0f * bits_f(f_bits(x) & INT32_MAX));            \
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

/* Fewer than FEW_MAX floats (a scalar tape's one-element tensors): each
 * through the scalar formula of its own regime, chosen by a branch on its
 * |x| (the chunk check below would choose the same for a chunk of one, and
 * the regime loops' scalar tails run these formulas: the same bits),
 * without the chunk check and the loops' set-up, which cost a one-element
 * tanh about 70 instructions. tanh_big is tanh_mid with the clamp that
 * |x| >= 44 needs. */
#define FEW_MAX 4
#define FEW(expr)                                                                   \
    if (n < FEW_MAX) {                                                              \
        const float *xf = xv;                                                       \
        float *yf = yv;                                                             \
        for (int64_t i = 0; i < n; i++) {                                           \
            float x = xf[i];                                                        \
            yf[i] = (expr);                                                         \
        }                                                                           \
        return;                                                                     \
    }

#define VMATH_LOOPS(SFX)                                                            \
    /* The elementwise loops check a chunk of CHUNK floats, finding the            \
     * smallest and largest |x| of the chunk from the bits (NaN compares above      \
     * every number, as it does in the cores' blends). A chunk that lies            \
     * within one regime runs a loop with only that regime's formula: the same      \
     * bits as the general core, without its clamps or its other branch; the        \
     * vector loops then run on while the data stays in the regime (CHUNKS).        \
     * Most activations never come near exp's clamps, and tanh's inputs often       \
     * all lie on one side of 0.625. */                                             \
    static void exp_f32_##SFX(int64_t n, const void *xv, void *yv, double p)   \
    {                                                                               \
        (void)p;                                                                    \
        FEW((f_bits(x) & INT32_MAX) < EXP_SAFE_BITS ? texp_fast_##SFX(x)            \
                                                    : texp_full_##SFX(x));          \
        CHUNKS(SFX, if (hi < EXP_SAFE_BITS) RUN(SFX, vexp_fast); /* normal */       \
                    else ONCE(SFX, vexp_full);)                                     \
    }                                                                               \
    static void tanh_f32_##SFX(int64_t n, const void *xv, void *yv, double p)  \
    {                                                                               \
        (void)p;                                                                    \
        FEW((f_bits(x) & INT32_MAX) < TANH_SPLIT_BITS ? tanh_small_##SFX(x)         \
                                                      : tanh_big_##SFX(x));         \
        CHUNKS(SFX, if (lo >= TANH_SPLIT_BITS && hi < TANH_NOCLAMP_BITS)            \
                        RUN(SFX, vtanh_mid);                                        \
                    else if (lo >= TANH_SPLIT_BITS) RUN(SFX, vtanh_big);            \
                    else if (hi < TANH_SPLIT_BITS) RUN(SFX, vtanh_small);           \
                    else if (hi < TANH_NOCLAMP_BITS) RUN(SFX, vtanh_mixed);         \
                    else ONCE(SFX, vtanh_core);)                                    \
    }                                                                               \
    /* 1 / (1 + e^-x): for very negative x, e^-x is +inf and the result 0. */      \
    static void sigmoid_f32_##SFX(int64_t n, const void *xv, void *yv, double p) \
    {                                                                               \
        (void)p;                                                                    \
        FEW(1.0f / (1.0f + ((f_bits(x) & INT32_MAX) < EXP_SAFE_BITS                 \
                                ? texp_fast_##SFX(-x) : texp_full_##SFX(-x))));     \
        CHUNKS(SFX, if (hi < EXP_SAFE_BITS) RUN(SFX, vsigmoid_fast);                \
                    else ONCE(SFX, vsigmoid_full);)                                 \
    }                                                                               \
    /* Cross-entropy rows: logp = (x - max) - log(sum e^(x - max)), the sum in      \
     * double (8 lanes, then their sum); loss = mean of -logp[target]. */           \
    static void ce_fwd_f32_##SFX(int64_t N, int64_t C, const void *xv, const int64_t *t, \
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
    static void ce_bwd_f32_##SFX(int64_t N, int64_t C, const void *lv, const int64_t *t, \
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
#define EXP_SAFE_BITS 0x42AE0000   /* 87.0f: |x| below it, e^x is normal */
#define MADD_SEPARATE(a, b, c) ((a) * (b) + (c))
#define MADD_FUSED(a, b, c) __builtin_fmaf((a), (b), (c))

/* Baseline: the loops vmath_simd.h gives the vector ISAs, as scalar loops
 * over the cores (the compiler vectorizes what it can). */
#define SCALAR_LOOP(SFX, name, expr)                                                \
    static void name##_##SFX(int64_t m, const float *restrict x, float *restrict y) \
    {                                                                               \
        for (int64_t i = 0; i < m; i++) y[i] = expr;                                \
    }
/* No run past a chunk: each chunk is checked (the check vectorizes here,
 * a test inside the scalar cores' loop would not). */
#define SCALAR_RUN(SFX, name)                                                       \
    static inline int64_t name##_run_##SFX(int64_t i, int64_t n, const float *x,   \
                                           float *y)                                \
    {                                                                               \
        (void)n, (void)x, (void)y;                                                  \
        return i;                                                                   \
    }
#define SCALAR_LOOPS(SFX)                                                           \
    SCALAR_RUN(SFX, vexp_fast)                                                      \
    SCALAR_RUN(SFX, vsigmoid_fast)                                                  \
    SCALAR_RUN(SFX, vtanh_mid)                                                      \
    SCALAR_RUN(SFX, vtanh_big)                                                      \
    SCALAR_RUN(SFX, vtanh_small)                                                    \
    SCALAR_RUN(SFX, vtanh_mixed)                                                    \
    SCALAR_LOOP(SFX, vexp_fast, texp_fast_##SFX(x[i]))                              \
    SCALAR_LOOP(SFX, vexp_full, texp_full_##SFX(x[i]))                              \
    SCALAR_LOOP(SFX, vsigmoid_fast, 1.0f / (1.0f + texp_fast_##SFX(-x[i])))         \
    SCALAR_LOOP(SFX, vsigmoid_full, 1.0f / (1.0f + texp_full_##SFX(-x[i])))         \
    SCALAR_LOOP(SFX, vtanh_mid, tanh_mid_##SFX(x[i]))                               \
    SCALAR_LOOP(SFX, vtanh_big, tanh_big_##SFX(x[i]))                               \
    SCALAR_LOOP(SFX, vtanh_small, tanh_small_##SFX(x[i]))                           \
    SCALAR_LOOP(SFX, vtanh_mixed, tanh_mixed_##SFX(x[i]))                           \
    SCALAR_LOOP(SFX, vtanh_core, tanh_core_##SFX(x[i]))

ABS_RANGE(base)
VMATH_CORES(base, MADD_SEPARATE)
SCALAR_LOOPS(base)
VMATH_LOOPS(base)
#ifdef TG_VMATH_MULTI
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#pragma GCC optimize("no-trapping-math")
ABS_RANGE(avx2)
VMATH_CORES(avx2, MADD_FUSED)
#define VSFX avx2
#define VF __m256
#define VI __m256i
#define VW 8
#define VSET1 _mm256_set1_ps
#define VSET1I _mm256_set1_epi32
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VFMA _mm256_fmadd_ps
#define VFNMA _mm256_fnmadd_ps
#define VADD _mm256_add_ps
#define VSUB _mm256_sub_ps
#define VMUL _mm256_mul_ps
#define VDIV _mm256_div_ps
#define VMIN _mm256_min_ps
#define VMAX _mm256_max_ps
#define VAND _mm256_and_ps
#define VXOR _mm256_xor_ps
#define VCASTI _mm256_castps_si256
#define VCASTF _mm256_castsi256_ps
#define VIADD _mm256_add_epi32
#define VIAND _mm256_and_si256
#define VISUB _mm256_sub_epi32
#define VISRA _mm256_srai_epi32
#define VISLL _mm256_slli_epi32
/* 16 entries from two 8-lane permutes, bit 3 of the index choosing */
#define VLUT16(tab, i)                                                              \
    _mm256_blendv_ps(_mm256_permutevar8x32_ps(_mm256_loadu_ps(tab), (i)),           \
                     _mm256_permutevar8x32_ps(_mm256_loadu_ps((tab) + 8), (i)),     \
                     _mm256_castsi256_ps(_mm256_slli_epi32((i), 28)))
#define VSELECT_LT(a, c, x, y) _mm256_blendv_ps((y), (x), _mm256_cmp_ps((a), (c), _CMP_LT_OQ))
/* Lanes of non-negative int32 a at or above, or below, the bound b, as bits */
#define VBAD_GE(a, b)                                                               \
    ((unsigned)_mm256_movemask_ps(                                                  \
        _mm256_castsi256_ps(_mm256_cmpgt_epi32((a), _mm256_set1_epi32((b) - 1)))))
#define VBAD_LT(a, b)                                                               \
    ((unsigned)_mm256_movemask_ps(                                                  \
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(b), (a)))))
#include "backend/cpu/vmath_simd.h"
VMATH_LOOPS(avx2)
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx512bw,fma,prefer-vector-width=512")
#pragma GCC optimize("no-trapping-math")
ABS_RANGE(avx512)
VMATH_CORES(avx512, MADD_FUSED)
#define VSFX avx512
#define VF __m512
#define VI __m512i
#define VW 16
#define VSET1 _mm512_set1_ps
#define VSET1I _mm512_set1_epi32
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VFMA _mm512_fmadd_ps
#define VFNMA _mm512_fnmadd_ps
#define VADD _mm512_add_ps
#define VSUB _mm512_sub_ps
#define VMUL _mm512_mul_ps
#define VDIV _mm512_div_ps
#define VMIN _mm512_min_ps
#define VMAX _mm512_max_ps
#define VAND _mm512_and_ps
#define VXOR _mm512_xor_ps
#define VCASTI _mm512_castps_si512
#define VCASTF _mm512_castsi512_ps
#define VIADD _mm512_add_epi32
#define VIAND _mm512_and_si512
#define VISUB _mm512_sub_epi32
#define VISRA _mm512_srai_epi32
#define VISLL _mm512_slli_epi32
#define VLUT16(tab, i) _mm512_permutexvar_ps((i), _mm512_loadu_ps(tab))
#define VSELECT_LT(a, c, x, y)                                                      \
    _mm512_mask_blend_ps(_mm512_cmp_ps_mask((a), (c), _CMP_LT_OQ), (y), (x))
#define VBAD_GE(a, b) ((unsigned)_mm512_cmpge_epi32_mask((a), _mm512_set1_epi32(b)))
#define VBAD_LT(a, b) ((unsigned)_mm512_cmplt_epi32_mask((a), _mm512_set1_epi32(b)))
#include "backend/cpu/vmath_simd.h"
VMATH_LOOPS(avx512)
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
