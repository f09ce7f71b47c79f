/* cli.c - `tapegrad bench` and bench_suite share this front end, so both
 * take the same arguments and print the same report. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

void bench_cli_usage(FILE *f, const char *prog)
{
    fprintf(f,
            "usage: %s [WORKLOAD...] [--threads N] [--policy P] [--json FILE] [--profile]\n"
            "       %*s [--quick] [--dot FILE]\n"
            "       %s hvp [--quick] [--threads N]\n"
            "       %s scale [--quick]\n"
            "       %s replay [--quick]\n"
            "       %s dp [--quick] [--workers N]\n"
            "       mpirun -np N %s dp --mpi [--quick]\n"
            "workloads (default: all, in this order):\n",
            prog, (int)strlen(prog), "", prog, prog, prog, prog, prog);
    for (int i = 0; bench_workloads[i]; i++)
        fprintf(f, "  %-12s %s\n", bench_workloads[i]->name, bench_workloads[i]->desc);
    fprintf(f, "  hvp          (alone) a Hessian-vector product of the mlp and elementwise\n"
               "               losses, as a ratio to their fwd+bwd in the same rounds\n");
    fprintf(f, "  scale        (alone) the chain at 10^2..10^6 ops: ns/op, page faults per op,\n"
               "               resident bytes per op (--quick: up to 10^4)\n");
    fprintf(f, "  replay       (alone) a step recorded again against tg_tape_replay of one\n"
               "               record, on the chain, tiny and mlp: ns per step and per op;\n"
               "               and elementwise (1 thread): replay, whose six calls run\n"
               "               fused, against the fused pass, recording and unfused replay;\n"
               "               mse (1 thread): a run ending in a mean, against recording\n"
               "               and unfused replay\n");
    fprintf(f, "  dp           (alone) data-parallel train steps of the mlp and the lstm (cell\n"
               "               by cell, and as one lstm op) on 1..N worker threads (--workers N,\n"
               "               default 2), samples/s and ratios;\n"
               "               with --mpi, under mpirun, across the MPI ranks against one\n"
               "               process, with the all-reduce time and the overlap fraction\n");
    fprintf(f, "options:\n"
               "  --threads N    threads for OpenBLAS and tapegrad's elementwise pool\n"
               "                 (tg_set_num_threads); default: as OPENBLAS_NUM_THREADS says\n"
               "  --policy P     checkpoint policy of every tape: none (default), balanced,\n"
               "                 budget:BYTES (suffix k, M or G allowed), segments\n"
               "                 (sqrt(n) groups of the tg_sequential layers of mlp, deep and\n"
               "                 conv, elsewhere the whole forward as one segment), binomial\n"
               "                 (those layers as nested segments, 3 slots; elsewhere as\n"
               "                 segments)\n"
               "  --json FILE    write every figure to FILE as JSON\n"
               "  --profile      print the profiler's table per workload (op, calls, forward\n"
               "                 and backward ms, saved bytes, recomputes)\n"
               "  --quick        5 samples after 1 warm-up instead of 20 after 3 (a smoke run)\n"
               "  --dot FILE     write the mlp workload's tape (one forward) as Graphviz DOT\n"
               "times are ms per iteration (median, min, max over the samples); every result\n"
               "is checked against a plain-C reference before it is timed\n");
}

/* BYTES with an optional k/M/G (powers of 1024) suffix. */
static bool parse_bytes(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno || *s == '-') return false;
    unsigned long long mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1ull << 10;
    if (*end == 'm' || *end == 'M') mul = 1ull << 20;
    if (*end == 'g' || *end == 'G') mul = 1ull << 30;
    if (mul > 1) end++;
    if (*end || v > SIZE_MAX / mul) return false;
    *out = (size_t)(v * mul);
    return true;
}

static bool parse_policy(const char *s, bench_suite_opts *o)
{
    if (strcmp(s, "none") == 0) {
        o->policy = BENCH_POLICY_NONE;
    } else if (strcmp(s, "balanced") == 0) {
        o->policy = BENCH_POLICY_BALANCED;
    } else if (strcmp(s, "segments") == 0) {
        o->policy = BENCH_POLICY_SEGMENTS;
    } else if (strcmp(s, "binomial") == 0) {
        o->policy = BENCH_POLICY_BINOMIAL;
    } else if (strncmp(s, "budget:", 7) == 0 && parse_bytes(s + 7, &o->budget_bytes)) {
        o->policy = BENCH_POLICY_BUDGET;
    } else {
        return false;
    }
    return true;
}

/* The value of option argv[*i] ("--opt VALUE" or "--opt=VALUE"), or NULL
 * when argv[*i] is not that option. *missing is set when it is but has
 * no value. */
static const char *opt_value(int argc, char **argv, int *i, const char *name, bool *missing)
{
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0) return NULL;
    if (a[n] == '=') return a + n + 1;
    if (a[n] != '\0') return NULL;
    if (*i + 1 >= argc) {
        *missing = true;
        return NULL;
    }
    return argv[++*i];
}

int bench_cli(const char *prog, int argc, char **argv)
{
    bench_suite_opts o = {0};
    const char *json = NULL;
    const bench_workload *sel[16];
    int nsel = 0;
    bool hvp = false; /* `hvp`: the second-order table (hvp.c) instead */
    bool scale = false; /* `scale`: the tape-length table (scale.c) instead */
    bool replay = false; /* `replay`: record against replay (replay.c) instead */
    bool dp = false;  /* `dp`: the data-parallel table (dp.c) instead */
    int workers = 2;
    bool mpi = false; /* dp --mpi: across MPI ranks instead of threads */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        bool missing = false;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            bench_cli_usage(stdout, prog);
            return 0;
        } else if (strcmp(a, "--quick") == 0) {
            o.quick = true;
        } else if (strcmp(a, "--profile") == 0) {
            o.profile = true;
        } else if ((v = opt_value(argc, argv, &i, "--json", &missing))) {
            json = v;
        } else if ((v = opt_value(argc, argv, &i, "--dot", &missing))) {
            o.dot_path = v;
        } else if ((v = opt_value(argc, argv, &i, "--threads", &missing))) {
            char *end;
            long n = strtol(v, &end, 10);
            if (!*v || *end || n < 1 || n > 64) {
                fprintf(stderr, "%s: --threads needs an integer in [1, 64], got '%s'\n", prog, v);
                return 2;
            }
            o.threads = (int)n;
        } else if ((v = opt_value(argc, argv, &i, "--policy", &missing))) {
            if (!parse_policy(v, &o)) {
                fprintf(stderr,
                        "%s: --policy needs none, balanced, budget:BYTES, segments or binomial, "
                        "got '%s'\n",
                        prog, v);
                return 2;
            }
        } else if ((v = opt_value(argc, argv, &i, "--workers", &missing))) {
            char *end;
            long n = strtol(v, &end, 10);
            if (!*v || *end || n < 2 || n > 6) {
                fprintf(stderr, "%s: --workers needs an integer in [2, 6], got '%s'\n", prog, v);
                return 2;
            }
            workers = (int)n;
        } else if (strcmp(a, "--mpi") == 0) {
            mpi = true;
        } else if (missing) {
            fprintf(stderr, "%s: %s needs a value\n", prog, a);
            return 2;
        } else if (a[0] == '-') {
            fprintf(stderr, "%s: unknown option '%s'\n\n", prog, a);
            bench_cli_usage(stderr, prog);
            return 2;
        } else if (strcmp(a, "hvp") == 0) {
            hvp = true;
        } else if (strcmp(a, "scale") == 0) {
            scale = true;
        } else if (strcmp(a, "replay") == 0) {
            replay = true;
        } else if (strcmp(a, "dp") == 0) {
            dp = true;
        } else {
            const bench_workload *w = bench_workload_find(a);
            if (!w) {
                fprintf(stderr, "%s: unknown workload '%s'\n\n", prog, a);
                bench_cli_usage(stderr, prog);
                return 2;
            }
            bool dup = false;
            for (int k = 0; k < nsel; k++)
                dup |= sel[k] == w;
            if (!dup && nsel < (int)(sizeof sel / sizeof sel[0])) sel[nsel++] = w;
        }
    }
    /* The tables that take --quick and nothing else. */
    const char *alone = replay ? "replay" : scale ? "scale" : NULL;
    if (alone) {
        if ((replay && scale) || hvp || dp || mpi || nsel || json || o.profile || o.dot_path ||
            o.threads || o.policy != BENCH_POLICY_NONE) {
            fprintf(stderr, "%s: %s runs alone (with --quick only)\n", prog, alone);
            return 2;
        }
        bench_opts bo = {.quick = o.quick};
        return replay ? bench_replay_cli(&bo) : bench_scale_cli(&bo);
    }
    if (mpi && !dp) {
        fprintf(stderr, "%s: --mpi goes with dp only (mpirun -np 2 %s dp --mpi)\n", prog, prog);
        return 2;
    }
    if (dp) {
        if (hvp || nsel || json || o.profile || o.dot_path || o.threads ||
            o.policy != BENCH_POLICY_NONE) {
            fprintf(stderr, "%s: dp runs alone (with --quick or --workers only)\n", prog);
            return 2;
        }
        bench_opts bo = {.quick = o.quick};
        return mpi ? bench_dp_mpi_cli(&bo) : bench_dp_cli(&bo, workers);
    }
    if (hvp) {
        if (nsel || json || o.profile || o.dot_path || o.policy != BENCH_POLICY_NONE) {
            fprintf(stderr, "%s: hvp runs alone (with --quick or --threads only)\n", prog);
            return 2;
        }
        if (o.threads && tg_set_num_threads(o.threads)) {
            fprintf(stderr, "%s: --threads %d: %s\n", prog, o.threads, tg_last_error_message());
            return 1;
        }
        bench_opts bo = {.quick = o.quick};
        return bench_hvp_cli(&bo);
    }
    if (nsel == 0)
        for (int k = 0; bench_workloads[k]; k++)
            sel[nsel++] = bench_workloads[k];
    if (o.threads && tg_set_num_threads(o.threads)) {
        fprintf(stderr, "%s: --threads %d: %s\n", prog, o.threads, tg_last_error_message());
        return 1;
    }

    bench_env env;
    bench_env_get(&env);
    bench_print_header(stdout, &env, &o);
    bench_print_table_head(stdout);
    fflush(stdout);
    bench_result *res = calloc((size_t)nsel, sizeof *res);
    if (!res) {
        fprintf(stderr, "%s: out of memory\n", prog);
        return 1;
    }
    int failed = 0;
    for (int k = 0; k < nsel; k++) {
        /* On more than one thread, OpenBLAS's own workers spin (sched_yield)
         * for about 0.1 s after the library loads and after any GEMM it
         * splits, on the cores tapegrad's pool splits its jobs to: a conv
         * workload measured in that window (its whole run is 0.7 s) ran
         * its split images on a shared core. Each workload starts after
         * they sleep, as in a training run past its first tenth of a
         * second. */
        if (tg_num_threads() > 1) nanosleep(&(struct timespec){.tv_nsec = 150000000}, NULL);
        if (bench_run(sel[k], &o, &res[k])) failed++;
        bench_print_result(stdout, &res[k]);
        fflush(stdout);
    }
    printf("\n");
    for (int k = 0; k < nsel; k++)
        bench_print_notes(stdout, &res[k]);
    int status = failed ? 1 : 0;
    if (o.dot_path) {
        char err[512];
        if (bench_write_dot(&o, o.dot_path, err, sizeof err)) {
            fprintf(stderr, "%s: %s\n", prog, err);
            status = 1;
        } else {
            printf("wrote the mlp workload's tape (one forward, policy %s) to %s\n",
                   bench_policy_name(o.policy), o.dot_path);
        }
    }
    if (json) {
        if (bench_write_json(json, &env, &o, res, nsel)) {
            fprintf(stderr, "%s: cannot write %s: %s\n", prog, json, strerror(errno));
            status = 1;
        } else {
            printf("wrote every figure to %s\n", json);
        }
    }
    for (int k = 0; k < nsel; k++)
        if (!res[k].ok) fprintf(stderr, "%s: %s: %s\n", prog, res[k].wl->name, res[k].error);
    free(res);
    return status;
}
