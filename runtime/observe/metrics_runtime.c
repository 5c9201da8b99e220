/* The runtime's counters as metrics: what the coordinator accounts per
 * collective (kind, dtype, bytes, bus bandwidth), and their families. */
#include <stdio.h>

#include "runtime/observe/metrics.h"

static const char *const kind_names[HORA__MKINDS] = {"allreduce", "broadcast", "allgather",
                                                     "reducescatter", "alltoall"};
/* Upper bounds of the size buckets (bytes of one collective); the last
 * bucket has none. */
static const uint64_t size_le[HORA__MSIZES - 1] = {64u << 10, 1u << 20, 16u << 20};
static const char *const size_names[HORA__MSIZES] = {"0-64KiB", "64KiB-1MiB", "1MiB-16MiB",
                                                     "16MiB-"};
/* Bus bandwidth buckets, bytes per second: 10 MB/s to 100 GB/s. */
static const double bw_le[HORA__MBW_BUCKETS - 1] = {1e7, 1e8, 2.5e8, 5e8, 1e9,
                                                    2.5e9, 5e9, 1e10, 2.5e10, 1e11};

static int metric_kind(int kind) {
  switch (kind) {
    case HORA_KIND_ALLREDUCE: return HORA__MKIND_ALLREDUCE;
    case HORA_KIND_BROADCAST: return HORA__MKIND_BROADCAST;
    case HORA_KIND_ALLGATHER:
    case HORA_KIND_ALLGATHERV: return HORA__MKIND_ALLGATHER;
    case HORA_KIND_REDUCESCATTER: return HORA__MKIND_REDUCESCATTER;
    case HORA_KIND_ALLTOALL: return HORA__MKIND_ALLTOALL;
    default: return -1;
  }
}

void hora__metrics_account(struct hora__runtime *rt, int kind, int dtype, uint64_t ops,
                           uint64_t bytes, uint64_t ns) {
  int k = metric_kind(kind);
  if (k < 0) {
    return;
  }
  atomic_fetch_add_explicit(&rt->stats.kind_bytes[k], bytes, memory_order_relaxed);
  if (dtype >= 0 && dtype < HORA__MDTYPES) {
    atomic_fetch_add_explicit(&rt->stats.kind_dtype_ops[k][dtype], ops, memory_order_relaxed);
  }
  int p = rt->size;
  if (p < 2 || bytes == 0) {
    return; /* no bus to measure */
  }
  /* Bus bytes and bandwidth as nccl-tests define them, from the bytes this
   * rank gave: what each link carries, comparable across rank counts. */
  double factor = k == HORA__MKIND_ALLREDUCE   ? 2.0 * (p - 1) / p
                  : k == HORA__MKIND_BROADCAST ? 1.0
                  : k == HORA__MKIND_ALLGATHER ? (double)(p - 1) /* p blocks of `bytes` */
                                               : (double)(p - 1) / p;
  atomic_fetch_add_explicit(&rt->stats.bus_bytes, (uint64_t)(factor * (double)bytes),
                            memory_order_relaxed);
  if (ns == 0) {
    return; /* an eager operation: its data came with the cycle, untimed */
  }
  double algbw = (double)bytes / ((double)ns * 1e-9);
  double busbw = algbw * factor;
  int s = 0;
  while (s < HORA__MSIZES - 1 && bytes > size_le[s]) {
    s++;
  }
  int b = 0;
  while (b < HORA__MBW_BUCKETS - 1 && busbw > bw_le[b]) {
    b++;
  }
  atomic_fetch_add_explicit(&rt->stats.busbw[k][s][b], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&rt->stats.busbw_sum[k][s], (uint64_t)busbw, memory_order_relaxed);
}

void hora__metrics_snapshot_take(struct hora__metrics_snapshot *s, struct hora__runtime *rt) {
  s->set_id = rt->set_id;
  for (int k = 0; k < HORA__MKINDS; k++) {
    s->kind_bytes[k] = atomic_load_explicit(&rt->stats.kind_bytes[k], memory_order_relaxed);
    for (int d = 0; d < HORA__MDTYPES; d++) {
      s->kind_dtype_ops[k][d] =
          atomic_load_explicit(&rt->stats.kind_dtype_ops[k][d], memory_order_relaxed);
    }
    for (int z = 0; z < HORA__MSIZES; z++) {
      s->busbw_sum[k][z] = atomic_load_explicit(&rt->stats.busbw_sum[k][z], memory_order_relaxed);
      for (int b = 0; b < HORA__MBW_BUCKETS; b++) {
        s->busbw[k][z][b] = atomic_load_explicit(&rt->stats.busbw[k][z][b], memory_order_relaxed);
      }
    }
  }
}

/* A family with one sample per runtime, from a hora_stats field. */
struct stat_family {
  const char *name, *type, *help;
  size_t offset;
  bool seconds; /* a double; else a uint64_t */
};
#define U64(field) offsetof(hora_stats, field), false
#define SEC(field) offsetof(hora_stats, field), true
static const struct stat_family stat_families[] = {
    {"hora_fused_batches_total", "counter", "Collectives that carried more than one tensor.",
     U64(fused_batches)},
    {"hora_fused_tensors_total", "counter", "Tensors that travelled in fused collectives.",
     U64(fused_tensors)},
    {"hora_cache_hits_total", "counter", "Requests negotiated through the response cache.",
     U64(cache_hits)},
    {"hora_cache_misses_total", "counter", "Requests negotiated in full (not in the response cache).",
     U64(cache_misses)},
    {"hora_negotiation_cycles_total", "counter",
     "Negotiation cycles: allreduces of cache bits between the ranks.", U64(cycles)},
    {"hora_sent_in_full_total", "counter", "Requests negotiated through rank 0.", U64(sent_in_full)},
    {"hora_eager_allreduces_total", "counter",
     "Allreduces whose data travelled with the negotiation cycle that scheduled them.",
     U64(eager_allreduces)},
    {"hora_eager_collectives_total", "counter",
     "Broadcasts, allgathers and reducescatters whose data travelled with the negotiation cycle "
     "that scheduled them.",
     U64(eager_collectives)},
    {"hora_negotiation_seconds_total", "counter",
     "Summed over operations: from submission to the start of its collective.",
     SEC(negotiate_seconds)},
    {"hora_collective_seconds_total", "counter", "Coordinator time spent in collectives.",
     SEC(communicate_seconds)},
    {"hora_fusion_copy_seconds_total", "counter",
     "Coordinator time packing and unpacking fusion buffers.", SEC(copy_seconds)},
    {"hora_staged_operations_total", "counter",
     "Operations waited for with hora_wait, whose stages hora_stage_seconds_total sums.",
     U64(staged_operations)},
};

static void label_set(char *lab, size_t n, int set_id, const char *more) {
  snprintf(lab, n, "process_set=\"%d\"%s%s", set_id, more && more[0] ? "," : "", more ? more : "");
}

void hora__metrics_render_runtimes(struct hora__metrics_writer *w,
                                   const struct hora__metrics_snapshot *snaps, int n,
                                   const hora_stats *shm) {
  char lab[256], more[160];
  hora__metrics_family(w, "hora_operations_total", "counter",
                       "Collectives completed (tensors; a fused collective counts each), by kind "
                       "and dtype (allgathervs count as allgather).");
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < HORA__MKINDS; k++) {
      for (int d = 0; d < HORA__MDTYPES; d++) {
        if (snaps[i].kind_dtype_ops[k][d]) {
          snprintf(more, sizeof(more), "kind=\"%s\",dtype=\"%s\"", kind_names[k],
                   hora_dtype_name((hora_dtype)d));
          label_set(lab, sizeof(lab), snaps[i].set_id, more);
          hora__metrics_sample_u64(w, "hora_operations_total", lab, snaps[i].kind_dtype_ops[k][d]);
        }
      }
    }
  }
  hora__metrics_family(w, "hora_operation_bytes_total", "counter",
                       "Bytes of the callers' buffers the collectives covered, by kind (what this "
                       "rank sends for allgather and alltoall).");
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < HORA__MKINDS; k++) {
      snprintf(more, sizeof(more), "kind=\"%s\"", kind_names[k]);
      label_set(lab, sizeof(lab), snaps[i].set_id, more);
      hora__metrics_sample_u64(w, "hora_operation_bytes_total", lab, snaps[i].kind_bytes[k]);
    }
  }
  for (size_t f = 0; f < HORA_ARRAY_SIZE(stat_families); f++) {
    const struct stat_family *sf = &stat_families[f];
    hora__metrics_family(w, sf->name, sf->type, sf->help);
    for (int i = 0; i < n; i++) {
      const char *base = (const char *)&snaps[i].stats + sf->offset;
      label_set(lab, sizeof(lab), snaps[i].set_id, NULL);
      if (sf->seconds) {
        double v;
        memcpy(&v, base, sizeof(v));
        hora__metrics_sample(w, sf->name, lab, v);
      } else {
        uint64_t v;
        memcpy(&v, base, sizeof(v));
        hora__metrics_sample_u64(w, sf->name, lab, v);
      }
    }
  }
  static const char *const stages[6] = {"submit", "handoff", "negotiate", "run", "complete", "wake"};
  hora__metrics_family(w, "hora_stage_seconds_total", "counter",
                       "Where waited-for operations' time went, summed: in the submitting call, "
                       "queued for the coordinator, negotiation, the collective, until marked "
                       "complete, until the waiting caller returned.");
  for (int i = 0; i < n; i++) {
    const hora_stats *s = &snaps[i].stats;
    const double v[6] = {s->stage_submit_seconds, s->stage_handoff_seconds,
                         s->stage_negotiate_seconds, s->stage_run_seconds,
                         s->stage_complete_seconds, s->stage_wake_seconds};
    for (int j = 0; j < 6; j++) {
      snprintf(more, sizeof(more), "stage=\"%s\"", stages[j]);
      label_set(lab, sizeof(lab), snaps[i].set_id, more);
      hora__metrics_sample(w, "hora_stage_seconds_total", lab, v[j]);
    }
  }
  hora__metrics_family(w, "hora_bus_bandwidth_bytes_per_second", "histogram",
                       "Bus bandwidth of each collective (nccl-tests' definition: the algorithm "
                       "bandwidth times 2(p-1)/p for allreduce), by kind and size.");
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < HORA__MKINDS; k++) {
      for (int z = 0; z < HORA__MSIZES; z++) {
        uint64_t any = 0;
        for (int b = 0; b < HORA__MBW_BUCKETS; b++) {
          any += snaps[i].busbw[k][z][b];
        }
        if (!any) {
          continue;
        }
        snprintf(more, sizeof(more), "kind=\"%s\",size=\"%s\"", kind_names[k], size_names[z]);
        label_set(lab, sizeof(lab), snaps[i].set_id, more);
        hora__metrics_histogram(w, "hora_bus_bandwidth_bytes_per_second", lab, bw_le,
                                snaps[i].busbw[k][z], HORA__MBW_BUCKETS - 1,
                                (double)snaps[i].busbw_sum[k][z]);
      }
    }
  }
  if (shm) {
    hora__metrics_family(w, "hora_shm_allreduce_bytes_total", "counter",
                         "Allreduce bytes moved between the host's ranks, by path: direct (loads "
                         "and stores between hora_mem_alloc blocks), kernel (process_vm_readv), "
                         "staged (through the shared segment).");
    const char *paths[3] = {"direct", "kernel", "staged"};
    const uint64_t v[3] = {shm->direct_bytes, shm->kernel_bytes, shm->staged_bytes};
    for (int j = 0; j < 3; j++) {
      snprintf(lab, sizeof(lab), "path=\"%s\"", paths[j]);
      hora__metrics_sample_u64(w, "hora_shm_allreduce_bytes_total", lab, v[j]);
    }
  }
}
