/* Control messages: round trips, and rejection of every kind of malformed
 * input without side effects. */
#include <stdlib.h>

#include "comm/bootstrap/bootstrap.h"
#include "comm/comm.h"
#include "comm/transport/socket.h"
#include "runtime/negotiate/cache.h"
#include "runtime/negotiate/message.h"
#include "../runner.h"

struct collected {
  int n;
  struct hora__op_meta meta[16];
  char keys[16][HORA_KEY_MAX + 1];
  uint32_t waited_ms[16];
  struct hora__shape shapes[16];
};

static int collect(void *arg, const struct hora__wire_request *req) {
  struct collected *c = arg;
  if (c->n == 16) {
    return hora__error(HORA_ERR_INVALID_ARG, "test collector is full");
  }
  c->meta[c->n] = req->meta;
  memcpy(c->keys[c->n], req->key, req->key_len);
  c->keys[c->n][req->key_len] = '\0';
  c->waited_ms[c->n] = req->waited_ms;
  c->shapes[c->n].ndims = -1;
  if (req->shape) {
    c->shapes[c->n] = *req->shape;
  }
  c->n++;
  return HORA_SUCCESS;
}

static int decode(const uint8_t *p, size_t n, struct collected *c) {
  struct hora__request_sink sink = {collect, c};
  return hora__decode_requests(p, n, &sink);
}

/* An allreduce of shape [10, 4, 25], a broadcast without a shape and an
 * allgather of shape [0, 3]. */
static void encode_three(struct hora__wbuf *w) {
  struct hora__op_meta m1 = {.kind = HORA_KIND_ALLREDUCE, .dtype = HORA_FLOAT32, .op = HORA_SUM,
                             .root = -1, .count = 1000, .prescale = 0.5, .postscale = 2,
                             .compression = HORA_COMPRESSION_FP16, .group = 0x1234567890abcdefull,
                             .group_size = 3};
  struct hora__op_meta m2 = {.kind = HORA_KIND_BROADCAST, .dtype = HORA_INT64, .root = 3,
                             .count = 7, .prescale = 1, .postscale = 1};
  struct hora__op_meta m3 = {.kind = HORA_KIND_ALLGATHER, .dtype = HORA_INT8, .root = -1,
                             .count = 0, .prescale = 1, .postscale = 1};
  struct hora__shape s1 = {3, {10, 4, 25}}, s3 = {2, {0, 3}};
  m1.shape = hora__shape_fingerprint(m1.kind, &s1);
  m3.shape = hora__shape_fingerprint(m3.kind, &s3);
  hora__encode_requests_begin(w);
  hora__encode_request_shaped(w, &m1, &s1, "Ngrad/layer1", 12, 0);
  hora__encode_request(w, &m2, "U17", 3, 2500);
  hora__encode_request_shaped(w, &m3, &s3, "Nrows", 5, 1);
  hora__encode_requests_end(w, 3);
}

TEST(message_requests_roundtrip) {
  struct hora__wbuf w = {0};
  encode_three(&w);
  struct collected c = {0};
  ASSERT(decode(w.data, w.len, &c) == HORA_SUCCESS);
  ASSERT_EQ_INT(c.n, 3);
  ASSERT(strcmp(c.keys[0], "Ngrad/layer1") == 0 && strcmp(c.keys[1], "U17") == 0);
  ASSERT(c.meta[0].count == 1000 && c.meta[0].dtype == HORA_FLOAT32);
  ASSERT(c.meta[0].prescale == 0.5 && c.meta[0].postscale == 2 && c.meta[0].compression == 1);
  ASSERT(c.meta[1].root == 3 && c.meta[1].kind == HORA_KIND_BROADCAST);
  ASSERT(c.meta[0].group == 0x1234567890abcdefull && c.meta[0].group_size == 3);
  ASSERT(c.meta[1].group == 0 && c.meta[1].group_size == 0 && c.meta[1].split == 0);
  ASSERT(c.waited_ms[0] == 0 && c.waited_ms[1] == 2500);
  /* The shapes arrive whole; the fingerprint is derived from them. */
  struct hora__shape s1 = {3, {10, 4, 25}};
  ASSERT(c.shapes[0].ndims == 3 && c.shapes[0].dims[2] == 25);
  ASSERT(c.meta[0].shape == hora__shape_fingerprint(HORA_KIND_ALLREDUCE, &s1));
  ASSERT(c.shapes[1].ndims == -1 && c.meta[1].shape == 0);
  ASSERT(c.shapes[2].ndims == 2 && c.shapes[2].dims[0] == 0 && c.shapes[2].dims[1] == 3);
  ASSERT(c.meta[2].shape != 0);
  hora__wbuf_free(&w);
}

/* Shapes: what holds count elements, what the fingerprint compares, and
 * how a mismatch message shows them. */
TEST(message_shapes) {
  struct hora__shape s;
  ASSERT(hora__shape_check("t", -1, NULL, 5, &s) == HORA_SUCCESS && s.ndims == -1);
  const int64_t d[] = {17, 1311}, e[] = {17, 23, 57}, z[] = {INT64_MAX, INT64_MAX, 0};
  ASSERT(hora__shape_check("t", 2, d, 22287, &s) == HORA_SUCCESS && s.ndims == 2);
  char buf[64];
  ASSERT(strcmp(hora__shape_format(&s, buf, sizeof(buf)), "shape [17, 1311]") == 0);
  ASSERT(strcmp(hora__shape_format(NULL, buf, sizeof(buf)), "no shape") == 0);
  uint64_t fd = hora__shape_fingerprint(HORA_KIND_ALLREDUCE, &s);
  ASSERT(hora__shape_check("t", 3, e, 22287, &s) == HORA_SUCCESS);
  uint64_t fe = hora__shape_fingerprint(HORA_KIND_ALLREDUCE, &s);
  ASSERT(fd != 0 && fe != 0 && fd != fe);
  ASSERT(hora__shape_check("t", 2, d, 22288, &s) == HORA_ERR_INVALID_ARG && s.ndims == -1);
  ASSERT_STR_CONTAINS(hora__error_message(), "t: shape [17, 1311] holds 22287 elements, but count is 22288");
  ASSERT(hora__shape_check("t", 33, d, 1, &s) == HORA_ERR_INVALID_ARG);
  ASSERT(hora__shape_check("t", -2, d, 1, &s) == HORA_ERR_INVALID_ARG);
  ASSERT(hora__shape_check("t", 1, NULL, 1, &s) == HORA_ERR_INVALID_ARG);
  ASSERT(hora__shape_check("t", 3, z, 0, &s) == HORA_SUCCESS); /* a zero dimension: empty */
  ASSERT(hora__shape_check("t", 2, z, 0, &s) == HORA_ERR_INVALID_ARG); /* overflows */
  ASSERT(hora__shape_check("t", 0, NULL, 1, &s) == HORA_SUCCESS);
  ASSERT(strcmp(hora__shape_format(&s, buf, sizeof(buf)), "shape []") == 0);
  /* A scalar is not a vector of one, nor no shape. */
  uint64_t f0 = hora__shape_fingerprint(HORA_KIND_ALLREDUCE, &s);
  struct hora__shape one = {1, {1}};
  ASSERT(f0 != 0 && f0 != hora__shape_fingerprint(HORA_KIND_ALLREDUCE, &one));
  /* An allgather's first dimension is each rank's own. */
  struct hora__shape a = {2, {4, 3}}, b = {2, {9, 3}}, c = {2, {4, 5}};
  ASSERT(hora__shape_fingerprint(HORA_KIND_ALLGATHER, &a) ==
         hora__shape_fingerprint(HORA_KIND_ALLGATHER, &b));
  ASSERT(hora__shape_fingerprint(HORA_KIND_ALLGATHER, &a) !=
         hora__shape_fingerprint(HORA_KIND_ALLGATHER, &c));
  ASSERT(hora__shape_fingerprint(HORA_KIND_ALLREDUCE, &a) !=
         hora__shape_fingerprint(HORA_KIND_ALLREDUCE, &b));
  /* A long shape is cut, not overrun. */
  struct hora__shape big = {HORA_MAX_DIMS, {0}};
  for (int i = 0; i < HORA_MAX_DIMS; i++) {
    big.dims[i] = INT64_MAX;
  }
  hora__shape_format(&big, buf, sizeof(buf));
  ASSERT(strlen(buf) < sizeof(buf) && strstr(buf, "...]"));
}

/* The decoder refuses shapes that do not describe the request. */
TEST(message_requests_reject_bad_shapes) {
  struct hora__op_meta m = {.kind = HORA_KIND_ALLREDUCE, .dtype = HORA_FLOAT32, .root = -1,
                            .count = 12, .prescale = 1, .postscale = 1};
  struct {
    uint8_t kind;
    struct hora__shape shape;
  } bad[] = {
      {HORA_KIND_ALLREDUCE, {2, {3, 5}}},   /* 15 elements, count 12 */
      {HORA_KIND_ALLREDUCE, {2, {-3, -4}}}, /* negative */
      {HORA_KIND_BARRIER, {1, {12}}},       /* a barrier has no shape */
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    struct hora__wbuf w = {0};
    m.kind = bad[i].kind;
    hora__encode_requests_begin(&w);
    hora__encode_request(&w, &m, "Nok", 3, 0);
    hora__encode_request_shaped(&w, &m, &bad[i].shape, "Nbad", 4, 0);
    hora__encode_requests_end(&w, 2);
    struct collected c = {0};
    ASSERT(decode(w.data, w.len, &c) == HORA_ERR_INVALID_ARG);
    ASSERT_EQ_INT(c.n, 0);
    hora__wbuf_free(&w);
  }
  /* More dimensions than a shape has: refused before any is read. */
  struct hora__wbuf w = {0};
  m.kind = HORA_KIND_ALLREDUCE;
  hora__encode_requests_begin(&w);
  hora__encode_request(&w, &m, "Nok", 3, 0);
  w.data[w.len - 1] = HORA_MAX_DIMS + 1;
  for (int i = 0; i < HORA_MAX_DIMS + 1; i++) {
    hora__wbuf_u64(&w, 1);
  }
  hora__encode_requests_end(&w, 1);
  struct collected c = {0};
  ASSERT(decode(w.data, w.len, &c) == HORA_ERR_INVALID_ARG && c.n == 0);
  hora__wbuf_free(&w);
}

/* int16 and bool (8 and 9, appended to the dtypes) travel; 10 does not. */
TEST(message_requests_new_dtypes) {
  const uint8_t dtypes[] = {HORA_INT16, HORA_BOOL, HORA_BOOL + 1};
  for (int i = 0; i < 3; i++) {
    struct hora__op_meta m = {.kind = HORA_KIND_ALLREDUCE, .dtype = dtypes[i], .op = HORA_MIN,
                              .root = -1, .count = 5, .prescale = 1, .postscale = 1};
    struct hora__wbuf w = {0};
    hora__encode_requests_begin(&w);
    hora__encode_request(&w, &m, "Nmask", 5, 0);
    hora__encode_requests_end(&w, 1);
    struct collected c = {0};
    int rc = decode(w.data, w.len, &c);
    if (i < 2) {
      ASSERT(rc == HORA_SUCCESS && c.n == 1 && c.meta[0].dtype == dtypes[i]);
    } else {
      ASSERT(rc == HORA_ERR_INVALID_ARG && c.n == 0);
    }
    hora__wbuf_free(&w);
  }
}

TEST(message_requests_reject_malformed) {
  struct hora__wbuf w = {0};
  encode_three(&w);
  /* Every truncation fails, and no request is delivered. */
  for (size_t n = 0; n < w.len; n++) {
    struct collected c = {0};
    ASSERT(decode(w.data, n, &c) == HORA_ERR_INVALID_ARG);
    ASSERT_EQ_INT(c.n, 0);
  }
  /* Every single-byte corruption either decodes to valid requests or fails
   * cleanly; valid ones only ever carry valid fields. */
  for (size_t i = 0; i < w.len; i++) {
    for (int bit = 0; bit < 8; bit++) {
      uint8_t *copy = malloc(w.len);
      memcpy(copy, w.data, w.len);
      copy[i] ^= (uint8_t)(1 << bit);
      struct collected c = {0};
      int rc = decode(copy, w.len, &c);
      if (rc == HORA_SUCCESS) {
        for (int k = 0; k < c.n; k++) {
          ASSERT(c.meta[k].kind <= HORA_KIND_SHUTDOWN);
          ASSERT(c.meta[k].dtype <= HORA_BOOL && c.meta[k].op <= HORA_PRODUCT);
          ASSERT(c.meta[k].compression <= 2);
          ASSERT(c.shapes[k].ndims >= -1 && c.shapes[k].ndims <= HORA_MAX_DIMS);
          ASSERT((c.shapes[k].ndims == -1) == (c.meta[k].shape == 0));
        }
      } else {
        ASSERT_EQ_INT(c.n, 0);
      }
      free(copy);
    }
  }
  /* A huge claimed count with no bytes behind it. */
  uint8_t huge[4] = {0xff, 0xff, 0xff, 0xff};
  struct collected c = {0};
  ASSERT(decode(huge, 4, &c) == HORA_ERR_INVALID_ARG);
  /* Trailing garbage. */
  uint8_t *longer = malloc(w.len + 1);
  memcpy(longer, w.data, w.len);
  longer[w.len] = 0;
  ASSERT(decode(longer, w.len + 1, &c) == HORA_ERR_INVALID_ARG);
  free(longer);
  hora__wbuf_free(&w);
}

static struct hora__response *sample_responses(void) {
  struct hora__response *a = hora__response_new(HORA_KIND_ALLREDUCE, 2);
  a->dtype = HORA_BFLOAT16;
  a->op = HORA_AVERAGE;
  a->prescale = 0.25;
  hora__response_set_tensor(a, 0, "Na", 2, 5);
  hora__response_set_tensor(a, 1, "Nbb", 3, 1ull << 33);
  a->tensors[0].shape = 0x1234567890abcdefull; /* fused tensors, each its own shape */
  a->tensors[1].shape = 0;
  struct hora__response *e = hora__response_new(HORA_KIND_ERROR, 1);
  e->error_code = HORA_ERR_MISMATCH;
  e->error_msg = strdup("allreduce 'x': rank 0 sent 10 elements, rank 1 sent 11");
  hora__response_set_tensor(e, 0, "Nx", 2, 0);
  struct hora__response *j = hora__response_new(HORA_KIND_JOIN, 0);
  j->last_joined = 3;
  a->next = e;
  e->next = j;
  return a;
}

static void free_list(struct hora__response *r) {
  while (r) {
    struct hora__response *n = r->next;
    hora__response_free(r);
    r = n;
  }
}

TEST(message_responses_roundtrip) {
  struct hora__response *list = sample_responses();
  struct hora__response *v[3] = {list, list->next, list->next->next};
  struct hora__wbuf w = {0};
  ASSERT(hora__encode_responses(&w, v, 3) == HORA_SUCCESS);
  struct hora__response *head = NULL, **tail = &head;
  ASSERT(hora__decode_responses(w.data, w.len, &tail, NULL) == HORA_SUCCESS);
  ASSERT(head && head->next && head->next->next && !head->next->next->next);
  ASSERT(tail == &head->next->next->next);
  ASSERT(head->kind == HORA_KIND_ALLREDUCE && head->ntensors == 2 && head->op == HORA_AVERAGE);
  ASSERT(head->prescale == 0.25 && head->postscale == 1.0);
  ASSERT(head->tensors[1].count == 1ull << 33 && strcmp(head->tensors[1].key, "Nbb") == 0);
  ASSERT(head->tensors[0].shape == 0x1234567890abcdefull && head->tensors[1].shape == 0);
  struct hora__op_meta m;
  hora__response_meta(head, 0, &m);
  ASSERT(m.shape == 0x1234567890abcdefull && m.count == 5);
  ASSERT(head->next->error_code == HORA_ERR_MISMATCH);
  ASSERT_STR_CONTAINS(head->next->error_msg, "rank 1 sent 11");
  ASSERT_EQ_INT(head->next->next->last_joined, 3);
  free_list(head);
  free_list(list);
  hora__wbuf_free(&w);
}

TEST(message_responses_reject_malformed) {
  struct hora__response *list = sample_responses();
  struct hora__response *v[3] = {list, list->next, list->next->next};
  struct hora__wbuf w = {0};
  ASSERT(hora__encode_responses(&w, v, 3) == HORA_SUCCESS);
  for (size_t n = 0; n < w.len; n++) {
    struct hora__response *head = NULL, **tail = &head;
    ASSERT(hora__decode_responses(w.data, n, &tail, NULL) == HORA_ERR_INVALID_ARG);
    ASSERT(head == NULL);
  }
  for (size_t i = 0; i < w.len; i++) {
    uint8_t *copy = malloc(w.len);
    memcpy(copy, w.data, w.len);
    copy[i] ^= 0xa5;
    struct hora__response *head = NULL, **tail = &head;
    if (hora__decode_responses(copy, w.len, &tail, NULL) == HORA_SUCCESS) {
      for (struct hora__response *r = head; r; r = r->next) {
        ASSERT(r->kind < HORA_KIND_COUNT_ && r->error_code < HORA_RESULT_COUNT_);
      }
      free_list(head);
    } else {
      ASSERT(head == NULL);
    }
    free(copy);
  }
  free_list(list);
  hora__wbuf_free(&w);
}

TEST(message_abort_roundtrip) {
  struct hora__wbuf w = {0};
  hora__encode_abort(&w, 5, HORA_ERR_PEER_LOST, "lost rank 5 (host h1, pid 99)");
  int origin, code;
  char msg[128];
  ASSERT(hora__decode_abort(w.data, w.len, &origin, &code, msg, sizeof(msg)) == HORA_SUCCESS);
  ASSERT(origin == 5 && code == HORA_ERR_PEER_LOST && strcmp(msg, "lost rank 5 (host h1, pid 99)") == 0);
  char small[8];
  ASSERT(hora__decode_abort(w.data, w.len, &origin, &code, small, sizeof(small)) == HORA_SUCCESS);
  ASSERT(strlen(small) == 7);
  ASSERT(hora__decode_abort(w.data, w.len - 1, &origin, &code, msg, sizeof(msg)) == HORA_ERR_INVALID_ARG);
  w.data[4] = 0; /* code 0 is not an error */
  w.data[5] = 0;
  ASSERT(hora__decode_abort(w.data, w.len, &origin, &code, msg, sizeof(msg)) == HORA_ERR_INVALID_ARG);
  hora__wbuf_free(&w);
}

TEST(hello_checks_shape_and_rank) {
  struct hora__hello h = {.magic = HORA_HELLO_MAGIC, .version = HORA_HELLO_VERSION,
                          .kind = HORA_CONN_DATA, .rank = 3, .size = 8, .nonce = {9, 8, 7}};
  uint8_t wire[HORA_HELLO_WIRE_SIZE];
  hora__hello_encode(&h, wire);
  struct hora__hello out;
  ASSERT(hora__hello_decode(wire, 8, HORA_CONN_SLOTS, &out) == HORA_SUCCESS);
  ASSERT(out.rank == 3 && out.kind == HORA_CONN_DATA && out.nonce[2] == 7);
  /* another job's size */
  ASSERT(hora__hello_decode(wire, 4, HORA_CONN_SLOTS, &out) == HORA_ERR_INVALID_ARG);
  wire[4] = 1; /* version 1 carried the secret itself */
  ASSERT(hora__hello_decode(wire, 8, HORA_CONN_SLOTS, &out) == HORA_ERR_INVALID_ARG);
  ASSERT_STR_CONTAINS(hora_last_error(), "version 1");
  wire[4] = HORA_HELLO_VERSION;
  wire[0] = 'G'; /* e.g. an HTTP client */
  ASSERT(hora__hello_decode(wire, 8, HORA_CONN_SLOTS, &out) == HORA_ERR_INVALID_ARG);
}

/* Moves bytes between two handshakes until neither can move; `tap`, when
 * set, records what the connector sent. */
struct hs_tap {
  uint8_t bytes[256];
  size_t n;
};

static void hs_run(struct hora__hs *c, struct hora__hs *a, struct hs_tap *tap) {
  for (int guard = 0; guard < 64; guard++) {
    struct hora__hs *from = c->state == HORA_HS_SEND ? c : a->state == HORA_HS_SEND ? a : NULL;
    struct hora__hs *to = from == c ? a : c;
    if (!from || to->state != HORA_HS_RECV) {
      return;
    }
    uint8_t *src, *dst;
    size_t ns, nd;
    hora__hs_io(from, &src, &ns);
    hora__hs_io(to, &dst, &nd);
    size_t n = ns < nd ? ns : nd;
    memcpy(dst, src, n);
    if (tap && from == c && tap->n + n <= sizeof(tap->bytes)) {
      memcpy(tap->bytes + tap->n, src, n);
      tap->n += n;
    }
    hora__hs_advance(from, n);
    hora__hs_advance(to, n);
  }
}

/* Feeds recorded connector bytes to a fresh acceptor, as a replay would. */
static void hs_replay(struct hora__hs *a, const struct hs_tap *tap) {
  size_t off = 0;
  while (a->state != HORA_HS_FAILED && a->state != HORA_HS_DONE && off <= tap->n) {
    uint8_t *p;
    size_t n;
    hora__hs_io(a, &p, &n);
    if (a->state == HORA_HS_SEND) {
      hora__hs_advance(a, n); /* the attacker reads the challenge and ignores it */
      continue;
    }
    if (off == tap->n) {
      break;
    }
    n = n < tap->n - off ? n : tap->n - off;
    memcpy(p, tap->bytes + off, n);
    off += n;
    hora__hs_advance(a, n);
  }
}

TEST(handshake_proves_the_secret_both_ways) {
  uint8_t secret[HORA_SECRET_LEN], other[HORA_SECRET_LEN];
  for (int i = 0; i < HORA_SECRET_LEN; i++) {
    secret[i] = (uint8_t)(i * 7 + 1);
    other[i] = (uint8_t)(i * 7 + 2);
  }
  uint8_t n1[HORA_HS_NONCE_LEN] = {1}, n2[HORA_HS_NONCE_LEN] = {2}, n3[HORA_HS_NONCE_LEN] = {3};
  struct hora__hs c, a;
  /* Rank 5 connects to rank 2 for data: both sides end authenticated. */
  struct hs_tap tap = {.n = 0};
  hora__hs_connector(&c, secret, 8, HORA_CONN_SLOTS, 5, 2, HORA_CONN_DATA, n1);
  hora__hs_acceptor(&a, secret, 8, HORA_CONN_SLOTS, 2, n2);
  hs_run(&c, &a, &tap);
  ASSERT(c.state == HORA_HS_DONE && a.state == HORA_HS_DONE);
  ASSERT(a.authenticated && a.peer == 5 && a.kind == HORA_CONN_DATA);
  /* The secret never crossed the wire, not even 4 bytes of it. */
  for (size_t i = 0; i + 4 <= tap.n; i++) {
    for (int j = 0; j + 4 <= HORA_SECRET_LEN; j++) {
      ASSERT(memcmp(tap.bytes + i, secret + j, 4) != 0);
    }
  }
  /* A replay of everything the connector sent meets a new nonce: refused. */
  hora__hs_acceptor(&a, secret, 8, HORA_CONN_SLOTS, 2, n3);
  hs_replay(&a, &tap);
  ASSERT(a.state == HORA_HS_FAILED && !a.authenticated);
  ASSERT_STR_CONTAINS(a.why, "no proof of the job secret");
  /* Wrong secret on either side: neither accepts the other. */
  hora__hs_connector(&c, other, 8, HORA_CONN_SLOTS, 5, 2, HORA_CONN_DATA, n1);
  hora__hs_acceptor(&a, secret, 8, HORA_CONN_SLOTS, 2, n2);
  hs_run(&c, &a, NULL);
  ASSERT(c.state == HORA_HS_FAILED && a.state != HORA_HS_DONE && !a.authenticated);
  ASSERT_STR_CONTAINS(c.why, "without proof of the job secret");
  hora__hs_connector(&c, secret, 8, HORA_CONN_SLOTS, 5, 2, HORA_CONN_DATA, n1);
  hora__hs_acceptor(&a, other, 8, HORA_CONN_SLOTS, 2, n2);
  hs_run(&c, &a, NULL);
  ASSERT(c.state == HORA_HS_FAILED && !c.authenticated);
  /* Reflection: the acceptor's own MAC sent back as the proof fails (the
   * role is in the MAC). */
  hora__hs_acceptor(&a, secret, 8, HORA_CONN_SLOTS, 2, n2);
  uint8_t *p;
  size_t n;
  struct hora__hello h = {.magic = HORA_HELLO_MAGIC, .version = HORA_HELLO_VERSION,
                          .kind = HORA_CONN_CTRL, .rank = 5, .size = 8};
  hora__hello_encode(&h, tap.bytes);
  hora__hs_io(&a, &p, &n);
  memcpy(p, tap.bytes, n);
  hora__hs_advance(&a, n);
  ASSERT(a.state == HORA_HS_SEND && a.claimed && a.peer == 5);
  uint8_t challenge[HORA_HS_CHALLENGE_SIZE];
  hora__hs_io(&a, &p, &n);
  memcpy(challenge, p, n);
  hora__hs_advance(&a, n);
  hora__hs_io(&a, &p, &n);
  ASSERT(n == HORA_HS_PROOF_SIZE);
  memcpy(p, challenge + 8 + HORA_HS_NONCE_LEN, n);
  hora__hs_advance(&a, n);
  ASSERT(a.state == HORA_HS_FAILED && !a.authenticated);
  /* A proof for another kind or rank pair does not open this one. */
  uint8_t mac[HORA_HS_MAC_LEN];
  hora__hs_mac(secret, 'C', HORA_CONN_DATA, 5, 2, 8, h.nonce, challenge + 8, mac);
  hora__hs_acceptor(&a, secret, 8, HORA_CONN_SLOTS, 2, challenge + 8);
  hora__hs_io(&a, &p, &n);
  memcpy(p, tap.bytes, n);
  hora__hs_advance(&a, n);
  hora__hs_io(&a, &p, &n);
  hora__hs_advance(&a, n);
  hora__hs_io(&a, &p, &n);
  memcpy(p, mac, n);
  hora__hs_advance(&a, n);
  ASSERT(a.state == HORA_HS_FAILED);
  /* An answer from the wrong rank is refused before any MAC. */
  hora__hs_connector(&c, secret, 8, HORA_CONN_SLOTS, 5, 3, HORA_CONN_DATA, n1);
  hora__hs_acceptor(&a, secret, 8, HORA_CONN_SLOTS, 2, n2);
  hs_run(&c, &a, NULL);
  ASSERT(c.state == HORA_HS_FAILED);
  ASSERT_STR_CONTAINS(c.why, "answered as rank 2");
}

/* Two caches fed the same response frames stay identical (each rank's
 * cache sees the same frames at the same point of the cycles). */
/* One handshake between the keys of two memberships: DONE on both sides
 * only when they are the same membership's. */
static bool keys_connect(const uint8_t *kc, const uint8_t *ka) {
  uint8_t n1[HORA_HS_NONCE_LEN] = {1}, n2[HORA_HS_NONCE_LEN] = {2};
  struct hora__hs c, a;
  hora__hs_connector(&c, kc, 4, HORA_CONN_SLOTS, 3, 1, HORA_CONN_CTRL, n1);
  hora__hs_acceptor(&a, ka, 4, HORA_CONN_SLOTS, 1, n2);
  hs_run(&c, &a, NULL);
  return c.state == HORA_HS_DONE && a.state == HORA_HS_DONE;
}

TEST(connections_of_another_epoch_are_refused) {
  uint8_t secret[HORA_SECRET_LEN], job[8] = {1, 2, 3, 4, 5, 6, 7, 8}, job2[8] = {1, 2, 3, 4, 5, 6, 7, 9};
  for (int i = 0; i < HORA_SECRET_LEN; i++) {
    secret[i] = (uint8_t)(3 * i + 1);
  }
  uint8_t e1[HORA_SECRET_LEN], e1b[HORA_SECRET_LEN], e2[HORA_SECRET_LEN], j2[HORA_SECRET_LEN];
  hora__boot_connection_key(secret, job, 1, e1);
  hora__boot_connection_key(secret, job, 1, e1b);
  hora__boot_connection_key(secret, job, 2, e2);
  hora__boot_connection_key(secret, job2, 1, j2);
  ASSERT(memcmp(e1, e1b, sizeof(e1)) == 0);
  ASSERT(keys_connect(e1, e1b));
  ASSERT(!keys_connect(e1, e2) && !keys_connect(e2, e1));
  ASSERT(!keys_connect(e1, j2));
  ASSERT(memcmp(e1, secret, sizeof(e1)) != 0);
}

TEST(message_responses_note_the_cache) {
  struct hora__cache a, b;
  ASSERT(hora__cache_init(&a, 2) == HORA_SUCCESS && hora__cache_init(&b, 2) == HORA_SUCCESS);
  const char *keys[] = {"Na", "Nb", "Na", "Nc", "Na", "Nb"};
  struct hora__wbuf w = {0};
  for (int step = 0; step < 6; step++) {
    struct hora__response *r = hora__response_new(HORA_KIND_ALLREDUCE, 1);
    r->dtype = HORA_FLOAT32;
    hora__response_set_tensor(r, 0, keys[step], 2, 100 + (uint64_t)(keys[step][1] - 'a'));
    ASSERT(hora__encode_responses(&w, &r, 1) == HORA_SUCCESS);
    for (int k = 0; k < 2; k++) {
      struct hora__response *head = NULL, **tail = &head;
      ASSERT(hora__decode_responses(w.data, w.len, &tail, k ? &b : &a) == HORA_SUCCESS);
      ASSERT(head && strcmp(head->tensors[0].key, keys[step]) == 0);
      ASSERT(head->tensors[0].count == r->tensors[0].count);
      hora__response_free(head);
    }
    hora__response_free(r);
    ASSERT(a.version == b.version && a.head == b.head);
    for (int s = 0; s < 2; s++) {
      ASSERT(a.e[s].used == b.e[s].used);
      ASSERT(!a.e[s].used || strcmp(a.e[s].key, b.e[s].key) == 0);
    }
    ASSERT(hora__cache_find(&a, keys[step], 2) >= 0);
  }
  /* Capacity 2 with a, b, c in play: something was evicted. */
  ASSERT(a.evictions > 0);
  hora__cache_free(&a);
  hora__cache_free(&b);
  hora__wbuf_free(&w);
}

/* An emptied slot is found by nobody and is the next one reused. */
TEST(cache_forget_empties_a_slot) {
  struct hora__cache c;
  ASSERT(hora__cache_init(&c, 3) == HORA_SUCCESS);
  struct hora__op_meta m = {.kind = HORA_KIND_ALLREDUCE, .dtype = HORA_FLOAT32, .count = 4,
                            .prescale = 1, .postscale = 1};
  int32_t a, b, x, d;
  ASSERT(hora__cache_note(&c, "Na", 2, &m, &a) == 0 && a == 0);
  ASSERT(hora__cache_note(&c, "Nb", 2, &m, &b) == 0 && b == 1);
  ASSERT(hora__cache_note(&c, "Nc", 2, &m, &x) == 0 && x == 2);
  hora__cache_forget(&c, 1);
  ASSERT(hora__cache_find(&c, "Nb", 2) == -1 && !hora__cache_entry(&c, 1));
  hora__cache_forget(&c, 1); /* twice: nothing more happens */
  ASSERT(hora__cache_note(&c, "Nd", 2, &m, &d) == 0 && d == 1); /* reuses it, evicts nobody */
  ASSERT(c.evictions == 0 && hora__cache_find(&c, "Na", 2) == 0 && hora__cache_find(&c, "Nc", 2) == 2);
  ASSERT(hora__cache_note(&c, "Ne", 2, &m, &d) == 0 && d == 0); /* a is now the LRU */
  ASSERT(c.evictions == 1);
  hora__cache_free(&c);
}

/* A cycle message survives the wire, its lateness record and eager data
 * too; malformed ones (any truncation, an eager length that disagrees, an
 * unknown flag) are refused. */
TEST(message_cycle_roundtrip) {
  uint8_t vec[8] = {0xff, 0x01, 0x10, 0x20, 0x00, 0x80, 0x01, 0x00};
  const uint8_t eager[5] = {1, 2, 3, 4, 5};
  struct hora__cycle_msg m = {.cycle = 1ull << 40, .step = 3, .flags = HORA_CYCLE_JOINED,
                              .frames = 77, .nbytes = 2, .vec = vec, .eager_len = 5,
                              .eager = eager,
                              .late = {.ops = 9, .min_ns = 1234, .sum_ns = 1ull << 50,
                                       .min_rank = 70000, .ranks = 3}};
  struct hora__wbuf w = {0};
  hora__encode_cycle(&w, &m);
  struct hora__cycle_msg out;
  ASSERT(hora__decode_cycle(w.data, w.len, &out) == HORA_SUCCESS);
  ASSERT(out.cycle == m.cycle && out.step == 3 && out.flags == HORA_CYCLE_JOINED);
  ASSERT(out.frames == 77 && out.nbytes == 2 && memcmp(out.vec, vec, 8) == 0);
  ASSERT(out.eager_len == 5 && memcmp(out.eager, eager, 5) == 0);
  ASSERT(out.late.ops == 9 && out.late.min_ns == 1234 && out.late.sum_ns == 1ull << 50 &&
         out.late.min_rank == 70000 && out.late.ranks == 3);
  for (size_t n = 0; n < w.len; n++) {
    ASSERT(hora__decode_cycle(w.data, n, &out) == HORA_ERR_INVALID_ARG);
  }
  size_t eager_at = 22 + 8 + HORA_CYCLE_LATE_BYTES;
  w.data[eager_at] = 4; /* the eager length, one short of what follows */
  ASSERT(hora__decode_cycle(w.data, w.len, &out) == HORA_ERR_INVALID_ARG);
  w.data[eager_at] = 5;
  ASSERT(hora__decode_cycle(w.data, w.len, &out) == HORA_SUCCESS);
  w.data[9] = 0x80; /* an unknown flag */
  ASSERT(hora__decode_cycle(w.data, w.len, &out) == HORA_ERR_INVALID_ARG);
  hora__wbuf_free(&w);
}

/* Lateness records fold to the least wait (ties to the lowest rank), the
 * sum and the count, whatever the order; a record from no rank is neutral. */
TEST(cycle_late_fold_any_order) {
  const struct hora__cycle_late r[4] = {{.ops = 2, .min_ns = 50, .sum_ns = 50, .min_rank = 0, .ranks = 1},
                                        {.ops = 2, .min_ns = 7, .sum_ns = 7, .min_rank = 3, .ranks = 1},
                                        {.ops = 2, .min_ns = 7, .sum_ns = 7, .min_rank = 1, .ranks = 1},
                                        {.ops = 2, .min_ns = 0, .sum_ns = 0, .min_rank = 2, .ranks = 0}};
  const int orders[3][4] = {{0, 1, 2, 3}, {3, 2, 1, 0}, {2, 0, 3, 1}};
  for (int o = 0; o < 3; o++) {
    struct hora__cycle_late a = r[orders[o][0]];
    for (int i = 1; i < 4; i++) {
      hora__cycle_late_fold(&a, &r[orders[o][i]]);
    }
    ASSERT(a.ops == 2 && a.min_ns == 7 && a.min_rank == 1 && a.sum_ns == 64 && a.ranks == 3);
  }
}

TEST(cache_lru_and_versions) {
  struct hora__cache c;
  ASSERT(hora__cache_init(&c, 3) == HORA_SUCCESS);
  struct hora__op_meta m = {.kind = HORA_KIND_ALLREDUCE, .dtype = HORA_FLOAT32, .count = 4,
                            .prescale = 1, .postscale = 1};
  int32_t a, b, x, d;
  ASSERT(hora__cache_note(&c, "Na", 2, &m, &a) == 0 && a == 0);
  ASSERT(hora__cache_note(&c, "Nb", 2, &m, &b) == 0 && b == 1);
  ASSERT(hora__cache_note(&c, "Nc", 2, &m, &x) == 0 && x == 2);
  ASSERT_EQ_INT(c.version, 3);
  ASSERT(hora__cache_note(&c, "Na", 2, &m, &a) == 0 && a == 0); /* touch: no new version */
  ASSERT_EQ_INT(c.version, 3);
  ASSERT(hora__cache_note(&c, "Nd", 2, &m, &d) == 0 && d == 1); /* evicts b, the LRU */
  ASSERT(hora__cache_find(&c, "Nb", 2) == -1 && c.e[1].version == 4);
  m.count = 5; /* same key, new shape: same slot, new version */
  ASSERT(hora__cache_note(&c, "Na", 2, &m, &a) == 0 && a == 0 && c.e[0].version == 5);
  m.shape = 42; /* same count, another shape's fingerprint: a new version too */
  ASSERT(hora__cache_note(&c, "Na", 2, &m, &a) == 0 && a == 0 && c.e[0].version == 6);
  hora__cache_free(&c);
  struct hora__cache off;
  ASSERT(hora__cache_init(&off, 0) == HORA_SUCCESS);
  ASSERT(hora__cache_note(&off, "Na", 2, &m, &a) == 0 && a == -1);
  ASSERT(hora__cache_find(&off, "Na", 2) == -1);
  hora__cache_free(&off);
}

/* The smallest possible entries must pass the decoders' size sanity checks. */
TEST(message_minimal_sizes) {
  struct hora__wbuf w = {0};
  struct hora__op_meta m = {.kind = HORA_KIND_BARRIER, .root = -1, .prescale = 1, .postscale = 1};
  hora__encode_requests_begin(&w);
  for (int i = 0; i < 10; i++) {
    hora__encode_request(&w, &m, "B", 1, 0);
  }
  hora__encode_requests_end(&w, 10);
  struct collected c = {0};
  ASSERT(decode(w.data, w.len, &c) == HORA_SUCCESS && c.n == 10);
  struct hora__response *rs[5];
  for (int i = 0; i < 5; i++) {
    rs[i] = hora__response_new(HORA_KIND_JOIN, 0);
  }
  ASSERT(hora__encode_responses(&w, rs, 5) == HORA_SUCCESS);
  struct hora__response *head = NULL, **tail = &head;
  ASSERT(hora__decode_responses(w.data, w.len, &tail, NULL) == HORA_SUCCESS);
  int n = 0;
  for (struct hora__response *r = head; r; n++) {
    struct hora__response *next = r->next;
    hora__response_free(r);
    r = next;
  }
  ASSERT_EQ_INT(n, 5);
  for (int i = 0; i < 5; i++) {
    hora__response_free(rs[i]);
  }
  hora__wbuf_free(&w);
}
