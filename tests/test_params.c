/* test_params.c - parameter sets, flat gradients, clipping, initialisers and
 * parameter files (safetensors layout): round trips, a NumPy-written file
 * (tests/golden_io/, made by tools/safetensors_numpy.py), and every corrupt
 * file case with its exact status code.
 *
 * Set TG_SAFETENSORS_KEEP=<path> to keep a copy of the file the round-trip
 * test writes, then check that NumPy reads it:
 *   /usr/bin/python3 tools/safetensors_numpy.py read <path> */
#include <criterion/criterion.h>
#include <tapegrad.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define GOLDEN_IO_DIR TG_GOLDEN_DIR "/../golden_io"

static char tmpdir[64];

static void make_tmpdir(void)
{
    strcpy(tmpdir, "/tmp/tg_params_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void remove_tmpdir(void)
{
    DIR *d = opendir(tmpdir);
    if (!d) return;
    char p[512];
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
        if (unlink(p) != 0) rmdir(p);
    }
    closedir(d);
    rmdir(tmpdir);
}

static const char *tmp_path(const char *name)
{
    static char p[256];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    return p;
}

static int count_files(void)
{
    DIR *d = opendir(tmpdir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

static double get(tg_tensor *t, int64_t i)
{
    double v = NAN;
    tg_tensor_get(t, i, &v);
    return v;
}

/* ---- Parameter sets */

Test(params, entries_are_named_counted_and_checked)
{
    tg_params *ps = tg_params_new();
    tg_tensor *w = tg_params_add(ps, "fc.weight", TG_F32, 2, (int64_t[]){2, 3});
    tg_tensor *b = tg_params_add(ps, "fc.bias", TG_F32, 1, (int64_t[]){3});
    tg_tensor *d = tg_params_add(ps, "scale", TG_F64, 1, (int64_t[]){4});
    tg_tensor *n = tg_params_add_buffer(ps, "count", TG_I64, 0, NULL);
    cr_assert(w && b && d && n, "%s", tg_last_error_message());
    cr_expect_eq(tg_params_count(ps), 4);
    cr_expect_str_eq(tg_params_name(ps, 1), "fc.bias");
    cr_expect_eq(tg_params_at(ps, 2), d);
    cr_expect_eq(tg_params_find(ps, "count"), n);
    cr_expect_eq(tg_params_index(ps, "scale"), 2);
    cr_expect(tg_params_trainable(ps, 0) && !tg_params_trainable(ps, 3));
    cr_expect_eq(tg_params_numel(ps), 13);
    cr_expect_eq(get(w, 5), 0.0, "parameters start at zero");
    cr_expect_null(tg_params_find(ps, "nope"));
    cr_expect_eq(tg_last_error(), TG_ERR_NOT_FOUND);
    cr_expect_null(tg_params_add(ps, "fc.bias", TG_F32, 0, NULL));
    cr_expect_eq(tg_last_error(), TG_ERR_EXISTS);
    const char *bad[] = {"", "optim/x", "__metadata__"};
    for (int i = 0; i < 3; i++) {
        cr_expect_null(tg_params_add(ps, bad[i], TG_F32, 0, NULL));
        cr_expect_eq(tg_last_error(), TG_ERR_INVALID, "name '%s'", bad[i]);
    }
    cr_expect_null(tg_params_add(ps, "idx", TG_I64, 0, NULL));
    cr_expect_eq(tg_last_error(), TG_ERR_DTYPE);
    cr_expect_null(tg_params_at(ps, 4));
    cr_expect_eq(tg_last_error(), TG_ERR_INVALID);
    cr_expect_null(tg_params_add(ps, "neg", TG_F32, 1, (int64_t[]){-1}));
    cr_expect_eq(tg_last_error(), TG_ERR_SHAPE);
    cr_expect_eq(tg_params_count(ps), 4, "failed adds add nothing");
    tg_error_clear();
    tg_params_free(ps);
}

/* Views into one buffer per dtype, which survive the buffer growing. */
Test(params, parameters_are_views_into_one_flat_buffer_that_can_grow)
{
    tg_params *ps = tg_params_new();
    tg_tensor *a = tg_params_add(ps, "a", TG_F32, 2, (int64_t[]){2, 3});
    tg_tensor *b = tg_params_add(ps, "b", TG_F32, 1, (int64_t[]){3});
    tg_init_constant(a, 1.5);
    tg_init_constant(b, -2.0);
    tg_tensor *flat = tg_params_flat(ps, TG_F32);
    cr_assert_eq(tg_tensor_numel(flat), 9);
    cr_expect_eq((float *)tg_tensor_data(flat) + 6, (float *)tg_tensor_data(b));
    tg_tensor_release(flat);
    char name[32];
    for (int i = 0; i < 40; i++) { /* well past the initial capacity */
        snprintf(name, sizeof name, "p%d", i);
        tg_init_constant(tg_params_add(ps, name, TG_F32, 1, (int64_t[]){7}), i);
    }
    cr_expect_eq(get(a, 5), 1.5);
    cr_expect_eq(get(b, 2), -2.0);
    flat = tg_params_flat(ps, TG_F32);
    cr_assert_eq(tg_tensor_numel(flat), 9 + 40 * 7);
    cr_expect_eq(get(flat, 9 + 39 * 7), 39.0);
    cr_expect_eq((float *)tg_tensor_data(flat), (float *)tg_tensor_data(a));
    tg_tensor_release(flat);
    cr_expect_null(tg_params_flat(ps, TG_F64));
    cr_expect_eq(tg_last_error(), TG_ERR_NOT_FOUND);
    /* A retained parameter outlives its set. */
    tg_tensor *keep = tg_tensor_retain(b);
    tg_params_free(ps);
    cr_expect_eq(get(keep, 1), -2.0);
    tg_tensor_release(keep);
    tg_error_clear();
}

/* Gradients move into the flat buffer, accumulate across backward calls
 * until zero_grad, and tg_grad then shows that same memory. */
Test(params, gradients_sync_into_the_flat_buffer_and_accumulate)
{
    tg_params *ps = tg_params_new();
    tg_tensor *w = tg_params_add(ps, "w", TG_F64, 1, (int64_t[]){2});
    tg_tensor *b = tg_params_add(ps, "b", TG_F64, 1, (int64_t[]){3});
    tg_tape *tape = tg_tape_new(NULL);
    cr_assert_eq(tg_params_requires_grad(ps, tape), TG_OK);
    for (int round = 1; round <= 2; round++) {
        tg_scope_begin();
        tg_tensor *loss = tg_add(tg_sum(tg_mul_scalar(w, 2.0)), tg_sum(tg_mul_scalar(b, 3.0)));
        cr_assert_eq(tg_backward(loss), TG_OK);
        tg_scope_end();
        tg_tape_reset(tape);
        tg_tensor *fg = tg_params_flat_grad(ps, TG_F64);
        cr_assert_not_null(fg);
        for (int i = 0; i < 5; i++)
            cr_expect_eq(get(fg, i), (i < 2 ? 2.0 : 3.0) * round);
        cr_expect_eq(tg_tensor_data(tg_grad(b)), (double *)tg_tensor_data(fg) + 2);
        tg_tensor_release(fg);
    }
    cr_expect_eq(tg_params_grad_norm(ps), sqrt(2 * 16.0 + 3 * 36.0));
    tg_params_zero_grad(ps);
    cr_expect_null(tg_grad(w));
    cr_expect_eq(tg_params_grad_norm(ps), 0.0);
    tg_tensor *fg = tg_params_flat_grad(ps, TG_F64);
    for (int i = 0; i < 5; i++)
        cr_expect_eq(get(fg, i), 0.0);
    tg_tensor_release(fg);
    tg_tape_free(tape);
    tg_params_free(ps);
    tg_error_clear();
}

/* Puts gradient ga on a (f32) and gb on b (f64) through backward. */
static tg_params *two_grads(tg_tape *tape, const float *ga, int na, const double *gb, int nb)
{
    tg_params *ps = tg_params_new();
    tg_tensor *a = tg_params_add(ps, "a", TG_F32, 1, (int64_t[]){na});
    tg_tensor *b = tg_params_add(ps, "b", TG_F64, 1, (int64_t[]){nb});
    tg_params_requires_grad(ps, tape);
    tg_scope_begin();
    tg_tensor *ca = tg_tensor_from_data(TG_F32, 1, (int64_t[]){na}, ga);
    tg_tensor *cb = tg_tensor_from_data(TG_F64, 1, (int64_t[]){nb}, gb);
    cr_assert_eq(tg_backward(tg_sum(tg_mul(a, ca))), TG_OK);
    cr_assert_eq(tg_backward(tg_sum(tg_mul(b, cb))), TG_OK);
    tg_scope_end();
    tg_tape_reset(tape);
    return ps;
}

/* Global norm over both dtypes: sqrt(3^2 + 4^2 + 12^2) = 13. Clipping to
 * 6.5 scales every gradient by 6.5 / (13 + 1e-6) (torch's clip_coef). */
Test(params, clip_grad_norm_scales_by_the_global_norm)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_params *ps = two_grads(tape, (float[]){3, 4}, 2, (double[]){12}, 1);
    double total = 0;
    cr_assert_eq(tg_params_clip_grad_norm(ps, 100.0, &total), TG_OK);
    cr_expect_eq(total, 13.0);
    cr_expect_eq(get(tg_grad(tg_params_find(ps, "b")), 0), 12.0, "below max_norm: unchanged");
    cr_assert_eq(tg_params_clip_grad_norm(ps, 6.5, &total), TG_OK);
    cr_expect_eq(total, 13.0);
    double coef = 6.5 / (13.0 + 1e-6);
    cr_expect(fabs(get(tg_grad(tg_params_find(ps, "a")), 1) - 4 * coef) < 1e-6);
    cr_expect(fabs(get(tg_grad(tg_params_find(ps, "b")), 0) - 12 * coef) < 1e-12);
    cr_expect(fabs(tg_params_grad_norm(ps) - 13 * coef) < 1e-6);
    cr_expect_eq(tg_params_clip_grad_norm(ps, 0.0, NULL), TG_ERR_INVALID);
    cr_expect_eq(tg_params_clip_grad_norm(ps, INFINITY, NULL), TG_ERR_INVALID);
    cr_assert_eq(tg_params_scale_grad(ps, 2.0), TG_OK);
    cr_expect(fabs(get(tg_grad(tg_params_find(ps, "b")), 0) - 24 * coef) < 1e-12);
    tg_params_free(ps);
    tg_tape_free(tape);
    tg_error_clear();
}

Test(params, clip_with_a_non_finite_norm_fails_and_changes_nothing)
{
    tg_tape *tape = tg_tape_new(NULL);
    tg_params *ps = two_grads(tape, (float[]){1, 2}, 2, (double[]){INFINITY}, 1);
    double total = 0;
    cr_expect_eq(tg_params_clip_grad_norm(ps, 1.0, &total), TG_ERR_INVALID);
    cr_expect(isinf(total));
    cr_expect_eq(get(tg_grad(tg_params_find(ps, "a")), 1), 2.0);
    tg_params_free(ps);
    tg_tape_free(tape);
    tg_error_clear();
}

/* ---- Initialisers */

Test(params, gains_and_fans_follow_torch)
{
    cr_expect_eq(tg_init_gain(TG_NONLIN_LINEAR, 0), 1.0);
    cr_expect_eq(tg_init_gain(TG_NONLIN_SIGMOID, 0), 1.0);
    cr_expect_eq(tg_init_gain(TG_NONLIN_TANH, 0), 5.0 / 3.0);
    cr_expect_eq(tg_init_gain(TG_NONLIN_RELU, 0), sqrt(2.0));
    cr_expect_eq(tg_init_gain(TG_NONLIN_LEAKY_RELU, 0.2), sqrt(2.0 / 1.04));
    tg_tensor *conv = tg_zeros(TG_F32, 4, (int64_t[]){4, 3, 2, 2});
    int64_t fi, fo;
    cr_assert_eq(tg_init_fans(conv, &fi, &fo), TG_OK);
    cr_expect(fi == 12 && fo == 16);
    tg_tensor *vec = tg_zeros(TG_F32, 1, (int64_t[]){5});
    cr_expect_eq(tg_init_fans(vec, &fi, &fo), TG_ERR_SHAPE);
    tg_rng rng;
    tg_rng_seed(&rng, 1);
    cr_expect_eq(tg_init_xavier_uniform(vec, &rng, 1.0), TG_ERR_SHAPE);
    tg_tensor *idx = tg_zeros(TG_I64, 2, (int64_t[]){2, 2});
    cr_expect_eq(tg_init_uniform(idx, &rng, 0, 1), TG_ERR_DTYPE);
    tg_tensor *m = tg_zeros(TG_F64, 2, (int64_t[]){3, 2});
    tg_tensor *mt = tg_transpose(m, 0, 1);
    cr_expect_eq(tg_init_normal(mt, &rng, 0, 1), TG_ERR_INVALID);
    cr_expect_eq(tg_init_constant(m, 0.5), TG_OK);
    cr_expect_eq(get(m, 5), 0.5);
    tg_tensor_release(conv);
    tg_tensor_release(vec);
    tg_tensor_release(idx);
    tg_tensor_release(mt);
    tg_tensor_release(m);
    tg_error_clear();
}

/* Empirical bound and std of each rule on a [256, 512] weight (fan_in 512,
 * fan_out 256): xavier std = g sqrt(2/768), kaiming(fan_in) std = g/sqrt(512). */
Test(params, initialisers_have_the_rules_spread_and_are_seeded)
{
    tg_rng rng;
    tg_rng_seed(&rng, 42);
    tg_tensor *w = tg_zeros(TG_F64, 2, (int64_t[]){256, 512});
    double relu = tg_init_gain(TG_NONLIN_RELU, 0);
    struct {
        int rule;
        double std;
        bool uniform;
    } cases[] = {{0, sqrt(2.0 / 768), true},
                 {1, sqrt(2.0 / 768), false},
                 {2, relu / sqrt(512.0), true},
                 {3, relu / sqrt(256.0), false}};
    for (int c = 0; c < 4; c++) {
        tg_status st = c == 0   ? tg_init_xavier_uniform(w, &rng, 1.0)
                       : c == 1 ? tg_init_xavier_normal(w, &rng, 1.0)
                       : c == 2 ? tg_init_kaiming_uniform(w, &rng, TG_FAN_IN, relu)
                                : tg_init_kaiming_normal(w, &rng, TG_FAN_OUT, relu);
        cr_assert_eq(st, TG_OK);
        const double *x = tg_tensor_data(w);
        double s = 0, ss = 0, mx = 0;
        for (int i = 0; i < 256 * 512; i++)
            s += x[i], ss += x[i] * x[i], mx = fmax(mx, fabs(x[i]));
        double mean = s / (256 * 512), std = sqrt(ss / (256 * 512) - mean * mean);
        cr_expect(fabs(std / cases[c].std - 1) < 0.02, "case %d: std %g want %g", c, std,
                  cases[c].std);
        cr_expect(fabs(mean) < 0.01 * cases[c].std * 10, "case %d: mean %g", c, mean);
        if (cases[c].uniform) cr_expect(mx <= sqrt(3.0) * cases[c].std, "case %d", c);
    }
    /* Same seed, same values; f32 gets the f64 draws rounded. */
    tg_tensor *a = tg_zeros(TG_F32, 2, (int64_t[]){3, 4}),
              *b = tg_zeros(TG_F64, 2, (int64_t[]){3, 4});
    tg_rng_seed(&rng, 7);
    tg_init_kaiming_uniform(a, &rng, TG_FAN_IN, 1.0);
    tg_rng_seed(&rng, 7);
    tg_init_kaiming_uniform(b, &rng, TG_FAN_IN, 1.0);
    for (int i = 0; i < 12; i++)
        cr_expect_eq(get(a, i), (double)(float)get(b, i));
    tg_tensor_release(a);
    tg_tensor_release(b);
    tg_tensor_release(w);
}

/* ---- Parameter files */

/* A model with every kind of entry, values from a seed, and an Adam
 * optimizer that has taken `steps` steps. */
static void model(uint64_t seed, int steps, tg_params **pso, tg_optim **opto)
{
    tg_params *ps = tg_params_new();
    tg_tensor *w = tg_params_add(ps, "fc.weight", TG_F32, 2, (int64_t[]){3, 4});
    tg_tensor *b = tg_params_add(ps, "fc.bias", TG_F64, 1, (int64_t[]){3});
    tg_tensor *s = tg_params_add(ps, "scale", TG_F32, 0, NULL);
    tg_tensor *rm = tg_params_add_buffer(ps, "bn.running_mean", TG_F32, 1, (int64_t[]){4});
    tg_tensor *cnt = tg_params_add_buffer(ps, "bn.count", TG_I64, 0, NULL);
    tg_rng rng;
    tg_rng_seed(&rng, seed);
    tg_init_xavier_normal(w, &rng, 1.0);
    tg_init_uniform(b, &rng, -1, 1);
    tg_init_uniform(s, &rng, 0.5, 2);
    tg_init_normal(rm, &rng, 0, 1);
    *(int64_t *)tg_tensor_data(cnt) = (int64_t)seed;
    tg_optim_opts o = tg_optim_defaults(TG_OPTIM_ADAM);
    o.amsgrad = true;
    tg_optim *opt = tg_optim_new(ps, &o);
    tg_tape *tape = tg_tape_new(NULL);
    tg_params_requires_grad(ps, tape);
    for (int k = 0; k < steps; k++) {
        tg_optim_zero_grad(opt);
        tg_scope_begin();
        tg_tensor *y = tg_add(tg_sum(tg_mul(tg_cast(w, TG_F64), tg_cast(w, TG_F64))),
                              tg_add(tg_sum(b), tg_cast(s, TG_F64)));
        cr_assert_eq(tg_backward(y), TG_OK, "%s", tg_last_error_message());
        tg_scope_end();
        tg_tape_reset(tape);
        cr_assert_eq(tg_optim_step(opt), TG_OK);
    }
    tg_tape_free(tape);
    *pso = ps;
    *opto = opt;
}

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    unsigned char *buf = malloc(*n + 1);
    cr_assert_eq(fread(buf, 1, *n, f), *n);
    fclose(f);
    return buf;
}

Test(params, a_round_trip_is_bitwise_identical, .init = make_tmpdir, .fini = remove_tmpdir)
{
    tg_params *ps, *qs;
    tg_optim *opt, *qopt;
    model(1, 3, &ps, &opt);
    tg_optim_set_lr(opt, 0.0125);
    cr_assert_eq(tg_params_save(ps, opt, tmp_path("a.safetensors")), TG_OK, "%s",
                 tg_last_error_message());
    cr_expect_eq(count_files(), 1, "no temporary file is left behind");
    const char *keep = getenv("TG_SAFETENSORS_KEEP");
    if (keep) cr_assert_eq(tg_params_save(ps, opt, keep), TG_OK);
    model(2, 1, &qs, &qopt); /* same structure, other values and state */
    cr_assert_eq(tg_params_load(qs, qopt, tmp_path("a.safetensors")), TG_OK, "%s",
                 tg_last_error_message());
    cr_expect_eq(tg_optim_lr(qopt), 0.0125);
    cr_expect_eq(tg_optim_step_count(qopt), 3);
    for (int i = 0; i < tg_params_count(ps); i++) {
        tg_tensor *x = tg_params_at(ps, i), *y = tg_params_at(qs, i);
        size_t n = (size_t)tg_tensor_numel(x) * tg_dtype_size(tg_tensor_dtype(x));
        cr_expect(memcmp(tg_tensor_data(x), tg_tensor_data(y), n) == 0, "%s differs",
                  tg_params_name(ps, i));
    }
    /* The optimizer state too: saving the loaded pair gives the same bytes. */
    cr_assert_eq(tg_params_save(qs, qopt, tmp_path("b.safetensors")), TG_OK);
    size_t na, nb;
    unsigned char *fa = slurp(tmp_path("a.safetensors"), &na);
    unsigned char *fb = slurp(tmp_path("b.safetensors"), &nb);
    cr_expect(na == nb && memcmp(fa, fb, na) == 0, "files differ");
    cr_expect_eq(*(uint64_t *)fa % 8, 0, "header padded to 8 bytes");
    free(fa);
    free(fb);
    /* Weights only from a training checkpoint: optim/ entries are ignored. */
    tg_params *rs;
    tg_optim *ropt;
    model(3, 0, &rs, &ropt);
    cr_expect_eq(tg_params_load(rs, NULL, tmp_path("a.safetensors")), TG_OK, "%s",
                 tg_last_error_message());
    cr_expect_eq(get(tg_params_find(rs, "bn.count"), 0), 1.0);
    tg_optim_free(ropt);
    tg_params_free(rs);
    tg_optim_free(qopt);
    tg_params_free(qs);
    tg_optim_free(opt);
    tg_params_free(ps);
}

/* tools/safetensors_numpy.py write: data in reverse header order, no
 * header padding, a zero-size tensor, an i64 0-d tensor. */
Test(params, a_file_written_by_numpy_loads)
{
    tg_params *ps = tg_params_new();
    tg_tensor *w = tg_params_add(ps, "fc.weight", TG_F32, 2, (int64_t[]){3, 4});
    tg_tensor *b = tg_params_add(ps, "fc.bias", TG_F64, 1, (int64_t[]){3});
    tg_tensor *c = tg_params_add_buffer(ps, "bn.count", TG_I64, 0, NULL);
    tg_tensor *big = tg_params_add_buffer(ps, "big", TG_I64, 2, (int64_t[]){2, 2});
    tg_params_add_buffer(ps, "empty", TG_F32, 2, (int64_t[]){0, 2});
    cr_assert_eq(tg_params_load(ps, NULL, GOLDEN_IO_DIR "/numpy_written.safetensors"), TG_OK, "%s",
                 tg_last_error_message());
    for (int i = 0; i < 12; i++)
        cr_expect_eq(get(w, i), i * 0.25 - 1);
    cr_expect(get(b, 0) == 0.5 && get(b, 1) == -1.5 && get(b, 2) == 2.25);
    cr_expect_eq(*(int64_t *)tg_tensor_data(c), 7);
    const int64_t *bv = tg_tensor_data(big);
    cr_expect(bv[0] == (1LL << 40) + 1 && bv[1] == -3 && bv[2] == (1LL << 62) &&
              bv[3] == -(1LL << 62));
    tg_params_free(ps);
}

/* ---- Corrupt files. The target set: a f32[2] = {1, 2}, b f64[3] = {3, 4, 5}
 * (8 + 24 = 32 bytes of data). Every failing load must leave it unchanged. */
static tg_params *target(void)
{
    tg_params *ps = tg_params_new();
    float *a = tg_tensor_data(tg_params_add(ps, "a", TG_F32, 1, (int64_t[]){2}));
    double *b = tg_tensor_data(tg_params_add(ps, "b", TG_F64, 1, (int64_t[]){3}));
    a[0] = 1, a[1] = 2, b[0] = 3, b[1] = 4, b[2] = 5;
    return ps;
}

static void expect_unchanged(tg_params *ps)
{
    float *a = tg_tensor_data(tg_params_find(ps, "a"));
    double *b = tg_tensor_data(tg_params_find(ps, "b"));
    cr_expect(a[0] == 1 && a[1] == 2 && b[0] == 3 && b[1] == 4 && b[2] == 5,
              "a failed load changed the parameters");
}

/* Writes header (length hlen, or its strlen if hlen is 0) and dlen bytes of
 * data, loads it into a fresh target, checks the target is unchanged on
 * failure; returns the status. */
static tg_status load_raw(const char *header, uint64_t hlen, size_t dlen)
{
    const char *path = tmp_path("corrupt.safetensors");
    FILE *f = fopen(path, "wb");
    uint64_t n = hlen ? hlen : strlen(header);
    unsigned char data[64];
    memset(data, 0x41, sizeof data);
    fwrite(&n, 8, 1, f);
    fwrite(header, 1, strlen(header), f);
    fwrite(data, 1, dlen, f);
    fclose(f);
    tg_params *ps = target();
    tg_status st = tg_params_load(ps, NULL, path);
    if (st) expect_unchanged(ps);
    tg_params_free(ps);
    return st;
}

#define A_OK "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"
#define B_OK "\"b\":{\"dtype\":\"F64\",\"shape\":[3],\"data_offsets\":[8,32]}"
#define B_AT(b, e) "\"b\":{\"dtype\":\"F64\",\"shape\":[3],\"data_offsets\":[" #b "," #e "]}"
#define EXPECT_LOAD(code, hdr, dlen, name)                                                         \
    do {                                                                                           \
        tg_status st_ = load_raw(hdr, 0, dlen);                                                    \
        cr_expect_eq(st_, code, "%s: got %s (%s)", hdr, tg_strerror(st_),                          \
                     tg_last_error_message());                                                     \
        if (name)                                                                                  \
            cr_expect(strstr(tg_last_error_message(), name) != NULL, "%s",                         \
                      tg_last_error_message());                                                    \
    } while (0)

Test(params, corrupt_files_fail_with_exact_codes_and_load_nothing, .init = make_tmpdir,
     .fini = remove_tmpdir)
{
    const char *none = NULL;
    EXPECT_LOAD(TG_OK, "{" A_OK "," B_OK "}", 32, none); /* the control */
    /* Sizes and the header length field. */
    FILE *f = fopen(tmp_path("short"), "wb");
    fwrite("\x10\0\0\0\0", 1, 5, f);
    fclose(f);
    tg_params *ps = target();
    cr_expect_eq(tg_params_load(ps, NULL, tmp_path("short")), TG_ERR_TRUNCATED);
    cr_expect_eq(tg_params_load(ps, NULL, tmp_path("missing")), TG_ERR_IO);
    expect_unchanged(ps);
    tg_params_free(ps);
    cr_expect_eq(load_raw("{" A_OK "," B_OK "}", 100000, 32), TG_ERR_HEADER);
    cr_expect(strstr(tg_last_error_message(), "larger than") != NULL);
    EXPECT_LOAD(TG_ERR_TRUNCATED, "{" A_OK "," B_OK "}", 20, "'b'");
    /* Header syntax. */
    EXPECT_LOAD(TG_ERR_HEADER, "{\"a\": ", 32, none);
    EXPECT_LOAD(TG_ERR_HEADER, "[1, 2]", 32, none);
    EXPECT_LOAD(TG_ERR_HEADER, "{" A_OK "," B_OK "," A_OK "}", 32, none); /* duplicate key */
    EXPECT_LOAD(TG_ERR_HEADER, "{" A_OK ",\"b\":{\"dtype\":\"F64\",\"data_offsets\":[8,32]}}", 32,
                "'b'");
    EXPECT_LOAD(TG_ERR_HEADER,
                "{" A_OK ",\"b\":{\"dtype\":\"F64\",\"shape\":[3],\"data_offsets\":"
                "[8.0,32]}}",
                32, "'b'");
    EXPECT_LOAD(TG_ERR_HEADER, "{" A_OK "," B_OK ",\"__metadata__\":{\"n\":1}}", 32, none);
    EXPECT_LOAD(TG_ERR_HEADER,
                "{" A_OK ",\"b\":{\"dtype\":\"F64\",\"shape\":[-3],"
                "\"data_offsets\":[8,32]}}",
                32, "'b'");
    /* Dtypes. */
    EXPECT_LOAD(TG_ERR_DTYPE,
                "{" A_OK ",\"b\":{\"dtype\":\"BF16\",\"shape\":[3],"
                "\"data_offsets\":[8,14]}}",
                14, "'b'");
    EXPECT_LOAD(TG_ERR_DTYPE,
                "{\"a\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]},"
                "\"b\":{\"dtype\":\"F64\",\"shape\":[3],\"data_offsets\":[16,40]}}",
                40, "'a'");
    /* Offsets. */
    EXPECT_LOAD(TG_ERR_OFFSETS, "{" A_OK "," B_AT(4, 28) "}", 28, "overlap");
    EXPECT_LOAD(TG_ERR_OFFSETS, "{" A_OK "," B_AT(40, 64) "}", 32, "outside");
    EXPECT_LOAD(TG_ERR_OFFSETS, "{" A_OK "," B_AT(16, 40) "}", 40, "belong to no tensor");
    EXPECT_LOAD(TG_ERR_OFFSETS, "{" A_OK "," B_OK "}", 40, "last 8 bytes");
    EXPECT_LOAD(TG_ERR_OFFSETS, "{" A_OK "," B_AT(8, 24) "}", 24, "'b'"); /* size mismatch */
    EXPECT_LOAD(TG_ERR_OFFSETS, "{" A_OK "," B_AT(32, 8) "}", 32, "'b'"); /* begin > end */
    EXPECT_LOAD(TG_ERR_OFFSETS, "{" A_OK "," B_AT(-8, 16) "}", 32, "'b'");
    /* Names and shapes against the parameter set. */
    EXPECT_LOAD(TG_ERR_NOT_FOUND, "{" A_OK "}", 8, "'b'");
    EXPECT_LOAD(TG_ERR_EXTRA,
                "{" A_OK "," B_OK ",\"c\":{\"dtype\":\"I64\",\"shape\":[],"
                "\"data_offsets\":[32,40]}}",
                40, "'c'");
    EXPECT_LOAD(TG_ERR_SHAPE,
                "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[0,8]}," B_OK "}", 32,
                "'a'");
    tg_error_clear();
}

Test(params, optimizer_state_must_match_the_optimizer, .init = make_tmpdir, .fini = remove_tmpdir)
{
    tg_params *ps = target();
    tg_optim_opts o = tg_optim_defaults(TG_OPTIM_SGD);
    o.momentum = 0.9;
    tg_optim *sgd = tg_optim_new(ps, &o);
    tg_optim *adam = tg_optim_new(ps, NULL);
    cr_assert_eq(tg_params_save(ps, sgd, tmp_path("sgd")), TG_OK);
    cr_assert_eq(tg_params_save(ps, NULL, tmp_path("plain")), TG_OK);
    tg_optim_free(adam);
    o = tg_optim_defaults(TG_OPTIM_ADAM);
    adam = tg_optim_new(ps, &o);
    cr_expect_eq(tg_params_load(ps, adam, tmp_path("sgd")), TG_ERR_INVALID);
    cr_expect_eq(tg_params_load(ps, sgd, tmp_path("plain")), TG_ERR_NOT_FOUND);
    cr_expect_eq(tg_params_load(ps, NULL, tmp_path("sgd")), TG_OK);
    cr_expect_eq(tg_params_load(ps, sgd, tmp_path("sgd")), TG_OK);
    tg_params *other = target();
    cr_expect_eq(tg_params_load(other, sgd, tmp_path("sgd")), TG_ERR_INVALID);
    expect_unchanged(ps);
    tg_params_free(other);
    tg_optim_free(sgd);
    tg_optim_free(adam);
    tg_params_free(ps);
    tg_error_clear();
}

/* Saving goes through a temporary file and a rename: a save that fails
 * leaves what was there and no temporary behind. */
Test(params, saves_are_atomic_and_replace_the_file, .init = make_tmpdir, .fini = remove_tmpdir)
{
    tg_params *ps = target();
    const char *path = tmp_path("m.safetensors");
    cr_assert_eq(tg_params_save(ps, NULL, path), TG_OK);
    size_t n1, n2;
    free(slurp(path, &n1));
    tg_params_add(ps, "c", TG_F64, 1, (int64_t[]){100});
    cr_assert_eq(tg_params_save(ps, NULL, path), TG_OK);
    free(slurp(path, &n2));
    cr_expect_gt(n2, n1, "the second save replaced the first");
    cr_assert_eq(mkdir(tmp_path("dir"), 0755), 0);
    cr_expect_eq(tg_params_save(ps, NULL, tmp_path("dir")), TG_ERR_IO);
    struct stat sb;
    cr_expect(stat(tmp_path("dir"), &sb) == 0 && S_ISDIR(sb.st_mode));
    cr_expect_eq(count_files(), 2, "no temporary file is left behind");
    cr_expect_eq(tg_params_save(ps, NULL, tmp_path("no/such/dir.safetensors")), TG_ERR_IO);
    cr_expect(strstr(tg_last_error_message(), "no/such") != NULL);
    cr_expect_eq(count_files(), 2);
    tg_params_free(ps);
    tg_error_clear();
}

/* Writes buf (n bytes) to path. */
static void spit(const char *path, const unsigned char *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(buf, 1, n, f), n);
    fclose(f);
}

/* In a saved file's bytes: the data of tensor name (8 bytes). */
static unsigned char *tensor_bytes(unsigned char *buf, const char *name)
{
    char key[128];
    snprintf(key, sizeof key, "\"%s\":", name);
    char *h = strstr((char *)buf + 8, key);
    cr_assert_not_null(h, "%s", name);
    unsigned long long begin = 0;
    cr_assert_eq(sscanf(strstr(h, "\"data_offsets\":[") + 16, "%llu", &begin), 1);
    uint64_t hlen = 0;
    for (int b = 0; b < 8; b++) hlen |= (uint64_t)buf[b] << (8 * b);
    return buf + 8 + hlen + begin;
}

/* Issue 15 items 4 and 5: a file's lr is checked as tg_optim_set_lr checks
 * it, and its step counts must be in [0, 2^53]: each bad file fails with
 * TG_ERR_HEADER naming the value, and the optimizer keeps its state. */
Test(params, optimizer_lr_and_step_counts_in_a_file_are_validated, .init = make_tmpdir,
     .fini = remove_tmpdir)
{
    tg_params *ps, *qs;
    tg_optim *opt, *qopt;
    model(1, 2, &ps, &opt);
    model(2, 1, &qs, &qopt);
    cr_assert_eq(tg_params_save(ps, opt, tmp_path("a")), TG_OK, "%s", tg_last_error_message());
    size_t n;
    unsigned char *good = slurp(tmp_path("a"), &n), *buf = malloc(n);
    static const char *const lrs[] = {"inf", "nan", "-1", "1e999"};
    for (int k = 0; k < 4; k++) {
        memcpy(buf, good, n);
        char *v = strstr((char *)buf + 8, "\"optim.lr\":\"") + 12;
        size_t len = (size_t)(strchr(v, '"') - v); /* "0.001": room for each */
        cr_assert_geq(len, strlen(lrs[k]));
        memset(v, ' ', len + 1);
        memcpy(v, lrs[k], strlen(lrs[k]));
        v[strlen(lrs[k])] = '"';
        spit(tmp_path("b"), buf, n);
        cr_expect_eq(tg_params_load(qs, qopt, tmp_path("b")), TG_ERR_HEADER, "lr %s", lrs[k]);
        cr_expect(strstr(tg_last_error_message(), "\"optim.lr\" is missing or not a finite "
                                                  "number >= 0"), "%s", tg_last_error_message());
        cr_expect_eq(tg_optim_lr(qopt), tg_optim_defaults(TG_OPTIM_ADAM).lr);
    }
    static const struct { const char *name; int64_t v; const char *needle; } steps[] = {
        {"optim/steps", INT64_MAX, "step count 9223372036854775807, outside [0, 2^53]"},
        {"optim/steps", -1, "'optim/steps' holds step count -1"},
        {"optim/step/fc.weight", -5, "'optim/step/fc.weight' holds step count -5"},
        {"optim/step/fc.bias", ((int64_t)1 << 53) + 1, "9007199254740993"},
    };
    for (int k = 0; k < 4; k++) {
        memcpy(buf, good, n);
        unsigned char *p = tensor_bytes(buf, steps[k].name);
        for (int b = 0; b < 8; b++) p[b] = (unsigned char)((uint64_t)steps[k].v >> (8 * b));
        spit(tmp_path("b"), buf, n);
        cr_expect_eq(tg_params_load(qs, qopt, tmp_path("b")), TG_ERR_HEADER, "%s", steps[k].name);
        cr_expect(strstr(tg_last_error_message(), steps[k].needle), "%s", tg_last_error_message());
        cr_expect_eq(tg_optim_step_count(qopt), 1);
    }
    /* The largest allowed count loads and steps on. */
    memcpy(buf, good, n);
    unsigned char *p = tensor_bytes(buf, "optim/steps");
    for (int b = 0; b < 8; b++) p[b] = (unsigned char)((uint64_t)TG_OPTIM_MAX_STEPS >> (8 * b));
    spit(tmp_path("b"), buf, n);
    cr_expect_eq(tg_params_load(qs, qopt, tmp_path("b")), TG_OK, "%s", tg_last_error_message());
    cr_expect_eq(tg_optim_step_count(qopt), TG_OPTIM_MAX_STEPS);
    free(good);
    free(buf);
    tg_optim_free(opt);
    tg_optim_free(qopt);
    tg_params_free(ps);
    tg_params_free(qs);
    tg_error_clear();
}

/* Item 15: only regular files are read: a FIFO no longer blocks, and
 * /dev/zero is not "truncated". */
Test(params, loading_a_fifo_or_a_device_fails_at_once, .init = make_tmpdir, .fini = remove_tmpdir)
{
    tg_params *ps = target();
    cr_assert_eq(mkfifo(tmp_path("fifo"), 0600), 0);
    cr_expect_eq(tg_params_load(ps, NULL, tmp_path("fifo")), TG_ERR_IO);
    cr_expect(strstr(tg_last_error_message(), "not a regular file (a FIFO)"), "%s",
              tg_last_error_message());
    cr_expect_eq(tg_params_load(ps, NULL, "/dev/zero"), TG_ERR_IO);
    cr_expect(strstr(tg_last_error_message(), "'/dev/zero': not a regular file (a character "
                                              "device)"), "%s", tg_last_error_message());
    cr_expect_eq(tg_params_load(ps, NULL, "/"), TG_ERR_IO);
    cr_expect(strstr(tg_last_error_message(), "(a directory)"), "%s", tg_last_error_message());
    expect_unchanged(ps);
    tg_params_free(ps);
    tg_error_clear();
}
