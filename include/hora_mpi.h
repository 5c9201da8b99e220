/* hora with a program's own MPI communicators.
 *
 * Kept apart from <hora.h>, which stays free of mpi.h: include this one
 * only where the program uses MPI itself. */
#ifndef HORA_MPI_H
#define HORA_MPI_H

#include <mpi.h>

#include "hora.h"

#ifdef __cplusplus
extern "C" {
#endif

/* hora_init with `comm` as the job's world instead of MPI_COMM_WORLD (a
 * trainer that split MPI_COMM_WORLD itself, say): hora_rank and hora_size
 * are then ranks of comm. MPI must be initialised; hora works on a
 * duplicate and leaves comm to the program. Collective over comm. */
HORA_EXTERN int hora_init_comm(MPI_Comm comm);

/* The process set of the ranks of `comm` (a communicator made from the
 * job's world by MPI_Comm_split, say). Collective over every rank of the
 * job: each passes the communicator it belongs to, or MPI_COMM_NULL when
 * it is in none, and gets the handle of its own set (a rank passing
 * MPI_COMM_NULL gets a handle of which it is not a member, of size 0). The
 * members of one communicator must all pass it (HORA_ERR_MISMATCH on every
 * rank otherwise), and every member of comm must be a rank of the job.
 * The sets made by one call are numbered in the order of their lowest
 * global ranks. */
HORA_EXTERN int hora_process_set_from_mpi_comm(MPI_Comm comm, hora_process_set **ps);

#ifdef __cplusplus
}
#endif

#endif
