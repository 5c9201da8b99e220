/* Grouped operations at rank 0 (hora_group_start / hora_group_end): a
 * decided member waits, parked, until every member of its group is
 * decided, then all leave at once and unhurried by the cycle; a member that
 * fails fails the group: its parked and pending members at once, and those
 * still to come as they are decided (negotiate.c asks). */
#include <stdio.h>
#include <stdlib.h>

#include "runtime/negotiate/controller_state.h"
#include "runtime/observe/timeline.h"

struct group *hora__ctl_group_find(struct hora__controller *c, uint64_t fp) {
  for (struct group *g = c->groups; g; g = g->next) {
    if (g->fp == fp) {
      return g;
    }
  }
  return NULL;
}

static struct group *group_of(struct hora__controller *c, uint64_t fp, uint32_t size) {
  struct group *g = hora__ctl_group_find(c, fp);
  if (!g && (g = hora__calloc(1, sizeof(*g)))) {
    g->fp = fp;
    g->size = size;
    g->parked_tail = &g->parked;
    g->next = c->groups;
    c->groups = g;
  }
  return g;
}

/* Groups all of whose members are answered are forgotten. */
static void groups_sweep(struct hora__controller *c) {
  for (struct group **p = &c->groups; *p;) {
    struct group *g = *p;
    if (g->answered >= g->size && !g->parked) {
      *p = g->next;
      free(g->error);
      free(g);
    } else {
      p = &g->next;
    }
  }
}

/* The groups among op's variants (a mismatch can name several). */
int hora__ctl_variant_groups(const struct pending_op *op, uint64_t *fp, uint32_t *size) {
  int n = 0;
  for (int i = 0; i < op->nvariants; i++) {
    const struct hora__op_meta *m = &op->variants[i].meta;
    bool seen = false;
    for (int k = 0; k < n; k++) {
      seen |= fp[k] == m->group;
    }
    if (m->group && !seen) {
      fp[n] = m->group;
      size[n++] = m->group_size;
    }
  }
  return n;
}

static int error_response(struct hora__controller *c, const char *key, size_t key_len, int code,
                          const char *msg) {
  struct hora__response *r = hora__response_new(HORA_KIND_ERROR, 1);
  if (!r) {
    return HORA_ERR_NO_MEMORY;
  }
  r->error_code = (uint16_t)code;
  r->error_msg = hora__strdup(msg);
  if (!r->error_msg || hora__response_set_tensor(r, 0, key, key_len, 0) != HORA_SUCCESS) {
    hora__response_free(r);
    return HORA_ERR_NO_MEMORY;
  }
  hora__ctl_push_ready(c, r);
  return HORA_SUCCESS;
}

/* Answers op with an error and counts it in each of its groups; returns
 * in *fps those groups (at most MAX_VARIANTS). */
static int answer_error(struct hora__controller *c, struct pending_op *op, int code,
                        const char *msg, uint64_t *fps, uint32_t *sizes, int *nfp) {
  *nfp = hora__ctl_variant_groups(op, fps, sizes);
  HORA_CHECK(error_response(c, op->key, op->key_len, code, msg));
  hora__timeline_end(op->key, op->key_len);
  hora__ctl_unlink_op(c, op);
  for (int k = 0; k < *nfp; k++) {
    struct group *g = group_of(c, fps[k], sizes[k]);
    if (!g) {
      return HORA_ERR_NO_MEMORY;
    }
    g->answered++;
  }
  return HORA_SUCCESS;
}

/* op fails with `full` (the message as sent), and so does every group it
 * belongs to: their parked members, their pending ones (whatever other
 * groups those belong to in turn), and, in update(), those still to come. */
int hora__ctl_fail_op(struct hora__controller *c, struct pending_op *op, int code,
                      const char *full) {
  enum { MAXG = 64 };
  uint64_t work[MAXG];
  uint32_t wsize[MAXG];
  int nwork = 0;
  {
    uint64_t f[MAX_VARIANTS];
    uint32_t z[MAX_VARIANTS];
    int n;
    HORA_CHECK(answer_error(c, op, code, full, f, z, &n));
    for (int i = 0; i < n; i++) {
      work[nwork] = f[i];
      wsize[nwork++] = z[i];
    }
  }
  for (int k = 0; k < nwork; k++) {
    struct group *g = group_of(c, work[k], wsize[k]);
    if (!g) {
      return HORA_ERR_NO_MEMORY;
    }
    if (g->error) {
      continue;
    }
    g->error = hora__strdup(full);
    g->code = code;
    if (!g->error) {
      return HORA_ERR_NO_MEMORY;
    }
    char msg[1500], name[300];
    while (g->parked) {
      struct hora__response *r = g->parked;
      g->parked = r->next;
      snprintf(msg, sizeof(msg), "%s%s %s fails with its group: %s", c->label ? c->label : "",
               hora__kind_name(r->kind),
               hora__key_display(r->tensors[0].key, r->tensors[0].key_len, name, sizeof(name)),
               g->error);
      int rc = error_response(c, r->tensors[0].key, r->tensors[0].key_len, code, msg);
      hora__response_free(r);
      HORA_CHECK(rc);
      g->answered++;
    }
    g->parked_tail = &g->parked;
    for (struct pending_op *m = c->oldest; m;) {
      uint64_t f[MAX_VARIANTS];
      uint32_t z[MAX_VARIANTS];
      int n = hora__ctl_variant_groups(m, f, z);
      bool member = false;
      for (int i = 0; i < n; i++) {
        member |= f[i] == work[k];
      }
      if (!member) {
        m = m->next;
        continue;
      }
      snprintf(msg, sizeof(msg), "%s%s %s fails with its group: %s", c->label ? c->label : "",
               hora__kind_name(m->meta.kind),
               hora__key_display(m->key, m->key_len, name, sizeof(name)), g->error);
      HORA_CHECK(answer_error(c, m, code, msg, f, z, &n));
      for (int i = 0; i < n; i++) {
        bool known = false;
        for (int j = 0; j < nwork; j++) {
          known |= work[j] == f[i];
        }
        if (!known && nwork < MAXG) {
          work[nwork] = f[i];
          wsize[nwork++] = z[i];
        }
      }
      m = c->oldest; /* (the list changed: start over) */
    }
  }
  groups_sweep(c);
  return HORA_SUCCESS;
}

int hora__ctl_park(struct hora__controller *c, struct pending_op *op, struct hora__response *r) {
  struct group *g = group_of(c, op->meta.group, op->meta.group_size);
  if (!g) {
    hora__response_free(r);
    return HORA_ERR_NO_MEMORY;
  }
  r->next = NULL;
  *g->parked_tail = r;
  g->parked_tail = &r->next;
  if (hora__timeline_enabled()) {
    hora__timeline_end(op->key, op->key_len);
    hora__timeline_begin(op->key, op->key_len, HORA_PHASE_QUEUE);
  }
  hora__ctl_unlink_op(c, op);
  uint32_t parked = 0;
  for (struct hora__response *x = g->parked; x; x = x->next) {
    parked++;
  }
  if (g->answered + parked >= g->size) {
    while (g->parked) {
      struct hora__response *x = g->parked;
      g->parked = x->next;
      hora__ctl_push_ready(c, x);
      g->answered++;
    }
    g->parked_tail = &g->parked;
    c->ready_urgent = true;
    groups_sweep(c);
  }
  return HORA_SUCCESS;
}

void hora__ctl_groups_free(struct hora__controller *c) {
  while (c->groups) {
    struct group *g = c->groups;
    c->groups = g->next;
    while (g->parked) {
      struct hora__response *n = g->parked->next;
      hora__response_free(g->parked);
      g->parked = n;
    }
    free(g->error);
    free(g);
  }
}
