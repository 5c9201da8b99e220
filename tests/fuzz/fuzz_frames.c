/* The frame layer of a control connection: whatever bytes arrive on the
 * socket, in pieces. */
#include "ctrl_feed.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_feed_ctrl(data, size, 3, NULL, NULL);
  return 0;
}
