/* Building a communicator from a membership: the members a rendezvous
 * names (comm/bootstrap/rendezvous.h), numbered by an epoch. Everything a
 * communicator holds (addresses, connections, rings, the host's segment,
 * the algorithm choice, buffers) comes from these and goes with
 * hora__comm_destroy, so a process can build one, tear it down and build
 * another (other members, another order) as often as it needs. The
 * connections' key is derived from the epoch: a connection from a member of
 * another epoch never proves itself. */
#ifndef HORA_COMMUNICATOR_H
#define HORA_COMMUNICATOR_H

#include "comm/bootstrap/rendezvous.h"
#include "comm/comm.h"

/* Collective over the rendezvous's members; rdv stays the caller's (an MPI
 * one's communicator is duplicated for hora_process_set_from_mpi_comm).
 * epoch: this process's proposal; the membership's is the highest of the
 * members' (comm->proc->epoch), so it is new to every one of them; 0 for a
 * process set, whose members' world numbers the job. */
int hora__comm_create(struct hora__rdv *rdv, uint64_t epoch, const int *ctrl_peers,
                      int nctrl_peers, hora__comm **comm);

#endif
