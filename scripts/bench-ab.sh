#!/bin/sh
# Before/after benchmark of two built trees, run back to back and
# alternating, so both see the same machine: hora-bench (allreduce, 1-256 MiB)
# and hora-bench-resnet at np=2, and hora-bench on 4 fake hosts x 1 rank
# (../shared/netns, TCP; needs root). Prints each figure's median over the
# rounds for both trees and their ratio, with Open MPI's figure from the
# same runs beside it.
# usage: scripts/bench-ab.sh BEFORE_TREE AFTER_TREE [ROUNDS]
set -u
[ $# -ge 2 ] || { echo "usage: $0 BEFORE_TREE AFTER_TREE [ROUNDS]" >&2; exit 2; }
a=$(cd "$1" && pwd) b=$(cd "$2" && pwd) rounds=${3:-5}
srcdir=$(cd "$(dirname "$0")/.." && pwd)
export OMPI_MCA_mpi_yield_when_idle=1 HWLOC_COMPONENTS=-pci,-linuxio
flags="--oversubscribe --bind-to none"
if [ "$(id -u)" -eq 0 ]; then
  flags="$flags --allow-run-as-root"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
work=$(mktemp -d)
netns=
for d in "${HORA_SHARED_DIR:-}" "$srcdir/../shared"; do
  [ -n "$d" ] && [ -x "$d/netns/netns-cluster.sh" ] && { netns="$d/netns"; break; }
done
cleanup() {
  [ -n "$netns" ] && "$netns/netns-cluster.sh" down >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
if [ -n "$netns" ] && [ "$(id -u)" -eq 0 ]; then
  export NETNS_PREFIX="hb$$x"
  if "$netns/netns-cluster.sh" up 4 >"$work/up.log" 2>&1; then
    for i in 0 1 2 3; do echo "${NETNS_PREFIX}$i slots=1"; done >"$work/hosts41"
  else
    netns=
  fi
else
  netns=
fi

# One round of one tree: lines "figure value" into $work/TAG.r
one() { # tag tree
  tag=$1 t=$2
  mpirun $flags -np 2 "$t/hora-bench" -b 1M -e 256M -f 4 -o allreduce -r 5 2>/dev/null |
    awk -v t="$tag" '$3 == "|" && $1 ~ /^[0-9]+$/ {
      printf "np2_busbw_%dMiB %s\nnp2_busbw_%dMiB_MPI %s\n", $1 / 1048576, $6, $1 / 1048576, $10
      if ($10 > 0) printf "np2_busbw_%dMiB_vs_MPI %.3f\n", $1 / 1048576, $6 / $10 }' >>"$work/$tag.r"
  mpirun $flags -np 2 "$t/hora-bench-resnet" --reps 7 2>/dev/null |
    awk '/hora \(161 async/ { h = $(NF-1); print "np2_resnet_ms", h }
         /MPI_Allreduce x 161/ { print "np2_resnet_ms_MPI", $6; if (h > 0) printf "np2_resnet_ms_vs_MPI %.3f\n", $6 / h }
         /^8-byte allreduce/ { print "np2_8B_us", $4; print "np2_8B_us_MPI", $7
                               if ($4 > 0) printf "np2_8B_us_vs_MPI %.4f\n", $7 / $4 }' >>"$work/$tag.r"
  if [ -n "$netns" ]; then
    timeout 120 "$netns/mpirun-netns.sh" "$work/hosts41" -np 4 "$t/hora-bench" -b 1M -e 64M -f 4 \
      -o allreduce -r 3 </dev/null 2>/dev/null |
      awk '$3 == "|" && $1 ~ /^[0-9]+$/ {
        printf "netns4x1_busbw_%dMiB %s\nnetns4x1_busbw_%dMiB_MPI %s\n", $1 / 1048576, $6, $1 / 1048576, $10
        if ($10 > 0) printf "netns4x1_busbw_%dMiB_vs_MPI %.3f\n", $1 / 1048576, $6 / $10 }' \
        >>"$work/$tag.r"
  fi
}

r=1
while [ $r -le "$rounds" ]; do
  if [ $((r % 2)) -eq 1 ]; then one before "$a"; one after "$b"; else one after "$b"; one before "$a"; fi
  echo "round $r of $rounds done" >&2
  r=$((r + 1))
done

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "# medians of $rounds rounds; before: $a, after: $b"
printf '%-28s %12s %12s %8s %14s %14s\n' figure before after after/bef "MPI(before)" "MPI(after)"
for f in $(awk '{ print $1 }' "$work/before.r" | grep -v '_MPI$' | awk '!seen[$0]++'); do
  case $f in *_vs_MPI) continue ;; esac
  vb=$(awk -v f="$f" '$1 == f { print $2 }' "$work/before.r" | median)
  va=$(awk -v f="$f" '$1 == f { print $2 }' "$work/after.r" | median)
  mb=$(awk -v f="${f}_MPI" '$1 == f { print $2 }' "$work/before.r" | median)
  ma=$(awk -v f="${f}_MPI" '$1 == f { print $2 }' "$work/after.r" | median)
  ratio=$(awk -v x="$va" -v y="$vb" 'BEGIN { if (y > 0) printf "%.3f", x / y; else print "-" }')
  printf '%-28s %12s %12s %8s %14s %14s\n' "$f" "$vb" "$va" "$ratio" "$mb" "$ma"
done
# The machine's load moves both libraries' figures together: hora against
# Open MPI within each run is the steadier comparison of the two trees.
echo "# hora vs Open MPI within each run (busbw: hora/MPI; times: MPI/hora), medians"
printf '%-28s %12s %12s %8s\n' figure before after after/bef
for f in $(awk '{ print $1 }' "$work/before.r" | grep '_vs_MPI$' | awk '!seen[$0]++'); do
  vb=$(awk -v f="$f" '$1 == f { print $2 }' "$work/before.r" | median)
  va=$(awk -v f="$f" '$1 == f { print $2 }' "$work/after.r" | median)
  ratio=$(awk -v x="$va" -v y="$vb" 'BEGIN { if (y > 0) printf "%.3f", x / y; else print "-" }')
  printf '%-28s %12s %12s %8s\n' "${f%_vs_MPI}" "$vb" "$va" "$ratio"
done
