/* hora_cuda.h: the stream-ordered calls, wrapping api.c's submitters. */
#include "hora_cuda.h"

#include "runtime/runtime.h"

/* The runtime's "no stream" is NULL, which CUDA spells for the legacy
 * default stream; that one is named by its own handle here. */
static void *caller_stream(cudaStream_t s) { return s ? (void *)s : (void *)cudaStreamLegacy; }

HORA_EXTERN int hora_allreduce_async_stream(const char *name, const void *sendbuf, void *recvbuf,
                                            size_t count, hora_dtype dtype, hora_op op,
                                            const hora_allreduce_options *opts,
                                            cudaStream_t stream, hora_request **req) {
  return hora__allreduce_submit(name, sendbuf, recvbuf, count, dtype, op, opts,
                                caller_stream(stream), req);
}

HORA_EXTERN int hora_reducescatter_async_stream(const char *name, const void *sendbuf,
                                                void *recvbuf, size_t count, hora_dtype dtype,
                                                hora_op op, const hora_allreduce_options *opts,
                                                cudaStream_t stream, hora_request **req) {
  return hora__reducescatter_submit(name, sendbuf, recvbuf, count, dtype, op, opts,
                                    caller_stream(stream), req);
}

HORA_EXTERN int hora_broadcast_async_stream(const char *name, void *buf, size_t count,
                                            hora_dtype dtype, int root, cudaStream_t stream,
                                            hora_request **req) {
  return hora__broadcast_submit(name, buf, count, dtype, root, NULL, caller_stream(stream), req);
}

HORA_EXTERN int hora_allgather_async_stream(const char *name, const void *sendbuf, size_t count,
                                            hora_dtype dtype, void *recvbuf, cudaStream_t stream,
                                            hora_request **req) {
  return hora__allgather_submit(name, sendbuf, count, dtype, recvbuf, NULL, caller_stream(stream),
                                req);
}

HORA_EXTERN int hora_wait_stream(hora_request **req, cudaStream_t stream) {
  return hora__wait_stream(req, caller_stream(stream));
}

HORA_EXTERN int hora_broadcast_async_stream_ex(const char *name, void *buf, size_t count,
                                               hora_dtype dtype, int root,
                                               const hora_op_options *opts, cudaStream_t stream,
                                               hora_request **req) {
  return hora__broadcast_submit(name, buf, count, dtype, root, opts, caller_stream(stream), req);
}

HORA_EXTERN int hora_allgather_async_stream_ex(const char *name, const void *sendbuf,
                                               size_t count, hora_dtype dtype, void *recvbuf,
                                               const hora_op_options *opts, cudaStream_t stream,
                                               hora_request **req) {
  return hora__allgather_submit(name, sendbuf, count, dtype, recvbuf, opts, caller_stream(stream),
                                req);
}
