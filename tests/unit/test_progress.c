/* The progress engine (progress.c) over the in-process mock transport
 * (mock.c): transfers complete in order and in pieces, a receive must meet
 * a send of its length, a broken link fails both ends naming the peer,
 * hora__progress_wait sleeps in poll() while the service hook keeps
 * running, a failing hook ends the wait, and a stall times out. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "comm/transport/mock.h"
#include "comm/transport/net.h"
#include "../runner.h"

#define MS 1000000ull

static void net_init(hora__net *net, int rank, int size) {
  memset(net, 0, sizeof(*net));
  net->rank = rank;
  net->size = size;
  net->spin_us = 0;          /* two shared cores: never spin */
  net->stall_ns = 5000 * MS; /* a bug fails the test instead of hanging it */
}

static struct hora__peer_info peers[2] = {
    {.host = "host-a", .pid = 1111},
    {.host = "host-b", .pid = 2222},
};

static void fill(char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) {
    p[i] = (char)(seed * 131u + i * 7u + (i >> 8));
  }
}

static bool filled(const char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) {
    if (p[i] != (char)(seed * 131u + i * 7u + (i >> 8))) {
      return false;
    }
  }
  return true;
}

static void close_end(hora__conn **c) {
  if (*c) {
    (*c)->tp->close(*c);
    *c = NULL;
  }
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* One engine drives both ends of a pair that moves at most 7 bytes per
 * call and direction. Transfers of 0, 1, 1000 and 65536 bytes, all queued
 * before anything moves, in one order one way and the reverse the other. */
TEST(progress_moves_queued_transfers_in_order_and_in_pieces) {
  enum { K = 4 };
  static const size_t sizes[K] = {0, 1, 1000, 65536};
  hora__conn *end[2] = {NULL, NULL}; /* end[0]: rank 0's, end[1]: rank 1's */
  ASSERT_EQ_INT(hora__mock_pair(0, 1, 7, &end[0], &end[1]), HORA_SUCCESS);
  hora__net net;
  net_init(&net, 0, 2);
  char *src[2][K], *dst[2][K];
  size_t len[2][K];
  hora__xfer sx[2][K], rx[2][K];
  hora__xfer *all[4 * K];
  int nall = 0, rc_post = HORA_SUCCESS;
  for (int d = 0; d < 2; d++) { /* d: the sending rank */
    for (int k = 0; k < K; k++) {
      len[d][k] = sizes[d == 0 ? k : K - 1 - k];
      src[d][k] = malloc(len[d][k] + 1);
      dst[d][k] = malloc(len[d][k] + 1);
      fill(src[d][k], len[d][k], (unsigned)(d * K + k + 1));
      memset(dst[d][k], 0x55, len[d][k] + 1);
    }
  }
  for (int d = 0; d < 2; d++) {
    for (int k = 0; k < K && rc_post == HORA_SUCCESS; k++) {
      rc_post = hora__isend(&net, end[d], src[d][k], len[d][k], &sx[d][k]);
      if (rc_post == HORA_SUCCESS) {
        rc_post = hora__irecv(&net, end[1 - d], dst[d][k], len[d][k], &rx[d][k]);
      }
      all[nall++] = &sx[d][k];
      all[nall++] = &rx[d][k];
    }
  }
  /* Zero bytes are done at once; one pass then moves 7 bytes each way. */
  bool zero_done = rx[0][0].done && sx[0][0].done && rx[1][K - 1].done && sx[1][K - 1].done;
  bool progressed = false;
  int rc_pass = rc_post == HORA_SUCCESS ? hora__progress(&net, &progressed) : rc_post;
  bool one_done = rx[0][1].done;
  size_t left_1000 = rx[0][2].left, left_65536 = rx[1][0].left;
  int rc_wait = rc_pass == HORA_SUCCESS ? hora__wait_all(&net, all, nall) : rc_pass;
  bool all_done = true, bytes_right = true;
  for (int d = 0; d < 2; d++) {
    for (int k = 0; k < K; k++) {
      all_done = all_done && sx[d][k].done && rx[d][k].done;
      bytes_right = bytes_right && filled(dst[d][k], len[d][k], (unsigned)(d * K + k + 1)) &&
                    dst[d][k][len[d][k]] == 0x55;
      free(src[d][k]);
      free(dst[d][k]);
    }
  }
  bool idle = net.active == NULL;
  close_end(&end[0]);
  close_end(&end[1]);
  ASSERT_EQ_INT(rc_post, HORA_SUCCESS);
  ASSERT(zero_done);
  ASSERT_EQ_INT(rc_pass, HORA_SUCCESS);
  ASSERT(progressed);
  ASSERT(one_done);
  ASSERT_EQ_INT(left_1000, 1000 - 6);
  ASSERT_EQ_INT(left_65536, 65536 - 7);
  ASSERT_EQ_INT(rc_wait, HORA_SUCCESS);
  ASSERT(all_done);
  ASSERT(bytes_right);
  ASSERT(idle); /* nothing queued: the engine has no busy connection left */
}

/* The vtable's contract: a receive of n bytes meets the send of n bytes. */
TEST(progress_refuses_a_receive_of_another_length) {
  hora__conn *a = NULL, *b = NULL;
  ASSERT_EQ_INT(hora__mock_pair(0, 1, 0, &a, &b), HORA_SUCCESS);
  hora__net net;
  net_init(&net, 1, 2);
  char out[10] = {0}, in[12];
  hora__xfer sx, rx, *xs[] = {&rx};
  int rc = hora__isend(&net, a, out, sizeof(out), &sx);
  if (rc == HORA_SUCCESS) {
    rc = hora__irecv(&net, b, in, sizeof(in), &rx);
  }
  if (rc == HORA_SUCCESS) {
    rc = hora__wait_all(&net, xs, 1);
  }
  char msg[256];
  snprintf(msg, sizeof(msg), "%s", hora__error_message());
  close_end(&a);
  close_end(&b);
  ASSERT_EQ_INT(rc, HORA_ERR_PROTOCOL);
  ASSERT_STR_CONTAINS(msg, "a receive of 12 bytes from rank 0 met a send of 10");
}

/* A link broken in the middle of a transfer fails both ends, each naming
 * its peer the way hora__peer_name does when the job's peers are known. */
TEST(progress_fails_both_ends_of_a_broken_link) {
  hora__conn *a = NULL, *b = NULL;
  ASSERT_EQ_INT(hora__mock_pair(0, 1, 7, &a, &b), HORA_SUCCESS);
  hora__net net0, net1; /* each rank its own engine, driven in turn */
  net_init(&net0, 0, 2);
  net_init(&net1, 1, 2);
  net0.peers = net1.peers = peers;
  char out[1000], in[1000];
  fill(out, sizeof(out), 3);
  hora__xfer sx, rx, *sxs[] = {&sx}, *rxs[] = {&rx};
  int rc = hora__isend(&net0, a, out, sizeof(out), &sx);
  if (rc == HORA_SUCCESS) {
    rc = hora__irecv(&net1, b, in, sizeof(in), &rx);
  }
  bool progressed = false;
  if (rc == HORA_SUCCESS) {
    rc = hora__progress(&net1, &progressed); /* 7 of the 1000 bytes */
  }
  size_t moved = sizeof(in) - rx.left;
  hora__mock_break(a);
  int rc0 = rc == HORA_SUCCESS ? hora__wait_all(&net0, sxs, 1) : rc;
  char msg0[256], msg1[256];
  snprintf(msg0, sizeof(msg0), "%s", hora__error_message());
  int rc1 = rc == HORA_SUCCESS ? hora__wait_all(&net1, rxs, 1) : rc;
  snprintf(msg1, sizeof(msg1), "%s", hora__error_message());
  close_end(&a);
  close_end(&b);
  ASSERT_EQ_INT(rc, HORA_SUCCESS);
  ASSERT_EQ_INT(moved, 7);
  ASSERT_EQ_INT(rc0, HORA_ERR_PEER_LOST);
  ASSERT_STR_CONTAINS(msg0, "lost rank 1 (host host-b, pid 2222)");
  ASSERT_EQ_INT(rc1, HORA_ERR_PEER_LOST);
  ASSERT_STR_CONTAINS(msg1, "lost rank 0 (host host-a, pid 1111)");
}

/* A send the other end has taken in full is done, even when that end has
 * closed before the sender looked (a socket's send is done once the kernel
 * has the bytes); only transfers posted after the close fail. */
TEST(mock_send_taken_before_the_peer_closed_completes) {
  hora__conn *a = NULL, *b = NULL;
  ASSERT_EQ_INT(hora__mock_pair(0, 1, 0, &a, &b), HORA_SUCCESS);
  hora__net net0, net1;
  net_init(&net0, 0, 2);
  net_init(&net1, 1, 2);
  char out[100], in[100];
  fill(out, sizeof(out), 5);
  hora__xfer sx, rx, sx2, *sxs[] = {&sx}, *rxs[] = {&rx}, *sxs2[] = {&sx2};
  int rc = hora__isend(&net0, a, out, sizeof(out), &sx);
  if (rc == HORA_SUCCESS) {
    rc = hora__irecv(&net1, b, in, sizeof(in), &rx);
  }
  int rc_recv = rc == HORA_SUCCESS ? hora__wait_all(&net1, rxs, 1) : rc;
  bool got = rc_recv == HORA_SUCCESS && filled(in, sizeof(in), 5);
  close_end(&b);
  net1.active = NULL; /* b is gone */
  int rc_send = rc_recv == HORA_SUCCESS ? hora__wait_all(&net0, sxs, 1) : rc_recv;
  char msg[256];
  snprintf(msg, sizeof(msg), "%s", hora__error_message());
  int rc_late = hora__isend(&net0, a, out, sizeof(out), &sx2);
  if (rc_late == HORA_SUCCESS) {
    rc_late = hora__wait_all(&net0, sxs2, 1);
  }
  char msg_late[256];
  snprintf(msg_late, sizeof(msg_late), "%s", hora__error_message());
  close_end(&a);
  ASSERT_EQ_INT(rc_recv, HORA_SUCCESS);
  ASSERT(got);
  if (rc_send != HORA_SUCCESS) {
    FAIL("the delivered send failed: %s", msg);
  }
  ASSERT_EQ_INT(rc_late, HORA_ERR_PEER_LOST);
  ASSERT_STR_CONTAINS(msg_late, "lost rank 1");
}

/* The other end reads a send's bytes but never its hora__xfer: a rank that
 * gives up on its transfers (a failed collective returns with them in
 * flight, their descriptors on its stack) may reuse that memory at once,
 * while its neighbour's thread still drains the link. */
TEST(mock_peer_never_touches_the_senders_xfer) {
  hora__conn *a = NULL, *b = NULL;
  ASSERT_EQ_INT(hora__mock_pair(0, 1, 0, &a, &b), HORA_SUCCESS);
  hora__net net0, net1;
  net_init(&net0, 0, 2);
  net_init(&net1, 1, 2);
  char out[300], in[300];
  fill(out, sizeof(out), 9);
  hora__xfer sx, rx, *rxs[] = {&rx};
  int rc = hora__isend(&net0, a, out, sizeof(out), &sx);
  /* Rank 0 gives up: its descriptor's memory now holds something else. */
  memset(&sx, 0x5a, sizeof(sx));
  hora__xfer scribbled = sx;
  net0.active = NULL;
  if (rc == HORA_SUCCESS) {
    rc = hora__irecv(&net1, b, in, sizeof(in), &rx);
  }
  if (rc == HORA_SUCCESS) {
    rc = hora__wait_all(&net1, rxs, 1);
  }
  char msg[256];
  snprintf(msg, sizeof(msg), "%s", hora__error_message());
  bool untouched = memcmp(&sx, &scribbled, sizeof(sx)) == 0;
  close_end(&a);
  close_end(&b);
  if (rc != HORA_SUCCESS) {
    FAIL("the receive failed: %s", msg);
  }
  ASSERT(filled(in, sizeof(in), 9));
  ASSERT(untouched);
}

/* ---- sleeping, the service hook, stalls ----------------------------------- */

struct late_sender {
  hora__net net;
  hora__conn *end;
  const char *buf;
  size_t len;
  int delay_ms;
  uint64_t posted_ns;
  int rc;
};

static void *send_late(void *arg) {
  struct late_sender *s = arg;
  sleep_ms(s->delay_ms);
  hora__xfer x, *xs[] = {&x};
  s->posted_ns = hora__now_ns();
  s->rc = hora__isend(&s->net, s->end, s->buf, s->len, &x);
  if (s->rc == HORA_SUCCESS) {
    s->rc = hora__wait_all(&s->net, xs, 1);
  }
  return NULL;
}

struct service_count {
  int calls;
  int fail_at; /* 0: never */
};

static int count_service(void *arg) {
  struct service_count *c = arg;
  c->calls++;
  if (c->fail_at && c->calls >= c->fail_at) {
    return hora__error(HORA_ERR_ABORTED, "the service hook failed on call %d", c->calls);
  }
  return HORA_SUCCESS;
}

/* Rank 0 waits ~80 ms for a send posted late by another thread: it must
 * sleep in poll() (spin_us = 0: almost no CPU), and its service hook, due
 * every 5 ms, must keep running meanwhile (at least once per 20 ms here,
 * so that a loaded machine's late wake-ups do not fail the test). */
TEST(progress_wait_sleeps_and_runs_the_service) {
  hora__conn *a = NULL, *b = NULL;
  ASSERT_EQ_INT(hora__mock_pair(0, 1, 0, &a, &b), HORA_SUCCESS);
  char out[4096], in[4096];
  fill(out, sizeof(out), 11);
  struct late_sender s = {.end = b, .buf = out, .len = sizeof(out), .delay_ms = 80};
  net_init(&s.net, 1, 2);
  hora__net net;
  net_init(&net, 0, 2);
  struct service_count count = {0};
  net.service = count_service;
  net.service_arg = &count;
  net.service_interval_ns = 5 * MS;
  hora__xfer rx, *xs[] = {&rx};
  int rc = hora__irecv(&net, a, in, sizeof(in), &rx);
  uint64_t t0 = hora__now_ns(), cpu0 = thread_cpu_ns();
  pthread_t t;
  bool started = rc == HORA_SUCCESS && pthread_create(&t, NULL, send_late, &s) == 0;
  uint64_t done = 0;
  if (started) {
    rc = hora__wait_all(&net, xs, 1);
    done = hora__now_ns();
    pthread_join(t, NULL);
  }
  uint64_t waited = done - t0, cpu = thread_cpu_ns() - cpu0;
  close_end(&a);
  close_end(&b);
  ASSERT(started);
  ASSERT_EQ_INT(rc, HORA_SUCCESS);
  ASSERT_EQ_INT(s.rc, HORA_SUCCESS);
  ASSERT(filled(in, sizeof(in), 11));
  if (done < s.posted_ns || waited < 80 * MS) {
    FAIL("the receive was done after %.1f ms, before the send was posted", (double)waited / MS);
  }
  if (cpu > waited / 2) {
    FAIL("the waiting thread spun: %.1f ms of CPU in %.1f ms", (double)cpu / MS,
         (double)waited / MS);
  }
  if ((uint64_t)count.calls * 20 * MS < waited) {
    FAIL("the service hook ran %d times in %.1f ms (due every 5 ms)", count.calls,
         (double)waited / MS);
  }
}

/* A service hook that fails ends the wait with its error. */
TEST(progress_wait_ends_with_the_service_error) {
  hora__conn *a = NULL, *b = NULL;
  ASSERT_EQ_INT(hora__mock_pair(0, 1, 0, &a, &b), HORA_SUCCESS);
  hora__net net;
  net_init(&net, 0, 2);
  struct service_count count = {.fail_at = 3};
  net.service = count_service;
  net.service_arg = &count;
  net.service_interval_ns = 5 * MS;
  char in[64];
  hora__xfer rx, *xs[] = {&rx};
  int rc = hora__irecv(&net, a, in, sizeof(in), &rx); /* nobody sends */
  uint64_t t0 = hora__now_ns();
  if (rc == HORA_SUCCESS) {
    rc = hora__wait_all(&net, xs, 1);
  }
  uint64_t waited = hora__now_ns() - t0;
  char msg[256];
  snprintf(msg, sizeof(msg), "%s", hora__error_message());
  close_end(&a);
  close_end(&b);
  ASSERT_EQ_INT(rc, HORA_ERR_ABORTED);
  ASSERT_STR_CONTAINS(msg, "the service hook failed on call 3");
  ASSERT_EQ_INT(count.calls, 3);
  ASSERT(waited >= 8 * MS && waited < 500 * MS); /* calls at 0, 5 and 10 ms */
}

/* A receive nobody matches: with stall_ns set, the wait fails with
 * HORA_ERR_TIMEOUT naming the peer. Without a service hook the engine
 * sleeps up to a second per poll, so the stall shows within about one;
 * with a hook due every 5 ms, soon after the stall time. */
TEST(progress_wait_times_out_a_stall_naming_the_peer) {
  hora__conn *a = NULL, *b = NULL;
  ASSERT_EQ_INT(hora__mock_pair(0, 1, 0, &a, &b), HORA_SUCCESS);
  hora__net net;
  net_init(&net, 0, 2);
  net.peers = peers;
  net.stall_ns = 100 * MS;
  char in[2][64];
  hora__xfer rx[2];
  int rc[2];
  uint64_t waited[2];
  char msg[2][256];
  struct service_count count = {0};
  for (int i = 0; i < 2; i++) {
    if (i == 1) {
      net.service = count_service;
      net.service_arg = &count;
      net.service_interval_ns = 5 * MS;
    }
    hora__xfer *xs[] = {&rx[i]};
    rc[i] = hora__irecv(&net, a, in[i], sizeof(in[i]), &rx[i]);
    uint64_t t0 = hora__now_ns();
    if (rc[i] == HORA_SUCCESS) {
      rc[i] = hora__wait_all(&net, xs, 1);
    }
    waited[i] = hora__now_ns() - t0;
    snprintf(msg[i], sizeof(msg[i]), "%s", hora__error_message());
    /* The receive stays queued; the second round's waits behind it. */
  }
  close_end(&a);
  close_end(&b);
  for (int i = 0; i < 2; i++) {
    ASSERT_EQ_INT(rc[i], HORA_ERR_TIMEOUT);
    ASSERT_STR_CONTAINS(msg[i], "a collective stalled");
    ASSERT_STR_CONTAINS(msg[i], "waiting for rank 1 (host host-b, pid 2222)");
    if (waited[i] < 100 * MS || waited[i] > (i == 0 ? 1500 : 400) * MS) {
      FAIL("round %d: the stall of 100 ms failed after %.0f ms", i, (double)waited[i] / MS);
    }
  }
  ASSERT(count.calls >= 10);
}
