/* LD_PRELOAD library for benchmarks: every TCP socket the process makes gets
 * the congestion control named by TCP_CONGESTION_PRELOAD (e.g. cubic), so that
 * programs without a setting of their own for it (Open MPI's TCP transport,
 * hora-bench-floor) run under the same one as hora's
 * HORA_TCP_CONGESTION_CONTROL. scripts/scale-bench.sh builds and uses it:
 *   cc -shared -fPIC -o tcpcc.so scripts/tcp-congestion-preload.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

int socket(int domain, int type, int protocol) {
  static int (*real_socket)(int, int, int);
  if (!real_socket) {
    real_socket = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
  }
  int fd = real_socket(domain, type, protocol);
  const char *cc = getenv("TCP_CONGESTION_PRELOAD");
  if (fd >= 0 && cc && cc[0] && (domain == AF_INET || domain == AF_INET6) &&
      (type & 0xff) == SOCK_STREAM &&
      setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, (socklen_t)strlen(cc)) < 0) {
    /* Said for each such socket: a benchmark must not run under another one unnoticed. */
    perror("tcp-congestion-preload: setsockopt(TCP_CONGESTION)");
  }
  return fd;
}
