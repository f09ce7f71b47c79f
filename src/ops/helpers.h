/* The one internal header of op helpers, for every file in src/ops:
 * attrs packing, constants on a given backend, broadcast descriptions,
 * gradient un-broadcasting, dim attrs, and the input generators of the
 * ops' gradcheck sample functions (tg_op.sample). */
#ifndef TG_OPS_HELPERS_H
#define TG_OPS_HELPERS_H

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


/* A second double parameter (clamp's hi, softplus's threshold) travels in
 * attrs.ints[slot] as its bit pattern: attrs have one double field. */
TG_INTERNAL void tg__attrs_put_f64(tg_op_attrs *a, int slot, double v);
TG_INTERNAL double tg__attrs_get_f64(const tg_op_attrs *a, int slot);

/* A new tensor filled with v that the caller owns (release it); safe
 * before any op has run. */
TG_INTERNAL tg_tensor *tg__filled(tg_dtype dtype, int ndim, const int64_t *shape,
                                  tg_backend backend, double v);
/* Untracked constant tensors owned by the innermost scope (backward
 * functions run in one): filled with v, of spec / 0-d of dtype, on backend. */
TG_INTERNAL tg_tensor *tg__full(const tg_spec *spec, tg_backend backend, double v);
TG_INTERNAL tg_tensor *tg__scalar(tg_dtype dtype, tg_backend backend, double v);

/* Broadcast shape of up to three tensors (NumPy rules) into out (dtype of
 * t[1] when n == 3, else of t[0]); records a "bad argument" error naming
 * op on a mismatch. */
TG_INTERNAL tg_status tg__broadcast3(const tg_op *op, int n, tg_tensor *const *t,
                                         tg_spec *out);
/* Kernel description for operands t[0..n) read against out. */
TG_INTERNAL void tg__bcast3_desc(const tg_spec *out, int n, tg_tensor *const *t,
                                     tg_bcast3 *bc);
/* g (broadcast shape) summed back to the shape of spec; g itself if equal. */
TG_INTERNAL tg_tensor *tg__unbroadcast(tg_tensor *g, const tg_spec *spec);
/* tg_sum_to(x, ndim, shape) written into `into` (tg__call_into): a
 * backward's gradient into the sink it took. */
TG_INTERNAL tg_tensor *tg__sum_to_into(tg_tensor *x, int ndim, const int64_t *shape,
                                       tg_tensor *into);

/* TG_OK if x has at least one dim, else a shape error naming op (arg #1). */
TG_INTERNAL tg_status tg__need_dims(const tg_op *op, const tg_tensor *x);

/* Dim attr (attrs.ints[0]) normalised against ndim (valid by the shape
 * rule). */
TG_INTERNAL int tg__dim_attr(const tg_op_attrs *a, int ndim);

/* i64 tensor of shape with entries uniform in [0, hi), default backend. */
TG_INTERNAL tg_tensor *tg__sample_index(tg_rng *rng, int ndim, const int64_t *shape,
                                            int64_t hi);
/* f64 tensor uniform in [lo, hi) with no entry within gap of any of the
 * npts points in pts (kinks of the op being checked). */
TG_INTERNAL tg_tensor *tg__sample_avoiding(tg_rng *rng, int ndim, const int64_t *shape,
                                               double lo, double hi, int npts,
                                               const double *pts, double gap);

/* A unary map as the fused pointwise interpreter (ops/fused.c) runs it:
 * its kernel and fused gradient kernel (unary.c's tables), whether it
 * takes a second parameter, whether the gradient kernel reads the output
 * (else the input), and its fused gradient op (for a recorded backward).
 * The linear maps (neg, add_scalar, mul_scalar) have gop NULL and gkid 0:
 * their gradient is the map of the gradient (add_scalar: the gradient). */
typedef struct tg__map_info {
    const tg_op *op, *gop;
    tg_kernel_id kid, gkid;
    bool two, from_output;
} tg__map_info;
/* Fills *out with op's entry; false when op is no unary map. */
TG_INTERNAL bool tg__map_info_of(const tg_op *op, tg__map_info *out);

#endif
