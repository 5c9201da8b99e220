/* Bootstrap: MPI tells us who the ranks are; everything after that runs
 * over hora's own connections.
 *
 *   1. duplicate MPI_COMM_WORLD; rank, size
 *   2. local rank/size by shared-memory domain, host index by local leaders
 *   3. rank 0 draws the job secret; MPI_Bcast
 *   4. every rank listens (TCP on the chosen interface, Unix socket for its
 *      host) and the addresses are allgathered
 *   5. the planned connections are made, all at once and without blocking:
 *      the higher rank of a pair connects, sends a hello carrying the
 *      secret, and waits for the acknowledgement
 *
 * Planned connections: control star (rank 0 <-> every rank) and data ring
 * (rank r <-> r+1). Peers on one host use Unix sockets. */
#include <arpa/inet.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "../runtime/log.h"
#include "../runtime/params.h"
#include "comm.h"
#include "shm.h"

#define HELLO_ACK_WORD 0x214b4f48u /* "HOK!" */

int hora__mpi_error(int err, const char *call) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS) {
    snprintf(msg, sizeof(msg), "MPI error %d", err);
  }
  return hora__error(HORA_ERR_SYSTEM, "%s failed: %s", call, msg);
}

#define MPI_CHECK(call)                                                                      \
  do {                                                                                       \
    int mpi_rc_ = (call);                                                                    \
    if (mpi_rc_ != MPI_SUCCESS) {                                                            \
      return hora__mpi_error(mpi_rc_, #call);                                                \
    }                                                                                        \
  } while (0)

const char *hora__peer_name(const hora__comm *comm, int rank, char *buf, size_t n) {
  if (comm && comm->peers && rank >= 0 && rank < comm->size) {
    snprintf(buf, n, "rank %d (host %s, pid %d)", rank, comm->peers[rank].host,
             (int)comm->peers[rank].pid);
  } else {
    snprintf(buf, n, "rank %d", rank);
  }
  return buf;
}

static int topology_from_mpi(hora__comm *c, MPI_Comm *local_out) {
  MPI_Comm local, leaders;
  MPI_CHECK(MPI_Comm_split_type(c->mpi, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &local));
  MPI_Comm_rank(local, &c->local_rank);
  MPI_Comm_size(local, &c->local_size);
  int color = c->local_rank == 0 ? 0 : MPI_UNDEFINED;
  MPI_CHECK(MPI_Comm_split(c->mpi, color, c->rank, &leaders));
  int hostinfo[2] = {0, 0};
  if (leaders != MPI_COMM_NULL) {
    MPI_Comm_rank(leaders, &hostinfo[0]);
    MPI_Comm_size(leaders, &hostinfo[1]);
    MPI_Comm_free(&leaders);
  }
  int rc = MPI_Bcast(hostinfo, 2, MPI_INT, 0, local);
  *local_out = local;
  if (rc != MPI_SUCCESS) {
    return hora__mpi_error(rc, "MPI_Bcast(host index)");
  }
  c->cross_rank = hostinfo[0];
  c->cross_size = hostinfo[1];
  return HORA_SUCCESS;
}

/* Every rank learns whether a bootstrap step failed on any rank, so none is
 * left waiting in the next MPI collective for one that gave up. A rank that
 * failed keeps its own error; the others name the lowest failing rank. */
static int agree(hora__comm *c, int rc, const char *step) {
  enum { CODES = 64 };
  int code = rc > 0 && rc < CODES ? rc : HORA_ERR_SYSTEM;
  int mine = rc != HORA_SUCCESS ? c->rank * CODES + code : INT_MAX;
  int first = INT_MAX;
  int err = MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, c->mpi);
  if (rc != HORA_SUCCESS) {
    return rc;
  }
  if (err != MPI_SUCCESS) {
    return hora__mpi_error(err, "MPI_Allreduce(bootstrap status)");
  }
  if (first != INT_MAX) {
    return hora__error(first % CODES,
                       "bootstrap (%s) failed on rank %d (its hora_init error says why)", step,
                       first / CODES);
  }
  return HORA_SUCCESS;
}

static int make_secret(hora__comm *c) {
  int rc = HORA_SUCCESS;
  if (c->rank == 0) {
    size_t got = 0;
    while (got < HORA_SECRET_LEN && rc == HORA_SUCCESS) {
      ssize_t n = getrandom(c->secret + got, HORA_SECRET_LEN - got, 0);
      if (n < 0 && errno != EINTR) {
        rc = hora__error_errno(HORA_ERR_SYSTEM, "getrandom (job secret)");
      }
      if (n > 0) {
        got += (size_t)n;
      }
    }
  }
  HORA_CHECK(agree(c, rc, "job secret"));
  MPI_CHECK(MPI_Bcast(c->secret, HORA_SECRET_LEN, MPI_BYTE, 0, c->mpi));
  for (int i = 0; i < 8; i++) {
    snprintf(c->job_id + 2 * i, 3, "%02x", c->secret[i]);
  }
  return HORA_SUCCESS;
}

/* ---- connection setup ----------------------------------------------------- */

enum sock_state { S_CONNECTING, S_SEND_HELLO, S_WAIT_ACK, S_WAIT_HELLO, S_SEND_ACK, S_DONE };

struct pending {
  int fd;
  enum sock_state state;
  bool outgoing;
  bool unix_socket;
  int peer;
  int kind;
  uint8_t buf[HORA_HELLO_WIRE_SIZE];
  size_t done; /* bytes of buf sent or received */
  uint64_t retry_at;
};

struct plan {
  hora__comm *c;
  struct pending *socks;
  int nsocks, cap;
  int expected_in; /* incoming connections still to arrive */
  uint8_t *want_in;   /* [size * kinds]: 1 while (peer, kind) is expected */
};

static bool same_host(const hora__comm *c, int peer) {
  return c->peers[peer].host_index == c->peers[c->rank].host_index;
}

static int add_sock(struct plan *p, struct pending s) {
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

static int start_connect(struct plan *p, struct pending *s) {
  hora__comm *c = p->c;
  struct sockaddr_storage ss;
  socklen_t len;
  int fd;
  if (s->unix_socket) {
    unsigned ulen;
    hora__unix_address(c->job_id, s->peer, &ss, &ulen);
    len = (socklen_t)ulen;
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  } else {
    struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
    memset(sin, 0, sizeof(*sin));
    sin->sin_family = AF_INET;
    sin->sin_addr.s_addr = c->peers[s->peer].ipv4;
    sin->sin_port = c->peers[s->peer].port;
    len = sizeof(*sin);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  }
  if (fd < 0) {
    return hora__error_errno(HORA_ERR_SYSTEM, "socket");
  }
  s->fd = fd;
  s->state = S_CONNECTING;
  if (connect(fd, (struct sockaddr *)&ss, len) < 0 && errno != EINPROGRESS && errno != EAGAIN) {
    if (errno == ECONNREFUSED || errno == ENOENT) {
      /* Not listening yet, or momentarily full: try again shortly. */
      close(fd);
      s->fd = -1;
      s->retry_at = hora__now_ns() + 20 * 1000000ull;
      return HORA_SUCCESS;
    }
    char name[160];
    return hora__error_errno(HORA_ERR_PEER_LOST, "connect to %s",
                             hora__peer_name(c, s->peer, name, sizeof(name)));
  }
  struct hora__hello h = {.magic = HORA_HELLO_MAGIC,
                          .version = HORA_HELLO_VERSION,
                          .kind = (uint16_t)s->kind,
                          .rank = c->rank,
                          .size = c->size};
  memcpy(h.secret, c->secret, HORA_SECRET_LEN);
  hora__hello_encode(&h, s->buf);
  s->done = 0;
  return HORA_SUCCESS;
}

/* Closes an incoming connection that failed or was refused before its
 * handshake ended; the listener goes on waiting for the real peer. */
static int drop_incoming(struct pending *s) {
  close(s->fd);
  s->fd = -1;
  s->state = S_DONE;
  s->peer = -1;
  return HORA_SUCCESS;
}

/* Moves one socket's handshake forward; returns PEER_LOST on failures of
 * our own outgoing connections, and refuses bad incoming ones. */
static int step(struct plan *p, struct pending *s) {
  hora__comm *c = p->c;
  char name[160];
  for (;;) {
    switch (s->state) {
      case S_CONNECTING: {
        int err = 0;
        socklen_t l = sizeof(err);
        if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0) {
          err = errno;
        }
        if (err == EINPROGRESS) {
          return HORA_SUCCESS;
        }
        if (err == ECONNREFUSED) {
          close(s->fd);
          s->fd = -1;
          s->retry_at = hora__now_ns() + 20 * 1000000ull;
          return HORA_SUCCESS;
        }
        if (err != 0) {
          errno = err;
          return hora__error_errno(HORA_ERR_PEER_LOST, "connect to %s",
                                   hora__peer_name(c, s->peer, name, sizeof(name)));
        }
        s->state = S_SEND_HELLO;
        break;
      }
      case S_SEND_HELLO:
      case S_SEND_ACK: {
        size_t total = s->state == S_SEND_HELLO ? HORA_HELLO_WIRE_SIZE : 4;
        ssize_t n = send(s->fd, s->buf + s->done, total - s->done, MSG_NOSIGNAL);
        if (n < 0) {
          if (errno == EAGAIN || errno == EINTR) {
            return HORA_SUCCESS;
          }
          if (s->outgoing) {
            return hora__error_errno(HORA_ERR_PEER_LOST, "handshake with %s",
                                     hora__peer_name(c, s->peer, name, sizeof(name)));
          }
          HORA_WARN("bootstrap: connection from %s broke during the handshake",
                    hora__peer_name(c, s->peer, name, sizeof(name)));
          return drop_incoming(s);
        }
        s->done += (size_t)n;
        if (s->done < total) {
          return HORA_SUCCESS;
        }
        s->done = 0;
        s->state = s->state == S_SEND_HELLO ? S_WAIT_ACK : S_DONE;
        if (s->state == S_DONE) {
          return HORA_SUCCESS;
        }
        break;
      }
      case S_WAIT_ACK:
      case S_WAIT_HELLO: {
        size_t total = s->state == S_WAIT_ACK ? 4 : HORA_HELLO_WIRE_SIZE;
        ssize_t n = recv(s->fd, s->buf + s->done, total - s->done, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
          return HORA_SUCCESS;
        }
        if (n <= 0) {
          if (s->outgoing) {
            return hora__error(HORA_ERR_PEER_LOST, "%s closed the connection during the handshake",
                               hora__peer_name(c, s->peer, name, sizeof(name)));
          }
          HORA_WARN("bootstrap: refused a connection that closed before its handshake");
          return drop_incoming(s);
        }
        s->done += (size_t)n;
        if (s->done < total) {
          return HORA_SUCCESS;
        }
        s->done = 0;
        if (s->state == S_WAIT_ACK) {
          uint32_t w = (uint32_t)s->buf[0] | (uint32_t)s->buf[1] << 8 |
                       (uint32_t)s->buf[2] << 16 | (uint32_t)s->buf[3] << 24;
          if (w != HELLO_ACK_WORD) {
            return hora__error(HORA_ERR_PEER_LOST, "%s answered the handshake with garbage",
                               hora__peer_name(c, s->peer, name, sizeof(name)));
          }
          s->state = S_DONE;
          return HORA_SUCCESS;
        }
        struct hora__hello h;
        int rc = hora__hello_decode(s->buf, c->secret, c->size, &h);
        if (rc == HORA_SUCCESS) {
          size_t slot = (size_t)h.rank * HORA_CONN_SLOTS + (size_t)(h.kind - 1);
          if (!p->want_in[slot]) {
            rc = hora__error(HORA_ERR_INVALID_ARG, "unexpected or duplicate %s connection from rank %d",
                             h.kind == HORA_CONN_CTRL ? "control" : "data", h.rank);
          } else {
            p->want_in[slot] = 0;
            p->expected_in--;
            s->peer = h.rank;
            s->kind = h.kind;
          }
        }
        if (rc != HORA_SUCCESS) {
          HORA_WARN("bootstrap: refused a connection: %s", hora__error_message());
          return drop_incoming(s);
        }
        uint32_t w = HELLO_ACK_WORD;
        s->buf[0] = (uint8_t)w;
        s->buf[1] = (uint8_t)(w >> 8);
        s->buf[2] = (uint8_t)(w >> 16);
        s->buf[3] = (uint8_t)(w >> 24);
        s->state = S_SEND_ACK;
        break;
      }
      case S_DONE:
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

static int accept_from(struct plan *p, int lfd, bool unix_socket) {
  for (;;) {
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) {
        return HORA_SUCCESS;
      }
      return hora__error_errno(HORA_ERR_SYSTEM, "accept");
    }
    struct pending s = {.fd = fd, .state = S_WAIT_HELLO, .unix_socket = unix_socket, .peer = -1};
    HORA_CHECK(add_sock(p, s));
  }
}

/* Whether connections to peer of this kind use the RDMA transport. */
static bool uses_ib(const hora__comm *c, int peer, int kind) {
#if HORA_HAVE_VERBS
  return kind != HORA_CONN_CTRL && (c->ib_all || (c->ib_remote && !same_host(c, peer)));
#else
  (void)c, (void)peer, (void)kind;
  return false;
#endif
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
    struct pending s = {.fd = -1, .outgoing = true, .unix_socket = use_unix, .peer = peer, .kind = kind};
    HORA_CHECK(add_sock(p, s));
    return start_connect(p, &p->socks[p->nsocks - 1]);
  }
  size_t slot = (size_t)peer * HORA_CONN_SLOTS + (size_t)(kind - 1);
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
  int n = kind != HORA_CONN_CTRL && !use_unix && !uses_ib(c, peer, kind) ? c->tcp_streams : 1;
  for (int i = 0; i < n; i++) {
    HORA_CHECK(plan_socket(p, peer, kind + HORA_CONN_KINDS * i, use_unix));
  }
  return HORA_SUCCESS;
}

/* The rank on the host `dir` steps along the cross ring with this rank's
 * local rank (hosts are homogeneous when this is used). */
static int cross_peer(const hora__comm *c, int dir) {
  int h = (c->cross_rank + dir + c->cross_size) % c->cross_size;
  for (int r = 0; r < c->size; r++) {
    if (c->peers[r].host_index == h && c->peers[r].local_rank == c->local_rank) {
      return r;
    }
  }
  return -1;
}

static bool hosts_homogeneous(const hora__comm *c) {
  for (int r = 0; r < c->size; r++) {
    int n = 0;
    for (int q = 0; q < c->size; q++) {
      n += c->peers[q].host_index == c->peers[r].host_index;
    }
    if (n != c->local_size) {
      return false;
    }
  }
  return true;
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
      rc = conns[i]->tp->establish(c, conns[i], &ready, &fd, &events);
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

static int connect_all(hora__comm *c) {
  struct plan p = {.c = c};
  int rc = HORA_SUCCESS;
  hora__conn **setting_up = NULL;
  int nsetting = 0;
  p.want_in = hora__calloc((size_t)c->size * HORA_CONN_SLOTS, 1);
  if (!p.want_in) {
    return HORA_ERR_NO_MEMORY;
  }
  if (c->rank == 0) {
    for (int r = 1; r < c->size; r++) {
      HORA_CHECK_GOTO(plan_connection(&p, r, HORA_CONN_CTRL), rc, out);
    }
  } else {
    HORA_CHECK_GOTO(plan_connection(&p, 0, HORA_CONN_CTRL), rc, out);
  }
  struct hora__cycle_partners cp;
  hora__cycle_partners(c->rank, c->size, &cp);
  if (cp.fold >= 0) {
    HORA_CHECK_GOTO(plan_connection(&p, cp.fold, HORA_CONN_CTRL), rc, out);
  }
  for (int i = 0; i < cp.nrounds; i++) {
    HORA_CHECK_GOTO(plan_connection(&p, cp.round[i], HORA_CONN_CTRL), rc, out);
  }
  if (c->size > 1) {
    HORA_CHECK_GOTO(plan_connection(&p, (c->rank + 1) % c->size, HORA_CONN_DATA), rc, out);
    HORA_CHECK_GOTO(plan_connection(&p, (c->rank + c->size - 1) % c->size, HORA_CONN_DATA), rc, out);
  }
  if (c->cross_ring.size > 1) {
    HORA_CHECK_GOTO(plan_connection(&p, cross_peer(c, 1), HORA_CONN_CROSS), rc, out);
    HORA_CHECK_GOTO(plan_connection(&p, cross_peer(c, -1), HORA_CONN_CROSS), rc, out);
  }
  uint64_t deadline = hora__now_ns() + (uint64_t)(hora__params.CONNECT_TIMEOUT_SECONDS * 1e9);
  for (;;) {
    bool outgoing_pending = false;
    uint64_t now = hora__now_ns();
    for (int i = 0; i < p.nsocks; i++) {
      struct pending *s = &p.socks[i];
      if (s->outgoing && s->fd < 0 && s->state != S_DONE && now >= s->retry_at) {
        HORA_CHECK_GOTO(start_connect(&p, s), rc, out);
      }
      if (s->fd >= 0 && s->state != S_DONE) {
        HORA_CHECK_GOTO(step(&p, s), rc, out);
      }
      if (s->outgoing && s->state != S_DONE) {
        outgoing_pending = true;
      }
    }
    if (!outgoing_pending && p.expected_in == 0) {
      bool handshakes_pending = false;
      for (int i = 0; i < p.nsocks; i++) {
        if (p.socks[i].fd >= 0 && p.socks[i].state != S_DONE) {
          handshakes_pending = true;
        }
      }
      if (!handshakes_pending) {
        break;
      }
    }
    if (now >= deadline) {
      char missing[512] = "";
      size_t m = 0;
      for (int i = 0; i < p.nsocks && m + 32 < sizeof(missing); i++) {
        if (p.socks[i].outgoing && p.socks[i].state != S_DONE) {
          m += (size_t)snprintf(missing + m, sizeof(missing) - m, " %d", p.socks[i].peer);
        }
      }
      for (int r = 0; r < c->size * HORA_CONN_SLOTS && m + 32 < sizeof(missing); r++) {
        if (p.want_in[r]) {
          m += (size_t)snprintf(missing + m, sizeof(missing) - m, " %d", r / HORA_CONN_SLOTS);
        }
      }
      rc = hora__error(HORA_ERR_PEER_LOST,
                       "bootstrap: timed out after %gs (HORA_CONNECT_TIMEOUT_SECONDS) connecting "
                       "to ranks:%s",
                       hora__params.CONNECT_TIMEOUT_SECONDS, missing);
      goto out;
    }
    struct pollfd fds[2 + 256];
    int n = 0;
    fds[n++] = (struct pollfd){.fd = c->tcp_listen_fd, .events = POLLIN};
    fds[n++] = (struct pollfd){.fd = c->unix_listen_fd, .events = POLLIN};
    for (int i = 0; i < p.nsocks && n < (int)HORA_ARRAY_SIZE(fds); i++) {
      struct pending *s = &p.socks[i];
      if (s->fd < 0 || s->state == S_DONE) {
        continue;
      }
      short ev = (s->state == S_CONNECTING || s->state == S_SEND_HELLO || s->state == S_SEND_ACK)
                     ? POLLOUT
                     : POLLIN;
      fds[n++] = (struct pollfd){.fd = s->fd, .events = ev};
    }
    if (poll(fds, (nfds_t)n, 20) < 0 && errno != EINTR) {
      rc = hora__error_errno(HORA_ERR_SYSTEM, "poll");
      goto out;
    }
    if (fds[0].revents) {
      HORA_CHECK_GOTO(accept_from(&p, c->tcp_listen_fd, false), rc, out);
    }
    if (fds[1].revents) {
      HORA_CHECK_GOTO(accept_from(&p, c->unix_listen_fd, true), rc, out);
    }
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
    rc = hora__socket_tune(fd, !s->unix_socket,
                           s->kind == HORA_CONN_CTRL ? 0 : hora__params.SOCKET_BUFFER);
    if (rc != HORA_SUCCESS) {
      close(fd);
      goto out;
    }
    if (s->kind == HORA_CONN_CTRL) {
      c->ctrl[s->peer] = hora__ctrl_new(fd, s->peer);
      if (!c->ctrl[s->peer]) {
        close(fd);
        rc = HORA_ERR_NO_MEMORY;
        goto out;
      }
      continue;
    }
    int kind = (s->kind - 1) % HORA_CONN_KINDS + 1, index = (s->kind - 1) / HORA_CONN_KINDS;
    hora__conn **slot = kind == HORA_CONN_CROSS ? &c->cross[s->peer] : &c->data[s->peer];
    if (index > 0) {
      rc = *slot ? hora__tcp_add_stream(*slot, fd)
                 : hora__error(HORA_ERR_SYSTEM, "socket %d of a connection without its first",
                               index);
      if (rc != HORA_SUCCESS) {
        close(fd);
        goto out;
      }
      continue;
    }
    const struct hora__transport *tp = &hora__transport_tcp;
#if HORA_HAVE_VERBS
    if (uses_ib(c, s->peer, kind)) {
      tp = &hora__transport_ib;
    }
#endif
    /* The transport owns the socket from here, even when this fails. */
    rc = s->outgoing ? tp->connect(c, fd, s->peer, slot) : tp->accept(c, fd, s->peer, slot);
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
  free(p.socks);
  free(p.want_in);
  free(setting_up);
  return rc;
}

/* Settings that shape the protocol (scope `job` in runtime/params.def) must
 * be the same everywhere, or ranks would deadlock in set-up or exchange
 * bytes the others read differently. One digest per rank; the two
 * encodings are sent only when a digest differs, so every rank fails
 * naming the same setting. */
static int check_job_settings(hora__comm *c) {
  size_t len = hora__params_job_encode(NULL, 0);
  char *mine = hora__malloc(len + 1);
  if (!mine) {
    return HORA_ERR_NO_MEMORY;
  }
  hora__params_job_encode(mine, len + 1);
  uint64_t digest = 0xcbf29ce484222325ull; /* FNV-1a */
  for (size_t i = 0; i < len; i++) {
    digest = (digest ^ (unsigned char)mine[i]) * 0x100000001b3ull;
  }
  uint64_t *all = hora__calloc((size_t)c->size, sizeof(*all));
  char *theirs[2] = {NULL, NULL};
  int rc = all ? HORA_SUCCESS : HORA_ERR_NO_MEMORY;
  int err = MPI_Allgather(&digest, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, c->mpi);
  if (rc == HORA_SUCCESS && err != MPI_SUCCESS) {
    rc = hora__mpi_error(err, "MPI_Allgather(settings digest)");
  }
  int other = -1;
  for (int r = 1; rc == HORA_SUCCESS && r < c->size && other < 0; r++) {
    other = all[r] != all[0] ? r : -1;
  }
  /* Every rank knows `other` from the same digests: all take this branch. */
  int roots[2] = {0, other};
  int lens[2] = {0, 0};
  for (int i = 0; rc == HORA_SUCCESS && other > 0 && i < 2; i++) {
    lens[i] = c->rank == roots[i] ? (int)len : 0;
    err = MPI_Bcast(&lens[i], 1, MPI_INT, roots[i], c->mpi);
    theirs[i] = err == MPI_SUCCESS ? hora__malloc((size_t)lens[i] + 1) : NULL;
    if (theirs[i] && c->rank == roots[i]) {
      memcpy(theirs[i], mine, len);
    }
    /* A failed allocation still joins the broadcast, into a scratch byte. */
    char scratch;
    if (err == MPI_SUCCESS) {
      err = MPI_Bcast(theirs[i] ? theirs[i] : &scratch, theirs[i] ? lens[i] : 0, MPI_CHAR,
                      roots[i], c->mpi);
    }
    if (err != MPI_SUCCESS) {
      rc = hora__mpi_error(err, "MPI_Bcast(settings)");
    } else if (!theirs[i]) {
      rc = HORA_ERR_NO_MEMORY;
    }
  }
  if (rc == HORA_SUCCESS && other > 0) {
    char msg[512];
    if (!hora__params_job_difference(theirs[0], (size_t)lens[0], 0, theirs[1], (size_t)lens[1],
                                     other, msg, sizeof(msg))) {
      snprintf(msg, sizeof(msg), "ranks 0 and %d differ in their job-wide settings", other);
    }
    rc = hora__error(HORA_ERR_INVALID_ARG, "%s (job-wide settings must be the same on every rank)",
                     msg);
  }
  free(theirs[0]);
  free(theirs[1]);
  free(all);
  free(mine);
  return rc;
}

static int comm_connect(hora__comm *c, MPI_Comm local);

static int comm_create(MPI_Comm world, hora__comm *c) {
  MPI_CHECK(MPI_Comm_dup(world, &c->mpi));
  MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
  MPI_Comm_rank(c->mpi, &c->rank);
  MPI_Comm_size(c->mpi, &c->size);
  hora__log_set_rank(c->rank);
  HORA_CHECK(check_job_settings(c));
  MPI_Comm local = MPI_COMM_NULL;
  int rc = topology_from_mpi(c, &local);
  if (rc == HORA_SUCCESS) {
    rc = comm_connect(c, local);
  }
  if (local != MPI_COMM_NULL) {
    MPI_Comm_free(&local);
  }
  return rc;
}

/* This rank's listening sockets (TCP on the chosen interface, and a Unix
 * socket for its host) and its tables of peers. */
static int listen_and_allocate(hora__comm *c, struct in_addr *ip, char *ifname, size_t n) {
  HORA_CHECK(hora__choose_ipv4(hora__params.IFACE, c->cross_size == 1, ip, ifname, n));
  HORA_CHECK(hora__listen_tcp(*ip, &c->tcp_listen_fd, &c->tcp_addr));
  HORA_CHECK(hora__listen_unix(c->job_id, c->rank, &c->unix_listen_fd));
  c->peers = hora__calloc((size_t)c->size, sizeof(*c->peers));
  c->ctrl = hora__calloc((size_t)c->size, sizeof(*c->ctrl));
  c->data = hora__calloc((size_t)c->size, sizeof(*c->data));
  c->cross = hora__calloc((size_t)c->size, sizeof(*c->cross));
  if (!c->peers || !c->ctrl || !c->data || !c->cross) {
    return HORA_ERR_NO_MEMORY;
  }
  return HORA_SUCCESS;
}

static int comm_connect(hora__comm *c, MPI_Comm local) {
  HORA_CHECK(make_secret(c));

  struct in_addr ip;
  char ifname[64];
  HORA_CHECK(agree(c, listen_and_allocate(c, &ip, ifname, sizeof(ifname)), "listening sockets"));
  struct hora__peer_info me;
  memset(&me, 0, sizeof(me));
  hora__strlcpy(me.host, hora__log_hostname(), sizeof(me.host));
  me.pid = (int32_t)getpid();
  me.local_rank = c->local_rank;
  me.host_index = c->cross_rank;
  me.ipv4 = c->tcp_addr.sin_addr.s_addr;
  me.port = c->tcp_addr.sin_port;
  MPI_CHECK(MPI_Allgather(&me, (int)sizeof(me), MPI_BYTE, c->peers, (int)sizeof(me), MPI_BYTE,
                          c->mpi));
  char ipstr[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &ip, ipstr, sizeof(ipstr));
  HORA_DEBUG("bootstrap: listening on %s:%d (%s) and @hora.%s.%d", ipstr,
             ntohs(c->tcp_addr.sin_port), ifname, c->job_id, c->rank);

  /* RDMA: forced (also within hosts) or, by default, between hosts when
   * every host has an active port. The ranks must agree. */
  bool forced_ib = strcmp(hora__params.TRANSPORT, "ib") == 0;
  bool auto_transport = strcmp(hora__params.TRANSPORT, "auto") == 0;
  int ib_here = 0, ib_everywhere = 0;
#if HORA_HAVE_VERBS
  if (forced_ib || (auto_transport && c->cross_size > 1)) {
    ib_here = hora__ib_available();
  }
#endif
  MPI_CHECK(MPI_Allreduce(&ib_here, &ib_everywhere, 1, MPI_INT, MPI_MIN, c->mpi));
  if (forced_ib && !ib_everywhere) {
    return hora__error(HORA_ERR_NOT_SUPPORTED,
                       "HORA_TRANSPORT=ib, but %s%s",
                       HORA_HAVE_VERBS ? "" : "this build has no verbs support (configure --with-verbs)",
                       HORA_HAVE_VERBS ? (ib_here ? "another rank's host has no active RDMA port"
                                                  : "this host has no active RDMA port")
                                       : "");
  }
  c->ib_all = forced_ib;
  c->ib_remote = forced_ib || (auto_transport && ib_everywhere);

  /* Hierarchical allreduce: shared memory within each host and a ring
   * across hosts per slice; it needs the same number of ranks per host. */
  bool forced_tcp = strcmp(hora__params.TRANSPORT, "tcp") == 0 || forced_ib;
  const char *hier = hora__params.HIERARCHICAL_ALLREDUCE;
  bool homogeneous = hosts_homogeneous(c);
  bool hierarchical = !forced_tcp && c->cross_size > 1 && c->local_size > 1 && homogeneous &&
                      strcmp(hier, "0") != 0;
  if (strcmp(hier, "1") == 0 && !hierarchical && c->rank == 0) {
    HORA_WARN("HORA_HIERARCHICAL_ALLREDUCE=1 ignored: it needs several hosts with the same number "
              "of ranks each, and shared memory (HORA_TRANSPORT is %s)", hora__params.TRANSPORT);
  }
  if (hierarchical) {
    c->cross_ring.pos = c->cross_rank;
    c->cross_ring.size = c->cross_size;
  }
  /* Sockets per TCP connection: the smallest any rank asks for. */
  int streams = (int)HORA_MAX(1, HORA_MIN(hora__params.SOCKETS_PER_PEER, HORA_TCP_STREAMS_MAX));
  MPI_CHECK(MPI_Allreduce(&streams, &c->tcp_streams, 1, MPI_INT, MPI_MIN, c->mpi));
  HORA_CHECK(agree(c, connect_all(c), "connections"));
  c->world_ring.pos = c->rank;
  c->world_ring.size = c->size;
  if (c->size > 1) {
    c->world_ring.next = c->data[(c->rank + 1) % c->size];
    c->world_ring.prev = c->data[(c->rank + c->size - 1) % c->size];
  }
  if (hierarchical) {
    c->cross_ring.next = c->cross[cross_peer(c, 1)];
    c->cross_ring.prev = c->cross[cross_peer(c, -1)];
  }
  int shm_rc = HORA_SUCCESS;
  if (!forced_tcp && c->local_size > 1) {
    shm_rc = hora__shm_create(c, local, &c->shm);
  }
  HORA_CHECK(agree(c, shm_rc, "shared memory"));
  /* The algorithms must agree job-wide: if some host could not share
   * memory, every rank uses the rings. */
  int ok = forced_tcp || c->local_size == 1 || c->shm != NULL, all_ok = 0;
  MPI_CHECK(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, c->mpi));
  if (!all_ok) {
    hora__shm_destroy(c->shm);
    c->shm = NULL;
    hierarchical = false;
  }
  c->algo_allreduce =
      c->shm && (c->cross_size == 1 || hierarchical) ? HORA_ALGO_SHM : HORA_ALGO_RING;
  c->algo_bcast = c->algo_allgather = c->shm && c->cross_size == 1 ? HORA_ALGO_SHM : HORA_ALGO_RING;
  c->local_transport = c->local_size == 1 ? "none"
                      : c->shm             ? "shm"
                      : forced_ib          ? "ib"
                      : forced_tcp         ? "tcp"
                                           : "tcp(unix)";
  const char *remote = c->ib_remote ? "ib" : "tcp";
  c->remote_transport = c->cross_size == 1 ? "none"
                        : hierarchical     ? (c->ib_remote ? "ib(hierarchical)" : "tcp(hierarchical)")
                                           : remote;
  if (hierarchical && c->ib_remote) {
    /* The cross-host rings reduce in this rank's two shared halves: with
     * them registered, slices move between hosts without a copy. */
    hora__comm_register(c, hora__shm_half(c->shm, c->local_rank, 0),
                        2 * hora__shm_half_bytes(c->shm), &c->shm_reg);
  }
  c->chunk_bytes = hora__params.CHUNK_SIZE;
  c->single_copy_min = hora__params.SHM_SINGLE_COPY_MIN;
  c->stall_ns = (uint64_t)(hora__params.STALL_SHUTDOWN_TIME_SECONDS * 1e9);
  return HORA_SUCCESS;
}

int hora__comm_create(MPI_Comm world, hora__comm **out) {
  hora__comm *c = hora__calloc(1, sizeof(*c));
  if (!c) {
    return HORA_ERR_NO_MEMORY;
  }
  c->tcp_listen_fd = c->unix_listen_fd = -1;
  c->mpi = MPI_COMM_NULL;
  int rc = comm_create(world, c);
  if (rc != HORA_SUCCESS) {
    hora__comm_destroy(c);
    return rc;
  }
  *out = c;
  return HORA_SUCCESS;
}

void hora__comm_disconnect(hora__comm *c) {
  if (c->ctrl) {
    for (int r = 0; r < c->size; r++) {
      hora__ctrl_free(c->ctrl[r]);
      c->ctrl[r] = NULL;
    }
  }
  for (int k = 0; k < 2; k++) {
    hora__conn **v = k ? c->cross : c->data;
    for (int r = 0; v && r < c->size; r++) {
      if (v[r]) {
        v[r]->tp->close(v[r]);
        v[r] = NULL;
      }
    }
  }
  c->world_ring.next = c->world_ring.prev = NULL;
  c->cross_ring.next = c->cross_ring.prev = NULL;
  c->active = NULL;
  if (c->tcp_listen_fd >= 0) {
    close(c->tcp_listen_fd);
    c->tcp_listen_fd = -1;
  }
  if (c->unix_listen_fd >= 0) {
    close(c->unix_listen_fd);
    c->unix_listen_fd = -1;
  }
}

void hora__comm_register(hora__comm *c, void *buf, size_t len, void **handle) {
  *handle = NULL;
#if HORA_HAVE_VERBS
  if ((c->ib_all || c->ib_remote) && len > 0 &&
      hora__transport_ib.reg_mem(c, buf, len, handle) != HORA_SUCCESS) {
    HORA_WARN("RDMA registration of a %zu-byte buffer failed (%s); transfers into it are copied",
              len, hora_last_error());
    *handle = NULL;
  }
#else
  (void)c;
  (void)buf;
  (void)len;
#endif
}

int hora__comm_register_device(hora__comm *c, void *buf, size_t len, int fd, uint64_t offset,
                               void **handle) {
  *handle = NULL;
#if HORA_HAVE_VERBS
  if (!c->ib_all && !c->ib_remote) {
    return hora__error(HORA_ERR_NOT_SUPPORTED, "no RDMA connections to register GPU memory with");
  }
  return hora__transport_ib.reg_dmabuf(c, buf, len, fd, offset, handle);
#else
  (void)c;
  (void)buf;
  (void)len;
  (void)fd;
  (void)offset;
  return hora__error(HORA_ERR_NOT_SUPPORTED, "built without RDMA (libibverbs)");
#endif
}

void hora__comm_deregister(hora__comm *c, void **handle) {
#if HORA_HAVE_VERBS
  if (*handle) {
    hora__transport_ib.dereg_mem(c, *handle);
  }
#else
  (void)c;
#endif
  *handle = NULL;
}

int hora__comm_grow_registered(hora__comm *c, char **buf, size_t *bytes, void **handle,
                               size_t need) {
  if (*bytes >= need) {
    return HORA_SUCCESS;
  }
  /* Page-aligned: RDMA registers whole pages. */
  char *p = hora__aligned_alloc(4096, need);
  if (!p) {
    return HORA_ERR_NO_MEMORY;
  }
  hora__comm_deregister(c, handle);
  free(*buf);
  *buf = p;
  *bytes = need;
  hora__comm_register(c, p, need, handle);
  return HORA_SUCCESS;
}

void hora__comm_destroy(hora__comm *c) {
  if (!c) {
    return;
  }
  hora__comm_disconnect(c);
  hora__comm_deregister(c, &c->fusion_reg);
  hora__comm_deregister(c, &c->scratch_reg);
  hora__comm_deregister(c, &c->shm_reg);
  if (c->mpi != MPI_COMM_NULL) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      MPI_Comm_free(&c->mpi);
    }
  }
  hora__peer_maps_free(c->peer_maps, c->local_size);
  free(c->peer_ptrs);
  hora__shm_destroy(c->shm);
  free(c->fusion);
  free(c->scratch);
  free(c->bounce);
  free(c->peers);
  free(c->ctrl);
  free(c->data);
  free(c->cross);
  free(c);
}
