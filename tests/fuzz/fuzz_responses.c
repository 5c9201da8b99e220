/* A RESPONSES message from rank 0, decoded against a response cache that
 * already holds a few entries (so slot references resolve sometimes). */
#include <stdlib.h>

#include "runtime/negotiate/cache.h"
#include "runtime/negotiate/message.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct hora__cache cache;
  if (hora__cache_init(&cache, 4) != HORA_SUCCESS) {
    return 0;
  }
  struct hora__op_meta m = {.kind = HORA_KIND_ALLREDUCE, .dtype = HORA_FLOAT32, .count = 10,
                            .prescale = 1, .postscale = 1};
  int32_t slot;
  hora__cache_note(&cache, "Na", 2, &m, &slot);
  hora__cache_note(&cache, "Nb", 2, &m, &slot);
  struct hora__response *head = NULL, **tail = &head;
  if (hora__decode_responses(data, size, &tail, &cache) == HORA_SUCCESS) {
    for (struct hora__response *r = head; r; r = r->next) {
      if (r->kind >= HORA_KIND_COUNT_) {
        __builtin_trap();
      }
    }
  }
  while (head) {
    struct hora__response *n = head->next;
    hora__response_free(head);
    head = n;
  }
  hora__cache_free(&cache);
  return 0;
}
