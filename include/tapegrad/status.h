/* tapegrad/status.h - status codes and the per-thread last error.
 * Included by <tapegrad.h>; do not include directly. */
#ifndef TAPEGRAD_STATUS_H
#define TAPEGRAD_STATUS_H

/* One list generates both the enum and tg_strerror()'s strings. */
#define TG_STATUS_MAP(X)                                                      \
    X(OK, "success")                                                          \
    X(ERR_NULL, "NULL argument")                                              \
    X(ERR_INVALID, "invalid argument")                                        \
    X(ERR_DTYPE, "wrong dtype")                                               \
    X(ERR_SHAPE, "incompatible shapes")                                       \
    X(ERR_DEVICE, "tensors on different backends")                            \
    X(ERR_NOT_DIFFERENTIABLE, "op is not marked for autodiff")                \
    X(ERR_NO_GRAD, "tensor does not require grad")                            \
    X(ERR_TAPE, "tensors recorded on different tapes")                        \
    X(ERR_STALE, "tensor's tape record is gone (reset, freed or consumed)")   \
    X(ERR_SEED, "non-scalar output needs a seed gradient")                    \
    X(ERR_NOMEM, "out of memory")                                             \
    X(ERR_NOT_FOUND, "not found")                                             \
    X(ERR_EXISTS, "already exists")                                           \
    X(ERR_UNSUPPORTED, "not supported")                                       \
    X(ERR_GRADCHECK, "gradient check failed")                                 \
    X(ERR_SCOPE, "scope misuse")                                              \
    X(ERR_IO, "I/O error")                                                    \
    X(ERR_TRUNCATED, "file is truncated")                                     \
    X(ERR_HEADER, "malformed file header")                                    \
    X(ERR_OFFSETS, "tensor data offsets out of range, overlapping or inconsistent") \
    X(ERR_EXTRA, "unexpected extra entry")                                    \
    X(ERR_PARSE, "malformed text data")                                       \
    X(ERR_BUDGET, "tape memory budget exceeded")                              \
    X(ERR_INTERNAL, "internal error")                                        \
    X(ERR_MODIFIED, "a value backward reads was modified after it was recorded") \
    X(ERR_NONFINITE, "NaN or infinity produced (anomaly mode)")             \
    X(ERR_DIST, "distributed training failed (another rank or the communicator)")

typedef enum tg_status {
#define TG__STATUS_ENUM(name, str) TG_##name,
    TG_STATUS_MAP(TG__STATUS_ENUM)
#undef TG__STATUS_ENUM
    TG_STATUS_COUNT_
} tg_status;

/* Static description of a status code ("unknown status" if out of range). */
const char *tg_strerror(tg_status status);

/* The calling thread's last error code (TG_OK if none since the last clear).
 * Errors are sticky: successful calls do not clear them, and an op given a
 * NULL input keeps the error already recorded, so a nested expression needs
 * one check at the end. */
tg_status tg_last_error(void);

/* The last error's message, naming the op, the argument and the shapes,
 * e.g. "bad argument #2 to 'add' (shapes [2,3] and [4] do not broadcast)".
 * Never NULL; "" when there is no error. Valid until the next failing call
 * on this thread. */
const char *tg_last_error_message(void);

/* Forget the calling thread's last error. */
void tg_error_clear(void);

#endif
