/* tapegrad/dist.h - data-parallel training across processes with MPI.
 * NOT included by <tapegrad.h>: include <tapegrad/dist.h> yourself (it
 * includes <mpi.h> and <tapegrad.h>) and build with MPI's flags
 * (`pkg-config --cflags --libs tapegrad` gives them when the library was
 * built with MPI; docs/distributed.md has the whole story).
 *
 * Every rank (process) holds a whole replica of the model and runs the
 * forward and backward of its own shard of each global batch
 * (tg_batches_new_sharded); tg_dist_backward then all-reduces the
 * gradients, overlapping the all-reduce with the backward sweep when the
 * tape is armed with tg_dist_attach, so every rank ends the step with the
 * same gradient and takes the same optimizer step.
 *
 * Determinism: gradients go through fixed buckets (contiguous runs of
 * trainable parameters in reverse order of addition, at most bucket_bytes,
 * one dtype each) that every rank reduces in the same order, and every
 * rank adds the reduced bucket to the same previous gradient, so ranks stay
 * bitwise identical as long as the MPI library gives every rank the same
 * all-reduce result (Open MPI does; the MPI standard advises it). With an
 * equal number of rows per rank, the averaged gradient equals the
 * single-process gradient of the whole global batch to rounding.
 *
 * Failures, what is guaranteed:
 *   - a rank whose forward or backward fails (tg_dist_backward with loss
 *     NULL, or a backward error) makes every other rank's tg_dist_backward
 *     of the same step return TG_ERR_DIST "rank R failed: <its message>",
 *     and no rank's gradients change;
 *   - a rank that hangs makes the others return TG_ERR_DIST "timed out
 *     after N s waiting for ..." after timeout_s;
 *   - a rank that dies (a crash, a signal) makes mpirun end the whole job;
 *   - after a timeout the communicator may hold unfinished requests and the
 *     ranks are out of step: every later call on that tg_dist returns
 *     TG_ERR_DIST at once; call tg_dist_abort.
 *
 * Threads: call these from one thread at a time, the thread that
 * initialised MPI unless MPI was initialised with MPI_THREAD_SERIALIZED or
 * more. A tg_dist, its parameter set and its tape belong together. */
#ifndef TAPEGRAD_DIST_H
#define TAPEGRAD_DIST_H

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>

#include <tapegrad.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TG_BUILDING) && defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* Options; zero-filled means the defaults. */
typedef struct tg_dist_opts {
    /* Seconds any one wait for the other ranks may take before it fails
     * with TG_ERR_DIST ("timed out after N s waiting for ..."); 0: 60. */
    double timeout_s;
    /* Largest gradient bucket in bytes (a larger parameter gets a bucket of
     * its own); 0: 1 MiB. */
    size_t bucket_bytes;
    /* false: average the gradients over the ranks (each rank's loss is a
     * mean over its shard); true: sum them (the losses are sums). */
    bool sum;
} tg_dist_opts;

typedef struct tg_dist tg_dist;

/* New data-parallel context over a duplicate of comm (MPI_Comm_dup, a
 * collective: every rank of comm calls it), with MPI_ERRORS_RETURN on the
 * duplicate so that MPI errors come back as TG_ERR_DIST with
 * MPI_Error_string's text in the message. NULL opts: the defaults.
 * TG_ERR_INVALID if MPI is not initialised (or already finalised), or for
 * a negative or non-finite timeout_s; TG_ERR_NULL for a NULL out;
 * TG_ERR_NOMEM; TG_ERR_DIST if the duplication fails. */
tg_status tg_dist_new(MPI_Comm comm, const tg_dist_opts *opts, tg_dist **out);
/* Frees d and its communicator; no-op on NULL. Call it before
 * MPI_Finalize. After a timeout it keeps the gradient staging buffers
 * (requests still pending may write them) and does not free the
 * communicator. It leaves the attached tape alone (which may be freed
 * already): a tape used after tg_dist_free must be disarmed first with
 * tg_tape_set_grad_ready(tape, NULL, NULL). */
void tg_dist_free(tg_dist *d);
/* This process's rank in d's communicator, and the number of ranks
 * (-1 for a NULL d). */
int tg_dist_rank(const tg_dist *d);
int tg_dist_size(const tg_dist *d);

/* Makes every rank start from rank 0's state: the values of every
 * parameter and buffer of ps, and with opt (NULL: none; it must be over
 * ps) its state buffers, global and per-parameter step counts and learning
 * rate. A collective. It first checks that every rank has the same layout
 * (entry count; each entry's name, trainable or buffer, dtype and shape;
 * optimizer or none and its kind): on a mismatch every rank returns
 * TG_ERR_DIST naming the first difference (the rank that differs says
 * what; the others "rank R failed: ..."), and nothing changes. */
tg_status tg_dist_broadcast(tg_dist *d, tg_params *ps, tg_optim *opt);

/* Arms the overlap of the all-reduce with the backward sweep: the trainable
 * parameters of ps must be leaves of tape (tg_params_requires_grad). From
 * now on, during tg_dist_backward over a loss recorded on tape, each
 * parameter's gradient is copied into its bucket as soon as the sweep has
 * finished it, and a bucket whose parameters are all in starts its
 * MPI_Iallreduce at once (in bucket order on every rank: a bucket filled
 * early waits for the ones before it). It sets tape's gradient-ready
 * function (tg_tape_set_grad_ready), replacing any other; it does nothing
 * during a plain tg_backward. Attaching again (another tape after the old
 * one was freed, or ps) replaces the previous one. TG_ERR_NULL for a NULL
 * argument. */
tg_status tg_dist_attach(tg_dist *d, tg_params *ps, tg_tape *tape);

/* The data-parallel backward, a collective: runs tg_backward(loss) on this
 * rank's loss, all-reduces the new gradients of the trainable parameters
 * of the parameter set given to the last tg_dist_attach or
 * tg_dist_broadcast, and adds their average (or sum) to the gradients the
 * parameters had before the call, so gradients accumulate across calls as
 * with tg_backward. Afterwards every trainable parameter has a gradient
 * (its view into the flat buffer, params.h; zeros where no rank's backward
 * reached it), identical on every rank. Parameters added since the last
 * call are picked up (every rank must add the same ones).
 *
 * loss may be NULL: this rank's forward failed (its error should be the
 * last error); it still takes part, sending zeros. Then the outcome is
 * agreed: if any rank failed, every rank returns an error and no gradient
 * changes on any rank: the failed rank its own status and message, the
 * others TG_ERR_DIST "rank R failed: <message>" (R the lowest failing
 * rank). TG_ERR_DIST on a timeout or an MPI error (then the gradients are
 * also as before). Without tg_dist_attach (or for a loss recorded on
 * another tape) the buckets are all started after the backward (no
 * overlap). TG_ERR_INVALID if neither tg_dist_attach nor
 * tg_dist_broadcast was called. */
tg_status tg_dist_backward(tg_dist *d, tg_tensor *loss);

/* Blocking all-reduce (average, or sum with opts.sum) of ps's current
 * gradients (synced into the flat buffer first), for a backward run by
 * hand. A collective; every trainable parameter has a gradient afterwards.
 * TG_ERR_DIST on a timeout or an MPI error (the gradients are then
 * undefined). */
tg_status tg_dist_allreduce_grads(tg_dist *d, tg_params *ps);

/* The failure protocol alone, a collective: every rank says whether its
 * part (e.g. loading its data) went well. Returns local where local is an
 * error (with this thread's last error message as it was), TG_ERR_DIST
 * "rank R failed: <message>" where another rank R (the lowest) failed,
 * else TG_OK. TG_ERR_DIST also on a timeout or an MPI error. */
tg_status tg_dist_check(tg_dist *d, tg_status local);

/* tg_params_save on rank 0 only (atomic, as tg_params_save), then
 * tg_dist_check, so that every rank returns the same outcome: rank 0 its
 * own status, the others TG_ERR_DIST "rank 0 failed: ..." when it
 * failed. A collective. */
tg_status tg_dist_params_save(tg_dist *d, const tg_params *ps, const tg_optim *opt,
                              const char *path);

/* Timings of the last tg_dist_backward, for benchmarks. */
typedef struct tg_dist_stats {
    double allreduce_s; /* summed time from each bucket's start to its completion */
    double exposed_s;   /* time spent waiting after tg_backward returned */
    double backward_s;  /* tg_backward itself (overlapped all-reduces included) */
    int buckets;        /* buckets all-reduced */
    size_t bytes;       /* bytes all-reduced (per rank) */
} tg_dist_stats;
/* Copies them to *out (zeros before the first backward). TG_ERR_NULL for
 * a NULL argument. */
tg_status tg_dist_last_stats(const tg_dist *d, tg_dist_stats *out);

/* MPI_Abort on d's communicator with code: ends every process of the job
 * (mpirun exits non-zero). For use after TG_ERR_DIST from a timeout, when
 * the ranks are out of step. A watchdog thread started first ends this
 * process with code (after a line on stderr) if MPI_Abort has neither
 * ended it nor returned after d's timeout_s: MPI_Abort can hang, and
 * mpirun ends the job once a rank exits non-zero. Returns only if
 * MPI_Abort does (then TG_ERR_DIST, and the watchdog still ends the
 * process after timeout_s); TG_ERR_NULL for a NULL d. */
tg_status tg_dist_abort(tg_dist *d, int code);

#if defined(TG_BUILDING) && defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif
