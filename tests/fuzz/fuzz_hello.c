/* The connection handshake's first message: any 48 bytes a stranger may
 * send. It proves nothing (handshake.c checks the proof); the decoder must
 * only keep ranks and kinds in range. */
#include "comm/comm.h"
#include "comm/transport/socket.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t wire[HORA_HELLO_WIRE_SIZE] = {0};
  memcpy(wire, data, size < sizeof(wire) ? size : sizeof(wire));
  struct hora__hello h;
  if (hora__hello_decode(wire, 16, HORA_CONN_SLOTS, &h) == HORA_SUCCESS) {
    /* Accepted only with the magic and version, a rank in range and a known kind. */
    if (h.magic != HORA_HELLO_MAGIC || h.version != HORA_HELLO_VERSION || h.rank < 0 ||
        h.rank >= 16 || h.size != 16 || h.kind < 1 || h.kind > HORA_CONN_SLOTS) {
      __builtin_trap();
    }
  }
  return 0;
}
