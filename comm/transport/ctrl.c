/* Control connections: length-prefixed frames over a stream socket.
 *
 *   frame := u32 payload_length | u16 type | u16 zero | payload
 *
 * All integers little-endian. Writes never block: what the socket does not
 * take is queued and flushed when poll says it is writable. */
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/transport/ctrl.h"

#define FRAME_HEADER 8
#define CTRL_READ_CHUNK 65536 /* bytes asked of one recv() beyond the frame in hand */

struct hora__ctrl {
  int fd;
  int peer;
  uint64_t last_in_ns, last_out_ns; /* for heartbeats */
  uint8_t *in;
  size_t in_len, in_cap, in_off; /* parsed up to in_off */
  uint8_t *out;
  size_t out_len, out_off, out_cap;
  bool drained; /* the last read found the socket empty (a short read or EAGAIN) */
};

hora__ctrl *hora__ctrl_new(int fd, int peer) {
  hora__ctrl *c = hora__calloc(1, sizeof(*c));
  if (c) {
    c->fd = fd;
    c->peer = peer;
    c->last_in_ns = c->last_out_ns = hora__now_ns();
  }
  return c;
}

void hora__ctrl_free(hora__ctrl *c) {
  if (!c) {
    return;
  }
  if (c->fd >= 0) {
    close(c->fd);
  }
  free(c->in);
  free(c->out);
  free(c);
}

int hora__ctrl_fd(const hora__ctrl *c) { return c->fd; }
int hora__ctrl_peer(const hora__ctrl *c) { return c->peer; }
bool hora__ctrl_has_output(const hora__ctrl *c) { return c->out_off < c->out_len; }

static int reserve(uint8_t **buf, size_t *cap, size_t need) {
  if (need <= *cap) {
    return HORA_SUCCESS;
  }
  size_t n = *cap ? *cap : 4096;
  while (n < need) {
    n *= 2;
  }
  uint8_t *p = hora__realloc(*buf, n);
  if (!p) {
    return HORA_ERR_NO_MEMORY;
  }
  *buf = p;
  *cap = n;
  return HORA_SUCCESS;
}

int hora__ctrl_flush(hora__ctrl *c) {
  while (c->out_off < c->out_len) {
    ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
    if (n > 0) {
      c->out_off += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    }
    return hora__error_errno(HORA_ERR_PEER_LOST, "control connection to rank %d broke", c->peer);
  }
  if (c->out_off == c->out_len) {
    c->out_off = c->out_len = 0;
  }
  return HORA_SUCCESS;
}

int hora__ctrl_send(hora__ctrl *c, uint16_t type, const void *payload, size_t len) {
  if (len > HORA_CTRL_MAX_FRAME) {
    return hora__error(HORA_ERR_INVALID_ARG, "control message of %zu bytes is too large", len);
  }
  /* Compact before growing so a busy connection does not creep. */
  if (c->out_off > 0 && c->out_off == c->out_len) {
    c->out_off = c->out_len = 0;
  }
  HORA_CHECK(reserve(&c->out, &c->out_cap, c->out_len + FRAME_HEADER + len));
  uint8_t *h = c->out + c->out_len;
  uint32_t l = (uint32_t)len;
  h[0] = (uint8_t)l;
  h[1] = (uint8_t)(l >> 8);
  h[2] = (uint8_t)(l >> 16);
  h[3] = (uint8_t)(l >> 24);
  h[4] = (uint8_t)type;
  h[5] = (uint8_t)(type >> 8);
  h[6] = h[7] = 0;
  if (len) {
    memcpy(h + FRAME_HEADER, payload, len);
  }
  c->out_len += FRAME_HEADER + len;
  c->last_out_ns = hora__now_ns();
  return hora__ctrl_flush(c);
}

int hora__ctrl_send_blocking(hora__ctrl *c, uint16_t type, const void *payload, size_t len,
                             double timeout_s) {
  HORA_CHECK(hora__ctrl_send(c, type, payload, len));
  uint64_t deadline = hora__now_ns() + (uint64_t)(timeout_s * 1e9);
  while (hora__ctrl_has_output(c)) {
    uint64_t now = hora__now_ns();
    if (now >= deadline) {
      return hora__error(HORA_ERR_TIMEOUT, "control connection to rank %d: send timed out",
                         c->peer);
    }
    struct pollfd p = {.fd = c->fd, .events = POLLOUT};
    int ms = (int)((deadline - now) / 1000000) + 1;
    if (poll(&p, 1, ms) < 0 && errno != EINTR) {
      return hora__error_errno(HORA_ERR_SYSTEM, "poll");
    }
    HORA_CHECK(hora__ctrl_flush(c));
  }
  return HORA_SUCCESS;
}

/* The length of the frame at the head of the input, once its header is
 * there and valid: a bad header is refused before its payload is read. */
static int head_frame(const hora__ctrl *c, bool *have_header, size_t *total) {
  size_t avail = c->in_len - c->in_off;
  *have_header = avail >= FRAME_HEADER;
  if (!*have_header) {
    return HORA_SUCCESS;
  }
  const uint8_t *h = c->in + c->in_off;
  uint32_t l = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
  if (l > HORA_CTRL_MAX_FRAME || h[6] != 0 || h[7] != 0) {
    return hora__error(HORA_ERR_PROTOCOL,
                       "malformed control frame from rank %d (length %u of at most %u, flags "
                       "%u,%u)", c->peer, l, HORA_CTRL_MAX_FRAME, h[6], h[7]);
  }
  *total = FRAME_HEADER + (size_t)l;
  return HORA_SUCCESS;
}

/* Reads until the first frame is complete, or the socket has no more.
 * The caller parses that frame before the next read, so the buffer never
 * holds more than one frame and one read's worth of the next: a peer
 * streaming faster than we parse, or garbage, cannot grow it without
 * bound, and a bad header fails at once. */
int hora__ctrl_read(hora__ctrl *c) {
  c->drained = false;
  /* Drop what was parsed before reading more. */
  if (c->in_off > 0) {
    memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
    c->in_len -= c->in_off;
    c->in_off = 0;
  }
  /* A huge frame's buffer is not kept once it is parsed. */
  if (c->in_len == 0 && c->in_cap > CTRL_READ_CHUNK * 16) {
    free(c->in);
    c->in = NULL;
    c->in_cap = 0;
  }
  for (;;) {
    bool have_header;
    size_t total = 0;
    HORA_CHECK(head_frame(c, &have_header, &total));
    if (have_header && c->in_len >= total) {
      return HORA_SUCCESS; /* parse it first */
    }
    size_t want = have_header ? total - c->in_len : FRAME_HEADER - c->in_len;
    size_t room = HORA_MAX(want, (size_t)CTRL_READ_CHUNK);
    HORA_CHECK(reserve(&c->in, &c->in_cap, c->in_len + room));
    ssize_t n = recv(c->fd, c->in + c->in_len, room, 0);
    if (n > 0) {
      c->in_len += (size_t)n;
      c->last_in_ns = hora__now_ns();
      c->drained = (size_t)n < room;
      if ((size_t)n < room) {
        /* Short read: nothing more now, unless it completed a header. */
        HORA_CHECK(head_frame(c, &have_header, &total));
        return HORA_SUCCESS;
      }
      continue;
    }
    if (n == 0) {
      errno = 0;
      return hora__error(HORA_ERR_PEER_LOST, "control connection to rank %d closed", c->peer);
    }
    if (errno == EINTR) {
      continue;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      c->drained = true;
      return HORA_SUCCESS;
    }
    return hora__error_errno(HORA_ERR_PEER_LOST, "control connection to rank %d broke", c->peer);
  }
}

int hora__ctrl_next(hora__ctrl *c, bool *got, uint16_t *type, const uint8_t **payload,
                    size_t *len) {
  *got = false;
  bool have_header;
  size_t total = 0;
  HORA_CHECK(head_frame(c, &have_header, &total));
  if (!have_header || c->in_len - c->in_off < total) {
    return HORA_SUCCESS;
  }
  const uint8_t *h = c->in + c->in_off;
  *type = (uint16_t)(h[4] | h[5] << 8);
  *payload = h + FRAME_HEADER;
  *len = total - FRAME_HEADER;
  c->in_off += total;
  *got = true;
  return HORA_SUCCESS;
}

bool hora__ctrl_drained(const hora__ctrl *c) { return c->drained; }

uint64_t hora__ctrl_last_in(const hora__ctrl *c) { return c->last_in_ns; }
uint64_t hora__ctrl_last_out(const hora__ctrl *c) { return c->last_out_ns; }
