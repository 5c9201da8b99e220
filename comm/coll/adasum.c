/* Adasum (Maleki et al., "Scaling Distributed Training with Adaptive
 * Summation", MLSys 2021): two gradients a and b combine as
 *
 *   adasum(a, b) = (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b
 *
 * (a coefficient is 1 where its vector is zero), and p ranks combine as a
 * binary tree: ranks r and r ^ 1, then those pairs with each other, and
 * so on. It runs by recursive vector halving: at level l, rank r and its
 * partner r ^ 2^l each keep one half of the segment they hold and swap the
 * other, the ranks of the level's group (2^(l+1) ranks, each holding a
 * different piece of the same two vectors) sum their pieces' dot product and
 * norms, and each combines its piece. After the last level each rank holds
 * 1/p of the result; recursive doubling gathers it back. Ranks beyond the
 * largest power of two first fold into a partner (their adasum computed
 * there whole) and get the result at the end.
 *
 * The arithmetic is in double whatever the dtype (the vectors travel as
 * doubles), so half-precision gradients lose nothing in the dot products.
 * Messages go straight between the partners, over connections to every
 * member made on first use.
 *
 * Hierarchical (HORA_HIERARCHICAL_ADASUM=1, or auto on device buffers as
 * Horovod's GPU Adasum; where shared memory reduces): the ranks of each
 * host sum their vectors in shared memory, each local rank takes one slice
 * of its host's sum, and the tree runs over the hosts, local rank j of
 * every host combining slice j with local rank j of the others; each
 * level's dot products add over the host's slices first, so the
 * coefficients are the whole vectors'. The slices are gathered back in
 * shared memory and divided by the ranks per host (Horovod's postscale
 * factor /= local size). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/coll/collectives.h"
#include "comm/reduce/half.h"

static void to_double(hora_dtype dt, const void *src, double *dst, size_t n) {
  for (size_t i = 0; i < n; i++) {
    switch (dt) {
      case HORA_FLOAT16: dst[i] = hora__f16_to_f32(((const uint16_t *)src)[i]); break;
      case HORA_BFLOAT16: dst[i] = hora__bf16_to_f32(((const uint16_t *)src)[i]); break;
      case HORA_FLOAT32: dst[i] = ((const float *)src)[i]; break;
      default: dst[i] = ((const double *)src)[i]; break;
    }
  }
}

static void from_double(hora_dtype dt, const double *src, void *dst, size_t n) {
  for (size_t i = 0; i < n; i++) {
    switch (dt) {
      case HORA_FLOAT16: ((uint16_t *)dst)[i] = hora__f32_to_f16((float)src[i]); break;
      case HORA_BFLOAT16: ((uint16_t *)dst)[i] = hora__f32_to_bf16((float)src[i]); break;
      case HORA_FLOAT32: ((float *)dst)[i] = (float)src[i]; break;
      default: ((double *)dst)[i] = src[i]; break;
    }
  }
}

/* The dot products of two vectors: s = {a.b, |a|^2, |b|^2, ea, eb}, the
 * first three scaled by 2^-(ea+eb), 2^-2ea, 2^-2eb. Each vector is scaled
 * (exactly, by powers of two) so that its largest element is near 1: no
 * square underflows or overflows at any scale, so only a vector that is
 * exactly zero has a zero norm (Horovod's threshold, |a|^2 < sqrt(DBL_MIN),
 * made every vector below 1e-77 count as zero) and adasum(s a, s b) is
 * s adasum(a, b). */
enum { NS = 5 };

static int exponent_of(const double *a, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) {
    m = fmax(m, fabs(a[i]));
  }
  int e = 0;
  if (m > 0 && isfinite(m)) {
    frexp(m, &e);
  }
  return e;
}

static void dots(const double *a, const double *b, size_t n, double s[NS]) {
  int ea = exponent_of(a, n), eb = exponent_of(b, n);
  /* Two factors: 2^-ea alone overflows for subnormal elements. */
  double a1 = ldexp(1, -ea / 2), a2 = ldexp(1, ea / 2 - ea);
  double b1 = ldexp(1, -eb / 2), b2 = ldexp(1, eb / 2 - eb);
  double d = 0, x = 0, y = 0;
  for (size_t i = 0; i < n; i++) {
    double p = a[i] * a1 * a2, q = b[i] * b1 * b2;
    d += p * q;
    x += p * p;
    y += q * q;
  }
  s[0] = d;
  s[1] = x;
  s[2] = y;
  s[3] = ea;
  s[4] = eb;
}

/* out = x + y (out may be either), at the larger exponent of each vector
 * where it is nonzero. */
static void add_dots(double out[NS], const double x[NS], const double y[NS]) {
  double ea = x[1] == 0 ? y[3] : y[1] == 0 ? x[3] : fmax(x[3], y[3]);
  double eb = x[2] == 0 ? y[4] : y[2] == 0 ? x[4] : fmax(x[4], y[4]);
  double d = ldexp(x[0], (int)(x[3] + x[4] - ea - eb)) + ldexp(y[0], (int)(y[3] + y[4] - ea - eb));
  double aa = ldexp(x[1], (int)(2 * (x[3] - ea))) + ldexp(y[1], (int)(2 * (y[3] - ea)));
  double bb = ldexp(x[2], (int)(2 * (x[4] - eb))) + ldexp(y[2], (int)(2 * (y[4] - eb)));
  out[0] = d;
  out[1] = aa;
  out[2] = bb;
  out[3] = ea;
  out[4] = eb;
}

/* out = adasum(left, right) given their dots s; out may be either input
 * (each element depends on its own two only). A coefficient is 1 where its
 * vector is zero. */
static void combine(double *out, const double *left, const double *right, size_t n,
                    const double s[NS]) {
  /* a.b / |a|^2 = s0 / s1 * 2^(eb - ea) */
  double ca = s[1] > 0 ? 1.0 - ldexp(s[0] / s[1], (int)(s[4] - s[3])) * 0.5 : 1.0;
  double cb = s[2] > 0 ? 1.0 - ldexp(s[0] / s[2], (int)(s[3] - s[4])) * 0.5 : 1.0;
  for (size_t i = 0; i < n; i++) {
    out[i] = ca * left[i] + cb * right[i];
  }
}

static int swap(hora__comm *comm, int peer, const void *send, size_t sb, void *recv, size_t rb) {
  hora__conn *c = comm->proc->data[peer];
  return hora__exchange_step(comm, c, send, sb, c, recv, rb);
}

/* The tree's leaves: every rank (member NULL), or one rank per host. */
struct tree {
  const int *member; /* comm rank at each position */
  int pos, size;
  bool per_host; /* dot products add over the host's slices first */
};

static int at(const struct tree *t, int pos) { return t->member ? t->member[pos] : pos; }

/* s summed over the host's slices (every rank of the host calls it), in
 * local rank order so that all add alike. */
static int host_sums(hora__comm *comm, const struct tree *t, double s[NS]) {
  if (!t->per_host) {
    return HORA_SUCCESS;
  }
  int L = comm->local_size;
  double *all = hora__malloc((size_t)L * NS * sizeof(double));
  if (!all) {
    return HORA_ERR_NO_MEMORY;
  }
  int rc = hora__shm_allgather(comm, s, NS * sizeof(double), all);
  if (rc == HORA_SUCCESS) {
    memcpy(s, all, NS * sizeof(double));
    for (int j = 1; j < L; j++) {
      add_dots(s, s, all + (size_t)j * NS);
    }
  }
  free(all);
  return rc;
}

/* Halving: [lo, hi) split at mid = lo + (hi - lo) / 2; the lower rank of a
 * pair keeps the lower half. */
struct piece {
  size_t lo, hi;
};

static int halve_and_combine(hora__comm *comm, const struct tree *t, int levels, double *v,
                             double *tmp, size_t n, struct piece *trail) {
  int r = t->pos;
  struct piece seg = {0, n};
  for (int l = 0; l < levels; l++) {
    int partner = r ^ (1 << l);
    bool lower = r < partner;
    size_t mid = seg.lo + (seg.hi - seg.lo) / 2;
    struct piece keep = lower ? (struct piece){seg.lo, mid} : (struct piece){mid, seg.hi};
    struct piece give = lower ? (struct piece){mid, seg.hi} : (struct piece){seg.lo, mid};
    trail[l] = seg;
    size_t k = keep.hi - keep.lo;
    HORA_CHECK(swap(comm, at(t, partner), v + give.lo, (give.hi - give.lo) * sizeof(double),
                    tmp, k * sizeof(double)));
    /* "left" is the vector of the half-group with bit l clear. */
    const double *left = lower ? v + keep.lo : tmp, *right = lower ? tmp : v + keep.lo;
    double s[NS], got[NS];
    dots(left, right, k, s);
    HORA_CHECK(host_sums(comm, t, s));
    /* The group's ranks hold the other pieces of the same two vectors. */
    for (int j = 0; j <= l; j++) {
      HORA_CHECK(swap(comm, at(t, r ^ (1 << j)), s, sizeof(s), got, sizeof(got)));
      /* Added in rank order, so both sides round alike. */
      if (r < (r ^ (1 << j))) {
        add_dots(s, s, got);
      } else {
        add_dots(s, got, s);
      }
    }
    combine(v + keep.lo, left, right, k, s);
    seg = keep;
  }
  /* Gather back: undo the levels, each rank sending the piece it holds. */
  for (int l = levels - 1; l >= 0; l--) {
    int partner = r ^ (1 << l);
    struct piece whole = trail[l];
    size_t mid = whole.lo + (whole.hi - whole.lo) / 2;
    bool lower = r < partner;
    struct piece mine = lower ? (struct piece){whole.lo, mid} : (struct piece){mid, whole.hi};
    struct piece theirs = lower ? (struct piece){mid, whole.hi} : (struct piece){whole.lo, mid};
    HORA_CHECK(swap(comm, at(t, partner), v + mine.lo, (mine.hi - mine.lo) * sizeof(double),
                    v + theirs.lo, (theirs.hi - theirs.lo) * sizeof(double)));
  }
  return HORA_SUCCESS;
}

/* v (n doubles) = the Adasum over the tree's leaves; tmp holds n more. */
static int adasum_tree(hora__comm *comm, const struct tree *t, double *v, double *tmp,
                       size_t n) {
  int p = t->size, r = t->pos;
  int P = 1, levels = 0;
  while (P * 2 <= p) {
    P *= 2;
    levels++;
  }
  struct piece *trail = hora__calloc((size_t)levels + 1, sizeof(*trail));
  if (!trail) {
    return HORA_ERR_NO_MEMORY;
  }
  int rc = HORA_SUCCESS;
  size_t bytes = n * sizeof(double);
  if (r >= P) {
    /* Folded into r - P, which sends the result back at the end. */
    rc = swap(comm, at(t, r - P), v, bytes, NULL, 0);
    if (rc == HORA_SUCCESS) {
      rc = swap(comm, at(t, r - P), NULL, 0, v, bytes);
    }
  } else {
    if (r + P < p) {
      rc = swap(comm, at(t, r + P), NULL, 0, tmp, bytes);
      double s[NS];
      if (rc == HORA_SUCCESS) {
        dots(v, tmp, n, s);
        rc = host_sums(comm, t, s);
      }
      if (rc == HORA_SUCCESS) {
        combine(v, v, tmp, n, s);
      }
    }
    if (rc == HORA_SUCCESS) {
      rc = halve_and_combine(comm, t, levels, v, tmp, n, trail);
    }
    if (rc == HORA_SUCCESS && r + P < p) {
      rc = swap(comm, at(t, r + P), v, bytes, NULL, 0);
    }
  }
  free(trail);
  return rc;
}

/* Whether this Adasum runs per host: asked for (1; auto: device buffers,
 * as Horovod, whose GPU Adasum is hierarchical and CPU Adasum flat), and
 * where shared memory reduces across hosts of equal rank counts (or on one
 * host). Every rank decides alike: the setting is the job's, and device is
 * the agreed response's. */
bool hora__adasum_wants_hosts(const char *setting, bool device) {
  return !strcmp(setting, "1") || (device && !strcmp(setting, "auto"));
}

static bool per_host(const hora__comm *comm, bool device) {
  const char *h = hora__params.HIERARCHICAL_ADASUM;
  if (!hora__adasum_wants_hosts(h, device) || comm->local_size == 1) {
    return false;
  }
  if (comm->shm_host || comm->hierarchical) {
    return true;
  }
  static bool warned;
  if (!warned && comm->rank == 0) {
    warned = true;
    HORA_WARN("hierarchical Adasum (HORA_HIERARCHICAL_ADASUM=%s%s) not possible: it needs shared "
              "memory and the same number of ranks on every host; Adasum runs over every rank",
              h, device ? ", device buffers" : "");
  }
  return false;
}

static int adasum_per_host(hora__comm *comm, void *buf, size_t count, hora_dtype dtype) {
  int L = comm->local_size, H = comm->cross_size;
  size_t S = (count + (size_t)L - 1) / (size_t)L; /* every slice as long (zeros past the end) */
  double *v = hora__calloc((size_t)L * S + S, sizeof(double));
  int *member = hora__malloc((size_t)H * sizeof(int));
  if (!v || !member) {
    free(v);
    free(member);
    return HORA_ERR_NO_MEMORY;
  }
  for (int h = 0; h < H; h++) {
    member[h] = hora__comm_rank_on_host(comm, h);
  }
  to_double(dtype, buf, v, count);
  double *slice = v + (size_t)comm->local_rank * S, *tmp = v + (size_t)L * S;
  struct tree t = {member, comm->cross_rank, H, true};
  int rc = hora__shm_allreduce_local(comm, v, count, HORA_FLOAT64, HORA_SUM);
  if (rc == HORA_SUCCESS && H > 1) {
    rc = adasum_tree(comm, &t, slice, tmp, S);
  }
  if (rc == HORA_SUCCESS) {
    /* (In place: each rank's own slice is already where the gather puts it.) */
    rc = hora__shm_allgather(comm, slice, S * sizeof(double), v);
  }
  if (rc == HORA_SUCCESS) {
    for (size_t i = 0; i < count; i++) {
      v[i] /= L;
    }
    from_double(dtype, v, buf, count);
  }
  free(v);
  free(member);
  return rc;
}

int hora__adasum(hora__comm *comm, void *buf, size_t count, hora_dtype dtype, bool device) {
  if (comm->size == 1 || count == 0) {
    return HORA_SUCCESS;
  }
  HORA_CHECK(hora__comm_connect_peers_agreed(comm));
  if (per_host(comm, device)) {
    return adasum_per_host(comm, buf, count, dtype);
  }
  double *v = hora__malloc(2 * count * sizeof(double));
  if (!v) {
    return HORA_ERR_NO_MEMORY;
  }
  to_double(dtype, buf, v, count);
  struct tree t = {NULL, comm->rank, comm->size, false};
  int rc = adasum_tree(comm, &t, v, v + count, count);
  if (rc == HORA_SUCCESS) {
    from_double(dtype, v, buf, count);
  }
  free(v);
  return rc;
}
