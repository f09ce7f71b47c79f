/* Internal definitions shared by the library's modules: the tensor layout,
 * storage, error helpers and scope tracking. Not installed. */
#ifndef TG_CORE_INTERNAL_H
#define TG_CORE_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include <tapegrad.h>

#if defined(__GNUC__)
#define TG_INTERNAL __attribute__((visibility("hidden")))
/* initial-exec: a direct %fs-relative access instead of a __tls_get_addr
 * call per access in the shared library (which is linked, not dlopen'd). */
#define TG_THREAD_LOCAL _Thread_local __attribute__((tls_model("initial-exec")))
/* For the few functions on the per-node path that the compiler would
 * leave out of line (called from two sites): the node executor, the
 * unary maps' kernel calls. Measured by instruction count (cachegrind,
 * 100-tanh chain): about 45 instructions per node. */
#define TG_ALWAYS_INLINE inline __attribute__((always_inline))
/* The opposite, for a rare path that would otherwise be inlined into a hot
 * one (the executor with gradient sinks, tape/backward.c). */
#define TG_NOINLINE __attribute__((noinline))
#else
#define TG_INTERNAL
#define TG_THREAD_LOCAL _Thread_local
#define TG_ALWAYS_INLINE inline
#define TG_NOINLINE
#endif

/* 1 when built with AddressSanitizer: GCC defines __SANITIZE_ADDRESS__,
 * clang answers __has_feature(address_sanitizer). The memory caches
 * (tensor headers, large buffers) are off then, so that ASan sees every
 * free and a use after free is reported, not hidden by a reused block. */
#if defined(__SANITIZE_ADDRESS__)
#define TG_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TG_ASAN 1
#endif
#endif
#ifndef TG_ASAN
#define TG_ASAN 0
#endif

/* Data of one or more tensors (views share it). */
typedef struct tg_storage {
    /* Atomic: a pointwise region's blocks on the pool's threads make views
     * of one gradient or value at once. Tensor refcounts are per thread. */
    _Atomic int32_t refcount;
    tg_backend backend;
    bool inline_data;  /* data lives in the owner's small buffer, not the allocator */
    /* Bumped by every write path the user reaches (tg__tensor_written);
     * the tape compares it with what it recorded (versions). */
    uint32_t version;
    size_t nbytes;
    void *data;
    void *block;       /* freed when the storage dies: the tensor that embeds it */
} tg_storage;

/* Tensors of at most this many data bytes keep them inline: one allocation
 * per small tensor (scalars, the tape's 1-element chains). */
#define TG_SMALL_BYTES 64

struct tg_tape;

/* Every field before own_storage is set by header_new (tensor.c), one by
 * one: a new field needs a line there. */
struct tg_tensor {
    int32_t refcount;
    tg_dtype dtype;
    tg_backend backend;
    int ndim;
    int64_t shape[TG_MAX_DIMS];
    int64_t strides[TG_MAX_DIMS]; /* in elements */
    int64_t numel;
    int64_t offset;               /* in elements, into storage */
    bool contiguous;
    bool scope_owned;
    /* A tracked leaf's spec id in its tape's pool (tape/tape_internal.h),
     * valid while spec_epoch is the tape's: recording a leaf then hashes
     * nothing. 0 on a new header and on adoption by a tape. */
    uint32_t spec_epoch;
    tg_storage *storage;
    /* autodiff state: tape != NULL for leaves and recorded results */
    struct tg_tape *tape;
    uint32_t gen;   /* tape generation the slot belongs to */
    int32_t slot;   /* gradient slot in that generation */
    int64_t node;   /* producing node index, -1 for leaves */
    bool is_leaf;
    bool leaf_view; /* shares a leaf's storage (a transpose of a weight) */
    /* Tracked without a gradient: a replay input (tg_tape_input) or a
     * result recorded from such inputs only. Ops on it are recorded (so
     * tg_tape_replay re-runs them) but no gradient flows to it. */
    bool nograd;
    int32_t spec;    /* see spec_epoch */
    tg_tensor *grad; /* leaves: accumulated gradient */
    /* Leaves of a parameter set: the parameter's view of the set's flat
     * gradient buffer (borrowed; the set clears it before it lets go).
     * A backward that finds grad NULL writes the gradient there instead of
     * into a new tensor (backward.c, "gradient sinks"). NULL otherwise. */
    tg_tensor *gsink;
    /* The storage of a tensor made by tg__tensor_empty, and its data when
     * small. A view points at its base's; the base's memory then lives
     * until the storage dies. */
    tg_storage own_storage;
    _Alignas(16) unsigned char small[TG_SMALL_BYTES];
};

/* Reference counting on the library's own paths: the common case (a
 * count that stays above zero) inline, without a call or the full
 * function's register saves; the last release out of line. The public
 * tg_tensor_retain / tg_tensor_release do the same (tensor.c). */
TG_INTERNAL void tg__tensor_release_last(tg_tensor *t);
/* Frees the calling thread's spare tensor headers (tg_mem_trim). */
TG_INTERNAL void tg__headers_trim(void);

/* A stack of free blocks linked through each block's first word (the
 * freed-buffer cache, the spare headers): push and pop in O(1). */
static inline void tg__stack_push(void **head, void *block)
{
    memcpy(block, head, sizeof *head);
    *head = block;
}
static inline void *tg__stack_pop(void **head)
{
    void *block = *head;
    if (block) memcpy(head, block, sizeof *head);
    return block;
}
static inline tg_tensor *tg__retain(tg_tensor *t)
{
    if (t) t->refcount++;
    return t;
}
static inline void tg__release(tg_tensor *t)
{
    if (t && --t->refcount <= 0) tg__tensor_release_last(t);
}
#define tg_tensor_retain(t) tg__retain(t)
#define tg_tensor_release(t) tg__release(t)

/* Writes through the API since the process started (any thread, any
 * tensor): a tape whose record saw no write since its first node skips
 * the version checks (tensor.c). */
TG_INTERNAL extern _Atomic uint64_t tg__writes;
/* t's elements are about to be written (or were) through a path the user
 * reaches: the mutable data accessor, initialisers, optimizer steps,
 * parameter loads. Bumps the storage's version and, when t is a live
 * recorded result, marks its node (tg__tape_note_write). */
TG_INTERNAL void tg__tensor_written(tg_tensor *t);

/* ---- errors (src/core/status.c) */
TG_INTERNAL tg_status tg__err(tg_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* NULL input #argi (1-based) to op: keeps a pending error, else records
 * TG_ERR_NULL. Returns the pending code. */
TG_INTERNAL tg_status tg__err_null(const char *op, int argi);

/* ---- allocation (src/core/alloc.c): all tensor storage goes through here */
TG_INTERNAL void *tg__data_alloc(size_t nbytes);
TG_INTERNAL void tg__data_free(void *p, size_t nbytes);
/* Counts inline tensor data in the memory accounting (no allocation). */
TG_INTERNAL void tg__mem_count(size_t nbytes);
TG_INTERNAL void tg__mem_uncount(size_t nbytes);
/* Publishes the calling thread's batched count (alloc.c): pool tasks and
 * replica steps end with it; tg__mem_thread_exit at thread exit. */
TG_INTERNAL void tg__mem_flush(void);
TG_INTERNAL void tg__mem_thread_exit(void);
/* Hands the calling thread's cached free buffers and the shared cache's back to
 * the allocator (alloc.c). */
TG_INTERNAL void tg__data_trim(void);
/* Moves the calling thread's cached buffers to the shared cache (or frees
 * them) and closes its cache: at thread exit. */
TG_INTERNAL void tg__data_thread_exit(void);

/* ---- tensors (src/core/tensor.c) */
/* New contiguous tensor with uninitialised data, not scope-tracked. */
TG_INTERNAL tg_tensor *tg__tensor_empty(tg_dtype dtype, int ndim, const int64_t *shape,
                                        tg_backend backend);
TG_INTERNAL tg_tensor *tg__tensor_empty_spec(const tg_spec *spec, tg_backend backend);
/* New header sharing t's storage with the given shape/strides/offset. */
TG_INTERNAL tg_tensor *tg__tensor_view(const tg_tensor *t, int ndim, const int64_t *shape,
                                       const int64_t *strides, int64_t offset);
/* Element sizes by dtype, and the first element of t (hot: inlined). */
static inline size_t tg__esize(tg_dtype dt)
{
    return dt == TG_F32 ? 4 : 8;
}

static inline void *tg__tensor_ptr(const tg_tensor *t)
{
    return (char *)t->storage->data + (size_t)t->offset * tg__esize(t->dtype);
}
/* Called on every op (dispatch, record, backward): inlined. */
static inline int64_t tg__numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

static inline void tg__contig_strides(int ndim, const int64_t *shape, int64_t *strides)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
}

/* A double as i64, saturating: NaN gives 0, values at or past the ends of
 * i64's range (infinities too) give INT64_MIN or INT64_MAX, the rest are
 * truncated toward zero. C leaves the plain cast undefined there. The one
 * conversion every float -> i64 path uses (tg_cast, fills, tg_full). */
static inline int64_t tg__sat_i64(double v)
{
    if (v != v) return 0;
    if (v >= 0x1p63) return INT64_MAX;
    if (v <= -0x1p63) return INT64_MIN;
    return (int64_t)v;
}

static inline bool tg__is_float(tg_dtype dt)
{
    return dt == TG_F32 || dt == TG_F64;
}

/* The whole shape array is copied (dims past ndim are 0 in every tensor),
 * so specs compare and print the same however they were made. */
static inline void tg__spec_of(const tg_tensor *t, tg_spec *spec)
{
    spec->dtype = t->dtype;
    spec->ndim = t->ndim;
    memcpy(spec->shape, t->shape, sizeof spec->shape);
}

static inline bool tg__same_shape(int na, const int64_t *a, int nb, const int64_t *b)
{
    if (na != nb) return false;
    for (int i = 0; i < na; i++)
        if (a[i] != b[i]) return false;
    return true;
}
/* The tape's hold on tensors. Core knows no tape: a tracked tensor
 * (t->tape != NULL) owns one reference to its tape, and when the tensor
 * dies core hands that reference back through this hook, which the tape
 * installs (tape.c) before the first tape exists, so it is set whenever a
 * tensor has a tape. The hook must not touch the dying tensor. */
typedef void (*tg_tape_release_fn)(struct tg_tape *tape);
TG_INTERNAL void tg__tensor_set_tape_release(tg_tape_release_fn fn);
/* Validates creation arguments (ndim, shape, dtype); records errors as op. */
TG_INTERNAL tg_status tg__check_shape(const char *op, int ndim, const int64_t *shape);
TG_INTERNAL tg_status tg__check_dtype(const char *op, tg_dtype dtype);

/* ---- grad mode (src/tape/tape.c), read on every op */
extern TG_THREAD_LOCAL bool tg__grad_disabled;
/* Depth of registered ops' forward/backward calls running on this thread
 * (dispatch, the node executor). An op writes only its new outputs, so
 * tg_tensor_data inside one is a read of its inputs, not a write. */
extern TG_THREAD_LOCAL int tg__in_op;
/* The op whose backward a create_graph sweep is recording (tape/grad.c),
 * NULL otherwise: dispatch names it when that backward calls an op that
 * cannot be differentiated. */
extern TG_THREAD_LOCAL const char *tg__backward_of;
/* Whether t (contiguous, untracked, owned by no scope) and its storage are
 * reachable only through the refs references its caller holds: then
 * nobody else can see a write into it (a gradient kept for the caller, a
 * seed, a view of another gradient all hold more). */
static inline bool tg__held_only(const tg_tensor *t, int refs)
{
    return t->refcount == refs && t->storage->refcount == 1 && t->contiguous &&
           !t->scope_owned && !t->tape;
}

/* Whether an op on t would be recorded now: a backward's fast path that
 * calls kernels directly is only right when nothing records (first-order
 * backward runs with grad off; create_graph with it on). */
static inline bool tg__records(const tg_tensor *t)
{
    return !tg__grad_disabled && t && t->tape;
}

/* ---- data-parallel replicas (src/train/replicas.c). On a worker thread
 * during tg_replicas_step, the worker's replica: dispatch hands every op
 * the worker's own leaf in place of a parameter tensor (tg__replica_args).
 * NULL everywhere else, so the check is one load per op. */
struct tg__replica;
extern TG_THREAD_LOCAL const struct tg__replica *tg__replica_active;
/* in[0..n) with each parameter tensor of r replaced by r's leaf for it,
 * written to sub; returns sub. */
TG_INTERNAL tg_tensor *const *tg__replica_args(const struct tg__replica *r, int n,
                                               tg_tensor *const *in, tg_tensor **sub);
/* Whether anything watches tape's gradients as a sweep makes them (hooks,
 * anomaly mode, gradient-ready notification): a gradient made later than
 * its node (a deferred weight gradient) would escape it (hooks.c). */
TG_INTERNAL bool tg__tape_grads_observed(const struct tg_tape *tape);
/* For each of the n leaves, how many node inputs of tape's record read it
 * (a leaf read once gets one gradient contribution; 0 for one the record
 * does not read), -1 for all when out of memory (tape.c). */
TG_INTERNAL void tg__tape_leaf_uses(const struct tg_tape *tape, int n, tg_tensor *const *leaves,
                                    int32_t *uses);
/* Affine's backward on a worker (matmul.c), before it makes the gradient of
 * its weight w, m rows of output gradient g (m, n) and input x (m, k), both
 * contiguous: true when the worker takes that GEMM over (both retained
 * until the reduce, which computes the weight's rows from every worker's
 * pair; replicas.c says when), false when the op must make it itself. */
TG_INTERNAL bool tg__replica_defer_wgrad(const struct tg__replica *r, const tg_tensor *w,
                                         tg_tensor *g, tg_tensor *x, int64_t m, int64_t n,
                                         int64_t k);

/* ---- scopes (src/core/scope.c) */
#define TG__MAX_SCOPES 64
/* The calling thread's scopes: a stack of owned tensors with one mark per
 * open scope. One struct, so that a scope call computes one TLS address. */
typedef struct tg__scopes {
    tg_tensor **items;
    size_t nitems, capitems;
    /* marks: small_marks until the depth passes TG__MAX_SCOPES, then
     * big_marks (freed back at depth 0) */
    size_t *marks;
    size_t *big_marks;
    int cap; /* of marks */
    int depth;
    int overflow; /* scopes opened when the marks could not grow */
    size_t small_marks[TG__MAX_SCOPES];
} tg__scopes;
TG_INTERNAL extern TG_THREAD_LOCAL tg__scopes tg__S;
/* tg__scope_track when the list is full (grows it; NULL, t released, when
 * it cannot). */
TG_INTERNAL tg_tensor *tg__scope_track_grow(tg_tensor *t);
/* Hands t to the innermost scope if one is open. Returns t (NULL when the
 * list could not grow: t is then released and the error recorded). */
static inline tg_tensor *tg__scope_track(tg_tensor *t)
{
    tg__scopes *s = &tg__S;
    if (!t || s->depth == 0) return t;
    if (__builtin_expect(s->nitems == s->capitems, 0)) return tg__scope_track_grow(t);
    s->items[s->nitems++] = t;
    t->scope_owned = true;
    return t;
}
/* An outermost scope's end frees a list of more than this many entries
 * that the scope used less than a quarter of (scope.c). */
#define TG__SCOPE_KEEP_ITEMS 4096
/* Releases the scope's tensors above mark, newest first, so results go
 * before what they were built from. */
static inline void tg__scope_release_to(tg__scopes *s, size_t mark)
{
    while (s->nitems > mark) {
        tg_tensor *t = s->items[--s->nitems];
        t->scope_owned = false;
        tg__release(t);
    }
}
/* tg_scope_begin / tg_scope_end inline, for the node executor's private
 * scope around every backward call: the common case (marks in place, a
 * scope around it) here, anything else through the functions. */
static inline void tg__scope_begin_inline(void)
{
    tg__scopes *s = &tg__S;
    if (__builtin_expect(s->marks && !s->overflow && s->depth < s->cap, 1))
        s->marks[s->depth++] = s->nitems;
    else
        tg_scope_begin();
}
static inline void tg__scope_end_inline(void)
{
    tg__scopes *s = &tg__S;
    /* The outermost scope's end may free the arrays (scope.c): not here. */
    if (__builtin_expect(!s->overflow && s->depth > 0 &&
                             (s->depth > 1 ||
                              (s->capitems <= TG__SCOPE_KEEP_ITEMS && !s->big_marks)),
                         1)) {
        size_t mark = s->marks[--s->depth];
        tg__scope_release_to(s, mark);
    } else {
        tg_scope_end();
    }
}
/* At thread exit: ends the scopes still open and frees the arrays. */
TG_INTERNAL void tg__scope_thread_exit(void);

/* ---- per-thread state (src/core/tensor.c) */
/* Arranges for the calling thread's caches and scope arrays to be freed
 * when it exits; false if that cannot be arranged (then cache nothing). */
TG_INTERNAL bool tg__thread_register(void);
/* Frees the calling thread's spare pointwise-region buffers
 * (src/tape/region.c): at thread exit and in tg_mem_trim. */
TG_INTERNAL void tg__region_trim(void);

/* ---- dispatch hooks the tape uses without including dispatch
 * (src/dispatch/registry.c) */
TG_INTERNAL void tg__registry_init(void);
/* Set (release) once the built-ins are registered. */
TG_INTERNAL extern _Atomic bool tg__registry_done;
/* tg__registry_init on the first call only: one acquire load per op. */
static inline void tg__registry_ready(void)
{
    if (!atomic_load_explicit(&tg__registry_done, memory_order_acquire)) tg__registry_init();
}

#endif
