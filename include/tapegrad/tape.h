/* tapegrad/tape.h - the tape, leaves, backward, no-grad mode.
 * Included by <tapegrad.h>; do not include directly. */
#ifndef TAPEGRAD_TAPE_H
#define TAPEGRAD_TAPE_H

#include "tensor.h"

/* Append-only record of one forward pass. Opaque. */
typedef struct tg_tape tg_tape;

/* What each op keeps for backward (docs/checkpointing.md). Every policy
 * gives the same gradients. */
typedef enum tg_checkpoint_policy {
    TG_CHECKPOINT_NONE = 0, /* save everything each op's backward reads */
    TG_CHECKPOINT_BALANCED, /* memory-bound ops save nothing: recomputed (a chain of
                               8 of them keeps its last value); never keeps more
                               bytes than NONE */
    TG_CHECKPOINT_BUDGET    /* keep saved bytes <= budget_bytes, recomputing; a
                               budget of NONE's bytes or more always records */
} tg_checkpoint_policy;

/* Tape options (tg_tape_new takes a pointer to them, NULL for the defaults);
 * a zeroed struct gives the defaults. */
typedef struct tg_tape_opts {
    tg_checkpoint_policy policy;
    size_t budget_bytes; /* TG_CHECKPOINT_BUDGET only */
    /* Backward on whole tensors only: no pointwise blocks (runs of
     * TG_OP_POINTWISE ops over large tensors are otherwise differentiated
     * 64 KiB at a time; the gradients are bitwise the same either way). */
    bool plain_backward;
    /* Anomaly mode from the start (tg_tape_set_anomaly). */
    bool anomaly;
    /* Keep the forward's op calls so that tg_tape_replay can run them
     * again on new input values (see "Replay" below). */
    bool replay;
    /* Replay every op call as recorded: no fused runs of pointwise calls
     * (tg_tape_replay; the results and gradients are the same bits). */
    bool replay_unfused;
} tg_tape_opts;

/* New empty tape (NULL opts: defaults). Free with tg_tape_free. */
tg_tape *tg_tape_new(const tg_tape_opts *opts);
/* Releases every node and saved tensor, then the tape. Tensors recorded on
 * it stay readable as data. Its leaves keep their gradients but are no
 * longer tracked: using one in an op fails with TG_ERR_STALE until it is
 * marked on another tape with tg_requires_grad. No-op if tape is NULL. */
void tg_tape_free(tg_tape *tape);
/* Drops the whole record at once (nodes, saved tensors, pending state) and
 * starts a new generation. Interior tensors recorded before it stay readable
 * but using them in an op that records fails with TG_ERR_STALE. Leaves and
 * their gradients are kept. */
void tg_tape_reset(tg_tape *tape);
/* Number of nodes recorded since the last reset. */
int64_t tg_tape_node_count(const tg_tape *tape);
/* Bytes of tensor data the tape holds for backward now, and at peak since
 * the last reset: saved inputs, outputs and extras of every node (a storage
 * kept by two nodes counts once per node). References to leaves, and to
 * views of them (a transposed weight), cost the tape nothing and are not
 * counted. */
size_t tg_tape_saved_bytes(const tg_tape *tape);
size_t tg_tape_saved_peak_bytes(const tg_tape *tape);

/* Marks t as a leaf that requires grad on tape. t must be floating
 * (TG_ERR_DTYPE), not already recorded as an interior result
 * (TG_ERR_INVALID), nor a leaf of another live tape (TG_ERR_TAPE). Marking a
 * leaf of the same tape again is OK. */
tg_status tg_requires_grad(tg_tape *tape, tg_tensor *t);
/* True for leaves and recorded results of the current tape generation. */
bool tg_tensor_requires_grad(const tg_tensor *t);
bool tg_tensor_is_leaf(const tg_tensor *t);

/* ---- Checkpoint segments: ops recorded between begin and end save
 * nothing; backward re-runs them from the values that entered the
 * segment. Random ops (dropout) replay the same mask. TG_ERR_INVALID for an
 * end without a begin. Segments nest: the tape keeps the values that enter
 * outermost segments; a segment nested in another is re-run by backward
 * from the values that enter it, which exist only while backward works in
 * the segment around it. Backward's re-run of an outer segment, for the
 * nested segment it is in, keeps only the values that leave each nested
 * segment it passes through, and re-runs those segments again when it
 * reaches them: more forwards, less memory (tg_checkpoint_sequential's
 * binomial mode builds such a tree). */
tg_status tg_checkpoint_begin(tg_tape *tape);
tg_status tg_checkpoint_end(tg_tape *tape);

/* One stage of a model: layer index and input -> output (new reference or
 * scope-owned), built with tg_* ops. tg_checkpoint and
 * tg_checkpoint_sequential run each stage inside a scope of their own:
 * what the stage makes and does not return is released when it returns
 * (the tape keeps what its policy saves; keep anything else with
 * tg_tensor_retain), and a stage must not release its input. */
typedef tg_tensor *(*tg_segment_fn)(void *userdata, int layer, tg_tensor *x);
/* fn(userdata, 0, x) as one segment. */
tg_tensor *tg_checkpoint(tg_tape *tape, tg_segment_fn fn, void *userdata, tg_tensor *x);
/* Runs nlayers stages in sequence, in k groups (k = nsegments > 0; 0:
 * ceil(sqrt(nlayers)); at most nlayers; negative: binomial, below). The first k - 1 groups are
 * segments, as equal in length as possible (the longer first); the last
 * group, the tail, of max(1, ceil(nlayers / k) - 1) stages, is recorded
 * outside any segment: it would be recomputed right after its forward, so
 * it keeps what the tape's policy keeps (16 stages: segments 5, 4, 4, tail
 * 3). k <= 1: no segment. The tape keeps the first group's input (if not a
 * leaf), the boundaries between segments and the tail's saves. Each
 * stage's output is released once the next stage has run (the forward
 * holds one at a time, beside what the tape keeps), so the process's peak
 * follows the policy. Returns the last stage's output (scope-owned inside
 * a scope, else a new reference); x itself when nlayers is 0. tape may be
 * NULL with nsegments 1 (no segment: a lean forward, recorded on whatever
 * tapes its inputs belong to). */
tg_tensor *tg_checkpoint_sequential(tg_tape *tape, int nlayers, int nsegments, tg_segment_fn fn,
                                    void *userdata, tg_tensor *x);
/* nsegments = -s (1 <= s <= TG_CHECKPOINT_MAX_SLOTS; TG_ERR_INVALID
 * beyond): binomial checkpointing. The stages become a tree of nested
 * segments (Griewank's revolve schedule) so that, beside the stage being
 * differentiated and its input, backward holds at most s stage outputs,
 * and re-runs each stage at most r times, r the least with
 * C(s + r, s) >= nlayers (16 stages, s = 3: r = 3; 72 node forwards
 * re-run for 16 stages of matmul, add and relu, 24 stages' worth).
 * Backward then holds about s + 3 stage outputs, whatever nlayers. */
#define TG_CHECKPOINT_MAX_SLOTS 64
/* Forwards re-run by backward since the last reset: each time a value is
 * rematerialised (once per backward however many nodes use it, except a
 * value no backward reads, dropped once its readers have been re-run, and
 * values inside nested segments, re-run once per level). */
int64_t tg_tape_recompute_count(const tg_tape *tape);

/* ---- Profiler. With profiling on, each recorded forward, each backward
 * and each recompute is timed and counted per op kind; figures add up
 * across tg_tape_reset until tg_tape_profile_clear. */
typedef struct tg_profile_row {
    const char *op;         /* the op's registry name */
    int64_t calls;          /* recorded forwards */
    double forward_ms;
    int64_t backward_calls;
    double backward_ms;
    size_t saved_bytes;     /* kept for backward at recording, summed */
    int64_t recomputes;
    double recompute_ms;
} tg_profile_row;

tg_status tg_tape_profile_enable(tg_tape *tape, bool on);
/* Copies up to cap rows (in order of first use) into rows (may be NULL);
 * returns the number of rows there are. */
int tg_tape_profile_rows(const tg_tape *tape, tg_profile_row *rows, int cap);
void tg_tape_profile_clear(tg_tape *tape);
/* ---- Debugging (docs/debugging.md) */

/* Labels: the nodes recorded between tg_tape_label_push(tape, name) and the
 * matching pop carry the label path, the open names joined by '/'
 * ("encoder/layer2"). Errors from backward (TG_ERR_MODIFIED), anomaly mode
 * (TG_ERR_NONFINITE) and the DOT export name it. name: 1 to 63 bytes, no
 * '/' (TG_ERR_INVALID); at most 32 open (TG_ERR_INVALID). Labels stay open
 * across tg_tape_reset. Cost: one int per node. */
tg_status tg_tape_label_push(tg_tape *tape, const char *name);
/* Closes the innermost label: TG_ERR_SCOPE if none is open. */
tg_status tg_tape_label_pop(tg_tape *tape);
/* The current label path (borrowed, valid until the next push or pop on
 * this tape), NULL when none is open. */
const char *tg_tape_label(const tg_tape *tape);

/* Anomaly mode, off by default: while on, every op the tape records has its
 * output checked for NaN and infinity before it is recorded, and every
 * gradient the sweep produces after each node's backward. The first one
 * found fails the call with TG_ERR_NONFINITE, naming the op, its node
 * index, the input shapes and the label (for backward, the op whose
 * backward produced it); the op records nothing, the sweep changes no leaf
 * gradient, the tape stays usable. Backward runs on whole tensors then (no
 * pointwise blocks). Costs one pass over each output and gradient. */
tg_status tg_tape_set_anomaly(tg_tape *tape, bool on);
bool tg_tape_anomaly(const tg_tape *tape);

/* ---- Hooks (docs/debugging.md). A hook returning a status other than
 * TG_OK fails the call that ran it with that status (a backward then
 * changes no leaf gradient, except through leaf hooks, which run last).
 * Each hook runs inside a scope of its own: tensors it makes are released
 * when it returns, except what it hands back (a replacement, an unpacked
 * value: the tape takes its own reference) and what it passes to
 * tg_scope_keep. Hooks work under every checkpoint policy and under
 * create_graph (they then see tracked gradients, and a gradient hook runs
 * again whenever a later sweep passes its tensor, as PyTorch's do). */

/* Gradient hook on t: runs once the gradient flowing into t is whole (an
 * interior result: when the sweep reaches the op that made it; a leaf:
 * before the sweep adds it into the leaf's grad). It may set *replace to
 * a tensor of grad's dtype, shape and backend, which the sweep uses
 * instead (it takes its own reference; TG_ERR_SHAPE otherwise); leaving
 * it NULL keeps grad. Several hooks on one tensor run in the order they
 * were added, each seeing the previous one's result. */
typedef tg_status (*tg_grad_hook)(tg_tensor *grad, tg_tensor **replace, void *userdata);
/* t must be a leaf or a recorded result of a live tape (TG_ERR_NO_GRAD,
 * TG_ERR_STALE). A hook on a result lasts until tg_tape_reset; on a leaf,
 * while the tape lives (the tape holds a reference to the leaf until
 * tg_tape_free). */
tg_status tg_tensor_hook_add(tg_tensor *t, tg_grad_hook fn, void *userdata);

/* Runs after a backward (tg_backward, tg_backward_ex) has added into
 * leaf's gradient: read or change tg_grad(leaf) in place (clip, log). */
typedef tg_status (*tg_leaf_hook)(tg_tensor *leaf, void *userdata);
tg_status tg_leaf_hook_add(tg_tensor *leaf, tg_leaf_hook fn, void *userdata);
/* Removes every gradient and leaf hook of the tape (node and saved-tensor
 * hooks are set to NULL with their setters). */
void tg_tape_hooks_clear(tg_tape *tape);

/* Node hooks: pre runs before each node's backward with the gradient of
 * its output, post after it with the gradients of its inputs as
 * accumulated so far (its contribution included; NULL where an input
 * needs none). NULL pre/post: none. One pair per tape; setting again
 * replaces it. */
typedef struct tg_node_info {
    const char *op;    /* the forward op's registry name */
    int64_t node;      /* its index in the record */
    const char *label; /* tg_tape_label_push path, or NULL */
    int nin;
} tg_node_info;
typedef tg_status (*tg_node_pre_hook)(const tg_node_info *node, tg_tensor *gout, void *userdata);
typedef tg_status (*tg_node_post_hook)(const tg_node_info *node, tg_tensor *const *gin,
                                       void *userdata);
tg_status tg_tape_set_node_hooks(tg_tape *tape, tg_node_pre_hook pre, tg_node_post_hook post,
                                 void *userdata);

/* Saved-tensor hooks: each value a node saves for its own backward (its
 * inputs and output per the op; not leaves, which their owner holds, nor
 * checkpoints kept for recompute) goes to pack when the op is recorded;
 * the tape keeps only the handle. Backward hands every handle of the nodes
 * it sweeps to unpack when it starts (the recorded dtype and shape, else
 * TG_ERR_SHAPE; borrowed, the tape takes its own reference), then free_fn; a record dropped without
 * backward (reset, free) calls free_fn alone. A failing pack fails the op
 * (nothing recorded); unpack returning NULL fails the backward with the
 * last error (TG_ERR_INVALID if none). Values held by the hooks are not
 * counted in tg_tape_saved_bytes and are not version-checked. NULL pack
 * removes the hooks; changing them while the tape holds handles is
 * TG_ERR_INVALID. */
typedef tg_status (*tg_pack_hook)(tg_tensor *saved, void **packed, void *userdata);
typedef tg_tensor *(*tg_unpack_hook)(void *packed, void *userdata);
typedef void (*tg_packed_free)(void *packed, void *userdata);
tg_status tg_tape_set_saved_hooks(tg_tape *tape, tg_pack_hook pack, tg_unpack_hook unpack,
                                  tg_packed_free free_fn, void *userdata);

/* Gradient-ready notification, for starting work on a leaf's gradient
 * while the sweep goes on (data-parallel training starts its all-reduce
 * this way: docs/distributed.md). During tg_backward and tg_backward_seed
 * over this tape, fn runs once for every leaf the record uses, as soon as
 * no node left in the sweep can add to its gradient, in the order the
 * sweep finishes them: grad is the leaf's whole gradient from this
 * backward (borrowed, read-only, valid during the call; before gradient
 * hooks and before it is added into tg_grad(leaf)), or NULL where no
 * gradient reached the leaf. A status other than TG_OK fails the backward
 * with it (no leaf gradient changes). tg_backward_ex and tg_grad_of do not
 * notify. NULL fn turns it off; one per tape. Cost when off: none. */
typedef tg_status (*tg_grad_ready_fn)(tg_tensor *leaf, const tg_tensor *grad, void *userdata);
tg_status tg_tape_set_grad_ready(tg_tape *tape, tg_grad_ready_fn fn, void *userdata);

/* ---- Replay: record a forward once, then run it again on new input values
 * without running the code that built it. Make the tape with opts.replay,
 * mark the tensors that will take new values with tg_tape_input, record
 * the forward once as usual; then each tg_tape_replay copies new values
 * into the inputs and re-runs every recorded op into the same tensors (the
 * loss tensor the first run returned holds the new loss), after which
 * tg_backward(loss) sweeps as after a recording. The gradients are bitwise
 * those of recording again, under every checkpoint policy. What does not
 * change: the ops, their attributes and every shape (a new shape needs a
 * new record: tg_tape_reset, then record again). Values made outside the
 * recorded forward (untracked tensors, results computed with grad
 * disabled) are constants of the program. The tape keeps every tensor of
 * the forward until tg_tape_reset or tg_tape_free (but the middle results
 * of fused runs, see tg_tape_replay): memory is the NONE policy's.
 * docs/replay.md has the details. */

/* Marks t (contiguous, any dtype) as an input of a replay tape: ops on it
 * are recorded but no gradient flows to it (tg_tensor_requires_grad is
 * false). TG_ERR_INVALID when the tape lacks opts.replay, t is a recorded
 * result, a strided view, or already requires grad on this tape;
 * TG_ERR_TAPE when it is a leaf of another tape. */
tg_status tg_tape_input(tg_tape *tape, tg_tensor *t);
/* Copies values[k] into inputs[k] (each marked with tg_tape_input; values
 * NULL: the inputs' current values, e.g. written in place; values[k] may be
 * inputs[k]), drops the record and runs the recorded forward again (from
 * the second replay on, under NONE with no segments, hooks or anomaly mode,
 * it keeps the record the last replay made and gives its nodes back their
 * saves instead: the same record, made faster; and, under NONE or
 * BALANCED with no segments, hooks or anomaly mode, it runs each run of
 * pointwise calls on one shape of 4096 elements or more, whose middle
 * results nothing but the program holds, as one fused call with one node,
 * unless opts.replay_unfused: the same bits, docs/replay.md). Errors
 * (nothing changed but the inputs' values): TG_ERR_INVALID without
 * opts.replay, with nothing recorded, for an input not marked, or when
 * called inside a backward or an op; TG_ERR_DTYPE, TG_ERR_SHAPE or
 * TG_ERR_DEVICE when values[k] differs from inputs[k] in dtype, shape or
 * backend. A failing op (TG_ERR_NONFINITE under anomaly mode, ...) leaves
 * no record (as after tg_tape_reset); the program is kept. */
tg_status tg_tape_replay(tg_tape *tape, int n, tg_tensor *const *inputs,
                         tg_tensor *const *values);
/* Steps of the replay program (op calls and segment marks; 0 without). */
int64_t tg_tape_replay_steps(const tg_tape *tape);
/* Steps of the program the last tg_tape_replay ran inside fused calls (0
 * without, or when none was fused). */
int64_t tg_tape_replay_fused_steps(const tg_tape *tape);

/* Writes the current record as Graphviz DOT to path: one box per node (op,
 * output dtype and shape, bytes saved; recompute nodes dashed), leaves and
 * untracked inputs as their own nodes. TG_ERR_IO if it cannot write. */
tg_status tg_tape_export_dot(const tg_tape *tape, const char *path);

/* Reverse sweep from loss, which must hold one element (else TG_ERR_SEED).
 * Gradients accumulate (+=) into the leaves' grads. Saved tensors and
 * intermediate gradients are freed as soon as the sweep no longer needs
 * them, so a second backward over the same record fails with TG_ERR_STALE
 * at the first node whose backward reads saved values (keep them with
 * tg_backward_ex's retain). Backward runs with grad recording disabled. */
tg_status tg_backward(tg_tensor *loss);
/* Same, seeding d(out) with seed, which must have out's shape and dtype
 * (else TG_ERR_SHAPE, the message naming both) and backend (TG_ERR_DEVICE). */
tg_status tg_backward_seed(tg_tensor *out, const tg_tensor *seed);

/* ---- Higher order and chosen gradients (docs/higher-order.md). */
typedef struct tg_grad_opts {
    /* Record the backward's own ops on the tape: the gradients it returns
     * are tracked tensors, usable in further ops and differentiable again
     * (to any order). Implies retain. */
    bool create_graph;
    /* Keep every node's saved tensors: the same record can be swept again
     * (without it, a second sweep through a node whose backward reads saved
     * values fails with TG_ERR_STALE; nodes that read none never do). */
    bool retain;
    /* tg_grad_of: an input no output depends on gets a zero gradient (else
     * TG_ERR_NO_GRAD naming it). */
    bool allow_unused;
} tg_grad_opts;

/* tg_backward / tg_backward_seed with options (NULL opts: tg_backward's
 * behaviour). seed NULL: out must hold one element and is seeded with 1.
 * Under create_graph each leaf's gradient is a tracked tensor: a first
 * one is stored as it is (not copied), and later ones are added to it by
 * a recorded add. Errors as tg_backward_seed's. */
tg_status tg_backward_ex(tg_tensor *out, const tg_tensor *seed, const tg_grad_opts *opts);
/* Gradients of sum_k <seeds[k], outs[k]> with respect to inputs[0..nin),
 * into grads[0..nin): PyTorch's torch.autograd.grad. seeds may be NULL
 * (every output then holds one element, seeded with 1) or hold NULL
 * entries for such outputs. Inputs may be leaves or interior results
 * (their gradient is the one flowing into them: an intermediate
 * gradient); an input listed twice gets the same tensor twice. Nothing is
 * accumulated into any leaf's grad, and only the nodes between the
 * outputs and the inputs are swept. Each result follows the op-result rule
 * (scope-owned inside a scope, else a new reference); under create_graph
 * they are tracked. Errors: TG_ERR_INVALID (counts, NULL arrays),
 * TG_ERR_NULL (a NULL output or input), TG_ERR_NO_GRAD (an untracked
 * output or input, or an input no output reaches without allow_unused),
 * TG_ERR_TAPE (two tapes), TG_ERR_STALE (a stale tensor, or a node freed
 * by an earlier sweep), TG_ERR_SEED / TG_ERR_SHAPE / TG_ERR_DEVICE (seeds);
 * on error every grads[j] is NULL. */
tg_status tg_grad_of(int nout, tg_tensor *const *outs, tg_tensor *const *seeds, int nin,
                     tg_tensor *const *inputs, tg_tensor **grads, const tg_grad_opts *opts);

/* Borrowed pointer to the accumulated gradient of leaf t; valid until
 * tg_grad_zero(t) or t's release. NULL with TG_ERR_NO_GRAD if t is not a
 * leaf, or if no backward has reached it yet. A later backward adds into it
 * in place while the leaf holds the only reference; one you retained stays
 * as it was, and the leaf gets the sum as a new tensor. */
tg_tensor *tg_grad(const tg_tensor *t);
/* Drops leaf t's gradient (the next backward starts from zero). */
void tg_grad_zero(tg_tensor *t);

/* New untracked tensor sharing t's storage (new reference). */
tg_tensor *tg_detach(tg_tensor *t);

/* Per-thread grad mode. When disabled, ops record nothing and return
 * untracked results (evaluation). Returns the previous setting. */
bool tg_grad_set_enabled(bool enabled);
bool tg_grad_enabled(void);

#endif
