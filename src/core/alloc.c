/* Tensor storage allocation: jemalloc when built with it (else malloc),
 * with byte counters for the memory accounting API. Sized frees let
 * jemalloc skip its size lookup.
 *
 * Freed large buffers are cached and reused by exact size. A training step
 * frees and reallocates the same large sizes every iteration; handed back
 * to the allocator, their pages go back to the kernel (jemalloc madvises
 * large extents on free), and the next step pays a page fault per 4 KiB to
 * get them again. The cache holds at most TG_CACHE_SLOTS buffers and
 * TG_CACHE_BYTES in all; the tg_mem_* counters count live tensor data
 * only, never cached buffers.
 *
 * Each thread keeps the buffers it frees in a cache of its own first (up
 * to TG_TCACHE_SLOTS and TG_TCACHE_BYTES), without a lock, and takes from
 * it first; what does not fit goes to the shared cache above, and a
 * thread's cache goes there when it exits. Two data-parallel workers
 * sharing one cache took each other's buffers: each reuse then pulled
 * the buffer's lines from the other core's cache, and the LSTM ran 2
 * workers at 1.63x one worker where two processes reach 1.9x. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

#if TG_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

/* 16 KiB and up: below that jemalloc's thread caches serve well. At
 * 64 KiB, the data-parallel LSTM's 32 KiB slices (replicas.h, 64 rows of
 * 128 floats) went to jemalloc on the worker threads, which faulted
 * ~1500 fresh pages per step and ran 2 workers slower than 1 (33 vs 28
 * ms/step at batch 128). */
#define TG_CACHE_MIN ((size_t)16 << 10)
/* Under AddressSanitizer a reused buffer would hide a use after free. */
#if TG_ASAN
#define TG_CACHE_SLOTS 0
#else
/* A training step of the 16-layer benchmark frees more than 64 large buffers;
 * with 64 slots the rest went back to jemalloc and came back as page faults
 * (2% of the step in clear_page). Two LSTM workers free over 256. */
#define TG_CACHE_SLOTS 1024
#endif
#define TG_CACHE_BYTES ((size_t)1 << 30)
/* Distinct sizes the cache can hold at once (open addressing; a power of
 * 2). A size seen once keeps its entry: training steps reuse a few dozen. */
#define TG_CACHE_SIZES 256

/* The count of tensor bytes, process-wide. Signed: a thread may publish a
 * free before another publishes the allocation (see tg__mem_count). */
static _Atomic int64_t mem_current;
static _Atomic int64_t mem_peak;

/* The cache: for each size, a stack of freed buffers linked through their
 * first word, so that take and put cost O(1) whatever the count. */
static struct {
    pthread_mutex_t lock;
    size_t key[TG_CACHE_SIZES]; /* 0: free entry */
    void *head[TG_CACHE_SIZES];
    int n;        /* buffers held */
    size_t bytes; /* their bytes */
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* The calling thread's cache: the shared one's layout, no lock. Made at
 * the thread's first cached free, once the thread is registered (so that
 * its exit empties and frees it): threads that never free a large buffer
 * (BLAS workers, say) carry one pointer of thread-local storage. */
#if TG_ASAN
#define TG_TCACHE_SLOTS 0
#else
#define TG_TCACHE_SLOTS 512
#endif
#define TG_TCACHE_BYTES ((size_t)256 << 20)
#define TG_TCACHE_SIZES 64
typedef struct tcache {
    size_t key[TG_TCACHE_SIZES];
    void *head[TG_TCACHE_SIZES];
    int n;
    size_t bytes;
} tcache;
static TG_THREAD_LOCAL tcache *tc;

/* The entry of size n in a table of nk keys (a power of 2), or where it
 * would go (-1: table full). */
static int entry_of(const size_t *key, int nk, size_t n)
{
    size_t h = (size_t)(((n >> 6) * 0x9E3779B97F4A7C15ull) >> 32);
    for (int k = 0; k < nk; k++) {
        int i = (int)((h + (size_t)k) & (size_t)(nk - 1));
        if (key[i] == n || key[i] == 0) return i;
    }
    return -1;
}

static int cache_entry(size_t n)
{
    return entry_of(cache.key, TG_CACHE_SIZES, n);
}

static void *cache_take(size_t n)
{
    void *p = NULL;
    pthread_mutex_lock(&cache.lock);
    int i = cache.n ? cache_entry(n) : -1;
    if (i >= 0 && cache.key[i] == n && (p = tg__stack_pop(&cache.head[i]))) {
        cache.bytes -= n;
        cache.n--;
    }
    pthread_mutex_unlock(&cache.lock);
    return p;
}

/* Drops the sizes that hold no buffer (the table is full of sizes seen
 * once: a program whose batch sizes vary), keeping the others. */
static void cache_compact(void)
{
    size_t key[TG_CACHE_SIZES];
    void *head[TG_CACHE_SIZES];
    memcpy(key, cache.key, sizeof key);
    memcpy(head, cache.head, sizeof head);
    memset(cache.key, 0, sizeof cache.key);
    memset(cache.head, 0, sizeof cache.head);
    for (int i = 0; i < TG_CACHE_SIZES; i++) {
        if (!head[i]) continue;
        int j = cache_entry(key[i]);
        cache.key[j] = key[i];
        cache.head[j] = head[i];
    }
}

static bool cache_put(void *p, size_t n)
{
    bool kept = false;
    pthread_mutex_lock(&cache.lock);
    if (cache.n < TG_CACHE_SLOTS && cache.bytes + n <= TG_CACHE_BYTES) {
        int i = cache_entry(n);
        if (i < 0) {
            cache_compact();
            i = cache_entry(n);
        }
        if (i >= 0) {
            cache.key[i] = n;
            tg__stack_push(&cache.head[i], p);
            cache.n++;
            cache.bytes += n;
            kept = true;
        }
    }
    pthread_mutex_unlock(&cache.lock);
    return kept;
}

static void *raw_alloc(size_t n)
{
#if TG_HAVE_JEMALLOC
    return mallocx(n, MALLOCX_ALIGN(64));
#else
    void *p = NULL;
    return posix_memalign(&p, 64, n) == 0 ? p : NULL;
#endif
}

static void raw_free(void *p, size_t n)
{
#if TG_HAVE_JEMALLOC
    sdallocx(p, n, MALLOCX_ALIGN(64));
#else
    (void)n;
    free(p);
#endif
}

static void *tcache_take(size_t n)
{
    tcache *c = tc;
    if (!c || !c->n) return NULL;
    int i = entry_of(c->key, TG_TCACHE_SIZES, n);
    void *p = i >= 0 && c->key[i] == n ? tg__stack_pop(&c->head[i]) : NULL;
    if (p) {
        c->bytes -= n;
        c->n--;
    }
    return p;
}

static bool tcache_put(void *p, size_t n)
{
    tcache *c = tc;
    if (!c) {
        if (!TG_TCACHE_SLOTS || !tg__thread_register() || !(c = calloc(1, sizeof *c)))
            return false;
        tc = c;
    }
    if (c->n >= TG_TCACHE_SLOTS || c->bytes + n > TG_TCACHE_BYTES) return false;
    int i = entry_of(c->key, TG_TCACHE_SIZES, n);
    if (i < 0) { /* full of sizes: drop those that hold nothing */
        size_t key[TG_TCACHE_SIZES];
        void *head[TG_TCACHE_SIZES];
        memcpy(key, c->key, sizeof key);
        memcpy(head, c->head, sizeof head);
        memset(c->key, 0, sizeof c->key);
        memset(c->head, 0, sizeof c->head);
        for (int k = 0; k < TG_TCACHE_SIZES; k++) {
            if (!head[k]) continue;
            int j = entry_of(c->key, TG_TCACHE_SIZES, key[k]);
            c->key[j] = key[k];
            c->head[j] = head[k];
        }
        if ((i = entry_of(c->key, TG_TCACHE_SIZES, n)) < 0) return false;
    }
    c->key[i] = n;
    tg__stack_push(&c->head[i], p);
    c->n++;
    c->bytes += n;
    return true;
}

static void raw_free(void *p, size_t n);

/* Empties the calling thread's cache: into the shared one (to_shared),
 * else back to the allocator. */
static void tcache_empty(bool to_shared)
{
    tcache *c = tc;
    for (int i = 0; c && i < TG_TCACHE_SIZES; i++) {
        void *p;
        while ((p = tg__stack_pop(&c->head[i])))
            if (!to_shared || !cache_put(p, c->key[i])) raw_free(p, c->key[i]);
        c->key[i] = 0;
    }
    if (c) {
        c->n = 0;
        c->bytes = 0;
    }
}

void *tg__data_alloc(size_t nbytes)
{
    size_t n = nbytes ? nbytes : 1;
    void *p = NULL;
    if (n >= TG_CACHE_MIN && !(p = tcache_take(n))) p = cache_take(n);
    if (!p) p = raw_alloc(n);
    if (!p && n >= TG_CACHE_MIN) { /* memory is short: give the cache back */
        tg__data_trim();
        p = raw_alloc(n);
    }
    if (!p) return NULL;
    tg__mem_count(nbytes);
    return p;
}

void tg__data_free(void *p, size_t nbytes)
{
    if (!p) return;
    tg__mem_uncount(nbytes);
    size_t n = nbytes ? nbytes : 1;
    if (n >= TG_CACHE_MIN && (tcache_put(p, n) || cache_put(p, n))) return;
    raw_free(p, n);
}

void tg__data_trim(void)
{
    tcache_empty(false);
    pthread_mutex_lock(&cache.lock);
    for (int i = 0; i < TG_CACHE_SIZES; i++) {
        void *p;
        while ((p = tg__stack_pop(&cache.head[i]))) raw_free(p, cache.key[i]);
    }
    cache.n = 0;
    cache.bytes = 0;
    pthread_mutex_unlock(&cache.lock);
}

/* Each thread adds to mem_current in batches: its allocations and frees
 * go to a thread-local delta, published (one atomic add) once it passes
 * MEM_BATCH either way, or the count would pass the peak (so the peak
 * stays exact for the thread that makes it), or the thread reads the
 * counters, ends a pool task or a replica step, or exits: two locked
 * instructions less per tensor (a chain of scalar ops makes two tensors
 * per op). A thread that cannot register its exit (mem_batched false)
 * publishes every count. */
#define MEM_BATCH ((int64_t)256 << 10)
static TG_THREAD_LOCAL int64_t mem_delta;
static TG_THREAD_LOCAL bool mem_batched;

static void mem_publish(int64_t d)
{
    int64_t now = atomic_fetch_add_explicit(&mem_current, d, memory_order_relaxed) + d;
    int64_t peak = atomic_load_explicit(&mem_peak, memory_order_relaxed);
    while (now > peak && !atomic_compare_exchange_weak_explicit(&mem_peak, &peak, now,
                                                                 memory_order_relaxed,
                                                                 memory_order_relaxed)) {
    }
}

void tg__mem_flush(void)
{
    int64_t d = mem_delta;
    mem_delta = 0;
    if (d) mem_publish(d);
}

void tg__mem_count(size_t nbytes)
{
    if (!mem_batched && !(mem_batched = tg__thread_register())) {
        mem_publish((int64_t)nbytes);
        return;
    }
    int64_t d = mem_delta += (int64_t)nbytes;
    if (d > MEM_BATCH || atomic_load_explicit(&mem_current, memory_order_relaxed) + d >
                             atomic_load_explicit(&mem_peak, memory_order_relaxed))
        tg__mem_flush();
}

void tg__mem_uncount(size_t nbytes)
{
    if (!mem_batched) {
        mem_publish(-(int64_t)nbytes);
        return;
    }
    if ((mem_delta -= (int64_t)nbytes) < -MEM_BATCH) tg__mem_flush();
}

void tg__data_thread_exit(void)
{
    tcache_empty(true);
    free(tc);
    tc = NULL;
}

void tg__mem_thread_exit(void)
{
    tg__mem_flush();
    mem_batched = false;
}

void tg_mem_trim(void)
{
    tg__data_trim();
    tg__headers_trim();
    tg__region_trim();
}

size_t tg_mem_current_bytes(void)
{
    tg__mem_flush();
    int64_t v = atomic_load(&mem_current);
    return v > 0 ? (size_t)v : 0;
}

size_t tg_mem_peak_bytes(void)
{
    tg__mem_flush();
    int64_t v = atomic_load(&mem_peak);
    return v > 0 ? (size_t)v : 0;
}

void tg_mem_reset_peak(void)
{
    tg__mem_flush();
    atomic_store(&mem_peak, atomic_load(&mem_current));
}

const char *tg_mem_allocator(void)
{
#if TG_HAVE_JEMALLOC
    return "jemalloc";
#else
    return "malloc";
#endif
}
