/* Stream-socket transport: TCP between hosts and, for ranks on one host,
 * Unix-domain sockets (same code, half the kernel work of loopback TCP).
 * Transfers are queued per direction and moved with non-blocking
 * send/recv; the coordinator sleeps in poll() on the socket.
 *
 * A connection may have several sockets (HORA_SOCKETS_PER_PEER): then each
 * transfer is cut into one contiguous stripe per socket, the same way at
 * both ends, and every socket works through its stripes of the queued
 * transfers in order, independently of the others; a transfer completes
 * when all its stripes have moved. The sockets are polled as one epoll fd. */
#include <poll.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/transport/builtin.h"
#include "comm/transport/net.h"

struct tcp_stream {
  int fd;
  uint64_t send_seq, recv_seq; /* the transfer it is on, per direction */
  size_t send_off, recv_off;   /* bytes of its stripe of that transfer moved */
  uint32_t events;             /* what the epoll set waits for on it (0: not in it) */
};

struct tcp_conn {
  struct hora__conn base;
  int nstreams; /* 1: transfers move whole over s[0].fd */
  int epfd;     /* with more: all the sockets, polled as one fd */
  uint64_t send_posted, recv_posted; /* sequence numbers handed out */
  struct tcp_stream s[HORA_TCP_STREAMS_MAX];
};

/* A TCP connection is its socket: usable as soon as it is adopted. */
static int tcp_adopt(hora__net *net, int fd, int peer, hora__conn **out) {
  (void)net;
  struct tcp_conn *c = hora__calloc(1, sizeof(*c));
  if (!c) {
    close(fd);
    return HORA_ERR_NO_MEMORY;
  }
  c->base.tp = &hora__transport_tcp;
  c->base.peer = peer;
  c->nstreams = 1;
  c->epfd = -1;
  c->s[0].fd = fd;
  *out = &c->base;
  return HORA_SUCCESS;
}

static int tcp_establish(hora__net *net, hora__conn *conn, bool *ready, int *fd, short *events) {
  (void)net;
  *ready = true;
  *fd = ((struct tcp_conn *)conn)->s[0].fd;
  *events = 0;
  return HORA_SUCCESS;
}

static int tcp_add_stream(hora__conn *conn, int fd) {
  struct tcp_conn *c = (struct tcp_conn *)conn;
  if (conn->tp != &hora__transport_tcp || c->nstreams >= HORA_TCP_STREAMS_MAX ||
      conn->send_head || conn->recv_head || c->send_posted || c->recv_posted) {
    return hora__error(HORA_ERR_INVALID_USAGE, "a socket can join only an unused TCP connection "
                       "of fewer than %d sockets", HORA_TCP_STREAMS_MAX);
  }
  if (c->epfd < 0) {
    c->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (c->epfd < 0) {
      return hora__error_errno(HORA_ERR_SYSTEM, "epoll_create1");
    }
  }
  c->s[c->nstreams++] = (struct tcp_stream){.fd = fd};
  return HORA_SUCCESS;
}

static int tcp_isend(hora__conn *conn, const void *buf, size_t len, hora__xfer *x) {
  struct tcp_conn *c = (struct tcp_conn *)conn;
  x->ptr = x->base = (char *)(uintptr_t)buf;
  x->left = x->len = len;
  x->done = len == 0;
  if (!x->done) {
    x->seq = c->send_posted++;
    hora__xfer_enqueue(&conn->send_head, &conn->send_tail, x);
  }
  return HORA_SUCCESS;
}

static int tcp_irecv(hora__conn *conn, void *buf, size_t len, hora__xfer *x) {
  struct tcp_conn *c = (struct tcp_conn *)conn;
  x->ptr = x->base = buf;
  x->left = x->len = len;
  x->done = len == 0;
  if (!x->done) {
    x->seq = c->recv_posted++;
    hora__xfer_enqueue(&conn->recv_head, &conn->recv_tail, x);
  }
  return HORA_SUCCESS;
}

static void pop(hora__xfer **head, hora__xfer **tail) {
  hora__xfer *x = *head;
  x->done = true;
  *head = x->next;
  if (!*head) {
    *tail = NULL;
  }
}

static int peer_lost(hora__net *net, hora__conn *conn, const char *what, int err) {
  char name[160];
  hora__peer_name(net, conn->peer, name, sizeof(name));
  if (err == 0) {
    return hora__error(HORA_ERR_PEER_LOST, "%s: data connection closed by %s", what, name);
  }
  errno = err;
  return hora__error_errno(HORA_ERR_PEER_LOST, "%s: data connection to %s broke", what, name);
}

/* ---- several sockets -------------------------------------------------------- */

static hora__xfer *find_seq(hora__xfer *head, uint64_t seq) {
  for (hora__xfer *x = head; x; x = x->next) {
    if (x->seq == seq) {
      return x;
    }
  }
  return NULL;
}

/* Moves what socket i can of its stripes, in one direction. */
static int move_stripes(hora__net *net, struct tcp_conn *c, int i, bool sending,
                        bool *progressed) {
  hora__conn *conn = &c->base;
  struct tcp_stream *st = &c->s[i];
  uint64_t *seq = sending ? &st->send_seq : &st->recv_seq;
  size_t *off = sending ? &st->send_off : &st->recv_off;
  for (;;) {
    hora__xfer *x = find_seq(sending ? conn->send_head : conn->recv_head, *seq);
    if (!x) {
      return HORA_SUCCESS;
    }
    size_t a = x->len / (size_t)c->nstreams * (size_t)i + HORA_MIN(x->len % (size_t)c->nstreams, (size_t)i);
    size_t b = a + x->len / (size_t)c->nstreams + ((size_t)i < x->len % (size_t)c->nstreams);
    if (*off == b - a) {
      (*seq)++;
      *off = 0;
      continue;
    }
    char *p = x->base + a + *off;
    ssize_t n = sending ? send(st->fd, p, b - a - *off, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(st->fd, p, b - a - *off, MSG_DONTWAIT);
    if (n > 0) {
      *progressed = true;
      *off += (size_t)n;
      x->left -= (size_t)n;
      continue;
    }
    if (n == 0 && !sending) {
      return peer_lost(net, conn, "recv", 0);
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return HORA_SUCCESS;
    }
    return peer_lost(net, conn, sending ? "send" : "recv", errno);
  }
}

/* Completes, in posting order, the transfers all of whose stripes moved. */
static void complete_striped(struct tcp_conn *c, bool sending) {
  hora__conn *conn = &c->base;
  hora__xfer **head = sending ? &conn->send_head : &conn->recv_head;
  hora__xfer **tail = sending ? &conn->send_tail : &conn->recv_tail;
  while (*head && (*head)->left == 0) {
    uint64_t seq = (*head)->seq;
    pop(head, tail);
    for (int i = 0; i < c->nstreams; i++) {
      uint64_t *s = sending ? &c->s[i].send_seq : &c->s[i].recv_seq;
      size_t *off = sending ? &c->s[i].send_off : &c->s[i].recv_off;
      if (*s <= seq) { /* only empty stripes of it were left */
        *s = seq + 1;
        *off = 0;
      }
    }
  }
}

/* The epoll set holds exactly the sockets with a stripe to move, waiting
 * for what they can do next: an idle socket whose peer closed would
 * otherwise wake the poll loop for ever. */
static int update_interest(struct tcp_conn *c) {
  for (int i = 0; i < c->nstreams; i++) {
    struct tcp_stream *st = &c->s[i];
    uint32_t ev = (find_seq(c->base.send_head, st->send_seq) ? EPOLLOUT : 0) |
                  (find_seq(c->base.recv_head, st->recv_seq) ? EPOLLIN : 0);
    if (ev) {
      ev |= EPOLLRDHUP;
    }
    if (ev == st->events) {
      continue;
    }
    struct epoll_event e = {.events = ev, .data.u32 = (uint32_t)i};
    int op = !ev ? EPOLL_CTL_DEL : !st->events ? EPOLL_CTL_ADD : EPOLL_CTL_MOD;
    if (epoll_ctl(c->epfd, op, st->fd, &e) != 0) {
      return hora__error_errno(HORA_ERR_SYSTEM, "epoll_ctl");
    }
    st->events = ev;
  }
  return HORA_SUCCESS;
}

static int progress_striped(hora__net *net, struct tcp_conn *c, bool *progressed) {
  for (int i = 0; i < c->nstreams; i++) {
    HORA_CHECK(move_stripes(net, c, i, true, progressed));
    HORA_CHECK(move_stripes(net, c, i, false, progressed));
  }
  complete_striped(c, true);
  complete_striped(c, false);
  return update_interest(c);
}

/* ---- progress -------------------------------------------------------------------- */

static int tcp_progress(hora__net *net, hora__conn *conn, bool *progressed) {
  struct tcp_conn *c = (struct tcp_conn *)conn;
  if (c->nstreams > 1) {
    return progress_striped(net, c, progressed);
  }
  while (conn->send_head) {
    hora__xfer *x = conn->send_head;
    ssize_t n = send(c->s[0].fd, x->ptr, x->left, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      *progressed = true;
      x->ptr += n;
      x->left -= (size_t)n;
      if (x->left == 0) {
        pop(&conn->send_head, &conn->send_tail);
      }
      continue;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    }
    return peer_lost(net, conn, "send", errno);
  }
  while (conn->recv_head) {
    hora__xfer *x = conn->recv_head;
    ssize_t n = recv(c->s[0].fd, x->ptr, x->left, MSG_DONTWAIT);
    if (n > 0) {
      *progressed = true;
      x->ptr += n;
      x->left -= (size_t)n;
      if (x->left == 0) {
        pop(&conn->recv_head, &conn->recv_tail);
      }
      continue;
    }
    if (n == 0) {
      return peer_lost(net, conn, "recv", 0);
    }
    if (errno == EINTR) {
      continue;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      break;
    }
    return peer_lost(net, conn, "recv", errno);
  }
  return HORA_SUCCESS;
}

static int tcp_poll_fd(hora__conn *conn, short *events) {
  struct tcp_conn *c = (struct tcp_conn *)conn;
  if (c->nstreams > 1) {
    /* progress_striped, which always runs before the poll, set the
     * epoll interest. */
    *events = POLLIN;
    return c->epfd;
  }
  *events = (short)((conn->recv_head ? POLLIN : 0) | (conn->send_head ? POLLOUT : 0) | POLLRDHUP);
  return c->s[0].fd;
}

static int tcp_reg_mem(hora__net *net, void *buf, size_t len, void **handle) {
  (void)net;
  (void)buf;
  (void)len;
  *handle = NULL;
  return HORA_SUCCESS;
}

static int tcp_dereg_mem(hora__net *net, void *handle) {
  (void)net;
  (void)handle;
  return HORA_SUCCESS;
}

static void tcp_close(hora__conn *conn) {
  struct tcp_conn *c = (struct tcp_conn *)conn;
  for (int i = 0; i < c->nstreams; i++) {
    if (c->s[i].fd >= 0) {
      close(c->s[i].fd);
    }
  }
  if (c->epfd >= 0) {
    close(c->epfd);
  }
  free(c);
}

const struct hora__transport hora__transport_tcp = {
    .name = "tcp",
    .connect = tcp_adopt,
    .accept = tcp_adopt,
    .establish = tcp_establish,
    .isend = tcp_isend,
    .irecv = tcp_irecv,
    .progress = tcp_progress,
    .poll_fd = tcp_poll_fd,
    .reg_mem = tcp_reg_mem,
    .dereg_mem = tcp_dereg_mem,
    .add_stream = tcp_add_stream,
    .close = tcp_close,
};
