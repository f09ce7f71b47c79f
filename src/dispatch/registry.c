/* The op registry: built-ins first (from src/ops/builtins.c), then user
 * ops appended by tg_op_register. Entries are never removed. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch/dispatch.h"

#define MAX_OPS 1024

static const tg_op *ops[MAX_OPS];
static int nops;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

_Atomic bool tg__registry_done;

static void init(void)
{
    tg__backend_init();
    for (int i = 0; tg__builtin_ops[i] && nops < MAX_OPS; i++) ops[nops++] = tg__builtin_ops[i];
    atomic_store_explicit(&tg__registry_done, true, memory_order_release);
}

void tg__registry_init(void)
{
    pthread_once(&once, init);
}

int tg_op_count(void)
{
    tg__registry_init();
    pthread_mutex_lock(&lock);
    int n = nops;
    pthread_mutex_unlock(&lock);
    return n;
}

const tg_op *tg_op_at(int i)
{
    tg__registry_init();
    pthread_mutex_lock(&lock);
    const tg_op *op = (i >= 0 && i < nops) ? ops[i] : NULL;
    pthread_mutex_unlock(&lock);
    if (!op) tg__err(TG_ERR_NOT_FOUND, "bad argument #1 to 'op_at' (index %d outside [0,%d))", i, nops);
    return op;
}

static const tg_op *find_locked(const char *name)
{
    for (int i = 0; i < nops; i++)
        if (strcmp(ops[i]->name, name) == 0) return ops[i];
    return NULL;
}

const tg_op *tg_op_find(const char *name)
{
    if (!name) {
        tg__err(TG_ERR_NULL, "bad argument #1 to 'op_find' (NULL name)");
        return NULL;
    }
    tg__registry_init();
    pthread_mutex_lock(&lock);
    const tg_op *op = find_locked(name);
    pthread_mutex_unlock(&lock);
    if (!op) tg__err(TG_ERR_NOT_FOUND, "no op named '%s' in the registry", name);
    return op;
}

tg_ad_mark tg_op_mark(const tg_op *op)
{
    if (!op) return TG_AD_UNMARKED;
    if (op->backward) return TG_AD_BACKWARD;
    return op->nondifferentiable ? TG_AD_NONDIFFERENTIABLE : TG_AD_UNMARKED;
}

const char *tg_ad_mark_name(tg_ad_mark mark)
{
    switch (mark) {
    case TG_AD_BACKWARD: return "yes";
    case TG_AD_NONDIFFERENTIABLE: return "non-differentiable";
    default: return "unmarked";
    }
}

const char *tg_cost_name(tg_cost_class cost)
{
    return cost == TG_COST_COMPUTE_BOUND ? "compute-bound" : "memory-bound";
}

tg_status tg_op_register(const tg_op *def)
{
    if (!def) return tg__err(TG_ERR_NULL, "bad argument #1 to 'op_register' (NULL definition)");
    if (!def->name || !def->name[0])
        return tg__err(TG_ERR_INVALID, "bad argument #1 to 'op_register' (op has no name)");
    if (def->arity < 1 || def->arity > TG_OP_MAX_INPUTS)
        return tg__err(TG_ERR_INVALID, "bad argument #1 to 'op_register' (op '%s' has arity %d; "
                                       "need 1..%d)", def->name, def->arity, TG_OP_MAX_INPUTS);
    if (!def->shape || !def->forward)
        return tg__err(TG_ERR_INVALID, "bad argument #1 to 'op_register' (op '%s' needs a shape "
                                       "rule and a forward)", def->name);
    if (def->backward && def->nondifferentiable)
        return tg__err(TG_ERR_INVALID, "bad argument #1 to 'op_register' (op '%s' has a backward "
                                       "and is marked non-differentiable)", def->name);
    tg__registry_init();
    tg_op *copy = malloc(sizeof *copy);
    char *name = malloc(strlen(def->name) + 1);
    char *doc = def->doc ? malloc(strlen(def->doc) + 1) : NULL;
    if (!copy || !name || (def->doc && !doc)) {
        free(copy);
        free(name);
        free(doc);
        return tg__err(TG_ERR_NOMEM, "out of memory registering op '%s'", def->name);
    }
    *copy = *def;
    strcpy(name, def->name);
    copy->name = name;
    if (doc) strcpy(doc, def->doc);
    copy->doc = doc;
    tg_status st = TG_OK;
    pthread_mutex_lock(&lock);
    if (find_locked(name))
        st = tg__err(TG_ERR_EXISTS, "bad argument #1 to 'op_register' (an op named '%s' is already "
                                    "registered)", name);
    else if (nops == MAX_OPS)
        st = tg__err(TG_ERR_NOMEM, "op registry is full (%d ops)", MAX_OPS);
    else
        ops[nops++] = copy;
    pthread_mutex_unlock(&lock);
    if (st != TG_OK) {
        free(doc);
        free(name);
        free(copy);
    }
    return st;
}
