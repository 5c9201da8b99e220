/* The transport vtable: how bytes move between two ranks. Every transport
 * implements it; the algorithms (comm/coll/) are
 * written once against it. Shaped like NCCL's net plugin API: connections
 * are set up without blocking (connect, accept, establish), transfers are
 * posted and then tested, memory is registered once, and each connection
 * exposes the file descriptor the coordinator sleeps on.
 *
 * Threading: only the coordinator thread calls into a transport.
 */
#ifndef HORA_TRANSPORT_H
#define HORA_TRANSPORT_H

#include "base/common.h"

typedef struct hora__net hora__net;
typedef struct hora__conn hora__conn;

/* One posted send or receive. Owned by the poster; it must stay in place
 * until done. Transfers on one connection complete in posting order per
 * direction, and a receive of n bytes matches exactly the send of n bytes
 * posted at the same position on the other side. */
typedef struct hora__xfer {
  char *ptr;          /* next byte to move */
  size_t left;        /* bytes still to move */
  bool done;
  uint8_t mode;            /* the transport's own bookkeeping */
  struct hora__xfer *next; /* the connection's FIFO */
  /* Transports that split a transfer over several streams: its start,
   * length and position in the connection's sequence. */
  char *base;
  size_t len;
  uint64_t seq;
} hora__xfer;

/* Appends x to the FIFO head..tail (a connection's send or receive queue). */
static inline void hora__xfer_enqueue(hora__xfer **head, hora__xfer **tail, hora__xfer *x) {
  x->next = NULL;
  if (*tail) {
    (*tail)->next = x;
  } else {
    *head = x;
  }
  *tail = x;
}

/* A connection to one peer, common header of every transport's own. */
struct hora__conn {
  const struct hora__transport *tp;
  int peer;
  hora__xfer *send_head, *send_tail;
  hora__xfer *recv_head, *recv_tail;
  struct hora__conn *active_next; /* on the progress engine's list of busy connections */
  bool active;
  /* Transfers already off the queues whose completion the transport still
   * owes (an RDMA write straight from the caller's memory). */
  unsigned pending;
};

struct hora__transport {
  const char *name;
  /* Whether this machine can use it at all (an active RDMA port); NULL:
   * always. */
  bool (*available)(void);
  /* Whether it moves data straight between registered buffers (RDMA), so
   * that long-lived buffers are worth registering with it. */
  bool zero_copy;
  /* Connection set-up, without blocking. comm/bootstrap dials or accepts a
   * stream socket to the peer and authenticates it (the job's handshake);
   * connect, on the side that dialled, or accept, on the side that
   * listened, starts the transport's own set-up over it (the socket is the
   * connection's from then on, even on failure) and returns the connection
   * not yet usable. establish moves the set-up on, whenever *fd is ready
   * for *events, until it sets *ready; then transfers may be posted. */
  int (*connect)(hora__net *net, int fd, int peer, hora__conn **conn);
  int (*accept)(hora__net *net, int fd, int peer, hora__conn **conn);
  int (*establish)(hora__net *net, hora__conn *conn, bool *ready, int *fd, short *events);
  /* Queue a transfer. Never blocks; hora__conn_progress moves the bytes. */
  int (*isend)(hora__conn *conn, const void *buf, size_t len, hora__xfer *x);
  int (*irecv)(hora__conn *conn, void *buf, size_t len, hora__xfer *x);
  /* Move as many bytes as possible without blocking. Sets *progressed when
   * anything moved. Returns HORA_ERR_PEER_LOST when the peer is gone. */
  int (*progress)(hora__net *net, hora__conn *conn, bool *progressed);
  /* The fd to poll and the events that mean "progress is possible now". */
  int (*poll_fd)(hora__conn *conn, short *events);
  /* Registration of long-lived buffers (a no-op for sockets). Transfers
   * into and out of registered memory may move without a copy. */
  int (*reg_mem)(hora__net *net, void *buf, size_t len, void **handle);
  /* Device (GPU) memory exported as a dma-buf: fd and the offset of buf in
   * it. NULL where the transport cannot reach device memory. Device memory
   * must be used at both ends of a transfer. */
  int (*reg_dmabuf)(hora__net *net, void *buf, size_t len, int fd, uint64_t offset,
                    void **handle);
  int (*dereg_mem)(hora__net *net, void *handle);
  /* Adds another connected socket to a connection, which from then on
   * splits each transfer across all of them, the same way at both ends.
   * NULL where a connection has one. */
  int (*add_stream)(hora__conn *conn, int fd);
  void (*close)(hora__conn *conn);
};

/* Most sockets one stream connection stripes its transfers over. */
#define HORA_TCP_STREAMS_MAX 8

/* The transports this build has, by name ("tcp", "ib", and "mock" for the
 * unit tests); NULL for a name it does not have. The bootstrap and the
 * algorithms reach a transport only through this table and the vtable. */
const struct hora__transport *hora__transport_find(const char *name);

#endif
