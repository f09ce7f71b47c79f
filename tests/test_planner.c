/* The checkpoint planner (src/tape/checkpoint.c): BALANCED never keeps more
 * bytes than NONE, BUDGET never refuses a budget of NONE's bytes and below
 * that either fits or fails with TG_ERR_BUDGET leaving the tape usable, and
 * every policy gives NONE's gradients bitwise. Checked on the cases that
 * broke it (issue 14) and on a few hundred seeded random graphs. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <tapegrad.h>

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

static tg_tape *tape_with(tg_checkpoint_policy policy, size_t budget)
{
    tg_tape_opts o = {.policy = policy, .budget_bytes = budget};
    tg_tape *t = tg_tape_new(&o);
    cr_assert_not_null(t, "%s", tg_last_error_message());
    return t;
}

/* ---- the cases */

/* sum(c / sum(x + c)), x a leaf, c data: NONE keeps 32 bytes (c and the
 * 0-d sum, both saved by div). The greedy planner recomputed the inner sum
 * first, paid a 24-byte checkpoint of x + c and then had 8 bytes for div. */
static tg_status div_by_sum(tg_tape *tape, double *dx)
{
    tg_scope_begin();
    tg_tensor *x = tg_tensor_from_data(TG_F64, 1, SHAPE(3), (double[]){0.5, -1.0, 2.0});
    tg_tensor *c = tg_tensor_from_data(TG_F64, 1, SHAPE(3), (double[]){1.0, 2.0, 3.0});
    cr_assert_eq(tg_requires_grad(tape, x), TG_OK);
    tg_tensor *loss = tg_sum(tg_div(c, tg_sum(tg_add(x, c))));
    tg_status st = loss ? tg_backward(loss) : tg_last_error();
    if (!st) cr_assert_eq(tg_tensor_copy_out(tg_grad(x), dx, 3 * sizeof *dx), TG_OK);
    tg_scope_end();
    return st;
}

Test(planner, budget_of_none_bytes_records_the_division_by_a_sum)
{
    double want[3], got[3];
    tg_tape *none = tape_with(TG_CHECKPOINT_NONE, 0);
    cr_assert_eq(div_by_sum(none, want), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_tape_saved_peak_bytes(none), 32, "NONE keeps %zu bytes",
                 tg_tape_saved_peak_bytes(none));
    tg_tape_free(none);

    tg_tape *tape = tape_with(TG_CHECKPOINT_BUDGET, 32);
    cr_assert_eq(div_by_sum(tape, got), TG_OK, "%s", tg_last_error_message());
    cr_assert_leq(tg_tape_saved_peak_bytes(tape), 32);
    cr_assert(memcmp(got, want, sizeof got) == 0, "BUDGET's gradient differs from NONE's");
    tg_tape_free(tape);

    tape = tape_with(TG_CHECKPOINT_BALANCED, 0);
    cr_assert_eq(div_by_sum(tape, got), TG_OK, "%s", tg_last_error_message());
    cr_assert_leq(tg_tape_saved_peak_bytes(tape), 32);
    cr_assert(memcmp(got, want, sizeof got) == 0, "BALANCED's gradient differs from NONE's");
    tg_tape_free(tape);

    /* Below NONE's bytes nothing fits (div must keep the 24-byte data c
     * saved or retained): an exact refusal, and the tape stays usable. */
    tape = tape_with(TG_CHECKPOINT_BUDGET, 16);
    cr_assert_eq(div_by_sum(tape, got), TG_ERR_BUDGET);
    cr_assert_leq(tg_tape_saved_peak_bytes(tape), 16);
    tg_tape_reset(tape);
    cr_assert_eq(div_by_sum(tape, got), TG_ERR_BUDGET);
    tg_tape_free(tape);
}

/* mse(relu(x W1 + b1) W2 + b2, y), x and y data: BALANCED used to keep
 * 1664 bytes to NONE's 1536, checkpointing the second matmul's output for
 * the bias add, whose backward reads nothing. */
static size_t mlp2(tg_tape *tape, double *grads, size_t n)
{
    tg_rng rng;
    tg_rng_seed(&rng, 7);
    tg_scope_begin();
    tg_tensor *x = tg_rand_uniform(&rng, TG_F64, 2, SHAPE(4, 8), -1, 1);
    tg_tensor *y = tg_rand_uniform(&rng, TG_F64, 2, SHAPE(4, 4), -1, 1);
    tg_tensor *w1 = tg_rand_uniform(&rng, TG_F64, 2, SHAPE(8, 16), -0.5, 0.5);
    tg_tensor *b1 = tg_rand_uniform(&rng, TG_F64, 1, SHAPE(16), -0.5, 0.5);
    tg_tensor *w2 = tg_rand_uniform(&rng, TG_F64, 2, SHAPE(16, 4), -0.5, 0.5);
    tg_tensor *b2 = tg_rand_uniform(&rng, TG_F64, 1, SHAPE(4), -0.5, 0.5);
    tg_tensor *leaves[] = {w1, b1, w2, b2};
    for (int i = 0; i < 4; i++) cr_assert_eq(tg_requires_grad(tape, leaves[i]), TG_OK);
    tg_tensor *h = tg_relu(tg_add(tg_matmul(x, w1), b1));
    tg_tensor *loss = tg_mse_loss(tg_add(tg_matmul(h, w2), b2), y);
    cr_assert_not_null(loss, "%s", tg_last_error_message());
    size_t saved = tg_tape_saved_bytes(tape);
    cr_assert_eq(tg_backward(loss), TG_OK, "%s", tg_last_error_message());
    size_t at = 0;
    for (int i = 0; i < 4; i++) {
        size_t k = (size_t)tg_tensor_numel(leaves[i]);
        cr_assert_leq(at + k, n);
        cr_assert_eq(tg_tensor_copy_out(tg_grad(leaves[i]), grads + at, k * sizeof *grads), TG_OK);
        at += k;
    }
    tg_scope_end();
    return saved;
}

Test(planner, balanced_keeps_no_more_than_none_on_a_two_layer_mlp)
{
    enum { NG = 8 * 16 + 16 + 16 * 4 + 4 };
    double want[NG], got[NG];
    tg_tape *tape = tape_with(TG_CHECKPOINT_NONE, 0);
    size_t none = mlp2(tape, want, NG);
    tg_tape_free(tape);
    tape = tape_with(TG_CHECKPOINT_BALANCED, 0);
    size_t bal = mlp2(tape, got, NG);
    cr_assert_leq(bal, none, "BALANCED keeps %zu bytes, NONE %zu", bal, none);
    cr_assert_leq(tg_tape_saved_peak_bytes(tape), none);
    cr_assert(memcmp(got, want, sizeof got) == 0, "BALANCED's gradients differ from NONE's");
    tg_tape_free(tape);
    tape = tape_with(TG_CHECKPOINT_BUDGET, none);
    size_t bud = mlp2(tape, got, NG);
    cr_assert_leq(bud, none);
    cr_assert(memcmp(got, want, sizeof got) == 0, "BUDGET's gradients differ from NONE's");
    tg_tape_free(tape);
}

/* ---- random graphs
 *
 * A graph is a seed: gen_graph draws its structure from a private
 * generator and its data from a tg_rng, in the same order on every call,
 * so every policy records the same ops on the same values. Values are 2-d
 * (rows, cols <= 6), f64; an op's operands favour the newest value and
 * reuse older ones; a missing operand of the right shape is made anew, a
 * leaf or untracked data. */

enum { MAXV = 96, MAXLEAF = 48 };

typedef struct {
    tg_tensor *t;
    int r, c;
    bool tracked;
} gval;

typedef struct {
    uint64_t s;        /* structure */
    tg_rng data;       /* values */
    tg_tape *tape;
    gval v[MAXV];
    int nv;
    tg_tensor *leaves[MAXLEAF];
    int nleaves;
    tg_status first_err; /* the first op that failed */
    uint64_t nest;       /* nonzero: nested segments drawn from this generator */
} graph;

/* Set by the nested-segment test: gen_graph then opens and closes
 * segments, up to 3 deep, at random op boundaries (from a generator of
 * their own, so the ops and values are those of the run without them). */
static bool nest_segments;
static int nest_depth_seen; /* deepest nesting of the last graph made */

static uint32_t draw(graph *g, uint32_t n)
{
    g->s = g->s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g->s >> 33) % n;
}

static void push(graph *g, tg_tensor *t, int r, int c, bool tracked)
{
    if (!t && !g->first_err) g->first_err = tg_last_error();
    if (g->nv == MAXV) return;
    g->v[g->nv++] = (gval){t, r, c, tracked};
}

static tg_tensor *fresh(graph *g, int ndim, int r, int c, bool *tracked)
{
    tg_tensor *t = ndim == 1 ? tg_rand_uniform(&g->data, TG_F64, 1, SHAPE(c), -1, 1)
                             : tg_rand_uniform(&g->data, TG_F64, 2, SHAPE(r, c), -1, 1);
    *tracked = draw(g, 10) < 6 && g->nleaves < MAXLEAF;
    if (*tracked) {
        cr_assert_eq(tg_requires_grad(g->tape, t), TG_OK);
        g->leaves[g->nleaves++] = t;
    }
    return t;
}

/* An operand: the newest value half the time, else any. */
static gval *pick(graph *g)
{
    return &g->v[draw(g, 2) ? g->nv - 1 : (int)draw(g, (uint32_t)g->nv)];
}

/* A value of shape (r, c) from the pool (a random one of them), else new. */
static gval pick_shaped(graph *g, int r, int c)
{
    int start = (int)draw(g, (uint32_t)g->nv);
    for (int k = 0; k < g->nv; k++) {
        gval *w = &g->v[(start + k) % g->nv];
        if (w->r == r && w->c == c && draw(g, 4)) return *w;
    }
    gval w = {.r = r, .c = c};
    w.t = fresh(g, 2, r, c, &w.tracked);
    return w;
}

static int dim(graph *g)
{
    return 1 + (int)draw(g, 6);
}

enum {
    OP_MATMUL, OP_AFFINE, OP_TANH, OP_RELU, OP_SIGMOID, OP_EXP, OP_ADD, OP_SUB, OP_MUL, OP_DIV,
    OP_SUM_ROWS, OP_MEAN_COLS, OP_SOFTMAX, OP_LOG_SOFTMAX, OP_TRANSPOSE, OP_SCALAR, OP_SCALE,
    OP_DIV_SUM, OP_ROW_BIAS, NOPS
};

static void gen_op(graph *g)
{
    gval a = *pick(g);
    bool tr = a.tracked;
    switch (draw(g, NOPS)) {
    case OP_MATMUL: {
        gval b = pick_shaped(g, a.c, dim(g));
        push(g, tg_matmul(a.t, b.t), a.r, b.c, tr || b.tracked);
        break;
    }
    case OP_AFFINE: {
        gval w = pick_shaped(g, dim(g), a.c);
        bool bt;
        tg_tensor *bias = fresh(g, 1, 1, w.r, &bt);
        push(g, tg_affine(a.t, w.t, bias), a.r, w.r, tr || w.tracked || bt);
        break;
    }
    case OP_TANH: push(g, tg_tanh(a.t), a.r, a.c, tr); break;
    case OP_RELU: push(g, tg_relu(a.t), a.r, a.c, tr); break;
    case OP_SIGMOID: push(g, tg_sigmoid(a.t), a.r, a.c, tr); break;
    case OP_EXP: push(g, tg_exp(tg_tanh(a.t)), a.r, a.c, tr); break;
    case OP_ADD:
    case OP_SUB:
    case OP_MUL: {
        int op = (int)(g->s % 3);
        gval b = pick_shaped(g, a.r, a.c);
        tg_tensor *y = op == 0 ? tg_add(a.t, b.t) : op == 1 ? tg_sub(a.t, b.t) : tg_mul(a.t, b.t);
        push(g, y, a.r, a.c, tr || b.tracked);
        break;
    }
    case OP_DIV: {
        gval b = pick_shaped(g, a.r, a.c);
        push(g, tg_div(a.t, tg_add_scalar(tg_sigmoid(b.t), 0.5)), a.r, a.c, tr || b.tracked);
        break;
    }
    case OP_SUM_ROWS: push(g, tg_sum_dims(a.t, 1, (int[]){1}, true), a.r, 1, tr); break;
    case OP_MEAN_COLS: push(g, tg_mean_dims(a.t, 1, (int[]){0}, true), 1, a.c, tr); break;
    case OP_SOFTMAX: push(g, tg_softmax(a.t, 1), a.r, a.c, tr); break;
    case OP_LOG_SOFTMAX: push(g, tg_log_softmax(a.t, 0), a.r, a.c, tr); break;
    case OP_TRANSPOSE: push(g, tg_transpose(a.t, 0, 1), a.c, a.r, tr); break;
    case OP_SCALAR:
        push(g, draw(g, 2) ? tg_mul_scalar(a.t, 0.5) : tg_add_scalar(a.t, 1.0), a.r, a.c, tr);
        break;
    case OP_SCALE: { /* times a 0-d value made from another */
        gval b = *pick(g);
        push(g, tg_mul(a.t, tg_tanh(tg_mean(b.t))), a.r, a.c, tr || b.tracked);
        break;
    }
    case OP_DIV_SUM: { /* the div(c, sum(x + c)), the divisor kept >= 1 */
        gval b = pick_shaped(g, a.r, a.c);
        tg_tensor *s = tg_sum(tg_add(a.t, b.t));
        push(g, tg_div(b.t, tg_add_scalar(tg_mul(s, s), 1.0)), a.r, a.c, tr || b.tracked);
        break;
    }
    case OP_ROW_BIAS: { /* broadcast add of a (1, c) row */
        gval b = pick_shaped(g, 1, a.c);
        push(g, tg_add(a.t, b.t), a.r, a.c, tr || b.tracked);
        break;
    }
    }
}

/* Records graph seed on tape: nops random ops after one leaf, then a
 * loss summing the newest tracked value and the mean of another. NULL when
 * an op failed (g->first_err says how). */
static tg_tensor *gen_graph(graph *g, uint64_t seed, tg_tape *tape)
{
    memset(g, 0, sizeof *g);
    g->s = seed * 0x9e3779b97f4a7c15ull + 1;
    tg_rng_seed(&g->data, seed);
    g->tape = tape;
    int r = dim(g), c = dim(g);
    tg_tensor *x0 = tg_rand_uniform(&g->data, TG_F64, 2, SHAPE(r, c), -1, 1);
    cr_assert_eq(tg_requires_grad(tape, x0), TG_OK);
    g->leaves[g->nleaves++] = x0;
    push(g, x0, r, c, true);
    int nops = 4 + (int)draw(g, 20);
    /* A third of the graphs record ops lo .. hi-1 in a segment. */
    int lo = nops, hi = nops;
    if (seed % 3 == 0) {
        lo = (int)draw(g, (uint32_t)nops);
        hi = lo + 1 + (int)draw(g, (uint32_t)(nops - lo));
    }
    if (nest_segments) {
        g->nest = seed * 0xd1342543de82ef95ull + 7;
        lo = hi = nops; /* drawn above all the same, so the ops do not change */
    }
    int depth = 0;
    nest_depth_seen = 0;
    for (int k = 0; k < nops; k++) {
        if (k == lo) cr_assert_eq(tg_checkpoint_begin(tape), TG_OK);
        for (int b = 0; g->nest && b < 2; b++) {
            g->nest = g->nest * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t u = (uint32_t)(g->nest >> 33) % 8;
            if (u < 2 && depth < 3) {
                cr_assert_eq(tg_checkpoint_begin(tape), TG_OK);
                if (++depth > nest_depth_seen) nest_depth_seen = depth;
            } else if (u == 2 && depth > 0) {
                cr_assert_eq(tg_checkpoint_end(tape), TG_OK);
                depth--;
            }
        }
        gen_op(g);
        if (k == hi - 1 && lo < nops) cr_assert_eq(tg_checkpoint_end(tape), TG_OK);
    }
    for (; depth > 0; depth--) cr_assert_eq(tg_checkpoint_end(tape), TG_OK);
    int last = -1, other = -1;
    for (int k = g->nv - 1; k >= 0; k--)
        if (g->v[k].tracked && g->v[k].t != x0) {
            if (last < 0) last = k;
            else if (other < 0 || draw(g, 3) == 0) other = k;
        }
    tg_tensor *loss = tg_sum(last >= 0 ? g->v[last].t : x0);
    if (other >= 0) loss = tg_add(loss, tg_mean(g->v[other].t));
    if (!loss && !g->first_err) g->first_err = tg_last_error();
    return g->first_err ? NULL : loss;
}

typedef struct {
    tg_status st;
    size_t saved;  /* tg_tape_saved_bytes after the forward (and the create_graph sweep) */
    size_t peak;
    double *grads; /* every leaf's gradient, in leaf order; NaN-free or not, compared bitwise */
    size_t ngrads;
    unsigned char has[MAXLEAF]; /* which leaves got a gradient */
    int nleaves;
} outcome;

/* Gradients of every leaf into o (second: of sum_i |dL/dleaf_i|^2, through a
 * create_graph sweep). */
static void collect(graph *g, outcome *o)
{
    size_t total = 0;
    for (int i = 0; i < g->nleaves; i++) total += (size_t)tg_tensor_numel(g->leaves[i]);
    o->grads = calloc(total ? total : 1, sizeof *o->grads);
    o->nleaves = g->nleaves;
    size_t at = 0;
    for (int i = 0; i < g->nleaves; i++) {
        size_t k = (size_t)tg_tensor_numel(g->leaves[i]);
        tg_tensor *gr = tg_grad(g->leaves[i]);
        o->has[i] = gr != NULL;
        if (gr) cr_assert_eq(tg_tensor_copy_out(gr, o->grads + at, k * sizeof(double)), TG_OK);
        at += k;
    }
    o->ngrads = total;
    tg_error_clear();
}

/* Records graph seed under opts and sweeps it. A failure must be exactly
 * TG_ERR_BUDGET, after which the tape must still record and sweep. */
static void run(uint64_t seed, tg_checkpoint_policy policy, size_t budget, bool second,
                outcome *o)
{
    memset(o, 0, sizeof *o);
    graph g;
    tg_tape *tape = tape_with(policy, budget);
    tg_scope_begin();
    tg_tensor *loss = gen_graph(&g, seed, tape);
    if (!loss) {
        o->st = g.first_err;
        o->peak = tg_tape_saved_peak_bytes(tape);
        cr_assert_eq(o->st, TG_ERR_BUDGET, "graph %llu: %s", (unsigned long long)seed,
                     tg_last_error_message());
        tg_error_clear();
        tg_tensor *ok = tg_sum(g.leaves[0]); /* keeps nothing: fits any budget */
        cr_assert_not_null(ok, "graph %llu: the tape is not usable after TG_ERR_BUDGET: %s",
                           (unsigned long long)seed, tg_last_error_message());
        cr_assert_eq(tg_backward(ok), TG_OK, "%s", tg_last_error_message());
        tg_scope_end();
        tg_tape_free(tape);
        return;
    }
    if (second) {
        tg_tensor *gr[MAXLEAF] = {0};
        tg_grad_opts go = {.create_graph = true, .allow_unused = true};
        o->st = tg_grad_of(1, &loss, NULL, g.nleaves, g.leaves, gr, &go);
        cr_assert_eq(o->st, TG_OK, "graph %llu: %s", (unsigned long long)seed,
                     tg_last_error_message());
        tg_tensor *l2 = NULL;
        for (int i = 0; i < g.nleaves; i++) {
            tg_tensor *t = tg_sum(tg_mul(gr[i], gr[i]));
            l2 = l2 ? tg_add(l2, t) : t;
        }
        o->saved = tg_tape_saved_bytes(tape);
        cr_assert_not_null(l2, "graph %llu: %s", (unsigned long long)seed, tg_last_error_message());
        if (tg_tensor_requires_grad(l2))
            cr_assert_eq(tg_backward(l2), TG_OK, "%s", tg_last_error_message());
    } else {
        o->saved = tg_tape_saved_bytes(tape);
        cr_assert_eq(tg_backward(loss), TG_OK, "graph %llu: %s", (unsigned long long)seed,
                     tg_last_error_message());
    }
    o->peak = tg_tape_saved_peak_bytes(tape);
    collect(&g, o);
    tg_scope_end();
    tg_tape_free(tape);
}

static void expect_same_grads(uint64_t seed, const char *what, const outcome *want,
                              const outcome *got)
{
    cr_assert_eq(got->nleaves, want->nleaves);
    cr_assert(memcmp(got->has, want->has, (size_t)want->nleaves) == 0,
              "graph %llu, %s: not the same leaves got gradients", (unsigned long long)seed, what);
    cr_assert(memcmp(got->grads, want->grads, want->ngrads * sizeof(double)) == 0,
              "graph %llu, %s: gradients differ from NONE's", (unsigned long long)seed, what);
}

/* BALANCED, then BUDGET given NONE's bytes, on graph seed: each keeps no
 * more than NONE (none) and gives want's gradients. BALANCED's peak. */
static size_t balanced_and_budget_within_none(uint64_t seed, bool second, const outcome *none,
                                              const outcome *want, const char *balanced,
                                              const char *budget)
{
    outcome o;
    run(seed, TG_CHECKPOINT_BALANCED, 0, second, &o);
    cr_assert_eq(o.st, TG_OK);
    cr_assert_leq(o.peak, none->saved, "graph %llu: BALANCED kept %zu bytes, NONE %zu",
                  (unsigned long long)seed, o.peak, none->saved);
    expect_same_grads(seed, balanced, want, &o);
    free(o.grads);
    size_t peak = o.peak;
    run(seed, TG_CHECKPOINT_BUDGET, none->saved, second, &o);
    cr_assert_eq(o.st, TG_OK, "graph %llu: BUDGET refused NONE's %zu bytes",
                 (unsigned long long)seed, none->saved);
    cr_assert_leq(o.peak, none->saved);
    expect_same_grads(seed, budget, want, &o);
    free(o.grads);
    return peak;
}

enum { NGRAPHS = 1000 };

Test(planner, random_graphs_balanced_and_budget_never_keep_more_than_none, .timeout = 120)
{
    /* Budgets below NONE's bytes, in 1/8ths of it. */
    static const int below[] = {7, 6, 4, 2, 1, 0};
    int fits = 0, refused = 0, fewer = 0;
    for (uint64_t seed = 1; seed <= NGRAPHS; seed++) {
        bool second = seed % 4 == 0;
        outcome none, o;
        run(seed, TG_CHECKPOINT_NONE, 0, second, &none);
        cr_assert_eq(none.st, TG_OK);
        cr_assert_eq(none.peak, none.saved, "graph %llu: NONE's bytes fell",
                     (unsigned long long)seed);

        fewer += balanced_and_budget_within_none(seed, second, &none, &none, "balanced",
                                                 "budget = none") < none.saved;

        for (size_t k = 0; !second && k < sizeof below / sizeof *below; k++) {
            size_t budget = none.saved * (size_t)below[k] / 8;
            run(seed, TG_CHECKPOINT_BUDGET, budget, false, &o);
            cr_assert_leq(o.peak, budget, "graph %llu: BUDGET kept %zu bytes over %zu",
                          (unsigned long long)seed, o.peak, budget);
            if (o.st == TG_OK) {
                fits++;
                expect_same_grads(seed, "budget below none", &none, &o);
            } else {
                refused++;
            }
            free(o.grads);
        }
        free(none.grads);
    }
    cr_log_info("%d budgets below NONE's fitted, %d were refused; BALANCED kept fewer bytes "
                "than NONE on %d of %d graphs", fits, refused, fewer, NGRAPHS);
    /* The generator must exercise both outcomes, and BALANCED must save. */
    cr_assert_gt(fits, NGRAPHS, "only %d runs under NONE's bytes fitted", fits);
    cr_assert_gt(refused, NGRAPHS / 4, "only %d runs under NONE's bytes were refused", refused);
    cr_assert_gt(fewer, NGRAPHS / 4, "BALANCED kept fewer bytes than NONE on only %d graphs",
                 fewer);
}

/* Nested segments (tg_checkpoint_begin/end up to 3 deep, opened and closed
 * at random op boundaries) over the same random graphs: backward re-runs
 * them level by level, dropping and re-making values (recompute.c), and
 * must give the gradients of the graph without segments under NONE,
 * bitwise, under every policy, first order and through a create_graph
 * sweep; BALANCED and BUDGET (given NONE's bytes) keep no more than NONE
 * with the same segments. */
Test(planner, random_graphs_with_nested_segments_give_nones_gradients, .timeout = 120)
{
    enum { N = 1000 };
    int nested = 0;
    for (uint64_t seed = 1; seed <= N; seed++) {
        bool second = seed % 4 == 0;
        outcome plain, none;
        nest_segments = false;
        run(seed, TG_CHECKPOINT_NONE, 0, second, &plain);
        cr_assert_eq(plain.st, TG_OK);
        nest_segments = true;
        run(seed, TG_CHECKPOINT_NONE, 0, second, &none);
        nested += nest_depth_seen >= 2;
        cr_assert_eq(none.st, TG_OK);
        expect_same_grads(seed, "nested segments, none", &plain, &none);
        balanced_and_budget_within_none(seed, second, &none, &plain, "nested segments, balanced",
                                        "nested segments, budget");
        free(none.grads);
        free(plain.grads);
    }
    nest_segments = false;
    cr_log_info("%d of %d graphs nested segments 2 or 3 deep", nested, N);
    cr_assert_gt(nested, N / 4, "only %d graphs nested segments", nested);
}
