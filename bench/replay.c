/* replay.c - `tapegrad bench replay`: a training step's forward and
 * backward by recording (the user's code builds the forward on a fresh
 * record each step: scope, ops, tg_backward, scope end, tg_tape_reset)
 * against replaying one record (tg_tape_replay with the step's input, then
 * tg_backward). Workloads: the chain (100 x tanh on one float), tiny
 * (MLP 2-16-16-1, tanh, batch 1, MSE) and mlp (784-512-512-10, ReLU, batch
 * 128, cross-entropy), and elementwise (below: there the replay's calls
 * run as one fused call). Rounds alternate the ways; the figures are the
 * medians of the per-step times and of the per-round ratios. Before
 * timing, the gradients of every way are compared bit for bit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define RP_MAX_PARAMS 6

typedef struct rp_work {
    const char *name, *desc;
    int nparams;
    tg_tensor *p[RP_MAX_PARAMS];
    tg_tensor *x, *y;   /* the step's data (constants) */
    tg_tensor *xi, *yi; /* the replay tape's inputs */
    long nops;          /* chain: its length; else 0 */
    int kind;           /* 0 chain, 1 tiny, 2 mlp */
} rp_work;

static tg_tensor *rp_forward(const rp_work *w, tg_tensor *x, tg_tensor *y)
{
    if (w->kind == 0) {
        tg_tensor *h = tg_mul(x, w->p[0]);
        for (long k = 0; k < w->nops - 2 && h; k++) h = tg_tanh(h);
        return h ? tg_sum(h) : NULL;
    }
    tg_tensor *h = x;
    int layers = w->nparams / 2;
    for (int l = 0; l < layers && h; l++) {
        h = tg_affine(h, w->p[2 * l], w->p[2 * l + 1]);
        if (l < layers - 1) h = w->kind == 1 ? tg_tanh(h) : tg_relu(h);
    }
    if (!h) return NULL;
    return w->kind == 1 ? tg_mse_loss(h, y) : tg_cross_entropy(h, y);
}

static int rp_setup(rp_work *w, int kind)
{
    memset(w, 0, sizeof *w);
    w->kind = kind;
    tg_rng rng;
    tg_rng_seed(&rng, 21);
    static const int tiny[4] = {2, 16, 16, 1};
    const int *d = kind == 1 ? tiny : bench_mlp_dims;
    int64_t batch = kind == 1 ? 1 : BENCH_MLP_BATCH;
    bool ok = true;
    if (kind == 0) {
        w->name = "chain";
        w->desc = "100 ops: x * p, 98 x tanh, sum on one float";
        w->nops = 100;
        w->nparams = 1;
        ok = (w->p[0] = tg_full(TG_F32, 1, (int64_t[]){1}, 0.7)) &&
             (w->x = tg_full(TG_F32, 1, (int64_t[]){1}, 0.3));
    } else {
        w->name = kind == 1 ? "tiny" : "mlp";
        w->desc = kind == 1 ? "MLP 2-16-16-1, tanh, batch 1, MSE"
                            : "MLP 784-512-512-10, ReLU, batch 128, cross-entropy";
        w->nparams = 6;
        for (int l = 0; l < 3 && ok; l++) {
            ok = (w->p[2 * l] = tg_rand_normal(&rng, TG_F32, 2, (int64_t[]){d[l + 1], d[l]}, 0,
                                               0.1)) &&
                 (w->p[2 * l + 1] = tg_zeros(TG_F32, 1, (int64_t[]){d[l + 1]}));
        }
        ok = ok && (w->x = tg_rand_normal(&rng, TG_F32, 2, (int64_t[]){batch, d[0]}, 0, 1));
        if (ok && kind == 1) {
            ok = (w->y = tg_rand_normal(&rng, TG_F32, 2, (int64_t[]){batch, 1}, 0, 1)) != NULL;
        } else if (ok) {
            tg_tensor *u = tg_rand_uniform(&rng, TG_F64, 1, (int64_t[]){batch}, 0, d[3] - 1e-9);
            ok = u && (w->y = tg_cast(u, TG_I64));
            tg_tensor_release(u);
        }
    }
    return ok ? 0 : -1;
}

static void rp_free(rp_work *w)
{
    for (int i = 0; i < w->nparams; i++) tg_tensor_release(w->p[i]);
    tg_tensor_release(w->x);
    tg_tensor_release(w->y);
}

/* One recorded step on tape; the gradients accumulate. */
static tg_status rp_record_step(const rp_work *w, tg_tape *tape)
{
    tg_scope_begin();
    tg_tensor *loss = rp_forward(w, w->x, w->y);
    tg_status st = loss ? tg_backward(loss) : tg_last_error();
    tg_scope_end();
    tg_tape_reset(tape);
    return st;
}

/* One replayed step: the step's data into the inputs, forward, backward. */
static tg_status rp_replay_step(const rp_work *w, tg_tape *tape, tg_tensor *loss)
{
    tg_tensor *in[2] = {w->xi, w->yi}, *val[2] = {w->x, w->y};
    tg_status st = tg_tape_replay(tape, w->y ? 2 : 1, in, val);
    return st ? st : tg_backward(loss);
}

static void rp_zero(rp_work *w)
{
    for (int i = 0; i < w->nparams; i++) tg_grad_zero(w->p[i]);
}

/* Copies of the gradients (caller frees), NULL on failure. */
static float *rp_grads(rp_work *w, size_t *n)
{
    size_t total = 0;
    for (int i = 0; i < w->nparams; i++) total += (size_t)tg_tensor_numel(w->p[i]);
    float *g = malloc(total * sizeof *g);
    size_t at = 0;
    for (int i = 0; g && i < w->nparams; i++) {
        tg_tensor *gi = tg_grad(w->p[i]);
        if (!gi) {
            free(g);
            return NULL;
        }
        size_t k = (size_t)tg_tensor_numel(gi);
        memcpy(g + at, tg_tensor_data_ro(gi), k * sizeof *g);
        at += k;
    }
    *n = total;
    return g;
}

static int rp_run(int kind, bool quick)
{
    /* Two copies of the workload, the same values: the record tape's
     * parameters and the replay tape's (a leaf belongs to one tape). */
    rp_work w, v;
    int bad = rp_setup(&w, kind) | rp_setup(&v, kind);
    tg_tape *rec = bad ? NULL : tg_tape_new(NULL);
    tg_tape *rep = bad ? NULL : tg_tape_new(&(tg_tape_opts){.replay = true});
    tg_tensor *loss = NULL;
    tg_status st = (rec && rep) ? TG_OK : tg_last_error();
    for (int i = 0; i < w.nparams && !st; i++) st = tg_requires_grad(rec, w.p[i]);
    for (int i = 0; i < v.nparams && !st; i++) st = tg_requires_grad(rep, v.p[i]);
    /* The replay tape's inputs (zeros until the first replay). */
    if (!st) {
        v.xi = tg_zeros(tg_tensor_dtype(v.x), tg_tensor_ndim(v.x), tg_tensor_shape(v.x));
        v.yi = v.y ? tg_zeros(tg_tensor_dtype(v.y), tg_tensor_ndim(v.y), tg_tensor_shape(v.y))
                   : NULL;
        if (!v.xi || (v.y && !v.yi)) st = tg_last_error();
    }
    if (!st) st = tg_tape_input(rep, v.xi);
    if (!st && v.yi) st = tg_tape_input(rep, v.yi);
    if (!st) {
        tg_scope_begin();
        loss = tg_tensor_retain(rp_forward(&v, v.xi, v.yi));
        tg_scope_end();
        if (!loss) st = tg_last_error();
    }
    /* Per op: over the nodes the record holds. */
    int64_t nodes = rep ? tg_tape_node_count(rep) : 0;
    size_t ng = 0, ng2 = 0;
    float *g_rec = NULL, *g_rep = NULL;
    if (!st) st = rp_record_step(&w, rec);
    if (!st) st = rp_replay_step(&v, rep, loss);
    if (!st && !(g_rec = rp_grads(&w, &ng))) st = tg_last_error();
    if (!st && !(g_rep = rp_grads(&v, &ng2))) st = tg_last_error();
    bool same = !st && ng == ng2 && memcmp(g_rec, g_rep, ng * sizeof *g_rec) == 0;
    free(g_rec);
    free(g_rep);
    rp_zero(&w);
    rp_zero(&v);
    int rounds = quick ? 3 : 15;
    double t_rec[64], t_rep[64], ratio[64];
    long reps = kind == 2 ? (quick ? 3 : 20) : (quick ? 200 : 2000);
    for (int r = 0; r < rounds && !st; r++) {
        double t[2];
        for (int k = 0; k < 2 && !st; k++) {
            bool replay = (k + r) % 2 == 1;
            double t0 = bench_now_ns();
            for (long i = 0; i < reps && !st; i++) {
                st = replay ? rp_replay_step(&v, rep, loss) : rp_record_step(&w, rec);
                rp_zero(replay ? &v : &w);
            }
            t[replay] = (bench_now_ns() - t0) / (double)reps;
        }
        t_rec[r] = t[0];
        t_rep[r] = t[1];
        ratio[r] = t[0] / t[1];
    }
    if (!st) {
        double a = bench_median(t_rec, rounds), b = bench_median(t_rep, rounds);
        bench_stat rs = bench_stat_of(ratio, rounds);
        printf("%-6s %s; gradients bitwise equal: %s\n", w.name, w.desc, same ? "yes" : "NO");
        printf("       record %10.1f ns/step %7.1f ns/op   replay %10.1f ns/step %7.1f ns/op\n"
               "       record/replay %.2fx (rounds %.2f-%.2f)\n",
               a, a / (double)nodes, b, b / (double)nodes, rs.median, rs.min, rs.max);
    } else {
        fprintf(stderr, "tapegrad bench replay: %s: %s\n", kind == 0 ? "chain" : kind == 1
                                                             ? "tiny" : "mlp",
                tg_last_error_message());
    }
    tg_tensor_release(loss);
    tg_tensor_release(v.xi);
    tg_tensor_release(v.yi);
    tg_tape_free(rec);
    tg_tape_free(rep);
    rp_free(&w);
    rp_free(&v);
    return st || !same;
}

/* ---- elementwise: sum(tanh(x*x + 1) * sigmoid(x)) on 1M floats, x a
 * parameter (a set's leaf, as the suite's elementwise has it). A replay
 * runs the six calls as one fused call (tg_tape_replay's fused runs);
 * the same replay with opts.replay_unfused runs them one by one. Both are
 * timed against recording and against the suite's baseline for this
 * chain, one fused pass over the data (elementwise's gemm), in rotating
 * rounds, on one thread (the pass's).
 *
 * mse: mean((tanh(x) - t)^2) on 1M floats, t a constant target: a run
 * that ends in a mean whose values cannot be shown to sum exactly block by
 * block (squares near 0), so that from the second replay on the mean runs
 * as recorded after one fused call (docs/replay.md). No fused pass here. */
#define RP_ELEM_N (1 << 20)

static tg_tensor *rp_elem_loss(tg_tensor *x, tg_tensor *t)
{
    if (t) {
        tg_tensor *e = tg_sub(tg_tanh(x), t);
        return tg_mean(tg_mul(e, e));
    }
    tg_tensor *a = tg_add_scalar(tg_mul(x, x), 1.0);
    tg_tensor *th = tg_tanh(a);
    tg_tensor *s = tg_sigmoid(x);
    return tg_sum(tg_mul(th, s));
}

typedef struct rp_elem {
    tg_params *ps;
    tg_tensor *x, *t, *loss; /* t: mse's target (borrowed), NULL for elementwise */
    tg_tape *tape;
} rp_elem;

static tg_status rp_elem_init(rp_elem *e, const tg_tape_opts *opts, tg_tensor *t)
{
    e->t = t;
    tg_rng rng;
    tg_rng_seed(&rng, 3);
    if (!(e->ps = tg_params_new()) ||
        !(e->x = tg_params_add(e->ps, "x", TG_F32, 1, (int64_t[]){RP_ELEM_N})) ||
        tg_init_uniform(e->x, &rng, -2, 2) || !(e->tape = tg_tape_new(opts)))
        return tg_last_error();
    tg_status st = tg_params_requires_grad(e->ps, e->tape);
    if (st || !opts) return st;
    tg_scope_begin();
    e->loss = tg_tensor_retain(rp_elem_loss(e->x, e->t));
    tg_scope_end();
    return e->loss ? TG_OK : tg_last_error();
}

static void rp_elem_free(rp_elem *e)
{
    tg_tensor_release(e->loss);
    tg_tape_free(e->tape);
    tg_params_free(e->ps);
}

static tg_status rp_elem_step(rp_elem *e)
{
    tg_status st;
    if (e->loss) {
        st = tg_tape_replay(e->tape, 0, NULL, NULL);
        if (!st) st = tg_backward(e->loss);
    } else {
        tg_scope_begin();
        tg_tensor *loss = rp_elem_loss(e->x, e->t);
        st = loss ? tg_backward(loss) : tg_last_error();
        tg_scope_end();
        tg_tape_reset(e->tape);
    }
    tg_params_zero_grad(e->ps);
    return st;
}

static int rp_elem_run(bool quick, bool mse)
{
    int threads = tg_set_num_threads(1); /* the fused pass runs on one */
    tg_rng trng;
    tg_rng_seed(&trng, 5);
    tg_tensor *target = mse ? tg_rand_uniform(&trng, TG_F32, 1, (int64_t[]){RP_ELEM_N}, -1, 1)
                            : NULL;
    if (mse && !target) {
        fprintf(stderr, "tapegrad bench replay: mse: %s\n", tg_last_error_message());
        tg_set_num_threads(threads);
        return 1;
    }
    rp_elem c[3]; /* recording, replay, replay unfused */
    memset(c, 0, sizeof c);
    tg_tape_opts opts[3] = {{0}, {.replay = true}, {.replay = true, .replay_unfused = true}};
    char err[256] = "";
    tg_status st = TG_OK;
    /* Each made, then one step of it, its gradient kept (compared bit for
     * bit below) and the bytes it holds between steps counted. */
    bool same = false;
    int64_t fused = 0, first = 0;
    size_t held[3] = {0}, peak[3] = {0};
    float *g[3] = {NULL, NULL, NULL};
    for (int k = 0; k < 3 && !st; k++) {
        size_t m0 = tg_mem_current_bytes();
        st = rp_elem_init(&c[k], k ? &opts[k] : NULL, target);
        if (!st && k) st = tg_tape_replay(c[k].tape, 0, NULL, NULL);
        tg_scope_begin();
        tg_tensor *loss = k ? c[k].loss : st ? NULL : rp_elem_loss(c[k].x, target);
        if (!st) st = loss ? tg_backward(loss) : tg_last_error();
        tg_tensor *gr = st ? NULL : tg_grad(c[k].x);
        if (gr && (g[k] = malloc(RP_ELEM_N * sizeof(float))))
            memcpy(g[k], tg_tensor_data_ro(gr), RP_ELEM_N * sizeof(float));
        tg_scope_end();
        if (!k) tg_tape_reset(c[0].tape);
        if (c[k].ps) tg_params_zero_grad(c[k].ps);
        if (k == 1) first = tg_tape_replay_fused_steps(c[1].tape);
        /* two more steps: a replay's second plans again where a sum came out
         * of its run (mse) */
        for (int i = 0; i < 2 && !st; i++) st = rp_elem_step(&c[k]);
        held[k] = tg_mem_current_bytes() - m0;
    }
    for (int k = 0; k < 3 && !st; k++) { /* a step's peak above what is held */
        size_t m = tg_mem_current_bytes();
        tg_mem_reset_peak();
        st = rp_elem_step(&c[k]);
        peak[k] = tg_mem_peak_bytes() - m;
    }
    if (!st) {
        fused = tg_tape_replay_fused_steps(c[1].tape);
        same = g[0] && g[1] && g[2] && !memcmp(g[0], g[1], RP_ELEM_N * sizeof(float)) &&
               !memcmp(g[0], g[2], RP_ELEM_N * sizeof(float));
    }
    for (int k = 0; k < 3; k++) free(g[k]);
    void *base = st || mse ? NULL : bench_wl_elementwise.setup(err, sizeof err);
    if (!st && !mse && !base) st = TG_ERR_INVALID;
    int rounds = quick ? 3 : 15, reps = quick ? 3 : 20, ways = mse ? 3 : 4;
    double t[4][64] = {{0}}, r_pass[64], r_rec[64], r_unf[64];
    for (int r = 0; r < rounds && !st; r++) {
        for (int j = 0; j < ways && !st; j++) {
            int k = (j + r) % ways; /* 0..2 the tapes, 3 the fused pass */
            double t0 = bench_now_ns();
            for (int i = 0; i < reps && !st; i++) {
                if (k == 3)
                    bench_wl_elementwise.gemm(base, true);
                else
                    st = rp_elem_step(&c[k]);
            }
            t[k][r] = (bench_now_ns() - t0) / reps;
        }
        r_pass[r] = mse ? 0 : t[1][r] / t[3][r];
        r_rec[r] = t[0][r] / t[1][r];
        r_unf[r] = t[2][r] / t[1][r];
    }
    if (!st) {
        bench_stat a = bench_stat_of(r_pass, rounds), b = bench_stat_of(r_rec, rounds),
                   u = bench_stat_of(r_unf, rounds);
        if (mse)
            printf("mse    mean((tanh(x) - t)^2), x 1M f32 (a parameter), 1 thread; gradients "
                   "bitwise equal: %s; %lld of 4 calls fused at the first replay, %lld after\n",
                   same ? "yes" : "NO", (long long)first, (long long)fused);
        else
            printf("elementwise sum(tanh(x*x + 1) * sigmoid(x)), x 1M f32 (a parameter), 1 "
                   "thread; gradients bitwise equal: %s; %lld of 6 calls fused\n",
                   same ? "yes" : "NO", (long long)fused);
        printf("       record %7.3f ms  replay %7.3f ms  replay unfused %7.3f ms",
               bench_median(t[0], rounds) / 1e6, bench_median(t[1], rounds) / 1e6,
               bench_median(t[2], rounds) / 1e6);
        if (!mse) printf("  fused pass %7.3f ms", bench_median(t[3], rounds) / 1e6);
        printf("\n       ");
        if (!mse) printf("replay / fused pass %.2fx (rounds %.2f-%.2f); ", a.median, a.min, a.max);
        printf("record/replay %.2fx (%.2f-%.2f); unfused/replay %.2fx (%.2f-%.2f)\n", b.median,
               b.min, b.max, u.median, u.min, u.max);
        const double MB = 1024.0 * 1024.0;
        printf("       MiB held between steps (parameter, gradient, program): record %.1f, "
               "replay %.1f, unfused %.1f; a step's peak above that: %.1f, %.1f, %.1f\n",
               held[0] / MB, held[1] / MB, held[2] / MB, peak[0] / MB, peak[1] / MB,
               peak[2] / MB);
    } else {
        fprintf(stderr, "tapegrad bench replay: %s: %s\n", mse ? "mse" : "elementwise",
                err[0] ? err : tg_last_error_message());
    }
    if (base) bench_wl_elementwise.teardown(base);
    for (int k = 0; k < 3; k++) rp_elem_free(&c[k]);
    tg_tensor_release(target);
    tg_set_num_threads(threads);
    return st || !same;
}

int bench_replay_cli(const bench_opts *o)
{
    bench_env env;
    bench_env_get(&env);
    bench_print_env(stdout, &env);
    printf("replay: a step's forward + backward by recording it again (scope, ops,\n"
           "tg_backward, scope end, tg_tape_reset) against tg_tape_replay + tg_backward on\n"
           "one record; medians over %s alternating rounds\n\n",
           o->quick ? "3 (quick: not a measurement)" : "15");
    int failed = 0;
    for (int k = 0; k < 3; k++) failed += rp_run(k, o->quick);
    failed += rp_elem_run(o->quick, false);
    failed += rp_elem_run(o->quick, true);
    return failed ? 1 : 0;
}
