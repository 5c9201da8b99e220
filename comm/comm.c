/* What every communicator offers once built (comm/communicator builds
 * them): registered buffers, the host lookup, tearing down. */
#include <openssl/crypto.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/log.h"
#include "comm/comm.h"
#include "comm/shm/shm.h"

int hora__comm_rank_on_host(const hora__comm *c, int host) {
  for (int r = 0; r < c->size; r++) {
    if (c->net->peers[r].host_index == host && c->net->peers[r].local_rank == c->local_rank) {
      return r;
    }
  }
  return -1;
}

void hora__comm_disconnect(hora__comm *c) {
  if (c->proc->ctrl) {
    for (int r = 0; r < c->size; r++) {
      hora__ctrl_free(c->proc->ctrl[r]);
      c->proc->ctrl[r] = NULL;
    }
  }
  for (int k = 0; k < 2; k++) {
    hora__conn **v = k ? c->proc->cross : c->proc->data;
    for (int r = 0; v && r < c->size; r++) {
      if (v[r]) {
        v[r]->tp->close(v[r]);
        v[r] = NULL;
      }
    }
  }
  c->world_ring.next = c->world_ring.prev = NULL;
  c->cross_ring.next = c->cross_ring.prev = NULL;
  c->net->active = NULL;
  if (c->proc->tcp_listen_fd >= 0) {
    close(c->proc->tcp_listen_fd);
    c->proc->tcp_listen_fd = -1;
  }
  if (c->proc->unix_listen_fd >= 0) {
    close(c->proc->unix_listen_fd);
    c->proc->unix_listen_fd = -1;
  }
  if (c->proc->reserve_fd >= 0) {
    close(c->proc->reserve_fd);
    c->proc->reserve_fd = -1;
  }
}

void hora__comm_register(hora__comm *c, void *buf, size_t len, void **handle) {
  *handle = NULL;
  const struct hora__transport *tp = c->proc->rdma;
  if (tp && tp->zero_copy && len > 0 && tp->reg_mem(c->net, buf, len, handle) != HORA_SUCCESS) {
    HORA_WARN("RDMA registration of a %zu-byte buffer failed (%s); transfers into it are copied",
              len, hora_last_error());
    *handle = NULL;
  }
}

int hora__comm_register_device(hora__comm *c, void *buf, size_t len, int fd, uint64_t offset,
                               void **handle) {
  *handle = NULL;
  const struct hora__transport *tp = c->proc->rdma;
  if (!tp || !tp->reg_dmabuf) {
    return hora__error(HORA_ERR_NOT_SUPPORTED,
                       hora__transport_find("ib") ? "no RDMA connections to register GPU memory with"
                                                  : "built without RDMA (libibverbs)");
  }
  return tp->reg_dmabuf(c->net, buf, len, fd, offset, handle);
}

void hora__comm_deregister(hora__comm *c, void **handle) {
  if (*handle && c->proc->rdma) {
    c->proc->rdma->dereg_mem(c->net, *handle);
  }
  *handle = NULL;
}

int hora__comm_grow_registered(hora__comm *c, char **buf, size_t *bytes, void **handle,
                               size_t need) {
  if (*bytes >= need) {
    return HORA_SUCCESS;
  }
  /* Page-aligned: RDMA registers whole pages. */
  char *p = hora__aligned_alloc(4096, need);
  if (!p) {
    return HORA_ERR_NO_MEMORY;
  }
  hora__comm_deregister(c, handle);
  free(*buf);
  *buf = p;
  *bytes = need;
  hora__comm_register(c, p, need, handle);
  return HORA_SUCCESS;
}

void hora__comm_destroy(hora__comm *c) {
  if (!c) {
    return;
  }
  hora__comm_disconnect(c);
  hora__comm_deregister(c, &c->fusion_reg);
  hora__comm_deregister(c, &c->scratch_reg);
  hora__comm_deregister(c, &c->reduced_reg);
  hora__comm_deregister(c, &c->temp_reg);
  hora__comm_deregister(c, &c->proc->shm_reg);
  OPENSSL_cleanse(c->proc->secret, sizeof(c->proc->secret));
  OPENSSL_cleanse(c->proc->job_secret, sizeof(c->proc->job_secret));
  hora__peer_maps_free(c->proc->peer_maps, c->local_size);
  free(c->proc->peer_ptrs);
  hora__shm_destroy(c->proc->shm);
  free(c->fusion);
  free(c->scratch);
  free(c->reduced);
  free(c->temp);
  free(c->proc->bounce);
  free(c->net->peers);
  free(c->proc->ctrl);
  free(c->proc->data);
  free(c->proc->cross);
  if (c->owns_proc) {
    free(c->proc);
  }
  free(c);
}
