/* Settings: parsing and documentation generated from runtime/params.def. */
#include "base/params.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
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

/* ---- Horovod's names ---------------------------------------------------- */

enum {
#define HORA_PARAM(name, scope, type, def, doc) HORA_P_##name,
#define HORA_PARAM_CHOICE(name, scope, choices, def, doc) HORA_P_##name,
#include "base/params.def"
#undef HORA_PARAM
#undef HORA_PARAM_CHOICE
  HORA_P_COUNT
};

enum horovod_conv { CONV_same, CONV_flag, CONV_log_level, CONV_timeline, CONV_disable };

static const struct horovod_alias {
  int param;
  const char *horovod;
  enum horovod_conv conv;
  const char *doc;
} horovod_aliases[] = {
#define HORA_PARAM(name, scope, type, def, doc)
#define HORA_PARAM_CHOICE(name, scope, choices, def, doc)
#define HORA_HOROVOD(name, horovod, conv, doc) {HORA_P_##name, #horovod, CONV_##conv, doc},
#include "base/params.def"
#undef HORA_PARAM
#undef HORA_PARAM_CHOICE
#undef HORA_HOROVOD
};

#define HORA_HOROVOD_LEVEL_warn HORA_LOG_WARN
#define HORA_HOROVOD_LEVEL_info HORA_LOG_INFO
static const struct horovod_ignored {
  const char *pattern;
  int level;
  const char *why;
} horovod_ignored[] = {
#define HORA_PARAM(name, scope, type, def, doc)
#define HORA_PARAM_CHOICE(name, scope, choices, def, doc)
#define HORA_HOROVOD_IGNORED(pattern, level, why) {pattern, HORA_HOROVOD_LEVEL_##level, why},
#include "base/params.def"
#undef HORA_PARAM
#undef HORA_PARAM_CHOICE
#undef HORA_HOROVOD_IGNORED
};

/* What the last load found about HOROVOD_* variables; the log is not open
 * while loading, so hora__params_log_horovod writes them later. */
static struct {
  int level;
  char text[320];
} notes[64];
static int nnotes;
/* Hashes of the notes this process has logged: each is logged once. */
static uint64_t logged[64];
static int nlogged;

static void HORA_PRINTF(2, 3) note(int level, const char *fmt, ...) {
  if (nnotes == (int)HORA_ARRAY_SIZE(notes)) {
    return;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(notes[nnotes].text, sizeof(notes[0].text), fmt, ap);
  va_end(ap);
  notes[nnotes++].level = level;
}

/* Horovod reads its flags with strtol (above 0 is on); hora's boolean
 * words are taken too. */
static int horovod_flag(const char *var, const char *v, bool *on) {
  errno = 0;
  char *end = NULL;
  long long x = strtoll(v, &end, 10);
  while (end && isspace((unsigned char)*end)) {
    end++;
  }
  if (errno == 0 && end != v && *end == '\0') {
    *on = x > 0;
    return HORA_SUCCESS;
  }
  static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
  for (size_t i = 0; i < HORA_ARRAY_SIZE(yes); i++) {
    if (strcasecmp(v, yes[i]) == 0 || strcasecmp(v, no[i]) == 0) {
      *on = strcasecmp(v, yes[i]) == 0;
      return HORA_SUCCESS;
    }
  }
  return hora__error(HORA_ERR_INVALID_ARG, "%s='%s' is not a flag (Horovod reads an integer: 0 "
                     "is off, above 0 on)", var, v);
}

/* Horovod's value v of a->horovod in the setting's own syntax (*out points
 * into the environment or at a literal); *applies is false when the value
 * leaves the setting alone. */
static int horovod_convert(const struct horovod_alias *a, const char *v, const char **out,
                           bool *applies) {
  static const char *const levels[][2] = {{"trace", "trace"}, {"debug", "debug"}, {"info", "info"},
                                          {"warning", "warn"}, {"error", "error"},
                                          {"fatal", "error"}};
  bool on = false;
  int rc = HORA_SUCCESS;
  *applies = true;
  *out = v;
  switch (a->conv) {
    case CONV_same:
      break;
    case CONV_timeline:
      if (strcmp(v, "DYNAMIC") == 0) {
        *out = ""; /* hora_start_timeline works without it */
      }
      break;
    case CONV_flag:
    case CONV_disable:
      rc = horovod_flag(a->horovod, v, &on);
      *out = a->conv == CONV_disable ? "0" : on ? "1" : "0";
      *applies = a->conv == CONV_flag || on;
      break;
    case CONV_log_level:
      for (size_t i = 0; i < HORA_ARRAY_SIZE(levels); i++) {
        if (strcasecmp(v, levels[i][0]) == 0) {
          *out = levels[i][1];
          return HORA_SUCCESS;
        }
      }
      rc = hora__error(HORA_ERR_INVALID_ARG, "%s='%s' is not one of Horovod's levels TRACE, "
                       "DEBUG, INFO, WARNING, ERROR, FATAL", a->horovod, v);
      break;
  }
  return rc;
}

/* A setting's value from the environment: HORA_NAME's, else that of the
 * first of its Horovod names that applies; NULL when none is set. *var
 * names the variable it came from. */
static int env_value(int param, const char *hora_var, const char **value, const char **var) {
  *var = hora_var;
  *value = getenv(hora_var);
  const char *raw = *value;
  for (size_t i = 0; i < HORA_ARRAY_SIZE(horovod_aliases); i++) {
    const struct horovod_alias *a = &horovod_aliases[i];
    const char *v = a->param == param ? getenv(a->horovod) : NULL;
    if (!v) {
      continue;
    }
    const char *conv = NULL;
    bool applies = false;
    int rc = horovod_convert(a, v, &conv, &applies);
    if (rc == HORA_SUCCESS && !applies) {
      continue;
    }
    if (*value) {
      bool same = rc == HORA_SUCCESS && applies && strcasecmp(conv, *value) == 0;
      note(same ? HORA_LOG_INFO : HORA_LOG_WARN,
           "%s='%.80s' is not read: %s='%.80s' is set and wins%s", a->horovod, v, *var, raw,
           same ? " (the same value)" : "");
      continue;
    }
    if (rc != HORA_SUCCESS) {
      return rc;
    }
    if (applies) {
      note(HORA_LOG_INFO, "%s='%.80s' read as %s=%.80s", a->horovod, v, hora_var, conv);
      *value = conv;
      *var = a->horovod;
      raw = v;
    }
  }
  return HORA_SUCCESS;
}

/* Notes each HOROVOD_* variable that no setting reads, with the reason. */
static void note_ignored_horovod(void) {
  extern char **environ;
  for (char **e = environ; e && *e; e++) {
    if (strncmp(*e, "HOROVOD_", 8) != 0) {
      continue;
    }
    size_t len = strcspn(*e, "=");
    const char *val = (*e)[len] ? *e + len + 1 : "";
    bool honoured = false;
    for (size_t i = 0; i < HORA_ARRAY_SIZE(horovod_aliases) && !honoured; i++) {
      honoured = strlen(horovod_aliases[i].horovod) == len &&
                 strncmp(horovod_aliases[i].horovod, *e, len) == 0;
    }
    const struct horovod_ignored *ig = NULL;
    for (size_t i = 0; i < HORA_ARRAY_SIZE(horovod_ignored) && !honoured && !ig; i++) {
      const char *pat = horovod_ignored[i].pattern;
      size_t plen = strlen(pat);
      bool prefix = plen && pat[plen - 1] == '*';
      if (prefix ? len >= plen - 1 && strncmp(*e, pat, plen - 1) == 0
                 : len == plen && strncmp(*e, pat, len) == 0) {
        ig = &horovod_ignored[i];
      }
    }
    if (honoured) {
      continue;
    }
    note(ig ? ig->level : HORA_LOG_INFO, "%.*s='%.80s' ignored: %s", (int)HORA_MIN(len, 100), *e,
         val, ig ? ig->why : "not a Horovod setting hora knows of");
  }
}

static uint64_t note_hash(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) {
    h = (h ^ (unsigned char)*s) * 1099511628211ull;
  }
  return h;
}

void hora__params_log_horovod(void) {
  for (int i = 0; i < nnotes; i++) {
    uint64_t h = note_hash(notes[i].text);
    bool seen = false;
    for (int j = 0; j < nlogged && !seen; j++) {
      seen = logged[j] == h;
    }
    if (seen || !hora__log_enabled(notes[i].level)) {
      continue;
    }
    if (nlogged < (int)HORA_ARRAY_SIZE(logged)) {
      logged[nlogged++] = h;
    }
    HORA_LOG(notes[i].level, "%s", notes[i].text);
  }
}

/* Where each setting of the last load came from (NULL: its default). */
static const char *sources[HORA_P_COUNT];

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
  const char *env, *var, *src[HORA_P_COUNT];
  const char *chosen;
  int rc;
  (void)chosen;
  nnotes = 0;
#define HORA_PARAM(name, scope, type, def, doc)                                              \
  rc = env_value(HORA_P_##name, "HORA_" #name, &env, &var);                                  \
  if (rc == HORA_SUCCESS) {                                                                  \
    rc = PARSE_##type(var, env ? env : def, &p.name);                                        \
  }                                                                                          \
  if (rc != HORA_SUCCESS) {                                                                  \
    return rc;                                                                               \
  }                                                                                          \
  src[HORA_P_##name] = env ? var : NULL;
#define HORA_PARAM_CHOICE(name, scope, choices, def, doc)                                    \
  rc = env_value(HORA_P_##name, "HORA_" #name, &env, &var);                                  \
  if (rc == HORA_SUCCESS) {                                                                  \
    rc = hora__parse_choice(var, env ? env : def, choices, &chosen);                         \
  }                                                                                          \
  if (rc != HORA_SUCCESS) {                                                                  \
    return rc;                                                                               \
  }                                                                                          \
  p.name = choice_copy(chosen);                                                              \
  src[HORA_P_##name] = env ? var : NULL;
#include "base/params.def"
#undef HORA_PARAM
#undef HORA_PARAM_CHOICE
  note_ignored_horovod();
  free_strings(&pending);
#define HORA_PARAM(name, scope, type, def, doc)                                                     \
  if (OWN_##type(&p.name) != HORA_SUCCESS) {                                                 \
    return hora__error(HORA_ERR_NO_MEMORY, "cannot copy setting HORA_" #name);               \
  }
#define HORA_PARAM_CHOICE(name, scope, choices, def, doc)
#include "base/params.def"
#undef HORA_PARAM
#undef HORA_PARAM_CHOICE
#define SRC(name) (src[HORA_P_##name] ? src[HORA_P_##name] : "HORA_" #name)
  if (p.CACHE_CAPACITY < 0 || p.CACHE_CAPACITY > (1 << 22)) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s=%lld is outside 0..4194304", SRC(CACHE_CAPACITY),
                       (long long)p.CACHE_CAPACITY);
  }
  if (p.CHUNK_SIZE < 4096) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s=%lld is below the minimum of 4096",
                       SRC(CHUNK_SIZE), (long long)p.CHUNK_SIZE);
  }
  const struct {
    const char *var;
    double v;
  } nonnegative[] = {{SRC(CYCLE_TIME), p.CYCLE_TIME},
                     {SRC(STALL_CHECK_TIME_SECONDS), p.STALL_CHECK_TIME_SECONDS},
                     {SRC(STALL_SHUTDOWN_TIME_SECONDS), p.STALL_SHUTDOWN_TIME_SECONDS},
                     {SRC(STRAGGLER_REPORT_SECONDS), p.STRAGGLER_REPORT_SECONDS},
                     {SRC(SPIN_TIME_US), (double)p.SPIN_TIME_US}};
  for (size_t i = 0; i < HORA_ARRAY_SIZE(nonnegative); i++) {
    if (nonnegative[i].v < 0) {
      return hora__error(HORA_ERR_INVALID_ARG, "%s=%g must not be negative", nonnegative[i].var,
                         nonnegative[i].v);
    }
  }
  if (!(p.STRAGGLER_SHARE > 0 && p.STRAGGLER_SHARE <= 1)) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s=%g is outside (0, 1]: a share of the time, "
                       "e.g. 0.05", SRC(STRAGGLER_SHARE), p.STRAGGLER_SHARE);
  }
  if (p.CONNECT_TIMEOUT_SECONDS <= 0) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s=%g must be positive", SRC(CONNECT_TIMEOUT_SECONDS),
                       p.CONNECT_TIMEOUT_SECONDS);
  }
#undef SRC
  hora__params = p;
  memcpy(sources, src, sizeof(sources));
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

static void log_setting(const char *name, const char *value, const char *source) {
  char from[80] = "";
  if (!source) {
    snprintf(from, sizeof(from), " (default)");
  } else if (strncmp(source, "HOROVOD_", 8) == 0) {
    snprintf(from, sizeof(from), " (from %s)", source);
  }
  if (strcmp(name, "SECRET") == 0 && value[0]) {
    value = "(set; not shown)";
  }
  HORA_INFO("setting HORA_%s=%s%s", name, value, from);
}

void hora__params_log(void) {
  if (!hora__log_enabled(HORA_LOG_INFO)) {
    return;
  }
  char value[512];
#define HORA_PARAM(name, scope, type, def, doc)                                                     \
  format_value_##type(value, sizeof(value), hora__params.name);                              \
  log_setting(#name, value, sources[HORA_P_##name]);
#define HORA_PARAM_CHOICE(name, scope, choices, def, doc)                                           \
  log_setting(#name, hora__params.name, sources[HORA_P_##name]);
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

/* The Horovod cell of a setting's row: its Horovod names, with how they
 * are read. */
static void write_markdown_horovod(FILE *f, int param) {
  const char *sep = "";
  for (size_t i = 0; i < HORA_ARRAY_SIZE(horovod_aliases); i++) {
    const struct horovod_alias *a = &horovod_aliases[i];
    if (a->param != param) {
      continue;
    }
    fprintf(f, "%s`%s`", sep, a->horovod);
    if (a->doc[0]) {
      fprintf(f, " (");
      write_markdown_cell(f, a->doc);
      fprintf(f, ")");
    }
    sep = "; ";
  }
}

static void write_markdown_row(FILE *f, int param, const char *name, const char *scope,
                               const char *type, const char *def, const char *doc) {
  fprintf(f, "| `HORA_%s` | ", name);
  write_markdown_horovod(f, param);
  fprintf(f, " | %s | ", scope);
  write_markdown_cell(f, type);
  fprintf(f, " | `%s` | ", def[0] ? def : "\"\"");
  write_markdown_cell(f, doc);
  fprintf(f, " |\n");
}

void hora__params_write_markdown(void *file) {
  FILE *f = file;
  fprintf(f, "| setting | Horovod | scope | type | default | meaning |\n"
             "|---|---|---|---|---|---|\n");
#define HORA_PARAM(name, scope, type, def, doc)                                              \
  write_markdown_row(f, HORA_P_##name, #name, #scope, #type, def, doc);
#define HORA_PARAM_CHOICE(name, scope, choices, def, doc)                                    \
  write_markdown_row(f, HORA_P_##name, #name, #scope, "`" choices "`", def, doc);
#include "base/params.def"
#undef HORA_PARAM
#undef HORA_PARAM_CHOICE
}

void hora__params_write_horovod_ignored(void *file) {
  FILE *f = file;
  for (size_t i = 0; i < HORA_ARRAY_SIZE(horovod_ignored); i++) {
    fprintf(f, "%-34s %s: %s\n", horovod_ignored[i].pattern,
            horovod_ignored[i].level == HORA_LOG_WARN ? "warn" : "info", horovod_ignored[i].why);
  }
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
