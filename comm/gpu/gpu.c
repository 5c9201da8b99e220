/* The device data plane (see gpu.h): CUDA runtime, NCCL when built with
 * it, and the staged path through pinned host memory. */
#include "comm/gpu/gpu.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/gpu/gpu_private.h"

/* ---- caller-thread helpers ------------------------------------------------- */

static pthread_once_t present_once = PTHREAD_ONCE_INIT;
static bool present;

static void probe_devices(void) {
  int n = 0;
  present = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError(); /* no driver, no device: not an error here */
}

bool hora__gpu_present(void) {
  pthread_once(&present_once, probe_devices);
  return present;
}

int hora__gpu_is_device(const void *p, bool *device) {
  *device = false;
  if (!p || !hora__gpu_present()) {
    return HORA_SUCCESS;
  }
  struct cudaPointerAttributes a;
  cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* memory CUDA never saw: host */
    return HORA_SUCCESS;
  }
  *device = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  return HORA_SUCCESS;
}

int hora__gpu_event_create(void **event) {
  cudaEvent_t ev;
  CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventBlockingSync));
  *event = ev;
  return HORA_SUCCESS;
}

int hora__gpu_record_event(void *stream, void **event) {
  HORA_CHECK(hora__gpu_event_create(event));
  cudaError_t e = cudaEventRecord((cudaEvent_t)*event, (cudaStream_t)stream);
  if (e != cudaSuccess) {
    cudaEventDestroy((cudaEvent_t)*event);
    *event = NULL;
    return hora__error(HORA_ERR_SYSTEM, "cudaEventRecord on the caller's stream: %s",
                       cudaGetErrorString(e));
  }
  return HORA_SUCCESS;
}

int hora__gpu_stream_wait_event(void *stream, void *event) {
  CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0));
  return HORA_SUCCESS;
}

int hora__gpu_event_query(void *event, bool *happened) {
  cudaError_t e = cudaEventQuery((cudaEvent_t)event);
  *happened = e == cudaSuccess;
  if (e != cudaSuccess && e != cudaErrorNotReady) {
    return hora__error(HORA_ERR_SYSTEM, "cudaEventQuery: %s", cudaGetErrorString(e));
  }
  return HORA_SUCCESS;
}

void hora__gpu_event_destroy(void *event) {
  if (event) {
    cudaEventDestroy((cudaEvent_t)event);
  }
}

/* ---- coordinator state -------------------------------------------------------- */


const char *hora__gpu_path(const struct hora__gpu *g) {
  return g ? (g->use_nccl ? "nccl" : "staged") : NULL;
}

static int grow_device(void **p, size_t *have, size_t need) {
  if (*have >= need) {
    return HORA_SUCCESS;
  }
  if (*p) {
    cudaFree(*p);
    *p = NULL;
    *have = 0;
  }
  CUDA_CHECK(cudaMalloc(p, need));
  *have = need;
  return HORA_SUCCESS;
}

int hora__gpu_grow_stage(hora__comm *c, struct hora__gpu *g, size_t need) {
  if (g->stage_bytes >= need) {
    return HORA_SUCCESS;
  }
  if (g->stage) {
    HORA_CHECK(hora__gpu_wait_stream(c, g)); /* queued copies may still use it */
    hora__comm_deregister(c, &g->stage_reg);
    cudaFreeHost(g->stage);
    g->stage = g->stage_dev = NULL;
    g->stage_bytes = 0;
  }
  CUDA_CHECK(cudaHostAlloc(&g->stage, need, cudaHostAllocMapped | cudaHostAllocPortable));
  CUDA_CHECK(cudaHostGetDevicePointer(&g->stage_dev, g->stage, 0));
  g->stage_bytes = need;
  hora__comm_register(c, g->stage, need, &g->stage_reg);
  return HORA_SUCCESS;
}

/* The device fusion buffer, in whole 2 MiB pages (what a dma-buf exports). */
int hora__gpu_grow_fusion(hora__comm *c, struct hora__gpu *g, size_t need) {
  if (g->fusion_bytes >= need) {
    return HORA_SUCCESS;
  }
  if (g->fusion) {
    HORA_CHECK(hora__gpu_wait_stream(c, g)); /* queued copies and NCCL may still use it */
  }
  hora__comm_deregister(c, &g->fusion_reg);
  g->direct = 0;
  size_t page = (size_t)2 << 20;
  return grow_device(&g->fusion, &g->fusion_bytes, (need + page - 1) / page * page);
}

static int alloc_descs(struct hora__gpu *g, int cap) {
  CUDA_CHECK(cudaHostAlloc((void **)&g->descs, (size_t)cap * sizeof(*g->descs),
                           cudaHostAllocMapped | cudaHostAllocPortable));
  CUDA_CHECK(cudaHostGetDevicePointer((void **)&g->descs_dev, g->descs, 0));
  g->descs_cap = cap;
  g->descs_used = 0;
  return HORA_SUCCESS;
}

/* n free descriptors at g->descs + g->descs_used. Waits for the stream only
 * when the ring wraps around. */
int hora__gpu_take_descs(hora__comm *c, struct hora__gpu *g, int n) {
  if (g->descs_used + n <= g->descs_cap) {
    return HORA_SUCCESS;
  }
  HORA_CHECK(hora__gpu_wait_stream(c, g));
  if (n > g->descs_cap) {
    cudaFreeHost(g->descs);
    g->descs = g->descs_dev = NULL;
    return alloc_descs(g, n > 4096 ? n : 4096);
  }
  g->descs_used = 0;
  return HORA_SUCCESS;
}

#if HORA_HAVE_NCCL
/* NCCL's asynchronous error, if any; aborts the communicator then. */
static int nccl_health(struct hora__gpu *g) {
  if (!g->nccl) {
    return HORA_SUCCESS;
  }
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(g->nccl, &async);
  if (async == ncclSuccess || async == ncclInProgress) {
    return HORA_SUCCESS;
  }
  char msg[512];
  snprintf(msg, sizeof(msg), "%s", ncclGetLastError(g->nccl));
  ncclCommAbort(g->nccl);
  g->nccl = NULL;
  return hora__error(HORA_ERR_SYSTEM, "NCCL: %s: %s", ncclGetErrorString(async), msg);
}
#endif

int hora__gpu_check(struct hora__gpu *g) {
#if HORA_HAVE_NCCL
  if (g) {
    return nccl_health(g);
  }
#else
  (void)g;
#endif
  return HORA_SUCCESS;
}

void hora__gpu_abort(struct hora__gpu *g) {
#if HORA_HAVE_NCCL
  if (g && g->nccl) {
    ncclCommAbort(g->nccl);
    g->nccl = NULL;
  }
#else
  (void)g;
#endif
}

/* Sleeps until ev has happened. Reads control traffic meanwhile (a lost
 * peer, an abort) and NCCL's asynchronous errors, and gives up after the
 * stall shutdown time. */
int hora__gpu_wait_event(hora__comm *c, struct hora__gpu *g, cudaEvent_t ev) {
  uint64_t start = hora__now_ns();
  long sleep_ns = 2000;
  for (;;) {
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) {
      return HORA_SUCCESS;
    }
    if (e != cudaErrorNotReady) {
      return hora__error(HORA_ERR_SYSTEM, "device collective failed: %s", cudaGetErrorString(e));
    }
    HORA_CHECK(hora__gpu_check(g));
    uint64_t now = hora__now_ns();
    if (c->net->stall_ns && now - start > c->net->stall_ns) {
      hora__gpu_abort(g);
      return hora__error(HORA_ERR_TIMEOUT,
                         "a device collective made no progress for %.0f s "
                         "(HORA_STALL_SHUTDOWN_TIME_SECONDS)",
                         (double)c->net->stall_ns * 1e-9);
    }
    if (c->net->service && now >= c->net->service_due_ns) {
      int rc = hora__service_run(c->net);
      if (rc != HORA_SUCCESS) {
        hora__gpu_abort(g);
        return rc;
      }
    }
    /* Sleep, lengthening up to 100 us: the coordinator never spins here. */
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
    sleep_ns = sleep_ns < 100000 ? sleep_ns * 2 : 100000;
  }
}

/* Sleeps until the runtime stream has done everything queued so far. */
int hora__gpu_wait_stream(hora__comm *c, struct hora__gpu *g) {
  CUDA_CHECK(cudaEventRecord(g->finished, g->stream));
  return hora__gpu_wait_event(c, g, g->finished);
}

/* Marks the end of a copy out of the staging or the fusion buffer. */
int hora__gpu_copied_out(struct hora__gpu *g) {
  CUDA_CHECK(cudaEventRecord(g->unpacked, g->stream));
  return HORA_SUCCESS;
}

/* What every rank says about itself when the path is chosen. */
struct gpu_card {
  int32_t host_index;
  int32_t want_nccl;
  uint64_t device_id; /* hash of the PCI bus id */
  int32_t rc;         /* of this rank's own set-up */
  int32_t pad;
};

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) {
    h = (h ^ (uint8_t)*s) * 1099511628211ull;
  }
  return h;
}

/* This process's part of the set-up: device, stream, events, descriptors. */
static int gpu_local(hora__comm *c, struct hora__gpu *g, char *bus, size_t bus_len) {
  int count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&count));
  if (count <= 0) {
    return hora__error(HORA_ERR_NOT_SUPPORTED, "this process sees no GPU");
  }
  g->device = hora__params.GPU >= 0 ? (int)hora__params.GPU : c->device_local_rank % count;
  if (g->device >= count) {
    return hora__error(HORA_ERR_INVALID_ARG, "HORA_GPU=%d, but this process sees %d GPU(s)",
                       g->device, count);
  }
  CUDA_CHECK(cudaSetDevice(g->device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&g->finished, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&g->unpacked, cudaEventDisableTiming));
  HORA_CHECK(alloc_descs(g, 4096));
  CUDA_CHECK(cudaDeviceGetPCIBusId(bus, (int)bus_len, g->device));
  return HORA_SUCCESS;
}

/* Every rank calls this together. Each step that can fail on one rank is
 * followed by an exchange the others wait in anyway, so that a failure on
 * one rank fails the set-up on all instead of leaving them waiting. */
static int gpu_open(hora__comm *c, struct hora__gpu **out) {
  struct hora__gpu *g = calloc(1, sizeof(*g));
  if (!g) {
    return hora__error(HORA_ERR_NO_MEMORY, "GPU state");
  }
  *out = g;
  char bus[64] = "", why[1024] = "";
  int local = gpu_local(c, g, bus, sizeof(bus));
  if (local != HORA_SUCCESS) {
    hora__strlcpy(why, hora__error_message(), sizeof(why));
  }

  /* One decision for the whole job: NCCL only if every rank can, and no
   * two ranks of a host drive the same GPU. */
  bool want = HORA_HAVE_NCCL && strcmp(hora__params.GPU_TRANSPORT, "host") != 0;
  struct gpu_card mine = {c->net->peers[c->rank].host_index, want, hash_str(bus), local, 0};
  struct gpu_card *all = calloc((size_t)c->size, sizeof(*all));
  if (!all) {
    return hora__error(HORA_ERR_NO_MEMORY, "GPU cards");
  }
  int rc = hora__allgather(c, &mine, sizeof(mine), all);
  bool every = true, shared = false;
  int failed = -1, failed_rc = HORA_SUCCESS;
  for (int r = 0; rc == HORA_SUCCESS && r < c->size; r++) {
    every = every && all[r].want_nccl;
    if (all[r].rc != HORA_SUCCESS && failed < 0) {
      failed = r;
      failed_rc = all[r].rc;
    }
    for (int q = 0; q < r; q++) {
      shared = shared || (all[q].host_index == all[r].host_index &&
                          all[q].device_id == all[r].device_id);
    }
  }
  free(all);
  HORA_CHECK(rc);
  if (local != HORA_SUCCESS) {
    return hora__error(local, "setting up the GPU: %s", why);
  }
  if (failed >= 0) {
    return hora__error(failed_rc, "rank %d could not set up its GPU (its own error says why)",
                       failed);
  }
  g->use_nccl = every && !shared;
  if (!g->use_nccl && strcmp(hora__params.GPU_TRANSPORT, "nccl") == 0) {
    return hora__error(HORA_ERR_NOT_SUPPORTED,
                       "HORA_GPU_TRANSPORT=nccl, but %s",
                       !HORA_HAVE_NCCL ? "this build has no NCCL"
                       : shared        ? "two ranks of one host share a GPU, which NCCL forbids"
                                       : "not every rank can use NCCL");
  }
#if HORA_HAVE_NCCL
  if (g->use_nccl) {
    /* The unique id travels over the host data plane, from rank 0, with
     * rank 0's result: the others must not wait in NCCL for it. */
    struct {
      ncclUniqueId id;
      int32_t rc;
    } root;
    memset(&root, 0, sizeof(root));
    if (c->rank == 0) {
      ncclResult_t nr = ncclGetUniqueId(&root.id);
      if (nr != ncclSuccess) {
        root.rc = HORA_ERR_SYSTEM;
        snprintf(why, sizeof(why), "ncclGetUniqueId: %s", ncclGetErrorString(nr));
      }
    }
    struct hora__iov v = {&root, sizeof(root)};
    struct hora__coll_opts none = {.prescale = 1, .postscale = 1};
    HORA_CHECK(hora__broadcast(c, &v, 1, sizeof(root), 0, &none));
    if (root.rc != HORA_SUCCESS) {
      return c->rank == 0 ? hora__error(root.rc, "%s", why)
                          : hora__error(root.rc, "ncclGetUniqueId failed on rank 0");
    }
    ncclResult_t nr = ncclCommInitRank(&g->nccl, c->size, root.id, c->rank);
    int32_t ok = nr == ncclSuccess;
    if (!ok) {
      g->nccl = NULL;
      snprintf(why, sizeof(why), "ncclCommInitRank: %s", ncclGetErrorString(nr));
    }
    /* Every rank has a communicator, or none keeps one. */
    struct hora__iov o = {&ok, sizeof(ok)};
    HORA_CHECK(hora__allreduce(c, &o, 1, &o, 1, 1, HORA_INT32, HORA_MIN, HORA_INT32, NULL));
    if (!ok) {
      if (g->nccl) {
        ncclCommAbort(g->nccl);
        g->nccl = NULL;
        return hora__error(HORA_ERR_SYSTEM, "ncclCommInitRank failed on another rank");
      }
      return hora__error(HORA_ERR_SYSTEM, "%s", why);
    }
  }
#endif
  HORA_INFO("GPU %d (%s): device collectives %s", g->device, bus,
            g->use_nccl ? "through NCCL" : "staged through host memory");
  return HORA_SUCCESS;
}

int hora__gpu_setup(hora__comm *c, struct hora__gpu **gpu) {
  return *gpu ? HORA_SUCCESS : gpu_open(c, gpu);
}

void hora__gpu_destroy(hora__comm *c, struct hora__gpu *g, bool failed) {
  if (!g) {
    return;
  }
  /* Registrations go before the memory they cover. */
  hora__comm_deregister(c, &g->fusion_reg);
  hora__comm_deregister(c, &g->stage_reg);
  if (failed) {
    /* Nothing here may wait for the GPU: NCCL is aborted, not destroyed
     * (ncclCommDestroy waits for operations that may need a lost peer),
     * and the memory stays allocated, since cudaFree waits for the device
     * too, and the runtime stream may still wait for a caller's stream.
     * The process is expected to exit after a fatal error. */
    hora__gpu_abort(g);
    if (g->stream) {
      cudaStreamDestroy(g->stream); /* returns at once; released when idle */
    }
  } else {
    if (g->stream) {
      cudaStreamSynchronize(g->stream);
    }
#if HORA_HAVE_NCCL
    if (g->nccl) {
      ncclCommDestroy(g->nccl);
    }
#endif
    if (g->stream) {
      cudaStreamDestroy(g->stream);
    }
    cudaFree(g->fusion);
    cudaFreeHost(g->stage);
    cudaFreeHost(g->descs);
  }
  if (g->finished) {
    cudaEventDestroy(g->finished);
  }
  if (g->unpacked) {
    cudaEventDestroy(g->unpacked);
  }
  free(g);
}

static int gpu_run_device(hora__comm *c, const struct hora__coll_op *op) {
  struct hora__gpu **gpu = &c->gpu;
  if (!hora__gpu_present()) {
    return hora__error(HORA_ERR_NOT_SUPPORTED, "a device buffer, but this process sees no GPU");
  }
  if (!*gpu) {
    HORA_CHECK(gpu_open(c, gpu));
  }
  struct hora__gpu *g = *gpu;
  bool reduces = op->kind == HORA_COLL_ALLREDUCE || op->kind == HORA_COLL_REDUCESCATTER;
  if (reduces && hora__gpu_elem_type(op->dtype) < 0) {
    return hora__error(HORA_ERR_INVALID_ARG, "device reduction of unknown dtype %d", op->dtype);
  }
  for (int i = 0; op->ready && i < op->n; i++) {
    if (op->ready[i]) {
      CUDA_CHECK(cudaStreamWaitEvent(g->stream, (cudaEvent_t)op->ready[i], 0));
    }
  }
  int rc;
#if HORA_HAVE_NCCL
  /* A reduction NCCL has no type or operation for (int16, Adasum) runs
   * staged: the host data plane stays connected beside NCCL, the staging is allocated on first use,
   * and the runtime stream orders it with the NCCL work. Every rank has
   * the same dtype and path, so all decide alike. */
  bool nccl = g->use_nccl && (!reduces || (hora__gpu_nccl_reduces(op->dtype) &&
                                           op->op != HORA_ADASUM));
  if (nccl && !g->nccl) {
    return hora__error(HORA_ERR_SYSTEM, "the NCCL communicator was aborted after an earlier error");
  }
  rc = nccl ? hora__gpu_nccl_run(c, g, op) : hora__gpu_staged_run(c, g, op);
#else
  rc = hora__gpu_staged_run(c, g, op);
#endif
  HORA_CHECK(rc);
  for (int i = 0; op->done && i < op->n; i++) {
    if (op->done[i]) {
      CUDA_CHECK(cudaEventRecord((cudaEvent_t)op->done[i], g->stream));
    }
  }
  return op->wait ? hora__gpu_wait_stream(c, g) : HORA_SUCCESS;
}

const struct hora__coll_backend hora__coll_gpu = {
    .name = "gpu",
    .run_device = gpu_run_device,
};

/* ---- the copy kernel's bandwidth -------------------------------------------------- */

int hora__gpu_copy_bandwidth(size_t bytes, int n, int reps, double *kernel_gbs, double *memcpy_gbs) {
  if (!hora__gpu_present()) {
    return hora__error(HORA_ERR_NOT_SUPPORTED, "no GPU");
  }
  struct hora__gpu g = {0};
  char *src = NULL, *dst = NULL;
  cudaEvent_t t0, t1;
  CUDA_CHECK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreate(&t0));
  CUDA_CHECK(cudaEventCreate(&t1));
  CUDA_CHECK(cudaMalloc((void **)&src, bytes * (size_t)n));
  CUDA_CHECK(cudaMalloc((void **)&dst, bytes * (size_t)n));
  CUDA_CHECK(cudaMemset(src, 1, bytes * (size_t)n));
  HORA_CHECK(alloc_descs(&g, n));
  for (int i = 0; i < n; i++) {
    g.descs[i] = (struct hora__copy_desc){src + (size_t)i * bytes, dst + (size_t)i * bytes, bytes};
  }
  float best_k = 1e30f, best_m = 1e30f, ms;
  for (int r = 0; r < reps; r++) {
    CUDA_CHECK(cudaEventRecord(t0, g.stream));
    CUDA_CHECK(hora__launch_batched_copy(g.descs_dev, n, bytes, g.stream));
    CUDA_CHECK(cudaEventRecord(t1, g.stream));
    CUDA_CHECK(cudaEventSynchronize(t1));
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    best_k = ms < best_k ? ms : best_k;
    CUDA_CHECK(cudaEventRecord(t0, g.stream));
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes * (size_t)n, cudaMemcpyDeviceToDevice, g.stream));
    CUDA_CHECK(cudaEventRecord(t1, g.stream));
    CUDA_CHECK(cudaEventSynchronize(t1));
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    best_m = ms < best_m ? ms : best_m;
  }
  /* Bandwidth as bytes read plus bytes written. */
  *kernel_gbs = 2.0 * (double)bytes * n / (best_k * 1e-3) / 1e9;
  *memcpy_gbs = 2.0 * (double)bytes * n / (best_m * 1e-3) / 1e9;
  cudaFree(src);
  cudaFree(dst);
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaFreeHost(g.descs);
  cudaStreamDestroy(g.stream);
  return HORA_SUCCESS;
}
