/* hora_finalize on one thread while others call hora_elastic_reset,
 * hora_elastic_commit, hora_elastic_epoch and hora_elastic_joined in a loop,
 * ROUNDS times (hora_init again each round), for tests/launch/check-elastic.sh
 * (one process: HORA_ELASTIC=1 and a tcp rendezvous of size 1). No call may
 * crash or touch freed memory (the sanitized builds run it); once
 * hora_finalize has returned, each fails clearly: reset and commit with
 * HORA_ERR_INVALID_USAGE saying hora_finalize was called, epoch -1, joined 0.
 * Prints "PASS ..." and exits 0, or FAIL lines and 1.
 * usage: elastic_finalize_race [ROUNDS] */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hora.h"

enum { CALL_RESET, CALL_COMMIT, CALL_EPOCH, CALL_JOINED, NCALLS };
static const char *const call_names[NCALLS] = {"hora_elastic_reset", "hora_elastic_commit",
                                               "hora_elastic_epoch", "hora_elastic_joined"};

static atomic_bool finalized; /* hora_finalize has returned */
static atomic_bool stop;
static atomic_int failures;

struct caller {
  pthread_t thread;
  int call;
  long before, after; /* calls made while the runtime ran, and after hora_finalize */
};

static void pause_us(long us) {
  struct timespec ts = {0, us * 1000};
  nanosleep(&ts, NULL);
}

static int call_once(int call) {
  int changed = 0;
  switch (call) {
  case CALL_RESET:
    return hora_elastic_reset();
  case CALL_COMMIT:
    return hora_elastic_commit(&changed);
  case CALL_EPOCH:
    return hora_elastic_epoch();
  default:
    return hora_elastic_joined();
  }
}

/* What a call made after hora_finalize returned must give. */
static bool clear_after_finalize(int call, int rc) {
  if (call == CALL_EPOCH) {
    return rc == -1;
  }
  if (call == CALL_JOINED) {
    return rc == 0;
  }
  return rc == HORA_ERR_INVALID_USAGE && strstr(hora_last_error(), "hora_finalize");
}

static void *caller_main(void *arg) {
  struct caller *c = arg;
  while (!atomic_load(&stop)) {
    bool after = atomic_load(&finalized);
    int rc = call_once(c->call);
    if (!after) {
      c->before++;
    } else {
      c->after++;
      if (!clear_after_finalize(c->call, rc) && atomic_fetch_add(&failures, 1) < 8) {
        printf("FAIL %s after hora_finalize returned %d %s(%s)\n", call_names[c->call], rc,
               rc < 0 ? hora_strerror(rc) : "", hora_last_error());
      }
    }
    pause_us(100); /* the calls interleave with finalize's steps, not starve its lock */
  }
  return NULL;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 10;
  setvbuf(stdout, NULL, _IONBF, 0);
  long before[NCALLS] = {0}, after[NCALLS] = {0};
  for (int round = 0; round < rounds; round++) {
    if (hora_init() != HORA_SUCCESS) {
      printf("FAIL round %d: hora_init: %s\n", round, hora_last_error());
      return 1;
    }
    if (hora_elastic_epoch() < 1) { /* (epochs go on counting across hora_init) */
      printf("FAIL round %d: not an elastic job (epoch %d): HORA_ELASTIC=1 expected\n", round,
             hora_elastic_epoch());
      return 1;
    }
    atomic_store(&finalized, false);
    atomic_store(&stop, false);
    struct caller callers[NCALLS];
    for (int i = 0; i < NCALLS; i++) {
      callers[i] = (struct caller){.call = i};
      pthread_create(&callers[i].thread, NULL, caller_main, &callers[i]);
    }
    pause_us(20000); /* the calls run against the running job first */
    int rc = hora_finalize();
    atomic_store(&finalized, true);
    if (rc != HORA_SUCCESS) {
      printf("FAIL round %d: hora_finalize: %s (%s)\n", round, hora_strerror(rc),
             hora_last_error());
      atomic_fetch_add(&failures, 1);
    }
    pause_us(10000); /* and against the finalized one */
    atomic_store(&stop, true);
    for (int i = 0; i < NCALLS; i++) {
      pthread_join(callers[i].thread, NULL);
      before[i] += callers[i].before;
      after[i] += callers[i].after;
    }
  }
  /* Not vacuous: each call ran both while the job ran and after it ended. */
  for (int i = 0; i < NCALLS; i++) {
    if (before[i] == 0 || after[i] == 0) {
      printf("FAIL %s: %ld calls while the job ran, %ld after hora_finalize (want both)\n",
             call_names[i], before[i], after[i]);
      atomic_fetch_add(&failures, 1);
    }
  }
  if (atomic_load(&failures) > 0) {
    return 1;
  }
  printf("PASS %d rounds of hora_finalize racing", rounds);
  for (int i = 0; i < NCALLS; i++) {
    printf("%s %s (%ld calls, %ld after)", i ? "," : "", call_names[i], before[i] + after[i],
           after[i]);
  }
  printf("\n");
  return 0;
}
