#!/bin/sh
# `make check-rdma`: boots the soft-RoCE VM of ../shared/rxe-vm and runs
# tests/rdma/check-rdma.sh inside it. Without root or the helper, says so.
# usage: run-check-rdma.sh BUILDDIR
set -u
builddir=$(cd "$1" && pwd)
srcdir=$(cd "$(dirname "$0")/../.." && pwd)
vm=
for d in "${HORA_SHARED_DIR:-}" "$srcdir/../shared" /work/shared; do
  if [ -n "$d" ] && [ -x "$d/rxe-vm/run-in-rxe-vm.sh" ]; then
    vm="$d/rxe-vm/run-in-rxe-vm.sh"
    break
  fi
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if [ "$(id -u)" -ne 0 ] || [ -z "$vm" ]; then
  echo "SKIP rdma/all: needs root and ../shared/rxe-vm (set HORA_SHARED_DIR)" | tee "$out"
else
  "$vm" -t 1800 -w "$builddir" -C "$builddir" -- sh "$srcdir/tests/rdma/check-rdma.sh" "$builddir" 2>&1 |
    tee "$out"
  if ! grep -q ' passed, ' "$out"; then
    echo "FAIL rdma/vm: the VM run ended without a result (see above)" | tee -a "$out"
  fi
fi
p=$(grep -c '^PASS' "$out") f=$(grep -c '^FAIL' "$out") s=$(grep -c '^SKIP' "$out")
[ -n "${HORA_TEST_SUMMARY:-}" ] && echo "$p $f $s" >>"$HORA_TEST_SUMMARY"
echo "$p passed, $f failed, $s skipped"
[ "$f" -eq 0 ]
