/* Out-of-memory injection: malloc, calloc, realloc, posix_memalign,
 * aligned_alloc and jemalloc's mallocx are interposed here (the test
 * executable's definitions come first in symbol lookup, the library's and
 * jansson's calls included) and forwarded to the next definition; armed on
 * the calling thread, the N-th allocation fails. A small training step
 * (forward, backward, optimizer step, save, load) is run failing the N-th
 * allocation for every N until one run meets no failure: each run must
 * return a status, TG_ERR_NOMEM when it fails, and leave no tensor memory
 * behind (under ASan, LeakSanitizer checks the rest). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tapegrad.h>
#include <unistd.h>

/* ---- the interposer */
static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void (*real_free)(void *);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static void *(*real_mallocx)(size_t, int);

/* Under AddressSanitizer the allocator is called before its shadow memory
 * exists (from its own start-up): the interposer must not be instrumented. */
#if defined(__GNUC__)
#define RAW __attribute__((no_sanitize("address", "undefined")))
#else
#define RAW
#endif

/* dlsym may allocate before the real functions are known: from here. */
static _Alignas(64) unsigned char boot[65536];
static size_t boot_used;
/* volatile: dlsym may call malloc while resolve runs, and without it the
 * compiler may keep the flag in a register across dlsym (its address never
 * escapes), so the nested call would not see it. */
static _Thread_local volatile bool resolving;

static _Thread_local bool armed;
static long countdown; /* allocations left before the failing one */
static long injected;  /* failures injected since arming */

RAW static void *boot_alloc(size_t n)
{
    n = (n + 63) & ~(size_t)63;
    if (boot_used + n > sizeof boot) return NULL;
    void *p = boot + boot_used;
    boot_used += n;
    return p;
}

RAW static bool in_boot(const void *p)
{
    return (const unsigned char *)p >= boot && (const unsigned char *)p < boot + sizeof boot;
}

RAW static void resolve(void)
{
    if (real_free || resolving) return;
    resolving = true;
    /* The POSIX way to a function pointer from dlsym (no cast warning). */
    *(void **)&real_malloc = dlsym(RTLD_NEXT, "malloc");
    *(void **)&real_calloc = dlsym(RTLD_NEXT, "calloc");
    *(void **)&real_realloc = dlsym(RTLD_NEXT, "realloc");
    *(void **)&real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    *(void **)&real_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
    *(void **)&real_mallocx = dlsym(RTLD_NEXT, "mallocx");
    *(void **)&real_free = dlsym(RTLD_NEXT, "free");
    resolving = false;
}

RAW static bool fail_now(void)
{
    if (!armed) return false;
    if (countdown-- > 0) return false;
    injected++;
    errno = ENOMEM;
    return true;
}

RAW void *malloc(size_t n)
{
    resolve();
    if (!real_malloc) return boot_alloc(n);
    return fail_now() ? NULL : real_malloc(n);
}

RAW void *calloc(size_t n, size_t m)
{
    resolve();
    if (!real_calloc) return boot_alloc(n * m); /* static: already zero */
    return fail_now() ? NULL : real_calloc(n, m);
}

RAW void *realloc(void *p, size_t n)
{
    resolve();
    if (!p) return malloc(n);
    if (in_boot(p)) {
        size_t left = (size_t)(boot + sizeof boot - (unsigned char *)p);
        void *q = malloc(n);
        if (q) memcpy(q, p, n < left ? n : left);
        return q;
    }
    if (!real_realloc) return NULL; /* not during start-up */
    return fail_now() ? NULL : real_realloc(p, n);
}

RAW void free(void *p)
{
    if (!p || in_boot(p)) return;
    resolve();
    if (real_free) real_free(p); /* else freed during start-up: kept */
}

RAW int posix_memalign(void **out, size_t align, size_t n)
{
    resolve();
    return fail_now() ? ENOMEM : real_posix_memalign(out, align, n);
}

RAW void *aligned_alloc(size_t align, size_t n)
{
    resolve();
    return fail_now() ? NULL : real_aligned_alloc(align, n);
}

RAW void *mallocx(size_t n, int flags)
{
    resolve();
    return fail_now() || !real_mallocx ? NULL : real_mallocx(n, flags);
}

static void arm(long n)
{
    countdown = n;
    injected = 0;
    armed = true;
}

static long disarm(void)
{
    armed = false;
    return injected;
}

/* ---- the training step */
typedef struct {
    tg_params *ps;
    tg_linear *l1, *l2;
    tg_optim *opt;
    tg_tape *tape;
    tg_tensor *x, *y;
} model;

static void model_new(model *m)
{
    tg_rng rng;
    tg_rng_seed(&rng, 5);
    m->ps = tg_params_new();
    m->l1 = tg_linear_new(m->ps, "fc1", 4, 8, true, TG_F32, &rng);
    m->l2 = tg_linear_new(m->ps, "fc2", 8, 3, true, TG_F32, &rng);
    m->opt = tg_optim_new(m->ps, NULL);
    m->tape = tg_tape_new(NULL);
    cr_assert(m->l2 && m->opt && m->tape, "%s", tg_last_error_message());
    cr_assert_eq(tg_params_requires_grad(m->ps, m->tape), TG_OK);
    m->x = tg_rand_normal(&rng, TG_F32, 2, (int64_t[]){6, 4}, 0, 1);
    m->y = tg_tensor_from_data(TG_I64, 1, (int64_t[]){6}, (int64_t[]){0, 1, 2, 0, 1, 2});
    cr_assert(m->x && m->y);
}

static void model_free(model *m)
{
    tg_tensor_release(m->x);
    tg_tensor_release(m->y);
    tg_optim_free(m->opt);
    tg_linear_free(m->l1);
    tg_linear_free(m->l2);
    tg_params_free(m->ps);
    tg_tape_free(m->tape);
}

static tg_status train_step(model *m, const char *path)
{
    tg_scope_begin();
    tg_optim_zero_grad(m->opt);
    tg_tensor *h = tg_relu(tg_linear_forward(m->l1, m->x));
    tg_tensor *loss = tg_cross_entropy(tg_linear_forward(m->l2, h), m->y);
    tg_status st = loss ? tg_backward(loss) : tg_last_error();
    tg_scope_end();
    tg_tape_reset(m->tape);
    if (!st) st = tg_optim_step(m->opt);
    if (!st) st = tg_params_save(m->ps, m->opt, path);
    if (!st) st = tg_params_load(m->ps, m->opt, path);
    return st;
}

/* Runs fn under failure N for N = 0, 1, ... until a run meets none. */
static void for_every_failure(tg_status (*fn)(model *, const char *), const char *what)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/tg_oom_%d.safetensors", (int)getpid());
    model warm;
    model_new(&warm);
    cr_assert_eq(fn(&warm, path), TG_OK, "%s", tg_last_error_message()); /* fills the caches */
    model_free(&warm);
    size_t base = tg_mem_current_bytes();
    long n = 0, failed_runs = 0;
    for (;; n++) {
        model m;
        model_new(&m);
        tg_error_clear();
        arm(n);
        tg_status st = fn(&m, path);
        long hit = disarm();
        char msg[512];
        snprintf(msg, sizeof msg, "%s", tg_last_error_message());
        model_free(&m);
        cr_assert_eq(tg_mem_current_bytes(), base, "%s, failure %ld: %zu bytes of tensor data "
                     "leaked", what, n, tg_mem_current_bytes() - base);
        if (!hit) {
            cr_assert_eq(st, TG_OK, "%s without a failure: %s", what, msg);
            break;
        }
        if (st != TG_OK) {
            failed_runs++;
            cr_expect_eq(st, TG_ERR_NOMEM, "%s, failure %ld: %s (%s), want TG_ERR_NOMEM", what, n,
                         tg_strerror(st), msg);
        }
        cr_assert_lt(n, 100000, "%s: no end to the allocations", what);
    }
    unlink(path);
    cr_log_info("%s: %ld allocations, %ld runs failed with a status", what, n, failed_runs);
    cr_assert_gt(failed_runs, 0);
}

Test(oom, every_allocation_of_a_training_step_can_fail_with_a_status)
{
    for_every_failure(train_step, "train step");
}

/* A replay tape over a pointwise chain on 5000 floats, whose six calls a
 * replay fuses: three replays and backwards, the second in anomaly mode
 * (its calls one by one, the fused run's middle values made anew). */
static tg_status replay_steps(model *m, const char *path)
{
    (void)m, (void)path;
    const int64_t n = 5000;
    tg_status st = TG_OK;
    tg_tensor *loss = NULL;
    tg_scope_begin();
    tg_tensor *x = tg_full(TG_F32, 1, &n, 0.5), *d = tg_full(TG_F32, 1, &n, 0.25);
    tg_tape *t = x && d ? tg_tape_new(&(tg_tape_opts){.replay = true}) : NULL;
    if (!t) st = tg_last_error();
    if (!st) st = tg_tape_input(t, d);
    if (!st) st = tg_requires_grad(t, x);
    if (!st) {
        tg_scope_begin();
        tg_tensor *a = tg_tanh(tg_add_scalar(tg_mul(x, d), 1.0));
        loss = tg_tensor_retain(tg_sum(tg_mul(a, tg_sigmoid(x))));
        tg_scope_end();
        if (!loss) st = tg_last_error();
    }
    for (int r = 0; r < 3 && !st; r++) {
        st = tg_tape_set_anomaly(t, r == 1);
        if (!st) st = tg_tape_replay(t, 1, &d, NULL);
        if (!st) st = tg_backward(loss);
    }
    if (!st && tg_tape_replay_fused_steps(t) != 6)
        st = TG_ERR_INTERNAL; /* the run must have been fused */
    tg_tensor_release(loss);
    tg_tape_free(t);
    tg_scope_end();
    return st;
}

Test(oom, every_allocation_of_a_fused_replay_can_fail_with_a_status)
{
    for_every_failure(replay_steps, "fused replay");
}

static tg_status save_load(model *m, const char *path)
{
    tg_status st = tg_params_save(m->ps, m->opt, path);
    if (!st) st = tg_params_load(m->ps, m->opt, path);
    return st;
}

/* Issue 15 item 6: out of memory while saving or loading is TG_ERR_NOMEM,
 * never "not valid JSON", "not valid UTF-8" or TG_ERR_NOT_FOUND. */
Test(oom, out_of_memory_in_save_and_load_is_nomem)
{
    for_every_failure(save_load, "save and load");
}
