/* The controller's state (rank 0's negotiation), shared by negotiate.c
 * (matching requests, deciding, reporting stalls), negotiate_groups.c
 * (grouped operations) and fusion.c (when ready responses go); private to
 * those three. */
#ifndef HORA_CONTROLLER_H
#define HORA_CONTROLLER_H

#include "base/table.h"
#include "runtime/negotiate/message.h"
#include "runtime/negotiate/negotiate.h"

/* Distinct requests for one key, each with the lowest rank that made it:
 * enough to name a disagreement the same way whatever order ranks came in. */
#define MAX_VARIANTS 4

struct variant {
  struct hora__op_meta meta;
  int lowest_rank;
  struct hora__shape shape; /* for the message: meta.shape is only its fingerprint */
};

struct pending_op {
  struct pending_op *prev, *next; /* arrival order: oldest first */
  char *key;
  uint16_t key_len;
  struct hora__op_meta meta; /* what the first submitter asked for */
  struct variant variants[MAX_VARIANTS];
  int nvariants;
  uint8_t *have; /* [size]: 1 when that rank submitted */
  int nhave;
  int nhave_joined; /* submitters that have also joined */
  uint64_t first_ns;
  uint64_t arrived_sum_ns; /* the submitters' arrival times, summed */
};

/* A group (hora_group_start/end) some of whose members are decided: the
 * ready ones wait here until all are, then leave together; once one has
 * failed, every other member fails as it comes, until all are answered. */
struct group {
  struct group *next;
  uint64_t fp;
  uint32_t size, answered;
  struct hora__response *parked, **parked_tail;
  char *error; /* the first member's failure, once one failed */
  int code;
};

struct hora__controller {
  int size;
  struct group *groups;
  const int *names; /* the job's rank of each rank, for messages (NULL: the same) */
  const char *label; /* prefixed to messages ("process set 2: ") */
  struct hora__table ops; /* key -> pending_op */
  struct pending_op *oldest, *newest;
  uint8_t *joined; /* [size] */
  int njoined;
  int last_joined;
  uint8_t *shutdown; /* [size] */
  int nshutdown;
  struct hora__response *ready, **ready_tail;
  uint64_t ready_since_ns; /* when the oldest response still in `ready` became ready */
  uint64_t ready_bytes;    /* payload of the fusable responses in `ready` */
  bool ready_urgent;       /* `ready` holds something that must not wait */
  uint64_t next_stall_warn_ns;
  struct hora__stragglers *late; /* or NULL */
  uint64_t late_prev_ns;         /* when the last operation noted there came whole */
};

/* negotiate.c */
void hora__ctl_push_ready(struct hora__controller *c, struct hora__response *r);
void hora__ctl_unlink_op(struct hora__controller *c, struct pending_op *op);

/* negotiate_groups.c: the group of a fingerprint, or NULL; the groups
 * among op's variants (at most MAX_VARIANTS) into fp/size; op (decided)
 * parked with its response r until its group is whole; op failing with
 * `full` (the message as sent) and its groups with it; freeing them all. */
struct group *hora__ctl_group_find(struct hora__controller *c, uint64_t fp);
int hora__ctl_variant_groups(const struct pending_op *op, uint64_t *fp, uint32_t *size);
int hora__ctl_park(struct hora__controller *c, struct pending_op *op, struct hora__response *r);
int hora__ctl_fail_op(struct hora__controller *c, struct pending_op *op, int code,
                      const char *full);
void hora__ctl_groups_free(struct hora__controller *c);

#endif
