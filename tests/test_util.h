/* test_util.h - helpers shared by the test files (tests/test_util.c,
 * linked into every test executable). Public API only, like the tests.
 *
 * Values are compared as |got - want| <= tol * max(1, |want|) everywhere
 * (a relative tolerance with a floor at magnitude 1); a NaN or infinite
 * expected value must be matched exactly. Every helper fails the running
 * Criterion test (cr_assert) with a message naming what went wrong. */
#ifndef TG_TEST_UTIL_H
#define TG_TEST_UTIL_H

#include <criterion/criterion.h>
#include <tapegrad.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Literals: SHAPE(2, 3) is a const int64_t[], VALS(...) a const double[],
 * DIMS(...) a const int[]; the N* forms count their arguments. */
#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define NSHAPE(...) ((int)(sizeof(SHAPE(__VA_ARGS__)) / sizeof(int64_t)))
#define VALS(...) ((const double[]){__VA_ARGS__})
#define NVALS(...) ((int64_t)(sizeof(VALS(__VA_ARGS__)) / sizeof(double)))
#define DIMS(...) ((const int[]){__VA_ARGS__})
#define NDIMS(...) ((int)(sizeof(DIMS(__VA_ARGS__)) / sizeof(int)))

/* ---- Making tensors (on the current default backend). */

/* A new f64 vector of n values. */
tg_tensor *tu_vec(int64_t n, const double *v);
/* A tensor of dtype dt and the given shape holding v (row-major, numel
 * values), each converted to dt as C converts a double. */
tg_tensor *tu_tensor(tg_dtype dt, int ndim, const int64_t *shape, const double *v);
/* As tu_tensor, and the literal must hold exactly numel values (n). */
tg_tensor *tu_tensor_n(tg_dtype dt, int ndim, const int64_t *shape, const double *v, int64_t n);
/* Tensor literals: T64((2, 2), 1, 2, 3, 4); TS(dtype, (shape...), values...). */
#define TS(dt, shp, ...)                                                                           \
    tu_tensor_n((dt), NSHAPE shp, SHAPE shp, VALS(__VA_ARGS__), NVALS(__VA_ARGS__))
#define T64(shp, ...) TS(TG_F64, shp, __VA_ARGS__)
#define T32(shp, ...) TS(TG_F32, shp, __VA_ARGS__)
#define I64(shp, ...) TS(TG_I64, shp, __VA_ARGS__)

/* The value of a one-element tensor. */
double tu_item(const tg_tensor *t);
/* Every element of t (any layout) as doubles, row-major; caller frees. */
double *tu_values(const tg_tensor *t);

static inline bool tu_is_float(tg_dtype dt)
{
    return dt == TG_F32 || dt == TG_F64;
}

/* Releases t[0..n) and sets each to NULL (NULL entries are fine). */
void tu_release_all(tg_tensor **t, int n);

/* ---- Checking tensors. */

/* numel == n and every element within tol of want (see the top). */
void tu_expect_values(const tg_tensor *t, const double *want, int64_t n, double tol);
/* ndim and every extent; line (0: none) is put in the message. */
void tu_expect_shape_at(int line, const tg_tensor *t, int ndim, const int64_t *shape);
#define tu_expect_shape(t, ndim, shape) tu_expect_shape_at(__LINE__, (t), (ndim), (shape))
/* Shape, backend (tu_cur) and values, for the checks run by
 * tu_on_both_backends; line names the caller. */
void tu_expect_tensor(int line, const tg_tensor *t, int ndim, const int64_t *shape,
                      const double *want, int64_t n, double tol);
/* EXPECT(t, (shape...), tol, values...); EXPECT0 for a 0-d result. */
#define EXPECT(t, shp, tol, ...)                                                                   \
    tu_expect_tensor(__LINE__, (t), NSHAPE shp, SHAPE shp, VALS(__VA_ARGS__), NVALS(__VA_ARGS__),  \
                     (tol))
#define EXPECT0(t, tol, v) tu_expect_tensor(__LINE__, (t), 0, NULL, VALS(v), 1, (tol))
/* The last error's message contains needle. */
void tu_expect_message_has(const char *needle);

/* ---- Running checks. */

/* Backend of the check tu_on_both_backends is running. */
extern tg_backend tu_cur;
/* Runs check on ref and on cpu (tu_cur and the default backend set to
 * each), each in its own scope: nothing may leak and no error may be left
 * behind. */
void tu_on_both_backends(void (*check)(void));

/* Suite .init / .fini: clear the last error and open a scope; close it. */
void tu_scope_setup(void);
void tu_scope_teardown(void);

/* Tensor storage is back at mem0 and, in AddressSanitizer builds,
 * LeakSanitizer finds nothing unreachable (Criterion does not fail a test
 * for a leak reported when its worker exits, so the check runs now). */
void tu_expect_no_leaks(size_t mem0);

/* ---- The op registry: the only list of ops. */

/* Tests that need "every op" walk the registry (tg_op_count / tg_op_at)
 * and pick their subset with one of these filters, never a list of names.
 * What the registry holds is pinned by docs/ops.md, which the ops_md test
 * compares with `tapegrad ops --markdown`: an op that goes, or changes its
 * mark, cost, saves or flags, fails that test. */
typedef bool (*tu_op_filter)(const tg_op *op);
bool tu_op_has_backward(const tg_op *op);         /* TG_AD_BACKWARD */
bool tu_op_is_nondifferentiable(const tg_op *op); /* TG_AD_NONDIFFERENTIABLE */
bool tu_op_is_unmarked(const tg_op *op);          /* TG_AD_UNMARKED */
bool tu_op_has_sample(const tg_op *op);           /* gradcheck cases */
/* Number of entries passing filter. */
int tu_count_ops(tu_op_filter filter);

#endif
