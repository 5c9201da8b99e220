/* Timeline writer. Events collect in memory and are written with one
 * pwrite per flush, placed over the previous closing bracket and ending in
 * a new one, so the file parses as a JSON array between flushes. */
#include "timeline.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "log.h"
#include "message.h"
#include "table.h"
#include "wire.h"

#define TAIL "\n]\n"
#define FLUSH_BYTES (256 * 1024)

struct timeline {
  int fd;
  off_t end;      /* where the closing bracket starts */
  bool in_file;   /* the file holds an event */
  bool in_buf;    /* the buffer holds an event */
  bool stopped;   /* a write failed: the file ends where it was valid */
  uint64_t t0_ns; /* time zero of the trace */
  struct hora__table rows; /* key -> row id + 1 */
  int next_row;
  struct hora__wbuf buf;
};

static struct timeline *tl;

bool hora__timeline_enabled(void) { return tl != NULL && !tl->stopped; }

int hora__timeline_open(const char *path) {
  struct timeline *t = hora__calloc(1, sizeof(*t));
  if (!t) {
    return HORA_ERR_NO_MEMORY;
  }
  t->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (t->fd < 0) {
    free(t);
    return hora__error_errno(HORA_ERR_SYSTEM, "HORA_TIMELINE: cannot create '%s'", path);
  }
  static const char head[] = "[" TAIL;
  if (pwrite(t->fd, head, sizeof(head) - 1, 0) != (ssize_t)sizeof(head) - 1) {
    int rc = hora__error_errno(HORA_ERR_SYSTEM, "HORA_TIMELINE: cannot write '%s'", path);
    close(t->fd);
    free(t);
    return rc;
  }
  t->end = 1;
  t->t0_ns = hora__now_ns();
  tl = t;
  return HORA_SUCCESS;
}

void hora__timeline_flush(void) {
  if (!tl || tl->buf.len == 0) {
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

void hora__timeline_close(void) {
  if (!tl) {
    return;
  }
  hora__timeline_flush();
  close(tl->fd);
  hora__table_free(&tl->rows);
  hora__wbuf_free(&tl->buf);
  free(tl);
  tl = NULL;
}

/* Appends text with JSON string escaping. */
static void put_json_string(const char *s, size_t n) {
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

static void event_start(void) {
  if (tl->in_file || tl->in_buf) {
    hora__wbuf_put(&tl->buf, ",\n", 2);
  } else {
    hora__wbuf_u8(&tl->buf, '\n');
  }
  tl->in_buf = true;
}

/* The row of a tensor; the first use names it with a metadata event. */
static int row_of(const char *key, size_t len) {
  uintptr_t v = (uintptr_t)hora__table_get(&tl->rows, key, len);
  if (v) {
    return (int)(v - 1);
  }
  int row = tl->next_row++;
  if (hora__table_put(&tl->rows, key, len, (void *)(uintptr_t)(row + 1)) != HORA_SUCCESS) {
    return row;
  }
  char name[300];
  hora__key_display(key, len, name, sizeof(name));
  /* Strip the quotes around user names for a cleaner label. */
  size_t nl = strlen(name);
  const char *label = name;
  if (nl >= 2 && name[0] == '\'') {
    label = name + 1;
    nl -= 2;
  }
  event_start();
  char head[96];
  int h = snprintf(head, sizeof(head), "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                   "\"args\":{\"name\":", row);
  hora__wbuf_put(&tl->buf, head, (size_t)h);
  put_json_string(label, nl);
  hora__wbuf_put(&tl->buf, "}}", 2);
  return row;
}

static void event(const char *key, size_t len, const char *ph, const char *name) {
  if (!tl || tl->stopped) {
    return;
  }
  int row = row_of(key, len);
  double ts = (double)(hora__now_ns() - tl->t0_ns) / 1000.0;
  event_start();
  char buf[160];
  int n = snprintf(buf, sizeof(buf), "{\"ph\":\"%s\",\"pid\":0,\"tid\":%d,\"ts\":%.3f", ph, row, ts);
  hora__wbuf_put(&tl->buf, buf, (size_t)n);
  if (name) {
    hora__wbuf_put(&tl->buf, ",\"name\":", 8);
    put_json_string(name, strlen(name));
  }
  if (ph[0] == 'i') {
    hora__wbuf_put(&tl->buf, ",\"s\":\"t\"", 8);
  }
  hora__wbuf_u8(&tl->buf, '}');
  if (tl->buf.len >= FLUSH_BYTES) {
    hora__timeline_flush();
  }
}

void hora__timeline_begin(const char *key, size_t len, const char *phase) {
  event(key, len, "B", phase);
}

void hora__timeline_end(const char *key, size_t len) { event(key, len, "E", NULL); }

void hora__timeline_mark(const char *key, size_t len, const char *what) {
  event(key, len, "i", what);
}
