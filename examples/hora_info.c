/* hora-info: what this build of hora has and how it is configured, in the
 * spirit of ompi_info. `--settings-md` prints the settings table that
 * README.md carries; `--horovod` the Horovod variables hora ignores. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "hora.h"
#include "base/params.h"
#include "comm/bootstrap/rendezvous.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: hora-info [--settings-md | --settings | --horovod | --bootstrap | --help]\n"
          "  (no option)     version, optional components, start-up, current settings\n"
          "  --bootstrap     how hora_init would start in this environment, and why\n"
          "  --settings      every HORA_* setting with its current value\n"
          "  --settings-md   the settings table in Markdown, as in README.md\n"
          "  --horovod       the HOROVOD_* variables hora does not honour, and why\n");
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
  bool bootstrap = argc > 1 && strcmp(argv[1], "--bootstrap") == 0;
  if (argc > 1 && strcmp(argv[1], "--settings") != 0 && !bootstrap) {
    usage(stderr);
    return 2;
  }
  if (hora__params_load() != HORA_SUCCESS) {
    fprintf(stderr, "hora-info: %s\n", hora_last_error());
    return 1;
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
#define HORA_PARAM_SHOW_bytes(v) printf("%lld", (long long)(v))
#define HORA_PARAM_SHOW_int(v) printf("%lld", (long long)(v))
#define HORA_PARAM_SHOW_double(v) printf("%g", (v))
#define HORA_PARAM_SHOW_bool(v) printf("%d", (v) ? 1 : 0)
#define HORA_PARAM_SHOW_string(v) printf("%s", &(v) == &hora__params.SECRET && (v)[0] ? "(set; not shown)" : (v))
#define HORA_PARAM(name, scope, type, def, doc)                                                     \
  printf("  HORA_%s=", #name);                                                               \
  HORA_PARAM_SHOW_##type(hora__params.name);                                                 \
  printf("\n");
#define HORA_PARAM_CHOICE(name, scope, choices, def, doc) printf("  HORA_%s=%s\n", #name, hora__params.name);
#include "base/params.def"
#undef HORA_PARAM
#undef HORA_PARAM_CHOICE
  return 0;
}
