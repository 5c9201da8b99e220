/* The API's contract at its edges: calls before hora_init, every
 * bad-argument path with its code and message, names already in flight,
 * and mismatches of every kind, after which the runtime still works. */
#include "mpitest.h"

static int before_init_failures;

#define PRE_CHECK(cond, what)                                                                \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      fprintf(stderr, "  before init: %s\n", what);                                          \
      before_init_failures++;                                                                \
    }                                                                                        \
  } while (0)

static void calls_before_init(void) {
  float x = 1;
  hora_request *r = NULL;
  int last;
  PRE_CHECK(hora_initialized() == 0, "hora_initialized() != 0");
  PRE_CHECK(hora_rank() == -1 && hora_size() == -1 && hora_local_rank() == -1 &&
                hora_local_size() == -1 && hora_cross_rank() == -1 && hora_cross_size() == -1,
            "rank getters are not -1");
  PRE_CHECK(hora_allreduce_async("x", &x, &x, 1, HORA_FLOAT32, HORA_SUM, &r) == HORA_ERR_INVALID_USAGE,
            "allreduce before init");
  PRE_CHECK(strstr(hora_last_error(), "hora_init") != NULL, "message does not mention hora_init");
  PRE_CHECK(hora_broadcast("x", &x, 1, HORA_FLOAT32, 0) == HORA_ERR_INVALID_USAGE, "broadcast before init");
  PRE_CHECK(hora_allgather("x", &x, 1, HORA_FLOAT32, &x) == HORA_ERR_INVALID_USAGE, "allgather before init");
  PRE_CHECK(hora_barrier() == HORA_ERR_INVALID_USAGE, "barrier before init");
  PRE_CHECK(hora_join(&last) == HORA_ERR_INVALID_USAGE, "join before init");
  PRE_CHECK(hora_finalize() == HORA_ERR_INVALID_USAGE, "finalize before init");
  PRE_CHECK(hora_abort("x") == HORA_ERR_INVALID_USAGE, "abort before init");
  PRE_CHECK(hora_wait(NULL) == HORA_ERR_INVALID_ARG, "wait(NULL)");
  PRE_CHECK(hora_wait(&r) == HORA_ERR_INVALID_ARG, "wait(&NULL)");
}

static void report_before_init(void) {
  MT_CHECK(before_init_failures == 0, "%d checks before hora_init failed", before_init_failures);
  MT_OK(hora_init()); /* a second call is harmless */
  MT_CHECK(hora_initialized() == 1, "not initialized");
}

static void bad_arguments(void) {
  float x[4] = {0}, y[4];
  hora_request *r = (hora_request *)(uintptr_t)1; /* must be cleared on failure */
  MT_FAILS(hora_allreduce_async("a", x, y, 4, HORA_FLOAT32, HORA_SUM, NULL), HORA_ERR_INVALID_ARG, "req");
  MT_FAILS(hora_allreduce_async("a", NULL, y, 4, HORA_FLOAT32, HORA_SUM, &r), HORA_ERR_INVALID_ARG, "sendbuf");
  MT_CHECK(r == NULL, "*req not cleared after a failed call");
  MT_FAILS(hora_allreduce_async("a", x, NULL, 4, HORA_FLOAT32, HORA_SUM, &r), HORA_ERR_INVALID_ARG, "recvbuf");
  MT_FAILS(hora_allreduce_async("a", x, y, 4, (hora_dtype)99, HORA_SUM, &r), HORA_ERR_INVALID_ARG, "dtype 99");
  MT_FAILS(hora_allreduce_async("a", x, y, 4, (hora_dtype)-1, HORA_SUM, &r), HORA_ERR_INVALID_ARG, "dtype");
  MT_FAILS(hora_allreduce_async("a", x, y, 4, HORA_FLOAT32, (hora_op)42, &r), HORA_ERR_INVALID_ARG, "op 42");
  MT_FAILS(hora_allreduce_async("a", x, y, SIZE_MAX / 2, HORA_FLOAT32, HORA_SUM, &r), HORA_ERR_INVALID_ARG,
           "overflow");
  char long_name[300];
  memset(long_name, 'n', sizeof(long_name));
  long_name[256] = '\0';
  MT_FAILS(hora_allreduce_async(long_name, x, y, 4, HORA_FLOAT32, HORA_SUM, &r), HORA_ERR_INVALID_ARG,
           "longer than 255");
  long_name[255] = '\0'; /* exactly 255 bytes is allowed */
  MT_OK(hora_allreduce(long_name, x, y, 4, HORA_FLOAT32, HORA_SUM));
  MT_FAILS(hora_broadcast_async("b", x, 4, HORA_FLOAT32, -1, &r), HORA_ERR_INVALID_ARG, "root -1");
  MT_FAILS(hora_broadcast_async("b", x, 4, HORA_FLOAT32, mt_size, &r), HORA_ERR_INVALID_ARG, "out of range");
  MT_FAILS(hora_broadcast_async("b", NULL, 4, HORA_FLOAT32, 0, &r), HORA_ERR_INVALID_ARG, "buf");
  MT_FAILS(hora_broadcast_async("b", x, 4, (hora_dtype)(HORA_BOOL + 1), 0, &r), HORA_ERR_INVALID_ARG,
           "dtype 10");
  MT_FAILS(hora_broadcast_async("b", x, 4, HORA_FLOAT32, 0, NULL), HORA_ERR_INVALID_ARG, "req");
  MT_FAILS(hora_allgather_async("g", NULL, 4, HORA_FLOAT32, y, &r), HORA_ERR_INVALID_ARG, "sendbuf");
  MT_FAILS(hora_allgather_async("g", x, 4, HORA_FLOAT32, NULL, &r), HORA_ERR_INVALID_ARG, "recvbuf");
  MT_FAILS(hora_allgather_async("g", x, SIZE_MAX / 8, HORA_FLOAT64, y, &r), HORA_ERR_INVALID_ARG, "overflow");
  MT_FAILS(hora_allgather_async("g", x, 1, HORA_FLOAT32, y, NULL), HORA_ERR_INVALID_ARG, "req");
  MT_FAILS(hora_wait(NULL), HORA_ERR_INVALID_ARG, "req");
  r = NULL;
  MT_FAILS(hora_wait(&r), HORA_ERR_INVALID_ARG, "*req");
  int done = 7;
  MT_FAILS(hora_test(NULL, &done), HORA_ERR_INVALID_ARG, "req");
  MT_FAILS(hora_test(&r, &done), HORA_ERR_INVALID_ARG, "*req");
  MT_FAILS(hora_allreduce("blocking", x, NULL, 4, HORA_FLOAT32, HORA_SUM), HORA_ERR_INVALID_ARG, "recvbuf");
  MT_FAILS(hora_broadcast("blocking", x, 4, HORA_FLOAT32, 1 << 20), HORA_ERR_INVALID_ARG, "root");
  MT_FAILS(hora_allgather("blocking", NULL, 4, HORA_FLOAT32, y), HORA_ERR_INVALID_ARG, "sendbuf");
  /* hora_test with a NULL `done` must not free the request. */
  hora_request *q;
  MT_OK(hora_allreduce_async("test-null-done", x, y, 4, HORA_FLOAT32, HORA_SUM, &q));
  MT_FAILS(hora_test(&q, NULL), HORA_ERR_INVALID_ARG, "done");
  MT_OK(hora_wait(&q));
  /* The runtime is untouched by all of the above. */
  for (int i = 0; i < 4; i++) {
    x[i] = (float)(mt_rank + i);
  }
  MT_OK(hora_allreduce("after-bad-args", x, y, 4, HORA_FLOAT32, HORA_SUM));
  MT_CHECK(y[1] == (float)(mt_size * (mt_size - 1) / 2 + mt_size), "allreduce after bad args is wrong");
}

static void name_already_in_flight(void) {
  int32_t a = mt_rank, b = 0, c = 0;
  hora_request *r1 = NULL, *r2 = NULL;
  /* "dup" cannot complete before the last rank submits it, after the
   * barrier: until then it is certainly in flight everywhere else. */
  int last = mt_size - 1;
  if (mt_rank != last) {
    MT_OK(hora_allreduce_async("dup", &a, &b, 1, HORA_INT32, HORA_SUM, &r1));
    MT_FAILS(hora_allreduce_async("dup", &a, &c, 1, HORA_INT32, HORA_SUM, &r2),
             HORA_ERR_INVALID_USAGE, "already in flight");
    MT_CHECK(r2 == NULL, "*req set by a refused call");
    MT_FAILS(hora_broadcast_async("dup", &c, 1, HORA_INT32, 0, &r2), HORA_ERR_INVALID_USAGE, "'dup'");
  }
  mt_barrier();
  if (mt_rank == last) {
    MT_OK(hora_allreduce_async("dup", &a, &b, 1, HORA_INT32, HORA_SUM, &r1));
  }
  MT_OK(hora_wait(&r1));
  MT_CHECK(b == mt_size * (mt_size - 1) / 2, "dup allreduce gave %d", b);
  /* Once complete, the name is free again. */
  MT_OK(hora_allreduce("dup", &a, &c, 1, HORA_INT32, HORA_SUM));
  MT_CHECK(c == b, "second dup allreduce gave %d", c);
}

static void mismatches_fail_everywhere(void) {
  if (mt_size < 2) {
    return;
  }
  float buf[16] = {0}, out[16 * 64];
  /* count */
  size_t n = mt_rank == 1 ? 11 : 10;
  MT_FAILS(hora_allreduce("m.count", buf, out, n, HORA_FLOAT32, HORA_SUM), HORA_ERR_MISMATCH,
           "rank 0 sent 10 elements, rank 1 sent 11");
  /* dtype */
  MT_FAILS(hora_allreduce("m.dtype", buf, out, 4, mt_rank == 1 ? HORA_INT32 : HORA_FLOAT32, HORA_SUM),
           HORA_ERR_MISMATCH, "rank 1 sent int32");
  /* op */
  MT_FAILS(hora_allreduce("m.op", buf, out, 4, HORA_FLOAT32, mt_rank == 1 ? HORA_MAX : HORA_SUM),
           HORA_ERR_MISMATCH, "rank 1 for max");
  /* root */
  MT_FAILS(hora_broadcast("m.root", buf, 4, HORA_FLOAT32, mt_rank == 1 ? 1 : 0), HORA_ERR_MISMATCH,
           "root");
  /* kind */
  int rc = mt_rank == 1 ? hora_broadcast("m.kind", buf, 4, HORA_FLOAT32, 0)
                        : hora_allreduce("m.kind", buf, out, 4, HORA_FLOAT32, HORA_SUM);
  MT_CHECK(rc == HORA_ERR_MISMATCH && strstr(hora_last_error(), "m.kind"),
           "kind mismatch gave %s: %s", hora_strerror(rc), hora_last_error());
  /* allgather count */
  MT_FAILS(hora_allgather("m.gather", buf, mt_rank == 1 ? 2 : 1, HORA_FLOAT32, out), HORA_ERR_MISMATCH,
           "elements");
  /* Still usable afterwards, with the same names. */
  buf[0] = 1;
  MT_OK(hora_allreduce("m.count", buf, out, 1, HORA_FLOAT32, HORA_SUM));
  MT_CHECK(out[0] == (float)mt_size, "allreduce after mismatches gave %g", (double)out[0]);
}

static void strerror_and_last_error(void) {
  for (int c = HORA_SUCCESS; c <= HORA_ERR_NOT_SUPPORTED; c++) {
    MT_CHECK(hora_strerror(c) && hora_strerror(c)[0], "no string for code %d", c);
  }
  MT_CHECK(strcmp(hora_strerror(1000), "unknown result") == 0, "out-of-range code");
  float x = 0;
  hora_allreduce("le", &x, NULL, 1, HORA_FLOAT32, HORA_SUM);
  MT_CHECK(strstr(hora_last_error(), "recvbuf") != NULL, "last_error: %s", hora_last_error());
  MT_OK(hora_allreduce("le", &x, &x, 1, HORA_FLOAT32, HORA_SUM));
  MT_CHECK(hora_last_error()[0] == '\0', "last_error not cleared by a successful call: %s",
           hora_last_error());
}

int main(void) {
  calls_before_init();
  mt_init();
  mt_run("api/before_init", report_before_init);
  mt_run("api/bad_arguments", bad_arguments);
  mt_run("api/name_already_in_flight", name_already_in_flight);
  if (mt_size >= 2) {
    mt_run("api/mismatches_fail_everywhere", mismatches_fail_everywhere);
  } else {
    mt_skip("api/mismatches_fail_everywhere", "needs at least 2 ranks");
  }
  mt_run("api/strerror_and_last_error", strerror_and_last_error);
  int failures = mt_total_failures();
  MT_OK(hora_finalize());
  int bad = 0;
  if (hora_initialized() != 0 || hora_rank() != -1) {
    bad++;
  }
  /* hora started MPI and finalized it: the runtime cannot start again
   * (started without MPI, nothing says it cannot). */
  if (mt_launched_by_mpi() &&
      (hora_init() != HORA_ERR_INVALID_USAGE || !strstr(hora_last_error(), "finalized"))) {
    fprintf(stderr, "  rank %d: hora_init after hora_finalize: %s\n", mt_rank, hora_last_error());
    bad++;
  }
  float x = 0;
  if (hora_allreduce("late", &x, &x, 1, HORA_FLOAT32, HORA_SUM) != HORA_ERR_INVALID_USAGE) {
    bad++;
  }
  if (hora_finalize() != HORA_ERR_INVALID_USAGE) {
    bad++;
  }
  if (mt_rank == 0) {
    printf("%s api/after_finalize\n", bad ? "FAIL" : "PASS");
  }
  return failures || bad ? 1 : 0;
}
