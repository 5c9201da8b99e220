/* Control-plane messages between the ranks and the coordinator (rank 0).
 * Encoders write into a hora__wbuf; decoders validate every field, since
 * they parse bytes from another process (they are fuzzed). */
#ifndef HORA_MESSAGE_H
#define HORA_MESSAGE_H

#include "common.h"
#include "wire.h"

/* Frame types on a control connection. */
enum hora__msg_type {
  HORA_MSG_REQUESTS = 1,  /* rank -> rank 0: operations submitted */
  HORA_MSG_RESPONSES = 2, /* rank 0 -> ranks: what to run, in order */
  HORA_MSG_ABORT = 3,     /* either way: a fatal error, to every rank */
  HORA_MSG_RESEND = 4,    /* rank 0 -> rank: cache bits it could not resolve */
  HORA_MSG_HEARTBEAT = 5, /* either way, empty: "still here" */
};

/* What a request or response is about. */
enum hora__kind {
  HORA_KIND_ALLREDUCE,
  HORA_KIND_BROADCAST,
  HORA_KIND_ALLGATHER,
  HORA_KIND_BARRIER,
  HORA_KIND_JOIN,
  HORA_KIND_SHUTDOWN,
  HORA_KIND_ERROR, /* responses only: the listed operations failed */
  HORA_KIND_COUNT_
};

const char *hora__kind_name(int kind);

/* What one rank asked for; ranks must agree on all of it. */
struct hora__op_meta {
  uint8_t kind;
  uint8_t dtype;
  uint8_t op;
  uint8_t device;      /* 0 host memory, 1 GPU memory */
  uint8_t compression; /* hora_compression, NONE unless it applies */
  int32_t root;
  uint64_t count;
  double prescale, postscale;
};

/* ---- requests ------------------------------------------------------------ */

struct hora__wire_request {
  struct hora__op_meta meta;
  const char *key; /* points into the decoded frame */
  size_t key_len;
};

/* A REQUESTS message: full requests, then the cache bits of the requests
 * that are in the response cache, tagged with the sender's cache version. */
void hora__encode_requests_begin(struct hora__wbuf *w);
void hora__encode_request(struct hora__wbuf *w, const struct hora__op_meta *meta, const char *key,
                          size_t key_len);
/* Patches the count written by _begin and appends the cache bits. */
void hora__encode_requests_end(struct hora__wbuf *w, uint32_t n, uint32_t cache_version,
                               const uint8_t *bits, uint32_t nbytes);

struct hora__request_sink {
  int (*request)(void *arg, const struct hora__wire_request *req);
  int (*cached)(void *arg, uint32_t cache_version, uint32_t slot);
  void *arg;
};

/* Calls the sink for every request and every set cache bit of a REQUESTS
 * payload. Validates all of it before the first call, so a malformed
 * message has no effect. */
int hora__decode_requests(const uint8_t *p, size_t n, const struct hora__request_sink *sink);

/* RESEND := u32 cache_version, u32 n, n x u32 slot */
void hora__encode_resend(struct hora__wbuf *w, uint32_t cache_version, const uint32_t *slots,
                         uint32_t n);
int hora__decode_resend(const uint8_t *p, size_t n, uint32_t *cache_version,
                        int (*fn)(void *arg, uint32_t version, uint32_t slot), void *arg);

/* ---- responses ----------------------------------------------------------- */

struct hora__resp_tensor {
  char *key;
  uint16_t key_len;
  uint64_t count;
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
  uint32_t ntensors;
  struct hora__resp_tensor *tensors;
};

struct hora__response *hora__response_new(uint8_t kind, uint32_t ntensors);
void hora__response_free(struct hora__response *r);
int hora__response_set_tensor(struct hora__response *r, uint32_t i, const char *key,
                              size_t key_len, uint64_t count);

/* What tensor i of a response asked for. */
void hora__response_meta(const struct hora__response *r, uint32_t i, struct hora__op_meta *m);

struct hora__cache;
/* Encodes responses, referring to cached tensors by slot, and records them
 * in `cache` (may be NULL: no references). The decoder must see the same
 * cache state, which holds when every rank applies the responses in order. */
int hora__encode_responses(struct hora__wbuf *w, struct hora__response *const *rs, uint32_t n,
                           struct hora__cache *cache);
/* Appends the decoded responses to *tail (a queue), resolving and recording
 * cached tensors in `cache` (may be NULL). */
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
