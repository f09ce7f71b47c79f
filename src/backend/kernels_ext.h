/* Kernel ids and signatures of the extended elementwise, reduction and
 * indexing ops (src/ops/ext_*.c). Included by backend/kernels.h only. */
#ifndef TG_BACKEND_KERNELS_EXT_H
#define TG_BACKEND_KERNELS_EXT_H

#define TG_EXT_KERNELS(X)

#endif
