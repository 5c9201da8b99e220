/* Elastic membership (see membership.h for the protocol and why it is
 * safe). Frames after the handshake: { u32 type, u32 len, payload }. */
#include "comm/bootstrap/membership_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/transport/socket.h"

/* ---- views, buffers, frames ----------------------------------------------------- */

void hora__mb_view_free(struct hora__view *v) {
  free(v->m);
  memset(v, 0, sizeof(*v));
}

int hora__mb_view_copy(struct hora__view *dst, const struct hora__view *src) {
  struct hora__member *m = src->n ? malloc((size_t)src->n * sizeof(*m)) : NULL;
  if (src->n && !m) {
    return HORA_ERR_NO_MEMORY;
  }
  if (src->n) {
    memcpy(m, src->m, (size_t)src->n * sizeof(*m));
  }
  free(dst->m);
  *dst = *src;
  dst->m = m;
  return HORA_SUCCESS;
}

int hora__mb_view_index(const struct hora__view *v, uint32_t id) {
  for (int i = 0; i < v->n; i++) {
    if (v->m[i].id == id) {
      return i;
    }
  }
  return -1;
}

void hora__mb_put(struct hora__mb_buf *b, const void *d, size_t n) {
  if (b->bad) {
    return;
  }
  if (b->len + n > b->cap) {
    size_t cap = HORA_MAX(b->cap * 2, b->len + n + 64);
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
      b->bad = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, d, n);
  b->len += n;
}
void hora__mb_put32(struct hora__mb_buf *b, uint32_t v) {
  v = htonl(v);
  hora__mb_put(b, &v, 4);
}
void hora__mb_put64(struct hora__mb_buf *b, uint64_t v) {
  hora__mb_put32(b, (uint32_t)(v >> 32));
  hora__mb_put32(b, (uint32_t)v);
}
void hora__mb_put_view(struct hora__mb_buf *b, const struct hora__view *v) {
  hora__mb_put64(b, v->epoch);
  hora__mb_put32(b, v->next_id);
  hora__mb_put32(b, (uint32_t)v->n);
  for (int i = 0; i < v->n; i++) {
    hora__mb_put32(b, v->m[i].id);
    hora__mb_put(b, &v->m[i].ip, 4);
    hora__mb_put32(b, v->m[i].port);
  }
}
bool hora__mb_get(struct hora__mb_buf *b, void *d, size_t n) {
  if (b->bad || b->off + n > b->len) {
    b->bad = true;
    memset(d, 0, n);
    return false;
  }
  memcpy(d, b->p + b->off, n);
  b->off += n;
  return true;
}
uint32_t hora__mb_get32(struct hora__mb_buf *b) {
  uint32_t v;
  hora__mb_get(b, &v, 4);
  return ntohl(v);
}
uint64_t hora__mb_get64(struct hora__mb_buf *b) {
  uint64_t hi = hora__mb_get32(b);
  return hi << 32 | hora__mb_get32(b);
}
bool hora__mb_get_view(struct hora__mb_buf *b, struct hora__view *v) {
  hora__mb_view_free(v);
  v->epoch = hora__mb_get64(b);
  v->next_id = hora__mb_get32(b);
  uint32_t n = hora__mb_get32(b);
  if (b->bad || n > (b->len - b->off) / 12) {
    b->bad = true;
    return false;
  }
  v->n = (int)n;
  v->m = n ? calloc(n, sizeof(*v->m)) : NULL;
  if (n && !v->m) {
    b->bad = true;
    v->n = 0;
    return false;
  }
  for (uint32_t i = 0; i < n; i++) {
    v->m[i].id = hora__mb_get32(b);
    hora__mb_get(b, &v->m[i].ip, 4);
    v->m[i].port = (uint16_t)hora__mb_get32(b);
  }
  return !b->bad;
}

int hora__mb_move_all(int fd, void *p, size_t n, bool out, uint64_t deadline) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = out ? send(fd, (char *)p + done, n - done, MSG_NOSIGNAL)
                    : recv(fd, (char *)p + done, n - done, 0);
    if (r > 0) {
      done += (size_t)r;
      continue;
    }
    if (r == 0 && !out) {
      return hora__error(HORA_ERR_PEER_LOST, "the connection closed");
    }
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return hora__error_errno(HORA_ERR_PEER_LOST, "the connection broke");
    }
    uint64_t t = hora__now_ns();
    if (t >= deadline) {
      return hora__error(HORA_ERR_TIMEOUT, "no answer in time");
    }
    struct pollfd pf = {fd, (short)(out ? POLLOUT : POLLIN), 0};
    poll(&pf, 1, (int)HORA_MIN((deadline - t) / 1000000ull + 1, 1000));
  }
  return HORA_SUCCESS;
}

int hora__mb_send_msg(int fd, uint32_t type, const struct hora__mb_buf *b, uint64_t deadline) {
  if (b && b->bad) {
    return HORA_ERR_NO_MEMORY;
  }
  uint32_t h[2] = {htonl(type), htonl(b ? (uint32_t)b->len : 0)};
  HORA_CHECK(hora__mb_move_all(fd, h, sizeof(h), true, deadline));
  return b && b->len ? hora__mb_move_all(fd, b->p, b->len, true, deadline) : HORA_SUCCESS;
}

/* One frame into *b (reset for reading); *type. */
int hora__mb_recv_msg(int fd, uint32_t *type, struct hora__mb_buf *b, uint64_t deadline) {
  uint32_t h[2];
  HORA_CHECK(hora__mb_move_all(fd, h, sizeof(h), false, deadline));
  uint32_t len = ntohl(h[1]);
  *type = ntohl(h[0]);
  if (len > FRAME_MAX) {
    return hora__error(HORA_ERR_PEER_LOST, "a %u-byte membership message", len);
  }
  b->len = b->off = 0;
  b->bad = false;
  if (len > b->cap) {
    uint8_t *p = realloc(b->p, len);
    if (!p) {
      return HORA_ERR_NO_MEMORY;
    }
    b->p = p;
    b->cap = len;
  }
  b->len = len;
  return len ? hora__mb_move_all(fd, b->p, len, false, deadline) : HORA_SUCCESS;
}

void hora__mb_send_refuse(int fd, int code, const char *msg) {
  struct hora__mb_buf b = {0};
  hora__mb_put32(&b, (uint32_t)code);
  hora__mb_put(&b, msg, strlen(msg));
  hora__mb_send_msg(fd, M_REFUSE, &b, hora__now_ns() + IO_NS);
  free(b.p);
}

static void membership_key(const uint8_t *secret, uint8_t out[HORA_SECRET_LEN]) {
  uint8_t in[HORA_SECRET_LEN + 16];
  memcpy(in, "hora-elastic0001", 16);
  memcpy(in + 16, secret, HORA_SECRET_LEN);
  SHA256(in, sizeof(in), out);
  OPENSSL_cleanse(in, sizeof(in));
}

/* The handshake proving the key, on a connected non-blocking socket. */
static int prove(struct hora__membership *m, int fd, bool connector, uint64_t deadline) {
  if (!m->has_key) {
    return HORA_SUCCESS;
  }
  struct hora__hs hs;
  uint8_t nonce[HORA_HS_NONCE_LEN];
  HORA_CHECK(hora__boot_random_bytes(nonce, sizeof(nonce), "membership nonce"));
  if (connector) {
    hora__hs_connector(&hs, m->key, HORA_DOOR_HS_SIZE, 1, 1, 0, 1, nonce); /* kind 1 of 1 */
  } else {
    hora__hs_acceptor(&hs, m->key, HORA_DOOR_HS_SIZE, 1, 0, nonce);
  }
  while (hs.state == HORA_HS_SEND || hs.state == HORA_HS_RECV) {
    int err = 0;
    if (hora__boot_pump(fd, &hs, &err) < 0) {
      /* A connector that leaves after our challenge could not verify it. */
      return !connector && hs.claimed
                 ? hora__error(HORA_ERR_INVALID_ARG, "it left after the challenge: it holds "
                               "another secret (another job, or a different HORA_SECRET_FILE)")
                 : hora__error(HORA_ERR_PEER_LOST, "closed during the handshake");
    }
    if (hs.state != HORA_HS_SEND && hs.state != HORA_HS_RECV) {
      break;
    }
    uint64_t t = hora__now_ns();
    if (t >= deadline) {
      return hora__error(HORA_ERR_TIMEOUT, "no handshake in time");
    }
    struct pollfd pf = {fd, (short)(hs.state == HORA_HS_SEND ? POLLOUT : POLLIN), 0};
    poll(&pf, 1, (int)HORA_MIN((deadline - t) / 1000000ull + 1, 1000));
  }
  if (hs.state == HORA_HS_FAILED) {
    return hora__error(HORA_ERR_INVALID_ARG, "did not prove the job's secret (%s)", hs.why);
  }
  return HORA_SUCCESS;
}

void hora__mb_addr_str(uint32_t ip, uint16_t port, char *out, size_t n) {
  char s[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &ip, s, sizeof(s));
  snprintf(out, n, "%s:%u", s, (unsigned)port);
}

/* A non-blocking connect started; *fd, or -1 with errno. */
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

/* Connected and proved within `ns`, or -1 (the peer is gone or refuses). */
int hora__mb_dial(struct hora__membership *m, uint32_t ip, uint16_t port, uint64_t ns) {
  uint64_t deadline = hora__now_ns() + ns;
  int fd = hora__mb_start_connect(ip, port);
  if (fd < 0) {
    return -1;
  }
  struct pollfd pf = {fd, POLLOUT, 0};
  int err = ETIMEDOUT;
  socklen_t len = sizeof(err);
  while (poll(&pf, 1, (int)(ns / 1000000ull)) < 0 && errno == EINTR) {
  }
  if (pf.revents) {
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  }
  if (err == 0 && hora__socket_is_self_connected(fd)) {
    err = ECONNREFUSED; /* nobody listens there */
  }
  int rc = err != 0 ? HORA_ERR_PEER_LOST : prove(m, fd, true, deadline + IO_NS);
  if (rc != HORA_SUCCESS) {
    close(fd);
    return rc == HORA_ERR_INVALID_ARG ? -2 : -1;
  }
  hora__socket_tune(fd, true, 0);
  return fd;
}

/* ---- the listener's thread -------------------------------------------------------- */

static void queue_push(struct queued **q, int *n, int *cap, const struct queued *e) {
  if (*n == *cap) {
    int c = *cap ? *cap * 2 : 16;
    struct queued *p = realloc(*q, (size_t)c * sizeof(*p));
    if (!p) {
      close(e->fd);
      free(e->view.m);
      return;
    }
    *q = p;
    *cap = c;
  }
  (*q)[(*n)++] = *e;
}

static void serve_one(struct hora__membership *m, int fd) {
  struct sockaddr_in peer;
  socklen_t plen = sizeof(peer);
  char who[64] = "?";
  if (getpeername(fd, (struct sockaddr *)&peer, &plen) == 0) {
    hora__mb_addr_str(peer.sin_addr.s_addr, ntohs(peer.sin_port), who, sizeof(who));
  }
  uint64_t deadline = hora__now_ns() + IO_NS;
  int rc = prove(m, fd, false, deadline);
  struct hora__mb_buf b = {0};
  uint32_t type = 0;
  if (rc == HORA_SUCCESS) {
    rc = hora__mb_recv_msg(fd, &type, &b, deadline);
  }
  if (rc != HORA_SUCCESS) {
    /* A probe (connect, then close) says nothing: only a wrong proof is news. */
    if (rc == HORA_ERR_INVALID_ARG) {
      HORA_WARN("elastic: refused a connection from %s: %s", who, hora__error_message());
    }
    close(fd);
    free(b.p);
    return;
  }
  struct queued e = {.fd = fd};
  pthread_mutex_lock(&m->mu);
  if (type == M_RESET) {
    e.id = hora__mb_get32(&b);
    e.promised = hora__mb_get64(&b);
    hora__mb_get(&b, &e.ip, 4);
    e.port = (uint16_t)hora__mb_get32(&b);
    hora__mb_get_view(&b, &e.view);
    if (b.bad) {
      HORA_WARN("elastic: a malformed reset request from %s", who);
      close(fd);
      free(e.view.m);
    } else if (m->view.n > 0 && e.view.epoch < m->view.epoch &&
               hora__mb_view_index(&m->view, e.id) < 0) {
      /* Not in the membership that followed its own: it was left out. */
      char msg[200];
      snprintf(msg, sizeof(msg), "elastic: this process (id %u) was left out of the job's "
               "membership %llu", e.id, (unsigned long long)m->view.epoch);
      hora__mb_send_refuse(fd, HORA_ERR_PEER_LOST, msg);
      close(fd);
      free(e.view.m);
    } else {
      bool news = !m->in_reset && m->on_request && e.view.epoch >= m->view.epoch &&
                  hora__mb_view_index(&m->view, e.id) >= 0;
      queue_push(&m->resets, &m->nresets, &m->cap_resets, &e);
      if (news) {
        m->on_request(m->on_request_arg, e.id);
      }
      uint64_t one = 1;
      (void)!write(m->wake_fd, &one, sizeof(one));
    }
  } else if (type == M_JOIN) {
    hora__mb_get(&b, &e.ip, 4);
    e.port = (uint16_t)hora__mb_get32(&b);
    int me = hora__mb_view_index(&m->view, m->my_id);
    int max = (int)hora__params.ELASTIC_MAX_SIZE;
    if (b.bad) {
      close(fd);
    } else if (me != 0 && m->view.n > 0) {
      struct hora__mb_buf r = {0};
      hora__mb_put(&r, &m->view.m[0].ip, 4);
      hora__mb_put32(&r, m->view.m[0].port);
      hora__mb_send_msg(fd, M_REDIRECT, &r, hora__now_ns() + IO_NS);
      free(r.p);
      close(fd);
    } else if (max > 0 && m->view.n + m->njoins >= max) {
      char msg[256];
      snprintf(msg, sizeof(msg),
               "the job has %d ranks%s and HORA_ELASTIC_MAX_SIZE=%d: no more may join", m->view.n,
               m->njoins ? " and more waiting to join" : "", max);
      HORA_WARN("elastic: refused the process at %s asking to join: %s", who, msg);
      hora__mb_send_refuse(fd, HORA_ERR_INVALID_USAGE, msg);
      close(fd);
    } else {
      HORA_INFO("elastic: the process at %s asks to join; it is admitted at the next commit", who);
      queue_push(&m->joins, &m->njoins, &m->cap_joins, &e);
    }
  } else {
    HORA_WARN("elastic: refused a connection from %s: message %u is not a request", who, type);
    close(fd);
  }
  pthread_mutex_unlock(&m->mu);
  free(b.p);
}

/* The listener's thread alone opens and closes the door, so the descriptor
 * it polls is never closed (and its number reused) under it. */
static void apply_door(struct hora__membership *m) {
  pthread_mutex_lock(&m->mu);
  int port = m->want_door;
  pthread_mutex_unlock(&m->mu);
  if (m->door_fd >= 0 && port != m->door_port) {
    close(m->door_fd);
    m->door_fd = -1;
    m->door_port = 0;
  }
  if (port > 0 && m->door_fd < 0) { /* again each turn: the port may come free */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
        bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(fd, 64) == 0) {
      m->door_fd = fd;
      m->door_port = port;
      m->door_failed = 0;
      HORA_INFO("elastic: newcomers may ask to join at port %d", port);
    } else {
      if (port != m->door_failed) {
        HORA_WARN("elastic: cannot listen on the rendezvous port %d for newcomers (%s): they "
                  "cannot find the job there while it is taken", port, strerror(errno));
      }
      m->door_failed = port;
      if (fd >= 0) {
        close(fd);
      }
    }
  }
}

/* Members waiting for this process to coordinate (it is still ending its
 * world, or computing) hear that it lives, so they do not go elsewhere. */
static void beat_queued(struct hora__membership *m) {
  uint64_t t = hora__now_ns();
  if (t - m->last_beat < BEAT_NS) {
    return;
  }
  m->last_beat = t;
  uint32_t h[2] = {htonl(M_BEAT), 0};
  pthread_mutex_lock(&m->mu);
  for (int i = 0; i < m->nresets; i++) {
    ssize_t r = send(m->resets[i].fd, h, sizeof(h), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r >= 0 && r != (ssize_t)sizeof(h)) {
      /* A partial frame would garble the stream: drop this one. */
      r = -1;
      errno = EPIPE;
    }
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      close(m->resets[i].fd);
      free(m->resets[i].view.m);
      m->resets[i--] = m->resets[--m->nresets];
    }
  }
  pthread_mutex_unlock(&m->mu);
}

static void *listener_main(void *arg) {
  struct hora__membership *m = arg;
  for (;;) {
    pthread_mutex_lock(&m->mu);
    bool stop = m->stop;
    pthread_mutex_unlock(&m->mu);
    if (stop) {
      break;
    }
    apply_door(m);
    int door = m->door_fd;
    struct pollfd pf[3] = {{m->lfd, POLLIN, 0}, {m->wake_fd, POLLIN, 0}, {door, POLLIN, 0}};
    int ready = poll(pf, door >= 0 ? 3 : 2, (int)(BEAT_NS / 1000000ull));
    beat_queued(m);
    if (ready <= 0) {
      continue;
    }
    if (pf[1].revents) {
      uint64_t v;
      (void)!read(m->wake_fd, &v, sizeof(v));
    }
    for (int k = 0; k < 3; k += 2) {
      if (pf[k].revents & POLLIN) {
        int fd = accept4(pf[k].fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
          serve_one(m, fd);
        }
      }
    }
  }
  return NULL;
}

static void wake(struct hora__membership *m) {
  uint64_t one = 1;
  (void)!write(m->wake_fd, &one, sizeof(one));
}

int hora__membership_open(const uint8_t *key, struct hora__membership **out) {
  *out = NULL;
  struct hora__membership *m = hora__calloc(1, sizeof(*m));
  if (!m) {
    return HORA_ERR_NO_MEMORY;
  }
  m->lfd = m->door_fd = m->wake_fd = -1;
  pthread_mutex_init(&m->mu, NULL);
  if (key) {
    m->has_key = true;
    membership_key(key, m->key);
  }
  struct in_addr any = {htonl(INADDR_ANY)};
  struct sockaddr_in bound;
  int rc = hora__listen_tcp(any, &m->lfd, &bound);
  if (rc == HORA_SUCCESS) {
    m->my_port = ntohs(bound.sin_port);
    m->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (m->wake_fd < 0) {
      rc = hora__error_errno(HORA_ERR_SYSTEM, "eventfd (elastic)");
    }
  }
  if (rc == HORA_SUCCESS) {
    if (pthread_create(&m->thread, NULL, listener_main, m) != 0) {
      rc = hora__error(HORA_ERR_SYSTEM, "cannot start the elastic listener's thread");
    } else {
      m->thread_started = true;
    }
  }
  if (rc != HORA_SUCCESS) {
    hora__membership_close(m);
    return rc;
  }
  *out = m;
  return HORA_SUCCESS;
}

void hora__mb_drop_queue(struct queued *q, int n) {
  for (int i = 0; i < n; i++) {
    if (q[i].fd >= 0) {
      close(q[i].fd);
    }
    free(q[i].view.m);
  }
}

void hora__membership_close(struct hora__membership *m) {
  if (!m) {
    return;
  }
  if (m->thread_started) {
    pthread_mutex_lock(&m->mu);
    m->stop = true;
    pthread_mutex_unlock(&m->mu);
    wake(m);
    pthread_join(m->thread, NULL);
  }
  int fds[] = {m->lfd, m->door_fd, m->wake_fd};
  for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++) {
    if (fds[i] >= 0) {
      close(fds[i]);
    }
  }
  hora__mb_drop_queue(m->resets, m->nresets);
  hora__mb_drop_queue(m->joins, m->njoins);
  free(m->resets);
  free(m->joins);
  hora__mb_view_free(&m->view);
  hora__mb_view_free(&m->accepted);
  OPENSSL_cleanse(m->key, sizeof(m->key));
  pthread_mutex_destroy(&m->mu);
  free(m);
}

int hora__membership_start(struct hora__membership *m, struct hora__rdv *rdv, uint64_t epoch,
                           uint32_t my_ip) {
  uint8_t mine[8], *all = hora__calloc((size_t)rdv->size, 8);
  if (!all) {
    return HORA_ERR_NO_MEMORY;
  }
  uint32_t port = htonl(m->my_port);
  memcpy(mine, &my_ip, 4);
  memcpy(mine + 4, &port, 4);
  int rc = hora__rdv_allgather(rdv, mine, sizeof(mine), all);
  struct hora__view v = {.epoch = epoch, .next_id = (uint32_t)rdv->size, .n = rdv->size};
  v.m = rc == HORA_SUCCESS ? hora__calloc((size_t)rdv->size, sizeof(*v.m)) : NULL;
  if (rc == HORA_SUCCESS && !v.m) {
    rc = HORA_ERR_NO_MEMORY;
  }
  for (int r = 0; rc == HORA_SUCCESS && r < rdv->size; r++) {
    v.m[r].id = (uint32_t)r;
    memcpy(&v.m[r].ip, all + 8 * r, 4);
    memcpy(&port, all + 8 * r + 4, 4);
    v.m[r].port = (uint16_t)ntohl(port);
  }
  free(all);
  if (rc == HORA_SUCCESS) {
    pthread_mutex_lock(&m->mu);
    hora__mb_view_free(&m->view);
    m->view = v;
    m->my_ip = my_ip;
    m->my_id = (uint32_t)rdv->rank;
    pthread_mutex_unlock(&m->mu);
  }
  return rc;
}

bool hora__port_in_use(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return false;
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  bool used = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno == EADDRINUSE;
  close(fd);
  return used;
}

void hora__membership_door(struct hora__membership *m, int port) {
  pthread_mutex_lock(&m->mu);
  m->want_door = port;
  pthread_mutex_unlock(&m->mu);
  wake(m);
}

void hora__membership_expect_reset(struct hora__membership *m) {
  pthread_mutex_lock(&m->mu);
  m->in_reset = true;
  pthread_mutex_unlock(&m->mu);
}

int hora__membership_waiting(struct hora__membership *m) {
  pthread_mutex_lock(&m->mu);
  int n = m->njoins;
  pthread_mutex_unlock(&m->mu);
  return n;
}

void hora__membership_on_request(struct hora__membership *m, void (*fn)(void *, uint32_t),
                                 void *arg) {
  pthread_mutex_lock(&m->mu);
  m->on_request = fn;
  m->on_request_arg = arg;
  pthread_mutex_unlock(&m->mu);
}

uint64_t hora__membership_epoch(struct hora__membership *m) {
  pthread_mutex_lock(&m->mu);
  uint64_t e = m->view.epoch;
  pthread_mutex_unlock(&m->mu);
  return e;
}

/* ---- a newcomer ------------------------------------------------------------------------ */

int hora__membership_join(struct hora__membership *m, const char *host, int port,
                          struct hora__agreed *out) {
  uint64_t deadline = hora__now_ns() + (uint64_t)(hora__params.ELASTIC_TIMEOUT_SECONDS * 1e9);
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
  char ps[16];
  snprintf(ps, sizeof(ps), "%d", port);
  int g = getaddrinfo(host, ps, &hints, &ai);
  if (g != 0) {
    return hora__error(HORA_ERR_INVALID_ARG, "elastic: cannot resolve %s: %s", host,
                       gai_strerror(g));
  }
  uint32_t ip = ((struct sockaddr_in *)ai->ai_addr)->sin_addr.s_addr;
  freeaddrinfo(ai);
  uint16_t at = (uint16_t)port;
  struct hora__mb_buf b = {0};
  int rc = HORA_ERR_TIMEOUT;
  char where[64];
  while (hora__now_ns() < deadline) {
    hora__mb_addr_str(ip, at, where, sizeof(where));
    int fd = hora__mb_dial(m, ip, at, PROBE_NS);
    if (fd == -2) {
      rc = hora__error(HORA_ERR_INVALID_ARG,
                       "elastic: the process listening at %s did not prove this job's secret: "
                       "another job, or a different HORA_SECRET_FILE/HORA_SECRET", where);
      break;
    }
    if (fd < 0) {
      struct timespec ts = {0, 100 * 1000000};
      nanosleep(&ts, NULL);
      continue;
    }
    struct sockaddr_in self;
    socklen_t len = sizeof(self);
    getsockname(fd, (struct sockaddr *)&self, &len);
    m->my_ip = self.sin_addr.s_addr;
    b.len = 0;
    hora__mb_put(&b, &m->my_ip, 4);
    hora__mb_put32(&b, m->my_port);
    uint32_t type = 0;
    rc = hora__mb_send_msg(fd, M_JOIN, &b, hora__now_ns() + IO_NS);
    if (rc == HORA_SUCCESS) {
      rc = hora__mb_recv_msg(fd, &type, &b, deadline);
    }
    close(fd);
    if (rc != HORA_SUCCESS) {
      if (rc == HORA_ERR_TIMEOUT) {
        break;
      }
      continue; /* the one holding the door went away: knock again */
    }
    if (type == M_REDIRECT) {
      hora__mb_get(&b, &ip, 4);
      at = (uint16_t)hora__mb_get32(&b);
      continue;
    }
    if (type == M_REFUSE) {
      int code = (int)hora__mb_get32(&b);
      char msg[600];
      size_t n = HORA_MIN(b.len - b.off, sizeof(msg) - 1);
      memcpy(msg, b.p + b.off, n);
      msg[n] = '\0';
      rc = hora__error(code > 0 && code < 64 ? code : HORA_ERR_PEER_LOST,
                       "elastic: the job at %s:%d refused to admit this process: %s", host, port,
                       msg);
      break;
    }
    if (type != M_COMMIT) {
      rc = hora__error(HORA_ERR_PEER_LOST, "elastic: unexpected message %u from %s", type, where);
      break;
    }
    (void)hora__mb_get64(&b);
    (void)hora__mb_get32(&b);
    uint32_t rport = hora__mb_get32(&b);
    struct hora__view nv = {0};
    if (!hora__mb_get_view(&b, &nv)) {
      hora__mb_view_free(&nv);
      rc = hora__error(HORA_ERR_PEER_LOST, "elastic: a malformed commit from %s", where);
      break;
    }
    int me = -1;
    for (int i = 0; i < nv.n; i++) {
      if (nv.m[i].ip == m->my_ip && nv.m[i].port == m->my_port) {
        me = i;
      }
    }
    if (me < 0) {
      hora__mb_view_free(&nv);
      rc = hora__error(HORA_ERR_PEER_LOST, "elastic: the commit from %s does not name this "
                       "process", where);
      break;
    }
    pthread_mutex_lock(&m->mu);
    m->my_id = nv.m[me].id;
    hora__mb_view_free(&m->view);
    m->view = nv;
    pthread_mutex_unlock(&m->mu);
    *out = (struct hora__agreed){.rank = me, .size = nv.n, .epoch = nv.epoch, .port = (int)rport,
                                 .listen_fd = -1};
    inet_ntop(AF_INET, &nv.m[0].ip, out->host, sizeof(out->host));
    rc = HORA_SUCCESS;
    break;
  }
  free(b.p);
  if (rc == HORA_ERR_TIMEOUT) {
    rc = hora__error(HORA_ERR_TIMEOUT, "elastic: not admitted by the job at %s:%d within %.0f s "
                     "(HORA_ELASTIC_TIMEOUT_SECONDS): no commit point came, or nothing listens "
                     "there", host, port, hora__params.ELASTIC_TIMEOUT_SECONDS);
  }
  return rc;
}
