/* The bootstrap handshake as a state machine over bytes (see handshake.h
 * for the messages and what the MACs cover). */
#include "comm/transport/handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"

static void put32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

static uint32_t get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void hora__hello_encode(const struct hora__hello *h, uint8_t out[HORA_HELLO_WIRE_SIZE]) {
  put32(out, h->magic);
  put32(out + 4, (uint32_t)h->version | (uint32_t)h->kind << 16);
  put32(out + 8, (uint32_t)h->rank);
  put32(out + 12, (uint32_t)h->size);
  memcpy(out + 16, h->nonce, HORA_HS_NONCE_LEN);
}

int hora__hello_decode(const uint8_t in[HORA_HELLO_WIRE_SIZE], int size, int kinds,
                       struct hora__hello *h) {
  h->magic = get32(in);
  uint32_t vk = get32(in + 4);
  h->version = (uint16_t)vk;
  h->kind = (uint16_t)(vk >> 16);
  h->rank = (int32_t)get32(in + 8);
  h->size = (int32_t)get32(in + 12);
  memcpy(h->nonce, in + 16, HORA_HS_NONCE_LEN);
  if (h->magic != HORA_HELLO_MAGIC) {
    return hora__error(HORA_ERR_INVALID_ARG, "not a hora handshake (magic 0x%08x)", h->magic);
  }
  if (h->version != HORA_HELLO_VERSION) {
    return hora__error(HORA_ERR_INVALID_ARG, "handshake version %u, expected %u", h->version,
                       HORA_HELLO_VERSION);
  }
  if (h->size != size || h->rank < 0 || h->rank >= size) {
    return hora__error(HORA_ERR_INVALID_ARG, "rank %d of %d does not fit this job of %d ranks",
                       h->rank, h->size, size);
  }
  if (h->kind < 1 || h->kind > kinds) {
    return hora__error(HORA_ERR_INVALID_ARG, "unknown connection kind %u", h->kind);
  }
  return HORA_SUCCESS;
}

void hora__hs_mac(const uint8_t secret[HORA_SECRET_LEN], char role, int kind, int connector,
                  int acceptor, int size, const uint8_t nonce_c[HORA_HS_NONCE_LEN],
                  const uint8_t nonce_a[HORA_HS_NONCE_LEN], uint8_t out[HORA_HS_MAC_LEN]) {
  static const char label[16] = "hora-handshake-2";
  uint8_t msg[sizeof(label) + 1 + 4 * 4 + 2 * HORA_HS_NONCE_LEN], *p = msg;
  memcpy(p, label, sizeof(label));
  p += sizeof(label);
  *p++ = (uint8_t)role;
  put32(p, (uint32_t)kind);
  put32(p + 4, (uint32_t)connector);
  put32(p + 8, (uint32_t)acceptor);
  put32(p + 12, (uint32_t)size);
  p += 16;
  memcpy(p, nonce_c, HORA_HS_NONCE_LEN);
  memcpy(p + HORA_HS_NONCE_LEN, nonce_a, HORA_HS_NONCE_LEN);
  unsigned int n = HORA_HS_MAC_LEN;
  if (!HMAC(EVP_sha256(), secret, HORA_SECRET_LEN, msg, sizeof(msg), out, &n) ||
      n != HORA_HS_MAC_LEN) {
    /* Cannot happen with a working libcrypto; a MAC of zeros only makes
     * the handshake fail, never pass, since the other side computes it
     * properly. */
    memset(out, 0, HORA_HS_MAC_LEN);
  }
}

static void expect(struct hora__hs *hs, int step, size_t len) {
  hs->state = HORA_HS_RECV;
  hs->step = step;
  hs->len = len;
  hs->done = 0;
}

static void emit(struct hora__hs *hs, int step, size_t len) {
  hs->state = HORA_HS_SEND;
  hs->step = step;
  hs->len = len;
  hs->done = 0;
}

void hora__hs_fail(struct hora__hs *hs, const char *why) {
  if (hs->state != HORA_HS_FAILED) {
    hora__strlcpy(hs->why, why, sizeof(hs->why));
  }
  hs->state = HORA_HS_FAILED;
  hs->authenticated = false;
}

void hora__hs_connector(struct hora__hs *hs, const uint8_t secret[HORA_SECRET_LEN], int size,
                        int kinds, int rank, int peer, int kind,
                        const uint8_t nonce[HORA_HS_NONCE_LEN]) {
  memset(hs, 0, sizeof(*hs));
  hs->connector = true;
  hs->secret = secret;
  hs->size = size;
  hs->kinds = kinds;
  hs->rank = rank;
  hs->peer = peer;
  hs->kind = kind;
  memcpy(hs->nonce_c, nonce, HORA_HS_NONCE_LEN);
  struct hora__hello h = {.magic = HORA_HELLO_MAGIC,
                          .version = HORA_HELLO_VERSION,
                          .kind = (uint16_t)kind,
                          .rank = rank,
                          .size = size};
  memcpy(h.nonce, nonce, HORA_HS_NONCE_LEN);
  hora__hello_encode(&h, hs->buf);
  emit(hs, 0, HORA_HELLO_WIRE_SIZE);
}

void hora__hs_acceptor(struct hora__hs *hs, const uint8_t secret[HORA_SECRET_LEN], int size,
                       int kinds, int rank, const uint8_t nonce[HORA_HS_NONCE_LEN]) {
  memset(hs, 0, sizeof(*hs));
  hs->secret = secret;
  hs->size = size;
  hs->kinds = kinds;
  hs->rank = rank;
  hs->peer = -1;
  memcpy(hs->nonce_a, nonce, HORA_HS_NONCE_LEN);
  expect(hs, 0, HORA_HELLO_WIRE_SIZE);
}

void hora__hs_acceptor_keys(struct hora__hs *hs, const uint8_t *const *secrets, int size, int kinds,
                            int rank, const uint8_t nonce[HORA_HS_NONCE_LEN]) {
  hora__hs_acceptor(hs, secrets[0], size, kinds, rank, nonce);
  hs->secrets = secrets;
}

void hora__hs_io(struct hora__hs *hs, uint8_t **p, size_t *n) {
  if (hs->state != HORA_HS_SEND && hs->state != HORA_HS_RECV) {
    *p = hs->buf;
    *n = 0;
    return;
  }
  *p = hs->buf + hs->done;
  *n = hs->len - hs->done;
}

/* A whole message has come in: check it and queue the answer. */
static void received(struct hora__hs *hs) {
  char why[160];
  uint8_t mac[HORA_HS_MAC_LEN];
  switch (hs->step) {
    case 0: { /* acceptor: the hello */
      struct hora__hello h;
      if (hora__hello_decode(hs->buf, hs->size, hs->kinds, &h) != HORA_SUCCESS) {
        hora__hs_fail(hs, hora__error_message());
        return;
      }
      hs->peer = h.rank;
      hs->kind = h.kind;
      hs->claimed = true;
      if (hs->secrets) {
        hs->secret = hs->secrets[h.kind - 1]; /* each kind proves its own key */
      }
      memcpy(hs->nonce_c, h.nonce, HORA_HS_NONCE_LEN);
      put32(hs->buf, HORA_HELLO_MAGIC);
      put32(hs->buf + 4, (uint32_t)hs->rank);
      memcpy(hs->buf + 8, hs->nonce_a, HORA_HS_NONCE_LEN);
      hora__hs_mac(hs->secret, 'A', hs->kind, hs->peer, hs->rank, hs->size, hs->nonce_c,
                   hs->nonce_a, hs->buf + 8 + HORA_HS_NONCE_LEN);
      emit(hs, 1, HORA_HS_CHALLENGE_SIZE);
      return;
    }
    case 1: { /* connector: the challenge, with the acceptor's proof */
      uint32_t magic = get32(hs->buf);
      int rank = (int)get32(hs->buf + 4);
      if (magic != HORA_HELLO_MAGIC) {
        snprintf(why, sizeof(why), "answered the handshake with garbage (magic 0x%08x)", magic);
        hora__hs_fail(hs, why);
        return;
      }
      if (rank != hs->peer) {
        snprintf(why, sizeof(why), "answered as rank %d on rank %d's address", rank, hs->peer);
        hora__hs_fail(hs, why);
        return;
      }
      memcpy(hs->nonce_a, hs->buf + 8, HORA_HS_NONCE_LEN);
      hora__hs_mac(hs->secret, 'A', hs->kind, hs->rank, hs->peer, hs->size, hs->nonce_c,
                   hs->nonce_a, mac);
      if (CRYPTO_memcmp(mac, hs->buf + 8 + HORA_HS_NONCE_LEN, HORA_HS_MAC_LEN) != 0) {
        hora__hs_fail(hs, "answered without proof of the job secret");
        return;
      }
      hs->authenticated = true;
      hora__hs_mac(hs->secret, 'C', hs->kind, hs->rank, hs->peer, hs->size, hs->nonce_c,
                   hs->nonce_a, hs->buf);
      emit(hs, 2, HORA_HS_PROOF_SIZE);
      return;
    }
    case 2: /* acceptor: the connector's proof */
      hora__hs_mac(hs->secret, 'C', hs->kind, hs->peer, hs->rank, hs->size, hs->nonce_c,
                   hs->nonce_a, mac);
      if (CRYPTO_memcmp(mac, hs->buf, HORA_HS_MAC_LEN) != 0) {
        snprintf(why, sizeof(why), "no proof of the job secret (claimed rank %d)", hs->peer);
        hora__hs_fail(hs, why);
        return;
      }
      hs->authenticated = true;
      put32(hs->buf, HORA_HS_ACK_WORD);
      emit(hs, 3, HORA_HS_ACK_SIZE);
      return;
    case 3: /* connector: the ack */
      if (get32(hs->buf) != HORA_HS_ACK_WORD) {
        hora__hs_fail(hs, "answered the proof with garbage");
        return;
      }
      hs->state = HORA_HS_DONE;
      return;
    default:
      hora__hs_fail(hs, "handshake out of step");
  }
}

void hora__hs_advance(struct hora__hs *hs, size_t n) {
  if (hs->state != HORA_HS_SEND && hs->state != HORA_HS_RECV) {
    return;
  }
  if (n > hs->len - hs->done) {
    hora__hs_fail(hs, "handshake moved more bytes than asked");
    return;
  }
  hs->done += n;
  if (hs->done < hs->len) {
    return;
  }
  if (hs->state == HORA_HS_RECV) {
    received(hs);
    return;
  }
  /* A message went out: what comes next. */
  switch (hs->step) {
    case 0:
      expect(hs, 1, HORA_HS_CHALLENGE_SIZE);
      break;
    case 1:
      expect(hs, 2, HORA_HS_PROOF_SIZE);
      break;
    case 2:
      expect(hs, 3, HORA_HS_ACK_SIZE);
      break;
    default:
      hs->state = HORA_HS_DONE;
      break;
  }
}
