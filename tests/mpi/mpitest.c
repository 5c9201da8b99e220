#include "mpitest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int mt_rank = -1, mt_size = -1;
static int failures_here; /* current test, this rank */
static int failures_total;

void mt_fail(const char *file, int line, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (failures_here < 20) {
    fprintf(stderr, "  rank %d: %s:%d: %s\n", mt_rank, file, line, msg);
  }
  failures_here++;
}

void mt_setenv_args(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    char *eq = strchr(argv[i], '=');
    if (eq && strncmp(argv[i], "HORA_", 5) == 0) {
      *eq = '\0';
      setenv(argv[i], eq + 1, 1);
      *eq = '=';
    }
  }
}

/* Read before main: an MPI that starts as a singleton (hora_init) sets
 * these variables in its own process. */
static bool by_mpi;
__attribute__((constructor)) static void note_launcher(void) {
  by_mpi = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMI_RANK") ||
           getenv("PMIX_RANK");
}

bool mt_launched_by_mpi(void) { return by_mpi; }

/* ---- bookkeeping through files (no MPI) ----
 * Exchange number g writes <dir>/x.<g>.<rank> (whole, by rename) and reads
 * every rank's. Every rank makes the same calls in the same order, so the
 * numbers agree; HORA_TEST_DIR is fresh per job, so nothing is stale. */

enum { WAIT_LIMIT_S = 300 };
static const char *files_dir; /* NULL: a lone process, nothing to exchange */
static unsigned files_gen;

static void files_die(const char *what, const char *path) {
  fprintf(stderr, "rank %d: test bookkeeping: %s %s: %s\n", mt_rank, what, path, strerror(errno));
  exit(3);
}

static void files_write(const char *path, const void *buf, size_t n) {
  char tmp[PATH_MAX + 8];
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) {
    files_die("cannot create", tmp);
  }
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) {
      continue;
    }
    if (w <= 0) {
      files_die("cannot write", tmp);
    }
    p += w;
    n -= (size_t)w;
  }
  if (close(fd) != 0 || rename(tmp, path) != 0) {
    files_die("cannot finish", path);
  }
}

/* Waits (sleeping) until path exists, then reads its n bytes. */
static void files_read(const char *path, void *buf, size_t n, int from) {
  double t0 = mt_wtime();
  useconds_t nap = 1000;
  int fd;
  while ((fd = open(path, O_RDONLY)) < 0) {
    if (errno != ENOENT && errno != EINTR) {
      files_die("cannot open", path);
    }
    if (mt_wtime() - t0 > WAIT_LIMIT_S) {
      fprintf(stderr, "rank %d: test bookkeeping: waited %d s for rank %d (%s): it died or hangs\n",
              mt_rank, WAIT_LIMIT_S, from, path);
      exit(3);
    }
    usleep(nap);
    nap = nap < 10000 ? nap * 2 : 10000;
  }
  char *p = buf;
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, p + got, n - got);
    if (r < 0 && errno == EINTR) {
      continue;
    }
    if (r <= 0) {
      errno = r == 0 ? EIO : errno;
      files_die("short read of", path);
    }
    got += (size_t)r;
  }
  close(fd);
}

static void files_allgather(const void *mine, size_t n, void *all) {
  unsigned g = ++files_gen;
  if (!files_dir) {
    memcpy(all, mine, n);
    return;
  }
  char path[PATH_MAX];
  snprintf(path, sizeof(path), "%s/x.%u.%d", files_dir, g, mt_rank);
  files_write(path, mine, n);
  for (int r = 0; r < mt_size; r++) {
    snprintf(path, sizeof(path), "%s/x.%u.%d", files_dir, g, r);
    files_read(path, (char *)all + (size_t)r * n, n, r);
  }
}

/* Two processes that hora_init gave one rank (a launcher that started more
 * processes than hora's world has) fail here, not with a false PASS. */
static void files_claim_rank(void) {
  char path[PATH_MAX];
  snprintf(path, sizeof(path), "%s/rank.%d", files_dir, mt_rank);
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0 && errno == EEXIST) {
    fprintf(stderr, "rank %d: another process of this job is rank %d too (hora's world has %d "
            "ranks: not the processes the launcher started?)\n", mt_rank, mt_rank, mt_size);
    exit(2);
  }
  if (fd < 0) {
    files_die("cannot create", path);
  }
  close(fd);
}

double mt_wtime(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void mt_barrier(void) {
  if (mt_launched_by_mpi()) {
    MPI_Barrier(MPI_COMM_WORLD);
  } else {
    char none = 0, *all = malloc((size_t)mt_size);
    files_allgather(&none, 1, all);
    free(all);
  }
}

void mt_allgather(const void *mine, size_t n, void *all) {
  if (mt_launched_by_mpi()) {
    MPI_Allgather(mine, (int)n, MPI_BYTE, all, (int)n, MPI_BYTE, MPI_COMM_WORLD);
  } else {
    files_allgather(mine, n, all);
  }
}

void mt_host(int *local_rank, int *local_size, int *first_rank) {
  if (mt_launched_by_mpi()) {
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, mt_rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, local_rank);
    MPI_Comm_size(local, local_size);
    MPI_Allreduce(&mt_rank, first_rank, 1, MPI_INT, MPI_MIN, local);
    MPI_Comm_free(&local);
    return;
  }
  enum { HOST = 256 };
  char me[HOST] = {0};
  gethostname(me, HOST - 1);
  char *all = malloc((size_t)mt_size * HOST);
  files_allgather(me, HOST, all);
  *local_rank = 0;
  *local_size = 0;
  *first_rank = -1;
  for (int r = 0; r < mt_size; r++) {
    if (strcmp(all + (size_t)r * HOST, me) == 0) {
      *local_rank += r < mt_rank;
      (*local_size)++;
      if (*first_rank < 0) {
        *first_rank = r;
      }
    }
  }
  free(all);
}

void mt_shared_dir(const char *prefix, char *dir, size_t n) {
  if (mt_launched_by_mpi()) {
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
      snprintf(dir, n, "/tmp/%s-XXXXXX", prefix);
      if (!mkdtemp(dir)) {
        dir[0] = '\0';
      }
    }
    MPI_Bcast(dir, (int)n, MPI_CHAR, 0, MPI_COMM_WORLD);
    return;
  }
  /* No rank yet (hora_init may need the name): every rank makes it. */
  const char *top = getenv("HORA_TEST_DIR");
  if (top && top[0]) {
    snprintf(dir, n, "%s/%s", top, prefix);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
      dir[0] = '\0';
    }
  } else {
    snprintf(dir, n, "/tmp/%s-XXXXXX", prefix);
    if (!mkdtemp(dir)) {
      dir[0] = '\0';
    }
  }
}

void mt_remove_shared_dir(const char *dir) {
  mt_barrier();
  if (mt_rank == 0 && dir[0]) {
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) {
      fprintf(stderr, "could not remove %s\n", dir);
    }
  }
}

void mt_init(void) {
  int rc = hora_init();
  if (rc != HORA_SUCCESS) {
    fprintf(stderr, "hora_init failed: %s: %s\n", hora_strerror(rc), hora_last_error());
    exit(2);
  }
  if (mt_launched_by_mpi()) {
    MPI_Comm_rank(MPI_COMM_WORLD, &mt_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mt_size);
    return;
  }
  mt_rank = hora_rank();
  mt_size = hora_size();
  if (mt_rank < 0 || mt_rank >= mt_size) {
    fprintf(stderr, "hora_init succeeded, but rank %d of %d\n", mt_rank, mt_size);
    exit(2);
  }
  const char *dir = getenv("HORA_TEST_DIR");
  if (dir && dir[0]) {
    files_dir = dir;
    files_claim_rank();
  } else if (mt_size > 1) {
    fprintf(stderr, "rank %d of %d: started without an MPI launcher and without HORA_TEST_DIR; "
            "start multi-rank tests with tests/launch/launch.sh\n", mt_rank, mt_size);
    exit(2);
  }
}

void mt_run(const char *name, void (*fn)(void)) {
  mt_barrier();
  failures_here = 0;
  fn();
  int all = 0;
  if (mt_launched_by_mpi()) {
    MPI_Allreduce(&failures_here, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  } else {
    int *each = malloc((size_t)mt_size * sizeof(int));
    files_allgather(&failures_here, sizeof(int), each);
    for (int r = 0; r < mt_size; r++) {
      all += each[r];
    }
    free(each);
  }
  failures_total += all;
  if (mt_rank == 0) {
    if (all) {
      printf("FAIL %s (%d failed checks)\n", name, all);
    } else {
      printf("PASS %s\n", name);
    }
    fflush(stdout);
  }
}

void mt_skip(const char *name, const char *why) {
  if (mt_rank == 0) {
    printf("SKIP %s: %s\n", name, why);
    fflush(stdout);
  }
}

int mt_total_failures(void) { return failures_total; }

int mt_count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  while (d && readdir(d)) {
    n++;
  }
  if (d) {
    closedir(d);
  }
  return n;
}

long mt_rss_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long k = -1;
  while (f && fgets(line, sizeof(line), f)) {
    if (!strncmp(line, "VmRSS:", 6)) {
      k = atol(line + 6);
    }
  }
  if (f) {
    fclose(f);
  }
  return k;
}
