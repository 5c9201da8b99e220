/* Elastic membership: the driver. The agreement itself is a state machine
 * with no I/O (membership_fsm.c, where the protocol and why it is safe are
 * described); here one thread per process owns its listener, the door,
 * every connection and the clock, and steps the machine with what arrives.
 *
 * Frames go one way per connection: a process sends on connections it
 * dialled and reads those it accepted, each served from one poll loop, so
 * a peer that is slow or silent (or idle connections opened by anyone)
 * delays nobody else. With a secret every connection opens with the
 * handshake of comm/transport/handshake.h, of one of two kinds:
 *   member    the job's agreement (RESET, PREPARE, ...): a key derived from
 *             the secret and the job id, so a job sharing the secret cannot
 *             take part
 *   door      what newcomers send and are sent (JOIN, COMMIT, REFUSE,
 *             REDIRECT): a key from the secret alone, which newcomers know
 *
 * Threads: the listener's thread steps the machine; callers of agree and
 * join hand it a command and wait for the decision. Lock order: m->mu, then
 * whatever on_request takes (the runtime's lock). */
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

static void sm_log(void *arg, int level, const char *msg) {
  (void)arg;
  if (hora__log_enabled(level)) {
    hora__log_write(level, __FILE__, __LINE__, "%s", msg);
  }
}

/* HORA_ELASTIC_TEST_CRASH=POINT@ID: this process dies at POINT (tests). */
static void crash_point(void *arg, const char *point) {
  struct hora__membership *m = arg;
  const char *v = hora__params.ELASTIC_TEST_CRASH;
  size_t n = strlen(point);
  if (m->sm && v[0] && strncmp(v, point, n) == 0 && v[n] == '@' &&
      (uint32_t)atoi(v + n + 1) == hora__mfsm_my_id(m->sm)) {
    HORA_WARN("elastic: HORA_ELASTIC_TEST_CRASH=%s: dying now", v);
    raise(SIGKILL);
  }
}

static int new_machine(struct hora__membership *m) {
  uint64_t seed = 0;
  HORA_CHECK(hora__boot_random_bytes(&seed, sizeof(seed), "membership jitter"));
  struct hora__mfsm_config c = {
      .ip = m->my_ip, .port = m->my_port, .min_size = (int)hora__params.ELASTIC_MIN_SIZE,
      .max_size = (int)hora__params.ELASTIC_MAX_SIZE,
      .elastic_timeout_ns = (uint64_t)(hora__params.ELASTIC_TIMEOUT_SECONDS * 1e9),
      .insecure = !m->has_key, .seed = seed | 1, .log = sm_log, .log_arg = m,
      .point = crash_point, .point_arg = m};
  hora__mfsm_free(m->sm);
  m->sm = NULL;
  return hora__mfsm_new(&c, &m->sm);
}

/* ---- the listener's thread ----------------------------------------------------------- */

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

static void run_command_locked(struct hora__membership *m, uint64_t now) {
  if (m->cmd == CMD_RESET) {
    hora__mfsm_reset(m->sm, now, m->build_port);
  } else if (m->cmd == CMD_JOIN) {
    hora__mfsm_join(m->sm, now, m->cmd_ip, m->cmd_port, m->build_port);
  }
  if (m->cmd != CMD_NONE) {
    m->cmd = CMD_NONE;
    hora__mbd_flush_locked(m, now);
  }
}

/* Closing: what is queued on open connections (a refusal that ends the
 * members' reset, say) goes out, for a moment at most. */
static void drain(struct hora__membership *m) {
  uint64_t until = hora__now_ns() + 200ull * 1000000ull;
  for (;;) {
    bool left = false;
    for (int i = 0; i < m->nc; i++) {
      struct conn *c = m->c[i];
      if (c->out && c->state == C_OPEN && c->nq) {
        left |= hora__mbd_write_frames(c, hora__now_ns()) && c->nq;
      }
    }
    uint64_t t = hora__now_ns();
    if (!left || t >= until) {
      return;
    }
    struct timespec ts = {0, 5 * 1000000};
    nanosleep(&ts, NULL);
  }
}

static void *listener_main(void *arg) {
  struct hora__membership *m = arg;
  struct pollfd *pf = NULL;
  int cap = 0;
  for (;;) {
    uint64_t now = hora__now_ns();
    pthread_mutex_lock(&m->mu);
    if (m->stop) {
      pthread_mutex_unlock(&m->mu);
      drain(m);
      break;
    }
    run_command_locked(m, now);
    uint64_t due = m->sm ? hora__mfsm_next_tick(m->sm) : UINT64_MAX;
    if (m->have_result && !m->result_out) {
      due = HORA_MIN(due, now + 10ull * 1000000ull);
    }
    pthread_mutex_unlock(&m->mu);
    apply_door(m);
    if (cap < m->nc + 3) {
      cap = m->nc + 35;
      struct pollfd *p = realloc(pf, (size_t)cap * sizeof(*p));
      if (!p) {
        break;
      }
      pf = p;
    }
    int n = 0;
    pf[n++] = (struct pollfd){m->lfd, POLLIN, 0};
    pf[n++] = (struct pollfd){m->wake_fd, POLLIN, 0};
    pf[n++] = (struct pollfd){m->door_fd, POLLIN, 0};
    for (int i = 0; i < m->nc; i++) {
      struct conn *c = m->c[i];
      short ev = c->state == C_CONNECTING ? POLLOUT
                 : c->state == C_SHAKING  ? (c->hs.state == HORA_HS_SEND ? POLLOUT : POLLIN)
                 : c->out                 ? (short)(POLLIN | (c->nq ? POLLOUT : 0))
                                          : POLLIN;
      pf[n++] = (struct pollfd){c->fd, ev, 0};
      if (c->state != C_OPEN || (!c->out && !m->has_key && c->got == 0 && c->deadline)) {
        due = HORA_MIN(due, c->deadline);
      }
    }
    int ms = 500;
    if (due != UINT64_MAX) {
      ms = due <= now ? 0 : (int)HORA_MIN((due - now) / 1000000ull + 1, 500);
    }
    int nconn = m->nc;
    if (poll(pf, (nfds_t)n, ms) < 0 && errno != EINTR) {
      break;
    }
    now = hora__now_ns();
    if (pf[1].revents) {
      uint64_t v;
      (void)!read(m->wake_fd, &v, sizeof(v));
    }
    /* Connections first (their indices are the poll set's), newest last. */
    for (int i = nconn - 1; i >= 0; i--) {
      struct conn *c = m->c[i];
      short rev = pf[3 + i].revents;
      bool keep = rev ? hora__mbd_step_conn(m, c, rev, now) : true;
      if (keep && c->state != C_OPEN && now >= c->deadline) {
        if (c->out) {
          hora__mbd_add_hint(m, c->ip, c->port, HORA_MB_SILENT);
        }
        keep = false;
      }
      if (keep && c->state == C_OPEN && !c->out && c->deadline && !m->has_key) {
        if (c->got || c->last_io > c->deadline - IO_NS) {
          c->deadline = 0; /* it spoke */
        } else if (now >= c->deadline) {
          keep = false;
        }
      }
      if (keep && !c->out && c->state == C_OPEN && now - c->last_io > IDLE_NS) {
        keep = false;
      }
      if (!keep) {
        hora__mbd_conn_close(m, i);
      }
    }
    if (pf[0].revents & POLLIN) {
      hora__mbd_accept_from(m, m->lfd, false, now);
    }
    if (m->door_fd >= 0 && (pf[2].revents & POLLIN)) {
      hora__mbd_accept_from(m, m->door_fd, true, now);
    }
    pthread_mutex_lock(&m->mu);
    if (m->sm && hora__mfsm_next_tick(m->sm) <= now) {
      hora__mfsm_tick(m->sm, now);
    }
    hora__mbd_flush_locked(m, now);
    if (m->have_result && !m->result_out) {
      /* The caller learns the decision once what went with it has left (a
       * refusal that ends the others' reset), or a moment has passed. */
      bool queued = false;
      for (int i = 0; i < m->nc && !queued; i++) {
        queued = m->c[i]->out && m->c[i]->nq > 0;
      }
      if (!queued || now - m->result_at > 300ull * 1000000ull) {
        m->result_out = true;
        pthread_cond_broadcast(&m->cv);
      }
    }
    pthread_mutex_unlock(&m->mu);
  }
  free(pf);
  return NULL;
}

/* ---- the interface ---------------------------------------------------------------------- */

/* Every open membership, for the exit handler. */
static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static struct hora__membership *open_list;
static bool stop_registered;

static void stop_thread(struct hora__membership *m) {
  if (!m->thread_started) {
    return;
  }
  pthread_mutex_lock(&m->mu);
  m->stop = true;
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
  hora__mbd_wake(m);
  pthread_join(m->thread, NULL);
  m->thread_started = false;
}

/* A process that exits without hora_finalize (after a failed reset, say)
 * runs OpenSSL's exit handler, which frees what a handshake the listener's
 * thread is doing uses: the threads stop first. OpenSSL registered its
 * handler before this one (hora__membership_open makes sure), so this one
 * runs first. */
static void stop_listeners_at_exit(void) {
  pthread_mutex_lock(&open_mu);
  for (struct hora__membership *m = open_list; m; m = m->next_open) {
    stop_thread(m);
  }
  pthread_mutex_unlock(&open_mu);
}

int hora__membership_open(const uint8_t *key, struct hora__membership **out) {
  *out = NULL;
  OPENSSL_init_crypto(0, NULL); /* its exit handler before ours */
  struct hora__membership *m = hora__calloc(1, sizeof(*m));
  if (!m) {
    return HORA_ERR_NO_MEMORY;
  }
  m->lfd = m->door_fd = m->wake_fd = -1;
  pthread_mutex_init(&m->mu, NULL);
  pthread_cond_init(&m->cv, NULL);
  int rc = HORA_SUCCESS;
  if (key) {
    m->has_key = true;
    memcpy(m->secret, key, sizeof(m->secret));
    hora__mbd_derive_key(key, "hora-elastic-dr3", 0, m->door_key);
    /* Members' connections fail until the job id is known. */
    rc = hora__boot_random_bytes(m->member_key, sizeof(m->member_key), "membership key");
    m->keys[0] = m->door_key;
    m->keys[1] = m->member_key;
  }
  struct in_addr any = {htonl(INADDR_ANY)};
  struct sockaddr_in bound;
  if (rc == HORA_SUCCESS) {
    rc = hora__listen_tcp(any, &m->lfd, &bound);
  }
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
  pthread_mutex_lock(&open_mu);
  m->next_open = open_list;
  open_list = m;
  if (!stop_registered) {
    stop_registered = atexit(stop_listeners_at_exit) == 0;
  }
  pthread_mutex_unlock(&open_mu);
  *out = m;
  return HORA_SUCCESS;
}

void hora__membership_close(struct hora__membership *m) {
  if (!m) {
    return;
  }
  pthread_mutex_lock(&open_mu);
  for (struct hora__membership **p = &open_list; *p; p = &(*p)->next_open) {
    if (*p == m) {
      *p = m->next_open;
      break;
    }
  }
  stop_thread(m);
  pthread_mutex_unlock(&open_mu);
  while (m->nc) {
    hora__mbd_conn_close(m, m->nc - 1);
  }
  free(m->c);
  int fds[] = {m->lfd, m->door_fd, m->wake_fd};
  for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++) {
    if (fds[i] >= 0) {
      close(fds[i]);
    }
  }
  hora__mfsm_free(m->sm);
  OPENSSL_cleanse(m->secret, sizeof(m->secret));
  OPENSSL_cleanse(m->door_key, sizeof(m->door_key));
  OPENSSL_cleanse(m->member_key, sizeof(m->member_key));
  pthread_cond_destroy(&m->cv);
  pthread_mutex_destroy(&m->mu);
  free(m);
}

/* The machine's view becomes v, with this process's id (under mu). */
static int start_locked(struct hora__membership *m, const struct hora__view *v, uint32_t my_id) {
  HORA_CHECK(new_machine(m));
  if (m->has_key) {
    hora__mbd_derive_key(m->secret, "hora-elastic-mb3", v->job, m->member_key);
    m->keyed_job = v->job;
  }
  return hora__mfsm_start(m->sm, v, my_id);
}

int hora__membership_start(struct hora__membership *m, struct hora__rdv *rdv, uint64_t epoch,
                           uint32_t my_ip) {
  uint8_t mine[16], *all = hora__calloc((size_t)rdv->size, sizeof(mine));
  if (!all) {
    return HORA_ERR_NO_MEMORY;
  }
  uint64_t job = 0;
  int rc = hora__boot_random_bytes(&job, sizeof(job), "job id");
  uint32_t port = htonl(m->my_port);
  memcpy(mine, &my_ip, 4);
  memcpy(mine + 4, &port, 4);
  memcpy(mine + 8, &job, 8);
  if (rc == HORA_SUCCESS) {
    rc = hora__rdv_allgather(rdv, mine, sizeof(mine), all);
  }
  struct hora__view v = {.epoch = epoch, .next_id = (uint32_t)rdv->size, .n = rdv->size};
  v.m = rc == HORA_SUCCESS ? hora__calloc((size_t)rdv->size, sizeof(*v.m)) : NULL;
  if (rc == HORA_SUCCESS && !v.m) {
    rc = HORA_ERR_NO_MEMORY;
  }
  if (rc == HORA_SUCCESS) {
    memcpy(&v.job, all + 8, 8); /* rank 0's draw names the job */
  }
  for (int r = 0; rc == HORA_SUCCESS && r < rdv->size; r++) {
    v.m[r].id = (uint32_t)r;
    memcpy(&v.m[r].ip, all + 16 * r, 4);
    memcpy(&port, all + 16 * r + 4, 4);
    v.m[r].port = (uint16_t)ntohl(port);
  }
  free(all);
  if (rc == HORA_SUCCESS) {
    pthread_mutex_lock(&m->mu);
    m->my_ip = my_ip;
    rc = start_locked(m, &v, (uint32_t)rdv->rank);
    pthread_mutex_unlock(&m->mu);
  }
  hora__mb_view_free(&v);
  return rc;
}

int hora__membership_start_view(struct hora__membership *m, const struct hora__view *v,
                                uint32_t my_id) {
  int k = hora__mb_view_index(v, my_id);
  if (k < 0) {
    return hora__error(HORA_ERR_INVALID_ARG, "elastic: id %u is not in the view", my_id);
  }
  pthread_mutex_lock(&m->mu);
  m->my_ip = v->m[k].ip;
  int rc = m->my_port == v->m[k].port ? start_locked(m, v, my_id)
                                      : hora__error(HORA_ERR_INVALID_ARG, "elastic: the view "
                                                    "gives this process another port");
  pthread_mutex_unlock(&m->mu);
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
  hora__mbd_wake(m);
}

void hora__membership_expect_reset(struct hora__membership *m) {
  pthread_mutex_lock(&m->mu);
  m->in_reset = true;
  pthread_mutex_unlock(&m->mu);
}

int hora__membership_waiting(struct hora__membership *m) {
  pthread_mutex_lock(&m->mu);
  int n = m->sm ? hora__mfsm_waiting(m->sm) : 0;
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
  uint64_t e = m->sm ? hora__mfsm_view(m->sm)->epoch : 0;
  pthread_mutex_unlock(&m->mu);
  return e;
}

/* Hands the listener's thread a command and waits for its decision. */
static int run_command(struct hora__membership *m, int cmd, uint32_t ip, uint16_t port,
                       struct hora__agreed *out, uint64_t wait_ns) {
  int lfd = -1;
  struct in_addr me = {m->my_ip};
  struct sockaddr_in bound;
  HORA_CHECK(hora__listen_tcp(me, &lfd, &bound)); /* the next world's rendezvous, if it hosts it */
  uint64_t deadline = hora__now_ns() + wait_ns;
  pthread_mutex_lock(&m->mu);
  if (m->busy || !m->sm) {
    pthread_mutex_unlock(&m->mu);
    close(lfd);
    return hora__error(HORA_ERR_INVALID_USAGE, "elastic: %s", m->busy ? "a reset is under way "
                       "on another thread" : "the membership has not started");
  }
  m->busy = true;
  m->have_result = m->result_out = false;
  m->in_reset = true;
  m->cmd = cmd;
  m->cmd_ip = ip;
  m->cmd_port = port;
  m->build_port = ntohs(bound.sin_port);
  hora__mbd_wake(m);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t abs_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + wait_ns;
  ts.tv_sec = (time_t)(abs_ns / 1000000000ull);
  ts.tv_nsec = (long)(abs_ns % 1000000000ull);
  while (!(m->have_result && m->result_out) && !m->stop && hora__now_ns() < deadline) {
    pthread_cond_timedwait(&m->cv, &m->mu, &ts);
  }
  struct hora__mfsm_event e = m->result;
  bool got = m->have_result;
  m->busy = false;
  m->in_reset = false;
  pthread_mutex_unlock(&m->mu);
  if (!got) {
    close(lfd);
    return hora__error(m->stop ? HORA_ERR_INVALID_USAGE : HORA_ERR_TIMEOUT,
                       "elastic: %s", m->stop ? "the membership was closed during the reset"
                                              : "no membership was agreed in time");
  }
  if (e.kind == HORA_MFSM_FAILED) {
    close(lfd);
    return hora__error(e.code, "%s", e.msg);
  }
  if (!e.builder) {
    close(lfd);
    lfd = -1;
  }
  *out = (struct hora__agreed){.rank = e.rank, .size = e.size, .epoch = e.epoch,
                               .port = e.builder ? ntohs(bound.sin_port) : e.port,
                               .listen_fd = lfd, .joined = e.joined, .lost = e.lost};
  inet_ntop(AF_INET, &e.host_ip, out->host, sizeof(out->host));
  return HORA_SUCCESS;
}

int hora__membership_agree(struct hora__membership *m, struct hora__agreed *out) {
  uint64_t wait_ns = (uint64_t)((2 * hora__params.ELASTIC_TIMEOUT_SECONDS + 40) * 1e9);
  return run_command(m, CMD_RESET, 0, 0, out, wait_ns);
}

int hora__membership_join(struct hora__membership *m, const char *host, int port,
                          struct hora__agreed *out) {
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
  char ps[16];
  snprintf(ps, sizeof(ps), "%d", port);
  int g = getaddrinfo(host, ps, &hints, &ai);
  if (g != 0) {
    return hora__error(HORA_ERR_INVALID_ARG, "elastic: cannot resolve %s: %s", host,
                       gai_strerror(g));
  }
  struct sockaddr_in door = *(struct sockaddr_in *)ai->ai_addr;
  freeaddrinfo(ai);
  /* The address the job reaches this process at: the one the door's route
   * leaves from (a UDP connect sends nothing). */
  int u = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in self = {0};
  socklen_t len = sizeof(self);
  if (u < 0 || connect(u, (struct sockaddr *)&door, sizeof(door)) < 0 ||
      getsockname(u, (struct sockaddr *)&self, &len) < 0) {
    int e = errno;
    if (u >= 0) {
      close(u);
    }
    errno = e;
    return hora__error_errno(HORA_ERR_PEER_LOST, "elastic: no route to %s:%d", host, port);
  }
  close(u);
  pthread_mutex_lock(&m->mu);
  m->my_ip = self.sin_addr.s_addr;
  int rc = new_machine(m);
  pthread_mutex_unlock(&m->mu);
  HORA_CHECK(rc);
  uint64_t wait_ns = (uint64_t)((3 * hora__params.ELASTIC_TIMEOUT_SECONDS + 40) * 1e9);
  return run_command(m, CMD_JOIN, door.sin_addr.s_addr, (uint16_t)port, out, wait_ns);
}
