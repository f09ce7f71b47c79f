/* common.c - what every benchmark shares: the clock, statistics, the
 * environment header, raw sgemm, error formatting and lean stages. */
#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "backend/kernels.h" /* tg__gemm_threads_begin/end */
#include "bench.h"

double bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bench_stat bench_stat_of(double *v, int n)
{
    bench_stat s = {0};
    if (n <= 0) return s;
    s.median = bench_median(v, n);
    s.min = v[0];
    s.max = v[n - 1];
    return s;
}

int bench_fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen) vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

int bench_lib_fail(char *err, size_t errlen, const char *what)
{
    return bench_fail(err, errlen, "%s: %s (%s)", what, tg_last_error_message(),
                      tg_strerror(tg_last_error()));
}

/* With the thread choice tapegrad's GEMM makes (tg__gemm_threads_begin,
 * src/backend/cpu/matmul.c): OpenBLAS's own split of small and thin GEMMs
 * was up to 2.3x slower, and its threads, left spinning, slowed the
 * tapegrad samples interleaved with the raw ones (conv's step ran 1.2x
 * slower at 2 threads than at 1 only inside the benchmark). */
void bench_sgemm(bool ta, bool tb, int m, int n, int k, const float *a, int lda, const float *b,
                 int ldb, float *c, int ldc)
{
    int threads = tg__gemm_threads_begin(m, n, k);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
                k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
    tg__gemm_threads_end(threads);
}

float *bench_floats(size_t n, float scale)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) return NULL;
    for (size_t i = 0; i < n; i++)
        p[i] = scale * (float)((int)(i % 17) - 8) / 8.0f;
    return p;
}

float *bench_copy_f32(tg_tensor *t)
{
    size_t n = (size_t)tg_tensor_numel(t) * sizeof(float);
    float *p = malloc(n ? n : 1);
    if (p && tg_tensor_copy_out(t, p, n)) {
        free(p);
        return NULL;
    }
    return p;
}

double bench_ce_mean(const float *z, const int64_t *y, int n, int c)
{
    double total = 0;
    for (int i = 0; i < n; i++) {
        const float *r = z + (size_t)i * c;
        double mx = r[0], s = 0;
        for (int j = 1; j < c; j++)
            mx = fmax(mx, r[j]);
        for (int j = 0; j < c; j++)
            s += exp(r[j] - mx);
        total -= r[y[i]] - mx - log(s);
    }
    return total / n;
}

void *bench_setup_failed(char *err, size_t errlen, const char *what)
{
    if (tg_last_error())
        bench_lib_fail(err, errlen, what);
    else
        bench_fail(err, errlen, "%s: out of memory", what);
    return NULL;
}

/* ---- lean stages */

tg_tensor *bench_lean_stages(tg_tape *tape, int segments, int n, tg_segment_fn fn, void *ud,
                             tg_tensor *x)
{
    return tg_scope_keep(tg_checkpoint_sequential(tape, n, bench_nsegments(segments), fn, ud, x));
}

/* ---- environment */

/* Jiffies of the aggregate "cpu" line of /proc/stat: busy (everything but
 * idle and iowait) and total. false if unreadable. */
static bool cpu_jiffies(unsigned long long *busy, unsigned long long *total)
{
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[8] = {0};
    if (!f) return false;
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n < 4) return false;
    *total = 0;
    for (int i = 0; i < 8; i++)
        *total += v[i];
    *busy = *total - v[3] - v[4];
    return true;
}

static double cpu_seconds(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Share of all cpus that other processes kept busy over a quarter second
 * while this one sleeps (its own threads, OpenBLAS's spinning workers,
 * are taken out): -1 if unknown. */
static double cpu_busy_now(void)
{
    unsigned long long b0, t0, b1, t1;
    double hz = (double)sysconf(_SC_CLK_TCK);
    double own0 = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
    if (hz <= 0 || !cpu_jiffies(&b0, &t0)) return -1;
    struct timespec ts = {0, 250000000};
    nanosleep(&ts, NULL);
    double own = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - own0;
    if (!cpu_jiffies(&b1, &t1) || t1 <= t0) return -1;
    double busy = ((double)(b1 - b0) - own * hz) / (double)(t1 - t0);
    return busy < 0 ? 0 : busy;
}

void bench_env_get(bench_env *env)
{
    memset(env, 0, sizeof *env);
    snprintf(env->cpu, sizeof env->cpu, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        /* The first processor's model name, then its family and model
         * numbers, which tell apart machines whose VM shows only "AMD EPYC"
         * (a Zen 3 and a Zen 5 gave different figures). */
        char line[512], name[128] = "", family[16] = "", model[16] = "";
        while (fgets(line, sizeof line, f) && line[0] != '\n') {
            const char *v = strchr(line, ':');
            if (!v) continue;
            v++;
            while (*v == ' ' || *v == '\t')
                v++;
            size_t n = strcspn(v, "\n");
            if (strncmp(line, "model name", 10) == 0)
                snprintf(name, sizeof name, "%.*s", (int)n, v);
            else if (strncmp(line, "cpu family", 10) == 0)
                snprintf(family, sizeof family, "%.*s", (int)n, v);
            else if (strncmp(line, "model\t", 6) == 0)
                snprintf(model, sizeof model, "%.*s", (int)n, v);
        }
        fclose(f);
        if (name[0] && family[0] && model[0])
            snprintf(env->cpu, sizeof env->cpu, "%s (family %s, model %s)", name, family, model);
        else if (name[0])
            snprintf(env->cpu, sizeof env->cpu, "%s", name);
    }
    env->ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    env->load1 = -1;
    f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &env->load1) != 1) env->load1 = -1;
        fclose(f);
    }
    env->busy = cpu_busy_now();
    env->env_threads = getenv("OPENBLAS_NUM_THREADS");
    env->env_omp = getenv("OMP_NUM_THREADS");
    env->env_coretype = getenv("OPENBLAS_CORETYPE");
#if BENCH_HAVE_OPENBLAS_INFO
    env->blas_threads = openblas_get_num_threads();
    env->blas_core = openblas_get_corename();
    env->blas_config = openblas_get_config();
#else
    env->blas_threads = -1;
#endif
    if (!env->blas_core) env->blas_core = "unknown";
    if (!env->blas_config) env->blas_config = "unknown";
    env->tg_threads = tg_num_threads();
    env->allocator = tg_mem_allocator();
    env->vector_isa = tg_cpu_vector_isa();
    env->version = tg_version();
}

/* The widest vector ISA of OpenBLAS's x86 kernel family `core` (0.3.21's
 * names): 3 AVX-512, 2 AVX2, 1 AVX, 0 older or unknown. */
static int core_isa(const char *core)
{
    static const struct {
        const char *name;
        int isa;
    } cores[] = {{"SkylakeX", 3},    {"Cooperlake", 3}, {"SapphireRapids", 3}, {"Haswell", 2},
                 {"Zen", 2},         {"Excavator", 2},  {"Sandybridge", 1},    {"Bulldozer", 1},
                 {"Piledriver", 1}, {"Steamroller", 1}};
    for (size_t i = 0; i < sizeof cores / sizeof *cores; i++)
        if (!strcasecmp(core, cores[i].name)) return cores[i].isa;
    return 0;
}

/* The CPU's widest: as core_isa. */
static int cpu_isa(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
        return 3;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
    if (__builtin_cpu_supports("avx")) return 1;
#endif
    return 0;
}

void bench_print_env(FILE *f, const bench_env *env)
{
    fprintf(f, "tapegrad %s, tensor storage via %s, f32 math kernels %s\n", env->version,
            env->allocator, env->vector_isa);
    fprintf(f, "cpu       %s, %d online; at start: load average %.2f, %.0f%% busy\n", env->cpu,
            env->ncpu, env->load1, 100 * env->busy);
    fprintf(f,
            "threads   OpenBLAS %d, tapegrad elementwise pool %d "
            "(OPENBLAS_NUM_THREADS=%s, OMP_NUM_THREADS=%s)\n",
            env->blas_threads, env->tg_threads, env->env_threads ? env->env_threads : "unset",
            env->env_omp ? env->env_omp : "unset");
    fprintf(f, "openblas  core %s (OPENBLAS_CORETYPE=%s)\n", env->blas_core,
            env->env_coretype ? env->env_coretype : "unset");
    fprintf(f, "          config: %s\n", env->blas_config);
    /* OPENBLAS_CORETYPE can pin kernels narrower than the CPU's: on this
     * project's AVX-512 machine, Haswell's made the mlp's step 1.7x and the
     * deep MLP's 1.8x slower than the Cooperlake kernels OpenBLAS picks
     * itself (docs/benchmarks.md). Said, not changed: it is the user's. */
    static const char *const isa[] = {"SSE", "AVX", "AVX2", "AVX-512"};
    int want = cpu_isa(), got = core_isa(env->blas_core);
    if (env->env_coretype && got > 0 && got < want)
        fprintf(f,
                "          note: OPENBLAS_CORETYPE=%s pins %s kernels on a CPU with %s; unset, "
                "OpenBLAS picks wider ones (faster GEMMs)\n",
                env->env_coretype, isa[got], isa[want]);
}

void bench_json_str(FILE *f, const char *s)
{
    if (!s) {
        fputs("null", f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}
