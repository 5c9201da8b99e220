/* The mpi rendezvous: the launcher's communicator (or the program's, for
 * hora_init_comm) carries the records. Built with MPI only. */
#include <limits.h>
#include <stdlib.h>

#include "base/mpi_error.h"
#include "comm/bootstrap/rendezvous_mpi.h"

struct mpi_rdv {
  MPI_Comm comm;
  bool owned; /* freed at close, unless handed over */
};

static int mpi_allgather(struct hora__rdv *r, const void *mine, size_t len, void *all) {
  const struct mpi_rdv *m = r->impl;
  if (len > INT_MAX) {
    return hora__error(HORA_ERR_INVALID_ARG, "bootstrap record of %zu bytes", len);
  }
  int err = MPI_Allgather(mine, (int)len, MPI_BYTE, all, (int)len, MPI_BYTE, m->comm);
  return err == MPI_SUCCESS ? HORA_SUCCESS : hora__mpi_error(err, "MPI_Allgather(bootstrap)");
}

static int mpi_bcast(struct hora__rdv *r, int root, void *buf, size_t len) {
  const struct mpi_rdv *m = r->impl;
  if (len > INT_MAX) {
    return hora__error(HORA_ERR_INVALID_ARG, "bootstrap record of %zu bytes", len);
  }
  int err = MPI_Bcast(buf, (int)len, MPI_BYTE, root, m->comm);
  return err == MPI_SUCCESS ? HORA_SUCCESS : hora__mpi_error(err, "MPI_Bcast(bootstrap)");
}

static void mpi_close(struct hora__rdv *r) {
  struct mpi_rdv *m = r->impl;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (m->owned && !finalized) {
    MPI_Comm_free(&m->comm);
  }
  free(m);
  free(r);
}

static const struct hora__rdv_ops mpi_ops = {
    .allgather = mpi_allgather, .bcast = mpi_bcast, .close = mpi_close};

int hora__rdv_open_mpi(MPI_Comm comm, struct hora__rdv **out) {
  struct hora__rdv *r = hora__calloc(1, sizeof(*r));
  struct mpi_rdv *m = hora__calloc(1, sizeof(*m));
  if (!r || !m) {
    free(r);
    free(m);
    return HORA_ERR_NO_MEMORY;
  }
  int err = MPI_Comm_dup(comm, &m->comm);
  if (err != MPI_SUCCESS) {
    free(r);
    free(m);
    return hora__mpi_error(err, "MPI_Comm_dup");
  }
  m->owned = true;
  MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(m->comm, &r->rank);
  MPI_Comm_size(m->comm, &r->size);
  r->ops = &mpi_ops;
  r->kind = HORA_RDV_MPI;
  r->impl = m;
  *out = r;
  return HORA_SUCCESS;
}

MPI_Comm hora__rdv_mpi_take(struct hora__rdv *r) {
  struct mpi_rdv *m = r->impl;
  m->owned = false;
  return m->comm;
}
