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
 * only, never cached buffers. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "core/internal.h"

#if TG_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

#define TG_CACHE_MIN ((size_t)64 << 10)
/* Under AddressSanitizer a reused buffer would hide a use after free. */
#if TG_ASAN
#define TG_CACHE_SLOTS 0
#else
/* A training step of the 16-layer benchmark frees more than 64 large buffers;
 * with 64 slots the rest went back to jemalloc and came back as page faults
 * (2% of the step in clear_page). */
#define TG_CACHE_SLOTS 256
#endif
#define TG_CACHE_BYTES ((size_t)1 << 30)

static _Atomic size_t mem_current;
static _Atomic size_t mem_peak;

static struct {
    pthread_mutex_t lock;
    void *ptr[TG_CACHE_SLOTS + 1];
    size_t size[TG_CACHE_SLOTS + 1];
    int n;
    size_t bytes;
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void *cache_take(size_t n)
{
    void *p = NULL;
    pthread_mutex_lock(&cache.lock);
    for (int i = cache.n - 1; i >= 0; i--) {
        if (cache.size[i] != n) continue;
        p = cache.ptr[i];
        cache.bytes -= n;
        cache.ptr[i] = cache.ptr[cache.n - 1];
        cache.size[i] = cache.size[cache.n - 1];
        cache.n--;
        break;
    }
    pthread_mutex_unlock(&cache.lock);
    return p;
}

static bool cache_put(void *p, size_t n)
{
    bool kept = false;
    pthread_mutex_lock(&cache.lock);
    if (cache.n < TG_CACHE_SLOTS && cache.bytes + n <= TG_CACHE_BYTES) {
        cache.ptr[cache.n] = p;
        cache.size[cache.n++] = n;
        cache.bytes += n;
        kept = true;
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

void *tg__data_alloc(size_t nbytes)
{
    size_t n = nbytes ? nbytes : 1;
    void *p = n >= TG_CACHE_MIN ? cache_take(n) : NULL;
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
    if (n >= TG_CACHE_MIN && cache_put(p, n)) return;
    raw_free(p, n);
}

void tg__data_trim(void)
{
    pthread_mutex_lock(&cache.lock);
    for (int i = 0; i < cache.n; i++) raw_free(cache.ptr[i], cache.size[i]);
    cache.n = 0;
    cache.bytes = 0;
    pthread_mutex_unlock(&cache.lock);
}

void tg__mem_count(size_t nbytes)
{
    size_t now = atomic_fetch_add(&mem_current, nbytes) + nbytes;
    size_t peak = atomic_load(&mem_peak);
    while (now > peak && !atomic_compare_exchange_weak(&mem_peak, &peak, now)) {
    }
}

void tg__mem_uncount(size_t nbytes)
{
    atomic_fetch_sub(&mem_current, nbytes);
}

void tg_mem_trim(void)
{
    tg__data_trim();
}

size_t tg_mem_current_bytes(void)
{
    return atomic_load(&mem_current);
}

size_t tg_mem_peak_bytes(void)
{
    return atomic_load(&mem_peak);
}

void tg_mem_reset_peak(void)
{
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
