/* test_nn_ops.c - conv2d, max/avg pooling, layer norm and batch norm:
 * forward values against hand-computed numbers on both backends and both
 * float dtypes, conv2d against a direct 7-loop convolution (forward and
 * gradients), gradients of the wrappers (no bias, evaluation mode), the
 * running statistics, and error cases by exact status code. */
#include <criterion/criterion.h>
#include <tapegrad.h>

#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const tg_backend backends[2] = {TG_BACKEND_REF, TG_BACKEND_CPU};
static const tg_dtype dtypes[2] = {TG_F32, TG_F64};

static tg_tensor *iota(tg_dtype dt, int ndim, const int64_t *shape, double start)
{
    double v[256];
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    cr_assert(n <= 256);
    for (int64_t i = 0; i < n; i++) v[i] = start + (double)i;
    return tu_tensor(dt, ndim, shape, v);
}

static double tol_of(tg_dtype dt)
{
    return dt == TG_F32 ? 2e-6 : 1e-12;
}

static void setup(void)
{
    tg_error_clear();
    tg_set_default_backend(TG_BACKEND_CPU);
    tg_scope_begin();
}

static void teardown(void)
{
    tg_scope_end();
    tg_set_default_backend(TG_BACKEND_CPU);
}

TestSuite(nn_ops, .init = setup, .fini = teardown);

static tg_backend use_backend(int i)
{
    tg_set_default_backend(backends[i]);
    return backends[i];
}

/* Runs the body once per (backend, dtype), with that backend the default
 * (the inner one-shot loops only declare be and dt). */
#define FOR_EACH_BACKEND_DTYPE(be, dt)                                            \
    for (int k_ = 0; k_ < 4; k_++)                                                \
        for (tg_backend be = use_backend(k_ / 2), *p_ = &be; p_; p_ = NULL)       \
            for (tg_dtype dt = dtypes[k_ % 2], *q_ = &dt; q_; q_ = NULL)

/* ---- conv2d forward */

Test(nn_ops, conv2d_of_a_3x3_image_with_a_2x2_kernel_and_bias)
{
    FOR_EACH_BACKEND_DTYPE(be, dt) {
        tg_tensor *x = iota(dt, 4, SHAPE(1, 1, 3, 3), 1);
        tg_tensor *w = tu_tensor(dt, 4, SHAPE(1, 1, 2, 2), VALS(1, 2, 3, 4));
        tg_tensor *b = tu_tensor(dt, 1, SHAPE(1), VALS(1));
        tg_tensor *y = tg_conv2d(x, w, b, NULL);
        tu_expect_shape(y, 4, SHAPE(1, 1, 2, 2));
        cr_assert_eq(tg_tensor_backend(y), be);
        tu_expect_values(y, VALS(38, 48, 68, 78), 4, tol_of(dt));
        tu_expect_values(tg_conv2d(x, w, NULL, NULL), VALS(37, 47, 67, 77), 4, tol_of(dt));
    }
}

Test(nn_ops, conv2d_with_stride_2_padding_1_dilation_2)
{
    /* x[h][w] = 5h + w; taps at offsets 0 and 2 in each dim, rows/cols
     * 2*o - 1 + {0, 2}; out-of-range taps read the zero padding. */
    tg_conv2d_opts o = {.stride = {2, 2}, .padding = {1, 1}, .dilation = {2, 2}};
    FOR_EACH_BACKEND_DTYPE(be, dt) {
        (void)be;
        tg_tensor *x = iota(dt, 4, SHAPE(1, 1, 5, 5), 0);
        tg_tensor *w = tu_tensor(dt, 4, SHAPE(1, 1, 2, 2), VALS(1, 2, 3, 4));
        tg_tensor *y = tg_conv2d(x, w, NULL, &o);
        tu_expect_shape(y, 4, SHAPE(1, 1, 3, 3));
        tu_expect_values(y, VALS(24, 50, 24, 76, 142, 62, 32, 52, 18), 9, tol_of(dt));
    }
}

Test(nn_ops, conv2d_with_two_groups_and_a_1x1_kernel)
{
    /* Channel pairs: out 0 = 1*x0 + 2*x1, out 1 = 3*x2 - x3. */
    FOR_EACH_BACKEND_DTYPE(be, dt) {
        (void)be;
        tg_tensor *x = tu_tensor(dt, 4, SHAPE(1, 4, 1, 2), VALS(1, 2, 3, 4, 5, 6, 7, 8));
        tg_tensor *w = tu_tensor(dt, 4, SHAPE(2, 2, 1, 1), VALS(1, 2, 3, -1));
        tg_conv2d_opts o = {.groups = 2};
        tg_tensor *y = tg_conv2d(x, w, NULL, &o);
        tu_expect_shape(y, 4, SHAPE(1, 2, 1, 2));
        tu_expect_values(y, VALS(7, 10, 8, 10), 4, tol_of(dt));
    }
}

Test(nn_ops, conv2d_gradients_of_the_sum_are_hand_computed)
{
    FOR_EACH_BACKEND_DTYPE(be, dt) {
        (void)be;
        if (dt != TG_F64) continue; /* leaves of f64 suffice; values are exact */
        tg_tape *tape = tg_tape_new(NULL);
        tg_tensor *x = iota(dt, 4, SHAPE(1, 1, 3, 3), 1);
        tg_tensor *w = tu_tensor(dt, 4, SHAPE(1, 1, 2, 2), VALS(1, 2, 3, 4));
        tg_tensor *b = tu_tensor(dt, 1, SHAPE(1), VALS(1));
        cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
        cr_assert_eq(tg_requires_grad(tape, w), TG_OK);
        cr_assert_eq(tg_requires_grad(tape, b), TG_OK);
        cr_assert_eq(tg_backward(tg_sum(tg_conv2d(x, w, b, NULL))), TG_OK, "%s",
                     tg_last_error_message());
        tu_expect_values(tg_grad(x), VALS(1, 3, 2, 4, 10, 6, 3, 7, 4), 9, 1e-12);
        tu_expect_values(tg_grad(w), VALS(12, 16, 24, 28), 4, 1e-12);
        tu_expect_values(tg_grad(b), VALS(4), 1, 1e-12);
        tg_tape_free(tape);
    }
}

/* Direct convolution, the independent oracle for the im2col path. */
typedef struct conv_case {
    int64_t N, C, H, W, O, KH, KW;
    int sh, sw, ph, pw, dh, dw, G;
} conv_case;

static int64_t extent(int64_t in, int64_t k, int s, int p, int d)
{
    return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

static void direct_conv(const conv_case *c, const double *x, const double *w, const double *b,
                        const double *gy, double *y, double *gx, double *gw)
{
    int64_t OH = extent(c->H, c->KH, c->sh, c->ph, c->dh);
    int64_t OW = extent(c->W, c->KW, c->sw, c->pw, c->dw);
    int64_t Cg = c->C / c->G, Og = c->O / c->G;
    memset(gx, 0, sizeof(double) * (size_t)(c->N * c->C * c->H * c->W));
    memset(gw, 0, sizeof(double) * (size_t)(c->O * Cg * c->KH * c->KW));
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t o = 0; o < c->O; o++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    int64_t yi = ((n * c->O + o) * OH + oh) * OW + ow;
                    double acc = b[o];
                    for (int64_t cc = 0; cc < Cg; cc++)
                        for (int64_t i = 0; i < c->KH; i++)
                            for (int64_t j = 0; j < c->KW; j++) {
                                int64_t ih = oh * c->sh - c->ph + i * c->dh;
                                int64_t iw = ow * c->sw - c->pw + j * c->dw;
                                if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W) continue;
                                int64_t ci = (o / Og) * Cg + cc;
                                int64_t xi = ((n * c->C + ci) * c->H + ih) * c->W + iw;
                                int64_t wi = ((o * Cg + cc) * c->KH + i) * c->KW + j;
                                acc += w[wi] * x[xi];
                                gx[xi] += gy[yi] * w[wi];
                                gw[wi] += gy[yi] * x[xi];
                            }
                    y[yi] = acc;
                }
}

/* A case's output extent and sizes, and its x, w, b (uniform in +-b_half)
 * and gy drawn from rng in that order (x and gy hold at most cap values,
 * w at most 512). */
typedef struct conv_dims {
    int64_t OH, OW, nx, nw, ny;
} conv_dims;

static conv_dims conv_draw(const conv_case *c, tg_rng *rng, double b_half, int64_t cap, double *x,
                           double *w, double *b, double *gy)
{
    conv_dims d = {.OH = extent(c->H, c->KH, c->sh, c->ph, c->dh),
                   .OW = extent(c->W, c->KW, c->sw, c->pw, c->dw)};
    d.nx = c->N * c->C * c->H * c->W;
    d.nw = c->O * (c->C / c->G) * c->KH * c->KW;
    d.ny = c->N * c->O * d.OH * d.OW;
    cr_assert(d.nx <= cap && d.nw <= 512 && d.ny <= cap);
    for (int64_t i = 0; i < d.nx; i++) x[i] = tg_rng_double(rng) * 2 - 1;
    for (int64_t i = 0; i < d.nw; i++) w[i] = tg_rng_double(rng) * 2 - 1;
    for (int64_t i = 0; i < c->O; i++) b[i] = (tg_rng_double(rng) * 2 - 1) * b_half;
    for (int64_t i = 0; i < d.ny; i++) gy[i] = tg_rng_double(rng) * 2 - 1;
    return d;
}

static tg_conv2d_opts conv_opts(const conv_case *c)
{
    return (tg_conv2d_opts){.stride = {c->sh, c->sw}, .padding = {c->ph, c->pw},
                            .dilation = {c->dh, c->dw}, .groups = c->G};
}

Test(nn_ops, conv2d_matches_a_direct_convolution_forward_and_backward)
{
    static const conv_case cases[] = {
        {2, 4, 7, 6, 6, 3, 2, 2, 1, 1, 2, 2, 1, 2},
        {1, 3, 6, 6, 2, 3, 3, 2, 2, 1, 1, 2, 2, 1},
        {2, 2, 5, 5, 4, 1, 1, 1, 1, 0, 0, 1, 1, 1},
        {1, 2, 5, 4, 3, 1, 1, 2, 2, 1, 0, 1, 1, 1},
        {1, 1, 4, 3, 2, 2, 2, 1, 1, 1, 1, 1, 3, 1}, /* a tap beyond the right edge */
    };
    static double x[512], w[512], b[16], gy[512], y[512], gx[512], gw[512];
    tg_rng rng;
    tg_rng_seed(&rng, 7);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const conv_case *c = &cases[k];
        conv_dims d = conv_draw(c, &rng, 1.0, 512, x, w, b, gy);
        int64_t OH = d.OH, OW = d.OW, nx = d.nx, nw = d.nw, ny = d.ny;
        direct_conv(c, x, w, b, gy, y, gx, gw);
        tg_conv2d_opts o = conv_opts(c);
        FOR_EACH_BACKEND_DTYPE(be, dt) {
            (void)be;
            tg_tape *tape = tg_tape_new(NULL);
            tg_tensor *tx = tu_tensor(dt, 4, SHAPE(c->N, c->C, c->H, c->W), x);
            tg_tensor *tw = tu_tensor(dt, 4, SHAPE(c->O, c->C / c->G, c->KH, c->KW), w);
            tg_tensor *tb = tu_tensor(dt, 1, SHAPE(c->O), b);
            tg_tensor *seed = tu_tensor(dt, 4, SHAPE(c->N, c->O, OH, OW), gy);
            cr_assert_eq(tg_requires_grad(tape, tx), TG_OK);
            cr_assert_eq(tg_requires_grad(tape, tw), TG_OK);
            tg_tensor *ty = tg_conv2d(tx, tw, tb, &o);
            tu_expect_shape(ty, 4, SHAPE(c->N, c->O, OH, OW));
            double tol = dt == TG_F32 ? 1e-5 : 1e-12;
            tu_expect_values(ty, y, ny, tol);
            cr_assert_eq(tg_backward_seed(ty, seed), TG_OK, "%s", tg_last_error_message());
            tu_expect_values(tg_grad(tx), gx, nx, tol);
            tu_expect_values(tg_grad(tw), gw, nw, tol);
            tg_tape_free(tape);
        }
    }
}

/* ---- conv2d_relu: relu(conv2d(...)) as one op */

/* Whether a and b hold the same bits (same dtype and numel). */
static bool same_bits(const tg_tensor *a, const tg_tensor *b)
{
    if (!a || !b || tg_tensor_dtype(a) != tg_tensor_dtype(b) ||
        tg_tensor_numel(a) != tg_tensor_numel(b))
        return false;
    size_t n = (size_t)tg_tensor_numel(a) * tg_dtype_size(tg_tensor_dtype(a));
    char *pa = malloc(n ? n : 1), *pb = malloc(n ? n : 1);
    bool ok = pa && pb && !tg_tensor_copy_out(a, pa, n) && !tg_tensor_copy_out(b, pb, n) &&
              memcmp(pa, pb, n) == 0;
    free(pa);
    free(pb);
    return ok;
}

/* The fused op against conv2d then relu on the same leaves: the output,
 * the first-order gradients of x, w and b for a random seed (by a plain
 * sweep, and again through create_graph, which takes the other path of
 * the backward), and a second-order gradient (d/dx and d/dw of the sum of
 * the squared first-order weight gradient), all bit for bit. Geometries
 * with stride, padding, dilation, groups and the direct 1x1 path; biases
 * around 0 so that about half the outputs are rectified. */
Test(nn_ops, conv2d_relu_is_relu_of_conv2d_bit_for_bit_to_second_order)
{
    static const conv_case cases[] = {
        {2, 4, 7, 6, 6, 3, 2, 2, 1, 1, 2, 2, 1, 2},
        {3, 1, 9, 9, 5, 3, 3, 1, 1, 0, 0, 1, 1, 1},
        {2, 2, 5, 5, 4, 1, 1, 1, 1, 0, 0, 1, 1, 1},
        {1, 3, 6, 6, 2, 3, 3, 2, 2, 1, 1, 2, 2, 1},
    };
    static double x[1024], w[512], b[16], gy[1024];
    tg_rng rng;
    tg_rng_seed(&rng, 29);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const conv_case *c = &cases[k];
        conv_dims d = conv_draw(c, &rng, 0.2, 1024, x, w, b, gy);
        int64_t OH = d.OH, OW = d.OW, ny = d.ny;
        tg_conv2d_opts o = conv_opts(c);
        FOR_EACH_BACKEND_DTYPE(be, dt) {
            tg_tensor *y[2], *g0[2][3], *g1[2][3], *g2[2][2];
            int64_t zeros = 0;
            for (int fused = 0; fused < 2; fused++) {
                tg_tape *tape = tg_tape_new(NULL);
                tg_tensor *tx = tu_tensor(dt, 4, SHAPE(c->N, c->C, c->H, c->W), x);
                tg_tensor *tw = tu_tensor(dt, 4, SHAPE(c->O, c->C / c->G, c->KH, c->KW), w);
                tg_tensor *tb = tu_tensor(dt, 1, SHAPE(c->O), b);
                tg_tensor *seed = tu_tensor(dt, 4, SHAPE(c->N, c->O, OH, OW), gy);
                cr_assert_eq(tg_requires_grad(tape, tx), TG_OK);
                cr_assert_eq(tg_requires_grad(tape, tw), TG_OK);
                cr_assert_eq(tg_requires_grad(tape, tb), TG_OK);
                tg_tensor *ty = fused ? tg_conv2d_relu(tx, tw, tb, &o)
                                      : tg_relu(tg_conv2d(tx, tw, tb, &o));
                cr_assert_not_null(ty, "%s", tg_last_error_message());
                tu_expect_shape(ty, 4, SHAPE(c->N, c->O, OH, OW));
                tg_tensor *in[3] = {tx, tw, tb};
                /* First order as training runs it (nothing records in the
                 * sweep), then the same through create_graph. */
                cr_assert_eq(tg_backward_ex(ty, seed, &(tg_grad_opts){.retain = true}), TG_OK,
                             "%s", tg_last_error_message());
                for (int i = 0; i < 3; i++) g0[fused][i] = tg_detach(tg_grad(in[i]));
                tg_grad_opts cg = {.create_graph = true};
                cr_assert_eq(tg_grad_of(1, &ty, &seed, 3, in, g1[fused], &cg), TG_OK, "%s",
                             tg_last_error_message());
                tg_tensor *gw2 = tg_sum(tg_mul(g1[fused][1], g1[fused][1]));
                cr_assert_eq(tg_grad_of(1, &gw2, NULL, 2, in, g2[fused],
                                        &(tg_grad_opts){.allow_unused = true}),
                             TG_OK, "%s", tg_last_error_message());
                y[fused] = tg_detach(ty);
                for (int i = 0; i < 3; i++) g1[fused][i] = tg_detach(g1[fused][i]);
                double *v = tu_values(y[fused]);
                for (int64_t i = 0; fused && i < ny; i++) zeros += v[i] == 0.0;
                free(v);
                tg_tape_free(tape);
            }
            cr_expect(zeros > ny / 4 && zeros < ny, "case %zu: %lld of %lld outputs rectified",
                      k, (long long)zeros, (long long)ny);
            cr_expect(same_bits(y[0], y[1]), "case %zu, %s, %s: outputs", k,
                      tg_backend_name(be), tg_dtype_name(dt));
            for (int i = 0; i < 3; i++) {
                cr_expect(same_bits(g0[0][i], g0[1][i]), "case %zu, %s, %s: gradient of input %d",
                          k, tg_backend_name(be), tg_dtype_name(dt), i);
                cr_expect(same_bits(g1[0][i], g1[1][i]),
                          "case %zu, %s, %s: create_graph gradient of input %d", k,
                          tg_backend_name(be), tg_dtype_name(dt), i);
                cr_expect(same_bits(g0[1][i], g1[1][i]),
                          "case %zu, %s, %s: input %d, the two sweeps", k, tg_backend_name(be),
                          tg_dtype_name(dt), i);
            }
            for (int i = 0; i < 2; i++)
                cr_expect(same_bits(g2[0][i], g2[1][i]),
                          "case %zu, %s, %s: second-order gradient of input %d", k,
                          tg_backend_name(be), tg_dtype_name(dt), i);
        }
    }
}

Test(nn_ops, conv2d_relu_checks_its_arguments_as_conv2d_does)
{
    tg_tensor *x = tg_zeros(TG_F32, 4, SHAPE(1, 2, 5, 5));
    tg_tensor *w = tg_zeros(TG_F32, 4, SHAPE(3, 2, 3, 3));
    tg_tensor *w3 = tg_zeros(TG_F32, 4, SHAPE(3, 3, 3, 3));
    tg_tensor *w64 = tg_zeros(TG_F64, 4, SHAPE(3, 2, 3, 3));
    cr_expect_null(tg_conv2d_relu(NULL, w, NULL, NULL));
    cr_expect_eq(tg_last_error(), TG_ERR_NULL);
    tu_expect_message_has("conv2d_relu");
    tg_error_clear();
    cr_expect_null(tg_conv2d_relu(x, w3, NULL, NULL));
    cr_expect_eq(tg_last_error(), TG_ERR_SHAPE);
    tu_expect_message_has("conv2d_relu");
    tg_error_clear();
    cr_expect_null(tg_conv2d_relu(x, w64, NULL, NULL));
    cr_expect_eq(tg_last_error(), TG_ERR_DTYPE);
    tg_error_clear();
    cr_expect_null(tg_conv2d_relu(x, w, NULL, &(tg_conv2d_opts){.stride = {-1, 1}}));
    cr_expect_eq(tg_last_error(), TG_ERR_INVALID);
    tg_error_clear();
    /* Without a bias: max(0, W * x), here of zeros. */
    tg_tensor *y = tg_conv2d_relu(x, w, NULL, NULL);
    cr_assert_not_null(y, "%s", tg_last_error_message());
    tu_expect_shape(y, 4, SHAPE(1, 3, 3, 3));
    cr_expect_eq(tu_item(tg_sum(y)), 0.0);
}

/* ---- pooling */

Test(nn_ops, max_pool2d_picks_window_maxima_and_routes_the_gradient_there)
{
    tg_pool2d_opts o2 = {.kernel = {2, 2}};
    tg_pool2d_opts o3 = {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}};
    FOR_EACH_BACKEND_DTYPE(be, dt) {
        (void)be;
        tg_tensor *x = tu_tensor(dt, 4, SHAPE(1, 1, 4, 4),
                                 VALS(1, 5, 2, 0, 3, -1, 7, 6, 0, 0, -2, -3, 9, 4, -4, -1));
        tg_tensor *y = tg_max_pool2d(x, &o2);
        tu_expect_shape(y, 4, SHAPE(1, 1, 2, 2));
        tu_expect_values(y, VALS(5, 7, 9, -1), 4, 0);
        /* x[h][w] = 4h + w grows to the bottom right of each window. */
        tu_expect_values(tg_max_pool2d(iota(dt, 4, SHAPE(1, 1, 4, 4), 0), &o3), VALS(5, 7, 13, 15),
                         4, 0);
    }
    FOR_EACH_BACKEND_DTYPE(be, dt) {
        (void)be;
        if (dt != TG_F64) continue;
        /* Overlapping 2x2 stride-1 windows all pick the centre: its
         * gradient accumulates four times. */
        tg_tape *tape = tg_tape_new(NULL);
        tg_tensor *x = tu_tensor(dt, 4, SHAPE(1, 1, 3, 3), VALS(1, 2, 3, 4, 9, 5, 6, 7, 8));
        cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
        tg_pool2d_opts o = {.kernel = {2, 2}, .stride = {1, 1}};
        tg_tensor *y = tg_max_pool2d(x, &o);
        tu_expect_values(y, VALS(9, 9, 9, 9), 4, 0);
        cr_assert_eq(tg_backward(tg_sum(y)), TG_OK, "%s", tg_last_error_message());
        tu_expect_values(tg_grad(x), VALS(0, 0, 0, 0, 4, 0, 0, 0, 0), 9, 0);
        tg_tape_free(tape);
    }
}

Test(nn_ops, avg_pool2d_counts_padding_by_default_and_can_exclude_it)
{
    tg_pool2d_opts o = {.kernel = {2, 2}, .stride = {1, 1}};
    tg_pool2d_opts pad = {.kernel = {2, 2}, .stride = {2, 2}, .padding = {1, 1}};
    tg_pool2d_opts excl = pad;
    excl.exclude_pad = true;
    FOR_EACH_BACKEND_DTYPE(be, dt) {
        (void)be;
        tg_tensor *x = iota(dt, 4, SHAPE(1, 1, 3, 3), 1);
        tu_expect_values(tg_avg_pool2d(x, &o), VALS(3, 4, 6, 7), 4, tol_of(dt));
        tg_tensor *y = tg_avg_pool2d(x, &pad);
        tu_expect_shape(y, 4, SHAPE(1, 1, 2, 2));
        tu_expect_values(y, VALS(0.25, 1.25, 2.75, 7), 4, tol_of(dt));
        tu_expect_values(tg_avg_pool2d(x, &excl), VALS(1, 2.5, 5.5, 7), 4, tol_of(dt));
    }
    FOR_EACH_BACKEND_DTYPE(be, dt) {
        (void)be;
        if (dt != TG_F64) continue;
        tg_tape *tape = tg_tape_new(NULL);
        tg_tensor *x = iota(dt, 4, SHAPE(1, 1, 3, 3), 1);
        cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
        cr_assert_eq(tg_backward(tg_sum(tg_avg_pool2d(x, &o))), TG_OK, "%s",
                     tg_last_error_message());
        tu_expect_values(tg_grad(x), VALS(0.25, 0.5, 0.25, 0.5, 1, 0.5, 0.25, 0.5, 0.25), 9, 1e-15);
        tg_tape_free(tape);
    }
}

/* ---- layer norm */

Test(nn_ops, layer_norm_over_the_last_dim_and_the_last_two)
{
    double r = sqrt(1.5), s5 = sqrt(5.0);
    FOR_EACH_BACKEND_DTYPE(be, dt) {
        (void)be;
        tg_tensor *x = tu_tensor(dt, 2, SHAPE(2, 3), VALS(1, 2, 3, 2, 4, 6));
        tu_expect_values(tg_layer_norm(x, 1, NULL, NULL, 0.0), VALS(-r, 0, r, -r, 0, r), 6,
                         tol_of(dt));
        tg_tensor *w = tu_tensor(dt, 1, SHAPE(3), VALS(1, 2, 3));
        tg_tensor *b = tu_tensor(dt, 1, SHAPE(3), VALS(0, 1, 0));
        tg_tensor *y = tg_layer_norm(x, 1, w, b, 0.0);
        tu_expect_shape(y, 2, SHAPE(2, 3));
        tu_expect_values(y, VALS(-r, 1, 3 * r, -r, 1, 3 * r), 6, tol_of(dt));
        tg_tensor *x3 = tu_tensor(dt, 3, SHAPE(1, 2, 2), VALS(0, 2, 4, 6));
        tu_expect_values(tg_layer_norm(x3, 2, NULL, NULL, 0.0),
                         VALS(-3 / s5, -1 / s5, 1 / s5, 3 / s5), 4, tol_of(dt));
        /* eps enters under the root: var 1 + eps 3 halves the output. */
        tg_tensor *x2 = tu_tensor(dt, 1, SHAPE(2), VALS(-1, 1));
        tu_expect_values(tg_layer_norm(x2, 1, NULL, NULL, 3.0), VALS(-0.5, 0.5), 2, tol_of(dt));
    }
}

/* ---- batch norm */

Test(nn_ops, batch_norm_training_uses_batch_statistics_and_updates_running_ones)
{
    double a = 1.5 / sqrt(1.25), c = 0.5 / sqrt(1.25);
    FOR_EACH_BACKEND_DTYPE(be, dt) {
        (void)be;
        tg_tensor *x = tu_tensor(dt, 2, SHAPE(4, 2), VALS(1, 0, 2, 0, 3, 4, 4, 4));
        tg_tensor *rm = tu_tensor(dt, 1, SHAPE(2), VALS(0, 0));
        tg_tensor *rv = tu_tensor(dt, 1, SHAPE(2), VALS(1, 1));
        tg_tensor *y = tg_batch_norm(x, NULL, NULL, rm, rv, true, 0.1, 0.0);
        tu_expect_shape(y, 2, SHAPE(4, 2));
        tu_expect_values(y, VALS(-a, -1, -c, -1, c, 1, a, 1), 8, tol_of(dt));
        /* Means 2.5 and 2; unbiased variances 5/3 and 16/3. */
        tu_expect_values(rm, VALS(0.25, 0.2), 2, tol_of(dt));
        tu_expect_values(rv, VALS(0.9 + 0.5 / 3, 0.9 + 1.6 / 3), 2, tol_of(dt));
        /* A second step applies the momentum again. */
        tg_batch_norm(x, NULL, NULL, rm, rv, true, 0.1, 0.0);
        tu_expect_values(rm, VALS(0.9 * 0.25 + 0.25, 0.9 * 0.2 + 0.2), 2, tol_of(dt));
        /* Affine, NCHW: channel 1 gets weight 2 and bias -1. */
        tg_tensor *x4 = tu_tensor(dt, 4, SHAPE(2, 2, 1, 1), VALS(1, 5, 3, 7));
        tg_tensor *w = tu_tensor(dt, 1, SHAPE(2), VALS(1, 2));
        tg_tensor *b = tu_tensor(dt, 1, SHAPE(2), VALS(0, -1));
        tu_expect_values(tg_batch_norm(x4, w, b, NULL, NULL, true, 0.1, 0.0), VALS(-1, -3, 1, 1), 4,
                         tol_of(dt));
    }
}

Test(nn_ops, batch_norm_evaluation_uses_running_statistics_and_leaves_them_alone)
{
    FOR_EACH_BACKEND_DTYPE(be, dt) {
        (void)be;
        tg_tensor *x = tu_tensor(dt, 2, SHAPE(4, 2), VALS(1, 0, 2, 0, 3, 4, 4, 4));
        tg_tensor *rm = tu_tensor(dt, 1, SHAPE(2), VALS(1, 2));
        tg_tensor *rv = tu_tensor(dt, 1, SHAPE(2), VALS(4, 0.25));
        tg_tensor *w = tu_tensor(dt, 1, SHAPE(2), VALS(2, 1));
        tg_tensor *b = tu_tensor(dt, 1, SHAPE(2), VALS(0.5, -1));
        tg_tensor *y = tg_batch_norm(x, w, b, rm, rv, false, 0.1, 0.0);
        tu_expect_shape(y, 2, SHAPE(4, 2));
        tu_expect_values(y, VALS(0.5, -5, 1.5, -5, 2.5, 3, 3.5, 3), 8, tol_of(dt));
        tu_expect_values(tg_batch_norm(x, NULL, NULL, rm, rv, false, 0.1, 0.0),
                         VALS(0, -4, 0.5, -4, 1, 4, 1.5, 4), 8, tol_of(dt));
        tu_expect_values(rm, VALS(1, 2), 2, 0);
        tu_expect_values(rv, VALS(4, 0.25), 2, 0);
    }
}

/* Gradcheck of the public wrappers (paths the op samples do not reach). */
typedef struct wrap {
    int which;
    tg_tensor *rm, *rv;
} wrap;

static tg_tensor *call_wrapper(void *ud, int n, tg_tensor *const *in)
{
    wrap *w = ud;
    tg_conv2d_opts co = {.stride = {2, 1}, .padding = {1, 1}};
    (void)n;
    switch (w->which) {
    case 0: return tg_conv2d(in[0], in[1], NULL, &co);
    case 1: return tg_batch_norm(in[0], in[1], in[2], w->rm, w->rv, false, 0.1, 1e-5);
    case 2: return tg_batch_norm(in[0], NULL, NULL, NULL, NULL, true, 0.1, 1e-5);
    default: return tg_layer_norm(in[0], 2, NULL, NULL, 1e-5);
    }
}

Test(nn_ops, wrappers_without_bias_or_weights_and_in_evaluation_pass_gradcheck)
{
    tg_rng rng;
    tg_rng_seed(&rng, 3);
    for (int b = 0; b < 2; b++) {
        tg_set_default_backend(backends[b]);
        tg_tensor *x = tg_rand_uniform(&rng, TG_F64, 4, SHAPE(2, 2, 4, 3), -1, 1);
        tg_tensor *w = tg_rand_uniform(&rng, TG_F64, 4, SHAPE(3, 2, 2, 2), -1, 1);
        tg_tensor *c = tg_rand_uniform(&rng, TG_F64, 1, SHAPE(2), 0.5, 1.5);
        tg_tensor *d = tg_rand_uniform(&rng, TG_F64, 1, SHAPE(2), -1, 1);
        wrap u = {.rm = tg_rand_uniform(&rng, TG_F64, 1, SHAPE(2), -1, 1),
                  .rv = tg_rand_uniform(&rng, TG_F64, 1, SHAPE(2), 0.5, 2)};
        tg_tensor *in[3] = {x, w, NULL};
        for (int k = 0; k < 4; k++) {
            u.which = k;
            int n = k == 0 ? 2 : k == 1 ? 3 : 1;
            if (k == 1) {
                in[1] = c;
                in[2] = d;
            }
            tg_gradcheck_result res[3];
            tg_status st = tg_gradcheck(call_wrapper, &u, n, in, NULL, res);
            cr_assert_eq(st, TG_OK, "wrapper %d on %s: %s", k, tg_backend_name(backends[b]),
                         tg_last_error_message());
        }
    }
}

Test(nn_ops, a_small_cnn_trains_end_to_end_through_every_op)
{
    /* conv -> batch_norm -> relu -> max_pool -> layer_norm -> avg_pool: all
     * parameters get finite gradients. */
    tg_rng rng;
    tg_rng_seed(&rng, 11);
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = tg_rand_normal(&rng, TG_F32, 4, SHAPE(4, 1, 8, 8), 0, 1);
    tg_tensor *w = tg_rand_normal(&rng, TG_F32, 4, SHAPE(4, 1, 3, 3), 0, 0.3);
    tg_tensor *g = tg_ones(TG_F32, 1, SHAPE(4));
    tg_tensor *rm = tg_zeros(TG_F32, 1, SHAPE(4)), *rv = tg_ones(TG_F32, 1, SHAPE(4));
    cr_assert_eq(tg_requires_grad(tape, w), TG_OK);
    cr_assert_eq(tg_requires_grad(tape, g), TG_OK);
    tg_conv2d_opts co = {.padding = {1, 1}};
    tg_pool2d_opts mp = {.kernel = {2, 2}}, ap = {.kernel = {2, 2}};
    tg_tensor *h = tg_relu(tg_batch_norm(tg_conv2d(x, w, NULL, &co), g, NULL, rm, rv, true, 0.1,
                                         1e-5));
    tg_tensor *out = tg_avg_pool2d(tg_layer_norm(tg_max_pool2d(h, &mp), 2, NULL, NULL, 1e-5), &ap);
    tu_expect_shape(out, 4, SHAPE(4, 4, 2, 2));
    cr_assert_eq(tg_backward(tg_sum(tg_mul(out, out))), TG_OK, "%s", tg_last_error_message());
    for (int k = 0; k < 2; k++) {
        tg_tensor *gr = tg_grad(k ? g : w);
        cr_assert_not_null(gr);
        for (int64_t i = 0; i < tg_tensor_numel(gr); i++) {
            double v;
            tg_tensor_get(gr, i, &v);
            cr_assert(isfinite(v));
        }
    }
    tg_tape_free(tape);
}

/* ---- errors */

Test(nn_ops, conv2d_rejects_wrong_dtypes_with_dtype)
{
    tg_tensor *xi = tg_zeros(TG_I64, 4, SHAPE(1, 1, 3, 3));
    tg_tensor *x = tg_zeros(TG_F32, 4, SHAPE(1, 1, 3, 3));
    tg_tensor *w = tg_zeros(TG_F64, 4, SHAPE(1, 1, 2, 2));
    cr_assert_null(tg_conv2d(xi, w, NULL, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
    tg_error_clear();
    cr_assert_null(tg_conv2d(x, w, NULL, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
    cr_assert(strstr(tg_last_error_message(), "'conv2d'"), "%s", tg_last_error_message());
}

Test(nn_ops, conv2d_with_mismatched_channels_fails_with_shape_naming_both)
{
    tg_tensor *x = tg_zeros(TG_F64, 4, SHAPE(1, 3, 5, 5));
    tg_tensor *w = tg_zeros(TG_F64, 4, SHAPE(2, 2, 3, 3));
    cr_assert_null(tg_conv2d(x, w, NULL, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    const char *m = tg_last_error_message();
    cr_assert(strstr(m, "'conv2d'") && strstr(m, "[2,2,3,3]") && strstr(m, "[1,3,5,5]"), "%s", m);
    tg_error_clear();
    /* A bias of the wrong length, a kernel larger than the padded input,
     * groups not dividing the channels. */
    tg_tensor *w3 = tg_zeros(TG_F64, 4, SHAPE(2, 3, 3, 3));
    cr_assert_null(tg_conv2d(x, w3, tg_zeros(TG_F64, 1, SHAPE(3)), NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_error_clear();
    cr_assert_null(tg_conv2d(tg_zeros(TG_F64, 4, SHAPE(1, 3, 2, 2)), w3, NULL, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_error_clear();
    tg_conv2d_opts g2 = {.groups = 2};
    cr_assert_null(tg_conv2d(x, w3, NULL, &g2));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_error_clear();
    cr_assert_null(tg_conv2d(tg_zeros(TG_F64, 3, SHAPE(3, 5, 5)), w3, NULL, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
}

Test(nn_ops, conv2d_rejects_bad_options_with_invalid)
{
    tg_tensor *x = tg_zeros(TG_F64, 4, SHAPE(1, 1, 5, 5));
    tg_tensor *w = tg_zeros(TG_F64, 4, SHAPE(1, 1, 3, 3));
    tg_conv2d_opts neg_stride = {.stride = {-1, 1}}, neg_pad = {.padding = {0, -2}};
    tg_conv2d_opts neg_dil = {.dilation = {1, -1}}, neg_groups = {.groups = -1};
    const tg_conv2d_opts *bad[4] = {&neg_stride, &neg_pad, &neg_dil, &neg_groups};
    for (int i = 0; i < 4; i++) {
        tg_error_clear();
        cr_assert_null(tg_conv2d(x, w, NULL, bad[i]));
        cr_assert_eq(tg_last_error(), TG_ERR_INVALID, "case %d: %s", i, tg_last_error_message());
    }
}

Test(nn_ops, null_inputs_return_null_and_keep_the_first_error)
{
    tg_tensor *x = tg_zeros(TG_F64, 4, SHAPE(1, 1, 4, 4));
    tg_pool2d_opts o = {.kernel = {2, 2}};
    cr_assert_null(tg_conv2d(NULL, x, NULL, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
    tg_error_clear();
    cr_assert_null(tg_max_pool2d(NULL, &o));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
    tg_error_clear();
    /* A shape error first: every later NULL keeps it. */
    cr_assert_null(tg_conv2d(x, tg_zeros(TG_F64, 4, SHAPE(1, 2, 2, 2)), NULL, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_tensor *bad = tg_conv2d(x, tg_zeros(TG_F64, 4, SHAPE(1, 2, 2, 2)), NULL, NULL);
    cr_assert_null(tg_avg_pool2d(tg_max_pool2d(bad, &o), &o));
    cr_assert_null(tg_layer_norm(bad, 1, NULL, NULL, 1e-5));
    cr_assert_null(tg_batch_norm(bad, NULL, NULL, NULL, NULL, true, 0.1, 1e-5));
    cr_assert_null(tg_conv2d(x, bad, NULL, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE, "%s", tg_last_error_message());
}

Test(nn_ops, pooling_rejects_bad_options_and_shapes)
{
    tg_tensor *x = tg_zeros(TG_F64, 4, SHAPE(1, 1, 4, 4));
    cr_assert_null(tg_max_pool2d(x, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
    tg_error_clear();
    tg_pool2d_opts wide_pad = {.kernel = {2, 2}, .padding = {2, 0}};
    cr_assert_null(tg_avg_pool2d(x, &wide_pad));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tg_error_clear();
    tg_pool2d_opts no_kernel = {.kernel = {0, 2}};
    cr_assert_null(tg_max_pool2d(x, &no_kernel));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tg_error_clear();
    tg_pool2d_opts big = {.kernel = {5, 5}};
    cr_assert_null(tg_max_pool2d(x, &big));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_error_clear();
    tg_pool2d_opts o = {.kernel = {2, 2}};
    cr_assert_null(tg_max_pool2d(tg_zeros(TG_F64, 3, SHAPE(1, 4, 4)), &o));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    cr_assert(strstr(tg_last_error_message(), "'max_pool2d'"), "%s", tg_last_error_message());
    tg_error_clear();
    cr_assert_null(tg_avg_pool2d(tg_zeros(TG_I64, 4, SHAPE(1, 1, 4, 4)), &o));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
}

Test(nn_ops, layer_norm_rejects_bad_dims_weights_and_eps)
{
    tg_tensor *x = tg_zeros(TG_F64, 2, SHAPE(2, 3));
    cr_assert_null(tg_layer_norm(x, 0, NULL, NULL, 1e-5));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tg_error_clear();
    cr_assert_null(tg_layer_norm(x, 3, NULL, NULL, 1e-5));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tg_error_clear();
    cr_assert_null(tg_layer_norm(x, 1, tg_ones(TG_F64, 1, SHAPE(2)), NULL, 1e-5));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    cr_assert(strstr(tg_last_error_message(), "'layer_norm'") &&
                  strstr(tg_last_error_message(), "[2]"),
              "%s", tg_last_error_message());
    tg_error_clear();
    cr_assert_null(tg_layer_norm(x, 1, tg_ones(TG_F32, 1, SHAPE(3)), NULL, 1e-5));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
    tg_error_clear();
    cr_assert_null(tg_layer_norm(x, 1, NULL, NULL, -1.0));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tg_error_clear();
    cr_assert_null(tg_layer_norm(tg_zeros(TG_I64, 2, SHAPE(2, 3)), 1, NULL, NULL, 1e-5));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
}

Test(nn_ops, batch_norm_rejects_missing_or_bad_running_statistics)
{
    tg_tensor *x = tg_zeros(TG_F64, 2, SHAPE(4, 3));
    tg_tensor *rm = tg_zeros(TG_F64, 1, SHAPE(3)), *rv = tg_ones(TG_F64, 1, SHAPE(3));
    cr_assert_null(tg_batch_norm(x, NULL, NULL, NULL, rv, false, 0.1, 1e-5));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
    tg_error_clear();
    cr_assert_null(tg_batch_norm(x, NULL, NULL, tg_zeros(TG_F64, 1, SHAPE(2)), rv, true, 0.1, 1e-5));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_error_clear();
    cr_assert_null(tg_batch_norm(x, NULL, NULL, tg_zeros(TG_F32, 1, SHAPE(3)), rv, true, 0.1, 1e-5));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
    tg_error_clear();
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *tracked = tg_zeros(TG_F64, 1, SHAPE(3));
    cr_assert_eq(tg_requires_grad(tape, tracked), TG_OK);
    cr_assert_null(tg_batch_norm(x, NULL, NULL, tracked, rv, true, 0.1, 1e-5));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tg_tape_free(tape);
    tg_error_clear();
    cr_assert_null(tg_batch_norm(x, tg_ones(TG_F64, 1, SHAPE(4)), NULL, rm, rv, false, 0.1, 1e-5));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_error_clear();
    cr_assert_null(tg_batch_norm(x, NULL, NULL, rm, rv, true, 1.5, 1e-5));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tg_error_clear();
    /* One value per channel cannot give training statistics. */
    cr_assert_null(tg_batch_norm(tg_zeros(TG_F64, 2, SHAPE(1, 3)), NULL, NULL, rm, rv, true, 0.1,
                                 1e-5));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_error_clear();
    cr_assert_null(tg_batch_norm(tg_zeros(TG_F64, 1, SHAPE(3)), NULL, NULL, rm, rv, true, 0.1,
                                 1e-5));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    /* Failed calls changed no running statistic. */
    tu_expect_values(rm, VALS(0, 0, 0), 3, 0);
    tu_expect_values(rv, VALS(1, 1, 1), 3, 0);
}


/* cross_entropy keeps its logits and targets only: the log-probabilities
 * its forward makes are made again in backward (by the same kernel), so a
 * loss per step of an unrolled model does not hold a second (N, C) tensor
 * per step. The logits here are a leaf (kept by the tape's leaf list, at
 * no cost), so the node's saved bytes are the targets'. The gradient is
 * (softmax(x) - onehot(t)) / N. */
Test(nn_ops, cross_entropy_saves_no_log_probabilities_and_its_gradient_is_softmax_minus_onehot)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_rng rng;
    tg_rng_seed(&rng, 12);
    enum { N = 8, C = 5 };
    tg_tensor *x = tg_rand_normal(&rng, TG_F64, 2, SHAPE(N, C), 0, 1);
    int64_t lab[N] = {0, 1, 2, 3, 4, 0, 1, 2};
    tg_tensor *t = tg_tensor_from_data(TG_I64, 1, SHAPE(N), lab);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    tg_scope_begin();
    tg_tensor *l = tg_cross_entropy(x, t);
    cr_assert_not_null(l, "%s", tg_last_error_message());
    cr_expect_eq(tg_tape_saved_bytes(tape), (size_t)N * sizeof(int64_t),
                 "saved %zu bytes: only the targets expected", tg_tape_saved_bytes(tape));
    cr_assert_eq(tg_backward(l), TG_OK, "%s", tg_last_error_message());
    tg_scope_end();
    double xv[N * C], g[N * C];
    cr_assert_eq(tg_tensor_copy_out(x, xv, sizeof xv), TG_OK);
    cr_assert_eq(tg_tensor_copy_out(tg_grad(x), g, sizeof g), TG_OK);
    for (int i = 0; i < N; i++) {
        double mx = xv[i * C], s = 0;
        for (int j = 1; j < C; j++) mx = fmax(mx, xv[i * C + j]);
        for (int j = 0; j < C; j++) s += exp(xv[i * C + j] - mx);
        for (int j = 0; j < C; j++) {
            double want = (exp(xv[i * C + j] - mx) / s - (j == lab[i])) / N;
            cr_expect(fabs(g[i * C + j] - want) <= 1e-15 + 1e-13 * fabs(want),
                      "g[%d][%d] = %.17g, want %.17g", i, j, g[i * C + j], want);
        }
    }
    tg_tape_free(tape); /* x and t belong to the suite's scope (setup) */
}

/* lstm_gates against the thirteen ops it replaces: values and the
 * gradients of z and c under a weighted loss, on both backends and both
 * float dtypes (f64 to rounding, f32 to its precision: the order of the
 * arithmetic differs from the composed ops, so the bits may). */
static void gates_composed(tg_tensor *z, tg_tensor *c, int64_t H, tg_tensor **h2, tg_tensor **c2)
{
    tg_tensor *i = tg_sigmoid(tg_narrow(z, -1, 0, H)), *f = tg_sigmoid(tg_narrow(z, -1, H, H));
    tg_tensor *g = tg_tanh(tg_narrow(z, -1, 2 * H, H));
    tg_tensor *o = tg_sigmoid(tg_narrow(z, -1, 3 * H, H));
    *c2 = tg_add(tg_mul(f, c), tg_mul(i, g));
    *h2 = tg_mul(o, tg_tanh(*c2));
}

Test(nn_ops, lstm_gates_equals_the_composed_ops_in_values_and_gradients)
{
    const int64_t B = 5, H = 7;
    for (int bi = 0; bi < 2; bi++)
        for (int di = 0; di < 2; di++) {
            tg_set_default_backend(backends[bi]);
            tg_dtype dt = dtypes[di];
            double tol = dt == TG_F32 ? 2e-6 : 1e-13;
            tg_rng rng;
            tg_rng_seed(&rng, 11);
            tg_tensor *z = tg_rand_uniform(&rng, dt, 2, SHAPE(B, 4 * H), -3, 3);
            tg_tensor *c = tg_rand_uniform(&rng, dt, 2, SHAPE(B, H), -2, 2);
            tg_tensor *wh = tg_rand_uniform(&rng, dt, 2, SHAPE(B, H), -1, 1);
            tg_tensor *wc = tg_rand_uniform(&rng, dt, 2, SHAPE(B, H), -1, 1);
            tg_tensor *got[4], *want[4];
            for (int pass = 0; pass < 2; pass++) {
                tg_tape *tape = tg_tape_new(NULL);
                cr_assert_eq(tg_requires_grad(tape, z), TG_OK);
                cr_assert_eq(tg_requires_grad(tape, c), TG_OK);
                tg_tensor *h2, *c2;
                if (pass == 0) {
                    tg_tensor *y = tg_lstm_gates(z, c);
                    cr_assert_not_null(y, "%s", tg_last_error_message());
                    tu_expect_shape(y, 3, SHAPE(2, B, H));
                    h2 = tg_reshape(tg_narrow(y, 0, 0, 1), 2, SHAPE(B, H));
                    c2 = tg_reshape(tg_narrow(y, 0, 1, 1), 2, SHAPE(B, H));
                } else {
                    gates_composed(z, c, H, &h2, &c2);
                }
                tg_tensor *loss = tg_add(tg_sum(tg_mul(h2, wh)), tg_sum(tg_mul(c2, wc)));
                cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
                tg_tensor **dst = pass == 0 ? got : want;
                dst[0] = tg_tensor_retain(tg_contiguous(h2));
                dst[1] = tg_tensor_retain(tg_contiguous(c2));
                dst[2] = tg_tensor_retain(tg_grad(z));
                dst[3] = tg_tensor_retain(tg_grad(c));
                tg_grad_zero(z);
                tg_grad_zero(c);
                tg_tape_free(tape);
            }
            static const char *const what[4] = {"h'", "c'", "dz", "dc"};
            for (int k = 0; k < 4; k++) {
                cr_assert_eq(tg_tensor_backend(got[k]), backends[bi]);
                double *a = tu_values(got[k]), *b = tu_values(want[k]);
                for (int64_t e = 0; e < tg_tensor_numel(want[k]); e++)
                    cr_expect(fabs(a[e] - b[e]) <= tol * fmax(1.0, fabs(b[e])),
                              "%s %s on %s [%lld]: %.17g, composed %.17g", what[k],
                              tg_dtype_name(dt), tg_backend_name(backends[bi]), (long long)e,
                              a[e], b[e]);
                free(a);
                free(b);
                tg_tensor_release(got[k]);
                tg_tensor_release(want[k]);
            }
        }
}

Test(nn_ops, lstm_gates_rejects_bad_shapes_dtypes_and_nulls)
{
    tg_tensor *z = tg_zeros(TG_F64, 2, SHAPE(3, 8)), *c = tg_zeros(TG_F64, 2, SHAPE(3, 2));
    cr_assert_null(tg_lstm_gates(tg_zeros(TG_F64, 2, SHAPE(3, 7)), c));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    cr_assert(strstr(tg_last_error_message(), "'lstm_gates'") &&
                  strstr(tg_last_error_message(), "[3,7]"),
              "%s", tg_last_error_message());
    tg_error_clear();
    cr_assert_null(tg_lstm_gates(tg_zeros(TG_F64, 2, SHAPE(4, 8)), c));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_error_clear();
    cr_assert_null(tg_lstm_gates(tg_zeros(TG_F64, 1, SHAPE(8)), c));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_error_clear();
    cr_assert_null(tg_lstm_gates(z, tg_zeros(TG_F32, 2, SHAPE(3, 2))));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
    tg_error_clear();
    cr_assert_null(
        tg_lstm_gates(tg_zeros(TG_I64, 2, SHAPE(3, 8)), tg_zeros(TG_I64, 2, SHAPE(3, 2))));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
    tg_error_clear();
    cr_assert_null(tg_lstm_gates(NULL, c));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
    tg_error_clear();
    cr_assert_null(tg_lstm_gates(z, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
    cr_assert(strstr(tg_last_error_message(), "#2"), "%s", tg_last_error_message());
    tg_error_clear();
    /* The inputs stay usable. */
    tg_tensor *y = tg_lstm_gates(z, c);
    cr_assert_not_null(y, "%s", tg_last_error_message());
    double *v = tu_values(y);
    /* z = 0, c = 0: c' = 0.5 * 0 + 0.5 * tanh(0) = 0, h' = 0.5 tanh(0) = 0. */
    for (int e = 0; e < 12; e++) cr_expect_eq(v[e], 0.0);
    free(v);
}

Test(nn_ops, lstm_cell_takes_an_unbatched_state)
{
    tg_rng rng;
    tg_rng_seed(&rng, 3);
    tg_params *ps = tg_params_new();
    tg_lstm_cell *cell = tg_lstm_cell_new(ps, "cell", 3, 4, TG_F64, &rng);
    cr_assert_not_null(cell);
    tg_tensor *x = tg_rand_uniform(&rng, TG_F64, 1, SHAPE(3), -1, 1);
    tg_tensor *h = tg_rand_uniform(&rng, TG_F64, 1, SHAPE(4), -1, 1);
    tg_tensor *c = tg_rand_uniform(&rng, TG_F64, 1, SHAPE(4), -1, 1);
    tg_tensor *h2, *c2, *hb, *cb;
    cr_assert_eq(tg_lstm_cell_forward(cell, x, h, c, &h2, &c2), TG_OK, "%s",
                 tg_last_error_message());
    tu_expect_shape(h2, 1, SHAPE(4));
    tu_expect_shape(c2, 1, SHAPE(4));
    cr_assert_eq(tg_lstm_cell_forward(cell, tg_reshape(x, 2, SHAPE(1, 3)),
                                      tg_reshape(h, 2, SHAPE(1, 4)),
                                      tg_reshape(c, 2, SHAPE(1, 4)), &hb, &cb),
                 TG_OK);
    double *a = tu_values(h2), *b = tu_values(hb), *p = tu_values(c2), *q = tu_values(cb);
    for (int e = 0; e < 4; e++) {
        cr_expect_eq(a[e], b[e], "h'[%d]: %.17g unbatched, %.17g batched", e, a[e], b[e]);
        cr_expect_eq(p[e], q[e], "c'[%d]: %.17g unbatched, %.17g batched", e, p[e], q[e]);
    }
    free(a), free(b), free(p), free(q);
    tg_lstm_cell_free(cell);
    tg_params_free(ps);
}

/* The lstm op through tg_lstm_layer against tg_lstm_cell stepped over the
 * sequence with the same parameters: outputs, final state and the
 * gradients of every parameter, x, h0 and c0 under a weighted loss, on
 * both backends and dtypes, with given and zero initial states. The
 * arithmetic is grouped differently (the biases are summed first, the
 * input projection is one GEMM), so f64 agrees to rounding and f32 to its
 * precision over the chain of steps. Unbatched input gives the batch of
 * one's bits. */
typedef struct seq_run {
    tg_tensor *v[3]; /* out (T, B, H), h_n, c_n (B, H) */
    double *g[7];    /* weight_ih, weight_hh, bias_ih, bias_hh, x, h0, c0 */
    int64_t ng[7];
} seq_run;

enum { SEQ_CELL, SEQ_LAYER, SEQ_UNBATCHED, SEQ_REMAKE };

static void seq_run_model(int mode, tg_dtype dt, const int64_t *xs, int64_t H, bool zero_state,
                          seq_run *r)
{
    tg_rng rng;
    tg_rng_seed(&rng, 21);
    tg_params *ps = tg_params_new();
    int64_t T = xs[0], B = xs[1], I = xs[2];
    tg_lstm_layer *l = mode != SEQ_CELL ? tg_lstm_layer_new(ps, "rnn", I, H, dt, &rng) : NULL;
    if (mode == SEQ_REMAKE)
        cr_assert_eq(tg_lstm_layer_set_opts(l, &(tg_lstm_opts){.remake_gates = true}), TG_OK);
    tg_lstm_cell *cell = mode == SEQ_CELL ? tg_lstm_cell_new(ps, "rnn", I, H, dt, &rng) : NULL;
    cr_assert(l || cell, "%s", tg_last_error_message());
    tg_tensor *x = tg_rand_uniform(&rng, dt, 3, xs, -1.5, 1.5);
    tg_tensor *h0 = tg_rand_uniform(&rng, dt, 2, SHAPE(B, H), -1, 1);
    tg_tensor *c0 = tg_rand_uniform(&rng, dt, 2, SHAPE(B, H), -1, 1);
    tg_tensor *wo = tg_rand_uniform(&rng, dt, 3, SHAPE(T, B, H), -1, 1);
    tg_tensor *wh = tg_rand_uniform(&rng, dt, 2, SHAPE(B, H), -1, 1);
    tg_tensor *wc = tg_rand_uniform(&rng, dt, 2, SHAPE(B, H), -1, 1);
    tg_tape *tape = tg_tape_new(NULL);
    cr_assert_eq(tg_params_requires_grad(ps, tape), TG_OK);
    tg_tensor *leaf[3] = {x, h0, c0};
    for (int i = 0; i < 3; i++) cr_assert_eq(tg_requires_grad(tape, leaf[i]), TG_OK);
    tg_tensor *out, *hn, *cn;
    if (mode == SEQ_LAYER || mode == SEQ_REMAKE) {
        cr_assert_eq(tg_lstm_layer_forward(l, x, zero_state ? NULL : h0, zero_state ? NULL : c0,
                                           &out, &hn, &cn),
                     TG_OK, "%s", tg_last_error_message());
    } else if (mode == SEQ_UNBATCHED) {
        cr_assert(B == 1 && !zero_state);
        cr_assert_eq(tg_lstm_layer_forward(l, tg_reshape(x, 2, SHAPE(T, I)),
                                           tg_reshape(h0, 1, &H), tg_reshape(c0, 1, &H), &out,
                                           &hn, &cn),
                     TG_OK, "%s", tg_last_error_message());
        tu_expect_shape(out, 2, SHAPE(T, H));
        tu_expect_shape(hn, 1, SHAPE(H));
        tu_expect_shape(cn, 1, SHAPE(H));
        out = tg_reshape(out, 3, SHAPE(T, 1, H));
        hn = tg_reshape(hn, 2, SHAPE(1, H));
        cn = tg_reshape(cn, 2, SHAPE(1, H));
    } else {
        tg_tensor *h = zero_state ? tg_zeros(dt, 2, SHAPE(B, H)) : h0;
        tg_tensor *c = zero_state ? tg_zeros(dt, 2, SHAPE(B, H)) : c0;
        tg_tensor *hs[8];
        cr_assert(T <= 8);
        for (int64_t t = 0; t < T; t++) {
            tg_tensor *xt = tg_reshape(tg_narrow(x, 0, t, 1), 2, SHAPE(B, I));
            cr_assert_eq(tg_lstm_cell_forward(cell, xt, h, c, &h, &c), TG_OK, "%s",
                         tg_last_error_message());
            hs[t] = tg_reshape(h, 3, SHAPE(1, B, H));
        }
        out = tg_concat((int)T, hs, 0);
        hn = h;
        cn = c;
    }
    tu_expect_shape(out, 3, SHAPE(T, B, H));
    tg_tensor *loss = tg_add(tg_sum(tg_mul(out, wo)),
                             tg_add(tg_sum(tg_mul(hn, wh)), tg_sum(tg_mul(cn, wc))));
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    tg_tensor *v[3] = {out, hn, cn};
    for (int i = 0; i < 3; i++) r->v[i] = tg_tensor_retain(tg_contiguous(v[i]));
    static const char *const pn[4] = {"rnn.weight_ih", "rnn.weight_hh", "rnn.bias_ih",
                                      "rnn.bias_hh"};
    for (int i = 0; i < 7; i++) {
        r->g[i] = NULL;
        r->ng[i] = 0;
        if (zero_state && i >= 5) continue; /* h0 and c0 are not used */
        tg_tensor *g = tg_grad(i < 4 ? tg_params_find(ps, pn[i]) : leaf[i - 4]);
        cr_assert_not_null(g, "no gradient for #%d", i);
        r->g[i] = tu_values(g);
        r->ng[i] = tg_tensor_numel(g);
    }
    tg_tape_free(tape);
    tg_lstm_layer_free(l);
    tg_lstm_cell_free(cell);
    tg_params_free(ps);
}

/* a against b: every value within tol relative (tol 0: bitwise); frees both. */
static void seq_compare(seq_run *a, seq_run *b, double tol, const char *what)
{
    static const char *const vn[3] = {"out", "h_n", "c_n"};
    static const char *const gn[7] = {"dW_ih", "dW_hh", "db_ih", "db_hh", "dx", "dh0", "dc0"};
    for (int i = 0; i < 10; i++) {
        double *p = i < 3 ? tu_values(a->v[i]) : a->g[i - 3];
        double *q = i < 3 ? tu_values(b->v[i]) : b->g[i - 3];
        int64_t n = i < 3 ? tg_tensor_numel(a->v[i]) : a->ng[i - 3];
        cr_assert_eq(n, i < 3 ? tg_tensor_numel(b->v[i]) : b->ng[i - 3]);
        for (int64_t e = 0; e < n; e++)
            cr_expect(tol ? fabs(p[e] - q[e]) <= tol * fmax(1.0, fabs(q[e])) : p[e] == q[e],
                      "%s: %s[%lld] %.17g against %.17g", what, i < 3 ? vn[i] : gn[i - 3],
                      (long long)e, p[e], q[e]);
        free(p);
        free(q);
        if (i < 3) {
            tg_tensor_release(a->v[i]);
            tg_tensor_release(b->v[i]);
        }
    }
}

Test(nn_ops, lstm_layer_equals_the_cell_stepped_over_the_sequence)
{
    static const struct { int64_t xs[3], H; bool zero; } cases[] = {
        {{5, 3, 4}, 6, false}, {{4, 2, 3}, 5, true}, {{1, 3, 2}, 4, false}, {{6, 1, 3}, 3, false},
        /* z of 64 x 4 x 128 values a step: 256 KiB in f64, a chunk of one
         * step; in f32 a chunk of two and one of one (seq_chunk). */
        {{3, 64, 5}, 128, false},
    };
    for (int bi = 0; bi < 2; bi++)
        for (int di = 0; di < 2; di++)
            for (int k = 0; k < 5; k++) {
                tg_set_default_backend(backends[bi]);
                tg_dtype dt = dtypes[di];
                char what[96];
                snprintf(what, sizeof what, "case %d, %s on %s", k, tg_dtype_name(dt),
                         tg_backend_name(backends[bi]));
                seq_run a, b;
                seq_run_model(SEQ_LAYER, dt, cases[k].xs, cases[k].H, cases[k].zero, &a);
                cr_assert_eq(tg_tensor_backend(a.v[0]), backends[bi]);
                seq_run_model(SEQ_CELL, dt, cases[k].xs, cases[k].H, cases[k].zero, &b);
                seq_compare(&a, &b, dt == TG_F32 ? 2e-5 : 1e-12, what);
                /* Gate rows made again in backward: the same forward; the
                 * gradients the same on ref (its GEMM sums each element
                 * alone), to rounding on cpu (a GEMM over a chunk's rows
                 * may round a row otherwise than one over a step's). */
                seq_run_model(SEQ_LAYER, dt, cases[k].xs, cases[k].H, cases[k].zero, &a);
                seq_run_model(SEQ_REMAKE, dt, cases[k].xs, cases[k].H, cases[k].zero, &b);
                char remade[128];
                snprintf(remade, sizeof remade, "%s, gates made again", what);
                seq_compare(&b, &a, bi == 0 ? 0 : dt == TG_F32 ? 1e-5 : 1e-13, remade);
                if (cases[k].xs[1] == 1) {
                    seq_run_model(SEQ_LAYER, dt, cases[k].xs, cases[k].H, false, &a);
                    seq_run_model(SEQ_UNBATCHED, dt, cases[k].xs, cases[k].H, false, &b);
                    strcat(what, ", unbatched");
                    seq_compare(&b, &a, 0, what);
                }
            }
}

Test(nn_ops, lstm_rejects_bad_shapes_dtypes_and_nulls)
{
    /* T 3, B 2, I 4, H 5 */
    tg_tensor *x = tg_zeros(TG_F64, 3, SHAPE(3, 2, 4)), *s = tg_zeros(TG_F64, 3, SHAPE(2, 2, 5));
    tg_tensor *w = tg_zeros(TG_F64, 2, SHAPE(20, 9)), *b = tg_zeros(TG_F64, 1, SHAPE(20));
    static const struct { int arg; const char *shape; } bad[] = {
        {3, "[20,8]"}, {3, "[16,9]"}, {2, "[2,3,5]"}, {2, "[3,2,5]"}, {4, "[19]"}, {1, "[0,2,4]"},
        {1, "[3]"},
    };
    tg_tensor *cases[][4] = {
        {x, s, tg_zeros(TG_F64, 2, SHAPE(20, 8)), b},
        {x, s, tg_zeros(TG_F64, 2, SHAPE(16, 9)), b},
        {x, tg_zeros(TG_F64, 3, SHAPE(2, 3, 5)), w, b},
        {x, tg_zeros(TG_F64, 3, SHAPE(3, 2, 5)), w, b},
        {x, s, w, tg_zeros(TG_F64, 1, SHAPE(19))},
        {tg_zeros(TG_F64, 3, SHAPE(0, 2, 4)), s, w, b},
        {tg_zeros(TG_F64, 1, SHAPE(3)), s, w, b},
    };
    for (int k = 0; k < 7; k++) {
        tg_error_clear();
        cr_assert_null(tg_lstm(cases[k][0], cases[k][1], cases[k][2], cases[k][3], NULL),
                       "case %d", k);
        cr_expect_eq(tg_last_error(), TG_ERR_SHAPE, "case %d: %s", k, tg_last_error_message());
        char arg[8];
        snprintf(arg, sizeof arg, "#%d", bad[k].arg);
        cr_expect(strstr(tg_last_error_message(), "'lstm'") &&
                      strstr(tg_last_error_message(), arg) &&
                      strstr(tg_last_error_message(), bad[k].shape),
                  "case %d: %s", k, tg_last_error_message());
    }
    tg_error_clear();
    cr_assert_null(tg_lstm(x, s, tg_zeros(TG_F32, 2, SHAPE(20, 9)), b, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
    cr_assert(strstr(tg_last_error_message(), "#3"), "%s", tg_last_error_message());
    tg_error_clear();
    cr_assert_null(tg_lstm(tg_zeros(TG_I64, 3, SHAPE(3, 2, 4)), s, w, b, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
    for (int i = 0; i < 4; i++) {
        tg_tensor *in[4] = {x, s, w, b};
        in[i] = NULL;
        tg_error_clear();
        cr_assert_null(tg_lstm(in[0], in[1], in[2], in[3], NULL));
        cr_assert_eq(tg_last_error(), TG_ERR_NULL);
    }
    tg_error_clear();
    /* The inputs stay usable: zeros give c = 0.5 c + 0.5 tanh(0) = 0, h = 0. */
    tg_tensor *y = tg_lstm(x, s, w, b, NULL);
    cr_assert_not_null(y, "%s", tg_last_error_message());
    tu_expect_shape(y, 4, SHAPE(2, 3, 2, 5));
    double *v = tu_values(y);
    for (int e = 0; e < 60; e++) cr_expect_eq(v[e], 0.0);
    free(v);
}

Test(nn_ops, lstm_layer_rejects_bad_arguments_and_stays_usable)
{
    tg_rng rng;
    tg_rng_seed(&rng, 5);
    tg_params *ps = tg_params_new();
    tg_lstm_layer *l = tg_lstm_layer_new(ps, "seq", 4, 3, TG_F32, &rng);
    cr_assert_not_null(l, "%s", tg_last_error_message());
    cr_assert_eq(tg_params_count(ps), 4);
    cr_assert_null(tg_lstm_layer_new(ps, "bad", 0, 3, TG_F32, &rng));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tg_tensor *x = tg_rand_uniform(&rng, TG_F32, 3, SHAPE(6, 2, 4), -1, 1);
    tg_tensor *out = NULL, *hn = NULL, *cn = NULL;
    cr_assert_eq(tg_lstm_layer_forward(NULL, x, NULL, NULL, &out, NULL, NULL), TG_ERR_NULL);
    cr_assert_eq(tg_lstm_layer_set_opts(NULL, NULL), TG_ERR_NULL);
    cr_assert_eq(tg_lstm_layer_set_opts(l, NULL), TG_OK);
    cr_assert_eq(tg_lstm_layer_forward(l, NULL, NULL, NULL, &out, NULL, NULL), TG_ERR_NULL);
    cr_assert_eq(tg_lstm_layer_forward(l, x, NULL, NULL, NULL, NULL, NULL), TG_ERR_NULL);
    cr_assert_eq(tg_lstm_layer_forward(l, tg_zeros(TG_F32, 1, SHAPE(4)), NULL, NULL, &out, NULL,
                                       NULL),
                 TG_ERR_SHAPE);
    tg_tensor *h_bad = tg_zeros(TG_F32, 2, SHAPE(2, 4));
    cr_assert_eq(tg_lstm_layer_forward(l, x, h_bad, NULL, &out, &hn, &cn), TG_ERR_SHAPE);
    cr_assert(strstr(tg_last_error_message(), "h0") && strstr(tg_last_error_message(), "[2,4]"),
              "%s", tg_last_error_message());
    cr_assert(!out && !hn && !cn);
    cr_assert_eq(tg_lstm_layer_forward(l, x, NULL, tg_zeros(TG_F32, 1, SHAPE(3)), &out, NULL,
                                       NULL),
                 TG_ERR_SHAPE);
    cr_assert(strstr(tg_last_error_message(), "c0"), "%s", tg_last_error_message());
    cr_assert_eq(tg_lstm_layer_forward(l, tg_zeros(TG_F64, 3, SHAPE(6, 2, 4)), NULL, NULL, &out,
                                       NULL, NULL),
                 TG_ERR_DTYPE);
    cr_assert_null(out);
    /* Then a good call, asking for the final state only. */
    tg_error_clear();
    cr_assert_eq(tg_lstm_layer_forward(l, x, NULL, NULL, NULL, &hn, &cn), TG_OK, "%s",
                 tg_last_error_message());
    tu_expect_shape(hn, 2, SHAPE(2, 3));
    tu_expect_shape(cn, 2, SHAPE(2, 3));
    cr_assert_eq(tg_lstm_layer_forward(l, x, hn, cn, &out, NULL, NULL), TG_OK);
    tu_expect_shape(out, 3, SHAPE(6, 2, 3));
    tg_lstm_layer_free(l);
    tg_params_free(ps);
}

/* With remake_gates the node keeps no gate rows: the tape's saved bytes
 * drop by exactly T*B*4H values, and the step gives the same loss. */
Test(nn_ops, lstm_remaking_the_gates_keeps_no_gate_rows)
{
    const int64_t T = 6, B = 4, I = 3, H = 5;
    size_t saved[2];
    double loss[2];
    for (int remake = 0; remake < 2; remake++) {
        tg_rng rng;
        tg_rng_seed(&rng, 9);
        tg_tensor *in[4] = {tg_rand_uniform(&rng, TG_F64, 3, SHAPE(T, B, I), -1, 1),
                            tg_rand_uniform(&rng, TG_F64, 3, SHAPE(2, B, H), -1, 1),
                            tg_rand_uniform(&rng, TG_F64, 2, SHAPE(4 * H, I + H), -1, 1),
                            tg_rand_uniform(&rng, TG_F64, 1, SHAPE(4 * H), -1, 1)};
        tg_tape *tape = tg_tape_new(NULL);
        for (int i = 0; i < 4; i++) cr_assert_eq(tg_requires_grad(tape, in[i]), TG_OK);
        tg_lstm_opts o = {.remake_gates = remake};
        tg_tensor *y = tg_lstm(in[0], in[1], in[2], in[3], &o);
        cr_assert_not_null(y, "%s", tg_last_error_message());
        saved[remake] = tg_tape_saved_peak_bytes(tape);
        tg_tensor *l = tg_sum(tg_mul(y, y));
        cr_assert_eq(tg_tensor_item(l, &loss[remake]), TG_OK);
        cr_assert_eq(tg_backward(l), TG_OK, "%s", tg_last_error_message());
        tg_tape_free(tape);
    }
    cr_expect_eq(saved[0] - saved[1], (size_t)(T * B * 4 * H) * sizeof(double),
                 "saved %zu kept, %zu remade", saved[0], saved[1]);
    cr_expect_eq(loss[0], loss[1]);
}
