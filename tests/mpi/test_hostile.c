/* Strangers at the door: while the job runs allreduces, every rank attacks
 * its own listening sockets (TCP and Unix): random bytes, a well-formed
 * hello (which proves nothing without the job secret), 200 connections that send nothing,
 * a truncated handshake. The job must keep computing right, count every
 * refused connection in its log in a bounded number of lines (a flood must
 * not fill it), and keep its file descriptors and memory bounded. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <sys/un.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/transport/socket.h"
#include "mpitest.h"

static char logdir[256];
static struct sockaddr_in tcp_addr;
static struct sockaddr_un unix_addr;
static socklen_t unix_len;
static int attacks_done, attacks_made;


/* Finds "listening on IP:PORT (...) and @NAME" in this rank's log. */
static int find_addresses(void) {
  char path[300], line[1024];
  snprintf(path, sizeof(path), "%s/log.%d", logdir, mt_rank);
  FILE *f = fopen(path, "r");
  int found = 0;
  while (f && fgets(line, sizeof(line), f) && !found) {
    char *p = strstr(line, "listening on ");
    if (!p) {
      continue;
    }
    char ip[64], name[108];
    int port;
    if (sscanf(p, "listening on %63[0-9.]:%d (%*[^)]) and @%107s", ip, &port, name) == 3) {
      tcp_addr.sin_family = AF_INET;
      tcp_addr.sin_port = htons((uint16_t)port);
      inet_pton(AF_INET, ip, &tcp_addr.sin_addr);
      memset(&unix_addr, 0, sizeof(unix_addr));
      unix_addr.sun_family = AF_UNIX;
      size_t nl = strlen(name);
      memcpy(unix_addr.sun_path + 1, name, nl);
      unix_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl);
      found = 1;
    }
  }
  if (f) {
    fclose(f);
  }
  return found;
}

static int dial(int unix_socket) {
  int fd = socket(unix_socket ? AF_UNIX : AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    return -1;
  }
  int rc = unix_socket ? connect(fd, (struct sockaddr *)&unix_addr, unix_len)
                       : connect(fd, (struct sockaddr *)&tcp_addr, sizeof(tcp_addr));
  if (rc != 0) {
    close(fd);
    return -1;
  }
  attacks_made++;
  return fd;
}

static void *attacker(void *arg) {
  (void)arg;
  uint8_t junk[1000];
  for (int u = 0; u < 2; u++) {
    for (int i = 0; i < 5; i++) { /* random bytes */
      int fd = dial(u);
      if (fd >= 0) {
        if (getrandom(junk, sizeof(junk), 0) > 0 && send(fd, junk, sizeof(junk), MSG_NOSIGNAL) < 0) {
        }
        close(fd);
      }
    }
    { /* a well-formed hello (it proves nothing) */
      struct hora__hello h = {.magic = HORA_HELLO_MAGIC, .version = HORA_HELLO_VERSION,
                              .kind = HORA_CONN_DATA, .rank = 0, .size = mt_size};
      if (getrandom(h.nonce, sizeof(h.nonce), 0) < 0) {
        memset(h.nonce, 7, sizeof(h.nonce));
      }
      uint8_t wire[HORA_HELLO_WIRE_SIZE];
      hora__hello_encode(&h, wire);
      int fd = dial(u);
      if (fd >= 0) {
        if (send(fd, wire, sizeof(wire), MSG_NOSIGNAL) < 0) {
        }
        char b;
        if (read(fd, &b, 1) < 0) { /* the job closes it */
        }
        close(fd);
      }
    }
    { /* many that say nothing */
      int fds[100];
      for (int i = 0; i < 100; i++) {
        fds[i] = dial(u);
      }
      usleep(500000);
      for (int i = 0; i < 100; i++) {
        if (fds[i] >= 0) {
          close(fds[i]);
        }
      }
    }
    { /* the first 20 bytes of a handshake, then silence */
      struct hora__hello h = {.magic = HORA_HELLO_MAGIC, .version = HORA_HELLO_VERSION,
                              .kind = HORA_CONN_CTRL, .rank = 1, .size = mt_size};
      uint8_t wire[HORA_HELLO_WIRE_SIZE];
      hora__hello_encode(&h, wire);
      int fd = dial(u);
      if (fd >= 0) {
        if (send(fd, wire, 20, MSG_NOSIGNAL) < 0) {
        }
        close(fd);
      }
    }
  }
  __atomic_store_n(&attacks_done, 1, __ATOMIC_RELEASE);
  return NULL;
}

static void under_attack(void) {
  MT_CHECK(find_addresses(), "rank %d: no 'listening on' line in its debug log", mt_rank);
  int fds_before = mt_count_fds();
  long rss_before = mt_rss_kib();
  pthread_t th;
  pthread_create(&th, NULL, attacker, NULL);
  enum { N = 4096 };
  static float buf[N];
  int steps = 0;
  /* Every rank runs the same steps: until all attackers are done. */
  for (int all_done = 0; !all_done || steps < 50;) {
    for (int i = 0; i < N; i++) {
      buf[i] = (float)(mt_rank + steps);
    }
    MT_OK(hora_allreduce("under-attack", buf, buf, N, HORA_FLOAT32, HORA_SUM));
    float want = (float)(mt_size * steps + mt_size * (mt_size - 1) / 2);
    MT_CHECK(buf[N - 1] == want, "step %d: %g, expected %g", steps, (double)buf[N - 1], (double)want);
    steps++;
    int done = __atomic_load_n(&attacks_done, __ATOMIC_ACQUIRE), sum = 0;
    MT_OK(hora_allreduce("attacks-done", &done, &sum, 1, HORA_INT32, HORA_SUM));
    all_done = sum == mt_size;
    /* Let the coordinator go idle now and then: that is when it refuses. */
    if (steps % 10 == 0) {
      usleep(20000);
    }
  }
  pthread_join(th, NULL);
  MT_OK(hora_barrier());
  usleep(300000); /* the last refusals */
  MT_OK(hora_barrier());
  int fds_after = mt_count_fds();
  long rss_after = mt_rss_kib();
  MT_CHECK(fds_after <= fds_before + 2, "file descriptors grew from %d to %d", fds_before, fds_after);
  MT_CHECK(rss_after - rss_before < 20000, "RSS grew by %ld KiB", rss_after - rss_before);
}

/* After hora_finalize (which logs the last count): every connection the
 * attacker made was refused and counted, in a few lines. */
static int refusals_logged(void) {
  char path[300], line[1024];
  snprintf(path, sizeof(path), "%s/log.%d", logdir, mt_rank);
  FILE *f = fopen(path, "r");
  int refused = 0, lines = 0, more = 0;
  while (f && fgets(line, sizeof(line), f)) {
    const char *m = strstr(line, "refused ");
    if (m && strstr(m, "refused a connection")) {
      refused++;
      lines++;
    } else if (m && sscanf(m, "refused %d", &more) == 1) {
      refused += more;
      lines++;
    }
  }
  if (f) {
    fclose(f);
  }
  int failures = 0;
  if (refused < attacks_made || attacks_made < 200) {
    fprintf(stderr, "rank %d: %d connections made, %d refusals counted in the log\n", mt_rank,
            attacks_made, refused);
    failures++;
  }
  if (mt_rank == 0) {
    printf("# rank 0: %d connections made, %d refusals counted in %d log lines\n", attacks_made,
           refused, lines);
  }
  if (lines > 10) {
    fprintf(stderr, "rank %d: %d log lines for %d refusals (a flood fills the log)\n", mt_rank,
            lines, refused);
    failures++;
  }
  return failures;
}

/* Out of file descriptors after hora_init: connections still arrive, and
 * the coordinator, idle, must shed them rather than spin on a listener
 * that poll() reports ready forever. A forked child connects 200 times
 * while this rank's descriptor limit is at its lowest free descriptor. */
static void no_spin_out_of_descriptors(void) {
  MT_CHECK(find_addresses(), "rank %d: no 'listening on' line in its debug log", mt_rank);
  MT_OK(hora_barrier());
  pid_t child = fork();
  if (child == 0) {
    usleep(200000);
    int fds[200];
    for (int i = 0; i < 200; i++) {
      fds[i] = dial(i % 2);
    }
    usleep(300000);
    for (int i = 0; i < 200; i++) {
      if (fds[i] >= 0) {
        close(fds[i]);
      }
    }
    _exit(0);
  }
  struct rlimit saved, low;
  getrlimit(RLIMIT_NOFILE, &saved);
  int lowest = open("/dev/null", O_RDONLY);
  close(lowest);
  low = saved;
  low.rlim_cur = (rlim_t)lowest;
  struct rusage r0, r1;
  getrusage(RUSAGE_SELF, &r0);
  setrlimit(RLIMIT_NOFILE, &low);
  usleep(1500000);
  setrlimit(RLIMIT_NOFILE, &saved);
  getrusage(RUSAGE_SELF, &r1);
  waitpid(child, NULL, 0);
  double cpu = (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec + r1.ru_stime.tv_sec -
                        r0.ru_stime.tv_sec) +
               (double)(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec + r1.ru_stime.tv_usec -
                        r0.ru_stime.tv_usec) * 1e-6;
  MT_CHECK(cpu < 0.3, "%.2f s of CPU in 1.5 s idle with no file descriptor left", cpu);
  float v = 1;
  MT_OK(hora_allreduce("after-emfile", &v, &v, 1, HORA_FLOAT32, HORA_SUM));
  MT_CHECK(v == (float)mt_size, "allreduce after EMFILE gave %g", (double)v);
}

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  mt_shared_dir("hora-hostile", logdir, sizeof(logdir));
  char pattern[300];
  snprintf(pattern, sizeof(pattern), "%s/log.%%r", logdir);
  setenv("HORA_LOG_FILE", pattern, 1);
  setenv("HORA_LOG_LEVEL", "debug", 1);
  mt_init();
  mt_run("hostile/connections_refused_training_goes_on", under_attack);
  mt_run("hostile/out_of_descriptors_no_spin", no_spin_out_of_descriptors);
  int failures = mt_total_failures();
  MT_OK(hora_finalize());
  int bad = refusals_logged(), all = 0;
  MPI_Allreduce(&bad, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (mt_rank == 0) {
    printf("%s hostile/refusals_counted_in_few_log_lines\n", all ? "FAIL" : "PASS");
  }
  failures += bad;
  mt_remove_shared_dir(logdir);
  MPI_Finalize();
  return failures ? 1 : 0;
}
