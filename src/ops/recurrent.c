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

/* Forward of rows [b0, b1): z rows of 4H, c rows of H; h' = o tanh(c')
 * into hn and c' into cn (rows of H); a a scratch row of 4H. The
 * arithmetic is spelled out once per dtype. */
#define GATES_FWD(T, NAME, ROW)                                                               \
    static void NAME(const gates_k *k, int64_t b0, int64_t b1, int64_t H, const T *z,         \
                     const T *c, T *a, T *hn, T *cn)                                           \
    {                                                                                          \
        for (int64_t b = b0; b < b1; b++) {                                                    \
            T *hr = hn + b * H;                                                                \
            ROW(k, H, z + b * 4 * H, c + b * H, a, cn + b * H, hr);                            \
            for (int64_t j = 0; j < H; j++) hr[j] = a[3 * H + j] * hr[j];                      \
        }                                                                                      \
    }
GATES_FWD(float, gates_fwd_f32, gates_row_f32)
GATES_FWD(double, gates_fwd_f64, gates_row_f64)

/* Backward of rows [b0, b1): gy and gny (rows of H) the gradients of h'
 * and c'; gz (rows of 4H) and gc (rows of H), either may be NULL; a a
 * scratch row of 6H. gc may be gny (each row of it is read before that
 * row of gc is written). c' and tanh(c') are made again by the forward's
 * own row function. With dc = gn + gh o (1 - tanh(c')^2):
 *   gz = (dc g i (1 - i), dc c f (1 - f), dc i (1 - g^2), gh tanh(c') o (1 - o)),
 *   gc = dc f.
 * Loops without branches, one per output, so the compiler vectorises them. */
#define GATES_BWD(T, NAME, ROW)                                                               \
    static void NAME(const gates_k *k, int64_t b0, int64_t b1, int64_t H, const T *z,         \
                     const T *c, const T *gy, const T *gny, T *gz, T *gc, T *a)                \
    {                                                                                          \
        const T *i = a, *f = a + H, *g = a + 2 * H, *o = a + 3 * H;                            \
        T *t = a + 4 * H, *dc = a + 5 * H;                                                     \
        for (int64_t b = b0; b < b1; b++) {                                                    \
            const T *cr = c + b * H;                                                           \
            const T *gh = gy + b * H, *gn = gny + b * H;                                       \
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
 * each part with its own scratch row of `row` values. Forward (gy NULL):
 * z and c in, h' and c' out to out and out2. Backward: gy and gn the
 * gradients of h' and c', gz and gc out to out and out2 (either NULL). */
typedef struct gates_job {
    gates_k k;
    bool f64;
    int64_t B, H, row;
    const void *z, *c, *gy, *gn;
    void *out, *out2;
    char *scratch;
} gates_job;

static void gates_part(void *ctx, int part, int nparts)
{
    const gates_job *j = ctx;
    int64_t b0 = j->B * part / nparts, b1 = j->B * (part + 1) / nparts;
    void *a = j->scratch + (size_t)part * (size_t)j->row * (j->f64 ? 8 : 4);
    if (!j->gy && !j->f64)
        gates_fwd_f32(&j->k, b0, b1, j->H, j->z, j->c, a, j->out, j->out2);
    else if (!j->gy)
        gates_fwd_f64(&j->k, b0, b1, j->H, j->z, j->c, a, j->out, j->out2);
    else if (!j->f64)
        gates_bwd_f32(&j->k, b0, b1, j->H, j->z, j->c, j->gy, j->gn, j->out, j->out2, a);
    else
        gates_bwd_f64(&j->k, b0, b1, j->H, j->z, j->c, j->gy, j->gn, j->out, j->out2, a);
}

/* The parts a call of j's size splits into, and j's scratch for them
 * (free it after the last gates_go); 0 after an error. */
static int gates_begin(const tg_op *op, gates_job *j, tg_backend backend)
{
    size_t es = j->f64 ? 8 : 4;
    int parts = backend == TG_BACKEND_CPU ? tg__split_parts((size_t)(j->B * 4 * j->H) * es) : 1;
    if (parts > tg__pool_size()) parts = tg__pool_size();
    if (parts > j->B) parts = (int)j->B;
    if (parts < 1) parts = 1;
    j->scratch = malloc((size_t)parts * (size_t)j->row * es);
    if (!j->scratch) {
        tg__err(TG_ERR_NOMEM, "'%s': out of memory for %d rows of %lld values", op->name, parts,
                (long long)j->row);
        return 0;
    }
    return parts;
}

static void gates_go(gates_job *j, int parts)
{
    if (parts == 1)
        gates_part(j, 0, 1);
    else
        tg__pool_run(gates_part, j, parts);
}

static tg_status gates_run(const tg_op *op, gates_job *j, tg_backend backend)
{
    int parts = gates_begin(op, j, backend);
    if (!parts) return TG_ERR_NOMEM;
    gates_go(j, parts);
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
                   .out = tg__tensor_ptr(y),
                   .out2 = (char *)tg__tensor_ptr(y) + (size_t)c->numel * tg_dtype_size(z->dtype)};
    if (gates_run(ctx->op, &j, z->backend)) {
        tg_tensor_release(y);
        return NULL;
    }
    return y;
}

static tg_tensor *one_minus(tg_tensor *x)
{
    return tg_add_scalar(tg_neg(x), 1.0);
}

/* The gradients of z and c (into *gz and *gc where asked) from those of
 * h' and c' (gh, gn), as recorded tg_* ops on the tracked z and c
 * (create_graph): the activations and c' are made again from them. */
static tg_status gates_vjp_ops(tg_tensor *z, tg_tensor *c, tg_tensor *gh, tg_tensor *gn,
                               tg_tensor **gz, tg_tensor **gc)
{
    int nd = c->ndim;
    int64_t H = c->shape[nd - 1];
    tg_tensor *i = tg_sigmoid(tg_narrow(z, -1, 0, H)), *f = tg_sigmoid(tg_narrow(z, -1, H, H));
    tg_tensor *gg = tg_tanh(tg_narrow(z, -1, 2 * H, H));
    tg_tensor *o = tg_sigmoid(tg_narrow(z, -1, 3 * H, H));
    tg_tensor *tc = tg_tanh(tg_add(tg_mul(f, c), tg_mul(i, gg)));
    tg_tensor *dc = tg_add(gn, tg_mul(tg_mul(gh, o), one_minus(tg_mul(tc, tc))));
    if (!dc) return tg_last_error();
    if (gz) {
        tg_tensor *parts[4] = {
            tg_mul(tg_mul(dc, gg), tg_mul(i, one_minus(i))),
            tg_mul(tg_mul(dc, c), tg_mul(f, one_minus(f))),
            tg_mul(tg_mul(dc, i), one_minus(tg_mul(gg, gg))),
            tg_mul(tg_mul(gh, tc), tg_mul(o, one_minus(o))),
        };
        for (int p = 0; p < 4; p++)
            if (!parts[p]) return tg_last_error();
        if (!(*gz = tg_concat(4, parts, nd - 1))) return tg_last_error();
    }
    if (gc && !(*gc = tg_mul(dc, f))) return tg_last_error();
    return TG_OK;
}

/* Entry k of dim 0 of t (the rest of t's shape), a view. */
static tg_tensor *row0(tg_tensor *t, int64_t k)
{
    return tg_reshape(tg_narrow(t, 0, k, 1), t->ndim - 1, t->shape + 1);
}

static tg_status gates_bwd_ops(tg_op_ctx *ctx, tg_tensor *z, tg_tensor *c, tg_tensor *g,
                               tg_tensor **gin)
{
    tg_tensor *gh = row0(g, 0), *gn = row0(g, 1);
    if (!gh || !gn) return tg_last_error();
    return gates_vjp_ops(z, c, gh, gn, tg_op_ctx_needs_grad(ctx, 0) ? &gin[0] : NULL,
                         tg_op_ctx_needs_grad(ctx, 1) ? &gin[1] : NULL);
}

static tg_status gates_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    tg_tensor *z = tg_op_ctx_input(ctx, 0), *c = tg_op_ctx_input(ctx, 1);
    if (tg__records(z) || tg__records(c) || tg__records(g)) return gates_bwd_ops(ctx, z, c, g, gin);
    int64_t H = c->shape[c->ndim - 1], B = c->numel / H;
    size_t half = (size_t)c->numel * tg_dtype_size(c->dtype);
    if (!g->contiguous && !(g = tg_contiguous(g))) return tg_last_error();
    if (tg_op_ctx_needs_grad(ctx, 0) && !(gin[0] = tg_op_ctx_new_grad(ctx, 0)))
        return tg_last_error();
    if (tg_op_ctx_needs_grad(ctx, 1) && !(gin[1] = tg_op_ctx_new_grad(ctx, 1)))
        return tg_last_error();
    gates_job j = {.k = gates_kernels(c), .f64 = c->dtype == TG_F64, .B = B, .H = H, .row = 6 * H,
                   .z = tg__tensor_ptr(z), .c = tg__tensor_ptr(c), .gy = tg__tensor_ptr(g),
                   .gn = (const char *)tg__tensor_ptr(g) + half,
                   .out = gin[0] ? tg__tensor_ptr(gin[0]) : NULL,
                   .out2 = gin[1] ? tg__tensor_ptr(gin[1]) : NULL};
    return gates_run(ctx->op, &j, z->backend);
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

/* ---- lstm(x, s0, w, b): a whole sequence of LSTM steps as one op.
 *
 * x (T, ..., I) the inputs of T steps (the dims between seen as B rows),
 * s0 (2, ..., H) the initial state (h0, c0), w (4H, I + H) the weights
 * [W_ih | W_hh] side by side, b (4H) the summed biases. Step t makes
 * z_t = x_t W_ih^T + b + h_{t-1} W_hh^T and then lstm_gates(z_t, c_{t-1});
 * y (2, T, ..., H) holds every h_t in y[0] and every c_t in y[1].
 *
 * As one op the sequence needs two GEMMs a step where the cell's ops make
 * five: the input projections of all steps are one GEMM before the first
 * step, and backward makes the gradients of W_ih, W_hh, b and x once over
 * all T*B rows from the gradients of every z_t (dZ), leaving per step the
 * recurrent product in forward and the gradient of h_{t-1} in backward.
 * The node keeps x, s0, w, b, y and every z_t (Z, an extra saved tensor):
 * 6H + I values a row and step, as the cell's ops keep. */

typedef struct seq_dims {
    int64_t T, B, I, H;
} seq_dims;

static seq_dims seq_dims_of(const tg_spec *xs, const tg_spec *ss)
{
    seq_dims d = {.T = xs->shape[0], .I = xs->shape[xs->ndim - 1], .H = ss->shape[ss->ndim - 1]};
    d.B = tg__numel(xs->ndim - 2, xs->shape + 1);
    return d;
}

static tg_status seq_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                           tg_spec *out)
{
    (void)a;
    const tg_tensor *x = in[0], *s = in[1], *w = in[2], *b = in[3];
    char s1[96], s2[96];
    if (tg__need_float(op, 1, x)) return TG_ERR_DTYPE;
    for (int i = 1; i < 4; i++)
        if (in[i]->dtype != x->dtype)
            return tg__err(TG_ERR_DTYPE, "bad argument #%d to '%s' (%s, but argument #1 is %s; "
                                         "convert with tg_cast)", i + 1, op->name,
                           tg_dtype_name(in[i]->dtype), tg_dtype_name(x->dtype));
    int nd = x->ndim;
    if (nd < 2 || x->numel < 1)
        return tg__err(TG_ERR_SHAPE, "bad argument #1 to '%s' (inputs %s; need (T, ..., I), "
                                     "not empty)", op->name,
                       tg_shape_str(x->ndim, x->shape, s1, sizeof s1));
    if (nd + 1 > TG_MAX_DIMS)
        return tg__err(TG_ERR_SHAPE, "bad argument #1 to '%s' (%d dims; at most %d)", op->name,
                       nd, TG_MAX_DIMS - 1);
    if (s->ndim != nd || s->shape[0] != 2 ||
        !tg__same_shape(nd - 2, s->shape + 1, nd - 2, x->shape + 1) || s->shape[nd - 1] < 1)
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to '%s' (state %s; need (2, ..., H) with "
                                     "the batch dims of inputs %s)", op->name,
                       tg_shape_str(s->ndim, s->shape, s1, sizeof s1),
                       tg_shape_str(x->ndim, x->shape, s2, sizeof s2));
    int64_t I = x->shape[nd - 1], H = s->shape[nd - 1];
    if (w->ndim != 2 || w->shape[0] != 4 * H || w->shape[1] != I + H)
        return tg__err(TG_ERR_SHAPE, "bad argument #3 to '%s' (weights %s; need (4H, I + H) = "
                                     "(%lld, %lld))", op->name,
                       tg_shape_str(w->ndim, w->shape, s1, sizeof s1), (long long)(4 * H),
                       (long long)(I + H));
    if (b->ndim != 1 || b->shape[0] != 4 * H)
        return tg__err(TG_ERR_SHAPE, "bad argument #4 to '%s' (bias %s; need (4H) = (%lld))",
                       op->name, tg_shape_str(b->ndim, b->shape, s1, sizeof s1),
                       (long long)(4 * H));
    out->dtype = x->dtype;
    out->ndim = nd + 1;
    out->shape[0] = 2;
    memcpy(out->shape + 1, x->shape, (size_t)(nd - 1) * sizeof *out->shape);
    out->shape[nd] = H;
    return TG_OK;
}

/* Steps per chunk. Forward makes the input projections, and backward the
 * gradients of w, b and x, a chunk of steps at a time, so that the chunk's
 * z (or dz) rows stay in cache from its GEMM to its steps; a chunk holds
 * 256 KiB of them (or one step). From the sizes alone, so every backend and
 * thread count makes the same chunks, and the same sums. */
#define SEQ_CHUNK_BYTES ((int64_t)256 * 1024)

static int64_t seq_chunk(int64_t T, int64_t B, int64_t G, size_t es)
{
    int64_t n = SEQ_CHUNK_BYTES / (B * G * (int64_t)es);
    return n < 1 ? 1 : n > T ? T : n;
}

/* z rows of the chunk [t0, t0 + n) into zc: b, plus x W_ih^T over the
 * chunk's rows; with hprev (backward, recomputing the gates: every h_{t-1}
 * is known from y), plus h_{t-1} W_hh^T over the same rows too. */
static void seq_chunk_z(tg_gemm_fn gemm, const seq_dims *d, size_t es, int64_t t0, int64_t n,
                        const char *x, const char *w, const char *b, const char *s0,
                        const char *y0, bool hprev, char *zc)
{
    int64_t B = d->B, I = d->I, H = d->H, G = 4 * H, rows = n * B;
    for (int64_t r = 0; r < rows; r++) memcpy(zc + (size_t)(r * G) * es, b, (size_t)G * es);
    gemm(false, true, rows, G, I, x + (size_t)(t0 * B * I) * es, I, w, I + H, 1.0, zc, G);
    if (!hprev) return;
    const char *whh = w + (size_t)I * es;
    if (t0 > 0) {
        gemm(false, true, rows, G, H, y0 + (size_t)((t0 - 1) * B * H) * es, H, whh, I + H, 1.0,
             zc, G);
        return;
    }
    gemm(false, true, B, G, H, s0, H, whh, I + H, 1.0, zc, G);
    if (n > 1)
        gemm(false, true, rows - B, G, H, y0, H, whh, I + H, 1.0, zc + (size_t)(B * G) * es, G);
}

static tg_tensor *seq_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    const tg_tensor *x = in[0], *s = in[1], *w = in[2], *b = in[3];
    seq_dims d = seq_dims_of(&ctx->in_spec[0], &ctx->in_spec[1]);
    int64_t T = d.T, B = d.B, I = d.I, H = d.H, G = 4 * H;
    size_t es = tg_dtype_size(x->dtype), hb = (size_t)(B * H) * es;
    int64_t chunk = seq_chunk(T, B, G, es);
    /* Z whole where the node keeps it, else one chunk's rows at a time. */
    bool keep = ctx->needs && !ctx->attrs->flag;
    int64_t zsteps = keep ? T : chunk;
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    tg_tensor *Z = y ? tg__tensor_empty(x->dtype, 3, (int64_t[]){zsteps, B, G}, x->backend)
                     : NULL;
    if (!Z) {
        tg_tensor_release(y);
        return NULL;
    }
    gates_job j = {.k = gates_kernels(x), .f64 = x->dtype == TG_F64, .B = B, .H = H,
                   .row = 4 * H};
    int parts = gates_begin(ctx->op, &j, x->backend);
    if (!parts) {
        tg_tensor_release(Z);
        tg_tensor_release(y);
        return NULL;
    }
    tg_gemm_fn gemm = TG_KERNEL(tg_gemm_fn, TG_K_GEMM, x);
    char *zp = tg__tensor_ptr(Z), *y0 = tg__tensor_ptr(y), *y1 = y0 + (size_t)T * hb;
    const char *s0 = tg__tensor_ptr(s), *wp = tg__tensor_ptr(w);
    /* A chunk of steps at a time: z = b + x W_ih^T for its rows, then step
     * by step z_t += h_{t-1} W_hh^T and the gates. */
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
        int64_t n = T - t0 < chunk ? T - t0 : chunk;
        char *zc = keep ? zp + (size_t)(t0 * B * G) * es : zp;
        seq_chunk_z(gemm, &d, es, t0, n, tg__tensor_ptr(x), wp, tg__tensor_ptr(b), s0, y0, false,
                    zc);
        for (int64_t t = t0; t < t0 + n; t++) {
            const char *hp = t ? y0 + (size_t)(t - 1) * hb : s0;
            char *zt = zc + (size_t)((t - t0) * B * G) * es;
            gemm(false, true, B, G, H, hp, H, wp + (size_t)I * es, I + H, 1.0, zt, G);
            j.z = zt;
            j.c = t ? y1 + (size_t)(t - 1) * hb : s0 + hb;
            j.out = y0 + (size_t)t * hb;
            j.out2 = y1 + (size_t)t * hb;
            gates_go(&j, parts);
        }
    }
    free(j.scratch);
    if (keep && tg_op_ctx_save(ctx, Z) < 0) {
        tg__err(TG_ERR_INTERNAL, "'%s' could not keep its gates for backward", ctx->op->name);
        tg_tensor_release(y);
        y = NULL;
    }
    tg_tensor_release(Z);
    return y;
}

/* acc[i] += v[i], n values of the dtype. */
static void add_into(void *acc, const void *v, int64_t n, bool f64)
{
    if (f64) {
        double *a = acc;
        const double *b = v;
        for (int64_t i = 0; i < n; i++) a[i] = a[i] + b[i];
    } else {
        float *a = acc;
        const float *b = v;
        for (int64_t i = 0; i < n; i++) a[i] = a[i] + b[i];
    }
}

/* t reshaped to 3 dims (n0, n1, n2), a view of the contiguous t. */
static tg_tensor *as3(tg_tensor *t, int64_t n0, int64_t n1, int64_t n2)
{
    return tg_reshape(t, 3, (int64_t[]){n0, n1, n2});
}

/* The backward as recorded tg_* ops on the tracked inputs (create_graph):
 * the forward is made again as ops (the input projection, then per step
 * the recurrent product and lstm_gates), then differentiated step by step
 * back to the first, as the direct path does. */
static tg_status seq_bwd_ops(tg_op_ctx *ctx, tg_tensor *const *in, tg_tensor *g, tg_tensor **gin)
{
    tg_tensor *x = in[0], *s = in[1], *w = in[2], *b = in[3];
    seq_dims d = seq_dims_of(&ctx->in_spec[0], &ctx->in_spec[1]);
    int64_t T = d.T, B = d.B, I = d.I, H = d.H;
    tg_tensor *wih = tg_narrow(w, 1, 0, I), *whh = tg_narrow(w, 1, I, H);
    tg_tensor *whht = tg_transpose(whh, 0, 1), *x3 = as3(x, T, B, I);
    tg_tensor *xp = tg_affine(x3, wih, b), *s3 = as3(s, 2, B, H);
    tg_tensor *g4 = tg_reshape(g, 4, (int64_t[]){2, T, B, H});
    if (!whht || !xp || !s3 || !g4) return tg_last_error();
    tg_tensor **z = calloc((size_t)(4 * T), sizeof *z);
    if (!z) return tg__err(TG_ERR_NOMEM, "'%s': out of memory", ctx->op->name);
    tg_tensor **hp = z + T, **cp = z + 2 * T, **gz = z + 3 * T;
    tg_tensor *h = row0(s3, 0), *c = row0(s3, 1);
    tg_status st = TG_OK;
    for (int64_t t = 0; t < T && !st; t++) {
        hp[t] = h;
        cp[t] = c;
        z[t] = tg_add(row0(xp, t), tg_matmul(h, whht));
        tg_tensor *yt = tg_lstm_gates(z[t], c);
        h = yt ? row0(yt, 0) : NULL;
        c = yt ? row0(yt, 1) : NULL;
        if (!h || !c) st = tg_last_error();
    }
    tg_tensor *g0 = st ? NULL : row0(g4, 0), *g1 = st ? NULL : row0(g4, 1);
    if (!st && (!g0 || !g1)) st = tg_last_error();
    tg_tensor *dh = NULL, *dc = NULL;
    for (int64_t t = T - 1; t >= 0 && !st; t--) {
        tg_tensor *gh = row0(g0, t), *gn = row0(g1, t);
        if (dh) gh = tg_add(gh, dh);
        if (dc) gn = tg_add(gn, dc);
        if (!gh || !gn) {
            st = tg_last_error();
            break;
        }
        st = gates_vjp_ops(z[t], cp[t], gh, gn, &gz[t], &dc);
        if (!st && !(dh = tg_matmul(gz[t], whh))) st = tg_last_error();
    }
    for (int64_t t = 0; t < T && !st; t++) {
        hp[t] = as3(hp[t], 1, B, H);
        gz[t] = as3(gz[t], 1, B, 4 * H);
        if (!hp[t] || !gz[t]) st = tg_last_error();
    }
    tg_tensor *dz = st ? NULL : tg_reshape(tg_concat((int)T, gz, 0), 2, (int64_t[]){T * B, 4 * H});
    tg_tensor *hs = st ? NULL : tg_reshape(tg_concat((int)T, hp, 0), 2, (int64_t[]){T * B, H});
    free(z);
    if (st) return st;
    if (!dz || !hs) return tg_last_error();
    const tg_spec *xs = &ctx->in_spec[0], *ss = &ctx->in_spec[1];
    if (tg_op_ctx_needs_grad(ctx, 0) &&
        !(gin[0] = tg_reshape(tg_matmul(dz, wih), xs->ndim, xs->shape)))
        return tg_last_error();
    if (tg_op_ctx_needs_grad(ctx, 1)) {
        tg_tensor *p[2] = {as3(dh, 1, B, H), as3(dc, 1, B, H)};
        if (!p[0] || !p[1] || !(gin[1] = tg_reshape(tg_concat(2, p, 0), ss->ndim, ss->shape)))
            return tg_last_error();
    }
    if (tg_op_ctx_needs_grad(ctx, 2)) {
        tg_tensor *dzt = tg_transpose(dz, 0, 1);
        tg_tensor *p[2] = {tg_matmul(dzt, tg_reshape(x3, 2, (int64_t[]){T * B, I})),
                           tg_matmul(dzt, hs)};
        if (!p[0] || !p[1] || !(gin[2] = tg_concat(2, p, 1))) return tg_last_error();
    }
    if (tg_op_ctx_needs_grad(ctx, 3) && !(gin[3] = tg_sum_dims(dz, 1, (int[]){0}, false)))
        return tg_last_error();
    return TG_OK;
}

/* The gradients of w, b and x from the chunk of steps [t0, t0 + n) whose
 * dz rows are dzc: added into gw and gb unless first (the chunk of the last
 * steps, made first), written into gx's rows of the chunk. */
typedef struct seq_grads {
    tg_gemm_fn gemm;
    tg_reduce_fn rsum;
    int64_t B, I, H;
    size_t es;
    bool f64;
    const char *x, *y0, *s0, *w;
    char *gw, *gb, *gx, *bsum;
} seq_grads;

static void seq_chunk_grads(const seq_grads *q, int64_t t0, int64_t n, const char *dzc,
                            bool first)
{
    int64_t B = q->B, I = q->I, H = q->H, G = 4 * H, rows = n * B;
    size_t es = q->es, zb = (size_t)(B * G) * es;
    double beta = first ? 0.0 : 1.0;
    if (q->gw) {
        char *gwh = q->gw + (size_t)I * es;
        q->gemm(true, false, G, I, rows, dzc, G, q->x + (size_t)(t0 * B * I) * es, I, beta, q->gw,
                I + H);
        /* dW_hh += dz_t^T h_{t-1}: against y[0] from step 1, h0 at step 0. */
        if (t0 > 0) {
            q->gemm(true, false, G, H, rows, dzc, G, q->y0 + (size_t)((t0 - 1) * B * H) * es, H,
                    beta, gwh, I + H);
        } else {
            if (n > 1)
                q->gemm(true, false, G, H, rows - B, dzc + zb, G, q->y0, H, beta, gwh, I + H);
            q->gemm(true, false, G, H, B, dzc, G, q->s0, H, n > 1 ? 1.0 : beta, gwh, I + H);
        }
    }
    if (q->gb) {
        tg_reduce r = {.ndim = 2, .shape = {rows, G}, .reduce = {true, false}};
        q->rsum(&r, dzc, first ? q->gb : q->bsum);
        if (!first) add_into(q->gb, q->bsum, G, q->f64);
    }
    if (q->gx)
        q->gemm(false, false, rows, I, G, dzc, G, q->w, I + H, 0.0,
                q->gx + (size_t)(t0 * B * I) * es, I);
}

static tg_status seq_bwd(tg_op_ctx *ctx, tg_tensor *g, tg_tensor **gin)
{
    tg_tensor *in[4];
    bool rec = tg__records(g);
    for (int i = 0; i < 4; i++) rec |= tg__records(in[i] = tg_op_ctx_input(ctx, i));
    if (rec) return seq_bwd_ops(ctx, in, g, gin);
    tg_tensor *x = in[0], *s = in[1], *w = in[2];
    /* Z: the gate rows forward kept; NULL where it keeps none (the flag):
     * then each chunk's rows are made again, every h_{t-1} being in y, in
     * one GEMM per weight over the chunk's rows. */
    bool remake = ctx->attrs->flag != 0;
    tg_tensor *y = tg_op_ctx_output(ctx), *Z = remake ? NULL : tg_op_ctx_saved(ctx, 0);
    if (!y || (!remake && !Z) || (remake && !tg_op_ctx_input(ctx, 3)))
        return tg__err(TG_ERR_INTERNAL, "'%s': backward without its saved values", ctx->op->name);
    seq_dims d = seq_dims_of(&ctx->in_spec[0], &ctx->in_spec[1]);
    int64_t T = d.T, B = d.B, I = d.I, H = d.H, G = 4 * H;
    bool f64 = x->dtype == TG_F64, ns = tg_op_ctx_needs_grad(ctx, 1);
    size_t es = tg_dtype_size(x->dtype), hb = (size_t)(B * H) * es, zb = (size_t)(B * G) * es;
    if (!g->contiguous && !(g = tg_contiguous(g))) return tg_last_error();
    for (int i = 0; i < 4; i++)
        if (tg_op_ctx_needs_grad(ctx, i) && !(gin[i] = tg_op_ctx_new_grad(ctx, i)))
            return tg_last_error();
    int64_t chunk = seq_chunk(T, B, G, es);
    size_t zcb = remake ? (size_t)chunk * zb : 0;
    char *buf = malloc((size_t)chunk * zb + zcb + 2 * hb + (size_t)G * es);
    gates_job j = {.k = gates_kernels(x), .f64 = f64, .B = B, .H = H, .row = 6 * H};
    int parts = buf ? gates_begin(ctx->op, &j, x->backend) : 0;
    if (!parts) {
        free(buf);
        return tg__err(TG_ERR_NOMEM, "'%s': out of memory for its backward", ctx->op->name);
    }
    tg_gemm_fn gemm = TG_KERNEL(tg_gemm_fn, TG_K_GEMM, x);
    char *zre = buf + (size_t)chunk * zb + 2 * hb + (size_t)G * es;
    const char *g0 = tg__tensor_ptr(g), *g1 = g0 + (size_t)T * hb;
    const char *zp = remake ? zre : tg__tensor_ptr(Z);
    const char *y1 = (const char *)tg__tensor_ptr(y) + (size_t)T * hb, *s0 = tg__tensor_ptr(s);
    const char *whh = (const char *)tg__tensor_ptr(w) + (size_t)I * es;
    char *dzc = buf, *hbuf = buf + (size_t)chunk * zb, *cbuf = hbuf + hb;
    char *gs = ns ? tg__tensor_ptr(gin[1]) : NULL;
    seq_grads q = {
        .gemm = gemm, .rsum = TG_KERNEL(tg_reduce_fn, TG_K_REDUCE_SUM, x), .B = B, .I = I,
        .H = H, .es = es, .f64 = f64, .x = tg__tensor_ptr(x), .y0 = tg__tensor_ptr(y), .s0 = s0,
        .w = tg__tensor_ptr(w), .gw = gin[2] ? tg__tensor_ptr(gin[2]) : NULL,
        .gb = gin[3] ? tg__tensor_ptr(gin[3]) : NULL, .gx = gin[0] ? tg__tensor_ptr(gin[0]) : NULL,
        .bsum = cbuf + hb,
    };
    j.gy = g0 + (size_t)(T - 1) * hb;
    j.gn = g1 + (size_t)(T - 1) * hb;
    /* The chunks of forward, last first; in each, the steps last first. */
    for (int64_t t0 = (T - 1) / chunk * chunk; t0 >= 0; t0 -= chunk) {
        int64_t n = T - t0 < chunk ? T - t0 : chunk;
        if (remake)
            seq_chunk_z(gemm, &d, es, t0, n, q.x, q.w, tg__tensor_ptr(tg_op_ctx_input(ctx, 3)),
                        s0, q.y0, true, zre);
        for (int64_t t = t0 + n - 1; t >= t0; t--) {
            char *dzt = dzc + (size_t)(t - t0) * zb;
            j.z = remake ? zre + (size_t)(t - t0) * zb : zp + (size_t)t * zb;
            j.c = t ? y1 + (size_t)(t - 1) * hb : s0 + hb;
            j.out = dzt;
            j.out2 = t ? cbuf : (ns ? gs + hb : NULL);
            gates_go(&j, parts);
            if (t) {
                /* The gradients of h_{t-1} and c_{t-1}: from y and from step t. */
                memcpy(hbuf, g0 + (size_t)(t - 1) * hb, hb);
                gemm(false, false, B, H, G, dzt, G, whh, I + H, 1.0, hbuf, H);
                add_into(cbuf, g1 + (size_t)(t - 1) * hb, B * H, f64);
                j.gy = hbuf;
                j.gn = cbuf;
            } else if (ns) {
                gemm(false, false, B, H, G, dzt, G, whh, I + H, 0.0, gs, H);
            }
        }
        seq_chunk_grads(&q, t0, n, dzc, t0 + n == T);
    }
    free(j.scratch);
    free(buf);
    return TG_OK;
}

/* Cases: a few steps of a small batch; unbatched, width 1; one step; two
 * batch dims; then the first and the last with the gate rows made again
 * in backward (the flag). */
static int seq_sample(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)
{
    static const struct { int nd; int64_t T, b[2], I, H; } c[] = {
        {3, 3, {2, 1}, 2, 2}, {2, 2, {1, 1}, 3, 1}, {3, 1, {2, 1}, 3, 2}, {4, 2, {2, 1}, 2, 3},
    };
    if (k >= 6) return 0;
    a->flag = k >= 4;
    if (k == 5) k = 3;
    if (k == 4) k = 0;
    int nd = c[k].nd;
    int64_t xs[4] = {c[k].T}, ss[4] = {2};
    for (int i = 1; i < nd - 1; i++) xs[i] = ss[i] = c[k].b[i - 1];
    xs[nd - 1] = c[k].I;
    ss[nd - 1] = c[k].H;
    int64_t G = 4 * c[k].H;
    in[0] = tg__sample_uniform(rng, nd, xs, -1.0, 1.0);
    in[1] = tg__sample_uniform(rng, nd, ss, -1.0, 1.0);
    in[2] = tg__sample_uniform(rng, 2, (int64_t[]){G, c[k].I + c[k].H}, -0.8, 0.8);
    in[3] = tg__sample_uniform(rng, 1, &G, -0.5, 0.5);
    return (in[0] && in[1] && in[2] && in[3]) ? 4 : -1;
}

const tg_op tg__op_lstm = {
    .name = "lstm",
    .doc = "T LSTM steps: z_t = x_t W_ih^T + b + h_{t-1} W_hh^T, (h_t, c_t) = lstm_gates(z_t, "
           "c_{t-1}); w = [W_ih | W_hh], s0 = (h0, c0), y = (h_1..T, c_1..T)",
    .arity = 4, .shape = seq_shape, .forward = seq_fwd, .backward = seq_bwd,
    .cost = TG_COST_COMPUTE_BOUND,
    .saves = TG_SAVE_INPUT(0) | TG_SAVE_INPUT(1) | TG_SAVE_INPUT(2) | TG_SAVE_INPUT(3) |
             TG_SAVE_OUTPUT,
    .sample = seq_sample,
};

tg_tensor *tg_lstm(tg_tensor *x, tg_tensor *s0, tg_tensor *w, tg_tensor *b,
                   const tg_lstm_opts *opts)
{
    tg_tensor *in[4] = {x, s0, w, b};
    for (int i = 0; i < 4; i++)
        if (!in[i]) {
            tg__err_null("lstm", i + 1);
            return NULL;
        }
    tg_op_attrs a = {.flag = opts && opts->remake_gates};
    return tg_op_call(&tg__op_lstm, 4, in, &a);
}
