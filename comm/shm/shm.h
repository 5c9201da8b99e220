/* Shared memory between the ranks of one host.
 *
 * The host's local rank 0 creates one anonymous segment (memfd: it has no
 * name in /dev/shm, so nothing is left behind when processes crash); the
 * others map it through /proc/<pid>/fd. Each rank owns a slot of two halves,
 * used in turn by consecutive pieces of work. The first page holds a
 * host-wide barrier and the table of allreduce paths (path_tuner.h). Every
 * rank can read every slot: the direct collectives
 * (shm_coll.c) reduce straight out of the peers' buffers.
 *
 *   | header page | slot 0: header, half 0, half 1 | slot 1: ... |
 */
#ifndef HORA_SHM_H
#define HORA_SHM_H

#include <sys/types.h>

#include "comm/transport/net.h"
#include "comm/shm/path_tuner.h"

struct hora__shm;

/* Set-up, in three steps with two exchanges among the host's ranks between
 * them, which the bootstrap carries (every rank of the job takes part in
 * both, so their number never depends on the host):
 *   begin   the leader (local rank 0) creates the segment; *mine to exchange
 *   attach  with every local rank's hello (local rank order): map it, try
 *           reading the next rank's memory; *mine to exchange
 *   finish  with every local rank's verdict: *s stays, or is freed and
 *           NULL (the job goes on over sockets, a reason logged) where any
 *           rank of the host could not map it. */
struct hora__shm_hello {
  int32_t pid, fd, global, mode, ok, pad;
  uint64_t cma_addr;
};
struct hora__shm_verdict {
  int32_t mapped, cma;
};
/* populate: every page mapped at once (the world's segment); a process
 * set's comes in as its collectives first reach it, so that making and
 * dropping sets stays cheap. */
int hora__shm_begin(hora__net *net, int local_rank, int local_size, bool populate,
                    struct hora__shm **s, struct hora__shm_hello *mine);
void hora__shm_attach(struct hora__shm *s, const struct hora__shm_hello *host,
                      struct hora__shm_verdict *mine);
void hora__shm_finish(struct hora__shm **s, const struct hora__shm_verdict *host);
void hora__shm_destroy(struct hora__shm *shm);

size_t hora__shm_half_bytes(const struct hora__shm *shm);
/* Half `half` (0 or 1) of local rank lr's slot. */
char *hora__shm_half(const struct hora__shm *shm, int lr, int half);

/* The process id of local rank lr, and whether this host's ranks may read
 * each other's memory directly (process_vm_readv: "cross-memory attach"),
 * which every local rank checked at creation. */
pid_t hora__shm_pid(const struct hora__shm *shm, int lr);
bool hora__shm_cma(const struct hora__shm *shm);

/* The path an allreduce giving each local rank `share` bytes takes for
 * buffers the peers cannot map (path_tuner.h): as HORA_SHM_SINGLE_COPY says,
 * or with `auto`, as local rank 0 chose by timing both and published in the
 * segment's first page. Every local rank reads the same value
 * for the same operation: see hora__shm_path_begin. */
enum hora__shm_path hora__shm_path(const struct hora__shm *shm, size_t share);
/* With auto, every local rank calls these around each operation that
 * consults the table and has a buffer outside the blocks: begin right after
 * the operation's first barrier, where all start together, and end when this
 * rank's part is done (ns since begin). Local rank 0, in begin, records the
 * previous such operation's time (the slowest rank's) and writes its current
 * choices into the table: safe there, since every rank has read the table
 * for this operation before the barrier, and none can read it for the next
 * before local rank 0 reaches this operation's last barrier. */
void hora__shm_path_begin(struct hora__shm *shm, size_t share, enum hora__shm_path path,
                          size_t bytes);
void hora__shm_path_end(struct hora__shm *shm, uint64_t ns);

/* Waits until every local rank has arrived. Spins for at most
 * comm->net->spin_us, then sleeps on a futex; meanwhile it services control
 * traffic and fails with HORA_ERR_PEER_LOST if a local peer process is gone. */
int hora__shm_barrier(struct hora__shm *shm, hora__net *net);

/* The local rank of the communicator's rank `rank` (-1: another host), and back. */
int hora__shm_local_of(const struct hora__shm *shm, int rank);
int hora__shm_rank_of(const struct hora__shm *shm, int lr);
int hora__shm_local_size(const struct hora__shm *shm);
/* Mailboxes: small control messages between the host's ranks, without a
 * system call. Sends p to local rank `to`; false (nothing written) where
 * it does not fit, the ring is full, or the reader sleeps in poll(): send
 * over the socket then. *nudge: the reader fell asleep as it was written;
 * wake it (any frame on the socket). */
bool hora__shm_mail_send(struct hora__shm *shm, int to, const void *p, size_t len, bool *nudge);
/* Hands each message waiting from local rank `from` to fn, in order. */
int hora__shm_mail_read(struct hora__shm *shm, int from,
                        int (*fn)(void *arg, int from, const uint8_t *p, size_t len), void *arg);
/* Before sleeping in poll() (true) and after (false): a count, since the
 * coordinator and a caller driving the engine may both sleep. True: mail
 * came in meanwhile; do not sleep (this sleeper is uncounted again). */
bool hora__shm_mail_sleep(struct hora__shm *shm, bool sleeping);

/* ---- hora_mem_alloc blocks (shm_mem.c) ---- */

/* Where a buffer lies in a block: what a peer needs to map the block. id 0:
 * the buffer is not inside one block. */
struct hora__mem_ref {
  uint64_t id; /* unique in this process, never reused */
  uint64_t fd;
  uint64_t ino;
  uint64_t len; /* of the whole block */
  uint64_t offset;
};

int hora__mem_alloc(size_t bytes, void **ptr);
int hora__mem_free(void *ptr);
/* Whether [p, p + len) lies inside one block; fills *ref either way. */
bool hora__mem_find(const void *p, size_t len, struct hora__mem_ref *ref);
/* How many blocks this process has freed so far. */
uint64_t hora__mem_frees(void);

/* This rank's mappings of its local peers' blocks, one set per local rank. */
struct hora__peer_maps;
struct hora__peer_maps *hora__peer_maps_new(int local_size);
void hora__peer_maps_free(struct hora__peer_maps *maps, int local_size);
/* This process's address for the peer's buffer that *ref describes, mapping
 * the block on first use; NULL when it cannot be mapped (the caller copies
 * through the kernel instead). peer_frees is the peer's hora__mem_frees():
 * when it moved, every old mapping of that peer's blocks is dropped first.
 * op numbers the operation, increasing: a mapping handed out for the current
 * operation is never dropped to make room. The peer publishes *ref: where
 * ref->offset + need bytes do not lie inside the mapping, NULL with *bad
 * set (the caller fails the operation). */
char *hora__peer_mem(struct hora__peer_maps *maps, int lr, pid_t pid, uint64_t peer_frees,
                     uint64_t op, const struct hora__mem_ref *ref, size_t need, bool *bad);

#endif
