/* Tensor storage allocation: jemalloc when built with it (else malloc),
 * with byte counters for the memory accounting API. Sized frees let
 * jemalloc skip its size lookup. */
#include <stdatomic.h>
#include <stdlib.h>

#include "core/internal.h"

#if TG_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

static _Atomic size_t mem_current;
static _Atomic size_t mem_peak;

void *tg__data_alloc(size_t nbytes)
{
    size_t n = nbytes ? nbytes : 1;
#if TG_HAVE_JEMALLOC
    void *p = mallocx(n, MALLOCX_ALIGN(64));
#else
    void *p = NULL;
    if (posix_memalign(&p, 64, n) != 0) p = NULL;
#endif
    if (!p) return NULL;
    tg__mem_count(nbytes);
    return p;
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

void tg__data_free(void *p, size_t nbytes)
{
    if (!p) return;
    tg__mem_uncount(nbytes);
#if TG_HAVE_JEMALLOC
    sdallocx(p, nbytes ? nbytes : 1, MALLOCX_ALIGN(64));
#else
    free(p);
#endif
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
