/* Communicators and the process they run in.
 *
 * A communicator (struct hora__comm) is a group of the job's ranks that
 * runs collectives together: its members, this rank's place among them,
 * its rings and its own data-plane buffers. The job's world is one,
 * created by hora__comm_create; a process set would be another. What every
 * communicator of the process shares is struct hora__proc: the job's
 * identity and secret, the listeners, the control star, the pool of data
 * connections (by peer), the host's shared segment and the progress
 * engine. Both are used only by the coordinator thread. */
#ifndef HORA_COMM_H
#define HORA_COMM_H

#include <netinet/in.h>

#include "base/common.h"
#include "comm/transport/ctrl.h"
#include "comm/transport/handshake.h"
#include "comm/transport/net.h"
#include "comm/transport/transport.h"

typedef struct hora__comm hora__comm;
struct hora__shm;
struct hora__peer_maps;
struct hora__coll_backend;
struct hora__gpu;

/* A ring over some of the ranks: this rank's position in it, its size and
 * the connections to its neighbours. */
struct hora__ring_view {
  int pos, size;
  hora__conn *next, *prev;
};

/* The alpha-beta-gamma cost model the algorithms are chosen by: seconds
 * per message (alpha), per byte moved (beta) and per byte reduced (gamma),
 * for the links between members and for the host's shared memory
 * (comm/coll/cost_model.c). */
struct hora__cost {
  double alpha, beta, gamma;
  /* The runtime's own cost per operation, the same whatever the algorithm:
   * the caller's and the coordinator's hand-offs around a negotiation
   * cycle (link only; 0 where not measured). */
  double op;
};
struct hora__cost_model {
  struct hora__cost link;  /* over the connections, the slowest kind comm uses */
  struct hora__cost local; /* within a host, through the shared segment */
  char source[256];        /* where the constants came from */
};

/* Kinds with a choice of algorithm: allreduce, broadcast, allgather,
 * reducescatter (enum hora__coll_kind's first four). */
#define HORA_ALGO_KINDS 4
struct hora__algo;

struct hora__proc {
  hora__net net; /* the job's rank and size, its peers, and progress */
  /* The key connections prove (derived from the job secret, the job id
   * and the epoch), and the job secret itself (process sets derive theirs
   * from it). */
  uint8_t secret[HORA_SECRET_LEN];
  uint8_t job_secret[HORA_SECRET_LEN];
  uint64_t epoch;  /* the membership this communicator was built for */
  char job_id[17]; /* 8 random bytes in hex, drawn apart from the secret: names sockets */

  int tcp_listen_fd;
  int unix_listen_fd;
  int reserve_fd; /* spare descriptor for shedding connections on EMFILE (hora__accept_shed) */
  struct sockaddr_in tcp_addr;

  /* Control plane: a star around rank 0 (at rank 0 ctrl[r] for every
   * r > 0, elsewhere ctrl[0]). */
  hora__ctrl **ctrl;
  /* The pool of data connections, by global rank: data[r] to rank r, NULL
   * where no communicator talks to it directly (ring neighbours only), and
   * cross[r] the connection of the cross-host ring of the hierarchical
   * allreduce. */
  hora__conn **data;
  hora__conn **cross;
  struct hora__shm *shm; /* the host's shared segment, or NULL */
  void *shm_reg;         /* this rank's shared halves (hierarchical over RDMA) */
  char *bounce;          /* the single-copy path's cache-sized staging */
  struct hora__peer_maps *peer_maps; /* local peers' hora_mem_alloc blocks mapped here */
  char **peer_ptrs;                  /* the single-copy path's peer addresses */
  size_t peer_ptrs_cap;
  uint64_t direct_bytes; /* allreduce bytes moved with loads and stores only (atomic) */
  uint64_t kernel_bytes; /* allreduce bytes the kernel copied between local ranks (atomic) */
  uint64_t staged_bytes; /* allreduce bytes staged in the shared segment (atomic) */
  int64_t single_copy_min;
  int64_t chunk_bytes;
  int tcp_streams; /* sockets per TCP data connection between hosts (agreed) */
  bool ib_remote;  /* RDMA for data connections to other hosts */
  bool ib_all;     /* RDMA for every data connection (HORA_TRANSPORT=ib) */
  const struct hora__transport *stream; /* for stream connections (tcp) */
  const struct hora__transport *rdma;   /* for RDMA connections, or NULL where none is */
  const char *local_transport;  /* chosen for peers on this host */
  const char *remote_transport; /* chosen for peers on other hosts */
};

struct hora__comm {
  struct hora__proc *proc; /* shared by every communicator of the process */
  hora__net *net;          /* &proc->net */
  bool owns_proc;          /* the job's world: it made proc and frees it */
  int rank, size;          /* in this communicator */
  int local_rank, local_size;
  int cross_rank, cross_size;
  /* This process's local rank in the job's world: picks its GPU, the same
   * for every communicator of the process (set after hora__comm_create). */
  int device_local_rank;
  struct hora__ring_view world_ring; /* every member, in rank order */
  struct hora__ring_view cross_ring; /* the members with this local rank, one per host */
  uint64_t shm_seq;                  /* pieces done over shm: picks the half */
  uint64_t published_seq;            /* shm_seq of the last hora__shm_publish_blocks */
  /* Where shared memory serves (comm/coll/select.c): shm_host, every member
   * on one host with a shared segment; hierarchical, several hosts with
   * the same number of members each, shared memory within them. */
  bool shm_host, hierarchical;
  const struct hora__algo *forced[HORA_ALGO_KINDS]; /* HORA_ALGORITHM_<KIND>, or NULL */
  struct hora__cost_model model;                    /* agreed: rank 0's */
  bool partners; /* data connections to the point-to-point partners (made on first use) */
  const struct hora__coll_backend *algo_device;
  struct hora__gpu *gpu; /* its device data plane, set up by the first device op */
  bool all_pairs; /* a data connection to every member (alltoall's, made on first use) */
  char *fusion; /* the socket path's fusion buffer */
  size_t fusion_bytes;
  void *fusion_reg; /* its RDMA registration, or NULL */
  char *reduced; /* a reduce-scatter's whole reduction, of which it keeps one block */
  size_t reduced_bytes;
  void *reduced_reg;
  char *temp; /* the point-to-point algorithms' receive and staging space */
  size_t temp_bytes;
  void *temp_reg;
  char *scratch;    /* the ring's staging for chunks in flight */
  size_t scratch_bytes;
  void *scratch_reg;
};

/* Built by comm/communicator (hora__comm_create), from a rendezvous. */
void hora__comm_destroy(hora__comm *comm);
/* Closes every connection and listener (peers see EOF at once); the
 * communicator stays allocated until hora__comm_destroy. */
void hora__comm_disconnect(hora__comm *comm);

/* Connects this rank to every member it has no data connection to yet
 * (alltoall's pairwise exchange). Collective over comm: every member calls
 * it at the same point of its collectives, while none sleeps idle. */
int hora__comm_connect_peers(hora__comm *comm);
/* Connects this rank to those of `ranks` it has no data connection to yet.
 * Collective over the ranks named: each must name this one in turn, at the
 * same point of its collectives. */
int hora__comm_connect_ranks(hora__comm *comm, const int *ranks, int n);
/* The member on host `host` (0..cross_size-1) with this rank's local rank,
 * or -1. */
int hora__comm_rank_on_host(const hora__comm *c, int host);

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


#endif
