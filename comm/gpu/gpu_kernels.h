/* C interface of gpu_kernels.cu (compiled by nvcc). */
#ifndef HORA_COMM_GPU_KERNELS_H
#define HORA_COMM_GPU_KERNELS_H

#include <cuda_runtime.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One piece of a batched copy. Either side may be device memory or mapped
 * pinned host memory (the staged path packs straight into host memory). */
struct hora__copy_desc {
  const void *src;
  void *dst;
  size_t bytes;
};

/* Element types the scale kernel knows. */
enum {
  HORA__GPU_F16,
  HORA__GPU_BF16,
  HORA__GPU_F32,
  HORA__GPU_F64,
  HORA__GPU_I32,
  HORA__GPU_I64,
  HORA__GPU_U8,
  HORA__GPU_I8,
  HORA__GPU_I16,
  HORA__GPU_BOOL
};

/* Copies every descriptor of device_descs[0..n) (an array in device or
 * mapped memory) in one launch; max_bytes sizes the grid. */
cudaError_t hora__launch_batched_copy(const struct hora__copy_desc *device_descs, int n,
                                      size_t max_bytes, cudaStream_t stream);
/* p[i] = p[i] * mul / div for count elements of the given type. Bool is
 * never scaled: for it, every nonzero byte becomes 1 (mul and div unused). */
cudaError_t hora__launch_scale(void *p, size_t count, int dtype, double mul, double div,
                               cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
