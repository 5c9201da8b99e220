/* Clean shutdown: after hora_finalize, whether the job ended normally or
 * after a fatal error (argument "fatal": the last rank calls hora_abort),
 * the process holds exactly the threads, file descriptors and shared
 * memory it held before hora_init: no coordinator thread, no socket, no
 * memfd mapping, nothing new in /dev/shm. The test owns MPI, whose own
 * resources are in place before the first snapshot. */
#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include <pthread.h>

#include "mpitest.h"

struct snapshot {
  int threads;
  char fds[4096];   /* "fd->target" lines */
  int hora_maps;    /* mappings of hora's memfd segments */
  char devshm[4096]; /* names in /dev/shm */
};

static void list_dir(const char *dir, char *out, size_t n, int with_targets) {
  DIR *d = opendir(dir);
  size_t used = 0;
  out[0] = '\0';
  struct dirent *de;
  while (d && (de = readdir(d))) {
    if (de->d_name[0] == '.' || used >= n) {
      continue;
    }
    /* Open MPI's own segments come and go with any MPI job on the host. */
    if (!with_targets && strncmp(de->d_name, "vader_segment.", 14) == 0) {
      continue;
    }
    char path[600], target[256] = "";
    if (with_targets) {
      snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
      ssize_t k = readlink(path, target, sizeof(target) - 1);
      target[k > 0 ? k : 0] = '\0';
      if (strstr(target, "/proc/") && strstr(target, "/fd")) {
        continue; /* the directory stream itself */
      }
    }
    used += (size_t)snprintf(out + used, n - used, "%s%s%s\n", de->d_name, with_targets ? "->" : "",
                             target);
  }
  if (d) {
    closedir(d);
  }
}

static void take(struct snapshot *s) {
  DIR *d = opendir("/proc/self/task");
  s->threads = 0;
  while (d && readdir(d)) {
    s->threads++;
  }
  if (d) {
    closedir(d);
  }
  list_dir("/proc/self/fd", s->fds, sizeof(s->fds), 1);
  list_dir("/dev/shm", s->devshm, sizeof(s->devshm), 0);
  FILE *f = fopen("/proc/self/maps", "r");
  char line[1024];
  s->hora_maps = 0;
  while (f && fgets(line, sizeof(line), f)) {
    s->hora_maps += strstr(line, "hora") != NULL && strstr(line, "libhora") == NULL;
  }
  if (f) {
    fclose(f);
  }
}

static struct snapshot before, after;
static int fatal;

/* HORA_TEST_LINGER=N: print "<what> pid=P" and wait N seconds, so that the
 * RDMA check can list this process's queue pairs and memory regions from
 * outside (rdma resource show), while running and after hora_finalize. */
static void linger(const char *what) {
  const char *s = getenv("HORA_TEST_LINGER");
  if (s && atoi(s) > 0) {
    printf("%s pid=%d\n", what, (int)getpid());
    fflush(stdout);
    sleep((unsigned)atoi(s));
  }
}

/* A thread blocked in hora_wait, and one in hora_barrier, while the main
 * thread finalizes: both get an error, and hora_finalize frees the runtime
 * only after they have left it (ASan and TSan runs look for the race). */
static float never[4];
static int never_rc, barrier_rc;
static char never_msg[512];

static void *wait_on_never(void *arg) {
  hora_request *r = arg;
  never_rc = hora_wait(&r);
  snprintf(never_msg, sizeof(never_msg), "%s", hora_last_error());
  return NULL;
}

static void *barrier_alone(void *arg) {
  (void)arg;
  barrier_rc = hora_barrier();
  return NULL;
}

static void work(void) {
  enum { BIG = 4 << 20 };
  float *x = calloc(BIG, sizeof(float));
  float small[16] = {0};
  MT_OK(hora_allreduce("shutdown/big", x, x, BIG, HORA_FLOAT32, HORA_SUM)); /* rings, shm */
  MT_OK(hora_allreduce("shutdown/small", small, small, 16, HORA_FLOAT32, HORA_SUM));
  MT_OK(hora_broadcast("shutdown/bcast", x, 1000, HORA_FLOAT32, 0));
  linger("HOLD"); /* RDMA check: resources are held now */
  if (fatal) {
    if (mt_rank == mt_size - 1) {
      MT_OK(hora_abort("shutdown test"));
    } else {
      MT_FAILS(hora_allreduce("shutdown/after", small, small, 16, HORA_FLOAT32, HORA_SUM),
               HORA_ERR_ABORTED, "shutdown test");
    }
    MT_FAILS(hora_finalize(), HORA_ERR_ABORTED, "shutdown test");
  } else if (mt_rank == 0 && mt_size > 1) {
    hora_request *r;
    MT_OK(hora_allreduce_async("shutdown/never", never, never, 4, HORA_FLOAT32, HORA_SUM, &r));
    pthread_t waiter, barrier;
    pthread_create(&waiter, NULL, wait_on_never, r);
    pthread_create(&barrier, NULL, barrier_alone, NULL);
    usleep(100000); /* both are asleep in the runtime now */
    MT_OK(hora_finalize());
    pthread_join(waiter, NULL);
    pthread_join(barrier, NULL);
    MT_CHECK(never_rc == HORA_ERR_ABORTED && strstr(never_msg, "hora_finalize"),
             "wait across hora_finalize: %s: %s", hora_strerror(never_rc), never_msg);
    MT_CHECK(barrier_rc == HORA_ERR_ABORTED, "barrier across hora_finalize: %s",
             hora_strerror(barrier_rc));
  } else {
    MT_OK(hora_finalize());
  }
  free(x);
}

static void nothing_left(void) {
  MT_CHECK(after.threads == before.threads, "%d threads before hora_init, %d after hora_finalize",
           before.threads, after.threads);
  MT_CHECK(strcmp(after.fds, before.fds) == 0,
           "open files differ: before hora_init:\n%s\nafter hora_finalize:\n%s", before.fds,
           after.fds);
  MT_CHECK(after.hora_maps == 0, "%d hora shared-memory mappings left", after.hora_maps);
  MT_CHECK(strcmp(after.devshm, before.devshm) == 0, "/dev/shm before:\n%s\nafter:\n%s",
           before.devshm, after.devshm);
}

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  mt_setenv_args(argc, argv);
  fatal = argc > 1 && strcmp(argv[1], "fatal") == 0;
  /* MPI opens its own connections lazily: open them before the snapshot. */
  int one = 1, sum;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  take(&before);
  mt_init();
  mt_run(fatal ? "shutdown/fatal_error_then_finalize" : "shutdown/normal_finalize", work);
  take(&after);
  /* A joined thread can stay listed in /proc for a moment while the kernel
   * finishes its exit: look again for up to a second. */
  for (int i = 0; i < 100 && after.threads != before.threads; i++) {
    usleep(10000);
    take(&after);
  }
  mt_run(fatal ? "shutdown/nothing_left_after_fatal_error" : "shutdown/nothing_left_after_finalize",
         nothing_left);
  linger("LINGER"); /* ... and released now */
  int failures = mt_total_failures();
  MPI_Finalize();
  return failures ? 1 : 0;
}
