/* Who the others wait for: see stragglers.h. */
#include "runtime/negotiate/stragglers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/table.h"

void hora__stragglers_free(struct hora__stragglers *s) {
  for (int h = 0; s->host_name && h < s->nhosts; h++) {
    free(s->host_name[h]);
  }
  free(s->host_name);
  free(s->names);
  free(s->host);
  free(s->last_ops);
  free(s->last_waited_ns);
  free(s->win_last);
  free(s->win_waited);
  free(s->host_last);
  free(s->host_waited);
  if (s->size > 0) {
    pthread_mutex_destroy(&s->mu);
  }
  memset(s, 0, sizeof(*s));
}

int hora__stragglers_init(struct hora__stragglers *s, int size, const int *names,
                          const char *const *host_of, uint64_t now_ns) {
  memset(s, 0, sizeof(*s));
  size_t n = (size_t)size;
  s->size = size;
  s->names = hora__calloc(n, sizeof(int));
  s->host = hora__calloc(n, sizeof(int));
  s->host_name = hora__calloc(n, sizeof(char *));
  s->last_ops = hora__calloc(n, sizeof(uint64_t));
  s->last_waited_ns = hora__calloc(n, sizeof(uint64_t));
  s->win_last = hora__calloc(n, sizeof(uint64_t));
  s->win_waited = hora__calloc(n, sizeof(uint64_t));
  s->host_last = hora__calloc(n, sizeof(uint64_t));
  s->host_waited = hora__calloc(n, sizeof(uint64_t));
  struct hora__table hosts = {0};
  int rc = HORA_SUCCESS;
  if (!s->names || !s->host || !s->host_name || !s->last_ops || !s->last_waited_ns ||
      !s->win_last || !s->win_waited || !s->host_last || !s->host_waited) {
    rc = HORA_ERR_NO_MEMORY;
  }
  /* Hosts numbered in order of their first rank. */
  for (int r = 0; r < size && rc == HORA_SUCCESS; r++) {
    s->names[r] = names ? names[r] : r;
    const char *name = host_of && host_of[r] ? host_of[r] : "?";
    void *found = hora__table_get(&hosts, name, strlen(name));
    if (found) {
      s->host[r] = (int)(intptr_t)found - 1;
      continue;
    }
    s->host[r] = s->nhosts;
    s->host_name[s->nhosts] = hora__malloc(strlen(name) + 1);
    if (!s->host_name[s->nhosts]) {
      rc = HORA_ERR_NO_MEMORY;
      break;
    }
    strcpy(s->host_name[s->nhosts], name);
    s->nhosts++;
    rc = hora__table_put(&hosts, s->host_name[s->host[r]], strlen(name),
                         (void *)(intptr_t)(s->host[r] + 1));
  }
  hora__table_free(&hosts);
  pthread_mutex_init(&s->mu, NULL);
  if (rc != HORA_SUCCESS) {
    hora__stragglers_free(s);
    return rc;
  }
  s->win_start_ns = now_ns;
  return HORA_SUCCESS;
}

void hora__stragglers_note(struct hora__stragglers *s, int rank, uint64_t ops, uint64_t waited_ns) {
  if (rank < 0 || rank >= s->size || ops == 0) {
    return;
  }
  pthread_mutex_lock(&s->mu);
  s->ops += ops;
  s->waited_ns += waited_ns;
  s->last_ops[rank] += ops;
  s->last_waited_ns[rank] += waited_ns;
  s->win_ops += ops;
  s->win_last[rank] += ops;
  s->win_waited[rank] += waited_ns;
  pthread_mutex_unlock(&s->mu);
}

int hora__stragglers_top(struct hora__stragglers *s, struct hora__straggler_row *rows, int max,
                         uint64_t *ops, uint64_t *waited_ns) {
  pthread_mutex_lock(&s->mu);
  int n = 0;
  for (int r = 0; r < s->size; r++) {
    if (s->last_ops[r] == 0) {
      continue;
    }
    /* Insertion into the few kept, longest wait first. */
    int at = n < max ? n++ : max;
    while (at > 0 && rows[at - 1].waited_ns < s->last_waited_ns[r]) {
      if (at < max) {
        rows[at] = rows[at - 1];
      }
      at--;
    }
    if (at < max) {
      rows[at] = (struct hora__straggler_row){s->names[r], s->host_name[s->host[r]],
                                              s->last_ops[r], s->last_waited_ns[r]};
    }
  }
  *ops = s->ops;
  *waited_ns = s->waited_ns;
  pthread_mutex_unlock(&s->mu);
  return n;
}

/* "12 ms", "1.4 s": a wait in words. */
static void format_wait(double seconds, char *buf, size_t n) {
  if (seconds >= 1.0) {
    snprintf(buf, n, "%.1f s", seconds);
  } else if (seconds >= 1e-3) {
    snprintf(buf, n, "%.0f ms", seconds * 1e3);
  } else {
    snprintf(buf, n, "%.0f us", seconds * 1e6);
  }
}

/* The lowest and highest job rank of host h's ranks, for "ranks 4-7". */
static void host_ranks(const struct hora__stragglers *s, int h, char *buf, size_t n) {
  int lo = -1, hi = -1, count = 0;
  for (int r = 0; r < s->size; r++) {
    if (s->host[r] == h) {
      lo = lo < 0 ? s->names[r] : HORA_MIN(lo, s->names[r]);
      hi = HORA_MAX(hi, s->names[r]);
      count++;
    }
  }
  if (count == hi - lo + 1) {
    snprintf(buf, n, "ranks %d-%d", lo, hi);
  } else {
    snprintf(buf, n, "%d ranks", count);
  }
}

bool hora__stragglers_report(struct hora__stragglers *s, uint64_t now_ns, uint64_t steps,
                             uint64_t step_ns, double share, char *buf, size_t n) {
  pthread_mutex_lock(&s->mu);
  uint64_t elapsed = now_ns > s->win_start_ns ? now_ns - s->win_start_ns : 0;
  uint64_t nsteps = steps - s->win_steps, nstep_ns = step_ns - s->win_step_ns;
  int worst = -1, worst_host = -1;
  memset(s->host_last, 0, (size_t)s->nhosts * sizeof(uint64_t));
  memset(s->host_waited, 0, (size_t)s->nhosts * sizeof(uint64_t));
  for (int r = 0; r < s->size; r++) {
    if (worst < 0 || s->win_waited[r] > s->win_waited[worst]) {
      worst = r;
    }
    s->host_last[s->host[r]] += s->win_last[r];
    s->host_waited[s->host[r]] += s->win_waited[r];
  }
  for (int h = 0; h < s->nhosts; h++) {
    if (worst_host < 0 || s->host_waited[h] > s->host_waited[worst_host]) {
      worst_host = h;
    }
  }
  /* The time the others' waits are a share of: the steps', where the
   * trainer marks them, else the window's. */
  double base = (double)(nsteps > 0 ? nstep_ns : elapsed) * 1e-9;
  bool said = false;
  if (worst >= 0 && s->win_ops > 0 && base > 0 && s->size > 1) {
    /* A host whose ranks share the lateness is named as the host: no one
     * rank of it holds 90% of the wait the others had for it. */
    bool by_host = s->nhosts > 1 && s->nhosts < s->size &&
                   (double)s->win_waited[worst] < 0.9 * (double)s->host_waited[worst_host];
    double waited = (double)(by_host ? s->host_waited[worst_host] : s->win_waited[worst]) * 1e-9;
    uint64_t last = by_host ? s->host_last[worst_host] : s->win_last[worst];
    if (waited > share * base) {
      char who[160], per[32], ranks[48];
      if (by_host) {
        host_ranks(s, worst_host, ranks, sizeof(ranks));
        snprintf(who, sizeof(who), "host %s (%s)", s->host_name[worst_host], ranks);
      } else {
        snprintf(who, sizeof(who), "rank %d (host %s)", s->names[worst],
                 s->host_name[s->host[worst]]);
      }
      int o = snprintf(buf, n, "%s was last in %.0f%% of the last %llu operations; ", who,
                       100.0 * (double)last / (double)s->win_ops, (unsigned long long)s->win_ops);
      if (o > 0 && (size_t)o < n && nsteps > 0) {
        format_wait(waited / (double)nsteps, per, sizeof(per));
        snprintf(buf + o, n - (size_t)o, "the others waited %s per step for it (%.0f%% of step "
                 "time)", per, 100.0 * waited / base);
      } else if (o > 0 && (size_t)o < n) {
        format_wait(waited, per, sizeof(per));
        snprintf(buf + o, n - (size_t)o, "the others waited %s for it in %.0f s (%.0f%% of the "
                 "time)", per, base, 100.0 * waited / base);
      }
      said = true;
    }
  }
  s->win_ops = 0;
  s->win_start_ns = now_ns;
  s->win_steps = steps;
  s->win_step_ns = step_ns;
  memset(s->win_last, 0, (size_t)s->size * sizeof(uint64_t));
  memset(s->win_waited, 0, (size_t)s->size * sizeof(uint64_t));
  pthread_mutex_unlock(&s->mu);
  return said;
}
