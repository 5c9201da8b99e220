/* The connection handshake: any 48 bytes a stranger may send. */
#include "../../comm/comm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const uint8_t secret[HORA_SECRET_LEN] = {1, 2, 3};
  uint8_t wire[HORA_HELLO_WIRE_SIZE] = {0};
  memcpy(wire, data, size < sizeof(wire) ? size : sizeof(wire));
  struct hora__hello h;
  if (hora__hello_decode(wire, secret, 16, &h) == HORA_SUCCESS) {
    /* Accepted only with the secret, a rank in range and a known kind. */
    if (memcmp(h.secret, secret, HORA_SECRET_LEN) != 0 || h.rank < 0 || h.rank >= 16 ||
        h.kind < 1 || h.kind > HORA_CONN_SLOTS) {
      __builtin_trap();
    }
  }
  return 0;
}
