/* The per-tape profiler and the DOT export. Counts and bytes are exact;
 * times are only required to be non-negative (never asserted). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tapegrad.h>
#include <unistd.h>

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

static const tg_profile_row *row(const tg_profile_row *rows, int n, const char *op)
{
    for (int i = 0; i < n; i++)
        if (strcmp(rows[i].op, op) == 0) return &rows[i];
    return NULL;
}

Test(profile, counts_calls_saved_bytes_and_recomputes_per_op_kind)
{
    tg_tape_opts o = {.policy = TG_CHECKPOINT_BALANCED};
    tg_tape *tape = tg_tape_new(&o);
    cr_assert_eq(tg_tape_profile_enable(tape, true), TG_OK);
    tg_tensor *w = tg_ones(TG_F64, 2, SHAPE(4, 4));
    cr_assert_eq(tg_requires_grad(tape, w), TG_OK);
    for (int step = 0; step < 3; step++) {
        tg_scope_begin();
        tg_tensor *x = tg_ones(TG_F64, 2, SHAPE(2, 4));
        tg_tensor *h = tg_tanh(tg_matmul(x, w)); /* matmul keeps x: 64 bytes */
        cr_assert_eq(tg_backward(tg_sum(tg_tanh(h))), TG_OK, "%s", tg_last_error_message());
        tg_scope_end();
        tg_tape_reset(tape);
    }
    tg_profile_row rows[16];
    int n = tg_tape_profile_rows(tape, rows, 16);
    cr_assert_eq(n, 3, "matmul, tanh, sum");
    const tg_profile_row *mm = row(rows, n, "matmul"), *th = row(rows, n, "tanh");
    cr_assert(mm && th);
    cr_assert_eq(mm->calls, 3);
    cr_assert_eq(mm->backward_calls, 3);
    cr_assert_eq(mm->recomputes, 0, "compute-bound ops keep what they save");
    /* x (2x4 f64) per step, plus the checkpoint of matmul's output that the
     * recomputed tanh reads: 64 + 64 bytes a step. */
    cr_assert_eq(mm->saved_bytes, 3 * 64);
    cr_assert_eq(th->calls, 6);
    cr_assert_eq(th->recomputes, 6, "BALANCED recomputes every tanh once");
    cr_assert(mm->forward_ms >= 0 && th->backward_ms >= 0);
    tg_tape_profile_clear(tape);
    cr_assert_eq(tg_tape_profile_rows(tape, NULL, 0), 0);
    tg_tensor_release(w);
    tg_tape_free(tape);
}

Test(profile, dot_export_names_ops_shapes_and_recompute_nodes)
{
    tg_tape_opts o = {.policy = TG_CHECKPOINT_BALANCED};
    tg_tape *tape = tg_tape_new(&o);
    tg_tensor *w = tg_ones(TG_F32, 2, SHAPE(3, 5));
    cr_assert_eq(tg_requires_grad(tape, w), TG_OK);
    tg_scope_begin();
    tg_tensor *y = tg_relu(tg_matmul(tg_ones(TG_F32, 2, SHAPE(2, 3)), w));
    cr_assert_not_null(y);
    char path[] = "/tmp/tg_dot_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert_eq(tg_tape_export_dot(tape, path), TG_OK, "%s", tg_last_error_message());
    FILE *f = fopen(path, "r");
    char text[4096] = {0};
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    unlink(path);
    cr_assert_gt(len, 0);
    cr_assert(strstr(text, "digraph tape"));
    cr_assert(strstr(text, "matmul\\nf32 [2,5]"), "%s", text);
    cr_assert(strstr(text, "relu\\nf32 [2,5]"), "%s", text);
    cr_assert(strstr(text, "recomputed"), "%s", text);
    cr_assert(strstr(text, "leaf [3,5]"), "%s", text);
    cr_assert(strstr(text, "n0 -> n1"), "%s", text);
    cr_assert_eq(tg_tape_export_dot(tape, "/nonexistent/dir/x.dot"), TG_ERR_IO);
    tg_scope_end();
    tg_tensor_release(w);
    tg_tape_free(tape);
}
