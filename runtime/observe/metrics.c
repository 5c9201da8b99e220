/* The metrics' text: the writer, the sources, and the process's own
 * families (read from /proc, and NVML where a CUDA build finds it). */
#include "runtime/observe/metrics.h"

#include <dirent.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"

/* ---- the writer ------------------------------------------------------------ */

static void HORA_PRINTF(2, 3) put(struct hora__metrics_writer *w, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  if (n < 0) {
    w->text.failed = true;
  } else if ((size_t)n < sizeof(line)) {
    hora__wbuf_put(&w->text, line, (size_t)n);
  } else { /* a long line: formatted again at its size */
    char *big = malloc((size_t)n + 1);
    if (!big) {
      w->text.failed = true;
      return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    hora__wbuf_put(&w->text, big, (size_t)n);
    free(big);
  }
}

void hora__metrics_family(struct hora__metrics_writer *w, const char *name, const char *type,
                          const char *help) {
  put(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void labels_open(struct hora__metrics_writer *w, const char *name, const char *labels) {
  put(w, "%s{%s%s%s}", name, w->common, labels && labels[0] && w->common[0] ? "," : "",
      labels ? labels : "");
}

void hora__metrics_sample(struct hora__metrics_writer *w, const char *name, const char *labels,
                          double value) {
  labels_open(w, name, labels);
  /* The shortest form that reads back as the same double. */
  char num[40];
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(num, sizeof(num), "%.*g", prec, value);
    if (strtod(num, NULL) == value) {
      break;
    }
  }
  put(w, " %s\n", num);
}

void hora__metrics_sample_u64(struct hora__metrics_writer *w, const char *name, const char *labels,
                              uint64_t value) {
  labels_open(w, name, labels);
  put(w, " %" PRIu64 "\n", value);
}

void hora__metrics_histogram(struct hora__metrics_writer *w, const char *name, const char *labels,
                             const double *le, const uint64_t *counts, int n, double sum) {
  char bname[160], lab[512];
  snprintf(bname, sizeof(bname), "%s_bucket", name);
  const char *sep = labels && labels[0] ? "," : "";
  uint64_t total = 0;
  for (int i = 0; i <= n; i++) {
    total += counts[i];
    if (i < n) {
      snprintf(lab, sizeof(lab), "%s%sle=\"%.17g\"", labels ? labels : "", sep, le[i]);
    } else {
      snprintf(lab, sizeof(lab), "%s%sle=\"+Inf\"", labels ? labels : "", sep);
    }
    hora__metrics_sample_u64(w, bname, lab, total);
  }
  snprintf(bname, sizeof(bname), "%s_sum", name);
  hora__metrics_sample(w, bname, labels, sum);
  snprintf(bname, sizeof(bname), "%s_count", name);
  hora__metrics_sample_u64(w, bname, labels, total);
}

void hora__metrics_escape(char *out, size_t n, const char *value) {
  size_t o = 0;
  for (const char *p = value; *p && o + 3 < n; p++) {
    if (*p == '\\' || *p == '"') {
      out[o++] = '\\';
      out[o++] = *p;
    } else if (*p == '\n') {
      out[o++] = '\\';
      out[o++] = 'n';
    } else {
      out[o++] = *p;
    }
  }
  if (n) {
    out[o] = '\0';
  }
}

/* ---- sources and identity ------------------------------------------------------ */

static pthread_mutex_t sources_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  hora__metrics_source_fn fn;
  void *arg;
} sources[16];
static int nsources;
/* protected by sources_mu */
static int id_rank = -1, id_size = -1, id_local_rank = -1;

int hora__metrics_add_source(hora__metrics_source_fn fn, void *arg) {
  pthread_mutex_lock(&sources_mu);
  int rc = HORA_SUCCESS;
  if (nsources == (int)HORA_ARRAY_SIZE(sources)) {
    rc = hora__error(HORA_ERR_NO_MEMORY, "metrics: too many sources");
  } else {
    sources[nsources].fn = fn;
    sources[nsources++].arg = arg;
  }
  pthread_mutex_unlock(&sources_mu);
  return rc;
}

void hora__metrics_remove_source(hora__metrics_source_fn fn, void *arg) {
  pthread_mutex_lock(&sources_mu);
  for (int i = 0; i < nsources; i++) {
    if (sources[i].fn == fn && sources[i].arg == arg) {
      memmove(&sources[i], &sources[i + 1], (size_t)(nsources - i - 1) * sizeof(sources[0]));
      nsources--;
      break;
    }
  }
  pthread_mutex_unlock(&sources_mu);
}

void hora__metrics_set_identity(int rank, int size, int local_rank) {
  pthread_mutex_lock(&sources_mu);
  id_rank = rank;
  id_size = size;
  id_local_rank = local_rank;
  pthread_mutex_unlock(&sources_mu);
}

static atomic_uint_fast64_t events[HORA__EV_COUNT];

void hora__metrics_event(enum hora__metrics_event ev) { atomic_fetch_add(&events[ev], 1); }

/* ---- the process's families ------------------------------------------------------ */

static void process_families(struct hora__metrics_writer *w) {
  long tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
  FILE *f = fopen("/proc/self/stat", "r");
  char line[1024];
  if (f && fgets(line, sizeof(line), f)) {
    /* utime and stime: fields 14 and 15, counted after the command's ')'. */
    const char *p = strrchr(line, ')');
    unsigned long long ut = 0, st = 0;
    if (p && tick > 0 &&
        sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2) {
      hora__metrics_family(w, "hora_process_cpu_seconds_total", "counter",
                           "CPU time of the process (user and system, all threads).");
      hora__metrics_sample(w, "hora_process_cpu_seconds_total", NULL, (double)(ut + st) / (double)tick);
    }
  }
  if (f) {
    fclose(f);
  }
  f = fopen("/proc/self/statm", "r");
  unsigned long long size = 0, resident = 0;
  if (f && fscanf(f, "%llu %llu", &size, &resident) == 2 && page > 0) {
    hora__metrics_family(w, "hora_process_resident_memory_bytes", "gauge",
                         "Resident memory of the process.");
    hora__metrics_sample(w, "hora_process_resident_memory_bytes", NULL,
                         (double)resident * (double)page);
    hora__metrics_family(w, "hora_process_virtual_memory_bytes", "gauge",
                         "Virtual memory of the process.");
    hora__metrics_sample(w, "hora_process_virtual_memory_bytes", NULL, (double)size * (double)page);
  }
  if (f) {
    fclose(f);
  }
  DIR *d = opendir("/proc/self/fd");
  if (d) {
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
      n += e->d_name[0] != '.';
    }
    closedir(d);
    hora__metrics_family(w, "hora_process_open_fds", "gauge",
                         "File descriptors the process has open.");
    hora__metrics_sample(w, "hora_process_open_fds", NULL, n - 1); /* less opendir's own */
  }
}

/* The host's interfaces, from /proc/net/dev (what hora moves between hosts
 * over TCP shows there; shared memory does not). */
static void network_families(struct hora__metrics_writer *w) {
  FILE *f = fopen("/proc/net/dev", "r");
  if (!f) {
    return;
  }
  char line[512], names[32][32];
  unsigned long long rx[32], tx[32];
  int n = 0;
  while (n < 32 && fgets(line, sizeof(line), f)) {
    char *colon = strchr(line, ':');
    if (!colon) {
      continue; /* the two header lines */
    }
    *colon = '\0';
    const char *name = line + strspn(line, " ");
    if (sscanf(colon + 1, "%llu %*u %*u %*u %*u %*u %*u %*u %llu", &rx[n], &tx[n]) == 2) {
      hora__metrics_escape(names[n], sizeof(names[n]), name);
      n++;
    }
  }
  fclose(f);
  static const char *const fam[2][2] = {
      {"hora_network_receive_bytes_total", "Bytes the host received on the interface (/proc/net/dev)."},
      {"hora_network_transmit_bytes_total", "Bytes the host sent on the interface (/proc/net/dev)."}};
  for (int k = 0; k < 2 && n > 0; k++) {
    hora__metrics_family(w, fam[k][0], "counter", fam[k][1]);
    for (int i = 0; i < n; i++) {
      char lab[64];
      snprintf(lab, sizeof(lab), "interface=\"%s\"", names[i]);
      hora__metrics_sample_u64(w, fam[k][0], lab, k ? tx[i] : rx[i]);
    }
  }
}

#if HORA_HAVE_CUDA
/* NVML, loaded at run time: no GPU families where the driver is absent. */
typedef struct {
  unsigned int gpu, memory;
} nvml_util;
typedef struct {
  unsigned long long total, free, used;
} nvml_mem;
static struct {
  bool tried, ok;
  int (*device_count)(unsigned int *);
  int (*by_index)(unsigned int, void **);
  int (*by_uuid)(const char *, void **);
  int (*util)(void *, nvml_util *);
  int (*mem)(void *, nvml_mem *);
} nvml;

static void nvml_load(void) {
  nvml.tried = true;
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    return;
  }
  int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
  nvml.device_count = (int (*)(unsigned int *))dlsym(lib, "nvmlDeviceGetCount_v2");
  nvml.by_index = (int (*)(unsigned int, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
  nvml.by_uuid = (int (*)(const char *, void **))dlsym(lib, "nvmlDeviceGetHandleByUUID");
  nvml.util = (int (*)(void *, nvml_util *))dlsym(lib, "nvmlDeviceGetUtilizationRates");
  nvml.mem = (int (*)(void *, nvml_mem *))dlsym(lib, "nvmlDeviceGetMemoryInfo");
  nvml.ok = init && nvml.device_count && nvml.by_index && nvml.by_uuid && nvml.util && nvml.mem &&
            init() == 0;
  if (!nvml.ok) {
    dlclose(lib);
  }
}

/* This process's GPU as CUDA numbers it (HORA_GPU, else the local rank
 * modulo the visible devices), through CUDA_VISIBLE_DEVICES to NVML's. */
static void *nvml_device(int local_rank, char *label, size_t n) {
  unsigned int count = 0;
  if (nvml.device_count(&count) != 0 || count == 0) {
    return NULL;
  }
  char vis[256] = "";
  const char *env = getenv("CUDA_VISIBLE_DEVICES");
  hora__strlcpy(vis, env ? env : "", sizeof(vis));
  const char *list[64];
  int nvis = 0;
  for (char *save = NULL, *t = strtok_r(vis, ",", &save); t && nvis < 64;
       t = strtok_r(NULL, ",", &save)) {
    list[nvis++] = t;
  }
  int visible = env ? nvis : (int)count;
  if (visible == 0) {
    return NULL;
  }
  int dev = hora__params.GPU >= 0 ? (int)hora__params.GPU : HORA_MAX(local_rank, 0) % visible;
  void *h = NULL;
  if (!env) {
    snprintf(label, n, "%d", dev);
    return dev < (int)count && nvml.by_index((unsigned int)dev, &h) == 0 ? h : NULL;
  }
  if (dev >= nvis) {
    return NULL;
  }
  char *end = NULL;
  long idx = strtol(list[dev], &end, 10);
  hora__metrics_escape(label, n, list[dev]);
  int rc = end != list[dev] && *end == '\0' ? (idx >= 0 && idx < (long)count
                                                   ? nvml.by_index((unsigned int)idx, &h) : -1)
                                            : nvml.by_uuid(list[dev], &h);
  return rc == 0 ? h : NULL;
}

static void gpu_families(struct hora__metrics_writer *w, int local_rank) {
  if (!nvml.tried) {
    nvml_load();
  }
  char id[80], lab[100];
  void *h = nvml.ok ? nvml_device(local_rank, id, sizeof(id)) : NULL;
  nvml_util u;
  nvml_mem m;
  if (!h || nvml.util(h, &u) != 0 || nvml.mem(h, &m) != 0) {
    return;
  }
  snprintf(lab, sizeof(lab), "gpu=\"%s\"", id);
  hora__metrics_family(w, "hora_gpu_utilization_ratio", "gauge",
                       "Share of the last sample period the GPU ran kernels (NVML).");
  hora__metrics_sample(w, "hora_gpu_utilization_ratio", lab, u.gpu / 100.0);
  hora__metrics_family(w, "hora_gpu_memory_used_bytes", "gauge", "GPU memory in use (NVML).");
  hora__metrics_sample(w, "hora_gpu_memory_used_bytes", lab, (double)m.used);
  hora__metrics_family(w, "hora_gpu_memory_total_bytes", "gauge", "GPU memory in all (NVML).");
  hora__metrics_sample(w, "hora_gpu_memory_total_bytes", lab, (double)m.total);
}
#endif

static void event_families(struct hora__metrics_writer *w) {
  static const char *const fam[HORA__EV_COUNT][2] = {
      {"hora_stall_warnings_total",
       "Warnings of the stall inspector (rank 0): ranks that never joined a negotiation cycle."},
      {"hora_peer_losses_total", "Runtimes of this process that failed with a lost peer."},
      {"hora_elastic_resets_total", "Membership resets this process completed (hora_elastic_reset)."}};
  for (int i = 0; i < HORA__EV_COUNT; i++) {
    hora__metrics_family(w, fam[i][0], "counter", fam[i][1]);
    hora__metrics_sample_u64(w, fam[i][0], NULL, atomic_load(&events[i]));
  }
}

void hora__metrics_render(struct hora__metrics_writer *w) {
  pthread_mutex_lock(&sources_mu);
  char host[256], lab[400];
  hora__metrics_escape(host, sizeof(host), hora__log_hostname());
  snprintf(w->common, sizeof(w->common), "rank=\"%d\",host=\"%s\"", id_rank, host);
  hora__metrics_family(w, "hora_info", "gauge",
                       "Always 1: the process's place in the job and the build, as labels.");
  snprintf(lab, sizeof(lab), "size=\"%d\",local_rank=\"%d\",version=\"%s\",cuda=\"%d\"", id_size,
           id_local_rank, PACKAGE_VERSION, HORA_HAVE_CUDA);
  hora__metrics_sample(w, "hora_info", lab, 1);
  process_families(w);
  network_families(w);
#if HORA_HAVE_CUDA
  gpu_families(w, id_local_rank);
#endif
  event_families(w);
  for (int i = 0; i < nsources; i++) {
    sources[i].fn(w, sources[i].arg);
  }
  pthread_mutex_unlock(&sources_mu);
}
