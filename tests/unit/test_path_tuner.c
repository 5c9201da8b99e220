/* The choice between the kernel and the staged intra-host path: size
 * classes, the order of trials, and the decision by best time. */
#include "comm/shm/path_tuner.h"
#include "../runner.h"

TEST(path_tuner_size_classes) {
  ASSERT(hora__path_tuner_class(0) == 0);
  ASSERT(hora__path_tuner_class(1) == 0);
  ASSERT(hora__path_tuner_class(65536) == 16);
  ASSERT(hora__path_tuner_class(131071) == 16);
  ASSERT(hora__path_tuner_class(131072) == 17);
  ASSERT(hora__path_tuner_class(SIZE_MAX) == HORA_PATH_TUNER_CLASSES - 1);
}

/* Runs one class's trials as the shared-memory code does (choose, start,
 * record), op i costing ns_per_byte[path][i within its run]; returns the
 * settled path, or -1 if the order or the moment of settling was wrong. */
static int settle(struct hora__path_tuner *t, int cls, const double kernel[HORA_PATH_TUNER_RUN],
                  const double staged[HORA_PATH_TUNER_RUN]) {
  for (int i = 0; i < 2 * HORA_PATH_TUNER_RUN; i++) {
    enum hora__shm_path p = hora__path_tuner_next(t, cls);
    if (p != (i < HORA_PATH_TUNER_RUN ? HORA_SHM_PATH_KERNEL : HORA_SHM_PATH_STAGED)) {
      return -1; /* a run of kernel operations, then a run of staged ones */
    }
    hora__path_tuner_started(t, cls, p);
    const size_t bytes = 1 << 20;
    double per = p == HORA_SHM_PATH_KERNEL ? kernel[i] : staged[i - HORA_PATH_TUNER_RUN];
    int settled = hora__path_tuner_record(t, cls, p, bytes, (uint64_t)(per * (double)bytes));
    if (settled != (i == 2 * HORA_PATH_TUNER_RUN - 1)) {
      return -1;
    }
  }
  return (int)hora__path_tuner_next(t, cls);
}

TEST(path_tuner_runs_both_then_keeps_the_faster) {
  struct hora__path_tuner t = {0};
  const double slow[HORA_PATH_TUNER_RUN] = {0.30, 0.30, 0.30, 0.30};
  const double fast[HORA_PATH_TUNER_RUN] = {0.12, 0.12, 0.12, 0.12};
  ASSERT(hora__path_tuner_next(&t, 20) == HORA_SHM_PATH_KERNEL); /* untried: kernel first */
  ASSERT(settle(&t, 20, slow, fast) == HORA_SHM_PATH_STAGED);
  ASSERT(settle(&t, 21, fast, slow) == HORA_SHM_PATH_KERNEL);
  ASSERT(settle(&t, 22, fast, fast) == HORA_SHM_PATH_KERNEL); /* a tie keeps the kernel path */
  /* Settled classes ignore further records; other classes are untouched. */
  ASSERT(hora__path_tuner_record(&t, 20, HORA_SHM_PATH_STAGED, 1000, 1000000) == 0);
  ASSERT(hora__path_tuner_next(&t, 20) == HORA_SHM_PATH_STAGED);
  ASSERT(hora__path_tuner_next(&t, 23) == HORA_SHM_PATH_KERNEL);
  ASSERT(hora__path_tuner_record(&t, 23, HORA_SHM_PATH_KERNEL, 0, 5) == 0); /* no bytes: no trial */
  ASSERT(t.finished[HORA_SHM_PATH_KERNEL][23] == 0);
}

TEST(path_tuner_decides_by_best_time_after_warm_up) {
  struct hora__path_tuner t = {0};
  /* The kernel run's first operation (cold buffers) and one staged trial (a
   * late peer) are slow; neither may decide. */
  const double kernel[HORA_PATH_TUNER_RUN] = {9.0, 0.20, 0.21, 0.22};
  const double staged[HORA_PATH_TUNER_RUN] = {0.10, 5.0, 0.15, 0.16};
  ASSERT(settle(&t, 24, kernel, staged) == HORA_SHM_PATH_STAGED);
  /* A staged run whose only fast operation is its warm-up loses. */
  struct hora__path_tuner u = {0};
  const double warm_only[HORA_PATH_TUNER_RUN] = {0.01, 0.30, 0.30, 0.30};
  ASSERT(settle(&u, 24, kernel, warm_only) == HORA_SHM_PATH_KERNEL);
}

/* The choice for the next operation is made while this one still runs. */
TEST(path_tuner_counts_trials_in_flight) {
  struct hora__path_tuner t = {0};
  const int cls = 25;
  for (int i = 0; i < HORA_PATH_TUNER_RUN; i++) {
    ASSERT(hora__path_tuner_next(&t, cls) == HORA_SHM_PATH_KERNEL);
    hora__path_tuner_started(&t, cls, HORA_SHM_PATH_KERNEL);
  }
  /* The last kernel operation has begun, none has finished: staged next. */
  ASSERT(hora__path_tuner_next(&t, cls) == HORA_SHM_PATH_STAGED);
  for (int i = 0; i < HORA_PATH_TUNER_RUN; i++) {
    hora__path_tuner_record(&t, cls, HORA_SHM_PATH_KERNEL, 100, 100);
    hora__path_tuner_started(&t, cls, HORA_SHM_PATH_STAGED);
  }
  /* One staged operation never finished (it failed): staged again. */
  for (int i = 0; i < HORA_PATH_TUNER_RUN - 1; i++) {
    ASSERT(hora__path_tuner_record(&t, cls, HORA_SHM_PATH_STAGED, 100, 50) == 0);
  }
  ASSERT(hora__path_tuner_next(&t, cls) == HORA_SHM_PATH_STAGED);
  hora__path_tuner_started(&t, cls, HORA_SHM_PATH_STAGED);
  ASSERT(hora__path_tuner_record(&t, cls, HORA_SHM_PATH_STAGED, 100, 50) == 1);
  ASSERT(hora__path_tuner_next(&t, cls) == HORA_SHM_PATH_STAGED);
}
