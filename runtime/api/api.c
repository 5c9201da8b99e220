/* The public API: the entry points and their argument checks. Caller
 * threads only validate, enqueue and wait; the coordinator thread
 * (engine/engine.c) does the rest. Requests are made, submitted and waited for
 * in request.c; init.c starts and stops the runtime. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "comm/coll/collectives.h"
#include "comm/comm.h"
#include "comm/gpu/gpu.h"
#include "comm/shm/shm.h"
#include "base/log.h"
#include "base/params.h"
#include "runtime/runtime.h"
#include "runtime/observe/timeline.h"

/* ---- wait and test -------------------------------------------------------------- */

/* Requests live until waited on, even across hora_finalize (which completes
 * them); so wait and test need no running runtime once a request is done. */
HORA_EXTERN int hora_wait(hora_request **req) {
  hora__error_clear();
  if (!req || !*req) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_wait: %s is NULL", req ? "*req" : "req");
  }
  if ((*req)->group_held) {
    return hora__error(HORA_ERR_INVALID_USAGE, "hora_wait on an operation of a group that has "
                       "not ended: call hora_group_end first");
  }
  if (atomic_load_explicit(&(*req)->done, memory_order_acquire)) {
    /* (Done before the wait: its stages count all the same.) */
    if ((*req)->status == HORA_SUCCESS && (*req)->inst) {
      hora__request_account_stages((*req)->inst, *req);
    } else if ((*req)->status == HORA_SUCCESS) {
      int rc = HORA_SUCCESS;
      struct hora__runtime *rt = hora__api_running(&rc, "hora_wait");
      if (rt) {
        hora__request_account_stages(rt, *req);
        hora__api_leave(HORA_SUCCESS);
      }
      hora__error_clear();
    }
    return hora__request_finish(req);
  }
  if ((*req)->inst) {
    /* A process set's: the request keeps its runtime alive. */
    return hora__request_wait((*req)->inst, req);
  }
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = hora__api_running(&rc, "hora_wait");
  if (!rt) {
    /* Not done and no runtime: hora_finalize (in another thread) is
     * completing every request right now. */
    for (int ms = 0; ms < 60000 && !atomic_load(&(*req)->done); ms++) {
      struct timespec one = {0, 1000000};
      nanosleep(&one, NULL);
    }
    return atomic_load_explicit(&(*req)->done, memory_order_acquire) ? hora__request_finish(req)
                                                                     : rc;
  }
  return hora__api_leave(hora__request_wait(rt, req));
}

HORA_EXTERN int hora_test(hora_request **req, int *done) {
  hora__error_clear();
  if (!req || !*req || !done) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_test: %s is NULL",
                       !req ? "req" : !*req ? "*req" : "done");
  }
  if ((*req)->group_held) {
    *done = 0;
    return HORA_SUCCESS; /* (it cannot complete before hora_group_end) */
  }
  bool happened = atomic_load_explicit(&(*req)->done, memory_order_acquire);
  if (happened && (*req)->status == HORA_SUCCESS && (*req)->done_event &&
      hora__request_job_failed(*req) == HORA_SUCCESS) {
    HORA_CHECK(hora__gpu_event_query((*req)->done_event, &happened));
  }
  *done = happened;
  return happened ? hora__request_finish(req) : HORA_SUCCESS;
}

/* ---- collectives ----------------------------------------------------------------- */

static int check_name(const char *name) {
  if (name) {
    size_t n = strnlen(name, HORA_NAME_MAX + 1);
    if (n > HORA_NAME_MAX) {
      return hora__error(HORA_ERR_INVALID_ARG, "operation name '%.40s...' is longer than %d bytes",
                         name, HORA_NAME_MAX);
    }
  }
  return HORA_SUCCESS;
}

int hora__api_check_common(const char *call, const char *name, size_t count, hora_dtype dtype,
                        hora_request **req, size_t multiplier) {
  if (!req) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s: req is NULL", call);
  }
  *req = NULL;
  HORA_CHECK(check_name(name));
  if (!hora__dtype_valid((int)dtype)) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s: unknown dtype %d", call, (int)dtype);
  }
  size_t es = hora_dtype_size(dtype);
  if (count > SIZE_MAX / es / multiplier || count > (SIZE_MAX >> 4) / es / multiplier) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s: %zu elements of %s overflow a byte count", call,
                       count, hora_dtype_name(dtype));
  }
  return HORA_SUCCESS;
}

/* The caller's shape into r: its dims for rank 0's messages, and the
 * fingerprint every comparison uses. */
void hora__api_set_shape(struct hora_request *r, const struct hora__shape *s) {
  if (s->ndims >= 0) {
    r->shape = *s;
    r->meta.shape = hora__shape_fingerprint(r->meta.kind, s);
  }
}

/* The process set of a hora_op_options (NULL: the world), read only where
 * the caller's struct_size covers it (checked by op_options_shape). */
const hora_process_set *hora__api_options_set(const hora_op_options *opts) {
  return opts && opts->struct_size >= offsetof(hora_op_options, process_set) +
                                          sizeof(opts->process_set)
             ? opts->process_set
             : NULL;
}

/* The shape of a hora_op_options (NULL: none), read only where the
 * caller's struct_size covers it. */
int hora__api_options_shape(const char *call, const hora_op_options *opts, size_t count,
                            struct hora__shape *shape) {
  shape->ndims = -1;
  if (!opts) {
    return HORA_SUCCESS;
  }
  if (opts->struct_size < sizeof(opts->struct_size) || opts->struct_size > (1u << 16)) {
    return hora__error(HORA_ERR_INVALID_ARG,
                       "%s: opts->struct_size is %zu; set it to sizeof(hora_op_options)", call,
                       opts->struct_size);
  }
  if (opts->struct_size < offsetof(hora_op_options, dims) + sizeof(opts->dims)) {
    return HORA_SUCCESS;
  }
  return hora__shape_check(call, opts->ndims, opts->dims, count, shape);
}

static int compression_setting(void) {
  if (strcmp(hora__params.COMPRESSION, "fp16") == 0) {
    return HORA_COMPRESSION_FP16;
  }
  return strcmp(hora__params.COMPRESSION, "bf16") == 0 ? HORA_COMPRESSION_BF16
                                                       : HORA_COMPRESSION_NONE;
}

HORA_EXTERN int hora_allreduce_async_ex(const char *name, const void *sendbuf, void *recvbuf,
                                        size_t count, hora_dtype dtype, hora_op op,
                                        const hora_allreduce_options *opts, hora_request **req) {
  return hora__allreduce_submit(name, sendbuf, recvbuf, count, dtype, op, opts, NULL, req);
}

/* Allreduce and reducescatter: the reductions, with the same options. */
/* split: a reducescatter's explicit counts (one per rank of the set,
 * adding up to count), or NULL for Horovod's split. */
static int reduction_submit(uint8_t kind, const char *name, const void *sendbuf, void *recvbuf,
                            size_t count, hora_dtype dtype, hora_op op,
                            const hora_allreduce_options *opts, void *stream,
                            const size_t *split, hora_request **req) {
  hora__error_clear();
  bool scatter = kind == HORA_KIND_REDUCESCATTER;
  const char *call = scatter ? "hora_reducescatter_async" : "hora_allreduce_async";
  HORA_CHECK(hora__api_check_common(call, name, count, dtype, req, 1));
  if (!hora__op_valid((int)op)) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s: unknown op %d", call, (int)op);
  }
  if (op == HORA_ADASUM && scatter) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s: ADASUM is an allreduce op", call);
  }
  /* (A reducescatter's recvbuf may be NULL where this rank's block is
   * empty: checked once the set, and so the block, is known.) */
  if (count > 0 && (!sendbuf || (!recvbuf && !scatter))) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s: %s is NULL", call,
                       sendbuf ? "recvbuf" : "sendbuf");
  }
  /* Read only the fields the caller's struct has. */
  hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
  if (opts) {
    if (opts->struct_size < offsetof(hora_allreduce_options, prescale) ||
        opts->struct_size > (1u << 16)) {
      return hora__error(HORA_ERR_INVALID_ARG,
                         "hora_allreduce_async_ex: opts->struct_size is %zu; set it to "
                         "sizeof(hora_allreduce_options)",
                         opts->struct_size);
    }
    memcpy(&o, opts, HORA_MIN(opts->struct_size, sizeof(o)));
    /* A struct from before the shape ends after `compression`, maybe with
     * padding where `ndims` now is: the shape counts only when whole. */
    if (opts->struct_size < offsetof(hora_allreduce_options, dims) + sizeof(o.dims)) {
      o.ndims = -1;
      o.dims = NULL;
    }
    if (opts->struct_size < offsetof(hora_allreduce_options, process_set) + sizeof(o.process_set)) {
      o.process_set = NULL;
    }
  }
  struct hora__shape shape;
  HORA_CHECK(hora__shape_check("hora_allreduce_async_ex", o.ndims, o.dims, count, &shape));
  if (!isfinite(o.prescale) || !isfinite(o.postscale)) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_allreduce_async_ex: prescale %g or postscale %g "
                       "is not a finite number", o.prescale, o.postscale);
  }
  if (o.compression < HORA_COMPRESSION_DEFAULT || o.compression > HORA_COMPRESSION_BF16) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_allreduce_async_ex: unknown compression %d",
                       o.compression);
  }
  HORA_CHECK(hora__check_allreduce_dtype(call,
                                         name, dtype, op, o.prescale, o.postscale));
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = hora__api_running_in(o.process_set, &rc, call);
  if (!rt) {
    return rc;
  }
  struct hora_request *r = hora__request_new(kind);
  if (!r) {
    return hora__api_leave_in(rt, HORA_ERR_NO_MEMORY);
  }
  int compression = o.compression == HORA_COMPRESSION_DEFAULT ? compression_setting() : o.compression;
  r->meta.dtype = (uint8_t)dtype;
  r->meta.op = (uint8_t)op;
  r->meta.count = count;
  r->meta.prescale = o.prescale;
  r->meta.postscale = o.postscale;
  /* Only float32 and float64 are narrowed on the wire. */
  r->meta.compression = (uint8_t)(dtype == HORA_FLOAT32 || dtype == HORA_FLOAT64 ? compression : 0);
  hora__api_set_shape(r, &shape);
  if (split) {
    r->v_recv = hora__malloc((size_t)rt->size * sizeof(size_t));
    if (!r->v_recv) {
      hora__request_free(r);
      return hora__api_leave_in(rt, HORA_ERR_NO_MEMORY);
    }
    memcpy(r->v_recv, split, (size_t)rt->size * sizeof(size_t));
    uint64_t h = 0xcbf29ce484222325ull;
    for (int j = 0; j < rt->size; j++) {
      for (int b = 0; b < 8; b++) {
        h = (h ^ (uint8_t)((uint64_t)split[j] >> (8 * b))) * 0x100000001b3ull;
      }
    }
    r->meta.split = h | 1;
    r->meta.root = -1;
    if (!recvbuf && split[rt->rank] > 0) {
      hora__request_free(r);
      return hora__api_leave_in(rt, hora__error(HORA_ERR_INVALID_ARG, "%s: recvbuf is NULL", call));
    }
  } else if (scatter) {
    /* The split counts rows of the first dimension, where a shape gives one. */
    int64_t rows = shape.ndims > 0 ? shape.dims[0] : 0;
    if (rows > INT32_MAX) {
      hora__request_free(r);
      return hora__api_leave_in(rt, hora__error(HORA_ERR_INVALID_ARG,
                                         "%s: the first dimension "
                                         "(%lld) is too large to split", call, (long long)rows));
    }
    r->meta.root = (int32_t)rows;
    if (!recvbuf && hora_reducescatter_block(count, (size_t)rows, rt->size, rt->rank) > 0) {
      hora__request_free(r);
      return hora__api_leave_in(rt, hora__error(HORA_ERR_INVALID_ARG, "%s: recvbuf is NULL", call));
    }
  }
  r->sendbuf = sendbuf;
  r->recvbuf = recvbuf;
  r->stream = stream;
  return hora__api_leave_in(rt, hora__request_submit(rt, r, name, req));
}

int hora__allreduce_submit(const char *name, const void *sendbuf, void *recvbuf, size_t count,
                           hora_dtype dtype, hora_op op, const hora_allreduce_options *opts,
                           void *stream, hora_request **req) {
  return reduction_submit(HORA_KIND_ALLREDUCE, name, sendbuf, recvbuf, count, dtype, op, opts,
                          stream, NULL, req);
}

int hora__reducescatter_submit(const char *name, const void *sendbuf, void *recvbuf,
                               size_t count, hora_dtype dtype, hora_op op,
                               const hora_allreduce_options *opts, void *stream,
                               hora_request **req) {
  return reduction_submit(HORA_KIND_REDUCESCATTER, name, sendbuf, recvbuf, count, dtype, op,
                          opts, stream, NULL, req);
}

HORA_EXTERN int hora_reducescatter_async_ex(const char *name, const void *sendbuf,
                                            void *recvbuf, size_t count, hora_dtype dtype,
                                            hora_op op, const hora_allreduce_options *opts,
                                            hora_request **req) {
  return hora__reducescatter_submit(name, sendbuf, recvbuf, count, dtype, op, opts, NULL, req);
}

HORA_EXTERN int hora_reducescatterv_async(const char *name, const void *sendbuf, void *recvbuf,
                                          const size_t *recv_counts, hora_dtype dtype, hora_op op,
                                          const hora_allreduce_options *opts,
                                          hora_request **req) {
  hora__error_clear();
  if (req) {
    *req = NULL;
  }
  if (!recv_counts) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_reducescatterv_async: recv_counts is NULL");
  }
  /* The set's size, to add the counts up (the submission checks the rest). */
  const hora_process_set *ps =
      opts && opts->struct_size >= offsetof(hora_allreduce_options, process_set) +
                                       sizeof(opts->process_set)
          ? opts->process_set
          : NULL;
  int size = ps ? hora_process_set_size(ps) : hora_size();
  if (size <= 0) {
    return hora__error(HORA_ERR_INVALID_USAGE, "hora_reducescatterv_async: hora is not running");
  }
  size_t count = 0;
  for (int j = 0; j < size; j++) {
    if (recv_counts[j] > (SIZE_MAX >> 4) - count) {
      return hora__error(HORA_ERR_INVALID_ARG, "hora_reducescatterv_async: recv_counts overflow");
    }
    count += recv_counts[j];
  }
  return reduction_submit(HORA_KIND_REDUCESCATTER, name, sendbuf, recvbuf, count, dtype, op,
                          opts, NULL, recv_counts, req);
}

HORA_EXTERN int hora_reducescatterv(const char *name, const void *sendbuf, void *recvbuf,
                                    const size_t *recv_counts, hora_dtype dtype, hora_op op,
                                    const hora_allreduce_options *opts) {
  hora_request *r = NULL;
  HORA_CHECK(hora_reducescatterv_async(name, sendbuf, recvbuf, recv_counts, dtype, op, opts, &r));
  return hora_wait(&r);
}

HORA_EXTERN int hora_reducescatter_async(const char *name, const void *sendbuf, void *recvbuf,
                                         size_t count, hora_dtype dtype, hora_op op,
                                         hora_request **req) {
  return hora_reducescatter_async_ex(name, sendbuf, recvbuf, count, dtype, op, NULL, req);
}

HORA_EXTERN int hora_reducescatter(const char *name, const void *sendbuf, void *recvbuf,
                                   size_t count, hora_dtype dtype, hora_op op) {
  hora_request *r = NULL;
  HORA_CHECK(hora_reducescatter_async(name, sendbuf, recvbuf, count, dtype, op, &r));
  return hora_wait(&r);
}

HORA_EXTERN size_t hora_reducescatter_block(size_t count, size_t rows, int size, int rank) {
  if (size <= 0 || rank < 0 || rank >= size || (rows && count % rows)) {
    return 0;
  }
  size_t start, len;
  hora__block_range(count, rows ? count / rows : 1, size, rank, &start, &len);
  return len;
}

HORA_EXTERN int hora_allreduce_async(const char *name, const void *sendbuf, void *recvbuf,
                                     size_t count, hora_dtype dtype, hora_op op,
                                     hora_request **req) {
  return hora_allreduce_async_ex(name, sendbuf, recvbuf, count, dtype, op, NULL, req);
}

HORA_EXTERN int hora_broadcast_async(const char *name, void *buf, size_t count, hora_dtype dtype,
                                     int root, hora_request **req) {
  return hora__broadcast_submit(name, buf, count, dtype, root, NULL, NULL, req);
}

HORA_EXTERN int hora_broadcast_async_ex(const char *name, void *buf, size_t count, hora_dtype dtype,
                                        int root, const hora_op_options *opts, hora_request **req) {
  return hora__broadcast_submit(name, buf, count, dtype, root, opts, NULL, req);
}

int hora__broadcast_submit(const char *name, void *buf, size_t count, hora_dtype dtype, int root,
                           const hora_op_options *opts, void *stream, hora_request **req) {
  hora__error_clear();
  HORA_CHECK(hora__api_check_common("hora_broadcast_async", name, count, dtype, req, 1));
  if (count > 0 && !buf) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_broadcast_async: buf is NULL");
  }
  struct hora__shape shape;
  HORA_CHECK(hora__api_options_shape("hora_broadcast_async_ex", opts, count, &shape));
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt =
      hora__api_running_in(hora__api_options_set(opts), &rc, "hora_broadcast_async");
  if (!rt) {
    return rc;
  }
  if (root < 0 || root >= rt->size) {
    return hora__api_leave_in(rt, hora__error(
        HORA_ERR_INVALID_ARG, "hora_broadcast_async: root %d is out of range (the %s has %d ranks)",
        root, rt->set_id ? "process set" : "job", rt->size));
  }
  struct hora_request *r = hora__request_new(HORA_KIND_BROADCAST);
  if (!r) {
    return hora__api_leave_in(rt, HORA_ERR_NO_MEMORY);
  }
  r->meta.dtype = (uint8_t)dtype;
  r->meta.count = count;
  r->meta.root = root;
  hora__api_set_shape(r, &shape);
  r->sendbuf = buf;
  r->recvbuf = buf;
  r->stream = stream;
  return hora__api_leave_in(rt, hora__request_submit(rt, r, name, req));
}

HORA_EXTERN int hora_allgather_async(const char *name, const void *sendbuf, size_t count,
                                     hora_dtype dtype, void *recvbuf, hora_request **req) {
  return hora__allgather_submit(name, sendbuf, count, dtype, recvbuf, NULL, NULL, req);
}

HORA_EXTERN int hora_allgather_async_ex(const char *name, const void *sendbuf, size_t count,
                                        hora_dtype dtype, void *recvbuf,
                                        const hora_op_options *opts, hora_request **req) {
  return hora__allgather_submit(name, sendbuf, count, dtype, recvbuf, opts, NULL, req);
}

int hora__allgather_submit(const char *name, const void *sendbuf, size_t count, hora_dtype dtype,
                           void *recvbuf, const hora_op_options *opts, void *stream,
                           hora_request **req) {
  hora__error_clear();
  int rc = HORA_SUCCESS;
  if (opts && (opts->struct_size < sizeof(opts->struct_size) || opts->struct_size > (1u << 16))) {
    return hora__api_options_shape("hora_allgather_async_ex", opts, count, &(struct hora__shape){0});
  }
  struct hora__runtime *rt =
      hora__api_running_in(hora__api_options_set(opts), &rc, "hora_allgather_async");
  if (!rt) {
    if (req) {
      *req = NULL;
    }
    return req ? rc : hora__error(HORA_ERR_INVALID_ARG, "hora_allgather_async: req is NULL");
  }
  rc = hora__api_check_common("hora_allgather_async", name, count, dtype, req, (size_t)rt->size);
  if (rc != HORA_SUCCESS) {
    return hora__api_leave_in(rt, rc);
  }
  if (count > 0 && (!sendbuf || !recvbuf)) {
    return hora__api_leave_in(rt, hora__error(HORA_ERR_INVALID_ARG, "hora_allgather_async: %s is NULL",
                                       sendbuf ? "recvbuf" : "sendbuf"));
  }
  struct hora__shape shape;
  rc = hora__api_options_shape("hora_allgather_async_ex", opts, count, &shape);
  if (rc != HORA_SUCCESS) {
    return hora__api_leave_in(rt, rc);
  }
  struct hora_request *r = hora__request_new(HORA_KIND_ALLGATHER);
  if (!r) {
    return hora__api_leave_in(rt, HORA_ERR_NO_MEMORY);
  }
  r->meta.dtype = (uint8_t)dtype;
  r->meta.count = count;
  hora__api_set_shape(r, &shape);
  r->sendbuf = sendbuf;
  r->recvbuf = recvbuf;
  r->stream = stream;
  return hora__api_leave_in(rt, hora__request_submit(rt, r, name, req));
}

/* hora_wait_stream (hora_cuda.h): the caller's stream waits for the
 * results; the host waits only until the operation is queued. */
int hora__wait_stream(hora_request **req, void *stream) {
  hora__error_clear();
  if (!req || !*req) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_wait_stream: %s is NULL", req ? "*req" : "req");
  }
  struct hora_request *r = *req;
  if (!r->done_event) {
    return hora_wait(req); /* not stream-ordered: a plain wait */
  }
  if (!atomic_load_explicit(&r->done, memory_order_acquire)) {
    int rc = HORA_SUCCESS;
    struct hora__runtime *rt = hora__api_running(&rc, "hora_wait_stream");
    if (!rt) {
      return rc;
    }
    hora__request_wait_done(r->inst ? r->inst : rt, r);
    hora__api_leave(HORA_SUCCESS);
  }
  int status = r->status;
  if (status == HORA_SUCCESS) {
    /* A failed job's results may never come: no stream waits for them. */
    status = hora__request_job_failed(r);
  }
  if (status == HORA_SUCCESS) {
    status = hora__gpu_stream_wait_event(stream, r->done_event);
  } else if (r->status != HORA_SUCCESS) {
    hora__error_set_message(r->error);
  }
  hora__request_free(r);
  *req = NULL;
  return status;
}

HORA_EXTERN int hora_allreduce(const char *name, const void *sendbuf, void *recvbuf, size_t count,
                               hora_dtype dtype, hora_op op) {
  hora_request *r = NULL;
  HORA_CHECK(hora_allreduce_async(name, sendbuf, recvbuf, count, dtype, op, &r));
  return hora_wait(&r);
}

HORA_EXTERN int hora_broadcast(const char *name, void *buf, size_t count, hora_dtype dtype,
                               int root) {
  hora_request *r = NULL;
  HORA_CHECK(hora_broadcast_async(name, buf, count, dtype, root, &r));
  return hora_wait(&r);
}

HORA_EXTERN int hora_allgather(const char *name, const void *sendbuf, size_t count,
                               hora_dtype dtype, void *recvbuf) {
  hora_request *r = NULL;
  HORA_CHECK(hora_allgather_async(name, sendbuf, count, dtype, recvbuf, &r));
  return hora_wait(&r);
}

static int run_internal(uint8_t kind, const char *call, const hora_op_options *opts,
                        int *last_joined) {
  hora__error_clear();
  int rc = HORA_SUCCESS;
  if (opts && (opts->struct_size < sizeof(opts->struct_size) || opts->struct_size > (1u << 16))) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s: opts->struct_size is %zu; set it to "
                       "sizeof(hora_op_options)", call, opts->struct_size);
  }
  struct hora__runtime *rt = hora__api_running_in(hora__api_options_set(opts), &rc, call);
  if (!rt) {
    return rc;
  }
  struct hora_request *r = hora__request_new(kind);
  if (!r) {
    return hora__api_leave_in(rt, HORA_ERR_NO_MEMORY);
  }
  hora_request *q = NULL;
  rc = hora__request_submit(rt, r, NULL, &q);
  if (rc != HORA_SUCCESS) {
    return hora__api_leave_in(rt, rc);
  }
  /* Read before hora__request_wait frees it. */
  while (!atomic_load_explicit(&q->done, memory_order_acquire)) {
    pthread_mutex_lock(&rt->mu);
    while (!atomic_load_explicit(&q->done, memory_order_acquire)) {
      pthread_cond_wait(&rt->done_cv, &rt->mu);
    }
    pthread_mutex_unlock(&rt->mu);
  }
  if (last_joined) {
    *last_joined = q->last_joined;
  }
  return hora__api_leave_in(rt, hora__request_finish(&q));
}

HORA_EXTERN int hora_barrier(void) {
  return run_internal(HORA_KIND_BARRIER, "hora_barrier", NULL, NULL);
}

HORA_EXTERN int hora_barrier_ex(const hora_op_options *opts) {
  return run_internal(HORA_KIND_BARRIER, "hora_barrier_ex", opts, NULL);
}

HORA_EXTERN int hora_broadcast_parameters(const hora_tensor *tensors, size_t n, int root) {
  return hora_broadcast_parameters_ex(tensors, n, root, NULL);
}

HORA_EXTERN int hora_broadcast_parameters_ex(const hora_tensor *tensors, size_t n, int root,
                                             const hora_op_options *opts) {
  hora__error_clear();
  if (n > 0 && !tensors) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_broadcast_parameters: tensors is NULL");
  }
  if (opts && (opts->struct_size < sizeof(opts->struct_size) || opts->struct_size > (1u << 16))) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_broadcast_parameters_ex: opts->struct_size is "
                       "%zu; set it to sizeof(hora_op_options)", opts->struct_size);
  }
  hora_request **reqs = hora__calloc(n ? n : 1, sizeof(*reqs));
  if (!reqs) {
    return HORA_ERR_NO_MEMORY;
  }
  /* Submit all, then wait for all, so the engine can fuse them. */
  int first = HORA_SUCCESS;
  char first_msg[1024] = "";
  size_t submitted = 0;
  for (size_t i = 0; i < n; i++) {
    /* Each tensor's own shape is unknown here: only the set is passed on. */
    hora_op_options o = HORA_OP_OPTIONS_INIT;
    o.process_set = hora__api_options_set(opts);
    int rc = hora_broadcast_async_ex(tensors[i].name, tensors[i].buf, tensors[i].count,
                                     tensors[i].dtype, root, &o, &reqs[i]);
    if (rc != HORA_SUCCESS) {
      first = rc;
      snprintf(first_msg, sizeof(first_msg), "hora_broadcast_parameters: tensor %zu: %s", i,
               hora_last_error());
      break;
    }
    submitted++;
  }
  for (size_t i = 0; i < submitted; i++) {
    int rc = hora_wait(&reqs[i]);
    if (rc != HORA_SUCCESS && first == HORA_SUCCESS) {
      first = rc;
      snprintf(first_msg, sizeof(first_msg), "hora_broadcast_parameters: tensor %zu: %s", i,
               hora_last_error());
    }
  }
  free(reqs);
  if (first != HORA_SUCCESS) {
    return hora__error(first, "%s", first_msg);
  }
  hora__error_clear();
  return HORA_SUCCESS;
}

void hora__stats_add(hora_stats *s, struct hora__runtime *rt) {
  s->allreduces += atomic_load(&rt->stats.allreduces);
  s->broadcasts += atomic_load(&rt->stats.broadcasts);
  s->allgathers += atomic_load(&rt->stats.allgathers);
  s->reducescatters += atomic_load(&rt->stats.reducescatters);
  s->alltoalls += atomic_load(&rt->stats.alltoalls);
  s->operations = s->allreduces + s->broadcasts + s->allgathers + s->reducescatters + s->alltoalls;
  s->bytes += atomic_load(&rt->stats.bytes);
  s->fused_batches += atomic_load(&rt->stats.fused_batches);
  s->fused_tensors += atomic_load(&rt->stats.fused_tensors);
  s->cache_hits += atomic_load(&rt->stats.cache_hits);
  s->cache_misses += atomic_load(&rt->stats.cache_misses);
  s->cycles += atomic_load(&rt->stats.cycles);
  s->sent_in_full += atomic_load(&rt->stats.sent_in_full);
  s->eager_allreduces += atomic_load(&rt->stats.eager);
  s->eager_collectives += atomic_load(&rt->stats.eager_collectives);
  s->bus_bytes += atomic_load(&rt->stats.bus_bytes);
  s->negotiate_seconds += (double)atomic_load(&rt->stats.negotiate_ns) * 1e-9;
  s->communicate_seconds += (double)atomic_load(&rt->stats.communicate_ns) * 1e-9;
  s->copy_seconds += (double)atomic_load(&rt->stats.copy_ns) * 1e-9;
  if (rt->comm) {
    s->direct_bytes += __atomic_load_n(&rt->comm->proc->direct_bytes, __ATOMIC_RELAXED);
    s->kernel_bytes += __atomic_load_n(&rt->comm->proc->kernel_bytes, __ATOMIC_RELAXED);
    s->staged_bytes += __atomic_load_n(&rt->comm->proc->staged_bytes, __ATOMIC_RELAXED);
  }
  s->staged_operations += atomic_load(&rt->stats.staged_ops);
  s->stage_submit_seconds += (double)atomic_load(&rt->stats.submit_ns) * 1e-9;
  s->stage_handoff_seconds += (double)atomic_load(&rt->stats.handoff_ns) * 1e-9;
  s->stage_negotiate_seconds += (double)atomic_load(&rt->stats.cycle_ns) * 1e-9;
  s->stage_run_seconds += (double)atomic_load(&rt->stats.run_ns) * 1e-9;
  s->stage_complete_seconds += (double)atomic_load(&rt->stats.complete_ns) * 1e-9;
  s->stage_wake_seconds += (double)atomic_load(&rt->stats.wake_ns) * 1e-9;
}

void hora__stats_total(hora_stats *s, struct hora__runtime *rt) {
  memset(s, 0, sizeof(*s));
  s->struct_size = sizeof(*s);
  hora__stats_add(s, rt);
  hora__process_sets_add_stats(s);
}

HORA_EXTERN int hora_get_stats(hora_stats *stats) {
  hora__error_clear();
  if (!stats) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_get_stats: stats is NULL");
  }
  if (stats->struct_size < offsetof(hora_stats, operations) + sizeof(uint64_t) ||
      stats->struct_size > (1u << 16)) {
    return hora__error(HORA_ERR_INVALID_ARG,
                       "hora_get_stats: stats->struct_size is %zu; set it to sizeof(hora_stats)",
                       stats->struct_size);
  }
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = hora__api_running(&rc, "hora_get_stats");
  if (!rt) {
    return rc;
  }
  hora_stats s;
  hora__stats_total(&s, rt);
  size_t keep = stats->struct_size;
  memcpy(stats, &s, HORA_MIN(keep, sizeof(s)));
  stats->struct_size = keep;
  return hora__api_leave(HORA_SUCCESS);
}

HORA_EXTERN int hora_join_ex(const hora_op_options *opts, int *last_joined_rank) {
  int last = -1;
  int rc = run_internal(HORA_KIND_JOIN, opts ? "hora_join_ex" : "hora_join", opts, &last);
  if (last_joined_rank) {
    *last_joined_rank = rc == HORA_SUCCESS ? last : -1;
  }
  return rc;
}

HORA_EXTERN int hora_join(int *last_joined_rank) { return hora_join_ex(NULL, last_joined_rank); }

/* Only rank 0 writes the timeline; the coordinator keeps writing events
 * while the file is swapped (observe/timeline.c locks). */
HORA_EXTERN int hora_start_timeline(const char *path, int mark_cycles) {
  hora__error_clear();
  if (!path || !path[0]) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_start_timeline: path is %s",
                       path ? "empty" : "NULL");
  }
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = hora__api_running(&rc, "hora_start_timeline");
  if (!rt) {
    return rc;
  }
  if (rt->rank == 0) {
    rc = hora__timeline_open(path, mark_cycles != 0, "hora_start_timeline");
  }
  return hora__api_leave(rc);
}

HORA_EXTERN int hora_stop_timeline(void) {
  hora__error_clear();
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = hora__api_running(&rc, "hora_stop_timeline");
  if (!rt) {
    return rc;
  }
  if (rt->rank == 0) {
    hora__timeline_close();
  }
  return hora__api_leave(HORA_SUCCESS);
}

HORA_EXTERN int hora_mem_alloc(size_t bytes, void **ptr) {
  hora__error_clear();
  return hora__mem_alloc(bytes, ptr);
}

HORA_EXTERN int hora_mem_free(void *ptr) {
  hora__error_clear();
  return hora__mem_free(ptr);
}

/* The job communicator's choice for kind at bytes, and its layout;
 * NULL with *rc set where there is none. */
static const struct hora__algo *job_choice(const char *fn, const char *kind, size_t bytes,
                                           const hora__comm **comm, struct hora__layout *s,
                                           int *rc) {
  if (!kind) {
    *rc = hora__error(HORA_ERR_INVALID_ARG, "%s: NULL kind", fn);
    return NULL;
  }
  int k = 0;
  while (k < HORA_ALGO_KINDS && strcmp(kind, hora__algo_kind_name((enum hora__coll_kind)k)) != 0) {
    k++;
  }
  if (k == HORA_ALGO_KINDS) {
    *rc = hora__error(HORA_ERR_INVALID_ARG, "%s: no kind '%s' (allreduce, broadcast, allgather "
                      "or reducescatter)", fn, kind);
    return NULL;
  }
  struct hora__runtime *rt = hora__api_running(rc, fn);
  if (!rt) {
    return NULL;
  }
  /* The communicator's choice fields are set at its build and only read
   * after: no lock needed. */
  const hora__comm *c = rt->comm;
  if (!c) {
    *rc = hora__api_leave(hora__error(HORA_ERR_INVALID_USAGE, "%s: the job has no communicator "
                                      "(an elastic reset is under way)", fn));
    return NULL;
  }
  *comm = c;
  hora__comm_layout(c, s);
  return hora__algo_select(c, (enum hora__coll_kind)k, bytes);
}

int hora_collective_algorithm(const char *kind, size_t bytes, const char **name,
                              double *predicted_seconds) {
  int rc = HORA_SUCCESS;
  if (!name || !predicted_seconds) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_collective_algorithm: NULL %s",
                       !name ? "name" : "predicted_seconds");
  }
  const hora__comm *c;
  struct hora__layout s;
  const struct hora__algo *a = job_choice("hora_collective_algorithm", kind, bytes, &c, &s, &rc);
  if (!a) {
    return rc;
  }
  *name = a->name;
  *predicted_seconds = a->cost(&c->model, &s, bytes);
  return hora__api_leave(HORA_SUCCESS);
}

int hora_predict_operation(const char *kind, size_t bytes, const char **name,
                           double *predicted_seconds) {
  int rc = HORA_SUCCESS;
  if (!name || !predicted_seconds) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_predict_operation: NULL %s",
                       !name ? "name" : "predicted_seconds");
  }
  const hora__comm *c;
  struct hora__layout s;
  const struct hora__algo *a = job_choice("hora_predict_operation", kind, bytes, &c, &s, &rc);
  if (!a) {
    return rc;
  }
  bool eager = hora__eager(a->kind, bytes, s.size, NULL);
  *name = eager ? "eager" : a->name;
  *predicted_seconds = hora__operation_cost(&c->model, &s, a, bytes, eager);
  return hora__api_leave(HORA_SUCCESS);
}
