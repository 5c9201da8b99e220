/* A communicator built again within one process: four processes (forked
 * here, meeting at hora's tcp rendezvous) form a world, run collectives and
 * end it; form it again in the reverse order; then three of them form one
 * of their own; then all four, rotated; then a last one ended by
 * hora_finalize. Each membership is a new epoch. After each ends, the
 * process holds exactly the descriptors, threads and mappings it held after
 * the second ended (once the allocator's caches are warm): nothing of a
 * communicator outlives it.
 * Prints PASS/FAIL lines. usage: test_rebuild */
#include <arpa/inet.h>
#include <dirent.h>
#include <malloc.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hora.h"
#include "comm/bootstrap/rendezvous.h"
#include "runtime/runtime.h"

#define N 4

static int failures;
#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "child %d: ", me);                   \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, " (%s:%d)\n", __FILE__, __LINE__);   \
      failures++;                                          \
    }                                                      \
  } while (0)

static int me;
static int total_bad;

static double mt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int count_dir(const char *path) {
  DIR *d = opendir(path);
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

static int count_maps(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  int n = 0, c;
  while (f && (c = fgetc(f)) != EOF) {
    n += c == '\n';
  }
  if (f) {
    fclose(f);
  }
  return n;
}

struct counts {
  int fds, threads, maps;
};

/* A sanitizer's allocator maps its own regions as it goes: there only
 * descriptors and threads are counted. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define COUNT_MAPS 0
#else
#define COUNT_MAPS 1
#endif

static struct counts take_counts(void) {
  struct counts c = {count_dir("/proc/self/fd"), count_dir("/proc/self/task"),
                     COUNT_MAPS ? count_maps() : 0};
  return c;
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  bind(fd, (struct sockaddr *)&sa, sizeof(sa));
  getsockname(fd, (struct sockaddr *)&sa, &len);
  close(fd);
  return ntohs(sa.sin_port);
}

/* Collectives whose results name every member's place: the sum of ranks,
 * the members in rank order (by their child index), a broadcast. */
static void run_collectives(const char *phase, int size, const int *order) {
  CHECK(hora_size() == size, "%s: size %d, expected %d", phase, hora_size(), size);
  int64_t r = hora_rank(), sum = -1;
  int rc = hora_allreduce("rank_sum", &r, &sum, 1, HORA_INT64, HORA_SUM);
  CHECK(rc == HORA_SUCCESS && sum == (int64_t)size * (size - 1) / 2, "%s: sum of ranks %lld (%s)",
        phase, (long long)sum, hora_last_error());
  int64_t mine = me, all[N] = {-1, -1, -1, -1};
  rc = hora_allgather("who", &mine, 1, HORA_INT64, all);
  for (int i = 0; rc == HORA_SUCCESS && i < size; i++) {
    CHECK(all[i] == order[i], "%s: rank %d is child %lld, expected %d", phase, i,
          (long long)all[i], order[i]);
  }
  CHECK(rc == HORA_SUCCESS, "%s: allgather: %s", phase, hora_last_error());
  float big[100000];
  for (int i = 0; i < 100000; i++) {
    big[i] = (float)(hora_rank() + i % 7);
  }
  rc = hora_allreduce("big", big, big, 100000, HORA_FLOAT32, HORA_SUM);
  float want0 = (float)(size * (size - 1) / 2), want6 = want0 + 6.0f * (float)size;
  CHECK(rc == HORA_SUCCESS && big[0] == want0 && big[6] == want6, "%s: big allreduce %g %g (%s)",
        phase, big[0], big[6], hora_last_error());
}

static const uint8_t key[HORA_SECRET_LEN] = "test_rebuild's shared secret 123";

static int rebuild(int port, int rank, int size) {
  char where[64];
  snprintf(where, sizeof(where), "127.0.0.1:%d", port);
  struct hora__rdv_tcp_spec spec = {.host = "127.0.0.1", .port = port, .rank = rank,
                                    .size = size, .key = key, .listen_fd = -1, .timeout_s = 30,
                                    .where = where, .rank_var = "rank", .size_var = "size"};
  return hora__world_rebuild(&spec);
}

/* hora_init at hora's tcp rendezvous, as a launcher would start it. */
static int init_by_env(int port) {
  char v[32];
  setenv("HORA_BOOTSTRAP", "tcp", 1);
  snprintf(v, sizeof(v), "127.0.0.1:%d", port);
  setenv("HORA_RENDEZVOUS", v, 1);
  snprintf(v, sizeof(v), "%d", me);
  setenv("HORA_RANK", v, 1);
  setenv("HORA_SIZE", "4", 1);
  setenv("HORA_SECRET", "test_rebuild", 1);
  int rc = hora_init();
  CHECK(rc == HORA_SUCCESS, "hora_init: %s", hora_last_error());
  return rc;
}

static int child(const int *ports) {
  if (init_by_env(ports[0]) != HORA_SUCCESS) {
    return 1;
  }
  static const int first[N] = {0, 1, 2, 3}, reverse[N] = {3, 2, 1, 0}, three[3] = {1, 2, 3};
  static const int rotated[N] = {1, 2, 3, 0};
  int pair[2] = {0, 1};
  hora_process_set *ps = NULL;
  run_collectives("first", N, first);
  CHECK(hora_process_set_create(pair, 2, &ps) == HORA_SUCCESS, "set: %s", hora_last_error());
  CHECK(hora__world_rebuild(NULL) == HORA_SUCCESS, "end: %s", hora_last_error());
  CHECK(!hora_initialized() && hora_rank() == -1, "still initialised after the end");

  CHECK(rebuild(ports[1], N - 1 - me, N) == HORA_SUCCESS, "reverse: %s", hora_last_error());
  run_collectives("reverse", N, reverse);
  CHECK(hora_process_set_create(pair, 2, &ps) == HORA_SUCCESS, "set: %s", hora_last_error());
  CHECK(hora__world_rebuild(NULL) == HORA_SUCCESS, "end: %s", hora_last_error());
  /* The allocator's caches (glibc keeps exited threads' stacks) are warm
   * by now: from here on, the counts must come back exactly. */
  struct counts base = take_counts(), c;
  if (me > 0) {
    CHECK(rebuild(ports[2], me - 1, 3) == HORA_SUCCESS, "three: %s", hora_last_error());
    run_collectives("three", 3, three);
    CHECK(hora_process_set_create(pair, 2, &ps) == HORA_SUCCESS, "set: %s", hora_last_error());
    CHECK(hora__world_rebuild(NULL) == HORA_SUCCESS, "end: %s", hora_last_error());
    c = take_counts();
    CHECK(c.fds == base.fds && c.threads == base.threads && c.maps == base.maps,
          "after three of them: %d fds, %d threads, %d maps; before %d, %d, %d", c.fds,
          c.threads, c.maps, base.fds, base.threads, base.maps);
  }
  CHECK(rebuild(ports[3], (me + N - 1) % N, N) == HORA_SUCCESS, "rotated: %s", hora_last_error());
  run_collectives("rotated", N, rotated);
  CHECK(hora__world_rebuild(NULL) == HORA_SUCCESS, "end: %s", hora_last_error());
  c = take_counts();
  CHECK(c.fds == base.fds && c.threads == base.threads && c.maps == base.maps,
        "after the rotated four: %d fds, %d threads, %d maps; before %d, %d, %d", c.fds,
        c.threads, c.maps, base.fds, base.threads, base.maps);
  /* Once more, ended the ordinary way. */
  CHECK(rebuild(ports[4], me, N) == HORA_SUCCESS, "last: %s", hora_last_error());
  run_collectives("last", N, first);
  CHECK(hora_finalize() == HORA_SUCCESS, "finalize: %s", hora_last_error());
  return failures ? 1 : 0;
}

/* A failure belongs to its membership: child 3 dies; the others' next
 * collective fails with HORA_ERR_PEER_LOST within seconds; they form a
 * membership of three and compute right in it, in the same processes. */
static int child_after_loss(const int *ports) {
  if (init_by_env(ports[0]) != HORA_SUCCESS) {
    return 1;
  }
  static const int first[N] = {0, 1, 2, 3}, three[3] = {0, 1, 2};
  run_collectives("before the loss", N, first);
  int64_t x = 1, y = 0;
  CHECK(hora_barrier() == HORA_SUCCESS, "barrier: %s", hora_last_error());
  if (me == 3) {
    /* Gone without a word, once the others have left the barrier: a loss
     * fails whatever is in flight, and rank 0 may still be completing it
     * when this rank, told first, would exit at once. */
    usleep(300 * 1000);
    _exit(0);
  }
  double t0 = mt_now();
  int rc = hora_allreduce("after_the_loss", &x, &y, 1, HORA_INT64, HORA_SUM);
  CHECK(rc == HORA_ERR_PEER_LOST, "allreduce after the loss: %s (%s)", hora_strerror(rc),
        hora_last_error());
  CHECK(mt_now() - t0 < 20, "the loss took %.1f s to be seen", mt_now() - t0);
  CHECK(rebuild(ports[1], me, 3) == HORA_SUCCESS, "three after the loss: %s", hora_last_error());
  run_collectives("after the loss", 3, three);
  CHECK(hora_finalize() == HORA_SUCCESS, "finalize: %s", hora_last_error());
  return failures ? 1 : 0;
}

/* Runs fn in N forked children; PASS when all exit 0 (the one that dies on
 * purpose exits 0 too). */
static void run_children(const char *name, int (*fn)(const int *), int nports) {
  int ports[5];
  for (int i = 0; i < nports; i++) {
    ports[i] = free_port();
  }
  pid_t pids[N];
  for (int i = 0; i < N; i++) {
    pids[i] = fork();
    if (pids[i] == 0) {
      me = i;
      alarm(120);
      /* One malloc arena: threads of each membership would otherwise
       * leave arenas (mappings glibc keeps for reuse) that are no leak. */
      mallopt(M_ARENA_MAX, 1);
      _exit(fn(ports));
    }
  }
  int bad = 0;
  for (int i = 0; i < N; i++) {
    int st = 0;
    waitpid(pids[i], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "%s: child %d: %s %d\n", name, i, WIFEXITED(st) ? "exit status" : "signal",
              WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
      bad++;
    }
  }
  printf("%s rebuild/%s\n", bad ? "FAIL" : "PASS", name);
  fflush(stdout);
  total_bad += bad;
}

int main(void) {
  run_children("four_reversed_three_rotated_nothing_left_behind", child, 5);
  run_children("failure_ends_with_its_membership", child_after_loss, 2);
  return total_bad ? 1 : 0;
}
