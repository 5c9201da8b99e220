/* Writes a timeline (HORA_TIMELINE=argv[1]) from a small workload: fused
 * allreduces, a lone allreduce, a broadcast and an allgather. With
 * argv[2] == "die", rank 0 is killed by SIGKILL in the middle of the job
 * instead of finalizing, to show the file stays valid JSON. With "full",
 * rank 0 may write only 64 bytes to files (RLIMIT_FSIZE): the timeline
 * must stop with a warning and still parse. With "runtime", HORA_TIMELINE
 * is not set: hora_start_timeline writes argv[1] (with cycle marks) from
 * while an operation is half submitted until hora_stop_timeline while
 * another is, then argv[1].2, then argv[1].3 replaces it without a stop.
 * With "horovod", as the default but HOROVOD_TIMELINE=argv[1] names the file.
 * With "report", 12 steps with 20 ms of idle "compute" between them, and
 * rank 0 prints its hora_get_stats as one "STATS name=value ..." line:
 * tests/reports/check-reports.sh compares hora-report's figures with it.
 * tests/timeline/check-timeline.sh runs it and parses the files. */
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include "mpitest.h"

static const char *path;

static void sum(const char *name) {
  float v[16] = {0};
  MT_OK(hora_allreduce(name, v, v, 16, HORA_FLOAT32, HORA_SUM));
}

/* Rank 0 submits `name` and does `then` while the others have not yet:
 * the operation is half negotiated meanwhile. */
static void half_submitted(const char *name, int (*then)(void)) {
  float v[16] = {0};
  hora_request *r = NULL;
  if (mt_rank == 0) {
    MT_OK(hora_allreduce_async(name, v, v, 16, HORA_FLOAT32, HORA_SUM, &r));
    usleep(50000); /* the coordinator has it (a NEGOTIATE phase is open) */
  }
  MT_OK(then());
  MPI_Barrier(MPI_COMM_WORLD);
  if (mt_rank != 0) {
    MT_OK(hora_allreduce_async(name, v, v, 16, HORA_FLOAT32, HORA_SUM, &r));
  }
  MT_OK(hora_wait(&r));
}

static int start_first(void) {
  /* Only rank 0 writes: the others' path must stay unmade. */
  char mine[512];
  snprintf(mine, sizeof(mine), "%s.rank%d", path, mt_rank);
  return hora_start_timeline(mt_rank == 0 ? path : mine, 1);
}

static void workload(bool die, int steps, int idle_us);

static void runtime_start_stop(void) {
  MT_FAILS(hora_start_timeline(NULL, 0), HORA_ERR_INVALID_ARG, "path is NULL");
  MT_OK(hora_stop_timeline()); /* none is being written: nothing to do */
  half_submitted("tl/inflight", start_first);
  workload(false, 3, 0);
  half_submitted("tl/open", hora_stop_timeline);
  sum("tl/between"); /* written nowhere */
  char second[512], third[512];
  snprintf(second, sizeof(second), "%s.2", path);
  snprintf(third, sizeof(third), "%s.3", path);
  MT_OK(hora_start_timeline(second, 0));
  /* Rank 0 negotiates an operation from the first rank's request on: the
   * others may submit only once rank 0 has switched files. */
  MT_OK(hora_barrier());
  for (int i = 0; i < 3; i++) {
    sum("tl/second");
  }
  MT_OK(hora_start_timeline(third, 0)); /* replaces the second file */
  MT_OK(hora_barrier());
  sum("tl/third");
  MT_OK(hora_stop_timeline());
  MT_OK(hora_stop_timeline());
  if (mt_rank == 0) {
    MT_FAILS(hora_start_timeline("/nonexistent-dir/x.json", 0), HORA_ERR_SYSTEM,
             "hora_start_timeline: cannot create '/nonexistent-dir/x.json'");
  }
  char mine[512];
  snprintf(mine, sizeof(mine), "%s.rank%d", path, mt_rank);
  MT_CHECK(mt_rank == 0 || access(mine, F_OK) != 0, "rank %d wrote %s", mt_rank, mine);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: test_timeline PATH finalize|horovod|die|full|runtime|report\n");
    return 2;
  }
  path = argv[1];
  if (strcmp(argv[2], "runtime") == 0) {
    /* Before hora_init, both calls are misuse. */
    int before = hora_start_timeline(path, 1), before_stop = hora_stop_timeline();
    mt_init();
    MT_CHECK(before == HORA_ERR_INVALID_USAGE && before_stop == HORA_ERR_INVALID_USAGE,
             "before hora_init: %s and %s", hora_strerror(before), hora_strerror(before_stop));
    mt_run("timeline/runtime_start_stop", runtime_start_stop);
    int failures = mt_total_failures();
    MT_OK(hora_finalize());
    int after = hora_start_timeline(path, 0);
    if (after != HORA_ERR_INVALID_USAGE) {
      fprintf(stderr, "after hora_finalize: hora_start_timeline returned %s\n",
              hora_strerror(after));
      failures++;
    }
    return failures ? 1 : 0;
  }
  /* "horovod": as "finalize", through Horovod's name of the setting. */
  setenv(strcmp(argv[2], "horovod") == 0 ? "HOROVOD_TIMELINE" : "HORA_TIMELINE", argv[1], 1);
  bool die = strcmp(argv[2], "die") == 0;
  mt_init();
  if (strcmp(argv[2], "full") == 0 && mt_rank == 0) {
    struct rlimit lim;
    getrlimit(RLIMIT_FSIZE, &lim);
    lim.rlim_cur = 64; /* every flush is cut short */
    signal(SIGXFSZ, SIG_IGN); /* writes past the limit fail with EFBIG instead */
    setrlimit(RLIMIT_FSIZE, &lim);
  }
  bool report = strcmp(argv[2], "report") == 0;
  workload(die, report ? 12 : 3, report ? 20000 : 0);
  if (report && mt_rank == 0) {
    hora_stats st = {.struct_size = sizeof(st)};
    MT_OK(hora_get_stats(&st));
    printf("STATS operations=%llu allreduces=%llu broadcasts=%llu allgathers=%llu bytes=%llu "
           "fused_batches=%llu fused_tensors=%llu\n",
           (unsigned long long)st.operations, (unsigned long long)st.allreduces,
           (unsigned long long)st.broadcasts, (unsigned long long)st.allgathers,
           (unsigned long long)st.bytes, (unsigned long long)st.fused_batches,
           (unsigned long long)st.fused_tensors);
  }
  int failures = mt_total_failures();
  MT_OK(hora_finalize());
  if (mt_rank == 0) {
    printf("%s timeline/workload\n", failures ? "FAIL" : "PASS");
  }
  return failures ? 1 : 0;
}

/* Fused allreduces, a lone allreduce, a broadcast and an allgather, each
 * step after idle_us; with "die", rank 0 is killed after the second step. */
static void workload(bool die, int steps, int idle_us) {
  enum { N = 8 };
  float g[N][64];
  for (int step = 0; step < steps; step++) {
    if (idle_us) {
      usleep((useconds_t)idle_us);
    }
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
}
