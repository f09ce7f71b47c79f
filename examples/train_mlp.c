/* train_mlp.c - a 2-32-2 tanh MLP learns a seeded XOR-of-quadrants task
 * with plain SGD, using only the public API: one scope and one tape record
 * per step, the update written straight into the leaves' buffers.
 * Usage: example_train_mlp [--steps N]. Exits 1 unless the loss fell. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tapegrad.h>

#define N 256 /* examples */
#define H 32  /* hidden units */

/* logits (N, 2) = tanh(x w0 + b0) w1 + b1 */
static tg_tensor *forward(tg_tensor *x, tg_tensor *const *w)
{
    tg_tensor *h = tg_tanh(tg_add(tg_matmul(x, w[0]), w[1])); /* (N, H) */
    return tg_add(tg_matmul(h, w[2]), w[3]);
}

/* Mean cross-entropy and accuracy on (x, y), in no-grad mode (records nothing). */
static tg_status evaluate(tg_tensor *x, tg_tensor *y, tg_tensor *const *w, double *loss,
                          double *acc)
{
    bool prev = tg_grad_set_enabled(false);
    tg_scope_begin();
    tg_tensor *logits = forward(x, w);
    tg_tensor *hit = tg_cast(tg_eq(tg_argmax(logits, 1, false), y), TG_F32); /* 0/1 */
    tg_status st = tg_tensor_item(tg_cross_entropy(logits, y), loss);
    if (st == TG_OK) st = tg_tensor_item(tg_mean(hit), acc);
    tg_scope_end();
    tg_grad_set_enabled(prev);
    return st;
}

int main(int argc, char **argv)
{
    int steps = 300;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = atoi(argv[++i]);
    if (steps < 1) return fprintf(stderr, "usage: %s [--steps N]  (N >= 1)\n", argv[0]), 2;

    tg_rng rng;
    tg_rng_seed(&rng, 7); /* same data and weights on every machine */
    tg_tensor *x = tg_rand_uniform(&rng, TG_F32, 2, (int64_t[]){N, 2}, -1.0, 1.0);
    tg_tensor *y = tg_zeros(TG_I64, 1, (int64_t[]){N}); /* 1 where x0 * x1 > 0 */
    const float *xv = tg_tensor_data(x);
    int64_t *yv = tg_tensor_data(y);
    for (int i = 0; xv && yv && i < N; i++) yv[i] = xv[2 * i] * xv[2 * i + 1] > 0;

    tg_tape *tape = tg_tape_new(NULL);
    tg_tensor *w[4] = {tg_rand_normal(&rng, TG_F32, 2, (int64_t[]){2, H}, 0.0, 1.0),
                       tg_zeros(TG_F32, 1, (int64_t[]){H}),
                       tg_rand_normal(&rng, TG_F32, 2, (int64_t[]){H, 2}, 0.0, 0.3),
                       tg_zeros(TG_F32, 1, (int64_t[]){2})};
    for (int i = 0; i < 4; i++)
        if (tg_requires_grad(tape, w[i]) != TG_OK) goto fail; /* also catches NULLs */

    double loss0, acc0, loss, acc;
    if (evaluate(x, y, w, &loss0, &acc0) != TG_OK) goto fail;
    for (int s = 0; s < steps; s++) {
        tg_scope_begin(); /* owns every tensor of this step */
        if (tg_backward(tg_cross_entropy(forward(x, w), y)) != TG_OK) goto fail;
        for (int i = 0; i < 4; i++) { /* SGD: w -= 0.5 * dL/dw */
            float *p = tg_tensor_data(w[i]);
            const float *g = tg_tensor_data(tg_grad(w[i]));
            if (!p || !g) goto fail;
            for (int64_t j = 0; j < tg_tensor_numel(w[i]); j++) p[j] -= 0.5f * g[j];
            tg_grad_zero(w[i]);
        }
        tg_scope_end();
        tg_tape_reset(tape); /* drop the step's record; the leaves stay leaves */
    }
    if (evaluate(x, y, w, &loss, &acc) != TG_OK) goto fail;
    printf("steps %d: loss %.4f -> %.4f, accuracy %.1f%% -> %.1f%%\n", steps, loss0, loss,
           100 * acc0, 100 * acc);
    for (int i = 0; i < 4; i++) tg_tensor_release(w[i]);
    tg_tensor_release(x), tg_tensor_release(y);
    tg_tape_free(tape);
    return loss < loss0 ? 0 : 1;
fail:
    fprintf(stderr, "train_mlp: %s (%s)\n", tg_strerror(tg_last_error()), tg_last_error_message());
    return 1;
}
