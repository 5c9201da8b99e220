/* Control connections: framed messages over a stream socket, with a
 * non-blocking send queue. The control plane (requests, responses, cycles,
 * heartbeats, aborts) runs over these. */
#ifndef HORA_CTRL_H
#define HORA_CTRL_H

#include "base/common.h"

typedef struct hora__ctrl hora__ctrl;

#define HORA_CTRL_MAX_FRAME (64u << 20)

hora__ctrl *hora__ctrl_new(int fd, int peer);
void hora__ctrl_free(hora__ctrl *c);
int hora__ctrl_fd(const hora__ctrl *c);
int hora__ctrl_peer(const hora__ctrl *c);
/* Queues one frame and writes what the socket takes now. */
int hora__ctrl_send(hora__ctrl *c, uint16_t type, const void *payload, size_t len);
/* Writes queued bytes without blocking. */
int hora__ctrl_flush(hora__ctrl *c);
bool hora__ctrl_has_output(const hora__ctrl *c);
/* Reads without blocking until the first frame is complete or nothing
 * more is there: parse it (hora__ctrl_next) before reading again. EOF or a
 * reset gives HORA_ERR_PEER_LOST, a malformed frame header
 * HORA_ERR_PROTOCOL (message recorded). */
int hora__ctrl_read(hora__ctrl *c);
/* Whether the last read emptied the socket (a short read or EAGAIN): a
 * read now would most likely find nothing. */
bool hora__ctrl_drained(const hora__ctrl *c);
/* Takes the next complete frame, if any: *got = false when none is complete.
 * The payload stays valid until the next call on this connection. A frame
 * longer than HORA_CTRL_MAX_FRAME is a protocol error. */
int hora__ctrl_next(hora__ctrl *c, bool *got, uint16_t *type, const uint8_t **payload,
                    size_t *len);
/* When bytes last came in, and when a frame was last queued out. */
uint64_t hora__ctrl_last_in(const hora__ctrl *c);
uint64_t hora__ctrl_last_out(const hora__ctrl *c);
/* Blocking send for shutdown paths: writes the frame within `timeout_s`. */
int hora__ctrl_send_blocking(hora__ctrl *c, uint16_t type, const void *payload, size_t len,
                             double timeout_s);


#endif
