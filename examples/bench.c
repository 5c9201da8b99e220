/* hora-bench: collective bandwidth and latency, in the style of nccl-tests,
 * side by side with MPI's own collective in the same run.
 *
 * For each size it prints the median time over --reps repetitions (each the
 * mean of --iters back-to-back operations, timed to the last rank's finish), algbw = bytes / time and busbw,
 * which corrects algbw for what the algorithm must move per rank:
 *   allreduce  busbw = algbw * 2(n-1)/n
 *   allgather  busbw = algbw * (n-1)/n     (bytes = the whole gathered buffer)
 *   broadcast  busbw = algbw
 *   reducescatter  busbw = algbw * (n-1)/n  (bytes = each rank's whole input)
 *   alltoall   busbw = algbw * (n-1)/n     (bytes = each rank's whole input, split equally)
 *   allgatherv busbw = algbw * (n-1)/n     (bytes = the whole gathered buffer; rank r
 *                                           sends a share growing with r, 2(r+1)/(n+1))
 * then the same for MPI_Allreduce / MPI_Allgather / MPI_Bcast /
 * MPI_Reduce_scatter / MPI_Alltoallv / MPI_Allgatherv (the equal split,
 * where it has one), and the ratio
 * of the two busbw. Results are checked after every timed repetition.
 *
 *   mpirun -np 2 hora-bench -b 1M -e 256M -f 2 -o allreduce
 *
 * With --csv FILE ('-': stdout, the tables then going to stderr) rank 0
 * also writes one row per op, size and implementation (hora, MPI or NCCL):
 *   op,bytes,count,ranks,impl,time_us,algbw_gbps,busbw_gbps,errors
 * for scripts/plot-bench.py to draw.
 *
 * With --hora-mem the buffers come from hora_mem_alloc, and MPI's
 * collectives use the same buffers.
 *
 * With --device cuda (CUDA builds) the buffers are device memory and the
 * peer printed beside hora is a plain loop of ncclAllReduce / ncclBroadcast
 * / ncclAllGather / ncclReduceScatter (alltoall: grouped ncclSend/ncclRecv;
 * allgatherv: grouped ncclBroadcast) on the same buffers (NCCL builds; MPI is not CUDA-aware
 * here). NCCL refuses two ranks on one GPU, so where ranks share a GPU the
 * NCCL columns read "-" and a comment line says why.
 *
 * With --floor (alltoall, host buffers, every rank on one host) each size
 * also times what no runtime can undercut there: each rank copies its own
 * block and reads its block from every peer's sendbuf with
 * process_vm_readv, between two MPI barriers.
 */
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "config.h"
#include "hora.h"
#include "bench_common.h"
#if HORA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#if HORA_HAVE_NCCL
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes" /* nccl.h declares f(); */
#include <nccl.h>
#pragma GCC diagnostic pop
#endif

enum coll { ALLREDUCE, BROADCAST, ALLGATHER, REDUCESCATTER, ALLTOALL, ALLGATHERV, NCOLLS };
static const char *const coll_names[] = {"allreduce",     "broadcast", "allgather",
                                         "reducescatter", "alltoall",  "allgatherv"};

static int rank, size;

/* allgatherv: each rank's count and its block's offset, for n elements in all. */
static size_t *v_counts, *v_offsets;
static int *v_icounts, *v_idispls; /* the same for MPI */

static void allgatherv_split(size_t n) {
  size_t base = n / (size_t)size, at = 0;
  for (int r = 0; r < size; r++) {
    v_counts[r] = base * 2 * (size_t)(r + 1) / (size_t)(size + 1);
    v_offsets[r] = at;
    v_icounts[r] = (int)v_counts[r];
    v_idispls[r] = (int)at;
    at += v_counts[r];
  }
}

static void fail(const char *what) {
  fprintf(stderr, "rank %d: %s: %s\n", rank, what, hora_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Values that stay exact in float32 whatever the rank count. */
static void fill(float *buf, size_t n, int salt) {
  for (size_t i = 0; i < n; i++) {
    buf[i] = (float)((rank + salt + (int)(i % 61)) % 64);
  }
}

static size_t check(enum coll c, const float *buf, size_t n, int salt, int root) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i += 1 + n / 4096) {
    float want;
    if (c == ALLREDUCE || c == REDUCESCATTER) {
      /* A reducescatter's output is this rank's block of the sum. */
      size_t g = c == REDUCESCATTER ? (size_t)rank * n + i : i;
      want = 0;
      for (int r = 0; r < size; r++) {
        want += (float)((r + salt + (int)(g % 61)) % 64);
      }
    } else if (c == BROADCAST) {
      want = (float)((root + salt + (int)(i % 61)) % 64);
    } else if (c == ALLTOALL) {
      /* Block j came from rank j: its elements for this rank. */
      size_t per = n / (size_t)size;
      int j = (int)(i / per);
      size_t at = (size_t)rank * per + i % per;
      want = (float)((j + salt + (int)(at % 61)) % 64);
    } else if (c == ALLGATHERV) {
      int r = 0;
      while (r + 1 < size && i >= v_offsets[r + 1]) {
        r++;
      }
      want = (float)((r + salt + (int)((i - v_offsets[r]) % 61)) % 64);
    } else {
      size_t per = n / (size_t)size;
      int r = (int)(i / per);
      want = (float)((r + salt + (int)((i % per) % 61)) % 64);
    }
    bad += buf[i] != want;
  }
  return bad;
}

/* ---- --device cuda ---------------------------------------------------------- */
static int on_device; /* buf and out are device memory; hbuf mirrors them */
static float *hbuf;

#if HORA_HAVE_CUDA
static void cuda_ok(cudaError_t e, const char *what) {
  if (e != cudaSuccess) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, what, cudaGetErrorString(e));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}
#endif

/* fill() and check() work on host memory; these move it to and from the
 * device buffers. */
static void to_device(float *dst, size_t n) {
#if HORA_HAVE_CUDA
  if (on_device) {
    cuda_ok(cudaMemcpy(dst, hbuf, n * 4, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
#else
  (void)dst, (void)n;
#endif
}

static const float *from_device(const float *src, size_t n) {
#if HORA_HAVE_CUDA
  if (on_device) {
    cuda_ok(cudaMemcpy(hbuf, src, n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return hbuf;
  }
#else
  (void)n;
#endif
  return src;
}

static void device_sync(void) {
#if HORA_HAVE_CUDA
  if (on_device) {
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
#endif
}

#if HORA_HAVE_NCCL
static ncclComm_t nccl_comm;
static cudaStream_t nccl_stream;

static void nccl_ok(ncclResult_t r, const char *what) {
  if (r != ncclSuccess) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, what, ncclGetErrorString(r));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}
#endif

#if HORA_HAVE_CUDA
/* Sets *why and returns 0 where the NCCL peer cannot run. */
static int nccl_setup(char *why, size_t len) {
#if HORA_HAVE_NCCL
  struct {
    char host[MPI_MAX_PROCESSOR_NAME];
    char bus[32];
  } me, *all = calloc((size_t)size, sizeof(me));
  int hl = 0, dev = 0;
  memset(&me, 0, sizeof(me));
  MPI_Get_processor_name(me.host, &hl);
  cuda_ok(cudaGetDevice(&dev), "cudaGetDevice");
  cuda_ok(cudaDeviceGetPCIBusId(me.bus, (int)sizeof(me.bus), dev), "cudaDeviceGetPCIBusId");
  MPI_Allgather(&me, (int)sizeof(me), MPI_BYTE, all, (int)sizeof(me), MPI_BYTE, MPI_COMM_WORLD);
  for (int a = 0; a < size; a++) {
    for (int b = a + 1; b < size; b++) {
      if (!strcmp(all[a].host, all[b].host) && !strcmp(all[a].bus, all[b].bus)) {
        snprintf(why, len, "ranks %d and %d share GPU %s on %s, which NCCL refuses", a, b,
                 all[a].bus, all[a].host);
        free(all);
        return 0;
      }
    }
  }
  free(all);
  ncclUniqueId id;
  if (rank == 0) {
    nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
  }
  MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  nccl_ok(ncclCommInitRank(&nccl_comm, size, id, rank), "ncclCommInitRank");
  cuda_ok(cudaStreamCreateWithFlags(&nccl_stream, cudaStreamNonBlocking), "cudaStreamCreate");
  return 1;
#else
  snprintf(why, len, "this build has no NCCL");
  return 0;
#endif
}
#endif

/* Seconds since t0 on the rank that finished last: a broadcast's root is
 * done long before the last rank of a pipeline has its data. */
static double slowest_since(double t0) {
  double t = MPI_Wtime() - t0;
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

static double run_nccl(enum coll c, float *buf, float *out, size_t n, int iters) {
#if HORA_HAVE_NCCL
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int i = 0; i < iters; i++) {
    if (c == ALLREDUCE) {
      nccl_ok(ncclAllReduce(buf, out, n, ncclFloat, ncclSum, nccl_comm, nccl_stream), "ncclAllReduce");
    } else if (c == BROADCAST) {
      nccl_ok(ncclBroadcast(buf, buf, n, ncclFloat, 0, nccl_comm, nccl_stream), "ncclBroadcast");
    } else if (c == REDUCESCATTER) {
      nccl_ok(ncclReduceScatter(buf, out, n / (size_t)size, ncclFloat, ncclSum, nccl_comm,
                                nccl_stream), "ncclReduceScatter");
    } else if (c == ALLTOALL || c == ALLGATHERV) {
      /* What a plain NCCL program writes: one group of sends and receives,
       * or of broadcasts from every rank. */
      size_t per = n / (size_t)size;
      nccl_ok(ncclGroupStart(), "ncclGroupStart");
      for (int q = 0; q < size; q++) {
        if (c == ALLTOALL) {
          nccl_ok(ncclSend(buf + (size_t)q * per, per, ncclFloat, q, nccl_comm, nccl_stream),
                  "ncclSend");
          nccl_ok(ncclRecv(out + (size_t)q * per, per, ncclFloat, q, nccl_comm, nccl_stream),
                  "ncclRecv");
        } else if (v_counts[q]) {
          nccl_ok(ncclBroadcast(q == rank ? buf : out + v_offsets[q], out + v_offsets[q],
                                v_counts[q], ncclFloat, q, nccl_comm, nccl_stream),
                  "ncclBroadcast");
        }
      }
      nccl_ok(ncclGroupEnd(), "ncclGroupEnd");
    } else {
      nccl_ok(ncclAllGather(buf, out, n / (size_t)size, ncclFloat, nccl_comm, nccl_stream),
              "ncclAllGather");
    }
  }
  cuda_ok(cudaStreamSynchronize(nccl_stream), "cudaStreamSynchronize");
  return slowest_since(t0) / iters;
#else
  (void)c, (void)buf, (void)out, (void)n, (void)iters;
  return 0;
#endif
}

static double run_hora(enum coll c, float *buf, float *out, size_t n, int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int i = 0; i < iters; i++) {
    int rc;
    if (c == ALLREDUCE) {
      rc = hora_allreduce("bench", buf, out, n, HORA_FLOAT32, HORA_SUM);
    } else if (c == BROADCAST) {
      rc = hora_broadcast("bench", buf, n, HORA_FLOAT32, 0);
    } else if (c == REDUCESCATTER) {
      rc = hora_reducescatter("bench", buf, out, n, HORA_FLOAT32, HORA_SUM);
    } else if (c == ALLTOALL) {
      hora_request *r = NULL;
      rc = hora_alltoall_async_ex("bench", buf, n, NULL, out, NULL, HORA_FLOAT32, NULL, &r);
      rc = rc == HORA_SUCCESS ? hora_wait(&r) : rc;
    } else if (c == ALLGATHERV) {
      rc = hora_allgatherv("bench", buf, v_counts[rank], HORA_FLOAT32, out, v_counts, NULL);
    } else {
      rc = hora_allgather("bench", buf, n / (size_t)size, HORA_FLOAT32, out);
    }
    if (rc != HORA_SUCCESS) {
      fail(coll_names[c]);
    }
  }
  device_sync();
  return slowest_since(t0) / iters;
}

/* The kernel-copy floor of an equal-split alltoall on one host. */
static pid_t *floor_pids;
static uint64_t *floor_bases;

static int floor_setup(const float *buf) {
  MPI_Comm local;
  int n = 0;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  MPI_Comm_size(local, &n);
  MPI_Comm_free(&local);
  floor_pids = calloc((size_t)size, sizeof(pid_t));
  floor_bases = calloc((size_t)size, sizeof(uint64_t));
  if (n != size || !floor_pids || !floor_bases) {
    return 0;
  }
  pid_t me = getpid();
  uint64_t base = (uint64_t)(uintptr_t)buf;
  MPI_Allgather(&me, (int)sizeof(me), MPI_BYTE, floor_pids, (int)sizeof(me), MPI_BYTE,
                MPI_COMM_WORLD);
  MPI_Allgather(&base, 1, MPI_UINT64_T, floor_bases, 1, MPI_UINT64_T, MPI_COMM_WORLD);
  return 1;
}

static double run_floor(const float *buf, float *out, size_t n, int iters) {
  size_t per = n / (size_t)size * sizeof(float);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int i = 0; i < iters; i++) {
    MPI_Barrier(MPI_COMM_WORLD);
    for (int k = 0; k < size; k++) {
      int j = (rank + k) % size;
      char *to = (char *)out + (size_t)j * per;
      if (j == rank) {
        memmove(to, (const char *)buf + (size_t)j * per, per);
        continue;
      }
      struct iovec l = {to, per};
      struct iovec r = {(void *)(uintptr_t)(floor_bases[j] + (uint64_t)rank * per), per};
      if (process_vm_readv(floor_pids[j], &l, 1, &r, 1, 0) != (ssize_t)per) {
        fail("process_vm_readv (the floor)");
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  return slowest_since(t0) / iters;
}

static double run_mpi(enum coll c, float *buf, float *out, size_t n, int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int i = 0; i < iters; i++) {
    if (c == ALLREDUCE) {
      MPI_Allreduce(buf, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (c == BROADCAST) {
      MPI_Bcast(buf, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
    } else if (c == REDUCESCATTER) {
      MPI_Reduce_scatter(buf, out, v_icounts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (c == ALLTOALL) {
      MPI_Alltoallv(buf, v_icounts, v_idispls, MPI_FLOAT, out, v_icounts, v_idispls, MPI_FLOAT,
                    MPI_COMM_WORLD);
    } else if (c == ALLGATHERV) {
      MPI_Allgatherv(buf, v_icounts[rank], MPI_FLOAT, out, v_icounts, v_idispls, MPI_FLOAT,
                     MPI_COMM_WORLD);
    } else {
      MPI_Allgather(buf, (int)(n / (size_t)size), MPI_FLOAT, out, (int)(n / (size_t)size),
                    MPI_FLOAT, MPI_COMM_WORLD);
    }
  }
  return slowest_since(t0) / iters;
}

/* Rank 0's mean per stage of the operations between two snapshots
 * (hora_stats: submit, hand-off to the coordinator, negotiation, the
 * collective, completion, the caller's wake-up). */
static void print_stages(const hora_stats *a, const hora_stats *b) {
  double n = (double)(b->staged_operations - a->staged_operations);
  if (n <= 0) {
    return;
  }
  double us = 1e6 / n;
  printf("# stages, us per operation: submit %.2f, handoff %.2f, negotiate %.2f, run %.2f, "
         "complete %.2f, wake %.2f; %.2f cycles per operation\n",
         (b->stage_submit_seconds - a->stage_submit_seconds) * us,
         (b->stage_handoff_seconds - a->stage_handoff_seconds) * us,
         (b->stage_negotiate_seconds - a->stage_negotiate_seconds) * us,
         (b->stage_run_seconds - a->stage_run_seconds) * us,
         (b->stage_complete_seconds - a->stage_complete_seconds) * us,
         (b->stage_wake_seconds - a->stage_wake_seconds) * us,
         (double)(b->cycles - a->cycles) / (double)(b->operations - a->operations));
}

static void usage(void) {
  fprintf(stderr,
          "usage: hora-bench [options]\n"
          "  -b SIZE   smallest message in bytes (default 8); K, M, G suffixes\n"
          "  -e SIZE   largest message in bytes (default 64M)\n"
          "  -f N      size multiplier between steps (default 4)\n"
          "  -o OP     allreduce | broadcast | allgather | reducescatter | alltoall |\n"
          "            allgatherv | all (default all)\n"
          "  -n N      operations per timed repetition (default: by size)\n"
          "  -r N      repetitions; the median is printed (default 5)\n"
          "  --no-mpi  do not run MPI's collectives beside hora's\n"
          "  --stages  after each size, where hora's time went (rank 0's mean per stage)\n"
          "  --floor   alltoall on one host: also the kernel-copy floor (no runtime)\n"
          "  --hora-mem  buffers from hora_mem_alloc (host-shared; MPI uses them too)\n"
          "  --device cpu|cuda  where the buffers live (default cpu); cuda: device memory,\n"
          "            with a plain NCCL loop on the same buffers beside hora (CUDA builds)\n"          "  --csv FILE  rank 0 also writes the results as CSV, one row per op, size and\n"
          "            implementation: op,bytes,count,ranks,impl,time_us,algbw_gbps,\n"
          "            busbw_gbps,errors ('-': to stdout, the tables to stderr)\n"
          "float32 data; allreduce sums; broadcast from rank 0.\n");
}

/* The host algorithm hora ran ("eager": inside the negotiation cycle), and
 * the cost model's prediction for the whole operation (hora_predict_operation:
 * the runtime's cost per operation, the negotiation cycle, the algorithm).
 * Where prediction and measurement differ by more than 25%, it says so. */
static void print_algorithm(enum coll c, size_t bytes, double measured) {
  const char *kind = c == ALLREDUCE ? "allreduce" : c == BROADCAST ? "broadcast"
                     : c == ALLGATHER ? "allgather" : c == REDUCESCATTER ? "reducescatter" : NULL;
  const char *name;
  double model;
  if (!on_device && kind &&
      hora_predict_operation(kind, c == ALLGATHER ? bytes / (size_t)size : bytes, &name,
                             &model) == HORA_SUCCESS) {
    double off = measured / model;
    printf(" | %12s %10.2f %s\n", name, model * 1e6,
           off > 1.25 || off < 0.8 ? (off > 1 ? "model low" : "model high") : "");
  } else {
    printf(" | %12s %10s\n", "-", "-");
  }
}

int main(int argc, char **argv) {
  size_t minb = 8, maxb = 64 << 20;
  double factor = 4;
  int reps = 5, fixed_iters = 0, with_mpi = 1, hora_mem = 0, stages = 0, floor = 0;
  int colls[NCOLLS] = {1, 1, 1, 1, 1, 1};
  const char *csv_path = NULL;
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
    } else if (!strcmp(a, "-o") && i + 1 < argc) {
      const char *o = argv[++i];
      int all = !strcmp(o, "all");
      for (int c = 0; c < NCOLLS; c++) {
        colls[c] = all || !strcmp(o, coll_names[c]);
      }
    } else if (!strcmp(a, "--no-mpi")) {
      with_mpi = 0;
    } else if (!strcmp(a, "--stages")) {
      stages = 1;
    } else if (!strcmp(a, "--floor")) {
      floor = 1;
    } else if (!strcmp(a, "--hora-mem")) {
      hora_mem = 1;
    } else if (!strcmp(a, "--csv") && i + 1 < argc) {
      csv_path = argv[++i];
    } else if (!strcmp(a, "--device") && i + 1 < argc) {
      const char *d = argv[++i];
      if (!strcmp(d, "cuda")) {
        on_device = 1;
      } else if (strcmp(d, "cpu")) {
        usage();
        return 2;
      }
    } else {
      usage();
      return a[0] == '-' && a[1] == 'h' ? 0 : 2;
    }
  }
  if (factor <= 1 || reps < 1 || minb < 4 || maxb < minb || (on_device && hora_mem)) {
    usage();
    return 2;
  }
#if !HORA_HAVE_CUDA
  if (on_device) {
    fprintf(stderr, "hora-bench: --device cuda: this build has no CUDA (configure found none)\n");
    return 2;
  }
#endif
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (hora_init() != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  rank = hora_rank();
  size = hora_size();
  size_t maxn = maxb / 4 + (size_t)size;
  v_counts = calloc(2 * (size_t)size, sizeof(size_t));
  v_offsets = v_counts ? v_counts + size : NULL;
  v_icounts = calloc(2 * (size_t)size, sizeof(int));
  v_idispls = v_icounts ? v_icounts + size : NULL;
  if (!v_counts || !v_icounts) {
    fprintf(stderr, "out of memory\n");
    return 1;
  }
  float *buf = NULL, *out = NULL;
  int with_peer = with_mpi;
  if (on_device) {
#if HORA_HAVE_CUDA
    char nccl_why[256] = "";
    int ndev = 0;
    cuda_ok(cudaGetDeviceCount(&ndev), "cudaGetDeviceCount");
    const char *g = getenv("HORA_GPU");
    int dev = g && atoi(g) >= 0 ? atoi(g) : hora_local_rank() % ndev;
    cuda_ok(cudaSetDevice(dev), "cudaSetDevice");
    cuda_ok(cudaMalloc((void **)&buf, maxn * 4), "cudaMalloc");
    cuda_ok(cudaMalloc((void **)&out, maxn * 4), "cudaMalloc");
    cuda_ok(cudaMemset(buf, 0, maxn * 4), "cudaMemset");
    cuda_ok(cudaMemset(out, 0, maxn * 4), "cudaMemset");
    hbuf = malloc(maxn * 4);
    if (!hbuf) {
      fprintf(stderr, "out of memory\n");
      return 1;
    }
    with_peer = with_mpi && nccl_setup(nccl_why, sizeof(nccl_why));
    if (rank == 0) {
      printf("# device buffers on GPU %d; peer: %s\n", dev,
             with_peer ? "plain NCCL loop on the same buffers" : "none");
      if (!with_peer && with_mpi) {
        printf("# NCCL peer not run: %s\n", nccl_why);
      }
    }
#endif
  } else if (hora_mem) {
    if (hora_mem_alloc(maxn * 4, (void **)&buf) != HORA_SUCCESS ||
        hora_mem_alloc(maxn * 4, (void **)&out) != HORA_SUCCESS) {
      fail("hora_mem_alloc");
    }
  } else {
    buf = malloc(maxn * 4);
    out = malloc(maxn * 4);
  }
  if (!buf || !out) {
    fprintf(stderr, "out of memory\n");
    return 1;
  }
  if (!on_device) {
    memset(buf, 0, maxn * 4);
    memset(out, 0, maxn * 4);
  }
  const char *peer = on_device ? "NCCL" : "MPI";
  FILE *csv = NULL;
  if (csv_path && rank == 0) {
    if (!strcmp(csv_path, "-")) {
      /* The CSV alone on stdout: the tables go to stderr. */
      int csv_fd = dup(STDOUT_FILENO);
      if (csv_fd < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0 || !(csv = fdopen(csv_fd, "w"))) {
        fail("--csv -: cannot set up stdout");
      }
    } else if (!(csv = fopen(csv_path, "w"))) {
      fprintf(stderr, "hora-bench: --csv: cannot create %s\n", csv_path);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    fprintf(csv, "op,bytes,count,ranks,impl,time_us,algbw_gbps,busbw_gbps,errors\n");
  }
  if (floor && (on_device || hora_mem || !colls[ALLTOALL] || !floor_setup(buf))) {
    if (rank == 0) {
      printf("# no floor: it needs -o alltoall, malloc'd host buffers and every rank on one host\n");
    }
    floor = 0;
  }
  double *th = calloc((size_t)reps, sizeof(double)), *tm = calloc((size_t)reps, sizeof(double));
  double *tf = calloc((size_t)reps, sizeof(double));
  long errors = 0;
  for (int c = 0; c < NCOLLS; c++) {
    if (!colls[c]) {
      continue;
    }
    double bus = c == ALLREDUCE ? 2.0 * (size - 1) / size : c == BROADCAST ? 1.0
                                                                          : (double)(size - 1) / size;
    if (rank == 0) {
      char pus[16], ratio[16];
      snprintf(pus, sizeof(pus), "%s us", peer);
      snprintf(ratio, sizeof(ratio), "hora/%s", peer);
      printf("# %s, %d ranks, float32, median of %d repetitions%s\n", coll_names[c], size, reps,
             on_device ? ", device buffers" : hora_mem ? ", buffers from hora_mem_alloc" : "");
      printf("# %12s %10s | %10s %8s %8s | %10s %8s %8s | %7s %6s | %12s %10s\n", "bytes", "count",
             "hora us", "algbw", "busbw", pus, "algbw", "busbw", ratio, "errors", "algorithm",
             "model_us");
    }
    for (double bd = (double)minb; bd <= (double)maxb * 1.0001; bd *= factor) {
      size_t n = (size_t)bd / 4;
      if (c != ALLREDUCE && c != BROADCAST) {
        n = n / (size_t)size * (size_t)size;
      }
      if (c == ALLGATHERV) {
        allgatherv_split(n);
        n = v_offsets[size - 1] + v_counts[size - 1];
      } else {
        /* MPI's v-forms take counts: the equal split, per rank. */
        for (int q = 0; q < size; q++) {
          v_icounts[q] = (int)(n / (size_t)size);
          v_idispls[q] = q * v_icounts[q];
        }
      }
      if (n == 0) {
        continue;
      }
      size_t bytes = n * 4;
      int iters = fixed_iters ? fixed_iters
                              : (int)HORA_CLAMP_ITERS(bytes);
      size_t bad = 0;
      hora_stats s0 = {.struct_size = sizeof(s0)}, s1 = {.struct_size = sizeof(s1)};
      for (int r = 0; r < reps + 1; r++) { /* the first is a warm-up */
        size_t mine_n = c == ALLGATHER ? n / (size_t)size : c == ALLGATHERV ? v_counts[rank] : n;
        fill(on_device ? hbuf : buf, mine_n, r);
        to_device(buf, mine_n);
        /* At least 10 operations in the warm-up: HORA_SHM_SINGLE_COPY=auto
         * times its two intra-host paths on the first 8 or 9 of each size. */
        int warm = r == 0 && iters < 10 ? 10 : iters;
        if (r == 1) {
          hora_get_stats(&s0);
        }
        double t = run_hora((enum coll)c, buf, c == BROADCAST ? buf : out, n, warm);
        /* A single op with fresh data checks the result. */
        fill(on_device ? hbuf : buf, mine_n, r);
        to_device(buf, mine_n);
        run_hora((enum coll)c, buf, c == BROADCAST ? buf : out, n, 1);
        size_t out_n = c == REDUCESCATTER ? n / (size_t)size : n;
        bad += check((enum coll)c, from_device(c == BROADCAST ? buf : out, n), out_n, r, 0);
        double tmpi = !with_peer ? 0
                      : on_device ? run_nccl((enum coll)c, buf, out, n, iters)
                                  : run_mpi((enum coll)c, buf, out, n, iters);
        double tfl = floor && c == ALLTOALL ? run_floor(buf, out, n, iters) : 0;
        if (r > 0) {
          th[r - 1] = t;
          tm[r - 1] = tmpi;
          tf[r - 1] = tfl;
        }
      }
      hora_get_stats(&s1);
      if (stages && rank == 0) {
        print_stages(&s0, &s1);
      }
      long all_bad = 0, mine = (long)bad;
      MPI_Allreduce(&mine, &all_bad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
      errors += all_bad;
      double mh = median(th, reps), mm = with_peer ? median(tm, reps) : 0;
      double ah = (double)bytes / mh / 1e9, am = with_peer ? (double)bytes / mm / 1e9 : 0;
      if (rank == 0) {
        if (with_peer) {
          printf("  %12zu %10zu | %10.2f %8.3f %8.3f | %10.2f %8.3f %8.3f | %7.2fx %6ld", bytes, n,
                 mh * 1e6, ah, ah * bus, mm * 1e6, am, am * bus, ah / am, all_bad);
        } else {
          printf("  %12zu %10zu | %10.2f %8.3f %8.3f | %10s %8s %8s | %8s %6ld", bytes, n,
                 mh * 1e6, ah, ah * bus, "-", "-", "-", "-", all_bad);
        }
        print_algorithm((enum coll)c, bytes, mh);
        if (csv) {
          fprintf(csv, "%s,%zu,%zu,%d,hora,%.3f,%.6f,%.6f,%ld\n", coll_names[c], bytes, n, size,
                  mh * 1e6, ah, ah * bus, all_bad);
          if (with_peer) {
            fprintf(csv, "%s,%zu,%zu,%d,%s,%.3f,%.6f,%.6f,%ld\n", coll_names[c], bytes, n, size,
                    peer, mm * 1e6, am, am * bus, all_bad);
          }
          fflush(csv);
        }
        if (floor && c == ALLTOALL) {
          double mf = median(tf, reps);
          printf("#   floor: %.2f us (each block copied or read once, two MPI barriers); "
                 "hora/floor %.2fx%s", mf * 1e6, mf / mh, with_peer ? "" : "\n");
          if (with_peer) {
            printf(", MPI/floor %.2fx\n", mf / mm);
          }
        }
        fflush(stdout);
      }
    }
  }
  if (rank == 0) {
    printf("# %s: %ld wrong results\n", errors ? "FAILED" : "results checked", errors);
  }
  if (csv && fclose(csv) != 0) {
    fprintf(stderr, "hora-bench: --csv: write failed\n");
    errors++;
  }
  if (on_device) {
#if HORA_HAVE_CUDA
#if HORA_HAVE_NCCL
    if (with_peer) {
      ncclCommDestroy(nccl_comm);
      cudaStreamDestroy(nccl_stream);
    }
#endif
    cudaFree(buf);
    cudaFree(out);
    free(hbuf);
#endif
  } else if (hora_mem) {
    hora_mem_free(buf);
    hora_mem_free(out);
  } else {
    free(buf);
    free(out);
  }
  free(th);
  free(tm);
  free(tf);
  hora_finalize();
  MPI_Finalize();
  return errors ? 1 : 0;
}
