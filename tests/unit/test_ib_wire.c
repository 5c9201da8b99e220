/* The RDMA wire formats, which build without verbs: immediates checked
 * against the ring (the 5-bit slot field once indexed a 16-entry array,
 * and the 21-bit length could exceed a slot), and the connection record. */
#include "comm/transport/ib/ib_wire.h"
#include "../runner.h"

static uint32_t data_imm(uint32_t credits, uint32_t slot, uint32_t len) {
  return credits << HORA_IB_IMM_CREDITS_SHIFT | slot << HORA_IB_IMM_SLOT_SHIFT | len;
}

static uint32_t bare_imm(uint32_t credits, uint32_t kind) {
  return HORA_IB_IMM_BARE | credits << HORA_IB_IMM_CREDITS_SHIFT | kind << HORA_IB_IMM_SLOT_SHIFT;
}

TEST(ib_immediates_are_checked_against_the_ring) {
  struct hora__ib_imm m;
  struct hora__ib_ring_state st = {.ring_head = 37, .ring_ready = 2, .credits = 10};
  /* The next slot in order, a full slot's worth, credits that fit. */
  ASSERT_EQ_INT(hora__ib_imm_decode(data_imm(6, 7, HORA_IB_SLOT), &st, 3, &m), HORA_SUCCESS);
  ASSERT(!m.bare && m.slot == 7 && m.len == HORA_IB_SLOT && m.credits == 6);
  ASSERT_EQ_INT(hora__ib_imm_decode(bare_imm(0, HORA_IB_KIND_DESCRIPTOR), &st, 3, &m),
                HORA_SUCCESS);
  ASSERT(m.bare && m.kind == HORA_IB_KIND_DESCRIPTOR && m.credits == 0);
  /* A slot beyond the ring (the field holds up to 31). */
  ASSERT_EQ_INT(hora__ib_imm_decode(data_imm(0, 31, 10), &st, 3, &m), HORA_ERR_PROTOCOL);
  ASSERT_STR_CONTAINS(hora__error_message(), "ring slot 31, expected slot 7 of 16");
  ASSERT_STR_CONTAINS(hora__error_message(), "rank 3");
  /* A slot out of order. */
  ASSERT_EQ_INT(hora__ib_imm_decode(data_imm(0, 8, 10), &st, 3, &m), HORA_ERR_PROTOCOL);
  /* More bytes than a slot holds. */
  ASSERT_EQ_INT(hora__ib_imm_decode(data_imm(0, 7, HORA_IB_SLOT + 1), &st, 3, &m),
                HORA_ERR_PROTOCOL);
  ASSERT_STR_CONTAINS(hora__error_message(), "262145 bytes in ring slot 7, which holds 262144");
  /* More credits back than slots out. */
  ASSERT_EQ_INT(hora__ib_imm_decode(bare_imm(7, HORA_IB_KIND_CREDIT), &st, 3, &m),
                HORA_ERR_PROTOCOL);
  ASSERT_STR_CONTAINS(hora__error_message(), "returns 7 ring credits, but only 6");
  /* Unknown kinds, and bare writes with length bits. */
  ASSERT_EQ_INT(hora__ib_imm_decode(bare_imm(0, 3), &st, 3, &m), HORA_ERR_PROTOCOL);
  ASSERT_EQ_INT(hora__ib_imm_decode(bare_imm(0, HORA_IB_KIND_CREDIT) | 1, &st, 3, &m),
                HORA_ERR_PROTOCOL);
  /* A data write while every slot is still full. */
  st = (struct hora__ib_ring_state){.ring_head = 0, .ring_ready = HORA_IB_SLOTS, .credits = 0};
  ASSERT_EQ_INT(hora__ib_imm_decode(data_imm(0, 0, 1), &st, 3, &m), HORA_ERR_PROTOCOL);
  ASSERT_STR_CONTAINS(hora__error_message(), "all 16 ring slots are full");
  /* Wrapping: slot 0 after slot 15. */
  st = (struct hora__ib_ring_state){.ring_head = 15, .ring_ready = 1, .credits = 16};
  ASSERT_EQ_INT(hora__ib_imm_decode(data_imm(0, 0, 1), &st, 3, &m), HORA_SUCCESS);
}

static struct hora__ib_record good_record(void) {
  struct hora__ib_record r = {.qpn = 0x1234,
                              .psn = 0xabcdef,
                              .lid = 7,
                              .mtu = 3,
                              .ring_addr = 0x7f0000001000ull,
                              .ring_rkey = 0x11223344,
                              .ctl_rkey = 0x55667788,
                              .ctl_addr = 0x7f0000100000ull,
                              .zero_copy_min = 65536};
  for (int i = 0; i < 16; i++) {
    r.gid[i] = (uint8_t)(0xf0 + i);
  }
  return r;
}

TEST(ib_record_roundtrip_and_rejects) {
  struct hora__ib_record r = good_record(), back;
  uint8_t w[HORA_IB_RECORD_SIZE];
  hora__ib_record_encode(&r, w);
  ASSERT_EQ_INT(hora__ib_record_decode(w, 5, &back), HORA_SUCCESS);
  ASSERT(back.qpn == r.qpn && back.psn == r.psn && back.lid == r.lid && back.mtu == r.mtu &&
         memcmp(back.gid, r.gid, 16) == 0 && back.ring_addr == r.ring_addr &&
         back.ring_rkey == r.ring_rkey && back.ctl_rkey == r.ctl_rkey &&
         back.ctl_addr == r.ctl_addr && back.zero_copy_min == r.zero_copy_min);
  ASSERT_EQ_INT(w[0], 0x42); /* little-endian "HRIB" */
  struct {
    int offset;
    uint8_t value;
    const char *why;
  } bad[] = {
      {0, 0x00, "magic"},        {15, 1, "padding"},        {70, 1, "padding"},
      {7, 0x01, "queue pair"},   {11, 0x01, "24 bits"},     {14, 0, "MTU"},
      {14, 6, "MTU"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    uint8_t x[HORA_IB_RECORD_SIZE];
    memcpy(x, w, sizeof(x));
    x[bad[i].offset] = bad[i].value;
    ASSERT_EQ_INT(hora__ib_record_decode(x, 5, &back), HORA_ERR_PROTOCOL);
    ASSERT_STR_CONTAINS(hora__error_message(), "rank 5 sent a malformed RDMA connection record");
    ASSERT_STR_CONTAINS(hora__error_message(), bad[i].why);
  }
  r.ring_addr = 0;
  hora__ib_record_encode(&r, w);
  ASSERT_EQ_INT(hora__ib_record_decode(w, 5, &back), HORA_ERR_PROTOCOL);
  r = good_record();
  r.qpn = 0;
  hora__ib_record_encode(&r, w);
  ASSERT_EQ_INT(hora__ib_record_decode(w, 5, &back), HORA_ERR_PROTOCOL);
  r = good_record();
  r.zero_copy_min = 0;
  hora__ib_record_encode(&r, w);
  ASSERT_EQ_INT(hora__ib_record_decode(w, 5, &back), HORA_ERR_PROTOCOL);
}
