/* The alpha-beta-gamma cost model the selector chooses by (select.c).
 *
 * A message of n bytes between two ranks costs alpha + n * beta; reducing
 * n bytes costs n * gamma. Each algorithm's prediction adds its steps'
 * costs. A whole operation (hora__operation_cost) adds the negotiation
 * cycle, itself a recursive doubling of a few bytes, and the runtime's
 * fixed cost per operation; an eager operation travels inside the cycle
 * and runs no algorithm after it. Where hosts hold several ranks (L = size / hosts, placed in blocks
 * as launchers place them), a step in which all L ranks of a host talk to
 * other hosts at once shares the host's link: its bytes cost L * beta;
 * steps between ranks of one host cost the local constants.
 *
 * The constants: HORA_COST_MODEL (numbers measured by scripts/scale-bench.sh
 * --fit or by hand, a file hora-info --calibrate --save wrote, or
 * `calibrate`: measured at start-up by hora__cost_calibrate, as a job
 * across hosts does by default), else built-in ones per transport,
 * measured on a small cluster of this project's test machines; rank 0's
 * are used by all (communicator.c), so that every rank chooses alike. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/params.h"
#include "comm/coll/collectives.h"
#include "comm/reduce/reduce.h"

/* Built-in constants (alpha s, beta s/B, gamma s/B; the runtime's cost per
 * operation not measured: 0). Sockets between
 * hosts: a 10 Gbit/s class link and a poll wake-up per message; Unix
 * sockets within a host (two copies through the kernel per byte, so never
 * cheaper than the shared segment); RDMA; the host's shared segment (one
 * copy in, one out, or the kernel's single copy). */
static const struct hora__cost builtin_tcp = {60e-6, 1.0e-9, 0.25e-9, 0};
static const struct hora__cost builtin_unix = {25e-6, 0.6e-9, 0.25e-9, 0};
static const struct hora__cost builtin_ib = {8e-6, 0.1e-9, 0.25e-9, 0};
static const struct hora__cost builtin_shm = {6e-6, 0.1e-9, 0.25e-9, 0};

#define COST_FORMS                                                                            \
  "alpha_us,beta_ns_per_byte,gamma_ns_per_byte[,op_us] (three or four numbers >= 0, e.g. " \
  "60,8,0.25 or 60,8,0.25,150), "                                                           \
  "calibrate (measured at start-up), builtin (the transport's built-in constants) or "  \
  "file:PATH (as hora-info --calibrate --save writes it)"

/* Three or four numbers >= 0, in us and ns per byte (the fourth, the
 * runtime's cost per operation, in us). */
static bool parse_numbers(const char *text, struct hora__cost *c) {
  double v[4] = {0, 0, 0, 0};
  int used = 0, more = 0;
  if (sscanf(text, "%lf,%lf,%lf%n", &v[0], &v[1], &v[2], &used) != 3) {
    return false;
  }
  const char *rest = text + used;
  if (*rest == ',') {
    if (sscanf(rest + 1, "%lf%n", &v[3], &more) != 1) {
      return false;
    }
    rest += 1 + more;
  }
  rest += strspn(rest, " \t");
  if (*rest) {
    return false;
  }
  for (int i = 0; i < 4; i++) {
    if (!(v[i] >= 0) || !isfinite(v[i])) {
      return false;
    }
  }
  *c = (struct hora__cost){v[0] * 1e-6, v[1] * 1e-9, v[2] * 1e-9, v[3] * 1e-6};
  return true;
}

void hora__cost_format(const struct hora__cost *c, char *out, size_t n) {
  int k = snprintf(out, n, "%.4g,%.4g,%.4g", c->alpha * 1e6, c->beta * 1e9, c->gamma * 1e9);
  if (c->op > 0 && k > 0 && (size_t)k < n) {
    snprintf(out + k, n - (size_t)k, ",%.4g", c->op * 1e6);
  }
}

/* The file's one line of numbers; '#' lines and blank ones are skipped. */
static int read_file(const char *path, struct hora__cost *c) {
  if (!path[0]) {
    return hora__error(HORA_ERR_INVALID_ARG, "HORA_COST_MODEL='file:' names no file (file:PATH)");
  }
  FILE *f = fopen(path, "r");
  if (!f) {
    return hora__error_errno(HORA_ERR_INVALID_ARG,
                             "HORA_COST_MODEL=file:%s: cannot read the file (hora-info "
                             "--calibrate --save %s writes one)",
                             path, path);
  }
  char line[256];
  struct hora__cost read = {0};
  int lineno = 0, found = 0, rc = HORA_SUCCESS;
  while (rc == HORA_SUCCESS && fgets(line, sizeof(line), f)) {
    lineno++;
    line[strcspn(line, "\r\n")] = '\0';
    const char *t = line + strspn(line, " \t");
    if (t[0] == '#' || t[0] == '\0') {
      continue;
    }
    if (found++ || !parse_numbers(t, &read)) {
      rc = hora__error(HORA_ERR_INVALID_ARG,
                       "HORA_COST_MODEL=file:%s: line %d is '%.80s'; expected one line "
                       "alpha_us,beta_ns_per_byte,gamma_ns_per_byte[,op_us] (three or four "
                       "numbers >= 0), as "
                       "hora-info --calibrate --save writes it",
                       path, lineno, t);
    }
  }
  if (rc == HORA_SUCCESS && ferror(f)) {
    rc = hora__error_errno(HORA_ERR_INVALID_ARG, "HORA_COST_MODEL=file:%s: reading it", path);
  }
  fclose(f);
  if (rc == HORA_SUCCESS && !found) {
    rc = hora__error(HORA_ERR_INVALID_ARG,
                     "HORA_COST_MODEL=file:%s: no constants in it; expected a line "
                     "alpha_us,beta_ns_per_byte,gamma_ns_per_byte, as hora-info --calibrate "
                     "--save writes it",
                     path);
  }
  if (rc == HORA_SUCCESS) {
    *c = read; /* nothing changes on an error */
  }
  return rc;
}

int hora__cost_parse(const char *text, struct hora__cost *c, bool *calibrate) {
  if (calibrate) {
    *calibrate = false;
  }
  if (strcmp(text, "calibrate") == 0 && calibrate) {
    *calibrate = true;
    return HORA_SUCCESS;
  }
  if (strcmp(text, "builtin") == 0) {
    return HORA_SUCCESS; /* c keeps the transport's built-in constants */
  }
  if (strncmp(text, "file:", 5) == 0) {
    return read_file(text + 5, c);
  }
  if (!parse_numbers(text, c)) {
    return hora__error(HORA_ERR_INVALID_ARG, "HORA_COST_MODEL='%s': expected " COST_FORMS,
                       text);
  }
  return HORA_SUCCESS;
}

int hora__cost_save(const char *path, const struct hora__cost *c, const char *comment) {
  char nums[96];
  hora__cost_format(c, nums, sizeof(nums));
  FILE *f = fopen(path, "w");
  if (!f) {
    return hora__error_errno(HORA_ERR_SYSTEM, "cannot write the cost model to %s", path);
  }
  fprintf(f,
          "# %s\n# alpha_us,beta_ns_per_byte,gamma_ns_per_byte[,op_us]: "
          "HORA_COST_MODEL=file:%s\n%s\n",
          comment, path, nums);
  if (fclose(f) != 0) {
    return hora__error_errno(HORA_ERR_SYSTEM, "cannot write the cost model to %s", path);
  }
  return HORA_SUCCESS;
}

int hora__cost_builtin(const char *transport, struct hora__cost_model *m) {
  memset(m, 0, sizeof(*m));
  m->local = builtin_shm;
  if (strcmp(transport, "ib") == 0) {
    m->link = builtin_ib;
  } else if (strcmp(transport, "tcp") == 0) {
    m->link = builtin_tcp;
  } else if (strcmp(transport, "unix") == 0) {
    m->link = builtin_unix;
  } else {
    return hora__error(HORA_ERR_INVALID_ARG, "no built-in cost model for transport '%s' "
                       "(tcp, unix, ib)", transport);
  }
  snprintf(m->source, sizeof(m->source), "built-in (%s)", transport);
  return HORA_SUCCESS;
}

static pthread_mutex_t measured_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  bool have, across;
  struct hora__cost link;
  char source[sizeof(((struct hora__cost_model *)0)->source)];
} measured;

void hora__cost_remember(const hora__comm *comm, const struct hora__cost_model *m) {
  pthread_mutex_lock(&measured_mu);
  if (!measured.have) {
    measured.have = true;
    measured.across = comm->cross_size > 1;
    measured.link = m->link;
    hora__strlcpy(measured.source, m->source, sizeof(measured.source));
  }
  pthread_mutex_unlock(&measured_mu);
}

/* Whether this process measured links like comm's before; m->link gets
 * those constants. */
static bool recall_measured(const hora__comm *comm, struct hora__cost_model *m) {
  pthread_mutex_lock(&measured_mu);
  bool have = measured.have && measured.across == (comm->cross_size > 1);
  if (have) {
    m->link = measured.link;
    snprintf(m->source, sizeof(m->source), "%.200s (this process's first)", measured.source);
  }
  pthread_mutex_unlock(&measured_mu);
  return have;
}

int hora__cost_model_init(const hora__comm *comm, struct hora__cost_model *m, bool *calibrate) {
  const char *tp = comm->cross_size > 1 ? (comm->proc->ib_remote ? "ib" : "tcp")
                   : comm->proc->ib_all ? "ib"
                   : strcmp(hora__params.TRANSPORT, "tcp") == 0 ? "tcp"
                                                                 : "unix";
  *calibrate = false;
  HORA_CHECK(hora__cost_builtin(tp, m));
  /* Only rank 0's setting counts (communicator.c broadcasts its model), so
   * only its host need hold the file. */
  const char *set = hora__params.COST_MODEL;
  if (comm->rank == 0 && set[0]) {
    HORA_CHECK(hora__cost_parse(set, &m->link, calibrate));
    if (strncmp(set, "file:", 5) == 0) {
      snprintf(m->source, sizeof(m->source), "file %s (HORA_COST_MODEL)", set + 5);
    } else if (strcmp(set, "builtin") == 0) {
      snprintf(m->source, sizeof(m->source), "built-in (%s), HORA_COST_MODEL=builtin", tp);
    } else if (!*calibrate) {
      snprintf(m->source, sizeof(m->source), "HORA_COST_MODEL");
    }
  } else if (comm->rank == 0 && comm->cross_size > 1) {
    /* Links between hosts range from 1 to 400 Gbit/s, and no built-in
     * constant fits them all: measured, a fraction of a second once. */
    *calibrate = true;
  }
  if (*calibrate && recall_measured(comm, m)) {
    *calibrate = false;
  }
  return HORA_SUCCESS;
}

/* ---- calibration -------------------------------------------------------------- */

/* Sizes and repetitions: well under a second even on a 1 Gbit/s link
 * (the large swaps dominate there: about 17 ms each). */
#define SMALL_BYTES 8
#define SMALL_WARMUP 20
#define SMALL_BATCHES 5
#define SMALL_ROUNDS 40
#define LARGE_BYTES ((size_t)2 << 20)
#define LARGE_BATCHES 2
#define LARGE_ROUNDS 3
#define REDUCE_FLOATS ((size_t)1 << 20) /* 4 MiB per operand */
#define REDUCE_ROUNDS 5

/* Rank 0's partner: the first rank on another host where there are
 * several (the link between hosts is the one worth measuring), else rank
 * 1; -1 alone. */
static int calibration_partner(const hora__comm *c) {
  if (c->size < 2) {
    return -1;
  }
  if (c->cross_size > 1 && c->net->peers) {
    for (int r = 1; r < c->size; r++) {
      if (c->net->peers[r].host_index != c->net->peers[0].host_index) {
        return r;
      }
    }
  }
  return 1;
}

/* Rank 0's seconds per round, the best of `batches` batches of `rounds`.
 * A round is, with swap, len bytes each way at once over c (as every step
 * of the algorithms over connections moves them); without, a round trip:
 * rank 0 sends, the partner echoes. */
static int time_rounds(hora__comm *comm, hora__conn *c, bool first, bool swap, char *out,
                       char *in, size_t len, int batches, int rounds, double *best) {
  *best = INFINITY;
  for (int b = 0; b < batches; b++) {
    uint64_t t0 = hora__now_ns();
    for (int i = 0; i < rounds; i++) {
      if (swap) {
        HORA_CHECK(hora__exchange_step(comm, c, out, len, c, in, len));
      } else if (first) {
        HORA_CHECK(hora__exchange_step(comm, c, out, len, NULL, NULL, 0));
        HORA_CHECK(hora__exchange_step(comm, NULL, NULL, 0, c, in, len));
      } else {
        HORA_CHECK(hora__exchange_step(comm, NULL, NULL, 0, c, in, len));
        HORA_CHECK(hora__exchange_step(comm, c, out, len, NULL, NULL, 0));
      }
    }
    *best = HORA_MIN(*best, (double)(hora__now_ns() - t0) * 1e-9 / rounds);
  }
  return HORA_SUCCESS;
}

/* Seconds per byte of hora's float32 sum over REDUCE_FLOATS, in place as
 * the rings reduce: the best of REDUCE_ROUNDS after a warm-up. */
static int time_reduction(double *gamma) {
  size_t n = REDUCE_FLOATS;
  float *a = hora__malloc(n * sizeof(float)), *b = hora__malloc(n * sizeof(float));
  if (!a || !b) {
    free(a);
    free(b);
    return HORA_ERR_NO_MEMORY;
  }
  for (size_t i = 0; i < n; i++) {
    a[i] = (float)(i % 7);
    b[i] = 1.0f;
  }
  double best = INFINITY;
  for (int r = 0; r <= REDUCE_ROUNDS; r++) {
    uint64_t t0 = hora__now_ns();
    hora__reduce(HORA_FLOAT32, HORA_SUM, a, a, b, n);
    if (r > 0) { /* the first touches the pages */
      best = HORA_MIN(best, (double)(hora__now_ns() - t0) * 1e-9);
    }
  }
  free(a);
  free(b);
  *gamma = best / (double)(n * sizeof(float));
  return HORA_SUCCESS;
}

static int floor_pow2(int p) {
  int p2 = 1;
  while (p2 <= p / 2) {
    p2 *= 2;
  }
  return p2;
}

static int tree_depth(int p) {
  int depth = 0;
  while ((1L << depth) < p) {
    depth++;
  }
  return depth;
}

static double clamp(double v, double lo, double hi) { return !(v >= lo) ? lo : v > hi ? hi : v; }

/* Seconds per step of an 8-byte recursive doubling over every rank, as
 * rank 0 saw it: the median of SMALL_BATCHES batches of SMALL_ROUNDS after
 * a warm-up. Every rank steps at once, as in the algorithms and the
 * negotiation cycle, so this is the latency a step costs under the job's
 * own load (processes sharing cores, each waking for every message),
 * which an idle pair's round trip can understate several times. */
static int time_loaded_step(hora__comm *comm, double *per_step) {
  float v[2] = {0, 0};
  double batch[SMALL_BATCHES];
  for (int i = 0; i < SMALL_WARMUP; i++) {
    HORA_CHECK(hora__rd_allreduce(comm, v, v, 2, HORA_FLOAT32, HORA_SUM, HORA_FLOAT32));
  }
  for (int b = 0; b < SMALL_BATCHES; b++) {
    uint64_t t0 = hora__now_ns();
    for (int i = 0; i < SMALL_ROUNDS; i++) {
      HORA_CHECK(hora__rd_allreduce(comm, v, v, 2, HORA_FLOAT32, HORA_SUM, HORA_FLOAT32));
    }
    batch[b] = (double)(hora__now_ns() - t0) * 1e-9 / SMALL_ROUNDS;
  }
  for (int i = 1; i < SMALL_BATCHES; i++) { /* insertion sort: five numbers */
    for (int j = i; j > 0 && batch[j] < batch[j - 1]; j--) {
      double t = batch[j];
      batch[j] = batch[j - 1];
      batch[j - 1] = t;
    }
  }
  int p2 = floor_pow2(comm->size);
  int steps = tree_depth(p2) + (p2 == comm->size ? 0 : 2); /* the fold: in and out */
  *per_step = batch[SMALL_BATCHES / 2] / steps;
  return HORA_SUCCESS;
}

int hora__cost_calibrate(hora__comm *comm, struct hora__cost_model *m) {
  int partner = calibration_partner(comm);
  bool first = comm->rank == 0;
  uint64_t t0 = hora__now_ns();
  double loaded = 0;
  if (partner > 0) {
    HORA_CHECK(time_loaded_step(comm, &loaded));
  }
  if (!first && comm->rank != partner) {
    return HORA_SUCCESS; /* rank 0's result comes in the broadcast that follows */
  }
  struct hora__cost link = m->link;
  double idle = 0; /* half the pair's small round trip */
  if (partner > 0) {
    int peer = first ? partner : 0;
    if (!comm->proc->data[peer]) {
      /* Both ends ask (the partner computes the same pair). */
      HORA_CHECK(hora__comm_connect_ranks(comm, &peer, 1));
    }
    hora__conn *c = comm->proc->data[peer];
    char *out = hora__malloc(2 * LARGE_BYTES);
    if (!out) {
      return HORA_ERR_NO_MEMORY;
    }
    char *in = out + LARGE_BYTES;
    memset(out, 0, 2 * LARGE_BYTES);
    /* Alpha: the loaded step, at least half the pair's small round trip
     * (which also comes off the large swap's time). Beta: large swaps, not round trips:
     * a link moving both ways at once (two kernel copies on each end, over
     * a Unix socket) can be several times slower per byte than one way,
     * and the algorithms' steps move both ways. Warm-ups first (the large
     * one grows the socket buffers). */
    double warm, small, large;
    int rc = time_rounds(comm, c, first, false, out, in, SMALL_BYTES, 1, SMALL_WARMUP, &warm);
    if (rc == HORA_SUCCESS) {
      rc = time_rounds(comm, c, first, false, out, in, SMALL_BYTES, SMALL_BATCHES, SMALL_ROUNDS,
                       &small);
    }
    if (rc == HORA_SUCCESS) {
      rc = time_rounds(comm, c, first, true, out, in, LARGE_BYTES, 1, 1, &warm);
    }
    if (rc == HORA_SUCCESS) {
      rc = time_rounds(comm, c, first, true, out, in, LARGE_BYTES, LARGE_BATCHES, LARGE_ROUNDS,
                       &large);
    }
    free(out);
    HORA_CHECK(rc);
    if (!first) {
      return HORA_SUCCESS;
    }
    idle = small / 2;
    link.beta = (large - idle) / (double)LARGE_BYTES;
    link.alpha = HORA_MAX(idle, loaded);
  }
  HORA_CHECK(time_reduction(&link.gamma));
  /* Sane positives whatever the clock said: 0.1 us to 1 s a message,
   * 1 TB/s to 1 MB/s. */
  m->link.alpha = clamp(link.alpha, 1e-7, 1.0);
  m->link.beta = clamp(link.beta, 1e-12, 1e-6);
  m->link.gamma = clamp(link.gamma, 1e-12, 1e-6);
  double ms = (double)(hora__now_ns() - t0) * 1e-6;
  if (partner > 0) {
    const struct hora__peer_info *p = comm->net->peers;
    snprintf(m->source, sizeof(m->source),
             "calibrated at start-up in %.0f ms: rank 0 (%.40s) with rank %d (%.40s); latency: a "
             "step of all %d ranks at once (the pair alone: %.1f us)",
             ms, p ? p[0].host : "?", partner, p ? p[partner].host : "?", comm->size, idle * 1e6);
  } else {
    snprintf(m->source, sizeof(m->source),
             "calibrated at start-up in %.0f ms: the reduction only (one rank)", ms);
  }
  return HORA_SUCCESS;
}

static int per_host(const struct hora__layout *s) { return HORA_MAX(s->size / HORA_MAX(s->hosts, 1), 1); }

/* One step in which each rank moves `bytes` to a partner `dist` ranks
 * away: within the host where dist < L (ranks in blocks), else over the
 * host's link shared by the min(dist, L) ranks whose partner is away. */
static double step(const struct hora__cost_model *m, const struct hora__layout *s, long dist,
                   double bytes) {
  int L = per_host(s);
  if (s->hosts <= 1) {
    return m->link.alpha + bytes * m->link.beta;
  }
  if (dist < L && L % dist == 0 && (L & (L - 1)) == 0) {
    return m->link.alpha + bytes * m->local.beta; /* a Unix socket within the host */
  }
  return m->link.alpha + bytes * m->link.beta * (double)HORA_MIN(dist, (long)L);
}

/* The fold of a rank count that is not a power of two: data in, result
 * out, one reduction. */
static double fold(const struct hora__cost_model *m, const struct hora__layout *s, double n) {
  int p2 = floor_pow2(s->size);
  if (p2 == s->size) {
    return 0;
  }
  return 2 * step(m, s, p2, n) + n * m->link.gamma;
}

HORA_COST_FN(allreduce_ring) {
  int p = s->size;
  if (p == 1) {
    return 0;
  }
  double n = (double)bytes, seg = n / p;
  /* Hosts in blocks: the ring crosses each host's link once each way, so
   * no link is shared. Reductions overlap the next chunk's transfer; the
   * last chunk's does not. */
  return 2.0 * (p - 1) * m->link.alpha + 2.0 * (p - 1) * seg * m->link.beta +
         (p - 1) * HORA_MIN(seg, (double)s->chunk) * m->link.gamma;
}

HORA_COST_FN(allreduce_rd) {
  int p = s->size, p2 = floor_pow2(p);
  if (p == 1) {
    return 0;
  }
  double n = (double)bytes, t = fold(m, s, n);
  for (long d = 1; d < p2; d *= 2) {
    t += step(m, s, d, n) + n * m->link.gamma;
  }
  return t;
}

HORA_COST_FN(allreduce_rabenseifner) {
  int p = s->size, p2 = floor_pow2(p);
  if (p == 1) {
    return 0;
  }
  double n = (double)bytes, t = fold(m, s, n);
  for (long d = p2 / 2; d >= 1; d /= 2) {
    double moved = n * (double)d / p2;
    t += 2 * step(m, s, d, moved) + moved * m->link.gamma; /* halving, then doubling back */
  }
  return t;
}

/* The cycle's vectors and frames, as the cost of a few bytes. */
#define CYCLE_BYTES 8

double hora__operation_cost(const struct hora__cost_model *m, const struct hora__layout *s,
                            const struct hora__algo *a, size_t bytes, bool eager) {
  if (s->size < 2) {
    return a->cost(m, s, bytes);
  }
  size_t carried = 0;
  if (eager) {
    hora__eager(a->kind, bytes, s->size, &carried);
  }
  double cycle = hora__cost_allreduce_rd(m, s, CYCLE_BYTES + carried);
  return m->link.op + cycle + (eager ? 0 : a->cost(m, s, bytes));
}

bool hora__eager(enum hora__coll_kind kind, size_t bytes, int size, size_t *carried) {
  if (size < 2 || hora__params.VERIFY || hora__params.EAGER_THRESHOLD <= 0 ||
      kind > HORA_COLL_REDUCESCATTER) {
    return false;
  }
  size_t b = bytes;
  if (kind == HORA_COLL_ALLGATHER) {
    if (bytes > SIZE_MAX / (size_t)size) {
      return false;
    }
    b = bytes * (size_t)size;
  }
  if (b > (size_t)hora__params.EAGER_THRESHOLD) {
    return false;
  }
  if (carried) {
    *carried = b;
  }
  return true;
}

/* A pipeline's chunk: c, in whole KiB, between 4 KiB and `most`. */
static size_t pipeline_chunk(double c, size_t most) {
  size_t least = HORA_MIN((size_t)4096, most);
  if (!(c < (double)most)) {
    return most;
  }
  return HORA_MAX((size_t)c / 1024 * 1024, least);
}

size_t hora__tree_chunk(const struct hora__cost *link, int size, size_t bytes, size_t most) {
  /* (2 depth - 1 + H / c) steps of alpha + 4 c beta (H = bytes / 2) take
   * least at c = sqrt(H alpha / ((2 depth - 1) 4 beta)): larger chunks
   * make each of the 2 depth steps that fill the pipeline longer, smaller
   * ones pay alpha more often. */
  if (size < 2 || !(link->alpha > 0) || !(link->beta > 0)) {
    return most;
  }
  return pipeline_chunk(
      sqrt((double)bytes / 2 * link->alpha / ((2.0 * tree_depth(size) - 1) * 4 * link->beta)),
      most);
}

/* The chain's hops over links and within hosts: ranks in blocks, so it
 * crosses hosts - 1 links (every hop where each host holds one rank). */
static void chain_hops(const struct hora__layout *s, int *link, int *local) {
  if (s->hosts > 1 && s->hosts < s->size) {
    *link = s->hosts - 1;
    *local = s->size - s->hosts;
  } else {
    *link = s->size - 1;
    *local = 0;
  }
}

size_t hora__chain_chunk(const struct hora__cost_model *m, const struct hora__layout *s,
                         size_t bytes) {
  /* The last chunk leaves the root after k = n / c chunk times and needs
   * link - 1 more link hops and the local ones. Charging each chunk a
   * latency (the most a chunk's own overhead can be; the price below
   * overlaps it), (k + link - 1)(alpha + c beta) + local (alpha + c
   * beta_local) is least at c = sqrt(n alpha / ((link - 1) beta + local
   * beta_local)): smaller chunks fill the chain sooner, larger ones make
   * fewer calls. A chain of two (one hop) is one transfer: the largest
   * chunk. */
  int link, local;
  chain_hops(s, &link, &local);
  double fill = (link - 1) * m->link.beta + local * m->local.beta;
  if (link < 1 || !(m->link.alpha > 0) || !(fill > 0)) {
    return s->chunk;
  }
  return pipeline_chunk(sqrt((double)bytes * m->link.alpha / fill), s->chunk);
}

HORA_COST_FN(allreduce_tree) {
  int p = s->size, L = per_host(s), depth = tree_depth(p);
  if (p == 1) {
    return 0;
  }
  /* Each tree carries half the buffer in chunks: 2 depth steps to the
   * root and back, then one per chunk. In a step a rank sends 4 chunks
   * (up and to two children in the tree where it is inner, up in the
   * other), receives as many and reduces two. Ranks in blocks keep the
   * links shorter than L inside the host; per tree two leave each block
   * (up from its top rank, and down to the block below that hangs from
   * it), so the host's link carries 4 chunks each way per step. */
  double half = (double)bytes / 2;
  double c = HORA_MIN(half, (double)hora__tree_chunk(&m->link, p, bytes, s->chunk));
  double chunks = ceil(half / HORA_MAX(c, 1.0));
  double each = step(m, s, 1, 4 * c);
  if (s->hosts > 1 && L > 1) {
    each = HORA_MAX(each, step(m, s, L, 4 * c / L)); /* (step shares it L ways) */
  }
  return (2.0 * depth + chunks - 1) * (each + 2 * c * m->link.gamma);
}

HORA_COST_FN(allreduce_shm) {
  (void)s;
  double n = (double)bytes;
  return 2 * m->local.alpha + 2 * n * m->local.beta + n * m->local.gamma;
}

HORA_COST_FN(allreduce_hierarchical) {
  int H = s->hosts, L = per_host(s);
  double n = (double)bytes;
  /* Shared memory within the host, then each local rank's slice across
   * hosts by the cheapest algorithm, the L groups sharing the host's link. */
  double local = 2 * m->local.alpha + 2 * n * m->local.beta + n / L * m->local.gamma;
  if (H <= 1) {
    return local;
  }
  double cross;
  hora__cross_pick(s, m, HORA_COLL_ALLREDUCE, bytes / (size_t)L, &cross);
  return local + cross;
}

HORA_COST_FN(broadcast_ring) {
  int p = s->size, link, local;
  if (p == 1) {
    return 0;
  }
  chain_hops(s, &link, &local);
  double n = (double)bytes, c = HORA_MIN(n, (double)hora__chain_chunk(m, s, bytes));
  double chunks = ceil(n / HORA_MAX(c, 1.0));
  /* Each rank posts the next chunk as soon as its socket takes it, so the
   * chunks' latencies overlap: the pipeline pays it once per hop as it
   * fills, then one chunk's transfer per chunk (8 x 1 at 256 KiB: 2.2 ms
   * measured, 4.1 priced with a latency per chunk and hop). */
  return (link + local) * m->link.alpha + (link - 1 + chunks) * c * m->link.beta +
         local * c * m->local.beta;
}

HORA_COST_FN(broadcast_binomial) {
  int p = s->size;
  double t = 0;
  for (long d = 1; d < p; d *= 2) {
    t += step(m, s, d, (double)bytes);
  }
  return t;
}

HORA_COST_FN(broadcast_scatter_allgather) {
  int p = s->size;
  if (p == 1) {
    return 0;
  }
  double n = (double)bytes, t = 0;
  /* The tree's longest path carries what the root sends: at distance d,
   * the blocks of d ranks (fewer in the last, partial subtree). */
  for (long d = 1; d < p; d *= 2) {
    t += step(m, s, d, n * (double)HORA_MIN(d, (long)p - d) / p);
  }
  /* The ring's allgather of the p blocks. */
  return t + (p - 1) * (m->link.alpha + n / p * m->link.beta);
}

HORA_COST_FN(broadcast_shm) {
  (void)s;
  return 2 * m->local.alpha + 2 * (double)bytes * m->local.beta;
}

HORA_COST_FN(broadcast_hierarchical) {
  /* The root's local rank across hosts, alone on the links, then each
   * host's segment. */
  double local = hora__cost_broadcast_shm(m, s, bytes);
  if (s->hosts <= 1) {
    return local;
  }
  double cross;
  hora__cross_pick(s, m, HORA_COLL_BROADCAST, bytes, &cross);
  return local + cross;
}

HORA_COST_FN(allgather_ring) {
  int p = s->size;
  return (p - 1) * (m->link.alpha + (double)bytes * m->link.beta);
}

HORA_COST_FN(allgather_bruck) {
  int p = s->size;
  double t = (double)p * (double)bytes * m->local.beta; /* the final rotation */
  for (long k = 1; k < p; k *= 2) {
    t += step(m, s, k, (double)HORA_MIN(k, (long)p - k) * (double)bytes);
  }
  return t;
}

HORA_COST_FN(allgather_shm) {
  /* Per piece: each rank's block into its half, a barrier, every block out. */
  return 2 * m->local.alpha + (double)(s->size + 1) * (double)bytes * m->local.beta;
}

HORA_COST_FN(allgather_hierarchical) {
  int H = s->hosts, L = per_host(s);
  /* Each local rank's column (a block per host) across hosts, the L
   * groups sharing the host's link; then per piece each column into its
   * half, a barrier, the L - 1 others out. */
  double column = (double)H * (double)bytes;
  double local = 2 * m->local.alpha + (double)L * column * m->local.beta;
  if (H <= 1) {
    return local;
  }
  double cross;
  hora__cross_pick(s, m, HORA_COLL_ALLGATHER, bytes, &cross);
  return local + cross;
}

HORA_COST_FN(reducescatter_ring) {
  int p = s->size;
  if (p == 1) {
    return 0;
  }
  double n = (double)bytes, seg = n / p;
  return (p - 1) * (m->link.alpha + seg * m->link.beta) +
         (p - 1) * HORA_MIN(seg, (double)s->chunk) * m->link.gamma;
}

HORA_COST_FN(reducescatter_allreduce) {
  const struct hora__algo *a = hora__algo_pick(s, m, HORA_COLL_ALLREDUCE, bytes);
  return a->cost(m, s, bytes) + (double)bytes * m->local.beta; /* and the copy of one block */
}

HORA_COST_FN(reducescatter_halving) {
  int p = s->size, p2 = floor_pow2(p);
  if (p == 1) {
    return 0;
  }
  double n = (double)bytes, t = n * m->local.beta; /* the input copied in the halving's order */
  if (p2 != p) {
    /* The fold: the whole in, one block out. */
    t += step(m, s, p2, n) + n * m->link.gamma + step(m, s, p2, n / p);
  }
  for (long d = p2 / 2; d >= 1; d /= 2) {
    double moved = n * (double)d / p2;
    t += step(m, s, d, moved) + moved * m->link.gamma;
  }
  return t;
}
