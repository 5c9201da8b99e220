/* Elastic membership: the agreement as a member, following a coordinator
 * (membership_agree.c), and the choice of whom to follow. */
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/bootstrap/membership_impl.h"

/* Answers requests queued here while another coordinates: ask again. */
static void redirect_requests(struct hora__membership *m) {
  int n;
  struct queued *q = hora__mb_take_queue(m, false, &n);
  for (int i = 0; i < n; i++) {
    struct hora__mb_buf r = {0};
    hora__mb_put(&r, &m->my_ip, 4);
    hora__mb_put32(&r, m->my_port);
    hora__mb_send_msg(q[i].fd, M_REDIRECT, &r, hora__now_ns() + IO_NS);
    free(r.p);
  }
  hora__mb_drop_queue(q, n);
  free(q);
}

/* Follows one coordinator's reset on fd. 1: it went away (try again from
 * the lowest); 2: it lives but never started (try the next); 0: done
 * (*out); otherwise the HORA_ERR_* that ends this process's part. */
static int follow(struct hora__membership *m, int fd, const struct hora__member *coord,
                  struct hora__agreed *out, uint64_t deadline) {
  struct hora__mb_buf b = {0}, r = {0};
  int rc = 1;
  /* A candidate that lives (its listener beats) but never starts the
   * agreement is stuck: after as long as a coordinator waits for a member,
   * and a margin, this member looks further. */
  uint64_t start_by =
      hora__now_ns() + (uint64_t)((hora__params.ELASTIC_TIMEOUT_SECONDS + 10) * 1e9);
  bool started = false;
  for (;;) {
    uint32_t type = 0;
    uint64_t t = hora__now_ns();
    if (t >= deadline) {
      rc = hora__error(HORA_ERR_TIMEOUT, "elastic: the reset did not end within its time");
      break;
    }
    if (!started && t >= start_by) {
      rc = 2;
      break;
    }
    if (hora__mb_recv_msg(fd, &type, &b, HORA_MIN(deadline, t + SILENCE_NS)) != HORA_SUCCESS) {
      rc = 1;
      break;
    }
    if (type == M_BEAT) {
      redirect_requests(m); /* whoever takes this process for the coordinator */
      continue;
    }
    started = true;
    if (type == M_PREPARE) {
      uint64_t ballot = hora__mb_get64(&b);
      r.len = 0;
      if (ballot > m->promised) {
        m->promised = ballot;
        hora__mb_put64(&r, ballot);
        hora__mb_put64(&r, m->accepted_b);
        struct hora__view none = {0};
        hora__mb_put_view(&r, m->accepted_b ? &m->accepted : &none);
        type = M_PROMISE;
      } else {
        hora__mb_put64(&r, m->promised);
        type = M_NACK;
      }
    } else if (type == M_PROPOSE) {
      hora__mb_crash_if_asked(m, "propose");
      uint64_t ballot = hora__mb_get64(&b);
      struct hora__view pv = {0};
      if (!hora__mb_get_view(&b, &pv)) {
        hora__mb_view_free(&pv);
        break;
      }
      r.len = 0;
      if (ballot >= m->promised) {
        m->promised = ballot;
        m->accepted_b = ballot;
        hora__mb_view_free(&m->accepted);
        m->accepted = pv;
        hora__mb_put64(&r, ballot);
        type = M_ACCEPTED;
      } else {
        hora__mb_view_free(&pv);
        hora__mb_put64(&r, m->promised);
        type = M_NACK;
      }
    } else if (type == M_COMMIT) {
      (void)hora__mb_get64(&b);
      uint32_t build = hora__mb_get32(&b), port = hora__mb_get32(&b);
      struct hora__view nv = {0};
      if (!hora__mb_get_view(&b, &nv)) {
        hora__mb_view_free(&nv);
        break;
      }
      int lost = 0, joined = 0;
      for (int i = 0; i < m->view.n; i++) {
        lost += hora__mb_view_index(&nv, m->view.m[i].id) < 0;
      }
      for (int i = 0; i < nv.n; i++) {
        joined += hora__mb_view_index(&m->view, nv.m[i].id) < 0;
      }
      pthread_mutex_lock(&m->mu);
      hora__mb_view_free(&m->view);
      m->view = nv;
      pthread_mutex_unlock(&m->mu);
      m->accepted_b = 0;
      hora__mb_view_free(&m->accepted);
      if (!build) {
        continue;
      }
      int me = hora__mb_view_index(&m->view, m->my_id);
      if (me < 0) {
        rc = hora__error(HORA_ERR_PEER_LOST, "elastic: this process was left out of membership "
                         "%llu", (unsigned long long)m->view.epoch);
        break;
      }
      *out = (struct hora__agreed){.rank = me, .size = m->view.n, .epoch = m->view.epoch,
                                   .port = (int)port, .listen_fd = -1,
                                   .lost = lost, .joined = joined};
      inet_ntop(AF_INET, &coord->ip, out->host, sizeof(out->host));
      rc = 0;
      break;
    } else if (type == M_REFUSE) {
      int code = (int)hora__mb_get32(&b);
      char msg[600];
      size_t n = HORA_MIN(b.len - b.off, sizeof(msg) - 1);
      memcpy(msg, b.p + b.off, n);
      msg[n] = '\0';
      rc = hora__error(code > 0 && code < 64 ? code : HORA_ERR_PEER_LOST, "%s", msg);
      break;
    } else if (type == M_REDIRECT) {
      rc = 1;
      break;
    } else {
      break;
    }
    if (hora__mb_send_msg(fd, type, &r, hora__now_ns() + IO_NS) != HORA_SUCCESS) {
      break;
    }
  }
  free(b.p);
  free(r.p);
  return rc;
}

int hora__membership_agree(struct hora__membership *m, struct hora__agreed *out) {
  pthread_mutex_lock(&m->mu);
  m->in_reset = true;
  struct hora__view v = {0};
  int rc = hora__mb_view_copy(&v, &m->view);
  pthread_mutex_unlock(&m->mu);
  uint64_t deadline = hora__now_ns() +
                      (uint64_t)((2 * hora__params.ELASTIC_TIMEOUT_SECONDS + 30) * 1e9);
  bool *gone = rc == HORA_SUCCESS ? hora__calloc((size_t)HORA_MAX(v.n, 1), 1) : NULL;
  if (rc == HORA_SUCCESS && !gone) {
    rc = HORA_ERR_NO_MEMORY;
  }
  while (rc == HORA_SUCCESS) {
    if (hora__now_ns() >= deadline) {
      rc = hora__error(HORA_ERR_TIMEOUT, "elastic: no membership was agreed in time");
      break;
    }
    /* The view may have moved on (an adopted commitment): start over from it. */
    pthread_mutex_lock(&m->mu);
    if (m->view.epoch != v.epoch) {
      hora__mb_view_copy(&v, &m->view);
      free(gone);
      gone = hora__calloc((size_t)HORA_MAX(v.n, 1), 1);
    }
    pthread_mutex_unlock(&m->mu);
    if (!gone) {
      rc = HORA_ERR_NO_MEMORY;
      break;
    }
    int i = 0;
    for (; i < v.n && (gone[i] || v.m[i].id == m->my_id) ; i++) {
      if (v.m[i].id == m->my_id) {
        break;
      }
    }
    if (i == v.n) {
      rc = hora__error(HORA_ERR_PEER_LOST, "elastic: this process is not a member of membership "
                       "%llu", (unsigned long long)v.epoch);
      break;
    }
    if (v.m[i].id == m->my_id) {
      rc = hora__mb_coordinate(m, out);
      break;
    }
    redirect_requests(m);
    int fd = hora__mb_dial(m, v.m[i].ip, v.m[i].port, PROBE_NS);
    if (fd < 0) {
      gone[i] = true;
      continue;
    }
    struct hora__mb_buf b = {0};
    hora__mb_put32(&b, m->my_id);
    hora__mb_put64(&b, m->promised);
    hora__mb_put(&b, &m->my_ip, 4);
    hora__mb_put32(&b, m->my_port);
    hora__mb_put_view(&b, &v);
    int r = hora__mb_send_msg(fd, M_RESET, &b, hora__now_ns() + IO_NS) == HORA_SUCCESS
                ? follow(m, fd, &v.m[i], out, deadline)
                : 1;
    free(b.p);
    close(fd);
    if (r == 2) {
      HORA_WARN("elastic: rank %d (id %u) lives but has not started the reset: asking the next",
                i, v.m[i].id);
      gone[i] = true;
      continue;
    }
    if (r == 1) {
      /* It went away or sent us elsewhere: everyone below it is asked again. */
      memset(gone, 0, (size_t)HORA_MAX(v.n, 1));
      struct timespec ts = {0, 50 * 1000000};
      nanosleep(&ts, NULL);
      continue;
    }
    rc = r;
    break;
  }
  free(gone);
  hora__mb_view_free(&v);
  pthread_mutex_lock(&m->mu);
  m->in_reset = false;
  pthread_mutex_unlock(&m->mu);
  return rc;
}

