/* The host algorithms (ring.c, allreduce.c, broadcast.c, allgather.c,
 * recursive.c) and the host collectives' dispatchers with every schedule
 * of the registry forced, without MPI: N threads, one simulated rank
 * each, each with its own process (struct hora__proc: its progress engine
 * and a small chunk size, so the schedules pipeline many chunks) and
 * communicator. Every rank has a mock data connection to every other
 * (proc->data[], as the partners' connections), and its ring's next and
 * prev are data[r+1] and data[r-1], as communicator.c makes them. Every
 * result is compared with one computed here directly. A watchdog fails a
 * job that hangs: the ranks' service hooks then fail their collectives,
 * so the test ends. */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "comm/coll/collectives.h"
#include "comm/transport/mock.h"
#include "../runner.h"

#define MS 1000000ull

static bool under_valgrind(void) {
  const char *p = getenv("LD_PRELOAD"); /* its preload library */
  return p && strstr(p, "vgpreload");
}

#if defined(__SANITIZE_THREAD__)
#define HORA_UNIT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HORA_UNIT_TSAN 1
#endif
#endif

/* The sweeps of sizes and rank counts shrink to a power of two and not
 * under valgrind (tens of times slower) and ThreadSanitizer (five times):
 * the ranks' threads meet in the same ways, and the plain and ASan builds
 * run every size. */
static bool sweep_few(void) {
#ifdef HORA_UNIT_TSAN
  return true;
#else
  return under_valgrind();
#endif
}

/* A ring that has not finished by then hangs; six times that under
 * valgrind, which runs the eight simulated ranks' threads one at a time. */
static int ring_limit_s(void) {
  return under_valgrind() ? 60 : 10;
}
#define RING_LIMIT_S ring_limit_s()

struct ring_job;

struct sim_rank {
  struct hora__proc proc;
  hora__comm comm;
  struct ring_job *job;
  pthread_t thread;
  char why[512]; /* the first wrong result or failed call; "" when none */
  int rc;        /* the broken ring's call */
  char msg[512];
  int service_calls;
  bool closed; /* a call failed: its ends are closed, it takes no part any more */
  /* Digests of results every rank must have bit for bit (compression),
   * compared across the ranks when the job ends. */
  uint64_t digest[96];
  int ndigest;
};

struct ring_job {
  int n;
  size_t piece;
  struct sim_rank *ranks;
  void (*body)(struct sim_rank *);
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int finished;
  atomic_bool watchdog;        /* out of time: every service hook fails */
  int break_rank, break_after; /* that rank's hook breaks a link on that call: */
  int break_peer;              /* its data connection to this rank (-1: its ring's next) */
  int hold_rank;               /* the broken-link tests: this rank starts after the break */
  int which;                   /* the body's variant */
  atomic_bool broken;          /* it has */
};

static int rank_service(void *arg) {
  struct sim_rank *k = arg;
  struct ring_job *job = k->job;
  k->service_calls++;
  if (job->break_after && k->comm.rank == job->break_rank && k->service_calls == job->break_after) {
    hora__mock_break(job->break_peer >= 0 ? k->proc.data[job->break_peer]
                                          : k->comm.world_ring.next);
    atomic_store(&job->broken, true);
  }
  if (atomic_load(&job->watchdog)) {
    return hora__error(HORA_ERR_ABORTED, "the test's watchdog ran out");
  }
  return HORA_SUCCESS;
}

/* The ring's ends are data connections: closed with them. */
static void close_ends(struct sim_rank *k) {
  for (int r = 0; k->proc.data && r < k->job->n; r++) {
    if (k->proc.data[r]) {
      k->proc.data[r]->tp->close(k->proc.data[r]);
      k->proc.data[r] = NULL;
    }
  }
  k->comm.world_ring.next = k->comm.world_ring.prev = NULL;
  k->closed = true;
}

/* Every rank forced to `name` for kind (NULL: the name is unknown). */
static bool job_force(struct ring_job *job, enum hora__coll_kind kind, const char *name) {
  const struct hora__algo *a = hora__algo_find(kind, name);
  for (int r = 0; r < job->n; r++) {
    job->ranks[r].comm.forced[kind] = a;
  }
  return a != NULL;
}

/* n ranks, each linked to every other, whose links move at most `piece`
 * bytes per progress call (0: any number); the ring algorithms forced. */
static int job_start(struct ring_job *job, int n, size_t piece, int64_t chunk_bytes,
                     uint64_t service_ns) {
  memset(job, 0, sizeof(*job));
  pthread_mutex_init(&job->mu, NULL);
  pthread_cond_init(&job->cv, NULL);
  atomic_init(&job->watchdog, false);
  atomic_init(&job->broken, false);
  job->n = n;
  job->piece = piece;
  job->break_peer = -1;
  job->ranks = calloc((size_t)n, sizeof(*job->ranks));
  if (!job->ranks) {
    return HORA_ERR_NO_MEMORY;
  }
  for (int r = 0; r < n; r++) {
    job->ranks[r].job = job;
    job->ranks[r].proc.data = calloc((size_t)n, sizeof(hora__conn *));
    if (!job->ranks[r].proc.data) {
      return HORA_ERR_NO_MEMORY;
    }
  }
  for (int r = 0; r < n; r++) {
    struct sim_rank *k = &job->ranks[r];
    k->job = job;
    hora__net *net = &k->proc.net;
    net->rank = r;
    net->size = n;
    net->spin_us = 0; /* more threads than cores: never spin */
    net->service = rank_service;
    net->service_arg = k;
    net->service_interval_ns = service_ns;
    k->proc.chunk_bytes = chunk_bytes;
    k->proc.tcp_listen_fd = k->proc.unix_listen_fd = k->proc.reserve_fd = -1;
    hora__comm *c = &k->comm;
    c->proc = &k->proc;
    c->net = net;
    c->rank = r;
    c->size = n;
    c->local_rank = 0;
    c->local_size = 1;
    c->cross_rank = r;
    c->cross_size = n;
    c->world_ring.pos = r;
    c->world_ring.size = n;
    c->partners = true; /* every pair is linked already */
  }
  job_force(job, HORA_COLL_ALLREDUCE, "ring");
  job_force(job, HORA_COLL_BROADCAST, "ring");
  job_force(job, HORA_COLL_ALLGATHER, "ring");
  job_force(job, HORA_COLL_REDUCESCATTER, "ring");
  for (int a = 0; a < n; a++) {
    for (int b = a + 1; b < n; b++) {
      int rc =
          hora__mock_pair(a, b, piece, &job->ranks[a].proc.data[b], &job->ranks[b].proc.data[a]);
      if (rc != HORA_SUCCESS) {
        return rc;
      }
    }
  }
  for (int r = 0; r < n; r++) {
    hora__comm *c = &job->ranks[r].comm;
    c->world_ring.next = job->ranks[r].proc.data[(r + 1) % n];
    c->world_ring.prev = job->ranks[r].proc.data[(r + n - 1) % n];
  }
  return HORA_SUCCESS;
}

static void job_end(struct ring_job *job) {
  for (int r = 0; job->ranks && r < job->n; r++) {
    struct sim_rank *k = &job->ranks[r];
    close_ends(k);
    free(k->proc.data);
    free(k->comm.scratch);
    free(k->comm.fusion);
    free(k->comm.temp);
    free(k->comm.reduced);
  }
  free(job->ranks);
  job->ranks = NULL;
  pthread_cond_destroy(&job->cv);
  pthread_mutex_destroy(&job->mu);
}

static void *rank_thread(void *arg) {
  struct sim_rank *k = arg;
  k->job->body(k);
  pthread_mutex_lock(&k->job->mu);
  k->job->finished++;
  pthread_cond_signal(&k->job->cv);
  pthread_mutex_unlock(&k->job->mu);
  return NULL;
}

static bool wait_finished(struct ring_job *job, int want, int limit_s) {
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += limit_s;
  pthread_mutex_lock(&job->mu);
  int rc = 0;
  while (job->finished < want && rc == 0) {
    rc = pthread_cond_timedwait(&job->cv, &job->mu, &deadline);
  }
  bool all = job->finished >= want;
  pthread_mutex_unlock(&job->mu);
  return all;
}

/* Runs body on every rank, each on its own thread. Returns what went
 * wrong, or NULL: a rank's first complaint, a thread that did not start,
 * or a ring that did not finish in time. */
static const char *job_run(struct ring_job *job, void (*body)(struct sim_rank *), char *why,
                           size_t why_len) {
  job->body = body;
  job->finished = 0;
  int started = 0;
  while (started < job->n && pthread_create(&job->ranks[started].thread, NULL, rank_thread,
                                            &job->ranks[started]) == 0) {
    started++;
  }
  bool in_time = wait_finished(job, started, RING_LIMIT_S);
  if (!in_time) {
    atomic_store(&job->watchdog, true);
    if (!wait_finished(job, started, RING_LIMIT_S)) {
      fprintf(stderr, "ring of %d: ranks still hang after the watchdog; giving up\n", job->n);
      abort();
    }
  }
  for (int r = 0; r < started; r++) {
    pthread_join(job->ranks[r].thread, NULL);
  }
  why[0] = '\0';
  if (started < job->n) {
    snprintf(why, why_len, "ring of %d: only %d threads started", job->n, started);
  } else if (!in_time) {
    snprintf(why, why_len, "ring of %d (piece %zu) did not finish in %d s", job->n, job->piece,
             RING_LIMIT_S);
  }
  for (int r = 0; r < job->n && !why[0]; r++) {
    if (job->ranks[r].why[0]) {
      snprintf(why, why_len, "ring of %d (piece %zu): %s", job->n, job->piece, job->ranks[r].why);
    }
  }
  const struct sim_rank *first = &job->ranks[0];
  for (int r = 1; r < job->n && !why[0]; r++) {
    const struct sim_rank *k = &job->ranks[r];
    int d = 0;
    while (d < first->ndigest && d < k->ndigest && k->digest[d] == first->digest[d]) {
      d++;
    }
    if (d < first->ndigest || d < k->ndigest) {
      snprintf(why, why_len,
               "ring of %d (piece %zu): rank %d's result %d differs from rank 0's "
               "bits (%d and %d results)",
               job->n, job->piece, r, d, k->ndigest, first->ndigest);
    }
  }
  return why[0] ? why : NULL;
}

/* Records a rank's first complaint; the rank carries on, so the others
 * are not left waiting. */
static void note(struct sim_rank *k, int line, const char *fmt, ...) HORA_PRINTF(3, 4);
static void note(struct sim_rank *k, int line, const char *fmt, ...) {
  if (k->why[0]) {
    return;
  }
  int n = snprintf(k->why, sizeof(k->why), "rank %d, line %d: ", k->comm.rank, line);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(k->why + n, sizeof(k->why) - (size_t)n, fmt, ap);
  va_end(ap);
}

#define EXPECT(k, cond, ...)            \
  do {                                  \
    if (!(cond)) {                      \
      note((k), __LINE__, __VA_ARGS__); \
    }                                   \
  } while (0)

/* A collective that fails leaves the ring unusable: say why, close this
 * rank's ends as the runtime does after a fatal error (so the neighbours
 * fail instead of waiting) and stop. */
#define CALL(k, call)                                                           \
  do {                                                                          \
    int call_rc_ = (call);                                                      \
    if (call_rc_ != HORA_SUCCESS) {                                             \
      note((k), __LINE__, "%s failed: %s (%s)", #call, hora_strerror(call_rc_), \
           hora__error_message());                                              \
      close_ends(k);                                                            \
      goto out;                                                                 \
    }                                                                           \
  } while (0)

/* Every ring size, tiny pieces with tiny chunks and unbounded pieces with
 * 4 KiB chunks. */
static void run_rings(void (*body)(struct sim_rank *)) {
  static const int sizes[] = {1, 2, 3, 4, 5, 8};
  static const struct {
    size_t piece;
    int64_t chunk;
  } links[] = {{13, 256}, {0, 4096}};
  char why[1024];
  for (size_t s = 0; s < HORA_ARRAY_SIZE(sizes); s++) {
    for (size_t l = 0; l < HORA_ARRAY_SIZE(links); l++) {
      struct ring_job job;
      int rc = job_start(&job, sizes[s], links[l].piece, links[l].chunk, 50 * MS);
      const char *bad = NULL;
      if (rc != HORA_SUCCESS) {
        snprintf(why, sizeof(why), "setting up a ring of %d: %s", sizes[s], hora_strerror(rc));
        bad = why;
      } else {
        bad = job_run(&job, body, why, sizeof(why));
      }
      job_end(&job);
      if (bad) {
        FAIL("%.480s", bad);
      }
    }
  }
}

/* ---- inputs and their reductions, computed directly ---------------------- */

/* Small integers: float sums are exact in any order, and fit float16. */
static float in_f32(int rank, size_t i) {
  return (float)((int)(((size_t)rank * 37 + i * 11) % 23) - 11);
}

static float in_max(int rank, size_t i) {
  return in_f32(rank, i) + 0.5f * (float)(((size_t)rank + i) % 3);
}

/* Large integers: sums wrap around. */
static int32_t in_i32(int rank, size_t i) {
  return (int32_t)((uint32_t)rank * 2654435761u + (uint32_t)i * 40503u);
}

static int32_t in_small(int rank, size_t i) {
  return (int32_t)(((size_t)rank * 7 + i) % 19) - 9;
}

static float sum_f32(int n, size_t i) {
  float s = 0;
  for (int r = 0; r < n; r++) {
    s += in_f32(r, i);
  }
  return s;
}

static float max_f32(int n, size_t i) {
  float m = in_max(0, i);
  for (int r = 1; r < n; r++) {
    m = HORA_MAX(m, in_max(r, i));
  }
  return m;
}

static int32_t sum_i32(int n, size_t i) {
  uint32_t s = 0;
  for (int r = 0; r < n; r++) {
    s += (uint32_t)in_i32(r, i);
  }
  return (int32_t)s;
}

static int32_t min_i32(int n, size_t i) {
  int32_t m = in_i32(0, i);
  for (int r = 1; r < n; r++) {
    m = HORA_MIN(m, in_i32(r, i));
  }
  return m;
}

static int32_t sum_small(int n, size_t i) {
  int32_t s = 0;
  for (int r = 0; r < n; r++) {
    s += in_small(r, i);
  }
  return s;
}

static void fill_bytes(char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) {
    p[i] = (char)(seed * 151u + i * 13u + (i >> 9));
  }
}

static bool bytes_are(const char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) {
    if (p[i] != (char)(seed * 151u + i * 13u + (i >> 9))) {
      return false;
    }
  }
  return true;
}

#define SENTINEL_F32 (-12345.5f)
#define SENTINEL_I32 ((int32_t)0x5eed5eed)

/* First index where got and want (float arrays) differ, or n. */
static size_t first_diff_f32(const float *got, const float *want, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (got[i] != want[i]) {
      return i;
    }
  }
  return n;
}

static size_t first_diff_i32(const int32_t *got, const int32_t *want, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (got[i] != want[i]) {
      return i;
    }
  }
  return n;
}

#define EXPECT_F32(k, got, want, n, what)                                                        \
  do {                                                                                           \
    size_t d_ = first_diff_f32((got), (want), (n));                                              \
    EXPECT((k), d_ == (n), "%s: element %zu of %zu is %g, expected %g", (what), d_, (size_t)(n), \
           (double)(got)[d_ < (n) ? d_ : 0], (double)(want)[d_ < (n) ? d_ : 0]);                 \
  } while (0)

#define EXPECT_I32(k, got, want, n, what)                                                        \
  do {                                                                                           \
    size_t d_ = first_diff_i32((got), (want), (n));                                              \
    EXPECT((k), d_ == (n), "%s: element %zu of %zu is %d, expected %d", (what), d_, (size_t)(n), \
           (int)(got)[d_ < (n) ? d_ : 0], (int)(want)[d_ < (n) ? d_ : 0]);                       \
  } while (0)

/* ---- hora__ring_allreduce ------------------------------------------------- */

static void body_allreduce(struct sim_rank *k) {
  /* 0 and 1, fewer elements than ranks, counts no ring size divides, and
   * enough for many chunks per segment. */
  static const size_t counts[] = {0, 1, 2, 3, 5, 7, 9, 1000, 20011};
  const int n = k->comm.size, me = k->comm.rank;
  const struct hora__ring_view *ring = &k->comm.world_ring;
  hora__comm *c = &k->comm;
  for (size_t ci = 0; ci < HORA_ARRAY_SIZE(counts); ci++) {
    size_t count = counts[ci];
    float *fin = malloc((count + 1) * sizeof(float));
    float *fout = malloc((count + 1) * sizeof(float));
    float *fwant = malloc((count + 1) * sizeof(float));
    int32_t *iin = malloc((count + 1) * sizeof(int32_t));
    int32_t *iout = malloc((count + 1) * sizeof(int32_t));
    int32_t *iwant = malloc((count + 1) * sizeof(int32_t));
    char what[64];
    if (!fin || !fout || !fwant || !iin || !iout || !iwant) {
      note(k, __LINE__, "out of memory");
      close_ends(k);
      goto out;
    }
    /* float32 SUM, out of place; the input stays as it was. */
    for (size_t i = 0; i <= count; i++) {
      fin[i] = in_f32(me, i);
      fout[i] = SENTINEL_F32;
      fwant[i] = sum_f32(n, i);
    }
    CALL(k, hora__ring_allreduce(c, ring, fin, fout, count, HORA_FLOAT32, HORA_SUM, HORA_FLOAT32));
    snprintf(what, sizeof(what), "float32 sum of %zu", count);
    EXPECT_F32(k, fout, fwant, count, what);
    EXPECT(k, fout[count] == SENTINEL_F32, "%s: wrote past the end", what);
    for (size_t i = 0; i < count; i++) {
      fwant[i] = in_f32(me, i);
    }
    EXPECT_F32(k, fin, fwant, count, "the sum's input");

    /* float32 SUM, float16 on the wire (exact for these values). */
    for (size_t i = 0; i <= count; i++) {
      fout[i] = SENTINEL_F32;
      fwant[i] = sum_f32(n, i);
    }
    CALL(k, hora__ring_allreduce(c, ring, fin, fout, count, HORA_FLOAT32, HORA_SUM, HORA_FLOAT16));
    snprintf(what, sizeof(what), "float32 sum of %zu over float16", count);
    EXPECT_F32(k, fout, fwant, count, what);
    EXPECT(k, fout[count] == SENTINEL_F32, "%s: wrote past the end", what);

    /* float32 SUM in place, bfloat16 on the wire (exact too): the owner
     * of each finished segment rounds its own copy in place. */
    for (size_t i = 0; i <= count; i++) {
      fout[i] = i < count ? in_f32(me, i) : SENTINEL_F32;
      fwant[i] = sum_f32(n, i);
    }
    CALL(k,
         hora__ring_allreduce(c, ring, fout, fout, count, HORA_FLOAT32, HORA_SUM, HORA_BFLOAT16));
    snprintf(what, sizeof(what), "float32 sum of %zu in place over bfloat16", count);
    EXPECT_F32(k, fout, fwant, count, what);
    EXPECT(k, fout[count] == SENTINEL_F32, "%s: wrote past the end", what);

    /* float32 MAX, in place. */
    for (size_t i = 0; i <= count; i++) {
      fout[i] = i < count ? in_max(me, i) : SENTINEL_F32;
      fwant[i] = max_f32(n, i);
    }
    CALL(k, hora__ring_allreduce(c, ring, fout, fout, count, HORA_FLOAT32, HORA_MAX, HORA_FLOAT32));
    snprintf(what, sizeof(what), "float32 max of %zu in place", count);
    EXPECT_F32(k, fout, fwant, count, what);
    EXPECT(k, fout[count] == SENTINEL_F32, "%s: wrote past the end", what);

    /* int32 SUM (wrapping), out of place. */
    for (size_t i = 0; i <= count; i++) {
      iin[i] = in_i32(me, i);
      iout[i] = SENTINEL_I32;
      iwant[i] = sum_i32(n, i);
    }
    CALL(k, hora__ring_allreduce(c, ring, iin, iout, count, HORA_INT32, HORA_SUM, HORA_INT32));
    snprintf(what, sizeof(what), "int32 sum of %zu", count);
    EXPECT_I32(k, iout, iwant, count, what);
    EXPECT(k, iout[count] == SENTINEL_I32, "%s: wrote past the end", what);

    /* int32 MIN, in place. */
    for (size_t i = 0; i <= count; i++) {
      iout[i] = i < count ? in_i32(me, i) : SENTINEL_I32;
      iwant[i] = min_i32(n, i);
    }
    CALL(k, hora__ring_allreduce(c, ring, iout, iout, count, HORA_INT32, HORA_MIN, HORA_INT32));
    snprintf(what, sizeof(what), "int32 min of %zu in place", count);
    EXPECT_I32(k, iout, iwant, count, what);
    EXPECT(k, iout[count] == SENTINEL_I32, "%s: wrote past the end", what);
  out:
    free(fin);
    free(fout);
    free(fwant);
    free(iin);
    free(iout);
    free(iwant);
    if (k->closed) {
      return; /* a call failed: this rank is out of the ring */
    }
  }
}

TEST(ring_allreduce_matches_direct_reductions) {
  run_rings(body_allreduce);
}

/* ---- hora__ring_broadcast -------------------------------------------------- */

static void body_broadcast(struct sim_rank *k) {
  static const size_t sizes[] = {0, 1, 2 * 4096 + 3, 10000};
  const int n = k->comm.size, me = k->comm.rank;
  char *buf = malloc(10000 + 1);
  if (!buf) {
    note(k, __LINE__, "out of memory");
    close_ends(k);
    return;
  }
  for (int root = 0; root < n; root++) {
    for (size_t s = 0; s < HORA_ARRAY_SIZE(sizes); s++) {
      size_t bytes = sizes[s];
      unsigned seed = (unsigned)(root * 10 + (int)s + 1);
      if (me == root) {
        fill_bytes(buf, bytes, seed);
      } else {
        memset(buf, 0xee, bytes);
      }
      buf[bytes] = 0x77;
      CALL(k, hora__world_ring_broadcast(&k->comm, buf, bytes, root));
      EXPECT(k, bytes_are(buf, bytes, seed), "broadcast of %zu bytes from %d: wrong bytes", bytes,
             root);
      EXPECT(k, buf[bytes] == 0x77, "broadcast of %zu bytes from %d: wrote past the end", bytes,
             root);
    }
  }
out:
  free(buf);
}

TEST(ring_broadcast_from_every_root) {
  run_rings(body_broadcast);
}

/* ---- hora__ring_allgather -------------------------------------------------- */

static void body_allgather(struct sim_rank *k) {
  static const size_t sizes[] = {0, 1, 5000, 3 * 4096 + 1};
  const int n = k->comm.size, me = k->comm.rank;
  size_t most = 3 * 4096 + 1;
  char *send = malloc(most), *recv = malloc((size_t)n * most + 1);
  if (!send || !recv) {
    note(k, __LINE__, "out of memory");
    close_ends(k);
    goto out;
  }
  for (size_t s = 0; s < HORA_ARRAY_SIZE(sizes); s++) {
    for (int in_place = 0; in_place < 2; in_place++) {
      size_t bytes = sizes[s];
      memset(recv, 0xee, (size_t)n * bytes + 1);
      char *mine = in_place ? recv + (size_t)me * bytes : send;
      fill_bytes(mine, bytes, (unsigned)(me * 10 + (int)s + 1));
      CALL(k, hora__ring_allgather(&k->comm, &k->comm.world_ring, mine, bytes, recv));
      for (int r = 0; r < n; r++) {
        EXPECT(k, bytes_are(recv + (size_t)r * bytes, bytes, (unsigned)(r * 10 + (int)s + 1)),
               "allgather of %zu bytes%s: rank %d's block is wrong", bytes,
               in_place ? " in place" : "", r);
      }
      EXPECT(k, (unsigned char)recv[(size_t)n * bytes] == 0xee,
             "allgather of %zu bytes: wrote past the end", bytes);
    }
  }
out:
  free(send);
  free(recv);
}

TEST(ring_allgather_in_and_out_of_place) {
  run_rings(body_allgather);
}

/* ---- the dispatchers: fused lists, scales, AVERAGE -------------------------- */

struct phases {
  int begun, ended;
};

static void count_phase(void *arg, const char *name) {
  struct phases *p = arg;
  if (name) {
    p->begun++;
  } else {
    p->ended++;
  }
}

/* Copies what iovs list into one buffer. */
static void gather(const struct hora__iov *iov, int n, void *out) {
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    memcpy((char *)out + off, iov[i].base, iov[i].len);
    off += iov[i].len;
  }
}

static void body_dispatch(struct sim_rank *k) {
  const int n = k->comm.size, me = k->comm.rank;
  hora__comm *c = &k->comm;
  struct phases ph = {0};
  enum { TOTAL = 1042 };
  static const size_t in_lens[3] = {5, 1000, 37}, out_lens[2] = {600, 442}; /* floats */
  float *in[3] = {NULL}, *outs[2] = {NULL}, *all = malloc(TOTAL * sizeof(float)),
        *want = malloc(TOTAL * sizeof(float));
  int32_t *ibuf = malloc(TOTAL * sizeof(int32_t)), *iwant = malloc(TOTAL * sizeof(int32_t));
  char *bbuf[3] = {NULL};
  static const size_t blens[3] = {3, 5000, 17};
  char *gsend = malloc(777), *grecv = malloc((size_t)n * 777);
  bool ok = all && want && ibuf && iwant && gsend && grecv;
  for (int i = 0; i < 3; i++) {
    ok = ok && (in[i] = malloc(in_lens[i] * sizeof(float))) && (bbuf[i] = malloc(blens[i]));
  }
  for (int i = 0; i < 2; i++) {
    ok = ok && (outs[i] = malloc(out_lens[i] * sizeof(float)));
  }
  if (!ok) {
    note(k, __LINE__, "out of memory");
    close_ends(k);
    goto out;
  }
  struct hora__iov iin[3], iout[2];
  size_t base = 0;
  for (int i = 0; i < 3; i++) {
    for (size_t j = 0; j < in_lens[i]; j++) {
      in[i][j] = in_f32(me, base + j);
    }
    base += in_lens[i];
    iin[i] = (struct hora__iov){in[i], in_lens[i] * sizeof(float)};
  }
  for (int i = 0; i < 2; i++) {
    iout[i] = (struct hora__iov){outs[i], out_lens[i] * sizeof(float)};
  }

  /* Three tensors in, split differently out, through the fusion buffer:
   * prescale 0.5 and postscale 4 (exact: powers of two). */
  struct hora__coll_opts scaled = {
      .prescale = 0.5, .postscale = 4.0, .phase = count_phase, .phase_arg = &ph};
  for (int i = 0; i < 2; i++) {
    for (size_t j = 0; j < out_lens[i]; j++) {
      outs[i][j] = SENTINEL_F32;
    }
  }
  CALL(k,
       hora__allreduce(c, iin, 3, iout, 2, TOTAL, HORA_FLOAT32, HORA_SUM, HORA_FLOAT32, &scaled));
  gather(iout, 2, all);
  for (size_t j = 0; j < TOTAL; j++) {
    want[j] = sum_f32(n, j) * 0.5f * 4.0f; /* 4 * (the sum of x / 2) */
  }
  EXPECT_F32(k, all, want, TOTAL, "fused scaled sum");
  gather(iin, 3, all);
  for (size_t j = 0; j < TOTAL; j++) {
    want[j] = in_f32(me, j);
  }
  EXPECT_F32(k, all, want, TOTAL, "the fused sum's inputs");

  /* AVERAGE: a sum times 1/divisor, as Horovod's; the same lists both ways. */
  struct hora__coll_opts avg = {
      .prescale = 1.0, .divisor = n, .postscale = 1.0, .phase = count_phase, .phase_arg = &ph};
  CALL(k,
       hora__allreduce(c, iin, 3, iin, 3, TOTAL, HORA_FLOAT32, HORA_AVERAGE, HORA_FLOAT32, &avg));
  gather(iin, 3, all);
  for (size_t j = 0; j < TOTAL; j++) {
    want[j] = (float)(1.0 / n) * sum_f32(n, j);
  }
  EXPECT_F32(k, all, want, TOTAL, "fused average in place");

  /* One tensor, straight between the caller's buffers: the prescale works
   * on the output and leaves the input alone. */
  for (size_t j = 0; j < 600; j++) {
    in[1][j] = in_f32(me, j);
    outs[0][j] = SENTINEL_F32;
  }
  struct hora__coll_opts one = {.prescale = 2.0, .postscale = 0.25};
  struct hora__iov i1 = {in[1], 600 * sizeof(float)}, o1 = {outs[0], 600 * sizeof(float)};
  CALL(k, hora__allreduce(c, &i1, 1, &o1, 1, 600, HORA_FLOAT32, HORA_SUM, HORA_FLOAT32, &one));
  for (size_t j = 0; j < 600; j++) {
    want[j] = sum_f32(n, j) * 2.0f * 0.25f;
  }
  EXPECT_F32(k, outs[0], want, 600, "one scaled sum");
  for (size_t j = 0; j < 600; j++) {
    want[j] = in_f32(me, j);
  }
  EXPECT_F32(k, in[1], want, 600, "the scaled sum's input");

  /* int32 AVERAGE of one tensor in place: rounds toward zero. */
  for (size_t j = 0; j < TOTAL; j++) {
    ibuf[j] = in_small(me, j);
    iwant[j] = (int32_t)(sum_small(n, j) / n);
  }
  struct hora__iov ii = {ibuf, TOTAL * sizeof(int32_t)};
  CALL(k, hora__allreduce(c, &ii, 1, &ii, 1, TOTAL, HORA_INT32, HORA_AVERAGE, HORA_INT32, &avg));
  EXPECT_I32(k, ibuf, iwant, TOTAL, "int32 average");

  /* int32 SUM of two tensors, without options. */
  for (size_t j = 0; j < TOTAL; j++) {
    ibuf[j] = in_i32(me, j);
    iwant[j] = sum_i32(n, j);
  }
  struct hora__iov two[2] = {{ibuf, 10 * sizeof(int32_t)},
                             {ibuf + 10, (TOTAL - 10) * sizeof(int32_t)}};
  CALL(k, hora__allreduce(c, two, 2, two, 2, TOTAL, HORA_INT32, HORA_SUM, HORA_INT32, NULL));
  EXPECT_I32(k, ibuf, iwant, TOTAL, "fused int32 sum");

  /* Broadcast of three tensors (fused) and of one, from every root. */
  struct hora__iov bl[3];
  size_t btotal = 0;
  for (int i = 0; i < 3; i++) {
    bl[i] = (struct hora__iov){bbuf[i], blens[i]};
    btotal += blens[i];
  }
  for (int root = 0; root < n; root++) {
    for (int nb = 3; nb >= 1; nb -= 2) {
      size_t bytes = nb == 3 ? btotal : blens[1];
      for (int i = 0; i < 3; i++) {
        if (me == root) {
          fill_bytes(bbuf[i], blens[i], (unsigned)(root * 3 + i + nb));
        } else {
          memset(bbuf[i], 0xee, blens[i]);
        }
      }
      CALL(k, hora__broadcast(c, nb == 3 ? bl : &bl[1], nb, bytes, root, &avg));
      for (int i = nb == 3 ? 0 : 1; i < (nb == 3 ? 3 : 2); i++) {
        EXPECT(k, bytes_are(bbuf[i], blens[i], (unsigned)(root * 3 + i + nb)),
               "broadcast of %d tensors from %d: tensor %d is wrong", nb, root, i);
      }
    }
  }

  /* Allgather. */
  fill_bytes(gsend, 777, (unsigned)me + 40);
  memset(grecv, 0xee, (size_t)n * 777);
  CALL(k, hora__allgather(c, gsend, 777, grecv));
  for (int r = 0; r < n; r++) {
    EXPECT(k, bytes_are(grecv + (size_t)r * 777, 777, (unsigned)r + 40),
           "allgather: rank %d's block is wrong", r);
  }
  EXPECT(k, ph.begun == ph.ended && ph.begun >= 3 + 2 * n, "phases: %d begun, %d ended", ph.begun,
         ph.ended);
out:
  for (int i = 0; i < 3; i++) {
    free(in[i]);
    free(bbuf[i]);
  }
  for (int i = 0; i < 2; i++) {
    free(outs[i]);
  }
  free(all);
  free(want);
  free(ibuf);
  free(iwant);
  free(gsend);
  free(grecv);
}

TEST(host_collectives_fuse_scale_and_average_over_rings) {
  run_rings(body_dispatch);
}

/* ---- every schedule of the registry, forced, through the dispatchers ------ */

/* A list of 1 or 3 tensors holding `count` elements of es bytes in all,
 * unevenly split (some pieces empty for small counts), each in its own
 * allocation followed by one element of guard bytes. */
struct tensors {
  struct hora__iov iov[3];
  int n;
  size_t es;
};

#define GUARD 0xa5

static bool tensors_alloc(struct tensors *t, int n, size_t count, size_t es) {
  size_t lens[3] = {count, 0, 0};
  if (n == 3) {
    lens[0] = count / 5;
    lens[2] = count / 3;
    lens[1] = count - lens[0] - lens[2];
  }
  memset(t, 0, sizeof(*t));
  t->n = n;
  t->es = es;
  bool ok = true;
  for (int i = 0; i < n; i++) {
    t->iov[i].len = lens[i] * es;
    t->iov[i].base = malloc(t->iov[i].len + es);
    ok = ok && t->iov[i].base;
  }
  return ok;
}

static void tensors_free(struct tensors *t) {
  for (int i = 0; i < 3; i++) {
    free(t->iov[i].base);
    t->iov[i].base = NULL;
  }
}

/* The tensors = flat (NULL: 0xee bytes), guards set. */
static void tensors_put(const struct tensors *t, const void *flat) {
  size_t off = 0;
  for (int i = 0; i < t->n; i++) {
    char *b = t->iov[i].base;
    if (flat) {
      memcpy(b, (const char *)flat + off, t->iov[i].len);
    } else {
      memset(b, 0xee, t->iov[i].len);
    }
    memset(b + t->iov[i].len, GUARD, t->es);
    off += t->iov[i].len;
  }
}

static bool tensors_guarded(const struct tensors *t) {
  for (int i = 0; i < t->n; i++) {
    const unsigned char *g = (const unsigned char *)t->iov[i].base + t->iov[i].len;
    for (size_t b = 0; b < t->es; b++) {
      if (g[b] != GUARD) {
        return false;
      }
    }
  }
  return true;
}

/* A result every rank must hold bit for bit. */
static void record_digest(struct sim_rank *k, const void *p, size_t len) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < len; i++) {
    h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
  }
  if (k->ndigest < (int)HORA_ARRAY_SIZE(k->digest)) {
    k->digest[k->ndigest++] = h;
  } else {
    note(k, __LINE__, "more results to compare than digests");
  }
}

static int ceil_log2(int n) {
  int l = 0;
  while ((1 << l) < n) {
    l++;
  }
  return l;
}

/* The inputs and what their reductions must give. Sums of small integers
 * are exact in any order; max and min are exact; the compressed sums
 * (fractions, float16 or bfloat16 on the wire) are checked against the
 * exact sum within the wire type's rounding, once per rounding a path
 * through the schedule can take. */
enum gen { GEN_SUM_F32, GEN_MAX_I32, GEN_MIN_F64, GEN_FRAC_F32, GEN_FRAC_F64 };

static const struct {
  const char *name;
  hora_dtype dtype, wire;
  hora_op op;
  double unit_roundoff; /* the wire type's (0: exact) */
} gens[] = {
    [GEN_SUM_F32] = {"float32 sum", HORA_FLOAT32, HORA_FLOAT32, HORA_SUM, 0},
    [GEN_MAX_I32] = {"int32 max", HORA_INT32, HORA_INT32, HORA_MAX, 0},
    [GEN_MIN_F64] = {"float64 min", HORA_FLOAT64, HORA_FLOAT64, HORA_MIN, 0},
    [GEN_FRAC_F32] = {"float32 sum over float16", HORA_FLOAT32, HORA_FLOAT16, HORA_SUM, 1.0 / 2048},
    [GEN_FRAC_F64] = {"float64 sum over bfloat16", HORA_FLOAT64, HORA_BFLOAT16, HORA_SUM,
                      1.0 / 256},
};

static double in_f64(int rank, size_t i) {
  return (double)in_i32(rank, i) / 1024.0 + rank;
}

static double in_frac(int rank, size_t i) {
  return (double)(((size_t)rank * 7919 + i * 104729) % 2001) / 1000.0 - 1.0;
}

static void gen_input(enum gen g, int rank, size_t count, void *buf) {
  for (size_t i = 0; i < count; i++) {
    switch (g) {
      case GEN_SUM_F32:
        ((float *)buf)[i] = in_f32(rank, i);
        break;
      case GEN_MAX_I32:
        ((int32_t *)buf)[i] = in_i32(rank, i);
        break;
      case GEN_MIN_F64:
        ((double *)buf)[i] = in_f64(rank, i);
        break;
      case GEN_FRAC_F32:
        ((float *)buf)[i] = (float)in_frac(rank, i);
        break;
      case GEN_FRAC_F64:
        ((double *)buf)[i] = in_frac(rank, i);
        break;
    }
  }
}

static double got_at(hora_dtype dtype, const void *p, size_t j) {
  switch (dtype) {
    case HORA_FLOAT32:
      return ((const float *)p)[j];
    case HORA_INT32:
      return ((const int32_t *)p)[j];
    default:
      return ((const double *)p)[j];
  }
}

/* The first of len elements of got (the result's elements first .. first
 * + len over n ranks, sums times `scale`) that is wrong, or len; *gv, *wv
 * its value and the one expected. `rounds`: how many times a compressed
 * partial sum may have been rounded through the wire type. */
static size_t gen_check(enum gen g, int n, size_t first, size_t len, double scale, int rounds,
                        const void *got, double *gv, double *wv) {
  for (size_t j = 0; j < len; j++) {
    size_t i = first + j;
    double want = 0, mag = 0, v = got_at(gens[g].dtype, got, j);
    int32_t m32 = in_i32(0, i);
    double m64 = in_f64(0, i);
    switch (g) {
      case GEN_SUM_F32:
        want = (double)sum_f32(n, i) * scale;
        break;
      case GEN_MAX_I32:
        for (int r = 1; r < n; r++) {
          m32 = HORA_MAX(m32, in_i32(r, i));
        }
        want = m32;
        break;
      case GEN_MIN_F64:
        for (int r = 1; r < n; r++) {
          m64 = HORA_MIN(m64, in_f64(r, i));
        }
        want = m64;
        break;
      case GEN_FRAC_F32:
      case GEN_FRAC_F64:
        for (int r = 0; r < n; r++) {
          double x = g == GEN_FRAC_F32 ? (double)(float)in_frac(r, i) : in_frac(r, i);
          want += x;
          mag += x < 0 ? -x : x;
        }
        break;
    }
    double err = v - want, tol = rounds * gens[g].unit_roundoff * mag;
    if (gens[g].unit_roundoff ? !(err <= tol && -err <= tol) : v != want) {
      *gv = v;
      *wv = want;
      return j;
    }
  }
  return len;
}

/* How often a compressed partial sum can be rounded on its way: the ring
 * once per hop, the logarithmic schedules once per step and fold. */
static int wire_rounds(const hora__comm *c) {
  return strcmp(c->forced[HORA_COLL_ALLREDUCE]->name, "ring") == 0 ? c->size + 2
                                                                   : ceil_log2(c->size) + 3;
}

/* The allreduce forced, through hora__allreduce: every dtype and op of
 * gens, in place and not, one tensor and three fused. */
static void body_sched_allreduce(struct sim_rank *k) {
  static const size_t counts[] = {0, 1, 2, 3, 5, 7, 13, 100, 1001, 4099};
  const int n = k->comm.size, me = k->comm.rank;
  hora__comm *c = &k->comm;
  const int rounds = wire_rounds(c);
  char *flat = malloc(4099 * 8), *orig = malloc(4099 * 8);
  struct hora__coll_opts scaled = {.prescale = 0.5, .postscale = 4.0};
  if (!flat || !orig) {
    note(k, __LINE__, "out of memory");
    close_ends(k);
    goto out;
  }
  for (size_t ci = 0; ci < HORA_ARRAY_SIZE(counts); ci++) {
    for (int nl = 1; nl <= 3; nl += 2) {
      for (int gi = 0; gi < (int)HORA_ARRAY_SIZE(gens); gi++) {
        enum gen g = (enum gen)gi;
        const size_t count = counts[ci], es = hora_dtype_size(gens[g].dtype);
        const bool in_place = (nl == 3) == (gi % 2 == 0);
        /* Sums of integers with the scales (exact: powers of two). */
        const struct hora__coll_opts *opts = g == GEN_SUM_F32 ? &scaled : NULL;
        struct tensors tin, tout;
        memset(&tout, 0, sizeof(tout));
        bool ok = tensors_alloc(&tin, nl, count, es);
        ok = (in_place || tensors_alloc(&tout, nl, count, es)) && ok;
        char what[96];
        snprintf(what, sizeof(what), "%s %s of %zu in %d tensor(s)%s",
                 c->forced[HORA_COLL_ALLREDUCE]->name, gens[g].name, count, nl,
                 in_place ? " in place" : "");
        int rc = HORA_ERR_NO_MEMORY;
        const struct tensors *to = in_place ? &tin : &tout;
        if (ok) {
          gen_input(g, me, count, orig);
          tensors_put(&tin, orig);
          if (!in_place) {
            tensors_put(&tout, NULL);
          }
          rc = hora__allreduce(c, tin.iov, nl, to->iov, nl, count, gens[g].dtype, gens[g].op,
                               gens[g].wire, opts);
        }
        if (rc != HORA_SUCCESS) {
          note(k, __LINE__, "%s failed: %s (%s)", what, hora_strerror(rc), hora__error_message());
          close_ends(k);
          tensors_free(&tin);
          tensors_free(&tout);
          goto out;
        }
        double gv = 0, wv = 0;
        gather(to->iov, nl, flat);
        size_t d = gen_check(g, n, 0, count, opts ? 2.0 : 1.0, rounds, flat, &gv, &wv);
        EXPECT(k, d == count, "%s: element %zu is %.17g, expected %.17g", what, d, gv, wv);
        EXPECT(k, tensors_guarded(to), "%s: wrote past a tensor's end", what);
        if (gens[g].wire != gens[g].dtype) {
          record_digest(k, flat, count * es);
        }
        if (!in_place) {
          gather(tin.iov, nl, flat);
          EXPECT(k, memcmp(flat, orig, count * es) == 0 && tensors_guarded(&tin),
                 "%s: the input changed", what);
        }
        tensors_free(&tin);
        tensors_free(&tout);
      }
    }
  }
out:
  free(flat);
  free(orig);
}

/* The broadcast forced, through hora__broadcast: every root, one tensor
 * and three fused. */
static void body_sched_broadcast(struct sim_rank *k) {
  static const size_t sizes[] = {0, 1, 5, 1000, 3 * 256 + 7, 5003};
  const int n = k->comm.size, me = k->comm.rank;
  hora__comm *c = &k->comm;
  struct phases ph = {0};
  struct hora__coll_opts opts = {
      .prescale = 1.0, .postscale = 1.0, .phase = count_phase, .phase_arg = &ph};
  char *flat = malloc(5003);
  if (!flat) {
    note(k, __LINE__, "out of memory");
    close_ends(k);
    return;
  }
  for (int root = 0; root < n; root++) {
    for (size_t s = 0; s < HORA_ARRAY_SIZE(sizes); s++) {
      for (int nl = 1; nl <= 3; nl += 2) {
        const size_t bytes = sizes[s];
        const unsigned seed = (unsigned)(root * 31 + (int)s * 3 + nl);
        struct tensors t;
        int rc = HORA_ERR_NO_MEMORY;
        if (tensors_alloc(&t, nl, bytes, 1)) {
          if (me == root) {
            fill_bytes(flat, bytes, seed);
            tensors_put(&t, flat);
          } else {
            tensors_put(&t, NULL);
          }
          rc = hora__broadcast(c, t.iov, nl, bytes, root, &opts);
        }
        if (rc != HORA_SUCCESS) {
          note(k, __LINE__, "broadcast of %zu bytes from %d failed: %s (%s)", bytes, root,
               hora_strerror(rc), hora__error_message());
          close_ends(k);
          tensors_free(&t);
          goto out;
        }
        gather(t.iov, nl, flat);
        EXPECT(k, bytes_are(flat, bytes, seed),
               "%s broadcast of %zu bytes in %d tensor(s) from %d: wrong bytes",
               c->forced[HORA_COLL_BROADCAST]->name, bytes, nl, root);
        EXPECT(k, tensors_guarded(&t),
               "broadcast of %zu bytes in %d tensor(s) from %d: wrote past a tensor's end", bytes,
               nl, root);
        tensors_free(&t);
      }
    }
  }
  EXPECT(k, ph.begun == ph.ended && ph.begun == n * (int)HORA_ARRAY_SIZE(sizes) * 2,
         "phases: %d begun, %d ended", ph.begun, ph.ended);
out:
  free(flat);
}

/* The allgather forced, through hora__allgather, in place and not. */
static void body_sched_allgather(struct sim_rank *k) {
  static const size_t sizes[] = {0, 1, 3, 1000, 2 * 256 + 1, 4099};
  const int n = k->comm.size, me = k->comm.rank;
  size_t most = 4099;
  char *send = malloc(most), *recv = malloc((size_t)n * most + 1);
  if (!send || !recv) {
    note(k, __LINE__, "out of memory");
    close_ends(k);
    goto out;
  }
  for (size_t s = 0; s < HORA_ARRAY_SIZE(sizes); s++) {
    for (int in_place = 0; in_place < 2; in_place++) {
      size_t bytes = sizes[s];
      memset(recv, 0xee, (size_t)n * bytes + 1);
      char *mine = in_place ? recv + (size_t)me * bytes : send;
      fill_bytes(mine, bytes, (unsigned)(me * 10 + (int)s + 1));
      CALL(k, hora__allgather(&k->comm, mine, bytes, recv));
      for (int r = 0; r < n; r++) {
        EXPECT(k, bytes_are(recv + (size_t)r * bytes, bytes, (unsigned)(r * 10 + (int)s + 1)),
               "%s allgather of %zu bytes%s: rank %d's block is wrong",
               k->comm.forced[HORA_COLL_ALLGATHER]->name, bytes, in_place ? " in place" : "", r);
      }
      EXPECT(k, (unsigned char)recv[(size_t)n * bytes] == 0xee,
             "allgather of %zu bytes: wrote past the end", bytes);
      if (!in_place) {
        EXPECT(k, bytes_are(send, bytes, (unsigned)(me * 10 + (int)s + 1)),
               "allgather of %zu bytes: the input changed", bytes);
      }
    }
  }
out:
  free(send);
  free(recv);
}

/* The reducescatter forced, through hora__reducescatter (Horovod's blocks
 * of whole rows of 1 or 3 elements) and hora__reducescatter_at (explicit
 * blocks, here in reverse rank order; or so, rank 0 keeping nothing, as a
 * joined rank: its elements are nobody's). Exact dtypes and ops, and
 * float16 on the wire; every other one in place (the block at the start
 * of the input). */
static void body_sched_reducescatter(struct sim_rank *k) {
  static const size_t rows[] = {0, 1, 2, 3, 5, 13, 100, 334};
  static const enum gen gs[] = {GEN_SUM_F32, GEN_MAX_I32, GEN_MIN_F64, GEN_FRAC_F32};
  const int n = k->comm.size, me = k->comm.rank;
  hora__comm *c = &k->comm;
  /* Compressed partial sums are rounded once per hop of the ring, per
   * step (and fold) of the halving, or as the allreduce rounds them. */
  const int rounds = strcmp(c->forced[HORA_COLL_REDUCESCATTER]->name, "allreduce") == 0
                         ? wire_rounds(c)
                         : n + 2;
  char *send = malloc(334 * 3 * 8), *orig = malloc(334 * 3 * 8), *recv = malloc(334 * 3 * 8 + 8);
  struct hora__coll_opts scaled = {.prescale = 0.5, .postscale = 4.0};
  if (!send || !orig || !recv) {
    note(k, __LINE__, "out of memory");
    close_ends(k);
    goto out;
  }
  for (size_t unit = 1; unit <= 3; unit += 2) {
    for (size_t ri = 0; ri < HORA_ARRAY_SIZE(rows); ri++) {
      for (size_t gi = 0; gi < HORA_ARRAY_SIZE(gs); gi++) {
        for (int given = 0; given < 3; given++) {
          enum gen g = gs[gi];
          const size_t count = rows[ri] * unit, es = hora_dtype_size(gens[g].dtype);
          const struct hora__coll_opts *opts = g == GEN_SUM_F32 ? &scaled : NULL;
          const bool in_place = (ri + gi + (size_t)given) % 2 == 1;
          char *into = in_place ? send : recv;
          size_t start, len;
          hora__block_range(count, given ? 1 : unit, n, given ? n - 1 - me : me, &start, &len);
          if (given == 2 && me == 0) {
            start = len = 0;
          }
          gen_input(g, me, count, send);
          memcpy(orig, send, count * es);
          memset(recv, 0xee, (len + 1) * es);
          if (given) {
            CALL(k, hora__reducescatter_at(c, send, into, count, start, len, gens[g].dtype,
                                           gens[g].op, gens[g].wire, opts));
          } else {
            CALL(k, hora__reducescatter(c, send, into, count, unit, gens[g].dtype, gens[g].op,
                                        gens[g].wire, opts));
          }
          double gv = 0, wv = 0;
          size_t d = gen_check(g, n, start, len, opts ? 2.0 : 1.0, rounds, into, &gv, &wv);
          EXPECT(k, d == len,
                 "%s reducescatter (%s) %s of %zu%s%s: element %zu of block [%zu, +%zu) is "
                 "%.17g, expected %.17g",
                 c->forced[HORA_COLL_REDUCESCATTER]->name, c->forced[HORA_COLL_ALLREDUCE]->name,
                 gens[g].name, count, given ? " at" : "", in_place ? " in place" : "", start + d,
                 start, len, gv, wv);
          if (!in_place) {
            bool guard = true;
            for (size_t b = 0; b < es; b++) {
              guard = guard && (unsigned char)recv[len * es + b] == 0xee;
            }
            EXPECT(k, guard, "reducescatter %s of %zu: wrote past the block", gens[g].name,
                   count);
            EXPECT(k, memcmp(send, orig, count * es) == 0,
                   "reducescatter %s of %zu: the input changed", gens[g].name, count);
          } else {
            /* In place: only the block at the start is written. */
            EXPECT(k, memcmp(send + len * es, orig + len * es, (count - len) * es) == 0,
                   "reducescatter %s of %zu in place: wrote past the block", gens[g].name,
                   count);
          }
        }
      }
    }
  }
out:
  free(send);
  free(orig);
  free(recv);
}

/* body at every size below, over tiny pieces with tiny chunks and over
 * unbounded pieces with 4 KiB chunks, with the algorithms named forced
 * (NULL: the ring's). */
static void run_forced(void (*body)(struct sim_rank *), const char *allreduce,
                       const char *broadcast, const char *allgather, const char *reducescatter) {
  static const int all_sizes[] = {1, 2, 3, 5, 6, 7, 8, 13, 16}, few_sizes[] = {1, 3, 8};
  static const struct {
    size_t piece;
    int64_t chunk;
  } links[] = {{13, 256}, {0, 4096}};
  /* A power of two and not, in small pieces (sweep_few): the full sweep
   * took minutes under valgrind. */
  bool few = sweep_few();
  const int *sizes = few ? few_sizes : all_sizes;
  size_t nsizes = few ? HORA_ARRAY_SIZE(few_sizes) : HORA_ARRAY_SIZE(all_sizes);
  size_t nlinks = few ? 1 : HORA_ARRAY_SIZE(links);
  const char *names[HORA_ALGO_KINDS] = {allreduce, broadcast, allgather, reducescatter};
  char why[1024];
  for (size_t s = 0; s < nsizes; s++) {
    for (size_t l = 0; l < nlinks; l++) {
      struct ring_job job;
      int rc = job_start(&job, sizes[s], links[l].piece, links[l].chunk, 50 * MS);
      const char *bad = NULL;
      if (rc != HORA_SUCCESS) {
        snprintf(why, sizeof(why), "setting up %d ranks: %s", sizes[s], hora_strerror(rc));
        bad = why;
      }
      for (int kd = 0; !bad && kd < HORA_ALGO_KINDS; kd++) {
        if (names[kd] && !job_force(&job, (enum hora__coll_kind)kd, names[kd])) {
          snprintf(why, sizeof(why), "no %s algorithm %s",
                   hora__algo_kind_name((enum hora__coll_kind)kd), names[kd]);
          bad = why;
        }
      }
      if (!bad) {
        bad = job_run(&job, body, why, sizeof(why));
      }
      job_end(&job);
      if (bad) {
        FAIL("%.480s", bad);
      }
    }
  }
}

TEST(schedule_allreduce_ring_every_size_dtype_and_fusion) {
  run_forced(body_sched_allreduce, "ring", NULL, NULL, NULL);
}

TEST(schedule_allreduce_rd_every_size_dtype_and_fusion) {
  run_forced(body_sched_allreduce, "rd", NULL, NULL, NULL);
}

TEST(schedule_allreduce_rabenseifner_every_size_dtype_and_fusion) {
  run_forced(body_sched_allreduce, "rabenseifner", NULL, NULL, NULL);
}

TEST(schedule_allreduce_tree_every_size_dtype_and_fusion) {
  run_forced(body_sched_allreduce, "tree", NULL, NULL, NULL);
}

/* The tree at one rank count: no elements, one, fewer than the ranks, an
 * odd number and enough for many chunks of each half (the links' chunk
 * is 256 bytes), exact sums and maxima and float16 on the wire, fused
 * and not. */
static void body_tree_sizes(struct sim_rank *k) {
  static const enum gen gs[] = {GEN_SUM_F32, GEN_MAX_I32, GEN_FRAC_F32};
  const int n = k->comm.size, me = k->comm.rank;
  hora__comm *c = &k->comm;
  const size_t counts[] = {0, 1, (size_t)(n > 1 ? n - 1 : 1), 7, 1001};
  char *flat = malloc(1001 * 8), *orig = malloc(1001 * 8);
  if (!flat || !orig) {
    note(k, __LINE__, "out of memory");
    close_ends(k);
    goto out;
  }
  for (size_t ci = 0; ci < HORA_ARRAY_SIZE(counts); ci++) {
    for (size_t gi = 0; gi < HORA_ARRAY_SIZE(gs); gi++) {
      enum gen g = gs[gi];
      const size_t count = counts[ci], es = hora_dtype_size(gens[g].dtype);
      const int nl = (ci + gi) % 2 ? 3 : 1;
      struct tensors t;
      int rc = HORA_ERR_NO_MEMORY;
      if (tensors_alloc(&t, nl, count, es)) {
        gen_input(g, me, count, orig);
        tensors_put(&t, orig);
        rc = hora__allreduce(c, t.iov, nl, t.iov, nl, count, gens[g].dtype, gens[g].op,
                             gens[g].wire, NULL);
      }
      if (rc != HORA_SUCCESS) {
        note(k, __LINE__, "tree %s of %zu at %d ranks failed: %s (%s)", gens[g].name, count, n,
             hora_strerror(rc), hora__error_message());
        close_ends(k);
        tensors_free(&t);
        goto out;
      }
      double gv = 0, wv = 0;
      gather(t.iov, nl, flat);
      size_t d = gen_check(g, n, 0, count, 1.0, wire_rounds(c), flat, &gv, &wv);
      EXPECT(k, d == count, "tree %s of %zu at %d ranks: element %zu is %.17g, expected %.17g",
             gens[g].name, count, n, d, gv, wv);
      EXPECT(k, tensors_guarded(&t), "tree %s of %zu: wrote past a tensor's end", gens[g].name,
             count);
      if (gens[g].wire != gens[g].dtype) {
        record_digest(k, flat, count * es);
      }
      tensors_free(&t);
    }
  }
  /* The hierarchical allreduce's step across hosts: the same tree over
   * the members with this local rank (here one per host: all). */
  gen_input(GEN_SUM_F32, me, 1001, flat);
  CALL(k, hora__tree_run(c, true, flat, 1001, HORA_FLOAT32, HORA_SUM, HORA_FLOAT32));
  double gv = 0, wv = 0;
  size_t d = gen_check(GEN_SUM_F32, n, 0, 1001, 1.0, 0, flat, &gv, &wv);
  EXPECT(k, d == 1001, "tree across %d hosts: element %zu is %.17g, expected %.17g", n, d, gv, wv);
out:
  free(flat);
  free(orig);
}

/* Every rank count from 1 to 64, over whole-chunk links (in tiny pieces
 * too up to 16 ranks: more threads than that take too long there). */
TEST(schedule_allreduce_tree_every_rank_count) {
  const int most = sweep_few() ? 9 : 64;
  /* Rank r alone on host r, for the step across hosts. */
  static struct hora__peer_info hosts[64];
  for (int r = 0; r < 64; r++) {
    hosts[r] = (struct hora__peer_info){.host_index = r};
  }
  char why[1024];
  for (int n = 1; n <= most; n++) {
    for (int l = 0; l < (n <= 16 ? 2 : 1); l++) {
      struct ring_job job;
      int rc = job_start(&job, n, l ? 13 : 0, 256, 50 * MS);
      const char *bad = NULL;
      for (int r = 0; rc == HORA_SUCCESS && r < n; r++) {
        job.ranks[r].proc.net.peers = hosts;
      }
      if (rc != HORA_SUCCESS) {
        snprintf(why, sizeof(why), "setting up %d ranks: %s", n, hora_strerror(rc));
        bad = why;
      } else if (!job_force(&job, HORA_COLL_ALLREDUCE, "tree")) {
        bad = "no allreduce algorithm tree";
      } else {
        bad = job_run(&job, body_tree_sizes, why, sizeof(why));
      }
      job_end(&job);
      if (bad) {
        FAIL("%.480s", bad);
      }
    }
  }
}

TEST(schedule_broadcast_ring_every_root) {
  run_forced(body_sched_broadcast, NULL, "ring", NULL, NULL);
}

TEST(schedule_broadcast_binomial_every_root) {
  run_forced(body_sched_broadcast, NULL, "binomial", NULL, NULL);
}

TEST(schedule_broadcast_scatter_allgather_every_root) {
  run_forced(body_sched_broadcast, NULL, "scatter_allgather", NULL, NULL);
}

TEST(schedule_allgather_ring_every_size) {
  run_forced(body_sched_allgather, NULL, NULL, "ring", NULL);
}

TEST(schedule_allgather_bruck_every_size) {
  run_forced(body_sched_allgather, NULL, NULL, "bruck", NULL);
}

TEST(schedule_reducescatter_ring_every_size) {
  run_forced(body_sched_reducescatter, "ring", NULL, NULL, "ring");
}

TEST(schedule_reducescatter_halving_every_size) {
  run_forced(body_sched_reducescatter, "ring", NULL, NULL, "halving");
}

TEST(schedule_reducescatter_over_each_allreduce) {
  static const char *const allreduces[] = {"ring", "rd", "rabenseifner", "tree"};
  for (size_t i = 0; i < HORA_ARRAY_SIZE(allreduces); i++) {
    run_forced(body_sched_reducescatter, allreduces[i], NULL, NULL, "allreduce");
  }
}

/* ---- the hierarchical algorithms' steps across hosts ----------------------
 * H hosts of L ranks, placed in blocks or round robin: the members with
 * each local rank, all groups at once, broadcast from every host and
 * allgather into their ranks' places, by what the model picks for them.
 * Three models, so that every pick runs (the test checks that it did):
 * the built-in one for sockets, latency only, bandwidth only. */
static const struct hora__cost_model cross_models[] = {
    {.link = {60e-6, 1e-9, 0.25e-9}, .local = {6e-6, 0.1e-9, 0.25e-9}},
    {.link = {1.0, 1e-12, 0.25e-9}, .local = {6e-6, 0.1e-9, 0.25e-9}},
    {.link = {0, 1e-6, 0.25e-9}, .local = {6e-6, 0.1e-9, 0.25e-9}},
};
static const size_t cross_sizes[] = {0, 1, 5, 1000, 3001};

/* The algorithms the steps across hosts ran, each once. */
struct picks {
  const struct hora__algo *a[16];
  int n;
};

static void note_pick(struct picks *p, const struct hora__algo *a) {
  for (int i = 0; i < p->n; i++) {
    if (p->a[i] == a) {
      return;
    }
  }
  if (p->n < (int)HORA_ARRAY_SIZE(p->a)) {
    p->a[p->n++] = a;
  }
}

static void body_cross(struct sim_rank *k) {
  hora__comm *c = &k->comm;
  const int n = c->size, H = c->cross_size, me = c->rank;
  const size_t most = 3001;
  char *buf = malloc(most + 1), *recv = malloc((size_t)n * most + 1);
  size_t *at = malloc((size_t)H * sizeof(*at));
  if (!buf || !recv || !at) {
    note(k, __LINE__, "out of memory");
    close_ends(k);
    goto out;
  }
  for (size_t m = 0; m < HORA_ARRAY_SIZE(cross_models); m++) {
    c->model = cross_models[m];
    for (size_t s = 0; s < HORA_ARRAY_SIZE(cross_sizes); s++) {
      size_t bytes = cross_sizes[s];
      for (int root = 0; root < H; root++) {
        unsigned seed = (unsigned)(hora__comm_rank_on_host(c, root) * 7 + (int)(s * 3 + m) + 1);
        if (c->cross_rank == root) {
          fill_bytes(buf, bytes, seed);
        } else {
          memset(buf, 0xee, bytes);
        }
        buf[bytes] = 0x5a;
        CALL(k, hora__cross_broadcast(c, buf, bytes, root));
        EXPECT(k, bytes_are(buf, bytes, seed) && buf[bytes] == 0x5a,
               "%s broadcast of %zu bytes from host %d: wrong",
               hora__cross_algorithm(c, HORA_COLL_BROADCAST, bytes)->name, bytes, root);
      }
      for (int h = 0; h < H; h++) {
        at[h] = (size_t)hora__comm_rank_on_host(c, h) * bytes;
      }
      memset(recv, 0xee, (size_t)n * bytes + 1);
      fill_bytes(buf, bytes, (unsigned)(me * 10 + (int)s + 1));
      CALL(k, hora__cross_allgather(c, buf, bytes, recv, at));
      const char *name = hora__cross_algorithm(c, HORA_COLL_ALLGATHER, bytes)->name;
      for (int r = 0; r < n; r++) {
        const char *block = recv + (size_t)r * bytes;
        if (c->net->peers[r].local_rank == c->local_rank) {
          EXPECT(k, bytes_are(block, bytes, (unsigned)(r * 10 + (int)s + 1)),
                 "%s allgather of %zu bytes: rank %d's block is wrong", name, bytes, r);
        } else {
          EXPECT(k, bytes == 0 || (block[0] == (char)0xee && block[bytes - 1] == (char)0xee),
                 "%s allgather of %zu bytes: wrote into rank %d's block, of another group", name,
                 bytes, r);
        }
      }
      EXPECT(k, (unsigned char)recv[(size_t)n * bytes] == 0xee,
             "%s allgather of %zu bytes: wrote past the end", name, bytes);
    }
  }
out:
  free(buf);
  free(recv);
  free(at);
}

TEST(schedule_cross_broadcast_and_allgather_every_pick) {
  static const struct {
    int hosts, per_host;
  } shapes[] = {{2, 2}, {3, 2}, {5, 1}, {4, 3}};
  static const struct {
    size_t piece;
    int64_t chunk;
  } links[] = {{13, 256}, {0, 4096}};
  static struct hora__peer_info peers[16];
  struct picks picks = {0};
  char why[1024];
  for (size_t t = 0; t < HORA_ARRAY_SIZE(shapes); t++) {
    int H = shapes[t].hosts, L = shapes[t].per_host, n = H * L;
    for (int round_robin = 0; round_robin < 2; round_robin++) {
      for (int r = 0; r < n; r++) {
        int host = round_robin ? r % H : r / L, local = round_robin ? r / H : r % L;
        peers[r] = (struct hora__peer_info){.local_rank = local, .host_index = host};
      }
      for (size_t l = 0; l < HORA_ARRAY_SIZE(links); l++) {
        struct ring_job job;
        int rc = job_start(&job, n, links[l].piece, links[l].chunk, 50 * MS);
        for (int r = 0; rc == HORA_SUCCESS && r < n; r++) {
          hora__comm *c = &job.ranks[r].comm;
          c->net->peers = peers;
          c->local_rank = peers[r].local_rank;
          c->local_size = L;
          c->cross_rank = peers[r].host_index;
          c->cross_size = H;
          c->cross_ring.pos = c->cross_rank;
          c->cross_ring.size = H;
          c->cross_ring.next = c->proc->data[hora__comm_rank_on_host(c, (c->cross_rank + 1) % H)];
          c->cross_ring.prev =
              c->proc->data[hora__comm_rank_on_host(c, (c->cross_rank + H - 1) % H)];
        }
        const char *bad = rc != HORA_SUCCESS ? "setting up the ranks failed"
                                             : job_run(&job, body_cross, why, sizeof(why));
        for (size_t m = 0; rc == HORA_SUCCESS && m < HORA_ARRAY_SIZE(cross_models); m++) {
          hora__comm *c = &job.ranks[0].comm;
          c->model = cross_models[m];
          for (size_t s = 0; s < HORA_ARRAY_SIZE(cross_sizes); s++) {
            note_pick(&picks, hora__cross_algorithm(c, HORA_COLL_BROADCAST, cross_sizes[s]));
            note_pick(&picks, hora__cross_algorithm(c, HORA_COLL_ALLGATHER, cross_sizes[s]));
          }
        }
        job_end(&job);
        if (bad) {
          FAIL("%d hosts x %d%s: %.480s", H, L, round_robin ? " round robin" : "", bad);
        }
      }
    }
  }
  static const char *const want[][2] = {{"broadcast", "binomial"},
                                        {"broadcast", "scatter_allgather"},
                                        {"broadcast", "ring"},
                                        {"allgather", "ring"},
                                        {"allgather", "bruck"}};
  for (size_t w = 0; w < HORA_ARRAY_SIZE(want); w++) {
    bool ran = false;
    for (int i = 0; i < picks.n && !ran; i++) {
      ran = strcmp(hora__algo_kind_name(picks.a[i]->kind), want[w][0]) == 0 &&
            strcmp(picks.a[i]->name, want[w][1]) == 0;
    }
    if (!ran) {
      FAIL("no shape, model or size picked the %s %s across hosts: it never ran", want[w][1],
           want[w][0]);
    }
  }
}

/* ---- a link that breaks in the middle ------------------------------------ */

/* The held rank joins only after the break, so that the others cannot
 * finish before it (with unbounded pieces they might, in a few
 * milliseconds). */
static void hold_until_broken(struct sim_rank *k) {
  for (int waited = 0; k->comm.rank == k->job->hold_rank && !atomic_load(&k->job->broken);
       waited++) {
    if (waited == 10000) {
      note(k, __LINE__, "the link did not break within 10 s");
      break;
    }
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
}

/* As the runtime does after a fatal error: it tells the job first (a
 * while, during which the others still drain the links this rank
 * abandoned), then closes its connections, so that they see lost peers
 * instead of waiting for it. */
static void fail_as_the_runtime(struct sim_rank *k, int rc) {
  k->rc = rc;
  snprintf(k->msg, sizeof(k->msg), "%s", hora__error_message());
  struct timespec told = {0, 20000000};
  nanosleep(&told, NULL);
  close_ends(k);
}

/* which: 0 the ring allreduce, 1 recursive doubling, 2 Bruck's allgather,
 * 3 Rabenseifner's allreduce. */
static void body_broken(struct sim_rank *k) {
  const size_t bytes = 1u << 20; /* 1 MiB: far from done when the link breaks */
  const int n = k->comm.size;
  const int which = k->job->which;
  char *buf = malloc(bytes), *all = malloc(which == 2 ? (size_t)n * bytes : 1);
  if (!buf || !all) {
    k->rc = HORA_ERR_NO_MEMORY;
    close_ends(k);
    free(buf);
    free(all);
    return;
  }
  for (size_t i = 0; i < bytes / sizeof(float); i++) {
    ((float *)(void *)buf)[i] = 1.0f;
  }
  hold_until_broken(k);
  hora__comm *c = &k->comm;
  size_t count = bytes / sizeof(float);
  int rc = HORA_ERR_INVALID_ARG;
  switch (which) {
    case 0:
      rc = hora__ring_allreduce(c, &c->world_ring, buf, buf, count, HORA_FLOAT32, HORA_SUM,
                                HORA_FLOAT32);
      break;
    case 1:
      rc = hora__rd_allreduce(c, buf, buf, count, HORA_FLOAT32, HORA_SUM, HORA_FLOAT32);
      break;
    case 2:
      rc = hora__bruck_allgather(c, buf, bytes, all);
      break;
    case 3:
      rc = hora__rabenseifner_allreduce(c, buf, buf, count, HORA_FLOAT32, HORA_SUM, HORA_FLOAT32);
      break;
    case 4:
      rc = hora__tree_allreduce(c, buf, buf, count, HORA_FLOAT32, HORA_SUM, HORA_FLOAT32);
      break;
  }
  fail_as_the_runtime(k, rc);
  free(buf);
  free(all);
}

struct broken_case {
  int n;
  size_t piece;
};

/* Rank 2's link to break_peer (-1: its ring's next) breaks on its fifth
 * service call while hold_rank has not started: every rank's call of the
 * schedule `which` must fail with a lost peer, none may hang. */
static void run_broken(int which, int break_peer, int hold_rank, const struct broken_case *cases,
                       size_t ncases) {
  static const char *const names[] = {"ring allreduce", "rd allreduce", "bruck allgather",
                                      "rabenseifner allreduce", "tree allreduce"};
  char why[1024];
  for (size_t t = 0; t < ncases; t++) {
    struct ring_job job;
    int rc = job_start(&job, cases[t].n, cases[t].piece, 4096, 1 * MS);
    job.break_rank = 2;
    job.break_after = 5;
    job.break_peer = break_peer;
    job.hold_rank = hold_rank;
    job.which = which;
    const char *bad = NULL;
    if (rc != HORA_SUCCESS) {
      snprintf(why, sizeof(why), "setting up %d ranks: %s", cases[t].n, hora_strerror(rc));
      bad = why;
    } else {
      bad = job_run(&job, body_broken, why, sizeof(why));
    }
    for (int r = 0; r < cases[t].n && !bad; r++) {
      const struct sim_rank *k = &job.ranks[r];
      if (k->rc != HORA_ERR_PEER_LOST || !strstr(k->msg, "lost rank")) {
        snprintf(why, sizeof(why), "%s of %d (piece %zu): rank %d returned %s (%s)", names[which],
                 cases[t].n, cases[t].piece, r, hora_strerror(k->rc), k->msg);
        bad = why;
      }
    }
    job_end(&job);
    if (bad) {
      FAIL("%.480s", bad);
    }
  }
}

/* Rank 2's link to its next breaks a few milliseconds into an allreduce
 * (the others but rank 0 have moved data by then). */
TEST(ring_broken_link_fails_every_rank) {
  static const struct broken_case cases[] = {{5, 13}, {3, 0}, {4, 4096}};
  run_broken(0, -1, 0, cases, HORA_ARRAY_SIZE(cases));
}

/* Rank 2's link to its first partner breaks while that partner has not
 * started: every result needs the partner's data, so no rank can finish,
 * and each must fail instead of waiting. The first partner: rank 3 in
 * recursive doubling (2 ^ 1) and in Bruck's (2 + 1); rank 0 in
 * Rabenseifner's halving among 4 (2 ^ 2). */
TEST(schedule_broken_link_fails_every_rank_rd_bruck_rabenseifner) {
  static const struct broken_case cases[] = {{5, 13}, {6, 0}, {7, 4096}, {8, 13}};
  static const struct broken_case four[] = {{5, 13}, {6, 0}, {7, 4096}};
  run_broken(1, 3, 3, cases, HORA_ARRAY_SIZE(cases));
  run_broken(2, 3, 3, cases, HORA_ARRAY_SIZE(cases));
  run_broken(3, 0, 0, four, HORA_ARRAY_SIZE(four));
}

/* The same in the tree: rank 3 is rank 2's child in tree 0 (and every
 * rank's result holds its data). */
TEST(schedule_broken_link_fails_every_rank_tree) {
  static const struct broken_case cases[] = {{5, 13}, {6, 0}, {7, 4096}, {8, 13}};
  run_broken(4, 3, 3, cases, HORA_ARRAY_SIZE(cases));
}

/* A schedule that cannot move (an operation waiting for itself, nothing in
 * flight) fails at once, naming it, instead of sleeping forever; one of
 * too many lanes is refused. */
static void nothing(void *arg, const struct hora__sched_op *op) {
  (void)arg;
  (void)op;
}

TEST(sched_run_fails_a_schedule_that_cannot_move) {
  struct hora__proc proc = {.chunk_bytes = 4096};
  hora__comm c = {.proc = &proc, .net = &proc.net, .size = 1};
  struct hora__sched_lane lanes[HORA_SCHED_LANES + 1] = {{NULL, false}};
  struct hora__sched_op ops[2] = {{0, NULL, 0, {-1, -1}}, {0, NULL, 0, {1, -1}}};
  struct hora__sched s = {.lanes = lanes, .nlanes = 1, .ops = ops, .nops = 2, .local = nothing};
  ASSERT(hora__sched_run(&c, &s) == HORA_ERR_SYSTEM);
  ASSERT(strstr(hora__error_message(), "stalled (1 of 2 operations done"));
  s.nops = 1;
  ASSERT(hora__sched_run(&c, &s) == HORA_SUCCESS);
  s.nlanes = HORA_SCHED_LANES + 1;
  ASSERT(hora__sched_run(&c, &s) == HORA_ERR_INVALID_ARG);
}

/* ---- the cost model's calibration (cost_model.c) -------------------------- */

static struct hora__cost_model calib_in, calib_out[8];

static void body_calibrate(struct sim_rank *k) {
  struct hora__cost_model m = calib_in;
  int rc = hora__cost_calibrate(&k->comm, &m);
  if (rc != HORA_SUCCESS) {
    note(k, __LINE__, "hora__cost_calibrate failed: %s (%s)", hora_strerror(rc),
         hora__error_message());
    close_ends(k);
  }
  calib_out[k->comm.rank] = m;
}

/* Over mock links: rank 0 measures with its partner (the first rank on
 * another host: rank 2 of two hosts of two ranks; rank 1 where no host is
 * known), positive constants within the clamps, the shared segment's
 * left built in; every other rank's model is left for the broadcast. A
 * partner chosen differently at the two ends would leave rank 0 waiting
 * (the watchdog fails it). */
TEST(cost_calibrate_over_mock_links) {
  static struct hora__peer_info peers[4];
  for (int r = 0; r < 4; r++) {
    peers[r] = (struct hora__peer_info){.local_rank = r % 2, .host_index = r / 2};
    snprintf(peers[r].host, sizeof(peers[r].host), "host%c", 'A' + r / 2);
  }
  ASSERT_EQ_INT(hora__cost_builtin("tcp", &calib_in), HORA_SUCCESS);
  static const struct {
    int n;
    bool hosts;
    const char *with;
  } cases[] = {{4, true, "with rank 2 (hostB)"}, {3, false, "with rank 1"}};
  char why[1024];
  for (size_t t = 0; t < HORA_ARRAY_SIZE(cases); t++) {
    struct ring_job job;
    int n = cases[t].n;
    int rc = job_start(&job, n, 0, 64 * 1024, 50 * MS);
    for (int r = 0; rc == HORA_SUCCESS && r < n && cases[t].hosts; r++) {
      hora__comm *c = &job.ranks[r].comm;
      c->net->peers = peers;
      c->local_rank = r % 2;
      c->local_size = 2;
      c->cross_rank = r / 2;
      c->cross_size = 2;
    }
    memset(calib_out, 0, sizeof(calib_out));
    const char *bad = rc != HORA_SUCCESS ? "setting up the ranks failed"
                                         : job_run(&job, body_calibrate, why, sizeof(why));
    job_end(&job);
    if (bad) {
      FAIL("%d ranks: %.480s", n, bad);
    }
    const struct hora__cost_model *m = &calib_out[0];
    const struct hora__cost *l = &m->link;
    if (!(l->alpha >= 1e-7 && l->alpha <= 1.0 && l->beta >= 1e-12 && l->beta <= 1e-6 &&
          l->gamma >= 1e-12 && l->gamma <= 1e-6)) {
      FAIL("%d ranks: rank 0 measured alpha %g s, beta %g s/B, gamma %g s/B", n, l->alpha,
           l->beta, l->gamma);
    }
    ASSERT_STR_CONTAINS(m->source, "calibrated at start-up");
    ASSERT_STR_CONTAINS(m->source, cases[t].with);
    if (memcmp(&m->local, &calib_in.local, sizeof(m->local)) != 0) {
      FAIL("%d ranks: the shared segment's constants changed", n);
    }
    for (int r = 1; r < n; r++) {
      if (memcmp(&calib_out[r], &calib_in, sizeof(calib_in)) != 0) {
        FAIL("%d ranks: rank %d's model changed (%s); only rank 0's is measured", n, r,
             calib_out[r].source);
      }
    }
  }
}
