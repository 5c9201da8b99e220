/* The choice between the kernel and the staged intra-host path: size
 * classes, the order of trials, and the decision by best time. */
#include "../../comm/path_tuner.h"
#include "../runner.h"

TEST(path_tuner_size_classes) {
  ASSERT(hora__path_tuner_class(0) == 0);
  ASSERT(hora__path_tuner_class(1) == 0);
  ASSERT(hora__path_tuner_class(65536) == 16);
  ASSERT(hora__path_tuner_class(131071) == 16);
  ASSERT(hora__path_tuner_class(131072) == 17);
  ASSERT(hora__path_tuner_class(SIZE_MAX) == HORA_PATH_TUNER_CLASSES - 1);
}

/* Feeds a class trials in the order the tuner asks for them, with the given
 * ns per byte on each path; returns the settled path and checks the trials. */
static enum hora__shm_path settle(struct hora__path_tuner *t, int cls, double kernel_ns,
                                  double staged_ns) {
  int asked[2] = {0, 0}, settled = 0;
  for (int i = 0; i < 2 * HORA_PATH_TUNER_TRIALS; i++) {
    enum hora__shm_path p = hora__path_tuner_next(t, cls);
    asked[p]++;
    size_t bytes = 1 << 20;
    double per = p == HORA_SHM_PATH_KERNEL ? kernel_ns : staged_ns;
    settled = hora__path_tuner_record(t, cls, p, bytes, (uint64_t)(per * (double)bytes));
    if (i < 2 * HORA_PATH_TUNER_TRIALS - 1 && settled) {
      return (enum hora__shm_path)-1;
    }
  }
  if (!settled || asked[0] != HORA_PATH_TUNER_TRIALS || asked[1] != HORA_PATH_TUNER_TRIALS) {
    return (enum hora__shm_path)-1;
  }
  return hora__path_tuner_next(t, cls);
}

TEST(path_tuner_tries_both_then_keeps_the_faster) {
  struct hora__path_tuner t = {0};
  ASSERT(hora__path_tuner_next(&t, 20) == HORA_SHM_PATH_KERNEL); /* untried: kernel first */
  ASSERT(settle(&t, 20, 0.30, 0.12) == HORA_SHM_PATH_STAGED);
  ASSERT(settle(&t, 21, 0.10, 0.12) == HORA_SHM_PATH_KERNEL);
  ASSERT(settle(&t, 22, 0.10, 0.10) == HORA_SHM_PATH_KERNEL); /* a tie keeps the kernel path */
  /* Settled classes ignore further records; other classes are untouched. */
  ASSERT(hora__path_tuner_record(&t, 20, HORA_SHM_PATH_STAGED, 1000, 1000000) == 0);
  ASSERT(hora__path_tuner_next(&t, 20) == HORA_SHM_PATH_STAGED);
  ASSERT(hora__path_tuner_next(&t, 23) == HORA_SHM_PATH_KERNEL);
  ASSERT(hora__path_tuner_record(&t, 23, HORA_SHM_PATH_KERNEL, 0, 5) == 0); /* no bytes: no trial */
  ASSERT(t.trials[HORA_SHM_PATH_KERNEL][23] == 0);
}

TEST(path_tuner_decides_by_best_time) {
  /* One slow staged trial (a late peer, a page fault) must not decide. */
  struct hora__path_tuner t = {0};
  const int cls = 24;
  const double kernel[] = {0.20, 0.21, 0.22}, staged[] = {5.0, 0.10, 0.11};
  int ki = 0, si = 0;
  for (int i = 0; i < 2 * HORA_PATH_TUNER_TRIALS; i++) {
    enum hora__shm_path p = hora__path_tuner_next(&t, cls);
    double per = p == HORA_SHM_PATH_KERNEL ? kernel[ki++] : staged[si++];
    hora__path_tuner_record(&t, cls, p, 1000, (uint64_t)(per * 1000));
  }
  ASSERT(ki == HORA_PATH_TUNER_TRIALS && si == HORA_PATH_TUNER_TRIALS);
  ASSERT(hora__path_tuner_next(&t, cls) == HORA_SHM_PATH_STAGED);
}
