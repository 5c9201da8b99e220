#include "base/table.h"

#include <stdlib.h>

uint64_t hora__hash_bytes(const void *p, size_t n) {
  /* FNV-1a: short keys, no adversary (keys come from this job's ranks). */
  const uint8_t *b = p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}

void hora__table_free(struct hora__table *t) {
  for (size_t i = 0; i < t->nbuckets; i++) {
    struct hora__table_entry *e = t->buckets[i];
    while (e) {
      struct hora__table_entry *n = e->next;
      free(e);
      e = n;
    }
  }
  while (t->spare) {
    struct hora__table_entry *n = t->spare->next;
    free(t->spare);
    t->spare = n;
  }
  free(t->buckets);
  memset(t, 0, sizeof(*t));
}

static struct hora__table_entry **find(const struct hora__table *t, const char *key, size_t len,
                                       uint64_t h) {
  struct hora__table_entry **link = &t->buckets[h & (t->nbuckets - 1)];
  while (*link) {
    struct hora__table_entry *e = *link;
    if (e->hash == h && e->key_len == len && memcmp(e->key, key, len) == 0) {
      return link;
    }
    link = &e->next;
  }
  return link;
}

void *hora__table_get(const struct hora__table *t, const char *key, size_t len) {
  if (!t->nbuckets) {
    return NULL;
  }
  struct hora__table_entry **link = find(t, key, len, hora__hash_bytes(key, len));
  return *link ? (*link)->value : NULL;
}

static int grow(struct hora__table *t) {
  size_t n = t->nbuckets ? t->nbuckets * 2 : 64;
  struct hora__table_entry **b = hora__calloc(n, sizeof(*b));
  if (!b) {
    return HORA_ERR_NO_MEMORY;
  }
  for (size_t i = 0; i < t->nbuckets; i++) {
    struct hora__table_entry *e = t->buckets[i];
    while (e) {
      struct hora__table_entry *next = e->next;
      size_t j = e->hash & (n - 1);
      e->next = b[j];
      b[j] = e;
      e = next;
    }
  }
  free(t->buckets);
  t->buckets = b;
  t->nbuckets = n;
  return HORA_SUCCESS;
}

int hora__table_put(struct hora__table *t, const char *key, size_t len, void *value) {
  if (len > UINT16_MAX) {
    return hora__error(HORA_ERR_INVALID_ARG, "table key of %zu bytes is too long", len);
  }
  if (t->count >= t->nbuckets) {
    HORA_CHECK(grow(t));
  }
  uint64_t h = hora__hash_bytes(key, len);
  struct hora__table_entry **link = find(t, key, len, h);
  if (*link) {
    (*link)->value = value;
    return HORA_SUCCESS;
  }
  struct hora__table_entry *e = t->spare;
  if (e && e->key_room > len) {
    t->spare = e->next;
    t->nspare--;
  } else {
    size_t room = (len + 1 + 63) / 64 * 64; /* few sizes, so spares fit most keys */
    e = hora__malloc(sizeof(*e) + room);
    if (!e) {
      return HORA_ERR_NO_MEMORY;
    }
    e->key_room = (uint16_t)HORA_MIN(room, (size_t)UINT16_MAX);
  }
  e->next = NULL;
  e->hash = h;
  e->value = value;
  e->key_len = (uint16_t)len;
  memcpy(e->key, key, len);
  e->key[len] = '\0';
  *link = e;
  t->count++;
  return HORA_SUCCESS;
}

void *hora__table_remove(struct hora__table *t, const char *key, size_t len) {
  if (!t->nbuckets) {
    return NULL;
  }
  struct hora__table_entry **link = find(t, key, len, hora__hash_bytes(key, len));
  struct hora__table_entry *e = *link;
  if (!e) {
    return NULL;
  }
  void *v = e->value;
  *link = e->next;
  t->count--;
  if (t->nspare < t->nbuckets) {
    e->next = t->spare;
    t->spare = e;
    t->nspare++;
  } else {
    free(e);
  }
  return v;
}

void hora__table_each(const struct hora__table *t,
                      void (*fn)(void *arg, const char *key, size_t len, void *value), void *arg) {
  for (size_t i = 0; i < t->nbuckets; i++) {
    for (struct hora__table_entry *e = t->buckets[i]; e; e = e->next) {
      fn(arg, e->key, e->key_len, e->value);
    }
  }
}
