/* bench_core.h - the two core benchmarks, shared by the bench_core
 * executable and `tapegrad bench` (bench_core.c is compiled into both, so
 * the CLI reports exactly what the benchmark measures). Not installed. */
#ifndef TG_BENCH_CORE_H
#define TG_BENCH_CORE_H

#include <stdbool.h>
#include <stdio.h>

typedef struct bench_opts {
    bool quick; /* fewer and shorter runs (a smoke run, not a measurement) */
} bench_opts;

/* Where the figures were measured. Strings point into the struct or at
 * static/library storage; valid for the life of the process. */
typedef struct bench_env {
    char cpu[160];              /* "model name" from /proc/cpuinfo, or "unknown" */
    int blas_threads;           /* openblas_get_num_threads(), -1 if unknown */
    const char *env_threads;    /* OPENBLAS_NUM_THREADS as set, or NULL */
    const char *env_coretype;   /* OPENBLAS_CORETYPE as set, or NULL */
    const char *blas_core;      /* openblas_get_corename(), or "unknown" */
    const char *blas_config;    /* openblas_get_config(), or "unknown" */
    const char *allocator;      /* tg_mem_allocator() */
    const char *version;        /* tg_version() */
} bench_env;

/* (a) Per-op overhead: a chain of `ops` tg_tanh on a 1-element f32 leaf. */
typedef struct bench_chain_result {
    int ops;                 /* chain length (100) */
    int runs;                /* timed runs the medians are taken over */
    double fwd_bwd_ns;       /* record + backward + tape reset, per op */
    double fwd_only_ns;      /* same chain, grad disabled, per op */
    double plain_ns;         /* plain C tanhf + derivative, per op */
    double ratio_vs_plain;   /* fwd_bwd_ns / plain_ns */
    double ratio_vs_fwd;     /* fwd_bwd_ns / fwd_only_ns */
    double check_err;        /* |grad_tapegrad - grad_plain| checked before timing */
} bench_chain_result;

/* (b) 784-512-512-10 ReLU MLP, batch 128, f32, cpu backend, cross-entropy. */
typedef struct bench_mlp_result {
    int batch, in, hidden, classes;
    int runs;                 /* timed runs per variant (interleaved) */
    double flops_fwd;         /* the 3 forward GEMMs */
    double flops_total;       /* 3 forward + 3 dW + 2 dX GEMMs */
    double tg_step_ms;        /* tapegrad forward + backward (+ reset), median */
    double tg_fwd_ms;         /* tapegrad forward only (recording), median */
    double raw_step_ms;       /* the same 8 cblas_sgemm calls, median */
    double raw_fwd_ms;        /* the 3 forward cblas_sgemm calls, median */
    double tg_gflops, raw_gflops; /* flops_total / step time */
    double ratio;             /* tg_step_ms / raw_step_ms */
    double fwd_ratio;         /* tg_fwd_ms / raw_fwd_ms */
    double check_err;         /* worst relative error vs the raw reference */
} bench_mlp_result;

/* Fills env (never fails). */
void bench_env_get(bench_env *env);

/* Run one benchmark. 0 on success; otherwise -1 with a message in err
 * (library failures include tg_last_error_message(); a result that
 * disagrees with the reference is a failure, and nothing is timed). */
int bench_chain(const bench_opts *opts, bench_chain_result *res, char *err, size_t errlen);
int bench_mlp(const bench_opts *opts, bench_mlp_result *res, char *err, size_t errlen);

/* Human-readable output: the environment header, and each result. */
void bench_print_env(FILE *f, const bench_env *env);
void bench_print_chain(FILE *f, const bench_chain_result *r);
void bench_print_mlp(FILE *f, const bench_mlp_result *r);

/* Every figure as one JSON object. 0 on success, -1 (errno set) if the file
 * cannot be written. */
int bench_write_json(const char *path, const bench_env *env, const bench_chain_result *chain,
                     const bench_mlp_result *mlp);

#endif
