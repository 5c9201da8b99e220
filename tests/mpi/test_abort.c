/* hora_abort: every other rank's pending and later calls fail with
 * HORA_ERR_ABORTED, promptly, with the reason in the message.
 * Argument: "first" (rank 0 aborts) or "last" (the last rank aborts). */
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

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  mt_init();
  aborter = argc > 1 && strcmp(argv[1], "last") == 0 ? mt_size - 1 : 0;
  mt_run(aborter == 0 ? "abort/by_rank_0" : "abort/by_last_rank", abort_reaches_everyone);
  int failures = mt_total_failures();
  MPI_Finalize();
  return failures ? 1 : 0;
}
