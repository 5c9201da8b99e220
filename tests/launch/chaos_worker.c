/* A worker of an elastic job that trains a small deterministic "model", for
 * tests/launch/check-elastic-chaos.sh: whatever the job loses or admits on
 * the way, every process that finishes must hold the same w, and that w must
 * be the one a single process gets by applying each step exactly once.
 *
 * The model: a vector w of DIM doubles, zero at step 0. Each step s, rank r
 * of a membership of size n contributes g[i] = c(s, i) + d(r, n, i), where
 * c is an integer that depends on s and i only and the offsets d sum to zero
 * over the n ranks (so every rank's share counts: a missing or doubled one
 * changes the result). The allreduce sums them (exactly: small half-integers)
 * and w += sum / n, which is c(s, i) exactly, whatever the membership.
 * (HORA_AVERAGE multiplies by 1/n, which is not exact for n = 7: the
 * division is done here.) Every step whose average is not c(s, i) is a FAIL
 * line naming it.
 *
 * State sync: after hora_init and after every reset, the step counter and w
 * travel together from rank 0 (one broadcast), and the members' ids are
 * gathered (rank order). After a loss the survivors resume from rank 0's
 * step with rank 0's w, so each step is in w once.
 *
 * Ids: an original worker's is its start-up rank; a newcomer's is
 * HORA_TEST_ID (else 1000 + pid % 1000). HORA_TEST_STEP_MS: milliseconds of
 * "compute" per step (default 0). A commit point every COMMIT steps.
 *
 * Prints (stdout), when it finishes:
 *   final epoch E members I0 I1 ... step S checksum H
 *   id I rank R size N resets K
 * and exits 0 (1 if a step's average was wrong); when something fails for
 * good: "FAIL id I step S: <error> (<message>)" and exits 1. On stderr, a line
 * per loss and per reset, and "id I: ready" once it trains (after its first
 * sync).
 *
 * usage: chaos_worker STEPS [COMMIT]
 *        chaos_worker --expect STEPS   (prints the checksum of w after STEPS
 *                                       steps, computed alone, no hora) */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hora.h"

#define DIM 4096 /* 32 KiB: above the eager threshold, so the rings carry it */
#define MAX_MEMBERS 1024

static int my_id = -1;
static int ids[MAX_MEMBERS];
static int resets;

/* The part of step s's gradient that every rank shares: an integer in [-11, 11]. */
static double shared_part(int64_t s, int i) {
  return (double)((s * 7919 + (int64_t)i * 104729) % 23) - 11.0;
}

/* Rank r's own part: (2r - (n - 1)) / 2 * (i % 3 + 1); these sum to 0 over r. */
static double own_part(int r, int n, int i) {
  return (double)(2 * r - (n - 1)) * 0.5 * (double)(i % 3 + 1);
}

/* FNV-1a over w's bytes. */
static uint64_t checksum(const double *w) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char *p = (const unsigned char *)w;
  for (size_t k = 0; k < DIM * sizeof(double); k++) {
    h = (h ^ p[k]) * 1099511628211ull;
  }
  return h;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* state[0]: the step; state[1..DIM]: w. From rank 0 to everyone, with the ids. */
static int sync_state(double *state) {
  int rc = hora_allgather("chaos.ids", &my_id, 1, HORA_INT32, ids);
  if (rc == HORA_SUCCESS) {
    rc = hora_broadcast("chaos.state", state, DIM + 1, HORA_FLOAT64, 0);
  }
  return rc;
}

static int reset(void) {
  double t0 = now();
  int rc = hora_elastic_reset();
  resets++;
  fprintf(stderr, "id %d: reset %s in %.3f s: epoch %d, rank %d of %d%s%s\n", my_id,
          rc == HORA_SUCCESS ? "done" : "failed", now() - t0, hora_elastic_epoch(), hora_rank(),
          hora_size(), rc == HORA_SUCCESS ? "" : ": ", rc == HORA_SUCCESS ? "" : hora_last_error());
  return rc;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  setvbuf(stderr, NULL, _IOLBF, 0);
  static double state[DIM + 1], g[DIM], sum[DIM];
  double *w = state + 1;
  if (argc == 3 && strcmp(argv[1], "--expect") == 0) {
    int64_t steps = atoll(argv[2]);
    for (int64_t s = 0; s < steps; s++) {
      for (int i = 0; i < DIM; i++) {
        w[i] += shared_part(s, i);
      }
    }
    printf("%016" PRIx64 "\n", checksum(w));
    return 0;
  }
  int steps = argc > 1 ? atoi(argv[1]) : 100;
  int every = argc > 2 ? atoi(argv[2]) : 10;
  const char *ms = getenv("HORA_TEST_STEP_MS");
  long step_ms = ms ? atol(ms) : 0;
  struct timespec pause = {step_ms / 1000, (step_ms % 1000) * 1000000L};
  int rc = hora_init();
  if (rc != HORA_SUCCESS) {
    printf("FAIL id ? step 0: hora_init: %s (%s)\n", hora_strerror(rc), hora_last_error());
    return 1;
  }
  if (hora_elastic_joined()) {
    const char *v = getenv("HORA_TEST_ID");
    my_id = v ? atoi(v) : 1000 + (int)(getpid() % 1000);
  } else {
    my_id = hora_rank();
  }
  rc = sync_state(state);
  if (rc == HORA_SUCCESS) {
    fprintf(stderr, "id %d: ready: epoch %d, rank %d of %d, step %.0f\n", my_id,
            hora_elastic_epoch(), hora_rank(), hora_size(), state[0]);
  }
  int bad = 0;
  while ((int)state[0] < steps) {
    int64_t s = (int64_t)state[0];
    if (rc == HORA_SUCCESS) {
      if (step_ms > 0) {
        nanosleep(&pause, NULL);
      }
      int r = hora_rank(), n = hora_size();
      for (int i = 0; i < DIM; i++) {
        g[i] = shared_part(s, i) + own_part(r, n, i);
      }
      rc = hora_allreduce("chaos.grad", g, sum, DIM, HORA_FLOAT64, HORA_SUM);
      if (rc == HORA_SUCCESS) {
        for (int i = 0; i < DIM; i++) {
          double avg = sum[i] / (double)n;
          if (avg != shared_part(s, i) && bad++ == 0) {
            printf("FAIL id %d step %" PRId64 ": element %d averaged %.17g, want %.0f (size %d, "
                   "epoch %d)\n", my_id, s, i, avg, shared_part(s, i), n, hora_elastic_epoch());
          }
          w[i] += avg;
        }
        state[0] = (double)(s + 1);
        if ((s + 1) % every == 0) {
          int changed = 0;
          rc = hora_elastic_commit(&changed);
          if (rc == HORA_SUCCESS && changed) {
            rc = reset();
            if (rc != HORA_SUCCESS) {
              break; /* for good */
            }
            rc = sync_state(state);
            continue;
          }
        }
      }
    }
    if (rc == HORA_ERR_PEER_LOST || rc == HORA_ERR_ABORTED) {
      fprintf(stderr, "id %d: step %" PRId64 ": %s\n", my_id, s, hora_last_error());
      rc = reset();
      if (rc == HORA_SUCCESS) {
        rc = sync_state(state);
        continue;
      }
    }
    if (rc != HORA_SUCCESS) {
      break;
    }
  }
  if (rc != HORA_SUCCESS) {
    printf("FAIL id %d step %.0f: %s (%s)\n", my_id, state[0], hora_strerror(rc),
           hora_last_error());
    return 1;
  }
  int n = hora_size();
  printf("final epoch %d members", hora_elastic_epoch());
  for (int r = 0; r < n && r < MAX_MEMBERS; r++) {
    printf(" %d", ids[r]);
  }
  printf(" step %.0f checksum %016" PRIx64 "\n", state[0], checksum(w));
  printf("id %d rank %d size %d resets %d%s\n", my_id, hora_rank(), n, resets,
         bad ? " WRONG" : "");
  rc = hora_finalize();
  if (rc != HORA_SUCCESS) {
    printf("FAIL id %d finalize: %s\n", my_id, hora_last_error());
    return 1;
  }
  return bad ? 1 : 0;
}
