/* The settings of base/params.def, parsed once by hora__params_load(). */
#ifndef HORA_PARAMS_H
#define HORA_PARAMS_H

#include "base/common.h"

#define HORA_PARAM_CTYPE_bytes int64_t
#define HORA_PARAM_CTYPE_int int64_t
#define HORA_PARAM_CTYPE_double double
#define HORA_PARAM_CTYPE_bool bool
#define HORA_PARAM_CTYPE_string const char *

struct hora__params {
#define HORA_PARAM(name, scope, type, def, doc) HORA_PARAM_CTYPE_##type name;
#define HORA_PARAM_CHOICE(name, scope, choices, def, doc) const char *name;
#include "base/params.def"
#undef HORA_PARAM
#undef HORA_PARAM_CHOICE
};

/* Read after hora__params_load() succeeded; written by nobody else. */
extern struct hora__params hora__params;

/* Parses every setting from the environment into hora__params. On a
 * malformed value returns HORA_ERR_INVALID_ARG with a message naming the
 * variable, and leaves the previous values in place. */
int hora__params_load(void);

/* Logs every setting and whether it came from the environment (info level). */
void hora__params_log(void);

/* Logs, once per process, what the last load found about HOROVOD_*
 * variables: those read as a setting (info), those a HORA_ name overrode
 * (warn when the values differ), and those hora does not honour, with why
 * (params.def's HORA_HOROVOD_IGNORED). Call once the log is open. */
void hora__params_log_horovod(void);

/* Writes the settings table as Markdown (for docs/settings.md). */
void hora__params_write_markdown(void *file);

/* Writes the HOROVOD_* variables hora does not honour, one a line, with
 * the level their note is logged at and why (hora-info --horovod). */
void hora__params_write_horovod_ignored(void *file);

/* The job-wide settings (scope `job` in params.def), one "HORA_NAME=value\n"
 * line each in table order, with values in one canonical form: equal
 * encodings mean equal settings. Writes at most n bytes (buf may be NULL)
 * and returns the length the whole encoding needs, like snprintf. */
size_t hora__params_job_encode(char *buf, size_t n);

/* Compares two ranks' encodings. When they differ, writes a message naming
 * the first setting that differs and both values ("HORA_CHUNK_SIZE differs:
 * rank 0 has 512K, rank 3 has 1M") and returns true. */
bool hora__params_job_difference(const char *a, size_t alen, int rank_a, const char *b,
                                 size_t blen, int rank_b, char *msg, size_t n);

/* Parsers, exposed for the unit tests. Return HORA_SUCCESS or
 * HORA_ERR_INVALID_ARG with a message. */
int hora__parse_bytes(const char *var, const char *s, int64_t *out);
int hora__parse_int(const char *var, const char *s, int64_t *out);
int hora__parse_double(const char *var, const char *s, double *out);
int hora__parse_bool(const char *var, const char *s, bool *out);
int hora__parse_choice(const char *var, const char *s, const char *choices, const char **out);

#endif
