/* The cycle frames, as the coordinator reads them: bytes arrive on a
 * control connection in pieces (read_ctrl), and each CYCLE frame is checked
 * and kept (on_cycle_frame, hora__cycle_accept) for a rank whose job size,
 * rank, peer, cycle count and cache size the first five bytes choose. What
 * is accepted must come from a partner of this rank, for one of the next
 * two cycles, once per step, within the cache's size. */
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../comm/comm.h"
#include "../../runtime/cycle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 5) {
    return 0;
  }
  int nranks = 1 + data[0] % 64, rank = data[1] % nranks, from = data[2] % nranks;
  uint64_t cycles = data[3];
  uint32_t max_nbytes = data[4] % 129u;
  data += 5;
  size -= 5;
  struct hora__cycle_partners cp;
  hora__cycle_partners(rank, nranks, &cp);
  struct hora__cycle_inbox *inbox = calloc(2 * HORA_INBOX_STEPS, sizeof(*inbox));
  int sv[2];
  if (!inbox || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0) {
    free(inbox);
    return 0;
  }
  hora__ctrl *c = hora__ctrl_new(sv[1], from);
  size_t off = 0;
  int dead = 0, accepted = 0;
  while (off < size && !dead) {
    size_t piece = 1 + (data[off] % 97);
    piece = piece > size - off ? size - off : piece;
    if (write(sv[0], data + off, piece) < 0) {
      break;
    }
    off += piece;
    if (hora__ctrl_read(c) != HORA_SUCCESS) {
      break;
    }
    for (;;) {
      bool got;
      uint16_t type;
      const uint8_t *p;
      size_t n;
      if (hora__ctrl_next(c, &got, &type, &p, &n) != HORA_SUCCESS) {
        dead = 1;
        break;
      }
      if (!got) {
        break;
      }
      if (type != HORA_MSG_CYCLE) {
        continue;
      }
      if (hora__cycle_accept(inbox, &cp, cycles, max_nbytes, from, p, n) != HORA_SUCCESS) {
        dead = 1; /* the job fails here */
        break;
      }
      struct hora__cycle_msg m;
      if (hora__decode_cycle(p, n, &m) != HORA_SUCCESS || m.cycle <= cycles ||
          m.cycle > cycles + 2 || m.nbytes > max_nbytes || m.step >= HORA_INBOX_STEPS) {
        __builtin_trap();
      }
      bool partner = from == cp.fold || (m.step >= 1 && m.step <= cp.nrounds &&
                                         cp.round[m.step - 1] == from);
      struct hora__cycle_inbox *in = hora__cycle_inbox_of(inbox, m.cycle, m.step);
      if (!partner || !in->has || in->nbytes != m.nbytes || in->cap < 3 * (size_t)m.nbytes ||
          (m.nbytes && memcmp(in->vec, m.vec, 3 * (size_t)m.nbytes) != 0)) {
        __builtin_trap();
      }
      /* Every third step ends the next cycle, which spends its inbox. */
      if (++accepted % 3 == 0) {
        for (int s = 0; s < HORA_INBOX_STEPS; s++) {
          hora__cycle_inbox_of(inbox, cycles + 1, s)->has = false;
        }
        cycles++;
      }
    }
  }
  close(sv[0]);
  hora__ctrl_free(c);
  hora__cycle_inbox_free(inbox);
  return 0;
}
