/* What MPI adds to the runtime, built with MPI only (configure's default):
 * starting and finalizing MPI for hora_init, hora_init_comm, the world's
 * MPI communicator, and the members of hora_process_set_from_mpi_comm.
 * The rest of the runtime reaches these through runtime.h and never
 * includes mpi.h, so a build without MPI leaves this file out. */
#include <stdlib.h>

#include "base/mpi_error.h"
#include "comm/bootstrap/rendezvous_mpi.h"
#include "runtime/runtime.h"
#include "hora_mpi.h"

/* The communicator of the world started through MPI (the mpi rendezvous'
 * duplicate), else MPI_COMM_NULL. Changed only under init.c's lock. */
static MPI_Comm world = MPI_COMM_NULL;

void hora__mpi_state(bool *running, bool *finalized) {
  int inited = 0, fin = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  *running = inited && !fin;
  *finalized = fin;
}

int hora__mpi_start(void) {
  int provided = 0;
  int err = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
  return err == MPI_SUCCESS ? HORA_SUCCESS : hora__mpi_error(err, "MPI_Init_thread");
}

int hora__mpi_open(const void *mpi_comm, struct hora__rdv **out) {
  HORA_CHECK(hora__rdv_open_mpi(mpi_comm ? *(const MPI_Comm *)mpi_comm : MPI_COMM_WORLD, out));
  world = hora__rdv_mpi_take(*out);
  return HORA_SUCCESS;
}

void hora__mpi_world_end(bool finalize) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (world != MPI_COMM_NULL && !finalized) {
    MPI_Comm_free(&world);
  }
  world = MPI_COMM_NULL;
  if (finalize && !finalized) {
    MPI_Finalize();
  }
}

int hora__mpi_threads_multiple(void) {
  bool running = false, finalized = false;
  hora__mpi_state(&running, &finalized);
  int level = MPI_THREAD_SINGLE;
  if (!running) {
    return 0;
  }
  MPI_Query_thread(&level);
  return level == MPI_THREAD_MULTIPLE;
}

HORA_EXTERN int hora_init_comm(MPI_Comm comm) {
  if (comm == MPI_COMM_NULL) {
    hora__error_clear();
    return hora__error(HORA_ERR_INVALID_ARG, "hora_init_comm: comm is MPI_COMM_NULL");
  }
  return hora__init(&comm);
}

/* The world's ranks of the members of *arg (an MPI_Comm), or none for
 * MPI_COMM_NULL. */
static int comm_members(const char *call, const void *arg, int **members, int *n) {
  MPI_Comm comm = *(const MPI_Comm *)arg;
  if (comm == MPI_COMM_NULL) {
    return HORA_SUCCESS;
  }
  if (world == MPI_COMM_NULL) {
    return hora__error(HORA_ERR_INVALID_USAGE,
                       "%s needs MPI, and this job started without it (hora-info says how it "
                       "started); use hora_process_set_create with the ranks", call);
  }
  MPI_Group group = MPI_GROUP_NULL, wgroup = MPI_GROUP_NULL;
  int *idx = NULL, rc = HORA_SUCCESS;
  int err = MPI_Comm_group(comm, &group);
  if (err == MPI_SUCCESS) {
    err = MPI_Comm_group(world, &wgroup);
  }
  if (err == MPI_SUCCESS) {
    err = MPI_Group_size(group, n);
  }
  if (err != MPI_SUCCESS) {
    rc = hora__mpi_error(err, "MPI_Comm_group(comm)");
  } else if (!(*members = hora__calloc((size_t)*n, sizeof(int))) ||
             !(idx = hora__calloc((size_t)*n, sizeof(int)))) {
    rc = hora__error(HORA_ERR_NO_MEMORY, "%s: out of memory", call);
  } else {
    for (int i = 0; i < *n; i++) {
      idx[i] = i;
    }
    err = MPI_Group_translate_ranks(group, *n, idx, wgroup, *members);
    if (err != MPI_SUCCESS) {
      rc = hora__mpi_error(err, "MPI_Group_translate_ranks(comm)");
    }
    for (int i = 0; i < *n && rc == HORA_SUCCESS; i++) {
      if ((*members)[i] == MPI_UNDEFINED) {
        rc = hora__error(HORA_ERR_INVALID_ARG,
                         "%s: rank %d of comm is not a rank of the job's world", call, i);
      }
    }
  }
  free(idx);
  if (group != MPI_GROUP_NULL) {
    MPI_Group_free(&group);
  }
  if (wgroup != MPI_GROUP_NULL) {
    MPI_Group_free(&wgroup);
  }
  return rc;
}

HORA_EXTERN int hora_process_set_from_mpi_comm(MPI_Comm comm, hora_process_set **out) {
  return hora__process_set_from_members("hora_process_set_from_mpi_comm", comm_members, &comm,
                                        out);
}
