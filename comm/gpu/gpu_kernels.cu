/* Kernels of the device data plane: the batched copy that packs tensors
 * into the fusion buffer and unpacks them again (one launch for any number
 * of tensors), and in-place scaling for prescale/postscale/average. */
#include <climits>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include <type_traits>

#include "comm/gpu/gpu_kernels.h"

/* One block row per descriptor (blockIdx.y); the blocks of a row stride
 * over its bytes. 16-byte accesses when source, destination and length
 * allow it, bytes otherwise. */
__global__ void hora_batched_copy_kernel(const struct hora__copy_desc *descs) {
  const struct hora__copy_desc d = descs[blockIdx.y];
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if ((((uintptr_t)d.src | (uintptr_t)d.dst) & 15) == 0) {
    const size_t nvec = d.bytes / 16;
    const uint4 *s = (const uint4 *)d.src;
    uint4 *t = (uint4 *)d.dst;
    for (size_t k = i; k < nvec; k += stride) {
      t[k] = s[k];
    }
    for (size_t k = nvec * 16 + i; k < d.bytes; k += stride) {
      ((char *)d.dst)[k] = ((const char *)d.src)[k];
    }
  } else {
    for (size_t k = i; k < d.bytes; k += stride) {
      ((char *)d.dst)[k] = ((const char *)d.src)[k];
    }
  }
}

/* As the host's hora__scale (Horovod's ScaleBuffer): one factor,
 * mul / div (AVERAGE's postscale over the size); float64 in double, the
 * other floating types in float by the factor rounded to float, integers in
 * double and cast back toward zero (saturating where a cast is undefined). */
__device__ inline double scale_factor(double mul, double div) {
  return div > 1 ? mul / div : mul;
}
template <typename T>
__device__ inline typename std::enable_if<!std::is_integral<T>::value, T>::type scaled(
    T x, double mul, double div) {
  return (T)((float)scale_factor(mul, div) * (float)x);
}
template <>
__device__ inline double scaled<double>(double x, double mul, double div) {
  return scale_factor(mul, div) * x;
}
template <typename T>
__device__ inline typename std::enable_if<std::is_integral<T>::value, T>::type scaled(
    T x, double mul, double div) {
  double v = scale_factor(mul, div) * (double)x;
  long long r = v != v ? 0
                : v >= 9223372036854775807.0  ? LLONG_MAX
                : v <= -9223372036854775808.0 ? LLONG_MIN
                                              : (long long)v;
  return (T)r;
}
template <>
__device__ inline __half scaled<__half>(__half x, double mul, double div) {
  return __float2half((float)scale_factor(mul, div) * __half2float(x));
}
template <>
__device__ inline __nv_bfloat16 scaled<__nv_bfloat16>(__nv_bfloat16 x, double mul, double div) {
  return __float2bfloat16((float)scale_factor(mul, div) * __bfloat162float(x));
}

template <typename T>
__global__ void hora_scale_kernel(T *p, size_t n, double mul, double div) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    p[i] = scaled<T>(p[i], mul, div);
  }
}

/* Bool results are 0 or 1; NCCL's byte max and min keep a 2 a 2. */
__global__ void hora_bool_kernel(uint8_t *p, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    p[i] = p[i] != 0;
  }
}

static unsigned blocks_for(size_t work, unsigned threads) {
  size_t b = (work + threads - 1) / threads;
  return (unsigned)(b < 1 ? 1 : b > 1024 ? 1024 : b);
}

extern "C" cudaError_t hora__launch_batched_copy(const struct hora__copy_desc *device_descs, int n,
                                                 size_t max_bytes, cudaStream_t stream) {
  if (n <= 0) {
    return cudaSuccess;
  }
  const unsigned threads = 256;
  /* Rows of up to 65535 descriptors per launch (the grid's y limit). */
  for (int first = 0; first < n; first += 65535) {
    int rows = n - first < 65535 ? n - first : 65535;
    dim3 grid(blocks_for(max_bytes / 16 + 1, threads), (unsigned)rows);
    hora_batched_copy_kernel<<<grid, threads, 0, stream>>>(device_descs + first);
  }
  return cudaGetLastError();
}

extern "C" cudaError_t hora__launch_scale(void *p, size_t count, int dtype, double mul, double div,
                                          cudaStream_t stream) {
  const unsigned threads = 256, blocks = blocks_for(count, threads);
  switch (dtype) {
#define HORA_SCALE_CASE(code, T)                                                             \
  case code:                                                                                 \
    hora_scale_kernel<T><<<blocks, threads, 0, stream>>>((T *)p, count, mul, div);           \
    break;
    HORA_SCALE_CASE(HORA__GPU_F16, __half)
    HORA_SCALE_CASE(HORA__GPU_BF16, __nv_bfloat16)
    HORA_SCALE_CASE(HORA__GPU_F32, float)
    HORA_SCALE_CASE(HORA__GPU_F64, double)
    HORA_SCALE_CASE(HORA__GPU_I32, int32_t)
    HORA_SCALE_CASE(HORA__GPU_I64, int64_t)
    HORA_SCALE_CASE(HORA__GPU_U8, uint8_t)
    HORA_SCALE_CASE(HORA__GPU_I8, int8_t)
    HORA_SCALE_CASE(HORA__GPU_I16, int16_t)
#undef HORA_SCALE_CASE
    case HORA__GPU_BOOL:
      hora_bool_kernel<<<blocks, threads, 0, stream>>>((uint8_t *)p, count);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
