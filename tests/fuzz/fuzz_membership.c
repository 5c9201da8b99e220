/* The elastic agreement's state machine (comm/bootstrap/membership_fsm.h)
 * under libFuzzer: four real machines whose frames the input schedules,
 * byte by byte (deliver the oldest, or any, drop, duplicate, flip a byte,
 * tick a clock, start a reset, tell one another is unreachable), so that
 * coverage guides the search through schedules and damaged frames alike.
 * After every step: no two machines hold different views of one epoch, a
 * machine's epoch never goes down, and its view always names it (once a
 * damaged frame was delivered, only the last two: members' frames travel
 * over TCP and keyed connections, so only a stranger's can be garbage,
 * and garbage must not crash them). */
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#include "comm/bootstrap/membership_fsm.h"

#define N 4
#define QMAX 256
#define EPOCHS 64

struct msg {
  int to;
  uint32_t src_ip;
  uint8_t *p;
  size_t len;
};

static struct hora__mfsm *sm[N];
static struct msg q[QMAX];
static int nq;
static uint64_t now[N], last_epoch[N];
static struct hora__view seen[EPOCHS];
static bool have[EPOCHS];
static bool tainted; /* a damaged frame was delivered */

static uint32_t ip_of(int k) { return htonl(0x0a000001u + (uint32_t)k); }

static void take_outputs(int k) {
  struct hora__mfsm_send s;
  while (hora__mfsm_take_send(sm[k], &s)) {
    int to = -1;
    for (int j = 0; j < N; j++) {
      to = s.ip == ip_of(j) && s.port == 5000 + j ? j : to;
    }
    if (to < 0 || nq == QMAX) {
      free(s.frame);
      continue;
    }
    q[nq++] = (struct msg){to, ip_of(k), s.frame, s.len};
  }
  struct hora__mfsm_event e;
  while (hora__mfsm_take_event(sm[k], &e)) {
  }
}

static void check(int k) {
  const struct hora__view *v = hora__mfsm_view(sm[k]);
  if (v->epoch < last_epoch[k] || hora__mb_view_index(v, hora__mfsm_my_id(sm[k])) < 0) {
    __builtin_trap();
  }
  last_epoch[k] = v->epoch;
  if (tainted || v->epoch >= EPOCHS) {
    return; /* a damaged view may say anything: only the two checks above hold */
  }
  if (!have[v->epoch]) {
    hora__mb_view_copy(&seen[v->epoch], v);
    have[v->epoch] = true;
  } else if (!hora__mb_view_equal(&seen[v->epoch], v)) {
    __builtin_trap(); /* two views of one epoch */
  }
}

static void deliver(int i, bool keep, int flip) {
  struct msg m = q[i];
  if (flip >= 0 && m.len) {
    m.p[(size_t)flip % m.len] ^= (uint8_t)(1u << (flip % 8));
  }
  hora__mfsm_receive(sm[m.to], now[m.to], m.src_ip, m.p, m.len);
  take_outputs(m.to);
  check(m.to);
  if (!keep) {
    free(m.p);
    memmove(q + i, q + i + 1, (size_t)(nq - i - 1) * sizeof(*q));
    nq--;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct hora__view v = {.job = 77, .epoch = 1, .next_id = N, .n = N};
  struct hora__member mem[N];
  v.m = mem;
  for (int k = 0; k < N; k++) {
    mem[k] = (struct hora__member){(uint32_t)k, ip_of(k), (uint16_t)(5000 + k)};
  }
  for (int k = 0; k < N; k++) {
    struct hora__mfsm_config c = {.ip = ip_of(k), .port = (uint16_t)(5000 + k), .min_size = 1,
                                  .elastic_timeout_ns = 3000000000ull, .seed = (uint64_t)k + 1};
    if (hora__mfsm_new(&c, &sm[k]) != 0 || hora__mfsm_start(sm[k], &v, (uint32_t)k) != 0) {
      abort();
    }
    now[k] = 1000000000ull;
    last_epoch[k] = 1;
  }
  hora__mb_view_copy(&seen[1], &v);
  have[1] = true;
  for (size_t i = 0; i + 1 < size; i += 2) {
    uint8_t op = data[i], arg = data[i + 1];
    int k = arg % N;
    switch (op % 8) {
      case 0: /* the oldest frame */
      case 1:
        if (nq) {
          deliver(0, false, -1);
        }
        break;
      case 2: /* any frame: a reordering */
        if (nq) {
          deliver(arg % nq, false, -1);
        }
        break;
      case 3: /* lost */
        if (nq) {
          free(q[0].p);
          memmove(q, q + 1, (size_t)(nq - 1) * sizeof(*q));
          nq--;
        }
        break;
      case 4: /* twice */
        if (nq) {
          deliver(0, true, -1);
        }
        break;
      case 5: /* damaged */
        if (nq) {
          tainted = true;
          deliver(0, false, arg);
        }
        break;
      case 6: /* time passes */
        now[k] += (uint64_t)(arg / N + 1) * 100000000ull;
        hora__mfsm_tick(sm[k], now[k]);
        take_outputs(k);
        check(k);
        break;
      case 7: /* a reset, or news of an unreachable peer */
        if (arg & 0x80) {
          int j = (arg >> 2) % N;
          hora__mfsm_unreachable(sm[k], now[k], ip_of(j), (uint16_t)(5000 + j),
                                 (enum hora__mb_unreachable)(1 + (arg >> 4) % 3));
        } else {
          hora__mfsm_reset(sm[k], now[k], (uint16_t)(7000 + k));
        }
        take_outputs(k);
        check(k);
        break;
    }
  }
  for (int k = 0; k < N; k++) {
    hora__mfsm_free(sm[k]);
  }
  for (int i = 0; i < nq; i++) {
    free(q[i].p);
  }
  nq = 0;
  tainted = false;
  for (int e = 0; e < EPOCHS; e++) {
    hora__mb_view_free(&seen[e]);
    have[e] = false;
  }
  return 0;
}
