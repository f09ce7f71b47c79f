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

/* Shared by max_dim and min_dim (src/ops/reduce.c): the backward that
 * scatters the gradient to the saved indices (extra slot 0; attrs.ints[0]
 * the dim), and their gradcheck cases (distinct values, no ties). */
TG_INTERNAL tg_status tg__dim_select_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin);
TG_INTERNAL int tg__dim_select_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a);

#define TG_SHAPE(...) ((const int64_t[]){__VA_ARGS__})

#endif
