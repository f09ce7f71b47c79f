/* ref backend: random masks, drawn from a tg_rng seeded by the caller so
 * every backend draws the same numbers. */
#include "backend/kernels.h"

#define DEF_DROPOUT(SFX, T)                                                        \
    static void dropout_mask_##SFX(int64_t n, uint64_t seed, double p, double scale, void *mv) \
    {                                                                              \
        T *m = mv;                                                                 \
        tg_rng rng;                                                                \
        tg_rng_seed(&rng, seed);                                                   \
        for (int64_t i = 0; i < n; i++) m[i] = (T)(tg_rng_double(&rng) >= p ? scale : 0.0); \
    }
DEF_DROPOUT(f32, float)
DEF_DROPOUT(f64, double)

void tg__ref_random_register(void)
{
    const tg_backend R = TG_BACKEND_REF;
#define SET2(K, name)                                                              \
    tg__kernel_set(TG_K_##K, R, TG_F32, (tg_kernel_fn)name##_f32);                 \
    tg__kernel_set(TG_K_##K, R, TG_F64, (tg_kernel_fn)name##_f64);
    SET2(DROPOUT_MASK, dropout_mask)
#undef SET2
}
