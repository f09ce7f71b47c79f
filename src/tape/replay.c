/* Replay: run a recorded forward again on new input values without the
 * user's code, the dispatcher's checks or new tensors.
 *
 * A tape made with opts.replay keeps, besides its nodes, a program: every
 * op call of the forward in order (op, attributes, the input tensors and
 * the output tensor, retained), including the calls it does not record as
 * nodes because they have no gradient (comparisons, argmax) but that a
 * new input changes. tg_tape_replay copies the new values into the input
 * tensors, drops the record (a new generation, as tg_tape_reset) and walks
 * the program: each op's forward runs on the same input tensors and
 * writes into the same output tensor (tg_op_ctx_new_output hands it out),
 * and the node is recorded again by the same function dispatch records
 * with. So the record that backward sweeps is the one a second run of the
 * user's code would have made (same values, same saves, the same checkpoint
 * choices and segments), and its gradients are bitwise the same; what is
 * skipped is the user's code, validation, the shape rules and allocation.
 *
 * The program holds every tensor of the forward for the tape's lifetime:
 * memory is that of the NONE policy's forward whatever the policy (the
 * policy still decides what the nodes save and what backward recomputes).
 * Inputs are tensors marked with tg_tape_input: tracked (ops on them are
 * recorded) but never given a gradient. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch/dispatch.h"
#include "ops/fused_plan.h"
#include "tape/tape_internal.h"

enum { STEP_OP, STEP_BEGIN, STEP_END };

typedef struct tg__replay_op {
    int kind;
    const tg_op *op;
    tg_op_attrs attrs;
    int nin;
    tg_tensor *in[TG_OP_MAX_INPUTS]; /* retained */
    tg_tensor *out;                  /* retained */
    tg_spec out_spec;
    bool tracked[TG_OP_MAX_INPUTS];
    bool record;  /* recorded as a node (else re-run only) */
    bool view;    /* out shares an input's storage: forward makes a view */
    int32_t label;
    int32_t group; /* 1 + the index of the fused run this step starts; 0: none */
} tg__replay_op;

typedef struct tg__replay_site {
    uint8_t step, arg, mid;
} tg__replay_site;

/* A run of program steps k0..k1 that a replay may run as one fused call
 * (call: the fused op on the run's inputs and program, into the run's
 * last result). */
typedef struct tg__replay_group {
    int64_t k0, k1;
    tg__replay_op call;
    int32_t refs[TG_FUSED_MAX_OPS]; /* steps k0..k1-1: the program's references to each result */
    /* Where the run's calls read a middle result: step k0 + step, its
     * input arg, the result of step k0 + mid. */
    tg__replay_site site[2 * (TG_FUSED_MAX_OPS + 1)];
    int nsites;
    /* The program let go of the middle results after a fused run (nothing
     * could read them); group_restore makes them again where a replay
     * must run the calls one by one. */
    bool dropped;
    /* A run that ends in a mean: call makes the sum (its forward the
     * gradients for the mean's seed) into a value of its own, and post
     * applies the mean's factor into the mean's result. */
    bool mean;
    tg__replay_op post;
    bool reduce; /* the run ends in a sum or mean: call is a fused sum */
} tg__replay_group;

static tg__replay_op *prog_push(tg_tape *tape)
{
    if (tg__tape_grow((void **)&tape->prog, &tape->capprog, tape->nprog + 1, sizeof *tape->prog,
                      "the tape's replay program"))
        return NULL;
    tg__replay_op *e = &tape->prog[tape->nprog++];
    memset(e, 0, sizeof *e);
    e->label = tape->cur_label;
    return e;
}

tg_status tg__replay_capture(tg_tape *tape, const tg_op *op, const tg_op_attrs *attrs, int nin,
                             tg_tensor *const *in, const bool *tracked, tg_tensor *out,
                             bool record)
{
    tg__replay_op *e = prog_push(tape);
    if (!e) return TG_ERR_NOMEM;
    e->kind = STEP_OP;
    e->op = op;
    e->attrs = *attrs;
    e->nin = nin;
    e->record = record;
    for (int i = 0; i < nin; i++) {
        e->in[i] = tg_tensor_retain(in[i]);
        e->tracked[i] = tracked[i];
        if (in[i]->storage == out->storage) e->view = true;
    }
    e->out = tg_tensor_retain(out);
    tg__spec_of(out, &e->out_spec);
    return TG_OK;
}

tg_status tg__replay_mark(tg_tape *tape, bool begin)
{
    tg__replay_op *e = prog_push(tape);
    if (!e) return TG_ERR_NOMEM;
    e->kind = begin ? STEP_BEGIN : STEP_END;
    tape->prog_marks = true;
    return TG_OK;
}

tg_tape *tg__replay_tape_of(int n, tg_tensor *const *in)
{
    for (int i = 0; i < n; i++) {
        tg_tape *t = in[i]->tape;
        if (t && tg__replay_capturing(t) && tg__tensor_live(in[i])) return t;
    }
    return NULL;
}

static void call_free(tg__replay_op *c)
{
    for (int i = 0; i < c->nin; i++) tg_tensor_release(c->in[i]);
    tg_tensor_release(c->out);
}

static void groups_free(tg_tape *tape)
{
    for (int64_t g = 0; g < tape->ngroups; g++) {
        call_free(&tape->groups[g].call);
        if (tape->groups[g].mean) call_free(&tape->groups[g].post);
    }
    for (int64_t k = 0; k < tape->nprog; k++) tape->prog[k].group = 0;
    free(tape->groups);
    tape->groups = NULL;
    tape->ngroups = tape->planned_nprog = 0;
}

void tg__replay_free(tg_tape *tape)
{
    for (int64_t k = 0; k < tape->nprog; k++) {
        tg__replay_op *e = &tape->prog[k];
        if (e->kind != STEP_OP) continue;
        for (int i = 0; i < e->nin; i++) tg_tensor_release(e->in[i]);
        tg_tensor_release(e->out);
    }
    free(tape->prog);
    tape->prog = NULL;
    tape->nprog = tape->capprog = 0;
    groups_free(tape);
    free(tape->no_reduce);
    tape->no_reduce = NULL;
    tape->nno_reduce = 0;
    tape->prog_marks = tape->replay_armed = false;
}

tg_status tg_tape_input(tg_tape *tape, tg_tensor *t)
{
    if (!tape) return tg__err(TG_ERR_NULL, "bad argument #1 to 'tape_input' (NULL tape)");
    if (!t) return tg__err_null("tape_input", 2);
    if (tape->dead)
        return tg__err(TG_ERR_STALE, "bad argument #1 to 'tape_input' (tape was freed)");
    if (!tape->opts.replay)
        return tg__err(TG_ERR_INVALID, "bad argument #1 to 'tape_input' (the tape was made "
                                       "without opts.replay)");
    if (t->tape && !t->is_leaf && tg__tensor_live(t))
        return tg__err(TG_ERR_INVALID, "bad argument #2 to 'tape_input' (tensor is the result "
                                       "of a recorded op; tg_detach it first)");
    if (t->is_leaf && t->tape && !t->tape->dead) {
        if (t->tape != tape)
            return tg__err(TG_ERR_TAPE, "bad argument #2 to 'tape_input' (already a leaf of "
                                        "another tape)");
        if (!t->nograd)
            return tg__err(TG_ERR_INVALID, "bad argument #2 to 'tape_input' (already requires "
                                           "grad on this tape)");
        return TG_OK;
    }
    if (!t->contiguous)
        return tg__err(TG_ERR_INVALID, "bad argument #2 to 'tape_input' (a strided view; "
                                       "replay writes new values into the input: pass a "
                                       "contiguous tensor)");
    tg__tape_adopt_leaf(tape, t, true);
    return TG_OK;
}

/* Writes src's elements into dst, contiguous, of src's dtype and shape. */
static tg_status copy_elems(tg_tensor *dst, const tg_tensor *src)
{
    return tg_tensor_copy_out(src, tg__tensor_ptr(dst),
                              (size_t)dst->numel * tg_dtype_size(dst->dtype));
}

static tg_status check_values(tg_tape *tape, int n, tg_tensor *const *inputs,
                              tg_tensor *const *values)
{
    char a[96], b[96];
    for (int k = 0; k < n; k++) {
        tg_tensor *x = inputs[k], *v = values ? values[k] : NULL;
        if (!x)
            return tg__err(TG_ERR_NULL, "bad argument #3 to 'tape_replay' (input %d is NULL)", k);
        if (x->tape != tape || !x->is_leaf || !x->nograd)
            return tg__err(TG_ERR_INVALID, "bad argument #3 to 'tape_replay' (input %d was not "
                                           "marked with tg_tape_input on this tape)", k);
        if (!values) continue;
        if (!v)
            return tg__err(TG_ERR_NULL, "bad argument #4 to 'tape_replay' (value %d is NULL)", k);
        if (v->dtype != x->dtype)
            return tg__err(TG_ERR_DTYPE, "bad argument #4 to 'tape_replay' (value %d is %s; input "
                                         "%d was recorded as %s)", k, tg_dtype_name(v->dtype), k,
                           tg_dtype_name(x->dtype));
        if (!tg__same_shape(v->ndim, v->shape, x->ndim, x->shape))
            return tg__err(TG_ERR_SHAPE, "bad argument #4 to 'tape_replay' (value %d has shape "
                                         "%s; input %d was recorded with %s: a new shape needs "
                                         "a new record)", k, tg_shape_str(v->ndim, v->shape, a,
                                                                          sizeof a), k,
                           tg_shape_str(x->ndim, x->shape, b, sizeof b));
        if (v->backend != x->backend)
            return tg__err(TG_ERR_DEVICE, "bad argument #4 to 'tape_replay' (value %d is on "
                                          "backend '%s', input %d on '%s')", k,
                           tg_backend_name(v->backend), k, tg_backend_name(x->backend));
    }
    return TG_OK;
}

/* Node n, made by recording out = n->op(in) under the NONE policy outside
 * any segment, in this generation, with no pack hooks, gets back what that
 * record gave it (the saves from seen, the extras, the borrowed leaves,
 * the versions) after a replay wrote new values into the same tensors: what
 * tg__tape_record does for a plain NONE node, on the node it made. Its
 * saves must have been released. Takes the extras. TG_ERR_NOMEM (recorded)
 * when the extras' array cannot be had: then n keeps nothing and stays
 * consumed. */
static tg_status node_rearm(tg_tape *tape, tg_node *n, tg_tensor *const *in, tg_tensor *const *seen,
                            const bool *tracked, tg_tensor *out, tg_tensor **extra, int nextra)
{
    if (nextra > 0) {
        if (!(n->extra = malloc((size_t)nextra * sizeof *n->extra))) {
            for (int i = 0; i < nextra; i++) tg_tensor_release(extra[i]);
            return tg__err(TG_ERR_NOMEM, "out of memory for a node's kept tensors");
        }
        for (int i = 0; i < nextra; i++) {
            n->extra[i] = extra[i];
            tg__tape_charge(tape, n, tg__kept_bytes(extra[i]));
        }
        n->nextra = (uint8_t)nextra;
    }
    unsigned saves = n->op->saves;
    for (int i = 0; i < n->nin; i++) {
        n->in_saved[i] = (saves & TG_SAVE_INPUT(i)) ? tg_tensor_retain(seen[i]) : NULL;
        tg__tape_charge(tape, n, tg__kept_bytes(n->in_saved[i]));
        n->in_val[i] = (!n->in_saved[i] && tracked[i] && in[i]->is_leaf) ? in[i] : NULL;
    }
    n->out_saved = (saves & TG_SAVE_OUTPUT) ? tg_tensor_retain(out) : NULL;
    tg__tape_charge(tape, n, tg__tensor_bytes(n->out_saved));
    tg__node_stamp_versions(n, in, tracked, out);
    if (n->consumed) tape->nconsumed--;
    n->consumed = false;
    return TG_OK;
}

/* Runs step e: its forward into e->out, then its node as dispatch records
 * it, or (rearm: the index of the next node of the kept record) the node
 * the last replay recorded for it, given back its saves. */
static tg_status run_step(tg_tape *tape, tg__replay_op *e, int64_t *rearm)
{
    if (e->kind == STEP_BEGIN) return tg_checkpoint_begin(tape);
    if (e->kind == STEP_END) return tg_checkpoint_end(tape);
    const tg_op *op = e->op;
    int n = e->nin;
    tg_spec in_spec[TG_OP_MAX_INPUTS];
    tg_tensor *args[TG_OP_MAX_INPUTS];
    unsigned copied, needs = 0;
    for (int i = 0; i < n; i++) {
        tg_tensor *t = e->in[i];
        if (e->tracked[i] && !tg__tensor_live(t))
            return tg__err(TG_ERR_STALE, "tape_replay: input #%d of '%s' was not recorded again "
                                         "(made outside the recorded forward?)", i + 1, op->name);
        if (e->tracked[i] && !t->nograd) needs |= 1u << i;
        tg__spec_of(t, &in_spec[i]);
    }
    tg_status st = tg__op_args(op, n, e->in, args, &copied);
    if (st) return st;
    tg_tensor *extra[TG_OP_MAX_EXTRA] = {0};
    int nextra = 0;
    tg_op_ctx ctx = tg__op_ctx(op, &e->attrs, n, args, in_spec, NULL, &e->out_spec,
                               n ? e->in[0]->backend : tg_default_backend(), needs, extra,
                               &nextra, true);
    ctx.reuse = e->view ? NULL : e->out;
    bool prev_off = tg__grad_disabled;
    tg__grad_disabled = true;
    tg__in_op++;
    tg_tensor *y = op->forward(&ctx, args);
    tg__in_op--;
    tg__grad_disabled = prev_off;
    if (!y) {
        st = tg_last_error() ? tg_last_error() : TG_ERR_INTERNAL;
        goto drop;
    }
    if (y != e->out) {
        /* The forward made its output another way: a view of an input
         * (the same storage as the recorded view, already holding the new
         * values), or a new tensor whose values go into the recorded one. */
        if (e->view ? y->storage != e->out->storage
                    : (!ctx.reuse || !e->out->contiguous ||
                       !tg__same_shape(y->ndim, y->shape, e->out->ndim, e->out->shape) ||
                       y->dtype != e->out->dtype)) {
            tg_tensor_release(y);
            st = tg__err(TG_ERR_INTERNAL, "tape_replay: the forward of '%s' did not make its "
                                          "output as it did when recorded", op->name);
            goto drop;
        }
        if (!e->view) st = copy_elems(e->out, y);
    }
    tg_tensor_release(y);
    if (st) goto drop;
    if (tape->opts.anomaly && e->record && (st = tg__anomaly_forward(tape, op, n, e->in, e->out)))
        goto drop;
    if (e->record && rearm) {
        st = node_rearm(tape, &tape->nodes[(*rearm)++], e->in, args, e->tracked, e->out, extra,
                            nextra);
        nextra = 0; /* taken, kept or released */
    } else if (e->record) {
        /* The output's old record holds a reference to the tape; the new
         * one takes its own. */
        if (e->out->tape) {
            tg__tape_unref(e->out->tape);
            e->out->tape = NULL;
        }
        tape->cur_label = e->label;
        st = tg__tape_record(tape, op, &e->attrs, n, e->in, args, e->tracked, e->out, extra,
                             nextra);
        if (st == TG_OK) nextra = 0; /* the node owns them */
    }
drop:
    for (int i = 0; i < nextra; i++) tg_tensor_release(extra[i]);
    tg__op_args_release(n, args, copied);
    return st;
}

/* ---- Fused runs.
 *
 * A run of consecutive program calls of pointwise ops (the steps a fused
 * function may hold: ops/fused_plan.h) over one large shape, whose results
 * but the last one are read inside the run and nowhere else (so every call
 * reaches the last one), can run as one fused call (fused.c): block by
 * block in cache, writing only the last result and what the backward
 * reads. A run may end with a sum of every element of
 * its last result, which then runs as tg_fused_sum (the sum's gradient made
 * with the forward). The call's node stands for the run's nodes, and its
 * result and gradients are theirs bit for bit where each input's gradient
 * comes from one place (fused.c): so an input read twice inside a run (x *
 * x, or x in two calls) is read nowhere outside it, else the run is not
 * fused (the sweep would add the outside contribution between the inside
 * ones).
 *
 * A run's middle results are the program's alone when nothing else holds
 * them: each replay checks their reference counts (what the program holds,
 * no scope, no view) before it fuses, and runs the calls one by one where
 * the user kept one. Only where the record is plain (no segments, hooks or
 * anomaly mode), under NONE or BALANCED, and not turned off
 * (opts.replay_unfused). The plan is made at the first replay and again
 * when the program grows.
 *
 * After a run's first fused replay nothing can read its middle results,
 * so the program lets go of them (group_drop); a replay that must run the
 * calls one by one, or plan again, makes them anew (group_restore). */
#define FUSE_MIN_ELEMS 4096 /* below this, a call's own cost is the larger part */

/* The program's reads of one tensor a fusable call reads or makes. */
typedef struct use {
    const tg_tensor *t;
    int64_t reads; /* operand places that read it, in the whole program */
} use;

typedef struct use_map {
    use *v;
    size_t mask;
} use_map;

static use *use_at(use_map *m, const tg_tensor *t, bool add)
{
    uint64_t h = (uint64_t)(uintptr_t)t * UINT64_C(0x9E3779B97F4A7C15);
    size_t i = (size_t)(h >> 24) & m->mask;
    while (m->v[i].t) {
        if (m->v[i].t == t) return &m->v[i];
        i = (i + 1) & m->mask;
    }
    if (!add) return NULL;
    m->v[i] = (use){.t = t, .reads = 0};
    return &m->v[i];
}

/* Whether call e may be a step of a fused run: a pointwise op on float
 * operands of its result's shape, contiguous, large enough. */
static bool fusable(const tg__replay_op *e)
{
    if (e->kind != STEP_OP || e->view || !tg__fused_can_step(e->op)) return false;
    const tg_tensor *o = e->out;
    if (!o->contiguous || (o->dtype != TG_F32 && o->dtype != TG_F64) ||
        o->numel < FUSE_MIN_ELEMS)
        return false;
    for (int i = 0; i < e->nin; i++) {
        const tg_tensor *x = e->in[i];
        if (!x->contiguous || x->dtype != o->dtype || x->backend != o->backend ||
            !tg__same_shape(x->ndim, x->shape, o->ndim, o->shape))
            return false;
    }
    return true;
}

/* Whether call e may follow fusable call p in a run: same shape, dtype,
 * backend and recording. */
static bool joins(const tg__replay_op *p, const tg__replay_op *e)
{
    const tg_tensor *a = p->out, *b = e->out;
    return fusable(e) && e->record == p->record && a->dtype == b->dtype &&
           a->backend == b->backend && tg__same_shape(a->ndim, a->shape, b->ndim, b->shape);
}

/* Whether call e sums (or averages) every element of p's result (a run's
 * last call). */
static bool reduces(const tg__replay_op *p, const tg__replay_op *e)
{
    return e->kind == STEP_OP && e->nin == 1 && e->in[0] == p->out && e->record == p->record &&
           tg__fused_reduces_all(e->op, &e->attrs) > 0;
}

/* Makes group g of calls s..t (t the result, maybe a sum) if they may run
 * fused; false otherwise, and on an error (then cleared: the calls run one
 * by one). */
static bool group_make(tg_tape *tape, use_map *m, int64_t s, int64_t t, tg__replay_group *g)
{
    const tg__replay_op *P = tape->prog;
    bool sum = t > s && !fusable(&P[t]);
    int nsteps = (int)(t - s + 1) - sum;
    if (t - s + 1 < 2 || nsteps > TG_FUSED_MAX_OPS) return false;
    tg_tensor *in[TG_FUSED_MAX_INPUTS];
    bool tracked[TG_FUSED_MAX_INPUTS];
    int64_t inside[TG_FUSED_MAX_INPUTS] = {0};
    int nin = 0, a[TG_FUSED_MAX_OPS], b[TG_FUSED_MAX_OPS];
    const tg_op *op[TG_FUSED_MAX_OPS];
    const tg_op_attrs *at[TG_FUSED_MAX_OPS];
    tg__replay_site site[2 * (TG_FUSED_MAX_OPS + 1)];
    int nsites = 0, reads_in[TG_FUSED_MAX_OPS] = {0}; /* reads of each middle result */
    for (int j = 0; j < nsteps; j++) {
        const tg__replay_op *e = &P[s + j];
        op[j] = e->op;
        at[j] = &e->attrs;
        b[j] = -1;
        for (int i = 0; i < e->nin; i++) {
            int ref = -1; /* an earlier step's result: MAX_INPUTS + its index, for now */
            for (int k = j - 1; k >= 0 && ref < 0; k--)
                if (P[s + k].out == e->in[i]) {
                    ref = TG_FUSED_MAX_INPUTS + k;
                    site[nsites++] = (tg__replay_site){(uint8_t)j, (uint8_t)i, (uint8_t)k};
                    reads_in[k]++;
                }
            if (ref < 0) {
                for (int q = 0; q < nin && ref < 0; q++)
                    if (in[q] == e->in[i]) ref = q;
                if (ref < 0) {
                    if (nin == TG_FUSED_MAX_INPUTS) return false;
                    in[nin] = e->in[i];
                    tracked[nin] = e->tracked[i];
                    ref = nin++;
                }
                inside[ref]++;
            }
            *(i ? &b[j] : &a[j]) = ref;
        }
    }
    if (sum) { /* the sum or mean reads the last step's result */
        site[nsites++] = (tg__replay_site){(uint8_t)nsteps, 0, (uint8_t)(nsteps - 1)};
        reads_in[nsteps - 1]++;
    }
    /* Middle results: read inside, and nowhere else (a value nothing reads
     * would make its inputs zero gradients where the sweep, never reaching
     * them from it, makes none). */
    for (int64_t k = 0; k < t - s; k++)
        if (!reads_in[k] || use_at(m, P[s + k].out, false)->reads != reads_in[k]) return false;
    /* An input read twice inside and also outside would get the outside
     * gradient between the inside ones, unfused. */
    for (int q = 0; q < nin; q++)
        if (tracked[q] && !in[q]->nograd && inside[q] > 1 &&
            use_at(m, in[q], false)->reads > inside[q])
            return false;
    for (int j = 0; j < nsteps; j++) { /* step refs after the inputs */
        if (a[j] >= TG_FUSED_MAX_INPUTS) a[j] = a[j] - TG_FUSED_MAX_INPUTS + nin;
        if (b[j] >= TG_FUSED_MAX_INPUTS) b[j] = b[j] - TG_FUSED_MAX_INPUTS + nin;
    }
    tg_backend be = P[t].out->backend;
    bool mean = sum && tg__fused_reduces_all(P[t].op, &P[t].attrs) == 2;
    tg_tensor *pg = tg__fused_program(nin, nsteps, op, at, a, b, be);
    tg_tensor *total = mean && pg ? tg__tensor_empty_spec(&P[t].out_spec, be) : NULL;
    if (!pg || (mean && !total)) {
        tg_tensor_release(pg);
        tg_error_clear();
        return false;
    }
    memset(g, 0, sizeof *g);
    g->k0 = s;
    g->k1 = t;
    tg__replay_op *c = &g->call;
    c->kind = STEP_OP;
    c->op = tg__fused_op(nin, sum);
    c->nin = nin + 1;
    for (int q = 0; q < nin; q++) {
        c->in[q] = tg_tensor_retain(in[q]);
        c->tracked[q] = tracked[q];
    }
    c->in[nin] = pg;
    c->out = mean ? total : tg_tensor_retain(P[t].out);
    c->out_spec = P[t].out_spec;
    c->record = P[t].record;
    c->label = P[t].label;
    g->reduce = sum;
    if (mean) {
        tg__replay_op *q = &g->post;
        double scale, seed;
        q->kind = STEP_OP;
        q->op = tg__fused_mean_factor(P[t].out->dtype, be, P[t - 1].out->numel, &scale, &seed);
        q->attrs.scalar = scale;
        q->nin = 1;
        q->in[0] = tg_tensor_retain(total);
        q->tracked[0] = c->record;
        q->out = tg_tensor_retain(P[t].out);
        q->out_spec = P[t].out_spec;
        q->record = P[t].record;
        q->label = P[t].label;
        c->attrs.flag = 1;
        c->attrs.scalar = seed;
        g->mean = true;
    }
    for (int64_t k = 0; k < t - s; k++) /* held as a result, and once per read */
        g->refs[k] = 1 + reads_in[k];
    memcpy(g->site, site, (size_t)nsites * sizeof *site);
    g->nsites = nsites;
    return true;
}

/* Whether step k is a sum or mean no run may end with (no_reduce). */
static bool listed(const tg_tape *tape, int64_t k)
{
    for (int64_t i = 0; i < tape->nno_reduce; i++)
        if (tape->no_reduce[i] == k) return true;
    return false;
}

/* After group g's fused sum ran its forward twice (its values could not be
 * summed block by block): from the next replay on, the run ends before its
 * sum or mean, which runs as recorded after a fused call that writes the
 * values once (planned again). Nothing changes where memory runs out. */
static void unreduce(tg_tape *tape, const tg__replay_group *g)
{
    int64_t *v = realloc(tape->no_reduce, (size_t)(tape->nno_reduce + 1) * sizeof *v);
    if (!v) return;
    tape->no_reduce = v;
    v[tape->nno_reduce++] = g->k1;
    tape->planned_nprog = -1;
}

/* Plans the program's fused runs (none where memory runs out, to be
 * planned again at the next replay; fewer where the list of runs cannot
 * grow). */
static void plan_groups(tg_tape *tape)
{
    groups_free(tape);
    tape->planned_nprog = tape->nprog;
    const tg__replay_op *P = tape->prog;
    int64_t n = tape->nprog, cand = 0;
    for (int64_t k = 0; k < n; k++) cand += fusable(&P[k]);
    if (cand < 2) return;
    size_t cap = 16;
    while (cap < (size_t)cand * 8) cap *= 2;
    use_map m = {calloc(cap, sizeof(use)), cap - 1};
    tg__replay_group *gs = NULL;
    int64_t ng = 0, capg = 0;
    if (!m.v) { /* no plan: the calls run one by one; the next replay tries again */
        tape->planned_nprog = -1;
        return;
    }
    for (int64_t k = 0; k < n; k++) {
        if (!fusable(&P[k])) continue;
        use_at(&m, P[k].out, true);
        for (int i = 0; i < P[k].nin; i++) use_at(&m, P[k].in[i], true);
    }
    for (int64_t k = 0; k < n; k++) {
        if (P[k].kind != STEP_OP) continue;
        for (int i = 0; i < P[k].nin; i++) {
            use *u = use_at(&m, P[k].in[i], false);
            if (u) u->reads++;
        }
    }
    for (int64_t s = 0; s < n;) {
        if (!fusable(&P[s])) {
            s++;
            continue;
        }
        int64_t e = s; /* the longest run from s, then the longest valid one */
        while (e + 1 < n && e - s + 1 < TG_FUSED_MAX_OPS && joins(&P[s], &P[e + 1])) e++;
        if (e + 1 < n && reduces(&P[e], &P[e + 1]) && !listed(tape, e + 1)) e++;
        tg__replay_group g;
        int64_t t = e;
        while (t > s && !group_make(tape, &m, s, t, &g)) t--;
        if (t == s) {
            s++;
            continue;
        }
        if (ng == capg) {
            int64_t nc = capg ? 2 * capg : 4;
            tg__replay_group *v = realloc(gs, (size_t)nc * sizeof *v);
            if (!v) {
                call_free(&g.call);
                if (g.mean) call_free(&g.post);
                break;
            }
            gs = v, capg = nc;
        }
        gs[ng++] = g;
        s = t + 1;
    }
    free(m.v);
    tape->groups = gs;
    tape->ngroups = ng;
    for (int64_t g = 0; g < ng; g++) tape->prog[gs[g].k0].group = (int32_t)(g + 1);
}

/* Whether group g's middle results are the program's alone now: held by
 * it only (no scope, no user reference, no view of their storage). */
static bool group_ready(const tg_tape *tape, const tg__replay_group *g)
{
    if (g->dropped) return true;
    for (int64_t k = g->k0; k < g->k1; k++) {
        const tg_tensor *o = tape->prog[k].out;
        if (o->refcount != g->refs[k - g->k0] || o->scope_owned ||
            atomic_load(&o->storage->refcount) != 1)
            return false;
    }
    return true;
}

/* After g ran fused: the program lets go of its middle results (group_ready
 * found no other reference, so this frees them). */
static void group_drop(tg_tape *tape, tg__replay_group *g)
{
    tg__replay_op *P = tape->prog + g->k0;
    for (int i = 0; i < g->nsites; i++) {
        tg__replay_op *e = &P[g->site[i].step];
        tg_tensor_release(e->in[g->site[i].arg]);
        e->in[g->site[i].arg] = NULL;
    }
    for (int64_t k = 0; k < g->k1 - g->k0; k++) {
        tg_tensor_release(P[k].out);
        P[k].out = NULL;
    }
    g->dropped = true;
}

/* Makes g's middle results again (new tensors of their recorded specs)
 * for a replay that runs its calls one by one. TG_ERR_NOMEM (recorded)
 * leaves g as it was. */
static tg_status group_restore(tg_tape *tape, tg__replay_group *g)
{
    if (!g->dropped) return TG_OK;
    tg__replay_op *P = tape->prog + g->k0;
    int64_t n = g->k1 - g->k0;
    tg_tensor *made[TG_FUSED_MAX_OPS];
    for (int64_t k = 0; k < n; k++) {
        made[k] = tg__tensor_empty_spec(&P[k].out_spec, g->call.out->backend);
        if (!made[k]) {
            for (int64_t j = 0; j < k; j++) tg_tensor_release(made[j]);
            return tg__err(TG_ERR_NOMEM, "tape_replay: out of memory for a fused run's values");
        }
    }
    for (int64_t k = 0; k < n; k++) P[k].out = made[k];
    for (int i = 0; i < g->nsites; i++)
        P[g->site[i].step].in[g->site[i].arg] = tg_tensor_retain(P[g->site[i].mid].out);
    g->dropped = false;
    return TG_OK;
}

static tg_status groups_restore(tg_tape *tape)
{
    tg_status st = TG_OK;
    for (int64_t g = 0; g < tape->ngroups && !st; g++) st = group_restore(tape, &tape->groups[g]);
    return st;
}

/* Whether the record is plain but for its policy: no segments, no pack
 * or gradient hooks, no anomaly mode (each of which sees the calls one by
 * one). */
static bool plain_but_policy(const tg_tape *tape)
{
    return !tape->prog_marks && !tape->segment_depth && !tape->opts.anomaly && !tape->watch &&
           !tape->any_hooks && !tape->nhooks && !tape->nleaf_hooks && !tape->pack && !tape->npacks;
}

/* Whether this replay may fuse runs: a plain record under NONE or
 * BALANCED. Whatever BALANCED decides for a fused call's node (keep its
 * values, or run it again in backward) gives its gradients bit for bit; a
 * budget is not fused, since a fused call keeps other bytes than its calls
 * and could exceed a budget they fit (or the reverse). */
static bool may_fuse(const tg_tape *tape)
{
    return !tape->opts.replay_unfused && plain_but_policy(tape) &&
           (tape->opts.policy == TG_CHECKPOINT_NONE ||
            tape->opts.policy == TG_CHECKPOINT_BALANCED);
}

/* Whether this replay may keep the record the last one made and give its
 * nodes back their saves (node_rearm) instead of recording them again:
 * the same bits, since the nodes are those a new record would make, only
 * where the record holds no choice that a new one could make otherwise or
 * state a reset drops: the NONE policy, no segments, no pack or gradient
 * hooks, no anomaly mode, and the record untouched since (same generation,
 * nothing recorded after it), each recorded step's output still node k of
 * it, and a fused run's call where it runs fused. Elsewhere the replay
 * records again. */
static bool can_rearm(const tg_tape *tape, bool fuse)
{
    if (!tape->replay_armed || tape->armed_gen != tape->gen || tape->armed_nodes != tape->nnodes ||
        tape->opts.policy != TG_CHECKPOINT_NONE || !plain_but_policy(tape))
        return false;
    int64_t k = 0;
    for (int64_t j = 0; j < tape->nprog; j++) {
        const tg__replay_op *e = &tape->prog[j], *calls[2] = {e, NULL};
        if (fuse && e->group) {
            /* A run that let go of its middle results ran fused last time
             * and runs fused now: its call (and a mean's factor) are the
             * nodes. One that did not may run either way: record again. */
            const tg__replay_group *g = &tape->groups[e->group - 1];
            if (!g->dropped) return false;
            calls[0] = &g->call;
            calls[1] = g->mean ? &g->post : NULL;
            j = g->k1;
        }
        for (int c = 0; c < 2 && calls[c]; c++) {
            e = calls[c];
            if (e->kind != STEP_OP || !e->record) continue;
            const tg_tensor *o = e->out;
            if (k >= tape->nnodes || o->tape != tape || o->is_leaf || o->gen != tape->gen ||
                o->node != k || tape->nodes[k].op != e->op || tape->nodes[k].nin != e->nin)
                return false;
            k++;
        }
    }
    return k == tape->nnodes;
}

tg_status tg_tape_replay(tg_tape *tape, int n, tg_tensor *const *inputs, tg_tensor *const *values)
{
    tg_status st = tg__tape_check(tape, "tape_replay");
    if (st) return st;
    if (!tape->opts.replay)
        return tg__err(TG_ERR_INVALID, "bad argument #1 to 'tape_replay' (the tape was made "
                                       "without opts.replay)");
    if (tape->replaying || tape->sweep_busy || tg__in_op)
        return tg__err(TG_ERR_INVALID, "bad argument #1 to 'tape_replay' (called from inside a "
                                       "replay, a backward or an op)");
    if (n < 0 || (n > 0 && !inputs))
        return tg__err(TG_ERR_INVALID, "bad argument #2 to 'tape_replay' (%d inputs%s)", n,
                       n > 0 ? " and a NULL array" : "");
    if (tape->nprog == 0)
        return tg__err(TG_ERR_INVALID, "bad argument #1 to 'tape_replay' (nothing recorded to "
                                       "replay: record the forward once first)");
    if ((st = check_values(tape, n, inputs, values))) return st;
    for (int k = 0; k < n && values; k++) {
        if (values[k] == inputs[k]) continue;
        if ((st = copy_elems(inputs[k], values[k]))) return st;
        tg__tensor_written(inputs[k]);
    }
    bool fuse = may_fuse(tape);
    /* Runs that let go of their middle results get them back before a
     * replay runs them call by call, or the program is planned again. */
    if ((!fuse || tape->planned_nprog != tape->nprog) && (st = groups_restore(tape))) {
        tg__tape_reset_record(tape); /* as any replay that fails: no record */
        return st;
    }
    if (fuse && tape->planned_nprog != tape->nprog) plan_groups(tape);
    fuse = fuse && tape->ngroups > 0;
    bool fast = can_rearm(tape, fuse);
    int64_t node = 0;
    if (fast) {
        /* The nodes stay; what a backward with retain (or a partial
         * tg_grad_of) left saved goes, as a reset would drop it. */
        for (int64_t k = 0; k < tape->nnodes; k++)
            if (!tape->nodes[k].consumed) tg__node_release_saved(tape, &tape->nodes[k]);
        tape->saved_peak = tape->saved_bytes;
        tape->writes_at_first = atomic_load_explicit(&tg__writes, memory_order_relaxed);
    } else {
        tg__tape_reset_record(tape);
    }
    tape->replay_armed = false;
    tape->replaying = true;
    int32_t label = tape->cur_label;
    tape->fused_steps = 0;
    for (int64_t k = 0; k < tape->nprog && st == TG_OK; k++) {
        tg__replay_op *e = &tape->prog[k];
        tg__replay_group *g = fuse && e->group ? &tape->groups[e->group - 1] : NULL;
        if (g && group_ready(tape, g)) {
            tg__fused_sum_reran = false;
            st = run_step(tape, &g->call, fast ? &node : NULL);
            if (!st && g->reduce && tg__fused_sum_reran) unreduce(tape, g);
            if (!st && g->mean) st = run_step(tape, &g->post, fast ? &node : NULL);
            if (!st && !g->dropped) group_drop(tape, g);
            tape->fused_steps += g->k1 - g->k0 + 1;
            k = g->k1;
        } else {
            st = run_step(tape, e, fast ? &node : NULL);
        }
    }
    tape->cur_label = label;
    tape->replaying = false;
    if (st) {
        /* A half-made record must not be swept: drop it (the program stays,
         * so the replay can be tried again). */
        tg__tape_reset_record(tape);
        return st;
    }
    tape->replay_armed = true;
    tape->armed_gen = tape->gen;
    tape->armed_nodes = tape->nnodes;
    return TG_OK;
}

int64_t tg_tape_replay_steps(const tg_tape *tape)
{
    return tape ? tape->nprog : 0;
}

int64_t tg_tape_replay_fused_steps(const tg_tape *tape)
{
    return tape ? tape->fused_steps : 0;
}
