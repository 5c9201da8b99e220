/* Stalls the cycles hide: cached requests waiting too long leave the
 * cache, and a cycle some rank never joins is reported to rank 0, whose
 * inspector names the ranks that never reported it. */
#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"
#include "base/params.h"
#include "runtime/engine/engine.h"
#include "runtime/observe/metrics.h"

/* Cached requests waiting half the stall time are emptied from the cache
 * everywhere: they go to rank 0 in full, and its stall inspector names the
 * ranks that never submitted them. */
void hora__engine_scan_waiting(struct hora__set *set) {
  double check = hora__params.STALL_CHECK_TIME_SECONDS;
  double shut = hora__params.STALL_SHUTDOWN_TIME_SECONDS;
  double limit = check > 0 && (shut <= 0 || check < shut) ? check : shut;
  uint64_t now = hora__now_ns();
  if (limit <= 0 || set->nwaiting == 0) {
    set->next_wait_scan_ns = UINT64_MAX;
    return;
  }
  uint64_t half = (uint64_t)(limit * 0.5e9);
  if (set->next_wait_scan_ns != UINT64_MAX && now < set->next_wait_scan_ns) {
    return;
  }
  for (uint32_t s = 0; s < set->cache.capacity; s++) {
    struct hora_request *q = set->waiting[s];
    if (q && now - q->submit_ns >= half) {
      hora__engine_wish_evicted(set, (int32_t)s);
    }
  }
  set->next_wait_scan_ns = now + HORA_MAX(half / 4, (uint64_t)1000000);
}

/* Half of the shorter of the stall times, or 0 when both are off. */
uint64_t hora__engine_stall_half_ns(void) {
  double check = hora__params.STALL_CHECK_TIME_SECONDS;
  double shut = hora__params.STALL_SHUTDOWN_TIME_SECONDS;
  double limit = check > 0 && (shut <= 0 || check < shut) ? check : shut;
  return limit > 0 ? (uint64_t)(limit * 0.5e9) : 0;
}

/* A cycle held up that long (a partner stopped answering, alive but stuck)
 * is reported to rank 0, with one of the operations waiting on it: the
 * ranks that never report it are the ones holding it up. */
int hora__engine_report_stuck(struct hora__set *set) {
  uint64_t half = hora__engine_stall_half_ns();
  if (!half || set->stuck_reported || set->cycle_phase == CYCLE_IDLE ||
      set->cycle_phase == CYCLE_DONE) {
    return HORA_SUCCESS;
  }
  uint64_t now = hora__now_ns();
  if (now - set->cycle_started_ns < half) {
    return HORA_SUCCESS;
  }
  set->stuck_reported = true;
  const char *key = "";
  size_t klen = 0;
  for (uint32_t s = 0; s < set->cache.capacity && set->nwaiting; s++) {
    if (set->waiting[s]) {
      key = set->waiting[s]->key;
      klen = set->waiting[s]->key_len;
      break;
    }
  }
  uint32_t waited = (uint32_t)HORA_MIN((now - set->cycle_started_ns) / 1000000u, UINT32_MAX);
  if (set->ctl) {
    hora__engine_record_stuck(set, 0, set->cycles + 1, waited, key, klen);
    return HORA_SUCCESS;
  }
  hora__encode_stuck(&set->e->wbuf, set->cycles + 1, waited, key, klen);
  return set->comm->proc->ctrl[0] ? hora__engine_ctrl_send(set->e, set->comm->proc->ctrl[0], HORA_MSG_STUCK,
                                                         set->e->wbuf.data, set->e->wbuf.len)
                                : HORA_SUCCESS;
}

/* Rank 0: rank `from` has waited `waited_ms` in cycle `cycle`. */
void hora__engine_record_stuck(struct hora__set *set, int from, uint64_t cycle, uint32_t waited_ms,
                               const char *key, size_t key_len) {
  uint64_t now = hora__now_ns(), waited = (uint64_t)waited_ms * 1000000u;
  set->stuck_cycle[from] = cycle;
  set->stuck_since_ns[from] = now > waited ? now - waited : 0;
  if (key_len && !set->stuck_key_len) { /* one example is enough; cleared with the stall */
    memcpy(set->stuck_key, key, key_len);
    set->stuck_key_len = key_len;
  }
  set->next_stuck_ns = now; /* look at it in this turn of the loop */
}

/* Rank 0: the stall inspector for a cycle that some ranks never join. */
int hora__engine_check_stuck(struct hora__set *set) {
  int size = set->comm->size;
  bool any = false;
  for (int r = 0; r < size && !any; r++) {
    any = set->stuck_cycle[r] > set->cycles;
  }
  set->next_stuck_ns = UINT64_MAX;
  if (!any) {
    set->stuck_key_len = 0;
    return HORA_SUCCESS;
  }
  uint64_t oldest = UINT64_MAX, now = hora__now_ns();
  uint8_t *there = hora__malloc((size_t)size);
  if (!there) {
    return HORA_ERR_NO_MEMORY;
  }
  /* A rank that reports any cycle still open here is alive and held up (a
   * partner may have finished the older cycle and gone on to the next). */
  for (int r = 0; r < size; r++) {
    there[r] = set->stuck_cycle[r] > set->cycles;
    if (there[r]) {
      oldest = HORA_MIN(oldest, set->stuck_since_ns[r]);
    }
  }
  char missing[256], what[340] = "operations";
  const struct hora__runtime *rt = set->e->rt;
  hora__format_ranks_named(there, size, false, rt->global_ranks, missing, sizeof(missing));
  free(there);
  if (set->stuck_key_len) {
    char name[300];
    hora__key_display(set->stuck_key, set->stuck_key_len, name, sizeof(name));
    snprintf(what, sizeof(what), "operations such as %s", name);
  }
  double check = hora__params.STALL_CHECK_TIME_SECONDS;
  double shut = hora__params.STALL_SHUTDOWN_TIME_SECONDS;
  uint64_t age = now - oldest;
  if (shut > 0 && age >= (uint64_t)(shut * 1e9)) {
    char msg[1024];
    snprintf(msg, sizeof(msg), "%s%s stalled for %.1f s (HORA_STALL_SHUTDOWN_TIME_SECONDS): their "
             "negotiation cycle waits for rank(s) %s, which stopped answering; shutting down",
             rt->label, what, (double)age * 1e-9, missing);
    HORA_ERROR("%s", msg);
    return hora__error(HORA_ERR_TIMEOUT, "%s", msg);
  }
  if (check > 0 && age >= (uint64_t)(check * 1e9) && now >= set->next_stuck_warn_ns) {
    HORA_WARN("%sstall: %s have waited %.1f s (HORA_STALL_CHECK_TIME_SECONDS) in a negotiation "
              "cycle that rank(s) %s never joined", rt->label, what, (double)age * 1e-9, missing);
    set->next_stuck_warn_ns = now + (uint64_t)(check * 1e9);
    hora__metrics_event(HORA__EV_STALL_WARNING);
  }
  uint64_t due = UINT64_MAX;
  if (check > 0) {
    due = HORA_MAX(oldest + (uint64_t)(check * 1e9), set->next_stuck_warn_ns);
  }
  if (shut > 0) {
    due = HORA_MIN(due, oldest + (uint64_t)(shut * 1e9));
  }
  set->next_stuck_ns = due;
  return HORA_SUCCESS;
}
