/* Progress when no caller waits, and waiters that run only their own work.
 *
 * A trainer waits for one step's gradients at once (its hora_wait drives
 * the engine), then submits the next step's and computes without calling
 * hora: those must complete meanwhile, as they must for a thread that only
 * polls with hora_test. And a thread waiting on a small operation must not
 * run another thread's large collective scheduled after its own.
 *
 * Timing-based (a completion within tens of milliseconds), so the testlist
 * runs it at small rank counts only. */
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "mpitest.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The trainer's "compute": no hora call for ms milliseconds. */
static void compute(double ms) {
  double until = now_ms() + ms;
  while (now_ms() < until) {
    usleep(1000);
  }
}

enum { N = 8, LEN = 1024, STEPS = 8 };
static float grads[N][LEN];

static void submit_step(int step, hora_request **reqs) {
  for (int k = 0; k < N; k++) {
    for (int i = 0; i < LEN; i++) {
      grads[k][i] = (float)(k + step + mt_rank);
    }
    char name[32];
    snprintf(name, sizeof(name), "grad/%d", k);
    MT_OK(hora_allreduce_async(name, grads[k], grads[k], LEN, HORA_FLOAT32, HORA_SUM, &reqs[k]));
  }
}

static void check_step(int step, int k) {
  float want = (float)(mt_size * (k + step) + mt_size * (mt_size - 1) / 2);
  MT_CHECK(grads[k][0] == want && grads[k][LEN - 1] == want, "step %d grad/%d = %g, expected %g",
           step, k, (double)grads[k][0], (double)want);
}

/* Step s waited for at once; step s+1 submitted, then 40 ms of compute
 * (each op takes about a millisecond): every one must be done by then. */
static void next_step_done_while_computing(void) {
  hora_request *reqs[N];
  int late = 0;
  for (int step = 0; step < 2 * STEPS; step += 2) {
    MPI_Barrier(MPI_COMM_WORLD); /* (so that the waits find the ops ready, and drive) */
    submit_step(step, reqs);
    for (int k = 0; k < N; k++) {
      MT_OK(hora_wait(&reqs[k]));
      check_step(step, k);
    }
    submit_step(step + 1, reqs);
    compute(40);
    for (int k = 0; k < N; k++) {
      int done = 0;
      MT_OK(hora_test(&reqs[k], &done));
      late += !done;
    }
    for (int k = 0; k < N; k++) {
      if (reqs[k]) {
        MT_OK(hora_wait(&reqs[k]));
      }
      check_step(step + 1, k);
    }
  }
  MT_CHECK(late == 0, "%d of %d operations not done after 40 ms of compute", late, N * STEPS);
}

/* A thread that never calls hora_wait polls its operation with hora_test
 * after the main thread's waits drove the engine. */
static pthread_barrier_t poll_bar;
static double poll_worst_ms;

static void *poller(void *arg) {
  (void)arg;
  for (int round = 0; round < STEPS; round++) {
    pthread_barrier_wait(&poll_bar); /* the main thread's wait is over */
    float v[16];
    for (int i = 0; i < 16; i++) {
      v[i] = (float)(round + mt_rank);
    }
    hora_request *req;
    double t0 = now_ms();
    MT_OK(hora_allreduce_async("polled", v, v, 16, HORA_FLOAT32, HORA_SUM, &req));
    int done = 0;
    while (!done && now_ms() - t0 < 2000) {
      MT_OK(hora_test(&req, &done));
      if (!done) {
        usleep(200);
      }
    }
    double took = now_ms() - t0;
    poll_worst_ms = took > poll_worst_ms ? took : poll_worst_ms;
    if (!done) {
      MT_OK(hora_wait(&req));
    }
    MT_CHECK(v[0] == (float)(mt_size * round + mt_size * (mt_size - 1) / 2), "round %d: %g", round,
             (double)v[0]);
    pthread_barrier_wait(&poll_bar);
  }
  return NULL;
}

static void polling_thread_progresses(void) {
  pthread_t th;
  poll_worst_ms = 0;
  pthread_barrier_init(&poll_bar, NULL, 2);
  pthread_create(&th, NULL, poller, NULL);
  hora_request *reqs[N];
  for (int round = 0; round < STEPS; round++) {
    submit_step(round, reqs);
    for (int k = 0; k < N; k++) {
      MT_OK(hora_wait(&reqs[k]));
      check_step(round, k);
    }
    pthread_barrier_wait(&poll_bar);
    pthread_barrier_wait(&poll_bar);
  }
  pthread_join(th, NULL);
  pthread_barrier_destroy(&poll_bar);
  MT_CHECK(poll_worst_ms < 40, "a polled operation took %.1f ms", poll_worst_ms);
}

/* One group (rank 0 sends its members together, in the order it decided
 * them: the small one first): a small allreduce, then a large one of
 * another dtype (not fused with it). The thread that
 * waits on the small one must return without having run the large one,
 * which takes milliseconds: the completed-allreduce count it reads at once
 * must not include it. */
enum { BIG = 4 << 20, ROUNDS = 4 };
static double *big;
static hora_request *small_req;
static uint64_t small_seen;

static hora_stats stats_now(void) {
  hora_stats s = {.struct_size = sizeof(s)};
  MT_OK(hora_get_stats(&s));
  return s;
}

static void *small_waiter(void *arg) {
  (void)arg;
  MT_OK(hora_wait(&small_req));
  small_seen = stats_now().allreduces;
  return NULL;
}

static void small_wait_leaves_big_op(void) {
  big = malloc(BIG * sizeof(double));
  float v[16];
  int ran_big = 0;
  for (int round = 0; round < ROUNDS && big; round++) {
    for (size_t i = 0; i < BIG; i++) {
      big[i] = (double)(mt_rank + round);
    }
    for (int i = 0; i < 16; i++) {
      v[i] = (float)(mt_rank + round);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    uint64_t before = stats_now().allreduces;
    hora_request *big_req;
    MT_OK(hora_group_start());
    MT_OK(hora_allreduce_async("w/small", v, v, 16, HORA_FLOAT32, HORA_SUM, &small_req));
    MT_OK(hora_allreduce_async("w/big", big, big, BIG, HORA_FLOAT64, HORA_SUM, &big_req));
    MT_OK(hora_group_end());
    pthread_t th;
    pthread_create(&th, NULL, small_waiter, NULL);
    pthread_join(th, NULL);
    ran_big += small_seen - before > 1;
    MT_OK(hora_wait(&big_req));
    double want = (double)(mt_size * round + mt_size * (mt_size - 1) / 2);
    MT_CHECK(v[0] == (float)want && big[0] == want && big[BIG - 1] == want, "round %d: %g %g", round,
             (double)v[0], big[0]);
  }
  MT_CHECK(ran_big == 0, "in %d of %d rounds the small op's waiter ran the big op too", ran_big,
           ROUNDS);
  free(big);
}

int main(int argc, char **argv) {
  mt_setenv_args(argc, argv);
  mt_init();
  mt_run("waiters/next_step_done_while_computing", next_step_done_while_computing);
  mt_run("waiters/polling_thread_progresses", polling_thread_progresses);
  mt_run("waiters/small_wait_leaves_big_op", small_wait_leaves_big_op);
  int failures = mt_total_failures();
  MT_OK(hora_finalize());
  return failures ? 1 : 0;
}
