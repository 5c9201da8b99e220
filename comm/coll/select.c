/* The algorithm table: each communicator's choice of backend per kind of
 * collective, made once from its shape, and the entry points that go
 * through it. Nothing else decides between shared memory, rings and the
 * device data plane. */
#include "comm/coll/collectives.h"
#include "comm/reduce/reduce.h"
#include "comm/shm/shm.h"

static int ring_allgather(hora__comm *comm, const void *sendbuf, size_t bytes, void *recvbuf) {
  return hora__ring_allgather(comm, &comm->world_ring, sendbuf, bytes, recvbuf);
}

const struct hora__coll_backend hora__coll_ring = {
    .name = "ring",
    .allreduce = hora__ring_allreduce_iov,
    .broadcast = hora__ring_broadcast_iov,
    .allgather = ring_allgather,
};

static int shm_allreduce(hora__comm *comm, const struct hora__iov *in, int nin,
                         const struct hora__iov *out, int nout, size_t count, hora_dtype dtype,
                         hora_op op, hora_dtype wire, const struct hora__coll_opts *opts) {
  /* Decided from what every rank sees alike, so all take the same path. */
  if (nin == nout && opts && opts->prescale == 1.0 &&
      hora__shm_single_copy_fits(comm, nin, count * hora_dtype_size(dtype))) {
    return hora__shm_allreduce_single_copy(comm, in, out, nin, count, dtype, op, opts);
  }
  return hora__shm_allreduce(comm, in, nin, out, nout, count, dtype, op, wire, opts);
}

static int shm_broadcast(hora__comm *comm, const struct hora__iov *buf, int nbuf, size_t bytes,
                         int root, const struct hora__coll_opts *opts) {
  if (opts && opts->phase) {
    opts->phase(opts->phase_arg, "BROADCAST");
  }
  int rc = hora__shm_broadcast(comm, buf, nbuf, bytes, comm->net->peers[root].local_rank);
  if (opts && opts->phase) {
    opts->phase(opts->phase_arg, NULL);
  }
  return rc;
}

const struct hora__coll_backend hora__coll_shm = {
    .name = "shm",
    .allreduce = shm_allreduce,
    .broadcast = shm_broadcast,
    .allgather = hora__shm_allgather,
};

void hora__coll_choose(hora__comm *comm, bool shm, bool hierarchical) {
  /* Shared memory serves a communicator that lives in one host; allreduce
   * also one spread over hosts, when it can be hierarchical. */
  comm->algo_allreduce =
      shm && (comm->cross_size == 1 || hierarchical) ? &hora__coll_shm : &hora__coll_ring;
  comm->algo_bcast = comm->algo_allgather =
      shm && comm->cross_size == 1 ? &hora__coll_shm : &hora__coll_ring;
  comm->algo_device = &hora__coll_gpu;
}

int hora__coll_run(hora__comm *comm, const struct hora__coll_op *op) {
  if (op->device) {
    return comm->algo_device->run_device(comm, op);
  }
  switch (op->kind) {
    case HORA_COLL_ALLREDUCE:
      return hora__allreduce(comm, op->in, op->n, op->out, op->n, op->count, op->dtype, op->op,
                             op->wire, op->opts);
    case HORA_COLL_BROADCAST:
      return hora__broadcast(comm, op->out, op->n, op->bytes, op->root, op->opts);
    case HORA_COLL_ALLGATHER:
      return hora__allgather(comm, op->in[0].base, op->bytes, op->out[0].base);
    case HORA_COLL_REDUCESCATTER:
      if (op->unit == 0) {
        return hora__reducescatter_at(comm, op->in[0].base, op->out[0].base, op->count,
                                      op->block_start, op->block_len, op->dtype, op->op, op->wire,
                                      op->opts);
      }
      return hora__reducescatter(comm, op->in[0].base, op->out[0].base, op->count, op->unit,
                                 op->dtype, op->op, op->wire, op->opts);
    case HORA_COLL_ALLGATHERV:
      return hora__allgatherv(comm, op->in[0].base, op->recv_bytes, op->out[0].base,
                              op->published);
    case HORA_COLL_ALLTOALL:
      return hora__alltoall(comm, op->in[0].base, op->send_bytes, op->out[0].base,
                            op->recv_bytes, op->most, op->published);
  }
  return hora__error(HORA_ERR_INVALID_ARG, "collective of unknown kind %d", (int)op->kind);
}

/* Adasum, on one tensor (it is never fused: its coefficients are the
 * tensor's own), in place in the output. */
static int adasum_allreduce(hora__comm *comm, const struct hora__iov *in, int nin,
                            const struct hora__iov *out, int nout, size_t count, hora_dtype dtype,
                            const struct hora__coll_opts *opts) {
  if (nin != 1 || nout != 1) {
    return hora__error(HORA_ERR_INVALID_ARG, "adasum of %d tensors at once", nin);
  }
  if (out[0].base != in[0].base && out[0].len) {
    memcpy(out[0].base, in[0].base, out[0].len);
  }
  if (opts && opts->prescale != 1.0) {
    hora__scale(dtype, out[0].base, count, opts->prescale);
  }
  if (opts && opts->phase) {
    opts->phase(opts->phase_arg, "ADASUM");
  }
  int rc = hora__adasum(comm, out[0].base, count, dtype, opts && opts->device);
  if (opts && opts->phase) {
    opts->phase(opts->phase_arg, NULL);
  }
  if (rc == HORA_SUCCESS && opts && opts->postscale != 1.0) {
    hora__scale(dtype, out[0].base, count, opts->postscale);
  }
  return rc;
}

int hora__allreduce(hora__comm *comm, const struct hora__iov *in, int nin,
                    const struct hora__iov *out, int nout, size_t count, hora_dtype dtype,
                    hora_op op, hora_dtype wire, const struct hora__coll_opts *opts) {
  if (op == HORA_ADASUM) {
    return adasum_allreduce(comm, in, nin, out, nout, count, dtype, opts);
  }
  return comm->algo_allreduce->allreduce(comm, in, nin, out, nout, count, dtype, op, wire, opts);
}

int hora__broadcast(hora__comm *comm, const struct hora__iov *buf, int nbuf, size_t bytes,
                    int root, const struct hora__coll_opts *opts) {
  return comm->algo_bcast->broadcast(comm, buf, nbuf, bytes, root, opts);
}

int hora__allgather(hora__comm *comm, const void *sendbuf, size_t bytes, void *recvbuf) {
  return comm->algo_allgather->allgather(comm, sendbuf, bytes, recvbuf);
}

/* Over the ring, the reduce-scatter half of its allreduce (blocks of
 * Horovod's split; explicit ones, unit 0, take the allreduce below). Where shared
 * memory reduces (one host, or hierarchically across hosts), its allreduce
 * into the staging buffer, of which this rank keeps its block: the same
 * bytes cross the host's memory either way, and hierarchical allreduce
 * already sends each host's sum once around the hosts. */
static int reducescatter(hora__comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                         size_t unit, size_t start, size_t len, hora_dtype dtype, hora_op op,
                         hora_dtype wire, const struct hora__coll_opts *opts) {
  size_t es = hora_dtype_size(dtype);
  size_t had = comm->reduced_bytes;
  HORA_CHECK(hora__comm_grow_registered(comm, &comm->reduced, &comm->reduced_bytes,
                                        &comm->reduced_reg, count * es));
  if (comm->reduced_bytes != had) {
    /* Once per growth: peers may write into it with process_vm_writev,
     * which valgrind cannot see, and it would flag the results as unset. */
    memset(comm->reduced, 0, comm->reduced_bytes);
  }
  char *f = comm->reduced;
  int rc;
  if (comm->algo_allreduce == &hora__coll_ring && unit > 0) {
    const void *src = sendbuf;
    if (opts && opts->prescale != 1.0) {
      memcpy(f, sendbuf, count * es);
      hora__scale(dtype, f, count, opts->prescale);
      src = f;
    }
    if (opts && opts->phase) {
      opts->phase(opts->phase_arg, "REDUCESCATTER");
    }
    rc = hora__ring_reducescatter(comm, &comm->world_ring, src, f, count, unit, dtype, op, wire);
    if (opts && opts->phase) {
      opts->phase(opts->phase_arg, NULL);
    }
    if (rc == HORA_SUCCESS) {
      hora__post_apply(opts, dtype, f + start * es, len);
    }
  } else {
    struct hora__iov in = {(void *)(uintptr_t)sendbuf, count * es}, out = {f, count * es};
    rc = hora__allreduce(comm, &in, 1, &out, 1, count, dtype, op, wire, opts);
  }
  if (rc == HORA_SUCCESS && len) {
    memcpy(recvbuf, f + start * es, len * es);
  }
  return rc;
}

int hora__reducescatter(hora__comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                        size_t unit, hora_dtype dtype, hora_op op, hora_dtype wire,
                        const struct hora__coll_opts *opts) {
  size_t start, len;
  hora__block_range(count, unit, comm->size, comm->rank, &start, &len);
  return reducescatter(comm, sendbuf, recvbuf, count, unit, start, len, dtype, op, wire, opts);
}

int hora__reducescatter_at(hora__comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                           size_t start, size_t len, hora_dtype dtype, hora_op op,
                           hora_dtype wire, const struct hora__coll_opts *opts) {
  if (start > count || len > count - start) {
    return hora__error(HORA_ERR_INVALID_ARG, "reducescatter block [%zu, +%zu) of %zu elements",
                       start, len, count);
  }
  return reducescatter(comm, sendbuf, recvbuf, count, 0, start, len, dtype, op, wire, opts);
}
