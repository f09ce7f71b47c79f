/* The tape: an append-only array of nodes for one forward pass, leaves and
 * gradient slots. Reverse recording order is a topological order, so the
 * backward sweep (backward.c) needs no sort. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tape/tape_internal.h"

TG_THREAD_LOCAL bool tg__grad_disabled;
TG_THREAD_LOCAL int tg__in_op;

bool tg_grad_set_enabled(bool enabled)
{
    bool prev = !tg__grad_disabled;
    tg__grad_disabled = !enabled;
    return prev;
}

bool tg_grad_enabled(void)
{
    return !tg__grad_disabled;
}

/* Core drops a dying tensor's reference to its tape through this hook:
 * installed once, before the first tape exists. */
static pthread_once_t hook_once = PTHREAD_ONCE_INIT;

static void install_hooks(void)
{
    tg__tensor_set_tape_release(tg__tape_unref);
}

tg_tape *tg_tape_new(const tg_tape_opts *opts)
{
    pthread_once(&hook_once, install_hooks);
    tg_tape_opts o = {0};
    if (opts) o = *opts;
    if ((unsigned)o.policy > TG_CHECKPOINT_BUDGET) {
        tg__err(TG_ERR_INVALID, "bad argument #1 to 'tape_new' (no checkpoint policy %d)",
                (int)o.policy);
        return NULL;
    }
    tg_tape *tape = calloc(1, sizeof *tape);
    if (!tape) {
        tg__err(TG_ERR_NOMEM, "out of memory allocating a tape");
        return NULL;
    }
    tape->refcount = 1;
    tape->gen = 1;
    tape->opts = o;
    tape->watch = o.anomaly;
    tape->cur_label = -1;
    tape->specs.size = sizeof(tg_spec);
    tape->spec_epoch = 1;
    tape->attrs.size = sizeof(tg_op_attrs);
    return tape;
}

void tg__tape_ref(tg_tape *tape)
{
    tape->refcount++;
}

/* ---- interned pools (tape_internal.h) */

/* docs/benchmarks.md "Tape length": at most 256 bytes per recorded op. */
_Static_assert(sizeof(tg_node) <= 256, "a tape node outgrew 256 bytes");
/* pool_hash and same_words read records as whole 8-byte words; a spec's
 * first word holds its dtype and ndim (pool_bytes). */
_Static_assert(sizeof(tg_spec) % 8 == 0 && sizeof(tg_op_attrs) % 8 == 0, "pool records");
_Static_assert(offsetof(tg_spec, shape) == 8 && sizeof(tg_spec) != sizeof(tg_op_attrs),
               "pool_bytes tells the pools apart by size");

/* The 8-byte words of rec that can be nonzero: a spec's dtype and ndim and
 * its ndim extents (the rest is zeroed), all of an attrs record. */
static inline size_t pool_bytes(const tg__pool *p, const void *rec)
{
    if (p->size != sizeof(tg_spec)) return p->size;
    return (size_t)(1 + ((const tg_spec *)rec)->ndim) * 8;
}

static uint32_t pool_hash(const void *rec, size_t size)
{
    const unsigned char *b = rec;
    uint64_t h = 0x243f6a8885a308d3u, w;
    for (size_t i = 0; i + 8 <= size; i += 8) {
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x9e3779b97f4a7c15u;
    }
    return (uint32_t)(h >> 32);
}

/* memcmp(a, b, size) == 0 for records of whole 8-byte words, inline. */
static inline bool same_words(const void *a, const void *b, size_t size)
{
    const unsigned char *x = a, *y = b;
    uint64_t u, v, d = 0;
    for (size_t i = 0; i < size; i += 8) {
        memcpy(&u, x + i, 8);
        memcpy(&v, y + i, 8);
        d |= u ^ v;
    }
    return d == 0;
}

static void pool_free(tg__pool *p)
{
    for (int32_t i = 0; i < p->nchunks; i++) free(p->chunks[i]);
    free(p->chunks);
    free(p->table);
}

/* Forgets every record (the chunks stay for reuse). */
static void pool_clear(tg__pool *p)
{
    p->n = 0;
    if (p->table) memset(p->table, 0, (size_t)p->cap * sizeof *p->table);
}

static tg_status pool_rehash(tg__pool *p, uint32_t cap)
{
    int32_t *t = calloc(cap, sizeof *t);
    if (!t) return tg__err(TG_ERR_NOMEM, "out of memory growing the tape's interned records");
    for (int32_t id = 0; id < p->n; id++) {
        const void *rec = tg__pool_at(p, id, p->size);
        uint32_t h = pool_hash(rec, pool_bytes(p, rec)) & (cap - 1);
        while (t[h]) h = (h + 1) & (cap - 1);
        t[h] = id + 1;
    }
    free(p->table);
    p->table = t;
    p->cap = cap;
    return TG_OK;
}

/* The id of the record equal to rec (size bytes, padding zeroed), added if
 * new; -1 with the error set when out of memory. */
static int32_t pool_intern(tg__pool *p, const void *rec)
{
    if (((uint64_t)p->n + 1) * 2 > p->cap && pool_rehash(p, p->cap ? p->cap * 2 : 64))
        return -1;
    size_t bytes = pool_bytes(p, rec);
    uint32_t h = pool_hash(rec, bytes) & (p->cap - 1);
    for (; p->table[h]; h = (h + 1) & (p->cap - 1)) {
        int32_t id = p->table[h] - 1;
        if (same_words(tg__pool_at(p, id, p->size), rec, bytes)) return id;
    }
    if (p->n == INT32_MAX - 1) {
        tg__err(TG_ERR_NOMEM, "too many distinct shapes on one tape");
        return -1;
    }
    int32_t c = p->n / TG__POOL_CHUNK;
    if (c == p->nchunks) {
        unsigned char **cs = realloc(p->chunks, (size_t)(c + 1) * sizeof *cs);
        unsigned char *chunk = cs ? malloc(TG__POOL_CHUNK * p->size) : NULL;
        if (cs) p->chunks = cs;
        if (!chunk) {
            tg__err(TG_ERR_NOMEM, "out of memory growing the tape's interned records");
            return -1;
        }
        p->chunks[p->nchunks++] = chunk;
    }
    int32_t id = p->n++;
    memcpy((void *)tg__pool_at(p, id, p->size), rec, p->size);
    p->table[h] = id + 1;
    return id;
}

static inline bool spec_is(const tg_spec *s, const tg_tensor *t)
{
    return s->dtype == t->dtype && tg__same_shape(s->ndim, s->shape, t->ndim, t->shape);
}

/* t's spec in the tape's pool, interned; -1 when out of memory. */
static int32_t intern_spec(tg_tape *tape, const tg_tensor *t)
{
    tg_spec s;
    memset(&s, 0, sizeof s);
    s.dtype = t->dtype;
    s.ndim = t->ndim;
    memcpy(s.shape, t->shape, (size_t)t->ndim * sizeof s.shape[0]);
    return pool_intern(&tape->specs, &s);
}

/* hint's id when it is t's spec (an id from an earlier record: it may
 * have been forgotten or reused since, so it is checked), else interned. */
static inline int32_t spec_hinted(tg_tape *tape, const tg_tensor *t, int32_t hint)
{
    if (hint >= 0 && hint < tape->specs.n && spec_is(tg__node_spec(tape, hint), t)) return hint;
    return intern_spec(tape, t);
}

/* attrs' id, -1 when all zero (most ops); -2 when out of memory. */
static bool attrs_zero(const tg_op_attrs *a)
{
    uint64_t bits, any = (uint64_t)(a->nints | a->flag | a->target);
    memcpy(&bits, &a->scalar, sizeof bits); /* -0.0 is not zero here */
    any |= bits;
    for (int i = 0; i < TG_MAX_DIMS; i++) any |= (uint64_t)a->ints[i];
    return any == 0;
}

static int32_t intern_attrs(tg_tape *tape, const tg_op_attrs *a, const tg_node *was)
{
    if (attrs_zero(a)) return -1;
    tg_op_attrs z;
    memset(&z, 0, sizeof z); /* the padding too: records compare by bytes */
    z.scalar = a->scalar;
    memcpy(z.ints, a->ints, sizeof z.ints);
    z.nints = a->nints;
    z.flag = a->flag;
    z.target = a->target;
    /* was's attrs, when they are these (checked as spec_hinted does) */
    if (was && was->attrs >= 0 && was->attrs < tape->attrs.n &&
        same_words(tg__pool_at(&tape->attrs, was->attrs, sizeof z), &z, sizeof z))
        return was->attrs;
    int32_t id = pool_intern(&tape->attrs, &z);
    return id < 0 ? -2 : id;
}

void tg__tape_unref(tg_tape *tape)
{
    if (--tape->refcount > 0) return;
    tg__profile_free(tape);
    tg__hooks_free(tape);
    for (int32_t i = 0; i < tape->nlabels; i++) free(tape->labels[i]);
    free(tape->labels);
    pool_free(&tape->specs);
    pool_free(&tape->attrs);
    free(tape->nodes);
    free(tape->leaves);
    free(tape->sweep_grads);
    free(tape->segs);
    free(tape);
}

void tg__node_release_saved(tg_tape *tape, tg_node *n)
{
    for (int i = 0; i < n->nin; i++) {
        tg_tensor_release(n->in_saved[i]);
        n->in_saved[i] = NULL;
    }
    tg_tensor_release(n->out_saved);
    n->out_saved = NULL;
    tg_tensor_release(n->ckpt);
    n->ckpt = NULL;
    for (int i = 0; i < n->nin; i++) {
        if (n->in_val_owned & (1u << i)) tg_tensor_release(n->in_val[i]);
        n->in_val[i] = NULL;
    }
    n->in_val_owned = 0;
    if (n->extra) {
        for (int i = 0; i < n->nextra; i++) tg_tensor_release(n->extra[i]);
        free(n->extra);
        n->extra = NULL;
        n->nextra = 0;
    }
    tape->saved_bytes -= n->saved_bytes;
    n->saved_bytes = 0;
    if (!n->consumed) tape->nconsumed++;
    n->consumed = true;
}

void tg_tape_reset(tg_tape *tape)
{
    if (!tape) return;
    tg__replay_free(tape);
    tg__tape_reset_record(tape);
}

void tg__tape_reset_record(tg_tape *tape)
{
    /* Saved tensors may hold the last references to the tape itself. */
    tg__tape_ref(tape);
    if (tape->nconsumed < tape->nnodes || tape->ckpt_late)
        for (int64_t i = 0; i < tape->nnodes; i++) tg__node_release_saved(tape, &tape->nodes[i]);
    tape->nconsumed = 0;
    tape->ckpt_late = false;
    tg__hooks_drop_packed(tape);
    tg__hooks_reset(tape);
    tape->nnodes = 0;
    if (tape->specs.n > TG__POOL_KEEP) {
        pool_clear(&tape->specs);
        tape->spec_epoch++; /* the leaves' cached ids */
    }
    if (tape->attrs.n > TG__POOL_KEEP) pool_clear(&tape->attrs);
    for (int32_t i = 0; i < tape->nleaves; i++) tg_tensor_release(tape->leaves[i]);
    tape->nleaves = 0;
    tape->nslots = 0;
    tape->gen++;
    tape->saved_bytes = 0;
    tape->saved_peak = 0;
    tape->none_bytes = 0;
    tape->segment_depth = 0;
    tape->segment_inner = 0;
    tape->nsegments = 0;
    tape->recomputes = 0;
    tape->nrecompute = 0;
    tg__tape_unref(tape);
}

void tg_tape_free(tg_tape *tape)
{
    if (!tape) return;
    tg_tape_reset(tape);
    tg__hooks_free(tape); /* hooked leaves hold the tape */
    tape->dead = true;
    tg__tape_unref(tape);
}

int64_t tg_tape_node_count(const tg_tape *tape)
{
    return tape ? tape->nnodes : 0;
}

size_t tg_tape_saved_bytes(const tg_tape *tape)
{
    return tape ? tape->saved_bytes : 0;
}

size_t tg_tape_saved_peak_bytes(const tg_tape *tape)
{
    return tape ? tape->saved_peak : 0;
}

tg_status tg__err_stale(const char *op, int argi, const tg_tensor *t)
{
    if (t->tape->dead)
        return tg__err(TG_ERR_STALE, "bad argument #%d to '%s' (its tape was freed; use tg_detach "
                                     "to keep the value)", argi, op);
    return tg__err(TG_ERR_STALE, "bad argument #%d to '%s' (recorded before tg_tape_reset; use "
                                 "tg_detach to keep the value)", argi, op);
}

bool tg_tensor_requires_grad(const tg_tensor *t)
{
    return t && t->tape && !t->nograd && tg__tensor_live(t);
}

bool tg_tensor_is_leaf(const tg_tensor *t)
{
    return t && t->is_leaf;
}

tg_status tg__tape_grow(void **arr, int64_t *cap, int64_t need, size_t size, const char *what)
{
    if (need <= *cap) return TG_OK;
    int64_t c = *cap ? *cap * 2 : 16;
    while (c < need) c *= 2;
    void *p = realloc(*arr, (size_t)c * size);
    if (!p) return tg__err(TG_ERR_NOMEM, "out of memory for %s", what);
    *arr = p;
    *cap = c;
    return TG_OK;
}

void tg__tape_adopt_leaf(tg_tape *tape, tg_tensor *t, bool nograd)
{
    if (t->tape) tg__tape_unref(t->tape);
    tg__tape_ref(tape);
    t->tape = tape;
    t->is_leaf = true;
    t->nograd = nograd;
    t->node = -1;
    t->gen = 0; /* no slot yet */
    t->slot = -1;
    t->spec_epoch = 0;
}

tg_status tg_requires_grad(tg_tape *tape, tg_tensor *t)
{
    if (!tape) return tg__err(TG_ERR_NULL, "bad argument #1 to 'requires_grad' (NULL tape)");
    if (!t) return tg__err_null("requires_grad", 2);
    if (tape->dead) return tg__err(TG_ERR_STALE, "bad argument #1 to 'requires_grad' (tape was freed)");
    if (!tg__is_float(t->dtype))
        return tg__err(TG_ERR_DTYPE, "bad argument #2 to 'requires_grad' (%s tensor cannot require "
                                     "grad; only f32/f64)", tg_dtype_name(t->dtype));
    if (t->tape && !t->is_leaf && tg__tensor_live(t))
        return tg__err(TG_ERR_INVALID, "bad argument #2 to 'requires_grad' (tensor is the result "
                                       "of a recorded op; tg_detach it first)");
    if (t->is_leaf) {
        if (t->tape == tape) {
            t->nograd = false; /* a replay input that now takes a gradient */
            return TG_OK;
        }
        if (!t->tape->dead)
            return tg__err(TG_ERR_TAPE, "bad argument #2 to 'requires_grad' (already a leaf of "
                                        "another tape)");
    }
    tg__tape_adopt_leaf(tape, t, false);
    return TG_OK;
}

void tg__tape_leaf_uses(const tg_tape *tape, int n, tg_tensor *const *leaves, int32_t *uses)
{
    int32_t *by_slot = calloc((size_t)(tape->nslots > 0 ? tape->nslots : 1), sizeof *by_slot);
    for (int64_t j = 0; by_slot && j < tape->nnodes; j++) {
        const tg_node *nd = &tape->nodes[j];
        for (int i = 0; i < nd->nin; i++)
            if (nd->in_slot[i] >= 0) by_slot[nd->in_slot[i]]++;
    }
    for (int i = 0; i < n; i++) {
        const tg_tensor *l = leaves[i];
        bool cur = l->tape == tape && l->gen == tape->gen && l->slot >= 0 && l->slot < tape->nslots;
        uses[i] = !by_slot ? -1 : cur ? by_slot[l->slot] : 0;
    }
    free(by_slot);
}

int32_t tg__tape_slot(tg_tensor *t)
{
    tg_tape *tape = t->tape;
    if (!t->is_leaf || t->gen == tape->gen) return t->slot;
    if (tape->nleaves == tape->capleaves) {
        int32_t cap = tape->capleaves ? tape->capleaves * 2 : 16;
        tg_tensor **p = realloc(tape->leaves, (size_t)cap * sizeof *p);
        if (!p) {
            tg__err(TG_ERR_NOMEM, "out of memory growing the tape's leaf list");
            return -1;
        }
        tape->leaves = p;
        tape->capleaves = cap;
    }
    tape->leaves[tape->nleaves++] = tg_tensor_retain(t);
    t->gen = tape->gen;
    t->slot = tape->nslots++;
    return t->slot;
}

/* Room for one more node, and *kept for its nextra extras (nextra > 0);
 * TG_ERR_NOMEM (recorded) when either cannot be had. */
static tg_status node_room(tg_tape *tape, int nextra, tg_tensor ***kept)
{
    if (tape->nnodes == tape->capnodes) {
        int64_t cap = tape->capnodes ? tape->capnodes * 2 : 64;
        if (cap > INT32_MAX) return tg__err(TG_ERR_NOMEM, "a tape holds at most 2^30 nodes");
        tg_node *p = realloc(tape->nodes, (size_t)cap * sizeof *p);
        if (!p) return tg__err(TG_ERR_NOMEM, "out of memory growing the tape");
        tape->nodes = p;
        tape->capnodes = cap;
    }
    if (nextra > 0 && !(*kept = malloc((size_t)nextra * sizeof **kept)))
        return tg__err(TG_ERR_NOMEM, "out of memory for a node's kept tensors");
    return TG_OK;
}

tg_status tg__tape_record(tg_tape *tape, const tg_op *op, const tg_op_attrs *attrs, int nin,
                          tg_tensor *const *in, tg_tensor *const *seen, const bool *tracked,
                          tg_tensor *out, tg_tensor **extra, int nextra)
{
    int32_t slots[TG_OP_MAX_INPUTS];
    bool recompute = false, checkpoints = true;
    if (tape->nnodes == 0) tape->writes_at_first = atomic_load_explicit(&tg__writes, memory_order_relaxed);
    size_t none_add = 0;
    /* NONE outside a segment saves as the op says: no call (the common
     * case, on every recorded op). */
    bool plain = tape->opts.policy == TG_CHECKPOINT_NONE && tape->segment_depth == 0;
    tg_status st = plain ? TG_OK
                         : tg__tape_choose(tape, op, nin, in, seen, tracked, out, extra, nextra,
                                           &recompute, &checkpoints, &none_add);
    if (st) return st;
    bool nograd = true; /* no input takes a gradient: neither does out */
    for (int i = 0; i < nin; i++) {
        bool grad = tracked[i] && !in[i]->nograd;
        slots[i] = grad ? tg__tape_slot(in[i]) : -1;
        if (grad && slots[i] < 0) return TG_ERR_NOMEM;
        nograd = nograd && !grad;
    }
    /* The output itself, retained: like a checkpoint, it holds the tape
     * until tg_backward, tg_tape_reset or tg_tape_free releases the node's
     * saves (a view per op would cost a header). */
    tg_tensor *saved_out = (!recompute && (op->saves & TG_SAVE_OUTPUT)) ? out : NULL;
    void *handles[TG_OP_MAX_INPUTS + 1];
    unsigned packed = 0;
    if (tape->pack && !recompute &&
        (st = tg__hooks_pack(tape, op, nin, seen, out, handles, &packed)))
        return st;
    if (packed & (1u << nin)) saved_out = NULL;
    /* What can fail before the node exists: the pools, the node array,
     * the extras' array. */
    /* Specs: an interior input's is its producer's output spec (shapes
     * never change), the output's most often the first input's; only
     * the others are hashed. */
    int32_t in_spec[TG_OP_MAX_INPUTS], out_spec = -1;
    /* The node this one overwrites, from an earlier record (a training
     * loop records the same ops in the same order every step): its ids
     * are tried before hashing, each checked against the values. */
    const tg_node *was = tape->nnodes < tape->nodes_seen ? &tape->nodes[tape->nnodes] : NULL;
    int32_t attrs_id = attrs == &tg__zero_attrs ? -1 : intern_attrs(tape, attrs, was);
    bool ok = attrs_id != -2;
    for (int i = 0; i < nin; i++) {
        tg_tensor *t = in[i];
        if (!tracked[i]) {
            in_spec[i] = spec_hinted(tape, t, was && i < was->nin ? was->in_spec[i] : -1);
        } else if (!t->is_leaf) {
            in_spec[i] = tape->nodes[t->node].out_spec;
        } else if (t->spec_epoch == tape->spec_epoch) {
            in_spec[i] = t->spec;
        } else if ((in_spec[i] = intern_spec(tape, t)) >= 0) {
            t->spec = in_spec[i];
            t->spec_epoch = tape->spec_epoch;
        }
        ok = ok && in_spec[i] >= 0;
    }
    if (ok) {
        int32_t hint = was ? was->out_spec : -1;
        if (!(hint >= 0 && hint < tape->specs.n && spec_is(tg__node_spec(tape, hint), out)))
            hint = nin ? in_spec[0] : -1; /* most ops: the first input's */
        out_spec = spec_hinted(tape, out, hint);
    }
    tg_tensor **kept = NULL;
    if (__builtin_expect(!ok || (nextra > 0 && !recompute) || tape->nnodes == tape->capnodes, 0) &&
        (out_spec < 0 || node_room(tape, recompute ? 0 : nextra, &kept))) {
        for (int i = 0; i <= nin; i++)
            if (packed & (1u << i)) tape->pfree(handles[i], tape->pack_ud);
        return TG_ERR_NOMEM;
    }
    tg_node *n = &tape->nodes[tape->nnodes];
    n->op = op;
    n->attrs = attrs_id;
    n->nin = (uint8_t)nin;
    n->consumed = false;
    /* A node whose backward reads nothing (mul_scalar, sum) can be swept
     * again after its record was released. */
    n->needs_state = op->saves != 0 || nextra > 0;
    n->backend = (uint8_t)out->backend;
    n->saved_bytes = 0;
    n->recompute = recompute;
    n->remake_extra = false;
    n->ckpt = NULL;
    n->segment = tape->segment_inner;
    n->chain = 0;
    n->ckpt_users = 0;
    n->none_kept = !n->segment && (op->saves & TG_SAVE_OUTPUT);
    n->region_size = out->numel * (int64_t)tg__esize(out->dtype) >= TG_REGION_MIN_BYTES;
    n->out_view = nin > 0 && in[0]->storage == out->storage;
    n->in_val_owned = 0;
    for (int i = 0; i < nin; i++) {
        n->in_slot[i] = slots[i];
        n->in_spec[i] = in_spec[i];
        n->in_node[i] = (tracked[i] && !in[i]->is_leaf) ? (int32_t)in[i]->node : -1;
        n->in_val[i] = NULL;
        n->in_saved[i] = (!recompute && (op->saves & TG_SAVE_INPUT(i)) && !(packed & (1u << i)))
                             ? tg_tensor_retain(seen[i]) : NULL;
        tg__tape_charge(tape, n, tg__kept_bytes(n->in_saved[i]));
        /* A saving node borrows the leaves it does not save (affine's bias):
         * free, and with them it can be re-run from what it keeps. */
        if (!recompute && !n->in_saved[i] && tracked[i] && in[i]->is_leaf) n->in_val[i] = in[i];
    }
    n->out_saved = tg_tensor_retain(saved_out);
    tg__tape_charge(tape, n, tg__tensor_bytes(saved_out));
    /* Not while a create_graph backward records: its inputs stand for
     * values it re-made or copied, which need not share the producer's
     * storage (checkpoint.c). */
    if (tape->nrecompute && !recompute && !tg__backward_of) tg__checkpoint_adopt(tape, n, in);
    n->extra = kept;
    n->nextra = 0;
    for (int i = 0; i < nextra; i++) {
        if (recompute) { /* backward makes them again */
            n->remake_extra = true;
            tg_tensor_release(extra[i]);
            continue;
        }
        n->extra[n->nextra++] = extra[i];
        tg__tape_charge(tape, n, tg__kept_bytes(extra[i]));
    }
    if (recompute) {
        tg__checkpoint_place(tape, n, in, tracked, checkpoints);
        tape->nrecompute++;
    }
    n->out_spec = out_spec;
    tg__node_stamp_versions(n, in, tracked, out);
    n->label = tape->cur_label;
    tape->none_bytes += none_add;

    tg__tape_ref(tape);
    out->tape = tape;
    out->gen = tape->gen;
    out->slot = tape->nslots++;
    out->node = tape->nnodes;
    out->is_leaf = false;
    out->nograd = nograd;
    n->out_slot = out->slot;
    tape->nnodes++;
    if (tape->nnodes > tape->nodes_seen) tape->nodes_seen = tape->nnodes;
    /* Filed once the node exists; on failure the node stays, unpacked
     * values missing: its backward would fail, so the op fails now. */
    if (packed && (st = tg__hooks_file(tape, tape->nnodes - 1, nin, handles, packed))) return st;
    return TG_OK;
}

/* ---- versions: writes after recording */

_Atomic uint64_t tg__writes;

void tg__tensor_written(tg_tensor *t)
{
    t->storage->version++;
    atomic_fetch_add_explicit(&tg__writes, 1, memory_order_relaxed);
    if (t->tape && !t->is_leaf && t->node >= 0 && tg__tensor_live(t)) {
        tg_node *n = &t->tape->nodes[t->node];
        n->out_written = true;
        n->written_ver = t->storage->version;
    }
}

/* "node 3 'tanh'" and the label it was recorded under, if any. */
static const char *node_where(const tg_tape *tape, int64_t idx, char *buf, size_t len)
{
    const tg_node *n = &tape->nodes[idx];
    const char *label = tg__tape_label_of(tape, n);
    if (label)
        snprintf(buf, len, "'%s' (node %lld, recorded under '%s')", n->op->name, (long long)idx,
                 label);
    else
        snprintf(buf, len, "'%s' (node %lld)", n->op->name, (long long)idx);
    return buf;
}

static tg_status modified(const tg_tape *tape, int64_t idx, const char *what, int argi,
                          uint32_t then, uint32_t now)
{
    char where[256], arg[32] = "";
    if (argi > 0) snprintf(arg, sizeof arg, " #%d", argi);
    return tg__err(TG_ERR_MODIFIED, "backward of %s reads %s%s, which was modified after it was "
                                    "recorded (version %u when recorded, %u now): write into "
                                    "values only after backward, or record again",
                   node_where(tape, idx, where, sizeof where), what, arg, then, now);
}

tg_status tg__tape_check_writes(tg_tape *tape, int64_t top)
{
    if (atomic_load_explicit(&tg__writes, memory_order_relaxed) == tape->writes_at_first)
        return TG_OK;
    for (int64_t k = 0; k <= top; k++) {
        const tg_node *n = &tape->nodes[k];
        if (n->consumed) continue;
        unsigned saves = n->op->saves;
        for (int i = 0; i < n->nin; i++) {
            const tg_tensor *c = n->in_chk[i];
            if (c && c->storage->version != n->in_ver[i])
                return modified(tape, k, c->is_leaf ? "its input (a leaf)" : "its input", i + 1,
                                n->in_ver[i], c->storage->version);
            int64_t p = n->in_node[i];
            /* An input the op keeps for backward: written through the
             * producer's header, whatever the policy kept (a recompute
             * would read the value again, NONE the stale copy). */
            if (p >= 0 && (saves & TG_SAVE_INPUT(i)) && tape->nodes[p].out_written)
                return modified(tape, k, "its input", i + 1, tape->nodes[p].out_ver,
                                tape->nodes[p].written_ver);
        }
        if (n->out_saved && n->out_saved->storage->version != n->out_ver)
            return modified(tape, k, "its output", 0, n->out_ver, n->out_saved->storage->version);
        if ((saves & TG_SAVE_OUTPUT) && n->out_written)
            return modified(tape, k, "its output", 0, n->out_ver, n->written_ver);
        if (n->ckpt && n->ckpt->storage->version != n->ckpt_ver)
            return modified(tape, k, "its output (kept for recompute)", 0, n->ckpt_ver,
                            n->ckpt->storage->version);
    }
    return TG_OK;
}

/* ---- labels */

tg_status tg__tape_check(const tg_tape *tape, const char *op)
{
    if (!tape) return tg__err(TG_ERR_NULL, "bad argument #1 to '%s' (NULL tape)", op);
    if (tape->dead) return tg__err(TG_ERR_STALE, "bad argument #1 to '%s' (tape was freed)", op);
    return TG_OK;
}

tg_status tg_tape_label_push(tg_tape *tape, const char *name)
{
    tg_status st = tg__tape_check(tape, "tape_label_push");
    if (st) return st;
    if (!name) return tg__err_null("tape_label_push", 2);
    size_t len = strlen(name);
    if (len == 0 || len > TG_TAPE_LABEL_MAX || strchr(name, '/'))
        return tg__err(TG_ERR_INVALID, "bad argument #2 to 'tape_label_push' (a label is 1 to %d "
                                       "bytes without '/'; got %zu bytes%s)", TG_TAPE_LABEL_MAX,
                       len, strchr(name, '/') ? " with a '/'" : "");
    if (tape->label_depth == TG_TAPE_MAX_LABELS)
        return tg__err(TG_ERR_INVALID, "bad argument #1 to 'tape_label_push' (%d labels are open "
                                       "already, the most there can be)", TG_TAPE_MAX_LABELS);
    const char *outer = tg_tape_label(tape);
    char path[TG_TAPE_MAX_LABELS * (TG_TAPE_LABEL_MAX + 1) + 1];
    snprintf(path, sizeof path, "%s%s%s", outer ? outer : "", outer ? "/" : "", name);
    int32_t id = -1;
    for (int32_t i = 0; i < tape->nlabels && id < 0; i++)
        if (strcmp(tape->labels[i], path) == 0) id = i;
    if (id < 0) {
        if (tape->nlabels == tape->caplabels) {
            int32_t cap = tape->caplabels ? tape->caplabels * 2 : 16;
            char **p = realloc(tape->labels, (size_t)cap * sizeof *p);
            if (!p) return tg__err(TG_ERR_NOMEM, "out of memory for the tape's labels");
            tape->labels = p;
            tape->caplabels = cap;
        }
        char *copy = strdup(path);
        if (!copy) return tg__err(TG_ERR_NOMEM, "out of memory for the tape's labels");
        id = tape->nlabels++;
        tape->labels[id] = copy;
    }
    tape->label_stack[tape->label_depth++] = id;
    tape->cur_label = id;
    return TG_OK;
}

tg_status tg_tape_label_pop(tg_tape *tape)
{
    tg_status st = tg__tape_check(tape, "tape_label_pop");
    if (st) return st;
    if (!tape->label_depth)
        return tg__err(TG_ERR_SCOPE, "bad argument #1 to 'tape_label_pop' (no label is open)");
    tape->label_depth--;
    tape->cur_label = tape->label_depth ? tape->label_stack[tape->label_depth - 1] : -1;
    return TG_OK;
}

const char *tg_tape_label(const tg_tape *tape)
{
    if (!tape || !tape->label_depth) return NULL;
    return tape->labels[tape->label_stack[tape->label_depth - 1]];
}

/* ---- anomaly mode */

tg_status tg_tape_set_anomaly(tg_tape *tape, bool on)
{
    tg_status st = tg__tape_check(tape, "tape_set_anomaly");
    if (st) return st;
    tape->opts.anomaly = on;
    tape->watch = on || tape->pre || tape->post;
    return TG_OK;
}

bool tg_tape_anomaly(const tg_tape *tape)
{
    return tape && tape->opts.anomaly;
}

/* Whether n contiguous floats (f32: es 4, f64: 8) are all finite: the
 * exponent bits of every element, ANDed and compared with all ones, in
 * one branch-free pass the compiler vectorises. */
static bool all_finite(const void *p, int64_t n, size_t es)
{
    if (es == 4) {
        const uint32_t *u = p;
        uint32_t any = 0;
        for (int64_t i = 0; i < n; i++) any |= (uint32_t)((u[i] & 0x7f800000u) == 0x7f800000u);
        return !any;
    }
    const uint64_t *u = p;
    uint64_t any = 0;
    for (int64_t i = 0; i < n; i++)
        any |= (uint64_t)((u[i] & 0x7ff0000000000000ull) == 0x7ff0000000000000ull);
    return !any;
}

/* Index of t's first NaN or infinity (any layout), -1 if none. */
static int64_t first_nonfinite(const tg_tensor *t, double *bad)
{
    if (!tg__is_float(t->dtype)) return -1;
    if (t->contiguous && all_finite(tg__tensor_ptr(t), t->numel, tg__esize(t->dtype))) return -1;
    int64_t idx[TG_MAX_DIMS] = {0};
    for (int64_t k = 0; k < t->numel; k++) {
        int64_t off = t->offset;
        for (int d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
        double v = t->dtype == TG_F32 ? (double)((const float *)t->storage->data)[off]
                                      : ((const double *)t->storage->data)[off];
        if (!isfinite(v)) {
            *bad = v;
            return k;
        }
        for (int d = t->ndim - 1; d >= 0 && ++idx[d] == t->shape[d]; d--) idx[d] = 0;
    }
    return -1;
}

static const char *value_name(double v)
{
    return isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf";
}

/* "f64 [3], f32 [2,2]"; "none" for no specs. */
static void specs_str(int nin, const tg_spec *in, char *buf, size_t len)
{
    size_t at = 0;
    snprintf(buf, len, "none");
    for (int i = 0; i < nin && at < len; i++) {
        char s[96];
        int w = snprintf(buf + at, len - at, "%s%s %s", i ? ", " : "", tg_dtype_name(in[i].dtype),
                         tg_shape_str(in[i].ndim, in[i].shape, s, sizeof s));
        if (w < 0) break;
        at += (size_t)w;
    }
}

tg_status tg__anomaly_forward(tg_tape *tape, const tg_op *op, int nin, tg_tensor *const *in,
                              const tg_tensor *out)
{
    double bad = 0;
    int64_t k = first_nonfinite(out, &bad);
    if (k < 0) return TG_OK;
    char ins[512], os[96], lab[TG_TAPE_MAX_LABELS * (TG_TAPE_LABEL_MAX + 1) + 32] = "";
    tg_spec specs[TG_OP_MAX_INPUTS];
    for (int i = 0; i < nin; i++) tg__spec_of(in[i], &specs[i]);
    specs_str(nin, specs, ins, sizeof ins);
    const char *label = tg_tape_label(tape);
    if (label) snprintf(lab, sizeof lab, ", recorded under '%s'", label);
    return tg__err(TG_ERR_NONFINITE, "anomaly mode: forward of '%s' (node %lld%s) produced %s at "
                                     "element %lld of its %s %s output; inputs: %s",
                   op->name, (long long)tape->nnodes, lab, value_name(bad), (long long)k,
                   tg_dtype_name(out->dtype), tg_shape_str(out->ndim, out->shape, os, sizeof os),
                   ins);
}

tg_status tg__anomaly_grad(tg_tape *tape, int64_t idx, const tg_node *n, int argi,
                           const tg_tensor *g)
{
    double bad = 0;
    int64_t k = first_nonfinite(g, &bad);
    if (k < 0) return TG_OK;
    char ins[512], where[256];
    tg_spec buf[TG_OP_MAX_INPUTS];
    specs_str(n->nin, tg__node_in_specs(tape, n, buf), ins, sizeof ins);
    return tg__err(TG_ERR_NONFINITE, "anomaly mode: backward of %s produced %s at element %lld "
                                     "of the gradient of its input #%d (the sum of every "
                                     "contribution so far); inputs: %s",
                   node_where(tape, idx, where, sizeof where), value_name(bad), (long long)k,
                   argi, ins);
}
