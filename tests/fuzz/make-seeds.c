/* Writes the seed corpus of each fuzz target: valid messages of every
 * kind, as the runtime encodes them. run-fuzz.sh runs it before each
 * fuzzing session. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "../../comm/comm.h"
#include "../../runtime/cache.h"
#include "../../runtime/message.h"

static void put(const char *dir, const char *name, const void *p, size_t n) {
  char path[512];
  mkdir(dir, 0755);
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (f) {
    fwrite(p, 1, n, f);
    fclose(f);
  }
}

int main(int argc, char **argv) {
  const char *root = argc > 1 ? argv[1] : "corpus";
  mkdir(root, 0755);
  char dir[400];
  struct hora__wbuf w = {0};
  /* hello */
  struct hora__hello h = {.magic = HORA_HELLO_MAGIC, .version = HORA_HELLO_VERSION,
                          .kind = HORA_CONN_DATA, .rank = 3, .size = 16, .secret = {1, 2, 3}};
  uint8_t wire[HORA_HELLO_WIRE_SIZE];
  hora__hello_encode(&h, wire);
  snprintf(dir, sizeof(dir), "%s/fuzz_hello", root);
  put(dir, "valid", wire, sizeof(wire));
  /* requests */
  struct hora__op_meta m = {.kind = HORA_KIND_ALLREDUCE, .dtype = HORA_FLOAT32, .op = HORA_SUM,
                            .root = -1, .count = 1000, .prescale = 1, .postscale = 1};
  uint8_t bits[2] = {0x05, 0x01};
  hora__encode_requests_begin(&w);
  hora__encode_request(&w, &m, "Ngrad/fc1.weight", 16);
  m.kind = HORA_KIND_BROADCAST;
  m.root = 2;
  hora__encode_request(&w, &m, "U7", 2);
  hora__encode_requests_end(&w, 2, 9, bits, 2);
  snprintf(dir, sizeof(dir), "%s/fuzz_requests", root);
  put(dir, "two_and_bits", w.data, w.len);
  /* responses, some by cache slot */
  struct hora__cache cache;
  hora__cache_init(&cache, 4);
  struct hora__op_meta cm = {.kind = HORA_KIND_ALLREDUCE, .dtype = HORA_FLOAT32, .count = 10,
                             .prescale = 1, .postscale = 1};
  int32_t slot;
  hora__cache_note(&cache, "Na", 2, &cm, &slot);
  struct hora__response *r = hora__response_new(HORA_KIND_ALLREDUCE, 2);
  r->dtype = HORA_FLOAT32;
  hora__response_set_tensor(r, 0, "Na", 2, 10);
  hora__response_set_tensor(r, 1, "Nz", 2, 99);
  struct hora__response *e = hora__response_new(HORA_KIND_ERROR, 1);
  e->error_code = HORA_ERR_MISMATCH;
  e->error_msg = strdup("allreduce 'x': rank 0 sent 10 elements, rank 1 sent 11");
  hora__response_set_tensor(e, 0, "Nx", 2, 0);
  struct hora__response *v[2] = {r, e};
  hora__encode_responses(&w, v, 2, &cache);
  snprintf(dir, sizeof(dir), "%s/fuzz_responses", root);
  put(dir, "fused_and_error", w.data, w.len);
  /* abort and resend */
  hora__encode_abort(&w, 5, HORA_ERR_PEER_LOST, "lost rank 5 (host h1, pid 99)");
  snprintf(dir, sizeof(dir), "%s/fuzz_small", root);
  put(dir, "abort", w.data, w.len);
  uint32_t slots[3] = {0, 4, 9};
  hora__encode_resend(&w, 12, slots, 3);
  put(dir, "resend", w.data, w.len);
  /* frames: a heartbeat and a small message back to back */
  uint8_t frames[8 + 8 + 3] = {0, 0, 0, 0, 5, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 'a', 'b', 'c'};
  snprintf(dir, sizeof(dir), "%s/fuzz_frames", root);
  put(dir, "two_frames", frames, sizeof(frames));
  return 0;
}
