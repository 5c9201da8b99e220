/* The coordinator's control connections: the frames that come in (aborts,
 * requests for rank 0, response frames, cycle steps, stuck reports), the
 * writes and their failures, heartbeats both ways, the transport's service
 * hooks, refused connections, and rank 0 sending the responses. */
#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/gpu/gpu.h"
#include "comm/transport/socket.h"
#include "base/log.h"
#include "base/params.h"
#include "comm/shm/shm.h"
#include "runtime/engine/engine.h"
#include "runtime/negotiate/fusion.h"

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
  struct hora__set *set;
  int rank;
};

static int submit_cb(void *arg, const struct hora__wire_request *req) {
  struct submit_ctx *s = arg;
  return hora__controller_submit(s->set->ctl, s->rank, req);
}

/* A partner's step of a cycle: checked, and kept in the inbox until the
 * cycle uses it. */
static int on_cycle_frame(struct hora__set *set, int from, const uint8_t *p, size_t n) {
  uint32_t max_nbytes = (set->cache.capacity + 7) / 8;
  return hora__cycle_accept(set->inbox, &set->partners, set->cycles, max_nbytes, from, p, n);
}

static int queue_frame(struct hora__set *set, const uint8_t *p, size_t n) {
  struct frame *f = hora__malloc(sizeof(*f) + n);
  if (!f) {
    return HORA_ERR_NO_MEMORY;
  }
  f->next = NULL;
  f->len = n;
  memcpy(f->data, p, n);
  *set->frames_tail = f;
  set->frames_tail = &f->next;
  set->frames_got++;
  return HORA_SUCCESS;
}

/* Worker: a frame of responses from rank 0, kept until a cycle orders it.
 * Checked now (a malformed frame fails at once), and looked into for the
 * end of the job, after which peers may close their connections. */
static int on_responses_frame(struct hora__set *set, const uint8_t *p, size_t n) {
  struct hora__response *peek = NULL, **tail = &peek;
  if (hora__decode_responses(p, n, &tail, NULL) != HORA_SUCCESS) {
    return hora__error(HORA_ERR_PROTOCOL, "rank 0 sent a malformed response list: %s",
                       hora__error_message());
  }
  while (peek) {
    struct hora__response *nx = peek->next;
    set->shutdown_seen |= peek->kind == HORA_KIND_SHUTDOWN;
    hora__response_free(peek);
    peek = nx;
  }
  return queue_frame(set, p, n);
}

/* After the job's end, or from a partner that is no longer needed (its
 * cycles are done; rank 0, which also hears it, reports a real loss), a
 * closed connection is not an error by itself; a cycle that still needs
 * the partner fails then. */
static bool may_close(const struct hora__engine *e, int peer) {
  bool partner_only = e->rt->rank != 0 && peer != 0;
  return e->shutting_down || e->world->shutdown_seen || partner_only;
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
  if (type == HORA_MSG_REQUESTS && e->world->ctl) {
    struct submit_ctx s = {e->world, peer};
    struct hora__request_sink sink = {submit_cb, &s};
    if (hora__decode_requests(p, n, &sink) != HORA_SUCCESS) {
      return hora__error(HORA_ERR_PROTOCOL, "%s sent a malformed request list: %s",
                         hora__peer_name(&e->proc->net, peer, name, sizeof(name)),
                         hora__error_message());
    }
  } else if (type == HORA_MSG_RESPONSES && !e->world->ctl && peer == 0) {
    HORA_CHECK(on_responses_frame(e->world, p, n));
  } else if (type == HORA_MSG_CYCLE) {
    HORA_CHECK(on_cycle_frame(e->world, peer, p, n));
  } else if (type == HORA_MSG_STUCK && e->world->ctl) {
    uint64_t cyc;
    uint32_t waited;
    const char *key;
    size_t klen;
    if (hora__decode_stuck(p, n, &cyc, &waited, &key, &klen) != HORA_SUCCESS) {
      return hora__error(HORA_ERR_PROTOCOL, "%s sent a malformed stuck-cycle message",
                         hora__peer_name(&e->proc->net, peer, name, sizeof(name)));
    }
    hora__engine_record_stuck(e->world, peer, cyc, waited, key, klen);
  } else if (type != HORA_MSG_HEARTBEAT) { /* a heartbeat's arriving was the point */
    return hora__error(HORA_ERR_PROTOCOL, "%s sent an unexpected control message (type %u)",
                       hora__peer_name(&e->proc->net, peer, name, sizeof(name)), type);
  }
  return HORA_SUCCESS;
}

/* Rounds of reading and parsing one connection per call: the connection
 * holds at most one frame and one read beyond it, and a peer that keeps
 * sending cannot keep the coordinator here (poll brings it back). */
#define READ_ROUNDS 64

/* Reads and handles the complete frames on one control connection. */
int hora__engine_read_ctrl(struct hora__engine *e, hora__ctrl *c) {
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
    /* (A socket the read emptied waits for poll to say it has more.) */
    if (rc != HORA_SUCCESS || frames == 0 || hora__ctrl_drained(c)) {
      break;
    }
  }
  if (rc == HORA_ERR_PEER_LOST) {
    HORA_DEBUG("control: connection to rank %d closed", peer);
    if (may_close(e, peer)) {
      hora__ctrl_free(c);
      e->proc->ctrl[peer] = NULL;
      return HORA_SUCCESS;
    }
    return hora__error(HORA_ERR_PEER_LOST, "lost %s: its control connection closed",
                       hora__peer_name(&e->proc->net, peer, name, sizeof(name)));
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
  int why = hora__engine_read_ctrl(e, c);
  /* An abort frame explains the broken connection, whatever its code, and
   * an EOF names the lost peer's host and pid, which the errno does not. */
  if (why != HORA_SUCCESS) {
    return why;
  }
  /* The peer went away after the job's end, or was a partner no longer
   * needed: the write did not matter. hora__engine_read_ctrl may have
   * closed (and freed) the connection already; it sees the EOF only after
   * the last frames. */
  if (!e->proc->ctrl[peer]) {
    return HORA_SUCCESS;
  }
  if (may_close(e, peer)) {
    HORA_DEBUG("control: connection to rank %d closed", peer);
    hora__ctrl_free(c);
    e->proc->ctrl[peer] = NULL;
    return HORA_SUCCESS;
  }
  /* Nothing left to read says more (what the peer sent before dying was
   * still queued): name it as lost, with its host and pid, all the same. */
  char name[160];
  hora__peer_name(&e->proc->net, peer, name, sizeof(name));
  return hora__error(rc, "lost %s: %s", name, original);
}

int hora__engine_ctrl_send(struct hora__engine *e, hora__ctrl *c, uint16_t type, const void *p,
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
    HORA_CHECK(hora__engine_ctrl_send(e, c, HORA_MSG_HEARTBEAT, NULL, 0));
    if (!e->proc->ctrl[peer]) {
      return HORA_SUCCESS; /* closed (and freed) after the job's end */
    }
  }
  if (now - hora__ctrl_last_in(c) >= limit) {
    char name[160];
    return hora__error(HORA_ERR_PEER_LOST,
                       "lost %s: nothing heard from it for %.1f s (HORA_PEER_TIMEOUT_SECONDS)",
                       hora__peer_name(&e->proc->net, hora__ctrl_peer(c), name, sizeof(name)),
                       (double)(now - hora__ctrl_last_in(c)) * 1e-9);
  }
  return HORA_SUCCESS;
}

/* A cycle step from a local partner's mailbox: as if it came on the socket. */
static int on_mail(void *arg, int from_local, const uint8_t *p, size_t n) {
  struct hora__engine *e = arg;
  return on_ctrl_frame(e, hora__shm_rank_of(e->proc->shm, from_local), HORA_MSG_CYCLE, p, n);
}

int hora__engine_service(void *arg) {
  struct hora__engine *e = arg;
  hora__comm *c = e->world->comm;
  /* hora_abort while a collective waits on a peer: give up now, so the
   * engine tells the job instead of finishing (or hanging in) it first. */
  if (!e->shutting_down && hora__runtime_fatal(e->rt) != HORA_SUCCESS) {
    return atomic_load_explicit(&e->rt->fatal_code, memory_order_acquire);
  }
  /* Stream-ordered device requests complete once queued: NCCL's errors
   * are watched here, idle or not, so their waits end. */
  HORA_CHECK(hora__gpu_check(e->world->comm->gpu));
  struct hora__shm *shm = e->proc->shm;
  for (int lr = 0; shm && lr < hora__shm_local_size(shm); lr++) {
    HORA_CHECK(hora__shm_mail_read(shm, lr, on_mail, e));
  }
  bool sweep = false;
  if (!e->ctrl_fresh) {
    struct pollfd *fds = e->service_pollfds;
    int n = hora__engine_service_pollfds(e, fds, e->npollfds);
    for (int i = 0; i < n; i++) {
      fds[i].events = POLLIN; /* (not POLLOUT: the flush below writes what it can) */
    }
    int pr = poll(fds, (nfds_t)n, 0);
    if (pr < 0 && errno != EINTR) {
      return hora__error_errno(HORA_ERR_SYSTEM, "poll");
    }
    if (pr < 0) {
      sweep = true;
    } else {
      hora__engine_service_ready(e, fds, n);
    }
  }
  sweep |= !e->ctrl_fresh; /* (the connections changed since their poll) */
  e->ctrl_fresh = false;
  for (int r = 0; r < c->size; r++) {
    bool ready = r >= e->nctrl_ready || e->ctrl_ready[r];
    if (c->proc->ctrl[r] && (ready || sweep)) {
      if (r < e->nctrl_ready) {
        e->ctrl_ready[r] = 0;
      }
      HORA_CHECK(hora__engine_read_ctrl(e, c->proc->ctrl[r]));
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

void hora__engine_service_ready(void *arg, const struct pollfd *fds, int n) {
  struct hora__engine *e = arg;
  hora__comm *c = e->world->comm;
  int i = 0;
  for (int r = 0; r < c->size; r++) {
    if (!c->proc->ctrl[r]) {
      continue;
    }
    if (i == n || fds[i].fd != hora__ctrl_fd(c->proc->ctrl[r])) {
      /* A connection came or went since the poll, or the poll had no room
       * for all: read them all. */
      e->ctrl_fresh = false;
      return;
    }
    if (fds[i].revents && r < e->nctrl_ready) {
      e->ctrl_ready[r] = 1;
    }
    i++;
  }
  e->ctrl_fresh = true;
}

int hora__engine_service_pollfds(void *arg, struct pollfd *fds, int max) {
  struct hora__engine *e = arg;
  hora__comm *c = e->world->comm;
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

#define REFUSALS_LOG_NS (10 * 1000000000ull)

void hora__engine_refuse_connections(struct hora__engine *e, int lfd) {
  for (;;) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int fd = accept4(lfd, (struct sockaddr *)&ss, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
      /* Out of descriptors, the connection would stay queued and wake
       * poll() at once, again and again: shed it. */
      len = sizeof(ss);
      if (hora__accept_shed(lfd, &e->proc->reserve_fd, &ss, &len) != 0) {
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
    snprintf(e->refusals.last, sizeof(e->refusals.last), "%s: %s", who,
             fd < 0 ? "out of file descriptors (EMFILE/ENFILE)"
                    : "every connection of this job is already made");
    e->refusals.total++;
    e->refusals.unlogged++;
    if (fd >= 0) {
      close(fd);
    }
  }
}

void hora__engine_log_refusals(struct hora__engine *e, bool flush) {
  uint64_t now = hora__now_ns();
  if (!e->refusals.unlogged || (!flush && now < e->refusals.next_log_ns)) {
    return;
  }
  char line[300];
  if (e->refusals.total == e->refusals.unlogged) { /* the first line */
    snprintf(line, sizeof(line), "refused %llu connection%s from strangers (the last from %s); "
             "more are counted, in a line at most every %llu s",
             (unsigned long long)e->refusals.unlogged, e->refusals.unlogged == 1 ? "" : "s",
             e->refusals.last, REFUSALS_LOG_NS / 1000000000ull);
  } else {
    snprintf(line, sizeof(line), "refused %llu more connection%s (%llu in all; the last from %s)",
             (unsigned long long)e->refusals.unlogged, e->refusals.unlogged == 1 ? "" : "s",
             (unsigned long long)e->refusals.total, e->refusals.last);
  }
  e->refusals.unlogged = 0;
  e->refusals.next_log_ns = now + REFUSALS_LOG_NS;
  pthread_mutex_unlock(&e->rt->progress_mu);
  HORA_WARN("%s", line);
  pthread_mutex_lock(&e->rt->progress_mu);
}

/* Rank 0: sends the ready responses, as one frame, when the fusion policy
 * (negotiate/fusion.c) says so; every rank (rank 0 too) applies it at the end of the cycle
 * that counts it. */
int hora__engine_distribute(struct hora__set *set) {
  hora__comm *c = set->comm;
  uint64_t wake;
  set->send_at_ns = UINT64_MAX;
  if (!hora__controller_should_send(set->ctl, hora__now_ns(),
                                    (uint64_t)(hora__params.CYCLE_TIME * 1e6),
                                    (uint64_t)hora__params.FUSION_THRESHOLD, &wake)) {
    set->send_at_ns = wake;
    return HORA_SUCCESS;
  }
  struct hora__response *head = NULL, **tail = &head;
  HORA_CHECK(hora__controller_take(set->ctl, &tail, hora__params.FUSION_THRESHOLD));
  uint32_t n = 0;
  for (struct hora__response *r = head; r; r = r->next) {
    n++;
    set->e->shutting_down |= r->kind == HORA_KIND_SHUTDOWN;
  }
  struct hora__response **v = hora__malloc((n ? n : 1) * sizeof(*v));
  int rc = v ? HORA_SUCCESS : HORA_ERR_NO_MEMORY;
  n = 0;
  for (struct hora__response *r = head; r && v; r = r->next) {
    v[n++] = r;
  }
  if (rc == HORA_SUCCESS) {
    rc = hora__encode_responses(&set->e->wbuf, v, n);
  }
  free(v);
  while (head) {
    struct hora__response *nx = head->next;
    hora__response_free(head);
    head = nx;
  }
  HORA_CHECK(rc);
  HORA_CHECK(queue_frame(set, set->e->wbuf.data, set->e->wbuf.len));
  for (int r = 1; r < c->size; r++) {
    if (c->proc->ctrl[r]) {
      HORA_CHECK(hora__engine_ctrl_send(set->e, c->proc->ctrl[r], HORA_MSG_RESPONSES, set->e->wbuf.data,
                                        set->e->wbuf.len));
    }
  }
  return HORA_SUCCESS;
}
