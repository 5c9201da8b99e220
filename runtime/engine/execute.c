/* Running a response: its tensors' requests (or a joined rank's stand-ins),
 * the collective on host or device buffers, HORA_VERIFY, the statistics,
 * and the responses that are not collectives (barrier, error, join,
 * shutdown). */
#include <stdio.h>
#include <stdlib.h>

#include "comm/coll/collectives.h"
#include "comm/gpu/gpu.h"
#include "base/log.h"
#include "base/params.h"
#include "runtime/engine/engine.h"
#include "runtime/observe/metrics.h"
#include "runtime/observe/timeline.h"
#include "runtime/observe/verify.h"

/* ---- execution -------------------------------------------------------------- */

static int missing_tensor(struct hora__engine *e, const struct hora__response *r,
                          const struct hora__resp_tensor *t) {
  char name[300];
  return hora__error(HORA_ERR_PROTOCOL, "rank 0 scheduled %s %s, which this rank never submitted",
                     hora__kind_name(r->kind), hora__key_display(t->key, t->key_len, name, sizeof(name)));
}

static int ensure_buffer(void **buf, size_t *have, size_t need, bool zero) {
  if (*have >= need) {
    return HORA_SUCCESS;
  }
  void *p = hora__aligned_alloc(64, need);
  if (!p) {
    return HORA_ERR_NO_MEMORY;
  }
  if (zero) {
    memset(p, 0, need);
  }
  free(*buf);
  *buf = p;
  *have = need;
  return HORA_SUCCESS;
}

static void timeline_all(const struct hora__response *r, const char *phase) {
  if (!hora__timeline_enabled()) {
    return;
  }
  for (uint32_t i = 0; i < r->ntensors; i++) {
    if (phase) {
      hora__timeline_begin(r->tensors[i].key, r->tensors[i].key_len, phase);
    } else {
      hora__timeline_end(r->tensors[i].key, r->tensors[i].key_len);
    }
  }
}

static hora_dtype wire_dtype(const struct hora__response *r) {
  bool floating = r->dtype == HORA_FLOAT32 || r->dtype == HORA_FLOAT64;
  if (!floating || r->compression == HORA_COMPRESSION_NONE) {
    return (hora_dtype)r->dtype;
  }
  return r->compression == HORA_COMPRESSION_FP16 ? HORA_FLOAT16 : HORA_BFLOAT16;
}

/* Whether request q asked for what tensor i of response r runs; if not,
 * says how they differ ("allreduce 'x': rank 1 submitted 10 elements, the
 * response it ran under has 20"), in the order rank 0's mismatch messages
 * use. */
bool hora__engine_request_matches(const struct hora__response *r, uint32_t i, int rank,
                            const struct hora_request *q, char *msg, size_t size) {
  struct hora__op_meta m;
  const struct hora__op_meta *f = &q->meta;
  hora__response_meta(r, i, &m);
  char name[300], what[360];
  hora__key_display(q->key, q->key_len, name, sizeof(name));
  snprintf(what, sizeof(what), "%s %s: rank %d submitted", hora__kind_name(f->kind), name, rank);
  const char *ran = "the response it ran under";
  bool allreduce = hora__kind_stands_in(m.kind); /* the reductions: op, scales, compression */
  if (f->kind != m.kind) {
    snprintf(msg, size, "%s it, %s is a %s", what, ran, hora__kind_name(m.kind));
  } else if (f->device != m.device) {
    snprintf(msg, size, "%s %s memory, %s is for %s memory", what, f->device ? "GPU" : "host",
             ran, m.device ? "GPU" : "host");
  } else if (f->dtype != m.dtype) {
    snprintf(msg, size, "%s %s, %s has %s", what, hora_dtype_name(f->dtype), ran,
             hora_dtype_name(m.dtype));
  } else if (f->count != m.count) {
    snprintf(msg, size, "%s %llu elements, %s has %llu", what, (unsigned long long)f->count, ran,
             (unsigned long long)m.count);
  } else if (f->shape != m.shape) {
    char shape[400];
    snprintf(msg, size, "%s %s, %s has %s", what, hora__shape_format(&q->shape, shape, sizeof(shape)),
             ran, m.shape ? "another shape" : "none");
  } else if (m.kind == HORA_KIND_BROADCAST && f->root != m.root) {
    snprintf(msg, size, "%s root %d, %s has root %d", what, f->root, ran, m.root);
  } else if (allreduce && f->op != m.op) {
    snprintf(msg, size, "%s %s, %s has %s", what, hora_op_name(f->op), ran, hora_op_name(m.op));
  } else if (allreduce && f->compression != m.compression) {
    snprintf(msg, size, "%s compression %u, %s has %u", what, f->compression, ran, m.compression);
  } else if (allreduce && (f->prescale != m.prescale || f->postscale != m.postscale)) {
    snprintf(msg, size, "%s prescale %g and postscale %g, %s has %g and %g", what, f->prescale,
             f->postscale, ran, m.prescale, m.postscale);
  } else {
    return true;
  }
  return false;
}

/* Looks up the local request of every tensor; a joined rank may lack some.
 * A request that asked for something else than the response runs (a
 * joined rank's other thread submitting a name it stands in for, with its
 * own count) fails with HORA_ERR_MISMATCH, and this rank stands in for it
 * with zeros like a joined rank: sized from its request, the collective
 * would run past the caller's buffers. The others' allreduce goes on. */
static int gather_requests(struct hora__set *set, const struct hora__response *r, bool *joined) {
  HORA_CHECK(hora__engine_grow_reqs(set, r->ntensors));
  pthread_mutex_lock(&set->e->rt->mu);
  *joined = set->e->rt->joined;
  pthread_mutex_unlock(&set->e->rt->mu);
  for (uint32_t i = 0; i < r->ntensors; i++) {
    struct hora_request *q = hora__engine_lookup(set->e, &r->tensors[i]);
    char msg[700];
    bool retired = q && q->placeholder;
    if (retired) {
      hora__engine_retire_placeholder(set->e, q);
      q = NULL;
    }
    if (q && !hora__engine_request_matches(r, i, set->e->rt->rank, q, msg, sizeof(msg))) {
      bool stand_in = hora__kind_stands_in(r->kind);
      HORA_WARN("%s%s", msg, stand_in ? "; it fails, and this rank adds zeros to the others'" : "");
      hora__engine_fail_mismatched(set->e, q, msg);
      if (!stand_in) {
        /* Ranks agree on what a broadcast or an allgather moves before it
         * is scheduled, so rank 0 and this rank no longer do. */
        return hora__error(HORA_ERR_PROTOCOL, "rank 0 scheduled a response this rank cannot "
                           "take part in: %s", msg);
      }
      set->reqs[i] = NULL;
      continue;
    }
    set->reqs[i] = q;
    /* (Rank 0 schedules a broadcast for joined ranks only from a root that
     * has not joined: they receive it into stand-ins.) */
    bool receives = hora__kind_joined_takes_part(r->kind) || r->kind == HORA_KIND_BROADCAST;
    if (!q && !((*joined || retired) && receives)) {
      return missing_tensor(set->e, r, &r->tensors[i]);
    }
  }
  return HORA_SUCCESS;
}

static void account(struct hora__set *set, const struct hora__response *r, uint64_t start_ns,
                    uint64_t comm_ns) {
  struct hora__runtime *rt = set->e->rt;
  size_t esize = hora_dtype_size((hora_dtype)r->dtype);
  uint64_t bytes = 0, negotiate = 0;
  for (uint32_t i = 0; i < r->ntensors; i++) {
    bytes += r->tensors[i].count * esize;
    struct hora_request *q = set->reqs[i];
    if (q && start_ns > q->submit_ns) {
      negotiate += start_ns - q->submit_ns;
    }
    if (q) {
      q->start_ns = start_ns;
      q->ran_ns = start_ns + comm_ns;
    }
  }
  atomic_uint_fast64_t *kind = r->kind == HORA_KIND_ALLREDUCE       ? &rt->stats.allreduces
                               : r->kind == HORA_KIND_BROADCAST     ? &rt->stats.broadcasts
                               : r->kind == HORA_KIND_REDUCESCATTER ? &rt->stats.reducescatters
                                                                    : &rt->stats.allgathers;
  atomic_fetch_add(kind, r->ntensors);
  atomic_fetch_add(&rt->stats.bytes, bytes);
  hora__metrics_account(rt, r->kind, r->dtype, r->ntensors, bytes, r->eager ? 0 : comm_ns);
  atomic_fetch_add(&rt->stats.negotiate_ns, negotiate);
  atomic_fetch_add(&rt->stats.communicate_ns, comm_ns - HORA_MIN(comm_ns, set->copy_ns));
  atomic_fetch_add(&rt->stats.copy_ns, set->copy_ns);
  if (r->ntensors > 1) {
    atomic_fetch_add(&rt->stats.fused_batches, 1);
    atomic_fetch_add(&rt->stats.fused_tensors, r->ntensors);
  }
}

/* Runs of responses, numbered for the timeline: a fused batch's tensors
 * share the number (hora-report counts batches and their sizes by it). */
static atomic_uint_fast64_t timeline_batches;

/* Begins `phase` on every row of the response running, the args saying
 * which batch it is, its kind, size and rank count, and the tensor's bytes. */
static void timeline_phase(struct hora__set *set, const char *phase) {
  const struct hora__response *r = set->current;
  if (!hora__timeline_enabled() || !r) {
    return;
  }
  if (set->timeline_batch == 0) {
    set->timeline_batch = atomic_fetch_add(&timeline_batches, 1) + 1;
  }
  size_t esize = hora_dtype_size((hora_dtype)r->dtype);
  uint64_t total = 0;
  for (uint32_t i = 0; i < r->ntensors; i++) {
    total += r->tensors[i].count * esize;
  }
  for (uint32_t i = 0; i < r->ntensors; i++) {
    char args[256];
    snprintf(args, sizeof(args),
             "{\"batch\":%llu,\"op\":\"%s\",\"tensors\":%u,\"bytes\":%llu,"
             "\"batch_bytes\":%llu,\"ranks\":%d,\"dtype\":\"%s\"}",
             (unsigned long long)set->timeline_batch, hora__kind_name(r->kind), r->ntensors,
             (unsigned long long)(r->tensors[i].count * esize), (unsigned long long)total,
             set->comm->size, hora_dtype_name((hora_dtype)r->dtype));
    hora__timeline_begin_args(r->tensors[i].key, r->tensors[i].key_len, phase, args);
  }
}

/* The algorithms report their phases: timeline rows, and the copy time. */
void hora__engine_phase(void *arg, const char *name) {
  struct hora__set *set = arg;
  if (name) {
    set->phase_ns = hora__now_ns();
    set->phase_is_copy = strncmp(name, "MEMCPY", 6) == 0;
  } else if (set->phase_is_copy) {
    set->copy_ns += hora__now_ns() - set->phase_ns;
    set->phase_is_copy = false;
  }
  if (name) {
    timeline_phase(set, name);
  } else {
    timeline_all(set->current, NULL);
  }
}

static int grow_iovs(struct hora__set *set, uint32_t n) {
  if (n <= set->iov_cap) {
    return HORA_SUCCESS;
  }
  struct hora__iov *in = hora__realloc(set->iov_in, n * sizeof(*in));
  if (!in) {
    return HORA_ERR_NO_MEMORY;
  }
  set->iov_in = in;
  struct hora__iov *out = hora__realloc(set->iov_out, n * sizeof(*out));
  if (!out) {
    return HORA_ERR_NO_MEMORY;
  }
  set->iov_out = out;
  set->iov_cap = n;
  return HORA_SUCCESS;
}

/* HORA_VERIFY: every rank checks that it holds the same result bits. */
static int verify(struct hora__set *set, const struct hora__response *r) {
  const struct hora__iov *out = set->iov_out; /* (an allgather's: the whole result) */
  int n = r->kind == HORA_KIND_ALLGATHER ? 1 : (int)r->ntensors;
  if (hora__params.VERIFY_CORRUPT_RANK == set->e->rt->rank) {
    for (int i = 0; i < n; i++) {
      if (out[i].len) {
        ((uint8_t *)out[i].base)[out[i].len / 2] ^= 0x10;
        break;
      }
    }
  }
  char name[160], what[256];
  hora__key_display(r->tensors[0].key, r->tensors[0].key_len, name, sizeof(name));
  if (r->ntensors > 1) {
    snprintf(what, sizeof(what), "%s %s (fused with %u more)", hora__kind_name(r->kind), name,
             r->ntensors - 1);
  } else {
    snprintf(what, sizeof(what), "%s %s", hora__kind_name(r->kind), name);
  }
  hora__engine_phase(set, "VERIFY");
  int rc = hora__verify_result(set->comm, out, n, what);
  hora__engine_phase(set, NULL);
  return rc;
}

/* Device buffers: the device data plane, on the runtime's stream. A
 * joined rank's stand-ins are device memory there (NULL entries here). */
/* Device requests' events: the runtime stream waits for each tensor's
 * `ready`, and records its `done`. Waits for the GPU unless every tensor
 * is a stream-ordered request of this rank. */
static int device_events(struct hora__set *set, const struct hora__response *r, bool *wait) {
  if (set->events_cap < r->ntensors) {
    void **ready = realloc(set->ready, r->ntensors * sizeof(void *));
    void **done = ready ? realloc(set->done, r->ntensors * sizeof(void *)) : NULL;
    if (ready) {
      set->ready = ready;
    }
    if (!ready || !done) {
      return hora__error(HORA_ERR_NO_MEMORY, "event lists of %u tensors", r->ntensors);
    }
    set->done = done;
    set->events_cap = r->ntensors;
  }
  *wait = false;
  for (uint32_t i = 0; i < r->ntensors; i++) {
    struct hora_request *q = set->reqs[i];
    set->ready[i] = q ? q->ready_event : NULL;
    set->done[i] = q ? q->done_event : NULL;
    *wait = *wait || !q || !q->done_event;
  }
  return HORA_SUCCESS;
}

/* The response as one operation of the data plane, which picks the
 * backend (comm/coll/select.c). */
static int run_op(struct hora__set *set, const struct hora__response *r, size_t total,
                  size_t bytes, const struct hora__coll_opts *opts) {
  hora__comm *c = set->comm;
  struct hora__coll_op op = {
      .kind = (enum hora__coll_kind)r->kind,
      .in = set->iov_in,
      .out = set->iov_out,
      .n = (int)r->ntensors,
      .count = total,
      .bytes = bytes,
      .dtype = (hora_dtype)r->dtype,
      .wire = wire_dtype(r),
      .op = (hora_op)r->op,
      .root = r->root,
      .opts = opts,
      .device = r->device,
  };
  if (r->kind == HORA_KIND_ALLGATHER) {
    /* (A joined rank's stand-in: zeros in, and its output as large as the whole.) */
    struct hora_request *q = set->reqs[0];
    if (q) {
      set->iov_in[0] = (struct hora__iov){(void *)(uintptr_t)q->sendbuf, bytes};
      set->iov_out[0] = (struct hora__iov){q->recvbuf, bytes * (size_t)c->size};
    } else {
      set->iov_out[0].len = bytes * (size_t)c->size;
    }
    op.n = 1;
  }
  if (r->kind == HORA_KIND_REDUCESCATTER) {
    /* Never fused: one tensor, of which this rank keeps its block (a
     * joined rank's stand-in output is as large as the whole). */
    op.unit = r->root > 0 ? total / (size_t)r->root : 1;
    size_t start, len;
    hora__block_range(total, op.unit, c->size, c->rank, &start, &len);
    if (r->root < 0) {
      /* Explicit counts (hora_reducescatterv_async): this rank's from its
       * request; a joined rank keeps nothing. */
      struct hora_request *q = set->reqs[0];
      op.unit = 0;
      start = len = 0;
      for (int j = 0; q && q->v_recv && j <= c->rank; j++) {
        start += j < c->rank ? q->v_recv[j] : 0;
        len = q->v_recv[j];
      }
      op.block_start = start;
      op.block_len = len;
    }
    if (set->reqs[0]) {
      set->iov_out[0].len = len * hora_dtype_size((hora_dtype)r->dtype);
    }
  }
  if (r->device) {
    HORA_CHECK(device_events(set, r, &op.wait));
    op.ready = set->ready;
    op.done = set->done;
    return hora__coll_run(c, &op);
  }
  bool marks = r->kind == HORA_KIND_ALLGATHER;
  if (marks) {
    hora__engine_phase(set, "ALLGATHER");
  }
  int rc = hora__coll_run(c, &op);
  if (marks) {
    hora__engine_phase(set, NULL);
  }
  /* (A reducescatter's ranks hold different blocks: nothing to compare.) */
  if (rc == HORA_SUCCESS && hora__params.VERIFY && r->kind != HORA_KIND_REDUCESCATTER) {
    rc = verify(set, r);
  }
  return rc;
}

/* An operation whose result came with its cycle (cycle_steps.c): copied
 * out and scaled as the collective would have (a stand-in never gets here:
 * every rank sent its data). An allreduce's result is the whole tensor, a
 * broadcast's the root's buffer (which the root holds already), an
 * allgather's every block, and a reducescatter keeps its own block of the
 * reduction. Never fused: one tensor. */
static int copy_eager(struct hora__set *set, const struct hora__response *r, size_t count,
                      const struct hora__coll_opts *opts) {
  static const char *const phases[] = {"ALLREDUCE", "BROADCAST", "ALLGATHER", "REDUCESCATTER"};
  hora__comm *c = set->comm;
  hora_dtype dtype = (hora_dtype)r->dtype;
  struct hora_request *q = set->reqs[0];
  if (r->kind > HORA_KIND_REDUCESCATTER || r->ntensors != 1 || !q) {
    return hora__error(HORA_ERR_PROTOCOL, "an eager %s of %u tensors came without this "
                       "rank's request", hora__kind_name(r->kind), r->ntensors);
  }
  hora__engine_phase(set, phases[r->kind]);
  size_t esize = hora_dtype_size(dtype), start = 0, len = count;
  switch (r->kind) {
    case HORA_KIND_BROADCAST:
      if (c->rank != r->root) {
        memcpy(q->recvbuf, r->eager, count * esize);
      }
      break;
    case HORA_KIND_ALLGATHER:
      memcpy(q->recvbuf, r->eager, count * esize * (size_t)c->size);
      break;
    case HORA_KIND_REDUCESCATTER:
      hora__block_range(count, r->root > 0 ? count / (size_t)r->root : 1, c->size, c->rank,
                        &start, &len);
      /* fall through */
    default:
      if (len) {
        memcpy(q->recvbuf, (const uint8_t *)r->eager + start * esize, len * esize);
        hora__post_apply(opts, dtype, q->recvbuf, len);
      }
      break;
  }
  hora__engine_phase(set, NULL);
  atomic_fetch_add(r->kind == HORA_KIND_ALLREDUCE ? &set->e->rt->stats.eager
                                                  : &set->e->rt->stats.eager_collectives, 1);
  return HORA_SUCCESS;
}

static int run_collective(struct hora__set *set, const struct hora__response *r) {
  hora__comm *c = set->comm;
  size_t esize = hora_dtype_size((hora_dtype)r->dtype);
  bool joined;
  HORA_CHECK(gather_requests(set, r, &joined));
  HORA_CHECK(grow_iovs(set, r->ntensors));
  /* A joined rank stands in with zeros for what it did not submit, each
   * tensor in its own place: the algorithm must see the same shape of
   * buffers on every rank, and peers may read any of them. (The device
   * data plane keeps its own stand-ins.) */
  size_t missing = 0;
  for (uint32_t i = 0; i < r->ntensors && !r->device; i++) {
    if (!set->reqs[i]) {
      missing += r->tensors[i].count * esize;
    }
  }
  if (missing) {
    HORA_CHECK(ensure_buffer(&set->zeros, &set->zeros_bytes, missing, true));
    size_t out = r->kind == HORA_KIND_ALLGATHER ? missing * (size_t)c->size : missing;
    HORA_CHECK(ensure_buffer(&set->junk, &set->junk_bytes, out, false));
  }
  size_t total = 0, bytes = 0, stand_in = 0;
  for (uint32_t i = 0; i < r->ntensors; i++) {
    size_t b = r->tensors[i].count * esize;
    struct hora_request *q = set->reqs[i];
    if (q) {
      set->iov_in[i] = (struct hora__iov){(void *)(uintptr_t)q->sendbuf, b};
      set->iov_out[i] = (struct hora__iov){q->recvbuf, b};
    } else if (r->device) {
      set->iov_in[i] = set->iov_out[i] = (struct hora__iov){NULL, b};
    } else {
      set->iov_in[i] = (struct hora__iov){(char *)set->zeros + stand_in, b};
      set->iov_out[i] = (struct hora__iov){(char *)set->junk + stand_in, b};
      stand_in += b;
    }
    total += r->tensors[i].count;
    bytes += b;
  }
  struct hora__coll_opts opts = {
      .prescale = r->prescale,
      .divisor = r->op == HORA_AVERAGE ? c->size : 0,
      .postscale = r->postscale,
      .device = r->device,
      .phase = hora__engine_phase,
      .phase_arg = set,
  };
  set->current = r;
  set->timeline_batch = 0;
  set->copy_ns = 0;
  timeline_all(r, NULL); /* QUEUE ends */
  uint64_t start = hora__now_ns();
  int rc = r->eager ? copy_eager(set, r, total, &opts) : run_op(set, r, total, bytes, &opts);
  set->current = NULL;
  HORA_CHECK(rc);
  account(set, r, start, hora__now_ns() - start);
  hora__engine_complete(set->e, set->reqs, r->ntensors, HORA_SUCCESS, NULL);
  return HORA_SUCCESS;
}

/* Barriers and unnamed operations are keyed by per-rank sequence numbers.
 * A rank that had joined submits none, yet the others' run (stood in for)
 * or fail (refused because of the join): it counts them too, so that after
 * the join every rank's next number is the same. */
static void keep_sequences_in_step(struct hora__engine *e, const struct hora__response *r) {
  for (uint32_t i = 0; i < r->ntensors; i++) {
    const struct hora__resp_tensor *t = &r->tensors[i];
    if (t->key_len < 2 || (t->key[0] != HORA_KEY_BARRIER && t->key[0] != HORA_KEY_UNNAMED)) {
      continue;
    }
    uint64_t n = 0;
    for (uint16_t k = 1; k < t->key_len; k++) {
      n = n * 10 + (uint64_t)(t->key[k] - '0');
    }
    struct hora__runtime *rt = e->rt;
    pthread_mutex_lock(&rt->mu);
    uint64_t *seq = t->key[0] == HORA_KEY_BARRIER ? &rt->barrier_seq : &rt->unnamed_seq;
    if (*seq <= n) {
      *seq = n + 1;
    }
    pthread_mutex_unlock(&rt->mu);
  }
}

int hora__engine_execute(struct hora__set *set, const struct hora__response *r) {
  struct hora_request *q = NULL;
  keep_sequences_in_step(set->e, r);
  switch (r->kind) {
    case HORA_KIND_ALLREDUCE:
    case HORA_KIND_BROADCAST:
    case HORA_KIND_ALLGATHER:
    case HORA_KIND_REDUCESCATTER:
      return run_collective(set, r);
    case HORA_KIND_ALLGATHERV:
    case HORA_KIND_ALLTOALL:
      return hora__engine_run_exchange(set, r);
    case HORA_KIND_BARRIER:
      q = hora__engine_lookup(set->e, &r->tensors[0]);
      if (!q) {
        return missing_tensor(set->e, r, &r->tensors[0]);
      }
      timeline_all(r, NULL);
      hora__engine_complete(set->e, &q, 1, HORA_SUCCESS, NULL);
      return HORA_SUCCESS;
    case HORA_KIND_ERROR:
      for (uint32_t i = 0; i < r->ntensors; i++) {
        hora__engine_fail_by_key(set->e, &r->tensors[i], r->error_code,
                                 r->error_msg ? r->error_msg : "");
      }
      return HORA_SUCCESS;
    case HORA_KIND_JOIN: {
      struct hora__resp_tensor t = {.key = (char[]){HORA_KEY_JOIN, 0}, .key_len = 1};
      struct hora__runtime *rt = set->e->rt;
      pthread_mutex_lock(&rt->mu);
      struct hora_request *j = hora__table_get(&rt->inflight, t.key, t.key_len);
      rt->joined = false;
      if (j) {
        j->last_joined = r->last_joined;
        hora__request_complete_locked(rt, j, HORA_SUCCESS, NULL);
        pthread_cond_broadcast(&rt->done_cv);
      }
      pthread_mutex_unlock(&rt->mu);
      return HORA_SUCCESS;
    }
    case HORA_KIND_SHUTDOWN: {
      struct hora__resp_tensor t = {.key = (char[]){HORA_KEY_SHUTDOWN, 0}, .key_len = 1};
      struct hora_request *s = hora__engine_lookup(set->e, &t);
      hora__engine_complete(set->e, &s, 1, HORA_SUCCESS, NULL);
      set->e->stop = true;
      return HORA_SUCCESS;
    }
    default:
      return hora__error(HORA_ERR_PROTOCOL, "response of unknown kind %u", r->kind);
  }
}
