/* Choosing, by measurement, how an intra-host allreduce moves buffers that
 * the peers cannot map (ordinary malloc'd memory).
 *
 * Two paths do the same work: the kernel path reads and writes the peers'
 * buffers with process_vm_readv/writev, one copy per byte each way; the
 * staged path copies through the shared segment, two copies each way but in
 * user space. Which is faster depends on the machine: where pinning the
 * peer's pages is cheap the kernel path wins; where it is not (seen on
 * virtual machines: a kernel copy of 32 MiB three times slower than memcpy),
 * staging wins for operations bigger than the caches. So the host's local
 * rank 0 times both, per size class, and tells the others which to take.
 *
 * This file is the bookkeeping only: no clocks, no shared memory. */
#ifndef HORA_PATH_TUNER_H
#define HORA_PATH_TUNER_H

#include <stddef.h>
#include <stdint.h>

enum hora__shm_path { HORA_SHM_PATH_KERNEL = 0, HORA_SHM_PATH_STAGED = 1 };

#define HORA_PATH_TUNER_CLASSES 48 /* size class = floor(log2(bytes per local rank)) */
#define HORA_PATH_TUNER_TRIALS 3   /* timed operations per path and class before choosing */
/* Operations per path: one to warm up, then the trials. */
#define HORA_PATH_TUNER_RUN (HORA_PATH_TUNER_TRIALS + 1)

/* Each path takes HORA_PATH_TUNER_RUN operations in a row, kernel
 * first; the first of each run is not timed: it pays for bringing that path's
 * buffers into the caches, which the other path had evicted. */
struct hora__path_tuner {
  double best[2][HORA_PATH_TUNER_CLASSES];      /* fastest ns per byte seen, per path */
  uint8_t started[2][HORA_PATH_TUNER_CLASSES];  /* operations begun */
  uint8_t finished[2][HORA_PATH_TUNER_CLASSES]; /* operations recorded */
};

/* The size class of an operation that gives each local rank `share` bytes. */
int hora__path_tuner_class(size_t share);

/* The path the next operation of class cls takes: the trial runs, then the
 * faster path by its best time (the best, not the mean, so that a trial
 * slowed by a late peer or a page fault does not decide). Ties go to the
 * kernel path. */
enum hora__shm_path hora__path_tuner_next(const struct hora__path_tuner *t, int cls);

/* An operation of class cls has begun on `path`: the choice for the next
 * one counts it, although its time is not known yet. */
void hora__path_tuner_started(struct hora__path_tuner *t, int cls, enum hora__shm_path path);

/* Records that an operation of `bytes` in class cls took ns on `path`.
 * Returns 1 when this record made the class's choice final. */
int hora__path_tuner_record(struct hora__path_tuner *t, int cls, enum hora__shm_path path,
                            size_t bytes, uint64_t ns);

#endif
