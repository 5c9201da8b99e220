/* The bootstrap's table of half-open connections under a flood: strangers
 * that have proved nothing make room for newcomers, a rank's handshake in
 * progress (its hello claims a connection this rank expects) never does. */
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../runner.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/transport/socket.h"

static void add_stranger(struct plan *p, uint64_t since) {
  struct stranger *t = &p->half[p->nhalf++];
  memset(t, 0, sizeof(*t));
  t->fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  t->since = since;
  t->pfd = -1;
  snprintf(t->who, sizeof(t->who), "stranger %llu", (unsigned long long)since);
}

TEST(strangers_flood_never_pushes_out_a_ranks_handshake) {
  enum { MAX = 8, RANKS = 4 };
  struct stranger half[MAX];
  uint8_t want[RANKS * HORA_CONN_SLOTS] = {0};
  struct plan p;
  memset(&p, 0, sizeof(p));
  p.half = half;
  p.half_max = MAX;
  p.want_in = want;
  want[hora__boot_slot_of(1, HORA_CONN_DATA)] = 1;
  /* The oldest entry is rank 1's data connection: its hello has come, its
   * proof is on the way. The rest are strangers. */
  add_stranger(&p, 1);
  half[0].hs.claimed = true;
  half[0].hs.peer = 1;
  half[0].hs.kind = HORA_CONN_DATA;
  for (int i = 1; i < MAX; i++) {
    add_stranger(&p, 1 + (uint64_t)i);
  }
  /* A flood: each newcomer finds the table full. */
  for (int k = 0; k < 100; k++) {
    hora__boot_drop_oldest(&p, "dropped as the oldest");
    ASSERT_EQ_INT(p.nhalf, MAX - 1);
    add_stranger(&p, 100 + (uint64_t)k);
  }
  int kept = 0;
  for (int i = 0; i < p.nhalf; i++) {
    kept += half[i].hs.claimed && half[i].hs.peer == 1;
  }
  ASSERT_EQ_INT(p.refused, 100);
  while (p.nhalf > 0) {
    hora__boot_refuse(&p, p.nhalf - 1, "the end");
  }
  ASSERT(kept == 1);
}

/* ---- a listener with a plan behind it: rank 0 of 2, expecting rank 1's
 * data connection ---- */

struct door {
  hora__comm c;
  struct hora__proc proc;
  struct plan p;
  struct stranger half[8];
  uint8_t want[2 * HORA_CONN_SLOTS];
  int lfd;
  struct sockaddr_un sun;
  socklen_t sunlen;
};

static void door_open(struct door *d) {
  memset(d, 0, sizeof(*d));
  d->proc.tcp_listen_fd = d->proc.unix_listen_fd = d->proc.reserve_fd = -1;
  memset(d->proc.secret, 0x5a, sizeof(d->proc.secret));
  d->proc.net.rank = 0;
  d->proc.net.size = 2;
  d->c.proc = &d->proc;
  d->c.net = &d->proc.net;
  d->c.rank = 0;
  d->c.size = 2;
  d->p.c = &d->c;
  d->p.half = d->half;
  d->p.half_max = (int)(sizeof(d->half) / sizeof(d->half[0]));
  d->p.want_in = d->want;
  d->want[hora__boot_slot_of(1, HORA_CONN_DATA)] = 1;
  d->p.expected_in = 1;
  d->sun.sun_family = AF_UNIX;
  int n = snprintf(d->sun.sun_path + 1, sizeof(d->sun.sun_path) - 1, "hora-test-door.%d",
                   (int)getpid());
  d->sunlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
  d->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  ASSERT(d->lfd >= 0);
  ASSERT(bind(d->lfd, (struct sockaddr *)&d->sun, d->sunlen) == 0);
  ASSERT(listen(d->lfd, 16) == 0);
}

static void door_close(struct door *d) {
  while (d->p.nhalf > 0) {
    hora__boot_refuse(&d->p, d->p.nhalf - 1, "the test ended");
  }
  for (int i = 0; i < d->p.nsocks; i++) {
    close(d->p.socks[i].fd);
  }
  free(d->p.socks);
  d->p.socks = NULL;
  d->p.nsocks = 0;
  if (d->lfd >= 0) {
    close(d->lfd);
    d->lfd = -1;
  }
}

static int door_dial(const struct door *d) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (const struct sockaddr *)&d->sun, d->sunlen) != 0) {
    return -1;
  }
  return fd;
}

/* A hello as rank 1 would send it, with a nonce that marks whose it is. */
static void hello_of_rank_1(uint8_t wire[HORA_HELLO_WIRE_SIZE], uint8_t mark) {
  struct hora__hello h = {.magic = HORA_HELLO_MAGIC, .version = HORA_HELLO_VERSION,
                          .kind = HORA_CONN_DATA, .rank = 1, .size = 2};
  memset(h.nonce, mark, sizeof(h.nonce));
  hora__hello_encode(&h, wire);
}

static int stranger_marked(const struct plan *p, uint8_t mark) {
  for (int i = 0; i < p->nhalf; i++) {
    if (p->half[i].hs.claimed && p->half[i].hs.nonce_c[0] == mark) {
      return i;
    }
  }
  return -1;
}

/* Moves the client's side of a handshake until it waits for the other
 * side, once what it waits for has come (at most 2 s). */
static void client_pump(int fd, struct hora__hs *hs) {
  struct pollfd pfd = {.fd = fd, .events = hs->state == HORA_HS_SEND ? POLLOUT : POLLIN};
  if (poll(&pfd, 1, 2000) != 1) {
    return;
  }
  int err = 0;
  while (hora__boot_pump(fd, hs, &err) == 1) {
  }
}

/* A stranger who has seen rank 1's hello (or guessed it) sends it first,
 * and again on a new connection each time its claim expires. Rank 1's own
 * claim must not be refused because of it, and must not be the one a flood
 * pushes out. */
TEST(strangers_forged_claim_cannot_lock_out_the_real_rank) {
  struct door d;
  door_open(&d);
  enum { FORGED = 0xf0, REAL = 0x11 };
  uint8_t wire[HORA_HELLO_WIRE_SIZE];
  hello_of_rank_1(wire, FORGED);
  int forger = door_dial(&d);
  ASSERT(forger >= 0);
  ASSERT(write(forger, wire, sizeof(wire)) == (ssize_t)sizeof(wire));
  ASSERT_EQ_INT(hora__boot_accept_from(&d.p, d.lfd, true), HORA_SUCCESS);
  ASSERT(stranger_marked(&d.p, FORGED) >= 0);

  /* Rank 1 itself, while the forged claim is held. */
  int real = door_dial(&d);
  ASSERT(real >= 0);
  ASSERT(hora__socket_nonblocking(real) == HORA_SUCCESS);
  struct hora__hs hs;
  uint8_t nonce[HORA_HS_NONCE_LEN];
  memset(nonce, REAL, sizeof(nonce));
  hora__hs_connector(&hs, d.proc.secret, 2, HORA_CONN_SLOTS, 1, 0, HORA_CONN_DATA, nonce);
  client_pump(real, &hs);
  ASSERT_EQ_INT(hora__boot_accept_from(&d.p, d.lfd, true), HORA_SUCCESS);
  if (stranger_marked(&d.p, REAL) < 0) {
    char why[300];
    snprintf(why, sizeof(why), "%s", d.p.first_refused);
    door_close(&d);
    close(forger);
    close(real);
    FAIL("rank 1 was refused while a forged claim of its connection was held: %s", why);
  }

  /* A flood of silent strangers while rank 1 proves the secret: the forged
   * claim goes, rank 1's stays. */
  while (d.p.nhalf < d.p.half_max) {
    add_stranger(&d.p, hora__now_ns() + 1000000000ull + (uint64_t)d.p.nhalf);
  }
  ASSERT(hora__boot_drop_oldest(&d.p, "dropped as the oldest"));
  int forged_left = stranger_marked(&d.p, FORGED) >= 0, real_left = stranger_marked(&d.p, REAL) >= 0;
  for (int k = 0; k < 20; k++) {
    add_stranger(&d.p, hora__now_ns() + 2000000000ull + (uint64_t)k);
    hora__boot_drop_oldest(&d.p, "dropped as the oldest");
  }
  real_left = real_left && stranger_marked(&d.p, REAL) >= 0;

  client_pump(real, &hs); /* the challenge in, the proof out */
  int i = stranger_marked(&d.p, REAL);
  struct pollfd pfd = {.fd = i >= 0 ? d.p.half[i].fd : -1, .events = POLLIN};
  if (i >= 0 && poll(&pfd, 1, 2000) == 1) {
    ASSERT_EQ_INT(hora__boot_step_stranger(&d.p, i), HORA_SUCCESS);
  }
  client_pump(real, &hs); /* the acknowledgement */
  bool connected = d.p.nsocks == 1 && d.p.socks[0].peer == 1 && d.p.socks[0].done &&
                   d.p.expected_in == 0;
  door_close(&d);
  close(forger);
  close(real);
  ASSERT(!forged_left);
  ASSERT(real_left);
  ASSERT_EQ_INT(hs.state, HORA_HS_DONE);
  ASSERT(connected);
}

/* A local process of another user that connects to a Unix listener (its
 * name is public, in /proc/net/unix) is refused at once, naming its uid,
 * even with a well-formed hello claiming an expected connection. */
TEST(strangers_of_another_uid_are_refused_on_the_unix_listener) {
  if (geteuid() != 0) {
    SKIP("needs root, to connect as another user (uid 65534)");
  }
  struct door d;
  door_open(&d);
  int go[2];
  ASSERT(pipe(go) == 0);
  pid_t child = fork();
  ASSERT(child >= 0);
  if (child == 0) {
    /* Another user: connects, sends rank 1's hello, waits (at most 5 s)
     * for the close. */
    close(go[0]);
    if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0) {
      _exit(2);
    }
    int fd = door_dial(&d);
    uint8_t wire[HORA_HELLO_WIRE_SIZE];
    hello_of_rank_1(wire, 0x22);
    if (fd < 0 || write(fd, wire, sizeof(wire)) != (ssize_t)sizeof(wire)) {
      _exit(3);
    }
    (void)!write(go[1], "x", 1);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    char buf[128];
    while (poll(&pfd, 1, 5000) == 1 && read(fd, buf, sizeof(buf)) > 0) {
    }
    _exit(0);
  }
  close(go[1]);
  char x;
  struct pollfd pfd = {.fd = go[0], .events = POLLIN};
  bool dialled = poll(&pfd, 1, 5000) == 1 && read(go[0], &x, 1) == 1;
  close(go[0]);
  int rc = dialled ? hora__boot_accept_from(&d.p, d.lfd, true) : HORA_ERR_SYSTEM;
  int kept = d.p.nhalf, refused = d.p.refused;
  char why[300];
  snprintf(why, sizeof(why), "%s", d.p.first_refused);
  door_close(&d);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT(dialled);
  ASSERT_EQ_INT(rc, HORA_SUCCESS);
  if (kept != 0) {
    FAIL("the connection of a process of uid 65534 was kept as a stranger (%d kept, %d refused)",
         kept, refused);
  }
  ASSERT_EQ_INT(refused, 1);
  ASSERT_STR_CONTAINS(why, "uid 65534");
  ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}
