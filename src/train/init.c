/* Weight initialisers (torch.nn.init's formulas) from the seeded generator.
 * Every sample is drawn in f64, in row-major order, then rounded to the
 * tensor's dtype, exactly as tg_rand_uniform / tg_rand_normal do. */
#include <math.h>

#include "core/internal.h"

double tg_init_gain(tg_nonlinearity nonlinearity, double param)
{
    switch (nonlinearity) {
    case TG_NONLIN_TANH:
        return 5.0 / 3.0;
    case TG_NONLIN_RELU:
        return sqrt(2.0);
    case TG_NONLIN_LEAKY_RELU:
        return sqrt(2.0 / (1.0 + param * param));
    case TG_NONLIN_LINEAR:
    case TG_NONLIN_SIGMOID:
    default:
        return 1.0;
    }
}

tg_status tg_init_fans(const tg_tensor *t, int64_t *fan_in, int64_t *fan_out)
{
    if (!t) return tg__err_null("init_fans", 1);
    if (t->ndim < 2) {
        char s[96];
        return tg__err(TG_ERR_SHAPE,
                       "bad argument #1 to 'init_fans' (shape %s: fans need at "
                       "least 2 dims [out, in, ...])",
                       tg_shape_str(t->ndim, t->shape, s, sizeof s));
    }
    int64_t rf = 1;
    for (int i = 2; i < t->ndim; i++)
        rf *= t->shape[i];
    if (fan_in) *fan_in = t->shape[1] * rf;
    if (fan_out) *fan_out = t->shape[0] * rf;
    return TG_OK;
}

/* Checks that t can be filled in place; returns its data or NULL. */
static void *fill_target(tg_tensor *t, const char *op)
{
    if (!t) {
        tg__err_null(op, 1);
        return NULL;
    }
    if (!tg__is_float(t->dtype)) {
        tg__err(TG_ERR_DTYPE, "bad argument #1 to '%s' (%s tensor; initialisers need f32/f64)", op,
                tg_dtype_name(t->dtype));
        return NULL;
    }
    if (!t->contiguous) {
        tg__err(TG_ERR_INVALID, "bad argument #1 to '%s' (tensor is a strided view)", op);
        return NULL;
    }
    tg__tensor_written(t);
    return tg__tensor_ptr(t);
}

static void store(tg_tensor *t, void *p, int64_t i, double v)
{
    if (t->dtype == TG_F32)
        ((float *)p)[i] = (float)v;
    else
        ((double *)p)[i] = v;
}

/* normal: mean a, std b; else U(a, b). */
static tg_status fill(tg_tensor *t, const char *op, tg_rng *rng, double a, double b, bool normal)
{
    void *p = fill_target(t, op);
    if (!p) return tg_last_error();
    if (!rng) return tg__err(TG_ERR_NULL, "bad argument #2 to '%s' (NULL generator)", op);
    if (!isfinite(a) || !isfinite(b))
        return tg__err(TG_ERR_INVALID, "bad argument to '%s' (non-finite bound %g, %g)", op, a, b);
    for (int64_t i = 0; i < t->numel; i++)
        store(t, p, i, normal ? a + b * tg_rng_gauss(rng) : a + (b - a) * tg_rng_double(rng));
    return TG_OK;
}

tg_status tg_init_constant(tg_tensor *t, double value)
{
    void *p = fill_target(t, "init_constant");
    if (!p) return tg_last_error();
    for (int64_t i = 0; i < t->numel; i++)
        store(t, p, i, value);
    return TG_OK;
}

tg_status tg_init_zeros(tg_tensor *t)
{
    return tg_init_constant(t, 0.0);
}

tg_status tg_init_uniform(tg_tensor *t, tg_rng *rng, double lo, double hi)
{
    return fill(t, "init_uniform", rng, lo, hi, false);
}

tg_status tg_init_normal(tg_tensor *t, tg_rng *rng, double mean, double std)
{
    return fill(t, "init_normal", rng, mean, std, true);
}

/* std of the Glorot or He rule for t; -1 with the error set. Zero-element
 * tensors get 0 (nothing is drawn), as torch.nn.init treats them as no-ops. */
static double rule_std(tg_tensor *t, const char *op, bool xavier, tg_fan_mode mode, double gain)
{
    if (!fill_target(t, op)) return -1.0;
    int64_t fin, fout;
    if (tg_init_fans(t, &fin, &fout)) return -1.0;
    if (t->numel == 0) return 0.0;
    if (!isfinite(gain) || gain < 0.0) {
        tg__err(TG_ERR_INVALID, "bad argument #3 to '%s' (gain %g)", op, gain);
        return -1.0;
    }
    if (xavier) return gain * sqrt(2.0 / (double)(fin + fout));
    if (mode != TG_FAN_IN && mode != TG_FAN_OUT) {
        tg__err(TG_ERR_INVALID, "bad argument #3 to '%s' (fan mode %d)", op, (int)mode);
        return -1.0;
    }
    return gain / sqrt((double)(mode == TG_FAN_IN ? fin : fout));
}

tg_status tg_init_xavier_uniform(tg_tensor *t, tg_rng *rng, double gain)
{
    double std = rule_std(t, "init_xavier_uniform", true, TG_FAN_IN, gain);
    if (std < 0.0) return tg_last_error();
    double a = sqrt(3.0) * std;
    return fill(t, "init_xavier_uniform", rng, -a, a, false);
}

tg_status tg_init_xavier_normal(tg_tensor *t, tg_rng *rng, double gain)
{
    double std = rule_std(t, "init_xavier_normal", true, TG_FAN_IN, gain);
    if (std < 0.0) return tg_last_error();
    return fill(t, "init_xavier_normal", rng, 0.0, std, true);
}

tg_status tg_init_kaiming_uniform(tg_tensor *t, tg_rng *rng, tg_fan_mode mode, double gain)
{
    double std = rule_std(t, "init_kaiming_uniform", false, mode, gain);
    if (std < 0.0) return tg_last_error();
    double a = sqrt(3.0) * std;
    return fill(t, "init_kaiming_uniform", rng, -a, a, false);
}

tg_status tg_init_kaiming_normal(tg_tensor *t, tg_rng *rng, tg_fan_mode mode, double gain)
{
    double std = rule_std(t, "init_kaiming_normal", false, mode, gain);
    if (std < 0.0) return tg_last_error();
    return fill(t, "init_kaiming_normal", rng, 0.0, std, true);
}
