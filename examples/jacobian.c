/* jacobian.c - the Jacobian of a small vector function, f: R^3 -> R^3,
 * spherical to Cartesian coordinates (r, theta, phi) ->
 * (r sin(theta) cos(phi), r sin(theta) sin(phi), r cos(theta)), by
 * tg_jacobian (one reverse sweep per output) and one column of it by
 * tg_jvp (two sweeps, any direction), both checked against the closed
 * form; its determinant is r^2 sin(theta). Exits 1 on a mismatch. */
#include <math.h>
#include <stdio.h>

#include <tapegrad.h>

static tg_tensor *spherical(void *ud, int n, tg_tensor *const *x)
{
    (void)ud;
    (void)n;
    tg_tensor *r = tg_narrow(x[0], 0, 0, 1), *t = tg_narrow(x[0], 0, 1, 1),
              *p = tg_narrow(x[0], 0, 2, 1);
    tg_tensor *rs = tg_mul(r, tg_sin(t));
    tg_tensor *parts[3] = {tg_mul(rs, tg_cos(p)), tg_mul(rs, tg_sin(p)), tg_mul(r, tg_cos(t))};
    return tg_concat(3, parts, 0);
}

int main(void)
{
    const double r = 2.0, t = 0.7, p = -1.2;
    tg_scope_begin();
    tg_tensor *x = tg_tensor_from_data(TG_F64, 1, (int64_t[]){3}, (double[]){r, t, p});
    tg_tensor *jac, *col, *y;
    if (tg_jacobian(spherical, NULL, 1, &x, &jac) != TG_OK) goto fail;
    const double want[9] = {
        sin(t) * cos(p), r * cos(t) * cos(p), -r * sin(t) * sin(p),
        sin(t) * sin(p), r * cos(t) * sin(p), r * sin(t) * cos(p),
        cos(t),          -r * sin(t),         0.0,
    };
    const double *J = tg_tensor_data(jac);
    double err = 0;
    printf("J = d(x, y, z) / d(r, theta, phi) at (%g, %g, %g):\n", r, t, p);
    for (int i = 0; i < 3; i++) {
        printf("  [% .6f % .6f % .6f]\n", J[3 * i], J[3 * i + 1], J[3 * i + 2]);
        for (int k = 0; k < 3; k++) err = fmax(err, fabs(J[3 * i + k] - want[3 * i + k]));
    }
    double det = J[0] * (J[4] * J[8] - J[5] * J[7]) - J[1] * (J[3] * J[8] - J[5] * J[6]) +
                 J[2] * (J[3] * J[7] - J[4] * J[6]);
    printf("det J = %.12f (r^2 sin(theta) = %.12f)\n", det, r * r * sin(t));
    /* the theta column, J e_theta, by forward mode */
    tg_tensor *e = tg_tensor_from_data(TG_F64, 1, (int64_t[]){3}, (double[]){0, 1, 0});
    if (tg_jvp(spherical, NULL, 1, &x, &e, &y, &col) != TG_OK) goto fail;
    const double *c = tg_tensor_data(col);
    for (int i = 0; i < 3; i++) err = fmax(err, fabs(c[i] - want[3 * i + 1]));
    printf("J e_theta by tg_jvp = [% .6f % .6f % .6f]\n", c[0], c[1], c[2]);
    err = fmax(err, fabs(det - r * r * sin(t)));
    printf("max error against the closed form: %.2e\n", err);
    tg_scope_end();
    return err < 1e-12 ? 0 : 1;
fail:
    fprintf(stderr, "jacobian: %s (%s)\n", tg_strerror(tg_last_error()), tg_last_error_message());
    tg_scope_end();
    return 1;
}
