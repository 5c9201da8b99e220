/* RDMA transport over libibverbs (InfiniBand and RoCE).
 *
 * Connection: one reliable-connected queue pair per peer. The peers first
 * meet on an authenticated TCP socket (comm/bootstrap), over which they swap,
 * without blocking (every connection of the process at once), what the
 * other needs: QP number, LID, GID, MTU, and the address and rkey of their
 * receive ring. The socket then only stays open as a liveness signal.
 *
 * Data: a byte stream, like the TCP transport. The sender copies a chunk of
 * at most SLOT bytes into one of its registered send slots and writes it
 * with RDMA WRITE WITH IMMEDIATE into the next slot of the receiver's ring;
 * the immediate carries the slot and the length. The receiver copies slots
 * out, in order, into the posted receives, and gives each slot back with a
 * credit: a zero-byte write whose immediate counts the slots returned.
 *
 * Zero copy: a receive of at least HORA_IB_ZERO_COPY_MIN bytes first tells
 * the sender where it goes, with a descriptor written into the sender's
 * control array. Inside registered memory (the fusion buffer, the ring's
 * staging) that is the address and rkey, and the sender writes the bytes
 * straight there: from its own registered memory with no copy at all, else
 * through its send slots. Elsewhere the descriptor says "use the ring".
 * Both sides apply the same size test to transfers of the same length, so
 * they always agree on which transfers carry a descriptor.
 *
 * GPUDirect: device memory registered through its dma-buf (reg_dmabuf) is
 * never touched by the CPU, so every transfer into or out of it is direct,
 * whatever its size; the algorithms use device memory at both ends.
 *
 *   receiver --descriptor(addr, rkey, len)--> sender's control array
 *   sender   --RDMA_WRITE ... RDMA_WRITE_WITH_IMM(done)--> receive buffer
 *
 *   sender                                   receiver
 *   send slot k --RDMA_WRITE_WITH_IMM(k,len)--> ring slot k  -> irecv buffer
 *               <--credits n, riding on the receiver's own data writes,
 *                  or alone once half the ring is owed
 *
 * Completions of every connection arrive on one completion queue, whose
 * completion channel is the fd the coordinator sleeps on (after a bounded
 * poll); a failed completion or a port event is HORA_ERR_PEER_LOST with
 * ibv_wc_status_str in the message.
 *
 * Files: device.c (the device every connection shares), conn.c (a
 * connection's set-up and teardown), data.c (the data path, and the
 * vtable), reg.c (registered memory); this header the state they share. */
#ifndef HORA_IB_H
#define HORA_IB_H

#include "base/common.h"

#if HORA_HAVE_VERBS

#include <infiniband/verbs.h>

#include "comm/transport/builtin.h"
#include "comm/transport/net.h"
#include "comm/transport/ib/ib_wire.h"

#define SLOTS HORA_IB_SLOTS
#define SLOT HORA_IB_SLOT
#define RTR_SLOTS 8           /* receive descriptors in flight per connection */
#define RECV_DEPTH (2 * SLOTS + 2 * RTR_SLOTS) /* receive WRs kept posted */
#define SEND_DEPTH (2 * SLOTS + 2 * RTR_SLOTS)
#define ZC_PIECE (1u << 30)   /* largest single RDMA write */
#define SIGNAL_EVERY 8 /* ask for a send completion on every 8th write */
/* Immediate data: see ib_wire.h. */
#define INLINE_MAX 128 /* small writes travel inside the work request */
#define IMM_CREDIT HORA_IB_IMM_BARE
#define IMM_CREDITS_SHIFT HORA_IB_IMM_CREDITS_SHIFT
#define IMM_SLOT_SHIFT HORA_IB_IMM_SLOT_SHIFT
enum {
  KIND_CREDIT = HORA_IB_KIND_CREDIT,
  KIND_DESCRIPTOR = HORA_IB_KIND_DESCRIPTOR,
  KIND_DIRECT_DONE = HORA_IB_KIND_DIRECT_DONE
};

/* Where a receive wants its bytes; len 0: through the ring. */
struct ib_descriptor {
  uint64_t addr;
  uint64_t len;
  uint32_t rkey;
  uint32_t pad;
};

/* hora__xfer.mode of a receive: decided when its descriptor goes out. */
enum { RECV_UNDECIDED = 0, RECV_RING, RECV_DIRECT, RECV_FLUSHING };
/* How the send at the head of the queue travels. */
enum { SEND_UNDECIDED = 0, SEND_RING, SEND_DIRECT, SEND_DIRECT_VIA_SLOTS };

/* A buffer registered by hora__comm_register: big transfers into or out
 * of it move without a copy. */
struct ib_region {
  char *base;
  size_t len;
  struct ibv_mr *mr;
  bool device; /* GPU memory: direct transfers only */
};

/* The device, shared by every connection of the process. */
struct ib_ctx {
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_comp_channel *channel;
  struct ibv_cq *cq;
  int port;
  int gid_index;
  union ibv_gid gid;
  uint16_t lid;
  enum ibv_mtu mtu;
  bool roce;
  int kick_fd; /* eventfd: "completions are already waiting, do not sleep" */
  uint64_t async_checked; /* when async events were last read */
  bool armed;
  int refs;
  struct ib_conn **conns; /* by slot in the table below, for completion dispatch */
  int nconns, capconns;
  struct ib_region *regions;
  int nregions, capregions;
  /* GPUDirect: a queue pair connected to itself, whose 1-byte RDMA READ
   * of GPU memory after a direct write into it makes the NIC's writes
   * visible to the GPU before anyone reads them. */
  struct ibv_qp *flush_qp;
  struct ibv_mr *flush_mr;
  char *flush_buf;
  uint64_t flush_posted, flush_done;
  char flush_error[160];
  /* Bytes sent each way, logged (info) when the device closes. */
  uint64_t bytes_direct, bytes_via_slots, bytes_ring;
  char name[64];
};


extern struct ib_ctx *hora__ib_dev; /* device.c; coordinator thread only */

/* Where a connection's set-up stands: the two sides swap their records
 * over the socket, connect the queue pair, then swap one byte saying it
 * can receive, so that nobody writes before the other side is ready. */
enum ib_setup { SETUP_RECORDS, SETUP_READY, SETUP_DONE };

struct ib_conn {
  struct hora__conn base;
  int fd; /* the TCP socket the peers met on */
  enum ib_setup setup;
  struct hora__ib_record me, them; /* the records swapped during set-up */
  uint8_t me_wire[HORA_IB_RECORD_SIZE], them_wire[HORA_IB_RECORD_SIZE];
  size_t sent, got;         /* bytes of the current swap moved */
  uint32_t psn;             /* our first packet sequence number */
  struct ibv_qp *qp;
  char *send_buf, *ring;
  struct ibv_mr *send_mr, *ring_mr;
  uint64_t remote_ring;
  uint32_t remote_rkey;
  /* Descriptors: ctl[0..RTR_SLOTS) are the peer's, for our sends;
   * ctl[RTR_SLOTS..) stage ours when they cannot go inline. */
  struct ib_descriptor *ctl;
  struct ibv_mr *ctl_mr;
  uint64_t remote_ctl;
  uint32_t remote_ctl_rkey;
  hora__xfer *desc_cursor; /* first receive not yet decided */
  uint32_t desc_sent;      /* descriptors written (slot index at the peer) */
  uint32_t desc_live;      /* of those, receives not yet complete */
  uint32_t direct_done;    /* direct writes finished, not yet booked */
  uint32_t desc_got, desc_used; /* the peer's descriptors arrived / consumed */
  uint64_t flush_seq;      /* the flush the head receive waits for */
  size_t zc_min;           /* transfers this big or bigger carry a descriptor */
  int head_mode;           /* SEND_* of the send at the head */
  uint64_t head_raddr;     /* where its next byte goes (direct) */
  uint32_t head_rkey, head_lkey;
  /* Direct sends posted, waiting for their last write to complete. */
  struct {
    hora__xfer *x;
    uint64_t seq;
  } direct_wait[RTR_SLOTS];
  uint32_t direct_wait_head, direct_wait_n;
  /* Sending: slots are used round-robin; a slot is free again when its
   * write completed locally, and the peer has room when it returned the
   * matching credit. */
  uint32_t send_next;      /* next remote ring slot to write */
  uint32_t local_next;     /* next local send slot to fill */
  uint32_t send_busy;      /* data writes posted, not yet completed locally */
  uint32_t sq_used;        /* all writes (data and credits) not yet completed */
  /* Only some writes are signalled; a completion retires every write up to
   * it, in order. is_data[seq % SEND_DEPTH] says which of them used a slot. */
  uint64_t posted, retired, last_signaled;
  uint8_t is_data[SEND_DEPTH];
  uint32_t credits;        /* remote slots we may write */
  /* Receiving: ring slots that arrived, in order, from ring_head. */
  uint32_t ring_head;
  uint32_t ring_ready;     /* slots arrived, not yet fully copied out */
  uint32_t ring_len[SLOTS];
  uint32_t head_off;       /* bytes of the head slot already copied out */
  uint32_t credits_owed;   /* slots copied out, not yet returned */
  uint32_t max_inline;     /* what the QP accepted for inline data */
  int error;               /* a failed completion: the connection is dead */
  char error_msg[256];
};

/* device.c */
int hora__ib_verbs_error(const char *what);
int hora__ib_dev_get(hora__net *net);
void hora__ib_dev_put(void);
bool hora__ib_available(void);

/* conn.c */
int hora__ib_post_recv(struct ib_conn *c);
int hora__ib_connect_qp(struct ibv_qp *qp, struct ib_conn *c, const struct hora__ib_record *peer,
                        uint32_t my_psn);
int hora__ib_begin(hora__net *net, int fd, int peer, hora__conn **out);
int hora__ib_establish(hora__net *net, hora__conn *conn, bool *ready, int *fd, short *events);
void hora__ib_close(hora__conn *conn);

/* reg.c */
int hora__ib_reg_mem(hora__net *net, void *buf, size_t len, void **handle);
int hora__ib_reg_dmabuf(hora__net *net, void *buf, size_t len, int fd, uint64_t offset,
                        void **handle);
int hora__ib_dereg_mem(hora__net *net, void *handle);

#endif /* HORA_HAVE_VERBS */
#endif
