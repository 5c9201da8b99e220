/* Prometheus metrics: the text exposition format 0.0.4, served over HTTP
 * (HORA_METRICS_PORT) and written to a file (HORA_METRICS_FILE) by a thread
 * of its own (metrics_http.c), never the coordinator.
 *
 * The text is made of families, each written by a source: a function that
 * calls hora__metrics_family once per family, then hora__metrics_sample for
 * each of its samples. Sources run on the metrics thread at each scrape, in
 * the order they were added, with the sources' lock held: they must read
 * counters (atomics) and not wait on the engine. metrics.c writes the
 * process's own families (CPU, memory, network, GPU, events); the runtime's
 * counters come from a source that runtime/api adds (api/metrics.c) and
 * are rendered by metrics_runtime.c. */
#ifndef HORA_METRICS_H
#define HORA_METRICS_H

#include "base/common.h"
#include "base/wire.h"
#include "runtime/runtime.h"

/* ---- the writer ------------------------------------------------------------ */

struct hora__metrics_writer {
  struct hora__wbuf text; /* failed: out of memory, the text is incomplete, not to be served */
  char common[320];       /* rank="..",host="..": the labels of every sample */
};

/* Begins a family: its # HELP and # TYPE lines. type: "counter", "gauge",
 * "histogram". Names follow Prometheus' rules: hora_ prefix, base units
 * (seconds, bytes), _total for counters. */
void hora__metrics_family(struct hora__metrics_writer *w, const char *name, const char *type,
                          const char *help);
/* One sample: name{common,labels} value. labels: more pairs, already
 * formatted (`kind="allreduce",dtype="float32"`, values escaped with
 * hora__metrics_escape), or NULL. */
void hora__metrics_sample(struct hora__metrics_writer *w, const char *name, const char *labels,
                          double value);
/* The same with an exact integer (counters beyond 2^53 stay exact). */
void hora__metrics_sample_u64(struct hora__metrics_writer *w, const char *name, const char *labels,
                              uint64_t value);
/* A histogram's samples (after its family): the cumulative _bucket lines
 * for the upper bounds `le` (n of them; counts has n + 1 entries, the last
 * for +Inf; per bucket, not cumulative), _sum and _count. */
void hora__metrics_histogram(struct hora__metrics_writer *w, const char *name, const char *labels,
                             const double *le, const uint64_t *counts, int n, double sum);
/* A label value escaped for the format (\\, \" and \n) into out. */
void hora__metrics_escape(char *out, size_t n, const char *value);

/* ---- sources ------------------------------------------------------------------ */

typedef void (*hora__metrics_source_fn)(struct hora__metrics_writer *w, void *arg);
/* HORA_ERR_NO_MEMORY when the table (16 sources) is full. */
int hora__metrics_add_source(hora__metrics_source_fn fn, void *arg);
/* Waits out a render in progress: after it, fn is not running. */
void hora__metrics_remove_source(hora__metrics_source_fn fn, void *arg);

/* Who this process is, for the common labels and hora_info (set at start
 * and when an elastic reset gives it another rank). */
void hora__metrics_set_identity(int rank, int size, int local_rank);

/* The whole text into w (zeroed by the caller; hora__wbuf_free(&w->text) after). */
void hora__metrics_render(struct hora__metrics_writer *w);

/* ---- events counted for the whole process ------------------------------------ */

enum hora__metrics_event {
  HORA__EV_STALL_WARNING, /* the stall inspector warned (rank 0) */
  HORA__EV_PEER_LOST,     /* a runtime failed with HORA_ERR_PEER_LOST */
  HORA__EV_ELASTIC_RESET, /* hora_elastic_reset completed */
  HORA__EV_COUNT
};
void hora__metrics_event(enum hora__metrics_event ev);

/* ---- the runtime's counters (metrics_runtime.c) ------------------------------ */

/* The coordinator, after a collective: `ops` tensors of hora__kind `kind`
 * and `dtype`, `bytes` of them, in `ns` (0: not timed, as an eager
 * allreduce, whose data came with its cycle: no bandwidth observed). */
void hora__metrics_account(struct hora__runtime *rt, int kind, int dtype, uint64_t ops,
                           uint64_t bytes, uint64_t ns);

/* What a scrape reports of one runtime: hora_get_stats' counters (filled
 * by the caller, runtime/api) and the metrics' own. */
struct hora__metrics_snapshot {
  hora_stats stats;
  int set_id;
  uint64_t kind_bytes[HORA__MKINDS];
  uint64_t kind_dtype_ops[HORA__MKINDS][HORA__MDTYPES];
  uint64_t busbw[HORA__MKINDS][HORA__MSIZES][HORA__MBW_BUCKETS];
  uint64_t busbw_sum[HORA__MKINDS][HORA__MSIZES];
};
/* The metrics' own counters of rt into *s (set_id too; not s->stats). */
void hora__metrics_snapshot_take(struct hora__metrics_snapshot *s, struct hora__runtime *rt);
/* The runtime families, one sample per runtime (label process_set) each;
 * shm: the world's process-wide shared-memory byte counters (NULL: none). */
void hora__metrics_render_runtimes(struct hora__metrics_writer *w,
                                   const struct hora__metrics_snapshot *snaps, int n,
                                   const hora_stats *shm);

/* ---- serving (metrics_http.c) ------------------------------------------------- */

/* HORA_METRICS_* values a process can reject before it starts anything
 * (HORA_ERR_INVALID_ARG with a message naming the setting). */
int hora__metrics_check_settings(void);
/* Starts the thread when HORA_METRICS_PORT or HORA_METRICS_FILE is set: the
 * endpoint on port + local_rank, the file with %r as rank. A port that
 * cannot be bound or a file that cannot be written is a warning, not an
 * error: the job runs on. Fails only when the thread cannot start. */
int hora__metrics_start(int rank, int local_rank);
/* Writes the file a last time and stops the thread (no-op if not running). */
void hora__metrics_stop(void);

#endif
