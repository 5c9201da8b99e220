/* A rank dies in the middle of training; every survivor must get
 * HORA_ERR_PEER_LOST, naming the lost rank and its host, within 10 s.
 * Run under a launcher that leaves the survivors alone (mpirun --mca
 * orte_abort_on_non_zero_status 0, srun --kill-on-bad-exit=0).
 *
 * usage: test_peer_loss VICTIM exit|kill|segv|stop|silent [HORA_X=value ...]
 * Each survivor prints its own line: PASS|FAIL peer_loss/... (seconds).
 * ("stop" sends the victim SIGSTOP: alive but silent; survivors must then
 * get HORA_ERR_TIMEOUT from the stall shutdown the caller configures;
 * "silent" stops it too, and the survivors must find it lost through the
 * heartbeats, HORA_PEER_TIMEOUT_SECONDS.) A mode prefixed "sets-" trains
 * in process sets of two ranks each ({0,1}, {2,3}, ...): the survivors in
 * the sets without the victim must fail within 10 s too, naming it. */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hora.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* What hora leaves behind: threads named hora-*, mappings of its shared
 * memory. (MPI's own threads and sockets stay: hora started MPI and, after
 * a fatal error, leaves it alone.) */
static int hora_leftovers(char *what, size_t n) {
  int count = 0;
  size_t used = 0;
  what[0] = '\0';
  DIR *d = opendir("/proc/self/task");
  struct dirent *de;
  while (d && (de = readdir(d))) {
    char path[300], name[64] = "";
    snprintf(path, sizeof(path), "/proc/self/task/%s/comm", de->d_name);
    FILE *f = de->d_name[0] != '.' ? fopen(path, "r") : NULL;
    if (f) {
      if (fgets(name, sizeof(name), f) && !strncmp(name, "hora", 4)) {
        count++;
        name[strcspn(name, "\n")] = '\0';
        used += (size_t)snprintf(what + used, used < n ? n - used : 0, "thread %s; ", name);
      }
      fclose(f);
    }
  }
  if (d) {
    closedir(d);
  }
  FILE *f = fopen("/proc/self/maps", "r");
  char line[1024];
  while (f && fgets(line, sizeof(line), f)) {
    if (strstr(line, "memfd:hora")) {
      count++;
      line[strcspn(line, "\n")] = '\0';
      used += (size_t)snprintf(what + used, used < n ? n - used : 0, "mapping %s; ", line);
    }
  }
  if (f) {
    fclose(f);
  }
  return count;
}

static void die(const char *mode) {
  fflush(stdout);
  if (!strcmp(mode, "exit")) {
    _exit(3);
  } else if (!strcmp(mode, "kill")) {
    raise(SIGKILL);
  } else if (!strcmp(mode, "segv")) {
    signal(SIGSEGV, SIG_DFL);
    int *volatile nowhere = NULL; /* a real fault, not raise() */
    *nowhere = 1;
  } else if (!strcmp(mode, "stop") || !strcmp(mode, "silent")) {
    raise(SIGSTOP);
  }
  _exit(4);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: test_peer_loss VICTIM exit|kill|segv|stop|silent [HORA_X=value ...]\n");
    return 2;
  }
  for (int i = 3; i < argc; i++) {
    char *eq = strchr(argv[i], '=');
    if (eq) {
      *eq = '\0';
      setenv(argv[i], eq + 1, 1);
    }
  }
  int victim = atoi(argv[1]);
  const char *mode = argv[2];
  int in_sets = !strncmp(mode, "sets-", 5);
  if (in_sets) {
    mode += 5;
  }
  int a2a = !strncmp(mode, "a2a-", 4); /* training with alltoalls */
  if (a2a) {
    mode += 4;
  }
  if (hora_init() != HORA_SUCCESS) {
    printf("FAIL peer_loss/%s: hora_init: %s\n", mode, hora_last_error());
    return 1;
  }
  int rank = hora_rank(), size = hora_size();
  /* Sets of pairs: every rank makes every set, and trains in its own. */
  hora_allreduce_options opts = HORA_ALLREDUCE_OPTIONS_INIT;
  int set_size = size;
  for (int first = 0; in_sets && first < size; first += 2) {
    int pair[2] = {first, first + 1};
    int n = first + 1 < size ? 2 : 1;
    hora_process_set *ps = NULL;
    if (hora_process_set_create(pair, n, &ps) != HORA_SUCCESS) {
      printf("FAIL peer_loss/sets-%s: hora_process_set_create: %s\n", mode, hora_last_error());
      return 1;
    }
    if (hora_process_set_included(ps)) {
      opts.process_set = ps;
      set_size = n;
    }
  }
  enum { N = 300000 }; /* 1.2 MB: big enough for every data path */
  float *buf = malloc(N * sizeof(float)), *got = malloc(N * sizeof(float));
  int expect = !strcmp(mode, "stop") ? HORA_ERR_TIMEOUT : HORA_ERR_PEER_LOST;
  double last_ok = now();
  for (int step = 0; step < 100000; step++) {
    if (rank == victim && step == 20) {
      die(mode);
    }
    for (int i = 0; i < N; i += 1000) {
      buf[i] = (float)(rank + step);
    }
    hora_request *req = NULL;
    size_t per = N / (size_t)size;
    int rc = a2a ? hora_alltoall_async_ex(step % 2 ? "exp/a" : "exp/b", buf, per * (size_t)size,
                                          NULL, got, NULL, HORA_FLOAT32, NULL, &req)
                 : hora_allreduce_async_ex(step % 2 ? "grad/a" : "grad/b", buf, buf, N,
                                           HORA_FLOAT32, HORA_SUM, &opts, &req);
    if (rc == HORA_SUCCESS) {
      rc = hora_wait(&req);
    }
    if (rc == HORA_SUCCESS && a2a) {
      /* Block j came from rank j, which wrote j + step where i % 1000 == 0. */
      size_t t = (1000 - (size_t)rank * per % 1000) % 1000; /* sender's element a multiple */
      for (int j = 0; j < size && t < per; j++) {
        if (got[(size_t)j * per + t] != (float)(j + step)) {
          printf("FAIL peer_loss/a2a-%s/victim%d/rank%d: wrong block %d at step %d\n", mode,
                 victim, rank, j, step);
          fflush(stdout);
          _exit(1);
        }
      }
      last_ok = now();
      continue;
    }
    if (rc == HORA_SUCCESS) {
      /* Sum over the ranks r of the set (or the job) of r + step. */
      int lo = in_sets ? rank - rank % 2 : 0;
      float want = (float)(set_size * step + set_size * lo + set_size * (set_size - 1) / 2);
      if (buf[0] != want) {
        printf("FAIL peer_loss/%s/victim%d/rank%d: wrong result %g at step %d\n", mode, victim,
               rank, (double)buf[0], step);
        fflush(stdout);
        _exit(1);
      }
      last_ok = now();
      continue;
    }
    double dt = now() - last_ok;
    char who[64], who_list[64], host[300];
    snprintf(who, sizeof(who), "rank %d", victim);
    snprintf(who_list, sizeof(who_list), "rank(s) %d", victim);
    char hostname[256] = "";
    gethostname(hostname, sizeof(hostname));
    snprintf(host, sizeof(host), "host %s", hostname);
    const char *msg = hora_last_error();
    int ok = rc == expect && dt < 10.0 && (strstr(msg, who) || strstr(msg, who_list)) &&
             (expect == HORA_ERR_TIMEOUT || strstr(msg, host));
    printf("%s peer_loss/%s%s/victim%d/rank%d (%s after %.2f s: %s)\n", ok ? "PASS" : "FAIL",
           in_sets ? "sets-" : a2a ? "a2a-" : "", mode, victim, rank, hora_strerror(rc), dt, msg);
    fflush(stdout);
    /* Later calls fail the same way, and finalize does not hang. */
    double t0 = now();
    char what[1024];
    int later = hora_barrier(), fin = hora_finalize(), left = hora_leftovers(what, sizeof(what));
    /* A joined thread can stay listed in /proc for a moment while the
     * kernel finishes its exit: look again for up to a second. */
    for (int i = 0; left && i < 100; i++) {
      usleep(10000);
      left = hora_leftovers(what, sizeof(what));
    }
    if (later != rc || fin != rc || now() - t0 > 5 || left) {
      printf("FAIL peer_loss/%s/victim%d/rank%d/afterwards (barrier %d, finalize %d, %.1f s, "
             "%d hora threads or mappings left: %s)\n",
             mode, victim, rank, later, fin, now() - t0, left, what);
    }
    fflush(stdout);
    /* Linger: a survivor that exits early can make the launcher kill the
     * others before they report. The caller kills what is left. */
    sleep(30);
    _exit(0);
  }
  printf("FAIL peer_loss/%s/victim%d/rank%d: no error after 100000 steps\n", mode, victim, rank);
  return 1;
}
