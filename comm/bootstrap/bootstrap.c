/* Bootstrap: the steps that build a communicator's membership from a
 * rendezvous (rendezvous.h); each is collective over it.
 *
 *   1. who: every rank's host identity, settings digest and proposed
 *      epoch; the job-wide settings checked, the epoch (the highest), local
 *      rank/size and host index worked out
 *   2. the secret: rank 0 draws a job id; the connections' key is derived
 *      from the secret every member proved to the rendezvous (or, with
 *      none, drawn by rank 0 and sent through it), then from the epoch,
 *      so a connection of another membership never proves itself
 *   3. every rank listens (TCP on the chosen interface, a Unix socket for
 *      its host) and the addresses are exchanged
 *   4. (connect.c) the planned connections are made, all at once and
 *      without blocking: the higher rank of a pair connects, and both
 *      prove the key (handshake.h); strangers are dropped (accept.c)
 *   5. the host's shared segment, in two exchanges (shm.h)
 *
 * comm/communicator runs them in order and makes the choices between. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/comm.h"
#include "comm/transport/socket.h"
#include "comm/shm/shm.h"

int hora__boot_random_bytes(void *buf, size_t n, const char *what) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom((uint8_t *)buf + got, n - got, 0);
    if (r < 0 && errno != EINTR) {
      return hora__error_errno(HORA_ERR_SYSTEM, "getrandom (%s)", what);
    }
    if (r > 0) {
      got += (size_t)r;
    }
  }
  return HORA_SUCCESS;
}

int hora__boot_cross_peer(const hora__comm *c, int dir) {
  return hora__comm_rank_on_host(c, (c->cross_rank + dir + c->cross_size) % c->cross_size);
}

/* ---- 1. who ------------------------------------------------------------------------- */

struct who {
  uint64_t epoch;    /* this process's proposal for the membership's */
  uint64_t digest;   /* of the job-wide settings */
  uint64_t host_key; /* hostname and boot id: ranks with one share memory */
  char host[HORA_HOST_MAX];
};

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
  }
  return h;
}

/* Fake hosts (network namespaces with their own hostnames) count as hosts;
 * two machines that share a hostname do not, by their boot ids. */
static uint64_t host_key(void) {
  const char *name = hora__log_hostname();
  uint64_t h = fnv1a(0xcbf29ce484222325ull, name, strlen(name) + 1);
  char boot[64] = "";
  int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, boot, sizeof(boot) - 1);
    boot[n > 0 ? n : 0] = '\0';
    close(fd);
  }
  return fnv1a(h, boot, strlen(boot));
}

/* Far past any build's table of settings: a longer encoding, or a
 * negative length, is not a rank's. */
#define SETTINGS_ENCODING_MAX (1 << 20)

/* The two ranks' encodings (rank 0's and other's), when digests differ, so
 * every rank fails naming the same setting. */
static int settings_differ(hora__comm *c, struct hora__rdv *rdv, const char *mine, size_t len,
                           int other) {
  int32_t mylen = (int32_t)HORA_MIN(len, (size_t)INT32_MAX), maxlen = 0;
  int32_t *lens = hora__calloc((size_t)c->size, sizeof(*lens));
  if (!lens) {
    return HORA_ERR_NO_MEMORY;
  }
  int rc = hora__rdv_allgather(rdv, &mylen, sizeof(mylen), lens);
  /* Every rank sees the same lengths, so all refuse together. */
  for (int r = 0; rc == HORA_SUCCESS && r < c->size; r++) {
    if (lens[r] < 0 || lens[r] > SETTINGS_ENCODING_MAX) {
      rc = hora__error(HORA_ERR_PROTOCOL,
                       "rank %d sent %d bytes as the length of its job-wide settings (0 to %d "
                       "expected): another build of hora, or not a rank of this job",
                       r, (int)lens[r], SETTINGS_ENCODING_MAX);
    }
    maxlen = HORA_MAX(maxlen, lens[r]);
  }
  int32_t len0 = lens[0], len1 = lens[other];
  free(lens);
  char *pad = rc == HORA_SUCCESS ? hora__calloc(1, (size_t)maxlen + 1) : NULL;
  char *all = pad ? hora__calloc((size_t)c->size, (size_t)maxlen + 1) : NULL;
  if (rc == HORA_SUCCESS && !all) {
    rc = HORA_ERR_NO_MEMORY;
  }
  if (rc == HORA_SUCCESS) {
    if (c->rank == 0 || c->rank == other) {
      memcpy(pad, mine, len);
    }
    rc = hora__rdv_allgather(rdv, pad, (size_t)maxlen + 1, all);
  }
  if (rc == HORA_SUCCESS) {
    char msg[512];
    const char *a = all, *b = all + (size_t)other * ((size_t)maxlen + 1);
    if (!hora__params_job_difference(a, (size_t)len0, 0, b, (size_t)len1, other, msg,
                                     sizeof(msg))) {
      snprintf(msg, sizeof(msg), "ranks 0 and %d differ in their job-wide settings", other);
    }
    rc = hora__error(HORA_ERR_INVALID_ARG, "%s (job-wide settings must be the same on every rank)",
                     msg);
  }
  free(pad);
  free(all);
  return rc;
}

int hora__boot_membership(hora__comm *c, struct hora__rdv *rdv, uint64_t epoch) {
  c->rank = rdv->rank;
  c->size = rdv->size;
  c->net->rank = c->rank;
  c->net->size = c->size;
  size_t len = hora__params_job_encode(NULL, 0);
  char *mine = hora__malloc(len + 1);
  struct who *all = hora__calloc((size_t)c->size, sizeof(*all));
  int rc = mine && all ? HORA_SUCCESS : HORA_ERR_NO_MEMORY;
  struct who me;
  memset(&me, 0, sizeof(me));
  if (mine) {
    hora__params_job_encode(mine, len + 1);
    me.digest = fnv1a(0xcbf29ce484222325ull, mine, len);
  }
  me.epoch = epoch;
  me.host_key = host_key();
  hora__strlcpy(me.host, hora__log_hostname(), sizeof(me.host));
  rc = hora__rdv_agree(rdv, rc, "memory");
  if (rc == HORA_SUCCESS) {
    rc = hora__rdv_allgather(rdv, &me, sizeof(me), all);
  }
  int other = -1;
  for (int r = 1; rc == HORA_SUCCESS && r < c->size && other < 0; r++) {
    other = all[r].digest != all[0].digest ? r : -1;
  }
  /* Every rank knows `other` from the same digests: all take this branch. */
  if (rc == HORA_SUCCESS && other > 0) {
    rc = settings_differ(c, rdv, mine, len, other);
  }
  if (rc == HORA_SUCCESS) {
    /* The epoch: past every member's last, whatever memberships each was in. */
    c->proc->epoch = epoch;
    for (int r = 0; r < c->size; r++) {
      c->proc->epoch = HORA_MAX(c->proc->epoch, all[r].epoch);
    }
    /* Local ranks in rank order on each host; hosts numbered in the order
     * of their lowest rank (as MPI's shared-memory split and leaders). */
    c->local_rank = c->local_size = c->cross_rank = c->cross_size = 0;
    for (int r = 0; r < c->size; r++) {
      bool first = true;
      for (int q = 0; q < r && first; q++) {
        first = all[q].host_key != all[r].host_key;
      }
      if (first) {
        if (all[r].host_key == me.host_key) {
          c->cross_rank = c->cross_size;
        }
        c->cross_size++;
      }
      if (all[r].host_key == me.host_key) {
        if (r < c->rank) {
          c->local_rank++;
        }
        c->local_size++;
      }
    }
  }
  free(all);
  free(mine);
  return rc;
}

/* ---- 2. the secret ---------------------------------------------------------------- */

int hora__boot_secret(hora__comm *c, struct hora__rdv *rdv) {
  /* job id (public: it names the Unix sockets), then the secret when the
   * rendezvous has no key of its own to derive it from */
  uint8_t drawn[8 + HORA_SECRET_LEN];
  memset(drawn, 0, sizeof(drawn));
  int rc = HORA_SUCCESS;
  if (c->rank == 0) {
    rc = hora__boot_random_bytes(drawn, rdv->has_key ? 8 : sizeof(drawn), "job secret");
  }
  HORA_CHECK(hora__rdv_agree(rdv, rc, "job secret"));
  HORA_CHECK(hora__rdv_bcast(rdv, 0, drawn, sizeof(drawn)));
  for (int i = 0; i < 8; i++) {
    snprintf(c->proc->job_id + 2 * i, 3, "%02x", drawn[i]);
  }
  hora__boot_connection_key(rdv->has_key ? rdv->key : drawn + 8, drawn, c->proc->epoch,
                            c->proc->secret);
  memcpy(c->proc->job_secret, rdv->has_key ? rdv->key : drawn + 8, HORA_SECRET_LEN);
  OPENSSL_cleanse(drawn, sizeof(drawn));
  return HORA_SUCCESS;
}

void hora__boot_connection_key(const uint8_t secret[HORA_SECRET_LEN], const uint8_t job_id[8],
                               uint64_t epoch, uint8_t out[HORA_SECRET_LEN]) {
  uint8_t in[32 + HORA_SECRET_LEN + 8 + 8];
  memcpy(in, "hora-connections-of-one-epoch-1\0", 32);
  memcpy(in + 32, secret, HORA_SECRET_LEN);
  memcpy(in + 32 + HORA_SECRET_LEN, job_id, 8);
  for (int i = 0; i < 8; i++) {
    in[32 + HORA_SECRET_LEN + 8 + i] = (uint8_t)(epoch >> (8 * i));
  }
  SHA256(in, sizeof(in), out);
  OPENSSL_cleanse(in, sizeof(in));
}

/* ---- 3. addresses ------------------------------------------------------------------ */

static int listen_and_allocate(hora__comm *c, struct in_addr *ip, char *ifname, size_t n) {
  HORA_CHECK(hora__choose_ipv4(hora__params.IFACE, c->cross_size == 1, ip, ifname, n));
  HORA_CHECK(hora__listen_tcp(*ip, &c->proc->tcp_listen_fd, &c->proc->tcp_addr));
  HORA_CHECK(hora__listen_unix(c->proc->secret, c->proc->job_id, c->rank,
                               &c->proc->unix_listen_fd));
  c->net->peers = hora__calloc((size_t)c->size, sizeof(*c->net->peers));
  c->proc->ctrl = hora__calloc((size_t)c->size, sizeof(*c->proc->ctrl));
  c->proc->data = hora__calloc((size_t)c->size, sizeof(*c->proc->data));
  c->proc->cross = hora__calloc((size_t)c->size, sizeof(*c->proc->cross));
  if (!c->net->peers || !c->proc->ctrl || !c->proc->data || !c->proc->cross) {
    return HORA_ERR_NO_MEMORY;
  }
  return HORA_SUCCESS;
}

/* Each record must place its rank where step 1 did on every rank, from
 * the same host identities: hosts numbered in the order of their lowest
 * rank, local ranks in rank order. Host index and local rank index tables
 * (the host's exchanges, the hierarchical collectives), so a record that
 * does not fit is refused; every rank sees the same records. */
static int check_addresses(const hora__comm *c) {
  const struct hora__peer_info *peers = c->net->peers;
  int *on_host = hora__calloc((size_t)HORA_MAX(c->cross_size, 1), sizeof(*on_host));
  if (!on_host) {
    return HORA_ERR_NO_MEMORY;
  }
  int hosts = 0, rc = HORA_SUCCESS;
  for (int r = 0; r < c->size && rc == HORA_SUCCESS; r++) {
    const struct hora__peer_info *p = &peers[r];
    int h = p->host_index;
    if (!memchr(p->host, '\0', sizeof(p->host))) {
      rc = hora__error(HORA_ERR_PROTOCOL, "rank %d's address record has a host name of more "
                       "than %d bytes, or without its end", r, HORA_HOST_MAX - 1);
    } else if (h < 0 || h >= c->cross_size || h > hosts) {
      rc = hora__error(HORA_ERR_PROTOCOL, "rank %d's address record says it is on host %d, where "
                       "it can only be on host 0 to %d (%d hosts, numbered by their lowest rank)",
                       r, h, HORA_MIN(hosts, c->cross_size - 1), c->cross_size);
    } else if (p->local_rank != on_host[h]) {
      rc = hora__error(HORA_ERR_PROTOCOL, "rank %d's address record says it is local rank %d of "
                       "host %d, where rank order makes it local rank %d", r, (int)p->local_rank,
                       h, on_host[h]);
    } else {
      hosts += h == hosts;
      on_host[h]++;
    }
  }
  if (rc == HORA_SUCCESS &&
      (hosts != c->cross_size || on_host[c->cross_rank] != c->local_size ||
       peers[c->rank].host_index != c->cross_rank || peers[c->rank].local_rank != c->local_rank)) {
    rc = hora__error(HORA_ERR_PROTOCOL, "the address records place %d ranks on %d hosts, %d of "
                     "them on this rank's host %d, where the host identities gave %d hosts, %d "
                     "ranks on host %d", c->size, hosts, on_host[c->cross_rank], c->cross_rank,
                     c->cross_size, c->local_size, c->cross_rank);
  }
  free(on_host);
  return rc;
}

int hora__boot_addresses(hora__comm *c, struct hora__rdv *rdv) {
  struct in_addr ip;
  char ifname[64];
  HORA_CHECK(hora__rdv_agree(rdv, listen_and_allocate(c, &ip, ifname, sizeof(ifname)),
                             "listening sockets"));
  struct hora__peer_info me;
  memset(&me, 0, sizeof(me));
  hora__strlcpy(me.host, hora__log_hostname(), sizeof(me.host));
  me.pid = (int32_t)getpid();
  me.local_rank = c->local_rank;
  me.host_index = c->cross_rank;
  me.ipv4 = c->proc->tcp_addr.sin_addr.s_addr;
  me.port = c->proc->tcp_addr.sin_port;
  HORA_CHECK(hora__rdv_allgather(rdv, &me, sizeof(me), c->net->peers));
  HORA_CHECK(check_addresses(c));
  char ipstr[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &ip, ipstr, sizeof(ipstr));
  struct sockaddr_un sun;
  unsigned sun_len;
  hora__unix_address(c->proc->secret, c->proc->job_id, c->rank, &sun, &sun_len);
  HORA_DEBUG("bootstrap: listening on %s:%d (%s) and @%s", ipstr,
             ntohs(c->proc->tcp_addr.sin_port), ifname, sun.sun_path + 1);
  return HORA_SUCCESS;
}

/* ---- 5. the host's segment ----------------------------------------------------------- */

/* An exchange among this host's ranks, carried by an allgather of the
 * whole job (every rank takes part, with or without a segment). */
static int host_exchange(hora__comm *c, struct hora__rdv *rdv, const void *mine, size_t len,
                         void *host) {
  uint8_t *all = hora__calloc((size_t)c->size, len);
  if (!all) {
    return HORA_ERR_NO_MEMORY;
  }
  int rc = hora__rdv_allgather(rdv, mine, len, all);
  for (int r = 0; rc == HORA_SUCCESS && host && r < c->size; r++) {
    if (c->net->peers[r].host_index == c->cross_rank) {
      memcpy((uint8_t *)host + (size_t)c->net->peers[r].local_rank * len, all + (size_t)r * len,
             len);
    }
  }
  free(all);
  return rc;
}

int hora__boot_shm(hora__comm *c, struct hora__rdv *rdv, bool want, bool populate) {
  struct hora__shm_hello hello, *hellos = NULL;
  struct hora__shm_verdict verdict, *verdicts = NULL;
  struct hora__shm *s = NULL;
  memset(&hello, 0, sizeof(hello));
  memset(&verdict, 0, sizeof(verdict));
  int rc = HORA_SUCCESS;
  if (want) {
    hellos = hora__calloc((size_t)c->local_size, sizeof(*hellos));
    verdicts = hora__calloc((size_t)c->local_size, sizeof(*verdicts));
    rc = hellos && verdicts ? hora__shm_begin(c->net, c->local_rank, c->local_size, populate, &s, &hello)
                            : HORA_ERR_NO_MEMORY;
  }
  rc = hora__rdv_agree(rdv, rc, "shared memory");
  if (rc == HORA_SUCCESS) {
    rc = host_exchange(c, rdv, &hello, sizeof(hello), want ? hellos : NULL);
  }
  if (rc == HORA_SUCCESS && s) {
    hora__shm_attach(s, hellos, &verdict);
  }
  if (rc == HORA_SUCCESS) {
    rc = host_exchange(c, rdv, &verdict, sizeof(verdict), want ? verdicts : NULL);
  }
  if (rc == HORA_SUCCESS && s) {
    hora__shm_finish(&s, verdicts);
  }
  if (rc != HORA_SUCCESS) {
    hora__shm_destroy(s);
    s = NULL;
  }
  c->proc->shm = s;
  free(hellos);
  free(verdicts);
  return rc;
}
