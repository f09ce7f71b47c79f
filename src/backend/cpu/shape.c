/* cpu backend: the strided copy that makes a view contiguous (what every
 * kernel reads), a row of the last dim at a time. For 4- and 8-byte
 * elements; other sizes run ref's. */
#include <string.h>

#include "backend/kernels.h"

/* Strided gather into contiguous dst, a row (last dim) at a time: rows of
 * stride 1 are memcpy, stride 0 (a broadcast, e.g. a sum's gradient) a
 * fill, others a typed strided loop. */
#define DEF_COPY(name, T)                                                           \
    static void name(int ndim, const int64_t *shape, const int64_t *strides, const char *src, \
                     T *dst, int64_t n)                                             \
    {                                                                               \
        int64_t inner = ndim ? shape[ndim - 1] : 1, s = ndim ? strides[ndim - 1] : 0; \
        int64_t idx[TG_MAX_DIMS] = {0}, off = 0;                                    \
        if (inner == 0) return;                                                     \
        for (int64_t r = 0; r < n; r += inner) {                                    \
            const T *row = (const T *)src + off;                                    \
            T *out = dst + r;                                                       \
            if (s == 1) {                                                           \
                memcpy(out, row, (size_t)inner * sizeof(T));                        \
            } else if (s == 0) {                                                    \
                const T v = row[0];                                                 \
                for (int64_t j = 0; j < inner; j++) out[j] = v;                     \
            } else {                                                                \
                for (int64_t j = 0; j < inner; j++) out[j] = row[j * s];            \
            }                                                                       \
            for (int d = ndim - 2; d >= 0; d--) {                                   \
                off += strides[d];                                                  \
                if (++idx[d] < shape[d]) break;                                     \
                off -= strides[d] * shape[d];                                       \
                idx[d] = 0;                                                         \
            }                                                                       \
        }                                                                           \
    }

DEF_COPY(copy4, uint32_t)
DEF_COPY(copy8, uint64_t)

static tg_copy_strided_fn ref_copy;

static void copy_strided(int ndim, const int64_t *shape, const int64_t *strides, const void *src,
                         void *dst, size_t elem)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    if (n == 0) return;
    if (elem == 4)
        copy4(ndim, shape, strides, src, dst, n);
    else if (elem == 8)
        copy8(ndim, shape, strides, src, dst, n);
    else
        ref_copy(ndim, shape, strides, src, dst, elem);
}

void tg__cpu_shape_register(void)
{
    ref_copy = (tg_copy_strided_fn)tg__kernel(TG_K_COPY_STRIDED, TG_BACKEND_REF, TG_F32);
    for (int d = 0; d < TG_DTYPE_COUNT; d++)
        tg__kernel_set(TG_K_COPY_STRIDED, TG_BACKEND_CPU, (tg_dtype)d, (tg_kernel_fn)copy_strided);
}
