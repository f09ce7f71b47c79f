/* Data-parallel training across MPI ranks (include/tapegrad/dist.h).
 *
 * Gradients travel in buckets: contiguous runs of trainable parameters in
 * reverse order of addition (the order a backward sweep usually finishes
 * them), one dtype each, at most bucket_bytes. Each bucket has a staging
 * buffer that is all-reduced in place. The flat gradient buffer is never
 * all-reduced directly because it holds the gradient from before the call
 * (prev), which must come out as prev + reduced on every rank: adding the
 * reduced bucket to a prev that is bitwise the same everywhere keeps the
 * ranks bitwise identical, where (prev + local) - local + reduced would
 * not.
 *
 * Every wait polls non-blocking requests with MPI_Test against a deadline,
 * so a rank that hangs turns into TG_ERR_DIST on the others instead of a
 * hang. After a timeout the ranks are out of step (collectives in flight
 * that will never match), so the context refuses further work. */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tapegrad/dist.h>

#include "train/train_internal.h"

#define DEFAULT_TIMEOUT_S 60.0
#define DEFAULT_BUCKET_BYTES ((size_t)1 << 20)
/* Largest piece of one MPI message: counts are ints. */
#define CHUNK_BYTES ((size_t)1 << 30)
#define MSG_LEN 256

typedef struct bucket {
    int pool;             /* TG__POOL_F32 or TG__POOL_F64 */
    int64_t numel;        /* elements staged */
    void *buf;            /* staging, all-reduced in place */
    int pending;          /* parameters not staged yet in this backward */
    bool started, done;
    MPI_Request req;
    double t_start, t_done;
} bucket;

/* A parameter's place: its bucket and element offset in the staging. */
typedef struct slot {
    int bucket;
    int64_t at;
} slot;

typedef struct leaf_key {
    const tg_tensor *value;
    int param;
} leaf_key;

struct tg_dist {
    MPI_Comm comm;
    int rank, size;
    tg_dist_opts o;
    bool broken; /* a timeout or an MPI error: the ranks are out of step */
    tg_params *ps;
    tg_tape *tape; /* attached (overlap), or NULL */
    /* Buckets for bps as it was when they were made (nparams entries). */
    const tg_params *bps;
    int nparams;
    bucket *b;
    int nb, next_start;
    slot *slots;     /* per entry of ps; bucket -1 for buffers */
    bool *staged;    /* per entry, in the current backward */
    bool *had;       /* per entry: had a gradient before the current backward */
    leaf_key *keys;  /* trainable values sorted by address */
    int nkeys;
    bool in_backward;
    bool detached; /* the parameters' gradients were taken off for the backward */
    tg_dist_stats stats;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Between polls: yield at first (the other rank may be about to answer,
 * and ranks often share cores), then sleep a little so that a long wait
 * does not burn a core another rank needs for its backward. */
static void backoff(long spin)
{
    if (spin < 1000) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 50 * 1000};
    nanosleep(&ts, NULL);
}

static tg_status mpi_fail(tg_dist *d, int rc, const char *what)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
    d->broken = true;
    return tg__err(TG_ERR_DIST, "%s failed on rank %d: %s", what, d->rank, s);
}

static tg_status timed_out(tg_dist *d, const char *what)
{
    d->broken = true;
    return tg__err(TG_ERR_DIST, "timed out after %g s waiting for %s (rank %d of %d)",
                   d->o.timeout_s, what, d->rank, d->size);
}

static tg_status check_usable(const tg_dist *d, const char *op)
{
    if (!d) return tg__err(TG_ERR_NULL, "bad argument #1 to '%s' (NULL dist context)", op);
    if (d->broken)
        return tg__err(TG_ERR_DIST, "'%s': the ranks are out of step after an earlier timeout or "
                                    "MPI error; call tg_dist_abort", op);
    return TG_OK;
}

/* Waits for n requests with the timeout. */
static tg_status wait_all(tg_dist *d, int n, MPI_Request *reqs, const char *what)
{
    double deadline = now_s() + d->o.timeout_s;
    for (long spin = 0;; spin++) {
        int done = 0;
        int rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(d, rc, what);
        if (done) return TG_OK;
        if (now_s() > deadline) return timed_out(d, what);
        backoff(spin);
    }
}

/* A growable list of requests (the broadcast issues one per buffer). */
typedef struct req_list {
    MPI_Request *r;
    int n, cap;
} req_list;

static tg_status ibcast(tg_dist *d, req_list *l, void *p, size_t nbytes)
{
    for (size_t off = 0; off < nbytes; off += CHUNK_BYTES) {
        if (l->n == l->cap) {
            int cap = l->cap ? 2 * l->cap : 16;
            MPI_Request *r = realloc(l->r, (size_t)cap * sizeof *r);
            if (!r) return tg__err(TG_ERR_NOMEM, "out of memory for MPI requests");
            l->r = r;
            l->cap = cap;
        }
        size_t len = nbytes - off < CHUNK_BYTES ? nbytes - off : CHUNK_BYTES;
        int rc = MPI_Ibcast((char *)p + off, (int)len, MPI_BYTE, 0, d->comm, &l->r[l->n]);
        if (rc != MPI_SUCCESS) return mpi_fail(d, rc, "MPI_Ibcast");
        l->n++;
    }
    return TG_OK;
}

tg_status tg_dist_new(MPI_Comm comm, const tg_dist_opts *opts, tg_dist **out)
{
    if (!out) return tg__err(TG_ERR_NULL, "bad argument #3 to 'dist_new' (NULL out)");
    *out = NULL;
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin)
        return tg__err(TG_ERR_INVALID, "'dist_new': MPI is %s (call MPI_Init first)",
                       fin ? "already finalised" : "not initialised");
    if (comm == MPI_COMM_NULL)
        return tg__err(TG_ERR_INVALID, "bad argument #1 to 'dist_new' (MPI_COMM_NULL)");
    tg_dist_opts o = opts ? *opts : (tg_dist_opts){0};
    if (!isfinite(o.timeout_s) || o.timeout_s < 0)
        return tg__err(TG_ERR_INVALID, "bad argument #2 to 'dist_new' (timeout_s %g; need a "
                                       "finite number >= 0, 0 for %g s)", o.timeout_s,
                       DEFAULT_TIMEOUT_S);
    if (o.timeout_s == 0) o.timeout_s = DEFAULT_TIMEOUT_S;
    if (o.bucket_bytes == 0) o.bucket_bytes = DEFAULT_BUCKET_BYTES;
    tg_dist *d = calloc(1, sizeof *d);
    if (!d) return tg__err(TG_ERR_NOMEM, "out of memory for a dist context");
    d->o = o;
    /* The duplicate keeps our collectives apart from the user's, and its
     * error handler returns codes instead of aborting the job. */
    int rc = MPI_Comm_dup(comm, &d->comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(d->comm, &d->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(d->comm, &d->size);
    if (rc != MPI_SUCCESS) {
        tg_status st = mpi_fail(d, rc, "MPI_Comm_dup");
        if (d->comm != MPI_COMM_NULL) MPI_Comm_free(&d->comm);
        free(d);
        return st;
    }
    *out = d;
    return TG_OK;
}

static void free_buckets(tg_dist *d, bool keep_staging)
{
    for (int k = 0; k < d->nb; k++)
        if (!keep_staging) free(d->b[k].buf);
    free(d->b);
    free(d->slots);
    free(d->staged);
    free(d->had);
    free(d->keys);
    d->b = NULL;
    d->slots = NULL;
    d->staged = d->had = NULL;
    d->keys = NULL;
    d->nb = d->nkeys = d->nparams = 0;
    d->bps = NULL;
}

void tg_dist_free(tg_dist *d)
{
    if (!d) return;
    /* The attached tape is not touched: it may be freed already. */
    /* After a timeout, all-reduces still pending may write their staging
     * buffers whenever MPI makes progress: leave them (and the
     * communicator they run on) alone. */
    free_buckets(d, d->broken);
    if (!d->broken) MPI_Comm_free(&d->comm);
    free(d);
}

int tg_dist_rank(const tg_dist *d)
{
    return d ? d->rank : -1;
}

int tg_dist_size(const tg_dist *d)
{
    return d ? d->size : -1;
}

tg_status tg_dist_last_stats(const tg_dist *d, tg_dist_stats *out)
{
    if (!d || !out)
        return tg__err(TG_ERR_NULL, "bad argument #%d to 'dist_last_stats' (NULL)", d ? 2 : 1);
    *out = d->stats;
    return TG_OK;
}

/* MPI_Abort should end the job and not return, but it can hang: once, in
 * CI under ASan on a loaded machine, Open MPI 4.1.4 logged an error
 * unpacking the abort's message, and the job went on while the aborting
 * rank stayed in MPI_Abort. So a watchdog thread ends this process with
 * the code after the dist's timeout_s; mpirun, seeing a rank exit non-zero
 * without MPI_Finalize, then ends the rest of the job. */
typedef struct abort_watch {
    double delay_s;
    int code;
} abort_watch;

static void *abort_watchdog(void *arg)
{
    const abort_watch *w = arg;
    struct timespec ts = {(time_t)w->delay_s,
                          (long)((w->delay_s - (double)(time_t)w->delay_s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0)
        ;
    fprintf(stderr, "tapegrad: MPI_Abort has not ended the job after %g s; exiting with %d\n",
            w->delay_s, w->code);
    fflush(stdout);
    fflush(stderr);
    _exit(w->code ? w->code : 1);
    return NULL;
}

tg_status tg_dist_abort(tg_dist *d, int code)
{
    if (!d) return tg__err(TG_ERR_NULL, "bad argument #1 to 'dist_abort' (NULL dist context)");
    fflush(stdout);
    fflush(stderr);
    /* One watchdog a process, started by the first call: it reads `watch`
     * for as long as it lives. */
    static abort_watch watch;
    static atomic_flag started = ATOMIC_FLAG_INIT;
    pthread_t t;
    pthread_attr_t attr;
    if (!atomic_flag_test_and_set(&started) && !pthread_attr_init(&attr)) {
        watch = (abort_watch){.delay_s = d->o.timeout_s, .code = code};
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        (void)pthread_create(&t, &attr, abort_watchdog, &watch);
        pthread_attr_destroy(&attr);
    }
    int rc = MPI_Abort(d->comm, code);
    return mpi_fail(d, rc, "MPI_Abort");
}

/* ---- The failure protocol: every rank shares {status, rank, message}. */

typedef struct verdict {
    int32_t status, rank;
    char msg[MSG_LEN];
} verdict;

/* Every rank's outcome; returns the agreed status (see tg_dist_check).
 * msg is this rank's message when local is an error. */
static tg_status agree(tg_dist *d, tg_status local, const char *msg)
{
    verdict mine = {.status = (int32_t)local, .rank = d->rank};
    if (local) snprintf(mine.msg, sizeof mine.msg, "%s", msg);
    verdict *all = calloc((size_t)d->size, sizeof *all);
    if (!all) return tg__err(TG_ERR_NOMEM, "out of memory for %d ranks' outcomes", d->size);
    MPI_Request req;
    int rc = MPI_Iallgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE,
                            d->comm, &req);
    tg_status st = rc == MPI_SUCCESS ? wait_all(d, 1, &req, "the other ranks' outcome")
                                     : mpi_fail(d, rc, "MPI_Iallgather");
    if (!st && local) {
        st = tg__err(local, "%s", mine.msg);
    } else if (!st) {
        for (int r = 0; r < d->size; r++) {
            if (!all[r].status) continue;
            st = tg__err(TG_ERR_DIST, "rank %d failed: %s", r, all[r].msg);
            break;
        }
    }
    free(all);
    return st;
}

tg_status tg_dist_check(tg_dist *d, tg_status local)
{
    tg_status st = check_usable(d, "dist_check");
    if (st) return st;
    char msg[MSG_LEN];
    snprintf(msg, sizeof msg, "%s", local ? tg_last_error_message() : "");
    if (local && !msg[0]) snprintf(msg, sizeof msg, "%s", tg_strerror(local));
    return agree(d, local, msg);
}

tg_status tg_dist_params_save(tg_dist *d, const tg_params *ps, const tg_optim *opt,
                              const char *path)
{
    tg_status st = check_usable(d, "dist_params_save");
    if (st) return st;
    tg_status local = d->rank == 0 ? tg_params_save(ps, opt, path) : TG_OK;
    return tg_dist_check(d, local);
}

/* ---- Broadcast */

/* The layout of ps and opt as text, one NUL-terminated record per entry
 * ("'name' f32 parameter [2,3]") and one for the optimizer, so ranks can
 * compare it and name the first difference. */
static char *layout_text(const tg_params *ps, const tg_optim *opt, size_t *len)
{
    size_t cap = 256, n = 0;
    char *s = malloc(cap);
    for (int i = 0; s && i <= ps->n; i++) {
        char rec[TG_MAX_DIMS * 24 + 400];
        int k;
        if (i == ps->n) {
            /* The state kinds too: they decide what is sent (amsgrad,
             * momentum and centered add buffers). */
            k = snprintf(rec, sizeof rec, "optimizer %s",
                         opt ? tg__optim_kind_name(opt->o.kind) : "none");
            for (int st = 0; opt && st < TG__ST_COUNT; st++)
                if (opt->uses[st])
                    k += snprintf(rec + k, sizeof rec - (size_t)k, " %s", tg__optim_state_name(st));
        } else {
            const tg__param *p = &ps->p[i];
            const tg_tensor *v = p->value;
            k = snprintf(rec, sizeof rec, "'%s' %s %s [", p->name, tg_dtype_name(v->dtype),
                         p->pool < TG__POOL_TRAINABLE ? "parameter" : "buffer");
            for (int j = 0; j < v->ndim; j++)
                k += snprintf(rec + k, sizeof rec - (size_t)k, "%s%lld", j ? "," : "",
                              (long long)v->shape[j]);
            k += snprintf(rec + k, sizeof rec - (size_t)k, "]");
        }
        while (n + (size_t)k + 1 > cap) {
            char *t = realloc(s, cap *= 2);
            if (!t) free(s);
            s = t;
            if (!s) break;
        }
        if (s) {
            memcpy(s + n, rec, (size_t)k + 1);
            n += (size_t)k + 1;
        }
    }
    if (!s) tg__err(TG_ERR_NOMEM, "out of memory for the parameter layout");
    *len = n;
    return s;
}

/* Compares this rank's layout with rank 0's; TG_ERR_DIST naming the first
 * difference. */
static tg_status compare_layout(const char *mine, size_t nmine, const char *root, size_t nroot)
{
    size_t a = 0, b = 0;
    for (int i = 0;; i++) {
        bool ea = a >= nmine, eb = b >= nroot;
        if (ea && eb) return TG_OK;
        if (ea || eb || strcmp(mine + a, root + b))
            return tg__err(TG_ERR_DIST, "parameter layout differs from rank 0's at entry %d: "
                                        "%s here, %s on rank 0", i,
                           ea ? "nothing" : mine + a, eb ? "nothing" : root + b);
        a += strlen(mine + a) + 1;
        b += strlen(root + b) + 1;
    }
}

/* The scalars of the optimizer rank 0 sends. */
typedef struct optim_head {
    int64_t step_count;
    double lr;
} optim_head;

tg_status tg_dist_broadcast(tg_dist *d, tg_params *ps, tg_optim *opt)
{
    tg_status st = check_usable(d, "dist_broadcast");
    if (st) return st;
    /* Argument and memory problems of one rank are agreed on like any
     * failure, so that no rank is left waiting in a collective. */
    tg_status local = TG_OK;
    if (!ps)
        local = tg__err(TG_ERR_NULL, "bad argument #2 to 'dist_broadcast' (NULL parameter set)");
    else if (opt && opt->ps != ps)
        local = tg__err(TG_ERR_INVALID, "bad argument #3 to 'dist_broadcast' (the optimizer is "
                                        "over another parameter set)");
    else if (opt)
        local = tg__optim_fit(opt);
    size_t nmine = 0;
    char *mine = local ? NULL : layout_text(ps, opt, &nmine);
    if (!local && !mine) local = TG_ERR_NOMEM;
    if ((st = tg_dist_check(d, local))) {
        free(mine);
        return st;
    }
    /* Rank 0's layout to everyone; each compares it with its own. */
    uint64_t nroot = nmine;
    MPI_Request req;
    int rc = MPI_Ibcast(&nroot, 1, MPI_UINT64_T, 0, d->comm, &req);
    st = rc == MPI_SUCCESS ? wait_all(d, 1, &req, "rank 0's parameter layout")
                           : mpi_fail(d, rc, "MPI_Ibcast");
    char *root = st ? NULL : d->rank == 0 ? mine : malloc(nroot ? nroot : 1);
    if (!st && !root) {
        /* Fatal for the protocol: the others are about to send the text. */
        free(mine);
        d->broken = true;
        return tg__err(TG_ERR_NOMEM, "out of memory for rank 0's parameter layout");
    }
    req_list rl = {0};
    if (!st) st = ibcast(d, &rl, root, nroot);
    if (!st) st = wait_all(d, rl.n, rl.r, "rank 0's parameter layout");
    rl.n = 0;
    if (st) {
        if (root != mine) free(root);
        free(mine);
        free(rl.r);
        return st;
    }
    local = d->rank == 0 ? TG_OK : compare_layout(mine, nmine, root, nroot);
    if (root != mine) free(root);
    free(mine);
    if ((st = tg_dist_check(d, local))) {
        free(rl.r);
        return st;
    }
    /* Same layout everywhere: rank 0's bytes, buffer by buffer. */
    for (int p = 0; !st && p < TG__POOL_COUNT; p++) {
        tg__pool *pl = &ps->pools[p];
        if (pl->numel)
            st = ibcast(d, &rl, tg__tensor_ptr(pl->values),
                        (size_t)pl->numel * tg_dtype_size(pl->dtype));
    }
    optim_head head = {0};
    if (opt) {
        head.step_count = opt->step_count;
        head.lr = opt->o.lr;
        for (int s = 0; !st && s < TG__ST_COUNT; s++)
            for (int p = 0; !st && p < TG__POOL_TRAINABLE; p++)
                if (opt->uses[s] && ps->pools[p].numel)
                    st = ibcast(d, &rl, opt->state[s][p],
                                (size_t)ps->pools[p].numel * tg_dtype_size(ps->pools[p].dtype));
        if (!st && ps->n) st = ibcast(d, &rl, opt->steps, (size_t)ps->n * sizeof *opt->steps);
        if (!st) st = ibcast(d, &rl, &head, sizeof head);
    }
    if (!st) st = wait_all(d, rl.n, rl.r, "rank 0's parameters");
    free(rl.r);
    if (st) return st;
    if (opt) {
        opt->step_count = head.step_count;
        opt->o.lr = head.lr;
    }
    /* The values changed under any tape that recorded them. */
    if (d->rank != 0)
        for (int i = 0; i < ps->n; i++) tg__tensor_written(ps->p[i].value);
    d->ps = ps;
    return TG_OK;
}

/* ---- Buckets */

static int key_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const leaf_key *)a)->value;
    uintptr_t y = (uintptr_t)((const leaf_key *)b)->value;
    return (x > y) - (x < y);
}

/* (Re)makes the buckets for ps as it is now. Every rank has the same
 * layout (tg_dist_broadcast checked it), so every rank makes the same
 * buckets. */
static tg_status make_buckets(tg_dist *d, tg_params *ps)
{
    free_buckets(d, false);
    int n = ps->n;
    d->slots = malloc((size_t)(n ? n : 1) * sizeof *d->slots);
    d->staged = calloc((size_t)(n ? n : 1), sizeof *d->staged);
    d->had = calloc((size_t)(n ? n : 1), sizeof *d->had);
    d->keys = malloc((size_t)(n ? n : 1) * sizeof *d->keys);
    d->b = calloc((size_t)(n ? n : 1), sizeof *d->b);
    if (!d->slots || !d->staged || !d->had || !d->keys || !d->b) {
        free_buckets(d, false);
        return tg__err(TG_ERR_NOMEM, "out of memory for gradient buckets");
    }
    int nb = 0;
    bucket *cur = NULL;
    for (int i = n - 1; i >= 0; i--) {
        const tg__param *p = &ps->p[i];
        d->slots[i] = (slot){-1, 0};
        if (p->pool >= TG__POOL_TRAINABLE) continue;
        size_t es = tg_dtype_size(ps->pools[p->pool].dtype);
        if (p->numel > INT32_MAX) {
            free_buckets(d, false);
            return tg__err(TG_ERR_INVALID, "parameter '%s' has %lld elements: too many for one "
                                           "MPI message", p->name, (long long)p->numel);
        }
        if (!cur || cur->pool != p->pool ||
            (size_t)(cur->numel + p->numel) * es > d->o.bucket_bytes ||
            cur->numel + p->numel > INT32_MAX)
            cur = &d->b[nb++], cur->pool = p->pool;
        d->slots[i] = (slot){(int)(cur - d->b), cur->numel};
        cur->numel += p->numel;
        cur->pending++;
        d->keys[d->nkeys++] = (leaf_key){p->value, i};
    }
    d->nb = nb;
    for (int k = 0; k < nb; k++) {
        size_t es = tg_dtype_size(ps->pools[d->b[k].pool].dtype);
        d->b[k].buf = malloc((size_t)(d->b[k].numel ? d->b[k].numel : 1) * es);
        if (!d->b[k].buf) {
            free_buckets(d, false);
            return tg__err(TG_ERR_NOMEM, "out of memory for gradient buckets");
        }
    }
    qsort(d->keys, (size_t)d->nkeys, sizeof *d->keys, key_cmp);
    d->nparams = n;
    d->bps = ps;
    d->ps = ps;
    return TG_OK;
}

static int find_param(const tg_dist *d, const tg_tensor *leaf)
{
    int lo = 0, hi = d->nkeys - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (d->keys[mid].value == leaf) return d->keys[mid].param;
        if ((uintptr_t)d->keys[mid].value < (uintptr_t)leaf)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

/* Copies parameter i's new gradient g (NULL: zeros) into its bucket. */
static tg_status stage(tg_dist *d, int i, const tg_tensor *g)
{
    const tg__param *p = &d->ps->p[i];
    bucket *b = &d->b[d->slots[i].bucket];
    size_t es = tg_dtype_size(p->value->dtype);
    void *dst = (char *)b->buf + (size_t)d->slots[i].at * es;
    size_t nbytes = (size_t)p->numel * es;
    tg_status st = TG_OK;
    if (!g) {
        memset(dst, 0, nbytes);
    } else if (g->dtype != p->value->dtype || g->numel != p->numel) {
        /* Stage zeros anyway: the bucket must still go out. */
        memset(dst, 0, nbytes);
        st = tg__err(TG_ERR_INTERNAL, "gradient of parameter '%s' has %s[%lld], expected %s[%lld]",
                     p->name, tg_dtype_name(g->dtype), (long long)g->numel,
                     tg_dtype_name(p->value->dtype), (long long)p->numel);
    } else {
        st = tg_tensor_copy_out(g, dst, nbytes);
        if (st) memset(dst, 0, nbytes);
    }
    d->staged[i] = true;
    b->pending--;
    return st;
}

/* Starts the buckets that are full, strictly in bucket order. */
static tg_status start_ready(tg_dist *d)
{
    while (d->next_start < d->nb && d->b[d->next_start].pending == 0) {
        bucket *b = &d->b[d->next_start++];
        MPI_Datatype t = b->pool == TG__POOL_F32 ? MPI_FLOAT : MPI_DOUBLE;
        b->t_start = now_s();
        int rc = MPI_Iallreduce(MPI_IN_PLACE, b->buf, (int)b->numel, t, MPI_SUM, d->comm, &b->req);
        if (rc != MPI_SUCCESS) return mpi_fail(d, rc, "MPI_Iallreduce");
        b->started = true;
    }
    return TG_OK;
}

/* Tests the started buckets once; *all_done when every bucket is done. */
static tg_status progress(tg_dist *d, bool *all_done)
{
    bool all = d->next_start == d->nb;
    for (int k = 0; k < d->next_start; k++) {
        bucket *b = &d->b[k];
        if (b->done) continue;
        int flag = 0;
        int rc = MPI_Test(&b->req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(d, rc, "MPI_Iallreduce");
        if (flag) {
            b->done = true;
            b->t_done = now_s();
        } else {
            all = false;
        }
    }
    if (all_done) *all_done = all;
    return TG_OK;
}

/* The tape's gradient-ready function: stage, start, make progress. */
static tg_status on_ready(tg_tensor *leaf, const tg_tensor *grad, void *ud)
{
    tg_dist *d = ud;
    if (!d->in_backward) return TG_OK;
    int i = find_param(d, leaf);
    if (i < 0 || d->staged[i]) return TG_OK;
    tg_status st = stage(d, i, grad);
    if (!st) st = start_ready(d);
    if (!st) st = progress(d, NULL);
    return st;
}

tg_status tg_dist_attach(tg_dist *d, tg_params *ps, tg_tape *tape)
{
    tg_status st = check_usable(d, "dist_attach");
    if (st) return st;
    if (!ps || !tape)
        return tg__err(TG_ERR_NULL, "bad argument #%d to 'dist_attach' (NULL)", ps ? 3 : 2);
    if ((st = make_buckets(d, ps))) return st;
    if ((st = tg_tape_set_grad_ready(tape, on_ready, d))) return st;
    /* A previous tape keeps on_ready (it may be freed, so it cannot be
     * disarmed here); it does nothing outside tg_dist_backward. */
    d->tape = tape;
    return TG_OK;
}

/* Gives every trainable parameter of ps back the gradient it had before
 * the backward (the flat buffer still holds it). */
static void restore_grads(tg_dist *d)
{
    tg_params *ps = d->ps;
    if (!d->detached) return;
    d->detached = false;
    for (int i = 0; i < ps->n; i++) {
        tg__param *p = &ps->p[i];
        if (p->pool >= TG__POOL_TRAINABLE) continue;
        tg_tensor *v = p->value;
        /* Without a previous gradient, the local one may sit in the flat
         * buffer (its sink): dropped all the same. */
        if (v->grad != p->gview || !d->had[i]) {
            tg_tensor_release(v->grad);
            v->grad = d->had[i] ? tg_tensor_retain(p->gview) : NULL;
        }
    }
}

/* gview = prev + reduced / size (or + reduced), for every trainable
 * parameter. prev is the flat buffer's, or, for a parameter that had no
 * gradient (whose buffer may hold the local gradient its sink took), a
 * zero: the sum is taken as 0 + r all the same, so that a -0 comes out as
 * it did when the buffer was zero-filled. */
#define APPLY_LOOP(T)                                                   \
    do {                                                                \
        T *g = gv;                                                      \
        const T *r = red;                                               \
        if (!had)                                                       \
            for (int64_t j = 0; j < n; j++) g[j] = (T)0;                \
        if (sum)                                                        \
            for (int64_t j = 0; j < n; j++) g[j] = g[j] + r[j];         \
        else                                                            \
            for (int64_t j = 0; j < n; j++) g[j] = g[j] + r[j] / (T)sz; \
    } while (0)

static void apply_grads(tg_dist *d)
{
    tg_params *ps = d->ps;
    bool sum = d->o.sum;
    int sz = d->size;
    for (int i = 0; i < ps->n; i++) {
        tg__param *p = &ps->p[i];
        if (p->pool >= TG__POOL_TRAINABLE) continue;
        tg_tensor *v = p->value;
        size_t es = tg_dtype_size(v->dtype);
        const void *red = (const char *)d->b[d->slots[i].bucket].buf + (size_t)d->slots[i].at * es;
        void *gv = tg__tensor_ptr(p->gview);
        int64_t n = p->numel;
        bool had = d->had[i];
        if (v->dtype == TG_F32)
            APPLY_LOOP(float);
        else
            APPLY_LOOP(double);
        if (v->grad != p->gview) {
            tg_tensor_release(v->grad);
            v->grad = tg_tensor_retain(p->gview);
        }
    }
    d->detached = false;
}

tg_status tg_dist_backward(tg_dist *d, tg_tensor *loss)
{
    tg_status st = check_usable(d, "dist_backward");
    if (st) return st;
    if (!d->ps)
        return tg__err(TG_ERR_INVALID, "'dist_backward' before tg_dist_attach or "
                                       "tg_dist_broadcast: no parameter set");
    tg_params *ps = d->ps;
    /* Parameters added since: new buckets (the same on every rank, as the
     * layouts are the same). Failing here leaves the others waiting until
     * their timeout: nothing can be sent without buckets. */
    if ((d->bps != ps || d->nparams != ps->n) && (st = make_buckets(d, ps))) return st;
    double t0 = now_s();
    tg_status local = TG_OK;
    char msg[MSG_LEN] = "";
    if (!loss) {
        local = tg_last_error();
        if (!local)
            local = tg__err(TG_ERR_INVALID, "'dist_backward' got a NULL loss and no error was set");
        snprintf(msg, sizeof msg, "%s", tg_last_error_message());
    }
    /* prev: the flat buffer holds it once synced. The parameters then drop
     * their gradient, so that the backward leaves only this step's local
     * gradient on them and the flat buffer keeps prev. */
    if (!local && (local = tg_params_sync_grad(ps)))
        snprintf(msg, sizeof msg, "%s", tg_last_error_message());
    d->detached = !local; /* else nothing synced: leave the gradients be, send zeros */
    for (int i = 0; i < ps->n; i++) {
        tg__param *p = &ps->p[i];
        d->staged[i] = false;
        d->had[i] = p->pool < TG__POOL_TRAINABLE && p->value->grad != NULL;
        if (d->had[i] && d->detached) {
            tg_tensor_release(p->value->grad);
            p->value->grad = NULL;
        }
    }
    for (int k = 0; k < d->nb; k++) {
        bucket *b = &d->b[k];
        b->pending = 0;
        b->started = b->done = false;
        b->t_start = b->t_done = 0;
    }
    for (int i = 0; i < ps->n; i++)
        if (d->slots[i].bucket >= 0) d->b[d->slots[i].bucket].pending++;
    d->next_start = 0;

    /* This rank's backward; with tg_dist_attach, buckets start as their
     * gradients come in. */
    if (!local) {
        /* A parameter with a previous gradient keeps it in the flat buffer
         * through the sweep (apply_grads adds the reduced sum to it), so it
         * may not take the buffer as its gradient sink (tape/backward.c)
         * meanwhile: it gets a tensor of its own. The others write their
         * local gradients there, staged into the buckets from it. */
        for (int i = 0; i < ps->n; i++)
            if (d->had[i] && ps->p[i].value->gsink == ps->p[i].gview)
                ps->p[i].value->gsink = NULL;
        d->in_backward = d->tape != NULL;
        local = tg_backward(loss);
        d->in_backward = false;
        for (int i = 0; i < ps->n; i++) ps->p[i].value->gsink = ps->p[i].gview;
        if (local) snprintf(msg, sizeof msg, "%s", tg_last_error_message());
    }
    double t1 = now_s();
    if (d->broken) {
        /* An MPI error inside the sweep: the collectives are out of step. */
        restore_grads(d);
        return tg__err(local ? local : TG_ERR_DIST, "%s", msg);
    }
    /* Whatever the sweep did not hand over: the parameters' new gradients
     * (no overlap, or not leaves of the attached tape), zeros where there
     * is none or this rank failed. */
    tg_status cst = TG_OK;
    for (int i = 0; i < ps->n; i++) {
        if (d->slots[i].bucket < 0 || d->staged[i]) continue;
        tg_tensor *g = local ? NULL : ps->p[i].value->grad;
        tg_status s = stage(d, i, g);
        if (s && !local && !cst) {
            cst = s;
            snprintf(msg, sizeof msg, "%s", tg_last_error_message());
        }
    }
    if (!local) local = cst;
    st = start_ready(d);
    bool done = false;
    double deadline = now_s() + d->o.timeout_s;
    for (long spin = 0; !st; spin++) {
        st = progress(d, &done);
        if (st || done) break;
        if (now_s() > deadline) {
            int k = 0;
            while (k < d->nb && d->b[k].done) k++;
            char what[96];
            snprintf(what, sizeof what, "the gradient all-reduce (bucket %d of %d)", k + 1, d->nb);
            st = timed_out(d, what);
            break;
        }
        backoff(spin);
    }
    double t2 = now_s();
    d->stats = (tg_dist_stats){.exposed_s = t2 - t1, .backward_s = t1 - t0, .buckets = d->nb};
    for (int k = 0; k < d->nb; k++) {
        const bucket *b = &d->b[k];
        d->stats.bytes += (size_t)b->numel * tg_dtype_size(ps->pools[b->pool].dtype);
        if (b->done) d->stats.allreduce_s += b->t_done - b->t_start;
    }
    if (st) {
        restore_grads(d);
        return st;
    }
    st = agree(d, local, msg);
    if (st)
        restore_grads(d);
    else
        apply_grads(d);
    return st;
}

/* ---- Blocking all-reduce of the flat gradients */

#define SCALE_LOOP(T)                                                   \
    do {                                                                \
        T *g = data;                                                    \
        for (int64_t j = 0; j < n; j++) g[j] = g[j] / (T)d->size;       \
    } while (0)

tg_status tg_dist_allreduce_grads(tg_dist *d, tg_params *ps)
{
    tg_status st = check_usable(d, "dist_allreduce_grads");
    if (st) return st;
    if (!ps)
        return tg__err(TG_ERR_NULL, "bad argument #2 to 'dist_allreduce_grads' (NULL parameter "
                                    "set)");
    /* A failed sync is agreed on, so that no rank waits for it. */
    if ((st = tg_dist_check(d, tg_params_sync_grad(ps)))) return st;
    req_list rl = {0};
    for (int p = 0; !st && p < TG__POOL_TRAINABLE; p++) {
        tg__pool *pl = &ps->pools[p];
        size_t es = tg_dtype_size(pl->dtype);
        int64_t chunk = (int64_t)(d->o.bucket_bytes / es) ? (int64_t)(d->o.bucket_bytes / es) : 1;
        if (chunk > INT32_MAX) chunk = INT32_MAX;
        char *data = pl->numel ? tg__tensor_ptr(pl->grads) : NULL;
        for (int64_t at = 0; !st && at < pl->numel; at += chunk) {
            int64_t len = pl->numel - at < chunk ? pl->numel - at : chunk;
            if (rl.n == rl.cap) {
                int cap = rl.cap ? 2 * rl.cap : 16;
                MPI_Request *r = realloc(rl.r, (size_t)cap * sizeof *r);
                if (!r) {
                    /* The others have started theirs: the ranks are out of
                     * step from here. */
                    d->broken = true;
                    st = tg__err(TG_ERR_NOMEM, "out of memory for MPI requests");
                    break;
                }
                rl.r = r;
                rl.cap = cap;
            }
            int rc = MPI_Iallreduce(MPI_IN_PLACE, data + (size_t)at * es, (int)len,
                                    p == TG__POOL_F32 ? MPI_FLOAT : MPI_DOUBLE, MPI_SUM, d->comm,
                                    &rl.r[rl.n]);
            if (rc != MPI_SUCCESS) st = mpi_fail(d, rc, "MPI_Iallreduce");
            else rl.n++;
        }
    }
    if (!st) st = wait_all(d, rl.n, rl.r, "the gradient all-reduce");
    free(rl.r);
    if (st) return st;
    for (int p = 0; p < TG__POOL_TRAINABLE; p++) {
        tg__pool *pl = &ps->pools[p];
        if (d->o.sum || !pl->numel) continue;
        void *data = tg__tensor_ptr(pl->grads);
        int64_t n = pl->numel;
        if (pl->dtype == TG_F32)
            SCALE_LOOP(float);
        else
            SCALE_LOOP(double);
    }
    for (int i = 0; i < ps->n; i++) {
        tg__param *p = &ps->p[i];
        if (p->pool < TG__POOL_TRAINABLE && !p->value->grad)
            p->value->grad = tg_tensor_retain(p->gview);
    }
    return TG_OK;
}
