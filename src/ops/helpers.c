/* Op helpers (see helpers.h). */
#include <math.h>
#include <string.h>

#include "ops/helpers.h"

void tg__attrs_put_f64(tg_op_attrs *a, int slot, double v)
{
    memcpy(&a->ints[slot], &v, sizeof v);
}

double tg__attrs_get_f64(const tg_op_attrs *a, int slot)
{
    double v;
    memcpy(&v, &a->ints[slot], sizeof v);
    return v;
}

tg_tensor *tg__filled(tg_dtype dtype, int ndim, const int64_t *shape, tg_backend backend,
                      double v)
{
    tg__registry_ready(); /* the kernel table, for wrappers called before any op */
    tg_tensor *t = tg__tensor_empty(dtype, ndim, shape, backend);
    if (t) TG_KERNEL(tg_fill_fn, TG_K_FILL, t)(t->numel, tg__tensor_ptr(t), v);
    return t;
}

tg_tensor *tg__full(const tg_spec *spec, tg_backend backend, double v)
{
    return tg__scope_track(tg__filled(spec->dtype, spec->ndim, spec->shape, backend, v));
}

tg_tensor *tg__scalar(tg_dtype dtype, tg_backend backend, double v)
{
    tg_spec s = {.dtype = dtype, .ndim = 0};
    return tg__full(&s, backend, v);
}

tg_status tg__broadcast3(const tg_op *op, int n, tg_tensor *const *t, tg_spec *out)
{
    int nd = 0;
    for (int k = 0; k < n; k++)
        if (t[k]->ndim > nd) nd = t[k]->ndim;
    out->dtype = t[n == 3 ? 1 : 0]->dtype;
    out->ndim = nd;
    for (int i = 0; i < nd; i++) {
        int64_t s = 1;
        for (int k = 0; k < n; k++) {
            int ik = t[k]->ndim - nd + i;
            int64_t sk = ik >= 0 ? t[k]->shape[ik] : 1;
            if (sk == 1) continue;
            if (s != 1 && s != sk) {
                char b[3][96];
                for (int j = 0; j < n; j++) tg_shape_str(t[j]->ndim, t[j]->shape, b[j], sizeof b[j]);
                return tg__err(TG_ERR_SHAPE, "bad argument #%d to '%s' (shapes %s, %s%s%s do not "
                                             "broadcast: dim %d is %lld vs %lld)", k + 1, op->name,
                               b[0], b[1], n == 3 ? ", " : "", n == 3 ? b[2] : "", i,
                               (long long)s, (long long)sk);
            }
            s = sk;
        }
        out->shape[i] = s;
    }
    return TG_OK;
}

void tg__bcast3_desc(const tg_spec *out, int n, tg_tensor *const *t, tg_bcast3 *bc)
{
    memset(bc, 0, sizeof *bc);
    bc->ndim = out->ndim;
    bc->n = tg__numel(out->ndim, out->shape);
    memcpy(bc->shape, out->shape, sizeof bc->shape);
    for (int k = 0; k < n; k++) {
        int64_t c[TG_MAX_DIMS];
        tg__contig_strides(t[k]->ndim, t[k]->shape, c);
        for (int i = 0; i < out->ndim; i++) {
            int ik = t[k]->ndim - out->ndim + i;
            bc->s[k][i] = (ik >= 0 && t[k]->shape[ik] != 1) ? c[ik] : 0;
        }
    }
}

tg_tensor *tg__unbroadcast(tg_tensor *g, const tg_spec *spec)
{
    if (!g) return NULL;
    if (tg__same_shape(g->ndim, g->shape, spec->ndim, spec->shape)) return g;
    return tg_sum_to(g, spec->ndim, spec->shape);
}

tg_status tg__need_dims(const tg_op *op, const tg_tensor *x)
{
    if (x->ndim > 0) return TG_OK;
    return tg__err(TG_ERR_SHAPE, "bad argument #1 to '%s' (0-d tensor; needs at least 1 dim)",
                   op->name);
}

int tg__dim_attr(const tg_op_attrs *a, int ndim)
{
    return ndim == 0 ? 0 : (int)(a->ints[0] < 0 ? a->ints[0] + ndim : a->ints[0]);
}

tg_tensor *tg__sample_index(tg_rng *rng, int ndim, const int64_t *shape, int64_t hi)
{
    tg_tensor *t = tg__tensor_empty(TG_I64, ndim, shape, tg_default_backend());
    if (!t) return NULL;
    int64_t *p = tg__tensor_ptr(t);
    for (int64_t i = 0; i < t->numel; i++) p[i] = (int64_t)(tg_rng_next(rng) % (uint64_t)hi);
    return t;
}

tg_tensor *tg__sample_avoiding(tg_rng *rng, int ndim, const int64_t *shape, double lo,
                                   double hi, int npts, const double *pts, double gap)
{
    tg_tensor *t = tg__tensor_empty(TG_F64, ndim, shape, tg_default_backend());
    if (!t) return NULL;
    double *p = tg__tensor_ptr(t);
    for (int64_t i = 0; i < t->numel; i++) {
        double v;
        bool near;
        do { /* rejection: the points are few and the gaps small */
            v = lo + (hi - lo) * tg_rng_double(rng);
            near = false;
            for (int j = 0; j < npts; j++)
                if (fabs(v - pts[j]) < gap) near = true;
        } while (near);
        p[i] = v;
    }
    return t;
}

/* ---- input generators for gradcheck cases: raw, untracked f64 tensors */
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
