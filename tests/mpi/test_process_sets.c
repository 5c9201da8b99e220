/* Process sets: collectives over overlapping and disjoint sets, the same
 * names in different sets, submissions across sets in every order and from
 * several threads, a stalled set beside one that keeps running, join and
 * mismatches within a set, sets from MPI_Comm_split, making and
 * destroying sets 100 times with nothing left behind, and the errors of
 * bad arguments. With the argument "init_comm": hora_init_comm on half of
 * MPI_COMM_WORLD. Without an MPI launcher, the parts that need MPI are
 * skipped. */
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "hora_mpi.h"
#include "mpitest.h"

static char logdir[256];

/* The sets every test uses: evens, odds, the lower half (at least rank 0),
 * the first and last rank, and the first two ranks of each half (on two
 * hosts of equal size: hierarchical within the set). */
static hora_process_set *evens, *odds, *lower, *ends, *pairs;

static int *ranks_where(int (*keep)(int r), int *n) {
  int *v = calloc((size_t)mt_size, sizeof(int));
  *n = 0;
  for (int r = 0; r < mt_size; r++) {
    if (keep(r)) {
      v[(*n)++] = r;
    }
  }
  return v;
}
static int is_even(int r) { return r % 2 == 0; }
static int is_odd(int r) { return r % 2 == 1; }
static int is_lower(int r) { return r < (mt_size + 1) / 2; }
static int is_end(int r) { return r == 0 || r == mt_size - 1; }
static int is_pair(int r) { return r % (mt_size / 2 > 0 ? mt_size / 2 : 1) < 2; }

/* Members of ps, and the sum over them of (global rank + 1). */
static float member_sum(const hora_process_set *ps) {
  int n = hora_process_set_size(ps);
  int *v = calloc((size_t)n + 1, sizeof(int));
  hora_process_set_ranks(ps, v, n);
  float s = 0;
  for (int i = 0; i < n; i++) {
    s += (float)(v[i] + 1);
  }
  free(v);
  return s;
}

static hora_process_set *make(int (*keep)(int r)) {
  int n;
  int *v = ranks_where(keep, &n);
  hora_process_set *ps = NULL;
  if (n > 0) {
    /* Unsorted on purpose: the order of the list does not matter. */
    for (int i = 0; i + 1 < n; i += 2) {
      int t = v[i];
      v[i] = v[i + 1];
      v[i + 1] = t;
    }
    MT_OK(hora_process_set_create(v, n, &ps));
  }
  free(v);
  return ps;
}

static void sets_are_made_and_described(void) {
  evens = make(is_even);
  odds = mt_size > 1 ? make(is_odd) : NULL;
  lower = make(is_lower);
  ends = make(is_end);
  pairs = make(is_pair);
  MT_CHECK(hora_process_set_id(hora_process_set_world()) == 0, "the world's id is not 0");
  MT_CHECK(hora_process_set_size(hora_process_set_world()) == mt_size, "world size");
  MT_CHECK(hora_process_set_rank(hora_process_set_world()) == mt_rank, "world rank");
  MT_CHECK(hora_process_set_id(evens) == 1, "evens has id %d", hora_process_set_id(evens));
  MT_CHECK(hora_process_set_size(evens) == (mt_size + 1) / 2, "evens has %d ranks",
           hora_process_set_size(evens));
  MT_CHECK(hora_process_set_included(evens) == is_even(mt_rank), "included(evens)");
  MT_CHECK(hora_process_set_rank(evens) == (is_even(mt_rank) ? mt_rank / 2 : -1),
           "rank in evens is %d", hora_process_set_rank(evens));
  int v[64];
  int n = hora_process_set_ranks(ends, v, 64);
  MT_CHECK(n == (mt_size > 1 ? 2 : 1) && v[0] == 0 && v[n - 1] == mt_size - 1,
           "ends: %d ranks", n);
  MT_CHECK(hora_process_set_size(NULL) == -1 && hora_process_set_rank(NULL) == -1,
           "NULL set getters");
}

static void collectives_run_within_each_set(void) {
  const hora_process_set *all[] = {hora_process_set_world(), evens, odds, lower, ends, pairs};
  for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++) {
    const hora_process_set *ps = all[k];
    if (!ps || !hora_process_set_included(ps)) {
      continue;
    }
    int n = hora_process_set_size(ps), me = hora_process_set_rank(ps);
    float x[33];
    for (int i = 0; i < 33; i++) {
      x[i] = (float)(mt_rank + 1);
    }
    hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
    o.process_set = ps;
    hora_request *r;
    MT_OK(hora_allreduce_async_ex("ps/sum", x, x, 33, HORA_FLOAT32, HORA_SUM, &o, &r));
    MT_OK(hora_wait(&r));
    MT_CHECK(x[0] == member_sum(ps) && x[32] == member_sum(ps), "set %d: sum %g, expected %g",
             hora_process_set_id(ps), (double)x[0], (double)member_sum(ps));
    /* Broadcast from the set's last rank (a set rank). */
    hora_op_options oo = HORA_OP_OPTIONS_INIT;
    oo.process_set = ps;
    int32_t b[5] = {mt_rank, mt_rank, mt_rank, mt_rank, mt_rank};
    MT_OK(hora_broadcast_async_ex("ps/bcast", b, 5, HORA_INT32, n - 1, &oo, &r));
    MT_OK(hora_wait(&r));
    int members[64];
    hora_process_set_ranks(ps, members, 64);
    MT_CHECK(b[4] == members[n - 1], "set %d: broadcast gave %d, expected %d",
             hora_process_set_id(ps), b[4], members[n - 1]);
    /* Allgather in set-rank order. */
    int32_t mine = 100 + mt_rank, got[64];
    MT_OK(hora_allgather_async_ex("ps/gather", &mine, 1, HORA_INT32, got, &oo, &r));
    MT_OK(hora_wait(&r));
    for (int i = 0; i < n; i++) {
      MT_CHECK(got[i] == 100 + members[i], "set %d: allgather[%d] = %d", hora_process_set_id(ps),
               i, got[i]);
    }
    MT_OK(hora_barrier_ex(&oo));
    /* Parameters from the set's rank 0. */
    double w1[3] = {mt_rank, mt_rank, mt_rank};
    int64_t w2[2] = {mt_rank, -mt_rank};
    hora_tensor params[2] = {{"w1", w1, 3, HORA_FLOAT64}, {"w2", w2, 2, HORA_INT64}};
    MT_OK(hora_broadcast_parameters_ex(params, 2, 0, &oo));
    MT_CHECK(w1[2] == members[0] && w2[1] == -members[0], "set %d: parameters %g %lld",
             hora_process_set_id(ps), w1[2], (long long)w2[1]);
    (void)me;
  }
  /* On two hosts of three ranks, `pairs` (two ranks of each) is reduced
   * hierarchically: its first rank (global 0) says so in its log. */
  if (mt_rank == 0 && hora_cross_size() == 2 && hora_local_size() == 3) {
    char path[300], line[1024];
    snprintf(path, sizeof(path), "%s/ps.0.log", logdir);
    FILE *f = fopen(path, "r");
    int hier = 0;
    while (f && fgets(line, sizeof(line), f)) {
      hier |= strstr(line, "process set 5: 4 ranks") && strstr(line, "on 2 host(s)") &&
              strstr(line, "hierarchical");
    }
    if (f) {
      fclose(f);
    }
    MT_CHECK(hier, "%s does not say that process set 5 is reduced hierarchically", path);
  }
  /* Across hosts the world measured its links at start-up; a set across
   * hosts reuses those constants instead of measuring again (each set
   * once took 50 ms more that way). */
  if (mt_rank == 0 && hora_cross_size() > 1 && !getenv("HORA_COST_MODEL")) {
    char path[300], line[1024];
    snprintf(path, sizeof(path), "%s/ps.0.log", logdir);
    FILE *f = fopen(path, "r");
    int reused = 0, measured = 0;
    while (f && fgets(line, sizeof(line), f)) {
      measured |= strstr(line, "cost model: HORA_COST_MODEL=") &&
                  strstr(line, "calibrated at start-up");
      reused |= strstr(line, "process set ") && strstr(line, ": cost model calibrated at start-up") &&
                strstr(line, "(this process's first)");
    }
    if (f) {
      fclose(f);
    }
    MT_CHECK(measured && reused,
             "%s: the world %s its links, and no set says it reused the measurement", path,
             measured ? "measured" : "did not measure");
  }
  /* A rank outside a set cannot use it. */
  if (odds && !hora_process_set_included(odds)) {
    float y = 1;
    hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
    o.process_set = odds;
    hora_request *r = NULL;
    MT_FAILS(hora_allreduce_async_ex("ps/outside", &y, &y, 1, HORA_FLOAT32, HORA_SUM, &o, &r),
             HORA_ERR_INVALID_USAGE, "not a member of process set 2");
    hora_op_options oo = HORA_OP_OPTIONS_INIT;
    oo.process_set = odds;
    MT_FAILS(hora_barrier_ex(&oo), HORA_ERR_INVALID_USAGE, "not a member");
  }
}

/* The same name in three sets at once is three operations; each rank
 * submits to the sets in its own order and waits in another. */
static void same_names_any_order_are_separate_operations(void) {
  enum { N = 1 << 18 }; /* 1 MiB of floats: the collectives overlap in time */
  const hora_process_set *all[] = {hora_process_set_world(), evens, lower, ends, odds};
  int nsets = mt_size > 1 ? 5 : 4;
  float *buf[5];
  hora_request *req[5] = {0};
  for (int round = 0; round < 3; round++) {
    for (int j = 0; j < nsets; j++) {
      int k = (j + mt_rank + round) % nsets; /* every rank its own order */
      buf[k] = NULL;
      if (!hora_process_set_included(all[k])) {
        continue;
      }
      buf[k] = malloc(N * sizeof(float));
      for (int i = 0; i < N; i++) {
        buf[k][i] = (float)(mt_rank + 1) * (float)(k + 1);
      }
      hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
      o.process_set = all[k];
      MT_OK(hora_allreduce_async_ex("grad", buf[k], buf[k], N, HORA_FLOAT32, HORA_SUM, &o,
                                    &req[k]));
    }
    for (int j = nsets - 1; j >= 0; j--) {
      int k = (j + 2 * mt_rank) % nsets;
      if (!buf[k]) {
        continue;
      }
      MT_OK(hora_wait(&req[k]));
      float want = member_sum(all[k]) * (float)(k + 1);
      MT_CHECK(buf[k][0] == want && buf[k][N - 1] == want, "round %d set %d: %g, expected %g",
               round, hora_process_set_id(all[k]), (double)buf[k][0], (double)want);
      free(buf[k]);
    }
  }
}

struct thread_arg {
  const hora_process_set *ps;
  int id, failures;
};

static void *thread_main(void *p) {
  struct thread_arg *a = p;
  for (int i = 0; i < 40; i++) {
    char name[64];
    snprintf(name, sizeof(name), "thread%d/%d", a->id, i % 7);
    double x[16];
    for (int j = 0; j < 16; j++) {
      x[j] = (double)(mt_rank + 1) * (i + 1);
    }
    hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
    o.process_set = a->ps;
    hora_request *r;
    int rc = hora_allreduce_async_ex(name, x, x, 16, HORA_FLOAT64, HORA_SUM, &o, &r);
    if (rc == HORA_SUCCESS) {
      rc = hora_wait(&r);
    }
    if (rc != HORA_SUCCESS || x[15] != (double)member_sum(a->ps) * (i + 1)) {
      fprintf(stderr, "rank %d thread %d step %d: %s %s, %g\n", mt_rank, a->id, i,
              hora_strerror(rc), hora_last_error(), x[15]);
      a->failures++;
    }
  }
  return NULL;
}

static void threads_submit_to_several_sets(void) {
  const hora_process_set *all[] = {hora_process_set_world(), evens, odds, lower, ends};
  pthread_t t[5];
  struct thread_arg a[5];
  int started = 0;
  for (int k = 0; k < 5; k++) {
    if (all[k] && hora_process_set_included(all[k])) {
      a[started] = (struct thread_arg){all[k], k, 0};
      pthread_create(&t[started], NULL, thread_main, &a[started]);
      started++;
    }
  }
  for (int i = 0; i < started; i++) {
    pthread_join(t[i], NULL);
    MT_CHECK(a[i].failures == 0, "thread %d: %d failed steps", a[i].id, a[i].failures);
  }
}

/* `ends` stalls (its last rank is late) while `lower` (without that rank
 * when the job has 3 or more) keeps running; the stall warning names the
 * set and the missing global rank. */
static void a_stalled_set_does_not_hold_up_another(void) {
  int late = mt_size - 1;
  float x = 1;
  hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
  o.process_set = ends;
  hora_request *r = NULL;
  if (mt_rank == 0) {
    MT_OK(hora_allreduce_async_ex("slow", &x, &x, 1, HORA_FLOAT32, HORA_SUM, &o, &r));
  }
  if (mt_rank != late) {
    /* Meanwhile `lower` (never the late rank) runs operations to the end. */
    double t0 = mt_wtime();
    for (int i = 0; i < 20 && hora_process_set_included(lower); i++) {
      float y = 1;
      hora_allreduce_options lo = HORA_ALLREDUCE_OPTIONS_INIT;
      lo.process_set = lower;
      hora_request *r2;
      MT_OK(hora_allreduce_async_ex("meanwhile", &y, &y, 1, HORA_FLOAT32, HORA_SUM, &lo, &r2));
      MT_OK(hora_wait(&r2));
      MT_CHECK(y == (float)hora_process_set_size(lower), "meanwhile: %g", (double)y);
    }
    MT_CHECK(mt_wtime() - t0 < 2.5, "set %d waited for the stalled set (%.1f s)",
             hora_process_set_id(lower), mt_wtime() - t0);
    if (mt_rank == 0) {
      nanosleep(&(struct timespec){2, 500000000}, NULL); /* past HORA_STALL_CHECK_TIME_SECONDS=1 */
    }
  } else {
    nanosleep(&(struct timespec){2, 500000000}, NULL);
  }
  if (mt_rank == late) {
    MT_OK(hora_allreduce_async_ex("slow", &x, &x, 1, HORA_FLOAT32, HORA_SUM, &o, &r));
  }
  if (r) {
    MT_OK(hora_wait(&r));
    MT_CHECK(x == 2, "slow: %g", (double)x);
  }
  mt_barrier();
  if (mt_rank == 0) {
    char path[300], line[4096], want[64];
    snprintf(path, sizeof(path), "%s/ps.0.log", logdir);
    snprintf(want, sizeof(want), "missing rank(s) %d", late);
    FILE *f = fopen(path, "r");
    int warned = 0;
    while (f && fgets(line, sizeof(line), f)) {
      warned |= strstr(line, "process set 4: stall") && strstr(line, "'slow'") &&
                strstr(line, want);
    }
    if (f) {
      fclose(f);
    }
    MT_CHECK(warned, "%s has no stall warning for process set 4 naming rank %d", path, late);
  }
}

/* Join within `evens`: set rank i runs i + 1 steps, then joins; the odd
 * ranks meanwhile run their own set's operations. */
static void join_is_per_set(void) {
  if (is_even(mt_rank)) {
    int me = hora_process_set_rank(evens), n = hora_process_set_size(evens);
    hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
    o.process_set = evens;
    for (int s = 0; s < me + 1; s++) {
      float g = (float)(mt_rank + 1);
      hora_request *r;
      MT_OK(hora_allreduce_async_ex("jg", &g, &g, 1, HORA_FLOAT32, HORA_SUM, &o, &r));
      MT_OK(hora_wait(&r));
      float want = 0;
      for (int i = s; i < n; i++) {
        want += (float)(2 * i + 1); /* set rank i is global rank 2i */
      }
      MT_CHECK(g == want, "join step %d: %g, expected %g", s, (double)g, (double)want);
    }
    hora_op_options oo = HORA_OP_OPTIONS_INIT;
    oo.process_set = evens;
    int last = -2;
    MT_OK(hora_join_ex(&oo, &last));
    MT_CHECK(last == n - 1, "hora_join_ex: last %d, expected %d", last, n - 1);
  } else {
    hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
    o.process_set = odds;
    for (int s = 0; s < 5; s++) {
      float g = 1;
      hora_request *r;
      MT_OK(hora_allreduce_async_ex("jg", &g, &g, 1, HORA_FLOAT32, HORA_SUM, &o, &r));
      MT_OK(hora_wait(&r));
      MT_CHECK(g == (float)hora_process_set_size(odds), "odds meanwhile: %g", (double)g);
    }
  }
}

/* A mismatch within a set names the set and global ranks; the set then
 * goes on working. */
static void mismatch_within_a_set(void) {
  if (!is_even(mt_rank) || hora_process_set_size(evens) < 2) {
    return;
  }
  size_t count = hora_process_set_rank(evens) == 0 ? 4 : 5;
  float x[5] = {1, 1, 1, 1, 1};
  hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
  o.process_set = evens;
  hora_request *r;
  MT_OK(hora_allreduce_async_ex("mm", x, x, count, HORA_FLOAT32, HORA_SUM, &o, &r));
  MT_FAILS(hora_wait(&r), HORA_ERR_MISMATCH, "process set 1: allreduce 'mm': rank 0 sent 4 "
           "elements, rank 2 sent 5");
  MT_OK(hora_allreduce_async_ex("mm/after", x, x, 4, HORA_FLOAT32, HORA_SUM, &o, &r));
  MT_OK(hora_wait(&r));
  MT_CHECK(x[0] == (float)hora_process_set_size(evens), "after the mismatch: %g", (double)x[0]);
}

/* Sets from MPI_Comm_split: colours rank % 3, the last rank in none. */
static void sets_from_mpi_comm_split(void) {
  int color = mt_size > 1 && mt_rank == mt_size - 1 ? MPI_UNDEFINED : mt_rank % 3;
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, color, -mt_rank, &sub); /* reversed order: hora sorts */
  hora_process_set *ps = NULL;
  MT_OK(hora_process_set_from_mpi_comm(sub, &ps));
  if (!ps) {
    return;
  }
  if (color == MPI_UNDEFINED) {
    MT_CHECK(!hora_process_set_included(ps) && hora_process_set_size(ps) == 0,
             "MPI_COMM_NULL gave a set of %d", hora_process_set_size(ps));
  } else {
    int want_n = 0, want_rank = -1;
    float want = 0;
    for (int r = 0; r < mt_size; r++) {
      if (r % 3 == color && !(mt_size > 1 && r == mt_size - 1)) {
        if (r == mt_rank) {
          want_rank = want_n;
        }
        want_n++;
        want += (float)(r + 1);
      }
    }
    MT_CHECK(hora_process_set_size(ps) == want_n && hora_process_set_rank(ps) == want_rank,
             "colour %d: size %d rank %d, expected %d %d", color, hora_process_set_size(ps),
             hora_process_set_rank(ps), want_n, want_rank);
    float x = (float)(mt_rank + 1);
    hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
    o.process_set = ps;
    hora_request *r;
    MT_OK(hora_allreduce_async_ex("split/sum", &x, &x, 1, HORA_FLOAT32, HORA_SUM, &o, &r));
    MT_OK(hora_wait(&r));
    MT_CHECK(x == want, "colour %d: sum %g, expected %g", color, (double)x, (double)want);
    MPI_Comm_free(&sub);
  }
  MT_OK(hora_process_set_destroy(ps));
}


static void one_set_made_used_and_destroyed(int i) {
  int v[2] = {mt_size - 1, 0};
  hora_process_set *ps = NULL;
  MT_OK(hora_process_set_create(v, mt_size > 1 ? 2 : 1, &ps));
  if (ps && hora_process_set_included(ps)) {
    float x = 1;
    hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
    o.process_set = ps;
    hora_request *r;
    MT_OK(hora_allreduce_async_ex("churn", &x, &x, 1, HORA_FLOAT32, HORA_SUM, &o, &r));
    MT_OK(hora_wait(&r));
    MT_CHECK(x == (float)hora_process_set_size(ps), "cycle %d: %g", i, (double)x);
  }
  MT_OK(hora_process_set_destroy(ps));
}

static void made_and_destroyed_100_times_leaves_nothing(void) {
  for (int i = 0; i < 5; i++) {
    one_set_made_used_and_destroyed(i);
  }
  int fds = mt_count_fds();
  long rss = mt_rss_kib();
  double t0 = mt_wtime();
  for (int i = 0; i < 100; i++) {
    one_set_made_used_and_destroyed(i);
  }
  int fds_after = mt_count_fds();
  long rss_after = mt_rss_kib();
  MT_CHECK(fds_after == fds, "descriptors: %d before, %d after 100 sets", fds, fds_after);
  /* AddressSanitizer and valgrind hold freed memory back from reuse (their
   * leak checkers cover those runs). */
  const char *preload = getenv("LD_PRELOAD");
  bool held_back = preload && strstr(preload, "vgpreload");
#ifdef __SANITIZE_ADDRESS__
  held_back = true;
#endif
  MT_CHECK(held_back || rss_after - rss < 4096, "RSS grew by %ld KiB over 100 sets",
           rss_after - rss);
  if (mt_rank == 0) {
    printf("# 100 sets made, used and destroyed in %.2f s; descriptors %d -> %d, RSS %ld -> "
           "%ld KiB\n", mt_wtime() - t0, fds, fds_after, rss, rss_after);
  }
}

static void bad_arguments_fail_on_every_rank(void) {
  hora_process_set *ps = (hora_process_set *)1;
  int dup[2] = {0, 0};
  MT_FAILS(hora_process_set_create(dup, 2, &ps), HORA_ERR_INVALID_ARG, "listed twice");
  MT_CHECK(ps == NULL, "a failed create left a handle");
  int out[1] = {mt_size};
  MT_FAILS(hora_process_set_create(out, 1, &ps), HORA_ERR_INVALID_ARG, "not a rank of the job");
  MT_FAILS(hora_process_set_create(NULL, 1, &ps), HORA_ERR_INVALID_ARG, "ranks is NULL");
  if (mt_size > 1) {
    /* Rank 0 asks for another set than the rest: every rank is told. */
    int mine[2] = {0, 1};
    MT_FAILS(hora_process_set_create(mine, mt_rank == 0 ? 1 : 2, &ps), HORA_ERR_MISMATCH,
             mt_rank == 0 ? "passed other ranks" : "");
    /* Sets of different calls destroyed together. */
    hora_process_set *a = NULL, *b = NULL;
    MT_OK(hora_process_set_create(mine, 1, &a));
    MT_OK(hora_process_set_create(mine, 2, &b));
    MT_FAILS(hora_process_set_destroy(mt_rank == 0 ? a : b), HORA_ERR_MISMATCH, "");
    MT_OK(hora_process_set_destroy(a));
    MT_OK(hora_process_set_destroy(b));
  }
  MT_FAILS(hora_process_set_destroy(hora_process_set_world()), HORA_ERR_INVALID_ARG,
           "world cannot be destroyed");
  /* A root out of the set's range. */
  if (hora_process_set_included(ends)) {
    hora_op_options oo = HORA_OP_OPTIONS_INIT;
    oo.process_set = ends;
    float x = 0;
    hora_request *r;
    MT_FAILS(hora_broadcast_async_ex("b", &x, 1, HORA_FLOAT32, 2, &oo, &r), HORA_ERR_INVALID_ARG,
             "the process set has");
  }
  /* The world goes on. */
  float x = 1;
  MT_OK(hora_allreduce("after/bad", &x, &x, 1, HORA_FLOAT32, HORA_SUM));
  MT_CHECK(x == (float)mt_size, "world after the errors: %g", (double)x);
}

/* A thread submits to a set in a loop while the main thread destroys it
 * (the contract forbids it; it must fail cleanly, not use freed memory):
 * each operation completes, is aborted by the shutdown, or is refused with
 * HORA_ERR_INVALID_USAGE once the set is being destroyed or gone. */
struct racer {
  hora_process_set *ps;
  int ok, aborted, refused, other;
  char msg[300];
};

static void *racer_main(void *p) {
  struct racer *a = p;
  for (int i = 0; i < 1000000; i++) {
    char name[32];
    snprintf(name, sizeof(name), "race/%d", i);
    float x = 1;
    hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
    o.process_set = a->ps;
    hora_request *r = NULL;
    int rc = hora_allreduce_async_ex(name, &x, &x, 1, HORA_FLOAT32, HORA_SUM, &o, &r);
    if (rc == HORA_SUCCESS) {
      rc = hora_wait(&r);
    }
    if (rc == HORA_SUCCESS) {
      a->ok++;
    } else if (rc == HORA_ERR_ABORTED) {
      a->aborted++;
    } else {
      a->refused += rc == HORA_ERR_INVALID_USAGE;
      a->other += rc != HORA_ERR_INVALID_USAGE;
      snprintf(a->msg, sizeof(a->msg), "%s: %s", hora_strerror(rc), hora_last_error());
      break;
    }
  }
  return NULL;
}

static void destroyed_while_another_thread_submits(void) {
  int *all = calloc((size_t)mt_size, sizeof(int));
  for (int r = 0; r < mt_size; r++) {
    all[r] = r;
  }
  for (int round = 0; round < 20; round++) {
    hora_process_set *ps = NULL;
    MT_OK(hora_process_set_create(all, mt_size, &ps));
    struct racer a = {.ps = ps};
    pthread_t t;
    pthread_create(&t, NULL, racer_main, &a);
    usleep((useconds_t)(round % 5) * 1000);
    MT_OK(hora_process_set_destroy(ps));
    pthread_join(t, NULL);
    MT_CHECK(a.refused == 1 && a.other == 0, "round %d: the submitting thread ended with %s "
             "(%d done, %d aborted)", round, a.msg, a.ok, a.aborted);
  }
  free(all);
  /* The world goes on. */
  float x = 1;
  MT_OK(hora_allreduce("after/race", &x, &x, 1, HORA_FLOAT32, HORA_SUM));
  MT_CHECK(x == (float)mt_size, "world after the races: %g", (double)x);
}

static void destroyed_with_work_done(void) {
  MT_OK(hora_process_set_destroy(ends));
  MT_OK(hora_process_set_destroy(lower));
  if (odds) {
    MT_OK(hora_process_set_destroy(odds));
  }
  MT_OK(hora_process_set_destroy(pairs));
  /* evens stays alive: hora_finalize destroys it. */
}

/* hora_init_comm: the job's world is half of MPI_COMM_WORLD. */
static int run_init_comm(void) {
  MPI_Comm_rank(MPI_COMM_WORLD, &mt_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &mt_size);
  int half = mt_rank < mt_size / 2 || mt_size == 1 ? 0 : 1;
  MPI_Comm comm;
  MPI_Comm_split(MPI_COMM_WORLD, half, mt_rank, &comm);
  int n, me;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(comm, &me);
  int failures = 0;
  int rc = hora_init_comm(comm);
  if (rc != HORA_SUCCESS || hora_size() != n || hora_rank() != me) {
    fprintf(stderr, "hora_init_comm: %s %s; size %d rank %d, expected %d %d\n",
            hora_strerror(rc), hora_last_error(), hora_size(), hora_rank(), n, me);
    failures++;
  }
  float x = 1;
  rc = hora_allreduce("half", &x, &x, 1, HORA_FLOAT32, HORA_SUM);
  if (rc != HORA_SUCCESS || x != (float)n) {
    fprintf(stderr, "allreduce over the half: %s, %g\n", hora_strerror(rc), (double)x);
    failures++;
  }
  if (hora_finalize() != HORA_SUCCESS) {
    failures++;
  }
  MPI_Comm_free(&comm);
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (mt_rank == 0) {
    printf("%s process_sets/init_comm\n", all ? "FAIL" : "PASS");
  }
  return all;
}

int main(int argc, char **argv) {
  /* Without an MPI launcher hora starts without MPI, and so does this. */
  bool mpi = mt_launched_by_mpi();
  int provided;
  if (mpi) {
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  }
  if (argc > 1 && strcmp(argv[argc - 1], "init_comm") == 0) {
    if (!mpi) {
      printf("SKIP process_sets/init_comm: hora_init_comm needs an MPI launcher\n");
      return 0;
    }
    int failures = run_init_comm();
    MPI_Finalize();
    return failures ? 1 : 0;
  }
  mt_setenv_args(argc, argv);
  mt_shared_dir("hora-ps", logdir, sizeof(logdir));
  char pattern[300];
  snprintf(pattern, sizeof(pattern), "%s/ps.%%r.log", logdir);
  setenv("HORA_LOG_FILE", pattern, 1);
  setenv("HORA_STALL_CHECK_TIME_SECONDS", "1", 1);
  setenv("HORA_LOG_LEVEL", "info", 0); /* the sets say how they reduce */
  mt_init();
  mt_run("process_sets/made_and_described", sets_are_made_and_described);
  mt_run("process_sets/collectives_within_each_set", collectives_run_within_each_set);
  mt_run("process_sets/same_names_any_order", same_names_any_order_are_separate_operations);
  mt_run("process_sets/threads_across_sets", threads_submit_to_several_sets);
  if (mt_size > 1) {
    mt_run("process_sets/stalled_set_holds_up_no_other", a_stalled_set_does_not_hold_up_another);
  } else {
    mt_skip("process_sets/stalled_set_holds_up_no_other", "needs 2 ranks");
  }
  mt_run("process_sets/join_within_a_set", join_is_per_set);
  mt_run("process_sets/mismatch_within_a_set", mismatch_within_a_set);
  if (mpi) {
    mt_run("process_sets/from_mpi_comm_split", sets_from_mpi_comm_split);
  } else {
    mt_skip("process_sets/from_mpi_comm_split", "needs an MPI launcher");
  }
  mt_run("process_sets/bad_arguments", bad_arguments_fail_on_every_rank);
  mt_run("process_sets/made_and_destroyed_100_times", made_and_destroyed_100_times_leaves_nothing);
  mt_run("process_sets/destroyed_while_another_thread_submits",
         destroyed_while_another_thread_submits);
  mt_run("process_sets/destroyed", destroyed_with_work_done);
  int rc = hora_finalize();
  if (rc != HORA_SUCCESS) {
    fprintf(stderr, "hora_finalize: %s: %s\n", hora_strerror(rc), hora_last_error());
  }
  int failures = mt_total_failures() + (rc != HORA_SUCCESS);
  mt_remove_shared_dir(logdir);
  if (mpi) {
    MPI_Finalize();
  }
  return failures ? 1 : 0;
}
