/* Runner for tests/test_threads.c under ThreadSanitizer (with the
 * stand-in tests/tsan/criterion/criterion.h): runs every test in order in
 * this one process; TSan reports a race and, with halt_on_error=1, exits
 * non-zero. `ninja -C build-tsan tests/tsan_threads` (see .ci/run). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "criterion/criterion.h"

static struct {
    const char *name;
    void (*fn)(void);
} tests[64];
static int ntests;

void tsan_register(const char *name, void (*fn)(void))
{
    if (ntests == 64) abort();
    tests[ntests].name = name;
    tests[ntests++].fn = fn;
}

void tsan_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
    fprintf(stderr, "%s:%d: assertion failed: %s: ", file, line, cond);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    exit(1);
}

int main(void)
{
    for (int i = 0; i < ntests; i++) {
        fprintf(stderr, "[tsan] %s\n", tests[i].name);
        tests[i].fn();
    }
    fprintf(stderr, "[tsan] %d tests passed\n", ntests);
    return 0;
}
