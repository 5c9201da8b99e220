/* Control-plane messages: requests to the coordinator (rank 0), its
 * responses, the cycles' bit vectors between ranks, aborts (what they
 * carry is in runtime/operation.h). Encoders write into a hora__wbuf;
 * decoders validate every field, since they parse bytes from another
 * process (they are fuzzed). */
#ifndef HORA_MESSAGE_H
#define HORA_MESSAGE_H

#include "base/common.h"
#include "base/wire.h"
#include "runtime/operation.h"

/* Frame types on a control connection. */
enum hora__msg_type {
  HORA_MSG_REQUESTS = 1,  /* rank -> rank 0: operations not in the cache */
  HORA_MSG_RESPONSES = 2, /* rank 0 -> ranks: what to run, in order */
  HORA_MSG_ABORT = 3,     /* either way: a fatal error, to every rank */
  HORA_MSG_CYCLE = 4,     /* rank <-> partner: one step of a cycle's reduction */
  HORA_MSG_HEARTBEAT = 5, /* either way, empty: "still here" */
  HORA_MSG_STUCK = 6,     /* rank -> rank 0: a cycle waits on someone too long */
};

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
 * One step of a cycle's allreduce of cache bit vectors (engine/cycle_steps.c):
 * four vectors of nbytes each, ready (AND), submitted (OR), evict (OR) and
 * eager (AND: slots whose data travels with the cycle), the count of
 * response frames rank 0 had sent (MAX), flags (OR), the lateness of the
 * cycle before (below), and the eager slots' data, reduced, in slot order
 * (each slot's size is its cached operation's, which the decoder does not
 * know: the cycle checks it). */
#define HORA_CYCLE_JOINED 1u /* some rank has a join in flight */
#define HORA_CYCLE_VECTORS 4
#define HORA_CYCLE_EAGER_MAX (1u << 20) /* bytes of eager data a cycle may carry */
#define HORA_CYCLE_FLAGS_ALL HORA_CYCLE_JOINED

/* How long each rank had waited for the operations the cycle before
 * scheduled, reduced: the least wait and its rank (the one that came last;
 * ties to the lowest rank), the sum, and how many ranks told it (those
 * that stood in for none of them). ops: how many operations (the same
 * everywhere; MAX). */
struct hora__cycle_late {
  uint64_t ops, min_ns, sum_ns;
  uint32_t min_rank, ranks;
};
#define HORA_CYCLE_LATE_BYTES 32
/* Folds b into a. */
void hora__cycle_late_fold(struct hora__cycle_late *a, const struct hora__cycle_late *b);

struct hora__cycle_msg {
  uint64_t cycle;
  uint8_t step;
  uint8_t flags;
  uint64_t frames;
  uint32_t nbytes;
  const uint8_t *vec; /* 4 * nbytes; points into the decoded frame */
  struct hora__cycle_late late;
  uint32_t eager_len;
  const uint8_t *eager; /* eager_len bytes; points into the decoded frame */
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
  /* An allreduce of one tensor whose result came with the cycle that
   * scheduled it (engine/cycle_steps.c): left to copy out, or NULL. */
  uint8_t *eager;
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

#endif
