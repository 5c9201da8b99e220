/* Per-size-class choice between the kernel and the staged intra-host path. */
#include "comm/shm/path_tuner.h"

int hora__path_tuner_class(size_t share) {
  int cls = 0;
  while (share > 1 && cls < HORA_PATH_TUNER_CLASSES - 1) {
    share >>= 1;
    cls++;
  }
  return cls;
}

static int valid(int cls) { return cls >= 0 && cls < HORA_PATH_TUNER_CLASSES; }

static int decided(const struct hora__path_tuner *t, int cls) {
  return t->finished[HORA_SHM_PATH_KERNEL][cls] >= HORA_PATH_TUNER_RUN &&
         t->finished[HORA_SHM_PATH_STAGED][cls] >= HORA_PATH_TUNER_RUN;
}

enum hora__shm_path hora__path_tuner_next(const struct hora__path_tuner *t, int cls) {
  if (decided(t, cls)) {
    return t->best[HORA_SHM_PATH_STAGED][cls] < t->best[HORA_SHM_PATH_KERNEL][cls]
               ? HORA_SHM_PATH_STAGED
               : HORA_SHM_PATH_KERNEL;
  }
  /* The kernel run, then the staged run; once both have begun in full, the
   * path still short of records (a trial that failed has none) goes on. */
  if (t->started[HORA_SHM_PATH_KERNEL][cls] < HORA_PATH_TUNER_RUN) {
    return HORA_SHM_PATH_KERNEL;
  }
  if (t->started[HORA_SHM_PATH_STAGED][cls] < HORA_PATH_TUNER_RUN ||
      t->finished[HORA_SHM_PATH_STAGED][cls] < t->finished[HORA_SHM_PATH_KERNEL][cls]) {
    return HORA_SHM_PATH_STAGED;
  }
  return HORA_SHM_PATH_KERNEL;
}

void hora__path_tuner_started(struct hora__path_tuner *t, int cls, enum hora__shm_path path) {
  if (valid(cls) && !decided(t, cls) && t->started[path][cls] < UINT8_MAX) {
    t->started[path][cls]++;
  }
}

int hora__path_tuner_record(struct hora__path_tuner *t, int cls, enum hora__shm_path path,
                            size_t bytes, uint64_t ns) {
  if (!valid(cls) || bytes == 0 || decided(t, cls)) {
    return 0;
  }
  uint8_t *n = &t->finished[path][cls];
  double per_byte = (double)ns / (double)bytes;
  if (*n == 1 || (*n > 1 && per_byte < t->best[path][cls])) {
    t->best[path][cls] = per_byte; /* the run's first operation (n == 0) warmed up */
  }
  if (*n < UINT8_MAX) {
    (*n)++;
  }
  return decided(t, cls);
}
