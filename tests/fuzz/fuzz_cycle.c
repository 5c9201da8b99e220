/* The cycle frames, as the coordinator reads them: bytes arrive on a
 * control connection in pieces (read_ctrl), and each CYCLE frame is checked
 * and kept (on_cycle_frame, hora__cycle_accept) for a rank whose job size,
 * rank, peer, cycle count and cache size the first bytes choose. What is
 * accepted must come from a partner of this rank, for one of the next two
 * cycles, once per step, within the cache's size.
 *
 * Byte 5 picks the mode: raw, the rest is the stream itself; or built, the
 * rest is a list of cycle messages (step, cycle ahead, nbytes, flags, frames,
 * then one byte to corrupt and its value, then the vectors) encoded with
 * the runtime's encoder and framed, so that most of them get past the
 * decoder and exercise the checks behind it. */
#include <stdlib.h>

#include "runtime/negotiate/cycle.h"
#include "ctrl_feed.h"

/* The coordinator's view: where this rank stands, and what it has kept. */
struct target {
  struct hora__cycle_inbox *inbox;
  const struct hora__cycle_partners *cp;
  uint64_t cycles;
  uint32_t max_nbytes;
  int from;
  int accepted;
};

static int on_frame(void *arg, uint16_t type, const uint8_t *p, size_t n) {
  struct target *t = arg;
  const struct hora__cycle_partners *cp = t->cp;
  if (type != HORA_MSG_CYCLE) {
    return 0;
  }
  if (hora__cycle_accept(t->inbox, cp, t->cycles, t->max_nbytes, t->from, p, n) != HORA_SUCCESS) {
    return 1; /* the job fails here */
  }
  struct hora__cycle_msg m;
  if (hora__decode_cycle(p, n, &m) != HORA_SUCCESS || m.cycle <= t->cycles ||
      m.cycle > t->cycles + 2 || m.nbytes > t->max_nbytes || m.step >= HORA_INBOX_STEPS) {
    __builtin_trap();
  }
  bool partner = t->from == cp->fold ||
                 (m.step >= 1 && m.step <= cp->nrounds && cp->round[m.step - 1] == t->from);
  struct hora__cycle_inbox *in = hora__cycle_inbox_of(t->inbox, m.cycle, m.step);
  size_t vecs = HORA_CYCLE_VECTORS * (size_t)m.nbytes;
  if (!partner || !in->has || in->nbytes != m.nbytes || in->cap < vecs ||
      (m.nbytes && memcmp(in->vec, m.vec, vecs) != 0) || in->eager_len != m.eager_len ||
      (m.eager_len && memcmp(in->eager, m.eager, m.eager_len) != 0) ||
      in->late.ops != m.late.ops || in->late.min_ns != m.late.min_ns ||
      in->late.sum_ns != m.late.sum_ns || in->late.min_rank != m.late.min_rank ||
      in->late.ranks != m.late.ranks) {
    __builtin_trap();
  }
  /* Every third step ends the next cycle, which spends its inbox. */
  if (++t->accepted % 3 == 0) {
    for (int s = 0; s < HORA_INBOX_STEPS; s++) {
      hora__cycle_inbox_of(t->inbox, t->cycles + 1, s)->has = false;
    }
    t->cycles++;
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 6) {
    return 0;
  }
  int nranks = 1 + data[0] % 64, rank = data[1] % nranks, from = data[2] % nranks;
  uint64_t cycles = data[3];
  uint32_t max_nbytes = data[4] % 129u;
  bool built = data[5] & 1;
  data += 6;
  size -= 6;
  struct hora__cycle_partners cp;
  hora__cycle_partners(rank, nranks, &cp);
  /* Mostly a real partner, so that the checks past "who" are reached. */
  if ((data[-4] & 0x80) == 0 && (cp.fold >= 0 || cp.nrounds > 0)) {
    int k = data[-4] % (cp.nrounds + 1);
    from = k < cp.nrounds ? cp.round[k] : cp.fold >= 0 ? cp.fold : cp.round[0];
  }
  uint8_t *stream = NULL;
  if (built) {
    struct hora__wbuf w = {0};
    size_t cap = 0, len = 0;
    for (size_t i = 0; i + 7 <= size;) {
      uint32_t nb = data[i + 2] % 8u;
      struct hora__cycle_msg m = {.cycle = cycles + 1 + data[i + 1] % 3u,
                                  .step = data[i] % (HORA_INBOX_STEPS + 2),
                                  .flags = data[i + 3] & 3u,
                                  .frames = data[i + 4],
                                  .nbytes = nb};
      uint8_t vec[HORA_CYCLE_VECTORS * 8 + 8] = {0};
      size_t vecs = HORA_CYCLE_VECTORS * (size_t)nb, eager = data[i + 3] >> 5; /* 0-7 bytes */
      memcpy(vec, data + i + 7, HORA_MIN(vecs + eager, size - (i + 7)));
      m.vec = vec;
      m.eager = vec + vecs;
      m.eager_len = (uint32_t)eager;
      uint8_t at = data[i + 5], val = data[i + 6];
      i += 7 + vecs + eager;
      hora__encode_cycle(&w, &m);
      if (w.failed || len + 8 + w.len > cap) {
        uint8_t *p = realloc(stream, cap = 2 * (len + 8 + w.len));
        if (w.failed || !p) {
          break;
        }
        stream = p;
      }
      uint8_t *h = stream + len;
      memset(h, 0, 8);
      h[0] = (uint8_t)w.len;
      h[4] = HORA_MSG_CYCLE;
      memcpy(h + 8, w.data, w.len);
      if (at < 8 + w.len && at != 0xff) {
        h[at] = val; /* one byte of this frame corrupted */
      }
      len += 8 + w.len;
    }
    hora__wbuf_free(&w);
    data = stream;
    size = stream ? len : 0;
  }
  struct hora__cycle_inbox *inbox = calloc(2 * HORA_INBOX_STEPS, sizeof(*inbox));
  if (inbox) {
    struct target t = {inbox, &cp, cycles, max_nbytes, from, 0};
    fuzz_feed_ctrl(data, size, from, on_frame, &t);
  }
  hora__cycle_inbox_free(inbox);
  free(stream);
  return 0;
}

