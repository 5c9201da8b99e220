#include "verify.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* Four independent multiply-accumulate lanes keep the multiplier busy
 * (about one 8-byte word per cycle); the lanes and the length are mixed at
 * the end. Position matters: swapped words change the sum. */
static inline uint64_t mix(uint64_t h, uint64_t w) {
  return (h ^ w) * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
}

uint64_t hora__checksum(const struct hora__iov *v, int n) {
  uint64_t lane[4] = {1, 2, 3, 4};
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
          lane[k] = mix(lane[k], w);
        }
        tail_len = 0;
      }
    }
    for (; len >= 32; p += 32, len -= 32) {
      for (int k = 0; k < 4; k++) {
        uint64_t w;
        memcpy(&w, p + 8 * k, 8);
        lane[k] = mix(lane[k], w);
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
    h = mix(h, lane[k]);
    h ^= h >> 29;
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
