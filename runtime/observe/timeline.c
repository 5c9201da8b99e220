/* Timeline writer. Events collect in memory and are written with one
 * pwrite per flush, placed over the previous closing bracket and ending in
 * a new one, so the file parses as a JSON array between flushes.
 *
 * The coordinator writes the events; hora_start_timeline/stop_timeline
 * swap the file from callers' threads. `mu` guards `installed` and all in
 * it; it is a leaf lock: nothing else is taken under it. */
#include "runtime/observe/timeline.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/log.h"
#include "runtime/operation.h"
#include "base/table.h"
#include "base/wire.h"

#define TAIL "\n]\n"
#define FLUSH_BYTES (256 * 1024)

/* A tensor's row, and how many of its phases are open in this file. */
struct row {
  int id;
  int depth;
};

struct timeline {
  int fd;
  off_t end;      /* where the closing bracket starts */
  bool in_file;   /* the file holds an event */
  bool in_buf;    /* the buffer holds an event */
  bool stopped;   /* a write failed: the file ends where it was valid */
  bool mark_cycles;
  uint64_t t0_ns; /* time zero of the trace */
  struct hora__table rows; /* key -> struct row */
  int next_row;
  struct hora__wbuf buf;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct timeline *installed;
/* Whether events are wanted, for callers to skip formatting them: read
 * without the lock, and rechecked under it. */
static atomic_bool enabled;

bool hora__timeline_enabled(void) {
  return atomic_load_explicit(&enabled, memory_order_relaxed);
}

static void flush(struct timeline *tl);
static void finish(struct timeline *tl);

/* With mu held, after anything that may have stopped the installed file. */
static void update_enabled(void) {
  atomic_store_explicit(&enabled, installed && !installed->stopped, memory_order_relaxed);
}

/* Installs tl (NULL: none) and returns the timeline it replaces. */
static struct timeline *swap(struct timeline *tl) {
  pthread_mutex_lock(&mu);
  struct timeline *old = installed;
  installed = tl;
  update_enabled();
  pthread_mutex_unlock(&mu);
  return old;
}

/* A new file replaces the current one (if any), once it is made: if it
 * cannot be, the current one goes on. `who` names the caller in errors. */
int hora__timeline_open(const char *path, bool mark_cycles, const char *who) {
  struct timeline *tl = hora__calloc(1, sizeof(*tl));
  if (!tl) {
    return HORA_ERR_NO_MEMORY;
  }
  tl->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (tl->fd < 0) {
    free(tl);
    return hora__error_errno(HORA_ERR_SYSTEM, "%s: cannot create '%s'", who, path);
  }
  static const char head[] = "[" TAIL;
  if (pwrite(tl->fd, head, sizeof(head) - 1, 0) != (ssize_t)sizeof(head) - 1) {
    int rc = hora__error_errno(HORA_ERR_SYSTEM, "%s: cannot write '%s'", who, path);
    close(tl->fd);
    free(tl);
    return rc;
  }
  tl->end = 1;
  tl->mark_cycles = mark_cycles;
  tl->t0_ns = hora__now_ns();
  finish(swap(tl));
  return HORA_SUCCESS;
}

void hora__timeline_close(void) { finish(swap(NULL)); }

void hora__timeline_flush(void) {
  pthread_mutex_lock(&mu);
  if (installed) {
    flush(installed);
    update_enabled();
  }
  pthread_mutex_unlock(&mu);
}

static void flush(struct timeline *tl) {
  if (tl->buf.len == 0) {
    return;
  }
  hora__wbuf_put(&tl->buf, TAIL, sizeof(TAIL) - 1);
  if (tl->buf.failed) {
    hora__wbuf_reset(&tl->buf);
    tl->in_buf = false;
    return;
  }
  ssize_t w = pwrite(tl->fd, tl->buf.data, tl->buf.len, tl->end);
  if (w == (ssize_t)tl->buf.len) {
    tl->end += (off_t)(tl->buf.len - (sizeof(TAIL) - 1));
    tl->in_file = tl->in_file || tl->in_buf;
  } else {
    /* A short write left part of an event: put the bracket back where the
     * file last ended valid (those bytes were written before, so this
     * needs no new space) and cut the rest. */
    char why[96];
    if (w < 0) {
      snprintf(why, sizeof(why), "%s", strerror(errno));
    } else {
      snprintf(why, sizeof(why), "%zd of %zu bytes written", w, tl->buf.len);
    }
    if (pwrite(tl->fd, TAIL, sizeof(TAIL) - 1, tl->end) != (ssize_t)sizeof(TAIL) - 1 ||
        ftruncate(tl->fd, tl->end + (off_t)(sizeof(TAIL) - 1)) != 0) {
      HORA_WARN("HORA_TIMELINE: cannot restore the end of the file (%s)", strerror(errno));
    }
    HORA_WARN("HORA_TIMELINE: write failed (%s); the timeline stops here", why);
    tl->stopped = true;
  }
  hora__wbuf_reset(&tl->buf);
  tl->in_buf = false;
}

/* Appends text with JSON string escaping. */
static void put_json_string(struct timeline *tl, const char *s, size_t n) {
  hora__wbuf_u8(&tl->buf, '"');
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') {
      char esc[2] = {'\\', (char)c};
      hora__wbuf_put(&tl->buf, esc, 2);
    } else if (c < 0x20) {
      char esc[8];
      snprintf(esc, sizeof(esc), "\\u%04x", c);
      hora__wbuf_put(&tl->buf, esc, 6);
    } else {
      hora__wbuf_u8(&tl->buf, c);
    }
  }
  hora__wbuf_u8(&tl->buf, '"');
}

static void event_start(struct timeline *tl) {
  if (tl->in_file || tl->in_buf) {
    hora__wbuf_put(&tl->buf, ",\n", 2);
  } else {
    hora__wbuf_u8(&tl->buf, '\n');
  }
  tl->in_buf = true;
}

/* The process set whose coordinator runs on this thread (0: the world):
 * its tensors get rows of their own, labelled with the set. */
static _Thread_local int thread_set;

void hora__timeline_thread_set(int set_id) { thread_set = set_id; }
int hora__timeline_thread_get(void) { return thread_set; }

/* The row of a tensor (NULL when out of memory); the first use names it
 * with a metadata event. Rows are by set and key: the same name in two
 * sets is two tensors. */
static struct row *row_of(struct timeline *tl, const char *key, size_t len) {
  char full[HORA_KEY_MAX + 16];
  const char *own = key;
  size_t own_len = len, flen = 0;
  if (thread_set > 0 && len <= HORA_KEY_MAX) {
    memcpy(full, &thread_set, sizeof(thread_set));
    flen = sizeof(thread_set);
    memcpy(full + flen, key, len);
    flen += len;
    key = full;
    len = flen;
  }
  struct row *row = hora__table_get(&tl->rows, key, len);
  if (row) {
    return row;
  }
  row = hora__calloc(1, sizeof(*row));
  if (!row || hora__table_put(&tl->rows, key, len, row) != HORA_SUCCESS) {
    free(row);
    return NULL;
  }
  row->id = tl->next_row++;
  char name[300], labelled[340];
  hora__key_display(own, own_len, name, sizeof(name));
  /* Strip the quotes around user names for a cleaner label. */
  size_t nl = strlen(name);
  const char *label = name;
  if (nl >= 2 && name[0] == '\'') {
    label = name + 1;
    nl -= 2;
  }
  if (flen) {
    nl = (size_t)snprintf(labelled, sizeof(labelled), "process set %d: %.*s", thread_set,
                          (int)nl, label);
    label = labelled;
  }
  event_start(tl);
  char head[96];
  int h = snprintf(head, sizeof(head), "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                   "\"args\":{\"name\":", row->id);
  hora__wbuf_put(&tl->buf, head, (size_t)h);
  put_json_string(tl, label, nl);
  hora__wbuf_put(&tl->buf, "}}", 2);
  return row;
}

static double now_us(const struct timeline *tl) {
  return (double)(hora__now_ns() - tl->t0_ns) / 1000.0;
}

static void put_event(struct timeline *tl, int row, const char *ph, const char *name,
                      const char *args) {
  event_start(tl);
  char buf[160];
  int n = snprintf(buf, sizeof(buf), "{\"ph\":\"%s\",\"pid\":0,\"tid\":%d,\"ts\":%.3f", ph, row,
                   now_us(tl));
  hora__wbuf_put(&tl->buf, buf, (size_t)n);
  if (name) {
    hora__wbuf_put(&tl->buf, ",\"name\":", 8);
    put_json_string(tl, name, strlen(name));
  }
  if (ph[0] == 'i') {
    hora__wbuf_put(&tl->buf, ",\"s\":\"t\"", 8);
  }
  if (args) {
    hora__wbuf_put(&tl->buf, ",\"args\":", 8);
    hora__wbuf_put(&tl->buf, args, strlen(args));
  }
  hora__wbuf_u8(&tl->buf, '}');
  if (tl->buf.len >= FLUSH_BYTES) {
    flush(tl);
  }
}

static void event(const char *key, size_t len, const char *ph, const char *name,
                  const char *args) {
  pthread_mutex_lock(&mu);
  struct timeline *tl = installed;
  struct row *row = tl && !tl->stopped ? row_of(tl, key, len) : NULL;
  /* A phase that began before this file did ends unseen: every row of a
   * file started at run time stays balanced. */
  if (row && (ph[0] != 'E' || row->depth > 0)) {
    row->depth += ph[0] == 'B' ? 1 : ph[0] == 'E' ? -1 : 0;
    put_event(tl, row->id, ph, name, args);
    update_enabled();
  }
  pthread_mutex_unlock(&mu);
}

void hora__timeline_begin(const char *key, size_t len, const char *phase) {
  event(key, len, "B", phase, NULL);
}

void hora__timeline_begin_args(const char *key, size_t len, const char *phase,
                               const char *args) {
  event(key, len, "B", phase, args);
}

void hora__timeline_end(const char *key, size_t len) { event(key, len, "E", NULL, NULL); }

void hora__timeline_mark(const char *key, size_t len, const char *what) {
  event(key, len, "i", what, NULL);
}

/* A global instant event with its args (a JSON object's members); when
 * `cycle_mark`, only if cycles are marked. */
static void global_event(const char *name, const char *args, bool cycle_mark) {
  if (!hora__timeline_enabled()) {
    return;
  }
  pthread_mutex_lock(&mu);
  struct timeline *tl = installed;
  if (tl && !tl->stopped && (!cycle_mark || tl->mark_cycles)) {
    event_start(tl);
    char buf[320];
    int n = snprintf(buf, sizeof(buf), "{\"name\":\"%s\",\"ph\":\"i\",\"s\":\"g\","
                     "\"pid\":0,\"ts\":%.3f,\"args\":{%s}}", name, now_us(tl), args);
    hora__wbuf_put(&tl->buf, buf, (size_t)HORA_MIN(n, (int)sizeof(buf) - 1));
    if (tl->buf.len >= FLUSH_BYTES) {
      flush(tl);
      update_enabled();
    }
  }
  pthread_mutex_unlock(&mu);
}

void hora__timeline_cycle(uint64_t cycle) {
  /* As Horovod's mark_cycles writes. */
  char args[48];
  snprintf(args, sizeof(args), "\"cycle\":%llu", (unsigned long long)cycle);
  global_event("CYCLE_START", args, true);
}

void hora__timeline_step(uint64_t step, double seconds, double wait_seconds, uint64_t bytes) {
  char args[200];
  snprintf(args, sizeof(args), "\"step\":%llu,\"seconds\":%.6f,\"compute_seconds\":%.6f,"
           "\"wait_seconds\":%.6f,\"bytes\":%llu", (unsigned long long)step, seconds,
           seconds - wait_seconds, wait_seconds, (unsigned long long)bytes);
  global_event("STEP", args, false);
}

void hora__timeline_last_rank(int rank, double waited_seconds, uint64_t operations) {
  char args[120];
  snprintf(args, sizeof(args), "\"rank\":%d,\"waited_seconds\":%.6f,\"operations\":%llu",
           rank, waited_seconds, (unsigned long long)operations);
  global_event("LAST_RANK", args, false);
}

/* Ends the phases still open on a row, so the file is balanced. */
static void end_open(void *arg, const char *key, size_t len, void *value) {
  (void)key;
  (void)len;
  struct timeline *tl = arg;
  struct row *row = value;
  for (; row->depth > 0 && !tl->stopped; row->depth--) {
    put_event(tl, row->id, "E", NULL, NULL);
  }
}

static void free_row(void *arg, const char *key, size_t len, void *value) {
  (void)arg;
  (void)key;
  (void)len;
  free(value);
}

/* Writes out and closes a timeline no longer installed (NULL: none). */
static void finish(struct timeline *tl) {
  if (!tl) {
    return;
  }
  if (!tl->stopped) {
    hora__table_each(&tl->rows, end_open, tl);
    flush(tl);
  }
  close(tl->fd);
  hora__table_each(&tl->rows, free_row, NULL);
  hora__table_free(&tl->rows);
  hora__wbuf_free(&tl->buf);
  free(tl);
}
