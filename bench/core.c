/* core.c - the two figures that say what tapegrad costs:
 *   (a) the fixed cost per op of recording and differentiating it, on
 *       1-element tensors where the arithmetic is nothing;
 *   (b) the overhead over raw OpenBLAS on an MLP whose time is all GEMM
 *       (weights (in, out) as plain leaves, no layer objects).
 * Each result is checked against a reference before anything is timed.
 * Times are CLOCK_MONOTONIC medians over several runs after warm-up. The
 * bench_core executable prints both; the suite's chain workload reports
 * (a) beside its own figures. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define CHAIN_OPS 100

/* ---- (a) tanh chain */
typedef enum { CHAIN_TAPE, CHAIN_FWD, CHAIN_PLAIN } chain_kind;

typedef struct {
    tg_tape *tape;
    tg_tensor *x; /* 1-element f32 leaf */
    float x0;
} chain_bench;

/* The plain C baseline: the same chain and its derivative, forward values
 * kept for the backward sweep as a tape would. The volatile input and sink
 * keep the compiler from hoisting the chain out of the repetitions. */
static volatile float plain_sink;

static void plain_chain(float x0, float *y_out, float *g_out)
{
    float ys[CHAIN_OPS];
    float y = x0;
    for (int i = 0; i < CHAIN_OPS; i++)
        ys[i] = y = tanhf(y);
    float g = 1.0f;
    for (int i = CHAIN_OPS - 1; i >= 0; i--)
        g *= 1.0f - ys[i] * ys[i];
    *y_out = y;
    *g_out = g;
}

/* One repetition: build the chain (and differentiate it). Returns the
 * status; *y gets the chain's value when asked. */
static tg_status chain_once(chain_bench *b, chain_kind kind, double *y)
{
    if (kind == CHAIN_PLAIN) {
        float yv, gv;
        plain_chain(*(volatile float *)&b->x0, &yv, &gv); /* not hoistable */
        plain_sink = yv + gv;
        return TG_OK;
    }
    tg_scope_begin();
    tg_tensor *t = b->x;
    for (int i = 0; i < CHAIN_OPS; i++)
        t = tg_tanh(t);
    tg_status st = t ? TG_OK : tg_last_error();
    if (!st && y) st = tg_tensor_item(t, y);
    if (!st && kind == CHAIN_TAPE) st = tg_backward(t);
    tg_scope_end();
    if (kind == CHAIN_TAPE) tg_tape_reset(b->tape);
    return st;
}

/* ns for reps repetitions of kind. Grad mode is off for CHAIN_FWD only. */
static tg_status chain_time(chain_bench *b, chain_kind kind, long reps, double *ns)
{
    bool prev = tg_grad_set_enabled(kind != CHAIN_FWD);
    tg_status st = TG_OK;
    double t0 = bench_now_ns();
    for (long r = 0; r < reps && !st; r++) {
        st = chain_once(b, kind, NULL);
        /* A training step clears the gradient; without it the leaf would
         * also pay an accumulate per repetition. */
        if (kind == CHAIN_TAPE) tg_grad_zero(b->x);
    }
    *ns = bench_now_ns() - t0;
    tg_grad_set_enabled(prev);
    return st;
}

/* Runs the chain once on the tape and compares value and gradient with
 * plain C. */
static int chain_check(chain_bench *b, double *err_out, char *err, size_t errlen)
{
    double y;
    tg_grad_zero(b->x);
    if (chain_once(b, CHAIN_TAPE, &y)) return bench_lib_fail(err, errlen, "tanh chain");
    double g;
    tg_tensor *gt = tg_grad(b->x);
    if (!gt || tg_tensor_item(gt, &g)) return bench_lib_fail(err, errlen, "tanh chain gradient");
    tg_grad_zero(b->x);
    float yr, gr;
    plain_chain(b->x0, &yr, &gr);
    double ey = fabs(y - yr), eg = fabs(g - gr) / fmax(fabs(gr), 1e-30);
    *err_out = fmax(ey, eg);
    if (!(ey <= 1e-5 && eg <= 1e-3))
        return bench_fail(err, errlen,
                          "tanh chain disagrees with plain C: value %.9g vs %.9g, "
                          "gradient %.9g vs %.9g",
                          y, (double)yr, g, (double)gr);
    return 0;
}

int bench_chain(const bench_opts *opts, bench_chain_result *res, char *err, size_t errlen)
{
    bool quick = opts && opts->quick;
    int runs = quick ? 5 : 15, warm = quick ? 1 : 3;
    double target_ns = quick ? 2e6 : 2e7; /* per timed run */
    memset(res, 0, sizeof *res);
    res->ops = CHAIN_OPS;
    res->runs = runs;

    chain_bench b = {.x0 = 0.5f};
    int rc = -1;
    tg_backend prev_backend = tg_set_default_backend(TG_BACKEND_CPU);
    b.tape = tg_tape_new(NULL);
    int64_t one = 1;
    b.x = b.tape ? tg_tensor_from_data(TG_F32, 1, &one, &b.x0) : NULL;
    if (!b.x || tg_requires_grad(b.tape, b.x)) {
        rc = bench_lib_fail(err, errlen, "tanh chain setup");
        goto out;
    }
    if (chain_check(&b, &res->check_err, err, errlen)) goto out;

    double per_op[3];
    double times[32];
    for (int k = 0; k < 3; k++) {
        chain_kind kind = (chain_kind)k;
        /* Calibrate: double the repetitions until one run is long enough
         * for the clock and scheduler noise not to matter. */
        long reps = 1;
        double ns = 0;
        for (;;) {
            if (chain_time(&b, kind, reps, &ns)) {
                rc = bench_lib_fail(err, errlen, "tanh chain");
                goto out;
            }
            if (ns >= target_ns || reps >= (1L << 30)) break;
            reps *= 2;
        }
        for (int r = 0; r < warm + runs; r++) {
            if (chain_time(&b, kind, reps, &ns)) {
                rc = bench_lib_fail(err, errlen, "tanh chain");
                goto out;
            }
            if (r >= warm) times[r - warm] = ns / ((double)reps * CHAIN_OPS);
        }
        per_op[k] = bench_median(times, runs);
    }
    res->fwd_bwd_ns = per_op[CHAIN_TAPE];
    res->fwd_only_ns = per_op[CHAIN_FWD];
    res->plain_ns = per_op[CHAIN_PLAIN];
    res->ratio_vs_plain = res->fwd_bwd_ns / res->plain_ns;
    res->ratio_vs_fwd = res->fwd_bwd_ns / res->fwd_only_ns;
    rc = 0;
out:
    tg_tensor_release(b.x);
    tg_tape_free(b.tape);
    tg_set_default_backend(prev_backend);
    return rc;
}

void bench_print_chain(FILE *f, const bench_chain_result *r)
{
    fprintf(f,
            "(a) tanh chain: %d ops on a 1-element f32 tensor, cpu backend "
            "(median of %d runs)\n",
            r->ops, r->runs);
    fprintf(f, "    record + backward   %9.1f ns/op\n", r->fwd_bwd_ns);
    fprintf(f, "    forward, grad off   %9.1f ns/op   record+backward / forward = %.1fx\n",
            r->fwd_only_ns, r->ratio_vs_fwd);
    fprintf(f, "    plain C tanhf+deriv %9.2f ns/op   tapegrad / plain C = %.1fx\n", r->plain_ns,
            r->ratio_vs_plain);
}

/* ---- (b) MLP */
#define MLP_B 128
#define MLP_LAYERS 3
static const int mlp_dims[MLP_LAYERS + 1] = {784, 512, 512, 10};

typedef struct {
    tg_tape *tape;
    tg_tensor *x, *y;                         /* (B, 784) f32, (B) i64 */
    tg_tensor *w[MLP_LAYERS], *b[MLP_LAYERS]; /* (in, out), (out): leaves */
    double loss;
    /* Raw buffers for the reference and the cblas baseline. */
    float *X, *W[MLP_LAYERS], *bias[MLP_LAYERS];
    float *Z[MLP_LAYERS]; /* (B, out) pre-activation */
    float *H[MLP_LAYERS]; /* (B, out) post-ReLU (H[2] written, unused: logits are Z[2]) */
    float *dZ[MLP_LAYERS], *dH[MLP_LAYERS], *dW[MLP_LAYERS], *db[MLP_LAYERS];
    int64_t *labels;
} mlp_bench;

/* The 3 forward GEMMs of the MLP: Z[l] = H[l-1] W[l] (H[-1] = X). */
static void raw_forward_gemms(mlp_bench *m)
{
    for (int l = 0; l < MLP_LAYERS; l++) {
        const float *in = l ? m->H[l - 1] : m->X;
        bench_sgemm(false, false, MLP_B, mlp_dims[l + 1], mlp_dims[l], in, mlp_dims[l], m->W[l],
                    mlp_dims[l + 1], m->Z[l], mlp_dims[l + 1]);
    }
}

/* The 5 backward GEMMs: dW[l] = H[l-1]^T dZ[l] for every layer, and
 * dH[l-1] = dZ[l] W[l]^T except for the first layer, whose input X needs
 * no gradient (tapegrad skips it for the same reason). */
static void raw_backward_gemms(mlp_bench *m)
{
    for (int l = MLP_LAYERS - 1; l >= 0; l--) {
        int in = mlp_dims[l], out = mlp_dims[l + 1];
        const float *a = l ? m->H[l - 1] : m->X;
        bench_sgemm(true, false, in, out, MLP_B, a, in, m->dZ[l], out, m->dW[l], out);
        if (l)
            bench_sgemm(false, true, MLP_B, in, out, m->dZ[l], out, m->W[l], out, m->dH[l - 1], in);
    }
}

/* Full reference step in plain C around the same GEMMs: bias, ReLU,
 * softmax cross-entropy and their derivatives; *loss gets the loss. */
static void raw_reference(mlp_bench *m, double *loss)
{
    for (int l = 0; l < MLP_LAYERS; l++) {
        const float *in = l ? m->H[l - 1] : m->X;
        int n = mlp_dims[l + 1];
        bench_sgemm(false, false, MLP_B, n, mlp_dims[l], in, mlp_dims[l], m->W[l], n, m->Z[l], n);
        for (int i = 0; i < MLP_B * n; i++) {
            m->Z[l][i] += m->bias[l][i % n];
            m->H[l][i] = m->Z[l][i] > 0 ? m->Z[l][i] : 0.0f;
        }
    }
    int C = mlp_dims[MLP_LAYERS];
    float *z = m->Z[MLP_LAYERS - 1], *dz = m->dZ[MLP_LAYERS - 1];
    double total = 0;
    for (int i = 0; i < MLP_B; i++) {
        double mx = z[i * C], s = 0;
        for (int c = 1; c < C; c++)
            mx = fmax(mx, z[i * C + c]);
        for (int c = 0; c < C; c++)
            s += exp(z[i * C + c] - mx);
        total -= z[i * C + m->labels[i]] - mx - log(s);
        for (int c = 0; c < C; c++)
            dz[i * C + c] = (float)((exp(z[i * C + c] - mx) / s - (c == m->labels[i])) / MLP_B);
    }
    *loss = total / MLP_B;
    for (int l = MLP_LAYERS - 1; l >= 0; l--) {
        int in = mlp_dims[l], out = mlp_dims[l + 1];
        const float *a = l ? m->H[l - 1] : m->X;
        bench_sgemm(true, false, in, out, MLP_B, a, in, m->dZ[l], out, m->dW[l], out);
        for (int j = 0; j < out; j++)
            m->db[l][j] = 0;
        for (int i = 0; i < MLP_B * out; i++)
            m->db[l][i % out] += m->dZ[l][i];
        if (!l) break;
        bench_sgemm(false, true, MLP_B, in, out, m->dZ[l], out, m->W[l], out, m->dH[l - 1], in);
        for (int i = 0; i < MLP_B * in; i++)
            m->dZ[l - 1][i] = m->Z[l - 1][i] > 0 ? m->dH[l - 1][i] : 0.0f;
    }
}

/* One tapegrad step: forward (recorded), and backward when asked. */
static tg_status mlp_step(mlp_bench *m, bool backward)
{
    for (int l = 0; l < MLP_LAYERS; l++) {
        tg_grad_zero(m->w[l]);
        tg_grad_zero(m->b[l]);
    }
    tg_scope_begin();
    tg_tensor *h = m->x;
    for (int l = 0; l < MLP_LAYERS; l++) {
        h = tg_add(tg_matmul(h, m->w[l]), m->b[l]);
        if (l < MLP_LAYERS - 1) h = tg_relu(h);
    }
    tg_tensor *loss = tg_cross_entropy(h, m->y);
    tg_status st = loss ? TG_OK : tg_last_error();
    if (!st && backward) st = tg_backward(loss);
    if (!st && backward) st = tg_tensor_item(loss, &m->loss);
    tg_scope_end();
    tg_tape_reset(m->tape);
    return st;
}

/* max |a - b| / max |b| over n entries. */
static double rel_err(const float *a, const float *b, int n)
{
    double e = 0, s = 0;
    for (int i = 0; i < n; i++) {
        e = fmax(e, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    return e / fmax(s, 1e-30);
}

static int mlp_check(mlp_bench *m, double *worst, char *err, size_t errlen)
{
    if (mlp_step(m, true)) return bench_lib_fail(err, errlen, "mlp step");
    double ref_loss;
    raw_reference(m, &ref_loss);
    *worst = fabs(m->loss - ref_loss) / fmax(fabs(ref_loss), 1e-30);
    const char *what = "loss";
    for (int l = 0; l < MLP_LAYERS; l++) {
        tg_tensor *gw = tg_grad(m->w[l]), *gb = tg_grad(m->b[l]);
        const float *pw = gw ? tg_tensor_data(gw) : NULL, *pb = gb ? tg_tensor_data(gb) : NULL;
        if (!pw || !pb) return bench_lib_fail(err, errlen, "mlp gradients");
        double ew = rel_err(pw, m->dW[l], mlp_dims[l] * mlp_dims[l + 1]);
        double eb = rel_err(pb, m->db[l], mlp_dims[l + 1]);
        static const char *const names[2][MLP_LAYERS] = {{"dW1", "dW2", "dW3"},
                                                         {"db1", "db2", "db3"}};
        if (ew > *worst) {
            *worst = ew;
            what = names[0][l];
        }
        if (eb > *worst) {
            *worst = eb;
            what = names[1][l];
        }
    }
    if (!(*worst <= 1e-3))
        return bench_fail(err, errlen,
                          "mlp disagrees with the raw sgemm reference: %s relative "
                          "error %.3g (loss %.6g vs %.6g)",
                          what, *worst, m->loss, ref_loss);
    return 0;
}

static void mlp_free(mlp_bench *m)
{
    tg_tensor_release(m->x);
    tg_tensor_release(m->y);
    for (int l = 0; l < MLP_LAYERS; l++) {
        tg_tensor_release(m->w[l]);
        tg_tensor_release(m->b[l]);
        free(m->W[l]);
        free(m->bias[l]);
        free(m->Z[l]);
        free(m->H[l]);
        free(m->dZ[l]);
        free(m->dH[l]);
        free(m->dW[l]);
        free(m->db[l]);
    }
    free(m->X);
    free(m->labels);
    tg_tape_free(m->tape);
}

static int mlp_setup(mlp_bench *m, char *err, size_t errlen)
{
    tg_rng rng;
    tg_rng_seed(&rng, 42);
    tg_backend prev = tg_set_default_backend(TG_BACKEND_CPU);
    int64_t xs[2] = {MLP_B, mlp_dims[0]}, ys = MLP_B;
    m->tape = tg_tape_new(NULL);
    m->x = tg_rand_uniform(&rng, TG_F32, 2, xs, 0.0, 1.0);
    m->labels = malloc(MLP_B * sizeof *m->labels);
    m->X = malloc(sizeof(float) * MLP_B * (size_t)mlp_dims[0]);
    bool ok = m->tape && m->x && m->labels && m->X;
    if (ok) {
        for (int i = 0; i < MLP_B; i++)
            m->labels[i] = (int64_t)(tg_rng_next(&rng) % 10);
        m->y = tg_tensor_from_data(TG_I64, 1, &ys, m->labels);
        ok = m->y && !tg_tensor_copy_out(m->x, m->X, sizeof(float) * MLP_B * (size_t)mlp_dims[0]);
    }
    for (int l = 0; l < MLP_LAYERS && ok; l++) {
        int in = mlp_dims[l], out = mlp_dims[l + 1];
        int64_t ws[2] = {in, out}, bs = out;
        double a = sqrt(6.0 / in); /* He-uniform keeps ReLU activations O(1) */
        m->w[l] = tg_rand_uniform(&rng, TG_F32, 2, ws, -a, a);
        m->b[l] = tg_rand_uniform(&rng, TG_F32, 1, &bs, -0.1, 0.1);
        size_t nw = (size_t)in * out, nz = (size_t)MLP_B * out, nh = (size_t)MLP_B * out;
        m->W[l] = malloc(nw * sizeof(float));
        m->dW[l] = malloc(nw * sizeof(float));
        m->bias[l] = malloc((size_t)out * sizeof(float));
        m->db[l] = malloc((size_t)out * sizeof(float));
        m->Z[l] = malloc(nz * sizeof(float));
        m->dZ[l] = malloc(nz * sizeof(float));
        m->H[l] = malloc(nh * sizeof(float));
        m->dH[l] = malloc(nh * sizeof(float));
        ok = m->w[l] && m->b[l] && m->W[l] && m->dW[l] && m->bias[l] && m->db[l] && m->Z[l] &&
             m->dZ[l] && m->H[l] && m->dH[l] &&
             !tg_tensor_copy_out(m->w[l], m->W[l], nw * sizeof(float)) &&
             !tg_tensor_copy_out(m->b[l], m->bias[l], (size_t)out * sizeof(float)) &&
             !tg_requires_grad(m->tape, m->w[l]) && !tg_requires_grad(m->tape, m->b[l]);
    }
    tg_set_default_backend(prev);
    if (!ok) {
        if (tg_last_error()) return bench_lib_fail(err, errlen, "mlp setup");
        return bench_fail(err, errlen, "mlp setup: out of memory");
    }
    return 0;
}

int bench_mlp(const bench_opts *opts, bench_mlp_result *res, char *err, size_t errlen)
{
    bool quick = opts && opts->quick;
    enum { TG_STEP, RAW_STEP, TG_FWD, RAW_FWD, NVAR };
    int runs = quick ? 20 : 40, warm = quick ? 2 : 5;
    memset(res, 0, sizeof *res);
    res->batch = MLP_B;
    res->in = mlp_dims[0];
    res->hidden = mlp_dims[1];
    res->classes = mlp_dims[MLP_LAYERS];
    res->runs = runs;
    for (int l = 0; l < MLP_LAYERS; l++) {
        double f = 2.0 * MLP_B * mlp_dims[l] * mlp_dims[l + 1];
        res->flops_fwd += f;
        res->flops_total += l ? 2 * f : f; /* forward + dW, + dX above the first layer */
    }
    res->flops_total += res->flops_fwd;

    mlp_bench m;
    memset(&m, 0, sizeof m);
    int rc = -1;
    double *t[NVAR] = {0};
    if (mlp_setup(&m, err, errlen) || mlp_check(&m, &res->check_err, err, errlen)) goto out;
    for (int v = 0; v < NVAR; v++)
        if (!(t[v] = malloc((size_t)runs * sizeof(double)))) {
            bench_fail(err, errlen, "mlp: out of memory");
            goto out;
        }
    /* Interleave the variants so drift in clock speed hits all alike. */
    for (int r = 0; r < warm + runs; r++) {
        double ns[NVAR], t0;
        tg_status st;
        t0 = bench_now_ns();
        st = mlp_step(&m, true);
        ns[TG_STEP] = bench_now_ns() - t0;
        t0 = bench_now_ns();
        raw_forward_gemms(&m);
        raw_backward_gemms(&m);
        ns[RAW_STEP] = bench_now_ns() - t0;
        t0 = bench_now_ns();
        if (!st) st = mlp_step(&m, false);
        ns[TG_FWD] = bench_now_ns() - t0;
        t0 = bench_now_ns();
        raw_forward_gemms(&m);
        ns[RAW_FWD] = bench_now_ns() - t0;
        if (st) {
            bench_lib_fail(err, errlen, "mlp step");
            goto out;
        }
        if (r >= warm)
            for (int v = 0; v < NVAR; v++)
                t[v][r - warm] = ns[v] * 1e-6;
    }
    res->tg_step_ms = bench_median(t[TG_STEP], runs);
    res->raw_step_ms = bench_median(t[RAW_STEP], runs);
    res->tg_fwd_ms = bench_median(t[TG_FWD], runs);
    res->raw_fwd_ms = bench_median(t[RAW_FWD], runs);
    res->tg_gflops = res->flops_total / (res->tg_step_ms * 1e6);
    res->raw_gflops = res->flops_total / (res->raw_step_ms * 1e6);
    res->ratio = res->tg_step_ms / res->raw_step_ms;
    res->fwd_ratio = res->tg_fwd_ms / res->raw_fwd_ms;
    rc = 0;
out:
    for (int v = 0; v < NVAR; v++)
        free(t[v]);
    mlp_free(&m);
    return rc;
}

void bench_print_mlp(FILE *f, const bench_mlp_result *r)
{
    fprintf(f,
            "(b) MLP %d-%d-%d-%d ReLU, batch %d, f32, cpu backend, cross-entropy "
            "(median of %d runs)\n",
            r->in, r->hidden, r->hidden, r->classes, r->batch, r->runs);
    fprintf(f, "    checked against a plain C + cblas_sgemm reference: max rel error %.2g\n",
            r->check_err);
    fprintf(f, "                                 time    GFLOP/s\n");
    fprintf(f, "    tapegrad forward+backward %8.3f ms %8.1f\n", r->tg_step_ms, r->tg_gflops);
    fprintf(f, "    raw sgemm, same 8 GEMMs   %8.3f ms %8.1f   tapegrad/raw = %.3f\n",
            r->raw_step_ms, r->raw_gflops, r->ratio);
    fprintf(f, "    tapegrad forward          %8.3f ms %8.1f\n", r->tg_fwd_ms,
            r->flops_fwd / (r->tg_fwd_ms * 1e6));
    fprintf(f, "    raw sgemm, 3 forward      %8.3f ms %8.1f   tapegrad/raw = %.3f\n",
            r->raw_fwd_ms, r->flops_fwd / (r->raw_fwd_ms * 1e6), r->fwd_ratio);
}

/* ---- JSON pieces (objects without the key) */
void bench_json_chain(FILE *f, const bench_chain_result *c)
{
    fprintf(f,
            "{\"ops\": %d, \"runs\": %d, \"fwd_bwd_ns_per_op\": %.6g, "
            "\"fwd_only_ns_per_op\": %.6g, \"plain_c_ns_per_op\": %.6g, "
            "\"ratio_vs_plain_c\": %.6g, \"ratio_vs_fwd_only\": %.6g, "
            "\"check_error\": %.6g}",
            c->ops, c->runs, c->fwd_bwd_ns, c->fwd_only_ns, c->plain_ns, c->ratio_vs_plain,
            c->ratio_vs_fwd, c->check_err);
}

void bench_json_mlp(FILE *f, const bench_mlp_result *m)
{
    fprintf(f,
            "{\"batch\": %d, \"dims\": [%d, %d, %d, %d], \"runs\": %d, "
            "\"flops_forward\": %.0f, \"flops_step\": %.0f, "
            "\"tapegrad_step_ms\": %.6g, \"raw_sgemm_step_ms\": %.6g, "
            "\"tapegrad_forward_ms\": %.6g, \"raw_sgemm_forward_ms\": %.6g, "
            "\"tapegrad_step_gflops\": %.6g, \"raw_sgemm_step_gflops\": %.6g, "
            "\"ratio_step\": %.6g, \"ratio_forward\": %.6g, \"check_rel_error\": %.6g}",
            m->batch, m->in, m->hidden, m->hidden, m->classes, m->runs, m->flops_fwd,
            m->flops_total, m->tg_step_ms, m->raw_step_ms, m->tg_fwd_ms, m->raw_fwd_ms,
            m->tg_gflops, m->raw_gflops, m->ratio, m->fwd_ratio, m->check_err);
}
