/* Input generators for gradcheck cases: raw, untracked f64 tensors. */
#include "ops/sample.h"

tg_tensor *tg__sample_uniform(tg_rng *rng, int ndim, const int64_t *shape, double lo, double hi)
{
    tg_tensor *t = tg__tensor_empty(TG_F64, ndim, shape, tg_default_backend());
    if (!t) return NULL;
    double *p = tg__tensor_ptr(t);
    for (int64_t i = 0; i < t->numel; i++) p[i] = lo + (hi - lo) * tg_rng_double(rng);
    return t;
}

tg_tensor *tg__sample_away_from_zero(tg_rng *rng, int ndim, const int64_t *shape, double lo,
                                     double hi)
{
    tg_tensor *t = tg__sample_uniform(rng, ndim, shape, lo, hi);
    if (!t) return NULL;
    double *p = tg__tensor_ptr(t);
    for (int64_t i = 0; i < t->numel; i++)
        if (tg_rng_next(rng) & 1) p[i] = -p[i];
    return t;
}

tg_tensor *tg__sample_distinct(tg_rng *rng, int ndim, const int64_t *shape)
{
    tg_tensor *t = tg__tensor_empty(TG_F64, ndim, shape, tg_default_backend());
    if (!t) return NULL;
    double *p = tg__tensor_ptr(t);
    int64_t n = t->numel;
    for (int64_t i = 0; i < n; i++) p[i] = ((double)i - (double)n / 2) * 0.1 + 0.02 * tg_rng_double(rng);
    for (int64_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
        int64_t j = (int64_t)(tg_rng_next(rng) % (uint64_t)(i + 1));
        double v = p[i];
        p[i] = p[j];
        p[j] = v;
    }
    return t;
}
