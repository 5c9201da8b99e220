/* Socket helpers: interface choice, listeners, and the connection handshake
 * that admits only processes of this job. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "../runtime/log.h"
#include "comm.h"

int hora__socket_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return hora__error_errno(HORA_ERR_SYSTEM, "fcntl(O_NONBLOCK) on socket %d", fd);
  }
  return HORA_SUCCESS;
}

int hora__socket_tune(int fd, bool tcp, int64_t bufsize) {
  int one = 1;
  if (tcp && setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0) {
    return hora__error_errno(HORA_ERR_SYSTEM, "setsockopt(TCP_NODELAY)");
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

int hora__unix_address(const char *job_id, int rank, void *sun_out, unsigned *len) {
  struct sockaddr_un *sun = sun_out;
  memset(sun, 0, sizeof(*sun));
  sun->sun_family = AF_UNIX;
  /* Abstract namespace: no file to clean up, gone when the process is. */
  int n = snprintf(sun->sun_path + 1, sizeof(sun->sun_path) - 1, "hora.%s.%d", job_id, rank);
  *len = (unsigned)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
  return HORA_SUCCESS;
}

int hora__listen_unix(const char *job_id, int rank, int *fd_out) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    return hora__error_errno(HORA_ERR_SYSTEM, "socket(AF_UNIX)");
  }
  struct sockaddr_un sun;
  unsigned len;
  hora__unix_address(job_id, rank, &sun, &len);
  if (bind(fd, (struct sockaddr *)&sun, len) < 0 || listen(fd, SOMAXCONN) < 0) {
    int rc = hora__error_errno(HORA_ERR_SYSTEM, "bind/listen on unix socket @%s", sun.sun_path + 1);
    close(fd);
    return rc;
  }
  *fd_out = fd;
  return HORA_SUCCESS;
}

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
  memcpy(out + 16, h->secret, HORA_SECRET_LEN);
}

int hora__hello_decode(const uint8_t in[HORA_HELLO_WIRE_SIZE], const uint8_t *secret, int size,
                       struct hora__hello *h) {
  h->magic = get32(in);
  uint32_t vk = get32(in + 4);
  h->version = (uint16_t)vk;
  h->kind = (uint16_t)(vk >> 16);
  h->rank = (int32_t)get32(in + 8);
  h->size = (int32_t)get32(in + 12);
  memcpy(h->secret, in + 16, HORA_SECRET_LEN);
  if (h->magic != HORA_HELLO_MAGIC) {
    return hora__error(HORA_ERR_INVALID_ARG, "not a hora handshake (magic 0x%08x)", h->magic);
  }
  if (h->version != HORA_HELLO_VERSION) {
    return hora__error(HORA_ERR_INVALID_ARG, "handshake version %u, expected %u", h->version,
                       HORA_HELLO_VERSION);
  }
  /* Compare the whole secret whatever differs first, so timing does not
   * tell a prober how much of it was right. */
  uint8_t diff = 0;
  for (int i = 0; i < HORA_SECRET_LEN; i++) {
    diff |= (uint8_t)(h->secret[i] ^ secret[i]);
  }
  if (diff != 0) {
    return hora__error(HORA_ERR_INVALID_ARG, "wrong job secret");
  }
  if (h->size != size || h->rank < 0 || h->rank >= size) {
    return hora__error(HORA_ERR_INVALID_ARG, "rank %d of %d does not fit this job of %d ranks",
                       h->rank, h->size, size);
  }
  if (h->kind < HORA_CONN_CTRL || h->kind > HORA_CONN_SLOTS) {
    return hora__error(HORA_ERR_INVALID_ARG, "unknown connection kind %u", h->kind);
  }
  return HORA_SUCCESS;
}
