/* A program that owns MPI: hora_init must use it as it is, hora_finalize
 * must leave it running, and hora can start again on top of it, many
 * times, even while another thread keeps submitting. */
#include <pthread.h>
#include <time.h>

#include "mpitest.h"

static void hora_on_user_mpi(void) {
  MT_CHECK(hora_initialized() == 1, "not initialized");
  int x = mt_rank + 1, s = 0;
  MT_OK(hora_allreduce("sum", &x, &s, 1, HORA_INT32, HORA_SUM));
  MT_CHECK(s == mt_size * (mt_size + 1) / 2, "sum %d", s);
}

struct submitter {
  int round, unexpected, last_rc;
  char last_msg[256];
};

/* Submits allreduces until the runtime is gone; every result must be one
 * that a finalize racing with it can give. */
static void *submit_until_finalized(void *arg) {
  struct submitter *s = arg;
  for (int k = 0;; k++) {
    char name[48];
    snprintf(name, sizeof(name), "race/%d/%d", s->round, k);
    int x = 1, y = 0;
    int rc = hora_allreduce(name, &x, &y, 1, HORA_INT32, HORA_SUM);
    if (rc == HORA_SUCCESS) {
      continue;
    }
    if (rc != HORA_ERR_ABORTED && rc != HORA_ERR_INVALID_USAGE) {
      s->unexpected++;
      s->last_rc = rc;
      snprintf(s->last_msg, sizeof(s->last_msg), "%s", hora_last_error());
      return NULL; /* every later call fails at once too */
    }
    if (!hora_initialized()) {
      return NULL;
    }
    /* Shutting down, not yet finalized: no busy loop meanwhile. */
    struct timespec pause = {0, 100000};
    nanosleep(&pause, NULL);
  }
}

/* Rounds of submit_racing_finalize: "rounds=200" on the command line for
 * a longer hunt; the suite's 50 per rank count take about 5 s at np=4. */
static int rounds = 50;

/* hora_finalize while another thread submits: a rank whose connection to
 * rank 0 had closed at the end of the job sent its next request on it
 * (a NULL connection) and crashed; ranks whose peers closed after the end
 * reported them lost. Rounds of init, submit, finalize. */
static void submit_racing_finalize(void) {
  int bad = 0;
  for (int round = 0; round < rounds && !bad; round++) {
    if (round > 0) {
      mt_init();
    }
    struct submitter s = {.round = round};
    pthread_t t;
    if (pthread_create(&t, NULL, submit_until_finalized, &s) != 0) {
      mt_fail(__FILE__, __LINE__, "pthread_create");
      break;
    }
    /* Finalize at a different point of the submitter's work each round. */
    struct timespec pause = {0, (long)(mt_hash((uint64_t)(round * 64 + mt_rank)) % 2000) * 1000};
    nanosleep(&pause, NULL);
    int rc = hora_finalize();
    pthread_join(t, NULL);
    MT_CHECK(rc == HORA_SUCCESS, "round %d: hora_finalize: %s: %s", round, hora_strerror(rc),
             hora_last_error());
    MT_CHECK(s.unexpected == 0, "round %d: %d submissions failed with %s: %s", round,
             s.unexpected, hora_strerror(s.last_rc), s.last_msg);
    bad = rc != HORA_SUCCESS || s.unexpected;
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  }
  mt_init();
}

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  for (int i = 1; i < argc; i++) {
    if (strncmp(argv[i], "rounds=", 7) == 0) {
      rounds = atoi(argv[i] + 7);
    }
  }
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
  mt_run("user_mpi/submit_racing_finalize", submit_racing_finalize);
  int failures = mt_total_failures() + !all_ok;
  MT_OK(hora_finalize());
  MPI_Finalize();
  return failures ? 1 : 0;
}
