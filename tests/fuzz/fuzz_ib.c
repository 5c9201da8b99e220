/* The RDMA wire formats: a connection record from the first bytes, then
 * the rest as a stream of immediates against a ring that the receiver
 * empties as the input says. Whatever is accepted must stay inside the
 * ring: a slot of the 16, at most a slot's bytes, credits within the ring. */
#include "comm/transport/ib/ib_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size >= HORA_IB_RECORD_SIZE) {
    struct hora__ib_record r;
    if (hora__ib_record_decode(data, 1, &r) == HORA_SUCCESS) {
      uint8_t again[HORA_IB_RECORD_SIZE];
      hora__ib_record_encode(&r, again);
      if (memcmp(again, data, HORA_IB_RECORD_SIZE) != 0 || r.qpn == 0 || r.qpn > 0xffffff ||
          r.mtu < 1 || r.mtu > 5 || !r.ring_addr || !r.ctl_addr || !r.zero_copy_min) {
        __builtin_trap();
      }
    }
    data += HORA_IB_RECORD_SIZE;
    size -= HORA_IB_RECORD_SIZE;
  }
  /* credits: what we may write to the peer; slots_out is what we wrote
   * and it has not yet returned (credits + slots_out == 16 always). */
  struct hora__ib_ring_state st = {.ring_head = 0, .ring_ready = 0, .credits = 0};
  uint32_t ring_len[HORA_IB_SLOTS] = {0};
  for (size_t i = 0; i + 5 <= size; i += 5) {
    uint32_t imm = (uint32_t)data[i] | (uint32_t)data[i + 1] << 8 | (uint32_t)data[i + 2] << 16 |
                   (uint32_t)data[i + 3] << 24;
    uint8_t act = data[i + 4];
    struct hora__ib_imm m;
    if (hora__ib_imm_decode(imm, &st, 2, &m) == HORA_SUCCESS) {
      if (st.credits + m.credits > HORA_IB_SLOTS) {
        __builtin_trap();
      }
      st.credits += m.credits;
      if (!m.bare) {
        if (m.slot >= HORA_IB_SLOTS || m.len > HORA_IB_SLOT || st.ring_ready >= HORA_IB_SLOTS ||
            m.slot != (st.ring_head + st.ring_ready) % HORA_IB_SLOTS) {
          __builtin_trap();
        }
        ring_len[m.slot] = m.len;
        st.ring_ready++;
      } else if (m.kind > HORA_IB_KIND_DIRECT_DONE) {
        __builtin_trap();
      }
    }
    /* The receiver copies slots out, and we write to the peer. */
    if ((act & 1) && st.ring_ready > 0) {
      if (ring_len[st.ring_head % HORA_IB_SLOTS] > HORA_IB_SLOT) {
        __builtin_trap();
      }
      st.ring_head++;
      st.ring_ready--;
    }
    if ((act & 2) && st.credits > 0) {
      st.credits--;
    }
  }
  return 0;
}
