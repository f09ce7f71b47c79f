/* cpu backend: f32 exp, tanh and sigmoid as branch-free polynomial loops
 * the compiler vectorizes (libm's scalar calls dominated elementwise
 * workloads). Cephes' single-precision schemes: exp by n ln2 + r range
 * reduction and a degree-6 polynomial, tanh by an odd polynomial below
 * 0.625 and 1 - 2 / (e^2|x| + 1) above. Errors stay within a few ulp of
 * libm's, which the ref-vs-cpu tests check (ref keeps libm). */
#include <stdint.h>
#include <string.h>

#include "backend/kernels.h"

/* Selects on float compares (clamps, relu) only become vector blends when
 * the compiler may ignore FP exception flags, which nothing here reads. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

static inline float exp_core(float x)
{
    x = x > 88.37626f ? 88.37626f : x;
    x = x < -87.33654f ? -87.33654f : x;
    float fx = x * 1.44269504088896341f + 0.5f;
    int32_t i = (int32_t)fx;
    i -= (float)i > fx; /* floor */
    float n = (float)i;
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    int32_t bits = (i + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

static inline float tanh_core(float x)
{
    float a = x < 0 ? -x : x;
    float z = x * x;
    float p = -5.70498872745e-3f;
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    float small = p * z * x + x;
    float e = exp_core(2.0f * a);
    float big = 1.0f - 2.0f / (e + 1.0f);
    big = x < 0 ? -big : big;
    return a < 0.625f ? small : big;
}

static void exp_f32(int64_t n, const void *xv, void *yv, double p)
{
    const float *x = xv;
    float *y = yv;
    (void)p;
    for (int64_t i = 0; i < n; i++) y[i] = exp_core(x[i]);
}

static void tanh_f32(int64_t n, const void *xv, void *yv, double p)
{
    const float *x = xv;
    float *y = yv;
    (void)p;
    for (int64_t i = 0; i < n; i++) y[i] = tanh_core(x[i]);
}

/* 1 / (1 + e^-x); e^-x saturates at e^87 for very negative x, giving ~0. */
static void sigmoid_f32(int64_t n, const void *xv, void *yv, double p)
{
    const float *x = xv;
    float *y = yv;
    (void)p;
    for (int64_t i = 0; i < n; i++) y[i] = 1.0f / (1.0f + exp_core(-x[i]));
}

void tg__cpu_vmath_register(void)
{
    tg__kernel_set(TG_K_EXP, TG_BACKEND_CPU, TG_F32, (tg_kernel_fn)exp_f32);
    tg__kernel_set(TG_K_TANH, TG_BACKEND_CPU, TG_F32, (tg_kernel_fn)tanh_f32);
    tg__kernel_set(TG_K_SIGMOID, TG_BACKEND_CPU, TG_F32, (tg_kernel_fn)sigmoid_f32);
}
