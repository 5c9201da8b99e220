/* Training steps (hora_step_mark): where a step's time goes in this
 * process. Waiting callers (hora_wait) mark the intervals in which at least
 * one thread waited: the step's exposed communication; the rest is compute.
 * Process-wide, for every process set alike; any thread. */
#ifndef HORA_STEPS_H
#define HORA_STEPS_H

#include "base/common.h"

/* Totals of the process's collectives, read at each mark. */
struct hora__step_totals {
  uint64_t bytes;
  double bus_bytes;
  uint64_t communicate_ns;
};

struct hora__step_snapshot {
  uint64_t steps;
  uint64_t step_ns, wait_ns; /* summed over the steps ended */
  uint64_t bytes;
  double bus_bytes;
  uint64_t communicate_ns;
  uint64_t last_ns, last_wait_ns, last_bytes, last_communicate_ns;
  double last_bus_bytes;
};

/* Forgets every step (hora_init). */
void hora__steps_reset(void);
/* A caller starts and stops waiting for a request. */
void hora__steps_wait_begin(void);
void hora__steps_wait_end(void);
/* Ends the step in progress (the first call only starts one); with the
 * timeline on, writes its STEP event. */
void hora__steps_mark(const struct hora__step_totals *now);
void hora__steps_get(struct hora__step_snapshot *out);

#endif
