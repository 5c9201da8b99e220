/* What the device data plane's files share: the coordinator's GPU state
 * and the helpers its collective paths use. Private to comm/gpu/. */
#ifndef HORA_GPU_PRIVATE_H
#define HORA_GPU_PRIVATE_H

#include <cuda.h> /* driver API types; its entry points come through cudart */
#include <cuda_runtime.h>

#include "comm/gpu/gpu.h"

#include "comm/gpu/gpu_kernels.h"
#if HORA_HAVE_NCCL
/* nccl.h declares some functions without prototypes. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#endif

#define CUDA_CHECK(call)                                                                     \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      return hora__error(HORA_ERR_SYSTEM, "%s: %s (%s)", #call, cudaGetErrorString(e_),      \
                         cudaGetErrorName(e_));                                              \
    }                                                                                        \
  } while (0)

struct hora__gpu {
  int device;
  cudaStream_t stream;
  cudaEvent_t finished;
  /* Recorded after each copy out of the staging or the fusion buffer: the
   * host and the NIC write them again only once it has happened. A
   * stream-ordered copy-out may still wait for the caller's stream when
   * its request completes. (Writes by the GPU itself are ordered by the
   * runtime stream, as is everything on the NCCL path.) */
  cudaEvent_t unpacked;
  bool use_nccl;
#if HORA_HAVE_NCCL
  ncclComm_t nccl;
#endif
  void *fusion; /* device */
  size_t fusion_bytes;
  void *fusion_reg; /* its GPUDirect RDMA registration */
  int direct;       /* GPUDirect for this fusion buffer: 0 untried, 1 yes, -1 no */
  void *stage, *stage_dev; /* pinned mapped host memory and its device alias */
  size_t stage_bytes;
  void *stage_reg; /* its RDMA registration (zero-copy transfers) */
  /* Descriptors of the batched copies, in pinned mapped memory the kernel
   * reads: used as a ring, so a pack never waits for the previous one. */
  struct hora__copy_desc *descs, *descs_dev;
  int descs_cap, descs_used;
};

/* gpu.c: buffers, descriptors and waits. */
int hora__gpu_grow_stage(hora__comm *c, struct hora__gpu *g, size_t need);
/* The device fusion buffer, in whole 2 MiB pages (what a dma-buf exports). */
int hora__gpu_grow_fusion(hora__comm *c, struct hora__gpu *g, size_t need);
int hora__gpu_take_descs(hora__comm *c, struct hora__gpu *g, int n);
int hora__gpu_wait_event(hora__comm *c, struct hora__gpu *g, cudaEvent_t ev);
int hora__gpu_wait_stream(hora__comm *c, struct hora__gpu *g);
int hora__gpu_copied_out(struct hora__gpu *g);

/* gpu_paths.c: the collective paths (NCCL; staged through host memory). */
int hora__gpu_elem_type(hora_dtype dt);
/* Copies list[i] to/from consecutive places of flat in one launch;
 * stand-ins (base NULL) are zeroed on the way in, skipped on the way out. */
int hora__gpu_pack(hora__comm *c, struct hora__gpu *g, const struct hora__iov *list, int n,
                   char *flat, bool in);
/* p[0..count) *= mul, then /= div (where div > 1), on the runtime stream. */
int hora__gpu_scale(struct hora__gpu *g, void *p, size_t count, hora_dtype dt, double mul, int div);
void hora__gpu_phase(const struct hora__coll_op *op, const char *name);
#if HORA_HAVE_NCCL
#define NCCL_CHECK(call)                                                                     \
  do {                                                                                       \
    ncclResult_t r_ = (call);                                                                \
    if (r_ != ncclSuccess) {                                                                 \
      return hora__error(HORA_ERR_SYSTEM, "%s: %s: %s", #call, ncclGetErrorString(r_),       \
                         ncclGetLastError(g->nccl));                                         \
    }                                                                                        \
  } while (0)
bool hora__gpu_nccl_reduces(hora_dtype dt);
ncclDataType_t hora__gpu_nccl_type(hora_dtype dt);
ncclRedOp_t hora__gpu_nccl_op(hora_dtype dt, hora_op op);
int hora__gpu_nccl_run(hora__comm *c, struct hora__gpu *g, const struct hora__coll_op *op);
#endif
int hora__gpu_staged_run(hora__comm *c, struct hora__gpu *g, const struct hora__coll_op *op);

/* gpu_exchange.c: reducescatter, allgatherv and alltoall, by NCCL or staged. */
#if HORA_HAVE_NCCL
int hora__gpu_nccl_reducescatter(hora__comm *c, struct hora__gpu *g,
                                 const struct hora__coll_op *op);
int hora__gpu_nccl_exchange(hora__comm *c, struct hora__gpu *g, const struct hora__coll_op *op);
#endif
int hora__gpu_staged_reducescatter(hora__comm *c, struct hora__gpu *g,
                                   const struct hora__coll_op *op);
int hora__gpu_staged_exchange(hora__comm *c, struct hora__gpu *g, const struct hora__coll_op *op);

#endif
