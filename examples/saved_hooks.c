/* saved_hooks.c - saved-tensor hooks: what a small f64 MLP keeps for
 * backward is packed when each op is recorded and unpacked when backward
 * starts, two ways:
 *  - into a temporary file (the tape keeps only a file offset): gradients
 *    bitwise equal to the plain run;
 *  - compressed to f32 (half the bytes): gradients within f32 rounding.
 * Prints the bytes the tape kept each way and the gradient differences;
 * exits 1 if the file-backed gradients differ at all or the f32 ones by
 * more than 1e-5 relative. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tapegrad.h>

#define NPARAM 6

/* ---- packing into a temporary file */
typedef struct {
    FILE *f;
    size_t bytes; /* written so far */
} spill;

typedef struct {
    long offset;
    int ndim;
    int64_t shape[TG_MAX_DIMS];
    int64_t numel;
} spilled;

static tg_status spill_pack(tg_tensor *saved, void **packed, void *ud)
{
    spill *sp = ud;
    spilled *h = malloc(sizeof *h);
    if (!h) return tg_error_set(TG_ERR_NOMEM, "out of memory for a spill handle");
    h->ndim = tg_tensor_ndim(saved);
    memcpy(h->shape, tg_tensor_shape(saved), (size_t)h->ndim * sizeof(int64_t));
    h->numel = tg_tensor_numel(saved);
    h->offset = (long)sp->bytes;
    double *buf = malloc((size_t)h->numel * sizeof *buf + 1);
    if (!buf || tg_tensor_copy_out(saved, buf, (size_t)h->numel * sizeof *buf) ||
        fseek(sp->f, h->offset, SEEK_SET) ||
        fwrite(buf, sizeof *buf, (size_t)h->numel, sp->f) != (size_t)h->numel) {
        free(buf);
        free(h);
        return tg_error_set(TG_ERR_IO, "could not spill a saved tensor");
    }
    free(buf);
    sp->bytes += (size_t)h->numel * sizeof(double);
    *packed = h;
    return TG_OK;
}

static void spill_free(void *packed, void *ud)
{
    (void)ud;
    free(packed);
}

static tg_tensor *spill_unpack(void *packed, void *ud)
{
    spill *sp = ud;
    spilled *h = packed;
    tg_tensor *t = tg_zeros(TG_F64, h->ndim, h->shape);
    if (!t) return NULL;
    if (fseek(sp->f, h->offset, SEEK_SET) ||
        fread(tg_tensor_data(t), sizeof(double), (size_t)h->numel, sp->f) != (size_t)h->numel) {
        tg_error_set(TG_ERR_IO, "could not read a spilled tensor back");
        return NULL;
    }
    return t; /* made in the hook's scope: the tape takes its own reference */
}

/* ---- packing as f32 */
static tg_status f32_pack(tg_tensor *saved, void **packed, void *ud)
{
    size_t *bytes = ud;
    tg_tensor *c = tg_cast(saved, TG_F32);
    if (!c) return tg_last_error();
    *bytes += (size_t)tg_tensor_numel(c) * sizeof(float);
    *packed = tg_scope_keep(c); /* outlives the hook's scope */
    return TG_OK;
}

static tg_tensor *f32_unpack(void *packed, void *ud)
{
    (void)ud;
    return tg_cast(packed, TG_F64);
}

static void release_packed(void *packed, void *ud)
{
    (void)ud;
    tg_tensor_release(packed);
}

/* ---- the model: 16-32-32-1 tanh MLP (W, b per layer), MSE on a fixed batch of 64 */
static tg_tensor *loss_of(tg_tensor *const *p, tg_tensor *x, tg_tensor *y)
{
    tg_tensor *h = tg_tanh(tg_affine(x, p[0], p[1]));
    h = tg_tanh(tg_affine(h, p[2], p[3]));
    tg_tensor *d = tg_sub(tg_affine(h, p[4], p[5]), y);
    return tg_mean(tg_mul(d, d));
}

/* mode 0 plain, 1 spilled to a file, 2 f32. Gradients into g (numel each). */
static int run(int mode, tg_tensor *const *p, tg_tensor *x, tg_tensor *y, double **g,
               size_t *kept, size_t *packed)
{
    tg_tape *tape = tg_tape_new(NULL);
    spill sp = {0};
    size_t f32_bytes = 0;
    if (mode == 1) {
        sp.f = tmpfile();
        if (!sp.f || tg_tape_set_saved_hooks(tape, spill_pack, spill_unpack, spill_free, &sp)) return 1;
    } else if (mode == 2) {
        if (tg_tape_set_saved_hooks(tape, f32_pack, f32_unpack, release_packed, &f32_bytes))
            return 1;
    }
    for (int i = 0; i < NPARAM; i++) {
        tg_grad_zero(p[i]);
        if (tg_requires_grad(tape, p[i])) return 1;
    }
    tg_scope_begin();
    tg_tensor *loss = loss_of(p, x, y);
    *kept = tg_tape_saved_bytes(tape);
    *packed = sp.bytes + f32_bytes;
    int rc = !loss || tg_backward(loss);
    for (int i = 0; i < NPARAM && !rc; i++)
        rc = tg_tensor_copy_out(tg_grad(p[i]), g[i], (size_t)tg_tensor_numel(p[i]) * sizeof(double));
    tg_scope_end();
    if (rc) fprintf(stderr, "saved_hooks: %s\n", tg_last_error_message());
    tg_tape_free(tape);
    if (sp.f) fclose(sp.f);
    return rc;
}

int main(void)
{
    tg_rng rng;
    tg_rng_seed(&rng, 7);
    const int64_t shapes[NPARAM][2] = {{32, 16}, {32}, {32, 32}, {32}, {1, 32}, {1}};
    tg_tensor *p[NPARAM];
    for (int i = 0; i < NPARAM; i++)
        p[i] = tg_rand_uniform(&rng, TG_F64, i % 2 ? 1 : 2, shapes[i], -0.4, 0.4);
    tg_tensor *x = tg_rand_normal(&rng, TG_F64, 2, (int64_t[]){64, 16}, 0.0, 1.0);
    tg_tensor *y = tg_rand_normal(&rng, TG_F64, 2, (int64_t[]){64, 1}, 0.0, 1.0);
    double *g[3][NPARAM];
    size_t kept[3], packed[3];
    int rc = 0;
    for (int m = 0; m < 3; m++)
        for (int i = 0; i < NPARAM; i++)
            g[m][i] = malloc((size_t)tg_tensor_numel(p[i]) * sizeof(double));
    for (int m = 0; m < 3 && !rc; m++) rc = run(m, p, x, y, g[m], &kept[m], &packed[m]);
    if (!rc) {
        double diff_file = 0, rel_f32 = 0;
        for (int i = 0; i < NPARAM; i++)
            for (int64_t k = 0; k < tg_tensor_numel(p[i]); k++) {
                diff_file = fmax(diff_file, fabs(g[1][i][k] - g[0][i][k]));
                rel_f32 = fmax(rel_f32, fabs(g[2][i][k] - g[0][i][k]) / (fabs(g[0][i][k]) + 1e-3));
            }
        printf("plain:      tape keeps %6zu bytes\n", kept[0]);
        printf("temp file:  tape keeps %6zu bytes, the file %6zu; max |grad diff| %g\n", kept[1],
               packed[1], diff_file);
        printf("f32 packed: tape keeps %6zu bytes, the hooks %6zu; max relative grad diff %.2e\n",
               kept[2], packed[2], rel_f32);
        rc = diff_file != 0 || !(rel_f32 < 1e-5);
        printf("%s\n", rc ? "FAILED" : "ok: file-backed gradients bitwise equal, f32 within 1e-5");
    }
    for (int m = 0; m < 3; m++)
        for (int i = 0; i < NPARAM; i++) free(g[m][i]);
    for (int i = 0; i < NPARAM; i++) tg_tensor_release(p[i]);
    tg_tensor_release(x);
    tg_tensor_release(y);
    return rc;
}
