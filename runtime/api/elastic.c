/* Elastic training: the public calls (hora_elastic_reset, _commit, _joined,
 * _epoch) and elastic's share of the life cycle. The agreement itself is
 * comm/bootstrap/membership.c; here the world is ended, the agreed
 * membership built (hora__world_rebuild_locked) and rank 0 given the door
 * newcomers knock at.
 *
 * Lock order: the life cycle's (hora__lifecycle_lock), then the membership's
 * own (inside hora__membership_*; reset_requested runs under it), then the
 * world's rt->mu. */
#include <arpa/inet.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/bootstrap/membership.h"
#include "comm/bootstrap/rendezvous.h"
#include "comm/comm.h"
#include "runtime/observe/metrics.h"
#include "runtime/runtime.h"

/* Lives across memberships, and past a reset that failed for good until
 * hora_finalize; read and written under the life cycle's lock only:
 * hora_finalize frees it. */
static struct hora__membership *membership;
static int door_port;          /* the job's rendezvous port, where newcomers knock */
static bool has_secret;
static uint8_t secret[HORA_SECRET_LEN];
static _Atomic bool change_pending; /* hora_elastic_commit saw newcomers */
static _Atomic bool joined;         /* this process came to a running job */
static _Atomic bool lost_members;   /* a reset left processes out */

/* From the listener's thread: a member asks for a reset that this process
 * has not noticed (the news of a loss had not reached it): fail its calls,
 * so it calls hora_elastic_reset too. */
static void reset_requested(void *arg, uint32_t id) {
  (void)arg;
  struct hora__runtime *rt = hora__world_runtime();
  if (!rt) {
    return;
  }
  char msg[200];
  snprintf(msg, sizeof(msg), "elastic: the member with id %u asked for a membership reset (a peer "
           "was lost): call hora_elastic_reset", id);
  pthread_mutex_lock(&rt->mu);
  if (!rt->abort_asked) {
    rt->abort_asked = true;
    rt->abort_code = HORA_ERR_PEER_LOST;
    hora__strlcpy(rt->abort_reason, msg, sizeof(rt->abort_reason));
    atomic_fetch_add_explicit(&rt->submit_seq, 1, memory_order_release);
    hora__engine_wake_locked(rt);
  }
  pthread_mutex_unlock(&rt->mu);
}

static int door_of(const struct hora__rdv_choice *c) {
  if (c->kind == HORA_RDV_TCP || c->kind == HORA_RDV_ENV || c->kind == HORA_RDV_SLURM) {
    return c->port;
  }
  /* Under MPI, HORA_RENDEZVOUS tells newcomers where to knock. */
  const char *colon = strrchr(hora__params.RENDEZVOUS, ':');
  return colon ? atoi(colon + 1) : 0;
}

/* drawn: under MPI, the secret rank 0 drew at start-up, or NULL. */
static int open_membership(const struct hora__rdv_choice *choice, const uint8_t *drawn) {
  struct hora__rdv_choice c = *choice;
  if (!c.has_secret && c.kind == HORA_RDV_MPI) {
    /* MPI carried its own secret at start-up; newcomers, who come without
     * MPI, prove the one the user gives. Without one the members prove
     * the drawn one, and no newcomer can join. */
    HORA_CHECK(hora__rdv_load_secret(&c));
    if (!c.has_secret && drawn) {
      memcpy(c.secret, drawn, sizeof(c.secret));
      c.has_secret = true;
    }
  }
  has_secret = c.has_secret;
  if (has_secret) {
    memcpy(secret, c.secret, sizeof(secret));
  }
  OPENSSL_cleanse(&c, sizeof(c));
  if (!has_secret && !hora__params.INSECURE) {
    return hora__error(HORA_ERR_INVALID_USAGE,
                       "elastic: HORA_ELASTIC=1 without a secret: anyone who reaches the job's "
                       "ports could join it or speak for its members. Give every process the "
                       "same HORA_SECRET_FILE (mode 0600) or HORA_SECRET (docs/launching.md, "
                       "Elastic training), or set HORA_INSECURE=1 to run without one");
  }
  door_port = door_of(choice);
  int rc = hora__membership_open(has_secret ? secret : NULL, &membership);
  if (rc == HORA_SUCCESS) {
    hora__membership_on_request(membership, reset_requested, NULL);
  }
  return rc;
}

int hora__elastic_begin(struct hora__rdv *rdv, struct hora__runtime *rt,
                        const struct hora__rdv_choice *choice) {
  if (!hora__params.ELASTIC) {
    return HORA_SUCCESS;
  }
  int rc = HORA_SUCCESS;
  if (!membership) {
    rc = open_membership(choice, rt->comm->proc->job_secret);
  }
  if (rc == HORA_SUCCESS) {
    rc = hora__membership_start(membership, rdv, rt->comm->proc->epoch,
                                rt->comm->proc->tcp_addr.sin_addr.s_addr);
  }
  rc = hora__rdv_agree(rdv, rc, "elastic membership");
  if (rc == HORA_SUCCESS) {
    if (rt->rank == 0 && !has_secret) {
      HORA_WARN("elastic: HORA_INSECURE=1: any process reaching the door may join this job, and "
                "one on a member's host may speak for that member");
    }
    hora__elastic_rebuilt(rt);
  }
  return rc;
}

void hora__elastic_rebuilt(struct hora__runtime *rt) {
  if (membership) {
    hora__membership_door(membership, rt->rank == 0 ? door_port : 0);
  }
}

bool hora__elastic_lost_members(void) { return atomic_load(&lost_members); }

void hora__elastic_quiet(void) {
  if (membership) {
    /* Waits out a callback in progress (it runs under the same lock). */
    hora__membership_on_request(membership, NULL, NULL);
  }
}

bool hora__elastic_open(void) { return membership != NULL; }

void hora__elastic_end(void) {
  hora__membership_close(membership);
  membership = NULL;
  memset(secret, 0, sizeof(secret));
  /* A later hora_init starts afresh. */
  atomic_store(&change_pending, false);
  atomic_store(&joined, false);
  atomic_store(&lost_members, false);
}

bool hora__elastic_is_newcomer(const struct hora__rdv_choice *c) {
  if (!hora__params.ELASTIC ||
      !(c->kind == HORA_RDV_TCP || c->kind == HORA_RDV_ENV || c->kind == HORA_RDV_SLURM)) {
    return false;
  }
  return c->rank < 0 || (c->rank == 0 && hora__port_in_use(c->port));
}

/* Builds the world the agreement named. */
static int build_agreed(const struct hora__agreed *a) {
  char where[160];
  snprintf(where, sizeof(where), "elastic membership %llu at %s:%d", (unsigned long long)a->epoch,
           a->host, a->port);
  struct hora__rdv_tcp_spec spec = {
      .host = a->host, .port = a->port, .rank = a->rank, .size = a->size,
      .key = has_secret ? secret : NULL, .listen_fd = a->listen_fd,
      .timeout_s = HORA_MIN(hora__params.CONNECT_TIMEOUT_SECONDS, hora__params.ELASTIC_TIMEOUT_SECONDS),
      .where = where,
      .rank_var = "rank", .size_var = "size"};
  int rc = hora__world_rebuild_locked(&spec);
  struct hora__runtime *rt = hora__world_runtime();
  if (rc == HORA_SUCCESS && rt) {
    if (a->lost > 0) {
      atomic_store(&lost_members, true);
    }
    hora__elastic_rebuilt(rt);
    HORA_WARN("elastic: membership %llu: this process is rank %d of %d (%d lost, %d joined)",
              (unsigned long long)a->epoch, a->rank, a->size, a->lost, a->joined);
  }
  return rc;
}

/* Builds what was agreed (*a); when a member of it died before the build,
 * agrees again without it, and builds that. */
static int build_or_agree_again(struct hora__agreed *a) {
  int rc = HORA_SUCCESS;
  for (int attempt = 1;; attempt++) {
    rc = build_agreed(a);
    if (rc == HORA_SUCCESS || attempt == 8 ||
        (rc != HORA_ERR_PEER_LOST && rc != HORA_ERR_TIMEOUT)) {
      return rc;
    }
    HORA_WARN("elastic: building membership %llu failed (%s); agreeing again",
              (unsigned long long)a->epoch, hora__error_message());
    hora__membership_expect_reset(membership);
    hora__error_clear();
    rc = hora__membership_agree(membership, a);
    if (rc != HORA_SUCCESS) {
      return rc; /* no quorum, too few, left out: final */
    }
  }
}

int hora__elastic_join_locked(const struct hora__rdv_choice *choice) {
  HORA_INFO("elastic: asking the job at %s to admit this process", choice->where);
  int rc = membership ? HORA_SUCCESS : open_membership(choice, NULL);
  struct hora__agreed a;
  if (rc == HORA_SUCCESS) {
    rc = hora__membership_join(membership, choice->host, choice->port, &a);
  }
  if (rc == HORA_SUCCESS) {
    /* Admitted, it is a member: it agrees again like the others if needed. */
    rc = build_or_agree_again(&a);
  }
  if (rc != HORA_SUCCESS) {
    char msg[1024];
    hora__strlcpy(msg, hora__error_message(), sizeof(msg));
    hora__elastic_end();
    return hora__error(rc, "%s", msg);
  }
  atomic_store(&joined, true);
  return HORA_SUCCESS;
}

/* HORA_SUCCESS when `call` may use the membership (the world may be gone:
 * a reset failed for good), else why not. Caller holds the life cycle's lock. */
static int usable_locked(const char *call) {
  if (!membership && !hora__world_runtime()) {
    return hora__error(HORA_ERR_INVALID_USAGE, "%s: hora is not running (hora_init has not "
                       "been called, or hora_finalize has)", call);
  }
  if (!hora__params.ELASTIC || !membership) {
    return hora__error(HORA_ERR_INVALID_USAGE, "%s: the job is not elastic (HORA_ELASTIC=1 at "
                       "start-up)", call);
  }
  return HORA_SUCCESS;
}

HORA_EXTERN int hora_elastic_reset(void) {
  hora__error_clear();
  hora__lifecycle_lock();
  int usable = usable_locked("hora_elastic_reset");
  if (usable != HORA_SUCCESS) {
    hora__lifecycle_unlock();
    return usable;
  }
  struct hora__runtime *rt = hora__world_runtime();
  if (rt && atomic_load(&rt->fatal_code) == HORA_SUCCESS && !rt->abort_asked &&
      !atomic_load(&change_pending)) {
    hora__lifecycle_unlock();
    return hora__error(HORA_ERR_INVALID_USAGE,
                       "hora_elastic_reset: nothing to reset: no peer was lost and "
                       "hora_elastic_commit reported no change");
  }
  uint64_t t0 = hora__now_ns();
  /* From now on, requests are not news that should fail the world's calls:
   * the world is about to be freed. */
  hora__membership_expect_reset(membership);
  /* The old membership ends first: its connections and segment go. */
  (void)hora__world_rebuild_locked(NULL);
  hora__error_clear();
  struct hora__agreed a;
  int rc = hora__membership_agree(membership, &a);
  if (rc == HORA_SUCCESS) {
    rc = build_or_agree_again(&a);
  }
  if (rc == HORA_SUCCESS) {
    atomic_store(&change_pending, false);
    hora__metrics_event(HORA__EV_ELASTIC_RESET);
    HORA_INFO("elastic: reset in %.3f s", (double)(hora__now_ns() - t0) * 1e-9);
  }
  hora__lifecycle_unlock();
  return rc;
}

HORA_EXTERN int hora_elastic_commit(int *changed) {
  hora__error_clear();
  if (!changed) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_elastic_commit: changed is NULL");
  }
  *changed = 0;
  hora__lifecycle_lock();
  int rc = usable_locked("hora_elastic_commit");
  struct hora__runtime *rt = hora__world_runtime();
  if (rc == HORA_SUCCESS && !rt) {
    rc = hora__error(HORA_ERR_INVALID_USAGE, "hora_elastic_commit: no membership is running: the "
                     "last hora_elastic_reset failed (call it again, or hora_finalize)");
  }
  /* rt lives while the lock is held: only the life cycle frees it. */
  int32_t waiting = rc == HORA_SUCCESS && rt->rank == 0 ? hora__membership_waiting(membership) : 0;
  hora__lifecycle_unlock();
  if (rc != HORA_SUCCESS) {
    return rc;
  }
  /* Not under the lock: a collective, which hora_finalize may have to end. */
  rc = hora_allreduce("hora.elastic.commit", &waiting, &waiting, 1, HORA_INT32, HORA_MAX);
  if (rc == HORA_SUCCESS && waiting > 0) {
    atomic_store(&change_pending, true);
    *changed = 1;
  }
  return rc;
}

/* An atomic, cleared when the membership ends: no lock needed. */
HORA_EXTERN int hora_elastic_joined(void) { return atomic_load(&joined) ? 1 : 0; }

HORA_EXTERN int hora_elastic_epoch(void) {
  hora__lifecycle_lock();
  int e = membership && hora__world_runtime() ? (int)hora__membership_epoch(membership) : -1;
  hora__lifecycle_unlock();
  return e;
}
