/* A program that owns MPI: hora_init must use it as it is, hora_finalize
 * must leave it running, and hora can start again on top of it. */
#include "mpitest.h"

static void hora_on_user_mpi(void) {
  MT_CHECK(hora_initialized() == 1, "not initialized");
  int x = mt_rank + 1, s = 0;
  MT_OK(hora_allreduce("sum", &x, &s, 1, HORA_INT32, HORA_SUM));
  MT_CHECK(s == mt_size * (mt_size + 1) / 2, "sum %d", s);
}

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  mt_init();
  mt_run("user_mpi/hora_on_user_mpi", hora_on_user_mpi);
  int fin = hora_finalize();
  /* MPI must still work after hora_finalize. */
  int ok = fin == HORA_SUCCESS, all_ok = 0;
  int finalized = 1;
  MPI_Finalized(&finalized);
  ok = ok && !finalized;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (mt_rank == 0) {
    printf("%s user_mpi/finalize_leaves_mpi_running\n", all_ok ? "PASS" : "FAIL");
  }
  /* And hora starts again on the same MPI. */
  mt_init();
  mt_run("user_mpi/init_again", hora_on_user_mpi);
  int failures = mt_total_failures() + !all_ok;
  MT_OK(hora_finalize());
  MPI_Finalize();
  return failures ? 1 : 0;
}
