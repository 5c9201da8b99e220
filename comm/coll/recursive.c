/* The logarithmic algorithms: a point-to-point schedule of log2(p) steps
 * each, for operations where latency, not bandwidth, bounds the time.
 *
 *   recursive doubling (allreduce): in step k rank r swaps its whole
 *     buffer with r ^ 2^k and reduces; log2 p steps of n bytes.
 *   Rabenseifner (allreduce): a reduce-scatter by recursive halving (step
 *     k swaps half of what is left with r ^ 2^(L-1-k)), then an allgather
 *     by recursive doubling retracing it; 2 log2 p steps, 2n(p-1)/p bytes.
 *   binomial tree (broadcast): relative rank v = r - root receives from
 *     v - lowbit(v) and sends to v + 2^j for each 2^j below lowbit(v).
 *   Bruck (allgather): in step k rank r sends the 2^k blocks it has to
 *     r - 2^k and receives as many from r + 2^k; any p, ceil(log2 p) steps.
 *   scatter + allgather (broadcast, van de Geijn): the root's buffer cut
 *     into p blocks goes down the binomial tree, each subtree's blocks in
 *     one piece, so that every rank ends with its own block; then the
 *     ring allgathers the blocks. About 2n bytes per rank, where the tree
 *     moves n per step.
 *   recursive halving (reducescatter): Rabenseifner's first half, its
 *     split at the blocks' bounds so that each rank ends with its own.
 *
 * Rank counts that are not powers of two fold for the reductions: with p2
 * the largest power of two <= p, rank r >= p2 hands its data to r - p2
 * and takes the result back from it, so p2 ranks run the schedule:
 *
 *   p = 6, p2 = 4      4 -> 0   5 -> 1      (fold in)
 *                      0 <-> 1  2 <-> 3     (step 0)
 *                      0 <-> 2  1 <-> 3     (step 1)
 *                      0 -> 4   1 -> 5      (fold out)
 *
 * Every step is one hora__exchange_step: the send and the receive go at
 * once, pipelined in chunks, sleeping in poll while the network works.
 *
 * Compressed (wire dtype != dtype): data goes narrowed. Where two ranks
 * compute the same values (recursive doubling), each first rounds its own
 * copy through the wire type, so that both add the same two operands and
 * every rank ends with the same bits; in Rabenseifner each block's owner
 * rounds it once before the allgather, as the ring does. */
#include <stdlib.h>

#include "comm/coll/collectives.h"
#include "comm/reduce/reduce.h"

static int floor_pow2(int p) {
  int p2 = 1;
  while (p2 <= p / 2) {
    p2 *= 2;
  }
  return p2;
}

static int add_partner(int *out, int n, int peer, int self) {
  if (peer == self) {
    return n;
  }
  for (int i = 0; i < n; i++) {
    if (out[i] == peer) {
      return n;
    }
  }
  out[n] = peer;
  return n + 1;
}

int hora__coll_partners(int pos, int size, int *out) {
  int n = 0, p2 = floor_pow2(size);
  for (long d = 1; d < size; d *= 2) {
    n = add_partner(out, n, (int)((pos + d) % size), pos);
    n = add_partner(out, n, (int)((pos - d + size) % size), pos);
    if (pos < p2 && d < p2) {
      n = add_partner(out, n, pos ^ (int)d, pos);
    }
  }
  if (pos >= p2) {
    n = add_partner(out, n, pos - p2, pos);
  } else if (pos + p2 < size) {
    n = add_partner(out, n, pos + p2, pos);
  }
  return n;
}

int hora__comm_connect_partners(hora__comm *comm) {
  if (comm->partners || comm->all_pairs || (comm->size <= 2 && !comm->hierarchical)) {
    return HORA_SUCCESS;
  }
  int want[6 * 32], n = hora__coll_partners(comm->rank, comm->size, want);
  if (comm->hierarchical) {
    /* And the hierarchical allreduce's across hosts: the members with this
     * rank's local rank. */
    int hosts[3 * 32], nh = hora__coll_partners(comm->cross_rank, comm->cross_size, hosts);
    for (int i = 0; i < nh; i++) {
      n = add_partner(want, n, hora__comm_rank_on_host(comm, hosts[i]), comm->rank);
    }
  }
  /* An idle rank refuses connections: first every member reaches this
   * operation. */
  HORA_CHECK(hora__comm_all_arrived(comm));
  HORA_CHECK(hora__comm_connect_ranks(comm, want, n));
  comm->partners = true;
  return HORA_SUCCESS;
}

/* comm->temp of at least `bytes`. */
static int temp_get(hora__comm *comm, size_t bytes, char **out) {
  HORA_CHECK(
      hora__comm_grow_registered(comm, &comm->temp, &comm->temp_bytes, &comm->temp_reg, bytes));
  *out = comm->temp;
  return HORA_SUCCESS;
}

/* The ranks a schedule runs over: every member (positions are ranks), or
 * one member per host, those with this rank's local rank (positions are
 * hosts: the hierarchical allreduce's step across hosts). */
struct group {
  hora__comm *comm;
  int pos, size;
  bool cross;
};

static struct group world_group(hora__comm *comm) {
  return (struct group){comm, comm->rank, comm->size, false};
}

static struct group cross_group(hora__comm *comm) {
  return (struct group){comm, comm->cross_rank, comm->cross_size, true};
}

static hora__conn *conn_to(const struct group *g, int pos) {
  return g->comm->proc->data[g->cross ? hora__comm_rank_on_host(g->comm, pos) : pos];
}

static int send_to(const struct group *g, int peer, const void *buf, size_t len) {
  return hora__exchange_step(g->comm, conn_to(g, peer), buf, len, NULL, NULL, 0);
}

static int recv_from(const struct group *g, int peer, void *buf, size_t len) {
  return hora__exchange_step(g->comm, NULL, NULL, 0, conn_to(g, peer), buf, len);
}

static int swap_with(const struct group *g, int peer, const void *send, size_t send_len,
                     void *recv, size_t recv_len) {
  hora__conn *c = conn_to(g, peer);
  return hora__exchange_step(g->comm, c, send, send_len, c, recv, recv_len);
}

/* What the allreduces share: the fold and the buffers. */
struct rd {
  hora__comm *comm;
  struct group g;
  char *buf;
  size_t count, es, ws; /* elements; bytes per element in memory and on the wire */
  hora_dtype dtype, wire;
  hora_op op;
  bool compressed;
  int p2;
  char *tmp;   /* receives: count wire elements */
  char *stage; /* compressed sends: count wire elements */
};

/* buf NULL: the buffer is count elements of temp's own, in front of the
 * receive and staging space. */
static int rd_begin(struct rd *s, const struct group *g, void *buf, size_t count,
                    hora_dtype dtype, hora_op op, hora_dtype wire) {
  hora__comm *comm = g->comm;
  *s = (struct rd){.comm = comm, .g = *g, .buf = buf, .count = count, .dtype = dtype,
                   .wire = wire, .op = op, .es = hora_dtype_size(dtype),
                   .ws = hora_dtype_size(wire), .compressed = wire != dtype,
                   .p2 = floor_pow2(g->size)};
  HORA_CHECK(hora__comm_connect_partners(comm));
  char *t;
  size_t own = buf ? 0 : count * s->es;
  HORA_CHECK(temp_get(comm, own + count * s->ws * (s->compressed ? 2 : 1), &t));
  if (!buf) {
    s->buf = t;
  }
  s->tmp = t + own;
  s->stage = s->tmp + count * s->ws;
  return HORA_SUCCESS;
}

/* Elements [lo, lo + n) of the buffer as they go on the wire. */
static const void *outgoing(struct rd *s, size_t lo, size_t n) {
  if (!s->compressed) {
    return s->buf + lo * s->es;
  }
  hora__compress(s->wire, (uint16_t *)(void *)(s->stage + lo * s->ws), s->dtype,
                 s->buf + lo * s->es, n);
  return s->stage + lo * s->ws;
}

/* buf[lo, lo + n) = buf op what arrived in tmp[lo, lo + n). */
static void reduce_in(struct rd *s, size_t lo, size_t n) {
  char *dst = s->buf + lo * s->es;
  if (s->compressed) {
    hora__reduce_wire(s->dtype, s->op, dst, s->wire, (const uint16_t *)(void *)(s->tmp + lo * s->ws),
                      dst, n);
  } else {
    hora__reduce(s->dtype, s->op, dst, dst, s->tmp + lo * s->es, n);
  }
}

/* Rounds buf[lo, lo + n) through the wire type (compressed only). */
static void round_own(struct rd *s, size_t lo, size_t n) {
  if (s->compressed) {
    uint16_t *w = (uint16_t *)(void *)(s->stage + lo * s->ws);
    hora__compress(s->wire, w, s->dtype, s->buf + lo * s->es, n);
    hora__decompress(s->dtype, s->buf + lo * s->es, s->wire, w, n);
  }
}

/* Fold in: ranks beyond p2 hand their data over. *out: this rank sat the
 * schedule out (it takes the result in fold_out). */
static int fold_in(struct rd *s, bool *out) {
  int r = s->g.pos, p = s->g.size;
  *out = r >= s->p2;
  if (*out) {
    return send_to(&s->g, r - s->p2, outgoing(s, 0, s->count), s->count * s->ws);
  }
  if (r + s->p2 < p) {
    HORA_CHECK(recv_from(&s->g, r + s->p2, s->tmp, s->count * s->ws));
    reduce_in(s, 0, s->count);
  }
  return HORA_SUCCESS;
}

/* Fold out: the result, whole (the ranks it goes to computed nothing). */
static int fold_out(struct rd *s, bool out) {
  int r = s->g.pos, p = s->g.size;
  if (out) {
    return recv_from(&s->g, r - s->p2, s->buf, s->count * s->es);
  }
  if (r + s->p2 < p) {
    return send_to(&s->g, r + s->p2, s->buf, s->count * s->es);
  }
  return HORA_SUCCESS;
}

/* dst = src, where the allreduces below work in place. */
static void take_input(const void *src, void *dst, size_t bytes) {
  if (src != dst && bytes) {
    memcpy(dst, src, bytes);
  }
}

static int rd_run(const struct group *g, void *buf, size_t count, hora_dtype dtype, hora_op op,
                  hora_dtype wire) {
  if (g->size == 1 || count == 0) {
    return HORA_SUCCESS;
  }
  struct rd s;
  bool out;
  HORA_CHECK(rd_begin(&s, g, buf, count, dtype, op, wire));
  HORA_CHECK(fold_in(&s, &out));
  for (int mask = 1; !out && mask < s.p2; mask *= 2) {
    round_own(&s, 0, count);
    HORA_CHECK(swap_with(g, g->pos ^ mask, outgoing(&s, 0, count), count * s.ws, s.tmp,
                         count * s.ws));
    reduce_in(&s, 0, count);
  }
  return fold_out(&s, out);
}

/* One step of the halving: the range both partners held, the part this
 * rank kept, and the partner. */
struct halving {
  size_t lo, hi, keep_lo, keep_hi;
  int peer;
};

/* Reduce-scatter by recursive halving among the p2 ranks of the schedule:
 * each step keeps the half of the range both partners hold that this
 * rank's bit names and sends the other. Rank r ends with part r complete:
 * elements [at[r], at[r + 1]) (at: p2 + 1 bounds), or with at NULL the
 * r-th of halves of halves. steps (may be NULL): each step, for the way
 * back, *nsteps of them; [*lo, *hi): the part. */
static int halve(struct rd *s, const size_t *at, struct halving *steps, int *nsteps, size_t *lo,
                 size_t *hi) {
  int r = s->g.pos, first = 0; /* the first rank of the range's half of the group */
  *lo = 0;
  *hi = s->count;
  for (int mask = s->p2 / 2; mask >= 1; mask /= 2) {
    size_t mid = at ? at[first + mask] : *lo + (*hi - *lo) / 2;
    bool lower = (r & mask) == 0;
    size_t klo = lower ? *lo : mid, khi = lower ? mid : *hi;
    size_t slo = lower ? mid : *lo, shi = lower ? *hi : mid;
    HORA_CHECK(swap_with(&s->g, r ^ mask, outgoing(s, slo, shi - slo), (shi - slo) * s->ws,
                         s->tmp + klo * s->ws, (khi - klo) * s->ws));
    reduce_in(s, klo, khi - klo);
    if (steps) {
      steps[(*nsteps)++] = (struct halving){*lo, *hi, klo, khi, r ^ mask};
    }
    first += lower ? 0 : mask;
    *lo = klo;
    *hi = khi;
  }
  return HORA_SUCCESS;
}

static int rabenseifner_run(const struct group *g, void *buf, size_t count, hora_dtype dtype,
                            hora_op op, hora_dtype wire) {
  if (g->size == 1 || count == 0) {
    return HORA_SUCCESS;
  }
  struct rd s;
  bool out;
  HORA_CHECK(rd_begin(&s, g, buf, count, dtype, op, wire));
  HORA_CHECK(fold_in(&s, &out));
  if (!out) {
    /* Reduce-scatter by recursive halving: at the end rank r owns block r
     * of p2. */
    struct halving steps[32];
    int nsteps = 0;
    size_t lo, hi;
    HORA_CHECK(halve(&s, NULL, steps, &nsteps, &lo, &hi));
    /* Allgather by recursive doubling, retracing the halving. */
    round_own(&s, lo, hi - lo);
    while (nsteps-- > 0) {
      size_t klo = steps[nsteps].keep_lo, khi = steps[nsteps].keep_hi;
      size_t olo = klo == steps[nsteps].lo ? khi : steps[nsteps].lo;
      size_t ohi = klo == steps[nsteps].lo ? steps[nsteps].hi : klo;
      void *into = s.compressed ? s.tmp + olo * s.ws : s.buf + olo * s.es;
      HORA_CHECK(swap_with(g, steps[nsteps].peer, outgoing(&s, klo, khi - klo),
                           (khi - klo) * s.ws, into, (ohi - olo) * s.ws));
      if (s.compressed) {
        hora__decompress(dtype, s.buf + olo * s.es, wire,
                         (const uint16_t *)(void *)(s.tmp + olo * s.ws), ohi - olo);
      }
    }
  }
  return fold_out(&s, out);
}

int hora__halving_reducescatter(hora__comm *comm, const void *sendbuf, void *recvbuf,
                                const size_t *starts, const size_t *lens, double prescale,
                                hora_dtype dtype, hora_op op, hora_dtype wire) {
  int p = comm->size, me = comm->rank, p2 = floor_pow2(p);
  size_t es = hora_dtype_size(dtype);
  /* Rank q < p2 reduces, in one piece, its block and that of q + p2, which
   * folds into it: the input is laid out in that order (part q of the
   * halving: elements [at[q], at[q + 1])), so blocks in any place and of
   * any size split where they end, and nothing else is reduced. */
  size_t *at = hora__malloc(((size_t)p2 + 1) * sizeof(*at));
  if (!at) {
    return HORA_ERR_NO_MEMORY;
  }
  at[0] = 0;
  for (int q = 0; q < p2; q++) {
    at[q + 1] = at[q] + lens[q] + (q + p2 < p ? lens[q + p2] : 0);
  }
  int rc = HORA_SUCCESS;
  struct rd s;
  struct group g = world_group(comm);
  bool out = false;
  if (at[p2] == 0) {
    goto done; /* every block is empty */
  }
  rc = rd_begin(&s, &g, NULL, at[p2], dtype, op, wire);
  if (rc != HORA_SUCCESS) {
    goto done;
  }
  for (int q = 0; q < p2; q++) {
    const char *in = sendbuf;
    memcpy(s.buf + at[q] * es, in + starts[q] * es, lens[q] * es);
    if (q + p2 < p) {
      memcpy(s.buf + (at[q] + lens[q]) * es, in + starts[q + p2] * es, lens[q + p2] * es);
    }
  }
  if (prescale != 1.0) {
    hora__scale(dtype, s.buf, at[p2], prescale);
  }
  rc = fold_in(&s, &out);
  if (rc == HORA_SUCCESS && !out) {
    size_t lo, hi;
    rc = halve(&s, at, NULL, NULL, &lo, &hi);
  }
  /* Fold out: only the folded rank's block, in full precision. */
  if (rc == HORA_SUCCESS && out) {
    rc = recv_from(&g, me - p2, recvbuf, lens[me] * es);
  } else if (rc == HORA_SUCCESS) {
    if (me + p2 < p) {
      rc = send_to(&g, me + p2, s.buf + (at[me] + lens[me]) * es, lens[me + p2] * es);
    }
    if (rc == HORA_SUCCESS && lens[me]) {
      memcpy(recvbuf, s.buf + at[me] * es, lens[me] * es);
    }
  }
done:
  free(at);
  return rc;
}

int hora__rd_allreduce(hora__comm *comm, const void *src, void *buf, size_t count,
                       hora_dtype dtype, hora_op op, hora_dtype wire) {
  take_input(src, buf, count * hora_dtype_size(dtype));
  struct group g = world_group(comm);
  return rd_run(&g, buf, count, dtype, op, wire);
}

int hora__rabenseifner_allreduce(hora__comm *comm, const void *src, void *buf, size_t count,
                                 hora_dtype dtype, hora_op op, hora_dtype wire) {
  take_input(src, buf, count * hora_dtype_size(dtype));
  struct group g = world_group(comm);
  return rabenseifner_run(&g, buf, count, dtype, op, wire);
}

int hora__cross_allreduce(hora__comm *comm, void *buf, size_t count, hora_dtype dtype,
                          hora_op op, hora_dtype wire) {
  const struct hora__algo *a =
      hora__cross_algorithm(comm, HORA_COLL_ALLREDUCE, count * hora_dtype_size(dtype));
  struct group g = cross_group(comm);
  if (strcmp(a->name, "rd") == 0) {
    return rd_run(&g, buf, count, dtype, op, wire);
  }
  if (strcmp(a->name, "rabenseifner") == 0) {
    return rabenseifner_run(&g, buf, count, dtype, op, wire);
  }
  if (strcmp(a->name, "tree") == 0) {
    return hora__tree_run(comm, true, buf, count, dtype, op, wire);
  }
  return hora__ring_allreduce(comm, &comm->cross_ring, buf, buf, count, dtype, op, wire);
}

/* The binomial tree over g from position root. */
static int binomial_run(const struct group *g, void *buf, size_t bytes, int root) {
  int p = g->size;
  int v = (g->pos - root + p) % p;
  int mask = 1;
  while (mask < p) {
    if (v & mask) {
      HORA_CHECK(recv_from(g, (v - mask + root) % p, buf, bytes));
      break;
    }
    mask *= 2;
  }
  for (mask /= 2; mask > 0; mask /= 2) {
    if (v + mask < p) {
      HORA_CHECK(send_to(g, (v + mask + root) % p, buf, bytes));
    }
  }
  return HORA_SUCCESS;
}

int hora__binomial_broadcast(hora__comm *comm, void *buf, size_t bytes, int root) {
  if (comm->size == 1 || bytes == 0) {
    return HORA_SUCCESS;
  }
  HORA_CHECK(hora__comm_connect_partners(comm));
  struct group g = world_group(comm);
  return binomial_run(&g, buf, bytes, root);
}

/* Bruck over g: position q's block lands at recvbuf + at[q]. */
static int bruck_run(const struct group *g, const void *sendbuf, size_t bytes, void *recvbuf,
                     const size_t *at) {
  int p = g->size, r = g->pos;
  /* Gathered in temp rotated so that this rank's block is first, then put
   * in place. */
  char *t;
  HORA_CHECK(temp_get(g->comm, (size_t)p * bytes, &t));
  memcpy(t, sendbuf, bytes);
  for (int k = 1; k < p; k *= 2) {
    size_t n = (size_t)HORA_MIN(k, p - k) * bytes;
    HORA_CHECK(hora__exchange_step(g->comm, conn_to(g, (r - k + p) % p), t, n,
                                   conn_to(g, (r + k) % p), t + (size_t)k * bytes, n));
  }
  for (int i = 0; i < p; i++) {
    memcpy((char *)recvbuf + at[(r + i) % p], t + (size_t)i * bytes, bytes);
  }
  return HORA_SUCCESS;
}

int hora__bruck_allgather(hora__comm *comm, const void *sendbuf, size_t bytes, void *recvbuf) {
  int p = comm->size, r = comm->rank;
  if (p == 1 || bytes == 0) {
    if (bytes && (char *)recvbuf + (size_t)r * bytes != sendbuf) {
      memmove((char *)recvbuf + (size_t)r * bytes, sendbuf, bytes);
    }
    return HORA_SUCCESS;
  }
  HORA_CHECK(hora__comm_connect_partners(comm));
  size_t *at = hora__malloc((size_t)p * sizeof(*at));
  if (!at) {
    return HORA_ERR_NO_MEMORY;
  }
  for (int q = 0; q < p; q++) {
    at[q] = (size_t)q * bytes;
  }
  struct group g = world_group(comm);
  int rc = bruck_run(&g, sendbuf, bytes, recvbuf, at);
  free(at);
  return rc;
}

/* Start of relative block b of bytes split among p (b = p: the end). */
static size_t block_at(size_t bytes, int p, int b) {
  size_t start, len;
  if (b >= p) {
    return bytes;
  }
  hora__block_range(bytes, 1, p, b, &start, &len);
  return start;
}

/* The scatter + allgather broadcast over g from position root; ring: g's
 * ring (the same members in the same order). */
static int scatter_allgather_run(const struct group *g, const struct hora__ring_view *ring,
                                 void *buf, size_t bytes, int root) {
  int p = g->size;
  char *b = buf;
  /* The binomial tree of the broadcast, each edge carrying the blocks of
   * the subtree below it (relative ranks v .. v + mask - 1: one piece). */
  int v = (g->pos - root + p) % p;
  long mask = 1;
  while (mask < p) {
    if (v & mask) {
      size_t lo = block_at(bytes, p, v), hi = block_at(bytes, p, (int)HORA_MIN(v + mask, p));
      HORA_CHECK(recv_from(g, (int)((v - mask + root) % p), b + lo, hi - lo));
      break;
    }
    mask *= 2;
  }
  for (mask /= 2; mask > 0; mask /= 2) {
    if (v + mask < p) {
      size_t lo = block_at(bytes, p, (int)(v + mask));
      size_t hi = block_at(bytes, p, (int)HORA_MIN(v + 2 * mask, p));
      HORA_CHECK(send_to(g, (int)((v + mask + root) % p), b + lo, hi - lo));
    }
  }
  /* The ring's allgather: position q holds relative block q - root. */
  size_t *len = hora__malloc(2 * (size_t)p * sizeof(*len));
  if (!len) {
    return HORA_ERR_NO_MEMORY;
  }
  size_t *at = len + p;
  for (int q = 0; q < p; q++) {
    int rel = (q - root + p) % p;
    at[q] = block_at(bytes, p, rel);
    len[q] = block_at(bytes, p, rel + 1) - at[q];
  }
  int rc = hora__ring_allgatherv(g->comm, ring, b + at[g->pos], len, b, at);
  free(len);
  return rc;
}

int hora__scatter_allgather_broadcast(hora__comm *comm, void *buf, size_t bytes, int root) {
  if (comm->size == 1 || bytes == 0) {
    return HORA_SUCCESS;
  }
  HORA_CHECK(hora__comm_connect_partners(comm));
  struct group g = world_group(comm);
  return scatter_allgather_run(&g, &comm->world_ring, buf, bytes, root);
}

/* The hierarchical algorithms' steps across hosts. Their partners (and the
 * cross ring's) are connected already: every member connects its partners
 * at the start of the operation, whether or not it crosses hosts in it. */

int hora__cross_broadcast(hora__comm *comm, void *buf, size_t bytes, int root_host) {
  if (comm->cross_size == 1 || bytes == 0) {
    return HORA_SUCCESS;
  }
  const struct hora__algo *a = hora__cross_algorithm(comm, HORA_COLL_BROADCAST, bytes);
  struct group g = cross_group(comm);
  if (strcmp(a->name, "binomial") == 0) {
    return binomial_run(&g, buf, bytes, root_host);
  }
  if (strcmp(a->name, "scatter_allgather") == 0) {
    return scatter_allgather_run(&g, &comm->cross_ring, buf, bytes, root_host);
  }
  struct hora__layout s, x;
  hora__comm_layout(comm, &s);
  hora__cross_layout(&s, &x);
  return hora__ring_broadcast(comm, &comm->cross_ring, buf, bytes, root_host,
                              hora__chain_chunk(&comm->model, &x, bytes));
}

int hora__cross_allgather(hora__comm *comm, const void *sendbuf, size_t bytes, void *recvbuf,
                          const size_t *at) {
  int H = comm->cross_size;
  if (H == 1 || bytes == 0) {
    if (bytes && (char *)recvbuf + at[comm->cross_rank] != sendbuf) {
      memmove((char *)recvbuf + at[comm->cross_rank], sendbuf, bytes);
    }
    return HORA_SUCCESS;
  }
  const struct hora__algo *a = hora__cross_algorithm(comm, HORA_COLL_ALLGATHER, bytes);
  struct group g = cross_group(comm);
  if (strcmp(a->name, "bruck") == 0) {
    return bruck_run(&g, sendbuf, bytes, recvbuf, at);
  }
  size_t *len = hora__malloc((size_t)H * sizeof(*len));
  if (!len) {
    return HORA_ERR_NO_MEMORY;
  }
  for (int h = 0; h < H; h++) {
    len[h] = bytes;
  }
  int rc = hora__ring_allgatherv(comm, &comm->cross_ring, sendbuf, len, recvbuf, at);
  free(len);
  return rc;
}
