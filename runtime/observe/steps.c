/* Training steps: see steps.h. One small lock: marks and waits are at most
 * a few per operation, far from the data path. */
#include "runtime/observe/steps.h"

#include <pthread.h>
#include <string.h>

#include "runtime/observe/timeline.h"

static pthread_mutex_t steps_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  int waiters;
  uint64_t wait_since_ns; /* while waiters > 0 */
  uint64_t wait_ns;       /* every closed wait interval since the start */
  bool started;
  uint64_t mark_ns, mark_wait_ns; /* at the last mark */
  struct hora__step_totals mark_totals;
  struct hora__step_snapshot sum;
} st;

void hora__steps_reset(void) {
  pthread_mutex_lock(&steps_mu);
  int waiters = st.waiters;
  uint64_t since = st.wait_since_ns;
  memset(&st, 0, sizeof(st));
  st.waiters = waiters; /* a thread still waiting on a request of the last runtime */
  st.wait_since_ns = since;
  pthread_mutex_unlock(&steps_mu);
}

void hora__steps_wait_begin(void) {
  pthread_mutex_lock(&steps_mu);
  if (st.waiters++ == 0) {
    st.wait_since_ns = hora__now_ns();
  }
  pthread_mutex_unlock(&steps_mu);
}

void hora__steps_wait_end(void) {
  pthread_mutex_lock(&steps_mu);
  if (st.waiters > 0 && --st.waiters == 0) {
    st.wait_ns += hora__now_ns() - st.wait_since_ns;
  }
  pthread_mutex_unlock(&steps_mu);
}

/* Waited time up to `now`, counting an interval still open. */
static uint64_t waited_until(uint64_t now) {
  return st.wait_ns + (st.waiters > 0 && now > st.wait_since_ns ? now - st.wait_since_ns : 0);
}

void hora__steps_mark(const struct hora__step_totals *t) {
  pthread_mutex_lock(&steps_mu);
  uint64_t now = hora__now_ns(), waited = waited_until(now);
  bool ended = st.started;
  struct hora__step_snapshot *s = &st.sum;
  if (ended) {
    s->steps++;
    s->last_ns = now - st.mark_ns;
    s->last_wait_ns = HORA_MIN(waited - st.mark_wait_ns, s->last_ns);
    s->last_bytes = t->bytes - st.mark_totals.bytes;
    s->last_bus_bytes = t->bus_bytes - st.mark_totals.bus_bytes;
    s->last_communicate_ns = t->communicate_ns - st.mark_totals.communicate_ns;
    s->step_ns += s->last_ns;
    s->wait_ns += s->last_wait_ns;
    s->bytes += s->last_bytes;
    s->bus_bytes += s->last_bus_bytes;
    s->communicate_ns += s->last_communicate_ns;
  }
  st.started = true;
  st.mark_ns = now;
  st.mark_wait_ns = waited;
  st.mark_totals = *t;
  struct hora__step_snapshot last = *s;
  pthread_mutex_unlock(&steps_mu);
  if (ended && hora__timeline_enabled()) {
    hora__timeline_step(last.steps, (double)last.last_ns * 1e-9, (double)last.last_wait_ns * 1e-9,
                        last.last_bytes);
  }
}

void hora__steps_get(struct hora__step_snapshot *out) {
  pthread_mutex_lock(&steps_mu);
  *out = st.sum;
  pthread_mutex_unlock(&steps_mu);
}
