/* hora-bench-resnet: the engine's figures, side by side with MPI in the
 * same run.
 *
 *   1. The ResNet-50 gradient set (torchvision's resnet50: 161 float32
 *      tensors, 25,557,032 elements), submitted async in reverse order and
 *      then waited for, against one MPI_Allreduce of a buffer of the same
 *      total size and against 161 separate MPI_Allreduce calls.
 *   2. A lone 8-byte allreduce, submit and wait, against MPI_Allreduce.
 *   3. Optionally (--steady N), N steps of the gradient set, printing the
 *      resident set size and the bytes held from malloc as it goes.
 *
 * Every result is checked. Times are medians over --reps repetitions.
 * --soak SECONDS runs only the gradient set, step after step, checking
 * every element of every result, and fails when the resident set or the
 * count of open file descriptors of any rank grows after warm-up
 * (scripts/soak.sh).
 *
 * The first --warmup steps (default 10) are not timed: they set up
 * connections, the response cache and the fusion buffer, and choose the
 * intra-host path (HORA_SHM_SINGLE_COPY=auto times both on early steps).
 * MPI's calls get one untimed round of each kind too.
 *
 * Unless --plain-malloc, large mallocs stay in the heap once made (mallopt),
 * for MPI's sake: Open MPI allocates temporary buffers per call, and where
 * page faults are slow (some virtual machines) fresh mappings every call
 * made it several times slower than on the same machine with reused memory,
 * which would flatter hora. hora allocates its buffers once either way.
 *
 * --hora-mem carves every tensor, and MPI's single buffer, out of blocks from
 * hora_mem_alloc, as a trainer with a flat gradient arena would; MPI's
 * calls use the same buffers.
 *
 *   mpirun -np 2 hora-bench-resnet [--reps 7] [--warmup 10] [--lat-iters 20000]
 *                                  [--steady 100000] [--hora-mem] [--plain-malloc]
 *   mpirun -np 4 hora-bench-resnet --soak 600
 */
#include <dirent.h>
#include <malloc.h>
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "hora.h"
#include "bench_common.h"

#define MAX_TENSORS 200

static size_t sizes[MAX_TENSORS];
static int ntensors;

static void add(size_t n) { sizes[ntensors++] = n; }

/* Parameter shapes of torchvision.models.resnet50, in model order. */
static void resnet50_shapes(void) {
  add(64 * 3 * 7 * 7);
  add(64);
  add(64);
  const int planes[4] = {64, 128, 256, 512}, blocks[4] = {3, 4, 6, 3};
  int inplanes = 64;
  for (int l = 0; l < 4; l++) {
    for (int b = 0; b < blocks[l]; b++) {
      int p = planes[l];
      add((size_t)p * (size_t)inplanes);
      add((size_t)p);
      add((size_t)p);
      add((size_t)p * (size_t)p * 9);
      add((size_t)p);
      add((size_t)p);
      add((size_t)p * 4 * (size_t)p);
      add((size_t)p * 4);
      add((size_t)p * 4);
      if (b == 0) {
        add((size_t)p * 4 * (size_t)inplanes);
        add((size_t)p * 4);
        add((size_t)p * 4);
      }
      inplanes = p * 4;
    }
  }
  add(1000 * 2048);
  add(1000);
}

/* A "Name:   N kB" line of /proc/self/status, in KiB. */
static long status_kib(const char *field) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kib = -1;
  size_t len = strlen(field);
  while (f && fgets(line, sizeof(line), f)) {
    if (strncmp(line, field, len) == 0) {
      kib = atol(line + len);
    }
  }
  if (f) {
    fclose(f);
  }
  return kib;
}

static long rss_kib(void) { return status_kib("VmRSS:"); }

/* Resident pages of shared mappings: the host segment, and with --hora-mem
 * this rank's blocks and the peers' blocks it has touched so far. A peer's
 * pages join this count as the slices this rank reduces move over them. */
static long shmem_kib(void) { return status_kib("RssShmem:"); }

#define CHECK(call)                                                                          \
  do {                                                                                       \
    int rc_ = (call);                                                                        \
    if (rc_ != HORA_SUCCESS) {                                                               \
      fprintf(stderr, "rank %d: %s: %s\n", rank, #call, hora_last_error());                  \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
    }                                                                                        \
  } while (0)

static int rank, size;
static float *bufs[MAX_TENSORS];
static char names[MAX_TENSORS][32];

static void fill(int iter) {
  for (int t = 0; t < ntensors; t++) {
    for (size_t i = 0; i < sizes[t]; i += 997) {
      bufs[t][i] = (float)(rank + iter + t);
    }
    bufs[t][sizes[t] - 1] = (float)(rank + iter + t);
  }
}

static int verify(int iter) {
  int bad = 0;
  for (int t = 0; t < ntensors; t++) {
    float want = (float)(size * (iter + t) + size * (size - 1) / 2);
    if (bufs[t][0] != want || bufs[t][sizes[t] - 1] != want) {
      bad++;
    }
  }
  return bad;
}

/* The floor on one host with malloc'd buffers, no runtime at all: what the
 * single-copy allreduce must do at the least. Rank r sums slice r of every
 * tensor, reading the peers' slices through the kernel (process_vm_readv,
 * into a cache-sized bounce buffer) and writing the sums into every peer's
 * tensor (process_vm_writev); two barriers. Buffers and pids by MPI. */
static uintptr_t (*peer_bufs)[MAX_TENSORS];
static pid_t *peer_pids;

static void cma_or_die(ssize_t got, size_t want, const char *what) {
  if (got != (ssize_t)want) {
    fprintf(stderr, "rank %d: %s moved %zd of %zu bytes\n", rank, what, got, want);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

static double kernel_copy_floor(int iter) {
  enum { BOUNCE = 512 * 1024 / sizeof(float) };
  static float bounce[BOUNCE];
  fill(iter);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int t = 0; t < ntensors; t++) {
    size_t a = sizes[t] * (size_t)rank / (size_t)size, b = sizes[t] * (size_t)(rank + 1) / (size_t)size;
    for (size_t x = a; x < b; x += BOUNCE) {
      size_t n = b - x < BOUNCE ? b - x : BOUNCE;
      for (int q = 0; q < size; q++) {
        if (q == rank) {
          continue;
        }
        struct iovec l = {bounce, n * sizeof(float)};
        struct iovec r = {(void *)(peer_bufs[q][t] + x * sizeof(float)), n * sizeof(float)};
        cma_or_die(process_vm_readv(peer_pids[q], &l, 1, &r, 1, 0), n * sizeof(float), "readv");
        float *mine = bufs[t] + x;
        for (size_t i = 0; i < n; i++) {
          mine[i] += bounce[i];
        }
      }
      for (int q = 0; q < size; q++) {
        if (q != rank) {
          struct iovec l = {bufs[t] + x, n * sizeof(float)};
          struct iovec r = {(void *)(peer_bufs[q][t] + x * sizeof(float)), n * sizeof(float)};
          cma_or_die(process_vm_writev(peer_pids[q], &l, 1, &r, 1, 0), n * sizeof(float), "writev");
        }
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  double dt = MPI_Wtime() - t0;
  if (verify(iter)) {
    fprintf(stderr, "rank %d: wrong sums in the kernel-copy floor, step %d\n", rank, iter);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return dt;
}

/* The floor of a small allreduce that never spins: 8 bytes summed by
 * recursive doubling (ranks past the largest power of two fold in first)
 * over Unix sockets, every wait a blocking read, as a runtime that sleeps
 * whenever it waits must do at the least, once. Each pair of partners
 * connects through an abstract Unix socket named by the job and the pair. */
#include <sys/socket.h>
#include <sys/un.h>

static int floor_fd[64]; /* by partner rank, -1: none */

static int floor_connect(int peer, uint64_t job) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  int lo = rank < peer ? rank : peer, hi = rank < peer ? peer : rank;
  snprintf(a.sun_path + 1, sizeof(a.sun_path) - 1, "hora-floor-%llx-%d-%d", (unsigned long long)job,
           lo, hi);
  socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(a.sun_path + 1));
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (rank == lo) {
    int l = fd;
    if (bind(l, (struct sockaddr *)&a, len) || listen(l, 1)) {
      return -1;
    }
    MPI_Send(&lo, 1, MPI_INT, peer, 77, MPI_COMM_WORLD); /* listening */
    fd = accept(l, NULL, NULL);
    close(l);
  } else {
    int x;
    MPI_Recv(&x, 1, MPI_INT, peer, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (connect(fd, (struct sockaddr *)&a, len)) {
      return -1;
    }
  }
  return fd;
}

static int floor_xchg(int peer, double *v, int send, int recv) {
  double got;
  if (send && write(floor_fd[peer], v, sizeof(*v)) != (ssize_t)sizeof(*v)) {
    return -1;
  }
  if (recv) {
    size_t have = 0;
    while (have < sizeof(got)) {
      ssize_t r = read(floor_fd[peer], (char *)&got + have, sizeof(got) - have);
      if (r <= 0) {
        return -1;
      }
      have += (size_t)r;
    }
    *v += got;
  }
  return 0;
}

/* Median us of `iters` 8-byte sums; 0 where it cannot run (over 64 ranks). */
static double sleeping_latency_floor(int iters, int reps) {
  if (size > 64) {
    return 0;
  }
  uint64_t job = 0;
  if (rank == 0) {
    job = (uint64_t)getpid() << 16 ^ (uint64_t)(MPI_Wtime() * 1e6);
  }
  MPI_Bcast(&job, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  int P = 1;
  while (P * 2 <= size) {
    P *= 2;
  }
  int partners[64], np = 0;
  if (rank >= P || rank + P < size) {
    partners[np++] = rank >= P ? rank - P : rank + P;
  }
  for (int d = 1; rank < P && d < P; d *= 2) {
    partners[np++] = rank ^ d;
  }
  for (int q = 0; q < 64; q++) {
    floor_fd[q] = -1;
  }
  /* Pairs in the same order everywhere, so no two ranks wait on each other. */
  for (int a = 0; a < size; a++) {
    for (int b = a + 1; b < size; b++) {
      int other = rank == a ? b : rank == b ? a : -1;
      bool partner = false;
      for (int k = 0; other >= 0 && k < np; k++) {
        partner = partner || partners[k] == other;
      }
      if (partner && (floor_fd[other] = floor_connect(other, job)) < 0) {
        return 0;
      }
    }
  }
  double *t = calloc((size_t)reps, sizeof(double));
  for (int r = 0; r < reps; r++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) {
      double v = 1;
      if (rank >= P) {
        floor_xchg(rank - P, &v, 1, 0);
        v = 0;
        floor_xchg(rank - P, &v, 0, 1);
        continue;
      }
      if (rank + P < size) {
        floor_xchg(rank + P, &v, 0, 1);
      }
      for (int d = 1; d < P; d *= 2) {
        floor_xchg(rank ^ d, &v, 1, 1);
      }
      if (rank + P < size) {
        floor_xchg(rank + P, &v, 1, 0);
      }
      if (v != size) {
        fprintf(stderr, "rank %d: the floor's sum is %g\n", rank, v);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
    t[r] = (MPI_Wtime() - t0) / iters;
  }
  for (int q = 0; q < 64; q++) {
    if (floor_fd[q] >= 0) {
      close(floor_fd[q]);
    }
  }
  double m = median(t, reps);
  free(t);
  return m;
}

/* Whether every rank is on this host (the floor needs process_vm_readv). */
static int one_host(void) {
  MPI_Comm local;
  int n = 0;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  MPI_Comm_size(local, &n);
  MPI_Comm_free(&local);
  return n == size;
}

/* The same tensors each allreduced alone by hora, one after another: what
 * fusion has to beat. */
static double hora_step_unfused(int iter) {
  fill(iter);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int t = ntensors - 1; t >= 0; t--) {
    CHECK(hora_allreduce(names[t], bufs[t], bufs[t], sizes[t], HORA_FLOAT32, HORA_SUM));
  }
  double dt = MPI_Wtime() - t0;
  if (verify(iter)) {
    fprintf(stderr, "rank %d: wrong allreduce result in unfused step %d\n", rank, iter);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return dt;
}

static double hora_step(int iter) {
  hora_request *reqs[MAX_TENSORS];
  fill(iter);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int t = ntensors - 1; t >= 0; t--) {
    CHECK(hora_allreduce_async(names[t], bufs[t], bufs[t], sizes[t], HORA_FLOAT32, HORA_SUM,
                               &reqs[t]));
  }
  for (int t = ntensors - 1; t >= 0; t--) {
    CHECK(hora_wait(&reqs[t]));
  }
  double dt = MPI_Wtime() - t0;
  if (verify(iter)) {
    fprintf(stderr, "rank %d: wrong allreduce result in step %d\n", rank, iter);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return dt;
}

/* Bytes the program holds from malloc (glibc): a leak grows this, pages
 * touched for the first time only grow RSS. */
static long heap_bytes(void) {
  struct mallinfo2 mi = mallinfo2();
  return (long)(mi.uordblks + mi.hblkhd);
}

static long heap_kib(void) {
  return heap_bytes() / 1024;
}

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  while (d && readdir(d)) {
    n++;
  }
  if (d) {
    closedir(d);
  }
  return n;
}

/* Element i of tensor t on rank r in step s holds (r + s + t + i % 17) % 64:
 * small integers, so every sum is exact and every element is checked. */
static long soak_step(long s, const float *sum_of) {
  hora_request *reqs[MAX_TENSORS];
  for (int t = 0; t < ntensors; t++) {
    for (size_t i = 0; i < sizes[t]; i++) {
      bufs[t][i] = (float)((rank + s + t + (long)(i % 17)) % 64);
    }
  }
  for (int t = ntensors - 1; t >= 0; t--) {
    CHECK(hora_allreduce_async(names[t], bufs[t], bufs[t], sizes[t], HORA_FLOAT32, HORA_SUM,
                               &reqs[t]));
  }
  long bad = 0;
  for (int t = ntensors - 1; t >= 0; t--) {
    CHECK(hora_wait(&reqs[t]));
    for (size_t i = 0; i < sizes[t]; i++) {
      bad += bufs[t][i] != sum_of[(s + t + (long)(i % 17)) % 64];
    }
  }
  return bad;
}

static int soak(double seconds) {
  float sum_of[64]; /* sum over ranks of (r + k) % 64 */
  for (int k = 0; k < 64; k++) {
    sum_of[k] = 0;
    for (int r = 0; r < size; r++) {
      sum_of[k] += (float)((r + k) % 64);
    }
  }
  double warmup = seconds / 10 < 10 ? 10 : seconds / 10;
  double t0 = MPI_Wtime(), next_report = t0;
  long rss0 = 0, fds0 = 0, heap0 = 0, bad = 0, s = 0, worst[3] = {0, 0, 0};
  int go = 1, warmed = 0;
  for (; go; s++) {
    bad += soak_step(s, sum_of);
    double now = MPI_Wtime();
    long mine[3] = {rss_kib(), count_fds(), heap_kib()}, max[3];
    if (!warmed && now - t0 >= warmup) {
      rss0 = mine[0];
      fds0 = mine[1];
      heap0 = mine[2];
      warmed = 1;
    }
    if (warmed) {
      long growth[3] = {mine[0] - rss0, mine[1] - fds0, mine[2] - heap0}, g[3];
      MPI_Allreduce(growth, g, 3, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
      for (int k = 0; k < 3; k++) {
        worst[k] = g[k] > worst[k] ? g[k] : worst[k];
      }
    }
    MPI_Allreduce(mine, max, 3, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0 && now >= next_report) {
      printf("soak %6.0f s  step %7ld  RSS (largest rank) %ld KiB  heap in use %ld KiB  open fds "
             "%ld%s\n",
             now - t0, s, max[0], max[2], max[1], warmed ? "" : "  (warming up)");
      fflush(stdout);
      next_report += seconds / 20 > 5 ? seconds / 20 : 5;
    }
    go = now - t0 < seconds;
    MPI_Bcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD);
  }
  long all_bad = 0;
  MPI_Allreduce(&bad, &all_bad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  /* Flat: allocator noise aside (1 MiB), nothing grows after warm-up. */
  int ok = all_bad == 0 && worst[0] <= 1024 && worst[1] == 0 && worst[2] <= 256;
  if (rank == 0) {
    printf("soak: %s: %d ranks, %ld steps of %d tensors in %.0f s, %ld wrong elements; after "
           "warm-up the worst rank grew RSS by %ld KiB, heap in use by %ld KiB, open fds by %ld\n",
           ok ? "PASS" : "FAIL", size, s, ntensors, MPI_Wtime() - t0, all_bad, worst[0], worst[2],
           worst[1]);
  }
  return ok;
}

int main(int argc, char **argv) {
  int reps = 7, lat_iters = 20000;
  long steady = 0;
  double soak_seconds = 0;
  int hora_mem = 0, warmup = 10, plain_malloc = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) {
      warmup = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--plain-malloc")) {
      plain_malloc = 1;
    } else if (!strcmp(argv[i], "--lat-iters") && i + 1 < argc) {
      lat_iters = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--steady") && i + 1 < argc) {
      steady = atol(argv[++i]);
    } else if (!strcmp(argv[i], "--soak") && i + 1 < argc) {
      soak_seconds = atof(argv[++i]);
    } else if (!strcmp(argv[i], "--hora-mem")) {
      hora_mem = 1;
    } else {
      fprintf(stderr,
              "usage: %s [--reps N] [--warmup N] [--lat-iters N] [--steady STEPS] [--hora-mem] "
              "[--plain-malloc] | --soak SECONDS\n",
              argv[0]);
      return 2;
    }
  }
  if (!plain_malloc) {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    mallopt(M_TOP_PAD, 256 << 20);
  }
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (hora_init() != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  rank = hora_rank();
  size = hora_size();
  resnet50_shapes();
  size_t total = 0, arena_floats = 0;
  for (int t = 0; t < ntensors; t++) {
    total += sizes[t];
    arena_floats += (sizes[t] + 15) / 16 * 16; /* each tensor 64-byte aligned */
  }
  float *arena = NULL, *flat = NULL;
  if (hora_mem) {
    CHECK(hora_mem_alloc(arena_floats * sizeof(float), (void **)&arena));
    CHECK(hora_mem_alloc(total * sizeof(float), (void **)&flat));
  } else {
    flat = malloc(total * sizeof(float));
  }
  for (int t = 0, at = 0; t < ntensors; t++) {
    if (hora_mem) {
      bufs[t] = arena + at;
      at += (int)((sizes[t] + 15) / 16 * 16);
    } else {
      bufs[t] = malloc(sizes[t] * sizeof(float));
    }
    memset(bufs[t], 0, sizes[t] * sizeof(float));
    snprintf(names[t], sizeof(names[t]), "resnet50/param%03d", t);
  }
  if (rank == 0) {
    printf("# hora-bench-resnet: %d ranks; ResNet-50 set: %d float32 tensors, %zu elements (%.1f MB)%s\n",
           size, ntensors, total, (double)total * 4 / 1e6,
           hora_mem ? "; buffers from hora_mem_alloc" : "");
  }
  if (soak_seconds > 0) {
    int ok = soak(soak_seconds);
    CHECK(hora_finalize());
    MPI_Finalize();
    return ok ? 0 : 1;
  }
  double *th = calloc((size_t)reps, sizeof(double)), *t1 = calloc((size_t)reps, sizeof(double)),
         *tn = calloc((size_t)reps, sizeof(double)), *tu = calloc((size_t)reps, sizeof(double));
  memset(flat, 0, total * sizeof(float));
  for (int w = 0; w < (warmup > 0 ? warmup : 1); w++) {
    hora_step(-1);
  }
  MPI_Allreduce(MPI_IN_PLACE, flat, (int)total, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  for (int t = ntensors - 1; t >= 0; t--) {
    MPI_Allreduce(MPI_IN_PLACE, bufs[t], (int)sizes[t], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  hora_step_unfused(-1);
  /* The floor: only with ordinary memory on one host (hora_mem blocks are
   * reduced with plain loads, no kernel copy at all). */
  int floor_runs = !hora_mem && size > 1 && one_host();
  if (floor_runs) {
    peer_bufs = calloc((size_t)size, sizeof(*peer_bufs));
    peer_pids = calloc((size_t)size, sizeof(*peer_pids));
    uintptr_t mine[MAX_TENSORS];
    for (int t = 0; t < ntensors; t++) {
      mine[t] = (uintptr_t)bufs[t];
    }
    pid_t me = getpid();
    MPI_Allgather(mine, MAX_TENSORS * (int)sizeof(uintptr_t), MPI_BYTE, peer_bufs,
                  MAX_TENSORS * (int)sizeof(uintptr_t), MPI_BYTE, MPI_COMM_WORLD);
    MPI_Allgather(&me, (int)sizeof(me), MPI_BYTE, peer_pids, (int)sizeof(me), MPI_BYTE,
                  MPI_COMM_WORLD);
    kernel_copy_floor(-1);
  }
  double *tf = calloc((size_t)reps, sizeof(double));
  hora_stats s0 = {.struct_size = sizeof(s0)}, s1 = {.struct_size = sizeof(s1)};
  double fused_in = 0;
  for (int r = 0; r < reps; r++) {
    hora_get_stats(&s0);
    th[r] = hora_step(r);
    hora_get_stats(&s1);
    /* Collectives: the fused batches and the tensors that ran alone. */
    uint64_t colls = (s1.fused_batches - s0.fused_batches) +
                     ((s1.allreduces - s0.allreduces) - (s1.fused_tensors - s0.fused_tensors));
    fused_in += (double)(s1.allreduces - s0.allreduces) / (double)(colls ? colls : 1);
    tu[r] = hora_step_unfused(r);
    tf[r] = floor_runs ? kernel_copy_floor(r) : 0;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, flat, (int)total, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    t1[r] = MPI_Wtime() - t0;
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int t = ntensors - 1; t >= 0; t--) {
      MPI_Allreduce(MPI_IN_PLACE, bufs[t], (int)sizes[t], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    tn[r] = MPI_Wtime() - t0;
  }
  double mh = median(th, reps), m1 = median(t1, reps), mn = median(tn, reps),
         mu = median(tu, reps);
  if (rank == 0) {
    printf("resnet50 set  hora (161 async, fused)      %9.2f ms   (%.1f tensors per collective)\n",
           mh * 1e3, fused_in / reps);
    printf("resnet50 set  hora x 161, each alone       %9.2f ms   unfused/fused = %.2fx\n",
           mu * 1e3, mu / mh);
    if (floor_runs) {
      double mf = median(tf, reps);
      printf("resnet50 set  floor: kernel copies alone   %9.2f ms   hora/floor = %.2fx (no runtime: "
             "process_vm_readv/writev of each rank's slices)\n", mf * 1e3, mh / mf);
    }
    printf("resnet50 set  MPI_Allreduce, one buffer    %9.2f ms   hora/MPI = %.2fx (target <= 1.25x)\n",
           m1 * 1e3, mh / m1);
    printf("resnet50 set  MPI_Allreduce x 161          %9.2f ms   MPI/hora = %.2fx (target >= 1.5x)\n",
           mn * 1e3, mn / mh);
  }

  /* Lone 8-byte allreduce latency. */
  double v = 1, out = 0;
  double *lh = calloc((size_t)reps, sizeof(double)), *lm = calloc((size_t)reps, sizeof(double));
  for (int r = 0; r < reps; r++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < lat_iters; i++) {
      CHECK(hora_allreduce("lat", &v, &out, 1, HORA_FLOAT64, HORA_SUM));
    }
    lh[r] = (MPI_Wtime() - t0) / lat_iters;
    if (out != size) {
      fprintf(stderr, "rank %d: 8-byte allreduce gave %g\n", rank, out);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int i = 0; i < lat_iters; i++) {
      MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    }
    lm[r] = (MPI_Wtime() - t0) / lat_iters;
  }
  double mlh = median(lh, reps), mlm = median(lm, reps);
  if (rank == 0) {
    printf("8-byte allreduce  hora  %8.2f us   MPI_Allreduce %8.2f us   hora/MPI = %.2fx\n",
           mlh * 1e6, mlm * 1e6, mlh / mlm);
  }
  if (size > 1 && one_host()) {
    double fl = sleeping_latency_floor(lat_iters, reps);
    if (rank == 0 && fl > 0) {
      printf("8-byte floor without spinning  %8.2f us   hora/floor = %.2fx (no runtime: recursive "
             "doubling over Unix sockets, blocking reads)\n", fl * 1e6, mlh / fl);
    }
  }

  if (steady > 0) {
    long rss_warm = 0, priv_warm = 0, heap_warm = 0;
    for (long s = 0; s < steady; s++) {
      hora_step((int)(s % 1000));
      if (s == 0 || s == 100) {
        rss_warm = rss_kib();
        priv_warm = rss_warm - shmem_kib();
        heap_warm = heap_bytes();
      }
      if (rank == 0 && (s % (steady / 10 > 0 ? steady / 10 : 1) == 0 || s == steady - 1)) {
        long rss = rss_kib();
        printf("steady step %7ld  RSS %ld KiB (after warm-up %ld), not shared memory %ld KiB "
               "(after warm-up %ld)  heap in use %ld bytes (after warm-up %ld)\n",
               s, rss, rss_warm, rss - shmem_kib(), priv_warm, heap_bytes(), heap_warm);
        fflush(stdout);
      }
    }
    long rss = rss_kib();
    long growth[3] = {rss - rss_warm, rss - shmem_kib() - priv_warm, heap_bytes() - heap_warm},
         worst[3];
    MPI_Allreduce(growth, worst, 3, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
      printf("steady state: %ld steps; growth after warm-up, worst rank: RSS %ld KiB, RSS outside "
             "shared memory %ld KiB, heap in use %ld bytes\n",
             steady, worst[0], worst[1], worst[2]);
    }
  }
  CHECK(hora_finalize());
  MPI_Finalize();
  return 0;
}
