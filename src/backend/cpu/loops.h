/* What a cpu kernel file whose loops must vectorize includes first (it
 * sets options for the whole file that includes it):
 * - Selects on float compares (clamps, relu, minimum) only become vector
 *   blends when the compiler may ignore FP exception flags, which nothing
 *   here reads: no-trapping-math. It reorders nothing and changes no
 *   result.
 * - TG_CLONES compiles a loop for AVX-512, AVX2 and baseline x86-64, the
 *   CPU's best picked at load time (an ifunc). The arithmetic is exact
 *   IEEE operations, not contracted into FMAs (ISO C mode), so every
 *   variant gives the same bits: unlike the math kernels (vmath.c), no
 *   choice of variant is exposed. */
#ifndef TG_BACKEND_CPU_LOOPS_H
#define TG_BACKEND_CPU_LOOPS_H

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

/* Not under the sanitizers: the clones' ifunc resolvers run while the
 * loader relocates, before the sanitizer runtime is set up, and crash
 * when instrumented (seen with ThreadSanitizer). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__ELF__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define TG_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TG_CLONES
#endif

#include "backend/kernels.h"

#endif
