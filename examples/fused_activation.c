/* fused_activation.c - the train_mlp task (a 2-32-2 MLP on a seeded
 * XOR-of-quadrants) with its hidden activation written once as a fused
 * pointwise function: swish, h * sigmoid(h), compiled by tg_fused_new and
 * called each step with tg_fused_call. The loss adds a small penalty on the
 * hidden pre-activations, 1e-4 * sum(softplus(h)), through tg_fused_sum,
 * which sums without writing softplus(h) out.
 *
 * The same net is trained twice from the same weights: once through the
 * fused functions, once through the same ops one by one. A fused call
 * gives the ops' results and gradients bit for bit, so the two runs end
 * with the same weights, bit for bit.
 * Usage: example_fused_activation [--steps N]. Exits 1 unless the loss
 * fell and the two runs agree. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tapegrad.h>

#define N 256 /* examples */
#define H 32  /* hidden units */

static tg_tensor *swish(void *ud, int n, tg_tensor *const *in)
{
    (void)ud, (void)n;
    return tg_mul(in[0], tg_sigmoid(in[0]));
}

static tg_tensor *softplus(void *ud, int n, tg_tensor *const *in)
{
    (void)ud, (void)n;
    return tg_softplus(in[0], 1.0, 20.0);
}

typedef struct net {
    tg_tensor *w[4]; /* w0 (2, H), b0 (H), w1 (H, 2), b1 (2) */
    tg_fused *act, *pen; /* NULL: the ops one by one */
} net;

/* The step's loss: cross-entropy of swish(x w0 + b0) w1 + b1, plus the
 * penalty on h = x w0 + b0. h feeds both fused functions, and a fused
 * call hands h one gradient where its ops hand it several: the penalty is
 * recorded first, so that the backward, which runs from the last record
 * back, adds the penalty's part last, after the activation's parts, as it
 * would for the ops (otherwise the same sum in another order: equal to
 * rounding, not bit for bit). */
static tg_tensor *loss_of(const net *m, tg_tensor *x, tg_tensor *y)
{
    tg_tensor *h = tg_add(tg_matmul(x, m->w[0]), m->w[1]); /* (N, H) */
    tg_tensor *pen = m->pen ? tg_fused_sum(m->pen, 1, &h) : tg_sum(softplus(NULL, 1, &h));
    tg_tensor *a = m->act ? tg_fused_call(m->act, 1, &h) : swish(NULL, 1, &h);
    tg_tensor *logits = tg_add(tg_matmul(a, m->w[2]), m->w[3]);
    return tg_add(tg_cross_entropy(logits, y), tg_mul_scalar(pen, 1e-4));
}

/* steps of SGD on m; the first and last losses. */
static tg_status train(net *m, tg_tensor *x, tg_tensor *y, int steps, double *first,
                       double *last)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_status st = tape ? TG_OK : tg_last_error();
    for (int i = 0; i < 4 && st == TG_OK; i++) st = tg_requires_grad(tape, m->w[i]);
    for (int s = 0; s < steps && st == TG_OK; s++) {
        tg_scope_begin(); /* owns every tensor of this step */
        tg_tensor *loss = loss_of(m, x, y);
        st = tg_backward(loss);
        if (st == TG_OK) st = tg_tensor_item(loss, s == 0 ? first : last);
        for (int i = 0; i < 4 && st == TG_OK; i++) { /* w -= 0.5 * dL/dw */
            float *p = tg_tensor_data(m->w[i]);
            const float *g = tg_tensor_data(tg_grad(m->w[i]));
            if (!p || !g) {
                st = tg_last_error();
                break;
            }
            for (int64_t j = 0; j < tg_tensor_numel(m->w[i]); j++) p[j] -= 0.5f * g[j];
            tg_grad_zero(m->w[i]);
        }
        tg_scope_end();
        tg_tape_reset(tape);
    }
    if (steps == 1) *last = *first;
    tg_tape_free(tape);
    return st;
}

static tg_status init_net(net *m, bool fused)
{
    tg_rng rng;
    tg_rng_seed(&rng, 11); /* the same weights for both nets */
    memset(m, 0, sizeof *m);
    m->w[0] = tg_rand_normal(&rng, TG_F32, 2, (int64_t[]){2, H}, 0.0, 1.0);
    m->w[1] = tg_zeros(TG_F32, 1, (int64_t[]){H});
    m->w[2] = tg_rand_normal(&rng, TG_F32, 2, (int64_t[]){H, 2}, 0.0, 0.3);
    m->w[3] = tg_zeros(TG_F32, 1, (int64_t[]){2});
    if (fused) {
        m->act = tg_fused_new(swish, NULL, 1);
        m->pen = tg_fused_new(softplus, NULL, 1);
        if (!m->act || !m->pen) return tg_last_error();
    }
    for (int i = 0; i < 4; i++)
        if (!m->w[i]) return tg_last_error();
    return TG_OK;
}

static void free_net(net *m)
{
    for (int i = 0; i < 4; i++) tg_tensor_release(m->w[i]);
    tg_fused_free(m->act);
    tg_fused_free(m->pen);
}

int main(int argc, char **argv)
{
    int steps = 200;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = atoi(argv[++i]);
    if (steps < 1) return fprintf(stderr, "usage: %s [--steps N]  (N >= 1)\n", argv[0]), 2;

    tg_rng rng;
    tg_rng_seed(&rng, 7); /* train_mlp's data */
    tg_tensor *x = tg_rand_uniform(&rng, TG_F32, 2, (int64_t[]){N, 2}, -1.0, 1.0);
    tg_tensor *y = tg_zeros(TG_I64, 1, (int64_t[]){N}); /* 1 where x0 * x1 > 0 */
    const float *xv = tg_tensor_data(x);
    int64_t *yv = tg_tensor_data(y);
    for (int i = 0; xv && yv && i < N; i++) yv[i] = xv[2 * i] * xv[2 * i + 1] > 0;

    net fused, ops;
    double f0 = 0, f1 = 0, o0 = 0, o1 = 0;
    tg_status st = init_net(&fused, true);
    if (st == TG_OK) st = init_net(&ops, false);
    if (st == TG_OK) st = train(&fused, x, y, steps, &f0, &f1);
    if (st == TG_OK) st = train(&ops, x, y, steps, &o0, &o1);
    if (st != TG_OK) {
        fprintf(stderr, "fused_activation: %s (%s)\n", tg_strerror(st), tg_last_error_message());
        return 1;
    }
    bool same = f0 == o0 && f1 == o1;
    for (int i = 0; i < 4; i++) {
        size_t bytes = (size_t)tg_tensor_numel(fused.w[i]) * sizeof(float);
        same = same && memcmp(tg_tensor_data(fused.w[i]), tg_tensor_data(ops.w[i]), bytes) == 0;
    }
    printf("steps %d: loss %.4f -> %.4f (fused), %.4f -> %.4f (ops); weights %s\n", steps, f0,
           f1, o0, o1, same ? "bitwise equal" : "DIFFER");
    free_net(&fused);
    free_net(&ops);
    tg_tensor_release(x), tg_tensor_release(y);
    return f1 < f0 && same ? 0 : 1;
}
