/* Bounds-checked little-endian encoding for control messages. A reader
 * that runs past its end sets `bad` and returns zeros, so decoders check
 * once at the end instead of after every field. */
#ifndef HORA_WIRE_H
#define HORA_WIRE_H

#include "base/common.h"

struct hora__wbuf {
  uint8_t *data;
  size_t len, cap;
  bool failed; /* an allocation failed */
};

struct hora__rbuf {
  const uint8_t *data;
  size_t len, off;
  bool bad;
};

void hora__wbuf_free(struct hora__wbuf *w);
void hora__wbuf_reset(struct hora__wbuf *w);
void hora__wbuf_put(struct hora__wbuf *w, const void *p, size_t n);
void hora__wbuf_put_zeros(struct hora__wbuf *w, size_t n);
void hora__wbuf_u8(struct hora__wbuf *w, uint8_t v);
void hora__wbuf_u16(struct hora__wbuf *w, uint16_t v);
void hora__wbuf_u32(struct hora__wbuf *w, uint32_t v);
void hora__wbuf_u64(struct hora__wbuf *w, uint64_t v);
/* u16 length + bytes */
void hora__wbuf_str(struct hora__wbuf *w, const char *s, size_t n);

static inline struct hora__rbuf hora__rbuf_make(const void *p, size_t n) {
  struct hora__rbuf r = {.data = p, .len = n, .off = 0, .bad = false};
  return r;
}
uint8_t hora__rbuf_u8(struct hora__rbuf *r);
uint16_t hora__rbuf_u16(struct hora__rbuf *r);
uint32_t hora__rbuf_u32(struct hora__rbuf *r);
uint64_t hora__rbuf_u64(struct hora__rbuf *r);
/* A u16-length string of at most `max` bytes, pointing into the buffer. */
const char *hora__rbuf_str(struct hora__rbuf *r, size_t max, size_t *n);
static inline size_t hora__rbuf_left(const struct hora__rbuf *r) { return r->len - r->off; }

#endif
