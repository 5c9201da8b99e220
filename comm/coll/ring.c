/* The ring pipeline engine shared by allreduce, allgather and broadcast.
 *
 * Up to RING_WINDOW receives and RING_WINDOW sends are in flight. Receives
 * are retired in order (that is when a reduce-scatter chunk is reduced),
 * and a send is posted as soon as the receive it depends on is retired, so
 * chunk k of step t+1 leaves while chunk k+1 of step t is still arriving. */
#include <stdlib.h>

#include "comm/coll/collectives.h"

#define RING_WINDOW 4

/* The staging of chunks in flight lives in the communicator, registered
 * with the RDMA device like the fusion buffer. */
static int scratch_get(hora__comm *comm, size_t bytes, char **out) {
  HORA_CHECK(hora__comm_grow_registered(comm, &comm->scratch, &comm->scratch_bytes,
                                        &comm->scratch_reg, bytes));
  *out = comm->scratch;
  return HORA_SUCCESS;
}

int hora__ring_run(hora__comm *comm, const struct hora__ring *ring) {
  hora__xfer sx[RING_WINDOW], rx[RING_WINDOW];
  char *send_stage = NULL;
  void *rbuf[RING_WINDOW];
  bool rstaged[RING_WINDOW];
  size_t send_posted = 0, send_done = 0, recv_posted = 0, recv_done = 0;
  size_t stage_bytes = (size_t)comm->proc->chunk_bytes;
  char *stage = NULL;
  if (ring->nrecv > 0 || ring->fill_send) {
    HORA_CHECK(scratch_get(comm, stage_bytes * RING_WINDOW * 2, &stage));
    send_stage = stage + stage_bytes * RING_WINDOW;
  }
  for (;;) {
    /* One pass posts and retires whatever it can; sleep only when a pass
     * changed nothing, since retiring a send can open the send window and
     * retiring a receive can satisfy a send's dependency. */
    bool changed = false;
    HORA_CHECK(hora__service_maybe(comm->net)); /* passes that always change never wait */
    while (recv_posted < ring->nrecv && recv_posted - recv_done < RING_WINDOW) {
      size_t slot = recv_posted % RING_WINDOW;
      void *ptr;
      size_t len;
      bool staged = false;
      ring->recv_at(ring->arg, recv_posted, &ptr, &len, &staged);
      if (staged) {
        ptr = stage + slot * stage_bytes;
      }
      rbuf[slot] = ptr;
      rstaged[slot] = staged;
      HORA_CHECK(hora__irecv(comm->net, ring->prev, ptr, len, &rx[slot]));
      recv_posted++;
      changed = true;
    }
    while (recv_done < recv_posted && rx[recv_done % RING_WINDOW].done) {
      size_t slot = recv_done % RING_WINDOW;
      if (ring->received) {
        ring->received(ring->arg, recv_done, rstaged[slot] ? rbuf[slot] : NULL);
      }
      recv_done++;
      changed = true;
    }
    while (send_done < send_posted && sx[send_done % RING_WINDOW].done) {
      send_done++;
      changed = true;
    }
    while (send_posted < ring->nsend && send_posted - send_done < RING_WINDOW) {
      if (ring->send_depends && send_posted >= ring->dep_lag &&
          recv_done <= send_posted - ring->dep_lag) {
        break;
      }
      const void *ptr;
      size_t len;
      bool staged = false;
      ring->send_at(ring->arg, send_posted, &ptr, &len, &staged);
      if (staged) {
        void *slot = send_stage + (send_posted % RING_WINDOW) * stage_bytes;
        ring->fill_send(ring->arg, send_posted, slot);
        ptr = slot;
      }
      HORA_CHECK(hora__isend(comm->net, ring->next, ptr, len, &sx[send_posted % RING_WINDOW]));
      send_posted++;
      changed = true;
    }
    if (recv_done == ring->nrecv && send_done == ring->nsend) {
      return HORA_SUCCESS;
    }
    if (!changed) {
      if (!comm->net->active) {
        /* Nothing in flight and nothing postable: a schedule bug, not a
         * network problem. Fail loudly instead of spinning. */
        return hora__error(HORA_ERR_SYSTEM,
                           "ring pipeline stalled (sends %zu/%zu/%zu, receives %zu/%zu/%zu)",
                           send_done, send_posted, ring->nsend, recv_done, recv_posted, ring->nrecv);
      }
      HORA_CHECK(hora__progress_wait(comm->net));
    }
  }
}

/* ---- point-to-point schedules over several peers ------------------------------
 * Each lane keeps up to SCHED_WINDOW transfers in flight and retires them
 * in order; a local lane runs its steps as soon as their dependencies are
 * done. Since every rank lists its operations in one agreed order (a
 * message's two ends at the same place, every dependency earlier), the
 * earliest unfinished operation of the whole job can always move: the
 * schedule cannot deadlock however the windows fill. */
#define SCHED_WINDOW 4

struct sched_lane {
  size_t *ops; /* this lane's operations, in order */
  size_t n, posted, retired;
  hora__xfer x[SCHED_WINDOW];
};

static bool sched_ready(const struct hora__sched_op *op, const bool *finished) {
  for (int d = 0; d < HORA_SCHED_DEPS; d++) {
    if (op->after[d] >= 0 && !finished[op->after[d]]) {
      return false;
    }
  }
  return true;
}

int hora__sched_run(hora__comm *comm, const struct hora__sched *s) {
  /* The transfers in flight stay on this stack, as hora__ring_run's: a
   * connection that fails mid-way is closed with them still queued. */
  struct sched_lane lanes[HORA_SCHED_LANES];
  if (s->nlanes > HORA_SCHED_LANES) {
    return hora__error(HORA_ERR_INVALID_ARG, "point-to-point schedule of %d lanes (at most %d)",
                       s->nlanes, HORA_SCHED_LANES);
  }
  memset(lanes, 0, sizeof(lanes));
  size_t *order = hora__malloc(HORA_MAX(s->nops, (size_t)1) * sizeof(*order));
  bool *finished = hora__calloc(HORA_MAX(s->nops, (size_t)1), sizeof(*finished));
  int rc = HORA_SUCCESS;
  if (!order || !finished) {
    rc = HORA_ERR_NO_MEMORY;
    goto out;
  }
  for (size_t i = 0; i < s->nops; i++) {
    lanes[s->ops[i].lane].n++;
  }
  for (int l = 0, at = 0; l < s->nlanes; l++) {
    lanes[l].ops = order + at;
    at += (int)lanes[l].n;
    lanes[l].n = 0;
  }
  for (size_t i = 0; i < s->nops; i++) {
    struct sched_lane *l = &lanes[s->ops[i].lane];
    l->ops[l->n++] = i;
  }
  size_t left = s->nops;
  while (left > 0) {
    /* As in hora__ring_run: sleep only after a pass that changed nothing. */
    bool changed = false;
    HORA_CHECK_GOTO(hora__service_maybe(comm->net), rc, out);
    for (int li = 0; li < s->nlanes; li++) {
      struct sched_lane *l = &lanes[li];
      const struct hora__sched_lane *how = &s->lanes[li];
      while (l->retired < l->posted && l->x[l->retired % SCHED_WINDOW].done) {
        finished[l->ops[l->retired++]] = true;
        left--;
        changed = true;
      }
      while (l->posted < l->n && (!how->conn || l->posted - l->retired < SCHED_WINDOW)) {
        size_t i = l->ops[l->posted];
        const struct hora__sched_op *op = &s->ops[i];
        if (!sched_ready(op, finished)) {
          break;
        }
        if (!how->conn) {
          s->local(s->arg, op);
          finished[i] = true;
          l->posted++;
          l->retired++;
          left--;
        } else {
          hora__xfer *x = &l->x[l->posted % SCHED_WINDOW];
          HORA_CHECK_GOTO(how->send ? hora__isend(comm->net, how->conn, op->buf, op->len, x)
                                    : hora__irecv(comm->net, how->conn, op->buf, op->len, x),
                          rc, out);
          l->posted++;
        }
        changed = true;
      }
    }
    if (!changed && left > 0) {
      if (!comm->net->active) {
        rc = hora__error(HORA_ERR_SYSTEM,
                         "point-to-point schedule stalled (%zu of %zu operations done, nothing "
                         "in flight)",
                         s->nops - left, s->nops);
        goto out;
      }
      HORA_CHECK_GOTO(hora__progress_wait(comm->net), rc, out);
    }
  }
out:
  free(order);
  free(finished);
  return rc;
}
