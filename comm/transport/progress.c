/* Driving transfers to completion: progress every busy connection, and
 * sleep in poll() when nothing can move, after a bounded spin. */
#include <poll.h>
#include <sched.h>
#include <stdio.h>

#include "base/log.h"
#include "comm/transport/net.h"

const char *hora__peer_name(const hora__net *net, int rank, char *buf, size_t n) {
  if (net && net->peers && rank >= 0 && rank < net->size) {
    snprintf(buf, n, "rank %d (host %s, pid %d)", net->names ? net->names[rank] : rank,
             net->peers[rank].host, (int)net->peers[rank].pid);
  } else if (net && net->names && rank >= 0 && rank < net->size) {
    snprintf(buf, n, "rank %d", net->names[rank]);
  } else {
    snprintf(buf, n, "rank %d", rank);
  }
  return buf;
}

static void activate(hora__net *net, hora__conn *conn) {
  if (!conn->active) {
    conn->active = true;
    conn->active_next = net->active;
    net->active = conn;
  }
}

int hora__isend(hora__net *net, hora__conn *conn, const void *buf, size_t len, hora__xfer *x) {
  HORA_CHECK(conn->tp->isend(conn, buf, len, x));
  if (!x->done) {
    activate(net, conn);
  }
  return HORA_SUCCESS;
}

int hora__irecv(hora__net *net, hora__conn *conn, void *buf, size_t len, hora__xfer *x) {
  HORA_CHECK(conn->tp->irecv(conn, buf, len, x));
  if (!x->done) {
    activate(net, conn);
  }
  return HORA_SUCCESS;
}

int hora__progress(hora__net *net, bool *progressed) {
  hora__conn **link = &net->active;
  while (*link) {
    hora__conn *c = *link;
    HORA_CHECK(c->tp->progress(net, c, progressed));
    if (!c->send_head && !c->recv_head && !c->pending) {
      c->active = false;
      *link = c->active_next;
    } else {
      link = &c->active_next;
    }
  }
  return HORA_SUCCESS;
}

int hora__service_run(hora__net *net) {
  net->service_due_ns = hora__now_ns() + net->service_interval_ns;
  return net->service ? net->service(net->service_arg) : HORA_SUCCESS;
}

#define MAX_POLL 64

int hora__progress_wait(hora__net *net) {
  bool progressed = false;
  HORA_CHECK(hora__progress(net, &progressed));
  /* A transfer that always moves never reaches the poll below. */
  HORA_CHECK(hora__service_maybe(net));
  if (progressed || !net->active) {
    return HORA_SUCCESS;
  }
  if (net->spin_us > 0) {
    /* Bounded: a pause between tries, a yield now and then (a syscall per
     * try would cost more than the message). */
    uint64_t until = hora__now_ns() + (uint64_t)net->spin_us * 1000;
    for (unsigned tries = 1;; tries++) {
      HORA_CHECK(hora__progress(net, &progressed));
      if (progressed || !net->active) {
        return HORA_SUCCESS;
      }
      if ((tries & 63) == 0) {
        if (hora__now_ns() >= until) {
          break;
        }
        HORA_CHECK(hora__service_maybe(net));
        sched_yield();
      }
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }
  uint64_t waiting_since = hora__now_ns();
  for (;;) {
    if (net->stall_ns && hora__now_ns() - waiting_since > net->stall_ns) {
      char name[160];
      return hora__error(HORA_ERR_TIMEOUT,
                         "a collective stalled: nothing moved for %.0f s (HORA_STALL_SHUTDOWN_TIME_SECONDS), "
                         "waiting for %s",
                         (double)net->stall_ns * 1e-9,
                         net->active ? hora__peer_name(net, net->active->peer, name, sizeof(name))
                                      : "a peer");
    }
    struct pollfd fds[MAX_POLL];
    int n = 0;
    for (hora__conn *c = net->active; c && n < MAX_POLL - 1; c = c->active_next) {
      fds[n].fd = c->tp->poll_fd(c, &fds[n].events);
      fds[n].revents = 0;
      n++;
    }
    int ndata = n;
    if (net->service_pollfds) {
      n += net->service_pollfds(net->service_arg, fds + n, MAX_POLL - n);
    }
    uint64_t now = hora__now_ns();
    int ms = 1000;
    if (net->service) {
      ms = net->service_due_ns <= now
               ? 0
               : (int)HORA_MIN((net->service_due_ns - now + 999999) / 1000000, (uint64_t)1000);
    }
    if (net->stall_ns) {
      /* Wake in time to report a stall, with or without a service hook. */
      uint64_t deadline = waiting_since + net->stall_ns;
      int left = deadline <= now ? 0 : (int)HORA_MIN((deadline - now + 999999) / 1000000, (uint64_t)1000);
      ms = HORA_MIN(ms, left + 1);
    }
    int r = poll(fds, (nfds_t)n, ms);
    if (r < 0 && errno != EINTR) {
      return hora__error_errno(HORA_ERR_SYSTEM, "poll");
    }
    if (r >= 0 && net->service_ready) {
      net->service_ready(net->service_arg, fds + ndata, n - ndata);
    }
    /* Control traffic is serviced when it arrives and whenever it is due. */
    bool service = false;
    for (int i = ndata; i < n && !service; i++) {
      service = fds[i].revents != 0;
    }
    if (service && net->service) {
      HORA_CHECK(hora__service_run(net));
    } else {
      HORA_CHECK(hora__service_maybe(net));
    }
    HORA_CHECK(hora__progress(net, &progressed));
    if (progressed || !net->active) {
      return HORA_SUCCESS;
    }
  }
}

int hora__wait_all(hora__net *net, hora__xfer **xs, int n) {
  for (;;) {
    bool all = true;
    for (int i = 0; i < n; i++) {
      if (!xs[i]->done) {
        all = false;
        break;
      }
    }
    if (all) {
      return HORA_SUCCESS;
    }
    HORA_CHECK(hora__progress_wait(net));
  }
}
