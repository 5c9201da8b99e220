/* The hash table, the result-code table, and the rank-0 controller driven
 * directly, without processes. */
#include <stdio.h>
#include <stdlib.h>

#include "runtime/negotiate/fusion.h"
#include "runtime/negotiate/negotiate.h"
#include "base/table.h"
#include "runtime/observe/verify.h"
#include "../runner.h"

TEST(table_put_get_remove_grow) {
  struct hora__table t = {0};
  char key[32];
  for (int i = 0; i < 5000; i++) {
    int n = snprintf(key, sizeof(key), "k%d", i);
    ASSERT(hora__table_put(&t, key, (size_t)n, (void *)(intptr_t)(i + 1)) == HORA_SUCCESS);
  }
  ASSERT_EQ_INT(t.count, 5000);
  for (int i = 0; i < 5000; i += 2) {
    int n = snprintf(key, sizeof(key), "k%d", i);
    ASSERT((intptr_t)hora__table_remove(&t, key, (size_t)n) == i + 1);
  }
  for (int i = 0; i < 5000; i++) {
    int n = snprintf(key, sizeof(key), "k%d", i);
    void *v = hora__table_get(&t, key, (size_t)n);
    ASSERT(i % 2 ? (intptr_t)v == i + 1 : v == NULL);
  }
  ASSERT(hora__table_remove(&t, "nope", 4) == NULL);
  ASSERT(hora__table_put(&t, "k1", 2, (void *)7) == HORA_SUCCESS); /* replace */
  ASSERT((intptr_t)hora__table_get(&t, "k1", 2) == 7);
  ASSERT_EQ_INT(t.count, 2500);
  hora__table_free(&t);
}

/* The same names through the table step after step: removed entries are
 * reused (no allocation once warm), and a reused entry holds its new key
 * whole, short or long. */
TEST(table_reuses_removed_entries) {
  struct hora__table t = {0};
  char key[200];
  for (int step = 0; step < 50; step++) {
    for (int i = 0; i < 100; i++) {
      int len = 1 + (i * 37 + step) % 150; /* lengths across several rounding sizes */
      memset(key, 'a' + i % 26, (size_t)len);
      key[0] = (char)i;
      ASSERT(hora__table_put(&t, key, (size_t)len, (void *)(intptr_t)(i + 1)) == HORA_SUCCESS);
    }
    ASSERT_EQ_INT(t.count, 100);
    for (int i = 0; i < 100; i++) {
      int len = 1 + (i * 37 + step) % 150;
      memset(key, 'a' + i % 26, (size_t)len);
      key[0] = (char)i;
      ASSERT((intptr_t)hora__table_get(&t, key, (size_t)len) == i + 1);
      ASSERT((intptr_t)hora__table_remove(&t, key, (size_t)len) == i + 1);
    }
    ASSERT_EQ_INT(t.count, 0);
    ASSERT(t.nspare > 0 && t.nspare <= t.nbuckets);
  }
  hora__table_free(&t);
}

TEST(strerror_covers_every_code) {
  const int codes[] = {HORA_SUCCESS,        HORA_ERR_INVALID_ARG, HORA_ERR_INVALID_USAGE,
                       HORA_ERR_MISMATCH,   HORA_ERR_NO_MEMORY,   HORA_ERR_SYSTEM,
                       HORA_ERR_PEER_LOST,  HORA_ERR_TIMEOUT,     HORA_ERR_ABORTED,
                       HORA_ERR_NOT_SUPPORTED, HORA_ERR_CORRUPT, HORA_ERR_PROTOCOL};
  for (int i = 0; i < (int)(sizeof(codes) / sizeof(codes[0])); i++) {
    ASSERT_EQ_INT(codes[i], i); /* the order API.md fixes */
    const char *s = hora_strerror(codes[i]);
    ASSERT(s && s[0] && strcmp(s, "unknown result") != 0);
    for (int j = 0; j < i; j++) {
      ASSERT(strcmp(s, hora_strerror(codes[j])) != 0);
    }
  }
  ASSERT(strcmp(hora_strerror(-1), "unknown result") == 0);
  ASSERT(strcmp(hora_strerror(HORA_RESULT_COUNT_), "unknown result") == 0);
  ASSERT(strcmp(hora_dtype_name(HORA_BFLOAT16), "bfloat16") == 0);
  ASSERT(strcmp(hora_op_name((hora_op)99), "unknown") == 0);
  ASSERT_EQ_INT(hora_dtype_size(HORA_FLOAT16), 2);
  ASSERT_EQ_INT(hora_dtype_size((hora_dtype)42), 0);
  ASSERT(strcmp(hora_dtype_name(HORA_INT16), "int16") == 0 && hora_dtype_size(HORA_INT16) == 2);
  ASSERT(strcmp(hora_dtype_name(HORA_BOOL), "bool") == 0 && hora_dtype_size(HORA_BOOL) == 1);
  ASSERT(strcmp(hora_dtype_name((hora_dtype)(HORA_BOOL + 1)), "unknown") == 0);
  ASSERT_EQ_INT(HORA_INT16, 8); /* ABI: appended after HORA_FLOAT64 */
  ASSERT_EQ_INT(HORA_BOOL, 9);
  ASSERT(!hora__dtype_is_float(HORA_INT16) && !hora__dtype_is_float(HORA_BOOL) &&
         hora__dtype_is_float(HORA_FLOAT16) && hora__dtype_is_float(HORA_FLOAT64));
}

static int submit(struct hora__controller *c, int rank, uint8_t kind, const char *key, uint64_t count,
                  uint8_t dtype, uint8_t op, int root) {
  struct hora__wire_request r = {.meta = {.kind = kind, .dtype = dtype, .op = op, .root = root,
                                          .count = count, .prescale = 1, .postscale = 1},
                                 .key = key,
                                 .key_len = strlen(key)};
  return hora__controller_submit(c, rank, &r);
}

static struct hora__response *take_fused(struct hora__controller *c, int64_t threshold) {
  struct hora__response *head = NULL, **tail = &head;
  hora__controller_take(c, &tail, threshold);
  return head;
}

static struct hora__response *take_all(struct hora__controller *c) { return take_fused(c, 0); }

static void free_list(struct hora__response *r) {
  while (r) {
    struct hora__response *n = r->next;
    hora__response_free(r);
    r = n;
  }
}

TEST(controller_matches_and_orders) {
  struct hora__controller *c;
  ASSERT(hora__controller_create(3, &c) == HORA_SUCCESS);
  /* Ranks submit a, b in different orders; b completes first. */
  ASSERT(submit(c, 0, HORA_KIND_ALLREDUCE, "Na", 4, HORA_FLOAT32, HORA_SUM, -1) == 0);
  ASSERT(submit(c, 1, HORA_KIND_ALLREDUCE, "Nb", 2, HORA_INT32, HORA_MAX, -1) == 0);
  ASSERT(submit(c, 0, HORA_KIND_ALLREDUCE, "Nb", 2, HORA_INT32, HORA_MAX, -1) == 0);
  ASSERT(!hora__controller_has_ready(c));
  ASSERT_EQ_INT(hora__controller_pending(c), 2);
  ASSERT(submit(c, 2, HORA_KIND_ALLREDUCE, "Nb", 2, HORA_INT32, HORA_MAX, -1) == 0);
  ASSERT(submit(c, 2, HORA_KIND_ALLREDUCE, "Na", 4, HORA_FLOAT32, HORA_SUM, -1) == 0);
  ASSERT(submit(c, 1, HORA_KIND_ALLREDUCE, "Na", 4, HORA_FLOAT32, HORA_SUM, -1) == 0);
  struct hora__response *r = take_all(c);
  ASSERT(r && r->next && !r->next->next);
  ASSERT(strcmp(r->tensors[0].key, "Nb") == 0 && r->op == HORA_MAX && r->dtype == HORA_INT32);
  ASSERT(strcmp(r->next->tensors[0].key, "Na") == 0 && r->next->tensors[0].count == 4);
  ASSERT_EQ_INT(hora__controller_pending(c), 0);
  free_list(r);
  /* The same name can be used again once done. */
  for (int rank = 0; rank < 3; rank++) {
    ASSERT(submit(c, rank, HORA_KIND_BROADCAST, "Na", 9, HORA_UINT8, 0, 2) == 0);
  }
  r = take_all(c);
  ASSERT(r && r->kind == HORA_KIND_BROADCAST && r->root == 2);
  free_list(r);
  hora__controller_destroy(c);
}

TEST(controller_mismatch_messages) {
  struct {
    uint8_t kind, dtype, op;
    uint64_t count;
    int root;
    const char *expect;
  } cases[] = {
      {HORA_KIND_ALLREDUCE, HORA_FLOAT32, HORA_SUM, 11, -1, "rank 0 sent 10 elements, rank 1 sent 11"},
      {HORA_KIND_ALLREDUCE, HORA_FLOAT64, HORA_SUM, 10, -1, "rank 0 sent float32, rank 1 sent float64"},
      {HORA_KIND_ALLREDUCE, HORA_FLOAT32, HORA_MAX, 10, -1, "rank 0 asked for sum, rank 1 for max"},
      {HORA_KIND_BROADCAST, HORA_FLOAT32, 0, 10, 0, "rank 0 submitted allreduce, rank 1 broadcast"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    struct hora__controller *c;
    ASSERT(hora__controller_create(2, &c) == HORA_SUCCESS);
    ASSERT(submit(c, 0, HORA_KIND_ALLREDUCE, "Ngrad", 10, HORA_FLOAT32, HORA_SUM, -1) == 0);
    ASSERT(submit(c, 1, cases[i].kind, "Ngrad", cases[i].count, cases[i].dtype, cases[i].op,
                  cases[i].root) == 0);
    struct hora__response *r = take_all(c);
    ASSERT(r && r->kind == HORA_KIND_ERROR && r->error_code == HORA_ERR_MISMATCH);
    ASSERT_STR_CONTAINS(r->error_msg, cases[i].expect);
    ASSERT_STR_CONTAINS(r->error_msg, "'grad'");
    free_list(r);
    hora__controller_destroy(c);
  }
  struct hora__controller *c;
  ASSERT(hora__controller_create(2, &c) == HORA_SUCCESS);
  ASSERT(submit(c, 0, HORA_KIND_BROADCAST, "Nw", 3, HORA_INT8, 0, 0) == 0);
  ASSERT(submit(c, 1, HORA_KIND_BROADCAST, "Nw", 3, HORA_INT8, 0, 1) == 0);
  struct hora__response *r = take_all(c);
  ASSERT(r && r->error_code == HORA_ERR_MISMATCH);
  ASSERT_STR_CONTAINS(r->error_msg, "rank 0 named root 0, rank 1 root 1");
  free_list(r);
  hora__controller_destroy(c);
  /* More distinct requests than the controller keeps, in reverse rank
   * order: still rank 0 against the lowest rank that differs from it. */
  ASSERT(hora__controller_create(8, &c) == HORA_SUCCESS);
  for (int rank = 7; rank >= 0; rank--) {
    ASSERT(submit(c, rank, HORA_KIND_ALLREDUCE, "Nv", 10 + (uint64_t)rank, HORA_FLOAT32, HORA_SUM,
                  -1) == 0);
  }
  r = take_all(c);
  ASSERT(r && r->error_code == HORA_ERR_MISMATCH);
  ASSERT_STR_CONTAINS(r->error_msg, "rank 0 sent 10 elements, rank 1 sent 11");
  free_list(r);
  hora__controller_destroy(c);
  /* Same count, other shapes (or none): named whichever rank came first. */
  struct hora__shape flat = {2, {17, 1311}}, deep = {3, {17, 23, 57}};
  const struct hora__shape *pairs[][2] = {{&flat, &deep}, {NULL, &flat}, {&deep, NULL}};
  const char *want[] = {"allreduce 'x': rank 0 submitted shape [17, 1311], rank 1 shape [17, 23, 57]",
                        "allreduce 'x': rank 0 submitted no shape, rank 1 shape [17, 1311]",
                        "allreduce 'x': rank 0 submitted shape [17, 23, 57], rank 1 no shape"};
  for (int i = 0; i < 3; i++) {
    for (int order = 0; order < 2; order++) {
      ASSERT(hora__controller_create(2, &c) == HORA_SUCCESS);
      for (int k = 0; k < 2; k++) {
        int rank = order ? 1 - k : k;
        struct hora__wire_request q = {
            .meta = {.kind = HORA_KIND_ALLREDUCE, .dtype = HORA_FLOAT32, .count = 17 * 1311,
                     .root = -1, .prescale = 1, .postscale = 1},
            .key = "Nx", .key_len = 2, .shape = pairs[i][rank]};
        q.meta.shape = hora__shape_fingerprint(q.meta.kind, q.shape);
        ASSERT(hora__controller_submit(c, rank, &q) == 0);
      }
      r = take_all(c);
      ASSERT(r && r->kind == HORA_KIND_ERROR && r->error_code == HORA_ERR_MISMATCH);
      ASSERT_STR_CONTAINS(r->error_msg, want[i]);
      free_list(r);
      hora__controller_destroy(c);
    }
  }
  /* Equal shapes run, and the response carries their fingerprint. */
  ASSERT(hora__controller_create(2, &c) == HORA_SUCCESS);
  for (int rank = 0; rank < 2; rank++) {
    struct hora__wire_request q = {
        .meta = {.kind = HORA_KIND_ALLREDUCE, .dtype = HORA_FLOAT32, .count = 17 * 1311,
                 .root = -1, .prescale = 1, .postscale = 1},
        .key = "Nx", .key_len = 2, .shape = &deep};
    q.meta.shape = hora__shape_fingerprint(q.meta.kind, q.shape);
    ASSERT(hora__controller_submit(c, rank, &q) == 0);
  }
  r = take_all(c);
  ASSERT(r && r->kind == HORA_KIND_ALLREDUCE && r->tensors[0].shape ==
         hora__shape_fingerprint(HORA_KIND_ALLREDUCE, &deep));
  free_list(r);
  hora__controller_destroy(c);
}

TEST(controller_join_and_shutdown) {
  struct hora__controller *c;
  ASSERT(hora__controller_create(3, &c) == HORA_SUCCESS);
  ASSERT(submit(c, 1, HORA_KIND_JOIN, "J", 0, 0, 0, -1) == 0);
  /* An allreduce completes without the joined rank ... */
  ASSERT(submit(c, 0, HORA_KIND_ALLREDUCE, "Ng", 5, HORA_FLOAT32, HORA_AVERAGE, -1) == 0);
  ASSERT(!hora__controller_has_ready(c));
  ASSERT(submit(c, 2, HORA_KIND_ALLREDUCE, "Ng", 5, HORA_FLOAT32, HORA_AVERAGE, -1) == 0);
  struct hora__response *r = take_all(c);
  ASSERT(r && r->kind == HORA_KIND_ALLREDUCE && !r->next);
  free_list(r);
  /* ... so does a broadcast from a root that has not joined (the joined
   * rank receives it) ... */
  ASSERT(submit(c, 0, HORA_KIND_BROADCAST, "Nc", 5, HORA_FLOAT32, 0, 0) == 0);
  ASSERT(!hora__controller_has_ready(c));
  ASSERT(submit(c, 2, HORA_KIND_BROADCAST, "Nc", 5, HORA_FLOAT32, 0, 0) == 0);
  r = take_all(c);
  ASSERT(r && r->kind == HORA_KIND_BROADCAST && r->root == 0 && !r->next);
  free_list(r);
  /* ... but one from the joined rank fails, naming it. */
  ASSERT(submit(c, 0, HORA_KIND_BROADCAST, "Nb", 5, HORA_FLOAT32, 0, 1) == 0);
  r = take_all(c);
  ASSERT(r && r->kind == HORA_KIND_ERROR && r->error_code == HORA_ERR_INVALID_USAGE);
  ASSERT_STR_CONTAINS(r->error_msg, "its root, rank 1, has called hora_join");
  free_list(r);
  /* Last to join is reported, and the state resets for the next epoch. */
  ASSERT(submit(c, 2, HORA_KIND_JOIN, "J", 0, 0, 0, -1) == 0);
  ASSERT(submit(c, 0, HORA_KIND_JOIN, "J", 0, 0, 0, -1) == 0);
  r = take_all(c);
  ASSERT(r && r->kind == HORA_KIND_JOIN && r->last_joined == 0);
  free_list(r);
  ASSERT(submit(c, 0, HORA_KIND_ALLREDUCE, "Ng", 5, HORA_FLOAT32, HORA_SUM, -1) == 0);
  ASSERT(submit(c, 2, HORA_KIND_ALLREDUCE, "Ng", 5, HORA_FLOAT32, HORA_SUM, -1) == 0);
  ASSERT(!hora__controller_has_ready(c)); /* rank 1 is no longer joined */
  /* Rank 1 finalizes without submitting Ng: Ng fails at once. */
  ASSERT(submit(c, 1, HORA_KIND_SHUTDOWN, "S", 0, 0, 0, -1) == 0);
  r = take_all(c);
  ASSERT(r && r->kind == HORA_KIND_ERROR && r->error_code == HORA_ERR_ABORTED);
  ASSERT_STR_CONTAINS(r->error_msg, "rank 1 called hora_finalize");
  free_list(r);
  ASSERT(submit(c, 0, HORA_KIND_SHUTDOWN, "S", 0, 0, 0, -1) == 0);
  ASSERT(!hora__controller_has_ready(c));
  ASSERT(submit(c, 2, HORA_KIND_SHUTDOWN, "S", 0, 0, 0, -1) == 0);
  r = take_all(c);
  ASSERT(r && r->kind == HORA_KIND_SHUTDOWN);
  free_list(r);
  hora__controller_destroy(c);
}

TEST(controller_fuses_compatible_responses) {
  struct hora__controller *c;
  ASSERT(hora__controller_create(1, &c) == HORA_SUCCESS);
  /* 4-byte floats: a(10) b(10) are fusable; c is int32; d(30) is too big
   * to join a+b under 100 bytes; e(5) fits after a+b. */
  ASSERT(submit(c, 0, HORA_KIND_ALLREDUCE, "Na", 10, HORA_FLOAT32, HORA_SUM, -1) == 0);
  ASSERT(submit(c, 0, HORA_KIND_ALLREDUCE, "Nb", 10, HORA_FLOAT32, HORA_SUM, -1) == 0);
  ASSERT(submit(c, 0, HORA_KIND_ALLREDUCE, "Nc", 10, HORA_INT32, HORA_SUM, -1) == 0);
  ASSERT(submit(c, 0, HORA_KIND_ALLREDUCE, "Nd", 30, HORA_FLOAT32, HORA_SUM, -1) == 0);
  ASSERT(submit(c, 0, HORA_KIND_ALLREDUCE, "Ne", 5, HORA_FLOAT32, HORA_SUM, -1) == 0);
  ASSERT(submit(c, 0, HORA_KIND_ALLREDUCE, "Nf", 5, HORA_FLOAT32, HORA_MAX, -1) == 0);
  ASSERT(submit(c, 0, HORA_KIND_BROADCAST, "Ng", 8, HORA_FLOAT32, 0, 0) == 0);
  ASSERT(submit(c, 0, HORA_KIND_BROADCAST, "Nh", 8, HORA_FLOAT32, 0, 0) == 0);
  uint64_t wake;
  ASSERT(hora__controller_should_send(c, hora__now_ns(), 1000000, 100, &wake)); /* nothing pending */
  struct hora__response *r = take_fused(c, 100);
  const char *want[][3] = {{"Na", "Nb", "Ne"}, {"Nc", 0, 0}, {"Nd", 0, 0}, {"Nf", 0, 0}, {"Ng", "Nh", 0}};
  int i = 0;
  for (struct hora__response *x = r; x; x = x->next, i++) {
    ASSERT(i < 5);
    for (uint32_t t = 0; t < 3; t++) {
      if (!want[i][t]) {
        ASSERT_EQ_INT(x->ntensors, t);
        break;
      }
      ASSERT(t < x->ntensors && strcmp(x->tensors[t].key, want[i][t]) == 0);
    }
  }
  ASSERT_EQ_INT(i, 5);
  free_list(r);
  hora__controller_destroy(c);
}

static int submit_grouped(struct hora__controller *c, int rank, const char *key, uint64_t group,
                          uint32_t size) {
  struct hora__wire_request r = {.meta = {.kind = HORA_KIND_ALLREDUCE, .dtype = HORA_FLOAT32,
                                          .op = HORA_SUM, .root = -1, .count = 4, .prescale = 1,
                                          .postscale = 1, .group = group, .group_size = size},
                                 .key = key,
                                 .key_len = strlen(key)};
  return hora__controller_submit(c, rank, &r);
}

/* A group's members wait at rank 0 until all are ready everywhere, then
 * leave together; a failed member fails the rest, those still to come too. */
TEST(controller_holds_groups_and_fails_them_whole) {
  struct hora__controller *c;
  ASSERT(hora__controller_create(2, &c) == HORA_SUCCESS);
  ASSERT(submit_grouped(c, 0, "Na", 77, 2) == 0);
  ASSERT(submit_grouped(c, 1, "Na", 77, 2) == 0);
  ASSERT(!hora__controller_has_ready(c)); /* Na ready, but Nb is not */
  ASSERT(submit_grouped(c, 0, "Nb", 77, 2) == 0);
  ASSERT(!hora__controller_has_ready(c));
  ASSERT(submit_grouped(c, 1, "Nb", 77, 2) == 0);
  ASSERT(hora__controller_has_ready(c));
  uint64_t wake;
  ASSERT(hora__controller_should_send(c, hora__now_ns(), 5000000000ull, 1 << 20, &wake));
  struct hora__response *r = take_fused(c, 1 << 20);
  ASSERT(r && !r->next && r->ntensors == 2); /* together, fused */
  free_list(r);
  /* Nc mismatches (rank 1 sends another count): Nd, pending, fails with it,
   * and so does Ne, which arrives afterwards. */
  ASSERT(submit_grouped(c, 0, "Nc", 88, 3) == 0);
  ASSERT(submit_grouped(c, 0, "Nd", 88, 3) == 0);
  struct hora__wire_request bad = {.meta = {.kind = HORA_KIND_ALLREDUCE, .dtype = HORA_FLOAT32,
                                            .op = HORA_SUM, .root = -1, .count = 5,
                                            .prescale = 1, .postscale = 1, .group = 88,
                                            .group_size = 3},
                                   .key = "Nc", .key_len = 2};
  ASSERT(hora__controller_submit(c, 1, &bad) == 0);
  r = take_all(c);
  int errors = 0;
  for (struct hora__response *x = r; x; x = x->next) {
    ASSERT(x->kind == HORA_KIND_ERROR && x->error_code == HORA_ERR_MISMATCH);
    errors++;
    if (strcmp(x->tensors[0].key, "Nd") == 0) {
      ASSERT(strstr(x->error_msg, "fails with its group") != NULL);
    }
  }
  ASSERT_EQ_INT(errors, 2);
  free_list(r);
  ASSERT(submit_grouped(c, 1, "Ne", 88, 3) == 0);
  r = take_all(c);
  ASSERT(r && r->kind == HORA_KIND_ERROR && strcmp(r->tensors[0].key, "Ne") == 0);
  free_list(r);
  ASSERT_EQ_INT(hora__controller_pending(c), 0);
  hora__controller_destroy(c);
}

TEST(controller_cycle_policy) {
  struct hora__controller *c;
  ASSERT(hora__controller_create(2, &c) == HORA_SUCCESS);
  uint64_t now = hora__now_ns(), wake;
  /* One op ready, another half-submitted: hold back for the cycle time. */
  ASSERT(submit(c, 0, HORA_KIND_ALLREDUCE, "Na", 10, HORA_FLOAT32, HORA_SUM, -1) == 0);
  ASSERT(submit(c, 1, HORA_KIND_ALLREDUCE, "Na", 10, HORA_FLOAT32, HORA_SUM, -1) == 0);
  ASSERT(submit(c, 0, HORA_KIND_ALLREDUCE, "Nb", 10, HORA_FLOAT32, HORA_SUM, -1) == 0);
  ASSERT(!hora__controller_should_send(c, now, 5000000000ull, 1 << 20, &wake));
  ASSERT(wake != UINT64_MAX && wake > now);
  ASSERT(hora__controller_should_send(c, wake, 5000000000ull, 1 << 20, &wake)); /* time is up */
  ASSERT(hora__controller_should_send(c, now, 5000000000ull, 40, &wake));      /* buffer full */
  /* Once nothing else is pending, it goes at once. */
  ASSERT(submit(c, 1, HORA_KIND_ALLREDUCE, "Nb", 10, HORA_FLOAT32, HORA_SUM, -1) == 0);
  ASSERT(hora__controller_should_send(c, now, 5000000000ull, 1 << 20, &wake));
  free_list(take_all(c));
  ASSERT(!hora__controller_should_send(c, now, 5000000000ull, 1 << 20, &wake)); /* nothing ready */
  hora__controller_destroy(c);
}

/* HORA_VERIFY's checksum reads buffers as one stream: any split gives the
 * same sum; any flipped bit, swapped word or change of length changes it. */
TEST(checksum_stream_and_sensitivity) {
  enum { N = 1000 };
  static uint8_t a[N];
  for (int i = 0; i < N; i++) {
    a[i] = (uint8_t)(i * 131 + 7);
  }
  struct hora__iov whole = {a, N};
  uint64_t h = hora__checksum(&whole, 1);
  for (size_t cut1 = 0; cut1 < 70; cut1 += 3) {
    for (size_t cut2 = cut1; cut2 < N; cut2 += 97) {
      struct hora__iov parts[3] = {{a, cut1}, {a + cut1, cut2 - cut1}, {a + cut2, N - cut2}};
      ASSERT(hora__checksum(parts, 3) == h);
    }
  }
  for (int byte = 0; byte < N; byte += 37) {
    for (int bit = 0; bit < 8; bit++) {
      a[byte] ^= (uint8_t)(1u << bit);
      ASSERT(hora__checksum(&whole, 1) != h);
      a[byte] ^= (uint8_t)(1u << bit);
    }
  }
  uint8_t b[N];
  memcpy(b, a, N);
  memcpy(b, a + 8, 8);
  memcpy(b + 8, a, 8);
  struct hora__iov swapped = {b, N}, shorter = {a, N - 1};
  ASSERT(hora__checksum(&swapped, 1) != h);
  ASSERT(hora__checksum(&shorter, 1) != h);
  ASSERT(hora__checksum(&whole, 1) == h);
}
