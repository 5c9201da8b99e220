/* Who the others wait for. For each negotiation that scheduled operations,
 * the rank that came last and how long the others had waited for it (the
 * mean over them) are noted here, at rank 0 of the set; every
 * HORA_STRAGGLER_REPORT_SECONDS the window's figures are looked at, and a
 * rank (or a host, when the lateness is spread over its ranks) that made
 * the others wait for more than HORA_STRAGGLER_SHARE of the time is named
 * in one line. Plain data, unit-tested alone. */
#ifndef HORA_STRAGGLERS_H
#define HORA_STRAGGLERS_H

#include <pthread.h>

#include "base/common.h"

struct hora__stragglers {
  /* The coordinator notes and reports; the metrics thread reads (top). */
  pthread_mutex_t mu;
  int size;
  int *names;  /* [size] each rank's job rank, for messages */
  int *host;   /* [size] its host, 0..nhosts-1 */
  char **host_name; /* [nhosts] */
  int nhosts;
  /* Since the start. */
  uint64_t ops, waited_ns;
  uint64_t *last_ops, *last_waited_ns; /* [size] */
  /* The window being looked at. */
  uint64_t win_ops, win_start_ns, win_steps, win_step_ns;
  uint64_t *win_last, *win_waited;     /* [size] */
  uint64_t *host_last, *host_waited;   /* [nhosts], scratch for the report */
};

/* host_of[r]: rank r's host name. names: job ranks (NULL: r itself). */
int hora__stragglers_init(struct hora__stragglers *s, int size, const int *names,
                          const char *const *host_of, uint64_t now_ns);
void hora__stragglers_free(struct hora__stragglers *s);
/* `ops` operations waited for `rank`, the others `waited_ns` on average. */
void hora__stragglers_note(struct hora__stragglers *s, int rank, uint64_t ops, uint64_t waited_ns);
/* Ends the window at now_ns (steps, step_ns: the process's step totals,
 * hora_step_mark's) and starts the next. True, with the line in buf, when
 * someone made the others wait for more than `share` of the window's time
 * (of its steps' time, where steps were marked). */
bool hora__stragglers_report(struct hora__stragglers *s, uint64_t now_ns, uint64_t steps,
                             uint64_t step_ns, double share, char *buf, size_t n);

/* The ranks the others waited for longest since the start, longest first:
 * at most max of them (those ever last), and the totals. Any thread. */
struct hora__straggler_row {
  int rank; /* the job's */
  const char *host;
  uint64_t ops, waited_ns;
};
int hora__stragglers_top(struct hora__stragglers *s, struct hora__straggler_row *rows, int max,
                         uint64_t *ops, uint64_t *waited_ns);

#endif
