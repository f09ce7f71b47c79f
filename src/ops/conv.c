/* 2-d convolution (NCHW cross-correlation, as in PyTorch) by im2col + GEMM
 * through the kernel table, so the cpu backend runs OpenBLAS.
 *
 * Three ops, one attrs layout:
 *   ints[0..5] = stride h, stride w, padding h, padding w, dilation h,
 *                dilation w
 *   ints[6..7] = backward ops only: the spatial size of what they produce,
 *                which their inputs do not determine (conv2d_backward_input:
 *                H, W of x; conv2d_backward_weight: KH, KW of w)
 *   target     = groups (0 means 1)
 * conv2d(x, w, bias): the bias is input #3, always present (tg_conv2d
 * passes zeros for a NULL bias), added by pre-filling y and running the
 * GEMM with beta = 1. Backward: dx = col2im(W^T dY) and dW = dY col^T,
 * each its own fused op, with col recomputed from the saved x rather than
 * kept; db = sum of dY over (N, OH, OW) by the fused op bias_grad (shared
 * with batch_norm). A 1x1 kernel with stride 1 and no padding skips im2col:
 * x itself is the column matrix.
 *
 * The three fused backward ops have backwards of their own, written with
 * these same ops, so conv2d is differentiable to any order: both
 * conv2d_backward_* are bilinear (the transposes of the conv as a map of x
 * and of w), and each one's adjoint in one argument is conv2d, in the
 * other the other backward op; bias_grad is linear, its adjoint an
 * expand. */
#include <string.h>

#include "ops/helpers.h"

/* Each op's backward calls the others. */
extern const tg_op tg__op_conv2d, tg__op_conv2d_backward_input, tg__op_conv2d_backward_weight,
    tg__op_bias_grad, tg__op_relu_backward;

typedef struct conv_p {
    int64_t sh, sw, ph, pw, dh, dw, G;
} conv_p;

static conv_p params_of(const tg_op_attrs *a)
{
    conv_p p = {a->ints[0], a->ints[1], a->ints[2], a->ints[3], a->ints[4], a->ints[5],
                a->target ? a->target : 1};
    return p;
}

static tg_status check_params(const tg_op *op, const conv_p *p)
{
    if (p->sh >= 1 && p->sw >= 1 && p->dh >= 1 && p->dw >= 1 && p->ph >= 0 && p->pw >= 0 &&
        p->G >= 1)
        return TG_OK;
    return tg__err(TG_ERR_INVALID, "bad argument #4 to '%s' (stride %lldx%lld, padding %lldx%lld, "
                                   "dilation %lldx%lld, groups %lld: need stride, dilation and "
                                   "groups >= 1, padding >= 0)", op->name, (long long)p->sh,
                   (long long)p->sw, (long long)p->ph, (long long)p->pw, (long long)p->dh,
                   (long long)p->dw, (long long)p->G);
}

/* Outputs along one dim; 0 when the dilated kernel does not fit. */
static int64_t out_extent(int64_t in, int64_t k, int64_t s, int64_t pad, int64_t d)
{
    int64_t span = in + 2 * pad - d * (k - 1) - 1;
    return (span < 0 || k < 1) ? 0 : span / s + 1;
}

static tg_conv2d_geom geom_of(int64_t Cg, int64_t H, int64_t W, int64_t KH, int64_t KW,
                              const conv_p *p)
{
    tg_conv2d_geom g = {
        .C = Cg, .H = H, .W = W, .KH = KH, .KW = KW,
        .OH = out_extent(H, KH, p->sh, p->ph, p->dh), .OW = out_extent(W, KW, p->sw, p->pw, p->dw),
        .sh = p->sh, .sw = p->sw, .ph = p->ph, .pw = p->pw, .dh = p->dh, .dw = p->dw,
    };
    return g;
}

/* The column matrix of a 1x1, stride-1, unpadded conv is x itself. */
static bool is_direct(const tg_conv2d_geom *g)
{
    return g->KH == 1 && g->KW == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

static tg_status need_4d(const tg_op *op, int argi, const tg_tensor *t, const char *what)
{
    char s[96];
    if (t->ndim == 4) return TG_OK;
    return tg__err(TG_ERR_SHAPE, "bad argument #%d to '%s' (%s %s; need 4 dims)", argi, op->name,
                   what, tg_shape_str(t->ndim, t->shape, s, sizeof s));
}

static tg_status need_dtype_of(const tg_op *op, int argi, const tg_tensor *t, const tg_tensor *x)
{
    if (t->dtype == x->dtype) return TG_OK;
    return tg__err(TG_ERR_DTYPE, "bad argument #%d to '%s' (%s, but argument #1 is %s; convert "
                                 "with tg_cast)", argi, op->name, tg_dtype_name(t->dtype),
                   tg_dtype_name(x->dtype));
}

/* Column scratch (K, L) in x's dtype, or NULL for a direct conv. */
static tg_tensor *col_scratch(const tg_conv2d_geom *g, const tg_tensor *like, bool *failed)
{
    *failed = false;
    if (is_direct(g)) return NULL;
    int64_t s[2] = {g->C * g->KH * g->KW, g->OH * g->OW};
    tg_tensor *c = tg__tensor_empty(like->dtype, 2, s, like->backend);
    *failed = c == NULL;
    return c;
}

static double value_at(const tg_tensor *t, int64_t i)
{
    const void *p = tg__tensor_ptr(t);
    return t->dtype == TG_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

/* ---- conv2d(x, w, bias) */
static tg_status conv_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                            tg_spec *out)
{
    const tg_tensor *x = in[0], *w = in[1], *b = in[2];
    char s1[96], s2[96];
    conv_p p = params_of(a);
    if (tg__need_float(op, 1, x) || need_dtype_of(op, 2, w, x) || need_dtype_of(op, 3, b, x))
        return TG_ERR_DTYPE;
    if (need_4d(op, 1, x, "input") || need_4d(op, 2, w, "weight")) return TG_ERR_SHAPE;
    if (check_params(op, &p)) return TG_ERR_INVALID;
    int64_t C = x->shape[1], O = w->shape[0];
    if (C % p.G || O % p.G)
        return tg__err(TG_ERR_SHAPE, "bad argument #4 to '%s' (groups %lld must divide the %lld "
                                     "input and %lld output channels)", op->name, (long long)p.G,
                       (long long)C, (long long)O);
    if (w->shape[1] * p.G != C)
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (weight %s with groups %lld takes "
                                     "%lld input channels, but input %s has %lld)", op->name,
                       tg_shape_str(w->ndim, w->shape, s1, sizeof s1), (long long)p.G,
                       (long long)(w->shape[1] * p.G),
                       tg_shape_str(x->ndim, x->shape, s2, sizeof s2), (long long)C);
    if (b->ndim != 1 || b->shape[0] != O)
        return tg__err(TG_ERR_SHAPE, "bad argument #3 to '%s' (bias %s; weight %s needs (%lld))",
                       op->name, tg_shape_str(b->ndim, b->shape, s1, sizeof s1),
                       tg_shape_str(w->ndim, w->shape, s2, sizeof s2), (long long)O);
    tg_conv2d_geom g = geom_of(C / p.G, x->shape[2], x->shape[3], w->shape[2], w->shape[3], &p);
    if (g.OH < 1 || g.OW < 1)
        return tg__err(TG_ERR_SHAPE, "bad argument #1 to '%s' (input %s padded by %lldx%lld is "
                                     "smaller than the kernel %lldx%lld dilated by %lldx%lld)",
                       op->name, tg_shape_str(x->ndim, x->shape, s1, sizeof s1), (long long)p.ph,
                       (long long)p.pw, (long long)g.KH, (long long)g.KW, (long long)p.dh,
                       (long long)p.dw);
    out->dtype = x->dtype;
    out->ndim = 4;
    out->shape[0] = x->shape[0];
    out->shape[1] = O;
    out->shape[2] = g.OH;
    out->shape[3] = g.OW;
    return TG_OK;
}

/* y = b + W * x; relu: then y = max(0, y), image by image while the
 * image's output is in cache (the relu kernel's values: the same bits as
 * a relu after the conv). A short reduction (K <= TG_CONV_SHORT_K) takes
 * the conv_short kernels, which add the bias and rectify in registers;
 * a longer one a bias fill and a GEMM. */
static tg_tensor *conv_forward(tg_op_ctx *ctx, tg_tensor *const *in, bool relu)
{
    const tg_tensor *x = in[0], *w = in[1], *b = in[2];
    conv_p p = params_of(ctx->attrs);
    int64_t N = x->shape[0], C = x->shape[1], O = w->shape[0], Cg = C / p.G, Og = O / p.G;
    tg_conv2d_geom g = geom_of(Cg, x->shape[2], x->shape[3], w->shape[2], w->shape[3], &p);
    int64_t K = Cg * g.KH * g.KW, L = g.OH * g.OW, HW = g.H * g.W;
    size_t es = tg_dtype_size(x->dtype);
    bool failed, short_k = K > 0 && K <= TG_CONV_SHORT_K;
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    tg_tensor *col = y ? col_scratch(&g, x, &failed) : NULL;
    if (!y || failed) {
        tg_tensor_release(y);
        return NULL;
    }
    tg_im2col_fn im2col = TG_KERNEL(tg_im2col_fn, TG_K_IM2COL, x);
    tg_gemm_fn gemm = TG_KERNEL(tg_gemm_fn, TG_K_GEMM, x);
    tg_conv_short_fwd_fn fwd_short = TG_KERNEL(tg_conv_short_fwd_fn, TG_K_CONV_SHORT_FWD, x);
    char *xp = tg__tensor_ptr(x), *wp = tg__tensor_ptr(w), *yp = tg__tensor_ptr(y);
    char *bp = tg__tensor_ptr(b), *cp = col ? tg__tensor_ptr(col) : NULL;
    if (!short_k) {
        tg_fill_fn fill = TG_KERNEL(tg_fill_fn, TG_K_FILL, y);
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < O; o++)
                fill(L, yp + (size_t)((n * O + o) * L) * es, value_at(b, o));
    }
    tg_unary_fn rectify = relu && !short_k ? TG_KERNEL(tg_unary_fn, TG_K_RELU, y) : NULL;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t gi = 0; gi < p.G && K > 0; gi++) {
            char *src = xp + (size_t)((n * C + gi * Cg) * HW) * es;
            char *wg = wp + (size_t)(gi * Og * K) * es;
            char *yg = yp + (size_t)((n * O + gi * Og) * L) * es;
            if (cp) im2col(&g, src, cp);
            if (short_k)
                fwd_short(Og, K, L, wg, cp ? cp : src, bp + (size_t)(gi * Og) * es, relu, yg);
            else
                gemm(false, false, Og, L, K, wg, K, cp ? cp : src, L, 1.0, yg, L);
        }
        if (rectify) {
            char *yn = yp + (size_t)(n * O * L) * es;
            rectify(O * L, yn, yn, 0.0);
        }
    }
    tg_tensor_release(col);
    return y;
}

static tg_tensor *conv_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    return conv_forward(ctx, in, false);
}

/* ---- conv2d_backward_input(w, gy) -> gx (N, C, H, W); ints[6..7] = H, W. */
static tg_status bwd_input_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                                 tg_spec *out)
{
    const tg_tensor *w = in[0], *gy = in[1];
    conv_p p = params_of(a);
    if (tg__need_float(op, 1, w) || tg__need_same_dtype(op, w, gy)) return TG_ERR_DTYPE;
    if (need_4d(op, 1, w, "weight") || need_4d(op, 2, gy, "gradient")) return TG_ERR_SHAPE;
    if (check_params(op, &p)) return TG_ERR_INVALID;
    tg_conv2d_geom g = geom_of(w->shape[1], a->ints[6], a->ints[7], w->shape[2], w->shape[3], &p);
    if (gy->shape[1] != w->shape[0] || w->shape[0] % p.G || g.OH != gy->shape[2] ||
        g.OW != gy->shape[3] || g.OH < 1 || g.OW < 1)
        return tg__err(TG_ERR_SHAPE, "bad arguments to '%s' (gradient does not match the weight "
                                     "and the %lldx%lld input)", op->name, (long long)a->ints[6],
                       (long long)a->ints[7]);
    out->dtype = w->dtype;
    out->ndim = 4;
    out->shape[0] = gy->shape[0];
    out->shape[1] = w->shape[1] * p.G;
    out->shape[2] = a->ints[6];
    out->shape[3] = a->ints[7];
    return TG_OK;
}

/* gx = col2im(W^T gy), image by image. A short reduction over the output
 * channels (Og <= TG_CONV_SHORT_K) takes the conv_short forward kernel on
 * W_g^T (a transposed copy, K x Og a group, no bias); else a GEMM. */
static tg_tensor *bwd_input_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *w = in[0], *gy = in[1];
    conv_p p = params_of(ctx->attrs);
    const tg_spec *os = ctx->out_spec;
    int64_t N = os->shape[0], C = os->shape[1], O = w->shape[0], Cg = C / p.G, Og = O / p.G;
    tg_conv2d_geom g = geom_of(Cg, os->shape[2], os->shape[3], w->shape[2], w->shape[3], &p);
    int64_t K = Cg * g.KH * g.KW, L = g.OH * g.OW, HW = g.H * g.W;
    size_t es = tg_dtype_size(w->dtype);
    bool failed, short_o = Og > 0 && Og <= TG_CONV_SHORT_K && K > 0;
    tg_tensor *gx = tg_op_ctx_new_output(ctx);
    tg_tensor *dcol = gx ? col_scratch(&g, w, &failed) : NULL;
    int64_t ts[2] = {p.G * K, Og};
    tg_tensor *wt = gx && !failed && short_o ? tg__tensor_empty(w->dtype, 2, ts, w->backend) : NULL;
    if (!gx || failed || (short_o && !wt)) {
        tg_tensor_release(dcol);
        tg_tensor_release(gx);
        return NULL;
    }
    TG_KERNEL(tg_fill_fn, TG_K_FILL, gx)(gx->numel, tg__tensor_ptr(gx), 0.0);
    tg_col2im_fn col2im = TG_KERNEL(tg_col2im_fn, TG_K_COL2IM, w);
    tg_gemm_fn gemm = TG_KERNEL(tg_gemm_fn, TG_K_GEMM, w);
    tg_conv_short_fwd_fn fwd_short = TG_KERNEL(tg_conv_short_fwd_fn, TG_K_CONV_SHORT_FWD, w);
    char *wp = tg__tensor_ptr(w), *gp = tg__tensor_ptr(gy), *xp = tg__tensor_ptr(gx);
    char *cp = dcol ? tg__tensor_ptr(dcol) : NULL, *tp = wt ? tg__tensor_ptr(wt) : NULL;
    if (tp) { /* W (G, Og, K) -> W^T (G, K, Og), one group after another */
        int64_t ts3[3] = {p.G, K, Og}, st3[3] = {Og * K, 1, K};
        TG_KERNEL(tg_copy_strided_fn, TG_K_COPY_STRIDED, w)(3, ts3, st3, wp, tp, es);
    }
    for (int64_t n = 0; n < N && Og > 0 && K > 0; n++)
        for (int64_t gi = 0; gi < p.G; gi++) {
            char *dst = xp + (size_t)((n * C + gi * Cg) * HW) * es;
            char *gyg = gp + (size_t)((n * O + gi * Og) * L) * es;
            /* dcol (K, L) = W_g^T (K, Og) . dY_ng (Og, L) */
            if (tp)
                fwd_short(K, Og, L, tp + (size_t)(gi * K * Og) * es, gyg, NULL, false,
                          cp ? cp : dst);
            else
                gemm(true, false, K, L, Og, wp + (size_t)(gi * Og * K) * es, K, gyg, L, 0.0,
                     cp ? cp : dst, L);
            if (cp) col2im(&g, cp, dst);
        }
    tg_tensor_release(wt);
    tg_tensor_release(dcol);
    return gx;
}

/* ---- conv2d_backward_weight(x, gy) -> gw (O, C/G, KH, KW); ints[6..7] = KH, KW. */
static tg_status bwd_weight_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                                  tg_spec *out)
{
    const tg_tensor *x = in[0], *gy = in[1];
    conv_p p = params_of(a);
    if (tg__need_float(op, 1, x) || tg__need_same_dtype(op, x, gy)) return TG_ERR_DTYPE;
    if (need_4d(op, 1, x, "input") || need_4d(op, 2, gy, "gradient")) return TG_ERR_SHAPE;
    if (check_params(op, &p)) return TG_ERR_INVALID;
    tg_conv2d_geom g = geom_of(x->shape[1], x->shape[2], x->shape[3], a->ints[6], a->ints[7], &p);
    if (gy->shape[0] != x->shape[0] || x->shape[1] % p.G || gy->shape[1] % p.G ||
        g.OH != gy->shape[2] || g.OW != gy->shape[3] || g.OH < 1 || g.OW < 1)
        return tg__err(TG_ERR_SHAPE, "bad arguments to '%s' (gradient does not match the input "
                                     "and the %lldx%lld kernel)", op->name, (long long)a->ints[6],
                       (long long)a->ints[7]);
    out->dtype = x->dtype;
    out->ndim = 4;
    out->shape[0] = gy->shape[1];
    out->shape[1] = x->shape[1] / p.G;
    out->shape[2] = a->ints[6];
    out->shape[3] = a->ints[7];
    return TG_OK;
}

/* dW (O, C/G, KH, KW) into gw from x and the output gradient gy, image by
 * image: dW_g += gy_ng col(x_ng)^T, beta 0 for the first image (zeros for
 * none), by the conv_short kernel for a short reduction (K <=
 * TG_CONV_SHORT_K), else a GEMM. relu_y non-NULL (conv2d_relu's first
 * order): image n's gy is made just before its products, from the incoming
 * gradient g as relu_backward would, gy_n = g_n where relu_y_n > 0, else 0
 * (gy may be g itself), so that they read it from cache. false (the error
 * recorded) when the column scratch cannot be had. */
static bool weight_grad(const tg_tensor *x, const conv_p *p, int64_t KH, int64_t KW, int64_t O,
                        const tg_tensor *relu_y, const tg_tensor *g, const tg_tensor *gy,
                        tg_tensor *gw)
{
    int64_t N = x->shape[0], C = x->shape[1], Cg = C / p->G, Og = O / p->G;
    tg_conv2d_geom geo = geom_of(Cg, x->shape[2], x->shape[3], KH, KW, p);
    int64_t K = Cg * geo.KH * geo.KW, L = geo.OH * geo.OW, HW = geo.H * geo.W;
    size_t es = tg_dtype_size(x->dtype);
    bool failed;
    tg_tensor *col = col_scratch(&geo, x, &failed);
    if (failed) return false;
    if (N == 0) TG_KERNEL(tg_fill_fn, TG_K_FILL, gw)(gw->numel, tg__tensor_ptr(gw), 0.0);
    tg_grad_fn mask = relu_y ? TG_KERNEL(tg_grad_fn, TG_K_RELU_GRAD, relu_y) : NULL;
    tg_im2col_fn im2col = TG_KERNEL(tg_im2col_fn, TG_K_IM2COL, x);
    tg_gemm_fn gemm = TG_KERNEL(tg_gemm_fn, TG_K_GEMM, x);
    tg_conv_short_wgrad_fn wgrad_short =
        K <= TG_CONV_SHORT_K ? TG_KERNEL(tg_conv_short_wgrad_fn, TG_K_CONV_SHORT_WGRAD, x) : NULL;
    char *xp = tg__tensor_ptr(x), *gp = tg__tensor_ptr(gy), *wp = tg__tensor_ptr(gw);
    char *cp = col ? tg__tensor_ptr(col) : NULL;
    for (int64_t n = 0; n < N; n++) {
        if (mask) {
            size_t at = (size_t)(n * O * L) * es;
            mask(O * L, (char *)tg__tensor_ptr(relu_y) + at, (char *)tg__tensor_ptr(g) + at,
                 gp + at, 0.0);
        }
        for (int64_t gi = 0; gi < p->G && Og > 0 && K > 0; gi++) {
            char *src = xp + (size_t)((n * C + gi * Cg) * HW) * es;
            if (cp) im2col(&geo, src, cp);
            /* dW_g (Og, K) += dY_ng (Og, L) . col^T (L, K) */
            char *gyg = gp + (size_t)((n * O + gi * Og) * L) * es;
            char *wg = wp + (size_t)(gi * Og * K) * es;
            if (wgrad_short)
                wgrad_short(Og, K, L, gyg, cp ? cp : src, n != 0, wg);
            else
                gemm(false, true, Og, K, L, gyg, L, cp ? cp : src, L, n ? 1.0 : 0.0, wg, K);
        }
    }
    tg_tensor_release(col);
    return true;
}

static tg_tensor *bwd_weight_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *x = in[0], *gy = in[1];
    conv_p p = params_of(ctx->attrs);
    tg_tensor *gw = tg_op_ctx_new_output(ctx);
    if (gw && !weight_grad(x, &p, ctx->attrs->ints[6], ctx->attrs->ints[7], gy->shape[1], NULL,
                           NULL, gy, gw)) {
        tg_tensor_release(gw);
        return NULL;
    }
    return gw;
}

/* ---- bias_grad(gy) -> (C): the sum over every dim but 1 of gy (N, C, *),
 * one pass, for the bias gradients of conv2d and batch_norm. */
static tg_status bias_grad_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                                 tg_spec *out)
{
    char s[96];
    (void)a;
    if (tg__need_float(op, 1, in[0])) return TG_ERR_DTYPE;
    if (in[0]->ndim < 2)
        return tg__err(TG_ERR_SHAPE, "bad argument #1 to '%s' (gradient %s; need (N, C, ...))",
                       op->name, tg_shape_str(in[0]->ndim, in[0]->shape, s, sizeof s));
    out->dtype = in[0]->dtype;
    out->ndim = 1;
    out->shape[0] = in[0]->shape[1];
    return TG_OK;
}

static tg_tensor *bias_grad_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *g = in[0];
    tg_tensor *gb = tg_op_ctx_new_output(ctx);
    if (!gb) return NULL;
    TG_KERNEL(tg_channel_sum_fn, TG_K_CHANNEL_SUM, g)(g->shape[0], g->shape[1],
                                                      tg__numel(g->ndim - 2, g->shape + 2),
                                                      tg__tensor_ptr(g), tg__tensor_ptr(gb));
    return gb;
}

/* conv2d's input gradients for the output gradient g (conv2d_relu's: the
 * gradient after the relu's mask), but the weight's where w_made (the
 * caller made it). */
static tg_status conv_grads(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin, bool w_made)
{
    const tg_spec *xs = tg_op_ctx_input_spec(ctx, 0), *ws = tg_op_ctx_input_spec(ctx, 1);
    tg_op_attrs a = *ctx->attrs;
    a.nints = 8;
    if (tg_op_ctx_needs_grad(ctx, 0)) {
        a.ints[6] = xs->shape[2];
        a.ints[7] = xs->shape[3];
        gin[0] = tg__call2(&tg__op_conv2d_backward_input, tg_op_ctx_input(ctx, 1), g, &a);
        if (!gin[0]) return tg_last_error();
    }
    if (!w_made && tg_op_ctx_needs_grad(ctx, 1)) {
        a.ints[6] = ws->shape[2];
        a.ints[7] = ws->shape[3];
        tg_tensor *in[2] = {tg_op_ctx_input(ctx, 0), g};
        gin[1] = tg__call_into(&tg__op_conv2d_backward_weight, 2, in, &a,
                               tg__op_ctx_take_sink(ctx, 1));
        if (!gin[1]) return tg_last_error();
    }
    if (tg_op_ctx_needs_grad(ctx, 2)) {
        gin[2] = tg__call_into(&tg__op_bias_grad, 1, &g, NULL, tg__op_ctx_take_sink(ctx, 2));
        if (!gin[2]) return tg_last_error();
    }
    return TG_OK;
}

static tg_status conv_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    return conv_grads(ctx, g, gin, false);
}

/* conv2d_relu's first order (nothing records), when the weight needs a
 * gradient: gm = relu_grad(y, g) and the weight's gradient image by image
 * (weight_grad), the same kernels and GEMM calls, in the same order, as
 * relu_backward then conv2d_backward_weight; gm, all of it, is left for
 * the input's and the bias's gradients. false with the error recorded. */
static bool conv_relu_wgrad(tg_op_ctx *ctx, const tg_tensor *y, const tg_tensor *g,
                            tg_tensor *gm, tg_tensor **gin)
{
    const tg_tensor *w = tg_op_ctx_input(ctx, 1);
    conv_p p = params_of(ctx->attrs);
    tg_tensor *gw = tg_op_ctx_new_grad(ctx, 1);
    if (!gw || !weight_grad(tg_op_ctx_input(ctx, 0), &p, w->shape[2], w->shape[3], w->shape[0],
                            y, g, gm, gw))
        return false;
    gin[1] = gw;
    return true;
}

/* ---- conv2d_relu(x, w, bias) = relu(conv2d(x, w, bias)), one node. The
 * forward rectifies each image's output as soon as its GEMMs have made it
 * (no second pass over the output, no pre-relu tensor); the node keeps x,
 * w and its output y. Backward: gm = relu_backward(y, gy), what a relu node
 * would give (over gy when the engine gives gy up, as relu's backward
 * does), then conv2d's backward of gm; at first order the mask and the
 * weight's GEMMs go image by image (conv_relu_wgrad). Same bits as conv2d
 * then relu, to any order: what records is made of differentiable ops. */
static tg_tensor *conv_relu_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    return conv_forward(ctx, in, true);
}

static tg_status conv_relu_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    tg_tensor *y = tg_op_ctx_output(ctx), *gm;
    if (y && g && !tg__records(y) && !tg__records(g) && y->contiguous && g->contiguous &&
        y->dtype == g->dtype && y->backend == g->backend &&
        tg__same_shape(y->ndim, y->shape, g->ndim, g->shape)) {
        /* relu's backward without dispatch, as map_bwd runs it: over g when
         * the engine gives g up (each element of gm reads its own element
         * of g before writing it). */
        gm = ctx->gout_scratch ? tg_tensor_retain(g)
                               : tg__tensor_empty(y->dtype, y->ndim, y->shape, y->backend);
        if (!gm) return tg_last_error();
        gm = tg__scope_track(gm);
        if (tg_op_ctx_needs_grad(ctx, 1)) {
            if (!conv_relu_wgrad(ctx, y, g, gm, gin)) return tg_last_error();
            return conv_grads(ctx, gm, gin, true);
        }
        tg__run_grad(TG_KERNEL(tg_grad_fn, TG_K_RELU_GRAD, y), y->numel, tg__tensor_ptr(y),
                     tg__tensor_ptr(g), tg__tensor_ptr(gm), 0.0, tg__esize(y->dtype));
    } else {
        gm = tg__call2(&tg__op_relu_backward, y, g, NULL);
        if (!gm) return tg_last_error();
    }
    return conv_bwd(ctx, gm, gin);
}

/* Cases: plain 3x3; stride 2 / padding 1 / dilation 2 (unequal per dim);
 * groups 2 with padding; the direct 1x1 path; a strided 1x1 (im2col); a
 * reduction of K = 36 (> TG_CONV_SHORT_K: the forward and the weight
 * gradient through BLAS) and one of 33 output channels (the input gradient
 * through BLAS); the others take the conv_short kernels.
 * The fused backward ops take the same geometries. */
static const struct conv_case {
    int64_t x[4], w[4];
    int64_t ints[6];
    int groups;
} conv_cases[] = {
    {{2, 2, 5, 5}, {3, 2, 3, 3}, {1, 1, 0, 0, 1, 1}, 1},
    {{1, 2, 7, 6}, {2, 2, 3, 2}, {2, 1, 1, 2, 2, 1}, 1},
    {{1, 1, 7, 7}, {2, 1, 3, 3}, {2, 2, 1, 1, 2, 2}, 1},
    {{1, 4, 4, 4}, {4, 2, 2, 2}, {1, 1, 1, 1, 1, 1}, 2},
    {{2, 3, 3, 3}, {2, 3, 1, 1}, {1, 1, 0, 0, 1, 1}, 1},
    {{1, 2, 5, 4}, {3, 2, 1, 1}, {2, 2, 1, 0, 1, 1}, 1},
    {{1, 4, 4, 4}, {2, 4, 3, 3}, {1, 1, 1, 1, 1, 1}, 1},
    {{1, 1, 4, 4}, {33, 1, 2, 2}, {1, 1, 0, 0, 1, 1}, 1},
};
#define NCONV ((int)(sizeof conv_cases / sizeof conv_cases[0]))

/* Case k's attrs (6 ints and groups); NULL past the last case. */
static const struct conv_case *conv_case_attrs(int k, tg_op_attrs *a)
{
    if (k >= NCONV) return NULL;
    a->nints = 6;
    memcpy(a->ints, conv_cases[k].ints, sizeof conv_cases[k].ints);
    a->target = conv_cases[k].groups;
    return &conv_cases[k];
}

static int conv_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    const struct conv_case *c = conv_case_attrs(k, a);
    if (!c) return 0;
    in[0] = tg__sample_uniform(rng, 4, c->x, -1.0, 1.0);
    in[1] = tg__sample_uniform(rng, 4, c->w, -1.0, 1.0);
    in[2] = tg__sample_uniform(rng, 1, &c->w[0], -1.0, 1.0);
    return (in[0] && in[1] && in[2]) ? 3 : -1;
}

/* A random gy for case c: (N, O, OH, OW). */
static tg_tensor *sample_gy(tg_rng *rng, const struct conv_case *c, const tg_op_attrs *a)
{
    conv_p p = params_of(a);
    tg_conv2d_geom g = geom_of(c->x[1] / p.G, c->x[2], c->x[3], c->w[2], c->w[3], &p);
    return tg__sample_uniform(rng, 4, TG_SHAPE(c->x[0], c->w[0], g.OH, g.OW), -1.0, 1.0);
}

static int bwd_input_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    const struct conv_case *c = conv_case_attrs(k, a);
    if (!c) return 0;
    a->nints = 8;
    a->ints[6] = c->x[2];
    a->ints[7] = c->x[3];
    in[0] = tg__sample_uniform(rng, 4, c->w, -1.0, 1.0);
    in[1] = sample_gy(rng, c, a);
    return (in[0] && in[1]) ? 2 : -1;
}

static int bwd_weight_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    const struct conv_case *c = conv_case_attrs(k, a);
    if (!c) return 0;
    a->nints = 8;
    a->ints[6] = c->w[2];
    a->ints[7] = c->w[3];
    in[0] = tg__sample_uniform(rng, 4, c->x, -1.0, 1.0);
    in[1] = sample_gy(rng, c, a);
    return (in[0] && in[1]) ? 2 : -1;
}

/* Cases: (N, C), (N, C, L), (N, C, H, W). */
static int bias_grad_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const struct { int n; int64_t s[4]; } c[] = {
        {2, {4, 3}}, {3, {2, 3, 5}}, {4, {2, 3, 2, 4}},
    };
    (void)a;
    if (k >= 3) return 0;
    in[0] = tg__sample_uniform(rng, c[k].n, c[k].s, -1.0, 1.0);
    return in[0] ? 1 : -1;
}

/* ---- backwards of the fused backward ops */

/* conv2d(x, w) with zero bias and a's geometry (its ints[6..7] dropped). */
static tg_tensor *conv_nobias(tg_tensor *x, tg_tensor *w, const tg_op_attrs *a)
{
    tg_op_attrs f = *a;
    f.nints = 6;
    f.ints[6] = f.ints[7] = 0;
    tg_spec bs = {.dtype = w->dtype, .ndim = 1, .shape = {w->shape[0]}};
    tg_tensor *in[3] = {x, w, tg__full(&bs, w->backend, 0.0)};
    return in[2] ? tg_op_call(&tg__op_conv2d, 3, in, &f) : NULL;
}

/* a with ints[6..7] = the spatial size (dims 2, 3) of s. */
static tg_op_attrs with_extent(const tg_op_attrs *a, const tg_spec *s)
{
    tg_op_attrs b = *a;
    b.nints = 8;
    b.ints[6] = s->shape[2];
    b.ints[7] = s->shape[3];
    return b;
}

/* gx = C_w^T gy, bilinear in (w, gy); for a cotangent u of gx's shape,
 * <u, C_w^T gy> = <C_w u, gy> gives d/dgy = conv2d(u, w) and d/dw =
 * conv2d_backward_weight(u, gy). */
static tg_status bwd_input_bwd(tg_op_ctx *ctx, tg_tensor *gg, tg_tensor **gin)
{
    tg_tensor *w = tg_op_ctx_input(ctx, 0), *gy = tg_op_ctx_input(ctx, 1);
    if (tg_op_ctx_needs_grad(ctx, 1)) {
        gin[1] = conv_nobias(gg, w, ctx->attrs);
        if (!gin[1]) return tg_last_error();
    }
    if (tg_op_ctx_needs_grad(ctx, 0)) {
        tg_op_attrs a = with_extent(ctx->attrs, tg_op_ctx_input_spec(ctx, 0));
        gin[0] = tg__call2(&tg__op_conv2d_backward_weight, gg, gy, &a);
        if (!gin[0]) return tg_last_error();
    }
    return TG_OK;
}

const tg_op tg__op_conv2d_backward_input = {
    .name = "conv2d_backward_input", .doc = "gx = col2im(W^T gy)", .arity = 2,
    .shape = bwd_input_shape, .forward = bwd_input_fwd, .backward = bwd_input_bwd,
    .cost = TG_COST_COMPUTE_BOUND, .saves = TG_SAVE_INPUT(0) | TG_SAVE_INPUT(1),
    .sample = bwd_input_sample,
};

/* gw = C_x^T gy, bilinear in (x, gy); for a cotangent V of gw's shape,
 * d/dgy = conv2d(x, V) and d/dx = conv2d_backward_input(V, gy). */
static tg_status bwd_weight_bwd(tg_op_ctx *ctx, tg_tensor *gg, tg_tensor **gin)
{
    tg_tensor *x = tg_op_ctx_input(ctx, 0), *gy = tg_op_ctx_input(ctx, 1);
    if (tg_op_ctx_needs_grad(ctx, 1)) {
        gin[1] = conv_nobias(x, gg, ctx->attrs);
        if (!gin[1]) return tg_last_error();
    }
    if (tg_op_ctx_needs_grad(ctx, 0)) {
        tg_op_attrs a = with_extent(ctx->attrs, tg_op_ctx_input_spec(ctx, 0));
        gin[0] = tg__call2(&tg__op_conv2d_backward_input, gg, gy, &a);
        if (!gin[0]) return tg_last_error();
    }
    return TG_OK;
}

const tg_op tg__op_conv2d_backward_weight = {
    .name = "conv2d_backward_weight", .doc = "gw = sum_n gy_n col(x_n)^T", .arity = 2,
    .shape = bwd_weight_shape, .forward = bwd_weight_fwd, .backward = bwd_weight_bwd,
    .cost = TG_COST_COMPUTE_BOUND, .saves = TG_SAVE_INPUT(0) | TG_SAVE_INPUT(1),
    .sample = bwd_weight_sample,
};

/* Linear: the adjoint of a sum over every dim but 1 is gg (C) broadcast
 * back over them. */
static tg_status bias_grad_bwd(tg_op_ctx *ctx, tg_tensor *gg, tg_tensor **gin)
{
    const tg_spec *gs = tg_op_ctx_input_spec(ctx, 0);
    int64_t ks[TG_MAX_DIMS];
    for (int d = 0; d < gs->ndim; d++) ks[d] = d == 1 ? gs->shape[1] : 1;
    gin[0] = tg_expand(tg_reshape(gg, gs->ndim, ks), gs->ndim, gs->shape);
    return gin[0] ? TG_OK : tg_last_error();
}

const tg_op tg__op_bias_grad = {
    .name = "bias_grad", .doc = "gb_c = sum of gy over every dim but 1", .arity = 1,
    .shape = bias_grad_shape, .forward = bias_grad_fwd, .backward = bias_grad_bwd,
    .cost = TG_COST_MEMORY_BOUND, .sample = bias_grad_sample,
};

const tg_op tg__op_conv2d = {
    .name = "conv2d", .doc = "y = b + W * x (2-d cross-correlation, NCHW)", .arity = 3,
    .shape = conv_shape, .forward = conv_fwd, .backward = conv_bwd,
    .cost = TG_COST_COMPUTE_BOUND, .saves = TG_SAVE_INPUT(0) | TG_SAVE_INPUT(1),
    .sample = conv_sample,
};

const tg_op tg__op_conv2d_relu = {
    .name = "conv2d_relu", .doc = "y = max(0, b + W * x) (conv2d, then relu)", .arity = 3,
    .shape = conv_shape, .forward = conv_relu_fwd, .backward = conv_relu_bwd,
    .cost = TG_COST_COMPUTE_BOUND,
    .saves = TG_SAVE_INPUT(0) | TG_SAVE_INPUT(1) | TG_SAVE_OUTPUT, .sample = conv_sample,
};

/* A 0 in stride/dilation/groups means the default 1; negatives reach the
 * shape rule and fail there. */
static tg_tensor *conv_call(const tg_op *op, tg_tensor *x, tg_tensor *w, tg_tensor *bias,
                            const tg_conv2d_opts *opts)
{
    static const tg_conv2d_opts defaults;
    const tg_conv2d_opts *o = opts ? opts : &defaults;
    if (!x || !w) {
        tg__err_null(op->name, x ? 2 : 1);
        return NULL;
    }
    tg_op_attrs a = {.nints = 6, .target = o->groups ? o->groups : 1};
    for (int i = 0; i < 2; i++) {
        a.ints[i] = o->stride[i] ? o->stride[i] : 1;
        a.ints[2 + i] = o->padding[i];
        a.ints[4 + i] = o->dilation[i] ? o->dilation[i] : 1;
    }
    tg_tensor *zeros = NULL;
    if (!bias) {
        int64_t O = w->ndim >= 1 ? w->shape[0] : 0;
        zeros = tg__filled(x->dtype, 1, &O, x->backend, 0.0);
        if (!zeros) return NULL;
        bias = zeros;
    }
    tg_tensor *in[3] = {x, w, bias};
    tg_tensor *y = tg_op_call(op, 3, in, &a);
    tg_tensor_release(zeros);
    return y;
}

tg_tensor *tg_conv2d(tg_tensor *x, tg_tensor *w, tg_tensor *bias, const tg_conv2d_opts *opts)
{
    return conv_call(&tg__op_conv2d, x, w, bias, opts);
}

tg_tensor *tg_conv2d_relu(tg_tensor *x, tg_tensor *w, tg_tensor *bias,
                          const tg_conv2d_opts *opts)
{
    return conv_call(&tg__op_conv2d_relu, x, w, bias, opts);
}
