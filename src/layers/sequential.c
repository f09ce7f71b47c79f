/* The sequential container (layers.h): modules applied in order, run as
 * the stages of tg_checkpoint_sequential. That runs each stage in a scope
 * of its own and releases each stage's output once the next has run, so a
 * model built from modules holds, beside what its tape saves, one stage's
 * values at a time: the process's peak follows the checkpoint policy
 * without a hand-written lean forward. The container borrows its modules
 * (it never frees them) and holds no tensor. */
#include <stdlib.h>

#include "core/internal.h"

typedef enum {
    MOD_LINEAR,
    MOD_CONV2D,
    MOD_LAYER_NORM,
    MOD_MAP,
    MOD_FLATTEN,
    MOD_STAGE
} mod_kind;

typedef struct {
    mod_kind kind;
    const void *layer;             /* linear, conv2d, layer norm */
    tg_tensor *(*map)(tg_tensor *); /* MOD_MAP */
    tg_segment_fn fn;              /* MOD_STAGE */
    void *userdata;
} module;

struct tg_sequential {
    module *mods;
    int n, cap;
};

tg_sequential *tg_sequential_new(void)
{
    tg_sequential *s = calloc(1, sizeof *s);
    if (!s) tg__err(TG_ERR_NOMEM, "out of memory for a sequential container");
    return s;
}

void tg_sequential_free(tg_sequential *s)
{
    if (!s) return;
    free(s->mods);
    free(s);
}

int tg_sequential_count(const tg_sequential *s)
{
    return s ? s->n : 0;
}

static tg_status push(tg_sequential *s, const char *who, module m, bool have)
{
    if (!s) return tg__err(TG_ERR_NULL, "bad argument #1 to '%s' (NULL container)", who);
    if (!have) return tg__err(TG_ERR_NULL, "bad argument #2 to '%s' (NULL module)", who);
    if (s->n == s->cap) {
        if (s->cap >= (1 << 24))
            return tg__err(TG_ERR_INVALID, "'%s': a container holds at most %d modules", who,
                           1 << 24);
        int cap = s->cap ? 2 * s->cap : 8;
        module *p = realloc(s->mods, (size_t)cap * sizeof *p);
        if (!p) return tg__err(TG_ERR_NOMEM, "out of memory growing a sequential container");
        s->mods = p;
        s->cap = cap;
    }
    s->mods[s->n++] = m;
    return TG_OK;
}

tg_status tg_sequential_add_linear(tg_sequential *s, const tg_linear *l)
{
    return push(s, "sequential_add_linear", (module){.kind = MOD_LINEAR, .layer = l}, l != NULL);
}

tg_status tg_sequential_add_conv2d(tg_sequential *s, const tg_conv2d_layer *l)
{
    return push(s, "sequential_add_conv2d", (module){.kind = MOD_CONV2D, .layer = l}, l != NULL);
}

tg_status tg_sequential_add_layer_norm(tg_sequential *s, const tg_layer_norm_layer *l)
{
    return push(s, "sequential_add_layer_norm", (module){.kind = MOD_LAYER_NORM, .layer = l},
                l != NULL);
}

tg_status tg_sequential_add_map(tg_sequential *s, tg_tensor *(*f)(tg_tensor *x))
{
    return push(s, "sequential_add_map", (module){.kind = MOD_MAP, .map = f}, f != NULL);
}

tg_status tg_sequential_add_flatten(tg_sequential *s)
{
    return push(s, "sequential_add_flatten", (module){.kind = MOD_FLATTEN}, true);
}

tg_status tg_sequential_add_stage(tg_sequential *s, tg_segment_fn fn, void *userdata)
{
    return push(s, "sequential_add_stage",
                (module){.kind = MOD_STAGE, .fn = fn, .userdata = userdata}, fn != NULL);
}

/* (N, d1, d2, ...) -> (N, d1 * d2 * ...): a view where x is contiguous. */
static tg_tensor *flatten(tg_tensor *x)
{
    int nd = tg_tensor_ndim(x);
    if (nd < 1) {
        tg__err(TG_ERR_SHAPE, "bad argument #1 to 'flatten' (a scalar; need a batch dimension)");
        return NULL;
    }
    int64_t n = tg_tensor_shape(x)[0];
    int64_t shape[2] = {n, n ? tg_tensor_numel(x) / n : 0};
    return tg_reshape(x, 2, shape);
}

/* Whether module i is a conv2d layer and module i + 1 the map tg_relu: the
 * pair then runs as one conv2d_relu op, in module i's stage, and module
 * i + 1's stage passes its input on (the same values and gradients, bit
 * for bit, and one pass over the output and one tensor fewer). */
static bool conv_relu_pair(const tg_sequential *s, int i)
{
    return i >= 0 && i + 1 < s->n && s->mods[i].kind == MOD_CONV2D &&
           s->mods[i + 1].kind == MOD_MAP && s->mods[i + 1].map == tg_relu;
}

/* Stage `layer` of the container: the module's forward. */
static tg_tensor *run_module(void *ud, int layer, tg_tensor *x)
{
    const tg_sequential *s = ud;
    const module *m = &s->mods[layer];
    switch (m->kind) {
    case MOD_LINEAR:
        return tg_linear_forward(m->layer, x);
    case MOD_CONV2D:
        if (conv_relu_pair(s, layer)) return tg_conv2d_layer_forward_relu(m->layer, x);
        return tg_conv2d_layer_forward(m->layer, x);
    case MOD_LAYER_NORM:
        return tg_layer_norm_layer_forward(m->layer, x);
    case MOD_MAP:
        if (conv_relu_pair(s, layer - 1)) return x; /* rectified by the conv's stage */
        return m->map(x);
    case MOD_FLATTEN:
        return flatten(x);
    case MOD_STAGE:
        return m->fn(m->userdata, layer, x);
    }
    tg__err(TG_ERR_INTERNAL, "sequential module %d of an unknown kind", layer);
    return NULL;
}

tg_tensor *tg_sequential_forward(const tg_sequential *s, tg_tape *tape, int nsegments,
                                 tg_tensor *x)
{
    static const char *who = "sequential_forward";
    if (!s) {
        tg__err(TG_ERR_NULL, "bad argument #1 to '%s' (NULL container)", who);
        return NULL;
    }
    if (!x) {
        tg__err(TG_ERR_NULL, "bad argument #4 to '%s' (NULL input)", who);
        return NULL;
    }
    if (!tape && nsegments != 1) {
        tg__err(TG_ERR_NULL, "bad argument #2 to '%s' (NULL tape; segments need one: pass "
                             "nsegments 1 for none)", who);
        return NULL;
    }
    /* The container is the stages' userdata; backward re-runs a segment's
     * stages through it, so it must outlive the tape's backward. */
    return tg_checkpoint_sequential(tape, s->n, nsegments, run_module, (void *)s, x);
}
