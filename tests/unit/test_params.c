/* Settings: parsers, errors that name the variable, and the docs table. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/coll/collectives.h"
#include "../runner.h"

TEST(params_parse_values) {
  int64_t v;
  ASSERT(hora__parse_bytes("X", "65536", &v) == HORA_SUCCESS && v == 65536);
  ASSERT(hora__parse_bytes("X", "64K", &v) == HORA_SUCCESS && v == 64 << 10);
  ASSERT(hora__parse_bytes("X", "64MiB", &v) == HORA_SUCCESS && v == 64 << 20);
  ASSERT(hora__parse_bytes("X", "2g", &v) == HORA_SUCCESS && v == 2ll << 30);
  ASSERT(hora__parse_bytes("X", "0", &v) == HORA_SUCCESS && v == 0);
  ASSERT(hora__parse_bytes("X", "-1", &v) == HORA_ERR_INVALID_ARG);
  ASSERT(hora__parse_bytes("X", "12Q", &v) == HORA_ERR_INVALID_ARG);
  ASSERT(hora__parse_bytes("X", "", &v) == HORA_ERR_INVALID_ARG);
  ASSERT(hora__parse_bytes("X", "99999999999999999999", &v) == HORA_ERR_INVALID_ARG);
  ASSERT(hora__parse_int("X", "-42", &v) == HORA_SUCCESS && v == -42);
  ASSERT(hora__parse_int("X", "4.2", &v) == HORA_ERR_INVALID_ARG);
  double d;
  ASSERT(hora__parse_double("X", "2.5", &d) == HORA_SUCCESS && d == 2.5);
  ASSERT(hora__parse_double("X", "nan", &d) == HORA_ERR_INVALID_ARG);
  ASSERT(hora__parse_double("X", "1e999", &d) == HORA_ERR_INVALID_ARG);
  bool b;
  ASSERT(hora__parse_bool("X", "yes", &b) == HORA_SUCCESS && b);
  ASSERT(hora__parse_bool("X", "OFF", &b) == HORA_SUCCESS && !b);
  ASSERT(hora__parse_bool("X", "maybe", &b) == HORA_ERR_INVALID_ARG);
  const char *c;
  ASSERT(hora__parse_choice("X", "TCP", "auto|tcp", &c) == HORA_SUCCESS && strncmp(c, "tcp", 3) == 0);
  ASSERT(hora__parse_choice("X", "tc", "auto|tcp", &c) == HORA_ERR_INVALID_ARG);
  ASSERT(hora__parse_choice("X", "", "auto|tcp", &c) == HORA_ERR_INVALID_ARG);
}

TEST(params_env_errors_name_variable) {
  ASSERT(hora__params_load() == HORA_SUCCESS);
  ASSERT_EQ_INT(hora__params.FUSION_THRESHOLD, 64 << 20);
  setenv("HORA_FUSION_THRESHOLD", "lots", 1);
  ASSERT_EQ_INT(hora__params_load(), HORA_ERR_INVALID_ARG);
  ASSERT_STR_CONTAINS(hora_last_error(), "HORA_FUSION_THRESHOLD");
  ASSERT_STR_CONTAINS(hora_last_error(), "lots");
  /* The old values stay in place after a failed load. */
  ASSERT_EQ_INT(hora__params.FUSION_THRESHOLD, 64 << 20);
  setenv("HORA_FUSION_THRESHOLD", "1M", 1);
  setenv("HORA_LOG_LEVEL", "loud", 1);
  ASSERT_EQ_INT(hora__params_load(), HORA_ERR_INVALID_ARG);
  ASSERT_STR_CONTAINS(hora_last_error(), "HORA_LOG_LEVEL");
  setenv("HORA_LOG_LEVEL", "debug", 1);
  setenv("HORA_CHUNK_SIZE", "100", 1);
  ASSERT_EQ_INT(hora__params_load(), HORA_ERR_INVALID_ARG);
  ASSERT_STR_CONTAINS(hora_last_error(), "HORA_CHUNK_SIZE");
  unsetenv("HORA_CHUNK_SIZE");
  setenv("HORA_IFACE", "eth7", 1);
  ASSERT(hora__params_load() == HORA_SUCCESS);
  ASSERT_EQ_INT(hora__params.FUSION_THRESHOLD, 1 << 20);
  ASSERT(strcmp(hora__params.LOG_LEVEL, "debug") == 0);
  setenv("HORA_IFACE", "changed", 1); /* the loaded copy must not follow */
  ASSERT(strcmp(hora__params.IFACE, "eth7") == 0);
  unsetenv("HORA_FUSION_THRESHOLD");
  unsetenv("HORA_LOG_LEVEL");
  unsetenv("HORA_IFACE");
  ASSERT(hora__params_load() == HORA_SUCCESS);
}

TEST(params_markdown_lists_every_setting) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ASSERT(f);
  hora__params_write_markdown(f);
  fclose(f);
  const char *names[] = {
#define HORA_PARAM(name, scope, type, def, doc) "`HORA_" #name "`",
#define HORA_PARAM_CHOICE(name, scope, choices, def, doc) "`HORA_" #name "`",
#include "base/params.def"
#undef HORA_PARAM
#undef HORA_PARAM_CHOICE
  };
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    if (!strstr(buf, names[i])) {
      free(buf);
      FAIL("settings table lacks %s", names[i]);
    }
  }
  /* The settings API.md requires exist. */
  const char *required[] = {"HORA_FUSION_THRESHOLD", "HORA_CYCLE_TIME", "HORA_STALL_CHECK_TIME_SECONDS",
                            "HORA_STALL_SHUTDOWN_TIME_SECONDS", "HORA_LOG_LEVEL", "HORA_TRANSPORT",
                            "HORA_IFACE"};
  for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
    if (!strstr(buf, required[i])) {
      free(buf);
      FAIL("settings table lacks %s", required[i]);
    }
  }
  free(buf);
}

/* The job-wide encoding of the settings in the environment now (NULL if
 * they do not load), with its length in *n. */
static char *job_encoding(size_t *n) {
  if (hora__params_load() != HORA_SUCCESS) {
    return NULL;
  }
  *n = hora__params_job_encode(NULL, 0);
  char *e = malloc(*n + 1);
  if (e && (hora__params_job_encode(e, *n + 1) != *n || strlen(e) != *n)) {
    free(e);
    e = NULL;
  }
  return e;
}

/* Job-wide settings: per-process ones stay out of the encoding, equal
 * values encode alike however they were spelled, and a difference names
 * the setting and both ranks' values. */
TEST(params_job_encoding_and_difference) {
  setenv("HORA_FUSION_THRESHOLD", "67108864", 1);
  setenv("HORA_LOG_LEVEL", "error", 1);
  size_t n = 0, nb = 0, m = 0;
  char *a = job_encoding(&n);
  ASSERT(a);
  ASSERT_STR_CONTAINS(a, "HORA_FUSION_THRESHOLD=64M\n");
  ASSERT_STR_CONTAINS(a, "HORA_VERIFY=0\n");
  ASSERT_STR_CONTAINS(a, "HORA_TRANSPORT=auto\n");
  ASSERT(strstr(a, "HORA_LOG_LEVEL") == NULL && strstr(a, "HORA_IFACE") == NULL);
  /* A short buffer is never overrun and the length stays the whole one. */
  char small[8];
  ASSERT(hora__params_job_encode(small, sizeof(small)) == n && strlen(small) == 7);

  setenv("HORA_FUSION_THRESHOLD", "64M", 1);
  unsetenv("HORA_LOG_LEVEL");
  char *b = job_encoding(&nb);
  ASSERT(b && nb == n && strcmp(a, b) == 0);
  char msg[256];
  ASSERT(!hora__params_job_difference(a, n, 0, b, n, 3, msg, sizeof(msg)));

  setenv("HORA_FUSION_THRESHOLD", "0", 1);
  setenv("HORA_CHUNK_SIZE", "1000000", 1);
  char *c = job_encoding(&m);
  ASSERT(c);
  ASSERT(hora__params_job_difference(a, n, 0, c, m, 3, msg, sizeof(msg)));
  /* The first that differs, in table order. */
  ASSERT_STR_CONTAINS(msg, "HORA_CHUNK_SIZE differs: rank 0 has 512K, rank 3 has 1000000");
  /* A build with another list of settings is named as such. */
  const char *other = "HORA_SOMETHING_NEW=1\n";
  ASSERT(hora__params_job_difference(a, n, 0, other, strlen(other), 1, msg, sizeof(msg)));
  ASSERT_STR_CONTAINS(msg, "different settings");
  ASSERT(hora__params_job_difference(a, n, 0, a, n / 2, 1, msg, sizeof(msg)));
  free(a);
  free(b);
  free(c);
  unsetenv("HORA_FUSION_THRESHOLD");
  unsetenv("HORA_CHUNK_SIZE");
  ASSERT(hora__params_load() == HORA_SUCCESS);
}

/* HORA_HIERARCHICAL_ADASUM: auto (the default) is hierarchical for device
 * buffers only, as Horovod's GPU and CPU Adasum; 0 and 1 force either. */
TEST(params_hierarchical_adasum_follows_horovod) {
  unsetenv("HORA_HIERARCHICAL_ADASUM");
  ASSERT(hora__params_load() == HORA_SUCCESS);
  ASSERT(strcmp(hora__params.HIERARCHICAL_ADASUM, "auto") == 0);
  ASSERT(hora__adasum_wants_hosts(hora__params.HIERARCHICAL_ADASUM, true));
  ASSERT(!hora__adasum_wants_hosts(hora__params.HIERARCHICAL_ADASUM, false));
  setenv("HORA_HIERARCHICAL_ADASUM", "0", 1);
  ASSERT(hora__params_load() == HORA_SUCCESS);
  ASSERT(!hora__adasum_wants_hosts(hora__params.HIERARCHICAL_ADASUM, true));
  ASSERT(!hora__adasum_wants_hosts(hora__params.HIERARCHICAL_ADASUM, false));
  setenv("HORA_HIERARCHICAL_ADASUM", "1", 1);
  ASSERT(hora__params_load() == HORA_SUCCESS);
  ASSERT(hora__adasum_wants_hosts(hora__params.HIERARCHICAL_ADASUM, true));
  ASSERT(hora__adasum_wants_hosts(hora__params.HIERARCHICAL_ADASUM, false));
  setenv("HORA_HIERARCHICAL_ADASUM", "sometimes", 1);
  ASSERT_EQ_INT(hora__params_load(), HORA_ERR_INVALID_ARG);
  ASSERT_STR_CONTAINS(hora_last_error(), "HORA_HIERARCHICAL_ADASUM");
  unsetenv("HORA_HIERARCHICAL_ADASUM");
  ASSERT(hora__params_load() == HORA_SUCCESS);
}

/* Horovod's names: each read as its setting, converted, when the HORA_ name
 * is not set. */
static const char *const horovod_vars[] = {
    "HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CACHE_CAPACITY",
    "HOROVOD_HIERARCHICAL_ALLREDUCE", "HOROVOD_TIMELINE", "HOROVOD_TIMELINE_MARK_CYCLES",
    "HOROVOD_STALL_CHECK_DISABLE", "HOROVOD_STALL_CHECK_TIME_SECONDS",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_LOG_LEVEL", "HOROVOD_GLOO_IFACE",
    "HOROVOD_GLOO_TIMEOUT_SECONDS", "HOROVOD_AUTOTUNE", "HOROVOD_GPU_OPERATIONS",
    "HOROVOD_NO_SUCH_SETTING", "HORA_CYCLE_TIME", "HORA_FUSION_THRESHOLD", "HORA_LOG_FILE",
    "HORA_LOG_LEVEL"};

static void unset_horovod_vars(void) {
  for (size_t i = 0; i < sizeof(horovod_vars) / sizeof(horovod_vars[0]); i++) {
    unsetenv(horovod_vars[i]);
  }
}

TEST(params_horovod_aliases_convert) {
  unset_horovod_vars();
  setenv("HOROVOD_CYCLE_TIME", "2.5", 1);           /* milliseconds, a float */
  setenv("HOROVOD_FUSION_THRESHOLD", "33554432", 1); /* bytes */
  setenv("HOROVOD_CACHE_CAPACITY", "0", 1);
  setenv("HOROVOD_HIERARCHICAL_ALLREDUCE", "2", 1); /* Horovod: strtol > 0 */
  setenv("HOROVOD_TIMELINE", "/tmp/hvd-timeline.json", 1);
  setenv("HOROVOD_TIMELINE_MARK_CYCLES", "1", 1);
  setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "30", 1);
  setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "120", 1);
  setenv("HOROVOD_LOG_LEVEL", "WARNING", 1);
  setenv("HOROVOD_GLOO_IFACE", "eth3", 1);
  setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "45", 1);
  ASSERT_EQ_INT(hora__params_load(), HORA_SUCCESS);
  ASSERT(hora__params.CYCLE_TIME == 2.5);
  ASSERT_EQ_INT(hora__params.FUSION_THRESHOLD, 32 << 20);
  ASSERT_EQ_INT(hora__params.CACHE_CAPACITY, 0);
  ASSERT(strcmp(hora__params.HIERARCHICAL_ALLREDUCE, "1") == 0);
  ASSERT(strcmp(hora__params.TIMELINE, "/tmp/hvd-timeline.json") == 0);
  ASSERT(hora__params.TIMELINE_MARK_CYCLES);
  ASSERT(hora__params.STALL_CHECK_TIME_SECONDS == 30);
  ASSERT(hora__params.STALL_SHUTDOWN_TIME_SECONDS == 120);
  ASSERT(strcmp(hora__params.LOG_LEVEL, "warn") == 0);
  ASSERT(strcmp(hora__params.IFACE, "eth3") == 0);
  ASSERT(hora__params.CONNECT_TIMEOUT_SECONDS == 45);
  /* The job-wide comparison sees the converted values. */
  size_t n = hora__params_job_encode(NULL, 0);
  char *e = malloc(n + 1);
  ASSERT(e);
  hora__params_job_encode(e, n + 1);
  bool ok = strstr(e, "HORA_FUSION_THRESHOLD=32M\n") && strstr(e, "HORA_CACHE_CAPACITY=0\n") &&
            strstr(e, "HORA_HIERARCHICAL_ALLREDUCE=1\n");
  free(e);
  ASSERT(ok);

  setenv("HOROVOD_HIERARCHICAL_ALLREDUCE", "0", 1);
  setenv("HOROVOD_TIMELINE", "DYNAMIC", 1); /* no file until hora_start_timeline */
  setenv("HOROVOD_TIMELINE_MARK_CYCLES", "0", 1);
  setenv("HOROVOD_STALL_CHECK_DISABLE", "1", 1); /* wins over the check time, as in Horovod */
  setenv("HOROVOD_LOG_LEVEL", "fatal", 1);
  ASSERT_EQ_INT(hora__params_load(), HORA_SUCCESS);
  ASSERT(strcmp(hora__params.HIERARCHICAL_ALLREDUCE, "0") == 0);
  ASSERT(strcmp(hora__params.TIMELINE, "") == 0);
  ASSERT(!hora__params.TIMELINE_MARK_CYCLES);
  ASSERT(hora__params.STALL_CHECK_TIME_SECONDS == 0);
  ASSERT(strcmp(hora__params.LOG_LEVEL, "error") == 0);

  setenv("HOROVOD_STALL_CHECK_DISABLE", "0", 1); /* leaves the check alone */
  setenv("HOROVOD_LOG_LEVEL", "Trace", 1);
  ASSERT_EQ_INT(hora__params_load(), HORA_SUCCESS);
  ASSERT(hora__params.STALL_CHECK_TIME_SECONDS == 30);
  ASSERT(strcmp(hora__params.LOG_LEVEL, "trace") == 0);

  /* The HORA_ name wins. */
  setenv("HORA_CYCLE_TIME", "7", 1);
  setenv("HORA_FUSION_THRESHOLD", "1M", 1);
  ASSERT_EQ_INT(hora__params_load(), HORA_SUCCESS);
  ASSERT(hora__params.CYCLE_TIME == 7);
  ASSERT_EQ_INT(hora__params.FUSION_THRESHOLD, 1 << 20);
  unset_horovod_vars();
  unsetenv("HOROVOD_STALL_CHECK_DISABLE");
  ASSERT_EQ_INT(hora__params_load(), HORA_SUCCESS);
  ASSERT(hora__params.CYCLE_TIME == 1);
  ASSERT(strcmp(hora__params.TIMELINE, "") == 0);
}

/* A bad Horovod value fails the load with a message naming the HOROVOD_
 * variable, as a bad HORA_ value names its own. */
TEST(params_horovod_errors_name_variable) {
  unset_horovod_vars();
  ASSERT_EQ_INT(hora__params_load(), HORA_SUCCESS);
  const struct {
    const char *var, *value, *message;
  } bad[] = {
      {"HOROVOD_FUSION_THRESHOLD", "lots", "HOROVOD_FUSION_THRESHOLD='lots' is not a byte size"},
      {"HOROVOD_CYCLE_TIME", "fast", "HOROVOD_CYCLE_TIME='fast' is not a number"},
      {"HOROVOD_CYCLE_TIME", "-1", "HOROVOD_CYCLE_TIME=-1 must not be negative"},
      {"HOROVOD_CACHE_CAPACITY", "-5", "HOROVOD_CACHE_CAPACITY=-5 is outside"},
      {"HOROVOD_LOG_LEVEL", "loud", "HOROVOD_LOG_LEVEL='loud' is not one of Horovod's levels"},
      {"HOROVOD_HIERARCHICAL_ALLREDUCE", "maybe",
       "HOROVOD_HIERARCHICAL_ALLREDUCE='maybe' is not a flag"},
      {"HOROVOD_STALL_CHECK_DISABLE", "x", "HOROVOD_STALL_CHECK_DISABLE='x' is not a flag"},
      {"HOROVOD_GLOO_TIMEOUT_SECONDS", "0", "HOROVOD_GLOO_TIMEOUT_SECONDS=0 must be positive"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    setenv(bad[i].var, bad[i].value, 1);
    int rc = hora__params_load();
    unsetenv(bad[i].var);
    ASSERT_EQ_INT(rc, HORA_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(hora_last_error(), bad[i].message);
    ASSERT_EQ_INT(hora__params.FUSION_THRESHOLD, 64 << 20); /* the old values stay */
  }
  /* Overridden by the HORA_ name, a bad Horovod value is only noted. */
  setenv("HORA_CYCLE_TIME", "2", 1);
  setenv("HOROVOD_CYCLE_TIME", "fast", 1);
  ASSERT_EQ_INT(hora__params_load(), HORA_SUCCESS);
  ASSERT(hora__params.CYCLE_TIME == 2);
  unset_horovod_vars();
  ASSERT_EQ_INT(hora__params_load(), HORA_SUCCESS);
}

/* The whole log file at path (NULL if none). */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) {
    return NULL;
  }
  char *buf = calloc(1, 1 << 16);
  if (buf) {
    size_t n = fread(buf, 1, (1 << 16) - 1, f);
    buf[n] = '\0';
  }
  fclose(f);
  return buf;
}

static int count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++) {
    n++;
  }
  return n;
}

/* What hora makes of each HOROVOD_* variable is logged once per process:
 * the HORA_ name winning, a variable read, one not honoured (with why), one
 * unknown; warnings show at the default level, the rest at info. */
TEST(params_horovod_logged_once) {
  unset_horovod_vars();
  char path[] = "/tmp/hora-test-params-XXXXXX";
  int fd = mkstemp(path);
  ASSERT(fd >= 0);
  close(fd);
  setenv("HORA_LOG_FILE", path, 1);
  setenv("HORA_LOG_LEVEL", "warn", 1);
  setenv("HORA_CYCLE_TIME", "3", 1);
  setenv("HOROVOD_CYCLE_TIME", "5", 1);
  setenv("HOROVOD_FUSION_THRESHOLD", "1048576", 1);
  setenv("HOROVOD_AUTOTUNE", "1", 1);
  setenv("HOROVOD_GPU_OPERATIONS", "NCCL", 1);
  setenv("HOROVOD_NO_SUCH_SETTING", "1", 1);
  char *log = NULL;
  for (int round = 0; round < 3; round++) { /* three hora_inits of one process */
    if (round == 2) {
      setenv("HORA_LOG_LEVEL", "info", 1);
    }
    ASSERT_EQ_INT(hora__params_load(), HORA_SUCCESS);
    ASSERT(hora__params.CYCLE_TIME == 3);
    ASSERT_EQ_INT(hora__params.FUSION_THRESHOLD, 1 << 20);
    ASSERT_EQ_INT(hora__log_open(), HORA_SUCCESS);
    hora__params_log_horovod();
    if (round == 1) {
      log = slurp(path);
      ASSERT(log);
      /* At warn: the overridden value and the unhonoured autotuner only. */
      int over =
          count(log, "HOROVOD_CYCLE_TIME='5' is not read: HORA_CYCLE_TIME='3' is set and wins");
      int tune = count(log, "HOROVOD_AUTOTUNE='1' ignored: not implemented");
      bool quiet = !strstr(log, "HOROVOD_GPU_OPERATIONS") && !strstr(log, "NO_SUCH");
      free(log);
      log = NULL;
      ASSERT_EQ_INT(over, 1);
      ASSERT_EQ_INT(tune, 1);
      ASSERT(quiet);
    }
  }
  log = slurp(path);
  unset_horovod_vars();
  unsetenv("HOROVOD_FUSION_THRESHOLD");
  unlink(path);
  ASSERT_EQ_INT(hora__params_load(), HORA_SUCCESS);
  hora__log_open(); /* back to stderr */
  ASSERT(log);
  int over = count(log, "is set and wins"), tune = count(log, "HOROVOD_AUTOTUNE");
  int read = count(log, "HOROVOD_FUSION_THRESHOLD='1048576' read as HORA_FUSION_THRESHOLD=1048576");
  int gpu = count(log, "HOROVOD_GPU_OPERATIONS='NCCL' ignored: chosen when Horovod is built");
  int unknown = count(log, "HOROVOD_NO_SUCH_SETTING='1' ignored: not a Horovod setting");
  int warns = count(log, " hora WARN HOROVOD_");
  free(log);
  ASSERT_EQ_INT(over, 1);
  ASSERT_EQ_INT(tune, 1);
  ASSERT_EQ_INT(read, 1);
  ASSERT_EQ_INT(gpu, 1);
  ASSERT_EQ_INT(unknown, 1);
  ASSERT_EQ_INT(warns, 2); /* the override and the autotuner */
}

/* Each Horovod name is in its setting's row of the table. */
TEST(params_markdown_names_horovod_aliases) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ASSERT(f);
  hora__params_write_markdown(f);
  fclose(f);
  ASSERT_STR_CONTAINS(buf, "| setting | Horovod | scope |");
  const char *pairs[][2] = {
#define HORA_PARAM(name, scope, type, def, doc)
#define HORA_PARAM_CHOICE(name, scope, choices, def, doc)
#define HORA_HOROVOD(name, horovod, conv, doc) {"| `HORA_" #name "` | ", "`" #horovod "`"},
#include "base/params.def"
#undef HORA_PARAM
#undef HORA_PARAM_CHOICE
#undef HORA_HOROVOD
  };
  for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
    const char *row = strstr(buf, pairs[i][0]);
    const char *end = row ? strchr(row, '\n') : NULL;
    const char *alias = row ? strstr(row, pairs[i][1]) : NULL;
    if (!row || !alias || alias > end) {
      free(buf);
      FAIL("the row of %s lacks %s", pairs[i][0], pairs[i][1]);
    }
  }
  free(buf);
}
