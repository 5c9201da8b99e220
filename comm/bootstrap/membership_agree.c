/* Elastic membership: the agreement (see membership.h for the protocol and
 * why it is safe), as the coordinator; membership_member.c is a member's
 * part. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/bootstrap/membership_impl.h"
#include "comm/transport/socket.h"

/* ---- agreeing: the coordinator --------------------------------------------------- */

/* A voter's fd besides a connection: -1 it has not asked yet; SELF this
 * process; AT_DOOR a newcomer that a membership adopted during this reset
 * names, still waiting at this process's door to be let in (it does not
 * vote; the next commit admits it with the id it was given). */
enum { SELF = -2, AT_DOOR = -3 };

struct voter {
  int fd;          /* the member's connection, or one of the above */
  int probe_fd;    /* a connect in flight to see whether it lives */
  uint64_t probe_since, next_probe;
  bool gone;
  uint64_t promised;
  const char *why_gone;
};

static bool quorum(const struct hora__view *base, const struct voter *v, int *alive) {
  int n = 0;
  for (int i = 0; i < base->n; i++) {
    n += v[i].fd >= 0 || v[i].fd == SELF;
  }
  *alive = n;
  return 2 * n > base->n || (2 * n == base->n && (v[0].fd >= 0 || v[0].fd == SELF));
}

static void fail_voters(struct voter *v, int n, struct queued *joins, int nj, int code,
                        const char *msg) {
  for (int i = 0; i < n; i++) {
    if (v[i].fd >= 0) {
      hora__mb_send_refuse(v[i].fd, code, msg);
    }
  }
  for (int i = 0; i < nj; i++) {
    hora__mb_send_refuse(joins[i].fd, code, msg);
  }
}

static void close_voters(struct voter *v, int n) {
  for (int i = 0; i < n; i++) {
    if (v[i].fd >= 0) {
      close(v[i].fd);
    }
    if (v[i].probe_fd >= 0) {
      close(v[i].probe_fd);
    }
    v[i].fd = v[i].probe_fd = -1;
  }
}

/* What the listener's thread queued (resets, or newcomers' joins), taken. */
struct queued *hora__mb_take_queue(struct hora__membership *m, bool joins, int *n) {
  pthread_mutex_lock(&m->mu);
  struct queued *q = joins ? m->joins : m->resets;
  *n = joins ? m->njoins : m->nresets;
  if (joins) {
    m->joins = NULL;
    m->njoins = m->cap_joins = 0;
  } else {
    m->resets = NULL;
    m->nresets = m->cap_resets = 0;
  }
  pthread_mutex_unlock(&m->mu);
  return q;
}

/* The voters of `from` carried over to `to` (by id; new members have not
 * asked yet); those not in `to` are closed. */
static int remap_voters(struct voter **vp, const struct hora__view *from,
                        const struct hora__view *to) {
  struct voter *nv = hora__calloc((size_t)HORA_MAX(to->n, 1), sizeof(*nv));
  if (!nv) {
    return HORA_ERR_NO_MEMORY;
  }
  for (int k = 0; k < to->n; k++) {
    int old = hora__mb_view_index(from, to->m[k].id);
    nv[k] = old >= 0 ? (*vp)[old] : (struct voter){.fd = -1, .probe_fd = -1};
    if (old >= 0) {
      (*vp)[old].fd = (*vp)[old].probe_fd = -1;
    }
  }
  close_voters(*vp, from->n);
  free(*vp);
  *vp = nv;
  return HORA_SUCCESS;
}

/* A COMMIT(view, build=0): the member records the view as committed. */
static int send_view(int fd, const struct hora__view *v) {
  struct hora__mb_buf b = {0};
  hora__mb_put64(&b, 0);
  hora__mb_put32(&b, 0);
  hora__mb_put32(&b, 0);
  hora__mb_put_view(&b, v);
  int rc = hora__mb_send_msg(fd, M_COMMIT, &b, hora__now_ns() + IO_NS);
  free(b.p);
  return rc;
}

/* Members' requests taken from the queue into the voters of `base`. A
 * request from a member of a newer membership this process is not in
 * ends this process's part (*out_rc). */
static bool take_requests(struct hora__membership *m, struct hora__view *base, struct voter **vp,
                          int *out_rc) {
  bool moved = false;
  int n;
  struct queued *q = hora__mb_take_queue(m, false, &n);
  for (int i = 0; i < n; i++) {
    if (q[i].view.epoch > base->epoch && *out_rc == HORA_SUCCESS) {
      if (hora__mb_view_index(&q[i].view, m->my_id) < 0) {
        *out_rc = hora__error(HORA_ERR_PEER_LOST,
                              "elastic: this process was left out of the job's membership %llu "
                              "(it did not answer in time)", (unsigned long long)q[i].view.epoch);
      } else {
        /* That membership was committed: go on from it. */
        struct hora__view copy = {0};
        if (hora__mb_view_copy(&copy, &q[i].view) != HORA_SUCCESS ||
            remap_voters(vp, base, &copy) != HORA_SUCCESS) {
          hora__mb_view_free(&copy);
          *out_rc = HORA_ERR_NO_MEMORY;
          continue; /* the rest are closed below */
        }
        hora__mb_view_free(base);
        *base = copy;
        moved = true;
      }
    }
    int k = hora__mb_view_index(base, q[i].id);
    bool ok = *out_rc == HORA_SUCCESS && k >= 0 && q[i].id != m->my_id;
    /* A member that missed the commit of the base learns it before it
     * votes: its accepted value from before must not count. */
    if (ok && q[i].view.epoch < base->epoch && send_view(q[i].fd, base) != HORA_SUCCESS) {
      ok = false;
    }
    if (!ok) {
      if (*out_rc == HORA_SUCCESS) {
        char msg[200];
        snprintf(msg, sizeof(msg), "elastic: this process (id %u) is not a member of the job's "
                 "membership %llu: it was left out", q[i].id, (unsigned long long)base->epoch);
        hora__mb_send_refuse(q[i].fd, HORA_ERR_PEER_LOST, msg);
      }
      close(q[i].fd);
    } else {
      struct voter *v = &(*vp)[k];
      if (v->fd >= 0) {
        close(v->fd);
      }
      v->fd = q[i].fd;
      v->promised = q[i].promised;
      v->gone = false;
    }
    free(q[i].view.m);
  }
  free(q);
  return moved;
}

/* Sends one message to every voter that has asked; one that cannot take it
 * is gone. */
static bool tell_voters(struct voter *v, int n, uint32_t type, const struct hora__mb_buf *b) {
  bool all = true;
  uint64_t deadline = hora__now_ns() + IO_NS;
  for (int i = 0; i < n; i++) {
    if (v[i].fd >= 0 && hora__mb_send_msg(v[i].fd, type, b, deadline) != HORA_SUCCESS) {
      close(v[i].fd);
      v[i].fd = -1;
      v[i].gone = true;
      v[i].why_gone = "its connection broke during the reset";
      all = false;
    }
  }
  return all;
}

/* Waits for one answer of `want` from every voter that has asked; `each`
 * reads it. false when one failed (it is then gone, or its NACK raised
 * *promised). */
static bool gather(struct hora__membership *m, struct voter *v, int n, uint32_t want, uint64_t ballot,
                   bool (*each)(struct hora__membership *, struct voter *, struct hora__mb_buf *, void *),
                   void *arg) {
  bool ok = true;
  struct hora__mb_buf b = {0};
  uint64_t deadline = hora__now_ns() + REPLY_NS;
  for (int i = 0; i < n; i++) {
    if (v[i].fd < 0) {
      continue;
    }
    uint32_t type = 0;
    int rc;
    /* Answers to an earlier round (its sends were cut short) are skipped:
     * every answer starts with the ballot it answers. */
    do {
      rc = hora__mb_recv_msg(v[i].fd, &type, &b, deadline);
    } while (rc == HORA_SUCCESS && (type == M_NACK || type == want) && b.len >= 8 &&
             (type == M_NACK ? hora__mb_get64(&b) < ballot : hora__mb_get64(&b) != ballot));
    b.off = 0;
    if (rc == HORA_SUCCESS && type == M_NACK) {
      uint64_t p = hora__mb_get64(&b);
      v[i].promised = HORA_MAX(v[i].promised, p);
      ok = false;
    } else if (rc != HORA_SUCCESS || type != want || !each(m, &v[i], &b, arg)) {
      close(v[i].fd);
      v[i].fd = -1;
      v[i].gone = true;
      v[i].why_gone = "it stopped answering during the reset";
      ok = false;
    }
  }
  free(b.p);
  return ok;
}

struct promises {
  bool stale; /* a member accepted beyond the next membership: our base is old */
  uint64_t best_b;
  struct hora__view best;
  uint64_t epoch; /* of the base: only proposals for the next count */
};

static bool take_promise(struct hora__membership *m, struct voter *v, struct hora__mb_buf *b, void *arg) {
  (void)m;
  struct promises *p = arg;
  (void)hora__mb_get64(b); /* the ballot promised: ours */
  uint64_t ab = hora__mb_get64(b);
  struct hora__view av = {0};
  bool ok = hora__mb_get_view(b, &av);
  if (ok && ab && av.epoch > p->epoch + 1) {
    p->stale = true;
  }
  if (ok && ab > p->best_b && av.epoch == p->epoch + 1) {
    p->best_b = ab;
    hora__mb_view_free(&p->best);
    p->best = av;
  } else {
    hora__mb_view_free(&av);
  }
  (void)v;
  return ok;
}

static bool take_accepted(struct hora__membership *m, struct voter *v, struct hora__mb_buf *b, void *arg) {
  (void)m;
  (void)v;
  return hora__mb_get64(b) == *(uint64_t *)arg;
}

static void probe_step(struct voter *v, const struct hora__member *mem, uint64_t t) {
  if (v->fd >= 0 || v->gone || v->fd == SELF || v->fd == AT_DOOR) {
    return;
  }
  if (v->probe_fd >= 0) {
    struct pollfd pf = {v->probe_fd, POLLOUT, 0};
    if (poll(&pf, 1, 0) > 0) {
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(v->probe_fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == 0 && hora__socket_is_self_connected(v->probe_fd)) {
        err = ECONNREFUSED;
      }
      close(v->probe_fd);
      v->probe_fd = -1;
      if (err) {
        v->gone = true;
        v->why_gone = "its listener refuses connections (the process is gone)";
      } else {
        v->next_probe = t + BEAT_NS;
      }
    } else if (t - v->probe_since > PROBE_NS) {
      close(v->probe_fd);
      v->probe_fd = -1;
      v->gone = true;
      v->why_gone = "its host does not answer";
    }
  } else if (t >= v->next_probe) {
    v->probe_fd = hora__mb_start_connect(mem->ip, mem->port);
    v->probe_since = t;
    if (v->probe_fd < 0) {
      v->gone = true;
      v->why_gone = "it cannot be reached";
    }
  }
}

/* Newcomers waiting at the door, added to those of earlier rounds; one that
 * gave up (its connection closed) is dropped. */
static void take_joins(struct hora__membership *m, struct queued **joins, int *njoins) {
  int n;
  struct queued *q = hora__mb_take_queue(m, true, &n);
  struct queued *all = realloc(*joins, (size_t)(*njoins + n + 1) * sizeof(*all));
  if (!all) {
    hora__mb_drop_queue(q, n);
    free(q);
    return;
  }
  for (int i = 0; i < n; i++) {
    all[(*njoins)++] = q[i];
  }
  free(q);
  *joins = all;
  for (int i = 0; i < *njoins; i++) {
    char c;
    ssize_t r = recv(all[i].fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
      close(all[i].fd);
      free(all[i].view.m);
      all[i--] = all[--(*njoins)];
    }
  }
}

/* The newcomer waiting at the door that `mem` is, by its address; -1 if none. */
static int door_index(const struct queued *joins, int njoins, const struct hora__member *mem) {
  for (int j = 0; j < njoins; j++) {
    if (joins[j].ip == mem->ip && joins[j].port == mem->port) {
      return j;
    }
  }
  return -1;
}

/* Members of `base` given ids from `first_new` on were let in by a
 * membership this reset adopted, committed without telling them (only a
 * membership's builder answers a newcomer). Those still at this process's
 * door are carried into the next one; one that gave up is gone. */
static void mark_at_door(const struct hora__view *base, struct voter *v, uint32_t first_new,
                         const struct queued *joins, int njoins) {
  for (int i = 0; i < base->n; i++) {
    if (base->m[i].id < first_new || v[i].gone || v[i].fd >= 0 || v[i].fd == SELF) {
      continue;
    }
    if (door_index(joins, njoins, &base->m[i]) >= 0) {
      v[i].fd = AT_DOOR;
    } else if (v[i].fd == AT_DOOR) {
      v[i].fd = -1;
      v[i].gone = true;
      v[i].why_gone = "it stopped waiting to be let in";
    }
  }
}

/* HORA_ELASTIC_TEST_CRASH=POINT@ID: this process dies at POINT (tests). */
void hora__mb_crash_if_asked(const struct hora__membership *m, const char *point) {
  const char *v = hora__params.ELASTIC_TEST_CRASH;
  size_t n = strlen(point);
  if (v[0] && strncmp(v, point, n) == 0 && v[n] == '@' && (uint32_t)atoi(v + n + 1) == m->my_id) {
    HORA_WARN("elastic: HORA_ELASTIC_TEST_CRASH=%s: dying now", v);
    raise(SIGKILL);
  }
}

int hora__mb_coordinate(struct hora__membership *m, struct hora__agreed *out) {
  struct hora__view base = {0};
  pthread_mutex_lock(&m->mu);
  int rc = hora__mb_view_copy(&base, &m->view);
  pthread_mutex_unlock(&m->mu);
  if (rc != HORA_SUCCESS) {
    return rc;
  }
  struct voter *v = hora__calloc((size_t)base.n, sizeof(*v));
  if (!v) {
    hora__mb_view_free(&base);
    return HORA_ERR_NO_MEMORY;
  }
  const uint32_t first_new = base.next_id;
  for (int i = 0; i < base.n; i++) {
    v[i].fd = v[i].probe_fd = -1;
  }
  struct queued *joins = NULL;
  int njoins = 0;
  struct hora__mb_buf b = {0};
  struct hora__view next = {0};
  uint64_t wait_until = hora__now_ns() + (uint64_t)(hora__params.ELASTIC_TIMEOUT_SECONDS * 1e9);
  uint64_t last_beat = 0;
  HORA_INFO("elastic: coordinating the reset of membership %llu (%d ranks)",
            (unsigned long long)base.epoch, base.n);
  for (;;) {
    /* Wait until every member has asked or is gone. */
    for (;;) {
      if (take_requests(m, &base, &v, &rc)) {
        /* Members of the newer base may still be on their way. */
        wait_until = hora__now_ns() + (uint64_t)(hora__params.ELASTIC_TIMEOUT_SECONDS * 1e9);
      }
      if (rc != HORA_SUCCESS) {
        goto done;
      }
      int me = hora__mb_view_index(&base, m->my_id);
      if (me < 0) {
        rc = hora__error(HORA_ERR_PEER_LOST, "elastic: this process was left out of membership "
                         "%llu", (unsigned long long)base.epoch);
        goto done;
      }
      v[me].fd = SELF;
      take_joins(m, &joins, &njoins);
      mark_at_door(&base, v, first_new, joins, njoins);
      uint64_t t = hora__now_ns();
      int pending = 0;
      for (int i = 0; i < base.n; i++) {
        probe_step(&v[i], &base.m[i], t);
        if (v[i].fd == -1 && !v[i].gone) {
          if (t >= wait_until) {
            v[i].gone = true;
            v[i].why_gone = "it is alive but did not call hora_elastic_reset in time "
                            "(HORA_ELASTIC_TIMEOUT_SECONDS)";
          } else {
            pending++;
          }
        }
      }
      if (t - last_beat > BEAT_NS) {
        tell_voters(v, base.n, M_BEAT, NULL);
        last_beat = t;
      }
      if (pending == 0) {
        break;
      }
      struct timespec ts = {0, 20 * 1000000};
      nanosleep(&ts, NULL);
    }
    int alive = 0;
    for (int i = 0; i < base.n; i++) {
      if (v[i].gone) {
        HORA_WARN("elastic: rank %d (id %u) of membership %llu is gone: %s", i, base.m[i].id,
                  (unsigned long long)base.epoch, v[i].why_gone);
      }
    }
    char msg[512];
    if (!quorum(&base, v, &alive)) {
      snprintf(msg, sizeof(msg),
               "elastic: only %d of the %d ranks of membership %llu are left: a reset needs more "
               "than half of them (or exactly half including its rank 0), so that the job never "
               "splits in two", alive, base.n, (unsigned long long)base.epoch);
      fail_voters(v, base.n, joins, njoins, HORA_ERR_PEER_LOST, msg);
      rc = hora__error(HORA_ERR_PEER_LOST, "%s", msg);
      goto done;
    }
    if (alive + njoins < hora__params.ELASTIC_MIN_SIZE) {
      snprintf(msg, sizeof(msg), "elastic: only %d ranks are left, and HORA_ELASTIC_MIN_SIZE=%lld",
               alive + njoins, (long long)hora__params.ELASTIC_MIN_SIZE);
      fail_voters(v, base.n, joins, njoins, HORA_ERR_PEER_LOST, msg);
      rc = hora__error(HORA_ERR_PEER_LOST, "%s", msg);
      goto done;
    }
    /* Phase 1: a ballot above every promise. */
    uint64_t top = m->promised;
    for (int i = 0; i < base.n; i++) {
      top = HORA_MAX(top, v[i].promised);
    }
    uint64_t ballot = ((top >> 32) + 1) << 32 | m->my_id;
    m->promised = ballot;
    b.len = 0;
    hora__mb_put64(&b, ballot);
    struct promises pr = {.epoch = base.epoch};
    if (m->accepted_b && m->accepted.epoch == base.epoch + 1) {
      pr.best_b = m->accepted_b;
      hora__mb_view_copy(&pr.best, &m->accepted);
    }
    bool ok = tell_voters(v, base.n, M_PREPARE, &b);
    ok = gather(m, v, base.n, M_PROMISE, ballot, take_promise, &pr) && ok;
    if (pr.stale) {
      hora__mb_view_free(&pr.best);
      snprintf(msg, sizeof(msg), "elastic: a member accepted a membership beyond %llu, which "
               "this coordinator does not know: it gives way", (unsigned long long)base.epoch + 1);
      fail_voters(v, base.n, NULL, 0, HORA_ERR_PEER_LOST, msg);
      rc = hora__error(HORA_ERR_PEER_LOST, "%s", msg);
      goto done;
    }
    if (!ok) {
      hora__mb_view_free(&pr.best);
      continue; /* someone left, or promised a higher ballot: again */
    }
    /* The value: a proposal a quorum may have accepted, else ours. */
    bool adopted = pr.best_b != 0;
    if (adopted) {
      hora__mb_view_free(&next);
      next = pr.best;
    } else {
      hora__mb_view_free(&pr.best);
      hora__mb_view_free(&next);
      next.epoch = base.epoch + 1;
      next.next_id = base.next_id;
      next.m = hora__calloc((size_t)(alive + njoins), sizeof(*next.m));
      if (!next.m) {
        rc = HORA_ERR_NO_MEMORY;
        goto done;
      }
      for (int i = 0; i < base.n; i++) {
        if (v[i].fd >= 0 || v[i].fd == SELF || v[i].fd == AT_DOOR) {
          next.m[next.n++] = base.m[i];
        }
      }
      bool *in_base = hora__calloc((size_t)njoins + 1, 1);
      if (!in_base) {
        rc = HORA_ERR_NO_MEMORY;
        goto done;
      }
      for (int i = 0; i < base.n; i++) {
        int j = v[i].fd == AT_DOOR ? door_index(joins, njoins, &base.m[i]) : -1;
        if (j >= 0) {
          in_base[j] = true;
        }
      }
      for (int j = 0; j < njoins; j++) {
        if (!in_base[j]) {
          next.m[next.n++] = (struct hora__member){next.next_id++, joins[j].ip, joins[j].port};
        }
      }
      free(in_base);
    }
    /* Phase 2. */
    b.len = 0;
    hora__mb_put64(&b, ballot);
    hora__mb_put_view(&b, &next);
    ok = tell_voters(v, base.n, M_PROPOSE, &b);
    ok = gather(m, v, base.n, M_ACCEPTED, ballot, take_accepted, &ballot) && ok;
    if (!ok) {
      continue;
    }
    m->accepted_b = ballot;
    hora__mb_view_copy(&m->accepted, &next);
    hora__mb_crash_if_asked(m, "accepted");
    /* Phase 3. An adopted proposal is committed as it was, then the
     * members still here go on from it. */
    int lfd = -1, port = 0;
    if (!adopted) {
      struct in_addr ip = {m->my_ip};
      struct sockaddr_in bound;
      rc = hora__listen_tcp(ip, &lfd, &bound);
      if (rc != HORA_SUCCESS) {
        fail_voters(v, base.n, joins, njoins, rc, hora__error_message());
        goto done;
      }
      port = ntohs(bound.sin_port);
    }
    b.len = 0;
    hora__mb_put64(&b, ballot);
    hora__mb_put32(&b, adopted ? 0 : 1);
    hora__mb_put32(&b, (uint32_t)port);
    hora__mb_put_view(&b, &next);
    for (int i = 0; i < base.n; i++) {
      if (v[i].fd >= 0 && hora__mb_view_index(&next, base.m[i].id) < 0) {
        hora__mb_send_refuse(v[i].fd, HORA_ERR_PEER_LOST, "elastic: this process was left out of the "
                    "membership a previous coordinator had proposed");
        close(v[i].fd);
        v[i].fd = -1;
      }
    }
    tell_voters(v, base.n, M_COMMIT, &b);
    if (!adopted) {
      for (int j = 0; j < njoins; j++) {
        hora__mb_send_msg(joins[j].fd, M_COMMIT, &b, hora__now_ns() + IO_NS);
      }
    }
    pthread_mutex_lock(&m->mu);
    hora__mb_view_copy(&m->view, &next);
    pthread_mutex_unlock(&m->mu);
    m->accepted_b = 0;
    hora__mb_view_free(&m->accepted);
    if (adopted) {
      /* The voters of the committed membership carry over. */
      rc = remap_voters(&v, &base, &next);
      if (rc != HORA_SUCCESS) {
        goto done;
      }
      hora__mb_view_copy(&base, &next);
      continue;
    }
    int lost = 0;
    for (int i = 0; i < base.n; i++) {
      lost += hora__mb_view_index(&next, base.m[i].id) < 0;
    }
    char host[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &m->my_ip, host, sizeof(host));
    *out = (struct hora__agreed){.rank = hora__mb_view_index(&next, m->my_id), .size = next.n,
                                 .epoch = next.epoch, .port = port, .listen_fd = lfd,
                                 .joined = njoins, .lost = lost};
    hora__strlcpy(out->host, host, sizeof(out->host));
    break;
  }
done:
  close_voters(v, base.n);
  free(v);
  hora__mb_drop_queue(joins, njoins);
  free(joins);
  free(b.p);
  hora__mb_view_free(&next);
  hora__mb_view_free(&base);
  return rc;
}
