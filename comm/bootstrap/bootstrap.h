/* The bootstrap's steps (bootstrap.c), which comm/communicator runs, and
 * what its files share: the plan of connections and the tables of sockets
 * that connect.c (the plan, the outgoing side) and accept.c (the incoming
 * side) work on. */
#ifndef HORA_BOOTSTRAP_H
#define HORA_BOOTSTRAP_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/bootstrap/rendezvous.h"
#include "comm/comm.h"

/* Strangers. Anyone may connect to a listener, so an accepted connection
 * is held to a deadline and a bound until it has proved the job secret:
 * HELLO_DEADLINE_NS for the whole handshake, and at most HALF_OPEN_MAX of
 * them at once, plus one per connection this rank expects (rank 0 of a
 * large job takes thousands of control connections at once, and needs
 * their descriptors anyway). When the table is full the oldest is dropped,
 * not the newcomer: connections held open (silent, or half a hello) then
 * cannot keep peers out. The latest connection whose hello claims one this
 * rank expects is never dropped for a newcomer, only by its deadline or a
 * wrong proof, so no flood of silent strangers, however fast, pushes a
 * rank's handshake out. A second claim of the same connection is not
 * refused (a stranger sending the rank's hello first, again after each
 * expiry, would lock the rank out): both run, the older one as a plain
 * stranger; to push the rank's own out, a stranger must both forge its
 * claim again and flood the table within the rank's handshake round trip.
 * A peer refused anyway is not lost: the connecting side retries any
 * connection closed before the acknowledgement, until
 * HORA_CONNECT_TIMEOUT_SECONDS. */
#define HALF_OPEN_MAX 64
#define HELLO_DEADLINE_NS 1000000000ull
#define ACCEPT_BATCH 16 /* per listener and turn: handshakes in flight move between batches */
#define RETRY_MIN_NS (10 * 1000000ull)
#define RETRY_MAX_NS (200 * 1000000ull)
#define LISTEN_PAUSE_NS (100 * 1000000ull)
#define REFUSED_FOR_NS (1000 * 1000000ull) /* connections refused this long: the peer is gone */

/* One of this rank's planned connections: outgoing, or incoming once the
 * peer has proved the secret (then only the acknowledgement is left). */
struct pending {
  int fd;
  bool outgoing;
  bool unix_socket;
  bool connecting; /* connect() in progress */
  bool done;
  int peer;
  int kind;
  int attempts;
  uint64_t retry_at;      /* outgoing, fd < 0: when to connect again */
  uint64_t refused_since; /* first of the connection refusals in a row, or 0 */
  int pfd;           /* index in the poll set, -1 when not polled */
  struct hora__hs hs;
  char last_error[200];
};

/* An accepted connection that has not yet proved the secret. */
struct stranger {
  int fd;
  bool unix_socket;
  uint64_t since;
  int pfd;
  bool claim_seen; /* its hello's claim has been compared with the others' */
  bool superseded; /* a newer connection claims the same one */
  struct hora__hs hs;
  char who[96];
};

struct plan {
  hora__comm *c;
  struct pending *socks;
  int nsocks, cap;
  int expected_in;  /* incoming connections still to arrive */
  uint8_t *want_in; /* [size * slots]: 1 while (peer, kind) is expected */
  struct stranger *half; /* [half_max] */
  int nhalf, half_max;
  uint64_t listen_resume_at; /* accepting paused (out of descriptors, no spare left) */
  int refused;
  char first_refused[256];
  uint64_t rng;
  struct pollfd *fds;
  int fds_cap;
};

/* bootstrap.c: the steps, each collective over the rendezvous */
int hora__boot_random_bytes(void *buf, size_t n, const char *what);
int hora__boot_cross_peer(const hora__comm *c, int dir);
/* epoch: this process's proposal; the membership's is the highest. */
int hora__boot_membership(hora__comm *c, struct hora__rdv *rdv, uint64_t epoch);
int hora__boot_secret(hora__comm *c, struct hora__rdv *rdv);
int hora__boot_addresses(hora__comm *c, struct hora__rdv *rdv);
int hora__boot_shm(hora__comm *c, struct hora__rdv *rdv, bool want, bool populate);
/* The key a membership's connections prove: from the job secret, the job
 * id and the epoch, so one of another job or epoch never opens. */
void hora__boot_connection_key(const uint8_t secret[HORA_SECRET_LEN], const uint8_t job_id[8],
                               uint64_t epoch, uint8_t out[HORA_SECRET_LEN]);

/* connect.c */
int hora__boot_connect_all(hora__comm *c, const int *ctrl_peers, int nctrl_peers);
int hora__boot_add_sock(struct plan *p, struct pending s);
size_t hora__boot_slot_of(int peer, int kind);
const char *hora__boot_kind_name(int kind);

/* accept.c */
int hora__boot_pump(int fd, struct hora__hs *hs, int *err);
void hora__boot_refuse(struct plan *p, int i, const char *why);
/* Drops the oldest stranger whose hello claims no expected connection;
 * false when there is none. */
bool hora__boot_drop_oldest(struct plan *p, const char *why);
int hora__boot_step_stranger(struct plan *p, int i);
int hora__boot_step_incoming(struct plan *p, int i);
int hora__boot_accept_from(struct plan *p, int lfd, bool unix_socket);

#endif
