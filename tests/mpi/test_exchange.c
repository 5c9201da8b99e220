/* Allgatherv and alltoall end to end: counts that differ by rank and by
 * pair (zeros among them), every dtype, blocks of many chunks and many
 * shared-memory rounds, the allocating forms and the counts they return,
 * mismatched receive counts failing on every rank, argument errors, names in
 * any order with the response cache, process sets, and both during a join.
 * Every byte is a function of (sender, receiver, index), checked here. */
#include <stdlib.h>

#include "mpitest.h"

static uint8_t byte_of(int from, int to, size_t i) {
  return (uint8_t)mt_hash(((uint64_t)from << 48) ^ ((uint64_t)(to + 1) << 32) ^ i);
}

static void fill(uint8_t *p, size_t bytes, int from, int to) {
  for (size_t i = 0; i < bytes; i++) {
    p[i] = byte_of(from, to, i);
  }
}

/* The first byte that differs, or -1. */
static long check(const uint8_t *p, size_t bytes, int from, int to) {
  for (size_t i = 0; i < bytes; i++) {
    if (p[i] != byte_of(from, to, i)) {
      return (long)i;
    }
  }
  return -1;
}

/* Elements rank r sends in allgatherv round k (some 0). */
static size_t gv_count(int r, int k, size_t scale) {
  return ((size_t)(r * 7 + k * 3) % 5) * scale;
}

static void allgatherv_with(size_t scale, const char *tag) {
  for (int dt = 0; dt <= HORA_BOOL; dt++) {
    size_t es = hora_dtype_size((hora_dtype)dt);
    size_t *counts = calloc((size_t)mt_size, sizeof(size_t)), total = 0;
    for (int r = 0; r < mt_size; r++) {
      counts[r] = gv_count(r, dt, scale);
      total += counts[r];
    }
    size_t mine = counts[mt_rank];
    uint8_t *send = malloc(mine * es + 1), *recv = malloc(total * es + 1);
    fill(send, mine * es, mt_rank, -1);
    memset(recv, 0xee, total * es + 1);
    char name[64];
    snprintf(name, sizeof(name), "gv/%s/%d", tag, dt);
    MT_OK(hora_allgatherv(name, send, mine, (hora_dtype)dt, recv, counts, NULL));
    size_t at = 0;
    for (int r = 0; r < mt_size; r++) {
      long bad = check(recv + at, counts[r] * es, r, -1);
      MT_CHECK(bad < 0, "%s %s: byte %ld of rank %d's block", name, hora_dtype_name(dt), bad, r);
      at += counts[r] * es;
    }
    MT_CHECK(recv[total * es] == 0xee, "%s: wrote past the result", name);
    free(send);
    free(recv);
    free(counts);
  }
}

static void allgatherv_every_dtype(void) {
  allgatherv_with(1, "small");
  allgatherv_with(70001, "large"); /* blocks of several chunks and shm rounds */
}

static void allgatherv_alloc(void) {
  for (int k = 0; k < 3; k++) {
    size_t mine = gv_count(mt_rank, k, 1000);
    uint8_t *send = malloc(mine * 4 + 1);
    fill(send, mine * 4, mt_rank, -1);
    hora_received got;
    hora_request *r = NULL;
    MT_OK(hora_allgatherv_alloc_async("gv/alloc", send, mine, HORA_FLOAT32, &got, NULL, &r));
    MT_OK(hora_wait(&r));
    MT_CHECK(got.size == mt_size && got.counts, "size %d", got.size);
    size_t at = 0;
    for (int q = 0; q < mt_size && got.counts; q++) {
      MT_CHECK(got.counts[q] == gv_count(q, k, 1000), "count of rank %d: %zu", q, got.counts[q]);
      MT_CHECK(check((uint8_t *)got.buf + at, got.counts[q] * 4, q, -1) < 0, "rank %d's block", q);
      at += got.counts[q] * 4;
    }
    MT_CHECK(got.total * 4 == at, "total %zu", got.total);
    hora_received_free(&got);
    MT_CHECK(!got.buf && !got.counts, "hora_received_free zeroes it");
    free(send);
  }
  /* Nobody sends anything. */
  hora_received none;
  hora_request *r = NULL;
  MT_OK(hora_allgatherv_alloc_async("gv/none", NULL, 0, HORA_INT8, &none, NULL, &r));
  MT_OK(hora_wait(&r));
  MT_CHECK(none.total == 0 && none.counts && none.counts[mt_size - 1] == 0, "empty result");
  hora_received_free(&none);
}

static void allgatherv_mismatch(void) {
  size_t *counts = calloc((size_t)mt_size, sizeof(size_t)), total = 0;
  for (int r = 0; r < mt_size; r++) {
    counts[r] = (size_t)r + 1;
    total += counts[r];
  }
  int32_t *send = calloc((size_t)mt_rank + 1, 4), *recv = malloc((total + 1) * 4);
  memset(recv, 0x5a, (total + 1) * 4);
  int wrong = mt_size - 1; /* that rank expects one element too many from rank 0 */
  if (mt_rank == wrong) {
    counts[0]++;
  }
  char want[64];
  snprintf(want, sizeof(want), "rank %d expects other recv_counts", wrong);
  MT_FAILS(hora_allgatherv("gv/mismatch", send, (size_t)mt_rank + 1, HORA_INT32, recv, counts,
                           NULL),
           HORA_ERR_MISMATCH, want);
  MT_CHECK(((uint32_t *)recv)[0] == 0x5a5a5a5a, "a failed allgatherv wrote its result");
  /* The job goes on. */
  int32_t one = 1, sum = 0;
  MT_OK(hora_allreduce("gv/after", &one, &sum, 1, HORA_INT32, HORA_SUM));
  MT_CHECK(sum == mt_size, "allreduce after: %d", sum);
  free(send);
  free(recv);
  free(counts);
}

/* Elements rank `from` sends rank `to` in round k (some 0). */
static size_t a2a_count(int from, int to, int k, size_t scale) {
  return ((size_t)(from * 5 + to * 3 + k) % 4) * scale;
}

static void alltoall_with(size_t scale, const char *tag) {
  for (int dt = 0; dt <= HORA_BOOL; dt++) {
    size_t es = hora_dtype_size((hora_dtype)dt);
    size_t *sc = calloc((size_t)mt_size, sizeof(size_t)), *rc = calloc((size_t)mt_size, sizeof(size_t));
    size_t stotal = 0, rtotal = 0;
    for (int j = 0; j < mt_size; j++) {
      sc[j] = a2a_count(mt_rank, j, dt, scale);
      rc[j] = a2a_count(j, mt_rank, dt, scale);
      stotal += sc[j];
      rtotal += rc[j];
    }
    uint8_t *send = malloc(stotal * es + 1), *recv = malloc(rtotal * es + 1);
    size_t at = 0;
    for (int j = 0; j < mt_size; j++) {
      fill(send + at, sc[j] * es, mt_rank, j);
      at += sc[j] * es;
    }
    memset(recv, 0xee, rtotal * es + 1);
    char name[64];
    snprintf(name, sizeof(name), "a2a/%s/%d", tag, dt);
    MT_OK(hora_alltoall(name, send, sc, recv, rc, (hora_dtype)dt));
    at = 0;
    for (int j = 0; j < mt_size; j++) {
      long bad = check(recv + at, rc[j] * es, j, mt_rank);
      MT_CHECK(bad < 0, "%s %s: byte %ld from rank %d", name, hora_dtype_name(dt), bad, j);
      at += rc[j] * es;
    }
    MT_CHECK(recv[rtotal * es] == 0xee, "%s: wrote past the result", name);
    free(send);
    free(recv);
    free(sc);
    free(rc);
  }
}

static void alltoall_uneven(void) {
  hora_stats before = {.struct_size = sizeof(before)}, after = {.struct_size = sizeof(after)};
  MT_OK(hora_get_stats(&before));
  alltoall_with(1, "small");
  alltoall_with(90001, "large");
  MT_OK(hora_get_stats(&after));
  /* Forced single copy on one host: the kernel moved the blocks. */
  const char *sc = getenv("HORA_SHM_SINGLE_COPY"), *tp = getenv("HORA_TRANSPORT");
  if (sc && !strcmp(sc, "1") && !(tp && !strcmp(tp, "tcp")) && mt_size > 1 &&
      hora_local_size() == mt_size) {
    MT_CHECK(after.kernel_bytes > before.kernel_bytes, "no byte went through the kernel");
  }
}

static void alltoall_equal_and_alloc(void) {
  size_t per = 1000, n = per * (size_t)mt_size;
  int32_t *send = malloc(n * 4), *recv = malloc(n * 4);
  for (int j = 0; j < mt_size; j++) {
    for (size_t i = 0; i < per; i++) {
      send[(size_t)j * per + i] = mt_rank * 100000 + j * 1000 + (int32_t)i % 1000;
    }
  }
  hora_request *r = NULL;
  /* The equal split of a count, and the receive side implied. */
  MT_OK(hora_alltoall_async_ex("a2a/equal", send, n, NULL, recv, NULL, HORA_INT32, NULL, &r));
  MT_OK(hora_wait(&r));
  int bad = 0;
  for (int j = 0; j < mt_size; j++) {
    for (size_t i = 0; i < per; i++) {
      bad += recv[(size_t)j * per + i] != j * 100000 + mt_rank * 1000 + (int32_t)i % 1000;
    }
  }
  MT_CHECK(bad == 0, "equal split: %d wrong elements", bad);
  /* Symmetric: send_counts NULL sends what recv_counts says. */
  size_t *rc = malloc((size_t)mt_size * sizeof(size_t));
  for (int j = 0; j < mt_size; j++) {
    rc[j] = per;
  }
  memset(recv, 0, n * 4);
  MT_OK(hora_alltoall("a2a/symmetric", send, NULL, recv, rc, HORA_INT32));
  MT_CHECK(recv[0] == mt_rank * 1000 && recv[n - 1] == (mt_size - 1) * 100000 + mt_rank * 1000 + 999,
           "symmetric: %d .. %d", recv[0], recv[n - 1]);
  /* Allocated, with the counts it received. */
  size_t *sc = malloc((size_t)mt_size * sizeof(size_t)), total = 0;
  for (int j = 0; j < mt_size; j++) {
    sc[j] = (size_t)(mt_rank + j) % 3;
    total += sc[j];
  }
  hora_received got;
  MT_OK(hora_alltoall_alloc_async("a2a/alloc", send, total, sc, HORA_INT32, &got, NULL, &r));
  MT_OK(hora_wait(&r));
  size_t expect = 0;
  for (int j = 0; j < mt_size && got.counts; j++) {
    MT_CHECK(got.counts[j] == (size_t)(j + mt_rank) % 3, "from rank %d: %zu", j, got.counts[j]);
    expect += (size_t)(j + mt_rank) % 3;
  }
  MT_CHECK(got.total == expect && got.size == mt_size, "total %zu, expected %zu", got.total, expect);
  hora_stats st = {.struct_size = sizeof(st)};
  MT_OK(hora_get_stats(&st));
  MT_CHECK(st.alltoalls >= 3, "stats count %llu alltoalls", (unsigned long long)st.alltoalls);
  hora_received_free(&got);
  free(send);
  free(recv);
  free(rc);
  free(sc);
}

static void alltoall_mismatch_and_errors(void) {
  size_t *sc = malloc((size_t)mt_size * sizeof(size_t)), *rc = malloc((size_t)mt_size * sizeof(size_t));
  for (int j = 0; j < mt_size; j++) {
    sc[j] = rc[j] = 2;
  }
  int wrong = mt_size / 2;
  if (mt_rank == wrong) {
    rc[mt_size - 1] = 3;
  }
  int64_t send[2 * 16 + 2] = {0}, recv[3 * 16 + 2];
  memset(recv, 0x33, sizeof(recv));
  char want[64];
  snprintf(want, sizeof(want), "rank %d expects other recv_counts", wrong);
  if (mt_size <= 16) {
    MT_FAILS(hora_alltoall("a2a/mismatch", send, sc, recv, rc, HORA_INT64), HORA_ERR_MISMATCH,
             want);
    MT_CHECK(((uint64_t *)recv)[0] == 0x3333333333333333ull, "a failed alltoall wrote");
  }
  hora_request *r = NULL;
  MT_FAILS(hora_alltoall_async("a2a/bad", send, NULL, recv, NULL, HORA_INT64, &r),
           HORA_ERR_INVALID_ARG, "send_counts and recv_counts are both NULL");
  MT_FAILS(hora_alltoall_async_ex("a2a/bad", send, 2 * (size_t)mt_size + 1, sc, recv, rc,
                                  HORA_INT64, NULL, &r),
           HORA_ERR_INVALID_ARG, "add up to");
  if (mt_size > 1) {
    MT_FAILS(hora_alltoall_async_ex("a2a/bad", send, (size_t)mt_size + 1, NULL, recv, NULL,
                                    HORA_INT64, NULL, &r),
             HORA_ERR_INVALID_ARG, "do not split equally");
  }
  MT_FAILS(hora_allgatherv_async("gv/bad", send, 1, HORA_INT64, recv, NULL, NULL, &r),
           HORA_ERR_INVALID_ARG, "recv_counts is NULL");
  MT_FAILS(hora_allgatherv_alloc_async("gv/bad", send, 1, HORA_INT64, NULL, NULL, &r),
           HORA_ERR_INVALID_ARG, "result is NULL");
  MT_FAILS(hora_allgatherv_async("gv/bad", send, 1, (hora_dtype)99, recv, rc, NULL, &r),
           HORA_ERR_INVALID_ARG, "unknown dtype");
  /* Shapes: whole rows to each rank, and the other dimensions agreeing. */
  int64_t dims[2] = {2 * mt_size, 3};
  hora_op_options o = HORA_OP_OPTIONS_INIT;
  o.ndims = 2;
  o.dims = dims;
  for (int j = 0; j < mt_size; j++) {
    sc[j] = 6;
  }
  float *fs = calloc((size_t)(6 * mt_size), sizeof(float));
  hora_received got;
  if (mt_size > 1) {
    sc[0] = 4;
    sc[1] = 8;
    MT_FAILS(hora_alltoall_alloc_async("a2a/rows", fs, (size_t)(6 * mt_size), sc, HORA_FLOAT32,
                                       &got, &o, &r),
             HORA_ERR_INVALID_ARG, "whole number of rows");
  }
  int64_t gdims[2] = {1, mt_rank == 0 ? 4 : 3};
  o.dims = gdims;
  if (mt_size > 1) {
    MT_FAILS(hora_allgatherv_alloc_async("gv/shape", fs, (size_t)gdims[1], HORA_FLOAT32, &got, &o,
                                         &r) == HORA_SUCCESS ? hora_wait(&r) : -1,
             HORA_ERR_MISMATCH, "shape");
  }
  free(fs);
  free(sc);
  free(rc);
}

/* hora_reducescatterv: explicit counts per rank (some 0), sums and maxima
 * checked element by element; ranks passing other counts all fail. */
static void reducescatterv_explicit_counts(void) {
  size_t *counts = calloc((size_t)mt_size, sizeof(size_t)), total = 0;
  for (int j = 0; j < mt_size; j++) {
    counts[j] = (size_t)(j * 3 + 1) % 4 * 1000;
    total += counts[j];
  }
  int32_t *in = malloc(total * 4 + 4), *out = malloc(counts[mt_rank] * 4 + 4);
  for (size_t i = 0; i < total; i++) {
    in[i] = (int32_t)((mt_rank * 7 + i * 3) % 11);
  }
  size_t start = 0;
  for (int j = 0; j < mt_rank; j++) {
    start += counts[j];
  }
  for (int op = HORA_SUM; op <= HORA_MAX; op += 3) { /* SUM and MAX */
    MT_OK(hora_reducescatterv("rsv", in, out, counts, HORA_INT32, (hora_op)op, NULL));
    int bad = 0;
    for (size_t i = 0; i < counts[mt_rank]; i++) {
      int32_t want = op == HORA_SUM ? 0 : -1;
      for (int q = 0; q < mt_size; q++) {
        int32_t v = (int32_t)((q * 7 + (start + i) * 3) % 11);
        want = op == HORA_SUM ? want + v : (v > want ? v : want);
      }
      bad += out[i] != want;
    }
    MT_CHECK(bad == 0, "reducescatterv %s: %d wrong of %zu", hora_op_name((hora_op)op), bad,
             counts[mt_rank]);
  }
  if (mt_size > 1) {
    size_t *other = calloc((size_t)mt_size, sizeof(size_t));
    memcpy(other, counts, (size_t)mt_size * sizeof(size_t));
    if (mt_rank == 1) {
      other[0] += 1; /* the same total, split otherwise */
      other[mt_size - 1] -= other[mt_size - 1] ? 1 : 0;
      if (other[0] + 0 == counts[0] + 1 && counts[mt_size - 1] == 0) {
        other[1] -= other[1] ? 1 : 0;
      }
    }
    hora_request *r = NULL;
    int rc = hora_reducescatterv_async("rsv/other", in, out, other, HORA_INT32, HORA_SUM, NULL, &r);
    if (rc == HORA_SUCCESS) {
      rc = hora_wait(&r);
    }
    MT_CHECK(rc == HORA_ERR_MISMATCH, "other counts gave %s", hora_strerror(rc));
    MT_CHECK(rc != HORA_ERR_MISMATCH || mt_contains(hora_last_error(), "recv_counts") ||
                 mt_contains(hora_last_error(), "elements"),
             "message: %s", hora_last_error());
    free(other);
  }
  MT_FAILS(hora_reducescatterv_async("rsv/bad", in, out, NULL, HORA_INT32, HORA_SUM, NULL, NULL),
           HORA_ERR_INVALID_ARG, "recv_counts is NULL");
  free(in);
  free(out);
  free(counts);
}

/* MPI_IN_PLACE's cases: an alltoall from and into one buffer (the same
 * counts both ways), an allgatherv whose input is this rank's block of
 * the output; large enough for every path. */
static void in_place(void) {
  for (int k = 0; k < 2; k++) {
    size_t per = k ? 50000 : 3, n = per * (size_t)mt_size;
    int32_t *buf = malloc(n * 4);
    size_t *counts = malloc((size_t)mt_size * sizeof(size_t));
    for (int j = 0; j < mt_size; j++) {
      counts[j] = per;
      for (size_t i = 0; i < per; i++) {
        buf[(size_t)j * per + i] = mt_rank * 1000 + j * 10 + (int32_t)(i % 10);
      }
    }
    MT_OK(hora_alltoall("inplace/a2a", buf, NULL, buf, counts, HORA_INT32));
    int bad = 0;
    for (int j = 0; j < mt_size; j++) {
      for (size_t i = 0; i < per; i++) {
        bad += buf[(size_t)j * per + i] != j * 1000 + mt_rank * 10 + (int32_t)(i % 10);
      }
    }
    MT_CHECK(bad == 0, "alltoall in place (%zu per rank): %d wrong", per, bad);
    for (size_t i = 0; i < per; i++) {
      buf[(size_t)mt_rank * per + i] = mt_rank + (int32_t)i;
    }
    MT_OK(hora_allgatherv("inplace/gv", buf + (size_t)mt_rank * per, per, HORA_INT32, buf, counts,
                          NULL));
    bad = 0;
    for (int j = 0; j < mt_size; j++) {
      for (size_t i = 0; i < per; i++) {
        bad += buf[(size_t)j * per + i] != j + (int32_t)i;
      }
    }
    MT_CHECK(bad == 0, "allgatherv in place (%zu per rank): %d wrong", per, bad);
    free(buf);
    free(counts);
  }
}

/* Several of each in flight at once, submitted in a different order on
 * each rank, the same names again and again with new counts each time. */
static void names_in_any_order_and_cached(void) {
  enum { N = 6, ROUNDS = 12 };
  for (int round = 0; round < ROUNDS; round++) {
    hora_request *reqs[N];
    hora_received got[N];
    int32_t *bufs[N];
    for (int k = 0; k < N; k++) {
      int t = (k + mt_rank * 5 + round) % N; /* this rank's k-th submission */
      size_t n = (size_t)((mt_rank + t + round) % 4) * 3;
      bufs[t] = malloc(n * 4 * (size_t)mt_size + 4);
      for (size_t i = 0; i < n * (size_t)mt_size; i++) {
        bufs[t][i] = mt_rank * 1000 + t * 100 + (int32_t)(i % 100);
      }
      char name[32];
      snprintf(name, sizeof(name), "%s/%d", t % 2 ? "gv" : "a2a", t);
      if (t % 2) {
        MT_OK(hora_allgatherv_alloc_async(name, bufs[t], n, HORA_INT32, &got[t], NULL, &reqs[t]));
      } else {
        MT_OK(hora_alltoall_alloc_async(name, bufs[t], n * (size_t)mt_size, NULL, HORA_INT32,
                                        &got[t], NULL, &reqs[t]));
      }
    }
    for (int t = 0; t < N; t++) {
      MT_OK(hora_wait(&reqs[t]));
      size_t at = 0;
      for (int q = 0; q < mt_size && got[t].counts; q++) {
        size_t n = (size_t)((q + t + round) % 4) * 3;
        MT_CHECK(got[t].counts[q] == n, "round %d op %d: %zu from rank %d, expected %zu", round,
                 t, got[t].counts[q], q, n);
        const int32_t *v = (const int32_t *)got[t].buf + at;
        for (size_t i = 0; i < got[t].counts[q] && got[t].counts[q] == n; i++) {
          size_t src = t % 2 ? i : (size_t)mt_rank * n + i;
          if (v[i] != q * 1000 + t * 100 + (int32_t)(src % 100)) {
            MT_CHECK(false, "round %d op %d: element %zu from rank %d is %d", round, t, i, q, v[i]);
            break;
          }
        }
        at += got[t].counts[q];
      }
      hora_received_free(&got[t]);
      free(bufs[t]);
    }
  }
  hora_stats st = {.struct_size = sizeof(st)};
  MT_OK(hora_get_stats(&st));
  const char *cap = getenv("HORA_CACHE_CAPACITY");
  MT_CHECK(mt_size == 1 || (cap && strcmp(cap, "0") == 0) || st.cache_hits > 0,
           "new counts each round should still hit the cache");
}

/* Rank r runs r + 1 steps, then joins: in step s the ranks with r < s have
 * joined, send nothing and receive nothing, and the others' allgathervs,
 * alltoalls and allgathers run. */
static void during_join(void) {
  for (int s = 0; s <= mt_rank; s++) {
    size_t n = 4;
    int32_t send[4 * 16];
    for (int j = 0; j < 4 * mt_size && j < 64; j++) {
      send[j] = mt_rank * 100 + j;
    }
    hora_received got;
    hora_request *r = NULL;
    MT_OK(hora_allgatherv_alloc_async("join/gv", send, n, HORA_INT32, &got, NULL, &r));
    MT_OK(hora_wait(&r));
    for (int q = 0; q < mt_size && got.counts; q++) {
      size_t want = q >= s ? n : 0;
      MT_CHECK(got.counts[q] == want, "step %d: allgatherv got %zu from rank %d, expected %zu", s,
               got.counts[q], q, want);
    }
    hora_received_free(&got);
    if (mt_size <= 16) {
      MT_OK(hora_alltoall_alloc_async("join/a2a", send, n * (size_t)mt_size, NULL, HORA_INT32,
                                      &got, NULL, &r));
      MT_OK(hora_wait(&r));
      size_t at = 0;
      for (int q = 0; q < mt_size && got.counts; q++) {
        size_t want = q >= s ? n : 0;
        MT_CHECK(got.counts[q] == want, "step %d: alltoall got %zu from rank %d", s, got.counts[q],
                 q);
        if (want && got.counts[q] == want) {
          int32_t first = ((int32_t *)got.buf)[at];
          MT_CHECK(first == q * 100 + mt_rank * (int32_t)n, "step %d: from rank %d: %d", s, q, first);
        }
        at += got.counts[q];
      }
      hora_received_free(&got);
    }
    /* A reducescatterv: joined ranks add zeros and keep nothing. */
    size_t rc_counts[16];
    int32_t rs_in[32], rs_out[2] = {0, 0};
    for (int q = 0; q < mt_size && q < 16; q++) {
      rc_counts[q] = 2;
    }
    for (int i = 0; i < 2 * mt_size && i < 32; i++) {
      rs_in[i] = 1;
    }
    if (mt_size <= 16) {
      MT_OK(hora_reducescatterv("join/rsv", rs_in, rs_out, rc_counts, HORA_INT32, HORA_SUM, NULL));
      MT_CHECK(rs_out[0] == mt_size - s && rs_out[1] == mt_size - s,
               "step %d: reducescatterv %d %d, expected %d", s, rs_out[0], rs_out[1], mt_size - s);
    }
    /* A plain allgather: joined ranks' blocks are zeros. */
    int32_t one = mt_rank + 1, all[16];
    if (mt_size <= 16) {
      MT_OK(hora_allgather("join/ag", &one, 1, HORA_INT32, all));
      for (int q = 0; q < mt_size; q++) {
        MT_CHECK(all[q] == (q >= s ? q + 1 : 0), "step %d: allgather block %d is %d", s, q, all[q]);
      }
    }
  }
  int last = -1;
  MT_OK(hora_join(&last));
  MT_CHECK(last == mt_size - 1, "last joined %d", last);
}

static void within_a_process_set(void) {
  int members[16], n = 0;
  for (int r = 1; r < mt_size && n < 16; r += 2) {
    members[n++] = r;
  }
  hora_process_set *ps = NULL;
  MT_OK(hora_process_set_create(members, n, &ps));
  if (hora_process_set_included(ps)) {
    int me = hora_process_set_rank(ps);
    hora_op_options o = HORA_OP_OPTIONS_INIT;
    o.process_set = ps;
    int32_t send[16];
    for (int j = 0; j < n; j++) {
      send[j] = me * 10 + j;
    }
    hora_received got;
    hora_request *r = NULL;
    MT_OK(hora_alltoall_alloc_async("ps/a2a", send, (size_t)n, NULL, HORA_INT32, &got, &o, &r));
    MT_OK(hora_wait(&r));
    MT_CHECK(got.size == n && got.total == (size_t)n, "set alltoall: %d ranks, %zu elements",
             got.size, got.total);
    for (int j = 0; j < n && got.buf; j++) {
      MT_CHECK(((int32_t *)got.buf)[j] == j * 10 + me, "from set rank %d: %d", j,
               ((int32_t *)got.buf)[j]);
    }
    hora_received_free(&got);
    MT_OK(hora_allgatherv_alloc_async("ps/gv", send, (size_t)me, HORA_INT32, &got, &o, &r));
    MT_OK(hora_wait(&r));
    MT_CHECK(got.total == (size_t)(n * (n - 1) / 2), "set allgatherv total %zu", got.total);
    hora_received_free(&got);
  }
  MT_OK(hora_process_set_destroy(ps));
}

int main(int argc, char **argv) {
  mt_setenv_args(argc, argv);
  mt_init();
  mt_run("exchange/allgatherv_every_dtype", allgatherv_every_dtype);
  mt_run("exchange/allgatherv_alloc", allgatherv_alloc);
  mt_run("exchange/allgatherv_mismatch", allgatherv_mismatch);
  mt_run("exchange/alltoall_uneven", alltoall_uneven);
  mt_run("exchange/alltoall_equal_and_alloc", alltoall_equal_and_alloc);
  mt_run("exchange/alltoall_mismatch_and_errors", alltoall_mismatch_and_errors);
  mt_run("exchange/reducescatterv_explicit_counts", reducescatterv_explicit_counts);
  mt_run("exchange/in_place", in_place);
  mt_run("exchange/names_in_any_order_and_cached", names_in_any_order_and_cached);
  if (mt_size >= 3) {
    mt_run("exchange/within_a_process_set", within_a_process_set);
  } else {
    mt_skip("exchange/within_a_process_set", "needs 3 ranks");
  }
  mt_run("exchange/during_join", during_join);
  int failures = mt_total_failures();
  int rc = hora_finalize();
  if (rc != HORA_SUCCESS) {
    fprintf(stderr, "hora_finalize: %s\n", hora_last_error());
    return 1;
  }
  return failures ? 1 : 0;
}
