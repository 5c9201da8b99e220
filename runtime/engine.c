/* The coordinator thread. One cycle:
 *
 *   1. take what callers submitted; rank 0 hands it to the controller,
 *      the other ranks send it to rank 0 in one REQUESTS message
 *   2. read the control connections (requests at rank 0, responses and
 *      aborts elsewhere)
 *   3. rank 0 sends the responses that became ready to every rank
 *   4. execute the responses in order: run the collective, complete the
 *      requests
 *   5. with nothing to do, sleep in poll() on the wake eventfd and the
 *      control sockets: an idle job costs no CPU
 *
 * The first fatal error (a lost peer, a stall past the shutdown time,
 * hora_abort) is sent to rank 0, which sends it to every rank; then the
 * coordinator fails every request and closes its connections. */
#include <arpa/inet.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../comm/collectives.h"
#include "../comm/gpu.h"
#include "../comm/reduce.h"
#include "cache.h"
#include "log.h"
#include "params.h"
#include "runtime.h"
#include "verify.h"
#include "timeline.h"

struct hora__engine {
  struct hora__runtime *rt;
  hora__comm *comm;
  struct hora__controller *ctl; /* rank 0 only */
  struct hora__cache cache;     /* identical on every rank */
  struct hora__response *todo, **todo_tail;
  struct hora__wbuf wbuf;
  bool stop;
  bool abort_from_root; /* the fatal error came in an abort from rank 0 */
  uint64_t next_stall_ns;
  uint64_t send_at_ns; /* rank 0: when held-back responses must go */
  /* A joined rank's stand-in buffers for allreduces it did not submit. */
  void *zeros, *junk;
  size_t zeros_bytes, junk_bytes;
  struct hora__iov *iov_in, *iov_out; /* one entry per tensor of a response */
  uint32_t iov_cap;
  const struct hora__response *current; /* being executed, for on_phase */
  uint64_t phase_ns, copy_ns;
  bool phase_is_copy;
  struct hora_request **reqs;
  size_t reqs_cap;
  uint8_t *bits; /* cache bits of one REQUESTS message */
  /* rank 0: cache bits from a worker that named a reassigned slot */
  uint32_t *resend;
  uint32_t nresend, resend_cap, resend_version;
  uint64_t frames_in;  /* control frames handled so far */
  bool shutting_down;  /* a SHUTDOWN response is out: peers may close now */
  struct pollfd *pollfds; /* room for every control connection and a few more */
  int npollfds;
  uint64_t seen_seq;   /* rt->submit_seq when the queue was last taken */
  struct hora__gpu *gpu; /* device data plane, set up by the first device op */
  void **ready, **done;  /* per tensor of a device response */
  uint32_t events_cap;
};

static void engine_free(struct hora__engine *e) {
  if (!e) {
    return;
  }
  hora__controller_destroy(e->ctl);
  hora__cache_free(&e->cache);
  free(e->bits);
  free(e->resend);
  while (e->todo) {
    struct hora__response *n = e->todo->next;
    hora__response_free(e->todo);
    e->todo = n;
  }
  hora__wbuf_free(&e->wbuf);
  free(e->pollfds);
  free(e->zeros);
  free(e->junk);
  free(e->iov_in);
  free(e->iov_out);
  free(e->reqs);
  hora__gpu_destroy(e->comm, e->gpu);
  free(e->ready);
  free(e->done);
  free(e);
}

/* ---- control input ---------------------------------------------------------- */

static int on_abort_frame(struct hora__engine *e, int from, const uint8_t *p, size_t n) {
  int origin, code;
  char msg[900];
  if (hora__decode_abort(p, n, &origin, &code, msg, sizeof(msg)) != HORA_SUCCESS) {
    return hora__error(HORA_ERR_PEER_LOST, "rank %d sent a malformed abort message", from);
  }
  (void)origin;
  if (from == 0) {
    e->abort_from_root = true;
  }
  return hora__error(code, "%s", msg);
}

struct submit_ctx {
  struct hora__engine *e;
  int rank;
};

static int submit_cb(void *arg, const struct hora__wire_request *req) {
  struct submit_ctx *s = arg;
  return hora__controller_submit(s->e->ctl, s->rank, req);
}

/* Rank 0: a worker announced slot `slot` of its cache at `version`. */
static int cached_cb(void *arg, uint32_t version, uint32_t slot) {
  struct submit_ctx *s = arg;
  struct hora__engine *e = s->e;
  const struct hora__cache_entry *ce = hora__cache_entry(&e->cache, (int32_t)slot);
  if (ce && ce->version <= version && ce->key_len > 0) {
    struct hora__wire_request w = {.meta = ce->meta, .key = ce->key, .key_len = ce->key_len};
    return hora__controller_submit(e->ctl, s->rank, &w);
  }
  if (version > e->cache.version || slot >= e->cache.capacity) {
    return hora__error(HORA_ERR_PEER_LOST, "rank %d announced cache slot %u at version %u, "
                       "which rank 0 never assigned", s->rank, slot, version);
  }
  /* The slot changed hands after the worker looked: ask again in full. */
  if (e->nresend == e->resend_cap) {
    uint32_t cap = e->resend_cap ? 2 * e->resend_cap : 64;
    uint32_t *p = hora__realloc(e->resend, cap * sizeof(*p));
    if (!p) {
      return HORA_ERR_NO_MEMORY;
    }
    e->resend = p;
    e->resend_cap = cap;
  }
  e->resend[e->nresend++] = slot;
  e->resend_version = version;
  return HORA_SUCCESS;
}

static int encode_and_send_requests(struct hora__engine *e, struct hora_request *const *list,
                                    size_t n);
static int ctrl_send(struct hora__engine *e, hora__ctrl *c, uint16_t type, const void *p,
                     size_t n);

struct resend_ctx {
  struct hora__engine *e;
  struct hora_request **found;
  size_t n, cap;
};

static void find_sent(void *arg, const char *key, size_t len, void *value) {
  (void)key;
  (void)len;
  struct resend_ctx *r = arg;
  struct hora_request *q = value;
  if (q->sent_slot >= 0 && r->n < r->cap && r->e->rt->rank != 0) {
    r->found[r->n++] = q;
  }
}

/* Worker: rank 0 could not resolve some of our cache bits; send those
 * requests again in full. */
static int on_resend(struct hora__engine *e, const uint8_t *p, size_t n) {
  struct hora__rbuf rb = hora__rbuf_make(p, n);
  uint32_t version = hora__rbuf_u32(&rb);
  uint32_t count = hora__rbuf_u32(&rb);
  if (rb.bad || (size_t)count * 4 != hora__rbuf_left(&rb)) {
    return hora__error(HORA_ERR_PEER_LOST, "rank 0 sent a malformed resend message");
  }
  struct hora__runtime *rt = e->rt;
  pthread_mutex_lock(&rt->mu);
  size_t cap = rt->inflight.count;
  struct resend_ctx rc = {.e = e, .found = hora__malloc((cap ? cap : 1) * sizeof(void *)), .cap = cap};
  if (rc.found) {
    hora__table_each(&rt->inflight, find_sent, &rc);
  }
  pthread_mutex_unlock(&rt->mu);
  if (!rc.found) {
    return HORA_ERR_NO_MEMORY;
  }
  size_t w = 0;
  for (size_t i = 0; i < rc.n; i++) {
    struct hora_request *q = rc.found[i];
    bool asked = false;
    for (uint32_t k = 0; k < count && !asked; k++) {
      uint32_t slot = (uint32_t)p[8 + 4 * k] | (uint32_t)p[9 + 4 * k] << 8 |
                      (uint32_t)p[10 + 4 * k] << 16 | (uint32_t)p[11 + 4 * k] << 24;
      asked = q->sent_version == version && (uint32_t)q->sent_slot == slot;
    }
    if (asked) {
      q->sent_slot = -1;
      rc.found[w++] = q;
    }
  }
  int r = w ? encode_and_send_requests(e, rc.found, w) : HORA_SUCCESS;
  free(rc.found);
  return r;
}

/* Reads and handles every complete frame on one control connection. */
static int read_ctrl(struct hora__engine *e, hora__ctrl *c) {
  int peer = hora__ctrl_peer(c);
  char name[160];
  int rc = hora__ctrl_read(c);
  /* Frames that arrived before an EOF still count: an abort explains it. */
  for (;;) {
    bool got;
    uint16_t type;
    const uint8_t *p;
    size_t n;
    int prc = hora__ctrl_next(c, &got, &type, &p, &n);
    if (prc != HORA_SUCCESS) {
      return prc;
    }
    if (!got) {
      break;
    }
    e->frames_in++;
    HORA_TRACE("control: frame type %u (%zu bytes) from rank %d", type, n, peer);
    if (type == HORA_MSG_ABORT) {
      return on_abort_frame(e, peer, p, n);
    }
    if (type == HORA_MSG_REQUESTS && e->ctl) {
      struct submit_ctx s = {e, peer};
      struct hora__request_sink sink = {submit_cb, cached_cb, &s};
      e->nresend = 0;
      if (hora__decode_requests(p, n, &sink) != HORA_SUCCESS) {
        return hora__error(HORA_ERR_PEER_LOST, "%s sent a malformed request list: %s",
                           hora__peer_name(e->comm, peer, name, sizeof(name)),
                           hora__error_message());
      }
      if (e->nresend) {
        hora__encode_resend(&e->wbuf, e->resend_version, e->resend, e->nresend);
        HORA_CHECK(ctrl_send(e, c, HORA_MSG_RESEND, e->wbuf.data, e->wbuf.len));
      }
    } else if (type == HORA_MSG_RESPONSES && !e->ctl) {
      if (hora__decode_responses(p, n, &e->todo_tail, &e->cache) != HORA_SUCCESS) {
        return hora__error(HORA_ERR_PEER_LOST, "rank 0 sent a malformed response list: %s",
                           hora__error_message());
      }
    } else if (type == HORA_MSG_RESEND && !e->ctl) {
      HORA_CHECK(on_resend(e, p, n));
    } else if (type == HORA_MSG_HEARTBEAT) {
      /* Arriving was the point. */
    } else {
      return hora__error(HORA_ERR_PEER_LOST, "%s sent an unexpected control message (type %u)",
                         hora__peer_name(e->comm, peer, name, sizeof(name)), type);
    }
  }
  if (rc == HORA_ERR_PEER_LOST) {
    HORA_DEBUG("control: connection to rank %d closed (%s)", peer,
               e->todo ? "responses queued" : "nothing queued");
    for (struct hora__response *r = e->todo; r && !e->shutting_down; r = r->next) {
      e->shutting_down = r->kind == HORA_KIND_SHUTDOWN;
    }
    if (e->shutting_down) {
      /* The job is over and the peer left first: not an error. */
      hora__ctrl_free(c);
      e->comm->ctrl[peer] = NULL;
      return HORA_SUCCESS;
    }
    return hora__error(HORA_ERR_PEER_LOST, "lost %s: its control connection closed",
                       hora__peer_name(e->comm, peer, name, sizeof(name)));
  }
  return rc;
}

/* A write to a peer failed: what it sent before going away (an abort, say)
 * explains the failure better than the broken pipe does. */
static int explain_write_failure(struct hora__engine *e, hora__ctrl *c, int rc) {
  if (rc != HORA_ERR_PEER_LOST) {
    return rc;
  }
  char original[1024];
  hora__strlcpy(original, hora__error_message(), sizeof(original));
  int why = read_ctrl(e, c);
  /* An abort frame explains the broken connection, whatever its code, and
   * an EOF names the lost peer's host and pid, which the errno does not. */
  if (why != HORA_SUCCESS) {
    return why;
  }
  return hora__error(rc, "%s", original);
}

static int ctrl_send(struct hora__engine *e, hora__ctrl *c, uint16_t type, const void *p,
                     size_t n) {
  return explain_write_failure(e, c, hora__ctrl_send(c, type, p, n));
}

/* Heartbeats: each end of a control connection writes at least every
 * quarter of HORA_PEER_TIMEOUT_SECONDS, so silence for the whole of it
 * means the peer is stuck (stopped, hung, or its host gone quiet). */
static int heartbeat(struct hora__engine *e, hora__ctrl *c) {
  uint64_t limit = (uint64_t)(hora__params.PEER_TIMEOUT_SECONDS * 1e9);
  if (limit == 0 || e->shutting_down) {
    return HORA_SUCCESS;
  }
  uint64_t now = hora__now_ns();
  if (now - hora__ctrl_last_out(c) >= limit / 4) {
    HORA_CHECK(ctrl_send(e, c, HORA_MSG_HEARTBEAT, NULL, 0));
  }
  if (now - hora__ctrl_last_in(c) >= limit) {
    char name[160];
    return hora__error(HORA_ERR_PEER_LOST,
                       "lost %s: nothing heard from it for %.0f s (HORA_PEER_TIMEOUT_SECONDS)",
                       hora__peer_name(e->comm, hora__ctrl_peer(c), name, sizeof(name)),
                       (double)(now - hora__ctrl_last_in(c)) * 1e-9);
  }
  return HORA_SUCCESS;
}

static int service(void *arg) {
  struct hora__engine *e = arg;
  hora__comm *c = e->comm;
  /* hora_abort while a collective waits on a peer: give up now, so the
   * engine tells the job instead of finishing (or hanging in) it first. */
  if (!e->shutting_down && hora__runtime_fatal(e->rt) != HORA_SUCCESS) {
    return atomic_load_explicit(&e->rt->fatal_code, memory_order_acquire);
  }
  for (int r = 0; r < c->size; r++) {
    if (c->ctrl[r]) {
      HORA_CHECK(read_ctrl(e, c->ctrl[r]));
    }
    if (c->ctrl[r] && !e->shutting_down) {
      HORA_CHECK(explain_write_failure(e, c->ctrl[r], hora__ctrl_flush(c->ctrl[r])));
      HORA_CHECK(heartbeat(e, c->ctrl[r]));
    }
  }
  return HORA_SUCCESS;
}

static int service_pollfds(void *arg, struct pollfd *fds, int max) {
  struct hora__engine *e = arg;
  hora__comm *c = e->comm;
  int n = 0;
  for (int r = 0; r < c->size && n < max; r++) {
    if (c->ctrl[r]) {
      fds[n].fd = hora__ctrl_fd(c->ctrl[r]);
      fds[n].events = (short)(POLLIN | (hora__ctrl_has_output(c->ctrl[r]) ? POLLOUT : 0));
      fds[n].revents = 0;
      n++;
    }
  }
  return n;
}

/* ---- submissions ------------------------------------------------------------ */

static int grow_reqs(struct hora__engine *e, size_t n) {
  if (n <= e->reqs_cap) {
    return HORA_SUCCESS;
  }
  size_t cap = HORA_MAX(n, 2 * e->reqs_cap);
  struct hora_request **p = hora__realloc(e->reqs, cap * sizeof(*p));
  if (!p) {
    return HORA_ERR_NO_MEMORY;
  }
  e->reqs = p;
  e->reqs_cap = cap;
  return HORA_SUCCESS;
}

/* Worker: one REQUESTS message. A request whose key and options match a
 * cache entry goes as that entry's bit; the rest go in full. */
static int encode_and_send_requests(struct hora__engine *e, struct hora_request *const *list,
                                    size_t n) {
  struct hora__runtime *rt = e->rt;
  uint32_t nfull = 0, maxslot = 0;
  bool anybit = false;
  if (e->cache.capacity && !e->bits) {
    e->bits = hora__calloc((e->cache.capacity + 7) / 8, 1);
    if (!e->bits) {
      return HORA_ERR_NO_MEMORY;
    }
  }
  hora__encode_requests_begin(&e->wbuf);
  for (size_t i = 0; i < n; i++) {
    struct hora_request *q = list[i];
    int32_t slot = q->sent_slot == -2 ? hora__cache_find(&e->cache, q->key, q->key_len) : -1;
    if (slot >= 0 && hora__meta_equal(&e->cache.e[slot].meta, &q->meta)) {
      e->bits[slot / 8] |= (uint8_t)(1u << (slot % 8));
      maxslot = HORA_MAX(maxslot, (uint32_t)slot);
      anybit = true;
      q->sent_slot = slot;
      q->sent_version = e->cache.version;
      atomic_fetch_add(&rt->stats.cache_hits, 1);
    } else {
      hora__encode_request(&e->wbuf, &q->meta, q->key, q->key_len);
      q->sent_slot = -1;
      nfull++;
      if (q->meta.kind <= HORA_KIND_ALLGATHER) {
        atomic_fetch_add(&rt->stats.cache_misses, 1);
      }
    }
  }
  uint32_t nbytes = anybit ? maxslot / 8 + 1 : 0;
  hora__encode_requests_end(&e->wbuf, nfull, e->cache.version, e->bits, nbytes);
  if (nbytes) {
    memset(e->bits, 0, nbytes);
  }
  if (e->wbuf.failed) {
    return hora__error(HORA_ERR_NO_MEMORY, "out of memory encoding %zu requests", n);
  }
  return ctrl_send(e, e->comm->ctrl[0], HORA_MSG_REQUESTS, e->wbuf.data, e->wbuf.len);
}

static int take_submissions(struct hora__engine *e, bool *busy) {
  struct hora__runtime *rt = e->rt;
  e->seen_seq = atomic_load_explicit(&rt->submit_seq, memory_order_acquire);
  pthread_mutex_lock(&rt->mu);
  struct hora_request *head = rt->queue_head;
  rt->queue_head = rt->queue_tail = NULL;
  bool abort_asked = rt->abort_asked;
  char reason[sizeof(rt->abort_reason)];
  memcpy(reason, rt->abort_reason, sizeof(reason));
  pthread_mutex_unlock(&rt->mu);
  if (abort_asked) {
    return hora__error(HORA_ERR_ABORTED, "hora_abort called on rank %d: %s", rt->rank, reason);
  }
  if (!head) {
    return HORA_SUCCESS;
  }
  *busy = true;
  if (e->ctl) {
    for (struct hora_request *r = head; r; r = r->next) {
      if (r->meta.kind <= HORA_KIND_ALLGATHER) {
        int32_t slot = hora__cache_find(&e->cache, r->key, r->key_len);
        bool hit = slot >= 0 && hora__meta_equal(&e->cache.e[slot].meta, &r->meta);
        atomic_fetch_add(hit ? &rt->stats.cache_hits : &rt->stats.cache_misses, 1);
      }
      struct hora__wire_request w = {.meta = r->meta, .key = r->key, .key_len = r->key_len};
      HORA_CHECK(hora__controller_submit(e->ctl, 0, &w));
    }
    return HORA_SUCCESS;
  }
  size_t n = 0;
  for (struct hora_request *r = head; r; r = r->next) {
    n++;
  }
  HORA_CHECK(grow_reqs(e, n));
  n = 0;
  for (struct hora_request *r = head; r; r = r->next) {
    r->sent_slot = -2; /* not sent yet: may go by cache bit */
    e->reqs[n++] = r;
  }
  return encode_and_send_requests(e, e->reqs, n);
}

/* ---- execution -------------------------------------------------------------- */

static struct hora_request *lookup(struct hora__engine *e, const struct hora__resp_tensor *t) {
  pthread_mutex_lock(&e->rt->mu);
  struct hora_request *r = hora__table_get(&e->rt->inflight, t->key, t->key_len);
  pthread_mutex_unlock(&e->rt->mu);
  return r;
}

static void complete(struct hora__engine *e, struct hora_request **reqs, size_t n, int status,
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

static int missing_tensor(struct hora__engine *e, const struct hora__response *r,
                          const struct hora__resp_tensor *t) {
  char name[300];
  return hora__error(HORA_ERR_SYSTEM, "rank 0 scheduled %s %s, which this rank never submitted",
                     hora__kind_name(r->kind), hora__key_display(t->key, t->key_len, name, sizeof(name)));
}

static int ensure_buffer(void **buf, size_t *have, size_t need, bool zero) {
  if (*have >= need) {
    return HORA_SUCCESS;
  }
  void *p = hora__aligned_alloc(64, need);
  if (!p) {
    return HORA_ERR_NO_MEMORY;
  }
  if (zero) {
    memset(p, 0, need);
  }
  free(*buf);
  *buf = p;
  *have = need;
  return HORA_SUCCESS;
}

static void timeline_all(const struct hora__response *r, const char *phase) {
  if (!hora__timeline_enabled()) {
    return;
  }
  for (uint32_t i = 0; i < r->ntensors; i++) {
    if (phase) {
      hora__timeline_begin(r->tensors[i].key, r->tensors[i].key_len, phase);
    } else {
      hora__timeline_end(r->tensors[i].key, r->tensors[i].key_len);
    }
  }
}

static hora_dtype wire_dtype(const struct hora__response *r) {
  bool floating = r->dtype == HORA_FLOAT32 || r->dtype == HORA_FLOAT64;
  if (!floating || r->compression == HORA_COMPRESSION_NONE) {
    return (hora_dtype)r->dtype;
  }
  return r->compression == HORA_COMPRESSION_FP16 ? HORA_FLOAT16 : HORA_BFLOAT16;
}

/* Looks up the local request of every tensor; a joined rank may lack some. */
static int gather_requests(struct hora__engine *e, const struct hora__response *r, bool *joined) {
  HORA_CHECK(grow_reqs(e, r->ntensors));
  pthread_mutex_lock(&e->rt->mu);
  *joined = e->rt->joined;
  pthread_mutex_unlock(&e->rt->mu);
  for (uint32_t i = 0; i < r->ntensors; i++) {
    e->reqs[i] = lookup(e, &r->tensors[i]);
    if (!e->reqs[i] && !(*joined && r->kind == HORA_KIND_ALLREDUCE)) {
      return missing_tensor(e, r, &r->tensors[i]);
    }
  }
  return HORA_SUCCESS;
}

static void account(struct hora__engine *e, const struct hora__response *r, uint64_t start_ns,
                    uint64_t comm_ns) {
  struct hora__runtime *rt = e->rt;
  size_t esize = hora_dtype_size((hora_dtype)r->dtype);
  uint64_t bytes = 0, negotiate = 0;
  for (uint32_t i = 0; i < r->ntensors; i++) {
    bytes += r->tensors[i].count * esize;
    if (e->reqs[i] && start_ns > e->reqs[i]->submit_ns) {
      negotiate += start_ns - e->reqs[i]->submit_ns;
    }
  }
  atomic_uint_fast64_t *kind = r->kind == HORA_KIND_ALLREDUCE   ? &rt->stats.allreduces
                               : r->kind == HORA_KIND_BROADCAST ? &rt->stats.broadcasts
                                                                : &rt->stats.allgathers;
  atomic_fetch_add(kind, r->ntensors);
  atomic_fetch_add(&rt->stats.bytes, bytes);
  atomic_fetch_add(&rt->stats.negotiate_ns, negotiate);
  atomic_fetch_add(&rt->stats.communicate_ns, comm_ns - HORA_MIN(comm_ns, e->copy_ns));
  atomic_fetch_add(&rt->stats.copy_ns, e->copy_ns);
  if (r->ntensors > 1) {
    atomic_fetch_add(&rt->stats.fused_batches, 1);
    atomic_fetch_add(&rt->stats.fused_tensors, r->ntensors);
  }
}

/* The algorithms report their phases: timeline rows, and the copy time. */
static void on_phase(void *arg, const char *name) {
  struct hora__engine *e = arg;
  if (name) {
    e->phase_ns = hora__now_ns();
    e->phase_is_copy = strncmp(name, "MEMCPY", 6) == 0;
  } else if (e->phase_is_copy) {
    e->copy_ns += hora__now_ns() - e->phase_ns;
    e->phase_is_copy = false;
  }
  timeline_all(e->current, name);
}

static int grow_iovs(struct hora__engine *e, uint32_t n) {
  if (n <= e->iov_cap) {
    return HORA_SUCCESS;
  }
  struct hora__iov *in = hora__realloc(e->iov_in, n * sizeof(*in));
  if (!in) {
    return HORA_ERR_NO_MEMORY;
  }
  e->iov_in = in;
  struct hora__iov *out = hora__realloc(e->iov_out, n * sizeof(*out));
  if (!out) {
    return HORA_ERR_NO_MEMORY;
  }
  e->iov_out = out;
  e->iov_cap = n;
  return HORA_SUCCESS;
}

/* HORA_VERIFY: every rank checks that it holds the same result bits. */
static int verify(struct hora__engine *e, const struct hora__response *r, size_t bytes) {
  const struct hora__iov *out = e->iov_out;
  int n = (int)r->ntensors;
  struct hora__iov gathered;
  if (r->kind == HORA_KIND_ALLGATHER) {
    gathered = (struct hora__iov){e->reqs[0]->recvbuf, bytes * (size_t)e->comm->size};
    out = &gathered;
    n = 1;
  }
  if (hora__params.VERIFY_CORRUPT_RANK == e->rt->rank) {
    for (int i = 0; i < n; i++) {
      if (out[i].len) {
        ((uint8_t *)out[i].base)[out[i].len / 2] ^= 0x10;
        break;
      }
    }
  }
  char name[160], what[256];
  hora__key_display(r->tensors[0].key, r->tensors[0].key_len, name, sizeof(name));
  if (r->ntensors > 1) {
    snprintf(what, sizeof(what), "%s %s (fused with %u more)", hora__kind_name(r->kind), name,
             r->ntensors - 1);
  } else {
    snprintf(what, sizeof(what), "%s %s", hora__kind_name(r->kind), name);
  }
  on_phase(e, "VERIFY");
  int rc = hora__verify_result(e->comm, out, n, what);
  on_phase(e, NULL);
  return rc;
}

/* Device buffers: the device data plane, on the runtime's stream. A
 * joined rank's stand-ins are device memory there (NULL entries here). */
static int run_on_device(struct hora__engine *e, const struct hora__response *r, size_t total,
                         size_t bytes, const struct hora__coll_opts *opts) {
  hora__comm *c = e->comm;
  if (e->events_cap < r->ntensors) {
    void **ready = realloc(e->ready, r->ntensors * sizeof(void *));
    void **done = ready ? realloc(e->done, r->ntensors * sizeof(void *)) : NULL;
    if (ready) {
      e->ready = ready;
    }
    if (!ready || !done) {
      return hora__error(HORA_ERR_NO_MEMORY, "event lists of %u tensors", r->ntensors);
    }
    e->done = done;
    e->events_cap = r->ntensors;
  }
  bool wait = false;
  for (uint32_t i = 0; i < r->ntensors; i++) {
    struct hora_request *q = e->reqs[i];
    e->ready[i] = q ? q->ready_event : NULL;
    e->done[i] = q ? q->done_event : NULL;
    wait = wait || !q || !q->done_event;
  }
  if (r->kind == HORA_KIND_ALLGATHER) {
    struct hora_request *q = e->reqs[0];
    e->iov_in[0] = (struct hora__iov){(void *)(uintptr_t)q->sendbuf, bytes};
    e->iov_out[0] = (struct hora__iov){q->recvbuf, bytes * (size_t)c->size};
  }
  struct hora__gpu_op op = {
      .kind = r->kind,
      .in = e->iov_in,
      .out = e->iov_out,
      .n = (int)r->ntensors,
      .count = total,
      .dtype = (hora_dtype)r->dtype,
      .op = (hora_op)r->op,
      .root = r->root,
      .opts = opts,
      .ready = e->ready,
      .done = e->done,
      .wait = wait,
  };
  return hora__gpu_collective(c, &e->gpu, &op);
}

static int run_on_host(struct hora__engine *e, const struct hora__response *r, size_t total,
                       size_t bytes, const struct hora__coll_opts *opts) {
  hora__comm *c = e->comm;
  int rc;
  if (r->kind == HORA_KIND_ALLREDUCE) {
    rc = hora__allreduce(c, e->iov_in, (int)r->ntensors, e->iov_out, (int)r->ntensors, total,
                         (hora_dtype)r->dtype, (hora_op)r->op, wire_dtype(r), opts);
  } else if (r->kind == HORA_KIND_BROADCAST) {
    rc = hora__broadcast(c, e->iov_out, (int)r->ntensors, bytes, r->root, opts);
  } else {
    struct hora_request *q = e->reqs[0];
    on_phase(e, "ALLGATHER");
    rc = hora__allgather(c, q->sendbuf, bytes, q->recvbuf);
    on_phase(e, NULL);
  }
  if (rc == HORA_SUCCESS && hora__params.VERIFY) {
    rc = verify(e, r, bytes);
  }
  return rc;
}

static int run_collective(struct hora__engine *e, const struct hora__response *r) {
  hora__comm *c = e->comm;
  size_t esize = hora_dtype_size((hora_dtype)r->dtype);
  bool joined;
  HORA_CHECK(gather_requests(e, r, &joined));
  HORA_CHECK(grow_iovs(e, r->ntensors));
  /* A joined rank stands in with zeros for what it did not submit, each
   * tensor in its own place: the algorithm must see the same shape of
   * buffers on every rank, and peers may read any of them. (The device
   * data plane keeps its own stand-ins.) */
  size_t missing = 0;
  for (uint32_t i = 0; i < r->ntensors && !r->device; i++) {
    if (!e->reqs[i]) {
      missing += r->tensors[i].count * esize;
    }
  }
  if (missing) {
    HORA_CHECK(ensure_buffer(&e->zeros, &e->zeros_bytes, missing, true));
    HORA_CHECK(ensure_buffer(&e->junk, &e->junk_bytes, missing, false));
  }
  size_t total = 0, bytes = 0, stand_in = 0;
  for (uint32_t i = 0; i < r->ntensors; i++) {
    size_t b = r->tensors[i].count * esize;
    struct hora_request *q = e->reqs[i];
    if (q) {
      e->iov_in[i] = (struct hora__iov){(void *)(uintptr_t)q->sendbuf, b};
      e->iov_out[i] = (struct hora__iov){q->recvbuf, b};
    } else if (r->device) {
      e->iov_in[i] = e->iov_out[i] = (struct hora__iov){NULL, b};
    } else {
      e->iov_in[i] = (struct hora__iov){(char *)e->zeros + stand_in, b};
      e->iov_out[i] = (struct hora__iov){(char *)e->junk + stand_in, b};
      stand_in += b;
    }
    total += r->tensors[i].count;
    bytes += b;
  }
  struct hora__coll_opts opts = {
      .prescale = r->prescale,
      .divisor = r->op == HORA_AVERAGE ? c->size : 0,
      .postscale = r->postscale,
      .phase = on_phase,
      .phase_arg = e,
  };
  e->current = r;
  e->copy_ns = 0;
  timeline_all(r, NULL); /* QUEUE ends */
  uint64_t start = hora__now_ns();
  int rc = r->device ? run_on_device(e, r, total, bytes, &opts)
                     : run_on_host(e, r, total, bytes, &opts);
  e->current = NULL;
  HORA_CHECK(rc);
  account(e, r, start, hora__now_ns() - start);
  complete(e, e->reqs, r->ntensors, HORA_SUCCESS, NULL);
  return HORA_SUCCESS;
}

/* Barriers and unnamed operations are keyed by per-rank sequence numbers.
 * A rank that had joined submits none, yet the others' run (stood in for)
 * or fail (refused because of the join): it counts them too, so that after
 * the join every rank's next number is the same. */
static void keep_sequences_in_step(struct hora__engine *e, const struct hora__response *r) {
  for (uint32_t i = 0; i < r->ntensors; i++) {
    const struct hora__resp_tensor *t = &r->tensors[i];
    if (t->key_len < 2 || (t->key[0] != HORA_KEY_BARRIER && t->key[0] != HORA_KEY_UNNAMED)) {
      continue;
    }
    uint64_t n = 0;
    for (uint16_t k = 1; k < t->key_len; k++) {
      n = n * 10 + (uint64_t)(t->key[k] - '0');
    }
    struct hora__runtime *rt = e->rt;
    pthread_mutex_lock(&rt->mu);
    uint64_t *seq = t->key[0] == HORA_KEY_BARRIER ? &rt->barrier_seq : &rt->unnamed_seq;
    if (*seq <= n) {
      *seq = n + 1;
    }
    pthread_mutex_unlock(&rt->mu);
  }
}

static int execute(struct hora__engine *e, const struct hora__response *r) {
  struct hora_request *q = NULL;
  keep_sequences_in_step(e, r);
  switch (r->kind) {
    case HORA_KIND_ALLREDUCE:
    case HORA_KIND_BROADCAST:
    case HORA_KIND_ALLGATHER:
      return run_collective(e, r);
    case HORA_KIND_BARRIER:
      q = lookup(e, &r->tensors[0]);
      if (!q) {
        return missing_tensor(e, r, &r->tensors[0]);
      }
      timeline_all(r, NULL);
      complete(e, &q, 1, HORA_SUCCESS, NULL);
      return HORA_SUCCESS;
    case HORA_KIND_ERROR:
      for (uint32_t i = 0; i < r->ntensors; i++) {
        struct hora_request *x = lookup(e, &r->tensors[i]);
        complete(e, &x, 1, r->error_code, r->error_msg ? r->error_msg : "");
      }
      return HORA_SUCCESS;
    case HORA_KIND_JOIN: {
      struct hora__resp_tensor t = {.key = (char[]){HORA_KEY_JOIN, 0}, .key_len = 1};
      struct hora__runtime *rt = e->rt;
      pthread_mutex_lock(&rt->mu);
      struct hora_request *j = hora__table_get(&rt->inflight, t.key, t.key_len);
      rt->joined = false;
      if (j) {
        j->last_joined = r->last_joined;
        hora__request_complete_locked(rt, j, HORA_SUCCESS, NULL);
        pthread_cond_broadcast(&rt->done_cv);
      }
      pthread_mutex_unlock(&rt->mu);
      return HORA_SUCCESS;
    }
    case HORA_KIND_SHUTDOWN: {
      struct hora__resp_tensor t = {.key = (char[]){HORA_KEY_SHUTDOWN, 0}, .key_len = 1};
      struct hora_request *s = lookup(e, &t);
      complete(e, &s, 1, HORA_SUCCESS, NULL);
      e->stop = true;
      return HORA_SUCCESS;
    }
    default:
      return hora__error(HORA_ERR_SYSTEM, "response of unknown kind %u", r->kind);
  }
}

/* Rank 0: sends the ready responses when the cycle policy says so. */
static int distribute(struct hora__engine *e) {
  hora__comm *c = e->comm;
  uint64_t wake;
  e->send_at_ns = UINT64_MAX;
  if (!hora__controller_should_send(e->ctl, hora__now_ns(),
                                    (uint64_t)(hora__params.CYCLE_TIME * 1e6),
                                    (uint64_t)hora__params.FUSION_THRESHOLD, &wake)) {
    e->send_at_ns = wake;
    return HORA_SUCCESS;
  }
  struct hora__response *head = NULL, **tail = &head;
  HORA_CHECK(hora__controller_take(e->ctl, &tail, hora__params.FUSION_THRESHOLD));
  uint32_t n = 0;
  for (struct hora__response *r = head; r; r = r->next) {
    n++;
  }
  struct hora__response **v = hora__malloc((n ? n : 1) * sizeof(*v));
  int rc = v ? HORA_SUCCESS : HORA_ERR_NO_MEMORY;
  n = 0;
  for (struct hora__response *r = head; r && v; r = r->next) {
    v[n++] = r;
  }
  if (rc == HORA_SUCCESS) {
    rc = hora__encode_responses(&e->wbuf, v, n, &e->cache);
  }
  free(v);
  *e->todo_tail = head; /* queued even on failure, so they are freed */
  e->todo_tail = tail;
  HORA_CHECK(rc);
  for (struct hora__response *r = head; r; r = r->next) {
    e->shutting_down |= r->kind == HORA_KIND_SHUTDOWN;
  }
  for (int r = 1; r < c->size; r++) {
    if (c->ctrl[r]) {
      HORA_CHECK(ctrl_send(e, c->ctrl[r], HORA_MSG_RESPONSES, e->wbuf.data, e->wbuf.len));
    }
  }
  return HORA_SUCCESS;
}

static int distribute_and_run(struct hora__engine *e, bool *busy) {
  if (e->ctl && hora__controller_has_ready(e->ctl)) {
    HORA_CHECK(distribute(e));
  }
  while (e->todo && !e->stop) {
    struct hora__response *r = e->todo;
    e->todo = r->next;
    if (!e->todo) {
      e->todo_tail = &e->todo;
    }
    *busy = true;
    HORA_TRACE("execute %s (%u tensors)", hora__kind_name(r->kind), r->ntensors);
    int rc = execute(e, r);
    hora__response_free(r);
    HORA_CHECK(rc);
  }
  return HORA_SUCCESS;
}

/* ---- sleeping and waking -------------------------------------------------- */

void hora__engine_wake_locked(struct hora__runtime *rt) {
  if (rt->coord_sleeping) {
    rt->coord_sleeping = false;
    uint64_t one = 1;
    ssize_t w = write(rt->wake_fd, &one, sizeof(one));
    (void)w;
  }
}

static void refuse_connections(struct hora__engine *e, int lfd) {
  for (;;) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int fd = accept4(lfd, (struct sockaddr *)&ss, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      return;
    }
    char who[64] = "a local process";
    if (ss.ss_family == AF_INET) {
      struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
      char ip[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof(ip));
      snprintf(who, sizeof(who), "%s:%d", ip, ntohs(sin->sin_port));
    }
    HORA_WARN("refused a connection from %s: every connection of this job is already made",
              who);
    close(fd);
  }
}

/* With a core to spare, poll briefly for work before sleeping: a wake-up
 * from poll() costs more than the whole exchange of a small allreduce. */
static int spin_for_work(struct hora__engine *e, bool *found) {
  hora__comm *c = e->comm;
  *found = false;
  if (c->spin_us <= 0) {
    return HORA_SUCCESS;
  }
  uint64_t until = hora__now_ns() + (uint64_t)c->spin_us * 1000;
  uint64_t frames = e->frames_in;
  do {
    if (atomic_load_explicit(&e->rt->submit_seq, memory_order_acquire) != e->seen_seq) {
      *found = true;
      return HORA_SUCCESS;
    }
    HORA_CHECK(service(e));
    if (e->frames_in != frames || e->todo || (e->ctl && hora__controller_has_ready(e->ctl))) {
      *found = true;
      return HORA_SUCCESS;
    }
    sched_yield();
  } while (hora__now_ns() < until && hora__now_ns() < e->send_at_ns);
  return HORA_SUCCESS;
}

static int sleep_until_work(struct hora__engine *e) {
  struct hora__runtime *rt = e->rt;
  hora__comm *c = e->comm;
  bool found;
  HORA_CHECK(spin_for_work(e, &found));
  if (found) {
    return HORA_SUCCESS;
  }
  pthread_mutex_lock(&rt->mu);
  bool idle = !rt->queue_head && !rt->abort_asked;
  rt->coord_sleeping = idle;
  pthread_mutex_unlock(&rt->mu);
  if (!idle) {
    return HORA_SUCCESS;
  }
  struct pollfd *fds = e->pollfds;
  int n = 0;
  fds[n++] = (struct pollfd){.fd = rt->wake_fd, .events = POLLIN};
  fds[n++] = (struct pollfd){.fd = c->tcp_listen_fd, .events = POLLIN};
  fds[n++] = (struct pollfd){.fd = c->unix_listen_fd, .events = POLLIN};
  int nfixed = n;
  n += service_pollfds(e, fds + n, e->npollfds - n);
  hora__timeline_flush();
  int timeout = 1000;
  uint64_t due = HORA_MIN(e->next_stall_ns, e->send_at_ns);
  if (due != UINT64_MAX) {
    uint64_t now = hora__now_ns();
    uint64_t us = due > now ? (due - now + 999) / 1000 : 0;
    /* poll() counts milliseconds; a shorter cycle than that is served by
     * ppoll's finer timeout. */
    struct timespec ts = {.tv_sec = (time_t)(us / 1000000), .tv_nsec = (long)(us % 1000000) * 1000};
    if (us < 1000000) {
      if (ppoll(fds, (nfds_t)n, &ts, NULL) < 0 && errno != EINTR) {
        return hora__error_errno(HORA_ERR_SYSTEM, "ppoll");
      }
      goto woke;
    }
  }
  if (poll(fds, (nfds_t)n, timeout) < 0 && errno != EINTR) {
    return hora__error_errno(HORA_ERR_SYSTEM, "poll");
  }
woke:
  pthread_mutex_lock(&rt->mu);
  rt->coord_sleeping = false;
  pthread_mutex_unlock(&rt->mu);
  if (fds[0].revents) {
    uint64_t v;
    ssize_t r = read(rt->wake_fd, &v, sizeof(v));
    (void)r;
  }
  if (fds[1].revents) {
    refuse_connections(e, c->tcp_listen_fd);
  }
  if (fds[2].revents) {
    refuse_connections(e, c->unix_listen_fd);
  }
  (void)nfixed;
  return HORA_SUCCESS;
}

/* ---- the loop ----------------------------------------------------------------- */

static int cycle(struct hora__engine *e) {
  bool busy = false;
  HORA_CHECK(take_submissions(e, &busy));
  HORA_CHECK(service(e));
  HORA_CHECK(distribute_and_run(e, &busy));
  if (e->stop) {
    return HORA_SUCCESS;
  }
  if (e->ctl) {
    HORA_CHECK(hora__controller_check_stalls(e->ctl, hora__now_ns(),
                                             hora__params.STALL_CHECK_TIME_SECONDS,
                                             hora__params.STALL_SHUTDOWN_TIME_SECONDS,
                                             &e->next_stall_ns));
  }
  if (!busy) {
    HORA_CHECK(sleep_until_work(e));
  }
  return HORA_SUCCESS;
}

/* After a data-plane failure, a neighbour's closed socket is usually the
 * echo of an error elsewhere; give the explanation (an abort from rank 0,
 * or a control connection that closed) a moment to arrive. */
static int attribute_failure(struct hora__engine *e, int rc) {
  char original[1024];
  hora__strlcpy(original, hora__error_message(), sizeof(original));
  uint64_t deadline = hora__now_ns() + 500 * 1000000ull;
  hora__comm *c = e->comm;
  while (hora__now_ns() < deadline) {
    struct pollfd *fds = e->pollfds;
    int n = service_pollfds(e, fds, e->npollfds);
    if (poll(fds, (nfds_t)n, 50) > 0) {
      for (int i = 0, r = 0; r < c->size && i < n; r++) {
        if (!c->ctrl[r]) {
          continue;
        }
        if (fds[i].revents) {
          int rc2 = read_ctrl(e, c->ctrl[r]);
          if (rc2 != HORA_SUCCESS) {
            return rc2;
          }
        }
        i++;
      }
    }
  }
  hora__error(rc, "%s", original);
  return rc;
}

/* Tells the job about a fatal error that started here or at rank 0. */
static void broadcast_fatal(struct hora__engine *e, int code, const char *msg, bool from_root) {
  hora__comm *c = e->comm;
  hora__encode_abort(&e->wbuf, e->rt->rank, code, msg);
  if (e->wbuf.failed) {
    return;
  }
  for (int r = 0; r < c->size; r++) {
    if (!c->ctrl[r] || (r == 0 && from_root)) {
      continue;
    }
    (void)hora__ctrl_send_blocking(c->ctrl[r], HORA_MSG_ABORT, e->wbuf.data, e->wbuf.len, 1.0);
  }
}

/* Stops accepting work and completes every request still in flight, with
 * the fatal error, or after a normal shutdown with HORA_ERR_ABORTED. */
static void fail_everything(struct hora__engine *e) {
  struct hora__runtime *rt = e->rt;
  int code = atomic_load(&rt->fatal_code);
  const char *msg = code ? rt->fatal_msg : "the runtime was finalized before this operation ran";
  if (!code) {
    code = HORA_ERR_ABORTED;
  }
  pthread_mutex_lock(&rt->mu);
  rt->accepting = false;
  /* Queued requests are in the in-flight table too. */
  rt->queue_head = rt->queue_tail = NULL;
  while (rt->inflight.count > 0) {
    struct hora_request *victims[64];
    size_t n = 0;
    for (size_t b = 0; b < rt->inflight.nbuckets && n < HORA_ARRAY_SIZE(victims); b++) {
      for (struct hora__table_entry *t = rt->inflight.buckets[b];
           t && n < HORA_ARRAY_SIZE(victims); t = t->next) {
        victims[n++] = t->value;
      }
    }
    for (size_t i = 0; i < n; i++) {
      hora__request_complete_locked(rt, victims[i], code, msg);
    }
  }
  rt->coordinator_exited = true;
  pthread_cond_broadcast(&rt->done_cv);
  pthread_mutex_unlock(&rt->mu);
}

/* Writes out what is still queued on the control connections (the last
 * responses, say) before they close; bounded, since a peer may be gone. */
static void flush_control(struct hora__engine *e, double timeout_s) {
  hora__comm *c = e->comm;
  uint64_t deadline = hora__now_ns() + (uint64_t)(timeout_s * 1e9);
  for (;;) {
    struct pollfd *fds = e->pollfds;
    int n = 0;
    for (int r = 0; r < c->size && n < e->npollfds; r++) {
      if (c->ctrl[r] && hora__ctrl_has_output(c->ctrl[r])) {
        if (hora__ctrl_flush(c->ctrl[r]) != HORA_SUCCESS) {
          hora__ctrl_free(c->ctrl[r]);
          c->ctrl[r] = NULL;
          continue;
        }
        if (hora__ctrl_has_output(c->ctrl[r])) {
          fds[n++] = (struct pollfd){.fd = hora__ctrl_fd(c->ctrl[r]), .events = POLLOUT};
        }
      }
    }
    uint64_t now = hora__now_ns();
    if (n == 0 || now >= deadline) {
      return;
    }
    (void)poll(fds, (nfds_t)n, (int)HORA_MIN((deadline - now) / 1000000 + 1, 100));
  }
}

static void *coordinator_main(void *arg) {
  struct hora__runtime *rt = arg;
  struct hora__engine *e = rt->engine;
  pthread_setname_np(pthread_self(), "hora-coord");
  e->comm->service = service;
  e->comm->service_pollfds = service_pollfds;
  e->comm->service_arg = e;
  int rc = HORA_SUCCESS;
  while (!e->stop && rc == HORA_SUCCESS) {
    rc = cycle(e);
  }
  if (rc != HORA_SUCCESS) {
    if (rc == HORA_ERR_PEER_LOST && strstr(hora__error_message(), "data connection")) {
      rc = attribute_failure(e, rc);
    }
    /* The first fatal error wins: hora_abort may have recorded one already. */
    hora__runtime_set_fatal(rt, rc, hora__error_message());
    int code = atomic_load(&rt->fatal_code);
    HORA_ERROR("fatal: %s (%s)", rt->fatal_msg, hora_strerror(code));
    broadcast_fatal(e, code, rt->fatal_msg, e->abort_from_root);
  }
  fail_everything(e);
  if (rc == HORA_SUCCESS) {
    flush_control(e, 5.0);
  }
  hora__comm_disconnect(e->comm);
  return NULL;
}

int hora__engine_start(struct hora__runtime *rt) {
  struct hora__engine *e = hora__calloc(1, sizeof(*e));
  if (!e) {
    return HORA_ERR_NO_MEMORY;
  }
  e->rt = rt;
  e->comm = rt->comm;
  e->todo_tail = &e->todo;
  e->next_stall_ns = UINT64_MAX;
  e->send_at_ns = UINT64_MAX;
  e->npollfds = rt->size + 8;
  e->pollfds = hora__calloc((size_t)e->npollfds, sizeof(*e->pollfds));
  if (!e->pollfds) {
    engine_free(e);
    return HORA_ERR_NO_MEMORY;
  }
  int crc = hora__cache_init(&e->cache, (uint32_t)hora__params.CACHE_CAPACITY);
  if (crc != HORA_SUCCESS) {
    engine_free(e);
    return crc;
  }
  if (rt->rank == 0) {
    int rc = hora__controller_create(rt->size, &e->ctl);
    if (rc != HORA_SUCCESS) {
      engine_free(e);
      return rc;
    }
  }
  rt->engine = e;
  int err = pthread_create(&rt->thread, NULL, coordinator_main, rt);
  if (err != 0) {
    rt->engine = NULL;
    engine_free(e);
    errno = err;
    return hora__error_errno(HORA_ERR_SYSTEM, "pthread_create(coordinator)");
  }
  rt->thread_started = true;
  return HORA_SUCCESS;
}

void hora__engine_join(struct hora__runtime *rt) {
  if (rt->thread_started) {
    pthread_join(rt->thread, NULL);
    rt->thread_started = false;
  }
  engine_free(rt->engine);
  rt->engine = NULL;
}
