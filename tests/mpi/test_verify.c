/* HORA_VERIFY=1: results of every kind of collective (fused allreduces,
 * a large one, broadcast, allgather, a joined rank's stand-ins) pass the
 * cross-rank checksum. With HORA_VERIFY_CORRUPT_RANK set, that rank's
 * flipped bit fails the job with HORA_ERR_CORRUPT on every rank, and the
 * message names the rank. */
#include <stdlib.h>

#include "mpitest.h"

static void every_collective_passes(void) {
  enum { N = 8, BIG = 1 << 20 };
  hora_request *r[N];
  float small[N][100];
  for (int t = 0; t < N; t++) {
    char name[32];
    snprintf(name, sizeof(name), "verify/small%d", t);
    for (int i = 0; i < 100; i++) {
      small[t][i] = (float)(mt_rank + i + t);
    }
    MT_OK(hora_allreduce_async(name, small[t], small[t], 100, HORA_FLOAT32, HORA_SUM, &r[t]));
  }
  for (int t = 0; t < N; t++) {
    MT_OK(hora_wait(&r[t]));
    float want = (float)(mt_size * (99 + t) + mt_size * (mt_size - 1) / 2);
    MT_CHECK(small[t][99] == want, "small%d: %g, expected %g", t, (double)small[t][99],
             (double)want);
  }
  double *big = malloc(BIG * sizeof(*big));
  for (int i = 0; i < BIG; i++) {
    big[i] = 0.1 * (mt_rank + 1) * (i % 977); /* rounding differs by order: results must not */
  }
  MT_OK(hora_allreduce("verify/big", big, big, BIG, HORA_FLOAT64, HORA_AVERAGE));
  MT_OK(hora_broadcast("verify/bcast", big, 1000, HORA_FLOAT64, mt_size - 1));
  int32_t mine[3] = {mt_rank, mt_rank * 2, mt_rank * 3};
  int32_t *all = malloc(3 * sizeof(int32_t) * (size_t)mt_size);
  MT_OK(hora_allgather("verify/gather", mine, 3, HORA_INT32, all));
  MT_CHECK(all[3 * (mt_size - 1) + 2] == 3 * (mt_size - 1), "allgather: %d", all[3 * (mt_size - 1) + 2]);
  /* The last rank joins; the others reduce with its zeros. */
  if (mt_rank == mt_size - 1) {
    MT_OK(hora_join(NULL));
  } else {
    float x[10] = {1};
    MT_OK(hora_allreduce("verify/after-join", x, x, 10, HORA_FLOAT32, HORA_SUM));
    MT_OK(hora_join(NULL));
  }
  free(all);
  free(big);
}

static int corrupt_rank;

static void a_flipped_bit_fails_every_rank(void) {
  float x[1000];
  for (int i = 0; i < 1000; i++) {
    x[i] = (float)i;
  }
  MT_FAILS(hora_allreduce("verify/corrupted", x, x, 1000, HORA_FLOAT32, HORA_SUM), HORA_ERR_CORRUPT,
           "HORA_VERIFY");
  char who[64];
  if (mt_size > 2) {
    snprintf(who, sizeof(who), "%d rank(s) agree on checksum", mt_size - 1);
    MT_CHECK(mt_contains(hora_last_error(), who), "message lacks '%s': %s", who, hora_last_error());
    snprintf(who, sizeof(who), "these differ: rank(s) %d (", corrupt_rank);
  } else {
    snprintf(who, sizeof(who), "no majority: rank(s) 0 (");
  }
  MT_CHECK(mt_contains(hora_last_error(), who), "message lacks '%s': %s", who, hora_last_error());
  MT_CHECK(mt_contains(hora_last_error(), "'verify/corrupted'"), "message lacks the name: %s",
           hora_last_error());
  /* Fatal: the job's results can no longer be trusted. */
  MT_FAILS(hora_allreduce("verify/later", x, x, 1000, HORA_FLOAT32, HORA_SUM), HORA_ERR_CORRUPT,
           "HORA_VERIFY");
}

int main(int argc, char **argv) {
  /* The test owns MPI: after a fatal error hora leaves it alone. */
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  mt_setenv_args(argc, argv);
  setenv("HORA_VERIFY", "1", 1);
  const char *c = getenv("HORA_VERIFY_CORRUPT_RANK");
  corrupt_rank = c ? atoi(c) : -1;
  mt_init();
  if (corrupt_rank < 0) {
    mt_run("verify/every_collective_passes", every_collective_passes);
  } else if (mt_size > 1) {
    mt_run("verify/a_flipped_bit_fails_every_rank", a_flipped_bit_fails_every_rank);
  } else {
    mt_skip("verify/a_flipped_bit_fails_every_rank", "one rank has nobody to disagree with");
  }
  int failures = mt_total_failures();
  int rc = hora_finalize();
  if (corrupt_rank < 0) {
    MT_CHECK(rc == HORA_SUCCESS, "hora_finalize: %s", hora_strerror(rc));
    failures += rc != HORA_SUCCESS;
  }
  MPI_Finalize();
  return failures ? 1 : 0;
}
