/* ref backend: fill, cast and the movement kernels (strided copy,
 * concat). Movement kernels are dtype-agnostic (elem bytes per element)
 * and registered for every dtype. */
#include <string.h>

#include "backend/kernels.h"

static void fill_f32(int64_t n, void *y, double v)
{
    for (int64_t i = 0; i < n; i++) ((float *)y)[i] = (float)v;
}
static void fill_f64(int64_t n, void *y, double v)
{
    for (int64_t i = 0; i < n; i++) ((double *)y)[i] = v;
}
static void fill_i64(int64_t n, void *y, double v)
{
    int64_t iv = tg__sat_i64(v);
    for (int64_t i = 0; i < n; i++) ((int64_t *)y)[i] = iv;
}

static double load(const void *x, tg_dtype dt, int64_t i)
{
    switch (dt) {
    case TG_F32: return ((const float *)x)[i];
    case TG_F64: return ((const double *)x)[i];
    default: return (double)((const int64_t *)x)[i];
    }
}
static void cast_f32(int64_t n, const void *x, tg_dtype xdt, void *y)
{
    for (int64_t i = 0; i < n; i++) ((float *)y)[i] = (float)load(x, xdt, i);
}
static void cast_f64(int64_t n, const void *x, tg_dtype xdt, void *y)
{
    for (int64_t i = 0; i < n; i++) ((double *)y)[i] = load(x, xdt, i);
}
static void cast_i64(int64_t n, const void *x, tg_dtype xdt, void *y)
{
    if (xdt == TG_I64) {
        memcpy(y, x, (size_t)n * sizeof(int64_t)); /* exact, past 2^53 too */
        return;
    }
    for (int64_t i = 0; i < n; i++) ((int64_t *)y)[i] = tg__sat_i64(load(x, xdt, i));
}

static void copy_strided(int ndim, const int64_t *shape, const int64_t *strides, const void *src,
                         void *dst, size_t elem)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    int64_t idx[TG_MAX_DIMS] = {0}, off = 0;
    const char *s = src;
    char *o = dst;
    for (int64_t i = 0; i < n; i++) {
        memcpy(o + (size_t)i * elem, s + (size_t)off * elem, elem);
        for (int d = ndim - 1; d >= 0; d--) {
            off += strides[d];
            if (++idx[d] < shape[d]) break;
            off -= strides[d] * shape[d];
            idx[d] = 0;
        }
    }
}

static void concat(int64_t outer, int64_t na, int64_t nb, int64_t inner, const void *av,
                   const void *bv, void *ov, size_t elem)
{
    const char *a = av, *b = bv;
    char *o = ov;
    size_t ra = (size_t)(na * inner) * elem, rb = (size_t)(nb * inner) * elem;
    for (int64_t i = 0; i < outer; i++) {
        if (ra) memcpy(o, a + (size_t)i * ra, ra);
        if (rb) memcpy(o + ra, b + (size_t)i * rb, rb);
        o += ra + rb;
    }
}

void tg__ref_shape_register(void)
{
    const tg_backend R = TG_BACKEND_REF;
#define SET2(K, name)                                                              \
    tg__kernel_set(TG_K_##K, R, TG_F32, (tg_kernel_fn)name##_f32);                 \
    tg__kernel_set(TG_K_##K, R, TG_F64, (tg_kernel_fn)name##_f64);
    SET2(FILL, fill) SET2(CAST, cast)
#undef SET2
    tg__kernel_set(TG_K_FILL, R, TG_I64, (tg_kernel_fn)fill_i64);
    tg__kernel_set(TG_K_CAST, R, TG_I64, (tg_kernel_fn)cast_i64);
    for (int d = 0; d < TG_DTYPE_COUNT; d++)
        tg__kernel_set(TG_K_COPY_STRIDED, R, (tg_dtype)d, (tg_kernel_fn)copy_strided);
    for (int d = 0; d < TG_DTYPE_COUNT; d++)
        tg__kernel_set(TG_K_CONCAT, R, (tg_dtype)d, (tg_kernel_fn)concat);
}
