/* The pipelined double binary tree allreduce (NCCL 2.4's), for operations
 * of medium size on many ranks, where the ring's 2(p-1) steps cost more
 * latency than its bandwidth saves and the logarithmic schedules move the
 * whole buffer, or half of it, at every step.
 *
 * Two binary trees span the ranks (hora__tree_links), built so that a rank
 * inner in one is a leaf of the other. The buffer's first half goes up and
 * down tree 0, the second half tree 1, both at once, each cut into chunks
 * (at most HORA_CHUNK_SIZE bytes on the wire, fewer where the cost model
 * finds a deeper pipeline faster: hora__tree_chunk). On the way up a rank
 * adds chunk k of its children into its own and sends it to its parent
 * while chunk k+1 arrives; the root sends each finished chunk down and
 * every rank forwards it to its children as it comes. 2 log2 p steps plus
 * one per chunk; each rank sends and receives about 2n bytes over both trees, as
 * in the ring, spread over up to six peers.
 *
 *   p = 6        tree 0: 0 - 4 - (2 - (1, 3), 5)     tree 1: mirrored, r -> 5 - r
 *
 * Each rank lists its operations for hora__sched_run in the order of the
 * step at which an unhindered pipeline would do them: chunk k leaves a
 * rank at level l of its tree (the root highest) at step k + l on the way
 * up and at step k + 2 lr - l on the way down (lr: the root's level). Both
 * ends of a link compute the same step for each message, which is what
 * the runner needs to be free of deadlock.
 *
 * Compressed (wire dtype != dtype): partial sums go up narrowed; the root
 * rounds each finished chunk through the wire type, its own copy too, and
 * the ranks below take those very bits, so every rank ends with the same
 * bits. */
#include <stdlib.h>

#include "comm/coll/collectives.h"
#include "comm/reduce/reduce.h"

/* NCCL's binary tree (ncclGetBtree) over 0..p-1, in-order: v with lowest
 * set bit b has children v - b/2 and v + b/2 (nearer where that is past
 * the end); 0 is the root, with the one child next_pow2(p) / 2. */
static void btree(int p, int v, int *parent, int child[2]) {
  if (v == 0) {
    int top = 1;
    while (top < p) {
      top *= 2;
    }
    *parent = -1;
    child[0] = -1;
    child[1] = p > 1 ? top / 2 : -1;
    return;
  }
  int bit = v & -v, up = (v ^ bit) | (bit << 1), half = bit / 2, d = half;
  *parent = up < p ? up : v ^ bit;
  child[0] = half ? v - half : -1;
  while (d && v + d >= p) {
    d /= 2;
  }
  child[1] = d ? v + d : -1;
}

/* Position pos's place in tree 1's copy of tree 0 (mirrored for even p:
 * the odd positions, leaves of tree 0, are inner; shifted by one for odd
 * p), and back. */
static int virtual_of(int p, int tree, int pos) {
  return tree == 0 ? pos : p % 2 ? (pos - 1 + p) % p : p - 1 - pos;
}

static int position_of(int p, int tree, int v) {
  return v < 0 || tree == 0 ? v : p % 2 ? (v + 1) % p : p - 1 - v;
}

void hora__tree_links(int size, int pos, int tree, int *parent, int child[2]) {
  int vp, vc[2];
  btree(size, virtual_of(size, tree, pos), &vp, vc);
  *parent = position_of(size, tree, vp);
  child[0] = position_of(size, tree, vc[0]);
  child[1] = position_of(size, tree, vc[1]);
}

/* A position's level: above every child's (the pipeline's step order). */
static int level_of(int p, int tree, int pos) {
  int v = virtual_of(p, tree, pos), l = 0;
  if (v == 0) {
    while ((1 << l) < p) {
      l++;
    }
    return l;
  }
  while (!(v & (1 << l))) {
    l++;
  }
  return l;
}

enum { STEP_REDUCE, STEP_UNPACK, STEP_KINDS };

/* One tree's share of the buffer and this rank's place in it. */
struct half {
  int parent, child[2];
  int level, parent_level, child_level[2], root_level;
  size_t lo, n, chunks; /* elements [lo, lo + n), in chunks */
  int up_send, up_recv[2], down_recv, down_send[2], steps[STEP_KINDS]; /* lanes */
  /* Per chunk, the operations the later ones depend on (-1: none). */
  long *recv_up[2], *reduced, *sent_up, *recv_down;
};

struct tree {
  hora__comm *comm;
  bool cross;
  int size, pos;
  char *buf, *from_child[2];   /* from_child: count wire elements each */
  char *up_wire, *down_wire;   /* compressed: count wire elements each */
  size_t count, es, ws, chunk; /* chunk: elements */
  hora_dtype dtype, wire;
  hora_op op;
  bool compressed;
  struct half h[2];
  struct hora__sched_lane lanes[HORA_SCHED_LANES];
  int nlanes, step_tree[HORA_SCHED_LANES], step_kind[HORA_SCHED_LANES];
  struct hora__sched_op *ops;
  size_t nops;
};

static hora__conn *conn_of(const struct tree *t, int pos) {
  hora__comm *c = t->comm;
  return c->proc->data[t->cross ? hora__comm_rank_on_host(c, pos) : pos];
}

/* The lane of one direction of the connection to pos (one per
 * connection and direction, shared by both trees). */
static int lane_to(struct tree *t, int pos, bool send) {
  hora__conn *c = conn_of(t, pos);
  for (int l = 0; l < t->nlanes; l++) {
    if (t->lanes[l].conn == c && t->lanes[l].send == send) {
      return l;
    }
  }
  t->lanes[t->nlanes] = (struct hora__sched_lane){c, send};
  return t->nlanes++;
}

static int local_lane(struct tree *t, int tree, int kind) {
  t->lanes[t->nlanes] = (struct hora__sched_lane){NULL, false};
  t->step_tree[t->nlanes] = tree;
  t->step_kind[t->nlanes] = kind;
  return t->nlanes++;
}

static long emit(struct tree *t, int lane, void *buf, size_t len, long a, long b) {
  t->ops[t->nops] = (struct hora__sched_op){lane, buf, len, {a, b}};
  return (long)t->nops++;
}

static void chunk_range(const struct tree *t, const struct half *h, size_t k, size_t *lo,
                        size_t *n) {
  *lo = h->lo + k * t->chunk;
  *n = HORA_MIN(t->chunk, h->lo + h->n - *lo);
}

static char *at(const struct tree *t, char *base, size_t elem, bool wire) {
  return base + elem * (wire ? t->ws : t->es);
}

/* The local steps: buf [lo, lo + n) is op->buf, n op->len. */
static void run_step(void *arg, const struct hora__sched_op *op) {
  struct tree *t = arg;
  const struct half *h = &t->h[t->step_tree[op->lane]];
  size_t lo = (size_t)((char *)op->buf - t->buf) / t->es, n = op->len;
  char *mine = op->buf;
  if (t->step_kind[op->lane] == STEP_UNPACK) {
    hora__decompress(t->dtype, mine, t->wire,
                     (const uint16_t *)(void *)at(t, t->down_wire, lo, true), n);
    return;
  }
  /* Children in a fixed order: the same sum on every run. */
  for (int j = 0; j < 2; j++) {
    if (h->child[j] < 0) {
      continue;
    }
    const char *got = at(t, t->from_child[j], lo, true);
    if (t->compressed) {
      hora__reduce_wire(t->dtype, t->op, mine, t->wire, (const uint16_t *)(const void *)got, mine,
                        n);
    } else {
      hora__reduce(t->dtype, t->op, mine, mine, got, n);
    }
  }
  if (t->compressed) {
    uint16_t *w = (uint16_t *)(void *)at(t, h->parent < 0 ? t->down_wire : t->up_wire, lo, true);
    hora__compress(t->wire, w, t->dtype, mine, n);
    if (h->parent < 0) {
      hora__decompress(t->dtype, mine, t->wire, w, n); /* the root keeps what it sends */
    }
  }
}

/* This rank's operations of tree `which` at pipeline step s. */
static void emit_step(struct tree *t, int which, size_t s) {
  struct half *h = &t->h[which];
  char *down = t->compressed ? t->down_wire : t->buf;
  char *up = t->compressed ? t->up_wire : t->buf;
  size_t lo, n, k;
  for (int j = 0; j < 2; j++) {
    k = s - (size_t)h->child_level[j];
    if (h->child[j] >= 0 && s >= (size_t)h->child_level[j] && k < h->chunks) {
      chunk_range(t, h, k, &lo, &n);
      h->recv_up[j][k] =
          emit(t, h->up_recv[j], at(t, t->from_child[j], lo, true), n * t->ws, -1, -1);
    }
  }
  k = s - (size_t)h->level;
  if (s >= (size_t)h->level && k < h->chunks) {
    chunk_range(t, h, k, &lo, &n);
    h->reduced[k] =
        emit(t, h->steps[STEP_REDUCE], at(t, t->buf, lo, false), n,
             h->child[0] >= 0 ? h->recv_up[0][k] : -1, h->child[1] >= 0 ? h->recv_up[1][k] : -1);
    if (h->parent >= 0) {
      h->sent_up[k] =
          emit(t, h->up_send, at(t, up, lo, t->compressed), n * t->ws, h->reduced[k], -1);
    }
  }
  size_t down_at = 2 * (size_t)h->root_level - (size_t)h->parent_level;
  k = s - down_at;
  if (h->parent >= 0 && s >= down_at && k < h->chunks) {
    /* Into the buffer only once this rank's own chunk has left. */
    chunk_range(t, h, k, &lo, &n);
    h->recv_down[k] =
        emit(t, h->down_recv, at(t, down, lo, t->compressed), n * t->ws, h->sent_up[k], -1);
  }
  down_at = 2 * (size_t)h->root_level - (size_t)h->level;
  k = s - down_at;
  if (s >= down_at && k < h->chunks) {
    chunk_range(t, h, k, &lo, &n);
    long ready = h->parent < 0 ? h->reduced[k] : h->recv_down[k];
    if (h->parent >= 0 && t->compressed) {
      emit(t, h->steps[STEP_UNPACK], at(t, t->buf, lo, false), n, ready, -1);
    }
    for (int j = 0; j < 2; j++) {
      if (h->child[j] >= 0) {
        emit(t, h->down_send[j], at(t, down, lo, t->compressed), n * t->ws, ready, -1);
      }
    }
  }
}

static void plan_half(struct tree *t, int which, size_t lo, size_t n) {
  struct half *h = &t->h[which];
  int p = t->size;
  hora__tree_links(p, t->pos, which, &h->parent, h->child);
  h->level = level_of(p, which, t->pos);
  h->root_level = level_of(p, which, position_of(p, which, 0));
  h->parent_level = h->parent >= 0 ? level_of(p, which, h->parent) : 0;
  h->lo = lo;
  h->n = n;
  h->chunks = (n + t->chunk - 1) / t->chunk;
  if (h->parent >= 0) {
    h->up_send = lane_to(t, h->parent, true);
    h->down_recv = lane_to(t, h->parent, false);
  }
  for (int j = 0; j < 2; j++) {
    if (h->child[j] >= 0) {
      h->child_level[j] = level_of(p, which, h->child[j]);
      h->up_recv[j] = lane_to(t, h->child[j], false);
      h->down_send[j] = lane_to(t, h->child[j], true);
    }
  }
  for (int kind = 0; kind < STEP_KINDS; kind++) {
    h->steps[kind] = local_lane(t, which, kind);
  }
}

/* comm->temp of at least `bytes` (the other point-to-point schedules'
 * space: they never run at the same time). */
static int temp_get(hora__comm *comm, size_t bytes, char **out) {
  HORA_CHECK(
      hora__comm_grow_registered(comm, &comm->temp, &comm->temp_bytes, &comm->temp_reg, bytes));
  *out = comm->temp;
  return HORA_SUCCESS;
}

int hora__tree_run(hora__comm *comm, bool cross, void *buf, size_t count, hora_dtype dtype,
                   hora_op op, hora_dtype wire) {
  struct tree t = {.comm = comm,
                   .cross = cross,
                   .size = cross ? comm->cross_size : comm->size,
                   .pos = cross ? comm->cross_rank : comm->rank,
                   .buf = buf,
                   .count = count,
                   .es = hora_dtype_size(dtype),
                   .ws = hora_dtype_size(wire),
                   .dtype = dtype,
                   .wire = wire,
                   .op = op,
                   .compressed = wire != dtype};
  if (t.size == 1 || count == 0) {
    return HORA_SUCCESS;
  }
  /* Tree links join positions a power of two apart: partners already. */
  HORA_CHECK(hora__comm_connect_partners(comm));
  /* By the agreed model, so every rank cuts alike; across hosts the
   * links are shared as hora__cross_pick prices them. */
  struct hora__cost link = comm->model.link;
  if (cross) {
    link.beta *= HORA_MAX(comm->size / HORA_MAX(comm->cross_size, 1), 1);
  }
  size_t chunk =
      hora__tree_chunk(&link, t.size, count * t.ws, (size_t)HORA_MAX(comm->proc->chunk_bytes, 1));
  t.chunk = HORA_MAX(chunk / t.ws, (size_t)1);
  char *space;
  HORA_CHECK(temp_get(comm, count * t.ws * (t.compressed ? 4 : 2), &space));
  t.from_child[0] = space;
  t.from_child[1] = space + count * t.ws;
  t.up_wire = space + 2 * count * t.ws;
  t.down_wire = space + 3 * count * t.ws;
  size_t first = (count + 1) / 2;
  plan_half(&t, 0, 0, first);
  plan_half(&t, 1, first, count - first);
  /* At most 8 operations per chunk: 2 receives, a reduction and a send
   * up; a receive, an unpacking and 2 sends down. */
  size_t chunks = t.h[0].chunks + t.h[1].chunks, steps = 0;
  t.ops = hora__malloc(8 * chunks * sizeof(*t.ops));
  long *marks = hora__malloc(5 * chunks * sizeof(*marks));
  int rc = HORA_SUCCESS;
  if (!t.ops || !marks) {
    rc = HORA_ERR_NO_MEMORY;
    goto out;
  }
  long *m = marks;
  for (int w = 0; w < 2; w++) {
    struct half *h = &t.h[w];
    long **per_chunk[] = {&h->recv_up[0], &h->recv_up[1], &h->reduced, &h->sent_up, &h->recv_down};
    for (size_t i = 0; i < HORA_ARRAY_SIZE(per_chunk); i++) {
      *per_chunk[i] = m;
      m += h->chunks;
    }
    if (h->chunks) {
      steps = HORA_MAX(steps, h->chunks + 2 * (size_t)h->root_level);
    }
  }
  for (size_t s = 0; s < steps; s++) {
    emit_step(&t, 0, s);
    emit_step(&t, 1, s);
  }
  struct hora__sched sched = {.lanes = t.lanes,
                              .nlanes = t.nlanes,
                              .ops = t.ops,
                              .nops = t.nops,
                              .arg = &t,
                              .local = run_step};
  rc = hora__sched_run(comm, &sched);
out:
  free(t.ops);
  free(marks);
  return rc;
}

int hora__tree_allreduce(hora__comm *comm, const void *src, void *buf, size_t count,
                         hora_dtype dtype, hora_op op, hora_dtype wire) {
  size_t bytes = count * hora_dtype_size(dtype);
  if (src != buf && bytes) {
    memcpy(buf, src, bytes);
  }
  return hora__tree_run(comm, false, buf, count, dtype, op, wire);
}
