/* hora_join with uneven step counts over two epochs: joined ranks take
 * part with zeros, AVERAGE still divides by the full size, hora_join
 * returns the last rank to join, a broadcast from a joined root fails while
 * an allgather runs, and the job goes on normally afterwards. */
#include <pthread.h>
#include <time.h>

#include "mpitest.h"

enum { LEN = 100 };

/* One epoch: rank r runs steps(r) allreduces, then joins. */
static void epoch(int (*steps)(int rank), int expect_last) {
  int mine = steps(mt_rank);
  float g[LEN], avg[LEN];
  int32_t mx[LEN];
  for (int s = 0; s < mine; s++) {
    for (int i = 0; i < LEN; i++) {
      g[i] = (float)(mt_rank + 1);
      avg[i] = (float)(mt_rank + 1);
      mx[i] = -1 - mt_rank;
    }
    /* A reducescatter too: joined ranks add zeros to it as to an allreduce. */
    float sh[LEN], block[LEN];
    for (int i = 0; i < LEN; i++) {
      sh[i] = (float)(mt_rank + 1);
    }
    hora_request *r1, *r2, *r3, *r4;
    MT_OK(hora_allreduce_async("grad", g, g, LEN, HORA_FLOAT32, HORA_SUM, &r1));
    MT_OK(hora_allreduce_async("avg", avg, avg, LEN, HORA_FLOAT32, HORA_AVERAGE, &r2));
    MT_OK(hora_allreduce_async("max", mx, mx, LEN, HORA_INT32, HORA_MAX, &r3));
    MT_OK(hora_reducescatter_async("shard", sh, block, LEN, HORA_FLOAT32, HORA_SUM, &r4));
    MT_OK(hora_wait(&r1));
    MT_OK(hora_wait(&r2));
    MT_OK(hora_wait(&r3));
    MT_OK(hora_wait(&r4));
    /* Ranks still stepping contribute; joined ones add zeros. */
    float sum = 0;
    int joined = 0, max_active = -1000;
    for (int r = 0; r < mt_size; r++) {
      if (steps(r) > s) {
        sum += (float)(r + 1);
        max_active = -1 - r > max_active ? -1 - r : max_active;
      } else {
        joined++;
      }
    }
    int32_t want_max = joined ? 0 : max_active;
    MT_CHECK(g[0] == sum && g[LEN - 1] == sum, "step %d: sum %g, expected %g", s, (double)g[0],
             (double)sum);
    /* Horovod's AVERAGE multiplies by 1/size rounded to float (ScaleBuffer),
     * which is not always sum / size to the last bit (np 3, 5). */
    float want_avg = sum * (float)(1.0 / mt_size);
    MT_CHECK(avg[7] == want_avg, "step %d: average %.9g, expected %.9g (the sum times 1/%d)", s,
             (double)avg[7], (double)want_avg, mt_size);
    MT_CHECK(mx[3] == want_max, "step %d: max %d, expected %d", s, mx[3], want_max);
    size_t blen = hora_reducescatter_block(LEN, 0, mt_size, mt_rank);
    MT_CHECK(blen == 0 || (block[0] == sum && block[blen - 1] == sum),
             "step %d: reducescatter %g, expected %g", s, (double)block[0], (double)sum);
  }
  /* The rank with the most steps finishes after everyone else joined: its
   * broadcast runs (the joined ranks receive it), one from a joined root
   * fails, and an allgather runs. */
  if (mt_size > 1 && mt_rank == expect_last) {
    float b[2] = {1, 2};
    MT_OK(hora_broadcast("during-join", b, 2, HORA_FLOAT32, mt_rank));
    MT_CHECK(b[0] == 1 && b[1] == 2, "the root's broadcast changed its buffer");
    int joined_root = (expect_last + 1) % mt_size;
    char want[64];
    snprintf(want, sizeof(want), "its root, rank %d, has called hora_join", joined_root);
    MT_FAILS(hora_broadcast("during-join-r", b, 2, HORA_FLOAT32, joined_root),
             HORA_ERR_INVALID_USAGE, want);
    /* An allgather runs too, the joined ranks' blocks zeros. */
    float seven = 7, *all = calloc((size_t)mt_size, sizeof(float));
    MT_OK(hora_allgather("during-join-g", &seven, 1, HORA_FLOAT32, all));
    for (int q = 0; q < mt_size; q++) {
      MT_CHECK(all[q] == (q == mt_rank ? 7.0f : 0.0f), "allgather during join: block %d is %g", q,
               (double)all[q]);
    }
    free(all);
  }
  int last = -2;
  MT_OK(hora_join(&last));
  MT_CHECK(last == expect_last, "hora_join reported rank %d as last, expected %d", last, expect_last);
}

static int steps_up(int rank) { return 5 + 2 * rank; }
static int steps_down(int rank) { return 5 + 2 * (mt_size - 1 - rank); }

static void two_epochs(void) {
  epoch(steps_up, mt_size - 1);
  epoch(steps_down, 0);
  /* Back to normal: broadcast and allgather work again. */
  int32_t v[3] = {mt_rank, mt_rank, mt_rank};
  MT_OK(hora_broadcast("after-join", v, 3, HORA_INT32, mt_size - 1));
  MT_CHECK(v[0] == mt_size - 1, "broadcast after join gave %d", v[0]);
  int32_t *all = malloc(sizeof(int32_t) * (size_t)mt_size);
  MT_OK(hora_allgather("after-join-g", &mt_rank, 1, HORA_INT32, all));
  for (int r = 0; r < mt_size; r++) {
    MT_CHECK(all[r] == r, "allgather after join: slot %d = %d", r, all[r]);
  }
  free(all);
}

static void join_with_null_and_alone(void) {
  /* Everyone joins at once; NULL is allowed for the out-parameter. */
  MT_OK(hora_join(NULL));
  int last = -2;
  MT_OK(hora_join(&last));
  MT_CHECK(last >= 0 && last < mt_size, "last joined rank %d is out of range", last);
}

/* Joined ranks stand in for fused tensors of different sizes (it once
 * reused a stand-in buffer after growing it); results stay exact. */
static void joined_ranks_stand_in_for_fused_tensors(void) {
  int last = mt_size - 1;
  if (mt_rank != last) {
    int who = -1;
    MT_OK(hora_join(&who));
    MT_CHECK(who == last, "last joined %d", who);
    return;
  }
  enum { K = 4 };
  static const size_t sizes[K] = {10, 1000, 100000, 3};
  for (int step = 0; step < 5; step++) {
    float *bufs[K];
    hora_request *r[K];
    for (int k = 0; k < K; k++) {
      bufs[k] = malloc(sizes[k] * sizeof(float));
      for (size_t i = 0; i < sizes[k]; i++) {
        bufs[k][i] = (float)(k + step + 1);
      }
      char name[32];
      snprintf(name, sizeof(name), "standin/%d", k);
      MT_OK(hora_allreduce_async(name, bufs[k], bufs[k], sizes[k], HORA_FLOAT32, HORA_SUM, &r[k]));
    }
    for (int k = 0; k < K; k++) {
      MT_OK(hora_wait(&r[k]));
      float want = (float)(k + step + 1); /* the others add zeros */
      MT_CHECK(bufs[k][0] == want && bufs[k][sizes[k] - 1] == want, "step %d tensor %d: %g, want %g",
               step, k, (double)bufs[k][0], (double)want);
      free(bufs[k]);
    }
  }
  int who = -1;
  MT_OK(hora_join(&who));
  MT_CHECK(who == last, "last joined %d", who);
}

/* Barriers and unnamed operations refused or stood in for while others had
 * joined still count on every rank: after the join, the next ones match
 * (they once waited for ever, each rank on a different sequence number). */
static void refused_operations_keep_ranks_in_step(void) {
  int last = mt_size - 1, who = -1;
  if (mt_size > 1 && mt_rank == last) {
    float b[2] = {1, 2};
    MT_FAILS(hora_barrier(), HORA_ERR_INVALID_USAGE, "join");
    MT_FAILS(hora_broadcast(NULL, b, 2, HORA_FLOAT32, 0), HORA_ERR_INVALID_USAGE, "join");
    MT_OK(hora_allreduce(NULL, b, b, 2, HORA_FLOAT32, HORA_SUM));
    MT_CHECK(b[0] == 1 && b[1] == 2, "unnamed allreduce while the others had joined: %g %g",
             (double)b[0], (double)b[1]);
  }
  MT_OK(hora_join(&who));
  MT_CHECK(who == last, "last joined %d, expected %d", who, last);
  MT_OK(hora_barrier());
  int32_t v[2] = {mt_rank, 1};
  MT_OK(hora_allreduce(NULL, v, v, 2, HORA_INT32, HORA_SUM));
  MT_CHECK(v[0] == mt_size * (mt_size - 1) / 2 && v[1] == mt_size, "unnamed allreduce after join: %d %d",
           v[0], v[1]);
  v[0] = mt_rank;
  MT_OK(hora_broadcast(NULL, v, 1, HORA_INT32, last));
  MT_CHECK(v[0] == last, "unnamed broadcast after join gave %d", v[0]);
  MT_OK(hora_barrier());
}

/* A trainer's epoch end: uneven last steps, join, then a broadcast of the
 * parameters from the last rank to join, every epoch under the same names.
 * The broadcasts ran from the cache after the first epoch, and a rank that
 * took them before the cycle that ended the join sent them in full while
 * the others waited in the cache: each such epoch stalled until the stall
 * inspector's fallback, half of HORA_STALL_CHECK_TIME_SECONDS (30 s) later. */
static void cached_broadcast_right_after_join(void) {
  enum { T = 6, N = 64, EPOCHS = 12 };
  float w[T][N];
  hora_tensor t[T];
  char names[T][32];
  for (int k = 0; k < T; k++) {
    snprintf(names[k], sizeof(names[k]), "params/%d", k);
    t[k] = (hora_tensor){names[k], w[k], N, HORA_FLOAT32};
  }
  for (int epoch = 0; epoch < EPOCHS; epoch++) {
    double t0 = MPI_Wtime();
    int steps = 2 + (mt_rank == mt_size - 1); /* the same root every epoch, as cached */
    for (int s = 0; s < steps; s++) {
      float g[N];
      for (int i = 0; i < N; i++) {
        g[i] = 1;
      }
      MT_OK(hora_allreduce("epoch-end/grad", g, g, N, HORA_FLOAT32, HORA_SUM));
    }
    int last = -1;
    MT_OK(hora_join(&last));
    if (mt_rank == last) {
      /* Late here, early on the ranks that joined first: the ranks take
       * their broadcasts on both sides of the cycle after the join's. */
      struct timespec pause = {0, 20 * 1000 * 1000};
      nanosleep(&pause, NULL);
    }
    for (int k = 0; k < T; k++) {
      for (int i = 0; i < N; i++) {
        w[k][i] = (float)(mt_rank * 1000 + epoch * 10 + k);
      }
    }
    MT_OK(hora_broadcast_parameters(t, T, last));
    int bad = 0;
    for (int k = 0; k < T; k++) {
      bad += w[k][0] != (float)(last * 1000 + epoch * 10 + k) || w[k][N - 1] != w[k][0];
    }
    MT_CHECK(!bad, "epoch %d: %d parameter tensors differ from rank %d's", epoch, bad, last);
    /* Milliseconds when right; the stall above took 30 s. */
    double dt = MPI_Wtime() - t0;
    MT_CHECK(dt < 15, "epoch %d: join and broadcast took %.1f s", epoch, dt);
    int stop = bad || dt >= 15; /* every rank stops together */
    MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (stop) {
      break;
    }
  }
}

/* With the last rank joined, the others still broadcast among themselves
 * from a rank that has not joined (the joined one receives into its
 * stand-in), each from every root in turn; a broadcast from the joined
 * rank fails on all of them, naming it. */
static void broadcast_while_some_have_joined(void) {
  int joined = mt_size - 1, who = -1;
  if (mt_size < 3) {
    MT_OK(hora_join(&who));
    return;
  }
  if (mt_rank != joined) {
    for (int root = 0; root < joined; root++) {
      int32_t v[300];
      for (int i = 0; i < 300; i++) {
        v[i] = mt_rank * 1000 + i;
      }
      char name[32];
      snprintf(name, sizeof(name), "bj/%d", root);
      MT_OK(hora_broadcast(name, v, 300, HORA_INT32, root));
      MT_CHECK(v[0] == root * 1000 && v[299] == root * 1000 + 299,
               "broadcast from %d while rank %d had joined: %d", root, joined, v[0]);
    }
    int32_t x = 1;
    char want[64];
    snprintf(want, sizeof(want), "its root, rank %d, has called hora_join", joined);
    MT_FAILS(hora_broadcast("bj/joined-root", &x, 1, HORA_INT32, joined), HORA_ERR_INVALID_USAGE,
             want);
  }
  MT_OK(hora_join(&who));
}

struct join_arg {
  int rc, last;
};

static void *join_in_thread(void *arg) {
  struct join_arg *j = arg;
  j->rc = hora_join(&j->last);
  return NULL;
}

static void pause_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* A joined rank stands in for the other ranks' allreduces, yet another of
 * its threads may still submit one under the same name, with its own
 * count. Here rank 1 joins, then submits "jm/x" with the count cached
 * (N/2), while the others submit it with N: rank 0 runs their N with rank
 * 1 standing in, and rank 1 must not run its own N/2-element request under
 * that response (it once did: reading and writing N elements of its
 * N/2-element buffers, and reporting success). Rank 1's request fails with
 * HORA_ERR_MISMATCH; the others get their sum (rank 1 adding zeros) or, if
 * rank 1's request reached rank 0 first, the same mismatch. */
static void joined_rank_request_must_match_its_response(void) {
  if (mt_size < 2) {
    return;
  }
  enum { N = 4096 };
  size_t mine = mt_rank == 1 ? N / 2 : N;
  float *in = malloc(mine * sizeof(float)), *out = malloc(mine * sizeof(float));
  for (int step = 0; step < 3; step++) { /* cached with N/2 everywhere */
    for (size_t i = 0; i < N / 2; i++) {
      in[i] = 1;
    }
    MT_OK(hora_allreduce("jm/x", in, out, N / 2, HORA_FLOAT32, HORA_SUM));
  }
  for (size_t i = 0; i < mine; i++) {
    in[i] = (float)(mt_rank + 1);
    out[i] = -1;
  }
  pthread_t joiner;
  struct join_arg j = {-1, -2};
  hora_request *req = NULL;
  MPI_Barrier(MPI_COMM_WORLD);
  if (mt_rank == 1) {
    MT_CHECK(pthread_create(&joiner, NULL, join_in_thread, &j) == 0, "pthread_create");
    pause_ms(50); /* the join is taken: rank 1 stands in for the cached allreduces */
    MT_OK(hora_allreduce_async("jm/x", in, out, N / 2, HORA_FLOAT32, HORA_SUM, &req));
    pause_ms(50); /* and this one waits in the cache, where it matches */
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (mt_rank == 1) {
    MT_FAILS(hora_wait(&req), HORA_ERR_MISMATCH, "2048");
    MT_CHECK(out[N / 2 - 1] == -1, "rank 1's request wrote its output: %g", (double)out[N / 2 - 1]);
    /* Still joined, it submits the name again. Rank 0 may still hold the
     * failed request (sent to it in full): the name is then still in
     * flight here, and the new one is refused (it once reached rank 0 as
     * a second submission, a fatal protocol error). Otherwise it runs
     * once the others have joined, rank 1 alone contributing. */
    int again = hora_allreduce_async("jm/x", in, out, N / 2, HORA_FLOAT32, HORA_SUM, &req);
    /* It must reach rank 0 before the others' joins: one that arrived after
     * the join completed would wait for ranks that have moved on (seen once
     * over the 2x2 network namespaces, where a cycle takes longer). */
    pause_ms(250);
    MPI_Barrier(MPI_COMM_WORLD); /* now the others join */
    if (again == HORA_SUCCESS) {
      MT_OK(hora_wait(&req));
      MT_CHECK(out[0] == 2 && out[N / 2 - 1] == 2, "jm/x again: %g, expected rank 1's 2",
               (double)out[0]);
    } else {
      MT_CHECK(again == HORA_ERR_INVALID_USAGE && strstr(hora_last_error(), "in flight"),
               "jm/x again: %s: %s", hora_strerror(again), hora_last_error());
    }
    MT_CHECK(pthread_join(joiner, NULL) == 0, "pthread_join");
    MT_OK(j.rc);
    MT_CHECK(j.last != 1, "rank 1 joined first, yet hora_join says it was last");
  } else {
    int rc = hora_allreduce("jm/x", in, out, N, HORA_FLOAT32, HORA_SUM);
    if (rc == HORA_SUCCESS) {
      float want = 0;
      for (int r = 0; r < mt_size; r++) {
        want += r == 1 ? 0.0f : (float)(r + 1);
      }
      MT_CHECK(out[0] == want && out[N - 1] == want, "sum %g / %g, expected %g", (double)out[0],
               (double)out[N - 1], (double)want);
    } else {
      MT_CHECK(rc == HORA_ERR_MISMATCH && strstr(hora_last_error(), "2048"),
               "allreduce jm/x: %s: %s", hora_strerror(rc), hora_last_error());
    }
    MPI_Barrier(MPI_COMM_WORLD); /* rank 1 has submitted it again */
    MT_OK(hora_join(NULL));
  }
  /* The job goes on. */
  float v = 1, w = 0;
  MT_OK(hora_allreduce("jm/after", &v, &w, 1, HORA_FLOAT32, HORA_SUM));
  MT_CHECK(w == (float)mt_size, "allreduce after the mismatch: %g", (double)w);
  free(in);
  free(out);
}

int main(int argc, char **argv) {
  mt_setenv_args(argc, argv);
  mt_init();
  mt_run("join/two_uneven_epochs", two_epochs);
  mt_run("join/null_and_simultaneous", join_with_null_and_alone);
  mt_run("join/stand_in_for_fused_tensors", joined_ranks_stand_in_for_fused_tensors);
  mt_run("join/refused_operations_keep_ranks_in_step", refused_operations_keep_ranks_in_step);
  mt_run("join/cached_broadcast_right_after_join", cached_broadcast_right_after_join);
  mt_run("join/broadcast_while_some_have_joined", broadcast_while_some_have_joined);
  mt_run("join/joined_rank_request_must_match_its_response",
         joined_rank_request_must_match_its_response);
  int failures = mt_total_failures();
  MT_OK(hora_finalize());
  return failures ? 1 : 0;
}
