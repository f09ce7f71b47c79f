/* consumer.c - an out-of-tree program built against an installed tapegrad
 * with `pkg-config --cflags --libs tapegrad` (tests/install/run.sh).
 * loss = sum(x * x + 3 x), so d(loss)/dx = 2 x + 3. Prints OK on success. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <tapegrad.h>

int main(void)
{
    const double xs[3] = {1.0, 2.0, -1.5};
    int64_t shape[1] = {3};
    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *x = tg_tensor_from_data(TG_F64, 1, shape, xs);
    if (!tape || !x || tg_requires_grad(tape, x) != TG_OK) goto fail;
    tg_scope_begin();
    tg_tensor *loss = tg_sum(tg_add(tg_mul(x, x), tg_mul_scalar(x, 3.0)));
    if (tg_backward(loss) != TG_OK) goto fail;
    tg_scope_end();
    double g[3];
    if (tg_tensor_copy_out(tg_grad(x), g, sizeof g) != TG_OK) goto fail;
    for (int i = 0; i < 3; i++) {
        if (fabs(g[i] - (2.0 * xs[i] + 3.0)) > 1e-12) {
            fprintf(stderr, "consumer: grad[%d] = %g, expected %g\n", i, g[i], 2.0 * xs[i] + 3.0);
            return 1;
        }
    }
    if (strcmp(tg_version(), TAPEGRAD_VERSION) != 0) {
        fprintf(stderr, "consumer: library %s, header %s\n", tg_version(), TAPEGRAD_VERSION);
        return 1;
    }
    tg_tensor_release(x);
    tg_tape_free(tape);
    printf("OK tapegrad %s (%s)\n", tg_version(), tg_mem_allocator());
    return 0;
fail:
    fprintf(stderr, "consumer: %s (%s)\n", tg_strerror(tg_last_error()), tg_last_error_message());
    return 1;
}
