/* Layers and losses against PyTorch golden values
 * (tests/golden_layers/layers.txt, made by tools/torch_layers_golden.py),
 * plus parameter naming, initialisation ranges and error codes. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tapegrad.h>

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define MAXREC 32

typedef struct {
    char kind[8], name[32];
    tg_dtype dtype;
    int ndim;
    int64_t shape[TG_MAX_DIMS];
    int64_t n;
    double *v;
} record;

typedef struct {
    record r[MAXREC];
    int n;
} golden_case;

/* Reads the case called name from the golden file. */
static void load_case(const char *name, golden_case *gc)
{
    char path[4096];
    const char *root = getenv("TG_SOURCE_ROOT");
    snprintf(path, sizeof path, "%s/tests/golden_layers/layers.txt", root ? root : ".");
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "cannot open %s", path);
    static char line[1 << 16];
    bool in = false;
    gc->n = 0;
    while (fgets(line, sizeof line, f)) {
        char kind[8], nm[32];
        int off = 0;
        if (sscanf(line, "%7s %31s %n", kind, nm, &off) < 2) continue;
        if (strcmp(kind, "case") == 0) {
            if (in) break;
            in = strcmp(nm, name) == 0;
            continue;
        }
        if (!in) continue;
        cr_assert_lt(gc->n, MAXREC);
        record *r = &gc->r[gc->n++];
        memset(r, 0, sizeof *r);
        strcpy(r->kind, kind);
        strcpy(r->name, nm);
        char *p = line + off, *end;
        r->dtype = TG_F64;
        if (strcmp(kind, "tensor") == 0) {
            r->dtype = strncmp(p, "i64", 3) == 0 ? TG_I64 : TG_F64;
            p += 4;
        }
        if (strcmp(kind, "tensor") == 0 || strcmp(kind, "value") == 0) {
            r->ndim = (int)strtol(p, &end, 10);
            p = end;
            for (int d = 0; d < r->ndim; d++) {
                r->shape[d] = strtoll(p, &end, 10);
                p = end;
            }
        }
        r->v = malloc(sizeof(double) * 4096);
        while (1) {
            double x = strtod(p, &end);
            if (end == p) break;
            r->v[r->n++] = x;
            p = end;
        }
    }
    fclose(f);
    cr_assert_gt(gc->n, 0, "no golden case '%s'", name);
}

static void free_case(golden_case *gc)
{
    for (int i = 0; i < gc->n; i++) free(gc->r[i].v);
}

static record *find(golden_case *gc, const char *kind, const char *name)
{
    for (int i = 0; i < gc->n; i++)
        if (!strcmp(gc->r[i].kind, kind) && !strcmp(gc->r[i].name, name)) return &gc->r[i];
    return NULL;
}

/* A new tensor with a tensor record's values. */
static tg_tensor *input(golden_case *gc, const char *name)
{
    record *r = find(gc, "tensor", name);
    cr_assert_not_null(r, "no input %s", name);
    if (r->dtype == TG_I64) {
        int64_t *iv = malloc(sizeof(int64_t) * (size_t)r->n);
        for (int64_t i = 0; i < r->n; i++) iv[i] = (int64_t)r->v[i];
        tg_tensor *t = tg_tensor_from_data(TG_I64, r->ndim, r->shape, iv);
        free(iv);
        return t;
    }
    return tg_tensor_from_data(TG_F64, r->ndim, r->shape, r->v);
}

static double param(golden_case *gc, const char *name)
{
    record *r = find(gc, "param", name);
    cr_assert_not_null(r);
    return r->v[0];
}

static void expect_close(const char *what, const tg_tensor *t, const double *want, int64_t n)
{
    cr_assert_not_null(t, "%s missing: %s", what, tg_last_error_message());
    cr_assert_eq(tg_tensor_numel(t), n, "%s has %lld elements, want %lld", what,
                 (long long)tg_tensor_numel(t), (long long)n);
    for (int64_t i = 0; i < n; i++) {
        double v;
        tg_tensor_get(t, i, &v);
        cr_expect(fabs(v - want[i]) <= 1e-10 * fmax(1.0, fabs(want[i])), "%s[%lld]: %.17g vs %.17g",
                  what, (long long)i, v, want[i]);
    }
}

static void expect_grad(golden_case *gc, const char *name, tg_tensor *leaf)
{
    record *g = find(gc, "grad", name);
    cr_assert_not_null(g, "no golden grad for %s", name);
    expect_close(name, tg_grad(leaf), g->v, g->n);
}

typedef enum { CE, NLL, BCE, HUBER, MSE } loss_kind;

/* Runs one golden loss case: first input is the prediction (tracked). */
static void loss_case(const char *name, loss_kind kind, const char *pred_name,
                      const char *target_name, const char *weight_name)
{
    golden_case gc;
    load_case(name, &gc);
    tg_tape *tape = tg_tape_new(NULL);
    tg_scope_begin();
    tg_tensor *pred = input(&gc, pred_name), *target = input(&gc, target_name);
    tg_tensor *w = weight_name ? input(&gc, weight_name) : NULL;
    cr_assert_eq(tg_requires_grad(tape, pred), TG_OK);
    bool target_tracked = tg_tensor_dtype(target) == TG_F64 && find(&gc, "grad", target_name);
    if (target_tracked) cr_assert_eq(tg_requires_grad(tape, target), TG_OK);
    tg_tensor *loss = NULL;
    switch (kind) {
    case CE: {
        tg_cross_entropy_opts o = {.weight = w};
        if (find(&gc, "param", "smoothing")) o.label_smoothing = param(&gc, "smoothing");
        loss = tg_loss_cross_entropy(pred, target, &o);
        break;
    }
    case NLL: loss = tg_loss_nll(pred, target, w); break;
    case BCE: loss = tg_loss_bce_with_logits(pred, target, w); break;
    case HUBER: loss = tg_loss_huber(pred, target, param(&gc, "delta")); break;
    case MSE: loss = tg_loss_mse(pred, target); break;
    }
    expect_close("loss", loss, find(&gc, "value", "out0")->v, 1);
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    expect_grad(&gc, pred_name, pred);
    if (target_tracked) expect_grad(&gc, target_name, target);
    tg_scope_end();
    tg_tape_free(tape);
    free_case(&gc);
}

Test(layers, cross_entropy_matches_torch)
{
    loss_case("cross_entropy_plain", CE, "logits", "targets", NULL);
}
Test(layers, cross_entropy_with_label_smoothing_matches_torch)
{
    loss_case("cross_entropy_smoothing", CE, "logits", "targets", NULL);
}
Test(layers, cross_entropy_with_class_weights_matches_torch)
{
    loss_case("cross_entropy_weight", CE, "logits", "targets", "weight");
}
Test(layers, cross_entropy_with_weights_and_smoothing_matches_torch)
{
    loss_case("cross_entropy_weight_smoothing", CE, "logits", "targets", "weight");
}
Test(layers, weighted_nll_matches_torch)
{
    loss_case("nll_weight", NLL, "logp", "targets", "weight");
}
Test(layers, bce_with_logits_matches_torch)
{
    loss_case("bce_with_logits", BCE, "x", "y", NULL);
}
Test(layers, bce_with_logits_and_pos_weight_matches_torch)
{
    loss_case("bce_with_logits_pos_weight", BCE, "x", "y", "pos_weight");
}
Test(layers, huber_matches_torch)
{
    loss_case("huber", HUBER, "pred", "target", NULL);
}
Test(layers, mse_matches_torch)
{
    loss_case("mse", MSE, "pred", "target", NULL);
}

/* Copies the golden input called field into parameter "cell.<field>". */
static void set_param(golden_case *gc, tg_params *ps, const char *field)
{
    char full[64];
    snprintf(full, sizeof full, "cell.%s", field);
    tg_tensor *p = tg_params_find(ps, full);
    cr_assert_not_null(p, "no parameter %s", full);
    record *r = find(gc, "tensor", field);
    cr_assert_eq(tg_tensor_numel(p), r->n, "%s has the wrong size", full);
    memcpy(tg_tensor_data(p), r->v, (size_t)r->n * sizeof(double));
}

static const char *const cell_fields[4] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};

static void cell_case(bool lstm)
{
    golden_case gc;
    load_case(lstm ? "lstm_cell" : "rnn_cell", &gc);
    tg_rng rng;
    tg_rng_seed(&rng, 1);
    tg_params *ps = tg_params_new();
    void *cell = lstm ? (void *)tg_lstm_cell_new(ps, "cell", 4, 5, TG_F64, &rng)
                      : (void *)tg_rnn_cell_new(ps, "cell", 4, 5, TG_F64, &rng);
    cr_assert_not_null(cell, "%s", tg_last_error_message());
    for (int i = 0; i < 4; i++) set_param(&gc, ps, cell_fields[i]);
    tg_tape *tape = tg_tape_new(NULL);
    cr_assert_eq(tg_params_requires_grad(ps, tape), TG_OK);
    tg_scope_begin();
    tg_tensor *x = input(&gc, "x"), *h = input(&gc, "h"), *c = lstm ? input(&gc, "c") : NULL;
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    cr_assert_eq(tg_requires_grad(tape, h), TG_OK);
    if (c) cr_assert_eq(tg_requires_grad(tape, c), TG_OK);
    tg_tensor *loss;
    if (lstm) {
        tg_tensor *h2, *c2;
        cr_assert_eq(tg_lstm_cell_forward(cell, x, h, c, &h2, &c2), TG_OK, "%s",
                     tg_last_error_message());
        expect_close("h'", h2, find(&gc, "value", "out0")->v, find(&gc, "value", "out0")->n);
        expect_close("c'", c2, find(&gc, "value", "out1")->v, find(&gc, "value", "out1")->n);
        loss = tg_add(tg_sum(h2), tg_sum(c2));
    } else {
        tg_tensor *h2 = tg_rnn_cell_forward(cell, x, h);
        expect_close("h'", h2, find(&gc, "value", "out0")->v, find(&gc, "value", "out0")->n);
        loss = tg_sum(h2);
    }
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    expect_grad(&gc, "x", x);
    expect_grad(&gc, "h", h);
    if (c) expect_grad(&gc, "c", c);
    for (int i = 0; i < 4; i++) {
        char full[64];
        snprintf(full, sizeof full, "cell.%s", cell_fields[i]);
        expect_grad(&gc, cell_fields[i], tg_params_find(ps, full));
    }
    tg_scope_end();
    tg_tape_free(tape);
    if (lstm)
        tg_lstm_cell_free(cell);
    else
        tg_rnn_cell_free(cell);
    tg_params_free(ps);
    free_case(&gc);
}

Test(layers, rnn_cell_matches_torch)
{
    cell_case(false);
}

Test(layers, lstm_cell_matches_torch)
{
    cell_case(true);
}

Test(layers, linear_uses_torch_names_layout_and_init_range)
{
    tg_rng rng;
    tg_rng_seed(&rng, 4);
    tg_params *ps = tg_params_new();
    tg_linear *l = tg_linear_new(ps, "fc", 16, 3, true, TG_F32, &rng);
    cr_assert_not_null(l);
    cr_assert_eq(tg_params_count(ps), 2);
    cr_assert_str_eq(tg_params_name(ps, 0), "fc.weight");
    cr_assert_str_eq(tg_params_name(ps, 1), "fc.bias");
    tg_tensor *w = tg_linear_weight(l);
    cr_assert_eq(tg_tensor_dim(w, 0), 3);
    cr_assert_eq(tg_tensor_dim(w, 1), 16);
    double k = 1.0 / sqrt(16.0), lo = 1, hi = -1;
    for (int64_t i = 0; i < tg_tensor_numel(w); i++) {
        double v;
        tg_tensor_get(w, i, &v);
        lo = fmin(lo, v);
        hi = fmax(hi, v);
    }
    cr_assert(lo >= -k && hi <= k && hi - lo > k, "weights in [%g, %g], k = %g", lo, hi, k);
    /* y = x W^T + b */
    tg_scope_begin();
    tg_tensor *x = tg_ones(TG_F32, 2, SHAPE(2, 16));
    tg_tensor *y = tg_linear_forward(l, x);
    cr_assert_eq(tg_tensor_dim(y, 1), 3);
    double want = 0, got, b;
    for (int j = 0; j < 16; j++) {
        double v;
        tg_tensor_get(w, 1 * 16 + j, &v);
        want += v;
    }
    tg_tensor_get(tg_linear_bias(l), 1, &b);
    tg_tensor_get(y, 1, &got);
    cr_assert_float_eq(got, want + b, 1e-5);
    tg_scope_end();
    tg_linear_free(l);
    tg_params_free(ps);
}

Test(layers, norm_embedding_and_conv_layers_register_their_parameters)
{
    tg_rng rng;
    tg_rng_seed(&rng, 5);
    tg_params *ps = tg_params_new();
    tg_conv2d_layer *conv = tg_conv2d_layer_new(ps, "conv", 1, 4, 3, 3, NULL, true, TG_F64, &rng);
    tg_batch_norm_layer *bn = tg_batch_norm_layer_new(ps, "bn", 4, 0.1, 1e-5, TG_F64);
    int64_t shape[1] = {4};
    tg_layer_norm_layer *ln = tg_layer_norm_layer_new(ps, "ln", 1, shape, 1e-5, TG_F64);
    tg_embedding_layer *emb = tg_embedding_layer_new(ps, "emb", 10, 4, TG_F64, &rng);
    cr_assert(conv && bn && ln && emb, "%s", tg_last_error_message());
    cr_assert_geq(tg_params_index(ps, "bn.running_mean"), 0);
    cr_assert_not(tg_params_trainable(ps, tg_params_index(ps, "bn.running_var")));
    cr_assert(tg_params_trainable(ps, tg_params_index(ps, "emb.weight")));
    tg_scope_begin();
    tg_tensor *x = tg_rand_normal(&rng, TG_F64, 4, SHAPE(2, 1, 6, 6), 0, 1);
    tg_tensor *y = tg_batch_norm_layer_forward(bn, tg_relu(tg_conv2d_layer_forward(conv, x)), true);
    cr_assert_not_null(y, "%s", tg_last_error_message());
    cr_assert_eq(tg_tensor_dim(y, 2), 4);
    int64_t ids[3] = {0, 9, 9};
    tg_tensor *e = tg_layer_norm_layer_forward(
        ln, tg_embedding_layer_forward(emb, tg_tensor_from_data(TG_I64, 1, SHAPE(3), ids)));
    cr_assert_not_null(e, "%s", tg_last_error_message());
    double m = 0;
    for (int j = 0; j < 4; j++) {
        double v;
        tg_tensor_get(e, 4 + j, &v);
        m += v;
    }
    cr_assert_float_eq(m, 0.0, 1e-9);
    tg_scope_end();
    tg_conv2d_layer_free(conv);
    tg_batch_norm_layer_free(bn);
    tg_layer_norm_layer_free(ln);
    tg_embedding_layer_free(emb);
    tg_params_free(ps);
}

Test(layers, bad_arguments_fail_with_exact_codes)
{
    tg_rng rng;
    tg_rng_seed(&rng, 6);
    tg_params *ps = tg_params_new();
    cr_assert_null(tg_linear_new(ps, "a", 0, 3, true, TG_F32, &rng));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    cr_assert_null(tg_linear_new(NULL, "a", 2, 3, true, TG_F32, &rng));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
    tg_linear *l = tg_linear_new(ps, "a", 2, 3, true, TG_F32, &rng);
    cr_assert_null(tg_linear_new(ps, "a", 2, 3, true, TG_F32, &rng));
    cr_assert_eq(tg_last_error(), TG_ERR_EXISTS);
    tg_scope_begin();
    tg_tensor *logits = tg_zeros(TG_F64, 2, SHAPE(3, 4));
    tg_tensor *t = tg_zeros(TG_F64, 1, SHAPE(3));
    cr_assert_null(tg_loss_cross_entropy(logits, t, NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
    tg_cross_entropy_opts o = {.label_smoothing = 1.5};
    cr_assert_null(tg_loss_cross_entropy(logits, tg_zeros(TG_I64, 1, SHAPE(3)), &o));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    cr_assert_null(tg_loss_nll(logits, tg_zeros(TG_I64, 1, SHAPE(2)), NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    cr_assert_null(tg_loss_huber(logits, logits, 0.0));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    tg_error_clear();
    cr_assert_null(tg_linear_forward(l, tg_mul(NULL, logits)));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
    tg_error_clear();
    cr_assert_null(tg_conv2d_layer_forward_relu(NULL, logits));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
    cr_expect(strstr(tg_last_error_message(), "conv2d_layer_forward_relu"), "%s",
              tg_last_error_message());
    tg_error_clear();
    tg_conv2d_layer *c = tg_conv2d_layer_new(ps, "c", 2, 3, 3, 3, NULL, true, TG_F64, &rng);
    cr_assert_not_null(c, "%s", tg_last_error_message());
    cr_assert_null(tg_conv2d_layer_forward_relu(c, logits)); /* 2 dims, not 4 */
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE, "%s", tg_last_error_message());
    cr_expect(strstr(tg_last_error_message(), "conv2d_relu"), "%s", tg_last_error_message());
    tg_scope_end();
    tg_conv2d_layer_free(c);
    tg_linear_free(l);
    tg_params_free(ps);
}

/* ---- tg_sequential: a small CNN (conv2d, relu, flatten, linear, layer
 * norm, tanh, a custom stage) gives the op-by-op forward's output and
 * gradients bit for bit, with and without segments (its conv and relu as
 * one conv2d_relu op), while its tensor peak
 * over forward and backward in one scope is what the tape keeps plus one
 * stage's values, not every intermediate. */
typedef struct {
    tg_params *ps;
    tg_conv2d_layer *conv;
    tg_linear *fc1, *fc2;
    tg_layer_norm_layer *ln;
    tg_sequential *seq;
} cnn;

static tg_tensor *scale_stage(void *ud, int layer, tg_tensor *x)
{
    cr_expect_eq(layer, 7, "a stage gets its index in the container");
    return tg_mul_scalar(x, *(const double *)ud);
}

static const double half = 0.5;

static void cnn_build(cnn *m)
{
    tg_rng rng;
    tg_rng_seed(&rng, 17);
    m->ps = tg_params_new();
    m->conv = tg_conv2d_layer_new(m->ps, "conv", 1, 4, 3, 3, NULL, true, TG_F64, &rng);
    m->fc1 = tg_linear_new(m->ps, "fc1", 4 * 10 * 10, 32, true, TG_F64, &rng);
    m->ln = tg_layer_norm_layer_new(m->ps, "ln", 1, SHAPE(32), 1e-5, TG_F64);
    m->fc2 = tg_linear_new(m->ps, "fc2", 32, 5, true, TG_F64, &rng);
    m->seq = tg_sequential_new();
    cr_assert(m->conv && m->fc1 && m->ln && m->fc2 && m->seq, "%s", tg_last_error_message());
    cr_assert_eq(tg_sequential_add_conv2d(m->seq, m->conv), TG_OK);
    cr_assert_eq(tg_sequential_add_map(m->seq, tg_relu), TG_OK);
    cr_assert_eq(tg_sequential_add_flatten(m->seq), TG_OK);
    cr_assert_eq(tg_sequential_add_linear(m->seq, m->fc1), TG_OK);
    cr_assert_eq(tg_sequential_add_layer_norm(m->seq, m->ln), TG_OK);
    cr_assert_eq(tg_sequential_add_map(m->seq, tg_tanh), TG_OK);
    cr_assert_eq(tg_sequential_add_linear(m->seq, m->fc2), TG_OK);
    cr_assert_eq(tg_sequential_add_stage(m->seq, scale_stage, (void *)&half), TG_OK);
    cr_assert_eq(tg_sequential_count(m->seq), 8);
}

static void cnn_free(cnn *m)
{
    tg_sequential_free(m->seq);
    tg_conv2d_layer_free(m->conv);
    tg_linear_free(m->fc1);
    tg_linear_free(m->fc2);
    tg_layer_norm_layer_free(m->ln);
    tg_params_free(m->ps);
}

/* mode 0: op by op; 1: the container without segments; 2: with sqrt(8)
 * groups; 3: 8 groups (each stage its own segment, so the relu after the
 * conv, which the container runs inside the conv's stage as conv2d_relu,
 * is a segment that passes its input on); 4 and 5: binomial with 2 and 3
 * slots. The loss into *loss, every parameter gradient into g (caller
 * frees), the tensor peak above what was live before as the result. */
#define CNN_MODES 6
static const int cnn_nsegments[CNN_MODES] = {0, 1, 0, 8, -2, -3};

/* Whether the tape's profile has a row for op. */
static bool profiled(const tg_tape *tape, const char *op)
{
    tg_profile_row rows[32];
    int n = tg_tape_profile_rows(tape, rows, 32);
    for (int i = 0; i < n && i < 32; i++)
        if (strcmp(rows[i].op, op) == 0) return true;
    return false;
}

static size_t cnn_step(cnn *m, int mode, tg_tensor *x, double *loss, double **g, size_t *ng)
{
    tg_tape *tape = tg_tape_new(NULL);
    cr_assert_eq(tg_params_requires_grad(m->ps, tape), TG_OK);
    cr_assert_eq(tg_tape_profile_enable(tape, true), TG_OK);
    size_t before = tg_mem_current_bytes();
    tg_mem_reset_peak();
    tg_scope_begin();
    tg_tensor *y;
    if (mode == 0) {
        tg_tensor *h = tg_relu(tg_conv2d_layer_forward(m->conv, x));
        h = tg_reshape(h, 2, SHAPE(tg_tensor_shape(h)[0], 400));
        h = tg_tanh(tg_layer_norm_layer_forward(m->ln, tg_linear_forward(m->fc1, h)));
        y = tg_mul_scalar(tg_linear_forward(m->fc2, h), 0.5);
    } else {
        y = tg_sequential_forward(m->seq, tape, cnn_nsegments[mode], x);
    }
    cr_assert_not_null(y, "%s", tg_last_error_message());
    tg_tensor *l = tg_mean(tg_mul(y, y));
    cr_assert_eq(tg_backward(l), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_tensor_item(l, loss), TG_OK);
    tg_scope_end();
    size_t peak = tg_mem_peak_bytes() - before;
    /* The container runs the conv and the relu after it as one op. */
    cr_expect_eq(profiled(tape, "conv2d_relu"), mode > 0, "mode %d", mode);
    cr_expect_eq(profiled(tape, "relu"), mode == 0, "mode %d", mode);
    int np = tg_params_count(m->ps);
    *ng = 0;
    for (int i = 0; i < np; i++) *ng += (size_t)tg_tensor_numel(tg_params_at(m->ps, i));
    *g = malloc(*ng * sizeof **g);
    size_t off = 0;
    for (int i = 0; i < np; i++) {
        tg_tensor *p = tg_params_at(m->ps, i);
        size_t n = (size_t)tg_tensor_numel(p);
        cr_assert_eq(tg_tensor_copy_out(tg_grad(p), *g + off, n * sizeof(double)), TG_OK);
        off += n;
        tg_grad_zero(p);
    }
    tg_tape_free(tape);
    return peak;
}

Test(layers, sequential_matches_the_op_by_op_forward_and_frees_as_it_goes)
{
    cnn m;
    cnn_build(&m);
    tg_rng rng;
    tg_rng_seed(&rng, 4);
    tg_tensor *x = tg_rand_normal(&rng, TG_F64, 4, SHAPE(64, 1, 12, 12), 0, 1);
    double loss[CNN_MODES], *g[CNN_MODES];
    size_t ng[CNN_MODES], peak[CNN_MODES];
    for (int k = 0; k < CNN_MODES; k++) peak[k] = cnn_step(&m, k, x, &loss[k], &g[k], &ng[k]);
    for (int k = 1; k < CNN_MODES; k++) {
        cr_expect_eq(loss[k], loss[0], "mode %d: loss %.17g, op by op %.17g", k, loss[k], loss[0]);
        cr_assert_eq(ng[k], ng[0]);
        cr_expect_eq(memcmp(g[k], g[0], ng[0] * sizeof(double)), 0, "mode %d: other gradients", k);
    }
    /* Op by op the scope holds the conv output, the relu output (its view
     * reshaped) and the small tail until backward ends: at least two
     * (64, 4, 10, 10) f64 activations, 400 KiB, beside the gradients. The
     * container never holds the conv output before the relu (conv2d_relu
     * rectifies in place, and keeps its own output): one activation
     * less. */
    size_t act = 64 * 4 * 10 * 10 * sizeof(double);
    cr_expect_geq(peak[0], 2 * act, "op by op: %zu bytes", peak[0]);
    cr_expect_leq(peak[1] + act, peak[0] + act / 8, "container: %zu bytes, op by op %zu",
                  peak[1], peak[0]);
    for (int k = 0; k < CNN_MODES; k++) free(g[k]);
    tg_tensor_release(x);
    cnn_free(&m);
    cr_expect_eq(tg_mem_current_bytes(), 0);
}

/* Only a relu right after a conv2d module joins it: conv, tanh, relu
 * records conv2d, tanh and relu. */
Test(layers, sequential_fuses_only_a_relu_right_after_a_conv)
{
    tg_rng rng;
    tg_rng_seed(&rng, 3);
    tg_params *ps = tg_params_new();
    tg_conv2d_layer *conv = tg_conv2d_layer_new(ps, "conv", 1, 2, 3, 3, NULL, true, TG_F32, &rng);
    tg_sequential *s = tg_sequential_new();
    cr_assert(ps && conv && s, "%s", tg_last_error_message());
    cr_assert_eq(tg_sequential_add_conv2d(s, conv), TG_OK);
    cr_assert_eq(tg_sequential_add_map(s, tg_tanh), TG_OK);
    cr_assert_eq(tg_sequential_add_map(s, tg_relu), TG_OK);
    tg_tape *tape = tg_tape_new(NULL);
    cr_assert_eq(tg_params_requires_grad(ps, tape), TG_OK);
    cr_assert_eq(tg_tape_profile_enable(tape, true), TG_OK);
    tg_tensor *x = tg_rand_normal(&rng, TG_F32, 4, SHAPE(2, 1, 6, 6), 0, 1);
    tg_scope_begin();
    tg_tensor *y = tg_sequential_forward(s, tape, 1, x);
    cr_assert_not_null(y, "%s", tg_last_error_message());
    cr_assert_eq(tg_backward(tg_sum(y)), TG_OK, "%s", tg_last_error_message());
    tg_scope_end();
    cr_expect(profiled(tape, "conv2d") && profiled(tape, "tanh") && profiled(tape, "relu"));
    cr_expect_not(profiled(tape, "conv2d_relu"));
    tg_tensor_release(x);
    tg_tape_free(tape);
    tg_sequential_free(s);
    tg_conv2d_layer_free(conv);
    tg_params_free(ps);
    cr_expect_eq(tg_mem_current_bytes(), 0);
}

Test(layers, sequential_misuse_fails_with_exact_codes)
{
    tg_sequential *s = tg_sequential_new();
    cr_assert_not_null(s);
    cr_expect_eq(tg_sequential_add_linear(NULL, NULL), TG_ERR_NULL);
    cr_expect_eq(tg_sequential_add_linear(s, NULL), TG_ERR_NULL);
    cr_expect_eq(tg_sequential_add_conv2d(s, NULL), TG_ERR_NULL);
    cr_expect_eq(tg_sequential_add_layer_norm(s, NULL), TG_ERR_NULL);
    cr_expect_eq(tg_sequential_add_map(s, NULL), TG_ERR_NULL);
    cr_expect_eq(tg_sequential_add_stage(s, NULL, NULL), TG_ERR_NULL);
    cr_expect_eq(tg_sequential_add_flatten(NULL), TG_ERR_NULL);
    cr_expect_eq(tg_sequential_count(s), 0, "failed adds add nothing");
    cr_expect_eq(tg_sequential_count(NULL), 0);
    tg_tensor *x = tg_full(TG_F32, 1, SHAPE(3), 2.0);
    /* Empty: the input itself. */
    cr_expect_eq(tg_sequential_forward(s, NULL, 1, x), x);
    cr_expect_null(tg_sequential_forward(NULL, NULL, 1, x));
    cr_expect_eq(tg_last_error(), TG_ERR_NULL);
    cr_expect_null(tg_sequential_forward(s, NULL, 1, NULL));
    cr_expect_eq(tg_last_error(), TG_ERR_NULL);
    cr_assert_eq(tg_sequential_add_map(s, tg_exp), TG_OK);
    cr_assert_eq(tg_sequential_add_flatten(s), TG_OK);
    /* Segments need a tape. */
    cr_expect_null(tg_sequential_forward(s, NULL, 0, x));
    cr_expect_eq(tg_last_error(), TG_ERR_NULL, "%s", tg_last_error_message());
    /* A module that fails: flatten of a scalar; nothing leaks, and the
     * container still runs on a good input (no tape needed without
     * segments). */
    tg_tensor *sc = tg_scalar(TG_F32, 1.0);
    cr_expect_null(tg_sequential_forward(s, NULL, 1, sc));
    cr_expect_eq(tg_last_error(), TG_ERR_SHAPE, "%s", tg_last_error_message());
    tg_tensor *y = tg_sequential_forward(s, NULL, 1, x);
    cr_assert_not_null(y, "%s", tg_last_error_message());
    cr_expect_eq(tg_tensor_ndim(y), 2);
    cr_expect_eq(tg_tensor_shape(y)[0], 3);
    tg_tensor_release(y);
    tg_tensor_release(sc);
    tg_tensor_release(x);
    tg_sequential_free(s);
    tg_sequential_free(NULL);
    cr_expect_eq(tg_mem_current_bytes(), 0);
}
