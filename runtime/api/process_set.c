/* Process sets (hora.h): making and destroying them, the world as one,
 * and what the sets of a process share. hora_process_set_from_mpi_comm
 * (hora_mpi.h) finds its members in api_mpi.c, built with MPI only, and
 * agrees on them here.
 *
 * A set is a runtime of its own (struct hora__runtime) over its members,
 * who meet at a rendezvous of their own (set_rendezvous): its own bootstrap, connections, shared
 * segment, coordinator thread, negotiation, cache and fusion buffer. It
 * does not borrow the world's connections or coordinator: collectives
 * block the thread that runs them, so two sets sharing a thread or a
 * socket would have to run their operations in one order on every rank
 * they share, or deadlock. Sets that each go at their own pace (the point
 * of them) are given that guarantee only by running apart.
 *
 * Making or destroying one is collective over the world. The world first
 * agrees on what every rank asked for (an allgather, then an allreduce of
 * each rank's verdict), so that a mistake fails on every rank instead of
 * leaving some waiting for the set's start-up; then the members bootstrap the set and
 * the world agrees that every member could. */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/bootstrap/rendezvous.h"
#include "comm/transport/socket.h"
#include "runtime/runtime.h"

struct hora_process_set {
  int id;        /* 0 the world, then 1, 2, ...; -1 for "in none" (from_mpi_comm) */
  int size, rank; /* rank: this rank's in the set, or -1 */
  int *ranks;     /* the members' global ranks, ascending */
  uint64_t made_by; /* the making call's number: destroy compares these */
  struct hora__runtime *rt; /* members only */
  bool destroying; /* under sets_mu: no new user; still told of fatal errors */
  struct hora_process_set *next;
};

/* The sets alive, in the order they were made (a set being destroyed
 * stays listed until its runtime has stopped, so that fatal errors still
 * reach it); making_mu serialises making and destroying (their agreements
 * are numbered). Under sets_mu only the sets' fields and their runtimes'
 * counts are touched, and a runtime's mu taken (pass_fatal): nothing takes
 * sets_mu under an rt->mu. */
static pthread_mutex_t sets_mu = PTHREAD_MUTEX_INITIALIZER;
static struct hora_process_set *sets;
static pthread_mutex_t making_mu = PTHREAD_MUTEX_INITIALIZER;
static int next_id = 1;
static uint64_t calls;
static struct hora_process_set world_set = {.id = 0, .rank = -1};

enum { ASK_CREATE = 1, ASK_FROM_COMM = 2, ASK_DESTROY = 3 };

/* What one rank asked for, as the world's allgather carries it. */
struct ask {
  int64_t status; /* 0, or the error this rank found in its own arguments */
  int64_t what;   /* ASK_* */
  int64_t n;      /* members (destroy: the making call's number) */
  int64_t hash;   /* of the sorted members (destroy: the set's id) */
  int64_t lowest; /* the lowest member, or -1 */
};

static int64_t hash_ranks(const int *r, int n) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < n; i++) {
    h = (h ^ (uint32_t)r[i]) * 1099511628211ull;
  }
  return (int64_t)(h >> 1);
}

static int by_value(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* The world's answer to "did every rank find its arguments good, and do
 * they agree?": the lowest failing rank's code, with a message naming it
 * on the ranks that did not fail themselves. */
static int agree_verdict(const char *call, uint64_t n, int mine, const char *my_msg, int size) {
  enum { CODES = 64 };
  int64_t v = mine != HORA_SUCCESS ? (int64_t)hora_rank() * CODES + (mine % CODES) : INT64_MAX;
  int64_t first = v;
  char name[64];
  snprintf(name, sizeof(name), "hora/process_set/%llu/verdict", (unsigned long long)n);
  int rc = hora_allreduce(name, &v, &first, 1, HORA_INT64, HORA_MIN);
  if (rc != HORA_SUCCESS) {
    return rc;
  }
  if (mine != HORA_SUCCESS) {
    return hora__error(mine, "%s", my_msg);
  }
  if (first != INT64_MAX) {
    int code = (int)(first % CODES);
    return hora__error(code, "%s failed on rank %d (of %d), which has the details: %s", call,
                       (int)(first / CODES), size, hora_strerror(code));
  }
  return HORA_SUCCESS;
}

/* The first half of an agreement: every rank's ask, gathered. */
static int gather_asks(uint64_t n, const struct ask *mine, struct ask *all) {
  char name[64];
  snprintf(name, sizeof(name), "hora/process_set/%llu/ask", (unsigned long long)n);
  return hora_allgather(name, mine, sizeof(*mine) / sizeof(int64_t), HORA_INT64, all);
}

/* The start of a making or destroying call: the running world, and the
 * call's number (its agreements' names), with making_mu held until
 * end_call. NULL, with *rc set, when there is no runtime. */
static struct hora__runtime *begin_call(const char *call, int *rc, uint64_t *call_no) {
  hora__error_clear();
  struct hora__runtime *world = hora__api_running(rc, call);
  if (world) {
    pthread_mutex_lock(&making_mu);
    *call_no = ++calls;
  }
  return world;
}

static int end_call(int rc) {
  pthread_mutex_unlock(&making_mu);
  return hora__api_leave(rc);
}

static const char *call_name(int64_t what) {
  return what == ASK_CREATE      ? "hora_process_set_create"
         : what == ASK_FROM_COMM ? "hora_process_set_from_mpi_comm"
                                 : "hora_process_set_destroy";
}

/* Every rank that found its own arguments good must be making the same
 * call: a MISMATCH naming the first that is not, else `mine`. */
static int same_call(const struct ask *all, int size, int64_t what, int mine, int me) {
  for (int r = 0; r < size && mine == HORA_SUCCESS; r++) {
    if (all[r].status == HORA_SUCCESS && all[r].what != what) {
      mine = hora__error(HORA_ERR_MISMATCH, "%s on rank %d, but rank %d called %s",
                         call_name(what), me, r, call_name(all[r].what));
    }
  }
  return mine;
}

static void handle_free(struct hora_process_set *ps) {
  if (ps) {
    free(ps->ranks);
    free(ps);
  }
}

/* The end of a stopped set: off the list, then its runtime dropped (users
 * counted by hora__api_running_in may still hold it) and its handle freed. */
/* A world ended while sets were alive (an elastic reset): their handles'
 * errors say so. */
static atomic_bool sets_ended;

static void unlist_and_free(struct hora_process_set *ps) {
  pthread_mutex_lock(&sets_mu);
  for (struct hora_process_set **p = &sets; *p; p = &(*p)->next) {
    if (*p == ps) {
      *p = ps->next;
      break;
    }
  }
  pthread_mutex_unlock(&sets_mu);
  hora__instance_release(ps->rt);
  handle_free(ps);
}

/* The members' start-up: the set's lowest member listens, the world learns
 * where (every rank takes part in that allgather, members or not), and the
 * members meet there, proving a key derived from the world's secret. */
static int set_rendezvous(struct hora__runtime *world, uint64_t call_no,
                          struct hora_process_set *ps, bool member) {
  int64_t mine[2] = {0, 0};
  int lfd = -1, rc = HORA_SUCCESS;
  struct sockaddr_in bound;
  if (member && ps->rank == 0) {
    rc = hora__listen_tcp(world->comm->proc->tcp_addr.sin_addr, &lfd, &bound);
    if (rc == HORA_SUCCESS) {
      mine[0] = bound.sin_addr.s_addr;
      mine[1] = ntohs(bound.sin_port);
    }
  }
  int64_t *all = hora__calloc((size_t)world->size, sizeof(mine));
  char name[64];
  snprintf(name, sizeof(name), "hora/process_set/%llu/rendezvous", (unsigned long long)call_no);
  int wrc = all ? hora_allgather(name, mine, 2, HORA_INT64, all) : HORA_ERR_NO_MEMORY;
  if (rc == HORA_SUCCESS) {
    rc = wrc;
  }
  if (rc == HORA_SUCCESS && member) {
    const int64_t *at = all + 2 * ps->ranks[0];
    struct in_addr ip = {(in_addr_t)at[0]};
    char host[INET_ADDRSTRLEN], where[160];
    inet_ntop(AF_INET, &ip, host, sizeof(host));
    snprintf(where, sizeof(where), "process set %d's rendezvous at %s:%d (rank %d)", ps->id, host,
             (int)at[1], ps->ranks[0]);
    struct hora__rdv_tcp_spec spec = {
        .host = host, .port = (int)at[1], .rank = ps->rank, .size = ps->size,
        .key = world->comm->proc->job_secret, .listen_fd = lfd,
        .timeout_s = hora__params.CONNECT_TIMEOUT_SECONDS, .where = where,
        .rank_var = "the set rank", .size_var = "the set size"};
    struct hora__rdv *rdv = NULL;
    lfd = -1; /* the rendezvous owns it now */
    rc = at[1] > 0 ? hora__rdv_open_tcp(&spec, &rdv)
                   : hora__error(HORA_ERR_SYSTEM, "the set's lowest member could not listen");
    if (rc == HORA_SUCCESS) {
      rc = hora__instance_start(rdv, ps->id, ps->ranks, &ps->rt);
      hora__rdv_close(rdv);
    }
  }
  if (lfd >= 0) {
    close(lfd);
  }
  free(all);
  return rc;
}

/* Makes this rank's set over its members (sorted, n of them), then agrees
 * with the world that every member managed. */
static int make_set(const char *call, struct hora__runtime *world, uint64_t call_no, int id,
                    int *members, int n, bool member, hora_process_set **out) {
  struct hora_process_set *ps = hora__calloc(1, sizeof(*ps));
  if (!ps) {
    free(members);
    return HORA_ERR_NO_MEMORY; /* the others fail in the closing agreement */
  }
  ps->id = id;
  ps->size = n;
  ps->rank = -1;
  ps->ranks = members;
  ps->made_by = call_no;
  for (int i = 0; i < n; i++) {
    if (members[i] == world->rank) {
      ps->rank = i;
    }
  }
  int rc = set_rendezvous(world, call_no, ps, member);
  char msg[1024];
  hora__strlcpy(msg, hora__error_message(), sizeof(msg));
  int all = agree_verdict(call, call_no, rc, msg, world->size);
  if (all != HORA_SUCCESS) {
    if (ps->rt) {
      /* Another member could not: this one's coordinator stops without
       * failing the rest of the job. */
      atomic_store(&ps->rt->contained, true);
      hora__runtime_set_fatal(ps->rt, all, "the process set could not be made on every member");
      pthread_mutex_lock(&ps->rt->mu);
      hora__engine_wake_locked(ps->rt);
      pthread_mutex_unlock(&ps->rt->mu);
      hora__instance_stop(ps->rt);
      hora__instance_release(ps->rt);
    }
    handle_free(ps);
    return all;
  }
  pthread_mutex_lock(&sets_mu);
  struct hora_process_set **tail = &sets;
  while (*tail) {
    tail = &(*tail)->next;
  }
  *tail = ps;
  pthread_mutex_unlock(&sets_mu);
  *out = ps;
  return HORA_SUCCESS;
}

HORA_EXTERN int hora_process_set_create(const int *ranks, int n, hora_process_set **out) {
  static const char call[] = "hora_process_set_create";
  int rc = HORA_SUCCESS;
  uint64_t call_no = 0;
  struct hora__runtime *world = begin_call(call, &rc, &call_no);
  if (!world) {
    return rc;
  }
  int mine = HORA_SUCCESS;
  int *sorted = NULL;
  if (out) {
    *out = NULL;
  }
  if (!out) {
    mine = hora__error(HORA_ERR_INVALID_ARG, "%s: ps is NULL", call);
  } else if (!ranks || n <= 0 || n > (1 << 24)) {
    mine = hora__error(HORA_ERR_INVALID_ARG, "%s: %s", call,
                       !ranks ? "ranks is NULL" : "n is out of range");
  } else if (!(sorted = hora__calloc((size_t)n, sizeof(int)))) {
    mine = hora__error(HORA_ERR_NO_MEMORY, "%s: out of memory", call);
  } else {
    memcpy(sorted, ranks, (size_t)n * sizeof(int));
    qsort(sorted, (size_t)n, sizeof(int), by_value);
    for (int i = 0; i < n && mine == HORA_SUCCESS; i++) {
      if (sorted[i] < 0 || sorted[i] >= world->size) {
        mine = hora__error(HORA_ERR_INVALID_ARG, "%s: rank %d is not a rank of the job (0..%d)",
                           call, sorted[i], world->size - 1);
      } else if (i > 0 && sorted[i] == sorted[i - 1]) {
        mine = hora__error(HORA_ERR_INVALID_ARG, "%s: rank %d is listed twice", call, sorted[i]);
      }
    }
  }
  char msg[1024];
  hora__strlcpy(msg, hora__error_message(), sizeof(msg));
  struct ask me = {mine, ASK_CREATE, mine ? 0 : n, mine ? 0 : hash_ranks(sorted, n),
                   mine ? -1 : sorted[0]};
  struct ask *all = hora__calloc((size_t)world->size, sizeof(*all));
  rc = all ? gather_asks(call_no, &me, all) : HORA_ERR_NO_MEMORY;
  if (rc != HORA_SUCCESS) {
    goto out; /* the world itself failed: every rank sees that */
  }
  mine = same_call(all, world->size, ASK_CREATE, mine, world->rank);
  for (int r = 0; r < world->size && mine == HORA_SUCCESS; r++) {
    if (all[r].status == HORA_SUCCESS && (all[r].n != me.n || all[r].hash != me.hash)) {
      mine = hora__error(HORA_ERR_MISMATCH,
                         "%s: rank %d passed other ranks (%lld of them) than rank %d (%d)", call, r,
                         (long long)all[r].n, world->rank, n);
    }
  }
  if (mine != me.status) {
    hora__strlcpy(msg, hora__error_message(), sizeof(msg)); /* found in the asks */
  }
  rc = agree_verdict(call, call_no, mine, msg, world->size);
  if (rc != HORA_SUCCESS) {
    goto out;
  }
  int id = next_id++;
  bool member = bsearch(&world->rank, sorted, (size_t)n, sizeof(int), by_value) != NULL;
  rc = make_set(call, world, call_no, id, sorted, n, member, out);
  sorted = NULL;
out:
  free(all);
  free(sorted);
  return end_call(rc);
}

int hora__process_set_from_members(const char *call, hora__set_members_fn find, const void *arg,
                                   hora_process_set **out) {
  int rc = HORA_SUCCESS;
  uint64_t call_no = 0;
  struct hora__runtime *world = begin_call(call, &rc, &call_no);
  if (!world) {
    return rc;
  }
  int mine = HORA_SUCCESS, n = 0;
  int *members = NULL;
  if (out) {
    *out = NULL;
  } else {
    mine = hora__error(HORA_ERR_INVALID_ARG, "%s: ps is NULL", call);
  }
  if (mine == HORA_SUCCESS) {
    mine = find(call, arg, &members, &n);
  }
  if (mine == HORA_SUCCESS && n > 0) {
    qsort(members, (size_t)n, sizeof(int), by_value);
  }
  if (mine != HORA_SUCCESS) {
    n = 0;
  }
  char msg[1024];
  hora__strlcpy(msg, hora__error_message(), sizeof(msg));
  struct ask me = {mine, ASK_FROM_COMM, n, n ? hash_ranks(members, n) : 0, n ? members[0] : -1};
  struct ask *all = hora__calloc((size_t)world->size, sizeof(*all));
  rc = all ? gather_asks(call_no, &me, all) : HORA_ERR_NO_MEMORY;
  if (rc != HORA_SUCCESS) {
    goto out;
  }
  /* Every member of this rank's communicator must have passed the same one;
   * the sets are then disjoint, and each is numbered by its lowest rank. */
  mine = same_call(all, world->size, ASK_FROM_COMM, mine, world->rank);
  for (int i = 0; i < n && mine == HORA_SUCCESS; i++) {
    const struct ask *a = &all[members[i]];
    if (a->status == HORA_SUCCESS && (a->n != me.n || a->hash != me.hash)) {
      mine = hora__error(HORA_ERR_MISMATCH,
                         "%s: rank %d passed a communicator of %d ranks with rank %d in it, but "
                         "rank %d passed %s",
                         call, world->rank, n, members[i], members[i],
                         a->n ? "another communicator" : "MPI_COMM_NULL");
    }
  }
  if (mine != me.status) {
    hora__strlcpy(msg, hora__error_message(), sizeof(msg)); /* found in the asks */
  }
  rc = agree_verdict(call, call_no, mine, msg, world->size);
  if (rc != HORA_SUCCESS) {
    goto out;
  }
  int id = -1;
  for (int r = 0; r < world->size; r++) {
    if (all[r].n > 0 && all[r].lowest == r) {
      if (n > 0 && r == members[0]) {
        id = next_id;
      }
      next_id++;
    }
  }
  rc = make_set(call, world, call_no, id, members, n, n > 0, out);
  members = NULL;
out:
  free(all);
  free(members);
  return end_call(rc);
}

HORA_EXTERN int hora_process_set_destroy(hora_process_set *ps) {
  static const char call[] = "hora_process_set_destroy";
  int rc = HORA_SUCCESS;
  uint64_t call_no = 0;
  struct hora__runtime *world = begin_call(call, &rc, &call_no);
  if (!world) {
    return rc;
  }
  int mine = HORA_SUCCESS;
  if (!ps) {
    mine = hora__error(HORA_ERR_INVALID_ARG, "%s: ps is NULL", call);
  } else if (ps == &world_set) {
    mine = hora__error(HORA_ERR_INVALID_ARG, "%s: the world cannot be destroyed", call);
  }
  char msg[1024];
  hora__strlcpy(msg, hora__error_message(), sizeof(msg));
  struct ask me = {mine, ASK_DESTROY, mine ? 0 : (int64_t)ps->made_by, mine ? 0 : ps->id, -1};
  struct ask *all = hora__calloc((size_t)world->size, sizeof(*all));
  rc = all ? gather_asks(call_no, &me, all) : HORA_ERR_NO_MEMORY;
  if (rc != HORA_SUCCESS) {
    goto out;
  }
  mine = same_call(all, world->size, ASK_DESTROY, mine, world->rank);
  for (int r = 0; r < world->size && mine == HORA_SUCCESS; r++) {
    if (all[r].status == HORA_SUCCESS && all[r].n != me.n) {
      mine = hora__error(HORA_ERR_MISMATCH,
                         "%s: rank %d destroys process set %d, rank %d set %lld (made by "
                         "another call)",
                         call, world->rank, ps->id, r, (long long)all[r].hash);
    }
  }
  if (mine != me.status) {
    hora__strlcpy(msg, hora__error_message(), sizeof(msg)); /* found in the asks */
  }
  rc = agree_verdict(call, call_no, mine, msg, world->size);
  if (rc != HORA_SUCCESS) {
    goto out;
  }
  pthread_mutex_lock(&sets_mu);
  ps->destroying = true;
  pthread_mutex_unlock(&sets_mu);
  if (ps->rt) {
    /* Collective over the members: each completes what is in flight. */
    hora__instance_stop(ps->rt);
    int fatal = atomic_load(&ps->rt->fatal_code);
    if (fatal != HORA_SUCCESS) {
      rc = hora__error(fatal, "%s", ps->rt->fatal_msg);
    }
  }
  unlist_and_free(ps);
out:
  free(all);
  return end_call(rc);
}

void hora__process_sets_finalize(void) {
  pthread_mutex_lock(&making_mu);
  pthread_mutex_lock(&sets_mu);
  if (sets) {
    atomic_store(&sets_ended, true);
  }
  for (struct hora_process_set *ps = sets; ps; ps = ps->next) {
    ps->destroying = true;
  }
  struct hora_process_set *ps = sets;
  pthread_mutex_unlock(&sets_mu);
  /* (Only making and destroying, under making_mu, change the list.) */
  while (ps) {
    struct hora_process_set *next = ps->next;
    if (ps->rt) {
      hora__instance_stop(ps->rt);
    }
    unlist_and_free(ps);
    ps = next;
  }
  /* The next world numbers from the start, as a process joining it does
   * (the calls' agreements are named by these numbers). */
  next_id = 1;
  calls = 0;
  pthread_mutex_unlock(&making_mu);
}

/* ---- what the sets share ---------------------------------------------------------- */

/* Under rt->mu: hora__instance_stop closes the eventfd under it. */
static void pass_fatal(struct hora__runtime *rt, int code, const char *msg) {
  hora__runtime_set_fatal(rt, code, msg);
  pthread_mutex_lock(&rt->mu);
  atomic_fetch_add_explicit(&rt->submit_seq, 1, memory_order_release);
  if (rt->wake_fd >= 0) {
    uint64_t one = 1;
    ssize_t w = write(rt->wake_fd, &one, sizeof(one));
    (void)w;
  }
  pthread_mutex_unlock(&rt->mu);
}

/* The job is over when any of its sets fails: the others fail too (and
 * tell their members), so no rank waits on a set for a peer that is gone. */
void hora__process_sets_fatal(struct hora__runtime *from, int code, const char *msg) {
  if (from->contained) {
    return;
  }
  char full[1024];
  snprintf(full, sizeof(full), "%s%s", from->label, msg);
  struct hora__runtime *world = hora__world_runtime();
  pthread_mutex_lock(&sets_mu);
  if (world && world != from) {
    pass_fatal(world, code, full);
  }
  for (struct hora_process_set *ps = sets; ps; ps = ps->next) {
    if (ps->rt && ps->rt != from) {
      pass_fatal(ps->rt, code, full);
    }
  }
  pthread_mutex_unlock(&sets_mu);
}

void hora__process_sets_add_stats(hora_stats *s) {
  pthread_mutex_lock(&sets_mu);
  for (struct hora_process_set *ps = sets; ps; ps = ps->next) {
    struct hora__runtime *rt = ps->rt;
    if (!rt) {
      continue;
    }
    hora__stats_add(s, rt);
  }
  pthread_mutex_unlock(&sets_mu);
}

void hora__process_sets_each(void (*fn)(struct hora__runtime *rt, void *arg), void *arg) {
  pthread_mutex_lock(&sets_mu);
  for (struct hora_process_set *ps = sets; ps; ps = ps->next) {
    if (ps->rt) {
      fn(ps->rt, arg);
    }
  }
  pthread_mutex_unlock(&sets_mu);
}

/* The handle is looked up among the live sets before it is read: one
 * destroyed meanwhile (by another thread, or hora_finalize) is refused, and
 * the runtime returned is counted, so it outlives a destroy that begins
 * now. (A destroyed handle's address reused by a set made later is not
 * told apart from it.) */
struct hora__runtime *hora__api_running_in(const hora_process_set *ps, int *rc, const char *call) {
  struct hora__runtime *world = hora__api_running(rc, call);
  if (!world || !ps || ps == &world_set) {
    return world;
  }
  struct hora__runtime *rt = NULL;
  pthread_mutex_lock(&sets_mu);
  const struct hora_process_set *live = sets;
  while (live && live != ps) {
    live = live->next;
  }
  if (!live || ps->destroying) {
    *rc = hora__error(HORA_ERR_INVALID_USAGE, "%s: the process set has been destroyed%s", call,
                      live                ? " (by another thread, meanwhile)"
                      : atomic_load(&sets_ended) ? " (or was never made; hora_elastic_reset ends "
                                                 "every process set: make them again after it)"
                                                 : " (or was never made)");
  } else if (!ps->rt) {
    *rc = hora__error(HORA_ERR_INVALID_USAGE, "%s: rank %d is not a member of process set %d",
                      call, world->rank, ps->id);
  } else {
    rt = ps->rt;
    atomic_fetch_add(&rt->refs, 1);
  }
  pthread_mutex_unlock(&sets_mu);
  if (!rt) {
    hora__api_leave(*rc);
  }
  return rt;
}

int hora__api_leave_in(struct hora__runtime *rt, int rc) {
  if (rt && rt->set_id != 0) {
    hora__instance_release(rt);
  }
  return hora__api_leave(rc);
}

/* ---- the handles' getters --------------------------------------------------------------- */

HORA_EXTERN hora_process_set *hora_process_set_world(void) { return &world_set; }

HORA_EXTERN int hora_process_set_id(const hora_process_set *ps) { return ps ? ps->id : -1; }

HORA_EXTERN int hora_process_set_size(const hora_process_set *ps) {
  return !ps ? -1 : ps == &world_set ? hora_size() : ps->size;
}

HORA_EXTERN int hora_process_set_rank(const hora_process_set *ps) {
  return !ps ? -1 : ps == &world_set ? hora_rank() : ps->rank;
}

HORA_EXTERN int hora_process_set_included(const hora_process_set *ps) {
  return !ps ? 0 : ps == &world_set ? hora_initialized() : ps->rank >= 0;
}

HORA_EXTERN int hora_process_set_ranks(const hora_process_set *ps, int *ranks, int n) {
  if (!ps) {
    return -1;
  }
  int size = hora_process_set_size(ps);
  for (int i = 0; ranks && i < n && i < size; i++) {
    ranks[i] = ps == &world_set ? i : ps->ranks[i];
  }
  return size;
}
