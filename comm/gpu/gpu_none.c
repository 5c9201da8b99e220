/* The device data plane in a build without CUDA: no pointer is a device
 * pointer, and nothing else is reachable. */
#include "comm/gpu/gpu.h"

bool hora__gpu_present(void) { return false; }

int hora__gpu_is_device(const void *p, bool *device) {
  (void)p;
  *device = false;
  return HORA_SUCCESS;
}

static int no_cuda(void) {
  return hora__error(HORA_ERR_NOT_SUPPORTED, "this build of hora has no CUDA (configure --with-cuda)");
}

int hora__gpu_record_event(void *stream, void **event) {
  (void)stream;
  *event = NULL;
  return no_cuda();
}
int hora__gpu_stream_wait_event(void *stream, void *event) {
  (void)stream, (void)event;
  return no_cuda();
}
int hora__gpu_event_query(void *event, bool *happened) {
  (void)event;
  *happened = true;
  return no_cuda();
}
int hora__gpu_event_create(void **event) {
  *event = NULL;
  return no_cuda();
}
void hora__gpu_event_destroy(void *event) { (void)event; }

static int gpu_run_device(hora__comm *comm, const struct hora__coll_op *op) {
  (void)comm, (void)op;
  return no_cuda();
}

const struct hora__coll_backend hora__coll_gpu = {
    .name = "gpu",
    .run_device = gpu_run_device,
};
const char *hora__gpu_path(const struct hora__gpu *gpu) {
  (void)gpu;
  return NULL;
}
int hora__gpu_setup(hora__comm *comm, struct hora__gpu **gpu) {
  (void)comm, (void)gpu;
  return no_cuda();
}
int hora__gpu_check(struct hora__gpu *gpu) {
  (void)gpu;
  return HORA_SUCCESS;
}
void hora__gpu_abort(struct hora__gpu *gpu) { (void)gpu; }
void hora__gpu_destroy(hora__comm *comm, struct hora__gpu *gpu, bool failed) {
  (void)comm, (void)gpu, (void)failed;
}

int hora__gpu_copy_bandwidth(size_t bytes, int n, int reps, double *kernel_gbs, double *memcpy_gbs) {
  (void)bytes, (void)n, (void)reps;
  *kernel_gbs = *memcpy_gbs = 0;
  return no_cuda();
}
