/* The coordinator's side of the callers' requests: taking them off the
 * submission queue (to wait in the cache or go to rank 0 in full), and
 * finding, completing and failing them by key once responses come. */
#include <stdlib.h>

#include "runtime/engine/engine.h"

/* ---- submissions ------------------------------------------------------------ */

int hora__engine_grow_reqs(struct hora__set *set, size_t n) {
  if (n <= set->reqs_cap) {
    return HORA_SUCCESS;
  }
  size_t cap = HORA_MAX(n, 2 * set->reqs_cap);
  struct hora_request **p = hora__realloc(set->reqs, cap * sizeof(*p));
  if (!p) {
    return HORA_ERR_NO_MEMORY;
  }
  set->reqs = p;
  set->reqs_cap = cap;
  return HORA_SUCCESS;
}

static uint32_t waited_ms(const struct hora_request *q) {
  uint64_t now = hora__now_ns();
  return now > q->submit_ns ? (uint32_t)HORA_MIN((now - q->submit_ns) / 1000000u, UINT32_MAX) : 0;
}

/* Requests that go to rank 0 in full: rank 0 hands them to its controller,
 * the others send one REQUESTS message. */
int hora__engine_send_full(struct hora__set *set, struct hora_request *const *list, size_t n) {
  if (n == 0) {
    return HORA_SUCCESS;
  }
  atomic_fetch_add(&set->e->rt->stats.sent_in_full, n);
  if (set->ctl) {
    for (size_t i = 0; i < n; i++) {
      struct hora_request *q = list[i];
      struct hora__wire_request w = {.meta = q->meta, .key = q->key, .key_len = q->key_len,
                                     .waited_ms = waited_ms(q), .shape = &q->shape};
      HORA_CHECK(hora__controller_submit(set->ctl, 0, &w));
    }
    return HORA_SUCCESS;
  }
  hora__encode_requests_begin(&set->e->wbuf);
  for (size_t i = 0; i < n; i++) {
    hora__encode_request_shaped(&set->e->wbuf, &list[i]->meta, &list[i]->shape, list[i]->key,
                                list[i]->key_len, waited_ms(list[i]));
  }
  hora__encode_requests_end(&set->e->wbuf, (uint32_t)n);
  if (set->e->wbuf.failed) {
    return hora__error(HORA_ERR_NO_MEMORY, "out of memory encoding %zu requests", n);
  }
  if (!set->comm->proc->ctrl[0]) {
    /* Rank 0 closed its end after the job's end (hora_finalize racing a
     * submission): these fail as finalized when the coordinator stops. */
    return set->shutdown_seen || set->e->shutting_down ? HORA_SUCCESS : hora__engine_lost_partner(set->e, 0);
  }
  return hora__engine_ctrl_send(set->e, set->comm->proc->ctrl[0], HORA_MSG_REQUESTS, set->e->wbuf.data,
                                set->e->wbuf.len);
}

void hora__engine_wish_evicted(struct hora__set *set, int32_t slot) {
  set->evict_wish[slot / 8] |= (uint8_t)(1u << (slot % 8));
  set->evict_wanted = true;
}

/* A new request waits on its cache slot when it ran before with the same
 * options (and, while someone has joined, only an allreduce: rank 0 must
 * refuse the rest); otherwise it goes in full, and its key's slot is emptied
 * everywhere, so that the others' same requests go in full too: rank 0 can
 * name a mismatch, and a rank that took its request after a cycle ended
 * the join cannot wait in the cache for one the others sent in full. */
int hora__engine_take_submissions(struct hora__set *set, bool *busy) {
  struct hora__runtime *rt = set->e->rt;
  atomic_store_explicit(&set->e->seen_seq,
                        atomic_load_explicit(&rt->submit_seq, memory_order_acquire),
                        memory_order_relaxed);
  pthread_mutex_lock(&rt->mu);
  struct hora_request *head = rt->queue_head;
  rt->queue_head = rt->queue_tail = NULL;
  bool abort_asked = rt->abort_asked;
  int abort_code = rt->abort_code;
  char reason[sizeof(rt->abort_reason)];
  memcpy(reason, rt->abort_reason, sizeof(reason));
  pthread_mutex_unlock(&rt->mu);
  if (abort_asked && abort_code) {
    return hora__error(abort_code, "%s", reason);
  }
  if (abort_asked) {
    return hora__error(HORA_ERR_ABORTED, "hora_abort called on rank %d: %s", rt->rank, reason);
  }
  if (!head) {
    return HORA_SUCCESS;
  }
  *busy = true;
  size_t n = 0;
  for (struct hora_request *r = head; r; r = r->next) {
    n++;
  }
  HORA_CHECK(hora__engine_grow_reqs(set, n));
  size_t nfull = 0;
  uint64_t now = hora__now_ns();
  for (struct hora_request *r = head; r; r = r->next) {
    r->sent_slot = -1;
    r->taken = true;
    r->taken_ns = now;
    set->join_pending |= r->meta.kind == HORA_KIND_JOIN;
    /* (A group's members always go in full: rank 0 holds them until the
     * whole group is ready, which cache bits cannot tell it.) */
    if (r->meta.kind > HORA_KIND_LAST_COLLECTIVE || r->meta.group) {
      set->reqs[nfull++] = r;
      continue;
    }
    int32_t slot = hora__cache_find(&set->cache, r->key, r->key_len);
    bool hit = slot >= 0 && hora__meta_equal(&set->cache.e[slot].meta, &r->meta);
    atomic_fetch_add(hit ? &rt->stats.cache_hits : &rt->stats.cache_misses, 1);
    if (hit && !set->waiting[slot] &&
        (hora__kind_stands_in(r->meta.kind) || !set->others_joined)) {
      r->sent_slot = slot;
      set->waiting[slot] = r;
      set->nwaiting++;
      set->new_hits++;
      continue;
    }
    if (slot >= 0) {
      hora__engine_wish_evicted(set, slot);
    }
    set->reqs[nfull++] = r;
  }
  return hora__engine_send_full(set, set->reqs, nfull);
}

/* ---- our requests, by key --------------------------------------------------- */

/* Our request for a tensor of a response. One still on the submission
 * queue is not ours to run yet: a joined rank's stand-in can meet such a
 * request, and running it would leave the queue pointing at a request the
 * caller may already have freed. */
struct hora_request *hora__engine_lookup(struct hora__engine *e,
                                         const struct hora__resp_tensor *t) {
  pthread_mutex_lock(&e->rt->mu);
  struct hora_request *r = hora__table_get(&e->rt->inflight, t->key, t->key_len);
  pthread_mutex_unlock(&e->rt->mu);
  return r && r->taken ? r : NULL;
}

void hora__request_complete_locked(struct hora__runtime *rt, struct hora_request *req, int status,
                                   const char *msg) {
  hora__table_remove(&rt->inflight, req->key, req->key_len);
  req->status = status;
  if (status != HORA_SUCCESS) {
    req->error = strdup(msg && msg[0] ? msg : hora_strerror(status));
  }
  req->done_ns = hora__now_ns();
  atomic_store_explicit(&req->done, 1, memory_order_release);
}

void hora__engine_complete(struct hora__engine *e, struct hora_request **reqs, size_t n, int status,
                           const char *msg) {
  struct hora__runtime *rt = e->rt;
  pthread_mutex_lock(&rt->mu);
  for (size_t i = 0; i < n; i++) {
    if (reqs[i]) {
      hora__request_complete_locked(rt, reqs[i], status, msg);
    }
  }
  pthread_cond_broadcast(&rt->done_cv);
  pthread_mutex_unlock(&rt->mu);
}

/* Rank 0 failed an operation: our request fails too, even one still on
 * the submission queue (this rank would only send it to rank 0 to hear the
 * same); that one is unlinked from the queue first, so that nothing holds
 * it once its caller has it back. */
void hora__engine_fail_by_key(struct hora__engine *e, const struct hora__resp_tensor *t, int status,
                              const char *msg) {
  struct hora__runtime *rt = e->rt;
  pthread_mutex_lock(&rt->mu);
  struct hora_request *q = hora__table_get(&rt->inflight, t->key, t->key_len);
  if (q && q->placeholder) {
    hora__table_remove(&rt->inflight, q->key, q->key_len);
    free(q);
    q = NULL;
  }
  if (q && !q->taken) {
    struct hora_request **p = &rt->queue_head, *prev = NULL;
    while (*p && *p != q) {
      prev = *p;
      p = &(*p)->next;
    }
    if (*p) {
      *p = q->next;
      if (rt->queue_tail == q) {
        rt->queue_tail = prev;
      }
    }
  }
  if (q) {
    hora__request_complete_locked(rt, q, status, msg);
    pthread_cond_broadcast(&rt->done_cv);
  }
  pthread_mutex_unlock(&rt->mu);
}

/* A request that did not match the response it met fails now. When it
 * went to rank 0 in full, rank 0 still holds it and will answer it: a
 * placeholder keeps its key in flight until then. */
void hora__engine_fail_mismatched(struct hora__engine *e, struct hora_request *q, const char *msg) {
  struct hora__runtime *rt = e->rt;
  struct hora_request *p = q->sent_slot < 0 ? hora__calloc(1, sizeof(*p)) : NULL;
  pthread_mutex_lock(&rt->mu);
  if (p) {
    memcpy(p->key, q->key, q->key_len);
    p->key_len = q->key_len;
    p->meta = q->meta;
    p->sent_slot = -1;
    p->taken = p->placeholder = true;
  }
  hora__request_complete_locked(rt, q, HORA_ERR_MISMATCH, msg);
  if (p && hora__table_put(&rt->inflight, p->key, p->key_len, p) != HORA_SUCCESS) {
    free(p); /* then a new request under the key may reach rank 0 twice */
  }
  pthread_cond_broadcast(&rt->done_cv);
  pthread_mutex_unlock(&rt->mu);
}

/* Rank 0's answer for a request that already failed here: the key is free
 * again, and this rank stands in for it. */
void hora__engine_retire_placeholder(struct hora__engine *e, struct hora_request *p) {
  pthread_mutex_lock(&e->rt->mu);
  hora__table_remove(&e->rt->inflight, p->key, p->key_len);
  pthread_mutex_unlock(&e->rt->mu);
  free(p);
}
