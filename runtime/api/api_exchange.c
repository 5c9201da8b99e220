/* The collectives whose counts differ by rank: allgatherv and alltoall,
 * with the caller's receive counts or with the result allocated. Their
 * counts travel in the request itself, not in its meta: the ranks
 * exchange them when the operation runs (runtime/engine/execute_exchange.c). */
#include <stdlib.h>

#include "runtime/runtime.h"

HORA_EXTERN void hora_received_free(hora_received *r) {
  if (r) {
    free(r->buf);
    free(r->counts);
    memset(r, 0, sizeof(*r));
  }
}

/* A copy of n counts, or NULL with an error. */
static size_t *copy_counts(const size_t *counts, int n) {
  size_t *c = hora__malloc((size_t)n * sizeof(*c));
  if (c) {
    memcpy(c, counts, (size_t)n * sizeof(*c));
  }
  return c;
}

/* Sum of n counts of elements of es bytes; false when it overflows. */
static bool sum_counts(const size_t *c, int n, size_t es, size_t *sum) {
  size_t s = 0;
  for (int i = 0; i < n; i++) {
    if (c[i] > (SIZE_MAX >> 4) / es - s) {
      return false;
    }
    s += c[i];
  }
  *sum = s;
  return true;
}

struct v_args {
  uint8_t kind;
  const char *call, *name;
  const void *sendbuf;
  size_t count;
  const size_t *send_counts; /* alltoall; NULL: see equal */
  bool equal;                /* alltoall_ex: send_counts NULL is count / size each */
  void *recvbuf;
  const size_t *recv_counts;
  hora_received *result; /* the _alloc forms */
  hora_dtype dtype;
  const hora_op_options *opts;
};

static int v_submit(const struct v_args *a, hora_request **req) {
  hora__error_clear();
  const char *call = a->call;
  if (a->result) {
    memset(a->result, 0, sizeof(*a->result));
  }
  if (a->opts && (a->opts->struct_size < sizeof(a->opts->struct_size) ||
                  a->opts->struct_size > (1u << 16))) {
    return hora__api_options_shape(call, a->opts, a->count, &(struct hora__shape){0});
  }
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = hora__api_running_in(hora__api_options_set(a->opts), &rc, call);
  if (!rt) {
    if (req) {
      *req = NULL;
    }
    return req ? rc : hora__error(HORA_ERR_INVALID_ARG, "%s: req is NULL", call);
  }
  int p = rt->size;
  struct hora_request *r = NULL;
  size_t es = hora_dtype_size(a->dtype), count = a->count, *send = NULL, *recv = NULL;
  rc = hora__api_check_common(call, a->name, count, a->dtype, req, 1);
  if (rc != HORA_SUCCESS) {
    goto fail;
  }
  /* This rank's counts: what it sends, and what it expects. */
  if (a->kind == HORA_KIND_ALLTOALL) {
    if (a->send_counts) {
      send = copy_counts(a->send_counts, p);
    } else if (a->equal) {
      if (count % (size_t)p) {
        rc = hora__error(HORA_ERR_INVALID_ARG, "%s: %zu elements do not split equally among "
                         "%d ranks; pass send_counts", call, count, p);
        goto fail;
      }
      send = hora__malloc((size_t)p * sizeof(*send));
      for (int j = 0; send && j < p; j++) {
        send[j] = count / (size_t)p;
      }
    } else if (a->recv_counts) {
      send = copy_counts(a->recv_counts, p); /* symmetric */
    } else {
      rc = hora__error(HORA_ERR_INVALID_ARG, "%s: send_counts and recv_counts are both NULL",
                       call);
      goto fail;
    }
    if (!send) {
      rc = HORA_ERR_NO_MEMORY;
      goto fail;
    }
    size_t total;
    if (!sum_counts(send, p, es, &total)) {
      rc = hora__error(HORA_ERR_INVALID_ARG, "%s: send_counts overflow a byte count", call);
      goto fail;
    }
    if (a->equal && a->send_counts && total != count) {
      rc = hora__error(HORA_ERR_INVALID_ARG, "%s: count is %zu, but send_counts add up to %zu",
                       call, count, total);
      goto fail;
    }
    count = total;
  }
  if (a->recv_counts) {
    recv = copy_counts(a->recv_counts, p);
  } else if (!a->result && a->kind == HORA_KIND_ALLTOALL && a->equal && !a->send_counts) {
    recv = copy_counts(send, p); /* the equal split, from every rank */
  } else if (!a->result) {
    rc = hora__error(HORA_ERR_INVALID_ARG, "%s: recv_counts is NULL (an _alloc form learns "
                     "the counts)", call);
    goto fail;
  }
  if (!a->result && !recv) {
    rc = HORA_ERR_NO_MEMORY;
    goto fail;
  }
  size_t recv_total = 0;
  if (recv && !sum_counts(recv, p, es, &recv_total)) {
    rc = hora__error(HORA_ERR_INVALID_ARG, "%s: recv_counts overflow a byte count", call);
    goto fail;
  }
  if ((count > 0 && !a->sendbuf) || (recv_total > 0 && !a->recvbuf)) {
    rc = hora__error(HORA_ERR_INVALID_ARG, "%s: %s is NULL", call,
                     count > 0 && !a->sendbuf ? "sendbuf" : "recvbuf");
    goto fail;
  }
  struct hora__shape shape;
  rc = hora__api_options_shape(call, a->opts, count, &shape);
  if (rc != HORA_SUCCESS) {
    goto fail;
  }
  if (shape.ndims > 0 && send) {
    /* Whole rows to every rank. */
    size_t row = shape.dims[0] ? count / (size_t)shape.dims[0] : 0;
    for (int j = 0; row && j < p; j++) {
      if (send[j] % row) {
        rc = hora__error(HORA_ERR_INVALID_ARG, "%s: send_counts[%d] = %zu is not a whole number "
                         "of rows of %zu elements", call, j, send[j], row);
        goto fail;
      }
    }
  }
  r = hora__request_new(a->kind);
  if (!r) {
    rc = HORA_ERR_NO_MEMORY;
    goto fail;
  }
  r->meta.dtype = (uint8_t)a->dtype;
  r->meta.count = 0; /* (each rank's own: exchanged when it runs) */
  if (shape.ndims > 0) {
    shape.dims[0] = 0; /* the rows are this rank's; the rest must agree */
  }
  hora__api_set_shape(r, &shape);
  r->sendbuf = a->sendbuf;
  r->recvbuf = a->recvbuf;
  r->v_count = count;
  r->v_send = send;
  r->v_recv = recv;
  r->v_result = a->result;
  return hora__api_leave_in(rt, hora__request_submit(rt, r, a->name, req));
fail:
  free(send);
  free(recv);
  return hora__api_leave_in(rt, rc);
}

HORA_EXTERN int hora_allgatherv_async(const char *name, const void *sendbuf, size_t count,
                                      hora_dtype dtype, void *recvbuf, const size_t *recv_counts,
                                      const hora_op_options *opts, hora_request **req) {
  struct v_args a = {.kind = HORA_KIND_ALLGATHERV, .call = "hora_allgatherv_async", .name = name,
                     .sendbuf = sendbuf, .count = count, .recvbuf = recvbuf,
                     .recv_counts = recv_counts, .dtype = dtype, .opts = opts};
  return v_submit(&a, req);
}

HORA_EXTERN int hora_allgatherv(const char *name, const void *sendbuf, size_t count,
                                hora_dtype dtype, void *recvbuf, const size_t *recv_counts,
                                const hora_op_options *opts) {
  hora_request *r = NULL;
  HORA_CHECK(hora_allgatherv_async(name, sendbuf, count, dtype, recvbuf, recv_counts, opts, &r));
  return hora_wait(&r);
}

HORA_EXTERN int hora_allgatherv_alloc_async(const char *name, const void *sendbuf, size_t count,
                                            hora_dtype dtype, hora_received *result,
                                            const hora_op_options *opts, hora_request **req) {
  if (!result) {
    if (req) {
      *req = NULL;
    }
    return hora__error(HORA_ERR_INVALID_ARG, "hora_allgatherv_alloc_async: result is NULL");
  }
  struct v_args a = {.kind = HORA_KIND_ALLGATHERV, .call = "hora_allgatherv_alloc_async",
                     .name = name, .sendbuf = sendbuf, .count = count, .result = result,
                     .dtype = dtype, .opts = opts};
  return v_submit(&a, req);
}

HORA_EXTERN int hora_alltoall_async(const char *name, const void *sendbuf,
                                    const size_t *send_counts, void *recvbuf,
                                    const size_t *recv_counts, hora_dtype dtype,
                                    hora_request **req) {
  struct v_args a = {.kind = HORA_KIND_ALLTOALL, .call = "hora_alltoall_async", .name = name,
                     .sendbuf = sendbuf, .send_counts = send_counts, .recvbuf = recvbuf,
                     .recv_counts = recv_counts, .dtype = dtype};
  return v_submit(&a, req);
}

HORA_EXTERN int hora_alltoall(const char *name, const void *sendbuf, const size_t *send_counts,
                              void *recvbuf, const size_t *recv_counts, hora_dtype dtype) {
  hora_request *r = NULL;
  HORA_CHECK(hora_alltoall_async(name, sendbuf, send_counts, recvbuf, recv_counts, dtype, &r));
  return hora_wait(&r);
}

HORA_EXTERN int hora_alltoall_async_ex(const char *name, const void *sendbuf, size_t count,
                                       const size_t *send_counts, void *recvbuf,
                                       const size_t *recv_counts, hora_dtype dtype,
                                       const hora_op_options *opts, hora_request **req) {
  struct v_args a = {.kind = HORA_KIND_ALLTOALL, .call = "hora_alltoall_async_ex", .name = name,
                     .sendbuf = sendbuf, .count = count, .send_counts = send_counts,
                     .equal = true, .recvbuf = recvbuf, .recv_counts = recv_counts,
                     .dtype = dtype, .opts = opts};
  return v_submit(&a, req);
}

HORA_EXTERN int hora_alltoall_alloc_async(const char *name, const void *sendbuf, size_t count,
                                          const size_t *send_counts, hora_dtype dtype,
                                          hora_received *result, const hora_op_options *opts,
                                          hora_request **req) {
  if (!result) {
    if (req) {
      *req = NULL;
    }
    return hora__error(HORA_ERR_INVALID_ARG, "hora_alltoall_alloc_async: result is NULL");
  }
  struct v_args a = {.kind = HORA_KIND_ALLTOALL, .call = "hora_alltoall_alloc_async",
                     .name = name, .sendbuf = sendbuf, .count = count,
                     .send_counts = send_counts, .equal = true, .result = result,
                     .dtype = dtype, .opts = opts};
  return v_submit(&a, req);
}
