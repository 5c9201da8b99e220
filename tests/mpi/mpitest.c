#include "mpitest.h"

#include <dirent.h>
#include <stdarg.h>

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

void mt_shared_dir(const char *prefix, char *dir, size_t n) {
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    snprintf(dir, n, "/tmp/%s-XXXXXX", prefix);
    if (!mkdtemp(dir)) {
      dir[0] = '\0';
    }
  }
  MPI_Bcast(dir, (int)n, MPI_CHAR, 0, MPI_COMM_WORLD);
}

void mt_remove_shared_dir(const char *dir) {
  int rank;
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0 && dir[0]) {
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
  MPI_Comm_rank(MPI_COMM_WORLD, &mt_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &mt_size);
}

void mt_run(const char *name, void (*fn)(void)) {
  MPI_Barrier(MPI_COMM_WORLD);
  failures_here = 0;
  fn();
  int all = 0;
  MPI_Allreduce(&failures_here, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
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
