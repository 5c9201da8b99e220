/* HORA_ADASUM against a direct reference written here: the binary tree of
 * pairwise combinations adasum(a, b) = (1 - a.b/2|a|^2) a + (1 - a.b/2|b|^2) b
 * over the ranks (the ranks beyond the largest power of two folded into
 * rank r - P first), in double, on every float dtype, sizes from 1 to many
 * chunks, zero vectors among the inputs, scales, several in flight at once,
 * identical bits on every rank, a joined rank (a zero input), and the
 * refusals (integer dtypes, reducescatter). Only a zero vector is added
 * as it is: tiny vectors combine like any other, and scaling every input
 * by s scales the result by s, from 1e-300 to 1e300. With HORA_HIERARCHICAL_ADASUM=1
 * (and hosts of equal rank counts) the reference is the tree over the
 * hosts' sums, hosts in the order of their lowest rank, divided by the
 * ranks per host (Horovod's GPU Adasum): the tree over the hosts' averages.
 * (Host buffers under the default, auto, take the flat tree.) */
#include <math.h>
#include <stdlib.h>

#include "comm/reduce/half.h"
#include "mpitest.h"

static double input(int rank, size_t i, int salt) {
  if ((rank + salt) % 5 == 4) {
    return 0; /* a rank with nothing to add */
  }
  uint64_t h = mt_hash(((uint64_t)rank << 40) ^ ((uint64_t)salt << 32) ^ i);
  return ((double)(h % 2001) - 1000.0) / 1000.0 + (rank % 3 == 0 ? 0.25 : -0.1);
}

/* What the dtype holds of v. */
static double rounded(hora_dtype dt, double v) {
  switch (dt) {
    case HORA_FLOAT16: return hora__f16_to_f32(hora__f32_to_f16((float)v));
    case HORA_BFLOAT16: return hora__bf16_to_f32(hora__f32_to_bf16((float)v));
    case HORA_FLOAT32: return (float)v;
    default: return v;
  }
}

static void put(hora_dtype dt, void *p, size_t i, double v) {
  switch (dt) {
    case HORA_FLOAT16: ((uint16_t *)p)[i] = hora__f32_to_f16((float)v); break;
    case HORA_BFLOAT16: ((uint16_t *)p)[i] = hora__f32_to_bf16((float)v); break;
    case HORA_FLOAT32: ((float *)p)[i] = (float)v; break;
    default: ((double *)p)[i] = v; break;
  }
}

static double get(hora_dtype dt, const void *p, size_t i) {
  switch (dt) {
    case HORA_FLOAT16: return hora__f16_to_f32(((const uint16_t *)p)[i]);
    case HORA_BFLOAT16: return hora__bf16_to_f32(((const uint16_t *)p)[i]);
    case HORA_FLOAT32: return ((const float *)p)[i];
    default: return ((const double *)p)[i];
  }
}

/* a = adasum(a, b), the paper's formula. */
static void ref_pair(double *a, const double *b, size_t n) {
  double dot = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < n; i++) {
    dot += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  double ca = aa > 0 ? 1 - dot / (2 * aa) : 1, cb = bb > 0 ? 1 - dot / (2 * bb) : 1;
  for (size_t i = 0; i < n; i++) {
    a[i] = ca * a[i] + cb * b[i];
  }
}

/* The tree over v[0..p) (each n long); the result lands in v[0]. */
static void ref_tree(double **v, int p, size_t n) {
  int P = 1;
  while (P * 2 <= p) {
    P *= 2;
  }
  for (int q = 0; q + P < p; q++) {
    ref_pair(v[q], v[q + P], n);
  }
  for (int step = 1; step < P; step *= 2) {
    for (int left = 0; left < P; left += 2 * step) {
      ref_pair(v[left], v[left + step], n);
    }
  }
}

/* Each rank's host, numbered by lowest rank; 0 hosts: the flat tree. */
static int host_of[1024], hosts;

static void learn_hosts(void) {
  const char *h = getenv("HORA_HIERARCHICAL_ADASUM");
  if (!h || strcmp(h, "1") != 0 || mt_size > 1024) {
    return;
  }
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, mt_rank, MPI_INFO_NULL, &local);
  int lowest = mt_rank, local_size;
  MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, local);
  MPI_Comm_size(local, &local_size);
  MPI_Comm_free(&local);
  int *low = malloc((size_t)mt_size * sizeof(int)), *count = calloc((size_t)mt_size, sizeof(int));
  MPI_Allgather(&lowest, 1, MPI_INT, low, 1, MPI_INT, MPI_COMM_WORLD);
  for (int r = 0; r < mt_size; r++) {
    if (low[r] == r) {
      hosts++;
    }
    int k = 0; /* hosts whose lowest rank comes before this one's */
    for (int q = 0; q < mt_size; q++) {
      k += low[q] == q && q < low[r];
    }
    host_of[r] = k;
    count[k]++;
  }
  for (int k = 0; k < hosts; k++) {
    if (count[k] != count[0]) {
      hosts = 0; /* unequal hosts: hora runs it flat */
    }
  }
  if (local_size == 1) {
    hosts = 0; /* one rank per host: the same as flat */
  }
  free(low);
  free(count);
}

/* The reference's leaves: the ranks, or the hosts' averages (into
 * v[0..hosts)): Adasum scales, so its tree over them is the tree over the
 * sums divided by the ranks per host. */
static int leaves(double **v, size_t n) {
  if (!hosts) {
    return mt_size;
  }
  double **sum = malloc((size_t)hosts * sizeof(*sum));
  for (int k = 0; k < hosts; k++) {
    sum[k] = calloc(n + 1, sizeof(double));
  }
  for (int r = 0; r < mt_size; r++) {
    for (size_t i = 0; i < n; i++) {
      sum[host_of[r]][i] += v[r][i];
    }
  }
  for (int k = 0; k < hosts; k++) {
    for (size_t i = 0; i < n; i++) {
      v[k][i] = sum[k][i] / (mt_size / hosts);
    }
    free(sum[k]);
  }
  free(sum);
  return hosts;
}

static double tolerance(hora_dtype dt) {
  return dt == HORA_FLOAT64 ? 1e-9 : dt == HORA_FLOAT32 ? 1e-4 : dt == HORA_FLOAT16 ? 2e-2 : 6e-2;
}

static void check_against_reference(hora_dtype dt, size_t n, int salt, double pre, double post,
                                    const int *joined) {
  size_t es = hora_dtype_size(dt);
  double **v = malloc((size_t)mt_size * sizeof(*v));
  for (int r = 0; r < mt_size; r++) {
    v[r] = calloc(n + 1, sizeof(double));
    for (size_t i = 0; i < n && !(joined && joined[r]); i++) {
      v[r][i] = rounded(dt, rounded(dt, input(r, i, salt)) * pre);
    }
  }
  ref_tree(v, leaves(v, n), n);
  char *buf = malloc(n * es + 1);
  for (size_t i = 0; i < n; i++) {
    put(dt, buf, i, input(mt_rank, i, salt));
  }
  char name[64];
  snprintf(name, sizeof(name), "adasum/%s/%zu/%d", hora_dtype_name(dt), n, salt);
  hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
  o.prescale = pre;
  o.postscale = post;
  hora_request *r = NULL;
  MT_OK(hora_allreduce_async_ex(name, buf, buf, n, dt, HORA_ADASUM, &o, &r));
  MT_OK(hora_wait(&r));
  double worst = 0, scale = 1e-30;
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    scale = fmax(scale, fabs(v[0][i] * post));
  }
  for (size_t i = 0; i < n; i++) {
    double d = fabs(get(dt, buf, i) - v[0][i] * post);
    if (d > worst) {
      worst = d;
      at = i;
    }
  }
  MT_CHECK(worst <= tolerance(dt) * scale, "%s: element %zu is %.9g, the reference %.9g", name,
           at, get(dt, buf, at), v[0][at] * post);
  /* Every rank holds the same bits. */
  uint64_t h = 1469598103934665603ull, lo, hi;
  for (size_t i = 0; i < n * es; i++) {
    h = (h ^ (uint8_t)buf[i]) * 1099511628211ull;
  }
  if (!joined) { /* (a joined rank takes no part in MPI's collectives) */
    MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    MT_CHECK(lo == hi, "%s: the ranks' results differ", name);
  }
  for (int q = 0; q < mt_size; q++) {
    free(v[q]);
  }
  free(v);
  free(buf);
}

static void matches_the_reference(void) {
  static const hora_dtype dts[] = {HORA_FLOAT32, HORA_FLOAT64, HORA_FLOAT16, HORA_BFLOAT16};
  static const size_t sizes[] = {1, 2, 7, 1000, 300001};
  for (size_t d = 0; d < 4; d++) {
    for (size_t s = 0; s < 5; s++) {
      if (sizes[s] > 1000 && dts[d] != HORA_FLOAT32) {
        continue;
      }
      check_against_reference(dts[d], sizes[s], (int)(d + s), 1.0, 1.0, NULL);
    }
  }
  check_against_reference(HORA_FLOAT64, 333, 9, 0.5, 3.0, NULL);
}

static void several_in_flight(void) {
  enum { N = 4 };
  float *b[N];
  hora_request *r[N];
  for (int k = 0; k < N; k++) {
    int t = (k + mt_rank) % N;
    b[t] = malloc(100 * sizeof(float));
    for (int i = 0; i < 100; i++) {
      b[t][i] = (float)input(mt_rank, (size_t)i, t);
    }
    char name[32];
    snprintf(name, sizeof(name), "adasum/many/%d", t);
    MT_OK(hora_allreduce_async(name, b[t], b[t], 100, HORA_FLOAT32, HORA_ADASUM, &r[t]));
  }
  for (int t = 0; t < N; t++) {
    MT_OK(hora_wait(&r[t]));
    double **v = malloc((size_t)mt_size * sizeof(*v));
    for (int q = 0; q < mt_size; q++) {
      v[q] = malloc(100 * sizeof(double));
      for (int i = 0; i < 100; i++) {
        v[q][i] = (float)input(q, (size_t)i, t);
      }
    }
    ref_tree(v, leaves(v, 100), 100);
    double worst = 0;
    for (int i = 0; i < 100; i++) {
      worst = fmax(worst, fabs(b[t][i] - v[0][i]));
    }
    MT_CHECK(worst < 1e-4, "tensor %d: off by %g", t, worst);
    for (int q = 0; q < mt_size; q++) {
      free(v[q]);
    }
    free(v);
    free(b[t]);
  }
}

/* The Adasum of the ranks' buffers (n of dt each, scaled by s) against s
 * times the reference taken at scale 1. */
static void check_scaled(hora_dtype dt, size_t n, int salt, double s, double tol) {
  double **v = malloc((size_t)mt_size * sizeof(*v));
  for (int r = 0; r < mt_size; r++) {
    v[r] = calloc(n + 1, sizeof(double));
    for (size_t i = 0; i < n; i++) {
      v[r][i] = input(r, i, salt);
    }
  }
  ref_tree(v, leaves(v, n), n);
  char *buf = malloc(n * hora_dtype_size(dt) + 1);
  for (size_t i = 0; i < n; i++) {
    put(dt, buf, i, input(mt_rank, i, salt) * s);
  }
  char name[64];
  snprintf(name, sizeof(name), "adasum/scaled/%s/%g", hora_dtype_name(dt), s);
  hora_request *r = NULL;
  MT_OK(hora_allreduce_async(name, buf, buf, n, dt, HORA_ADASUM, &r));
  MT_OK(hora_wait(&r));
  double top = 0, worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    top = fmax(top, fabs(v[0][i]));
  }
  for (size_t i = 0; i < n; i++) {
    double d = fabs(get(dt, buf, i) / s - v[0][i]);
    if (!(d <= worst)) { /* (a NaN counts as the worst) */
      worst = d;
      at = i;
    }
  }
  MT_CHECK(worst <= tol * top, "%s: element %zu is %.9g, expected %.9g", name, at,
           get(dt, buf, at), v[0][at] * s);
  for (int q = 0; q < mt_size; q++) {
    free(v[q]);
  }
  free(v);
  free(buf);
}

/* Every rank holds [x] * 4: the Adasum of identical vectors is the vector
 * (hierarchical: of the hosts' averages, x too). */
static void tiny_vectors(void) {
  static const double xs64[] = {1e-5, 1e-10, 1e-30, 1e-80, 1e-150, 1e-200, 1e-300, 1e-310};
  static const double xs32[] = {1e-5, 1e-10, 1e-20, 1e-30, 1e-37};
  for (int d = 0; d < 2; d++) {
    hora_dtype dt = d ? HORA_FLOAT32 : HORA_FLOAT64;
    const double *xs = d ? xs32 : xs64;
    size_t k = d ? sizeof(xs32) / sizeof(*xs32) : sizeof(xs64) / sizeof(*xs64);
    for (size_t j = 0; j < k; j++) {
      char buf[4 * sizeof(double)], name[64];
      for (size_t i = 0; i < 4; i++) {
        put(dt, buf, i, xs[j]);
      }
      snprintf(name, sizeof(name), "adasum/tiny/%s/%g", hora_dtype_name(dt), xs[j]);
      hora_request *r = NULL;
      MT_OK(hora_allreduce_async(name, buf, buf, 4, dt, HORA_ADASUM, &r));
      MT_OK(hora_wait(&r));
      double want = rounded(dt, xs[j]);
      for (size_t i = 0; i < 4; i++) {
        double got = get(dt, buf, i);
        MT_CHECK(fabs(got - want) <= (d ? 1e-6 : 1e-12) * want,
                 "%s: element %zu is %.9g, expected %.9g", name, i, got, want);
      }
    }
  }
}

/* adasum(s a, s b) = s adasum(a, b): no jump at any scale. */
static void scale_invariant(void) {
  for (int k = -300; k <= 300; k += 15) {
    check_scaled(HORA_FLOAT64, 37, 11, pow(10, k), 1e-9);
  }
  for (int k = -36; k <= 36; k += 3) {
    check_scaled(HORA_FLOAT32, 37, 12, pow(10, k), 1e-4);
  }
}

static void refusals_and_join(void) {
  int32_t i32[4] = {0};
  hora_request *r = NULL;
  MT_FAILS(hora_allreduce_async("adasum/int", i32, i32, 4, HORA_INT32, HORA_ADASUM, &r),
           HORA_ERR_INVALID_ARG, "float dtype");
  float f[8] = {0}, g[8];
  MT_FAILS(hora_reducescatter_async("adasum/rs", f, g, 8, HORA_FLOAT32, HORA_ADASUM, &r),
           HORA_ERR_INVALID_ARG, "allreduce op");
  MT_CHECK(!strcmp(hora_op_name(HORA_ADASUM), "adasum"), "name %s", hora_op_name(HORA_ADASUM));
  /* The last rank joins at once: it adds a zero vector, which changes nothing. */
  int joined[64] = {0};
  if (mt_size <= 64) {
    joined[mt_size - 1] = mt_size > 1;
  }
  if (mt_rank != mt_size - 1 || mt_size == 1) {
    check_against_reference(HORA_FLOAT64, 50, 3, 1.0, 1.0, mt_size <= 64 ? joined : NULL);
  }
  MT_OK(hora_join(NULL));
}

int main(int argc, char **argv) {
  mt_setenv_args(argc, argv);
  mt_init();
  learn_hosts();
  mt_run("adasum/matches_the_reference", matches_the_reference);
  mt_run("adasum/several_in_flight", several_in_flight);
  mt_run("adasum/tiny_vectors", tiny_vectors);
  mt_run("adasum/scale_invariant", scale_invariant);
  mt_run("adasum/refusals_and_join", refusals_and_join);
  int failures = mt_total_failures();
  int rc = hora_finalize();
  if (rc != HORA_SUCCESS) {
    fprintf(stderr, "hora_finalize: %s\n", hora_last_error());
    return 1;
  }
  return failures ? 1 : 0;
}
