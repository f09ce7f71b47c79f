/* Fused pointwise functions (include/tapegrad/fused.h).
 *
 * tg_fused_new runs the user's function once on one-element inputs marked
 * on a private tape and turns the record into a program: a list of steps,
 * each a unary map (unary.c's kernels) or add, sub or mul, reading the
 * inputs and earlier steps. The program lives in an i64 tensor that is the
 * fused op's last input, so a node recording a call keeps it (the node
 * saves its inputs): freeing the tg_fused never leaves a record pointing
 * at nothing, and a program from anywhere else (tg_op_call) is checked
 * word by word by the shape rule before anything runs it.
 *
 * Forward: the elements go in blocks (block_bytes: 2 KiB a value where a
 * block's values fit the L1 cache, else 16 KiB), each step runs its kernel
 * on the block with the intermediate values in per-step buffers that stay
 * in cache; the last step writes the output, and when the call is
 * recorded, the values the steps' backward reads (a map's output or
 * operand, a product's operands: what the ops would keep) go to one saved
 * tensor instead of a buffer, block after block. tg_fused_sum's forward
 * sums the last step's blocks instead of writing them where it can.
 * Recomputing the kept values in backward instead kept less but ran
 * slower here (fwd+bwd of the elementwise chain at 0.95 of the ops' time
 * against 0.76 kept, medians of 15 rounds on one thread; recomputing only
 * a map of an input, sigmoid(x), 1.47-1.55x of the fused pass against
 * 1.35-1.43x): tanh and sigmoid cost more than reading their values back.
 *
 * Backward: per block, the steps are differentiated from the last to the
 * first, as the sweep differentiates the ops one by one: the kernels each
 * op's backward runs, on the same operands, and each value's gradient
 * summed in the sweep's order (contributions from later steps first; a
 * step's operands in order; the first one stored, the next added by the
 * add kernel). So a call gives the unfused ops' output and,
 * where its inputs' gradients come from it alone, their gradients, bit
 * for bit. Large calls split their blocks across the pool's threads.
 *
 * Where backward must be recorded (create_graph, or an input or the
 * gradient tracked), the same steps run as tg_* ops on whole tensors (the
 * maps' fused gradient ops are differentiable), so calls differentiate to
 * any order. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/parallel.h"
#include "core/pool.h"
#include "ops/fused_plan.h"
#include "ops/helpers.h"
#include "tape/tape_internal.h"

#define PROG_MAGIC INT64_C(0x7467667573656431) /* "tgfused1" */
#define HEAD 3                                  /* magic, inputs, steps */
#define STEP 5                                  /* code, a, b, p bits, q bits */

/* The ops a step may be, by code (the program's first word of a step). */
extern const tg_op tg__op_exp, tg__op_log, tg__op_sqrt, tg__op_tanh, tg__op_sigmoid,
    tg__op_relu, tg__op_pow_scalar, tg__op_abs, tg__op_gelu, tg__op_silu, tg__op_leaky_relu,
    tg__op_clamp, tg__op_softplus, tg__op_sin, tg__op_cos, tg__op_neg, tg__op_add_scalar,
    tg__op_mul_scalar, tg__op_add, tg__op_sub, tg__op_mul;
static const tg_op *const step_ops[] = {
    &tg__op_exp,   &tg__op_log,        &tg__op_sqrt,      &tg__op_tanh,       &tg__op_sigmoid,
    &tg__op_relu,  &tg__op_pow_scalar, &tg__op_abs,       &tg__op_gelu,       &tg__op_silu,
    &tg__op_leaky_relu, &tg__op_clamp, &tg__op_softplus,  &tg__op_sin,        &tg__op_cos,
    &tg__op_neg,   &tg__op_add_scalar, &tg__op_mul_scalar, &tg__op_add,       &tg__op_sub,
    &tg__op_mul,
};
#define NCODES ((int)(sizeof step_ops / sizeof step_ops[0]))
#define FIRST_BINARY (NCODES - 3) /* add, sub, mul: the last three */

/* One decoded step. Operand refs: 0..nin-1 the inputs, nin + j step j. */
typedef struct step {
    int code, a, b; /* b: -1 for a map */
    double p, q;
    tg__map_info map;   /* maps */
    tg_kernel_id kid;   /* add, sub, mul */
} step;

typedef struct prog {
    int nin, n;
    step s[TG_FUSED_MAX_OPS];
    /* The values the backward reads (a map's output or operand, a
     * product's operands): kept, row krow[j] of the call's saved tensor. */
    bool keep[TG_FUSED_MAX_OPS];
    int krow[TG_FUSED_MAX_OPS], nkeep;
} prog;

static double f64_of(int64_t w)
{
    double d;
    memcpy(&d, &w, sizeof d);
    return d;
}

static int64_t bits_of(double d)
{
    int64_t w;
    memcpy(&w, &d, sizeof w);
    return w;
}

/* Decodes and checks the program words; on error records it for op and
 * returns its status. */
static tg_status decode(const tg_op *op, const tg_tensor *t, int nin, prog *pr)
{
    const char *bad = NULL;
    const int64_t *w = t->dtype == TG_I64 && t->ndim == 1 && t->contiguous ? tg__tensor_ptr(t)
                                                                             : NULL;
    int64_t len = w ? t->numel : 0;
    if (!w)
        bad = "not a 1-d contiguous i64 tensor";
    else if (len < HEAD || w[0] != PROG_MAGIC)
        bad = "no fused program header";
    else if (w[1] != nin)
        bad = "compiled for another number of inputs";
    else if (w[2] < 1 || w[2] > TG_FUSED_MAX_OPS || len != HEAD + STEP * w[2])
        bad = "step count does not match its length";
    for (int j = 0; !bad && j < (int)w[2]; j++) {
        const int64_t *sw = w + HEAD + STEP * j;
        step *s = &pr->s[j];
        if (sw[0] < 0 || sw[0] >= NCODES) {
            bad = "unknown step";
            break;
        }
        s->code = (int)sw[0];
        bool binary = s->code >= FIRST_BINARY;
        bool b_ok = binary ? sw[2] >= 0 && sw[2] < nin + j : sw[2] == -1;
        if (sw[1] < 0 || sw[1] >= nin + j || !b_ok) {
            bad = "operand out of range";
            break;
        }
        s->a = (int)sw[1];
        s->b = (int)sw[2];
        s->p = f64_of(sw[3]);
        s->q = f64_of(sw[4]);
        if (binary)
            s->kid = s->code == FIRST_BINARY ? TG_K_ADD : s->code == FIRST_BINARY + 1 ? TG_K_SUB
                                                                                     : TG_K_MUL;
        else if (!tg__map_info_of(step_ops[s->code], &s->map))
            bad = "unknown map";
    }
    if (bad)
        return tg__err(TG_ERR_INVALID, "bad argument #%d to '%s' (not a fused program: %s)",
                       nin + 1, op->name, bad);
    pr->nin = nin;
    pr->n = (int)w[2];
    pr->nkeep = 0;
    memset(pr->keep, 0, sizeof pr->keep);
    for (int j = 0; j < pr->n; j++) {
        const step *s = &pr->s[j];
        if (s->b < 0 && s->map.gkid && s->map.from_output) pr->keep[j] = true;
        if (s->b < 0 && s->map.gkid && !s->map.from_output && s->a >= nin)
            pr->keep[s->a - nin] = true;
        if (s->b >= 0 && s->kid == TG_K_MUL) {
            if (s->a >= nin) pr->keep[s->a - nin] = true;
            if (s->b >= nin) pr->keep[s->b - nin] = true;
        }
    }
    for (int j = 0; j < pr->n; j++) pr->krow[j] = pr->keep[j] ? pr->nkeep++ : -1;
    return TG_OK;
}

/* ---- shape rule: n float inputs of one dtype and shape, then the program */
static tg_status fused_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                             tg_spec *out)
{
    (void)a;
    int nin = op->arity - 1;
    for (int i = 0; i < nin; i++) {
        if (tg__need_float(op, i + 1, in[i]) || tg__need_same_dtype(op, in[0], in[i]))
            return TG_ERR_DTYPE;
        if (!tg__same_shape(in[0]->ndim, in[0]->shape, in[i]->ndim, in[i]->shape)) {
            char s1[96], s2[96];
            return tg__err(TG_ERR_SHAPE, "bad argument #%d to '%s' (shape %s, input 1 has %s; a "
                                         "fused call does not broadcast)", i + 1, op->name,
                           tg_shape_str(in[i]->ndim, in[i]->shape, s1, sizeof s1),
                           tg_shape_str(in[0]->ndim, in[0]->shape, s2, sizeof s2));
        }
    }
    prog pr;
    tg_status st = decode(op, in[nin], nin, &pr);
    if (st) return st;
    tg__spec_of(in[0], out);
    return TG_OK;
}

/* The sum's: the same inputs, one value out. */
static tg_status fused_sum_shape(const tg_op *op, const tg_op_attrs *a, tg_tensor *const *in,
                                 tg_spec *out)
{
    tg_status st = fused_shape(op, a, in, out);
    out->ndim = 0;
    return st;
}

/* ---- the block engine */

/* The bytes a block of each value takes. A block's working set is about
 * a buffer per step, the seed and a contribution, the kept values, and
 * the inputs' slices and their gradients'; forward and backward at once
 * (fb), a buffer per step for each and no kept values. Where it fits the
 * budget at 2 KiB a value or more, the largest power of two that fits is
 * used (the kernels' per-call cost grows below 2 KiB); where it does not,
 * blocks of 16 KiB, in L2. The budget: the L1 data cache for fb, half of
 * it otherwise (the kept values stream through besides). Measured on the
 * elementwise chain and on chains of 1 to 40 maps and products over 1M
 * floats (docs/benchmarks.md, "Fused pointwise functions"). */
#define SMALL_BLOCK 2048
#define L2_BLOCK 16384
static size_t l1_bytes(void)
{
    static _Atomic size_t cached;
    size_t v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (!v) {
        long r = -1;
#ifdef _SC_LEVEL1_DCACHE_SIZE
        r = sysconf(_SC_LEVEL1_DCACHE_SIZE);
#endif
        v = r >= 16384 && r <= (1L << 22) ? (size_t)r : 32768;
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}

static size_t block_bytes(const prog *pr, bool fb)
{
    size_t n = (size_t)pr->n, io = 2 * (size_t)pr->nin + 1;
    size_t w = fb ? 2 * n + 2 + io : n + 2 + (size_t)pr->nkeep + io;
    size_t fit = (fb ? l1_bytes() : l1_bytes() / 2) / w;
    if (fit < SMALL_BLOCK) return L2_BLOCK;
    size_t b = SMALL_BLOCK;
    while (2 * b <= fit && b < L2_BLOCK) b *= 2;
    return b;
}

/* One call's buffers and operands. */
typedef struct engine {
    const prog *pr;
    tg_backend be;
    tg_dtype dt;
    size_t es;
    int64_t numel;
    size_t bbytes;                      /* bytes a block of each value (block_bytes) */
    int64_t block, nblocks;             /* elements a block, blocks in all */
    tg_bcast bc;                        /* the binary kernels' view of a block */
    const char *in[TG_FUSED_MAX_INPUTS];
    char *out;                          /* forward: the result */
    char *saved;                        /* the kept values (prog.keep), NULL: none */
    const char *gy;                     /* backward: the gradient (NULL: gy1 everywhere) */
    double gy1;
    char *gin[TG_FUSED_MAX_INPUTS];     /* backward: input gradients (NULL: not needed) */
    char *scratch;                      /* per part: part_bytes */
    size_t part_bytes;
    /* Forward of a fused sum (cpu f32): the result is not written; each
     * part sums its blocks' last values by the exact pass and leaves the
     * state in ex[part], exok[part] false where it failed (NULL: no sum). */
    tg__exact_sum *ex;
    bool *exok;
    /* Forward and backward block by block (a fused sum's gradient made
     * with its forward, or remade): each block's backward reads the
     * values its forward left in the buffers, seeded with gy1. */
    bool fb;
} engine;

/* A part's blocks: forward, a value per step; backward, a gradient per
 * step, the broadcast seed and a contribution; both at once (fb), all. */
static size_t part_bytes(const engine *e, bool backward)
{
    size_t n = (size_t)e->pr->n;
    return e->bbytes * (n + (backward || e->fb ? 2 : 0) + (e->fb ? n : 0));
}

static void binary_block(tg_kernel_id kid, const engine *e, int64_t m, const void *a,
                         const void *b, void *out)
{
    const tg_bcast *bc = &e->bc; /* a whole block's, made once: not zeroed call by call */
    tg_bcast last;
    if (m != e->block) {
        last = e->bc;
        last.n = last.shape[0] = m;
        bc = &last;
    }
    ((tg_binary_fn)tg__kernel(kid, e->be, e->dt))(bc, a, b, out);
}

static void map_block(const step *s, const engine *e, int64_t m, const void *x, void *y)
{
    if (s->map.two)
        ((tg_unary2_fn)tg__kernel(s->map.kid, e->be, e->dt))(m, x, y, s->p, s->q);
    else
        ((tg_unary_fn)tg__kernel(s->map.kid, e->be, e->dt))(m, x, y, s->p);
}

/* Operand ref r of the block at element o: an input's slice, or where
 * the block's value of the step is (vp). */
static const char *operand(const engine *e, char *const *vp, int r, int64_t o)
{
    return r < e->pr->nin ? e->in[r] + (size_t)o * e->es : vp[r - e->pr->nin];
}

/* Step j's slice of the saved values in the block [o, o + m). The saved
 * tensor holds them block by block, a block's kept rows one after the
 * other: the forward writes it and the backward reads it as one stream,
 * however many values a program keeps. */
static char *kept(const engine *e, int j, int64_t o, int64_t m)
{
    const prog *pr = e->pr;
    return e->saved + ((size_t)o * (size_t)pr->nkeep + (size_t)pr->krow[j] * (size_t)m) * e->es;
}

/* Runs every step on the block [o, o + m), each into its buffer (val), or
 * its saved slice when it is kept and e->saved is set, the last one into
 * last when given (and its saved slice, if kept); vp gets where each
 * value is. */
static void forward_block(const engine *e, char *const *val, char **vp, int64_t o, int64_t m,
                          char *last)
{
    const prog *pr = e->pr;
    for (int j = 0; j < pr->n; j++) {
        const step *s = &pr->s[j];
        char *dst = j == pr->n - 1 && last     ? last
                    : e->saved && pr->keep[j] ? kept(e, j, o, m)
                                              : val[j];
        const char *a = operand(e, vp, s->a, o);
        if (s->b < 0)
            map_block(s, e, m, a, dst);
        else
            binary_block(s->kid, e, m, a, operand(e, vp, s->b, o), dst);
        vp[j] = dst;
    }
    if (last && e->saved && pr->keep[pr->n - 1])
        memcpy(kept(e, pr->n - 1, o, m), last, (size_t)m * e->es);
}

/* Ref r's own gradient block (a step's buffer, or an input's slice of
 * its gradient), NULL when no gradient goes there. */
static char *own(const engine *e, char *const *grad, int r, int64_t o)
{
    if (r >= e->pr->nin) return grad[r - e->pr->nin];
    return e->gin[r] ? e->gin[r] + (size_t)o * e->es : NULL;
}

/* A block's gradients: gp[r] is where ref r's gradient is, NULL while
 * none has arrived; it may be another ref's block when a gradient was
 * passed on unchanged (add, add_scalar: no copy). Every block a gp points
 * at is complete: gradients flow from later steps to earlier ones. */
typedef struct bgrad {
    const engine *e;
    char *const *grad;
    char *tmp;
    int64_t o, m;
    const char *gp[TG_FUSED_MAX_INPUTS + TG_FUSED_MAX_OPS];
} bgrad;

/* Where a kernel should write ref r's next contribution: r's own block
 * when it is the first (the sum is then done), else tmp; NULL: none
 * needed. */
static char *contrib_dst(const bgrad *bg, int r)
{
    char *dst = own(bg->e, bg->grad, r, bg->o);
    return !dst ? NULL : bg->gp[r] ? bg->tmp : dst;
}

/* After a kernel wrote r's contribution where contrib_dst said: the first
 * is r's gradient; a later one is added, gp + tmp by the add kernel into
 * r's own block (the sweep's accumulation: what arrived first, plus the
 * new one). */
static void contrib_done(bgrad *bg, int r)
{
    char *dst = own(bg->e, bg->grad, r, bg->o);
    if (!dst) return;
    if (bg->gp[r]) binary_block(TG_K_ADD, bg->e, bg->m, bg->gp[r], bg->tmp, dst);
    bg->gp[r] = dst;
}

/* A contribution that is an existing block c, passed on unchanged. */
static void contrib_pass(bgrad *bg, int r, const char *c)
{
    char *dst = own(bg->e, bg->grad, r, bg->o);
    if (!dst) return;
    if (bg->gp[r]) {
        binary_block(TG_K_ADD, bg->e, bg->m, bg->gp[r], c, dst);
        bg->gp[r] = dst;
    } else {
        bg->gp[r] = c;
    }
}

/* out = p + g * a (p NULL: g * a), then + g * a again when twice: the
 * mul and add kernels' bits in one pass (tg_mul_add_fn). */
static void mul_add(const engine *e, int64_t m, const void *p, const void *g, const void *a,
                    void *out, bool twice)
{
    ((tg_mul_add_fn)tg__kernel(TG_K_MUL_ADD, e->be, e->dt))(m, p, g, a, out, twice);
}

/* A product's contribution g * x to ref r, added to what arrived before
 * in the same pass. */
static void contrib_mul(bgrad *bg, int r, const char *g, const char *x)
{
    char *dst = own(bg->e, bg->grad, r, bg->o);
    if (!dst) return;
    mul_add(bg->e, bg->m, bg->gp[r], g, x, dst, false);
    bg->gp[r] = dst;
}

static void backward_block(const engine *e, char *const *grad, const char *gyb, char *tmp,
                           int64_t o, int64_t m, char *const *fvp)
{
    const prog *pr = e->pr;
    bgrad bg;
    bg.e = e, bg.grad = grad, bg.tmp = tmp, bg.o = o, bg.m = m;
    memset(bg.gp, 0, (size_t)(pr->nin + pr->n) * sizeof bg.gp[0]); /* the refs there are */
    char *vp[TG_FUSED_MAX_OPS]; /* what the steps' gradients read was kept */
    for (int j = 0; j < pr->n; j++)
        vp[j] = fvp ? fvp[j] : pr->keep[j] ? kept(e, j, o, m) : NULL;
    /* The seed: the call's gradient, or one value broadcast (gyb). */
    bg.gp[pr->nin + pr->n - 1] = e->gy ? e->gy + (size_t)o * e->es : gyb;
    for (int j = pr->n - 1; j >= 0; j--) {
        const step *s = &pr->s[j];
        const char *g = bg.gp[pr->nin + j];
        if (!g) continue;
        const char *a = operand(e, vp, s->a, o);
        char *dst;
        if (s->b < 0 && s->map.gkid) { /* a map: gy * f'(s) */
            const char *sv = s->map.from_output ? vp[j] : a;
            if ((dst = contrib_dst(&bg, s->a))) {
                if (s->map.two)
                    ((tg_grad2_fn)tg__kernel(s->map.gkid, e->be, e->dt))(m, sv, g, dst, s->p,
                                                                       s->q);
                else
                    ((tg_grad_fn)tg__kernel(s->map.gkid, e->be, e->dt))(m, sv, g, dst, s->p);
                contrib_done(&bg, s->a);
            }
        } else if (s->b < 0) { /* neg, add_scalar, mul_scalar */
            if (s->map.op == &tg__op_add_scalar) {
                contrib_pass(&bg, s->a, g);
            } else if ((dst = contrib_dst(&bg, s->a))) {
                map_block(s, e, m, g, dst); /* -g, or g * s */
                contrib_done(&bg, s->a);
            }
        } else if (s->kid == TG_K_MUL && s->a == s->b) {
            /* x * x: both contributions are g x, made once as mul's
             * backward makes them, then added as the sweep adds them,
             * in one pass. */
            char *own_a = own(e, grad, s->a, o);
            if (own_a) {
                mul_add(e, m, bg.gp[s->a], g, a, own_a, true);
                bg.gp[s->a] = own_a;
            }
        } else if (s->kid == TG_K_MUL && g == gyb && e->gy1 == 1.0) {
            /* The seed 1 times an operand is that operand: passed on as
             * it is, where the ops would multiply it by ones (the same
             * bits, but that a signaling NaN stays signaling). */
            contrib_pass(&bg, s->a, operand(e, vp, s->b, o));
            contrib_pass(&bg, s->b, a);
        } else if (s->kid == TG_K_MUL) {
            contrib_mul(&bg, s->a, g, operand(e, vp, s->b, o));
            contrib_mul(&bg, s->b, g, a);
        } else { /* add, sub */
            contrib_pass(&bg, s->a, g);
            if (s->kid == TG_K_ADD) {
                contrib_pass(&bg, s->b, g);
            } else if ((dst = contrib_dst(&bg, s->b))) {
                ((tg_unary_fn)tg__kernel(TG_K_NEG, e->be, e->dt))(m, g, dst, 0.0);
                contrib_done(&bg, s->b);
            }
        }
    }
    /* Inputs: a gradient passed on unchanged is copied into place; one no
     * step reached is zeros. */
    for (int i = 0; i < pr->nin; i++) {
        char *dst = own(e, grad, i, o);
        if (!dst || bg.gp[i] == dst) continue;
        if (bg.gp[i])
            memcpy(dst, bg.gp[i], (size_t)m * e->es);
        else
            memset(dst, 0, (size_t)m * e->es);
    }
}

/* The blocks [*b0, *b1) of part `part` of `nparts`. */
static void part_blocks(const engine *e, int part, int nparts, int64_t *b0, int64_t *b1)
{
    *b0 = e->nblocks * part / nparts;
    *b1 = e->nblocks * (part + 1) / nparts;
}

/* Part `part` of `nparts` of the blocks, on one thread, with its own
 * buffers (the pool may run fewer parts than were asked for, never more). */
static void run_part(const engine *e, int part, int nparts, bool backward)
{
    const prog *pr = e->pr;
    const int64_t block = e->block;
    int64_t b0, b1;
    part_blocks(e, part, nparts, &b0, &b1);
    char *base = e->scratch + e->part_bytes * (size_t)part;
    /* forward: the values; backward: the gradients; both (fb): apart */
    char *buf[TG_FUSED_MAX_OPS], *gbuf[TG_FUSED_MAX_OPS];
    size_t blk = e->bbytes, nval = e->fb ? (size_t)pr->n : 0;
    for (int j = 0; j < pr->n; j++) {
        buf[j] = base + blk * (size_t)j;
        gbuf[j] = base + blk * (nval + (size_t)j);
    }
    char *gyb = base + blk * (nval + (size_t)pr->n), *tmp = gyb + blk;
    if ((backward || e->fb) && !e->gy) /* the broadcast seed, once for the part */
        ((tg_fill_fn)tg__kernel(TG_K_FILL, e->be, e->dt))(block, gyb, e->gy1);
    /* The part's sum on its own stack, stored once at the end: parts
     * writing next to each other block by block share cache lines. */
    tg__exact_sum ex;
    bool exok = e->ex != NULL;
    tg__exact_sum_init(&ex);
    for (int64_t b = b0; b < b1; b++) {
        int64_t o = b * block, m = e->numel - o < block ? e->numel - o : block;
        if (backward) {
            backward_block(e, gbuf, gyb, tmp, o, m, NULL);
        } else {
            char *vp[TG_FUSED_MAX_OPS];
            forward_block(e, buf, vp, o, m, e->out ? e->out + (size_t)o * e->es : NULL);
            if (exok) exok = tg__exact_sum_add(&ex, (const float *)vp[pr->n - 1], m, e->numel);
            if (e->fb) backward_block(e, gbuf, gyb, tmp, o, m, vp);
        }
    }
    if (e->ex) {
        e->ex[part] = ex;
        e->exok[part] = exok;
    }
}

static void forward_part(void *ctx, int part, int nparts)
{
    run_part(ctx, part, nparts, false);
}

static void backward_part(void *ctx, int part, int nparts)
{
    run_part(ctx, part, nparts, true);
}

/* The parts run() splits the blocks into (the pool may run fewer). */
static int parts_of(const engine *e)
{
    int parts = tg__split_parts((size_t)e->numel * e->es);
    if (parts > tg__pool_size()) parts = tg__pool_size();
    if (parts > e->nblocks) parts = (int)e->nblocks;
    return parts < 1 ? 1 : parts;
}

/* Runs the engine over every block, split across the pool where the
 * tensors are large; false (error recorded) when its buffers cannot be
 * had. */
static bool run(engine *e, bool backward)
{
    if (e->numel == 0) return true;
    int parts = parts_of(e);
    e->part_bytes = part_bytes(e, backward);
    size_t total = e->part_bytes * (size_t)parts;
    e->scratch = tg__data_alloc(total);
    if (!e->scratch) {
        tg__err(TG_ERR_NOMEM, "out of memory for a fused call's %zu bytes of blocks", total);
        return false;
    }
    if (parts == 1)
        run_part(e, 0, 1, backward);
    else
        tg__pool_run(backward ? backward_part : forward_part, e, parts);
    tg__data_free(e->scratch, total);
    return true;
}

/* Sets the engine's mode (fb: forward and backward block by block) and
 * the block size that goes with it. */
static void engine_mode(engine *e, bool fb)
{
    e->fb = fb;
    e->bbytes = block_bytes(e->pr, fb);
    e->block = (int64_t)(e->bbytes / e->es);
    e->bc = (tg_bcast){.ndim = 1, .n = e->block, .shape = {e->block}, .sa = {1}, .sb = {1},
                       .same = true};
    e->nblocks = (e->numel + e->block - 1) / e->block;
}

static void engine_init(engine *e, const prog *pr, const tg_tensor *x0, tg_tensor *const *in)
{
    memset(e, 0, sizeof *e);
    e->pr = pr;
    e->be = x0->backend;
    e->dt = x0->dtype;
    e->es = tg__esize(x0->dtype);
    e->numel = x0->numel;
    engine_mode(e, false);
    for (int i = 0; i < pr->nin; i++) e->in[i] = tg__tensor_ptr(in[i]);
}

/* A recorded call keeps the values the backward reads, as the ops would:
 * a new tensor in *sv, engine e writing them; *sv NULL when nothing is
 * kept or the call is not recorded. false (error recorded) when it cannot
 * be had. */
static bool new_saved(const tg_op_ctx *ctx, const prog *pr, const tg_tensor *x0, engine *e,
                      tg_tensor **sv)
{
    *sv = NULL;
    if (!ctx->needs || !pr->nkeep) return true;
    int64_t shape[2] = {pr->nkeep, x0->numel};
    *sv = tg__tensor_empty(x0->dtype, 2, shape, x0->backend);
    e->saved = *sv ? tg__tensor_ptr(*sv) : NULL;
    return *sv != NULL;
}

/* Hands sv (if any) to the node; false (error recorded) when it cannot. */
static bool keep_saved(tg_op_ctx *ctx, tg_tensor *sv)
{
    if (!sv || tg_op_ctx_save(ctx, sv) >= 0) return true;
    tg__err(TG_ERR_INTERNAL, "'%s' could not keep its values for backward", ctx->op->name);
    return false;
}

static tg_tensor *fused_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    int nin = ctx->op->arity - 1;
    prog pr;
    if (decode(ctx->op, in[nin], nin, &pr)) return NULL;
    tg_tensor *y = tg_op_ctx_new_output(ctx);
    if (!y) return NULL;
    engine e;
    engine_init(&e, &pr, in[0], in);
    e.out = tg__tensor_ptr(y);
    tg_tensor *sv;
    if (!new_saved(ctx, &pr, in[0], &e, &sv) || !run(&e, false) || !keep_saved(ctx, sv)) {
        tg_tensor_release(sv);
        tg_tensor_release(y);
        return NULL;
    }
    tg_tensor_release(sv);
    return y;
}

/* ---- a fused sum: y = sum(f(x)), bitwise tg_sum(tg_fused_call(...)) */

/* A new tensor for the engine's result (x0's dtype, shape, backend) in
 * *full, which the engine writes; false (error recorded) if it cannot be
 * had. */
static bool write_result(engine *e, const tg_tensor *x0, tg_tensor **full)
{
    *full = tg__tensor_empty(x0->dtype, x0->ndim, x0->shape, x0->backend);
    e->out = *full ? tg__tensor_ptr(*full) : NULL;
    return *full != NULL;
}

TG_THREAD_LOCAL bool tg__fused_sum_reran;

/* The seed a recorded fused sum's forward makes its inputs' gradients for:
 * 1, a loss's, unless attrs.flag asks for attrs.scalar (replay's runs that
 * end in a mean: the mean's factor, tape/replay.c). */
static double sum_seed(const tg_op_attrs *a)
{
    return a && a->flag ? a->scalar : 1.0;
}

/* The forward writes no result where it can: on the cpu in f32 each part
 * sums its blocks' results in the exact pass (backend/cpu/reduce.c),
 * whose value, when it succeeds, is the bits tg_sum gives (every order of
 * the additions is exact). Where the values cannot be shown exact, the
 * result is computed once more, written this time, and summed as tg_sum
 * sums it (tg__fused_sum_reran); for f64 and the ref backend the first
 * pass writes it. */
static tg_tensor *fused_sum_fwd(tg_op_ctx *ctx, tg_tensor *const *in)
{
    int nin = ctx->op->arity - 1;
    prog pr;
    if (decode(ctx->op, in[nin], nin, &pr)) return NULL;
    tg_tensor *y = tg_op_ctx_new_output(ctx), *full = NULL, *g[TG_FUSED_MAX_INPUTS] = {NULL};
    if (!y) return NULL;
    engine e;
    engine_init(&e, &pr, in[0], in);
    bool ok = true;
    /* Recorded: the inputs' gradients for a seed of 1 (a loss's; or
     * sum_seed's), made with the forward block by block and kept instead of
     * the values the backward reads, where they are no more of them;
     * otherwise nothing is kept and the backward runs the forward again. */
    int ngrad = 0;
    for (int i = 0; i < nin; i++) ngrad += (ctx->needs >> i) & 1;
    if (ngrad && ngrad <= pr.nkeep) {
        engine_mode(&e, true);
        e.gy1 = sum_seed(ctx->attrs);
        for (int i = 0; ok && i < nin; i++) {
            if (!(ctx->needs & (1u << i))) continue;
            ok = (g[i] = tg__tensor_empty(in[i]->dtype, in[i]->ndim, in[i]->shape, e.be)) != NULL;
            e.gin[i] = ok ? tg__tensor_ptr(g[i]) : NULL;
        }
    }
    bool exact = ok && e.be == TG_BACKEND_CPU && e.dt == TG_F32;
    tg__exact_sum ex[TG_POOL_MAX_THREADS]; /* each part's, for the exact sum */
    bool exok[TG_POOL_MAX_THREADS];
    int parts = parts_of(&e);
    if (exact) {
        e.ex = ex;
        e.exok = exok;
        for (int p = 0; p < parts; p++) {
            tg__exact_sum_init(&ex[p]);
            exok[p] = true;
        }
    } else if (ok) {
        ok = write_result(&e, in[0], &full);
    }
    ok = ok && run(&e, false);
    for (int i = 0; ok && i < nin; i++) ok = keep_saved(ctx, g[i]);
    double v;
    if (ok && exact) {
        if (tg__exact_sum_parts(ex, exok, parts, e.numel, &v)) {
            *(float *)tg__tensor_ptr(y) = (float)v;
        } else { /* the result once more, written, and tg_sum's own sum of it */
            tg__fused_sum_reran = true;
            engine_init(&e, &pr, in[0], in);
            ok = write_result(&e, in[0], &full) && run(&e, false);
        }
    }
    if (ok && full) tg__run_sum_all(full, tg__tensor_ptr(y)); /* as tg_sum sums it */
    tg_tensor_release(full);
    for (int i = 0; i < nin; i++) tg_tensor_release(g[i]);
    if (!ok) {
        tg_tensor_release(y);
        return NULL;
    }
    return y;
}

/* ---- backward as recorded tg_* ops (create_graph) */
static tg_tensor *op_on(const step *s, tg_tensor *a, tg_tensor *b)
{
    tg_op_attrs at = {.scalar = s->p};
    if (s->b >= 0) return tg__call2(step_ops[s->code], a, b, NULL);
    if (s->map.two) {
        at.nints = 1;
        tg__attrs_put_f64(&at, 0, s->q);
    }
    return tg__call1(step_ops[s->code], a, &at);
}

/* *slot += c as the sweep would (c first, then recorded adds); false
 * when c or the add failed (the error recorded). */
static bool acc_on(tg_tensor **slot, tg_tensor *c)
{
    if (!c) return false;
    *slot = *slot ? tg_add(*slot, c) : c;
    return *slot != NULL;
}

static tg_status recorded_bwd(tg_op_ctx *ctx, const prog *pr, tg_tensor *const *in,
                              tg_tensor *gout, tg_tensor **gin)
{
    tg_tensor *ref[TG_FUSED_MAX_INPUTS + TG_FUSED_MAX_OPS];
    tg_tensor *g[TG_FUSED_MAX_INPUTS + TG_FUSED_MAX_OPS] = {NULL};
    int nref = pr->nin + pr->n;
    for (int i = 0; i < pr->nin; i++) ref[i] = in[i];
    for (int j = 0; j < pr->n; j++) {
        const step *s = &pr->s[j];
        ref[pr->nin + j] = op_on(s, ref[s->a], s->b >= 0 ? ref[s->b] : NULL);
        if (!ref[pr->nin + j]) return tg_last_error();
    }
    g[nref - 1] = gout;
    for (int j = pr->n - 1; j >= 0; j--) {
        const step *s = &pr->s[j];
        tg_tensor *gj = g[pr->nin + j], *a = ref[s->a];
        bool ok = true;
        if (!gj) continue;
        if (s->b < 0 && s->map.gkid) {
            tg_op_attrs at = {.scalar = s->p};
            if (s->map.two) {
                at.nints = 1;
                tg__attrs_put_f64(&at, 0, s->q);
            }
            ok = acc_on(&g[s->a], tg__call2(s->map.gop, s->map.from_output ? ref[pr->nin + j] : a,
                                            gj, &at));
        } else if (s->b < 0) {
            ok = acc_on(&g[s->a], s->map.op == &tg__op_add_scalar ? gj : op_on(s, gj, NULL));
        } else if (s->kid == TG_K_MUL) {
            ok = acc_on(&g[s->a], tg_mul(gj, ref[s->b])) && acc_on(&g[s->b], tg_mul(gj, a));
        } else {
            ok = acc_on(&g[s->a], gj) && acc_on(&g[s->b], s->kid == TG_K_SUB ? tg_neg(gj) : gj);
        }
        if (!ok) return tg_last_error();
    }
    for (int i = 0; i < pr->nin; i++) {
        if (!tg_op_ctx_needs_grad(ctx, i)) continue;
        if (!g[i]) {
            tg_spec sp;
            tg__spec_of(in[i], &sp);
            g[i] = tg__full(&sp, in[i]->backend, 0.0);
        }
        gin[i] = g[i];
        if (!gin[i]) return tg_last_error();
    }
    return TG_OK;
}

/* The value at t's data pointer (a float dtype), as a double. */
static double first_value(const tg_tensor *t)
{
    const void *p = tg__tensor_ptr(t);
    return t->dtype == TG_F32 ? *(const float *)p : *(const double *)p;
}

/* Whether g is one value broadcast (every stride 0 where a dim is not 1). */
static bool one_value_bcast(const tg_tensor *g)
{
    for (int d = 0; d < g->ndim; d++)
        if (g->strides[d] != 0 && g->shape[d] != 1) return false;
    return true;
}

/* A copy split across the pool as run() splits an engine's blocks, so
 * each thread copies what it wrote in the forward. */
typedef struct copy_job {
    const engine *e;
    char *dst;
    const char *src;
} copy_job;

static void copy_part(void *ctx, int part, int nparts)
{
    const copy_job *j = ctx;
    const engine *e = j->e;
    int64_t b0, b1;
    part_blocks(e, part, nparts, &b0, &b1);
    int64_t o0 = b0 * e->block, o1 = b1 * e->block < e->numel ? b1 * e->block : e->numel;
    if (o1 > o0) memcpy(j->dst + (size_t)o0 * e->es, j->src + (size_t)o0 * e->es,
                        (size_t)(o1 - o0) * e->es);
}

static void copy_split(const engine *e, void *dst, const void *src)
{
    copy_job j = {e, dst, src};
    int parts = e->numel ? parts_of(e) : 1;
    if (parts == 1)
        copy_part(&j, 0, 1);
    else
        tg__pool_run(copy_part, &j, parts);
}

/* A fused sum's backward (not recorded). Seeded with the seed its forward
 * made the gradients for (sum_seed: 1, a loss's), those are the answer;
 * with another seed, or where they are gone, the forward runs again block
 * by block, each block's backward seeded with it. */
static tg_status fused_sum_bwd(tg_op_ctx *ctx, const prog *pr, tg_tensor *const *in,
                               tg_tensor *gout, tg_tensor **gin)
{
    double g1 = first_value(gout);
    tg_tensor *made[TG_FUSED_MAX_INPUTS] = {NULL};
    bool have = g1 == sum_seed(ctx->attrs);
    for (int i = 0, k = 0; have && i < pr->nin; i++) {
        if (!tg_op_ctx_needs_grad(ctx, i)) continue;
        made[i] = tg_op_ctx_saved(ctx, k++);
        have = made[i] && made[i]->numel == in[i]->numel && made[i]->dtype == in[i]->dtype;
    }
    engine e;
    engine_init(&e, pr, in[0], in);
    engine_mode(&e, true);
    e.gy1 = g1;
    for (int i = 0; i < pr->nin; i++) {
        if (!tg_op_ctx_needs_grad(ctx, i)) continue;
        if (have && !(ctx->sink && ctx->sink[i])) { /* handed on whole */
            gin[i] = tg__scope_track(tg_tensor_retain(made[i]));
            continue;
        }
        gin[i] = tg_op_ctx_new_grad(ctx, i); /* a leaf's sink where one is offered */
        if (!gin[i]) return tg_last_error();
        if (have)
            copy_split(&e, tg__tensor_ptr(gin[i]), tg__tensor_ptr(made[i]));
        else
            e.gin[i] = tg__tensor_ptr(gin[i]);
    }
    return have || run(&e, false) ? TG_OK : tg_last_error();
}

static tg_status fused_bwd(tg_op_ctx *ctx, tg_tensor *gout, tg_tensor **gin)
{
    int nin = ctx->op->arity - 1;
    tg_tensor *in[TG_FUSED_MAX_INPUTS + 1];
    for (int i = 0; i <= nin; i++) in[i] = tg_op_ctx_input(ctx, i);
    prog pr;
    tg_status st = decode(ctx->op, in[nin], nin, &pr);
    if (st) return st;
    bool records = tg__records(gout);
    for (int i = 0; i < nin; i++) records = records || tg__records(in[i]);
    bool sum = ctx->op->shape == fused_sum_shape; /* gout: the sum's one value */
    if (records) {
        if (sum) { /* spread over the input's shape, as sum's backward spreads it */
            int64_t ones[TG_MAX_DIMS];
            for (int d = 0; d < in[0]->ndim; d++) ones[d] = 1;
            gout = tg_expand(tg_reshape(gout, in[0]->ndim, ones), in[0]->ndim, in[0]->shape);
            if (!gout) return tg_last_error();
        }
        return recorded_bwd(ctx, &pr, in, gout, gin);
    }
    if (sum) return fused_sum_bwd(ctx, &pr, in, gout, gin);
    engine e;
    engine_init(&e, &pr, in[0], in);
    if (pr.nkeep) {
        tg_tensor *sv = tg_op_ctx_saved(ctx, 0);
        if (!sv || sv->numel != (int64_t)pr.nkeep * in[0]->numel || sv->dtype != in[0]->dtype)
            return tg__err(TG_ERR_INTERNAL, "'%s': the values its forward kept are missing",
                           ctx->op->name);
        e.saved = tg__tensor_ptr(sv);
    }
    if (gout->contiguous) {
        e.gy = tg__tensor_ptr(gout);
    } else if (one_value_bcast(gout)) {
        e.gy1 = first_value(gout); /* one value, broadcast */
    } else {
        tg_tensor *c = tg_contiguous(gout);
        if (!c) return tg_last_error();
        e.gy = tg__tensor_ptr(c);
    }
    for (int i = 0; i < nin; i++) {
        if (!tg_op_ctx_needs_grad(ctx, i)) continue;
        gin[i] = tg_op_ctx_new_grad(ctx, i);
        if (!gin[i]) return tg_last_error();
        e.gin[i] = tg__tensor_ptr(gin[i]);
    }
    return run(&e, true) ? TG_OK : tg_last_error();
}

/* ---- compiling: fn on one-element inputs recorded on a private tape */
struct tg_fused {
    tg_tensor *prog[TG_BACKEND_COUNT]; /* the program, per backend it was called on */
    int nin, nsteps;
};

/* The step code of op, -1 if a step cannot be it. */
static int code_of(const tg_op *op)
{
    for (int c = 0; c < NCODES; c++)
        if (step_ops[c] == op) return c;
    return -1;
}

/* Step j's words: op (its code), operands a and b (-1: a map), and the
 * attributes a step reads (the scalar, and the second parameter of clamp
 * and softplus). */
static void step_words(int64_t *w, int j, int code, const tg_op_attrs *at, int a, int b)
{
    int64_t *sw = w + HEAD + STEP * j;
    sw[0] = code;
    sw[1] = a;
    sw[2] = b;
    sw[3] = bits_of(at->scalar);
    sw[4] = bits_of(at->nints > 0 ? tg__attrs_get_f64(at, 0) : 0.0);
}

/* Turns the record of probe[0..n) -> out into program words (w, HEAD +
 * STEP * TG_FUSED_MAX_OPS of them); the number of steps, or -1 with the
 * error recorded. Only the nodes out depends on become steps. */
static int compile_record(const tg_tape *tape, int n, tg_tensor *const *probe,
                          const tg_tensor *out, int64_t *w)
{
    if (!out->tape || out->tape != tape || out->is_leaf) {
        tg__err(TG_ERR_UNSUPPORTED, "bad argument #1 to 'fused_new' (the function returned %s, "
                                    "not a value it computed from its inputs)",
                out->is_leaf ? "one of its inputs" : "an untracked tensor");
        return -1;
    }
    int64_t last = out->node;
    bool *need = calloc((size_t)last + 1, sizeof *need);
    int *step_of = malloc(((size_t)last + 1) * sizeof *step_of);
    if (!need || !step_of) {
        free(need);
        free(step_of);
        tg__err(TG_ERR_NOMEM, "out of memory compiling a fused function");
        return -1;
    }
    need[last] = true;
    for (int64_t j = last; j >= 0; j--) {
        if (!need[j]) continue;
        const tg_node *nd = &tape->nodes[j];
        for (int i = 0; i < nd->nin; i++)
            if (nd->in_node[i] >= 0) need[nd->in_node[i]] = true;
    }
    int nsteps = 0;
    tg_status st = TG_OK;
    for (int64_t j = 0; j <= last && !st; j++) {
        if (!need[j]) continue;
        const tg_node *nd = &tape->nodes[j];
        int code = code_of(nd->op);
        if (code < 0) {
            st = tg__err(TG_ERR_UNSUPPORTED, "bad argument #1 to 'fused_new' (the function applies "
                                             "'%s', which a fused function cannot run: it runs "
                                             "the unary maps and add, sub and mul of two values "
                                             "of the call's shape)", nd->op->name);
            break;
        }
        if (nsteps == TG_FUSED_MAX_OPS) {
            st = tg__err(TG_ERR_INVALID, "bad argument #1 to 'fused_new' (more than %d ops)",
                         TG_FUSED_MAX_OPS);
            break;
        }
        int ref[2] = {-1, -1};
        for (int i = 0; i < nd->nin && !st; i++) {
            if (nd->in_node[i] >= 0) {
                ref[i] = n + step_of[nd->in_node[i]];
            } else {
                for (int k = 0; k < n; k++)
                    if (nd->in_slot[i] >= 0 && probe[k]->slot == nd->in_slot[i]) ref[i] = k;
            }
            if (ref[i] < 0)
                st = tg__err(TG_ERR_UNSUPPORTED, "bad argument #1 to 'fused_new' ('%s' reads a "
                                                 "tensor that is not one of the function's "
                                                 "inputs; constants go in as the scalars of "
                                                 "add_scalar and mul_scalar)", nd->op->name);
        }
        step_words(w, nsteps, code, tg__node_attrs(tape, nd), ref[0], ref[1]);
        step_of[j] = nsteps++;
    }
    free(need);
    free(step_of);
    if (st) return -1;
    w[0] = PROG_MAGIC;
    w[1] = n;
    w[2] = nsteps;
    return nsteps;
}

tg_fused *tg_fused_new(tg_fused_fn fn, void *userdata, int n)
{
    if (!fn) {
        tg__err(TG_ERR_NULL, "bad argument #1 to 'fused_new' (NULL function)");
        return NULL;
    }
    if (n < 1 || n > TG_FUSED_MAX_INPUTS) {
        tg__err(TG_ERR_INVALID, "bad argument #3 to 'fused_new' (%d inputs; need 1..%d)", n,
                TG_FUSED_MAX_INPUTS);
        return NULL;
    }
    tg__registry_ready();
    tg_fused *f = calloc(1, sizeof *f);
    int64_t *w = malloc((HEAD + STEP * TG_FUSED_MAX_OPS) * sizeof *w);
    tg_tape *tape = f && w ? tg_tape_new(NULL) : NULL;
    if (!tape) {
        free(f);
        free(w);
        if (!tg_last_error()) tg__err(TG_ERR_NOMEM, "out of memory for a fused function");
        return NULL;
    }
    bool prev = tg_grad_set_enabled(true);
    tg_error_clear();
    tg_scope_begin();
    tg_tensor *probe[TG_FUSED_MAX_INPUTS];
    int nsteps = -1;
    tg_status st = TG_OK;
    for (int k = 0; k < n && !st; k++) {
        probe[k] = tg_full(TG_F64, 1, (int64_t[]){1}, 0.5);
        st = probe[k] ? tg_requires_grad(tape, probe[k]) : tg_last_error();
    }
    tg_tensor *out = st ? NULL : fn(userdata, n, probe);
    if (!st && !out && !tg_last_error())
        tg__err(TG_ERR_INVALID, "bad argument #1 to 'fused_new' (the function returned NULL "
                                "without an error)");
    if (out) nsteps = compile_record(tape, n, probe, out, w);
    tg_scope_end();
    tg_grad_set_enabled(prev);
    tg_tape_free(tape);
    int64_t len = HEAD + STEP * (int64_t)(nsteps > 0 ? nsteps : 0);
    tg_tensor *prog = nsteps > 0 ? tg__tensor_empty(TG_I64, 1, &len, TG_BACKEND_CPU) : NULL;
    if (nsteps > 0 && !prog) tg__err(TG_ERR_NOMEM, "out of memory for a fused program");
    if (!prog) {
        free(w);
        free(f);
        return NULL;
    }
    memcpy(tg__tensor_ptr(prog), w, (size_t)len * sizeof *w);
    free(w);
    f->prog[TG_BACKEND_CPU] = prog;
    for (int b = 0; b < TG_BACKEND_COUNT; b++) { /* a copy on every backend */
        if (f->prog[b]) continue;
        f->prog[b] = tg__tensor_empty(TG_I64, 1, &len, (tg_backend)b);
        if (!f->prog[b]) {
            tg_fused_free(f);
            return NULL;
        }
        memcpy(tg__tensor_ptr(f->prog[b]), tg__tensor_ptr(prog), (size_t)len * sizeof(int64_t));
    }
    f->nin = n;
    f->nsteps = nsteps;
    return f;
}

/* A header of its own on f's program for backend be: tensor refcounts
 * are per thread, and a tg_fused is shared (nothing in it changes after
 * tg_fused_new), so every call gives its node a new header on the shared
 * storage. */
static tg_tensor *prog_on(const tg_fused *f, tg_backend be)
{
    const tg_tensor *p = f->prog[be];
    return tg__tensor_view(p, p->ndim, p->shape, p->strides, 0);
}

extern const tg_op tg__op_fused_pointwise_1, tg__op_fused_pointwise_2, tg__op_fused_pointwise_3,
    tg__op_fused_sum_1, tg__op_fused_sum_2, tg__op_fused_sum_3;
static const tg_op *const fused_ops[TG_FUSED_MAX_INPUTS] = {
    &tg__op_fused_pointwise_1, &tg__op_fused_pointwise_2, &tg__op_fused_pointwise_3};
static const tg_op *const sum_ops[TG_FUSED_MAX_INPUTS] = {
    &tg__op_fused_sum_1, &tg__op_fused_sum_2, &tg__op_fused_sum_3};

const tg_op *tg__fused_op(int nin, bool sum)
{
    unsigned k = (unsigned)nin - 1u;
    if (k >= (unsigned)TG_FUSED_MAX_INPUTS) return NULL;
    return sum ? sum_ops[k] : fused_ops[k];
}

/* f on in[0..n) through ops[n - 1]; name: the API function's, for errors. */
static tg_tensor *call(const tg_fused *f, int n, tg_tensor *const *in,
                       const tg_op *const *ops, const char *name)
{
    if (!f) {
        tg__err_null(name, 1);
        return NULL;
    }
    if (n != f->nin) {
        tg__err(TG_ERR_INVALID, "bad argument #2 to '%s' (%d inputs; the function was "
                                "compiled for %d)", name, n, f->nin);
        return NULL;
    }
    if (!in) {
        tg__err_null(name, 3);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!in[i]) {
            tg__err_null(name, 3);
            return NULL;
        }
    tg_tensor *args[TG_FUSED_MAX_INPUTS + 1];
    for (int i = 0; i < n; i++) args[i] = in[i];
    args[n] = prog_on(f, in[0]->backend);
    if (!args[n]) return NULL;
    tg_tensor *y = tg_op_call(ops[n - 1], n + 1, args, NULL);
    tg_tensor_release(args[n]);
    return y;
}

tg_tensor *tg_fused_call(const tg_fused *f, int n, tg_tensor *const *in)
{
    return call(f, n, in, fused_ops, "fused_call");
}

tg_tensor *tg_fused_sum(const tg_fused *f, int n, tg_tensor *const *in)
{
    return call(f, n, in, sum_ops, "fused_sum");
}

int tg_fused_ops(const tg_fused *f)
{
    return f ? f->nsteps : 0;
}

void tg_fused_free(tg_fused *f)
{
    if (!f) return;
    for (int b = 0; b < TG_BACKEND_COUNT; b++) tg_tensor_release(f->prog[b]);
    free(f);
}

/* ---- programs from replay (ops/fused_plan.h) */
bool tg__fused_can_step(const tg_op *op)
{
    return code_of(op) >= 0;
}

int tg__fused_reduces_all(const tg_op *op, const tg_op_attrs *a)
{
    extern const tg_op tg__op_sum, tg__op_mean;
    if (a->nints != 0) return 0;
    return op == &tg__op_sum ? 1 : op == &tg__op_mean ? 2 : 0;
}

const tg_op *tg__fused_mean_factor(tg_dtype dt, tg_backend be, int64_t n, double *scale,
                                   double *seed)
{
    extern const tg_op tg__op_mul_scalar;
    *scale = n ? 1.0 / (double)n : 0.0; /* as mean's forward and backward scale */
    /* mean's backward seeds the sum with mul_scalar(g, scale): for g = 1,
     * what the kernel makes of it in dt */
    double one[1] = {1.0}, out[1];
    float onef[1] = {1.0f}, outf[1];
    tg_unary_fn k = (tg_unary_fn)tg__kernel(TG_K_MUL_SCALAR, be, dt);
    if (dt == TG_F32) {
        k(1, onef, outf, *scale);
        *seed = outf[0];
    } else {
        k(1, one, out, *scale);
        *seed = out[0];
    }
    return &tg__op_mul_scalar;
}

tg_tensor *tg__fused_program(int nin, int n, const tg_op *const *op,
                             const tg_op_attrs *const *attrs, const int *a, const int *b,
                             tg_backend be)
{
    if (nin < 1 || nin > TG_FUSED_MAX_INPUTS || n < 1 || n > TG_FUSED_MAX_OPS) {
        tg__err(TG_ERR_INVALID, "fused program: %d inputs and %d steps", nin, n);
        return NULL;
    }
    int64_t len = HEAD + STEP * (int64_t)n;
    tg_tensor *t = tg__tensor_empty(TG_I64, 1, &len, be);
    if (!t) return NULL;
    int64_t *w = tg__tensor_ptr(t);
    w[0] = PROG_MAGIC;
    w[1] = nin;
    w[2] = n;
    for (int j = 0; j < n; j++) step_words(w, j, code_of(op[j]), attrs[j], a[j], b[j]);
    prog pr; /* the words as a call will check them */
    if (decode(tg__fused_op(nin, false), t, nin, &pr)) {
        tg_tensor_release(t);
        return NULL;
    }
    return t;
}

/* ---- gradcheck cases: one function per arity, on f64 inputs in [-1, 1) */
static tg_tensor *sample_fn(void *ud, int n, tg_tensor *const *in)
{
    (void)ud;
    tg_tensor *x = in[0];
    if (n == 1) return tg_mul(tg_tanh(tg_add_scalar(tg_mul(x, x), 1.0)), tg_sigmoid(x));
    tg_tensor *y = in[1];
    if (n == 2)
        return tg_sub(tg_mul(tg_exp(tg_mul_scalar(x, -0.5)), y), tg_tanh(tg_add(x, tg_neg(y))));
    return tg_add(tg_mul(tg_softplus(x, 1.5, 20.0), in[2]), tg_mul(tg_sin(y), y));
}

static int fused_sample(int nin, int k, tg_rng *rng, tg_tensor **in)
{
    static const struct { int nd; int64_t s[2]; } cases[] = {{1, {7}}, {2, {3, 4}}};
    if (k >= 2) return 0;
    for (int i = 0; i < nin; i++) {
        in[i] = tg__sample_uniform(rng, cases[k].nd, cases[k].s, -1.0, 1.0);
        if (!in[i]) return -1;
    }
    tg_fused *f = tg_fused_new(sample_fn, NULL, nin);
    if (!f) return -1;
    in[nin] = tg__scope_track(prog_on(f, tg_default_backend()));
    tg_fused_free(f);
    return in[nin] ? nin + 1 : -1;
}

#define FUSED_OP(N, math)                                                                 \
    static int fused_sample_##N(int k, tg_rng *rng, tg_tensor **in, tg_op_attrs *a)       \
    {                                                                                     \
        (void)a;                                                                          \
        return fused_sample(N, k, rng, in);                                               \
    }                                                                                     \
    const tg_op tg__op_fused_pointwise_##N = {                                            \
        .name = "fused_pointwise_" #N,                                                    \
        .doc = math ", f a chain of pointwise ops compiled by tg_fused_new (the last "    \
               "input: its program)",                                                     \
        .arity = N + 1, .shape = fused_shape, .forward = fused_fwd, .backward = fused_bwd, \
        .cost = TG_COST_MEMORY_BOUND, .saves = (1u << (N + 1)) - 1, .sample = fused_sample_##N, \
    };

FUSED_OP(1, "y = f(x)")
FUSED_OP(2, "y = f(x1, x2)")
FUSED_OP(3, "y = f(x1, x2, x3)")

#define FUSED_SUM_OP(N, math)                                                             \
    const tg_op tg__op_fused_sum_##N = {                                                  \
        .name = "fused_sum_" #N,                                                          \
        .doc = math ", the sum over every element of a fused function's result, not "    \
               "written (the last input: its program); recorded, the forward makes the "  \
               "gradients for a seed of 1, or of attrs.scalar where attrs.flag is set",   \
        .arity = N + 1, .shape = fused_sum_shape, .forward = fused_sum_fwd,               \
        .backward = fused_bwd, .cost = TG_COST_MEMORY_BOUND, .saves = (1u << (N + 1)) - 1, \
        .sample = fused_sample_##N,                                                       \
    };

FUSED_SUM_OP(1, "y = sum(f(x))")
FUSED_SUM_OP(2, "y = sum(f(x1, x2))")
FUSED_SUM_OP(3, "y = sum(f(x1, x2, x3))")
