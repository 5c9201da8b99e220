/* Control-plane messages: requests to the coordinator (rank 0), its
 * responses, the cycles' bit vectors between ranks, aborts.
 * Encoders write into a hora__wbuf; decoders validate every field, since
 * they parse bytes from another process (they are fuzzed). */
#ifndef HORA_MESSAGE_H
#define HORA_MESSAGE_H

#include "base/common.h"
#include "base/wire.h"

/* Frame types on a control connection. */
enum hora__msg_type {
  HORA_MSG_REQUESTS = 1,  /* rank -> rank 0: operations not in the cache */
  HORA_MSG_RESPONSES = 2, /* rank 0 -> ranks: what to run, in order */
  HORA_MSG_ABORT = 3,     /* either way: a fatal error, to every rank */
  HORA_MSG_CYCLE = 4,     /* rank <-> partner: one step of a cycle's reduction */
  HORA_MSG_HEARTBEAT = 5, /* either way, empty: "still here" */
  HORA_MSG_STUCK = 6,     /* rank -> rank 0: a cycle waits on someone too long */
};

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
/* What ranks compare: FNV-1a over ndims and the dimensions that must agree
 * (all of them; for an allgather all but the first, each rank's own rows).
 * Never 0, which stands for "no shape". */
uint64_t hora__shape_fingerprint(uint8_t kind, const struct hora__shape *s);
/* "shape [17, 1311]", or "no shape" for NULL or ndims -1. */
const char *hora__shape_format(const struct hora__shape *s, char *buf, size_t n);

/* ---- requests ------------------------------------------------------------ */

struct hora__wire_request {
  struct hora__op_meta meta;
  const char *key; /* points into the decoded frame */
  size_t key_len;
  uint32_t waited_ms; /* since it was submitted: the stall inspector counts from there */
  const struct hora__shape *shape; /* NULL: none (meta.shape is its fingerprint) */
};

/* A REQUESTS message: the requests that could not go as a cache bit. */
void hora__encode_requests_begin(struct hora__wbuf *w);
void hora__encode_request_shaped(struct hora__wbuf *w, const struct hora__op_meta *meta,
                                 const struct hora__shape *shape, const char *key, size_t key_len,
                                 uint32_t waited_ms);
/* A request without a shape. */
static inline void hora__encode_request(struct hora__wbuf *w, const struct hora__op_meta *meta,
                                        const char *key, size_t key_len, uint32_t waited_ms) {
  hora__encode_request_shaped(w, meta, NULL, key, key_len, waited_ms);
}
/* Patches the count written by _begin. */
void hora__encode_requests_end(struct hora__wbuf *w, uint32_t n);

struct hora__request_sink {
  int (*request)(void *arg, const struct hora__wire_request *req);
  void *arg;
};

/* Calls the sink for every request of a REQUESTS payload. Validates all of
 * it before the first call, so a malformed message has no effect. */
int hora__decode_requests(const uint8_t *p, size_t n, const struct hora__request_sink *sink);

/* ---- cycles ------------------------------------------------------------------
 * One step of a cycle's allreduce of cache bit vectors (cycle_steps.c): three
 * vectors of nbytes each, ready (AND), submitted (OR) and evict (OR), the
 * count of response frames rank 0 had sent (MAX) and flags (OR). */
#define HORA_CYCLE_JOINED 1u /* some rank has a join in flight */
#define HORA_CYCLE_FLAGS_ALL HORA_CYCLE_JOINED

struct hora__cycle_msg {
  uint64_t cycle;
  uint8_t step;
  uint8_t flags;
  uint64_t frames;
  uint32_t nbytes;
  const uint8_t *vec; /* 3 * nbytes; points into the decoded frame */
};

void hora__encode_cycle(struct hora__wbuf *w, const struct hora__cycle_msg *m);
int hora__decode_cycle(const uint8_t *p, size_t n, struct hora__cycle_msg *m);

/* STUCK := u64 cycle, u32 waited_ms, str key (one operation waiting on it,
 * or empty): what the stall inspector needs when a rank that stopped
 * answering holds up a cycle. */
void hora__encode_stuck(struct hora__wbuf *w, uint64_t cycle, uint32_t waited_ms, const char *key,
                        size_t key_len);
int hora__decode_stuck(const uint8_t *p, size_t n, uint64_t *cycle, uint32_t *waited_ms,
                       const char **key, size_t *key_len);

/* ---- responses ----------------------------------------------------------- */

struct hora__resp_tensor {
  char *key;
  uint16_t key_len;
  uint64_t count;
  uint64_t shape; /* the shape's fingerprint (op_meta.shape): each fused tensor keeps its own */
};

struct hora__response {
  struct hora__response *next; /* queue link */
  uint8_t kind;                /* hora__kind */
  uint8_t dtype, op, device, compression;
  double prescale, postscale;
  int32_t root;
  int32_t last_joined; /* JOIN: the rank that joined last */
  uint16_t error_code; /* ERROR */
  char *error_msg;     /* ERROR */
  uint32_t ntensors, tensors_cap; /* tensors in use, and room for */
  struct hora__resp_tensor *tensors;
};

struct hora__response *hora__response_new(uint8_t kind, uint32_t ntensors);
void hora__response_free(struct hora__response *r);
int hora__response_set_tensor(struct hora__response *r, uint32_t i, const char *key,
                              size_t key_len, uint64_t count);

/* A response of one tensor that runs `m` on `key`; NULL when out of memory. */
struct hora__response *hora__response_for(const struct hora__op_meta *m, const char *key,
                                         size_t key_len);

/* What tensor i of a response asked for. */
void hora__response_meta(const struct hora__response *r, uint32_t i, struct hora__op_meta *m);

struct hora__cache;
int hora__encode_responses(struct hora__wbuf *w, struct hora__response *const *rs, uint32_t n);
/* Appends the decoded responses to *tail (a queue) and records their
 * tensors in `cache` (may be NULL): every rank applies the same frames at
 * the same point of the cycles, so every cache makes the same updates. */
int hora__decode_responses(const uint8_t *p, size_t n, struct hora__response ***tail,
                           struct hora__cache *cache);

/* ---- abort ------------------------------------------------------------------ */
void hora__encode_abort(struct hora__wbuf *w, int origin, int code, const char *msg);
int hora__decode_abort(const uint8_t *p, size_t n, int *origin, int *code, char *msg,
                       size_t msg_size);

/* Human name of a key: the user's name, or "unnamed #5" / "barrier #2". */
const char *hora__key_display(const char *key, size_t len, char *buf, size_t n);

/* Key prefixes: every key starts with one of these. */
#define HORA_KEY_NAMED 'N'
#define HORA_KEY_UNNAMED 'U'
#define HORA_KEY_BARRIER 'B'
#define HORA_KEY_JOIN 'J'
#define HORA_KEY_SHUTDOWN 'S'

#endif
