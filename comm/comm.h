/* The communicator: who the ranks are, how to reach them, and the
 * connections of the control and data planes. Built by hora__comm_create
 * (bootstrap.c) from MPI, used afterwards only by the coordinator thread. */
#ifndef HORA_COMM_H
#define HORA_COMM_H

#include <mpi.h>
#include <netinet/in.h>

#include "base/common.h"
#include "comm/bootstrap/handshake.h"
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

/* A control connection: framed messages over a stream socket, with a
 * non-blocking send queue (ctrl.c). */
typedef struct hora__ctrl hora__ctrl;

/* Called while a collective waits, so control traffic (aborts, requests
 * arriving at rank 0) is read even in the middle of a long transfer. The
 * pollfds callback adds the fds whose readiness should run the service. */
struct pollfd;
typedef int (*hora__service_fn)(void *arg);
typedef int (*hora__service_pollfds_fn)(void *arg, struct pollfd *fds, int max);

/* Which algorithm family a collective uses (chosen in bootstrap.c). */
enum hora__algo { HORA_ALGO_RING, HORA_ALGO_SHM };

struct hora__shm;

/* A ring over some of the ranks: this rank's position in it, its size and
 * the connections to its neighbours. */
struct hora__ring_view {
  int pos, size;
  hora__conn *next, *prev;
};

struct hora__comm {
  int rank, size;
  int local_rank, local_size;
  int cross_rank, cross_size;
  struct hora__peer_info *peers; /* [size] */
  uint8_t secret[HORA_SECRET_LEN];
  char job_id[17]; /* 8 random bytes in hex, drawn apart from the secret: names sockets */
  MPI_Comm mpi;    /* the job's duplicate of MPI_COMM_WORLD; bootstrap only */

  int tcp_listen_fd;
  int unix_listen_fd;
  int reserve_fd; /* spare descriptor for shedding connections on EMFILE (hora__accept_shed) */
  struct sockaddr_in tcp_addr;

  /* Control plane: a star around rank 0 (at rank 0 ctrl[r] for every
   * r > 0, elsewhere ctrl[0]), and the cycles' partners (see below). */
  hora__ctrl **ctrl;
  /* Data plane: data[r] is the connection to rank r, NULL where the
   * algorithms never talk directly (the ring neighbours only), and cross[r]
   * the connection of the cross-host ring of the hierarchical allreduce. */
  hora__conn **data;
  hora__conn **cross;
  struct hora__ring_view world_ring; /* every rank, in rank order */
  struct hora__ring_view cross_ring; /* the ranks with this local rank, one per host */
  struct hora__shm *shm;              /* the host's shared segment, or NULL */
  uint64_t shm_seq;                   /* pieces done over shm: picks the half */
  enum hora__algo algo_allreduce, algo_bcast, algo_allgather;
  char *fusion; /* the socket path's fusion buffer */
  size_t fusion_bytes;
  void *fusion_reg;    /* its RDMA registration, or NULL */
  char *scratch;       /* the ring's staging for chunks in flight */
  size_t scratch_bytes;
  void *scratch_reg;
  void *shm_reg; /* this rank's shared halves (hierarchical over RDMA) */
  char *bounce; /* the single-copy path's cache-sized staging */
  struct hora__peer_maps *peer_maps; /* local peers' hora_mem_alloc blocks mapped here */
  char **peer_ptrs;                  /* the single-copy path's peer addresses */
  size_t peer_ptrs_cap;
  uint64_t direct_bytes; /* allreduce bytes moved with loads and stores only (atomic) */
  uint64_t kernel_bytes; /* allreduce bytes the kernel copied between local ranks (atomic) */
  uint64_t staged_bytes; /* allreduce bytes staged in the shared segment (atomic) */
  int64_t single_copy_min;
  int tcp_streams; /* sockets per TCP data connection between hosts (agreed) */
  bool ib_remote; /* RDMA for data connections to other hosts */
  bool ib_all;    /* RDMA for every data connection (HORA_TRANSPORT=ib) */
  const char *local_transport;  /* chosen for peers on this host */
  const char *remote_transport; /* chosen for peers on other hosts */

  hora__conn *active; /* connections with queued transfers */
  int spin_us;        /* bounded polling before sleeping */
  uint64_t stall_ns;  /* a collective with no progress this long fails (0: never) */
  int64_t chunk_bytes;

  hora__service_fn service;
  hora__service_pollfds_fn service_pollfds;
  void *service_arg;
  /* The service hook runs at least every service_interval_ns during any
   * collective, however fast its bytes move (heartbeats, aborts). */
  uint64_t service_interval_ns;
  uint64_t service_due_ns;
};

/* Bootstrap: rank/size/local/cross from MPI, the job secret, listeners,
 * and every planned connection. Collective over `world`. */
int hora__comm_create(MPI_Comm world, hora__comm **comm);
void hora__comm_destroy(hora__comm *comm);
/* Closes every connection and listener (peers see EOF at once); the
 * communicator stays allocated until hora__comm_destroy. */
void hora__comm_disconnect(hora__comm *comm);

/* Long-lived data-plane buffers (fusion, ring staging) registered with the
 * RDMA device, so large transfers move straight into and out of them. A
 * no-op without RDMA; a failed registration only costs a copy. */
void hora__comm_register(hora__comm *comm, void *buf, size_t len, void **handle);
void hora__comm_deregister(hora__comm *comm, void **handle);
/* Grows *buf (page-aligned, registered as above) to at least need bytes. */
int hora__comm_grow_registered(hora__comm *comm, char **buf, size_t *bytes, void **handle,
                               size_t need);
/* GPU memory exported as a dma-buf (fd, and buf's offset in it), for
 * GPUDirect RDMA. Fails where no connection is RDMA or the NIC cannot. */
int hora__comm_register_device(hora__comm *comm, void *buf, size_t len, int fd, uint64_t offset,
                               void **handle);

/* HORA_ERR_SYSTEM with MPI's own words for err, returned by the named call. */
int hora__mpi_error(int err, const char *call);
/* Describe a peer for messages: "rank 3 (host h1, pid 1234)". */
const char *hora__peer_name(const hora__comm *comm, int rank, char *buf, size_t n);

/* ---- point-to-point progress (progress.c) -------------------------------- */
int hora__isend(hora__comm *comm, hora__conn *conn, const void *buf, size_t len, hora__xfer *x);
int hora__irecv(hora__comm *comm, hora__conn *conn, void *buf, size_t len, hora__xfer *x);
/* Progress every busy connection; sets *progressed when bytes moved. */
int hora__progress(hora__comm *comm, bool *progressed);
/* Runs the service hook now, and sets when it is next due. */
int hora__service_run(hora__comm *comm);
/* Runs it if its interval has passed: one clock read otherwise. Every loop
 * that moves or reduces a collective's bytes calls this per chunk, so that
 * control traffic, heartbeats and aborts never wait for the collective. */
static inline int hora__service_maybe(hora__comm *comm) {
  if (HORA_UNLIKELY(comm->service && hora__now_ns() >= comm->service_due_ns)) {
    return hora__service_run(comm);
  }
  return HORA_SUCCESS;
}
/* Progress, and when nothing can move, poll the busy connections (spinning
 * first for at most comm->spin_us), running the service hook when control
 * traffic arrives and whenever it is due. Returns after some progress, or
 * with an error. */
int hora__progress_wait(hora__comm *comm);
/* Wait until every transfer in xs[0..n) is done. */
int hora__wait_all(hora__comm *comm, hora__xfer **xs, int n);

/* ---- control connections (ctrl.c) ---------------------------------------- */
#define HORA_CTRL_MAX_FRAME (64u << 20)

hora__ctrl *hora__ctrl_new(int fd, int peer);
void hora__ctrl_free(hora__ctrl *c);
int hora__ctrl_fd(const hora__ctrl *c);
int hora__ctrl_peer(const hora__ctrl *c);
/* Queues one frame and writes what the socket takes now. */
int hora__ctrl_send(hora__ctrl *c, uint16_t type, const void *payload, size_t len);
/* Writes queued bytes without blocking. */
int hora__ctrl_flush(hora__ctrl *c);
bool hora__ctrl_has_output(const hora__ctrl *c);
/* Reads without blocking until the first frame is complete or nothing
 * more is there: parse it (hora__ctrl_next) before reading again. EOF or a
 * reset gives HORA_ERR_PEER_LOST, a malformed frame header
 * HORA_ERR_PROTOCOL (message recorded). */
int hora__ctrl_read(hora__ctrl *c);
/* Takes the next complete frame, if any: *got = false when none is complete.
 * The payload stays valid until the next call on this connection. A frame
 * longer than HORA_CTRL_MAX_FRAME is a protocol error. */
int hora__ctrl_next(hora__ctrl *c, bool *got, uint16_t *type, const uint8_t **payload,
                    size_t *len);
/* When bytes last came in, and when a frame was last queued out. */
uint64_t hora__ctrl_last_in(const hora__ctrl *c);
uint64_t hora__ctrl_last_out(const hora__ctrl *c);
/* Blocking send for shutdown paths: writes the frame within `timeout_s`. */
int hora__ctrl_send_blocking(hora__ctrl *c, uint16_t type, const void *payload, size_t len,
                             double timeout_s);

/* The partners of the cycles' allreduce of cache bit vectors (engine.c),
 * by recursive doubling: with p2 the largest power of two <= size, rank
 * r >= p2 folds into r - p2 and takes the result back from it; the ranks
 * below p2 (taking in their fold first) swap with r ^ 1, r ^ 2, ... */
struct hora__cycle_partners {
  int fold;       /* -1, or the rank this one folds into or takes in */
  bool folds_out; /* this rank is beyond p2: it talks to fold only */
  int nrounds;
  int round[31];
};
void hora__cycle_partners(int rank, int size, struct hora__cycle_partners *p);

/* ---- sockets (socket.c) --------------------------------------------------- */
int hora__socket_nonblocking(int fd);
int hora__socket_tune(int fd, bool tcp, int64_t bufsize);
int hora__choose_ipv4(const char *iface, bool single_host, struct in_addr *out, char *ifname,
                      size_t ifname_len);
int hora__listen_tcp(struct in_addr addr, int *fd, struct sockaddr_in *bound);
int hora__listen_unix(const char *job_id, int rank, int *fd);
int hora__unix_address(const char *job_id, int rank, void *sun, unsigned *len);
/* accept() failed with EMFILE/ENFILE: gives up the spare descriptor
 * *reserve_fd for a moment to accept one pending connection and close it at
 * once, so the listener's queue shrinks instead of poll() reporting it ready
 * forever. 0 when one was shed (its address in *ss), -1 when there was no
 * spare or nothing to accept. */
struct sockaddr_storage;
int hora__accept_shed(int lfd, int *reserve_fd, struct sockaddr_storage *ss, socklen_t *len);

/* The kinds of bootstrap connection (handshake.h moves them). */
enum hora__conn_kind { HORA_CONN_CTRL = 1, HORA_CONN_DATA = 2, HORA_CONN_CROSS = 3 };
#define HORA_CONN_KINDS 3
/* On the wire a connection's kind also names which of a TCP connection's
 * sockets it is: kind + HORA_CONN_KINDS * socket index. */
#define HORA_CONN_SLOTS (HORA_CONN_KINDS * HORA_TCP_STREAMS_MAX)

#endif
