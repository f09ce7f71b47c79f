/* The per-call context handed to an op's forward and backward functions.
 * Dispatch builds it for forward; the tape builds it for backward from a
 * node. Accessors live in src/dispatch/opctx.c. */
#ifndef TG_CORE_OPCTX_H
#define TG_CORE_OPCTX_H

#include "core/internal.h"

#define TG_OP_MAX_EXTRA 4

struct tg_op_ctx {
    const tg_op *op;
    const tg_op_attrs *attrs;
    int nin;
    tg_tensor *const *in;      /* forward: the inputs; backward: saved (may be NULL) */
    const tg_spec *in_spec;
    tg_tensor *out;            /* backward: saved output or NULL */
    const tg_spec *out_spec;
    tg_backend backend;
    unsigned needs;            /* bit i: input i needs a gradient */
    tg_tensor **extra;         /* TG_OP_MAX_EXTRA slots */
    int *nextra;
    bool forward;
};

#endif
