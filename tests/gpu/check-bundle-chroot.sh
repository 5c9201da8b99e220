#!/bin/sh
# Proves the GPU bundle on a bare machine: a fresh Debian 12 minbase chroot
# (debootstrap; no Open MPI, hwloc, compiler or python) gets the working
# tree and the bundle, and runs scripts/gpu-check.sh --bundle inside.
# Without a GPU the check must get through its set-up and the np=2 host
# self-test with the bundled mpirun, then SKIP the GPU steps; anything
# else fails this script. Not part of `make check` (a minute or more).
#
# usage: tests/gpu/check-bundle-chroot.sh [BUNDLE_DIR]   (as root;
#        default gpu-bundle/, made by scripts/gpu-bundle.sh)
# The minbase tarball is cached in $HORA_CHROOT_CACHE
# (default /var/cache/hora-chroot), so reruns skip debootstrap.
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
bundle=${1:-$src/gpu-bundle}
cache=${HORA_CHROOT_CACHE:-/var/cache/hora-chroot}
tarball=$cache/debian12-minbase.tar.gz
die() { echo "FAIL chroot-bundle: $*"; exit 1; }
# The Debian archive this machine's apt already uses (HORA_DEBIAN_MIRROR wins).
apt_mirror() {
  { grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}'
    grep -h '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk '{print $2}'
  } | grep -m1 '/debian/*$'
}
mirror=${HORA_DEBIAN_MIRROR:-$(apt_mirror)}

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot, mount)"
[ -f "$bundle/hora-gpu-bundle.tar.gz" ] || die "no bundle at $bundle (run scripts/gpu-bundle.sh first)"
for t in chroot mount umount tar timeout git; do
  command -v "$t" >/dev/null 2>&1 || die "'$t' not found"
done

if [ ! -f "$tarball" ]; then
  [ -n "$mirror" ] || die "no Debian archive in apt's sources; set HORA_DEBIAN_MIRROR"
  if ! command -v debootstrap >/dev/null 2>&1; then
    echo "chroot-bundle: installing debootstrap"
    DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q --no-install-recommends debootstrap >/dev/null ||
      die "apt-get install debootstrap failed"
  fi
  mkdir -p "$cache" || die "cannot create $cache"
  tmp=$(mktemp -d /tmp/hora-debootstrap.XXXXXX) || die "mktemp"
  echo "chroot-bundle: debootstrap --variant=minbase bookworm ($mirror), cached as $tarball"
  if ! timeout 900 debootstrap --variant=minbase bookworm "$tmp/root" "$mirror" >"$tmp/debootstrap.log" 2>&1; then
    tail -n 20 "$tmp/debootstrap.log"
    rm -rf "$tmp"
    die "debootstrap failed"
  fi
  { tar -C "$tmp/root" -czf "$tarball.part" . && mv "$tarball.part" "$tarball"; } || die "writing $tarball"
  rm -rf "$tmp"
fi

root=$(mktemp -d /tmp/hora-chroot.XXXXXX) || die "mktemp"
cleanup() {
  for m in sys dev proc; do
    mountpoint -q "$root/$m" 2>/dev/null && { umount -R "$root/$m" 2>/dev/null || umount -R -l "$root/$m"; }
  done
  # Only delete once nothing is mounted there any more.
  grep -q " $root/" /proc/mounts || rm -rf "$root"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
tar -C "$root" -xzf "$tarball" || die "unpacking $tarball"

# The chroot must be as bare as the GPU machine: no MPI, no hwloc.
# shellcheck disable=SC2016 # dpkg-query's format, not the shell's
found=$(chroot "$root" dpkg-query -W -f='${Package}\n' 2>/dev/null | grep -E 'openmpi|mpich|hwloc|libevent|pmix|python3' | tr '\n' ' ')
[ -z "$found" ] || die "the chroot has $found installed; it must not"
for f in /usr/bin/mpirun /usr/bin/orterun /usr/bin/python3; do
  [ -e "$root$f" ] && die "the chroot has $f; it must not"
done
ls "$root"/usr/lib/x86_64-linux-gnu/libhwloc.so* >/dev/null 2>&1 && die "the chroot has libhwloc"

mkdir -p "$root/work/bundle" "$root/work/out"
"$src/scripts/copy-tree.sh" "$src" "$root/work/hora" || die "copying the working tree"
cp "$bundle"/* "$root/work/bundle/" || die "copying the bundle"

mount -t proc proc "$root/proc" || die "mount proc"
for m in dev sys; do
  { mount --rbind "/$m" "$root/$m" && mount --make-rslave "$root/$m"; } || die "mount --rbind /$m"
done

echo "chroot-bundle: running scripts/gpu-check.sh --bundle in $root"
chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root OUT=/work/out \
  timeout -k 10 600 /bin/sh /work/hora/scripts/gpu-check.sh --bundle /work/bundle >"$root/work/check.out" 2>&1
rc=$?
cat "$root/work/check.out"
out=$root/work/check.out
keep=${OUT:-/tmp/hora-chroot-out}
mkdir -p "$keep" && cp -r "$root/work/out/." "$root/work/check.out" "$keep/" && echo "chroot-bundle: logs kept in $keep"

# What the CUDA build's programs still lack there must be only the
# device's own libraries (NCCL, cuBLAS), never something the bundle forgot.
# shellcheck disable=SC2016 # expanded by the shell in the chroot
chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin /bin/sh -c '
  set -u
  d=$(mktemp -d) && tar -C "$d" -xzf /work/bundle/hora-gpu-bundle.tar.gz || exit 1
  export LD_LIBRARY_PATH=$d/hora/lib:$d/lib
  for e in "$d"/hora/bin/* "$d"/hora/cpu/* "$d"/root/usr/bin/orterun; do
    ldd "$e" | awk -v e="${e##*/}" "/not found/ { print e \": \" \$1 }"
  done | sort -u
  rm -rf "$d"' >"$root/work/missing.txt" 2>&1
echo "chroot-bundle: libraries the bundled programs lack in the chroot (ldd):"
sed 's/^/  /' "$root/work/missing.txt"
unexpected=$(grep -v -E ': (libnccl\.so\.2|libcublas\.so\.13|libcublasLt\.so\.13)$' "$root/work/missing.txt")
[ -z "$unexpected" ] || die "the bundle lacks more than NCCL and cuBLAS: $unexpected"
grep -q '^PASS gpu-check/selftest' "$out" || die "the np=2 self-test with the bundled mpirun did not pass (gpu-check exit $rc)"
if grep -q '^FAIL' "$out"; then die "gpu-check reported failures (exit $rc)"; fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  [ $rc -eq 0 ] || die "gpu-check exit $rc"
else
  grep -q '^SKIP gpu-check/test_gpu: no GPU here' "$out" || die "gpu-check did not stop at the GPU step with SKIP"
fi
echo "PASS chroot-bundle: the bundle runs on a bare Debian 12 (set-up and np=2 self-test passed; GPU steps: $(grep -c '^SKIP' "$out") skipped)"
