/* hora-info --algorithms and --model: the registry of collective
 * algorithms, and what the cost model predicts for a layout, real or
 * projected (thousands of ranks, other networks). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "info_model.h"
#include "base/params.h"
#include "comm/coll/collectives.h"

int hora_info_algorithms(void) {
  printf("collective algorithms (force one with HORA_ALGORITHM_<KIND>=NAME; auto: the cost "
         "model)\n");
  for (int k = 0; k < HORA_ALGO_KINDS; k++) {
    printf("%s:\n", hora__algo_kind_name((enum hora__coll_kind)k));
    for (int i = 0; i < hora__nalgos; i++) {
      const struct hora__algo *a = hora__algos[i];
      if ((int)a->kind == k) {
        printf("  %-13s %s\n", a->name, a->summary);
      }
    }
  }
  return 0;
}

static void print_us(double s) {
  if (s >= 1.0) {
    printf(" %10.2fs ", s);
  } else if (s >= 1e-3) {
    printf(" %9.2fms ", s * 1e3);
  } else {
    printf(" %9.1fus ", s * 1e6);
  }
}

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
      printf(" %12s", hora__algos[i]->name);
    }
  }
  printf("  chosen\n");
  for (int j = 0; j < nsizes; j++) {
    char name[32];
    size_name(sizes[j], name, sizeof(name));
    printf("%10s", name);
    for (int i = 0; i < hora__nalgos; i++) {
      if (hora__algos[i]->kind == kind && hora__algos[i]->usable(s)) {
        print_us(hora__algos[i]->cost(m, s, sizes[j]));
      }
    }
    printf("  %s\n", hora__algo_pick(s, m, kind, sizes[j])->name);
  }
}

/* The projection to thousands of ranks (README, "Scale"): allreduce on
 * InfiniBand HDR between hosts and NVLink within them. */
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
      printf(" %s\n", a->name);
    }
  }
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
  const char *local = NULL;
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
    } else if (strcmp(argv[i], "--transport") == 0 && v) {
      tp = v;
      i++;
    } else {
      fprintf(stderr, "hora-info --model: unknown or incomplete option '%s' (--ranks N "
                      "--hosts H --link A,B,G --local A,B,G --transport tcp|unix|ib "
                      "--projection)\n", argv[i]);
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
  if (hora__cost_builtin(tp, &m) != HORA_SUCCESS ||
      (link && hora__cost_parse(link, &m.link) != HORA_SUCCESS) ||
      (local && hora__cost_parse(local, &m.local) != HORA_SUCCESS)) {
    fprintf(stderr, "hora-info --model: %s\n", hora_last_error());
    return 2;
  }
  printf("cost model: links alpha %.1f us, beta %.4f ns/B (%.2f GB/s), gamma %.4f ns/B (%s)\n"
         "            shared memory alpha %.1f us, beta %.4f ns/B, gamma %.4f ns/B\n\n",
         m.link.alpha * 1e6, m.link.beta * 1e9, m.link.beta > 0 ? 1e-9 / m.link.beta : 0,
         m.link.gamma * 1e9, link ? "given" : m.source, m.local.alpha * 1e6, m.local.beta * 1e9,
         m.local.gamma * 1e9);
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
