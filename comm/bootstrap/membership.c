/* Elastic membership (see membership.h for the protocol and why it is
 * safe). Frames after the handshake: { u32 type, u32 len, payload }. */
#include "comm/bootstrap/membership.h"

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

enum {
  M_RESET = 1, /* member -> coordinator: id, promise, committed view, address */
  M_JOIN,      /* newcomer -> rank 0: its listener's address */
  M_PREPARE,   /* ballot */
  M_PROMISE,   /* ballot, accepted ballot, accepted view */
  M_NACK,      /* the higher promise */
  M_PROPOSE,   /* ballot, view */
  M_ACCEPTED,  /* ballot */
  M_COMMIT,    /* ballot, build?, rendezvous port, view */
  M_REFUSE,    /* code, text */
  M_REDIRECT,  /* the address to ask instead */
  M_BEAT,      /* the coordinator is alive */
};

#define FRAME_MAX (1u << 24)
#define PROBE_NS (2000ull * 1000000ull)   /* an unreachable member is gone after this */
#define BEAT_NS (500ull * 1000000ull)     /* the coordinator's heartbeat */
#define SILENCE_NS (4000ull * 1000000ull) /* a coordinator this silent is gone */
#define REPLY_NS (5000ull * 1000000ull)   /* for each answer during the phases */
#define IO_NS (1000ull * 1000000ull)      /* a connection's handshake and first frame */

struct queued {
  int fd;
  uint32_t id, ip;
  uint16_t port;
  uint64_t promised;
  struct hora__view view; /* its committed membership (M_RESET) */
};

struct hora__membership {
  int lfd, door_fd, door_port, wake_fd;
  uint32_t my_ip;
  uint16_t my_port;
  bool has_key;
  uint8_t key[HORA_SECRET_LEN];
  pthread_t thread;
  bool thread_started;
  pthread_mutex_t mu;
  /* Under mu: */
  bool stop, in_reset;
  uint32_t my_id;
  struct hora__view view;
  struct queued *resets, *joins;
  int nresets, njoins, cap_resets, cap_joins;
  void (*on_request)(void *, uint32_t);
  void *on_request_arg;
  /* Paxos state, used by the agreeing thread only. */
  uint64_t promised, accepted_b;
  struct hora__view accepted;
};

/* ---- views, buffers, frames ----------------------------------------------------- */

static void view_free(struct hora__view *v) {
  free(v->m);
  memset(v, 0, sizeof(*v));
}

static int view_copy(struct hora__view *dst, const struct hora__view *src) {
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

static int view_index(const struct hora__view *v, uint32_t id) {
  for (int i = 0; i < v->n; i++) {
    if (v->m[i].id == id) {
      return i;
    }
  }
  return -1;
}

struct buf {
  uint8_t *p;
  size_t len, cap, off;
  bool bad;
};

static void put(struct buf *b, const void *d, size_t n) {
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
static void put32(struct buf *b, uint32_t v) {
  v = htonl(v);
  put(b, &v, 4);
}
static void put64(struct buf *b, uint64_t v) {
  put32(b, (uint32_t)(v >> 32));
  put32(b, (uint32_t)v);
}
static void put_view(struct buf *b, const struct hora__view *v) {
  put64(b, v->epoch);
  put32(b, v->next_id);
  put32(b, (uint32_t)v->n);
  for (int i = 0; i < v->n; i++) {
    put32(b, v->m[i].id);
    put(b, &v->m[i].ip, 4);
    put32(b, v->m[i].port);
  }
}
static bool get(struct buf *b, void *d, size_t n) {
  if (b->bad || b->off + n > b->len) {
    b->bad = true;
    memset(d, 0, n);
    return false;
  }
  memcpy(d, b->p + b->off, n);
  b->off += n;
  return true;
}
static uint32_t get32(struct buf *b) {
  uint32_t v;
  get(b, &v, 4);
  return ntohl(v);
}
static uint64_t get64(struct buf *b) {
  uint64_t hi = get32(b);
  return hi << 32 | get32(b);
}
static bool get_view(struct buf *b, struct hora__view *v) {
  view_free(v);
  v->epoch = get64(b);
  v->next_id = get32(b);
  uint32_t n = get32(b);
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
    v->m[i].id = get32(b);
    get(b, &v->m[i].ip, 4);
    v->m[i].port = (uint16_t)get32(b);
  }
  return !b->bad;
}

static int move_all(int fd, void *p, size_t n, bool out, uint64_t deadline) {
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

static int send_msg(int fd, uint32_t type, const struct buf *b, uint64_t deadline) {
  if (b && b->bad) {
    return HORA_ERR_NO_MEMORY;
  }
  uint32_t h[2] = {htonl(type), htonl(b ? (uint32_t)b->len : 0)};
  HORA_CHECK(move_all(fd, h, sizeof(h), true, deadline));
  return b && b->len ? move_all(fd, b->p, b->len, true, deadline) : HORA_SUCCESS;
}

/* One frame into *b (reset for reading); *type. */
static int recv_msg(int fd, uint32_t *type, struct buf *b, uint64_t deadline) {
  uint32_t h[2];
  HORA_CHECK(move_all(fd, h, sizeof(h), false, deadline));
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
  return len ? move_all(fd, b->p, len, false, deadline) : HORA_SUCCESS;
}

static void send_refuse(int fd, int code, const char *msg) {
  struct buf b = {0};
  put32(&b, (uint32_t)code);
  put(&b, msg, strlen(msg));
  send_msg(fd, M_REFUSE, &b, hora__now_ns() + IO_NS);
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
    hora__hs_connector(&hs, m->key, 2, 1, 1, 0, 0, nonce);
  } else {
    hora__hs_acceptor(&hs, m->key, 2, 1, 0, nonce);
  }
  while (hs.state == HORA_HS_SEND || hs.state == HORA_HS_RECV) {
    int err = 0;
    if (hora__boot_pump(fd, &hs, &err) < 0) {
      return hora__error(HORA_ERR_PEER_LOST, "closed during the handshake");
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

static void addr_str(uint32_t ip, uint16_t port, char *out, size_t n) {
  char s[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &ip, s, sizeof(s));
  snprintf(out, n, "%s:%u", s, (unsigned)port);
}

/* A non-blocking connect started; *fd, or -1 with errno. */
static int start_connect(uint32_t ip, uint16_t port) {
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
static int dial(struct hora__membership *m, uint32_t ip, uint16_t port, uint64_t ns) {
  uint64_t deadline = hora__now_ns() + ns;
  int fd = start_connect(ip, port);
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
  if (err != 0 || prove(m, fd, true, deadline + IO_NS) != HORA_SUCCESS) {
    close(fd);
    return -1;
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
    addr_str(peer.sin_addr.s_addr, ntohs(peer.sin_port), who, sizeof(who));
  }
  uint64_t deadline = hora__now_ns() + IO_NS;
  int rc = prove(m, fd, false, deadline);
  struct buf b = {0};
  uint32_t type = 0;
  if (rc == HORA_SUCCESS) {
    rc = recv_msg(fd, &type, &b, deadline);
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
    e.id = get32(&b);
    e.promised = get64(&b);
    get(&b, &e.ip, 4);
    e.port = (uint16_t)get32(&b);
    get_view(&b, &e.view);
    if (b.bad) {
      HORA_WARN("elastic: a malformed reset request from %s", who);
      close(fd);
      free(e.view.m);
    } else {
      bool news = !m->in_reset && m->on_request && e.view.epoch >= m->view.epoch &&
                  view_index(&m->view, e.id) >= 0;
      queue_push(&m->resets, &m->nresets, &m->cap_resets, &e);
      if (news) {
        m->on_request(m->on_request_arg, e.id);
      }
      uint64_t one = 1;
      (void)!write(m->wake_fd, &one, sizeof(one));
    }
  } else if (type == M_JOIN) {
    get(&b, &e.ip, 4);
    e.port = (uint16_t)get32(&b);
    int me = view_index(&m->view, m->my_id);
    int max = (int)hora__params.ELASTIC_MAX_SIZE;
    if (b.bad) {
      close(fd);
    } else if (me != 0 && m->view.n > 0) {
      struct buf r = {0};
      put(&r, &m->view.m[0].ip, 4);
      put32(&r, m->view.m[0].port);
      send_msg(fd, M_REDIRECT, &r, hora__now_ns() + IO_NS);
      free(r.p);
      close(fd);
    } else if (max > 0 && m->view.n + m->njoins >= max) {
      char msg[256];
      snprintf(msg, sizeof(msg),
               "the job has %d ranks%s and HORA_ELASTIC_MAX_SIZE=%d: no more may join", m->view.n,
               m->njoins ? " and more waiting to join" : "", max);
      HORA_WARN("elastic: refused the process at %s asking to join: %s", who, msg);
      send_refuse(fd, HORA_ERR_INVALID_USAGE, msg);
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

static void *listener_main(void *arg) {
  struct hora__membership *m = arg;
  for (;;) {
    pthread_mutex_lock(&m->mu);
    bool stop = m->stop;
    int door = m->door_fd;
    pthread_mutex_unlock(&m->mu);
    if (stop) {
      break;
    }
    struct pollfd pf[3] = {{m->lfd, POLLIN, 0}, {m->wake_fd, POLLIN, 0}, {door, POLLIN, 0}};
    if (poll(pf, door >= 0 ? 3 : 2, 1000) <= 0) {
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

static void drop_queue(struct queued *q, int n) {
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
  for (int *fd = &m->lfd; fd <= &m->wake_fd; fd++) {
    if (*fd >= 0) {
      close(*fd);
    }
  }
  drop_queue(m->resets, m->nresets);
  drop_queue(m->joins, m->njoins);
  free(m->resets);
  free(m->joins);
  view_free(&m->view);
  view_free(&m->accepted);
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
    view_free(&m->view);
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
  if (m->door_fd >= 0 && (port == 0 || port != m->door_port)) {
    close(m->door_fd);
    m->door_fd = -1;
  }
  if (port > 0 && m->door_fd < 0) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
        bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(fd, 64) == 0) {
      m->door_fd = fd;
      m->door_port = port;
      HORA_INFO("elastic: newcomers may ask to join at port %d", port);
    } else {
      HORA_WARN("elastic: cannot listen on the rendezvous port %d for newcomers (%s); they may "
                "ask any member, which sends them to rank 0", port, strerror(errno));
      if (fd >= 0) {
        close(fd);
      }
    }
  }
  pthread_mutex_unlock(&m->mu);
  wake(m);
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

/* ---- agreeing: the coordinator --------------------------------------------------- */

struct voter {
  int fd;          /* the member's connection, -1 until it asks */
  int probe_fd;    /* a connect in flight to see whether it lives */
  uint64_t probe_since, next_probe;
  bool gone;
  uint64_t promised;
  const char *why_gone;
};

static bool quorum(const struct hora__view *base, const struct voter *v, int *alive) {
  int n = 0;
  for (int i = 0; i < base->n; i++) {
    n += v[i].fd >= 0 || v[i].fd == -2; /* -2: this process */
  }
  *alive = n;
  return 2 * n > base->n || (2 * n == base->n && (v[0].fd >= 0 || v[0].fd == -2));
}

static void fail_voters(struct voter *v, int n, struct queued *joins, int nj, int code,
                        const char *msg) {
  for (int i = 0; i < n; i++) {
    if (v[i].fd >= 0) {
      send_refuse(v[i].fd, code, msg);
    }
  }
  for (int i = 0; i < nj; i++) {
    send_refuse(joins[i].fd, code, msg);
  }
}

static void close_voters(struct voter *v, int n) {
  for (int i = 0; i < n; i++) {
    if (v[i].fd >= 0) {
      close(v[i].fd);
    }
    if (v[i].probe_fd >= 0) {
      close(v[i].probe_fd);
    }
    v[i].fd = v[i].probe_fd = -1;
  }
}

/* Members' requests taken from the queue into the voters of `base`. A
 * request from a member of a newer membership this process is not in
 * ends this process's part (*out_rc). */
static void take_requests(struct hora__membership *m, struct hora__view *base, struct voter **vp,
                          int *out_rc) {
  pthread_mutex_lock(&m->mu);
  struct queued *q = m->resets;
  int n = m->nresets;
  m->resets = NULL;
  m->nresets = m->cap_resets = 0;
  pthread_mutex_unlock(&m->mu);
  for (int i = 0; i < n; i++) {
    if (q[i].view.epoch > base->epoch && *out_rc == HORA_SUCCESS) {
      if (view_index(&q[i].view, m->my_id) < 0) {
        *out_rc = hora__error(HORA_ERR_PEER_LOST,
                              "elastic: this process was left out of the job's membership %llu "
                              "(it did not answer in time)", (unsigned long long)q[i].view.epoch);
      } else {
        /* That membership was committed: go on from it. */
        struct voter *nv = hora__calloc((size_t)q[i].view.n, sizeof(*nv));
        if (!nv) {
          *out_rc = HORA_ERR_NO_MEMORY;
          break;
        }
        for (int k = 0; k < q[i].view.n; k++) {
          int old = view_index(base, q[i].view.m[k].id);
          nv[k] = old >= 0 ? (*vp)[old] : (struct voter){.fd = -1, .probe_fd = -1};
          if (old >= 0) {
            (*vp)[old].fd = (*vp)[old].probe_fd = -1;
          }
        }
        close_voters(*vp, base->n);
        free(*vp);
        *vp = nv;
        view_copy(base, &q[i].view);
      }
    }
    int k = view_index(base, q[i].id);
    if (*out_rc != HORA_SUCCESS || k < 0 || q[i].view.epoch < base->epoch - 1) {
      if (*out_rc == HORA_SUCCESS) {
        char msg[200];
        snprintf(msg, sizeof(msg), "elastic: this process (id %u) is not a member of the job's "
                 "membership %llu: it was left out", q[i].id, (unsigned long long)base->epoch);
        send_refuse(q[i].fd, HORA_ERR_PEER_LOST, msg);
      }
      close(q[i].fd);
    } else {
      struct voter *v = &(*vp)[k];
      if (v->fd >= 0) {
        close(v->fd);
      }
      v->fd = q[i].fd;
      v->promised = q[i].promised;
      v->gone = false;
    }
    free(q[i].view.m);
  }
  free(q);
}

/* Sends one message to every voter that has asked; one that cannot take it
 * is gone. */
static bool tell_voters(struct voter *v, int n, uint32_t type, const struct buf *b) {
  bool all = true;
  uint64_t deadline = hora__now_ns() + IO_NS;
  for (int i = 0; i < n; i++) {
    if (v[i].fd >= 0 && send_msg(v[i].fd, type, b, deadline) != HORA_SUCCESS) {
      close(v[i].fd);
      v[i].fd = -1;
      v[i].gone = true;
      v[i].why_gone = "its connection broke during the reset";
      all = false;
    }
  }
  return all;
}

/* Waits for one answer of `want` from every voter that has asked; `each`
 * reads it. false when one failed (it is then gone, or its NACK raised
 * *promised). */
static bool gather(struct hora__membership *m, struct voter *v, int n, uint32_t want,
                   bool (*each)(struct hora__membership *, struct voter *, struct buf *, void *),
                   void *arg) {
  bool ok = true;
  struct buf b = {0};
  uint64_t deadline = hora__now_ns() + REPLY_NS;
  for (int i = 0; i < n; i++) {
    if (v[i].fd < 0) {
      continue;
    }
    uint32_t type = 0;
    int rc = recv_msg(v[i].fd, &type, &b, deadline);
    if (rc == HORA_SUCCESS && type == M_NACK) {
      uint64_t p = get64(&b);
      v[i].promised = HORA_MAX(v[i].promised, p);
      ok = false;
    } else if (rc != HORA_SUCCESS || type != want || !each(m, &v[i], &b, arg)) {
      close(v[i].fd);
      v[i].fd = -1;
      v[i].gone = true;
      v[i].why_gone = "it stopped answering during the reset";
      ok = false;
    }
  }
  free(b.p);
  return ok;
}

struct promises {
  uint64_t best_b;
  struct hora__view best;
  uint64_t epoch; /* of the base: only proposals for the next count */
};

static bool take_promise(struct hora__membership *m, struct voter *v, struct buf *b, void *arg) {
  (void)m;
  struct promises *p = arg;
  (void)get64(b); /* the ballot promised: ours */
  uint64_t ab = get64(b);
  struct hora__view av = {0};
  bool ok = get_view(b, &av);
  if (ok && ab > p->best_b && av.epoch == p->epoch + 1) {
    p->best_b = ab;
    view_free(&p->best);
    p->best = av;
  } else {
    view_free(&av);
  }
  (void)v;
  return ok;
}

static bool take_accepted(struct hora__membership *m, struct voter *v, struct buf *b, void *arg) {
  (void)m;
  (void)v;
  return get64(b) == *(uint64_t *)arg;
}

static void probe_step(struct voter *v, const struct hora__member *mem, uint64_t t) {
  if (v->fd >= 0 || v->gone || v->fd == -2) {
    return;
  }
  if (v->probe_fd >= 0) {
    struct pollfd pf = {v->probe_fd, POLLOUT, 0};
    if (poll(&pf, 1, 0) > 0) {
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(v->probe_fd, SOL_SOCKET, SO_ERROR, &err, &len);
      close(v->probe_fd);
      v->probe_fd = -1;
      if (err) {
        v->gone = true;
        v->why_gone = "its listener refuses connections (the process is gone)";
      } else {
        v->next_probe = t + BEAT_NS;
      }
    } else if (t - v->probe_since > PROBE_NS) {
      close(v->probe_fd);
      v->probe_fd = -1;
      v->gone = true;
      v->why_gone = "its host does not answer";
    }
  } else if (t >= v->next_probe) {
    v->probe_fd = start_connect(mem->ip, mem->port);
    v->probe_since = t;
    if (v->probe_fd < 0) {
      v->gone = true;
      v->why_gone = "it cannot be reached";
    }
  }
}

static int coordinate(struct hora__membership *m, struct hora__agreed *out) {
  struct hora__view base = {0};
  pthread_mutex_lock(&m->mu);
  int rc = view_copy(&base, &m->view);
  pthread_mutex_unlock(&m->mu);
  if (rc != HORA_SUCCESS) {
    return rc;
  }
  struct voter *v = hora__calloc((size_t)base.n, sizeof(*v));
  if (!v) {
    view_free(&base);
    return HORA_ERR_NO_MEMORY;
  }
  for (int i = 0; i < base.n; i++) {
    v[i].fd = v[i].probe_fd = -1;
  }
  struct queued *joins = NULL;
  int njoins = 0;
  struct buf b = {0};
  struct hora__view next = {0};
  uint64_t wait_until = hora__now_ns() + (uint64_t)(hora__params.ELASTIC_TIMEOUT_SECONDS * 1e9);
  uint64_t last_beat = 0;
  HORA_INFO("elastic: coordinating the reset of membership %llu (%d ranks)",
            (unsigned long long)base.epoch, base.n);
  for (;;) {
    /* Wait until every member has asked or is gone. */
    for (;;) {
      take_requests(m, &base, &v, &rc);
      if (rc != HORA_SUCCESS) {
        goto done;
      }
      int me = view_index(&base, m->my_id);
      v[me].fd = -2;
      uint64_t t = hora__now_ns();
      int pending = 0;
      for (int i = 0; i < base.n; i++) {
        probe_step(&v[i], &base.m[i], t);
        if (v[i].fd == -1 && !v[i].gone) {
          if (t >= wait_until) {
            v[i].gone = true;
            v[i].why_gone = "it is alive but did not call hora_elastic_reset in time "
                            "(HORA_ELASTIC_TIMEOUT_SECONDS)";
          } else {
            pending++;
          }
        }
      }
      if (t - last_beat > BEAT_NS) {
        tell_voters(v, base.n, M_BEAT, NULL);
        last_beat = t;
      }
      if (pending == 0) {
        break;
      }
      struct timespec ts = {0, 20 * 1000000};
      nanosleep(&ts, NULL);
    }
    int alive = 0;
    for (int i = 0; i < base.n; i++) {
      if (v[i].gone) {
        HORA_WARN("elastic: rank %d (id %u) of membership %llu is gone: %s", i, base.m[i].id,
                  (unsigned long long)base.epoch, v[i].why_gone);
      }
    }
    pthread_mutex_lock(&m->mu);
    drop_queue(joins, njoins);
    free(joins);
    joins = m->joins;
    njoins = m->njoins;
    m->joins = NULL;
    m->njoins = m->cap_joins = 0;
    pthread_mutex_unlock(&m->mu);
    char msg[512];
    if (!quorum(&base, v, &alive)) {
      snprintf(msg, sizeof(msg),
               "elastic: only %d of the %d ranks of membership %llu are left: a reset needs more "
               "than half of them (or exactly half including its rank 0), so that the job never "
               "splits in two", alive, base.n, (unsigned long long)base.epoch);
      fail_voters(v, base.n, joins, njoins, HORA_ERR_PEER_LOST, msg);
      rc = hora__error(HORA_ERR_PEER_LOST, "%s", msg);
      goto done;
    }
    if (alive + njoins < hora__params.ELASTIC_MIN_SIZE) {
      snprintf(msg, sizeof(msg), "elastic: only %d ranks are left, and HORA_ELASTIC_MIN_SIZE=%lld",
               alive + njoins, (long long)hora__params.ELASTIC_MIN_SIZE);
      fail_voters(v, base.n, joins, njoins, HORA_ERR_PEER_LOST, msg);
      rc = hora__error(HORA_ERR_PEER_LOST, "%s", msg);
      goto done;
    }
    /* Phase 1: a ballot above every promise. */
    uint64_t top = m->promised;
    for (int i = 0; i < base.n; i++) {
      top = HORA_MAX(top, v[i].promised);
    }
    uint64_t ballot = ((top >> 32) + 1) << 32 | m->my_id;
    m->promised = ballot;
    b.len = 0;
    put64(&b, ballot);
    struct promises pr = {.epoch = base.epoch};
    if (m->accepted_b && m->accepted.epoch == base.epoch + 1) {
      pr.best_b = m->accepted_b;
      view_copy(&pr.best, &m->accepted);
    }
    bool ok = tell_voters(v, base.n, M_PREPARE, &b) &&
              gather(m, v, base.n, M_PROMISE, take_promise, &pr);
    if (!ok) {
      view_free(&pr.best);
      continue; /* someone left, or promised a higher ballot: again */
    }
    /* The value: a proposal a quorum may have accepted, else ours. */
    bool adopted = pr.best_b != 0;
    if (adopted) {
      view_free(&next);
      next = pr.best;
    } else {
      view_free(&pr.best);
      view_free(&next);
      next.epoch = base.epoch + 1;
      next.next_id = base.next_id;
      next.m = hora__calloc((size_t)(alive + njoins), sizeof(*next.m));
      if (!next.m) {
        rc = HORA_ERR_NO_MEMORY;
        goto done;
      }
      for (int i = 0; i < base.n; i++) {
        if (v[i].fd >= 0 || v[i].fd == -2) {
          next.m[next.n++] = base.m[i];
        }
      }
      for (int j = 0; j < njoins; j++) {
        next.m[next.n++] = (struct hora__member){next.next_id++, joins[j].ip, joins[j].port};
      }
    }
    /* Phase 2. */
    b.len = 0;
    put64(&b, ballot);
    put_view(&b, &next);
    ok = tell_voters(v, base.n, M_PROPOSE, &b) &&
         gather(m, v, base.n, M_ACCEPTED, take_accepted, &ballot);
    if (!ok) {
      continue;
    }
    m->accepted_b = ballot;
    view_copy(&m->accepted, &next);
    /* Phase 3. An adopted proposal is committed as it was, then the
     * members still here go on from it. */
    int lfd = -1, port = 0;
    if (!adopted) {
      struct in_addr ip = {m->my_ip};
      struct sockaddr_in bound;
      rc = hora__listen_tcp(ip, &lfd, &bound);
      if (rc != HORA_SUCCESS) {
        fail_voters(v, base.n, joins, njoins, rc, hora__error_message());
        goto done;
      }
      port = ntohs(bound.sin_port);
    }
    b.len = 0;
    put64(&b, ballot);
    put32(&b, adopted ? 0 : 1);
    put32(&b, (uint32_t)port);
    put_view(&b, &next);
    for (int i = 0; i < base.n; i++) {
      if (v[i].fd >= 0 && view_index(&next, base.m[i].id) < 0) {
        send_refuse(v[i].fd, HORA_ERR_PEER_LOST, "elastic: this process was left out of the "
                    "membership a previous coordinator had proposed");
        close(v[i].fd);
        v[i].fd = -1;
      }
    }
    tell_voters(v, base.n, M_COMMIT, &b);
    if (!adopted) {
      for (int j = 0; j < njoins; j++) {
        send_msg(joins[j].fd, M_COMMIT, &b, hora__now_ns() + IO_NS);
      }
    }
    pthread_mutex_lock(&m->mu);
    view_copy(&m->view, &next);
    pthread_mutex_unlock(&m->mu);
    m->accepted_b = 0;
    view_free(&m->accepted);
    if (adopted) {
      /* The voters of the committed membership carry over. */
      struct voter *nv = hora__calloc((size_t)next.n, sizeof(*nv));
      if (!nv) {
        rc = HORA_ERR_NO_MEMORY;
        goto done;
      }
      for (int k = 0; k < next.n; k++) {
        int old = view_index(&base, next.m[k].id);
        nv[k] = old >= 0 ? v[old] : (struct voter){.fd = -1, .probe_fd = -1};
        if (old >= 0) {
          v[old].fd = v[old].probe_fd = -1;
        }
        nv[k].promised = 0;
      }
      close_voters(v, base.n);
      free(v);
      v = nv;
      view_copy(&base, &next);
      continue;
    }
    int lost = 0;
    for (int i = 0; i < base.n; i++) {
      lost += view_index(&next, base.m[i].id) < 0;
    }
    char host[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &m->my_ip, host, sizeof(host));
    *out = (struct hora__agreed){.rank = view_index(&next, m->my_id), .size = next.n,
                                 .epoch = next.epoch, .port = port, .listen_fd = lfd,
                                 .joined = njoins, .lost = lost};
    hora__strlcpy(out->host, host, sizeof(out->host));
    break;
  }
done:
  close_voters(v, base.n);
  free(v);
  drop_queue(joins, njoins);
  free(joins);
  free(b.p);
  view_free(&next);
  view_free(&base);
  return rc;
}

/* ---- agreeing: a member ------------------------------------------------------------ */

/* Follows one coordinator's reset on fd. 1: it went away (try the next);
 * 0: done (*out); <0 never: errors are returned as HORA_ERR_* > 0. */
static int follow(struct hora__membership *m, int fd, const struct hora__member *coord,
                  struct hora__agreed *out, uint64_t deadline) {
  struct buf b = {0}, r = {0};
  int rc = 1;
  for (;;) {
    uint32_t type = 0;
    uint64_t t = hora__now_ns();
    if (t >= deadline) {
      rc = hora__error(HORA_ERR_TIMEOUT, "elastic: the reset did not end within its time");
      break;
    }
    if (recv_msg(fd, &type, &b, HORA_MIN(deadline, t + SILENCE_NS)) != HORA_SUCCESS) {
      rc = 1;
      break;
    }
    if (type == M_BEAT) {
      continue;
    }
    if (type == M_PREPARE) {
      uint64_t ballot = get64(&b);
      r.len = 0;
      if (ballot > m->promised) {
        m->promised = ballot;
        put64(&r, ballot);
        put64(&r, m->accepted_b);
        struct hora__view none = {0};
        put_view(&r, m->accepted_b ? &m->accepted : &none);
        type = M_PROMISE;
      } else {
        put64(&r, m->promised);
        type = M_NACK;
      }
    } else if (type == M_PROPOSE) {
      uint64_t ballot = get64(&b);
      struct hora__view pv = {0};
      if (!get_view(&b, &pv)) {
        view_free(&pv);
        break;
      }
      r.len = 0;
      if (ballot >= m->promised) {
        m->promised = ballot;
        m->accepted_b = ballot;
        view_free(&m->accepted);
        m->accepted = pv;
        put64(&r, ballot);
        type = M_ACCEPTED;
      } else {
        view_free(&pv);
        put64(&r, m->promised);
        type = M_NACK;
      }
    } else if (type == M_COMMIT) {
      (void)get64(&b);
      uint32_t build = get32(&b), port = get32(&b);
      struct hora__view nv = {0};
      if (!get_view(&b, &nv)) {
        view_free(&nv);
        break;
      }
      uint64_t old_epoch = m->view.epoch;
      int old_n = m->view.n;
      pthread_mutex_lock(&m->mu);
      view_free(&m->view);
      m->view = nv;
      pthread_mutex_unlock(&m->mu);
      m->accepted_b = 0;
      view_free(&m->accepted);
      if (!build) {
        continue;
      }
      int me = view_index(&m->view, m->my_id);
      if (me < 0) {
        rc = hora__error(HORA_ERR_PEER_LOST, "elastic: this process was left out of membership "
                         "%llu", (unsigned long long)m->view.epoch);
        break;
      }
      *out = (struct hora__agreed){.rank = me, .size = m->view.n, .epoch = m->view.epoch,
                                   .port = (int)port, .listen_fd = -1,
                                   .lost = old_epoch ? HORA_MAX(old_n - m->view.n, 0) : 0};
      inet_ntop(AF_INET, &coord->ip, out->host, sizeof(out->host));
      rc = 0;
      break;
    } else if (type == M_REFUSE) {
      int code = (int)get32(&b);
      char msg[600];
      size_t n = HORA_MIN(b.len - b.off, sizeof(msg) - 1);
      memcpy(msg, b.p + b.off, n);
      msg[n] = '\0';
      rc = hora__error(code > 0 && code < 64 ? code : HORA_ERR_PEER_LOST, "%s", msg);
      break;
    } else if (type == M_REDIRECT) {
      rc = 1;
      break;
    } else {
      break;
    }
    if (send_msg(fd, type, &r, hora__now_ns() + IO_NS) != HORA_SUCCESS) {
      break;
    }
  }
  free(b.p);
  free(r.p);
  return rc;
}

/* Answers requests queued here while another coordinates: ask again. */
static void redirect_requests(struct hora__membership *m) {
  pthread_mutex_lock(&m->mu);
  struct queued *q = m->resets;
  int n = m->nresets;
  m->resets = NULL;
  m->nresets = m->cap_resets = 0;
  pthread_mutex_unlock(&m->mu);
  for (int i = 0; i < n; i++) {
    struct buf r = {0};
    put(&r, &m->my_ip, 4);
    put32(&r, m->my_port);
    send_msg(q[i].fd, M_REDIRECT, &r, hora__now_ns() + IO_NS);
    free(r.p);
  }
  drop_queue(q, n);
  free(q);
}

int hora__membership_agree(struct hora__membership *m, struct hora__agreed *out) {
  pthread_mutex_lock(&m->mu);
  m->in_reset = true;
  struct hora__view v = {0};
  int rc = view_copy(&v, &m->view);
  pthread_mutex_unlock(&m->mu);
  uint64_t deadline = hora__now_ns() +
                      (uint64_t)((2 * hora__params.ELASTIC_TIMEOUT_SECONDS + 30) * 1e9);
  bool *gone = rc == HORA_SUCCESS ? hora__calloc((size_t)HORA_MAX(v.n, 1), 1) : NULL;
  if (rc == HORA_SUCCESS && !gone) {
    rc = HORA_ERR_NO_MEMORY;
  }
  while (rc == HORA_SUCCESS) {
    if (hora__now_ns() >= deadline) {
      rc = hora__error(HORA_ERR_TIMEOUT, "elastic: no membership was agreed in time");
      break;
    }
    /* The view may have moved on (an adopted commitment): start over from it. */
    pthread_mutex_lock(&m->mu);
    if (m->view.epoch != v.epoch) {
      view_copy(&v, &m->view);
      free(gone);
      gone = hora__calloc((size_t)HORA_MAX(v.n, 1), 1);
    }
    pthread_mutex_unlock(&m->mu);
    if (!gone) {
      rc = HORA_ERR_NO_MEMORY;
      break;
    }
    int i = 0;
    for (; i < v.n && (gone[i] || v.m[i].id == m->my_id) ; i++) {
      if (v.m[i].id == m->my_id) {
        break;
      }
    }
    if (i == v.n) {
      rc = hora__error(HORA_ERR_PEER_LOST, "elastic: this process is not a member of membership "
                       "%llu", (unsigned long long)v.epoch);
      break;
    }
    if (v.m[i].id == m->my_id) {
      rc = coordinate(m, out);
      break;
    }
    redirect_requests(m);
    int fd = dial(m, v.m[i].ip, v.m[i].port, PROBE_NS);
    if (fd < 0) {
      gone[i] = true;
      continue;
    }
    struct buf b = {0};
    put32(&b, m->my_id);
    put64(&b, m->promised);
    put(&b, &m->my_ip, 4);
    put32(&b, m->my_port);
    put_view(&b, &v);
    int r = send_msg(fd, M_RESET, &b, hora__now_ns() + IO_NS) == HORA_SUCCESS
                ? follow(m, fd, &v.m[i], out, deadline)
                : 1;
    free(b.p);
    close(fd);
    if (r == 1) {
      /* It went away or sent us elsewhere: everyone below it is asked again. */
      memset(gone, 0, (size_t)HORA_MAX(v.n, 1));
      struct timespec ts = {0, 50 * 1000000};
      nanosleep(&ts, NULL);
      continue;
    }
    rc = r;
    break;
  }
  free(gone);
  view_free(&v);
  pthread_mutex_lock(&m->mu);
  m->in_reset = false;
  pthread_mutex_unlock(&m->mu);
  return rc;
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
  struct buf b = {0};
  int rc = HORA_ERR_TIMEOUT;
  char where[64];
  while (hora__now_ns() < deadline) {
    addr_str(ip, at, where, sizeof(where));
    int fd = dial(m, ip, at, PROBE_NS);
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
    put(&b, &m->my_ip, 4);
    put32(&b, m->my_port);
    uint32_t type = 0;
    rc = send_msg(fd, M_JOIN, &b, hora__now_ns() + IO_NS);
    if (rc == HORA_SUCCESS) {
      rc = recv_msg(fd, &type, &b, deadline);
    }
    close(fd);
    if (rc != HORA_SUCCESS) {
      if (rc == HORA_ERR_TIMEOUT) {
        break;
      }
      continue; /* the one holding the door went away: knock again */
    }
    if (type == M_REDIRECT) {
      get(&b, &ip, 4);
      at = (uint16_t)get32(&b);
      continue;
    }
    if (type == M_REFUSE) {
      int code = (int)get32(&b);
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
    (void)get64(&b);
    (void)get32(&b);
    uint32_t rport = get32(&b);
    struct hora__view nv = {0};
    if (!get_view(&b, &nv)) {
      view_free(&nv);
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
      view_free(&nv);
      rc = hora__error(HORA_ERR_PEER_LOST, "elastic: the commit from %s does not name this "
                       "process", where);
      break;
    }
    pthread_mutex_lock(&m->mu);
    m->my_id = nv.m[me].id;
    view_free(&m->view);
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
