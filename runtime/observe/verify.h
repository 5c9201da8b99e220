/* HORA_VERIFY: an end-to-end check that every rank holds the same result
 * after each collective, so that silent corruption (a bad NIC, a bad DIMM,
 * a bug in a transport) becomes an error instead of a diverging model. */
#ifndef HORA_RUNTIME_VERIFY_H
#define HORA_RUNTIME_VERIFY_H

#include "comm/coll/collectives.h"

/* A 64-bit checksum of the bytes of n buffers, read as one stream. Not
 * cryptographic: it catches flipped bits and torn chunks, at memory speed. */
uint64_t hora__checksum(const struct hora__iov *v, int n);

/* Compares this rank's checksum of `out` with every other rank's (an
 * allgather of 8 bytes each). `what` names the operation in the error.
 * Returns HORA_ERR_CORRUPT, naming the ranks that disagree with the
 * majority, or HORA_SUCCESS. Every rank reaches the same verdict. */
int hora__verify_result(hora__comm *c, const struct hora__iov *out, int n, const char *what);

#endif
