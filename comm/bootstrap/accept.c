/* The bootstrap's incoming side: connections accepted on either listener
 * are strangers, held to a deadline and a bound (bootstrap.h) until they
 * prove the job secret; then, as planned connections, they send their
 * acknowledgement. Also the pump that moves any handshake's bytes. */
#include <arpa/inet.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/transport/socket.h"

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

/* The Unix listeners' names are public (/proc/net/unix), and every rank
 * of a job runs as one user: a local process of another one is refused
 * before it costs a handshake. */
static bool same_user(int fd, char *why, size_t n) {
  struct ucred cred;
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    snprintf(why, n, "its credentials cannot be read (SO_PEERCRED: %s)", strerror(errno));
    return false;
  }
  if (cred.uid != geteuid()) {
    snprintf(why, n, "it runs as uid %u, and this job as uid %u", (unsigned)cred.uid,
             (unsigned)geteuid());
    return false;
  }
  return true;
}

/* Only the first few are logged one by one (a flood must not fill the
 * log); the bootstrap's closing line counts them all. */
#define REFUSALS_LOGGED 8

static void note_refusal(struct plan *p, const char *who, const char *why) {
  if (p->refused < REFUSALS_LOGGED) {
    HORA_INFO("bootstrap: closed the connection from %s: %s%s", who, why,
              p->refused == REFUSALS_LOGGED - 1 ? " (further ones are only counted)" : "");
  }
  if (p->refused++ == 0) {
    snprintf(p->first_refused, sizeof(p->first_refused), "%s: %s", who, why);
  }
}

/* Whether a stranger's hello is the latest claim of a connection this
 * rank still expects: a rank's handshake under way (or a forgery, which its
 * proof unmasks within a round trip or the deadline). */
static bool claims_wanted(const struct plan *p, const struct stranger *t) {
  return t->hs.claimed && !t->superseded &&
         p->want_in[hora__boot_slot_of(t->hs.peer, t->hs.kind)];
}

void hora__boot_refuse(struct plan *p, int i, const char *why) {
  struct stranger *t = &p->half[i];
  note_refusal(p, t->who, why);
  close(t->fd);
  p->half[i] = p->half[--p->nhalf];
}

bool hora__boot_drop_oldest(struct plan *p, const char *why) {
  int oldest = -1;
  for (int i = 0; i < p->nhalf; i++) {
    if (!claims_wanted(p, &p->half[i]) &&
        (oldest < 0 || p->half[i].since < p->half[oldest].since)) {
      oldest = i;
    }
  }
  if (oldest < 0) {
    return false;
  }
  hora__boot_refuse(p, oldest, why);
  return true;
}

/* Moves bytes of a handshake until the socket would block or a message is
 * complete. Returns 1 after a complete message (call again), 0 when it
 * would block or the handshake ended, -1 when the connection broke
 * (*err: errno, or 0 for EOF). */
int hora__boot_pump(int fd, struct hora__hs *hs, int *err) {
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

/* A stranger's handshake moves; it leaves the table refused, or as one of
 * the planned connections once it has proved the secret. */
int hora__boot_step_stranger(struct plan *p, int i) {
  hora__comm *c = p->c;
  struct stranger *t = &p->half[i];
  char why[200];
  for (;;) {
    int err = 0, r = hora__boot_pump(t->fd, &t->hs, &err);
    if (r < 0) {
      snprintf(why, sizeof(why), "%s before proving the job secret",
               err ? strerror(err) : "closed");
      hora__boot_refuse(p, i, why);
      return HORA_SUCCESS;
    }
    if (t->hs.state == HORA_HS_FAILED) {
      hora__boot_refuse(p, i, t->hs.why);
      return HORA_SUCCESS;
    }
    /* Refused at once when no such connection is expected (any more):
     * nothing to gain from going on. Checked again once authenticated. */
    if (t->hs.claimed && !p->want_in[hora__boot_slot_of(t->hs.peer, t->hs.kind)]) {
      snprintf(why, sizeof(why), "unexpected or duplicate %s connection from rank %d",
               hora__boot_kind_name(t->hs.kind), t->hs.peer);
      hora__boot_refuse(p, i, why);
      return HORA_SUCCESS;
    }
    /* Only the latest claim of a connection is kept from being pushed out
     * (the rank itself makes one attempt at a time). Earlier ones stay, and
     * may still prove the secret, but as plain strangers: refusing the
     * newcomer instead would let a stranger that keeps sending the hello
     * first lock the rank out. */
    if (t->hs.claimed && !t->claim_seen) {
      t->claim_seen = true;
      for (int j = 0; j < p->nhalf; j++) {
        struct stranger *o = &p->half[j];
        if (j != i && o->hs.claimed && o->hs.peer == t->hs.peer && o->hs.kind == t->hs.kind) {
          o->superseded = true;
        }
      }
    }
    if (t->hs.authenticated) {
      struct pending s = {.fd = t->fd, .unix_socket = t->unix_socket, .peer = t->hs.peer,
                          .kind = t->hs.kind, .pfd = -1, .hs = t->hs};
      p->half[i] = p->half[--p->nhalf];
      if (hora__boot_add_sock(p, s) != HORA_SUCCESS) {
        close(s.fd);
        return HORA_ERR_NO_MEMORY;
      }
      p->want_in[hora__boot_slot_of(s.peer, s.kind)] = 0;
      p->expected_in--;
      char name[160];
      HORA_DEBUG("bootstrap: %s connection from %s authenticated", hora__boot_kind_name(s.kind),
                 hora__peer_name(c->net, s.peer, name, sizeof(name)));
      return hora__boot_step_incoming(p, p->nsocks - 1);
    }
    if (r == 0) {
      return HORA_SUCCESS;
    }
  }
}

/* An authenticated incoming connection sends its acknowledgement. If the
 * connection breaks first, the slot opens again: the peer, which has not
 * seen the acknowledgement, connects again. */
int hora__boot_step_incoming(struct plan *p, int i) {
  struct pending *s = &p->socks[i];
  int err = 0, r;
  while ((r = hora__boot_pump(s->fd, &s->hs, &err)) > 0) {
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
    p->want_in[hora__boot_slot_of(s->peer, s->kind)] = 1;
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

int hora__boot_accept_from(struct plan *p, int lfd, bool unix_socket) {
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
          if (hora__boot_drop_oldest(p, "dropped to free a file descriptor (EMFILE/ENFILE)")) {
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
    char why[160];
    if (unix_socket && !same_user(fd, why, sizeof(why))) {
      char who[96];
      describe_peer(fd, &ss, who, sizeof(who));
      note_refusal(p, who, why);
      close(fd);
      continue;
    }
    if (p->nhalf == p->half_max &&
        !hora__boot_drop_oldest(p, "dropped as the oldest of too many connections that have not "
                                   "claimed an expected connection")) {
      /* (Every entry a rank's handshake: cannot happen while the table
       * has HALF_OPEN_MAX more entries than expected connections.) */
      char who[96];
      describe_peer(fd, &ss, who, sizeof(who));
      note_refusal(p, who, "every half-open entry holds a handshake of an expected connection");
      close(fd);
      continue;
    }
    struct stranger *t = &p->half[p->nhalf++];
    *t = (struct stranger){.fd = fd, .unix_socket = unix_socket, .since = hora__now_ns(),
                           .pfd = -1};
    describe_peer(fd, &ss, t->who, sizeof(t->who));
    uint8_t nonce[HORA_HS_NONCE_LEN];
    int rc = hora__boot_random_bytes(nonce, sizeof(nonce), "handshake nonce");
    if (rc != HORA_SUCCESS) {
      close(fd);
      p->nhalf--;
      return rc;
    }
    hora__hs_acceptor(&t->hs, c->proc->secret, c->size, HORA_CONN_SLOTS, c->rank, nonce);
    /* A peer's hello is usually there already: answer it now. */
    HORA_CHECK(hora__boot_step_stranger(p, p->nhalf - 1));
  }
  return HORA_SUCCESS;
}
