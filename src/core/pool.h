/* The elementwise thread pool: one job at a time cut into parts, part 0 on
 * the caller. Kernels' range splitting (backend/parallel.c) and the tape's
 * pointwise regions both run on it; it knows neither. Its size follows
 * OpenBLAS's thread count (set by the backend at start-up and by
 * tg_set_num_threads), so elementwise jobs and BLAS calls, which never run
 * at the same time, use the same cores. */
#ifndef TG_CORE_POOL_H
#define TG_CORE_POOL_H

#include "core/internal.h"

#define TG_POOL_MAX_THREADS 64

/* Runs f(ctx, part, nparts) for every part and returns when all are done.
 * nparts may come out smaller than asked (at most the pool's size, or
 * fewer if a worker cannot be started): f gets the count that runs. One
 * job at a time; f must not start another. */
TG_INTERNAL void tg__pool_run(void (*f)(void *ctx, int part, int nparts), void *ctx, int nparts);
/* Tells the workers to stop spinning for the next job and sleep: called
 * before a BLAS call that runs on several threads, which need the cores.
 * Cheap when they already sleep (one relaxed load). */
TG_INTERNAL void tg__pool_park(void);
/* Whether the workers are awake (working or spinning for the next job),
 * so that a job handed to them starts at once; asleep, one costs a
 * wake-up (tens of microseconds on a VM). A hint: it can change at once. */
TG_INTERNAL bool tg__pool_awake(void);
/* How many jobs were split across workers since start-up (tests). */
TG_INTERNAL uint64_t tg__pool_jobs(void);
/* Threads a job may use, the caller included (1 until a size is set). */
TG_INTERNAL int tg__pool_size(void);
/* Sets the size (1..TG_POOL_MAX_THREADS, not checked here). */
TG_INTERNAL void tg__pool_set_size(int n);
/* Sets the size to n unless one was set already (the start-up default). */
TG_INTERNAL void tg__pool_default_size(int n);

#endif
