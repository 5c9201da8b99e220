/* The runtime's counters as a metrics source (observe/metrics.h), and the
 * metrics thread's life: started by hora_init, told the new rank after an
 * elastic rebuild, stopped by hora_finalize before the world is freed. */
#include <stdlib.h>

#include "base/log.h"
#include "runtime/observe/metrics.h"
#include "runtime/observe/steps.h"
#include "runtime/runtime.h"

struct snapshots {
  struct hora__metrics_snapshot *s;
  int n, cap;
};

static void take(struct hora__runtime *rt, void *arg) {
  struct snapshots *c = arg;
  if (c->n == c->cap) {
    int cap = c->cap ? c->cap * 2 : 4;
    void *s = realloc(c->s, (size_t)cap * sizeof(*c->s));
    if (!s) {
      return; /* that set is missing from this scrape */
    }
    c->s = s;
    c->cap = cap;
  }
  struct hora__metrics_snapshot *s = &c->s[c->n++];
  memset(s, 0, sizeof(*s));
  s->stats.struct_size = sizeof(s->stats);
  hora__stats_add(&s->stats, rt);
  hora__metrics_snapshot_take(s, rt);
}

/* The process's steps (hora_step_mark): where their time went. */
static void steps_source(struct hora__metrics_writer *w) {
  struct hora__step_snapshot s;
  hora__steps_get(&s);
  const struct {
    const char *name, *type, *help;
    double value;
  } families[] = {
      {"hora_steps_total", "counter",
       "Training steps ended by hora_step_mark (DistributedOptimizer.step())", (double)s.steps},
      {"hora_step_seconds_total", "counter", "Wall time of those steps", (double)s.step_ns * 1e-9},
      {"hora_step_exposed_communication_seconds_total", "counter",
       "Of that, the time some thread waited in hora_wait (synchronize)", (double)s.wait_ns * 1e-9},
      {"hora_step_bytes_total", "counter", "Bytes of the collectives completed within those steps",
       (double)s.bytes},
      {"hora_last_step_seconds", "gauge", "Wall time of the last step", (double)s.last_ns * 1e-9},
      {"hora_last_step_exposed_communication_seconds", "gauge",
       "Of that, the time some thread waited in hora_wait", (double)s.last_wait_ns * 1e-9},
  };
  for (size_t i = 0; i < HORA_ARRAY_SIZE(families); i++) {
    hora__metrics_family(w, families[i].name, families[i].type, families[i].help);
    hora__metrics_sample(w, families[i].name, NULL, families[i].value);
  }
}

/* The world and every process set, each read from its atomics; the world
 * counted as in use meanwhile, as hora_get_stats does. */
static void runtime_source(struct hora__metrics_writer *w, void *arg) {
  (void)arg;
  int rc = HORA_SUCCESS;
  struct hora__runtime *world = hora__api_running(&rc, "metrics");
  if (!world) {
    hora__error_clear();
    return; /* between memberships (elastic): no runtime to report */
  }
  struct snapshots c = {0};
  take(world, &c);
  hora__process_sets_each(take, &c);
  hora__api_leave(HORA_SUCCESS);
  if (c.n > 0) {
    hora__metrics_render_runtimes(w, c.s, c.n, &c.s[0].stats);
  }
  free(c.s);
  steps_source(w);
}

static bool source_added;

void hora__metrics_api_start(struct hora__runtime *rt) {
  hora__metrics_api_identity(rt);
  if (!source_added && hora__metrics_add_source(runtime_source, NULL) == HORA_SUCCESS) {
    source_added = true;
  }
  if (hora__metrics_start(rt->rank, rt->comm->local_rank) != HORA_SUCCESS) {
    HORA_WARN("%s; the job goes on without metrics", hora__error_message());
    hora__error_clear();
  }
}

void hora__metrics_api_identity(struct hora__runtime *rt) {
  hora__metrics_set_identity(rt->rank, rt->size, rt->comm->local_rank);
}

void hora__metrics_api_stop(void) { hora__metrics_stop(); }
