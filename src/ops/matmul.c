/* Matrix product, 2-d and batched with broadcasting over leading dims.
 * A transposed view (strides swapped on the last two dims) is handed to the
 * GEMM kernel as a transpose flag; only other layouts are copied. */
#include <string.h>

#include "ops/helpers.h"

extern const tg_op tg__op_matmul; /* its backward calls it (below) */

static tg_status matmul_shape(const tg_op *op, const tg_op_attrs *attrs, tg_tensor *const *in,
                              tg_spec *out)
{
    (void)attrs;
    const tg_tensor *a = in[0], *b = in[1];
    char s1[96], s2[96];
    if (tg__need_float(op, 1, a) || tg__need_float(op, 2, b) || tg__need_same_dtype(op, a, b))
        return TG_ERR_DTYPE;
    if (a->ndim < 2 || b->ndim < 2)
        return tg__err(TG_ERR_SHAPE, "bad argument #%d to '%s' (needs at least 2 dims, got %s)",
                       a->ndim < 2 ? 1 : 2, op->name,
                       a->ndim < 2 ? tg_shape_str(a->ndim, a->shape, s1, sizeof s1)
                                   : tg_shape_str(b->ndim, b->shape, s1, sizeof s1));
    if (a->shape[a->ndim - 1] != b->shape[b->ndim - 2])
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (shapes %s and %s: inner dims %lld "
                                     "and %lld differ)", op->name,
                       tg_shape_str(a->ndim, a->shape, s1, sizeof s1),
                       tg_shape_str(b->ndim, b->shape, s2, sizeof s2),
                       (long long)a->shape[a->ndim - 1], (long long)b->shape[b->ndim - 2]);
    int nb = (a->ndim > b->ndim ? a->ndim : b->ndim) - 2;
    out->dtype = a->dtype;
    out->ndim = nb + 2;
    for (int i = 0; i < nb; i++) {
        int ia = a->ndim - 2 - nb + i, ib = b->ndim - 2 - nb + i;
        int64_t sa = ia >= 0 ? a->shape[ia] : 1, sb = ib >= 0 ? b->shape[ib] : 1;
        if (sa != sb && sa != 1 && sb != 1)
            return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (batch dims of %s and %s do not "
                                         "broadcast)", op->name,
                           tg_shape_str(a->ndim, a->shape, s1, sizeof s1),
                           tg_shape_str(b->ndim, b->shape, s2, sizeof s2));
        out->shape[i] = sa == 1 ? sb : sa;
    }
    out->shape[nb] = a->shape[a->ndim - 2];
    out->shape[nb + 1] = b->shape[b->ndim - 1];
    return TG_OK;
}

/* Layout of the last two dims as a GEMM operand: row-major with leading
 * dim ld, or its transpose. False when neither fits (then copy). */
static bool gemm_layout(const tg_tensor *t, bool *trans, int64_t *ld)
{
    int nd = t->ndim;
    int64_t rows = t->shape[nd - 2], cols = t->shape[nd - 1];
    int64_t sr = t->strides[nd - 2], sc = t->strides[nd - 1];
    if (sc == 1 || cols == 1) {
        *trans = false;
        *ld = rows == 1 ? (cols > 0 ? cols : 1) : sr;
        if (*ld >= cols && *ld >= 1) return true;
    }
    if (sr == 1 || rows == 1) {
        *trans = true;
        *ld = cols == 1 ? (rows > 0 ? rows : 1) : sc;
        if (*ld >= rows && *ld >= 1) return true;
    }
    return false;
}

static tg_tensor *matmul_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_tensor *a = tg_tensor_retain(in[0]), *b = tg_tensor_retain(in[1]);
    bool ta, tb;
    int64_t lda, ldb;
    tg_tensor *out = NULL;
    if (!gemm_layout(a, &ta, &lda)) {
        tg_tensor *c = tg__contiguous_raw(a);
        tg_tensor_release(a);
        a = c;
        if (!a || !gemm_layout(a, &ta, &lda)) goto done;
    }
    if (!gemm_layout(b, &tb, &ldb)) {
        tg_tensor *c = tg__contiguous_raw(b);
        tg_tensor_release(b);
        b = c;
        if (!b || !gemm_layout(b, &tb, &ldb)) goto done;
    }
    out = tg_op_ctx_new_output(ctx);
    if (!out) goto done;
    const tg_spec *os = ctx->out_spec;
    int nb = os->ndim - 2;
    int64_t m = os->shape[nb], n = os->shape[nb + 1], k = a->shape[a->ndim - 1];
    int64_t batch = tg__numel(nb, os->shape);
    size_t es = tg_dtype_size(a->dtype);
    tg_gemm_fn gemm = TG_KERNEL(tg_gemm_fn, TG_K_GEMM, a);
    if (k == 0) {
        memset(tg__tensor_ptr(out), 0, (size_t)out->numel * es);
        goto done;
    }
    int64_t idx[TG_MAX_DIMS] = {0};
    for (int64_t bi = 0; bi < batch; bi++) {
        int64_t oa = a->offset, ob = b->offset;
        for (int i = 0; i < nb; i++) {
            int ia = a->ndim - 2 - nb + i, ib = b->ndim - 2 - nb + i;
            if (ia >= 0 && a->shape[ia] != 1) oa += idx[i] * a->strides[ia];
            if (ib >= 0 && b->shape[ib] != 1) ob += idx[i] * b->strides[ib];
        }
        gemm(ta, tb, m, n, k, (char *)a->storage->data + (size_t)oa * es, lda,
             (char *)b->storage->data + (size_t)ob * es, ldb, 0.0,
             (char *)tg__tensor_ptr(out) + (size_t)(bi * m * n) * es, n);
        for (int i = nb - 1; i >= 0; i--) {
            if (++idx[i] < os->shape[i]) break;
            idx[i] = 0;
        }
    }
done:
    tg_tensor_release(a);
    tg_tensor_release(b);
    return out;
}

/* dA = dC B^T, dB = A^T dC, each summed over broadcast batch dims. The
 * transposes are views, so the GEMM gets transpose flags. */
static tg_status matmul_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    tg_tensor *a = tg_op_ctx_input(ctx, 0), *b = tg_op_ctx_input(ctx, 1);
    const tg_spec *sa = tg_op_ctx_input_spec(ctx, 0), *sb = tg_op_ctx_input_spec(ctx, 1);
    /* A gradient that needs no sum over batch dims goes into the sink the
     * engine offers, if any (tg__call_into ignores one of another shape). */
    if (tg_op_ctx_needs_grad(ctx, 0)) {
        tg_tensor *in[2] = {g, tg_transpose(b, -1, -2)};
        tg_tensor *ga = in[1] ? tg__call_into(&tg__op_matmul, 2, in, NULL,
                                              tg__op_ctx_take_sink(ctx, 0))
                              : NULL;
        gin[0] = (ga && !tg__same_shape(ga->ndim, ga->shape, sa->ndim, sa->shape))
                     ? tg_sum_to(ga, sa->ndim, sa->shape) : ga;
        if (!gin[0]) return tg_last_error();
    }
    if (tg_op_ctx_needs_grad(ctx, 1) && b->ndim == 2 && a->ndim == 2) {
        /* b stored transposed (x W^T with W (n, k)): make the gradient in
         * W's layout, g^T a, and hand back its transpose view, so the
         * permute's backward yields contiguous memory, not a strided copy. */
        bool tb;
        int64_t ldb;
        if (gemm_layout(b, &tb, &ldb) && tb) {
            gin[1] = tg_transpose(tg_matmul(tg_transpose(g, 0, 1), a), 0, 1);
            return gin[1] ? TG_OK : tg_last_error();
        }
    }
    if (tg_op_ctx_needs_grad(ctx, 1)) {
        tg_tensor *in[2] = {tg_transpose(a, -1, -2), g};
        tg_tensor *gb = in[0] ? tg__call_into(&tg__op_matmul, 2, in, NULL,
                                              tg__op_ctx_take_sink(ctx, 1))
                              : NULL;
        gin[1] = (gb && !tg__same_shape(gb->ndim, gb->shape, sb->ndim, sb->shape))
                     ? tg_sum_to(gb, sb->ndim, sb->shape) : gb;
        if (!gin[1]) return tg_last_error();
    }
    return TG_OK;
}

static int matmul_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *attrs)
{
    static const struct { int na; int64_t a[4]; int nb; int64_t b[4]; } c[] = {
        {2, {3, 4}, 2, {4, 5}}, {2, {1, 3}, 2, {3, 1}}, {3, {2, 3, 4}, 2, {4, 2}},
        {4, {2, 1, 3, 4}, 3, {3, 4, 2}},
    };
    (void)attrs;
    if (k >= 4) return 0;
    in[0] = tg__sample_uniform(rng, c[k].na, c[k].a, -1.0, 1.0);
    in[1] = tg__sample_uniform(rng, c[k].nb, c[k].b, -1.0, 1.0);
    return (in[0] && in[1]) ? 2 : -1;
}

const tg_op tg__op_matmul = {
    .name = "matmul", .doc = "C = A B (batched, broadcast over leading dims)", .arity = 2,
    .shape = matmul_shape, .forward = matmul_fwd, .backward = matmul_bwd,
    .cost = TG_COST_COMPUTE_BOUND, .saves = TG_SAVE_INPUT(0) | TG_SAVE_INPUT(1),
    .flags = TG_OP_STRIDED_INPUTS, .sample = matmul_sample,
};

tg_tensor *tg_matmul(tg_tensor *a, tg_tensor *b)
{
    return tg__call2(&tg__op_matmul, a, b, NULL);
}

/* ---- affine(x, W, b) = x W^T + b: a linear layer's map as one node.
 * x (..., in), W (out, in), b (out) -> (..., out). Forward is the GEMM
 * x W^T (W passed with the transpose flag) and then the bias row added in
 * place by the broadcasting add kernel: the same arithmetic as
 * matmul(x, transpose(W)) followed by add(y, b), so the results and the
 * gradients are bitwise those of the three-node graph, with one node, one
 * output and no separate pre-bias tensor. Backward: gx = g W, gW = g^T x
 * (rows of x and g flattened over the leading dims) and gb = g summed to
 * (out). */
static tg_status affine_shape(const tg_op *op, const tg_op_attrs *attrs, tg_tensor *const *in,
                              tg_spec *out)
{
    (void)attrs;
    const tg_tensor *x = in[0], *w = in[1], *b = in[2];
    char s1[96], s2[96], s3[96];
    for (int i = 0; i < 3; i++)
        if (tg__need_float(op, i + 1, in[i])) return TG_ERR_DTYPE;
    if (tg__need_same_dtype(op, x, w) || tg__need_same_dtype(op, x, b)) return TG_ERR_DTYPE;
    if (x->ndim < 1 || w->ndim != 2 || b->ndim != 1 || x->shape[x->ndim - 1] != w->shape[1] ||
        b->shape[0] != w->shape[0])
        return tg__err(TG_ERR_SHAPE, "bad arguments to '%s' (x %s, W %s, b %s: need x (..., in), "
                                     "W (out, in), b (out))", op->name,
                       tg_shape_str(x->ndim, x->shape, s1, sizeof s1),
                       tg_shape_str(w->ndim, w->shape, s2, sizeof s2),
                       tg_shape_str(b->ndim, b->shape, s3, sizeof s3));
    *out = (tg_spec){.dtype = x->dtype, .ndim = x->ndim};
    for (int i = 0; i < x->ndim - 1; i++) out->shape[i] = x->shape[i];
    out->shape[x->ndim - 1] = w->shape[0];
    return TG_OK;
}

static tg_tensor *affine_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    tg_tensor *x = in[0], *w = in[1], *b = in[2];
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y || y->numel == 0) return y;
    int64_t k = w->shape[1], n = w->shape[0], m = y->numel / n;
    size_t es = tg__esize(x->dtype);
    if (k == 0)
        memset(tg__tensor_ptr(y), 0, (size_t)y->numel * es);
    else
        TG_KERNEL(tg_gemm_fn, TG_K_GEMM, x)(false, true, m, n, k, tg__tensor_ptr(x), k,
                                            tg__tensor_ptr(w), k, 0.0, tg__tensor_ptr(y), n);
    tg__binary_kernel(TG_K_ADD, ctx->out_spec, y, b, tg__tensor_ptr(y));
    return y;
}

/* A contiguous g (the usual case): the same GEMM and reduction kernel calls
 * that matmul and sum_to would make for these shapes (so the same bits),
 * without dispatching three ops; each gradient written into the buffer
 * tg_op_ctx_new_grad gives (a parameter's sink where the engine offers
 * one). Degenerate dims take the general path, where matmul's layout rules
 * pick other kernel arguments. */

static tg_status affine_bwd_direct(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin, int64_t m,
                                   int64_t n, int64_t k)
{
    tg_tensor *x = tg_op_ctx_input(ctx, 0), *w = tg_op_ctx_input(ctx, 1);
    tg_gemm_fn gemm = TG_KERNEL(tg_gemm_fn, TG_K_GEMM, g);
    const void *gp = tg__tensor_ptr(g);
    if (tg_op_ctx_needs_grad(ctx, 0)) {
        if (!(gin[0] = tg_op_ctx_new_grad(ctx, 0))) return tg_last_error();
        gemm(false, false, m, k, n, gp, n, tg__tensor_ptr(w), k, 0.0, tg__tensor_ptr(gin[0]), k);
    }
    if (tg_op_ctx_needs_grad(ctx, 1)) {
        if (tg__replica_active && tg__replica_defer_wgrad(tg__replica_active, w, g, x, m, n, k)) {
            ctx->needs &= ~(1u << 1); /* the engine then expects no gradient for W */
        } else {
            /* Into the sum of W's gradient so far where the GEMM adds with
             * the add kernel's bits (a weight used at every step of an RNN:
             * no buffer, no zeroing and no add pass per step). */
            double beta = 0.0;
            if (tg__op_ctx_accum_of(ctx, 1) &&
                tg__gemm_adds_exactly(g->backend, g->dtype, n, k, m)) {
                gin[1] = tg__op_ctx_take_accum(ctx, 1);
                beta = 1.0;
            } else if (!(gin[1] = tg_op_ctx_new_grad(ctx, 1))) {
                return tg_last_error();
            }
            gemm(true, false, n, k, m, gp, n, tg__tensor_ptr(x), k, beta, tg__tensor_ptr(gin[1]),
                 k);
        }
    }
    if (tg_op_ctx_needs_grad(ctx, 2)) {
        if (!(gin[2] = tg_op_ctx_new_grad(ctx, 2))) return tg_last_error();
        tg_reduce r = {.ndim = 2, .shape = {m, n}, .reduce = {true, false}};
        TG_KERNEL(tg_reduce_fn, TG_K_REDUCE_SUM, g)(&r, gp, tg__tensor_ptr(gin[2]));
    }
    return TG_OK;
}

static tg_status affine_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    tg_tensor *x = tg_op_ctx_input(ctx, 0), *w = tg_op_ctx_input(ctx, 1);
    const tg_spec *xs = tg_op_ctx_input_spec(ctx, 0), *bs = tg_op_ctx_input_spec(ctx, 2);
    int64_t n = w->shape[0], k = w->shape[1], m = tg__numel(xs->ndim - 1, xs->shape);
    /* The direct GEMMs record nothing: not while a create_graph sweep
     * records this backward. */
    if (g->contiguous && m > 1 && n > 1 && k > 1 && !tg__records(g) && !tg__records(x) &&
        !tg__records(w))
        return affine_bwd_direct(ctx, g, gin, m, n, k);
    tg_tensor *g2 = g->ndim == 2 ? g : tg_reshape(g, 2, (int64_t[]){m, n});
    if (!g2) return tg_last_error();
    if (tg_op_ctx_needs_grad(ctx, 0)) {
        tg_tensor *gx = tg_matmul(g2, w);
        gin[0] = gx && xs->ndim != 2 ? tg_reshape(gx, xs->ndim, xs->shape) : gx;
        if (!gin[0]) return tg_last_error();
    }
    if (tg_op_ctx_needs_grad(ctx, 1)) {
        tg_tensor *x2 = x->ndim == 2 ? x : tg_reshape(x, 2, (int64_t[]){m, k});
        tg_tensor *in[2] = {tg_transpose(g2, 0, 1), x2};
        gin[1] = x2 && in[0] ? tg__call_into(&tg__op_matmul, 2, in, NULL,
                                             tg__op_ctx_take_sink(ctx, 1))
                             : NULL;
        if (!gin[1]) return tg_last_error();
    }
    if (tg_op_ctx_needs_grad(ctx, 2)) {
        gin[2] = tg__sum_to_into(g2, bs->ndim, bs->shape, tg__op_ctx_take_sink(ctx, 2));
        if (!gin[2]) return tg_last_error();
    }
    return TG_OK;
}

static int affine_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *attrs)
{
    static const struct { int nx; int64_t x[3], out; } c[] = {
        {2, {3, 4}, 5}, {1, {4}, 2}, {3, {2, 3, 4}, 3}, {2, {1, 1}, 1},
    };
    (void)attrs;
    if (k >= 4) return 0;
    int64_t in_f = c[k].x[c[k].nx - 1];
    in[0] = tg__sample_uniform(rng, c[k].nx, c[k].x, -1.0, 1.0);
    in[1] = tg__sample_uniform(rng, 2, (int64_t[]){c[k].out, in_f}, -1.0, 1.0);
    in[2] = tg__sample_uniform(rng, 1, (int64_t[]){c[k].out}, -1.0, 1.0);
    return (in[0] && in[1] && in[2]) ? 3 : -1;
}

const tg_op tg__op_affine = {
    .name = "affine", .doc = "y = x W^T + b (x (..., in), W (out, in), b (out))", .arity = 3,
    .shape = affine_shape, .forward = affine_fwd, .backward = affine_bwd,
    .cost = TG_COST_COMPUTE_BOUND, .saves = TG_SAVE_INPUT(0) | TG_SAVE_INPUT(1),
    .sample = affine_sample,
};

tg_tensor *tg_affine(tg_tensor *x, tg_tensor *w, tg_tensor *b)
{
    tg_tensor *in[3] = {x, w, b};
    for (int i = 0; i < 3; i++)
        if (!in[i]) {
            tg__err_null("affine", i + 1);
            return NULL;
        }
    return tg_op_call(&tg__op_affine, 3, in, NULL);
}
