/* Who the others wait for, measured by the negotiation cycles themselves:
 * each rank times its own wait for the operations a cycle schedules (from
 * the earliest of its submissions among them, or the end of the last such
 * cycle if later, to the cycle's end: no wait is counted twice), and the
 * next cycle reduces those times with its bits: the least wait names the
 * rank that came last, and the sum gives the others' mean wait beyond it.
 * Every rank learns it; the set's first rank keeps the notes and reports
 * them (negotiate/stragglers.h). Times are each rank's own durations, so
 * the hosts' clocks need not agree. */
#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/transport/net.h"
#include "runtime/engine/engine.h"
#include "runtime/observe/steps.h"
#include "runtime/observe/timeline.h"

static uint64_t report_interval_ns(void) {
  double s = hora__params.STRAGGLER_REPORT_SECONDS;
  return s > 0 ? (uint64_t)(s * 1e9) : 0;
}

static const int *job_ranks(const struct hora__set *set) {
  const struct hora__runtime *rt = set->e->rt;
  if (rt && rt->global_ranks) {
    return rt->global_ranks;
  }
  return set->comm->net ? set->comm->net->names : NULL;
}

int hora__engine_late_start(struct hora__set *set) {
  int size = set->comm->size;
  const hora__net *net = set->comm->net;
  const char **host_of = hora__calloc((size_t)size, sizeof(char *));
  set->late = hora__calloc(1, sizeof(*set->late));
  if (!host_of || !set->late) {
    free(host_of);
    return HORA_ERR_NO_MEMORY;
  }
  for (int r = 0; r < size; r++) {
    host_of[r] = net && net->peers ? net->peers[r].host : NULL;
  }
  uint64_t now = hora__now_ns();
  int rc = hora__stragglers_init(set->late, size, job_ranks(set), host_of, now);
  free(host_of);
  if (rc != HORA_SUCCESS) {
    free(set->late);
    set->late = NULL;
    return rc;
  }
  hora__controller_watch_late(set->ctl, set->late);
  uint64_t every = report_interval_ns();
  set->next_late_report_ns = every ? now + every : UINT64_MAX;
  return HORA_SUCCESS;
}

void hora__engine_late_contribute(struct hora__set *set) {
  bool told = set->late_valid && set->late_ops > 0;
  set->acc_late = (struct hora__cycle_late){
      .ops = set->late_ops,
      .min_ns = told ? set->late_wait_ns : 0,
      .sum_ns = told ? set->late_wait_ns : 0,
      .min_rank = (uint32_t)set->comm->rank,
      .ranks = told ? 1u : 0u,
  };
}

void hora__engine_late_fold(struct hora__set *set, const struct hora__cycle_late *theirs) {
  hora__cycle_late_fold(&set->acc_late, theirs);
}

static void report(struct hora__set *set, uint64_t now) {
  struct hora__step_snapshot steps;
  hora__steps_get(&steps);
  char line[512];
  if (hora__stragglers_report(set->late, now, steps.steps, steps.step_ns,
                              hora__params.STRAGGLER_SHARE, line, sizeof(line))) {
    HORA_WARN("%s%s", set->e->rt ? set->e->rt->label : "", line);
  }
  uint64_t every = report_interval_ns();
  set->next_late_report_ns = every ? now + every : UINT64_MAX;
}

int hora__engine_late_cycle_end(struct hora__set *set, uint64_t now) {
  const struct hora__cycle_late *l = &set->acc_late;
  uint32_t size = (uint32_t)set->comm->size;
  if (l->ranks > size || (l->ranks > 0 && l->min_rank >= size) ||
      (l->ranks > 0 && l->sum_ns / l->ranks < l->min_ns)) {
    return hora__error(HORA_ERR_PROTOCOL, "cycle %llu carried a malformed lateness record "
                       "(%u ranks, least wait at rank %u)",
                       (unsigned long long)(set->cycles + 1), l->ranks, l->min_rank);
  }
  if (!set->late) {
    return HORA_SUCCESS;
  }
  if (l->ops > 0 && l->ranks == size && size > 1) {
    /* The others' mean wait beyond the last rank's own. */
    uint64_t beyond = (l->sum_ns - l->min_ns * size) / (size - 1);
    hora__stragglers_note(set->late, (int)l->min_rank, l->ops, beyond);
    if (hora__timeline_enabled()) {
      hora__timeline_last_rank(set->late->names[l->min_rank], (double)beyond * 1e-9, l->ops);
    }
  }
  if (now >= set->next_late_report_ns) {
    report(set, now);
  }
  return HORA_SUCCESS;
}

void hora__engine_late_measured(struct hora__set *set, uint64_t ops, bool valid,
                                uint64_t earliest_ns, uint64_t now) {
  set->late_ops = ops;
  set->late_valid = valid && ops > 0;
  uint64_t from = HORA_MAX(earliest_ns, set->late_prev_ns);
  set->late_wait_ns = now > from ? now - from : 0;
  if (ops > 0) {
    set->late_prev_ns = now;
  }
}
