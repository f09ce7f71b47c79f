/* A stand-in for <criterion/criterion.h> for the ThreadSanitizer build of
 * tests/test_threads.c (tests/tsan/main.c runs it): Criterion's own
 * runner crashes under TSan, so here every Test is a plain function,
 * registered at start-up and run in order in one process, and a failed
 * assertion prints where and exits 1. Only what test_threads.c,
 * test_replicas.c and test_util.c use. */
#ifndef TG_TSAN_CRITERION_SHIM_H
#define TG_TSAN_CRITERION_SHIM_H

#include <stdbool.h>
#include <stddef.h>

void tsan_register(const char *name, void (*fn)(void));
void tsan_fail(const char *file, int line, const char *cond, const char *fmt, ...);

/* Test(suite, name) or Test(suite, name, options): the options ignored. */
#define Test(...) TSAN_TEST(__VA_ARGS__, 0)
#define TSAN_TEST(suite, name, ...)                                                                \
    static void suite##_##name(void);                                                              \
    __attribute__((constructor)) static void suite##_##name##_register(void)                       \
    {                                                                                              \
        tsan_register(#suite "::" #name, suite##_##name);                                          \
    }                                                                                              \
    static void suite##_##name(void)

/* Each takes its message as optional arguments: a trailing "" makes the
 * variadic part non-empty (C11), and printf ignores it when unused. */
#define TSAN_ASSERT(cond, ...)                                                                     \
    do {                                                                                           \
        if (!(cond)) tsan_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                            \
    } while (0)
#define TSAN_CMP(a, op, b, ...) TSAN_ASSERT((a)op(b), __VA_ARGS__)
#define cr_assert(...) TSAN_ASSERT(__VA_ARGS__, "")
#define cr_expect(...) TSAN_ASSERT(__VA_ARGS__, "")
#define cr_assert_eq(a, ...) TSAN_CMP(a, ==, __VA_ARGS__, "")
#define cr_expect_eq(a, ...) TSAN_CMP(a, ==, __VA_ARGS__, "")
#define cr_assert_neq(a, ...) TSAN_CMP(a, !=, __VA_ARGS__, "")
#define cr_assert_lt(a, ...) TSAN_CMP(a, <, __VA_ARGS__, "")
#define cr_assert_gt(a, ...) TSAN_CMP(a, >, __VA_ARGS__, "")
#define cr_assert_null(...) TSAN_CMP(NULL, ==, __VA_ARGS__, "")
#define cr_assert_not_null(...) TSAN_CMP(NULL, !=, __VA_ARGS__, "")

#endif
