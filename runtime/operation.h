/* What an operation is, for every layer of the runtime: its kind, what
 * the ranks must agree on (its meta), the caller's shape, and its key. The
 * messages that carry them between ranks are in negotiate/message.h. */
#ifndef HORA_OPERATION_H
#define HORA_OPERATION_H

#include "base/common.h"

/* What a request or response is about. */
enum hora__kind {
  HORA_KIND_ALLREDUCE,
  HORA_KIND_BROADCAST,
  HORA_KIND_ALLGATHER,
  HORA_KIND_REDUCESCATTER,
  HORA_KIND_ALLGATHERV, /* counts differ by rank: exchanged when it runs, not negotiated */
  HORA_KIND_ALLTOALL,   /* the last of the collectives: kinds up to it are cached */
  HORA_KIND_BARRIER,
  HORA_KIND_JOIN,
  HORA_KIND_SHUTDOWN,
  HORA_KIND_ERROR, /* responses only: the listed operations failed */
  HORA_KIND_COUNT_
};

const char *hora__kind_name(int kind);
#define HORA_KIND_LAST_COLLECTIVE HORA_KIND_ALLTOALL

/* Collectives whose counts each rank gives for itself (meta.count is 0). */
static inline bool hora__kind_counts_vary(int kind) {
  return kind == HORA_KIND_ALLGATHERV || kind == HORA_KIND_ALLTOALL;
}
/* Collectives a joined rank stands in for, with zeros. */
static inline bool hora__kind_stands_in(int kind) {
  return kind == HORA_KIND_ALLREDUCE || kind == HORA_KIND_REDUCESCATTER;
}
/* Collectives a joined rank takes part in without submitting them: the
 * reductions (adding zeros), allgathers (zeros, or no elements where counts
 * vary) and alltoalls (sending nothing). A broadcast is decided by its root. */
static inline bool hora__kind_joined_takes_part(int kind) {
  return hora__kind_stands_in(kind) || kind == HORA_KIND_ALLGATHER || hora__kind_counts_vary(kind);
}
/* The timeline row of a kind's negotiation: "NEGOTIATE_ALLREDUCE". */
const char *hora__negotiate_phase(int kind);

/* What one rank asked for; ranks must agree on all of it. */
struct hora__op_meta {
  uint8_t kind;
  uint8_t dtype;
  uint8_t op;
  uint8_t device;      /* 0 host memory, 1 GPU memory */
  uint8_t compression; /* hora_compression, NONE unless it applies */
  int32_t root; /* broadcast: its root; reducescatter: the rows it splits (0: elements) */
  uint64_t count;
  double prescale, postscale;
  uint64_t shape; /* hora__shape_fingerprint of the caller's shape; 0: none given */
  /* A group's (hora_group_start/end): a fingerprint of its members' keys,
   * and how many there are; 0 and 0 outside a group. */
  uint64_t group;
  uint32_t group_size;
  /* A reducescatter split by explicit counts (hora_reducescatterv_async; its
   * root is then -1): a fingerprint of them, never 0; else 0. */
  uint64_t split;
};

/* A tensor's shape as the caller gave it (ndims -1: none). Kept in the
 * request itself, so a shape costs no allocation. */
struct hora__shape {
  int32_t ndims;
  int64_t dims[HORA_MAX_DIMS];
};

/* Checks that ndims/dims describe `count` elements and copies them into
 * *out; HORA_ERR_INVALID_ARG naming `call` otherwise. ndims -1: no shape. */
int hora__shape_check(const char *call, int ndims, const int64_t *dims, uint64_t count,
                      struct hora__shape *out);
/* Whether shape s (ndims 0 to HORA_MAX_DIMS) holds `count` elements; an
 * error naming `call` when not. */
int hora__shape_holds(const char *call, const struct hora__shape *s, uint64_t count);
/* What ranks compare: FNV-1a over ndims and the dimensions that must agree
 * (all of them; for an allgather all but the first, each rank's own rows).
 * Never 0, which stands for "no shape". */
uint64_t hora__shape_fingerprint(uint8_t kind, const struct hora__shape *s);
/* "shape [17, 1311]", or "no shape" for NULL or ndims -1. */
const char *hora__shape_format(const struct hora__shape *s, char *buf, size_t n);

/* Human name of a key: the user's name, or "unnamed #5" / "barrier #2". */
const char *hora__key_display(const char *key, size_t len, char *buf, size_t n);

/* Key prefixes: every key starts with one of these. */
#define HORA_KEY_NAMED 'N'
#define HORA_KEY_UNNAMED 'U'
#define HORA_KEY_BARRIER 'B'
#define HORA_KEY_JOIN 'J'
#define HORA_KEY_SHUTDOWN 'S'

#endif
