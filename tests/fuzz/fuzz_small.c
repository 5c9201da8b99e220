/* The small messages: ABORT and CYCLE. */
#include "runtime/negotiate/message.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int origin, code;
  char msg[64];
  if (hora__decode_abort(data, size, &origin, &code, msg, sizeof(msg)) == HORA_SUCCESS) {
    if (code <= HORA_SUCCESS || code >= HORA_RESULT_COUNT_ || strlen(msg) >= sizeof(msg)) {
      __builtin_trap();
    }
  }
  struct hora__cycle_msg m;
  if (hora__decode_cycle(data, size, &m) == HORA_SUCCESS) {
    /* 26 bytes of header and eager length, then the lateness record. */
    size_t vecs = HORA_CYCLE_VECTORS * (size_t)m.nbytes;
    if (vecs + HORA_CYCLE_LATE_BYTES + m.eager_len != size - 26 ||
        m.eager != m.vec + vecs + HORA_CYCLE_LATE_BYTES + 4 ||
        (m.flags & ~HORA_CYCLE_FLAGS_ALL)) {
      __builtin_trap();
    }
  }
  return 0;
}
