/* tapegrad/tensor.h - tensors, backends, creation, lifetimes, scopes.
 * Included by <tapegrad.h>; do not include directly. */
#ifndef TAPEGRAD_TENSOR_H
#define TAPEGRAD_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TG_MAX_DIMS 8

typedef enum tg_dtype { TG_F32 = 0, TG_F64 = 1, TG_I64 = 2 } tg_dtype;
#define TG_DTYPE_COUNT 3

/* ref: portable reference C, the test oracle. cpu: OpenBLAS and tuned loops;
 * falls back to ref for kernels it does not override. */
typedef enum tg_backend { TG_BACKEND_REF = 0, TG_BACKEND_CPU = 1 } tg_backend;
#define TG_BACKEND_COUNT 2

/* Opaque, reference-counted n-d array with optional autodiff state. */
typedef struct tg_tensor tg_tensor;

/* Name of a dtype ("f32", "f64", "i64") or backend ("ref", "cpu"). */
const char *tg_dtype_name(tg_dtype dtype);
const char *tg_backend_name(tg_backend backend);
/* Size in bytes of one element of dtype (0 for an invalid dtype). */
size_t tg_dtype_size(tg_dtype dtype);

/* Backend used by every creation function on this thread (default cpu).
 * Returns the previous one. An invalid backend changes nothing and sets
 * the last error (TG_ERR_INVALID). */
tg_backend tg_set_default_backend(tg_backend backend);
tg_backend tg_default_backend(void);

/* Threads for the cpu backend, shared by OpenBLAS and tapegrad's own
 * elementwise kernels (which split large tensors across a pool of that
 * size, between BLAS calls, so the two never compete). The default follows
 * OpenBLAS (OPENBLAS_NUM_THREADS). set: TG_ERR_INVALID outside 1..64. */
int tg_num_threads(void);
tg_status tg_set_num_threads(int n);

/* ---- Creation. Every function returns a new reference (see scopes below),
 * or NULL with the last error set. shape has ndim entries, 0 <= ndim <= 8,
 * each >= 0; ndim == 0 is a scalar. TG_ERR_SHAPE when the product of the
 * nonzero dims times 16 exceeds INT64_MAX (a zero dim does not lift it). */

/* Copies numel(shape) elements of dtype from data (row-major). */
tg_tensor *tg_tensor_from_data(tg_dtype dtype, int ndim, const int64_t *shape,
                               const void *data);
tg_tensor *tg_zeros(tg_dtype dtype, int ndim, const int64_t *shape);
tg_tensor *tg_ones(tg_dtype dtype, int ndim, const int64_t *shape);
tg_tensor *tg_full(tg_dtype dtype, int ndim, const int64_t *shape, double value);
/* Scalar (0-d) tensor holding value. */
tg_tensor *tg_scalar(tg_dtype dtype, double value);
/* 1-d tensor start, start+step, ... (< stop for step > 0, > stop for step < 0).
 * TG_ERR_INVALID for a zero or non-finite argument, TG_ERR_SHAPE for more
 * than 2^60 elements. */
tg_tensor *tg_arange(tg_dtype dtype, double start, double stop, double step);

/* ---- Seeded generator: xoshiro256** seeded through splitmix64, so the same
 * seed gives the same numbers on every machine. Not thread-safe per object. */
typedef struct tg_rng { uint64_t s[4]; } tg_rng;

void tg_rng_seed(tg_rng *rng, uint64_t seed);
uint64_t tg_rng_next(tg_rng *rng);
/* Uniform double in [0, 1), 53 random bits. */
double tg_rng_double(tg_rng *rng);
/* Standard normal (Marsaglia polar method). */
double tg_rng_gauss(tg_rng *rng);
/* Samples in [lo, hi) / N(mean, std^2), computed in f64 then rounded to dtype
 * (floating dtypes only). */
tg_tensor *tg_rand_uniform(tg_rng *rng, tg_dtype dtype, int ndim,
                           const int64_t *shape, double lo, double hi);
tg_tensor *tg_rand_normal(tg_rng *rng, tg_dtype dtype, int ndim,
                          const int64_t *shape, double mean, double std);

/* ---- Accessors. None of them changes the last error on success. */
int tg_tensor_ndim(const tg_tensor *t);
/* Borrowed pointer to ndim sizes, valid while t lives. */
const int64_t *tg_tensor_shape(const tg_tensor *t);
/* Size of dim i; negative i counts from the end. -1 if out of range. */
int64_t tg_tensor_dim(const tg_tensor *t, int i);
int64_t tg_tensor_numel(const tg_tensor *t);
tg_dtype tg_tensor_dtype(const tg_tensor *t);
tg_backend tg_tensor_backend(const tg_tensor *t);
/* Row-major contiguous (views made by transpose/permute are not). */
bool tg_tensor_is_contiguous(const tg_tensor *t);
/* Pointer to the first element of a contiguous tensor, for custom kernels;
 * NULL (TG_ERR_INVALID) if t is not contiguous. Writes through it change
 * every view sharing the storage. Each call counts as a write: it bumps
 * the storage's version, so a tape that kept this value for backward fails
 * that backward with TG_ERR_MODIFIED (docs/debugging.md). Read through
 * tg_tensor_data_ro. */
void *tg_tensor_data(tg_tensor *t);
/* The same pointer, read-only: no version bump. */
const void *tg_tensor_data_ro(const tg_tensor *t);
/* The version of t's storage: how many times the API wrote into it
 * (tg_tensor_data, initialisers, optimizer steps, parameter loads). */
uint32_t tg_tensor_version(const tg_tensor *t);
/* Copy all elements, row-major, into dst (capacity nbytes). Fails with
 * TG_ERR_INVALID if nbytes < numel * dtype size. Works for any layout. */
tg_status tg_tensor_copy_out(const tg_tensor *t, void *dst, size_t nbytes);
/* Value of a one-element tensor, converted to double. */
tg_status tg_tensor_item(const tg_tensor *t, double *out);
/* Element at flat row-major index i, converted to double (for tests/tools). */
tg_status tg_tensor_get(const tg_tensor *t, int64_t i, double *out);
/* Formats the shape as "[2,3]" into buf (truncated to len - 1 chars);
 * returns buf. ndim <= 0 gives "[]"; shape NULL with ndim > 0 gives "[?]";
 * buf NULL or len 0 writes nothing. */
char *tg_shape_str(int ndim, const int64_t *shape, char *buf, size_t len);

/* ---- Lifetimes. Tensors are reference counted; the retain/release pair is
 * the only ownership verb pair in the API. release(NULL) is a no-op. */
tg_tensor *tg_tensor_retain(tg_tensor *t);
void tg_tensor_release(tg_tensor *t);

/* ---- Scopes (per thread, nestable). While a scope is open, every tensor the
 * API returns is owned by the innermost scope, and tg_scope_end releases
 * them all except those passed to tg_scope_keep. A training step written as
 * nested expressions then needs no release calls. Outside any scope the
 * caller owns every returned tensor. */
void tg_scope_begin(void);
/* Releases the innermost scope's tensors. TG_ERR_SCOPE if none is open. */
tg_status tg_scope_end(void);
/* Moves t out of the innermost scope: the caller now owns that reference and
 * must release it. Returns t. No-op (returns t) if t is not scope-owned. */
tg_tensor *tg_scope_keep(tg_tensor *t);
/* Number of open scopes on this thread. */
int tg_scope_depth(void);

/* ---- Process-wide tensor storage accounting (bytes currently allocated
 * for tensor data, and the peak since the last reset). */
size_t tg_mem_current_bytes(void);
size_t tg_mem_peak_bytes(void);
void tg_mem_reset_peak(void);
/* Freed buffers of 16 KiB or more are kept for the next allocation of the
 * same size, since training loops reallocate the same sizes every step:
 * first in the freeing thread's own cache (up to 512 buffers, 256 MiB),
 * then in one shared by all threads (up to 1024, 1 GiB), which also gets
 * a thread's own when the thread exits; the counters above do not include
 * them. Freed tensor headers are kept per thread too (as many as the
 * thread's largest step had alive). tg_mem_trim hands the shared buffers,
 * and the calling thread's buffers and spare headers, back to the
 * allocator. */
void tg_mem_trim(void);
/* "jemalloc" or "malloc": the allocator tensor storage goes through. */
const char *tg_mem_allocator(void);
/* The vector instruction set the cpu backend's f32 exp/tanh/sigmoid and
 * cross-entropy loops
 * run with: "avx512", "avx2" or "baseline" (the compiler's default for the
 * target), the widest the CPU supports unless the environment variable
 * TAPEGRAD_VMATH=avx2|baseline (read once, when the kernel table is built)
 * caps it. avx512 and avx2 use fused multiply-adds and give bitwise the
 * same results; baseline rounds separately and agrees with them to a few
 * ulp. The variant is chosen once, so one process computes consistently.
 * tg_cpu_set_vector_isa switches the variant (to compare them): TG_ERR_INVALID
 * for a name not in the list, TG_ERR_UNSUPPORTED where the CPU lacks it.
 * Call it while no op is running. */
const char *tg_cpu_vector_isa(void);
tg_status tg_cpu_set_vector_isa(const char *isa);

#endif
