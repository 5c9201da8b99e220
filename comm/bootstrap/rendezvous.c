/* Choosing the rendezvous from the environment, the job secret without
 * MPI, and what every rendezvous offers on top of its allgather. The
 * single kind is here; tcp (also env and slurm) is rendezvous_tcp.c, mpi
 * rendezvous_mpi.c (built with MPI only). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/bootstrap/rendezvous.h"

const char *hora__rdv_kind_name(enum hora__rdv_kind kind) {
  switch (kind) {
    case HORA_RDV_MPI: return "mpi";
    case HORA_RDV_TCP: return "tcp";
    case HORA_RDV_ENV: return "env";
    case HORA_RDV_SLURM: return "slurm";
    default: return "single";
  }
}

/* ---- the choice --------------------------------------------------------------- */

static bool set(const char *var) {
  const char *v = getenv(var);
  return v && v[0];
}

/* A launcher's integer variable: -1 when absent, an error when not a number
 * in [lo, hi]. */
static int read_int(const char *var, long lo, long hi, int *out) {
  const char *v = getenv(var);
  *out = -1;
  if (!v || !v[0]) {
    return HORA_SUCCESS;
  }
  char *end = NULL;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s=%s is not an integer from %ld to %ld", var, v, lo,
                       hi);
  }
  *out = (int)x;
  return HORA_SUCCESS;
}

bool hora__rdv_mpi_launched(const char **var) {
  /* Open MPI's, MPICH/Hydra's and PMIx's (also srun --mpi=pmix). */
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK",
                                     "MPI_LOCALNRANKS"};
  for (size_t i = 0; i < HORA_ARRAY_SIZE(vars); i++) {
    if (set(vars[i])) {
      *var = vars[i];
      return true;
    }
  }
  return false;
}

int hora__slurm_first_node(const char *list, char *out, size_t n) {
  /* The first name, up to a comma outside brackets; a bracket's first range
   * start replaces the bracket: "h[01-04,07]x" -> "h01x". */
  size_t o = 0;
  const char *p = list;
  while (*p && *p != ',' && o + 1 < n) {
    if (*p == '[') {
      p++;
      while (*p && isdigit((unsigned char)*p) && o + 1 < n) {
        out[o++] = *p++;
      }
      while (*p && *p != ']') {
        p++;
      }
      if (*p != ']') {
        return hora__error(HORA_ERR_INVALID_ARG, "Slurm node list \"%s\" has an unclosed '['",
                           list);
      }
      p++;
      continue;
    }
    out[o++] = *p++;
  }
  out[o] = '\0';
  if (o == 0) {
    return hora__error(HORA_ERR_INVALID_ARG, "Slurm node list \"%s\" names no node", list);
  }
  return HORA_SUCCESS;
}

static int split_host_port(const char *var, const char *v, char *host, size_t n, int *port) {
  const char *colon = strrchr(v, ':');
  char *end = NULL;
  long p = colon ? strtol(colon + 1, &end, 10) : -1;
  if (!colon || colon == v || (size_t)(colon - v) >= n || !end || *end || p < 1 || p > 65535) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s=%s is not host:port (a port from 1 to 65535)",
                       var, v);
  }
  memcpy(host, v, (size_t)(colon - v));
  host[colon - v] = '\0';
  *port = (int)p;
  return HORA_SUCCESS;
}

static int choose_env(struct hora__rdv_choice *c) {
  c->kind = HORA_RDV_ENV;
  hora__strlcpy(c->rank_var, "RANK", sizeof(c->rank_var));
  hora__strlcpy(c->size_var, "WORLD_SIZE", sizeof(c->size_var));
  const char *missing = !set("MASTER_ADDR") ? "MASTER_ADDR"
                        : !set("MASTER_PORT") ? "MASTER_PORT"
                        : !set("RANK")        ? "RANK"
                        : !set("WORLD_SIZE")  ? "WORLD_SIZE"
                                              : NULL;
  if (missing) {
    return hora__error(HORA_ERR_INVALID_ARG, "HORA_BOOTSTRAP=env needs torchrun's variables, and %s "
                       "is not set", missing);
  }
  HORA_CHECK(read_int("WORLD_SIZE", 1, 1 << 24, &c->size));
  HORA_CHECK(read_int("RANK", INT_MIN, INT_MAX, &c->rank));
  HORA_CHECK(read_int("MASTER_PORT", 1, 65535, &c->port));
  hora__strlcpy(c->host, getenv("MASTER_ADDR"), sizeof(c->host));
  snprintf(c->where, sizeof(c->where), "MASTER_ADDR=%s MASTER_PORT=%d", c->host, c->port);
  return HORA_SUCCESS;
}

static int choose_slurm(struct hora__rdv_choice *c) {
  c->kind = HORA_RDV_SLURM;
  hora__strlcpy(c->rank_var, "SLURM_PROCID", sizeof(c->rank_var));
  hora__strlcpy(c->size_var, "SLURM_NTASKS", sizeof(c->size_var));
  /* An elastic job's later steps must find the first step's rendezvous:
   * the allocation's first node, a port of the job's. */
  bool elastic = hora__params.ELASTIC;
  const char *nodes = elastic ? NULL : getenv("SLURM_STEP_NODELIST");
  const char *nodes_var = "SLURM_STEP_NODELIST";
  if (!nodes || !nodes[0]) {
    nodes = getenv("SLURM_JOB_NODELIST");
    nodes_var = "SLURM_JOB_NODELIST";
  }
  if (!set("SLURM_PROCID") || !set("SLURM_NTASKS") || !nodes || !nodes[0]) {
    return hora__error(HORA_ERR_INVALID_ARG, "HORA_BOOTSTRAP=slurm needs a job step's variables "
                       "(SLURM_PROCID, SLURM_NTASKS, SLURM_STEP_NODELIST): start the processes "
                       "with srun");
  }
  HORA_CHECK(read_int("SLURM_NTASKS", 1, 1 << 24, &c->size));
  HORA_CHECK(read_int("SLURM_PROCID", INT_MIN, INT_MAX, &c->rank));
  HORA_CHECK(hora__slurm_first_node(nodes, c->host, sizeof(c->host)));
  c->port = (int)hora__params.RENDEZVOUS_PORT;
  const char *port_from = "HORA_RENDEZVOUS_PORT";
  if (c->port == 0) {
    /* Below Linux's ephemeral range, and apart for each step of a job. */
    int job = 0, step = 0;
    HORA_CHECK(read_int("SLURM_JOB_ID", 0, INT_MAX, &job));
    HORA_CHECK(read_int("SLURM_STEP_ID", 0, INT_MAX, &step));
    step = elastic ? 0 : step;
    c->port = 12000 + (int)(((unsigned)HORA_MAX(job, 0) * 97u + (unsigned)HORA_MAX(step, 0)) % 20000u);
    port_from = elastic ? "SLURM_JOB_ID (elastic: every step of the job)" : "SLURM_JOB_ID and SLURM_STEP_ID";
  } else if (c->port < 1 || c->port > 65535) {
    return hora__error(HORA_ERR_INVALID_ARG, "HORA_RENDEZVOUS_PORT=%d is not a port (1 to 65535)",
                       c->port);
  }
  snprintf(c->where, sizeof(c->where), "%s:%d (the first node of %s; port from %s)", c->host,
           c->port, nodes_var, port_from);
  return HORA_SUCCESS;
}

static int choose_tcp(struct hora__rdv_choice *c) {
  c->kind = HORA_RDV_TCP;
  hora__strlcpy(c->rank_var, "HORA_RANK", sizeof(c->rank_var));
  hora__strlcpy(c->size_var, "HORA_SIZE", sizeof(c->size_var));
  const char *v = hora__params.RENDEZVOUS;
  if (!v[0]) {
    return hora__error(HORA_ERR_INVALID_ARG, "HORA_BOOTSTRAP=tcp needs HORA_RENDEZVOUS=host:port");
  }
  HORA_CHECK(split_host_port("HORA_RENDEZVOUS", v, c->host, sizeof(c->host), &c->port));
  c->rank = (int)HORA_MAX(HORA_MIN(hora__params.RANK, INT_MAX), INT_MIN);
  c->size = (int)HORA_MAX(HORA_MIN(hora__params.SIZE, INT_MAX), -1);
  if (c->size < 1 && hora__params.RANK == -1 && hora__params.ELASTIC) {
    c->size = -1; /* a newcomer learns the size when it is admitted */
  } else if (c->size < 1) {
    return hora__error(HORA_ERR_INVALID_ARG, "HORA_RENDEZVOUS is set, but HORA_SIZE is %s: set it "
                       "to the number of processes", c->size == -1 ? "not set" : "below 1");
  }
  if (hora__params.RANK == -1 && hora__params.ELASTIC) {
    c->rank = -1; /* a newcomer to a running elastic job: it is given its rank */
  } else if (hora__params.RANK == -1) {
    return hora__error(HORA_ERR_INVALID_ARG, "HORA_RENDEZVOUS is set, but HORA_RANK is not: set "
                       "it to this process's rank (0 to %d)", c->size - 1);
  }
  snprintf(c->where, sizeof(c->where), "HORA_RENDEZVOUS=%s", v);
  return HORA_SUCCESS;
}

int hora__rdv_choose(bool mpi_running, struct hora__rdv_choice *c) {
  memset(c, 0, sizeof(*c));
  c->rank = c->size = -1;
  const char *want = hora__params.BOOTSTRAP;
  const char *var = NULL;
  int rc = HORA_SUCCESS;
  if (strcmp(want, "mpi") == 0) {
    c->kind = HORA_RDV_MPI;
    snprintf(c->why, sizeof(c->why), "HORA_BOOTSTRAP=mpi");
  } else if (strcmp(want, "env") == 0) {
    rc = choose_env(c);
    snprintf(c->why, sizeof(c->why), "HORA_BOOTSTRAP=env");
  } else if (strcmp(want, "slurm") == 0) {
    rc = choose_slurm(c);
    snprintf(c->why, sizeof(c->why), "HORA_BOOTSTRAP=slurm");
  } else if (strcmp(want, "tcp") == 0) {
    rc = choose_tcp(c);
    snprintf(c->why, sizeof(c->why), "HORA_BOOTSTRAP=tcp");
  } else if (mpi_running) {
    c->kind = HORA_RDV_MPI;
    snprintf(c->why, sizeof(c->why), "the program has initialised MPI");
  } else if (hora__rdv_mpi_launched(&var)) {
    c->kind = HORA_RDV_MPI;
    snprintf(c->why, sizeof(c->why), "an MPI launcher started this process (%s is set)", var);
  } else if (set("MASTER_ADDR") && set("RANK") && set("WORLD_SIZE")) {
    rc = choose_env(c);
    snprintf(c->why, sizeof(c->why), "torchrun's variables are set (MASTER_ADDR, RANK, WORLD_SIZE)");
  } else if (set("SLURM_PROCID") && set("SLURM_NTASKS") && set("SLURM_STEP_ID")) {
    rc = choose_slurm(c);
    snprintf(c->why, sizeof(c->why), "a Slurm job step started this process (SLURM_PROCID, "
             "SLURM_NTASKS, SLURM_STEP_ID)");
  } else if (hora__params.RENDEZVOUS[0]) {
    rc = choose_tcp(c);
    snprintf(c->why, sizeof(c->why), "HORA_RENDEZVOUS is set");
  } else {
    c->kind = HORA_RDV_SINGLE;
    c->rank = 0;
    c->size = 1;
    snprintf(c->why, sizeof(c->why), "no launcher's variables are set: one process");
  }
  if (rc == HORA_SUCCESS && c->kind == HORA_RDV_MPI && !HORA_HAVE_MPI) {
    /* Running as single processes instead would look like a job of N
     * independent ranks: each trains alone and nothing says so. */
    return hora__error(HORA_ERR_NOT_SUPPORTED,
                       "%s, but this libhora was built without MPI (configure "
                       "--without-mpi): start the job with torchrun's variables, srun --mpi=none "
                       "or HORA_RENDEZVOUS",
                       c->why);
  }
  if (rc == HORA_SUCCESS && c->kind != HORA_RDV_MPI && c->kind != HORA_RDV_SINGLE) {
    rc = hora__rdv_load_secret(c);
  }
  return rc;
}

/* ---- the secret --------------------------------------------------------------- */

static void hash_secret(struct hora__rdv_choice *c, const void *bytes, size_t n, const char *from) {
  /* Keyed material of any length, made into the key size; the file's
   * bytes themselves never leave this process. */
  SHA256(bytes, n, c->secret);
  c->has_secret = true;
  hora__strlcpy(c->secret_from, from, sizeof(c->secret_from));
}

int hora__rdv_load_secret(struct hora__rdv_choice *c) {
  const char *path = hora__params.SECRET_FILE;
  if (path[0]) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
      return hora__error_errno(HORA_ERR_INVALID_ARG, "HORA_SECRET_FILE=%s cannot be opened", path);
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      return hora__error(HORA_ERR_INVALID_ARG, "HORA_SECRET_FILE=%s is not a regular file", path);
    }
    if ((st.st_mode & 077) != 0 || st.st_uid != geteuid()) {
      close(fd);
      return hora__error(HORA_ERR_INVALID_ARG,
                         "HORA_SECRET_FILE=%s is %s (mode %04o, owner uid %d): it must belong to "
                         "this user (uid %d) and be readable by nobody else (chmod 600)",
                         path, st.st_uid != geteuid() ? "another user's" : "readable by others",
                         (unsigned)(st.st_mode & 07777), (int)st.st_uid, (int)geteuid());
    }
    uint8_t buf[4096];
    ssize_t n = read(fd, buf, sizeof(buf));
    close(fd);
    if (n <= 0) {
      return hora__error(HORA_ERR_INVALID_ARG, "HORA_SECRET_FILE=%s is empty or unreadable", path);
    }
    hash_secret(c, buf, (size_t)n, "HORA_SECRET_FILE");
    OPENSSL_cleanse(buf, sizeof(buf));
    return HORA_SUCCESS;
  }
  const char *s = hora__params.SECRET;
  if (s[0]) {
    hash_secret(c, s, strlen(s), "HORA_SECRET");
  }
  return HORA_SUCCESS;
}

/* ---- what every rendezvous offers ------------------------------------------ */

int hora__rdv_allgather(struct hora__rdv *r, const void *mine, size_t len, void *all) {
  return r->ops->allgather(r, mine, len, all);
}

/* Every rank's int32, as sent: *all is the caller's to free. */
static int gather_ints(struct hora__rdv *r, int mine, int32_t **all) {
  int32_t v = mine;
  *all = hora__calloc((size_t)r->size, sizeof(**all));
  if (!*all) {
    return HORA_ERR_NO_MEMORY;
  }
  int rc = hora__rdv_allgather(r, &v, sizeof(v), *all);
  if (rc != HORA_SUCCESS) {
    free(*all);
    *all = NULL;
  }
  return rc;
}

int hora__rdv_agree(struct hora__rdv *r, int rc, const char *step) {
  /* A rank sends INT_MAX, or its own failure as rank * CODES + code. */
  enum { CODES = 64 };
  int code = rc > 0 && rc < HORA_RESULT_COUNT_ ? rc : HORA_ERR_SYSTEM;
  int32_t *all = NULL;
  int err = gather_ints(r, rc != HORA_SUCCESS ? r->rank * CODES + code : INT_MAX, &all);
  if (rc != HORA_SUCCESS || err != HORA_SUCCESS) {
    free(all);
    return rc != HORA_SUCCESS ? rc : err;
  }
  int first = -1;
  for (int q = 0; q < r->size; q++) {
    int32_t v = all[q];
    if (v == INT_MAX) {
      continue;
    }
    if (v < 0 || v / CODES != q || v % CODES == 0 || v % CODES >= HORA_RESULT_COUNT_) {
      err = hora__error(HORA_ERR_PROTOCOL,
                        "bootstrap (%s): rank %d sent %d as whether it failed (%d, or its own "
                        "rank * %d + an error code, expected)", step, q, (int)v, INT_MAX, CODES);
      free(all);
      return err;
    }
    first = first < 0 ? q : first;
  }
  if (first >= 0) {
    err = hora__error(all[first] % CODES,
                      "bootstrap (%s) failed on rank %d (its hora_init error says why)", step,
                      first);
  }
  free(all);
  return err;
}

int hora__rdv_min(struct hora__rdv *r, int mine, int lo, int hi, const char *what, int *min) {
  int32_t *all = NULL;
  int rc = gather_ints(r, mine, &all);
  for (int q = 0; rc == HORA_SUCCESS && q < r->size; q++) {
    if (all[q] < lo || all[q] > hi) {
      rc = hora__error(HORA_ERR_PROTOCOL, "rank %d sent %d as %s (%d to %d expected)", q,
                       (int)all[q], what, lo, hi);
    } else {
      *min = q == 0 ? all[q] : HORA_MIN(*min, all[q]);
    }
  }
  free(all);
  return rc;
}

int hora__rdv_bcast(struct hora__rdv *r, int root, void *buf, size_t len) {
  if (r->ops->bcast) {
    return r->ops->bcast(r, root, buf, len);
  }
  uint8_t *all = hora__calloc((size_t)r->size, len ? len : 1);
  if (!all) {
    return HORA_ERR_NO_MEMORY;
  }
  int rc = hora__rdv_allgather(r, buf, len, all);
  if (rc == HORA_SUCCESS && r->rank != root) {
    memcpy(buf, all + (size_t)root * len, len);
  }
  free(all);
  return rc;
}

void hora__rdv_close(struct hora__rdv *r) {
  if (r) {
    r->ops->close(r);
  }
}

/* ---- one process ---------------------------------------------------------------- */

static int single_allgather(struct hora__rdv *r, const void *mine, size_t len, void *all) {
  (void)r;
  memcpy(all, mine, len);
  return HORA_SUCCESS;
}

static void plain_close(struct hora__rdv *r) {
  OPENSSL_cleanse(r->key, sizeof(r->key));
  free(r);
}

static const struct hora__rdv_ops single_ops = {.allgather = single_allgather,
                                                .close = plain_close};

int hora__rdv_open_single(struct hora__rdv **out) {
  struct hora__rdv *r = hora__calloc(1, sizeof(*r));
  if (!r) {
    return HORA_ERR_NO_MEMORY;
  }
  r->ops = &single_ops;
  r->kind = HORA_RDV_SINGLE;
  r->rank = 0;
  r->size = 1;
  *out = r;
  return HORA_SUCCESS;
}

/* ---- opening the one chosen ------------------------------------------------------ */

int hora__rdv_open(const struct hora__rdv_choice *c, double timeout_s, struct hora__rdv **out) {
  if (c->kind == HORA_RDV_MPI) {
    return hora__error(HORA_ERR_INVALID_USAGE,
                       "the mpi rendezvous is opened over a communicator (hora__rdv_open_mpi)");
  }
  if (c->kind == HORA_RDV_SINGLE) {
    return hora__rdv_open_single(out);
  }
  struct hora__rdv_tcp_spec spec = {
      .host = c->host, .port = c->port, .rank = c->rank, .size = c->size,
      .key = c->has_secret ? c->secret : NULL, .listen_fd = -1, .timeout_s = timeout_s,
      .where = c->where, .rank_var = c->rank_var, .size_var = c->size_var};
  if (!c->has_secret && c->rank == 0) {
    HORA_WARN("no HORA_SECRET_FILE or HORA_SECRET: until start-up is over, any process that can "
              "reach %s may join this job as one of its ranks", c->where);
  }
  int rc = hora__rdv_open_tcp(&spec, out);
  if (rc == HORA_SUCCESS) {
    (*out)->kind = c->kind;
  }
  return rc;
}
