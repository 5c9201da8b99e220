/* The bootstrap's connections: the plan (the control star, the data ring,
 * the cross-host ring, the engine's control peers), the outgoing side of
 * each socket (dial, handshake, retry), and the loop that moves them all at
 * once until each is handed to its transport. The incoming side is
 * accept.c; what both use is in bootstrap.h. */
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/transport/socket.h"

/* The data-plane Unix sockets' send and receive buffers. */
#define UNIX_SOCKET_BUFFER ((int64_t)4 << 20)

static bool same_host(const hora__comm *c, int peer) {
  return c->net->peers[peer].host_index == c->net->peers[c->rank].host_index;
}

int hora__boot_add_sock(struct plan *p, struct pending s) {
  if (p->nsocks == p->cap) {
    int cap = p->cap ? 2 * p->cap : 16;
    struct pending *n = hora__realloc(p->socks, (size_t)cap * sizeof(*n));
    if (!n) {
      return HORA_ERR_NO_MEMORY;
    }
    p->socks = n;
    p->cap = cap;
  }
  p->socks[p->nsocks++] = s;
  return HORA_SUCCESS;
}

size_t hora__boot_slot_of(int peer, int kind) {
  return (size_t)peer * HORA_CONN_SLOTS + (size_t)(kind - 1);
}

const char *hora__boot_kind_name(int kind) {
  int k = (kind - 1) % HORA_CONN_KINDS + 1;
  return k == HORA_CONN_CTRL ? "control" : k == HORA_CONN_DATA ? "data" : "cross-host data";
}

/* ---- outgoing ---- */

/* The connection was closed or refused before the acknowledgement, as a
 * peer does with strangers beyond its bound: connect again, after a
 * back-off that grows and is jittered so that ranks do not come back in
 * lockstep. */
static void retry_later(struct plan *p, struct pending *s, const char *why) {
  char name[160];
  if (s->fd >= 0) {
    close(s->fd);
    s->fd = -1;
  }
  s->connecting = false;
  hora__strlcpy(s->last_error, why, sizeof(s->last_error));
  uint64_t wait = RETRY_MIN_NS << HORA_MIN(s->attempts, 5);
  wait = HORA_MIN(wait, RETRY_MAX_NS);
  p->rng ^= p->rng << 13;
  p->rng ^= p->rng >> 7;
  p->rng ^= p->rng << 17;
  wait = wait / 2 + p->rng % (wait + 1);
  s->attempts++;
  s->retry_at = hora__now_ns() + wait;
  HORA_DEBUG("bootstrap: %s connection to %s: %s; connecting again in %llu ms",
             hora__boot_kind_name(s->kind), hora__peer_name(p->c->net, s->peer, name, sizeof(name)),
             why, (unsigned long long)(wait / 1000000));
}

static int connect_failed(struct plan *p, struct pending *s, int err) {
  char name[160];
  hora__peer_name(p->c->net, s->peer, name, sizeof(name));
  if (err == ECONNREFUSED || err == ENOENT) {
    /* Every rank listens before any connects (the listening step agrees
     * on it), so nothing listening means the peer is gone. Unless refusals
     * last a while, though: a TCP listener whose queue a flood has filled
     * refuses too where net.ipv4.tcp_abort_on_overflow is set. */
    uint64_t now = hora__now_ns();
    if (!s->refused_since) {
      s->refused_since = now;
    }
    if (now - s->refused_since < REFUSED_FOR_NS) {
      retry_later(p, s, strerror(err));
      return HORA_SUCCESS;
    }
    close(s->fd);
    s->fd = -1;
    errno = err;
    return hora__error_errno(HORA_ERR_PEER_LOST,
                             "connect to %s (its listener is closed: it died or gave up)", name);
  }
  close(s->fd);
  s->fd = -1;
  errno = err;
  return hora__error_errno(HORA_ERR_PEER_LOST, "connect to %s", name);
}

static int start_connect(struct plan *p, struct pending *s) {
  hora__comm *c = p->c;
  struct sockaddr_storage ss;
  socklen_t len;
  int fd;
  if (s->unix_socket) {
    unsigned ulen;
    hora__unix_address(c->proc->secret, c->proc->job_id, s->peer, &ss, &ulen);
    len = (socklen_t)ulen;
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  } else {
    struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
    memset(sin, 0, sizeof(*sin));
    sin->sin_family = AF_INET;
    sin->sin_addr.s_addr = c->net->peers[s->peer].ipv4;
    sin->sin_port = c->net->peers[s->peer].port;
    len = sizeof(*sin);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  }
  if (fd < 0) {
    int err = errno;
    if (err == EMFILE || err == ENFILE) {
      /* A stranger's descriptor is worth less than a peer's. */
      hora__boot_drop_oldest(p, "dropped to free a file descriptor (EMFILE/ENFILE)");
      retry_later(p, s, strerror(err));
      return HORA_SUCCESS;
    }
    errno = err;
    return hora__error_errno(HORA_ERR_SYSTEM, "socket");
  }
  s->fd = fd;
  s->connecting = true;
  if (connect(fd, (struct sockaddr *)&ss, len) < 0 && errno != EINPROGRESS) {
    if (errno == EAGAIN) {
      /* A Unix listener's queue is full: its rank is busy accepting. */
      retry_later(p, s, "the listener's queue is full");
      return HORA_SUCCESS;
    }
    return connect_failed(p, s, errno);
  }
  uint8_t nonce[HORA_HS_NONCE_LEN];
  HORA_CHECK(hora__boot_random_bytes(nonce, sizeof(nonce), "handshake nonce"));
  hora__hs_connector(&s->hs, c->proc->secret, c->size, HORA_CONN_SLOTS, c->rank, s->peer, s->kind,
                     nonce);
  return HORA_SUCCESS;
}

static int step_outgoing(struct plan *p, struct pending *s) {
  char name[160], why[200];
  if (s->connecting) {
    int err = 0;
    socklen_t l = sizeof(err);
    if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0) {
      err = errno;
    }
    if (err == EINPROGRESS || err == EALREADY) {
      return HORA_SUCCESS;
    }
    if (err != 0) {
      return connect_failed(p, s, err);
    }
    s->connecting = false;
    s->refused_since = 0;
  }
  for (;;) {
    int err = 0, r = hora__boot_pump(s->fd, &s->hs, &err);
    if (r < 0) {
      snprintf(why, sizeof(why), "%s during the handshake",
               err ? strerror(err) : "closed by the peer");
      retry_later(p, s, why);
      return HORA_SUCCESS;
    }
    if (s->hs.state == HORA_HS_FAILED) {
      /* Whoever answered at the peer's address does not know the secret. */
      HORA_WARN("bootstrap: %s connection to %s: the other end %s", hora__boot_kind_name(s->kind),
                hora__peer_name(p->c->net, s->peer, name, sizeof(name)), s->hs.why);
      retry_later(p, s, s->hs.why);
      return HORA_SUCCESS;
    }
    if (s->hs.state == HORA_HS_DONE) {
      s->done = true;
      return HORA_SUCCESS;
    }
    if (r == 0) {
      return HORA_SUCCESS;
    }
  }
}

static int by_peer_and_kind(const void *a, const void *b) {
  const struct pending *x = a, *y = b;
  if (x->peer != y->peer) {
    return x->peer < y->peer ? -1 : 1;
  }
  return x->kind < y->kind ? -1 : x->kind > y->kind;
}

/* Whether connections to peer of this kind use the RDMA transport. */
static bool uses_ib(const hora__comm *c, int peer, int kind) {
  /* rdma is set only where every host has an RDMA port (ib_remote). */
  return kind != HORA_CONN_CTRL && c->proc->rdma && (c->proc->ib_all || !same_host(c, peer));
}

/* One socket to peer; kind is the wire kind (with the socket index). */
static int plan_socket(struct plan *p, int peer, int kind, bool use_unix) {
  hora__comm *c = p->c;
  /* A ring of two has the same neighbour on both sides: one connection. */
  for (int i = 0; i < p->nsocks; i++) {
    if (p->socks[i].outgoing && p->socks[i].peer == peer && p->socks[i].kind == kind) {
      return HORA_SUCCESS;
    }
  }
  if (c->rank > peer) {
    struct pending s = {.fd = -1, .outgoing = true, .unix_socket = use_unix, .peer = peer,
                        .kind = kind, .pfd = -1};
    HORA_CHECK(hora__boot_add_sock(p, s));
    return start_connect(p, &p->socks[p->nsocks - 1]);
  }
  size_t slot = hora__boot_slot_of(peer, kind);
  if (!p->want_in[slot]) {
    p->want_in[slot] = 1;
    p->expected_in++;
  }
  return HORA_SUCCESS;
}

/* The sockets of one connection: several for TCP data between hosts
 * (HORA_SOCKETS_PER_PEER), else one. */
static int plan_connection(struct plan *p, int peer, int kind) {
  hora__comm *c = p->c;
  bool use_unix = same_host(c, peer) &&
                  !(kind == HORA_CONN_DATA && strcmp(hora__params.TRANSPORT, "tcp") == 0);
  int n = kind != HORA_CONN_CTRL && !use_unix && !uses_ib(c, peer, kind) ? c->proc->tcp_streams : 1;
  for (int i = 0; i < n; i++) {
    HORA_CHECK(plan_socket(p, peer, kind + HORA_CONN_KINDS * i, use_unix));
  }
  return HORA_SUCCESS;
}

/* Runs the transports' own set-up of the data connections, all at once,
 * until every one is usable or the deadline passes. */
static int establish_all(hora__comm *c, hora__conn **conns, int n, uint64_t deadline) {
  struct pollfd *fds = hora__calloc((size_t)n + 1, sizeof(*fds));
  if (!fds) {
    return HORA_ERR_NO_MEMORY;
  }
  int rc = HORA_SUCCESS;
  for (;;) {
    int waiting = 0;
    for (int i = 0; i < n; i++) {
      bool ready;
      int fd;
      short events;
      rc = conns[i]->tp->establish(c->net, conns[i], &ready, &fd, &events);
      if (rc != HORA_SUCCESS) {
        goto out;
      }
      if (!ready) {
        conns[waiting] = conns[i];
        fds[waiting++] = (struct pollfd){.fd = fd, .events = events};
      }
    }
    n = waiting;
    if (n == 0) {
      break;
    }
    uint64_t now = hora__now_ns();
    if (now >= deadline) {
      char missing[512] = "";
      size_t m = 0;
      for (int i = 0; i < n && m + 32 < sizeof(missing); i++) {
        m += (size_t)snprintf(missing + m, sizeof(missing) - m, " %d", conns[i]->peer);
      }
      rc = hora__error(HORA_ERR_PEER_LOST,
                       "bootstrap: timed out after %gs (HORA_CONNECT_TIMEOUT_SECONDS) setting up "
                       "%s connections to ranks:%s",
                       hora__params.CONNECT_TIMEOUT_SECONDS, conns[0]->tp->name, missing);
      goto out;
    }
    int wait_ms = (int)HORA_MIN((deadline - now) / 1000000 + 1, (uint64_t)100);
    if (poll(fds, (nfds_t)n, wait_ms) < 0 && errno != EINTR) {
      rc = hora__error_errno(HORA_ERR_SYSTEM, "poll");
      goto out;
    }
  }
out:
  free(fds);
  return rc;
}

/* The message when HORA_CONNECT_TIMEOUT_SECONDS passed: the ranks still
 * missing, and why the last try to reach one failed. */
static int timed_out(struct plan *p) {
  hora__comm *c = p->c;
  char missing[512] = "", last[300] = "";
  size_t m = 0;
  for (int i = 0; i < p->nsocks && m + 32 < sizeof(missing); i++) {
    struct pending *s = &p->socks[i];
    if (s->outgoing && !s->done) {
      m += (size_t)snprintf(missing + m, sizeof(missing) - m, " %d", s->peer);
      if (!last[0] && s->last_error[0]) {
        snprintf(last, sizeof(last), " (to rank %d, the last try: %s)", s->peer, s->last_error);
      }
    }
  }
  for (int r = 0; r < c->size * HORA_CONN_SLOTS && m + 32 < sizeof(missing); r++) {
    if (p->want_in[r]) {
      m += (size_t)snprintf(missing + m, sizeof(missing) - m, " %d", r / HORA_CONN_SLOTS);
    }
  }
  return hora__error(HORA_ERR_PEER_LOST,
                     "bootstrap: timed out after %gs (HORA_CONNECT_TIMEOUT_SECONDS) connecting "
                     "to ranks:%s%s",
                     hora__params.CONNECT_TIMEOUT_SECONDS, missing, last);
}

static int plan_begin(hora__comm *c, struct plan *p) {
  *p = (struct plan){.c = c};
  p->rng = hora__now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)c->rank;
  p->rng |= 1;
  p->want_in = hora__calloc((size_t)c->size * HORA_CONN_SLOTS, 1);
  if (!p->want_in) {
    return HORA_ERR_NO_MEMORY;
  }
  /* Kept for EMFILE, during the bootstrap and after (hora__accept_shed). */
  if (c->proc->reserve_fd < 0) {
    c->proc->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  return HORA_SUCCESS;
}

static int run_plan(struct plan *p, int rc);

int hora__boot_connect_all(hora__comm *c, const int *ctrl_peers, int nctrl_peers) {
  struct plan p;
  int rc = HORA_SUCCESS;
  HORA_CHECK(plan_begin(c, &p));
  if (c->rank == 0) {
    for (int r = 1; r < c->size; r++) {
      HORA_CHECK_GOTO(plan_connection(&p, r, HORA_CONN_CTRL), rc, out);
    }
  } else {
    HORA_CHECK_GOTO(plan_connection(&p, 0, HORA_CONN_CTRL), rc, out);
  }
  /* The control plane's other links (the engine's cycle partners). */
  for (int i = 0; i < nctrl_peers; i++) {
    if (ctrl_peers[i] < 0 || ctrl_peers[i] >= c->size || ctrl_peers[i] == c->rank) {
      rc = hora__error(HORA_ERR_INVALID_ARG, "control peer %d of rank %d in a job of %d",
                       ctrl_peers[i], c->rank, c->size);
      goto out;
    }
    HORA_CHECK_GOTO(plan_connection(&p, ctrl_peers[i], HORA_CONN_CTRL), rc, out);
  }
  if (c->size > 1) {
    HORA_CHECK_GOTO(plan_connection(&p, (c->rank + 1) % c->size, HORA_CONN_DATA), rc, out);
    HORA_CHECK_GOTO(plan_connection(&p, (c->rank + c->size - 1) % c->size, HORA_CONN_DATA), rc, out);
  }
  if (c->cross_ring.size > 1) {
    HORA_CHECK_GOTO(plan_connection(&p, hora__boot_cross_peer(c, 1), HORA_CONN_CROSS), rc, out);
    HORA_CHECK_GOTO(plan_connection(&p, hora__boot_cross_peer(c, -1), HORA_CONN_CROSS), rc, out);
  }
out:
  return run_plan(&p, rc);
}

int hora__comm_connect_peers(hora__comm *c) {
  if (c->all_pairs) {
    return HORA_SUCCESS;
  }
  struct plan p;
  int rc = HORA_SUCCESS;
  HORA_CHECK(plan_begin(c, &p));
  for (int r = 0; r < c->size; r++) {
    if (r != c->rank && !c->proc->data[r]) {
      HORA_CHECK_GOTO(plan_connection(&p, r, HORA_CONN_DATA), rc, out);
    }
  }
out:
  rc = run_plan(&p, rc);
  c->all_pairs = rc == HORA_SUCCESS;
  return rc;
}

int hora__comm_connect_ranks(hora__comm *c, const int *ranks, int n) {
  struct plan p;
  int rc = HORA_SUCCESS;
  HORA_CHECK(plan_begin(c, &p));
  for (int i = 0; i < n; i++) {
    int r = ranks[i];
    if (r < 0 || r >= c->size || r == c->rank) {
      rc = hora__error(HORA_ERR_INVALID_ARG, "data connection to rank %d of %d asked by rank %d",
                       r, c->size, c->rank);
      goto out;
    }
    if (!c->proc->data[r]) {
      HORA_CHECK_GOTO(plan_connection(&p, r, HORA_CONN_DATA), rc, out);
    }
  }
out:
  return run_plan(&p, rc);
}

/* Moves every planned socket until each is handed to its transport, then
 * frees the plan; with rc set (the planning failed), only frees it. */
static int run_plan(struct plan *pp, int rc) {
  struct plan p = *pp;
  hora__comm *c = p.c;
  hora__conn **setting_up = NULL;
  int nsetting = 0;
  uint64_t deadline = hora__now_ns() + (uint64_t)(hora__params.CONNECT_TIMEOUT_SECONDS * 1e9);
  if (rc != HORA_SUCCESS) {
    goto out;
  }
  p.half_max = HALF_OPEN_MAX + p.expected_in;
  p.half = hora__calloc((size_t)p.half_max, sizeof(*p.half));
  if (!p.half) {
    rc = HORA_ERR_NO_MEMORY;
    goto out;
  }
  for (;;) {
    uint64_t now = hora__now_ns();
    bool pending = p.expected_in > 0;
    for (int i = 0; i < p.nsocks; i++) {
      struct pending *s = &p.socks[i];
      if (s->outgoing && !s->done && s->fd < 0 && now >= s->retry_at) {
        HORA_CHECK_GOTO(start_connect(&p, s), rc, out);
      }
      pending = pending || !s->done;
    }
    if (!pending) {
      break;
    }
    for (int i = 0; i < p.nhalf;) {
      if (now - p.half[i].since >= HELLO_DEADLINE_NS) {
        hora__boot_refuse(&p, i, "did not prove the job secret within 1 s");
      } else {
        i++;
      }
    }
    if (now >= deadline) {
      rc = timed_out(&p);
      goto out;
    }
    /* The poll set: both listeners (unless accepting is paused), every
     * connection in its handshake. */
    int need = 2 + p.nsocks + p.nhalf;
    if (need > p.fds_cap) {
      struct pollfd *f = hora__realloc(p.fds, (size_t)need * sizeof(*f));
      if (!f) {
        rc = HORA_ERR_NO_MEMORY;
        goto out;
      }
      p.fds = f;
      p.fds_cap = need;
    }
    int n = 0;
    uint64_t wake = deadline;
    bool listening = now >= p.listen_resume_at;
    short lev = listening ? POLLIN : 0;
    if (!listening) {
      wake = HORA_MIN(wake, p.listen_resume_at);
    }
    p.fds[n++] = (struct pollfd){.fd = c->proc->tcp_listen_fd, .events = lev};
    p.fds[n++] = (struct pollfd){.fd = c->proc->unix_listen_fd, .events = lev};
    for (int i = 0; i < p.nsocks; i++) {
      struct pending *s = &p.socks[i];
      s->pfd = -1;
      if (s->done) {
        continue;
      }
      if (s->fd < 0) {
        wake = HORA_MIN(wake, s->retry_at);
        continue;
      }
      s->pfd = n;
      short ev = s->connecting || s->hs.state == HORA_HS_SEND ? POLLOUT : POLLIN;
      p.fds[n++] = (struct pollfd){.fd = s->fd, .events = ev};
    }
    for (int i = 0; i < p.nhalf; i++) {
      struct stranger *t = &p.half[i];
      t->pfd = n;
      wake = HORA_MIN(wake, t->since + HELLO_DEADLINE_NS);
      short ev = t->hs.state == HORA_HS_SEND ? POLLOUT : POLLIN;
      p.fds[n++] = (struct pollfd){.fd = t->fd, .events = ev};
    }
    int wait_ms = wake > now ? (int)HORA_MIN((wake - now + 999999) / 1000000, (uint64_t)1000) : 0;
    if (poll(p.fds, (nfds_t)n, wait_ms) < 0 && errno != EINTR) {
      rc = hora__error_errno(HORA_ERR_SYSTEM, "poll");
      goto out;
    }
    /* Only what poll() reported moves. Entries can move within their
     * arrays as others leave, so each is found by its own index. */
    for (int i = 0; i < p.nsocks; i++) {
      struct pending *s = &p.socks[i];
      if (s->pfd < 0 || !p.fds[s->pfd].revents) {
        continue;
      }
      s->pfd = -1;
      if (s->outgoing) {
        HORA_CHECK_GOTO(step_outgoing(&p, s), rc, out);
      } else {
        int before = p.nsocks;
        HORA_CHECK_GOTO(hora__boot_step_incoming(&p, i), rc, out);
        i -= p.nsocks < before; /* the last one moved here */
      }
    }
    for (int i = 0; i < p.nhalf; i++) {
      struct stranger *t = &p.half[i];
      if (t->pfd < 0 || !p.fds[t->pfd].revents) {
        continue;
      }
      t->pfd = -1;
      int before = p.nhalf;
      HORA_CHECK_GOTO(hora__boot_step_stranger(&p, i), rc, out);
      i -= p.nhalf < before;
    }
    if (p.fds[0].revents) {
      HORA_CHECK_GOTO(hora__boot_accept_from(&p, c->proc->tcp_listen_fd, false), rc, out);
    }
    if (p.fds[1].revents) {
      HORA_CHECK_GOTO(hora__boot_accept_from(&p, c->proc->unix_listen_fd, true), rc, out);
    }
  }

  /* Whoever has not proved the secret by now never will be needed. */
  while (p.nhalf > 0) {
    hora__boot_refuse(&p, p.nhalf - 1, "the bootstrap ended before it proved the job secret");
  }

  /* Sockets become control connections, or data connections of the chosen
   * transport, whose own set-up (the RDMA queue-pair exchange) then runs
   * for all of them together. Sorted so that a TCP connection's first
   * socket comes before its others. */
  if (p.nsocks > 1) {
    qsort(p.socks, (size_t)p.nsocks, sizeof(*p.socks), by_peer_and_kind);
  }
  setting_up = hora__calloc((size_t)p.nsocks + 1, sizeof(*setting_up));
  if (!setting_up) {
    rc = HORA_ERR_NO_MEMORY;
    goto out;
  }
  for (int i = 0; i < p.nsocks; i++) {
    struct pending *s = &p.socks[i];
    if (s->fd < 0 || s->peer < 0) {
      continue;
    }
    int fd = s->fd;
    s->fd = -1;
    /* TCP: HORA_SOCKET_BUFFER (0: the kernel's autotuning). A Unix socket
     * has no autotuning, and its default (about 200 KiB) would cut a
     * large transfer into many wake-ups. */
    int64_t buffer = s->kind == HORA_CONN_CTRL ? 0
                     : s->unix_socket         ? UNIX_SOCKET_BUFFER
                                              : hora__params.SOCKET_BUFFER;
    rc = hora__socket_tune(fd, !s->unix_socket, buffer);
    if (rc != HORA_SUCCESS) {
      close(fd);
      goto out;
    }
    if (s->kind == HORA_CONN_CTRL) {
      c->proc->ctrl[s->peer] = hora__ctrl_new(fd, s->peer);
      if (!c->proc->ctrl[s->peer]) {
        close(fd);
        rc = HORA_ERR_NO_MEMORY;
        goto out;
      }
      continue;
    }
    int kind = (s->kind - 1) % HORA_CONN_KINDS + 1, index = (s->kind - 1) / HORA_CONN_KINDS;
    hora__conn **slot = kind == HORA_CONN_CROSS ? &c->proc->cross[s->peer] : &c->proc->data[s->peer];
    if (index > 0) {
      rc = *slot && (*slot)->tp->add_stream
               ? (*slot)->tp->add_stream(*slot, fd)
               : hora__error(HORA_ERR_SYSTEM, "socket %d of a connection without its first, or of "
                             "a transport with one socket per connection", index);
      if (rc != HORA_SUCCESS) {
        close(fd);
        goto out;
      }
      continue;
    }
    const struct hora__transport *tp = uses_ib(c, s->peer, kind) ? c->proc->rdma : c->proc->stream;
    /* The transport owns the socket from here, even when this fails. */
    rc = s->outgoing ? tp->connect(c->net, fd, s->peer, slot)
                     : tp->accept(c->net, fd, s->peer, slot);
    if (rc != HORA_SUCCESS) {
      goto out;
    }
    setting_up[nsetting++] = *slot;
  }
  rc = establish_all(c, setting_up, nsetting, deadline);
out:
  for (int i = 0; i < p.nsocks; i++) {
    if (p.socks[i].fd >= 0) {
      close(p.socks[i].fd);
    }
  }
  while (p.nhalf > 0) {
    hora__boot_refuse(&p, p.nhalf - 1, "the bootstrap ended before it proved the job secret");
  }
  if (p.refused > 0) {
    HORA_WARN("bootstrap: closed %d connection%s that did not prove the job secret (first: %s)%s",
              p.refused, p.refused == 1 ? "" : "s", p.first_refused,
              hora__log_enabled(HORA_LOG_INFO) ? "" : "; HORA_LOG_LEVEL=info names each");
  }
  free(p.socks);
  free(p.half);
  free(p.fds);
  free(p.want_in);
  free(setting_up);
  return rc;
}
