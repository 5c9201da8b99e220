#include "base/wire.h"

#include <stdlib.h>

void hora__wbuf_free(struct hora__wbuf *w) {
  free(w->data);
  memset(w, 0, sizeof(*w));
}

void hora__wbuf_reset(struct hora__wbuf *w) {
  w->len = 0;
  w->failed = false;
}

/* Room for n more bytes; false (and `failed` set) when there is none. */
static bool wbuf_reserve(struct hora__wbuf *w, size_t n) {
  if (w->failed) {
    return false;
  }
  if (w->len + n > w->cap) {
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->len + n) {
      cap *= 2;
    }
    uint8_t *d = realloc(w->data, cap);
    if (!d) {
      w->failed = true;
      return false;
    }
    w->data = d;
    w->cap = cap;
  }
  return true;
}

void hora__wbuf_put(struct hora__wbuf *w, const void *p, size_t n) {
  if (!wbuf_reserve(w, n)) {
    return;
  }
  if (n) {
    memcpy(w->data + w->len, p, n);
  }
  w->len += n;
}

void hora__wbuf_put_zeros(struct hora__wbuf *w, size_t n) {
  if (!wbuf_reserve(w, n)) {
    return;
  }
  if (n) {
    memset(w->data + w->len, 0, n);
  }
  w->len += n;
}

void hora__wbuf_u8(struct hora__wbuf *w, uint8_t v) { hora__wbuf_put(w, &v, 1); }

void hora__wbuf_u16(struct hora__wbuf *w, uint16_t v) {
  uint8_t b[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
  hora__wbuf_put(w, b, 2);
}

void hora__wbuf_u32(struct hora__wbuf *w, uint32_t v) {
  uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  hora__wbuf_put(w, b, 4);
}

void hora__wbuf_u64(struct hora__wbuf *w, uint64_t v) {
  hora__wbuf_u32(w, (uint32_t)v);
  hora__wbuf_u32(w, (uint32_t)(v >> 32));
}

void hora__wbuf_str(struct hora__wbuf *w, const char *s, size_t n) {
  if (n > UINT16_MAX) {
    n = UINT16_MAX;
  }
  hora__wbuf_u16(w, (uint16_t)n);
  hora__wbuf_put(w, s, n);
}

static const uint8_t *take(struct hora__rbuf *r, size_t n) {
  if (r->bad || r->len - r->off < n) {
    r->bad = true;
    return NULL;
  }
  const uint8_t *p = r->data + r->off;
  r->off += n;
  return p;
}

uint8_t hora__rbuf_u8(struct hora__rbuf *r) {
  const uint8_t *p = take(r, 1);
  return p ? p[0] : 0;
}

uint16_t hora__rbuf_u16(struct hora__rbuf *r) {
  const uint8_t *p = take(r, 2);
  return p ? (uint16_t)(p[0] | p[1] << 8) : 0;
}

uint32_t hora__rbuf_u32(struct hora__rbuf *r) {
  const uint8_t *p = take(r, 4);
  return p ? ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24)
           : 0;
}

uint64_t hora__rbuf_u64(struct hora__rbuf *r) {
  uint64_t lo = hora__rbuf_u32(r);
  uint64_t hi = hora__rbuf_u32(r);
  return lo | hi << 32;
}

const char *hora__rbuf_str(struct hora__rbuf *r, size_t max, size_t *n) {
  size_t len = hora__rbuf_u16(r);
  if (len > max) {
    r->bad = true;
    *n = 0;
    return NULL;
  }
  const uint8_t *p = take(r, len);
  *n = p ? len : 0;
  return (const char *)p;
}
