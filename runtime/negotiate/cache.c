/* The response cache: fixed slots, LRU eviction, identical on every rank. */
#include "runtime/negotiate/cache.h"

#include <stdlib.h>

bool hora__meta_equal(const struct hora__op_meta *a, const struct hora__op_meta *b) {
  return a->kind == b->kind && a->dtype == b->dtype && a->op == b->op && a->device == b->device &&
         a->compression == b->compression && a->root == b->root && a->count == b->count &&
         a->prescale == b->prescale && a->postscale == b->postscale && a->shape == b->shape &&
         a->group == b->group && a->group_size == b->group_size && a->split == b->split;
}

int hora__cache_init(struct hora__cache *c, uint32_t capacity) {
  memset(c, 0, sizeof(*c));
  c->head = c->tail = -1;
  if (capacity == 0) {
    return HORA_SUCCESS;
  }
  c->e = hora__calloc(capacity, sizeof(*c->e));
  if (!c->e) {
    return HORA_ERR_NO_MEMORY;
  }
  c->capacity = capacity;
  return HORA_SUCCESS;
}

void hora__cache_free(struct hora__cache *c) {
  for (uint32_t i = 0; i < c->capacity; i++) {
    free(c->e[i].key);
  }
  free(c->e);
  hora__table_free(&c->index);
  memset(c, 0, sizeof(*c));
  c->head = c->tail = -1;
}

int32_t hora__cache_find(const struct hora__cache *c, const char *key, size_t len) {
  if (!c->capacity) {
    return -1;
  }
  uintptr_t v = (uintptr_t)hora__table_get(&c->index, key, len);
  return v ? (int32_t)(v - 1) : -1;
}

static void unlink_slot(struct hora__cache *c, int32_t s) {
  struct hora__cache_entry *e = &c->e[s];
  if (e->prev >= 0) {
    c->e[e->prev].next = e->next;
  } else {
    c->head = e->next;
  }
  if (e->next >= 0) {
    c->e[e->next].prev = e->prev;
  } else {
    c->tail = e->prev;
  }
}

static void push_front(struct hora__cache *c, int32_t s) {
  struct hora__cache_entry *e = &c->e[s];
  e->prev = -1;
  e->next = c->head;
  if (c->head >= 0) {
    c->e[c->head].prev = s;
  }
  c->head = s;
  if (c->tail < 0) {
    c->tail = s;
  }
}

int hora__cache_note(struct hora__cache *c, const char *key, size_t len,
                     const struct hora__op_meta *meta, int32_t *slot) {
  *slot = -1;
  if (!c->capacity) {
    return HORA_SUCCESS;
  }
  int32_t s = hora__cache_find(c, key, len);
  if (s >= 0 && hora__meta_equal(&c->e[s].meta, meta)) {
    unlink_slot(c, s);
    push_front(c, s);
    *slot = s;
    return HORA_SUCCESS;
  }
  /* Every rank must make the same assignment, so failing here is fatal. */
  char *copy = hora__malloc(len + 1);
  if (!copy) {
    return HORA_ERR_NO_MEMORY;
  }
  memcpy(copy, key, len);
  copy[len] = '\0';
  bool listed = s >= 0;
  if (s < 0) {
    if (c->used < c->capacity) {
      s = (int32_t)c->used++;
    } else {
      s = c->tail; /* least recently used, or emptied */
      listed = true;
      if (c->e[s].used) {
        hora__table_remove(&c->index, c->e[s].key, c->e[s].key_len);
        c->evictions++;
      }
    }
  }
  if (listed) {
    unlink_slot(c, s);
  }
  free(c->e[s].key);
  struct hora__cache_entry *e = &c->e[s];
  e->key = copy;
  e->key_len = (uint16_t)len;
  e->meta = *meta;
  e->used = true;
  e->version = ++c->version;
  push_front(c, s);
  HORA_CHECK(hora__table_put(&c->index, copy, len, (void *)(uintptr_t)(s + 1)));
  *slot = s;
  return HORA_SUCCESS;
}

static void push_back(struct hora__cache *c, int32_t s) {
  struct hora__cache_entry *e = &c->e[s];
  e->next = -1;
  e->prev = c->tail;
  if (c->tail >= 0) {
    c->e[c->tail].next = s;
  }
  c->tail = s;
  if (c->head < 0) {
    c->head = s;
  }
}

void hora__cache_forget(struct hora__cache *c, int32_t slot) {
  if (!hora__cache_entry(c, slot)) {
    return;
  }
  struct hora__cache_entry *e = &c->e[slot];
  hora__table_remove(&c->index, e->key, e->key_len);
  free(e->key);
  e->key = NULL;
  e->key_len = 0;
  e->used = false;
  e->version = ++c->version;
  /* The emptied slot goes to the LRU end: the next to be reused. */
  unlink_slot(c, slot);
  push_back(c, slot);
}
