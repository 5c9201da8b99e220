/* Writes a timeline (HORA_TIMELINE=argv[1]) from a small workload: fused
 * allreduces, a lone allreduce, a broadcast and an allgather. With
 * argv[2] == "die", rank 0 is killed by SIGKILL in the middle of the job
 * instead of finalizing, to show the file stays valid JSON. With "full",
 * rank 0 may write only 64 bytes to files (RLIMIT_FSIZE): the timeline
 * must stop with a warning and still parse.
 * tests/timeline/check-timeline.sh runs it and parses the file. */
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include "mpitest.h"

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: test_timeline PATH finalize|die|full\n");
    return 2;
  }
  setenv("HORA_TIMELINE", argv[1], 1);
  bool die = strcmp(argv[2], "die") == 0;
  mt_init();
  if (strcmp(argv[2], "full") == 0 && mt_rank == 0) {
    struct rlimit lim;
    getrlimit(RLIMIT_FSIZE, &lim);
    lim.rlim_cur = 64; /* every flush is cut short */
    signal(SIGXFSZ, SIG_IGN); /* writes past the limit fail with EFBIG instead */
    setrlimit(RLIMIT_FSIZE, &lim);
  }
  enum { N = 8 };
  float g[N][64];
  for (int step = 0; step < 3; step++) {
    hora_request *r[N];
    for (int k = N - 1; k >= 0; k--) {
      for (int i = 0; i < 64; i++) {
        g[k][i] = (float)mt_rank;
      }
      char name[32];
      snprintf(name, sizeof(name), "tl/grad.%d", k);
      MT_OK(hora_allreduce_async(name, g[k], g[k], 64, HORA_FLOAT32, HORA_SUM, &r[k]));
    }
    for (int k = 0; k < N; k++) {
      MT_OK(hora_wait(&r[k]));
    }
    MT_OK(hora_allreduce("tl/lone", g[0], g[0], 64, HORA_FLOAT32, HORA_MAX));
    MT_OK(hora_broadcast("tl/bcast", g[1], 64, HORA_FLOAT32, 0));
    float *all = malloc(sizeof(float) * 64 * (size_t)mt_size);
    MT_OK(hora_allgather("tl/gather", g[2], 64, HORA_FLOAT32, all));
    free(all);
    if (die && step == 1) {
      usleep(200000); /* the coordinator goes idle and flushes */
      MPI_Barrier(MPI_COMM_WORLD);
      if (mt_rank == 0) {
        kill(getpid(), SIGKILL);
      }
      sleep(30); /* the launcher tears the others down */
    }
  }
  int failures = mt_total_failures();
  MT_OK(hora_finalize());
  if (mt_rank == 0) {
    printf("%s timeline/workload\n", failures ? "FAIL" : "PASS");
  }
  return failures ? 1 : 0;
}
