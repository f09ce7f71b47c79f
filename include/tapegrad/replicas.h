/* tapegrad/replicas.h - data-parallel training steps on worker threads.
 * Included by <tapegrad.h>; do not include directly. docs/distributed.md
 * has the whole story (and the MPI counterpart, <tapegrad/dist.h>).
 *
 * A replica set runs one training step over N worker threads: the batch is
 * cut along dim 0 into N contiguous shards, worker k runs the user's loss
 * function on shard k with its own tape, and the N gradients are summed in
 * worker order into the parameter set's flat gradient buffer (params.h),
 * where tg_optim_step finds them. The workers read the parameters' values
 * where they are (one copy, shared, read-only during the step) and each
 * keeps its own gradients: inside the loss function the parameter tensors
 * (those tg_params_add returned, which the layers hold) stand for the
 * worker's own leaves, so a model written for one thread runs unchanged.
 *
 * Determinism: for a given N and batch, every run gives bitwise the same
 * gradient (each worker's sweep is single-threaded and the sum has a fixed
 * order). With N = 1 the gradient is bitwise that of tg_backward on the
 * whole batch; with N > 1 it equals it to rounding (the shards' sums are
 * added in another order).
 *
 * Threads: during a step with N > 1, OpenBLAS and tapegrad's elementwise
 * pool run one thread per worker (tg_set_num_threads(1) for the step, the
 * previous count restored after it), so N workers use N cores; pick N <=
 * the number of cores. Worker 0 is the calling thread; the others are
 * made by tg_replicas_new and live until tg_replicas_free.
 *
 * Limits: the loss function must not write the parameters or buffers (a
 * BatchNorm layer in training mode updates its running statistics: every
 * worker would write them at once; evaluate such models with N = 1), and
 * nothing else may use the parameter set or its optimizer during a step. */
#ifndef TAPEGRAD_REPLICAS_H
#define TAPEGRAD_REPLICAS_H

#include "optim.h"

/* How worker gradients combine. MEAN: each worker's loss is a mean over
 * its shard, and worker k's gradient is weighted by rows_k / rows, so the
 * result is the gradient of the mean over the whole batch. SUM: the
 * losses are sums; gradients are added as they are. */
typedef enum tg_grad_reduce { TG_REDUCE_MEAN = 0, TG_REDUCE_SUM = 1 } tg_grad_reduce;

#define TG_REPLICAS_MAX_WORKERS 64
#define TG_REPLICAS_MAX_INPUTS 8

typedef struct tg_replicas_opts {
    int workers;       /* 1..TG_REPLICAS_MAX_WORKERS */
    tg_tape_opts tape; /* every worker's tape (policy, budget, anomaly) */
    tg_grad_reduce reduce;
    /* Optional optimizer over the same parameter set (else
     * TG_ERR_INVALID): each step then ends with its update, done by the
     * workers on the slices they have just summed (while those are in
     * their caches), to the same bits as tg_optim_step after the step.
     * Do not call tg_optim_step yourself then. NULL: gradients only. */
    tg_optim *optim;
} tg_replicas_opts;

/* What the loss function is told about its worker. */
typedef struct tg_replica_info {
    int worker, workers;
    tg_tape *tape; /* the worker's tape (tg_checkpoint_sequential, labels) */
    int64_t row0;  /* first row of the batch in this shard */
    int64_t rows;  /* rows in this shard (>= 1) */
} tg_replica_info;

/* Builds the loss of one shard: shard[i] is rows [row0, row0 + rows) of
 * inputs[i] along dim 0 (a view). Returns a scalar tensor (scope-owned is
 * fine: the step ends the worker's scope after backward), or NULL with the
 * last error set. Runs on the worker's thread. */
typedef tg_tensor *(*tg_replica_fn)(void *userdata, const tg_replica_info *info, int n,
                                    tg_tensor *const *shard);

typedef struct tg_replicas tg_replicas;

/* New replica set over ps (borrowed: it must outlive the set) with
 * opts->workers workers (NULL opts: 1 worker, default tape, MEAN).
 * NULL with TG_ERR_INVALID for a bad count, TG_ERR_NOMEM, or the error
 * of starting a thread. Parameters added to ps later are picked up at the
 * next step. */
tg_replicas *tg_replicas_new(tg_params *ps, const tg_replicas_opts *opts);
/* Stops the workers and frees everything. No-op on NULL. */
void tg_replicas_free(tg_replicas *r);
int tg_replicas_workers(const tg_replicas *r);
/* Worker k's tape (borrowed), e.g. to turn on anomaly mode. */
tg_tape *tg_replicas_tape(const tg_replicas *r, int worker);

/* One step: shards inputs[0..n) (all with the same dim 0 of at least 1
 * row, none tracked by a tape) across the workers, runs fn and backward
 * on each, and adds the combined gradient into ps's gradients (which
 * accumulate until tg_params_zero_grad, as with tg_backward). A worker
 * with no rows (a batch smaller than N) sits the step out. *loss (may be
 * NULL) gets the combined loss: the rows-weighted mean of the workers'
 * losses (MEAN) or their sum (SUM). On failure returns the status of the
 * first failing worker, with "worker k: " before its message, and no
 * gradient of ps changes. */
tg_status tg_replicas_step(tg_replicas *r, int n, tg_tensor *const *inputs, tg_replica_fn fn,
                           void *userdata, double *loss);

/* Seconds spent in the last step: compute (from the start of the step to
 * the last worker's end of backward) and reduce (summing into the flat
 * buffer, with the deferred weight gradients' GEMMs and, with an
 * optimizer, the update). NULL outputs are skipped. */
void tg_replicas_last_timing(const tg_replicas *r, double *compute_s, double *reduce_s);

/* Deferred weight gradients. With N > 1 workers, the weight gradient of an
 * affine layer (tg_linear, tg_affine) whose weight the worker's record
 * reads once is not made by the worker's backward: the worker keeps that
 * layer's input and output gradient, and in the reduce each worker makes a
 * slice of the weight's rows from every worker's pair, GEMM after GEMM in
 * worker order, straight into the flat buffer (with two workers, each
 * makes its own term of its slice in its backward, the reduce the other's).
 * The reduce then reads the workers' activations across cores instead of
 * their whole gradients.
 * The sum is the one the plain reduce takes, and it is used only where it
 * gives the same bits: SUM, or MEAN over equal shards and a power-of-two N
 * (the scales are equal powers of two, applied after the sum: the same
 * bits but where the unscaled sum overflows or the scaled terms are
 * subnormal); and only for shapes whose chained GEMMs the step has
 * checked, once, against whole GEMMs on random data with the backend's
 * own kernel, with the slices cut at multiples of 16, 12 or 48 rows (the
 * first that matches: a kernel's edge tiles may sum in another order than
 * its whole ones). Hooks, anomaly mode or a gradient-ready callback on a
 * worker's tape, or a parameter with a gradient to add to, turn it off.
 * This returns how many parameters the last step made that way. */
int tg_replicas_last_deferred(const tg_replicas *r);
/* How many parameters the last step would have made that way but did not,
 * because their chained GEMMs did not give the whole GEMMs' bits on this
 * backend (checked once per shape): their workers made them. Nonzero means
 * the BLAS costs the reduce speed, never that a gradient is different. */
int tg_replicas_last_refused(const tg_replicas *r);

#endif
