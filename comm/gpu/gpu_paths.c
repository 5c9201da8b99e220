/* The device collectives' paths: NCCL, and staged through pinned host
 * memory over the host data plane (with GPUDirect RDMA for broadcasts
 * where the NIC can read device memory). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/gpu/gpu_private.h"

/* ---- packing ------------------------------------------------------------------- */

int hora__gpu_elem_type(hora_dtype dt) {
  switch (dt) {
    case HORA_FLOAT16: return HORA__GPU_F16;
    case HORA_BFLOAT16: return HORA__GPU_BF16;
    case HORA_FLOAT32: return HORA__GPU_F32;
    case HORA_FLOAT64: return HORA__GPU_F64;
    case HORA_INT32: return HORA__GPU_I32;
    case HORA_INT64: return HORA__GPU_I64;
    case HORA_UINT8: return HORA__GPU_U8;
    case HORA_INT8: return HORA__GPU_I8;
    case HORA_INT16: return HORA__GPU_I16;
    case HORA_BOOL: return HORA__GPU_BOOL;
  }
  return -1;
}

/* Copies list[i] to/from consecutive places of flat (device or mapped
 * memory) in one launch. Stand-ins (base NULL) are zeroed on the way in
 * and skipped on the way out. */
int hora__gpu_pack(hora__comm *c, struct hora__gpu *g, const struct hora__iov *list, int n,
                char *flat, bool in) {
  HORA_CHECK(hora__gpu_take_descs(c, g, n));
  struct hora__copy_desc *d = g->descs + g->descs_used;
  int k = 0;
  size_t off = 0, biggest = 0;
  for (int i = 0; i < n; i++) {
    if (!list[i].base) {
      if (in && list[i].len) {
        CUDA_CHECK(cudaMemsetAsync(flat + off, 0, list[i].len, g->stream));
      }
    } else if (list[i].len) {
      d[k].src = in ? list[i].base : flat + off;
      d[k].dst = in ? (void *)(flat + off) : list[i].base;
      d[k].bytes = list[i].len;
      biggest = list[i].len > biggest ? list[i].len : biggest;
      k++;
    }
    off += list[i].len;
  }
  CUDA_CHECK(hora__launch_batched_copy(g->descs_dev + g->descs_used, k, biggest, g->stream));
  g->descs_used += k;
  return HORA_SUCCESS;
}

int hora__gpu_scale(struct hora__gpu *g, void *p, size_t count, hora_dtype dt, double mul, int div) {
  if (mul == 1.0 && div <= 1) {
    return HORA_SUCCESS;
  }
  CUDA_CHECK(hora__launch_scale(p, count, hora__gpu_elem_type(dt), mul, div > 1 ? div : 1, g->stream));
  return HORA_SUCCESS;
}

static size_t total_len(const struct hora__iov *v, int n) {
  size_t t = 0;
  for (int i = 0; i < n; i++) {
    t += v[i].len;
  }
  return t;
}

void hora__gpu_phase(const struct hora__coll_op *op, const char *name) {
  if (op->opts && op->opts->phase) {
    op->opts->phase(op->opts->phase_arg, name);
  }
}

/* ---- NCCL path ------------------------------------------------------------------- */

#if HORA_HAVE_NCCL
ncclDataType_t hora__gpu_nccl_type(hora_dtype dt) {
  switch (dt) {
    case HORA_UINT8: return ncclUint8;
    case HORA_INT8: return ncclInt8;
    case HORA_INT32: return ncclInt32;
    case HORA_INT64: return ncclInt64;
    case HORA_FLOAT16: return ncclFloat16;
    case HORA_BFLOAT16: return ncclBfloat16;
    case HORA_FLOAT32: return ncclFloat32;
    case HORA_FLOAT64: return ncclFloat64;
    case HORA_BOOL: return ncclUint8; /* reduced by nccl_op's max and min */
    case HORA_INT16: break;           /* none: hora__gpu_nccl_reduces() sends it staged */
  }
  return ncclFloat32;
}

/* Whether NCCL can reduce dtype; broadcast and allgather move bytes. */
bool hora__gpu_nccl_reduces(hora_dtype dt) { return dt != HORA_INT16; }

ncclRedOp_t hora__gpu_nccl_op(hora_dtype dt, hora_op op) {
  if (dt == HORA_BOOL) {
    /* On bytes, or is max and and is min; the results are made 0/1 after. */
    return op == HORA_MIN || op == HORA_PRODUCT ? ncclMin : ncclMax;
  }
  switch (op) {
    case HORA_MIN: return ncclMin;
    case HORA_MAX: return ncclMax;
    case HORA_PRODUCT: return ncclProd;
    default: return ncclSum; /* AVERAGE: a sum, then the divisor */
  }
}

int hora__gpu_nccl_run(hora__comm *c, struct hora__gpu *g, const struct hora__coll_op *op) {
  const struct hora__coll_opts *o = op->opts;
  if (op->kind == HORA_COLL_REDUCESCATTER) {
    return hora__gpu_nccl_reducescatter(c, g, op);
  }
  if (op->kind == HORA_COLL_ALLGATHERV || op->kind == HORA_COLL_ALLTOALL) {
    return hora__gpu_nccl_exchange(c, g, op);
  }
  if (op->kind == HORA_COLL_ALLGATHER) {
    hora__gpu_phase(op, "NCCL_ALLGATHER");
    NCCL_CHECK(ncclAllGather(op->in[0].base, op->out[0].base, op->in[0].len, ncclUint8, g->nccl,
                             g->stream));
    hora__gpu_phase(op, NULL);
    return HORA_SUCCESS;
  }
  size_t bytes = total_len(op->out, op->n);
  /* One tensor with buffers of its own runs in place: no copy at all. */
  bool direct = op->n == 1 && op->in[0].base && op->out[0].base;
  char *buf;
  if (direct) {
    buf = op->out[0].base;
    if (op->kind == HORA_COLL_ALLREDUCE && op->in[0].base != op->out[0].base &&
        o->prescale != 1.0) {
      /* Scale a copy, never the caller's input. */
      CUDA_CHECK(cudaMemcpyAsync(buf, op->in[0].base, bytes, cudaMemcpyDeviceToDevice,
                                 g->stream));
    }
  } else {
    HORA_CHECK(hora__gpu_grow_fusion(c, g, bytes));
    buf = g->fusion;
    if (op->kind == HORA_COLL_ALLREDUCE || c->rank == op->root) {
      hora__gpu_phase(op, "MEMCPY_IN_FUSION_BUFFER");
      HORA_CHECK(hora__gpu_pack(c, g, op->kind == HORA_COLL_ALLREDUCE ? op->in : op->out, op->n, buf, true));
      hora__gpu_phase(op, NULL);
    }
  }
  if (op->kind == HORA_COLL_ALLREDUCE) {
    const void *src = direct && o->prescale == 1.0 ? op->in[0].base : buf;
    if (src == buf) {
      HORA_CHECK(hora__gpu_scale(g, buf, op->count, op->dtype, o->prescale, 0));
    }
    hora__gpu_phase(op, "NCCL_ALLREDUCE");
    NCCL_CHECK(ncclAllReduce(src, buf, op->count, hora__gpu_nccl_type(op->dtype),
                             hora__gpu_nccl_op(op->dtype, op->op), g->nccl, g->stream));
    hora__gpu_phase(op, NULL);
    if (op->dtype == HORA_BOOL) {
      CUDA_CHECK(hora__launch_scale(buf, op->count, HORA__GPU_BOOL, 1.0, 1.0, g->stream));
    }
    HORA_CHECK(hora__gpu_scale(g, buf, op->count, op->dtype, o->postscale, o->divisor));
  } else {
    hora__gpu_phase(op, "NCCL_BROADCAST");
    NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclUint8, op->root, g->nccl, g->stream));
    hora__gpu_phase(op, NULL);
  }
  if (!direct && !(op->kind == HORA_COLL_BROADCAST && c->rank == op->root)) {
    hora__gpu_phase(op, "MEMCPY_OUT_FUSION_BUFFER");
    HORA_CHECK(hora__gpu_pack(c, g, op->out, op->n, buf, false));
    hora__gpu_phase(op, NULL);
  }
  return HORA_SUCCESS;
}
#endif

/* ---- staged path -------------------------------------------------------------------- */

/* GPUDirect RDMA: the NIC reads and writes the device fusion buffer itself.
 * Only for broadcasts (an allreduce is reduced by the CPU, in host memory),
 * and only when every connection of the ring is RDMA: shared memory and
 * sockets reach host memory only. */
typedef CUresult (*get_handle_fn)(void *handle, CUdeviceptr ptr, size_t size,
                                  CUmemRangeHandleType type, unsigned long long flags);

static int register_fusion_dmabuf(hora__comm *c, struct hora__gpu *g) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult found;
  if (cudaGetDriverEntryPointByVersion("cuMemGetHandleForAddressRange", &fn, 12000,
                                       cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || !fn) {
    (void)cudaGetLastError();
    return hora__error(HORA_ERR_NOT_SUPPORTED, "the CUDA driver cannot export dma-bufs");
  }
  int fd = -1;
  CUresult r = ((get_handle_fn)fn)(&fd, (CUdeviceptr)(uintptr_t)g->fusion, g->fusion_bytes,
                                   CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (r != CUDA_SUCCESS || fd < 0) {
    return hora__error(HORA_ERR_NOT_SUPPORTED,
                       "cuMemGetHandleForAddressRange(DMA_BUF_FD) failed with CUresult %d", (int)r);
  }
  int rc = hora__comm_register_device(c, g->fusion, g->fusion_bytes, fd, 0, &g->fusion_reg);
  close(fd); /* the registration holds the dma-buf */
  return rc;
}

static bool direct_usable(hora__comm *c, struct hora__gpu *g, size_t bytes) {
  bool rdma_ring = c->proc->ib_all || (c->proc->ib_remote && c->local_size == 1);
  if (!hora__params.GPU_DIRECT || c->size == 1 || c->shm_host || !rdma_ring) {
    return false;
  }
  if (hora__gpu_grow_fusion(c, g, bytes) != HORA_SUCCESS) {
    return false;
  }
  if (g->direct == 0) {
    int32_t ok = register_fusion_dmabuf(c, g) == HORA_SUCCESS;
    if (!ok) {
      HORA_INFO("GPUDirect RDMA not available here (%s)", hora_last_error());
    }
    /* Every rank must take the same path (device memory must be at both
     * ends of a transfer): the ranks agree, once per fusion buffer. */
    struct hora__iov v = {&ok, sizeof(ok)};
    if (hora__allreduce(c, &v, 1, &v, 1, 1, HORA_INT32, HORA_MIN, HORA_INT32, NULL) != HORA_SUCCESS) {
      return false;
    }
    g->direct = ok ? 1 : -1;
    if (!ok) {
      hora__comm_deregister(c, &g->fusion_reg);
    }
  }
  return g->direct > 0;
}

static int direct_broadcast(hora__comm *c, struct hora__gpu *g, const struct hora__coll_op *op,
                            size_t bytes) {
  bool root = c->rank == op->root;
  if (root) {
    hora__gpu_phase(op, "MEMCPY_IN_FUSION_BUFFER");
    HORA_CHECK(hora__gpu_pack(c, g, op->out, op->n, g->fusion, true));
    HORA_CHECK(hora__gpu_wait_stream(c, g)); /* the NIC reads what the kernel wrote */
    hora__gpu_phase(op, NULL);
  } else {
    HORA_CHECK(hora__gpu_wait_event(c, g, g->unpacked)); /* the NIC writes the fusion buffer */
  }
  hora__gpu_phase(op, "BROADCAST");
  HORA_CHECK(hora__world_ring_broadcast(c, g->fusion, bytes, op->root));
  hora__gpu_phase(op, NULL);
  if (!root) {
    hora__gpu_phase(op, "MEMCPY_OUT_FUSION_BUFFER");
    HORA_CHECK(hora__gpu_pack(c, g, op->out, op->n, g->fusion, false));
    HORA_CHECK(hora__gpu_copied_out(g));
    hora__gpu_phase(op, NULL);
  }
  return HORA_SUCCESS;
}

int hora__gpu_staged_run(hora__comm *c, struct hora__gpu *g, const struct hora__coll_op *op) {
  if (op->kind == HORA_COLL_REDUCESCATTER) {
    return hora__gpu_staged_reducescatter(c, g, op);
  }
  if (op->kind == HORA_COLL_ALLGATHERV || op->kind == HORA_COLL_ALLTOALL) {
    return hora__gpu_staged_exchange(c, g, op);
  }
  if (op->kind == HORA_COLL_ALLGATHER) {
    size_t bytes = op->in[0].len;
    HORA_CHECK(hora__gpu_grow_stage(c, g, bytes * (size_t)(c->size + 1)));
    char *mine = (char *)g->stage + bytes * (size_t)c->size;
    hora__gpu_phase(op, "MEMCPY_DEVICE_TO_HOST");
    CUDA_CHECK(cudaMemcpyAsync(mine, op->in[0].base, bytes, cudaMemcpyDeviceToHost, g->stream));
    HORA_CHECK(hora__gpu_wait_stream(c, g));
    hora__gpu_phase(op, NULL);
    HORA_CHECK(hora__allgather(c, mine, bytes, g->stage));
    hora__gpu_phase(op, "MEMCPY_HOST_TO_DEVICE");
    CUDA_CHECK(cudaMemcpyAsync(op->out[0].base, g->stage, bytes * (size_t)c->size,
                               cudaMemcpyHostToDevice, g->stream));
    HORA_CHECK(hora__gpu_copied_out(g));
    hora__gpu_phase(op, NULL);
    return HORA_SUCCESS;
  }
  size_t bytes = total_len(op->out, op->n);
  if (op->kind == HORA_COLL_BROADCAST && direct_usable(c, g, bytes)) {
    return direct_broadcast(c, g, op, bytes);
  }
  HORA_CHECK(hora__gpu_grow_stage(c, g, bytes));
  bool fill = op->kind == HORA_COLL_ALLREDUCE || c->rank == op->root;
  if (fill) {
    hora__gpu_phase(op, "MEMCPY_DEVICE_TO_HOST");
    HORA_CHECK(hora__gpu_pack(c, g, op->kind == HORA_COLL_ALLREDUCE ? op->in : op->out, op->n,
                    (char *)g->stage_dev, true));
    HORA_CHECK(hora__gpu_wait_stream(c, g)); /* the host reduces what the GPU wrote */
    hora__gpu_phase(op, NULL);
  } else {
    /* The host writes the staging next: after the last copy out of it,
     * which may wait for a caller's stream (a stream-ordered request
     * completes when queued). */
    HORA_CHECK(hora__gpu_wait_event(c, g, g->unpacked));
  }
  struct hora__iov host = {g->stage, bytes};
  if (op->kind == HORA_COLL_ALLREDUCE) {
    HORA_CHECK(hora__allreduce(c, &host, 1, &host, 1, op->count, op->dtype, op->op, op->dtype,
                               op->opts));
  } else {
    HORA_CHECK(hora__broadcast(c, &host, 1, bytes, op->root, op->opts));
  }
  hora__gpu_phase(op, "MEMCPY_HOST_TO_DEVICE");
  HORA_CHECK(hora__gpu_pack(c, g, op->out, op->n, (char *)g->stage_dev, false));
  HORA_CHECK(hora__gpu_copied_out(g));
  hora__gpu_phase(op, NULL);
  return HORA_SUCCESS;
}

