/* Grouped operations (hora_group_start / hora_group_end): members in any
 * order on each rank, mixed kinds, repeated groups, nesting, a group within
 * a process set and while some ranks have joined; a mismatched member or a
 * different grouping failing the whole group on every rank; and the misuse
 * errors (waiting before the group ends, barriers, two sets in one group). */
#include <pthread.h>
#include <stdlib.h>

#include "mpitest.h"

static int32_t sum_of_ranks(int n) { return n * (n - 1) / 2; }

static void allreduces_in_any_order(void) {
  enum { N = 5 };
  for (int round = 0; round < 20; round++) {
    int32_t in[N][64], out[N][64];
    hora_request *req[N];
    MT_OK(hora_group_start());
    for (int k = 0; k < N; k++) {
      int t = (k + mt_rank + round) % N; /* each rank its own order */
      char name[32];
      snprintf(name, sizeof(name), "grp/ar/%d", t);
      for (int i = 0; i < 64; i++) {
        in[t][i] = mt_rank + t * i;
      }
      MT_OK(hora_allreduce_async(name, in[t], out[t], (size_t)(8 + t * 13) % 64 + 1, HORA_INT32,
                                 HORA_SUM, &req[t]));
    }
    MT_OK(hora_group_end());
    for (int t = 0; t < N; t++) {
      MT_OK(hora_wait(&req[t]));
      MT_CHECK(out[t][0] == sum_of_ranks(mt_size), "round %d member %d: %d", round, t, out[t][0]);
    }
  }
  hora_stats st = {.struct_size = sizeof(st)};
  MT_OK(hora_get_stats(&st));
  MT_CHECK(st.fused_batches > 0, "a group's small allreduces travel fused");
}

/* Each thread its own groups at once: a group is the calling thread's. */
enum { THREADS = 4 };
static int thread_errors;

static void *group_thread(void *arg) {
  int t = (int)(intptr_t)arg;
  for (int round = 0; round < 15; round++) {
    int32_t in[3], out[3];
    hora_request *r[3];
    if (hora_group_start() != HORA_SUCCESS) {
      __atomic_fetch_add(&thread_errors, 1, __ATOMIC_RELAXED);
      return NULL;
    }
    for (int k = 0; k < 3; k++) {
      int m = (k + mt_rank + t) % 3;
      char name[48];
      snprintf(name, sizeof(name), "grp/thread%d/%d/%d", t, round % 2, m);
      in[m] = t * 100 + m;
      if (hora_allreduce_async(name, &in[m], &out[m], 1, HORA_INT32, HORA_SUM, &r[m]) !=
          HORA_SUCCESS) {
        __atomic_fetch_add(&thread_errors, 1, __ATOMIC_RELAXED);
      }
    }
    hora_group_end();
    for (int m = 0; m < 3; m++) {
      if (hora_wait(&r[m]) != HORA_SUCCESS || out[m] != (t * 100 + m) * mt_size) {
        __atomic_fetch_add(&thread_errors, 1, __ATOMIC_RELAXED);
      }
    }
  }
  return NULL;
}

static void groups_from_several_threads(void) {
  pthread_t th[THREADS];
  thread_errors = 0;
  for (int t = 0; t < THREADS; t++) {
    pthread_create(&th[t], NULL, group_thread, (void *)(intptr_t)t);
  }
  for (int t = 0; t < THREADS; t++) {
    pthread_join(th[t], NULL);
  }
  MT_CHECK(thread_errors == 0, "%d failures in the threads' groups", thread_errors);
}

static void mixed_kinds_nested_and_single(void) {
  float a = (float)mt_rank, asum = 0, b[4] = {0}, *gathered = calloc((size_t)mt_size, 4);
  if (mt_rank == 0) {
    b[0] = b[3] = 9;
  }
  size_t rows = (size_t)mt_size * 2;
  float *rs_in = calloc(rows, 4), rs_out[2];
  for (size_t i = 0; i < rows; i++) {
    rs_in[i] = 1;
  }
  hora_request *r[4];
  MT_OK(hora_group_start());
  MT_OK(hora_allreduce_async("grp/mix/ar", &a, &asum, 1, HORA_FLOAT32, HORA_SUM, &r[0]));
  MT_OK(hora_group_start()); /* nested: still one group */
  MT_OK(hora_broadcast_async("grp/mix/bc", b, 4, HORA_FLOAT32, 0, &r[1]));
  MT_OK(hora_allgather_async("grp/mix/ag", &a, 1, HORA_FLOAT32, gathered, &r[2]));
  MT_OK(hora_group_end());
  MT_OK(hora_reducescatter_async("grp/mix/rs", rs_in, rs_out, rows, HORA_FLOAT32, HORA_SUM, &r[3]));
  int done = 1;
  MT_OK(hora_test(&r[0], &done));
  MT_CHECK(!done, "a member completed before its group ended");
  MT_FAILS(hora_wait(&r[0]), HORA_ERR_INVALID_USAGE, "hora_group_end first");
  MT_FAILS(hora_barrier(), HORA_ERR_INVALID_USAGE, "only collectives can be grouped");
  MT_OK(hora_group_end());
  for (int i = 0; i < 4; i++) {
    MT_OK(hora_wait(&r[i]));
  }
  MT_CHECK(asum == (float)sum_of_ranks(mt_size), "allreduce %g", (double)asum);
  MT_CHECK(b[0] == 9 && b[3] == 9, "broadcast %g %g", (double)b[0], (double)b[3]);
  MT_CHECK(gathered[mt_size - 1] == (float)(mt_size - 1), "allgather %g",
           (double)gathered[mt_size - 1]);
  MT_CHECK(rs_out[0] == (float)mt_size && rs_out[1] == (float)mt_size, "reducescatter %g",
           (double)rs_out[0]);
  /* A group of one is a plain operation; an empty group is nothing. */
  MT_OK(hora_group_start());
  MT_OK(hora_allreduce_async("grp/one", &a, &asum, 1, HORA_FLOAT32, HORA_SUM, &r[0]));
  MT_OK(hora_group_end());
  MT_OK(hora_wait(&r[0]));
  MT_OK(hora_group_start());
  MT_OK(hora_group_end());
  MT_FAILS(hora_group_end(), HORA_ERR_INVALID_USAGE, "without hora_group_start");
  free(gathered);
  free(rs_in);
}

static void a_mismatch_fails_the_whole_group(void) {
  float x[8] = {0}, y[8], z[8] = {0}, w[8];
  hora_request *r[2];
  MT_OK(hora_group_start());
  MT_OK(hora_allreduce_async("grp/bad/ok", x, y, 8, HORA_FLOAT32, HORA_SUM, &r[0]));
  MT_OK(hora_allreduce_async("grp/bad/count", z, w, mt_rank == mt_size - 1 && mt_size > 1 ? 7 : 8,
                             HORA_FLOAT32, HORA_SUM, &r[1]));
  MT_OK(hora_group_end());
  if (mt_size > 1) {
    MT_FAILS(hora_wait(&r[0]), HORA_ERR_MISMATCH, "fails with its group");
    MT_FAILS(hora_wait(&r[1]), HORA_ERR_MISMATCH, "grp/bad/count");
  } else {
    MT_OK(hora_wait(&r[0]));
    MT_OK(hora_wait(&r[1]));
  }
  /* Ranks that group differently: rank 0 groups p with q, the others p
   * with s. Every member fails, on every rank, and nothing hangs. */
  if (mt_size > 1) {
    MT_OK(hora_group_start());
    MT_OK(hora_allreduce_async("grp/diff/p", x, y, 8, HORA_FLOAT32, HORA_SUM, &r[0]));
    MT_OK(hora_allreduce_async(mt_rank == 0 ? "grp/diff/q" : "grp/diff/s", z, w, 8, HORA_FLOAT32,
                               HORA_SUM, &r[1]));
    MT_OK(hora_group_end());
    MT_FAILS(hora_wait(&r[0]), HORA_ERR_MISMATCH, "group");
    MT_FAILS(hora_wait(&r[1]), HORA_ERR_MISMATCH, "group");
  }
  /* The job goes on, the same names grouped right. */
  MT_OK(hora_group_start());
  MT_OK(hora_allreduce_async("grp/bad/ok", x, y, 8, HORA_FLOAT32, HORA_SUM, &r[0]));
  MT_OK(hora_allreduce_async("grp/bad/count", z, w, 8, HORA_FLOAT32, HORA_SUM, &r[1]));
  MT_OK(hora_group_end());
  MT_OK(hora_wait(&r[0]));
  MT_OK(hora_wait(&r[1]));
}

static void within_a_set_and_during_join(void) {
  int members[2] = {0, mt_size - 1};
  hora_process_set *ps = NULL;
  MT_OK(hora_process_set_create(members, mt_size > 1 ? 2 : 1, &ps));
  if (hora_process_set_included(ps)) {
    hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
    o.process_set = ps;
    int32_t one = 1, s1 = 0, s2 = 0;
    hora_request *r[3];
    MT_OK(hora_group_start());
    MT_OK(hora_allreduce_async_ex("grp/set/a", &one, &s1, 1, HORA_INT32, HORA_SUM, &o, &r[0]));
    MT_OK(hora_allreduce_async_ex("grp/set/b", &one, &s2, 1, HORA_INT32, HORA_SUM, &o, &r[1]));
    MT_FAILS(hora_allreduce_async("grp/set/world", &one, &s2, 1, HORA_INT32, HORA_SUM, &r[2]),
             HORA_ERR_INVALID_USAGE, "one process set");
    MT_OK(hora_group_end());
    MT_OK(hora_wait(&r[0]));
    MT_OK(hora_wait(&r[1]));
    MT_CHECK(s1 == hora_process_set_size(ps) && s2 == s1, "set sums %d %d", s1, s2);
  }
  MT_OK(hora_process_set_destroy(ps));
  /* Rank 0 joins at once; the others run a group, rank 0 adding zeros. */
  if (mt_rank != 0) {
    int32_t v = 1, s1 = 0, s2 = 0;
    hora_request *r[2];
    MT_OK(hora_group_start());
    MT_OK(hora_allreduce_async("grp/join/a", &v, &s1, 1, HORA_INT32, HORA_SUM, &r[0]));
    MT_OK(hora_allreduce_async("grp/join/b", &v, &s2, 1, HORA_INT32, HORA_SUM, &r[1]));
    MT_OK(hora_group_end());
    MT_OK(hora_wait(&r[0]));
    MT_OK(hora_wait(&r[1]));
    MT_CHECK(s1 == mt_size - 1 && s2 == mt_size - 1, "during join: %d %d", s1, s2);
  }
  MT_OK(hora_join(NULL));
}

int main(int argc, char **argv) {
  mt_setenv_args(argc, argv);
  mt_init();
  mt_run("groups/allreduces_in_any_order", allreduces_in_any_order);
  mt_run("groups/from_several_threads", groups_from_several_threads);
  mt_run("groups/mixed_kinds_nested_and_single", mixed_kinds_nested_and_single);
  mt_run("groups/a_mismatch_fails_the_whole_group", a_mismatch_fails_the_whole_group);
  mt_run("groups/within_a_set_and_during_join", within_a_set_and_during_join);
  int failures = mt_total_failures();
  int rc = hora_finalize();
  if (rc != HORA_SUCCESS) {
    fprintf(stderr, "hora_finalize: %s\n", hora_last_error());
    return 1;
  }
  return failures ? 1 : 0;
}
