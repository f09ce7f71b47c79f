/* digits_mlp.c - the digits MLP 64-128-10 (ReLU) in plain C: load the CSV,
 * stratified 80/20 split, standardise, Adam lr 1e-3 on shuffled batches of
 * 32, then test accuracy. The model is a tg_sequential container of its
 * layers, which frees each layer's output once the next has run (a step
 * holds what the tape saves). Usage: example_digits_mlp [--epochs N]
 * [--data F].
 * At the default 20 epochs it reaches 0.9749 in about 0.2 s; it exits 1
 * below 0.80 (one epoch already gives 0.84) or on an error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tapegrad.h>
#include <unistd.h>

#ifndef TG_DATA_DIR
#define TG_DATA_DIR "data"
#endif

int main(int argc, char **argv)
{
    int epochs = 20;
    const char *path = access("data/digits.csv.gz", R_OK) == 0 ? "data/digits.csv.gz"
                                                               : TG_DATA_DIR "/digits.csv.gz";
    for (int i = 1; i < argc; i += 2)
        if (i + 1 < argc && strcmp(argv[i], "--epochs") == 0) epochs = atoi(argv[i + 1]);
        else if (i + 1 < argc && strcmp(argv[i], "--data") == 0) path = argv[i + 1];
        else epochs = 0; /* unknown option: usage */
    if (epochs < 1) return fprintf(stderr, "usage: %s [--epochs N] [--data F]\n", argv[0]), 2;

    tg_dataset *all = NULL, *train = NULL, *test = NULL;
    tg_rng rng;
    tg_rng_seed(&rng, 1);
    tg_params *ps = tg_params_new();
    tg_linear *fc1 = tg_linear_new(ps, "fc1", 64, 128, true, TG_F32, &rng);
    tg_linear *fc2 = tg_linear_new(ps, "fc2", 128, 10, true, TG_F32, &rng);
    tg_sequential *mlp = tg_sequential_new(); /* (B, 64) -> (B, 10) */
    bool built = mlp && tg_sequential_add_linear(mlp, fc1) == TG_OK &&
                 tg_sequential_add_map(mlp, tg_relu) == TG_OK &&
                 tg_sequential_add_linear(mlp, fc2) == TG_OK;
    tg_optim_opts oo = tg_optim_defaults(TG_OPTIM_ADAM); /* lr 1e-3 */
    tg_optim *opt = tg_optim_new(ps, &oo);
    tg_tape *tape = tg_tape_new(NULL);
    tg_batches *it = NULL;
    double acc = 0;
    bool ok = tg_dataset_load_csv(path, 64, &all) == TG_OK &&
              tg_dataset_split(all, 0.2, 0, &train, &test) == TG_OK &&
              tg_dataset_standardize(train, test) == TG_OK && built && opt && tape &&
              (it = tg_batches_new(train, 32, true, 2)) &&
              tg_params_requires_grad(ps, tape) == TG_OK;
    for (int e = 0; ok && e < epochs; e++, tg_batches_next_epoch(it)) {
        tg_tensor *x, *y;
        tg_scope_begin(); /* owns the epoch's batches */
        while (ok && tg_batches_next(it, &x, &y)) {
            tg_scope_begin(); /* owns every tensor of the step */
            tg_optim_zero_grad(opt);
            tg_tensor *loss = tg_cross_entropy(tg_sequential_forward(mlp, tape, 1, x), y);
            ok = tg_backward(loss) == TG_OK && tg_optim_step(opt) == TG_OK;
            tg_scope_end();
            tg_tape_reset(tape); /* drop the step's record; parameters stay leaves */
        }
        tg_scope_end();
    }
    if (ok) { /* test accuracy, grad off */
        tg_grad_set_enabled(false);
        tg_scope_begin();
        tg_tensor *pred = tg_argmax(tg_sequential_forward(mlp, NULL, 1, tg_dataset_x(test)), 1,
                                    false);
        tg_tensor *hit = tg_cast(tg_eq(pred, tg_dataset_y(test)), TG_F64);
        ok = tg_tensor_item(tg_mean(hit), &acc) == TG_OK;
        tg_scope_end();
        if (ok) printf("digits MLP 64-128-10, %d epochs: test accuracy %.4f\n", epochs, acc);
    }
    if (!ok)
        fprintf(stderr, "digits_mlp: %s (%s)\n", tg_strerror(tg_last_error()),
                tg_last_error_message());
    tg_batches_free(it);
    tg_optim_free(opt);
    tg_sequential_free(mlp);
    tg_linear_free(fc1), tg_linear_free(fc2);
    tg_params_free(ps);
    tg_tape_free(tape);
    tg_dataset_free(all), tg_dataset_free(train), tg_dataset_free(test);
    return ok && acc >= 0.80 ? 0 : 1;
}
