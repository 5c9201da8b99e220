#!/bin/sh
# The GPU check: on a machine with a GPU, builds hora with CUDA and NCCL
# and runs
#   1. one rank through NCCL: every dtype and op, fused, broadcast,
#      allgather, scaling, a joined rank, the stream-ordered calls;
#   2. 2 and 4 ranks sharing the GPU (NCCL forbids that, so they take the
#      staged path), and 2 ranks with HORA_GPU_TRANSPORT=host;
#   3. the fusion copy kernel's bandwidth next to cudaMemcpy D2D;
#   4. the timeline of a 64 MiB device allreduce: no host-side copy.
# Ends with one summary line: "gpu-check: N passed, N failed, N skipped".
# usage: scripts/gpu-check.sh    (from the source tree; builds in build/gpu)
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
cd "$src"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
say() { echo "$*" | tee -a "$log"; }

command -v mpicc >/dev/null 2>&1 && command -v autoreconf >/dev/null 2>&1 ||
  scripts/install-deps.sh || { say "FAIL gpu-check/deps: scripts/install-deps.sh failed"; }
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  say "SKIP gpu-check/all: no GPU here (nvidia-smi -L fails)"
else
  nvidia-smi -L | head -n 4
  b="$src/build/gpu"
  rm -rf "$b" && mkdir -p "$b"
  git ls-files -z 2>/dev/null | xargs -0 cp --parents -t "$b" 2>/dev/null ||
    (tar cf - --exclude=./build --exclude=./.git . | (cd "$b" && tar xf -))
  if (cd "$b" && ./autogen.sh >/dev/null 2>&1 && ./configure --with-cuda --with-nccl >configure.out 2>&1 &&
      make -j"$(nproc)" >make.out 2>&1 &&
      make -j"$(nproc)" tests/mpi/test_gpu tests/gpu_copy_bench >>make.out 2>&1); then
    say "PASS gpu-check/build (configure --with-cuda --with-nccl)"
    flags="--oversubscribe --bind-to none"
    [ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"
    export OMPI_MCA_mpi_yield_when_idle=1
    run() { # label np settings...
      label=$1 np=$2
      shift 2
      env "$@" HORA_LOG_LEVEL=info HORA_TIMELINE="$b/timeline-$label.json" \
        timeout 300 mpirun $flags -np "$np" "$b/tests/mpi/test_gpu" </dev/null >"$b/$label.out" 2>&1
      rc=$?
      grep -E '^(PASS|FAIL|SKIP) ' "$b/$label.out" | sed "s#^\([A-Z]*\) #\1 $label/#" | tee -a "$log"
      path=$(grep -o 'device collectives [a-z ]*' "$b/$label.out" | head -n 1)
      echo "   ($label: ${path:-no device collective logged})"
      [ $rc -eq 0 ] || { say "FAIL $label: exit status $rc"; tail -n 20 "$b/$label.out"; }
    }
    run np1-nccl 1 HORA_GPU_TRANSPORT=auto
    run np2-shared 2 HORA_GPU_TRANSPORT=auto
    run np4-shared 4 HORA_GPU_TRANSPORT=auto
    run np2-host 2 HORA_GPU_TRANSPORT=host
    "$b/tests/gpu_copy_bench" | tee -a "$log"
    # The 64 MiB tensor ran alone, in place on the GPU: its timeline row
    # has the NCCL phase and no copy phase.
    tl="$b/timeline-np1-nccl.json"
    tid=$(grep -o '"tid":[0-9]*,"args":{"name":"big/avg"}' "$tl" 2>/dev/null | grep -o '"tid":[0-9]*' | head -n 1)
    if [ -n "$tid" ] && grep "$tid," "$tl" | grep -q 'NCCL_ALLREDUCE' &&
       ! grep "$tid," "$tl" | grep -q 'MEMCPY'; then
      say "PASS gpu-check/64MiB_allreduce_no_host_copy (timeline: NCCL_ALLREDUCE only)"
    else
      say "FAIL gpu-check/64MiB_allreduce_no_host_copy (timeline row ${tid:-missing})"
      [ -n "$tid" ] && grep "$tid," "$tl" | head -n 10
    fi
  else
    say "FAIL gpu-check/build"
    tail -n 30 "$b/configure.out" "$b/make.out" 2>/dev/null
  fi
fi
p=$(grep -c '^PASS' "$log") f=$(grep -c '^FAIL' "$log") s=$(grep -c '^SKIP' "$log")
echo "gpu-check: $p passed, $f failed, $s skipped"
[ "$f" -eq 0 ]
