/* A local peer that publishes bad offsets into shared memory. The last
 * rank forges its record in the host segment (through hora__shm_forge, just
 * before the barrier that publishes it); the others must fail with
 * HORA_ERR_PROTOCOL naming it and the offset, never read or write outside
 * a mapping. One forgery per run, chosen by the argument:
 *   block-end   (default) its first input's hora_mem_alloc reference: an
 *               offset inside the block whose tensor runs past its end
 *   block-wrap  its first output's reference: an offset that wraps around
 *               the address space
 *   own-block   an alltoall's offset of its own block (it must use its own
 *               sendbuf, not the address read back: the result is right)
 *   peer-wrap   an alltoall's offsets of the peers' blocks: they wrap */
#include <inttypes.h>
#include <stdatomic.h>

#include "comm/coll/collectives.h"
#include "comm/shm/shm.h"
#include "mpitest.h"

enum { N = 1 << 18 }; /* allreduce floats: 1 MiB, single copy at up to 16 ranks */
static const char *mode = "block-end";
static int armed;

/* The offset the forger writes (the victims expect it in the message). */
static uint64_t forged(void) {
  if (!strcmp(mode, "block-end")) {
    return N * sizeof(float) - 64; /* (the block is exactly N floats: whole pages) */
  }
  return !strcmp(mode, "own-block") ? (uint64_t)1 << 46 : UINT64_MAX - 4095;
}

static void forge(struct hora__mem_ref *refs, int nrefs, uint64_t *offsets, int noffsets) {
  if (!armed) {
    return;
  }
  if (refs && !strcmp(mode, "block-end")) {
    refs[0].offset = forged();
  } else if (refs && !strcmp(mode, "block-wrap")) {
    refs[nrefs / 2].offset = forged();
  } else if (offsets && !strcmp(mode, "own-block")) {
    offsets[noffsets - 1] = forged();
  } else if (offsets && !strcmp(mode, "peer-wrap")) {
    for (int j = 0; j < noffsets - 1; j++) {
      offsets[j] = forged();
    }
  } else {
    return;
  }
  armed = 0;
}

static bool forger(void) { return mt_rank == mt_size - 1; }

/* The victims' error: HORA_ERR_PROTOCOL naming the forger and the offset. */
static void expect_protocol_error(int rc) {
  if (forger()) {
    MT_CHECK(rc != HORA_SUCCESS, "the forger's operation succeeded");
    return;
  }
  char who[32], off[48];
  snprintf(who, sizeof(who), "rank %d", mt_size - 1);
  snprintf(off, sizeof(off), "offset %" PRIu64, forged());
  MT_CHECK(rc == HORA_ERR_PROTOCOL, "returned %s: %s", hora_strerror(rc), hora_last_error());
  MT_CHECK(mt_contains(hora_last_error(), who) && mt_contains(hora_last_error(), off),
           "message lacks '%s' or '%s': %s", who, off, hora_last_error());
}

static void forged_block_reference(void) {
  float *in, *out;
  MT_OK(hora_mem_alloc(N * sizeof(float), (void **)&in));
  MT_OK(hora_mem_alloc(N * sizeof(float), (void **)&out));
  for (size_t i = 0; i < N; i++) {
    in[i] = (float)(mt_rank + 1);
  }
  /* First an honest one, so that the peers' blocks are mapped already. */
  MT_OK(hora_allreduce("forge/honest", in, out, N, HORA_FLOAT32, HORA_SUM));
  MT_CHECK(out[N - 1] == (float)(mt_size * (mt_size + 1) / 2), "honest: %g", (double)out[N - 1]);
  armed = forger();
  expect_protocol_error(hora_allreduce("forge/forged", in, out, N, HORA_FLOAT32, HORA_SUM));
}

static void forged_exchange_offsets(void) {
  enum { B = 1 << 16 }; /* floats per block: 256 KiB, above the single-copy minimum */
  size_t n = (size_t)B * (size_t)mt_size;
  float *send = malloc(n * sizeof(float)), *recv = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) {
    send[i] = (float)(mt_rank * 1000 + (int)(i / B)); /* block for rank i / B */
  }
  armed = forger();
  hora_request *r = NULL;
  int rc = hora_alltoall_async_ex("forge/alltoall", send, n, NULL, recv, NULL, HORA_FLOAT32, NULL,
                                  &r);
  if (rc == HORA_SUCCESS) {
    rc = hora_wait(&r);
  }
  if (!strcmp(mode, "peer-wrap")) {
    expect_protocol_error(rc);
  } else {
    MT_CHECK(rc == HORA_SUCCESS, "alltoall: %s: %s", hora_strerror(rc), hora_last_error());
    int bad = 0;
    for (size_t i = 0; i < n && rc == HORA_SUCCESS && bad < 3; i++) {
      float want = (float)((int)(i / B) * 1000 + mt_rank);
      if (recv[i] != want) {
        mt_fail(__FILE__, __LINE__, "element %zu is %g, expected %g", i, (double)recv[i],
                (double)want);
        bad++;
      }
    }
  }
  free(send);
  free(recv);
}

int main(int argc, char **argv) {
  /* The test owns MPI: after a fatal error hora leaves it alone. */
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  mt_setenv_args(argc, argv);
  for (int i = 1; i < argc; i++) {
    if (strncmp(argv[i], "HORA_", 5) != 0) {
      mode = argv[i];
    }
  }
  bool exchange = !strcmp(mode, "own-block") || !strcmp(mode, "peer-wrap");
  if (exchange) {
    setenv("HORA_SHM_SINGLE_COPY", "1", 1); /* the kernel reads the blocks */
  }
  atomic_store(&hora__shm_forge, forge);
  mt_init();
  char name[64];
  snprintf(name, sizeof(name), "forge/%s", mode);
  if (mt_size == 1) {
    mt_skip(name, "one rank has no peer");
  } else if (hora_local_size() != mt_size) {
    mt_skip(name, "needs every rank on one host");
  } else {
    mt_run(name, exchange ? forged_exchange_offsets : forged_block_reference);
  }
  int failures = mt_total_failures();
  int rc = hora_finalize();
  if (!strcmp(mode, "own-block")) {
    MT_CHECK(rc == HORA_SUCCESS, "hora_finalize: %s", hora_strerror(rc));
    failures += rc != HORA_SUCCESS;
  }
  MPI_Finalize();
  return failures ? 1 : 0;
}
