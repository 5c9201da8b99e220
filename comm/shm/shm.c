/* The host's shared segment and its barrier. */
#include "comm/shm/shm.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"

#define PAGE 4096
#define SLOT_HEADER PAGE

/* The segment's first page: the barrier, and the path table that local
 * rank 0 writes for everyone (see hora__shm_path_begin). */
struct segment_header {
  _Alignas(64) atomic_uint arrived;
  _Alignas(64) atomic_uint generation;
  _Alignas(64) atomic_uint sleepers;
  _Alignas(64) _Atomic uint8_t path[HORA_PATH_TUNER_CLASSES];
};
_Static_assert(sizeof(struct segment_header) <= PAGE, "the segment header fits its page");
_Static_assert(SLOT_HEADER >= 128, "a slot header holds two times");

/* HORA_SHM_SINGLE_COPY, agreed among the local ranks: the smallest wins. */
enum single_copy_mode {
  SINGLE_COPY_OFF = 0,    /* "0": everything staged */
  SINGLE_COPY_STAGED = 1, /* "staged": blocks in place, other buffers staged */
  SINGLE_COPY_KERNEL = 2, /* "1": blocks in place, other buffers through the kernel */
  SINGLE_COPY_AUTO = 3    /* "auto": the faster of the last two, timed */
};

struct hora__shm {
  char *base;
  size_t bytes;
  size_t half;      /* bytes in one half */
  size_t slot;      /* bytes in one slot */
  int local_size, local_rank;
  pid_t *pids;      /* [local_size], for liveness checks */
  int *global;      /* [local_size]: global rank of each local rank */
  bool cma;         /* process_vm_readv works between all local ranks */
  bool tuning;      /* the kernel and staged paths are chosen by measurement */
  bool populate;    /* map every page at once */
  bool staged;      /* buffers outside hora_mem blocks are always staged */
  int mode;         /* the single-copy mode the host's ranks agreed on */
  int leader_fd;    /* local rank 0 during set-up: the segment's memfd */
  uint64_t tuned_ops; /* tuned operations begun here (the same count on every local rank) */
  struct hora__path_tuner tuner; /* local rank 0's timings */
  struct {
    int cls;
    enum hora__shm_path path;
    size_t bytes;
  } pending; /* local rank 0: the last tuned operation (if tuned_ops > 0), not yet recorded */
  struct segment_header *bar;
  struct mail_ring *mail; /* [from * local_size + to], or NULL (too many local ranks) */
  struct mail_flag *asleep; /* [local_size] */
};

/* ---- mailboxes ---------------------------------------------------------------
 * One ring of small messages from each local rank to each other: a single
 * writer and a single reader (each process's engine runs on one thread at
 * a time), slots published by the head and freed by the tail. A reader
 * about to sleep in poll() raises its flag first and looks once more; a
 * writer that sees the flag sends over the socket instead, or (raised
 * after it wrote) nudges the reader over the socket: one of the two always
 * sees the other (both fence between their store and their load). */
#define MAIL_SLOTS 4
#define MAIL_SLOT 512
#define MAIL_MAX_RANKS 64 /* L * L rings of about 2 KiB */

struct mail_ring {
  _Alignas(64) atomic_uint head;
  _Alignas(64) atomic_uint tail;
  _Alignas(64) struct {
    uint32_t len;
    uint8_t data[MAIL_SLOT - sizeof(uint32_t)];
  } slot[MAIL_SLOTS];
};

struct mail_flag {
  _Alignas(64) atomic_uint asleep;
};

static size_t mail_bytes(int local_size) {
  if (local_size > MAIL_MAX_RANKS) {
    return 0;
  }
  return (size_t)local_size * (size_t)local_size * sizeof(struct mail_ring) +
         (size_t)local_size * sizeof(struct mail_flag);
}

static struct mail_ring *ring_of(const struct hora__shm *s, int from, int to) {
  return &s->mail[(size_t)from * (size_t)s->local_size + (size_t)to];
}

int hora__shm_local_of(const struct hora__shm *s, int rank) {
  for (int lr = 0; lr < s->local_size; lr++) {
    if (s->global[lr] == rank) {
      return lr;
    }
  }
  return -1;
}

int hora__shm_rank_of(const struct hora__shm *s, int lr) { return s->global[lr]; }
int hora__shm_local_size(const struct hora__shm *s) { return s->local_size; }

bool hora__shm_mail_send(struct hora__shm *s, int to, const void *p, size_t len, bool *nudge) {
  *nudge = false;
  if (!s->mail || to < 0 || to == s->local_rank || len > MAIL_SLOT - sizeof(uint32_t)) {
    return false;
  }
  struct mail_ring *r = ring_of(s, s->local_rank, to);
  unsigned h = atomic_load_explicit(&r->head, memory_order_relaxed);
  if (h - atomic_load_explicit(&r->tail, memory_order_acquire) >= MAIL_SLOTS ||
      atomic_load_explicit(&s->asleep[to].asleep, memory_order_acquire)) {
    return false;
  }
  r->slot[h % MAIL_SLOTS].len = (uint32_t)len;
  memcpy(r->slot[h % MAIL_SLOTS].data, p, len);
  atomic_store_explicit(&r->head, h + 1, memory_order_release);
  atomic_thread_fence(memory_order_seq_cst);
  *nudge = atomic_load_explicit(&s->asleep[to].asleep, memory_order_relaxed) != 0;
  return true;
}

int hora__shm_mail_read(struct hora__shm *s, int from,
                        int (*fn)(void *arg, int from, const uint8_t *p, size_t len), void *arg) {
  if (!s->mail || from == s->local_rank) {
    return HORA_SUCCESS;
  }
  struct mail_ring *r = ring_of(s, from, s->local_rank);
  unsigned t = atomic_load_explicit(&r->tail, memory_order_relaxed);
  while (t != atomic_load_explicit(&r->head, memory_order_acquire)) {
    uint32_t len = r->slot[t % MAIL_SLOTS].len;
    if (len > MAIL_SLOT - sizeof(uint32_t)) {
      return hora__error(HORA_ERR_PROTOCOL, "local rank %d wrote a mailbox message of %u bytes",
                         from, len);
    }
    /* Freed once handled: the handler reads the slot in place. */
    int rc = fn(arg, from, r->slot[t % MAIL_SLOTS].data, len);
    atomic_store_explicit(&r->tail, ++t, memory_order_release);
    HORA_CHECK(rc);
  }
  return HORA_SUCCESS;
}

bool hora__shm_mail_sleep(struct hora__shm *s, bool sleeping) {
  if (!s->mail) {
    return false;
  }
  if (!sleeping) {
    atomic_fetch_sub_explicit(&s->asleep[s->local_rank].asleep, 1, memory_order_relaxed);
    return false;
  }
  atomic_fetch_add_explicit(&s->asleep[s->local_rank].asleep, 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_seq_cst);
  for (int j = 0; j < s->local_size; j++) {
    struct mail_ring *r = ring_of(s, j, s->local_rank);
    if (j != s->local_rank && atomic_load_explicit(&r->head, memory_order_acquire) !=
                                  atomic_load_explicit(&r->tail, memory_order_relaxed)) {
      atomic_fetch_sub_explicit(&s->asleep[s->local_rank].asleep, 1, memory_order_relaxed);
      return true;
    }
  }
  return false;
}

pid_t hora__shm_pid(const struct hora__shm *shm, int lr) { return shm->pids[lr]; }
bool hora__shm_cma(const struct hora__shm *shm) { return shm->cma; }

enum hora__shm_path hora__shm_path(const struct hora__shm *shm, size_t share) {
  if (!shm->tuning) {
    return shm->staged ? HORA_SHM_PATH_STAGED : HORA_SHM_PATH_KERNEL;
  }
  int cls = hora__path_tuner_class(share);
  return (enum hora__shm_path)atomic_load_explicit(&shm->bar->path[cls], memory_order_relaxed);
}

static void format_class(int cls, char *buf, size_t len) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = HORA_MIN(cls / 10, 4);
  snprintf(buf, len, "%llu-%llu %s", 1ull << (cls - 10 * u), 2ull << (cls - 10 * u), unit[u]);
}

/* Each slot's header page: how long this rank took over the last two tuned
 * operations (by their parity), for local rank 0 to read once all are done. */
struct slot_header {
  _Alignas(64) _Atomic uint64_t tuned_ns[2];
};

static struct slot_header *slot_header(const struct hora__shm *shm, int lr) {
  return (struct slot_header *)(void *)(shm->base + PAGE + (size_t)lr * shm->slot);
}

/* Local rank 0: the table entry of class cls, from the tuner's choice. */
static void publish(struct hora__shm *shm, int cls) {
  atomic_store_explicit(&shm->bar->path[cls], (uint8_t)hora__path_tuner_next(&shm->tuner, cls),
                        memory_order_relaxed);
}

/* Local rank 0: the previous tuned operation's time, the slowest rank's. */
static void record_previous(struct hora__shm *shm) {
  if (shm->tuned_ops == 0) {
    return;
  }
  int parity = (int)((shm->tuned_ops - 1) & 1);
  uint64_t slowest = 0;
  for (int lr = 0; lr < shm->local_size; lr++) {
    uint64_t ns = atomic_load_explicit(&slot_header(shm, lr)->tuned_ns[parity], memory_order_acquire);
    if (ns == 0) {
      return; /* that rank did not finish it (an error): no trial */
    }
    slowest = HORA_MAX(slowest, ns);
  }
  struct hora__path_tuner *t = &shm->tuner;
  int cls = shm->pending.cls;
  if (hora__path_tuner_record(t, cls, shm->pending.path, shm->pending.bytes, slowest)) {
    char range[64];
    format_class(cls, range, sizeof(range));
    HORA_INFO("intra-host allreduces of %s per rank: through the kernel %.2f GB/s, staged in "
              "shared memory %.2f GB/s (best of %d each): taking the %s path",
              range, 1.0 / t->best[HORA_SHM_PATH_KERNEL][cls],
              1.0 / t->best[HORA_SHM_PATH_STAGED][cls], HORA_PATH_TUNER_TRIALS,
              hora__path_tuner_next(t, cls) == HORA_SHM_PATH_STAGED ? "staged" : "kernel");
  }
  publish(shm, cls);
}

void hora__shm_path_begin(struct hora__shm *shm, size_t share, enum hora__shm_path path,
                          size_t bytes) {
  if (!shm->tuning) {
    return;
  }
  int parity = (int)(shm->tuned_ops & 1);
  atomic_store_explicit(&slot_header(shm, shm->local_rank)->tuned_ns[parity], 0,
                        memory_order_relaxed);
  if (shm->local_rank == 0) {
    /* Every rank finished the previous tuned operation before this one's
     * first barrier, and cannot overwrite its time before the next one's. */
    record_previous(shm);
    int cls = hora__path_tuner_class(share);
    shm->pending.cls = cls;
    shm->pending.path = path;
    shm->pending.bytes = bytes;
    hora__path_tuner_started(&shm->tuner, cls, path);
    publish(shm, cls); /* only these two classes' choices can have moved */
  }
  shm->tuned_ops++;
}

void hora__shm_path_end(struct hora__shm *shm, uint64_t ns) {
  if (shm->tuning) {
    int parity = (int)((shm->tuned_ops - 1) & 1);
    atomic_store_explicit(&slot_header(shm, shm->local_rank)->tuned_ns[parity], HORA_MAX(ns, 1),
                          memory_order_release);
  }
}

/* Whether this rank can read the next local rank's memory, tried on a
 * word whose address and value every rank knows. */
static const uint64_t cma_probe = 0x686f7261636d6121ull; /* "hora cma!" */

size_t hora__shm_half_bytes(const struct hora__shm *shm) { return shm->half; }

char *hora__shm_half(const struct hora__shm *shm, int lr, int half) {
  return shm->base + PAGE + (size_t)lr * shm->slot + SLOT_HEADER + (size_t)half * shm->half;
}

static int map_segment(struct hora__shm *s, pid_t leader_pid, int leader_fd, int my_fd) {
  int fd = my_fd;
  if (fd < 0) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)leader_pid, leader_fd);
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      return hora__error_errno(HORA_ERR_SYSTEM, "open %s (the host's shared segment)", path);
    }
  }
  /* The leader's hello names the segment: touching past the end of a
   * smaller one would be a SIGBUS, not an error. */
  struct stat st;
  memset(&st, 0, sizeof(st));
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < (uint64_t)s->bytes) {
    int rc = hora__error(HORA_ERR_PROTOCOL, "the host's shared segment (pid %d's descriptor %d) "
                         "holds %lld bytes, where this rank's layout needs %zu",
                         (int)leader_pid, leader_fd, (long long)st.st_size, s->bytes);
    if (fd != my_fd) {
      close(fd);
    }
    return rc;
  }
  /* Every page mapped now: no page faults in the first collectives, and
   * the resident set does not creep up later as bigger pieces first reach
   * further into the segment. */
  void *p = mmap(NULL, s->bytes, PROT_READ | PROT_WRITE,
                 MAP_SHARED | (s->populate ? MAP_POPULATE : 0), fd, 0);
  int err = errno;
  if (fd != my_fd) {
    close(fd);
  }
  if (p == MAP_FAILED) {
    errno = err;
    return hora__error_errno(HORA_ERR_SYSTEM, "mmap of the %zu-byte shared segment", s->bytes);
  }
  s->base = p;
  s->bar = p;
  if (mail_bytes(s->local_size)) {
    s->mail = (struct mail_ring *)(void *)(s->base + PAGE + (size_t)s->local_size * s->slot);
    s->asleep = (struct mail_flag *)(void *)(s->mail + (size_t)s->local_size * (size_t)s->local_size);
  }
  return HORA_SUCCESS;
}

int hora__shm_begin(hora__net *net, int local_rank, int local_size, bool populate,
                    struct hora__shm **out, struct hora__shm_hello *mine) {
  *out = NULL;
  memset(mine, 0, sizeof(*mine));
  mine->fd = -1;
  struct hora__shm *s = hora__calloc(1, sizeof(*s));
  if (!s) {
    return HORA_ERR_NO_MEMORY;
  }
  s->leader_fd = -1;
  s->local_rank = local_rank;
  s->local_size = local_size;
  s->populate = populate;
  size_t half = (size_t)hora__params.SHM_BUFFER_SIZE;
  half = (half + PAGE - 1) / PAGE * PAGE;
  s->half = half;
  s->slot = SLOT_HEADER + 2 * half;
  s->bytes = PAGE + (size_t)s->local_size * s->slot + mail_bytes(s->local_size);
  s->pids = hora__calloc((size_t)s->local_size, sizeof(*s->pids));
  s->global = hora__calloc((size_t)s->local_size, sizeof(*s->global));
  if (!s->pids || !s->global) {
    hora__shm_destroy(s);
    return HORA_ERR_NO_MEMORY;
  }
  mine->ok = 1;
  if (s->local_rank == 0) {
    /* The leader creates the segment; the others open it through /proc. */
    s->leader_fd = memfd_create("hora-shm", MFD_CLOEXEC);
    if (s->leader_fd < 0 || ftruncate(s->leader_fd, (off_t)s->bytes) != 0) {
      hora__error_errno(HORA_ERR_SYSTEM, "memfd_create/ftruncate of %zu bytes", s->bytes);
      HORA_WARN("shared memory unavailable, using sockets within the host: %s",
                hora__error_message());
      mine->ok = 0;
    }
    mine->fd = s->leader_fd;
  }
  const char *want = hora__params.SHM_SINGLE_COPY;
  mine->mode = !strcmp(want, "0")        ? SINGLE_COPY_OFF
               : !strcmp(want, "staged") ? SINGLE_COPY_STAGED
               : !strcmp(want, "1")      ? SINGLE_COPY_KERNEL
                                         : SINGLE_COPY_AUTO;
  mine->pid = (int32_t)getpid();
  mine->global = net->rank;
  mine->cma_addr = (uint64_t)(uintptr_t)&cma_probe;
  *out = s;
  return HORA_SUCCESS;
}

void hora__shm_attach(struct hora__shm *s, const struct hora__shm_hello *host,
                      struct hora__shm_verdict *mine) {
  memset(mine, 0, sizeof(*mine));
  int mode = SINGLE_COPY_AUTO;
  for (int i = 0; i < s->local_size; i++) {
    s->pids[i] = (pid_t)host[i].pid;
    s->global[i] = host[i].global;
    mode = HORA_MIN(mode, host[i].mode);
  }
  s->mode = mode;
  if (host[0].ok && host[0].fd >= 0) {
    if (map_segment(s, (pid_t)host[0].pid, host[0].fd, s->local_rank == 0 ? s->leader_fd : -1) ==
        HORA_SUCCESS) {
      mine->mapped = 1;
    } else {
      HORA_WARN("shared memory unavailable, using sockets within the host: %s",
                hora__error_message());
    }
  }
  if (mode != SINGLE_COPY_OFF) {
    /* Whether this rank can read the next local rank's memory. */
    int peer = (s->local_rank + 1) % s->local_size;
    uint64_t got = 0;
    struct iovec l = {&got, sizeof(got)};
    struct iovec r = {(void *)(uintptr_t)host[peer].cma_addr, sizeof(got)};
    mine->cma = process_vm_readv(s->pids[peer], &l, 1, &r, 1, 0) == (ssize_t)sizeof(got) &&
                got == cma_probe;
  }
}

void hora__shm_finish(struct hora__shm **sp, const struct hora__shm_verdict *host) {
  struct hora__shm *s = *sp;
  if (s->leader_fd >= 0) {
    close(s->leader_fd); /* the mappings keep the memory alive */
    s->leader_fd = -1;
  }
  bool mapped = true, cma = true;
  for (int i = 0; i < s->local_size; i++) {
    mapped = mapped && host[i].mapped;
    cma = cma && host[i].cma;
  }
  if (!mapped) {
    hora__shm_destroy(s);
    *sp = NULL;
    return;
  }
  s->cma = s->mode != SINGLE_COPY_OFF && cma;
  s->tuning = s->cma && s->mode == SINGLE_COPY_AUTO;
  s->staged = s->mode == SINGLE_COPY_STAGED;
}

void hora__shm_destroy(struct hora__shm *s) {
  if (!s) {
    return;
  }
  if (s->base) {
    munmap(s->base, s->bytes);
  }
  if (s->leader_fd >= 0) {
    close(s->leader_fd);
  }
  free(s->pids);
  free(s->global);
  free(s);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static long futex(atomic_uint *addr, int op, unsigned val, const struct timespec *ts) {
  return syscall(SYS_futex, (unsigned *)addr, op, val, ts, NULL, 0);
}

/* A local peer that no longer exists will never arrive. */
static int check_peers_alive(hora__net *net, struct hora__shm *s) {
  for (int i = 0; i < s->local_size; i++) {
    if (i != s->local_rank && kill(s->pids[i], 0) != 0 && errno == ESRCH) {
      char name[160];
      return hora__error(HORA_ERR_PEER_LOST, "lost %s: the process is gone",
                         hora__peer_name(net, s->global[i], name, sizeof(name)));
    }
  }
  return HORA_SUCCESS;
}

int hora__shm_barrier(struct hora__shm *s, hora__net *net) {
  struct segment_header *b = s->bar;
  unsigned gen = atomic_load_explicit(&b->generation, memory_order_acquire);
  if (atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) == (unsigned)s->local_size - 1) {
    atomic_store_explicit(&b->arrived, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&b->generation, 1, memory_order_release);
    if (atomic_load_explicit(&b->sleepers, memory_order_acquire) > 0) {
      futex(&b->generation, FUTEX_WAKE, INT32_MAX, NULL);
    }
    return HORA_SUCCESS;
  }
  if (net->spin_us > 0) {
    uint64_t until = hora__now_ns() + (uint64_t)net->spin_us * 1000;
    unsigned spins = 0;
    while (atomic_load_explicit(&b->generation, memory_order_acquire) == gen) {
      if ((++spins & 63) == 0) {
        if (hora__now_ns() >= until) {
          break;
        }
        HORA_CHECK(hora__service_maybe(net));
        sched_yield();
      }
      cpu_relax();
    }
  }
  /* Reached between the pieces of every shared-memory collective, so the
   * service clock is read here even when nobody waits. */
  HORA_CHECK(hora__service_maybe(net));
  uint64_t next_check = hora__now_ns() + 100 * 1000000ull;
  uint64_t waiting_since = hora__now_ns();
  while (atomic_load_explicit(&b->generation, memory_order_acquire) == gen) {
    if (net->stall_ns && hora__now_ns() - waiting_since > net->stall_ns) {
      return hora__error(HORA_ERR_TIMEOUT,
                         "a shared-memory collective stalled: %u of %d local ranks arrived within "
                         "%.0f s (HORA_STALL_SHUTDOWN_TIME_SECONDS)",
                         atomic_load(&b->arrived), s->local_size, (double)net->stall_ns * 1e-9);
    }
    atomic_fetch_add_explicit(&b->sleepers, 1, memory_order_acq_rel);
    struct timespec ts = {0, 20 * 1000000}; /* wake to look around now and then */
    if (atomic_load_explicit(&b->generation, memory_order_acquire) == gen) {
      futex(&b->generation, FUTEX_WAIT, gen, &ts);
    }
    atomic_fetch_sub_explicit(&b->sleepers, 1, memory_order_acq_rel);
    HORA_CHECK(hora__service_maybe(net));
    if (hora__now_ns() >= next_check) {
      next_check = hora__now_ns() + 100 * 1000000ull;
      HORA_CHECK(check_peers_alive(net, s));
    }
  }
  return HORA_SUCCESS;
}
