/* Helpers shared by the ext op family (src/ops/ext_*.c): attrs packing,
 * constants on a given backend, three-way broadcast descriptions,
 * gradient un-broadcasting and sample generators. */
#ifndef TG_OPS_EXT_COMMON_H
#define TG_OPS_EXT_COMMON_H

#include "ops/sample.h"

/* A second double parameter (clamp's hi, softplus's threshold) travels in
 * attrs.ints[slot] as its bit pattern: attrs have one double field. */
TG_INTERNAL void tg__ext_put_f64(tg_op_attrs *a, int slot, double v);
TG_INTERNAL double tg__ext_get_f64(const tg_op_attrs *a, int slot);

/* Untracked constant tensors owned by the innermost scope (backward
 * functions run in one): filled with v, of spec / 0-d of dtype, on backend. */
TG_INTERNAL tg_tensor *tg__ext_full(const tg_spec *spec, tg_backend backend, double v);
TG_INTERNAL tg_tensor *tg__ext_scalar(tg_dtype dtype, tg_backend backend, double v);

/* Broadcast shape of up to three tensors (NumPy rules) into out (dtype of
 * t[1] when n == 3, else of t[0]); records a "bad argument" error naming
 * op on a mismatch. */
TG_INTERNAL tg_status tg__ext_broadcast3(const tg_op *op, int n, tg_tensor *const *t,
                                         tg_spec *out);
/* Kernel description for operands t[0..n) read against out. */
TG_INTERNAL void tg__ext_bcast3_desc(const tg_spec *out, int n, tg_tensor *const *t,
                                     tg_bcast3 *bc);
/* g (broadcast shape) summed back to the shape of spec; g itself if equal. */
TG_INTERNAL tg_tensor *tg__ext_unbroadcast(tg_tensor *g, const tg_spec *spec);

/* Dim attr (attrs.ints[0]) normalised against ndim (valid by the shape
 * rule). */
TG_INTERNAL int tg__ext_dim(const tg_op_attrs *a, int ndim);

/* i64 tensor of shape with entries uniform in [0, hi), default backend. */
TG_INTERNAL tg_tensor *tg__ext_sample_index(tg_rng *rng, int ndim, const int64_t *shape,
                                            int64_t hi);
/* f64 tensor uniform in [lo, hi) with no entry within gap of any of the
 * npts points in pts (kinks of the op being checked). */
TG_INTERNAL tg_tensor *tg__ext_sample_avoiding(tg_rng *rng, int ndim, const int64_t *shape,
                                               double lo, double hi, int npts,
                                               const double *pts, double gap);

#endif
