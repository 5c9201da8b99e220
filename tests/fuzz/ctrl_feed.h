/* Feeds fuzz bytes into a control connection the way a peer's socket
 * delivers them, in pieces of 1 to 97 bytes (the first byte of each piece
 * picks its length), and hands every complete frame to on_frame. Stops at
 * the first read error, decode error, or non-zero return of on_frame. */
#ifndef HORA_FUZZ_CTRL_FEED_H
#define HORA_FUZZ_CTRL_FEED_H

#include <sys/socket.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/transport/socket.h"

typedef int (*fuzz_frame_fn)(void *arg, uint16_t type, const uint8_t *p, size_t n);

static inline void fuzz_feed_ctrl(const uint8_t *data, size_t size, int from, fuzz_frame_fn on_frame,
                                  void *arg) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0) {
    return;
  }
  hora__ctrl *c = hora__ctrl_new(sv[1], from);
  size_t off = 0;
  bool dead = false;
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
        dead = true;
        break;
      }
      if (!got) {
        break;
      }
      if (n > HORA_CTRL_MAX_FRAME) {
        __builtin_trap();
      }
      if (on_frame && on_frame(arg, type, p, n) != 0) {
        dead = true;
        break;
      }
    }
  }
  close(sv[0]);
  hora__ctrl_free(c);
}

#endif
