/* Multi-rank test helpers. Each rank counts its own failures; mt_run sums
 * them outside hora (a broken hora must not hide a failure) and rank 0
 * prints one line per test: PASS name | FAIL name | SKIP name.
 *
 * The bookkeeping (barriers, sums, the shared directory) goes through MPI
 * when an MPI launcher started the process, else through files in the
 * directory HORA_TEST_DIR names (tests/launch/launch.sh makes one per
 * job); a lone process needs neither. */
#ifndef HORA_MPITEST_H
#define HORA_MPITEST_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hora.h"

extern int mt_rank, mt_size;

/* Record a failure of the current test on this rank (printed to stderr). */
void mt_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define MT_CHECK(cond, ...)                                                                  \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      mt_fail(__FILE__, __LINE__, __VA_ARGS__);                                              \
    }                                                                                        \
  } while (0)

/* A hora call that must succeed. */
#define MT_OK(call)                                                                          \
  do {                                                                                       \
    int mt_rc_ = (call);                                                                     \
    if (mt_rc_ != HORA_SUCCESS) {                                                            \
      mt_fail(__FILE__, __LINE__, "%s returned %s: %s", #call, hora_strerror(mt_rc_),        \
              hora_last_error());                                                            \
    }                                                                                        \
  } while (0)

/* A hora call that must fail with `code` and a message containing `needle`. */
#define MT_FAILS(call, code, needle)                                                         \
  do {                                                                                       \
    int mt_rc_ = (call);                                                                     \
    if (mt_rc_ != (code)) {                                                                  \
      mt_fail(__FILE__, __LINE__, "%s returned %s (%s), expected %s", #call,                 \
              hora_strerror(mt_rc_), hora_last_error(), hora_strerror(code));                \
    } else if (!mt_contains(hora_last_error(), (needle))) {                                  \
      mt_fail(__FILE__, __LINE__, "%s: message '%s' lacks '%s'", #call, hora_last_error(),   \
              (needle));                                                                     \
    }                                                                                        \
  } while (0)

/* NULL needle: anything matches. */
static inline int mt_contains(const char *hay, const char *needle) {
  return !needle || strstr(hay, needle) != NULL;
}

/* Arguments of the form HORA_X=value become environment settings, so the
 * testlist can run one program under several configurations. */
void mt_setenv_args(int argc, char **argv);

/* Whether an MPI launcher started this process (one of OMPI_COMM_WORLD_SIZE,
 * PMI_SIZE, PMI_RANK, PMIX_RANK is set). When not, the program must not
 * call MPI itself: hora started without it. */
bool mt_launched_by_mpi(void);

/* A directory every rank of the job sees under the same name (empty on
 * failure): with MPI rank 0 makes /tmp/PREFIX-XXXXXX and broadcasts it
 * (call after MPI_Init); without, it is HORA_TEST_DIR/PREFIX (or a fresh
 * /tmp/PREFIX-XXXXXX for a lone process), and may be called before
 * mt_init. mt_remove_shared_dir deletes it again (rank 0, after a
 * barrier). */
void mt_shared_dir(const char *prefix, char *dir, size_t n);
void mt_remove_shared_dir(const char *dir);

/* hora_init, then mt_rank and mt_size (MPI's ranks, or hora's without MPI). */
void mt_init(void);
/* Bookkeeping between every rank, never through hora (after mt_init). */
void mt_barrier(void);
/* Every rank's n bytes `mine`, in rank order, into all (mt_size * n bytes). */
void mt_allgather(const void *mine, size_t n, void *all);
/* This rank's place on its host as the launcher sees it (MPI's shared-memory
 * split, or the host name without MPI): local rank and size, and the lowest
 * global rank on the host. */
void mt_host(int *local_rank, int *local_size, int *first_rank);
/* Seconds on a monotonic clock. */
double mt_wtime(void);
/* Runs one test on every rank and prints its line on rank 0. */
void mt_run(const char *name, void (*fn)(void));
void mt_skip(const char *name, const char *why);
/* This process's open descriptors and resident set (KiB), for leak checks. */
int mt_count_fds(void);
long mt_rss_kib(void);
/* Failures over all tests and ranks so far. */
int mt_total_failures(void);

/* Deterministic per-rank pattern values. */
static inline uint64_t mt_hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

#endif
