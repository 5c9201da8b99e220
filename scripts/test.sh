#!/bin/sh
# The whole test suite, from a checkout that has never been built:
#   1. installs the Debian packages (scripts/install-deps.sh)
#   2. builds in the source tree and runs `make check`
#   3. builds a copy with AddressSanitizer + UBSan and runs `make check`
#   4. builds a copy with ThreadSanitizer and runs the threaded tests
#   5. builds a copy without MPI (configure --without-mpi) and runs its tests
#   (between them: Slurm, RDMA in a VM, valgrind, and fuzzing of the wire
#   decoders)
# and ends with one line: N passed, N failed, N skipped.
#
# usage: scripts/test.sh [--quick]    (--quick: step 2 only)
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
cd "$src"
quick=no
[ "${1:-}" = --quick ] && quick=yes

scripts/install-deps.sh || exit 1
summary=$(mktemp) log=$(mktemp) statusf=$(mktemp)
trap 'rm -f "$summary" "$log" "$statusf"' EXIT
status=0

# Stage headers, each closing the previous stage with its wall time.
suite_start=$(date +%s) stage_start=$suite_start stage=
note() {
  now=$(date +%s)
  [ -n "$stage" ] && printf '==== (%s: %d s)\n' "$stage" $((now - stage_start))
  stage=$*
  stage_start=$now
  [ $# -gt 0 ] && printf '\n==== %s\n' "$*"
}

# The sanitizer builds and the one without MPI each work on a copy (a
# source tree configured in place cannot also host out-of-tree builds),
# compiled in the background while the plain build's tests run: most of
# those wait on peers, timeouts and sleeps, and the compilers, at the idle
# scheduling class (or nice 19 where chrt is missing), take only the CPU
# the tests leave. That hides some 8 minutes of compiling, the test
# programs' included (2 of them, when each stage compiled its own first).
# Each build's exit status lands in DIR.built; its output in DIR.build-log.
copy_tree() { "$src/scripts/copy-tree.sh" "$src" "$1"; }
idle() { if command -v chrt >/dev/null 2>&1; then chrt -i 0 "$@"; else nice -n 19 "$@"; fi; }

prebuild() { # dir, configure flags
  # shellcheck disable=SC2086
  { copy_tree "$1" && cd "$1" && ./autogen.sh && ./configure $2 && idle make -j2 &&
    idle make -j2 build-checks; } >"$1.build-log" 2>&1
  echo $? >"$1.built.tmp" && mv "$1.built.tmp" "$1.built" # whole, never read half-written
}
# Whether the GPU's code is built there too: only where a GPU is visible.
cuda=--without-cuda
ls /dev/nvidia[0-9]* >/dev/null 2>&1 && cuda=
prebuild_all() {
  mkdir -p "$src/build"
  rm -f "$src/build/asan.built" "$src/build/tsan.built" "$src/build/nompi.built" # an earlier run's
  (prebuild "$src/build/asan" "--enable-sanitizers $cuda")
  (prebuild "$src/build/tsan" "--enable-sanitizers=thread $cuda")
  (prebuild "$src/build/nompi" "--without-mpi --without-cuda")
}
# Waits for DIR's background build; false (with its log's tail) if it failed.
built() { # dir, what
  while [ ! -f "$1.built" ]; do sleep 2; done
  [ "$(cat "$1.built")" = 0 ] && return 0
  echo "FAIL build $2 (exit status $(cat "$1.built")); the end of $1.build-log:"
  tail -n 30 "$1.build-log"
  echo "0 1 0" >>"$summary"
  status=1
  return 1
}

stages() {
# The plain build lives in the source tree, as the README's Quick start builds it.
note "plain build: $src"
if [ ! -x configure ] || [ configure.ac -nt configure ] || [ Makefile.am -nt Makefile.in ]; then
  ./autogen.sh >/dev/null 2>&1 || { echo "autogen.sh failed"; exit 1; }
fi
if [ ! -f Makefile ] || [ configure -nt config.status ]; then
  ./configure >/dev/null || { echo "configure failed (see config.log)"; exit 1; }
fi
make -j2 >/dev/null || { echo "make failed"; make 2>&1 | tail -30; exit 1; }
[ "$quick" = no ] && prebuild_all &
# The full suite runs each multi-rank run once: those at np 2 and 4 in
# the AddressSanitizer build below (which checks their results as this one
# does, and memory besides), the rest here.
san_nps=
[ "$quick" = no ] && san_nps="2 4"
HORA_TEST_SUMMARY=$summary HORA_TEST_SANITIZED_NPS=$san_nps make check || status=1
note "Slurm: srun and sbatch on a one-host cluster"
HORA_TEST_SUMMARY=$summary make check-slurm || status=1
note "RDMA: the verbs transport on soft-RoCE, in a VM"
# Three rounds of its benchmark against perftest keep a median and save a
# minute; `make check-rdma` alone runs five.
HORA_TEST_SUMMARY=$summary HORA_RDMA_BENCH_ROUNDS=${HORA_RDMA_BENCH_ROUNDS:-1} make check-rdma || status=1

note "valgrind: no leak or memory error from hora"
HORA_TEST_SUMMARY=$summary make check-valgrind || status=1
note "fuzzing the wire decoders (libFuzzer, ${HORA_FUZZ_SECONDS:-6} s per target)"
HORA_TEST_SUMMARY=$summary make check-fuzz FUZZ_SECONDS="${HORA_FUZZ_SECONDS:-6}" || status=1

sanitized() { # dir, configure flags, then environment settings for make check
  dir=$1 flags=$2
  shift 2
  note "sanitizer build ($flags): $dir"
  built "$dir" "with $flags" || return
  (cd "$dir" && env HORA_TEST_SUMMARY="$summary" "$@" make check) || status=1
}

# libhora without MPI, on a copy as above: the plain C compiler builds it,
# it needs no MPI library and has no MPI symbol, and what its build changes
# works: the unit tests of settings and start-up, start-up without MPI
# (check-startup.sh), a rebuilt communicator, hora.torch under torchrun's
# variables. The rest of its `make check` (the collectives' simulations,
# elastic membership, hvd.elastic) runs code this build shares with the
# others, which run it. The device code has no MPI in it and the plain
# build builds it: leaving it out here keeps this stage short.
without_mpi() { # dir
  dir=$1
  note "build without MPI (--without-mpi): $dir"
  built "$dir" "with --without-mpi" || return
  lib="$dir/.libs/libhora.so.0"
  needs=$(ldd "$lib" | grep -iE 'libmpi|libpmix|libopen-(pal|rte)')
  symbols=$(nm -D "$lib" | awk '{ print $NF }' |
    grep -E '^P?MPI_|^ompi_|^hora_init_comm$|^hora_process_set_from_mpi_comm$' | head -n 5)
  if [ -n "$(nm -D "$lib" | awk '$NF == "hora_init" { print }')" ] && [ -z "$needs" ] && [ -z "$symbols" ]; then
    echo "PASS nompi/libhora_needs_no_mpi (ldd, nm -D)"; echo "1 0 0" >>"$summary"
  else
    echo "FAIL nompi/libhora_needs_no_mpi: needs '$needs', has" $symbols; echo "0 1 0" >>"$summary"; status=1
  fi
  # Installed: <hora.h> and hora.pc, not <hora_mpi.h>, whose calls it lacks.
  if make -C "$dir" install DESTDIR="$dir/dest" >/dev/null 2>&1 &&
     [ -n "$(find "$dir/dest" -name hora.h)" ] && [ -n "$(find "$dir/dest" -name hora.pc)" ] &&
     [ -z "$(find "$dir/dest" -name hora_mpi.h)" ]; then
    echo "PASS nompi/install_leaves_out_hora_mpi_h"; echo "1 0 0" >>"$summary"
  else
    echo "FAIL nompi/install_leaves_out_hora_mpi_h"; echo "0 1 0" >>"$summary"; status=1
  fi
  (cd "$dir" && HORA_TEST_SUMMARY="$summary" \
    HORA_TEST_UNIT="params rendezvous slurm hello handshake connection strangers strerror" \
    HORA_TEST_ONLY="startup|bootstrap-env/python" make check) || status=1
}

if [ "$quick" = no ]; then
  # Sanitized runs cost seconds each in MPI start-up alone, so they keep to
  # np 2 and 4, where every data path runs (np=1 moves nothing between
  # ranks; the plain build runs np 1 and 16, and a sanitized plain process
  # still runs in the launcher section), and the plain build leaves these
  # runs to it. The variants of a test (other
  # transports, settings) run once, at their smallest rank count. The device
  # code is built by the plain build; its tests need a GPU, so the sanitizer
  # builds leave it out unless one is here. ThreadSanitizer looks at the
  # threads of one process, whose interplay np=2 already has; np=4 doubled
  # its minutes without reaching other code.
  sanitized "$src/build/asan" "--enable-sanitizers $cuda" HORA_TEST_NPS="$san_nps" HORA_TEST_VARIANTS_ONCE=1
  # Of the unit tests, those whose threads are the runtime's (the control
  # connections, cycles, progress engine, rendezvous): the simulations of
  # the collectives run one thread per simulated rank, where a process
  # runs its collectives on one thread.
  sanitized "$src/build/tsan" "--enable-sanitizers=thread $cuda" HORA_TEST_NPS="2" HORA_TEST_VARIANTS_ONCE=1 \
    HORA_TEST_UNIT="ctrl cycle progress mock rendezvous strangers connections" \
    HORA_TEST_ONLY="test_threads|test_collectives|test_join|test_abort|test_user_mpi|test_engine|test_stall|test_shared_mem|test_shutdown|test_process_sets|test_groups|^elastic$"
  without_mpi "$src/build/nompi"
fi

note
echo "==== (whole suite: $(($(date +%s) - suite_start)) s)"
echo $status >"$statusf"
}

# Everything goes to the log too, so that the failures, wherever in the
# suite they were, are named again beside the final count (CI keeps the tail).
stages 2>&1 | tee "$log"
status=$(cat "$statusf")
[ -n "$status" ] || status=1
if grep -q '^FAIL' "$log"; then
  printf '\n==== what failed\n'
  awk '/^==== [^(]/ { stage = substr($0, 6) } /^FAIL/ { print "[" stage "] " $0 }' "$log" | head -n 40
fi
awk '{p+=$1; f+=$2; s+=$3} END {printf "\n%d passed, %d failed, %d skipped\n", p, f, s}' "$summary"
exit $status
