/* gradient_penalty.c - a WGAN-GP critic step: the critic D, a 2-64-64-1
 * tanh MLP, learns to tell a ring of real points (radius 1) from a blob of
 * fake ones (near the origin) under the loss
 *   mean(D(fake)) - mean(D(real)) + 10 mean((|dD/dx (x_hat)| - 1)^2),
 * x_hat random interpolates of real and fake points. The penalty is a
 * function of a gradient: dD/dx comes from tg_grad_of with create_graph,
 * so the loss is differentiated through it (second order) and Adam steps
 * the critic. Prints the Wasserstein estimate and the mean gradient norm,
 * which the penalty pulls towards 1. Usage: example_gradient_penalty
 * [--steps N]. Exits 1 unless the critic separates the sets and the norm
 * ends within 0.25 of 1. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tapegrad.h>

#define B 128 /* points of each kind per step */
#define H 64

static tg_tensor *critic(tg_tensor *const *w, tg_tensor *x)
{
    tg_tensor *h = tg_tanh(tg_add(tg_matmul(x, w[0]), w[1]));
    h = tg_tanh(tg_add(tg_matmul(h, w[2]), w[3]));
    return tg_add(tg_matmul(h, w[4]), w[5]); /* (B, 1) */
}

/* real: the unit circle with noise; fake: a small Gaussian blob. */
static void draw(tg_rng *rng, float *real, float *fake, float *mix)
{
    for (int i = 0; i < B; i++) {
        double a = 6.283185307179586 * tg_rng_double(rng), r = 1.0 + 0.05 * tg_rng_gauss(rng);
        real[2 * i] = (float)(r * cos(a));
        real[2 * i + 1] = (float)(r * sin(a));
        fake[2 * i] = (float)(0.3 * tg_rng_gauss(rng));
        fake[2 * i + 1] = (float)(0.3 * tg_rng_gauss(rng));
        double e = tg_rng_double(rng);
        for (int k = 0; k < 2; k++)
            mix[2 * i + k] = (float)(e * real[2 * i + k] + (1 - e) * fake[2 * i + k]);
    }
}

int main(int argc, char **argv)
{
    int steps = 600;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = atoi(argv[++i]);
    if (steps < 1) return fprintf(stderr, "usage: %s [--steps N]  (N >= 1)\n", argv[0]), 2;
    tg_rng rng;
    tg_rng_seed(&rng, 3);
    tg_params *ps = tg_params_new();
    const int64_t shapes[6][2] = {{2, H}, {H, 0}, {H, H}, {H, 0}, {H, 1}, {1, 0}};
    const char *names[6] = {"w0", "b0", "w1", "b1", "w2", "b2"};
    tg_tensor *w[6];
    for (int i = 0; i < 6; i++) {
        w[i] = tg_params_add(ps, names[i], TG_F32, shapes[i][1] ? 2 : 1, shapes[i]);
        if (!w[i]) goto fail;
        if (shapes[i][1] && tg_init_xavier_uniform(w[i], &rng, 1.0) != TG_OK) goto fail;
    }
    tg_optim_opts oo = tg_optim_defaults(TG_OPTIM_ADAM);
    oo.lr = 5e-3;
    tg_optim *opt = tg_optim_new(ps, &oo);
    tg_tape *tape = tg_tape_new(NULL);
    if (!opt || !tape || tg_params_requires_grad(ps, tape) != TG_OK) goto fail;
    tg_tensor *real = tg_zeros(TG_F32, 2, (int64_t[]){B, 2}),
              *fake = tg_zeros(TG_F32, 2, (int64_t[]){B, 2}),
              *mix = tg_zeros(TG_F32, 2, (int64_t[]){B, 2});
    if (!real || !fake || !mix) goto fail;
    double wdist = 0, norm = 0;
    for (int s = 0; s < steps; s++) {
        draw(&rng, tg_tensor_data(real), tg_tensor_data(fake), tg_tensor_data(mix));
        tg_optim_zero_grad(opt);
        tg_scope_begin();
        tg_tensor *xh = tg_detach(mix), *gx;
        if (tg_requires_grad(tape, xh) != TG_OK) goto fail;
        /* dD/dx at the interpolates, recorded so the loss can use it */
        tg_tensor *d_mix = tg_sum(critic(w, xh));
        tg_grad_opts go = {.create_graph = true};
        if (tg_grad_of(1, &d_mix, NULL, 1, &xh, &gx, &go) != TG_OK) goto fail;
        tg_tensor *gnorm = tg_sqrt(tg_add_scalar(tg_sum_dims(tg_mul(gx, gx), 1, (int[]){1}, false),
                                                 1e-12));
        tg_tensor *penalty = tg_mean(tg_pow_scalar(tg_add_scalar(gnorm, -1.0), 2.0));
        tg_tensor *est = tg_sub(tg_mean(critic(w, real)), tg_mean(critic(w, fake)));
        tg_tensor *loss = tg_add(tg_neg(est), tg_mul_scalar(penalty, 10.0));
        if (!loss || tg_backward(loss) != TG_OK || tg_optim_step(opt) != TG_OK) goto fail;
        if (tg_tensor_item(est, &wdist) != TG_OK) goto fail;
        tg_tensor_item(tg_mean(gnorm), &norm);
        if (s % 100 == 0 || s == steps - 1)
            printf("step %3d: W estimate %.4f, mean |dD/dx| %.4f\n", s, wdist, norm);
        tg_scope_end();
        tg_tape_reset(tape);
    }
    tg_tensor_release(real), tg_tensor_release(fake), tg_tensor_release(mix);
    tg_optim_free(opt);
    tg_tape_free(tape);
    tg_params_free(ps);
    return wdist > 0.2 && fabs(norm - 1.0) < 0.25 ? 0 : 1;
fail:
    fprintf(stderr, "gradient_penalty: %s (%s)\n", tg_strerror(tg_last_error()),
            tg_last_error_message());
    return 1;
}
