#include "runtime/observe/verify.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "runtime/operation.h"

/* The engine hands its operation kinds to the data plane as they are. */
_Static_assert((int)HORA_KIND_ALLREDUCE == (int)HORA_COLL_ALLREDUCE &&
                   (int)HORA_KIND_BROADCAST == (int)HORA_COLL_BROADCAST &&
                   (int)HORA_KIND_ALLGATHER == (int)HORA_COLL_ALLGATHER &&
                   (int)HORA_KIND_REDUCESCATTER == (int)HORA_COLL_REDUCESCATTER &&
                   (int)HORA_KIND_ALLGATHERV == (int)HORA_COLL_ALLGATHERV &&
                   (int)HORA_KIND_ALLTOALL == (int)HORA_COLL_ALLTOALL,
               "operation kinds of runtime/operation.h and comm/coll/collectives.h differ");

/* Fletcher-style sums over four interleaved lanes of 64-bit words: s1 sums
 * the words (any flipped bit changes it), s2 sums the running s1 (words in
 * the wrong place change it). Two adds per word and no multiply, so the
 * check runs at memory speed; the lanes, sums and length are mixed once at
 * the end. */
static inline uint64_t mix(uint64_t h, uint64_t w) {
  h ^= w;
  h *= 0x9E3779B97F4A7C15ull;
  return h ^ (h >> 29);
}

uint64_t hora__checksum(const struct hora__iov *v, int n) {
  uint64_t s1[4] = {1, 2, 3, 4}, s2[4] = {0, 0, 0, 0};
  uint64_t total = 0;
  uint8_t tail[32];
  size_t tail_len = 0;
  for (int b = 0; b < n; b++) {
    const uint8_t *p = v[b].base;
    size_t len = v[b].len;
    total += len;
    /* Top up a partial block left by the previous buffer. */
    while (tail_len && len) {
      tail[tail_len++] = *p++;
      len--;
      if (tail_len == sizeof(tail)) {
        for (int k = 0; k < 4; k++) {
          uint64_t w;
          memcpy(&w, tail + 8 * k, 8);
          s1[k] += w;
          s2[k] += s1[k];
        }
        tail_len = 0;
      }
    }
    for (; len >= 32; p += 32, len -= 32) {
      for (int k = 0; k < 4; k++) {
        uint64_t w;
        memcpy(&w, p + 8 * k, 8);
        s1[k] += w;
        s2[k] += s1[k];
      }
    }
    memcpy(tail + tail_len, p, len);
    tail_len += len;
  }
  uint64_t h = total;
  for (size_t i = 0; i < tail_len; i++) {
    h = mix(h, tail[i]);
  }
  for (int k = 0; k < 4; k++) {
    h = mix(h, s1[k]);
    h = mix(h, s2[k]);
  }
  return h;
}

int hora__verify_result(hora__comm *c, const struct hora__iov *out, int n, const char *what) {
  uint64_t mine = hora__checksum(out, n);
  uint64_t *all = calloc((size_t)c->size, sizeof(*all));
  if (!all) {
    return hora__error(HORA_ERR_NO_MEMORY, "HORA_VERIFY: no memory for %d checksums", c->size);
  }
  int rc = hora__allgather(c, &mine, sizeof(mine), all);
  if (rc != HORA_SUCCESS) {
    free(all);
    return rc;
  }
  /* The value most ranks hold is taken as right; the message names the
   * ranks that hold anything else (with no majority, every rank). */
  int best = 0, best_votes = 0;
  for (int r = 0; r < c->size; r++) {
    int votes = 0;
    for (int q = 0; q < c->size; q++) {
      votes += all[q] == all[r];
    }
    if (votes > best_votes) {
      best = r;
      best_votes = votes;
    }
  }
  if (best_votes == c->size) {
    free(all);
    return HORA_SUCCESS;
  }
  bool majority = 2 * best_votes > c->size;
  char list[512] = "";
  size_t used = 0;
  int named = 0;
  for (int r = 0; r < c->size && used < sizeof(list); r++) {
    if (majority && all[r] == all[best]) {
      continue;
    }
    if (named++ == 16) {
      used += (size_t)snprintf(list + used, sizeof(list) - used, ", ...");
      break;
    }
    used += (size_t)snprintf(list + used, sizeof(list) - used, "%s%d (%016" PRIx64 ")",
                             named > 1 ? ", " : "", r, all[r]);
  }
  if (majority) {
    rc = hora__error(HORA_ERR_CORRUPT,
                     "HORA_VERIFY: the result of %s differs between ranks: %d rank(s) agree on "
                     "checksum %016" PRIx64 ", these differ: rank(s) %s",
                     what, best_votes, all[best], list);
  } else {
    rc = hora__error(HORA_ERR_CORRUPT,
                     "HORA_VERIFY: the result of %s differs between ranks, with no majority: "
                     "rank(s) %s",
                     what, list);
  }
  free(all);
  return rc;
}
