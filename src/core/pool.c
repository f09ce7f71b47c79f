/* The elementwise thread pool (core/pool.h). Workers start on demand, are
 * detached and wait on a generation counter for the next job. */
#include <pthread.h>
#include <stdint.h>

#include "core/pool.h"

typedef void (*part_fn)(void *ctx, int part, int nparts);

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv_work = PTHREAD_COND_INITIALIZER, cv_done = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t submit = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */
static int nthreads;   /* 0: not decided yet */
static int nworkers;   /* started */
static uint64_t gen;
static int pending;
static part_fn job;
static void *job_ctx;
static int job_parts;

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (gen == seen) pthread_cond_wait(&cv_work, &mu);
        seen = gen;
        int parts = job_parts;
        part_fn f = job;
        void *c = job_ctx;
        pthread_mutex_unlock(&mu);
        if (id < parts) f(c, id, parts);
        pthread_mutex_lock(&mu);
        if (--pending == 0) pthread_cond_signal(&cv_done);
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
    pthread_mutex_lock(&mu);
    job = f;
    job_ctx = ctx;
    job_parts = nparts;
    pending = nworkers;
    gen++;
    pthread_cond_broadcast(&cv_work);
    pthread_mutex_unlock(&mu);
    f(ctx, 0, nparts);
    pthread_mutex_lock(&mu);
    while (pending) pthread_cond_wait(&cv_done, &mu);
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&submit);
}
