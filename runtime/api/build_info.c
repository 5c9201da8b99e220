/* What this build of libhora contains, for bindings and tools that ask at
 * run time (hora.torch's mpi_built(), nccl_built(), cuda_built()). */
#include <string.h>

#include "base/common.h"
#include "runtime/runtime.h"

HORA_EXTERN int hora_built(const char *feature) {
  if (!feature) {
    return 0;
  }
  if (strcmp(feature, "mpi") == 0) {
    return HORA_HAVE_MPI;
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
#if HORA_HAVE_MPI
  return hora__mpi_threads_multiple();
#else
  return 0; /* a build without MPI never runs it */
#endif
}
