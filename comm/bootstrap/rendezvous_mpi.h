/* The mpi rendezvous (rendezvous.h), in a build with MPI only: the one
 * part of the bootstrap that includes mpi.h. */
#ifndef HORA_RENDEZVOUS_MPI_H
#define HORA_RENDEZVOUS_MPI_H

#include <mpi.h>

#include "comm/bootstrap/rendezvous.h"

/* MPI_Allgather and MPI_Bcast over a duplicate of comm (MPI running). */
int hora__rdv_open_mpi(MPI_Comm comm, struct hora__rdv **out);
/* The duplicate, handed over: the rendezvous still uses it until it is
 * closed, but no longer frees it; the caller does. */
MPI_Comm hora__rdv_mpi_take(struct hora__rdv *r);

#endif
