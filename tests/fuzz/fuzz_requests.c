/* A REQUESTS message from a rank. */
#include "runtime/negotiate/message.h"

static int on_request(void *arg, const struct hora__wire_request *r) {
  (void)arg;
  if (r->key_len < 1 || r->key_len > HORA_KEY_MAX || r->meta.kind > HORA_KIND_SHUTDOWN) {
    __builtin_trap();
  }
  return HORA_SUCCESS;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct hora__request_sink sink = {on_request, NULL};
  (void)hora__decode_requests(data, size, &sink);
  return 0;
}
