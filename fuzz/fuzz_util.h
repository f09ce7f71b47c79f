/* fuzz_util.h - what the fuzz targets share: the input written to a
 * private temporary file (the loaders take a path), and a hard stop for a
 * broken invariant (libFuzzer reports the abort with the input). */
#ifndef TG_FUZZ_UTIL_H
#define TG_FUZZ_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz_path[64];

static void fuzz_file_remove(void)
{
    unlink(fuzz_path);
}

/* Writes data to this process's temporary file (removed at exit); returns
 * its path. */
static inline const char *fuzz_file(const unsigned char *data, size_t n, const char *suffix)
{
    static int fd = -1;
    const char *path = fuzz_path;
    if (fd < 0) {
        snprintf(fuzz_path, sizeof fuzz_path, "/tmp/tg_fuzz_XXXXXX%s", suffix);
        fd = mkstemps(fuzz_path, (int)strlen(suffix));
        if (fd < 0) abort();
        atexit(fuzz_file_remove);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, n, 0) != (ssize_t)n) abort();
    return path;
}

#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz invariant failed: %s: ", #cond);                                 \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
