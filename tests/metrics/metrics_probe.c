/* The metrics tests' job (tests/metrics/check-metrics.sh): a fixed set of
 * collectives, then this rank's hora_get_stats on one line, then it stays
 * alive until the script creates a file (so that a scraper can read the
 * final values), then hora_finalize.
 *
 * usage: metrics_probe [-n ROUNDS] [-w FILE] [-t TIMEOUT_S] [-l SECONDS]
 *   -n  rounds of the collectives (default 20)
 *   -w  wait for FILE to exist before finalizing (polled every 50 ms)
 *   -t  give up waiting after this many seconds (default 120): exit 3
 *   -l  first run allreduces for SECONDS and print the slowest one's time
 *       ("LATENCY rank max_ms ops"), for the connection-flood test */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hora.h"

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define CHECK(call)                                                                    \
  do {                                                                                 \
    int rc_ = (call);                                                                  \
    if (rc_ != HORA_SUCCESS) {                                                         \
      fprintf(stderr, "metrics_probe: %s failed: %s\n", #call, hora_last_error()); \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

static int rounds(int n, int size) {
  enum { BIG = 65536, SMALL = 1000 };
  float *a = calloc(BIG * (size_t)size, sizeof(float));
  float *b = calloc(BIG * (size_t)size, sizeof(float));
  double *d = calloc(SMALL, sizeof(double));
  int32_t *k = calloc(SMALL, sizeof(int32_t));
  if (!a || !b || !d || !k) {
    return 1;
  }
  for (int i = 0; i < n; i++) {
    CHECK(hora_allreduce("probe.f32", a, b, BIG, HORA_FLOAT32, HORA_SUM));
    CHECK(hora_allreduce("probe.f64", d, d, SMALL, HORA_FLOAT64, HORA_SUM));
    CHECK(hora_broadcast("probe.bcast", k, SMALL, HORA_INT32, 0));
    CHECK(hora_allgather("probe.gather", a, SMALL, HORA_FLOAT32, b));
    CHECK(hora_reducescatter("probe.rs", a, b, (size_t)SMALL * size, HORA_FLOAT32, HORA_SUM));
  }
  free(a);
  free(b);
  free(d);
  free(k);
  return 0;
}

int main(int argc, char **argv) {
  int n = 20;
  const char *wait_file = NULL;
  double timeout = 120, latency_s = 0;
  int c;
  while ((c = getopt(argc, argv, "n:w:t:l:")) != -1) {
    switch (c) {
      case 'n': n = atoi(optarg); break;
      case 'w': wait_file = optarg; break;
      case 't': timeout = atof(optarg); break;
      case 'l': latency_s = atof(optarg); break;
      default: return 2;
    }
  }
  CHECK(hora_init());
  int rank = hora_rank(), size = hora_size();
  printf("PID %d %d\n", rank, (int)getpid());
  fflush(stdout);
  if (latency_s > 0) {
    /* Rank 0's clock decides when all stop: x[0] carries its word. */
    float x[256] = {0};
    double worst = 0, end = now_s() + latency_s;
    long ops = 0;
    do {
      x[0] = rank == 0 && now_s() >= end ? 1.0f : 0.0f;
      double t0 = now_s();
      CHECK(hora_allreduce("probe.latency", x, x, 256, HORA_FLOAT32, HORA_SUM));
      double t = now_s() - t0;
      worst = t > worst ? t : worst;
      ops++;
    } while (x[0] == 0.0f);
    printf("LATENCY %d %.1f %ld\n", rank, worst * 1e3, ops);
  }
  if (rounds(n, size) != 0) {
    return 1;
  }
  hora_stats s;
  memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  CHECK(hora_get_stats(&s));
  printf("STATS %d allreduce=%llu broadcast=%llu allgather=%llu reducescatter=%llu "
         "alltoall=%llu bytes=%llu cycles=%llu cache_hits=%llu cache_misses=%llu "
         "fused_batches=%llu eager=%llu\n",
         rank, (unsigned long long)s.allreduces, (unsigned long long)s.broadcasts,
         (unsigned long long)s.allgathers, (unsigned long long)s.reducescatters,
         (unsigned long long)s.alltoalls, (unsigned long long)s.bytes,
         (unsigned long long)s.cycles, (unsigned long long)s.cache_hits,
         (unsigned long long)s.cache_misses, (unsigned long long)s.fused_batches,
         (unsigned long long)s.eager_allreduces);
  fflush(stdout);
  if (wait_file) {
    double end = now_s() + timeout;
    while (access(wait_file, F_OK) != 0) {
      if (now_s() > end) {
        fprintf(stderr, "metrics_probe: rank %d: %s did not appear within %.0f s\n", rank,
                wait_file, timeout);
        return 3;
      }
      struct timespec ms = {0, 50 * 1000000};
      nanosleep(&ms, NULL);
    }
  }
  CHECK(hora_finalize());
  return 0;
}
