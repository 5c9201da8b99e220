/* The response cache: operations that ran before, by key, in slots that
 * every rank assigns identically. Every rank applies the same sequence of
 * updates (the responses, in the order rank 0 sends them), so slot s holds
 * the same key everywhere once a rank has seen the same responses.
 *
 * A rank then announces a cached operation as one bit (its slot) instead of
 * the full request, and rank 0 refers to it by slot in its responses. The
 * cache version counts slot assignments; a bit sent at version V names the
 * key slot s held at V, which rank 0 can still resolve when s has not been
 * reassigned since (else it asks for the full request again). */
#ifndef HORA_CACHE_H
#define HORA_CACHE_H

#include "message.h"
#include "table.h"

struct hora__cache_entry {
  char *key;
  uint16_t key_len;
  struct hora__op_meta meta;
  uint32_t version; /* the cache version at which this slot got its key */
  int32_t prev, next; /* LRU list: head is the most recently used */
  bool used;
};

struct hora__cache {
  uint32_t capacity; /* 0: disabled */
  struct hora__cache_entry *e;
  struct hora__table index; /* key -> slot + 1 */
  uint32_t version;
  int32_t head, tail;
  uint32_t used;
  uint64_t evictions;
};

int hora__cache_init(struct hora__cache *c, uint32_t capacity);
void hora__cache_free(struct hora__cache *c);
/* The slot holding `key`, or -1. */
int32_t hora__cache_find(const struct hora__cache *c, const char *key, size_t len);
/* Records that `key` ran with `meta`: touches its slot, or assigns one
 * (reusing the key's slot if its meta changed, else a free one, else the
 * least recently used). *slot is -1 when the cache is disabled. Failing
 * (out of memory) leaves this rank's cache out of step: fatal. */
int hora__cache_note(struct hora__cache *c, const char *key, size_t len,
                     const struct hora__op_meta *meta, int32_t *slot);
static inline const struct hora__cache_entry *hora__cache_entry(const struct hora__cache *c,
                                                                int32_t slot) {
  return slot >= 0 && (uint32_t)slot < c->capacity && c->e[slot].used ? &c->e[slot] : NULL;
}

bool hora__meta_equal(const struct hora__op_meta *a, const struct hora__op_meta *b);

#endif
