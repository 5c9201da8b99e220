/* RDMA wire formats: see ib_wire.h. */
#include "comm/transport/ib/ib_wire.h"

int hora__ib_imm_decode(uint32_t imm, const struct hora__ib_ring_state *st, int peer,
                        struct hora__ib_imm *out) {
  *out = (struct hora__ib_imm){
      .bare = (imm & HORA_IB_IMM_BARE) != 0,
      .credits = (imm >> HORA_IB_IMM_CREDITS_SHIFT) & HORA_IB_IMM_FIELD_MASK,
  };
  uint32_t field = (imm >> HORA_IB_IMM_SLOT_SHIFT) & HORA_IB_IMM_FIELD_MASK;
  uint32_t low = imm & HORA_IB_IMM_LEN_MASK;
  if (st->credits > HORA_IB_SLOTS || out->credits > HORA_IB_SLOTS - st->credits) {
    return hora__error(HORA_ERR_PROTOCOL, "RDMA immediate 0x%08x from rank %d returns %u ring "
                       "credits, but only %u of its %d slots are out", imm, peer, out->credits,
                       HORA_IB_SLOTS - HORA_MIN(st->credits, (uint32_t)HORA_IB_SLOTS),
                       HORA_IB_SLOTS);
  }
  if (out->bare) {
    if (field > HORA_IB_KIND_DIRECT_DONE || low != 0) {
      return hora__error(HORA_ERR_PROTOCOL, "RDMA immediate 0x%08x from rank %d: unknown kind %u "
                         "of bare write (or stray low bits 0x%x)", imm, peer, field, low);
    }
    out->kind = field;
    return HORA_SUCCESS;
  }
  out->slot = field;
  out->len = low;
  uint32_t expect = (st->ring_head + st->ring_ready) % HORA_IB_SLOTS;
  if (st->ring_ready >= HORA_IB_SLOTS) {
    return hora__error(HORA_ERR_PROTOCOL, "RDMA immediate 0x%08x from rank %d: a data write into "
                       "slot %u while all %d ring slots are full", imm, peer, field,
                       HORA_IB_SLOTS);
  }
  if (field >= HORA_IB_SLOTS || field != expect) {
    return hora__error(HORA_ERR_PROTOCOL, "RDMA immediate 0x%08x from rank %d: a data write into "
                       "ring slot %u, expected slot %u of %d", imm, peer, field, expect,
                       HORA_IB_SLOTS);
  }
  if (low > HORA_IB_SLOT) {
    return hora__error(HORA_ERR_PROTOCOL, "RDMA immediate 0x%08x from rank %d: %u bytes in ring "
                       "slot %u, which holds %d", imm, peer, low, field, HORA_IB_SLOT);
  }
  return HORA_SUCCESS;
}

static void put_le(uint8_t *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) {
    p[i] = (uint8_t)(v >> (8 * i));
  }
}

static uint64_t get_le(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; i--) {
    v = v << 8 | p[i];
  }
  return v;
}

/* magic 0 | qpn 4 | psn 8 | lid 12 | mtu 14 | pad 15 | gid 16 | ring_addr 32 |
 * ring_rkey 40 | ctl_rkey 44 | ctl_addr 48 | zero_copy_min 56 | pad 64..71 */
void hora__ib_record_encode(const struct hora__ib_record *r, uint8_t out[HORA_IB_RECORD_SIZE]) {
  memset(out, 0, HORA_IB_RECORD_SIZE);
  put_le(out + 0, HORA_IB_RECORD_MAGIC, 4);
  put_le(out + 4, r->qpn, 4);
  put_le(out + 8, r->psn, 4);
  put_le(out + 12, r->lid, 2);
  out[14] = r->mtu;
  memcpy(out + 16, r->gid, 16);
  put_le(out + 32, r->ring_addr, 8);
  put_le(out + 40, r->ring_rkey, 4);
  put_le(out + 44, r->ctl_rkey, 4);
  put_le(out + 48, r->ctl_addr, 8);
  put_le(out + 56, r->zero_copy_min, 8);
}

int hora__ib_record_decode(const uint8_t in[HORA_IB_RECORD_SIZE], int peer,
                           struct hora__ib_record *r) {
  const char *bad = NULL;
  uint32_t magic = (uint32_t)get_le(in, 4);
  bool padded = in[15] == 0;
  for (int i = 64; i < HORA_IB_RECORD_SIZE; i++) {
    padded = padded && in[i] == 0;
  }
  *r = (struct hora__ib_record){
      .qpn = (uint32_t)get_le(in + 4, 4),
      .psn = (uint32_t)get_le(in + 8, 4),
      .lid = (uint16_t)get_le(in + 12, 2),
      .mtu = in[14],
      .ring_addr = get_le(in + 32, 8),
      .ring_rkey = (uint32_t)get_le(in + 40, 4),
      .ctl_rkey = (uint32_t)get_le(in + 44, 4),
      .ctl_addr = get_le(in + 48, 8),
      .zero_copy_min = get_le(in + 56, 8),
  };
  memcpy(r->gid, in + 16, 16);
  if (magic != HORA_IB_RECORD_MAGIC) {
    bad = "its magic number is wrong (not a hora RDMA record, or another version)";
  } else if (!padded) {
    bad = "its padding is not zero";
  } else if (r->qpn == 0 || r->qpn > 0xffffffu) {
    bad = "the queue pair number is not a non-zero 24-bit number";
  } else if (r->psn > 0xffffffu) {
    bad = "the packet sequence number has more than 24 bits";
  } else if (r->mtu < 1 || r->mtu > 5) {
    bad = "the MTU is not one of 256 to 4096 bytes";
  } else if (r->ring_addr == 0 || r->ctl_addr == 0) {
    bad = "its ring or descriptor address is null";
  } else if (r->zero_copy_min == 0) {
    bad = "its zero-copy threshold is 0";
  }
  if (bad) {
    return hora__error(HORA_ERR_PROTOCOL, "rank %d sent a malformed RDMA connection record: %s",
                       peer, bad);
  }
  return HORA_SUCCESS;
}
