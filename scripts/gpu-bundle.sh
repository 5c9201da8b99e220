#!/bin/sh
# Builds hora with CUDA and NCCL for the H200 (sm_90, plus PTX) and gathers
# into one folder everything a bare, offline GPU machine lacks to run the
# GPU check there (scripts/gpu-check.sh --bundle DIR):
#   - the built programs (test_gpu, gpu_copy_bench, test_collectives,
#     hora-bench, hora-info, examples/train) and libhora.so, and a CPU-only
#     test_collectives (needs no NCCL) for the check's np=2 self-test;
#   - Open MPI and its runtime closure (hwloc, libevent, PMIx, libcrypto,
#     OpenBLAS, ...): Debian 12's .deb files (apt-get download, or the apt
#     cache), unpacked with dpkg -x into a private root inside the bundle;
#     Open MPI and PMIx plugins whose libraries are not carried are removed;
#   - libcudart.so.13 of the CUDA the build used (0.7 MB);
#   - Fashion-MNIST's four gzipped files for the trainer.
# NCCL and cuBLAS are not carried (hundreds of MB): gpu-check.sh takes the
# device's (its CUDA toolkit, or the nvidia-* Python wheels).
#
# The bundle is DIR/hora-gpu-bundle.tar.gz (symbolic links and all, which a
# copy to the device may not keep) plus DIR/MANIFEST; gpu-check.sh unpacks
# the tarball into a temporary folder there. It must stay under 60 MiB
# (the device's copy limit is 64 MiB); the script fails if it does not.
#
# usage: scripts/gpu-bundle.sh [DIR]     (default: gpu-bundle/ in the tree)
# HORA_BUNDLE_REUSE_BUILD=1 repacks the last build instead of rebuilding.
# The last line printed is the bundle's path.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$src/gpu-bundle}
build=$src/build/gpu-bundle
jobs=${HORA_BUNDLE_JOBS:-2}
limit_mib=60
arch_flags="-gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90"
cuda=${CUDA_HOME:-/usr/local/cuda}
data=${HORA_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}

die() { echo "gpu-bundle: FAIL $*" >&2; exit 1; }
note() { echo "gpu-bundle: $*"; }

for tool in git dpkg dpkg-query apt-get ldd tar gzip file awk sed; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found (this script runs on Debian 12 with scripts/install-deps.sh done)"
done
command -v mpicc >/dev/null 2>&1 || die "mpicc not found; run scripts/install-deps.sh"
[ -x "$cuda/bin/nvcc" ] || die "nvcc not found at $cuda/bin/nvcc (set CUDA_HOME)"
[ -f "$cuda/include/nccl.h" ] || [ -f /usr/include/nccl.h ] || die "nccl.h not found (NCCL headers are needed to build)"
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  [ -f "$data/$f" ] || die "$data/$f missing (Debian: dataset-fashion-mnist; or set HORA_FASHION_MNIST)"
done

# ---- 1. build, on a copy of the tree --------------------------------------
commit=$(git -C "$src" describe --always --dirty 2>/dev/null || echo unknown)
b=$build/src
if [ "${HORA_BUNDLE_REUSE_BUILD:-0}" = 1 ] && [ -f "$b/tests/mpi/test_gpu" ]; then
  note "HORA_BUNDLE_REUSE_BUILD=1: reusing the build in $b (not rebuilt from $commit)"
  commit="$commit (build reused)"
else
note "building hora $commit in $build/src (sm_90 + PTX, make -j$jobs)"
"$src/scripts/copy-tree.sh" "$src" "$build/src" || die "copying the tree to $build/src"
(cd "$b" && ./autogen.sh >"$build/autogen.out" 2>&1) || { tail -n 20 "$build/autogen.out"; die "autogen.sh (log: $build/autogen.out)"; }
(cd "$b" && ./configure --with-cuda="$cuda" --with-nccl >"$build/configure.out" 2>&1) ||
  { tail -n 30 "$build/configure.out"; die "configure --with-cuda --with-nccl (log: $build/configure.out)"; }
grep -q 'example train : yes' "$build/configure.out" || die "configure will not build examples/train (OpenBLAS or zlib missing; see $build/configure.out)"
# Two make runs: `all` recurses into itself, so one run naming both would
# build the same objects twice at once.
tests="tests/mpi/test_gpu tests/gpu_copy_bench tests/mpi/test_collectives"
# shellcheck disable=SC2086
(cd "$b" && make -j"$jobs" NVCC_ARCH_FLAGS="$arch_flags" all >"$build/make.out" 2>&1 &&
   make -j"$jobs" NVCC_ARCH_FLAGS="$arch_flags" $tests >>"$build/make.out" 2>&1) ||
  { tail -n 40 "$build/make.out"; die "make all $tests (log: $build/make.out)"; }
# A CPU-only test_collectives for gpu-check.sh's self-test: the CUDA build's
# programs need libnccl.so.2, which a machine without NCCL lacks, and the
# self-test must show the bundled mpirun and hora's host data plane working
# before any GPU step, wherever it runs.
note "building a CPU-only tests/mpi/test_collectives in $build/cpu"
"$src/scripts/copy-tree.sh" "$src" "$build/cpu" || die "copying the tree to $build/cpu"
(cd "$build/cpu" && ./autogen.sh >"$build/cpu.out" 2>&1 && ./configure --without-cuda --without-nccl >>"$build/cpu.out" 2>&1 &&
   make -j"$jobs" tests/mpi/test_collectives >>"$build/cpu.out" 2>&1) ||
  { tail -n 30 "$build/cpu.out"; die "the CPU-only build (log: $build/cpu.out)"; }
fi

# ---- 2. the programs and libhora ------------------------------------------
stage=$build/stage
rm -rf "$stage" && mkdir -p "$stage/hora/bin" "$stage/hora/lib" "$stage/data/fashion-mnist" "$stage/root" "$stage/debs"
is_elf() { [ "$(head -c 4 "$1" 2>/dev/null | od -An -c | tr -d ' ')" = '177ELF' ]; }
for p in hora-bench hora-info examples/train tests/mpi/test_gpu tests/gpu_copy_bench tests/mpi/test_collectives; do
  d=$(dirname "$p") n=$(basename "$p")
  real=
  for c in "$b/$d/.libs/$n" "$b/$p"; do
    if [ -f "$c" ] && is_elf "$c"; then real=$c; break; fi
  done
  [ -n "$real" ] || die "no built program for $p (looked in $b/$d/.libs/$n and $b/$p)"
  cp "$real" "$stage/hora/bin/$n" || die "copying $real"
done
mkdir -p "$stage/hora/cpu"
cp "$build/cpu/tests/mpi/test_collectives" "$stage/hora/cpu/" || die "no CPU-only test_collectives in $build/cpu"
is_elf "$stage/hora/cpu/test_collectives" || die "$build/cpu/tests/mpi/test_collectives is not a program"
lib=$(find "$b/.libs" -maxdepth 1 -type f -name 'libhora.so.*.*.*' 2>/dev/null | head -n 1)
[ -n "$lib" ] || die "libhora.so not built ($b/.libs)"
cp "$lib" "$stage/hora/lib/" && (cd "$stage/hora/lib" && ln -sf "$(basename "$lib")" libhora.so.0 && ln -sf libhora.so.0 libhora.so)
cp -L "$cuda/lib64/libcudart.so.13" "$stage/hora/lib/" 2>/dev/null || die "$cuda/lib64/libcudart.so.13 missing"
cp "$data"/*-ubyte.gz "$stage/data/fashion-mnist/" || die "copying Fashion-MNIST from $data"
strip --strip-unneeded "$stage/hora/bin/"* "$stage/hora/cpu/"* "$stage/hora/lib/libhora.so."*.*.* 2>/dev/null || true

# ---- 3. the Debian runtime they need ---------------------------------------
# Libraries every Linux with a CUDA driver has; never carried.
base_re='^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libutil\.so|libresolv\.so|libgcc_s\.so|libstdc\+\+\.so|libcuda\.so|libnvidia-)'
# The device's own (CUDA toolkit or nvidia-* wheels): large, never carried.
device_re='^(libnccl\.so|libcublas\.so|libcublasLt\.so)'
pkgs="openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc15"

pkg_of() { # a library path on this machine -> its Debian package
  for f in "$1" "$(readlink -f "$1")" "/usr$1" "${1#/usr}"; do
    p=$(dpkg -S "$f" 2>/dev/null | grep -v '^diversion' | head -n 1 | cut -d: -f1)
    [ -n "$p" ] && { echo "$p"; return 0; }
  done
  return 1
}
fetch_deb() { # package -> $stage/debs/*.deb, from the apt cache or the archive
  v=$(dpkg-query -W -f='${Version}' "$1" 2>/dev/null)
  a=$(dpkg-query -W -f='${Architecture}' "$1" 2>/dev/null)
  [ -n "$v" ] || die "package $1 is not installed here, so its version is unknown"
  f=$(printf '%s_%s_%s.deb' "$1" "$v" "$a" | sed 's/:/%3a/')
  # The installed version, else (the archive keeps only the newest) the
  # package's newest in the apt cache or the archive: same soname, same ABI.
  if [ -f "/var/cache/apt/archives/$f" ]; then
    cp "/var/cache/apt/archives/$f" "$stage/debs/"
  elif (cd "$stage/debs" && timeout 120 apt-get download -q "$1=$v" >/dev/null 2>&1); then
    :
  else
    # shellcheck disable=SC2012 # Debian file names; ls -v sorts versions
    f=$(cd /var/cache/apt/archives && ls -v "$1"_*_"$a".deb 2>/dev/null | tail -n 1)
    if [ -n "$f" ]; then
      cp "/var/cache/apt/archives/$f" "$stage/debs/"
    else
      (cd "$stage/debs" && timeout 120 apt-get download -q "$1" >/dev/null 2>&1) ||
        die "apt-get download $1 failed ($v is not in /var/cache/apt/archives, nor any other version)"
      # shellcheck disable=SC2012
      f=$(cd "$stage/debs" && ls "$1"_*_"$a".deb | tail -n 1)
    fi
    note "$1: installed $v is no longer in the archive; carrying $f"
  fi
  dpkg -x "$stage/debs/$f" "$stage/root" || die "dpkg -x $f"
  echo "  $f" >>"$stage/debs.txt"
}
ld_path() { # where the unpacked libraries lie
  printf '%s' "$stage/hora/lib:$stage/lib"
}
core_elves() {
  ls "$stage/hora/bin/"* "$stage/hora/cpu/"* "$stage/hora/lib/libhora.so.0"
  # mpirun and the daemon, and what Open MPI 4.1 cannot start without:
  # Debian's build takes PMIx from libpmix2 through the ext3x plugin.
  for f in "$stage/root/usr/bin/orterun" "$stage/root/usr/bin/orted" \
           "$stage/root/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so.2" \
           "$stage/root/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/mca_pmix_ext3x.so"; do
    [ -e "$f" ] && echo "$f"
  done
}
links() { # one symlink per soname in $stage/lib -> the unpacked file
  mkdir -p "$stage/lib"
  find "$stage/root" \( -type f -o -type l \) -name 'lib*.so.*' | while read -r f; do
    n=$(basename "$f")
    [ -e "$stage/lib/$n" ] || ln -s "../root${f#"$stage/root"}" "$stage/lib/$n"
  done
}
# Resolves libraries as the device will (bundle first), and names each one
# that still comes from this machine; repeats until none does.
done_pkgs=
for p in $pkgs; do fetch_deb "$p"; done_pkgs="$done_pkgs $p "; done
links
round=0
while :; do
  round=$((round + 1))
  [ $round -le 8 ] || die "the library closure did not settle in 8 rounds"
  new=
  for e in $(core_elves); do
    LD_LIBRARY_PATH=$(ld_path) ldd "$e" 2>/dev/null | awk '/=>/ { print $1, $3 }'
  done | sort -u >"$build/ldd.txt"
  while read -r name path; do
    echo "$name" | grep -Eq "$base_re|$device_re" && continue
    [ "$name" = libcudart.so.13 ] && continue
    case $path in "$stage"/*) continue ;; esac
    [ "$path" = "not" ] && die "$name is needed and not found, here or in the bundle"
    p=$(pkg_of "$path") || die "no Debian package owns $path (needed as $name)"
    case " $done_pkgs $new " in *" $p "*) ;; *) new="$new $p" ;; esac
  done <"$build/ldd.txt"
  [ -z "$new" ] && break
  note "closure round $round: adding$new"
  for p in $new; do fetch_deb "$p"; done_pkgs="$done_pkgs $p "; done
  links
done

# Trim what no one runs: docs, manuals, headers, static and Fortran/Java/C++
# bindings of MPI, and plugins whose libraries are not carried.
rm -rf "$stage/root/usr/share/doc" "$stage/root/usr/share/man" "$stage/root/usr/share/lintian" "$stage/root/usr/include"
find "$stage/root" \( -name '*.a' -o -name '*.la' -o -name 'libmpi_java*' -o -name 'libmpi_mpifh*' \
  -o -name 'libmpi_usempi*' -o -name 'libmpi_cxx*' -o -name 'libompitrace*' -o -name '*.jar' \) -exec rm -f {} +
find "$stage/lib" -type l ! -exec test -e {} \; -exec rm -f {} +
pruned=
for plug in $(find "$stage/root" -path '*/openmpi3/*.so' -o -path '*/pmix2/lib/pmix/*.so' | sort); do
  bad=$(LD_LIBRARY_PATH=$(ld_path) ldd "$plug" 2>/dev/null | awk '/=>/ { print $1, $3 }' |
    while read -r name path; do
      echo "$name" | grep -Eq "$base_re|$device_re" && continue
      case $path in "$stage"/*) continue ;; esac
      echo "$name"
    done | tr '\n' ' ')
  if [ -n "$bad" ]; then
    rm -f "$plug"
    pruned="$pruned $(basename "$plug" .so)"
  fi
done
[ -n "$pruned" ] && note "removed plugins whose libraries are not carried:$pruned"
for f in openmpi/lib/openmpi3/mca_pmix_ext3x.so openmpi/lib/openmpi3/mca_plm_isolated.so \
         openmpi/lib/openmpi3/mca_btl_vader.so openmpi/lib/openmpi3/mca_ess_hnp.so; do
  [ -f "$stage/root/usr/lib/x86_64-linux-gnu/$f" ] || die "Open MPI's $(basename "$f" .so) is missing from the bundle"
done
# Shared libraries the packages brought that nothing loads (liblapack,
# libssl beside libcrypto, ...): gone. Kept: what ldd resolves for the
# programs and the remaining plugins, and the plugins themselves.
for e in $(core_elves) $(find "$stage/root" -path '*/openmpi3/*.so' -o -path '*/pmix2/lib/pmix/*.so'); do
  LD_LIBRARY_PATH=$(ld_path) ldd "$e" 2>/dev/null | awk '/=>/ { print $3 }'
done | while read -r f; do
  case $f in "$stage"/*) readlink -f "$f" ;; esac
done | sort -u >"$build/keep.txt"
unused=
for f in $(find "$stage/root" -type f -name 'lib*.so*' ! -path '*/openmpi3/*' ! -path '*/pmix2/lib/pmix/*' | sort); do
  grep -qxF "$f" "$build/keep.txt" || { unused="$unused $(basename "$f")"; rm -f "$f"; }
done
[ -n "$unused" ] && note "removed libraries nothing loads:$unused"
find "$stage/root" "$stage/lib" -type l ! -exec test -e {} \; -exec rm -f {} +
rm -rf "$stage/debs"

# ---- 4. pack, check the size ------------------------------------------------
nccl_built=$(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' "$cuda/include/nccl.h" 2>/dev/null | paste -sd. -)
{
  echo "hora GPU bundle"
  echo "commit: $commit"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release | tr -d '"')"
  echo "cuda: $("$cuda/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') ($arch_flags)"
  echo "nccl built against: ${nccl_built:-unknown} (not carried)"
  echo "packages (dpkg -x into root/):"
  cat "$stage/debs.txt"
} >"$stage/MANIFEST"
mkdir -p "$out" || die "cannot create $out"
rm -f "$out/hora-gpu-bundle.tar.gz" "$out/MANIFEST"
cp "$stage/MANIFEST" "$out/MANIFEST"
tar -C "$stage" -czf "$out/hora-gpu-bundle.tar.gz" MANIFEST hora lib root data || die "tar into $out"
kib=$(du -sk "$out" | cut -f1)
unpacked=$(du -sk "$stage" | cut -f1)
note "bundle: $((kib / 1024)) MiB packed ($((unpacked / 1024)) MiB unpacked), limit $limit_mib MiB"
[ "$kib" -le $((limit_mib * 1024)) ] || die "the bundle is $((kib / 1024)) MiB, over the $limit_mib MiB limit"
echo "$out"
