/* What the elastic membership's driver shares between membership.c (the
 * listener's thread, the door, the interface of membership.h) and
 * membership_conn.c (connections, frames in and out, the handshake). */
#ifndef HORA_MEMBERSHIP_DRIVER_H
#define HORA_MEMBERSHIP_DRIVER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/bootstrap/membership.h"
#include "comm/transport/handshake.h"

#define IO_NS (1000ull * 1000000ull)       /* a connection's handshake */
#define IDLE_NS (60000ull * 1000000ull)    /* an accepted connection that says nothing */
#define CONN_MAX 512                       /* connections held at once */
#define QUEUE_MAX 512                      /* frames waiting for one connection */
#define HS_SIZE 3                          /* the handshake's ranks: the door's */

enum { K_DOOR = 1, K_MEMBER = 2 }; /* handshake kinds */
enum { C_CONNECTING, C_SHAKING, C_OPEN };

/* The frame types (membership_fsm.c) a door connection may carry. */
static inline bool door_frame(uint32_t type) { return type == 2 || type == 8 || type == 9 || type == 10; }

struct frame {
  uint8_t *p;
  size_t len;
};

struct conn {
  int fd;
  bool out, door;
  int state, kind;
  uint32_t ip; /* outbound: the destination; inbound: the peer */
  uint16_t port;
  struct hora__hs hs;
  uint64_t deadline, last_io;
  struct frame *q;
  int nq, capq;
  size_t qoff; /* bytes of q[0] sent */
  uint8_t hdr[HORA_MB_HEADER];
  size_t got;
  uint8_t *body;
  uint32_t body_len;
};

struct hint {
  uint32_t ip;
  uint16_t port;
  enum hora__mb_unreachable why;
};

struct hora__membership {
  int lfd, wake_fd;
  int door_fd, door_port, door_failed; /* the listener's thread's own (apply_door) */
  uint32_t my_ip;
  uint16_t my_port;
  bool has_key;
  uint8_t secret[HORA_SECRET_LEN]; /* the user's, for the members' key once the job is known */
  uint64_t keyed_job;              /* the job id member_key is derived from */
  uint8_t door_key[HORA_SECRET_LEN], member_key[HORA_SECRET_LEN];
  struct hora__membership *next_open; /* open_list */
  const uint8_t *keys[2]; /* by kind, for accepted connections */
  pthread_t thread;
  bool thread_started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  /* Under mu: */
  bool stop, in_reset;
  int want_door; /* the door's port rank 0 should hold, 0 for none */
  struct hora__mfsm *sm;
  enum { CMD_NONE, CMD_RESET, CMD_JOIN } cmd;
  uint32_t cmd_ip;
  uint16_t cmd_port, build_port;
  bool busy, have_result;
  bool result_out;    /* the frames sent with the decision have left */
  uint64_t result_at;
  struct hora__mfsm_event result;
  void (*on_request)(void *, uint32_t);
  void *on_request_arg;
  /* The listener's thread's own: */
  struct conn **c; /* each its own allocation: a pointer stays valid while more are added */
  int nc, capc;
  struct hint hints[64];
  int nhints;
};

void hora__mbd_wake(struct hora__membership *m);
void hora__mbd_derive_key(const uint8_t *secret, const char *label, uint64_t job,
                       uint8_t out[HORA_SECRET_LEN]);
void hora__mbd_conn_close(struct hora__membership *m, int i);
void hora__mbd_add_hint(struct hora__membership *m, uint32_t ip, uint16_t port,
                     enum hora__mb_unreachable why);
void hora__mbd_flush_locked(struct hora__membership *m, uint64_t now);
bool hora__mbd_write_frames(struct conn *c, uint64_t now);
bool hora__mbd_step_conn(struct hora__membership *m, struct conn *c, short revents, uint64_t now);
void hora__mbd_accept_from(struct hora__membership *m, int lfd, bool door, uint64_t now);

#endif
