/* hora-bench-startup: how long a job takes to start, from the top of main
 * to the first completed allreduce.
 *
 * Each rank reads both clocks first thing in main, calls hora_init (which
 * runs MPI_Init itself on the MPI path, so that is counted; this program
 * never touches MPI), runs one 4-byte allreduce and checks its sum, then
 * prints one line:
 *
 *   rank R/N init S first_allreduce S start_realtime T done_realtime T
 *
 * (S: seconds since the top of main, CLOCK_MONOTONIC; T: CLOCK_REALTIME,
 * seconds since the epoch, for comparison with a launcher's own clock).
 * A second allreduce (HORA_MAX, not timed) gathers the slowest rank's
 * figures, and rank 0 prints
 *
 *   startup np=N init_max=S first_allreduce_max=S start_realtime_min=T
 *           start_realtime_max=T done_realtime_max=T                     (one line)
 *
 * done_realtime_max - start_realtime_max is the time from the last rank's
 * start to the last rank's completion: the rendezvous without the skew of
 * the launch.
 * The bootstrap is whatever hora_init picks from the environment
 * (HORA_BOOTSTRAP and friends), so the same binary serves every path.
 *
 *   mpirun -np 4 hora-bench-startup
 *   HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS=127.0.0.1:29500 HORA_RANK=r HORA_SIZE=4 hora-bench-startup
 *
 * scripts/bench-startup.sh runs both, and PyTorch's gloo beside them.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "hora.h"

static double seconds(clockid_t clock) {
  struct timespec t;
  clock_gettime(clock, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int fail(const char *what, int rc) {
  fprintf(stderr, "hora-bench-startup: %s: %s (%s)\n", what, hora_strerror(rc), hora_last_error());
  return 1;
}

int main(void) {
  double start = seconds(CLOCK_MONOTONIC);
  double start_real = seconds(CLOCK_REALTIME);

  int rc = hora_init();
  if (rc != HORA_SUCCESS) {
    return fail("hora_init", rc);
  }
  double t_init = seconds(CLOCK_MONOTONIC) - start;

  int32_t one = 1, sum = 0;
  rc = hora_allreduce("bench_startup.first", &one, &sum, 1, HORA_INT32, HORA_SUM);
  double t_first = seconds(CLOCK_MONOTONIC) - start;
  double done_real = seconds(CLOCK_REALTIME);
  if (rc != HORA_SUCCESS) {
    hora_finalize();
    return fail("first allreduce", rc);
  }
  int rank = hora_rank(), size = hora_size();
  if (sum != size) {
    fprintf(stderr, "hora-bench-startup: rank %d: allreduce gave %d, expected %d\n", rank,
            (int)sum, size);
    hora_finalize();
    return 1;
  }
  printf("rank %d/%d init %.6f first_allreduce %.6f start_realtime %.6f done_realtime %.6f\n",
         rank, size, t_init, t_first, start_real, done_real);
  fflush(stdout);

  /* The slowest rank's figures; the earliest start goes in negated. */
  double mine[5] = {t_init, t_first, -start_real, start_real, done_real}, worst[5];
  rc = hora_allreduce("bench_startup.max", mine, worst, 5, HORA_FLOAT64, HORA_MAX);
  if (rc != HORA_SUCCESS) {
    hora_finalize();
    return fail("collecting the maxima", rc);
  }
  if (rank == 0) {
    printf("startup np=%d init_max=%.6f first_allreduce_max=%.6f start_realtime_min=%.6f "
           "start_realtime_max=%.6f done_realtime_max=%.6f\n",
           size, worst[0], worst[1], -worst[2], worst[3], worst[4]);
    fflush(stdout);
  }
  rc = hora_finalize();
  return rc == HORA_SUCCESS ? 0 : fail("hora_finalize", rc);
}
