/* The host as hwloc sees it, and where this process is bound. */
#ifndef HORA_TOPOLOGY_H
#define HORA_TOPOLOGY_H

#include "base/common.h"

struct hora__topology {
  int packages, numa_nodes, cores, pus;
  bool bound;          /* bound to fewer PUs than the machine has */
  char cpus[128];      /* PU list of the binding, e.g. "0-1" */
  char numa[64];       /* NUMA nodes the binding touches, e.g. "0" */
};

int hora__topology_probe(struct hora__topology *t);

#endif
