/* Internal definitions shared by every file of libhora. Symbols shared
 * between files carry the hora__ prefix; everything else is static. */
#ifndef HORA_COMMON_H
#define HORA_COMMON_H

#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "hora.h"

#define HORA_NAME_MAX 255 /* longest user-visible operation name, in bytes */
#define HORA_KEY_MAX (HORA_NAME_MAX + 2)

#define HORA_LIKELY(x) __builtin_expect(!!(x), 1)
#define HORA_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define HORA_MIN(a, b) ((a) < (b) ? (a) : (b))
#define HORA_MAX(a, b) ((a) > (b) ? (a) : (b))
#define HORA_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define HORA_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* Propagate a failure; the callee has already recorded the message. */
#define HORA_CHECK(call)                                                                     \
  do {                                                                                       \
    int hora_check_rc_ = (call);                                                             \
    if (HORA_UNLIKELY(hora_check_rc_ != HORA_SUCCESS)) {                                     \
      return hora_check_rc_;                                                                 \
    }                                                                                        \
  } while (0)

#define HORA_CHECK_GOTO(call, rc, label)                                                     \
  do {                                                                                       \
    (rc) = (call);                                                                           \
    if (HORA_UNLIKELY((rc) != HORA_SUCCESS)) {                                               \
      goto label;                                                                            \
    }                                                                                        \
  } while (0)

/* ---- errors (base/error.c) -----------------------------------------------
 * hora__error() records a message for the calling thread and returns `rc`, so
 * a failure reads `return hora__error(HORA_ERR_INVALID_ARG, "...", ...);`.
 * hora__error_errno() appends strerror(errno). */
int hora__error(int rc, const char *fmt, ...) HORA_PRINTF(2, 3);
int hora__error_errno(int rc, const char *fmt, ...) HORA_PRINTF(2, 3);
void hora__error_set_message(const char *msg);
const char *hora__error_message(void);
void hora__error_clear(void);

/* ---- time -------------------------------------------------------------- */
uint64_t hora__now_ns(void); /* CLOCK_MONOTONIC */
static inline double hora__now_s(void) { return (double)hora__now_ns() * 1e-9; }

/* ---- dtypes (base/dtype.c) -------------------------------------------- */
#define HORA__DTYPE_COUNT (HORA_BOOL + 1) /* tables indexed by dtype have this many rows */
bool hora__dtype_valid(int dtype);
bool hora__op_valid(int op);
bool hora__dtype_is_float(hora_dtype dtype);
/* HORA_ERR_INVALID_ARG, with a message naming the tensor, for what an
 * allreduce of dtype cannot do (bool: AVERAGE, scales other than 1). */
int hora__check_allreduce_dtype(const char *call, const char *name, hora_dtype dtype, hora_op op,
                                double prescale, double postscale);

/* ---- small helpers ----------------------------------------------------- */
void *hora__malloc(size_t n);                 /* NULL on failure; message recorded */
void *hora__calloc(size_t n, size_t size);    /* idem */
void *hora__realloc(void *p, size_t n);       /* idem; p kept on failure */
void *hora__aligned_alloc(size_t align, size_t n);
char *hora__strdup(const char *s);
/* Copies at most dst_size-1 bytes and terminates; returns strlen(src). */
size_t hora__strlcpy(char *dst, const char *src, size_t dst_size);

#endif
