/* What the elastic agreement's state machine shares between its files:
 * membership_fsm.c (a member's part: following, learning, the app's
 * calls), membership_receive.c (each frame, whoever it reaches),
 * membership_coord.c (the coordinator's phases) and membership_wire.c
 * (views, frames, outputs). Nothing outside them
 * includes it: membership_fsm.h is the machine's interface. */
#ifndef HORA_MEMBERSHIP_FSM_IMPL_H
#define HORA_MEMBERSHIP_FSM_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/common.h"
#include "base/log.h"
#include "comm/bootstrap/membership_fsm.h"

#ifndef HORA_MB_MUTANTS
#define HORA_MB_MUTANTS 0
void hora__mf_suspect_cand(struct hora__mfsm *s, uint64_t now, const char *why);
void hora__mf_heard_coordinator(struct hora__mfsm *s, uint64_t now, int k, bool started);
void hora__mf_catch_up(struct hora__mfsm *s, uint64_t now, const struct hora__view *v);
void hora__mf_stall_check(struct hora__mfsm *s, uint64_t now);

#endif
#define MUTANT(s, bit) (HORA_MB_MUTANTS && ((s)->c.mutants & (bit)))

enum {
  M_RESET = 1, /* member -> the member it takes for coordinator: promise, view */
  M_JOIN,      /* newcomer -> the door (rank 0) */
  M_PREPARE,   /* ballot, base view */
  M_PROMISE,   /* ballot, accepted ballot, accepted view */
  M_NACK,      /* ballot, the higher promise */
  M_PROPOSE,   /* ballot, view */
  M_ACCEPTED,  /* ballot */
  M_COMMIT,    /* ballot, build?, rendezvous address, view */
  M_REFUSE,    /* code, final?, text */
  M_REDIRECT,  /* the member to ask instead: id, address */
  M_BEAT,      /* pending?: the coordinator lives (or will coordinate) */
  M_TYPES
};

#define WIRE_MAGIC 0x484d4232u /* "HMB2": the protocol's version */
#define VIEW_MAX 65536
#define START_GRACE_NS (10000ull * 1000000ull) /* past the coordinator's own wait */

enum mode { IDLE, FOLLOW, COORD, JOINING, FAILED };
enum phase { WAIT, P1, P2, BACKOFF };

struct voter {
  bool asked;     /* it is in the reset and asked this coordinator */
  bool gone;      /* left out of this round */
  bool certain;   /* gone for sure: its listener refused */
  bool promised;  /* P1: promised this ballot */
  bool replied;   /* this phase's answer came */
  const char *why;
  uint64_t heard, sent;
  uint64_t promise; /* the highest promise it told of */
};

struct newcomer {
  uint32_t ip;
  uint16_t port;
  uint64_t heard;
};

struct commit_rec {
  uint64_t ballot;
  bool build;
  uint32_t ip;
  uint16_t port;
  struct hora__view v;
};

struct hora__mfsm {
  struct hora__mfsm_config c;
  uint64_t rng;
  bool started; /* holds a view */
  uint32_t my_id;
  struct hora__view view;
  struct commit_rec last; /* how view was decided: sent to laggards */
  enum mode mode;
  bool left_out;
  char out_msg[480];
  uint64_t asked_epoch; /* ASKED told the app for this epoch */
  /* The acceptor, for epoch view.epoch + 1. */
  uint64_t promised, accepted_b;
  struct hora__view accepted;
  uint64_t top_ballot; /* the highest ballot seen in any epoch */
  uint64_t last_now;   /* the clock at the last input */
  /* A reset. */
  uint64_t reset_deadline;
  uint16_t build_port;
  uint64_t *asked_at; /* [view.n]: when member i last asked (0: not) */
  bool *suspect;      /* [view.n]: a follower's verdicts */
  /* Follower. */
  int cand;
  uint64_t cand_since, cand_heard, next_resend;
  bool cand_started;
  /* Coordinator. */
  struct voter *v; /* [view.n] */
  enum phase phase;
  uint64_t ballot, phase_at, wait_until, noquorum_since, next_beat, backoff_until;
  struct hora__view value, best;
  uint64_t best_b;
  bool adopted;
  /* Newcomers waiting here (rank 0). */
  struct newcomer *nc;
  int nnc, cap_nc;
  /* A newcomer's own knocking. */
  uint32_t door_ip, target_ip;
  uint16_t door_port, target_port;
  uint64_t join_deadline, next_join;
  /* Outputs. */
  struct hora__mfsm_send *sends;
  size_t nsends, send_head, cap_sends;
  struct hora__mfsm_event *events;
  size_t nevents, event_head, cap_events;
};

extern const char *const hora__mf_type_names[M_TYPES];

struct buf {
  uint8_t *p;
  size_t len, cap, off;
  bool bad;
};

/* The header every frame's payload opens with. */
struct header {
  uint32_t type;
  uint64_t job;
  struct hora__member from;
  uint64_t epoch;
};

int hora__mf_view_index_addr(const struct hora__view *v, uint32_t ip, uint16_t port);
bool hora__mf_quorum_of(const struct hora__mfsm *s, const bool *in);
void hora__mf_put(struct buf *b, const void *d, size_t n);
void hora__mf_put32(struct buf *b, uint32_t v);
void hora__mf_put64(struct buf *b, uint64_t v);
void hora__mf_put_view(struct buf *b, const struct hora__view *v);
bool hora__mf_get(struct buf *b, void *d, size_t n);
uint32_t hora__mf_get32(struct buf *b);
uint64_t hora__mf_get64(struct buf *b);
bool hora__mf_get_view(struct buf *b, struct hora__view *v);
void hora__mf_log(struct hora__mfsm *s, int level, const char *fmt, ...) HORA_PRINTF(3, 4);
struct hora__mfsm_event *hora__mf_push_event(struct hora__mfsm *s, enum hora__mfsm_event_kind k);
struct buf hora__mf_begin(const struct hora__mfsm *s, uint32_t type);
void hora__mf_finish(struct hora__mfsm *s, uint32_t ip, uint16_t port, struct buf *b);
void hora__mf_send_to(struct hora__mfsm *s, const struct hora__member *to, struct buf *b);
void hora__mf_send_refuse(struct hora__mfsm *s, uint32_t ip, uint16_t port, int code, bool final,
                        const char *msg);
void hora__mf_send_beat(struct hora__mfsm *s, const struct hora__member *to, bool pending);
void hora__mf_send_reset(struct hora__mfsm *s, const struct hora__member *to);
void hora__mf_send_redirect(struct hora__mfsm *s, uint32_t ip, uint16_t port,
                          const struct hora__member *to);
void hora__mf_send_commit(struct hora__mfsm *s, uint32_t ip, uint16_t port);
void hora__mf_fail(struct hora__mfsm *s, int code, const char *fmt, ...) HORA_PRINTF(3, 4);
void hora__mf_ask_app(struct hora__mfsm *s, uint32_t from);
void hora__mf_point(struct hora__mfsm *s, const char *name);
int hora__mf_my_index(const struct hora__mfsm *s);
void hora__mf_addr_str(uint32_t ip, uint16_t port, char *out, size_t n);
void hora__mf_gone(struct hora__mfsm *s, int i, bool certain, const char *why);
void hora__mf_tell_asked(struct hora__mfsm *s, int code, bool final, const char *msg);
void hora__mf_coord_fail(struct hora__mfsm *s, int code, const char *msg);
void hora__mf_coord_check(struct hora__mfsm *s, uint64_t now);
void hora__mf_coord_begin(struct hora__mfsm *s, uint64_t now);
void hora__mf_step_down(struct hora__mfsm *s, uint64_t now, int k);
void hora__mf_coord_tick(struct hora__mfsm *s, uint64_t now);
void hora__mf_voter_asked(struct hora__mfsm *s, uint64_t now, int k, uint64_t promise);
void hora__mf_on_promise(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b);
void hora__mf_on_nack(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b);
void hora__mf_on_accepted(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b);
void hora__mf_follow_begin(struct hora__mfsm *s, uint64_t now);
void hora__mf_learn(struct hora__mfsm *s, uint64_t now, const struct commit_rec *rec, bool carry);

void hora__mf_suspect_cand(struct hora__mfsm *s, uint64_t now, const char *why);
void hora__mf_heard_coordinator(struct hora__mfsm *s, uint64_t now, int k, bool started);
void hora__mf_catch_up(struct hora__mfsm *s, uint64_t now, const struct hora__view *v);
void hora__mf_stall_check(struct hora__mfsm *s, uint64_t now);

#endif
