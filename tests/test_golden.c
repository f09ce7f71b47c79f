/* test_golden.c - composite graphs against PyTorch golden gradients.
 *
 * tools/torch_golden.py builds each graph in float64 with torch and writes
 * tests/golden/<name>.txt: the inputs, the loss and the gradient of every
 * f64 input (format in tests/golden/README.md). Here the same graph is built
 * with tapegrad's public API, on the default backend and again on the ref
 * backend, and the loss, every gradient and the Hessian-vector product
 * (tg_grad_of with create_graph, then tg_hvp) must match to 1e-10
 * (|a - g| <= 1e-10 * max(1, |g|)).
 *
 * The graph list is GOLDEN_GRAPHS below, one X(name, "input names") entry
 * per graph: it generates both the table used by the file checks and one
 * test per graph, Test(golden, <name>_matches_torch), so a graph cannot be
 * in one without the other. Each entry needs a build_<name> function taking
 * the leaves in file order and returning the scalar loss. */
#include <criterion/criterion.h>
#include <tapegrad.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TG_GOLDEN_DIR
#error "TG_GOLDEN_DIR must be defined (the directory holding the golden files)"
#endif

#define GOLDEN_TOL 1e-10
#define GOLDEN_MAX_INPUTS 8
#define GOLDEN_MAX_REPORT 5 /* mismatching elements reported per tensor */

/* ---- The graphs: name, then the input names in file order. */
#define GOLDEN_GRAPHS(X)                                                                           \
    X(mlp_cross_entropy, "x W1 b1 W2 b2 target")                                                   \
    X(mlp_tanh_mse, "x W1 b1 W2 b2 y")                                                             \
    X(softmax_then_log, "x w")                                                                     \
    X(log_softmax_mean, "x")                                                                       \
    X(log_softmax_dim0_weighted_mean, "x w")                                                       \
    X(softmax_chain, "x w")                                                                        \
    X(broadcast_row_plus_matrix, "M r r2")                                                         \
    X(broadcast_col_mul_matrix, "c M")                                                             \
    X(broadcast_scalar_shaped, "M s t")                                                            \
    X(broadcast_outer, "a b")                                                                      \
    X(broadcast_3d, "a b c")                                                                       \
    X(shared_weight_two_matmuls, "x W")                                                            \
    X(shared_input_mul_self, "x y")                                                                \
    X(div_pow_scalar, "a b")                                                                       \
    X(tanh_sigmoid_exp_chain, "x")                                                                 \
    X(exp_log_sqrt_chain, "x")                                                                     \
    X(log_sqrt_div_neg, "x y")                                                                     \
    X(sum_dims_keepdim, "x")                                                                       \
    X(sum_dims_no_keepdim, "x w")                                                                  \
    X(mean_dims_keepdim_and_not, "x")                                                              \
    X(max_dim_values, "x w")                                                                       \
    X(max_dim_keepdim_sub, "x")                                                                    \
    X(transpose_lhs_matmul, "A B")                                                                 \
    X(transpose_rhs_matmul, "X Y")                                                                 \
    X(gram_of_interior, "X W")                                                                     \
    X(permute_matmul, "x W")                                                                       \
    X(permute_contiguous_reshape_matmul, "x W")                                                    \
    X(batched_matmul_3d_2d, "a b")                                                                 \
    X(batched_matmul_4d_3d_broadcast, "a b")                                                       \
    X(batched_matmul_3d_3d_broadcast, "a b")                                                       \
    X(reshape_chain, "x W")                                                                        \
    X(mse_loss_sigmoid, "p y")                                                                     \
    X(scalar_add_mul, "x")                                                                         \
    X(expand_sum_to, "x y")                                                                        \
    X(mlp_tanh_cross_entropy, "x W1 b1 W2 b2 W3 target")                                           \
    X(attention_head, "x Wq Wk Wv Wo gamma beta w")                                                \
    X(rnn_unrolled, "x h0 Wx Wh b Wo target")                                                      \
    X(smooth_maps_chain, "x y")

/* Literal shapes and dim lists for the builders. */
#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define NSHAPE(...) ((int)(sizeof(SHAPE(__VA_ARGS__)) / sizeof(int64_t)))
#define DIMS(...) ((const int[]){__VA_ARGS__})
#define NDIMS(...) ((int)(sizeof(DIMS(__VA_ARGS__)) / sizeof(int)))
#define RESHAPE(x, ...) tg_reshape((x), NSHAPE(__VA_ARGS__), SHAPE(__VA_ARGS__))
#define EXPAND(x, ...) tg_expand((x), NSHAPE(__VA_ARGS__), SHAPE(__VA_ARGS__))
#define SUM_TO(x, ...) tg_sum_to((x), NSHAPE(__VA_ARGS__), SHAPE(__VA_ARGS__))
#define PERMUTE(x, ...) tg_permute((x), NDIMS(__VA_ARGS__), DIMS(__VA_ARGS__))
#define SUM_DIMS(x, keep, ...) tg_sum_dims((x), NDIMS(__VA_ARGS__), DIMS(__VA_ARGS__), (keep))
#define MEAN_DIMS(x, keep, ...) tg_mean_dims((x), NDIMS(__VA_ARGS__), DIMS(__VA_ARGS__), (keep))

/* ---- Builders. in[] holds the leaves in file order; every intermediate is
 * owned by the scope the runner opens. Each mirrors the torch expression in
 * tools/torch_golden.py (quoted above it). */

/* cross_entropy(relu(x @ W1 + b1) @ W2 + b2, target) */
static tg_tensor *build_mlp_cross_entropy(tg_tensor **in)
{
    tg_tensor *h = tg_relu(tg_add(tg_matmul(in[0], in[1]), in[2]));
    return tg_cross_entropy(tg_add(tg_matmul(h, in[3]), in[4]), in[5]);
}

/* mse_loss(tanh(x @ W1 + b1) @ W2 + b2, y) */
static tg_tensor *build_mlp_tanh_mse(tg_tensor **in)
{
    tg_tensor *h = tg_tanh(tg_add(tg_matmul(in[0], in[1]), in[2]));
    return tg_mse_loss(tg_add(tg_matmul(h, in[3]), in[4]), in[5]);
}

/* sum(log(softmax(x, 1)) * w) */
static tg_tensor *build_softmax_then_log(tg_tensor **in)
{
    return tg_sum(tg_mul(tg_log(tg_softmax(in[0], 1)), in[1]));
}

/* mean(log_softmax(x, -1)) */
static tg_tensor *build_log_softmax_mean(tg_tensor **in)
{
    return tg_mean(tg_log_softmax(in[0], -1));
}

/* mean(log_softmax(x, 0) * w) */
static tg_tensor *build_log_softmax_dim0_weighted_mean(tg_tensor **in)
{
    return tg_mean(tg_mul(tg_log_softmax(in[0], 0), in[1]));
}

/* sum(softmax(softmax(x, 0) * w, 1) * w) */
static tg_tensor *build_softmax_chain(tg_tensor **in)
{
    tg_tensor *x = in[0], *w = in[1];
    return tg_sum(tg_mul(tg_softmax(tg_mul(tg_softmax(x, 0), w), 1), w));
}

/* sum(sigmoid(M + r) * (r2 - M)), M (4,5), r (5), r2 (1,5) */
static tg_tensor *build_broadcast_row_plus_matrix(tg_tensor **in)
{
    tg_tensor *M = in[0], *r = in[1], *r2 = in[2];
    return tg_sum(tg_mul(tg_sigmoid(tg_add(M, r)), tg_sub(r2, M)));
}

/* sum(tanh(c * M) - c), c (4,1), M (4,3) */
static tg_tensor *build_broadcast_col_mul_matrix(tg_tensor **in)
{
    tg_tensor *c = in[0], *M = in[1];
    return tg_sum(tg_sub(tg_tanh(tg_mul(c, M)), c));
}

/* sum((M * s) / (t * t + 1)) + mean(exp(M) * t), s and t (1,1) */
static tg_tensor *build_broadcast_scalar_shaped(tg_tensor **in)
{
    tg_tensor *M = in[0], *s = in[1], *t = in[2];
    tg_tensor *a = tg_sum(tg_div(tg_mul(M, s), tg_add_scalar(tg_mul(t, t), 1.0)));
    tg_tensor *b = tg_mean(tg_mul(tg_exp(M), t));
    return tg_add(a, b);
}

/* sum(tanh(a - b) * (a * b)), a (3,1), b (1,4) */
static tg_tensor *build_broadcast_outer(tg_tensor **in)
{
    tg_tensor *a = in[0], *b = in[1];
    return tg_sum(tg_mul(tg_tanh(tg_sub(a, b)), tg_mul(a, b)));
}

/* mean((tanh(a * b) + c) ** 2), a (2,1,4), b (3,1), c (1,3,4) */
static tg_tensor *build_broadcast_3d(tg_tensor **in)
{
    tg_tensor *a = in[0], *b = in[1], *c = in[2];
    return tg_mean(tg_pow_scalar(tg_add(tg_tanh(tg_mul(a, b)), c), 2.0));
}

/* sum(tanh(x @ W) @ W) */
static tg_tensor *build_shared_weight_two_matmuls(tg_tensor **in)
{
    tg_tensor *x = in[0], *W = in[1];
    return tg_sum(tg_matmul(tg_tanh(tg_matmul(x, W)), W));
}

/* sum(x * x * y + x) */
static tg_tensor *build_shared_input_mul_self(tg_tensor **in)
{
    tg_tensor *x = in[0], *y = in[1];
    return tg_sum(tg_add(tg_mul(tg_mul(x, x), y), x));
}

/* sum((a / b) ** 3) + sum(b ** -1.5 * a) + mean(b ** 0.5) */
static tg_tensor *build_div_pow_scalar(tg_tensor **in)
{
    tg_tensor *a = in[0], *b = in[1];
    tg_tensor *l1 = tg_sum(tg_pow_scalar(tg_div(a, b), 3.0));
    tg_tensor *l2 = tg_sum(tg_mul(tg_pow_scalar(b, -1.5), a));
    tg_tensor *l3 = tg_mean(tg_pow_scalar(b, 0.5));
    return tg_add(tg_add(l1, l2), l3);
}

/* sum(sigmoid(tanh(x)) * exp(x * 0.5)) */
static tg_tensor *build_tanh_sigmoid_exp_chain(tg_tensor **in)
{
    tg_tensor *x = in[0];
    return tg_sum(tg_mul(tg_sigmoid(tg_tanh(x)), tg_exp(tg_mul_scalar(x, 0.5))));
}

/* mean(sqrt(log(exp(x) + 1))) */
static tg_tensor *build_exp_log_sqrt_chain(tg_tensor **in)
{
    return tg_mean(tg_sqrt(tg_log(tg_add_scalar(tg_exp(in[0]), 1.0))));
}

/* sum(-(log(x) / sqrt(y * y + 1))) */
static tg_tensor *build_log_sqrt_div_neg(tg_tensor **in)
{
    tg_tensor *x = in[0], *y = in[1];
    return tg_sum(tg_neg(tg_div(tg_log(x), tg_sqrt(tg_add_scalar(tg_mul(y, y), 1.0)))));
}

/* sum(sigmoid(x - x.sum(dim=[1], keepdim=True))), x (2,3,4) */
static tg_tensor *build_sum_dims_keepdim(tg_tensor **in)
{
    tg_tensor *x = in[0];
    return tg_sum(tg_sigmoid(tg_sub(x, SUM_DIMS(x, true, 1))));
}

/* sum(x.sum(dim=[0, 2]) ** 2 * w), x (2,3,4), w (3) */
static tg_tensor *build_sum_dims_no_keepdim(tg_tensor **in)
{
    tg_tensor *x = in[0], *w = in[1];
    return tg_sum(tg_mul(tg_pow_scalar(SUM_DIMS(x, false, 0, 2), 2.0), w));
}

/* sum(tanh(x - x.mean(dim=[-1], keepdim=True)) * x)
 *   + sum(x.mean(dim=[0, 1]) * x.mean(dim=[0, 1])), x (3,4,2) */
static tg_tensor *build_mean_dims_keepdim_and_not(tg_tensor **in)
{
    tg_tensor *x = in[0];
    tg_tensor *mk = MEAN_DIMS(x, true, -1);
    tg_tensor *mn = MEAN_DIMS(x, false, 0, 1);
    return tg_add(tg_sum(tg_mul(tg_tanh(tg_sub(x, mk)), x)), tg_sum(tg_mul(mn, mn)));
}

/* sum(max(x, 1).values * w), x (4,5) without ties, w (4) */
static tg_tensor *build_max_dim_values(tg_tensor **in)
{
    return tg_sum(tg_mul(tg_max_dim(in[0], 1, false), in[1]));
}

/* sum(exp(x - max(x, 1, keepdim=True).values)), x (3,4,2) without ties */
static tg_tensor *build_max_dim_keepdim_sub(tg_tensor **in)
{
    tg_tensor *x = in[0];
    return tg_sum(tg_exp(tg_sub(x, tg_max_dim(x, 1, true))));
}

/* sum(tanh(A.transpose(0, 1) @ B)), A (4,3), B (4,5) */
static tg_tensor *build_transpose_lhs_matmul(tg_tensor **in)
{
    return tg_sum(tg_tanh(tg_matmul(tg_transpose(in[0], 0, 1), in[1])));
}

/* sum(sigmoid(X @ Y.transpose(0, 1))), X (3,4), Y (5,4) */
static tg_tensor *build_transpose_rhs_matmul(tg_tensor **in)
{
    return tg_sum(tg_sigmoid(tg_matmul(in[0], tg_transpose(in[1], 0, 1))));
}

/* mean(tanh((X @ W).T @ (X @ W))) */
static tg_tensor *build_gram_of_interior(tg_tensor **in)
{
    tg_tensor *h = tg_matmul(in[0], in[1]);
    return tg_mean(tg_tanh(tg_matmul(tg_transpose(h, 0, 1), h)));
}

/* mean((x.permute(0, 2, 1) @ W) ** 2), x (2,3,4), W (3,5) */
static tg_tensor *build_permute_matmul(tg_tensor **in)
{
    return tg_mean(tg_pow_scalar(tg_matmul(PERMUTE(in[0], 0, 2, 1), in[1]), 2.0));
}

/* sum(tanh(x.permute(2, 0, 1).contiguous().reshape(4, 6) @ W)) */
static tg_tensor *build_permute_contiguous_reshape_matmul(tg_tensor **in)
{
    tg_tensor *p = RESHAPE(tg_contiguous(PERMUTE(in[0], 2, 0, 1)), 4, 6);
    return tg_sum(tg_tanh(tg_matmul(p, in[1])));
}

/* sum(tanh(a @ b)), (2,3,4) @ (4,5) */
static tg_tensor *build_batched_matmul_3d_2d(tg_tensor **in)
{
    return tg_sum(tg_tanh(tg_matmul(in[0], in[1])));
}

/* sum(sigmoid(a @ b)), (2,1,3,4) @ (3,4,2) -> (2,3,3,2) */
static tg_tensor *build_batched_matmul_4d_3d_broadcast(tg_tensor **in)
{
    return tg_sum(tg_sigmoid(tg_matmul(in[0], in[1])));
}

/* mean((a @ b) * (a @ b)), (1,3,4) @ (2,4,2) -> (2,3,2) */
static tg_tensor *build_batched_matmul_3d_3d_broadcast(tg_tensor **in)
{
    tg_tensor *c = tg_matmul(in[0], in[1]);
    return tg_mean(tg_mul(c, c));
}

/* z = x.reshape(3, 4) @ W;
 * sum(tanh(z.reshape(-1)).reshape(9, 1) * z.reshape(1, 9)) */
static tg_tensor *build_reshape_chain(tg_tensor **in)
{
    tg_tensor *z = tg_matmul(RESHAPE(in[0], 3, 4), in[1]);
    tg_tensor *col = RESHAPE(tg_tanh(RESHAPE(z, -1)), 9, 1);
    return tg_sum(tg_mul(col, RESHAPE(z, 1, 9)));
}

/* mse_loss(sigmoid(p) * 2, y) */
static tg_tensor *build_mse_loss_sigmoid(tg_tensor **in)
{
    return tg_mse_loss(tg_mul_scalar(tg_sigmoid(in[0]), 2.0), in[1]);
}

/* sum((x * 2.5 + -0.75) * x) + mean((x + 3) * -0.5) */
static tg_tensor *build_scalar_add_mul(tg_tensor **in)
{
    tg_tensor *x = in[0];
    tg_tensor *a = tg_sum(tg_mul(tg_add_scalar(tg_mul_scalar(x, 2.5), -0.75), x));
    tg_tensor *b = tg_mean(tg_mul_scalar(tg_add_scalar(x, 3.0), -0.5));
    return tg_add(a, b);
}

/* sum((x.expand(2, 3, 4) * y).sum_to_size(3, 1) ** 2), x (3,1), y (2,3,4) */
static tg_tensor *build_expand_sum_to(tg_tensor **in)
{
    tg_tensor *e = tg_mul(EXPAND(in[0], 2, 3, 4), in[1]);
    return tg_sum(tg_pow_scalar(SUM_TO(e, 3, 1), 2.0));
}

/* cross_entropy(tanh(tanh(x @ W1 + b1) @ W2 + b2) @ W3, target) */
static tg_tensor *build_mlp_tanh_cross_entropy(tg_tensor **in)
{
    tg_tensor *h = tg_tanh(tg_add(tg_matmul(in[0], in[1]), in[2]));
    h = tg_tanh(tg_add(tg_matmul(h, in[3]), in[4]));
    return tg_cross_entropy(tg_matmul(h, in[5]), in[6]);
}

/* sum(layer_norm(x + softmax(q k^T / sqrt 3, -1) v Wo, gamma, beta) * w),
 * q = x Wq, k = x Wk, v = x Wv */
static tg_tensor *build_attention_head(tg_tensor **in)
{
    tg_tensor *x = in[0];
    tg_tensor *q = tg_matmul(x, in[1]), *k = tg_matmul(x, in[2]), *v = tg_matmul(x, in[3]);
    tg_tensor *a = tg_softmax(tg_mul_scalar(tg_matmul(q, tg_transpose(k, 0, 1)), 1.0 / sqrt(3.0)),
                              -1);
    tg_tensor *r = tg_add(x, tg_matmul(tg_matmul(a, v), in[4]));
    return tg_sum(tg_mul(tg_layer_norm(r, 1, in[5], in[6], 1e-5), in[7]));
}

/* h = h0; for t: h = tanh(x[t] @ Wx + h @ Wh + b); cross_entropy(h @ Wo, target) */
static tg_tensor *build_rnn_unrolled(tg_tensor **in)
{
    tg_tensor *x = in[0], *h = in[1];
    const int64_t *s = tg_tensor_shape(x);
    for (int64_t t = 0; t < s[0]; t++) {
        tg_tensor *xt = RESHAPE(tg_narrow(x, 0, t, 1), s[1], s[2]);
        h = tg_tanh(tg_add(tg_add(tg_matmul(xt, in[2]), tg_matmul(h, in[3])), in[4]));
    }
    return tg_cross_entropy(tg_matmul(h, in[5]), in[6]);
}

/* sum(gelu(x) * silu(y) + softplus(x * y) + sin(x) * cos(y)) */
static tg_tensor *build_smooth_maps_chain(tg_tensor **in)
{
    tg_tensor *x = in[0], *y = in[1];
    tg_tensor *a = tg_add(tg_mul(tg_gelu(x), tg_silu(y)), tg_softplus(tg_mul(x, y), 1.0, 20.0));
    return tg_sum(tg_add(a, tg_mul(tg_sin(x), tg_cos(y))));
}

/* ---- The table. */
typedef tg_tensor *(*build_fn)(tg_tensor **in);

typedef struct graph_def {
    const char *name;
    const char *inputs; /* space-separated input names, file order */
    build_fn build;
} graph_def;

#define GOLDEN_TABLE_ENTRY(name, inputs) {#name, inputs, build_##name},
static const graph_def graphs[] = {GOLDEN_GRAPHS(GOLDEN_TABLE_ENTRY)};
#define NGRAPHS ((int)(sizeof graphs / sizeof graphs[0]))

/* ---- Golden files. */
typedef struct golden_input {
    char name[64];
    tg_dtype dtype;
    int ndim;
    int64_t shape[TG_MAX_DIMS];
    int64_t numel;
    void *data; /* numel doubles (f64) or int64_t (i64) */
    /* f64 inputs, numel doubles each once read: the gradient, the HVP's
     * direction for this input and the HVP's result for this input. */
    double *grad, *dir, *hvp;
} golden_input;

typedef struct golden {
    char name[128];
    int ninputs;
    golden_input in[GOLDEN_MAX_INPUTS];
    bool has_loss;
    double loss;
} golden;

static void golden_free(golden *g)
{
    for (int i = 0; i < g->ninputs; i++) {
        free(g->in[i].data);
        free(g->in[i].grad);
        free(g->in[i].dir);
        free(g->in[i].hvp);
    }
    memset(g, 0, sizeof *g);
}

static void golden_path(const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s.txt", TG_GOLDEN_DIR, name);
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        buf = malloc((size_t)n + 1);
        if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        }
        if (buf) buf[n] = '\0';
    }
    fclose(f);
    return buf;
}

typedef struct tokens {
    char *save;
    char *first;
} tokens;

static char *next_tok(tokens *t)
{
    const char *sep = " \t\r\n";
    if (t->first) {
        char *s = t->first;
        t->first = NULL;
        return strtok_r(s, sep, &t->save);
    }
    return strtok_r(NULL, sep, &t->save);
}

static bool parse_double(const char *s, double *out)
{
    if (!s) return false;
    char *end;
    *out = strtod(s, &end);
    return end != s && *end == '\0';
}

static bool parse_int(const char *s, int64_t *out)
{
    if (!s) return false;
    char *end;
    long long v = strtoll(s, &end, 10);
    *out = (int64_t)v;
    return end != s && *end == '\0';
}

static bool read_doubles(tokens *t, double *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!parse_double(next_tok(t), &dst[i])) return false;
    return true;
}

/* Parses path into g. On failure returns false with err set (g is freed). */
static bool golden_load(const char *path, golden *g, char *err, size_t errlen)
{
    memset(g, 0, sizeof *g);
    char *text = read_file(path);
    if (!text) {
        snprintf(err, errlen, "cannot read %s", path);
        return false;
    }
    tokens t = {NULL, text};
    bool ok = false;
    char *tok = next_tok(&t);
    if (!tok || strcmp(tok, "graph") != 0 || !(tok = next_tok(&t))) {
        snprintf(err, errlen, "%s: does not start with 'graph <name>'", path);
        goto done;
    }
    snprintf(g->name, sizeof g->name, "%s", tok);
    while ((tok = next_tok(&t))) {
        if (strcmp(tok, "input") == 0) {
            if (g->ninputs == GOLDEN_MAX_INPUTS) {
                snprintf(err, errlen, "%s: more than %d inputs", path, GOLDEN_MAX_INPUTS);
                goto done;
            }
            golden_input *in = &g->in[g->ninputs++];
            const char *name = next_tok(&t), *dt = next_tok(&t);
            int64_t ndim;
            if (!name || !dt || !parse_int(next_tok(&t), &ndim) || ndim < 0 || ndim > TG_MAX_DIMS) {
                snprintf(err, errlen, "%s: bad input header", path);
                goto done;
            }
            snprintf(in->name, sizeof in->name, "%s", name);
            if (strcmp(dt, "f64") == 0) {
                in->dtype = TG_F64;
            } else if (strcmp(dt, "i64") == 0) {
                in->dtype = TG_I64;
            } else {
                snprintf(err, errlen, "%s: input %s: unknown dtype '%s'", path, name, dt);
                goto done;
            }
            in->ndim = (int)ndim;
            in->numel = 1;
            for (int d = 0; d < in->ndim; d++) {
                if (!parse_int(next_tok(&t), &in->shape[d]) || in->shape[d] < 0) {
                    snprintf(err, errlen, "%s: input %s: bad shape", path, name);
                    goto done;
                }
                in->numel *= in->shape[d];
            }
            in->data = malloc((size_t)(in->numel ? in->numel : 1) * 8);
            if (!in->data) {
                snprintf(err, errlen, "%s: out of memory", path);
                goto done;
            }
            bool vals_ok = true;
            if (in->dtype == TG_F64) {
                vals_ok = read_doubles(&t, in->data, in->numel);
            } else {
                int64_t *iv = in->data;
                for (int64_t i = 0; i < in->numel && vals_ok; i++)
                    vals_ok = parse_int(next_tok(&t), &iv[i]);
            }
            if (!vals_ok) {
                snprintf(err, errlen, "%s: input %s: expected %lld values", path, name,
                         (long long)in->numel);
                goto done;
            }
        } else if (strcmp(tok, "loss") == 0) {
            if (!parse_double(next_tok(&t), &g->loss)) {
                snprintf(err, errlen, "%s: bad loss value", path);
                goto done;
            }
            g->has_loss = true;
        } else if (strcmp(tok, "grad") == 0 || strcmp(tok, "dir") == 0 ||
                   strcmp(tok, "hvp") == 0) {
            const char *kind = tok, *name = next_tok(&t);
            golden_input *in = NULL;
            for (int i = 0; name && i < g->ninputs; i++)
                if (strcmp(g->in[i].name, name) == 0) in = &g->in[i];
            double **slot = !in             ? NULL
                            : kind[0] == 'g' ? &in->grad
                            : kind[0] == 'd' ? &in->dir
                                             : &in->hvp;
            if (!in || in->dtype != TG_F64 || *slot) {
                snprintf(err, errlen, "%s: %s for unknown, non-f64 or repeated input '%s'", path,
                         kind, name ? name : "(eof)");
                goto done;
            }
            *slot = malloc((size_t)(in->numel ? in->numel : 1) * sizeof(double));
            if (!*slot || !read_doubles(&t, *slot, in->numel)) {
                snprintf(err, errlen, "%s: %s %s: expected %lld values", path, kind, name,
                         (long long)in->numel);
                goto done;
            }
        } else {
            snprintf(err, errlen, "%s: unexpected token '%s'", path, tok);
            goto done;
        }
    }
    if (!g->has_loss) {
        snprintf(err, errlen, "%s: no loss line", path);
        goto done;
    }
    for (int i = 0; i < g->ninputs; i++) {
        const golden_input *in = &g->in[i];
        if (in->dtype == TG_F64 && (!in->grad || !in->dir || !in->hvp)) {
            snprintf(err, errlen, "%s: f64 input %s lacks its %s line", path, in->name,
                     !in->grad ? "grad" : !in->dir ? "dir" : "hvp");
            goto done;
        }
    }
    ok = true;
done:
    free(text);
    if (!ok) golden_free(g);
    return ok;
}

/* The file's input names, space-separated, must equal the table's. */
static bool input_names_match(const golden *g, const char *expected, char *got, size_t len)
{
    got[0] = '\0';
    size_t used = 0;
    for (int i = 0; i < g->ninputs; i++) {
        int n = snprintf(got + used, len - used, "%s%s", i ? " " : "", g->in[i].name);
        if (n < 0 || (size_t)n >= len - used) return false;
        used += (size_t)n;
    }
    return strcmp(got, expected) == 0;
}

/* ---- Comparison. */
static bool close_enough(double got, double want)
{
    double tol = GOLDEN_TOL * fmax(1.0, fabs(want));
    return fabs(got - want) <= tol; /* false for NaN */
}

/* Counts mismatches, reporting the first few as failed expectations. */
static int compare_values(const char *graph, const char *what, tg_backend be, const double *got,
                          const double *want, int64_t n)
{
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (close_enough(got[i], want[i])) continue;
        if (bad < GOLDEN_MAX_REPORT)
            cr_expect(false, "%s [%s] %s[%lld]: tapegrad %.17g, torch %.17g (diff %.3g)", graph,
                      tg_backend_name(be), what, (long long)i, got[i], want[i],
                      fabs(got[i] - want[i]));
        bad++;
    }
    if (bad > GOLDEN_MAX_REPORT)
        cr_expect(false, "%s [%s] %s: %d of %lld elements differ", graph, tg_backend_name(be), what,
                  bad, (long long)n);
    return bad;
}

static bool same_shape(const tg_tensor *t, const golden_input *in)
{
    if (tg_tensor_ndim(t) != in->ndim) return false;
    const int64_t *s = tg_tensor_shape(t);
    for (int d = 0; d < in->ndim; d++)
        if (s[d] != in->shape[d]) return false;
    return true;
}

/* Compares t (f64, in's shape) with want, naming it "<kind> <input>". */
static void compare_tensor(const char *graph, const char *kind, tg_backend be, const tg_tensor *t,
                           const golden_input *in, const double *want)
{
    char what[96];
    snprintf(what, sizeof what, "%s %s", kind, in->name);
    if (!t) return;
    if (!same_shape(t, in) || tg_tensor_dtype(t) != TG_F64) {
        char s1[64], s2[64];
        cr_expect(false, "%s [%s]: %s has shape %s dtype %s, input %s", graph, tg_backend_name(be),
                  what, tg_shape_str(tg_tensor_ndim(t), tg_tensor_shape(t), s1, sizeof s1),
                  tg_dtype_name(tg_tensor_dtype(t)),
                  tg_shape_str(in->ndim, in->shape, s2, sizeof s2));
        return;
    }
    size_t nbytes = (size_t)(in->numel ? in->numel : 1) * sizeof(double);
    double *buf = malloc(nbytes);
    cr_expect(buf != NULL, "out of memory");
    if (!buf) return;
    tg_status st = tg_tensor_copy_out(t, buf, nbytes);
    cr_expect_eq(st, TG_OK, "%s [%s]: copy_out(%s) = %s", graph, tg_backend_name(be), what,
                 tg_strerror(st));
    if (st == TG_OK) compare_values(graph, what, be, buf, want, in->numel);
    free(buf);
}

/* Builds and differentiates graph def on backend be and compares with g.
 * Uses only non-fatal expectations so that everything is freed. */
static void run_on_backend(const graph_def *def, const golden *g, tg_backend be)
{
    tg_backend prev = tg_set_default_backend(be);
    tg_error_clear();
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *leaves[GOLDEN_MAX_INPUTS] = {0};
    bool ok = tape != NULL;
    cr_expect(tape != NULL, "%s [%s]: tg_tape_new failed: %s", def->name, tg_backend_name(be),
              tg_last_error_message());

    for (int i = 0; ok && i < g->ninputs; i++) {
        const golden_input *in = &g->in[i];
        leaves[i] = tg_tensor_from_data(in->dtype, in->ndim, in->shape, in->data);
        ok = leaves[i] != NULL;
        cr_expect(ok, "%s [%s]: creating input %s failed: %s", def->name, tg_backend_name(be),
                  in->name, tg_last_error_message());
        if (ok && in->dtype == TG_F64) {
            tg_status st = tg_requires_grad(tape, leaves[i]);
            ok = st == TG_OK;
            cr_expect(ok, "%s [%s]: tg_requires_grad(%s) = %s: %s", def->name, tg_backend_name(be),
                      in->name, tg_strerror(st), tg_last_error_message());
        }
    }

    if (ok) {
        tg_scope_begin();
        tg_tensor *loss = def->build(leaves);
        cr_expect(loss != NULL, "%s [%s]: building the graph failed: %s (%s)", def->name,
                  tg_backend_name(be), tg_strerror(tg_last_error()), tg_last_error_message());
        if (loss) {
            cr_expect_eq(tg_tensor_numel(loss), 1, "%s [%s]: loss has %lld elements", def->name,
                         tg_backend_name(be), (long long)tg_tensor_numel(loss));
            cr_expect_eq(tg_tensor_backend(loss), be, "%s [%s]: loss is on backend %s", def->name,
                         tg_backend_name(be), tg_backend_name(tg_tensor_backend(loss)));
            double lv = NAN;
            tg_status st = tg_tensor_item(loss, &lv);
            cr_expect_eq(st, TG_OK, "%s [%s]: tg_tensor_item: %s", def->name, tg_backend_name(be),
                         tg_strerror(st));
            compare_values(def->name, "loss", be, &lv, &g->loss, 1);

            st = tg_backward(loss);
            cr_expect_eq(st, TG_OK, "%s [%s]: tg_backward = %s: %s", def->name, tg_backend_name(be),
                         tg_strerror(st), tg_last_error_message());
            for (int i = 0; st == TG_OK && i < g->ninputs; i++) {
                const golden_input *in = &g->in[i];
                if (in->dtype != TG_F64) continue;
                tg_tensor *gr = tg_grad(leaves[i]);
                cr_expect(gr != NULL, "%s [%s]: no gradient for %s: %s", def->name,
                          tg_backend_name(be), in->name, tg_last_error_message());
                compare_tensor(def->name, "grad", be, gr, in, in->grad);
            }
        }
        tg_status st = tg_scope_end();
        cr_expect_eq(st, TG_OK, "%s [%s]: tg_scope_end = %s", def->name, tg_backend_name(be),
                     tg_strerror(st));
    }

    tg_tape_free(tape);
    for (int i = 0; i < g->ninputs; i++)
        tg_tensor_release(leaves[i]);
    tg_set_default_backend(prev);
    tg_error_clear();
}

/* ---- Second order: the Hessian-vector product hvp = d<grad, dir>/dinputs
 * against torch's, on the engine (tg_grad_of with create_graph on the
 * caller's tape, then a second tg_grad_of) and through tg_hvp. */

/* Leaves and the f64 ones among them, in file order. */
typedef struct hvp_inputs {
    const graph_def *def;
    const golden *g;
    tg_tensor *leaves[GOLDEN_MAX_INPUTS];
    int nf, fpos[GOLDEN_MAX_INPUTS]; /* f64 inputs: count and file positions */
    tg_tensor *dirs[GOLDEN_MAX_INPUTS];
} hvp_inputs;

/* tg_func for tg_hvp: x are the f64 inputs; the i64 ones come from ud. */
static tg_tensor *hvp_fn(void *ud, int n, tg_tensor *const *x)
{
    hvp_inputs *h = ud;
    tg_tensor *all[GOLDEN_MAX_INPUTS];
    memcpy(all, h->leaves, sizeof all);
    for (int k = 0; k < n; k++) all[h->fpos[k]] = x[k];
    return h->def->build(all);
}

static void compare_hvps(const hvp_inputs *h, const char *kind, tg_backend be, tg_tensor **hv)
{
    for (int k = 0; k < h->nf; k++) {
        const golden_input *in = &h->g->in[h->fpos[k]];
        cr_expect(hv[k] != NULL, "%s [%s]: %s %s missing", h->def->name, tg_backend_name(be), kind,
                  in->name);
        compare_tensor(h->def->name, kind, be, hv[k], in, in->hvp);
    }
}

static void hvp_on_backend(const graph_def *def, const golden *g, tg_backend be)
{
    tg_backend prev = tg_set_default_backend(be);
    tg_error_clear();
    tg_tape *tape = tg_tape_new(NULL);
    cr_assert(tape != NULL, "%s [%s]: tg_tape_new: %s", def->name, tg_backend_name(be),
              tg_last_error_message());
    hvp_inputs h = {.def = def, .g = g};
    bool ok = true;
    for (int i = 0; ok && i < g->ninputs; i++) {
        const golden_input *in = &g->in[i];
        h.leaves[i] = tg_tensor_from_data(in->dtype, in->ndim, in->shape, in->data);
        ok = h.leaves[i] != NULL;
        if (ok && in->dtype == TG_F64) {
            h.dirs[h.nf] = tg_tensor_from_data(TG_F64, in->ndim, in->shape, in->dir);
            h.fpos[h.nf++] = i;
            ok = h.dirs[h.nf - 1] && tg_requires_grad(tape, h.leaves[i]) == TG_OK;
        }
    }
    cr_expect(ok, "%s [%s]: creating the inputs failed: %s", def->name, tg_backend_name(be),
              tg_last_error_message());

    tg_scope_begin();
    tg_tensor *wrt[GOLDEN_MAX_INPUTS], *gr[GOLDEN_MAX_INPUTS] = {0}, *hv[GOLDEN_MAX_INPUTS] = {0};
    for (int k = 0; k < h.nf; k++) wrt[k] = h.leaves[h.fpos[k]];
    tg_tensor *loss = ok ? def->build(h.leaves) : NULL;
    cr_expect(!ok || loss != NULL, "%s [%s]: building the graph failed: %s", def->name,
              tg_backend_name(be), tg_last_error_message());
    if (loss) {
        const tg_grad_opts first = {.create_graph = true, .allow_unused = true};
        tg_status st = tg_grad_of(1, &loss, NULL, h.nf, wrt, gr, &first);
        cr_expect_eq(st, TG_OK, "%s [%s]: tg_grad_of(create_graph) = %s: %s", def->name,
                     tg_backend_name(be), tg_strerror(st), tg_last_error_message());
        tg_tensor *inner = NULL;
        for (int k = 0; st == TG_OK && k < h.nf; k++) {
            tg_tensor *term = tg_sum(tg_mul(gr[k], h.dirs[k]));
            inner = inner ? tg_add(inner, term) : term;
        }
        const tg_grad_opts second = {.allow_unused = true};
        if (st == TG_OK) st = tg_grad_of(1, &inner, NULL, h.nf, wrt, hv, &second);
        cr_expect_eq(st, TG_OK, "%s [%s]: tg_grad_of of <grad, dir> = %s: %s", def->name,
                     tg_backend_name(be), tg_strerror(st), tg_last_error_message());
        if (st == TG_OK) compare_hvps(&h, "hvp (tg_grad_of)", be, hv);
    }
    if (ok) {
        tg_tensor *y = NULL;
        tg_status st = tg_hvp(hvp_fn, &h, h.nf, wrt, h.dirs, &y, hv);
        cr_expect_eq(st, TG_OK, "%s [%s]: tg_hvp = %s: %s", def->name, tg_backend_name(be),
                     tg_strerror(st), tg_last_error_message());
        double lv = NAN;
        if (st == TG_OK && tg_tensor_item(y, &lv) == TG_OK)
            compare_values(def->name, "loss (tg_hvp)", be, &lv, &g->loss, 1);
        if (st == TG_OK) compare_hvps(&h, "hvp (tg_hvp)", be, hv);
    }
    tg_status st = tg_scope_end();
    cr_expect_eq(st, TG_OK, "%s [%s]: tg_scope_end = %s", def->name, tg_backend_name(be),
                 tg_strerror(st));
    tg_tape_free(tape);
    for (int i = 0; i < g->ninputs; i++) tg_tensor_release(h.leaves[i]);
    for (int k = 0; k < h.nf; k++) tg_tensor_release(h.dirs[k]);
    tg_set_default_backend(prev);
    tg_error_clear();
}

static void run_graph(const graph_def *def)
{
    char path[1024], err[1200], names[512]; /* err holds path and a message */
    golden g;
    golden_path(def->name, path, sizeof path);
    bool loaded = golden_load(path, &g, err, sizeof err);
    cr_assert(loaded, "%s", err);
    bool ok = strcmp(g.name, def->name) == 0;
    cr_expect(ok, "%s: file names graph '%s'", path, g.name);
    if (ok) {
        ok = input_names_match(&g, def->inputs, names, sizeof names);
        cr_expect(ok, "%s: inputs are \"%s\", the C table expects \"%s\"", path, names,
                  def->inputs);
    }
    if (ok) {
        run_on_backend(def, &g, tg_default_backend());
        run_on_backend(def, &g, TG_BACKEND_REF);
        hvp_on_backend(def, &g, tg_default_backend());
        hvp_on_backend(def, &g, TG_BACKEND_REF);
    }
    golden_free(&g);
}

/* ---- One test per graph: Test(golden, <name>_matches_torch). */
#define GOLDEN_TEST(name, inputs)                                                                  \
    Test(golden, name##_matches_torch)                                                             \
    {                                                                                              \
        static const graph_def def = {#name, inputs, build_##name};                                \
        run_graph(&def);                                                                           \
    }
GOLDEN_GRAPHS(GOLDEN_TEST)

/* ---- The table and the directory agree. */
Test(golden, every_table_graph_has_a_file)
{
    for (int i = 0; i < NGRAPHS; i++) {
        char path[1024];
        golden_path(graphs[i].name, path, sizeof path);
        FILE *f = fopen(path, "rb");
        cr_expect(f != NULL,
                  "golden file %s for graph %s is missing "
                  "(run /usr/bin/python3 tools/torch_golden.py)",
                  path, graphs[i].name);
        if (f) fclose(f);
    }
}

static bool in_table(const char *name, size_t len)
{
    for (int i = 0; i < NGRAPHS; i++)
        if (strlen(graphs[i].name) == len && strncmp(graphs[i].name, name, len) == 0) return true;
    return false;
}

Test(golden, file_count_matches_table)
{
    DIR *dir = opendir(TG_GOLDEN_DIR);
    cr_assert(dir != NULL, "cannot open golden directory %s", TG_GOLDEN_DIR);
    int count = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        size_t len = strlen(e->d_name);
        if (len <= 4 || strcmp(e->d_name + len - 4, ".txt") != 0) continue;
        count++;
        cr_expect(in_table(e->d_name, len - 4), "golden file %s/%s has no entry in GOLDEN_GRAPHS",
                  TG_GOLDEN_DIR, e->d_name);
    }
    closedir(dir);
    cr_expect_eq(count, NGRAPHS, "%d golden files in %s, %d graphs in the C table", count,
                 TG_GOLDEN_DIR, NGRAPHS);
}
