/* Host topology through hwloc: cores, NUMA nodes and this process's binding,
 * for the start-up log line and for choosing whether waiting may spin. */
#include "runtime/topology.h"

#include <hwloc.h>
#include <stdio.h>

int hora__topology_probe(struct hora__topology *t) {
  memset(t, 0, sizeof(*t));
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) {
    return hora__error_errno(HORA_ERR_SYSTEM, "hwloc_topology_init");
  }
  if (hwloc_topology_load(topo) != 0) {
    int rc = hora__error_errno(HORA_ERR_SYSTEM, "hwloc_topology_load");
    hwloc_topology_destroy(topo);
    return rc;
  }
  t->packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
  t->numa_nodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  t->cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  t->pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);

  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  hwloc_bitmap_t nodes = hwloc_bitmap_alloc();
  int rc = HORA_SUCCESS;
  if (!set || !nodes) {
    rc = hora__error(HORA_ERR_NO_MEMORY, "hwloc_bitmap_alloc");
    goto out;
  }
  if (hwloc_get_cpubind(topo, set, HWLOC_CPUBIND_PROCESS) != 0) {
    /* Some containers refuse the query; report the whole machine. */
    hwloc_bitmap_copy(set, hwloc_topology_get_allowed_cpuset(topo));
  }
  t->bound = !hwloc_bitmap_isincluded(hwloc_topology_get_allowed_cpuset(topo), set);
  hwloc_bitmap_list_snprintf(t->cpus, sizeof(t->cpus), set);
  hwloc_cpuset_to_nodeset(topo, set, nodes);
  hwloc_bitmap_list_snprintf(t->numa, sizeof(t->numa), nodes);
out:
  hwloc_bitmap_free(set);
  hwloc_bitmap_free(nodes);
  hwloc_topology_destroy(topo);
  return rc;
}
