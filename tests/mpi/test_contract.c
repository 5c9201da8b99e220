/* A program written only against the public contract (API.md / <hora.h>):
 * no internal headers, no MPI. Built by the test suite both in the tree and
 * against an installed copy through `pkg-config hora`. */
#include <hora.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define EXPECT(cond, ...)                                                                    \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      fprintf(stderr, "  rank %d: ", hora_rank());                                           \
      fprintf(stderr, __VA_ARGS__);                                                          \
      fprintf(stderr, " (%s)\n", hora_last_error());                                         \
      failures++;                                                                            \
    }                                                                                        \
  } while (0)

int main(void) {
  if (hora_init() != HORA_SUCCESS) {
    /* Nothing else can work: say why and stop (rank and size are -1). */
    fprintf(stderr, "  rank %d: hora_init (%s)\n", hora_rank(), hora_last_error());
    printf("FAIL contract: hora_init failed\n");
    return 1;
  }
  int rank = hora_rank(), size = hora_size();
  EXPECT(size >= 1 && rank >= 0 && rank < size, "rank %d of %d", rank, size);
  EXPECT(hora_local_rank() >= 0 && hora_local_rank() < hora_local_size(), "local rank");
  EXPECT(hora_cross_rank() >= 0 && hora_cross_rank() < hora_cross_size(), "cross rank");

  /* Parameters from rank 0. */
  double params[64];
  for (int i = 0; i < 64; i++) {
    params[i] = rank == 0 ? i * 0.5 : -1;
  }
  EXPECT(hora_broadcast("params", params, 64, HORA_FLOAT64, 0) == HORA_SUCCESS, "broadcast");
  EXPECT(params[63] == 31.5, "broadcast value %g", params[63]);

  /* Gradients in reverse order, averaged. */
  enum { N = 10 };
  float grads[N][100];
  hora_request *reqs[N];
  for (int k = N - 1; k >= 0; k--) {
    for (int i = 0; i < 100; i++) {
      grads[k][i] = (float)(rank + k);
    }
    char name[16];
    snprintf(name, sizeof(name), "g%d", k);
    EXPECT(hora_allreduce_async(name, grads[k], grads[k], 100, HORA_FLOAT32, HORA_AVERAGE,
                                &reqs[k]) == HORA_SUCCESS, "allreduce_async");
  }
  for (int k = 0; k < N; k++) {
    EXPECT(hora_wait(&reqs[k]) == HORA_SUCCESS, "wait");
    float want = (float)k + (float)(size - 1) / 2.0f;
    EXPECT(grads[k][99] == want, "average %g, expected %g", grads[k][99], want);
  }

  /* Allgather of ranks. */
  int *all = malloc(sizeof(int) * (size_t)size);
  EXPECT(hora_allgather("ranks", &rank, 1, HORA_INT32, all) == HORA_SUCCESS, "allgather");
  for (int r = 0; r < size; r++) {
    EXPECT(all[r] == r, "allgather slot %d = %d", r, all[r]);
  }
  free(all);

  /* Uneven data, then join. */
  for (int s = 0; s < 3 + rank; s++) {
    long long one = 1, total = 0;
    EXPECT(hora_allreduce("uneven", &one, &total, 1, HORA_INT64, HORA_SUM) == HORA_SUCCESS,
           "uneven allreduce");
    EXPECT(total == size - (s < 3 ? 0 : s - 2), "step %d total %lld", s, total);
  }
  int last = -1;
  EXPECT(hora_join(&last) == HORA_SUCCESS && last == size - 1, "join last %d", last);
  EXPECT(hora_barrier() == HORA_SUCCESS, "barrier");

  /* Errors are codes with messages. */
  EXPECT(hora_allreduce(NULL, NULL, NULL, 5, HORA_FLOAT32, HORA_SUM) == HORA_ERR_INVALID_ARG,
         "NULL buffers");
  EXPECT(strlen(hora_last_error()) > 0, "empty message");

  /* Sum the failures of every rank. */
  int total = 0;
  EXPECT(hora_allreduce("failures", &failures, &total, 1, HORA_INT32, HORA_SUM) == HORA_SUCCESS,
         "failure count");
  if (rank == 0) {
    printf("%s contract/np%d\n", total == 0 && failures == 0 ? "PASS" : "FAIL", size);
  }
  EXPECT(hora_finalize() == HORA_SUCCESS, "finalize");
  return failures ? 1 : 0;
}
