/* Layers: parameters in a tg_params set, forwards from public ops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

/* Forwards build nested expressions in a private scope and hand the
 * result to the caller's scope (or to the caller), like a single op. */
static tg_tensor *finish(tg_tensor *y)
{
    tg_scope_keep(y);
    tg_scope_end();
    return tg__scope_track(y);
}

/* Adds "<name>.<field>" to ps; NULL (error set) on failure. */
static tg_tensor *add(tg_params *ps, const char *name, const char *field, tg_dtype dt, int ndim,
                      const int64_t *shape, bool buffer)
{
    char full[512];
    if (!ps || !name) {
        tg_error_set(TG_ERR_NULL, "bad argument to layer constructor (NULL %s)",
                     ps ? "name" : "parameter set");
        return NULL;
    }
    if (snprintf(full, sizeof full, "%s.%s", name, field) >= (int)sizeof full) {
        tg_error_set(TG_ERR_INVALID, "layer name '%.40s...' too long", name);
        return NULL;
    }
    return buffer ? tg_params_add_buffer(ps, full, dt, ndim, shape)
                  : tg_params_add(ps, full, dt, ndim, shape);
}

static bool positive(const char *what, int64_t v)
{
    if (v > 0) return true;
    tg_error_set(TG_ERR_INVALID, "bad argument to layer constructor (%s %lld; need > 0)", what,
                 (long long)v);
    return false;
}

/* U(-k, k) on a parameter; false on failure. */
static bool uniform(tg_tensor *t, tg_rng *rng, double k)
{
    if (!t) return false;
    if (!rng) {
        tg_error_set(TG_ERR_NULL, "bad argument to layer constructor (NULL generator)");
        return false;
    }
    return tg_init_uniform(t, rng, -k, k) == TG_OK;
}

/* A zeroed layer object, or NULL with TG_ERR_NOMEM. */
static void *layer_alloc(size_t size)
{
    void *p = calloc(1, size);
    if (!p) tg_error_set(TG_ERR_NOMEM, "out of memory for a layer");
    return p;
}

/* x W^T (+ b): one affine node with a bias; without one, matmul with the
 * transpose as a strided view, passed to GEMM as a flag. */
static tg_tensor *linear_map(tg_tensor *x, tg_tensor *w, tg_tensor *b)
{
    return b ? tg_affine(x, w, b) : tg_matmul(x, tg_transpose(w, 0, 1));
}

/* ---- Linear */
struct tg_linear {
    tg_tensor *w, *b;
};

/* "<name>.weight" of wshape (out = wshape[0]) and, if bias, "<name>.bias"
 * of (out), both uniform in [-k, k), drawn in that order. */
static bool weight_and_bias(tg_params *ps, const char *name, tg_dtype dtype, int ndim,
                            const int64_t *wshape, bool bias, tg_rng *rng, double k,
                            tg_tensor **w, tg_tensor **b)
{
    *w = add(ps, name, "weight", dtype, ndim, wshape, false);
    bool ok = uniform(*w, rng, k);
    if (ok && bias) {
        *b = add(ps, name, "bias", dtype, 1, &wshape[0], false);
        ok = uniform(*b, rng, k);
    }
    return ok;
}

tg_linear *tg_linear_new(tg_params *ps, const char *name, int64_t in, int64_t out, bool bias,
                         tg_dtype dtype, tg_rng *rng)
{
    if (!positive("in features", in) || !positive("out features", out)) return NULL;
    tg_linear *l = layer_alloc(sizeof *l);
    if (!l) return NULL;
    double k = 1.0 / sqrt((double)in);
    if (!weight_and_bias(ps, name, dtype, 2, (int64_t[]){out, in}, bias, rng, k, &l->w, &l->b)) {
        free(l);
        return NULL;
    }
    return l;
}

tg_tensor *tg_linear_forward(const tg_linear *l, tg_tensor *x)
{
    if (!l) {
        tg_error_set(TG_ERR_NULL, "bad argument #1 to 'linear_forward' (NULL layer)");
        return NULL;
    }
    tg_scope_begin();
    return finish(linear_map(x, l->w, l->b));
}

tg_tensor *tg_linear_weight(const tg_linear *l)
{
    return l ? l->w : NULL;
}

tg_tensor *tg_linear_bias(const tg_linear *l)
{
    return l ? l->b : NULL;
}

void tg_linear_free(tg_linear *l)
{
    free(l);
}

/* ---- Conv2d */
struct tg_conv2d_layer {
    tg_tensor *w, *b;
    tg_conv2d_opts opts;
};

tg_conv2d_layer *tg_conv2d_layer_new(tg_params *ps, const char *name, int64_t in, int64_t out,
                                     int kh, int kw, const tg_conv2d_opts *opts, bool bias,
                                     tg_dtype dtype, tg_rng *rng)
{
    tg_conv2d_opts o = {0};
    if (opts) o = *opts;
    int groups = o.groups > 0 ? o.groups : 1;
    if (!positive("in channels", in) || !positive("out channels", out) ||
        !positive("kernel height", kh) || !positive("kernel width", kw))
        return NULL;
    if (in % groups || out % groups) {
        tg_error_set(TG_ERR_INVALID, "bad argument to 'conv2d_layer_new' (groups %d must divide "
                                     "%lld in and %lld out channels)", groups, (long long)in,
                     (long long)out);
        return NULL;
    }
    tg_conv2d_layer *l = layer_alloc(sizeof *l);
    if (!l) return NULL;
    l->opts = o;
    double k = 1.0 / sqrt((double)(in / groups * kh * kw));
    if (!weight_and_bias(ps, name, dtype, 4, (int64_t[]){out, in / groups, kh, kw}, bias, rng, k,
                         &l->w, &l->b)) {
        free(l);
        return NULL;
    }
    return l;
}

tg_tensor *tg_conv2d_layer_forward(const tg_conv2d_layer *l, tg_tensor *x)
{
    if (!l) {
        tg_error_set(TG_ERR_NULL, "bad argument #1 to 'conv2d_layer_forward' (NULL layer)");
        return NULL;
    }
    return tg_conv2d(x, l->w, l->b, &l->opts);
}

tg_tensor *tg_conv2d_layer_forward_relu(const tg_conv2d_layer *l, tg_tensor *x)
{
    if (!l) {
        tg_error_set(TG_ERR_NULL, "bad argument #1 to 'conv2d_layer_forward_relu' (NULL layer)");
        return NULL;
    }
    return tg_conv2d_relu(x, l->w, l->b, &l->opts);
}

tg_tensor *tg_conv2d_layer_weight(const tg_conv2d_layer *l)
{
    return l ? l->w : NULL;
}

void tg_conv2d_layer_free(tg_conv2d_layer *l)
{
    free(l);
}

/* ---- LayerNorm */
struct tg_layer_norm_layer {
    tg_tensor *w, *b;
    int ndims;
    double eps;
};

tg_layer_norm_layer *tg_layer_norm_layer_new(tg_params *ps, const char *name, int ndims,
                                             const int64_t *shape, double eps, tg_dtype dtype)
{
    if (ndims < 1 || ndims > TG_MAX_DIMS || !shape) {
        tg_error_set(TG_ERR_INVALID, "bad argument #3 to 'layer_norm_layer_new' (%d dims)", ndims);
        return NULL;
    }
    tg_layer_norm_layer *l = layer_alloc(sizeof *l);
    if (!l) return NULL;
    l->ndims = ndims;
    l->eps = eps;
    l->w = add(ps, name, "weight", dtype, ndims, shape, false);
    l->b = l->w ? add(ps, name, "bias", dtype, ndims, shape, false) : NULL;
    if (!l->b || tg_init_constant(l->w, 1.0)) {
        free(l);
        return NULL;
    }
    return l;
}

tg_tensor *tg_layer_norm_layer_forward(const tg_layer_norm_layer *l, tg_tensor *x)
{
    if (!l) {
        tg_error_set(TG_ERR_NULL, "bad argument #1 to 'layer_norm_layer_forward' (NULL layer)");
        return NULL;
    }
    return tg_layer_norm(x, l->ndims, l->w, l->b, l->eps);
}

void tg_layer_norm_layer_free(tg_layer_norm_layer *l)
{
    free(l);
}

/* ---- BatchNorm */
struct tg_batch_norm_layer {
    tg_tensor *w, *b, *mean, *var;
    double momentum, eps;
};

tg_batch_norm_layer *tg_batch_norm_layer_new(tg_params *ps, const char *name, int64_t channels,
                                             double momentum, double eps, tg_dtype dtype)
{
    if (!positive("channels", channels)) return NULL;
    tg_batch_norm_layer *l = layer_alloc(sizeof *l);
    if (!l) return NULL;
    l->momentum = momentum;
    l->eps = eps;
    l->w = add(ps, name, "weight", dtype, 1, &channels, false);
    l->b = l->w ? add(ps, name, "bias", dtype, 1, &channels, false) : NULL;
    l->mean = l->b ? add(ps, name, "running_mean", dtype, 1, &channels, true) : NULL;
    l->var = l->mean ? add(ps, name, "running_var", dtype, 1, &channels, true) : NULL;
    if (!l->var || tg_init_constant(l->w, 1.0) || tg_init_constant(l->var, 1.0)) {
        free(l);
        return NULL;
    }
    return l;
}

tg_tensor *tg_batch_norm_layer_forward(const tg_batch_norm_layer *l, tg_tensor *x, bool training)
{
    if (!l) {
        tg_error_set(TG_ERR_NULL, "bad argument #1 to 'batch_norm_layer_forward' (NULL layer)");
        return NULL;
    }
    return tg_batch_norm(x, l->w, l->b, l->mean, l->var, training, l->momentum, l->eps);
}

void tg_batch_norm_layer_free(tg_batch_norm_layer *l)
{
    free(l);
}

/* ---- Embedding */
struct tg_embedding_layer {
    tg_tensor *w;
};

tg_embedding_layer *tg_embedding_layer_new(tg_params *ps, const char *name, int64_t count,
                                           int64_t dim, tg_dtype dtype, tg_rng *rng)
{
    if (!positive("embedding count", count) || !positive("embedding dim", dim)) return NULL;
    if (!rng) {
        tg_error_set(TG_ERR_NULL, "bad argument to 'embedding_layer_new' (NULL generator)");
        return NULL;
    }
    tg_embedding_layer *l = layer_alloc(sizeof *l);
    if (!l) return NULL;
    l->w = add(ps, name, "weight", dtype, 2, (int64_t[]){count, dim}, false);
    if (!l->w || tg_init_normal(l->w, rng, 0.0, 1.0)) {
        free(l);
        return NULL;
    }
    return l;
}

tg_tensor *tg_embedding_layer_forward(const tg_embedding_layer *l, tg_tensor *ids)
{
    if (!l) {
        tg_error_set(TG_ERR_NULL, "bad argument #1 to 'embedding_layer_forward' (NULL layer)");
        return NULL;
    }
    return tg_embedding(l->w, ids);
}

void tg_embedding_layer_free(tg_embedding_layer *l)
{
    free(l);
}

/* ---- recurrent cells: weight_ih, weight_hh, bias_ih, bias_hh */
typedef struct {
    tg_tensor *wih, *whh, *bih, *bhh;
    int64_t hidden;
} cell_params;

static bool cell_init(cell_params *c, tg_params *ps, const char *name, int64_t in, int64_t hidden,
                      int gates, tg_dtype dt, tg_rng *rng)
{
    if (!positive("input size", in) || !positive("hidden size", hidden)) return false;
    int64_t g = gates * hidden;
    double k = 1.0 / sqrt((double)hidden);
    c->hidden = hidden;
    c->wih = add(ps, name, "weight_ih", dt, 2, (int64_t[]){g, in}, false);
    if (!uniform(c->wih, rng, k)) return false;
    c->whh = add(ps, name, "weight_hh", dt, 2, (int64_t[]){g, hidden}, false);
    if (!uniform(c->whh, rng, k)) return false;
    c->bih = add(ps, name, "bias_ih", dt, 1, &g, false);
    if (!uniform(c->bih, rng, k)) return false;
    c->bhh = add(ps, name, "bias_hh", dt, 1, &g, false);
    return uniform(c->bhh, rng, k);
}

/* A recurrent layer object of size bytes whose first member is its
 * cell_params (the cells and the LSTM layer), its parameters added and
 * drawn; NULL (error set) on failure. */
static void *cell_new(size_t size, tg_params *ps, const char *name, int64_t in, int64_t hidden,
                      int gates, tg_dtype dt, tg_rng *rng)
{
    cell_params *c = layer_alloc(size);
    if (c && !cell_init(c, ps, name, in, hidden, gates, dt, rng)) {
        free(c);
        return NULL;
    }
    return c;
}

static tg_tensor *cell_preact(const cell_params *c, tg_tensor *x, tg_tensor *h)
{
    return tg_add(linear_map(x, c->wih, c->bih), linear_map(h, c->whh, c->bhh));
}

struct tg_rnn_cell {
    cell_params p;
};

tg_rnn_cell *tg_rnn_cell_new(tg_params *ps, const char *name, int64_t in, int64_t hidden,
                             tg_dtype dtype, tg_rng *rng)
{
    return cell_new(sizeof(tg_rnn_cell), ps, name, in, hidden, 1, dtype, rng);
}

tg_tensor *tg_rnn_cell_forward(const tg_rnn_cell *cell, tg_tensor *x, tg_tensor *h)
{
    if (!cell) {
        tg_error_set(TG_ERR_NULL, "bad argument #1 to 'rnn_cell_forward' (NULL cell)");
        return NULL;
    }
    tg_scope_begin();
    return finish(tg_tanh(cell_preact(&cell->p, x, h)));
}

void tg_rnn_cell_free(tg_rnn_cell *cell)
{
    free(cell);
}

struct tg_lstm_cell {
    cell_params p;
};

tg_lstm_cell *tg_lstm_cell_new(tg_params *ps, const char *name, int64_t in, int64_t hidden,
                               tg_dtype dtype, tg_rng *rng)
{
    return cell_new(sizeof(tg_lstm_cell), ps, name, in, hidden, 4, dtype, rng);
}

tg_status tg_lstm_cell_forward(const tg_lstm_cell *cell, tg_tensor *x, tg_tensor *h, tg_tensor *c,
                               tg_tensor **h_out, tg_tensor **c_out)
{
    if (!h_out || !c_out)
        return tg_error_set(TG_ERR_NULL, "bad argument to 'lstm_cell_forward' (NULL output)");
    *h_out = *c_out = NULL;
    if (!cell) return tg_error_set(TG_ERR_NULL, "bad argument #1 to 'lstm_cell_forward' (NULL cell)");
    tg_scope_begin();
    tg_tensor *y = tg_lstm_gates(cell_preact(&cell->p, x, h), c);
    int nd = y ? tg_tensor_ndim(y) - 1 : 0;
    tg_tensor *h2 = y ? tg_reshape(tg_narrow(y, 0, 0, 1), nd, tg_tensor_shape(y) + 1) : NULL;
    tg_tensor *c2 = y ? tg_reshape(tg_narrow(y, 0, 1, 1), nd, tg_tensor_shape(y) + 1) : NULL;
    if (!h2 || !c2) {
        tg_scope_end();
        return tg_last_error() ? tg_last_error() : TG_ERR_INTERNAL;
    }
    tg_scope_keep(c2);
    *h_out = finish(h2);
    *c_out = tg__scope_track(c2);
    return TG_OK;
}

void tg_lstm_cell_free(tg_lstm_cell *cell)
{
    free(cell);
}

/* ---- LSTM over a sequence: the cell's parameters, one lstm op. */
struct tg_lstm_layer {
    cell_params p;
    tg_lstm_opts opts;
};

tg_lstm_layer *tg_lstm_layer_new(tg_params *ps, const char *name, int64_t in, int64_t hidden,
                                 tg_dtype dtype, tg_rng *rng)
{
    return cell_new(sizeof(tg_lstm_layer), ps, name, in, hidden, 4, dtype, rng);
}

/* The initial h or c (argument #arg) as (1, batch..., H) of x's dtype and
 * backend: v reshaped, or zeros for NULL; NULL after an error. */
static tg_tensor *lstm_state(tg_tensor *v, tg_tensor *x, int64_t H, int arg)
{
    int nd = tg_tensor_ndim(x);
    int64_t shape[TG_MAX_DIMS];
    shape[0] = 1;
    memcpy(shape + 1, tg_tensor_shape(x) + 1, (size_t)(nd - 2) * sizeof *shape);
    shape[nd - 1] = H;
    if (!v) return tg_to_device(tg_zeros(tg_tensor_dtype(x), nd, shape), tg_tensor_backend(x));
    char s1[96], s2[96], s3[96];
    if (tg_tensor_ndim(v) != nd - 1 ||
        memcmp(tg_tensor_shape(v), shape + 1, (size_t)(nd - 1) * sizeof *shape)) {
        tg_error_set(TG_ERR_SHAPE, "bad argument #%d to 'lstm_layer_forward' (%s %s; need %s "
                                   "from inputs %s)", arg, arg == 3 ? "h0" : "c0",
                     tg_shape_str(tg_tensor_ndim(v), tg_tensor_shape(v), s1, sizeof s1),
                     tg_shape_str(nd - 1, shape + 1, s2, sizeof s2),
                     tg_shape_str(nd, tg_tensor_shape(x), s3, sizeof s3));
        return NULL;
    }
    return tg_reshape(v, nd, shape);
}

tg_status tg_lstm_layer_forward(const tg_lstm_layer *l, tg_tensor *x, tg_tensor *h0,
                                tg_tensor *c0, tg_tensor **out, tg_tensor **h_n,
                                tg_tensor **c_n)
{
    tg_tensor **res[3] = {out, h_n, c_n};
    for (int i = 0; i < 3; i++)
        if (res[i]) *res[i] = NULL;
    if (!out && !h_n && !c_n)
        return tg_error_set(TG_ERR_NULL, "bad argument to 'lstm_layer_forward' (no output "
                                         "asked for: out, h_n and c_n all NULL)");
    if (!l) return tg_error_set(TG_ERR_NULL, "bad argument #1 to 'lstm_layer_forward' (NULL "
                                             "layer)");
    if (!x) return tg_error_set(TG_ERR_NULL, "bad argument #2 to 'lstm_layer_forward' (NULL "
                                             "inputs)");
    int nd = tg_tensor_ndim(x);
    if (nd < 2)
        return tg_error_set(TG_ERR_SHAPE, "bad argument #2 to 'lstm_layer_forward' (%d dims; "
                                          "need (T, B, in) or (T, in))", nd);
    tg_scope_begin();
    int64_t H = l->p.hidden, T = tg_tensor_shape(x)[0];
    tg_tensor *st[2] = {lstm_state(h0, x, H, 3), NULL};
    st[1] = st[0] ? lstm_state(c0, x, H, 4) : NULL;
    tg_tensor *wp[2] = {l->p.wih, l->p.whh};
    tg_tensor *y = st[1] ? tg_lstm(x, tg_concat(2, st, 0), tg_concat(2, wp, 1),
                                   tg_add(l->p.bih, l->p.bhh), &l->opts)
                         : NULL;
    /* Views of y: the output sequence, and the final state through one
     * narrow along T (so that backward pads one gradient to y's shape). */
    tg_tensor *r[3] = {NULL, NULL, NULL};
    const int64_t *ys = y ? tg_tensor_shape(y) : NULL;
    if (y && out && !(r[0] = tg_reshape(tg_narrow(y, 0, 0, 1), nd, ys + 1))) y = NULL;
    tg_tensor *fin = y && (h_n || c_n) ? tg_narrow(y, 1, T - 1, 1) : NULL;
    for (int k = 0; k < 2 && y; k++)
        if (res[k + 1] && !(r[k + 1] = tg_reshape(tg_narrow(fin, 0, k, 1), nd - 1, ys + 2)))
            y = NULL;
    if (!y) {
        tg_status e = tg_last_error();
        tg_scope_end();
        return e ? e : TG_ERR_INTERNAL;
    }
    for (int i = 0; i < 3; i++)
        if (res[i]) tg_scope_keep(r[i]);
    tg_scope_end();
    for (int i = 0; i < 3; i++)
        if (res[i]) *res[i] = tg__scope_track(r[i]);
    return TG_OK;
}

tg_status tg_lstm_layer_set_opts(tg_lstm_layer *l, const tg_lstm_opts *opts)
{
    if (!l)
        return tg_error_set(TG_ERR_NULL, "bad argument #1 to 'lstm_layer_set_opts' (NULL "
                                         "layer)");
    l->opts = opts ? *opts : (tg_lstm_opts){0};
    return TG_OK;
}

void tg_lstm_layer_free(tg_lstm_layer *l)
{
    free(l);
}
