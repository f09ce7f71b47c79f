/* tapegrad/nn.h - neural-network ops: convolution, pooling,
 * normalisation. Included by <tapegrad.h>; do not include directly.
 * Conventions as in ops.h (new references, sticky NULLs, recording). */
#ifndef TAPEGRAD_NN_H
#define TAPEGRAD_NN_H

#include "tensor.h"

#endif
