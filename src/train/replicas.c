/* Data-parallel steps on worker threads (include/tapegrad/replicas.h).
 *
 * Each worker owns a tape and one leaf per trainable parameter: a view of
 * the parameter's values (same storage, so no copy) marked on the worker's
 * tape. While the worker runs the user's loss function, dispatch swaps
 * the parameter tensors for the worker's leaves (tg__replica_args), so the
 * ops record on the worker's tape and backward leaves the gradients on the
 * worker's leaves. The workers then add them up, each a share of the
 * elements, every element in worker order, into the parameter set's flat
 * gradient buffer (and, with an optimizer, update that share).
 *
 * Deferred weight gradients. With two or more workers, the gradient of an
 * affine layer's weight, dW = g^T x over the worker's rows, is the bulk of
 * what the reduce would read across cores (2.7 MB a step on the mlp). So a
 * worker's affine backward may leave that GEMM undone and keep its g and x
 * instead (tg__replica_defer_wgrad); in the reduce each worker then makes
 * its share of dW's rows from every worker's pair, GEMM after GEMM into the
 * flat buffer (beta 1 after the first), and updates them: it reads the
 * other workers' activations and output gradients (a fraction of dW's
 * size) instead of their whole gradients. With two workers each makes its
 * own term of its rows in its backward, while g is in its cache, and the
 * reduce adds the other's (a sum of two terms is the same either way
 * round). That sum is the one the plain reduce makes, in worker order;
 * where it would not give the same bits (chain_exact checks each shape
 * once on the backend's own GEMM, and the scales must be equal powers of
 * two), the worker makes its GEMM itself.
 *
 * Where the slices are cut matters: a GEMM kernel works on tiles of its
 * output, and an edge tile may sum in another order than a whole one
 * (OpenBLAS 0.3.21's Haswell sgemm, also used on AMD Zen, works on dW's
 * rows 12 at a time and sums a remainder of fewer rows in another order).
 * A slice that starts at a multiple of the tile has the tiles of the
 * whole GEMM. So the cuts are at multiples of a quantum, the first of
 * CHAIN_QUANTA whose chained GEMMs the check finds exact. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/kernels.h"
#include "backend/parallel.h"
#include "dispatch/dispatch.h"
#include "train/train_internal.h"

TG_THREAD_LOCAL const struct tg__replica *tg__replica_active;

/* A weight gradient a worker's affine backward left to the reduce:
 * dW (n, k) = g^T x over the worker's m rows. g NULL: none. */
typedef struct wdefer {
    tg_tensor *g, *x; /* retained */
    int64_t m, n, k;
    int quantum; /* the rows' cut (part_rows) of the worker's own term, made in backward */
    bool refused; /* the step would have deferred it, but its shape does not chain exactly */
} wdefer;

/* One worker's stand-ins: keys[i] (a parameter's tensor, sorted by
 * address) -> leaves[i]; for the current step, whether leaves[i]'s weight
 * gradient may be deferred (defer_ok[i]) and the one that was (defer[i]). */
typedef struct tg__replica {
    const tg_tensor **keys;
    tg_tensor **leaves;
    int n;
    struct tg_replicas *set;
    bool *defer_ok;
    wdefer *defer;
    /* Two workers: each makes its own share of a deferred weight's rows
     * from its own pair in its backward, into flat[i] (leaf i's view of
     * the flat buffer); the reduce adds the other's (the sum of two terms
     * is the same in either order). */
    void **flat;
    int part, parts;
    /* Per leaf: the cut's quantum found exact (the set's chain_state), or
     * <= 0 where none is known yet: the own term is then cut at
     * CHAIN_QUANTA[0], and checked in the reduce. */
    const signed char *quantum;
    /* In the worker's own backward of its loss (run_shard): only that
     * sweep defers, not one the loss function runs (tg_grad_of sweeps a
     * weight's node and drops its gradient). */
    bool sweeping;
} tg__replica;

typedef struct worker {
    struct tg_replicas *set;
    int index;
    pthread_t thread;
    bool started;
    tg_tape *tape;
    tg__replica rep;
    int *param_of; /* leaves[i] stands for parameter param_of[i] of ps */
    /* The job of the current step. */
    int64_t row0, rows;
    double loss;
    tg_status status;
    char message[512];
    double end_s; /* when its backward ended */
} worker;

typedef struct reduce_seg reduce_seg;

/* One parameter's part of the reduce: dst (+)= sum_k s[k] * src[k], the
 * sum taken in worker order. Deferred (a weight every worker deferred):
 * dst (rows, cols) = scale * sum_k gk[k]^T xk[k] (mk[k] rows each), row
 * slices of it made by the parts. */
struct reduce_seg {
    void *dst;
    const void *src[TG_REPLICAS_MAX_WORKERS];
    double s[TG_REPLICAS_MAX_WORKERS];
    int nsrc;
    bool add, f64;
    int64_t n;
    int param; /* index in the parameter set */
    bool deferred;
    const void *gk[TG_REPLICAS_MAX_WORKERS], *xk[TG_REPLICAS_MAX_WORKERS];
    int64_t mk[TG_REPLICAS_MAX_WORKERS];
    int64_t rows, cols;
    double scale;
    tg_gemm_fn gemm;
    bool own_first; /* two workers: each part's own term is in already */
    int quantum;    /* the rows are cut at multiples of it (part_rows) */
};


struct tg_replicas {
    tg_params *ps;
    tg_replicas_opts o;
    worker *w;
    int nparams; /* ps->n when the leaves were made */
    /* The step every worker runs (set by the caller under mu). */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    _Atomic uint64_t round;
    _Atomic int pending;
    _Atomic bool quit;
    int nin;
    tg_tensor *const *inputs;
    tg_replica_fn fn;
    void *ud;
    tg_backend backend;
    double t0, compute_s, reduce_s;
    bool reducing; /* the round is the reduce, not a step */
    _Atomic int reduced; /* parts of this reduce that are done with every pair */
    reduce_seg *seg; /* one per trainable parameter */
    int nseg;
    int64_t reduce_total; /* elements of the segments that are not deferred */
    bool defer_step;      /* this step's scales let weight gradients be deferred */
    int ndeferred;        /* deferred segments of the last reduce */
    int nrefused;         /* weights the last reduce could not chain exactly */
    /* Per leaf (worker 0's order): chain_exact's verdict, the quantum
     * (> 0) found exact for the rows in chain_m (workers entries), 0
     * unchecked; -1: never defer. */
    signed char *chain_state;
    int64_t *chain_m;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int key_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (const tg_tensor *const *)a, y = (uintptr_t) * (const tg_tensor *const *)b;
    return (x > y) - (x < y);
}

tg_tensor *const *tg__replica_args(const tg__replica *r, int n, tg_tensor *const *in,
                                   tg_tensor **sub)
{
    for (int i = 0; i < n; i++) {
        sub[i] = in[i];
        if (!in[i]) continue;
        int lo = 0, hi = r->n - 1;
        while (lo <= hi) {
            int mid = (lo + hi) / 2;
            if (r->keys[mid] == in[i]) {
                sub[i] = r->leaves[mid];
                break;
            }
            if ((uintptr_t)r->keys[mid] < (uintptr_t)in[i])
                lo = mid + 1;
            else
                hi = mid - 1;
        }
    }
    return sub;
}

/* Drops what w's leaves deferred (nothing after a reduce has used it). */
static void wdefer_drop(worker *w)
{
    for (int i = 0; w->rep.defer && i < w->rep.n; i++) {
        wdefer *d = &w->rep.defer[i];
        if (!d->g) continue;
        tg_tensor_release(d->g);
        tg_tensor_release(d->x);
        d->g = d->x = NULL;
    }
}

static void replica_clear(worker *w)
{
    wdefer_drop(w);
    for (int i = 0; i < w->rep.n; i++) tg_tensor_release(w->rep.leaves[i]);
    free(w->rep.keys);
    free(w->rep.leaves);
    free(w->param_of);
    free(w->rep.defer_ok);
    free(w->rep.defer);
    free(w->rep.flat);
    w->rep.keys = NULL;
    w->rep.leaves = NULL;
    w->param_of = NULL;
    w->rep.defer_ok = NULL;
    w->rep.defer = NULL;
    w->rep.flat = NULL;
    w->rep.n = 0;
}

/* (Re)makes every worker's leaves for the parameters ps has now. */
static tg_status make_leaves(tg_replicas *r)
{
    tg_params *ps = r->ps;
    int n = 0;
    for (int i = 0; i < ps->n; i++) n += ps->p[i].pool < TG__POOL_TRAINABLE;
    free(r->seg);
    free(r->chain_state);
    free(r->chain_m);
    r->seg = n ? malloc((size_t)n * sizeof *r->seg) : NULL;
    r->chain_state = n ? calloc((size_t)n, sizeof *r->chain_state) : NULL;
    r->chain_m = n ? calloc((size_t)n * (size_t)r->o.workers, sizeof *r->chain_m) : NULL;
    if (n && (!r->seg || !r->chain_state || !r->chain_m))
        return tg__err(TG_ERR_NOMEM, "out of memory for the replicas' reduce");
    for (int k = 0; k < r->o.workers; k++) {
        worker *w = &r->w[k];
        replica_clear(w);
        tg_tape_reset(w->tape);
        if (!n) continue;
        typedef struct {
            const tg_tensor *key;
            int param;
        } pair;
        pair *pairs = malloc((size_t)n * sizeof *pairs);
        w->rep.keys = malloc((size_t)n * sizeof *w->rep.keys);
        w->rep.leaves = calloc((size_t)n, sizeof *w->rep.leaves);
        w->param_of = malloc((size_t)n * sizeof *w->param_of);
        w->rep.set = r;
        w->rep.defer_ok = calloc((size_t)n, sizeof *w->rep.defer_ok);
        w->rep.defer = calloc((size_t)n, sizeof *w->rep.defer);
        w->rep.flat = calloc((size_t)n, sizeof *w->rep.flat);
        w->rep.part = k;
        w->rep.parts = r->o.workers;
        w->rep.quantum = r->chain_state;
        if (!pairs || !w->rep.keys || !w->rep.leaves || !w->param_of || !w->rep.defer_ok ||
            !w->rep.defer || !w->rep.flat) {
            free(pairs);
            replica_clear(w);
            return tg__err(TG_ERR_NOMEM, "out of memory for the replicas' leaves");
        }
        int j = 0;
        for (int i = 0; i < ps->n; i++)
            if (ps->p[i].pool < TG__POOL_TRAINABLE) pairs[j++] = (pair){ps->p[i].value, i};
        qsort(pairs, (size_t)n, sizeof *pairs, key_cmp); /* key is the first member */
        for (j = 0; j < n; j++) {
            const tg_tensor *v = pairs[j].key;
            w->rep.keys[j] = v;
            w->param_of[j] = pairs[j].param;
            w->rep.leaves[j] = tg__tensor_view(v, v->ndim, v->shape, v->strides, v->offset);
            w->rep.n = j + 1;
            tg_status st = w->rep.leaves[j] ? tg_requires_grad(w->tape, w->rep.leaves[j])
                                            : TG_ERR_NOMEM;
            if (st) {
                free(pairs);
                replica_clear(w);
                return st;
            }
        }
        free(pairs);
    }
    r->nparams = ps->n;
    return TG_OK;
}

/* The cuts chain_exact tries, in order: 16 suits kernels whose tiles
 * divide it (OpenBLAS's SkylakeX sgemm), 12 the Haswell sgemm's, 48 both
 * (at a worse balance). */
static const int CHAIN_QUANTA[] = {16, 12, 48};
#define N_QUANTA (int)(sizeof CHAIN_QUANTA / sizeof *CHAIN_QUANTA)

/* The rows [*lo, *hi) of a deferred weight's n that part `part` of `parts`
 * makes: equal shares, cut at multiples of q rows. */
static void part_rows(int64_t n, int part, int parts, int q, int64_t *lo, int64_t *hi)
{
    *lo = part ? (n * part / parts) / q * q : 0;
    *hi = part + 1 < parts ? (n * (part + 1) / parts) / q * q : n;
}

/* Before w's backward: a leaf's weight gradient may be deferred only when
 * the record reads the leaf once (its one gradient contribution: nothing
 * is added to it in the sweep's order that the reduce would reorder). */
static void wdefer_prepare(worker *w)
{
    bool any = false;
    for (int i = 0; i < w->rep.n; i++) any |= w->rep.defer_ok[i];
    if (!any) return;
    int32_t one[16], *uses = w->rep.n <= 16 ? one : malloc((size_t)w->rep.n * sizeof *uses);
    if (uses) tg__tape_leaf_uses(w->tape, w->rep.n, w->rep.leaves, uses);
    for (int i = 0; i < w->rep.n; i++)
        if (!uses || uses[i] != 1) w->rep.defer_ok[i] = false;
    if (uses != one) free(uses);
}

/* Makes w's deferred weight gradient of leaf i on w's own rows, into the
 * gradient the leaf has (added) or a new one, and drops the pair. */
static tg_status wdefer_own(worker *w, int i)
{
    wdefer *d = &w->rep.defer[i];
    tg_tensor *leaf = w->rep.leaves[i];
    double beta = 1.0;
    if (!leaf->grad) {
        leaf->grad = tg__tensor_empty(d->g->dtype, 2, (int64_t[]){d->n, d->k}, d->g->backend);
        if (!leaf->grad) return TG_ERR_NOMEM;
        beta = 0.0;
    }
    TG_KERNEL(tg_gemm_fn, TG_K_GEMM, d->g)(true, false, d->n, d->k, d->m, tg__tensor_ptr(d->g),
                                            d->n, tg__tensor_ptr(d->x), d->k, beta,
                                            tg__tensor_ptr(leaf->grad), d->k);
    tg_tensor_release(d->g);
    tg_tensor_release(d->x);
    d->g = d->x = NULL;
    return TG_OK;
}

bool tg__replica_defer_wgrad(const tg__replica *rp, const tg_tensor *w, tg_tensor *g, tg_tensor *x,
                             int64_t m, int64_t n, int64_t k)
{
    for (int j = 0; j < rp->n; j++) {
        if (rp->leaves[j] != w) continue;
        wdefer *d = &rp->defer[j];
        if (!rp->sweeping || !rp->defer_ok[j] || d->g || g->dtype != x->dtype ||
            g->backend != x->backend || g->dtype != w->dtype || g->backend != w->backend)
            return false;
        if (rp->quantum[j] < 0) {
            d->refused = true;
            return false;
        }
        int q = rp->quantum[j] > 0 ? rp->quantum[j] : CHAIN_QUANTA[0];
        *d = (wdefer){.g = tg_tensor_retain(g), .x = tg_tensor_retain(x), .m = m, .n = n, .k = k,
                      .quantum = q};
        int64_t lo, hi;
        part_rows(n, rp->part, rp->parts, q, &lo, &hi);
        if (rp->parts == 2 && lo < hi) {
            size_t es = tg_dtype_size(g->dtype);
            TG_KERNEL(tg_gemm_fn, TG_K_GEMM, g)(true, false, hi - lo, k, m,
                                                (const char *)tg__tensor_ptr(g) + (size_t)lo * es,
                                                n, tg__tensor_ptr(x), k, 0.0,
                                                (char *)rp->flat[j] + (size_t)(lo * k) * es, k);
        }
        return true;
    }
    return false;
}

/* Worker k's part of the step, on its own thread (k = 0: the caller's). */
static void run_shard(tg_replicas *r, worker *w)
{
    w->status = TG_OK;
    w->message[0] = '\0';
    w->loss = 0;
    if (w->rows == 0) {
        w->end_s = now_s();
        return;
    }
    tg_backend prev_backend = tg_set_default_backend(r->backend);
    bool prev_grad = tg_grad_set_enabled(true);
    for (int i = 0; i < w->rep.n; i++) tg_grad_zero(w->rep.leaves[i]);
    tg_error_clear();
    tg_scope_begin();
    tg_tensor *shard[TG_REPLICAS_MAX_INPUTS];
    tg_status st = TG_OK;
    for (int i = 0; i < r->nin && !st; i++) {
        const tg_tensor *x = r->inputs[i];
        int64_t shape[TG_MAX_DIMS];
        memcpy(shape, x->shape, sizeof shape);
        shape[0] = w->rows;
        shard[i] = tg__scope_track(tg__tensor_view(x, x->ndim, shape, x->strides,
                                                   x->offset + w->row0 * x->strides[0]));
        if (!shard[i]) st = TG_ERR_NOMEM;
    }
    tg_replica_info info = {.worker = w->index, .workers = r->o.workers, .tape = w->tape,
                            .row0 = w->row0, .rows = w->rows};
    tg__replica_active = &w->rep;
    tg_tensor *loss = st ? NULL : r->fn(r->ud, &info, r->nin, shard);
    if (!st && !loss) {
        st = tg_last_error() ? tg_last_error() : TG_ERR_INVALID;
        if (!tg_last_error()) tg__err(st, "the loss function returned NULL without an error");
    } else if (!st && tg_tensor_numel(loss) != 1) {
        st = tg__err(TG_ERR_SEED, "the loss function returned %lld elements, not a scalar",
                     (long long)tg_tensor_numel(loss));
    } else if (!st && !tg_tensor_requires_grad(loss)) {
        st = tg__err(TG_ERR_NO_GRAD, "the loss does not depend on any parameter");
    }
    if (!st) st = tg_tensor_item(loss, &w->loss);
    if (!st) wdefer_prepare(w);
    w->rep.sweeping = true;
    if (!st) st = tg_backward(loss);
    w->rep.sweeping = false;
    for (int i = 0; i < w->rep.n && !st; i++)
        if (w->rep.defer[i].g && w->rep.leaves[i]->grad) st = wdefer_own(w, i);
    if (st) wdefer_drop(w);
    tg__replica_active = NULL;
    tg_scope_end();
    tg_tape_reset(w->tape);
    if (st) snprintf(w->message, sizeof w->message, "%s", tg_last_error_message());
    w->status = st;
    tg_grad_set_enabled(prev_grad);
    tg_set_default_backend(prev_backend);
    w->end_s = now_s();
}

static void reduce_part(const tg_replicas *r, int part, int parts);
static void reduce_then_drop(tg_replicas *r, worker *w);

/* Handing a round over: a worker (or the caller, waiting for the round to
 * end) first spins for about this many checks, then sleeps on the
 * condition variable. A round ends in well under a millisecond when the
 * model is small, less than a futex wake-up takes to come back. */
#define SPIN_CHECKS 20000

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    tg_replicas *r = w->set;
    uint64_t seen = 0;
    for (;;) {
        for (int i = 0; i < SPIN_CHECKS && atomic_load_explicit(&r->round, memory_order_acquire) ==
                                               seen && !atomic_load(&r->quit); i++)
            cpu_relax();
        if (atomic_load_explicit(&r->round, memory_order_acquire) == seen) {
            pthread_mutex_lock(&r->mu);
            while (!atomic_load(&r->quit) && atomic_load(&r->round) == seen)
                pthread_cond_wait(&r->go, &r->mu);
            pthread_mutex_unlock(&r->mu);
        }
        if (atomic_load(&r->quit)) break;
        seen = atomic_load_explicit(&r->round, memory_order_acquire);
        if (r->reducing)
            reduce_then_drop(r, w);
        else
            run_shard(r, w);
        tg__mem_flush(); /* before the caller can read the counters */
        if (atomic_fetch_sub_explicit(&r->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&r->mu);
            pthread_cond_signal(&r->done);
            pthread_mutex_unlock(&r->mu);
        }
    }
    return NULL;
}

tg_replicas *tg_replicas_new(tg_params *ps, const tg_replicas_opts *opts)
{
    if (!ps) {
        tg__err(TG_ERR_NULL, "bad argument #1 to 'replicas_new' (NULL parameter set)");
        return NULL;
    }
    tg_replicas_opts o = opts ? *opts : (tg_replicas_opts){.workers = 1};
    if (o.workers < 1 || o.workers > TG_REPLICAS_MAX_WORKERS) {
        tg__err(TG_ERR_INVALID, "bad argument #2 to 'replicas_new' (%d workers; need 1..%d)",
                o.workers, TG_REPLICAS_MAX_WORKERS);
        return NULL;
    }
    if (o.reduce != TG_REDUCE_MEAN && o.reduce != TG_REDUCE_SUM) {
        tg__err(TG_ERR_INVALID, "bad argument #2 to 'replicas_new' (reduce %d is neither "
                                "TG_REDUCE_MEAN nor TG_REDUCE_SUM)", (int)o.reduce);
        return NULL;
    }
    if (o.optim && tg_optim_params(o.optim) != ps) {
        tg__err(TG_ERR_INVALID, "bad argument #2 to 'replicas_new' (the optimizer is over "
                                "another parameter set)");
        return NULL;
    }
    tg_replicas *r = calloc(1, sizeof *r);
    worker *w = calloc((size_t)o.workers, sizeof *w);
    if (!r || !w) {
        free(r);
        free(w);
        tg__err(TG_ERR_NOMEM, "out of memory for %d replicas", o.workers);
        return NULL;
    }
    r->ps = ps;
    r->o = o;
    r->w = w;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->go, NULL);
    pthread_cond_init(&r->done, NULL);
    for (int k = 0; k < o.workers; k++) {
        w[k].set = r;
        w[k].index = k;
        w[k].tape = tg_tape_new(&o.tape);
        if (!w[k].tape) {
            tg_replicas_free(r);
            return NULL;
        }
    }
    if (make_leaves(r)) {
        tg_replicas_free(r);
        return NULL;
    }
    for (int k = 1; k < o.workers; k++) {
        int rc = pthread_create(&w[k].thread, NULL, worker_main, &w[k]);
        if (rc) {
            tg__err(TG_ERR_NOMEM, "cannot start replica worker %d: %s", k, strerror(rc));
            tg_replicas_free(r);
            return NULL;
        }
        w[k].started = true;
    }
    return r;
}

void tg_replicas_free(tg_replicas *r)
{
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    atomic_store(&r->quit, true);
    pthread_cond_broadcast(&r->go);
    pthread_mutex_unlock(&r->mu);
    for (int k = 0; k < r->o.workers; k++) {
        if (r->w[k].started) pthread_join(r->w[k].thread, NULL);
        replica_clear(&r->w[k]);
        tg_tape_free(r->w[k].tape);
    }
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->go);
    pthread_cond_destroy(&r->done);
    free(r->seg);
    free(r->chain_state);
    free(r->chain_m);
    free(r->w);
    free(r);
}

int tg_replicas_workers(const tg_replicas *r)
{
    return r ? r->o.workers : 0;
}

tg_tape *tg_replicas_tape(const tg_replicas *r, int worker)
{
    if (!r || worker < 0 || worker >= r->o.workers) {
        tg__err(r ? TG_ERR_INVALID : TG_ERR_NULL, "bad argument #%d to 'replicas_tape' (%s)",
                r ? 2 : 1, r ? "no such worker" : "NULL replica set");
        return NULL;
    }
    return r->w[worker].tape;
}

void tg_replicas_last_timing(const tg_replicas *r, double *compute_s, double *reduce_s)
{
    if (compute_s) *compute_s = r ? r->compute_s : 0;
    if (reduce_s) *reduce_s = r ? r->reduce_s : 0;
}

int tg_replicas_last_deferred(const tg_replicas *r)
{
    return r ? r->ndeferred : 0;
}

int tg_replicas_last_refused(const tg_replicas *r)
{
    return r ? r->nrefused : 0;
}

static tg_status check_inputs(int n, tg_tensor *const *inputs, int64_t *rows)
{
    if (n < 1 || n > TG_REPLICAS_MAX_INPUTS)
        return tg__err(TG_ERR_INVALID, "bad argument #2 to 'replicas_step' (%d inputs; need "
                                       "1..%d)", n, TG_REPLICAS_MAX_INPUTS);
    if (!inputs) return tg__err(TG_ERR_NULL, "bad argument #3 to 'replicas_step' (NULL inputs)");
    for (int i = 0; i < n; i++) {
        const tg_tensor *x = inputs[i];
        if (!x) return tg__err(TG_ERR_NULL, "bad argument #3 to 'replicas_step' (input %d is "
                                            "NULL)", i);
        if (x->ndim < 1 || x->shape[0] < 1)
            return tg__err(TG_ERR_SHAPE, "bad argument #3 to 'replicas_step' (input %d has no "
                                         "rows to shard: %d dims, dim 0 of %lld)", i, x->ndim,
                           x->ndim ? (long long)x->shape[0] : 0LL);
        if (i > 0 && x->shape[0] != *rows)
            return tg__err(TG_ERR_SHAPE, "bad argument #3 to 'replicas_step' (input %d has %lld "
                                         "rows, input 0 has %lld)", i, (long long)x->shape[0],
                           (long long)*rows);
        if (x->tape)
            return tg__err(TG_ERR_INVALID, "bad argument #3 to 'replicas_step' (input %d is "
                                           "tracked by a tape; pass data, or tg_detach it)", i);
        *rows = x->shape[0];
    }
    return TG_OK;
}

/* Elements [lo, lo + n) of seg, in blocks small enough to stay in L1: the
 * sum is built in acc one source at a time (vectorised loops), in the same
 * order as an element-by-element sum, then stored or added. */
#define REDUCE_BLOCK 512
#define REDUCE_RANGE(T)                                                                   \
    do {                                                                                  \
        T acc[REDUCE_BLOCK], *d = (T *)g->dst + lo;                                       \
        for (int64_t b = 0; b < n; b += REDUCE_BLOCK) {                                   \
            int64_t m = n - b < REDUCE_BLOCK ? n - b : REDUCE_BLOCK;                      \
            const T *x = (const T *)g->src[0] + lo + b;                                   \
            T s0 = (T)g->s[0];                                                            \
            for (int64_t j = 0; j < m; j++) acc[j] = s0 * x[j];                           \
            for (int k = 1; k < g->nsrc; k++) {                                           \
                const T *y = (const T *)g->src[k] + lo + b;                               \
                T sk = (T)g->s[k];                                                        \
                for (int64_t j = 0; j < m; j++) acc[j] += sk * y[j];                      \
            }                                                                             \
            if (g->add)                                                                   \
                for (int64_t j = 0; j < m; j++) d[b + j] += acc[j];                       \
            else                                                                          \
                for (int64_t j = 0; j < m; j++) d[b + j] = acc[j];                        \
        }                                                                                 \
    } while (0)

static void reduce_range(const reduce_seg *g, int64_t lo, int64_t n)
{
    /* Worker 0's gradient written in place, alone, unscaled: done. */
    if (g->nsrc == 1 && g->src[0] == g->dst && g->s[0] == 1.0 && !g->add) return;
    if (g->f64)
        REDUCE_RANGE(double);
    else
        REDUCE_RANGE(float);
}

/* Part `part` of `parts` of the reduce: an equal share of all the
 * segments' elements (each element is summed by one thread, in the same
 * order whatever the split, so the bits do not depend on it). With an
 * optimizer, each block is updated right after it is summed, while it is
 * in this core's cache. */
#define UPDATE_BLOCK 8192

/* Rows [lo, hi) of deferred segment g: every worker's GEMM on them in
 * worker order, the first written, the others added (beta 1), then the
 * scale (a power of two) and the update, a block at a time. */
static void deferred_rows(const tg_replicas *r, const reduce_seg *g, int part, int64_t lo,
                          int64_t hi)
{
    size_t es = g->f64 ? sizeof(double) : sizeof(float);
    char *c = (char *)g->dst + (size_t)(lo * g->cols) * es;
    /* Every worker has a pair here (plan_deferred), so j is the worker. */
    for (int j = 0; j < g->nsrc; j++)
        if (!g->own_first || j != part)
            g->gemm(true, false, hi - lo, g->cols, g->mk[j],
                    (const char *)g->gk[j] + (size_t)lo * es, g->rows, g->xk[j], g->cols,
                    j || g->own_first ? 1.0 : 0.0, c, g->cols);
    for (int64_t x = lo * g->cols; x < hi * g->cols; x += UPDATE_BLOCK) {
        int64_t m = hi * g->cols - x < UPDATE_BLOCK ? hi * g->cols - x : UPDATE_BLOCK;
        if (g->scale != 1.0 && g->f64) {
            double *d = (double *)g->dst + x;
            for (int64_t i = 0; i < m; i++) d[i] *= g->scale;
        } else if (g->scale != 1.0) {
            float *d = (float *)g->dst + x, f = (float)g->scale;
            for (int64_t i = 0; i < m; i++) d[i] *= f;
        }
        if (r->o.optim) tg__optim_param_range(r->o.optim, g->param, x, m);
    }
}

static void reduce_part(const tg_replicas *r, int part, int parts)
{
    for (int i = 0; i < r->nseg; i++) {
        const reduce_seg *g = &r->seg[i];
        int64_t a, b;
        if (!g->deferred) continue;
        part_rows(g->rows, part, parts, g->quantum, &a, &b);
        if (a < b) deferred_rows(r, g, part, a, b);
    }
    int64_t lo = r->reduce_total * part / parts, hi = r->reduce_total * (part + 1) / parts;
    int64_t base = 0;
    for (int i = 0; i < r->nseg && base < hi; i++) {
        const reduce_seg *g = &r->seg[i];
        if (g->deferred) continue;
        int64_t a = lo > base ? lo - base : 0, b = hi - base < g->n ? hi - base : g->n;
        for (int64_t x = a; x < b; x += UPDATE_BLOCK) {
            int64_t m = b - x < UPDATE_BLOCK ? b - x : UPDATE_BLOCK;
            reduce_range(g, x, m);
            if (r->o.optim) tg__optim_param_range(r->o.optim, g->param, x, m);
        }
        base += g->n;
    }
}

/* Random values of many magnitudes, n of them, for chain_check. */
static void chain_fill(void *p, int64_t n, bool f64, uint64_t *u)
{
    for (int64_t i = 0; i < n; i++) {
        *u = *u * 6364136223846793005ULL + 1442695040888963407ULL;
        double v = ((double)((*u >> 33) % 2001) - 1000.0) / 1000.0;
        v *= (double)(1u << ((*u >> 20) % 13));
        if (f64)
            ((double *)p)[i] = v / 64.0;
        else
            ((float *)p)[i] = (float)(v / 64.0);
    }
}

/* Whether, for leaf j's shapes and rows this step, the parts' chained GEMMs
 * over row slices cut at multiples of q (deferred_rows; own_first: each
 * part's own term first) give bitwise what whole GEMMs summed in worker
 * order (reduce_range, scale 1) give, on the backend's own GEMM: both run
 * once on random data. */
static bool chain_check(const tg_replicas *r, int j, int q, bool own_first)
{
    const wdefer *d0 = NULL;
    int64_t mt = 0;
    for (int k = 0; k < r->o.workers; k++) {
        const wdefer *d = &r->w[k].rep.defer[j];
        if (!d->g) continue;
        if (!d0) d0 = d;
        mt += d->m;
    }
    bool f64 = d0->g->dtype == TG_F64;
    size_t es = f64 ? sizeof(double) : sizeof(float), nk = (size_t)(d0->n * d0->k);
    int64_t n = d0->n, kk = d0->k;
    tg_gemm_fn gemm = TG_KERNEL(tg_gemm_fn, TG_K_GEMM, d0->g);
    char *a = malloc((size_t)(mt * n) * es), *b = malloc((size_t)(mt * kk) * es);
    char *ref = malloc(nk * es), *one = malloc(nk * es), *c = malloc(nk * es);
    bool exact = false;
    if (a && b && ref && one && c) {
        uint64_t u = 0x9e3779b97f4a7c15ULL;
        chain_fill(a, mt * n, f64, &u);
        chain_fill(b, mt * kk, f64, &u);
        int64_t off = 0;
        for (int k = 0, first = 1; k < r->o.workers; k++) {
            const wdefer *d = &r->w[k].rep.defer[j];
            if (!d->g) continue;
            gemm(true, false, n, kk, d->m, a + (size_t)(off * n) * es, n,
                 b + (size_t)(off * kk) * es, kk, 0.0, first ? ref : one, kk);
            for (size_t i = 0; !first && i < nk; i++) {
                if (f64)
                    ((double *)ref)[i] = ((double *)ref)[i] + ((double *)one)[i];
                else
                    ((float *)ref)[i] = ((float *)ref)[i] + ((float *)one)[i];
            }
            first = 0;
            off += d->m;
        }
        /* Part p's rows: worker p's term first where the workers make
         * their own in backward (two of them), then the others in order. */
        for (int part = 0; part < r->o.workers; part++) {
            int64_t lo, hi;
            part_rows(n, part, r->o.workers, q, &lo, &hi);
            for (int pass = own_first ? 0 : 1, first = 1; pass < 2 && lo < hi; pass++) {
                off = 0;
                for (int k = 0; k < r->o.workers; k++) {
                    const wdefer *d = &r->w[k].rep.defer[j];
                    if (!d->g) continue;
                    if (pass == 1 ? !(own_first && k == part) : k == part) {
                        gemm(true, false, hi - lo, kk, d->m, a + (size_t)(off * n + lo) * es, n,
                             b + (size_t)(off * kk) * es, kk, first ? 0.0 : 1.0,
                             c + (size_t)(lo * kk) * es, kk);
                        first = 0;
                    }
                    off += d->m;
                }
            }
        }
        exact = memcmp(ref, c, nk * es) == 0;
    }
    free(a);
    free(b);
    free(ref);
    free(one);
    free(c);
    return exact;
}

/* chain_check's verdict for leaf j: the first quantum of CHAIN_QUANTA
 * whose cuts chain exactly, or 0 for none. Run again only when the
 * workers' rows change; a shape that fails is never deferred again. */
static int chain_exact(tg_replicas *r, int j)
{
    int nw = r->o.workers;
    int64_t *m = &r->chain_m[(size_t)j * (size_t)nw];
    bool same = r->chain_state[j] > 0;
    for (int k = 0; k < nw && same; k++) {
        const wdefer *d = &r->w[k].rep.defer[j];
        same = m[k] == (d->g ? d->m : 0);
    }
    if (same) return r->chain_state[j];
    int q = 0;
    for (int i = 0; i < N_QUANTA && !q; i++)
        if (chain_check(r, j, CHAIN_QUANTA[i], nw == 2)) q = CHAIN_QUANTA[i];
    if (!q) {
        r->chain_state[j] = -1;
        return 0;
    }
    for (int k = 0; k < nw; k++) m[k] = r->w[k].rep.defer[j].g ? r->w[k].rep.defer[j].m : 0;
    r->chain_state[j] = (signed char)q;
    return q;
}

/* Leaf j's deferred weight gradients: a deferred segment (*deferred) when
 * every worker with rows deferred it, the parameter has no gradient to add
 * to and chaining is exact; otherwise each worker's own GEMM, made here. */
static tg_status plan_deferred(tg_replicas *r, int j, bool can, reduce_seg *g, bool *deferred)
{
    int nact = 0, npend = 0;
    bool refused = false; /* by an earlier step's check */
    *deferred = false;
    for (int k = 0; k < r->o.workers; k++) {
        if (r->w[k].rows == 0) continue;
        nact++;
        npend += r->w[k].rep.defer[j].g != NULL;
        refused |= r->w[k].rep.defer[j].refused;
    }
    r->nrefused += refused;
    if (!npend) return TG_OK;
    bool eligible = can && npend == nact; /* every worker with rows deferred it */
    int q = eligible ? chain_exact(r, j) : 0;
    /* Two workers made their own terms in backward, cut at the quantum
     * they knew (the first step of a shape: CHAIN_QUANTA[0]). Where the
     * check found another, both terms are made here, in worker order,
     * if that order chains exactly too. */
    bool own_first = r->o.workers == 2;
    for (int k = 0; k < r->o.workers && q && own_first; k++)
        own_first = !r->w[k].rep.defer[j].g || r->w[k].rep.defer[j].quantum == q;
    if (q && r->o.workers == 2 && !own_first && !chain_check(r, j, q, false)) q = 0;
    if (eligible && !q) r->nrefused++;
    if (!q) {
        for (int k = 0; k < r->o.workers; k++) {
            tg_status st = r->w[k].rep.defer[j].g ? wdefer_own(&r->w[k], j) : TG_OK;
            if (st) return st;
        }
        return TG_OK;
    }
    g->nsrc = 0;
    for (int k = 0; k < r->o.workers; k++) {
        const wdefer *d = &r->w[k].rep.defer[j];
        if (!d->g) continue;
        g->gk[g->nsrc] = tg__tensor_ptr(d->g);
        g->xk[g->nsrc] = tg__tensor_ptr(d->x);
        g->mk[g->nsrc++] = d->m;
        g->rows = d->n;
        g->cols = d->k;
        g->gemm = TG_KERNEL(tg_gemm_fn, TG_K_GEMM, d->g);
    }
    g->own_first = own_first;
    g->quantum = q;
    *deferred = true;
    return TG_OK;
}

/* Worker k's weight in the combined gradient and loss of a batch of rows:
 * its share of the rows (MEAN) or 1 (SUM). */
static double worker_weight(const tg_replicas *r, int k, int64_t rows)
{
    return r->o.reduce == TG_REDUCE_MEAN ? (double)r->w[k].rows / (double)rows : 1.0;
}

/* Lays out the reduce of the workers' gradients into ps's flat buffer (on
 * the calling thread; the sums themselves run on every worker). A
 * parameter whose gradient is still a tensor of its own (from a plain
 * tg_backward) is moved into the flat buffer first, as
 * tg_params_sync_grad would; one without a gradient is overwritten. */
static tg_status reduce_plan(tg_replicas *r, int64_t rows)
{
    tg_params *ps = r->ps;
    const worker *w0 = &r->w[0];
    r->nseg = 0;
    r->reduce_total = 0;
    r->ndeferred = 0;
    r->nrefused = 0;
    for (int j = 0; j < w0->rep.n; j++) {
        tg__param *p = &ps->p[w0->param_of[j]];
        reduce_seg *g = &r->seg[r->nseg];
        bool deferred;
        tg_status st = plan_deferred(r, j, !p->value->grad, g, &deferred);
        if (st) return st;
        g->deferred = deferred;
        if (deferred) {
            p->value->grad = tg_tensor_retain(p->gview);
            g->dst = tg__tensor_ptr(p->gview);
            g->f64 = p->value->dtype == TG_F64;
            g->n = p->numel;
            g->param = w0->param_of[j];
            g->add = false;
            g->scale = worker_weight(r, 0, rows); /* every worker's (defer_step_ok) */
            r->nseg++;
            r->ndeferred++;
            continue;
        }
        g->nsrc = 0;
        for (int k = 0; k < r->o.workers; k++) {
            const tg_tensor *gk = r->w[k].rep.leaves[j]->grad;
            if (!gk || r->w[k].rows == 0) continue;
            g->src[g->nsrc] = tg__tensor_ptr(gk);
            g->s[g->nsrc++] = worker_weight(r, k, rows);
        }
        if (!g->nsrc) continue;
        tg_tensor *v = p->value;
        if ((st = tg__param_grad_to_flat(p))) return st;
        g->add = v->grad != NULL;
        if (!v->grad) v->grad = tg_tensor_retain(p->gview);
        g->dst = tg__tensor_ptr(p->gview);
        g->f64 = v->dtype == TG_F64;
        g->n = p->numel;
        g->param = w0->param_of[j];
        r->reduce_total += g->n;
        r->nseg++;
    }
    return TG_OK;
}

/* After an update fused into the reduce: what tg_optim_step does besides
 * the arithmetic, and the update of any parameter that has a gradient no
 * worker added to (from a tg_backward of the caller's), on this thread. */
static void finish_update(tg_replicas *r)
{
    tg_optim *opt = r->o.optim;
    tg_params *ps = r->ps;
    bool *done = calloc((size_t)ps->n, sizeof *done);
    for (int i = 0; i < r->nseg; i++) {
        tg__optim_param_done(opt, r->seg[i].param);
        if (done) done[r->seg[i].param] = true;
    }
    for (int i = 0; done && i < ps->n; i++) {
        tg__param *p = &ps->p[i];
        if (done[i] || p->pool >= TG__POOL_TRAINABLE || !p->value->grad) continue;
        if (tg__param_grad_to_flat(p)) continue;
        tg__optim_param_range(opt, i, 0, p->numel);
        tg__optim_param_done(opt, i);
    }
    free(done);
    opt->step_count++;
}

/* Whether this step's weight gradients may be deferred: two or more
 * workers, each with rows, and every worker's gradient weighted alike by a
 * power of two (SUM; MEAN over equal shards and a power-of-two count), so
 * that scaling the chained sum gives what scaling each term gives. */
static bool defer_step_ok(const tg_replicas *r)
{
    int nw = r->o.workers;
    if (nw < 2) return false;
    for (int k = 0; k < nw; k++)
        if (r->w[k].rows == 0 || (r->o.reduce == TG_REDUCE_MEAN && r->w[k].rows != r->w[0].rows))
            return false;
    return r->o.reduce == TG_REDUCE_SUM || (nw & (nw - 1)) == 0;
}

/* Worker w's part of the reduce; then, once every part is done with the
 * deferred pairs (each part reads every worker's), w drops its own, on
 * its own thread: their buffers go back to that thread's cache, where its
 * next step finds them (freed by the calling thread, worker 1's buffers
 * went to the caller's cache, and its next forward started on fresh ones:
 * 0.12 ms a step later than worker 0's on the mlp). */
static void reduce_then_drop(tg_replicas *r, worker *w)
{
    reduce_part(r, w->index, r->o.workers);
    if (!r->ndeferred) return;
    atomic_fetch_add_explicit(&r->reduced, 1, memory_order_acq_rel);
    while (atomic_load_explicit(&r->reduced, memory_order_acquire) < r->o.workers) cpu_relax();
    wdefer_drop(w);
}

/* Runs one round on every worker, part 0 on the calling thread. */
static void run_round(tg_replicas *r, bool reducing)
{
    int nw = r->o.workers;
    r->reducing = reducing;
    if (nw > 1) {
        atomic_store_explicit(&r->pending, nw - 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&r->round, 1, memory_order_release);
        pthread_mutex_lock(&r->mu);
        pthread_cond_broadcast(&r->go);
        pthread_mutex_unlock(&r->mu);
    }
    if (reducing)
        reduce_then_drop(r, &r->w[0]);
    else
        run_shard(r, &r->w[0]);
    if (nw > 1) {
        for (int i = 0; i < SPIN_CHECKS &&
                        atomic_load_explicit(&r->pending, memory_order_acquire) > 0; i++)
            cpu_relax();
        if (atomic_load_explicit(&r->pending, memory_order_acquire) > 0) {
            pthread_mutex_lock(&r->mu);
            while (atomic_load(&r->pending) > 0) pthread_cond_wait(&r->done, &r->mu);
            pthread_mutex_unlock(&r->mu);
        }
    }
}

tg_status tg_replicas_step(tg_replicas *r, int n, tg_tensor *const *inputs, tg_replica_fn fn,
                           void *userdata, double *loss)
{
    if (!r) return tg__err(TG_ERR_NULL, "bad argument #1 to 'replicas_step' (NULL replica set)");
    if (!fn) return tg__err(TG_ERR_NULL, "bad argument #4 to 'replicas_step' (NULL loss "
                                         "function)");
    if (tg__replica_active)
        return tg__err(TG_ERR_INVALID, "'replicas_step' called from inside a replica's loss "
                                       "function");
    int64_t rows = 0;
    tg_status st = check_inputs(n, inputs, &rows);
    if (st) return st;
    if (r->nparams != r->ps->n && (st = make_leaves(r))) return st;
    if (r->w[0].rep.n == 0)
        return tg__err(TG_ERR_NOT_FOUND, "bad argument #1 to 'replicas_step' (the parameter set "
                                         "has no trainable parameter)");
    int nw = r->o.workers;
    for (int k = 0; k < nw; k++) {
        r->w[k].row0 = rows * k / nw;
        r->w[k].rows = rows * (k + 1) / nw - r->w[k].row0;
    }
    int prev_threads = tg_num_threads();
    if (nw > 1 && prev_threads != 1) tg_set_num_threads(1);
    r->nin = n;
    r->inputs = inputs;
    r->fn = fn;
    r->ud = userdata;
    r->backend = tg_default_backend();
    /* Worker 0's leaves take their parameter's view of the flat gradient
     * buffer as their gradient sink (tape/backward.c) where the parameter
     * has no gradient to add to: its backward then writes its gradient
     * there, and the reduce sums in place (REDUCE_RANGE reads a block of
     * every source before it writes it), to the same bits. */
    for (int j = 0; j < r->w[0].rep.n; j++) {
        const tg__param *p = &r->ps->p[r->w[0].param_of[j]];
        r->w[0].rep.leaves[j]->gsink = p->value->grad ? NULL : p->gview;
    }
    bool defer = defer_step_ok(r);
    for (int k = 0; k < nw; k++) {
        worker *w = &r->w[k];
        bool watched = tg__tape_grads_observed(w->tape);
        for (int j = 0; j < w->rep.n; j++) {
            const tg__param *p = &r->ps->p[w->param_of[j]];
            w->rep.defer_ok[j] = defer && !watched && !p->value->grad;
            w->rep.defer[j].refused = false;
            w->rep.flat[j] = tg__tensor_ptr(p->gview);
        }
    }
    r->t0 = now_s();
    run_round(r, false);
    double end = r->t0;
    for (int k = 0; k < nw; k++) end = r->w[k].end_s > end ? r->w[k].end_s : end;
    r->compute_s = end - r->t0;
    r->inputs = NULL;
    for (int k = 0; k < nw && !st; k++)
        if (r->w[k].status) st = tg__err(r->w[k].status, "worker %d: %s", k, r->w[k].message);
    double t1 = now_s();
    if (!st) st = reduce_plan(r, rows);
    if (!st && r->o.optim) st = tg__optim_fit(r->o.optim);
    atomic_store_explicit(&r->reduced, 0, memory_order_relaxed);
    if (!st) run_round(r, true);
    for (int k = 0; k < nw; k++) wdefer_drop(&r->w[k]); /* what is left after an error */
    if (!st && r->o.optim) finish_update(r);
    r->reduce_s = now_s() - t1;
    if (nw > 1 && prev_threads != 1) tg_set_num_threads(prev_threads);
    if (st) return st;
    if (loss) {
        double l = 0;
        for (int k = 0; k < nw; k++) l += r->w[k].loss * worker_weight(r, k, rows);
        *loss = l;
    }
    return TG_OK;
}
