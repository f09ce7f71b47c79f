/* wl_gemm.c - the workloads whose time should be their GEMMs: mlp, deep
 * and wide (stacks of Linear + ReLU) and conv (conv2d, then a linear layer).
 * Each also runs the same GEMMs with raw cblas_sgemm, shaped as
 * tg_linear calls them (x W^T with W (out, in)), so the suite can time
 * the two side by side; the plain-C forward around those GEMMs is the
 * reference the loss is checked against before timing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define MAX_LAYERS 16

/* ---- Linear stacks: x -> [Linear, ReLU] x n (no ReLU after the last
 * layer when the loss is cross-entropy). */
typedef struct {
    int nl, batch;
    int dims[MAX_LAYERS + 1]; /* nl + 1 used */
    bool ce;         /* cross-entropy on labels; else mean of the output */
    tg_params *ps;
    tg_linear *l[MAX_LAYERS];
    tg_sequential *seq; /* the layers and their ReLUs, in order */
    tg_tensor *x, *y; /* (B, dims[0]) f32, (B) i64 labels when ce */
    int64_t *labels;
    /* Raw buffers for the reference and the cblas GEMMs. */
    float *X, *W[MAX_LAYERS], *Z[MAX_LAYERS], *dZ[MAX_LAYERS], *dH[MAX_LAYERS], *dW[MAX_LAYERS];
} stack_st;

static bool stack_relu(const stack_st *s, int l)
{
    return !s->ce || l < s->nl - 1;
}

static void stack_teardown(void *p)
{
    stack_st *s = p;
    if (!s) return;
    tg_sequential_free(s->seq);
    for (int l = 0; l < s->nl; l++) {
        tg_linear_free(s->l[l]);
        free(s->W[l]);
        free(s->Z[l]);
        free(s->dZ[l]);
        free(s->dH[l]);
        free(s->dW[l]);
    }
    tg_params_free(s->ps);
    tg_tensor_release(s->x);
    tg_tensor_release(s->y);
    free(s->labels);
    free(s->X);
    free(s);
}

/* A container's last module: the cross-entropy of the logits against
 * the labels *labels (userdata: the address of a workload's label field,
 * filled in after the container is built). */
static tg_tensor *ce_stage(void *labels, int layer, tg_tensor *logits)
{
    (void)layer;
    return tg_cross_entropy(logits, *(tg_tensor **)labels);
}

/* kaiming: He-normal weights and zero biases (the deep stack, which the
 * default U(-1/sqrt(in), ..) init would shrink to nothing in 16 layers). */
static void *stack_setup(int nl, const int *dims, int batch, bool ce, bool kaiming, uint64_t seed,
                         char *err, size_t errlen)
{
    stack_st *s = calloc(1, sizeof *s);
    tg_rng rng;
    if (!s) return bench_setup_failed(err, errlen, "stack setup");
    s->nl = nl;
    memcpy(s->dims, dims, (size_t)(nl + 1) * sizeof *dims);
    s->batch = batch;
    s->ce = ce;
    tg_rng_seed(&rng, seed);
    s->ps = tg_params_new();
    bool ok = s->ps != NULL;
    for (int l = 0; l < nl && ok; l++) {
        char name[16];
        snprintf(name, sizeof name, "fc%d", l + 1);
        s->l[l] = tg_linear_new(s->ps, name, dims[l], dims[l + 1], true, TG_F32, &rng);
        ok = s->l[l] != NULL;
        if (ok && kaiming)
            ok = !tg_init_kaiming_normal(tg_linear_weight(s->l[l]), &rng, TG_FAN_IN,
                                         tg_init_gain(TG_NONLIN_RELU, 0)) &&
                 !tg_init_zeros(tg_linear_bias(s->l[l]));
    }
    ok = ok && (s->seq = tg_sequential_new()) != NULL;
    for (int l = 0; l < nl && ok; l++)
        ok = !tg_sequential_add_linear(s->seq, s->l[l]) &&
             (!stack_relu(s, l) || !tg_sequential_add_map(s->seq, tg_relu));
    /* The loss as the last module, so that the model's output dies once
     * the loss has read it (the cross-entropy's labels are added below). */
    if (ok) ok = !(ce ? tg_sequential_add_stage(s->seq, ce_stage, &s->y)
                      : tg_sequential_add_map(s->seq, tg_mean));
    if (ok) {
        s->x = ce ? tg_rand_uniform(&rng, TG_F32, 2, SHAPE(batch, dims[0]), 0, 1)
                  : tg_rand_normal(&rng, TG_F32, 2, SHAPE(batch, dims[0]), 0, 1);
        s->X = s->x ? bench_copy_f32(s->x) : NULL;
        ok = s->X != NULL;
    }
    if (ok && ce) {
        s->labels = malloc((size_t)batch * sizeof *s->labels);
        ok = s->labels != NULL;
        for (int i = 0; ok && i < batch; i++)
            s->labels[i] = (int64_t)(tg_rng_next(&rng) % (uint64_t)dims[nl]);
        if (ok) ok = (s->y = tg_tensor_from_data(TG_I64, 1, SHAPE(batch), s->labels)) != NULL;
    }
    for (int l = 0; l < nl && ok; l++) {
        size_t in = (size_t)dims[l], out = (size_t)dims[l + 1];
        s->W[l] = bench_floats(in * out, 0.01f);
        s->dW[l] = bench_floats(in * out, 0.01f);
        s->Z[l] = bench_floats((size_t)batch * out, 0.01f);
        s->dZ[l] = bench_floats((size_t)batch * out, 0.01f);
        s->dH[l] = bench_floats((size_t)batch * in, 0.01f);
        ok = s->W[l] && s->dW[l] && s->Z[l] && s->dZ[l] && s->dH[l];
    }
    if (!ok) {
        stack_teardown(s);
        return bench_setup_failed(err, errlen, "stack setup");
    }
    return s;
}

static tg_params *stack_params(void *p)
{
    return ((stack_st *)p)->ps;
}

static tg_tensor *stack_layer(void *p, int l, tg_tensor *h)
{
    stack_st *s = p;
    h = tg_linear_forward(s->l[l], h);
    return stack_relu(s, l) ? tg_relu(h) : h;
}

/* The layers API's container: lean under every policy (each module's
 * output is released once the next has run), sqrt(n) segments with
 * segments. */
static tg_tensor *stack_forward(void *p, tg_tape *tape, int segments)
{
    stack_st *s = p;
    return tg_sequential_forward(s->seq, tape, bench_nsegments(segments), s->x);
}

static tg_tensor *stack_forward_lean(void *p, tg_tape *tape, int segments, tg_tensor **owned)
{
    stack_st *s = p;
    tg_tensor *h = bench_lean_stages(tape, segments, s->nl, stack_layer, s, s->x);
    *owned = h;
    return s->ce ? tg_cross_entropy(h, s->y) : tg_mean(h);
}

/* The stack's GEMMs, as tg_linear makes them: Z[l] = A W[l]^T forward;
 * dW[l] = dZ[l]^T A and, above the first layer (whose input needs no
 * gradient), dA = dZ[l] W[l], backward. A is X or the previous Z (the
 * ReLU is not a GEMM and is left out). */
static void stack_gemm(void *p, bool backward)
{
    stack_st *s = p;
    const int *d = s->dims;
    int B = s->batch;
    for (int l = 0; l < s->nl; l++) {
        const float *a = l ? s->Z[l - 1] : s->X;
        bench_sgemm(false, true, B, d[l + 1], d[l], a, d[l], s->W[l], d[l], s->Z[l], d[l + 1]);
    }
    if (!backward) return;
    for (int l = s->nl - 1; l >= 0; l--) {
        const float *a = l ? s->Z[l - 1] : s->X;
        bench_sgemm(true, false, d[l + 1], d[l], B, s->dZ[l], d[l + 1], a, d[l], s->dW[l], d[l]);
        if (l)
            bench_sgemm(false, false, B, d[l], d[l + 1], s->dZ[l], d[l + 1], s->W[l], d[l],
                        s->dH[l], d[l]);
    }
}

/* Forward in plain C around cblas_sgemm from the current parameters. It
 * leaves the raw GEMM buffers holding real activations. */
static int stack_reference(void *p, double *loss, char *err, size_t errlen)
{
    stack_st *s = p;
    const int *d = s->dims;
    int B = s->batch;
    for (int l = 0; l < s->nl; l++) {
        size_t in = (size_t)d[l], out = (size_t)d[l + 1];
        float *bias = bench_copy_f32(tg_linear_bias(s->l[l]));
        if (!bias ||
            tg_tensor_copy_out(tg_linear_weight(s->l[l]), s->W[l], in * out * sizeof(float))) {
            free(bias);
            return bench_lib_fail(err, errlen, "stack reference");
        }
        const float *a = l ? s->Z[l - 1] : s->X;
        bench_sgemm(false, true, B, (int)out, (int)in, a, (int)in, s->W[l], (int)in, s->Z[l],
                    (int)out);
        for (size_t i = 0; i < (size_t)B * out; i++) {
            float v = s->Z[l][i] + bias[i % out];
            s->Z[l][i] = stack_relu(s, l) && v < 0 ? 0.0f : v;
        }
        free(bias);
    }
    float *z = s->Z[s->nl - 1];
    int C = d[s->nl];
    if (s->ce) {
        *loss = bench_ce_mean(z, s->labels, B, C);
    } else {
        double total = 0;
        for (size_t i = 0; i < (size_t)B * C; i++)
            total += z[i];
        *loss = total / ((double)B * C);
    }
    return 0;
}

/* max |a - b| / max |b| over n entries. */
static double rel_err(const float *a, const float *b, size_t n)
{
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        e = fmax(e, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return e / fmax(m, 1e-30);
}

/* The gradients in plain C around cblas_sgemm, from stack_reference's
 * activations: dZ of the loss (softmax - one-hot over B for cross-entropy,
 * 1/(B C) for the mean), through each ReLU, dW = dZ^T A, db = the column
 * sums of dZ, dA = dZ W; each weight's and bias's gradient compared. */
static int stack_check_grad(void *p, double *rel, char *err, size_t errlen)
{
    stack_st *s = p;
    const int *d = s->dims;
    int B = s->batch, L = s->nl, C = d[L];
    double loss;
    if (stack_reference(s, &loss, err, errlen)) return -1;
    float *dz = s->dZ[L - 1];
    for (int i = 0; i < B; i++) {
        const float *z = s->Z[L - 1] + (size_t)i * C;
        double mx = z[0], sum = 0;
        for (int j = 1; s->ce && j < C; j++)
            mx = fmax(mx, z[j]);
        for (int j = 0; s->ce && j < C; j++)
            sum += exp(z[j] - mx);
        for (int j = 0; j < C; j++)
            dz[(size_t)i * C + j] = s->ce ? (float)((exp(z[j] - mx) / sum - (j == s->labels[i])) / B)
                                          : (float)(1.0 / ((double)B * C));
    }
    *rel = 0;
    const char *what = "";
    int worst = 0;
    for (int l = L - 1; l >= 0; l--) {
        int in = d[l], out = d[l + 1];
        size_t nz = (size_t)B * out;
        if (stack_relu(s, l))
            for (size_t i = 0; i < nz; i++)
                if (!(s->Z[l][i] > 0)) s->dZ[l][i] = 0;
        const float *a = l ? s->Z[l - 1] : s->X;
        bench_sgemm(true, false, out, in, B, s->dZ[l], out, a, in, s->dW[l], in);
        float *db = calloc((size_t)out, sizeof *db);
        float *gw = bench_copy_f32(tg_grad(tg_linear_weight(s->l[l])));
        float *gb = bench_copy_f32(tg_grad(tg_linear_bias(s->l[l])));
        if (!db || !gw || !gb) {
            free(db);
            free(gw);
            free(gb);
            return bench_lib_fail(err, errlen, "stack gradient");
        }
        for (size_t i = 0; i < nz; i++)
            db[i % (size_t)out] += s->dZ[l][i];
        double ew = rel_err(gw, s->dW[l], (size_t)in * out), eb = rel_err(gb, db, (size_t)out);
        if (ew > *rel || eb > *rel) {
            *rel = fmax(ew, eb);
            what = ew >= eb ? "weight" : "bias";
            worst = l;
        }
        free(db);
        free(gw);
        free(gb);
        if (!l) break;
        bench_sgemm(false, false, B, in, out, s->dZ[l], out, s->W[l], in, s->dH[l], in);
        memcpy(s->dZ[l - 1], s->dH[l], (size_t)B * in * sizeof(float));
    }
    if (!(*rel <= 1e-3))
        return bench_fail(err, errlen,
                          "fc%d.%s gradient disagrees with plain C: relative error %.3g",
                          worst + 1, what, *rel);
    return 0;
}

/* What every Linear stack's workload does. */
#define STACK_FNS                                                                                  \
    .params = stack_params, .forward = stack_forward, .reference = stack_reference,               \
    .check_grad = stack_check_grad, .gemm = stack_gemm, .forward_lean = stack_forward_lean,       \
    .teardown = stack_teardown

const int bench_mlp_dims[4] = {784, 512, 512, 10};

static void *mlp_setup(char *err, size_t errlen)
{
    return stack_setup(3, bench_mlp_dims, BENCH_MLP_BATCH, true, false, 5, err, errlen);
}

/* 2 m n k per GEMM. */
#define MLP_FWD (GEMM_FLOPS(128, 512, 784) + GEMM_FLOPS(128, 512, 512) + GEMM_FLOPS(128, 10, 512))

const bench_workload bench_wl_mlp = {
    .name = "mlp",
    .desc = "MLP 784-512-512-10, ReLU, batch 128, cross-entropy",
    .sequential = true,
    .check_tol = 1e-4,
    .gemm_desc = "3 forward, 3 dW, 2 dX",
    .gemm_flops_fwd = MLP_FWD,
    /* backward: every dW, and dX above the first layer */
    .gemm_flops_all = 2 * MLP_FWD + GEMM_FLOPS(128, 512, 512) + GEMM_FLOPS(128, 10, 512),
    .setup = mlp_setup,
    STACK_FNS,
};

/* deep and wide: 16 x (Linear W + ReLU), He init, the mean of the output
 * as the loss. Forward GEMMs: one a layer; backward: a dW each and a dX
 * above the first. */
#define SQUARE_L 16
#define SQUARE_ONE(b, w) GEMM_FLOPS(b, w, w)

static void *square_setup(int width, int batch, uint64_t seed, char *err, size_t errlen)
{
    int dims[SQUARE_L + 1];
    for (int l = 0; l <= SQUARE_L; l++)
        dims[l] = width;
    return stack_setup(SQUARE_L, dims, batch, false, true, seed, err, errlen);
}

static void *deep_setup(char *err, size_t errlen)
{
    return square_setup(1024, 256, 6, err, errlen);
}

const bench_workload bench_wl_deep = {
    .name = "deep",
    .desc = "16 x (Linear 1024 + ReLU), batch 256, He init, mean of the output",
    .sequential = true,
    .check_tol = 1e-4,
    .gemm_desc = "16 forward, 16 dW, 15 dX",
    .gemm_flops_fwd = SQUARE_L * SQUARE_ONE(256, 1024),
    .gemm_flops_all = (3 * SQUARE_L - 1) * SQUARE_ONE(256, 1024),
    .setup = deep_setup,
    STACK_FNS,
};

/* wide: activations (2 MB each) outweigh the weights (256 KB). */
static void *wide_setup(char *err, size_t errlen)
{
    return square_setup(256, 2048, 9, err, errlen);
}

const bench_workload bench_wl_wide = {
    .name = "wide",
    .desc = "16 x (Linear 256 + ReLU), batch 2048, He init, mean of the output",
    .sequential = true,
    .check_tol = 1e-4,
    .gemm_desc = "16 forward, 16 dW, 15 dX",
    .gemm_flops_fwd = SQUARE_L * SQUARE_ONE(2048, 256),
    .gemm_flops_all = (3 * SQUARE_L - 1) * SQUARE_ONE(2048, 256),
    .setup = wide_setup,
    STACK_FNS,
};

/* ---- conv: conv2d 1->16 3x3 (no padding) on 28x28, batch 64, ReLU, then
 * Linear 16*26*26 -> 10 and cross-entropy. */
#define CV_B 64
#define CV_C 16
#define CV_HW 28
#define CV_O 26 /* 28 - 3 + 1 */
#define CV_F (CV_C * CV_O * CV_O)
#define CV_K 10

typedef struct {
    tg_params *ps;
    tg_conv2d_layer *conv;
    tg_linear *fc;
    tg_sequential *seq; /* conv, relu, flatten, fc */
    tg_tensor *x, *y; /* (B, 1, 28, 28), (B) */
    int64_t labels[CV_B];
    float *X, *A, *Wf, *Z, *dZ, *dA, *dWf; /* raw: input, fc input, fc weight, ... */
} conv_st;

static void conv_teardown(void *p)
{
    conv_st *s = p;
    if (!s) return;
    tg_sequential_free(s->seq);
    tg_conv2d_layer_free(s->conv);
    tg_linear_free(s->fc);
    tg_params_free(s->ps);
    tg_tensor_release(s->x);
    tg_tensor_release(s->y);
    free(s->X);
    free(s->A);
    free(s->Wf);
    free(s->Z);
    free(s->dZ);
    free(s->dA);
    free(s->dWf);
    free(s);
}

static void *conv_setup(char *err, size_t errlen)
{
    conv_st *s = calloc(1, sizeof *s);
    tg_rng rng;
    if (!s) return bench_setup_failed(err, errlen, "conv setup");
    tg_rng_seed(&rng, 7);
    s->ps = tg_params_new();
    s->conv =
        s->ps ? tg_conv2d_layer_new(s->ps, "conv", 1, CV_C, 3, 3, NULL, true, TG_F32, &rng) : NULL;
    s->fc = s->conv ? tg_linear_new(s->ps, "fc", CV_F, CV_K, true, TG_F32, &rng) : NULL;
    s->seq = s->fc ? tg_sequential_new() : NULL;
    if (s->seq && (tg_sequential_add_conv2d(s->seq, s->conv) ||
                   tg_sequential_add_map(s->seq, tg_relu) || tg_sequential_add_flatten(s->seq) ||
                   tg_sequential_add_linear(s->seq, s->fc) ||
                   tg_sequential_add_stage(s->seq, ce_stage, &s->y))) {
        tg_sequential_free(s->seq);
        s->seq = NULL;
    }
    s->x = tg_rand_uniform(&rng, TG_F32, 4, SHAPE(CV_B, 1, CV_HW, CV_HW), 0, 1);
    for (int i = 0; i < CV_B; i++)
        s->labels[i] = (int64_t)(tg_rng_next(&rng) % CV_K);
    s->y = tg_tensor_from_data(TG_I64, 1, SHAPE(CV_B), s->labels);
    s->X = s->x ? bench_copy_f32(s->x) : NULL;
    s->A = bench_floats((size_t)CV_B * CV_F, 0.01f);
    s->dA = bench_floats((size_t)CV_B * CV_F, 0.01f);
    s->Wf = bench_floats((size_t)CV_K * CV_F, 0.01f);
    s->dWf = bench_floats((size_t)CV_K * CV_F, 0.01f);
    s->Z = bench_floats((size_t)CV_B * CV_K, 0.01f);
    s->dZ = bench_floats((size_t)CV_B * CV_K, 0.01f);
    if (!s->seq || !s->y || !s->X || !s->A || !s->dA || !s->Wf || !s->dWf || !s->Z || !s->dZ) {
        conv_teardown(s);
        return bench_setup_failed(err, errlen, "conv setup");
    }
    return s;
}

static tg_params *conv_params(void *p)
{
    return ((conv_st *)p)->ps;
}

/* The container with the loss as its last module (lean: the conv output
 * dies once relu has run, the logits once the loss has), ceil(sqrt(5)) = 3
 * groups with segments. */
static tg_tensor *conv_forward(void *p, tg_tape *tape, int segments)
{
    conv_st *s = p;
    return tg_sequential_forward(s->seq, tape, bench_nsegments(segments), s->x);
}

/* The linear layer's GEMMs only (the convolution's are left out). */
static void conv_gemm(void *p, bool backward)
{
    conv_st *s = p;
    bench_sgemm(false, true, CV_B, CV_K, CV_F, s->A, CV_F, s->Wf, CV_F, s->Z, CV_K);
    if (!backward) return;
    bench_sgemm(true, false, CV_K, CV_F, CV_B, s->dZ, CV_K, s->A, CV_F, s->dWf, CV_F);
    bench_sgemm(false, false, CV_B, CV_F, CV_K, s->dZ, CV_K, s->Wf, CV_F, s->dA, CV_F);
}

/* Direct convolution in plain C, ReLU, then the linear layer by sgemm. */
static int conv_reference(void *p, double *loss, char *err, size_t errlen)
{
    conv_st *s = p;
    float w[CV_C * 9], b[CV_C], bf[CV_K];
    if (tg_tensor_copy_out(tg_conv2d_layer_weight(s->conv), w, sizeof w) ||
        tg_tensor_copy_out(tg_params_find(s->ps, "conv.bias"), b, sizeof b) ||
        tg_tensor_copy_out(tg_linear_weight(s->fc), s->Wf, sizeof(float) * CV_K * CV_F) ||
        tg_tensor_copy_out(tg_linear_bias(s->fc), bf, sizeof bf))
        return bench_lib_fail(err, errlen, "conv reference");
    for (int n = 0; n < CV_B; n++)
        for (int c = 0; c < CV_C; c++)
            for (int i = 0; i < CV_O; i++)
                for (int j = 0; j < CV_O; j++) {
                    float v = b[c];
                    const float *x = s->X + (size_t)n * CV_HW * CV_HW;
                    for (int di = 0; di < 3; di++)
                        for (int dj = 0; dj < 3; dj++)
                            v += w[c * 9 + di * 3 + dj] * x[(i + di) * CV_HW + j + dj];
                    s->A[(size_t)n * CV_F + (c * CV_O + i) * CV_O + j] = v > 0 ? v : 0.0f;
                }
    bench_sgemm(false, true, CV_B, CV_K, CV_F, s->A, CV_F, s->Wf, CV_F, s->Z, CV_K);
    for (int i = 0; i < CV_B * CV_K; i++)
        s->Z[i] += bf[i % CV_K];
    *loss = bench_ce_mean(s->Z, s->labels, CV_B, CV_K);
    return 0;
}

const bench_workload bench_wl_conv = {
    .name = "conv",
    .desc = "conv2d 1->16 3x3 on 28x28, batch 64, ReLU, Linear 10816->10, cross-entropy",
    .check_tol = 1e-4,
    .gemm_desc = "the linear layer's 3 GEMMs only",
    .gemm_flops_fwd = GEMM_FLOPS(CV_B, CV_K, CV_F),
    .gemm_flops_all = 3 * GEMM_FLOPS(CV_B, CV_K, CV_F),
    .setup = conv_setup,
    .params = conv_params,
    .forward = conv_forward,
    .reference = conv_reference,
    .gemm = conv_gemm,
    .teardown = conv_teardown,
};

const bench_workload *const bench_workloads[] = {
    &bench_wl_tiny, &bench_wl_chain, &bench_wl_mlp,  &bench_wl_elementwise, &bench_wl_fused,
    &bench_wl_rnn,  &bench_wl_conv,  &bench_wl_deep, NULL,
};

const bench_workload *bench_workload_find(const char *name)
{
    for (int i = 0; bench_workloads[i]; i++)
        if (strcmp(bench_workloads[i]->name, name) == 0) return bench_workloads[i];
    return NULL;
}
