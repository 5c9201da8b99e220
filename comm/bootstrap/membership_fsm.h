/* The elastic agreement as a state machine with no I/O of its own (etcd's
 * raft library is the model): it takes frames, unreachable-peer hints and
 * clock readings, and hands back frames to send and decisions. It never
 * reads a clock, opens a socket, sleeps or draws entropy. membership.c
 * drives it with the listener's sockets and the OS clock; the deterministic
 * simulator (tests/sim/membership_sim.c) drives the same code with a
 * simulated network and clock.
 *
 * One process's part. Every member holds its job's committed membership
 * (a view: epoch, members in rank order) and, for the next epoch, the state
 * of a Paxos acceptor (highest promise, accepted ballot and value). A reset
 * decides view e+1 by single-decree Paxos among the members of view e:
 *
 *   follower     asks the lowest member of view e it does not suspect
 *                (RESET, again every second); suspects one that is
 *                unreachable, silent for 4 s, or alive but never starting
 *   coordinator  that lowest member: waits until every member has asked or
 *                is gone (unreachable, silent, or not asking within
 *                HORA_ELASTIC_TIMEOUT_SECONDS), then with a quorum of view e
 *                  PREPARE(b, view e)  -> PROMISE(b, accepted b', value')
 *                  PROPOSE(b, value)   -> ACCEPTED(b)
 *                  COMMIT(value)       everyone learns it; the coordinator
 *                                      hosts the new world's rendezvous
 *                value: the accepted value of the highest ballot among the
 *                promises, else the members that promised and the newcomers
 *   acceptor     promises a ballot above its promise; accepts a proposal
 *                for epoch e+1 whose ballot is at least its promise;
 *                forgets both only when it learns view e+1 (the decision)
 *
 * A quorum of view e is more than half of it, or exactly half including its
 * rank 0; two quorums of one view always share a member. A value is
 * committed only after a quorum accepted it, so every later coordinator of
 * epoch e+1 hears of it from a member of its own quorum and proposes it
 * again: no two processes ever learn different views of one epoch. Views
 * travel with the messages that need them (the coordinator's base in
 * PREPARE, the decided view in COMMIT, a member's view in RESET), so a
 * member that missed a decision learns it before it votes again.
 *
 * Frames: { u32 type, u32 len, payload }, payload { u64 job, u32 id, u32 ip,
 * u32 port, u64 epoch, ... }. The job id is drawn at start-up and is in
 * every frame and view: frames of another job sharing the secret are
 * dropped. */
#ifndef HORA_MEMBERSHIP_FSM_H
#define HORA_MEMBERSHIP_FSM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HORA_MB_NO_ID UINT32_MAX  /* a newcomer's id until it is admitted */
#define HORA_MB_FRAME_MAX (1u << 24)
#define HORA_MB_HEADER 8          /* u32 type, u32 payload length */

/* Times (ns) of the protocol; the driver's dial timeout is PROBE. */
#define HORA_MB_PROBE_NS (2000ull * 1000000ull)   /* a dial that has not connected by then failed */
#define HORA_MB_BEAT_NS (500ull * 1000000ull)     /* a coordinator's beat to its members */
#define HORA_MB_RESEND_NS (1000ull * 1000000ull)  /* a follower's RESET, a newcomer's JOIN, again */
#define HORA_MB_RETRY_NS (500ull * 1000000ull)    /* an unanswered PREPARE or PROPOSE, again */
#define HORA_MB_SILENCE_NS (4000ull * 1000000ull) /* a peer this silent during a reset is gone */
#define HORA_MB_REPLY_NS (5000ull * 1000000ull)   /* for each answer during the phases */
#define HORA_MB_STALE_NS (3000ull * 1000000ull)   /* a newcomer not knocking again gave up */

struct hora__member {
  uint32_t id;   /* stable across memberships: the start-up rank, then the next free */
  uint32_t ip;   /* the listener's IPv4 address, network order */
  uint16_t port; /* host order */
};

struct hora__view {
  uint64_t job;
  uint64_t epoch;
  uint32_t next_id;
  int n;
  struct hora__member *m; /* [n], in rank order */
};

void hora__mb_view_free(struct hora__view *v);
int hora__mb_view_copy(struct hora__view *dst, const struct hora__view *src);
int hora__mb_view_index(const struct hora__view *v, uint32_t id);
bool hora__mb_view_equal(const struct hora__view *a, const struct hora__view *b);
/* A strict majority of v, or exactly half including its rank 0; in[i] says
 * whether v's member i is counted. */
bool hora__mb_quorum(const struct hora__view *v, const bool *in);

/* What an unreachable hint says about a peer the driver could not reach. */
enum hora__mb_unreachable {
  HORA_MB_REFUSED = 1, /* nothing listens there: the process is gone */
  HORA_MB_SILENT,      /* no answer within PROBE: the host is down or cut off */
  HORA_MB_FOREIGN,     /* it answered but did not prove the job's secret */
};

enum hora__mfsm_event_kind {
  HORA_MFSM_COMMITTED = 1, /* the reset (or join) ended: build the membership */
  HORA_MFSM_FAILED,        /* the reset (or join) failed: code and message */
  HORA_MFSM_ASKED,         /* a member asks for a reset this process is not in */
};

struct hora__mfsm_event {
  enum hora__mfsm_event_kind kind;
  /* COMMITTED */
  int rank, size;
  uint64_t epoch;
  uint32_t host_ip;  /* where the new world's rendezvous is: the coordinator */
  uint16_t port;
  bool builder;      /* this process hosts it (on the port it gave) */
  int joined, lost;
  /* FAILED */
  int code;
  char msg[480];
  /* ASKED */
  uint32_t from;
};

struct hora__mfsm_send {
  uint32_t ip;
  uint16_t port;
  uint8_t *frame; /* owned by the caller once taken: free() it */
  size_t len;
};

struct hora__mfsm_config {
  uint32_t ip;   /* this process's listener, network order */
  uint16_t port; /* host order */
  int min_size, max_size;          /* HORA_ELASTIC_MIN_SIZE, _MAX_SIZE (0: none) */
  uint64_t elastic_timeout_ns;     /* HORA_ELASTIC_TIMEOUT_SECONDS */
  bool insecure;                   /* no secret: a frame must come from its sender's address */
  uint64_t seed;                   /* backoff jitter */
  void (*log)(void *arg, int level, const char *msg); /* level: base/log.h's; may be NULL */
  void *log_arg;
  /* Named points of the protocol (tests: HORA_ELASTIC_TEST_CRASH dies at
   * one): "accepted" (a coordinator's value accepted by a quorum, not yet
   * committed), "propose" (a proposal reached a member, not yet accepted). */
  void (*point)(void *arg, const char *name);
  void *point_arg;
  unsigned mutants; /* the simulator's planted defects (HORA_MB_MUTANTS builds only) */
};

struct hora__mfsm;

int hora__mfsm_new(const struct hora__mfsm_config *c, struct hora__mfsm **out);
void hora__mfsm_free(struct hora__mfsm *s);

/* The start-up's membership (committed), this process's id in it. */
int hora__mfsm_start(struct hora__mfsm *s, const struct hora__view *v, uint32_t my_id);
/* The app asks for a reset (after a loss, or newcomers at a commit point).
 * build_port: a port this process listens on, to host the next world's
 * rendezvous should it coordinate. */
void hora__mfsm_reset(struct hora__mfsm *s, uint64_t now, uint16_t build_port);
/* A newcomer: knock at door (the job's rendezvous address) until admitted;
 * build_port as for a reset (once admitted it may have to coordinate). */
void hora__mfsm_join(struct hora__mfsm *s, uint64_t now, uint32_t door_ip, uint16_t door_port,
                     uint16_t build_port);
/* A whole frame (header included) that arrived on a connection from src_ip. */
void hora__mfsm_receive(struct hora__mfsm *s, uint64_t now, uint32_t src_ip, const uint8_t *frame,
                        size_t len);
/* The driver could not reach ip:port (frames to it were dropped). */
void hora__mfsm_unreachable(struct hora__mfsm *s, uint64_t now, uint32_t ip, uint16_t port,
                            enum hora__mb_unreachable why);
/* Time passed: timeouts and retransmissions due by now. */
void hora__mfsm_tick(struct hora__mfsm *s, uint64_t now);
/* When tick is next due (UINT64_MAX: nothing pending). */
uint64_t hora__mfsm_next_tick(const struct hora__mfsm *s);

/* Outputs, in order. */
bool hora__mfsm_take_send(struct hora__mfsm *s, struct hora__mfsm_send *out);
bool hora__mfsm_take_event(struct hora__mfsm *s, struct hora__mfsm_event *out);

/* Queries. */
const struct hora__view *hora__mfsm_view(const struct hora__mfsm *s);
uint32_t hora__mfsm_my_id(const struct hora__mfsm *s);
int hora__mfsm_waiting(const struct hora__mfsm *s); /* newcomers waiting here (rank 0) */
bool hora__mfsm_in_reset(const struct hora__mfsm *s);
/* For the simulator's checks: the acceptor's state for the next epoch. */
void hora__mfsm_acceptor(const struct hora__mfsm *s, uint64_t *promised, uint64_t *accepted_b,
                         const struct hora__view **accepted);
/* A frame, decoded for a trace line (the simulator's SEED=N replay). */
void hora__mfsm_describe(const uint8_t *frame, size_t len, char *out, size_t n);

/* Planted defects, for the simulator to show it finds them (compiled in
 * only with -DHORA_MB_MUTANTS=1; tests/sim). */
enum {
  HORA_MB_MUTANT_FORGET_ACCEPTED = 1u << 0, /* defect 1: any COMMIT clears the accepted value */
  HORA_MB_MUTANT_NO_MAX_AT_RESET = 1u << 1, /* defect 4: newcomers admitted past MAX_SIZE */
  HORA_MB_MUTANT_NO_JOB_CHECK = 1u << 2,    /* defect 5: frames of another job accepted */
  HORA_MB_MUTANT_FINAL_REFUSALS = 1u << 3,  /* defect 3: every refusal is final */
  HORA_MB_MUTANT_HALF_QUORUM = 1u << 4,     /* exactly half is a quorum, rank 0 or not */
  HORA_MB_MUTANT_COMMIT_EARLY = 1u << 5,    /* commit once a quorum promised, not accepted */
  HORA_MB_MUTANT_NO_ADDR_CHECK = 1u << 6,   /* defect 6: insecure frames from any address */
  HORA_MB_MUTANT_FOREIGN_IS_GONE = 1u << 7, /* a peer not proving the member key is gone for sure */
};

#endif
