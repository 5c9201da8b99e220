/* Settings: parsing and documentation generated from runtime/params.def. */
#include "base/params.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"

struct hora__params hora__params;

int hora__parse_bytes(const char *var, const char *s, int64_t *out) {
  const char *p = s;
  while (isspace((unsigned char)*p)) {
    p++;
  }
  if (!isdigit((unsigned char)*p)) {
    return hora__error(HORA_ERR_INVALID_ARG,
                       "%s='%s' is not a byte size (examples: 65536, 64K, 64M, 1G)", var, s);
  }
  errno = 0;
  char *end = NULL;
  unsigned long long v = strtoull(p, &end, 10);
  int shift = 0;
  switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
  }
  if (shift && (*end == 'i' || *end == 'I')) {
    end++;
  }
  if (shift && (*end == 'b' || *end == 'B')) {
    end++;
  }
  while (isspace((unsigned char)*end)) {
    end++;
  }
  if (errno != 0 || *end != '\0' || v > ((unsigned long long)INT64_MAX >> shift)) {
    return hora__error(HORA_ERR_INVALID_ARG,
                       "%s='%s' is not a byte size (examples: 65536, 64K, 64M, 1G)", var, s);
  }
  *out = (int64_t)(v << shift);
  return HORA_SUCCESS;
}

int hora__parse_int(const char *var, const char *s, int64_t *out) {
  errno = 0;
  char *end = NULL;
  long long v = strtoll(s, &end, 10);
  while (end && isspace((unsigned char)*end)) {
    end++;
  }
  if (errno != 0 || end == s || *end != '\0') {
    return hora__error(HORA_ERR_INVALID_ARG, "%s='%s' is not an integer", var, s);
  }
  *out = v;
  return HORA_SUCCESS;
}

int hora__parse_double(const char *var, const char *s, double *out) {
  errno = 0;
  char *end = NULL;
  double v = strtod(s, &end);
  while (end && isspace((unsigned char)*end)) {
    end++;
  }
  if (errno != 0 || end == s || *end != '\0' || !isfinite(v)) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s='%s' is not a number", var, s);
  }
  *out = v;
  return HORA_SUCCESS;
}

int hora__parse_bool(const char *var, const char *s, bool *out) {
  static const char *const yes[] = {"1", "true", "yes", "on"};
  static const char *const no[] = {"0", "false", "no", "off"};
  for (size_t i = 0; i < HORA_ARRAY_SIZE(yes); i++) {
    if (strcasecmp(s, yes[i]) == 0) {
      *out = true;
      return HORA_SUCCESS;
    }
    if (strcasecmp(s, no[i]) == 0) {
      *out = false;
      return HORA_SUCCESS;
    }
  }
  return hora__error(HORA_ERR_INVALID_ARG, "%s='%s' is not a boolean (use 1/0, true/false)", var,
                     s);
}

int hora__parse_choice(const char *var, const char *s, const char *choices, const char **out) {
  size_t n = strlen(s);
  const char *c = choices;
  while (*c) {
    const char *bar = strchr(c, '|');
    size_t len = bar ? (size_t)(bar - c) : strlen(c);
    if (len == n && strncasecmp(c, s, n) == 0) {
      /* Point into the static table so the value outlives the environment. */
      *out = c;
      return HORA_SUCCESS;
    }
    c += len + (bar ? 1 : 0);
  }
  return hora__error(HORA_ERR_INVALID_ARG, "%s='%s' is not one of %s", var, s, choices);
}

/* Choices point into "a|b|c"; store a terminated copy of the chosen one. */
static const char *choice_copy(const char *p) {
  static char storage[32][32];
  static int used;
  size_t len = strcspn(p, "|");
  for (int i = 0; i < used; i++) {
    if (strlen(storage[i]) == len && strncmp(storage[i], p, len) == 0) {
      return storage[i];
    }
  }
  if (used == 32 || len >= sizeof(storage[0])) {
    return "?";
  }
  memcpy(storage[used], p, len);
  storage[used][len] = '\0';
  return storage[used++];
}

static int parse_string(const char *var, const char *s, const char **out) {
  (void)var;
  *out = s;
  return HORA_SUCCESS;
}

#define PARSE_bytes(var, s, out) hora__parse_bytes(var, s, out)
#define PARSE_int(var, s, out) hora__parse_int(var, s, out)
#define PARSE_double(var, s, out) hora__parse_double(var, s, out)
#define PARSE_bool(var, s, out) hora__parse_bool(var, s, out)
#define PARSE_string(var, s, out) parse_string(var, s, out)

/* Private copies of the string settings, since the program may change its
 * environment; `pending` collects a load's copies until it succeeds. */
struct owned_strings {
  char *s[32];
  int n;
};
static struct owned_strings owned, pending;

static void free_strings(struct owned_strings *o) {
  for (int i = 0; i < o->n; i++) {
    free(o->s[i]);
  }
  o->n = 0;
}

static int own_string(const char **sp) {
  char *copy = strdup(*sp);
  if (!copy || pending.n == (int)HORA_ARRAY_SIZE(pending.s)) {
    free(copy);
    return HORA_ERR_NO_MEMORY;
  }
  pending.s[pending.n++] = copy;
  *sp = copy;
  return HORA_SUCCESS;
}

#define OWN_bytes(ptr) HORA_SUCCESS
#define OWN_int(ptr) HORA_SUCCESS
#define OWN_double(ptr) HORA_SUCCESS
#define OWN_bool(ptr) HORA_SUCCESS
#define OWN_string(ptr) own_string(ptr)

int hora__params_load(void) {
  struct hora__params p;
  memset(&p, 0, sizeof(p));
  const char *env;
  const char *chosen;
  int rc;
  (void)chosen;
#define HORA_PARAM(name, scope, type, def, doc)                                                     \
  env = getenv("HORA_" #name);                                                               \
  rc = PARSE_##type("HORA_" #name, env ? env : def, &p.name);                                \
  if (rc != HORA_SUCCESS) {                                                                  \
    return rc;                                                                               \
  }
#define HORA_PARAM_CHOICE(name, scope, choices, def, doc)                                           \
  env = getenv("HORA_" #name);                                                               \
  rc = hora__parse_choice("HORA_" #name, env ? env : def, choices, &chosen);                 \
  if (rc != HORA_SUCCESS) {                                                                  \
    return rc;                                                                               \
  }                                                                                          \
  p.name = choice_copy(chosen);
#include "base/params.def"
#undef HORA_PARAM
#undef HORA_PARAM_CHOICE
  free_strings(&pending);
#define HORA_PARAM(name, scope, type, def, doc)                                                     \
  if (OWN_##type(&p.name) != HORA_SUCCESS) {                                                 \
    return hora__error(HORA_ERR_NO_MEMORY, "cannot copy setting HORA_" #name);               \
  }
#define HORA_PARAM_CHOICE(name, scope, choices, def, doc)
#include "base/params.def"
#undef HORA_PARAM
#undef HORA_PARAM_CHOICE
  if (p.CACHE_CAPACITY < 0 || p.CACHE_CAPACITY > (1 << 22)) {
    return hora__error(HORA_ERR_INVALID_ARG, "HORA_CACHE_CAPACITY=%lld is outside 0..4194304",
                       (long long)p.CACHE_CAPACITY);
  }
  if (p.CHUNK_SIZE < 4096) {
    return hora__error(HORA_ERR_INVALID_ARG, "HORA_CHUNK_SIZE=%lld is below the minimum of 4096",
                       (long long)p.CHUNK_SIZE);
  }
  if (p.CYCLE_TIME < 0 || p.STALL_CHECK_TIME_SECONDS < 0 || p.STALL_SHUTDOWN_TIME_SECONDS < 0 ||
      p.CONNECT_TIMEOUT_SECONDS <= 0 || p.SPIN_TIME_US < 0) {
    return hora__error(HORA_ERR_INVALID_ARG,
                       "HORA_CYCLE_TIME, HORA_SPIN_TIME_US and the HORA_*_SECONDS settings must not "
                       "be negative, and HORA_CONNECT_TIMEOUT_SECONDS must be positive");
  }
  hora__params = p;
  free_strings(&owned);
  owned = pending;
  pending.n = 0;
  return HORA_SUCCESS;
}

static inline void format_value_bytes(char *buf, size_t n, int64_t v) { snprintf(buf, n, "%lld", (long long)v); }
static inline void format_value_int(char *buf, size_t n, int64_t v) { snprintf(buf, n, "%lld", (long long)v); }
static inline void format_value_double(char *buf, size_t n, double v) { snprintf(buf, n, "%g", v); }
static inline void format_value_bool(char *buf, size_t n, bool v) { snprintf(buf, n, "%d", v ? 1 : 0); }
static inline void format_value_string(char *buf, size_t n, const char *v) { snprintf(buf, n, "%s", v); }

void hora__params_log(void) {
  if (!hora__log_enabled(HORA_LOG_INFO)) {
    return;
  }
  char value[512];
#define HORA_PARAM(name, scope, type, def, doc)                                                     \
  format_value_##type(value, sizeof(value), hora__params.name);                              \
  HORA_INFO("setting HORA_%s=%s%s", #name, value, getenv("HORA_" #name) ? "" : " (default)");
#define HORA_PARAM_CHOICE(name, scope, choices, def, doc)                                           \
  HORA_INFO("setting HORA_%s=%s%s", #name, hora__params.name,                                \
            getenv("HORA_" #name) ? "" : " (default)");
#include "base/params.def"
#undef HORA_PARAM
#undef HORA_PARAM_CHOICE
}

/* A '|' inside a cell, code spans included, must be escaped in Markdown tables. */
static void write_markdown_cell(FILE *f, const char *text) {
  for (const char *c = text; *c; c++) {
    if (*c == '|') {
      fputc('\\', f);
    }
    fputc(*c, f);
  }
}

static void write_markdown_row(FILE *f, const char *name, const char *scope, const char *type,
                               const char *def, const char *doc) {
  fprintf(f, "| `HORA_%s` | %s | ", name, scope);
  write_markdown_cell(f, type);
  fprintf(f, " | `%s` | ", def[0] ? def : "\"\"");
  write_markdown_cell(f, doc);
  fprintf(f, " |\n");
}

void hora__params_write_markdown(void *file) {
  FILE *f = file;
  fprintf(f, "| setting | scope | type | default | meaning |\n|---|---|---|---|---|\n");
#define HORA_PARAM(name, scope, type, def, doc) write_markdown_row(f, #name, #scope, #type, def, doc);
#define HORA_PARAM_CHOICE(name, scope, choices, def, doc)                                    \
  write_markdown_row(f, #name, #scope, "`" choices "`", def, doc);
#include "base/params.def"
#undef HORA_PARAM
#undef HORA_PARAM_CHOICE
}

/* ---- job-wide settings -------------------------------------------------- */

/* Byte sizes as people write them: 64M rather than 67108864. */
static void format_job_bytes(char *buf, size_t n, int64_t v) {
  static const char units[] = "GMK";
  for (int i = 0; i < 3; i++) {
    int64_t unit = (int64_t)1 << (30 - 10 * i);
    if (v != 0 && v % unit == 0) {
      snprintf(buf, n, "%lld%c", (long long)(v / unit), units[i]);
      return;
    }
  }
  snprintf(buf, n, "%lld", (long long)v);
}
static void format_job_int(char *buf, size_t n, int64_t v) { snprintf(buf, n, "%lld", (long long)v); }
/* %.17g: two different doubles never print alike. */
static void format_job_double(char *buf, size_t n, double v) { snprintf(buf, n, "%.17g", v); }
static void format_job_bool(char *buf, size_t n, bool v) { snprintf(buf, n, "%d", v ? 1 : 0); }
static void format_job_string(char *buf, size_t n, const char *v) { snprintf(buf, n, "%s", v); }

#define HORA_SCOPE_IS_JOB_job 1
#define HORA_SCOPE_IS_JOB_process 0
#define HORA_SCOPE_IS_JOB_agreed 0

size_t hora__params_job_encode(char *buf, size_t n) {
  size_t len = 0;
  char value[128];
#define APPEND_LINE(name)                                                                    \
  len += (size_t)snprintf(buf ? buf + HORA_MIN(len, n) : NULL,                               \
                          buf && len < n ? n - len : 0, "HORA_%s=%s\n", name, value)
#define HORA_PARAM(name, scope, type, def, doc)                                              \
  if (HORA_SCOPE_IS_JOB_##scope) {                                                           \
    format_job_##type(value, sizeof(value), hora__params.name);                              \
    APPEND_LINE(#name);                                                                      \
  }
#define HORA_PARAM_CHOICE(name, scope, choices, def, doc)                                    \
  if (HORA_SCOPE_IS_JOB_##scope) {                                                           \
    format_job_string(value, sizeof(value), hora__params.name);                              \
    APPEND_LINE(#name);                                                                      \
  }
#include "base/params.def"
#undef HORA_PARAM
#undef HORA_PARAM_CHOICE
#undef APPEND_LINE
  return len;
}

/* One "NAME=value" line of an encoding: [*p, end of line). */
static bool next_line(const char **p, const char *end, const char **line, size_t *len) {
  if (*p >= end) {
    return false;
  }
  const char *nl = memchr(*p, '\n', (size_t)(end - *p));
  *line = *p;
  *len = nl ? (size_t)(nl - *p) : (size_t)(end - *p);
  *p += *len + (nl ? 1 : 0);
  return true;
}

bool hora__params_job_difference(const char *a, size_t alen, int rank_a, const char *b,
                                 size_t blen, int rank_b, char *msg, size_t n) {
  const char *pa = a, *pb = b, *la, *lb;
  size_t na, nb;
  for (;;) {
    bool more_a = next_line(&pa, a + alen, &la, &na);
    bool more_b = next_line(&pb, b + blen, &lb, &nb);
    if (!more_a && !more_b) {
      return false;
    }
    if (more_a != more_b) {
      snprintf(msg, n, "ranks %d and %d run hora builds with different settings (%d has %.*s, "
               "the other has no such setting)", rank_a, rank_b, more_a ? rank_a : rank_b,
               (int)(more_a ? na : nb), more_a ? la : lb);
      return true;
    }
    if (na == nb && memcmp(la, lb, na) == 0) {
      continue;
    }
    const char *eqa = memchr(la, '=', na), *eqb = memchr(lb, '=', nb);
    size_t name_a = eqa ? (size_t)(eqa - la) : na, name_b = eqb ? (size_t)(eqb - lb) : nb;
    if (!eqa || !eqb || name_a != name_b || memcmp(la, lb, name_a) != 0) {
      snprintf(msg, n, "ranks %d and %d run hora builds with different settings (%.*s against %.*s)",
               rank_a, rank_b, (int)name_a, la, (int)name_b, lb);
      return true;
    }
    snprintf(msg, n, "%.*s differs: rank %d has %.*s, rank %d has %.*s", (int)name_a, la, rank_a,
             (int)(na - name_a - 1), eqa + 1, rank_b, (int)(nb - name_b - 1), eqb + 1);
    return true;
  }
}
