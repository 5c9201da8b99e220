/* The coordinator thread's state and the calls between the files it is
 * made of: engine.c (the loop, start and stop), drive.c (callers driving
 * it), control_messages.c (control connections), submit.c (taking and
 * completing requests), execute.c and execute_exchange.c (running a
 * response), cycle_steps.c (the negotiation cycles), stall.c (stall
 * reports) and fatal.c (the fatal path). Private to them: how negotiation
 * works is at the top of engine.c. */
#ifndef HORA_ENGINE_H
#define HORA_ENGINE_H

#include <poll.h>

#include "runtime/negotiate/cache.h"
#include "runtime/negotiate/cycle.h"
#include "runtime/negotiate/message.h"
#include "runtime/negotiate/negotiate.h"
#include "runtime/negotiate/stragglers.h"
#include "runtime/runtime.h"

/* Cycle steps on the wire (negotiate/cycle.h). */
#define STEP_FOLD_IN HORA_STEP_FOLD_IN
#define STEP_FOLD_OUT HORA_STEP_FOLD_OUT
#define STEP_ASK HORA_STEP_ASK
#define INBOX_STEPS HORA_INBOX_STEPS

enum { CYCLE_IDLE, CYCLE_FOLD_IN, CYCLE_ROUNDS, CYCLE_RESULT, CYCLE_DONE };

struct frame {
  struct frame *next;
  size_t len;
  uint8_t data[];
};

/* A communicator's negotiation: everything that agrees on, fuses and runs
 * its collectives. The job's world is one (engine->world, made by
 * hora__engine_start); a process set would be another, with the same
 * code. Its rank and size are those of its communicator. */
struct hora__set {
  struct hora__engine *e;       /* the process's coordinator */
  hora__comm *comm;             /* the members and their data plane */
  struct hora__controller *ctl; /* the set's first rank only */
  struct hora__cache cache;     /* identical on every member */
  struct hora__response *todo, **todo_tail;
  uint64_t next_stall_ns;
  uint64_t send_at_ns; /* rank 0: when held-back responses must go */
  /* A joined rank's stand-in buffers for allreduces it did not submit. */
  void *zeros, *junk;
  size_t zeros_bytes, junk_bytes;
  struct hora__iov *iov_in, *iov_out; /* one entry per tensor of a response */
  uint32_t iov_cap;
  const struct hora__response *current; /* being executed, for on_phase */
  uint64_t timeline_batch; /* current's number on the timeline (0: none yet) */
  uint64_t phase_ns, copy_ns;
  bool phase_is_copy;
  struct hora_request **reqs;
  size_t reqs_cap;
  /* Cycles (see the top of engine.c). */
  struct hora__cycle_partners partners;
  struct hora_request **waiting; /* [cache capacity]: our request on each slot */
  uint32_t nwaiting;
  uint64_t new_hits;     /* requests that went into `waiting` since we last took part */
  uint8_t *evict_wish;   /* [bitmap]: slots we want emptied */
  bool evict_wanted;
  uint64_t next_wait_scan_ns; /* when to look for requests waiting too long */
  uint64_t cycle_started_ns;
  /* Asked to a cycle with nothing in flight, on a host with more ranks than
   * cores: until when this rank waits for its own submission before taking
   * part (UINT64_MAX: not waiting). */
  uint64_t join_defer_ns;
  bool stuck_reported;   /* told rank 0 that the cycle in progress waits too long */
  /* rank 0: who reported which cycle stuck, since when, and one of its keys */
  uint64_t *stuck_cycle, *stuck_since_ns;
  char stuck_key[HORA_KEY_MAX + 1];
  size_t stuck_key_len;
  uint64_t next_stuck_ns, next_stuck_warn_ns;
  uint64_t cycles;       /* cycles whose end has been applied */
  int cycle_phase;       /* CYCLE_IDLE, or where the one in progress stands */
  int cycle_round;
  bool round_sent;
  uint8_t *acc;          /* ready, submitted, evict, eager: 4 x cycle_nbytes */
  /* The eager slots' data (the acc's eager bits, in slot order), reduced so
   * far; eager_tmp is where a partner's step is folded in. */
  struct hora__wbuf eager, eager_tmp;
  uint32_t cycle_nbytes;
  uint64_t acc_frames;
  uint8_t acc_flags;
  bool our_joined_flag;  /* what we said in our last contribution */
  /* We have taken our own JOIN request, and the cycles have not yet applied
   * the response that ends the join. It decides whether we stand in, and
   * changes only with the cycles (never with when this rank happens to run
   * that response), so every rank agrees on who stands in for which cycle. */
  bool join_pending;
  bool others_joined;    /* what the last cycle said */
  struct hora__cycle_inbox *inbox; /* [2 * INBOX_STEPS]: by cycle parity and step */
  /* Response frames, applied at the end of the cycle that counts them. */
  struct frame *frames_head, **frames_tail;
  uint64_t frames_got;   /* received (rank 0: sent) */
  uint64_t frames_applied;
  uint64_t frames_told;  /* rank 0: the count in its last contribution */
  bool shutdown_seen;    /* a frame holds SHUTDOWN: peers may close now */
  void **ready, **done;  /* per tensor of a device response */
  /* Stragglers (negotiate/stragglers.h): this rank's wait for the
   * operations the last cycle scheduled, told with the next cycle, and the
   * reduction of everyone's so far (acc_late). The set's first rank keeps
   * the notes (late) and reports them. */
  struct hora__cycle_late acc_late;
  uint64_t late_ops, late_wait_ns;
  bool late_valid;
  uint64_t late_prev_ns; /* the end of the last cycle that scheduled anything */
  struct hora__stragglers *late;
  uint64_t next_late_report_ns;
  uint32_t events_cap;
};

/* The process's coordinator: the loop, the control connections, and the
 * communicators it negotiates for. */
struct hora__engine {
  struct hora__runtime *rt;
  struct hora__proc *proc; /* the process's connections (the control star) */
  struct hora__set *world; /* the job's world */
  struct hora__wbuf wbuf;
  bool stop;
  bool abort_from_root; /* the fatal error came in an abort from rank 0 */
  uint64_t frames_in;  /* control frames handled so far */
  bool shutting_down;  /* a SHUTDOWN response is out: peers may close now */
  /* Strangers refused while idle (control_messages.c), coordinator only: the first
   * is logged, then at most one line per REFUSALS_LOG_NS with the count. */
  struct {
    uint64_t total, unlogged, next_log_ns;
    char last[160];
  } refusals;
  struct pollfd *pollfds; /* room for every control connection and a few more */
  struct pollfd *caller_pollfds; /* the same for a caller driving it (drive.c): the
                                    coordinator may be in poll() on its own meanwhile */
  int npollfds;
  /* Which control connections the last poll() found readable (by rank),
   * so the service reads only those: a read per connection per step cost
   * a failed recvfrom per partner, most of a small operation's system
   * calls. Without fresh readiness the service polls them once, at once. */
  struct pollfd *service_pollfds;
  uint8_t *ctrl_ready; /* [nctrl_ready] */
  int nctrl_ready;
  bool ctrl_fresh;
  atomic_uint_fast64_t seen_seq; /* rt->submit_seq when the queue was last taken */
  bool on_caller; /* a caller runs this step: device work is left to the coordinator */
  /* That caller's request: it runs the responses up to the one that
   * completes it, and leaves the rest (another thread's) to others. */
  const atomic_int *caller_done;
  bool exited;    /* the coordinator has left its loop: nobody may drive */
  /* A caller's step failed: the coordinator takes the error as its own. */
  int deferred_rc;
  char deferred_msg[1024];
  bool setup_done;       /* HORA_GPU_INIT=eager: hora_init may go on (under rt->mu) */
};

/* engine.c: one turn of the loop's work (taking submissions, control
 * traffic, the world's cycle and its responses), on whichever thread holds
 * rt->progress_mu; and when the loop must next wake for its timers. */
int hora__engine_step(struct hora__engine *e, bool *busy);
uint64_t hora__engine_next_due_ns(struct hora__engine *e);
/* The engine's sleep, for the coordinator and a caller driving it: begin
 * counts the sleeper for submitters to wake (false, and nothing counted,
 * when work is queued); poll sleeps in ppoll() on fds (fds[0] the eventfd)
 * until input or the next timer, counted in this rank's mailbox (not at
 * all if a partner's step came in first), letting go of progress_mu
 * meanwhile if `release` (the coordinator), then uncounts the sleeper,
 * drains the eventfd and, from fds[service_from] on (the fds of
 * hora__engine_service_pollfds; 0: none), notes which control connections
 * the next service reads. */
bool hora__engine_sleep_begin(struct hora__runtime *rt, bool coordinator);
int hora__engine_poll(struct hora__engine *e, struct pollfd *fds, int n, bool release,
                      int service_from);

/* engine.c: a communicator's negotiation state (its cache, cycles with
 * partners by its own ranks, stall inspector and, at its first rank, the
 * controller), made for engine e and freed with the responses still queued
 * on it; `failed`: after a fatal error (the device data plane is aborted,
 * not waited for). hora__engine_start makes the world's; the unit tests
 * make their own. */
int hora__engine_set_create(struct hora__engine *e, hora__comm *comm, struct hora__set **out);
void hora__engine_set_free(struct hora__set *s, bool failed);

/* control_messages.c: control connections in and out */
int hora__engine_read_ctrl(struct hora__engine *e, hora__ctrl *c);
int hora__engine_ctrl_send(struct hora__engine *e, hora__ctrl *c, uint16_t type, const void *p,
                           size_t n);
int hora__engine_service(void *arg);
int hora__engine_service_pollfds(void *arg, struct pollfd *fds, int max);
/* After a poll() on fds from hora__engine_service_pollfds: which of them
 * the next service reads. */
void hora__engine_service_ready(void *arg, const struct pollfd *fds, int n);
void hora__engine_refuse_connections(struct hora__engine *e, int lfd);
/* Logs the refusals due (all with `flush`); progress_mu is released around
 * the write, so callers spinning for the engine are not held up by it. */
void hora__engine_log_refusals(struct hora__engine *e, bool flush);
int hora__engine_distribute(struct hora__set *set);

/* submit.c: submissions, and our requests by key */
int hora__engine_grow_reqs(struct hora__set *set, size_t n);
int hora__engine_send_full(struct hora__set *set, struct hora_request *const *list, size_t n);
void hora__engine_wish_evicted(struct hora__set *set, int32_t slot);
int hora__engine_take_submissions(struct hora__set *set, bool *busy);
struct hora_request *hora__engine_lookup(struct hora__engine *e, const struct hora__resp_tensor *t);
void hora__engine_complete(struct hora__engine *e, struct hora_request **reqs, size_t n, int status,
                           const char *msg);
void hora__engine_fail_by_key(struct hora__engine *e, const struct hora__resp_tensor *t, int status,
                              const char *msg);
void hora__engine_fail_mismatched(struct hora__engine *e, struct hora_request *q, const char *msg);
void hora__engine_retire_placeholder(struct hora__engine *e, struct hora_request *p);

/* execute.c: one response, run; whether request q asked for what tensor i
 * of r runs (else *msg says how they differ); the phases the algorithms
 * report (arg: the set; name NULL ends one), for the timeline and copy time */
int hora__engine_execute(struct hora__set *set, const struct hora__response *r);
bool hora__engine_request_matches(const struct hora__response *r, uint32_t i, int rank,
                                  const struct hora_request *q, char *msg, size_t size);
void hora__engine_phase(void *arg, const char *name);

/* execute_exchange.c: an allgatherv or an alltoall, counts exchanged first */
int hora__engine_run_exchange(struct hora__set *set, const struct hora__response *r);

/* cycle_steps.c: the negotiation cycles */
int hora__engine_lost_partner(struct hora__engine *e, int peer);
int hora__engine_cycle_advance(struct hora__set *set, bool *progressed);
int hora__engine_cycle_end(struct hora__set *set, bool *progressed);
/* Whether the set has nothing in hand: no cycle under way or asked for, no
 * request waiting, nothing to run or to send. Only then may a caller that
 * drove it leave without waking the coordinator, whose poll() would not
 * see what the caller already read off the sockets. */
bool hora__engine_set_idle(const struct hora__set *set);

/* fatal.c: the end of the coordinator's loop with rc. A fatal error
 * (rc != 0) is recorded, logged and told to the job and the process's
 * other sets (unless contained); then every request still in flight fails,
 * with it or, after a normal stop, with HORA_ERR_ABORTED; after an error
 * the device data plane is aborted. */
void hora__engine_fail_all(struct hora__engine *e, int rc);

/* lateness.c: who the others wait for (negotiate/stragglers.h). The set's
 * first rank starts the notes; each cycle tells the last one's waits
 * (contribute), folds the partners' (fold), and at its end notes the
 * straggler, then measures this rank's own wait for what it scheduled: ops
 * operations, the earliest submitted at earliest_ns, and whether this rank
 * submitted each of them (valid) or stood in for some. */
int hora__engine_late_start(struct hora__set *set);
void hora__engine_late_free(struct hora__set *set);
void hora__engine_late_contribute(struct hora__set *set);
void hora__engine_late_fold(struct hora__set *set, const struct hora__cycle_late *theirs);
int hora__engine_late_cycle_end(struct hora__set *set, uint64_t now_ns);
void hora__engine_late_measured(struct hora__set *set, uint64_t ops, bool valid,
                                uint64_t earliest_ns, uint64_t now_ns);

/* stall.c: stall reports */
void hora__engine_scan_waiting(struct hora__set *set);
uint64_t hora__engine_stall_half_ns(void);
int hora__engine_report_stuck(struct hora__set *set);
void hora__engine_record_stuck(struct hora__set *set, int from, uint64_t cycle, uint32_t waited_ms,
                               const char *key, size_t key_len);
int hora__engine_check_stuck(struct hora__set *set);

#endif
