/* ref backend: selection (where, masked_fill) and indexing (index_select,
 * index_add, gather, scatter_add). Inputs are assumed valid (indices in
 * range): the op files check them first. */
#include <string.h>

#include "backend/kernels.h"

/* ---- where / masked_fill: three strided walks in step */
static bool truth(const void *c, tg_dtype dt, int64_t i)
{
    switch (dt) {
    case TG_F32: return ((const float *)c)[i] != 0.0f;
    case TG_F64: return ((const double *)c)[i] != 0.0;
    default: return ((const int64_t *)c)[i] != 0;
    }
}

#define STEP3(bc, off, idx)                                                        \
    for (int d = (bc)->ndim - 1; d >= 0; d--) {                                    \
        for (int k = 0; k < 3; k++) off[k] += (bc)->s[k][d];                       \
        if (++idx[d] < (bc)->shape[d]) break;                                      \
        for (int k = 0; k < 3; k++) off[k] -= (bc)->s[k][d] * (bc)->shape[d];      \
        idx[d] = 0;                                                                \
    }

#define DEF_SELECT(SFX, T)                                                         \
    static void where_##SFX(const tg_bcast3 *bc, const void *cond, tg_dtype cdt, const void *av, \
                            const void *bv, void *ov)                              \
    {                                                                              \
        const T *a = av, *b = bv;                                                  \
        T *o = ov;                                                                 \
        int64_t idx[TG_MAX_DIMS] = {0}, off[3] = {0, 0, 0};                        \
        for (int64_t i = 0; i < bc->n; i++) {                                      \
            o[i] = truth(cond, cdt, off[0]) ? a[off[1]] : b[off[2]];               \
            STEP3(bc, off, idx)                                                    \
        }                                                                          \
    }                                                                              \
    static void masked_fill_##SFX(const tg_bcast3 *bc, const void *xv, const void *mask, \
                                  tg_dtype mdt, double value, void *ov)            \
    {                                                                              \
        const T *x = xv;                                                           \
        T *o = ov;                                                                 \
        const T v = (T)value;                                                      \
        int64_t idx[TG_MAX_DIMS] = {0}, off[3] = {0, 0, 0};                        \
        for (int64_t i = 0; i < bc->n; i++) {                                      \
            o[i] = truth(mask, mdt, off[1]) ? v : x[off[0]];                       \
            STEP3(bc, off, idx)                                                    \
        }                                                                          \
    }
DEF_SELECT(f32, float)
DEF_SELECT(f64, double)
DEF_SELECT(i64, int64_t)

/* ---- indexing along a dim: x seen as (outer, n, inner) */
#define DEF_INDEX(SFX, T)                                                          \
    static void index_add_##SFX(int64_t outer, int64_t n, int64_t inner, const void *gv, \
                                const int64_t *idx, int64_t nidx, void *gxv)       \
    {                                                                              \
        const T *g = gv;                                                           \
        T *gx = gxv;                                                               \
        memset(gx, 0, (size_t)(outer * n * inner) * sizeof(T));                    \
        for (int64_t o = 0; o < outer; o++)                                        \
            for (int64_t j = 0; j < nidx; j++) {                                   \
                const T *src = g + (o * nidx + j) * inner;                         \
                T *dst = gx + (o * n + idx[j]) * inner;                            \
                for (int64_t k = 0; k < inner; k++) dst[k] += src[k];              \
            }                                                                      \
    }                                                                              \
    static void scatter_add_##SFX(int ndim, const int64_t *ishape, const int64_t *xshape, int dim, \
                                  const void *gv, const int64_t *idx, void *gxv)   \
    {                                                                              \
        const T *g = gv;                                                           \
        T *gx = gxv;                                                               \
        int64_t xs[TG_MAX_DIMS], pos[TG_MAX_DIMS] = {0}, base = 0;                 \
        tg__contig_strides(ndim, xshape, xs);                                      \
        memset(gx, 0, (size_t)tg__numel(ndim, xshape) * sizeof(T));                \
        int64_t m = tg__numel(ndim, ishape);                                       \
        for (int64_t i = 0; i < m; i++) {                                          \
            gx[base + idx[i] * xs[dim]] += g[i];                                   \
            for (int d = ndim - 1; d >= 0; d--) {                                  \
                if (d != dim) base += xs[d];                                       \
                if (++pos[d] < ishape[d]) break;                                   \
                if (d != dim) base -= xs[d] * ishape[d];                           \
                pos[d] = 0;                                                        \
            }                                                                      \
        }                                                                          \
    }
DEF_INDEX(f32, float)
DEF_INDEX(f64, double)

/* ---- movement kernels, dtype-agnostic (elem bytes per element) */
static void index_select(int64_t outer, int64_t n, int64_t inner, const void *xv,
                         const int64_t *idx, int64_t nidx, void *yv, size_t elem)
{
    const char *x = xv;
    char *y = yv;
    size_t row = (size_t)inner * elem;
    if (!row) return;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < nidx; j++)
            memcpy(y + (size_t)(o * nidx + j) * row, x + (size_t)(o * n + idx[j]) * row, row);
}

static void gather(int ndim, const int64_t *ishape, const int64_t *xshape, int dim,
                   const void *xv, const int64_t *idx, void *yv, size_t elem)
{
    const char *x = xv;
    char *y = yv;
    int64_t xs[TG_MAX_DIMS], pos[TG_MAX_DIMS] = {0}, base = 0;
    tg__contig_strides(ndim, xshape, xs);
    int64_t m = tg__numel(ndim, ishape);
    for (int64_t i = 0; i < m; i++) {
        memcpy(y + (size_t)i * elem, x + (size_t)(base + idx[i] * xs[dim]) * elem, elem);
        for (int d = ndim - 1; d >= 0; d--) {
            if (d != dim) base += xs[d];
            if (++pos[d] < ishape[d]) break;
            if (d != dim) base -= xs[d] * ishape[d];
            pos[d] = 0;
        }
    }
}

void tg__ref_index_register(void)
{
    const tg_backend R = TG_BACKEND_REF;
#define SET2(K, name)                                                              \
    tg__kernel_set(TG_K_##K, R, TG_F32, (tg_kernel_fn)name##_f32);                 \
    tg__kernel_set(TG_K_##K, R, TG_F64, (tg_kernel_fn)name##_f64);
    SET2(WHERE, where) SET2(MASKED_FILL, masked_fill) SET2(INDEX_ADD, index_add)
    SET2(SCATTER_ADD, scatter_add)
#undef SET2
    tg__kernel_set(TG_K_WHERE, R, TG_I64, (tg_kernel_fn)where_i64);
    tg__kernel_set(TG_K_MASKED_FILL, R, TG_I64, (tg_kernel_fn)masked_fill_i64);
    for (int d = 0; d < TG_DTYPE_COUNT; d++) {
        tg__kernel_set(TG_K_INDEX_SELECT, R, (tg_dtype)d, (tg_kernel_fn)index_select);
        tg__kernel_set(TG_K_GATHER, R, (tg_dtype)d, (tg_kernel_fn)gather);
    }
}
