/* What the benchmark programs share: sizes from the command line (K, M, G
 * suffixes), medians, and how many operations time one size. */
#ifndef HORA_BENCH_COMMON_H
#define HORA_BENCH_COMMON_H

#include <stdlib.h>

/* About 0.2 s of work per repetition at 1 GB/s, between 2 and 1000 ops. */
#define HORA_CLAMP_ITERS(bytes) \
  ((bytes) >= (size_t)100e6 ? 2 : (bytes) <= 200000 ? 1000 : (size_t)200e6 / (bytes))

static inline size_t parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return (size_t)v;
}

static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sorts v. */
static inline double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
