/* Elementwise kernels split across threads, in step with OpenBLAS: the
 * pool (core/pool.c) has as many threads (the caller included) as OpenBLAS
 * uses, and a job runs only between BLAS calls (dispatch is synchronous),
 * so the two never compete for the cores. Kernels stay single-threaded
 * functions; this file cuts their index range into parts. Small jobs run
 * inline. */
#include <stdlib.h>
#include <string.h>

#include "backend/parallel.h"
#include "core/pool.h"

/* Below this many bytes per part a split costs more than it saves, for
 * every kernel alike. On the 2-core VM this was tuned on (a chain of
 * tanh, sigmoid, products and sums, forward and backward, from 16 KiB to
 * 16 MiB a tensor), a second thread broke even at 256 KiB and ran
 * 0.6-0.7x of one thread's time from 512 KiB up. One size for all matters
 * as much as the size: when tanh was split from 256 KiB but products only
 * from 8 MiB, the product after a split tanh read half its operand from
 * the other core's cache, and the chain at 256 KiB ran 1.4x slower on two
 * threads. The pointwise regions of the backward (tape/region.c) split by
 * the same measure (tg__split_parts). */
#define MIN_PART_BYTES ((size_t)256 << 10)
/* Unless the workers are awake (a job came in the last 100 us), a job
 * must be this large to be split: waking a sleeping worker cost the
 * caller ~17 us and the worker 35-75 us before it started, so a split
 * of 2.7 MB of relu after a GEMM ran 3x slower than one thread. A run
 * of ops from this size wakes them, and they stay awake for the smaller
 * ops that follow. */
#define WAKE_MIN_BYTES ((size_t)4 << 20)

int tg_num_threads(void)
{
    tg__backend_init(); /* sets the pool's default size */
    return tg__pool_size();
}

tg_status tg_set_num_threads(int n)
{
    if (n < 1 || n > TG_POOL_MAX_THREADS)
        return tg__err(TG_ERR_INVALID, "bad argument #1 to 'set_num_threads' (%d; need 1..%d)", n,
                       TG_POOL_MAX_THREADS);
    tg__pool_set_size(n);
    tg__blas_set_threads(n);
    return TG_OK;
}

int tg__split_parts(size_t bytes)
{
    if (bytes < 2 * MIN_PART_BYTES || (bytes < WAKE_MIN_BYTES && !tg__pool_awake())) return 1;
    size_t p = bytes / MIN_PART_BYTES;
    return p > TG_POOL_MAX_THREADS ? TG_POOL_MAX_THREADS : (int)p;
}

/* The common case, a small call, decided here without a call. */
static inline int parts_for(int64_t n, size_t es)
{
    size_t bytes = (size_t)n * es;
    return bytes < 2 * MIN_PART_BYTES ? 1 : tg__split_parts(bytes);
}

static void range(int64_t n, int part, int nparts, int64_t *lo, int64_t *len)
{
    /* Parts start on 16-element boundaries so vector loops stay aligned. */
    int64_t chunk = ((n + nparts - 1) / nparts + 15) & ~(int64_t)15;
    *lo = chunk * part;
    if (*lo > n) *lo = n;
    *len = (*lo + chunk > n ? n : *lo + chunk) - *lo;
}

typedef struct {
    tg_unary_fn uf;
    tg_grad_fn gf;
    tg_binary_fn bf;
    tg_unary2_fn uf2;
    tg_grad2_fn gf2;
    tg_gradgrad_fn ggf;
    const tg_bcast *bc;
    int64_t n;
    const char *a, *b, *c;
    char *out;
    double p, q;
    size_t es;
} job_args;

static void unary_part(void *ctx, int part, int nparts)
{
    job_args *j = ctx;
    int64_t lo, len;
    range(j->n, part, nparts, &lo, &len);
    if (len && j->uf) j->uf(len, j->a + lo * j->es, j->out + lo * j->es, j->p);
    if (len && j->uf2) j->uf2(len, j->a + lo * j->es, j->out + lo * j->es, j->p, j->q);
}

static void grad_part(void *ctx, int part, int nparts)
{
    job_args *j = ctx;
    int64_t lo, len;
    range(j->n, part, nparts, &lo, &len);
    if (len && j->gf) j->gf(len, j->a + lo * j->es, j->b + lo * j->es, j->out + lo * j->es, j->p);
    if (len && j->gf2)
        j->gf2(len, j->a + lo * j->es, j->b + lo * j->es, j->out + lo * j->es, j->p, j->q);
}

static void gradgrad_part(void *ctx, int part, int nparts)
{
    job_args *j = ctx;
    int64_t lo, len;
    range(j->n, part, nparts, &lo, &len);
    if (len)
        j->ggf(len, j->a + lo * j->es, j->b + lo * j->es, j->c + lo * j->es,
               j->out + lo * j->es, j->p);
}

/* Same-shape or scalar-b binaries split by index; row broadcasts by whole
 * rows (the part keeps b's row, or a's). */
static void binary_part(void *ctx, int part, int nparts)
{
    job_args *j = ctx;
    const tg_bcast *bc = j->bc;
    int64_t row = bc->b_row ? bc->b_row : (bc->a_row ? bc->a_row : 1);
    int64_t rows = bc->n / row, lo, len;
    range(rows, part, nparts, &lo, &len);
    if (!len) return;
    /* The part as its own broadcast: (len, row) with the row repeated. */
    tg_bcast sub = *bc;
    sub.n = len * row;
    sub.ndim = 2;
    sub.shape[0] = len;
    sub.shape[1] = row;
    sub.sa[0] = bc->a_row ? 0 : row;
    sub.sb[0] = (bc->b_row || bc->b_scalar) ? 0 : row;
    sub.sa[1] = 1;
    sub.sb[1] = bc->b_scalar ? 0 : 1;
    const char *a = j->a, *b = j->b;
    if (!bc->a_row) a += lo * row * j->es;
    if (!bc->b_row && !bc->b_scalar) b += lo * row * j->es;
    j->bf(&sub, a, b, j->out + lo * row * j->es);
}

void tg__run_unary(tg_unary_fn f, int64_t n, const void *x, void *y, double p, size_t es)
{
    int parts = parts_for(n, es);
    if (parts == 1) {
        f(n, x, y, p);
        return;
    }
    job_args j = {.uf = f, .n = n, .a = x, .out = y, .p = p, .es = es};
    tg__pool_run(unary_part, &j, parts);
}

void tg__run_grad(tg_grad_fn f, int64_t n, const void *s, const void *gy, void *gx, double p,
                  size_t es)
{
    int parts = parts_for(n, es);
    if (parts == 1) {
        f(n, s, gy, gx, p);
        return;
    }
    job_args j = {.gf = f, .n = n, .a = s, .b = gy, .out = gx, .p = p, .es = es};
    tg__pool_run(grad_part, &j, parts);
}

void tg__run_unary2(tg_unary2_fn f, int64_t n, const void *x, void *y, double p, double q,
                    size_t es)
{
    int parts = parts_for(n, es);
    if (parts == 1) {
        f(n, x, y, p, q);
        return;
    }
    job_args j = {.uf2 = f, .n = n, .a = x, .out = y, .p = p, .q = q, .es = es};
    tg__pool_run(unary_part, &j, parts);
}

void tg__run_grad2(tg_grad2_fn f, int64_t n, const void *s, const void *gy, void *gx, double p,
                   double q, size_t es)
{
    int parts = parts_for(n, es);
    if (parts == 1) {
        f(n, s, gy, gx, p, q);
        return;
    }
    job_args j = {.gf2 = f, .n = n, .a = s, .b = gy, .out = gx, .p = p, .q = q, .es = es};
    tg__pool_run(grad_part, &j, parts);
}

void tg__run_gradgrad(tg_gradgrad_fn f, int64_t n, const void *s, const void *gy, const void *gg,
                      void *gs, double p, size_t es)
{
    int parts = parts_for(n, es);
    if (parts == 1) {
        f(n, s, gy, gg, gs, p);
        return;
    }
    job_args j = {.ggf = f, .n = n, .a = s, .b = gy, .c = gg, .out = gs, .p = p, .es = es};
    tg__pool_run(gradgrad_part, &j, parts);
}

void tg__run_binary(tg_binary_fn f, const tg_bcast *bc, const void *a, const void *b, void *out,
                    size_t es)
{
    bool splittable = bc->same || bc->b_scalar || bc->a_row || bc->b_row;
    int parts = splittable ? parts_for(bc->n, es) : 1;
    if (parts == 1) {
        f(bc, a, b, out);
        return;
    }
    job_args j = {.bf = f, .bc = bc, .a = a, .b = b, .out = out, .es = es};
    tg__pool_run(binary_part, &j, parts);
}

/* ---- the broadcast description of a binary kernel call */
static bool row_of(const tg_spec *out, const tg_tensor *r)
{
    int lead = out->ndim - r->ndim;
    int d = 0;
    while (d < r->ndim && r->shape[d] == 1 && out->shape[lead + d] != 1) d++;
    for (; d < r->ndim; d++)
        if (r->shape[d] != out->shape[lead + d]) return false;
    return r->numel > 0;
}

void tg__bcast_desc(const tg_spec *out, const tg_tensor *a, const tg_tensor *b, tg_bcast *bc)
{
    int nd = out->ndim;
    bc->ndim = nd;
    bc->n = tg__numel(nd, out->shape);
    memcpy(bc->shape, out->shape, sizeof bc->shape);
    int64_t ca[TG_MAX_DIMS], cb[TG_MAX_DIMS];
    tg__contig_strides(a->ndim, a->shape, ca);
    tg__contig_strides(b->ndim, b->shape, cb);
    for (int i = 0; i < nd; i++) {
        int ia = a->ndim - nd + i, ib = b->ndim - nd + i;
        bc->sa[i] = (ia >= 0 && a->shape[ia] != 1) ? ca[ia] : 0;
        bc->sb[i] = (ib >= 0 && b->shape[ib] != 1) ? cb[ib] : 0;
    }
    bc->same = a->numel == bc->n && b->numel == bc->n;
    bc->b_scalar = a->numel == bc->n && b->numel == 1;
    bc->a_row = bc->b_row = 0;
    if (!bc->same && a->numel == bc->n && row_of(out, b)) bc->b_row = b->numel;
    if (!bc->same && b->numel == bc->n && row_of(out, a)) bc->a_row = a->numel;
}

void tg__binary_kernel(tg_kernel_id kid, const tg_spec *out_spec, const tg_tensor *a,
                       const tg_tensor *b, void *out)
{
    tg_bcast bc;
    tg__bcast_desc(out_spec, a, b, &bc);
    tg__run_binary((tg_binary_fn)tg__kernel(kid, a->backend, a->dtype), &bc, tg__tensor_ptr(a),
                   tg__tensor_ptr(b), out, tg__esize(a->dtype));
}

void tg__add_into(tg_tensor *dst, const tg_tensor *src)
{
    tg_spec sp;
    tg__spec_of(dst, &sp);
    tg__binary_kernel(TG_K_ADD, &sp, dst, src, tg__tensor_ptr(dst));
}

/* ---- the f32 sum of a whole row on the cpu backend, split: the exact
 * pass (cpu/reduce.c) summed in parts and merged, so the bits are the
 * chain's; where the row cannot be shown exact, the kernel (one thread). */
typedef struct sum_job {
    const float *x;
    int64_t n;
    int nparts; /* as the pool ran it */
    tg__exact_sum part[TG_POOL_MAX_THREADS];
    bool ok[TG_POOL_MAX_THREADS];
} sum_job;

static void sum_part(void *ctx, int part, int nparts)
{
    sum_job *j = ctx;
    int64_t lo, len;
    range(j->n, part, nparts, &lo, &len);
    if (part == 0) j->nparts = nparts;
    tg__exact_sum_init(&j->part[part]);
    j->ok[part] = tg__exact_sum_add(&j->part[part], j->x + lo, len, j->n);
}

void tg__run_sum(const tg_reduce *r, const tg_tensor *x, void *y)
{
    tg_reduce_fn k = (tg_reduce_fn)tg__kernel(TG_K_REDUCE_SUM, x->backend, x->dtype);
    int64_t n = x->numel;
    int parts = x->backend == TG_BACKEND_CPU && x->dtype == TG_F32 ? parts_for(n, 4) : 1;
    bool whole = true; /* every dim reduced: one row */
    for (int d = 0; d < r->ndim; d++) whole = whole && (r->reduce[d] || r->shape[d] == 1);
    if (parts == 1 || !whole) {
        k(r, tg__tensor_ptr(x), y);
        return;
    }
    sum_job *j = malloc(sizeof *j);
    bool ok = j != NULL;
    if (ok) {
        j->x = tg__tensor_ptr(x);
        j->n = n;
        tg__pool_run(sum_part, j, parts);
        double v;
        ok = tg__exact_sum_parts(j->part, j->ok, j->nparts, n, &v);
        if (ok) *(float *)y = (float)v;
    }
    free(j);
    if (!ok) k(r, tg__tensor_ptr(x), y);
}

void tg__run_sum_all(const tg_tensor *x, void *y)
{
    tg_reduce r = {.ndim = x->ndim};
    memcpy(r.shape, x->shape, sizeof r.shape);
    for (int d = 0; d < x->ndim; d++) r.reduce[d] = true;
    tg__run_sum(&r, x, y);
}
