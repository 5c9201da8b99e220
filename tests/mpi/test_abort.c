/* hora_abort: every other rank's pending and later calls fail with
 * HORA_ERR_ABORTED, promptly, with the reason in the message.
 * Argument: "first" (rank 0 aborts) or "last" (the last rank aborts), or
 * "during" (at least 3 ranks): rank 0 aborts while its engine is inside a
 * collective that waits on the last rank, which is stopped (SIGSTOP). */
#include <signal.h>
#include <unistd.h>

#include "mpitest.h"

static int aborter;

static void abort_reaches_everyone(void) {
  float x[4] = {1, 2, 3, 4};
  if (mt_rank == aborter) {
    MPI_Barrier(MPI_COMM_WORLD); /* the others have submitted "pending" */
    MT_OK(hora_abort("disk full on /scratch"));
  } else {
    hora_request *r;
    MT_OK(hora_allreduce_async("pending", x, x, 4, HORA_FLOAT32, HORA_SUM, &r));
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    MT_FAILS(hora_wait(&r), HORA_ERR_ABORTED, "disk full on /scratch");
    double dt = MPI_Wtime() - t0;
    MT_CHECK(dt < 5.0, "the abort took %.2f s to arrive", dt);
    char who[32];
    snprintf(who, sizeof(who), "rank %d", aborter);
    MT_CHECK(strstr(hora_last_error(), who) != NULL, "message does not name %s: %s", who,
             hora_last_error());
  }
  /* Later calls fail the same way, on every rank. */
  MT_FAILS(hora_allreduce("later", x, x, 4, HORA_FLOAT32, HORA_SUM), HORA_ERR_ABORTED, "disk full");
  MT_FAILS(hora_barrier(), HORA_ERR_ABORTED, "disk full");
  MT_FAILS(hora_finalize(), HORA_ERR_ABORTED, "disk full");
  MT_CHECK(hora_initialized() == 0, "still initialized after hora_finalize");
}

static void abort_during_a_collective(void) {
  int stopper = mt_size - 1;
  int *pids = malloc(sizeof(int) * (size_t)mt_size);
  int me = (int)getpid();
  MPI_Allgather(&me, 1, MPI_INT, pids, 1, MPI_INT, MPI_COMM_WORLD);
  size_t n = 16u << 20; /* 64 MiB: the ring takes long enough to be caught in */
  float *x = calloc(n, sizeof(float));
  hora_request *r;
  MT_OK(hora_allreduce_async("big", x, x, n, HORA_FLOAT32, HORA_SUM, &r));
  if (mt_rank == stopper) {
    usleep(10000); /* the collective has started, and is far from done */
    raise(SIGSTOP); /* until rank 0 continues it */
    int rc = hora_wait(&r);
    MT_CHECK(rc == HORA_ERR_ABORTED || rc == HORA_ERR_PEER_LOST, "stopped rank: %s",
             hora_strerror(rc));
  } else if (mt_rank == 0) {
    usleep(300000);
    double t0 = MPI_Wtime();
    MT_OK(hora_abort("abort while a collective runs"));
    double dt = MPI_Wtime() - t0;
    MT_CHECK(dt < 3.0, "hora_abort took %.2f s: the engine did not leave the collective", dt);
    kill(pids[stopper], SIGCONT);
    MT_FAILS(hora_wait(&r), HORA_ERR_ABORTED, "abort while a collective runs");
  } else {
    double t0 = MPI_Wtime();
    MT_FAILS(hora_wait(&r), HORA_ERR_ABORTED, "abort while a collective runs");
    double dt = MPI_Wtime() - t0;
    MT_CHECK(dt < 5.0, "the abort took %.2f s to arrive", dt);
  }
  MT_FAILS(hora_finalize(), HORA_ERR_ABORTED, "abort");
  free(x);
  free(pids);
}

int main(int argc, char **argv) {
  int provided;
  mt_setenv_args(argc, argv);
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  mt_init();
  if (argc > 1 && strcmp(argv[1], "during") == 0) {
    if (mt_size < 3) {
      mt_skip("abort/during_a_collective", "needs at least 3 ranks");
    } else {
      mt_run("abort/during_a_collective", abort_during_a_collective);
    }
    int failures = mt_total_failures();
    MPI_Finalize();
    return failures ? 1 : 0;
  }
  aborter = argc > 1 && strcmp(argv[1], "last") == 0 ? mt_size - 1 : 0;
  mt_run(aborter == 0 ? "abort/by_rank_0" : "abort/by_last_rank", abort_reaches_everyone);
  int failures = mt_total_failures();
  MPI_Finalize();
  return failures ? 1 : 0;
}
