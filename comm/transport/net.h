/* The process's data-plane progress engine: the job's peers, the
 * connections with transfers queued, and the service hook that keeps
 * control traffic moving while a collective waits. One per process,
 * shared by every communicator; only the coordinator thread uses it. */
#ifndef HORA_NET_H
#define HORA_NET_H

#include <netinet/in.h>

#include "comm/transport/transport.h"

#define HORA_HOST_MAX 64

/* What every rank tells every other at bootstrap (MPI_Allgather). Plain
 * fixed-size data so it can travel as bytes. */
struct hora__peer_info {
  char host[HORA_HOST_MAX];
  int32_t pid;
  int32_t local_rank;
  int32_t host_index;
  uint32_t ipv4; /* network byte order */
  uint16_t port; /* network byte order */
  uint16_t pad;
};

/* Called while a collective waits, so control traffic (aborts, requests
 * arriving at rank 0) is read even in the middle of a long transfer. The
 * pollfds callback adds the fds whose readiness should run the service. */
struct pollfd;
typedef int (*hora__service_fn)(void *arg);
typedef int (*hora__service_pollfds_fn)(void *arg, struct pollfd *fds, int max);
/* Told what a poll() found on the fds the pollfds callback gave. */
typedef void (*hora__service_ready_fn)(void *arg, const struct pollfd *fds, int n);

struct hora__net {
  int rank, size;                /* in the job */
  struct hora__peer_info *peers; /* [size], for messages; NULL in unit tests */
  const int *names;              /* [size]: the job's rank of each, for messages (NULL: the same) */
  hora__conn *active;            /* connections with queued transfers */
  int spin_us;                   /* bounded polling before sleeping */
  uint64_t stall_ns;             /* a collective with no progress this long fails (0: never) */

  hora__service_fn service;
  hora__service_pollfds_fn service_pollfds;
  hora__service_ready_fn service_ready; /* optional */
  void *service_arg;
  /* The service hook runs at least every service_interval_ns during any
   * collective, however fast its bytes move (heartbeats, aborts). */
  uint64_t service_interval_ns;
  uint64_t service_due_ns;
};

/* Describe a peer for messages: "rank 3 (host h1, pid 1234)". */
const char *hora__peer_name(const hora__net *net, int rank, char *buf, size_t n);

int hora__isend(hora__net *net, hora__conn *conn, const void *buf, size_t len, hora__xfer *x);
int hora__irecv(hora__net *net, hora__conn *conn, void *buf, size_t len, hora__xfer *x);
/* Progress every busy connection; sets *progressed when bytes moved. */
int hora__progress(hora__net *net, bool *progressed);
/* Runs the service hook now, and sets when it is next due. */
int hora__service_run(hora__net *net);
/* Runs it if its interval has passed: one clock read otherwise. Every loop
 * that moves or reduces a collective's bytes calls this per chunk, so that
 * control traffic, heartbeats and aborts never wait for the collective. */
static inline int hora__service_maybe(hora__net *net) {
  if (HORA_UNLIKELY(net->service && hora__now_ns() >= net->service_due_ns)) {
    return hora__service_run(net);
  }
  return HORA_SUCCESS;
}
/* Progress, and when nothing can move, poll the busy connections (spinning
 * first for at most net->spin_us), running the service hook when control
 * traffic arrives and whenever it is due. Returns after some progress, or
 * with an error. */
int hora__progress_wait(hora__net *net);
/* Wait until every transfer in xs[0..n) is done. */
int hora__wait_all(hora__net *net, hora__xfer **xs, int n);

#endif
