/* The elementwise thread pool (core/pool.h). Workers start on demand, are
 * detached and wait on a generation counter for the next job.
 *
 * Waiting spins first: a worker watches the counter for up to
 * POOL_SPIN_NS after its last job before it sleeps on the condition
 * variable, and the caller watches the count of parts still running for
 * as long before it sleeps. On the VM this was tuned on, a futex wake-up
 * cost 30-40 us, so a chain of ops on 64K floats ran 3.2x slower on two
 * threads than on one; work comes in bursts of ops a few microseconds
 * apart. The spin reads one atomic with the CPU's pause hint, so the core
 * it holds would be taken from OpenBLAS's threads during the window, so a
 * GEMM that OpenBLAS will split parks the workers first (tg__pool_park:
 * they stop spinning and sleep; the next job wakes them).
 * Sleeping and waking pair a seq_cst store with a seq_cst load on each
 * side (the counter against the count of sleepers, the parts left against
 * the caller's waiting flag), so a wake-up is never lost: whichever side
 * acts second sees the other. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "core/pool.h"

#define POOL_SPIN_NS 100000

typedef void (*part_fn)(void *ctx, int part, int nparts);

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv_work = PTHREAD_COND_INITIALIZER, cv_done = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t submit = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */
static int nthreads;   /* 0: not decided yet */
static _Atomic int nworkers; /* started (changed under submit) */
static _Atomic uint64_t gen;
static _Atomic int sleepers; /* workers asleep on cv_work, or about to be */
static _Atomic int pending;  /* workers still on the current job */
static _Atomic bool caller_waits;
static _Atomic bool parked; /* tg__pool_park: workers sleep now */
static _Atomic uint64_t jobs_split; /* jobs handed to workers, ever */
/* The job: written before gen is incremented, read after it is seen. */
static part_fn job;
static void *job_ctx;
static int job_parts;
/* The counter when worker i was started: its first job is the next one
 * (the one being submitted when it was started). */
static uint64_t start_gen[TG_POOL_MAX_THREADS];

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Spins until done(arg) or POOL_SPIN_NS pass; true if done. */
static bool spin_until(bool (*done)(uint64_t), uint64_t arg)
{
    uint64_t t0 = 0;
    for (unsigned i = 1;; i++) {
        if (done(arg)) return true;
        cpu_relax();
        if (i % 64 == 0) { /* the clock every 64 pauses: a few microseconds */
            uint64_t t = mono_ns();
            if (!t0)
                t0 = t;
            else if (t - t0 > POOL_SPIN_NS)
                return done(arg);
        }
    }
}

static bool new_job(uint64_t seen)
{
    return atomic_load_explicit(&gen, memory_order_acquire) != seen;
}

/* A worker stops spinning when a job comes or when it is asked to park. */
static bool new_job_or_park(uint64_t seen)
{
    return new_job(seen) || atomic_load_explicit(&parked, memory_order_relaxed);
}

static bool job_done(uint64_t unused)
{
    (void)unused;
    return atomic_load_explicit(&pending, memory_order_acquire) == 0;
}

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    uint64_t seen = start_gen[id];
    for (;;) {
        if (!spin_until(new_job_or_park, seen) || !new_job(seen)) {
            pthread_mutex_lock(&mu);
            atomic_fetch_add(&sleepers, 1);
            while (atomic_load(&gen) == seen) pthread_cond_wait(&cv_work, &mu);
            atomic_fetch_sub(&sleepers, 1);
            pthread_mutex_unlock(&mu);
        }
        seen = atomic_load_explicit(&gen, memory_order_acquire);
        int parts = job_parts;
        part_fn f = job;
        void *c = job_ctx;
        if (id < parts) {
            f(c, id, parts);
            tg__mem_flush(); /* before the caller can read the counters */
        }
        if (atomic_fetch_sub(&pending, 1) == 1 && atomic_load(&caller_waits)) {
            pthread_mutex_lock(&mu);
            pthread_cond_signal(&cv_done);
            pthread_mutex_unlock(&mu);
        }
    }
    return NULL;
}

int tg__pool_size(void)
{
    pthread_mutex_lock(&submit);
    int n = nthreads ? nthreads : 1;
    pthread_mutex_unlock(&submit);
    return n;
}

void tg__pool_set_size(int n)
{
    pthread_mutex_lock(&submit);
    nthreads = n;
    pthread_mutex_unlock(&submit);
}

void tg__pool_default_size(int n)
{
    pthread_mutex_lock(&submit);
    if (!nthreads) nthreads = n < 1 ? 1 : (n > TG_POOL_MAX_THREADS ? TG_POOL_MAX_THREADS : n);
    pthread_mutex_unlock(&submit);
}

/* Falls back to running every part inline if no worker can be started. */
void tg__pool_run(part_fn f, void *ctx, int nparts)
{
    pthread_mutex_lock(&submit);
    int want = nthreads ? nthreads : 1;
    if (nparts > want) nparts = want;
    while (nworkers < nparts - 1) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        start_gen[nworkers + 1] = atomic_load(&gen);
        int rc = pthread_create(&t, &attr, worker, (void *)(intptr_t)(nworkers + 1));
        pthread_attr_destroy(&attr);
        if (rc) break;
        nworkers++;
    }
    if (nparts > nworkers + 1) nparts = nworkers + 1;
    if (nparts <= 1) {
        pthread_mutex_unlock(&submit);
        f(ctx, 0, 1);
        return;
    }
    job = f;
    job_ctx = ctx;
    job_parts = nparts;
    atomic_fetch_add_explicit(&jobs_split, 1, memory_order_relaxed);
    atomic_store_explicit(&parked, false, memory_order_relaxed);
    atomic_store_explicit(&pending, nworkers, memory_order_relaxed);
    atomic_fetch_add(&gen, 1); /* seq_cst: publishes the job */
    if (atomic_load(&sleepers) > 0) {
        pthread_mutex_lock(&mu);
        pthread_cond_broadcast(&cv_work);
        pthread_mutex_unlock(&mu);
    }
    f(ctx, 0, nparts);
    if (!spin_until(job_done, 0)) {
        pthread_mutex_lock(&mu);
        atomic_store(&caller_waits, true);
        while (atomic_load(&pending)) pthread_cond_wait(&cv_done, &mu);
        atomic_store(&caller_waits, false);
        pthread_mutex_unlock(&mu);
    }
    pthread_mutex_unlock(&submit);
}

void tg__pool_park(void)
{
    if (!atomic_load_explicit(&parked, memory_order_relaxed))
        atomic_store_explicit(&parked, true, memory_order_relaxed);
}

bool tg__pool_awake(void)
{
    /* A hint for whether to split, read without the lock: a job may be
     * running, or a worker about to sleep. */
    return atomic_load_explicit(&nworkers, memory_order_relaxed) > 0 &&
           atomic_load_explicit(&sleepers, memory_order_relaxed) == 0;
}

uint64_t tg__pool_jobs(void)
{
    return atomic_load_explicit(&jobs_split, memory_order_relaxed);
}
