/* hora-info: what this build of hora has and how it is configured, in the
 * spirit of ompi_info. `--settings-md` prints the settings table that
 * README.md carries; `--horovod` the Horovod variables hora ignores. */
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "hora.h"
#include "base/params.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: hora-info [--settings-md | --settings | --horovod | --help]\n"
          "  (no option)     version, optional components, current settings\n"
          "  --settings      every HORA_* setting with its current value\n"
          "  --settings-md   the settings table in Markdown, as in README.md\n"
          "  --horovod       the HOROVOD_* variables hora does not honour, and why\n");
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
  if (argc > 1 && strcmp(argv[1], "--settings") != 0) {
    usage(stderr);
    return 2;
  }
  if (hora__params_load() != HORA_SUCCESS) {
    fprintf(stderr, "hora-info: %s\n", hora_last_error());
    return 1;
  }
  if (argc == 1) {
    printf("hora %s\n", hora_version());
    printf("  CUDA:  %s\n", HORA_HAVE_CUDA ? "yes" : "no");
    printf("  NCCL:  %s\n", HORA_HAVE_NCCL ? "yes" : "no");
    printf("  verbs: %s\n", HORA_HAVE_VERBS ? "yes" : "no");
    printf("settings:\n");
  }
#define HORA_PARAM_SHOW_bytes(v) printf("%lld", (long long)(v))
#define HORA_PARAM_SHOW_int(v) printf("%lld", (long long)(v))
#define HORA_PARAM_SHOW_double(v) printf("%g", (v))
#define HORA_PARAM_SHOW_bool(v) printf("%d", (v) ? 1 : 0)
#define HORA_PARAM_SHOW_string(v) printf("%s", (v))
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
