/* scale.c - `tapegrad bench scale`: how a tape's cost grows with its
 * length. The chain workload (tanh on a 1-element f32 tensor, sum, one
 * leaf) at 10^2 .. 10^6 ops (10^4 with --quick): per op, the fwd+bwd time
 * (record, backward, scope end, tape reset; median of several steps), the
 * page faults of a steady-state step (getrusage minor faults over the
 * timed steps), and the resident memory the first step added (what the
 * tape and its tensors take per op; /proc/self/statm). The ratio column
 * is the time per op against the 100-op chain's in the same run. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench.h"

static long minor_faults(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_minflt : 0;
}

static double resident_bytes(void)
{
    long pages = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
        fclose(f);
    }
    return (double)res * (double)sysconf(_SC_PAGESIZE);
}

/* One fwd+bwd of an n-op chain from leaf c; ns. */
static double chain_step(tg_tape *tape, tg_tensor *c, long n, tg_status *st)
{
    double t0 = bench_now_ns();
    tg_scope_begin();
    tg_tensor *h = c;
    for (long k = 0; k < n && h; k++) h = tg_tanh(h);
    tg_tensor *loss = h ? tg_sum(h) : NULL;
    *st = loss ? tg_backward(loss) : tg_last_error();
    tg_scope_end();
    tg_tape_reset(tape);
    tg_grad_zero(c);
    return bench_now_ns() - t0;
}

int bench_scale_cli(const bench_opts *o)
{
    bench_env env;
    bench_env_get(&env);
    bench_print_env(stdout, &env);
    printf("tape length: the chain (tanh on one float) at each length, fwd+bwd per op\n"
           "(median over about 0.2 s of steps%s), page faults per op in the steady state,\n"
           "resident bytes the first step added per op; ratio: ns/op against 100 ops\n\n",
           o->quick ? ", quick: not a measurement" : "");
    printf("%10s %10s %8s %14s %16s\n", "ops", "ns/op", "ratio", "faults/op", "resident B/op");
    long max = o->quick ? 10000 : 1000000;
    double base = 0;
    for (long n = 100; n <= max; n *= 10) {
        tg_tape *tape = tg_tape_new(NULL);
        tg_tensor *c = tg_full(TG_F32, 1, (int64_t[]){1}, 0.3);
        tg_status st = (tape && c) ? tg_requires_grad(tape, c) : TG_ERR_NOMEM;
        double r0 = resident_bytes();
        if (!st) chain_step(tape, c, n, &st); /* the first step: the tape grows */
        double grown = resident_bytes() - r0;
        long steps = (long)((o->quick ? 2e7 : 2e8) / (150.0 * (double)n));
        if (steps < 3) steps = 3;
        if (steps > 63) steps = 63;
        double t[64];
        long f0 = minor_faults();
        for (long i = 0; i < steps && !st; i++) t[i] = chain_step(tape, c, n, &st);
        long faults = minor_faults() - f0;
        tg_tensor_release(c);
        tg_tape_free(tape);
        if (st) {
            fprintf(stderr, "tapegrad bench scale: %ld ops: %s\n", n, tg_last_error_message());
            return 1;
        }
        double per = bench_median(t, (int)steps) / (double)n;
        if (n == 100) base = per;
        printf("%10ld %10.1f %7.2fx %14.5f %16.0f\n", n, per, per / base,
               (double)faults / ((double)steps * (double)n), grown > 0 ? grown / (double)n : 0);
        fflush(stdout);
    }
    return 0;
}
