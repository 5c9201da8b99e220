/* Element-wise reduction kernels for every dtype and op. */
#ifndef HORA_REDUCE_H
#define HORA_REDUCE_H

#include "../runtime/common.h"

/* dst[i] = a[i] (op) b[i] for i < n. dst may be a or b. HORA_AVERAGE reduces
 * as a sum; the division happens once at the end (hora__divide). Integer
 * sums and products wrap; float MIN and MAX return NaN when either side is
 * NaN, so the result does not depend on the order of reduction. */
void hora__reduce(hora_dtype dtype, hora_op op, void *dst, const void *a, const void *b,
                  size_t n);

/* buf[i] /= divisor: floats divide, integers round toward zero. */
void hora__divide(hora_dtype dtype, void *buf, size_t n, int divisor);

/* buf[i] *= factor, computed in double for float64 and float for the rest;
 * integers are rounded to nearest. Used for pre- and postscaling. */
void hora__scale(hora_dtype dtype, void *buf, size_t n, double factor);

/* The plain scalar reference the kernels are tested against. */
void hora__reduce_reference(hora_dtype dtype, hora_op op, void *dst, const void *a,
                            const void *b, size_t n);

#endif
