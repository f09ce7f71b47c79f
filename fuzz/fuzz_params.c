/* libFuzzer target: the parameter-file loader (tg_params_load) on a fixed
 * model with an Adam optimizer, with and without the optimizer. Besides
 * the sanitizers' checks: a load that fails changes nothing, and no
 * tensor memory is left behind. TG_FUZZ_WRITE_SEED=FILE writes a valid
 * file for this model (the seed corpus) and exits. */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>
#include <tapegrad.h>

#include "fuzz_util.h"

static tg_params *ps;
static tg_optim *opt;
static unsigned char snapshot[256];

static size_t snap(unsigned char *out)
{
    size_t used = 0;
    for (int i = 0; i < tg_params_count(ps); i++) {
        tg_tensor *t = tg_params_at(ps, i);
        size_t n = (size_t)tg_tensor_numel(t) * tg_dtype_size(tg_tensor_dtype(t));
        if (tg_tensor_copy_out(t, out + used, n)) abort();
        used += n;
    }
    return used;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    tg_rng rng;
    tg_rng_seed(&rng, 1);
    ps = tg_params_new();
    tg_tensor *w = tg_params_add(ps, "fc.weight", TG_F32, 2, (int64_t[]){2, 3});
    tg_tensor *b = tg_params_add(ps, "fc.bias", TG_F64, 1, (int64_t[]){3});
    tg_tensor *n = tg_params_add_buffer(ps, "bn.count", TG_I64, 0, NULL);
    if (!w || !b || !n) abort();
    tg_init_uniform(w, &rng, -1, 1);
    tg_init_uniform(b, &rng, -1, 1);
    opt = tg_optim_new(ps, NULL);
    if (!opt) abort();
    const char *seed = getenv("TG_FUZZ_WRITE_SEED");
    if (seed) exit(tg_params_save(ps, opt, seed) == TG_OK ? 0 : 1);
    return 0;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    const char *path = fuzz_file(data, size, ".safetensors");
    size_t base = tg_mem_current_bytes();
    for (int with_opt = 0; with_opt < 2; with_opt++) {
        unsigned char before[sizeof snapshot];
        size_t n = snap(before);
        int64_t steps = tg_optim_step_count(opt);
        double lr = tg_optim_lr(opt);
        tg_status st = tg_params_load(ps, with_opt ? opt : NULL, path);
        if (st != TG_OK) {
            FUZZ_CHECK(snap(snapshot) == n && memcmp(before, snapshot, n) == 0,
                       "a failed load (%s) changed the parameters", tg_strerror(st));
            FUZZ_CHECK(tg_optim_step_count(opt) == steps && tg_optim_lr(opt) == lr,
                       "a failed load changed the optimizer");
            FUZZ_CHECK(tg_last_error() == st, "status %d, last error %d", st, tg_last_error());
        } else if (with_opt) {
            int64_t s = tg_optim_step_count(opt);
            FUZZ_CHECK(s >= 0 && s <= TG_OPTIM_MAX_STEPS, "step count %lld", (long long)s);
            double got = tg_optim_lr(opt);
            FUZZ_CHECK(got >= 0 && got < 1e308, "lr %g", got);
        }
        tg_error_clear();
    }
    FUZZ_CHECK(tg_mem_current_bytes() == base, "tensor memory grew by %zu bytes",
               tg_mem_current_bytes() - base);
    return 0;
}
