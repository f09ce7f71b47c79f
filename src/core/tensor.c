/* Backend tensors: layout, creation, accessors and reference counting. */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

static TG_THREAD_LOCAL tg_backend default_backend = TG_BACKEND_CPU;

/* Set once, before any tensor has a tape (see internal.h). */
static _Atomic(tg_tape_release_fn) tape_release;

void tg__tensor_set_tape_release(tg_tape_release_fn fn)
{
    atomic_store_explicit(&tape_release, fn, memory_order_release);
}

static const char *const dtype_names[TG_DTYPE_COUNT] = {"f32", "f64", "i64"};
static const size_t dtype_sizes[TG_DTYPE_COUNT] = {4, 8, 8};
static const char *const backend_names[TG_BACKEND_COUNT] = {"ref", "cpu"};

const char *tg_dtype_name(tg_dtype dtype)
{
    return (unsigned)dtype < TG_DTYPE_COUNT ? dtype_names[dtype] : "invalid";
}

const char *tg_backend_name(tg_backend backend)
{
    return (unsigned)backend < TG_BACKEND_COUNT ? backend_names[backend] : "invalid";
}

size_t tg_dtype_size(tg_dtype dtype)
{
    return (unsigned)dtype < TG_DTYPE_COUNT ? dtype_sizes[dtype] : 0;
}

tg_backend tg_set_default_backend(tg_backend backend)
{
    tg_backend prev = default_backend;
    if ((unsigned)backend < TG_BACKEND_COUNT)
        default_backend = backend;
    else
        tg__err(TG_ERR_INVALID, "bad argument #1 to 'set_default_backend' (no backend %d)",
                (int)backend);
    return prev;
}

tg_backend tg_default_backend(void)
{
    return default_backend;
}

char *tg_shape_str(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t used = 0;
    if (!buf || len == 0) return buf;
    buf[0] = '\0';
    if (ndim > 0 && !shape) {
        snprintf(buf, len, "[?]"); /* a rank without dims: say so, never read NULL */
        return buf;
    }
    used += (size_t)snprintf(buf + used, len - used, "[");
    for (int i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (used < len) snprintf(buf + used, len - used, "]");
    return buf;
}

tg_status tg__check_dtype(const char *op, tg_dtype dtype)
{
    if ((unsigned)dtype >= TG_DTYPE_COUNT)
        return tg__err(TG_ERR_DTYPE, "bad argument to '%s' (invalid dtype %d)", op, (int)dtype);
    return TG_OK;
}

tg_status tg__check_shape(const char *op, int ndim, const int64_t *shape)
{
    if (ndim < 0 || ndim > TG_MAX_DIMS)
        return tg__err(TG_ERR_SHAPE, "bad argument to '%s' (ndim %d outside 0..%d)", op, ndim,
                       TG_MAX_DIMS);
    if (ndim > 0 && !shape) return tg__err(TG_ERR_NULL, "bad argument to '%s' (NULL shape)", op);
    /* The product of the nonzero dims bounds both the byte count and the
     * strides (tg__contig_strides counts a 0 as 1), so a zero-size dim
     * does not switch the check off. */
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return tg__err(TG_ERR_SHAPE, "bad argument to '%s' (dim %d has negative size %lld)",
                           op, i, (long long)shape[i]);
        if (shape[i] > 0 && n > INT64_MAX / 16 / shape[i])
            return tg__err(TG_ERR_SHAPE, "bad argument to '%s' (shape too large)", op);
        if (shape[i] > 0) n *= shape[i];
    }
    return TG_OK;
}

/* Freed headers are kept per thread for reuse: a tape records and frees a
 * few headers per op, and this skips the allocator for them. Off under
 * AddressSanitizer, which must see every free. */
#if TG_ASAN
#define HEADER_CACHE 0
#else
#define HEADER_CACHE 256
#endif
static TG_THREAD_LOCAL tg_tensor *free_headers[HEADER_CACHE + 1];
static TG_THREAD_LOCAL int nfree_headers;
/* The cache's capacity on this thread: 0 until the thread is registered
 * (below), so the push stays one compare, as it was before registration. */
static TG_THREAD_LOCAL int cap_headers;
/* Past the array: every further freed header, linked through its first
 * word, so that a long tape (10^5 ops and more, several headers each)
 * gets its headers back on the next step instead of fresh pages from the
 * allocator (which had returned them: a page fault per dozen headers, and
 * 11x the per-op time of a short tape). It holds at most what the
 * thread's largest step had alive; tg_mem_trim returns it. */
static TG_THREAD_LOCAL void *spare_headers;

void tg__headers_trim(void)
{
    void *t;
    while ((t = tg__stack_pop(&spare_headers))) free(t);
}

/* What a thread holds (cached headers, the scope arrays) is freed when it
 * exits: the first header it caches or the scope array it allocates sets
 * a thread-specific key whose destructor frees it all. Without this, every
 * short-lived thread that used the library left about 85 KB behind. */
static pthread_key_t thread_key;
static pthread_once_t thread_key_once = PTHREAD_ONCE_INIT;
static bool thread_key_made;
static TG_THREAD_LOCAL bool thread_registered;

static void thread_exit(void *unused)
{
    (void)unused;
    tg__scope_thread_exit(); /* may cache headers: first */
    while (nfree_headers > 0) free(free_headers[--nfree_headers]);
    tg__headers_trim();
    tg__region_trim();
    tg__data_thread_exit(); /* after the frees above, which may cache buffers */
    tg__mem_thread_exit(); /* last: the frees above are counted */
    /* A later destructor that uses the library registers the thread again
     * (POSIX then runs this one once more). */
    cap_headers = 0;
    thread_registered = false;
}

static void thread_key_make(void)
{
    thread_key_made = pthread_key_create(&thread_key, thread_exit) == 0;
}

bool tg__thread_register(void)
{
    if (thread_registered) return true;
    pthread_once(&thread_key_once, thread_key_make);
    thread_registered = thread_key_made && pthread_setspecific(thread_key, &thread_key) == 0;
    return thread_registered;
}

/* A full cache, or one not opened yet on this thread: out of line. */
#if defined(__GNUC__)
__attribute__((noinline))
#endif
static void header_free_slow(tg_tensor *t)
{
    if (HEADER_CACHE > 0 && cap_headers == 0 && tg__thread_register()) {
        cap_headers = HEADER_CACHE;
        free_headers[nfree_headers++] = t;
        return;
    }
    if (HEADER_CACHE > 0 && cap_headers > 0) { /* the array is full */
        tg__stack_push(&spare_headers, t);
        return;
    }
    free(t);
}

/* The array is empty: a spare header, or a new one. */
#if defined(__GNUC__)
__attribute__((noinline))
#endif
static tg_tensor *header_alloc_slow(void)
{
    tg_tensor *t = tg__stack_pop(&spare_headers);
    return t ? t : malloc(sizeof *t);
}

static void header_free(tg_tensor *t)
{
    if (nfree_headers < cap_headers)
        free_headers[nfree_headers++] = t;
    else
        header_free_slow(t);
}

/* A header with every field zero but refcount 1, slot and node -1. The
 * fields are set one by one: a memset of the whole header compiles to a
 * `rep stos`, whose start-up alone costs more than the stores. The small
 * data buffer at the end needs no zeroing; the storage is set by the
 * caller (tg__tensor_empty fills own_storage, a view points at its
 * base's), so own_storage is left as it is too. GCC would turn the
 * shape and stride loops back into a memset (and that into `rep stos`)
 * unless told not to. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-distribute-patterns")))
#endif
static tg_tensor *header_new(void)
{
    tg_tensor *t = nfree_headers ? free_headers[--nfree_headers] : header_alloc_slow();
    if (!t) {
        tg__err(TG_ERR_NOMEM, "out of memory allocating a tensor header");
        return NULL;
    }
    t->refcount = 1;
    t->dtype = TG_F32;
    t->backend = TG_BACKEND_REF;
    t->ndim = 0;
    for (int i = 0; i < TG_MAX_DIMS; i++) {
        t->shape[i] = 0;
        t->strides[i] = 0;
    }
    t->numel = 0;
    t->offset = 0;
    t->contiguous = false;
    t->scope_owned = false;
    t->storage = NULL;
    t->tape = NULL;
    t->gen = 0;
    t->slot = -1;
    t->node = -1;
    t->spec_epoch = 0;
    t->is_leaf = false;
    t->leaf_view = false;
    t->nograd = false;
    t->grad = NULL;
    t->gsink = NULL;
    return t;
}

tg_tensor *tg__tensor_empty(tg_dtype dtype, int ndim, const int64_t *shape, tg_backend backend)
{
    tg_tensor *t = header_new();
    if (!t) return NULL;
    t->dtype = dtype;
    t->backend = backend;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    tg__contig_strides(ndim, shape, t->strides);
    t->numel = tg__numel(ndim, shape);
    t->contiguous = true;
    size_t nbytes = (size_t)t->numel * tg__esize(dtype); /* dtype is valid here */
    tg_storage *st = &t->own_storage;
    st->inline_data = nbytes <= TG_SMALL_BYTES;
    if (st->inline_data) {
        st->data = t->small;
        tg__mem_count(nbytes);
    } else {
        st->data = tg__data_alloc(nbytes);
        if (!st->data) {
            header_free(t);
            tg__err(TG_ERR_NOMEM, "out of memory allocating %zu bytes of tensor data", nbytes);
            return NULL;
        }
    }
    atomic_init(&st->refcount, 1);
    st->version = 0;
    st->backend = backend;
    st->nbytes = nbytes;
    st->block = t;
    t->storage = st;
    return t;
}

tg_tensor *tg__tensor_empty_spec(const tg_spec *spec, tg_backend backend)
{
    return tg__tensor_empty(spec->dtype, spec->ndim, spec->shape, backend);
}

tg_tensor *tg__tensor_view(const tg_tensor *src, int ndim, const int64_t *shape,
                           const int64_t *strides, int64_t offset)
{
    tg_tensor *t = header_new();
    if (!t) return NULL;
    t->dtype = src->dtype;
    t->backend = src->backend;
    t->ndim = ndim;
    t->numel = tg__numel(ndim, shape);
    t->offset = offset;
    int64_t expect = 1;
    t->contiguous = true;
    for (int i = ndim - 1; i >= 0; i--) {
        t->shape[i] = shape[i];
        t->strides[i] = strides[i];
        if (shape[i] != 1 && strides[i] != expect) t->contiguous = false;
        expect *= shape[i];
    }
    if (t->contiguous) tg__contig_strides(ndim, shape, t->strides);
    t->storage = src->storage;
    atomic_fetch_add_explicit(&t->storage->refcount, 1, memory_order_relaxed);
    return t;
}

/* The public functions (the macros of internal.h are for the library's
 * own calls). */
tg_tensor *(tg_tensor_retain)(tg_tensor *t)
{
    return tg__retain(t);
}

void(tg_tensor_release)(tg_tensor *t)
{
    tg__release(t);
}

void tg__tensor_release_last(tg_tensor *t)
{
    if (t->grad) tg_tensor_release(t->grad);
    if (t->tape) atomic_load_explicit(&tape_release, memory_order_acquire)(t->tape);
    tg_storage *st = t->storage;
    bool embeds = st->block == t;
    /* Sole holder (the common case): no other thread can hold or take a
     * reference, so no locked instruction. */
    bool last = atomic_load_explicit(&st->refcount, memory_order_acquire) == 1 ||
                atomic_fetch_sub_explicit(&st->refcount, 1, memory_order_acq_rel) == 1;
    if (last) {
        if (st->inline_data)
            tg__mem_uncount(st->nbytes);
        else
            tg__data_free(st->data, st->nbytes);
        if (!embeds) header_free(st->block); /* the dead base that embedded it */
    } else if (embeds) {
        return; /* views still use the storage inside this block */
    }
    header_free(t);
}

/* Writes value (as dtype) to element i of a contiguous buffer. */
static void store(void *p, tg_dtype dt, int64_t i, double v)
{
    switch (dt) {
    case TG_F32: ((float *)p)[i] = (float)v; break;
    case TG_F64: ((double *)p)[i] = v; break;
    case TG_I64: ((int64_t *)p)[i] = tg__sat_i64(v); break;
    }
}

static double load(const void *p, tg_dtype dt, int64_t i)
{
    switch (dt) {
    case TG_F32: return ((const float *)p)[i];
    case TG_F64: return ((const double *)p)[i];
    case TG_I64: return (double)((const int64_t *)p)[i];
    }
    return 0.0;
}

static tg_tensor *create(const char *op, tg_dtype dtype, int ndim, const int64_t *shape)
{
    if (tg__check_dtype(op, dtype) || tg__check_shape(op, ndim, shape)) return NULL;
    return tg__tensor_empty(dtype, ndim, shape, default_backend);
}

tg_tensor *tg_tensor_from_data(tg_dtype dtype, int ndim, const int64_t *shape, const void *data)
{
    tg_tensor *t = create("tensor_from_data", dtype, ndim, shape);
    if (!t) return NULL;
    if (!data && t->numel > 0) {
        tg_tensor_release(t);
        tg__err(TG_ERR_NULL, "bad argument #4 to 'tensor_from_data' (NULL data)");
        return NULL;
    }
    if (t->numel) memcpy(t->storage->data, data, t->storage->nbytes);
    return tg__scope_track(t);
}

tg_tensor *tg_full(tg_dtype dtype, int ndim, const int64_t *shape, double value)
{
    tg_tensor *t = create("full", dtype, ndim, shape);
    if (!t) return NULL;
    for (int64_t i = 0; i < t->numel; i++) store(t->storage->data, dtype, i, value);
    return tg__scope_track(t);
}

tg_tensor *tg_zeros(tg_dtype dtype, int ndim, const int64_t *shape)
{
    tg_tensor *t = create("zeros", dtype, ndim, shape);
    if (!t) return NULL;
    memset(t->storage->data, 0, t->storage->nbytes);
    return tg__scope_track(t);
}

tg_tensor *tg_ones(tg_dtype dtype, int ndim, const int64_t *shape)
{
    return tg_full(dtype, ndim, shape, 1.0);
}

tg_tensor *tg_scalar(tg_dtype dtype, double value)
{
    return tg_full(dtype, 0, NULL, value);
}

tg_tensor *tg_arange(tg_dtype dtype, double start, double stop, double step)
{
    if (step == 0.0 || !isfinite(start) || !isfinite(stop) || !isfinite(step)) {
        tg__err(TG_ERR_INVALID, "bad argument #4 to 'arange' (step must be finite and nonzero)");
        return NULL;
    }
    double n = ceil((stop - start) / step);
    /* Checked as a double: the cast of a count past i64 is undefined. */
    if (!(n <= 0x1p60)) {
        tg__err(TG_ERR_SHAPE, "bad argument to 'arange' (%g elements from %g to %g by %g; too "
                              "many)", n, start, stop, step);
        return NULL;
    }
    int64_t shape[1] = {n > 0 ? (int64_t)n : 0};
    tg_tensor *t = create("arange", dtype, 1, shape);
    if (!t) return NULL;
    for (int64_t i = 0; i < shape[0]; i++) store(t->storage->data, dtype, i, start + (double)i * step);
    return tg__scope_track(t);
}

/* ---- seeded generator */
static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void tg_rng_seed(tg_rng *rng, uint64_t seed)
{
    if (!rng) return;
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t tg_rng_next(tg_rng *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double tg_rng_double(tg_rng *rng)
{
    return (double)(tg_rng_next(rng) >> 11) * 0x1.0p-53;
}

double tg_rng_gauss(tg_rng *rng)
{
    for (;;) {
        double u = 2.0 * tg_rng_double(rng) - 1.0;
        double v = 2.0 * tg_rng_double(rng) - 1.0;
        double s = u * u + v * v;
        if (s > 0.0 && s < 1.0) return u * sqrt(-2.0 * log(s) / s);
    }
}

static tg_tensor *sample(const char *op, tg_rng *rng, tg_dtype dtype, int ndim,
                         const int64_t *shape, double a, double b, bool normal)
{
    if (!rng) {
        tg__err(TG_ERR_NULL, "bad argument #1 to '%s' (NULL generator)", op);
        return NULL;
    }
    if (!tg__is_float(dtype)) {
        tg__err(TG_ERR_DTYPE, "bad argument #2 to '%s' (%s is not a floating dtype)", op,
                tg_dtype_name(dtype));
        return NULL;
    }
    tg_tensor *t = create(op, dtype, ndim, shape);
    if (!t) return NULL;
    for (int64_t i = 0; i < t->numel; i++) {
        double v = normal ? a + b * tg_rng_gauss(rng) : a + (b - a) * tg_rng_double(rng);
        store(t->storage->data, dtype, i, v);
    }
    return tg__scope_track(t);
}

tg_tensor *tg_rand_uniform(tg_rng *rng, tg_dtype dtype, int ndim, const int64_t *shape, double lo,
                           double hi)
{
    return sample("rand_uniform", rng, dtype, ndim, shape, lo, hi, false);
}

tg_tensor *tg_rand_normal(tg_rng *rng, tg_dtype dtype, int ndim, const int64_t *shape,
                          double mean, double std)
{
    return sample("rand_normal", rng, dtype, ndim, shape, mean, std, true);
}

/* ---- accessors */
int tg_tensor_ndim(const tg_tensor *t)
{
    return t ? t->ndim : -1;
}

const int64_t *tg_tensor_shape(const tg_tensor *t)
{
    return t ? t->shape : NULL;
}

int64_t tg_tensor_dim(const tg_tensor *t, int i)
{
    if (!t) return -1;
    if (i < 0) i += t->ndim;
    return (i >= 0 && i < t->ndim) ? t->shape[i] : -1;
}

int64_t tg_tensor_numel(const tg_tensor *t)
{
    return t ? t->numel : 0;
}

tg_dtype tg_tensor_dtype(const tg_tensor *t)
{
    return t ? t->dtype : TG_F32;
}

tg_backend tg_tensor_backend(const tg_tensor *t)
{
    return t ? t->backend : TG_BACKEND_REF;
}

bool tg_tensor_is_contiguous(const tg_tensor *t)
{
    return t && t->contiguous;
}

/* The first element of contiguous t, for the data accessor op. */
static void *data_of(const tg_tensor *t, const char *op)
{
    if (!t) {
        tg__err_null(op, 1);
        return NULL;
    }
    if (!t->contiguous) {
        tg__err(TG_ERR_INVALID, "bad argument #1 to '%s' (tensor is a strided view; use "
                                "tg_contiguous first)", op);
        return NULL;
    }
    return tg__tensor_ptr(t);
}

void *tg_tensor_data(tg_tensor *t)
{
    void *p = data_of(t, "tensor_data");
    if (p && !tg__in_op) tg__tensor_written(t);
    return p;
}

const void *tg_tensor_data_ro(const tg_tensor *t)
{
    return data_of(t, "tensor_data_ro");
}

uint32_t tg_tensor_version(const tg_tensor *t)
{
    return t ? t->storage->version : 0;
}

/* Flat row-major index -> storage element offset. */
static int64_t offset_of(const tg_tensor *t, int64_t i)
{
    if (t->contiguous) return t->offset + i;
    int64_t off = t->offset;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d];
        off += (i % n) * t->strides[d];
        i /= n;
    }
    return off;
}

tg_status tg_tensor_copy_out(const tg_tensor *t, void *dst, size_t nbytes)
{
    if (!t) return tg__err_null("tensor_copy_out", 1);
    if (!dst) return tg__err(TG_ERR_NULL, "bad argument #2 to 'tensor_copy_out' (NULL buffer)");
    size_t es = tg_dtype_size(t->dtype);
    size_t need = (size_t)t->numel * es;
    if (nbytes < need)
        return tg__err(TG_ERR_INVALID,
                       "bad argument #3 to 'tensor_copy_out' (buffer of %zu bytes, need %zu)",
                       nbytes, need);
    if (t->contiguous) {
        if (need) memcpy(dst, tg__tensor_ptr(t), need);
        return TG_OK;
    }
    if (!need) return TG_OK;
    /* Runs of the innermost dims whose elements lie side by side (a dim of
     * one element lies anywhere), one memcpy each, the outer dims counted
     * off like an odometer. */
    const char *base = t->storage->data;
    int k = t->ndim;
    int64_t run = 1, idx[TG_MAX_DIMS] = {0}, off = t->offset;
    while (k > 0 && (t->shape[k - 1] == 1 || t->strides[k - 1] == run)) run *= t->shape[--k];
    size_t rb = (size_t)run * es;
    for (int64_t o = 0, nrun = t->numel / run; o < nrun; o++) {
        memcpy((char *)dst + (size_t)o * rb, base + (size_t)off * es, rb);
        for (int d = k - 1; d >= 0; d--) {
            off += t->strides[d];
            if (++idx[d] < t->shape[d]) break;
            off -= t->strides[d] * t->shape[d];
            idx[d] = 0;
        }
    }
    return TG_OK;
}

tg_status tg_tensor_get(const tg_tensor *t, int64_t i, double *out)
{
    if (!t) return tg__err_null("tensor_get", 1);
    if (!out) return tg__err(TG_ERR_NULL, "bad argument #3 to 'tensor_get' (NULL output)");
    if (i < 0 || i >= t->numel)
        return tg__err(TG_ERR_INVALID, "bad argument #2 to 'tensor_get' (index %lld outside [0,%lld))",
                       (long long)i, (long long)t->numel);
    *out = load(t->storage->data, t->dtype, offset_of(t, i));
    return TG_OK;
}

tg_status tg_tensor_item(const tg_tensor *t, double *out)
{
    if (!t) return tg__err_null("tensor_item", 1);
    if (t->numel != 1) {
        char s[96];
        return tg__err(TG_ERR_SHAPE, "bad argument #1 to 'tensor_item' (shape %s has %lld elements, need 1)",
                       tg_shape_str(t->ndim, t->shape, s, sizeof s), (long long)t->numel);
    }
    return tg_tensor_get(t, 0, out);
}
