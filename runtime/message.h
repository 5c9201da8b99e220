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
  uint8_t device; /* 0 host memory, 1 GPU memory */
  int32_t root;
  uint64_t count;
};

/* ---- requests ------------------------------------------------------------ */

struct hora__wire_request {
  struct hora__op_meta meta;
  const char *key; /* points into the decoded frame */
  size_t key_len;
};

void hora__encode_requests_begin(struct hora__wbuf *w);
void hora__encode_request(struct hora__wbuf *w, const struct hora__op_meta *meta, const char *key,
                          size_t key_len);
/* Patches the count written by _begin. */
void hora__encode_requests_end(struct hora__wbuf *w, uint32_t n);

/* Calls fn for every request of a REQUESTS payload. Validates all of it
 * before the first call, so a malformed message has no effect. */
int hora__decode_requests(const uint8_t *p, size_t n,
                          int (*fn)(void *arg, const struct hora__wire_request *req), void *arg);

/* ---- responses ----------------------------------------------------------- */

struct hora__resp_tensor {
  char *key;
  uint16_t key_len;
  uint64_t count;
};

struct hora__response {
  struct hora__response *next; /* queue link */
  uint8_t kind;                /* hora__kind */
  uint8_t dtype, op, device;
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

void hora__encode_responses(struct hora__wbuf *w, struct hora__response *const *rs, uint32_t n);
/* Appends the decoded responses to *tail (a queue). */
int hora__decode_responses(const uint8_t *p, size_t n, struct hora__response ***tail);

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
