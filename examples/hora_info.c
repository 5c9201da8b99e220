/* hora-info: what this build of hora has and how it is configured, in the
 * spirit of ompi_info. `--settings-md` prints the settings table that the
 * manual's Settings page carries (docs/settings.md); `--horovod` the
 * Horovod variables hora ignores; `--elastic` how to launch an elastic job
 * here; `--calibrate`, run as a job, measures the cost model's constants. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "hora.h"
#include "base/params.h"
#include "comm/bootstrap/rendezvous.h"
#include "comm/coll/collectives.h"
#include "info_model.h"
#include "runtime/runtime.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: hora-info [--settings-md | --settings | --horovod | --bootstrap | --elastic |\n"
          "                  --algorithms | --model [OPTIONS] | --calibrate [--save FILE] |\n"
          "                  --help]\n"
          "  (no option)     version, optional components, start-up, current settings\n"
          "  --bootstrap     how hora_init would start in this environment, and why\n"
          "  --elastic       how to launch an elastic job (HORA_ELASTIC=1) with this launcher so\n"
          "                  that a lost process leaves the others running, and how a process\n"
          "                  started later joins it; every launcher's lines when none is set\n"
          "  --settings      every HORA_* setting with its current value\n"
          "  --settings-md   the settings table in Markdown, as in docs/settings.md\n"
          "  --horovod       the HOROVOD_* variables hora does not honour, and why\n"
          "  --algorithms    the collective algorithms, by kind (HORA_ALGORITHM_<KIND>)\n"
          "  --model         the cost model's predicted time of each algorithm and its choice,\n"
          "                  by size: --ranks N (16) --hosts H (N) --transport tcp|unix|ib\n"
          "                  --link A,B,G --local A,B,G (alpha us, beta and gamma ns/byte;\n"
          "                  default HORA_COST_MODEL or the built-in constants);\n"
          "                  --projection: allreduce at 1,024 and 16,384 ranks;\n"
          "                  --fit FILE: the link's constants fitted to measurements (lines\n"
          "                  KIND ALGORITHM BYTES SECONDS, as scripts/scale-bench.sh --fit\n"
          "                  writes them), printed as HORA_COST_MODEL\n"
          "  --calibrate     as a job of 2 or more processes (mpirun -np 2 hora-info\n"
          "                  --calibrate): measures the links' constants as\n"
          "                  HORA_COST_MODEL=calibrate does at start-up (the latency: a step\n"
          "                  with every rank stepping; the bandwidth: rank 0 and the first\n"
          "                  rank on another host, else rank 1), and prints them as\n"
          "                  HORA_COST_MODEL; --save FILE writes them for\n"
          "                  HORA_COST_MODEL=file:FILE\n");
}

/* The start-up hora_init would choose here (it reads the same variables). */
static int print_bootstrap(void) {
  struct hora__rdv_choice c;
  int rc = hora__rdv_choose(false, &c);
  if (rc != HORA_SUCCESS) {
    printf("start-up: cannot start here: %s\n", hora_last_error());
    return rc;
  }
  printf("start-up: %s, because %s\n", hora__rdv_kind_name(c.kind), c.why);
  if (c.kind == HORA_RDV_MPI) {
    printf("  rank and size from MPI (hora_init starts MPI unless the program has)\n");
  } else if (c.kind != HORA_RDV_SINGLE) {
    printf("  rank %d of %d (%s, %s); rank 0 hosts the rendezvous at %s\n", c.rank, c.size,
           c.rank_var, c.size_var, c.where);
    printf("  secret: %s\n", c.has_secret ? c.secret_from
                                          : "none (any process reaching the rendezvous during "
                                            "start-up may join: set HORA_SECRET_FILE)");
  }
  return HORA_SUCCESS;
}

/* The settings whose names start with `prefix` ("" for all), as they are now. */
static void print_settings(const char *prefix) {
#define HORA_PARAM_SHOW_bytes(v) printf("%lld", (long long)(v))
#define HORA_PARAM_SHOW_int(v) printf("%lld", (long long)(v))
#define HORA_PARAM_SHOW_double(v) printf("%g", (v))
#define HORA_PARAM_SHOW_bool(v) printf("%d", (v) ? 1 : 0)
#define HORA_PARAM_SHOW_string(v) \
  printf("%s", &(v) == &hora__params.SECRET && (v)[0] ? "(set; not shown)" : (v))
#define HORA_PARAM(name, scope, type, def, doc)      \
  if (strncmp(#name, prefix, strlen(prefix)) == 0) { \
    printf("  HORA_%s=", #name);                     \
    HORA_PARAM_SHOW_##type(hora__params.name);       \
    printf("\n");                                    \
  }
#define HORA_PARAM_CHOICE(name, scope, choices, def, doc) \
  if (strncmp(#name, prefix, strlen(prefix)) == 0) {      \
    printf("  HORA_%s=%s\n", #name, hora__params.name);   \
  }
#include "base/params.def"
#undef HORA_PARAM
#undef HORA_PARAM_CHOICE
}

/* ---- --elastic ------------------------------------------------------------------
 * The launch lines below are the ones measured to leave the survivors of a
 * SIGKILLed process running (docs/elastic-launch.md: Open MPI 4.1, Slurm
 * 22.05, MPICH 4.0); tests/launch/check-elastic-launch.sh checks mpirun's. */

/* The job's secret as the job's processes and newcomers pass it on; never
 * the secret itself. */
static const char *secret_words(char *buf, size_t n) {
  if (hora__params.SECRET_FILE[0]) {
    snprintf(buf, n, " HORA_SECRET_FILE=%s", hora__params.SECRET_FILE);
  } else if (hora__params.SECRET[0]) {
    snprintf(buf, n, " HORA_SECRET=\"$HORA_SECRET\"");
  } else {
    buf[0] = '\0';
  }
  return buf;
}

static void print_secret_note(void) {
  if (hora__params.SECRET_FILE[0] || hora__params.SECRET[0]) {
    printf("  secret:   %s: newcomers must give the same\n",
           hora__params.SECRET_FILE[0] ? "HORA_SECRET_FILE" : "HORA_SECRET");
  } else if (hora__params.INSECURE) {
    printf(
        "  secret:   none (HORA_INSECURE=1): any process that reaches the door may join, and\n"
        "            one on a member's host may speak for that member\n");
  } else {
    printf(
        "  secret:   none: the job will refuse to start; give it and its newcomers the same\n"
        "            HORA_SECRET_FILE (mode 0600), or set HORA_INSECURE=1\n");
  }
}

/* door: where newcomers knock, "host:port" or a placeholder. */
static void elastic_tcp(const char *door) {
  char sec[600];
  secret_words(sec, sizeof(sec));
  printf("hora's own rendezvous (HORA_BOOTSTRAP=tcp, processes started by a script):\n");
  printf(
      "  launch:   HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS=%s HORA_RANK=r HORA_SIZE=N HORA_ELASTIC=1%s "
      "./train\n"
      "            for each rank r: nothing ends the others when one dies\n",
      door, sec);
  printf(
      "  newcomer: HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS=%s HORA_ELASTIC=1%s ./train\n"
      "            (no HORA_RANK or HORA_SIZE: it is given a rank when admitted)\n",
      door, sec);
  print_secret_note();
}

static void elastic_env(const char *door) {
  char sec[600];
  secret_words(sec, sizeof(sec));
  char addr[300];
  hora__strlcpy(addr, door, sizeof(addr));
  char *colon = strrchr(addr, ':');
  const char *port = "PORT";
  if (colon) {
    *colon = '\0';
    port = colon + 1;
  }
  printf("torchrun's variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE):\n");
  printf(
      "  launch:   MASTER_ADDR=%s MASTER_PORT=%s RANK=r WORLD_SIZE=N HORA_ELASTIC=1%s ./train\n"
      "            for each rank r, from a script: nothing ends the others when one dies. Not\n"
      "            under torchrun itself: its agent stops every worker when one fails\n",
      addr, port, sec);
  printf("  newcomer: HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS=%s HORA_ELASTIC=1%s ./train\n", door, sec);
  print_secret_note();
}

/* door: the job's rendezvous; jobid: SLURM_JOB_ID or a placeholder. */
static void elastic_slurm(const char *door, const char *jobid) {
  char sec[600];
  secret_words(sec, sizeof(sec));
  printf("Slurm (srun, hora's slurm start-up):\n");
  printf(
      "  launch:   HORA_ELASTIC=1%s srun --no-kill --kill-on-bad-exit=0 --wait=0 --mpi=none -n N "
      "./train\n"
      "            --mpi=none: with an MPI plug-in (pmix) Slurm cancels the whole step\n"
      "            when a task dies, whatever the options. --kill-on-bad-exit=0 and\n"
      "            --wait=0 override a cluster's KillOnBadExit and WaitTime, which end the\n"
      "            others; --no-kill keeps the job when a node is lost. srun exits with the\n"
      "            lost task's status (137 after a SIGKILL) once the others end.\n",
      sec);
  printf(
      "  newcomer: HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS=%s HORA_ELASTIC=1%s srun --overlap "
      "--jobid=%s -n 1 --mpi=none ./train\n"
      "            a new step of the same job; --overlap: the first step holds the job's\n"
      "            CPUs until it ends (a lost task's too), and without it the new step\n"
      "            waits for them\n",
      door, sec, jobid);
  printf(
      "  rendezvous: %s: rank 0 listens there for newcomers (the allocation's first node,\n"
      "            a port from the job id or HORA_RENDEZVOUS_PORT)\n",
      door);
  print_secret_note();
}

static void elastic_openmpi(void) {
  const char *rdv = hora__params.RENDEZVOUS;
  const char *door = rdv[0] ? rdv : "HOST:PORT";
  printf("Open MPI's mpirun:\n");
  printf(
      "  launch:   mpirun --enable-recovery -x HORA_ELASTIC=1 -x HORA_RENDEZVOUS=%s -np N ./train\n"
      "            --enable-recovery (or --mca orte_enable_recovery 1) leaves the others\n"
      "            running when one dies, and mpirun then exits 0 however the processes\n"
      "            ended: judge the job by its output. Without it mpirun kills them all\n"
      "            (exit 137 after a SIGKILL); with --mca orte_abort_on_non_zero_status 0\n"
      "            alone the survivors finish but mpirun never exits.\n",
      door);
  printf(
      "  newcomer: mpirun -np 1 -x HORA_BOOTSTRAP=tcp -x HORA_RENDEZVOUS=%s -x HORA_ELASTIC=1 "
      "./train\n",
      door);
  if (rdv[0]) {
    printf(
        "  rendezvous: HORA_RENDEZVOUS=%s: rank 0 listens there for newcomers (its host must be\n"
        "            rank 0's, the port free there)\n",
        rdv);
  } else {
    printf(
        "  rendezvous: none: under MPI newcomers find the job only at HORA_RENDEZVOUS, which\n"
        "            rank 0 listens on: set HORA_RENDEZVOUS=host:port for the job itself too\n"
        "            (rank 0's host, a port free there)\n");
  }
  if (hora__params.SECRET_FILE[0] || hora__params.SECRET[0]) {
    print_secret_note();
  } else {
    printf(
        "  secret:   none given: the members prove the one MPI carries, and no newcomer can\n"
        "            join; give the job and its newcomers -x HORA_SECRET_FILE (mode 0600)\n");
  }
}

static void elastic_other_mpi(void) {
  printf("another MPI's mpiexec (MPICH's or Intel MPI's Hydra):\n");
  printf(
      "  launch:   none keeps the others: MPICH's mpiexec kills them all when one dies (exit\n"
      "            9), and with -disable-auto-cleanup it exits at once and the others often\n"
      "            die with it. Start an elastic job without MPI (hora's own rendezvous, below)\n"
      "            or with Open MPI's mpirun --enable-recovery.\n");
}

/* The settings again, with one of them changed. */
static int reload_with(const char *var, const char *value) {
  if (setenv(var, value, 1) != 0) {
    return hora__error_errno(HORA_ERR_SYSTEM, "setenv %s", var);
  }
  return hora__params_load();
}

/* The rendezvous of an elastic job's steps in this Slurm allocation, as a
 * step would choose it without an MPI plug-in (the allocation's first node,
 * the job's port); a placeholder outside an allocation. */
static void slurm_door(char *door, size_t n) {
  struct hora__rdv_choice c;
  const char *job = getenv("SLURM_JOB_ID"), *nodes = getenv("SLURM_JOB_NODELIST");
  if (job && job[0] && nodes && nodes[0] && setenv("SLURM_PROCID", "0", 0) == 0 &&
      setenv("SLURM_NTASKS", "1", 0) == 0 && setenv("SLURM_STEP_ID", "0", 0) == 0 &&
      reload_with("HORA_BOOTSTRAP", "slurm") == HORA_SUCCESS &&
      hora__rdv_choose(false, &c) == HORA_SUCCESS) {
    snprintf(door, n, "%s:%d", c.host, c.port);
  } else {
    hora__strlcpy(door, "FIRSTNODE:PORT", n);
  }
}

static int print_elastic(void) {
  printf("elastic settings (HORA_ELASTIC=1 on every process makes a job elastic):\n");
  print_settings("ELASTIC");
  /* The rendezvous an elastic job uses (under Slurm the first step's, for
   * every step): choose as with HORA_ELASTIC=1. */
  struct hora__rdv_choice c;
  if (reload_with("HORA_ELASTIC", "1") != HORA_SUCCESS ||
      hora__rdv_choose(false, &c) != HORA_SUCCESS) {
    printf("elastic launch: cannot start here: %s\n", hora_last_error());
    return 1;
  }
  char door[300];
  snprintf(door, sizeof(door), "%s:%d", c.host, c.port);
  const char *job = getenv("SLURM_JOB_ID");
  job = job && job[0] ? job : "JOBID";
  const char *var = NULL;
  bool launched = hora__rdv_mpi_launched(&var);
  printf("elastic launch: %s start-up, because %s\n", hora__rdv_kind_name(c.kind), c.why);
  switch (c.kind) {
    case HORA_RDV_MPI:
      if (launched && strcmp(var, "OMPI_COMM_WORLD_SIZE") == 0) {
        elastic_openmpi();
      } else if (launched && getenv("SLURM_STEP_ID")) {
        printf(
            "srun with an MPI plug-in (%s and SLURM_STEP_ID are set): Slurm cancels the whole\n"
            "  step when a task dies, even with --kill-on-bad-exit=0 --no-kill: start the step\n"
            "  with --mpi=none instead, and hora meets at its own rendezvous.\n",
            var);
        slurm_door(door, sizeof(door));
        elastic_slurm(door, job);
      } else if (launched) {
        elastic_other_mpi();
        elastic_tcp("HOST:PORT");
      } else {
        /* HORA_BOOTSTRAP=mpi: no launcher says which. */
        elastic_openmpi();
        elastic_other_mpi();
      }
      break;
    case HORA_RDV_SLURM:
      elastic_slurm(door, job);
      break;
    case HORA_RDV_ENV:
      elastic_env(door);
      break;
    case HORA_RDV_TCP:
      elastic_tcp(door);
      break;
    default:
      printf("the lines for each launcher:\n");
      elastic_openmpi();
      elastic_other_mpi();
      slurm_door(door, sizeof(door));
      elastic_slurm(door, job);
      elastic_env("HOST:PORT");
      elastic_tcp("HOST:PORT");
      break;
  }
  return 0;
}

/* --calibrate [--save FILE]: a job whose start-up calibrates (the same
 * code as HORA_COST_MODEL=calibrate); rank 0 reports. */
static int calibrate(int argc, char **argv) {
  const char *save = NULL;
  for (int i = 2; i < argc; i++) {
    if (strcmp(argv[i], "--save") == 0 && i + 1 < argc) {
      save = argv[++i];
    } else {
      fprintf(stderr, "hora-info --calibrate: unknown or incomplete option '%s' (--save FILE)\n",
              argv[i]);
      return 2;
    }
  }
  if (setenv("HORA_COST_MODEL", "calibrate", 1) != 0 || hora_init() != HORA_SUCCESS) {
    fprintf(stderr, "hora-info --calibrate: %s\n", hora_last_error());
    return 1;
  }
  int rc = 0;
  if (hora_size() < 2) {
    fprintf(stderr, "hora-info --calibrate: a job of one process measures no link; run it with "
                    "2 or more (mpirun -np 2 hora-info --calibrate, or across hosts)\n");
    rc = 2;
  } else if (hora_rank() == 0) {
    int arc = HORA_SUCCESS;
    struct hora__runtime *rt = hora__api_running(&arc, "hora-info --calibrate");
    if (!rt || !rt->comm) {
      fprintf(stderr, "hora-info --calibrate: %s\n", hora_last_error());
      rc = 1;
    } else {
      struct hora__cost_model m = rt->comm->model;
      hora__api_leave(HORA_SUCCESS);
      char nums[96];
      hora__cost_format(&m.link, nums, sizeof(nums));
      printf("HORA_COST_MODEL=%s\n", nums);
      printf("latency %.1f us, bandwidth %.3g GB/s, reduction %.3g GB/s (float32 sum); %s\n",
             m.link.alpha * 1e6, 1e-9 / m.link.beta, 1e-9 / m.link.gamma, m.source);
      if (save) {
        if (hora__cost_save(save, &m.link, m.source) != HORA_SUCCESS) {
          fprintf(stderr, "hora-info --calibrate: %s\n", hora_last_error());
          rc = 1;
        } else {
          printf("saved to %s: use it with HORA_COST_MODEL=file:%s\n", save, save);
        }
      }
    }
  }
  if (hora_finalize() != HORA_SUCCESS) {
    fprintf(stderr, "hora-info --calibrate: %s\n", hora_last_error());
    rc = rc ? rc : 1;
  }
  return rc;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--help") == 0) {
    usage(stdout);
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "--settings-md") == 0) {
    hora__params_write_markdown(stdout);
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "--horovod") == 0) {
    hora__params_write_horovod_ignored(stdout);
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "--algorithms") == 0) {
    return hora_info_algorithms();
  }
  if (argc > 1 && strcmp(argv[1], "--model") == 0) {
    if (hora__params_load() != HORA_SUCCESS) {
      fprintf(stderr, "hora-info: %s\n", hora_last_error());
      return 1;
    }
    return hora_info_model(argc, argv);
  }
  if (argc > 1 && strcmp(argv[1], "--calibrate") == 0) {
    return calibrate(argc, argv);
  }
  bool bootstrap = argc > 1 && strcmp(argv[1], "--bootstrap") == 0;
  bool elastic = argc > 1 && strcmp(argv[1], "--elastic") == 0;
  if (argc > 1 && strcmp(argv[1], "--settings") != 0 && !bootstrap && !elastic) {
    usage(stderr);
    return 2;
  }
  if (hora__params_load() != HORA_SUCCESS) {
    fprintf(stderr, "hora-info: %s\n", hora_last_error());
    return 1;
  }
  if (elastic) {
    return print_elastic();
  }
  if (argc == 1) {
    printf("hora %s\n", hora_version());
    printf("  MPI:   %s\n", HORA_HAVE_MPI ? "yes" : "no (configure --without-mpi)");
    printf("  CUDA:  %s\n", HORA_HAVE_CUDA ? "yes" : "no");
    printf("  NCCL:  %s\n", HORA_HAVE_NCCL ? "yes" : "no");
    printf("  verbs: %s\n", HORA_HAVE_VERBS ? "yes" : "no");
  }
  if (argc == 1 || bootstrap) {
    if (print_bootstrap() != HORA_SUCCESS && bootstrap) {
      return 1;
    }
    if (bootstrap) {
      return 0;
    }
    printf("settings:\n");
  }
  print_settings("");
  return 0;
}
