/* The timeline: a Chrome trace-event file (HORA_TIMELINE) written by rank 0,
 * one row per tensor, showing negotiation (with a mark as each rank became
 * ready), queueing, the copy into the fusion buffer, the collective, and the
 * copy out. Perfetto and chrome://tracing open it. The file is valid JSON
 * after every flush: events are written before a closing bracket that each
 * flush moves along. The coordinator writes the events; the file can be
 * opened, replaced and closed from any thread meanwhile (timeline.c locks). */
#ifndef HORA_TIMELINE_H
#define HORA_TIMELINE_H

#include "base/common.h"

/* Starts writing to `path`, replacing (and finishing) the file being
 * written, if any, once the new one is made; `who` names the caller in
 * errors. With mark_cycles, hora__timeline_cycle writes its marks. */
int hora__timeline_open(const char *path, bool mark_cycles, const char *who);
/* Finishes the file (ending the phases still open) and stops. */
void hora__timeline_close(void);
bool hora__timeline_enabled(void);

/* Phase names, as they appear in the trace. */
#define HORA_PHASE_QUEUE "QUEUE"
#define HORA_PHASE_PACK "MEMCPY_IN_FUSION_BUFFER"
#define HORA_PHASE_UNPACK "MEMCPY_OUT_FUSION_BUFFER"

void hora__timeline_begin(const char *key, size_t len, const char *phase);
/* As hora__timeline_begin, with `args` (a JSON object's text, or NULL) as
 * the event's args: what hora-report reads (sizes, fused batches). */
void hora__timeline_begin_args(const char *key, size_t len, const char *phase,
                               const char *args);
void hora__timeline_end(const char *key, size_t len);
/* An instant mark on the tensor's row, e.g. "rank 3 ready". */
void hora__timeline_mark(const char *key, size_t len, const char *what);
/* An instant event CYCLE_START with the cycle's number, if asked for. */
void hora__timeline_cycle(uint64_t cycle);
/* Global instant events: STEP at each hora_step_mark (the step's seconds,
 * compute and wait seconds, bytes), and LAST_RANK for each negotiation
 * that waited on one rank last (its job rank, the others' mean wait for
 * it, the operations it held up). */
void hora__timeline_step(uint64_t step, double seconds, double wait_seconds, uint64_t bytes);
void hora__timeline_last_rank(int rank, double waited_seconds, uint64_t operations);
/* The calling thread works for process set `set_id` (0: the world): its
 * events go on rows of that set's own, labelled with it. */
void hora__timeline_thread_set(int set_id);
int hora__timeline_thread_get(void);
/* Writes buffered events out (called when idle, and when the buffer fills). */
void hora__timeline_flush(void);

#endif
