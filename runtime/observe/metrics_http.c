/* The metrics thread: GET /metrics over HTTP/1.1 (HORA_METRICS_PORT) and
 * the textfile (HORA_METRICS_FILE). One poll loop, non-blocking sockets,
 * at most MAX_CONNS connections (the oldest is dropped for a newer one),
 * each with a deadline and a request-size limit: a client that sends
 * garbage, or a thousand that connect and say nothing, cost a bounded
 * number of descriptors and never reach the engine, which this thread
 * shares nothing with but atomics and the sources' lock. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/transport/socket.h"
#include "runtime/observe/metrics.h"

#define MAX_CONNS 64
#define REQUEST_MAX 4096
#define CONN_DEADLINE_NS (2ull * 1000000000ull)
#define LISTEN_PAUSE_NS (100ull * 1000000ull) /* out of descriptors, none to spare */

enum conn_state { READING, WRITING, DRAINING };

struct conn {
  int fd;
  enum conn_state state;
  uint64_t deadline_ns, accepted_ns;
  size_t rlen;
  char req[REQUEST_MAX];
  char *out; /* the response, while WRITING */
  size_t olen, off;
};

struct server {
  pthread_t thread;
  int listen_fd, wake_fd;
  int reserve_fd;            /* spare descriptor, to shed a client on EMFILE (hora__accept_shed) */
  uint64_t listen_resume_ns; /* the listener is not polled before this */
  bool accept_warned;
  char addr[64];
  int port;
  char path[1024];
  uint64_t interval_ns, next_file_ns;
  bool file_warned;
  struct conn conns[MAX_CONNS];
  int nconns;
};

static struct server *srv;
/* Responses by status code, for the endpoint's own family. */
static const int codes[] = {200, 400, 404, 405, 431};
static atomic_uint_fast64_t responses[HORA_ARRAY_SIZE(codes)];

static void http_family(struct hora__metrics_writer *w, void *arg) {
  (void)arg;
  hora__metrics_family(w, "hora_metrics_http_responses_total", "counter",
                       "Responses of the metrics endpoint, by status code.");
  for (size_t i = 0; i < HORA_ARRAY_SIZE(codes); i++) {
    char lab[32];
    snprintf(lab, sizeof(lab), "code=\"%d\"", codes[i]);
    hora__metrics_sample_u64(w, "hora_metrics_http_responses_total", lab, atomic_load(&responses[i]));
  }
}

int hora__metrics_check_settings(void) {
  int64_t port = hora__params.METRICS_PORT;
  if (port < 0 || port > 65535) {
    return hora__error(HORA_ERR_INVALID_ARG, "HORA_METRICS_PORT=%lld is not a port (1 to 65535; "
                       "0: no endpoint)", (long long)port);
  }
  struct in6_addr a6;
  struct in_addr a4;
  const char *addr = hora__params.METRICS_ADDR;
  if (inet_pton(AF_INET, addr, &a4) != 1 && inet_pton(AF_INET6, addr, &a6) != 1) {
    return hora__error(HORA_ERR_INVALID_ARG, "HORA_METRICS_ADDR='%s' is not a numeric IPv4 or "
                       "IPv6 address (e.g. 127.0.0.1, 0.0.0.0, ::1)", addr);
  }
  double s = hora__params.METRICS_INTERVAL_SECONDS;
  if (!(s >= 0.05 && s <= 86400)) {
    return hora__error(HORA_ERR_INVALID_ARG, "HORA_METRICS_INTERVAL_SECONDS=%g is out of range "
                       "(0.05 to 86400)", s);
  }
  if (strlen(hora__params.METRICS_FILE) > 900) {
    return hora__error(HORA_ERR_INVALID_ARG, "HORA_METRICS_FILE is longer than 900 characters");
  }
  return HORA_SUCCESS;
}

/* ---- HTTP ------------------------------------------------------------------------ */

static void conn_close(struct server *s, int i) {
  close(s->conns[i].fd);
  free(s->conns[i].out);
  s->conns[i] = s->conns[--s->nconns];
}

static void respond(struct conn *c, int code, const char *reason, const char *extra,
                    const char *body, size_t blen, bool head) {
  for (size_t i = 0; i < HORA_ARRAY_SIZE(codes); i++) {
    if (codes[i] == code) {
      atomic_fetch_add(&responses[i], 1);
    }
  }
  char hdr[320];
  int h = snprintf(hdr, sizeof(hdr),
                   "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
                   "Connection: close\r\n\r\n",
                   code, reason,
                   code == 200 ? "text/plain; version=0.0.4; charset=utf-8" : "text/plain; charset=utf-8",
                   blen, extra);
  size_t send_body = head ? 0 : blen;
  c->out = malloc((size_t)h + send_body);
  c->state = WRITING;
  c->off = 0;
  if (!c->out) {
    c->olen = 0; /* closed once its turn comes */
    return;
  }
  memcpy(c->out, hdr, (size_t)h);
  memcpy(c->out + h, body, send_body);
  c->olen = (size_t)h + send_body;
}

static void error_reply(struct conn *c, int code, const char *reason, const char *extra) {
  char body[80];
  int n = snprintf(body, sizeof(body), "%d %s\n", code, reason);
  respond(c, code, reason, extra, body, (size_t)n, false);
}

/* A whole head in c->req: the request line decides. */
static void handle_request(struct conn *c) {
  char method[16], target[256], version[16];
  char *eol = strpbrk(c->req, "\r\n");
  size_t llen = eol ? (size_t)(eol - c->req) : 0;
  char line[300];
  if (llen == 0 || llen >= sizeof(line)) {
    error_reply(c, 400, "Bad Request", "");
    return;
  }
  memcpy(line, c->req, llen);
  line[llen] = '\0';
  char tail;
  if (sscanf(line, "%15[A-Z] %255[^ ] %15s%c", method, target, version, &tail) != 3 ||
      target[0] != '/' || strncmp(version, "HTTP/1.", 7) != 0) {
    error_reply(c, 400, "Bad Request", "");
    return;
  }
  bool head = strcmp(method, "HEAD") == 0;
  if (!head && strcmp(method, "GET") != 0) {
    error_reply(c, 405, "Method Not Allowed", "Allow: GET, HEAD\r\n");
    return;
  }
  size_t plen = strcspn(target, "?");
  if (plen != 8 || strncmp(target, "/metrics", 8) != 0) {
    error_reply(c, 404, "Not Found", "");
    return;
  }
  struct hora__metrics_writer w;
  memset(&w, 0, sizeof(w));
  hora__metrics_render(&w);
  if (w.text.failed) {
    hora__wbuf_free(&w.text);
    c->state = WRITING; /* out of memory: close without an answer */
    c->olen = 0;
    return;
  }
  respond(c, 200, "OK", "", w.text.data ? (const char *)w.text.data : "", w.text.len, head);
  hora__wbuf_free(&w.text);
}

static void conn_read(struct conn *c) {
  for (;;) {
    ssize_t n = recv(c->fd, c->req + c->rlen, REQUEST_MAX - 1 - c->rlen, 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
      c->deadline_ns = 0; /* gone: closed below */
      return;
    }
    if (n < 0) {
      return;
    }
    c->rlen += (size_t)n;
    c->req[c->rlen] = '\0';
    if (strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n")) {
      handle_request(c);
      return;
    }
    if (memchr(c->req, '\0', c->rlen)) {
      error_reply(c, 400, "Bad Request", ""); /* binary garbage */
      return;
    }
    if (c->rlen == REQUEST_MAX - 1) {
      error_reply(c, 431, "Request Header Fields Too Large", "");
      return;
    }
  }
}

/* Writes what it can; then half-closes and reads until the client closes,
 * so that unread bytes of its request do not turn our close into a reset
 * that loses the response. */
static void conn_write(struct conn *c) {
  while (c->off < c->olen) {
    ssize_t n = send(c->fd, c->out + c->off, c->olen - c->off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
        c->deadline_ns = 0;
      }
      if (errno != EINTR) {
        return;
      }
      continue;
    }
    c->off += (size_t)n;
  }
  shutdown(c->fd, SHUT_WR);
  c->state = DRAINING;
}

static void conn_drain(struct conn *c) {
  char sink[1024];
  ssize_t n;
  while ((n = recv(c->fd, sink, sizeof(sink), 0)) > 0) {
  }
  if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    c->deadline_ns = 0;
  }
}

/* Out of descriptors (or kernel memory) with clients waiting, poll()
 * would report the listener ready again at once: each waiting client is
 * shed through the spare descriptor (accepted and closed), and without a
 * spare the listener is left alone for a moment. */
static bool cannot_accept(struct server *s, uint64_t now, int err) {
  if (err == EMFILE || err == ENFILE) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (hora__accept_shed(s->listen_fd, &s->reserve_fd, &ss, &len) == 0) {
      if (!s->accept_warned) {
        HORA_WARN("metrics: out of file descriptors (%s): closing the endpoint's new "
                  "connections unanswered while it lasts", strerror(err));
        s->accept_warned = true;
      }
      return true;
    }
  }
  if (!s->accept_warned) {
    HORA_WARN("metrics: accept: %s; the endpoint takes no connections while it lasts",
              strerror(err));
    s->accept_warned = true;
  }
  s->listen_resume_ns = now + LISTEN_PAUSE_NS;
  return false;
}

static void accept_all(struct server *s, uint64_t now) {
  for (int i = 0; i < 256; i++) {
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == EINTR || err == ECONNABORTED || err == EPROTO) {
        continue; /* that connection's trouble, not the listener's */
      }
      if ((err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) &&
          cannot_accept(s, now, err)) {
        continue;
      }
      return; /* EAGAIN, or paused */
    }
    if (s->accept_warned) {
      HORA_INFO("metrics: the endpoint accepts connections again");
      s->accept_warned = false;
    }
    if (s->nconns == MAX_CONNS) {
      int oldest = 0;
      for (int j = 1; j < s->nconns; j++) {
        if (s->conns[j].accepted_ns < s->conns[oldest].accepted_ns) {
          oldest = j;
        }
      }
      conn_close(s, oldest);
    }
    struct conn *c = &s->conns[s->nconns++];
    c->fd = fd;
    c->state = READING;
    c->accepted_ns = now;
    c->deadline_ns = now + CONN_DEADLINE_NS;
    c->rlen = 0;
    c->req[0] = '\0';
    c->out = NULL;
    c->olen = c->off = 0;
  }
}

/* ---- the file --------------------------------------------------------------------- */

/* A new file beside path, under a name nobody can know in advance, that
 * is created here and nowhere else (O_EXCL, O_NOFOLLOW): a symlink planted
 * where it goes is never followed. Its name in tmp; -1 with errno. */
static int open_temporary(const char *path, char *tmp, size_t n) {
  for (int tries = 0; tries < 8; tries++) {
    uint64_t r = 0;
    if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
      r ^= hora__now_ns() * 0x9e3779b97f4a7c15ull;
    }
    snprintf(tmp, n, "%s.tmp.%d.%016llx", path, (int)getpid(), (unsigned long long)r);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0 || errno != EEXIST) {
      return fd;
    }
  }
  return -1; /* errno: EEXIST */
}

static void write_file(struct server *s) {
  struct hora__metrics_writer w;
  memset(&w, 0, sizeof(w));
  hora__metrics_render(&w);
  int err = 0;
  if (w.text.failed) {
    err = ENOMEM;
  } else {
    char tmp[sizeof(s->path) + 64];
    int fd = open_temporary(s->path, tmp, sizeof(tmp));
    if (fd < 0) {
      err = errno;
    }
    for (size_t off = 0; fd >= 0 && !err && off < w.text.len;) {
      ssize_t n = write(fd, w.text.data + off, w.text.len - off);
      if (n < 0 && errno != EINTR) {
        err = errno;
      } else if (n > 0) {
        off += (size_t)n;
      }
    }
    if (fd >= 0 && close(fd) != 0 && !err) {
      err = errno;
    }
    if (!err && rename(tmp, s->path) != 0) {
      err = errno;
    }
    if (err && fd >= 0) {
      unlink(tmp);
    }
  }
  hora__wbuf_free(&w.text);
  if (err && !s->file_warned) {
    HORA_WARN("HORA_METRICS_FILE: cannot write %s (%s); metrics are not written to the file, the "
              "job goes on (warned once)", s->path, strerror(err));
  } else if (!err && s->file_warned) {
    HORA_INFO("HORA_METRICS_FILE: %s written again", s->path);
  }
  s->file_warned = err != 0;
}

/* ---- the thread ------------------------------------------------------------------- */

static void *serve(void *arg) {
  struct server *s = arg;
  struct pollfd pfd[MAX_CONNS + 2];
  for (;;) {
    uint64_t now = hora__now_ns(), due = UINT64_MAX;
    int n = 0;
    pfd[n++] = (struct pollfd){.fd = s->wake_fd, .events = POLLIN};
    bool listening = now >= s->listen_resume_ns;
    if (s->listen_fd >= 0) {
      pfd[n++] = (struct pollfd){.fd = s->listen_fd, .events = listening ? POLLIN : 0};
      if (!listening) {
        due = HORA_MIN(due, s->listen_resume_ns);
      }
    }
    for (int i = 0; i < s->nconns; i++) {
      pfd[n++] = (struct pollfd){.fd = s->conns[i].fd,
                                 .events = s->conns[i].state == WRITING ? POLLOUT : POLLIN};
      due = HORA_MIN(due, s->conns[i].deadline_ns);
    }
    if (s->path[0]) {
      due = HORA_MIN(due, s->next_file_ns);
    }
    int timeout = due == UINT64_MAX ? -1
                  : due <= now      ? 0
                                    : (int)HORA_MIN((due - now) / 1000000u + 1, 60000u);
    int rc = poll(pfd, (nfds_t)n, timeout);
    if (rc < 0 && errno != EINTR) {
      HORA_WARN("metrics: poll failed (%s); the endpoint stops", strerror(errno));
      break;
    }
    if (pfd[0].revents) {
      break; /* hora__metrics_stop */
    }
    now = hora__now_ns();
    /* The connections polled, by position (accepting below reorders). */
    int first = s->listen_fd >= 0 ? 2 : 1, polled = s->nconns;
    for (int i = polled - 1; i >= 0; i--) {
      struct conn *c = &s->conns[i];
      if (rc > 0 && pfd[first + i].revents) {
        if (c->state == READING) {
          conn_read(c);
        }
        if (c->state == WRITING) {
          conn_write(c);
        } else if (c->state == DRAINING) {
          conn_drain(c);
        }
      }
      if (now >= c->deadline_ns || (c->state == WRITING && !c->out)) {
        conn_close(s, i);
      }
    }
    if (rc > 0 && s->listen_fd >= 0 && listening && pfd[1].revents) {
      accept_all(s, now);
    }
    if (s->path[0] && now >= s->next_file_ns) {
      write_file(s);
      s->next_file_ns = now + s->interval_ns;
    }
  }
  return NULL;
}

/* The listening socket, or -1 with a warning. */
static int listen_on(const char *addr, int port) {
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof(ss));
  socklen_t len;
  struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
  struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
  if (inet_pton(AF_INET, addr, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons((uint16_t)port);
    len = sizeof(*a4);
  } else {
    inet_pton(AF_INET6, addr, &a6->sin6_addr);
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons((uint16_t)port);
    len = sizeof(*a6);
  }
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd >= 0) {
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  }
  if (fd < 0 || bind(fd, (struct sockaddr *)&ss, len) != 0 || listen(fd, 128) != 0) {
    HORA_WARN("HORA_METRICS_PORT: cannot serve metrics on %s%s%s:%d (%s); the job goes on without "
              "the endpoint", ss.ss_family == AF_INET6 ? "[" : "", addr,
              ss.ss_family == AF_INET6 ? "]" : "", port, strerror(errno));
    if (fd >= 0) {
      close(fd);
    }
    return -1;
  }
  HORA_INFO("metrics: serving http://%s%s%s:%d/metrics", ss.ss_family == AF_INET6 ? "[" : "",
            addr, ss.ss_family == AF_INET6 ? "]" : "", port);
  return fd;
}

/* The path with %r as the rank (%% as %). */
static void expand_path(char *out, size_t n, const char *in, int rank) {
  size_t o = 0;
  for (const char *p = in; *p && o + 12 < n; p++) {
    if (p[0] == '%' && p[1] == 'r') {
      o += (size_t)snprintf(out + o, n - o, "%d", rank);
      p++;
    } else if (p[0] == '%' && p[1] == '%') {
      out[o++] = '%';
      p++;
    } else {
      out[o++] = *p;
    }
  }
  out[o] = '\0';
}

int hora__metrics_start(int rank, int local_rank) {
  if (srv || (hora__params.METRICS_PORT == 0 && !hora__params.METRICS_FILE[0])) {
    return HORA_SUCCESS;
  }
  struct server *s = calloc(1, sizeof(*s));
  if (!s) {
    return hora__error(HORA_ERR_NO_MEMORY, "metrics: out of memory");
  }
  s->listen_fd = s->reserve_fd = -1;
  s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->wake_fd < 0) {
    free(s);
    return hora__error(HORA_ERR_SYSTEM, "metrics: eventfd: %s", strerror(errno));
  }
  if (hora__params.METRICS_PORT > 0) {
    s->port = (int)hora__params.METRICS_PORT + HORA_MAX(local_rank, 0);
    if (s->port > 65535) {
      HORA_WARN("HORA_METRICS_PORT: %lld + local rank %d is past 65535; no endpoint here",
                (long long)hora__params.METRICS_PORT, local_rank);
    } else {
      s->listen_fd = listen_on(hora__params.METRICS_ADDR, s->port);
    }
  }
  if (s->listen_fd >= 0) {
    s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC); /* none: paused on EMFILE instead */
  }
  if (hora__params.METRICS_FILE[0]) {
    expand_path(s->path, sizeof(s->path), hora__params.METRICS_FILE, rank);
    s->interval_ns = (uint64_t)(hora__params.METRICS_INTERVAL_SECONDS * 1e9);
    s->next_file_ns = hora__now_ns(); /* at once: a bad path is told at start-up */
  }
  if (s->listen_fd < 0 && !s->path[0]) {
    close(s->wake_fd);
    free(s);
    return HORA_SUCCESS;
  }
  hora__metrics_add_source(http_family, NULL);
  /* Signals go to the program's threads, not this one. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&s->thread, NULL, serve, s);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    hora__metrics_remove_source(http_family, NULL);
    if (s->listen_fd >= 0) {
      close(s->listen_fd);
    }
    if (s->reserve_fd >= 0) {
      close(s->reserve_fd);
    }
    close(s->wake_fd);
    free(s);
    return hora__error(HORA_ERR_SYSTEM, "metrics: cannot start its thread: %s", strerror(rc));
  }
  pthread_setname_np(s->thread, "hora-metrics");
  srv = s;
  return HORA_SUCCESS;
}

void hora__metrics_stop(void) {
  struct server *s = srv;
  if (!s) {
    return;
  }
  srv = NULL;
  uint64_t one = 1;
  (void)!write(s->wake_fd, &one, sizeof(one));
  pthread_join(s->thread, NULL);
  if (s->path[0]) {
    write_file(s); /* the final values */
  }
  while (s->nconns > 0) {
    conn_close(s, s->nconns - 1);
  }
  hora__metrics_remove_source(http_family, NULL);
  if (s->listen_fd >= 0) {
    close(s->listen_fd);
  }
  if (s->reserve_fd >= 0) {
    close(s->reserve_fd);
  }
  close(s->wake_fd);
  free(s);
}
