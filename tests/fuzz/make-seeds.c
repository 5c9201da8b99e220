/* Writes the seed corpus of each fuzz target: valid messages of every
 * kind, as the runtime encodes them. run-fuzz.sh runs it before each
 * fuzzing session. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "comm/comm.h"
#include "comm/transport/socket.h"
#include "comm/transport/ib/ib_wire.h"
#include "runtime/negotiate/cache.h"
#include "runtime/negotiate/message.h"

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
                          .kind = HORA_CONN_DATA, .rank = 3, .size = 16, .nonce = {1, 2, 3}};
  uint8_t wire[HORA_HELLO_WIRE_SIZE];
  hora__hello_encode(&h, wire);
  snprintf(dir, sizeof(dir), "%s/fuzz_hello", root);
  put(dir, "valid", wire, sizeof(wire));
  /* handshake: mode byte, nonce, then per mode (see fuzz_handshake.c) */
  {
    uint8_t in[1 + HORA_HS_NONCE_LEN + 1 + HORA_HELLO_WIRE_SIZE + 1 + HORA_HS_PROOF_SIZE];
    memset(in, 0x11, sizeof(in));
    size_t n = 0;
    in[n++] = 0; /* a stranger's hello and a made-up proof to an acceptor */
    n += HORA_HS_NONCE_LEN;
    in[n++] = HORA_HELLO_WIRE_SIZE - 1;
    hora__hello_encode(&h, in + n);
    n += HORA_HELLO_WIRE_SIZE;
    in[n++] = HORA_HS_PROOF_SIZE - 1;
    snprintf(dir, sizeof(dir), "%s/fuzz_handshake", root);
    put(dir, "stranger_hello", in, sizeof(in));
    uint8_t wire_in[1 + HORA_HS_NONCE_LEN + 3 + 2 * HORA_HS_NONCE_LEN + 2];
    memset(wire_in, 0x22, sizeof(wire_in));
    wire_in[0] = 2; /* connector and acceptor, untouched wire */
    wire_in[1 + HORA_HS_NONCE_LEN] = 5;
    wire_in[2 + HORA_HS_NONCE_LEN] = 2;
    wire_in[3 + HORA_HS_NONCE_LEN] = HORA_CONN_DATA - 1;
    put(dir, "honest_wire", wire_in, sizeof(wire_in) - 2);
    wire_in[sizeof(wire_in) - 2] = 100; /* a byte of the challenge's MAC flipped */
    wire_in[sizeof(wire_in) - 1] = 1;
    put(dir, "tampered_wire", wire_in, sizeof(wire_in));
  }
  /* requests */
  struct hora__op_meta m = {.kind = HORA_KIND_ALLREDUCE, .dtype = HORA_FLOAT32, .op = HORA_SUM,
                            .root = -1, .count = 1000, .prescale = 1, .postscale = 1};
  struct hora__shape shape = {2, {25, 40}};
  m.shape = hora__shape_fingerprint(m.kind, &shape);
  hora__encode_requests_begin(&w);
  hora__encode_request_shaped(&w, &m, &shape, "Ngrad/fc1.weight", 16, 0);
  m.kind = HORA_KIND_BROADCAST;
  m.root = 2;
  m.shape = 0;
  hora__encode_request(&w, &m, "U7", 2, 1500);
  hora__encode_requests_end(&w, 2);
  snprintf(dir, sizeof(dir), "%s/fuzz_requests", root);
  put(dir, "two", w.data, w.len);
  /* responses */
  struct hora__response *r = hora__response_new(HORA_KIND_ALLREDUCE, 2);
  r->dtype = HORA_FLOAT32;
  hora__response_set_tensor(r, 0, "Na", 2, 10);
  hora__response_set_tensor(r, 1, "Nz", 2, 99);
  r->tensors[0].shape = 0x9e3779b97f4a7c15ull;
  struct hora__response *e = hora__response_new(HORA_KIND_ERROR, 1);
  e->error_code = HORA_ERR_MISMATCH;
  e->error_msg = strdup("allreduce 'x': rank 0 sent 10 elements, rank 1 sent 11");
  hora__response_set_tensor(e, 0, "Nx", 2, 0);
  struct hora__response *v[2] = {r, e};
  hora__encode_responses(&w, v, 2);
  snprintf(dir, sizeof(dir), "%s/fuzz_responses", root);
  put(dir, "fused_and_error", w.data, w.len);
  /* abort and cycle */
  hora__encode_abort(&w, 5, HORA_ERR_PEER_LOST, "lost rank 5 (host h1, pid 99)");
  snprintf(dir, sizeof(dir), "%s/fuzz_small", root);
  put(dir, "abort", w.data, w.len);
  uint8_t vec[8 + 4] = {0x05, 0x01, 0xff, 0x03, 0x00, 0x10, 0x01, 0x00, 1, 2, 3, 4};
  struct hora__cycle_msg cyc = {.cycle = 12, .step = 1, .flags = HORA_CYCLE_JOINED, .frames = 3,
                                .nbytes = 2, .vec = vec, .eager_len = 4, .eager = vec + 8};
  hora__encode_cycle(&w, &cyc);
  put(dir, "cycle", w.data, w.len);
  /* frames: a heartbeat and a small message back to back */
  uint8_t frames[8 + 8 + 3] = {0, 0, 0, 0, 5, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 'a', 'b', 'c'};
  snprintf(dir, sizeof(dir), "%s/fuzz_frames", root);
  put(dir, "two_frames", frames, sizeof(frames));
  /* ib: a connection record, then immediates (4 bytes and an action
   * byte each): data into slots 0 and 1, a descriptor, credits back */
  struct hora__ib_record rec = {.qpn = 0x11, .psn = 0x123456, .lid = 1, .mtu = 5,
                                .ring_addr = 0x7f0000001000ull, .ring_rkey = 9, .ctl_rkey = 10,
                                .ctl_addr = 0x7f0000200000ull, .zero_copy_min = 65536};
  uint8_t ib[HORA_IB_RECORD_SIZE + 4 * 5];
  hora__ib_record_encode(&rec, ib);
  const uint32_t imms[4] = {
      0u << HORA_IB_IMM_SLOT_SHIFT | 100u, 1u << HORA_IB_IMM_SLOT_SHIFT | HORA_IB_SLOT,
      HORA_IB_IMM_BARE | (uint32_t)HORA_IB_KIND_DESCRIPTOR << HORA_IB_IMM_SLOT_SHIFT,
      HORA_IB_IMM_BARE | 2u << HORA_IB_IMM_CREDITS_SHIFT};
  for (int i = 0; i < 4; i++) {
    uint8_t *p = ib + HORA_IB_RECORD_SIZE + 5 * i;
    p[0] = (uint8_t)imms[i];
    p[1] = (uint8_t)(imms[i] >> 8);
    p[2] = (uint8_t)(imms[i] >> 16);
    p[3] = (uint8_t)(imms[i] >> 24);
    p[4] = i < 2 ? 3 : 1;
  }
  /* cycle: rank 0 of 4 at cycle 0 with a 2-byte bitmap, rank 1's step 1
   * of cycle 1 in a control frame (raw); and the same step built by the
   * target, then rank 1's step 1 of cycle 2 (peer byte 3: the first of
   * rank 0's partners, rank 1) */
  hora__encode_cycle(&w, &(struct hora__cycle_msg){.cycle = 1, .step = 1, .frames = 2,
                                                   .nbytes = 2, .vec = vec});
  uint8_t cyc_stream[6 + 8 + 64] = {3, 0, 3, 0, 2, 0};
  uint8_t *fh = cyc_stream + 6;
  fh[0] = (uint8_t)w.len;
  fh[4] = HORA_MSG_CYCLE;
  memcpy(fh + 8, w.data, w.len);
  snprintf(dir, sizeof(dir), "%s/fuzz_cycle", root);
  put(dir, "step_from_partner", cyc_stream, 6 + 8 + w.len);
  const uint8_t built[] = {3, 0, 3, 0, 2, 1, /* step cycle+ nbytes flags frames at val vec */
                           1, 0, 2, 0, 2, 0xff, 0, 5, 1, 0xff, 3, 0, 0x10,
                           1, 1, 2, 1, 3, 0xff, 0, 7, 7, 7, 7, 7, 7};
  put(dir, "built_steps", built, sizeof(built));
  snprintf(dir, sizeof(dir), "%s/fuzz_ib", root);
  put(dir, "record_and_ring", ib, sizeof(ib));
  return 0;
}
