/* The in-process transport, for unit tests of everything above the
 * transports (progress, rings, the collectives, the cycle protocol) with
 * neither MPI nor sockets. Connections come in linked pairs whose ends may
 * be driven by different threads, one per simulated rank. */
#ifndef HORA_TRANSPORT_MOCK_H
#define HORA_TRANSPORT_MOCK_H

#include "comm/transport/transport.h"

/* Links rank_a and rank_b: *a is rank_a's end (its peer is rank_b), *b
 * rank_b's. Bytes move only in progress, at most `piece` bytes (0: any
 * number) per call and direction, so that transfers complete in parts.
 * The other end reads a send's bytes (until the send is done or this end
 * is closed) but never touches this end's hora__xfer descriptors. A send
 * the other end has taken in full is done, even if it has closed since. */
int hora__mock_pair(int rank_a, int rank_b, size_t piece, hora__conn **a, hora__conn **b);
/* Breaks the link as a lost peer would: both ends then fail with
 * HORA_ERR_PEER_LOST once they have transfers to move. */
void hora__mock_break(hora__conn *end);

#endif
