/* digits_cnn.c - a small CNN on the 8x8 digit images, public API only:
 *
 *   x (B, 64) -> (B, 1, 8, 8) -> conv 1->8 3x3 pad 1 -> relu -> max_pool 2x2 (B, 8, 4, 4)
 *             -> conv 8->16 3x3 pad 1 -> relu -> max_pool 2x2 (B, 16, 2, 2)
 *             -> flatten (B, 64) -> linear 64->10 -> logits (B, 10)
 *
 * Stratified 80/20 split (seed 0), features standardised with the training
 * split's statistics, Adam (lr 3e-3), shuffled batches of 32, then test
 * accuracy (grad off) and training time.
 * Usage: example_digits_cnn [--epochs N] [--data FILE].
 * At the default 15 epochs it reaches test accuracy 0.9666 (the same on
 * every run: everything is seeded) in about 0.4 s on one core. It exits 1
 * if the mean training loss of the last epoch is not below the first's, or
 * the test accuracy is below 0.50 (chance is 0.10; one epoch gives 0.70,
 * two 0.84, so a working run clears it at any epoch count), or on an error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tapegrad.h>
#include <time.h>
#include <unistd.h>

#ifndef TG_DATA_DIR
#define TG_DATA_DIR "data"
#endif

typedef struct {
    tg_params *ps;
    tg_conv2d_layer *conv1, *conv2;
    tg_linear *fc;
} cnn;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Adds the layers to a fresh parameter set; false (last error set) on failure. */
static bool cnn_new(cnn *m, uint64_t seed)
{
    tg_rng rng;
    tg_rng_seed(&rng, seed);
    const tg_conv2d_opts pad1 = {.padding = {1, 1}};
    m->ps = tg_params_new();
    m->conv1 =
        m->ps ? tg_conv2d_layer_new(m->ps, "conv1", 1, 8, 3, 3, &pad1, true, TG_F32, &rng) : NULL;
    m->conv2 = m->conv1
                   ? tg_conv2d_layer_new(m->ps, "conv2", 8, 16, 3, 3, &pad1, true, TG_F32, &rng)
                   : NULL;
    m->fc = m->conv2 ? tg_linear_new(m->ps, "fc", 16 * 2 * 2, 10, true, TG_F32, &rng) : NULL;
    return m->fc != NULL;
}

static void cnn_free(cnn *m)
{
    tg_conv2d_layer_free(m->conv1);
    tg_conv2d_layer_free(m->conv2);
    tg_linear_free(m->fc);
    tg_params_free(m->ps);
}

/* x (B, 64) -> logits (B, 10); NULL with the last error set on failure. */
static tg_tensor *cnn_forward(const cnn *m, tg_tensor *x)
{
    const tg_pool2d_opts pool = {.kernel = {2, 2}};
    int64_t b = tg_tensor_dim(x, 0);
    tg_tensor *img = tg_reshape(x, 4, (int64_t[]){b, 1, 8, 8}); /* (B, 1, 8, 8) */
    tg_tensor *h = tg_max_pool2d(tg_conv2d_layer_forward_relu(m->conv1, img), &pool);
    h = tg_max_pool2d(tg_conv2d_layer_forward_relu(m->conv2, h), &pool); /* (B, 16, 2, 2) */
    return tg_linear_forward(m->fc, tg_reshape(h, 2, (int64_t[]){b, 16 * 2 * 2}));
}

/* Test accuracy with grad off; -1 on failure. */
static double accuracy(const cnn *m, const tg_dataset *ds)
{
    bool prev = tg_grad_set_enabled(false);
    tg_scope_begin();
    tg_tensor *pred = tg_argmax(cnn_forward(m, tg_dataset_x(ds)), 1, false); /* (N) i64 */
    double acc = -1;
    if (tg_tensor_item(tg_mean(tg_cast(tg_eq(pred, tg_dataset_y(ds)), TG_F64)), &acc)) acc = -1;
    tg_scope_end();
    tg_grad_set_enabled(prev);
    return acc;
}

int main(int argc, char **argv)
{
    int epochs = 15;
    const char *path = access("data/digits.csv.gz", R_OK) == 0 ? "data/digits.csv.gz"
                                                               : TG_DATA_DIR "/digits.csv.gz";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--epochs") == 0 && i + 1 < argc)
            epochs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--data") == 0 && i + 1 < argc)
            path = argv[++i];
        else
            epochs = 0;
    }
    if (epochs < 1) return fprintf(stderr, "usage: %s [--epochs N>=1] [--data FILE]\n", argv[0]), 2;

    tg_set_default_backend(TG_BACKEND_CPU);
    tg_dataset *all = NULL, *train = NULL, *test = NULL;
    cnn m = {0};
    tg_optim *opt = NULL;
    tg_tape *tape = NULL;
    tg_batches *it = NULL;
    double first_loss = 0, last_loss = 0, acc = -1, t0 = now_s();
    bool ok = tg_dataset_load_csv(path, 64, &all) == TG_OK &&
              tg_dataset_split(all, 0.2, 0, &train, &test) == TG_OK &&
              tg_dataset_standardize(train, test) == TG_OK && cnn_new(&m, 1);
    if (ok) {
        tg_optim_opts oo = tg_optim_defaults(TG_OPTIM_ADAM);
        oo.lr = 3e-3;
        opt = tg_optim_new(m.ps, &oo);
        tape = tg_tape_new(NULL);
        it = tg_batches_new(train, 32, true, 2);
        ok = opt && tape && it && tg_params_requires_grad(m.ps, tape) == TG_OK;
    }
    for (int e = 1; ok && e <= epochs; e++) {
        double sum = 0;
        int64_t seen = 0;
        tg_tensor *x, *y;
        tg_scope_begin(); /* owns the epoch's batches */
        while (ok && tg_batches_next(it, &x, &y)) {
            tg_scope_begin(); /* owns every tensor of the step */
            tg_optim_zero_grad(opt);
            tg_tensor *loss = tg_cross_entropy(cnn_forward(&m, x), y);
            double lv = 0;
            ok = tg_backward(loss) == TG_OK && tg_optim_step(opt) == TG_OK &&
                 tg_tensor_item(loss, &lv) == TG_OK;
            sum += lv * (double)tg_tensor_dim(y, 0);
            seen += tg_tensor_dim(y, 0);
            tg_scope_end();
            tg_tape_reset(tape); /* drop the step's record; parameters stay leaves */
        }
        tg_scope_end();
        tg_batches_next_epoch(it);
        last_loss = seen ? sum / (double)seen : 0;
        if (e == 1) first_loss = last_loss;
        if (ok && (e == 1 || e == epochs || e % 5 == 0))
            printf("epoch %3d/%d  train loss %.4f\n", e, epochs, last_loss);
    }
    double secs = now_s() - t0;
    if (ok) ok = (acc = accuracy(&m, test)) >= 0;
    if (ok)
        printf("digits CNN (%lld parameters), %d epochs: test accuracy %.4f, %.3f s\n",
               (long long)tg_params_numel(m.ps), epochs, acc, secs);
    else
        fprintf(stderr, "digits_cnn: %s (%s)\n", tg_strerror(tg_last_error()),
                tg_last_error_message());
    tg_batches_free(it);
    tg_optim_free(opt);
    cnn_free(&m);
    tg_tape_free(tape);
    tg_dataset_free(all);
    tg_dataset_free(train);
    tg_dataset_free(test);
    /* One epoch has no earlier loss to beat; the accuracy bar still holds. */
    bool fell = epochs == 1 || last_loss < first_loss;
    return ok && fell && acc >= 0.50 ? 0 : 1;
}
