/* Recurrent cells: the LSTM cell's pointwise half as one op.
 *
 * lstm_gates(z, c): z (B, 4H) the pre-activations of the gates i, f, g, o
 * (in that order along the last dim), c (B, H) the cell state (or any
 * leading dims, (..., 4H) and (..., H), seen as B rows); y (2, B, H) with
 * y[1] = c' = sigmoid(f) c + sigmoid(i) tanh(g) and
 * y[0] = h' = sigmoid(o) tanh(c'). Composed of tg_* ops the same step is
 * four narrows, three sigmoids, two tanh, three products and a sum, each
 * a node, a pass over memory and a tensor; and in backward each narrow
 * pads its gradient to (B, 4H) with zeros before the four are summed.
 * Here the forward makes the four activations row by row with the
 * backend's own sigmoid and tanh kernels (so the ref backend stays the
 * oracle of the cpu one), in a scratch row that stays in cache; the node
 * keeps z and c, five values of each row's H where the composed ops kept
 * six, and the backward makes each row's activations, c' and tanh(c')
 * again with the same kernels and arithmetic (the same bits as the
 * forward's) and writes the gradients of z and c in one pass over the
 * row. Rows are independent, so large calls on the cpu backend split
 * them across the elementwise pool (as large maps split theirs) with the
 * bits of one thread.
 *
 * A backward that records (create_graph) runs the same math as tg_* ops
 * on the tracked z and c instead: the op has derivatives of any order. */
#include <stdlib.h>
#include <string.h>

#include "backend/parallel.h"
#include "core/pool.h"
#include "ops/helpers.h"

static tg_status gates_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                             tg_spec *out)
{
    (void)a;
    const tg_tensor *z = in[0], *c = in[1];
    char s1[96], s2[96];
    if (tg__need_float(op, 1, z)) return TG_ERR_DTYPE;
    if (c->dtype != z->dtype)
        return tg__err(TG_ERR_DTYPE, "bad argument #2 to '%s' (%s, but argument #1 is %s; "
                                     "convert with tg_cast)", op->name, tg_dtype_name(c->dtype),
                       tg_dtype_name(z->dtype));
    int nd = c->ndim;
    if (nd < 1 || c->shape[nd - 1] < 1)
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (cell state %s; need (..., H), "
                                     "H >= 1)", op->name,
                       tg_shape_str(c->ndim, c->shape, s1, sizeof s1));
    if (z->ndim != nd || !tg__same_shape(nd - 1, z->shape, nd - 1, c->shape) ||
        z->shape[nd - 1] != 4 * c->shape[nd - 1])
        return tg__err(TG_ERR_SHAPE, "bad argument #1 to '%s' (gates %s; need the cell state's "
                                     "shape %s with the last dim four times as long)", op->name,
                       tg_shape_str(z->ndim, z->shape, s1, sizeof s1),
                       tg_shape_str(c->ndim, c->shape, s2, sizeof s2));
    if (nd + 1 > TG_MAX_DIMS)
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (%d dims; at most %d)", op->name,
                       nd, TG_MAX_DIMS - 1);
    out->dtype = z->dtype;
    out->ndim = nd + 1;
    out->shape[0] = 2;
    memcpy(out->shape + 1, c->shape, (size_t)nd * sizeof *out->shape);
    return TG_OK;
}

/* The kernels of one call: the backend's sigmoid and tanh. */
typedef struct gates_k {
    tg_unary_fn sig, th;
} gates_k;

/* The activations of row zr (4H values) into ar. */
static void gates_act(const gates_k *k, int64_t H, const void *zr, void *ar, size_t es)
{
    k->sig(2 * H, zr, ar, 0);
    k->th(H, (const char *)zr + 2 * H * es, (char *)ar + 2 * H * es, 0);
    k->sig(H, (const char *)zr + 3 * H * es, (char *)ar + 3 * H * es, 0);
}

/* One row, as forward and backward both make it: the activations of zr
 * into a (4H), c' = f c + i g (a product and a sum of products, in that
 * order, as the composed ops compute it) into cn, tanh(c') into tn (which
 * may be cn). One function for both, so backward has the forward's bits. */
#define GATES_ROW(T, NAME)                                                                    \
    static void NAME(const gates_k *k, int64_t H, const T *zr, const T *cr, T *a, T *cn,      \
                     T *tn)                                                                    \
    {                                                                                          \
        gates_act(k, H, zr, a, sizeof(T));                                                    \
        for (int64_t j = 0; j < H; j++) {                                                      \
            T fc = a[H + j] * cr[j], ig = a[j] * a[2 * H + j];                                 \
            cn[j] = fc + ig;                                                                   \
        }                                                                                      \
        k->th(H, cn, tn, 0);                                                                   \
    }
GATES_ROW(float, gates_row_f32)
GATES_ROW(double, gates_row_f64)

/* Forward of rows [b0, b1) of B: y (2, B, H), a a scratch row of 4H;
 * h' = o tanh(c'). The arithmetic is spelled out once per dtype. */
#define GATES_FWD(T, NAME, ROW)                                                               \
    static void NAME(const gates_k *k, int64_t b0, int64_t b1, int64_t B, int64_t H,          \
                     const T *z, const T *c, T *a, T *y)                                       \
    {                                                                                          \
        for (int64_t b = b0; b < b1; b++) {                                                    \
            T *hn = y + b * H;                                                                 \
            ROW(k, H, z + b * 4 * H, c + b * H, a, y + (B + b) * H, hn);                       \
            for (int64_t j = 0; j < H; j++) hn[j] = a[3 * H + j] * hn[j];                      \
        }                                                                                      \
    }
GATES_FWD(float, gates_fwd_f32, gates_row_f32)
GATES_FWD(double, gates_fwd_f64, gates_row_f64)

/* Backward of rows [b0, b1) of B: gy (2, B, H) the gradient of y; gz (B, 4H)
 * and gc (B, H), either may be NULL; a a scratch row of 6H. c' and tanh(c')
 * are made again by the forward's own row function. With
 * dc = gy[1] + gy[0] o (1 - tanh(c')^2):
 *   gz = (dc g i (1 - i), dc c f (1 - f), dc i (1 - g^2), gy[0] tanh(c') o (1 - o)),
 *   gc = dc f.
 * Loops without branches, one per output, so the compiler vectorises them. */
#define GATES_BWD(T, NAME, ROW)                                                               \
    static void NAME(const gates_k *k, int64_t b0, int64_t b1, int64_t B, int64_t H,          \
                     const T *z, const T *c, const T *gy, T *gz, T *gc, T *a)                  \
    {                                                                                          \
        const T *i = a, *f = a + H, *g = a + 2 * H, *o = a + 3 * H;                            \
        T *t = a + 4 * H, *dc = a + 5 * H;                                                     \
        for (int64_t b = b0; b < b1; b++) {                                                    \
            const T *cr = c + b * H;                                                           \
            const T *gh = gy + b * H, *gn = gy + (B + b) * H;                                  \
            ROW(k, H, z + b * 4 * H, cr, a, t, t);                                             \
            for (int64_t j = 0; j < H; j++) dc[j] = gn[j] + gh[j] * o[j] * (1 - t[j] * t[j]);  \
            if (gz) {                                                                          \
                T *zr = gz + b * 4 * H;                                                        \
                for (int64_t j = 0; j < H; j++) zr[j] = dc[j] * g[j] * (i[j] * (1 - i[j]));    \
                for (int64_t j = 0; j < H; j++)                                                \
                    zr[H + j] = dc[j] * cr[j] * (f[j] * (1 - f[j]));                           \
                for (int64_t j = 0; j < H; j++) zr[2 * H + j] = dc[j] * i[j] * (1 - g[j] * g[j]); \
                for (int64_t j = 0; j < H; j++)                                                \
                    zr[3 * H + j] = gh[j] * t[j] * (o[j] * (1 - o[j]));                        \
            }                                                                                  \
            if (gc)                                                                            \
                for (int64_t j = 0; j < H; j++) gc[b * H + j] = dc[j] * f[j];                  \
        }                                                                                      \
    }
GATES_BWD(float, gates_bwd_f32, gates_row_f32)
GATES_BWD(double, gates_bwd_f64, gates_row_f64)

static gates_k gates_kernels(const tg_tensor *t)
{
    return (gates_k){.sig = TG_KERNEL(tg_unary_fn, TG_K_SIGMOID, t),
                     .th = TG_KERNEL(tg_unary_fn, TG_K_TANH, t)};
}

/* One call's rows, split across the pool where they are large (the cpu
 * backend; each row is computed alone, so any split gives the same bits),
 * each part with its own scratch row of `row` values. gy NULL: forward
 * (out = y); else backward (out = gz, out2 = gc). */
typedef struct gates_job {
    gates_k k;
    bool f64;
    int64_t B, H, row;
    const void *z, *c, *gy;
    void *out, *out2;
    char *scratch;
} gates_job;

static void gates_part(void *ctx, int part, int nparts)
{
    const gates_job *j = ctx;
    int64_t b0 = j->B * part / nparts, b1 = j->B * (part + 1) / nparts;
    void *a = j->scratch + (size_t)part * (size_t)j->row * (j->f64 ? 8 : 4);
    if (!j->gy && !j->f64)
        gates_fwd_f32(&j->k, b0, b1, j->B, j->H, j->z, j->c, a, j->out);
    else if (!j->gy)
        gates_fwd_f64(&j->k, b0, b1, j->B, j->H, j->z, j->c, a, j->out);
    else if (!j->f64)
        gates_bwd_f32(&j->k, b0, b1, j->B, j->H, j->z, j->c, j->gy, j->out, j->out2, a);
    else
        gates_bwd_f64(&j->k, b0, b1, j->B, j->H, j->z, j->c, j->gy, j->out, j->out2, a);
}

static tg_status gates_run(const tg_op *op, gates_job *j, const tg_tensor *z)
{
    size_t es = j->f64 ? 8 : 4;
    int parts = z->backend == TG_BACKEND_CPU ? tg__split_parts((size_t)z->numel * es) : 1;
    if (parts > tg__pool_size()) parts = tg__pool_size();
    if (parts > j->B) parts = (int)j->B;
    if (parts < 1) parts = 1;
    j->scratch = malloc((size_t)parts * (size_t)j->row * es);
    if (!j->scratch)
        return tg__err(TG_ERR_NOMEM, "'%s': out of memory for %d rows of %lld values", op->name,
                       parts, (long long)j->row);
    if (parts == 1)
        gates_part(j, 0, 1);
    else
        tg__pool_run(gates_part, j, parts);
    free(j->scratch);
    return TG_OK;
}

static tg_tensor *gates_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *z = in[0], *c = in[1];
    int64_t H = c->shape[c->ndim - 1];
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    gates_job j = {.k = gates_kernels(z), .f64 = z->dtype == TG_F64, .B = c->numel / H, .H = H,
                   .row = 4 * H, .z = tg__tensor_ptr(z), .c = tg__tensor_ptr(c),
                   .out = tg__tensor_ptr(y)};
    if (gates_run(ctx->op, &j, z)) {
        tg_tensor_release(y);
        return NULL;
    }
    return y;
}

static tg_tensor *one_minus(tg_tensor *x)
{
    return tg_add_scalar(tg_neg(x), 1.0);
}

/* The backward as recorded tg_* ops on the tracked z and c (create_graph):
 * the activations and c' are made again from them. */
static tg_status gates_bwd_ops(tg_op_ctx *ctx, tg_tensor *z, tg_tensor *c, tg_tensor *g,
                               tg_tensor **gin)
{
    int nd = c->ndim;
    int64_t H = c->shape[nd - 1];
    tg_tensor *i = tg_sigmoid(tg_narrow(z, -1, 0, H)), *f = tg_sigmoid(tg_narrow(z, -1, H, H));
    tg_tensor *gg = tg_tanh(tg_narrow(z, -1, 2 * H, H));
    tg_tensor *o = tg_sigmoid(tg_narrow(z, -1, 3 * H, H));
    tg_tensor *tc = tg_tanh(tg_add(tg_mul(f, c), tg_mul(i, gg)));
    tg_tensor *gh = tg_reshape(tg_narrow(g, 0, 0, 1), nd, c->shape);
    tg_tensor *gn = tg_reshape(tg_narrow(g, 0, 1, 1), nd, c->shape);
    tg_tensor *dc = tg_add(gn, tg_mul(tg_mul(gh, o), one_minus(tg_mul(tc, tc))));
    if (!dc) return tg_last_error();
    if (tg_op_ctx_needs_grad(ctx, 0)) {
        tg_tensor *parts[4] = {
            tg_mul(tg_mul(dc, gg), tg_mul(i, one_minus(i))),
            tg_mul(tg_mul(dc, c), tg_mul(f, one_minus(f))),
            tg_mul(tg_mul(dc, i), one_minus(tg_mul(gg, gg))),
            tg_mul(tg_mul(gh, tc), tg_mul(o, one_minus(o))),
        };
        for (int p = 0; p < 4; p++)
            if (!parts[p]) return tg_last_error();
        if (!(gin[0] = tg_concat(4, parts, nd - 1))) return tg_last_error();
    }
    if (tg_op_ctx_needs_grad(ctx, 1) && !(gin[1] = tg_mul(dc, f))) return tg_last_error();
    return TG_OK;
}

static tg_status gates_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    tg_tensor *z = tg_op_ctx_input(ctx, 0), *c = tg_op_ctx_input(ctx, 1);
    if (tg__records(z) || tg__records(c) || tg__records(g)) return gates_bwd_ops(ctx, z, c, g, gin);
    int64_t H = c->shape[c->ndim - 1], B = c->numel / H;
    if (!g->contiguous && !(g = tg_contiguous(g))) return tg_last_error();
    if (tg_op_ctx_needs_grad(ctx, 0) && !(gin[0] = tg_op_ctx_new_grad(ctx, 0)))
        return tg_last_error();
    if (tg_op_ctx_needs_grad(ctx, 1) && !(gin[1] = tg_op_ctx_new_grad(ctx, 1)))
        return tg_last_error();
    gates_job j = {.k = gates_kernels(c), .f64 = c->dtype == TG_F64, .B = B, .H = H, .row = 6 * H,
                   .z = tg__tensor_ptr(z), .c = tg__tensor_ptr(c), .gy = tg__tensor_ptr(g),
                   .out = gin[0] ? tg__tensor_ptr(gin[0]) : NULL,
                   .out2 = gin[1] ? tg__tensor_ptr(gin[1]) : NULL};
    return gates_run(ctx->op, &j, z);
}

/* Cases: a few rows of a small cell; one row; a cell of width 1; one
 * state without a batch dim; rows in two dims. */
static int gates_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const struct { int nd; int64_t s[3]; } c[] = {
        {2, {3, 2}}, {2, {1, 3}}, {2, {2, 1}}, {1, {3}}, {3, {2, 2, 2}},
    };
    (void)a;
    if (k >= 5) return 0;
    int64_t zs[3];
    memcpy(zs, c[k].s, sizeof zs);
    zs[c[k].nd - 1] *= 4;
    in[0] = tg__sample_uniform(rng, c[k].nd, zs, -2.0, 2.0);
    in[1] = tg__sample_uniform(rng, c[k].nd, c[k].s, -1.5, 1.5);
    return (in[0] && in[1]) ? 2 : -1;
}

const tg_op tg__op_lstm_gates = {
    .name = "lstm_gates",
    .doc = "y[1] = c' = sig(f) c + sig(i) tanh(g), y[0] = sig(o) tanh(c'); (i, f, g, o) = z's "
           "quarters along its last dim",
    .arity = 2, .shape = gates_shape, .forward = gates_fwd, .backward = gates_bwd,
    .cost = TG_COST_MEMORY_BOUND, .saves = TG_SAVE_INPUT(0) | TG_SAVE_INPUT(1),
    .sample = gates_sample,
};

tg_tensor *tg_lstm_gates(tg_tensor *z, tg_tensor *c)
{
    if (!z || !c) {
        tg__err_null("lstm_gates", z ? 2 : 1);
        return NULL;
    }
    return tg__call2(&tg__op_lstm_gates, z, c, NULL);
}
