/* Logging: silent unless HORA_LOG_LEVEL asks; each line starts with host,
 * pid and rank, because in a 64-rank log the rank is what one looks for. */
#ifndef HORA_LOG_H
#define HORA_LOG_H

#include "base/common.h"

enum hora__log_level {
  HORA_LOG_NONE,
  HORA_LOG_ERROR,
  HORA_LOG_WARN,
  HORA_LOG_INFO,
  HORA_LOG_DEBUG,
  HORA_LOG_TRACE
};

extern int hora__log_level; /* read without a lock: set before threads start */

static inline bool hora__log_enabled(int level) { return level <= hora__log_level; }

/* Applies HORA_LOG_LEVEL and HORA_LOG_FILE from the loaded settings. */
int hora__log_open(void);
void hora__log_close(void);
/* The rank shown in the prefix (-1 until known). */
void hora__log_set_rank(int rank);
const char *hora__log_hostname(void);

void hora__log_write(int level, const char *file, int line, const char *fmt, ...)
    HORA_PRINTF(4, 5);

/* The level is checked before any argument is evaluated or formatted. */
#define HORA_LOG(level, ...)                                                                 \
  do {                                                                                       \
    if (HORA_UNLIKELY(hora__log_enabled(level))) {                                           \
      hora__log_write(level, __FILE__, __LINE__, __VA_ARGS__);                               \
    }                                                                                        \
  } while (0)
#define HORA_ERROR(...) HORA_LOG(HORA_LOG_ERROR, __VA_ARGS__)
#define HORA_WARN(...) HORA_LOG(HORA_LOG_WARN, __VA_ARGS__)
#define HORA_INFO(...) HORA_LOG(HORA_LOG_INFO, __VA_ARGS__)
#define HORA_DEBUG(...) HORA_LOG(HORA_LOG_DEBUG, __VA_ARGS__)
#define HORA_TRACE(...) HORA_LOG(HORA_LOG_TRACE, __VA_ARGS__)

#endif
