/* The elastic membership's connections (membership.c says how they are
 * used): dialling and accepting without blocking, the handshake of either
 * kind, frames queued out and read in whole, and the state machine's
 * outputs turned into frames on them. The listener's thread alone runs
 * this. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/bootstrap/membership_fsm.h"
#include "comm/transport/handshake.h"
#include "comm/transport/socket.h"
#include "comm/bootstrap/membership_driver.h"

void hora__mbd_wake(struct hora__membership *m) {
  uint64_t one = 1;
  (void)!write(m->wake_fd, &one, sizeof(one));
}

static void addr_str(uint32_t ip, uint16_t port, char *out, size_t n) {
  char s[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &ip, s, sizeof(s));
  snprintf(out, n, "%s:%u", s, (unsigned)port);
}

/* The keys a connection proves: the door's from the secret, the members'
 * from the secret and the job. */
void hora__mbd_derive_key(const uint8_t *secret, const char *label, uint64_t job,
                       uint8_t out[HORA_SECRET_LEN]) {
  uint8_t in[16 + HORA_SECRET_LEN + 8];
  memcpy(in, label, 16);
  memcpy(in + 16, secret, HORA_SECRET_LEN);
  for (int i = 0; i < 8; i++) {
    in[16 + HORA_SECRET_LEN + i] = (uint8_t)(job >> (56 - 8 * i));
  }
  SHA256(in, sizeof(in), out);
  OPENSSL_cleanse(in, sizeof(in));
}

/* ---- connections -------------------------------------------------------------------- */

void hora__mbd_conn_close(struct hora__membership *m, int i) {
  struct conn *c = m->c[i];
  close(c->fd);
  for (int k = 0; k < c->nq; k++) {
    free(c->q[k].p);
  }
  free(c->q);
  free(c->body);
  free(c);
  m->c[i] = m->c[--m->nc];
}

static struct conn *conn_add(struct hora__membership *m, int fd, bool out, uint32_t ip,
                             uint16_t port, uint64_t now) {
  if (m->nc == m->capc) {
    int cap = m->capc ? 2 * m->capc : 32;
    struct conn **p = realloc(m->c, (size_t)cap * sizeof(*p));
    if (!p) {
      close(fd);
      return NULL;
    }
    m->c = p;
    m->capc = cap;
  }
  struct conn *c = calloc(1, sizeof(*c));
  if (!c) {
    close(fd);
    return NULL;
  }
  m->c[m->nc++] = c;
  c->fd = fd;
  c->out = out;
  c->ip = ip;
  c->port = port;
  c->last_io = now;
  return c;
}

void hora__mbd_add_hint(struct hora__membership *m, uint32_t ip, uint16_t port,
                     enum hora__mb_unreachable why) {
  if (m->nhints < (int)(sizeof(m->hints) / sizeof(m->hints[0]))) {
    m->hints[m->nhints++] = (struct hint){ip, port, why};
  }
}

static int start_handshake(struct hora__membership *m, struct conn *c, uint64_t now) {
  uint8_t nonce[HORA_HS_NONCE_LEN];
  HORA_CHECK(hora__boot_random_bytes(nonce, sizeof(nonce), "membership nonce"));
  if (c->out) {
    hora__hs_connector(&c->hs, c->kind == K_DOOR ? m->door_key : m->member_key, HS_SIZE, 2, 1, 0,
                       c->kind, nonce);
  } else {
    hora__hs_acceptor_keys(&c->hs, m->keys, HS_SIZE, 2, 0, nonce);
  }
  c->state = C_SHAKING;
  c->deadline = now + IO_NS;
  return HORA_SUCCESS;
}


/* A frame for ip:port, on the connection of its kind (dialled if none). */
static void enqueue(struct hora__membership *m, uint32_t ip, uint16_t port, uint8_t *p, size_t len,
                    uint64_t now) {
  uint32_t type = len >= 4 ? ntohl(*(uint32_t *)p) : 0;
  int kind = m->has_key && !door_frame(type) ? K_MEMBER : K_DOOR;
  struct conn *c = NULL;
  for (int i = 0; i < m->nc; i++) {
    if (m->c[i]->out && m->c[i]->ip == ip && m->c[i]->port == port && m->c[i]->kind == kind) {
      c = m->c[i];
      break;
    }
  }
  if (!c) {
    if (m->nc >= CONN_MAX) {
      free(p);
      return;
    }
    int fd = hora__mb_start_connect(ip, port);
    if (fd < 0) {
      hora__mbd_add_hint(m, ip, port, errno == ECONNREFUSED ? HORA_MB_REFUSED : HORA_MB_SILENT);
      free(p);
      return;
    }
    c = conn_add(m, fd, true, ip, port, now);
    if (!c) {
      free(p);
      return;
    }
    c->kind = kind;
    c->state = C_CONNECTING;
    c->deadline = now + HORA_MB_PROBE_NS;
  }
  if (c->nq >= QUEUE_MAX) {
    free(p); /* the peer does not read: the machine sends again */
    return;
  }
  if (c->nq == c->capq) {
    int cap = c->capq ? 2 * c->capq : 8;
    struct frame *q = realloc(c->q, (size_t)cap * sizeof(*q));
    if (!q) {
      free(p);
      return;
    }
    c->q = q;
    c->capq = cap;
  }
  c->q[c->nq++] = (struct frame){p, len};
  if (c->state == C_OPEN && c->nq == 1) {
    /* Out now: a decision may end this process before the next turn. */
    (void)hora__mbd_write_frames(c, now);
  }
}

/* The machine's frames and decisions, taken (under mu). */
void hora__mbd_flush_locked(struct hora__membership *m, uint64_t now) {
  /* A newcomer learns the job's id when a commit names it, and may have to
   * take part in a reset before its join returns: key its connections now. */
  const struct hora__view *v = m->sm ? hora__mfsm_view(m->sm) : NULL;
  if (m->has_key && v && v->n && v->job != m->keyed_job) {
    hora__mbd_derive_key(m->secret, "hora-elastic-mb3", v->job, m->member_key);
    m->keyed_job = v->job;
  }
  for (int round = 0; round < 8 && m->sm; round++) {
    struct hora__mfsm_send s;
    while (hora__mfsm_take_send(m->sm, &s)) {
      enqueue(m, s.ip, s.port, s.frame, s.len, now);
    }
    struct hora__mfsm_event e;
    while (hora__mfsm_take_event(m->sm, &e)) {
      if (e.kind == HORA_MFSM_ASKED) {
        if (!m->in_reset && m->on_request) {
          m->on_request(m->on_request_arg, e.from);
        }
      } else if (m->busy) {
        m->result = e;
        m->have_result = true;
        m->result_out = false;
        m->result_at = now;
      }
    }
    if (!m->nhints) {
      break;
    }
    int n = m->nhints;
    m->nhints = 0;
    for (int i = 0; i < n; i++) {
      hora__mfsm_unreachable(m->sm, now, m->hints[i].ip, m->hints[i].port, m->hints[i].why);
    }
  }
  m->nhints = 0;
}

static void deliver_frame(struct hora__membership *m, struct conn *c, uint64_t now) {
  uint32_t type = ntohl(*(uint32_t *)c->hdr);
  size_t len = HORA_MB_HEADER + c->body_len;
  uint8_t *f = malloc(len);
  if (!f) {
    return;
  }
  memcpy(f, c->hdr, HORA_MB_HEADER);
  if (c->body_len) {
    memcpy(f + HORA_MB_HEADER, c->body, c->body_len);
  }
  pthread_mutex_lock(&m->mu);
  bool allowed = !m->has_key || (c->hs.kind == K_MEMBER) == !door_frame(type);
  if (m->sm && allowed) {
    hora__mfsm_receive(m->sm, now, c->ip, f, len);
    hora__mbd_flush_locked(m, now);
  }
  pthread_mutex_unlock(&m->mu);
  free(f);
}

/* Reads what an accepted connection has; false when it is to be closed. */
static bool read_frames(struct hora__membership *m, struct conn *c, uint64_t now) {
  for (int frames = 0; frames < 64; frames++) {
    bool in_body = c->got >= HORA_MB_HEADER;
    uint8_t *dst = in_body ? c->body + (c->got - HORA_MB_HEADER) : c->hdr + c->got;
    size_t want = in_body ? HORA_MB_HEADER + c->body_len - c->got : HORA_MB_HEADER - c->got;
    ssize_t r = want ? recv(c->fd, dst, want, 0) : 0;
    if (want && r == 0) {
      return false;
    }
    if (want && r < 0) {
      return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    }
    c->got += (size_t)r;
    c->last_io = now;
    if (c->got == HORA_MB_HEADER) {
      uint32_t len = ntohl(*(uint32_t *)(c->hdr + 4));
      if (len > HORA_MB_FRAME_MAX) {
        char who[64];
        addr_str(c->ip, 0, who, sizeof(who));
        HORA_WARN("elastic: a %u-byte membership frame from %s: connection closed", len, who);
        return false;
      }
      uint8_t *b = len ? realloc(c->body, len) : c->body;
      if (len && !b) {
        return false;
      }
      c->body = b;
      c->body_len = len;
    }
    if (c->got == HORA_MB_HEADER + c->body_len && c->got >= HORA_MB_HEADER) {
      deliver_frame(m, c, now);
      c->got = 0;
      c->body_len = 0;
    }
  }
  return true;
}

/* Writes what a dialled connection has queued; false when it broke. */
bool hora__mbd_write_frames(struct conn *c, uint64_t now) {
  while (c->nq) {
    struct frame *f = &c->q[0];
    ssize_t r = send(c->fd, f->p + c->qoff, f->len - c->qoff, MSG_NOSIGNAL);
    if (r < 0) {
      return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    }
    c->last_io = now;
    c->qoff += (size_t)r;
    if (c->qoff == f->len) {
      free(f->p);
      memmove(c->q, c->q + 1, (size_t)(c->nq - 1) * sizeof(*c->q));
      c->nq--;
      c->qoff = 0;
    }
  }
  return true;
}

/* One connection's turn; false when it is to be closed. */
bool hora__mbd_step_conn(struct hora__membership *m, struct conn *c, short revents, uint64_t now) {
  if (c->state == C_CONNECTING) {
    if (!(revents & (POLLOUT | POLLERR | POLLHUP))) {
      return true;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err == 0 && hora__socket_is_self_connected(c->fd)) {
      err = ECONNREFUSED; /* nobody listens there */
    }
    if (err) {
      hora__mbd_add_hint(m, c->ip, c->port, err == ECONNREFUSED ? HORA_MB_REFUSED : HORA_MB_SILENT);
      return false;
    }
    hora__socket_tune(c->fd, true, 0);
    if (!m->has_key) {
      c->state = C_OPEN;
    } else if (start_handshake(m, c, now) != HORA_SUCCESS) {
      return false;
    }
  }
  if (c->state == C_SHAKING) {
    int err = 0, step = c->hs.step;
    if (hora__boot_pump(c->fd, &c->hs, &err) < 0) {
      if (c->out) {
        hora__mbd_add_hint(m, c->ip, c->port, HORA_MB_REFUSED);
      } else if (c->hs.claimed && c->hs.step >= 2 && step >= 2) {
        /* (One that closed before the challenge went out, as one does that
         * gave up waiting for a stopped process, is no news.) */
        /* A connector that leaves after our challenge could not verify it. */
        char who[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &c->ip, who, sizeof(who));
        if (c->hs.kind == K_MEMBER && !m->keyed_job) {
          HORA_INFO("elastic: a member's connection from %s came before this process knew the "
                    "job's key: closed (it dials again)", who);
        } else {
          HORA_WARN("elastic: refused a connection from %s: it left after the challenge: it holds "
                  "another secret (another job, or a different HORA_SECRET_FILE)", who);
        }
      }
      return false;
    }
    if (c->hs.state == HORA_HS_FAILED) {
      char who[64];
      addr_str(c->ip, c->out ? c->port : 0, who, sizeof(who));
      if (c->out) {
        hora__mbd_add_hint(m, c->ip, c->port, HORA_MB_FOREIGN);
      } else {
        HORA_WARN("elastic: refused a connection from %s: %s", who, c->hs.why);
      }
      return false;
    }
    if (c->hs.state != HORA_HS_DONE) {
      return true;
    }
    c->state = C_OPEN;
    c->last_io = now;
  }
  if (c->out) {
    if (revents & POLLIN) { /* the peer never writes here: EOF or garbage */
      char junk[64];
      ssize_t r = recv(c->fd, junk, sizeof(junk), 0);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        return false;
      }
    }
    return hora__mbd_write_frames(c, now);
  }
  return !(revents & (POLLIN | POLLHUP | POLLERR)) || read_frames(m, c, now);
}

/* Too many connections: the oldest accepted one still proving nothing goes. */
static bool make_room(struct hora__membership *m) {
  int victim = -1;
  for (int i = 0; i < m->nc; i++) {
    if (!m->c[i]->out && m->c[i]->state != C_OPEN &&
        (victim < 0 || m->c[i]->last_io < m->c[victim]->last_io)) {
      victim = i;
    }
  }
  for (int i = 0; victim < 0 && i < m->nc; i++) {
    if (!m->c[i]->out && (victim < 0 || m->c[i]->last_io < m->c[victim]->last_io)) {
      victim = i;
    }
  }
  if (victim < 0) {
    return false;
  }
  hora__mbd_conn_close(m, victim);
  return true;
}

void hora__mbd_accept_from(struct hora__membership *m, int lfd, bool door, uint64_t now) {
  for (int k = 0; k < 64; k++) {
    struct sockaddr_in peer;
    socklen_t plen = sizeof(peer);
    int fd = accept4(lfd, (struct sockaddr *)&peer, &plen, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      return;
    }
    if (m->nc >= CONN_MAX && !make_room(m)) {
      close(fd);
      continue;
    }
    struct conn *c = conn_add(m, fd, false, peer.sin_addr.s_addr, ntohs(peer.sin_port), now);
    if (!c) {
      continue;
    }
    c->door = door;
    if (!m->has_key) {
      c->state = C_OPEN;
      c->deadline = now + IO_NS; /* its first frame */
    } else if (start_handshake(m, c, now) != HORA_SUCCESS) {
      hora__mbd_conn_close(m, m->nc - 1);
    }
  }
}

int hora__mb_start_connect(uint32_t ip, uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    return -1;
  }
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  sa.sin_addr.s_addr = ip;
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}
