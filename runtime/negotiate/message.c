/* Encoding and validation of control messages.
 *
 *   REQUESTS  := u32 n, n x request
 *   request   := u8 kind, u8 dtype, u8 op, u8 device, u8 compression,
 *                i32 root, u64 count, f64 prescale, f64 postscale, u64 group,
 *                u32 group_size, u64 split, str key, u32 waited_ms,
 *                u8 ndims (0xff: no shape), ndims x i64 dim
 *   RESPONSES := u32 n, n x { u8 kind, u8 dtype, u8 op, u8 device,
 *                u8 compression, f64 prescale, f64 postscale, i32 root,
 *                i32 last_joined, u16 error_code, str error,
 *                u32 ntensors, ntensors x { str key, u64 count, u64 shape } }
 *   ABORT     := i32 origin_rank, u16 code, str message
 *   CYCLE     := u64 cycle, u8 step, u8 flags, u64 frames, u32 nbytes,
 *                4 x nbytes (ready, submitted, evict, eager bit vectors),
 *                late := u64 ops, u64 min_ns, u64 sum_ns, u32 min_rank,
 *                u32 ranks, u32 eager_len, eager_len bytes
 *   STUCK     := u64 cycle, u32 waited_ms, str key (may be empty)
 *   str       := u16 length, bytes;  f64 := IEEE bits as u64
 * All little-endian. A request's dims must hold its count; rank 0 derives
 * the shape's fingerprint from them (hora__shape_fingerprint), and the
 * responses carry only that, per tensor, for the caches to compare. */
#include "runtime/negotiate/message.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "runtime/negotiate/cache.h"

#define MAX_TENSORS_PER_RESPONSE (1u << 20)
#define MAX_CACHE_BITMAP (1u << 20) /* bytes: 8 Mi slots */
/* Smallest encodings, for rejecting counts a frame cannot hold. */
#define REQUEST_MIN_BYTES (5 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 2 + 1 + 4 + 1) /* 1-byte key, no shape */
#define RESPONSE_MIN_BYTES (5 + 8 + 8 + 4 + 4 + 2 + 2 + 4)     /* no tensors, no message */
#define RESP_TENSOR_MIN_BYTES (2 + 1 + 8 + 8)                  /* 1-byte key */
#define NO_SHAPE 0xffu /* the ndims byte of a request without a shape */

static void put_f64(struct hora__wbuf *w, double v) {
  uint64_t u;
  memcpy(&u, &v, sizeof(u));
  hora__wbuf_u64(w, u);
}

static double get_f64(struct hora__rbuf *r) {
  uint64_t u = hora__rbuf_u64(r);
  double v;
  memcpy(&v, &u, sizeof(v));
  return v;
}

static int check_key(const char *key, size_t len) {
  if (!key || len < 1 || len > HORA_KEY_MAX) {
    return hora__error(HORA_ERR_INVALID_ARG, "operation key of %zu bytes", len);
  }
  switch (key[0]) {
    case HORA_KEY_NAMED:
    case HORA_KEY_UNNAMED:
    case HORA_KEY_BARRIER:
    case HORA_KEY_JOIN:
    case HORA_KEY_SHUTDOWN:
      break;
    default:
      return hora__error(HORA_ERR_INVALID_ARG, "operation key with unknown prefix 0x%02x",
                         (unsigned char)key[0]);
  }
  if (memchr(key, '\0', len)) {
    return hora__error(HORA_ERR_INVALID_ARG, "operation key contains a NUL byte");
  }
  return HORA_SUCCESS;
}

static bool fields_valid(uint8_t dtype, uint8_t op, uint8_t device, uint8_t compression,
                         double prescale, double postscale) {
  return hora__dtype_valid(dtype) && hora__op_valid(op) && device <= 1 &&
         compression <= HORA_COMPRESSION_BF16 && isfinite(prescale) && isfinite(postscale);
}

static int check_meta(const struct hora__op_meta *m) {
  if (m->kind > HORA_KIND_SHUTDOWN) {
    return hora__error(HORA_ERR_INVALID_ARG, "request of unknown kind %u", m->kind);
  }
  if (!fields_valid(m->dtype, m->op, m->device, m->compression, m->prescale, m->postscale)) {
    return hora__error(HORA_ERR_INVALID_ARG,
                       "request with dtype %u, op %u, device %u, compression %u or bad scales",
                       m->dtype, m->op, m->device, m->compression);
  }
  if (m->count > SIZE_MAX / 8) {
    return hora__error(HORA_ERR_INVALID_ARG, "request of %llu elements",
                       (unsigned long long)m->count);
  }
  if (m->split && (m->kind != HORA_KIND_REDUCESCATTER || m->root != -1)) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s request with explicit split counts",
                       hora__kind_name(m->kind));
  }
  if ((m->group == 0) != (m->group_size == 0) || (m->group && m->kind > HORA_KIND_LAST_COLLECTIVE)) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s request in group %llx of %u",
                       hora__kind_name(m->kind), (unsigned long long)m->group, m->group_size);
  }
  return HORA_SUCCESS;
}

/* ---- requests ------------------------------------------------------------ */

void hora__encode_requests_begin(struct hora__wbuf *w) {
  hora__wbuf_reset(w);
  hora__wbuf_u32(w, 0);
}

void hora__encode_request_shaped(struct hora__wbuf *w, const struct hora__op_meta *m,
                                 const struct hora__shape *shape, const char *key, size_t key_len,
                                 uint32_t waited_ms) {
  hora__wbuf_u8(w, m->kind);
  hora__wbuf_u8(w, m->dtype);
  hora__wbuf_u8(w, m->op);
  hora__wbuf_u8(w, m->device);
  hora__wbuf_u8(w, m->compression);
  hora__wbuf_u32(w, (uint32_t)m->root);
  hora__wbuf_u64(w, m->count);
  put_f64(w, m->prescale);
  put_f64(w, m->postscale);
  hora__wbuf_u64(w, m->group);
  hora__wbuf_u32(w, m->group_size);
  hora__wbuf_u64(w, m->split);
  hora__wbuf_str(w, key, key_len);
  hora__wbuf_u32(w, waited_ms);
  int nd = shape ? shape->ndims : -1;
  hora__wbuf_u8(w, nd < 0 ? NO_SHAPE : (uint8_t)nd);
  for (int i = 0; i < nd; i++) {
    hora__wbuf_u64(w, (uint64_t)shape->dims[i]);
  }
}

void hora__encode_requests_end(struct hora__wbuf *w, uint32_t n) {
  if (!w->failed && w->len >= 4) {
    w->data[0] = (uint8_t)n;
    w->data[1] = (uint8_t)(n >> 8);
    w->data[2] = (uint8_t)(n >> 16);
    w->data[3] = (uint8_t)(n >> 24);
  }
}

static void read_meta(struct hora__rbuf *r, struct hora__op_meta *m) {
  m->kind = hora__rbuf_u8(r);
  m->dtype = hora__rbuf_u8(r);
  m->op = hora__rbuf_u8(r);
  m->device = hora__rbuf_u8(r);
  m->compression = hora__rbuf_u8(r);
  m->root = (int32_t)hora__rbuf_u32(r);
  m->count = hora__rbuf_u64(r);
  m->prescale = get_f64(r);
  m->postscale = get_f64(r);
  m->group = hora__rbuf_u64(r);
  m->group_size = hora__rbuf_u32(r);
  m->split = hora__rbuf_u64(r);
  m->shape = 0; /* not on the wire: derived from the dims */
}

/* A request's shape; false when it claims more dimensions than a shape has. */
static bool read_shape(struct hora__rbuf *r, struct hora__shape *s) {
  uint8_t nd = hora__rbuf_u8(r);
  s->ndims = nd == NO_SHAPE ? -1 : nd;
  if (s->ndims > HORA_MAX_DIMS) {
    return false;
  }
  for (int i = 0; i < s->ndims; i++) {
    s->dims[i] = (int64_t)hora__rbuf_u64(r);
  }
  return true;
}

static int check_shape(const struct hora__op_meta *m, const struct hora__shape *s) {
  if (s->ndims < 0) {
    return HORA_SUCCESS;
  }
  if (m->kind > HORA_KIND_LAST_COLLECTIVE) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s request with a shape", hora__kind_name(m->kind));
  }
  return hora__shape_holds("request", s, m->count);
}

int hora__decode_requests(const uint8_t *p, size_t n, const struct hora__request_sink *sink) {
  for (int pass = 0; pass < 2; pass++) {
    struct hora__rbuf r = hora__rbuf_make(p, n);
    uint32_t count = hora__rbuf_u32(&r);
    /* A count that claims more than the frame can hold is rejected before
     * any work. */
    if (r.bad || count > hora__rbuf_left(&r) / REQUEST_MIN_BYTES) {
      return hora__error(HORA_ERR_INVALID_ARG, "request list claims %u entries in %zu bytes",
                         count, n);
    }
    for (uint32_t i = 0; i < count; i++) {
      struct hora__wire_request req;
      struct hora__shape shape;
      read_meta(&r, &req.meta);
      req.key = hora__rbuf_str(&r, HORA_KEY_MAX, &req.key_len);
      req.waited_ms = hora__rbuf_u32(&r);
      if (!read_shape(&r, &shape)) {
        return hora__error(HORA_ERR_INVALID_ARG, "request %u of %u has a shape of %d dimensions",
                           i, count, shape.ndims);
      }
      if (r.bad) {
        return hora__error(HORA_ERR_INVALID_ARG, "request %u of %u is truncated", i, count);
      }
      req.shape = shape.ndims >= 0 ? &shape : NULL;
      req.meta.shape = hora__shape_fingerprint(req.meta.kind, req.shape);
      if (pass == 0) {
        HORA_CHECK(check_meta(&req.meta));
        HORA_CHECK(check_key(req.key, req.key_len));
        HORA_CHECK(check_shape(&req.meta, &shape));
      } else {
        HORA_CHECK(sink->request(sink->arg, &req));
      }
    }
    if (hora__rbuf_left(&r) != 0) {
      return hora__error(HORA_ERR_INVALID_ARG, "%zu stray bytes after a request list",
                         hora__rbuf_left(&r));
    }
  }
  return HORA_SUCCESS;
}

/* ---- cycles ----------------------------------------------------------------- */

void hora__cycle_late_fold(struct hora__cycle_late *a, const struct hora__cycle_late *b) {
  if (b->ranks > 0 && (a->ranks == 0 || b->min_ns < a->min_ns ||
                       (b->min_ns == a->min_ns && b->min_rank < a->min_rank))) {
    a->min_ns = b->min_ns;
    a->min_rank = b->min_rank;
  }
  a->ops = HORA_MAX(a->ops, b->ops);
  a->sum_ns += b->sum_ns;
  a->ranks += b->ranks;
}

void hora__encode_cycle(struct hora__wbuf *w, const struct hora__cycle_msg *m) {
  hora__wbuf_reset(w);
  hora__wbuf_u64(w, m->cycle);
  hora__wbuf_u8(w, m->step);
  hora__wbuf_u8(w, m->flags);
  hora__wbuf_u64(w, m->frames);
  hora__wbuf_u32(w, m->nbytes);
  hora__wbuf_put(w, m->vec, HORA_CYCLE_VECTORS * (size_t)m->nbytes);
  hora__wbuf_u64(w, m->late.ops);
  hora__wbuf_u64(w, m->late.min_ns);
  hora__wbuf_u64(w, m->late.sum_ns);
  hora__wbuf_u32(w, m->late.min_rank);
  hora__wbuf_u32(w, m->late.ranks);
  hora__wbuf_u32(w, m->eager_len);
  hora__wbuf_put(w, m->eager, m->eager_len);
}

int hora__decode_cycle(const uint8_t *p, size_t n, struct hora__cycle_msg *m) {
  struct hora__rbuf r = hora__rbuf_make(p, n);
  m->cycle = hora__rbuf_u64(&r);
  m->step = hora__rbuf_u8(&r);
  m->flags = hora__rbuf_u8(&r);
  m->frames = hora__rbuf_u64(&r);
  m->nbytes = hora__rbuf_u32(&r);
  size_t vecs = HORA_CYCLE_VECTORS * (size_t)m->nbytes;
  if (r.bad || m->nbytes > MAX_CACHE_BITMAP || vecs + HORA_CYCLE_LATE_BYTES + 4 > hora__rbuf_left(&r) ||
      (m->flags & ~HORA_CYCLE_FLAGS_ALL) != 0) {
    return hora__error(HORA_ERR_INVALID_ARG, "malformed cycle message (%zu bytes)", n);
  }
  m->vec = p + r.off;
  r.off += vecs;
  m->late.ops = hora__rbuf_u64(&r);
  m->late.min_ns = hora__rbuf_u64(&r);
  m->late.sum_ns = hora__rbuf_u64(&r);
  m->late.min_rank = hora__rbuf_u32(&r);
  m->late.ranks = hora__rbuf_u32(&r);
  m->eager_len = hora__rbuf_u32(&r);
  if (r.bad || m->eager_len != hora__rbuf_left(&r) || m->eager_len > HORA_CYCLE_EAGER_MAX) {
    return hora__error(HORA_ERR_INVALID_ARG, "malformed cycle message (%zu bytes)", n);
  }
  m->eager = p + r.off;
  return HORA_SUCCESS;
}

void hora__encode_stuck(struct hora__wbuf *w, uint64_t cycle, uint32_t waited_ms, const char *key,
                        size_t key_len) {
  hora__wbuf_reset(w);
  hora__wbuf_u64(w, cycle);
  hora__wbuf_u32(w, waited_ms);
  hora__wbuf_str(w, key, key_len);
}

int hora__decode_stuck(const uint8_t *p, size_t n, uint64_t *cycle, uint32_t *waited_ms,
                       const char **key, size_t *key_len) {
  struct hora__rbuf r = hora__rbuf_make(p, n);
  *cycle = hora__rbuf_u64(&r);
  *waited_ms = hora__rbuf_u32(&r);
  *key = hora__rbuf_str(&r, HORA_KEY_MAX, key_len);
  if (r.bad || hora__rbuf_left(&r) != 0 || (*key_len && check_key(*key, *key_len))) {
    return hora__error(HORA_ERR_INVALID_ARG, "malformed stuck-cycle message (%zu bytes)", n);
  }
  return HORA_SUCCESS;
}

/* ---- responses ----------------------------------------------------------- */

struct hora__response *hora__response_new(uint8_t kind, uint32_t ntensors) {
  struct hora__response *r = hora__calloc(1, sizeof(*r));
  if (!r) {
    return NULL;
  }
  r->kind = kind;
  r->root = -1;
  r->last_joined = -1;
  r->prescale = r->postscale = 1.0;
  r->ntensors = r->tensors_cap = ntensors;
  if (ntensors) {
    r->tensors = hora__calloc(ntensors, sizeof(*r->tensors));
    if (!r->tensors) {
      free(r);
      return NULL;
    }
  }
  return r;
}

void hora__response_free(struct hora__response *r) {
  if (!r) {
    return;
  }
  for (uint32_t i = 0; i < r->ntensors; i++) {
    free(r->tensors[i].key);
  }
  free(r->tensors);
  free(r->error_msg);
  free(r->eager);
  free(r);
}

int hora__response_set_tensor(struct hora__response *r, uint32_t i, const char *key,
                              size_t key_len, uint64_t count) {
  char *k = hora__malloc(key_len + 1);
  if (!k) {
    return HORA_ERR_NO_MEMORY;
  }
  memcpy(k, key, key_len);
  k[key_len] = '\0';
  free(r->tensors[i].key);
  r->tensors[i].key = k;
  r->tensors[i].key_len = (uint16_t)key_len;
  r->tensors[i].count = count;
  return HORA_SUCCESS;
}

void hora__response_meta(const struct hora__response *r, uint32_t i, struct hora__op_meta *m) {
  m->kind = r->kind;
  m->dtype = r->dtype;
  m->op = r->op;
  m->device = r->device;
  m->compression = r->compression;
  m->root = r->root;
  m->count = r->tensors[i].count;
  m->prescale = r->prescale;
  m->postscale = r->postscale;
  m->shape = r->tensors[i].shape;
  m->group = 0; /* (responses do not carry it: groups are matched at rank 0) */
  m->group_size = 0;
  m->split = 0;
}

struct hora__response *hora__response_for(const struct hora__op_meta *m, const char *key,
                                         size_t key_len) {
  struct hora__response *r = hora__response_new(m->kind, 1);
  if (!r) {
    return NULL;
  }
  r->dtype = m->dtype;
  r->op = m->op;
  r->device = m->device;
  r->compression = m->compression;
  r->prescale = m->prescale;
  r->postscale = m->postscale;
  r->root = m->root;
  if (hora__response_set_tensor(r, 0, key, key_len, m->count) != HORA_SUCCESS) {
    hora__response_free(r);
    return NULL;
  }
  r->tensors[0].shape = m->shape;
  return r;
}

static bool cacheable(uint8_t kind) {
  return kind <= HORA_KIND_LAST_COLLECTIVE;
}

int hora__encode_responses(struct hora__wbuf *w, struct hora__response *const *rs, uint32_t n) {
  hora__wbuf_reset(w);
  hora__wbuf_u32(w, n);
  for (uint32_t i = 0; i < n; i++) {
    const struct hora__response *r = rs[i];
    hora__wbuf_u8(w, r->kind);
    hora__wbuf_u8(w, r->dtype);
    hora__wbuf_u8(w, r->op);
    hora__wbuf_u8(w, r->device);
    hora__wbuf_u8(w, r->compression);
    put_f64(w, r->prescale);
    put_f64(w, r->postscale);
    hora__wbuf_u32(w, (uint32_t)r->root);
    hora__wbuf_u32(w, (uint32_t)r->last_joined);
    hora__wbuf_u16(w, r->error_code);
    const char *msg = r->error_msg ? r->error_msg : "";
    hora__wbuf_str(w, msg, strlen(msg));
    hora__wbuf_u32(w, r->ntensors);
    for (uint32_t t = 0; t < r->ntensors; t++) {
      hora__wbuf_str(w, r->tensors[t].key, r->tensors[t].key_len);
      hora__wbuf_u64(w, r->tensors[t].count);
      hora__wbuf_u64(w, r->tensors[t].shape);
    }
  }
  return w->failed ? hora__error(HORA_ERR_NO_MEMORY, "out of memory encoding responses")
                   : HORA_SUCCESS;
}

int hora__decode_responses(const uint8_t *p, size_t n, struct hora__response ***tail,
                           struct hora__cache *cache) {
  struct hora__rbuf rb = hora__rbuf_make(p, n);
  uint32_t count = hora__rbuf_u32(&rb);
  if (rb.bad || count > hora__rbuf_left(&rb) / RESPONSE_MIN_BYTES) {
    return hora__error(HORA_ERR_INVALID_ARG, "response list claims %u entries in %zu bytes",
                       count, n);
  }
  struct hora__response *head = NULL, **link = &head;
  int rc = HORA_SUCCESS;
  for (uint32_t i = 0; i < count; i++) {
    uint8_t kind = hora__rbuf_u8(&rb);
    uint8_t dtype = hora__rbuf_u8(&rb);
    uint8_t op = hora__rbuf_u8(&rb);
    uint8_t device = hora__rbuf_u8(&rb);
    uint8_t compression = hora__rbuf_u8(&rb);
    double prescale = get_f64(&rb);
    double postscale = get_f64(&rb);
    int32_t root = (int32_t)hora__rbuf_u32(&rb);
    int32_t last_joined = (int32_t)hora__rbuf_u32(&rb);
    uint16_t code = hora__rbuf_u16(&rb);
    size_t msg_len;
    const char *msg = hora__rbuf_str(&rb, UINT16_MAX, &msg_len);
    uint32_t nt = hora__rbuf_u32(&rb);
    if (rb.bad || kind >= HORA_KIND_COUNT_ ||
        !fields_valid(dtype, op, device, compression, prescale, postscale) ||
        code >= HORA_RESULT_COUNT_ || nt > MAX_TENSORS_PER_RESPONSE ||
        nt > hora__rbuf_left(&rb) / RESP_TENSOR_MIN_BYTES) {
      rc = hora__error(HORA_ERR_INVALID_ARG, "response %u of %u is malformed", i, count);
      goto fail;
    }
    struct hora__response *r = hora__response_new(kind, nt);
    if (!r) {
      rc = HORA_ERR_NO_MEMORY;
      goto fail;
    }
    *link = r;
    link = &r->next;
    r->dtype = dtype;
    r->op = op;
    r->device = device;
    r->compression = compression;
    r->prescale = prescale;
    r->postscale = postscale;
    r->root = root;
    r->last_joined = last_joined;
    r->error_code = code;
    if (msg_len) {
      r->error_msg = hora__malloc(msg_len + 1);
      if (!r->error_msg) {
        rc = HORA_ERR_NO_MEMORY;
        goto fail;
      }
      memcpy(r->error_msg, msg, msg_len);
      r->error_msg[msg_len] = '\0';
    }
    for (uint32_t t = 0; t < nt; t++) {
      size_t kl;
      const char *key = hora__rbuf_str(&rb, HORA_KEY_MAX, &kl);
      uint64_t cnt = hora__rbuf_u64(&rb);
      uint64_t shape = hora__rbuf_u64(&rb);
      if (rb.bad) {
        rc = hora__error(HORA_ERR_INVALID_ARG, "response %u of %u is truncated", i, count);
        goto fail;
      }
      HORA_CHECK_GOTO(check_key(key, kl), rc, fail);
      if (cnt > SIZE_MAX / 8) {
        rc = hora__error(HORA_ERR_INVALID_ARG, "response tensor of %llu elements",
                         (unsigned long long)cnt);
        goto fail;
      }
      HORA_CHECK_GOTO(hora__response_set_tensor(r, t, key, kl, cnt), rc, fail);
      r->tensors[t].shape = shape;
      if (cache && cacheable(kind)) {
        struct hora__op_meta m;
        int32_t noted;
        hora__response_meta(r, t, &m);
        HORA_CHECK_GOTO(hora__cache_note(cache, r->tensors[t].key, kl, &m, &noted), rc, fail);
      }
    }
  }
  if (hora__rbuf_left(&rb) != 0) {
    rc = hora__error(HORA_ERR_INVALID_ARG, "%zu stray bytes after a response list",
                     hora__rbuf_left(&rb));
    goto fail;
  }
  **tail = head;
  if (head) {
    *tail = link;
  }
  return HORA_SUCCESS;
fail:
  while (head) {
    struct hora__response *nx = head->next;
    hora__response_free(head);
    head = nx;
  }
  return rc;
}

/* ---- abort ------------------------------------------------------------------ */

void hora__encode_abort(struct hora__wbuf *w, int origin, int code, const char *msg) {
  hora__wbuf_reset(w);
  hora__wbuf_u32(w, (uint32_t)origin);
  hora__wbuf_u16(w, (uint16_t)code);
  hora__wbuf_str(w, msg, strlen(msg));
}

int hora__decode_abort(const uint8_t *p, size_t n, int *origin, int *code, char *msg,
                       size_t msg_size) {
  struct hora__rbuf r = hora__rbuf_make(p, n);
  *origin = (int32_t)hora__rbuf_u32(&r);
  *code = hora__rbuf_u16(&r);
  size_t len;
  const char *s = hora__rbuf_str(&r, UINT16_MAX, &len);
  if (r.bad || hora__rbuf_left(&r) != 0 || *code <= HORA_SUCCESS || *code >= HORA_RESULT_COUNT_) {
    return hora__error(HORA_ERR_INVALID_ARG, "malformed abort message (%zu bytes)", n);
  }
  size_t c = HORA_MIN(len, msg_size - 1);
  memcpy(msg, s, c);
  msg[c] = '\0';
  return HORA_SUCCESS;
}
