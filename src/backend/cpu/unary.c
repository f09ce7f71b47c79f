/* cpu backend: the unary maps that are one arithmetic operation (neg,
 * relu, add_scalar, mul_scalar) and the fused gradients gx = gy * f'(s)
 * of tanh, sigmoid, relu and exp, as unit-stride loops. The maps with a
 * transcendental (exp, tanh, sigmoid) are in vmath.c. */
#include "backend/cpu/loops.h"

#define DEF_MAP(name, T, expr)                                                      \
    TG_CLONES static void name(int64_t n, const void *xv, void *yv, double p)                 \
    {                                                                               \
        const T *x = xv;                                                            \
        T *y = yv;                                                                  \
        const T q = (T)p;                                                           \
        (void)q;                                                                    \
        for (int64_t i = 0; i < n; i++) {                                           \
            T v = x[i];                                                             \
            y[i] = (T)(expr);                                                       \
        }                                                                           \
    }

#define DEF_GRADMAP(name, T, expr)                                                  \
    TG_CLONES static void name(int64_t n, const void *sv, const void *gyv, void *gxv, double p) \
    {                                                                               \
        const T *s = sv, *gy = gyv;                                                 \
        T *gx = gxv;                                                                \
        (void)p;                                                                    \
        for (int64_t i = 0; i < n; i++) {                                           \
            T v = s[i], g = gy[i];                                                  \
            gx[i] = (T)(expr);                                                      \
        }                                                                           \
    }

#define MAP_SET(T, SFX)                                                             \
    DEF_MAP(neg_##SFX, T, -v)                                                       \
    DEF_MAP(relu_##SFX, T, v <= 0 ? (T)0 : v)                                        \
    DEF_MAP(adds_##SFX, T, v + q)                                                   \
    DEF_MAP(muls_##SFX, T, v * q)                                                   \
    DEF_GRADMAP(tanh_grad_##SFX, T, g * ((T)1 - v * v))                             \
    DEF_GRADMAP(sigmoid_grad_##SFX, T, g * v * ((T)1 - v))                          \
    DEF_GRADMAP(relu_grad_##SFX, T, v <= 0 ? (T)0 : g)                               \
    DEF_GRADMAP(exp_grad_##SFX, T, g * v)

MAP_SET(float, f32)
MAP_SET(double, f64)

void tg__cpu_unary_register(void)
{
    const tg_backend C = TG_BACKEND_CPU;
#define SET2(K, name)                                                               \
    tg__kernel_set(TG_K_##K, C, TG_F32, (tg_kernel_fn)name##_f32);                  \
    tg__kernel_set(TG_K_##K, C, TG_F64, (tg_kernel_fn)name##_f64);
    SET2(NEG, neg) SET2(RELU, relu) SET2(ADD_SCALAR, adds) SET2(MUL_SCALAR, muls)
    SET2(TANH_GRAD, tanh_grad) SET2(SIGMOID_GRAD, sigmoid_grad) SET2(RELU_GRAD, relu_grad)
    SET2(EXP_GRAD, exp_grad)
#undef SET2
}
