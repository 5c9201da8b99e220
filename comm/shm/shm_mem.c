/* Host-shared memory: the blocks of hora_mem_alloc, and this rank's mappings
 * of its local peers' blocks.
 *
 * Each block is a memfd of its own, mapped shared and sealed against
 * resizing, so a mapping of it can never fault with SIGBUS. A peer reaches
 * it through /proc/<pid>/fd, as it reaches the host segment (shm.c), and the
 * single-copy allreduce (shm_coll.c) then reads and writes it with plain
 * loads and stores instead of process_vm_readv/writev: one pass over each
 * byte less, and no page pinning per call. */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "comm/shm/shm.h"

struct mem_block {
  char *base;
  size_t len;
  int fd;
  uint64_t id;
  uint64_t ino;
};

/* Sorted by base; few blocks in practice (a trainer's gradient arenas). */
static pthread_mutex_t blocks_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mem_block *blocks;
static size_t nblocks, blocks_cap;
/* nblocks, readable without the lock: most programs never allocate a block,
 * and the allreduce asks about every buffer. */
static _Atomic size_t nblocks_published;
static uint64_t next_id = 1;
/* Counts frees: a peer that sees it move drops its mappings of our blocks,
 * so a freed block's pages do not outlive it for long. */
static _Atomic uint64_t frees;

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* Index of the first block whose base is above p. */
static size_t upper_bound(const void *p) {
  size_t lo = 0, hi = nblocks;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if ((const char *)blocks[mid].base <= (const char *)p) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

int hora__mem_alloc(size_t bytes, void **ptr) {
  if (!ptr) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_mem_alloc: ptr is NULL");
  }
  *ptr = NULL;
  if (bytes == 0 || bytes > (SIZE_MAX >> 1)) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_mem_alloc: cannot allocate %zu bytes", bytes);
  }
  size_t len = (bytes + page_size() - 1) / page_size() * page_size();
  int fd = memfd_create("hora-mem", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    return hora__error_errno(HORA_ERR_SYSTEM, "hora_mem_alloc: memfd_create");
  }
  struct stat st;
  if (ftruncate(fd, (off_t)len) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0 ||
      fstat(fd, &st) != 0) {
    int rc = hora__error_errno(errno == ENOSPC || errno == EFBIG ? HORA_ERR_NO_MEMORY : HORA_ERR_SYSTEM,
                               "hora_mem_alloc: sizing a memfd to %zu bytes", len);
    close(fd);
    return rc;
  }
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int rc = hora__error_errno(HORA_ERR_NO_MEMORY, "hora_mem_alloc: mmap of %zu bytes", len);
    close(fd);
    return rc;
  }
  pthread_mutex_lock(&blocks_lock);
  if (nblocks == blocks_cap) {
    size_t cap = blocks_cap ? blocks_cap * 2 : 16;
    struct mem_block *nb = realloc(blocks, cap * sizeof(*nb));
    if (!nb) {
      pthread_mutex_unlock(&blocks_lock);
      munmap(p, len);
      close(fd);
      return hora__error(HORA_ERR_NO_MEMORY, "hora_mem_alloc: out of memory for the block list");
    }
    blocks = nb;
    blocks_cap = cap;
  }
  size_t at = upper_bound(p);
  memmove(&blocks[at + 1], &blocks[at], (nblocks - at) * sizeof(*blocks));
  blocks[at] = (struct mem_block){p, len, fd, next_id++, (uint64_t)st.st_ino};
  nblocks++;
  atomic_store(&nblocks_published, nblocks);
  pthread_mutex_unlock(&blocks_lock);
  *ptr = p;
  return HORA_SUCCESS;
}

int hora__mem_free(void *ptr) {
  if (!ptr) {
    return HORA_SUCCESS;
  }
  pthread_mutex_lock(&blocks_lock);
  size_t at = upper_bound(ptr);
  if (at == 0 || blocks[at - 1].base != ptr) {
    pthread_mutex_unlock(&blocks_lock);
    return hora__error(HORA_ERR_INVALID_ARG, "hora_mem_free: %p did not come from hora_mem_alloc",
                       ptr);
  }
  struct mem_block b = blocks[at - 1];
  memmove(&blocks[at - 1], &blocks[at], (nblocks - at) * sizeof(*blocks));
  nblocks--;
  atomic_store(&nblocks_published, nblocks);
  atomic_fetch_add(&frees, 1);
  pthread_mutex_unlock(&blocks_lock);
  munmap(b.base, b.len);
  close(b.fd);
  return HORA_SUCCESS;
}

bool hora__mem_find(const void *p, size_t len, struct hora__mem_ref *ref) {
  memset(ref, 0, sizeof(*ref));
  if (len == 0 || atomic_load(&nblocks_published) == 0) {
    return false;
  }
  pthread_mutex_lock(&blocks_lock);
  size_t at = upper_bound(p);
  bool found = false;
  if (at > 0) {
    const struct mem_block *b = &blocks[at - 1];
    size_t off = (size_t)((const char *)p - b->base);
    if (off < b->len && len <= b->len - off) {
      *ref = (struct hora__mem_ref){b->id, (uint64_t)b->fd, b->ino, b->len, off};
      found = true;
    }
  }
  pthread_mutex_unlock(&blocks_lock);
  return found;
}

uint64_t hora__mem_frees(void) { return atomic_load(&frees); }

/* ---- mappings of the peers' blocks --------------------------------------- */

/* Blocks of one peer kept mapped. An operation whose buffers lie in more
 * blocks than this serves the rest through the kernel. */
#define PEER_MAPS_MAX 256

struct peer_map {
  uint64_t id;
  uint64_t used; /* the operation that last used it */
  char *base;
  size_t len;
};

struct hora__peer_maps {
  uint64_t frees_seen;
  uint64_t failed_id; /* the last block that could not be mapped: not tried again */
  int n;
  int last;           /* the entry hit last: consecutive tensors share blocks */
  bool warned;
  struct peer_map m[PEER_MAPS_MAX];
};

static void drop_all(struct hora__peer_maps *pm) {
  for (int i = 0; i < pm->n; i++) {
    munmap(pm->m[i].base, pm->m[i].len);
  }
  pm->n = 0;
  pm->last = 0;
}

struct hora__peer_maps *hora__peer_maps_new(int local_size) {
  return hora__calloc((size_t)local_size, sizeof(struct hora__peer_maps));
}

void hora__peer_maps_free(struct hora__peer_maps *maps, int local_size) {
  if (!maps) {
    return;
  }
  for (int i = 0; i < local_size; i++) {
    drop_all(&maps[i]);
  }
  free(maps);
}

/* Whether [offset, offset + need) lies in len bytes (overflow-safe). */
static bool fits(uint64_t len, const struct hora__mem_ref *ref, size_t need) {
  return ref->offset <= len && need <= len - ref->offset;
}

/* base + offset where it fits a mapping of len bytes, else NULL, *bad set. */
static char *inside(char *base, size_t len, const struct hora__mem_ref *ref, size_t need,
                    bool *bad) {
  if (!fits(len, ref, need)) {
    *bad = true;
    return NULL;
  }
  return base + ref->offset;
}

char *hora__peer_mem(struct hora__peer_maps *maps, int lr, pid_t pid, uint64_t peer_frees,
                     uint64_t op, const struct hora__mem_ref *ref, size_t need, bool *bad) {
  struct hora__peer_maps *pm = &maps[lr];
  *bad = false;
  if (ref->id == 0) {
    return NULL;
  }
  if (pm->frees_seen != peer_frees) {
    drop_all(pm);
    pm->frees_seen = peer_frees;
  }
  if (ref->id == pm->failed_id) {
    return NULL;
  }
  if (pm->last < pm->n && pm->m[pm->last].id == ref->id) {
    pm->m[pm->last].used = op;
    return inside(pm->m[pm->last].base, pm->m[pm->last].len, ref, need, bad);
  }
  for (int i = 0; i < pm->n; i++) {
    if (pm->m[i].id == ref->id) {
      pm->m[i].used = op;
      pm->last = i;
      return inside(pm->m[i].base, pm->m[i].len, ref, need, bad);
    }
  }
  /* (Checked before mapping too: the block's length is the peer's word.) */
  if (!fits(ref->len, ref, need)) {
    *bad = true;
    return NULL;
  }
  /* A free slot, or else the least recently used mapping that this
   * operation has not handed out. */
  int slot = pm->n;
  if (slot == PEER_MAPS_MAX) {
    slot = -1;
    for (int i = 0; i < pm->n; i++) {
      if (pm->m[i].used != op && (slot < 0 || pm->m[i].used < pm->m[slot].used)) {
        slot = i;
      }
    }
    if (slot < 0) {
      return NULL;
    }
  }
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, (int)ref->fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  struct stat st;
  void *p = MAP_FAILED;
  /* The fd is the peer's as long as it is inside this collective with the
   * block; the inode check makes a mix-up impossible anyway. */
  if (fd >= 0 && fstat(fd, &st) == 0 && (uint64_t)st.st_ino == ref->ino &&
      (uint64_t)st.st_size >= ref->len) {
    p = mmap(NULL, ref->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  int err = errno;
  if (fd >= 0) {
    close(fd);
  }
  if (p == MAP_FAILED) {
    pm->failed_id = ref->id;
    if (!pm->warned) {
      pm->warned = true;
      HORA_INFO("cannot map local rank %d's hora_mem_alloc block through %s (%s); "
                "copying through the kernel instead",
                lr, path, strerror(err));
    }
    return NULL;
  }
  if (slot < pm->n) {
    munmap(pm->m[slot].base, pm->m[slot].len);
  } else {
    pm->n++;
  }
  pm->m[slot] = (struct peer_map){ref->id, op, p, ref->len};
  pm->last = slot;
  return inside(p, ref->len, ref, need, bad);
}
