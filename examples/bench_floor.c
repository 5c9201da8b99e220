/* hora-bench-floor: what the collectives cost with no runtime at all, as a
 * floor beside hora-bench. The ranks talk over plain TCP sockets, one per
 * pair, and wait in poll() (never spinning: many ranks may share few
 * cores). MPI only starts the ranks, exchanges the listening addresses and
 * holds barriers; it never carries the timed data.
 *
 * The exchange patterns, per collective (float32, sums):
 *   allreduce      rd:   recursive doubling, with the fold of the ranks
 *                        above the largest power of two
 *                  ring: reduce-scatter then allgather round the ring
 *                  rabenseifner: recursive halving, then doubling back
 *   broadcast      binomial: a binomial tree from rank 0
 *                  chain: a pipelined chain, each rank forwarding bytes
 *                         as soon as they arrive
 *   allgather      ring
 *   reducescatter  ring
 * Sizes, bytes and iterations are hora-bench's (bytes: allreduce and
 * broadcast the whole buffer, allgather the gathered buffer,
 * reducescatter each rank's input), so the two line up by size. Each
 * figure is the median over -r repetitions of the mean of -n back-to-back
 * operations, timed from a barrier to the last rank's finish; every
 * repetition is followed by a checked operation on fresh data.
 *
 *   mpirun -np 8 hora-bench-floor -o allreduce -b 8 -e 64M -f 8
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench_common.h"

enum coll { ALLREDUCE, BROADCAST, ALLGATHER, REDUCESCATTER, NCOLLS };
static const char *const coll_names[] = {"allreduce", "broadcast", "allgather", "reducescatter"};

static int rank, size;
static int *fds; /* fds[q]: the socket to rank q */
static float *tmp;

static void die(const char *what) {
  fprintf(stderr, "hora-bench-floor: rank %d: %s: %s\n", rank, what, strerror(errno));
  MPI_Abort(MPI_COMM_WORLD, 1);
}

/* ---- connections ----------------------------------------------------------- */

/* This host's IPv4 address on iface, or on the first interface up that is
 * not loopback. */
static struct in_addr my_address(const char *iface) {
  struct ifaddrs *all, *a;
  struct in_addr got = {.s_addr = htonl(INADDR_LOOPBACK)};
  if (getifaddrs(&all)) {
    die("getifaddrs");
  }
  for (a = all; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP)) {
      continue;
    }
    if (iface ? !strcmp(a->ifa_name, iface) : !(a->ifa_flags & IFF_LOOPBACK)) {
      got = ((struct sockaddr_in *)a->ifa_addr)->sin_addr;
      break;
    }
  }
  freeifaddrs(all);
  return got;
}

static void write_all(int fd, const void *p, size_t len) {
  while (len) {
    ssize_t k = write(fd, p, len);
    if (k < 0 && errno != EINTR) {
      die("write");
    }
    if (k > 0) {
      p = (const char *)p + k, len -= (size_t)k;
    }
  }
}

static void read_all(int fd, void *p, size_t len) {
  while (len) {
    ssize_t k = read(fd, p, len);
    if (k == 0) {
      errno = ECONNRESET;
    }
    if (k <= 0 && errno != EINTR) {
      die("read");
    }
    if (k > 0) {
      p = (char *)p + k, len -= (size_t)k;
    }
  }
}

/* A socket to every peer: each rank connects to those above it, whose
 * listening backlog holds the connection until they accept it. */
static void connect_all(const char *iface) {
  struct sockaddr_in me = {.sin_family = AF_INET}, *all = calloc((size_t)size, sizeof(me));
  socklen_t len = sizeof(me);
  int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  fds = malloc((size_t)size * sizeof(int));
  if (!all || !fds || lfd < 0) {
    die("socket");
  }
  for (int q = 0; q < size; q++) {
    fds[q] = -1;
  }
  if (bind(lfd, (struct sockaddr *)&me, sizeof(me)) || listen(lfd, size) ||
      getsockname(lfd, (struct sockaddr *)&me, &len)) {
    die("listen");
  }
  me.sin_addr = my_address(iface);
  MPI_Allgather(&me, (int)sizeof(me), MPI_BYTE, all, (int)sizeof(me), MPI_BYTE, MPI_COMM_WORLD);
  for (int q = rank + 1; q < size; q++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&all[q], sizeof(all[q]))) {
      die("connect");
    }
    int32_t who = rank;
    write_all(fd, &who, sizeof(who));
    fds[q] = fd;
  }
  for (int k = 0; k < rank; k++) {
    int fd = accept(lfd, NULL, NULL);
    int32_t who = -1;
    if (fd < 0) {
      die("accept");
    }
    read_all(fd, &who, sizeof(who));
    if (who < 0 || who >= rank || fds[who] >= 0) {
      errno = EPROTO;
      die("accept: a stranger");
    }
    fds[who] = fd;
  }
  close(lfd);
  for (int q = 0; q < size; q++) {
    if (q != rank) {
      /* Small messages go out at once, as a runtime's would. */
      setsockopt(fds[q], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
  }
  free(all);
  MPI_Barrier(MPI_COMM_WORLD);
}

/* ---- moving bytes ------------------------------------------------------------ */

/* Sends slen bytes to rank `to` while receiving rlen from rank `from`
 * (either may be -1 or 0 bytes), sleeping in poll() until the sockets can
 * move more. */
static void xchg(int to, const void *sbuf, size_t slen, int from, void *rbuf, size_t rlen) {
  const char *s = sbuf;
  char *r = rbuf;
  if (to < 0) {
    slen = 0;
  }
  if (from < 0) {
    rlen = 0;
  }
  while (slen || rlen) {
    struct pollfd p[2];
    int np = 0;
    if (slen) {
      p[np++] = (struct pollfd){.fd = fds[to], .events = POLLOUT};
    }
    if (rlen) {
      p[np++] = (struct pollfd){.fd = fds[from], .events = POLLIN};
    }
    if (poll(p, (nfds_t)np, -1) < 0) {
      if (errno == EINTR) {
        continue;
      }
      die("poll");
    }
    for (int i = 0; i < np; i++) {
      if (!p[i].revents) {
        continue;
      }
      if (p[i].events == POLLOUT) {
        ssize_t k = send(fds[to], s, slen, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k < 0 && errno != EAGAIN && errno != EINTR) {
          die("send");
        }
        if (k > 0) {
          s += k, slen -= (size_t)k;
        }
      } else {
        ssize_t k = recv(fds[from], r, rlen, MSG_DONTWAIT);
        if (k == 0) {
          errno = ECONNRESET;
          die("recv");
        }
        if (k < 0 && errno != EAGAIN && errno != EINTR) {
          die("recv");
        }
        if (k > 0) {
          r += k, rlen -= (size_t)k;
        }
      }
    }
  }
}

static void add(float *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i++) {
    dst[i] += src[i];
  }
}

/* Block b of n elements split into size blocks (the first n % size one
 * longer). */
static size_t blk_off(size_t n, int b) {
  size_t base = n / (size_t)size, extra = n % (size_t)size;
  return (size_t)b * base + ((size_t)b < extra ? (size_t)b : extra);
}

static size_t blk_len(size_t n, int b) {
  return blk_off(n, b + 1) - blk_off(n, b);
}

static int mod(int a) {
  return ((a % size) + size) % size;
}

/* ---- the patterns ------------------------------------------------------------ */

/* The fold of the ranks above the largest power of two p2: among the first
 * 2 * rem ranks each even one hands its data to the odd one above it and
 * waits for the result. Returns this rank's place among the p2 (-1: it sat
 * out and holds the result); fold_out hands the result back. */
static int fold_in(float *buf, size_t n, int *p2, int *rem) {
  *p2 = 1;
  while (*p2 * 2 <= size) {
    *p2 *= 2;
  }
  *rem = size - *p2;
  if (rank >= 2 * *rem) {
    return rank - *rem;
  }
  if (rank % 2 == 0) {
    xchg(rank + 1, buf, n * sizeof(float), -1, NULL, 0);
    xchg(-1, NULL, 0, rank + 1, buf, n * sizeof(float));
    return -1;
  }
  xchg(-1, NULL, 0, rank - 1, tmp, n * sizeof(float));
  add(buf, tmp, n);
  return rank / 2;
}

static void fold_out(float *buf, size_t n, int rem) {
  if (rank < 2 * rem) {
    xchg(rank - 1, buf, n * sizeof(float), -1, NULL, 0);
  }
}

/* The rank at place vp among the p2. */
static int fold_rank(int vp, int rem) { return vp < rem ? vp * 2 + 1 : vp + rem; }

static void allreduce_rd(float *buf, size_t n) {
  size_t bytes = n * sizeof(float);
  int p2, rem, vr = fold_in(buf, n, &p2, &rem);
  if (vr < 0) {
    return;
  }
  for (int mask = 1; mask < p2; mask <<= 1) {
    int peer = fold_rank(vr ^ mask, rem);
    xchg(peer, buf, bytes, peer, tmp, bytes);
    add(buf, tmp, n);
  }
  fold_out(buf, n, rem);
}

/* Rabenseifner: the fold as in rd, recursive halving (each step keeps the
 * half this rank's bit names and sends the other), then recursive
 * doubling retracing the halving. */
static void allreduce_rabenseifner(float *buf, size_t n) {
  int p2, rem, vr = fold_in(buf, n, &p2, &rem);
  if (vr < 0) {
    return;
  }
  size_t lo = 0, hi = n, los[32], his[32];
  int peers[32], k = 0;
  for (int mask = p2 / 2; mask >= 1; mask >>= 1, k++) {
    int peer = fold_rank(vr ^ mask, rem);
    size_t mid = lo + (hi - lo) / 2;
    bool lower = (vr & mask) == 0;
    size_t klo = lower ? lo : mid, khi = lower ? mid : hi;
    size_t slo = lower ? mid : lo, shi = lower ? hi : mid;
    xchg(peer, buf + slo, (shi - slo) * sizeof(float), peer, tmp + klo,
         (khi - klo) * sizeof(float));
    add(buf + klo, tmp + klo, khi - klo);
    los[k] = lo, his[k] = hi, peers[k] = peer;
    lo = klo, hi = khi;
  }
  while (k-- > 0) {
    /* Send the part this rank holds, receive the rest of the step's range. */
    size_t olo = lo == los[k] ? hi : los[k], ohi = lo == los[k] ? his[k] : lo;
    xchg(peers[k], buf + lo, (hi - lo) * sizeof(float), peers[k], buf + olo,
         (ohi - olo) * sizeof(float));
    lo = los[k], hi = his[k];
  }
  fold_out(buf, n, rem);
}

/* Round the ring: rank r ends with the sum of block r. */
static void ring_reduce_scatter(float *buf, size_t n) {
  int next = mod(rank + 1), prev = mod(rank - 1);
  for (int s = 0; s < size - 1; s++) {
    int sb = mod(rank - s - 1), rb = mod(rank - s - 2);
    xchg(next, buf + blk_off(n, sb), blk_len(n, sb) * sizeof(float), prev, tmp,
         blk_len(n, rb) * sizeof(float));
    add(buf + blk_off(n, rb), tmp, blk_len(n, rb));
  }
}

/* Round the ring: from rank r holding block r to every rank holding all. */
static void ring_allgather(float *buf, size_t n) {
  int next = mod(rank + 1), prev = mod(rank - 1);
  for (int s = 0; s < size - 1; s++) {
    int sb = mod(rank - s), rb = mod(rank - s - 1);
    xchg(next, buf + blk_off(n, sb), blk_len(n, sb) * sizeof(float), prev, buf + blk_off(n, rb),
         blk_len(n, rb) * sizeof(float));
  }
}

static void allreduce_ring(float *buf, size_t n) {
  ring_reduce_scatter(buf, n);
  ring_allgather(buf, n);
}

static void broadcast_binomial(float *buf, size_t n) {
  size_t bytes = n * sizeof(float);
  int mask = 1;
  while (mask < size && !(rank & mask)) {
    mask <<= 1;
  }
  if (rank) {
    xchg(-1, NULL, 0, rank - mask, buf, bytes);
  }
  for (mask >>= 1; mask; mask >>= 1) {
    if (rank + mask < size) {
      xchg(rank + mask, buf, bytes, -1, NULL, 0);
    }
  }
}

/* Rank r receives from r - 1 and forwards to r + 1 whatever has arrived. */
static void broadcast_chain(float *buf, size_t n) {
  size_t bytes = n * sizeof(float), got = rank ? 0 : bytes, sent = 0;
  char *b = (char *)buf;
  int to = rank + 1 < size ? rank + 1 : -1, from = rank ? rank - 1 : -1;
  if (to < 0) {
    sent = bytes;
  }
  while (got < bytes || sent < bytes) {
    struct pollfd p[2];
    int np = 0;
    if (sent < got) {
      p[np++] = (struct pollfd){.fd = fds[to], .events = POLLOUT};
    }
    if (got < bytes) {
      p[np++] = (struct pollfd){.fd = fds[from], .events = POLLIN};
    }
    if (poll(p, (nfds_t)np, -1) < 0) {
      if (errno == EINTR) {
        continue;
      }
      die("poll");
    }
    for (int i = 0; i < np; i++) {
      if (!p[i].revents) {
        continue;
      }
      ssize_t k = p[i].events == POLLOUT
                      ? send(fds[to], b + sent, got - sent, MSG_DONTWAIT | MSG_NOSIGNAL)
                      : recv(fds[from], b + got, bytes - got, MSG_DONTWAIT);
      if (k == 0) {
        errno = ECONNRESET;
      }
      if (k <= 0 && errno != EAGAIN && errno != EINTR) {
        die("chain");
      }
      if (k > 0) {
        *(p[i].events == POLLOUT ? &sent : &got) += (size_t)k;
      }
    }
  }
}


struct pattern {
  enum coll c;
  const char *name;
  void (*run)(float *buf, size_t n);
};

static const struct pattern patterns[] = {
    {ALLREDUCE, "rd", allreduce_rd},          {ALLREDUCE, "ring", allreduce_ring},
    {ALLREDUCE, "rabenseifner", allreduce_rabenseifner},
    {BROADCAST, "binomial", broadcast_binomial}, {BROADCAST, "chain", broadcast_chain},
    /* allgather: the input is this rank's block, in place at its offset;
     * reducescatter: the output is this rank's block of the sum, at its offset. */
    {ALLGATHER, "ring", ring_allgather},      {REDUCESCATTER, "ring", ring_reduce_scatter},
};
#define NPATTERNS ((int)(sizeof(patterns) / sizeof(patterns[0])))

/* ---- checking ---------------------------------------------------------------- */

/* hora-bench's values: exact in float32 whatever the rank count. */
static float value(int r, int salt, size_t i) {
  return (float)((r + salt + (int)(i % 61)) % 64);
}

static void fill(enum coll c, float *buf, size_t n, int salt) {
  for (size_t i = 0; i < n; i++) {
    buf[i] = c == BROADCAST && rank ? -1.0f : value(rank, salt, i);
  }
  if (c == ALLGATHER) {
    /* Only this rank's block is input; the rest must be overwritten. */
    size_t o = blk_off(n, rank), l = blk_len(n, rank);
    for (size_t i = 0; i < n; i++) {
      buf[i] = i >= o && i < o + l ? value(rank, salt, i - o) : -1.0f;
    }
  }
}

static size_t check(enum coll c, const float *buf, size_t n, int salt) {
  size_t bad = 0, lo = 0, hi = n;
  if (c == REDUCESCATTER) {
    lo = blk_off(n, rank), hi = lo + blk_len(n, rank);
  }
  for (size_t i = lo; i < hi; i++) {
    float want = 0;
    if (c == ALLREDUCE || c == REDUCESCATTER) {
      for (int r = 0; r < size; r++) {
        want += value(r, salt, i);
      }
    } else if (c == BROADCAST) {
      want = value(0, salt, i);
    } else {
      int r = 0;
      while (r + 1 < size && i >= blk_off(n, r + 1)) {
        r++;
      }
      want = value(r, salt, i - blk_off(n, r));
    }
    bad += buf[i] != want;
  }
  return bad;
}

/* ---- the driver ---------------------------------------------------------------- */

/* From a common start to the last rank's finish: a broadcast's root alone
 * could return long before the others have its data. */
static double timed(const struct pattern *pt, float *buf, size_t n, int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime(), t, tmax;
  for (int i = 0; i < iters; i++) {
    pt->run(buf, n);
  }
  t = (MPI_Wtime() - t0) / iters;
  MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return tmax;
}

static void usage(void) {
  fprintf(stderr,
          "usage: hora-bench-floor [options]\n"
          "  -b SIZE   smallest message in bytes (default 8); K, M, G suffixes\n"
          "  -e SIZE   largest message in bytes (default 64M)\n"
          "  -f N      size multiplier between steps (default 4)\n"
          "  -o OP     allreduce | broadcast | allgather | reducescatter | all (default all)\n"
          "  -n N      operations per timed repetition (default: by size, as hora-bench)\n"
          "  -r N      repetitions; the median is printed (default 5)\n"
          "  -p NAME   only this pattern (rd, ring, rabenseifner, binomial, chain)\n"
          "  -i IFACE  the interface whose address peers connect to (default: the first\n"
          "            one up that is not loopback)\n"
          "float32 data; sums; broadcast from rank 0; plain TCP between every pair.\n");
}

int main(int argc, char **argv) {
  size_t minb = 8, maxb = 64 << 20;
  double factor = 4;
  int reps = 5, fixed_iters = 0, colls[NCOLLS] = {1, 1, 1, 1};
  const char *iface = NULL, *only = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-b") && i + 1 < argc) {
      minb = parse_size(argv[++i]);
    } else if (!strcmp(a, "-e") && i + 1 < argc) {
      maxb = parse_size(argv[++i]);
    } else if (!strcmp(a, "-f") && i + 1 < argc) {
      factor = atof(argv[++i]);
    } else if (!strcmp(a, "-r") && i + 1 < argc) {
      reps = atoi(argv[++i]);
    } else if (!strcmp(a, "-n") && i + 1 < argc) {
      fixed_iters = atoi(argv[++i]);
    } else if (!strcmp(a, "-i") && i + 1 < argc) {
      iface = argv[++i];
    } else if (!strcmp(a, "-p") && i + 1 < argc) {
      only = argv[++i];
    } else if (!strcmp(a, "-o") && i + 1 < argc) {
      const char *o = argv[++i];
      int all = !strcmp(o, "all"), any = all;
      for (int c = 0; c < NCOLLS; c++) {
        colls[c] = all || !strcmp(o, coll_names[c]);
        any |= colls[c];
      }
      if (!any) {
        usage();
        return 2;
      }
    } else {
      usage();
      return a[0] == '-' && a[1] == 'h' ? 0 : 2;
    }
  }
  if (factor <= 1 || reps < 1 || minb < 4 || maxb < minb) {
    usage();
    return 2;
  }
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  size_t maxn = maxb / 4 + (size_t)size;
  float *buf = malloc(maxn * sizeof(float));
  double *t = calloc((size_t)reps, sizeof(double));
  tmp = malloc(maxn * sizeof(float));
  if (!buf || !tmp || !t) {
    errno = ENOMEM;
    die("malloc");
  }
  memset(buf, 0, maxn * sizeof(float));
  memset(tmp, 0, maxn * sizeof(float));
  if (size > 1) {
    connect_all(iface);
  }
  long errors = 0;
  for (int c = 0; c < NCOLLS; c++) {
    if (!colls[c]) {
      continue;
    }
    double bus = c == ALLREDUCE ? 2.0 * (size - 1) / size
                 : c == BROADCAST ? 1.0
                                  : (double)(size - 1) / size;
    const struct pattern *mine[NPATTERNS];
    int np = 0;
    for (int k = 0; k < NPATTERNS; k++) {
      if (patterns[k].c == (enum coll)c && (!only || !strcmp(only, patterns[k].name))) {
        mine[np++] = &patterns[k];
      }
    }
    if (rank == 0) {
      printf("# %s floor, %d ranks, float32, plain TCP, median of %d repetitions\n",
             coll_names[c], size, reps);
      printf("# %12s %10s", "bytes", "count");
      for (int k = 0; k < np; k++) {
        printf(" | %10s_us %8s", mine[k]->name, "busbw");
      }
      printf(" | %10s %6s\n", "floor_us", "errors");
    }
    for (double bd = (double)minb; bd <= (double)maxb * 1.0001; bd *= factor) {
      size_t n = (size_t)bd / 4;
      if (c != ALLREDUCE && c != BROADCAST) {
        n = n / (size_t)size * (size_t)size;
      }
      if (n == 0) {
        continue;
      }
      size_t bytes = n * 4, bad = 0;
      int iters = fixed_iters ? fixed_iters : (int)HORA_CLAMP_ITERS(bytes);
      double med[NPATTERNS], best = 0;
      for (int k = 0; k < np; k++) {
        for (int r = 0; r < reps + 1; r++) { /* the first is a warm-up */
          fill((enum coll)c, buf, n, r);
          double tt = timed(mine[k], buf, n, r == 0 && iters < 10 ? 10 : iters);
          fill((enum coll)c, buf, n, r + 1);
          mine[k]->run(buf, n);
          bad += check((enum coll)c, buf, n, r + 1);
          if (r > 0) {
            t[r - 1] = tt;
          }
        }
        med[k] = median(t, reps);
        best = k == 0 || med[k] < best ? med[k] : best;
      }
      long all_bad = 0, b = (long)bad;
      MPI_Allreduce(&b, &all_bad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
      errors += all_bad;
      if (rank == 0) {
        printf("  %12zu %10zu", bytes, n);
        for (int k = 0; k < np; k++) {
          printf(" | %13.2f %8.3f", med[k] * 1e6, (double)bytes / med[k] / 1e9 * bus);
        }
        printf(" | %10.2f %6ld\n", best * 1e6, all_bad);
        fflush(stdout);
      }
    }
  }
  if (rank == 0) {
    printf("# %s: %ld wrong results\n", errors ? "FAILED" : "results checked", errors);
  }
  for (int q = 0; fds && q < size; q++) {
    if (q != rank) {
      close(fds[q]);
    }
  }
  free(fds);
  free(buf);
  free(tmp);
  free(t);
  MPI_Finalize();
  return errors ? 1 : 0;
}
