/* Element types and reduction ops: sizes, names and validity. */
#include "base/common.h"

static const size_t dtype_sizes[] = {1, 1, 4, 8, 2, 2, 4, 8, 2, 1};
static const char *const dtype_names[] = {"uint8",   "int8",     "int32",   "int64",
                                          "float16", "bfloat16", "float32", "float64",
                                          "int16",   "bool"};
_Static_assert(HORA_ARRAY_SIZE(dtype_sizes) == HORA__DTYPE_COUNT, "a size for every dtype");
_Static_assert(HORA_ARRAY_SIZE(dtype_names) == HORA__DTYPE_COUNT, "a name for every dtype");
static const char *const op_names[] = {"sum", "average", "min", "max", "product", "adasum"};

bool hora__dtype_valid(int dtype) { return dtype >= HORA_UINT8 && dtype < HORA__DTYPE_COUNT; }

bool hora__op_valid(int op) { return op >= HORA_SUM && op <= HORA_ADASUM; }

/* Not a range: int16 and bool were appended after the floats. */
bool hora__dtype_is_float(hora_dtype dtype) {
  return dtype == HORA_FLOAT16 || dtype == HORA_BFLOAT16 || dtype == HORA_FLOAT32 ||
         dtype == HORA_FLOAT64;
}

int hora__check_allreduce_dtype(const char *call, const char *name, hora_dtype dtype, hora_op op,
                                double prescale, double postscale) {
  if (op == HORA_ADASUM && !hora__dtype_is_float(dtype)) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s: '%s': ADASUM needs a float dtype (float16, "
                       "bfloat16, float32 or float64), not %s", call, name ? name : "(unnamed)",
                       hora_dtype_name(dtype));
  }
  if (dtype != HORA_BOOL) {
    return HORA_SUCCESS;
  }
  /* Bool has only the logical reductions: refused here, on the caller's
   * rank, before anything reaches the coordinator. */
  const char *shown = name ? name : "(unnamed)";
  if (op == HORA_AVERAGE) {
    return hora__error(HORA_ERR_INVALID_ARG,
                       "%s: '%s': AVERAGE of bool is not defined (SUM and MAX are logical or, "
                       "MIN and PRODUCT logical and)",
                       call, shown);
  }
  if (prescale != 1.0 || postscale != 1.0) {
    return hora__error(HORA_ERR_INVALID_ARG,
                       "%s: '%s': bool cannot be scaled (prescale %g, postscale %g; both must "
                       "be 1.0)",
                       call, shown, prescale, postscale);
  }
  return HORA_SUCCESS;
}

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
