/* An elastic job's member, for tests/launch/check-elastic.sh: STEPS steps,
 * each an allreduce whose result names every member (rank r adds id+1 at
 * position r... as sums), checked against the members the last reset
 * agreed on; a commit every COMMIT steps. After a lost peer or a change it
 * resets, then takes the step to resume from rank 0 (the state sync).
 *
 * HORA_TEST_KILL=STEP:ID[,STEP:ID...]  the process that started as rank ID
 *   (or joined with that id) kills itself at STEP, or at once if it learns
 *   of a lost peer at STEP (so that ids given one step die together, not
 *   one after the others' reset); STEP "r" kills it 50 ms into its next
 *   reset (a failure during the agreement).
 * HORA_TEST_RESET_FIRST: calls hora_elastic_reset first (expects a clear
 *   HORA_ERR_INVALID_USAGE, the job unharmed).
 * HORA_TEST_TIMES: prints "killed-at T", "recovered-at T" (the first allreduce
 *   completed after a reset) and "started-at T"/"first-at T" (a newcomer),
 *   T from CLOCK_MONOTONIC, for scripts/bench-elastic.sh.
 * HORA_TEST_SETS: a process set of the even ranks is made at start and
 *   after every reset; the one made before a reset must be refused with a
 *   clear error, the new one must work.
 * HORA_TEST_SLOW=ID:S: the process ID sleeps S seconds before its first reset.
 * HORA_TEST_STEP_MS: milliseconds of "compute" per step (default 0).
 * HORA_TEST_FINALIZE_ON_FAILURE=S[:D]: when the job fails for good here,
 *   waits D seconds, calls hora_finalize, prints "lifecycle: ..." (when it
 *   failed and when hora_finalize returned, on CLOCK_MONOTONIC; the TCP ports
 *   this process listened on before and after, whether they still accept a
 *   connection; its threads before and after) and stays alive S seconds more.
 * Prints "id I rank R size S resets N step T" and exits 0, or FAIL lines
 * and 1. usage: elastic_probe STEPS [COMMIT] */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "hora.h"

#define N 4096

static int my_id = -1;
static hora_process_set *evens;

static int allreduce_in(const char *name, int *x, hora_process_set *ps) {
  hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
  o.process_set = ps;
  hora_request *req = NULL;
  int rc = hora_allreduce_async_ex(name, x, x, 1, HORA_INT32, HORA_SUM, &o, &req);
  return rc == HORA_SUCCESS ? hora_wait(&req) : rc;
}

/* The set of the even ranks, made again; the old one checked first. */
static int remake_set(void) {
  if (!getenv("HORA_TEST_SETS")) {
    return HORA_SUCCESS;
  }
  if (evens) {
    int x = 1;
    int rc = allreduce_in("probe.old", &x, evens);
    bool clear = rc == HORA_ERR_INVALID_USAGE && strstr(hora_last_error(), "make them again");
    printf("%s set after reset: %s\n", clear ? "PASS" : "FAIL", hora_last_error());
  }
  int ranks[512], n = 0;
  for (int r = 0; r < hora_size(); r += 2) {
    ranks[n++] = r;
  }
  int rc = hora_process_set_create(ranks, n, &evens);
  if (rc == HORA_SUCCESS && hora_process_set_included(evens)) {
    int x = 1;
    rc = allreduce_in("probe.set", &x, evens);
    if (rc == HORA_SUCCESS && x != n) {
      printf("FAIL set sum %d, want %d\n", x, n);
    }
  }
  return rc;
}
static int ids[1024];
static int resets;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Whether HORA_TEST_KILL names (step, my id); step -1 means "r". */
static bool kill_at(int step) {
  const char *v = getenv("HORA_TEST_KILL");
  while (v && *v) {
    int s = -1, id = -1;
    if (v[0] == 'r') {
      sscanf(v, "r:%d", &id);
    } else {
      sscanf(v, "%d:%d", &s, &id);
    }
    if (s == step && id == my_id) {
      return true;
    }
    v = strchr(v, ',');
    v = v ? v + 1 : NULL;
  }
  return false;
}

static void *die_soon(void *arg) {
  (void)arg;
  struct timespec ts = {0, 50 * 1000000};
  nanosleep(&ts, NULL);
  raise(SIGKILL);
  return NULL;
}

/* Every member's id (rank order) and the step to resume from rank 0. */
static int sync_state(int *step) {
  int rc = remake_set();
  if (rc == HORA_SUCCESS) {
    rc = hora_allgather("probe.ids", &my_id, 1, HORA_INT32, ids);
  }
  if (rc == HORA_SUCCESS) {
    rc = hora_broadcast("probe.step", step, 1, HORA_INT32, 0);
  }
  return rc;
}

static int reset(void) {
  const char *slow = getenv("HORA_TEST_SLOW");
  int slow_id = -1, slow_s = 0;
  if (slow && sscanf(slow, "%d:%d", &slow_id, &slow_s) == 2 && slow_id == my_id && resets == 0) {
    /* A member that is alive but late to the reset. */
    sleep((unsigned)slow_s);
  }
  if (kill_at(-1)) {
    pthread_t t;
    pthread_create(&t, NULL, die_soon, NULL);
  }
  double t0 = now();
  int rc = hora_elastic_reset();
  resets++;
  fprintf(stderr, "id %d: reset %s in %.3f s: rank %d of %d%s%s\n", my_id,
          rc == HORA_SUCCESS ? "done" : "failed", now() - t0, hora_rank(), hora_size(),
          rc == HORA_SUCCESS ? "" : ": ", rc == HORA_SUCCESS ? "" : hora_last_error());
  return rc;
}

/* The TCP ports this process listens on (its sockets' inodes looked up in
 * /proc/self/net/tcp), at most `max`. */
static int listening_ports(int *ports, int max) {
  unsigned long inodes[256];
  int ninodes = 0, n = 0;
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  while (d && (e = readdir(d)) && ninodes < 256) {
    char path[300], link[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
    ssize_t len = readlink(path, link, sizeof(link) - 1);
    if (len > 0) {
      link[len] = 0;
      if (sscanf(link, "socket:[%lu]", &inodes[ninodes]) == 1) {
        ninodes++;
      }
    }
  }
  if (d) {
    closedir(d);
  }
  FILE *f = fopen("/proc/self/net/tcp", "r");
  char line[512];
  while (f && fgets(line, sizeof(line), f) && n < max) {
    unsigned port, state;
    unsigned long inode;
    if (sscanf(line, " %*d: %*x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*u %*d %lu", &port, &state,
               &inode) != 3 || state != 0x0A /* TCP_LISTEN */) {
      continue;
    }
    for (int i = 0; i < ninodes; i++) {
      if (inodes[i] == inode) {
        ports[n++] = (int)port;
        break;
      }
    }
  }
  if (f) {
    fclose(f);
  }
  return n;
}

static int count_threads(void) {
  DIR *d = opendir("/proc/self/task");
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d))) {
    n += e->d_name[0] != '.';
  }
  if (d) {
    closedir(d);
  }
  return n;
}

/* Whether something accepts connections at 127.0.0.1:port (a closed port
 * refuses at once). */
static bool accepts(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
  if (fd >= 0) {
    close(fd);
  }
  return ok;
}

static void print_ports(const char *what, const int *ports, int n) {
  printf(" %s %d port(s):", what, n);
  for (int i = 0; i < n; i++) {
    printf(" %d", ports[i]);
  }
}

/* After the job failed for good here: what hora_finalize leaves behind. */
static void finalize_after_failure(const char *setting) {
  double failed_at = now();
  unsigned linger_s = 0, delay_s = 0;
  sscanf(setting, "%u:%u", &linger_s, &delay_s);
  sleep(delay_s); /* members asking meanwhile are queued here */
  int before[16], after[16];
  int nbefore = listening_ports(before, 16), tbefore = count_threads();
  double t0 = now();
  int rc = hora_finalize();
  double took = now() - t0;
  int nafter = listening_ports(after, 16), tafter = count_threads();
  int open = 0;
  for (int i = 0; i < nbefore; i++) {
    open += accepts(before[i]);
  }
  printf("lifecycle: failed at %.3f, hora_finalize returned %s at %.3f in %.3f s (%s);", failed_at,
         hora_strerror(rc), t0 + took, took, rc == HORA_SUCCESS ? "" : hora_last_error());
  print_ports("before: listening on", before, nbefore);
  printf(", %d threads;", tbefore);
  print_ports("after: listening on", after, nafter);
  printf(", %d threads, %d of the ports before accepting\n", tafter, open);
  sleep(linger_s); /* alive: nothing is closed by the process's exit */
}

int main(int argc, char **argv) {
  double started = now();
  bool times = getenv("HORA_TEST_TIMES") != NULL;
  bool report = false; /* the next completed allreduce is a recovery */
  bool first_done = false;
  int steps = argc > 1 ? atoi(argv[1]) : 50;
  int every = argc > 2 ? atoi(argv[2]) : 5;
  setvbuf(stdout, NULL, _IONBF, 0);
  if (hora_init() != HORA_SUCCESS) {
    printf("FAIL init: %s\n", hora_last_error());
    return 1;
  }
  if (getenv("HORA_TEST_RESET_FIRST")) {
    /* Nothing was lost and no change reported: a clear error, nothing else. */
    int r = hora_elastic_reset();
    printf("%s reset without a failure: %s (%s)\n",
           r == HORA_ERR_INVALID_USAGE && hora_size() > 0 ? "PASS" : "FAIL", hora_strerror(r),
           hora_last_error());
  }
  /* Originals keep their start-up rank as id; a newcomer is given the
   * next free one by rank 0 (ids are only for the test's messages). */
  my_id = hora_elastic_joined() ? -1 : hora_rank();
  if (my_id < 0) {
    my_id = 1000 + (int)getpid() % 1000;
  }
  int step = 0, bad = 0;
  const char *ms = getenv("HORA_TEST_STEP_MS");
  struct timespec pause = {0, (ms ? atoi(ms) : 0) * 1000000L};
  int rc = sync_state(&step);
  float *buf = malloc(N * sizeof(float));
  while (step < steps) {
    if (rc == HORA_SUCCESS) {
      if (kill_at(step)) {
        fprintf(stderr, "id %d: killing myself at step %d\n", my_id, step);
        if (times) {
          printf("killed-at %.6f\n", now());
        }
        raise(SIGKILL);
      }
      if (pause.tv_nsec) {
        nanosleep(&pause, NULL);
      }
      for (int i = 0; i < N; i++) {
        buf[i] = (float)(my_id + 1) * (float)(i % 7 + 1);
      }
      rc = hora_allreduce("probe.grad", buf, buf, N, HORA_FLOAT32, HORA_SUM);
      if (rc == HORA_SUCCESS && times) {
        if (hora_elastic_joined() && !first_done) {
          printf("started-at %.6f\nfirst-at %.6f\n", started, now());
        } else if (report) {
          printf("recovered-at %.6f\n", now());
        }
      }
      if (rc == HORA_SUCCESS) {
        report = false;
        first_done = true;
      }
      if (rc == HORA_SUCCESS) {
        float want = 0;
        for (int r = 0; r < hora_size(); r++) {
          want += (float)(ids[r] + 1);
        }
        for (int i = 0; i < N; i++) {
          if (buf[i] != want * (float)(i % 7 + 1)) {
            printf("FAIL id %d step %d: element %d is %g, want %g (size %d)\n", my_id, step, i,
                   buf[i], want * (float)(i % 7 + 1), hora_size());
            bad++;
            break;
          }
        }
        step++;
        if (step % every == 0) {
          int changed = 0;
          rc = hora_elastic_commit(&changed);
          if (rc == HORA_SUCCESS && changed) {
            rc = reset();
            if (rc == HORA_SUCCESS) {
              rc = sync_state(&step);
            }
            continue;
          }
        }
      }
    }
    if (rc == HORA_ERR_PEER_LOST || rc == HORA_ERR_ABORTED) {
      fprintf(stderr, "id %d: step %d: %s\n", my_id, step, hora_last_error());
      if (kill_at(step)) {
        fprintf(stderr, "id %d: killing myself at step %d, with the peer just lost\n", my_id,
                step);
        raise(SIGKILL);
      }
      rc = reset();
      if (rc == HORA_SUCCESS) {
        report = true;
        rc = sync_state(&step);
        continue;
      }
    }
    if (rc != HORA_SUCCESS) {
      printf("FAIL id %d step %d: %s (%s)\n", my_id, step, hora_strerror(rc), hora_last_error());
      const char *linger = getenv("HORA_TEST_FINALIZE_ON_FAILURE");
      if (linger) {
        finalize_after_failure(linger);
      }
      free(buf);
      return 1;
    }
  }
  /* Every survivor must name the same membership: the same epoch, the same
   * members in the same order. */
  printf("membership %d:", hora_elastic_epoch());
  for (int r = 0; r < hora_size(); r++) {
    printf(" %d", ids[r]);
  }
  printf("\n");
  printf("id %d rank %d size %d resets %d step %d%s\n", my_id, hora_rank(), hora_size(), resets,
         step, bad ? " WRONG" : "");
  free(buf);
  rc = hora_finalize();
  if (rc != HORA_SUCCESS) {
    printf("FAIL id %d finalize: %s\n", my_id, hora_last_error());
    return 1;
  }
  return bad ? 1 : 0;
}
