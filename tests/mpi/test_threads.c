/* Many threads submitting at once: each of T threads per rank submits its
 * own named allreduces (in a thread- and rank-specific order) and waits on
 * them, while another thread broadcasts; some threads poll with hora_test.
 * Every result is checked. */
#include <pthread.h>
#include <unistd.h>

#include "mpitest.h"

enum { THREADS = 8, OPS = 40, LEN = 257 };

struct worker {
  int id;
  int failures;
};

static void *allreduce_worker(void *arg) {
  struct worker *w = arg;
  static _Thread_local float bufs[OPS][LEN];
  hora_request *reqs[OPS];
  int order[OPS];
  for (int k = 0; k < OPS; k++) {
    order[k] = (k * 7 + w->id * 3 + mt_rank * 11) % OPS;
  }
  /* (k*7 + c) mod 40 is a permutation since gcd(7, 40) = 1. */
  for (int idx = 0; idx < OPS; idx++) {
    int k = order[idx];
    for (int i = 0; i < LEN; i++) {
      bufs[k][i] = (float)(w->id * 1000 + k * 10 + mt_rank + i % 3);
    }
    char name[48];
    snprintf(name, sizeof(name), "thread%d/op%d", w->id, k);
    int rc = hora_allreduce_async(name, bufs[k], bufs[k], LEN, HORA_FLOAT32, HORA_SUM, &reqs[k]);
    if (rc != HORA_SUCCESS) {
      fprintf(stderr, "  rank %d thread %d: submit %s: %s\n", mt_rank, w->id, name, hora_last_error());
      w->failures++;
      reqs[k] = NULL;
    }
  }
  for (int k = 0; k < OPS; k++) {
    if (!reqs[k]) {
      continue;
    }
    int rc;
    if (w->id % 2) {
      int done = 0;
      do {
        rc = hora_test(&reqs[k], &done);
        if (!done) {
          usleep(50);
        }
      } while (rc == HORA_SUCCESS && !done);
    } else {
      rc = hora_wait(&reqs[k]);
    }
    if (rc != HORA_SUCCESS) {
      fprintf(stderr, "  rank %d thread %d op %d: %s\n", mt_rank, w->id, k, hora_last_error());
      w->failures++;
      continue;
    }
    for (int i = 0; i < LEN; i++) {
      float want = (float)(mt_size * (w->id * 1000 + k * 10 + i % 3) + mt_size * (mt_size - 1) / 2);
      if (bufs[k][i] != want) {
        fprintf(stderr, "  rank %d thread %d op %d[%d]: %g, expected %g\n", mt_rank, w->id, k, i,
                (double)bufs[k][i], (double)want);
        w->failures++;
        break;
      }
    }
  }
  return NULL;
}

static void *broadcast_worker(void *arg) {
  struct worker *w = arg;
  for (int k = 0; k < OPS; k++) {
    int64_t v[9];
    int root = k % mt_size;
    for (int i = 0; i < 9; i++) {
      v[i] = mt_rank == root ? k * 100 + i : -1;
    }
    char name[32];
    snprintf(name, sizeof(name), "bthread/%d", k);
    int rc = hora_broadcast(name, v, 9, HORA_INT64, root);
    if (rc != HORA_SUCCESS || v[8] != k * 100 + 8) {
      fprintf(stderr, "  rank %d broadcast %d: rc %d value %lld\n", mt_rank, k, rc, (long long)v[8]);
      w->failures++;
    }
  }
  return NULL;
}

static void many_threads(void) {
  pthread_t th[THREADS + 1];
  struct worker w[THREADS + 1];
  for (int t = 0; t <= THREADS; t++) {
    w[t].id = t;
    w[t].failures = 0;
    pthread_create(&th[t], NULL, t < THREADS ? allreduce_worker : broadcast_worker, &w[t]);
  }
  for (int t = 0; t <= THREADS; t++) {
    pthread_join(th[t], NULL);
    MT_CHECK(w[t].failures == 0, "thread %d had %d failures", t, w[t].failures);
  }
}

int main(int argc, char **argv) {
  mt_setenv_args(argc, argv);
  mt_init();
  mt_run("threads/many_threads_submit_at_once", many_threads);
  mt_run("threads/again_same_names", many_threads);
  int failures = mt_total_failures();
  MT_OK(hora_finalize());
  return failures ? 1 : 0;
}
