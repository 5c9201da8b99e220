/* hora's own rendezvous over TCP (also under torchrun's and Slurm's
 * variables, and for process sets).
 *
 *   rank 0: listens on the port (all interfaces), takes one connection per
 *           other rank, and answers each exchange with every rank's record
 *   others: connect (retrying until HORA_CONNECT_TIMEOUT_SECONDS), prove
 *           the secret, claim their rank, then send and receive records
 *
 *   client -> rank 0   [handshake]  claim  { len, record } ...
 *   rank 0 -> client   frame { status, len, bytes }: the claim taken, the
 *                      welcome, records, or an error's text, which the
 *                      client then fails with
 *
 * A connection rank 0 closes before taking the claim (it proved nothing
 * within HELLO_DEADLINE_NS: a rank slowed down by a loaded host, or a
 * stranger) is retried by the client, as the bootstrap's are: only the
 * acknowledgement says a rank is registered.
 *
 * Connections that do not prove the secret (or, with none, do not speak
 * the protocol) are dropped and logged; with a secret, a bad claim (a rank
 * out of range, a rank claimed twice, another job size) fails every process
 * rank 0 can reach before the timeout, each with rank 0's message; without
 * one it may be a stranger's, and only its claimant is refused. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/bootstrap/rendezvous.h"
#include "comm/transport/socket.h"

#define CLAIM_MAGIC 0x56445248u /* "HRDV" */
#define CLAIM_VERSION 2u /* 2: the claim is acknowledged */
#define CLAIM_SIZE 96
#define STRANGERS_MAX 64
#define FRAME_MAX (64u << 20) /* the biggest exchange rank 0 answers */

struct claim {
  uint32_t magic, version;
  int32_t rank, size, pid;
  char host[HORA_HOST_MAX];
};

struct client {
  int fd;
  enum { C_HANDSHAKE, C_CLAIM, C_READY } state;
  struct hora__hs hs;
  uint8_t buf[CLAIM_SIZE];
  size_t got;
  uint64_t since;
  struct claim claim;
  char who[80]; /* its address, for the refusal log */
};

struct tcp_rdv {
  int *fd;          /* rank 0: [size], the connection of each rank; others: fd[0] to rank 0 */
  struct claim *claims; /* rank 0: who each rank is, for messages */
  double timeout_s;
  char where[400];
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int ms_until(uint64_t deadline) {
  uint64_t t = now_ns();
  return t >= deadline ? 0 : (int)HORA_MIN((deadline - t) / 1000000ull + 1, 1000);
}

/* The key the handshake proves: apart from the job secret derived later,
 * so a rendezvous proof never opens a data connection. */
static void rendezvous_key(const uint8_t *key, uint8_t out[HORA_SECRET_LEN]) {
  uint8_t in[HORA_SECRET_LEN + 16];
  memcpy(in, "hora-rendezvous1", 16);
  memcpy(in + 16, key, HORA_SECRET_LEN);
  SHA256(in, sizeof(in), out);
  OPENSSL_cleanse(in, sizeof(in));
}

static void encode_claim(const struct claim *c, uint8_t out[CLAIM_SIZE]) {
  memset(out, 0, CLAIM_SIZE);
  uint32_t w[5] = {htonl(c->magic), htonl(c->version), htonl((uint32_t)c->rank),
                   htonl((uint32_t)c->size), htonl((uint32_t)c->pid)};
  memcpy(out, w, sizeof(w));
  memcpy(out + sizeof(w), c->host, HORA_HOST_MAX);
}

static void decode_claim(const uint8_t in[CLAIM_SIZE], struct claim *c) {
  uint32_t w[5];
  memcpy(w, in, sizeof(w));
  c->magic = ntohl(w[0]);
  c->version = ntohl(w[1]);
  c->rank = (int32_t)ntohl(w[2]);
  c->size = (int32_t)ntohl(w[3]);
  c->pid = (int32_t)ntohl(w[4]);
  memcpy(c->host, in + sizeof(w), HORA_HOST_MAX);
  c->host[HORA_HOST_MAX - 1] = '\0';
}

/* Moves all n bytes before the deadline: HORA_SUCCESS, or an error naming
 * `what` (EOF: HORA_ERR_PEER_LOST). */
static int move_all(int fd, void *buf, size_t n, bool sending, uint64_t deadline, const char *what) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = sending ? send(fd, (char *)buf + done, n - done, MSG_NOSIGNAL)
                        : recv(fd, (char *)buf + done, n - done, 0);
    if (r > 0) {
      done += (size_t)r;
      continue;
    }
    if (r == 0 && !sending) {
      return hora__error(HORA_ERR_PEER_LOST, "%s closed the connection", what);
    }
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return hora__error_errno(HORA_ERR_PEER_LOST, "%s", what);
    }
    if (now_ns() >= deadline) {
      return hora__error(HORA_ERR_TIMEOUT, "%s: no answer before the timeout", what);
    }
    struct pollfd p = {fd, (short)(sending ? POLLOUT : POLLIN), 0};
    poll(&p, 1, ms_until(deadline));
  }
  return HORA_SUCCESS;
}

static int send_frame(int fd, int status, const void *data, size_t len, uint64_t deadline) {
  uint32_t h[2] = {htonl((uint32_t)status), htonl((uint32_t)len)};
  HORA_CHECK(move_all(fd, h, sizeof(h), true, deadline, "sending to a rank"));
  return len ? move_all(fd, (void *)data, len, true, deadline, "sending to a rank") : HORA_SUCCESS;
}

static void describe(const struct claim *c, char *buf, size_t n) {
  snprintf(buf, n, "pid %d on %s", (int)c->pid, c->host);
}

/* ---- rank 0 ----------------------------------------------------------------------- */

struct server {
  const struct hora__rdv_tcp_spec *spec;
  struct tcp_rdv *t;
  uint8_t hs_key[HORA_SECRET_LEN];
  int lfd;
  struct client *cl;
  int ncl, cap;
  int registered;
  int told; /* after a failure: claims answered with it */
  int failed;
  char msg[768];
  char refused[768]; /* without a secret: the last claim refused */
};

static void drop(struct server *s, int i, const char *why) {
  if (why) {
    HORA_WARN("rendezvous at %s: refused a connection from %s: %s", s->spec->where, s->cl[i].who,
              why);
  }
  close(s->cl[i].fd);
  s->cl[i] = s->cl[--s->ncl];
}

static void fail_all(struct server *s, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail_all(struct server *s, int code, const char *fmt, ...) {
  if (s->failed) {
    return;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->msg, sizeof(s->msg), fmt, ap);
  va_end(ap);
  s->failed = code;
  uint64_t deadline = now_ns() + 2000000000ull;
  for (int i = 0; i < s->ncl; i++) {
    if (s->cl[i].state == C_READY) {
      send_frame(s->cl[i].fd, code, s->msg, strlen(s->msg), deadline);
      s->told++;
    }
  }
}

/* A claim that cannot be taken. With a secret only the job's processes
 * claim: it is the job's mistake, told to all. Without one it may be a
 * stranger's: refused to the claimant alone, named if the start-up then
 * times out. */
static void bad_claim(struct server *s, int i, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void bad_claim(struct server *s, int i, int code, const char *fmt, ...) {
  char msg[sizeof(s->msg)];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (s->spec->key) {
    fail_all(s, code, "%s", msg);
    return;
  }
  send_frame(s->cl[i].fd, code, msg, strlen(msg), now_ns() + 2000000000ull);
  snprintf(s->refused, sizeof(s->refused), "%s", msg);
  char why[sizeof(msg) + 64];
  snprintf(why, sizeof(why), "%s (without a secret anyone may connect)", msg);
  drop(s, i, why);
}

/* A complete claim: registered, refused, or the whole rendezvous failed. */
static void take_claim(struct server *s, int i) {
  struct client *c = &s->cl[i];
  decode_claim(c->buf, &c->claim);
  if (c->claim.magic != CLAIM_MAGIC || c->claim.version != CLAIM_VERSION) {
    drop(s, i, c->claim.magic != CLAIM_MAGIC ? "not a hora rendezvous claim"
                                             : "a claim from another version of hora");
    return;
  }
  c->state = C_READY;
  const struct hora__rdv_tcp_spec *sp = s->spec;
  char who[128];
  describe(&c->claim, who, sizeof(who));
  int r = c->claim.rank;
  if (s->failed) {
    send_frame(c->fd, s->failed, s->msg, strlen(s->msg), now_ns() + 2000000000ull);
    s->told++;
  } else if (c->claim.size != sp->size) {
    bad_claim(s, i, HORA_ERR_INVALID_ARG,
             "%s differs between processes: rank 0 has %s=%d, the process with %s=%d (%s) has "
             "%s=%d", sp->size_var, sp->size_var, sp->size, sp->rank_var, r, who, sp->size_var,
             (int)c->claim.size);
  } else if (r < 0 || r >= sp->size) {
    bad_claim(s, i, HORA_ERR_INVALID_ARG, "%s=%d (%s) is out of range: %s=%d allows 0 to %d",
             sp->rank_var, r, who, sp->size_var, sp->size, sp->size - 1);
  } else if (r == 0 || s->t->fd[r] >= 0) {
    char other[128];
    if (r == 0) {
      snprintf(other, sizeof(other), "pid %d on %s (which hosts the rendezvous)", (int)getpid(),
               hora__log_hostname());
    } else {
      describe(&s->t->claims[r], other, sizeof(other));
    }
    bad_claim(s, i, HORA_ERR_INVALID_ARG, "two processes claim %s=%d: %s and %s", sp->rank_var, r,
              other, who);
  } else if (send_frame(c->fd, 0, NULL, 0, now_ns() + 2000000000ull) != HORA_SUCCESS) {
    drop(s, i, "closed before its claim was acknowledged"); /* it retries */
  } else {
    s->t->fd[r] = c->fd;
    s->t->claims[r] = c->claim;
    s->registered++;
  }
  /* Otherwise it has been told why (fail_all tells every ready client). */
}

static void step_client(struct server *s, int i, short revents) {
  struct client *c = &s->cl[i];
  if (c->state == C_HANDSHAKE) {
    int err = 0;
    int r;
    while ((r = hora__boot_pump(c->fd, &c->hs, &err)) == 1) {
    }
    if (r < 0) {
      drop(s, i, err ? strerror(err) : "closed during the handshake");
    } else if (c->hs.state == HORA_HS_FAILED) {
      struct hora__hello h;
      if (c->hs.step == 0 &&
          hora__hello_decode(c->hs.buf, HORA_DOOR_HS_SIZE, 1, &h) == HORA_SUCCESS) {
        HORA_INFO("rendezvous at %s: an elastic newcomer (%s) knocked before the job had "
                  "started; it knocks again at the door", s->spec->where, c->who);
        drop(s, i, NULL);
      } else {
        drop(s, i, c->hs.why[0] ? c->hs.why : "did not prove the job's secret");
      }
    } else if (c->hs.state == HORA_HS_DONE) {
      c->state = C_CLAIM;
    }
    return;
  }
  if (c->state == C_CLAIM && (revents & (POLLIN | POLLHUP | POLLERR))) {
    ssize_t r = recv(c->fd, c->buf + c->got, CLAIM_SIZE - c->got, 0);
    if (r > 0) {
      c->got += (size_t)r;
      if (c->got == CLAIM_SIZE) {
        take_claim(s, i);
      }
    } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
      drop(s, i, "closed before its claim");
    }
  } else if (c->state == C_READY && (revents & (POLLHUP | POLLERR))) {
    /* A registered rank gone before start-up ended. */
    char who[128];
    describe(&c->claim, who, sizeof(who));
    int r = c->claim.rank;
    if (r > 0 && r < s->spec->size && s->t->fd[r] == c->fd) {
      s->t->fd[r] = -1;
      s->registered--;
      fail_all(s, HORA_ERR_PEER_LOST, "%s=%d (%s) left during start-up", s->spec->rank_var, r,
               who);
    }
    drop(s, i, NULL);
  }
}

static void accept_new(struct server *s) {
  for (int k = 0; k < 16; k++) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int fd = accept4(s->lfd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      return;
    }
    int strangers = 0, oldest = -1;
    for (int i = 0; i < s->ncl; i++) {
      if (s->cl[i].state != C_READY) {
        strangers++;
        oldest = oldest < 0 || s->cl[i].since < s->cl[oldest].since ? i : oldest;
      }
    }
    if (strangers >= STRANGERS_MAX && oldest >= 0) {
      drop(s, oldest, "too many connections proving nothing yet (the oldest is dropped)");
    }
    if (s->ncl == s->cap) {
      int cap = s->cap ? 2 * s->cap : 32;
      struct client *cl = realloc(s->cl, (size_t)cap * sizeof(*cl));
      if (!cl) {
        close(fd);
        return;
      }
      s->cl = cl;
      s->cap = cap;
    }
    struct client *c = &s->cl[s->ncl++];
    memset(c, 0, sizeof(*c));
    c->fd = fd;
    c->since = now_ns();
    char ip[INET6_ADDRSTRLEN] = "?";
    if (ss.ss_family == AF_INET) {
      struct sockaddr_in *a = (struct sockaddr_in *)&ss;
      inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
      snprintf(c->who, sizeof(c->who), "%s:%d", ip, ntohs(a->sin_port));
    } else {
      snprintf(c->who, sizeof(c->who), "an address of family %d", ss.ss_family);
    }
    hora__socket_tune(fd, true, 0);
    if (s->spec->key) {
      uint8_t nonce[HORA_HS_NONCE_LEN];
      hora__boot_random_bytes(nonce, sizeof(nonce), "rendezvous nonce");
      hora__hs_acceptor(&c->hs, s->hs_key, HORA_RDV_HS_SIZE, 1, 0, nonce);
      c->state = C_HANDSHAKE;
    } else {
      c->state = C_CLAIM;
    }
  }
}

static void missing_ranks(const struct server *s, char *buf, size_t n) {
  size_t o = 0;
  int shown = 0, missing = 0;
  buf[0] = '\0';
  for (int r = 1; r < s->spec->size; r++) {
    if (s->t->fd[r] < 0) {
      missing++;
      if (shown < 8 && o < n) {
        o += (size_t)snprintf(buf + o, n - o, "%s%d", shown ? ", " : "", r);
        shown++;
      }
    }
  }
  if (missing > shown && o < n) {
    snprintf(buf + o, n - o, " and %d more", missing - shown);
  }
}

static int serve_registration(struct server *s) {
  const struct hora__rdv_tcp_spec *sp = s->spec;
  uint64_t deadline = now_ns() + (uint64_t)(sp->timeout_s * 1e9);
  struct pollfd *pfd = NULL;
  int rc = HORA_SUCCESS;
  while (!(s->failed ? s->told >= sp->size - 1 : s->registered == sp->size - 1)) {
    uint64_t t = now_ns();
    if (t >= deadline) {
      if (!s->failed) {
        char miss[160];
        missing_ranks(s, miss, sizeof(miss));
        fail_all(s, HORA_ERR_TIMEOUT,
                 "start-up timed out after %.0f s (HORA_CONNECT_TIMEOUT_SECONDS) at %s: %s %s "
                 "never joined%s%s", sp->timeout_s, sp->where, sp->rank_var, miss,
                 s->refused[0] ? "; a claim was refused: " : "", s->refused);
      }
      break;
    }
    for (int i = s->ncl - 1; i >= 0; i--) {
      if (s->cl[i].state != C_READY && s->cl[i].since && t - s->cl[i].since > HELLO_DEADLINE_NS) {
        drop(s, i, "nothing proved within 1 s (a rank that was only slow connects again)");
      }
    }
    struct pollfd *np = realloc(pfd, (size_t)(s->ncl + 1) * sizeof(*pfd));
    if (!np) {
      rc = HORA_ERR_NO_MEMORY;
      break;
    }
    pfd = np;
    pfd[0] = (struct pollfd){s->lfd, POLLIN, 0};
    for (int i = 0; i < s->ncl; i++) {
      short ev = POLLIN;
      if (s->cl[i].state == C_HANDSHAKE && s->cl[i].hs.state == HORA_HS_SEND) {
        ev = POLLOUT;
      }
      pfd[i + 1] = (struct pollfd){s->cl[i].fd, s->cl[i].state == C_READY ? 0 : ev, 0};
    }
    int n = s->ncl;
    if (poll(pfd, (nfds_t)(n + 1), HORA_MIN(ms_until(deadline), 100)) < 0 && errno != EINTR) {
      rc = hora__error_errno(HORA_ERR_SYSTEM, "poll (rendezvous)");
      break;
    }
    /* Backwards: drop() moves the last client into the hole. */
    for (int i = n - 1; i >= 0; i--) {
      if (pfd[i + 1].revents && i < s->ncl && s->cl[i].fd == pfd[i + 1].fd) {
        step_client(s, i, pfd[i + 1].revents);
      }
    }
    if (pfd[0].revents & POLLIN) {
      accept_new(s);
    }
  }
  free(pfd);
  if (rc == HORA_SUCCESS && s->failed) {
    rc = hora__error(s->failed, "%s", s->msg);
  }
  if (rc == HORA_SUCCESS) {
    uint64_t d = now_ns() + (uint64_t)(sp->timeout_s * 1e9);
    for (int r = 1; r < sp->size && rc == HORA_SUCCESS; r++) {
      rc = send_frame(s->t->fd[r], 0, NULL, 0, d);
    }
  }
  /* The registered ranks' sockets move to the rendezvous; the rest close. */
  for (int i = 0; i < s->ncl; i++) {
    int r = s->cl[i].claim.rank;
    bool kept = rc == HORA_SUCCESS && s->cl[i].state == C_READY && r > 0 && r < sp->size &&
                s->t->fd[r] == s->cl[i].fd;
    if (!kept) {
      close(s->cl[i].fd);
      if (r > 0 && r < sp->size && s->t->fd[r] == s->cl[i].fd) {
        s->t->fd[r] = -1;
      }
    }
  }
  free(s->cl);
  return rc;
}

static int bind_port(const struct hora__rdv_tcp_spec *sp, int *out) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    return hora__error_errno(HORA_ERR_SYSTEM, "socket (rendezvous)");
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  sa.sin_port = htons((uint16_t)sp->port);
  if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, SOMAXCONN) < 0) {
    int err = errno;
    close(fd);
    errno = err;
    return hora__error_errno(err == EADDRINUSE ? HORA_ERR_INVALID_ARG : HORA_ERR_SYSTEM,
                             "rank 0 cannot listen on port %d for the rendezvous (%s)%s", sp->port,
                             sp->where,
                             err == EADDRINUSE ? ": the port is in use; choose another" : "");
  }
  *out = fd;
  return HORA_SUCCESS;
}

static int open_server(const struct hora__rdv_tcp_spec *sp, struct tcp_rdv *t) {
  struct server s;
  memset(&s, 0, sizeof(s));
  s.spec = sp;
  s.t = t;
  s.lfd = sp->listen_fd;
  if (s.lfd < 0) {
    HORA_CHECK(bind_port(sp, &s.lfd));
  }
  if (sp->key) {
    rendezvous_key(sp->key, s.hs_key);
  }
  int rc = sp->size > 1 ? serve_registration(&s) : HORA_SUCCESS;
  close(s.lfd); /* start-up is over: nobody else may join */
  OPENSSL_cleanse(s.hs_key, sizeof(s.hs_key));
  return rc;
}

/* ---- the others -------------------------------------------------------------------- */

/* One attempt at a connection to rank 0, proved and claimed. -1: try
 * again later (why in *why); 0: done (*fd); or an error that ends the
 * start-up. */
static int try_connect(const struct hora__rdv_tcp_spec *sp, const uint8_t *hs_key,
                       uint64_t deadline, int *fd_out, char *why, size_t whyn) {
  struct addrinfo hints, *ai = NULL;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  char port[16];
  snprintf(port, sizeof(port), "%d", sp->port);
  int g = getaddrinfo(sp->host, port, &hints, &ai);
  if (g != 0) {
    snprintf(why, whyn, "cannot resolve %s: %s", sp->host, gai_strerror(g));
    return -1;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    freeaddrinfo(ai);
    return hora__error_errno(HORA_ERR_SYSTEM, "socket (rendezvous)");
  }
  int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
  freeaddrinfo(ai);
  if (r < 0 && errno == EINPROGRESS) {
    struct pollfd p = {fd, POLLOUT, 0};
    poll(&p, 1, HORA_MIN(ms_until(deadline), 1000));
    int err = ETIMEDOUT;
    socklen_t len = sizeof(err);
    if (p.revents) {
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    }
    r = err ? -1 : 0;
    errno = err;
  }
  if (r == 0 && hora__socket_is_self_connected(fd)) {
    r = -1;
    errno = ECONNREFUSED;
  }
  if (r < 0) {
    snprintf(why, whyn, "%s", strerror(errno));
    close(fd);
    return -1;
  }
  hora__socket_tune(fd, true, 0);
  if (hs_key) {
    struct hora__hs hs;
    uint8_t nonce[HORA_HS_NONCE_LEN];
    int rc = hora__boot_random_bytes(nonce, sizeof(nonce), "rendezvous nonce");
    if (rc != HORA_SUCCESS) {
      close(fd);
      return rc;
    }
    hora__hs_connector(&hs, hs_key, HORA_RDV_HS_SIZE, 1, 1, 0, 1, nonce);
    uint64_t hs_deadline = HORA_MIN(deadline, now_ns() + 5000000000ull);
    while (hs.state == HORA_HS_SEND || hs.state == HORA_HS_RECV) {
      int err = 0;
      if (hora__boot_pump(fd, &hs, &err) < 0) {
        snprintf(why, whyn, "the connection closed during the handshake");
        close(fd);
        return -1;
      }
      if (hs.state == HORA_HS_SEND || hs.state == HORA_HS_RECV) {
        if (now_ns() >= hs_deadline) {
          snprintf(why, whyn, "no handshake answer");
          close(fd);
          return -1;
        }
        struct pollfd p = {fd, (short)(hs.state == HORA_HS_SEND ? POLLOUT : POLLIN), 0};
        poll(&p, 1, ms_until(hs_deadline));
      }
    }
    if (hs.state == HORA_HS_FAILED) {
      close(fd);
      return hora__error(HORA_ERR_INVALID_ARG,
                         "the process listening at %s did not prove this job's secret (%s): "
                         "another job's rendezvous, or a different HORA_SECRET/HORA_SECRET_FILE",
                         sp->where, hs.why);
    }
  }
  struct claim c = {CLAIM_MAGIC, CLAIM_VERSION, sp->rank, sp->size, (int32_t)getpid(), {0}};
  hora__strlcpy(c.host, hora__log_hostname(), sizeof(c.host));
  uint8_t wire[CLAIM_SIZE];
  encode_claim(&c, wire);
  if (move_all(fd, wire, sizeof(wire), true, deadline, "the rendezvous") != HORA_SUCCESS) {
    snprintf(why, whyn, "%s", hora__error_message());
    close(fd);
    return -1;
  }
  *fd_out = fd;
  return 0;
}

/* Reads one frame from rank 0; a status other than 0 is rank 0's error.
 * *no_header (may be NULL): the connection ended before the frame began. */
static int recv_frame(struct tcp_rdv *t, void *buf, size_t want, uint64_t deadline,
                      bool *no_header) {
  uint32_t h[2];
  char what[480];
  snprintf(what, sizeof(what), "the rendezvous (rank 0 at %s)", t->where);
  int rc = move_all(t->fd[0], h, sizeof(h), false, deadline, what);
  if (no_header) {
    *no_header = rc != HORA_SUCCESS;
  }
  if (rc != HORA_SUCCESS) {
    return rc;
  }
  uint32_t status = ntohl(h[0]), len = ntohl(h[1]);
  if (status != 0) {
    char msg[1024];
    size_t n = HORA_MIN((size_t)len, sizeof(msg) - 1);
    rc = move_all(t->fd[0], msg, n, false, deadline, what);
    msg[rc == HORA_SUCCESS ? n : 0] = '\0';
    return hora__error(status < 64 ? (int)status : HORA_ERR_SYSTEM, "%s", msg);
  }
  if (len != want) {
    return hora__error(HORA_ERR_SYSTEM, "the rendezvous sent %u bytes where %zu were expected",
                       len, want);
  }
  return want ? move_all(t->fd[0], buf, want, false, deadline, what) : HORA_SUCCESS;
}

/* Rank 0's first frame on a new connection: the claim taken (0), or its
 * error; -1: the connection closed first (rank 0 dropped it: connect again). */
static int await_ack(struct tcp_rdv *t, uint64_t deadline, char *why, size_t whyn) {
  bool closed;
  int rc = recv_frame(t, NULL, 0, deadline, &closed);
  if (closed) {
    snprintf(why, whyn, "rank 0 closed the connection before taking the claim (%s)",
             hora__error_message());
    close(t->fd[0]);
    t->fd[0] = -1;
    return -1;
  }
  return rc;
}

static int open_client(const struct hora__rdv_tcp_spec *sp, struct tcp_rdv *t) {
  uint8_t key[HORA_SECRET_LEN];
  if (sp->key) {
    rendezvous_key(sp->key, key);
  }
  uint64_t start = now_ns();
  uint64_t deadline = start + (uint64_t)(sp->timeout_s * 1e9);
  uint64_t backoff = RETRY_MIN_NS;
  char why[512] = "";
  int rc = HORA_SUCCESS;
  for (;;) {
    int r = try_connect(sp, sp->key ? key : NULL, deadline, &t->fd[0], why, sizeof(why));
    if (r == 0) {
      r = await_ack(t, deadline, why, sizeof(why));
    }
    if (r >= 0) {
      rc = r;
      break;
    }
    if (now_ns() >= deadline) {
      rc = hora__error(HORA_ERR_PEER_LOST,
                       "could not reach the rendezvous at %s within %.0f s "
                       "(HORA_CONNECT_TIMEOUT_SECONDS): %s; is rank 0 running?",
                       sp->where, sp->timeout_s, why);
      break;
    }
    struct timespec ts = {0, (long)backoff};
    nanosleep(&ts, NULL);
    backoff = HORA_MIN(backoff * 2, RETRY_MAX_NS);
  }
  OPENSSL_cleanse(key, sizeof(key));
  if (rc == HORA_SUCCESS) {
    /* Rank 0 waits for the last rank up to its own timeout, then answers. */
    rc = recv_frame(t, NULL, 0, deadline + 10000000000ull, NULL);
  }
  return rc;
}

/* ---- the exchanges ------------------------------------------------------------------ */

static int tcp_allgather(struct hora__rdv *r, const void *mine, size_t len, void *all) {
  struct tcp_rdv *t = r->impl;
  uint64_t deadline = now_ns() + (uint64_t)(t->timeout_s * 1e9);
  if ((uint64_t)len * (uint64_t)r->size > FRAME_MAX) {
    return hora__error(HORA_ERR_INVALID_ARG, "rendezvous exchange of %zu bytes per rank", len);
  }
  if (r->rank != 0) {
    uint32_t h = htonl((uint32_t)len);
    char what[480];
    snprintf(what, sizeof(what), "the rendezvous (rank 0 at %s)", t->where);
    HORA_CHECK(move_all(t->fd[0], &h, sizeof(h), true, deadline, what));
    if (len) {
      HORA_CHECK(move_all(t->fd[0], (void *)mine, len, true, deadline, what));
    }
    return recv_frame(t, all, len * (size_t)r->size, deadline + 10000000000ull, NULL);
  }
  memcpy(all, mine, len);
  int rc = HORA_SUCCESS;
  char who[128];
  for (int q = 1; q < r->size && rc == HORA_SUCCESS; q++) {
    uint32_t h = 0;
    describe(&t->claims[q], who, sizeof(who));
    char what[480];
    snprintf(what, sizeof(what), "%s=%d (%s) in start-up", "rank", q, who);
    rc = move_all(t->fd[q], &h, sizeof(h), false, deadline, what);
    if (rc == HORA_SUCCESS && ntohl(h) != len) {
      rc = hora__error(HORA_ERR_SYSTEM, "rank %d (%s) sent a %u-byte start-up record where %zu "
                       "were expected (another version of hora?)", q, who, ntohl(h), len);
    }
    if (rc == HORA_SUCCESS && len) {
      rc = move_all(t->fd[q], (char *)all + (size_t)q * len, len, false, deadline, what);
    }
  }
  for (int q = 1; q < r->size; q++) {
    if (rc == HORA_SUCCESS) {
      rc = send_frame(t->fd[q], 0, all, len * (size_t)r->size, deadline);
    } else {
      const char *m = hora__error_message();
      send_frame(t->fd[q], rc, m, strlen(m), now_ns() + 1000000000ull);
    }
  }
  return rc;
}

static void tcp_close(struct hora__rdv *r) {
  struct tcp_rdv *t = r->impl;
  if (t) {
    for (int q = 0; t->fd && q < (r->rank == 0 ? r->size : 1); q++) {
      if (t->fd[q] >= 0) {
        close(t->fd[q]);
      }
    }
    free(t->fd);
    free(t->claims);
    free(t);
  }
  OPENSSL_cleanse(r->key, sizeof(r->key));
  free(r);
}

static const struct hora__rdv_ops tcp_ops = {.allgather = tcp_allgather, .close = tcp_close};

int hora__rdv_open_tcp(const struct hora__rdv_tcp_spec *sp, struct hora__rdv **out) {
  *out = NULL;
  struct hora__rdv *r = hora__calloc(1, sizeof(*r));
  struct tcp_rdv *t = hora__calloc(1, sizeof(*t));
  int n = sp->rank == 0 ? HORA_MAX(sp->size, 1) : 1;
  if (r && t) {
    t->fd = hora__calloc((size_t)n, sizeof(int));
    t->claims = sp->rank == 0 ? hora__calloc((size_t)n, sizeof(*t->claims)) : NULL;
  }
  if (!r || !t || !t->fd || (sp->rank == 0 && !t->claims)) {
    if (t) {
      free(t->fd);
      free(t->claims);
    }
    free(t);
    free(r);
    if (sp->listen_fd >= 0) {
      close(sp->listen_fd);
    }
    return HORA_ERR_NO_MEMORY;
  }
  for (int i = 0; i < n; i++) {
    t->fd[i] = -1;
  }
  t->timeout_s = sp->timeout_s;
  hora__strlcpy(t->where, sp->where, sizeof(t->where));
  r->ops = &tcp_ops;
  r->kind = HORA_RDV_TCP;
  r->rank = sp->rank;
  r->size = sp->size;
  r->impl = t;
  if (sp->key) {
    r->has_key = true;
    memcpy(r->key, sp->key, HORA_SECRET_LEN);
  }
  int rc = sp->rank == 0 ? open_server(sp, t) : open_client(sp, t);
  if (rc != HORA_SUCCESS) {
    tcp_close(r);
    return rc;
  }
  *out = r;
  return HORA_SUCCESS;
}
