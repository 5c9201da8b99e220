/* Settings: parsers, errors that name the variable, and the docs table. */
#include <stdio.h>
#include <stdlib.h>

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
