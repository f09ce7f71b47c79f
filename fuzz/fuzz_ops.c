/* libFuzzer target: random op programs through the public API. The bytes
 * are a program over eight tensor slots: three leaves (f64, f32 or i64,
 * up to 3 dims of up to 4, small values; the floating ones tracked on a
 * tape), then instructions that call a registered op (tg_op_call, any op
 * of the registry, on slots and attributes from the bytes) or one of the
 * named wrappers (transpose, reshape, concat, cast, to_device, ...), each
 * result going to a slot, or that opens or closes a checkpoint segment
 * (nested as the bytes say; the tape's policy, NONE, BALANCED or a small
 * BUDGET, is drawn from the first byte). At the end: backward from the sum
 * of the last tracked slot, with the tape reset and everything released.
 * Every call must return a result or a status; no tensor memory may be
 * left. */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <tapegrad.h>

#include "fuzz_util.h"

typedef struct {
    const unsigned char *p;
    size_t n;
} bytes;

static unsigned next(bytes *b)
{
    if (b->n == 0) return 0;
    b->n--;
    return *b->p++;
}

/* A small integer in [lo, lo + span). */
static int64_t small(bytes *b, int64_t lo, int span)
{
    return lo + (int64_t)(next(b) % (unsigned)span);
}

static tg_tensor *leaf(bytes *b)
{
    static const tg_dtype dts[3] = {TG_F64, TG_F32, TG_I64};
    tg_dtype dt = dts[next(b) % 3];
    int ndim = (int)small(b, 0, 4);
    int64_t shape[3] = {0};
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        shape[d] = small(b, 0, 5);
        numel *= shape[d];
    }
    double v[64];
    for (int64_t i = 0; i < numel; i++) v[i] = (double)((int)next(b) - 128) / 16.0;
    tg_tensor *t = tg_zeros(dt, ndim, shape);
    for (int64_t i = 0; t && i < numel; i++) {
        unsigned char buf[8];
        if (dt == TG_F64) memcpy(buf, &v[i], 8);
        else if (dt == TG_F32) {
            float f = (float)v[i];
            memcpy(buf, &f, 4);
        } else {
            int64_t k = (int64_t)v[i];
            memcpy(buf, &k, 8);
        }
        memcpy((unsigned char *)tg_tensor_data(t) + (size_t)i * tg_dtype_size(dt), buf,
               tg_dtype_size(dt));
    }
    return t;
}

static tg_tensor *named(bytes *b, unsigned what, tg_tensor **s)
{
    tg_tensor *x = s[next(b) % 8], *y = s[next(b) % 8];
    int d0 = (int)small(b, -3, 7), d1 = (int)small(b, -3, 7);
    switch (what % 10) {
    case 0: return tg_transpose(x, d0, d1);
    case 1: {
        int64_t shape[3] = {small(b, -1, 6), small(b, -1, 6), small(b, -1, 6)};
        return tg_reshape(x, (int)small(b, 0, 4), shape);
    }
    case 2: {
        tg_tensor *xs[2] = {x, y};
        return tg_concat((int)small(b, 0, 3), xs, d0);
    }
    case 3: return tg_cast(x, (tg_dtype)small(b, 0, 4));
    case 4: return tg_to_device(x, (tg_backend)small(b, 0, 3));
    case 5: return tg_sum_dims(x, (int)small(b, 0, 3), (int[]){d0, d1}, next(b) & 1);
    case 6: return tg_mean_dims(x, (int)small(b, 0, 3), (int[]){d0, d1}, next(b) & 1);
    case 7: return tg_detach(x);
    case 8: return tg_contiguous(x);
    default: return tg_matmul(x, y);
    }
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    bytes b = {data, size};
    size_t base = tg_mem_current_bytes();
    unsigned first = next(&b);
    tg_backend prev = tg_set_default_backend((tg_backend)(first & 1));
    static const tg_checkpoint_policy pol[4] = {TG_CHECKPOINT_NONE, TG_CHECKPOINT_NONE,
                                                TG_CHECKPOINT_BALANCED, TG_CHECKPOINT_BUDGET};
    tg_tape_opts to = {.policy = pol[(first >> 1) & 3], .budget_bytes = 64u << ((first >> 3) & 7)};
    tg_tape *tape = tg_tape_new(&to);
    if (!tape) abort();
    int depth = 0;
    tg_tensor *s[8] = {0};
    for (int i = 0; i < 3; i++) {
        s[i] = leaf(&b);
        if (s[i] && tg_tensor_dtype(s[i]) != TG_I64) tg_requires_grad(tape, s[i]);
    }
    int nops = tg_op_count();
    for (int step = 0; step < 32 && b.n > 0; step++) {
        unsigned op = next(&b);
        tg_tensor *r;
        if (op >= 248) { /* segments: begin (248-251) or end (252-255) */
            tg_status st = op < 252 ? tg_checkpoint_begin(tape) : tg_checkpoint_end(tape);
            FUZZ_CHECK(st == (op < 252 || depth > 0 ? TG_OK : TG_ERR_INVALID),
                       "checkpoint %s at depth %d: status %d", op < 252 ? "begin" : "end", depth,
                       (int)st);
            depth += st ? 0 : op < 252 ? 1 : -1;
            tg_error_clear();
            continue;
        }
        if (op < 200) {
            const tg_op *def = tg_op_at((int)(op % (unsigned)nops));
            tg_tensor *in[TG_OP_MAX_INPUTS];
            for (int k = 0; k < TG_OP_MAX_INPUTS; k++) in[k] = s[next(&b) % 8];
            tg_op_attrs a = {.scalar = (double)((int)next(&b) - 128) / 8.0,
                             .nints = (int)small(&b, 0, 4), .flag = (int)(next(&b) & 1),
                             .target = (int)small(&b, 0, 3)};
            for (int k = 0; k < a.nints; k++) a.ints[k] = small(&b, -2, 7);
            r = tg_op_call(def, def ? def->arity : 1, in, &a);
        } else {
            r = named(&b, op, s);
        }
        if (!r) {
            FUZZ_CHECK(tg_last_error() != TG_OK, "NULL result with no error");
            tg_error_clear();
            continue;
        }
        int slot = 3 + (int)(next(&b) % 5);
        tg_tensor_release(s[slot]);
        s[slot] = r;
    }
    for (int i = 7; i >= 0; i--) {
        if (!s[i] || !tg_tensor_requires_grad(s[i])) continue;
        tg_tensor *l = tg_sum(s[i]);
        if (l) tg_backward(l);
        tg_tensor_release(l);
        break;
    }
    tg_error_clear();
    for (int i = 0; i < 8; i++) tg_tensor_release(s[i]);
    tg_tape_free(tape);
    tg_set_default_backend(prev);
    FUZZ_CHECK(tg_mem_current_bytes() == base, "tensor memory grew by %zu bytes",
               tg_mem_current_bytes() - base);
    return 0;
}
