/* test_util.c - helpers shared by the test files; see test_util.h. */
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define TU_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TU_LSAN 1
#endif
#endif
#ifdef TU_LSAN
#include <sanitizer/lsan_interface.h>
#endif

tg_backend tu_cur = TG_BACKEND_CPU;

tg_tensor *tu_vec(int64_t n, const double *v)
{
    tg_tensor *t = tg_tensor_from_data(TG_F64, 1, &n, v);
    cr_assert_not_null(t, "%s", tg_last_error_message());
    return t;
}

static int64_t numel_of(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

tg_tensor *tu_tensor(tg_dtype dt, int ndim, const int64_t *shape, const double *v)
{
    int64_t n = numel_of(ndim, shape);
    tg_tensor *t = tg_zeros(dt, ndim, shape);
    cr_assert_not_null(t, "%s", tg_last_error_message());
    void *p = tg_tensor_data(t);
    for (int64_t i = 0; i < n; i++) {
        switch (dt) {
        case TG_F32:
            ((float *)p)[i] = (float)v[i];
            break;
        case TG_F64:
            ((double *)p)[i] = v[i];
            break;
        case TG_I64:
            ((int64_t *)p)[i] = (int64_t)v[i];
            break;
        }
    }
    return t;
}

tg_tensor *tu_tensor_n(tg_dtype dt, int ndim, const int64_t *shape, const double *v, int64_t n)
{
    int64_t numel = numel_of(ndim, shape);
    cr_assert_eq(numel, n, "literal has %lld values for %lld elements", (long long)n,
                 (long long)numel);
    return tu_tensor(dt, ndim, shape, v);
}

double tu_item(const tg_tensor *t)
{
    double v = NAN;
    cr_assert_eq(tg_tensor_item(t, &v), TG_OK, "[%s] %s", tg_backend_name(tg_default_backend()),
                 tg_last_error_message());
    return v;
}

double *tu_values(const tg_tensor *t)
{
    cr_assert_not_null(t, "tensor is NULL (%s)", tg_last_error_message());
    int64_t n = tg_tensor_numel(t);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    cr_assert_not_null(v);
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(tg_tensor_get(t, i, &v[i]), TG_OK, "get(%lld): %s", (long long)i,
                     tg_last_error_message());
    return v;
}

void tu_release_all(tg_tensor **t, int n)
{
    for (int i = 0; i < n; i++) {
        tg_tensor_release(t[i]);
        t[i] = NULL;
    }
}

/* One element against its expected value: tolerance as in the header. */
static bool close_to(double v, double want, double tol)
{
    if (isnan(want)) return isnan(v);
    if (isinf(want)) return v == want;
    double scale = fabs(want) > 1.0 ? fabs(want) : 1.0;
    return fabs(v - want) <= tol * scale;
}

void tu_expect_values(const tg_tensor *t, const double *want, int64_t n, double tol)
{
    cr_assert_not_null(t, "tensor is NULL (%s: %s)", tg_strerror(tg_last_error()),
                       tg_last_error_message());
    cr_assert_eq(tg_tensor_numel(t), n, "numel %lld, expected %lld", (long long)tg_tensor_numel(t),
                 (long long)n);
    for (int64_t i = 0; i < n; i++) {
        double v = NAN;
        cr_assert_eq(tg_tensor_get(t, i, &v), TG_OK, "get(%lld): %s", (long long)i,
                     tg_last_error_message());
        cr_assert(close_to(v, want[i], tol), "%s %s element %lld is %.17g, expected %.17g",
                  tg_backend_name(tg_tensor_backend(t)), tg_dtype_name(tg_tensor_dtype(t)),
                  (long long)i, v, want[i]);
    }
}

/* t is not NULL and has this shape; be names the backend in messages. */
static void expect_shape(int line, const char *be, const tg_tensor *t, int ndim,
                         const int64_t *shape)
{
    cr_assert_not_null(t, "line %d [%s]: tensor is NULL (%s: %s)", line, be,
                       tg_strerror(tg_last_error()), tg_last_error_message());
    cr_assert_eq(tg_tensor_ndim(t), ndim, "line %d [%s]: ndim %d, expected %d", line, be,
                 tg_tensor_ndim(t), ndim);
    for (int i = 0; i < ndim; i++)
        cr_assert_eq(tg_tensor_shape(t)[i], shape[i], "line %d [%s]: dim %d is %lld, expected %lld",
                     line, be, i, (long long)tg_tensor_shape(t)[i], (long long)shape[i]);
}

void tu_expect_shape_at(int line, const tg_tensor *t, int ndim, const int64_t *shape)
{
    expect_shape(line, tg_backend_name(tg_default_backend()), t, ndim, shape);
}

void tu_expect_tensor(int line, const tg_tensor *t, int ndim, const int64_t *shape,
                      const double *want, int64_t n, double tol)
{
    const char *be = tg_backend_name(tu_cur);
    expect_shape(line, be, t, ndim, shape);
    cr_assert_eq(tg_tensor_backend(t), tu_cur, "line %d [%s]: result on %s", line, be,
                 tg_backend_name(tg_tensor_backend(t)));
    cr_assert_eq(tg_tensor_numel(t), n, "line %d [%s]", line, be);
    for (int64_t i = 0; i < n; i++) {
        double v = NAN;
        cr_assert_eq(tg_tensor_get(t, i, &v), TG_OK);
        cr_assert(close_to(v, want[i], tol), "line %d [%s]: element %lld is %.17g, expected %.17g",
                  line, be, (long long)i, v, want[i]);
    }
}

void tu_expect_message_has(const char *needle)
{
    const char *msg = tg_last_error_message();
    cr_assert(strstr(msg, needle) != NULL, "message \"%s\" lacks \"%s\"", msg, needle);
}

void tu_on_both_backends(void (*check)(void))
{
    static const tg_backend all[2] = {TG_BACKEND_REF, TG_BACKEND_CPU};
    for (int i = 0; i < 2; i++) {
        tu_cur = all[i];
        tg_backend prev = tg_set_default_backend(tu_cur);
        tg_error_clear();
        size_t base = tg_mem_current_bytes();
        tg_scope_begin();
        check();
        cr_assert_eq(tg_scope_end(), TG_OK);
        cr_assert_eq(tg_last_error(), TG_OK, "[%s] error left behind: %s", tg_backend_name(tu_cur),
                     tg_last_error_message());
        cr_assert_eq(tg_mem_current_bytes(), base, "[%s] %zu bytes leaked", tg_backend_name(tu_cur),
                     tg_mem_current_bytes() - base);
        tg_set_default_backend(prev);
    }
}

void tu_scope_setup(void)
{
    tg_error_clear();
    tg_scope_begin();
}

void tu_scope_teardown(void)
{
    tg_scope_end();
}

void tu_expect_no_leaks(size_t mem0)
{
    size_t now = tg_mem_current_bytes();
    cr_expect_eq(now, mem0, "tensor storage: %zu bytes at the start, %zu at the end", mem0, now);
#ifdef TU_LSAN
    cr_expect_eq(__lsan_do_recoverable_leak_check(), 0, "LeakSanitizer found leaks (report above)");
#endif
}

bool tu_op_has_backward(const tg_op *op)
{
    return tg_op_mark(op) == TG_AD_BACKWARD;
}

bool tu_op_is_nondifferentiable(const tg_op *op)
{
    return tg_op_mark(op) == TG_AD_NONDIFFERENTIABLE;
}

bool tu_op_is_unmarked(const tg_op *op)
{
    return tg_op_mark(op) == TG_AD_UNMARKED;
}

bool tu_op_has_sample(const tg_op *op)
{
    return op->sample != NULL;
}

int tu_count_ops(tu_op_filter filter)
{
    int n = 0;
    for (int i = 0; i < tg_op_count(); i++)
        if (!filter || filter(tg_op_at(i))) n++;
    return n;
}
