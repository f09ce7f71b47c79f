/* tapegrad.h - reverse-mode automatic differentiation for C.
 *
 * The one public header. A tape records every op applied to tensors that
 * require grad; tg_backward sweeps it in reverse and fills in gradients.
 * See docs/api.md for a guided tour. */
#ifndef TAPEGRAD_H
#define TAPEGRAD_H

#ifdef __cplusplus
extern "C" {
#endif

/* Building the shared library with hidden visibility: export the API. */
#if defined(TG_BUILDING) && defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#include "tapegrad/status.h"
#include "tapegrad/tensor.h"
#include "tapegrad/tape.h"
#include "tapegrad/registry.h"
#include "tapegrad/ops.h"
#include "tapegrad/fused.h"
#include "tapegrad/nn.h"
#include "tapegrad/gradcheck.h"
#include "tapegrad/functional.h"
#include "tapegrad/data.h"
#include "tapegrad/layers.h"
#include "tapegrad/params.h"
#include "tapegrad/optim.h"
#include "tapegrad/replicas.h"
#include "tapegrad/io.h"

#define TAPEGRAD_VERSION "0.1.0"
const char *tg_version(void);

#if defined(TG_BUILDING) && defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif
