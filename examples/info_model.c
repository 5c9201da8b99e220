/* hora-info --algorithms and --model: the registry of collective
 * algorithms, and what the cost model predicts for a layout, real or
 * projected (thousands of ranks, other networks). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "info_model.h"
#include "base/params.h"
#include "comm/coll/collectives.h"

int hora_info_algorithms(void) {
  int w = 0;
  for (int i = 0; i < hora__nalgos; i++) {
    w = (int)HORA_MAX((size_t)w, strlen(hora__algos[i]->name));
  }
  printf("collective algorithms (force one with HORA_ALGORITHM_<KIND>=NAME; auto: the cost "
         "model)\n");
  for (int k = 0; k < HORA_ALGO_KINDS; k++) {
    printf("%s:\n", hora__algo_kind_name((enum hora__coll_kind)k));
    for (int i = 0; i < hora__nalgos; i++) {
      const struct hora__algo *a = hora__algos[i];
      if ((int)a->kind == k) {
        printf("  %-*s %s\n", w, a->name, a->summary);
      }
    }
  }
  return 0;
}

/* Seconds in a column of `width` (at least 12) characters. */
static void print_us_in(double s, int width) {
  char t[32];
  if (s >= 1.0) {
    snprintf(t, sizeof(t), "%.2fs ", s);
  } else if (s >= 1e-3) {
    snprintf(t, sizeof(t), "%.2fms ", s * 1e3);
  } else {
    snprintf(t, sizeof(t), "%.1fus ", s * 1e6);
  }
  printf(" %*s", width - 1, t);
}

static void print_us(double s) { print_us_in(s, 12); }

/* An algorithm's column in the tables: as wide as its name. */
static int column(const struct hora__algo *a) { return (int)HORA_MAX(strlen(a->name) + 1, 12); }

static void size_name(size_t b, char *out, size_t n) {
  if (b >= (1u << 20) && b % (1u << 20) == 0) {
    snprintf(out, n, "%zu MiB", b >> 20);
  } else if (b >= 1024 && b % 1024 == 0) {
    snprintf(out, n, "%zu KiB", b >> 10);
  } else {
    snprintf(out, n, "%zu B", b);
  }
}

/* One table: each usable algorithm of kind at each size, and the pick. */
static void table(const struct hora__layout *s, const struct hora__cost_model *m,
                  enum hora__coll_kind kind, const size_t *sizes, int nsizes) {
  printf("%s, %d ranks on %d host(s):\n%10s", hora__algo_kind_name(kind), s->size, s->hosts,
         "bytes");
  for (int i = 0; i < hora__nalgos; i++) {
    if (hora__algos[i]->kind == kind && hora__algos[i]->usable(s)) {
      printf(" %*s", column(hora__algos[i]), hora__algos[i]->name);
    }
  }
  printf("  chosen\n");
  for (int j = 0; j < nsizes; j++) {
    char name[32];
    size_name(sizes[j], name, sizeof(name));
    printf("%10s", name);
    for (int i = 0; i < hora__nalgos; i++) {
      if (hora__algos[i]->kind == kind && hora__algos[i]->usable(s)) {
        print_us_in(hora__algos[i]->cost(m, s, sizes[j]), column(hora__algos[i]) + 1);
      }
    }
    printf("  %s\n", hora__algo_pick(s, m, kind, sizes[j])->name);
  }
}

/* The projection to thousands of ranks (docs/benchmarks.md, "Projection"):
 * allreduce on InfiniBand HDR between hosts and NVLink within them. */
static int projection(void) {
  struct hora__cost_model m = {.link = {2e-6, 1.0 / 25e9, 1.0 / 400e9},
                               .local = {3e-6, 1.0 / 150e9, 1.0 / 400e9}};
  snprintf(m.source, sizeof(m.source), "projection");
  printf("allreduce at scale, predicted by the cost model; 8 ranks per host.\n"
         "between hosts: InfiniBand HDR, alpha 2 us, 25 GB/s (one link per host);\n"
         "within a host: NVLink, alpha 3 us, 150 GB/s; reduction 400 GB/s (GPU memory).\n"
         "ring bound: 2(p-1)/p * n / 25 GB/s, what any algorithm needs to move the bytes.\n\n");
  printf("%7s %9s %12s %12s %12s  %s\n", "ranks", "bytes", "ring only", "chosen", "ring bound",
         "chosen algorithm");
  const int ranks[2] = {1024, 16384};
  const size_t sizes[4] = {8, 64 << 10, 1 << 20, (size_t)256 << 20};
  const struct hora__algo *ring = hora__algo_find(HORA_COLL_ALLREDUCE, "ring");
  for (int r = 0; r < 2; r++) {
    struct hora__layout s = {.size = ranks[r], .hosts = ranks[r] / 8, .shm_host = false,
                             .hierarchical = true, .chunk = 512 << 10};
    for (int j = 0; j < 4; j++) {
      char name[32];
      size_name(sizes[j], name, sizeof(name));
      const struct hora__algo *a = hora__algo_pick(&s, &m, HORA_COLL_ALLREDUCE, sizes[j]);
      double bound = 2.0 * (s.size - 1) / s.size * (double)sizes[j] / 25e9;
      printf("%7d %9s", s.size, name);
      print_us(ring->cost(&m, &s, sizes[j]));
      print_us(a->cost(&m, &s, sizes[j]));
      print_us(bound);
      if (strcmp(a->name, "hierarchical") == 0) {
        printf(" hierarchical (%s across hosts)\n",
               hora__cross_pick(&s, &m, HORA_COLL_ALLREDUCE, sizes[j] / 8, NULL)->name);
      } else {
        printf(" %s\n", a->name);
      }
    }
  }
  return 0;
}

/* The link's constants: alpha, beta, gamma and the runtime's cost per
 * operation. The fit solves for all but gamma, the reduction's speed,
 * which it takes from the base model (built in, --link or calibrated): in
 * the rings every byte moved is also reduced, so times alone cannot tell
 * the two apart. */
#define NV 4
#define GAMMA 2

/* The prediction of a measurement (a whole operation by algorithm a at
 * `bytes`, hora__operation_cost: eager allreduces inside the cycle) is
 * linear in the link's constants: *fixed + coef . (alpha, beta, gamma, op). */
static void linear_terms(const struct hora__algo *a, const struct hora__layout *s,
                         const struct hora__cost_model *base, size_t bytes, double coef[NV],
                         double *fixed) {
  bool eager = hora__eager(a->kind, bytes, s->size, NULL);
  /* The tree's chunk is the one the runtime ran with, chosen by the base
   * constants; held fixed, the tree's cost is linear in the link's. */
  struct hora__layout ls = *s;
  if (strcmp(a->name, "tree") == 0) {
    ls.chunk = hora__tree_chunk(&base->link, s->size, bytes, s->chunk);
  }
  s = &ls;
  struct hora__cost_model m = *base;
  m.link = (struct hora__cost){0, 0, base->link.gamma, 0};
  *fixed = hora__operation_cost(&m, s, a, bytes, eager);
  for (int j = 0; j < NV; j++) {
    m.link = (struct hora__cost){j == 0, j == 1, j == 2 ? base->link.gamma : 0, j == 3};
    coef[j] = j == GAMMA ? 0 : hora__operation_cost(&m, s, a, bytes, eager) - *fixed;
  }
}

static int fit(const char *path, int ranks, int hosts, const struct hora__cost_model *base) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "hora-info --fit: cannot read %s\n", path);
    return 2;
  }
  struct hora__layout s = {.size = ranks, .hosts = hosts, .shm_host = hosts == 1 && ranks > 1,
                           .hierarchical = hosts > 1 && ranks > hosts,
                           .chunk = (size_t)hora__params.CHUNK_SIZE};
  enum { MAXN = 4096 };
  static double rows[MAXN][NV], fixed[MAXN], t[MAXN];
  static const struct hora__algo *algo[MAXN];
  static size_t size_of[MAXN];
  char line[256], kind[32], name[32];
  int n = 0;
  while (fgets(line, sizeof(line), f) && n < MAXN) {
    double sec;
    size_t bytes;
    if (line[0] == '#' || sscanf(line, "%31s %31s %zu %lf", kind, name, &bytes, &sec) != 4) {
      continue;
    }
    int k = 0;
    while (k < HORA_ALGO_KINDS && strcmp(kind, hora__algo_kind_name((enum hora__coll_kind)k))) {
      k++;
    }
    const struct hora__algo *a = k < HORA_ALGO_KINDS ? hora__algo_find(k, name) : NULL;
    if (!a || !a->usable(&s) || !(sec > 0)) {
      continue;
    }
    /* hora-bench's allgather bytes are the gathered buffer's; the model's
     * each rank's block. */
    linear_terms(a, &s, base, k == HORA_COLL_ALLGATHER ? bytes / (size_t)ranks : bytes, rows[n],
                 &fixed[n]);
    t[n] = sec;
    algo[n] = a;
    size_of[n] = bytes;
    n++;
  }
  fclose(f);
  if (n < 3) {
    fprintf(stderr, "hora-info --fit: %s has %d usable lines (KIND ALGORITHM BYTES SECONDS); "
                    "at least 3 are needed\n", path, n);
    return 2;
  }
  /* Normal equations of sum ((rows . x + fixed - t) / t)^2, then clamp
   * negative constants to zero and solve again without them. */
  double x[NV] = {0};
  bool free_var[NV] = {true, true, false, true};
  x[GAMMA] = base->link.gamma;
  for (int pass = 0; pass < NV; pass++) {
    double A[NV][NV] = {{0}}, b[NV] = {0};
    for (int i = 0; i < n; i++) {
      double w = 1 / (t[i] * t[i]);
      for (int p = 0; p < NV; p++) {
        b[p] += w * rows[i][p] * (t[i] - fixed[i]);
        for (int q = 0; q < NV; q++) {
          A[p][q] += w * rows[i][p] * rows[i][q];
        }
      }
    }
    for (int p = 0; p < NV; p++) {
      if (!free_var[p]) {
        for (int q = 0; q < NV; q++) {
          A[p][q] = A[q][p] = 0;
        }
        A[p][p] = 1;
        b[p] = 0;
      }
    }
    /* Gaussian elimination with partial pivoting. */
    for (int c = 0; c < NV; c++) {
      int piv = c;
      for (int r = c + 1; r < NV; r++) {
        if (fabs(A[r][c]) > fabs(A[piv][c])) {
          piv = r;
        }
      }
      for (int q = 0; q < NV; q++) {
        double tmp = A[c][q];
        A[c][q] = A[piv][q];
        A[piv][q] = tmp;
      }
      double tb = b[c];
      b[c] = b[piv];
      b[piv] = tb;
      if (fabs(A[c][c]) < 1e-300) {
        continue;
      }
      for (int r = c + 1; r < NV; r++) {
        double f2 = A[r][c] / A[c][c];
        for (int q = c; q < NV; q++) {
          A[r][q] -= f2 * A[c][q];
        }
        b[r] -= f2 * b[c];
      }
    }
    for (int c = NV - 1; c >= 0; c--) {
      double v = b[c];
      for (int q = c + 1; q < NV; q++) {
        v -= A[c][q] * x[q];
      }
      x[c] = fabs(A[c][c]) < 1e-300 ? 0 : v / A[c][c];
    }
    bool changed = false;
    for (int p = 0; p < NV; p++) {
      if (x[p] < 0) {
        x[p] = 0;
        free_var[p] = false;
        changed = true;
      }
    }
    if (!changed) {
      break;
    }
  }
  x[GAMMA] = base->link.gamma;
  printf("fitted over %d measurements, %d ranks on %d host(s) (gamma from the base model):\n", n,
         ranks, hosts);
  printf("HORA_COST_MODEL=%.3g,%.4g,%.4g,%.3g   # alpha us, beta ns/B (%.3g GB/s), gamma ns/B, "
         "the runtime's us per operation\n",
         x[0] * 1e6, x[1] * 1e9, x[2] * 1e9, x[3] * 1e6, x[1] > 0 ? 1e-9 / x[1] : 0);
  printf("%14s %13s  %12s %12s %12s %8s\n", "kind", "algorithm", "bytes", "measured", "model",
         "off");
  int bad = 0;
  for (int i = 0; i < n; i++) {
    double pred = fixed[i];
    for (int p = 0; p < NV; p++) {
      pred += rows[i][p] * x[p];
    }
    double off = (pred - t[i]) / t[i];
    bad += off > 0.25 || off < -0.25;
    bool eager = hora__eager(algo[i]->kind, size_of[i], ranks, NULL);
    printf("%14s %13s%s %12zu %10.1fus %10.1fus %+7.0f%%%s\n",
           hora__algo_kind_name(algo[i]->kind), algo[i]->name, eager ? "*" : " ", size_of[i], t[i] * 1e6,
           pred * 1e6, off * 100, off > 0.25 || off < -0.25 ? "  (more than 25%)" : "");
  }
  printf("%d of %d predictions within 25%% of the measurement (*: eager, inside the negotiation "
         "cycle, whatever the algorithm forced)\n",
         n - bad, n);
  return 0;
}

static int parse_int(const char *opt, const char *v, int *out) {
  char *end;
  long x = strtol(v, &end, 10);
  if (*end || x < 1 || x > 1 << 24) {
    fprintf(stderr, "hora-info: %s '%s': expected a count from 1 to %d\n", opt, v, 1 << 24);
    return -1;
  }
  *out = (int)x;
  return 0;
}

int hora_info_model(int argc, char **argv) {
  int ranks = 16, hosts = 0;
  struct hora__cost_model m = {0};
  const char *tp = "tcp";
  const char *link = hora__params.COST_MODEL[0] ? hora__params.COST_MODEL : NULL;
  const char *local = NULL, *fit_file = NULL;
  for (int i = 2; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(argv[i], "--projection") == 0) {
      return projection();
    } else if (strcmp(argv[i], "--ranks") == 0 && v) {
      if (parse_int("--ranks", v, &ranks)) {
        return 2;
      }
      i++;
    } else if (strcmp(argv[i], "--hosts") == 0 && v) {
      if (parse_int("--hosts", v, &hosts)) {
        return 2;
      }
      i++;
    } else if (strcmp(argv[i], "--link") == 0 && v) {
      link = v;
      i++;
    } else if (strcmp(argv[i], "--local") == 0 && v) {
      local = v;
      i++;
    } else if (strcmp(argv[i], "--fit") == 0 && v) {
      fit_file = v;
      i++;
    } else if (strcmp(argv[i], "--transport") == 0 && v) {
      tp = v;
      i++;
    } else {
      fprintf(stderr, "hora-info --model: unknown or incomplete option '%s' (--ranks N "
                      "--hosts H --link A,B,G --local A,B,G --transport tcp|unix|ib "
                      "--fit FILE --projection)\n", argv[i]);
      return 2;
    }
  }
  if (hosts == 0) {
    hosts = ranks;
  }
  if (ranks % hosts != 0) {
    fprintf(stderr, "hora-info --model: %d ranks do not split evenly over %d hosts\n", ranks,
            hosts);
    return 2;
  }
  bool calibrate = false;
  if (hora__cost_builtin(tp, &m) != HORA_SUCCESS ||
      (link && hora__cost_parse(link, &m.link, &calibrate) != HORA_SUCCESS) ||
      (local && hora__cost_parse(local, &m.local, NULL) != HORA_SUCCESS)) {
    fprintf(stderr, "hora-info --model: %s\n", hora_last_error());
    return 2;
  }
  if (calibrate) {
    /* Measured only in a job: show the built-in ones, and say so. */
    printf("HORA_COST_MODEL=calibrate: the link is measured at start-up (mpirun -np 2 "
           "hora-info --calibrate prints what it measures); the built-in constants below\n");
    link = NULL;
  }
  if (fit_file) {
    return fit(fit_file, ranks, hosts, &m);
  }
  printf("cost model: links alpha %.1f us, beta %.4f ns/B (%.2f GB/s), gamma %.4f ns/B (%s)\n"
         "            shared memory alpha %.1f us, beta %.4f ns/B, gamma %.4f ns/B\n\n",
         m.link.alpha * 1e6, m.link.beta * 1e9, m.link.beta > 0 ? 1e-9 / m.link.beta : 0,
         m.link.gamma * 1e9,
         !link                              ? m.source
         : strncmp(link, "file:", 5) == 0 ? link + 5
                                            : "given", m.local.alpha * 1e6, m.local.beta * 1e9,
         m.local.gamma * 1e9);
  printf("chosen: the cheapest, but the ring where the cheapest's steps each wait for the "
         "one before\n(");
  for (int i = 0, first = 1; i < hora__nalgos; i++) {
    if (hora__algos[i]->lockstep) {
      printf("%s%s", first ? "" : ", ", hora__algos[i]->name);
      first = 0;
    }
  }
  printf(") and it is priced less than %.0f%% under the ring\n\n", HORA_RING_MARGIN * 100);
  struct hora__layout s = {.size = ranks, .hosts = hosts, .shm_host = hosts == 1 && ranks > 1,
                           .hierarchical = hosts > 1 && ranks > hosts,
                           .chunk = (size_t)hora__params.CHUNK_SIZE};
  size_t sizes[16];
  int n = 0;
  for (size_t b = 8; b <= ((size_t)256 << 20); b *= 8) {
    sizes[n++] = b;
  }
  for (int k = 0; k < HORA_ALGO_KINDS; k++) {
    table(&s, &m, (enum hora__coll_kind)k, sizes, n);
    printf("\n");
  }
  return 0;
}
