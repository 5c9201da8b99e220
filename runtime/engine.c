/* The coordinator thread.
 *
 * Negotiation. A request whose key and options are in the response cache
 * (it ran before) waits as one bit, its slot; any other goes in full to
 * rank 0, whose controller matches it across ranks (negotiate.c) and sends
 * every rank the same frames of responses. The bits are agreed on in
 * cycles: an allreduce of bit vectors between the ranks themselves, by
 * recursive doubling (partners from hora__cycle_partners), with no round
 * trip through rank 0. A cycle reduces
 *
 *   ready      AND  slots this rank can run now (a joined rank: every
 *                   cached allreduce, which it stands in for)
 *   submitted  OR   slots some rank really submitted
 *   evict      OR   slots to empty (a request that changed its options,
 *                   one waiting too long: the stall inspector must see it)
 *   frames     MAX  response frames rank 0 had sent when it took part
 *   flags      OR   some rank has a join in flight
 *
 * A rank starts the next cycle when it has new cached requests, when rank
 * 0 has sent frames, or when a partner's message for it arrives; idle
 * ranks never cycle. At the end of cycle k every rank, in the same order:
 * schedules the slots ready everywhere and submitted somewhere (in slot
 * order, fused), empties the evicted slots, then applies rank 0's frames up
 * to the cycle's count (waiting for them if they are still on the way).
 * Frames are applied nowhere else, so the caches, which only these steps
 * change, stay identical, and every rank runs the same responses in the
 * same order. Bits contributed to cycle k refer to the cache as it was
 * after cycle k-1 on every rank. A waiting request whose slot changed,
 * or a non-allreduce while someone has joined (rank 0 then refuses it),
 * goes in full. A cycle that some rank never joins (alive but stuck) is
 * reported to rank 0 after half the stall time by every rank in it, so
 * that its stall inspector can name the ranks that never reported.
 *
 * The loop: take submissions; read the control connections; rank 0 sends
 * the responses that became ready; advance the cycle; at its end, schedule
 * and run the responses (the collectives, then the requests complete);
 * with nothing to do, sleep in poll() on the wake eventfd and the control
 * sockets: an idle job costs no CPU.
 *
 * The first fatal error (a lost peer, a stall past the shutdown time,
 * hora_abort) is sent to every connected rank and rank 0 passes it on;
 * then the coordinator fails every request and closes its connections. */
#include <arpa/inet.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/coll/collectives.h"
#include "comm/gpu/gpu.h"
#include "comm/reduce/reduce.h"
#include "comm/transport/socket.h"
#include "runtime/cache.h"
#include "runtime/cycle.h"
#include "base/log.h"
#include "base/params.h"
#include "runtime/runtime.h"
#include "runtime/verify.h"
#include "runtime/timeline.h"

/* Cycle steps on the wire (cycle.h). */
#define STEP_FOLD_IN HORA_STEP_FOLD_IN
#define STEP_FOLD_OUT HORA_STEP_FOLD_OUT
#define STEP_ASK HORA_STEP_ASK
#define INBOX_STEPS HORA_INBOX_STEPS

enum { CYCLE_IDLE, CYCLE_FOLD_IN, CYCLE_ROUNDS, CYCLE_RESULT, CYCLE_DONE };

struct frame {
  struct frame *next;
  size_t len;
  uint8_t data[];
};

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
  /* Cycles (see the top of this file). */
  struct hora__cycle_partners partners;
  struct hora_request **waiting; /* [cache capacity]: our request on each slot */
  uint32_t nwaiting;
  uint64_t new_hits;     /* requests that went into `waiting` since we last took part */
  uint8_t *evict_wish;   /* [bitmap]: slots we want emptied */
  bool evict_wanted;
  uint64_t next_wait_scan_ns; /* when to look for requests waiting too long */
  uint64_t cycle_started_ns;
  bool stuck_reported;   /* told rank 0 that the cycle in progress waits too long */
  /* rank 0: who reported which cycle stuck, since when, and one of its keys */
  uint64_t *stuck_cycle, *stuck_since_ns;
  char stuck_key[HORA_KEY_MAX + 1];
  size_t stuck_key_len;
  uint64_t next_stuck_ns, next_stuck_warn_ns;
  uint64_t cycles;       /* cycles whose end has been applied */
  int cycle_phase;       /* CYCLE_IDLE, or where the one in progress stands */
  int cycle_round;
  bool round_sent;
  uint8_t *acc;          /* ready, submitted, evict: 3 x cycle_nbytes */
  uint32_t cycle_nbytes;
  uint64_t acc_frames;
  uint8_t acc_flags;
  bool our_joined_flag;  /* what we said in our last contribution */
  /* We have taken our own JOIN request, and the cycles have not yet applied
   * the response that ends the join. It decides whether we stand in, and
   * changes only with the cycles (never with when this rank happens to run
   * that response), so every rank agrees on who stands in for which cycle. */
  bool join_pending;
  bool others_joined;    /* what the last cycle said */
  struct hora__cycle_inbox *inbox; /* [2 * INBOX_STEPS]: by cycle parity and step */
  /* Response frames, applied at the end of the cycle that counts them. */
  struct frame *frames_head, **frames_tail;
  uint64_t frames_got;   /* received (rank 0: sent) */
  uint64_t frames_applied;
  uint64_t frames_told;  /* rank 0: the count in its last contribution */
  bool shutdown_seen;    /* a frame holds SHUTDOWN: peers may close now */
  uint64_t frames_in;  /* control frames handled so far */
  bool shutting_down;  /* a SHUTDOWN response is out: peers may close now */
  struct pollfd *pollfds; /* room for every control connection and a few more */
  int npollfds;
  uint64_t seen_seq;   /* rt->submit_seq when the queue was last taken */
  struct hora__gpu *gpu; /* device data plane, set up by the first device op */
  void **ready, **done;  /* per tensor of a device response */
  uint32_t events_cap;
  bool setup_done;       /* HORA_GPU_INIT=eager: hora_init may go on (under rt->mu) */
};

static void engine_free(struct hora__engine *e) {
  if (!e) {
    return;
  }
  hora__controller_destroy(e->ctl);
  hora__cache_free(&e->cache);
  free(e->waiting);
  free(e->evict_wish);
  free(e->acc);
  hora__cycle_inbox_free(e->inbox);
  free(e->stuck_cycle);
  free(e->stuck_since_ns);
  while (e->frames_head) {
    struct frame *f = e->frames_head;
    e->frames_head = f->next;
    free(f);
  }
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
  hora__gpu_destroy(e->comm, e->gpu, atomic_load(&e->rt->fatal_code) != HORA_SUCCESS);
  free(e->ready);
  free(e->done);
  free(e);
}

/* ---- control input ---------------------------------------------------------- */

static int on_abort_frame(struct hora__engine *e, int from, const uint8_t *p, size_t n) {
  int origin, code;
  char msg[900];
  if (hora__decode_abort(p, n, &origin, &code, msg, sizeof(msg)) != HORA_SUCCESS) {
    return hora__error(HORA_ERR_PROTOCOL, "rank %d sent a malformed abort message", from);
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


static int ctrl_send(struct hora__engine *e, hora__ctrl *c, uint16_t type, const void *p,
                     size_t n);
static int lost_partner(struct hora__engine *e, int peer);

/* Where a partner's step of a cycle waits. */
static struct hora__cycle_inbox *inbox_of(struct hora__engine *e, uint64_t cycle, int step) {
  return hora__cycle_inbox_of(e->inbox, cycle, step);
}

/* A partner's step of a cycle: checked, and kept in the inbox until the
 * cycle uses it. */
static int on_cycle_frame(struct hora__engine *e, int from, const uint8_t *p, size_t n) {
  uint32_t max_nbytes = (e->cache.capacity + 7) / 8;
  return hora__cycle_accept(e->inbox, &e->partners, e->cycles, max_nbytes, from, p, n);
}

static int queue_frame(struct hora__engine *e, const uint8_t *p, size_t n) {
  struct frame *f = hora__malloc(sizeof(*f) + n);
  if (!f) {
    return HORA_ERR_NO_MEMORY;
  }
  f->next = NULL;
  f->len = n;
  memcpy(f->data, p, n);
  *e->frames_tail = f;
  e->frames_tail = &f->next;
  e->frames_got++;
  return HORA_SUCCESS;
}

/* Worker: a frame of responses from rank 0, kept until a cycle orders it.
 * Checked now (a malformed frame fails at once), and looked into for the
 * end of the job, after which peers may close their connections. */
static int on_responses_frame(struct hora__engine *e, const uint8_t *p, size_t n) {
  struct hora__response *peek = NULL, **tail = &peek;
  if (hora__decode_responses(p, n, &tail, NULL) != HORA_SUCCESS) {
    return hora__error(HORA_ERR_PROTOCOL, "rank 0 sent a malformed response list: %s",
                       hora__error_message());
  }
  while (peek) {
    struct hora__response *nx = peek->next;
    e->shutdown_seen |= peek->kind == HORA_KIND_SHUTDOWN;
    hora__response_free(peek);
    peek = nx;
  }
  return queue_frame(e, p, n);
}

/* Rank 0: rank `from` has waited `waited_ms` in cycle `cycle`. */
static void record_stuck(struct hora__engine *e, int from, uint64_t cycle, uint32_t waited_ms,
                         const char *key, size_t key_len) {
  uint64_t now = hora__now_ns(), waited = (uint64_t)waited_ms * 1000000u;
  e->stuck_cycle[from] = cycle;
  e->stuck_since_ns[from] = now > waited ? now - waited : 0;
  if (key_len && !e->stuck_key_len) { /* one example is enough; cleared with the stall */
    memcpy(e->stuck_key, key, key_len);
    e->stuck_key_len = key_len;
  }
  e->next_stuck_ns = now; /* look at it in this turn of the loop */
}

/* After the job's end, or from a partner that is no longer needed (its
 * cycles are done; rank 0, which also hears it, reports a real loss), a
 * closed connection is not an error by itself; a cycle that still needs
 * the partner fails then. */
static bool may_close(const struct hora__engine *e, int peer) {
  bool partner_only = e->rt->rank != 0 && peer != 0;
  return e->shutting_down || e->shutdown_seen || partner_only;
}

/* One frame from `peer`. */
static int on_ctrl_frame(struct hora__engine *e, int peer, uint16_t type, const uint8_t *p,
                         size_t n) {
  char name[160];
  e->frames_in++;
  HORA_TRACE("control: frame type %u (%zu bytes) from rank %d", type, n, peer);
  if (type == HORA_MSG_ABORT) {
    return on_abort_frame(e, peer, p, n);
  }
  if (type == HORA_MSG_REQUESTS && e->ctl) {
    struct submit_ctx s = {e, peer};
    struct hora__request_sink sink = {submit_cb, &s};
    if (hora__decode_requests(p, n, &sink) != HORA_SUCCESS) {
      return hora__error(HORA_ERR_PROTOCOL, "%s sent a malformed request list: %s",
                         hora__peer_name(e->comm->net, peer, name, sizeof(name)),
                         hora__error_message());
    }
  } else if (type == HORA_MSG_RESPONSES && !e->ctl && peer == 0) {
    HORA_CHECK(on_responses_frame(e, p, n));
  } else if (type == HORA_MSG_CYCLE) {
    HORA_CHECK(on_cycle_frame(e, peer, p, n));
  } else if (type == HORA_MSG_STUCK && e->ctl) {
    uint64_t cyc;
    uint32_t waited;
    const char *key;
    size_t klen;
    if (hora__decode_stuck(p, n, &cyc, &waited, &key, &klen) != HORA_SUCCESS) {
      return hora__error(HORA_ERR_PROTOCOL, "%s sent a malformed stuck-cycle message",
                         hora__peer_name(e->comm->net, peer, name, sizeof(name)));
    }
    record_stuck(e, peer, cyc, waited, key, klen);
  } else if (type != HORA_MSG_HEARTBEAT) { /* a heartbeat's arriving was the point */
    return hora__error(HORA_ERR_PROTOCOL, "%s sent an unexpected control message (type %u)",
                       hora__peer_name(e->comm->net, peer, name, sizeof(name)), type);
  }
  return HORA_SUCCESS;
}

/* Rounds of reading and parsing one connection per call: the connection
 * holds at most one frame and one read beyond it, and a peer that keeps
 * sending cannot keep the coordinator here (poll brings it back). */
#define READ_ROUNDS 64

/* Reads and handles the complete frames on one control connection. */
static int read_ctrl(struct hora__engine *e, hora__ctrl *c) {
  int peer = hora__ctrl_peer(c);
  char name[160];
  int rc = HORA_SUCCESS;
  for (int round = 0; round < READ_ROUNDS; round++) {
    rc = hora__ctrl_read(c);
    /* Frames that arrived before an EOF still count: an abort explains it. */
    int frames = 0;
    for (;;) {
      bool got;
      uint16_t type;
      const uint8_t *p;
      size_t n;
      HORA_CHECK(hora__ctrl_next(c, &got, &type, &p, &n));
      if (!got) {
        break;
      }
      frames++;
      HORA_CHECK(on_ctrl_frame(e, peer, type, p, n));
    }
    if (rc != HORA_SUCCESS || frames == 0) {
      break;
    }
  }
  if (rc == HORA_ERR_PEER_LOST) {
    HORA_DEBUG("control: connection to rank %d closed", peer);
    if (may_close(e, peer)) {
      hora__ctrl_free(c);
      e->comm->proc->ctrl[peer] = NULL;
      return HORA_SUCCESS;
    }
    return hora__error(HORA_ERR_PEER_LOST, "lost %s: its control connection closed",
                       hora__peer_name(e->comm->net, peer, name, sizeof(name)));
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
  int peer = hora__ctrl_peer(c);
  int why = read_ctrl(e, c);
  /* An abort frame explains the broken connection, whatever its code, and
   * an EOF names the lost peer's host and pid, which the errno does not. */
  if (why != HORA_SUCCESS) {
    return why;
  }
  /* The peer went away after the job's end, or was a partner no longer
   * needed: the write did not matter. read_ctrl may have closed (and freed)
   * the connection already; it sees the EOF only after the last frames. */
  if (!e->comm->proc->ctrl[peer]) {
    return HORA_SUCCESS;
  }
  if (may_close(e, peer)) {
    HORA_DEBUG("control: connection to rank %d closed", peer);
    hora__ctrl_free(c);
    e->comm->proc->ctrl[peer] = NULL;
    return HORA_SUCCESS;
  }
  /* Nothing left to read says more (what the peer sent before dying was
   * still queued): name it as lost, with its host and pid, all the same. */
  char name[160];
  hora__peer_name(e->comm->net, peer, name, sizeof(name));
  return hora__error(rc, "lost %s: %s", name, original);
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
  int peer = hora__ctrl_peer(c);
  if (now - hora__ctrl_last_out(c) >= limit / 4) {
    HORA_CHECK(ctrl_send(e, c, HORA_MSG_HEARTBEAT, NULL, 0));
    if (!e->comm->proc->ctrl[peer]) {
      return HORA_SUCCESS; /* closed (and freed) after the job's end */
    }
  }
  if (now - hora__ctrl_last_in(c) >= limit) {
    char name[160];
    return hora__error(HORA_ERR_PEER_LOST,
                       "lost %s: nothing heard from it for %.1f s (HORA_PEER_TIMEOUT_SECONDS)",
                       hora__peer_name(e->comm->net, hora__ctrl_peer(c), name, sizeof(name)),
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
  /* Stream-ordered device requests complete once queued: NCCL's errors
   * are watched here, idle or not, so their waits end. */
  HORA_CHECK(hora__gpu_check(e->gpu));
  for (int r = 0; r < c->size; r++) {
    if (c->proc->ctrl[r]) {
      HORA_CHECK(read_ctrl(e, c->proc->ctrl[r]));
    }
    if (c->proc->ctrl[r] && !e->shutting_down) {
      HORA_CHECK(explain_write_failure(e, c->proc->ctrl[r], hora__ctrl_flush(c->proc->ctrl[r])));
    }
    if (c->proc->ctrl[r] && !e->shutting_down) {
      HORA_CHECK(heartbeat(e, c->proc->ctrl[r]));
    }
  }
  return HORA_SUCCESS;
}

static int service_pollfds(void *arg, struct pollfd *fds, int max) {
  struct hora__engine *e = arg;
  hora__comm *c = e->comm;
  int n = 0;
  for (int r = 0; r < c->size && n < max; r++) {
    if (c->proc->ctrl[r]) {
      fds[n].fd = hora__ctrl_fd(c->proc->ctrl[r]);
      fds[n].events = (short)(POLLIN | (hora__ctrl_has_output(c->proc->ctrl[r]) ? POLLOUT : 0));
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

static uint32_t waited_ms(const struct hora_request *q) {
  uint64_t now = hora__now_ns();
  return now > q->submit_ns ? (uint32_t)HORA_MIN((now - q->submit_ns) / 1000000u, UINT32_MAX) : 0;
}

/* Requests that go to rank 0 in full: rank 0 hands them to its controller,
 * the others send one REQUESTS message. */
static int send_full(struct hora__engine *e, struct hora_request *const *list, size_t n) {
  if (n == 0) {
    return HORA_SUCCESS;
  }
  atomic_fetch_add(&e->rt->stats.sent_in_full, n);
  if (e->ctl) {
    for (size_t i = 0; i < n; i++) {
      struct hora_request *q = list[i];
      struct hora__wire_request w = {.meta = q->meta, .key = q->key, .key_len = q->key_len,
                                     .waited_ms = waited_ms(q), .shape = &q->shape};
      HORA_CHECK(hora__controller_submit(e->ctl, 0, &w));
    }
    return HORA_SUCCESS;
  }
  hora__encode_requests_begin(&e->wbuf);
  for (size_t i = 0; i < n; i++) {
    hora__encode_request_shaped(&e->wbuf, &list[i]->meta, &list[i]->shape, list[i]->key,
                                list[i]->key_len, waited_ms(list[i]));
  }
  hora__encode_requests_end(&e->wbuf, (uint32_t)n);
  if (e->wbuf.failed) {
    return hora__error(HORA_ERR_NO_MEMORY, "out of memory encoding %zu requests", n);
  }
  if (!e->comm->proc->ctrl[0]) {
    /* Rank 0 closed its end after the job's end (hora_finalize racing a
     * submission): these fail as finalized when the coordinator stops. */
    return e->shutdown_seen || e->shutting_down ? HORA_SUCCESS : lost_partner(e, 0);
  }
  return ctrl_send(e, e->comm->proc->ctrl[0], HORA_MSG_REQUESTS, e->wbuf.data, e->wbuf.len);
}

static void wish_evicted(struct hora__engine *e, int32_t slot) {
  e->evict_wish[slot / 8] |= (uint8_t)(1u << (slot % 8));
  e->evict_wanted = true;
}

/* A new request waits on its cache slot when it ran before with the same
 * options (and, while someone has joined, only an allreduce: rank 0 must
 * refuse the rest); otherwise it goes in full, and its key's slot is emptied
 * everywhere, so that the others' same requests go in full too: rank 0 can
 * name a mismatch, and a rank that took its request after a cycle ended
 * the join cannot wait in the cache for one the others sent in full. */
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
  size_t n = 0;
  for (struct hora_request *r = head; r; r = r->next) {
    n++;
  }
  HORA_CHECK(grow_reqs(e, n));
  size_t nfull = 0;
  for (struct hora_request *r = head; r; r = r->next) {
    r->sent_slot = -1;
    r->taken = true;
    e->join_pending |= r->meta.kind == HORA_KIND_JOIN;
    if (r->meta.kind > HORA_KIND_ALLGATHER) {
      e->reqs[nfull++] = r;
      continue;
    }
    int32_t slot = hora__cache_find(&e->cache, r->key, r->key_len);
    bool hit = slot >= 0 && hora__meta_equal(&e->cache.e[slot].meta, &r->meta);
    atomic_fetch_add(hit ? &rt->stats.cache_hits : &rt->stats.cache_misses, 1);
    if (hit && !e->waiting[slot] &&
        (r->meta.kind == HORA_KIND_ALLREDUCE || !e->others_joined)) {
      r->sent_slot = slot;
      e->waiting[slot] = r;
      e->nwaiting++;
      e->new_hits++;
      continue;
    }
    if (slot >= 0) {
      wish_evicted(e, slot);
    }
    e->reqs[nfull++] = r;
  }
  return send_full(e, e->reqs, nfull);
}

/* ---- execution -------------------------------------------------------------- */

/* Our request for a tensor of a response. One still on the submission
 * queue is not ours to run yet: a joined rank's stand-in can meet such a
 * request, and running it would leave the queue pointing at a request the
 * caller may already have freed. */
static struct hora_request *lookup(struct hora__engine *e, const struct hora__resp_tensor *t) {
  pthread_mutex_lock(&e->rt->mu);
  struct hora_request *r = hora__table_get(&e->rt->inflight, t->key, t->key_len);
  pthread_mutex_unlock(&e->rt->mu);
  return r && r->taken ? r : NULL;
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

/* Rank 0 failed an operation: our request fails too, even one still on
 * the submission queue (this rank would only send it to rank 0 to hear the
 * same); that one is unlinked from the queue first, so that nothing holds
 * it once its caller has it back. */
static void fail_by_key(struct hora__engine *e, const struct hora__resp_tensor *t, int status,
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
static void fail_mismatched(struct hora__engine *e, struct hora_request *q, const char *msg) {
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
static void retire_placeholder(struct hora__engine *e, struct hora_request *p) {
  pthread_mutex_lock(&e->rt->mu);
  hora__table_remove(&e->rt->inflight, p->key, p->key_len);
  pthread_mutex_unlock(&e->rt->mu);
  free(p);
}

static int missing_tensor(struct hora__engine *e, const struct hora__response *r,
                          const struct hora__resp_tensor *t) {
  char name[300];
  return hora__error(HORA_ERR_PROTOCOL, "rank 0 scheduled %s %s, which this rank never submitted",
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

/* Whether request q asked for what tensor i of response r runs; if not,
 * says how they differ ("allreduce 'x': rank 1 submitted 10 elements, the
 * response it ran under has 20"), in the order rank 0's mismatch messages
 * use. */
static bool request_matches(const struct hora__response *r, uint32_t i, int rank,
                            const struct hora_request *q, char *msg, size_t size) {
  struct hora__op_meta m;
  const struct hora__op_meta *f = &q->meta;
  hora__response_meta(r, i, &m);
  char name[300], what[360];
  hora__key_display(q->key, q->key_len, name, sizeof(name));
  snprintf(what, sizeof(what), "%s %s: rank %d submitted", hora__kind_name(f->kind), name, rank);
  const char *ran = "the response it ran under";
  bool allreduce = m.kind == HORA_KIND_ALLREDUCE;
  if (f->kind != m.kind) {
    snprintf(msg, size, "%s it, %s is a %s", what, ran, hora__kind_name(m.kind));
  } else if (f->device != m.device) {
    snprintf(msg, size, "%s %s memory, %s is for %s memory", what, f->device ? "GPU" : "host",
             ran, m.device ? "GPU" : "host");
  } else if (f->dtype != m.dtype) {
    snprintf(msg, size, "%s %s, %s has %s", what, hora_dtype_name(f->dtype), ran,
             hora_dtype_name(m.dtype));
  } else if (f->count != m.count) {
    snprintf(msg, size, "%s %llu elements, %s has %llu", what, (unsigned long long)f->count, ran,
             (unsigned long long)m.count);
  } else if (f->shape != m.shape) {
    char shape[400];
    snprintf(msg, size, "%s %s, %s has %s", what, hora__shape_format(&q->shape, shape, sizeof(shape)),
             ran, m.shape ? "another shape" : "none");
  } else if (m.kind == HORA_KIND_BROADCAST && f->root != m.root) {
    snprintf(msg, size, "%s root %d, %s has root %d", what, f->root, ran, m.root);
  } else if (allreduce && f->op != m.op) {
    snprintf(msg, size, "%s %s, %s has %s", what, hora_op_name(f->op), ran, hora_op_name(m.op));
  } else if (allreduce && f->compression != m.compression) {
    snprintf(msg, size, "%s compression %u, %s has %u", what, f->compression, ran, m.compression);
  } else if (allreduce && (f->prescale != m.prescale || f->postscale != m.postscale)) {
    snprintf(msg, size, "%s prescale %g and postscale %g, %s has %g and %g", what, f->prescale,
             f->postscale, ran, m.prescale, m.postscale);
  } else {
    return true;
  }
  return false;
}

/* Looks up the local request of every tensor; a joined rank may lack some.
 * A request that asked for something else than the response runs (a
 * joined rank's other thread submitting a name it stands in for, with its
 * own count) fails with HORA_ERR_MISMATCH, and this rank stands in for it
 * with zeros like a joined rank: sized from its request, the collective
 * would run past the caller's buffers. The others' allreduce goes on. */
static int gather_requests(struct hora__engine *e, const struct hora__response *r, bool *joined) {
  HORA_CHECK(grow_reqs(e, r->ntensors));
  pthread_mutex_lock(&e->rt->mu);
  *joined = e->rt->joined;
  pthread_mutex_unlock(&e->rt->mu);
  for (uint32_t i = 0; i < r->ntensors; i++) {
    struct hora_request *q = lookup(e, &r->tensors[i]);
    char msg[700];
    bool retired = q && q->placeholder;
    if (retired) {
      retire_placeholder(e, q);
      q = NULL;
    }
    if (q && !request_matches(r, i, e->rt->rank, q, msg, sizeof(msg))) {
      bool stand_in = r->kind == HORA_KIND_ALLREDUCE;
      HORA_WARN("%s%s", msg, stand_in ? "; it fails, and this rank adds zeros to the others'" : "");
      fail_mismatched(e, q, msg);
      if (!stand_in) {
        /* Ranks agree on what a broadcast or an allgather moves before it
         * is scheduled, so rank 0 and this rank no longer do. */
        return hora__error(HORA_ERR_PROTOCOL, "rank 0 scheduled a response this rank cannot "
                           "take part in: %s", msg);
      }
      e->reqs[i] = NULL;
      continue;
    }
    e->reqs[i] = q;
    if (!q && !((*joined || retired) && r->kind == HORA_KIND_ALLREDUCE)) {
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
        fail_by_key(e, &r->tensors[i], r->error_code, r->error_msg ? r->error_msg : "");
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
      return hora__error(HORA_ERR_PROTOCOL, "response of unknown kind %u", r->kind);
  }
}

/* Rank 0: sends the ready responses, as one frame, when the fusion policy
 * says so; every rank (rank 0 too) applies it at the end of the cycle
 * that counts it. */
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
    e->shutting_down |= r->kind == HORA_KIND_SHUTDOWN;
  }
  struct hora__response **v = hora__malloc((n ? n : 1) * sizeof(*v));
  int rc = v ? HORA_SUCCESS : HORA_ERR_NO_MEMORY;
  n = 0;
  for (struct hora__response *r = head; r && v; r = r->next) {
    v[n++] = r;
  }
  if (rc == HORA_SUCCESS) {
    rc = hora__encode_responses(&e->wbuf, v, n);
  }
  free(v);
  while (head) {
    struct hora__response *nx = head->next;
    hora__response_free(head);
    head = nx;
  }
  HORA_CHECK(rc);
  HORA_CHECK(queue_frame(e, e->wbuf.data, e->wbuf.len));
  for (int r = 1; r < c->size; r++) {
    if (c->proc->ctrl[r]) {
      HORA_CHECK(ctrl_send(e, c->proc->ctrl[r], HORA_MSG_RESPONSES, e->wbuf.data, e->wbuf.len));
    }
  }
  return HORA_SUCCESS;
}

/* ---- cycles ------------------------------------------------------------------ */

static bool bit_set(const uint8_t *v, uint32_t s) { return (v[s / 8] >> (s % 8)) & 1u; }

/* Our part of the next cycle, against the cache as every rank has it. */
static void contribute(struct hora__engine *e, bool joined) {
  uint32_t used = e->cache.used, nb = (used + 7) / 8;
  uint8_t *ready = e->acc, *submitted = ready + nb, *evict = submitted + nb;
  memset(e->acc, 0, 3 * (size_t)nb);
  for (uint32_t s = 0; s < used; s++) {
    uint8_t b = (uint8_t)(1u << (s % 8));
    if (e->waiting[s]) {
      ready[s / 8] |= b;
      submitted[s / 8] |= b;
    } else if (joined && e->cache.e[s].used && e->cache.e[s].meta.kind == HORA_KIND_ALLREDUCE) {
      ready[s / 8] |= b; /* stands in with zeros */
    }
  }
  if (nb) {
    memcpy(evict, e->evict_wish, nb);
    memset(e->evict_wish, 0, nb);
  }
  e->evict_wanted = false;
  e->cycle_nbytes = nb;
  e->acc_frames = e->ctl ? e->frames_got : 0;
  e->frames_told = e->acc_frames;
  e->acc_flags = joined ? HORA_CYCLE_JOINED : 0;
  e->our_joined_flag = joined;
  hora__timeline_cycle(e->cycles + 1);
  e->new_hits = 0;
  e->cycle_started_ns = hora__now_ns();
  e->stuck_reported = false;
}

static int lost_partner(struct hora__engine *e, int peer) {
  char name[160];
  return hora__error(HORA_ERR_PEER_LOST, "lost %s: its control connection closed",
                     hora__peer_name(e->comm->net, peer, name, sizeof(name)));
}

static int send_step(struct hora__engine *e, int peer, int step) {
  hora__ctrl *c = e->comm->proc->ctrl[peer];
  if (!c) {
    return e->shutdown_seen || e->shutting_down ? HORA_SUCCESS : lost_partner(e, peer);
  }
  bool ask = step == STEP_ASK;
  struct hora__cycle_msg m = {.cycle = e->cycles + 1,
                              .step = (uint8_t)step,
                              .flags = ask ? 0 : e->acc_flags,
                              .frames = ask ? 0 : e->acc_frames,
                              .nbytes = ask ? 0 : e->cycle_nbytes,
                              .vec = e->acc};
  hora__encode_cycle(&e->wbuf, &m);
  if (e->wbuf.failed) {
    return hora__error(HORA_ERR_NO_MEMORY, "out of memory encoding a cycle message");
  }
  return ctrl_send(e, c, HORA_MSG_CYCLE, e->wbuf.data, e->wbuf.len);
}

/* Folds a partner's step into ours (or, for the result, takes it), once
 * it has arrived. */
static int take_step(struct hora__engine *e, int peer, int step, bool *got) {
  struct hora__cycle_inbox *in = inbox_of(e, e->cycles + 1, step);
  *got = in->has;
  if (!in->has) {
    /* Its connection closed with the step not there: it never comes. */
    bool ended = e->shutdown_seen || e->shutting_down; /* it stopped after the job's end */
    return !e->comm->proc->ctrl[peer] && !ended ? lost_partner(e, peer) : HORA_SUCCESS;
  }
  uint32_t nb = e->cycle_nbytes;
  if (in->nbytes != nb) {
    return hora__error(HORA_ERR_PROTOCOL, "rank %d's response cache is out of step with this "
                       "rank's (%u against %u bytes of bits in cycle %llu)", peer, in->nbytes, nb,
                       (unsigned long long)(e->cycles + 1));
  }
  in->has = false;
  if (step == STEP_FOLD_OUT) {
    if (nb) { /* without a cache the vectors are empty (and vec may be NULL) */
      memcpy(e->acc, in->vec, 3 * (size_t)nb);
    }
    e->acc_frames = in->frames;
    e->acc_flags = in->flags;
    return HORA_SUCCESS;
  }
  for (uint32_t i = 0; i < nb; i++) {
    e->acc[i] &= in->vec[i];
    e->acc[nb + i] |= in->vec[nb + i];
    e->acc[2 * nb + i] |= in->vec[2 * nb + i];
  }
  e->acc_frames = HORA_MAX(e->acc_frames, in->frames);
  e->acc_flags |= in->flags;
  return HORA_SUCCESS;
}

/* Starts the next cycle when there is a reason to, and moves the one in
 * progress on as far as the partners' steps that have arrived allow. */
static int cycle_advance(struct hora__engine *e, bool *progressed) {
  const struct hora__cycle_partners *cp = &e->partners;
  if (e->cycle_phase == CYCLE_IDLE) {
    bool joined = e->join_pending, asked = false;
    for (int i = 0; i < INBOX_STEPS && !asked; i++) {
      asked = inbox_of(e, e->cycles + 1, i)->has;
    }
    if (!asked && !e->new_hits && !e->evict_wanted && joined == e->our_joined_flag &&
        !(e->ctl && e->frames_got > e->frames_told)) {
      return HORA_SUCCESS;
    }
    HORA_TRACE("cycle %llu: starting (%s; %llu new cached requests)",
               (unsigned long long)(e->cycles + 1), asked ? "asked" : "our own",
               (unsigned long long)e->new_hits);
    contribute(e, joined);
    *progressed = true;
    e->cycle_round = 0;
    e->round_sent = false;
    e->cycle_phase = cp->folds_out ? CYCLE_RESULT : cp->fold >= 0 ? CYCLE_FOLD_IN : CYCLE_ROUNDS;
    if (cp->folds_out) {
      HORA_CHECK(send_step(e, cp->fold, STEP_FOLD_IN));
    } else if (cp->fold >= 0 && !inbox_of(e, e->cycles + 1, STEP_FOLD_IN)->has) {
      HORA_CHECK(send_step(e, cp->fold, STEP_ASK));
    }
  }
  for (;;) {
    bool got;
    switch (e->cycle_phase) {
      case CYCLE_FOLD_IN:
        HORA_CHECK(take_step(e, cp->fold, STEP_FOLD_IN, &got));
        if (!got) {
          return HORA_SUCCESS;
        }
        e->cycle_phase = CYCLE_ROUNDS;
        *progressed = true;
        break;
      case CYCLE_ROUNDS:
        if (e->cycle_round == cp->nrounds) {
          if (cp->fold >= 0) {
            HORA_CHECK(send_step(e, cp->fold, STEP_FOLD_OUT));
          }
          e->cycle_phase = CYCLE_DONE;
          *progressed = true;
          return HORA_SUCCESS;
        }
        if (!e->round_sent) {
          HORA_CHECK(send_step(e, cp->round[e->cycle_round], 1 + e->cycle_round));
          e->round_sent = true;
          *progressed = true;
        }
        HORA_CHECK(take_step(e, cp->round[e->cycle_round], 1 + e->cycle_round, &got));
        if (!got) {
          return HORA_SUCCESS;
        }
        e->cycle_round++;
        e->round_sent = false;
        *progressed = true;
        break;
      case CYCLE_RESULT:
        HORA_CHECK(take_step(e, cp->fold, STEP_FOLD_OUT, &got));
        if (got) {
          e->cycle_phase = CYCLE_DONE;
          *progressed = true;
        }
        return HORA_SUCCESS;
      default:
        return HORA_SUCCESS;
    }
  }
}

/* Rank 0's timeline rows of a tensor that ran from the cache. */
static void timeline_cached(const struct hora__response *r, int size) {
  if (!hora__timeline_enabled()) {
    return;
  }
  const struct hora__resp_tensor *t = &r->tensors[0];
  hora__timeline_begin(t->key, t->key_len, hora__negotiate_phase(r->kind));
  for (int rank = 0; rank < size; rank++) {
    char mark[32];
    snprintf(mark, sizeof(mark), "rank %d ready", rank);
    hora__timeline_mark(t->key, t->key_len, mark);
  }
  hora__timeline_end(t->key, t->key_len);
  hora__timeline_begin(t->key, t->key_len, HORA_PHASE_QUEUE);
}

/* Our waiting requests whose slot no longer holds them (emptied, or taken
 * by another key), or that may not wait while someone has joined, go to
 * rank 0 in full. */
static int unwait_stale(struct hora__engine *e) {
  size_t n = 0;
  for (uint32_t s = 0; s < e->cache.capacity && e->nwaiting > n; s++) {
    struct hora_request *q = e->waiting[s];
    if (!q) {
      continue;
    }
    const struct hora__cache_entry *ce = hora__cache_entry(&e->cache, (int32_t)s);
    bool ours = ce && ce->key_len == q->key_len && memcmp(ce->key, q->key, q->key_len) == 0;
    bool stale = !ours || !hora__meta_equal(&ce->meta, &q->meta) ||
                 (e->others_joined && q->meta.kind != HORA_KIND_ALLREDUCE);
    if (!stale) {
      n++;
      continue;
    }
    if (ours) {
      wish_evicted(e, (int32_t)s); /* ranks that submit it later must not wait either */
    }
    HORA_CHECK(grow_reqs(e, 1));
    e->waiting[s] = NULL;
    e->nwaiting--;
    q->sent_slot = -1;
    HORA_CHECK(send_full(e, &q, 1));
  }
  return HORA_SUCCESS;
}

/* The end of a cycle, once rank 0's frames it counts have all arrived:
 * the same steps, in the same order, on every rank. */
static int cycle_end(struct hora__engine *e, bool *progressed) {
  if (e->cycle_phase != CYCLE_DONE || e->frames_got < e->acc_frames) {
    return HORA_SUCCESS;
  }
  uint32_t nb = e->cycle_nbytes;
  const uint8_t *ready = e->acc, *submitted = ready + nb, *evict = submitted + nb;
  struct hora__response *head = NULL, **tail = &head;
  int rc = HORA_SUCCESS;
  for (uint32_t s = 0; s < nb * 8 && rc == HORA_SUCCESS; s++) {
    if (!bit_set(ready, s) || !bit_set(submitted, s)) {
      continue;
    }
    const struct hora__cache_entry *ce = hora__cache_entry(&e->cache, (int32_t)s);
    struct hora__response *r = ce ? hora__response_for(&ce->meta, ce->key, ce->key_len) : NULL;
    if (!r) {
      rc = ce ? HORA_ERR_NO_MEMORY
              : hora__error(HORA_ERR_PROTOCOL, "cycle %llu scheduled cache slot %u, which is "
                            "empty here: the ranks' caches are out of step",
                            (unsigned long long)(e->cycles + 1), s);
      break;
    }
    *tail = r;
    tail = &r->next;
    int32_t noted;
    struct hora__op_meta m = ce->meta;
    rc = hora__cache_note(&e->cache, r->tensors[0].key, r->tensors[0].key_len, &m, &noted);
    if (e->waiting[s]) {
      e->waiting[s] = NULL;
      e->nwaiting--;
    }
    timeline_cached(r, e->comm->size);
  }
  if (rc == HORA_SUCCESS) {
    rc = hora__responses_fuse(head, &tail, hora__params.FUSION_THRESHOLD);
  }
  for (uint32_t s = 0; s < nb * 8 && rc == HORA_SUCCESS; s++) {
    if (bit_set(evict, s) && !(bit_set(ready, s) && bit_set(submitted, s))) {
      hora__cache_forget(&e->cache, (int32_t)s);
    }
  }
  while (rc == HORA_SUCCESS && e->frames_applied < e->acc_frames) {
    struct frame *f = e->frames_head;
    e->frames_head = f->next;
    if (!e->frames_head) {
      e->frames_tail = &e->frames_head;
    }
    if (hora__decode_responses(f->data, f->len, &tail, &e->cache) != HORA_SUCCESS) {
      rc = hora__error(HORA_ERR_PROTOCOL, "rank 0 sent a malformed response list: %s",
                       hora__error_message());
    }
    free(f);
    e->frames_applied++;
  }
  bool join_done = false;
  for (struct hora__response *r = head; r; r = r->next) {
    join_done |= r->kind == HORA_KIND_JOIN;
  }
  e->join_pending &= !join_done;
  *e->todo_tail = head; /* queued even on failure, so they are freed */
  if (head) {
    e->todo_tail = tail;
  }
  HORA_CHECK(rc);
  /* An ask that crossed our own start is spent with the cycle. */
  inbox_of(e, e->cycles + 1, STEP_ASK)->has = false;
  e->cycles++;
  HORA_TRACE("cycle %llu: done, frames %llu", (unsigned long long)e->cycles,
             (unsigned long long)e->acc_frames);
  atomic_fetch_add(&e->rt->stats.cycles, 1);
  /* The all-joined response ends every rank's join: from this cycle on no
   * one stands in, on every rank alike. */
  e->others_joined = (e->acc_flags & HORA_CYCLE_JOINED) != 0 && !join_done;
  e->cycle_phase = CYCLE_IDLE;
  *progressed = true;
  return unwait_stale(e);
}

/* Cached requests waiting half the stall time are emptied from the cache
 * everywhere: they go to rank 0 in full, and its stall inspector names the
 * ranks that never submitted them. */
static void scan_waiting(struct hora__engine *e) {
  double check = hora__params.STALL_CHECK_TIME_SECONDS;
  double shut = hora__params.STALL_SHUTDOWN_TIME_SECONDS;
  double limit = check > 0 && (shut <= 0 || check < shut) ? check : shut;
  uint64_t now = hora__now_ns();
  if (limit <= 0 || e->nwaiting == 0) {
    e->next_wait_scan_ns = UINT64_MAX;
    return;
  }
  uint64_t half = (uint64_t)(limit * 0.5e9);
  if (e->next_wait_scan_ns != UINT64_MAX && now < e->next_wait_scan_ns) {
    return;
  }
  for (uint32_t s = 0; s < e->cache.capacity; s++) {
    struct hora_request *q = e->waiting[s];
    if (q && now - q->submit_ns >= half) {
      wish_evicted(e, (int32_t)s);
    }
  }
  e->next_wait_scan_ns = now + HORA_MAX(half / 4, (uint64_t)1000000);
}

/* Half of the shorter of the stall times, or 0 when both are off. */
static uint64_t stall_half_ns(void) {
  double check = hora__params.STALL_CHECK_TIME_SECONDS;
  double shut = hora__params.STALL_SHUTDOWN_TIME_SECONDS;
  double limit = check > 0 && (shut <= 0 || check < shut) ? check : shut;
  return limit > 0 ? (uint64_t)(limit * 0.5e9) : 0;
}

/* A cycle held up that long (a partner stopped answering, alive but stuck)
 * is reported to rank 0, with one of the operations waiting on it: the
 * ranks that never report it are the ones holding it up. */
static int report_stuck(struct hora__engine *e) {
  uint64_t half = stall_half_ns();
  if (!half || e->stuck_reported || e->cycle_phase == CYCLE_IDLE ||
      e->cycle_phase == CYCLE_DONE) {
    return HORA_SUCCESS;
  }
  uint64_t now = hora__now_ns();
  if (now - e->cycle_started_ns < half) {
    return HORA_SUCCESS;
  }
  e->stuck_reported = true;
  const char *key = "";
  size_t klen = 0;
  for (uint32_t s = 0; s < e->cache.capacity && e->nwaiting; s++) {
    if (e->waiting[s]) {
      key = e->waiting[s]->key;
      klen = e->waiting[s]->key_len;
      break;
    }
  }
  uint32_t waited = (uint32_t)HORA_MIN((now - e->cycle_started_ns) / 1000000u, UINT32_MAX);
  if (e->ctl) {
    record_stuck(e, 0, e->cycles + 1, waited, key, klen);
    return HORA_SUCCESS;
  }
  hora__encode_stuck(&e->wbuf, e->cycles + 1, waited, key, klen);
  return e->comm->proc->ctrl[0] ? ctrl_send(e, e->comm->proc->ctrl[0], HORA_MSG_STUCK, e->wbuf.data,
                                      e->wbuf.len)
                          : HORA_SUCCESS;
}

/* Rank 0: the stall inspector for a cycle that some ranks never join. */
static int check_stuck(struct hora__engine *e) {
  int size = e->comm->size;
  bool any = false;
  for (int r = 0; r < size && !any; r++) {
    any = e->stuck_cycle[r] > e->cycles;
  }
  e->next_stuck_ns = UINT64_MAX;
  if (!any) {
    e->stuck_key_len = 0;
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
    there[r] = e->stuck_cycle[r] > e->cycles;
    if (there[r]) {
      oldest = HORA_MIN(oldest, e->stuck_since_ns[r]);
    }
  }
  char missing[256], what[340] = "operations";
  hora__format_ranks(there, size, false, missing, sizeof(missing));
  free(there);
  if (e->stuck_key_len) {
    char name[300];
    hora__key_display(e->stuck_key, e->stuck_key_len, name, sizeof(name));
    snprintf(what, sizeof(what), "operations such as %s", name);
  }
  double check = hora__params.STALL_CHECK_TIME_SECONDS;
  double shut = hora__params.STALL_SHUTDOWN_TIME_SECONDS;
  uint64_t age = now - oldest;
  if (shut > 0 && age >= (uint64_t)(shut * 1e9)) {
    char msg[1024];
    snprintf(msg, sizeof(msg), "%s stalled for %.0f s (HORA_STALL_SHUTDOWN_TIME_SECONDS): their "
             "negotiation cycle waits for rank(s) %s, which stopped answering; shutting down",
             what, (double)age * 1e-9, missing);
    HORA_ERROR("%s", msg);
    return hora__error(HORA_ERR_TIMEOUT, "%s", msg);
  }
  if (check > 0 && age >= (uint64_t)(check * 1e9) && now >= e->next_stuck_warn_ns) {
    HORA_WARN("stall: %s have waited %.0f s (HORA_STALL_CHECK_TIME_SECONDS) in a negotiation "
              "cycle that rank(s) %s never joined", what, (double)age * 1e-9, missing);
    e->next_stuck_warn_ns = now + (uint64_t)(check * 1e9);
  }
  uint64_t due = UINT64_MAX;
  if (check > 0) {
    due = HORA_MAX(oldest + (uint64_t)(check * 1e9), e->next_stuck_warn_ns);
  }
  if (shut > 0) {
    due = HORA_MIN(due, oldest + (uint64_t)(shut * 1e9));
  }
  e->next_stuck_ns = due;
  return HORA_SUCCESS;
}

static int run_todo(struct hora__engine *e, bool *busy) {
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
    if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
      /* Out of descriptors, the connection would stay queued and wake
       * poll() at once, again and again: shed it. */
      len = sizeof(ss);
      if (hora__accept_shed(lfd, &e->comm->proc->reserve_fd, &ss, &len) != 0) {
        return;
      }
      fd = -2;
    }
    if (fd == -1) {
      return;
    }
    char who[64] = "a local process";
    if (ss.ss_family == AF_INET) {
      struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
      char ip[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof(ip));
      snprintf(who, sizeof(who), "%s:%d", ip, ntohs(sin->sin_port));
    }
    if (fd < 0) {
      HORA_WARN("refused a connection from %s: out of file descriptors (EMFILE/ENFILE)", who);
      continue;
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
  if (c->net->spin_us <= 0) {
    return HORA_SUCCESS;
  }
  uint64_t until = hora__now_ns() + (uint64_t)c->net->spin_us * 1000;
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
  fds[n++] = (struct pollfd){.fd = c->proc->tcp_listen_fd, .events = POLLIN};
  fds[n++] = (struct pollfd){.fd = c->proc->unix_listen_fd, .events = POLLIN};
  int nfixed = n;
  n += service_pollfds(e, fds + n, e->npollfds - n);
  hora__timeline_flush();
  int timeout = 1000;
  uint64_t due = HORA_MIN(HORA_MIN(e->next_stall_ns, e->send_at_ns), e->next_wait_scan_ns);
  due = HORA_MIN(due, e->next_stuck_ns);
  /* An idle rank still owes its peers heartbeats. */
  due = HORA_MIN(due, c->net->service_due_ns);
  uint64_t half = stall_half_ns();
  if (half && !e->stuck_reported && e->cycle_phase != CYCLE_IDLE && e->cycle_phase != CYCLE_DONE) {
    due = HORA_MIN(due, e->cycle_started_ns + half);
  }
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
    refuse_connections(e, c->proc->tcp_listen_fd);
  }
  if (fds[2].revents) {
    refuse_connections(e, c->proc->unix_listen_fd);
  }
  (void)nfixed;
  return HORA_SUCCESS;
}

/* ---- the loop ----------------------------------------------------------------- */

static int cycle(struct hora__engine *e) {
  bool busy = false;
  HORA_CHECK(take_submissions(e, &busy));
  HORA_CHECK(hora__service_run(e->comm->net));
  if (e->ctl && hora__controller_has_ready(e->ctl)) {
    HORA_CHECK(distribute(e));
  }
  HORA_CHECK(cycle_advance(e, &busy));
  HORA_CHECK(cycle_end(e, &busy));
  /* The next cycle starts before this one's collectives run, so that the
   * partners can go on negotiating meanwhile. */
  HORA_CHECK(cycle_advance(e, &busy));
  HORA_CHECK(run_todo(e, &busy));
  if (e->stop) {
    return HORA_SUCCESS;
  }
  if (e->ctl) {
    HORA_CHECK(hora__controller_check_stalls(e->ctl, hora__now_ns(),
                                             hora__params.STALL_CHECK_TIME_SECONDS,
                                             hora__params.STALL_SHUTDOWN_TIME_SECONDS,
                                             &e->next_stall_ns));
  }
  scan_waiting(e);
  HORA_CHECK(report_stuck(e));
  if (e->ctl && e->next_stuck_ns <= hora__now_ns()) {
    HORA_CHECK(check_stuck(e));
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
        if (!c->proc->ctrl[r]) {
          continue;
        }
        if (fds[i].revents) {
          int rc2 = read_ctrl(e, c->proc->ctrl[r]);
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
    if (!c->proc->ctrl[r] || (r == 0 && from_root)) {
      continue;
    }
    (void)hora__ctrl_send_blocking(c->proc->ctrl[r], HORA_MSG_ABORT, e->wbuf.data, e->wbuf.len, 1.0);
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
      if (victims[i]->placeholder) {
        hora__table_remove(&rt->inflight, victims[i]->key, victims[i]->key_len);
        free(victims[i]);
      } else {
        hora__request_complete_locked(rt, victims[i], code, msg);
      }
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
      if (c->proc->ctrl[r] && hora__ctrl_has_output(c->proc->ctrl[r])) {
        if (hora__ctrl_flush(c->proc->ctrl[r]) != HORA_SUCCESS) {
          hora__ctrl_free(c->proc->ctrl[r]);
          c->proc->ctrl[r] = NULL;
          continue;
        }
        if (hora__ctrl_has_output(c->proc->ctrl[r])) {
          fds[n++] = (struct pollfd){.fd = hora__ctrl_fd(c->proc->ctrl[r]), .events = POLLOUT};
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

static bool gpu_eager(void) { return strcmp(hora__params.GPU_INIT, "eager") == 0; }

/* HORA_GPU_INIT=eager: the device data plane is set up in hora_init, on
 * every rank together. The ranks first agree that each can (a build with
 * CUDA, a GPU it sees), so that none waits in the set-up for one that
 * cannot. */
static int gpu_setup_eager(struct hora__engine *e) {
  hora__comm *c = e->comm;
  uint8_t mine = !HORA_HAVE_CUDA ? 0 : hora__gpu_present() ? 2 : 1;
  uint8_t *all = hora__calloc((size_t)c->size, 1);
  if (!all) {
    return HORA_ERR_NO_MEMORY;
  }
  int rc = hora__allgather(c, &mine, 1, all);
  char lacking[256] = "";
  size_t used = 0;
  for (int r = 0; rc == HORA_SUCCESS && r < c->size; r++) {
    if (all[r] != 2 && used < sizeof(lacking)) {
      used += (size_t)snprintf(lacking + used, sizeof(lacking) - used, "%s%d", used ? ", " : "", r);
    }
  }
  free(all);
  HORA_CHECK(rc);
  if (mine == 0) {
    return hora__error(HORA_ERR_NOT_SUPPORTED, "HORA_GPU_INIT=eager, but this build of hora has no "
                       "CUDA (configure --with-cuda)");
  }
  if (mine == 1) {
    return hora__error(HORA_ERR_NOT_SUPPORTED, "HORA_GPU_INIT=eager, but this process sees no GPU");
  }
  if (lacking[0]) {
    return hora__error(HORA_ERR_NOT_SUPPORTED,
                       "HORA_GPU_INIT=eager, but rank(s) %s cannot use a GPU (none visible there, "
                       "or a build without CUDA)",
                       lacking);
  }
  return hora__gpu_setup(c, &e->gpu);
}

static void *coordinator_main(void *arg) {
  struct hora__runtime *rt = arg;
  struct hora__engine *e = rt->engine;
  pthread_setname_np(pthread_self(), "hora-coord");
  e->comm->net->service = service;
  e->comm->net->service_pollfds = service_pollfds;
  e->comm->net->service_arg = e;
  /* Often enough for heartbeats at a quarter of the peer timeout, and for
   * an abort to stop a collective well within a second. */
  uint64_t peer_ns = (uint64_t)(hora__params.PEER_TIMEOUT_SECONDS * 1e9);
  e->comm->net->service_interval_ns = peer_ns > 0 ? HORA_MIN(peer_ns / 8, 100000000ull) : 100000000ull;
  e->comm->net->service_due_ns = hora__now_ns() + e->comm->net->service_interval_ns;
  int rc = HORA_SUCCESS;
  if (gpu_eager()) {
    /* hora_init waits for this; on failure the fatal path below ends the
     * coordinator, and hora_init fails with the error. */
    rc = gpu_setup_eager(e);
    if (rc != HORA_SUCCESS) {
      hora__runtime_set_fatal(rt, rc, hora__error_message());
    }
    pthread_mutex_lock(&rt->mu);
    e->setup_done = true;
    pthread_cond_broadcast(&rt->done_cv);
    pthread_mutex_unlock(&rt->mu);
  }
  while (!e->stop && rc == HORA_SUCCESS) {
    rc = cycle(e);
  }
  if (rc != HORA_SUCCESS) {
    /* A broken data connection, or a peer's buffer gone from under a kernel
     * copy (the peer left the collective), is usually explained by what
     * that peer sent on its control connection: an abort, say. */
    const char *why = hora__error_message();
    if ((rc == HORA_ERR_PEER_LOST && strstr(why, "data connection")) ||
        (rc == HORA_ERR_SYSTEM && strstr(why, "process_vm_"))) {
      rc = attribute_failure(e, rc);
    }
    /* The first fatal error wins: hora_abort may have recorded one already. */
    hora__runtime_set_fatal(rt, rc, hora__error_message());
    int code = atomic_load(&rt->fatal_code);
    HORA_ERROR("fatal: %s (%s)", rt->fatal_msg, hora_strerror(code));
    broadcast_fatal(e, code, rt->fatal_msg, e->abort_from_root);
  }
  fail_everything(e);
  if (rc != HORA_SUCCESS) {
    /* NCCL kernels waiting for a lost peer end now, not at hora_finalize;
     * after the requests have failed, since aborting may wait for the
     * device. */
    hora__gpu_abort(e->gpu);
  }
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
  size_t bitmap = ((size_t)e->cache.capacity + 7) / 8;
  e->frames_tail = &e->frames_head;
  e->next_wait_scan_ns = UINT64_MAX;
  e->cycle_phase = CYCLE_IDLE;
  hora__cycle_partners(rt->rank, rt->size, &e->partners);
  e->waiting = hora__calloc((size_t)e->cache.capacity + 1, sizeof(*e->waiting));
  e->evict_wish = hora__calloc(bitmap + 1, 1);
  e->acc = hora__calloc(3 * bitmap + 1, 1);
  e->inbox = hora__calloc(2 * INBOX_STEPS, sizeof(*e->inbox));
  e->stuck_cycle = hora__calloc((size_t)rt->size, sizeof(uint64_t));
  e->stuck_since_ns = hora__calloc((size_t)rt->size, sizeof(uint64_t));
  e->next_stuck_ns = UINT64_MAX;
  if (!e->waiting || !e->evict_wish || !e->acc || !e->inbox || !e->stuck_cycle ||
      !e->stuck_since_ns) {
    engine_free(e);
    return HORA_ERR_NO_MEMORY;
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
  if (gpu_eager()) {
    pthread_mutex_lock(&rt->mu);
    while (!e->setup_done) {
      pthread_cond_wait(&rt->done_cv, &rt->mu);
    }
    pthread_mutex_unlock(&rt->mu);
    int code = atomic_load_explicit(&rt->fatal_code, memory_order_acquire);
    if (code != HORA_SUCCESS) {
      return hora__error(code, "%s", rt->fatal_msg);
    }
  }
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
