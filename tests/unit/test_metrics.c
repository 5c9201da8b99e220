/* The metrics thread (runtime/observe/metrics_http.c) under hostile
 * conditions: out of file descriptors with clients waiting, and a symlink
 * planted where the textfile's temporary copy goes. Each runs in a child
 * process: the thread and the descriptor limit are its alone. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/params.h"
#include "runtime/observe/metrics.h"
#include "../runner.h"

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr = {htonl(INADDR_LOOPBACK)}};
  socklen_t len = sizeof(sa);
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
      getsockname(fd, (struct sockaddr *)&sa, &len) == 0) {
    port = ntohs(sa.sin_port);
  }
  if (fd >= 0) {
    close(fd);
  }
  return port;
}

static int dial(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                           .sin_addr = {htonl(INADDR_LOOPBACK)}};
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
    close(fd);
    fd = -1;
  }
  return fd;
}

/* Reads what fd sends until it closes, at most 5 s. */
static size_t read_all(int fd, char *buf, size_t n) {
  size_t got = 0;
  struct pollfd pfd = {.fd = fd, .events = POLLIN};
  while (got + 1 < n && poll(&pfd, 1, 5000) == 1) {
    ssize_t r = read(fd, buf + got, n - 1 - got);
    if (r <= 0) {
      break;
    }
    got += (size_t)r;
  }
  buf[got] = '\0';
  return got;
}

/* The parent and child talk over a socket pair: a gone peer is an error,
 * not a SIGPIPE. */
static bool tell(int fd, const void *p, size_t n) {
  return send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n;
}

/* n bytes from the other side, waited for at most 10 s. */
static bool hear(int fd, void *p, size_t n) {
  struct pollfd pfd = {.fd = fd, .events = POLLIN};
  return poll(&pfd, 1, 10000) == 1 && recv(fd, p, n, MSG_WAITALL) == (ssize_t)n;
}

static double cpu_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The child: the endpoint with every descriptor taken, clients waiting in
 * the listener's queue (the parent's), its CPU time over 1.5 s measured
 * while the main thread sleeps; then descriptors freed for one more
 * request. Reports the CPU time over `to`. */
static void emfile_child(int port, int sock) {
  alarm(20);
  char value[16];
  snprintf(value, sizeof(value), "%d", port);
  setenv("HORA_METRICS_PORT", value, 1);
  char c;
  if (hora__params_load() != HORA_SUCCESS || hora__metrics_start(0, 0) != HORA_SUCCESS) {
    _exit(2);
  }
  /* Every descriptor under a limit a little above what is open. */
  int top = 0;
  for (int fd = 0; fd < 1024; fd++) {
    if (fcntl(fd, F_GETFD) >= 0) {
      top = fd;
    }
  }
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = (rlim_t)top + 16;
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
    _exit(3);
  }
  enum { FILL_MAX = 2048 };
  static int fillers[FILL_MAX];
  int nfill = 0;
  while (nfill < FILL_MAX && (fillers[nfill] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0) {
    nfill++;
  }
  if (nfill == FILL_MAX || errno != EMFILE || !tell(sock, "r", 1) || !hear(sock, &c, 1)) {
    _exit(4);
  }
  double t0 = cpu_seconds();
  struct timespec pause = {1, 500000000};
  nanosleep(&pause, NULL);
  double cpu = cpu_seconds() - t0;
  for (int i = 0; i < nfill; i++) {
    close(fillers[i]);
  }
  if (!tell(sock, &cpu, sizeof(cpu)) || !hear(sock, &c, 1)) {
    _exit(5);
  }
  hora__metrics_stop();
  _exit(0);
}

TEST(metrics_endpoint_out_of_descriptors_does_not_spin) {
  int port = free_port();
  ASSERT(port > 0);
  int sv[2];
  ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  fflush(stdout);
  pid_t child = fork();
  ASSERT(child >= 0);
  if (child == 0) {
    close(sv[0]);
    emfile_child(port, sv[1]);
  }
  close(sv[1]);
  char c = 0;
  bool ready = hear(sv[0], &c, 1) && c == 'r';
  /* Clients the endpoint cannot accept: they wait in its queue. */
  int clients[8], nclients = 0;
  for (int i = 0; ready && i < 8; i++) {
    if ((clients[nclients] = dial(port)) >= 0) {
      nclients++;
    }
  }
  double cpu = -1;
  bool measured = ready && tell(sv[0], "g", 1) && hear(sv[0], &cpu, sizeof(cpu));
  /* With descriptors back, it serves again. */
  char reply[256] = "";
  int fd = measured ? dial(port) : -1;
  if (fd >= 0) {
    static const char get[] = "GET /metrics HTTP/1.0\r\n\r\n";
    if (tell(fd, get, sizeof(get) - 1)) {
      read_all(fd, reply, sizeof(reply));
    }
    close(fd);
  }
  tell(sv[0], "d", 1);
  for (int i = 0; i < nclients; i++) {
    close(clients[i]);
  }
  close(sv[0]);
  int status = 0;
  waitpid(child, &status, 0);
  if (!ready) {
    FAIL("the child did not get ready (exit status %d, signal %d)",
         WIFEXITED(status) ? WEXITSTATUS(status) : -1, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  }
  ASSERT_EQ_INT(nclients, 8);
  ASSERT(measured);
  if (cpu > 0.3) {
    FAIL("out of descriptors with 8 clients waiting, the metrics thread used %.2f s of CPU in "
         "1.5 s", cpu);
  }
  ASSERT_STR_CONTAINS(reply, "HTTP/1.1 200 OK");
  ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* The child: the textfile written with a symlink planted at the name its
 * temporary copy had (FILE.tmp.PID), pointing at `victim`. */
static void symlink_child(const char *path, const char *victim) {
  alarm(20);
  char tmp[1200];
  snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
  if (symlink(victim, tmp) != 0) {
    _exit(2);
  }
  setenv("HORA_METRICS_FILE", path, 1);
  setenv("HORA_METRICS_INTERVAL_SECONDS", "0.05", 1);
  unsetenv("HORA_METRICS_PORT");
  if (hora__params_load() != HORA_SUCCESS || hora__metrics_start(0, 0) != HORA_SUCCESS) {
    _exit(3);
  }
  struct timespec pause = {0, 300000000};
  nanosleep(&pause, NULL);
  hora__metrics_stop();
  _exit(0);
}

static size_t slurp(const char *path, char *buf, size_t n) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  size_t got = 0;
  ssize_t r;
  while (fd >= 0 && got + 1 < n && (r = read(fd, buf + got, n - 1 - got)) > 0) {
    got += (size_t)r;
  }
  if (fd >= 0) {
    close(fd);
  }
  buf[got] = '\0';
  return got;
}

/* Whoever may write the textfile's directory may plant a symlink where
 * the temporary copy goes: the file it points at must not be overwritten,
 * and the textfile must still be written, as a file of its own. */
TEST(metrics_file_temporary_name_does_not_follow_a_symlink) {
  char dir[] = "/tmp/hora-test-metrics.XXXXXX";
  ASSERT(mkdtemp(dir));
  char path[256], victim[256];
  snprintf(path, sizeof(path), "%s/hora.prom", dir);
  snprintf(victim, sizeof(victim), "%s/precious", dir);
  static const char precious[] = "not the metrics\n";
  int fd = open(victim, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ASSERT(fd >= 0);
  ASSERT(write(fd, precious, sizeof(precious) - 1) == (ssize_t)sizeof(precious) - 1);
  close(fd);
  fflush(stdout);
  pid_t child = fork();
  ASSERT(child >= 0);
  if (child == 0) {
    symlink_child(path, victim);
  }
  int status = 0;
  waitpid(child, &status, 0);
  char now[4096], metrics[4096];
  slurp(victim, now, sizeof(now));
  struct stat st;
  bool regular = lstat(path, &st) == 0 && S_ISREG(st.st_mode);
  slurp(path, metrics, sizeof(metrics));
  /* What is left: the victim, the textfile, the planted link. */
  int left = 0;
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    if (e->d_name[0] != '.') {
      char f[600];
      snprintf(f, sizeof(f), "%s/%s", dir, e->d_name);
      unlink(f);
      left++;
    }
  }
  if (d) {
    closedir(d);
  }
  rmdir(dir);
  ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (strcmp(now, precious) != 0) {
    FAIL("the file a symlink at the temporary name pointed to was overwritten: it now begins "
         "'%.60s'", now);
  }
  ASSERT(regular);
  if (!strstr(metrics, "hora_")) {
    FAIL("the textfile holds no metrics: '%.200s'", metrics);
  }
  ASSERT_EQ_INT(left, 3);
}
