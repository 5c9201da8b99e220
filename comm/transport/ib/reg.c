/* Registered memory (hora__comm_register): host buffers, and GPU memory
 * through its dma-buf, with the loopback queue pair that flushes the NIC's
 * writes into GPU memory before the GPU reads them. */
#include "base/common.h"

#if HORA_HAVE_VERBS

#include "comm/transport/ib/ib.h"

/* The loopback queue pair of the flushes, made with the first device region. */
static int open_flush_qp(void) {
  if (hora__ib_dev->flush_qp) {
    return HORA_SUCCESS;
  }
  hora__ib_dev->flush_buf = hora__aligned_alloc(64, 64);
  hora__ib_dev->flush_mr =
      hora__ib_dev->flush_buf
          ? ibv_reg_mr(hora__ib_dev->pd, hora__ib_dev->flush_buf, 64, IBV_ACCESS_LOCAL_WRITE)
          : NULL;
  /* One flush in flight per connection at most. */
  struct ibv_qp_init_attr qa = {
      .send_cq = hora__ib_dev->cq,
      .recv_cq = hora__ib_dev->cq,
      .cap = {.max_send_wr = (uint32_t)HORA_MAX(2 * hora__ib_dev->nconns, 64), .max_recv_wr = 1,
              .max_send_sge = 1, .max_recv_sge = 1},
      .qp_type = IBV_QPT_RC,
  };
  hora__ib_dev->flush_qp = hora__ib_dev->flush_mr ? ibv_create_qp(hora__ib_dev->pd, &qa) : NULL;
  if (!hora__ib_dev->flush_qp) {
    return hora__ib_verbs_error("setting up the GPUDirect flush queue pair");
  }
  uint32_t psn = (uint32_t)(hora__now_ns() & 0xffffff);
  struct hora__ib_record self = {.qpn = hora__ib_dev->flush_qp->qp_num,
                                 .psn = psn,
                                 .lid = hora__ib_dev->lid,
                                 .mtu = (uint8_t)hora__ib_dev->mtu};
  memcpy(self.gid, hora__ib_dev->gid.raw, 16);
  return hora__ib_connect_qp(hora__ib_dev->flush_qp, NULL, &self, psn);
}

/* Registered for the life of the buffer (hora__comm_register): the fusion
 * buffer and the ring's staging. Each region keeps the device open. */
static int add_region(hora__net *net, void *buf, size_t len, int dmabuf_fd, uint64_t offset,
                      void **handle) {
  *handle = NULL;
  HORA_CHECK(hora__ib_dev_get(net));
  if (hora__ib_dev->nregions == hora__ib_dev->capregions) {
    int cap = hora__ib_dev->capregions ? 2 * hora__ib_dev->capregions : 4;
    struct ib_region *p = hora__realloc(hora__ib_dev->regions, (size_t)cap * sizeof(*p));
    if (!p) {
      hora__ib_dev_put();
      return HORA_ERR_NO_MEMORY;
    }
    hora__ib_dev->regions = p;
    hora__ib_dev->capregions = cap;
  }
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (dmabuf_fd >= 0) {
    int rc = open_flush_qp();
    if (rc != HORA_SUCCESS) {
      hora__ib_dev_put();
      return rc;
    }
    access |= IBV_ACCESS_REMOTE_READ; /* the flush reads it */
  }
  struct ibv_mr *mr = dmabuf_fd >= 0 ? ibv_reg_dmabuf_mr(hora__ib_dev->pd, offset, len,
                                                         (uintptr_t)buf, dmabuf_fd, access)
                                     : ibv_reg_mr(hora__ib_dev->pd, buf, len, access);
  if (!mr) {
    int rc = hora__error_errno(HORA_ERR_SYSTEM, "%s of %zu bytes on %s",
                               dmabuf_fd >= 0 ? "ibv_reg_dmabuf_mr" : "ibv_reg_mr", len,
                               hora__ib_dev->name);
    hora__ib_dev_put();
    return rc;
  }
  hora__ib_dev->regions[hora__ib_dev->nregions++] =
      (struct ib_region){.base = buf, .len = len, .mr = mr, .device = dmabuf_fd >= 0};
  *handle = mr;
  return HORA_SUCCESS;
}

int hora__ib_reg_mem(hora__net *net, void *buf, size_t len, void **handle) {
  return add_region(net, buf, len, -1, 0, handle);
}

/* GPU memory, through the dma-buf its driver exported for [buf, buf+len). */
int hora__ib_reg_dmabuf(hora__net *net, void *buf, size_t len, int fd, uint64_t offset,
                        void **handle) {
  return add_region(net, buf, len, fd, offset, handle);
}

int hora__ib_dereg_mem(hora__net *net, void *handle) {
  (void)net;
  if (!handle || !hora__ib_dev) {
    return HORA_SUCCESS;
  }
  for (int i = 0; i < hora__ib_dev->nregions; i++) {
    if (hora__ib_dev->regions[i].mr == handle) {
      hora__ib_dev->regions[i] = hora__ib_dev->regions[--hora__ib_dev->nregions];
      break;
    }
  }
  int rc = HORA_SUCCESS;
  if (ibv_dereg_mr(handle) != 0) {
    rc = hora__error_errno(HORA_ERR_SYSTEM, "ibv_dereg_mr");
  }
  hora__ib_dev_put();
  return rc;
}

#endif /* HORA_HAVE_VERBS */
