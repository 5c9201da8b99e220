/* Elastic membership: the processes of an elastic job agree among
 * themselves, with no driver, on who the job's members are after one is
 * lost or one asks to join. The agreement is single-decree Paxos per epoch
 * among the last membership's members, as a state machine without I/O
 * (membership_fsm.h says how it works and why two survivors never end in
 * different memberships); this is its driver: every process keeps a small
 * listener for the whole of its life (its address is exchanged at start-up
 * and travels in every membership), and rank 0 also holds the job's
 * rendezvous port ("the door") where processes ask to join. A side of a
 * partition without a quorum fails, with an error saying so. */
#ifndef HORA_MEMBERSHIP_H
#define HORA_MEMBERSHIP_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/bootstrap/membership_fsm.h"
#include "comm/bootstrap/rendezvous.h"

/* What an agreement ends with: the new membership and where its
 * communicator's rendezvous is (the coordinator's listener). */
struct hora__agreed {
  int rank, size;
  uint64_t epoch;
  char host[64]; /* the coordinator's address */
  int port;
  int listen_fd; /* at the coordinator: its listening socket, else -1 */
  int joined;    /* newcomers in it */
  int lost;      /* members of the previous membership not in it */
};

struct hora__membership;

/* A listener on every interface and the thread serving it. key: the job's
 * secret as the user gave it (HORA_SECRET_FILE or HORA_SECRET), which
 * newcomers know too, or NULL (anyone reaching a listener may take part; a
 * warning says so at start-up). */
int hora__membership_open(const uint8_t *key, struct hora__membership **out);
void hora__membership_close(struct hora__membership *m);
/* The start-up's membership: ids are the ranks, addresses exchanged over
 * the start-up's rendezvous, and a job id drawn by rank 0, which with the
 * secret keys the members' connections. my_ip: this process's data-plane
 * address. */
int hora__membership_start(struct hora__membership *m, struct hora__rdv *rdv, uint64_t epoch,
                           uint32_t my_ip);
/* A membership given whole (tests: a process of another job). */
int hora__membership_start_view(struct hora__membership *m, const struct hora__view *v,
                                uint32_t my_id);
/* The job's rendezvous port, where newcomers knock: rank 0 listens on it
 * (when it can: only one process per host can). 0 closes it. */
void hora__membership_door(struct hora__membership *m, int port);
/* Newcomers waiting for the next commit point (rank 0; elsewhere 0). */
int hora__membership_waiting(struct hora__membership *m);
/* Called (from the listener's thread) when a member asks for a reset while
 * this process is not in one: the runtime then fails its calls, so this
 * process joins the reset too. */
void hora__membership_on_request(struct hora__membership *m, void (*fn)(void *arg, uint32_t id),
                                 void *arg);
/* This process is about to reset (it ends its world first): requests that
 * arrive meanwhile are not news to fail its calls with. */
void hora__membership_expect_reset(struct hora__membership *m);
/* Agrees on the next membership with the others (every member calls it).
 * HORA_ERR_PEER_LOST: no quorum, fewer than HORA_ELASTIC_MIN_SIZE, or this
 * process was left out; the message says which. */
int hora__membership_agree(struct hora__membership *m, struct hora__agreed *out);
/* A process started later: asks the job at host:port to admit it, and
 * waits for a commit point (HORA_ELASTIC_TIMEOUT_SECONDS). */
int hora__membership_join(struct hora__membership *m, const char *host, int port,
                          struct hora__agreed *out);
/* The current membership's number and this process's id in it. */
uint64_t hora__membership_epoch(struct hora__membership *m);
/* Whether `port` on this host is held by a running elastic job's door or
 * another program (bind fails with EADDRINUSE). */
bool hora__port_in_use(int port);
/* A non-blocking connect started; the socket, or -1 with errno. */
int hora__mb_start_connect(uint32_t ip, uint16_t port);

#endif
