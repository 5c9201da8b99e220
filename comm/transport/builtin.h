/* The transports compiled into this build. Only their own files and the
 * registry (registry.c) include this: everyone else finds a transport by
 * name (hora__transport_find) and calls it through the vtable. */
#ifndef HORA_TRANSPORT_BUILTIN_H
#define HORA_TRANSPORT_BUILTIN_H

#include "comm/transport/transport.h"

extern const struct hora__transport hora__transport_tcp;
extern const struct hora__transport hora__transport_mock;
#if HORA_HAVE_VERBS
extern const struct hora__transport hora__transport_ib;
#endif

#endif
