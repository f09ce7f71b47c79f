/* tapegrad/optim.h - optimizers, learning-rate schedules, gradient
 * accumulation. Included by <tapegrad.h>; do not include directly.
 *
 * An optimizer updates the trainable parameters of a tg_params set in
 * place, with one loop over each flat buffer, using the gradients that
 * backward left on the parameters (see params.h). The update formulas are
 * PyTorch's (torch.optim, 1.13), step for step:
 *
 *   SGD:     g += wd*p; if momentum: b = g at the first step, else
 *            b = momentum*b + (1-dampening)*g; g = nesterov ? g + momentum*b : b;
 *            p -= lr*g
 *   Adam:    t += 1; g += wd*p; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
 *            vmax = max(vmax, v) (amsgrad); denom = sqrt(v or vmax)/sqrt(1-b2^t) + eps;
 *            p -= (lr/(1-b1^t)) * m/denom
 *   AdamW:   as Adam, but p *= 1 - lr*wd first and g gets no wd*p
 *   RMSprop: g += wd*p; s = alpha*s + (1-alpha)*g^2; centered: a = alpha*a + (1-alpha)*g,
 *            avg = sqrt(s - a^2) + eps, else avg = sqrt(s) + eps;
 *            momentum: b = momentum*b + g/avg, p -= lr*b; else p -= lr*g/avg
 *
 * Parameters without a gradient are skipped (no decay, no state change), and
 * each parameter keeps its own step count t, as in PyTorch.
 *
 * Gradient accumulation over k micro-batches: gradients add up on the
 * parameters across backward calls (tg_tape_reset keeps them) until
 * tg_optim_zero_grad. So:
 *
 *   tg_optim_zero_grad(opt);
 *   for (int i = 0; i < k; i++) {
 *       tg_backward(loss_of_micro_batch(i));   // mean over the micro-batch
 *       tg_tape_reset(tape);
 *   }
 *   tg_params_scale_grad(ps, 1.0 / k);         // mean over the k micro-batches
 *   tg_optim_step(opt);
 *
 * gives the same step as one backward over the whole batch (equal-sized
 * micro-batches). tg_optim_accumulate_scale(opt, k) does the scaling. */
#ifndef TAPEGRAD_OPTIM_H
#define TAPEGRAD_OPTIM_H

#include "params.h"

typedef enum tg_optim_kind {
    TG_OPTIM_SGD = 0,
    TG_OPTIM_ADAM,
    TG_OPTIM_ADAMW,
    TG_OPTIM_RMSPROP
} tg_optim_kind;
#define TG_OPTIM_KIND_COUNT 4

/* Options passed by value. Start from tg_optim_defaults(kind) and change
 * fields; each kind reads only its own fields. */
typedef struct tg_optim_opts {
    tg_optim_kind kind;
    double lr;           /* all; defaults: SGD 1e-3, Adam(W) 1e-3, RMSprop 1e-2 */
    double weight_decay; /* all; default 0, AdamW 1e-2 */
    double momentum;     /* SGD, RMSprop; default 0 */
    double dampening;    /* SGD; default 0 */
    bool nesterov;       /* SGD; needs momentum > 0 and dampening == 0 */
    double beta1, beta2; /* Adam(W); default 0.9, 0.999 */
    double eps;          /* Adam(W) 1e-8, RMSprop 1e-8 */
    bool amsgrad;        /* Adam(W); default false */
    double alpha;        /* RMSprop smoothing; default 0.99 */
    bool centered;       /* RMSprop; default false */
} tg_optim_opts;

/* Opaque optimizer. */
typedef struct tg_optim tg_optim;

/* PyTorch's defaults for kind (an invalid kind gives SGD's). */
tg_optim_opts tg_optim_defaults(tg_optim_kind kind);
/* New optimizer over ps (borrowed: ps must outlive it). NULL opts: defaults
 * of SGD. TG_ERR_INVALID (naming the field) for a negative or non-finite
 * lr, eps, momentum or weight decay, betas or alpha outside [0, 1),
 * Nesterov without momentum or with dampening. Parameters added to ps
 * later are picked up (with fresh state) at the next step. */
tg_optim *tg_optim_new(tg_params *ps, const tg_optim_opts *opts);
/* No-op on NULL. */
void tg_optim_free(tg_optim *opt);

/* One update of every trainable parameter that has a gradient. */
tg_status tg_optim_step(tg_optim *opt);
/* tg_params_zero_grad of the optimizer's parameter set. */
void tg_optim_zero_grad(tg_optim *opt);
/* Divides every gradient by k (> 0) after accumulating k micro-batches. */
tg_status tg_optim_accumulate_scale(tg_optim *opt, int k);

tg_optim_kind tg_optim_kind_of(const tg_optim *opt);
/* The options in force (lr included). */
tg_optim_opts tg_optim_options(const tg_optim *opt);
double tg_optim_lr(const tg_optim *opt);
/* TG_ERR_INVALID for a negative or non-finite lr. */
tg_status tg_optim_set_lr(tg_optim *opt, double lr);
/* Number of tg_optim_step calls so far (restored by tg_params_load). */
int64_t tg_optim_step_count(const tg_optim *opt);
/* The largest step count (global or per parameter) a parameter file may
 * hold: 2^53, exact as a double; tg_params_load refuses a larger or
 * negative one with TG_ERR_HEADER. */
#define TG_OPTIM_MAX_STEPS ((int64_t)1 << 53)
/* The parameter set (borrowed). */
tg_params *tg_optim_params(const tg_optim *opt);

/* ---- Learning-rate schedules: pure functions of the step count. A
 * schedule is an optional linear warmup followed by a decay, so "warmup
 * then cosine" is one value:
 *
 *   step < warmup_steps:  lr = base_lr * (f + (1 - f) * step / warmup_steps),
 *                         f = warmup_start_factor (PyTorch's LinearLR)
 *   otherwise, with s = step - warmup_steps:
 *     CONSTANT: base_lr
 *     STEP:     base_lr * gamma^floor(s / step_size)          (StepLR)
 *     COSINE:   eta_min + (base_lr - eta_min) * (1 + cos(pi * min(s, t_max) / t_max)) / 2
 *               (CosineAnnealingLR's closed form; held at eta_min after t_max)
 */
typedef enum tg_lr_decay { TG_LR_CONSTANT = 0, TG_LR_STEP, TG_LR_COSINE } tg_lr_decay;

typedef struct tg_lr_schedule {
    double base_lr;
    int64_t warmup_steps;       /* 0: no warmup */
    double warmup_start_factor; /* lr factor at step 0 of the warmup, in [0, 1] */
    tg_lr_decay decay;
    int64_t step_size; /* STEP: > 0 */
    double gamma;      /* STEP */
    int64_t t_max;     /* COSINE: > 0 */
    double eta_min;    /* COSINE */
} tg_lr_schedule;

/* The learning rate at step (>= 0); -1 with TG_ERR_INVALID for a bad
 * schedule (step_size or t_max <= 0 where used, negative step, ...). */
double tg_lr_schedule_at(const tg_lr_schedule *s, int64_t step);
/* Sets opt's lr to the schedule's value at tg_optim_step_count(opt), i.e.
 * for the step about to be taken. Call it before each tg_optim_step. */
tg_status tg_optim_schedule(tg_optim *opt, const tg_lr_schedule *s);

#endif
