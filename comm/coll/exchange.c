/* Allgatherv and alltoall: blocks whose size differs by rank (allgatherv)
 * or by pair of ranks (alltoall). Every member knows every size before it
 * starts (the runtime exchanges them first), so all take the same steps.
 *
 * Over the connections (sockets or RDMA):
 *   - allgatherv is the ring allgather with each rank's own block size, one
 *     pipelined step at a time: in step t rank r forwards block r - t and
 *     receives block r - t - 1;
 *   - alltoall is the pairwise exchange: in step k (1 .. p-1) rank r sends
 *     its block for r + k and receives the block of r - k, both at once,
 *     over a connection to every member, made on first use and kept.
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
      .nsend = (send_len + s.chunk - 1) / s.chunk,
      .nrecv = (recv_len + s.chunk - 1) / s.chunk,
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

int hora__comm_connect_peers_agreed(hora__comm *comm) {
  if (comm->all_pairs || comm->size == 1) {
    return HORA_SUCCESS;
  }
  /* An idle rank refuses connections: first make sure every member has
   * reached this operation. */
  char *all = hora__malloc((size_t)comm->size);
  if (!all) {
    return HORA_ERR_NO_MEMORY;
  }
  char one = 1;
  int rc = hora__allgather(comm, &one, 1, all);
  free(all);
  return rc == HORA_SUCCESS ? hora__comm_connect_peers(comm) : rc;
}

/* ---- the rings ------------------------------------------------------------ */

static int ring_allgatherv(hora__comm *comm, const void *sendbuf, const size_t *bytes,
                           void *recvbuf, size_t *at) {
  const struct hora__ring_view *v = &comm->world_ring;
  int p = v->size, me = v->pos;
  char *out = recvbuf;
  if (bytes[me] && out + at[me] != sendbuf) {
    memmove(out + at[me], sendbuf, bytes[me]);
  }
  for (int t = 0; t + 1 < p; t++) {
    int sb = ((me - t) % p + p) % p, rb = ((me - t - 1) % p + p) % p;
    HORA_CHECK(hora__exchange_step(comm, v->next, out + at[sb], bytes[sb], v->prev, out + at[rb],
                             bytes[rb]));
  }
  return HORA_SUCCESS;
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
  for (int k = 1; k < p; k++) {
    int to = (me + k) % p, from = (me - k + p) % p;
    HORA_CHECK(hora__exchange_step(comm, comm->proc->data[to], in + sat[to], send_bytes[to],
                             comm->proc->data[from], out + rat[from], recv_bytes[from]));
  }
  return HORA_SUCCESS;
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
  return comm->algo_allgather == &hora__coll_shm && comm->local_size == comm->size;
}

int hora__allgatherv(hora__comm *comm, const void *sendbuf, const size_t *bytes, void *recvbuf) {
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
    rc = hora__shm_read_blocks(comm, sendbuf, NULL, recvbuf, bytes, at, most, &done);
  }
  if (rc == HORA_SUCCESS && !done) {
    rc = on_shm(comm) ? shm_allgatherv(comm, sendbuf, bytes, recvbuf, at)
                      : ring_allgatherv(comm, sendbuf, bytes, recvbuf, at);
  }
  free(at);
  return rc;
}

int hora__alltoall(hora__comm *comm, const void *sendbuf, const size_t *send_bytes,
                   void *recvbuf, const size_t *recv_bytes, size_t most) {
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
    rc = hora__shm_read_blocks(comm, sendbuf, sat, recvbuf, recv_bytes, rat, most, &done);
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
