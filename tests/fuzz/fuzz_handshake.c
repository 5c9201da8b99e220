/* The bootstrap handshake's state machine (comm/handshake.c), driven from
 * bytes, no sockets. The first input byte picks a mode:
 *   0  a stranger talks to an acceptor: the rest of the input is what it
 *      sends, in pieces whose sizes the input also gives. The acceptor must
 *      never take it for a rank (it cannot know the secret).
 *   1  a stranger answers a connector: likewise, the connector must never
 *      take it for its peer.
 *   2  a real connector and acceptor talk through a wire the input
 *      tampers with (byte positions to flip, piece sizes): they both finish
 *      exactly when nothing was changed, and an acceptor that finishes knows
 *      the connector's true rank and kind. (That the secret never appears
 *      on the wire is a unit test: here the input chooses the nonces.) */
#include <string.h>

#include "comm/comm.h"
#include "comm/transport/socket.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint8_t secret[HORA_SECRET_LEN] = {0x5e, 0xc2, 0xe7, 1, 2, 3, 4, 5, 6, 7, 8, 9};

static bool live(const struct hora__hs *hs) {
  return hs->state == HORA_HS_SEND || hs->state == HORA_HS_RECV;
}

/* Checks each state's invariants after every step. */
static void check(const struct hora__hs *hs) {
  if (hs->done > hs->len || hs->len > sizeof(hs->buf)) {
    __builtin_trap();
  }
  if (hs->state == HORA_HS_DONE && !hs->authenticated) {
    __builtin_trap();
  }
  if (hs->claimed &&
      (hs->peer < 0 || hs->peer >= hs->size || hs->kind < 1 || hs->kind > hs->kinds)) {
    __builtin_trap();
  }
}

/* The stranger's bytes go in, in pieces; what the machine sends is taken. */
static void against_stranger(struct hora__hs *hs, const uint8_t *data, size_t size) {
  size_t off = 0;
  while (live(hs) && off < size) {
    uint8_t *p;
    size_t n;
    hora__hs_io(hs, &p, &n);
    if (hs->state == HORA_HS_SEND) {
      hora__hs_advance(hs, n);
    } else {
      size_t piece = (size_t)data[off++] % 80 + 1;
      piece = piece < n ? piece : n;
      piece = piece < size - off ? piece : size - off;
      memcpy(p, data + off, piece);
      off += piece;
      hora__hs_advance(hs, piece);
    }
    check(hs);
  }
  if (hs->authenticated || hs->state == HORA_HS_DONE) {
    __builtin_trap(); /* someone without the secret got in */
  }
}

static void tampered_wire(const uint8_t *data, size_t size) {
  if (size < 2 * HORA_HS_NONCE_LEN + 3) {
    return;
  }
  struct hora__hs c, a;
  int crank = 1 + data[0] % 15, arank = data[1] % crank, kind = 1 + data[2] % HORA_CONN_SLOTS;
  hora__hs_connector(&c, secret, 16, HORA_CONN_SLOTS, crank, arank, kind, data + 3);
  hora__hs_acceptor(&a, secret, 16, HORA_CONN_SLOTS, arank, data + 3 + HORA_HS_NONCE_LEN);
  data += 3 + 2 * HORA_HS_NONCE_LEN;
  size -= 3 + 2 * HORA_HS_NONCE_LEN;
  /* The rest: pairs (position on the wire, xor), then nothing. */
  size_t wire_pos = 0, off = 0;
  bool tampered = false;
  for (int guard = 0; guard < 64 && (live(&c) || live(&a)); guard++) {
    struct hora__hs *from = c.state == HORA_HS_SEND ? &c : a.state == HORA_HS_SEND ? &a : NULL;
    struct hora__hs *to = from == &c ? &a : &c;
    if (!from || to->state != HORA_HS_RECV) {
      break;
    }
    uint8_t *src, *dst;
    size_t ns, nd;
    hora__hs_io(from, &src, &ns);
    hora__hs_io(to, &dst, &nd);
    size_t n = ns < nd ? ns : nd;
    memcpy(dst, src, n);
    for (size_t i = 0; i < n; i++) {
      if (off + 1 < size && data[off] == (uint8_t)(wire_pos + i) && data[off + 1] != 0) {
        dst[i] ^= data[off + 1];
        tampered = true;
        off += 2;
      }
    }
    wire_pos += n;
    hora__hs_advance(from, n);
    hora__hs_advance(to, n);
    check(&c);
    check(&a);
  }
  bool both = c.state == HORA_HS_DONE && a.state == HORA_HS_DONE;
  if (both == tampered) {
    __builtin_trap(); /* a change went unnoticed, or an honest exchange failed */
  }
  if (a.authenticated && (a.peer != crank || a.kind != kind)) {
    __builtin_trap();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 + HORA_HS_NONCE_LEN) {
    return 0;
  }
  int mode = data[0] % 3;
  const uint8_t *nonce = data + 1;
  data += 1 + HORA_HS_NONCE_LEN;
  size -= 1 + HORA_HS_NONCE_LEN;
  struct hora__hs hs;
  switch (mode) {
    case 0:
      hora__hs_acceptor(&hs, secret, 16, HORA_CONN_SLOTS, 0, nonce);
      against_stranger(&hs, data, size);
      break;
    case 1:
      hora__hs_connector(&hs, secret, 16, HORA_CONN_SLOTS, 3, 0, HORA_CONN_DATA, nonce);
      against_stranger(&hs, data, size);
      break;
    default:
      tampered_wire(data, size);
  }
  return 0;
}
