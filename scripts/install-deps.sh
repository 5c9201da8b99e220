#!/bin/sh
# Installs every Debian 12 package that hora's build, tests and examples need.
# Idempotent: only missing packages are installed; `apt-get update` runs when
# the package lists are missing or a package cannot be found.
set -eu

PACKAGES="
  build-essential autoconf automake libtool pkg-config
  openmpi-bin libopenmpi-dev
  mpich libmpich-dev
  libhwloc-dev hwloc
  libssl-dev
  libibverbs-dev rdma-core ibverbs-providers ibverbs-utils perftest
  libopenblas-dev zlib1g-dev dataset-fashion-mnist
  clang libclang-rt-14-dev
  iproute2 procps psmisc python3 valgrind
  prometheus python3-prometheus-client
  python3-torch python3-torchvision python3-pytest python3-cloudpickle python3-mpi4py
  python3-matplotlib
  python3-sphinx python3-myst-parser
  qemu-system-x86 kmod xz-utils util-linux
"

missing=
for p in $PACKAGES; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done

if [ -z "$missing" ]; then
  echo "install-deps.sh: all packages present"
  exit 0
fi

SUDO=
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=sudo
  else
    echo "install-deps.sh: not root and no sudo; install these packages yourself:$missing" >&2
    exit 1
  fi
fi

echo "install-deps.sh: installing:$missing"
export DEBIAN_FRONTEND=noninteractive
if [ -z "$(ls -A /var/lib/apt/lists 2>/dev/null | grep -v -e lock -e partial -e auxfiles)" ]; then
  $SUDO apt-get update -q
fi
# shellcheck disable=SC2086
if ! $SUDO apt-get install -y -q --no-install-recommends $missing; then
  $SUDO apt-get update -q
  # shellcheck disable=SC2086
  $SUDO apt-get install -y -q --no-install-recommends $missing
fi
# Debian's prometheus package starts its service; the tests run their own
# server on a free port, so none stays running.
case " $missing " in
  *" prometheus "*)
    if command -v systemctl >/dev/null 2>&1 && systemctl is-enabled prometheus >/dev/null 2>&1; then
      $SUDO systemctl disable --now prometheus || true
    fi ;;
esac
