/* cpu backend: sums over a prefix of dims (bias gradients, sum_to) or a
 * suffix (row sums) with unit-stride inner loops; other patterns fall back
 * to ref. Accumulators are double for both float types, like ref. */
#include "backend/cpu/loops.h" /* first: TG_CLONES for the exact row sum */

#include <math.h>
#include <stdint.h>
#include <string.h>

static tg_reduce_fn ref_sum[2];

/* Splits r into (outer, inner) if the reduced dims are exactly a prefix
 * (prefix = true) or a suffix (prefix = false) of the non-trivial dims. */
static bool split(const tg_reduce *r, bool prefix, int64_t *outer, int64_t *inner)
{
    int k = 0;
    *outer = *inner = 1;
    if (prefix) {
        while (k < r->ndim && (r->reduce[k] || r->shape[k] == 1)) *outer *= r->shape[k++];
        for (; k < r->ndim; k++) {
            if (r->reduce[k] && r->shape[k] != 1) return false;
            *inner *= r->shape[k];
        }
    } else {
        while (k < r->ndim && (!r->reduce[k] || r->shape[k] == 1)) *outer *= r->shape[k++];
        for (; k < r->ndim; k++) {
            if (!r->reduce[k] && r->shape[k] != 1) return false;
            *inner *= r->shape[k];
        }
    }
    return true;
}

/* ---- f32 row sums: the chain's bits, faster, where no addition rounds.
 *
 * A row sum adds element j into double accumulator j % 4 and returns
 * (s0 + s1) + (s2 + s3): four chains of dependent adds, about one element
 * a cycle. A float whose biased exponent is e is a whole multiple of
 * 2^(max(e, 1) - 150), so with u that power for the smallest nonzero |x|
 * of the row, every element is a multiple of u; if also n * max|x| is at
 * most 2^52 u, every partial sum, whatever the order and grouping, is a
 * multiple of u smaller than 2^53 u in magnitude: a double exactly, so no
 * addition rounds and every order gives the exact sum, bitwise the
 * chain's (signed zeros too: accumulators start at +0, and an exact zero
 * from cancellation is +0 in round-to-nearest). This pass adds in 16
 * independent lanes (vectorised) and tracks the smallest nonzero and the
 * largest |x| by their bit patterns, chunk by chunk; the bound can only
 * get worse as the row goes on, so it gives up at the first chunk after
 * which it fails, or at an infinity or NaN, and the caller runs the
 * chain. A row may be cut into parts summed apart (on several threads,
 * backend/parallel.c) and merged: the result is exact either way. */
#define EXACT_LANES TG_EXACT_LANES
#define EXACT_CHUNK 4096
#define EXACT_MIN_ROW 1024 /* shorter rows: the chain is as fast */

static bool exact_bound_holds(int64_t n, uint32_t min_bits, uint32_t max_bits)
{
    int e = (int)(min_bits >> 23);
    float top;
    memcpy(&top, &max_bits, sizeof top);
    return (double)n * (double)top <= ldexp(1.0, (e > 1 ? e : 1) - 150 + 52);
}

/* Whether a row of n elements whose |x| bit patterns so far span lo + 1
 * (smallest nonzero; lo UINT32_MAX: none yet) to hi is still exact: no
 * infinity or NaN, and the bound above. */
static bool exact_so_far(int64_t n, uint32_t lo, uint32_t hi)
{
    return hi < 0x7f800000u && (lo == UINT32_MAX || exact_bound_holds(n, lo + 1u, hi));
}

void tg__exact_sum_init(tg__exact_sum *s)
{
    memset(s->lane, 0, sizeof s->lane);
    s->lo = UINT32_MAX;
    s->hi = 0;
}

TG_CLONES bool tg__exact_sum_add(tg__exact_sum *s, const float *x, int64_t len, int64_t n)
{
    double lane[EXACT_LANES];
    memcpy(lane, s->lane, sizeof lane);
    uint32_t lo = s->lo, hi = s->hi; /* smallest nonzero |x| bits, minus 1; largest */
    bool ok = true;
    for (int64_t c = 0; c < len && ok; c += EXACT_CHUNK) {
        int64_t m = len - c < EXACT_CHUNK ? len - c : EXACT_CHUNK;
        const float *xc = x + c;
        uint32_t mn[EXACT_LANES], mx[EXACT_LANES];
        for (int l = 0; l < EXACT_LANES; l++) mn[l] = UINT32_MAX, mx[l] = 0;
        int64_t j = 0;
        for (; j + EXACT_LANES <= m; j += EXACT_LANES)
            for (int l = 0; l < EXACT_LANES; l++) {
                uint32_t b;
                memcpy(&b, xc + j + l, sizeof b);
                b &= 0x7fffffffu;
                lane[l] += (double)xc[j + l];
                mn[l] = b - 1u < mn[l] ? b - 1u : mn[l]; /* a zero wraps to UINT32_MAX */
                mx[l] = b > mx[l] ? b : mx[l];
            }
        for (; j < m; j++) {
            uint32_t b;
            memcpy(&b, xc + j, sizeof b);
            b &= 0x7fffffffu;
            lane[j % EXACT_LANES] += (double)xc[j];
            mn[0] = b - 1u < mn[0] ? b - 1u : mn[0];
            mx[0] = b > mx[0] ? b : mx[0];
        }
        for (int l = 0; l < EXACT_LANES; l++) {
            lo = mn[l] < lo ? mn[l] : lo;
            hi = mx[l] > hi ? mx[l] : hi;
        }
        ok = exact_so_far(n, lo, hi);
    }
    memcpy(s->lane, lane, sizeof lane);
    s->lo = lo;
    s->hi = hi;
    return ok;
}

bool tg__exact_sum_merge(tg__exact_sum *into, const tg__exact_sum *from, int64_t n)
{
    for (int l = 0; l < EXACT_LANES; l++) into->lane[l] += from->lane[l];
    into->lo = from->lo < into->lo ? from->lo : into->lo;
    into->hi = from->hi > into->hi ? from->hi : into->hi;
    return exact_so_far(n, into->lo, into->hi);
}

double tg__exact_sum_value(const tg__exact_sum *s)
{
    double lane[EXACT_LANES];
    memcpy(lane, s->lane, sizeof lane);
    for (int w = EXACT_LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    return lane[0];
}

bool tg__exact_sum_parts(tg__exact_sum *part, const bool *ok, int nparts, int64_t n,
                         double *out)
{
    for (int p = 0; p < nparts; p++)
        if (!ok[p]) return false;
    for (int p = 1; p < nparts; p++)
        if (!tg__exact_sum_merge(&part[0], &part[p], n)) return false;
    *out = tg__exact_sum_value(&part[0]);
    return true;
}

bool tg__row_sum_exact_f32(const float *x, int64_t n, double *out)
{
    tg__exact_sum s;
    tg__exact_sum_init(&s);
    if (!tg__exact_sum_add(&s, x, n, n)) return false;
    *out = tg__exact_sum_value(&s);
    return true;
}

/* The chain's sum of one row (f32: the exact pass first where it is long). */
#define ROW_SUM(T, IS_F32)                                                          \
    do {                                                                            \
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0, exact;                               \
        if (IS_F32 && inner >= EXACT_MIN_ROW &&                                     \
            tg__row_sum_exact_f32((const float *)(const void *)xr, inner, &exact)) { \
            y[o] = (T)exact;                                                        \
            break;                                                                  \
        }                                                                           \
        int64_t j = 0;                                                              \
        for (; j + 4 <= inner; j += 4) {                                            \
            s0 += xr[j];                                                            \
            s1 += xr[j + 1];                                                        \
            s2 += xr[j + 2];                                                        \
            s3 += xr[j + 3];                                                        \
        }                                                                           \
        for (; j < inner; j++) s0 += xr[j];                                         \
        y[o] = (T)((s0 + s1) + (s2 + s3));                                          \
    } while (0)

#define DEF_SUM(SFX, T, DI)                                                         \
    static void sum_##SFX(const tg_reduce *r, const void *xv, void *yv)             \
    {                                                                               \
        const T *x = xv;                                                            \
        T *y = yv;                                                                  \
        int64_t outer, inner;                                                       \
        if (split(r, false, &outer, &inner)) { /* row sums */                       \
            for (int64_t o = 0; o < outer; o++) {                                   \
                const T *xr = x + o * inner;                                        \
                ROW_SUM(T, DI == 0);                                                \
            }                                                                       \
            return;                                                                 \
        }                                                                           \
        if (split(r, true, &outer, &inner) && inner <= 65536) { /* column sums */  \
            double stack[1024];                                                     \
            double *acc = inner <= 1024 ? stack                                     \
                                        : tg__data_alloc((size_t)inner * sizeof(double)); \
            if (acc) {                                                              \
                for (int64_t j = 0; j < inner; j++) acc[j] = 0.0;                   \
                for (int64_t o = 0; o < outer; o++) {                               \
                    const T *xr = x + o * inner;                                    \
                    for (int64_t j = 0; j < inner; j++) acc[j] += xr[j];            \
                }                                                                   \
                for (int64_t j = 0; j < inner; j++) y[j] = (T)acc[j];               \
                if (acc != stack) tg__data_free(acc, (size_t)inner * sizeof(double)); \
                return;                                                             \
            }                                                                       \
        }                                                                           \
        ref_sum[DI](r, xv, yv);                                                     \
    }

DEF_SUM(f32, float, 0)
DEF_SUM(f64, double, 1)

void tg__cpu_reduce_register(void)
{
    ref_sum[0] = (tg_reduce_fn)tg__kernel(TG_K_REDUCE_SUM, TG_BACKEND_REF, TG_F32);
    ref_sum[1] = (tg_reduce_fn)tg__kernel(TG_K_REDUCE_SUM, TG_BACKEND_REF, TG_F64);
    tg__kernel_set(TG_K_REDUCE_SUM, TG_BACKEND_CPU, TG_F32, (tg_kernel_fn)sum_f32);
    tg__kernel_set(TG_K_REDUCE_SUM, TG_BACKEND_CPU, TG_F64, (tg_kernel_fn)sum_f64);
}
