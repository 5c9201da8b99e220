/* The device data plane: collectives on CUDA device buffers.
 *
 * Two paths, chosen once per job (the first device operation, on every rank
 * alike):
 *   - NCCL, on the runtime's own stream, when the build has NCCL, every
 *     rank has a GPU of its own and HORA_GPU_TRANSPORT allows it;
 *   - staged: tensors are packed into pinned, mapped host memory by the
 *     batched copy kernel, reduced by the host data plane (shm, TCP, RDMA)
 *     and unpacked again. Used without NCCL, with HORA_GPU_TRANSPORT=host,
 *     and when ranks share a GPU (NCCL forbids two ranks on one device);
 *     and, in an NCCL job, for int16 allreduces (NCCL has no int16).
 * Fusion happens on the GPU: one kernel launch packs any number of tensors
 * into the fusion buffer, one unpacks them. Host and device tensors never
 * share a batch (the negotiation keeps them apart).
 *
 * Caller threads use only hora__gpu_present, hora__gpu_is_device and the
 * event helpers; everything else runs on the coordinator thread. */
#ifndef HORA_COMM_GPU_H
#define HORA_COMM_GPU_H

#include <stdbool.h>

#include "comm/coll/collectives.h"

struct hora__gpu;

/* Whether this process can see a GPU (decided once, at first use; false in
 * a build without CUDA). */
bool hora__gpu_present(void);
/* *device = p is device (or managed) memory. Errors only for CUDA failures. */
int hora__gpu_is_device(const void *p, bool *device);
/* Records a new event on a caller's stream (an opaque cudaStream_t). */
int hora__gpu_record_event(void *stream, void **event);
/* Makes a caller's stream wait for an event, without blocking the host. */
int hora__gpu_stream_wait_event(void *stream, void *event);
/* *happened = the event has happened (never blocks). */
int hora__gpu_event_query(void *event, bool *happened);
int hora__gpu_event_create(void **event);
void hora__gpu_event_destroy(void *event);


/* Runs op; sets up the GPU state in *gpu on first use. */
/* Sets up the GPU state in *gpu now (HORA_GPU_INIT=eager), if it is not
 * yet; every rank calls it together, and a failure on one rank fails it on
 * all. */
int hora__gpu_setup(hora__comm *comm, struct hora__gpu **gpu);
/* NCCL's asynchronous errors, for the coordinator's periodic service: work
 * queued for stream-ordered requests is watched even while nothing waits
 * for it. Aborts NCCL on an error. */
int hora__gpu_check(struct hora__gpu *gpu);
/* The job has failed: aborts NCCL, so that kernels waiting for a lost peer
 * end, and refuses later device operations. */
void hora__gpu_abort(struct hora__gpu *gpu);
/* Which path the job chose ("nccl" or "staged"), or NULL before the first
 * device operation. */
const char *hora__gpu_path(const struct hora__gpu *gpu);
/* failed: after a fatal error (see gpu.c: nothing that may wait for the
 * GPU). */
void hora__gpu_destroy(hora__comm *comm, struct hora__gpu *gpu, bool failed);

/* For the GPU check: the batched copy kernel against cudaMemcpy
 * device-to-device on n tensors of `bytes` each; GB/s of both. */
int hora__gpu_copy_bandwidth(size_t bytes, int n, int reps, double *kernel_gbs, double *memcpy_gbs);

#endif
