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
