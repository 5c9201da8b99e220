/* Stream sockets: options, the address to listen on, listeners. */
#ifndef HORA_SOCKET_H
#define HORA_SOCKET_H

#include <netinet/in.h>
#include <sys/socket.h>

#include "base/common.h"
#include "comm/transport/handshake.h"

int hora__socket_nonblocking(int fd);
int hora__socket_tune(int fd, bool tcp, int64_t bufsize);
/* A connect to a port nobody listens on, retried, can meet itself: Linux
 * picks the same port as the source, and TCP's simultaneous open connects
 * the socket to itself. Such a connection is no peer. */
bool hora__socket_is_self_connected(int fd);
int hora__choose_ipv4(const char *iface, bool single_host, struct in_addr *out, char *ifname,
                      size_t ifname_len);
int hora__listen_tcp(struct in_addr addr, int *fd, struct sockaddr_in *bound);
/* A rank's Unix listener: its abstract name holds a tag derived from key
 * (the job's connection key), so only members can name it beforehand. */
int hora__listen_unix(const uint8_t key[HORA_SECRET_LEN], const char *job_id, int rank, int *fd);
int hora__unix_address(const uint8_t key[HORA_SECRET_LEN], const char *job_id, int rank,
                       void *sun, unsigned *len);
/* accept() failed with EMFILE/ENFILE: gives up the spare descriptor
 * *reserve_fd for a moment to accept one pending connection and close it at
 * once, so the listener's queue shrinks instead of poll() reporting it ready
 * forever. 0 when one was shed (its address in *ss), -1 when there was no
 * spare or nothing to accept. */
struct sockaddr_storage;
int hora__accept_shed(int lfd, int *reserve_fd, struct sockaddr_storage *ss, socklen_t *len);


#endif
