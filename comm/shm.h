/* Shared memory between the ranks of one host.
 *
 * The host's local rank 0 creates one anonymous segment (memfd: it has no
 * name in /dev/shm, so nothing is left behind when processes crash); the
 * others map it through /proc/<pid>/fd. Each rank owns a slot of two halves,
 * used in turn by consecutive pieces of work, and a host-wide barrier lives
 * in the first page. Every rank can read every slot: the direct collectives
 * (shm_coll.c) reduce straight out of the peers' buffers.
 *
 *   | barrier page | slot 0: header, half 0, half 1 | slot 1: ... |
 */
#ifndef HORA_SHM_H
#define HORA_SHM_H

#include <mpi.h>
#include <sys/types.h>

#include "comm.h"

struct hora__shm;

/* Collective over `local` (the ranks of this host). On failure to map the
 * segment on any rank, every rank gets *out = NULL and a logged reason, and
 * the job goes on over sockets. */
int hora__shm_create(hora__comm *comm, MPI_Comm local, struct hora__shm **out);
void hora__shm_destroy(struct hora__shm *shm);

size_t hora__shm_half_bytes(const struct hora__shm *shm);
/* Half `half` (0 or 1) of local rank lr's slot. */
char *hora__shm_half(const struct hora__shm *shm, int lr, int half);

/* The process id of local rank lr, and whether this host's ranks may read
 * each other's memory directly (process_vm_readv: "cross-memory attach"),
 * which every local rank checked at creation. */
pid_t hora__shm_pid(const struct hora__shm *shm, int lr);
bool hora__shm_cma(const struct hora__shm *shm);

/* Waits until every local rank has arrived. Spins for at most
 * comm->spin_us, then sleeps on a futex; meanwhile it services control
 * traffic and fails with HORA_ERR_PEER_LOST if a local peer process is gone. */
int hora__shm_barrier(hora__comm *comm);

#endif
