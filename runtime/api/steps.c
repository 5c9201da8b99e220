/* hora_step_mark and hora_get_step_stats (observe/steps.h keeps the
 * figures; here they meet the process's collective totals). */
#include <stddef.h>
#include <string.h>

#include "base/log.h"
#include "runtime/observe/steps.h"
#include "runtime/runtime.h"

HORA_EXTERN int hora_step_mark(void) {
  hora__error_clear();
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = hora__api_running(&rc, "hora_step_mark");
  if (!rt) {
    return rc;
  }
  hora_stats s;
  hora__stats_total(&s, rt);
  struct hora__step_totals t = {.bytes = s.bytes,
                                .bus_bytes = (double)s.bus_bytes,
                                .communicate_ns = (uint64_t)(s.communicate_seconds * 1e9)};
  hora__steps_mark(&t);
  return hora__api_leave(HORA_SUCCESS);
}

HORA_EXTERN int hora_get_step_stats(hora_step_stats *stats) {
  hora__error_clear();
  if (!stats) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_get_step_stats: stats is NULL");
  }
  if (stats->struct_size < offsetof(hora_step_stats, steps) + sizeof(uint64_t) ||
      stats->struct_size > (1u << 16)) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_get_step_stats: stats->struct_size is %zu; "
                       "set it to sizeof(hora_step_stats)", stats->struct_size);
  }
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = hora__api_running(&rc, "hora_get_step_stats");
  if (!rt) {
    return rc;
  }
  struct hora__step_snapshot n;
  hora__steps_get(&n);
  hora_step_stats s;
  memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  s.steps = n.steps;
  s.seconds = (double)n.step_ns * 1e-9;
  s.wait_seconds = (double)n.wait_ns * 1e-9;
  s.compute_seconds = s.seconds - s.wait_seconds;
  s.bytes = n.bytes;
  s.communicate_seconds = (double)n.communicate_ns * 1e-9;
  s.bus_bytes = n.bus_bytes;
  s.last_seconds = (double)n.last_ns * 1e-9;
  s.last_wait_seconds = (double)n.last_wait_ns * 1e-9;
  s.last_compute_seconds = s.last_seconds - s.last_wait_seconds;
  s.last_bytes = n.last_bytes;
  s.last_bus_bandwidth =
      n.last_communicate_ns ? n.last_bus_bytes / ((double)n.last_communicate_ns * 1e-9) : 0;
  size_t keep = stats->struct_size;
  memcpy(stats, &s, HORA_MIN(keep, sizeof(s)));
  stats->struct_size = keep;
  return hora__api_leave(HORA_SUCCESS);
}
