/* ref backend: kernels of the ext op family (see backend/kernels.h),
 * plain loops written for clarity; the cpu backend is tested against them.
 * Dim reductions accumulate in double for both float types. */
#include <math.h>
#include <string.h>

#include "backend/kernels.h"

#define SQRT1_2 0.70710678118654752440 /* 1 / sqrt(2) */
#define INV_SQRT_2PI 0.39894228040143267794

/* ---- unary maps y = f(x; p) and their fused gradients gx = gy * f'(x) */
#define DEF_UNARY(name, T, expr)                                                   \
    static void name(int64_t n, const void *xv, void *yv, double p)                \
    {                                                                              \
        const T *x = xv;                                                           \
        T *y = yv;                                                                 \
        (void)p;                                                                   \
        for (int64_t i = 0; i < n; i++) {                                          \
            T v = x[i];                                                            \
            y[i] = (T)(expr);                                                      \
        }                                                                          \
    }
#define DEF_GRAD(name, T, expr)                                                    \
    static void name(int64_t n, const void *sv, const void *gyv, void *gxv, double p) \
    {                                                                              \
        const T *s = sv, *gy = gyv;                                                \
        T *gx = gxv;                                                               \
        (void)p;                                                                   \
        for (int64_t i = 0; i < n; i++) {                                          \
            T v = s[i], g = gy[i];                                                 \
            gx[i] = (T)(expr);                                                     \
        }                                                                          \
    }
#define DEF_UNARY2(name, T, expr)                                                  \
    static void name(int64_t n, const void *xv, void *yv, double p, double q)      \
    {                                                                              \
        const T *x = xv;                                                           \
        T *y = yv;                                                                 \
        for (int64_t i = 0; i < n; i++) {                                          \
            double v = (double)x[i];                                               \
            y[i] = (T)(expr);                                                      \
        }                                                                          \
    }
#define DEF_GRAD2(name, T, expr)                                                   \
    static void name(int64_t n, const void *sv, const void *gyv, void *gxv, double p, \
                     double q)                                                     \
    {                                                                              \
        const T *s = sv, *gy = gyv;                                                \
        T *gx = gxv;                                                               \
        for (int64_t i = 0; i < n; i++) {                                          \
            double v = (double)s[i], g = (double)gy[i];                            \
            gx[i] = (T)(expr);                                                     \
        }                                                                          \
    }

/* Stable logistic, softplus and clamp on doubles (ties of clamp keep the
 * gradient: lo <= x <= hi passes it, like PyTorch). */
static double sigm(double v)
{
    return v >= 0 ? 1.0 / (1.0 + exp(-v)) : exp(v) / (1.0 + exp(v));
}
static double softplus(double v, double beta, double thr)
{
    double b = beta * v;
    return b > thr ? v : (fmax(b, 0.0) + log1p(exp(-fabs(b)))) / beta;
}
static double clamp(double v, double lo, double hi)
{
    double t = v < lo ? lo : v;
    return t > hi ? hi : t;
}

#define UNARY_SET(T, SFX, EXPF, ERFF, FABSF)                                       \
    DEF_UNARY(abs_##SFX, T, FABSF(v))                                              \
    DEF_UNARY(gelu_##SFX, T, (T)0.5 * v * ((T)1 + ERFF(v * (T)SQRT1_2)))          \
    DEF_UNARY(silu_##SFX, T, v * (T)sigm((double)v))                               \
    DEF_UNARY(leaky_##SFX, T, v > 0 ? v : v * (T)p)                                \
    DEF_GRAD(abs_grad_##SFX, T, v > 0 ? g : (v < 0 ? -g : (T)0))                   \
    DEF_GRAD(gelu_grad_##SFX, T,                                                   \
             g * ((T)0.5 * ((T)1 + ERFF(v * (T)SQRT1_2)) +                         \
                  v * (T)INV_SQRT_2PI * EXPF((T)-0.5 * v * v)))                    \
    DEF_GRAD(silu_grad_##SFX, T, g * (T)(sigm((double)v) * (1.0 + (double)v * (1.0 - sigm((double)v))))) \
    DEF_GRAD(leaky_grad_##SFX, T, v > 0 ? g : g * (T)p)                            \
    DEF_UNARY2(clamp_##SFX, T, clamp(v, p, q))                                     \
    DEF_UNARY2(softplus_##SFX, T, softplus(v, p, q))                               \
    DEF_GRAD2(clamp_grad_##SFX, T, (v >= p && v <= q) ? g : 0.0)                   \
    DEF_GRAD2(softplus_grad_##SFX, T, p * v > q ? g : g * sigm(p * v))

UNARY_SET(float, f32, expf, erff, fabsf)
UNARY_SET(double, f64, exp, erf, fabs)

/* ---- minimum / maximum over a broadcast description (NaN propagates) */
#define DEF_BINARY(name, T, expr)                                                  \
    static void name(const tg_bcast *bc, const void *av, const void *bv, void *ov) \
    {                                                                              \
        const T *a = av, *b = bv;                                                  \
        T *o = ov;                                                                 \
        int64_t idx[TG_MAX_DIMS] = {0}, ia = 0, ib = 0;                            \
        for (int64_t i = 0; i < bc->n; i++) {                                      \
            T x = a[ia], y = b[ib];                                                \
            o[i] = (expr);                                                         \
            for (int d = bc->ndim - 1; d >= 0; d--) {                              \
                ia += bc->sa[d];                                                   \
                ib += bc->sb[d];                                                   \
                if (++idx[d] < bc->shape[d]) break;                                \
                ia -= bc->sa[d] * bc->shape[d];                                    \
                ib -= bc->sb[d] * bc->shape[d];                                    \
                idx[d] = 0;                                                        \
            }                                                                      \
        }                                                                          \
    }
DEF_BINARY(minimum_f32, float, x != x ? x : (y != y ? y : (x <= y ? x : y)))
DEF_BINARY(minimum_f64, double, x != x ? x : (y != y ? y : (x <= y ? x : y)))
DEF_BINARY(maximum_f32, float, x != x ? x : (y != y ? y : (x >= y ? x : y)))
DEF_BINARY(maximum_f64, double, x != x ? x : (y != y ? y : (x >= y ? x : y)))

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

/* ---- dim kernels: x seen as (outer, n, inner) */
#define DEF_DIMS(SFX, T)                                                           \
    static void min_dim_##SFX(int64_t outer, int64_t n, int64_t inner, const void *xv, void *yv, \
                              int64_t *idx)                                        \
    {                                                                              \
        const T *x = xv;                                                           \
        T *y = yv;                                                                 \
        for (int64_t o = 0; o < outer; o++)                                        \
            for (int64_t k = 0; k < inner; k++) {                                  \
                const T *xr = x + o * n * inner + k;                               \
                int64_t best = 0;                                                  \
                for (int64_t i = 0; i < n && !isnan((double)xr[best * inner]); i++) \
                    if (xr[i * inner] < xr[best * inner] || isnan((double)xr[i * inner])) \
                        best = i;                                                  \
                if (y) y[o * inner + k] = xr[best * inner];                        \
                if (idx) idx[o * inner + k] = best;                                \
            }                                                                      \
    }                                                                              \
    /* y = m + log sum exp(x - m), m the max; -inf/+inf rows stay infinite. */    \
    static void logsumexp_##SFX(int64_t outer, int64_t n, int64_t inner, const void *xv, void *yv) \
    {                                                                              \
        const T *x = xv;                                                           \
        T *y = yv;                                                                 \
        for (int64_t o = 0; o < outer; o++)                                        \
            for (int64_t k = 0; k < inner; k++) {                                  \
                const T *xr = x + o * n * inner + k;                               \
                double mx = -INFINITY, sum = 0.0;                                  \
                for (int64_t i = 0; i < n; i++) mx = fmax(mx, (double)xr[i * inner]); \
                if (isinf(mx)) {                                                   \
                    y[o * inner + k] = (T)mx;                                      \
                    continue;                                                      \
                }                                                                  \
                for (int64_t i = 0; i < n; i++) sum += exp((double)xr[i * inner] - mx); \
                y[o * inner + k] = (T)(mx + log(sum));                             \
            }                                                                      \
    }                                                                              \
    static void dropout_mask_##SFX(int64_t n, uint64_t seed, double p, double scale, void *mv) \
    {                                                                              \
        T *m = mv;                                                                 \
        tg_rng rng;                                                                \
        tg_rng_seed(&rng, seed);                                                   \
        for (int64_t i = 0; i < n; i++) m[i] = (T)(tg_rng_double(&rng) >= p ? scale : 0.0); \
    }                                                                              \
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
DEF_DIMS(f32, float)
DEF_DIMS(f64, double)

/* ---- movement kernels, dtype-agnostic (elem bytes per element) */
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

void tg__ref_ext_register(void)
{
    const tg_backend R = TG_BACKEND_REF;
#define SET2(K, name)                                                              \
    tg__kernel_set(TG_K_##K, R, TG_F32, (tg_kernel_fn)name##_f32);                 \
    tg__kernel_set(TG_K_##K, R, TG_F64, (tg_kernel_fn)name##_f64);
    SET2(ABS, abs) SET2(GELU, gelu) SET2(SILU, silu) SET2(LEAKY_RELU, leaky)
    SET2(ABS_GRAD, abs_grad) SET2(GELU_GRAD, gelu_grad) SET2(SILU_GRAD, silu_grad)
    SET2(LEAKY_RELU_GRAD, leaky_grad)
    SET2(CLAMP, clamp) SET2(SOFTPLUS, softplus) SET2(CLAMP_GRAD, clamp_grad)
    SET2(SOFTPLUS_GRAD, softplus_grad)
    SET2(MINIMUM, minimum) SET2(MAXIMUM, maximum)
    SET2(WHERE, where) SET2(MASKED_FILL, masked_fill)
    SET2(MIN_DIM, min_dim) SET2(LOGSUMEXP, logsumexp) SET2(DROPOUT_MASK, dropout_mask)
    SET2(INDEX_ADD, index_add) SET2(SCATTER_ADD, scatter_add)
#undef SET2
    tg__kernel_set(TG_K_WHERE, R, TG_I64, (tg_kernel_fn)where_i64);
    tg__kernel_set(TG_K_MASKED_FILL, R, TG_I64, (tg_kernel_fn)masked_fill_i64);
    for (int d = 0; d < TG_DTYPE_COUNT; d++) {
        tg__kernel_set(TG_K_CONCAT, R, (tg_dtype)d, (tg_kernel_fn)concat);
        tg__kernel_set(TG_K_INDEX_SELECT, R, (tg_dtype)d, (tg_kernel_fn)index_select);
        tg__kernel_set(TG_K_GATHER, R, (tg_dtype)d, (tg_kernel_fn)gather);
    }
}
