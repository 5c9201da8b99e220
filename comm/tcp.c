/* Stream-socket transport: TCP between hosts and, for ranks on one host,
 * Unix-domain sockets (same code, half the kernel work of loopback TCP).
 * Transfers are queued per direction and moved with non-blocking
 * send/recv; the coordinator sleeps in poll() on the socket. */
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm.h"

struct tcp_conn {
  struct hora__conn base;
  int fd;
};

static int tcp_adopt_socket(hora__comm *comm, int fd, int peer, hora__conn **out) {
  (void)comm;
  struct tcp_conn *c = hora__calloc(1, sizeof(*c));
  if (!c) {
    return HORA_ERR_NO_MEMORY;
  }
  c->base.tp = &hora__transport_tcp;
  c->base.peer = peer;
  c->fd = fd;
  *out = &c->base;
  return HORA_SUCCESS;
}

static void enqueue(hora__xfer **head, hora__xfer **tail, hora__xfer *x) {
  x->next = NULL;
  if (*tail) {
    (*tail)->next = x;
  } else {
    *head = x;
  }
  *tail = x;
}

static int tcp_isend(hora__conn *conn, const void *buf, size_t len, hora__xfer *x) {
  x->ptr = (char *)(uintptr_t)buf;
  x->left = len;
  x->done = len == 0;
  if (!x->done) {
    enqueue(&conn->send_head, &conn->send_tail, x);
  }
  return HORA_SUCCESS;
}

static int tcp_irecv(hora__conn *conn, void *buf, size_t len, hora__xfer *x) {
  x->ptr = buf;
  x->left = len;
  x->done = len == 0;
  if (!x->done) {
    enqueue(&conn->recv_head, &conn->recv_tail, x);
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

static int peer_lost(hora__comm *comm, hora__conn *conn, const char *what, int err) {
  char name[160];
  hora__peer_name(comm, conn->peer, name, sizeof(name));
  if (err == 0) {
    return hora__error(HORA_ERR_PEER_LOST, "%s: data connection closed by %s", what, name);
  }
  errno = err;
  return hora__error_errno(HORA_ERR_PEER_LOST, "%s: data connection to %s broke", what, name);
}

static int tcp_progress(hora__comm *comm, hora__conn *conn, bool *progressed) {
  struct tcp_conn *c = (struct tcp_conn *)conn;
  while (conn->send_head) {
    hora__xfer *x = conn->send_head;
    ssize_t n = send(c->fd, x->ptr, x->left, MSG_NOSIGNAL | MSG_DONTWAIT);
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
    return peer_lost(comm, conn, "send", errno);
  }
  while (conn->recv_head) {
    hora__xfer *x = conn->recv_head;
    ssize_t n = recv(c->fd, x->ptr, x->left, MSG_DONTWAIT);
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
      return peer_lost(comm, conn, "recv", 0);
    }
    if (errno == EINTR) {
      continue;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      break;
    }
    return peer_lost(comm, conn, "recv", errno);
  }
  return HORA_SUCCESS;
}

static int tcp_poll_fd(hora__conn *conn, short *events) {
  struct tcp_conn *c = (struct tcp_conn *)conn;
  *events = (short)((conn->recv_head ? POLLIN : 0) | (conn->send_head ? POLLOUT : 0) | POLLRDHUP);
  return c->fd;
}

static int tcp_reg_mem(hora__comm *comm, void *buf, size_t len, void **handle) {
  (void)comm;
  (void)buf;
  (void)len;
  *handle = NULL;
  return HORA_SUCCESS;
}

static int tcp_dereg_mem(hora__comm *comm, void *handle) {
  (void)comm;
  (void)handle;
  return HORA_SUCCESS;
}

static void tcp_close(hora__conn *conn) {
  struct tcp_conn *c = (struct tcp_conn *)conn;
  if (c->fd >= 0) {
    close(c->fd);
  }
  free(c);
}

const struct hora__transport hora__transport_tcp = {
    .name = "tcp",
    .adopt_socket = tcp_adopt_socket,
    .isend = tcp_isend,
    .irecv = tcp_irecv,
    .progress = tcp_progress,
    .poll_fd = tcp_poll_fd,
    .reg_mem = tcp_reg_mem,
    .dereg_mem = tcp_dereg_mem,
    .close = tcp_close,
};
