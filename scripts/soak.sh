#!/bin/sh
# Soak: the ResNet-50 gradient set at NP ranks for SECONDS, every element of
# every result checked; fails when any rank's RSS or open file descriptors
# grow after warm-up. Not part of the test suite (it takes minutes).
#
# usage: scripts/soak.sh [SECONDS (600)] [NP (4)]   (from a built tree)
set -u
cd "$(dirname "$0")/.."
seconds=${1:-600} np=${2:-4}
[ -x ./hora-bench-resnet ] || { echo "build first: ./autogen.sh && ./configure && make" >&2; exit 2; }
flags=--oversubscribe
[ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"
OMPI_MCA_mpi_yield_when_idle=1 exec mpirun $flags --bind-to none -np "$np" \
  ./hora-bench-resnet --soak "$seconds" </dev/null
