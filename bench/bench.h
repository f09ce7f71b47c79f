/* bench.h - the benchmark suite behind `tapegrad bench` and the
 * bench_suite / bench_core executables. The same sources are compiled into
 * the CLI and the executables, so both report exactly the same
 * measurement. Not installed.
 *
 *   common.c      clock, statistics, environment, raw sgemm, errors, lean stages
 *   core.c        the two core figures (tanh chain ns/op, MLP vs sgemm)
 *   wl_small.c    workloads tiny, chain, elementwise, rnn, lstm
 *   wl_gemm.c     workloads mlp, conv, deep, wide (with their raw GEMMs)
 *   suite.c       the measurement every program shares (sessions, rounds,
 *                 memory peak), and one workload's run: checks, timing,
 *                 memory, profile, DOT
 * Every workload is defined once, as a bench_workload; bench_suite,
 * bench_core, bench_policies and bench_fingerprint all drive them through
 * it.  *   report.c      the table and the JSON
 *   cli.c         argument parsing shared by `tapegrad bench` and bench_suite */
#ifndef TG_BENCH_H
#define TG_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <tapegrad.h>

/* ---- common.c */

/* CLOCK_MONOTONIC in nanoseconds. */
double bench_now_ns(void);

/* Median, min and max of a sample, in ms per iteration. */
typedef struct bench_stat {
    double median, min, max;
} bench_stat;

/* Sorts v (n > 0) in place and summarises it. */
bench_stat bench_stat_of(double *v, int n);
/* Median of v (sorts it). */
double bench_median(double *v, int n);

/* Formats into err and returns -1. */
int bench_fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* bench_fail with the library's last error message appended. */
int bench_lib_fail(char *err, size_t errlen, const char *what);

/* C (m,n) = op(A) op(B), row-major, beta 0: the call tapegrad's cpu GEMM
 * makes. */
void bench_sgemm(bool ta, bool tb, int m, int n, int k, const float *a, int lda, const float *b,
                 int ldb, float *c, int ldc);
/* malloc of n floats filled with a small deterministic pattern (so raw
 * GEMMs never see NaN or denormals); NULL on OOM. */
float *bench_floats(size_t n, float scale);
/* Flops of an (m, k) x (k, n) product. */
#define GEMM_FLOPS(m, n, k) (2.0 * (double)(m) * (double)(n) * (double)(k))
/* Copies a contiguous f32 tensor into a new malloc'd buffer (NULL on error). */
float *bench_copy_f32(tg_tensor *t);
/* Mean softmax cross-entropy of logits z (n, c) against labels y, in
 * double: the workloads' plain-C references. */
double bench_ce_mean(const float *z, const int64_t *y, int n, int c);
/* A workload's setup failure: err gets the library's last error, or "out
 * of memory" when there is none; returns NULL. */
void *bench_setup_failed(char *err, size_t errlen, const char *what);

/* Where the figures were measured. Strings point into the struct or at
 * static/library storage; valid for the life of the process. */
typedef struct bench_env {
    char cpu[160];            /* "model name" from /proc/cpuinfo, or "unknown" */
    int ncpu;                 /* online processors */
    int blas_threads;         /* openblas_get_num_threads(), -1 if unknown */
    int tg_threads;           /* tg_num_threads() */
    const char *env_threads;  /* OPENBLAS_NUM_THREADS as set, or NULL */
    const char *env_omp;      /* OMP_NUM_THREADS as set, or NULL */
    const char *env_coretype; /* OPENBLAS_CORETYPE as set, or NULL */
    const char *blas_core;    /* openblas_get_corename(), or "unknown" */
    const char *blas_config;  /* openblas_get_config(), or "unknown" */
    const char *allocator;    /* tg_mem_allocator() */
    const char *vector_isa;   /* tg_cpu_vector_isa() */
    const char *version;      /* tg_version() */
    double load1;             /* 1-minute load average at start, -1 unknown */
    double busy; /* share of the cpus others kept busy over 0.25 s at start, -1 unknown */
} bench_env;

/* Fills env (never fails). */
void bench_env_get(bench_env *env);
void bench_print_env(FILE *f, const bench_env *env);

/* JSON helpers: a quoted, escaped string (NULL writes null). */
void bench_json_str(FILE *f, const char *s);

/* A forward run stage by stage, lean: tg_checkpoint_sequential over the n
 * stages, which runs each stage in a scope of its own so that its
 * intermediates die at its end (sqrt(n) segments with segments, else none).
 * The caller owns the returned output. */
tg_tensor *bench_lean_stages(tg_tape *tape, int segments, int n, tg_segment_fn fn, void *ud,
                             tg_tensor *x);

/* ---- core.c: the two core figures of the first benchmark issue, on the
 * chain and mlp workloads. */
typedef struct bench_opts {
    bool quick; /* fewer and shorter runs (a smoke run, not a measurement) */
} bench_opts;

/* (a) Per-op overhead: a chain of `ops` tg_tanh on a 1-element f32
 * parameter (the chain workload). */
typedef struct bench_chain_result {
    int ops;               /* chain length (100) */
    int runs;              /* timed runs the medians are taken over */
    double fwd_bwd_ns;     /* record + backward + tape reset, per op */
    double fwd_only_ns;    /* same chain, grad disabled, per op */
    double plain_ns;       /* plain C tanhf + derivative, per op */
    double ratio_vs_plain; /* fwd_bwd_ns / plain_ns */
    double ratio_vs_fwd;   /* fwd_bwd_ns / fwd_only_ns */
    double check_err;      /* worst relative error of value and gradient vs plain C */
} bench_chain_result;

/* (b) 784-512-512-10 ReLU MLP, batch 128, f32, cpu backend, cross-entropy:
 * the mlp workload (tg_linear layers) against its raw GEMMs. */
typedef struct bench_mlp_result {
    int batch, in, hidden, classes;
    int runs;                     /* timed runs per variant (interleaved) */
    double flops_fwd;             /* the 3 forward GEMMs */
    double flops_total;           /* 3 forward + 3 dW + 2 dX GEMMs */
    double tg_step_ms;            /* tapegrad forward + backward (+ reset), median */
    double tg_fwd_ms;             /* tapegrad forward only (recording), median */
    double raw_step_ms;           /* the same 8 GEMMs as cblas_sgemm calls, median */
    double raw_fwd_ms;            /* the 3 forward cblas_sgemm calls, median */
    double tg_gflops, raw_gflops; /* flops_total / step time */
    double ratio;                 /* tg_step_ms / raw_step_ms */
    double fwd_ratio;             /* tg_fwd_ms / raw_fwd_ms */
    double check_err;             /* worst relative error (loss, gradients) vs plain C */
} bench_mlp_result;

/* 0 on success; otherwise -1 with a message in err (a result that
 * disagrees with the reference is a failure, and nothing is timed). */
int bench_chain(const bench_opts *opts, bench_chain_result *res, char *err, size_t errlen);
int bench_mlp(const bench_opts *opts, bench_mlp_result *res, char *err, size_t errlen);
void bench_print_chain(FILE *f, const bench_chain_result *r);
void bench_print_mlp(FILE *f, const bench_mlp_result *r);
void bench_json_chain(FILE *f, const bench_chain_result *c);
void bench_json_mlp(FILE *f, const bench_mlp_result *m);

/* ---- Workloads (wl_small.c, wl_gemm.c). Each keeps its own state; the
 * suite drives them all the same way. */
typedef struct bench_workload {
    const char *name;
    const char *desc;      /* one line: model, sizes, loss */
    bool sequential;       /* --policy segments uses tg_checkpoint_sequential */
    double check_tol;      /* relative tolerance of the loss against the reference */
    const char *gemm_desc; /* what the raw GEMMs are, NULL: none timed */
    /* What gemm times when it is not raw GEMMs ("fused pass"; NULL: raw
     * GEMMs); gemm_flops are then 0. */
    const char *baseline;
    double gemm_flops_fwd, gemm_flops_all; /* of those GEMMs */
    /* Builds parameters and inputs; NULL with err set on failure. */
    void *(*setup)(char *err, size_t errlen);
    tg_params *(*params)(void *st);
    /* Records the forward on tape in the caller's scope and returns the
     * one-element loss (NULL, error set, on failure). segments: --policy
     * segments. */
    tg_tensor *(*forward)(void *st, tg_tape *tape, int segments);
    /* The loss recomputed in plain C (+ cblas) from the current parameters. */
    int (*reference)(void *st, double *loss, char *err, size_t errlen);
    /* Optional: compares the gradients left by a backward with a plain-C
     * derivative; *rel gets the worst relative error. */
    int (*check_grad)(void *st, double *rel, char *err, size_t errlen);
    /* Optional: the workload's GEMMs with raw cblas_sgemm, forward only or
     * forward and backward (or the baseline named by baseline). */
    void (*gemm)(void *st, bool backward);
    /* Optional: the same forward with every intermediate released once
     * used (bench_lean_stages, or by hand), so that what a checkpoint
     * policy saves shows in the tensor peak (bench_policies' lean peak).
     * Returns the loss in the caller's scope; *owned gets a tensor kept
     * out of the scopes, which the caller releases after backward (NULL:
     * none). Must record the same ops in the same order as forward. */
    tg_tensor *(*forward_lean)(void *st, tg_tape *tape, int segments, tg_tensor **owned);
    void (*teardown)(void *st);
} bench_workload;

extern const bench_workload bench_wl_tiny, bench_wl_chain, bench_wl_elementwise, bench_wl_fused,
    bench_wl_rnn;
extern const bench_workload bench_wl_mlp, bench_wl_conv, bench_wl_deep;
/* bench_policies' three that are not in the suite: a wide Linear stack
 * whose activations outweigh its weights, and an LSTM, by the cell and as
 * the layer. */
extern const bench_workload bench_wl_wide, bench_wl_lstm, bench_wl_lstm_seq;

/* Every workload in the suite's order; NULL-terminated. The suite and
 * bench_fingerprint run these; bench_workload_find knows these only. */
extern const bench_workload *const bench_workloads[];
const bench_workload *bench_workload_find(const char *name);

/* The chain workload's length and its value and derivative in plain C
 * from x0 (wl_small.c): the reference of the workload and bench_core's
 * plain-C baseline. */
#define BENCH_CHAIN_OPS 100
void bench_chain_plain(float x0, float *y, float *g);

/* The mlp workload's sizes (wl_gemm.c), which bench_core reports. */
#define BENCH_MLP_BATCH 128
extern const int bench_mlp_dims[4];

/* ---- suite.c */
typedef enum bench_policy {
    BENCH_POLICY_NONE = 0,
    BENCH_POLICY_BALANCED,
    BENCH_POLICY_BUDGET,
    BENCH_POLICY_SEGMENTS,
    BENCH_POLICY_BINOMIAL
} bench_policy;

/* A workload's forward segments: none, sqrt(n) groups (--policy segments)
 * or binomial with BENCH_BINOMIAL_SLOTS slots (--policy binomial; a
 * workload that is not a sequence of stages takes it as segments). */
enum { BENCH_SEG_NONE = 0, BENCH_SEG_SQRT = 1, BENCH_SEG_BINOMIAL = 2 };
#define BENCH_BINOMIAL_SLOTS 3
/* tg_checkpoint_sequential's nsegments for a BENCH_SEG_* mode. */
static inline int bench_nsegments(int segments)
{
    return segments == BENCH_SEG_BINOMIAL ? -BENCH_BINOMIAL_SLOTS
                                          : segments == BENCH_SEG_SQRT ? 0 : 1;
}
/* The BENCH_SEG_* mode of a policy. */
static inline int bench_seg_mode(bench_policy p)
{
    return p == BENCH_POLICY_BINOMIAL ? BENCH_SEG_BINOMIAL
                                      : p == BENCH_POLICY_SEGMENTS ? BENCH_SEG_SQRT : BENCH_SEG_NONE;
}

typedef struct bench_suite_opts {
    bool quick;
    bool profile; /* profile a few extra fwd+bwd steps per workload */
    bench_policy policy;
    size_t budget_bytes;  /* BENCH_POLICY_BUDGET */
    const char *dot_path; /* write the mlp tape here, or NULL */
    int threads;          /* tg_set_num_threads, 0: as the environment says */
} bench_suite_opts;

#define BENCH_PROFILE_ROWS 32

/* Profiler rows per step (figures divided by the number of profiled steps). */
typedef struct bench_profile {
    int steps;
    int nrows;
    tg_profile_row rows[BENCH_PROFILE_ROWS]; /* sorted by total time, descending */
} bench_profile;

typedef struct bench_result {
    const bench_workload *wl;
    bool ok;
    char error[512];                /* why it failed, when !ok */
    int runs, warmup, reps;         /* samples, warm-up samples, iterations per sample */
    bench_stat fwd, fwd_bwd, train; /* ms per iteration */
    bool have_gemm;
    bench_stat gemm_fwd, gemm_all;   /* raw cblas_sgemm, ms per iteration */
    double ratio_fwd, ratio_fwd_bwd; /* median tapegrad / median raw GEMMs */
    size_t mem_peak_bytes;           /* tensor storage above the baseline, one fwd+bwd */
    size_t mem_train_peak_bytes;     /* same, one train step */
    size_t saved_peak_bytes;         /* tg_tape_saved_peak_bytes of one fwd+bwd */
    int64_t nodes;                   /* tape nodes of one forward */
    int64_t recomputes;              /* recomputed forwards in one backward */
    double loss, ref_loss, loss_rel_err;
    double grad_norm;     /* tg_params_grad_norm after one fwd+bwd */
    bool grad_repeatable; /* two fwd+bwd gave bitwise equal loss and norm */
    bool have_grad_check;
    double grad_rel_err;
    bool have_chain; /* chain: the per-op figures of core.c */
    bench_chain_result chain;
    bool have_profile;
    bench_profile profile;
} bench_result;

/* ---- suite.c: the measurement. A session is one workload set up for
 * measuring: its state, a tape under a policy, an SGD optimizer (lr 1e-3)
 * over its parameters. Every program measures through these. */
typedef struct bench_session {
    const bench_workload *wl;
    void *st;
    tg_params *ps;
    tg_tape *tape;
    tg_optim *opt;
    int segments; /* forward's segments: BENCH_SEG_* */
    bool lean;     /* forward with wl->forward_lean */
} bench_session;

/* What a session step does; the GEMM variants are wl->gemm. */
typedef enum bench_variant {
    BENCH_STEP_FWD = 0, /* forward recorded, then scope and tape released */
    BENCH_STEP_FWD_BWD, /* gradients dropped, forward, backward, release */
    BENCH_STEP_TRAIN,   /* tg_optim_zero_grad, forward, backward, tg_optim_step */
    BENCH_GEMM_FWD,     /* the raw forward GEMMs */
    BENCH_GEMM_ALL      /* the raw forward and backward GEMMs */
} bench_variant;

/* What one step observed. */
typedef struct bench_step_info {
    double loss;
    int64_t nodes;        /* tape nodes of the forward */
    int64_t recomputes;   /* forwards backward re-ran */
    size_t saved_fwd;     /* tg_tape_saved_peak_bytes after the forward */
    size_t saved_peak;    /* the same after backward */
} bench_step_info;

/* Sets up wl under opts' policy and with the optimizer; opts NULL: policy
 * none and no optimizer (no BENCH_STEP_TRAIN; the gradients stay plain
 * tensors of their own). -1 with err set on failure (close the session
 * all the same). */
int bench_session_open(bench_session *s, const bench_workload *wl, const bench_suite_opts *opts,
                       char *err, size_t errlen);
void bench_session_close(bench_session *s);
/* Replaces the session's tape with a new one under policy (budget for
 * BENCH_POLICY_BUDGET) and moves the parameters onto it. */
int bench_session_retape(bench_session *s, bench_policy policy, size_t budget, char *err,
                         size_t errlen);
/* One step of a BENCH_STEP_* variant; info may be NULL. */
tg_status bench_session_step(bench_session *s, bench_variant v, bench_step_info *info);
/* Drops the gradients, then runs one step between tg_mem_reset_peak and
 * tg_mem_peak_bytes: *peak gets the tensor storage above what was live
 * before. */
tg_status bench_session_mem(bench_session *s, bench_variant v, size_t *peak,
                            bench_step_info *info);
/* The checks run before anything is timed: one fwd+bwd, its loss against
 * wl->reference (and wl->check_grad where there is one), then a second
 * fwd+bwd that must give a bitwise equal loss and gradient norm. Fills
 * r's loss, ref_loss, loss_rel_err, grad_norm, grad_rel_err, nodes,
 * recomputes and saved_peak_bytes; -1 with r->error set on failure. */
int bench_session_check(bench_session *s, bench_result *r);
/* A bench_sample_fn over a session (ctx): reps iterations of variant. */
int bench_session_sample(void *ctx, int variant, long reps);

/* Runs reps iterations of one variant of a measurement; 0, or -1 when a
 * step failed (the library's last error says why). */
typedef int (*bench_sample_fn)(void *ctx, int variant, long reps);
/* Iterations of variant that make one sample last about target_ns (1 for
 * anything slower, at most 1e6). */
int bench_calibrate(bench_sample_fn fn, void *ctx, int variant, double target_ns, long *reps);
/* warmup + runs rounds; each takes one sample of every variant in turn
 * (variant[i], NULL: 0..nvar-1; reps[i] iterations, NULL: 1), so that
 * drift in clock speed or load hits all alike. t[i][r] gets the ns per
 * iteration of the r-th kept sample of the i-th. */
int bench_rounds(bench_sample_fn fn, void *ctx, int nvar, const int *variant, const long *reps,
                 int warmup, int runs, double *const *t);

/* Runs one workload; res->ok tells whether it worked (res->error why not).
 * Returns 0 on success, -1 on failure. */
int bench_run(const bench_workload *wl, const bench_suite_opts *opts, bench_result *res);
/* ---- dp.c: `tapegrad bench dp`: data-parallel throughput on 1..max_workers
 * worker threads for the mlp and the lstm (tg_replicas). 0 on success. */
int bench_dp_cli(const bench_opts *o, int max_workers);
/* `tapegrad bench dp --mpi`, run under mpirun: the same models across the
 * MPI ranks (tg_dist), against one process on the whole batch, with the
 * all-reduce time and the overlap fraction. 2 without MPI in the build. */
int bench_dp_mpi_cli(const bench_opts *o);

/* ---- hvp.c: `tapegrad bench hvp`. A Hessian-vector product of wl's loss
 * w.r.t. all its parameters (forward, create_graph sweep, second sweep)
 * timed against wl's fwd+bwd in interleaved rounds. */
typedef struct bench_hvp_result {
    const bench_workload *wl;
    int runs;
    bench_stat fwd_bwd, hvp; /* ns per iteration */
    double ratio;            /* median of the per-round hvp / fwd_bwd */
    double hv_norm;          /* |Hv| of one product (finite, else a failure) */
} bench_hvp_result;
int bench_hvp(const bench_opts *o, const bench_workload *wl, bench_hvp_result *r, char *err,
              size_t errlen);
/* Runs it on mlp and elementwise and prints the table; 0 or 1 (a failure). */
int bench_hvp_cli(const bench_opts *o);
/* ---- replay.c: `tapegrad bench replay`: recording a step again against
 * tg_tape_replay on the chain, tiny and mlp. */
int bench_replay_cli(const bench_opts *o);

/* ---- scale.c: `tapegrad bench scale`: the chain at 10^2..10^6 ops (per-op
 * time, page faults, resident bytes). 0 on success. */
int bench_scale_cli(const bench_opts *o);

/* Writes the mlp workload's tape (one forward under opts' policy) as DOT. */
int bench_write_dot(const bench_suite_opts *opts, const char *path, char *err, size_t errlen);
const char *bench_policy_name(bench_policy p);

/* ---- report.c */
void bench_print_header(FILE *f, const bench_env *env, const bench_suite_opts *opts);
void bench_print_table_head(FILE *f);
void bench_print_result(FILE *f, const bench_result *r);
void bench_print_profile(FILE *f, const bench_result *r);
/* The checks, extra figures and (with --profile) the profile of r. */
void bench_print_notes(FILE *f, const bench_result *r);
/* Every figure as one JSON object. 0 on success, -1 (errno set) if the
 * file cannot be written. */
int bench_write_json(const char *path, const bench_env *env, const bench_suite_opts *opts,
                     const bench_result *res, int n);

/* ---- cli.c: `prog [WORKLOAD...] [options]`; returns an exit status
 * (0 ok, 1 a check or library call failed, 2 usage error). */
int bench_cli(const char *prog, int argc, char **argv);
void bench_cli_usage(FILE *f, const char *prog);

#endif
