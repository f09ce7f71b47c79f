/* Internals shared by the parameter set (params.c), the optimizers
 * (optim.c) and parameter files (src/io/safetensors.c). Not installed.
 *
 * Layout: every parameter is a view into one flat "pool" per (kind, dtype):
 * trainable f32, trainable f64, and buffers (saved, never optimised) of
 * f32, f64 and i64. Trainable pools also have a flat gradient buffer of the
 * same size; each trainable parameter has a gradient view into it. A pool's
 * storage grows by moving its data to a larger block; views keep working
 * because they share the storage object and address it by offset. */
#ifndef TG_TRAIN_INTERNAL_H
#define TG_TRAIN_INTERNAL_H

#include "core/internal.h"

enum {
    TG__POOL_F32 = 0, /* trainable */
    TG__POOL_F64,
    TG__POOL_BUF_F32, /* buffers */
    TG__POOL_BUF_F64,
    TG__POOL_BUF_I64,
    TG__POOL_COUNT
};
#define TG__POOL_TRAINABLE 2 /* pools [0, 2) are trainable */

typedef struct tg__pool {
    tg_dtype dtype;
    tg_tensor *values; /* NULL until the first parameter; capacity-sized */
    tg_tensor *grads;  /* trainable pools only */
    int64_t numel;     /* elements in use */
    int64_t cap;       /* elements allocated */
} tg__pool;

typedef struct tg__param {
    char *name;
    int pool;
    int64_t offset, numel;
    tg_tensor *value; /* view into the pool's values */
    tg_tensor *gview; /* view into the pool's grads (trainable only) */
} tg__param;

struct tg_params {
    tg__param *p;
    int n, cap;
    tg__pool pools[TG__POOL_COUNT];
    tg_backend backend;
};

/* Optimizer state kinds, in file order. */
enum {
    TG__ST_MOMENTUM = 0,   /* SGD, RMSprop: momentum_buffer */
    TG__ST_EXP_AVG,        /* Adam(W) */
    TG__ST_EXP_AVG_SQ,     /* Adam(W) */
    TG__ST_MAX_EXP_AVG_SQ, /* Adam(W) amsgrad */
    TG__ST_SQUARE_AVG,     /* RMSprop */
    TG__ST_GRAD_AVG,       /* RMSprop centered */
    TG__ST_COUNT
};

struct tg_optim {
    tg_optim_opts o;
    tg_params *ps;                                 /* borrowed */
    bool uses[TG__ST_COUNT];                       /* which states this optimizer keeps */
    void *state[TG__ST_COUNT][TG__POOL_TRAINABLE]; /* flat, pool-sized, zero-filled */
    int64_t state_cap[TG__POOL_TRAINABLE];         /* elements allocated per pool */
    int64_t *steps;                                /* per parameter (index into ps->p) */
    int nsteps_cap;
    int64_t step_count; /* tg_optim_step calls */
};

/* Moves trainable parameter p's gradient, a tensor of its own (from a
 * plain tg_backward), into its view of the flat buffer, which becomes the
 * gradient. Nothing to do when it is the view already or there is none. */
TG_INTERNAL tg_status tg__param_grad_to_flat(tg__param *p);
/* Names of the optimizer kinds ("sgd", ...) and of the state kinds
 * ("momentum_buffer", "exp_avg", ...), as written to parameter files. */
TG_INTERNAL const char *tg__optim_kind_name(tg_optim_kind kind);
TG_INTERNAL const char *tg__optim_state_name(int st);
/* Grows the optimizer's state to the parameter set's current size. */
TG_INTERNAL tg_status tg__optim_fit(tg_optim *opt);
/* The update of elements [lo, lo + n) of trainable parameter i, with the
 * step count it will have after this step (tg_optim_step's arithmetic, so
 * the same bits), and then, once all its elements are done, the step
 * count's advance and the version bump. For updates split across threads
 * (replicas.c); the state must fit the set first (tg__optim_fit). */
TG_INTERNAL void tg__optim_param_range(tg_optim *opt, int i, int64_t lo, int64_t n);
TG_INTERNAL void tg__optim_param_done(tg_optim *opt, int i);
/* Pointer to element 0 of parameter i in a pool-sized flat state array. */
TG_INTERNAL void *tg__param_slice(const tg_params *ps, int i, void *flat);

#endif
