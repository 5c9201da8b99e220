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
#include "runtime/observe/metrics.h"
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

/* ---- metrics: the sets whose first rank is here, in one source ---------------
 * One source for all of them, so each family is written once. A set leaves
 * the list (under its lock) before its notes are freed. */
#define TOP_RANKS 16

struct watched {
  struct watched *next;
  struct hora__stragglers *late;
  int set_id;
};
static pthread_mutex_t watched_mu = PTHREAD_MUTEX_INITIALIZER;
static struct watched *watched_sets;
static pthread_once_t source_once = PTHREAD_ONCE_INIT;

/* One set's figures, read once per scrape. */
struct late_view {
  int set_id, n;
  uint64_t ops, waited_ns;
  struct hora__straggler_row rows[TOP_RANKS];
};

static void late_family(struct hora__metrics_writer *w, const struct late_view *v, int nv,
                        const char *name, const char *help, bool per_rank, bool seconds) {
  hora__metrics_family(w, name, "counter", help);
  for (int i = 0; i < nv; i++) {
    char labels[300], host[2 * 64 + 1];
    for (int r = 0; r < (per_rank ? v[i].n : 1); r++) {
      uint64_t count = per_rank ? v[i].rows[r].ops : v[i].ops;
      uint64_t ns = per_rank ? v[i].rows[r].waited_ns : v[i].waited_ns;
      int o = snprintf(labels, sizeof(labels), "process_set=\"%d\"", v[i].set_id);
      if (per_rank) {
        hora__metrics_escape(host, sizeof(host), v[i].rows[r].host);
        snprintf(labels + o, sizeof(labels) - (size_t)o, ",last_rank=\"%d\",last_host=\"%s\"",
                 v[i].rows[r].rank, host);
      }
      if (seconds) {
        hora__metrics_sample(w, name, labels, (double)ns * 1e-9);
      } else {
        hora__metrics_sample_u64(w, name, labels, count);
      }
    }
  }
}

static void late_source(struct hora__metrics_writer *w, void *arg) {
  (void)arg;
  pthread_mutex_lock(&watched_mu);
  int nv = 0;
  for (struct watched *s = watched_sets; s; s = s->next) {
    nv++;
  }
  struct late_view *v = nv ? hora__calloc((size_t)nv, sizeof(*v)) : NULL;
  int i = 0;
  for (struct watched *s = watched_sets; s && v; s = s->next, i++) {
    v[i].set_id = s->set_id;
    v[i].n = hora__stragglers_top(s->late, v[i].rows, TOP_RANKS, &v[i].ops, &v[i].waited_ns);
  }
  pthread_mutex_unlock(&watched_mu);
  if (!v) {
    return; /* none watched (or out of memory: left out of this scrape) */
  }
  late_family(w, v, nv, "hora_straggler_operations_total",
              "Operations negotiated in the process set that waited for one rank to come last "
              "(the set's first rank only)", false, false);
  late_family(w, v, nv, "hora_straggler_wait_seconds_total",
              "The other ranks' mean wait for the last rank of those operations, summed", false,
              true);
  late_family(w, v, nv, "hora_last_rank_operations_total",
              "Operations for which the rank came last, for the ranks the others waited for "
              "longest (at most 16; the set's first rank only)", true, false);
  late_family(w, v, nv, "hora_last_rank_wait_seconds_total",
              "The other ranks' mean wait for that rank, summed", true, true);
  free(v);
}

static void add_late_source(void) {
  if (hora__metrics_add_source(late_source, NULL) != HORA_SUCCESS) {
    HORA_WARN("metrics: no room for the stragglers' figures; they are left out");
    hora__error_clear();
  }
}

static void watch(struct hora__set *set) {
  struct watched *n = hora__calloc(1, sizeof(*n));
  if (!n) {
    return; /* its figures are left out of the metrics */
  }
  (void)pthread_once(&source_once, add_late_source);
  n->late = set->late;
  n->set_id = set->e->rt ? set->e->rt->set_id : 0;
  pthread_mutex_lock(&watched_mu);
  n->next = watched_sets;
  watched_sets = n;
  pthread_mutex_unlock(&watched_mu);
}

void hora__engine_late_free(struct hora__set *set) {
  if (!set->late) {
    return;
  }
  pthread_mutex_lock(&watched_mu);
  for (struct watched **p = &watched_sets; *p; p = &(*p)->next) {
    if ((*p)->late == set->late) {
      struct watched *gone = *p;
      *p = gone->next;
      free(gone);
      break;
    }
  }
  pthread_mutex_unlock(&watched_mu);
  hora__stragglers_free(set->late);
  free(set->late);
  set->late = NULL;
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
  watch(set);
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
