/* Job-wide settings that differ between ranks: launched MPMD, e.g.
 *   mpirun -np 1 -x HORA_VERIFY=1 test_job_settings 'HORA_VERIFY differs: rank 0 has 1, rank 1 has 0'
 *          : -np 1 test_job_settings '...'
 * every rank's hora_init must fail with HORA_ERR_INVALID_ARG and a message
 * holding the expected text. With the argument `accept` the ranks' values
 * are the same (perhaps spelled differently) and hora_init must succeed.
 *
 * Where hora_init succeeds, the ranks run a few cached, fused, large and
 * rooted collectives and check the results, so that a runtime which let
 * the difference through shows what it would have done (hang, or compute
 * wrong values) as well as the wrong acceptance itself. Rank 0 prints one
 * line: PASS or FAIL settings/<name>. */
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hora.h"

static int failures;

#define CHECK(cond, ...)                                                                     \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      fprintf(stderr, "  rank %d: ", rank);                                                  \
      fprintf(stderr, __VA_ARGS__);                                                          \
      fprintf(stderr, "\n");                                                                 \
      failures++;                                                                            \
    }                                                                                        \
  } while (0)

static int rank, size;

/* Cached and fused allreduces (8 small tensors, 5 steps), one larger than a
 * shared-memory step, a broadcast and an allgather, all checked. */
static void workload(void) {
  enum { T = 8, N = 1000, BIG = 3 << 20 };
  float *x[T];
  for (int step = 0; step < 5; step++) {
    hora_request *req[T];
    for (int t = 0; t < T; t++) {
      x[t] = malloc(N * sizeof(float));
      for (int i = 0; i < N; i++) {
        x[t][i] = (float)(rank + t + i % 7);
      }
      char name[32];
      snprintf(name, sizeof(name), "grad.%d", t);
      int rc = hora_allreduce_async(name, x[t], x[t], N, HORA_FLOAT32, HORA_SUM, &req[t]);
      CHECK(rc == HORA_SUCCESS, "allreduce %s: %s", name, hora_last_error());
      if (rc != HORA_SUCCESS) {
        req[t] = NULL;
      }
    }
    for (int t = 0; t < T; t++) {
      if (req[t]) {
        int rc = hora_wait(&req[t]);
        CHECK(rc == HORA_SUCCESS, "wait grad.%d: %s", t, hora_last_error());
      }
      double want_base = (double)size * (size - 1) / 2 + (double)size * t;
      int bad = 0;
      for (int i = 0; i < N; i++) {
        bad += x[t][i] != (float)(want_base + (double)size * (i % 7));
      }
      CHECK(bad == 0, "step %d: grad.%d has %d wrong values", step, t, bad);
      free(x[t]);
    }
  }
  float *big = malloc((size_t)BIG * sizeof(float));
  for (size_t i = 0; i < BIG; i++) {
    big[i] = (float)(i % 1000);
  }
  CHECK(hora_allreduce("big", big, big, BIG, HORA_FLOAT32, HORA_SUM) == HORA_SUCCESS, "big: %s",
        hora_last_error());
  int bad = 0;
  for (size_t i = 0; i < BIG; i++) {
    bad += big[i] != (float)(size * (int)(i % 1000));
  }
  CHECK(bad == 0, "big allreduce: %d wrong values", bad);
  int64_t v[4] = {rank, rank, rank, rank};
  CHECK(hora_broadcast("root", v, 4, HORA_INT64, 0) == HORA_SUCCESS, "broadcast: %s",
        hora_last_error());
  CHECK(v[0] == 0 && v[3] == 0, "broadcast: got %lld", (long long)v[0]);
  int32_t *all = malloc(sizeof(int32_t) * (size_t)size);
  int32_t me = rank * 3;
  CHECK(hora_allgather("ranks", &me, 1, HORA_INT32, all) == HORA_SUCCESS, "allgather: %s",
        hora_last_error());
  for (int r = 0; r < size; r++) {
    CHECK(all[r] == r * 3, "allgather: slot %d has %d", r, all[r]);
  }
  free(all);
  free(big);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_job_settings EXPECTED-MESSAGE | accept [TEST-NAME]\n");
    return 2;
  }
  const char *expect = argv[1];
  bool accept = strcmp(expect, "accept") == 0;
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int rc = hora_init();
  if (accept) {
    CHECK(rc == HORA_SUCCESS, "hora_init failed although the settings agree: %s: %s",
          hora_strerror(rc), hora_last_error());
  } else if (rc == HORA_SUCCESS) {
    CHECK(0, "hora_init accepted settings that differ (expected: %s)", expect);
  } else {
    CHECK(rc == HORA_ERR_INVALID_ARG, "hora_init returned %s, expected HORA_ERR_INVALID_ARG: %s",
          hora_strerror(rc), hora_last_error());
    CHECK(strstr(hora_last_error(), expect) != NULL, "message '%s' lacks '%s'",
          hora_last_error(), expect);
  }
  if (rc == HORA_SUCCESS) {
    workload();
    int frc = hora_finalize();
    CHECK(frc == HORA_SUCCESS, "hora_finalize: %s", hora_last_error());
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    const char *name = argc > 2 ? argv[2] : expect;
    printf("%s settings/%s\n", total ? "FAIL" : "PASS", name);
    fflush(stdout);
  }
  MPI_Finalize();
  return total ? 1 : 0;
}
