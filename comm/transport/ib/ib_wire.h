/* What RDMA peers tell each other (ib/conn.c, ib/data.c): the connection
 * record swapped at set-up and the immediate data of every write. Both come from another
 * process, so they are decoded and checked here, in plain C that builds
 * (and is unit-tested and fuzzed) with or without libibverbs. */
#ifndef HORA_IB_WIRE_H
#define HORA_IB_WIRE_H

#include "base/common.h"

#define HORA_IB_SLOTS 16           /* ring slots per direction and connection */
#define HORA_IB_SLOT (256 * 1024)  /* bytes per slot (fits the 21-bit length field) */

/* Immediate data: a data write carries its slot and length and the
 * credits its sender owes the other way; a bare write carries credits and
 * its kind (credits only, a descriptor, or the end of a direct write).
 *   data: bit 31 = 0 | bits 26-30: credits | bits 21-25: slot | 0-20: length
 *   bare: bit 31 = 1 | bits 26-30: credits | bits 21-25: kind | 0-20: zero */
#define HORA_IB_IMM_BARE 0x80000000u
#define HORA_IB_IMM_CREDITS_SHIFT 26
#define HORA_IB_IMM_SLOT_SHIFT 21
#define HORA_IB_IMM_LEN_MASK 0x001fffffu
#define HORA_IB_IMM_FIELD_MASK 0x1fu
enum { HORA_IB_KIND_CREDIT = 0, HORA_IB_KIND_DESCRIPTOR = 1, HORA_IB_KIND_DIRECT_DONE = 2 };

struct hora__ib_imm {
  bool bare;
  uint32_t credits; /* slots of ours the peer has emptied */
  uint32_t slot;    /* data: the ring slot written */
  uint32_t len;     /* data: bytes in it */
  uint32_t kind;    /* bare: HORA_IB_KIND_* */
};

/* Where the receiving side of a connection stands. */
struct hora__ib_ring_state {
  uint32_t ring_head;  /* slots copied out so far */
  uint32_t ring_ready; /* slots arrived, not yet copied out */
  uint32_t credits;    /* the peer's slots we may still write */
};

/* Decodes the immediate of a write from rank `peer` and checks it against
 * the ring: a data write must fill the next slot in order, with at most
 * HORA_IB_SLOT bytes, while a slot is free; returned credits must not
 * exceed the ring; a bare write must be of a known kind. A violation is
 * HORA_ERR_PROTOCOL, naming the peer and what was wrong. */
int hora__ib_imm_decode(uint32_t imm, const struct hora__ib_ring_state *st, int peer,
                        struct hora__ib_imm *out);

/* The connection record: where the peer's queue pair, ring and descriptor
 * array are. Little-endian on the wire. */
#define HORA_IB_RECORD_MAGIC 0x48524942u /* "HRIB" */
#define HORA_IB_RECORD_SIZE 72

struct hora__ib_record {
  uint32_t qpn; /* 24 bits */
  uint32_t psn; /* 24 bits */
  uint16_t lid;
  uint8_t mtu;  /* enum ibv_mtu: 1 (256) to 5 (4096) */
  uint8_t gid[16];
  uint64_t ring_addr;
  uint32_t ring_rkey;
  uint32_t ctl_rkey;
  uint64_t ctl_addr;      /* the descriptor array this side reads */
  uint64_t zero_copy_min; /* HORA_IB_ZERO_COPY_MIN; the larger of the two applies */
};

void hora__ib_record_encode(const struct hora__ib_record *r, uint8_t out[HORA_IB_RECORD_SIZE]);
/* Checks every field (magic, 24-bit numbers, MTU, non-null addresses, a
 * non-zero threshold, zero padding); HORA_ERR_PROTOCOL naming rank `peer`
 * and the field otherwise. */
int hora__ib_record_decode(const uint8_t in[HORA_IB_RECORD_SIZE], int peer,
                           struct hora__ib_record *r);

#endif
