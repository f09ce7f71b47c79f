/* The kernel table. ref fills every (kernel, dtype) it supports; cpu's
 * entries start as copies of ref's and are overridden one by one. */
#include <pthread.h>

#include "backend/kernels.h"
#include "core/pool.h"

static tg_kernel_fn table[TG_KERNEL_COUNT][TG_BACKEND_COUNT][TG_DTYPE_COUNT];
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
    table[id][backend][dtype] = fn;
}

static void init(void)
{
    tg__backend_ref_register();
    tg__ref_ext_register();
    tg__ref_nn_register();
    for (int k = 0; k < TG_KERNEL_COUNT; k++)
        for (int d = 0; d < TG_DTYPE_COUNT; d++) table[k][TG_BACKEND_CPU][d] = table[k][TG_BACKEND_REF][d];
    tg__backend_cpu_register();
    tg__cpu_ext_register();
    tg__cpu_nn_register();
    tg__pool_default_size(tg__blas_threads());
}

void tg__backend_init(void)
{
    pthread_once(&once, init);
}

tg_kernel_fn tg__kernel(tg_kernel_id id, tg_backend backend, tg_dtype dtype)
{
    return table[id][backend][dtype];
}
