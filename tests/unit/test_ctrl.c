/* Control connections over a socket pair: frames in pieces, a peer that
 * streams faster than frames are parsed, and malformed headers. */
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/transport/socket.h"
#include "runtime/negotiate/message.h"
#include "../runner.h"

struct streamer {
  int fd;
  size_t limit, sent;
};

/* Sends heartbeat frames (8-byte headers) until `limit` bytes or an error. */
static void *stream_frames(void *arg) {
  struct streamer *s = arg;
  uint8_t chunk[8 * 4096];
  for (size_t i = 0; i < sizeof(chunk); i += 8) {
    memcpy(chunk + i, (const uint8_t[8]){0, 0, 0, 0, HORA_MSG_HEARTBEAT, 0, 0, 0}, 8);
  }
  while (s->sent < s->limit) {
    ssize_t n = send(s->fd, chunk, sizeof(chunk), MSG_NOSIGNAL);
    if (n <= 0) {
      break;
    }
    s->sent += (size_t)n;
  }
  return NULL;
}

/* A reader that does not get to parse must not soak up what the peer
 * streams: each read stops at the first complete frame (it once read
 * everything the socket had, growing its buffer without bound). */
TEST(ctrl_read_is_bounded_while_the_peer_streams) {
  int sv[2];
  ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  ASSERT(hora__socket_nonblocking(sv[1]) == HORA_SUCCESS);
  hora__ctrl *c = hora__ctrl_new(sv[1], 1);
  ASSERT(c);
  struct streamer s = {.fd = sv[0], .limit = 32u << 20};
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, stream_frames, &s) == 0);
  int bad = HORA_SUCCESS;
  for (int i = 0; i < 200 && bad == HORA_SUCCESS; i++) {
    bad = hora__ctrl_read(c);
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  hora__ctrl_free(c); /* closes sv[1]: the streamer's send fails */
  pthread_join(t, NULL);
  close(sv[0]);
  ASSERT_EQ_INT(bad, HORA_SUCCESS);
  /* The socket's buffers and one read's worth, not the whole stream. */
  if (s.sent > (4u << 20)) {
    FAIL("the reader took %zu bytes without parsing a frame", s.sent);
  }
}

struct sender {
  int fd;
  size_t big;
  int rc;
};

static void *send_frames(void *arg) {
  struct sender *s = arg;
  hora__ctrl *c = hora__ctrl_new(s->fd, 0);
  uint8_t *big = malloc(s->big);
  for (size_t i = 0; i < s->big; i++) {
    big[i] = (uint8_t)(i * 7);
  }
  s->rc = hora__ctrl_send_blocking(c, 9, "abc", 3, 10.0);
  if (s->rc == HORA_SUCCESS) {
    s->rc = hora__ctrl_send_blocking(c, 10, big, s->big, 10.0);
  }
  if (s->rc == HORA_SUCCESS) {
    s->rc = hora__ctrl_send_blocking(c, 11, NULL, 0, 10.0);
  }
  free(big);
  hora__ctrl_free(c);
  return NULL;
}

/* Frames larger than any one read, and a small one on each side, arrive
 * whole and in order; then the EOF. */
TEST(ctrl_frames_arrive_whole_in_pieces) {
  int sv[2];
  ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  ASSERT(hora__socket_nonblocking(sv[0]) == HORA_SUCCESS);
  ASSERT(hora__socket_nonblocking(sv[1]) == HORA_SUCCESS);
  hora__ctrl *c = hora__ctrl_new(sv[1], 0);
  struct sender s = {.fd = sv[0], .big = 3u << 20};
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, send_frames, &s) == 0);
  int seen = 0, rc = HORA_SUCCESS, wrong = 0;
  while (rc == HORA_SUCCESS) {
    rc = hora__ctrl_read(c);
    for (;;) {
      bool got;
      uint16_t type;
      const uint8_t *p;
      size_t n;
      int prc = hora__ctrl_next(c, &got, &type, &p, &n);
      if (prc != HORA_SUCCESS) {
        rc = prc;
      }
      if (prc != HORA_SUCCESS || !got) {
        break;
      }
      if (seen == 0) {
        wrong += type != 9 || n != 3 || memcmp(p, "abc", 3) != 0;
      } else if (seen == 1) {
        wrong += type != 10 || n != s.big || p[12345] != (uint8_t)(12345 * 7) ||
                 p[n - 1] != (uint8_t)((n - 1) * 7);
      } else {
        wrong += type != 11 || n != 0;
      }
      seen++;
    }
    struct timespec us = {0, 100000};
    nanosleep(&us, NULL);
  }
  pthread_join(t, NULL);
  hora__ctrl_free(c);
  ASSERT_EQ_INT(s.rc, HORA_SUCCESS);
  ASSERT_EQ_INT(rc, HORA_ERR_PEER_LOST); /* the sender closed */
  ASSERT_EQ_INT(seen, 3);
  ASSERT_EQ_INT(wrong, 0);
}

/* A header naming a frame beyond the limit, or with flags set, is a
 * protocol error as soon as the header is in, before any payload. */
TEST(ctrl_refuses_malformed_headers) {
  static const uint8_t headers[][8] = {
      {0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0}, /* 4 GiB */
      {0x01, 0x00, 0x00, 0x04, 1, 0, 0, 0}, /* 64 MiB + 1 */
      {0x00, 0x00, 0x00, 0x00, 5, 0, 1, 0}, /* flags */
  };
  for (size_t i = 0; i < sizeof(headers) / sizeof(headers[0]); i++) {
    int sv[2];
    ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
    hora__ctrl *c = hora__ctrl_new(sv[1], 2);
    ASSERT(write(sv[0], headers[i], 8) == 8);
    int rc = hora__ctrl_read(c);
    char msg[256];
    snprintf(msg, sizeof(msg), "%s", hora__error_message());
    hora__ctrl_free(c);
    close(sv[0]);
    ASSERT_EQ_INT(rc, HORA_ERR_PROTOCOL);
    ASSERT_STR_CONTAINS(msg, "malformed control frame from rank 2");
  }
}
