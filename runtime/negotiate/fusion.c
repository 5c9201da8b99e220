/* The fusion decision: which responses run as one collective over a
 * shared buffer, and how long rank 0 holds ready ones back so that more
 * can join them. Every rank fuses the cached responses a cycle schedules
 * (engine/cycle_steps.c) by the same rule, in the same order, as rank 0
 * fuses those it decided (negotiate.c), so all ranks run the same fused
 * responses. */
#include "runtime/negotiate/fusion.h"

#include "runtime/negotiate/controller_state.h"

bool hora__response_fusable(const struct hora__response *r) {
  /* (Adasum's coefficients are each tensor's own.) */
  return (r->kind == HORA_KIND_ALLREDUCE && r->op != HORA_ADASUM) ||
         r->kind == HORA_KIND_BROADCAST;
}

uint64_t hora__response_payload(const struct hora__response *r) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < r->ntensors; i++) {
    n += r->tensors[i].count;
  }
  return n * hora_dtype_size((hora_dtype)r->dtype);
}

/* Responses that may share one fusion buffer: same collective over the same
 * kind of memory, and for allreduce the same arithmetic on the wire. */
static bool compatible(const struct hora__response *a, const struct hora__response *b) {
  if (a->kind != b->kind || a->dtype != b->dtype || a->device != b->device) {
    return false;
  }
  if (a->kind == HORA_KIND_BROADCAST) {
    return a->root == b->root;
  }
  return a->op == b->op && a->compression == b->compression && a->prescale == b->prescale &&
         a->postscale == b->postscale;
}

/* Moves the tensors of `from` to the end of `into`. The list grows by
 * doubling: a batch of n tensors costs log n allocations, not n, and few
 * distinct sizes, so a long run does not leave the allocator caching a
 * block of every size a batch ever had. */
static int merge(struct hora__response *into, struct hora__response *from) {
  uint32_t need = into->ntensors + from->ntensors;
  if (need > into->tensors_cap) {
    uint32_t cap = HORA_MAX(need, HORA_MAX(into->tensors_cap * 2, 8u));
    struct hora__resp_tensor *t = hora__realloc(into->tensors, cap * sizeof(*t));
    if (!t) {
      return HORA_ERR_NO_MEMORY;
    }
    into->tensors = t;
    into->tensors_cap = cap;
  }
  memcpy(into->tensors + into->ntensors, from->tensors, from->ntensors * sizeof(*into->tensors));
  into->ntensors = need;
  from->ntensors = 0;
  return HORA_SUCCESS;
}

int hora__responses_fuse(struct hora__response *head, struct hora__response ***tail,
                         int64_t fusion_threshold) {
  /* Each fusable response gathers the later compatible ones, as long as
   * they fit the threshold together; the rest keep their order. A tensor
   * bigger than the threshold stays alone (and is never copied). */
  for (struct hora__response *r = head; r && fusion_threshold > 0; r = r->next) {
    if (!hora__response_fusable(r)) {
      continue;
    }
    uint64_t bytes = hora__response_payload(r);
    struct hora__response **link = &r->next;
    while (*link && bytes < (uint64_t)fusion_threshold) {
      struct hora__response *x = *link;
      uint64_t more = hora__response_fusable(x) && compatible(r, x) ? hora__response_payload(x)
                                                                  : UINT64_MAX;
      if (more <= (uint64_t)fusion_threshold - bytes) {
        HORA_CHECK(merge(r, x));
        bytes += more;
        *link = x->next;
        if (*tail == &x->next) {
          *tail = link;
        }
        hora__response_free(x);
      } else {
        link = &x->next;
      }
    }
  }
  return HORA_SUCCESS;
}

bool hora__controller_should_send(const struct hora__controller *c, uint64_t now_ns,
                                  uint64_t cycle_ns, uint64_t fusion_threshold,
                                  uint64_t *wake_ns) {
  *wake_ns = UINT64_MAX;
  if (!c->ready) {
    return false;
  }
  /* Hold ready tensors back only while others are half-submitted and might
   * join them: a lone operation, or a full fusion buffer, goes at once. */
  uint64_t waited = now_ns > c->ready_since_ns ? now_ns - c->ready_since_ns : 0;
  if (c->ready_urgent || c->ops.count == 0 || c->ready_bytes >= fusion_threshold ||
      waited >= cycle_ns) {
    return true;
  }
  *wake_ns = c->ready_since_ns + cycle_ns;
  return false;
}
