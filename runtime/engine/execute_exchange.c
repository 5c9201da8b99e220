/* Running an allgatherv or an alltoall. Their counts are each rank's own,
 * so the members first allgather one record each: what they send (one
 * count, or one per rank) and a fingerprint of what they expect to receive
 * (0: anything, for the allocating forms and joined ranks); on one host
 * also where its send blocks lie, so the single-copy read that follows
 * needs one barrier, not two. From the
 * records every member sees the same thing: what each rank receives, the
 * largest block, and whether anyone expects something else; then either
 * all move the data or all fail with the same message, and nothing is
 * written. */
#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/coll/collectives.h"
#include "runtime/engine/engine.h"
#include "runtime/observe/metrics.h"
#include "runtime/observe/timeline.h"
#include "runtime/observe/verify.h"

static uint64_t counts_fingerprint(const uint64_t *v, size_t stride, int n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int i = 0; i < n; i++) {
    uint64_t x = v[(size_t)i * stride];
    for (int b = 0; b < 8; b++) {
      h ^= (uint8_t)(x >> (8 * b));
      h *= 0x100000001b3ull;
    }
  }
  return h | 1;
}

/* "3, 0, 5" (at most what fits). */
static void format_counts(const uint64_t *v, size_t stride, int n, char *buf, size_t size) {
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && o + 32 < size; i++) {
    o += (size_t)snprintf(buf + o, size - o, "%s%llu", i ? ", " : "",
                          (unsigned long long)v[(size_t)i * stride]);
  }
  if (o + 32 >= size && n > 0) {
    snprintf(buf + o, size - o, ", ...");
  }
}

struct exchange {
  struct hora__set *set;
  const struct hora__response *r;
  struct hora_request *q; /* NULL: a joined rank's stand-in */
  bool alltoall;
  int p, me;
  size_t es, width; /* width: u64 per record, the fingerprint last */
  uint64_t *all;    /* [p * width] every member's record */
  size_t *send_bytes, *recv_bytes, *counts; /* [p] each */
  size_t most, total;
  const void *sendbuf; /* what is sent: the request's, or a copy (in place) */
  void *send_copy;
  bool published; /* the records went out with where the blocks lie */
};

/* The rank whose expectation differs from what it is sent, or -1; *msg
 * then names it and what it is sent. */
static int first_disagreeing(const struct exchange *x, char *msg, size_t size) {
  char name[300], got[400];
  for (int j = 0; j < x->p; j++) {
    uint64_t want = x->all[(size_t)j * x->width + x->width - 1];
    const uint64_t *v = x->alltoall ? x->all + j : x->all;
    if (want && want != counts_fingerprint(v, x->width, x->p)) {
      hora__key_display(x->r->tensors[0].key, x->r->tensors[0].key_len, name, sizeof(name));
      format_counts(v, x->width, x->p, got, sizeof(got));
      snprintf(msg, size, "%s%s %s: rank %d expects other recv_counts than the ranks send it (%s "
               "elements from ranks 0..%d); an _alloc form learns them",
               x->set->e->rt->label, hora__kind_name(x->r->kind), name,
               hora__global_rank(x->set->e->rt, j), got, x->p - 1);
      return j;
    }
  }
  return -1;
}

/* An alltoall in place (or overlapping) sends from a copy, made before
 * its blocks are published. */
static int choose_sendbuf(struct exchange *x) {
  struct hora_request *q = x->q;
  x->sendbuf = q ? q->sendbuf : NULL;
  if (!q || !x->alltoall || !q->v_recv || x->r->device) {
    return HORA_SUCCESS; /* (an _alloc form's result is new memory) */
  }
  size_t sent = 0, got = 0;
  for (int j = 0; j < x->p; j++) {
    sent += q->v_send[j] * x->es;
    got += q->v_recv[j] * x->es;
  }
  const char *s = q->sendbuf, *d = q->recvbuf;
  if (sent && got && s < d + got && d < s + sent) {
    if (!(x->send_copy = hora__malloc(sent))) {
      return HORA_ERR_NO_MEMORY;
    }
    memcpy(x->send_copy, q->sendbuf, sent);
    x->sendbuf = x->send_copy;
  }
  return HORA_SUCCESS;
}

static int exchange_counts(struct exchange *x) {
  struct hora_request *q = x->q;
  size_t w = x->width;
  uint64_t *mine = hora__calloc(w, sizeof(uint64_t));
  uint64_t *want = hora__malloc((size_t)x->p * sizeof(uint64_t));
  size_t *at = hora__calloc((size_t)x->p, sizeof(size_t)); /* where its block for each begins */
  x->all = hora__calloc((size_t)x->p * w, sizeof(uint64_t));
  if (!mine || !want || !at || !x->all) {
    free(mine);
    free(want);
    free(at);
    return HORA_ERR_NO_MEMORY;
  }
  if (q) {
    for (size_t j = 0; j + 1 < w; j++) {
      mine[j] = x->alltoall ? q->v_send[j] : q->v_count;
    }
    for (int j = 0; q->v_recv && j < x->p; j++) {
      want[j] = q->v_recv[j];
    }
    if (q->v_recv) {
      mine[w - 1] = counts_fingerprint(want, 1, x->p);
    }
    for (int j = 1; x->alltoall && j < x->p; j++) {
      at[j] = at[j - 1] + q->v_send[j - 1] * x->es;
    }
  }
  int rc = choose_sendbuf(x);
  hora__engine_phase(x->set, "EXCHANGE_COUNTS");
  if (rc == HORA_SUCCESS && x->r->device) {
    rc = hora__allgather(x->set->comm, mine, w * sizeof(uint64_t), x->all);
  } else if (rc == HORA_SUCCESS) {
    rc = hora__exchange_records(x->set->comm, mine, w, x->all, x->sendbuf,
                                x->alltoall ? at : NULL, &x->published);
  }
  hora__engine_phase(x->set, NULL);
  free(mine);
  free(want);
  free(at);
  return rc;
}

/* Sizes from the records: what this rank sends and receives, the largest
 * block anywhere, the total it receives. */
static int plan_sizes(struct exchange *x) {
  int p = x->p;
  x->send_bytes = hora__calloc(3 * (size_t)p, sizeof(size_t));
  if (!x->send_bytes) {
    return HORA_ERR_NO_MEMORY;
  }
  x->recv_bytes = x->send_bytes + p;
  x->counts = x->recv_bytes + p;
  uint64_t limit = (SIZE_MAX >> 4) / x->es;
  for (int j = 0; j < p; j++) {
    for (size_t k = 0; k + 1 < x->width; k++) {
      uint64_t c = x->all[(size_t)j * x->width + k];
      if (c > limit) {
        return hora__error(HORA_ERR_PROTOCOL, "%s: rank %d sends %llu elements",
                           hora__kind_name(x->r->kind), j, (unsigned long long)c);
      }
      x->most = HORA_MAX(x->most, (size_t)c * x->es);
    }
    uint64_t in = x->all[(size_t)j * x->width + (x->alltoall ? (size_t)x->me : 0)];
    x->counts[j] = (size_t)in;
    x->recv_bytes[j] = (size_t)in * x->es;
    if (x->total > limit - in) {
      return hora__error(HORA_ERR_INVALID_ARG, "%s: the counts add up to more than a byte count",
                         hora__kind_name(x->r->kind));
    }
    x->total += (size_t)in;
    if (x->q && x->alltoall) {
      x->send_bytes[j] = x->q->v_send[j] * x->es;
    }
  }
  if (x->q && !x->alltoall) {
    x->send_bytes[x->me] = x->q->v_count * x->es;
  }
  return HORA_SUCCESS;
}

/* What this rank sends: its block, or its blocks for every rank. */
static size_t bytes_sent(const struct exchange *x) {
  size_t bytes = x->alltoall ? 0 : x->send_bytes[x->me];
  for (int j = 0; x->alltoall && j < x->p; j++) {
    bytes += x->send_bytes[j];
  }
  return bytes;
}

static void account(struct exchange *x, uint64_t start_ns) {
  struct hora__runtime *rt = x->set->e->rt;
  uint64_t bytes = bytes_sent(x);
  atomic_fetch_add(x->alltoall ? &rt->stats.alltoalls : &rt->stats.allgathers, 1);
  atomic_fetch_add(&rt->stats.bytes, bytes);
  if (x->q && start_ns > x->q->submit_ns) {
    atomic_fetch_add(&rt->stats.negotiate_ns, start_ns - x->q->submit_ns);
  }
  uint64_t now = hora__now_ns();
  hora__metrics_account(rt, x->r->kind, x->r->dtype, 1, bytes, now - start_ns);
  atomic_fetch_add(&rt->stats.communicate_ns, now - start_ns);
  if (x->q) {
    x->q->start_ns = start_ns;
    x->q->ran_ns = now;
  }
}

/* Where the result goes: the caller's recvbuf, a new buffer for an _alloc
 * form, or the set's junk for a stand-in. */
static int destination(struct exchange *x, void **out, hora_received *got) {
  size_t bytes = x->total * x->es;
  struct hora_request *q = x->q;
  if (q && !q->v_result) {
    *out = q->recvbuf;
    return HORA_SUCCESS;
  }
  if (q) {
    got->buf = hora__malloc(HORA_MAX(bytes, (size_t)1));
    got->counts = hora__malloc((size_t)x->p * sizeof(size_t));
    if (!got->buf || !got->counts) {
      hora_received_free(got);
      return hora__error(HORA_ERR_NO_MEMORY, "%s: %zu bytes for the result",
                         hora__kind_name(x->r->kind), bytes);
    }
    memcpy(got->counts, x->counts, (size_t)x->p * sizeof(size_t));
    got->total = x->total;
    got->size = x->p;
    *out = got->buf;
    return HORA_SUCCESS;
  }
  struct hora__set *set = x->set;
  if (x->r->device) {
    *out = NULL;
    return HORA_SUCCESS;
  }
  if (set->junk_bytes < bytes) {
    void *j = hora__aligned_alloc(64, bytes);
    if (!j) {
      return HORA_ERR_NO_MEMORY;
    }
    free(set->junk);
    set->junk = j;
    set->junk_bytes = bytes;
  }
  *out = set->junk;
  return HORA_SUCCESS;
}

static int move_data(struct exchange *x, void *out) {
  hora__comm *c = x->set->comm;
  struct hora_request *q = x->q;
  struct hora__iov in = {(void *)(uintptr_t)x->sendbuf, bytes_sent(x)};
  struct hora__iov to = {out, x->total * x->es};
  void *ready = q ? q->ready_event : NULL, *done = q ? q->done_event : NULL;
  /* (The device paths mark their own phases: copies, NCCL.) */
  struct hora__coll_opts opts = {.prescale = 1.0, .postscale = 1.0,
                                 .phase = x->r->device ? hora__engine_phase : NULL,
                                 .phase_arg = x->set};
  struct hora__coll_op op = {
      .kind = x->alltoall ? HORA_COLL_ALLTOALL : HORA_COLL_ALLGATHERV,
      .in = &in,
      .out = &to,
      .n = 1,
      .count = x->total,
      .bytes = to.len,
      .dtype = (hora_dtype)x->r->dtype,
      .wire = (hora_dtype)x->r->dtype,
      .send_bytes = x->send_bytes,
      .recv_bytes = x->recv_bytes,
      .most = x->most,
      .published = x->published,
      .opts = &opts,
      /* (A joined rank's stand-in on the device path has out NULL: the
       * device data plane receives into its own scratch.) */
      .device = x->r->device,
      .ready = &ready,
      .done = &done,
      .wait = !done,
  };
  if (x->r->device) {
    /* (Results stay on the device: HORA_VERIFY compares host ones.) */
    return hora__coll_run(c, &op);
  }
  hora__engine_phase(x->set, x->alltoall ? "ALLTOALL" : "ALLGATHERV");
  int rc = hora__coll_run(c, &op);
  hora__engine_phase(x->set, NULL);
  if (rc == HORA_SUCCESS && hora__params.VERIFY && !x->alltoall) {
    /* (An alltoall's ranks hold different data: nothing to compare.) */
    char name[160], what[200];
    hora__key_display(x->r->tensors[0].key, x->r->tensors[0].key_len, name, sizeof(name));
    snprintf(what, sizeof(what), "allgatherv %s", name);
    struct hora__iov iov = {out, x->total * x->es};
    if (hora__params.VERIFY_CORRUPT_RANK == x->set->e->rt->rank && iov.len) {
      ((uint8_t *)out)[iov.len / 2] ^= 0x10;
    }
    hora__engine_phase(x->set, "VERIFY");
    rc = hora__verify_result(c, &iov, 1, what);
    hora__engine_phase(x->set, NULL);
  }
  return rc;
}

/* This rank's request for the response, or NULL where it stands in (it has
 * joined, or its request failed here). */
static int find_request(struct hora__set *set, const struct hora__response *r,
                        struct hora_request **out) {
  struct hora__runtime *rt = set->e->rt;
  pthread_mutex_lock(&rt->mu);
  bool joined = rt->joined;
  pthread_mutex_unlock(&rt->mu);
  struct hora_request *q = hora__engine_lookup(set->e, &r->tensors[0]);
  bool retired = q && q->placeholder;
  if (retired) {
    hora__engine_retire_placeholder(set->e, q);
    q = NULL;
  }
  char msg[700];
  if (q && !hora__engine_request_matches(r, 0, rt->rank, q, msg, sizeof(msg))) {
    HORA_WARN("%s; it fails, and this rank takes part sending nothing", msg);
    hora__engine_fail_mismatched(set->e, q, msg);
    q = NULL;
    retired = true;
  }
  if (!q && !joined && !retired) {
    char name[300];
    return hora__error(HORA_ERR_PROTOCOL, "rank 0 scheduled %s %s, which this rank never "
                       "submitted", hora__kind_name(r->kind),
                       hora__key_display(r->tensors[0].key, r->tensors[0].key_len, name,
                                         sizeof(name)));
  }
  *out = q;
  return HORA_SUCCESS;
}

int hora__engine_run_exchange(struct hora__set *set, const struct hora__response *r) {
  hora__comm *c = set->comm;
  struct exchange x = {.set = set, .r = r, .alltoall = r->kind == HORA_KIND_ALLTOALL,
                       .p = c->size, .me = c->rank, .es = hora_dtype_size((hora_dtype)r->dtype)};
  x.width = (x.alltoall ? (size_t)x.p : 1) + 1;
  HORA_CHECK(find_request(set, r, &x.q));
  set->current = r;
  set->timeline_batch = 0;
  set->copy_ns = 0;
  if (hora__timeline_enabled()) {
    hora__timeline_end(r->tensors[0].key, r->tensors[0].key_len); /* QUEUE ends */
  }
  uint64_t start = hora__now_ns();
  hora_received got = {0};
  char msg[1024];
  int rc = exchange_counts(&x);
  if (rc == HORA_SUCCESS) {
    rc = plan_sizes(&x);
  }
  if (rc == HORA_SUCCESS && first_disagreeing(&x, msg, sizeof(msg)) >= 0) {
    /* Every member found the same: all fail it, and go on. */
    if (x.q) {
      hora__engine_complete(set->e, &x.q, 1, HORA_ERR_MISMATCH, msg);
    }
    goto out;
  }
  void *dest = NULL;
  if (rc == HORA_SUCCESS) {
    rc = destination(&x, &dest, &got);
  }
  if (rc == HORA_SUCCESS) {
    rc = move_data(&x, dest);
  }
  if (rc != HORA_SUCCESS) {
    hora_received_free(&got);
    goto out;
  }
  account(&x, start);
  if (x.q) {
    if (x.q->v_result) {
      *x.q->v_result = got;
    }
    hora__engine_complete(set->e, &x.q, 1, HORA_SUCCESS, NULL);
  }
out:
  set->current = NULL;
  free(x.all);
  free(x.send_bytes);
  free(x.send_copy);
  return rc;
}
