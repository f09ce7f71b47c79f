/* Per-thread scopes: a stack of owned tensors with one mark per open scope.
 * Ending a scope releases everything above its mark. */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

#define MAX_SCOPES TG__MAX_SCOPES
#define S tg__S /* the calling thread's scopes (core/internal.h) */

TG_THREAD_LOCAL tg__scopes tg__S;

static size_t *marks(void)
{
    if (!S.marks) { /* first use on this thread */
        S.marks = S.small_marks;
        S.cap = MAX_SCOPES;
    }
    return S.marks;
}

void tg_scope_begin(void)
{
    size_t *m = marks();
    if (!S.overflow && S.depth == S.cap && tg__thread_register()) {
        size_t *p = realloc(S.big_marks, (size_t)S.cap * 2 * sizeof *p);
        if (p) {
            if (!S.big_marks) memcpy(p, S.small_marks, sizeof S.small_marks);
            S.marks = S.big_marks = m = p;
            S.cap *= 2;
        }
    }
    if (S.overflow || S.depth == S.cap) {
        S.overflow++;
        return;
    }
    m[S.depth++] = S.nitems;
}

int tg_scope_depth(void)
{
    return S.depth + S.overflow;
}

/* Items from which a scope's end prefetches the headers it releases. */
#define TG__SCOPE_PREFETCH_FROM 4096

/* A long list (a tape of 10^5 ops and more) outgrows the caches: releases
 * down to mark + 8 with the headers 8 releases ahead fetched while this
 * one is freed (the lines release reads: the count, the flags and
 * pointers, the embedded storage). Out of line: a short scope (every
 * node's backward runs in one) pays one compare. */
static __attribute__((noinline, cold)) void release_far(size_t mark)
{
    while (S.nitems > mark + 8) {
        const char *h = (const char *)S.items[S.nitems - 9];
        __builtin_prefetch(h, 1);
        __builtin_prefetch(h + 128, 1);
        __builtin_prefetch(h + 192, 1);
        __builtin_prefetch(h + 256, 1);
        tg_tensor *t = S.items[--S.nitems];
        t->scope_owned = false;
        tg_tensor_release(t);
    }
}

tg_status tg_scope_end(void)
{
    if (S.overflow) {
        S.overflow--;
        return TG_OK;
    }
    if (S.depth == 0)
        return tg__err(TG_ERR_SCOPE, "tg_scope_end without a matching tg_scope_begin");
    size_t mark = S.marks[--S.depth], used = S.nitems;
    if (__builtin_expect(used - mark > TG__SCOPE_PREFETCH_FROM, 0)) release_far(mark);
    tg__scope_release_to(&S, mark);
    if (S.depth == 0) {
        /* A large list is kept while the outermost scopes fill a quarter
         * of it (a training loop's steps: growing it again each step would
         * map fresh pages, about 2 faults per thousand ops), freed after a
         * smaller one. */
        if (S.capitems > TG__SCOPE_KEEP_ITEMS && used < S.capitems / 4) {
            free(S.items);
            S.items = NULL;
            S.capitems = 0;
        }
        if (S.big_marks) {
            free(S.big_marks);
            S.big_marks = NULL;
            S.marks = S.small_marks;
            S.cap = MAX_SCOPES;
        }
    }
    return TG_OK;
}

tg_tensor *tg__scope_track_grow(tg_tensor *t)
{
    size_t cap = S.capitems ? S.capitems * 2 : 256;
    tg_tensor **p = tg__thread_register() ? realloc(S.items, cap * sizeof *p) : NULL;
    if (!p) {
        /* Cannot own it: fail the call rather than leak silently. */
        tg_tensor_release(t);
        tg__err(TG_ERR_NOMEM, "out of memory growing the scope");
        return NULL;
    }
    S.items = p;
    S.capitems = cap;
    S.items[S.nitems++] = t;
    t->scope_owned = true;
    return t;
}

tg_tensor *tg_scope_keep(tg_tensor *t)
{
    if (!t || !t->scope_owned || S.depth == 0) return t;
    size_t mark = S.marks[S.depth - 1];
    for (size_t i = S.nitems; i > mark; i--) {
        if (S.items[i - 1] == t) {
            S.items[i - 1] = S.items[S.nitems - 1];
            S.nitems--;
            t->scope_owned = false;
            return t;
        }
    }
    return t; /* owned by an outer scope: leave it there */
}

void tg__scope_thread_exit(void)
{
    S.overflow = 0;
    while (S.depth > 0) tg_scope_end();
    free(S.items);
    S.items = NULL;
    S.nitems = S.capitems = 0;
    free(S.big_marks);
    S.big_marks = NULL;
    S.marks = S.small_marks;
    S.cap = MAX_SCOPES;
}
