/* bench_lstm.c - an LSTM over a sequence, three ways, in one run:
 *
 *   layer   tg_lstm_layer: one lstm op for all T steps
 *   cell    tg_lstm_cell stepped in a loop (two affines, an add, the
 *           gates and four views a step), the same parameters
 *   sgemm   the layer's GEMMs alone as raw OpenBLAS calls (the input
 *           projection, T recurrent products, T gradients of h, the two
 *           weight gradients over all T*B rows): the floor of its GEMM work
 *   remake  the layer with remake_gates: backward makes the gate rows
 *           again instead of keeping them (less memory, more GEMM work)
 *
 * One training step each: zero_grad, forward from h0 = c0 = 0, loss
 * mean(h_T^2 + c_T^2) / 2, backward. Rounds interleave the three; the
 * table gives each one's median ms per step and the medians of the per-round
 * ratios (with their range), so a slow phase of the machine moves all three
 * alike. The tensor peak of a step is the library's allocation high-water
 * mark above what was alive before it. A check first compares the layer's
 * loss and parameter gradients with the cell's.
 *
 * Usage: bench_lstm [--quick] [--rounds N]. One thread (OpenBLAS and the
 * pool): the comparison is per core. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef struct lcfg {
    int T, B, I, H;
} lcfg;

/* From the smallest, where per-op costs dominate, to GEMM-bound sizes. */
static const lcfg cfgs[] = {
    {32, 1, 16, 64}, {32, 8, 16, 32}, {32, 16, 32, 128}, {32, 32, 32, 128}, {32, 128, 32, 128},
    {32, 64, 64, 256},
};
#define NCFG ((int)(sizeof cfgs / sizeof *cfgs))
#define MAX_ROUNDS 32

typedef struct lmodel {
    tg_params *ps;
    tg_lstm_layer *layer;
    tg_lstm_cell *cell;
    tg_tape *tape;
    tg_tensor *x; /* (T, B, I) */
} lmodel;

/* The raw GEMMs' buffers. */
typedef struct lraw {
    float *x, *w, *z, *hs, *dz, *dh, *dw;
} lraw;

static void lmodel_free(lmodel *m)
{
    tg_lstm_layer_free(m->layer);
    tg_lstm_cell_free(m->cell);
    tg_tensor_release(m->x);
    tg_tape_free(m->tape);
    tg_params_free(m->ps);
}

/* Every model draws the same parameters and inputs (seed 5); remake: the
 * layer with remake_gates. */
static int lmodel_new(lmodel *m, const lcfg *k, bool layer, bool remake)
{
    memset(m, 0, sizeof *m);
    tg_rng rng;
    tg_rng_seed(&rng, 5);
    m->ps = tg_params_new();
    if (m->ps && layer) m->layer = tg_lstm_layer_new(m->ps, "lstm", k->I, k->H, TG_F32, &rng);
    if (m->layer && remake)
        tg_lstm_layer_set_opts(m->layer, &(tg_lstm_opts){.remake_gates = true});
    if (m->ps && !layer) m->cell = tg_lstm_cell_new(m->ps, "lstm", k->I, k->H, TG_F32, &rng);
    if (m->layer || m->cell)
        m->x = tg_rand_normal(&rng, TG_F32, 3, (int64_t[]){k->T, k->B, k->I}, 0, 1);
    m->tape = m->x ? tg_tape_new(NULL) : NULL;
    if (!m->tape || tg_params_requires_grad(m->ps, m->tape)) {
        fprintf(stderr, "bench_lstm: setup: %s\n", tg_last_error_message());
        lmodel_free(m);
        return -1;
    }
    return 0;
}

/* One training step; *loss set when not NULL. */
static tg_status lmodel_step(lmodel *m, const lcfg *k, double *loss)
{
    tg_params_zero_grad(m->ps);
    tg_scope_begin();
    tg_tensor *h = NULL, *c = NULL;
    tg_status st;
    if (m->layer) {
        st = tg_lstm_layer_forward(m->layer, m->x, NULL, NULL, NULL, &h, &c);
    } else {
        int64_t bs[2] = {k->B, k->H};
        h = tg_zeros(TG_F32, 2, bs);
        c = tg_zeros(TG_F32, 2, bs);
        st = TG_OK;
        for (int t = 0; t < k->T && !st; t++) {
            tg_tensor *xt = tg_reshape(tg_narrow(m->x, 0, t, 1), 2, (int64_t[]){k->B, k->I});
            st = tg_lstm_cell_forward(m->cell, xt, h, c, &h, &c);
        }
    }
    tg_tensor *l = st ? NULL
                      : tg_mul_scalar(tg_add(tg_mean(tg_mul(h, h)), tg_mean(tg_mul(c, c))), 0.5);
    st = l ? tg_backward(l) : tg_last_error();
    if (!st && loss) st = tg_tensor_item(l, loss);
    tg_scope_end();
    tg_tape_reset(m->tape);
    return st;
}

static int lraw_new(lraw *r, const lcfg *k)
{
    size_t T = (size_t)k->T, B = (size_t)k->B, I = (size_t)k->I, H = (size_t)k->H, G = 4 * H;
    r->x = bench_floats(T * B * I, 1.0f);
    r->w = bench_floats(G * (I + H), 0.1f);
    r->z = bench_floats(T * B * G, 1.0f);
    r->hs = bench_floats((T + 1) * B * H, 0.5f);
    r->dz = bench_floats(T * B * G, 0.01f);
    r->dh = bench_floats(B * H, 0.01f);
    r->dw = bench_floats(G * (I + H), 0.0f);
    return r->x && r->w && r->z && r->hs && r->dz && r->dh && r->dw ? 0 : -1;
}

static void lraw_free(lraw *r)
{
    free(r->x), free(r->w), free(r->z), free(r->hs), free(r->dz), free(r->dh), free(r->dw);
}

/* The lstm op's GEMMs, as it calls them (beta 0 here: the same work). */
static void lraw_step(const lraw *r, const lcfg *k)
{
    int T = k->T, B = k->B, I = k->I, H = k->H, G = 4 * H, W = I + H;
    bench_sgemm(false, true, T * B, G, I, r->x, I, r->w, W, r->z, G);
    for (int t = 0; t < T; t++)
        bench_sgemm(false, true, B, G, H, r->hs + (size_t)t * B * H, H, r->w + I, W,
                    r->z + (size_t)t * B * G, G);
    for (int t = T - 1; t >= 0; t--)
        bench_sgemm(false, false, B, H, G, r->dz + (size_t)t * B * G, G, r->w + I, W, r->dh, H);
    bench_sgemm(true, false, G, I, T * B, r->dz, G, r->x, I, r->dw, W);
    bench_sgemm(true, false, G, H, T * B, r->dz, G, r->hs, H, r->dw + I, W);
}

/* The loss and the worst gradient difference of layer against cell,
 * relative to the largest gradient. */
static int check(lmodel *ml, lmodel *mc, const lcfg *k, double *dloss, double *dgrad)
{
    double ll, lc;
    if (lmodel_step(ml, k, &ll) || lmodel_step(mc, k, &lc)) return -1;
    tg_tensor *gl = tg_params_flat_grad(ml->ps, TG_F32), *gc = tg_params_flat_grad(mc->ps, TG_F32);
    if (!gl || !gc) return -1;
    const float *a = tg_tensor_data(gl), *b = tg_tensor_data(gc);
    double worst = 0, top = 0;
    for (int64_t i = 0; i < tg_tensor_numel(gc); i++) {
        worst = fmax(worst, fabs(a[i] - b[i]));
        top = fmax(top, fabs(b[i]));
    }
    tg_tensor_release(gl);
    tg_tensor_release(gc);
    *dloss = fabs(ll - lc) / fmax(fabs(lc), 1e-30);
    *dgrad = worst / fmax(top, 1e-30);
    return 0;
}

/* ns per step of `reps` steps of v: 0 layer, 1 cell, 2 raw GEMMs, 3 the
 * layer remaking its gates. */
static double sample(int v, lmodel *const *m, const lraw *r, const lcfg *k, long reps)
{
    double t0 = bench_now_ns();
    for (long i = 0; i < reps; i++) {
        if (v == 2)
            lraw_step(r, k);
        else if (lmodel_step(m[v], k, NULL))
            return -1;
    }
    return (bench_now_ns() - t0) / (double)reps;
}

/* The tensor peak of one step of m above what was alive before it, MB. */
static double step_peak(lmodel *m, const lcfg *k)
{
    size_t base = tg_mem_current_bytes();
    tg_mem_reset_peak();
    if (lmodel_step(m, k, NULL)) return -1;
    return (double)(tg_mem_peak_bytes() - base) / 1e6;
}

static int run(const lcfg *k, int rounds)
{
    lmodel ml, mc, mr;
    lmodel *m[4] = {&ml, &mc, NULL, &mr};
    lraw r = {0};
    if (lmodel_new(&ml, k, true, false)) return 1;
    if (lmodel_new(&mc, k, false, false)) {
        lmodel_free(&ml);
        return 1;
    }
    if (lmodel_new(&mr, k, true, true)) {
        lmodel_free(&ml);
        lmodel_free(&mc);
        return 1;
    }
    int rc = 1;
    double dloss, dgrad;
    if (lraw_new(&r, k) || check(&ml, &mc, k, &dloss, &dgrad)) {
        fprintf(stderr, "bench_lstm: T %d B %d: %s\n", k->T, k->B, tg_last_error_message());
        goto out;
    }
    /* Reps for about 25 ms a sample, from one warm step of the cell. */
    double one = sample(1, m, &r, k, 1);
    long reps = one > 0 ? (long)(25e6 / one) : 1;
    if (reps < 1) reps = 1;
    double t[4][MAX_ROUNDS], q[2][MAX_ROUNDS], qc[MAX_ROUNDS], qr[MAX_ROUNDS];
    for (int i = 0; i < rounds; i++) {
        for (int v = 0; v < 4; v++)
            if ((t[v][i] = sample(v, m, &r, k, reps)) < 0) goto out;
        q[0][i] = t[0][i] / t[2][i];
        q[1][i] = t[1][i] / t[2][i];
        qc[i] = t[0][i] / t[1][i];
        qr[i] = t[3][i] / t[0][i];
    }
    double pl = step_peak(&ml, k), pc = step_peak(&mc, k), pr = step_peak(&mr, k);
    bench_stat s[4], r0 = bench_stat_of(q[0], rounds), r1 = bench_stat_of(q[1], rounds);
    bench_stat rc2 = bench_stat_of(qc, rounds), rr = bench_stat_of(qr, rounds);
    for (int v = 0; v < 4; v++) s[v] = bench_stat_of(t[v], rounds);
    printf("T %2d B %3d I %3d H %3d | %8.3f %8.3f %8.3f | %5.2fx %5.2fx | %5.3f (%5.3f-%5.3f) | "
           "%6.2f %6.2f | %8.3f %5.3f %6.2f | %.1e %.1e\n",
           k->T, k->B, k->I, k->H, s[0].median / 1e6, s[1].median / 1e6, s[2].median / 1e6,
           r0.median, r1.median, rc2.median, rc2.min, rc2.max, pl, pc, s[3].median / 1e6,
           rr.median, pr, dloss, dgrad);
    rc = 0;
out:
    lraw_free(&r);
    lmodel_free(&ml);
    lmodel_free(&mc);
    lmodel_free(&mr);
    return rc;
}

int main(int argc, char **argv)
{
    int rounds = 7;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            rounds = 2;
        } else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
            rounds = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench_lstm [--quick] [--rounds N]  (1 <= N <= %d)\n",
                    MAX_ROUNDS);
            return 2;
        }
    }
    if (rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "bench_lstm: --rounds %d: need 1..%d\n", rounds, MAX_ROUNDS);
        return 2;
    }
    if (tg_set_num_threads(1)) return 1;
    bench_env env;
    bench_env_get(&env);
    bench_print_env(stdout, &env);
    printf("LSTM over T steps from zero state, one training step (fwd+bwd), 1 thread; median of "
           "%d interleaved rounds\n"
           "layer: tg_lstm_layer (one lstm op); cell: tg_lstm_cell in a loop; sgemm: the "
           "layer's GEMMs alone\n"
           "ratios: against sgemm in the same round; layer/cell per round, median (range); "
           "peak: tensor MB of a step;\n"
           "remake: the layer with remake_gates, its ms, its ratio to the layer and its peak;\n"
           "check: layer against cell, relative loss and worst gradient differences\n\n",
           rounds);
    printf("%-24s| %8s %8s %8s | %6s %6s | %-19s | %6s %6s | %-21s | check\n", "shape", "layer",
           "cell", "sgemm", "layer", "cell", "layer/cell", "layer", "cell",
           "remake ms, /layer, MB");
    int failed = 0;
    for (int i = 0; i < NCFG; i++) failed += run(&cfgs[i], rounds);
    return failed ? 1 : 0;
}
