/* Helpers for the ops' gradcheck sample functions (tg_op.sample). */
#ifndef TG_OPS_SAMPLE_H
#define TG_OPS_SAMPLE_H

#include "dispatch/dispatch.h"

/* f64 tensor on the default backend, uniform in [lo, hi). */
TG_INTERNAL tg_tensor *tg__sample_uniform(tg_rng *rng, int ndim, const int64_t *shape, double lo,
                                          double hi);
/* f64 tensor whose entries are distinct and at least 0.05 apart (for max),
 * in random order. */
TG_INTERNAL tg_tensor *tg__sample_distinct(tg_rng *rng, int ndim, const int64_t *shape);
/* f64 tensor with |x| in [lo, hi) and a random sign (away from kinks at 0). */
TG_INTERNAL tg_tensor *tg__sample_away_from_zero(tg_rng *rng, int ndim, const int64_t *shape,
                                                 double lo, double hi);

#define TG_SHAPE(...) ((const int64_t[]){__VA_ARGS__})

#endif
