/* The frame layer of a control connection: whatever bytes arrive on the
 * socket, in pieces. */
#include <sys/socket.h>
#include <unistd.h>

#include "../../comm/comm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0) {
    return 0;
  }
  hora__ctrl *c = hora__ctrl_new(sv[1], 3);
  size_t off = 0;
  int dead = 0;
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
      if (n > HORA_CTRL_MAX_FRAME) {
        __builtin_trap();
      }
    }
  }
  close(sv[0]);
  hora__ctrl_free(c);
  return 0;
}
