/* The response cache: operations that ran before, by key, in slots that
 * every rank assigns identically. Every rank applies the same sequence of
 * updates, at the end of each cycle (engine/cycle_steps.c), so slot s
 * holds the same key everywhere between cycles.
 *
 * A rank then announces a cached operation as one bit (its slot) of the
 * cycle's bit vectors instead of sending the full request to rank 0. The
 * version counts slot assignments. */
#ifndef HORA_CACHE_H
#define HORA_CACHE_H

#include "runtime/negotiate/message.h"
#include "base/table.h"

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
/* Empties a slot (every rank at the same point): it is the next reused. */
void hora__cache_forget(struct hora__cache *c, int32_t slot);
static inline const struct hora__cache_entry *hora__cache_entry(const struct hora__cache *c,
                                                                int32_t slot) {
  return slot >= 0 && (uint32_t)slot < c->capacity && c->e[slot].used ? &c->e[slot] : NULL;
}

bool hora__meta_equal(const struct hora__op_meta *a, const struct hora__op_meta *b);

#endif
