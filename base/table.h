/* A string-keyed hash table with chaining; keys are byte strings with an
 * explicit length, copied into the entry. Values are caller pointers.
 * Removed entries are kept for reuse, up to the table's size: a table that
 * the same names pass through every step allocates nothing once warm. */
#ifndef HORA_TABLE_H
#define HORA_TABLE_H

#include "base/common.h"

struct hora__table_entry {
  struct hora__table_entry *next;
  uint64_t hash;
  void *value;
  uint16_t key_len;
  uint16_t key_room; /* bytes key[] has */
  char key[];        /* key_len bytes, then a terminating NUL */
};

struct hora__table {
  struct hora__table_entry **buckets;
  size_t nbuckets, count;
  struct hora__table_entry *spare; /* removed entries, linked by next */
  size_t nspare;
};

uint64_t hora__hash_bytes(const void *p, size_t n);
void hora__table_free(struct hora__table *t);
void *hora__table_get(const struct hora__table *t, const char *key, size_t len);
/* Inserts or replaces. HORA_ERR_NO_MEMORY on failure. */
int hora__table_put(struct hora__table *t, const char *key, size_t len, void *value);
/* Removes and returns the value (NULL when absent). */
void *hora__table_remove(struct hora__table *t, const char *key, size_t len);
/* Calls fn for every entry; fn must not change the table. */
void hora__table_each(const struct hora__table *t,
                      void (*fn)(void *arg, const char *key, size_t len, void *value), void *arg);

#endif
