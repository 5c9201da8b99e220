/* hora-bench-startup: how long a job takes to start, from the top of main
 * to the first completed allreduce.
 *
 * Each rank reads both clocks first thing in main, calls hora_init (which
 * runs MPI_Init itself on the MPI path, so that is counted; this program
 * never touches MPI), runs one 4-byte allreduce and checks its sum, then
 * prints one line:
 *
 *   rank R/N init S first_allreduce S start_realtime T done_realtime T
 *
 * (S: seconds since the top of main, CLOCK_MONOTONIC; T: CLOCK_REALTIME,
 * seconds since the epoch, for comparison with a launcher's own clock).
 * A second allreduce (HORA_MAX, not timed) gathers the slowest rank's
 * figures, and rank 0 prints
 *
 *   startup np=N init_max=S first_allreduce_max=S start_realtime_min=T
 *           start_realtime_max=T done_realtime_max=T                     (one line)
 *
 * done_realtime_max - start_realtime_max is the time from the last rank's
 * start to the last rank's completion: the rendezvous without the skew of
 * the launch.
 * The bootstrap is whatever hora_init picks from the environment
 * (HORA_BOOTSTRAP and friends), so the same binary serves every path.
 * Each rank also prints, read from /proc/self once the first allreduce
 * is done,
 *
 *   resources rank=R at=up fds=F vmrss_kib=K vmhwm_kib=K rssanon_kib=K rssshmem_kib=K
 *
 * (VmRSS counts the shared-memory transport's segments, RssShmem, which
 * every rank on the host maps; RssAnon is the process's own heap.)
 * With --control N, the control plane's costs follow (scripts/
 * bench-control-plane.sh): N pairs of 4-byte allreduces, one under a
 * name never used before (not in the response cache: a full request to
 * rank 0, which answers every rank) and one under a name used every time
 * (cached: a bit of the cycle's recursive-doubling exchange), alternating
 * so both see the same machine; then the floor this host sets for the two
 * shapes without hora: N rounds over loopback UDP in which every rank
 * sends to rank 0 and rank 0 answers each (star), and N dissemination
 * barriers, log2(np) rounds of one datagram per rank (tree). Every rank
 * prints "resources ... at=ops ..." after the allreduces (before the
 * floor's socket), and rank 0 at the end
 *
 *   control np=N ops=N new_us=U cached_us=U star_us=U tree_us=U
 *           new_us_max=U cached_us_max=U star_us_max=U tree_us_max=U  (one line)
 *
 * (U: microseconds per operation, median over the N on rank 0; _max: the
 * largest of the ranks' medians).
 *
 *   mpirun -np 4 hora-bench-startup
 *   HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS=127.0.0.1:29500 HORA_RANK=r HORA_SIZE=4 hora-bench-startup
 *
 * scripts/bench-startup.sh runs both, and PyTorch's gloo beside them.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "hora.h"
#include "bench_common.h"

static double seconds(clockid_t clock) {
  struct timespec t;
  clock_gettime(clock, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int fail(const char *what, int rc) {
  fprintf(stderr, "hora-bench-startup: %s: %s (%s)\n", what, hora_strerror(rc), hora_last_error());
  return 1;
}

/* This process's open descriptors and memory, from /proc/self. */
struct resources {
  long fds, vmrss_kib, vmhwm_kib, rssanon_kib, rssshmem_kib;
};

static void read_resources(struct resources *r) {
  r->fds = r->vmrss_kib = r->vmhwm_kib = r->rssanon_kib = r->rssshmem_kib = -1;
  DIR *d = opendir("/proc/self/fd");
  if (d) {
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      if (e->d_name[0] != '.') {
        n++;
      }
    }
    closedir(d);
    r->fds = n - 1; /* the directory's own descriptor */
  }
  FILE *f = fopen("/proc/self/status", "r");
  if (f) {
    char line[256];
    while (fgets(line, sizeof line, f)) {
      sscanf(line, "VmRSS: %ld", &r->vmrss_kib);
      sscanf(line, "VmHWM: %ld", &r->vmhwm_kib);
      sscanf(line, "RssAnon: %ld", &r->rssanon_kib);
      sscanf(line, "RssShmem: %ld", &r->rssshmem_kib);
    }
    fclose(f);
  }
}

static void print_resources(int rank, const char *at) {
  struct resources r;
  read_resources(&r);
  printf("resources rank=%d at=%s fds=%ld vmrss_kib=%ld vmhwm_kib=%ld rssanon_kib=%ld "
         "rssshmem_kib=%ld\n",
         rank, at, r.fds, r.vmrss_kib, r.vmhwm_kib, r.rssanon_kib, r.rssshmem_kib);
  fflush(stdout);
}

/* The floor: the same shapes of exchange as the control plane's, over
 * loopback UDP without hora, so what is left is the host's cost of
 * waking np processes on its cores. Datagrams carry (kind, iteration,
 * round); they are counted as they come, whichever a rank waits for,
 * since a faster peer may already be a step ahead. */
enum { FLOOR_STAR, FLOOR_TREE, FLOOR_KINDS };
#define FLOOR_ROUNDS 32

struct floor_net {
  int fd, rank, size, iters;
  struct sockaddr_in *peer;
  uint16_t *count; /* [kind][iteration][round] */
};

static int floor_send(struct floor_net *f, int to, uint32_t kind, uint32_t iter,
                      uint32_t round) {
  uint32_t m[3] = {kind, iter, round};
  if (sendto(f->fd, m, sizeof m, 0, (struct sockaddr *)&f->peer[to], sizeof f->peer[to]) !=
      (ssize_t)sizeof m) {
    fprintf(stderr, "hora-bench-startup: rank %d: floor: sendto rank %d: %s\n", f->rank, to,
            strerror(errno));
    return -1;
  }
  return 0;
}

static int floor_wait(struct floor_net *f, uint32_t kind, uint32_t iter, uint32_t round,
                      int need) {
  size_t at = ((size_t)kind * (size_t)f->iters + iter) * FLOOR_ROUNDS + round;
  while (f->count[at] < need) {
    uint32_t m[3];
    ssize_t n = recv(f->fd, m, sizeof m, 0);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n != (ssize_t)sizeof m || m[0] >= FLOOR_KINDS || m[1] >= (uint32_t)f->iters ||
        m[2] >= FLOOR_ROUNDS) {
      /* A timeout (SO_RCVTIMEO) lands here too: a lost datagram must not
       * hang the benchmark. */
      fprintf(stderr, "hora-bench-startup: rank %d: floor: %s\n", f->rank,
              n < 0 ? strerror(errno) : "a stray datagram");
      return -1;
    }
    f->count[((size_t)m[0] * (size_t)f->iters + m[1]) * FLOOR_ROUNDS + m[2]]++;
  }
  return 0;
}

/* Every rank to rank 0, rank 0 back to each: the slow path's shape. */
static int floor_star(struct floor_net *f, uint32_t i) {
  if (f->rank == 0) {
    if (floor_wait(f, FLOOR_STAR, i, 0, f->size - 1)) {
      return -1;
    }
    for (int r = 1; r < f->size; r++) {
      if (floor_send(f, r, FLOOR_STAR, i, 1)) {
        return -1;
      }
    }
    return 0;
  }
  return floor_send(f, 0, FLOOR_STAR, i, 0) || floor_wait(f, FLOOR_STAR, i, 1, 1) ? -1 : 0;
}

/* A dissemination barrier, log2(np) rounds: the cached path's shape. */
static int floor_tree(struct floor_net *f, uint32_t i) {
  for (uint32_t k = 0; (1 << k) < f->size; k++) {
    if (floor_send(f, (f->rank + (1 << k)) % f->size, FLOOR_TREE, i, k) ||
        floor_wait(f, FLOOR_TREE, i, k, 1)) {
      return -1;
    }
  }
  return 0;
}

/* --control: the slow path, the cached path and the two floors, each n
 * times; rank 0 prints the medians. */
static int control(int n) {
  int rank = hora_rank(), size = hora_size(), rc;
  double *t = calloc((size_t)n * 4, sizeof *t);
  struct floor_net f = {.fd = -1, .rank = rank, .size = size, .iters = n};
  f.peer = calloc((size_t)size, sizeof *f.peer);
  f.count = calloc((size_t)FLOOR_KINDS * (size_t)n * FLOOR_ROUNDS, sizeof *f.count);
  int32_t *ports = calloc((size_t)size, sizeof *ports);
  if (!t || !f.peer || !f.count || !ports) {
    fprintf(stderr, "hora-bench-startup: out of memory\n");
    rc = HORA_ERR_NO_MEMORY;
    goto out;
  }
  int32_t one = 1, sum = 0;
  rc = hora_allreduce("bench_control.cached", &one, &sum, 1, HORA_INT32, HORA_SUM);
  for (int i = 0; i < n && rc == HORA_SUCCESS; i++) {
    char name[64];
    snprintf(name, sizeof name, "bench_control.new.%d", i);
    double t0 = seconds(CLOCK_MONOTONIC);
    rc = hora_allreduce(name, &one, &sum, 1, HORA_INT32, HORA_SUM);
    double t1 = seconds(CLOCK_MONOTONIC);
    if (rc == HORA_SUCCESS && sum == size) {
      rc = hora_allreduce("bench_control.cached", &one, &sum, 1, HORA_INT32, HORA_SUM);
    }
    double t2 = seconds(CLOCK_MONOTONIC);
    if (rc == HORA_SUCCESS && sum != size) {
      fprintf(stderr, "hora-bench-startup: rank %d: allreduce gave %d, expected %d\n", rank,
              (int)sum, size);
      rc = HORA_ERR_CORRUPT;
    }
    t[i] = (t1 - t0) * 1e6;
    t[n + i] = (t2 - t1) * 1e6;
  }
  if (rc != HORA_SUCCESS) {
    fprintf(stderr, "hora-bench-startup: control allreduces: %s (%s)\n", hora_strerror(rc),
            hora_last_error());
    goto out;
  }
  /* Before the floor's socket, which is not hora's. */
  print_resources(rank, "ops");

  f.fd = socket(AF_INET, SOCK_DGRAM, 0);
  struct sockaddr_in me = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof me;
  int rcvbuf = 4 << 20;
  struct timeval tmo = {.tv_sec = 30};
  if (f.fd < 0 || setsockopt(f.fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf) ||
      setsockopt(f.fd, SOL_SOCKET, SO_RCVTIMEO, &tmo, sizeof tmo) ||
      bind(f.fd, (struct sockaddr *)&me, sizeof me) ||
      getsockname(f.fd, (struct sockaddr *)&me, &len)) {
    fprintf(stderr, "hora-bench-startup: rank %d: floor socket: %s\n", rank, strerror(errno));
    rc = HORA_ERR_SYSTEM;
  }
  /* Every rank takes part in the exchange of ports, even one whose socket
   * failed (it sends port 0 and all stop below). */
  int32_t port = rc == HORA_SUCCESS ? (int32_t)ntohs(me.sin_port) : 0;
  int frc = hora_allgather("bench_control.ports", &port, 1, HORA_INT32, ports);
  if (frc != HORA_SUCCESS) {
    rc = frc;
    goto out;
  }
  for (int r = 0; r < size; r++) {
    if (ports[r] == 0) {
      rc = HORA_ERR_SYSTEM;
      goto out;
    }
    f.peer[r].sin_family = AF_INET;
    f.peer[r].sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    f.peer[r].sin_port = htons((uint16_t)ports[r]);
  }
  for (int kind = 0; kind < 2 && rc == HORA_SUCCESS; kind++) {
    rc = hora_barrier();
    for (int i = 0; i < n && rc == HORA_SUCCESS; i++) {
      double t0 = seconds(CLOCK_MONOTONIC);
      if ((kind == 0 ? floor_star : floor_tree)(&f, (uint32_t)i)) {
        rc = HORA_ERR_SYSTEM;
      }
      t[(2 + kind) * n + i] = (seconds(CLOCK_MONOTONIC) - t0) * 1e6;
    }
  }
  /* A rank that failed above still joins this one, so the others learn
   * it and stop instead of waiting for it. */
  double med[5] = {0, 0, 0, 0, rc == HORA_SUCCESS ? 0 : 1}, worst[5];
  if (rc == HORA_SUCCESS) {
    for (int k = 0; k < 4; k++) {
      med[k] = median(t + (size_t)k * n, n);
    }
  }
  frc = hora_allreduce("bench_control.max", med, worst, 5, HORA_FLOAT64, HORA_MAX);
  if (frc != HORA_SUCCESS || worst[4] != 0) {
    rc = frc != HORA_SUCCESS ? frc : HORA_ERR_SYSTEM;
    goto out;
  }
  if (rank == 0) {
    printf("control np=%d ops=%d new_us=%.1f cached_us=%.1f star_us=%.1f tree_us=%.1f "
           "new_us_max=%.1f cached_us_max=%.1f star_us_max=%.1f tree_us_max=%.1f\n",
           size, n, med[0], med[1], med[2], med[3], worst[0], worst[1], worst[2], worst[3]);
    fflush(stdout);
  }
out:
  if (f.fd >= 0) {
    close(f.fd);
  }
  free(ports);
  free(f.count);
  free(f.peer);
  free(t);
  return rc;
}

int main(int argc, char **argv) {
  double start = seconds(CLOCK_MONOTONIC);
  double start_real = seconds(CLOCK_REALTIME);
  int control_ops = 0;
  for (int i = 1; i < argc; i++) {
    char *end = NULL;
    if (strcmp(argv[i], "--control") == 0 && i + 1 < argc) {
      long v = strtol(argv[++i], &end, 10);
      if (*end == '\0' && v > 0 && v <= 100000) {
        control_ops = (int)v;
        continue;
      }
    }
    fprintf(stderr, "usage: hora-bench-startup [--control OPS]\n");
    return 2;
  }

  int rc = hora_init();
  if (rc != HORA_SUCCESS) {
    return fail("hora_init", rc);
  }
  double t_init = seconds(CLOCK_MONOTONIC) - start;

  int32_t one = 1, sum = 0;
  rc = hora_allreduce("bench_startup.first", &one, &sum, 1, HORA_INT32, HORA_SUM);
  double t_first = seconds(CLOCK_MONOTONIC) - start;
  double done_real = seconds(CLOCK_REALTIME);
  if (rc != HORA_SUCCESS) {
    hora_finalize();
    return fail("first allreduce", rc);
  }
  int rank = hora_rank(), size = hora_size();
  if (sum != size) {
    fprintf(stderr, "hora-bench-startup: rank %d: allreduce gave %d, expected %d\n", rank,
            (int)sum, size);
    hora_finalize();
    return 1;
  }
  printf("rank %d/%d init %.6f first_allreduce %.6f start_realtime %.6f done_realtime %.6f\n",
         rank, size, t_init, t_first, start_real, done_real);
  fflush(stdout);
  print_resources(rank, "up");

  /* The slowest rank's figures; the earliest start goes in negated. */
  double mine[5] = {t_init, t_first, -start_real, start_real, done_real}, worst[5];
  rc = hora_allreduce("bench_startup.max", mine, worst, 5, HORA_FLOAT64, HORA_MAX);
  if (rc != HORA_SUCCESS) {
    hora_finalize();
    return fail("collecting the maxima", rc);
  }
  if (rank == 0) {
    printf("startup np=%d init_max=%.6f first_allreduce_max=%.6f start_realtime_min=%.6f "
           "start_realtime_max=%.6f done_realtime_max=%.6f\n",
           size, worst[0], worst[1], -worst[2], worst[3], worst[4]);
    fflush(stdout);
  }
  if (control_ops > 0) {
    rc = control(control_ops);
    if (rc != HORA_SUCCESS) {
      hora_finalize();
      return fail("--control", rc);
    }
  }
  rc = hora_finalize();
  return rc == HORA_SUCCESS ? 0 : fail("hora_finalize", rc);
}
