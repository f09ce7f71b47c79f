/* Checkpoint policies: every policy gives NONE's gradients (bitwise: the
 * recompute repeats the same kernels on the same values), and the saved
 * bytes the deterministic counters report are what the policies promise. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <tapegrad.h>

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

enum { NONE, BALANCED, BUDGET, SEGMENT, NVARIANTS };
/* A fifth variant, used by the CNN only: segments by tg_checkpoint_begin /
 * tg_checkpoint_end around each stage (SEGMENT there is
 * tg_checkpoint_sequential). Policy NONE. */
enum { MANUAL = NVARIANTS };
static const char *const variant_names[NVARIANTS + 1] = {"none", "balanced", "budget", "segment",
                                                         "manual"};

static tg_tape *tape_for(int variant, size_t budget)
{
    tg_tape_opts o = {0};
    if (variant == BALANCED) o.policy = TG_CHECKPOINT_BALANCED;
    if (variant == BUDGET) {
        o.policy = TG_CHECKPOINT_BUDGET;
        o.budget_bytes = budget;
    }
    tg_tape *t = tg_tape_new(&o);
    cr_assert_not_null(t, "%s", tg_last_error_message());
    return t;
}

/* Copies every leaf gradient into one malloc'd f64 buffer (caller frees). */
static double *grads_of(int n, tg_tensor **leaves, size_t *count)
{
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (size_t)tg_tensor_numel(leaves[i]);
    double *out = calloc(total ? total : 1, sizeof *out), *p = out;
    for (int i = 0; i < n; i++) {
        tg_tensor *g = tg_grad(leaves[i]);
        cr_assert_not_null(g, "leaf %d has no gradient: %s", i, tg_last_error_message());
        tg_tensor *g64 = tg_tensor_dtype(g) == TG_F64 ? tg_tensor_retain(g) : tg_cast(g, TG_F64);
        cr_assert_eq(tg_tensor_copy_out(g64, p, (size_t)tg_tensor_numel(g) * 8), TG_OK);
        p += tg_tensor_numel(g);
        tg_tensor_release(g64);
        tg_grad_zero(leaves[i]);
    }
    *count = total;
    return out;
}

/* ---- the elementwise chain sum(tanh(x*x + 1) * sigmoid(x)) */
static tg_tensor *chain(tg_tensor *x)
{
    tg_tensor *a = tg_tanh(tg_add_scalar(tg_mul(x, x), 1.0));
    tg_tensor *b = tg_sigmoid(x);
    return tg_sum(tg_mul(a, b));
}

Test(checkpoint, balanced_saves_at_least_half_fewer_bytes_on_the_elementwise_chain)
{
    tg_rng rng;
    tg_rng_seed(&rng, 11);
    tg_tensor *x = tg_rand_uniform(&rng, TG_F32, 1, SHAPE(1 << 20), -2.0, 2.0);
    size_t saved[2], n;
    double *g[2];
    int64_t recomputes = -1;
    for (int v = 0; v < 2; v++) {
        tg_tape *tape = tape_for(v == 0 ? NONE : BALANCED, 0);
        cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
        tg_scope_begin();
        tg_tensor *loss = chain(x);
        cr_assert_not_null(loss, "%s", tg_last_error_message());
        saved[v] = tg_tape_saved_bytes(tape);
        cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
        tg_scope_end();
        g[v] = grads_of(1, &x, &n);
        if (v == 1) recomputes = tg_tape_recompute_count(tape);
        tg_tape_free(tape);
    }
    cr_assert_gt(saved[0], 0);
    cr_assert_leq(2 * saved[1], saved[0], "balanced saved %zu bytes, none %zu", saved[1], saved[0]);
    cr_assert_eq(memcmp(g[0], g[1], n * sizeof(double)), 0, "gradients differ");
    /* mul, add_scalar, tanh, sigmoid, each recomputed once though x and
     * the products fan out; the last mul and the sum are not: no backward
     * reads their outputs. */
    cr_assert_eq(recomputes, 4);
    free(g[0]);
    free(g[1]);
    tg_tensor_release(x);
}

/* ---- the registry under every policy */
typedef struct {
    const tg_op *op;
    tg_op_attrs attrs;
} op_case;

/* Runs op on fresh copies of in (floating ones tracked) under variant;
 * seed w fixed by the caller. Returns the gradients, NULL if recording
 * failed with TG_ERR_BUDGET. */
static double *run_op(int variant, size_t budget, const op_case *c, int n, tg_tensor **in,
                      size_t *count, size_t *saved_peak)
{
    tg_tape *tape = tape_for(variant, budget);
    tg_tensor *x[TG_OP_MAX_INPUTS], *leaves[TG_OP_MAX_INPUTS];
    int nl = 0;
    for (int i = 0; i < n; i++) {
        x[i] = tg_contiguous(in[i]);
        if (tg_tensor_dtype(x[i]) != TG_I64) {
            cr_assert_eq(tg_requires_grad(tape, x[i]), TG_OK);
            leaves[nl++] = x[i];
        }
    }
    double *g = NULL;
    tg_scope_begin();
    if (variant == SEGMENT) tg_checkpoint_begin(tape);
    tg_tensor *y = tg_op_call(c->op, n, x, &c->attrs);
    if (variant == SEGMENT) tg_checkpoint_end(tape);
    if (!y) {
        cr_assert_eq(tg_last_error(), TG_ERR_BUDGET, "op '%s' under %s: %s", c->op->name,
                     variant_names[variant], tg_last_error_message());
        tg_error_clear();
    } else {
        tg_rng rng;
        tg_rng_seed(&rng, 5);
        tg_tensor *w = tg_to_device(tg_rand_uniform(&rng, tg_tensor_dtype(y), tg_tensor_ndim(y),
                                                    tg_tensor_shape(y), 0.5, 1.5),
                                    tg_tensor_backend(y));
        *saved_peak = tg_tape_saved_peak_bytes(tape);
        cr_assert_eq(tg_backward_seed(y, w), TG_OK, "op '%s' under %s: %s", c->op->name,
                     variant_names[variant], tg_last_error_message());
        g = grads_of(nl, leaves, count);
    }
    tg_scope_end();
    for (int i = 0; i < n; i++) tg_tensor_release(x[i]);
    tg_tape_free(tape);
    return g;
}

Test(checkpoint, every_policy_gives_nones_gradients_on_every_registered_op)
{
    int checked = 0, budget_ok = 0;
    for (int oi = 0; oi < tg_op_count(); oi++) {
        const tg_op *op = tg_op_at(oi);
        if (tg_op_mark(op) != TG_AD_BACKWARD || !op->sample) continue;
        tg_rng rng;
        tg_rng_seed(&rng, 99);
        for (int k = 0; k < 64; k++) {
            op_case c = {.op = op};
            tg_tensor *in[TG_OP_MAX_INPUTS] = {0};
            tg_scope_begin();
            int n = op->sample(k, &rng, in, &c.attrs);
            for (int i = 0; i < n; i++)
                tg_scope_keep(in[i]); /* own them whatever the sample did */
            tg_scope_end();
            if (n <= 0) {
                for (int i = 0; i < TG_OP_MAX_INPUTS; i++) tg_tensor_release(in[i]);
                break;
            }
            size_t n0, nv, peak0 = 0, peak = 0;
            double *g0 = run_op(NONE, 0, &c, n, in, &n0, &peak0);
            cr_assert_not_null(g0);
            for (int v = BALANCED; v < NVARIANTS; v++) {
                size_t budget = peak0 / 2;
                double *gv = run_op(v, budget, &c, n, in, &nv, &peak);
                if (v == BUDGET && !gv) continue; /* untracked inputs need more */
                cr_assert_not_null(gv, "op '%s' case %d under %s", op->name, k, variant_names[v]);
                if (v == BUDGET) {
                    cr_assert_leq(peak, budget, "op '%s' exceeded its budget", op->name);
                    budget_ok++;
                }
                cr_assert_eq(nv, n0);
                cr_expect_eq(memcmp(g0, gv, n0 * sizeof(double)), 0,
                             "op '%s' case %d: %s gradients differ from none's", op->name, k,
                             variant_names[v]);
                free(gv);
            }
            free(g0);
            checked++;
            for (int i = 0; i < TG_OP_MAX_INPUTS; i++) tg_tensor_release(in[i]);
        }
    }
    cr_assert_gt(checked, 100, "only %d cases checked", checked);
    cr_assert_gt(budget_ok, checked / 2, "BUDGET ran only %d of %d cases", budget_ok, checked);
}

/* ---- composite models */
typedef tg_tensor *(*model_fn)(tg_tape *tape, int variant, tg_tensor **p, tg_tensor *x,
                               tg_tensor *y);

/* What compare_variants measured under each variant. */
typedef struct {
    size_t peak[NVARIANTS + 1];       /* tg_tape_saved_peak_bytes after the forward */
    int64_t recomputes[NVARIANTS + 1]; /* tg_tape_recompute_count after backward */
    /* Set by the caller: SEGMENT's backward reads only values kept anyway
     * (so it must recompute nothing). */
    bool segment_reads_kept;
} variant_stats;

/* Runs f under variants 0 .. nv-1 and checks every one's gradients against
 * NONE's (bitwise), BUDGET's peak against its budget (half of NONE's),
 * BALANCED's against NONE's, and that every variant but NONE recomputed
 * something (BALANCED: where it kept fewer bytes than NONE). */
static void compare_variants(const char *name, model_fn f, int np, tg_tensor **p, tg_tensor *x,
                             tg_tensor *y, int nv, variant_stats *st)
{
    double *g0 = NULL;
    size_t n0 = 0;
    for (int v = NONE; v < nv; v++) {
        size_t none_peak = st->peak[NONE];
        tg_tape *tape = tape_for(v, v == BUDGET ? (none_peak ? none_peak / 2 : SIZE_MAX) : 0);
        for (int i = 0; i < np; i++) cr_assert_eq(tg_requires_grad(tape, p[i]), TG_OK);
        tg_scope_begin();
        tg_tensor *loss = f(tape, v, p, x, y);
        cr_assert_not_null(loss, "%s under %s: %s", name, variant_names[v],
                           tg_last_error_message());
        st->peak[v] = tg_tape_saved_peak_bytes(tape);
        if (v == BUDGET) cr_assert_leq(st->peak[v], none_peak / 2, "%s exceeded its budget", name);
        cr_assert_eq(tg_backward(loss), TG_OK, "%s under %s: %s", name, variant_names[v],
                     tg_last_error_message());
        tg_scope_end();
        st->recomputes[v] = tg_tape_recompute_count(tape);
        size_t n;
        double *g = grads_of(np, p, &n);
        if (v == NONE) {
            g0 = g;
            n0 = n;
            size_t nz = 0; /* a memcmp of zeros against zeros would prove nothing */
            for (size_t i = 0; i < n; i++) nz += g[i] != 0.0;
            cr_assert_gt(nz, n / 2, "%s: only %zu of %zu gradients are nonzero", name, nz, n);
        } else {
            cr_assert_eq(n, n0);
            cr_expect_eq(memcmp(g0, g, n * sizeof(double)), 0, "%s: %s gradients differ", name,
                         variant_names[v]);
            free(g);
        }
        /* BALANCED never keeps more than NONE, and recomputes only where
         * that keeps fewer bytes: a relu re-run from a checkpoint of the
         * add or affine before it keeps its own output once the next
         * layer's matmul saves that (tg__checkpoint_adopt), releasing the
         * checkpoint, so on matmul + add + relu layers it re-runs nothing
         * and keeps the checkpoints' bytes less (mlp: 16384 against
         * NONE's 17792; before, 17792 and a relu re-run for nothing). */
        if (v == BALANCED) {
            cr_expect_leq(st->peak[v], st->peak[NONE], "%s under balanced kept %zu bytes, none %zu",
                          name, st->peak[v], st->peak[NONE]);
            if (st->recomputes[v] > 0)
                cr_expect_lt(st->peak[v], st->peak[NONE], "%s under balanced re-ran %lld "
                             "forwards for no fewer bytes", name, (long long)st->recomputes[v]);
        } else if (v == SEGMENT && st->segment_reads_kept) {
            cr_expect_eq(st->recomputes[v], 0, "%s under %s recomputed %lld forwards", name,
                         variant_names[v], (long long)st->recomputes[v]);
        } else if (v != NONE) {
            cr_expect_gt(st->recomputes[v], 0, "%s under %s recomputed nothing", name,
                         variant_names[v]);
        }
        tg_tape_free(tape);
    }
    free(g0);
}

static void compare_policies_ex(const char *name, model_fn f, int np, tg_tensor **p,
                                tg_tensor *x, tg_tensor *y, size_t *none_peak,
                                size_t *segment_peak, bool segment_reads_kept)
{
    variant_stats st = {.segment_reads_kept = segment_reads_kept};
    compare_variants(name, f, np, p, x, y, NVARIANTS, &st);
    *none_peak = st.peak[NONE];
    if (segment_peak) *segment_peak = st.peak[SEGMENT];
}

static void compare_policies(const char *name, model_fn f, int np, tg_tensor **p, tg_tensor *x,
                             tg_tensor *y, size_t *none_peak, size_t *segment_peak)
{
    compare_policies_ex(name, f, np, p, x, y, none_peak, segment_peak, false);
}

/* MLP 64-32-10, relu, cross-entropy; segments per layer. */
static tg_tensor *mlp_layer(void *ud, int l, tg_tensor *h)
{
    tg_tensor **p = ud;
    tg_tensor *z = tg_add(tg_matmul(h, p[2 * l]), p[2 * l + 1]);
    return l == 0 ? tg_relu(z) : z;
}

static tg_tensor *mlp(tg_tape *tape, int variant, tg_tensor **p, tg_tensor *x, tg_tensor *y)
{
    tg_tensor *logits = variant == SEGMENT ? tg_checkpoint_sequential(tape, 2, 2, mlp_layer, p, x)
                                           : mlp_layer(p, 1, mlp_layer(p, 0, x));
    return tg_cross_entropy(logits, y);
}

Test(checkpoint, mlp_gradients_match_under_every_policy)
{
    tg_rng rng;
    tg_rng_seed(&rng, 1);
    tg_tensor *p[4] = {
        tg_rand_normal(&rng, TG_F64, 2, SHAPE(64, 32), 0, 0.2),
        tg_rand_normal(&rng, TG_F64, 1, SHAPE(32), 0, 0.1),
        tg_rand_normal(&rng, TG_F64, 2, SHAPE(32, 10), 0, 0.2),
        tg_rand_normal(&rng, TG_F64, 1, SHAPE(10), 0, 0.1),
    };
    tg_tensor *x = tg_rand_normal(&rng, TG_F64, 2, SHAPE(16, 64), 0, 1);
    int64_t labels[16];
    for (int i = 0; i < 16; i++) labels[i] = i % 10;
    tg_tensor *y = tg_tensor_from_data(TG_I64, 1, SHAPE(16), labels);
    size_t none_peak = 0;
    /* The segment (layer 0: matmul, add, relu) is followed by the
     * unsegmented tail, whose matmul saves the relu's output: the relu
     * then keeps it too (tg__checkpoint_adopt), and nothing else of the
     * segment is read by a backward (the add reads nothing, the matmul
     * its retained data input), so backward re-runs nothing. */
    compare_policies_ex("mlp", mlp, 4, p, x, y, &none_peak, NULL, true);
    for (int i = 0; i < 4; i++) tg_tensor_release(p[i]);
    tg_tensor_release(x);
    tg_tensor_release(y);
}

/* A small CNN, f64: conv 1->4 3x3 pad 1, batch norm (batch statistics),
 * relu, max pool 2; conv 4->6 3x3, relu, avg pool 2; linear 24->10;
 * cross-entropy, batch 4 of 1x12x12. SEGMENT: tg_checkpoint_sequential
 * over the three stages (stages 0-1 a segment, stage 2 the unsegmented
 * tail); MANUAL: tg_checkpoint_begin/end segments, stages 0-1 one segment
 * and stage 2 another (or, with cnn_each_stage, every stage its own). No
 * running statistics, so every policy sees the same state. Every recompute
 * re-runs the same kernels (conv's im2col and GEMM, the batch-norm
 * statistics, the pools) on the same values in the same order, so the
 * gradients are compared bitwise, with no tolerance. */
static bool cnn_each_stage;

static tg_tensor *cnn_stage(void *ud, int l, tg_tensor *h)
{
    tg_tensor **p = ud;
    const tg_pool2d_opts pool = {.kernel = {2, 2}};
    if (l == 0) {
        tg_tensor *c = tg_conv2d(h, p[0], p[1], &(tg_conv2d_opts){.padding = {1, 1}});
        return tg_max_pool2d(tg_relu(tg_batch_norm(c, p[2], p[3], NULL, NULL, true, 0.1, 1e-5)),
                             &pool);
    }
    if (l == 1) return tg_avg_pool2d(tg_relu(tg_conv2d(h, p[4], p[5], NULL)), &pool);
    int64_t n = tg_tensor_dim(h, 0);
    return tg_add(tg_matmul(tg_reshape(h, 2, SHAPE(n, 24)), p[6]), p[7]);
}

static tg_tensor *cnn(tg_tape *tape, int variant, tg_tensor **p, tg_tensor *x, tg_tensor *y)
{
    tg_tensor *logits = x;
    if (variant == SEGMENT) {
        logits = tg_checkpoint_sequential(tape, 3, 0, cnn_stage, p, x);
    } else {
        for (int l = 0; l < 3; l++) {
            bool open = variant == MANUAL && (cnn_each_stage || l != 1);
            bool close = variant == MANUAL && (cnn_each_stage || l != 0);
            if (open) cr_assert_eq(tg_checkpoint_begin(tape), TG_OK);
            logits = cnn_stage(p, l, logits);
            if (close) cr_assert_eq(tg_checkpoint_end(tape), TG_OK);
        }
    }
    return tg_cross_entropy(logits, y);
}

static void check_cnn(void)
{
    tg_rng rng;
    tg_rng_seed(&rng, 4);
    tg_tensor *p[8] = {
        tg_rand_normal(&rng, TG_F64, 4, SHAPE(4, 1, 3, 3), 0, 0.4),
        tg_rand_normal(&rng, TG_F64, 1, SHAPE(4), 0, 0.1),
        tg_rand_uniform(&rng, TG_F64, 1, SHAPE(4), 0.5, 1.5),
        tg_rand_normal(&rng, TG_F64, 1, SHAPE(4), 0, 0.1),
        tg_rand_normal(&rng, TG_F64, 4, SHAPE(6, 4, 3, 3), 0, 0.2),
        tg_rand_normal(&rng, TG_F64, 1, SHAPE(6), 0, 0.1),
        tg_rand_normal(&rng, TG_F64, 2, SHAPE(24, 10), 0, 0.3),
        tg_rand_normal(&rng, TG_F64, 1, SHAPE(10), 0, 0.1),
    };
    tg_tensor *x = tg_rand_normal(&rng, TG_F64, 4, SHAPE(4, 1, 12, 12), 0, 1);
    int64_t labels[4] = {3, 7, 0, 9};
    tg_tensor *y = tg_tensor_from_data(TG_I64, 1, SHAPE(4), labels);
    variant_stats st = {0};
    /* Gradients bitwise, BUDGET within half of NONE's peak, BALANCED within
     * NONE's, and every variant but NONE recomputed something
     * (compare_variants). */
    compare_variants("cnn", cnn, 8, p, x, y, NVARIANTS + 1, &st);
    size_t none = st.peak[NONE];
    cr_assert_gt(none, 0);
    /* BALANCED keeps conv outputs as checkpoints and recomputes batch
     * norm, relu and the pools, whose saves (batch norm's input and
     * statistics, relu's output, max pool's indices) NONE keeps on top. */
    cr_expect_lt(st.peak[BALANCED], none, "balanced kept %zu of %zu bytes", st.peak[BALANCED],
                 none);
    /* Segments keep the data, their boundaries and the tail's saves. */
    cr_expect_lt(4 * st.peak[SEGMENT], none, "segments kept %zu of %zu bytes", st.peak[SEGMENT],
                 none);
    cr_expect_lt(4 * st.peak[MANUAL], none, "begin/end kept %zu of %zu bytes", st.peak[MANUAL],
                 none);
    for (int i = 0; i < 8; i++) tg_tensor_release(p[i]);
    tg_tensor_release(x);
    tg_tensor_release(y);
}

Test(checkpoint, cnn_gradients_match_under_every_policy)
{
    check_cnn();
}

/* Every stage its own segment puts segment boundaries at max_pool2d's
 * output (its forward keeps the argmax indices as an extra) and at the
 * linear's add. Backward keeps the boundary's output but re-runs
 * max_pool2d's forward for the indices its backward reads. */
Test(checkpoint, cnn_with_a_segment_boundary_after_max_pool)
{
    cnn_each_stage = true;
    check_cnn();
}

/* LSTM cell unrolled over 32 steps: gates = x Wx + h Wh + b, split with
 * narrow; loss = mean of the squared final-step h plus every step's sum. */
enum { T = 32, B = 2, D = 4, H = 6 };

static tg_tensor *lstm_step(void *ud, int t, tg_tensor *hc)
{
    tg_tensor **p = ud; /* Wx, Wh, b, then xs[T] */
    tg_tensor *h = tg_narrow(hc, 1, 0, H), *c = tg_narrow(hc, 1, H, H);
    tg_tensor *gates = tg_add(tg_add(tg_matmul(p[3 + t], p[0]), tg_matmul(h, p[1])), p[2]);
    tg_tensor *i = tg_sigmoid(tg_narrow(gates, 1, 0, H));
    tg_tensor *f = tg_sigmoid(tg_narrow(gates, 1, H, H));
    tg_tensor *g = tg_tanh(tg_narrow(gates, 1, 2 * H, H));
    tg_tensor *o = tg_sigmoid(tg_narrow(gates, 1, 3 * H, H));
    tg_tensor *c2 = tg_add(tg_mul(f, c), tg_mul(i, g));
    tg_tensor *h2 = tg_mul(o, tg_tanh(c2));
    tg_tensor *both[2] = {h2, c2};
    return tg_concat(2, both, 1);
}

static tg_tensor *lstm(tg_tape *tape, int variant, tg_tensor **p, tg_tensor *x, tg_tensor *y)
{
    (void)y;
    tg_tensor *hc = x; /* zeros (B, 2H) */
    if (variant == SEGMENT)
        hc = tg_checkpoint_sequential(tape, T, 0, lstm_step, p, hc);
    else
        for (int t = 0; t < T; t++) hc = lstm_step(p, t, hc);
    return tg_mean(tg_pow_scalar(hc, 2.0));
}

Test(checkpoint, lstm_unrolled_over_32_steps_matches_under_every_policy)
{
    tg_rng rng;
    tg_rng_seed(&rng, 2);
    tg_tensor *p[3 + T];
    p[0] = tg_rand_normal(&rng, TG_F64, 2, SHAPE(D, 4 * H), 0, 0.4);
    p[1] = tg_rand_normal(&rng, TG_F64, 2, SHAPE(H, 4 * H), 0, 0.4);
    p[2] = tg_rand_normal(&rng, TG_F64, 1, SHAPE(4 * H), 0, 0.1);
    for (int t = 0; t < T; t++) p[3 + t] = tg_rand_normal(&rng, TG_F64, 2, SHAPE(B, D), 0, 1);
    tg_tensor *h0 = tg_zeros(TG_F64, 2, SHAPE(B, 2 * H));
    size_t none_peak = 0, seg_peak = 0;
    compare_policies("lstm", lstm, 3, p, h0, NULL, &none_peak, &seg_peak);
    cr_expect_lt(seg_peak, none_peak / 2, "segments kept %zu of %zu bytes", seg_peak, none_peak);
    for (int i = 0; i < 3 + T; i++) tg_tensor_release(p[i]);
    tg_tensor_release(h0);
}

/* 16 layers Linear(1024) + ReLU; sqrt(16) = 4 groups: segments of 5, 4
 * and 4 layers, then a tail of 3 recorded unsegmented. */
enum { LAYERS = 16, WIDTH = 1024, BATCH = 8 };

static tg_tensor *deep_layer(void *ud, int l, tg_tensor *h)
{
    tg_tensor **p = ud;
    return tg_relu(tg_add(tg_matmul(h, p[2 * l]), p[2 * l + 1]));
}

static tg_tensor *deep(tg_tape *tape, int variant, tg_tensor **p, tg_tensor *x, tg_tensor *y)
{
    (void)y;
    tg_tensor *h = x;
    if (variant == SEGMENT)
        h = tg_checkpoint_sequential(tape, LAYERS, 0, deep_layer, p, h);
    else
        for (int l = 0; l < LAYERS; l++) h = deep_layer(p, l, h);
    return tg_mean(h);
}

Test(checkpoint, sqrt_segments_keep_a_third_of_the_saved_bytes_on_a_16_layer_mlp)
{
    tg_rng rng;
    tg_rng_seed(&rng, 3);
    tg_tensor *p[2 * LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        p[2 * l] = tg_rand_normal(&rng, TG_F64, 2, SHAPE(WIDTH, WIDTH), 0, sqrt(2.0 / WIDTH));
        p[2 * l + 1] = tg_rand_normal(&rng, TG_F64, 1, SHAPE(WIDTH), 0, 0.01);
    }
    tg_tensor *x = tg_rand_normal(&rng, TG_F64, 2, SHAPE(BATCH, WIDTH), 0, 1);
    size_t none_peak = 0, seg_peak = 0;
    compare_policies("deep", deep, 2 * LAYERS, p, x, NULL, &none_peak, &seg_peak);
    /* NONE keeps two (BATCH, WIDTH) activations a layer (matmul's input,
     * relu's output). tg_checkpoint_sequential keeps the input (data,
     * retained by the first segment), the two boundaries between the
     * segments, and what NONE keeps for the 3 tail layers (the last
     * segment's output is the tail's first matmul input): 1 + 2 + 6 = 9 of
     * NONE's 32 activations, under a third. */
    size_t act = (size_t)BATCH * WIDTH * 8;
    cr_assert_eq(none_peak, 2 * LAYERS * act);
    cr_expect_eq(seg_peak, 9 * act, "segments kept %zu bytes, expected %zu (9 activations)",
                 seg_peak, 9 * act);
    cr_expect_leq(3 * seg_peak, none_peak, "segments kept %zu bytes, none %zu", seg_peak,
                  none_peak);
    for (int i = 0; i < 2 * LAYERS; i++) tg_tensor_release(p[i]);
    tg_tensor_release(x);
}

/* ---- tg_checkpoint_sequential runs each stage in a scope of its own and
 * releases each stage's output once the next has run, so the process's
 * tensor peak (tg_mem_peak_bytes, exact byte counts) follows the policy
 * in the ordinary loop: one scope around forward and backward. */
enum { LEAN_LAYERS = 16, LEAN_WIDTH = 64, LEAN_BATCH = 256 };

/* matmul -> add -> relu: two intermediates a stage that nothing saves
 * (matmul's output; add's, since relu saves its own output). */
static tg_tensor *lean_layer(void *ud, int l, tg_tensor *h)
{
    tg_tensor **p = ud;
    return tg_relu(tg_add(tg_matmul(h, p[2 * l]), p[2 * l + 1]));
}

/* Forward and backward in one scope; the tensor peak above what was live
 * before, and the gradients into g. mode: 0 op by op, 1 the stages through
 * tg_checkpoint_sequential without segments, 2 with sqrt(n) segments,
 * 3 and 4 binomial with 3 slots and 1 (recomputes: the forwards backward
 * re-ran, if not NULL). */
static const int lean_nseg[5] = {1, 1, 0, -3, -1};

/* One step of the 16-stage stack under policy: fn's stages through
 * tg_checkpoint_sequential with nsegments nseg, or (fn NULL) lean_layer
 * op by op in the step's scope. */
static size_t stages_peak(int policy, int nseg, tg_segment_fn fn, tg_tensor **p, tg_tensor *x,
                          double *g, size_t ng, int64_t *recomputes)
{
    tg_tape *tape = tape_for(policy, 0);
    for (int i = 0; i < 2 * LEAN_LAYERS; i++) cr_assert_eq(tg_requires_grad(tape, p[i]), TG_OK);
    size_t before = tg_mem_current_bytes();
    tg_mem_reset_peak();
    tg_scope_begin();
    tg_tensor *h = x;
    if (!fn)
        for (int l = 0; l < LEAN_LAYERS; l++) h = lean_layer(p, l, h);
    else
        h = tg_checkpoint_sequential(tape, LEAN_LAYERS, nseg, fn, p, x);
    cr_assert_not_null(h, "%s", tg_last_error_message());
    cr_assert_eq(tg_backward(tg_mean(h)), TG_OK, "%s", tg_last_error_message());
    tg_scope_end();
    size_t peak = tg_mem_peak_bytes() - before;
    size_t n = 0;
    double *gr = grads_of(2 * LEAN_LAYERS, p, &n);
    cr_assert_eq(n, ng);
    memcpy(g, gr, n * sizeof *g);
    free(gr);
    if (recomputes) *recomputes = tg_tape_recompute_count(tape);
    tg_tape_free(tape);
    cr_assert_eq(tg_mem_current_bytes(), before, "the step left tensors behind");
    return peak;
}

static size_t lean_peak_ex(int mode, tg_tensor **p, tg_tensor *x, double *g, size_t ng,
                           int64_t *recomputes)
{
    return stages_peak(NONE, lean_nseg[mode], mode ? lean_layer : NULL, p, x, g, ng, recomputes);
}

static size_t lean_peak(int mode, tg_tensor **p, tg_tensor *x, double *g, size_t ng)
{
    return lean_peak_ex(mode, p, x, g, ng, NULL);
}

/* The stack's weights (He-normal, f64) and a batch of data. */
static void lean_params(tg_tensor **p, tg_tensor **x)
{
    tg_rng rng;
    tg_rng_seed(&rng, 21);
    for (int l = 0; l < LEAN_LAYERS; l++) {
        p[2 * l] = tg_rand_normal(&rng, TG_F64, 2, SHAPE(LEAN_WIDTH, LEAN_WIDTH), 0,
                                  sqrt(2.0 / LEAN_WIDTH));
        p[2 * l + 1] = tg_rand_normal(&rng, TG_F64, 1, SHAPE(LEAN_WIDTH), 0, 0.01);
    }
    *x = tg_rand_normal(&rng, TG_F64, 2, SHAPE(LEAN_BATCH, LEAN_WIDTH), 0, 1);
}

Test(checkpoint, sequential_stages_release_their_intermediates_so_the_peak_follows_the_policy)
{
    tg_tensor *p[2 * LEAN_LAYERS], *x;
    lean_params(p, &x);
    enum { NG = LEAN_LAYERS * (LEAN_WIDTH * LEAN_WIDTH + LEAN_WIDTH) };
    double *g[3];
    size_t peak[3];
    for (int m = 0; m < 3; m++) {
        g[m] = malloc(NG * sizeof *g[m]);
        peak[m] = lean_peak(m, p, x, g[m], NG);
    }
    cr_expect_eq(memcmp(g[0], g[1], NG * sizeof(double)), 0, "lean stages changed the gradients");
    cr_expect_eq(memcmp(g[0], g[2], NG * sizeof(double)), 0, "segments changed the gradients");
    /* Op by op, the scope holds three activations (act bytes each) a layer
     * until the end of backward: 48, 54 with the weights' gradients (16 x
     * 32 KiB = 4 act) and backward's own (measured 53.8). Lean, the tape's
     * saves hold one a layer (relu's output, the next matmul's input) and
     * the sweep frees them as it goes: 16 + 4 and a few in flight
     * (measured 18.3). Segments keep the input, two boundaries and the
     * tail's saves (9), and backward rematerialises one segment of 5
     * layers at a time, holding each stage's output but dropping its
     * matmul's and add's once the next op has been re-run from them
     * (measured 10.05; 18.0 when it held all three). */
    size_t act = (size_t)LEAN_BATCH * LEAN_WIDTH * 8;
    cr_expect_geq(peak[0], (3 * LEAN_LAYERS + 4) * act, "op by op: %zu bytes", peak[0]);
    cr_expect_leq(peak[1], (LEAN_LAYERS + 4 + 3) * act, "lean stages: %zu bytes (op by op %zu)",
                  peak[1], peak[0]);
    cr_expect_leq(peak[2], 11 * act, "segments: %zu bytes (op by op %zu)", peak[2], peak[0]);
    for (int m = 0; m < 3; m++) free(g[m]);
    for (int i = 0; i < 2 * LEAN_LAYERS; i++) tg_tensor_release(p[i]);
    tg_tensor_release(x);
}

/* Binomial checkpointing (nsegments -s) on the same 16-stage stack: the
 * stages as nested segments, so that backward holds at most s stage
 * outputs beside the stage it differentiates. */
Test(checkpoint, binomial_sequential_holds_s_stage_outputs_for_at_most_r_reruns)
{
    tg_tensor *p[2 * LEAN_LAYERS], *x;
    lean_params(p, &x);
    enum { NG = LEAN_LAYERS * (LEAN_WIDTH * LEAN_WIDTH + LEAN_WIDTH) };
    double *g[5];
    size_t peak[5];
    int64_t remade[5];
    for (int m = 0; m < 5; m++) {
        g[m] = malloc(NG * sizeof *g[m]);
        peak[m] = lean_peak_ex(m, p, x, g[m], NG, &remade[m]);
    }
    for (int m = 1; m < 5; m++)
        cr_expect_eq(memcmp(g[0], g[m], NG * sizeof(double)), 0,
                     "mode %d changed the gradients", m);
    /* Beside the weights' gradients (4 act), backward holds the s kept
     * stage outputs, the output of the stage it differentiates, that
     * output's gradient and the gradient it makes (the matmul's and add's
     * outputs are dropped as soon as the next op of the stage has been
     * re-run from them): s + 3. Measured: 9.30 act with 3 slots, 7.81
     * with 1, against 10.05 for sqrt(n) segments and 18.25 for none. Each
     * stage is re-run at most r times, r = 3 for 3 slots (C(6, 3) = 20 >=
     * 16), 15 for 1 (C(16, 1)): at most 3 x 48 and 15 x 48 forwards
     * (measured 72 and 318). */
    size_t act = (size_t)LEAN_BATCH * LEAN_WIDTH * 8;
    cr_expect_leq(peak[3], (4 + 3 + 3) * act, "3 slots: %zu bytes", peak[3]);
    cr_expect_leq(peak[4], (4 + 1 + 3) * act, "1 slot: %zu bytes", peak[4]);
    cr_expect_lt(peak[4], peak[3]);
    cr_expect_lt(peak[3], peak[2], "3 slots %zu bytes, sqrt(n) segments %zu", peak[3], peak[2]);
    cr_expect_gt(remade[3], remade[2], "nested segments re-run more than flat ones");
    cr_expect_leq(remade[3], 3 * 3 * LEAN_LAYERS, "%lld forwards re-run", (long long)remade[3]);
    cr_expect_gt(remade[4], remade[3]);
    cr_expect_leq(remade[4], 15 * 3 * LEAN_LAYERS, "%lld forwards re-run", (long long)remade[4]);
    /* Slots out of range. */
    tg_tape *tape = tape_for(NONE, 0);
    cr_expect_null(tg_checkpoint_sequential(tape, LEAN_LAYERS, -TG_CHECKPOINT_MAX_SLOTS - 1,
                                            lean_layer, p, x));
    cr_expect_eq(tg_last_error(), TG_ERR_INVALID);
    cr_expect_null(tg_checkpoint_sequential(NULL, LEAN_LAYERS, -3, lean_layer, p, x));
    cr_expect_eq(tg_last_error(), TG_ERR_NULL);
    tg_tape_free(tape);
    for (int m = 0; m < 5; m++) free(g[m]);
    for (int i = 0; i < 2 * LEAN_LAYERS; i++) tg_tensor_release(p[i]);
    tg_tensor_release(x);
}

/* BALANCED on affine + relu stages (tg_linear's layer), lean: each relu,
 * memory-bound, is a recompute node kept from a checkpoint of the affine
 * output before it, while the next affine saves the relu's output anyway.
 * The relu then keeps that output too (tg__checkpoint_adopt) and the
 * checkpoint goes: the process holds what NONE holds, and backward re-runs
 * only the last relu, whose output nothing saves (the mean reads
 * nothing): NONE's peak and less than an activation. Before, it held 16
 * affine outputs more and re-ran 16 relus. */
static tg_tensor *affine_layer(void *ud, int l, tg_tensor *h)
{
    tg_tensor **p = ud;
    return tg_relu(tg_affine(h, p[2 * l], p[2 * l + 1]));
}

/* The same with a view between the relu and the next affine (as a
 * flatten before a linear layer): the affine saves the reshape's output,
 * which shares the relu's storage; the relu keeps that as a view of its
 * own shape. */
static tg_tensor *affine_layer_viewed(void *ud, int l, tg_tensor *h)
{
    tg_tensor **p = ud;
    tg_tensor *v = l ? tg_reshape(h, 2, SHAPE(LEAN_BATCH, LEAN_WIDTH)) : h;
    return tg_relu(tg_affine(v, p[2 * l], p[2 * l + 1]));
}

Test(checkpoint, balanced_relu_keeps_the_output_the_next_affine_saves)
{
    tg_tensor *p[2 * LEAN_LAYERS], *x;
    lean_params(p, &x);
    /* affine takes W as (out, in): the same square weights serve. */
    enum { NG = LEAN_LAYERS * (LEAN_WIDTH * LEAN_WIDTH + LEAN_WIDTH) };
    double *g[4];
    size_t peak[4];
    int64_t remade[4];
    const int pol[2] = {NONE, BALANCED};
    for (int k = 0; k < 4; k++) {
        g[k] = malloc(NG * sizeof *g[k]);
        peak[k] = stages_peak(pol[k % 2], 1, k >= 2 ? affine_layer_viewed : affine_layer, p, x,
                              g[k], NG, &remade[k]);
    }
    for (int k = 1; k < 4; k++)
        cr_expect_eq(memcmp(g[0], g[k], NG * sizeof(double)), 0, "run %d changed the gradients",
                     k);
    /* The last relu: at the top of backward its re-run output beside the
     * one the scope holds (its checkpoint, the affine's output, goes as
     * soon as it has been re-run from it). Measured: 0.75 activations
     * above NONE's peak, with the views as without. */
    size_t act = (size_t)LEAN_BATCH * LEAN_WIDTH * 8;
    for (int k = 0; k < 4; k += 2) {
        const char *how = k ? "through views" : "direct";
        cr_expect_eq(remade[k], 0);
        cr_expect_eq(remade[k + 1], 1, "%s: balanced re-ran %lld forwards (the last relu "
                     "expected)", how, (long long)remade[k + 1]);
        cr_expect_leq(peak[k + 1], peak[k] + act, "%s: balanced held %zu bytes, none %zu", how,
                      peak[k + 1], peak[k]);
    }
    for (int k = 0; k < 4; k++) free(g[k]);
    for (int i = 0; i < 2 * LEAN_LAYERS; i++) tg_tensor_release(p[i]);
    tg_tensor_release(x);
}

/* Stages that return what they did not make: their input (stage 0: the
 * caller's x; later, the previous stage's output), a tensor an outer
 * scope owns, or nothing. None is released twice or leaked (the ASan run
 * checks the first; the byte counter the second). */
static tg_tensor *odd_stage(void *ud, int l, tg_tensor *h)
{
    tg_tensor *outer = ud;
    switch (l) {
    case 0: return h;               /* x itself, borrowed */
    case 1: return tg_mul_scalar(h, 2.0);
    case 2: return h;               /* the previous stage's output, borrowed */
    case 3: return outer;           /* owned by the caller's scope */
    default: return tg_add(h, h);
    }
}

static tg_tensor *failing_stage(void *ud, int l, tg_tensor *h)
{
    (void)ud;
    if (l == 2) return tg_matmul(h, h); /* (3, 4) x (3, 4): TG_ERR_SHAPE */
    return tg_mul_scalar(h, 0.5);
}

Test(checkpoint, sequential_stages_may_return_what_they_did_not_make)
{
    size_t before = tg_mem_current_bytes();
    tg_tape *tape = tape_for(NONE, 0);
    tg_tensor *x = tg_full(TG_F64, 2, SHAPE(3, 4), 1.5);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    for (int nseg = 0; nseg <= 1; nseg++) {
        tg_scope_begin();
        tg_tensor *outer = tg_full(TG_F64, 2, SHAPE(3, 4), -1.0);
        tg_tensor *y = tg_checkpoint_sequential(tape, 5, nseg, odd_stage, outer, x);
        cr_assert_not_null(y, "%s", tg_last_error_message());
        double v;
        cr_assert_eq(tg_tensor_item(tg_sum(y), &v), TG_OK);
        cr_expect_eq(v, -24.0, "stage 4 doubles the outer tensor: got %g", v);
        cr_assert_eq(tg_checkpoint_sequential(tape, 0, 0, odd_stage, outer, x), x);
        tg_scope_end();
        tg_tape_reset(tape);

        tg_scope_begin();
        cr_assert_null(tg_checkpoint_sequential(tape, 4, nseg, failing_stage, NULL, x));
        cr_expect_eq(tg_last_error(), TG_ERR_SHAPE, "%s", tg_last_error_message());
        tg_scope_end();
        tg_tape_reset(tape);
    }
    /* No scope open: the result is a new reference the caller releases. */
    tg_tensor *y = tg_checkpoint(tape, failing_stage, NULL, x); /* stage 0: 0.5 x */
    cr_assert_not_null(y, "%s", tg_last_error_message());
    tg_tensor *s = tg_sum(y);
    cr_assert_eq(tg_backward(s), TG_OK, "%s", tg_last_error_message());
    double g[12];
    cr_assert_eq(tg_tensor_copy_out(tg_grad(x), g, sizeof g), TG_OK);
    for (int i = 0; i < 12; i++) cr_expect_eq(g[i], 0.5);
    tg_tensor_release(s);
    tg_tensor_release(y);
    tg_tape_free(tape);
    tg_tensor_release(x);
    cr_expect_eq(tg_mem_current_bytes(), before, "tensors left behind");
}

/* ---- tg_checkpoint_sequential's grouping, seen through a user op that
 * counts its forwards per stage: y = x^2 (saves its input), attrs.ints[0]
 * the stage. A stage inside a segment is run again by backward when the
 * next stage of its segment needs its output; the last stage of a segment
 * is not (its output is a boundary, or the tail's first stage saves it),
 * nor is a tail stage (recorded outside any segment, under NONE). */
static int probe_forwards[64];

static tg_tensor *probe_forward(tg_op_ctx *ctx, tg_tensor *const *in)
{
    probe_forwards[tg_op_ctx_attrs(ctx)->ints[0]]++;
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    const double *x = tg_tensor_data(in[0]);
    double *o = tg_tensor_data(y);
    for (int64_t i = 0; i < tg_tensor_numel(y); i++) o[i] = x[i] * x[i];
    return y;
}

static tg_status probe_backward(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin)
{
    gin[0] = tg_mul(gout, tg_mul_scalar(tg_op_ctx_input(ctx, 0), 2.0));
    return gin[0] ? TG_OK : tg_last_error();
}

static tg_tensor *probe_stage(void *ud, int l, tg_tensor *h)
{
    const tg_op *op = ud;
    tg_op_attrs a = {.ints = {l}, .nints = 1};
    return tg_op_call(op, 1, &h, &a);
}

Test(checkpoint, sequential_segments_all_groups_but_a_shorter_unsegmented_tail)
{
    static const tg_op def = {
        .name = "test_ckpt_probe", .doc = "y = x^2, counting forwards", .arity = 1,
        .shape = tg_op_shape_same, .forward = probe_forward, .backward = probe_backward,
        .cost = TG_COST_MEMORY_BOUND, .saves = TG_SAVE_INPUT(0),
    };
    cr_assert_eq(tg_op_register(&def), TG_OK, "%s", tg_last_error_message());
    const tg_op *op = tg_op_find("test_ckpt_probe");
    /* nlayers, nsegments, then the expected forwards per stage: 2 for a
     * stage backward re-runs, 1 for the others. */
    static const struct {
        int n, k;
        const char *runs;
    } cases[] = {
        {16, 0, "2222122212221111"}, /* 4 groups: segments 5, 4, 4; tail 3 */
        {32, 0, "22222122222122221222212222111111"}, /* 6: 6, 6, 5, 5, 5; tail 5 */
        {9, 0, "222122111"},          /* 3: 4, 3; tail 2 */
        {7, 3, "2212111"},            /* 3: 3, 2; tail 2 */
        {5, 2, "22111"},              /* 2: 3; tail 2 */
        {2, 2, "11"},                 /* 2: 1; tail 1 */
        {4, 9, "1111"},               /* at most n groups: 1, 1, 1; tail 1 */
        {3, 1, "111"},                /* 1 group: no segment */
        {1, 0, "1"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int n = cases[c].n;
        memset(probe_forwards, 0, sizeof probe_forwards);
        tg_tensor *x = tg_full(TG_F64, 1, SHAPE(4), 1.0);
        tg_tape *tape = tape_for(NONE, 0);
        cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
        tg_scope_begin();
        tg_tensor *out = tg_checkpoint_sequential(tape, n, cases[c].k, probe_stage, (void *)op, x);
        cr_assert_not_null(out, "%s", tg_last_error_message());
        cr_assert_eq(tg_backward(tg_sum(out)), TG_OK, "%s", tg_last_error_message());
        tg_scope_end();
        char got[65];
        int recomputed = 0;
        for (int l = 0; l < n; l++) {
            got[l] = (char)('0' + probe_forwards[l]);
            recomputed += probe_forwards[l] - 1;
        }
        got[n] = '\0';
        cr_expect_str_eq(got, cases[c].runs, "%d stages, nsegments %d: forwards %s, expected %s",
                         n, cases[c].k, got, cases[c].runs);
        cr_expect_eq(tg_tape_recompute_count(tape), recomputed);
        /* d/dx x^(2^n) at x = 1: 2^n, exactly */
        double gx;
        cr_assert_eq(tg_tensor_get(tg_grad(x), 0, &gx), TG_OK);
        cr_expect_eq(gx, ldexp(1.0, n), "%d stages: dx %.17g, expected 2^%d", n, gx, n);
        tg_tape_free(tape);
        tg_tensor_release(x);
    }
}

/* 32 tanh in a row under BALANCED: every one is a recompute node, so
 * without a cut backward would rematerialise all 31 interior values before
 * it could free one. The tape keeps one every 8 (after tanh 8, 16 and 24):
 * 3 values instead of NONE's 32, and backward holds at most the 8 values
 * of one chain beyond them. The sum saves (it keeps nothing, and
 * re-running it would keep the last tanh's output: until 7 December it
 * did, for 4 values). */
static void tanh_chain(int variant, size_t *saved_peak, size_t *backward_peak, double *g)
{
    enum { N = 1024, DEPTH = 32 };
    tg_tensor *x = tg_arange(TG_F64, 0, N, 1);
    tg_tensor *xs = tg_mul_scalar(x, 2.0 / N);
    tg_tensor_release(x);
    tg_tape *tape = tape_for(variant, 0);
    cr_assert_eq(tg_requires_grad(tape, xs), TG_OK);
    tg_tensor *h = tg_tensor_retain(xs);
    for (int i = 0; i < DEPTH; i++) { /* released as we go: only the tape keeps values */
        tg_tensor *next = tg_tanh(h);
        cr_assert_not_null(next, "%s", tg_last_error_message());
        tg_tensor_release(h);
        h = next;
    }
    tg_tensor *loss = tg_sum(h);
    tg_tensor_release(h);
    *saved_peak = tg_tape_saved_peak_bytes(tape);
    size_t base = tg_mem_current_bytes();
    tg_mem_reset_peak();
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    *backward_peak = tg_mem_peak_bytes() - base;
    cr_assert_eq(tg_tensor_copy_out(tg_grad(xs), g, N * sizeof(double)), TG_OK);
    tg_tensor_release(loss);
    tg_tape_free(tape);
    tg_tensor_release(xs);
}

Test(checkpoint, balanced_cuts_a_long_chain_of_recompute_nodes)
{
    enum { N = 1024 };
    const size_t value = N * sizeof(double);
    static double g_none[N], g_bal[N];
    size_t saved_none, saved_bal, peak_none, peak_bal;
    tanh_chain(NONE, &saved_none, &peak_none, g_none);
    tanh_chain(BALANCED, &saved_bal, &peak_bal, g_bal);
    cr_expect_eq(memcmp(g_none, g_bal, sizeof g_none), 0, "balanced gradients differ");
    cr_expect_eq(saved_none, 32 * value, "none kept %zu bytes", saved_none);
    cr_expect_eq(saved_bal, 3 * value, "balanced kept %zu bytes, expected 3 values",
                 saved_bal);
    /* the chain of 8 rematerialised values, the gradient flowing back and
     * the one made from it, x's gradient; not the 31 values of the whole
     * chain */
    cr_expect_leq(peak_bal, 11 * value, "balanced backward peaked at %zu bytes (%zu values)",
                  peak_bal, peak_bal / value);
}

Test(checkpoint, budget_below_the_minimum_fails_at_the_op_and_leaves_the_tape_usable)
{
    tg_tape *tape = tape_for(BUDGET, 100);
    tg_tensor *w = tg_ones(TG_F64, 2, SHAPE(4, 4));
    cr_assert_eq(tg_requires_grad(tape, w), TG_OK);
    tg_tensor *data = tg_ones(TG_F64, 2, SHAPE(8, 4)); /* untracked: 256 bytes must be kept */
    tg_tensor *y = tg_matmul(data, w);
    cr_assert_null(y);
    cr_assert_eq(tg_last_error(), TG_ERR_BUDGET);
    cr_assert(strstr(tg_last_error_message(), "'matmul'") != NULL, "%s", tg_last_error_message());
    cr_assert_leq(tg_tape_saved_peak_bytes(tape), 100);
    /* the tape still records what fits */
    tg_scope_begin();
    tg_tensor *l = tg_sum(tg_tanh(w));
    cr_assert_not_null(l, "%s", tg_last_error_message());
    cr_assert_eq(tg_backward(l), TG_OK, "%s", tg_last_error_message());
    cr_assert_not_null(tg_grad(w));
    cr_assert_leq(tg_tape_saved_peak_bytes(tape), 100);
    tg_scope_end();
    tg_tensor_release(data);
    tg_tensor_release(w);
    tg_tape_free(tape);
}

Test(checkpoint, dropout_replays_the_same_mask_when_recomputed)
{
    tg_tensor *x = tg_full(TG_F64, 1, SHAPE(1000), 0.5);
    double *g[3];
    size_t n;
    for (int v = 0; v < 3; v++) {
        tg_tape *tape = tape_for(v == 0 ? NONE : v == 1 ? BALANCED : NONE, 0);
        cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
        tg_rng rng;
        tg_rng_seed(&rng, 17);
        tg_scope_begin();
        if (v == 2) tg_checkpoint_begin(tape);
        tg_tensor *l = tg_sum(tg_tanh(tg_dropout(tg_mul(x, x), 0.3, true, &rng)));
        if (v == 2) tg_checkpoint_end(tape);
        cr_assert_eq(tg_backward(l), TG_OK, "%s", tg_last_error_message());
        tg_scope_end();
        g[v] = grads_of(1, &x, &n);
        if (v) cr_assert_gt(tg_tape_recompute_count(tape), 0);
        tg_tape_free(tape);
    }
    int zeros = 0;
    for (size_t i = 0; i < n; i++) zeros += g[0][i] == 0.0;
    cr_assert(zeros > 200 && zeros < 400, "%d dropped of 1000", zeros);
    cr_assert_eq(memcmp(g[0], g[1], n * sizeof(double)), 0);
    cr_assert_eq(memcmp(g[0], g[2], n * sizeof(double)), 0);
    for (int v = 0; v < 3; v++) free(g[v]);
    tg_tensor_release(x);
}

Test(checkpoint, segments_nest_and_an_unmatched_end_fails)
{
    tg_tape *tape = tape_for(NONE, 0);
    cr_assert_eq(tg_checkpoint_end(tape), TG_ERR_INVALID);
    tg_tensor *x = tg_full(TG_F64, 1, SHAPE(8), 0.3);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    tg_scope_begin();
    cr_assert_eq(tg_checkpoint_begin(tape), TG_OK);
    tg_tensor *a = tg_exp(x);
    cr_assert_eq(tg_checkpoint_begin(tape), TG_OK);
    tg_tensor *b = tg_tanh(a);
    cr_assert_eq(tg_checkpoint_end(tape), TG_OK);
    tg_tensor *c = tg_mul(b, a);
    cr_assert_eq(tg_checkpoint_end(tape), TG_OK);
    cr_assert_eq(tg_tape_saved_bytes(tape), 0, "a segment over leaves keeps nothing");
    cr_assert_eq(tg_backward(tg_sum(c)), TG_OK, "%s", tg_last_error_message());
    /* d/dx tanh(e^x) e^x */
    double gx, e = exp(0.3), t = tanh(e);
    cr_assert_eq(tg_tensor_get(tg_grad(x), 0, &gx), TG_OK);
    cr_assert_float_eq(gx, (1 - t * t) * e * e + t * e, 1e-12);
    cr_assert_eq(tg_backward(tg_sum(c)), TG_ERR_STALE, "a second backward over a recomputed graph");
    tg_scope_end();
    tg_tensor_release(x);
    tg_tape_free(tape);
}

/* An outer segment around two nested ones of four tanh each, on 8K
 * doubles. Backward reaches the second nested segment first: it re-runs
 * the first from the outer segment's input to get there (4 forwards),
 * keeping only the value that leaves it, and the second (4, kept: tanh
 * reads its output). Then it reaches the first nested segment and re-runs
 * its first three tanh again from the outer input (3): 11 forwards, where
 * flat segments re-run each tanh once (8) and hold all eight values at
 * once. Gradients bitwise NONE's either way. */
enum { NEST_N = 1 << 13 }; /* 64 KiB: under a pointwise region's least size */

static size_t nested_run(int mode, tg_tensor *x0, double *g, int64_t *recomputes)
{
    tg_tape *tape = tape_for(NONE, 0);
    tg_tensor *x = tg_detach(x0);
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    size_t before = tg_mem_current_bytes();
    tg_mem_reset_peak();
    /* No scope: each value is released once the next is made, so the
     * peak is what the tape and the backward hold. */
    tg_tensor *h = tg_mul_scalar(x, 1.0); /* interior: the outer input is a checkpoint */
    if (mode) cr_assert_eq(tg_checkpoint_begin(tape), TG_OK);
    for (int half = 0; half < 2; half++) {
        if (mode == 2) cr_assert_eq(tg_checkpoint_begin(tape), TG_OK);
        for (int k = 0; k < 4; k++) {
            tg_tensor *y = tg_tanh(h);
            tg_tensor_release(h);
            h = y;
        }
        if (mode == 2) cr_assert_eq(tg_checkpoint_end(tape), TG_OK);
    }
    if (mode) cr_assert_eq(tg_checkpoint_end(tape), TG_OK);
    tg_tensor *loss = tg_sum(h);
    tg_tensor_release(h);
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    tg_tensor_release(loss);
    size_t peak = tg_mem_peak_bytes() - before;
    *recomputes = tg_tape_recompute_count(tape);
    cr_assert_eq(tg_tensor_copy_out(tg_grad(x), g, NEST_N * sizeof(double)), TG_OK);
    tg_tape_free(tape);
    tg_tensor_release(x);
    return peak;
}

Test(checkpoint, nested_segments_rerun_level_by_level_and_hold_less)
{
    tg_rng rng;
    tg_rng_seed(&rng, 8);
    tg_tensor *x = tg_rand_normal(&rng, TG_F64, 1, SHAPE(NEST_N), 0, 1);
    double *g[3];
    size_t peak[3];
    int64_t remade[3];
    for (int m = 0; m < 3; m++) {
        g[m] = malloc(NEST_N * sizeof(double));
        peak[m] = nested_run(m, x, g[m], &remade[m]);
    }
    for (int m = 1; m < 3; m++)
        cr_expect_eq(memcmp(g[0], g[m], NEST_N * sizeof(double)), 0, "mode %d gradients", m);
    cr_expect_eq(remade[0], 0);
    cr_expect_eq(remade[1], 8);
    cr_expect_eq(remade[2], 11);
    /* In values of NEST_N doubles, beside a few scalars: flat, at the top
     * of backward, the checkpoint, all eight tanh, the gradient arriving
     * and the one being made (11); nested, the checkpoint, the value that
     * leaves the first nested segment, the second's four and the two
     * gradients (8). */
    size_t v = NEST_N * sizeof(double);
    cr_expect_geq(peak[1], 11 * v, "flat: %zu bytes", peak[1]);
    cr_expect_leq(peak[2], 8 * v + 256, "nested: %zu bytes (flat %zu)", peak[2], peak[1]);
    for (int m = 0; m < 3; m++) free(g[m]);
    tg_tensor_release(x);
}

Test(checkpoint, unknown_policy_is_rejected)
{
    tg_tape_opts o = {.policy = (tg_checkpoint_policy)7};
    cr_assert_null(tg_tape_new(&o));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
}

/* affine saves x and W and borrows its leaf bias, so BUDGET can re-run it
 * from what it keeps: with a budget of exactly the untracked batch's bytes,
 * neither the affine's output nor the relu's (which relu saves) fits, so
 * backward re-runs the affine and then the relu from it, once each, and
 * the gradients are NONE's. */
static void affine_relu(tg_tape *tape, tg_tensor *data, tg_tensor *w, tg_tensor *b, double *g)
{
    tg_tensor *p[2] = {w, b};
    for (int i = 0; i < 2; i++) cr_assert_eq(tg_requires_grad(tape, p[i]), TG_OK);
    tg_scope_begin();
    tg_tensor *l = tg_sum(tg_relu(tg_affine(data, w, b)));
    cr_assert_not_null(l, "%s", tg_last_error_message());
    cr_assert_eq(tg_backward(l), TG_OK, "%s", tg_last_error_message());
    tg_scope_end();
    cr_assert_eq(tg_tensor_copy_out(tg_grad(w), g, 12 * sizeof(double)), TG_OK);
    cr_assert_eq(tg_tensor_copy_out(tg_grad(b), g + 12, 3 * sizeof(double)), TG_OK);
    for (int i = 0; i < 2; i++) tg_grad_zero(p[i]);
}

Test(checkpoint, budget_reruns_an_affine_from_its_saves_and_its_leaf_bias)
{
    tg_rng rng;
    tg_rng_seed(&rng, 5);
    tg_tensor *data = tg_rand_uniform(&rng, TG_F64, 2, SHAPE(8, 4), -1, 1); /* 256 bytes */
    tg_tensor *w = tg_rand_uniform(&rng, TG_F64, 2, SHAPE(3, 4), -1, 1);
    tg_tensor *b = tg_rand_uniform(&rng, TG_F64, 1, SHAPE(3), -1, 1);
    double g_none[15], g_budget[15];
    tg_tape *none = tape_for(NONE, 0);
    affine_relu(none, data, w, b, g_none);
    tg_tape_free(none);
    tg_tensor *w2 = tg_detach(w), *b2 = tg_detach(b);
    tg_tape *tape = tape_for(BUDGET, 256);
    affine_relu(tape, data, w2, b2, g_budget);
    cr_expect_leq(tg_tape_saved_peak_bytes(tape), 256);
    cr_expect_eq(tg_tape_recompute_count(tape), 2, "%lld forwards re-run (the affine and "
                 "the relu expected)", (long long)tg_tape_recompute_count(tape));
    cr_expect_eq(memcmp(g_none, g_budget, sizeof g_none), 0, "budget gradients differ from none's");
    tg_tape_free(tape);
    tg_tensor *rel[] = {data, w, b, w2, b2};
    for (int i = 0; i < 5; i++) tg_tensor_release(rel[i]);
}
