/* Negotiation at rank 0: matching submitted operations by key across ranks.
 *
 * Each key seen from some rank gets a pending entry that records which
 * ranks have submitted it and what the first of them asked for. When every
 * rank has submitted it (joined ranks standing in for allreduces), it
 * becomes a response: the operation itself, or an error naming the first
 * disagreement. Responses leave in the order they became ready, which is
 * the order every rank executes them in. */
#include "runtime/negotiate/negotiate.h"

#include <stdio.h>
#include <stdlib.h>

#include "runtime/negotiate/cache.h"
#include "base/log.h"
#include "base/table.h"
#include "runtime/negotiate/controller_state.h"
#include "runtime/negotiate/fusion.h"
#include "runtime/negotiate/stragglers.h"
#include "runtime/observe/timeline.h"

int hora__controller_create(int size, struct hora__controller **out) {
  struct hora__controller *c = hora__calloc(1, sizeof(*c));
  if (!c) {
    return HORA_ERR_NO_MEMORY;
  }
  c->size = size;
  c->joined = hora__calloc((size_t)size, 1);
  c->shutdown = hora__calloc((size_t)size, 1);
  c->last_joined = -1;
  c->ready_tail = &c->ready;
  if (!c->joined || !c->shutdown) {
    hora__controller_destroy(c);
    return HORA_ERR_NO_MEMORY;
  }
  *out = c;
  return HORA_SUCCESS;
}

static void op_free(struct pending_op *op) {
  free(op->key);
  free(op->have);
  free(op);
}

void hora__controller_destroy(struct hora__controller *c) {
  if (!c) {
    return;
  }
  for (struct pending_op *op = c->oldest; op;) {
    struct pending_op *n = op->next;
    op_free(op);
    op = n;
  }
  hora__table_free(&c->ops);
  while (c->ready) {
    struct hora__response *n = c->ready->next;
    hora__response_free(c->ready);
    c->ready = n;
  }
  hora__ctl_groups_free(c);
  free(c->joined);
  free(c->shutdown);
  free(c);
}

bool hora__controller_has_ready(const struct hora__controller *c) { return c->ready != NULL; }

size_t hora__controller_pending(const struct hora__controller *c) { return c->ops.count; }

int hora__controller_take(struct hora__controller *c, struct hora__response ***tail,
                          int64_t fusion_threshold) {
  HORA_CHECK(hora__responses_fuse(c->ready, &c->ready_tail, fusion_threshold));
  if (c->ready) {
    **tail = c->ready;
    *tail = c->ready_tail;
  }
  c->ready = NULL;
  c->ready_tail = &c->ready;
  c->ready_bytes = 0;
  c->ready_urgent = false;
  return HORA_SUCCESS;
}

void hora__ctl_push_ready(struct hora__controller *c, struct hora__response *r) {
  r->next = NULL;
  if (!c->ready) {
    c->ready_since_ns = hora__now_ns();
  }
  if (hora__response_fusable(r)) {
    c->ready_bytes += hora__response_payload(r);
  } else {
    c->ready_urgent = true;
  }
  *c->ready_tail = r;
  c->ready_tail = &r->next;
}

void hora__ctl_unlink_op(struct hora__controller *c, struct pending_op *op) {
  hora__table_remove(&c->ops, op->key, op->key_len);
  if (op->prev) {
    op->prev->next = op->next;
  } else {
    c->oldest = op->next;
  }
  if (op->next) {
    op->next->prev = op->prev;
  } else {
    c->newest = op->prev;
  }
  op_free(op);
}

/* Formats a rank set as "1,3-5", each rank r shown as names[r] (NULL: r). */
void hora__format_ranks_named(const uint8_t *set, int size, bool want, const int *names,
                              char *buf, size_t n) {
  size_t o = 0;
  buf[0] = '\0';
  for (int r = 0; r < size && o + 24 < n; r++) {
    if ((set[r] != 0) != want) {
      continue;
    }
    int e = r;
    while (e + 1 < size && (set[e + 1] != 0) == want &&
           (!names || names[e + 1] == names[e] + 1)) {
      e++;
    }
    o += (size_t)snprintf(buf + o, n - o, "%s%d", o ? "," : "", names ? names[r] : r);
    if (e > r) {
      o += (size_t)snprintf(buf + o, n - o, "%s%d", e == r + 1 ? "," : "-",
                            names ? names[e] : e);
    }
    r = e;
  }
  if (o + 24 >= n && n > 4) {
    snprintf(buf + n - 4, 4, "...");
  }
}

void hora__format_ranks(const uint8_t *set, int size, bool want, char *buf, size_t n) {
  hora__format_ranks_named(set, size, want, NULL, buf, n);
}

void hora__controller_watch_late(struct hora__controller *c, struct hora__stragglers *late) {
  c->late = late;
}

/* The request that completes an operation came last: the others waited
 * from their mean arrival (or the last such completion, if later: no wait
 * counted twice) until now. */
static void note_late(struct hora__controller *c, struct pending_op *op, int rank) {
  uint64_t now = hora__now_ns();
  op->arrived_sum_ns += now;
  if (!c->late || c->size < 2 || op->nhave != c->size) {
    return;
  }
  uint64_t others = (op->arrived_sum_ns - now) / (uint64_t)(c->size - 1);
  uint64_t from = HORA_MAX(others, c->late_prev_ns);
  hora__stragglers_note(c->late, rank, 1, now > from ? now - from : 0);
  c->late_prev_ns = now;
}

void hora__controller_name(struct hora__controller *c, const int *names, const char *label) {
  c->names = names;
  c->label = label;
}

static int name_of(const struct hora__controller *c, int r) {
  return c->names && r >= 0 && r < c->size ? c->names[r] : r;
}

static int respond_error(struct hora__controller *c, struct pending_op *op, int code,
                         const char *msg) {
  char full[1100];
  snprintf(full, sizeof(full), "%s%s", c->label ? c->label : "", msg);
  return hora__ctl_fail_op(c, op, code, full);
}

static int respond(struct hora__controller *c, struct pending_op *op) {
  struct hora__response *r = hora__response_for(&op->meta, op->key, op->key_len);
  if (!r) {
    return HORA_ERR_NO_MEMORY;
  }
  if (op->meta.group) {
    return hora__ctl_park(c, op, r); /* until the whole group is ready */
  }
  hora__ctl_push_ready(c, r);
  if (hora__timeline_enabled()) {
    hora__timeline_end(op->key, op->key_len);
    hora__timeline_begin(op->key, op->key_len, HORA_PHASE_QUEUE);
  }
  hora__ctl_unlink_op(c, op);
  return HORA_SUCCESS;
}

static void describe_mismatch(const struct hora__controller *c, const struct pending_op *op,
                              const struct variant *va, const struct variant *vb, char *msg,
                              size_t size);

/* Whether the joined ranks take part in op without submitting it: with
 * zeros in a reduction or an allgather, with no elements in an allgatherv
 * or an alltoall, as receivers of a broadcast whose root has not joined
 * (or submitted it before it did). */
static bool joined_stand_in(const struct hora__controller *c, const struct pending_op *op) {
  int root = op->meta.root;
  return hora__kind_joined_takes_part(op->meta.kind) ||
         (op->meta.kind == HORA_KIND_BROADCAST && root >= 0 && root < c->size &&
          (!c->joined[root] || op->have[root]));
}

/* Decides what can be decided about `op` now. */
static int update(struct hora__controller *c, struct pending_op *op) {
  char name[300], ranks[256], msg[1024];
  hora__key_display(op->key, op->key_len, name, sizeof(name));
  const char *kind = hora__kind_name(op->meta.kind);
  uint64_t gf[MAX_VARIANTS];
  uint32_t gs[MAX_VARIANTS];
  for (int i = 0, n = hora__ctl_variant_groups(op, gf, gs); i < n; i++) {
    struct group *g = hora__ctl_group_find(c, gf[i]);
    if (g && g->error) {
      /* A member of a group that has failed. */
      char full[1500];
      snprintf(full, sizeof(full), "%s%s %s fails with its group: %s", c->label ? c->label : "",
               kind, name, g->error);
      return hora__ctl_fail_op(c, op, g->code, full);
    }
  }
  bool in = joined_stand_in(c, op);
  if (!in && c->njoined > 0) {
    hora__format_ranks_named(c->joined, c->size, true, c->names, ranks, sizeof(ranks));
    if (op->meta.kind == HORA_KIND_BROADCAST) {
      snprintf(msg, sizeof(msg),
               "%s %s: its root, rank %d, has called hora_join, so it has nothing to send "
               "(rank(s) %s have joined)",
               kind, name, name_of(c, op->meta.root), ranks);
    } else {
      snprintf(msg, sizeof(msg),
               "%s %s was submitted while rank(s) %s had called hora_join, and cannot run "
               "until every rank has joined",
               kind, name, ranks);
    }
    return respond_error(c, op, HORA_ERR_INVALID_USAGE, msg);
  }
  for (int r = 0; r < c->size; r++) {
    bool stands_in = c->joined[r] && in;
    if (c->shutdown[r] && !op->have[r] && !stands_in) {
      snprintf(msg, sizeof(msg), "%s %s cannot complete: rank %d called hora_finalize without "
               "submitting it", kind, name, name_of(c, r));
      return respond_error(c, op, HORA_ERR_ABORTED, msg);
    }
  }
  int ready = op->nhave;
  if (in) {
    ready += c->njoined - op->nhave_joined;
  }
  if (ready < c->size) {
    return HORA_SUCCESS;
  }
  if (op->nvariants > 1) {
    /* The lowest rank against the lowest rank that asked for something else. */
    const struct variant *a = &op->variants[0], *b = NULL;
    for (int i = 1; i < op->nvariants; i++) {
      if (op->variants[i].lowest_rank < a->lowest_rank) {
        a = &op->variants[i];
      }
    }
    for (int i = 0; i < op->nvariants; i++) {
      const struct variant *v = &op->variants[i];
      if (v != a && (!b || v->lowest_rank < b->lowest_rank)) {
        b = v;
      }
    }
    describe_mismatch(c, op, a, b, msg, sizeof(msg));
    return respond_error(c, op, HORA_ERR_MISMATCH, msg);
  }
  return respond(c, op);
}

/* "allreduce 'x': rank 0 sent 10 elements, rank 1 sent 11": the first field
 * in which the requests of variants va and vb differ. */
static void describe_mismatch(const struct hora__controller *c, const struct pending_op *op,
                              const struct variant *va, const struct variant *vb, char *msg,
                              size_t size) {
  char name[300];
  int a = name_of(c, va->lowest_rank), rank = name_of(c, vb->lowest_rank);
  const struct hora__op_meta *f = &va->meta, *m = &vb->meta;
  hora__key_display(op->key, op->key_len, name, sizeof(name));
  const char *kind = hora__kind_name(f->kind);
  if (m->kind != f->kind) {
    snprintf(msg, size, "operation %s: rank %d submitted %s, rank %d %s", name, a,
             hora__kind_name(f->kind), rank, hora__kind_name(m->kind));
  } else if (m->device != f->device) {
    snprintf(msg, size, "%s %s: rank %d passed %s memory, rank %d %s memory", kind, name, a,
             f->device ? "GPU" : "host", rank, m->device ? "GPU" : "host");
  } else if (m->dtype != f->dtype) {
    snprintf(msg, size, "%s %s: rank %d sent %s, rank %d sent %s", kind, name, a,
             hora_dtype_name(f->dtype), rank, hora_dtype_name(m->dtype));
  } else if (m->count != f->count) {
    snprintf(msg, size, "%s %s: rank %d sent %llu elements, rank %d sent %llu", kind, name, a,
             (unsigned long long)f->count, rank, (unsigned long long)m->count);
  } else if (m->shape != f->shape) {
    char sa[400], sb[400];
    snprintf(msg, size, "%s %s: rank %d submitted %s, rank %d %s%s", kind, name, a,
             hora__shape_format(&va->shape, sa, sizeof(sa)), rank,
             hora__shape_format(&vb->shape, sb, sizeof(sb)),
             f->kind == HORA_KIND_ALLGATHER ? " (an allgather's shapes must agree in every "
                                              "dimension but the first)" : "");
  } else if (m->op != f->op) {
    snprintf(msg, size, "%s %s: rank %d asked for %s, rank %d for %s", kind, name, a,
             hora_op_name(f->op), rank, hora_op_name(m->op));
  } else if (m->split != f->split) {
    snprintf(msg, size, "%s %s: rank %d split it %s, rank %d %s", kind, name, a,
             f->split ? "by its recv_counts" : "by rows (Horovod's split)", rank,
             m->split ? (f->split ? "by other recv_counts" : "by its recv_counts")
                      : "by rows (Horovod's split)");
  } else if (m->root != f->root) {
    snprintf(msg, size, "%s %s: rank %d named root %d, rank %d root %d", kind, name, a, f->root,
             rank, m->root);
  } else if (m->group != f->group || m->group_size != f->group_size) {
    char ga[64] = "outside any group", gb[64] = "outside any group";
    if (f->group) {
      snprintf(ga, sizeof(ga), "in a group of %u operations", f->group_size);
    }
    if (m->group) {
      snprintf(gb, sizeof(gb), "in %sgroup of %u", f->group ? "another " : "a ", m->group_size);
    }
    snprintf(msg, size, "%s %s: rank %d submitted it %s, rank %d %s (every rank must group the "
             "same operations, by name, between hora_group_start and hora_group_end)", kind, name,
             a, ga, rank, gb);
  } else if (m->compression != f->compression) {
    static const char *const names[] = {"none", "fp16", "bf16"};
    snprintf(msg, size, "%s %s: rank %d asked for compression %s, rank %d for %s", kind, name, a,
             names[f->compression], rank, names[m->compression]);
  } else {
    snprintf(msg, size,
             "%s %s: rank %d asked for prescale %g and postscale %g, rank %d for %g and %g", kind,
             name, a, f->prescale, f->postscale, rank, m->prescale, m->postscale);
  }
}

/* Records rank's request among the variants of op. */
static void add_variant(struct pending_op *op, int rank, const struct hora__op_meta *m,
                        const struct hora__shape *shape) {
  for (int i = 0; i < op->nvariants; i++) {
    if (hora__meta_equal(&op->variants[i].meta, m)) {
      op->variants[i].lowest_rank = HORA_MIN(op->variants[i].lowest_rank, rank);
      return;
    }
  }
  struct variant *v = &op->variants[0];
  if (op->nvariants < MAX_VARIANTS) {
    v = &op->variants[op->nvariants++];
  } else {
    /* Full: keep those of the lowest ranks, so that the message names the
     * same two ranks whatever order the requests came in. */
    for (int i = 1; i < op->nvariants; i++) {
      if (op->variants[i].lowest_rank > v->lowest_rank) {
        v = &op->variants[i];
      }
    }
    if (v->lowest_rank < rank) {
      return;
    }
  }
  v->meta = *m;
  v->lowest_rank = rank;
  v->shape.ndims = shape && m->shape ? shape->ndims : -1;
  if (v->shape.ndims > 0) {
    memcpy(v->shape.dims, shape->dims, (size_t)v->shape.ndims * sizeof(shape->dims[0]));
  }
}

/* Only the fields that matter for a kind are compared. */
static void normalise(struct hora__op_meta *m) {
  if (!hora__kind_stands_in(m->kind)) {
    m->op = 0;
    m->compression = 0;
    m->prescale = m->postscale = 1.0;
  }
  if (m->kind != HORA_KIND_BROADCAST && m->kind != HORA_KIND_REDUCESCATTER) {
    m->root = -1; /* (a reducescatter's root is its rows: the shape decides it) */
  }
  if (m->kind == HORA_KIND_BARRIER) {
    m->dtype = 0;
    m->count = 0;
    m->device = 0;
    m->shape = 0;
  }
}

static int rescan(struct hora__controller *c) {
  for (struct pending_op *op = c->oldest; op;) {
    struct pending_op *next = op->next;
    HORA_CHECK(update(c, op));
    op = next;
  }
  return HORA_SUCCESS;
}

static int submit_join(struct hora__controller *c, int rank) {
  if (c->joined[rank]) {
    return HORA_SUCCESS;
  }
  c->joined[rank] = 1;
  c->njoined++;
  c->last_joined = rank;
  for (struct pending_op *op = c->oldest; op; op = op->next) {
    if (op->have[rank]) {
      op->nhave_joined++;
    }
  }
  HORA_CHECK(rescan(c));
  if (c->njoined == c->size) {
    struct hora__response *r = hora__response_new(HORA_KIND_JOIN, 0);
    if (!r) {
      return HORA_ERR_NO_MEMORY;
    }
    r->last_joined = c->last_joined;
    hora__ctl_push_ready(c, r);
    memset(c->joined, 0, (size_t)c->size);
    c->njoined = 0;
    c->last_joined = -1;
    for (struct pending_op *op = c->oldest; op; op = op->next) {
      op->nhave_joined = 0;
    }
  }
  return HORA_SUCCESS;
}

static int submit_shutdown(struct hora__controller *c, int rank) {
  if (c->shutdown[rank]) {
    return HORA_SUCCESS;
  }
  c->shutdown[rank] = 1;
  c->nshutdown++;
  HORA_CHECK(rescan(c));
  if (c->nshutdown == c->size) {
    struct hora__response *r = hora__response_new(HORA_KIND_SHUTDOWN, 0);
    if (!r) {
      return HORA_ERR_NO_MEMORY;
    }
    hora__ctl_push_ready(c, r);
  }
  return HORA_SUCCESS;
}

int hora__controller_submit(struct hora__controller *c, int rank,
                            const struct hora__wire_request *req) {
  if (req->meta.kind == HORA_KIND_JOIN) {
    return submit_join(c, rank);
  }
  if (req->meta.kind == HORA_KIND_SHUTDOWN) {
    return submit_shutdown(c, rank);
  }
  struct hora__op_meta m = req->meta;
  normalise(&m);
  struct pending_op *op = hora__table_get(&c->ops, req->key, req->key_len);
  if (!op) {
    op = hora__calloc(1, sizeof(*op));
    if (!op) {
      return HORA_ERR_NO_MEMORY;
    }
    op->key = hora__malloc(req->key_len + 1);
    op->have = hora__calloc((size_t)c->size, 1);
    if (!op->key || !op->have) {
      op_free(op);
      return HORA_ERR_NO_MEMORY;
    }
    memcpy(op->key, req->key, req->key_len);
    op->key[req->key_len] = '\0';
    op->key_len = (uint16_t)req->key_len;
    op->meta = m;
    uint64_t now = hora__now_ns(), waited = (uint64_t)req->waited_ms * 1000000u;
    op->first_ns = now > waited ? now - waited : 0;
    if (hora__table_put(&c->ops, op->key, op->key_len, op) != HORA_SUCCESS) {
      op_free(op);
      return HORA_ERR_NO_MEMORY;
    }
    /* Kept oldest first; a request that waited elsewhere (a cached one
     * sent in full after a stall) goes before younger ones. */
    struct pending_op *after = c->newest;
    while (after && after->first_ns > op->first_ns) {
      after = after->prev;
    }
    op->prev = after;
    op->next = after ? after->next : c->oldest;
    if (op->next) {
      op->next->prev = op;
    } else {
      c->newest = op;
    }
    if (after) {
      after->next = op;
    } else {
      c->oldest = op;
    }
    if (hora__timeline_enabled()) {
      hora__timeline_begin(op->key, op->key_len, hora__negotiate_phase(m.kind));
    }
  } else if (op->have[rank]) {
    /* The API refuses a key already in flight, so this is a broken peer. */
    return hora__error(HORA_ERR_PROTOCOL, "rank %d submitted operation %.*s twice", rank,
                       (int)req->key_len, req->key);
  }
  add_variant(op, rank, &m, req->shape);
  op->have[rank] = 1;
  op->nhave++;
  note_late(c, op, rank);
  if (c->joined[rank]) {
    op->nhave_joined++;
  }
  if (hora__timeline_enabled()) {
    char mark[32];
    snprintf(mark, sizeof(mark), "rank %d ready", rank);
    hora__timeline_mark(op->key, op->key_len, mark);
  }
  return update(c, op);
}

int hora__controller_check_stalls(struct hora__controller *c, uint64_t now_ns, double check_s,
                                  double shutdown_s, uint64_t *next_ns) {
  uint64_t check_ns = (uint64_t)(check_s * 1e9);
  uint64_t shutdown_ns = (uint64_t)(shutdown_s * 1e9);
  *next_ns = UINT64_MAX;
  if (!c->oldest || (check_ns == 0 && shutdown_ns == 0)) {
    return HORA_SUCCESS;
  }
  /* Oldest first: the first entry not yet stalled ends the scan. */
  uint64_t oldest_age = now_ns - c->oldest->first_ns;
  if (shutdown_ns > 0 && oldest_age >= shutdown_ns) {
    char name[300], missing[256], msg[1024];
    struct pending_op *op = c->oldest;
    uint8_t *present = hora__calloc((size_t)c->size, 1);
    if (!present) {
      return HORA_ERR_NO_MEMORY;
    }
    for (int r = 0; r < c->size; r++) {
      present[r] = op->have[r] || (c->joined[r] && joined_stand_in(c, op));
    }
    hora__format_ranks_named(present, c->size, false, c->names, missing, sizeof(missing));
    free(present);
    hora__key_display(op->key, op->key_len, name, sizeof(name));
    snprintf(msg, sizeof(msg),
             "%s%s %s stalled for %.0f s (HORA_STALL_SHUTDOWN_TIME_SECONDS) waiting for rank(s) "
             "%s; shutting down",
             c->label ? c->label : "", hora__kind_name(op->meta.kind), name, (double)oldest_age * 1e-9, missing);
    HORA_ERROR("%s", msg);
    return hora__error(HORA_ERR_TIMEOUT, "%s", msg);
  }
  if (check_ns > 0 && oldest_age >= check_ns && now_ns >= c->next_stall_warn_ns) {
    char line[4096];
    size_t o = (size_t)snprintf(line, sizeof(line),
                                "%sstall: these operations have waited more than %g s "
                                "(HORA_STALL_CHECK_TIME_SECONDS) for some ranks:",
                                c->label ? c->label : "", check_s);
    uint8_t *present = hora__calloc((size_t)c->size, 1);
    if (!present) {
      return HORA_ERR_NO_MEMORY;
    }
    int shown = 0, stalled = 0;
    for (struct pending_op *op = c->oldest; op && now_ns - op->first_ns >= check_ns;
         op = op->next) {
      stalled++;
      if (shown == 20 || o + 400 >= sizeof(line)) {
        continue;
      }
      char name[300], missing[256];
      for (int r = 0; r < c->size; r++) {
        present[r] = op->have[r] || (c->joined[r] && joined_stand_in(c, op));
      }
      hora__format_ranks_named(present, c->size, false, c->names, missing, sizeof(missing));
      hora__key_display(op->key, op->key_len, name, sizeof(name));
      o += (size_t)snprintf(line + o, sizeof(line) - o, " %s %s (%.0f s) missing rank(s) %s;",
                            hora__kind_name(op->meta.kind), name,
                            (double)(now_ns - op->first_ns) * 1e-9, missing);
      shown++;
    }
    free(present);
    if (stalled > shown) {
      snprintf(line + o, sizeof(line) - o, " and %d more", stalled - shown);
    }
    HORA_WARN("%s", line);
    c->next_stall_warn_ns = now_ns + check_ns;
  }
  if (check_ns > 0) {
    uint64_t due = c->oldest->first_ns + check_ns;
    *next_ns = HORA_MAX(due, c->next_stall_warn_ns);
  }
  if (shutdown_ns > 0) {
    uint64_t due = c->oldest->first_ns + shutdown_ns;
    *next_ns = HORA_MIN(*next_ns, due);
  }
  return HORA_SUCCESS;
}
