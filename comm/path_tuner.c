/* Per-size-class choice between the kernel and the staged intra-host path. */
#include "path_tuner.h"

int hora__path_tuner_class(size_t share) {
  int cls = 0;
  while (share > 1 && cls < HORA_PATH_TUNER_CLASSES - 1) {
    share >>= 1;
    cls++;
  }
  return cls;
}

static int decided(const struct hora__path_tuner *t, int cls) {
  return t->trials[HORA_SHM_PATH_KERNEL][cls] >= HORA_PATH_TUNER_TRIALS &&
         t->trials[HORA_SHM_PATH_STAGED][cls] >= HORA_PATH_TUNER_TRIALS;
}

enum hora__shm_path hora__path_tuner_next(const struct hora__path_tuner *t, int cls) {
  unsigned k = t->trials[HORA_SHM_PATH_KERNEL][cls], s = t->trials[HORA_SHM_PATH_STAGED][cls];
  if (decided(t, cls)) {
    return t->best[HORA_SHM_PATH_STAGED][cls] < t->best[HORA_SHM_PATH_KERNEL][cls]
               ? HORA_SHM_PATH_STAGED
               : HORA_SHM_PATH_KERNEL;
  }
  if (k < HORA_PATH_TUNER_TRIALS && (k <= s || s >= HORA_PATH_TUNER_TRIALS)) {
    return HORA_SHM_PATH_KERNEL;
  }
  return HORA_SHM_PATH_STAGED;
}

int hora__path_tuner_record(struct hora__path_tuner *t, int cls, enum hora__shm_path path,
                            size_t bytes, uint64_t ns) {
  if (cls < 0 || cls >= HORA_PATH_TUNER_CLASSES || bytes == 0 || decided(t, cls)) {
    return 0;
  }
  double per_byte = (double)ns / (double)bytes;
  uint8_t *n = &t->trials[path][cls];
  if (*n == 0 || per_byte < t->best[path][cls]) {
    t->best[path][cls] = per_byte;
  }
  (*n)++;
  return decided(t, cls);
}
