/* What an operation is: the names of its kinds, its key as messages show
 * it, and the caller's shape, checked and fingerprinted. */
#include "runtime/operation.h"

#include <stdio.h>

static const char *const kind_names[] = {"allreduce", "broadcast",  "allgather", "reducescatter",
                                         "allgatherv", "alltoall", "barrier",   "join",
                                         "shutdown",  "error"};
_Static_assert(HORA_ARRAY_SIZE(kind_names) == HORA_KIND_COUNT_, "a name for every kind");

const char *hora__kind_name(int kind) {
  return kind >= 0 && kind < HORA_KIND_COUNT_ ? kind_names[kind] : "unknown";
}

const char *hora__negotiate_phase(int kind) {
  static const char *const phases[] = {"NEGOTIATE_ALLREDUCE", "NEGOTIATE_BROADCAST",
                                       "NEGOTIATE_ALLGATHER", "NEGOTIATE_REDUCESCATTER",
                                       "NEGOTIATE_ALLGATHERV", "NEGOTIATE_ALLTOALL",
                                       "NEGOTIATE_BARRIER",
                                       "NEGOTIATE_JOIN",      "NEGOTIATE_SHUTDOWN",
                                       "NEGOTIATE_ERROR"};
  _Static_assert(HORA_ARRAY_SIZE(phases) == HORA_KIND_COUNT_, "a phase for every kind");
  return kind >= 0 && kind < HORA_KIND_COUNT_ ? phases[kind] : "NEGOTIATE";
}

const char *hora__key_display(const char *key, size_t len, char *buf, size_t n) {
  if (len == 0) {
    snprintf(buf, n, "?");
  } else if (key[0] == HORA_KEY_NAMED) {
    snprintf(buf, n, "'%.*s'", (int)(len - 1), key + 1);
  } else if (key[0] == HORA_KEY_UNNAMED) {
    snprintf(buf, n, "unnamed #%.*s", (int)(len - 1), key + 1);
  } else if (key[0] == HORA_KEY_BARRIER) {
    snprintf(buf, n, "barrier #%.*s", (int)(len - 1), key + 1);
  } else if (key[0] == HORA_KEY_JOIN) {
    snprintf(buf, n, "join");
  } else if (key[0] == HORA_KEY_SHUTDOWN) {
    snprintf(buf, n, "finalize");
  } else {
    snprintf(buf, n, "<%.*s>", (int)len, key);
  }
  return buf;
}

/* ---- shapes -------------------------------------------------------------- */

const char *hora__shape_format(const struct hora__shape *s, char *buf, size_t n) {
  if (!s || s->ndims < 0) {
    snprintf(buf, n, "no shape");
    return buf;
  }
  size_t o = (size_t)snprintf(buf, n, "shape [");
  for (int i = 0; i < s->ndims && o < n; i++) {
    if (o + 28 >= n) {
      o += (size_t)snprintf(buf + o, n - o, "...");
      break;
    }
    o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)s->dims[i]);
  }
  if (o < n) {
    snprintf(buf + o, n - o, "]");
  }
  return buf;
}

int hora__shape_holds(const char *call, const struct hora__shape *s, uint64_t count) {
  char shown[400];
  uint64_t n = 1;
  bool overflow = false, empty = false;
  for (int i = 0; i < s->ndims; i++) {
    int64_t d = s->dims[i];
    if (d < 0) {
      return hora__error(HORA_ERR_INVALID_ARG, "%s: dimension %d is %lld in %s", call, i,
                         (long long)d, hora__shape_format(s, shown, sizeof(shown)));
    }
    empty |= d == 0;
    if (d > 0 && n > UINT64_MAX / (uint64_t)d) {
      overflow = true;
    } else {
      n *= (uint64_t)d;
    }
  }
  if (empty) {
    n = 0; /* a zero dimension empties the tensor, however big the rest */
  } else if (overflow) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s: %s holds more than %llu elements, but count is "
                       "%llu", call, hora__shape_format(s, shown, sizeof(shown)),
                       (unsigned long long)UINT64_MAX, (unsigned long long)count);
  }
  if (n != count) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s: %s holds %llu elements, but count is %llu", call,
                       hora__shape_format(s, shown, sizeof(shown)), (unsigned long long)n,
                       (unsigned long long)count);
  }
  return HORA_SUCCESS;
}

int hora__shape_check(const char *call, int ndims, const int64_t *dims, uint64_t count,
                      struct hora__shape *out) {
  out->ndims = -1;
  if (ndims == -1) {
    return HORA_SUCCESS;
  }
  if (ndims < -1 || ndims > HORA_MAX_DIMS) {
    return hora__error(HORA_ERR_INVALID_ARG,
                       "%s: ndims is %d; a shape has -1 (none) to %d dimensions", call, ndims,
                       HORA_MAX_DIMS);
  }
  if (ndims > 0 && !dims) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s: ndims is %d but dims is NULL", call, ndims);
  }
  if (ndims > 0) {
    memcpy(out->dims, dims, (size_t)ndims * sizeof(*dims));
  }
  out->ndims = ndims;
  int rc = hora__shape_holds(call, out, count);
  if (rc != HORA_SUCCESS) {
    out->ndims = -1;
  }
  return rc;
}

static uint64_t fnv1a_u64(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; i++) {
    h ^= (uint8_t)(v >> (8 * i));
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t hora__shape_fingerprint(uint8_t kind, const struct hora__shape *s) {
  if (!s || s->ndims < 0) {
    return 0;
  }
  uint64_t h = fnv1a_u64(0xcbf29ce484222325ull, (uint64_t)s->ndims);
  /* (Allgathers and alltoalls: each rank's own rows.) */
  bool rows_vary = kind == HORA_KIND_ALLGATHER || hora__kind_counts_vary(kind);
  for (int i = rows_vary ? 1 : 0; i < s->ndims; i++) {
    h = fnv1a_u64(h, (uint64_t)s->dims[i]);
  }
  return h ? h : 1;
}
