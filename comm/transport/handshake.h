/* The handshake every bootstrap connection opens with: a challenge-response
 * over fresh nonces of both sides, HMAC-SHA-256 keyed by the job secret, so
 * that each side proves it knows the secret without it ever crossing the
 * wire. Pure bytes in, bytes out (no sockets), so it can be unit-tested and
 * fuzzed on its own; comm/bootstrap moves the bytes.
 *
 *   connector -> acceptor  hello      magic, version|kind, rank, size, nonce_c   48 bytes
 *   acceptor -> connector  challenge  magic, rank, nonce_a, MAC_A                72 bytes
 *   connector -> acceptor  proof      MAC_C                                      32 bytes
 *   acceptor -> connector  ack        "HOK!"                                      4 bytes
 *
 * MAC_X = HMAC-SHA-256(secret, "hora-handshake-2" | X | kind | connector rank
 *                      | acceptor rank | size | nonce_c | nonce_a)
 * with X the role ('A' for what the acceptor sends, 'C' for the connector).
 * Both nonces are in both MACs: a recorded proof is worthless against a new
 * nonce, and the role letter keeps an acceptor's MAC from serving as a
 * connector's proof (reflection). The ranks and kind are in them too, so a
 * proof for one connection cannot open another. */
#ifndef HORA_HANDSHAKE_H
#define HORA_HANDSHAKE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/transport/transport.h"

#define HORA_SECRET_LEN 32

/* The kinds of bootstrap connection (the hello names one). */
enum hora__conn_kind { HORA_CONN_CTRL = 1, HORA_CONN_DATA = 2, HORA_CONN_CROSS = 3 };
#define HORA_CONN_KINDS 3
/* On the wire a connection's kind also names which of a TCP connection's
 * sockets it is: kind + HORA_CONN_KINDS * socket index. */
#define HORA_CONN_SLOTS (HORA_CONN_KINDS * HORA_TCP_STREAMS_MAX)

#define HORA_HELLO_MAGIC 0x41524f48u /* "HORA" */
/* The control protocol's version: 3 since requests carry shapes and
 * response tensors a shape fingerprint, so mixed builds fail at hello. */
#define HORA_HELLO_VERSION 3
#define HORA_HS_NONCE_LEN 32
#define HORA_HS_MAC_LEN 32
#define HORA_HELLO_WIRE_SIZE 48
#define HORA_HS_CHALLENGE_SIZE 72
#define HORA_HS_PROOF_SIZE HORA_HS_MAC_LEN
#define HORA_HS_ACK_SIZE 4
#define HORA_HS_ACK_WORD 0x214b4f48u /* "HOK!" */

/* The first message: who the connector says it is, and its nonce. It is
 * public: it proves nothing. */
struct hora__hello {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;
  int32_t rank;
  int32_t size;
  uint8_t nonce[HORA_HS_NONCE_LEN];
};

void hora__hello_encode(const struct hora__hello *h, uint8_t out[HORA_HELLO_WIRE_SIZE]);
/* Checks the shape of a received hello against a job of `size` ranks and
 * `kinds` connection kinds; fills *h. On failure returns
 * HORA_ERR_INVALID_ARG with the reason (for the refusal log). */
int hora__hello_decode(const uint8_t in[HORA_HELLO_WIRE_SIZE], int size, int kinds,
                       struct hora__hello *h);

enum hora__hs_state {
  HORA_HS_SEND,   /* hora__hs_io gives bytes to send */
  HORA_HS_RECV,   /* hora__hs_io gives room for bytes to receive */
  HORA_HS_DONE,   /* both sides authenticated (and the ack moved) */
  HORA_HS_FAILED, /* why says why; close the connection */
};

struct hora__hs {
  enum hora__hs_state state;
  bool connector;
  bool claimed;       /* acceptor: the hello came, peer and kind are known */
  bool authenticated; /* the peer proved the secret (acceptor: before the ack) */
  int step;           /* message being moved: 0 hello, 1 challenge, 2 proof, 3 ack */
  int rank, peer, size, kinds, kind;
  const uint8_t *secret; /* HORA_SECRET_LEN bytes, the caller's */
  const uint8_t *const *secrets; /* acceptor: one per kind, or NULL */
  uint8_t nonce_c[HORA_HS_NONCE_LEN], nonce_a[HORA_HS_NONCE_LEN];
  uint8_t buf[HORA_HS_CHALLENGE_SIZE];
  size_t len, done; /* bytes of buf this message has, bytes moved so far */
  char why[160];
};

/* The side that connects: rank to peer, for a connection of `kind` (1 to
 * kinds), with a fresh random nonce. */
void hora__hs_connector(struct hora__hs *hs, const uint8_t secret[HORA_SECRET_LEN], int size,
                        int kinds, int rank, int peer, int kind,
                        const uint8_t nonce[HORA_HS_NONCE_LEN]);
/* The side that accepted: learns peer and kind from the hello. */
void hora__hs_acceptor(struct hora__hs *hs, const uint8_t secret[HORA_SECRET_LEN], int size,
                       int kinds, int rank, const uint8_t nonce[HORA_HS_NONCE_LEN]);
/* An acceptor whose connections of kind k prove secrets[k - 1]. */
void hora__hs_acceptor_keys(struct hora__hs *hs, const uint8_t *const *secrets, int size, int kinds,
                            int rank, const uint8_t nonce[HORA_HS_NONCE_LEN]);
/* Where the next bytes go (RECV) or come from (SEND): *n bytes at *p. */
void hora__hs_io(struct hora__hs *hs, uint8_t **p, size_t *n);
/* n of those bytes were moved; a completed message is checked at once. */
void hora__hs_advance(struct hora__hs *hs, size_t n);
/* Fails the handshake from outside (the caller's own checks). */
void hora__hs_fail(struct hora__hs *hs, const char *why);

/* The MAC of the handshake for role 'A' or 'C' (exposed for the tests). */
void hora__hs_mac(const uint8_t secret[HORA_SECRET_LEN], char role, int kind, int connector,
                  int acceptor, int size, const uint8_t nonce_c[HORA_HS_NONCE_LEN],
                  const uint8_t nonce_a[HORA_HS_NONCE_LEN], uint8_t out[HORA_HS_MAC_LEN]);

#endif
