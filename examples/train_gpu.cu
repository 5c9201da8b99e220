/* The example trainer's math on a CUDA GPU; see train_gpu.h. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "hora_cuda.h"
#include "train_gpu.h"

static cudaStream_t stream;
static cublasHandle_t blas;
static uint8_t *labels_dev;
static float *loss_dev;
static int *correct_dev;
static int scratch_n;

static void check(cudaError_t e, const char *what) {
  if (e != cudaSuccess) {
    fprintf(stderr, "train: %s: %s\n", what, cudaGetErrorString(e));
    hora_abort(cudaGetErrorString(e));
    exit(1);
  }
}

static void check_blas(cublasStatus_t s, const char *what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "train: %s: cuBLAS status %d\n", what, (int)s);
    hora_abort("cuBLAS failed");
    exit(1);
  }
}

extern "C" int gpu_setup(int local_rank, char *why, size_t why_len) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    snprintf(why, why_len, "no GPU visible (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return -1;
  }
  check(cudaSetDevice(local_rank % count), "cudaSetDevice");
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check_blas(cublasCreate(&blas), "cublasCreate");
  check_blas(cublasSetStream(blas, stream), "cublasSetStream");
  return 0;
}

extern "C" void gpu_teardown(void) {
  cudaStreamSynchronize(stream);
  cudaFree(labels_dev);
  cudaFree(loss_dev);
  cudaFree(correct_dev);
  cublasDestroy(blas);
  cudaStreamDestroy(stream);
}

extern "C" float *gpu_upload(const float *host, size_t n) {
  float *d = NULL;
  check(cudaMalloc((void **)&d, (n ? n : 1) * sizeof(float)), "cudaMalloc");
  check(cudaMemcpy(d, host, n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  return d;
}

extern "C" float *gpu_zeros(size_t n) {
  float *d = NULL;
  check(cudaMalloc((void **)&d, (n ? n : 1) * sizeof(float)), "cudaMalloc");
  check(cudaMemset(d, 0, n * sizeof(float)), "cudaMemset");
  return d;
}

extern "C" void gpu_download(float *host, const float *dev, size_t n) {
  check(cudaMemcpyAsync(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost, stream), "download");
  check(cudaStreamSynchronize(stream), "download");
}

extern "C" void gpu_copy_in(float *dev, const float *host, size_t n) {
  check(cudaMemcpyAsync(dev, host, n * sizeof(float), cudaMemcpyHostToDevice, stream), "upload");
  check(cudaStreamSynchronize(stream), "upload"); /* host buffer is reused at once */
}

extern "C" void gpu_free(void *dev) { cudaFree(dev); }

extern "C" void gpu_sync(void) { check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); }

static unsigned blocks(size_t n) { return (unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096); }

__global__ void bias_relu(float *out, const float *b, int n, int cols, int relu) {
  size_t total = (size_t)n * cols;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    float v = out[i] + b[i % cols];
    out[i] = relu && v < 0 ? 0 : v;
  }
}

/* Row-major X[r x c] is column-major X^T: every product below is written
 * for column-major cuBLAS on the transposes. */
extern "C" void gpu_dense_forward(const float *in, const float *w, const float *b, float *out,
                                  int n, int rows, int cols, int relu) {
  const float one = 1, zero = 0;
  /* out^T (cols x n) = w^T (cols x rows) in^T (rows x n) */
  check_blas(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, cols, n, rows, &one, w, cols, in, rows,
                         &zero, out, cols),
             "forward sgemm");
  bias_relu<<<blocks((size_t)n * cols), 256, 0, stream>>>(out, b, n, cols, relu);
  check(cudaGetLastError(), "bias_relu");
}

__global__ void softmax_xent_kernel(const float *z, const uint8_t *y, int n, float *delta,
                                    float *loss, int *correct) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  const float *zi = z + (size_t)i * 10;
  float *di = delta + (size_t)i * 10;
  float mx = zi[0];
  int arg = 0;
  for (int c = 1; c < 10; c++) {
    if (zi[c] > mx) {
      mx = zi[c];
      arg = c;
    }
  }
  double sum = 0;
  for (int c = 0; c < 10; c++) {
    di[c] = expf(zi[c] - mx);
    sum += di[c];
  }
  loss[i] = (float)(-(double)(zi[y[i]] - mx) + log(sum));
  correct[i] = arg == y[i];
  for (int c = 0; c < 10; c++) {
    di[c] = (float)(di[c] / sum) / (float)n;
  }
  di[y[i]] -= 1.0f / (float)n;
}

extern "C" double gpu_softmax_xent(const float *logits, const uint8_t *labels, int n,
                                   float *delta, int *correct) {
  if (n > scratch_n) {
    cudaFree(labels_dev);
    cudaFree(loss_dev);
    cudaFree(correct_dev);
    check(cudaMalloc((void **)&labels_dev, (size_t)n), "cudaMalloc");
    check(cudaMalloc((void **)&loss_dev, (size_t)n * sizeof(float)), "cudaMalloc");
    check(cudaMalloc((void **)&correct_dev, (size_t)n * sizeof(int)), "cudaMalloc");
    scratch_n = n;
  }
  check(cudaMemcpyAsync(labels_dev, labels, (size_t)n, cudaMemcpyHostToDevice, stream), "labels");
  softmax_xent_kernel<<<(n + 127) / 128, 128, 0, stream>>>(logits, labels_dev, n, delta, loss_dev,
                                                          correct_dev);
  check(cudaGetLastError(), "softmax_xent");
  float *loss = (float *)malloc((size_t)n * sizeof(float));
  int *ok = (int *)malloc((size_t)n * sizeof(int));
  check(cudaMemcpyAsync(loss, loss_dev, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost, stream),
        "loss");
  check(cudaMemcpyAsync(ok, correct_dev, (size_t)n * sizeof(int), cudaMemcpyDeviceToHost, stream),
        "correct");
  check(cudaStreamSynchronize(stream), "softmax_xent");
  double total = 0;
  int right = 0;
  for (int i = 0; i < n; i++) {
    total += loss[i];
    right += ok[i];
  }
  free(loss);
  free(ok);
  if (correct) {
    *correct = right;
  }
  return total / n;
}

__global__ void bias_grad(const float *d, float *gb, int n, int cols, float s) {
  int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= cols) {
    return;
  }
  float acc = 0;
  for (int i = 0; i < n; i++) {
    acc += d[(size_t)i * cols + o];
  }
  gb[o] += s * acc;
}

__global__ void relu_mask(float *din, const float *in, size_t total) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    if (in[i] <= 0) {
      din[i] = 0;
    }
  }
}

extern "C" void gpu_dense_backward(const float *in, const float *d, const float *w, float *gw,
                                   float *gb, float *din, int n, int rows, int cols, float s) {
  const float one = 1, zero = 0;
  /* gw^T (cols x rows) += s d^T (cols x n) in (n x rows) */
  check_blas(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, cols, rows, n, &s, d, cols, in, rows, &one,
                         gw, cols),
             "weight-gradient sgemm");
  bias_grad<<<(cols + 127) / 128, 128, 0, stream>>>(d, gb, n, cols, s);
  check(cudaGetLastError(), "bias_grad");
  if (din) {
    /* din^T (rows x n) = w (rows x cols) d^T (cols x n) */
    check_blas(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, w, cols, d, cols,
                           &zero, din, rows),
               "input-gradient sgemm");
    relu_mask<<<blocks((size_t)n * rows), 256, 0, stream>>>(din, in, (size_t)n * rows);
    check(cudaGetLastError(), "relu_mask");
  }
}

__global__ void sgd_kernel(float *p, float *v, float *g, size_t n, float eta, float mu) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    v[i] = mu * v[i] + g[i];
    p[i] -= eta * v[i];
    g[i] = 0;
  }
}

extern "C" void gpu_sgd(float *p, float *v, float *g, size_t n, float eta, float mu) {
  sgd_kernel<<<blocks(n), 256, 0, stream>>>(p, v, g, n, eta, mu);
  check(cudaGetLastError(), "sgd");
}

extern "C" int gpu_allreduce_async(const char *name, float *buf, size_t count,
                                   const hora_allreduce_options *opts, hora_request **req) {
  return hora_allreduce_async_stream(name, buf, buf, count, HORA_FLOAT32, HORA_AVERAGE, opts,
                                     stream, req);
}
