/* The RDMA device every connection of the process shares: which device and
 * port (HORA_IB_DEVICE, else the active one nearest this process's cores),
 * its GID, the protection domain and the one completion queue, opened with
 * the first user and closed with the last; and whether there is any. */
#include "base/common.h"

#if HORA_HAVE_VERBS

#include <fcntl.h>
#include <hwloc.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/transport/ib/ib.h"

struct ib_ctx *hora__ib_dev; /* coordinator thread only */

/* ---- device ------------------------------------------------------------------- */

int hora__ib_verbs_error(const char *what) {
  return hora__error_errno(HORA_ERR_SYSTEM, "%s", what);
}

/* The device (and port) named by HORA_IB_DEVICE ("mlx5_0" or "mlx5_0:1"),
 * else the active one nearest to this process's cores. */
static int pick_device(struct ibv_device **list, int n, int *which, int *port_out) {
  const char *want = hora__params.IB_DEVICE;
  char name[64] = "";
  int want_port = 0;
  if (want && want[0]) {
    hora__strlcpy(name, want, sizeof(name));
    char *colon = strchr(name, ':');
    if (colon) {
      *colon = '\0';
      want_port = atoi(colon + 1);
    }
  }
  /* hwloc knows which PCI slot, hence which NUMA node, a device sits on. */
  hwloc_topology_t topo = NULL;
  hwloc_bitmap_t mine = NULL;
  if (!name[0] && hwloc_topology_init(&topo) == 0) {
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(topo) == 0) {
      mine = hwloc_bitmap_alloc();
      if (mine && hwloc_get_cpubind(topo, mine, HWLOC_CPUBIND_PROCESS) != 0) {
        hwloc_bitmap_copy(mine, hwloc_topology_get_allowed_cpuset(topo));
      }
    }
  }
  int best = -1, best_port = 0, best_near = -1;
  for (int i = 0; i < n; i++) {
    const char *dn = ibv_get_device_name(list[i]);
    if (name[0] && strcmp(dn, name) != 0) {
      continue;
    }
    struct ibv_context *c = ibv_open_device(list[i]);
    if (!c) {
      continue;
    }
    struct ibv_device_attr da;
    int active = 0;
    if (ibv_query_device(c, &da) == 0) {
      for (int p = 1; p <= da.phys_port_cnt && !active; p++) {
        struct ibv_port_attr pa;
        if ((!want_port || p == want_port) && ibv_query_port(c, (uint8_t)p, &pa) == 0 &&
            pa.state == IBV_PORT_ACTIVE) {
          active = p;
        }
      }
    }
    ibv_close_device(c);
    if (!active) {
      continue;
    }
    int near = 0;
    if (topo && mine) {
      for (hwloc_obj_t o = hwloc_get_next_osdev(topo, NULL); o; o = hwloc_get_next_osdev(topo, o)) {
        if (o->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS && strcmp(o->name, dn) == 0) {
          hwloc_obj_t a = hwloc_get_non_io_ancestor_obj(topo, o);
          near = a && a->cpuset && hwloc_bitmap_intersects(a->cpuset, mine);
        }
      }
    }
    if (near > best_near) {
      best = i;
      best_port = active;
      best_near = near;
    }
  }
  if (mine) {
    hwloc_bitmap_free(mine);
  }
  if (topo) {
    hwloc_topology_destroy(topo);
  }
  if (best < 0) {
    return hora__error(HORA_ERR_NOT_SUPPORTED, "no RDMA device with an active port%s%s%s",
                       name[0] ? " named '" : "", name, name[0] ? "' (HORA_IB_DEVICE)" : "");
  }
  *which = best;
  *port_out = best_port;
  return HORA_SUCCESS;
}

/* RoCE v2 over IPv4 when there is one (it routes), else the first valid
 * GID; HORA_IB_GID_INDEX overrides. */
static int pick_gid(struct ib_ctx *d, int gid_table_len) {
  if (hora__params.IB_GID_INDEX >= 0) {
    d->gid_index = (int)hora__params.IB_GID_INDEX;
  } else {
    d->gid_index = -1;
    int fallback = -1;
    for (int i = 0; i < gid_table_len; i++) {
      struct ibv_gid_entry e;
      if (ibv_query_gid_ex(d->ctx, (uint32_t)d->port, (uint32_t)i, &e, 0) != 0) {
        continue;
      }
      bool v4 = e.gid.raw[10] == 0xff && e.gid.raw[11] == 0xff;
      if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && v4) {
        d->gid_index = i;
        break;
      }
      if (fallback < 0) {
        fallback = i;
      }
    }
    if (d->gid_index < 0) {
      d->gid_index = fallback >= 0 ? fallback : 0;
    }
  }
  if (ibv_query_gid(d->ctx, (uint8_t)d->port, d->gid_index, &d->gid) != 0) {
    return hora__error_errno(HORA_ERR_SYSTEM, "ibv_query_gid(%s port %d index %d)", d->name,
                             d->port, d->gid_index);
  }
  return HORA_SUCCESS;
}

void hora__ib_dev_put(void) {
  if (!hora__ib_dev || --hora__ib_dev->refs > 0) {
    return;
  }
  HORA_INFO(
      "rdma: sent %llu bytes straight from registered memory into the peer's, %llu through "
      "send slots into the peer's registered memory, %llu through the receive ring",
      (unsigned long long)hora__ib_dev->bytes_direct,
      (unsigned long long)hora__ib_dev->bytes_via_slots,
      (unsigned long long)hora__ib_dev->bytes_ring);
  if (hora__ib_dev->flush_qp) {
    ibv_destroy_qp(hora__ib_dev->flush_qp);
  }
  if (hora__ib_dev->flush_mr) {
    ibv_dereg_mr(hora__ib_dev->flush_mr);
  }
  free(hora__ib_dev->flush_buf);
  if (hora__ib_dev->cq) {
    ibv_destroy_cq(hora__ib_dev->cq);
  }
  if (hora__ib_dev->channel) {
    ibv_destroy_comp_channel(hora__ib_dev->channel);
  }
  if (hora__ib_dev->pd) {
    ibv_dealloc_pd(hora__ib_dev->pd);
  }
  if (hora__ib_dev->ctx) {
    ibv_close_device(hora__ib_dev->ctx);
  }
  if (hora__ib_dev->kick_fd >= 0) {
    close(hora__ib_dev->kick_fd);
  }
  free(hora__ib_dev->conns);
  free(hora__ib_dev->regions);
  free(hora__ib_dev);
  hora__ib_dev = NULL;
}

int hora__ib_dev_get(hora__net *net) {
  if (hora__ib_dev) {
    hora__ib_dev->refs++;
    return HORA_SUCCESS;
  }
  int n = 0;
  struct ibv_device **list = ibv_get_device_list(&n);
  if (!list || n == 0) {
    if (list) {
      ibv_free_device_list(list);
    }
    return hora__error(HORA_ERR_NOT_SUPPORTED, "no RDMA device (ibv_get_device_list found none)");
  }
  struct ib_ctx *d = hora__calloc(1, sizeof(*d));
  if (!d) {
    ibv_free_device_list(list);
    return HORA_ERR_NO_MEMORY;
  }
  d->kick_fd = -1;
  d->refs = 1;
  hora__ib_dev = d;
  int which = 0, rc;
  int port = 1;
  HORA_CHECK_GOTO(pick_device(list, n, &which, &port), rc, fail);
  d->port = port;
  hora__strlcpy(d->name, ibv_get_device_name(list[which]), sizeof(d->name));
  d->ctx = ibv_open_device(list[which]);
  ibv_free_device_list(list);
  list = NULL;
  if (!d->ctx) {
    rc = hora__ib_verbs_error("ibv_open_device");
    goto fail;
  }
  struct ibv_port_attr pa;
  if (ibv_query_port(d->ctx, (uint8_t)d->port, &pa) != 0) {
    rc = hora__ib_verbs_error("ibv_query_port");
    goto fail;
  }
  d->lid = pa.lid;
  d->mtu = pa.active_mtu;
  d->roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
  HORA_CHECK_GOTO(pick_gid(d, pa.gid_tbl_len), rc, fail);
  d->pd = ibv_alloc_pd(d->ctx);
  d->channel = ibv_create_comp_channel(d->ctx);
  int cqe = (RECV_DEPTH + SEND_DEPTH) * HORA_MAX(net->size, 4);
  d->cq = d->channel ? ibv_create_cq(d->ctx, cqe, NULL, d->channel, 0) : NULL;
  d->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (!d->pd || !d->channel || !d->cq || d->kick_fd < 0) {
    rc = hora__ib_verbs_error("setting up the RDMA device (PD, completion channel, CQ)");
    goto fail;
  }
  int flags = fcntl(d->channel->fd, F_GETFL);
  fcntl(d->channel->fd, F_SETFL, flags | O_NONBLOCK);
  flags = fcntl(d->ctx->async_fd, F_GETFL);
  fcntl(d->ctx->async_fd, F_SETFL, flags | O_NONBLOCK);
  HORA_INFO("rdma: device %s port %d, %s, GID index %d, MTU %d", d->name, d->port,
            d->roce ? "RoCE" : "InfiniBand", d->gid_index, 128 << d->mtu);
  return HORA_SUCCESS;
fail:
  if (list) {
    ibv_free_device_list(list);
  }
  hora__ib_dev_put();
  return rc;
}

/* Whether this machine has an active RDMA port at all (for HORA_TRANSPORT=auto). */
bool hora__ib_available(void) {
  int n = 0;
  struct ibv_device **list = ibv_get_device_list(&n);
  bool any = false;
  for (int i = 0; list && i < n && !any; i++) {
    struct ibv_context *c = ibv_open_device(list[i]);
    struct ibv_device_attr da;
    if (c && ibv_query_device(c, &da) == 0) {
      for (int p = 1; p <= da.phys_port_cnt && !any; p++) {
        struct ibv_port_attr pa;
        any = ibv_query_port(c, (uint8_t)p, &pa) == 0 && pa.state == IBV_PORT_ACTIVE;
      }
    }
    if (c) {
      ibv_close_device(c);
    }
  }
  if (list) {
    ibv_free_device_list(list);
  }
  return any;
}

#endif /* HORA_HAVE_VERBS */
