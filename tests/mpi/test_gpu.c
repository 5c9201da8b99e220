/* Device buffers end to end (CUDA builds). Every dtype x op, several
 * tensors at once so they fuse on the GPU, compared with the same
 * allreduce on host buffers; broadcast and allgather; prescale/postscale;
 * a joined rank; the stream-ordered calls of hora_cuda.h; and the errors
 * (host on one rank, device on another; host sendbuf with device recvbuf).
 * Without a GPU every test reports SKIP with the reason. */
#include <cuda_runtime.h>
#include <stdlib.h>

#include "hora_cuda.h"
#include "mpitest.h"

static void *dev_copy(const void *host, size_t bytes) {
  void *d = NULL;
  if (cudaMalloc(&d, bytes ? bytes : 1) != cudaSuccess) {
    mt_fail(__FILE__, __LINE__, "cudaMalloc of %zu bytes failed", bytes);
    return NULL;
  }
  cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
  return d;
}

static void pattern(hora_dtype dt, void *p, size_t n, int seed) {
  for (size_t i = 0; i < n; i++) {
    int v = (int)((seed * 7 + i * 3) % 11) - 5;
    if (dt == HORA_UINT8) {
      v += 5;
    }
    switch (dt) {
      case HORA_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; break;
      case HORA_INT8: ((int8_t *)p)[i] = (int8_t)v; break;
      case HORA_INT32: ((int32_t *)p)[i] = v; break;
      case HORA_INT64: ((int64_t *)p)[i] = v; break;
      case HORA_FLOAT16: ((uint16_t *)p)[i] = v == 0 ? 0 : (uint16_t)(v > 0 ? 0x3c00 : 0xbc00); break;
      case HORA_BFLOAT16: ((uint16_t *)p)[i] = v == 0 ? 0 : (uint16_t)(v > 0 ? 0x3f80 : 0xbf80); break;
      case HORA_FLOAT32: ((float *)p)[i] = (float)v; break;
      case HORA_FLOAT64: ((double *)p)[i] = v; break;
    }
  }
}

/* Device results must equal the host path's, bit for bit. */
static void every_dtype_and_op_fused(void) {
  enum { T = 4, N = 1000 };
  for (int dt = HORA_UINT8; dt <= HORA_FLOAT64; dt++) {
    size_t es = hora_dtype_size((hora_dtype)dt);
    for (int op = HORA_SUM; op <= HORA_PRODUCT; op++) {
      void *host[T], *dev[T], *back = malloc(N * es);
      hora_request *rh[T], *rd[T];
      for (int t = 0; t < T; t++) {
        host[t] = malloc(N * es);
        pattern((hora_dtype)dt, host[t], N, mt_rank + t);
        dev[t] = dev_copy(host[t], N * es);
      }
      for (int t = 0; t < T; t++) {
        char hn[64], dn[64];
        snprintf(hn, sizeof(hn), "h/%d/%d/%d", dt, op, t);
        snprintf(dn, sizeof(dn), "d/%d/%d/%d", dt, op, t);
        MT_OK(hora_allreduce_async(dn, dev[t], dev[t], N, (hora_dtype)dt, (hora_op)op, &rd[t]));
        MT_OK(hora_allreduce_async(hn, host[t], host[t], N, (hora_dtype)dt, (hora_op)op, &rh[t]));
      }
      for (int t = 0; t < T; t++) {
        MT_OK(hora_wait(&rd[t]));
        MT_OK(hora_wait(&rh[t]));
        cudaMemcpy(back, dev[t], N * es, cudaMemcpyDeviceToHost);
        MT_CHECK(memcmp(back, host[t], N * es) == 0, "%s %s tensor %d: device result differs",
                 hora_dtype_name((hora_dtype)dt), hora_op_name((hora_op)op), t);
        cudaFree(dev[t]);
        free(host[t]);
      }
      free(back);
    }
  }
}

static void large_scaled_and_out_of_place(void) {
  const size_t n = (size_t)16 << 20; /* 64 MiB of float32 */
  float *h = malloc(n * sizeof(float)), *back = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) {
    h[i] = (float)((mt_rank + i) % 64);
  }
  float *src = dev_copy(h, n * sizeof(float)), *dst = NULL;
  cudaMalloc((void **)&dst, n * sizeof(float));
  hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
  o.prescale = 2.0;
  o.postscale = 0.5;
  hora_request *r;
  MT_OK(hora_allreduce_async_ex("big/avg", src, dst, n, HORA_FLOAT32, HORA_AVERAGE, &o, &r));
  MT_OK(hora_wait(&r));
  cudaMemcpy(back, dst, n * sizeof(float), cudaMemcpyDeviceToHost);
  int bad = 0;
  for (size_t i = 0; i < n && bad < 3; i += 4099) {
    double s = 0;
    for (int q = 0; q < mt_size; q++) {
      s += (double)((q + i) % 64);
    }
    float want = (float)(s * 2.0 / mt_size * 0.5);
    if (back[i] != want) {
      mt_fail(__FILE__, __LINE__, "element %zu: %g, expected %g", i, (double)back[i], (double)want);
      bad++;
    }
  }
  /* The input is untouched by the prescale. */
  cudaMemcpy(back, src, n * sizeof(float), cudaMemcpyDeviceToHost);
  MT_CHECK(memcmp(back, h, n * sizeof(float)) == 0, "the prescale changed the caller's sendbuf");
  cudaFree(src);
  cudaFree(dst);
  free(h);
  free(back);
}

static void broadcast_and_allgather(void) {
  enum { N = 5000 };
  int32_t h[N], back[N];
  for (int i = 0; i < N; i++) {
    h[i] = mt_rank * 100000 + i;
  }
  int32_t *d = dev_copy(h, sizeof(h));
  MT_OK(hora_broadcast("d/bcast", d, N, HORA_INT32, mt_size - 1));
  cudaMemcpy(back, d, sizeof(back), cudaMemcpyDeviceToHost);
  MT_CHECK(back[N - 1] == (mt_size - 1) * 100000 + N - 1, "broadcast: %d", back[N - 1]);
  int32_t *all = NULL;
  cudaMalloc((void **)&all, sizeof(h) * (size_t)mt_size);
  int32_t *mine = dev_copy(h, sizeof(h));
  MT_OK(hora_allgather("d/gather", mine, N, HORA_INT32, all));
  int32_t *hall = malloc(sizeof(h) * (size_t)mt_size);
  cudaMemcpy(hall, all, sizeof(h) * (size_t)mt_size, cudaMemcpyDeviceToHost);
  for (int q = 0; q < mt_size; q++) {
    MT_CHECK(hall[q * N + 7] == q * 100000 + 7, "allgather block %d: %d", q, hall[q * N + 7]);
  }
  free(hall);
  cudaFree(all);
  cudaFree(mine);
  cudaFree(d);
}

static void joined_rank_stands_in_on_the_gpu(void) {
  enum { N = 777 };
  float h[N], back[N];
  for (int i = 0; i < N; i++) {
    h[i] = 1.0f;
  }
  float *d = dev_copy(h, sizeof(h));
  if (mt_rank == mt_size - 1 && mt_size > 1) {
    MT_OK(hora_join(NULL));
  } else {
    MT_OK(hora_allreduce("d/after-join", d, d, N, HORA_FLOAT32, HORA_SUM));
    cudaMemcpy(back, d, sizeof(back), cudaMemcpyDeviceToHost);
    float want = (float)(mt_size > 1 ? mt_size - 1 : 1);
    MT_CHECK(back[N - 1] == want, "after a join: %g, expected %g", (double)back[N - 1], (double)want);
    MT_OK(hora_join(NULL));
  }
  cudaFree(d);
}

static void stream_ordered(void) {
  enum { N = 1 << 20 };
  float *h = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float));
  for (int i = 0; i < N; i++) {
    h[i] = (float)(mt_rank + 1);
  }
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  float *d = NULL;
  cudaMalloc((void **)&d, N * sizeof(float));
  /* Queued, not done: the allreduce must start after this copy. */
  cudaMemcpyAsync(d, h, N * sizeof(float), cudaMemcpyHostToDevice, s);
  hora_request *r;
  MT_OK(hora_allreduce_async_stream("d/stream", d, d, N, HORA_FLOAT32, HORA_SUM, NULL, s, &r));
  MT_OK(hora_wait_stream(&r, s));
  MT_CHECK(r == NULL, "hora_wait_stream did not clear the request");
  cudaMemcpyAsync(back, d, N * sizeof(float), cudaMemcpyDeviceToHost, s);
  cudaStreamSynchronize(s);
  float want = (float)(mt_size * (mt_size + 1) / 2);
  MT_CHECK(back[0] == want && back[N - 1] == want, "stream-ordered: %g, expected %g",
           (double)back[0], (double)want);
  /* Host buffers with a stream are refused. */
  MT_FAILS(hora_allreduce_async_stream("d/host", h, h, N, HORA_FLOAT32, HORA_SUM, NULL, s, &r),
           HORA_ERR_INVALID_ARG, "host memory");
  cudaStreamDestroy(s);
  cudaFree(d);
  free(h);
  free(back);
}

static void host_and_device_never_mix(void) {
  float h[16] = {0};
  float *d = dev_copy(h, sizeof(h));
  MT_FAILS(hora_allreduce("d/mixed", h, d, 16, HORA_FLOAT32, HORA_SUM), HORA_ERR_INVALID_ARG,
           "device memory but");
  if (mt_size > 1) {
    void *buf = mt_rank == 0 ? (void *)d : (void *)h;
    MT_FAILS(hora_allreduce("d/host-vs-device", buf, buf, 16, HORA_FLOAT32, HORA_SUM),
             HORA_ERR_MISMATCH, "GPU");
  }
  cudaFree(d);
}

int main(int argc, char **argv) {
  mt_setenv_args(argc, argv);
  mt_init();
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  const char *tests[] = {"gpu/every_dtype_and_op_fused", "gpu/large_scaled_and_out_of_place",
                         "gpu/broadcast_and_allgather", "gpu/joined_rank_stands_in_on_the_gpu",
                         "gpu/stream_ordered", "gpu/host_and_device_never_mix"};
  if (e != cudaSuccess || devices == 0) {
    char why[200];
    snprintf(why, sizeof(why), "no GPU visible (cudaGetDeviceCount: %s)",
             e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
      mt_skip(tests[i], why);
    }
  } else {
    cudaSetDevice(mt_rank % devices);
    mt_run(tests[0], every_dtype_and_op_fused);
    mt_run(tests[1], large_scaled_and_out_of_place);
    mt_run(tests[2], broadcast_and_allgather);
    mt_run(tests[3], joined_rank_stands_in_on_the_gpu);
    mt_run(tests[4], stream_ordered);
    mt_run(tests[5], host_and_device_never_mix);
  }
  int failures = mt_total_failures();
  MT_OK(hora_finalize());
  return failures ? 1 : 0;
}
