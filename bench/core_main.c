/* bench_core: the two core figures alone (the tanh chain's cost per op
 * and the MLP against raw sgemm, core.c), as before the suite existed. */
#include <errno.h>
#include <string.h>

#include "bench.h"

static int write_json(const char *path, const bench_env *env, const bench_chain_result *c,
                      const bench_mlp_result *m)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "{\n  \"tapegrad_version\": ");
    bench_json_str(f, env->version);
    fprintf(f, ",\n  \"cpu\": ");
    bench_json_str(f, env->cpu);
    fprintf(f, ",\n  \"openblas_threads\": %d, \"openblas_core\": ", env->blas_threads);
    bench_json_str(f, env->blas_core);
    fprintf(f, ",\n  \"env_OPENBLAS_CORETYPE\": ");
    bench_json_str(f, env->env_coretype);
    fprintf(f, ",\n  \"tanh_chain\": ");
    bench_json_chain(f, c);
    fprintf(f, ",\n  \"mlp\": ");
    bench_json_mlp(f, m);
    fprintf(f, "\n}\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) return -1;
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_core [--quick] [--json FILE]\n"
               "  --quick      fewer, shorter runs (smoke test, not a measurement)\n"
               "  --json FILE  also write every figure to FILE as JSON\n");
}

int main(int argc, char **argv)
{
    bench_opts opts = {0};
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            opts.quick = true;
        } else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
            json = argv[++i];
        } else if (strncmp(argv[i], "--json=", 7) == 0 && argv[i][7]) {
            json = argv[i] + 7;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "bench_core: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    bench_env env;
    bench_chain_result chain;
    bench_mlp_result mlp;
    char err[512];
    bench_env_get(&env);
    bench_print_env(stdout, &env);
    printf("\n");
    if (bench_chain(&opts, &chain, err, sizeof err)) {
        fprintf(stderr, "bench_core: %s\n", err);
        return 1;
    }
    bench_print_chain(stdout, &chain);
    printf("\n");
    fflush(stdout);
    if (bench_mlp(&opts, &mlp, err, sizeof err)) {
        fprintf(stderr, "bench_core: %s\n", err);
        return 1;
    }
    bench_print_mlp(stdout, &mlp);
    if (json && write_json(json, &env, &chain, &mlp)) {
        fprintf(stderr, "bench_core: cannot write %s: %s\n", json, strerror(errno));
        return 1;
    }
    return 0;
}
