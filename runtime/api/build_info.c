/* What this build of libhora contains, for bindings and tools that ask at
 * run time (hora.torch's nccl_built(), cuda_built()). */
#include <mpi.h>
#include <string.h>

#include "base/common.h"

HORA_EXTERN int hora_built(const char *feature) {
  if (!feature) {
    return 0;
  }
  if (strcmp(feature, "mpi") == 0) {
    return 1;
  }
  if (strcmp(feature, "cuda") == 0) {
    return HORA_HAVE_CUDA;
  }
  if (strcmp(feature, "nccl") == 0) {
    return HORA_HAVE_NCCL;
  }
  if (strcmp(feature, "verbs") == 0) {
    return HORA_HAVE_VERBS;
  }
  return 0;
}

HORA_EXTERN int hora_mpi_threads_supported(void) {
  int inited = 0, finalized = 0, level = MPI_THREAD_SINGLE;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!inited || finalized) {
    return 0;
  }
  MPI_Query_thread(&level);
  return level == MPI_THREAD_MULTIPLE;
}
