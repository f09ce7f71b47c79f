/* Pointwise regions of the reverse sweep.
 *
 * A chain of elementwise ops over large tensors makes the plain sweep
 * stream whole tensors through memory once per op: every intermediate
 * gradient is written out and read back, and under a recomputing policy
 * every dropped value is rematerialised whole before the backward that
 * reads it. When the sweep meets a run of nodes whose ops are marked
 * TG_OP_POINTWISE (element k of the output depends on element k of each
 * input, and the same holds for the backward), all of the same element
 * count, it runs the whole run here instead, one block of elements at a
 * time: for each block it recomputes the values the backward needs (for
 * recompute nodes), slices what saving nodes saved, then runs the nodes'
 * backward functions in the sweep's order, with blocks small enough
 * (64 KiB per tensor) that the values and gradients stay in cache. Only
 * the gradients that leave the run (for its inputs) are written out whole.
 *
 * Every element sees the same operations, with the same operands, in the
 * same order as in the plain sweep (the same forward and backward
 * functions on slices; gradients summed in the sweep's order: what
 * arrived from later consumers first, then the run's consumers from the
 * last recorded down), so gradients are bitwise those of the plain sweep.
 *
 * A node joins the run when its op is flagged, has a backward and keeps
 * no extra tensors, its output has the run's dtype and element count, and
 * each input has that element count too or is a single element that needs
 * no gradient (a broadcast scalar, whose gradient would be a reduction
 * across blocks); saving and recompute nodes alike. The scan stops at the
 * first node that neither joins nor can be hoisted (see tg__region_find),
 * so every consumer of the run's values is inside it, hoisted, or was
 * processed before it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/parallel.h"
#include "core/pool.h"
#include "tape/sweep.h"


static int64_t spec_numel(const tg_spec *sp)
{
    return tg__numel(sp->ndim, sp->shape);
}

static int64_t block_elems(tg_dtype dt)
{
    return TG_REGION_BLOCK_BYTES / (int64_t)tg__esize(dt);
}

static bool joins(const tg_tape *tape, const tg_node *n, tg_dtype dt, int64_t numel)
{
    if (n->consumed || !(n->op->flags & TG_OP_POINTWISE) || !n->op->backward || n->remake_extra)
        return false;
    const tg_spec *os = tg__node_out_spec(tape, n);
    if (os->dtype != dt || spec_numel(os) != numel) return false;
    for (int i = 0; i < n->nin; i++) {
        int64_t m = spec_numel(tg__node_in_spec(tape, n, i));
        if (m != numel && !(m == 1 && n->in_slot[i] < 0)) return false;
    }
    return true;
}

/* Whether node m reads the output of node j through a tracked input. */
static bool reads(const tg_node *m, int64_t j)
{
    for (int i = 0; i < m->nin; i++)
        if (m->in_node[i] == j && m->in_slot[i] >= 0) return true;
    return false;
}

/* Scans down from top. A qualifying node joins; another node whose
 * gradient is already complete (no member reads it) and whose gradients
 * go to no slot a member above it also feeds is hoisted: the sweep runs
 * it first, as it would have before the members below it, which keeps
 * every slot's order of accumulation. The scan ends at the first node
 * that can be neither; hoisted nodes below the lowest member are left to
 * the sweep. */
int64_t tg__region_find(sweep_state *s, int64_t top, int64_t *hoist, int *nhoist)
{
    tg_node *nodes = s->tape->nodes;
    const tg_node *n = &nodes[top];
    *nhoist = 0;
    /* The size first: most small nodes stop there. */
    if (!n->region_size) return top;
    tg_dtype dt = tg__node_out_spec(s->tape, n)->dtype;
    int64_t numel = spec_numel(tg__node_out_spec(s->tape, n));
    if (numel < 2 * block_elems(dt) || s->tape->opts.plain_backward || s->tape->opts.anomaly ||
        s->tape->any_hooks || !joins(s->tape, n, dt, numel))
        return top;
    int64_t members[TG_REGION_SPAN];
    int nmem = 1, nh = 0;
    members[0] = top;
    int64_t lo = top;
    for (int64_t j = top - 1; j >= 0 && top - j < TG_REGION_SPAN; j--) {
        const tg_node *m = &nodes[j];
        if (joins(s->tape, m, dt, numel)) {
            members[nmem++] = j;
            lo = j;
            continue;
        }
        bool ok = true;
        for (int k = 0; k < nmem && ok; k++) {
            const tg_node *q = &nodes[members[k]];
            if (reads(q, j)) ok = false;
            for (int i = 0; i < m->nin && ok; i++)
                for (int qi = 0; qi < q->nin && ok; qi++)
                    if (m->in_slot[i] >= 0 && m->in_slot[i] == q->in_slot[qi]) ok = false;
        }
        if (!ok) break;
        hoist[nh++] = j;
    }
    while (nh > 0 && hoist[nh - 1] < lo) nh--;
    *nhoist = nh;
    return lo;
}

/* Per node of the run. */
typedef struct rnode {
    tg_node *n;
    int64_t idx;
    bool need_val, has_grad;
    int src[TG_OP_MAX_INPUTS];      /* value from this run node's block, -1: from ext */
    int gdst[TG_OP_MAX_INPUTS];     /* gradient to this run node, -1: to target */
    tg_tensor *ext[TG_OP_MAX_INPUTS]; /* outside value: contiguous, or one element */
    int target[TG_OP_MAX_INPUTS];   /* outside gradient target, -1 none */
    tg_tensor *full;                /* the whole output, where the sweep already has it */
    tg_tensor *prior;               /* gradient from consumers after the run */
    tg_tensor *val, *grad;          /* this block's */
    uint64_t fwd_ns, bwd_ns;
} rnode;

/* An outside gradient slot the run writes: the whole gradient, built block
 * by block in out. */
typedef struct rtarget {
    int32_t slot;
    tg_tensor *out;
    tg_tensor *prior;   /* the gradient that was in the slot, sliceable */
    tg_tensor *acc;     /* this block's sum */
} rtarget;

typedef struct region {
    sweep_state *s;
    int64_t lo, count, numel;
    tg_dtype dtype;
    int member[TG_REGION_SPAN];     /* by node index - lo: run index, -1 not in the run */
    rnode nodes[TG_REGION_SPAN];
    rtarget targets[TG_REGION_SPAN * TG_OP_MAX_INPUTS];
    int ntargets;
    tg_tensor *owned[TG_REGION_SPAN * (TG_OP_MAX_INPUTS + 1) + 1]; /* copies made here */
    int nowned;
} region;

/* A whole tensor the blocks can be sliced from: t itself when contiguous
 * or a single element; else a contiguous copy, or for a stride-0
 * broadcast (gradients only: backward functions take strided tensors)
 * t itself. */
static tg_status sliceable(region *r, tg_tensor *t, bool allow_bcast, tg_tensor **out)
{
    bool bcast = allow_bcast;
    for (int d = 0; d < t->ndim && bcast; d++) bcast = t->strides[d] == 0;
    if (t->contiguous || t->numel == 1 || bcast) {
        *out = t;
        return TG_OK;
    }
    tg_scope_begin();
    tg_tensor *c = tg_tensor_retain(tg_contiguous(t));
    tg_scope_end();
    if (!c) return tg_last_error() ? tg_last_error() : TG_ERR_NOMEM;
    r->owned[r->nowned++] = c;
    *out = c;
    return TG_OK;
}

/* Elements [start, start + len) of a sliceable tensor as a 1-d view (a 0-d
 * view for a single element). New reference. */
static tg_tensor *slice(const tg_tensor *t, int64_t start, int64_t len)
{
    if (t->numel == 1) return tg__tensor_view(t, 0, NULL, NULL, t->offset);
    bool bcast = !t->contiguous;
    int64_t stride = bcast ? 0 : 1;
    return tg__tensor_view(t, 1, &len, &stride, t->offset + (bcast ? 0 : start));
}

static tg_status nomem(void)
{
    return tg__err(TG_ERR_NOMEM, "out of memory for a pointwise block");
}

/* Which values and gradients the run needs, and where its inputs come
 * from; the outside values and gradients made sliceable. */
static tg_status plan(region *r, tg_tensor *g)
{
    sweep_state *s = r->s;
    tg_status st = TG_OK;
    for (int64_t k = r->count - 1; k >= 0 && !st; k--) {
        rnode *rn = &r->nodes[k];
        tg_node *n = rn->n;
        int64_t idx = rn->idx;
        tg_tensor *had = s->vals ? s->vals[idx] : NULL;
        if (n->ckpt || n->out_saved || had) {
            tg_tensor *w = n->ckpt ? n->ckpt : n->out_saved ? n->out_saved : had;
            st = sliceable(r, w, false, &rn->full);
            if (st) break;
        }
        tg_tensor *pg = k == r->count - 1 ? g : s->grads[n->out_slot];
        if (pg) {
            rn->has_grad = true;
            st = sliceable(r, pg, true, &rn->prior);
            if (st) break;
        }
        unsigned saves = n->op->saves;
        if (rn->has_grad && (saves & TG_SAVE_OUTPUT)) rn->need_val = true;
        for (int i = 0; i < n->nin; i++) {
            rn->src[i] = rn->gdst[i] = rn->target[i] = -1;
            int64_t p = n->in_node[i];
            int pk = p >= r->lo && p < idx ? r->member[p - r->lo] : -1;
            bool inside = pk >= 0;
            /* Where the value comes from: a saved or kept whole tensor,
             * else the producer's block. */
            if (inside && !n->in_saved[i] && !n->in_val[i]) {
                rnode *pr = &r->nodes[pk];
                rn->src[i] = pk;
                if ((rn->need_val && !rn->full) || (rn->has_grad && (saves & TG_SAVE_INPUT(i))))
                    pr->need_val = true;
            }
            if (!rn->has_grad || n->in_slot[i] < 0) continue;
            if (inside) {
                rn->gdst[i] = pk;
                r->nodes[pk].has_grad = true;
                continue;
            }
            int t = 0;
            while (t < r->ntargets && r->targets[t].slot != n->in_slot[i]) t++;
            if (t == r->ntargets) {
                rtarget *tg = &r->targets[r->ntargets++];
                memset(tg, 0, sizeof *tg);
                tg->slot = n->in_slot[i];
                tg_tensor *was = s->grads[tg->slot];
                const tg_spec *sp = tg__node_in_spec(s->tape, n, i);
                /* A leaf's gradient sink, where the run makes its first
                 * gradient (backward.c). */
                tg_tensor *sink = !was && s->nsinks && n->in_node[i] < 0
                                      ? tg__sweep_sink(s, tg->slot, true) : NULL;
                tg->out = sink ? tg_tensor_retain(sink)
                               : tg__tensor_empty(sp->dtype, sp->ndim, sp->shape,
                                                  (tg_backend)n->backend);
                if (!tg->out) {
                    st = TG_ERR_NOMEM;
                    break;
                }
                if (was && (st = sliceable(r, was, true, &tg->prior))) break;
            }
            rn->target[i] = t;
        }
    }
    /* Outside values, only for the nodes whose forward or backward runs. */
    for (int64_t k = 0; k < r->count && !st; k++) {
        rnode *rn = &r->nodes[k];
        tg_node *n = rn->n;
        bool fwd = rn->need_val && !rn->full;
        if (!fwd && !rn->has_grad) continue;
        for (int i = 0; i < n->nin && !st; i++) {
            if (rn->src[i] >= 0) continue;
            if (!fwd && !(n->op->saves & TG_SAVE_INPUT(i))) continue;
            tg_tensor *v = n->in_saved[i];
            if (!v) st = tg__sweep_input_value(r->s, n, i, &v);
            if (!st) st = sliceable(r, v, false, &rn->ext[i]);
        }
    }
    return st;
}

/* Block value of input i of run node k (new reference), or NULL. */
static tg_tensor *input_block(region *r, const rnode *rn, int i, int64_t start, int64_t len)
{
    if (rn->src[i] >= 0) return tg_tensor_retain(r->nodes[rn->src[i]].val);
    return rn->ext[i] ? slice(rn->ext[i], start, len) : NULL;
}

static tg_status block_forward(region *r, rnode *rn, int64_t start, int64_t len)
{
    if (rn->full) {
        rn->val = slice(rn->full, start, len);
        return rn->val ? TG_OK : nomem();
    }
    tg_node *n = rn->n;
    tg_tensor *args[TG_OP_MAX_INPUTS] = {0};
    tg_status st = TG_OK;
    for (int i = 0; i < n->nin && !st; i++)
        if (!(args[i] = input_block(r, rn, i, start, len)))
            st = tg__err(TG_ERR_INTERNAL, "pointwise block of '%s': input #%d missing",
                         n->op->name, i + 1);
    if (!st) {
        tg_tensor *extra[TG_OP_MAX_EXTRA];
        int nextra = 0;
        st = tg__exec_forward(r->s->tape, n, args, extra, &nextra,
                              r->s->tape->profiling ? &rn->fwd_ns : NULL,
                              &rn->val);
        for (int k = 0; k < nextra; k++) tg_tensor_release(extra[k]);
    }
    for (int i = 0; i < n->nin; i++) tg_tensor_release(args[i]);
    return st;
}

/* Writes a target's block sum into its whole gradient. */
static tg_status flush_target(rtarget *t, int64_t start, int64_t len)
{
    if (!t->acc) return TG_OK;
    size_t es = tg__esize(t->out->dtype);
    tg_status st = tg_tensor_copy_out(t->acc, (char *)tg__tensor_ptr(t->out) + (size_t)start * es,
                                      (size_t)len * es);
    tg_tensor_release(t->acc);
    t->acc = NULL;
    return st;
}

/* The block's backward through the executor, on 1-d slices of len
 * elements (0-d for a broadcast scalar input): its gradients go to the
 * members that produced its inputs or to the run's outside targets. */
static tg_status block_backward(region *r, rnode *rn, int64_t start, int64_t len)
{
    tg_node *n = rn->n;
    unsigned saves = n->op->saves;
    tg_tensor *args[TG_OP_MAX_INPUTS] = {0}, **dst[TG_OP_MAX_INPUTS];
    tg_spec in_spec[TG_OP_MAX_INPUTS], out_spec;
    tg__spec_of(rn->grad, &out_spec);
    tg_status st = TG_OK;
    for (int i = 0; i < n->nin; i++) {
        const tg_spec *sp = tg__node_in_spec(r->s->tape, n, i);
        if (spec_numel(sp) == 1 && r->numel > 1) {
            in_spec[i] = *sp;
            in_spec[i].ndim = 0;
        } else {
            in_spec[i] = (tg_spec){.dtype = sp->dtype, .ndim = 1, .shape = {len}};
        }
        dst[i] = n->in_slot[i] < 0 ? NULL
                 : rn->gdst[i] >= 0 ? &r->nodes[rn->gdst[i]].grad
                                    : &r->targets[rn->target[i]].acc;
        if ((saves & TG_SAVE_INPUT(i)) && !(args[i] = input_block(r, rn, i, start, len)))
            st = tg__err(TG_ERR_INTERNAL, "pointwise block of '%s': input #%d missing",
                         n->op->name, i + 1);
    }
    int nextra = 0;
    if (!st)
        st = tg__exec_backward(r->s->tape, n, tg__node_needs(n), args, in_spec,
                               (saves & TG_SAVE_OUTPUT) ? rn->val : NULL,
                               &out_spec, NULL, &nextra, rn->grad, dst, NULL,
                               r->s->tape->profiling ? &rn->bwd_ns : NULL);
    for (int i = 0; i < n->nin; i++) tg_tensor_release(args[i]);
    /* This node's value and gradient are read by nobody after its
     * backward (its consumers ran before it): freed now, so that a
     * block holds fewer buffers at once. */
    tg_tensor_release(rn->val);
    tg_tensor_release(rn->grad);
    rn->val = rn->grad = NULL;
    return st;
}

static void block_clear(region *r)
{
    for (int64_t k = 0; k < r->count; k++) {
        tg_tensor_release(r->nodes[k].val);
        tg_tensor_release(r->nodes[k].grad);
        r->nodes[k].val = r->nodes[k].grad = NULL;
    }
    for (int t = 0; t < r->ntargets; t++) {
        tg_tensor_release(r->targets[t].acc);
        r->targets[t].acc = NULL;
    }
}

static tg_status run_block(region *r, int64_t start, int64_t len)
{
    tg_status st = TG_OK;
    for (int64_t k = 0; k < r->count && !st; k++)
        if (r->nodes[k].need_val) st = block_forward(r, &r->nodes[k], start, len);
    for (int64_t k = 0; k < r->count && !st; k++)
        if (r->nodes[k].prior && !(r->nodes[k].grad = slice(r->nodes[k].prior, start, len)))
            st = nomem();
    for (int t = 0; t < r->ntargets && !st; t++)
        if (r->targets[t].prior && !(r->targets[t].acc = slice(r->targets[t].prior, start, len)))
            st = nomem();
    for (int64_t k = r->count - 1; k >= 0 && !st; k--) {
        rnode *rn = &r->nodes[k];
        if (!rn->has_grad) continue;
        if (!rn->grad)
            st = tg__err(TG_ERR_INTERNAL, "pointwise block: no gradient reached '%s'",
                         rn->n->op->name);
        else
            st = block_backward(r, rn, start, len);
    }
    for (int t = 0; t < r->ntargets && !st; t++) st = flush_target(&r->targets[t], start, len);
    block_clear(r);
    return st;
}

/* Blocks split across the elementwise pool: each part runs a contiguous
 * range of blocks with its own copy of the region (the plan is read-only
 * while blocks run; a block's values, gradients and sums are per copy),
 * so every element sees the same operations in the same order as on one
 * thread, and the parts write disjoint slices of the targets. */
#define REGION_MAX_PARTS 8

/* A region is about 70 KB. Allocated fresh for each run, it came back as
 * freshly faulted pages (about six faults a run, ~10 us each on the VM
 * this was measured on: a chain over 32K floats took 8x the time of one
 * over 16K). So each thread keeps the ones it used (the run's own and the
 * copies for the pool's parts) for its next run; they are freed when the
 * thread exits or calls tg_mem_trim (builds with AddressSanitizer keep
 * none). Not zeroed: tg__region_run and plan set every field they read. */
static TG_THREAD_LOCAL region *spare_regions[REGION_MAX_PARTS];

static region *region_take(int i)
{
    region *r = spare_regions[i];
    spare_regions[i] = NULL;
    return r ? r : malloc(sizeof *r);
}

static void region_give(int i, region *r)
{
    if (!TG_ASAN && !spare_regions[i] && tg__thread_register())
        spare_regions[i] = r;
    else
        free(r);
}

void tg__region_trim(void)
{
    for (int i = 0; i < REGION_MAX_PARTS; i++) {
        free(spare_regions[i]);
        spare_regions[i] = NULL;
    }
}

typedef struct {
    region *part[REGION_MAX_PARTS];
    int64_t nblocks, block;
    tg_status st[REGION_MAX_PARTS];
    char msg[REGION_MAX_PARTS][256];
} region_job;

/* Blocks lo .. hi-1 of b elements each (the last one shorter). */
static tg_status run_block_range(region *r, int64_t b, int64_t lo, int64_t hi)
{
    tg_status st = TG_OK;
    for (int64_t k = lo; k < hi && !st; k++) {
        int64_t start = k * b;
        st = run_block(r, start, r->numel - start < b ? r->numel - start : b);
    }
    return st;
}

static void region_part(void *ctx, int part, int nparts)
{
    region_job *j = ctx;
    bool prev = tg_grad_set_enabled(false); /* as on the sweep's thread */
    tg_status st = run_block_range(j->part[part], j->block, j->nblocks * part / nparts,
                                   j->nblocks * (part + 1) / nparts);
    tg_grad_set_enabled(prev);
    j->st[part] = st;
    if (st && part > 0) snprintf(j->msg[part], sizeof j->msg[part], "%s", tg_last_error_message());
}

static tg_status run_blocks(region *r, int64_t b)
{
    int64_t nblocks = (r->numel + b - 1) / b;
    int nparts = tg__pool_size(), split = tg__split_parts((size_t)r->numel * tg__esize(r->dtype));
    if (nparts > split) nparts = split; /* the kernels' measure (backend/parallel.c) */
    if (nparts > REGION_MAX_PARTS) nparts = REGION_MAX_PARTS;
    if (nparts > nblocks) nparts = (int)nblocks;
    if (nparts <= 1) return run_block_range(r, b, 0, nblocks);
    region_job *j = calloc(1, sizeof *j);
    if (!j) return tg__err(TG_ERR_NOMEM, "out of memory for a pointwise region");
    j->nblocks = nblocks;
    j->block = b;
    j->part[0] = r;
    int made = 1;
    for (; made < nparts; made++) {
        if (!(j->part[made] = region_take(made))) break;
        memcpy(j->part[made], r, sizeof *r);
    }
    tg__pool_run(region_part, j, made); /* fewer copies: fewer parts */
    tg_status st = TG_OK;
    for (int p = 0; p < made; p++) {
        if (!st && j->st[p]) {
            st = j->st[p];
            if (p > 0) tg__err(st, "%s", j->msg[p]);
        }
        if (p == 0) continue;
        for (int64_t k = 0; k < r->count; k++) {
            r->nodes[k].fwd_ns += j->part[p]->nodes[k].fwd_ns;
            r->nodes[k].bwd_ns += j->part[p]->nodes[k].bwd_ns;
        }
        region_give(p, j->part[p]);
    }
    free(j);
    return st;
}

static tg_status region_run(sweep_state *s, int64_t lo, int64_t top, tg_tensor *g);

/* The run plans on borrowed values: no value is dropped early meanwhile
 * (recompute.c). */
tg_status tg__region_run(sweep_state *s, int64_t lo, int64_t top, tg_tensor *g)
{
    bool hold = s->hold;
    s->hold = true;
    s->ctx = s->tape->nodes[top].segment;
    tg_status st = region_run(s, lo, top, g);
    s->hold = hold;
    return st;
}

static tg_status region_run(sweep_state *s, int64_t lo, int64_t top, tg_tensor *g)
{
    region *r = region_take(0);
    if (!r) return tg__err(TG_ERR_NOMEM, "out of memory for a pointwise region");
    tg_tape *tape = s->tape;
    r->count = r->ntargets = r->nowned = 0;
    r->s = s;
    r->lo = lo;
    r->dtype = tg__node_out_spec(tape, &tape->nodes[top])->dtype;
    r->numel = spec_numel(tg__node_out_spec(tape, &tape->nodes[top]));
    /* The members, as tg__region_find chose them (hoisted nodes have run:
     * they are consumed or never qualified). */
    for (int64_t j = lo; j <= top; j++) {
        r->member[j - lo] = -1;
        if (!joins(tape, &tape->nodes[j], r->dtype, r->numel)) continue;
        r->member[j - lo] = (int)r->count;
        memset(&r->nodes[r->count], 0, sizeof r->nodes[0]);
        r->nodes[r->count].n = &tape->nodes[j];
        r->nodes[r->count++].idx = j;
    }
    tg_status st = plan(r, g);
    if (!st) st = run_blocks(r, block_elems(r->dtype));
    if (!st) {
        for (int t = 0; t < r->ntargets; t++) {
            tg_tensor_release(s->grads[r->targets[t].slot]);
            s->grads[r->targets[t].slot] = r->targets[t].out;
            r->targets[t].out = NULL;
        }
        for (int64_t k = 0; k < r->count; k++) {
            rnode *rn = &r->nodes[k];
            if (rn->idx != top) {
                tg_tensor_release(s->grads[rn->n->out_slot]);
                s->grads[rn->n->out_slot] = NULL;
            }
            if (rn->need_val && !rn->full) tape->recomputes++;
            if (tape->profiling) {
                if (rn->need_val && !rn->full) tg__profile_recompute(tape, rn->n->op, rn->fwd_ns);
                if (rn->has_grad) tg__profile_backward(tape, rn->n->op, rn->bwd_ns);
            }
            if (rn->has_grad) tg__node_release_saved(tape, rn->n);
        }
    }
    for (int t = 0; t < r->ntargets; t++) tg_tensor_release(r->targets[t].out);
    for (int i = 0; i < r->nowned; i++) tg_tensor_release(r->owned[i]);
    region_give(0, r);
    return st;
}
