/* What membership.c (the listener, the wire, newcomers),
 * membership_agree.c (the agreement's coordinator) and membership_member.c
 * (a member's part) share. */
#ifndef HORA_MEMBERSHIP_IMPL_H
#define HORA_MEMBERSHIP_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/bootstrap/membership.h"

enum {
  M_RESET = 1, /* member -> coordinator: id, promise, committed view, address */
  M_JOIN,      /* newcomer -> rank 0: its listener's address */
  M_PREPARE,   /* ballot */
  M_PROMISE,   /* ballot, accepted ballot, accepted view */
  M_NACK,      /* the higher promise */
  M_PROPOSE,   /* ballot, view */
  M_ACCEPTED,  /* ballot */
  M_COMMIT,    /* ballot, build?, rendezvous port, view */
  M_REFUSE,    /* code, text */
  M_REDIRECT,  /* the address to ask instead */
  M_BEAT,      /* the coordinator is alive */
};

#define FRAME_MAX (1u << 24)
#define PROBE_NS (2000ull * 1000000ull)   /* an unreachable member is gone after this */
#define BEAT_NS (500ull * 1000000ull)     /* the coordinator's heartbeat */
#define SILENCE_NS (4000ull * 1000000ull) /* a coordinator this silent is gone */
#define REPLY_NS (5000ull * 1000000ull)   /* for each answer during the phases */
#define IO_NS (1000ull * 1000000ull)      /* a connection's handshake and first frame */

struct queued {
  int fd;
  uint32_t id, ip;
  uint16_t port;
  uint64_t promised;
  struct hora__view view; /* its committed membership (M_RESET) */
};

struct hora__membership {
  int lfd, wake_fd;
  int door_fd, door_port, door_failed; /* the listener's thread's own (apply_door) */
  uint32_t my_ip;
  uint16_t my_port;
  bool has_key;
  uint8_t key[HORA_SECRET_LEN];
  pthread_t thread;
  bool thread_started;
  pthread_mutex_t mu;
  /* Under mu: */
  bool stop, in_reset;
  int want_door; /* the door's port rank 0 should hold, 0 for none */
  uint64_t last_beat; /* the listener's thread's own */
  uint32_t my_id;
  struct hora__view view;
  struct queued *resets, *joins;
  int nresets, njoins, cap_resets, cap_joins;
  void (*on_request)(void *, uint32_t);
  void *on_request_arg;
  /* Paxos state, used by the agreeing thread only. */
  uint64_t promised, accepted_b;
  struct hora__view accepted;
};

struct hora__mb_buf {
  uint8_t *p;
  size_t len, cap, off;
  bool bad;
};

void hora__mb_view_free(struct hora__view *v);
int hora__mb_view_copy(struct hora__view *dst, const struct hora__view *src);
int hora__mb_view_index(const struct hora__view *v, uint32_t id);
void hora__mb_put(struct hora__mb_buf *b, const void *d, size_t n);
void hora__mb_put32(struct hora__mb_buf *b, uint32_t v);
void hora__mb_put64(struct hora__mb_buf *b, uint64_t v);
void hora__mb_put_view(struct hora__mb_buf *b, const struct hora__view *v);
bool hora__mb_get(struct hora__mb_buf *b, void *d, size_t n);
uint32_t hora__mb_get32(struct hora__mb_buf *b);
uint64_t hora__mb_get64(struct hora__mb_buf *b);
bool hora__mb_get_view(struct hora__mb_buf *b, struct hora__view *v);
int hora__mb_move_all(int fd, void *p, size_t n, bool out, uint64_t deadline);
int hora__mb_send_msg(int fd, uint32_t type, const struct hora__mb_buf *b, uint64_t deadline);
/* One frame into *b (reset for reading); *type. */
int hora__mb_recv_msg(int fd, uint32_t *type, struct hora__mb_buf *b, uint64_t deadline);
void hora__mb_send_refuse(int fd, int code, const char *msg);
void hora__mb_addr_str(uint32_t ip, uint16_t port, char *out, size_t n);
/* A non-blocking connect started; the socket, or -1 with errno. */
int hora__mb_start_connect(uint32_t ip, uint16_t port);
/* Connected and proved within `ns`; -1: the peer is gone or does not
 * answer; -2: it answered but did not prove the key (another job). */
int hora__mb_dial(struct hora__membership *m, uint32_t ip, uint16_t port, uint64_t ns);
void hora__mb_drop_queue(struct queued *q, int n);
/* What the listener's thread queued (resets, or newcomers' joins), taken. */
struct queued *hora__mb_take_queue(struct hora__membership *m, bool joins, int *n);
/* HORA_ELASTIC_TEST_CRASH=POINT@ID: this process dies at POINT (tests). */
void hora__mb_crash_if_asked(const struct hora__membership *m, const char *point);
/* This process coordinates the reset: 0 and *out, or the HORA_ERR_* that
 * ends its part. */
int hora__mb_coordinate(struct hora__membership *m, struct hora__agreed *out);

#endif
