/* Logging to stderr or HORA_LOG_FILE. Lines are written with one write(2)
 * each, so lines from several threads and processes never interleave. */
#include "base/log.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "base/params.h"

int hora__log_level = HORA_LOG_WARN;
static int log_fd = 2;
static int log_rank = -1;
static char log_host[64];

static const char *const level_names[] = {"NONE", "ERROR", "WARN", "INFO", "DEBUG", "TRACE"};

const char *hora__log_hostname(void) {
  if (!log_host[0]) {
    if (gethostname(log_host, sizeof(log_host)) != 0) {
      hora__strlcpy(log_host, "unknown", sizeof(log_host));
    }
    log_host[sizeof(log_host) - 1] = '\0';
  }
  return log_host;
}

void hora__log_set_rank(int rank) {
  log_rank = rank;
  /* The file name may carry the rank, which was not known when it opened. */
  if (hora__params.LOG_FILE && strstr(hora__params.LOG_FILE, "%r")) {
    (void)hora__log_open();
  }
}

/* Expands %h, %p and %r in a HORA_LOG_FILE pattern. */
static void expand_log_path(const char *pattern, char *out, size_t n) {
  size_t o = 0;
  for (const char *p = pattern; *p && o + 1 < n; p++) {
    if (p[0] == '%' && p[1]) {
      char tmp[80];
      switch (p[1]) {
        case 'h': snprintf(tmp, sizeof(tmp), "%s", hora__log_hostname()); break;
        case 'p': snprintf(tmp, sizeof(tmp), "%ld", (long)getpid()); break;
        case 'r': snprintf(tmp, sizeof(tmp), "%d", log_rank); break;
        case '%': snprintf(tmp, sizeof(tmp), "%%"); break;
        default: snprintf(tmp, sizeof(tmp), "%%%c", p[1]); break;
      }
      p++;
      o += (size_t)snprintf(out + o, n - o, "%s", tmp);
      if (o >= n) {
        o = n - 1;
      }
    } else {
      out[o++] = *p;
    }
  }
  out[o] = '\0';
}

int hora__log_open(void) {
  static const char *const names[] = {"none", "error", "warn", "info", "debug", "trace"};
  for (int i = 0; i < (int)HORA_ARRAY_SIZE(names); i++) {
    if (strcmp(hora__params.LOG_LEVEL, names[i]) == 0) {
      hora__log_level = i;
    }
  }
  hora__log_close();
  /* A name with the rank in it waits until the rank is known. */
  if (hora__params.LOG_FILE[0] && !(strstr(hora__params.LOG_FILE, "%r") && log_rank < 0)) {
    char path[4096];
    expand_log_path(hora__params.LOG_FILE, path, sizeof(path));
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      return hora__error_errno(HORA_ERR_SYSTEM, "HORA_LOG_FILE: cannot open '%s'", path);
    }
    log_fd = fd;
  }
  return HORA_SUCCESS;
}

void hora__log_close(void) {
  if (log_fd != 2) {
    close(log_fd);
    log_fd = 2;
  }
}

void hora__log_write(int level, const char *file, int line, const char *fmt, ...) {
  int saved = errno;
  char buf[2048];
  struct timeval tv;
  gettimeofday(&tv, NULL);
  struct tm tm;
  localtime_r(&tv.tv_sec, &tm);
  const char *base = strrchr(file, '/');
  base = base ? base + 1 : file;
  int n = snprintf(buf, sizeof(buf), "%s:%ld:%d %02d:%02d:%02d.%06ld hora %s ", hora__log_hostname(),
                   (long)getpid(), log_rank, tm.tm_hour, tm.tm_min, tm.tm_sec, (long)tv.tv_usec,
                   level_names[level]);
  if (level >= HORA_LOG_DEBUG && n > 0 && (size_t)n < sizeof(buf)) {
    n += snprintf(buf + n, sizeof(buf) - (size_t)n, "%s:%d ", base, line);
  }
  if (n > 0 && (size_t)n < sizeof(buf)) {
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
    va_end(ap);
  }
  if (n < 0) {
    n = 0;
  }
  if ((size_t)n >= sizeof(buf) - 1) {
    n = (int)sizeof(buf) - 2;
  }
  buf[n++] = '\n';
  ssize_t w = write(log_fd, buf, (size_t)n);
  (void)w;
  errno = saved;
}
