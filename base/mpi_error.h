/* MPI's own words for its errors (MPI only bootstraps the job). */
#ifndef HORA_MPI_ERROR_H
#define HORA_MPI_ERROR_H

/* HORA_ERR_SYSTEM with MPI's own words for err, returned by the named call. */
int hora__mpi_error(int err, const char *call);

#endif
