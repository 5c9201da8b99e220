#!/bin/sh
# The GPU check, in one call, on a machine with a GPU:
#   0. (bundle mode) a host-only np=2 run with the bundled mpirun, proving
#      the relocated Open MPI works before any GPU step;
#   1. tests/mpi/test_gpu: one rank through NCCL (every dtype and op, fused,
#      broadcast, allgather, scaling, a joined rank, the stream-ordered
#      calls); 2 and 4 ranks sharing the GPU (NCCL forbids that, so they
#      take the staged path); 2 ranks with HORA_GPU_TRANSPORT=host; and the
#      timeline of the 64 MiB allreduce at np=1: no host-side copy; and a
#      rank killed with device work queued (test_gpu peer_loss, np=2);
#   2. tests/gpu_copy_bench: the fusion copy kernel next to cudaMemcpy D2D;
#   3. hora-bench --device cuda at np=1..4, beside a plain ncclAllReduce
#      loop on the same buffers (where NCCL can run: ranks on distinct GPUs);
#   4. examples/train --device cuda, one epoch, at np=1 and np=2;
#   5. hora.torch on CUDA tensors (tests/python/cuda_check.py) at np=1 and 2,
#      with the device's own CUDA torch.
# Each step runs under its own timeout and the whole check within 450 s
# (plus at most 10 s for a last step killed at its limit): under 8 minutes.
# Ends with one line: "gpu-check: N passed, N failed, N skipped".
#
# usage: scripts/gpu-check.sh --bundle DIR   (DIR from scripts/gpu-bundle.sh;
#                                             needs no compiler, MPI or python)
#        scripts/gpu-check.sh                (builds in build/gpu from this tree;
#                                             needs scripts/install-deps.sh)
# Logs go to $OUT/gpu-check/ when OUT is set, else to a temporary folder.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
bundle=
while [ $# -gt 0 ]; do
  case $1 in
    --bundle) [ $# -ge 2 ] || { echo "usage: $0 [--bundle DIR]" >&2; exit 2; }; bundle=$2; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "usage: $0 [--bundle DIR]" >&2; exit 2 ;;
  esac
done

if [ -n "${OUT:-}" ]; then
  logdir=$OUT/gpu-check
  mkdir -p "$logdir" || { echo "FAIL gpu-check/log: cannot create $logdir"; exit 1; }
else
  logdir=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX") || exit 1
fi
log=$logdir/summary.log
: >"$log"
say() { echo "$*" | tee -a "$log"; }
pass() { say "PASS gpu-check/$*"; }
fail() { say "FAIL gpu-check/$*"; }
skip() { say "SKIP gpu-check/$*"; }
finish() {
  p=$(grep -c '^PASS' "$log") f=$(grep -c '^FAIL' "$log") s=$(grep -c '^SKIP' "$log")
  echo "gpu-check: logs in $logdir"
  echo "gpu-check: $p passed, $f failed, $s skipped" | tee -a "$log"
  [ "$f" -eq 0 ]
  exit $?
}
command -v timeout >/dev/null 2>&1 || { fail "setup: 'timeout' (coreutils) not found"; finish; }

# The whole check keeps within this many seconds; each step gets its own
# limit, cut down to what is left.
budget=${HORA_GPU_CHECK_BUDGET:-450}
t_start=$(date +%s)
limit() { # wanted seconds -> what is left of the budget for one step (0: none)
  left=$((budget - ($(date +%s) - t_start)))
  [ "$left" -lt 5 ] && { echo 0; return; }
  [ "$1" -lt "$left" ] && echo "$1" || echo "$left"
}

# ---- the programs, and the environment they run in --------------------------
if [ -n "$bundle" ]; then
  [ -d "$bundle" ] || { fail "setup: bundle folder $bundle does not exist"; finish; }
  tarball=$bundle/hora-gpu-bundle.tar.gz
  if [ -f "$tarball" ]; then
    B=$(mktemp -d "${TMPDIR:-/tmp}/hora-gpu-bundle.XXXXXX") || { fail "setup: mktemp"; finish; }
    trap 'rm -rf "$B"' EXIT
    timeout 120 tar -C "$B" -xzf "$tarball" || { fail "setup: unpacking $tarball"; finish; }
  elif [ -d "$bundle/hora/bin" ]; then
    B=$(cd "$bundle" && pwd) # already unpacked
  else
    fail "setup: $bundle has neither hora-gpu-bundle.tar.gz nor hora/bin (make it with scripts/gpu-bundle.sh)"
    finish
  fi
  R=$B/root
  ompi=$R/usr/lib/x86_64-linux-gnu/openmpi
  for f in "$B/hora/bin/test_gpu" "$B/hora/cpu/test_collectives" "$B/hora/lib/libhora.so.0" \
           "$R/usr/bin/orterun" "$ompi/lib/openmpi3" "$R/usr/share/openmpi" "$B/data/fashion-mnist"; do
    [ -e "$f" ] || { fail "setup: the bundle lacks $f"; finish; }
  done
  # Open MPI and PMIx were built for /usr; these move them into the bundle.
  OPAL_PREFIX=$R/usr OPAL_EXEC_PREFIX=$R/usr OPAL_BINDIR=$R/usr/bin OPAL_LIBDIR=$ompi/lib
  OPAL_PKGLIBDIR=$ompi/lib/openmpi3 OPAL_DATAROOTDIR=$R/usr/share OPAL_DATADIR=$R/usr/share
  OPAL_PKGDATADIR=$R/usr/share/openmpi OPAL_SYSCONFDIR=$R/etc/openmpi OPAL_LIBEXECDIR=$R/usr/libexec
  OPAL_INCLUDEDIR=$ompi/include OPAL_PKGINCLUDEDIR=$ompi/include/openmpi
  pmix=$R/usr/lib/x86_64-linux-gnu/pmix2
  PMIX_PREFIX=$pmix PMIX_EXEC_PREFIX=$pmix PMIX_LIBDIR=$pmix/lib PMIX_PKGLIBDIR=$pmix/lib/pmix
  PMIX_DATAROOTDIR=$pmix/share PMIX_DATADIR=$pmix/share PMIX_PKGDATADIR=$pmix/share/pmix
  PATH=$R/usr/bin:$PATH
  export OPAL_PREFIX OPAL_EXEC_PREFIX OPAL_BINDIR OPAL_LIBDIR OPAL_PKGLIBDIR OPAL_DATAROOTDIR \
    OPAL_DATADIR OPAL_PKGDATADIR OPAL_SYSCONFDIR OPAL_LIBEXECDIR OPAL_INCLUDEDIR OPAL_PKGINCLUDEDIR \
    PMIX_PREFIX PMIX_EXEC_PREFIX PMIX_LIBDIR PMIX_PKGLIBDIR PMIX_DATAROOTDIR PMIX_DATADIR \
    PMIX_PKGDATADIR PATH
  mpirun=$R/usr/bin/orterun
  bin=$B/hora/bin
  t_gpu=$bin/test_gpu t_copy=$bin/gpu_copy_bench
  bench=$bin/hora-bench train=$bin/train data=$B/data/fashion-mnist
  libs=$B/hora/lib:$B/lib
  commit=$(sed -n 's/^commit: //p' "$B/MANIFEST" 2>/dev/null)
else
  command -v mpicc >/dev/null 2>&1 && command -v autoreconf >/dev/null 2>&1 ||
    timeout 600 "$src/scripts/install-deps.sh" || { fail "setup: scripts/install-deps.sh failed"; finish; }
  b=$src/build/gpu
  libs=
  commit=$(git -C "$src" describe --always --dirty 2>/dev/null || echo unknown)
fi

# NCCL and cuBLAS are the device's: its Python wheels (nvidia-nccl-cu13,
# the nvidia-cublas torch brings), else its CUDA toolkit or ld.so.cache.
pylib() { # soname -> the folder of it among the Python packages (or nothing)
  command -v python3 >/dev/null 2>&1 || return 1
  timeout 30 python3 - "$1" 2>/dev/null <<'EOF'
import glob, os, sys
name = sys.argv[1]
if name.startswith("libnccl"):
    try:
        import nvidia.nccl
        f = nvidia.nccl.__file__  # None where nvidia.nccl is a namespace package
        d = os.path.join(os.path.dirname(f) if f else list(nvidia.nccl.__path__)[0], "lib")
        if os.path.exists(os.path.join(d, name)):
            print(d); sys.exit(0)
    except Exception:
        pass
for p in sys.path:
    for pat in ("nvidia/*/lib", "nvidia/*/*/lib", "torch/lib"):
        for d in sorted(glob.glob(os.path.join(p, pat))):
            if os.path.exists(os.path.join(d, name)):
                print(d); sys.exit(0)
sys.exit(1)
EOF
}
syslib() { # soname -> its folder from the CUDA toolkit or ld.so.cache
  for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/$1" ] && { echo "$d"; return 0; }
  done
  p=$(ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n { print $NF; exit }')
  [ -n "$p" ] && dirname "$p"
}
libdir_of() { # soname, order (py|sys) -> folder
  if [ "$2" = py ]; then pylib "$1" || syslib "$1"; else syslib "$1" || pylib "$1"; fi
}
nccl_dir=$(libdir_of libnccl.so.2 py)
cublas_dir=$(libdir_of libcublas.so.13 sys)
for d in "$nccl_dir" "$cublas_dir" "$(libdir_of libcublasLt.so.13 sys)"; do
  [ -n "$d" ] && case ":$libs:" in *":$d:"*) ;; *) libs=${libs:+$libs:}$d ;; esac
done
[ -n "$bundle" ] && [ -z "$nccl_dir" ] && [ -e "$B/nccl/libnccl.so.2" ] && libs=$libs:$B/nccl && nccl_dir=$B/nccl
LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH

# ---- what this check runs with -----------------------------------------------
have_gpu=no
if ! command -v nvidia-smi >/dev/null 2>&1; then
  gpu_why="nvidia-smi not found"
elif ! timeout 30 nvidia-smi -L >"$logdir/nvidia-smi.out" 2>&1; then
  gpu_why="nvidia-smi -L fails: $(head -n 1 "$logdir/nvidia-smi.out")"
else
  have_gpu=yes
  head -n 8 "$logdir/nvidia-smi.out"
fi
{
  echo "hora:      ${commit:-unknown}${bundle:+ (bundle $bundle)}"
  if [ -n "$bundle" ]; then
    echo "Open MPI:  $(timeout 20 "$mpirun" --version 2>&1 | head -n 1)"
  else
    echo "Open MPI:  $(timeout 20 mpirun --version 2>&1 | head -n 1)"
  fi
  if [ -n "$nccl_dir" ]; then
    v=$(timeout 20 grep -a -o -m 1 'NCCL version [0-9][0-9.]*[+a-z0-9.]*' "$nccl_dir/libnccl.so.2" | head -n 1)
    echo "NCCL:      ${v:-version unknown}, $(readlink -f "$nccl_dir/libnccl.so.2")"
  else
    echo "NCCL:      libnccl.so.2 not found (no nvidia-nccl wheel, CUDA toolkit or ld.so.cache entry)"
  fi
  echo "cuBLAS:    ${cublas_dir:-libcublas.so.13 not found}"
  if [ $have_gpu = yes ]; then
    echo "driver:    $(timeout 20 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -n 1)," \
      "$(timeout 20 nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | head -n 1)"
  else
    echo "driver:    none ($gpu_why)"
  fi
  if [ -n "$bundle" ]; then
    echo "CUDA:      runtime $(sed -n 's/^cuda: //p' "$B/MANIFEST" 2>/dev/null) (libcudart.so.13 carried)"
  else
    echo "CUDA:      $(command -v nvcc >/dev/null 2>&1 && nvcc --version | sed -n 's/.*release \([0-9.]*\).*/nvcc \1/p')"
  fi
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} | tee "$logdir/versions.txt"

flags="--oversubscribe --bind-to none"
[ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl_base_warn_component_unused=0
# One host: no ssh or rsh needed (a bare machine or a chroot has neither).
export OMPI_MCA_plm=isolated OMPI_MCA_btl_vader_single_copy_mechanism=none
[ -n "$bundle" ] || mpirun=mpirun

mpi() { # label seconds np program args... (environment from `env` before it)
  label=$1 secs=$(limit "$2") np=$3
  shift 3
  if [ "$secs" = 0 ]; then
    fail "$label: not run, the check's $budget s were spent"
    return 1
  fi
  # shellcheck disable=SC2086
  timeout -k 10 "$secs" "$mpirun" $flags -np "$np" "$@" </dev/null >"$logdir/$label.out" 2>&1
  rc=$?
  [ $rc -eq 124 ] && echo "(timed out after $secs s)" >>"$logdir/$label.out"
  return $rc
}

# ---- 0. the environment: a host allreduce at np=2 with this mpirun -----------
if [ -n "$bundle" ]; then
  # The CPU-only build's test_collectives: it needs no NCCL or CUDA.
  if mpi selftest 60 2 "$B/hora/cpu/test_collectives"; then
    pass "selftest: np=2 host collectives (CPU-only tests/mpi/test_collectives) with the bundled mpirun ($(grep -c '^PASS' "$logdir/selftest.out") PASS lines)"
  else
    fail "selftest: np=2 CPU-only tests/mpi/test_collectives with the bundled mpirun, exit $rc"
    tail -n 25 "$logdir/selftest.out"
  fi
fi

if [ $have_gpu = no ]; then
  for s in test_gpu copy_bench hora-bench train torch; do
    skip "$s: no GPU here ($gpu_why)"
  done
  finish
fi

if [ -z "$bundle" ]; then
  "$src/scripts/copy-tree.sh" "$src" "$b"
  if (cd "$b" && ./autogen.sh >/dev/null 2>&1 && ./configure --with-cuda --with-nccl >configure.out 2>&1 &&
      timeout 900 make -j"$(nproc)" all tests/mpi/test_gpu tests/gpu_copy_bench >make.out 2>&1); then
    pass "build (configure --with-cuda --with-nccl)"
    t_start=$(date +%s) # the budget is for the run, not the build
  else
    fail "build"
    tail -n 30 "$b/configure.out" "$b/make.out" 2>/dev/null
    finish
  fi
  t_gpu=$b/tests/mpi/test_gpu t_copy=$b/tests/gpu_copy_bench bench=$b/hora-bench train=$b/examples/train
  data=/usr/share/datasets/fashion-mnist
fi

# ---- 1. the device tests -----------------------------------------------------
gpu_test() { # label seconds np settings...
  label=$1 secs=$2 np=$3
  shift 3
  # shellcheck disable=SC2046 # one "-x NAME=value" pair per setting
  mpi "$label" "$secs" "$np" -x HORA_LOG_LEVEL=info -x HORA_TIMELINE="$logdir/timeline-$label.json" \
    $(for s in "$@"; do printf -- '-x %s ' "$s"; done) "$t_gpu"
  rc=$?
  grep -E '^(PASS|FAIL|SKIP) ' "$logdir/$label.out" | sed "s#^\([A-Z]*\) #\1 $label/#" | tee -a "$log"
  path=$(grep -o 'device collectives [a-z ]*' "$logdir/$label.out" | head -n 1)
  echo "   ($label: ${path:-no device collective logged})"
  if [ $rc -ne 0 ]; then
    fail "$label: exit status $rc"
    tail -n 20 "$logdir/$label.out"
  fi
}
gpu_test np1-nccl 60 1 HORA_GPU_TRANSPORT=auto
gpu_test np2-shared 60 2 HORA_GPU_TRANSPORT=auto
gpu_test np4-shared 75 4 HORA_GPU_TRANSPORT=auto
gpu_test np2-host 60 2 HORA_GPU_TRANSPORT=host
# A rank that dies with device work queued: the survivor's waits and
# hora_finalize return an error within 10 s (Open MPI must let it finish).
mpi np2-peer-loss 45 2 --mca orte_abort_on_non_zero_status 0 "$t_gpu" peer_loss
rc=$?
grep -E '^(PASS|FAIL|SKIP) ' "$logdir/np2-peer-loss.out" | sed 's#^\([A-Z]*\) #\1 np2-peer-loss/#' | tee -a "$log"
if ! grep -qE '^(PASS|SKIP) ' "$logdir/np2-peer-loss.out"; then
  fail "np2-peer-loss: no result line (exit status $rc)"
  tail -n 20 "$logdir/np2-peer-loss.out"
fi
# The 64 MiB tensor ran alone, in place on the GPU: its timeline row has the
# NCCL phase and no copy phase.
tl=$logdir/timeline-np1-nccl.json
tid=$(grep -o '"tid":[0-9]*,"args":{"name":"big/avg"}' "$tl" 2>/dev/null | grep -o '"tid":[0-9]*' | head -n 1)
if [ -n "$tid" ] && grep "$tid," "$tl" | grep -q 'NCCL_ALLREDUCE' && ! grep "$tid," "$tl" | grep -q 'MEMCPY'; then
  pass "64MiB_allreduce_no_host_copy (timeline: NCCL_ALLREDUCE only)"
else
  fail "64MiB_allreduce_no_host_copy (timeline row ${tid:-missing} in $tl)"
  [ -n "$tid" ] && grep "$tid," "$tl" | head -n 10
fi

# ---- 2. the fusion copy kernel against cudaMemcpy D2D ------------------------
secs=$(limit 30)
if [ "$secs" = 0 ]; then
  fail "copy_bench: not run, the check's $budget s were spent"
else
  timeout -k 5 "$secs" "$t_copy" >"$logdir/copy_bench.out" 2>&1
  rc=$?
  sed 's#^\([A-Z]*\) gpu/#\1 gpu-check/#' "$logdir/copy_bench.out" | grep -E '^(PASS|FAIL|SKIP) ' | tee -a "$log"
  [ $rc -eq 0 ] || { fail "copy_bench: exit status $rc"; tail -n 10 "$logdir/copy_bench.out"; }
fi

# ---- 3. hora-bench on device buffers, beside plain NCCL -----------------------
for np in 1 2 3 4; do
  if mpi "bench-np$np" 30 "$np" "$bench" --device cuda -o allreduce -b 64K -e 256M -f 4 -r 3; then
    pass "hora-bench/np$np: allreduce on device buffers, results checked"
  else
    fail "hora-bench/np$np: exit status $rc"
  fi
  grep -v '^#' "$logdir/bench-np$np.out" | grep -q . || tail -n 10 "$logdir/bench-np$np.out"
  grep -E '^(#|  +[0-9])' "$logdir/bench-np$np.out" | sed "s/^/   np=$np /"
done
# The collectives whose counts differ by rank, and reducescatter, at np=1 (NCCL
# beside it) and np=2 (ranks sharing the GPU: staged, no NCCL peer).
for np in 1 2; do
  for op in reducescatter alltoall allgatherv; do
    if mpi "bench-$op-np$np" 15 "$np" "$bench" --device cuda -o $op -b 1M -e 64M -f 8 -r 3; then
      pass "hora-bench/$op-np$np: on device buffers, results checked"
    else
      fail "hora-bench/$op-np$np: exit status $rc"
      tail -n 10 "$logdir/bench-$op-np$np.out"
    fi
    grep -E '^  +[0-9]' "$logdir/bench-$op-np$np.out" | sed "s/^/   $op np=$np /"
  done
done

# ---- 4. the example trainer on the GPU ------------------------------------------
for np in 1 2; do
  if mpi "train-np$np" 45 "$np" "$train" --device cuda --epochs 1 --data-dir "$data" \
       --checkpoint "$logdir/train-np$np.ckpt"; then
    acc=$(grep -o 'test_accuracy=[0-9.]*' "$logdir/train-np$np.out" | tail -n 1)
    if [ -n "$acc" ]; then
      pass "train/np$np: one epoch with --device cuda, $acc"
    else
      fail "train/np$np: no test_accuracy line"
      tail -n 10 "$logdir/train-np$np.out"
    fi
  else
    fail "train/np$np: exit status $rc"
    tail -n 15 "$logdir/train-np$np.out"
  fi
done

# ---- 5. the PyTorch binding on CUDA tensors ----------------------------------------
# The device's own CUDA torch drives this build's libhora through hora.torch.
if [ -n "$bundle" ]; then
  horalib=$B/hora/lib/libhora.so.0
else
  horalib=$b/.libs/libhora.so.0
fi
if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import torch' >/dev/null 2>&1; then
  fail "torch: no python3 that imports torch"
elif [ ! -e "$horalib" ]; then
  fail "torch: no $horalib"
else
  for np in 1 2; do
    if mpi "torch-np$np" 60 "$np" env HORA_LIBRARY="$horalib" \
         PYTHONPATH="$src/python${PYTHONPATH:+:$PYTHONPATH}" python3 "$src/tests/python/cuda_check.py"; then
      pass "torch/np$np: hora.torch on CUDA tensors"
    else
      fail "torch/np$np: exit status $rc"
      tail -n 20 "$logdir/torch-np$np.out"
    fi
    grep -E '^(PASS|FAIL|SKIP) ' "$logdir/torch-np$np.out" | sed "s#^\([A-Z]*\) #\1 np$np/#" | tee -a "$log"
  done
fi
finish
