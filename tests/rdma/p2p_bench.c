/* Point-to-point speed of hora's transports, without the engine: two ranks
 * bootstrap a communicator (so HORA_TRANSPORT picks the transport) and
 * time 8-byte ping-pongs (one-way latency = round trip / 2) and a stream of
 * 1 MiB messages from and into a registered buffer, as the fusion buffer
 * is (so the ib transport writes them without a copy). Prints one line:
 *   transport=ib latency_us=... bandwidth_gbps=...
 * Used by tests/rdma/check-rdma.sh next to perftest's ib_write_lat/_bw. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/bootstrap/rendezvous_mpi.h"
#include "comm/communicator/communicator.h"
#include "comm/comm.h"
#include "comm/transport/socket.h"
#include "base/params.h"

static void die(const char *what) {
  fprintf(stderr, "p2p_bench: %s: %s\n", what, hora_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 2000, msgs = argc > 2 ? atoi(argv[2]) : 200;
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (hora__params_load() != HORA_SUCCESS) {
    die("settings");
  }
  hora__comm *c;
  struct hora__rdv *rdv = NULL;
  if (hora__rdv_open_mpi(MPI_COMM_WORLD, &rdv) != HORA_SUCCESS ||
      hora__comm_create(rdv, 1, NULL, 0, &c) != HORA_SUCCESS) {
    die("bootstrap");
  }
  if (c->size != 2) {
    fprintf(stderr, "p2p_bench: run with 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  c->net->spin_us = (int)hora__params.SPIN_TIME_US;
  hora__conn *peer = c->proc->data[1 - c->rank];
  char small[8] = {0};
  hora__xfer x;
  hora__xfer *xp = &x;
  double lat = 0;
  for (int round = 0; round < 2; round++) { /* the first warms up */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) {
      if (c->rank == 0) {
        if (hora__isend(c->net, peer, small, 8, &x) || hora__wait_all(c->net, &xp, 1) ||
            hora__irecv(c->net, peer, small, 8, &x) || hora__wait_all(c->net, &xp, 1)) {
          die("ping");
        }
      } else {
        if (hora__irecv(c->net, peer, small, 8, &x) || hora__wait_all(c->net, &xp, 1) ||
            hora__isend(c->net, peer, small, 8, &x) || hora__wait_all(c->net, &xp, 1)) {
          die("pong");
        }
      }
    }
    lat = (MPI_Wtime() - t0) / iters / 2;
  }
  const size_t sz = 1 << 20;
  char *buf = hora__aligned_alloc(4096, sz);
  if (!buf) {
    die("allocation");
  }
  memset(buf, 0, sz);
  void *reg;
  hora__comm_register(c, buf, sz, &reg);
  hora__xfer *xs = calloc((size_t)msgs, sizeof(*xs));
  hora__xfer **xps = calloc((size_t)msgs, sizeof(*xps));
  double bw = 0;
  for (int round = 0; round < 2; round++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < msgs; i++) {
      xps[i] = &xs[i];
      int rc = c->rank == 0 ? hora__isend(c->net, peer, buf, sz, &xs[i]) : hora__irecv(c->net, peer, buf, sz, &xs[i]);
      if (rc) {
        die("stream");
      }
    }
    if (hora__wait_all(c->net, xps, msgs)) {
      die("stream wait");
    }
    /* One byte back: the receiver has everything. */
    if (c->rank == 1 ? hora__isend(c->net, peer, small, 1, &x) : hora__irecv(c->net, peer, small, 1, &x)) {
      die("ack");
    }
    if (hora__wait_all(c->net, &xp, 1)) {
      die("ack wait");
    }
    bw = (double)sz * msgs * 8 / (MPI_Wtime() - t0) / 1e9;
  }
  if (c->rank == 0) {
    printf("transport=%s latency_us=%.2f bandwidth_gbps=%.3f\n", peer->tp->name, lat * 1e6, bw);
  }
  hora__comm_deregister(c, &reg);
  hora__comm_destroy(c);
  hora__rdv_close(rdv);
  free(buf);
  free(xs);
  free(xps);
  MPI_Finalize();
  return 0;
}
