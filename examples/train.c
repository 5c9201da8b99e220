/* train: a data-parallel multilayer perceptron on Fashion-MNIST, with hora.
 *
 * Model 784-512-256-10 (ReLU, softmax cross-entropy), SGD with momentum,
 * matrix work in OpenBLAS. What it shows of the runtime:
 *   - every rank starts from different random weights; rank 0's are
 *     broadcast to all in one fused step (hora_broadcast_parameters)
 *   - each global batch is split into one shard per rank
 *   - during the backward pass each layer's gradients are handed to
 *     hora_allreduce_async as soon as they exist, so communication overlaps
 *     the rest of backprop and the engine fuses them
 *   - the optimizer waits for them and steps; the learning rate is scaled
 *     by the number of ranks, with a linear warm-up and a cosine decay to
 *     zero at the end of the run (a steady final accuracy)
 *   - the last, uneven batch of an epoch: ranks without samples call
 *     hora_join; the last rank to join then broadcasts the final state
 *   - --accum-steps K allreduces once per K micro-batches
 *   - --fp16-allreduce sends gradients as fp16
 *   - rank 0 evaluates on the test set every epoch and writes a checkpoint
 *     that --resume continues from
 *   - --device cuda (builds with CUDA) keeps the model on the GPU (cuBLAS)
 *     and allreduces device buffers, ordered on the trainer's stream
 *   - --elastic (HORA_ELASTIC=1) commits the state in memory every few
 *     steps; a lost rank rolls the others back to the last commit, and
 *     they go on with fewer ranks; processes started later join at a
 *     commit and take the model from the others
 *
 *   mpirun -np 16 examples/train
 */
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "hora.h"
#if HORA_TRAIN_CUDA
#include "train_gpu.h"
#endif

/* ---- options -------------------------------------------------------------- */

struct options {
  int epochs;
  int batch;        /* samples per rank per micro-batch */
  double lr;        /* per-rank base learning rate, scaled by the rank count */
  double momentum;
  int warmup_steps; /* optimizer steps of linear warm-up */
  int accum_steps;
  int fp16;
  unsigned seed;
  const char *data_dir;
  const char *checkpoint;
  int resume;
  int print_steps; /* print the loss of the first N steps (for testing) */
  int max_steps;   /* stop after N optimizer steps (0: no limit) */
  int cuda;        /* --device cuda */
  int elastic;     /* --elastic: survive lost ranks, admit new ones */
  int commit_every;
  int die_at, die_rank, die_in_reset_rank; /* failure drills, -1: none */
  int die_with_ranks;                       /* 0: at die_at whatever the size */
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: train [options]   (run under mpirun/srun for several ranks)\n"
          "  --epochs N            passes over the training set (default 5)\n"
          "  --batch N             samples per rank per step (default 32)\n"
          "  --lr X                learning rate for one rank; it is multiplied by the number\n"
          "                        of ranks, reached by a linear warm-up, and decays to zero\n"
          "                        along a cosine by the end of the last epoch (default 0.02)\n"
          "  --momentum X          SGD momentum (default 0.9)\n"
          "  --warmup-steps N      optimizer steps of warm-up (default 100)\n"
          "  --accum-steps K       accumulate gradients over K micro-batches, allreduce once\n"
          "                        per K (default 1)\n"
          "  --fp16-allreduce      send gradients as fp16 (reduced in float32)\n"
          "  --seed N              seed of initial weights and data order (default 42)\n"
          "  --data-dir DIR        Fashion-MNIST gzipped IDX files\n"
          "                        (default /usr/share/datasets/fashion-mnist)\n"
          "  --checkpoint PATH     written by rank 0 after every epoch (default train.ckpt)\n"
          "  --resume              continue from --checkpoint\n"
          "  --print-steps N       print the global loss of the first N steps\n"
          "  --max-steps N         stop after N optimizer steps\n"
          "  --device cpu|cuda     where the model lives (default cpu; cuda needs a build\n"
          "                        with CUDA and a GPU per rank, or ranks sharing one)\n"
          "  --elastic             elastic training (needs HORA_ELASTIC=1 in every process's\n"
          "                        environment): a lost rank makes the others roll back to\n"
          "                        the last commit and go on without it; a process started\n"
          "                        later with the job's rendezvous and no rank joins at the\n"
          "                        next commit and takes the model from the others. The\n"
          "                        epoch's remaining samples are shared over the new number\n"
          "                        of ranks and the learning rate follows it. CPU only\n"
          "  --commit-every N      with --elastic: commit the state every N steps (default 10)\n"
          "  --help                this text\n"
          "Failure drills, for tests of --elastic (they kill a process on purpose):\n"
          "  --die-at STEP --die-rank R   the process that started as rank R kills itself\n"
          "                        (SIGKILL) when the step count reaches STEP\n"
          "  --die-with-ranks N    ... at the first step from STEP on at which the job has\n"
          "                        N ranks (a loss after a newcomer, however late it starts)\n"
          "  --die-in-reset-rank R the process that started as rank R kills itself 50 ms\n"
          "                        into the first reset after a lost rank\n"
          "Rank 0 prints one line per epoch; the last line is test_accuracy=0.XXXX.\n"
          "With --elastic every rank prints a line at each change of membership:\n"
          "  elastic: membership E: N ranks (was M); resuming at epoch X step Y; lr Z\n");
}

static int parse_options(int argc, char **argv, struct options *o) {
  *o = (struct options){.epochs = 5,
                        .batch = 32,
                        .lr = 0.02,
                        .momentum = 0.9,
                        .warmup_steps = 100,
                        .accum_steps = 1,
                        .seed = 42,
                        .data_dir = "/usr/share/datasets/fashion-mnist",
                        .checkpoint = "train.ckpt",
                        .commit_every = 10,
                        .die_at = -1,
                        .die_rank = -1,
                        .die_in_reset_rank = -1};
  static const struct option longopts[] = {
      {"epochs", required_argument, 0, 'e'},      {"batch", required_argument, 0, 'b'},
      {"lr", required_argument, 0, 'l'},          {"momentum", required_argument, 0, 'm'},
      {"warmup-steps", required_argument, 0, 'w'}, {"accum-steps", required_argument, 0, 'k'},
      {"fp16-allreduce", no_argument, 0, 'f'},    {"seed", required_argument, 0, 's'},
      {"data-dir", required_argument, 0, 'd'},    {"checkpoint", required_argument, 0, 'c'},
      {"resume", no_argument, 0, 'r'},            {"print-steps", required_argument, 0, 'p'},
      {"max-steps", required_argument, 0, 'x'},   {"help", no_argument, 0, 'h'},
      {"device", required_argument, 0, 'g'},      {"elastic", no_argument, 0, 'E'},
      {"commit-every", required_argument, 0, 'C'}, {"die-at", required_argument, 0, 'D'},
      {"die-rank", required_argument, 0, 'R'},    {"die-in-reset-rank", required_argument, 0, 'Q'},
      {"die-with-ranks", required_argument, 0, 'W'}, {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (c) {
      case 'e': o->epochs = atoi(optarg); break;
      case 'b': o->batch = atoi(optarg); break;
      case 'l': o->lr = atof(optarg); break;
      case 'm': o->momentum = atof(optarg); break;
      case 'w': o->warmup_steps = atoi(optarg); break;
      case 'k': o->accum_steps = atoi(optarg); break;
      case 'f': o->fp16 = 1; break;
      case 's': o->seed = (unsigned)strtoul(optarg, NULL, 10); break;
      case 'd': o->data_dir = optarg; break;
      case 'c': o->checkpoint = optarg; break;
      case 'r': o->resume = 1; break;
      case 'p': o->print_steps = atoi(optarg); break;
      case 'x': o->max_steps = atoi(optarg); break;
      case 'g':
        if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "cuda") != 0) {
          usage(stderr);
          return -1;
        }
        o->cuda = strcmp(optarg, "cuda") == 0;
        break;
      case 'E': o->elastic = 1; break;
      case 'C': o->commit_every = atoi(optarg); break;
      case 'D': o->die_at = atoi(optarg); break;
      case 'R': o->die_rank = atoi(optarg); break;
      case 'W': o->die_with_ranks = atoi(optarg); break;
      case 'Q': o->die_in_reset_rank = atoi(optarg); break;
      case 'h': usage(stdout); exit(0);
      default: usage(stderr); return -1;
    }
  }
  if (optind < argc || o->epochs < 1 || o->batch < 1 || o->lr <= 0 || o->accum_steps < 1 ||
      o->warmup_steps < 0 || o->momentum < 0 || o->momentum >= 1 || o->commit_every < 1 ||
      (o->die_at >= 0) != (o->die_rank >= 0) || o->die_with_ranks < 0 ||
      (o->die_with_ranks > 0 && o->die_at < 0)) {
    usage(stderr);
    return -1;
  }
  const char *why = NULL;
  if (!o->elastic && (o->die_at >= 0 || o->die_in_reset_rank >= 0)) {
    why = "the failure drills need --elastic";
  } else if (o->elastic && o->cuda) {
    why = "--elastic keeps its committed state in host memory: --device cpu only";
  } else if (o->elastic && !getenv("HORA_ELASTIC") && !getenv("HOROVOD_ELASTIC")) {
    why = "--elastic needs HORA_ELASTIC=1 in the environment of every process";
  }
  if (why) {
    fprintf(stderr, "train: %s\n", why);
    return -1;
  }
  return 0;
}

/* ---- errors ----------------------------------------------------------------- */

static int rank = -1, nranks = 1;
static double init_seconds;
static int on_gpu; /* the model's buffers are device memory */

static void fatal(int rc, const char *what, const char *msg) {
  fprintf(stderr, "train: rank %d: %s failed: %s (%s)\n", rank, what, hora_strerror(rc), msg);
  hora_abort(msg);
  exit(1);
}

#define CHECK(call)                          \
  do {                                       \
    int rc_ = (call);                        \
    if (rc_ != HORA_SUCCESS) {               \
      fatal(rc_, #call, hora_last_error());  \
    }                                        \
  } while (0)

static void die(const char *fmt, const char *arg) {
  if (rank >= 0) {
    fprintf(stderr, "train: rank %d: ", rank);
  } else {
    fprintf(stderr, "train: ");
  }
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n");
  if (hora_initialized()) {
    hora_abort("train: fatal error on one rank (see its log)");
  }
  exit(1);
}

static void *xmalloc(size_t n) {
  void *p = calloc(1, n ? n : 1);
  if (!p) {
    die("out of memory (%s)", "calloc");
  }
  return p;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- data --------------------------------------------------------------------- */

struct dataset {
  int n, dim;
  uint8_t *x; /* n x dim pixels */
  uint8_t *y; /* n labels */
};

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Reads a gzipped IDX file (images: magic 2051, labels: 2049). */
static uint8_t *read_idx(const char *dir, const char *name, uint32_t magic, int *n, int *dim) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  gzFile f = gzopen(path, "rb");
  if (!f) {
    die("cannot open %s (install dataset-fashion-mnist, or pass --data-dir)", path);
  }
  uint8_t head[16];
  int hlen = magic == 2051 ? 16 : 8;
  if (gzread(f, head, (unsigned)hlen) != hlen || be32(head) != magic) {
    die("%s is not a gzipped IDX file of the expected kind", path);
  }
  *n = (int)be32(head + 4);
  *dim = magic == 2051 ? (int)(be32(head + 8) * be32(head + 12)) : 1;
  size_t bytes = (size_t)*n * (size_t)*dim;
  uint8_t *data = xmalloc(bytes);
  if (gzread(f, data, (unsigned)bytes) != (int)bytes) {
    die("%s is truncated", path);
  }
  gzclose(f);
  return data;
}

static void load(const char *dir, const char *prefix, struct dataset *d) {
  char name[64];
  int n2, one;
  snprintf(name, sizeof(name), "%s-images-idx3-ubyte.gz", prefix);
  d->x = read_idx(dir, name, 2051, &d->n, &d->dim);
  snprintf(name, sizeof(name), "%s-labels-idx1-ubyte.gz", prefix);
  d->y = read_idx(dir, name, 2049, &n2, &one);
  if (n2 != d->n) {
    die("image and label counts differ in %s", dir);
  }
}

/* Pixels to roughly zero mean and unit variance (Fashion-MNIST statistics). */
static void batch_input(const struct dataset *d, const int *idx, int n, float *x) {
  for (int i = 0; i < n; i++) {
    const uint8_t *src = d->x + (size_t)idx[i] * (size_t)d->dim;
    for (int j = 0; j < d->dim; j++) {
      x[(size_t)i * (size_t)d->dim + (size_t)j] = ((float)src[j] / 255.0f - 0.2860f) / 0.3530f;
    }
  }
}

/* xorshift64*: the same sequence on every rank for the same seed. */
static uint64_t rng_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

static double rng_normal(uint64_t *s) {
  double u1 = ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
  double u2 = ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static void shuffle(int *perm, int n, unsigned seed, int epoch) {
  uint64_t s = 0x9e3779b97f4a7c15ull ^ ((uint64_t)seed << 20) ^ (uint64_t)(epoch + 1);
  for (int i = 0; i < n; i++) {
    perm[i] = i;
  }
  for (int i = n - 1; i > 0; i--) {
    int j = (int)(rng_next(&s) % (uint64_t)(i + 1));
    int t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
}

/* ---- model ---------------------------------------------------------------------- */

#define NLAYERS 3
static const int widths[NLAYERS + 1] = {784, 512, 256, 10};

struct layer {
  int in, out;
  float *w, *b;   /* parameters: w is in x out, row-major */
  float *gw, *gb; /* gradients (accumulated over micro-batches) */
  float *vw, *vb; /* momentum */
};

struct model {
  struct layer l[NLAYERS];
  float *act[NLAYERS + 1]; /* activations of one batch: act[0] is the input */
  float *delta;            /* gradient w.r.t. a layer's output, reused */
  float *delta2;
  int cap;                 /* batch capacity of the buffers */
  float *host_in;          /* on the GPU: the batch is built here, then copied */
};

/* Gradients live in host-shared blocks: the ranks of a host then reduce
 * them straight out of each other's buffers instead of through the kernel. */
static float *grad_alloc(size_t floats) {
  void *p = NULL;
  if (hora_mem_alloc(floats * 4, &p) != HORA_SUCCESS) {
    die("gradient buffers: %s", hora_last_error());
  }
  return p;
}

static void model_init(struct model *m, int cap, unsigned seed) {
  uint64_t s = 0x2545f4914f6cdd1dull ^ ((uint64_t)seed * 7919);
  for (int k = 0; k < NLAYERS; k++) {
    struct layer *L = &m->l[k];
    L->in = widths[k];
    L->out = widths[k + 1];
    size_t nw = (size_t)L->in * (size_t)L->out;
    L->w = xmalloc(nw * 4);
    L->gw = grad_alloc(nw);
    L->vw = xmalloc(nw * 4);
    L->b = xmalloc((size_t)L->out * 4);
    L->gb = grad_alloc((size_t)L->out);
    L->vb = xmalloc((size_t)L->out * 4);
    double scale = sqrt(2.0 / L->in); /* He initialisation */
    for (size_t i = 0; i < nw; i++) {
      L->w[i] = (float)(rng_normal(&s) * scale);
    }
  }
  m->cap = cap;
  for (int k = 0; k <= NLAYERS; k++) {
    m->act[k] = xmalloc((size_t)cap * (size_t)widths[k] * 4);
  }
  m->delta = xmalloc((size_t)cap * 512 * 4);
  m->delta2 = xmalloc((size_t)cap * 512 * 4);
}

/* What model_init allocated on the host. */
static void model_free_host(struct model *m) {
  for (int k = 0; k < NLAYERS; k++) {
    hora_mem_free(m->l[k].gw);
    hora_mem_free(m->l[k].gb);
    free(m->l[k].w);
    free(m->l[k].vw);
    free(m->l[k].b);
    free(m->l[k].vb);
  }
  for (int k = 0; k <= NLAYERS; k++) {
    free(m->act[k]);
  }
  free(m->delta);
  free(m->delta2);
}

/* act[k+1] = relu(act[k] w + b), the last layer without relu. */
static void forward(struct model *m, int n) {
#if HORA_TRAIN_CUDA
  if (on_gpu) {
    for (int k = 0; k < NLAYERS; k++) {
      struct layer *L = &m->l[k];
      gpu_dense_forward(m->act[k], L->w, L->b, m->act[k + 1], n, L->in, L->out, k < NLAYERS - 1);
    }
    return;
  }
#endif
  for (int k = 0; k < NLAYERS; k++) {
    struct layer *L = &m->l[k];
    float *out = m->act[k + 1];
    for (int i = 0; i < n; i++) {
      memcpy(out + (size_t)i * (size_t)L->out, L->b, (size_t)L->out * 4);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, L->out, L->in, 1.0f, m->act[k],
                L->in, L->w, L->out, 1.0f, out, L->out);
    if (k < NLAYERS - 1) {
      size_t total = (size_t)n * (size_t)L->out;
      for (size_t i = 0; i < total; i++) {
        out[i] = out[i] > 0 ? out[i] : 0;
      }
    }
  }
}

/* Softmax cross-entropy over the logits; returns the mean loss, leaves the
 * gradient w.r.t. the logits (already divided by n) in m->delta. */
static double softmax_xent(struct model *m, const uint8_t *labels, const int *idx, int n,
                           int *correct) {
#if HORA_TRAIN_CUDA
  if (on_gpu) {
    uint8_t *y = xmalloc((size_t)n);
    for (int i = 0; i < n; i++) {
      y[i] = labels[idx[i]];
    }
    double loss = gpu_softmax_xent(m->act[NLAYERS], y, n, m->delta, correct);
    free(y);
    return loss;
  }
#endif
  const float *z = m->act[NLAYERS];
  double loss = 0;
  int ok = 0;
  for (int i = 0; i < n; i++) {
    const float *zi = z + (size_t)i * 10;
    float *di = m->delta + (size_t)i * 10;
    float mx = zi[0];
    int arg = 0;
    for (int c = 1; c < 10; c++) {
      if (zi[c] > mx) {
        mx = zi[c];
        arg = c;
      }
    }
    double sum = 0;
    for (int c = 0; c < 10; c++) {
      di[c] = expf(zi[c] - mx);
      sum += di[c];
    }
    int y = labels[idx[i]];
    loss += -(double)(zi[y] - mx) + log(sum);
    ok += arg == y;
    for (int c = 0; c < 10; c++) {
      di[c] = (float)(di[c] / sum) / (float)n;
    }
    di[y] -= 1.0f / (float)n;
  }
  if (correct) {
    *correct = ok;
  }
  return loss / n;
}

/* ---- gradient exchange ------------------------------------------------------------ */

static const char *const grad_names[NLAYERS][2] = {
    {"grad/fc1.weight", "grad/fc1.bias"}, {"grad/fc2.weight", "grad/fc2.bias"},
    {"grad/fc3.weight", "grad/fc3.bias"}};

struct exchange {
  hora_request *req[NLAYERS][2];
  hora_allreduce_options opts;
  double wait_seconds;
  int rc;             /* the first failed submission of this step, reported by wait_all */
  char error[1024];   /* its hora_last_error(), which the calls after it replace */
  hora_step_stats epoch_start; /* hora's step figures when the epoch began */
};

/* hora's figures for the epoch's steps (each ended by hora_step_mark). */
static void epoch_steps_begin(struct exchange *x) {
  x->epoch_start = (hora_step_stats){.struct_size = sizeof(hora_step_stats)};
  (void)hora_get_step_stats(&x->epoch_start);
}

static void print_epoch_steps(const struct exchange *x, long long epoch) {
  hora_step_stats s = {.struct_size = sizeof(s)};
  const hora_step_stats *b = &x->epoch_start;
  if (hora_get_step_stats(&s) != HORA_SUCCESS || s.steps <= b->steps) {
    return;
  }
  double n = (double)(s.steps - b->steps), seconds = s.seconds - b->seconds;
  double wait = s.wait_seconds - b->wait_seconds, comm = s.communicate_seconds - b->communicate_seconds;
  printf("epoch %lld  %.0f steps of %.1f ms: %.1f ms compute, %.1f ms exposed communication "
         "(%.0f%%); %.0f KiB reduced per step at %.2f GB/s bus bandwidth\n",
         epoch, n, 1e3 * seconds / n, 1e3 * (seconds - wait) / n, 1e3 * wait / n,
         seconds > 0 ? 100 * wait / seconds : 0, (double)(s.bytes - b->bytes) / n / 1024,
         comm > 0 ? (s.bus_bytes - b->bus_bytes) / comm * 1e-9 : 0);
}

static void exchange_failed(struct exchange *x, int rc) {
  if (rc != HORA_SUCCESS && x->rc == HORA_SUCCESS) {
    x->rc = rc;
    snprintf(x->error, sizeof(x->error), "%s", hora_last_error());
  }
}

/* After a failure the rest of the step is not submitted: it would fail too. */
static void submit_layer(struct exchange *x, struct layer *L, int k) {
  if (x->rc != HORA_SUCCESS) {
    return;
  }
#if HORA_TRAIN_CUDA
  if (on_gpu) {
    exchange_failed(x, gpu_allreduce_async(grad_names[k][0], L->gw, (size_t)L->in * (size_t)L->out,
                                           &x->opts, &x->req[k][0]));
    if (x->rc == HORA_SUCCESS) {
      exchange_failed(x, gpu_allreduce_async(grad_names[k][1], L->gb, (size_t)L->out, &x->opts,
                                             &x->req[k][1]));
    }
    return;
  }
#endif
  exchange_failed(x, hora_allreduce_async_ex(grad_names[k][0], L->gw, L->gw,
                                             (size_t)L->in * (size_t)L->out, HORA_FLOAT32,
                                             HORA_AVERAGE, &x->opts, &x->req[k][0]));
  if (x->rc == HORA_SUCCESS) {
    exchange_failed(x, hora_allreduce_async_ex(grad_names[k][1], L->gb, L->gb, (size_t)L->out,
                                               HORA_FLOAT32, HORA_AVERAGE, &x->opts,
                                               &x->req[k][1]));
  }
}

/* Waits for every submitted request, failed or not (each must be freed,
 * and the engine must be done with the buffers), and returns the step's
 * first failure (x->rc, with its message in x->error). */
static int wait_all(struct exchange *x) {
  double t0 = now();
  for (int k = NLAYERS - 1; k >= 0; k--) {
    for (int j = 0; j < 2; j++) {
      if (x->req[k][j]) {
        exchange_failed(x, hora_wait(&x->req[k][j]));
      }
    }
  }
  x->wait_seconds += now() - t0;
  return x->rc;
}

/* Backward pass over n samples of act[0]; gradients add to gw/gb, scaled
 * by s (a micro-batch's share of the step's gradient). When `submit`,
 * each layer's gradients go to hora the moment they are done, while the
 * layers below are still being computed. */
static void backward(struct model *m, int n, float s, struct exchange *x, int submit) {
  float *d = m->delta, *d2 = m->delta2;
#if HORA_TRAIN_CUDA
  if (on_gpu) {
    for (int k = NLAYERS - 1; k >= 0; k--) {
      struct layer *L = &m->l[k];
      gpu_dense_backward(m->act[k], d, L->w, L->gw, L->gb, k > 0 ? d2 : NULL, n, L->in, L->out, s);
      if (submit) {
        submit_layer(x, L, k); /* ordered after the kernels above on the stream */
      }
      float *t = d;
      d = d2;
      d2 = t;
    }
    return;
  }
#endif
  for (int k = NLAYERS - 1; k >= 0; k--) {
    struct layer *L = &m->l[k];
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, L->in, L->out, n, s, m->act[k], L->in, d,
                L->out, 1.0f, L->gw, L->out);
    for (int i = 0; i < n; i++) {
      const float *di = d + (size_t)i * (size_t)L->out;
      for (int o = 0; o < L->out; o++) {
        L->gb[o] += s * di[o];
      }
    }
    if (submit) {
      submit_layer(x, L, k);
    }
    if (k > 0) {
      /* d2 = d w^T, masked by the relu of the layer below. */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, L->in, L->out, 1.0f, d, L->out, L->w,
                  L->out, 0.0f, d2, L->in);
      const float *a = m->act[k];
      size_t total = (size_t)n * (size_t)L->in;
      for (size_t i = 0; i < total; i++) {
        if (a[i] <= 0) {
          d2[i] = 0;
        }
      }
      float *t = d;
      d = d2;
      d2 = t;
    }
  }
}

/* Linear warm-up over the first steps, then a cosine from the peak to zero
 * at the last step of the run. */
static double learning_rate(double peak, long step, int warmup, long total) {
  if (warmup > 0 && step < warmup) {
    return peak * (double)(step + 1) / warmup;
  }
  long span = total - warmup;
  if (span <= 0) {
    return peak;
  }
  double progress = (double)(step - warmup) / (double)span;
  return peak * 0.5 * (1.0 + cos(M_PI * (progress < 1 ? progress : 1)));
}

static void sgd_step(struct model *m, double lr, double momentum) {
  for (int k = 0; k < NLAYERS; k++) {
    struct layer *L = &m->l[k];
    size_t nw = (size_t)L->in * (size_t)L->out;
    float mu = (float)momentum, eta = (float)lr;
#if HORA_TRAIN_CUDA
    if (on_gpu) {
      gpu_sgd(L->w, L->vw, L->gw, nw, eta, mu);
      gpu_sgd(L->b, L->vb, L->gb, (size_t)L->out, eta, mu);
      continue;
    }
#endif
    for (size_t i = 0; i < nw; i++) {
      L->vw[i] = mu * L->vw[i] + L->gw[i];
      L->w[i] -= eta * L->vw[i];
      L->gw[i] = 0;
    }
    for (int o = 0; o < L->out; o++) {
      L->vb[o] = mu * L->vb[o] + L->gb[o];
      L->b[o] -= eta * L->vb[o];
      L->gb[o] = 0;
    }
  }
}

/* Parameters and momentum as one named list, for the broadcast helper. */
static size_t state_tensors(struct model *m, hora_tensor *t) {
  static const char *const names[NLAYERS][4] = {
      {"state/fc1.weight", "state/fc1.bias", "state/fc1.weight.momentum", "state/fc1.bias.momentum"},
      {"state/fc2.weight", "state/fc2.bias", "state/fc2.weight.momentum", "state/fc2.bias.momentum"},
      {"state/fc3.weight", "state/fc3.bias", "state/fc3.weight.momentum", "state/fc3.bias.momentum"}};
  size_t n = 0;
  for (int k = 0; k < NLAYERS; k++) {
    struct layer *L = &m->l[k];
    size_t nw = (size_t)L->in * (size_t)L->out;
    t[n++] = (hora_tensor){names[k][0], L->w, nw, HORA_FLOAT32};
    t[n++] = (hora_tensor){names[k][1], L->b, (size_t)L->out, HORA_FLOAT32};
    t[n++] = (hora_tensor){names[k][2], L->vw, nw, HORA_FLOAT32};
    t[n++] = (hora_tensor){names[k][3], L->vb, (size_t)L->out, HORA_FLOAT32};
  }
  return n;
}

/* ---- checkpoint ------------------------------------------------------------------- */

#define CKPT_MAGIC 0x746b6368726f6801ull /* "hora" checkpoint, version 1 */

/* A tensor's values in host memory: its own buffer, or a copy from the GPU. */
static float *host_copy(const hora_tensor *t) {
#if HORA_TRAIN_CUDA
  if (on_gpu) {
    float *h = xmalloc(t->count * 4);
    gpu_download(h, t->buf, t->count);
    return h;
  }
#endif
  return t->buf;
}

/* The model's buffers move to the GPU (weights as initialised here). */
static void model_to_gpu(struct model *m) {
#if HORA_TRAIN_CUDA
  for (int k = 0; k < NLAYERS; k++) {
    struct layer *L = &m->l[k];
    size_t nw = (size_t)L->in * (size_t)L->out, nb = (size_t)L->out;
    float **host[6] = {&L->w, &L->b, &L->gw, &L->gb, &L->vw, &L->vb};
    size_t len[6] = {nw, nb, nw, nb, nw, nb};
    for (int j = 0; j < 6; j++) {
      float *d = gpu_upload(*host[j], len[j]);
      if (j == 2 || j == 3) {
        hora_mem_free(*host[j]);
      } else {
        free(*host[j]);
      }
      *host[j] = d;
    }
  }
  m->host_in = m->act[0];
  for (int k = 0; k <= NLAYERS; k++) {
    m->act[k] = gpu_zeros((size_t)m->cap * (size_t)widths[k]);
  }
  free(m->delta);
  free(m->delta2);
  m->delta = gpu_zeros((size_t)m->cap * 512);
  m->delta2 = gpu_zeros((size_t)m->cap * 512);
  on_gpu = 1;
#else
  (void)m;
#endif
}

/* The batch's inputs into act[0] (through host_in on the GPU). */
static void load_batch(struct model *m, const struct dataset *d, const int *idx, int n) {
#if HORA_TRAIN_CUDA
  if (on_gpu) {
    batch_input(d, idx, n, m->host_in);
    gpu_copy_in(m->act[0], m->host_in, (size_t)n * (size_t)d->dim);
    return;
  }
#endif
  batch_input(d, idx, n, m->act[0]);
}

static void save_checkpoint(struct model *m, const char *path, int32_t next_epoch, int64_t step) {
  char tmp[4200];
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    fprintf(stderr, "train: cannot write checkpoint %s: %s\n", tmp, strerror(errno));
    return;
  }
  uint64_t magic = CKPT_MAGIC;
  int ok = fwrite(&magic, 8, 1, f) == 1 && fwrite(&next_epoch, 4, 1, f) == 1 &&
           fwrite(&step, 8, 1, f) == 1;
  hora_tensor t[4 * NLAYERS];
  size_t n = state_tensors(m, t);
  for (size_t i = 0; i < n && ok; i++) {
    float *h = host_copy(&t[i]);
    ok = fwrite(h, 4, t[i].count, f) == t[i].count;
    if (h != t[i].buf) {
      free(h);
    }
  }
  if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) {
    fprintf(stderr, "train: writing checkpoint %s failed: %s\n", path, strerror(errno));
  }
}

/* Rank 0 reads; every rank gets the result through broadcasts. */
static void load_checkpoint(struct model *m, const char *path, int32_t *next_epoch, int64_t *step) {
  int64_t meta[2] = {0, 0};
  int ok = 1;
  hora_tensor t[4 * NLAYERS];
  size_t n = state_tensors(m, t);
  if (rank == 0) {
    FILE *f = fopen(path, "rb");
    uint64_t magic = 0;
    int32_t e = 0;
    ok = f && fread(&magic, 8, 1, f) == 1 && magic == CKPT_MAGIC && fread(&e, 4, 1, f) == 1 &&
         fread(&meta[1], 8, 1, f) == 1;
    for (size_t i = 0; i < n && ok; i++) {
      float *h = on_gpu ? xmalloc(t[i].count * 4) : t[i].buf;
      ok = fread(h, 4, t[i].count, f) == t[i].count;
#if HORA_TRAIN_CUDA
      if (on_gpu) {
        gpu_copy_in(t[i].buf, h, t[i].count);
        free(h);
      }
#endif
    }
    if (f) {
      fclose(f);
    }
    meta[0] = ok ? e : -1;
  }
  CHECK(hora_broadcast("checkpoint/meta", meta, 2, HORA_INT64, 0));
  if (meta[0] < 0) {
    die("cannot resume: %s is missing or not a checkpoint of this trainer", path);
  }
  CHECK(hora_broadcast_parameters(t, n, 0));
  *next_epoch = (int32_t)meta[0];
  *step = meta[1];
}

/* ---- evaluation --------------------------------------------------------------------- */

static double evaluate(struct model *m, const struct dataset *test, int cap) {
  int *idx = xmalloc((size_t)cap * sizeof(int));
  int correct = 0;
  for (int at = 0; at < test->n; at += cap) {
    int n = test->n - at < cap ? test->n - at : cap;
    for (int i = 0; i < n; i++) {
      idx[i] = at + i;
    }
    load_batch(m, test, idx, n);
    forward(m, n);
    int ok;
    softmax_xent(m, test->y, idx, n, &ok);
    correct += ok;
  }
  free(idx);
  return (double)correct / test->n;
}

/* ---- elastic training ----------------------------------------------------------------- */

/* Where the run is: with the weights and momentum, what a commit saves and
 * a reset rolls back to. */
struct progress {
  int64_t epoch;      /* from 0 */
  int64_t pos;        /* samples of the epoch's order consumed, by all ranks */
  int64_t step;       /* optimizer steps taken */
  int64_t loss_count; /* this epoch's global losses, for its line */
  double loss_sum;
};

struct elastic {
  struct progress at, saved;
  float *copy[NLAYERS][4]; /* w, b, vw, vb at the last commit */
  int has_state;           /* 0 in a newcomer until its first sync */
  int orig_rank;           /* the rank at start-up; -1 in a newcomer */
  int prev_size;           /* the size at the last sync */
  int64_t perm_epoch;      /* the epoch `perm` was shuffled for */
  double t_epoch;          /* for the epoch line: when this process began the epoch, */
  int64_t samples;         /* and the samples all ranks took since (steps redone too) */
  double accuracy;         /* rank 0's last evaluation, */
  int64_t accuracy_step;   /* and the step it was made at (-1: none) */
  double reset_seconds;
};

static void el_copy(struct model *m, struct elastic *e, int save) {
  for (int k = 0; k < NLAYERS; k++) {
    struct layer *L = &m->l[k];
    size_t nw = (size_t)L->in * (size_t)L->out, nb = (size_t)L->out;
    float *live[4] = {L->w, L->b, L->vw, L->vb};
    size_t len[4] = {nw, nb, nw, nb};
    for (int j = 0; j < 4; j++) {
      if (!e->copy[k][j]) {
        e->copy[k][j] = xmalloc(len[j] * 4);
      }
      memcpy(save ? e->copy[k][j] : live[j], save ? live[j] : e->copy[k][j], len[j] * 4);
    }
  }
}

static void el_save(struct model *m, struct elastic *e) {
  el_copy(m, e, 1);
  e->saved = e->at;
}

/* Back to the last commit; a failed step may have left gradients half
 * accumulated or half reduced. */
static void el_restore(struct model *m, struct elastic *e) {
  el_copy(m, e, 0);
  e->at = e->saved;
  for (int k = 0; k < NLAYERS; k++) {
    struct layer *L = &m->l[k];
    memset(L->gw, 0, (size_t)L->in * (size_t)L->out * 4);
    memset(L->gb, 0, (size_t)L->out * 4);
  }
}

/* FNV-1a over bytes: the weights and momentum (for the tests' check that
 * every member holds the same state after a sync), and the options that
 * every member must share. */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) {
    h = (h ^ b[i]) * 1099511628211ull;
  }
  return h;
}

static uint32_t state_checksum(struct model *m) {
  hora_tensor t[4 * NLAYERS];
  size_t n = state_tensors(m, t);
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < n; i++) {
    h = fnv(h, t[i].buf, t[i].count * 4);
  }
  return (uint32_t)(h ^ h >> 32);
}

static int64_t options_fingerprint(const struct options *o) {
  char text[512];
  snprintf(text, sizeof(text), "%d %d %.17g %.17g %d %d %d %u %d %d", o->epochs, o->batch, o->lr,
           o->momentum, o->warmup_steps, o->accum_steps, o->fp16, o->seed, o->max_steps,
           o->commit_every);
  return (int64_t)(fnv(14695981039346656037ull, text, strlen(text)) >> 1);
}

static int el_done(const struct elastic *e, const struct options *o) {
  return e->at.epoch >= o->epochs || (o->max_steps && e->at.step >= o->max_steps);
}

static long ceil_div(long a, long b) { return (a + b - 1) / b; }

/* The schedule of the plain run, over the steps this run will take if the
 * size stays as it is now: after a change the cosine stretches or shrinks
 * over what is left (with a constant size it is the plain run's). */
static double el_lr(const struct elastic *e, const struct options *o, int n) {
  long global = (long)o->batch * nranks;
  long per_epoch = ceil_div(ceil_div(n, global), o->accum_steps);
  long left = e->at.epoch < o->epochs
                  ? ceil_div(ceil_div(n - (long)e->at.pos, global), o->accum_steps) +
                        (o->epochs - (long)e->at.epoch - 1) * per_epoch
                  : 0;
  return learning_rate(o->lr * nranks, (long)e->at.step, o->warmup_steps,
                       (long)e->at.step + left);
}

/* Every member takes the state of the lowest rank that has one (a
 * survivor: newcomers follow them in rank order), then goes on from
 * there with its new rank and size. `why` is NULL at start-up, else what
 * changed the membership (and took e->reset_seconds), for its lines. */
static int el_sync(struct model *m, struct elastic *e, const struct options *o, int n,
                   const char *why) {
  rank = hora_rank();
  nranks = hora_size();
  int32_t mine = e->has_state ? rank : INT32_MAX, root = INT32_MAX;
  int rc = hora_allreduce("elastic/root", &mine, &root, 1, HORA_INT32, HORA_MIN);
  if (rc != HORA_SUCCESS) {
    return rc;
  }
  if (root == INT32_MAX) {
    fprintf(stderr, "train: rank %d: --elastic: no member holds a model (every original rank "
            "is gone)\n", rank);
    exit(1);
  }
  int64_t meta[7] = {e->at.epoch, e->at.pos, e->at.step, e->at.loss_count, 0, e->prev_size,
                     options_fingerprint(o)};
  memcpy(&meta[4], &e->at.loss_sum, 8);
  rc = hora_broadcast("elastic/progress", meta, 7, HORA_INT64, root);
  if (rc != HORA_SUCCESS) {
    return rc;
  }
  if (meta[6] != options_fingerprint(o)) {
    /* Leaving without hora_abort: the job goes on without this process. */
    fprintf(stderr, "train: rank %d: --elastic: this process's training options (epochs, "
            "batch, lr, momentum, warm-up, accumulation, fp16, seed, max steps, commit "
            "interval) differ from the job's; leaving it\n", rank);
    exit(1);
  }
  hora_tensor t[4 * NLAYERS];
  size_t nt = state_tensors(m, t);
  rc = hora_broadcast_parameters(t, nt, root);
  if (rc != HORA_SUCCESS) {
    return rc;
  }
  e->at = (struct progress){.epoch = meta[0], .pos = meta[1], .step = meta[2],
                            .loss_count = meta[3]};
  memcpy(&e->at.loss_sum, &meta[4], 8);
  e->has_state = 1;
  el_save(m, e);
  if (why) {
    printf("elastic: membership %d: %d ranks (was %d); resuming at epoch %lld step %lld; lr %.6g\n",
           hora_elastic_epoch(), nranks, (int)meta[5], (long long)e->at.epoch + 1,
           (long long)e->at.step, el_lr(e, o, n));
    printf("elastic: membership %d: rank %d: %s took %.3f s; state checksum %08x\n",
           hora_elastic_epoch(), rank, why, e->reset_seconds, state_checksum(m));
    fflush(stdout);
  }
  e->prev_size = nranks;
  return HORA_SUCCESS;
}

static void *die_soon(void *arg) {
  (void)arg;
  struct timespec t = {0, 50 * 1000000L};
  nanosleep(&t, NULL);
  raise(SIGKILL);
  return NULL;
}

static int el_reset(struct elastic *e, const struct options *o, int after_loss) {
  if (after_loss && e->orig_rank >= 0 && e->orig_rank == o->die_in_reset_rank) {
    fprintf(stderr, "train: rank %d: drill: killing this process 50 ms into the reset\n", rank);
    pthread_t t;
    if (pthread_create(&t, NULL, die_soon, NULL) == 0) {
      pthread_detach(t);
    }
  }
  double t0 = now();
  int rc = hora_elastic_reset();
  e->reset_seconds = now() - t0;
  if (rc != HORA_SUCCESS) {
    fprintf(stderr, "train: rank %d: hora_elastic_reset failed after %.3f s: %s (%s)\n", rank,
            e->reset_seconds, hora_strerror(rc), hora_last_error());
    exit(1);
  }
  return rc;
}

/* One optimizer step (accum_steps micro-batches): this rank's share of the
 * next samples of the epoch's order, at the current size. Returns the
 * first failure, after every request of the step has been waited for. */
static int el_step(struct model *m, struct elastic *e, const struct options *o,
                   const struct dataset *train, const struct dataset *test, int cap, int *perm,
                   struct exchange *x) {
  if (e->perm_epoch != e->at.epoch) {
    shuffle(perm, train->n, o->seed, (int)e->at.epoch);
    e->perm_epoch = e->at.epoch;
  }
  if (e->at.pos == 0 || e->t_epoch == 0) {
    e->t_epoch = now();
    e->samples = 0;
    x->wait_seconds = 0;
    epoch_steps_begin(x);
  }
  const long n = train->n, global = (long)o->batch * nranks;
  const double lr = el_lr(e, o, train->n);
  double gloss = 0;
  for (int micro = 1;; micro++) {
    long pos = (long)e->at.pos, taken = n - pos < global ? n - pos : global;
    long begin = pos + (long)rank * o->batch;
    int mine = begin >= n ? 0 : (int)(n - begin < o->batch ? n - begin : o->batch);
    int last = micro == o->accum_steps || pos + taken >= n;
    /* Weighted so that the average over the ranks is the mean over the
     * samples taken: the last batch of an epoch is uneven, and a rank
     * with no sample in it sends zeros. */
    double weight = (double)mine * nranks / (double)taken;
    double loss = 0;
    if (mine > 0) {
      load_batch(m, train, perm + begin, mine);
      forward(m, mine);
      loss = weight * softmax_xent(m, train->y, perm + begin, mine, NULL);
      backward(m, mine, (float)(weight / o->accum_steps), x, last);
    } else if (last) {
      for (int k = NLAYERS - 1; k >= 0; k--) {
        submit_layer(x, &m->l[k], k);
      }
    }
    hora_request *lreq = NULL;
    exchange_failed(x, hora_allreduce_async("loss", &loss, &gloss, 1, HORA_FLOAT64, HORA_AVERAGE,
                                            &lreq));
    if (last) {
      wait_all(x); /* before the loss, as in the plain loop: the wait share is the gradients' */
    }
    if (lreq) {
      exchange_failed(x, hora_wait(&lreq));
    }
    int rc = x->rc;
    x->rc = HORA_SUCCESS;
    if (rc != HORA_SUCCESS) {
      return rc;
    }
    e->at.pos += taken;
    e->samples += taken;
    e->at.loss_sum += gloss;
    e->at.loss_count++;
    if (last) {
      break;
    }
  }
  sgd_step(m, lr, o->momentum);
  (void)hora_step_mark();
  e->at.step++;
  if (rank == 0 && e->at.step <= o->print_steps) {
    printf("step %lld loss %.9g\n", (long long)e->at.step, gloss);
  }
  if (e->at.pos >= n || (o->max_steps && e->at.step >= o->max_steps)) {
    if (rank == 0) {
      double seconds = now() - e->t_epoch;
      e->accuracy = evaluate(m, test, cap);
      e->accuracy_step = e->at.step;
      /* The wait share is rank 0's own: a collective here would be one
       * more place to fail. */
      printf("epoch %lld  loss %.4f  test_accuracy %.4f  %.0f samples/s  waiting for "
             "communication %.0f%% of step time\n",
             (long long)e->at.epoch + 1,
             e->at.loss_count ? e->at.loss_sum / (double)e->at.loss_count : 0, e->accuracy,
             (double)e->samples / seconds, 100 * x->wait_seconds / seconds);
      print_epoch_steps(x, (long long)e->at.epoch + 1);
      fflush(stdout);
      save_checkpoint(m, o->checkpoint, (int32_t)e->at.epoch + 1, e->at.step);
    }
    e->at.epoch++;
    e->at.pos = 0;
    e->at.loss_sum = 0;
    e->at.loss_count = 0;
  }
  return HORA_SUCCESS;
}

static int keep_error(struct exchange *x, int rc) {
  if (rc != HORA_SUCCESS) {
    snprintf(x->error, sizeof(x->error), "%s", hora_last_error());
  }
  return rc;
}

/* The training loop of --elastic, after the model's buffers exist; returns
 * rank 0's final test accuracy. A commit every commit_every steps; a lost
 * peer (or another member's request for a reset: ABORTED) rolls back to it;
 * newcomers waiting at a commit are let in there. */
static double train_elastic(struct model *m, const struct options *o, const struct dataset *train,
                            const struct dataset *test, int cap) {
  struct elastic e;
  memset(&e, 0, sizeof(e));
  e.orig_rank = hora_elastic_joined() ? -1 : rank;
  e.has_state = !hora_elastic_joined();
  e.prev_size = nranks;
  e.perm_epoch = -1;
  e.accuracy_step = -1;
  if (e.has_state && o->resume) {
    int32_t first_epoch = 0;
    int64_t step = 0;
    load_checkpoint(m, o->checkpoint, &first_epoch, &step);
    e.at.epoch = first_epoch;
    e.at.step = step;
    if (rank == 0) {
      printf("resumed from %s at epoch %d, step %lld\n", o->checkpoint, first_epoch + 1,
             (long long)step);
    }
  }
  struct exchange x;
  memset(&x, 0, sizeof(x));
  x.opts = (hora_allreduce_options)HORA_ALLREDUCE_OPTIONS_INIT;
  x.opts.compression = o->fp16 ? HORA_COMPRESSION_FP16 : HORA_COMPRESSION_NONE;
  int *perm = xmalloc((size_t)train->n * sizeof(int));
  el_save(m, &e); /* what a failure in the first sync rolls back to */
  e.reset_seconds = init_seconds; /* a newcomer's wait to be let in */
  int rc = keep_error(&x, el_sync(m, &e, o, train->n,
                                  hora_elastic_joined() ? "joining (hora_init)" : NULL));
  if (rank == 0 && rc == HORA_SUCCESS && !hora_elastic_joined()) {
    printf("train: %d ranks, %d samples per rank per step (global %d), %d accumulation step(s), "
           "lr %.4g -> %.4g, %s allreduce, elastic (commit every %d steps)\n",
           nranks, o->batch, o->batch * nranks * o->accum_steps, o->accum_steps, o->lr,
           o->lr * nranks, o->fp16 ? "fp16" : "float32", o->commit_every);
    fflush(stdout);
  }
  while (rc != HORA_SUCCESS || !el_done(&e, o)) {
    if (rc == HORA_SUCCESS) {
      if (e.orig_rank >= 0 && e.orig_rank == o->die_rank &&
          (o->die_with_ranks > 0 ? e.at.step >= o->die_at && nranks == o->die_with_ranks
                                 : e.at.step == o->die_at)) {
        fprintf(stderr, "train: rank %d: drill: killing this process at step %lld\n", rank,
                (long long)e.at.step);
        raise(SIGKILL);
      }
      rc = el_step(m, &e, o, train, test, cap, perm, &x);
      if (rc == HORA_SUCCESS && e.at.step % o->commit_every == 0) {
        el_save(m, &e);
        int changed = 0;
        rc = keep_error(&x, hora_elastic_commit(&changed));
        if (rc == HORA_SUCCESS && changed) {
          el_reset(&e, o, 0);
          rc = keep_error(&x, el_sync(m, &e, o, train->n, "the reset to admit newcomers"));
        }
      }
      continue;
    }
    if (rc != HORA_ERR_PEER_LOST && rc != HORA_ERR_ABORTED) {
      fatal(rc, "a step of elastic training", x.error);
    }
    fprintf(stderr, "train: rank %d: step %lld: %s: back to the commit of step %lld\n", rank,
            (long long)e.at.step + 1, x.error, (long long)e.saved.step);
    el_reset(&e, o, 1);
    el_restore(m, &e);
    rc = keep_error(&x, el_sync(m, &e, o, train->n, "the reset after a lost rank"));
  }
  free(perm);
  if (rank == 0 && e.accuracy_step != e.at.step) {
    e.accuracy = evaluate(m, test, cap); /* this rank took over after the last evaluation */
  }
  for (int k = 0; k < NLAYERS; k++) {
    for (int j = 0; j < 4; j++) {
      free(e.copy[k][j]);
    }
  }
  return e.accuracy;
}

/* ---- training ------------------------------------------------------------------------ */

/* The plain training loop; returns rank 0's final test accuracy. */
static double train_plain(struct model *m, const struct options *o, const struct dataset *train,
                          const struct dataset *test, int cap) {
  hora_tensor state[4 * NLAYERS];
  size_t nstate = state_tensors(m, state);
  CHECK(hora_broadcast_parameters(state, nstate, 0)); /* ... and rank 0's win */

  int32_t first_epoch = 0;
  int64_t step = 0;
  if (o->resume) {
    load_checkpoint(m, o->checkpoint, &first_epoch, &step);
    if (rank == 0) {
      printf("resumed from %s at epoch %d, step %lld\n", o->checkpoint, first_epoch + 1,
             (long long)step);
    }
  }

  struct exchange x;
  memset(&x, 0, sizeof(x));
  x.opts = (hora_allreduce_options)HORA_ALLREDUCE_OPTIONS_INIT;
  x.opts.compression = o->fp16 ? HORA_COMPRESSION_FP16 : HORA_COMPRESSION_NONE;
  int *perm = xmalloc((size_t)train->n * sizeof(int));
  const int global = o->batch * nranks; /* samples per micro-batch, all ranks */
  const double peak_lr = o->lr * nranks;
  /* Optimizer steps per epoch: the last micro-batch of an epoch always steps. */
  const long micro_per_epoch = (train->n + global - 1) / global;
  const long steps_per_epoch = (micro_per_epoch + o->accum_steps - 1) / o->accum_steps;
  double accuracy = 0;
  int stop = 0;
  if (rank == 0) {
    printf("train: %d ranks, %d samples per rank per step (global %d), %d accumulation step(s), "
           "lr %.4g -> %.4g, %s allreduce, model on the %s\n",
           nranks, o->batch, global * o->accum_steps, o->accum_steps, o->lr, peak_lr,
           o->fp16 ? "fp16" : "float32", on_gpu ? "GPU" : "CPU");
    fflush(stdout);
  }
  for (int epoch = first_epoch; epoch < o->epochs && !stop; epoch++) {
    shuffle(perm, train->n, o->seed, epoch);
    double t0 = now(), loss_sum = 0;
    int loss_count = 0, micro = 0;
    long samples = 0;
    x.wait_seconds = 0;
    epoch_steps_begin(&x);
    for (int at = 0; at < train->n; at += global) {
      /* This rank's shard of the global batch; the last one is uneven. */
      int begin = at + rank * o->batch;
      int n = begin >= train->n ? 0 : (train->n - begin < o->batch ? train->n - begin : o->batch);
      if (n == 0) {
        break; /* out of data: join below and serve the others */
      }
      load_batch(m, train, perm + begin, n);
      forward(m, n);
      double loss = softmax_xent(m, train->y, perm + begin, n, NULL);
      int last_micro = ++micro == o->accum_steps || at + global >= train->n;
      backward(m, n, 1.0f / (float)o->accum_steps, &x, last_micro);
      samples += n;
      /* The global loss: the mean of the ranks' means, like the gradients. */
      double gloss = loss;
      hora_request *lreq;
      CHECK(hora_allreduce_async("loss", &loss, &gloss, 1, HORA_FLOAT64, HORA_AVERAGE, &lreq));
      if (!last_micro) {
        CHECK(hora_wait(&lreq));
        loss_sum += gloss;
        loss_count++;
        continue;
      }
      int rc = wait_all(&x);
      if (rc != HORA_SUCCESS) {
        fatal(rc, "the gradients' allreduce", x.error);
      }
      CHECK(hora_wait(&lreq));
      loss_sum += gloss;
      loss_count++;
      micro = 0;
      /* The schedule's step comes from the position in the data, which
       * every rank with data agrees on (joined ranks skip steps). */
      long s = (long)epoch * steps_per_epoch + (at / global) / o->accum_steps;
      sgd_step(m, learning_rate(peak_lr, s, o->warmup_steps, (long)o->epochs * steps_per_epoch),
               o->momentum);
      (void)hora_step_mark();
      step++;
      if (rank == 0 && step <= o->print_steps) {
        printf("step %lld loss %.9g\n", (long long)step, gloss);
      }
      if (o->max_steps && step >= o->max_steps) {
        stop = 1;
        break;
      }
    }
    /* Everyone ends the epoch here; ranks that ran out early have been
     * serving the others' allreduces with zeros. Joined ranks missed the
     * last steps, so the last rank to join has the final state. */
    int last = -1;
#if HORA_TRAIN_CUDA
    if (on_gpu) {
      gpu_sync(); /* the optimizer's kernels: the broadcast below reads the weights */
    }
#endif
    CHECK(hora_join(&last));
    CHECK(hora_broadcast_parameters(state, nstate, last));
    long all_samples = 0;
    CHECK(hora_allreduce("epoch/samples", &samples, &all_samples, 1, HORA_INT64, HORA_SUM));
    double seconds = now() - t0;
    double wait_share = x.wait_seconds / seconds, mean_share = 0;
    CHECK(hora_allreduce("epoch/wait", &wait_share, &mean_share, 1, HORA_FLOAT64, HORA_AVERAGE));
    if (rank == 0) {
      accuracy = evaluate(m, test, cap);
      printf("epoch %d  loss %.4f  test_accuracy %.4f  %.0f samples/s  waiting for "
             "communication %.0f%% of step time\n",
             epoch + 1, loss_count ? loss_sum / loss_count : 0, accuracy,
             (double)all_samples / seconds, 100 * mean_share);
      print_epoch_steps(&x, epoch + 1);
      fflush(stdout);
      save_checkpoint(m, o->checkpoint, epoch + 1, step);
    }
  }
  if (o->resume && first_epoch >= o->epochs && rank == 0) {
    accuracy = evaluate(m, test, cap);
  }
  free(perm);
  return accuracy;
}

int main(int argc, char **argv) {
  struct options o;
  if (parse_options(argc, argv, &o) != 0) {
    return 2;
  }
  /* The data first: a process joining an elastic job is let in at a
   * commit, and the others wait for it from there on. */
  struct dataset train, test;
  load(o.data_dir, "train", &train);
  load(o.data_dir, "t10k", &test);
  double t0 = now();
  CHECK(hora_init());
  init_seconds = now() - t0;
  rank = hora_rank();
  nranks = hora_size();
  if (o.elastic && hora_elastic_epoch() < 0) {
    die("--elastic: %s", "the job is not elastic (HORA_ELASTIC=1 in every process's environment)");
  }
  /* One BLAS thread per rank: the ranks already fill the cores. */
  openblas_set_num_threads(1);
  if (o.cuda) {
#if HORA_TRAIN_CUDA
    char why[256];
    if (gpu_setup(hora_local_rank(), why, sizeof(why)) != 0) {
      die("--device cuda: %s", why);
    }
#else
    die("--device cuda: %s", "this build has no CUDA (configure found none)");
#endif
  }

  int cap = o.batch > 1000 ? o.batch : 1000;
  struct model m;
  model_init(&m, cap, o.seed + (unsigned)rank * 1000003u); /* different on every rank */
  if (o.cuda) {
    model_to_gpu(&m);
  }
  double accuracy = o.elastic ? train_elastic(&m, &o, &train, &test, cap)
                              : train_plain(&m, &o, &train, &test, cap);
  if (rank == 0) {
    printf("test_accuracy=%.4f\n", accuracy);
  }
  CHECK(hora_finalize());
#if HORA_TRAIN_CUDA
  if (on_gpu) {
    gpu_teardown();
  }
#endif
  if (!o.cuda) {
    model_free_host(&m); /* (a sanitizer's leak check runs after main) */
  }
  free(train.x);
  free(train.y);
  free(test.x);
  free(test.y);
  return 0;
}
