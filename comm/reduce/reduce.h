/* Element-wise reduction kernels for every dtype and op. */
#ifndef HORA_REDUCE_H
#define HORA_REDUCE_H

#include "base/common.h"

/* dst[i] = a[i] (op) b[i] for i < n. dst may be a or b. HORA_AVERAGE reduces
 * as a sum; the division is a postscale by 1/size at the end. Integer
 * sums and products wrap; float MIN and MAX return NaN when either side is
 * NaN, so the result does not depend on the order of reduction. Bool reads
 * any nonzero byte as true and writes 0 or 1: SUM and MAX are OR, MIN and
 * PRODUCT are AND. */
void hora__reduce(hora_dtype dtype, hora_op op, void *dst, const void *a, const void *b,
                  size_t n);
/* The same without the run-time choice of CPU-specific float16/bfloat16
 * loops: what a CPU without AVX2 and F16C runs (tested on every CPU). */
void hora__reduce_portable(hora_dtype dtype, hora_op op, void *dst, const void *a, const void *b,
                           size_t n);

/* buf[i] *= factor, element for element as Horovod's CPU ScaleBuffer:
 * float64 in double; float32, float16 and bfloat16 in float, by the factor
 * rounded to float; integers in double, cast back toward zero. Used for
 * pre- and postscaling and for AVERAGE (a postscale divided by the size).
 * Bool is left alone (its scaling is refused at submission). */
void hora__scale(hora_dtype dtype, void *buf, size_t n, double factor);

/* Bool results: every nonzero byte becomes 1. */
void hora__normalize_bool(void *buf, size_t n);

/* Wire compression. The accumulating dtype is float32 or float64, the wire
 * dtype float16 or bfloat16. */
void hora__compress(hora_dtype wire_dtype, uint16_t *dst, hora_dtype src_dtype, const void *src,
                    size_t n);
void hora__decompress(hora_dtype dst_dtype, void *dst, hora_dtype wire_dtype, const uint16_t *src,
                      size_t n);
/* dst[i] = (wire[i] widened) (op) src[i], in acc_dtype; dst may be src. */
void hora__reduce_wire(hora_dtype acc_dtype, hora_op op, void *dst, hora_dtype wire_dtype,
                       const uint16_t *wire, const void *src, size_t n);

/* The plain scalar reference the kernels are tested against. */
void hora__reduce_reference(hora_dtype dtype, hora_op op, void *dst, const void *a,
                            const void *b, size_t n);

#endif
