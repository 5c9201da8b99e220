/* The in-process transport (mock.h). A receive takes its bytes straight
 * from the send at the same position on the other end, under the link's
 * lock; a send is done when the other end has taken all of it. Each end
 * has an eventfd that the other signals, so a waiting rank sleeps in
 * poll() as it would on a socket; the eventfd is written and read only
 * when its `signaled` flag changes, both under the link's lock (a read of
 * an empty eventfd on every progress call was most of the simulations'
 * system time). It checks the vtable's contract as it
 * goes: a receive must meet a send of the same length.
 *
 * Each end keeps its posted sends twice: its hora__xfer queue, which only
 * its own thread touches, and a list of what the other end may take (the
 * bytes' place and how many are left), which lives in the end itself,
 * under the link's lock. So the other end's thread never reads or writes
 * a poster's hora__xfer: a rank whose collective failed returns with its
 * transfers in flight, their descriptors on a stack that is reused at
 * once, while its neighbour still drains the link. */
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "comm/transport/builtin.h"
#include "comm/transport/mock.h"
#include "comm/transport/net.h"

struct mock_link {
  pthread_mutex_t mu;
  int ends;    /* not yet closed */
  bool broken; /* hora__mock_break, or an end was closed */
  size_t piece;
  struct mock_end *end[2];
};

/* A send as the other end sees it. */
struct mock_send {
  const char *ptr; /* next byte to take */
  size_t left, len;
};

struct mock_end {
  struct hora__conn base;
  struct mock_link *link;
  int side;
  int efd;
  bool signaled; /* under the link's lock: efd holds a count */
  /* Under the link's lock: this end's sends the other has not taken in
   * full, oldest first (a ring buffer), and how many it has taken in full
   * that this end has not yet completed. */
  struct mock_send *sends;
  size_t sends_cap, sends_first, sends_count;
  size_t taken;
};

static struct mock_end *other(struct mock_end *e) { return e->link->end[1 - e->side]; }

/* Under the link's lock. */
static void signal_end(struct mock_end *e) {
  if (e && e->efd >= 0 && !e->signaled) {
    e->signaled = true;
    uint64_t one = 1;
    ssize_t n = write(e->efd, &one, sizeof(one));
    (void)n; /* a full counter still wakes the poller */
  }
}

int hora__mock_pair(int rank_a, int rank_b, size_t piece, hora__conn **a, hora__conn **b) {
  struct mock_link *l = hora__calloc(1, sizeof(*l));
  struct mock_end *ea = hora__calloc(1, sizeof(*ea)), *eb = hora__calloc(1, sizeof(*eb));
  int fa = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), fb = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (!l || !ea || !eb || fa < 0 || fb < 0) {
    free(l);
    free(ea);
    free(eb);
    if (fa >= 0) {
      close(fa);
    }
    if (fb >= 0) {
      close(fb);
    }
    return hora__error(HORA_ERR_NO_MEMORY, "mock transport: no memory or eventfd for a pair");
  }
  pthread_mutex_init(&l->mu, NULL);
  l->ends = 2;
  l->piece = piece;
  struct mock_end *ends[2] = {ea, eb};
  int fds[2] = {fa, fb}, peers[2] = {rank_b, rank_a};
  for (int i = 0; i < 2; i++) {
    ends[i]->base.tp = &hora__transport_mock;
    ends[i]->base.peer = peers[i];
    ends[i]->link = l;
    ends[i]->side = i;
    ends[i]->efd = fds[i];
    l->end[i] = ends[i];
  }
  *a = &ea->base;
  *b = &eb->base;
  return HORA_SUCCESS;
}

void hora__mock_break(hora__conn *conn) {
  struct mock_end *e = (struct mock_end *)conn;
  pthread_mutex_lock(&e->link->mu);
  e->link->broken = true;
  signal_end(e);
  signal_end(other(e));
  pthread_mutex_unlock(&e->link->mu);
}

static int mock_connect(hora__net *net, int fd, int peer, hora__conn **conn) {
  (void)net, (void)peer, (void)conn;
  close(fd);
  return hora__error(HORA_ERR_NOT_SUPPORTED, "the mock transport is made in pairs (hora__mock_pair)");
}

static int mock_establish(hora__net *net, hora__conn *conn, bool *ready, int *fd, short *events) {
  (void)net;
  *ready = true;
  *fd = ((struct mock_end *)conn)->efd;
  *events = 0;
  return HORA_SUCCESS;
}

/* Under the link's lock: room for one more send in e's list. */
static int sends_reserve(struct mock_end *e) {
  if (e->sends_count < e->sends_cap) {
    return HORA_SUCCESS;
  }
  size_t cap = e->sends_cap ? 2 * e->sends_cap : 8;
  struct mock_send *s = hora__malloc(cap * sizeof(*s));
  if (!s) {
    return HORA_ERR_NO_MEMORY;
  }
  for (size_t i = 0; i < e->sends_count; i++) {
    s[i] = e->sends[(e->sends_first + i) % e->sends_cap];
  }
  free(e->sends);
  e->sends = s;
  e->sends_cap = cap;
  e->sends_first = 0;
  return HORA_SUCCESS;
}

static int post(hora__conn *conn, void *buf, size_t len, hora__xfer *x, bool send) {
  struct mock_end *e = (struct mock_end *)conn;
  x->ptr = x->base = buf;
  x->left = x->len = len;
  x->done = len == 0;
  if (x->done) {
    return HORA_SUCCESS;
  }
  pthread_mutex_lock(&e->link->mu);
  if (send) {
    int rc = sends_reserve(e);
    if (rc != HORA_SUCCESS) {
      pthread_mutex_unlock(&e->link->mu);
      return rc;
    }
    e->sends[(e->sends_first + e->sends_count++) % e->sends_cap] =
        (struct mock_send){.ptr = buf, .left = len, .len = len};
    hora__xfer_enqueue(&conn->send_head, &conn->send_tail, x);
  } else {
    hora__xfer_enqueue(&conn->recv_head, &conn->recv_tail, x);
  }
  signal_end(other(e));
  pthread_mutex_unlock(&e->link->mu);
  return HORA_SUCCESS;
}

static int mock_isend(hora__conn *conn, const void *buf, size_t len, hora__xfer *x) {
  return post(conn, (void *)(uintptr_t)buf, len, x, true);
}

static int mock_irecv(hora__conn *conn, void *buf, size_t len, hora__xfer *x) {
  return post(conn, buf, len, x, false);
}

static void pop(hora__xfer **head, hora__xfer **tail) {
  hora__xfer *x = *head;
  x->done = true;
  *head = x->next;
  if (!*head) {
    *tail = NULL;
  }
}

/* Under the link's lock: this end's sends the other has taken in full are
 * done (even when it has closed since: the bytes arrived), then this end's
 * receives take from the other's sends. */
static int move_locked(hora__net *net, struct mock_end *e, bool *progressed) {
  hora__conn *me = &e->base;
  struct mock_end *o = other(e);
  for (; e->taken > 0; e->taken--) {
    hora__xfer *x = me->send_head;
    x->ptr += x->left;
    x->left = 0;
    pop(&me->send_head, &me->send_tail);
    *progressed = true;
  }
  if (e->link->broken && (me->send_head || me->recv_head)) {
    char name[160];
    return hora__error(HORA_ERR_PEER_LOST, "lost %s: the mock link is broken",
                       hora__peer_name(net, me->peer, name, sizeof(name)));
  }
  size_t budget = e->link->piece ? e->link->piece : SIZE_MAX;
  while (o && me->recv_head && o->sends_count > 0 && budget > 0) {
    hora__xfer *r = me->recv_head;
    struct mock_send *s = &o->sends[o->sends_first];
    if (s->len != r->len) {
      return hora__error(HORA_ERR_PROTOCOL,
                         "mock transport: a receive of %zu bytes from rank %d met a send of %zu",
                         r->len, me->peer, s->len);
    }
    size_t n = HORA_MIN(HORA_MIN(r->left, s->left), budget);
    memcpy(r->ptr, s->ptr, n);
    r->ptr += n;
    r->left -= n;
    s->ptr += n;
    s->left -= n;
    budget -= n;
    *progressed = true;
    if (s->left == 0) {
      o->sends_first = (o->sends_first + 1) % o->sends_cap;
      o->sends_count--;
      o->taken++;
      signal_end(o);
    }
    if (r->left == 0) {
      pop(&me->recv_head, &me->recv_tail);
    }
  }
  return HORA_SUCCESS;
}

static int mock_progress(hora__net *net, hora__conn *conn, bool *progressed) {
  struct mock_end *e = (struct mock_end *)conn;
  pthread_mutex_lock(&e->link->mu);
  if (e->signaled) {
    uint64_t count;
    ssize_t n = read(e->efd, &count, sizeof(count)); /* one read takes the whole count */
    (void)n;
    e->signaled = false;
  }
  int rc = move_locked(net, e, progressed);
  pthread_mutex_unlock(&e->link->mu);
  return rc;
}

static int mock_poll_fd(hora__conn *conn, short *events) {
  *events = POLLIN;
  return ((struct mock_end *)conn)->efd;
}

static int mock_reg_mem(hora__net *net, void *buf, size_t len, void **handle) {
  (void)net, (void)buf, (void)len;
  *handle = NULL;
  return HORA_SUCCESS;
}

static int mock_dereg_mem(hora__net *net, void *handle) {
  (void)net, (void)handle;
  return HORA_SUCCESS;
}

static void mock_close(hora__conn *conn) {
  struct mock_end *e = (struct mock_end *)conn;
  struct mock_link *l = e->link;
  pthread_mutex_lock(&l->mu);
  l->broken = true; /* the other end sees a lost peer, as after EOF */
  l->end[e->side] = NULL;
  signal_end(other(e));
  bool last = --l->ends == 0;
  pthread_mutex_unlock(&l->mu);
  close(e->efd);
  free(e->sends);
  free(e);
  if (last) {
    pthread_mutex_destroy(&l->mu);
    free(l);
  }
}

const struct hora__transport hora__transport_mock = {
    .name = "mock",
    .connect = mock_connect,
    .accept = mock_connect,
    .establish = mock_establish,
    .isend = mock_isend,
    .irecv = mock_irecv,
    .progress = mock_progress,
    .poll_fd = mock_poll_fd,
    .reg_mem = mock_reg_mem,
    .dereg_mem = mock_dereg_mem,
    .close = mock_close,
};
