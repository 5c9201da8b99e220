/* Steps (hora_step_mark, hora_get_step_stats) and stragglers.
 *
 *   test_steps [late|late-host]
 *
 * Every rank computes (sleeps) 20 ms per step, then allreduces 1 KiB and
 * waits for it, and marks the step. With `late`, one rank (2, or the last
 * with fewer than 3) also sleeps 20 ms more before it submits, with
 * `late-host` the upper half of the ranks (a host, on fake hosts of equal
 * size): the others' wait (exposed communication) grows by about that,
 * the late ranks' does not. The straggler report itself is read from the
 * ranks' log by tests/stragglers/check-stragglers.sh. */
#include <math.h>
#include <stddef.h>
#include <string.h>
#include <time.h>

#include "mpitest.h"

enum { STEPS = 40, COUNT = 256 };

static bool late_mode, late_host;

static bool is_late(int rank) {
  if (!late_mode || mt_size < 2) {
    return false;
  }
  return late_host ? rank >= mt_size / 2 : rank == (mt_size >= 3 ? 2 : mt_size - 1);
}

static void sleep_ms(int ms) {
  struct timespec t = {0, ms * 1000000L};
  nanosleep(&t, NULL);
}

static hora_step_stats step_stats(void) {
  hora_step_stats s = {.struct_size = sizeof(s)};
  MT_OK(hora_get_step_stats(&s));
  return s;
}

static void steps_split_compute_and_wait(void) {
  static float buf[COUNT];
  MT_OK(hora_step_mark()); /* starts the first step (or ends an earlier test's) */
  hora_step_stats before = step_stats();
  bool me_late = is_late(mt_rank);
  for (int step = 0; step < STEPS; step++) {
    sleep_ms(me_late ? 40 : 20);
    for (int i = 0; i < COUNT; i++) {
      buf[i] = (float)(mt_rank + step);
    }
    hora_request *req;
    MT_OK(hora_allreduce_async("steps.grad", buf, buf, COUNT, HORA_FLOAT32, HORA_SUM, &req));
    MT_OK(hora_wait(&req));
    MT_CHECK(buf[0] == (float)(mt_size * step + mt_size * (mt_size - 1) / 2), "step %d: %g", step,
             (double)buf[0]);
    MT_OK(hora_step_mark());
  }
  hora_step_stats s = step_stats();
  uint64_t steps = s.steps - before.steps;
  double wait = s.wait_seconds - before.wait_seconds;
  double seconds = s.seconds - before.seconds;
  double compute = s.compute_seconds - before.compute_seconds;
  MT_CHECK(steps == STEPS, "%llu steps counted, %d marked", (unsigned long long)steps, STEPS);
  MT_CHECK(s.bytes - before.bytes == (uint64_t)STEPS * COUNT * sizeof(float), "%llu bytes",
           (unsigned long long)(s.bytes - before.bytes));
  MT_CHECK(fabs(seconds - wait - compute) < 1e-6 && compute >= STEPS * 0.019,
           "%.3f s = %.3f s waiting + %.3f s compute", seconds, wait, compute);
  MT_CHECK(s.last_seconds > 0.019 && s.last_wait_seconds <= s.last_seconds &&
               s.last_bytes == COUNT * sizeof(float),
           "last step %.4f s, waited %.4f s, %llu bytes", s.last_seconds, s.last_wait_seconds,
           (unsigned long long)s.last_bytes);
  MT_CHECK(mt_size == 1 || (s.bus_bytes > 0 && s.communicate_seconds > 0),
           "bus bytes %g over %g s", s.bus_bytes, s.communicate_seconds);
  if (late_mode && mt_size > 1) {
    /* The others wait about 20 ms a step for the late rank. */
    MT_CHECK(me_late ? wait < STEPS * 0.010 : wait > STEPS * 0.012,
             "rank %d%s waited %.3f s in %d steps", mt_rank, me_late ? " (late)" : "", wait, STEPS);
  }
}

static void step_stats_contract(void) {
  MT_FAILS(hora_get_step_stats(NULL), HORA_ERR_INVALID_ARG, "stats");
  hora_step_stats s = {.struct_size = 1};
  MT_FAILS(hora_get_step_stats(&s), HORA_ERR_INVALID_ARG, "struct_size");
  /* A caller compiled against a smaller struct gets only what fits. */
  struct {
    size_t struct_size;
    uint64_t steps;
    uint64_t canary;
  } old = {offsetof(hora_step_stats, seconds), 0, 0xfeedu};
  MT_OK(hora_get_step_stats((hora_step_stats *)&old));
  MT_CHECK(old.steps == step_stats().steps && old.canary == 0xfeedu, "small struct overrun");
}

static int rc_before_init;

static void before_init_fails(void) {
  MT_CHECK(rc_before_init == HORA_ERR_INVALID_USAGE, "hora_get_step_stats before hora_init: %s",
           hora_strerror(rc_before_init));
  MT_CHECK(hora_step_mark() == HORA_SUCCESS, "hora_step_mark after hora_init");
}

int main(int argc, char **argv) {
  mt_setenv_args(argc, argv);
  for (int i = 1; i < argc; i++) {
    late_host |= strcmp(argv[i], "late-host") == 0;
    late_mode |= strcmp(argv[i], "late") == 0 || late_host;
  }
  hora_step_stats s = {.struct_size = sizeof(s)};
  rc_before_init = hora_get_step_stats(&s);
  mt_init();
  char name[80];
  mt_run("steps/before_init_fails", before_init_fails);
  snprintf(name, sizeof(name), "steps%s/steps_split_compute_and_wait",
           late_host ? "-late-host" : late_mode ? "-late" : "");
  mt_run(name, steps_split_compute_and_wait);
  mt_run("steps/step_stats_contract", step_stats_contract);
  int failures = mt_total_failures();
  MT_OK(hora_finalize());
  return failures ? 1 : 0;
}
