/* Optimizers over a parameter set's flat buffers, and learning-rate
 * schedules. The update rules follow torch.optim 1.13's single-tensor code
 * path operation by operation (formulas in include/tapegrad/optim.h), with
 * arithmetic in the parameter's dtype like PyTorch.
 *
 * State (exp_avg, momentum_buffer, ...) is kept as flat arrays laid out like
 * the pools they belong to. A step walks the parameters in order and hands
 * each maximal run of adjacent parameters that have a gradient and the same
 * step count to one kernel call: in the usual case (every parameter got a
 * gradient) that is one loop over each flat buffer. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/pool.h"
#include "train/train_internal.h"

#define PI 3.14159265358979323846

static const char *const kind_names[TG_OPTIM_KIND_COUNT] = {"sgd", "adam", "adamw", "rmsprop"};
static const char *const state_names[TG__ST_COUNT] = {"momentum_buffer", "exp_avg",    "exp_avg_sq",
                                                      "max_exp_avg_sq",  "square_avg", "grad_avg"};

const char *tg__optim_kind_name(tg_optim_kind kind)
{
    return (unsigned)kind < TG_OPTIM_KIND_COUNT ? kind_names[kind] : "invalid";
}

const char *tg__optim_state_name(int st)
{
    return (unsigned)st < TG__ST_COUNT ? state_names[st] : "invalid";
}

tg_optim_opts tg_optim_defaults(tg_optim_kind kind)
{
    tg_optim_opts o = {
        .kind = kind, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .alpha = 0.99};
    switch (kind) {
    case TG_OPTIM_ADAMW:
        o.weight_decay = 1e-2;
        break;
    case TG_OPTIM_RMSPROP:
        o.lr = 1e-2;
        break;
    case TG_OPTIM_SGD:
    case TG_OPTIM_ADAM:
        break;
    default:
        o.kind = TG_OPTIM_SGD;
        break;
    }
    return o;
}

static tg_status bad_opt(const char *field, double v, const char *need)
{
    return tg__err(TG_ERR_INVALID, "bad argument #2 to 'optim_new' (%s = %g; %s)", field, v, need);
}

static tg_status check_opts(const tg_optim_opts *o)
{
    if ((unsigned)o->kind >= TG_OPTIM_KIND_COUNT)
        return tg__err(TG_ERR_INVALID, "bad argument #2 to 'optim_new' (unknown kind %d)",
                       (int)o->kind);
    if (!(o->lr >= 0.0) || !isfinite(o->lr)) return bad_opt("lr", o->lr, "need >= 0");
    if (!(o->weight_decay >= 0.0) || !isfinite(o->weight_decay))
        return bad_opt("weight_decay", o->weight_decay, "need >= 0");
    switch (o->kind) {
    case TG_OPTIM_SGD:
        if (!(o->momentum >= 0.0) || !isfinite(o->momentum))
            return bad_opt("momentum", o->momentum, "need >= 0");
        if (!isfinite(o->dampening)) return bad_opt("dampening", o->dampening, "need finite");
        if (o->nesterov && (o->momentum <= 0.0 || o->dampening != 0.0))
            return bad_opt("momentum", o->momentum,
                           "Nesterov needs momentum > 0 and dampening == 0");
        break;
    case TG_OPTIM_ADAM:
    case TG_OPTIM_ADAMW:
        if (!(o->beta1 >= 0.0 && o->beta1 < 1.0)) return bad_opt("beta1", o->beta1, "need [0,1)");
        if (!(o->beta2 >= 0.0 && o->beta2 < 1.0)) return bad_opt("beta2", o->beta2, "need [0,1)");
        if (!(o->eps >= 0.0) || !isfinite(o->eps)) return bad_opt("eps", o->eps, "need >= 0");
        break;
    case TG_OPTIM_RMSPROP:
        if (!(o->alpha >= 0.0 && o->alpha < 1.0)) return bad_opt("alpha", o->alpha, "need [0,1)");
        if (!(o->eps >= 0.0) || !isfinite(o->eps)) return bad_opt("eps", o->eps, "need >= 0");
        if (!(o->momentum >= 0.0) || !isfinite(o->momentum))
            return bad_opt("momentum", o->momentum, "need >= 0");
        break;
    }
    return TG_OK;
}

tg_optim *tg_optim_new(tg_params *ps, const tg_optim_opts *opts)
{
    if (!ps) {
        tg__err(TG_ERR_NULL, "bad argument #1 to 'optim_new' (NULL parameter set)");
        return NULL;
    }
    tg_optim_opts o = opts ? *opts : tg_optim_defaults(TG_OPTIM_SGD);
    if (check_opts(&o)) return NULL;
    tg_optim *opt = calloc(1, sizeof *opt);
    if (!opt) {
        tg__err(TG_ERR_NOMEM, "out of memory allocating an optimizer");
        return NULL;
    }
    opt->o = o;
    opt->ps = ps;
    switch (o.kind) {
    case TG_OPTIM_SGD:
        opt->uses[TG__ST_MOMENTUM] = o.momentum != 0.0;
        break;
    case TG_OPTIM_ADAM:
    case TG_OPTIM_ADAMW:
        opt->uses[TG__ST_EXP_AVG] = opt->uses[TG__ST_EXP_AVG_SQ] = true;
        opt->uses[TG__ST_MAX_EXP_AVG_SQ] = o.amsgrad;
        break;
    case TG_OPTIM_RMSPROP:
        opt->uses[TG__ST_SQUARE_AVG] = true;
        opt->uses[TG__ST_MOMENTUM] = o.momentum > 0.0;
        opt->uses[TG__ST_GRAD_AVG] = o.centered;
        break;
    }
    if (tg__optim_fit(opt)) {
        tg_optim_free(opt);
        return NULL;
    }
    return opt;
}

void tg_optim_free(tg_optim *opt)
{
    if (!opt) return;
    for (int s = 0; s < TG__ST_COUNT; s++)
        for (int p = 0; p < TG__POOL_TRAINABLE; p++)
            free(opt->state[s][p]);
    free(opt->steps);
    free(opt);
}

/* Grows a zero-filled array from `old` to `cap` elements of size es. */
static void *grow_zeroed(void *a, size_t old, size_t cap, size_t es)
{
    size_t bytes = cap * es;
    void *p = realloc(a, bytes ? bytes : 1);
    if (p && cap > old) memset((char *)p + old * es, 0, (cap - old) * es);
    return p;
}

tg_status tg__optim_fit(tg_optim *opt)
{
    tg_params *ps = opt->ps;
    if (ps->n > opt->nsteps_cap) {
        int64_t *s = grow_zeroed(opt->steps, (size_t)opt->nsteps_cap, (size_t)ps->cap, sizeof *s);
        if (!s) return tg__err(TG_ERR_NOMEM, "out of memory for optimizer step counts");
        opt->steps = s;
        opt->nsteps_cap = ps->cap;
    }
    for (int p = 0; p < TG__POOL_TRAINABLE; p++) {
        int64_t need = ps->pools[p].cap;
        if (need <= opt->state_cap[p]) continue;
        size_t es = tg_dtype_size(ps->pools[p].dtype);
        for (int s = 0; s < TG__ST_COUNT; s++) {
            if (!opt->uses[s]) continue;
            void *a = grow_zeroed(opt->state[s][p], (size_t)opt->state_cap[p], (size_t)need, es);
            if (!a) return tg__err(TG_ERR_NOMEM, "out of memory for optimizer state");
            opt->state[s][p] = a;
        }
        opt->state_cap[p] = need;
    }
    return TG_OK;
}

/* ---- Kernels, one per optimizer, expanded for float and double. n
 * elements from p/g and the state arrays; `step` is the count after this
 * update (1 at the first). Operation order mirrors torch.optim. */
#define OPTIM_KERNELS(T, S)                                                                        \
    static void sgd_##S(const tg_optim_opts *o, int64_t n, int64_t step, T *p, const T *g, T *buf) \
    {                                                                                              \
        const T lr = (T)o->lr, wd = (T)o->weight_decay, mom = (T)o->momentum;                      \
        const T damp1 = (T)(1.0 - o->dampening);                                                   \
        for (int64_t i = 0; i < n; i++) {                                                          \
            T d = g[i];                                                                            \
            if (wd != 0) d = d + wd * p[i];                                                        \
            if (buf) {                                                                             \
                buf[i] = step == 1 ? d : buf[i] * mom + damp1 * d;                                 \
                d = o->nesterov ? d + mom * buf[i] : buf[i];                                       \
            }                                                                                      \
            p[i] = p[i] + (-lr) * d;                                                               \
        }                                                                                          \
    }                                                                                              \
    static void adam_##S(const tg_optim_opts *o, int64_t n, int64_t step, T *p, const T *g, T *m,  \
                         T *v, T *vmax)                                                            \
    {                                                                                              \
        const bool decoupled = o->kind == TG_OPTIM_ADAMW;                                          \
        const T wd = (T)o->weight_decay, b1 = (T)o->beta1, b2 = (T)o->beta2;                       \
        const T b1c = (T)(1.0 - o->beta1), b2c = (T)(1.0 - o->beta2), eps = (T)o->eps;             \
        const T shrink = (T)(1.0 - o->lr * o->weight_decay);                                       \
        const double bc1 = 1.0 - pow(o->beta1, (double)step);                                      \
        const T neg_step_size = (T)(-(o->lr / bc1));                                               \
        const T bc2_sqrt = (T)sqrt(1.0 - pow(o->beta2, (double)step));                             \
        for (int64_t i = 0; i < n; i++) {                                                          \
            T gi = g[i];                                                                           \
            if (decoupled)                                                                         \
                p[i] = p[i] * shrink;                                                              \
            else if (wd != 0)                                                                      \
                gi = gi + wd * p[i];                                                               \
            m[i] = m[i] * b1 + b1c * gi;                                                           \
            v[i] = v[i] * b2 + b2c * gi * gi;                                                      \
            T s = v[i];                                                                            \
            if (vmax) {                                                                            \
                if (vmax[i] < s || s != s) vmax[i] = s;                                            \
                s = vmax[i];                                                                       \
            }                                                                                      \
            T denom = (T)sqrt(s) / bc2_sqrt + eps;                                                 \
            p[i] = p[i] + neg_step_size * m[i] / denom;                                            \
        }                                                                                          \
    }                                                                                              \
    static void rmsprop_##S(const tg_optim_opts *o, int64_t n, T *p, const T *g, T *sq, T *buf,    \
                            T *ga)                                                                 \
    {                                                                                              \
        const T lr = (T)o->lr, wd = (T)o->weight_decay, al = (T)o->alpha;                          \
        const T alc = (T)(1.0 - o->alpha), eps = (T)o->eps, mom = (T)o->momentum;                  \
        for (int64_t i = 0; i < n; i++) {                                                          \
            T gi = g[i];                                                                           \
            if (wd != 0) gi = gi + wd * p[i];                                                      \
            sq[i] = sq[i] * al + alc * gi * gi;                                                    \
            T avg;                                                                                 \
            if (ga) {                                                                              \
                ga[i] = ga[i] * al + alc * gi;                                                     \
                avg = (T)sqrt(sq[i] + (T)(-1) * ga[i] * ga[i]);                                    \
            } else {                                                                               \
                avg = (T)sqrt(sq[i]);                                                              \
            }                                                                                      \
            avg = avg + eps;                                                                       \
            if (buf) {                                                                             \
                buf[i] = buf[i] * mom + gi / avg;                                                  \
                p[i] = p[i] + (-lr) * buf[i];                                                      \
            } else {                                                                               \
                p[i] = p[i] + (-lr) * gi / avg;                                                    \
            }                                                                                      \
        }                                                                                          \
    }

OPTIM_KERNELS(float, f32)
OPTIM_KERNELS(double, f64)

/* State array s of pool pl, offset to element off (NULL if unused). */
static void *state_at(const tg_optim *opt, int s, int pl, int64_t off, size_t es)
{
    return opt->state[s][pl] ? (char *)opt->state[s][pl] + (size_t)off * es : NULL;
}

/* One kernel call over elements [off, off + n) of trainable pool pl. */
static void run_range(tg_optim *opt, int pl, int64_t off, int64_t n, int64_t step)
{
    tg__pool *pool = &opt->ps->pools[pl];
    size_t es = tg_dtype_size(pool->dtype);
    void *p = (char *)pool->values->storage->data + (size_t)off * es;
    void *g = (char *)pool->grads->storage->data + (size_t)off * es;
#define ST(s) state_at(opt, (s), pl, off, es)
    const tg_optim_opts *o = &opt->o;
    bool f32 = pool->dtype == TG_F32;
    switch (o->kind) {
    case TG_OPTIM_SGD:
        if (f32)
            sgd_f32(o, n, step, p, g, ST(TG__ST_MOMENTUM));
        else
            sgd_f64(o, n, step, p, g, ST(TG__ST_MOMENTUM));
        break;
    case TG_OPTIM_ADAM:
    case TG_OPTIM_ADAMW:
        if (f32)
            adam_f32(o, n, step, p, g, ST(TG__ST_EXP_AVG), ST(TG__ST_EXP_AVG_SQ),
                     ST(TG__ST_MAX_EXP_AVG_SQ));
        else
            adam_f64(o, n, step, p, g, ST(TG__ST_EXP_AVG), ST(TG__ST_EXP_AVG_SQ),
                     ST(TG__ST_MAX_EXP_AVG_SQ));
        break;
    case TG_OPTIM_RMSPROP:
        if (f32)
            rmsprop_f32(o, n, p, g, ST(TG__ST_SQUARE_AVG), ST(TG__ST_MOMENTUM),
                        ST(TG__ST_GRAD_AVG));
        else
            rmsprop_f64(o, n, p, g, ST(TG__ST_SQUARE_AVG), ST(TG__ST_MOMENTUM),
                        ST(TG__ST_GRAD_AVG));
        break;
    }
#undef ST
}

/* A run split across the elementwise pool: every update is elementwise,
 * so the parts give the bits of one call. */
typedef struct {
    tg_optim *opt;
    int pl;
    int64_t off, n, step;
} run_job;

static void run_part(void *ctx, int part, int nparts)
{
    const run_job *j = ctx;
    /* Parts start on 16-element boundaries, as the kernels' vector loops like. */
    int64_t chunk = ((j->n + nparts - 1) / nparts + 15) & ~(int64_t)15;
    int64_t lo = chunk * part, hi = lo + chunk;
    if (lo > j->n) lo = j->n;
    if (hi > j->n) hi = j->n;
    if (hi > lo) run_range(j->opt, j->pl, j->off + lo, hi - lo, j->step);
}

/* Runs of at least this many bytes of values are split across the pool. */
#define OPTIM_SPLIT_BYTES ((size_t)256 << 10)

static void run(tg_optim *opt, int pl, int64_t off, int64_t n, int64_t step)
{
    size_t bytes = (size_t)n * tg_dtype_size(opt->ps->pools[pl].dtype);
    int parts = tg__pool_size();
    if (parts > 1 && bytes >= 2 * OPTIM_SPLIT_BYTES) {
        if ((size_t)parts > bytes / OPTIM_SPLIT_BYTES) parts = (int)(bytes / OPTIM_SPLIT_BYTES);
        run_job j = {opt, pl, off, n, step};
        tg__pool_run(run_part, &j, parts);
        return;
    }
    run_range(opt, pl, off, n, step);
}

void tg__optim_param_range(tg_optim *opt, int i, int64_t lo, int64_t n)
{
    const tg__param *p = &opt->ps->p[i];
    run_range(opt, p->pool, p->offset + lo, n, opt->steps[i] + 1);
}

void tg__optim_param_done(tg_optim *opt, int i)
{
    opt->steps[i]++;
    tg__tensor_written(opt->ps->p[i].value);
}

tg_status tg_optim_step(tg_optim *opt)
{
    if (!opt) return tg__err(TG_ERR_NULL, "bad argument #1 to 'optim_step' (NULL optimizer)");
    tg_params *ps = opt->ps;
    tg_status st = tg_params_sync_grad(ps);
    if (!st) st = tg__optim_fit(opt);
    if (st) return st;
    /* Per pool: runs of adjacent parameters with a gradient and equal step
     * counts (the parameters of one pool are adjacent in addition order). */
    for (int pl = 0; pl < TG__POOL_TRAINABLE; pl++) {
        int64_t run_off = 0, run_n = 0, run_step = 0;
        for (int i = 0; i < ps->n; i++) {
            const tg__param *p = &ps->p[i];
            if (p->pool != pl) continue;
            bool has = p->value->grad != NULL;
            int64_t step = opt->steps[i] + 1;
            if (run_n && (!has || step != run_step || p->offset != run_off + run_n)) {
                run(opt, pl, run_off, run_n, run_step);
                run_n = 0;
            }
            if (!has) continue;
            opt->steps[i] = step;
            tg__tensor_written(p->value); /* its version: a record using it is stale */
            if (!run_n) {
                run_off = p->offset;
                run_step = step;
            }
            run_n += p->numel;
        }
        if (run_n) run(opt, pl, run_off, run_n, run_step);
    }
    opt->step_count++;
    return TG_OK;
}

void tg_optim_zero_grad(tg_optim *opt)
{
    if (opt) tg_params_zero_grad(opt->ps);
}

tg_status tg_optim_accumulate_scale(tg_optim *opt, int k)
{
    if (!opt) return tg__err(TG_ERR_NULL, "bad argument #1 to 'optim_accumulate_scale' (NULL)");
    if (k <= 0)
        return tg__err(TG_ERR_INVALID,
                       "bad argument #2 to 'optim_accumulate_scale' (k = %d; "
                       "need > 0)",
                       k);
    return tg_params_scale_grad(opt->ps, 1.0 / (double)k);
}

tg_optim_kind tg_optim_kind_of(const tg_optim *opt)
{
    return opt ? opt->o.kind : TG_OPTIM_SGD;
}

tg_optim_opts tg_optim_options(const tg_optim *opt)
{
    return opt ? opt->o : tg_optim_defaults(TG_OPTIM_SGD);
}

double tg_optim_lr(const tg_optim *opt)
{
    return opt ? opt->o.lr : 0.0;
}

tg_status tg_optim_set_lr(tg_optim *opt, double lr)
{
    if (!opt) return tg__err(TG_ERR_NULL, "bad argument #1 to 'optim_set_lr' (NULL optimizer)");
    if (!(lr >= 0.0) || !isfinite(lr))
        return tg__err(TG_ERR_INVALID, "bad argument #2 to 'optim_set_lr' (lr = %g; need >= 0)",
                       lr);
    opt->o.lr = lr;
    return TG_OK;
}

int64_t tg_optim_step_count(const tg_optim *opt)
{
    return opt ? opt->step_count : 0;
}

tg_params *tg_optim_params(const tg_optim *opt)
{
    return opt ? opt->ps : NULL;
}

/* ---- Schedules */
static double sched_bad(const char *why)
{
    tg__err(TG_ERR_INVALID, "bad argument to 'lr_schedule_at' (%s)", why);
    return -1.0;
}

double tg_lr_schedule_at(const tg_lr_schedule *s, int64_t step)
{
    if (!s) {
        tg__err(TG_ERR_NULL, "bad argument #1 to 'lr_schedule_at' (NULL schedule)");
        return -1.0;
    }
    if (step < 0) return sched_bad("negative step");
    if (!(s->base_lr >= 0.0) || !isfinite(s->base_lr)) return sched_bad("base_lr must be >= 0");
    if (s->warmup_steps < 0) return sched_bad("negative warmup_steps");
    if (step < s->warmup_steps) {
        double f = s->warmup_start_factor;
        if (!(f >= 0.0 && f <= 1.0)) return sched_bad("warmup_start_factor outside [0,1]");
        return s->base_lr * (f + (1.0 - f) * (double)step / (double)s->warmup_steps);
    }
    int64_t t = step - s->warmup_steps;
    switch (s->decay) {
    case TG_LR_CONSTANT:
        return s->base_lr;
    case TG_LR_STEP:
        if (s->step_size <= 0) return sched_bad("step_size must be > 0");
        if (!isfinite(s->gamma)) return sched_bad("gamma must be finite");
        return s->base_lr * pow(s->gamma, (double)(t / s->step_size));
    case TG_LR_COSINE:
        if (s->t_max <= 0) return sched_bad("t_max must be > 0");
        if (!isfinite(s->eta_min)) return sched_bad("eta_min must be finite");
        if (t > s->t_max) t = s->t_max;
        return s->eta_min +
               (s->base_lr - s->eta_min) * (1.0 + cos(PI * (double)t / (double)s->t_max)) / 2.0;
    }
    return sched_bad("unknown decay");
}

tg_status tg_optim_schedule(tg_optim *opt, const tg_lr_schedule *s)
{
    if (!opt) return tg__err(TG_ERR_NULL, "bad argument #1 to 'optim_schedule' (NULL optimizer)");
    double lr = tg_lr_schedule_at(s, opt->step_count);
    if (lr < 0.0) return tg_last_error();
    return tg_optim_set_lr(opt, lr);
}
