/* One process of a job dies by SIGKILL; do the launcher's other processes
 * live on? For tests/launch/check-elastic-launch.sh (no hora in it: the
 * launcher alone decides). The rank comes from MPI (`mpi`: MPI_Init, as
 * hora under mpirun) or from the launcher's variables (`env`: no MPI, as
 * hora with HORA_BOOTSTRAP=tcp). Rank VICTIM kills itself DIE_MS after its
 * start; the others print "alive R" after LIVE_MS and exit 0.
 * usage: lose_one mpi|env VICTIM DIE_MS LIVE_MS */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#if HORA_HAVE_MPI
#include <mpi.h>
#endif

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static int rank_from_env(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK",
                                     "HORA_RANK"};
  for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
    const char *v = getenv(vars[i]);
    if (v && v[0]) {
      return atoi(v);
    }
  }
  return -1;
}

int main(int argc, char **argv) {
  if (argc != 5 || (strcmp(argv[1], "mpi") != 0 && strcmp(argv[1], "env") != 0)) {
    fprintf(stderr, "usage: lose_one mpi|env VICTIM DIE_MS LIVE_MS\n");
    return 2;
  }
  bool use_mpi = strcmp(argv[1], "mpi") == 0;
  int victim = atoi(argv[2]);
  long die_ms = atol(argv[3]), live_ms = atol(argv[4]);
  int rank = -1;
  if (use_mpi) {
#if HORA_HAVE_MPI
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    /* Every process past MPI's start-up before one dies, as in a job. */
    MPI_Barrier(MPI_COMM_WORLD);
#else
    fprintf(stderr, "lose_one: built without MPI\n");
    return 2;
#endif
  } else {
    rank = rank_from_env();
  }
  if (rank == victim) {
    sleep_ms(die_ms);
    raise(SIGKILL);
  }
  sleep_ms(live_ms);
  printf("alive %d\n", rank);
  fflush(stdout);
  /* No MPI_Finalize: a peer is gone, and hora_finalize leaves MPI
   * unfinalized then, as its fence could wait for the lost one. */
  return 0;
}
