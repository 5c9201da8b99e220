/* Socket helpers: interface choice and listeners (the handshake that admits
 * only processes of this job is handshake.c). */
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/transport/socket.h"

int hora__socket_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return hora__error_errno(HORA_ERR_SYSTEM, "fcntl(O_NONBLOCK) on socket %d", fd);
  }
  return HORA_SUCCESS;
}

/* HORA_TCP_CONGESTION_CONTROL on a TCP socket: the listener's is checked at start-up,
 * so a name the kernel refuses fails hora_init on every rank. */
static int set_congestion(int fd) {
  const char *cc = hora__params.TCP_CONGESTION_CONTROL;
  if (cc && cc[0] && setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, (socklen_t)strlen(cc)) < 0) {
    return hora__error_errno(HORA_ERR_INVALID_ARG,
                             "HORA_TCP_CONGESTION_CONTROL=%s: setsockopt(TCP_CONGESTION) (the kernel offers "
                             "those in /proc/sys/net/ipv4/tcp_available_congestion_control)", cc);
  }
  return HORA_SUCCESS;
}

int hora__socket_tune(int fd, bool tcp, int64_t bufsize) {
  int one = 1;
  if (tcp) {
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0) {
      return hora__error_errno(HORA_ERR_SYSTEM, "setsockopt(TCP_NODELAY)");
    }
    HORA_CHECK(set_congestion(fd));
  }
  if (bufsize > 0) {
    int b = (int)HORA_MIN(bufsize, (int64_t)1 << 30);
    /* The kernel caps these at net.core.[rw]mem_max; a smaller buffer is not an error. */
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof(b));
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof(b));
  }
  return HORA_SUCCESS;
}

int hora__choose_ipv4(const char *iface, bool single_host, struct in_addr *out, char *ifname,
                      size_t ifname_len) {
  if ((!iface || !iface[0]) && single_host) {
    out->s_addr = htonl(INADDR_LOOPBACK);
    hora__strlcpy(ifname, "lo", ifname_len);
    return HORA_SUCCESS;
  }
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) != 0) {
    return hora__error_errno(HORA_ERR_SYSTEM, "getifaddrs");
  }
  bool found = false;
  for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) {
      continue;
    }
    if (iface && iface[0]) {
      if (strcmp(i->ifa_name, iface) != 0) {
        continue;
      }
    } else if (i->ifa_flags & IFF_LOOPBACK) {
      continue;
    }
    *out = ((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr;
    hora__strlcpy(ifname, i->ifa_name, ifname_len);
    found = true;
  }
  freeifaddrs(ifs);
  if (!found) {
    if (iface && iface[0]) {
      return hora__error(HORA_ERR_INVALID_ARG,
                         "HORA_IFACE=%s: no such interface that is up and has an IPv4 address",
                         iface);
    }
    /* A machine with only loopback can still run a job of several "hosts"
     * inside it (containers sharing the network namespace). */
    out->s_addr = htonl(INADDR_LOOPBACK);
    hora__strlcpy(ifname, "lo", ifname_len);
  }
  return HORA_SUCCESS;
}

int hora__listen_tcp(struct in_addr addr, int *fd_out, struct sockaddr_in *bound) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    return hora__error_errno(HORA_ERR_SYSTEM, "socket(AF_INET)");
  }
  int crc = set_congestion(fd);
  if (crc != HORA_SUCCESS) {
    close(fd);
    return crc;
  }
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_addr = addr;
  sa.sin_port = 0;
  socklen_t len = sizeof(sa);
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &addr, ip, sizeof(ip));
  if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    int rc = hora__error_errno(HORA_ERR_SYSTEM, "bind(%s)", ip);
    close(fd);
    return rc;
  }
  if (listen(fd, SOMAXCONN) < 0 || getsockname(fd, (struct sockaddr *)&sa, &len) < 0) {
    int rc = hora__error_errno(HORA_ERR_SYSTEM, "listen(%s)", ip);
    close(fd);
    return rc;
  }
  *bound = sa;
  *fd_out = fd;
  return HORA_SUCCESS;
}

int hora__unix_address(const uint8_t key[HORA_SECRET_LEN], const char *job_id, int rank,
                       void *sun_out, unsigned *len) {
  struct sockaddr_un *sun = sun_out;
  memset(sun, 0, sizeof(*sun));
  sun->sun_family = AF_UNIX;
  /* Abstract namespace: no file to clean up, gone when the process is. The
   * tag comes from the key, which only the job's members know, so nobody
   * else can bind a rank's name before it does. */
  uint8_t in[16 + HORA_SECRET_LEN + 4], tag[SHA256_DIGEST_LENGTH];
  memcpy(in, "hora-unix-name-1", 16);
  memcpy(in + 16, key, HORA_SECRET_LEN);
  for (int i = 0; i < 4; i++) {
    in[16 + HORA_SECRET_LEN + i] = (uint8_t)((uint32_t)rank >> (8 * i));
  }
  SHA256(in, sizeof(in), tag);
  OPENSSL_cleanse(in, sizeof(in));
  int n = snprintf(sun->sun_path + 1, sizeof(sun->sun_path) - 1, "hora.%s.%d.", job_id, rank);
  for (int i = 0; i < 8; i++) {
    n += snprintf(sun->sun_path + 1 + n, sizeof(sun->sun_path) - 1 - (size_t)n, "%02x", tag[i]);
  }
  *len = (unsigned)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
  return HORA_SUCCESS;
}

int hora__listen_unix(const uint8_t key[HORA_SECRET_LEN], const char *job_id, int rank,
                      int *fd_out) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    return hora__error_errno(HORA_ERR_SYSTEM, "socket(AF_UNIX)");
  }
  struct sockaddr_un sun;
  unsigned len;
  hora__unix_address(key, job_id, rank, &sun, &len);
  if (bind(fd, (struct sockaddr *)&sun, len) < 0 || listen(fd, SOMAXCONN) < 0) {
    int rc = hora__error_errno(HORA_ERR_SYSTEM, "bind/listen on unix socket @%s", sun.sun_path + 1);
    close(fd);
    return rc;
  }
  *fd_out = fd;
  return HORA_SUCCESS;
}

int hora__accept_shed(int lfd, int *reserve_fd, struct sockaddr_storage *ss, socklen_t *len) {
  if (*reserve_fd < 0) {
    return -1;
  }
  close(*reserve_fd);
  int fd = accept4(lfd, (struct sockaddr *)ss, len, SOCK_CLOEXEC | SOCK_NONBLOCK);
  int got = fd >= 0 ? 0 : -1;
  if (fd >= 0) {
    close(fd);
  }
  *reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  return got;
}

bool hora__socket_is_self_connected(int fd) {
  struct sockaddr_storage a, b;
  socklen_t la = sizeof(a), lb = sizeof(b);
  if (getsockname(fd, (struct sockaddr *)&a, &la) != 0 ||
      getpeername(fd, (struct sockaddr *)&b, &lb) != 0 || la != lb) {
    return false;
  }
  if (a.ss_family == AF_INET) {
    const struct sockaddr_in *x = (const struct sockaddr_in *)&a, *y = (const struct sockaddr_in *)&b;
    return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
  }
  return false;
}
