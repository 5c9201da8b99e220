/* Grouped operations: the collectives a thread submits between
 * hora_group_start and hora_group_end are negotiated as one unit. They are
 * held here until the group ends, then queued at once, each tagged with the
 * group's fingerprint (of its members' names) and size; rank 0 lets none of
 * them run until every one is ready on every rank, then sends them together
 * (fused where they fit), and a member that fails makes the whole group
 * fail on every rank (runtime/negotiate/negotiate_groups.c). */
#include <stdlib.h>

#include "runtime/runtime.h"

static _Thread_local struct {
  int depth;
  struct hora__runtime *rt;
  struct hora_request *head, *tail;
  uint32_t n;
} group;

HORA_EXTERN int hora_group_start(void) {
  hora__error_clear();
  if (group.depth == 64) {
    return hora__error(HORA_ERR_INVALID_USAGE, "hora_group_start: groups nested 64 deep");
  }
  group.depth++;
  return HORA_SUCCESS;
}

int hora__group_admit(struct hora__runtime *rt, const struct hora_request *r) {
  if (group.depth == 0) {
    return HORA_SUCCESS;
  }
  if (r->meta.kind > HORA_KIND_LAST_COLLECTIVE) {
    return hora__error(HORA_ERR_INVALID_USAGE, "%s between hora_group_start and hora_group_end: "
                       "only collectives can be grouped", hora__kind_name(r->meta.kind));
  }
  if (group.rt && group.rt != rt) {
    return hora__error(HORA_ERR_INVALID_USAGE, "a group's operations must all run in one process "
                       "set (this one is for %s, the group's first for %s)",
                       rt->set_id ? rt->label : "the world",
                       group.rt->set_id ? group.rt->label : "the world");
  }
  return HORA_SUCCESS;
}

bool hora__group_hold(struct hora__runtime *rt, struct hora_request *r) {
  if (group.depth == 0) {
    return false;
  }
  group.rt = rt;
  r->group_held = true;
  r->next = NULL;
  if (group.tail) {
    group.tail->next = r;
  } else {
    group.head = r;
  }
  group.tail = r;
  group.n++;
  return true;
}

static int by_key(const void *a, const void *b) {
  const struct hora_request *x = *(struct hora_request *const *)a,
                            *y = *(struct hora_request *const *)b;
  int c = memcmp(x->key, y->key, HORA_MIN(x->key_len, y->key_len));
  return c ? c : (int)x->key_len - (int)y->key_len;
}

/* FNV-1a over the kind and key of every member, sorted by key: the same on
 * every rank that groups the same operations, whatever their order. */
static uint64_t fingerprint(struct hora_request **m, uint32_t n) {
  qsort(m, n, sizeof(*m), by_key);
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint32_t i = 0; i < n; i++) {
    const unsigned char *k = (const unsigned char *)m[i]->key;
    for (uint16_t j = 0; j < m[i]->key_len; j++) {
      h = (h ^ k[j]) * 0x100000001b3ull;
    }
    h = (h ^ 0xffu) * 0x100000001b3ull;
    h = (h ^ m[i]->meta.kind) * 0x100000001b3ull;
  }
  return h ? h : 1;
}

HORA_EXTERN int hora_group_end(void) {
  hora__error_clear();
  if (group.depth == 0) {
    return hora__error(HORA_ERR_INVALID_USAGE, "hora_group_end without hora_group_start");
  }
  if (--group.depth > 0 || group.n == 0) {
    return HORA_SUCCESS;
  }
  struct hora__runtime *rt = group.rt;
  struct hora_request *head = group.head, *tail = group.tail;
  uint32_t n = group.n;
  group.rt = NULL;
  group.head = group.tail = NULL;
  group.n = 0;
  struct hora_request **m = hora__malloc(n * sizeof(*m));
  uint32_t i = 0;
  for (struct hora_request *r = head; r; r = r->next) {
    r->group_held = false;
    if (m) {
      m[i++] = r;
    }
  }
  if (m && n > 1) {
    uint64_t fp = fingerprint(m, n);
    for (i = 0; i < n; i++) {
      m[i]->meta.group = fp;
      m[i]->meta.group_size = n;
    }
  }
  free(m);
  /* (Without memory for the list the members go as they are, ungrouped:
   * every rank then runs them, just not as one unit.) */
  pthread_mutex_lock(&rt->mu);
  if (rt->queue_tail) {
    rt->queue_tail->next = head;
  } else {
    rt->queue_head = head;
  }
  rt->queue_tail = tail;
  atomic_fetch_add_explicit(&rt->submit_seq, 1, memory_order_release);
  hora__engine_wake_locked(rt);
  pthread_mutex_unlock(&rt->mu);
  return m ? HORA_SUCCESS : hora__error(HORA_ERR_NO_MEMORY, "hora_group_end: %u members", n);
}
