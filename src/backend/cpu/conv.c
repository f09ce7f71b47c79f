/* cpu backend: conv overrides (see backend/kernels.h).
 * Only what profiling showed to pay: im2col/col2im, which the ref kernels
 * do with a bounds test per element, here work on the in-bounds run of each
 * row (a copy at stride 1), and the per-channel sum for bias gradients,
 * whose single serial accumulator in ref is latency-bound; here eight
 * independent double lanes (same double accumulation, so results agree
 * with ref to rounding), compiled per vector ISA. A conv 1->16 3x3 on 64 x 28x28 went from ~2.0 to
 * ~1.2 ms forward + backward with these. */
#include <stdbool.h>
#include <string.h>

#include "backend/cpu/loops.h" /* first: TG_CLONES for channel_sum */

/* Outputs o in [lo, hi) read in-bounds input o*s + off of n_in cells. */
static void valid_range(int64_t off, int64_t s, int64_t n_in, int64_t n_out, int64_t *lo,
                        int64_t *hi)
{
    /* (no division at stride 1: im2col calls this for every kernel tap) */
    int64_t l = off >= 0 ? 0 : s == 1 ? -off : (-off + s - 1) / s;
    int64_t h = n_in - off <= 0 ? 0 : s == 1 ? n_in - off : (n_in - off + s - 1) / s;
    if (h > n_out) h = n_out;
    if (l > h) l = h;
    *lo = l;
    *hi = h;
}

/* Rows of a small image are short (26 floats for 28x28 and a 3x3 kernel).
 * im2col takes the geometry into locals (the row copies are byte stores,
 * which may alias anything reachable through g, so the compiler would
 * reload it after each), finds each tap's in-bounds rows once, and copies
 * a whole in-bounds row at stride 1 in fixed 32-byte moves, the last one
 * overlapping the one before: 64 images of 28x28, 3x3, in 0.047 ms against
 * 0.066 for a loop over the row's length per row. */
#define DEF_CPU_NN(SFX, T)                                                         \
    static inline void copy_run_##SFX(T *restrict d, const T *restrict s, int64_t n) \
    {                                                                              \
        if (n > 256) {                                                             \
            memcpy(d, s, (size_t)n * sizeof(T));                                   \
            return;                                                                \
        }                                                                          \
        for (int64_t i = 0; i < n; i++) d[i] = s[i];                               \
    }                                                                              \
    static void im2col_##SFX(const tg_conv2d_geom *g, const void *xv, void *colv)  \
    {                                                                              \
        enum { V = 32 / sizeof(T) }; /* elements in one 32-byte move */            \
        const T *x = xv;                                                           \
        T *col = colv;                                                             \
        const int64_t C = g->C, H = g->H, W = g->W, KH = g->KH, KW = g->KW;        \
        const int64_t OH = g->OH, OW = g->OW, sh = g->sh, sw = g->sw, L = OH * OW; \
        for (int64_t c = 0; c < C; c++)                                            \
            for (int64_t i = 0; i < KH; i++)                                       \
                for (int64_t j = 0; j < KW; j++) {                                 \
                    T *row = col + ((c * KH + i) * KW + j) * L;                    \
                    int64_t off = j * g->dw - g->pw, lo, hi, rlo, rhi;             \
                    valid_range(off, sw, W, OW, &lo, &hi);                         \
                    valid_range(i * g->dh - g->ph, sh, H, OH, &rlo, &rhi);         \
                    if (rlo > 0) memset(row, 0, (size_t)(rlo * OW) * sizeof(T));   \
                    if (rhi < OH)                                                  \
                        memset(row + rhi * OW, 0, (size_t)((OH - rhi) * OW) * sizeof(T)); \
                    const T *xc = x + c * H * W + off;                             \
                    bool whole = sw == 1 && lo == 0 && hi == OW && OW >= V;        \
                    int64_t ih = rlo * sh - g->ph + i * g->dh;                     \
                    for (int64_t oh = rlo; oh < rhi; oh++, ih += sh) {             \
                        T *r = row + oh * OW;                                      \
                        const T *xr = xc + ih * W;                                 \
                        if (whole) {                                               \
                            int64_t k = 0;                                         \
                            for (; k + V <= OW; k += V) memcpy(r + k, xr + k, 32); \
                            if (k < OW) memcpy(r + OW - V, xr + OW - V, 32);       \
                            continue;                                              \
                        }                                                          \
                        for (int64_t ow = 0; ow < lo; ow++) r[ow] = 0;             \
                        if (sw == 1)                                               \
                            copy_run_##SFX(r + lo, xr + lo, hi - lo);              \
                        else                                                       \
                            for (int64_t ow = lo; ow < hi; ow++) r[ow] = xr[ow * sw]; \
                        for (int64_t ow = hi; ow < OW; ow++) r[ow] = 0;            \
                    }                                                              \
                }                                                                  \
    }                                                                              \
    static void col2im_##SFX(const tg_conv2d_geom *g, const void *colv, void *xv)  \
    {                                                                              \
        const T *col = colv;                                                       \
        T *x = xv;                                                                 \
        int64_t L = g->OH * g->OW;                                                 \
        for (int64_t c = 0; c < g->C; c++)                                         \
            for (int64_t i = 0; i < g->KH; i++)                                    \
                for (int64_t j = 0; j < g->KW; j++) {                              \
                    const T *row = col + ((c * g->KH + i) * g->KW + j) * L;        \
                    int64_t off = j * g->dw - g->pw, lo, hi;                       \
                    valid_range(off, g->sw, g->W, g->OW, &lo, &hi);                \
                    for (int64_t oh = 0; oh < g->OH; oh++) {                       \
                        int64_t ih = oh * g->sh - g->ph + i * g->dh;               \
                        if (ih < 0 || ih >= g->H) continue;                        \
                        const T *r = row + oh * g->OW;                             \
                        T *xr = x + (c * g->H + ih) * g->W;                        \
                        for (int64_t ow = lo; ow < hi; ow++) xr[off + ow * g->sw] += r[ow]; \
                    }                                                              \
                }                                                                  \
    }                                                                              \
    static inline T lanes_total_##SFX(const double *l)                             \
    {                                                                              \
        return (T)(((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))); \
    }                                                                              \
    /* Each channel's sum in eight double lanes, element s of a row into           \
     * lane s % 8, rows in order of n. Four channels at a time: a lane's           \
     * adds depend on each other, so one channel's eight lanes (one or two         \
     * vectors) wait on the add latency; four give eight independent               \
     * vector chains. Each lane adds the same values in the same order             \
     * either way (the same bits). */                                              \
    TG_CLONES static void channel_sum_##SFX(int64_t N, int64_t C, int64_t S,       \
                                            const void *xv, void *yv)              \
    {                                                                              \
        const T *x = xv;                                                           \
        T *y = yv;                                                                 \
        int64_t c = 0;                                                             \
        for (; c + 4 <= C; c += 4) {                                               \
            double l0[8] = {0}, l1[8] = {0}, l2[8] = {0}, l3[8] = {0};             \
            for (int64_t n = 0; n < N; n++) {                                      \
                const T *r0 = x + (n * C + c) * S, *r1 = r0 + S, *r2 = r1 + S,     \
                        *r3 = r2 + S;                                              \
                int64_t s = 0;                                                     \
                for (; s + 8 <= S; s += 8) {                                       \
                    T v0[8], v1[8], v2[8], v3[8]; /* plain loads: vectorised */    \
                    memcpy(v0, r0 + s, sizeof v0);                                 \
                    memcpy(v1, r1 + s, sizeof v1);                                 \
                    memcpy(v2, r2 + s, sizeof v2);                                 \
                    memcpy(v3, r3 + s, sizeof v3);                                 \
                    for (int k = 0; k < 8; k++) l0[k] += (double)v0[k];            \
                    for (int k = 0; k < 8; k++) l1[k] += (double)v1[k];            \
                    for (int k = 0; k < 8; k++) l2[k] += (double)v2[k];            \
                    for (int k = 0; k < 8; k++) l3[k] += (double)v3[k];            \
                }                                                                  \
                for (; s < S; s++) {                                               \
                    l0[s & 7] += (double)r0[s];                                    \
                    l1[s & 7] += (double)r1[s];                                    \
                    l2[s & 7] += (double)r2[s];                                    \
                    l3[s & 7] += (double)r3[s];                                    \
                }                                                                  \
            }                                                                      \
            y[c] = lanes_total_##SFX(l0);                                          \
            y[c + 1] = lanes_total_##SFX(l1);                                      \
            y[c + 2] = lanes_total_##SFX(l2);                                      \
            y[c + 3] = lanes_total_##SFX(l3);                                      \
        }                                                                          \
        for (; c < C; c++) {                                                       \
            double lane[8] = {0};                                                  \
            for (int64_t n = 0; n < N; n++) {                                      \
                const T *r = x + (n * C + c) * S;                                  \
                int64_t s = 0;                                                     \
                for (; s + 8 <= S; s += 8) {                                       \
                    T v[8];                                                        \
                    memcpy(v, r + s, sizeof v);                                    \
                    for (int k = 0; k < 8; k++) lane[k] += (double)v[k];           \
                }                                                                  \
                for (; s < S; s++) lane[s & 7] += (double)r[s];                    \
            }                                                                      \
            y[c] = lanes_total_##SFX(lane);                                        \
        }                                                                          \
    }

DEF_CPU_NN(f32, float)
DEF_CPU_NN(f64, double)

/* The short-reduction products (kernels.h): a convolution with few input
 * channels (conv's 1->16 3x3: K = 9) hands OpenBLAS GEMMs that are mostly
 * packing, 16x676x9 for an image's output and 16x9x676 for its weight
 * gradient. Here they run on 32-byte vectors in registers, 4 rows of
 * the output by 3 vectors of columns (the forward) or 4 by 3 outputs (the
 * weight gradient: K is a multiple of 3 for a 3x3 kernel), rows and
 * columns that do not fill a block taken one at a time.
 * - Forward, per output: w0 x0 + w1 x1 + ... in order of k, then the
 *   bias added, then relu. The same for the columns past the last whole
 *   block, a vector at a time, then one at a time (each output's value
 *   is its own, whatever its block).
 * - Weight gradient, per output: lane i of one vector sums the products
 *   of columns i, i + V, i + 2V ... in order; the V lanes are added by
 *   halves (lane i + V/2 to lane i, and again), then the products of the
 *   columns past the last whole vector in order; then added to c when
 *   accumulating.
 * Exact IEEE operations, none contracted: the same bits in every clone.
 * Measured in a scratch program (64 images of the 1->16 3x3 conv, single
 * thread, against OpenBLAS on the Zen kernels): the forward with its bias
 * fill 0.67-0.75x, the weight gradient 0.54-0.58x; with K = 144 they are
 * 2-3.5x slower than OpenBLAS, with K = 27 the weight gradient is 0.55x,
 * hence TG_CONV_SHORT_K = 32. */
typedef float tg_f32v __attribute__((vector_size(32)));
typedef double tg_f64v __attribute__((vector_size(32)));
/* The same, read and written at any element address (the loads of memcpy
 * into vectors went through the stack). */
typedef float tg_f32u __attribute__((vector_size(32), aligned(4), may_alias));
typedef double tg_f64u __attribute__((vector_size(32), aligned(8), may_alias));
typedef int32_t tg_i32v __attribute__((vector_size(32)));
typedef int64_t tg_i64v __attribute__((vector_size(32)));

#define TG_INLINE static inline __attribute__((always_inline))

#define DEF_CPU_SHORT(SFX, T, VT, VU, MT)                                              \
    /* R rows by Q vectors of y, from column l on: each output w0 x0 + w1 x1   \
     * + ... in order of k, the bias, then relu. */                            \
    TG_INLINE void fwd_block_##SFX(int R, int Q, int64_t K, int64_t L, const T *w, \
                                   const T *x, const T *b, bool relu, T *y)        \
    {                                                                              \
        enum { V = 32 / sizeof(T) };                                               \
        const VT zero = {0};                                                       \
        VT a[4][3], v[3];                                                          \
        for (int q = 0; q < Q; q++) v[q] = *(const VU *)(x + q * V);               \
        for (int r = 0; r < R; r++)                                                \
            for (int q = 0; q < Q; q++) a[r][q] = w[r * K] * v[q];                 \
        for (int64_t k = 1; k < K; k++) {                                          \
            for (int q = 0; q < Q; q++) v[q] = *(const VU *)(x + k * L + q * V);   \
            for (int r = 0; r < R; r++) {                                          \
                T c = w[r * K + k];                                                \
                for (int q = 0; q < Q; q++) a[r][q] += c * v[q];                   \
            }                                                                      \
        }                                                                          \
        for (int r = 0; r < R; r++)                                                \
            for (int q = 0; q < Q; q++) {                                          \
                VT t = b ? a[r][q] + b[r] : a[r][q];                               \
                if (relu) t = (VT)((MT)t & ~(t <= zero));                          \
                *(VU *)(y + r * L + q * V) = t;                                    \
            }                                                                      \
    }                                                                              \
    /* R rows of y from R rows of w: blocks of 3 vectors of columns, then of    \
     * one, then single columns. */                                            \
    TG_INLINE void fwd_rows_##SFX(int R, int64_t K, int64_t L, const T *w, const T *x, \
                                  const T *b, bool relu, T *y)                     \
    {                                                                              \
        enum { V = 32 / sizeof(T) };                                               \
        int64_t l = 0;                                                             \
        for (; l + 3 * V <= L; l += 3 * V)                                         \
            fwd_block_##SFX(R, 3, K, L, w, x + l, b, relu, y + l);                 \
        for (; l + V <= L; l += V)                                                 \
            fwd_block_##SFX(R, 1, K, L, w, x + l, b, relu, y + l);                 \
        for (; l < L; l++)                                                         \
            for (int r = 0; r < R; r++) {                                          \
                T t = w[r * K] * x[l];                                             \
                for (int64_t k = 1; k < K; k++) t += w[r * K + k] * x[k * L + l];  \
                if (b) t += b[r];                                                  \
                y[r * L + l] = relu && t <= 0 ? (T)0 : t;                          \
            }                                                                      \
    }                                                                              \
    TG_CLONES static void conv_short_fwd_##SFX(int64_t m, int64_t k, int64_t l,    \
                                               const void *wv, const void *xv,     \
                                               const void *bv, bool relu, void *yv) \
    {                                                                              \
        const T *w = wv, *x = xv, *b = bv;                                         \
        T *y = yv;                                                                 \
        int64_t i = 0;                                                             \
        for (; i + 4 <= m; i += 4)                                                 \
            fwd_rows_##SFX(4, k, l, w + i * k, x, b ? b + i : NULL, relu, y + i * l); \
        for (; i < m; i++)                                                         \
            fwd_rows_##SFX(1, k, l, w + i * k, x, b ? b + i : NULL, relu, y + i * l); \
    }                                                                              \
    /* An R x Q block of c from R rows of a and Q rows of b. */                    \
    TG_INLINE void wgrad_block_##SFX(int R, int Q, int64_t L, const T *a, const T *b, \
                                     bool acc, T *c, int64_t ldc)                  \
    {                                                                              \
        enum { V = 32 / sizeof(T) };                                               \
        VT s[4][3];                                                                \
        for (int r = 0; r < R; r++)                                                \
            for (int q = 0; q < Q; q++) s[r][q] = (VT){0};                         \
        int64_t l = 0;                                                             \
        for (; l + V <= L; l += V) {                                               \
            VT bv[3], av;                                                          \
            for (int q = 0; q < Q; q++) bv[q] = *(const VU *)(b + q * L + l);      \
            for (int r = 0; r < R; r++) {                                          \
                av = *(const VU *)(a + r * L + l);                                 \
                for (int q = 0; q < Q; q++) s[r][q] += av * bv[q];                 \
            }                                                                      \
        }                                                                          \
        for (int r = 0; r < R; r++)                                                \
            for (int q = 0; q < Q; q++) {                                          \
                VT t = s[r][q];                                                    \
                for (int h = V / 2; h > 0; h /= 2)                                 \
                    for (int e = 0; e < h; e++) t[e] += t[e + h];                  \
                T tot = t[0];                                                      \
                for (int64_t e = l; e < L; e++) tot += a[r * L + e] * b[q * L + e]; \
                c[r * ldc + q] = acc ? c[r * ldc + q] + tot : tot;                 \
            }                                                                      \
    }                                                                              \
    TG_CLONES static void conv_short_wgrad_##SFX(int64_t m, int64_t n, int64_t l,  \
                                                 const void *av, const void *bv,   \
                                                 bool accumulate, void *cv)        \
    {                                                                              \
        const T *a = av, *b = bv;                                                  \
        T *c = cv;                                                                 \
        for (int64_t i = 0; i < m;) {                                              \
            int R = i + 4 <= m ? 4 : 1;                                            \
            const T *ai = a + i * l;                                               \
            T *ci = c + i * n;                                                     \
            int64_t j = 0;                                                         \
            for (; j + 3 <= n; j += 3) {                                           \
                if (R == 4)                                                        \
                    wgrad_block_##SFX(4, 3, l, ai, b + j * l, accumulate, ci + j, n); \
                else                                                               \
                    wgrad_block_##SFX(1, 3, l, ai, b + j * l, accumulate, ci + j, n); \
            }                                                                      \
            for (; j < n; j++) {                                                   \
                if (R == 4)                                                        \
                    wgrad_block_##SFX(4, 1, l, ai, b + j * l, accumulate, ci + j, n); \
                else                                                               \
                    wgrad_block_##SFX(1, 1, l, ai, b + j * l, accumulate, ci + j, n); \
            }                                                                      \
            i += R;                                                                \
        }                                                                          \
    }

DEF_CPU_SHORT(f32, float, tg_f32v, tg_f32u, tg_i32v)
DEF_CPU_SHORT(f64, double, tg_f64v, tg_f64u, tg_i64v)

void tg__cpu_conv_register(void)
{
#define SET(KID, fn)                                                               \
    tg__kernel_set(TG_K_##KID, TG_BACKEND_CPU, TG_F32, (tg_kernel_fn)fn##_f32);    \
    tg__kernel_set(TG_K_##KID, TG_BACKEND_CPU, TG_F64, (tg_kernel_fn)fn##_f64);
    SET(IM2COL, im2col)
    SET(COL2IM, col2im)
    SET(CHANNEL_SUM, channel_sum)
    SET(CONV_SHORT_FWD, conv_short_fwd)
    SET(CONV_SHORT_WGRAD, conv_short_wgrad)
#undef SET
}
