/* Element types and reduction ops: sizes, names and validity. */
#include "common.h"

static const size_t dtype_sizes[] = {1, 1, 4, 8, 2, 2, 4, 8};
static const char *const dtype_names[] = {"uint8",   "int8",     "int32",   "int64",
                                          "float16", "bfloat16", "float32", "float64"};
static const char *const op_names[] = {"sum", "average", "min", "max", "product"};

bool hora__dtype_valid(int dtype) { return dtype >= HORA_UINT8 && dtype <= HORA_FLOAT64; }

bool hora__op_valid(int op) { return op >= HORA_SUM && op <= HORA_PRODUCT; }

bool hora__dtype_is_float(hora_dtype dtype) { return dtype >= HORA_FLOAT16; }

HORA_EXTERN size_t hora_dtype_size(hora_dtype dtype) {
  return hora__dtype_valid((int)dtype) ? dtype_sizes[dtype] : 0;
}

HORA_EXTERN const char *hora_dtype_name(hora_dtype dtype) {
  return hora__dtype_valid((int)dtype) ? dtype_names[dtype] : "unknown";
}

HORA_EXTERN const char *hora_op_name(hora_op op) {
  return hora__op_valid((int)op) ? op_names[op] : "unknown";
}

HORA_EXTERN const char *hora_version(void) { return PACKAGE_VERSION; }
