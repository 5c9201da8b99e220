/* The alpha-beta-gamma cost model the selector chooses by (select.c).
 *
 * A message of n bytes between two ranks costs alpha + n * beta; reducing
 * n bytes costs n * gamma. Each algorithm's prediction adds its steps'
 * costs. Where hosts hold several ranks (L = size / hosts, placed in blocks
 * as launchers place them), a step in which all L ranks of a host talk to
 * other hosts at once shares the host's link: its bytes cost L * beta;
 * steps between ranks of one host cost the local constants.
 *
 * The constants: HORA_COST_MODEL (measured by scripts/scale-bench.sh
 * --fit, or by hand), else built-in ones per transport, measured on a
 * small cluster of this project's test machines; rank 0's are used by all
 * (communicator.c), so that every rank chooses alike. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/params.h"
#include "comm/coll/collectives.h"

/* Built-in constants (alpha s, beta s/B, gamma s/B). Sockets between
 * hosts: a 10 Gbit/s class link and a poll wake-up per message; Unix
 * sockets within a host (two copies through the kernel per byte, so never
 * cheaper than the shared segment); RDMA; the host's shared segment (one
 * copy in, one out, or the kernel's single copy). */
static const struct hora__cost builtin_tcp = {60e-6, 1.0e-9, 0.25e-9};
static const struct hora__cost builtin_unix = {25e-6, 0.6e-9, 0.25e-9};
static const struct hora__cost builtin_ib = {8e-6, 0.1e-9, 0.25e-9};
static const struct hora__cost builtin_shm = {6e-6, 0.1e-9, 0.25e-9};

int hora__cost_parse(const char *text, struct hora__cost *c) {
  double a, b, g;
  char extra;
  if (sscanf(text, "%lf,%lf,%lf %c", &a, &b, &g, &extra) != 3 || !(a >= 0) || !(b >= 0) ||
      !(g >= 0) || !isfinite(a) || !isfinite(b) || !isfinite(g)) {
    return hora__error(HORA_ERR_INVALID_ARG,
                       "HORA_COST_MODEL='%s': expected alpha_us,beta_ns_per_byte,"
                       "gamma_ns_per_byte (three numbers >= 0, e.g. 60,8,0.25)",
                       text);
  }
  *c = (struct hora__cost){a * 1e-6, b * 1e-9, g * 1e-9};
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

int hora__cost_model_init(const hora__comm *comm, struct hora__cost_model *m) {
  const char *tp = comm->cross_size > 1 ? (comm->proc->ib_remote ? "ib" : "tcp")
                   : comm->proc->ib_all ? "ib"
                   : strcmp(hora__params.TRANSPORT, "tcp") == 0 ? "tcp"
                                                                 : "unix";
  HORA_CHECK(hora__cost_builtin(tp, m));
  if (hora__params.COST_MODEL[0]) {
    HORA_CHECK(hora__cost_parse(hora__params.COST_MODEL, &m->link));
    snprintf(m->source, sizeof(m->source), "HORA_COST_MODEL");
  }
  return HORA_SUCCESS;
}

static int floor_pow2(int p) {
  int p2 = 1;
  while (p2 <= p / 2) {
    p2 *= 2;
  }
  return p2;
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
  hora__cross_pick(s, m, bytes / (size_t)L, &cross);
  return local + cross;
}

HORA_COST_FN(broadcast_ring) {
  int p = s->size;
  if (p == 1) {
    return 0;
  }
  double n = (double)bytes, c = HORA_MIN(n, (double)s->chunk);
  double chunks = ceil(n / HORA_MAX(c, 1.0));
  return (p - 2 + chunks) * (m->link.alpha + c * m->link.beta);
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
