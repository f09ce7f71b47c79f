/* Kernel ids and signatures of the neural-network ops: convolution,
 * pooling, normalisation (src/ops/nn_*.c). Included by backend/kernels.h
 * only. */
#ifndef TG_BACKEND_KERNELS_NN_H
#define TG_BACKEND_KERNELS_NN_H

#define TG_NN_KERNELS(X)

#endif
