/* The table of transports, by name. */
#include <string.h>

#include "comm/transport/builtin.h"

static const struct hora__transport *const transports[] = {
    &hora__transport_tcp,
#if HORA_HAVE_VERBS
    &hora__transport_ib,
#endif
    &hora__transport_mock,
};

const struct hora__transport *hora__transport_find(const char *name) {
  for (size_t i = 0; i < sizeof(transports) / sizeof(transports[0]); i++) {
    if (strcmp(transports[i]->name, name) == 0) {
      return transports[i];
    }
  }
  return NULL;
}
