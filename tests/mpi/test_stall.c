/* The stall inspector: the last rank never submits "stuck/op". After
 * HORA_STALL_CHECK_TIME_SECONDS=0.5 rank 0 logs a warning that names the
 * operation and the missing rank; after HORA_STALL_SHUTDOWN_TIME_SECONDS=2
 * the operation, and then the runtime, fail with HORA_ERR_TIMEOUT on every
 * rank, the silent one included. With the argument "cached", "stuck/op"
 * runs once everywhere first, so the stalled request waits in the cache,
 * where rank 0 does not see it until it is taken out. */
#include <stdlib.h>
#include <unistd.h>

#include "mpitest.h"

static char logdir[256];
static int cached;

static void stall_is_warned_then_shut_down(void) {
  int silent = mt_size - 1;
  float x[4] = {1, 2, 3, 4};
  if (cached) {
    MT_OK(hora_allreduce("stuck/op", x, x, 4, HORA_FLOAT32, HORA_SUM));
  }
  if (mt_rank == silent) {
    sleep(4); /* stuck: submits nothing, 2 s past the shutdown */
  } else {
    hora_request *r;
    MT_OK(hora_allreduce_async("stuck/op", x, x, 4, HORA_FLOAT32, HORA_SUM, &r));
    double t0 = MPI_Wtime();
    MT_FAILS(hora_wait(&r), HORA_ERR_TIMEOUT, "stuck/op");
    double dt = MPI_Wtime() - t0;
    MT_CHECK(dt > 1.5 && dt < 6.0, "timed out after %.1f s, expected about 2", dt);
    char who[32];
    snprintf(who, sizeof(who), "rank(s) %d", silent);
    MT_CHECK(strstr(hora_last_error(), who) != NULL, "message does not name %s: %s", who,
             hora_last_error());
  }
  /* Everyone, the silent rank too, now finds the runtime shut down. */
  MT_FAILS(hora_allreduce("after", x, x, 4, HORA_FLOAT32, HORA_SUM), HORA_ERR_TIMEOUT, "stalled");
  if (mt_rank == 0) {
    char path[300], line[4096];
    snprintf(path, sizeof(path), "%s/stall.0.log", logdir);
    FILE *f = fopen(path, "r");
    int warned = 0;
    while (f && fgets(line, sizeof(line), f)) {
      char want[64];
      snprintf(want, sizeof(want), "missing rank(s) %d", silent);
      if (strstr(line, "WARN") && strstr(line, "'stuck/op'") && strstr(line, want)) {
        warned = 1;
      }
    }
    if (f) {
      fclose(f);
    }
    MT_CHECK(warned, "rank 0's log %s has no stall warning naming rank %d", path, silent);
  }
  MT_FAILS(hora_finalize(), HORA_ERR_TIMEOUT, "stalled");
}

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  mt_shared_dir("hora-stall", logdir, sizeof(logdir));
  char pattern[300];
  snprintf(pattern, sizeof(pattern), "%s/stall.%%r.log", logdir);
  setenv("HORA_LOG_FILE", pattern, 1);
  setenv("HORA_STALL_CHECK_TIME_SECONDS", "0.5", 1);
  setenv("HORA_STALL_SHUTDOWN_TIME_SECONDS", "2", 1);
  cached = argc > 1 && strcmp(argv[argc - 1], "cached") == 0;
  mt_init();
  mt_run(cached ? "stall/cached_warned_then_shut_down" : "stall/warned_then_shut_down",
         stall_is_warned_then_shut_down);
  int failures = mt_total_failures();
  mt_remove_shared_dir(logdir);
  MPI_Finalize();
  return failures ? 1 : 0;
}
