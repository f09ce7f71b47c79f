/* wl_small.c - the workloads whose time is not GEMM: tiny and chain (the
 * tape's own cost per op), elementwise (memory-bound kernels over 1M
 * floats), rnn and lstm (many small ops in a loop). Each has a plain-C
 * reference of its loss, and chain and elementwise of their gradient. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/kernels.h" /* the fused baseline's vector tanh and sigmoid */
#include "bench.h"

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

/* A new parameter set plus the generator every workload seeds alike. */
static tg_params *new_params(tg_rng *rng, uint64_t seed)
{
    tg_rng_seed(rng, seed);
    return tg_params_new();
}

/* ---- tiny: MLP 2-16-16-1, tanh, batch 1, MSE */
typedef struct {
    tg_params *ps;
    tg_linear *l[3];
    tg_tensor *x, *y; /* (1, 2), (1, 1) */
} tiny_st;

static const int tiny_dims[4] = {2, 16, 16, 1};

static void tiny_teardown(void *p)
{
    tiny_st *s = p;
    if (!s) return;
    for (int i = 0; i < 3; i++)
        tg_linear_free(s->l[i]);
    tg_params_free(s->ps);
    tg_tensor_release(s->x);
    tg_tensor_release(s->y);
    free(s);
}

static void *tiny_setup(char *err, size_t errlen)
{
    tiny_st *s = calloc(1, sizeof *s);
    tg_rng rng;
    if (!s) return bench_setup_failed(err, errlen, "tiny setup");
    s->ps = new_params(&rng, 1);
    bool ok = s->ps != NULL;
    static const char *const names[3] = {"fc1", "fc2", "fc3"};
    for (int i = 0; i < 3 && ok; i++)
        ok = (s->l[i] = tg_linear_new(s->ps, names[i], tiny_dims[i], tiny_dims[i + 1], true, TG_F32,
                                      &rng)) != NULL;
    if (ok) {
        const float xv[2] = {0.5f, -1.25f}, yv[1] = {0.75f};
        s->x = tg_tensor_from_data(TG_F32, 2, SHAPE(1, 2), xv);
        s->y = tg_tensor_from_data(TG_F32, 2, SHAPE(1, 1), yv);
        ok = s->x && s->y;
    }
    if (!ok) {
        tiny_teardown(s);
        return bench_setup_failed(err, errlen, "tiny setup");
    }
    return s;
}

static tg_params *tiny_params(void *p)
{
    return ((tiny_st *)p)->ps;
}

static tg_tensor *tiny_whole(void *p, int layer, tg_tensor *x)
{
    tiny_st *s = p;
    (void)layer;
    tg_tensor *h = tg_tanh(tg_linear_forward(s->l[0], x));
    h = tg_tanh(tg_linear_forward(s->l[1], h));
    return tg_mse_loss(tg_linear_forward(s->l[2], h), s->y);
}

static tg_tensor *tiny_forward(void *p, tg_tape *tape, int segments)
{
    tiny_st *s = p;
    return segments ? tg_checkpoint(tape, tiny_whole, s, s->x) : tiny_whole(s, 0, s->x);
}

static int tiny_reference(void *p, double *loss, char *err, size_t errlen)
{
    tiny_st *s = p;
    float h[2][16], in[2] = {0.5f, -1.25f};
    const float *a = in;
    float w[16 * 16], b[16];
    double out = 0;
    for (int l = 0; l < 3; l++) {
        int ni = tiny_dims[l], no = tiny_dims[l + 1];
        if (tg_tensor_copy_out(tg_linear_weight(s->l[l]), w, sizeof w) ||
            tg_tensor_copy_out(tg_linear_bias(s->l[l]), b, sizeof b))
            return bench_lib_fail(err, errlen, "tiny reference");
        for (int o = 0; o < no; o++) {
            double z = b[o];
            for (int i = 0; i < ni; i++)
                z += (double)a[i] * w[o * ni + i];
            if (l < 2)
                h[l][o] = tanhf((float)z);
            else
                out = z;
        }
        a = h[l < 2 ? l : 1];
    }
    *loss = (out - 0.75) * (out - 0.75);
    return 0;
}

const bench_workload bench_wl_tiny = {
    .name = "tiny",
    .desc = "MLP 2-16-16-1, tanh, batch 1, MSE",
    .check_tol = 1e-4,
    .setup = tiny_setup,
    .params = tiny_params,
    .forward = tiny_forward,
    .reference = tiny_reference,
    .teardown = tiny_teardown,
};

/* ---- chain: 100 tanh on a 1-element tensor */
#define CHAIN_N BENCH_CHAIN_OPS

typedef struct {
    tg_params *ps;
    tg_tensor *x; /* (1), the parameter */
} chain_st;

static void chain_teardown(void *p)
{
    chain_st *s = p;
    if (!s) return;
    tg_params_free(s->ps);
    free(s);
}

static void *chain_setup(char *err, size_t errlen)
{
    chain_st *s = calloc(1, sizeof *s);
    if (!s) return bench_setup_failed(err, errlen, "chain setup");
    s->ps = tg_params_new();
    s->x = s->ps ? tg_params_add(s->ps, "x", TG_F32, 1, SHAPE(1)) : NULL;
    if (!s->x || tg_init_constant(s->x, 0.5)) {
        chain_teardown(s);
        return bench_setup_failed(err, errlen, "chain setup");
    }
    return s;
}

static tg_params *chain_params(void *p)
{
    return ((chain_st *)p)->ps;
}

static tg_tensor *chain_whole(void *p, int layer, tg_tensor *x)
{
    (void)p;
    (void)layer;
    for (int i = 0; i < CHAIN_N; i++)
        x = tg_tanh(x);
    return x;
}

static tg_tensor *chain_forward(void *p, tg_tape *tape, int segments)
{
    chain_st *s = p;
    return segments ? tg_checkpoint(tape, chain_whole, s, s->x) : chain_whole(s, 0, s->x);
}

/* The forward values are kept for the backward sweep, as a tape would. */
void bench_chain_plain(float x0, float *y, float *g)
{
    float ys[CHAIN_N], v = x0;
    for (int i = 0; i < CHAIN_N; i++)
        ys[i] = v = tanhf(v);
    float d = 1.0f;
    for (int i = CHAIN_N - 1; i >= 0; i--)
        d *= 1.0f - ys[i] * ys[i];
    *y = v;
    *g = d;
}

/* The chain and its derivative in plain C, from the parameter's value. */
static int chain_plain(chain_st *s, float *y, float *g)
{
    float v;
    if (tg_tensor_copy_out(s->x, &v, sizeof v)) return -1;
    bench_chain_plain(v, y, g);
    return 0;
}

static int chain_reference(void *p, double *loss, char *err, size_t errlen)
{
    float y, g;
    if (chain_plain(p, &y, &g)) return bench_lib_fail(err, errlen, "chain reference");
    *loss = y;
    return 0;
}

static int chain_check_grad(void *p, double *rel, char *err, size_t errlen)
{
    chain_st *s = p;
    float y, g;
    double gt;
    tg_tensor *gx = tg_grad(s->x);
    if (chain_plain(s, &y, &g) || !gx || tg_tensor_item(gx, &gt))
        return bench_lib_fail(err, errlen, "chain gradient");
    *rel = fabs(gt - g) / fmax(fabs((double)g), 1e-30);
    if (!(*rel <= 1e-3))
        return bench_fail(err, errlen, "chain gradient %.9g disagrees with plain C %.9g", gt,
                          (double)g);
    return 0;
}

const bench_workload bench_wl_chain = {
    .name = "chain",
    .desc = "100 x tanh on a 1-element tensor",
    .check_tol = 1e-5,
    .setup = chain_setup,
    .params = chain_params,
    .forward = chain_forward,
    .reference = chain_reference,
    .check_grad = chain_check_grad,
    .teardown = chain_teardown,
};

/* ---- elementwise: sum(tanh(x*x + 1) * sigmoid(x)), x 1M f32 */
#define ELEM_N (1 << 20)

typedef struct {
    tg_params *ps;
    tg_tensor *x; /* (1M), the parameter */
    float *dx;    /* the fused baseline's gradient */
    double sink;  /* and its loss */
    tg_fused *f;  /* the fused workload's function (elem_fn); NULL in elementwise */
} elem_st;

static void *elem_setup(char *err, size_t errlen)
{
    elem_st *s = calloc(1, sizeof *s);
    tg_rng rng;
    if (!s) return bench_setup_failed(err, errlen, "elementwise setup");
    s->ps = new_params(&rng, 3);
    s->x = s->ps ? tg_params_add(s->ps, "x", TG_F32, 1, SHAPE(ELEM_N)) : NULL;
    s->dx = malloc(ELEM_N * sizeof *s->dx);
    if (!s->x || !s->dx || tg_init_uniform(s->x, &rng, -2, 2)) {
        tg_params_free(s->ps);
        free(s->dx);
        free(s);
        return bench_setup_failed(err, errlen, "elementwise setup");
    }
    return s;
}

static void elem_teardown(void *p)
{
    elem_st *s = p;
    if (!s) return;
    tg_fused_free(s->f);
    tg_params_free(s->ps);
    free(s->dx);
    free(s);
}

static tg_params *elem_params(void *p)
{
    return ((elem_st *)p)->ps;
}

/* tanh(x*x + 1) * sigmoid(x), sequenced, since C leaves the order of a
 * call's arguments open: the sigmoid first (the order GCC gave the nested
 * call this replaced, so the recorded tape, and with it the bits of the
 * gradient, stay as they were), and the same order as elem_lean. Also the
 * fused workload's function (a tg_fused_fn). */
static tg_tensor *elem_fn(void *ud, int n, tg_tensor *const *in)
{
    (void)ud, (void)n;
    tg_tensor *x = in[0];
    tg_tensor *sg = tg_sigmoid(x);
    tg_tensor *t = tg_tanh(tg_add_scalar(tg_mul(x, x), 1.0));
    return tg_mul(t, sg);
}

static tg_tensor *elem_whole(void *p, int layer, tg_tensor *x)
{
    (void)p;
    (void)layer;
    return tg_sum(elem_fn(NULL, 1, &x));
}

static tg_tensor *elem_forward(void *p, tg_tape *tape, int segments)
{
    elem_st *s = p;
    return segments ? tg_checkpoint(tape, elem_whole, s, s->x) : elem_whole(s, 0, s->x);
}

/* elem_whole with every intermediate released once used (the caller owns
 * what it keeps out of the scope): the forward holds at most three 4 MB
 * values, and only what the policy saves outlives it. */
static tg_tensor *elem_lean(void *p, int layer, tg_tensor *x)
{
    (void)p;
    (void)layer;
    tg_tensor *sg = tg_scope_keep(tg_sigmoid(x));
    tg_tensor *a = tg_scope_keep(tg_mul(x, x));
    tg_tensor *b = tg_scope_keep(tg_add_scalar(a, 1.0));
    tg_tensor_release(a);
    tg_tensor *t = tg_scope_keep(tg_tanh(b));
    tg_tensor_release(b);
    tg_tensor *e = tg_scope_keep(tg_mul(t, sg));
    tg_tensor_release(t);
    tg_tensor_release(sg);
    tg_tensor *y = tg_sum(e);
    tg_tensor_release(e);
    return y;
}

static tg_tensor *elem_forward_lean(void *p, tg_tape *tape, int segments, tg_tensor **owned)
{
    elem_st *s = p;
    tg_tensor *loss = segments ? tg_checkpoint(tape, elem_lean, s, s->x) : elem_lean(s, 0, s->x);
    return *owned = tg_scope_keep(loss);
}

static int elem_reference(void *p, double *loss, char *err, size_t errlen)
{
    elem_st *s = p;
    const float *x = tg_tensor_data(s->x);
    if (!x) return bench_lib_fail(err, errlen, "elementwise reference");
    double total = 0;
    for (int i = 0; i < ELEM_N; i++) {
        double v = x[i];
        total += tanh(v * v + 1) / (1 + exp(-v));
    }
    *loss = total;
    return 0;
}

/* d/dx tanh(x^2+1) sig(x) = (1 - t^2) 2x sig + t sig (1 - sig). */
static int elem_check_grad(void *p, double *rel, char *err, size_t errlen)
{
    elem_st *s = p;
    const float *x = tg_tensor_data(s->x);
    tg_tensor *gt = tg_grad(s->x);
    const float *g = gt ? tg_tensor_data(gt) : NULL;
    if (!x || !g) return bench_lib_fail(err, errlen, "elementwise gradient");
    double e = 0, m = 0;
    int worst = 0;
    for (int i = 0; i < ELEM_N; i++) {
        double v = x[i], t = tanh(v * v + 1), sg = 1 / (1 + exp(-v));
        double d = (1 - t * t) * 2 * v * sg + t * sg * (1 - sg);
        if (fabs(g[i] - d) > e) {
            e = fabs(g[i] - d);
            worst = i;
        }
        m = fmax(m, fabs(d));
    }
    *rel = e / fmax(m, 1e-30);
    if (!(*rel <= 1e-4))
        return bench_fail(err, errlen,
                          "elementwise gradient disagrees with plain C: x[%d] = %g, "
                          "relative error %.3g",
                          worst, (double)x[worst], *rel);
    return 0;
}

/* The baseline: one fused pass over x in 2048-float chunks (8 KiB, in
 * L1), with tapegrad's own vector tanh and sigmoid (the kernels its ops
 * run) and the rest in plain loops the compiler vectorises: forward, the
 * loss; with backward, also d/dx = s ((1 - t^2) 2x + t (1 - s)) written
 * to a buffer. One thread, whatever --threads says. */
#define ELEM_CHUNK 2048
#define ELEM_LANES 64
static void elem_fused(void *p, bool backward)
{
    elem_st *s = p;
    const float *x = tg_tensor_data(s->x);
    tg_unary_fn th = (tg_unary_fn)tg__kernel(TG_K_TANH, TG_BACKEND_CPU, TG_F32);
    tg_unary_fn sg = (tg_unary_fn)tg__kernel(TG_K_SIGMOID, TG_BACKEND_CPU, TG_F32);
    float a[ELEM_CHUNK], t[ELEM_CHUNK], sv[ELEM_CHUNK];
    double total = 0;
    for (int o = 0; o < ELEM_N; o += ELEM_CHUNK) {
        const float *xp = x + o;
        for (int i = 0; i < ELEM_CHUNK; i++) a[i] = xp[i] * xp[i] + 1.0f;
        th(ELEM_CHUNK, a, t, 0);
        sg(ELEM_CHUNK, xp, sv, 0);
        /* ELEM_LANES partial sums: a single running sum is a chain of
         * dependent adds the compiler may not reorder (no -ffast-math),
         * four cycles each; lanes let it vectorise, as sum_f32 is. */
        float acc[ELEM_LANES] = {0};
        for (int i = 0; i < ELEM_CHUNK; i += ELEM_LANES)
            for (int l = 0; l < ELEM_LANES; l++) acc[l] += t[i + l] * sv[i + l];
        float chunk = 0;
        for (int l = 0; l < ELEM_LANES; l++) chunk += acc[l];
        total += chunk;
        if (backward) {
            float *d = s->dx + o;
            for (int i = 0; i < ELEM_CHUNK; i++)
                d[i] = sv[i] * ((1.0f - t[i] * t[i]) * 2.0f * xp[i] + t[i] * (1.0f - sv[i]));
        }
    }
    s->sink = total;
}

/* ---- fused: the same loss through a fused function, tg_fused_sum of
 * elem_fn (the ops elem_whole sums): one recorded node that writes no
 * intermediate and, recorded, makes x's gradient with its forward
 * (include/tapegrad/fused.h); the loss and the gradient are elementwise's,
 * bit for bit. */
static void *fused_setup(char *err, size_t errlen)
{
    elem_st *s = elem_setup(err, errlen);
    if (!s) return NULL;
    s->f = tg_fused_new(elem_fn, NULL, 1);
    if (!s->f) {
        elem_teardown(s);
        return bench_setup_failed(err, errlen, "fused setup");
    }
    return s;
}

static tg_tensor *fused_whole(void *p, int layer, tg_tensor *x)
{
    (void)layer;
    return tg_fused_sum(((elem_st *)p)->f, 1, &x);
}

static tg_tensor *fused_forward(void *p, tg_tape *tape, int segments)
{
    elem_st *s = p;
    return segments ? tg_checkpoint(tape, fused_whole, s, s->x) : fused_whole(s, 0, s->x);
}

/* The forward keeps no intermediate: the lean forward is the forward. */
static tg_tensor *fused_forward_lean(void *p, tg_tape *tape, int segments, tg_tensor **owned)
{
    return *owned = tg_scope_keep(fused_forward(p, tape, segments));
}

const bench_workload bench_wl_fused = {
    .name = "fused",
    .desc = "elementwise's loss as one fused call (tg_fused_sum), x 1M f32",
    .check_tol = 1e-4,
    .gemm_desc = "no GEMMs: one fused pass of tapegrad's vector kernels over 2048-float chunks",
    .baseline = "fused pass",
    .setup = fused_setup,
    .params = elem_params,
    .forward = fused_forward,
    .gemm = elem_fused,
    .reference = elem_reference,
    .check_grad = elem_check_grad,
    .forward_lean = fused_forward_lean,
    .teardown = elem_teardown,
};

const bench_workload bench_wl_elementwise = {
    .name = "elementwise",
    .desc = "sum(tanh(x*x + 1) * sigmoid(x)), x 1M f32",
    .check_tol = 1e-4,
    .gemm_desc = "no GEMMs: one fused pass of tapegrad's vector kernels over 2048-float chunks",
    .baseline = "fused pass",
    .setup = elem_setup,
    .params = elem_params,
    .forward = elem_forward,
    .gemm = elem_fused,
    .reference = elem_reference,
    .check_grad = elem_check_grad,
    .forward_lean = elem_forward_lean,
    .teardown = elem_teardown,
};

/* ---- rnn: vanilla tanh RNN cell, one-hot inputs over a vocabulary of 64,
 * hidden 128, 64 steps, batch 32; a linear read-out to the vocabulary and
 * cross-entropy against the next token at every step, averaged. */
#define RNN_V 64
#define RNN_H 128
#define RNN_T 64
#define RNN_B 32

typedef struct {
    tg_params *ps;
    tg_rnn_cell *cell;
    tg_linear *out;
    tg_tensor *xs[RNN_T]; /* (B, V) one-hot f32 */
    tg_tensor *ys[RNN_T]; /* (B) i64: the next token */
    tg_tensor *h0;        /* (B, H) zeros */
    int64_t tok[RNN_T + 1][RNN_B];
    /* Raw GEMM buffers: inputs, hidden states, weights, gradients. */
    float *X, *Hs, *Wih, *Whh, *Wo, *Z, *dZ, *dH, *dWih, *dWhh, *dWo;
} rnn_st;

static void rnn_teardown(void *p)
{
    rnn_st *s = p;
    if (!s) return;
    for (int t = 0; t < RNN_T; t++) {
        tg_tensor_release(s->xs[t]);
        tg_tensor_release(s->ys[t]);
    }
    tg_tensor_release(s->h0);
    tg_rnn_cell_free(s->cell);
    tg_linear_free(s->out);
    float *bufs[] = {s->X, s->Hs, s->Wih, s->Whh, s->Wo, s->Z, s->dZ, s->dH, s->dWih, s->dWhh, s->dWo};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    tg_params_free(s->ps);
    free(s);
}

static void *rnn_setup(char *err, size_t errlen)
{
    rnn_st *s = calloc(1, sizeof *s);
    tg_rng rng;
    if (!s) return bench_setup_failed(err, errlen, "rnn setup");
    s->ps = new_params(&rng, 4);
    s->cell = s->ps ? tg_rnn_cell_new(s->ps, "rnn", RNN_V, RNN_H, TG_F32, &rng) : NULL;
    s->out = s->cell ? tg_linear_new(s->ps, "out", RNN_H, RNN_V, true, TG_F32, &rng) : NULL;
    s->h0 = tg_zeros(TG_F32, 2, SHAPE(RNN_B, RNN_H));
    bool ok = s->out && s->h0;
    for (int t = 0; t <= RNN_T; t++)
        for (int b = 0; b < RNN_B; b++)
            s->tok[t][b] = (int64_t)(tg_rng_next(&rng) % RNN_V);
    static float onehot[RNN_B * RNN_V];
    for (int t = 0; t < RNN_T && ok; t++) {
        memset(onehot, 0, sizeof onehot);
        for (int b = 0; b < RNN_B; b++)
            onehot[b * RNN_V + s->tok[t][b]] = 1.0f;
        s->xs[t] = tg_tensor_from_data(TG_F32, 2, SHAPE(RNN_B, RNN_V), onehot);
        s->ys[t] = tg_tensor_from_data(TG_I64, 1, SHAPE(RNN_B), s->tok[t + 1]);
        ok = s->xs[t] && s->ys[t];
    }
    s->X = bench_floats((size_t)RNN_T * RNN_B * RNN_V, 1.0f);
    s->Hs = bench_floats((size_t)(RNN_T + 1) * RNN_B * RNN_H, 1.0f);
    s->Wih = bench_floats((size_t)RNN_H * RNN_V, 0.1f);
    s->Whh = bench_floats((size_t)RNN_H * RNN_H, 0.1f);
    s->Wo = bench_floats((size_t)RNN_V * RNN_H, 0.1f);
    s->Z = bench_floats((size_t)RNN_B * RNN_V, 1.0f);
    s->dZ = bench_floats((size_t)RNN_B * RNN_V, 1.0f);
    s->dH = bench_floats((size_t)RNN_B * RNN_H, 1.0f);
    s->dWih = bench_floats((size_t)RNN_H * RNN_V, 1.0f);
    s->dWhh = bench_floats((size_t)RNN_H * RNN_H, 1.0f);
    s->dWo = bench_floats((size_t)RNN_V * RNN_H, 1.0f);
    ok = ok && s->X && s->Hs && s->Wih && s->Whh && s->Wo && s->Z && s->dZ && s->dH && s->dWih &&
         s->dWhh && s->dWo;
    if (!ok) {
        rnn_teardown(s);
        return bench_setup_failed(err, errlen, "rnn setup");
    }
    return s;
}

/* The GEMMs tapegrad runs, with raw cblas_sgemm: per step x W_ih^T (the
 * one-hot input as a dense (B, V) matrix, as tg_linear multiplies it),
 * h W_hh^T and h W_o^T; backward, a dW for each of the three and a dX for
 * the two whose input needs a gradient (not h0 at the first step). */
static void rnn_gemm(void *p, bool backward)
{
    rnn_st *s = p;
    const int B = RNN_B, V = RNN_V, H = RNN_H;
    for (int t = 0; t < RNN_T; t++) {
        float *x = s->X + (size_t)t * B * V, *h = s->Hs + (size_t)t * B * H;
        float *h2 = s->Hs + (size_t)(t + 1) * B * H;
        bench_sgemm(false, true, B, H, V, x, V, s->Wih, V, h2, H);
        bench_sgemm(false, true, B, H, H, h, H, s->Whh, H, h2, H);
        bench_sgemm(false, true, B, V, H, h2, H, s->Wo, H, s->Z, V);
    }
    if (!backward) return;
    for (int t = RNN_T - 1; t >= 0; t--) {
        float *x = s->X + (size_t)t * B * V, *h = s->Hs + (size_t)t * B * H;
        float *h2 = s->Hs + (size_t)(t + 1) * B * H;
        bench_sgemm(true, false, V, H, B, s->dZ, V, h2, H, s->dWo, H);
        bench_sgemm(false, false, B, H, V, s->dZ, V, s->Wo, H, s->dH, H);
        bench_sgemm(true, false, H, H, B, s->dH, H, h, H, s->dWhh, H);
        if (t) bench_sgemm(false, false, B, H, H, s->dH, H, s->Whh, H, h, H);
        bench_sgemm(true, false, H, V, B, s->dH, H, x, V, s->dWih, V);
    }
}

static tg_params *rnn_params(void *p)
{
    return ((rnn_st *)p)->ps;
}

static tg_tensor *rnn_whole(void *p, int layer, tg_tensor *h)
{
    rnn_st *s = p;
    (void)layer;
    tg_tensor *loss = NULL;
    for (int t = 0; t < RNN_T; t++) {
        h = tg_rnn_cell_forward(s->cell, s->xs[t], h);
        tg_tensor *l = tg_cross_entropy(tg_linear_forward(s->out, h), s->ys[t]);
        loss = loss ? tg_add(loss, l) : l;
    }
    return tg_mul_scalar(loss, 1.0 / RNN_T);
}

static tg_tensor *rnn_forward(void *p, tg_tape *tape, int segments)
{
    rnn_st *s = p;
    return segments ? tg_checkpoint(tape, rnn_whole, s, s->h0) : rnn_whole(s, 0, s->h0);
}

static int rnn_reference(void *p, double *loss, char *err, size_t errlen)
{
    rnn_st *s = p;
    tg_params *ps = s->ps;
    float *wih = bench_copy_f32(tg_params_find(ps, "rnn.weight_ih"));
    float *whh = bench_copy_f32(tg_params_find(ps, "rnn.weight_hh"));
    float *bih = bench_copy_f32(tg_params_find(ps, "rnn.bias_ih"));
    float *bhh = bench_copy_f32(tg_params_find(ps, "rnn.bias_hh"));
    float *wo = bench_copy_f32(tg_params_find(ps, "out.weight"));
    float *bo = bench_copy_f32(tg_params_find(ps, "out.bias"));
    float *h = calloc(RNN_B * RNN_H, sizeof *h), *pre = malloc(RNN_B * RNN_H * sizeof *pre);
    float *z = malloc(RNN_B * RNN_V * sizeof *z);
    int rc = 0;
    if (!wih || !whh || !bih || !bhh || !wo || !bo || !h || !pre || !z) {
        rc = bench_lib_fail(err, errlen, "rnn reference");
        goto out;
    }
    double total = 0;
    for (int t = 0; t < RNN_T; t++) {
        /* pre = onehot(x) W_ih^T + h W_hh^T: the one-hot product is a column of W_ih. */
        bench_sgemm(false, true, RNN_B, RNN_H, RNN_H, h, RNN_H, whh, RNN_H, pre, RNN_H);
        for (int b = 0; b < RNN_B; b++)
            for (int j = 0; j < RNN_H; j++) {
                float v = pre[b * RNN_H + j] + wih[j * RNN_V + s->tok[t][b]] + bih[j] + bhh[j];
                h[b * RNN_H + j] = tanhf(v);
            }
        bench_sgemm(false, true, RNN_B, RNN_V, RNN_H, h, RNN_H, wo, RNN_H, z, RNN_V);
        for (int b = 0; b < RNN_B; b++)
            for (int j = 0; j < RNN_V; j++)
                z[b * RNN_V + j] += bo[j];
        total += bench_ce_mean(z, s->tok[t + 1], RNN_B, RNN_V);
    }
    *loss = total / RNN_T;
out:
    free(wih);
    free(whh);
    free(bih);
    free(bhh);
    free(wo);
    free(bo);
    free(h);
    free(pre);
    free(z);
    return rc;
}

const bench_workload bench_wl_rnn = {
    .name = "rnn",
    .desc = "tanh RNN cell, one-hot vocab 64, hidden 128, 64 steps, batch 32, CE each step",
    .check_tol = 1e-4,
    .gemm_desc = "192 forward, 192 dW, 127 dX",
    .gemm_flops_fwd = RNN_T * (GEMM_FLOPS(RNN_B, RNN_H, RNN_V) + GEMM_FLOPS(RNN_B, RNN_H, RNN_H) +
                               GEMM_FLOPS(RNN_B, RNN_V, RNN_H)),
    .gemm_flops_all = RNN_T * 2 *
                          (GEMM_FLOPS(RNN_B, RNN_H, RNN_V) + GEMM_FLOPS(RNN_B, RNN_H, RNN_H) +
                           GEMM_FLOPS(RNN_B, RNN_V, RNN_H)) +
                      (RNN_T - 1) * GEMM_FLOPS(RNN_B, RNN_H, RNN_H) +
                      RNN_T * GEMM_FLOPS(RNN_B, RNN_H, RNN_V),
    .gemm = rnn_gemm,
    .setup = rnn_setup,
    .params = rnn_params,
    .forward = rnn_forward,
    .reference = rnn_reference,
    .teardown = rnn_teardown,
};

/* ---- lstm: tg_lstm_cell 32 -> 128, batch 32, 32 steps over random
 * normal inputs from h = c = 0; the loss is the mean of h^2 and c^2 after
 * the last step. The state is carried as hc = [h c] (B, 2H), one tensor,
 * so that tg_checkpoint_sequential can cut between steps. */
#define LSTM_I 32
#define LSTM_H 128
#define LSTM_T 32
#define LSTM_B 32

typedef struct {
    tg_params *ps;
    tg_lstm_cell *cell;
    tg_lstm_layer *layer;  /* lstm-seq: instead of the cell */
    tg_tensor *xs[LSTM_T]; /* (B, I) */
    tg_tensor *x;          /* lstm-seq: the xs as one (T, B, I) */
    tg_tensor *hc0;        /* (B, 2H) zeros */
} lstm_st;

static void lstm_teardown(void *p)
{
    lstm_st *s = p;
    if (!s) return;
    for (int t = 0; t < LSTM_T; t++)
        tg_tensor_release(s->xs[t]);
    tg_tensor_release(s->hc0);
    tg_tensor_release(s->x);
    tg_lstm_layer_free(s->layer);
    tg_lstm_cell_free(s->cell);
    tg_params_free(s->ps);
    free(s);
}

/* The cell, or for lstm-seq the layer (the same parameters: they draw
 * alike), and the same inputs. */
static void *lstm_setup_as(bool layer, char *err, size_t errlen)
{
    lstm_st *s = calloc(1, sizeof *s);
    tg_rng rng;
    if (!s) return bench_setup_failed(err, errlen, "lstm setup");
    s->ps = new_params(&rng, 8);
    if (s->ps && layer) s->layer = tg_lstm_layer_new(s->ps, "lstm", LSTM_I, LSTM_H, TG_F32, &rng);
    if (s->ps && !layer) s->cell = tg_lstm_cell_new(s->ps, "lstm", LSTM_I, LSTM_H, TG_F32, &rng);
    bool ok = s->cell || s->layer;
    for (int t = 0; t < LSTM_T && ok; t++)
        ok = (s->xs[t] = tg_rand_normal(&rng, TG_F32, 2, SHAPE(LSTM_B, LSTM_I), 0, 1)) != NULL;
    if (ok) ok = (s->hc0 = tg_zeros(TG_F32, 2, SHAPE(LSTM_B, 2 * LSTM_H))) != NULL;
    if (ok && layer) ok = (s->x = tg_zeros(TG_F32, 3, SHAPE(LSTM_T, LSTM_B, LSTM_I))) != NULL;
    for (int t = 0; t < LSTM_T && ok && layer; t++)
        memcpy((float *)tg_tensor_data(s->x) + (size_t)t * LSTM_B * LSTM_I,
               tg_tensor_data(s->xs[t]), sizeof(float) * LSTM_B * LSTM_I);
    if (!ok) {
        lstm_teardown(s);
        return bench_setup_failed(err, errlen, "lstm setup");
    }
    return s;
}

static void *lstm_setup(char *err, size_t errlen)
{
    return lstm_setup_as(false, err, errlen);
}

static tg_params *lstm_params(void *p)
{
    return ((lstm_st *)p)->ps;
}

static tg_tensor *lstm_step(void *p, int t, tg_tensor *hc)
{
    lstm_st *s = p;
    tg_tensor *h2, *c2;
    tg_tensor *h = tg_narrow(hc, 1, 0, LSTM_H), *c = tg_narrow(hc, 1, LSTM_H, LSTM_H);
    if (tg_lstm_cell_forward(s->cell, s->xs[t], h, c, &h2, &c2)) return NULL;
    tg_tensor *both[2] = {h2, c2};
    return tg_concat(2, both, 1);
}

static tg_tensor *lstm_forward(void *p, tg_tape *tape, int segments)
{
    lstm_st *s = p;
    tg_tensor *hc = s->hc0;
    if (segments)
        hc = tg_checkpoint_sequential(tape, LSTM_T, 0, lstm_step, s, hc);
    else
        for (int t = 0; t < LSTM_T && hc; t++)
            hc = lstm_step(s, t, hc);
    return tg_mean(tg_mul(hc, hc));
}

static tg_tensor *lstm_forward_lean(void *p, tg_tape *tape, int segments, tg_tensor **owned)
{
    lstm_st *s = p;
    tg_tensor *hc = bench_lean_stages(tape, segments, LSTM_T, lstm_step, s, s->hc0);
    *owned = hc;
    return tg_mean(tg_mul(hc, hc));
}

static float sigmoidf(float v)
{
    return 1.0f / (1.0f + expf(-v));
}

/* z = x W_ih^T + b_ih + h W_hh^T + b_hh, gates i f g o in that order. */
static int lstm_reference(void *p, double *loss, char *err, size_t errlen)
{
    lstm_st *s = p;
    enum { B = LSTM_B, I = LSTM_I, H = LSTM_H, G = 4 * LSTM_H };
    float *wih = bench_copy_f32(tg_params_find(s->ps, "lstm.weight_ih"));
    float *whh = bench_copy_f32(tg_params_find(s->ps, "lstm.weight_hh"));
    float *bih = bench_copy_f32(tg_params_find(s->ps, "lstm.bias_ih"));
    float *bhh = bench_copy_f32(tg_params_find(s->ps, "lstm.bias_hh"));
    float *h = calloc(B * H, sizeof *h), *c = calloc(B * H, sizeof *c);
    float *zx = malloc(B * G * sizeof *zx), *zh = malloc(B * G * sizeof *zh);
    float *x = NULL;
    int rc = 0;
    if (!wih || !whh || !bih || !bhh || !h || !c || !zx || !zh) {
        rc = bench_lib_fail(err, errlen, "lstm reference");
        goto out;
    }
    for (int t = 0; t < LSTM_T; t++) {
        free(x);
        if (!(x = bench_copy_f32(s->xs[t]))) {
            rc = bench_lib_fail(err, errlen, "lstm reference");
            goto out;
        }
        bench_sgemm(false, true, B, G, I, x, I, wih, I, zx, G);
        bench_sgemm(false, true, B, G, H, h, H, whh, H, zh, G);
        for (int b = 0; b < B; b++)
            for (int j = 0; j < H; j++) {
                float z[4];
                for (int k = 0; k < 4; k++) {
                    int q = k * H + j;
                    z[k] = zx[b * G + q] + bih[q] + zh[b * G + q] + bhh[q];
                }
                float *cv = &c[b * H + j];
                *cv = sigmoidf(z[1]) * *cv + sigmoidf(z[0]) * tanhf(z[2]);
                h[b * H + j] = sigmoidf(z[3]) * tanhf(*cv);
            }
    }
    double total = 0;
    for (int i = 0; i < B * H; i++)
        total += (double)h[i] * h[i] + (double)c[i] * c[i];
    *loss = total / (2.0 * B * H);
out:
    free(wih);
    free(whh);
    free(bih);
    free(bhh);
    free(h);
    free(c);
    free(zx);
    free(zh);
    free(x);
    return rc;
}

/* ---- lstm-seq: lstm's model as tg_lstm_layer, its 32 steps one lstm
 * op on the inputs as (T, B, I); the loss and the plain-C check are
 * lstm's. Being one node, under segments it is checkpointed whole (one
 * tg_checkpoint segment), as the elementwise chain is. */
static void *lstm_seq_setup(char *err, size_t errlen)
{
    return lstm_setup_as(true, err, errlen);
}

static tg_tensor *lstm_seq_whole(void *p, int part, tg_tensor *x)
{
    lstm_st *s = p;
    (void)part;
    tg_tensor *hc[2];
    if (tg_lstm_layer_forward(s->layer, x, NULL, NULL, NULL, &hc[0], &hc[1])) return NULL;
    tg_tensor *both = tg_concat(2, hc, 1);
    return tg_mean(tg_mul(both, both));
}

static tg_tensor *lstm_seq_forward(void *p, tg_tape *tape, int segments)
{
    lstm_st *s = p;
    return segments ? tg_checkpoint(tape, lstm_seq_whole, s, s->x) : lstm_seq_whole(s, 0, s->x);
}

/* Lean is the forward itself: the op keeps what it needs, and the views,
 * states and weights around it are what it saves. */
static tg_tensor *lstm_seq_forward_lean(void *p, tg_tape *tape, int segments, tg_tensor **owned)
{
    *owned = NULL;
    return lstm_seq_forward(p, tape, segments);
}

const bench_workload bench_wl_lstm_seq = {
    .name = "lstm-seq",
    .desc = "LSTM layer (one lstm op), input 32, hidden 128, batch 32, 32 steps, mean of h^2 "
            "and c^2",
    .check_tol = 1e-4,
    .setup = lstm_seq_setup,
    .params = lstm_params,
    .forward = lstm_seq_forward,
    .reference = lstm_reference,
    .forward_lean = lstm_seq_forward_lean,
    .teardown = lstm_teardown,
};

const bench_workload bench_wl_lstm = {
    .name = "lstm",
    .desc = "LSTM cell, input 32, hidden 128, batch 32, 32 steps, mean of h^2 and c^2",
    .sequential = true,
    .check_tol = 1e-4,
    .setup = lstm_setup,
    .params = lstm_params,
    .forward = lstm_forward,
    .reference = lstm_reference,
    .forward_lean = lstm_forward_lean,
    .teardown = lstm_teardown,
};
