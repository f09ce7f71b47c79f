/* Parameter sets: named views into one flat value buffer (and one flat
 * gradient buffer) per dtype, so that zeroing, clipping, optimizer steps and
 * saving are single loops. Layout notes in train_internal.h.
 *
 * Gradients: a parameter's value carries its gradient view as its sink
 * (gsink), so a backward that finds the parameter without a gradient
 * writes it straight into the flat buffer and makes the view its grad
 * (tape/backward.c). Any other gradient tensor (a second backward's sum, a
 * hook's replacement) sync_grad copies into the flat gradient buffer and
 * points the leaf's grad at that view instead, so from then on
 * the flat buffer IS tg_grad(param): clipping it is visible through tg_grad,
 * and a later backward that accumulates (view + g, a new tensor) is picked
 * up by the next sync. Pointer equality with our own view, which the leaf
 * retains, tells a synced gradient from a fresh one without any ABA risk. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/train_internal.h"

#define NAME_MAX_LEN 255
#define POOL_MIN_CAP 64

static const char *const reserved_prefix = "optim/";

tg_params *tg_params_new(void)
{
    tg_params *ps = calloc(1, sizeof *ps);
    if (!ps) {
        tg__err(TG_ERR_NOMEM, "out of memory allocating a parameter set");
        return NULL;
    }
    ps->backend = tg_default_backend();
    static const tg_dtype dts[TG__POOL_COUNT] = {TG_F32, TG_F64, TG_F32, TG_F64, TG_I64};
    for (int i = 0; i < TG__POOL_COUNT; i++)
        ps->pools[i].dtype = dts[i];
    return ps;
}

void tg_params_free(tg_params *ps)
{
    if (!ps) return;
    for (int i = 0; i < ps->n; i++) {
        free(ps->p[i].name);
        if (ps->p[i].value->gsink == ps->p[i].gview) ps->p[i].value->gsink = NULL;
        tg_tensor_release(ps->p[i].value);
        tg_tensor_release(ps->p[i].gview);
    }
    free(ps->p);
    for (int i = 0; i < TG__POOL_COUNT; i++) {
        tg_tensor_release(ps->pools[i].values);
        tg_tensor_release(ps->pools[i].grads);
    }
    free(ps);
}

/* A new zero-filled block of nbytes for storage s holding `used` bytes. The
 * old block is freed by the caller through commit_block once every
 * allocation of the grow step has succeeded. */
static void *new_block(const tg_storage *s, size_t nbytes, size_t used)
{
    void *p = tg__data_alloc(nbytes);
    if (!p) return NULL;
    if (used) memcpy(p, s->data, used);
    memset((char *)p + used, 0, nbytes - used);
    return p;
}

static void commit_block(tg_tensor *pool, void *block, size_t nbytes, int64_t cap)
{
    tg_storage *s = pool->storage;
    tg__data_free(s->data, s->nbytes);
    s->data = block;
    s->nbytes = nbytes;
    pool->shape[0] = cap;
    pool->numel = cap;
}

static tg_tensor *pool_tensor(tg_dtype dtype, int64_t cap, tg_backend backend)
{
    int64_t shape[1] = {cap};
    tg_tensor *t = tg__tensor_empty(dtype, 1, shape, backend);
    if (t) memset(t->storage->data, 0, t->storage->nbytes);
    return t;
}

/* Makes room for `need` elements in pool pl (both buffers or neither).
 * Views into it stay valid: they share the storage object. */
static tg_status pool_reserve(tg__pool *pl, int64_t need, bool trainable, tg_backend backend)
{
    if (pl->values && need <= pl->cap) return TG_OK;
    int64_t cap = pl->cap * 2;
    if (cap < need) cap = need;
    if (cap < POOL_MIN_CAP) cap = POOL_MIN_CAP;
    size_t es = tg_dtype_size(pl->dtype);
    if (!pl->values) {
        pl->values = pool_tensor(pl->dtype, cap, backend);
        if (trainable && pl->values) pl->grads = pool_tensor(pl->dtype, cap, backend);
        if (!pl->values || (trainable && !pl->grads)) {
            tg_tensor_release(pl->values);
            pl->values = NULL;
            return TG_ERR_NOMEM;
        }
        pl->cap = cap;
        return TG_OK;
    }
    size_t nbytes = (size_t)cap * es, used = (size_t)pl->numel * es;
    void *vb = new_block(pl->values->storage, nbytes, used);
    void *gb = (vb && trainable) ? new_block(pl->grads->storage, nbytes, used) : NULL;
    if (!vb || (trainable && !gb)) {
        tg__data_free(vb, nbytes);
        return tg__err(TG_ERR_NOMEM, "out of memory growing a parameter buffer to %zu bytes",
                       nbytes);
    }
    commit_block(pl->values, vb, nbytes, cap);
    if (trainable) commit_block(pl->grads, gb, nbytes, cap);
    pl->cap = cap;
    return TG_OK;
}

static tg_status check_name(const tg_params *ps, const char *op, const char *name)
{
    if (!name) return tg__err(TG_ERR_NULL, "bad argument #2 to '%s' (NULL name)", op);
    size_t len = strlen(name);
    if (len == 0 || len > NAME_MAX_LEN)
        return tg__err(TG_ERR_INVALID, "bad argument #2 to '%s' (name of %zu bytes; need 1..%d)",
                       op, len, NAME_MAX_LEN);
    if (strncmp(name, reserved_prefix, strlen(reserved_prefix)) == 0 ||
        strcmp(name, "__metadata__") == 0)
        return tg__err(TG_ERR_INVALID,
                       "bad argument #2 to '%s' (name '%s' is reserved for "
                       "parameter files)",
                       op, name);
    for (int i = 0; i < ps->n; i++)
        if (strcmp(ps->p[i].name, name) == 0)
            return tg__err(TG_ERR_EXISTS,
                           "bad argument #2 to '%s' (a parameter named '%s' "
                           "already exists)",
                           op, name);
    return TG_OK;
}

static tg_tensor *add(tg_params *ps, const char *op, const char *name, tg_dtype dtype, int ndim,
                      const int64_t *shape, bool trainable)
{
    if (!ps) {
        tg__err(TG_ERR_NULL, "bad argument #1 to '%s' (NULL parameter set)", op);
        return NULL;
    }
    if (check_name(ps, op, name) || tg__check_dtype(op, dtype) || tg__check_shape(op, ndim, shape))
        return NULL;
    if (trainable && !tg__is_float(dtype)) {
        tg__err(TG_ERR_DTYPE,
                "bad argument #3 to '%s' (%s parameter cannot be trained; use "
                "tg_params_add_buffer)",
                op, tg_dtype_name(dtype));
        return NULL;
    }
    int pi =
        trainable ? (dtype == TG_F32 ? TG__POOL_F32 : TG__POOL_F64) : TG__POOL_BUF_F32 + (int)dtype;
    tg__pool *pl = &ps->pools[pi];
    int64_t numel = tg__numel(ndim, shape);
    if (ps->n == ps->cap) {
        int cap = ps->cap ? ps->cap * 2 : 16;
        tg__param *p = realloc(ps->p, (size_t)cap * sizeof *p);
        if (!p) {
            tg__err(TG_ERR_NOMEM, "out of memory growing a parameter set");
            return NULL;
        }
        ps->p = p;
        ps->cap = cap;
    }
    if (pool_reserve(pl, pl->numel + numel, trainable, ps->backend)) {
        if (tg_last_error() != TG_ERR_NOMEM)
            tg__err(TG_ERR_NOMEM, "out of memory allocating parameter '%s'", name);
        return NULL;
    }
    tg__param *p = &ps->p[ps->n];
    memset(p, 0, sizeof *p);
    int64_t strides[TG_MAX_DIMS];
    tg__contig_strides(ndim, shape, strides);
    p->name = malloc(strlen(name) + 1);
    p->value = tg__tensor_view(pl->values, ndim, shape, strides, pl->numel);
    if (trainable) p->gview = tg__tensor_view(pl->grads, ndim, shape, strides, pl->numel);
    if (!p->name || !p->value || (trainable && !p->gview)) {
        free(p->name);
        tg_tensor_release(p->value);
        tg_tensor_release(p->gview);
        tg__err(TG_ERR_NOMEM, "out of memory adding parameter '%s'", name);
        return NULL;
    }
    strcpy(p->name, name);
    p->value->gsink = p->gview; /* NULL for a buffer */
    p->pool = pi;
    p->offset = pl->numel;
    p->numel = numel;
    pl->numel += numel;
    ps->n++;
    return p->value;
}

tg_tensor *tg_params_add(tg_params *ps, const char *name, tg_dtype dtype, int ndim,
                         const int64_t *shape)
{
    return add(ps, "params_add", name, dtype, ndim, shape, true);
}

tg_tensor *tg_params_add_buffer(tg_params *ps, const char *name, tg_dtype dtype, int ndim,
                                const int64_t *shape)
{
    return add(ps, "params_add_buffer", name, dtype, ndim, shape, false);
}

int tg_params_count(const tg_params *ps)
{
    return ps ? ps->n : 0;
}

static const tg__param *entry(const tg_params *ps, int i, const char *op)
{
    if (!ps) {
        tg__err(TG_ERR_NULL, "bad argument #1 to '%s' (NULL parameter set)", op);
        return NULL;
    }
    if (i < 0 || i >= ps->n) {
        tg__err(TG_ERR_INVALID, "bad argument #2 to '%s' (index %d outside [0,%d))", op, i, ps->n);
        return NULL;
    }
    return &ps->p[i];
}

tg_tensor *tg_params_at(const tg_params *ps, int i)
{
    const tg__param *p = entry(ps, i, "params_at");
    return p ? p->value : NULL;
}

const char *tg_params_name(const tg_params *ps, int i)
{
    const tg__param *p = entry(ps, i, "params_name");
    return p ? p->name : NULL;
}

bool tg_params_trainable(const tg_params *ps, int i)
{
    const tg__param *p = entry(ps, i, "params_trainable");
    return p && p->pool < TG__POOL_TRAINABLE;
}

int tg_params_index(const tg_params *ps, const char *name)
{
    if (!ps || !name) {
        tg__err(TG_ERR_NULL, "bad argument #%d to 'params_index' (NULL)", ps ? 2 : 1);
        return -1;
    }
    for (int i = 0; i < ps->n; i++)
        if (strcmp(ps->p[i].name, name) == 0) return i;
    tg__err(TG_ERR_NOT_FOUND, "bad argument #2 to 'params_index' (no parameter named '%s')", name);
    return -1;
}

tg_tensor *tg_params_find(const tg_params *ps, const char *name)
{
    int i = tg_params_index(ps, name);
    return i < 0 ? NULL : ps->p[i].value;
}

int64_t tg_params_numel(const tg_params *ps)
{
    if (!ps) return 0;
    int64_t n = 0;
    for (int i = 0; i < TG__POOL_TRAINABLE; i++)
        n += ps->pools[i].numel;
    return n;
}

void *tg__param_slice(const tg_params *ps, int i, void *flat)
{
    const tg__param *p = &ps->p[i];
    return (char *)flat + (size_t)p->offset * tg_dtype_size(ps->pools[p->pool].dtype);
}

tg_status tg_params_requires_grad(tg_params *ps, tg_tape *tape)
{
    if (!ps) return tg__err(TG_ERR_NULL, "bad argument #1 to 'params_requires_grad' (NULL)");
    for (int i = 0; i < ps->n; i++) {
        if (ps->p[i].pool >= TG__POOL_TRAINABLE) continue;
        tg_status st = tg_requires_grad(tape, ps->p[i].value);
        if (st) return st;
    }
    return TG_OK;
}

static tg_tensor *flat_view(tg_params *ps, tg_dtype dtype, bool grad, const char *op)
{
    if (!ps) {
        tg__err(TG_ERR_NULL, "bad argument #1 to '%s' (NULL parameter set)", op);
        return NULL;
    }
    int pi = dtype == TG_F32 ? TG__POOL_F32 : dtype == TG_F64 ? TG__POOL_F64 : -1;
    if (pi < 0 || !ps->pools[pi].values) {
        tg__err(TG_ERR_NOT_FOUND, "bad argument #2 to '%s' (no trainable %s parameters)", op,
                tg_dtype_name(dtype));
        return NULL;
    }
    if (grad && tg_params_sync_grad(ps)) return NULL;
    tg__pool *pl = &ps->pools[pi];
    int64_t shape[1] = {pl->numel}, strides[1] = {1};
    return tg__scope_track(tg__tensor_view(grad ? pl->grads : pl->values, 1, shape, strides, 0));
}

tg_tensor *tg_params_flat(tg_params *ps, tg_dtype dtype)
{
    return flat_view(ps, dtype, false, "params_flat");
}

tg_tensor *tg_params_flat_grad(tg_params *ps, tg_dtype dtype)
{
    return flat_view(ps, dtype, true, "params_flat_grad");
}

tg_status tg__param_grad_to_flat(tg__param *p)
{
    tg_tensor *v = p->value, *g = v->grad;
    if (!g || g == p->gview) return TG_OK;
    if (g->dtype != v->dtype || g->numel != p->numel)
        return tg__err(TG_ERR_INTERNAL,
                       "gradient of parameter '%s' has %s[%lld], expected "
                       "%s[%lld]",
                       p->name, tg_dtype_name(g->dtype), (long long)g->numel,
                       tg_dtype_name(v->dtype), (long long)p->numel);
    size_t nbytes = (size_t)p->numel * tg_dtype_size(v->dtype);
    tg_status st = tg_tensor_copy_out(g, tg__tensor_ptr(p->gview), nbytes);
    if (st) return st;
    v->grad = tg_tensor_retain(p->gview);
    tg_tensor_release(g);
    return TG_OK;
}

tg_status tg_params_sync_grad(tg_params *ps)
{
    if (!ps) return tg__err(TG_ERR_NULL, "bad argument #1 to 'params_sync_grad' (NULL)");
    for (int i = 0; i < ps->n; i++) {
        tg__param *p = &ps->p[i];
        if (p->pool >= TG__POOL_TRAINABLE) continue;
        if (!p->value->grad) {
            memset(tg__tensor_ptr(p->gview), 0,
                   (size_t)p->numel * tg_dtype_size(p->value->dtype));
            continue;
        }
        tg_status st = tg__param_grad_to_flat(p);
        if (st) return st;
    }
    return TG_OK;
}

void tg_params_zero_grad(tg_params *ps)
{
    if (!ps) return;
    for (int i = 0; i < ps->n; i++)
        if (ps->p[i].pool < TG__POOL_TRAINABLE) tg_grad_zero(ps->p[i].value);
}

/* g *= f over a whole flat gradient buffer (parameters without a gradient
 * hold zeros there and stay zero). */
static void scale_pool(tg__pool *pl, double f)
{
    if (!pl->grads) return;
    void *g = pl->grads->storage->data;
    if (pl->dtype == TG_F32) {
        float ff = (float)f, *x = g;
        for (int64_t i = 0; i < pl->numel; i++)
            x[i] *= ff;
    } else {
        double *x = g;
        for (int64_t i = 0; i < pl->numel; i++)
            x[i] *= f;
    }
}

tg_status tg_params_scale_grad(tg_params *ps, double factor)
{
    if (!ps) return tg__err(TG_ERR_NULL, "bad argument #1 to 'params_scale_grad' (NULL)");
    if (!isfinite(factor))
        return tg__err(TG_ERR_INVALID,
                       "bad argument #2 to 'params_scale_grad' (factor %g is "
                       "not finite)",
                       factor);
    tg_status st = tg_params_sync_grad(ps);
    if (st) return st;
    for (int i = 0; i < TG__POOL_TRAINABLE; i++)
        scale_pool(&ps->pools[i], factor);
    return TG_OK;
}

double tg_params_grad_norm(tg_params *ps)
{
    if (!ps) {
        tg__err(TG_ERR_NULL, "bad argument #1 to 'params_grad_norm' (NULL)");
        return -1.0;
    }
    if (tg_params_sync_grad(ps)) return -1.0;
    double ss = 0.0;
    for (int i = 0; i < TG__POOL_TRAINABLE; i++) {
        tg__pool *pl = &ps->pools[i];
        if (!pl->grads) continue;
        const void *g = pl->grads->storage->data;
        if (pl->dtype == TG_F32)
            for (int64_t k = 0; k < pl->numel; k++)
                ss += (double)((const float *)g)[k] * ((const float *)g)[k];
        else
            for (int64_t k = 0; k < pl->numel; k++)
                ss += ((const double *)g)[k] * ((const double *)g)[k];
    }
    return sqrt(ss);
}

tg_status tg_params_clip_grad_norm(tg_params *ps, double max_norm, double *total_norm)
{
    if (!ps) return tg__err(TG_ERR_NULL, "bad argument #1 to 'params_clip_grad_norm' (NULL)");
    if (!(max_norm > 0.0) || !isfinite(max_norm))
        return tg__err(TG_ERR_INVALID,
                       "bad argument #2 to 'params_clip_grad_norm' (max_norm %g "
                       "must be positive and finite)",
                       max_norm);
    double total = tg_params_grad_norm(ps);
    if (total < 0.0) return tg_last_error();
    if (total_norm) *total_norm = total;
    if (!isfinite(total))
        return tg__err(TG_ERR_INVALID,
                       "bad argument #1 to 'params_clip_grad_norm' (gradient "
                       "norm is %g; gradients left unchanged)",
                       total);
    double coef = max_norm / (total + 1e-6);
    if (coef < 1.0)
        for (int i = 0; i < TG__POOL_TRAINABLE; i++)
            scale_pool(&ps->pools[i], coef);
    return TG_OK;
}
