/* embed: the smallest data-parallel loop on hora's C API.
 *
 * Each rank owns a copy of a tiny linear model y = w.x and its own shard of
 * a synthetic dataset. Every step it computes a gradient, averages it over
 * all ranks with a named async allreduce, and steps. Ranks hold different
 * amounts of data, so the ones that run out first call hora_join and keep
 * serving the others' allreduces with zeros.
 *
 *   mpirun -np 4 examples/embed
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "hora.h"

#define DIM 8
#define CHECK(call)                                                                          \
  do {                                                                                       \
    int rc_ = (call);                                                                        \
    if (rc_ != HORA_SUCCESS) {                                                               \
      fprintf(stderr, "rank %d: %s failed: %s (%s)\n", hora_rank(), #call,                    \
              hora_strerror(rc_), hora_last_error());                                        \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

int main(void) {
  CHECK(hora_init());
  int rank = hora_rank(), size = hora_size();

  /* Every rank starts from different weights; rank 0's win. */
  float w[DIM];
  srand(1234 + (unsigned)rank);
  for (int i = 0; i < DIM; i++) {
    w[i] = (float)rand() / (float)RAND_MAX;
  }
  CHECK(hora_broadcast("weights", w, DIM, HORA_FLOAT32, 0));

  /* The true model is w*[i] = i / DIM. Rank r has 300 + 25 r samples. */
  const int samples = 300 + 25 * rank;
  const float lr = 0.5f;
  int step = 0;
  for (int s = 0; s < samples; s++, step++) {
    float x[DIM], grad[DIM], y = 0, pred = 0;
    for (int i = 0; i < DIM; i++) {
      x[i] = (float)((s * 7 + i * 3 + rank) % 11) / 11.0f;
      y += x[i] * (float)i / DIM;
      pred += x[i] * w[i];
    }
    for (int i = 0; i < DIM; i++) {
      grad[i] = (pred - y) * x[i];
    }
    hora_request *req;
    CHECK(hora_allreduce_async("grad", grad, grad, DIM, HORA_FLOAT32, HORA_AVERAGE, &req));
    CHECK(hora_wait(&req));
    for (int i = 0; i < DIM; i++) {
      w[i] -= lr * grad[i];
    }
  }
  /* Out of data: serve the others until all are done. Joined ranks stopped
   * stepping, so the last rank to join has the final weights. */
  int last = -1;
  CHECK(hora_join(&last));
  CHECK(hora_broadcast("weights/final", w, DIM, HORA_FLOAT32, last));

  /* Same weights everywhere: check with an allreduce of the max difference. */
  float mine[DIM], maxw[DIM];
  for (int i = 0; i < DIM; i++) {
    mine[i] = w[i];
  }
  CHECK(hora_allreduce("check", mine, maxw, DIM, HORA_FLOAT32, HORA_MAX));
  float err = 0, drift = 0;
  for (int i = 0; i < DIM; i++) {
    err = fmaxf(err, fabsf(w[i] - (float)i / DIM));
    drift = fmaxf(drift, fabsf(maxw[i] - w[i]));
  }
  if (rank == 0) {
    printf("embed: %d ranks, rank 0 ran %d steps, last to join: rank %d\n", size, step, last);
    printf("embed: max |w - w*| = %.4f, max difference between ranks = %g\n", err, drift);
  }
  CHECK(hora_finalize());
  return drift == 0.0f && err < 0.05f ? 0 : 1;
}
