/* The controller: rank 0's side of negotiation. Every rank reports the
 * operations it has submitted; the controller matches them by key, checks
 * that all ranks asked for the same thing, and emits one ordered list of
 * responses that every rank executes in the same order. Joined ranks count
 * as ready for every allreduce. Owned by rank 0's coordinator thread. */
#ifndef HORA_NEGOTIATE_H
#define HORA_NEGOTIATE_H

#include "runtime/negotiate/message.h"

struct hora__controller;

int hora__controller_create(int size, struct hora__controller **out);
void hora__controller_destroy(struct hora__controller *c);

/* Rank `rank` submitted `req`. Mismatches and misuse become error
 * responses; only allocation failures are returned. */
int hora__controller_submit(struct hora__controller *c, int rank,
                            const struct hora__wire_request *req);

/* Moves the responses that are ready, in order, onto the queue *tail,
 * fusing compatible allreduces (and broadcasts) into responses of up to
 * `fusion_threshold` bytes (0: no fusion; fusion.h says which fuse, and
 * when the ready ones should go). */
int hora__controller_take(struct hora__controller *c, struct hora__response ***tail,
                          int64_t fusion_threshold);
bool hora__controller_has_ready(const struct hora__controller *c);

/* Number of operations some but not all ranks have submitted. */
size_t hora__controller_pending(const struct hora__controller *c);

/* Stall inspection at time `now_ns`: logs a warning naming the missing
 * ranks of operations older than the check time; with a positive shutdown
 * time, fails operations older than it with HORA_ERR_TIMEOUT and returns
 * HORA_ERR_TIMEOUT with a message for the whole job. *next_ns is when to
 * call again. */
int hora__controller_check_stalls(struct hora__controller *c, uint64_t now_ns, double check_s,
                                  double shutdown_s, uint64_t *next_ns);

/* Writes the ranks r < size with (set[r] != 0) == want as "1,3-5"; the
 * _named form shows rank r as names[r] (a process set's global ranks). */
void hora__format_ranks(const uint8_t *set, int size, bool want, char *buf, size_t n);
void hora__format_ranks_named(const uint8_t *set, int size, bool want, const int *names,
                              char *buf, size_t n);

/* Messages name rank r as names[r] and start with label (a process set's;
 * both stay the caller's). */
void hora__controller_name(struct hora__controller *c, const int *names, const char *label);
/* Notes, for each operation negotiated here in full, the rank whose
 * request came last and the others' mean wait for it (stragglers.h). */
struct hora__stragglers;
void hora__controller_watch_late(struct hora__controller *c, struct hora__stragglers *late);

#endif
