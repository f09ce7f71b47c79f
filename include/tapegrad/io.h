/* tapegrad/io.h - parameter files in the safetensors layout. Included by
 * <tapegrad.h>; do not include directly.
 *
 * Layout: an 8-byte little-endian header length N, N bytes of JSON
 *   {"<name>": {"dtype": "F32"|"F64"|"I64", "shape": [...],
 *               "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"<key>": "<string>", ...}}
 * (padded with spaces so the data starts 8-byte aligned), then the raw
 * little-endian data; offsets are relative to the data section, which the
 * tensors cover exactly. Files move to and from safetensors/NumPy/PyTorch.
 *
 * Entries: every parameter and buffer under its own name; with an optimizer,
 * also "optim/<state>/<param>" for each state buffer (exp_avg, exp_avg_sq,
 * max_exp_avg_sq, momentum_buffer, square_avg, grad_avg: whichever the
 * optimizer keeps), "optim/step/<param>" (i64 scalar, the parameter's step
 * count) and "optim/steps" (i64 scalar, tg_optim_step_count). The metadata
 * holds "tapegrad.version", and with an optimizer "optim.kind" and its
 * options ("optim.lr", ...) as decimal strings. */
#ifndef TAPEGRAD_IO_H
#define TAPEGRAD_IO_H

#include "optim.h"

/* Writes ps (and opt's state if opt is not NULL; opt must be over ps)
 * atomically: to "<path>.tmp.XXXXXX" in the same directory, fsync, rename
 * over path, fsync the directory; a failure or crash at any point leaves
 * whatever was at path before. TG_ERR_IO (with the path and errno text),
 * TG_ERR_INVALID for a name that is not valid UTF-8, TG_ERR_NOMEM when out
 * of memory. Saving the same state
 * twice gives identical bytes. */
tg_status tg_params_save(const tg_params *ps, const tg_optim *opt, const char *path);

/* Reads path into ps (and opt's state if opt is not NULL). The whole file
 * is validated before anything is copied, so on any error ps and opt are
 * unchanged. Errors, each naming the tensor where there is one:
 *   TG_ERR_IO         cannot open or read the file
 *   TG_ERR_TRUNCATED  shorter than 8 bytes, or the data section is shorter
 *                     than the (otherwise consistent) offsets need
 *   TG_ERR_IO         (also) path is not a regular file: a FIFO, a device
 *   TG_ERR_HEADER     header length larger than the file; header not a JSON
 *                     object, duplicate keys, a field missing or of the
 *                     wrong type, metadata values that are not strings; an
 *                     "optim.lr" that tg_optim_set_lr would refuse (negative,
 *                     NaN, inf); a step count outside [0, TG_OPTIM_MAX_STEPS]
 *   TG_ERR_NOMEM      out of memory (while parsing the header too)
 *   TG_ERR_DTYPE      an unknown dtype ("BF16", ...), or a tensor whose dtype
 *                     differs from the parameter's
 *   TG_ERR_OFFSETS    offsets out of range, overlapping, leaving gaps or
 *                     trailing bytes, or not matching dtype size * numel
 *   TG_ERR_SHAPE      a tensor whose shape differs from the parameter's
 *   TG_ERR_NOT_FOUND  a parameter, buffer or optimizer state missing
 *   TG_ERR_EXTRA      a tensor that is none of those
 *   TG_ERR_INVALID    the file's optimizer kind differs from opt's
 * With opt NULL, "optim/..." tensors are ignored (load weights for
 * inference from a training checkpoint). Loading with opt restores its
 * state, step counts and lr; its other options stay as constructed. */
tg_status tg_params_load(tg_params *ps, tg_optim *opt, const char *path);

#endif
