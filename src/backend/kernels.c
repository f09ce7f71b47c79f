/* The kernel table. ref fills every (kernel, dtype) it supports; cpu's
 * entries start as copies of ref's and are overridden one by one. */
#include <pthread.h>

#include "backend/kernels.h"
#include "core/pool.h"

tg_kernel_fn tg__kernel_table[TG_KERNEL_COUNT][TG_BACKEND_COUNT][TG_DTYPE_COUNT];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static const char *const names[TG_KERNEL_COUNT] = {
#define TG__KNAME(name) #name,
    TG_ALL_KERNELS(TG__KNAME)
#undef TG__KNAME
};

const char *tg__kernel_name(tg_kernel_id id)
{
    return (unsigned)id < TG_KERNEL_COUNT ? names[id] : "?";
}

void tg__kernel_set(tg_kernel_id id, tg_backend backend, tg_dtype dtype, tg_kernel_fn fn)
{
    tg__kernel_table[id][backend][dtype] = fn;
}

/* ref's registration list: every domain file of backend/ref/ exposes one
 * tg__ref_<domain>_register that sets its (kernel, dtype) entries and
 * calls nothing else. Together they fill every entry any op looks up; no
 * two of them set the same entry, so their order is free. A new domain
 * file adds its name here. */
#define TG_REF_DOMAINS(X)                                                          \
    X(unary) X(binary) X(reduce) X(softmax_loss) X(shape) X(index) X(random)       \
    X(matmul) X(conv) X(pool) X(norm)

#define TG__DECL(dom) TG_INTERNAL void tg__ref_##dom##_register(void);
TG_REF_DOMAINS(TG__DECL)
#undef TG__DECL

static void (*const ref_register[])(void) = {
#define TG__ENTRY(dom) tg__ref_##dom##_register,
    TG_REF_DOMAINS(TG__ENTRY)
#undef TG__ENTRY
};

/* cpu's list, run after cpu's entries are copied from ref's: each
 * tg__cpu_<domain>_register overrides the entries it speeds up (reading
 * ref's entry first where it falls back to it) and calls nothing else. No
 * two set the same entry. Not quite one file per domain: vmath.c holds the
 * f32 exp/tanh/sigmoid (unary) and the f32 cross-entropy (softmax_loss),
 * which share its vector exp core. */
#define TG_CPU_DOMAINS(X) X(unary) X(binary) X(reduce) X(shape) X(matmul) X(conv) X(vmath)

#define TG__DECL(dom) TG_INTERNAL void tg__cpu_##dom##_register(void);
TG_CPU_DOMAINS(TG__DECL)
#undef TG__DECL

static void (*const cpu_register[])(void) = {
#define TG__ENTRY(dom) tg__cpu_##dom##_register,
    TG_CPU_DOMAINS(TG__ENTRY)
#undef TG__ENTRY
};

static void init(void)
{
    for (size_t i = 0; i < sizeof ref_register / sizeof ref_register[0]; i++) ref_register[i]();
    for (int k = 0; k < TG_KERNEL_COUNT; k++)
        for (int d = 0; d < TG_DTYPE_COUNT; d++)
            tg__kernel_table[k][TG_BACKEND_CPU][d] = tg__kernel_table[k][TG_BACKEND_REF][d];
    for (size_t i = 0; i < sizeof cpu_register / sizeof cpu_register[0]; i++) cpu_register[i]();
    tg__pool_default_size(tg__blas_threads());
}

void tg__backend_init(void)
{
    pthread_once(&once, init);
}

