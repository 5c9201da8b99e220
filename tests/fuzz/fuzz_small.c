/* The small messages: ABORT and RESEND. */
#include "../../runtime/message.h"

static int on_slot(void *arg, uint32_t version, uint32_t slot) {
  (void)arg;
  (void)version;
  (void)slot;
  return HORA_SUCCESS;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int origin, code;
  char msg[64];
  if (hora__decode_abort(data, size, &origin, &code, msg, sizeof(msg)) == HORA_SUCCESS) {
    if (code <= HORA_SUCCESS || code >= HORA_RESULT_COUNT_ || strlen(msg) >= sizeof(msg)) {
      __builtin_trap();
    }
  }
  uint32_t version;
  (void)hora__decode_resend(data, size, &version, on_slot, NULL);
  return 0;
}
