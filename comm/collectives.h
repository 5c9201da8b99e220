/* The collective algorithms, written once against the transport vtable.
 * Called only by the coordinator thread, in the same order on every rank. */
#ifndef HORA_COLLECTIVES_H
#define HORA_COLLECTIVES_H

#include "comm.h"

/* recvbuf = op over every rank's sendbuf (sendbuf == recvbuf: in place).
 * HORA_AVERAGE reduces as a sum; the caller divides. With a wire dtype
 * (HORA_FLOAT16 or HORA_BFLOAT16, for float32/float64 data; else pass
 * dtype itself) data travels compressed and is reduced in dtype; every rank
 * ends with the same, wire-rounded result. */
int hora__allreduce(hora__comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                    hora_dtype dtype, hora_op op, hora_dtype wire_dtype);

/* buf on every rank = buf on root. */
int hora__broadcast(hora__comm *comm, void *buf, size_t bytes, int root);

/* recvbuf[r * bytes .. ] = rank r's sendbuf. sendbuf may already sit at its
 * place in recvbuf. */
int hora__allgather(hora__comm *comm, const void *sendbuf, size_t bytes, void *recvbuf);

/* ---- the ring pipeline engine (ring.c) -----------------------------------
 * A sequence of sends to the next rank and receives from the previous one,
 * both indexed 0..n-1, moved in chunks with a window of transfers in
 * flight. Send i may depend on receive i - dep_lag having completed. */
struct hora__ring {
  hora__conn *next, *prev;
  size_t nsend, nrecv;
  bool send_depends; /* send i waits for receive i - dep_lag */
  size_t dep_lag;
  void *arg;
  /* Where send i reads from; *scratch asks for a staging buffer, which
   * fill_send then fills. */
  void (*send_at)(void *arg, size_t i, const void **ptr, size_t *len, bool *scratch);
  void (*fill_send)(void *arg, size_t i, void *staging);
  /* Where receive i lands; *scratch asks for a staging buffer instead. */
  void (*recv_at)(void *arg, size_t i, void **ptr, size_t *len, bool *scratch);
  /* Called in order when receive i is complete; `staged` is the staging
   * buffer it landed in, or NULL. */
  void (*received)(void *arg, size_t i, void *staged);
};

int hora__ring_run(hora__comm *comm, const struct hora__ring *ring);

#endif
