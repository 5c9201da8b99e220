/* hora_init, one allreduce and hora_finalize, saying what happened on one
 * line: "init ok: rank R of N via KIND, sum S" or "init failed: MESSAGE"
 * (exit status 3). The start-up checks drive it with bad launch variables.
 * usage: init_probe */
#include <stdio.h>

#include "hora.h"

int main(void) {
  int rc = hora_init();
  if (rc != HORA_SUCCESS) {
    printf("init failed: %s\n", hora_last_error());
    return 3;
  }
  int64_t one = 1, sum = 0;
  rc = hora_allreduce("probe", &one, &sum, 1, HORA_INT64, HORA_SUM);
  printf("init ok: rank %d of %d via %s, sum %lld%s%s\n", hora_rank(), hora_size(),
         hora_bootstrap(), (long long)sum, rc ? ", allreduce failed: " : "",
         rc ? hora_last_error() : "");
  fflush(stdout);
  int size = hora_size();
  int frc = hora_finalize();
  return rc || frc || sum != size ? 1 : 0;
}
