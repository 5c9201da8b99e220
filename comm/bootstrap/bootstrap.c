/* Bootstrap: MPI tells us who the ranks are; everything after that runs
 * over hora's own connections.
 *
 *   1. duplicate MPI_COMM_WORLD; rank, size
 *   2. local rank/size by shared-memory domain, host index by local leaders
 *   3. rank 0 draws the job secret and a separate job id; MPI_Bcast
 *   4. every rank listens (TCP on the chosen interface, Unix socket for its
 *      host) and the addresses are allgathered
 *   5. the planned connections are made, all at once and without blocking:
 *      the higher rank of a pair connects, and both prove to each other
 *      that they know the secret (handshake.h: HMAC-SHA-256 over nonces of
 *      both sides; the secret itself never crosses the wire). Strangers
 *      are dropped after 1 s and few are held (see HALF_OPEN_MAX)
 *
 * Planned connections: control star (rank 0 <-> every rank) and data ring
 * (rank r <-> r+1). Peers on one host use Unix sockets. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"
#include "base/mpi_error.h"
#include "comm/coll/collectives.h"
#include "comm/comm.h"
#include "comm/transport/socket.h"
#include "comm/shm/shm.h"

#define MPI_CHECK(call)                                                                      \
  do {                                                                                       \
    int mpi_rc_ = (call);                                                                    \
    if (mpi_rc_ != MPI_SUCCESS) {                                                            \
      return hora__mpi_error(mpi_rc_, #call);                                                \
    }                                                                                        \
  } while (0)


static int topology_from_mpi(hora__comm *c, MPI_Comm *local_out) {
  MPI_Comm local, leaders;
  MPI_CHECK(MPI_Comm_split_type(c->proc->mpi, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &local));
  MPI_Comm_rank(local, &c->local_rank);
  MPI_Comm_size(local, &c->local_size);
  int color = c->local_rank == 0 ? 0 : MPI_UNDEFINED;
  MPI_CHECK(MPI_Comm_split(c->proc->mpi, color, c->rank, &leaders));
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
  int err = MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, c->proc->mpi);
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

static int random_bytes(void *buf, size_t n, const char *what) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom((uint8_t *)buf + got, n - got, 0);
    if (r < 0 && errno != EINTR) {
      return hora__error_errno(HORA_ERR_SYSTEM, "getrandom (%s)", what);
    }
    if (r > 0) {
      got += (size_t)r;
    }
  }
  return HORA_SUCCESS;
}

/* Rank 0 draws the job secret and, apart from it, the job id that names
 * the Unix sockets: the id is public (anyone on the host can list the
 * abstract names), so it must carry no bit of the secret. */
static int make_secret(hora__comm *c) {
  uint8_t drawn[HORA_SECRET_LEN + 8];
  int rc = HORA_SUCCESS;
  if (c->rank == 0) {
    rc = random_bytes(drawn, sizeof(drawn), "job secret");
  }
  HORA_CHECK(agree(c, rc, "job secret"));
  MPI_CHECK(MPI_Bcast(drawn, (int)sizeof(drawn), MPI_BYTE, 0, c->proc->mpi));
  memcpy(c->proc->secret, drawn, HORA_SECRET_LEN);
  for (int i = 0; i < 8; i++) {
    snprintf(c->proc->job_id + 2 * i, 3, "%02x", drawn[HORA_SECRET_LEN + i]);
  }
  OPENSSL_cleanse(drawn, sizeof(drawn));
  return HORA_SUCCESS;
}

/* ---- connection setup ----------------------------------------------------- */

/* Strangers. Anyone may connect to a listener, so an accepted connection
 * is held to a deadline and a bound until it has proved the job secret:
 * HELLO_DEADLINE_NS for the whole handshake, and at most HALF_OPEN_MAX of
 * them at once, plus one per connection this rank expects (rank 0 of a
 * large job takes thousands of control connections at once, and needs
 * their descriptors anyway). When the table is full the oldest is dropped,
 * not the newcomer: connections held open (silent, or half a hello) then
 * cannot keep peers out, since an attacker would have to open more than
 * the table's worth of new ones within each peer's handshake round trip. A
 * peer dropped anyway is not lost: the connecting side retries any
 * connection closed before the acknowledgement, until
 * HORA_CONNECT_TIMEOUT_SECONDS. */
#define HALF_OPEN_MAX 64
#define HELLO_DEADLINE_NS 1000000000ull
#define ACCEPT_BATCH 16 /* per listener and turn: handshakes in flight move between batches */
#define RETRY_MIN_NS (10 * 1000000ull)
#define RETRY_MAX_NS (200 * 1000000ull)
#define LISTEN_PAUSE_NS (100 * 1000000ull)
#define REFUSED_FOR_NS (1000 * 1000000ull) /* connections refused this long: the peer is gone */

/* One of this rank's planned connections: outgoing, or incoming once the
 * peer has proved the secret (then only the acknowledgement is left). */
struct pending {
  int fd;
  bool outgoing;
  bool unix_socket;
  bool connecting; /* connect() in progress */
  bool done;
  int peer;
  int kind;
  int attempts;
  uint64_t retry_at;      /* outgoing, fd < 0: when to connect again */
  uint64_t refused_since; /* first of the connection refusals in a row, or 0 */
  int pfd;           /* index in the poll set, -1 when not polled */
  struct hora__hs hs;
  char last_error[200];
};

/* An accepted connection that has not yet proved the secret. */
struct stranger {
  int fd;
  bool unix_socket;
  uint64_t since;
  int pfd;
  struct hora__hs hs;
  char who[96];
};

struct plan {
  hora__comm *c;
  struct pending *socks;
  int nsocks, cap;
  int expected_in;  /* incoming connections still to arrive */
  uint8_t *want_in; /* [size * slots]: 1 while (peer, kind) is expected */
  struct stranger *half; /* [half_max] */
  int nhalf, half_max;
  uint64_t listen_resume_at; /* accepting paused (out of descriptors, no spare left) */
  int refused;
  char first_refused[256];
  uint64_t rng;
  struct pollfd *fds;
  int fds_cap;
};

static bool same_host(const hora__comm *c, int peer) {
  return c->net->peers[peer].host_index == c->net->peers[c->rank].host_index;
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

static size_t slot_of(int peer, int kind) {
  return (size_t)peer * HORA_CONN_SLOTS + (size_t)(kind - 1);
}

static const char *kind_name(int kind) {
  int k = (kind - 1) % HORA_CONN_KINDS + 1;
  return k == HORA_CONN_CTRL ? "control" : k == HORA_CONN_DATA ? "data" : "cross-host data";
}

/* ---- strangers ---- */

static void describe_peer(int fd, const struct sockaddr_storage *ss, char *who, size_t n) {
  if (ss->ss_family == AF_INET) {
    const struct sockaddr_in *sin = (const struct sockaddr_in *)ss;
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof(ip));
    snprintf(who, n, "%s:%d", ip, ntohs(sin->sin_port));
    return;
  }
  struct ucred cred;
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    snprintf(who, n, "a local process (pid %d, uid %u)", (int)cred.pid, (unsigned)cred.uid);
  } else {
    snprintf(who, n, "a local process");
  }
}

static void note_refusal(struct plan *p, const char *who, const char *why) {
  HORA_INFO("bootstrap: closed the connection from %s: %s", who, why);
  if (p->refused++ == 0) {
    snprintf(p->first_refused, sizeof(p->first_refused), "%s: %s", who, why);
  }
}

static void refuse(struct plan *p, int i, const char *why) {
  struct stranger *t = &p->half[i];
  note_refusal(p, t->who, why);
  close(t->fd);
  p->half[i] = p->half[--p->nhalf];
}

static void drop_oldest(struct plan *p, const char *why) {
  if (p->nhalf == 0) {
    return;
  }
  int oldest = 0;
  for (int i = 1; i < p->nhalf; i++) {
    if (p->half[i].since < p->half[oldest].since) {
      oldest = i;
    }
  }
  refuse(p, oldest, why);
}

/* Moves bytes of a handshake until the socket would block or a message is
 * complete. Returns 1 after a complete message (call again), 0 when it
 * would block or the handshake ended, -1 when the connection broke
 * (*err: errno, or 0 for EOF). */
static int pump(int fd, struct hora__hs *hs, int *err) {
  while (hs->state == HORA_HS_SEND || hs->state == HORA_HS_RECV) {
    uint8_t *buf;
    size_t n;
    int step = hs->step;
    bool sending = hs->state == HORA_HS_SEND;
    hora__hs_io(hs, &buf, &n);
    ssize_t r = sending ? send(fd, buf, n, MSG_NOSIGNAL) : recv(fd, buf, n, 0);
    if (r < 0) {
      if (errno == EINTR) {
        continue;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return 0;
      }
      *err = errno;
      return -1;
    }
    if (r == 0 && !sending) {
      *err = 0;
      return -1;
    }
    hora__hs_advance(hs, (size_t)r);
    if (hs->step != step || (hs->state != HORA_HS_SEND && hs->state != HORA_HS_RECV)) {
      return 1;
    }
  }
  return 0;
}

static int step_incoming(struct plan *p, int i);

/* A stranger's handshake moves; it leaves the table refused, or as one of
 * the planned connections once it has proved the secret. */
static int step_stranger(struct plan *p, int i) {
  hora__comm *c = p->c;
  struct stranger *t = &p->half[i];
  char why[200];
  for (;;) {
    int err = 0, r = pump(t->fd, &t->hs, &err);
    if (r < 0) {
      snprintf(why, sizeof(why), "%s before proving the job secret",
               err ? strerror(err) : "closed");
      refuse(p, i, why);
      return HORA_SUCCESS;
    }
    if (t->hs.state == HORA_HS_FAILED) {
      refuse(p, i, t->hs.why);
      return HORA_SUCCESS;
    }
    /* Refused at once when no such connection is expected (any more):
     * nothing to gain from going on. Checked again once authenticated. */
    if (t->hs.claimed && !p->want_in[slot_of(t->hs.peer, t->hs.kind)]) {
      snprintf(why, sizeof(why), "unexpected or duplicate %s connection from rank %d",
               kind_name(t->hs.kind), t->hs.peer);
      refuse(p, i, why);
      return HORA_SUCCESS;
    }
    if (t->hs.authenticated) {
      struct pending s = {.fd = t->fd, .unix_socket = t->unix_socket, .peer = t->hs.peer,
                          .kind = t->hs.kind, .pfd = -1, .hs = t->hs};
      p->half[i] = p->half[--p->nhalf];
      if (add_sock(p, s) != HORA_SUCCESS) {
        close(s.fd);
        return HORA_ERR_NO_MEMORY;
      }
      p->want_in[slot_of(s.peer, s.kind)] = 0;
      p->expected_in--;
      char name[160];
      HORA_DEBUG("bootstrap: %s connection from %s authenticated", kind_name(s.kind),
                 hora__peer_name(c->net, s.peer, name, sizeof(name)));
      return step_incoming(p, p->nsocks - 1);
    }
    if (r == 0) {
      return HORA_SUCCESS;
    }
  }
}

/* An authenticated incoming connection sends its acknowledgement. If the
 * connection breaks first, the slot opens again: the peer, which has not
 * seen the acknowledgement, connects again. */
static int step_incoming(struct plan *p, int i) {
  struct pending *s = &p->socks[i];
  int err = 0, r;
  while ((r = pump(s->fd, &s->hs, &err)) > 0) {
  }
  if (s->hs.state == HORA_HS_DONE) {
    s->done = true;
    return HORA_SUCCESS;
  }
  if (r < 0 || s->hs.state == HORA_HS_FAILED) {
    char name[160];
    HORA_DEBUG("bootstrap: the connection from %s broke before its acknowledgement",
               hora__peer_name(p->c->net, s->peer, name, sizeof(name)));
    close(s->fd);
    p->want_in[slot_of(s->peer, s->kind)] = 1;
    p->expected_in++;
    p->socks[i] = p->socks[--p->nsocks];
  }
  return HORA_SUCCESS;
}

/* The descriptor table is full and no stranger is left to drop: shed one
 * connection through the spare descriptor. */
static bool shed_one(struct plan *p, int lfd) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  if (hora__accept_shed(lfd, &p->c->proc->reserve_fd, &ss, &len) != 0) {
    return false;
  }
  char who[96] = "a local process";
  if (ss.ss_family == AF_INET) {
    describe_peer(-1, &ss, who, sizeof(who));
  }
  note_refusal(p, who, "out of file descriptors (EMFILE/ENFILE)");
  return true;
}

/* Out of descriptors or kernel memory: poll() would report the listener
 * ready again at once, so stop watching it for a moment instead. */
static int pause_accepting(struct plan *p, int err) {
  HORA_WARN("bootstrap: accept: %s; not accepting for %llu ms", strerror(err),
            (unsigned long long)(LISTEN_PAUSE_NS / 1000000));
  p->listen_resume_at = hora__now_ns() + LISTEN_PAUSE_NS;
  return HORA_SUCCESS;
}

static int accept_from(struct plan *p, int lfd, bool unix_socket) {
  hora__comm *c = p->c;
  for (int n = 0; n < ACCEPT_BATCH; n++) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int fd = accept4(lfd, (struct sockaddr *)&ss, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      int err = errno;
      switch (err) {
        case EAGAIN:
#if EWOULDBLOCK != EAGAIN
        case EWOULDBLOCK:
#endif
          return HORA_SUCCESS;
        case EINTR:
        case ECONNABORTED:
        case EPROTO:
        case ENETDOWN:
        case ENOPROTOOPT:
        case EHOSTDOWN:
        case ENONET:
        case EHOSTUNREACH:
        case ENETUNREACH:
          continue; /* that connection's trouble, not the listener's (accept(2)) */
        case EMFILE:
        case ENFILE:
          if (p->nhalf > 0) {
            drop_oldest(p, "dropped to free a file descriptor (EMFILE/ENFILE)");
            continue;
          }
          if (shed_one(p, lfd)) {
            continue;
          }
          return pause_accepting(p, err);
        case ENOBUFS:
        case ENOMEM:
          return pause_accepting(p, err);
        default:
          errno = err;
          return hora__error_errno(HORA_ERR_SYSTEM, "accept");
      }
    }
    if (p->nhalf == p->half_max) {
      drop_oldest(p, "dropped as the oldest of too many connections that have not proved "
                     "the job secret");
    }
    struct stranger *t = &p->half[p->nhalf++];
    t->fd = fd;
    t->unix_socket = unix_socket;
    t->since = hora__now_ns();
    t->pfd = -1;
    describe_peer(fd, &ss, t->who, sizeof(t->who));
    uint8_t nonce[HORA_HS_NONCE_LEN];
    int rc = random_bytes(nonce, sizeof(nonce), "handshake nonce");
    if (rc != HORA_SUCCESS) {
      close(fd);
      p->nhalf--;
      return rc;
    }
    hora__hs_acceptor(&t->hs, c->proc->secret, c->size, HORA_CONN_SLOTS, c->rank, nonce);
    /* A peer's hello is usually there already: answer it now. */
    HORA_CHECK(step_stranger(p, p->nhalf - 1));
  }
  return HORA_SUCCESS;
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
             kind_name(s->kind), hora__peer_name(p->c->net, s->peer, name, sizeof(name)), why,
             (unsigned long long)(wait / 1000000));
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
    hora__unix_address(c->proc->job_id, s->peer, &ss, &ulen);
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
      drop_oldest(p, "dropped to free a file descriptor (EMFILE/ENFILE)");
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
  HORA_CHECK(random_bytes(nonce, sizeof(nonce), "handshake nonce"));
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
    int err = 0, r = pump(s->fd, &s->hs, &err);
    if (r < 0) {
      snprintf(why, sizeof(why), "%s during the handshake",
               err ? strerror(err) : "closed by the peer");
      retry_later(p, s, why);
      return HORA_SUCCESS;
    }
    if (s->hs.state == HORA_HS_FAILED) {
      /* Whoever answered at the peer's address does not know the secret. */
      HORA_WARN("bootstrap: %s connection to %s: the other end %s", kind_name(s->kind),
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
  return kind != HORA_CONN_CTRL && c->proc->rdma &&
         (c->proc->ib_all || (c->proc->ib_remote && !same_host(c, peer)));
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
    HORA_CHECK(add_sock(p, s));
    return start_connect(p, &p->socks[p->nsocks - 1]);
  }
  size_t slot = slot_of(peer, kind);
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

/* The rank on the host `dir` steps along the cross ring with this rank's
 * local rank (hosts are homogeneous when this is used). */
static int cross_peer(const hora__comm *c, int dir) {
  int h = (c->cross_rank + dir + c->cross_size) % c->cross_size;
  for (int r = 0; r < c->size; r++) {
    if (c->net->peers[r].host_index == h && c->net->peers[r].local_rank == c->local_rank) {
      return r;
    }
  }
  return -1;
}

static bool hosts_homogeneous(const hora__comm *c) {
  for (int r = 0; r < c->size; r++) {
    int n = 0;
    for (int q = 0; q < c->size; q++) {
      n += c->net->peers[q].host_index == c->net->peers[r].host_index;
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

static int connect_all(hora__comm *c, const int *ctrl_peers, int nctrl_peers) {
  struct plan p = {.c = c};
  int rc = HORA_SUCCESS;
  hora__conn **setting_up = NULL;
  int nsetting = 0;
  p.rng = hora__now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)c->rank;
  p.rng |= 1;
  p.want_in = hora__calloc((size_t)c->size * HORA_CONN_SLOTS, 1);
  if (!p.want_in) {
    return HORA_ERR_NO_MEMORY;
  }
  /* Kept for EMFILE, during the bootstrap and after (hora__accept_shed). */
  if (c->proc->reserve_fd < 0) {
    c->proc->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
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
    HORA_CHECK_GOTO(plan_connection(&p, cross_peer(c, 1), HORA_CONN_CROSS), rc, out);
    HORA_CHECK_GOTO(plan_connection(&p, cross_peer(c, -1), HORA_CONN_CROSS), rc, out);
  }
  p.half_max = HALF_OPEN_MAX + p.expected_in;
  p.half = hora__calloc((size_t)p.half_max, sizeof(*p.half));
  if (!p.half) {
    rc = HORA_ERR_NO_MEMORY;
    goto out;
  }
  uint64_t deadline = hora__now_ns() + (uint64_t)(hora__params.CONNECT_TIMEOUT_SECONDS * 1e9);
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
        refuse(&p, i, "did not prove the job secret within 1 s");
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
        HORA_CHECK_GOTO(step_incoming(&p, i), rc, out);
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
      HORA_CHECK_GOTO(step_stranger(&p, i), rc, out);
      i -= p.nhalf < before;
    }
    if (p.fds[0].revents) {
      HORA_CHECK_GOTO(accept_from(&p, c->proc->tcp_listen_fd, false), rc, out);
    }
    if (p.fds[1].revents) {
      HORA_CHECK_GOTO(accept_from(&p, c->proc->unix_listen_fd, true), rc, out);
    }
  }

  /* Whoever has not proved the secret by now never will be needed. */
  while (p.nhalf > 0) {
    refuse(&p, p.nhalf - 1, "the bootstrap ended before it proved the job secret");
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
    refuse(&p, p.nhalf - 1, "the bootstrap ended before it proved the job secret");
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
  int err = MPI_Allgather(&digest, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, c->proc->mpi);
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
    err = MPI_Bcast(&lens[i], 1, MPI_INT, roots[i], c->proc->mpi);
    theirs[i] = err == MPI_SUCCESS ? hora__malloc((size_t)lens[i] + 1) : NULL;
    if (theirs[i] && c->rank == roots[i]) {
      memcpy(theirs[i], mine, len);
    }
    /* A failed allocation still joins the broadcast, into a scratch byte. */
    char scratch;
    if (err == MPI_SUCCESS) {
      err = MPI_Bcast(theirs[i] ? theirs[i] : &scratch, theirs[i] ? lens[i] : 0, MPI_CHAR,
                      roots[i], c->proc->mpi);
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

static int comm_connect(hora__comm *c, MPI_Comm local, const int *ctrl_peers, int nctrl_peers);

static int comm_create(MPI_Comm world, const int *ctrl_peers, int nctrl_peers, hora__comm *c) {
  MPI_CHECK(MPI_Comm_dup(world, &c->proc->mpi));
  MPI_Comm_set_errhandler(c->proc->mpi, MPI_ERRORS_RETURN);
  MPI_Comm_rank(c->proc->mpi, &c->rank);
  MPI_Comm_size(c->proc->mpi, &c->size);
  c->net->rank = c->rank;
  c->net->size = c->size;
  hora__log_set_rank(c->rank);
  HORA_CHECK(check_job_settings(c));
  MPI_Comm local = MPI_COMM_NULL;
  int rc = topology_from_mpi(c, &local);
  if (rc == HORA_SUCCESS) {
    rc = comm_connect(c, local, ctrl_peers, nctrl_peers);
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
  HORA_CHECK(hora__listen_tcp(*ip, &c->proc->tcp_listen_fd, &c->proc->tcp_addr));
  HORA_CHECK(hora__listen_unix(c->proc->job_id, c->rank, &c->proc->unix_listen_fd));
  c->net->peers = hora__calloc((size_t)c->size, sizeof(*c->net->peers));
  c->proc->ctrl = hora__calloc((size_t)c->size, sizeof(*c->proc->ctrl));
  c->proc->data = hora__calloc((size_t)c->size, sizeof(*c->proc->data));
  c->proc->cross = hora__calloc((size_t)c->size, sizeof(*c->proc->cross));
  if (!c->net->peers || !c->proc->ctrl || !c->proc->data || !c->proc->cross) {
    return HORA_ERR_NO_MEMORY;
  }
  return HORA_SUCCESS;
}

static int comm_connect(hora__comm *c, MPI_Comm local, const int *ctrl_peers, int nctrl_peers) {
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
  me.ipv4 = c->proc->tcp_addr.sin_addr.s_addr;
  me.port = c->proc->tcp_addr.sin_port;
  MPI_CHECK(MPI_Allgather(&me, (int)sizeof(me), MPI_BYTE, c->net->peers, (int)sizeof(me), MPI_BYTE,
                          c->proc->mpi));
  char ipstr[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &ip, ipstr, sizeof(ipstr));
  HORA_DEBUG("bootstrap: listening on %s:%d (%s) and @hora.%s.%d", ipstr,
             ntohs(c->proc->tcp_addr.sin_port), ifname, c->proc->job_id, c->rank);

  /* RDMA: forced (also within hosts) or, by default, between hosts when
   * every host has an active port. The ranks must agree. */
  bool forced_ib = strcmp(hora__params.TRANSPORT, "ib") == 0;
  bool auto_transport = strcmp(hora__params.TRANSPORT, "auto") == 0;
  int ib_here = 0, ib_everywhere = 0;
  const struct hora__transport *ib = hora__transport_find("ib");
  if (ib && (forced_ib || (auto_transport && c->cross_size > 1))) {
    ib_here = !ib->available || ib->available();
  }
  MPI_CHECK(MPI_Allreduce(&ib_here, &ib_everywhere, 1, MPI_INT, MPI_MIN, c->proc->mpi));
  if (forced_ib && !ib_everywhere) {
    return hora__error(HORA_ERR_NOT_SUPPORTED,
                       "HORA_TRANSPORT=ib, but %s%s",
                       HORA_HAVE_VERBS ? "" : "this build has no verbs support (configure --with-verbs)",
                       HORA_HAVE_VERBS ? (ib_here ? "another rank's host has no active RDMA port"
                                                  : "this host has no active RDMA port")
                                       : "");
  }
  c->proc->ib_all = forced_ib;
  c->proc->ib_remote = forced_ib || (auto_transport && ib_everywhere);
  c->proc->rdma = c->proc->ib_remote ? ib : NULL;

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
  MPI_CHECK(MPI_Allreduce(&streams, &c->proc->tcp_streams, 1, MPI_INT, MPI_MIN, c->proc->mpi));
  HORA_CHECK(agree(c, connect_all(c, ctrl_peers, nctrl_peers), "connections"));
  c->world_ring.pos = c->rank;
  c->world_ring.size = c->size;
  if (c->size > 1) {
    c->world_ring.next = c->proc->data[(c->rank + 1) % c->size];
    c->world_ring.prev = c->proc->data[(c->rank + c->size - 1) % c->size];
  }
  if (hierarchical) {
    c->cross_ring.next = c->proc->cross[cross_peer(c, 1)];
    c->cross_ring.prev = c->proc->cross[cross_peer(c, -1)];
  }
  int shm_rc = HORA_SUCCESS;
  if (!forced_tcp && c->local_size > 1) {
    shm_rc = hora__shm_create(c->net, local, &c->proc->shm);
  }
  HORA_CHECK(agree(c, shm_rc, "shared memory"));
  /* The algorithms must agree job-wide: if some host could not share
   * memory, every rank uses the rings. */
  int ok = forced_tcp || c->local_size == 1 || c->proc->shm != NULL, all_ok = 0;
  MPI_CHECK(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, c->proc->mpi));
  if (!all_ok) {
    hora__shm_destroy(c->proc->shm);
    c->proc->shm = NULL;
    hierarchical = false;
  }
  hora__coll_choose(c, c->proc->shm != NULL, hierarchical);
  c->proc->local_transport = c->local_size == 1 ? "none"
                      : c->proc->shm             ? "shm"
                      : forced_ib          ? "ib"
                      : forced_tcp         ? "tcp"
                                           : "tcp(unix)";
  const char *remote = c->proc->ib_remote ? "ib" : "tcp";
  c->proc->remote_transport = c->cross_size == 1 ? "none"
                        : hierarchical     ? (c->proc->ib_remote ? "ib(hierarchical)" : "tcp(hierarchical)")
                                           : remote;
  if (hierarchical && c->proc->ib_remote) {
    /* The cross-host rings reduce in this rank's two shared halves: with
     * them registered, slices move between hosts without a copy. */
    hora__comm_register(c, hora__shm_half(c->proc->shm, c->local_rank, 0),
                        2 * hora__shm_half_bytes(c->proc->shm), &c->proc->shm_reg);
  }
  c->proc->chunk_bytes = hora__params.CHUNK_SIZE;
  c->proc->single_copy_min = hora__params.SHM_SINGLE_COPY_MIN;
  c->net->stall_ns = (uint64_t)(hora__params.STALL_SHUTDOWN_TIME_SECONDS * 1e9);
  return HORA_SUCCESS;
}

int hora__comm_create(MPI_Comm world, const int *ctrl_peers, int nctrl_peers, hora__comm **out) {
  hora__comm *c = hora__calloc(1, sizeof(*c));
  struct hora__proc *proc = hora__calloc(1, sizeof(*proc));
  if (!c || !proc) {
    free(c);
    free(proc);
    return HORA_ERR_NO_MEMORY;
  }
  /* The job's world owns the process's side. */
  c->proc = proc;
  c->owns_proc = true;
  c->net = &proc->net;
  proc->stream = hora__transport_find("tcp");
  c->proc->tcp_listen_fd = c->proc->unix_listen_fd = c->proc->reserve_fd = -1;
  c->proc->mpi = MPI_COMM_NULL;
  int rc = comm_create(world, ctrl_peers, nctrl_peers, c);
  if (rc != HORA_SUCCESS) {
    hora__comm_destroy(c);
    return rc;
  }
  *out = c;
  return HORA_SUCCESS;
}

void hora__comm_disconnect(hora__comm *c) {
  if (c->proc->ctrl) {
    for (int r = 0; r < c->size; r++) {
      hora__ctrl_free(c->proc->ctrl[r]);
      c->proc->ctrl[r] = NULL;
    }
  }
  for (int k = 0; k < 2; k++) {
    hora__conn **v = k ? c->proc->cross : c->proc->data;
    for (int r = 0; v && r < c->size; r++) {
      if (v[r]) {
        v[r]->tp->close(v[r]);
        v[r] = NULL;
      }
    }
  }
  c->world_ring.next = c->world_ring.prev = NULL;
  c->cross_ring.next = c->cross_ring.prev = NULL;
  c->net->active = NULL;
  if (c->proc->tcp_listen_fd >= 0) {
    close(c->proc->tcp_listen_fd);
    c->proc->tcp_listen_fd = -1;
  }
  if (c->proc->unix_listen_fd >= 0) {
    close(c->proc->unix_listen_fd);
    c->proc->unix_listen_fd = -1;
  }
  if (c->proc->reserve_fd >= 0) {
    close(c->proc->reserve_fd);
    c->proc->reserve_fd = -1;
  }
}

void hora__comm_register(hora__comm *c, void *buf, size_t len, void **handle) {
  *handle = NULL;
  const struct hora__transport *tp = c->proc->rdma;
  if (tp && tp->zero_copy && len > 0 && tp->reg_mem(c->net, buf, len, handle) != HORA_SUCCESS) {
    HORA_WARN("RDMA registration of a %zu-byte buffer failed (%s); transfers into it are copied",
              len, hora_last_error());
    *handle = NULL;
  }
}

int hora__comm_register_device(hora__comm *c, void *buf, size_t len, int fd, uint64_t offset,
                               void **handle) {
  *handle = NULL;
  const struct hora__transport *tp = c->proc->rdma;
  if (!tp || !tp->reg_dmabuf) {
    return hora__error(HORA_ERR_NOT_SUPPORTED,
                       hora__transport_find("ib") ? "no RDMA connections to register GPU memory with"
                                                  : "built without RDMA (libibverbs)");
  }
  return tp->reg_dmabuf(c->net, buf, len, fd, offset, handle);
}

void hora__comm_deregister(hora__comm *c, void **handle) {
  if (*handle && c->proc->rdma) {
    c->proc->rdma->dereg_mem(c->net, *handle);
  }
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
  hora__comm_deregister(c, &c->proc->shm_reg);
  if (c->proc->mpi != MPI_COMM_NULL) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      MPI_Comm_free(&c->proc->mpi);
    }
  }
  hora__peer_maps_free(c->proc->peer_maps, c->local_size);
  free(c->proc->peer_ptrs);
  hora__shm_destroy(c->proc->shm);
  free(c->fusion);
  free(c->scratch);
  free(c->proc->bounce);
  free(c->net->peers);
  free(c->proc->ctrl);
  free(c->proc->data);
  free(c->proc->cross);
  if (c->owns_proc) {
    free(c->proc);
  }
  free(c);
}
