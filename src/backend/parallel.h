/* Kernel calls split across the thread pool when large (parallel.c). es is
 * the element size. Each part is the same kernel on a range of elements,
 * so results are bitwise those of one call. */
#ifndef TG_BACKEND_PARALLEL_H
#define TG_BACKEND_PARALLEL_H

#include "backend/kernels.h"

/* How many parts a job over `bytes` of tensor data should be cut into (1:
 * run it inline), before the pool's size caps it: the kernels below and
 * the tape's pointwise regions decide by it. */
TG_INTERNAL int tg__split_parts(size_t bytes);
TG_INTERNAL void tg__run_unary(tg_unary_fn f, int64_t n, const void *x, void *y, double p,
                               size_t es);
TG_INTERNAL void tg__run_grad(tg_grad_fn f, int64_t n, const void *s, const void *gy, void *gx,
                              double p, size_t es);
/* The same for the maps with two parameters (clamp, softplus). */
TG_INTERNAL void tg__run_unary2(tg_unary2_fn f, int64_t n, const void *x, void *y, double p,
                                double q, size_t es);
TG_INTERNAL void tg__run_grad2(tg_grad2_fn f, int64_t n, const void *s, const void *gy, void *gx,
                               double p, double q, size_t es);
/* gs = gg * gy * f''(s), all contiguous, of one dtype and length n. */
TG_INTERNAL void tg__run_gradgrad(tg_gradgrad_fn f, int64_t n, const void *s, const void *gy,
                                  const void *gg, void *gs, double p, size_t es);
TG_INTERNAL void tg__run_binary(tg_binary_fn f, const tg_bcast *bc, const void *a, const void *b,
                                void *out, size_t es);
/* Fills the kernel description for out = a op b, out of spec out (the
 * broadcast of a's and b's shapes, as tg__broadcast_spec makes it). */
TG_INTERNAL void tg__bcast_desc(const tg_spec *out, const tg_tensor *a, const tg_tensor *b,
                                tg_bcast *bc);
/* out = a kid b over out_spec (broadcasting; out may be a's memory): the
 * description and the split call above in one. The binary ops run their
 * kernels through it. */
TG_INTERNAL void tg__binary_kernel(tg_kernel_id kid, const tg_spec *out_spec, const tg_tensor *a,
                                   const tg_tensor *b, void *out);
/* dst += src in place: tg__binary_kernel(ADD) with dst as its output, as
 * the add op runs it (same description, same split, same bits). The tape's
 * gradient accumulation when it holds the only reference to dst. Same
 * dtype, backend and shape, both contiguous. */
TG_INTERNAL void tg__add_into(tg_tensor *dst, const tg_tensor *src);
/* The sum kernel on x (r: its reduction) into y, a whole f32 row on the
 * cpu backend split across the pool where it is large (the exact pass in
 * parts, merged: the kernel's bits; the kernel itself where the row cannot
 * be shown exact). */
TG_INTERNAL void tg__run_sum(const tg_reduce *r, const tg_tensor *x, void *y);
/* tg__run_sum over every dim of x (contiguous): its one sum into y. */
TG_INTERNAL void tg__run_sum_all(const tg_tensor *x, void *y);

#endif
