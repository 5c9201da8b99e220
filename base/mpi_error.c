#include "base/mpi_error.h"

#include <mpi.h>
#include <stdio.h>

#include "base/common.h"

int hora__mpi_error(int err, const char *call) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS) {
    snprintf(msg, sizeof(msg), "MPI error %d", err);
  }
  return hora__error(HORA_ERR_SYSTEM, "%s failed: %s", call, msg);
}
