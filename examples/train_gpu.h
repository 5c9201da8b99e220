/* The example trainer's math on a CUDA GPU (train_gpu.cu): cuBLAS for the
 * matrix products, small kernels for the rest, on one stream. The model's
 * buffers (struct model in train.c) then hold device pointers, and the
 * gradient allreduces take them directly, ordered on that stream. */
#ifndef HORA_EXAMPLES_TRAIN_GPU_H
#define HORA_EXAMPLES_TRAIN_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "hora.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Picks the GPU of the local rank, creates the stream and cuBLAS handle.
 * Returns 0, or -1 with a message in `why`. */
int gpu_setup(int local_rank, char *why, size_t why_len);
void gpu_teardown(void);
/* Device copies of host arrays; free with gpu_free. */
float *gpu_upload(const float *host, size_t n);
float *gpu_zeros(size_t n);
void gpu_download(float *host, const float *dev, size_t n);
void gpu_copy_in(float *dev, const float *host, size_t n);
void gpu_free(void *dev);
/* Waits for everything queued on the trainer's stream. */
void gpu_sync(void);

/* out[n x cols] = in[n x rows] w[rows x cols] + b, then relu when asked
 * (row-major, as in train.c). */
void gpu_dense_forward(const float *in, const float *w, const float *b, float *out, int n, int rows,
                       int cols, int relu);
/* Softmax cross-entropy of logits[n x 10] against labels (host array of n);
 * delta = d loss / d logits (divided by n). Returns the mean loss and sets
 * *correct to the number of right answers. */
double gpu_softmax_xent(const float *logits, const uint8_t *labels, int n, float *delta,
                        int *correct);
/* gw += s * in^T d; gb += s * colsum(d); then, when din is not NULL,
 * din = (d w^T) masked where in <= 0 (the relu of the layer below). */
void gpu_dense_backward(const float *in, const float *d, const float *w, float *gw, float *gb,
                        float *din, int n, int rows, int cols, float s);
/* v = mu v + g; p -= eta v; g = 0. */
void gpu_sgd(float *p, float *v, float *g, size_t n, float eta, float mu);
/* hora_allreduce_async_stream on the trainer's stream. */
int gpu_allreduce_async(const char *name, float *buf, size_t count,
                        const hora_allreduce_options *opts, hora_request **req);

#ifdef __cplusplus
}
#endif

#endif
