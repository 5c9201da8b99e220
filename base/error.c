/* Result codes, per-thread error messages and small allocation helpers. */
#include "base/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define HORA_ERROR_MAX 1024

static _Thread_local char error_message[HORA_ERROR_MAX];

static const char *const result_strings[] = {
#define HORA_RESULT_STRING_(name, text) text,
    HORA_RESULT_MAP(HORA_RESULT_STRING_)
#undef HORA_RESULT_STRING_
};

HORA_EXTERN const char *hora_strerror(int result) {
  if (result < 0 || result >= (int)HORA_ARRAY_SIZE(result_strings)) {
    return "unknown result";
  }
  return result_strings[result];
}

HORA_EXTERN const char *hora_last_error(void) { return error_message; }

const char *hora__error_message(void) { return error_message; }

void hora__error_clear(void) { error_message[0] = '\0'; }

void hora__error_set_message(const char *msg) {
  hora__strlcpy(error_message, msg ? msg : "", sizeof(error_message));
}

static void error_vformat(const char *fmt, va_list ap, int errnum) {
  /* Format into a scratch buffer: the arguments may point into error_message. */
  char buf[HORA_ERROR_MAX];
  int n = vsnprintf(buf, sizeof(buf), fmt, ap);
  if (errnum != 0 && n >= 0 && (size_t)n < sizeof(buf)) {
    snprintf(buf + n, sizeof(buf) - (size_t)n, ": %s", strerror(errnum));
  }
  memcpy(error_message, buf, sizeof(buf));
}

int hora__error(int rc, const char *fmt, ...) {
  int saved = errno;
  va_list ap;
  va_start(ap, fmt);
  error_vformat(fmt, ap, 0);
  va_end(ap);
  errno = saved;
  return rc;
}

int hora__error_errno(int rc, const char *fmt, ...) {
  int saved = errno;
  va_list ap;
  va_start(ap, fmt);
  error_vformat(fmt, ap, saved);
  va_end(ap);
  errno = saved;
  return rc;
}

uint64_t hora__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void *hora__malloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    hora__error(HORA_ERR_NO_MEMORY, "out of memory allocating %zu bytes", n);
  }
  return p;
}

void *hora__calloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) {
    hora__error(HORA_ERR_NO_MEMORY, "out of memory allocating %zu x %zu bytes", n, size);
  }
  return p;
}

void *hora__realloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) {
    hora__error(HORA_ERR_NO_MEMORY, "out of memory growing a buffer to %zu bytes", n);
  }
  return q;
}

void *hora__aligned_alloc(size_t align, size_t n) {
  void *p = NULL;
  if (posix_memalign(&p, align, n ? n : align) != 0) {
    hora__error(HORA_ERR_NO_MEMORY, "out of memory allocating %zu aligned bytes", n);
    return NULL;
  }
  return p;
}

char *hora__strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = hora__malloc(n);
  if (d) {
    memcpy(d, s, n);
  }
  return d;
}

size_t hora__strlcpy(char *dst, const char *src, size_t dst_size) {
  size_t n = strlen(src);
  if (dst_size > 0) {
    size_t c = n < dst_size - 1 ? n : dst_size - 1;
    memcpy(dst, src, c);
    dst[c] = '\0';
  }
  return n;
}
