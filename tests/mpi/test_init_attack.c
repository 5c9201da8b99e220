/* Strangers at the door while the ranks are still inside hora_init. Each
 * rank has an attacker: a process forked before MPI starts (so it shares
 * nothing with MPI), which finds the rank's hora listeners from /proc (the
 * TCP port by the socket inodes of /proc/PID/fd in /proc/net/tcp, the
 * abstract Unix name in /proc/net/unix) and attacks them. To be sure the
 * attack lands during the bootstrap, this program wraps MPI_Allgather (the
 * profiling interface): hora_init's exchange of addresses, which comes right
 * after the listeners exist and right before the connections are made,
 * waits until this rank's attacker has struck.
 *
 * Rounds of hora_init / allreduce / hora_finalize, one per attack:
 *   silent   50 connections that send nothing, held open 3 s
 *   half     50 connections that send the first 20 bytes of a hello
 *   garbage  50 connections that send random bytes (1 KiB, or fewer than a
 *            hello) and stay open
 *   replay   the last rank's control connection to rank 0 is recorded as it
 *            is sent (this program also wraps send()), and the attacker
 *            replays each message on a connection of its own, one step
 *            ahead of the real one: it must be refused
 *   flood    2,000 connections (half TCP, half Unix; 1,000 before the
 *            connections start, 1,000 among them), with this rank's
 *            descriptor limit 48 above what it holds, so accept meets EMFILE
 *   slow     silent connections again, while the last rank waits 2.5 s
 *            before its first hello: the bootstrap lasts, and the strangers
 *            must be dropped by their 1 s deadline, not at its end
 *   storm    new silent connections as fast as the attacker can open them
 *            (TCP and Unix), for 5 s from the address exchange on: more
 *            than the table of half-open connections holds within a
 *            peer's handshake round trip, so strangers must never push a
 *            peer's handshake out
 * Each must start the job (every rank's hora_init succeeds), compute an
 * allreduce right, and take at most 2 s longer than a round without attack
 * (measured from the address exchange to the end of hora_init). The
 * attacker also checks that its silent connections were closed within
 * 1.5 s, and the replayed one at all. */
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/transport/socket.h"
#include "mpitest.h"

enum attack { A_NONE, A_SILENT, A_HALF, A_GARBAGE, A_REPLAY, A_FLOOD, A_SLOW, A_STORM };
static const char *attack_names[] = {"none", "silent", "half", "garbage", "replay", "flood",
                                     "slow-peer", "storm"};
#define STORM_S 5.0

enum op { OP_ARM, OP_STRIKE, OP_REPLAY_MSG, OP_RESULT, OP_QUIT };

struct cmd {
  int op, attack;
  uint32_t len;
  struct sockaddr_un addr;
  socklen_t addr_len;
  uint8_t data[256];
};

struct res {
  int status;  /* 0 ok, else the attacker could not do its part */
  int bad;     /* connections the target did not close when it should have */
  int made;    /* connections made */
  int eof;     /* replay: the target closed the replayed connection */
  int got;     /* replay: bytes the target answered */
  char why[160];
};

static int to_attacker = -1, from_attacker = -1;
static pid_t attacker_pid = -1;
static int world_rank = -1, world_size = -1;
static volatile int cur_attack = A_NONE;
static volatile int in_init;
static double connect_phase_start;
static int replay_fd = -1, replay_msgs;
#define SLOW_PEER_US 2500000

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int read_full(int fd, void *p, size_t n, int timeout_ms) {
  size_t got = 0;
  double until = now_s() + timeout_ms / 1000.0;
  while (got < n) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    int left = (int)((until - now_s()) * 1000);
    if (left <= 0 || poll(&pf, 1, left) <= 0) {
      return -1;
    }
    ssize_t r = read(fd, (char *)p + got, n - got);
    if (r <= 0) {
      return -1;
    }
    got += (size_t)r;
  }
  return 0;
}

static int write_full(int fd, const void *p, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t w = write(fd, (const char *)p + done, n - done);
    if (w <= 0) {
      return -1;
    }
    done += (size_t)w;
  }
  return 0;
}

/* ---- the attacker process ----------------------------------------------------- */

static pid_t target;
static unsigned long armed_tcp[64];
static int narmed_tcp;

/* The socket inodes the target holds. */
static int target_inodes(unsigned long *out, int max) {
  char path[64], link[128];
  snprintf(path, sizeof(path), "/proc/%d/fd", (int)target);
  DIR *d = opendir(path);
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)) && n < max) {
    char p[400];
    snprintf(p, sizeof(p), "%s/%s", path, e->d_name);
    ssize_t l = readlink(p, link, sizeof(link) - 1);
    if (l > 0) {
      link[l] = '\0';
      unsigned long ino;
      if (sscanf(link, "socket:[%lu]", &ino) == 1) {
        out[n++] = ino;
      }
    }
  }
  if (d) {
    closedir(d);
  }
  return n;
}

static bool has(const unsigned long *v, int n, unsigned long x) {
  for (int i = 0; i < n; i++) {
    if (v[i] == x) {
      return true;
    }
  }
  return false;
}

/* The target's listening TCP sockets, by inode and address. */
static int tcp_listeners(unsigned long *ino, struct sockaddr_in *sa, int max) {
  static unsigned long mine[4096];
  int nmine = target_inodes(mine, 4096), n = 0;
  FILE *f = fopen("/proc/net/tcp", "r");
  char line[512];
  while (f && fgets(line, sizeof(line), f) && n < max) {
    unsigned ip, port, st;
    unsigned long inode;
    if (sscanf(line, " %*d: %x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*d %*d %lu", &ip, &port, &st,
               &inode) != 4 ||
        st != 0x0A || !has(mine, nmine, inode)) {
      continue;
    }
    ino[n] = inode;
    memset(&sa[n], 0, sizeof(sa[n]));
    sa[n].sin_family = AF_INET;
    sa[n].sin_addr.s_addr = ip; /* /proc prints the address as the host-order word */
    sa[n].sin_port = htons((uint16_t)port);
    n++;
  }
  if (f) {
    fclose(f);
  }
  return n;
}

/* The target's abstract Unix listener named @hora.* */
static int unix_listener(struct sockaddr_un *sun, socklen_t *len) {
  static unsigned long mine[4096];
  int nmine = target_inodes(mine, 4096), found = 0;
  FILE *f = fopen("/proc/net/unix", "r");
  char line[512];
  while (f && fgets(line, sizeof(line), f) && !found) {
    unsigned long inode;
    unsigned flags;
    char name[200];
    if (sscanf(line, "%*x: %*x %*x %x %*x %*x %lu %199s", &flags, &inode, name) != 3 ||
        !(flags & 0x10000) || strncmp(name, "@hora.", 6) != 0 || !has(mine, nmine, inode)) {
      continue;
    }
    memset(sun, 0, sizeof(*sun));
    sun->sun_family = AF_UNIX;
    size_t nl = strlen(name + 1);
    memcpy(sun->sun_path + 1, name + 1, nl);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl);
    found = 1;
  }
  if (f) {
    fclose(f);
  }
  return found;
}

static struct sockaddr_in t_tcp;
static struct sockaddr_un t_unix;
static socklen_t t_unix_len;

static int find_target(char *why, size_t n) {
  double until = now_s() + 5;
  while (now_s() < until) {
    unsigned long ino[64];
    struct sockaddr_in sa[64];
    int k = tcp_listeners(ino, sa, 64), got_tcp = 0;
    for (int i = 0; i < k; i++) {
      if (!has(armed_tcp, narmed_tcp, ino[i])) {
        t_tcp = sa[i];
        got_tcp = 1;
      }
    }
    if (got_tcp && unix_listener(&t_unix, &t_unix_len)) {
      return 0;
    }
    usleep(2000);
  }
  snprintf(why, n, "no new hora listener of pid %d in /proc/net/{tcp,unix}", (int)target);
  return -1;
}

static int dial(int unix_socket) {
  int fd = socket(unix_socket ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return -1;
  }
  int rc = unix_socket ? connect(fd, (struct sockaddr *)&t_unix, t_unix_len)
                       : connect(fd, (struct sockaddr *)&t_tcp, sizeof(t_tcp));
  if (rc != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int held[4096];
static int nheld;
static int replay_conn = -1;

/* Waits up to `hold` seconds for the target to close the held connections,
 * or with `must_close` > 0, that long, and counts those still open then. */
static int watch_held(double hold, double must_close) {
  double start = now_s();
  int open_left = nheld, bad = 0;
  struct pollfd *pf = calloc((size_t)nheld + 1, sizeof(*pf));
  for (int i = 0; i < nheld; i++) {
    pf[i] = (struct pollfd){.fd = held[i], .events = POLLIN};
  }
  double until = must_close > 0 ? must_close : hold;
  while (open_left > 0 && now_s() - start < until) {
    if (poll(pf, (nfds_t)nheld, 50) < 0) {
      break;
    }
    for (int i = 0; i < nheld; i++) {
      if (pf[i].fd >= 0 && pf[i].revents) {
        char b[256];
        ssize_t r = recv(pf[i].fd, b, sizeof(b), MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN)) {
          pf[i].fd = -1;
          open_left--;
        }
      }
    }
  }
  if (must_close > 0) {
    for (int i = 0; i < nheld; i++) {
      bad += pf[i].fd >= 0;
    }
  }
  free(pf);
  for (int i = 0; i < nheld; i++) {
    close(held[i]);
  }
  nheld = 0;
  return bad;
}

static void strike(int attack, struct res *r) {
  if (find_target(r->why, sizeof(r->why)) != 0) {
    r->status = -1;
    return;
  }
  uint8_t junk[1000];
  switch (attack) {
    case A_SILENT:
    case A_HALF:
    case A_GARBAGE:
    case A_SLOW:
      for (int i = 0; i < 50; i++) {
        int fd = dial(i % 2);
        if (fd < 0) {
          continue;
        }
        r->made++;
        if (attack == A_HALF) {
          /* The first 20 bytes of a well-formed hello: magic, version,
           * kind, rank, size. */
          struct hora__hello h = {.magic = HORA_HELLO_MAGIC, .version = HORA_HELLO_VERSION,
                                  .kind = HORA_CONN_CTRL, .rank = 1, .size = 2};
          uint8_t wire[HORA_HELLO_WIRE_SIZE];
          hora__hello_encode(&h, wire);
          (void)!send(fd, wire, 20, MSG_NOSIGNAL);
        } else if (attack == A_GARBAGE) {
          /* Random bytes: a whole kilobyte, or fewer than a hello. */
          (void)!getrandom(junk, sizeof(junk), 0);
          (void)!send(fd, junk, i % 4 < 2 ? sizeof(junk) : 1 + (size_t)i % 40, MSG_NOSIGNAL);
        }
        held[nheld++] = fd;
      }
      break;
    case A_FLOOD: /* the first half now, the rest while the bootstrap runs */
      for (int i = 0; i < 1000 && nheld < (int)HORA_ARRAY_SIZE(held); i++) {
        int fd = dial(i % 2);
        if (fd >= 0) {
          r->made++;
          held[nheld++] = fd;
        }
      }
      break;
    case A_STORM: /* (the storm itself comes after the answer) */
      for (int fd = dial(0); fd >= 0; fd = -1) {
        r->made++;
        close(fd);
      }
      break;
    default:
      break;
  }
}

/* One step of the replay: the message the real rank is about to send goes
 * out first on the attacker's own connection, then whatever the target
 * answers is read. */
static void replay_step(const struct cmd *c, struct res *r) {
  if (replay_conn < 0) {
    replay_conn = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (replay_conn < 0 ||
        connect(replay_conn, (const struct sockaddr *)&c->addr, c->addr_len) != 0) {
      snprintf(r->why, sizeof(r->why), "replay connect: %s", strerror(errno));
      r->status = -1;
      return;
    }
  }
  if (!r->eof && send(replay_conn, c->data, c->len, MSG_NOSIGNAL) < 0) {
    r->eof = 1;
  }
  double until = now_s() + 0.3;
  while (!r->eof && now_s() < until) {
    struct pollfd pf = {.fd = replay_conn, .events = POLLIN};
    if (poll(&pf, 1, 100) <= 0) {
      break;
    }
    uint8_t b[512];
    ssize_t n = recv(replay_conn, b, sizeof(b), 0);
    if (n <= 0) {
      r->eof = 1;
    } else {
      r->got += (int)n;
    }
  }
}

/* New connections without pause for STORM_S; the oldest are closed to
 * keep the attacker's own descriptors bounded. */
static void storm(struct res *r) {
  double until = now_s() + STORM_S;
  int ring[2048], n = 0;
  for (unsigned i = 0; now_s() < until; i++) {
    int fd = dial((int)(i % 2));
    if (fd < 0) {
      continue;
    }
    r->made++;
    if (n == (int)HORA_ARRAY_SIZE(ring)) {
      close(ring[i % HORA_ARRAY_SIZE(ring)]);
      ring[i % HORA_ARRAY_SIZE(ring)] = fd;
    } else {
      ring[n++] = fd;
    }
  }
  for (int i = 0; i < n; i++) {
    close(ring[i]);
  }
}

static void attacker_main(int in, int out) {
  target = getppid();
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  signal(SIGPIPE, SIG_IGN);
  struct cmd c;
  struct res r;
  int attack = A_NONE;
  while (read_full(in, &c, sizeof(c), 600000) == 0) {
    switch (c.op) {
      case OP_ARM: /* before hora_init: note the TCP listeners MPI already has */
        attack = c.attack;
        memset(&r, 0, sizeof(r));
        narmed_tcp = 0;
        {
          struct sockaddr_in sa[64];
          narmed_tcp = tcp_listeners(armed_tcp, sa, 64);
        }
        if (replay_conn >= 0) {
          close(replay_conn);
          replay_conn = -1;
        }
        write_full(out, &r, sizeof(r));
        break;
      case OP_STRIKE:
        strike(attack, &r);
        write_full(out, &r, sizeof(r));
        /* Then watch the connections at once, while the bootstrap runs:
         * the target must close them within 1.5 s of being made. */
        if (attack == A_SILENT || attack == A_HALF || attack == A_GARBAGE || attack == A_SLOW) {
          r.bad = watch_held(4.0, c.len ? 1.5 : 0);
        } else if (attack == A_FLOOD) {
          for (int i = 0; i < 1000 && nheld < (int)HORA_ARRAY_SIZE(held); i++) {
            int fd = dial(i % 2);
            if (fd >= 0) {
              r.made++;
              held[nheld++] = fd;
            }
          }
          watch_held(1.0, 0);
        } else if (attack == A_STORM) {
          storm(&r);
        }
        break;
      case OP_REPLAY_MSG:
        replay_step(&c, &r);
        write_full(out, &r, sizeof(r));
        break;
      case OP_RESULT:
        if (attack == A_REPLAY && replay_conn >= 0 && !r.eof) {
          struct pollfd pf = {.fd = replay_conn, .events = POLLIN};
          char b[64];
          if (poll(&pf, 1, 1000) > 0 && recv(replay_conn, b, sizeof(b), 0) <= 0) {
            r.eof = 1;
          }
        }
        write_full(out, &r, sizeof(r));
        break;
      default:
        _exit(0);
    }
  }
  _exit(0);
}

static int start_attacker(void) {
  int a[2], b[2];
  if (pipe2(a, O_CLOEXEC) != 0 || pipe2(b, O_CLOEXEC) != 0) {
    return -1;
  }
  attacker_pid = fork();
  if (attacker_pid < 0) {
    return -1;
  }
  if (attacker_pid == 0) {
    close(a[1]);
    close(b[0]);
    attacker_main(a[0], b[1]);
  }
  close(a[0]);
  close(b[1]);
  to_attacker = a[1];
  from_attacker = b[0];
  return 0;
}

static int ask(const struct cmd *c, struct res *r, int timeout_ms) {
  if (write_full(to_attacker, c, sizeof(*c)) != 0 ||
      read_full(from_attacker, r, sizeof(*r), timeout_ms) != 0) {
    memset(r, 0, sizeof(*r));
    r->status = -1;
    snprintf(r->why, sizeof(r->why), "no answer from the attacker");
    return -1;
  }
  return 0;
}

/* ---- the interposers ------------------------------------------------------------ */

static struct res strike_res;

/* hora_init's exchange of listening addresses: strike first. */
int MPI_Allgather(const void *sb, int sc, MPI_Datatype st, void *rb, int rc, MPI_Datatype rt,
                  MPI_Comm comm) {
  bool hora_exchange = in_init && st == MPI_BYTE && sc == (int)sizeof(struct hora__peer_info);
  if (hora_exchange && cur_attack != A_NONE && cur_attack != A_REPLAY) {
    /* The slow rank itself sleeps inside its bootstrap: its own strangers
     * wait for it. */
    struct cmd c = {.op = OP_STRIKE,
                    .len = !(cur_attack == A_SLOW && world_rank == world_size - 1)};
    ask(&c, &strike_res, 10000);
  }
  int ret = PMPI_Allgather(sb, sc, st, rb, rc, rt, comm);
  if (hora_exchange) {
    connect_phase_start = now_s();
  }
  return ret;
}

/* The first socket this rank sends on to rank 0's hora listener
 * (@hora.JOB.0.TAG) during hora_init: hand each message to the attacker,
 * which replays it before it really goes out. */
static int is_replay_target(int fd) {
  if (fd == replay_fd) {
    return 1;
  }
  if (replay_fd >= 0) {
    return 0;
  }
  struct sockaddr_un sun;
  socklen_t len = sizeof(sun);
  if (getpeername(fd, (struct sockaddr *)&sun, &len) != 0 || sun.sun_family != AF_UNIX ||
      len <= offsetof(struct sockaddr_un, sun_path) + 1 || sun.sun_path[0] != '\0' ||
      strncmp(sun.sun_path + 1, "hora.", 5) != 0) {
    return 0;
  }
  size_t nl = len - offsetof(struct sockaddr_un, sun_path) - 1;
  const char *name = sun.sun_path + 1, *tag = memrchr(name, '.', nl);
  if (!tag || tag - name < 2 || tag[-1] != '0' || tag[-2] != '.') {
    return 0;
  }
  replay_fd = fd;
  return 1;
}

static int slowed;

ssize_t send(int fd, const void *buf, size_t len, int flags) {
  if (in_init && cur_attack == A_SLOW && world_rank == world_size - 1 && world_rank > 0 &&
      !slowed && is_replay_target(fd)) {
    slowed = 1;
    usleep(SLOW_PEER_US); /* a peer that is slow to say hello keeps the bootstrap going */
  }
  if (in_init && cur_attack == A_REPLAY && world_rank == world_size - 1 && world_rank > 0 &&
      is_replay_target(fd) && len <= sizeof(((struct cmd *)0)->data)) {
    struct cmd c = {.op = OP_REPLAY_MSG, .len = (uint32_t)len};
    memcpy(c.data, buf, len);
    c.addr_len = sizeof(c.addr);
    getpeername(fd, (struct sockaddr *)&c.addr, &c.addr_len);
    struct res r;
    ask(&c, &r, 5000);
    replay_msgs++;
  }
  return sendto(fd, buf, len, flags, NULL, 0);
}

/* ---- the rounds ------------------------------------------------------------------- */

struct outcome {
  int init_ok;
  double connect_s; /* address exchange to the end of hora_init */
  int sum_ok;
};

static struct outcome one_round(int attack) {
  struct outcome o = {0};
  cur_attack = attack;
  replay_fd = -1;
  replay_msgs = 0;
  slowed = 0;
  memset(&strike_res, 0, sizeof(strike_res));
  struct cmd c = {.op = OP_ARM, .attack = attack};
  struct res r;
  MT_CHECK(ask(&c, &r, 10000) == 0, "%s: the attacker does not answer", attack_names[attack]);
  struct rlimit saved;
  getrlimit(RLIMIT_NOFILE, &saved);
  if (attack == A_FLOOD) {
    /* Few descriptors to spare: the flood must meet EMFILE in accept. */
    int open_now = 0;
    DIR *d = opendir("/proc/self/fd");
    while (d && readdir(d)) {
      open_now++;
    }
    if (d) {
      closedir(d);
    }
    struct rlimit low = saved;
    low.rlim_cur = (rlim_t)open_now + 48;
    setrlimit(RLIMIT_NOFILE, &low);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  connect_phase_start = now_s();
  in_init = 1;
  int rc = hora_init();
  in_init = 0;
  o.connect_s = now_s() - connect_phase_start;
  setrlimit(RLIMIT_NOFILE, &saved);
  o.init_ok = rc == HORA_SUCCESS;
  MT_CHECK(o.init_ok, "%s: hora_init failed: %s: %s", attack_names[attack], hora_strerror(rc),
           hora_last_error());
  MT_CHECK(strike_res.status == 0, "%s: attacker: %s", attack_names[attack], strike_res.why);
  if (o.init_ok) {
    enum { N = 1000 };
    static int32_t v[N];
    for (int i = 0; i < N; i++) {
      v[i] = world_rank * 1000 + i;
    }
    MT_OK(hora_allreduce("init-attack", v, v, N, HORA_INT32, HORA_SUM));
    o.sum_ok = 1;
    for (int i = 0; i < N; i++) {
      int32_t want = 1000 * (world_size * (world_size - 1) / 2) + world_size * i;
      if (v[i] != want) {
        MT_CHECK(0, "%s: element %d is %d, expected %d", attack_names[attack], i, v[i], want);
        o.sum_ok = 0;
        break;
      }
    }
    MT_OK(hora_finalize());
  }
  struct cmd q = {.op = OP_RESULT};
  ask(&q, &r, 10000);
  if (attack != A_NONE && attack != A_REPLAY) {
    MT_CHECK(strike_res.made > 0, "%s: the attacker made no connection", attack_names[attack]);
  }
  MT_CHECK(r.bad == 0, "%s: %d of %d connections still open 1.5 s after they were made",
           attack_names[attack], r.bad, strike_res.made);
  if (attack == A_REPLAY && world_rank == world_size - 1 && world_rank > 0) {
    MT_CHECK(replay_msgs > 0, "replay: nothing was recorded to replay");
    MT_CHECK(r.status == 0, "replay: attacker: %s", r.why);
    MT_CHECK(r.eof, "replay: the replayed connection was not closed (%d bytes answered)", r.got);
  }
  return o;
}

static double baseline_s;

static void check_round(int attack) {
  struct outcome o = one_round(attack);
  double worst = 0;
  MPI_Allreduce(&o.connect_s, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (world_rank == 0) {
    printf("   %s: bootstrap %.3f s (without attack %.3f s)\n", attack_names[attack], worst,
           baseline_s);
    fflush(stdout);
  }
  double allowed = baseline_s + 2.0 + (attack == A_SLOW ? SLOW_PEER_US * 1e-6 : 0);
  MT_CHECK(worst <= allowed, "%s: bootstrap took %.3f s, %.3f s without attack",
           attack_names[attack], worst, baseline_s);
}

static void no_attack(void) {
  double best = 1e9;
  for (int i = 0; i < 2; i++) {
    struct outcome o = one_round(A_NONE);
    double worst = 0;
    MPI_Allreduce(&o.connect_s, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    best = worst < best ? worst : best;
  }
  baseline_s = best;
}

static void silent(void) { check_round(A_SILENT); }
static void half(void) { check_round(A_HALF); }
static void garbage(void) { check_round(A_GARBAGE); }
static void replay(void) { check_round(A_REPLAY); }
static void flood(void) { check_round(A_FLOOD); }
static void slow_peer(void) { check_round(A_SLOW); }
static void storm_round(void) { check_round(A_STORM); }

int main(int argc, char **argv) {
  /* Before MPI: the attacker must share nothing with it. */
  if (start_attacker() != 0) {
    fprintf(stderr, "cannot start the attacker: %s\n", strerror(errno));
    return 1;
  }
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  mt_setenv_args(argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  mt_rank = world_rank;
  mt_size = world_size;
  /* An attack that holds the bootstrap fails it in 10 s, not 60. */
  setenv("HORA_CONNECT_TIMEOUT_SECONDS", "10", 0);
  signal(SIGPIPE, SIG_IGN);
  mt_run("init_attack/baseline", no_attack);
  mt_run("init_attack/silent_clients", silent);
  mt_run("init_attack/half_hello", half);
  mt_run("init_attack/garbage", garbage);
  mt_run("init_attack/replayed_hello", replay);
  mt_run("init_attack/flood_2000_connections_emfile", flood);
  mt_run("init_attack/silent_clients_dropped_after_1s", slow_peer);
  mt_run("init_attack/storm_of_new_connections_5s", storm_round);
  struct cmd q = {.op = OP_QUIT};
  (void)!write(to_attacker, &q, sizeof(q));
  waitpid(attacker_pid, NULL, 0);
  int failures = mt_total_failures();
  MPI_Finalize();
  return failures ? 1 : 0;
}
