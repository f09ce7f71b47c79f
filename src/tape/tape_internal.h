/* Tape internals: nodes and the record. The tape reaches ops only through
 * the function pointers of the tg_op stored in each node. */
#ifndef TG_TAPE_INTERNAL_H
#define TG_TAPE_INTERNAL_H

#include "core/opctx.h"

/* One recorded op. Kept small (248 bytes; a long scalar tape is mostly
 * nodes): the specs and attrs, the same for most nodes of a tape, are ids
 * into the tape's interned pools (tg__node_spec, tg__node_attrs), and the
 * extras, which few ops keep, live in an array of their own. Pointers
 * first, then the 4-byte fields, then the bytes, so that nothing pads. */
typedef struct tg_node {
    const tg_op *op;
    tg_tensor *in_saved[TG_OP_MAX_INPUTS];
    tg_tensor *out_saved;                /* the output, retained (TG_SAVE_OUTPUT) */
    tg_tensor **extra;                   /* nextra tensors (malloc'd), NULL when none */
    size_t saved_bytes;
    /* Checkpointing (see checkpoint.c). A recompute node saves nothing of
     * its own: backward re-runs its forward from the values of its inputs,
     * found through in_node (the producing node of this generation) or
     * in_val (a leaf, borrowed: the tape's leaf list holds it; or an
     * untracked input, retained: bit i of in_val_owned). A saving node
     * borrows in in_val the leaves it does not save, so that it can be
     * re-run too. */
    tg_tensor *in_val[TG_OP_MAX_INPUTS];
    tg_tensor *ckpt;                     /* output kept for recompute consumers */
    /* Versions (tg__tape_check_writes): of what input i's check reads
     * (in_chk: the saved input, the kept value or the tracked leaf,
     * borrowed from in_saved/in_val/the leaf list; NULL: none), of the
     * output and of the checkpoint when they were recorded; out_written:
     * the output was written through its own header after recording
     * (written_ver: the version that write made). */
    const tg_tensor *in_chk[TG_OP_MAX_INPUTS];
    uint32_t in_ver[TG_OP_MAX_INPUTS];
    uint32_t out_ver, ckpt_ver, written_ver;
    int32_t in_slot[TG_OP_MAX_INPUTS];   /* -1: input needs no gradient */
    int32_t out_slot;
    int32_t in_node[TG_OP_MAX_INPUTS];   /* -1: not an interior result */
    int32_t in_spec[TG_OP_MAX_INPUTS];   /* ids in the tape's spec pool */
    int32_t out_spec;
    int32_t attrs;                       /* id in the attrs pool, -1: all zero */
    int32_t segment;                     /* innermost checkpoint segment's id, 0: none */
    int32_t label;                       /* index into tape->labels, -1: none */
    int16_t chain;                       /* BALANCED: recompute nodes back to a kept value */
    uint16_t ckpt_users;                 /* saving node: recompute readers of its ckpt */
    uint8_t nin;
    uint8_t nextra;
    uint8_t backend;                     /* tg_backend */
    uint8_t in_val_owned;                /* bit i: in_val[i] is retained */
    bool consumed;                       /* saved state released by backward */
    bool needs_state;                    /* backward reads saved or recomputed values */
    bool recompute;
    bool remake_extra;                   /* its forward kept extras: backward re-runs it */
    bool out_written;
    bool none_kept;                      /* NONE would keep its output (checkpoint.c) */
    bool region_size;                    /* output of TG_REGION_MIN_BYTES or more (region.c) */
    bool out_view;                       /* output shares input 0's storage (a reshape) */
} tg_node;

/* The least output a pointwise region starts from: two of its blocks. */
#define TG_REGION_BLOCK_BYTES ((int64_t)64 << 10)
#define TG_REGION_MIN_BYTES (2 * TG_REGION_BLOCK_BYTES)

/* Interned fixed-size records (tape.c): each distinct record once, found
 * by content; ids index chunks that never move, so a pointer from
 * tg__pool_at stays valid while ops are recorded (a create_graph backward
 * records while it reads). Kept across tg_tape_reset (a training loop
 * interns the same few shapes every step) unless it has grown past
 * TG__POOL_KEEP records. */
#define TG__POOL_CHUNK 256
#define TG__POOL_KEEP 65536
typedef struct tg__pool {
    size_t size;             /* bytes per record */
    unsigned char **chunks;
    int32_t n, nchunks;
    int32_t *table;          /* open addressing: id + 1, 0 empty */
    uint32_t cap;            /* table slots, a power of two (0: none yet) */
} tg__pool;

/* Record id of p, whose records are size bytes (a constant at the typed
 * accessors below). */
static inline const void *tg__pool_at(const tg__pool *p, int32_t id, size_t size)
{
    uint32_t u = (uint32_t)id;
    return p->chunks[u / TG__POOL_CHUNK] + (size_t)(u % TG__POOL_CHUNK) * size;
}

/* BALANCED keeps the output of a recompute node that ends a chain of this
 * many recompute nodes back to a kept value (tg__checkpoint_place). */
#define TG_BALANCED_MAX_CHAIN 8

#define TG_TAPE_MAX_LABELS 32
#define TG_TAPE_LABEL_MAX 63

struct tg_tape {
    int32_t refcount;   /* the user's handle + every tensor pointing here */
    bool dead;          /* tg_tape_free was called */
    uint32_t gen;
    tg_tape_opts opts;
    tg_node *nodes;
    int64_t nnodes, capnodes;
    int64_t nodes_seen;    /* nodes[0 .. nodes_seen) were written by some record */
    tg__pool specs;        /* tg_spec, tail of shape zeroed */
    uint32_t spec_epoch;   /* bumped when specs is cleared (tg_tensor.spec_epoch) */
    tg__pool attrs;        /* tg_op_attrs, padding zeroed */
    int32_t nslots;
    tg_tensor **leaves; /* leaves with a slot in this generation (retained) */
    int32_t nleaves, capleaves;
    size_t saved_bytes, saved_peak;
    size_t none_bytes;     /* what NONE would keep for the ops recorded (checkpoint.c) */
    int segment_depth;     /* open tg_checkpoint_begin calls */
    int32_t segment_inner; /* id of the open innermost segment, 0 if none */
    int32_t nsegments;     /* ids handed out since the last reset */
    /* Every segment opened since the last reset, by id (segs[0]: none):
     * nested ones too (tg__seg_root, tg__seg_lca_depth; recompute.c). */
    struct tg__seg *segs;
    int32_t capsegs;
    int64_t recomputes;    /* forwards re-run by backward, since the last reset */
    int64_t nrecompute;    /* recompute nodes recorded since the last reset */
    /* Nodes a backward released (consumed), since the last reset, and
     * whether a checkpoint was placed on one after: when every node is
     * consumed and none took one, tg_tape_reset has nothing to release. */
    int64_t nconsumed;
    bool ckpt_late;
    uint64_t writes_at_first; /* tg__writes when this generation's first node was recorded */
    /* Labels: every path pushed so far (interned, kept across resets) and
     * the open ones, innermost last (indices into labels). */
    char **labels;
    int32_t nlabels, caplabels;
    int32_t label_stack[TG_TAPE_MAX_LABELS];
    int label_depth;
    int32_t cur_label; /* the innermost open label, -1: none (what a node records) */
    /* tg_backward's gradient slots, kept from sweep to sweep (a long tape
     * otherwise maps fresh zero pages for them every step); busy while a
     * sweep uses them (a hook's own backward then allocates its own). */
    struct tg_tensor **sweep_grads;
    int32_t sweep_cap;
    bool sweep_busy;
    /* Hooks (hooks.c). any_hooks: gradient or node hooks are set (the
     * sweep then runs node by node, no pointwise blocks). */
    struct tg__grad_hook *hooks;
    int32_t nhooks, caphooks;
    struct tg__leaf_hook *leaf_hooks;
    int32_t nleaf_hooks, capleaf_hooks;
    tg_node_pre_hook pre;
    tg_node_post_hook post;
    void *node_ud;
    tg_pack_hook pack;
    tg_unpack_hook unpack;
    tg_packed_free pfree;
    void *pack_ud;
    struct tg__packed *packs; /* handles of saved values, in record order */
    int64_t npacks, cappacks;
    tg_grad_ready_fn ready;   /* tg_tape_set_grad_ready */
    void *ready_ud;
    bool any_hooks;
    bool watch; /* anomaly mode or node hooks: tg__tape_watch_after per node */
    /* Replay (replay.c, opts.replay): the forward's op calls in order,
     * kept across the resets tg_tape_replay makes; replaying: re-running
     * them (dispatch then captures nothing). */
    struct tg__replay_op *prog;
    int64_t nprog, capprog;
    /* Runs of the program replay fuses (replay.c), planned when the
     * program had planned_nprog steps (replanned when it grows). */
    struct tg__replay_group *groups;
    int64_t ngroups, planned_nprog;
    int64_t fused_steps; /* steps the last replay ran inside fused calls */
    /* Sums and means a run may not end with: their fused sum had to run
     * its forward twice (program step indices). */
    int64_t *no_reduce, nno_reduce;
    bool replaying;
    bool prog_marks;     /* the program has checkpoint segments */
    /* The record is the one the last replay made (armed_gen, armed_nodes
     * nodes, nothing recorded since): the next replay may re-arm its nodes
     * instead of recording them again (replay.c). */
    bool replay_armed;
    uint32_t armed_gen;
    int64_t armed_nodes;
    bool profiling;        /* profile.c */
    tg_profile_row *prof;
    const tg_op **prof_ops;
    int nprof, capprof;
};

/* A checkpoint segment: the one it opened in (0: none), the outermost
 * one around it (itself at depth 1) and its depth (1: outermost). */
typedef struct tg__seg {
    int32_t parent, root;
    int32_t depth;
} tg__seg;

/* Outermost segment around segment id (0 for 0). */
static inline int32_t tg__seg_root(const struct tg_tape *tape, int32_t id)
{
    return id ? tape->segs[id].root : 0;
}

/* Depth of the innermost segment that holds both a and b (0: none). */
static inline int32_t tg__seg_lca_depth(const struct tg_tape *tape, int32_t a, int32_t b)
{
    if (!a || !b) return 0;
    const tg__seg *s = tape->segs;
    while (a != b) {
        if (s[a].depth >= s[b].depth)
            a = s[a].parent;
        else
            b = s[b].parent;
    }
    return s[a].depth;
}

/* A tensor's tape record is live: leaf of a live tape, or recorded in the
 * tape's current generation. Inline: dispatch and replay ask per input. */
static inline bool tg__tensor_live(const tg_tensor *t)
{
    if (!t->tape || t->tape->dead) return false;
    return t->is_leaf || t->gen == t->tape->gen;
}
/* Explains why t is not live, as a TG_ERR_STALE for op's argument argi. */
TG_INTERNAL tg_status tg__err_stale(const char *op, int argi, const tg_tensor *t);
/* Gradient slot of a live tracked tensor in its tape's generation (assigns
 * one to a leaf on first use). -1 on allocation failure. */
TG_INTERNAL int32_t tg__tape_slot(tg_tensor *t);
/* Appends a node for out = op(in). in are the caller's tensors (their
 * gradient slots); seen are what forward read (contiguous copies where
 * dispatch made them), saved per op->saves. Takes the extra tensors
 * (already retained). Marks out as recorded. */
TG_INTERNAL tg_status tg__tape_record(struct tg_tape *tape, const tg_op *op,
                                      const tg_op_attrs *attrs, int nin, tg_tensor *const *in,
                                      tg_tensor *const *seen, const bool *tracked, tg_tensor *out,
                                      tg_tensor **extra, int nextra);
/* A node's specs and attrs, from the tape's pools. */
static inline const tg_spec *tg__node_spec(const struct tg_tape *tape, int32_t id)
{
    return (const tg_spec *)tg__pool_at(&tape->specs, id, sizeof(tg_spec));
}
static inline const tg_spec *tg__node_in_spec(const struct tg_tape *tape, const tg_node *n, int i)
{
    return tg__node_spec(tape, n->in_spec[i]);
}
static inline const tg_spec *tg__node_out_spec(const struct tg_tape *tape, const tg_node *n)
{
    return tg__node_spec(tape, n->out_spec);
}
static inline const tg_op_attrs *tg__node_attrs(const struct tg_tape *tape, const tg_node *n)
{
    return n->attrs < 0 ? &tg__zero_attrs
                        : (const tg_op_attrs *)tg__pool_at(&tape->attrs, n->attrs,
                                                           sizeof(tg_op_attrs));
}
/* The specs of n's inputs as a contiguous array, as a tg_op_ctx takes
 * them: the pool's record itself for one input, else copies in buf. */
static inline const tg_spec *tg__node_in_specs(const struct tg_tape *tape, const tg_node *n,
                                               tg_spec *buf)
{
    if (n->nin == 1) return tg__node_in_spec(tape, n, 0);
    for (int i = 0; i < n->nin; i++) buf[i] = *tg__node_in_spec(tape, n, i);
    return buf;
}
/* Releases a node's saved tensors and marks it consumed. */
TG_INTERNAL void tg__node_release_saved(struct tg_tape *tape, tg_node *n);
/* A reference to the tape: every tensor pointing at it and the user's
 * handle hold one. The last unref frees it. core/tensor.c reaches unref only
 * through the release hook tg_tape_new installs. */
TG_INTERNAL void tg__tape_unref(struct tg_tape *tape);
/* Profiler hooks (profile.c); call only when tape->profiling. */
TG_INTERNAL uint64_t tg__now_ns(void);
TG_INTERNAL void tg__profile_forward(struct tg_tape *tape, const tg_op *op, uint64_t ns,
                                     size_t saved);
TG_INTERNAL void tg__profile_backward(struct tg_tape *tape, const tg_op *op, uint64_t ns);
TG_INTERNAL void tg__profile_recompute(struct tg_tape *tape, const tg_op *op, uint64_t ns);
TG_INTERNAL void tg__profile_free(struct tg_tape *tape);
/* Bytes of t's elements (0 for NULL); kept_bytes is what holding t costs
 * the tape: 0 for leaves (their owner holds them anyway). */
_Static_assert(TG_DTYPE_COUNT == 3, "tg__tensor_bytes knows f32 (4 bytes), f64 and i64 (8)");
static inline size_t tg__tensor_bytes(const tg_tensor *t)
{
    /* Inline: the planner sums these for every op it records. */
    return t ? (size_t)t->numel * (t->dtype == TG_F32 ? 4u : 8u) : 0;
}
static inline size_t tg__kept_bytes(const tg_tensor *t)
{
    /* A leaf is held by its owner whatever the tape does: referencing it
     * costs the tape nothing. */
    return (t && !t->is_leaf && !t->leaf_view) ? tg__tensor_bytes(t) : 0;
}
/* Whether a node recording op on inputs in (tracked per tracked[]) should
 * save nothing and be recomputed, per the tape's policy and segments, and
 * if so whether its inputs from saving producers get checkpoints (else
 * those producers are recomputed from what they save). none_add: what the
 * caller adds to tape->none_bytes once the node is recorded. May fail
 * (BUDGET) with TG_ERR_BUDGET; may drop optional checkpoints (BUDGET). */
TG_INTERNAL tg_status tg__tape_choose(struct tg_tape *tape, const tg_op *op, int nin,
                                      tg_tensor *const *in, tg_tensor *const *seen,
                                      const bool *tracked, tg_tensor *out, tg_tensor *const *extra,
                                      int nextra, bool *recompute, bool *checkpoints,
                                      size_t *none_add);
/* Releases node n's checkpoint and takes its bytes off the node's and the
 * tape's counts; returns them (checkpoint.c). */
TG_INTERNAL size_t tg__node_drop_ckpt(tg_tape *tape, tg_node *n);
/* Called for a saving node n once it has saved its inputs: a recompute
 * producer whose output n saves, and whose backward reads only that
 * output, keeps it too (free: n holds it) and is never re-run; the
 * checkpoints it alone read are released (checkpoint.c). */
TG_INTERNAL void tg__checkpoint_adopt(tg_tape *tape, tg_node *n, tg_tensor *const *in);
/* Checkpoint placement for a new recompute node n (checkpoint.c): where
 * backward finds each input's value (in_val, or a checkpoint kept at the
 * producer), charged to the tape; sets n->chain. tg__tape_record calls it
 * once n's inputs (in_node, in_slot) are filled in. */
TG_INTERNAL void tg__checkpoint_place(struct tg_tape *tape, tg_node *n, tg_tensor *const *in,
                                      const bool *tracked, bool checkpoints);
/* Counts bytes the tape keeps for node n (saved_bytes, its peak). */
static inline void tg__tape_charge(struct tg_tape *tape, tg_node *n, size_t bytes)
{
    n->saved_bytes += bytes;
    tape->saved_bytes += bytes;
    if (tape->saved_bytes > tape->saved_peak) tape->saved_peak = tape->saved_bytes;
}
/* Stamps node n, its saves made, with the versions of what its backward
 * checks (tg__tape_check_writes): per input, a tracked leaf itself, else
 * what it saved or borrowed; and the output's. Recording and replay's
 * re-arming both stamp this way. */
static inline void tg__node_stamp_versions(tg_node *n, tg_tensor *const *in, const bool *tracked,
                                           const tg_tensor *out)
{
    for (int i = 0; i < n->nin; i++) {
        const tg_tensor *c = (tracked[i] && in[i]->is_leaf) ? in[i]
                             : n->in_saved[i] ? n->in_saved[i] : n->in_val[i];
        n->in_chk[i] = c;
        n->in_ver[i] = c ? c->storage->version : 0;
    }
    n->out_ver = out->storage->version;
    n->out_written = false;
}
/* TG_ERR_NULL for a NULL tape, TG_ERR_STALE for a freed one, as argument
 * #1 of op. */
TG_INTERNAL tg_status tg__tape_check(const struct tg_tape *tape, const char *op);
/* The label path node n was recorded under, or NULL. */
static inline const char *tg__tape_label_of(const struct tg_tape *tape, const tg_node *n)
{
    return n->label >= 0 ? tape->labels[n->label] : NULL;
}
/* Anomaly mode (tape.c): TG_ERR_NONFINITE when out, the result of op on
 * in[0..nin) about to be recorded as node tape->nnodes, holds a NaN or an
 * infinity; when the gradient g flowing to input #argi of node idx (made
 * by its backward) does. */
TG_INTERNAL tg_status tg__anomaly_forward(struct tg_tape *tape, const tg_op *op, int nin,
                                          tg_tensor *const *in, const tg_tensor *out);
TG_INTERNAL tg_status tg__anomaly_grad(struct tg_tape *tape, int64_t idx, const tg_node *n,
                                       int argi, const tg_tensor *g);
/* Hooks (hooks.c). */
/* Packs what node tape->nnodes (about to be recorded) saves, per
 * saves/seen/out as tg__tape_record saves them: sets bit i of *mask (bit
 * nin: the output) for each value handed to the pack hook, its handle in
 * handles[i]. On failure frees the handles made and returns the status. */
TG_INTERNAL tg_status tg__hooks_pack(struct tg_tape *tape, const tg_op *op, int nin,
                                     tg_tensor *const *seen, const tg_tensor *out,
                                     void **handles, unsigned *mask);
/* Files the handles of node idx (after it is recorded). TG_ERR_NOMEM. */
TG_INTERNAL tg_status tg__hooks_file(struct tg_tape *tape, int64_t idx, int nin, void **handles,
                                     unsigned mask);
/* Unpacks every handle of nodes 0..top into their in_saved/out_saved. */
TG_INTERNAL tg_status tg__hooks_unpack(struct tg_tape *tape, int64_t top);
/* Frees every handle (a record dropped unswept). */
TG_INTERNAL void tg__hooks_drop_packed(struct tg_tape *tape);
/* Gradient hooks on slot's gradient *g (replaced in place, reference
 * taken over); leaf: whether the slot is a leaf's (matched by pointer). */
TG_INTERNAL tg_status tg__hooks_grad(struct tg_tape *tape, int32_t slot, const tg_tensor *leaf,
                                     tg_tensor **g);
TG_INTERNAL tg_status tg__hooks_leaves(struct tg_tape *tape);
TG_INTERNAL tg_status tg__hooks_node_pre(struct tg_tape *tape, int64_t idx, tg_tensor *gout);
TG_INTERNAL tg_status tg__hooks_node_post(struct tg_tape *tape, int64_t idx, tg_tensor **const *dst);
/* Drops the hooks on recorded results (tg_tape_reset). */
TG_INTERNAL void tg__hooks_reset(struct tg_tape *tape);
/* After node idx's backward, with the gradients dst of its inputs:
 * anomaly checks, then the post hook (hooks.c). */
TG_INTERNAL tg_status tg__tape_watch_after(struct tg_tape *tape, int64_t idx, const tg_node *n,
                                           tg_tensor **const *dst);
/* Releases every hook (tg_tape_free). */
TG_INTERNAL void tg__hooks_free(struct tg_tape *tape);
/* TG_ERR_MODIFIED when a value that backward (or a recompute) of nodes
 * 0..top reads was written after it was recorded; nothing is changed.
 * Skips the walk when no write happened since the first node. */
TG_INTERNAL tg_status tg__tape_check_writes(struct tg_tape *tape, int64_t top);
/* Whether a saving node keeps every input (saved, or a leaf it borrows),
 * so that backward can re-run it from what it keeps. */
TG_INTERNAL bool tg__node_keeps_inputs(const tg_node *n);
TG_INTERNAL void tg__tape_ref(struct tg_tape *tape);
/* Makes room for need elements of size bytes in *arr (capacity *cap,
 * doubled from 16): TG_ERR_NOMEM naming what on failure, nothing changed. */
TG_INTERNAL tg_status tg__tape_grow(void **arr, int64_t *cap, int64_t need, size_t size,
                                    const char *what);
/* Makes t a leaf of tape (dropping its hold on any earlier tape): with a
 * gradient (tg_requires_grad) or without (nograd: tg_tape_input). */
TG_INTERNAL void tg__tape_adopt_leaf(struct tg_tape *tape, tg_tensor *t, bool nograd);
/* Replay (replay.c). Appends the call out = op(in) to the tape's program
 * (record: whether it was recorded as a node; tracked: dispatch's). */
TG_INTERNAL tg_status tg__replay_capture(struct tg_tape *tape, const tg_op *op,
                                         const tg_op_attrs *attrs, int nin, tg_tensor *const *in,
                                         const bool *tracked, tg_tensor *out, bool record);
/* Whether what happens on tape now goes into its replay program: a tape
 * made with opts.replay, not re-running its program, and not inside a
 * create_graph backward (whose ops are not the forward's). */
static inline bool tg__replay_capturing(const struct tg_tape *tape)
{
    return tape->opts.replay && !tape->replaying && !tg__backward_of;
}
/* Appends a checkpoint segment's begin (or end) to the program. */
TG_INTERNAL tg_status tg__replay_mark(struct tg_tape *tape, bool begin);
/* The live replay tape among in[0..n) (an input tracked by a tape that
 * tg__replay_capturing), or NULL: dispatch's test for calls
 * it does not record (nondifferentiable ops) but a replay must re-run. */
TG_INTERNAL struct tg_tape *tg__replay_tape_of(int n, tg_tensor *const *in);
/* Frees the program (tg_tape_reset, tg_tape_free). */
TG_INTERNAL void tg__replay_free(struct tg_tape *tape);
/* Drops the record as tg_tape_reset does, keeping the program. */
TG_INTERNAL void tg__tape_reset_record(struct tg_tape *tape);

#endif
