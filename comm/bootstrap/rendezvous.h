/* The rendezvous: what start-up needs from outside the job. It gives this
 * process its rank and the job's size, then moves small records between
 * all of them (an allgather; a barrier is an empty one). Everything else
 * the bootstrap learns (hosts, addresses, the job secret, the settings
 * check) it learns through these records, so no step after the choice of
 * rendezvous depends on MPI.
 *
 *   mpi     MPI_Allgather over a duplicate of the launcher's communicator
 *   tcp     rank 0 listens at HORA_RENDEZVOUS=host:port; the others
 *           connect, prove the secret (when there is one), claim their rank
 *           and exchange records through rank 0
 *   env     tcp at MASTER_ADDR:MASTER_PORT with torchrun's RANK, WORLD_SIZE
 *   slurm   tcp on the step's first node with SLURM_PROCID, SLURM_NTASKS
 *   single  one process, no peers
 *
 * Process sets use tcp too: the set's lowest member listens, and the world
 * tells every member where. The mpi kind is opened through
 * rendezvous_mpi.h and exists only in a build with MPI; nothing here needs
 * mpi.h. */
#ifndef HORA_RENDEZVOUS_H
#define HORA_RENDEZVOUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/transport/handshake.h"

enum hora__rdv_kind { HORA_RDV_SINGLE, HORA_RDV_MPI, HORA_RDV_TCP, HORA_RDV_ENV, HORA_RDV_SLURM };

/* The start-up this process would use, read from its environment. */
struct hora__rdv_choice {
  enum hora__rdv_kind kind;
  char why[256];      /* which variables decided it */
  int rank, size;     /* -1 where MPI tells */
  char host[256];     /* the rendezvous address (tcp-like kinds) */
  int port;
  char where[400];    /* the variables naming the address, for messages */
  char rank_var[24], size_var[24];
  uint8_t secret[HORA_SECRET_LEN]; /* from HORA_SECRET_FILE or HORA_SECRET */
  bool has_secret;
  char secret_from[32]; /* which of them */
};

const char *hora__rdv_kind_name(enum hora__rdv_kind kind);
/* Reads HORA_BOOTSTRAP and the launchers' variables. Fails (naming the
 * variable and its value) on a value that cannot be right, and in a build
 * without MPI where the choice is mpi; never starts anything.
 * `mpi_running`: the program has MPI initialised already. */
int hora__rdv_choose(bool mpi_running, struct hora__rdv_choice *out);
/* Whether an MPI launcher started this process (*var: the variable that
 * says so). */
bool hora__rdv_mpi_launched(const char **var);
/* The job's secret from HORA_SECRET_FILE (owner-only file) or HORA_SECRET. */
int hora__rdv_load_secret(struct hora__rdv_choice *c);
/* The first node of a Slurm node list ("h[01-04,07],g2" -> "h01"). */
int hora__slurm_first_node(const char *list, char *out, size_t n);

struct hora__rdv;
struct hora__rdv_ops {
  int (*allgather)(struct hora__rdv *r, const void *mine, size_t len, void *all);
  /* NULL: hora__rdv_bcast goes through allgather. */
  int (*bcast)(struct hora__rdv *r, int root, void *buf, size_t len);
  void (*close)(struct hora__rdv *r);
};

struct hora__rdv {
  const struct hora__rdv_ops *ops;
  enum hora__rdv_kind kind;
  int rank, size;
  /* A secret every member proved (tcp) or was given (MPI needs none):
   * the job secret is derived from it, and never sent. */
  bool has_key;
  uint8_t key[HORA_SECRET_LEN];
  void *impl;
};

/* What a tcp rendezvous needs. */
struct hora__rdv_tcp_spec {
  const char *host; /* rank 0's address (others connect to it) */
  int port;
  int rank, size;
  const uint8_t *key; /* HORA_SECRET_LEN bytes, or NULL: nothing to prove */
  int listen_fd;      /* rank 0: a listener made already, or -1 to bind the port */
  double timeout_s;   /* for reaching rank 0 and for each exchange */
  const char *where;  /* "HORA_RENDEZVOUS=h:p", for messages */
  const char *rank_var, *size_var;
};

/* The handshake's size field at the listeners of a job's rendezvous port:
 * the start-up rendezvous, then the elastic door (membership.c). They
 * differ so that a newcomer reaching a job that still starts is turned
 * away as a stranger to this listener, and knocks again, instead of
 * concluding that the job holds another secret. */
#define HORA_RDV_HS_SIZE 2
#define HORA_DOOR_HS_SIZE 3

int hora__rdv_open_single(struct hora__rdv **out);
int hora__rdv_open_tcp(const struct hora__rdv_tcp_spec *spec, struct hora__rdv **out);
/* Opens the rendezvous a choice names; not mpi (rendezvous_mpi.h opens
 * that one, over the program's communicator). */
int hora__rdv_open(const struct hora__rdv_choice *c, double timeout_s, struct hora__rdv **out);
void hora__rdv_close(struct hora__rdv *r);

/* Collective helpers on top of allgather. */
int hora__rdv_allgather(struct hora__rdv *r, const void *mine, size_t len, void *all);
/* Every rank learns whether the step failed anywhere: a failing rank keeps
 * its own error, the others name the lowest failing rank. */
int hora__rdv_agree(struct hora__rdv *r, int rc, const char *step);
/* The minimum of one int over the ranks, each of which must send one from
 * lo to hi: another is HORA_ERR_PROTOCOL naming the rank and `what`. */
int hora__rdv_min(struct hora__rdv *r, int mine, int lo, int hi, const char *what, int *min);
/* root's len bytes to every rank. */
int hora__rdv_bcast(struct hora__rdv *r, int root, void *buf, size_t len);

#endif
