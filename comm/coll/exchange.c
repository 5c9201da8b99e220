/* Allgatherv and alltoall: blocks whose size differs by rank (allgatherv)
 * or by pair of ranks (alltoall). Every member knows every size before it
 * starts (the runtime exchanges them first), so all take the same steps.
 *
 * Over the connections (sockets or RDMA):
 *   - allgatherv is the ring allgather with each rank's own block size:
 *     rank r forwards block r - t and receives block r - t - 1 in step t,
 *     the steps one pipeline;
 *   - alltoall is the pairwise exchange: rank r sends its block for r + k
 *     and receives the block of r - k for every k (1 .. p-1) over a
 *     connection to every member, made on first use and kept; all the
 *     blocks move at once, each pipelined in chunks.
 * Within one host, each rank reads its blocks straight out of the peers'
 * sendbufs with the kernel where the host's path table picks the kernel
 * for blocks this large (shm_coll.c), and otherwise they go through the
 * shared segment's two halves, a barrier per round, like the shared-memory
 * allgather. */
#include <stdlib.h>

#include "comm/coll/collectives.h"
#include "comm/shm/shm.h"

/* ---- one step over two connections ------------------------------------------ */

struct step {
  const char *send;
  char *recv;
  size_t send_len, recv_len, chunk;
};

static size_t chunks(size_t bytes, size_t chunk) { return (bytes + chunk - 1) / chunk; }

static void piece(size_t i, size_t chunk, size_t len, size_t *off, size_t *n) {
  *off = i * chunk;
  *n = HORA_MIN(chunk, len - *off);
}

static void step_send_at(void *arg, size_t i, const void **ptr, size_t *len, bool *scratch) {
  struct step *s = arg;
  size_t off;
  piece(i, s->chunk, s->send_len, &off, len);
  *ptr = s->send + off;
  *scratch = false;
}

static void step_recv_at(void *arg, size_t i, void **ptr, size_t *len, bool *scratch) {
  struct step *s = arg;
  size_t off;
  piece(i, s->chunk, s->recv_len, &off, len);
  *ptr = s->recv + off;
  *scratch = false;
}

/* Sends send_len bytes to `to` while receiving recv_len bytes from `from`,
 * in pipelined chunks; either length may be 0. */
int hora__exchange_step(hora__comm *comm, hora__conn *to, const void *send, size_t send_len,
                        hora__conn *from, void *recv, size_t recv_len) {
  struct step s = {send, recv, send_len, recv_len, (size_t)comm->proc->chunk_bytes};
  struct hora__ring ring = {
      .next = to,
      .prev = from,
      .nsend = chunks(send_len, s.chunk),
      .nrecv = chunks(recv_len, s.chunk),
      .arg = &s,
      .send_at = step_send_at,
      .recv_at = step_recv_at,
  };
  return hora__ring_run(comm, &ring);
}

static void offsets(const size_t *bytes, int p, size_t *at) {
  size_t o = 0;
  for (int j = 0; j < p; j++) {
    at[j] = o;
    o += bytes[j];
  }
}

int hora__comm_all_arrived(hora__comm *comm) {
  /* Over the ring's own connections, whichever algorithm the registry
   * would pick for an allgather (some need the very connections this
   * precedes). */
  char *all = hora__malloc((size_t)comm->size);
  if (!all) {
    return HORA_ERR_NO_MEMORY;
  }
  char one = 1;
  int rc = hora__ring_allgather(comm, &comm->world_ring, &one, 1, all);
  free(all);
  return rc;
}

int hora__comm_connect_peers_agreed(hora__comm *comm) {
  if (comm->all_pairs || comm->size == 1) {
    return HORA_SUCCESS;
  }
  /* An idle rank refuses connections: first every member reaches this
   * operation. */
  HORA_CHECK(hora__comm_all_arrived(comm));
  return hora__comm_connect_peers(comm);
}

/* ---- the rings ------------------------------------------------------------ */

/* The ring allgather with a block size per rank, as one pipeline: the
 * receives are every other rank's block, chunk by chunk, in ring order
 * (block me-1 first); the sends are this rank's own block, then each
 * received chunk but those of the last block, forwarded as soon as it has
 * arrived. Send i >= own (the own block's chunks) is receive i - own, so
 * the pipeline's one constant lag covers it, and each link stays busy
 * across the steps even when the blocks differ in size. */
struct gv_ring {
  struct hora__iov *recv; /* [nrecv] where each received chunk lands */
  const char *own;
  size_t own_len, own_chunks, chunk;
};

static void gv_send_at(void *arg, size_t i, const void **ptr, size_t *len, bool *scratch) {
  struct gv_ring *g = arg;
  *scratch = false;
  if (i < g->own_chunks) {
    size_t off = i * g->chunk;
    *ptr = g->own + off;
    *len = HORA_MIN(g->chunk, g->own_len - off);
  } else {
    *ptr = g->recv[i - g->own_chunks].base;
    *len = g->recv[i - g->own_chunks].len;
  }
}

static void gv_recv_at(void *arg, size_t i, void **ptr, size_t *len, bool *scratch) {
  struct gv_ring *g = arg;
  *scratch = false;
  *ptr = g->recv[i].base;
  *len = g->recv[i].len;
}

int hora__ring_allgatherv(hora__comm *comm, const struct hora__ring_view *v, const void *sendbuf,
                          const size_t *bytes, void *recvbuf, const size_t *at) {
  int p = v->size, me = v->pos;
  char *out = recvbuf;
  if (bytes[me] && out + at[me] != sendbuf) {
    memmove(out + at[me], sendbuf, bytes[me]);
  }
  if (p == 1) {
    return HORA_SUCCESS;
  }
  struct gv_ring g = {.own = out + at[me], .own_len = bytes[me],
                      .chunk = (size_t)comm->proc->chunk_bytes};
  g.own_chunks = chunks(bytes[me], g.chunk);
  size_t nrecv = 0, last = 0;
  for (int t = 0; t + 1 < p; t++) {
    int b = ((me - t - 1) % p + p) % p;
    last = chunks(bytes[b], g.chunk);
    nrecv += last;
  }
  g.recv = hora__malloc(HORA_MAX(nrecv, (size_t)1) * sizeof(*g.recv));
  if (!g.recv) {
    return HORA_ERR_NO_MEMORY;
  }
  size_t k = 0;
  for (int t = 0; t + 1 < p; t++) {
    int b = ((me - t - 1) % p + p) % p;
    for (size_t off = 0; off < bytes[b]; off += g.chunk) {
      g.recv[k++] = (struct hora__iov){out + at[b] + off, HORA_MIN(g.chunk, bytes[b] - off)};
    }
  }
  struct hora__ring ring = {
      .next = v->next,
      .prev = v->prev,
      .nsend = g.own_chunks + nrecv - last, /* (the last block goes no further) */
      .nrecv = nrecv,
      .send_depends = true,
      .dep_lag = g.own_chunks,
      .arg = &g,
      .send_at = gv_send_at,
      .recv_at = gv_recv_at,
  };
  int rc = hora__ring_run(comm, &ring);
  free(g.recv);
  return rc;
}

/* Every rank's block to and from every peer at once: each direction of
 * each connection carries one block per alltoall, so the blocks need no
 * order between them, and sending them all together keeps the links busy
 * where one step at a time would leave a gap at the end of each. Each
 * block moves in chunks, WINDOW of them in flight per block. */
#define WINDOW 4

struct stream {
  hora__conn *conn;
  char *base;
  size_t len, posted, done; /* bytes */
  hora__xfer x[WINDOW];
  size_t xlen[WINDOW];
  unsigned head, n; /* the chunks in flight: x[head .. head + n) mod WINDOW */
};

static int streams_run(hora__comm *comm, struct stream *s, int n, bool *sending) {
  size_t chunk = (size_t)comm->proc->chunk_bytes;
  for (;;) {
    bool changed = false, all_done = true;
    HORA_CHECK(hora__service_maybe(comm->net));
    for (int i = 0; i < n; i++) {
      struct stream *t = &s[i];
      while (t->n > 0 && t->x[t->head].done) {
        t->done += t->xlen[t->head];
        t->head = (t->head + 1) % WINDOW;
        t->n--;
        changed = true;
      }
      while (t->n < WINDOW && t->posted < t->len) {
        unsigned slot = (t->head + t->n) % WINDOW;
        size_t len = HORA_MIN(chunk, t->len - t->posted);
        HORA_CHECK(sending[i] ? hora__isend(comm->net, t->conn, t->base + t->posted, len,
                                            &t->x[slot])
                              : hora__irecv(comm->net, t->conn, t->base + t->posted, len,
                                            &t->x[slot]));
        t->xlen[slot] = len;
        t->posted += len;
        t->n++;
        changed = true;
      }
      all_done = all_done && t->done == t->len;
    }
    if (all_done) {
      return HORA_SUCCESS;
    }
    if (!changed) {
      if (!comm->net->active) {
        return hora__error(HORA_ERR_SYSTEM, "alltoall: transfers stalled with nothing in flight");
      }
      HORA_CHECK(hora__progress_wait(comm->net));
    }
  }
}

static int pairwise_alltoall(hora__comm *comm, const void *sendbuf, const size_t *send_bytes,
                             void *recvbuf, const size_t *recv_bytes, size_t *sat, size_t *rat) {
  int p = comm->size, me = comm->rank;
  const char *in = sendbuf;
  char *out = recvbuf;
  if (recv_bytes[me]) {
    memcpy(out + rat[me], in + sat[me], recv_bytes[me]);
  }
  if (p == 1) {
    return HORA_SUCCESS;
  }
  HORA_CHECK(hora__comm_connect_peers(comm)); /* (every member is in this alltoall already) */
  struct stream *s = hora__calloc(2 * (size_t)(p - 1), sizeof(*s));
  bool *sending = hora__calloc(2 * (size_t)(p - 1), sizeof(*sending));
  if (!s || !sending) {
    free(s);
    free(sending);
    return HORA_ERR_NO_MEMORY;
  }
  /* Rank r sends to r + k and receives from r - k in the order of k, so
   * that the first chunks of different ranks go to different peers. */
  int n = 0;
  for (int k = 1; k < p; k++) {
    int to = (me + k) % p, from = (me - k + p) % p;
    s[n] = (struct stream){.conn = comm->proc->data[from], .base = out + rat[from],
                           .len = recv_bytes[from]};
    sending[n++] = false;
    s[n] = (struct stream){.conn = comm->proc->data[to], .base = (char *)(uintptr_t)(in + sat[to]),
                           .len = send_bytes[to]};
    sending[n++] = true;
  }
  int rc = streams_run(comm, s, n, sending);
  free(s);
  free(sending);
  return rc;
}

/* ---- shared memory --------------------------------------------------------- */

static int shm_allgatherv(hora__comm *comm, const void *sendbuf, const size_t *bytes,
                          void *recvbuf, size_t *at) {
  struct hora__shm *s = comm->proc->shm;
  int L = comm->local_size, me = comm->local_rank;
  size_t half = hora__shm_half_bytes(s), most = 0;
  for (int j = 0; j < L; j++) {
    most = HORA_MAX(most, bytes[j]);
  }
  for (size_t done = 0; done < most; done += half) {
    int h = (int)(comm->shm_seq++ & 1);
    if (done < bytes[me]) {
      memcpy(hora__shm_half(s, me, h), (const char *)sendbuf + done,
             HORA_MIN(half, bytes[me] - done));
    }
    HORA_CHECK(hora__shm_barrier(s, comm->net));
    for (int j = 0; j < L; j++) {
      if (done < bytes[j]) {
        memcpy((char *)recvbuf + at[j] + done, hora__shm_half(s, j, h),
               HORA_MIN(half, bytes[j] - done));
      }
    }
  }
  return HORA_SUCCESS;
}

/* Each round, every rank writes up to `slot` bytes for each peer into that
 * peer's slot of its own half, and reads its slot of every peer's half. */
static int shm_alltoall(hora__comm *comm, const void *sendbuf, const size_t *send_bytes,
                        void *recvbuf, const size_t *recv_bytes, size_t most, size_t *sat,
                        size_t *rat) {
  struct hora__shm *s = comm->proc->shm;
  int L = comm->local_size, me = comm->local_rank;
  size_t slot = hora__shm_half_bytes(s) / (size_t)L / 64 * 64;
  if (slot == 0) {
    return hora__error(HORA_ERR_SYSTEM, "alltoall: the shared segment's halves (%zu bytes) are "
                       "too small for %d ranks", hora__shm_half_bytes(s), L);
  }
  for (size_t done = 0; done < most; done += slot) {
    int h = (int)(comm->shm_seq++ & 1);
    char *mine = hora__shm_half(s, me, h);
    for (int j = 0; j < L; j++) {
      if (done < send_bytes[j]) {
        memcpy(mine + (size_t)j * slot, (const char *)sendbuf + sat[j] + done,
               HORA_MIN(slot, send_bytes[j] - done));
      }
    }
    HORA_CHECK(hora__shm_barrier(s, comm->net));
    for (int j = 0; j < L; j++) {
      if (done < recv_bytes[j]) {
        memcpy((char *)recvbuf + rat[j] + done, hora__shm_half(s, j, h) + (size_t)me * slot,
               HORA_MIN(slot, recv_bytes[j] - done));
      }
    }
  }
  return HORA_SUCCESS;
}

/* ---- entry points ------------------------------------------------------------ */

static bool on_shm(const hora__comm *comm) {
  return comm->shm_host;
}

int hora__exchange_records(hora__comm *comm, const uint64_t *record, size_t width, uint64_t *all,
                           const void *sendbuf, const size_t *offsets, bool *published) {
  *published = false;
  if (on_shm(comm) && comm->size > 1) {
    HORA_CHECK(hora__shm_publish_blocks(comm, sendbuf, offsets, record, width, all, published));
    if (*published) {
      return HORA_SUCCESS;
    }
  }
  return hora__allgather(comm, record, width * sizeof(uint64_t), all);
}

int hora__allgatherv(hora__comm *comm, const void *sendbuf, const size_t *bytes, void *recvbuf,
                     bool published) {
  size_t *at = hora__malloc((size_t)comm->size * sizeof(*at));
  if (!at) {
    return HORA_ERR_NO_MEMORY;
  }
  offsets(bytes, comm->size, at);
  size_t most = 0;
  for (int j = 0; j < comm->size; j++) {
    most = HORA_MAX(most, bytes[j]);
  }
  bool done = false;
  int rc = HORA_SUCCESS;
  if (on_shm(comm) && comm->size > 1) {
    rc = hora__shm_read_blocks(comm, sendbuf, NULL, recvbuf, bytes, at, most, published, &done);
  }
  if (rc == HORA_SUCCESS && !done) {
    rc = on_shm(comm) ? shm_allgatherv(comm, sendbuf, bytes, recvbuf, at)
                      : hora__ring_allgatherv(comm, &comm->world_ring, sendbuf, bytes, recvbuf, at);
  }
  free(at);
  return rc;
}

int hora__alltoall(hora__comm *comm, const void *sendbuf, const size_t *send_bytes,
                   void *recvbuf, const size_t *recv_bytes, size_t most, bool published) {
  size_t *sat = hora__malloc(2 * (size_t)comm->size * sizeof(*sat));
  if (!sat) {
    return HORA_ERR_NO_MEMORY;
  }
  size_t *rat = sat + comm->size;
  offsets(send_bytes, comm->size, sat);
  offsets(recv_bytes, comm->size, rat);
  /* In place (MPI_IN_PLACE's case), or overlapping: send from a copy. */
  size_t sent = sat[comm->size - 1] + send_bytes[comm->size - 1];
  size_t got = rat[comm->size - 1] + recv_bytes[comm->size - 1];
  char *copy = NULL;
  const char *s = sendbuf, *d = recvbuf;
  if (sent && got && s < d + got && d < s + sent) {
    if (published) {
      free(sat);
      return hora__error(HORA_ERR_SYSTEM, "alltoall: published blocks overlap the recvbuf");
    }
    copy = hora__malloc(sent);
    if (!copy) {
      free(sat);
      return HORA_ERR_NO_MEMORY;
    }
    memcpy(copy, sendbuf, sent);
    sendbuf = copy;
  }
  bool done = false;
  int rc = HORA_SUCCESS;
  if (on_shm(comm) && comm->size > 1) {
    rc = hora__shm_read_blocks(comm, sendbuf, sat, recvbuf, recv_bytes, rat, most, published,
                               &done);
  }
  if (rc == HORA_SUCCESS && !done) {
    rc = on_shm(comm)
             ? shm_alltoall(comm, sendbuf, send_bytes, recvbuf, recv_bytes, most, sat, rat)
             : pairwise_alltoall(comm, sendbuf, send_bytes, recvbuf, recv_bytes, sat, rat);
  }
  free(copy);
  free(sat);
  return rc;
}
