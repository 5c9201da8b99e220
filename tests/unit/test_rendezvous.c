/* Start-up without MPI, the parts that need no second process: the
 * choice of rendezvous from the environment, Slurm's node lists, and the
 * tcp rendezvous between two threads behind a slow proxy (the connection
 * keys of memberships are tested with the handshake, in test_message.c). */
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/params.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/bootstrap/rendezvous.h"
#include "comm/shm/shm.h"
#include "comm/transport/socket.h"
#include "../runner.h"

static const char *const launch_vars[] = {
    "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK", "MPI_LOCALNRANKS", "MASTER_ADDR",
    "MASTER_PORT", "RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID",
    "SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "HORA_BOOTSTRAP",
    "HORA_RENDEZVOUS", "HORA_RANK", "HORA_SIZE", "HORA_SECRET", "HORA_SECRET_FILE",
    "HORA_RENDEZVOUS_PORT"};

static void clear_launch(void) {
  for (size_t i = 0; i < sizeof(launch_vars) / sizeof(launch_vars[0]); i++) {
    unsetenv(launch_vars[i]);
  }
}

static int choose(struct hora__rdv_choice *c) {
  int rc = hora__params_load();
  return rc != HORA_SUCCESS ? rc : hora__rdv_choose(false, c);
}

TEST(rendezvous_choice_follows_the_launcher) {
  struct hora__rdv_choice c;
  clear_launch();
  ASSERT(choose(&c) == HORA_SUCCESS && c.kind == HORA_RDV_SINGLE && c.size == 1);
  setenv("HORA_RENDEZVOUS", "h0:29500", 1);
  setenv("HORA_RANK", "2", 1);
  setenv("HORA_SIZE", "4", 1);
  ASSERT(choose(&c) == HORA_SUCCESS && c.kind == HORA_RDV_TCP && c.rank == 2 && c.size == 4);
  ASSERT(strcmp(c.host, "h0") == 0 && c.port == 29500 && !c.has_secret);
  /* torchrun's variables come before HORA_RENDEZVOUS, Slurm's after them. */
  setenv("SLURM_PROCID", "1", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_STEP_ID", "3", 1);
  setenv("SLURM_JOB_ID", "1000", 1);
  setenv("SLURM_STEP_NODELIST", "gpu[07-09],cpu1", 1);
  ASSERT(choose(&c) == HORA_SUCCESS && c.kind == HORA_RDV_SLURM && c.rank == 1 && c.size == 8);
  ASSERT(strcmp(c.host, "gpu07") == 0 && c.port >= 12000 && c.port < 32000);
  setenv("MASTER_ADDR", "m0", 1);
  setenv("MASTER_PORT", "1234", 1);
  setenv("RANK", "5", 1);
  setenv("WORLD_SIZE", "6", 1);
  setenv("HORA_SECRET", "s3", 1);
  ASSERT(choose(&c) == HORA_SUCCESS && c.kind == HORA_RDV_ENV && c.rank == 5 && c.size == 6);
  ASSERT(strcmp(c.host, "m0") == 0 && c.port == 1234 && c.has_secret);
  ASSERT_STR_CONTAINS(c.secret_from, "HORA_SECRET");
  /* An MPI launcher wins over all of them (a build without MPI refuses it
   * rather than start one job per process); HORA_BOOTSTRAP over that. */
  setenv("OMPI_COMM_WORLD_SIZE", "6", 1);
  if (HORA_HAVE_MPI) {
    ASSERT(choose(&c) == HORA_SUCCESS && c.kind == HORA_RDV_MPI);
    ASSERT_STR_CONTAINS(c.why, "OMPI_COMM_WORLD_SIZE");
  } else {
    ASSERT(choose(&c) == HORA_ERR_NOT_SUPPORTED);
    ASSERT_STR_CONTAINS(hora_last_error(), "(OMPI_COMM_WORLD_SIZE is set), but this libhora was "
                                           "built without MPI (configure --without-mpi)");
  }
  setenv("HORA_BOOTSTRAP", "slurm", 1);
  ASSERT(choose(&c) == HORA_SUCCESS && c.kind == HORA_RDV_SLURM);
  setenv("HORA_RENDEZVOUS_PORT", "4321", 1);
  ASSERT(choose(&c) == HORA_SUCCESS && c.port == 4321);
  setenv("HORA_BOOTSTRAP", "mpi", 1);
  if (HORA_HAVE_MPI) {
    ASSERT(choose(&c) == HORA_SUCCESS && c.kind == HORA_RDV_MPI);
  } else {
    ASSERT(choose(&c) == HORA_ERR_NOT_SUPPORTED);
    ASSERT_STR_CONTAINS(hora_last_error(), "HORA_BOOTSTRAP=mpi, but this libhora was built "
                                           "without MPI");
  }
  clear_launch();
  ASSERT(hora__params_load() == HORA_SUCCESS);
}

TEST(rendezvous_bad_variables_are_named) {
  struct hora__rdv_choice c;
  clear_launch();
  setenv("MASTER_ADDR", "m0", 1);
  setenv("MASTER_PORT", "99999", 1);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);
  ASSERT(choose(&c) == HORA_ERR_INVALID_ARG);
  ASSERT_STR_CONTAINS(hora_last_error(), "MASTER_PORT=99999");
  setenv("MASTER_PORT", "29500", 1);
  setenv("WORLD_SIZE", "two", 1);
  ASSERT(choose(&c) == HORA_ERR_INVALID_ARG);
  ASSERT_STR_CONTAINS(hora_last_error(), "WORLD_SIZE=two");
  clear_launch();
  setenv("HORA_BOOTSTRAP", "tcp", 1);
  ASSERT(choose(&c) == HORA_ERR_INVALID_ARG);
  ASSERT_STR_CONTAINS(hora_last_error(), "HORA_RENDEZVOUS");
  setenv("HORA_RENDEZVOUS", "nohostport", 1);
  ASSERT(choose(&c) == HORA_ERR_INVALID_ARG);
  ASSERT_STR_CONTAINS(hora_last_error(), "HORA_RENDEZVOUS=nohostport is not host:port");
  setenv("HORA_RENDEZVOUS", "h:1", 1);
  ASSERT(choose(&c) == HORA_ERR_INVALID_ARG);
  ASSERT_STR_CONTAINS(hora_last_error(), "HORA_SIZE");
  setenv("HORA_SIZE", "3", 1);
  ASSERT(choose(&c) == HORA_ERR_INVALID_ARG);
  ASSERT_STR_CONTAINS(hora_last_error(), "HORA_RANK is not");
  setenv("HORA_BOOTSTRAP", "env", 1);
  ASSERT(choose(&c) == HORA_ERR_INVALID_ARG);
  ASSERT_STR_CONTAINS(hora_last_error(), "MASTER_ADDR is not set");
  setenv("HORA_BOOTSTRAP", "slurm", 1);
  ASSERT(choose(&c) == HORA_ERR_INVALID_ARG);
  ASSERT_STR_CONTAINS(hora_last_error(), "srun");
  clear_launch();
  ASSERT(hora__params_load() == HORA_SUCCESS);
}

TEST(slurm_first_node_of_a_node_list) {
  char n[64];
  ASSERT(hora__slurm_first_node("node7", n, sizeof(n)) == HORA_SUCCESS && !strcmp(n, "node7"));
  ASSERT(hora__slurm_first_node("h[01-04,07],g2", n, sizeof(n)) == HORA_SUCCESS &&
         !strcmp(n, "h01"));
  ASSERT(hora__slurm_first_node("a[3]b,c", n, sizeof(n)) == HORA_SUCCESS && !strcmp(n, "a3b"));
  ASSERT(hora__slurm_first_node("x,y", n, sizeof(n)) == HORA_SUCCESS && !strcmp(n, "x"));
  ASSERT(hora__slurm_first_node("h[1-2", n, sizeof(n)) == HORA_ERR_INVALID_ARG);
  ASSERT(hora__slurm_first_node("", n, sizeof(n)) == HORA_ERR_INVALID_ARG);
}

/* A socket bound to a port and connected to that same port meets itself
 * (TCP's simultaneous open): what a retried connect to a port nobody
 * listens on can end in. The membership's dial and probe, and the
 * rendezvous's clients, must not take it for a peer. */
TEST(a_connection_to_itself_is_no_peer) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT(fd >= 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  ASSERT(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
  ASSERT(getsockname(fd, (struct sockaddr *)&sa, &len) == 0);
  ASSERT(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
  ASSERT(hora__socket_is_self_connected(fd));
  close(fd);
  /* An ordinary connection is not. */
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in la = {.sin_family = AF_INET};
  la.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  len = sizeof(la);
  ASSERT(bind(l, (struct sockaddr *)&la, sizeof(la)) == 0 && listen(l, 1) == 0);
  ASSERT(getsockname(l, (struct sockaddr *)&la, &len) == 0);
  ASSERT(connect(c, (struct sockaddr *)&la, sizeof(la)) == 0);
  ASSERT(!hora__socket_is_self_connected(c));
  close(c);
  close(l);
}

/* ---- a rank dropped before its claim connects again ---------------------- */

/* A TCP proxy in front of rank 0's rendezvous that holds the first
 * connection's bytes back for 1.5 s, as a loaded host holds a slow rank:
 * rank 0 drops it (nothing proved within 1 s), and only the client's
 * retry can register the rank. */
struct slow_proxy {
  int lfd, server_port, accepted;
  atomic_int stop;
};

static int listen_loopback(int *port, int flags) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | flags, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
    return -1;
  }
  *port = ntohs(sa.sin_port);
  return fd;
}

static void forward(int a, int b) {
  char buf[4096];
  struct pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
  for (;;) {
    if (poll(p, 2, 100) < 0) {
      return;
    }
    for (int i = 0; i < 2; i++) {
      if (!p[i].revents) {
        continue;
      }
      ssize_t n = recv(p[i].fd, buf, sizeof(buf), 0);
      if (n <= 0 || send(p[1 - i].fd, buf, (size_t)n, MSG_NOSIGNAL) != n) {
        return;
      }
    }
  }
}

static void *proxy_main(void *arg) {
  struct slow_proxy *px = arg;
  while (!atomic_load(&px->stop)) {
    struct pollfd p = {px->lfd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) {
      continue;
    }
    int c = accept(px->lfd, NULL, NULL);
    if (c < 0) {
      continue;
    }
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)px->server_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (s >= 0 && connect(s, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
      if (px->accepted++ == 0) {
        usleep(1500 * 1000);
      }
      forward(c, s);
    }
    if (s >= 0) {
      close(s);
    }
    close(c);
  }
  return NULL;
}

struct rdv_side {
  struct hora__rdv_tcp_spec spec;
  int rc, gathered[2];
};

static void *rdv_side_main(void *arg) {
  struct rdv_side *side = arg;
  struct hora__rdv *r = NULL;
  side->rc = hora__rdv_open_tcp(&side->spec, &r);
  if (side->rc == HORA_SUCCESS) {
    int mine = 100 + side->spec.rank;
    side->rc = hora__rdv_allgather(r, &mine, sizeof(mine), side->gathered);
    hora__rdv_close(r);
  }
  return NULL;
}

TEST(rendezvous_rank_dropped_before_its_claim_connects_again) {
  int server_port = 0, proxy_port = 0;
  int sfd = listen_loopback(&server_port, SOCK_NONBLOCK);
  struct slow_proxy px = {.lfd = listen_loopback(&proxy_port, 0), .server_port = server_port};
  ASSERT(sfd >= 0 && px.lfd >= 0);
  struct rdv_side side[2];
  for (int r = 0; r < 2; r++) {
    side[r] = (struct rdv_side){.spec = {.host = "127.0.0.1", .port = r ? proxy_port : server_port,
                                         .rank = r, .size = 2, .listen_fd = r ? -1 : sfd,
                                         .timeout_s = 8, .where = "the test's rendezvous",
                                         .rank_var = "HORA_RANK", .size_var = "HORA_SIZE"},
                                .rc = -1};
  }
  pthread_t proxy, th[2];
  ASSERT(pthread_create(&proxy, NULL, proxy_main, &px) == 0);
  for (int r = 0; r < 2; r++) {
    ASSERT(pthread_create(&th[r], NULL, rdv_side_main, &side[r]) == 0);
  }
  for (int r = 0; r < 2; r++) {
    pthread_join(th[r], NULL);
  }
  atomic_store(&px.stop, 1);
  pthread_join(proxy, NULL);
  close(px.lfd);
  ASSERT_EQ_INT(side[0].rc, HORA_SUCCESS);
  ASSERT_EQ_INT(side[1].rc, HORA_SUCCESS);
  ASSERT(px.accepted >= 2); /* the first connection was dropped */
  for (int r = 0; r < 2; r++) {
    ASSERT_EQ_INT(side[r].gathered[0], 100);
    ASSERT_EQ_INT(side[r].gathered[1], 101);
  }
}

/* Without a secret anyone may connect: a stranger's claim of a rank that
 * does not exist is refused to it alone; the job starts. */
static void *stranger_claim_main(void *arg) {
  int port = *(int *)arg;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
    uint8_t claim[96] = {0}; /* rendezvous_tcp.c's: magic, version 2, rank 7 of 2, pid, host */
    uint32_t w[5] = {htonl(0x56445248u), htonl(2), htonl(7), htonl(2), htonl(1)};
    memcpy(claim, w, sizeof(w));
    memcpy(claim + sizeof(w), "stranger", 8);
    (void)!send(fd, claim, sizeof(claim), MSG_NOSIGNAL);
    char answer[512];
    (void)!recv(fd, answer, sizeof(answer), 0);
  }
  if (fd >= 0) {
    close(fd);
  }
  return NULL;
}

TEST(rendezvous_without_a_secret_survives_a_strangers_bad_claim) {
  int port = 0;
  int sfd = listen_loopback(&port, SOCK_NONBLOCK);
  ASSERT(sfd >= 0);
  struct rdv_side side[2];
  for (int r = 0; r < 2; r++) {
    side[r] = (struct rdv_side){.spec = {.host = "127.0.0.1", .port = port, .rank = r, .size = 2,
                                         .listen_fd = r ? -1 : sfd, .timeout_s = 8,
                                         .where = "the test's rendezvous",
                                         .rank_var = "HORA_RANK", .size_var = "HORA_SIZE"},
                                .rc = -1};
  }
  pthread_t stranger, th[2];
  ASSERT(pthread_create(&th[0], NULL, rdv_side_main, &side[0]) == 0);
  ASSERT(pthread_create(&stranger, NULL, stranger_claim_main, &port) == 0);
  pthread_join(stranger, NULL);
  ASSERT(pthread_create(&th[1], NULL, rdv_side_main, &side[1]) == 0);
  for (int r = 0; r < 2; r++) {
    pthread_join(th[r], NULL);
  }
  if (side[0].rc != HORA_SUCCESS || side[1].rc != HORA_SUCCESS) {
    FAIL("a stranger's claim of rank 7 ended the start-up: rank 0 rc %d, rank 1 rc %d (%s)",
              side[0].rc, side[1].rc, hora__error_message());
  }
  for (int r = 0; r < 2; r++) {
    ASSERT_EQ_INT(side[r].gathered[1], 101);
  }
}

/* ---- records a peer sends through the rendezvous ---- */

/* A rendezvous of two where this process is rank 0 and rank 1's records
 * are forged: a copy of rank 0's, changed by `forge` on the chosen
 * exchange (the first is number 1). */
struct forged_rdv {
  struct hora__rdv r;
  int call;
  void (*forge)(struct forged_rdv *f, void *theirs, size_t len);
  int32_t value;
};

static int forged_allgather(struct hora__rdv *r, const void *mine, size_t len, void *all) {
  struct forged_rdv *f = (struct forged_rdv *)r;
  f->call++;
  memcpy(all, mine, len);
  memcpy((char *)all + len, mine, len);
  f->forge(f, (char *)all + len, len);
  return HORA_SUCCESS;
}

static void forged_close(struct hora__rdv *r) {
  (void)r;
}

static const struct hora__rdv_ops forged_ops = {.allgather = forged_allgather,
                                                .close = forged_close};

static void forged_open(struct forged_rdv *f,
                        void (*forge)(struct forged_rdv *f, void *theirs, size_t len),
                        int32_t value) {
  memset(f, 0, sizeof(*f));
  f->r.ops = &forged_ops;
  f->r.kind = HORA_RDV_TCP;
  f->r.rank = 0;
  f->r.size = 2;
  f->forge = forge;
  f->value = value;
}

/* What a step returned, run in a child (at most 10 s), so that a crash or
 * a read past a buffer fails the test and not the whole runner. */
struct outcome {
  int rc;
  char msg[512];
};

static void run_in_child(int (*step)(void *), void *arg, struct outcome *out) {
  int p[2];
  memset(out, 0, sizeof(*out));
  out->rc = -1000;
  if (pipe(p) != 0) {
    snprintf(out->msg, sizeof(out->msg), "pipe: %s", strerror(errno));
    return;
  }
  fflush(stdout);
  pid_t child = fork();
  if (child == 0) {
    close(p[0]);
    alarm(10);
    struct outcome o;
    memset(&o, 0, sizeof(o));
    o.rc = step(arg);
    hora__strlcpy(o.msg, hora__error_message(), sizeof(o.msg));
    (void)!write(p[1], &o, sizeof(o));
    _exit(0);
  }
  close(p[1]);
  struct pollfd pfd = {.fd = p[0], .events = POLLIN};
  size_t got = 0;
  while (got < sizeof(*out) && poll(&pfd, 1, 15000) == 1) {
    ssize_t n = read(p[0], (char *)out + got, sizeof(*out) - got);
    if (n <= 0) {
      break;
    }
    got += (size_t)n;
  }
  close(p[0]);
  int status = 0;
  if (child > 0) {
    waitpid(child, &status, 0);
  }
  if (child < 0 || got != sizeof(*out)) {
    out->rc = -1000;
    snprintf(out->msg, sizeof(out->msg), "the step %s", child < 0 ? "could not fork"
             : WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "gave no answer");
  }
}

struct fake_comm {
  hora__comm c;
  struct hora__proc proc;
  struct forged_rdv f;
};

static void fake_comm_init(struct fake_comm *k) {
  memset(&k->c, 0, sizeof(k->c));
  memset(&k->proc, 0, sizeof(k->proc));
  k->proc.tcp_listen_fd = k->proc.unix_listen_fd = k->proc.reserve_fd = -1;
  k->c.proc = &k->proc;
  k->c.net = &k->proc.net;
}

/* Exchange 2 (the who records): another settings digest, every byte
 * flipped; exchange 3 (the settings' lengths): rank 1's is f->value. */
static void forge_settings_length(struct forged_rdv *f, void *theirs, size_t len) {
  if (f->call == 2) {
    for (size_t i = 0; i < len; i++) {
      ((uint8_t *)theirs)[i] ^= 0xff;
    }
  } else if (f->call == 3 && len == sizeof(int32_t)) {
    memcpy(theirs, &f->value, sizeof(f->value));
  }
}

static int membership_step(void *arg) {
  struct fake_comm *k = arg;
  return hora__boot_membership(&k->c, &k->f.r, 1);
}

/* The settings check, when digests differ, exchanges each rank's encoding
 * after its length: a length no build sends (negative, or past any
 * settings table) is refused naming the rank, before it sizes a buffer. */
TEST(settings_length_from_a_peer_is_checked) {
  ASSERT_EQ_INT(hora__params_load(), HORA_SUCCESS);
  static const int32_t forged[] = {-1, INT32_MIN, 1 << 30};
  for (size_t i = 0; i < sizeof(forged) / sizeof(forged[0]); i++) {
    struct fake_comm k;
    fake_comm_init(&k);
    forged_open(&k.f, forge_settings_length, forged[i]);
    struct outcome o;
    run_in_child(membership_step, &k, &o);
    char want[64];
    snprintf(want, sizeof(want), "%d bytes", (int)forged[i]);
    if (o.rc != HORA_ERR_PROTOCOL || !strstr(o.msg, "rank 1") || !strstr(o.msg, want)) {
      FAIL("rank 1's settings length %d: rc %d, '%.300s' (expected HORA_ERR_PROTOCOL naming "
           "rank 1 and '%s')", (int)forged[i], o.rc, o.msg, want);
    }
  }
}

/* Exchange 2 (the address records): rank 1's, from rank 0's, says it is
 * local rank 1 of host 0, then is spoilt as f->value says. */
enum { SPOIL_NONE, SPOIL_LOCAL_RANK_PAST, SPOIL_HOST_PAST, SPOIL_LOCAL_RANK_TWICE,
       SPOIL_HOST_NEGATIVE, SPOIL_HOST_NAME_UNENDED, SPOILS };
static const char *const spoil_names[SPOILS] = {
    "none", "local rank 7 on a host of 2 ranks", "host 5 in a job of 1 host",
    "local rank 0, rank 0's", "host -1", "a host name without its terminating NUL"};

static void forge_address(struct forged_rdv *f, void *theirs, size_t len) {
  struct hora__peer_info *p = theirs;
  if (f->call != 2 || len != sizeof(*p)) {
    return;
  }
  p->pid = 4242;
  p->local_rank = 1;
  switch (f->value) {
    case SPOIL_LOCAL_RANK_PAST: p->local_rank = 7; break;
    case SPOIL_HOST_PAST: p->host_index = 5; break;
    case SPOIL_LOCAL_RANK_TWICE: p->local_rank = 0; break;
    case SPOIL_HOST_NEGATIVE: p->host_index = -1; break;
    case SPOIL_HOST_NAME_UNENDED: memset(p->host, 'x', sizeof(p->host)); break;
    default: break;
  }
}

static int addresses_with(int spoil, char *msg, size_t n) {
  struct fake_comm k;
  fake_comm_init(&k);
  k.c.rank = 0;
  k.c.size = 2;
  k.c.local_size = 2;
  k.c.cross_size = 1;
  k.proc.net.rank = 0;
  k.proc.net.size = 2;
  memset(k.proc.secret, 0x33, sizeof(k.proc.secret));
  snprintf(k.proc.job_id, sizeof(k.proc.job_id), "%016x", (unsigned)getpid());
  forged_open(&k.f, forge_address, spoil);
  int rc = hora__boot_addresses(&k.c, &k.f.r);
  hora__strlcpy(msg, hora__error_message(), n);
  if (k.proc.tcp_listen_fd >= 0) {
    close(k.proc.tcp_listen_fd);
  }
  if (k.proc.unix_listen_fd >= 0) {
    close(k.proc.unix_listen_fd);
  }
  free(k.c.net->peers);
  free(k.proc.ctrl);
  free(k.proc.data);
  free(k.proc.cross);
  return rc;
}

/* Where each rank sits (its host, its local rank there) indexes the host's
 * exchanges and the hierarchical collectives' tables: a record that does
 * not fit the job's hosts is refused, naming the rank. */
TEST(address_record_from_a_peer_is_checked) {
  ASSERT_EQ_INT(hora__params_load(), HORA_SUCCESS);
  char msg[512];
  int rc = addresses_with(SPOIL_NONE, msg, sizeof(msg));
  if (rc != HORA_SUCCESS) {
    FAIL("a well-formed record of rank 1 was refused: %.400s", msg);
  }
  for (int spoil = SPOIL_NONE + 1; spoil < SPOILS; spoil++) {
    rc = addresses_with(spoil, msg, sizeof(msg));
    if (rc != HORA_ERR_PROTOCOL || !strstr(msg, "rank 1")) {
      FAIL("rank 1's record with %s: rc %d, '%.300s' (expected HORA_ERR_PROTOCOL naming rank 1)",
           spoil_names[spoil], rc, rc == HORA_SUCCESS ? "" : msg);
    }
  }
}

/* Every exchange of one int32: rank 1's is f->value. */
static void forge_int(struct forged_rdv *f, void *theirs, size_t len) {
  if (len == sizeof(int32_t)) {
    memcpy(theirs, &f->value, sizeof(f->value));
  }
}

/* After each step every rank learns whether one failed, and which: a rank
 * sends its own failure (rank * 64 + code) or INT_MAX. Anything else is
 * refused naming the rank, never taken for a failure of another rank, a
 * code out of range, or success. */
TEST(agreement_record_from_a_peer_is_checked) {
  struct forged_rdv f;
  forged_open(&f, forge_int, INT32_MAX);
  ASSERT_EQ_INT(hora__rdv_agree(&f.r, HORA_SUCCESS, "a step"), HORA_SUCCESS);
  forged_open(&f, forge_int, 64 + HORA_ERR_TIMEOUT);
  ASSERT_EQ_INT(hora__rdv_agree(&f.r, HORA_SUCCESS, "a step"), HORA_ERR_TIMEOUT);
  ASSERT_STR_CONTAINS(hora__error_message(), "failed on rank 1");
  static const int32_t forged[] = {-7, 0, HORA_ERR_TIMEOUT, 64, 2 * 64 + 1, INT32_MIN};
  for (size_t i = 0; i < sizeof(forged) / sizeof(forged[0]); i++) {
    forged_open(&f, forge_int, forged[i]);
    int rc = hora__rdv_agree(&f.r, HORA_SUCCESS, "a step");
    if (rc != HORA_ERR_PROTOCOL || !strstr(hora__error_message(), "rank 1")) {
      FAIL("rank 1's agreement record %d: rc %d, '%.300s' (expected HORA_ERR_PROTOCOL naming "
           "rank 1)", (int)forged[i], rc, rc == HORA_SUCCESS ? "" : hora__error_message());
    }
  }
}

/* The minima start-up takes over the ranks (sockets per TCP connection,
 * flags, the settings check's result) index and size things: a value out
 * of its range is refused naming the rank, never taken as the minimum. */
TEST(minimum_from_a_peer_is_checked) {
  struct forged_rdv f;
  int min = -1;
  forged_open(&f, forge_int, 3);
  ASSERT_EQ_INT(hora__rdv_min(&f.r, 5, 1, 8, "its sockets", &min), HORA_SUCCESS);
  ASSERT_EQ_INT(min, 3);
  static const int32_t forged[] = {0, -1, 9, INT32_MIN, INT32_MAX};
  for (size_t i = 0; i < sizeof(forged) / sizeof(forged[0]); i++) {
    forged_open(&f, forge_int, forged[i]);
    min = -1;
    int rc = hora__rdv_min(&f.r, 5, 1, 8, "its sockets", &min);
    if (rc != HORA_ERR_PROTOCOL || !strstr(hora__error_message(), "rank 1 sent")) {
      FAIL("rank 1's value %d of 1 to 8: rc %d, minimum %d, '%.300s' (expected HORA_ERR_PROTOCOL "
           "naming rank 1)", (int)forged[i], rc, min, rc == HORA_SUCCESS ? "" : hora__error_message());
    }
  }
}

/* The host's shared segment is local rank 0's memfd, named by its hello
 * and opened through /proc. One smaller than this build's layout (a forged
 * hello, or another build) must not be mapped: touching past its end would
 * kill the process (SIGBUS) in the first collective. */
TEST(shared_segment_smaller_than_its_layout_is_not_mapped) {
  ASSERT_EQ_INT(hora__params_load(), HORA_SUCCESS);
  hora__net net0 = {.rank = 0, .size = 2}, net1 = {.rank = 1, .size = 2};
  struct hora__shm *leader = NULL, *follower = NULL, *fooled = NULL;
  struct hora__shm_hello host[2], spare;
  ASSERT_EQ_INT(hora__shm_begin(&net0, 0, 2, false, &leader, &host[0]), HORA_SUCCESS);
  ASSERT_EQ_INT(hora__shm_begin(&net1, 1, 2, false, &follower, &host[1]), HORA_SUCCESS);
  ASSERT_EQ_INT(hora__shm_begin(&net1, 1, 2, false, &fooled, &spare), HORA_SUCCESS);
  struct hora__shm_verdict right, small;
  hora__shm_attach(follower, host, &right);
  int fd = memfd_create("hora-test-small-segment", MFD_CLOEXEC);
  bool made = fd >= 0 && ftruncate(fd, 4096) == 0;
  host[0].fd = fd;
  hora__shm_attach(fooled, host, &small);
  size_t half = hora__shm_half_bytes(fooled);
  hora__shm_destroy(fooled);
  hora__shm_destroy(follower);
  hora__shm_destroy(leader);
  if (fd >= 0) {
    close(fd);
  }
  ASSERT(made);
  ASSERT(right.mapped); /* the leader's own segment */
  if (small.mapped) {
    FAIL("a 4096-byte segment was mapped as the host's (its layout holds two %zu-byte halves "
         "per local rank)", half);
  }
}
