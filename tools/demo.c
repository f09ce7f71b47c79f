/* `tapegrad demo`: a complete training loop in plain C on the public API.
 * Three interleaved spirals (seeded, 100 points each, f32, cpu backend), a
 * 2-32-32-3 tanh MLP, cross-entropy, full-batch SGD with momentum written
 * directly on the leaves' data. Each step is one scope and one tape
 * generation, so nothing accumulates across steps. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <tapegrad.h>
#include <time.h>

#include "cli.h"

#define CLASSES 3
#define PER_CLASS 100
#define NPOINTS (CLASSES * PER_CLASS)
#define HIDDEN 32
#define LAYERS 3
#define PI 3.14159265358979323846 /* M_PI is not in strict C11 */

static const int dims[LAYERS + 1] = {2, HIDDEN, HIDDEN, CLASSES};

typedef struct {
    tg_tape *tape;
    tg_tensor *x, *y;                         /* (N, 2) f32, (N) i64 */
    tg_tensor *w[LAYERS], *b[LAYERS];         /* (in, out), (out): leaves */
    tg_tensor *vw[LAYERS], *vb[LAYERS];       /* momentum buffers, same shapes */
} demo;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Class k's arm: radius grows 0.1 -> 1 while the angle sweeps 4 radians from
 * an offset of k * 2pi/3, with Gaussian jitter on the angle. */
static tg_status make_spirals(tg_rng *rng, demo *d)
{
    float xs[NPOINTS][2];
    int64_t ys[NPOINTS];
    for (int k = 0; k < CLASSES; k++)
        for (int i = 0; i < PER_CLASS; i++) {
            double r = 0.1 + 0.9 * (double)i / (PER_CLASS - 1); /* no shared origin */
            double t = k * 2.0 * PI / CLASSES + 4.0 * r + 0.2 * tg_rng_gauss(rng);
            int j = k * PER_CLASS + i;
            xs[j][0] = (float)(r * sin(t));
            xs[j][1] = (float)(r * cos(t));
            ys[j] = k;
        }
    int64_t xshape[2] = {NPOINTS, 2}, yshape = NPOINTS;
    d->x = tg_tensor_from_data(TG_F32, 2, xshape, xs);
    d->y = tg_tensor_from_data(TG_I64, 1, &yshape, ys);
    return d->x && d->y ? TG_OK : tg_last_error();
}

static tg_status make_model(tg_rng *rng, demo *d)
{
    d->tape = tg_tape_new(NULL);
    if (!d->tape) return tg_last_error();
    for (int l = 0; l < LAYERS; l++) {
        int64_t ws[2] = {dims[l], dims[l + 1]}, bs = dims[l + 1];
        double a = sqrt(6.0 / (dims[l] + dims[l + 1])); /* Glorot-uniform suits tanh */
        d->w[l] = tg_rand_uniform(rng, TG_F32, 2, ws, -a, a);
        d->b[l] = tg_zeros(TG_F32, 1, &bs);
        d->vw[l] = tg_zeros(TG_F32, 2, ws);
        d->vb[l] = tg_zeros(TG_F32, 1, &bs);
        if (!d->w[l] || !d->b[l] || !d->vw[l] || !d->vb[l]) return tg_last_error();
        tg_status st = tg_requires_grad(d->tape, d->w[l]);
        if (!st) st = tg_requires_grad(d->tape, d->b[l]);
        if (st) return st;
    }
    return TG_OK;
}

/* Logits (N, CLASSES); scope-owned when a scope is open. */
static tg_tensor *forward(demo *d)
{
    tg_tensor *h = d->x;
    for (int l = 0; l < LAYERS; l++) {
        h = tg_add(tg_matmul(h, d->w[l]), d->b[l]);
        if (l < LAYERS - 1) h = tg_tanh(h);
    }
    return h;
}

/* v = mu v + g; p -= lr v, on the raw data of leaf p and its gradient,
 * then the gradient is dropped so the next backward starts from zero. */
static tg_status sgd_update(tg_tensor *p, tg_tensor *v, float lr, float mu)
{
    tg_tensor *g = tg_grad(p);
    float *pw = tg_tensor_data(p), *pv = tg_tensor_data(v);
    const float *pg = g ? tg_tensor_data(g) : NULL;
    if (!pw || !pv || !pg) return tg_last_error();
    for (int64_t i = 0; i < tg_tensor_numel(p); i++) {
        pv[i] = mu * pv[i] + pg[i];
        pw[i] -= lr * pv[i];
    }
    tg_grad_zero(p);
    return TG_OK;
}

/* One training step: forward, loss, backward, update. *loss gets the loss
 * before the update. */
static tg_status train_step(demo *d, float lr, float mu, double *loss)
{
    tg_scope_begin();
    tg_tensor *l = tg_cross_entropy(forward(d), d->y);
    tg_status st = l ? TG_OK : tg_last_error();
    if (!st) st = tg_tensor_item(l, loss);
    if (!st) st = tg_backward(l);
    for (int k = 0; k < LAYERS && !st; k++) {
        st = sgd_update(d->w[k], d->vw[k], lr, mu);
        if (!st) st = sgd_update(d->b[k], d->vb[k], lr, mu);
    }
    tg_scope_end();
    tg_tape_reset(d->tape);
    return st;
}

/* Fraction of points whose argmax logit is their class (grad off). */
static tg_status accuracy(demo *d, double *acc)
{
    bool prev = tg_grad_set_enabled(false);
    tg_scope_begin();
    int64_t pred[NPOINTS], truth[NPOINTS];
    tg_tensor *am = tg_argmax(forward(d), 1, false);
    tg_status st = am ? TG_OK : tg_last_error();
    if (!st) st = tg_tensor_copy_out(am, pred, sizeof pred);
    if (!st) st = tg_tensor_copy_out(d->y, truth, sizeof truth);
    int right = 0;
    for (int i = 0; i < NPOINTS && !st; i++) right += pred[i] == truth[i];
    *acc = (double)right / NPOINTS;
    tg_scope_end();
    tg_grad_set_enabled(prev);
    return st;
}

static void demo_free(demo *d)
{
    for (int l = 0; l < LAYERS; l++) {
        tg_tensor_release(d->w[l]);
        tg_tensor_release(d->b[l]);
        tg_tensor_release(d->vw[l]);
        tg_tensor_release(d->vb[l]);
    }
    tg_tensor_release(d->x);
    tg_tensor_release(d->y);
    tg_tape_free(d->tape);
}

int cli_demo(int argc, char **argv)
{
    static const char *const cmd = "demo";
    int64_t steps = 400, seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        if (strcmp(a, "--steps") == 0 || strcmp(a, "--seed") == 0) {
            val = i + 1 < argc ? argv[++i] : NULL;
        } else if (strncmp(a, "--steps=", 8) == 0 || strncmp(a, "--seed=", 7) == 0) {
            val = strchr(a, '=') + 1;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            printf("usage: tapegrad demo [--steps N] [--seed S]\n"
                   "  --steps N  training steps (default 400, 1..1000000)\n"
                   "  --seed S   seed for the data and the initial weights (default 1)\n");
            return CLI_OK;
        } else {
            fprintf(stderr, "tapegrad %s: unknown option '%s'\n"
                            "usage: tapegrad demo [--steps N] [--seed S]\n", cmd, a);
            return CLI_USAGE;
        }
        bool is_steps = strncmp(a, "--steps", 7) == 0;
        if (!cli_parse_int(cmd, is_steps ? "--steps" : "--seed", val, is_steps ? 1 : 0,
                           is_steps ? 1000000 : INT64_MAX, is_steps ? &steps : &seed))
            return CLI_USAGE;
    }

    const float lr = 0.1f, mu = 0.9f;
    tg_backend prev_backend = tg_set_default_backend(TG_BACKEND_CPU);
    size_t mem_before = tg_mem_current_bytes();
    demo d;
    memset(&d, 0, sizeof d);
    tg_rng rng;
    tg_rng_seed(&rng, (uint64_t)seed);
    int status = CLI_OK;
    if (make_spirals(&rng, &d) || make_model(&rng, &d)) {
        status = cli_lib_error(cmd, "setup");
        goto out;
    }
    printf("demo: %d points on %d interleaved spirals (seed %lld), MLP %d-%d-%d-%d tanh, f32 on "
           "cpu\n      cross-entropy, full-batch SGD lr %.2g momentum %.2g, %lld steps\n",
           NPOINTS, CLASSES, (long long)seed, dims[0], dims[1], dims[2], dims[3], lr, mu,
           (long long)steps);
    int64_t every = steps >= 10 ? steps / 10 : 1;
    double loss = 0, t_train = 0;
    for (int64_t s = 0; s < steps; s++) {
        double t0 = now_s();
        tg_status st = train_step(&d, lr, mu, &loss);
        t_train += now_s() - t0;
        if (st) {
            status = cli_lib_error(cmd, "training step");
            goto out;
        }
        if (s % every == 0 || s == steps - 1)
            printf("step %6lld  loss %.4f\n", (long long)s + 1, loss);
    }
    double acc;
    if (accuracy(&d, &acc)) {
        status = cli_lib_error(cmd, "accuracy");
        goto out;
    }
    printf("final training accuracy %.3f (%d/%d)\n", acc, (int)lround(acc * NPOINTS), NPOINTS);
    printf("trained in %.3f s (%.1f us/step)\n", t_train, 1e6 * t_train / (double)steps);
out:
    demo_free(&d);
    tg_set_default_backend(prev_backend);
    /* Every tensor was released: storage must be back where it started. */
    if (status == CLI_OK && tg_mem_current_bytes() != mem_before) {
        fprintf(stderr, "tapegrad %s: %zu bytes of tensor storage still allocated\n", cmd,
                tg_mem_current_bytes() - mem_before);
        status = CLI_FAIL;
    }
    return status;
}
