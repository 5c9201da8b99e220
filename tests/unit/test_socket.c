/* HORA_TCP_CONGESTION_CONTROL: hora's TCP sockets get the congestion control asked
 * for, and a name the kernel refuses fails where the listener is made. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/params.h"
#include "comm/transport/socket.h"
#include "../runner.h"

static void congestion_of(int fd, char *name, size_t n) {
  socklen_t len = (socklen_t)n;
  memset(name, 0, n);
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) < 0) {
    name[0] = '\0';
  }
}

TEST(tcp_sockets_get_the_congestion_control_asked_for) {
  struct in_addr lo = {htonl(INADDR_LOOPBACK)};
  struct sockaddr_in bound;
  int lfd = -1;
  char name[32];

  /* reno is built into every Linux kernel that has TCP. */
  setenv("HORA_TCP_CONGESTION_CONTROL", "reno", 1);
  ASSERT_EQ_INT(hora__params_load(), HORA_SUCCESS);
  ASSERT_EQ_INT(hora__listen_tcp(lo, &lfd, &bound), HORA_SUCCESS);
  congestion_of(lfd, name, sizeof(name));
  ASSERT(strcmp(name, "reno") == 0);
  int cfd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT(cfd >= 0);
  ASSERT(connect(cfd, (struct sockaddr *)&bound, sizeof(bound)) == 0);
  ASSERT_EQ_INT(hora__socket_tune(cfd, true, 0), HORA_SUCCESS);
  congestion_of(cfd, name, sizeof(name));
  ASSERT(strcmp(name, "reno") == 0);
  close(cfd);
  close(lfd);

  /* A Unix socket is left alone, whatever the setting. */
  int sv[2];
  ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  ASSERT_EQ_INT(hora__socket_tune(sv[0], false, 0), HORA_SUCCESS);
  close(sv[0]);
  close(sv[1]);

  setenv("HORA_TCP_CONGESTION_CONTROL", "no-such-algorithm", 1);
  ASSERT_EQ_INT(hora__params_load(), HORA_SUCCESS);
  lfd = -1;
  ASSERT_EQ_INT(hora__listen_tcp(lo, &lfd, &bound), HORA_ERR_INVALID_ARG);
  ASSERT(lfd == -1);
  ASSERT_STR_CONTAINS(hora__error_message(), "HORA_TCP_CONGESTION_CONTROL=no-such-algorithm");

  unsetenv("HORA_TCP_CONGESTION_CONTROL");
  ASSERT_EQ_INT(hora__params_load(), HORA_SUCCESS);
}

/* A rank's Unix listener: the job id is public (/proc/net/unix names it
 * as soon as one rank listens), so a local process of another user could
 * bind @hora.<job>.<rank> before that rank does. It must not keep the rank
 * from listening. */
TEST(unix_listener_name_cannot_be_taken_in_advance) {
  char job[17];
  snprintf(job, sizeof(job), "%016x", (unsigned)getpid());
  int squatter = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  ASSERT(squatter >= 0);
  struct sockaddr_un sun = {.sun_family = AF_UNIX};
  int n = snprintf(sun.sun_path + 1, sizeof(sun.sun_path) - 1, "hora.%s.%d", job, 3);
  socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
  ASSERT(bind(squatter, (struct sockaddr *)&sun, len) == 0 && listen(squatter, 4) == 0);
  uint8_t key[HORA_SECRET_LEN], other_key[HORA_SECRET_LEN];
  memset(key, 0x42, sizeof(key));
  memset(other_key, 0x43, sizeof(other_key));
  int fd = -1;
  int rc = hora__listen_unix(key, job, 3, &fd);
  if (rc != HORA_SUCCESS) {
    close(squatter);
    FAIL("a process holding @hora.%s.3 keeps rank 3 from listening: %s", job,
         hora__error_message());
  }
  /* Members, who know the key, reach the rank itself. */
  struct sockaddr_un at, elsewhere;
  unsigned at_len, elsewhere_len;
  hora__unix_address(key, job, 3, &at, &at_len);
  hora__unix_address(other_key, job, 3, &elsewhere, &elsewhere_len);
  int client = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool reached = client >= 0 && connect(client, (struct sockaddr *)&at, at_len) == 0;
  int in_rank = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  int in_squatter = accept4(squatter, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  bool same = at_len == elsewhere_len && memcmp(at.sun_path, elsewhere.sun_path, at_len -
                                                offsetof(struct sockaddr_un, sun_path)) == 0;
  int fds[] = {client, in_rank, in_squatter, fd, squatter};
  for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++) {
    if (fds[i] >= 0) {
      close(fds[i]);
    }
  }
  ASSERT(reached);
  ASSERT(in_rank >= 0);
  ASSERT(in_squatter < 0);
  ASSERT(!same); /* the name depends on the key */
}
