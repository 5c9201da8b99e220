/* Liveness during long collectives: while a collective keeps moving bytes,
 * every rank still sends heartbeats, reads its control connections and sees
 * aborts.
 *
 *   long   (default) three allreduces of 1 GiB in a row, each checked; run
 *          with a HORA_PEER_TIMEOUT_SECONDS that one of them must outlast
 *          (checked), without a rank declaring a healthy peer lost.
 *   abort  rank 1 calls hora_abort a quarter of the way into a 1 GiB
 *          allreduce (timed by one before it; doubled up to 4 GiB where
 *          it is over too soon to be caught in the middle); the allreduce must fail with
 *          HORA_ERR_ABORTED on every rank within 2 s of the abort.
 * Arguments HORA_X=value set the environment; bytes=N sets the size. */
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "mpitest.h"

static size_t bytes = (size_t)1 << 30;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Gigabytes in 2 MiB pages where the kernel gives them: a page fault costs
 * microseconds on a virtual machine, and 4 KiB pages made filling these
 * buffers most of this test's minute. */
static float *big_buffer(size_t n) {
  size_t len = (n * sizeof(float) + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
  float *x = aligned_alloc((size_t)2 << 20, len);
#ifdef MADV_HUGEPAGE
  if (x) {
    (void)madvise(x, len, MADV_HUGEPAGE);
  }
#endif
  return x;
}

static float value(size_t i, int rank) { return (float)((i & 1023) + (size_t)rank); }

static void long_allreduces_succeed(void) {
  size_t n = bytes / sizeof(float);
  float *x = big_buffer(n);
  MT_CHECK(x != NULL, "cannot allocate %zu bytes", bytes);
  if (!x) {
    return;
  }
  float base = (float)mt_size * (float)(mt_size - 1) / 2;
  const char *pt = getenv("HORA_PEER_TIMEOUT_SECONDS");
  double timeout = pt ? atof(pt) : 30, longest = 0;
  for (int round = 0; round < 3; round++) {
    for (size_t i = 0; i < n; i++) {
      x[i] = value(i, mt_rank);
    }
    double t0 = now_s();
    int rc = hora_allreduce("long", x, x, n, HORA_FLOAT32, HORA_SUM);
    double dt = now_s() - t0;
    MT_CHECK(rc == HORA_SUCCESS, "round %d: allreduce of %zu MiB failed after %.1f s: %s", round,
             bytes >> 20, dt, hora_last_error());
    if (rc != HORA_SUCCESS) {
      break;
    }
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
      bad += x[i] != (float)mt_size * (float)(i & 1023) + base;
    }
    MT_CHECK(bad == 0, "round %d: %zu wrong values", round, bad);
    if (mt_rank == 0) {
      fprintf(stderr, "  round %d: %zu MiB in %.2f s\n", round, bytes >> 20, dt);
    }
    longest = dt > longest ? dt : longest;
  }
  /* Else nothing here outlasted the timeout, and the check proved nothing. */
  MT_CHECK(longest > timeout, "no allreduce outlasted HORA_PEER_TIMEOUT_SECONDS=%g (the longest "
           "took %.2f s): a larger bytes=, or a shorter timeout", timeout, longest);
  free(x);
}

static void abort_stops_a_long_allreduce(void) {
  /* An allreduce before tells how long one takes here; the abort comes a
   * quarter of the way into the next. Where one is too quick to be caught
   * in the middle, the size grows by powers of two, up to 4 GiB (the 2
   * ranks' buffers, 8 GiB, are what this 24 GiB machine can spare). */
  const size_t most = (size_t)4 << 30;
  float *x = NULL;
  size_t n = 0;
  double slowest = 0;
  for (int tries = 0;; tries++) {
    n = bytes / sizeof(float);
    free(x);
    x = big_buffer(n);
    MT_CHECK(x != NULL, "cannot allocate %zu bytes", bytes);
    if (!x) {
      return;
    }
    for (size_t i = 0; i < n; i++) {
      x[i] = value(i, mt_rank);
    }
    char name[32];
    snprintf(name, sizeof(name), "warm-up.%d", tries);
    MT_OK(hora_allreduce(name, x, x, n, HORA_FLOAT32, HORA_SUM)); /* pages faulted in */
    snprintf(name, sizeof(name), "timed.%d", tries);
    double t0 = now_s();
    MT_OK(hora_allreduce(name, x, x, n, HORA_FLOAT32, HORA_SUM));
    double took = now_s() - t0;
    MPI_Allreduce(&took, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (mt_rank == 0) {
      fprintf(stderr, "  an allreduce of %zu MiB took %.2f s\n", bytes >> 20, slowest);
    }
    /* Straight to the size that takes about half a second: each size
     * tried costs its buffer's filling. */
    size_t next = bytes;
    while (next * 2 <= most && slowest * (double)next / (double)bytes < 0.5) {
      next *= 2;
    }
    if (slowest >= 0.4 || next == bytes) {
      break;
    }
    bytes = next;
  }
  /* A quiet machine reduces 4 GiB by single copy in under 0.3 s; a
   * quarter of 0.15 s still lands well inside the allreduce. */
  if (slowest < 0.15) {
    if (mt_rank == 0) {
      fprintf(stderr, "  an allreduce of %zu MiB took only %.2f s: too short to abort in the middle\n",
              bytes >> 20, slowest);
    }
    MT_CHECK(false, "allreduce too short (%.2f s) for the check", slowest);
    free(x);
    return;
  }
  const double abort_at = slowest / 4;
  hora_request *r = NULL;
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now_s();
  MT_OK(hora_allreduce_async("long", x, x, n, HORA_FLOAT32, HORA_SUM, &r));
  if (mt_rank == 1) {
    usleep((useconds_t)(abort_at * 1e6));
    MT_OK(hora_abort("stop the long allreduce"));
  }
  int rc = hora_wait(&r);
  double dt = now_s() - t0;
  MT_CHECK(rc == HORA_ERR_ABORTED, "allreduce returned %s after %.2f s, expected HORA_ERR_ABORTED (%s)",
           hora_strerror(rc), dt, hora_last_error());
  MT_CHECK(dt < abort_at + 2.0, "the abort stopped the allreduce %.2f s after it was called",
           dt - abort_at);
  if (rc == HORA_ERR_ABORTED) {
    MT_CHECK(strstr(hora_last_error(), "stop the long allreduce") != NULL, "message lacks the reason: %s",
             hora_last_error());
  }
  fprintf(stderr, "  rank %d: allreduce ended %.2f s after the abort (%s)\n", mt_rank, dt - abort_at,
          hora_strerror(rc));
  free(x);
}

int main(int argc, char **argv) {
  int provided;
  mt_setenv_args(argc, argv);
  bool abort_mode = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "abort") == 0) {
      abort_mode = true;
    } else if (strncmp(argv[i], "bytes=", 6) == 0) {
      bytes = (size_t)strtoull(argv[i] + 6, NULL, 0);
    }
  }
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  mt_init();
  if (abort_mode) {
    if (mt_size < 2) {
      mt_skip("liveness/abort_stops_a_long_allreduce", "needs at least 2 ranks");
    } else {
      mt_run("liveness/abort_stops_a_long_allreduce", abort_stops_a_long_allreduce);
    }
    (void)hora_finalize(); /* fails with the abort, as it must */
  } else {
    mt_run("liveness/long_allreduces_under_a_short_peer_timeout", long_allreduces_succeed);
    MT_OK(hora_finalize());
  }
  int failures = mt_total_failures();
  MPI_Finalize();
  return failures ? 1 : 0;
}
