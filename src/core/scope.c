/* Per-thread scopes: a stack of owned tensors with one mark per open scope.
 * Ending a scope releases everything above its mark. */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

#define MAX_SCOPES 64

static TG_THREAD_LOCAL tg_tensor **items;
static TG_THREAD_LOCAL size_t nitems, capitems;
static TG_THREAD_LOCAL size_t small_marks[MAX_SCOPES];
/* All marks once the depth passes MAX_SCOPES (freed back at depth 0). */
static TG_THREAD_LOCAL size_t *big_marks;
static TG_THREAD_LOCAL int cap_big;
static TG_THREAD_LOCAL int depth;
static TG_THREAD_LOCAL int overflow; /* scopes opened when the marks could not grow */

static size_t *marks(void)
{
    return big_marks ? big_marks : small_marks;
}

void tg_scope_begin(void)
{
    int cap = big_marks ? cap_big : MAX_SCOPES;
    if (!overflow && depth == cap && tg__thread_register()) {
        size_t *p = realloc(big_marks, (size_t)cap * 2 * sizeof *p);
        if (p) {
            if (!big_marks) memcpy(p, small_marks, sizeof small_marks);
            big_marks = p;
            cap = cap_big = cap * 2;
        }
    }
    if (overflow || depth == cap) {
        overflow++;
        return;
    }
    marks()[depth++] = nitems;
}

int tg_scope_depth(void)
{
    return depth + overflow;
}

tg_status tg_scope_end(void)
{
    if (overflow) {
        overflow--;
        return TG_OK;
    }
    if (depth == 0) return tg__err(TG_ERR_SCOPE, "tg_scope_end without a matching tg_scope_begin");
    size_t mark = marks()[--depth], used = nitems;
    /* Release newest first, so results go before what they were built from. */
    while (nitems > mark) {
        tg_tensor *t = items[--nitems];
        t->scope_owned = false;
        tg_tensor_release(t);
    }
    /* A large list is kept while the outermost scopes fill a quarter of it
     * (a training loop's steps: growing it again each step would map fresh
     * pages, about 2 faults per thousand ops), freed after a smaller one. */
    if (depth == 0 && capitems > 4096 && used < capitems / 4) {
        free(items);
        items = NULL;
        capitems = 0;
    }
    if (depth == 0 && big_marks) {
        free(big_marks);
        big_marks = NULL;
        cap_big = 0;
    }
    return TG_OK;
}

tg_tensor *tg__scope_track(tg_tensor *t)
{
    if (!t || depth == 0) return t;
    if (nitems == capitems) {
        size_t cap = capitems ? capitems * 2 : 256;
        tg_tensor **p = tg__thread_register() ? realloc(items, cap * sizeof *p) : NULL;
        if (!p) {
            /* Cannot own it: fail the call rather than leak silently. */
            tg_tensor_release(t);
            tg__err(TG_ERR_NOMEM, "out of memory growing the scope");
            return NULL;
        }
        items = p;
        capitems = cap;
    }
    items[nitems++] = t;
    t->scope_owned = true;
    return t;
}

tg_tensor *tg_scope_keep(tg_tensor *t)
{
    if (!t || !t->scope_owned || depth == 0) return t;
    size_t mark = marks()[depth - 1];
    for (size_t i = nitems; i > mark; i--) {
        if (items[i - 1] == t) {
            items[i - 1] = items[nitems - 1];
            nitems--;
            t->scope_owned = false;
            return t;
        }
    }
    return t; /* owned by an outer scope: leave it there */
}

void tg__scope_thread_exit(void)
{
    overflow = 0;
    while (depth > 0) tg_scope_end();
    free(items);
    items = NULL;
    nitems = capitems = 0;
    free(big_marks);
    big_marks = NULL;
    cap_big = 0;
}
