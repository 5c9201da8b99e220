/* Reducescatter, allgatherv and alltoall of device buffers: by NCCL
 * (ncclReduceScatter, grouped ncclBroadcast, grouped ncclSend/ncclRecv),
 * or staged through pinned host memory over the host collectives. A
 * joined rank's stand-in (buffers NULL) sends nothing and receives into
 * the device fusion buffer or the staging. */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "comm/coll/collectives.h"
#include "comm/gpu/gpu_private.h"

/* This rank's block of a reducescatter: explicit, or by the split rule. */
static void my_block(const hora__comm *c, const struct hora__coll_op *op, size_t *start,
                     size_t *len) {
  if (op->unit == 0) {
    *start = op->block_start;
    *len = op->block_len;
  } else {
    hora__block_range(op->count, op->unit, c->size, c->rank, start, len);
  }
}

/* Byte offsets of each rank's block in a buffer of blocks in rank order
 * (p of them); NULL on no memory. */
static size_t *block_offsets(const size_t *bytes, int p) {
  size_t *at = hora__malloc((size_t)(p > 0 ? p : 1) * sizeof(size_t));
  for (size_t j = 0, total = 0; at && j < (size_t)p; total += bytes[j], j++) {
    at[j] = total;
  }
  return at;
}

static size_t sum(const size_t *v, int p) {
  size_t t = 0;
  for (int j = 0; j < p; j++) {
    t += v[j];
  }
  return t;
}

/* What this rank sends: its block (allgatherv), or all its blocks. */
static size_t bytes_sent(const hora__comm *c, const struct hora__coll_op *op) {
  return op->kind == HORA_COLL_ALLGATHERV ? op->send_bytes[c->rank] : sum(op->send_bytes, c->size);
}

/* ---- NCCL ---------------------------------------------------------------------------- */

#if HORA_HAVE_NCCL
int hora__gpu_nccl_reducescatter(hora__comm *c, struct hora__gpu *g,
                                 const struct hora__coll_op *op) {
  const struct hora__coll_opts *o = op->opts;
  size_t es = hora_dtype_size(op->dtype), bytes = op->count * es, start, len;
  my_block(c, op, &start, &len);
  /* Equal blocks (the split divides evenly): NCCL's reduce-scatter, into
   * the caller's recvbuf. Otherwise an allreduce of which this rank keeps
   * its block. Every rank sees the same counts, so all pick alike. */
  bool equal = op->unit > 0 && (op->count / op->unit) % (size_t)c->size == 0;
  size_t scratch = bytes + (op->out[0].base ? 0 : len * es);
  HORA_CHECK(hora__gpu_grow_fusion(c, g, scratch ? scratch : 1));
  char *buf = g->fusion;
  const char *src = op->in[0].base, *out = op->out[0].base;
  /* NCCL's reduce-scatter runs in place only with recvbuf at this rank's
   * block of sendbuf; any other overlap goes through the fusion buffer. */
  bool overlap = src && out && len && src < out + len * es && out < src + bytes &&
                 out != src + start * es;
  if (!src || o->prescale != 1.0 || !equal || overlap) {
    hora__gpu_phase(op, "MEMCPY_IN_FUSION_BUFFER");
    HORA_CHECK(hora__gpu_pack(c, g, op->in, 1, buf, true)); /* a stand-in's zeros */
    HORA_CHECK(hora__gpu_scale(g, buf, op->count, op->dtype, o->prescale, 0));
    hora__gpu_phase(op, NULL);
    src = buf;
  }
  char *dst;
  if (equal) {
    dst = op->out[0].base ? (char *)op->out[0].base : buf + bytes;
    hora__gpu_phase(op, "NCCL_REDUCESCATTER");
    NCCL_CHECK(ncclReduceScatter(src, dst, len, hora__gpu_nccl_type(op->dtype),
                                 hora__gpu_nccl_op(op->dtype, op->op), g->nccl, g->stream));
  } else {
    dst = buf + start * es;
    hora__gpu_phase(op, "NCCL_ALLREDUCE");
    NCCL_CHECK(ncclAllReduce(buf, buf, op->count, hora__gpu_nccl_type(op->dtype),
                             hora__gpu_nccl_op(op->dtype, op->op), g->nccl, g->stream));
  }
  hora__gpu_phase(op, NULL);
  if (op->dtype == HORA_BOOL && len) {
    CUDA_CHECK(hora__launch_scale(dst, len, HORA__GPU_BOOL, 1.0, 1.0, g->stream));
  }
  HORA_CHECK(hora__gpu_scale(g, dst, len, op->dtype, o->postscale, o->divisor));
  if (!equal && op->out[0].base && len) {
    hora__gpu_phase(op, "MEMCPY_OUT_FUSION_BUFFER");
    CUDA_CHECK(cudaMemcpyAsync(op->out[0].base, dst, len * es, cudaMemcpyDeviceToDevice,
                               g->stream));
    hora__gpu_phase(op, NULL);
  }
  return HORA_SUCCESS;
}

/* The point-to-point part of an exchange, as one NCCL group: it is ended
 * on every path, or NCCL would keep the group open. */
static int nccl_group(hora__comm *c, struct hora__gpu *g, const struct hora__coll_op *op,
                      const char *src, char *dst, const size_t *sat, const size_t *rat) {
  int me = c->rank, p = c->size;
  ncclResult_t first = ncclSuccess;
  NCCL_CHECK(ncclGroupStart());
  if (op->kind == HORA_COLL_ALLGATHERV) {
    /* Every rank's block broadcast from it, roots in the same order on
     * every rank (NCCL matches a group's collectives by order; sendbuff is
     * read on the root only). */
    for (int root = 0; root < p && first == ncclSuccess; root++) {
      if (op->recv_bytes[root]) {
        first = ncclBroadcast(root == me ? src : dst + rat[root], dst + rat[root],
                              op->recv_bytes[root], ncclUint8, root, g->nccl, g->stream);
      }
    }
  }
  for (int k = 1; op->kind == HORA_COLL_ALLTOALL && k < p && first == ncclSuccess; k++) {
    int to = (me + k) % p, from = (me - k + p) % p;
    if (op->send_bytes[to]) {
      first = ncclSend(src + sat[to], op->send_bytes[to], ncclUint8, to, g->nccl, g->stream);
    }
    if (first == ncclSuccess && op->recv_bytes[from]) {
      first = ncclRecv(dst + rat[from], op->recv_bytes[from], ncclUint8, from, g->nccl,
                       g->stream);
    }
  }
  ncclResult_t end = ncclGroupEnd();
  NCCL_CHECK(first);
  NCCL_CHECK(end);
  return HORA_SUCCESS;
}

/* A device-to-device copy on the runtime stream. */
static int d2d(struct hora__gpu *g, void *dst, const void *src, size_t n) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, g->stream));
  return HORA_SUCCESS;
}

int hora__gpu_nccl_exchange(hora__comm *c, struct hora__gpu *g, const struct hora__coll_op *op) {
  int me = c->rank, p = c->size;
  bool alltoall = op->kind == HORA_COLL_ALLTOALL;
  size_t sent = bytes_sent(c, op), got = sum(op->recv_bytes, p);
  size_t *sat = block_offsets(op->send_bytes, alltoall ? p : 0);
  size_t *rat = block_offsets(op->recv_bytes, p);
  if (!sat || !rat) {
    free(sat);
    free(rat);
    return HORA_ERR_NO_MEMORY;
  }
  const char *src = op->in[0].base;
  char *dst = op->out[0].base;
  /* A stand-in receives into the fusion buffer; an alltoall whose buffers
   * overlap sends from a copy there (NCCL's transfers run concurrently). */
  bool overlap = alltoall && src && dst && sent && got && src < dst + got && dst < src + sent;
  int rc = HORA_SUCCESS;
  size_t scratch = (overlap ? sent : 0) + (dst ? 0 : got);
  if (scratch) {
    rc = hora__gpu_grow_fusion(c, g, scratch);
  }
  if (rc == HORA_SUCCESS && overlap) {
    rc = d2d(g, g->fusion, src, sent);
    src = g->fusion;
  }
  if (rc == HORA_SUCCESS && !dst) {
    dst = (char *)g->fusion + (overlap ? sent : 0);
  }
  if (rc == HORA_SUCCESS && alltoall && op->recv_bytes[me]) {
    rc = d2d(g, dst + rat[me], src + sat[me], op->recv_bytes[me]); /* its own block */
  }
  if (rc == HORA_SUCCESS) {
    bool equal = !alltoall;
    for (int j = 1; equal && j < p; j++) {
      equal = op->recv_bytes[j] == op->recv_bytes[0];
    }
    hora__gpu_phase(op, alltoall ? "NCCL_ALLTOALL" : "NCCL_ALLGATHER");
    if (equal && got) {
      ncclResult_t r = ncclAllGather(src ? src : dst + rat[me], dst, op->recv_bytes[0], ncclUint8,
                                     g->nccl, g->stream);
      rc = r == ncclSuccess ? HORA_SUCCESS
                            : hora__error(HORA_ERR_SYSTEM, "ncclAllGather: %s: %s",
                                          ncclGetErrorString(r), ncclGetLastError(g->nccl));
    } else if (!equal && p > 1) {
      rc = nccl_group(c, g, op, src, dst, sat, rat);
    } else if (!alltoall && op->recv_bytes[me]) {
      rc = d2d(g, dst + rat[me], src, op->recv_bytes[me]);
    }
    hora__gpu_phase(op, NULL);
  }
  free(sat);
  free(rat);
  return rc;
}
#endif

/* ---- staged through host memory ------------------------------------------------------- */

int hora__gpu_staged_reducescatter(hora__comm *c, struct hora__gpu *g,
                                   const struct hora__coll_op *op) {
  size_t es = hora_dtype_size(op->dtype), bytes = op->count * es, start, len;
  my_block(c, op, &start, &len);
  HORA_CHECK(hora__gpu_grow_stage(c, g, bytes + len * es + 1));
  char *result = (char *)g->stage + bytes;
  hora__gpu_phase(op, "MEMCPY_DEVICE_TO_HOST");
  HORA_CHECK(hora__gpu_pack(c, g, op->in, 1, (char *)g->stage_dev, true));
  HORA_CHECK(hora__gpu_wait_stream(c, g)); /* the host reduces what the GPU wrote */
  hora__gpu_phase(op, NULL);
  if (op->unit == 0) {
    HORA_CHECK(hora__reducescatter_at(c, g->stage, result, op->count, start, len, op->dtype,
                                      op->op, op->dtype, op->opts));
  } else {
    HORA_CHECK(hora__reducescatter(c, g->stage, result, op->count, op->unit, op->dtype, op->op,
                                   op->dtype, op->opts));
  }
  if (op->out[0].base && len) {
    hora__gpu_phase(op, "MEMCPY_HOST_TO_DEVICE");
    CUDA_CHECK(cudaMemcpyAsync(op->out[0].base, result, len * es, cudaMemcpyHostToDevice,
                               g->stream));
    HORA_CHECK(hora__gpu_copied_out(g));
    hora__gpu_phase(op, NULL);
  }
  return HORA_SUCCESS;
}

int hora__gpu_staged_exchange(hora__comm *c, struct hora__gpu *g, const struct hora__coll_op *op) {
  size_t sent = bytes_sent(c, op), got = sum(op->recv_bytes, c->size);
  HORA_CHECK(hora__gpu_grow_stage(c, g, sent + got + 1));
  char *in = g->stage, *out = (char *)g->stage + sent;
  hora__gpu_phase(op, "MEMCPY_DEVICE_TO_HOST");
  if (sent && op->in[0].base) {
    CUDA_CHECK(cudaMemcpyAsync(in, op->in[0].base, sent, cudaMemcpyDeviceToHost, g->stream));
  }
  /* Also the last copy out of the staging: the host writes it next. */
  HORA_CHECK(hora__gpu_wait_stream(c, g));
  hora__gpu_phase(op, NULL);
  if (op->kind == HORA_COLL_ALLTOALL) {
    HORA_CHECK(hora__alltoall(c, in, op->send_bytes, out, op->recv_bytes, op->most, false));
  } else {
    HORA_CHECK(hora__allgatherv(c, in, op->recv_bytes, out, false));
  }
  if (op->out[0].base && got) {
    hora__gpu_phase(op, "MEMCPY_HOST_TO_DEVICE");
    CUDA_CHECK(cudaMemcpyAsync(op->out[0].base, out, got, cudaMemcpyHostToDevice, g->stream));
    HORA_CHECK(hora__gpu_copied_out(g));
    hora__gpu_phase(op, NULL);
  }
  return HORA_SUCCESS;
}
