/* bench_fingerprint: hashes of what the library computes, for proving that
 * a refactor changed nothing. Build it in the old and the new tree, run
 * both, and diff the output: every line must match.
 *
 *   op <name> <backend> <dtype> <case>  forward output, then the gradient of
 *                                        sum(w * out) for each floating input
 *   wl <workload> <policy>               the loss and every parameter's
 *                                        gradient after one forward + backward
 *   total                                all of the above in one hash
 *
 * Ops are taken from the registry and their gradcheck cases (.sample), run
 * on both backends in f64 and in f32 (inputs cast after the case is made).
 * Workloads are the benchmark suite's (bench.h), under NONE, BALANCED,
 * BUDGET (half of NONE's saved peak), segments and, for the sequential
 * workloads, binomial segments (3 slots). Hashes are FNV-1a over
 * the bytes of each tensor, row-major, so a single differing bit shows.
 * Uses the public API and bench.h only, so the same file builds against
 * any version that has them. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static uint64_t total = 14695981039346656037ull;

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

static size_t elem_size(tg_dtype d)
{
    return d == TG_F32 ? 4 : 8;
}

/* Hash of t's elements (0 for NULL). */
static uint64_t hash_tensor(const tg_tensor *t)
{
    if (!t) return 0;
    size_t n = (size_t)tg_tensor_numel(t) * elem_size(tg_tensor_dtype(t));
    void *buf = malloc(n ? n : 1);
    if (!buf) return 1;
    uint64_t h = 14695981039346656037ull;
    if (tg_tensor_copy_out(t, buf, n) == TG_OK) h = fnv(h, buf, n);
    else h = 2;
    free(buf);
    int nd = tg_tensor_ndim(t);
    return fnv(h, tg_tensor_shape(t), sizeof(int64_t) * (size_t)nd);
}

static void emit(const char *what, const uint64_t *h, int n)
{
    printf("%s", what);
    for (int i = 0; i < n; i++) {
        printf(" %016" PRIx64, h[i]);
        total = fnv(total, &h[i], sizeof h[i]);
    }
    printf("\n");
}

static bool is_float(const tg_tensor *t)
{
    tg_dtype d = tg_tensor_dtype(t);
    return d == TG_F32 || d == TG_F64;
}

/* One case of op on backend in dtype: forward, then backward of
 * sum(w * out) when the op has a backward and an input is floating. */
static int op_case(const tg_op *op, int k, tg_backend be, tg_dtype dt)
{
    tg_rng rng;
    tg_rng_seed(&rng, 1234 + (uint64_t)k);
    tg_op_attrs attrs;
    memset(&attrs, 0, sizeof attrs);
    tg_tensor *raw[TG_OP_MAX_INPUTS] = {0}, *in[TG_OP_MAX_INPUTS] = {0};
    char what[160];
    snprintf(what, sizeof what, "op %s %s %s %d", op->name, be == TG_BACKEND_REF ? "ref" : "cpu",
             dt == TG_F32 ? "f32" : "f64", k);
    tg_scope_begin();
    int n = op->sample(k, &rng, raw, &attrs);
    uint64_t h[1 + TG_OP_MAX_INPUTS] = {0};
    int nh = 1;
    tg_tape *tape = NULL;
    if (n <= 0) {
        tg_scope_end();
        return n;
    }
    bool diff = op->backward != NULL, any = false;
    for (int i = 0; i < n; i++) {
        tg_tensor *x = tg_to_device(raw[i], be);
        if (x && is_float(x) && dt == TG_F32) x = tg_cast(x, TG_F32);
        in[i] = x ? tg_contiguous(x) : NULL;
        if (!in[i]) {
            h[0] = 3;
            goto done;
        }
        if (diff && is_float(in[i])) any = true;
    }
    if (diff && any) {
        tape = tg_tape_new(NULL);
        for (int i = 0; i < n; i++)
            if (is_float(in[i])) {
                /* a leaf of its own: the case's tensor may be shared */
                tg_tensor *c = tg_contiguous(tg_mul_scalar(in[i], 1.0));
                if (!c || tg_requires_grad(tape, c) != TG_OK) {
                    h[0] = 4;
                    goto done;
                }
                in[i] = c;
            }
    }
    tg_tensor *out = tg_op_call(op, n, in, &attrs);
    if (!out) {
        h[0] = 5;
        goto done;
    }
    h[0] = hash_tensor(out);
    if (tape && tg_tensor_requires_grad(out) && is_float(out)) {
        tg_rng wr;
        tg_rng_seed(&wr, 99);
        tg_tensor *w = tg_rand_normal(&wr, tg_tensor_dtype(out), tg_tensor_ndim(out),
                                      tg_tensor_shape(out), 0.0, 1.0);
        tg_tensor *seed = w ? tg_to_device(w, tg_tensor_backend(out)) : NULL;
        if (!seed || tg_backward_seed(out, seed) != TG_OK) {
            h[0] = 6;
            goto done;
        }
        for (int i = 0; i < n; i++) h[nh++] = is_float(in[i]) ? hash_tensor(tg_grad(in[i])) : 0;
    }
done:
    if (h[0] >= 3 && h[0] <= 6) printf("# %s: %s\n", what, tg_last_error_message());
    emit(what, h, nh);
    tg_scope_end();
    tg_tape_free(tape);
    return n;
}

static void ops(void)
{
    int count = tg_op_count();
    for (int i = 0; i < count; i++) {
        const tg_op *op = tg_op_at(i);
        if (!op->sample) continue;
        const tg_backend bes[2] = {TG_BACKEND_REF, TG_BACKEND_CPU};
        const tg_dtype dts[2] = {TG_F64, TG_F32};
        for (int k = 0; k < 64; k++) {
            if (op_case(op, k, bes[0], dts[0]) <= 0) break;
            op_case(op, k, bes[0], dts[1]);
            for (int d = 0; d < 2; d++) op_case(op, k, bes[1], dts[d]);
        }
    }
}

/* One forward + backward of wl under a policy; returns the saved peak. */
static size_t wl_run(const bench_workload *wl, const char *pname, tg_checkpoint_policy policy,
                     size_t budget, int segments)
{
    char err[256] = "", what[128];
    snprintf(what, sizeof what, "wl %s %s", wl->name, pname);
    void *st = wl->setup(err, sizeof err);
    if (!st) {
        printf("%s setup failed: %s\n", what, err);
        return 0;
    }
    tg_tape_opts to = {.policy = policy, .budget_bytes = budget};
    tg_tape *tape = tg_tape_new(&to);
    tg_params *ps = wl->params(st);
    tg_params_requires_grad(ps, tape);
    uint64_t h[64] = {0};
    int nh = 1;
    tg_scope_begin();
    tg_tensor *loss = wl->forward(st, tape, segments);
    size_t peak = 0;
    if (loss && tg_backward(loss) == TG_OK) {
        h[0] = hash_tensor(loss);
        for (int i = 0; i < tg_params_count(ps) && nh < 64; i++)
            h[nh++] = hash_tensor(tg_grad(tg_params_at(ps, i)));
        peak = tg_tape_saved_peak_bytes(tape);
    } else {
        h[0] = 7;
        printf("# %s: %s\n", what, tg_last_error_message());
    }
    tg_scope_end();
    emit(what, h, nh);
    tg_tape_free(tape);
    wl->teardown(st);
    return peak;
}

static void workloads(void)
{
    for (int i = 0; bench_workloads[i]; i++) {
        const bench_workload *wl = bench_workloads[i];
        size_t peak = wl_run(wl, "none", TG_CHECKPOINT_NONE, 0, BENCH_SEG_NONE);
        wl_run(wl, "balanced", TG_CHECKPOINT_BALANCED, 0, BENCH_SEG_NONE);
        wl_run(wl, "budget", TG_CHECKPOINT_BUDGET, peak / 2, BENCH_SEG_NONE);
        wl_run(wl, "segments", TG_CHECKPOINT_NONE, 0, BENCH_SEG_SQRT);
        if (wl->sequential) wl_run(wl, "binomial", TG_CHECKPOINT_NONE, 0, BENCH_SEG_BINOMIAL);
    }
}

int main(int argc, char **argv)
{
    bool do_ops = true, do_wl = true;
    if (argc > 1 && strcmp(argv[1], "ops") == 0) do_wl = false;
    if (argc > 1 && strcmp(argv[1], "workloads") == 0) do_ops = false;
    if (do_ops) ops();
    if (do_wl) workloads();
    printf("total %016" PRIx64 "\n", total);
    return 0;
}
