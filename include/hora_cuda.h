/* hora_cuda.h: collectives ordered on a caller's CUDA stream.
 *
 * Installed by builds with CUDA. The plain calls of hora.h already take
 * device buffers (the runtime tells them from host memory); there the
 * buffers must be ready when the call is made, and hora_wait returns once
 * the results are in device memory. The calls below instead follow stream
 * order, as PyTorch and Horovod do:
 *   - the operation starts only after the work already queued on `stream`
 *     when the call is made (an event on that stream);
 *   - hora_wait_stream(&req, stream) makes `stream` wait for the results
 *     without blocking the host beyond the operation being queued on the
 *     GPU; hora_wait and hora_test still work and wait for the results.
 * Stream 0 means the legacy default stream. */
#ifndef HORA_CUDA_H
#define HORA_CUDA_H

#include <cuda_runtime_api.h>

#include "hora.h"

#ifdef __cplusplus
extern "C" {
#endif

HORA_EXTERN int hora_allreduce_async_stream(const char *name, const void *sendbuf, void *recvbuf,
                                            size_t count, hora_dtype dtype, hora_op op,
                                            const hora_allreduce_options *opts,
                                            cudaStream_t stream, hora_request **req);
HORA_EXTERN int hora_broadcast_async_stream(const char *name, void *buf, size_t count,
                                            hora_dtype dtype, int root, cudaStream_t stream,
                                            hora_request **req);
HORA_EXTERN int hora_allgather_async_stream(const char *name, const void *sendbuf, size_t count,
                                            hora_dtype dtype, void *recvbuf, cudaStream_t stream,
                                            hora_request **req);
/* The reducescatter of hora_reducescatter_async_ex (hora.h), stream-ordered. */
HORA_EXTERN int hora_reducescatter_async_stream(const char *name, const void *sendbuf,
                                                void *recvbuf, size_t count, hora_dtype dtype,
                                                hora_op op, const hora_allreduce_options *opts,
                                                cudaStream_t stream, hora_request **req);
/* Makes `stream` wait for *req's results, frees it and sets *req to NULL.
 * Returns the operation's result as far as the host knows it: failures on
 * the GPU after that surface in later calls. */
HORA_EXTERN int hora_wait_stream(hora_request **req, cudaStream_t stream);

/* The stream-ordered broadcast and allgather with a shape (hora_op_options, hora.h). */
HORA_EXTERN int hora_broadcast_async_stream_ex(const char *name, void *buf, size_t count,
                                               hora_dtype dtype, int root,
                                               const hora_op_options *opts, cudaStream_t stream,
                                               hora_request **req);
HORA_EXTERN int hora_allgather_async_stream_ex(const char *name, const void *sendbuf,
                                               size_t count, hora_dtype dtype, void *recvbuf,
                                               const hora_op_options *opts, cudaStream_t stream,
                                               hora_request **req);

#ifdef __cplusplus
}
#endif

#endif
