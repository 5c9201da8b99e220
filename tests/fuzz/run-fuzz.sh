#!/bin/sh
# Builds every fuzz target with clang's libFuzzer (+ AddressSanitizer and
# UBSan) and runs each for SECONDS (two at once, a core each), in a scratch
# directory, starting from the committed corpus (tests/fuzz/corpus/TARGET:
# seeds and inputs that once failed) plus fresh seeds that make-seeds
# encodes with the runtime's own encoders, so they follow the wire format
# as it changes. Prints one line per target and the usual closing line.
# usage: run-fuzz.sh BUILDDIR [SECONDS]
set -u
builddir=$(cd "$1" && pwd)
seconds=${2:-20}
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
results="$work/results"
: >"$results"
cc=${FUZZ_CC:-clang}
if ! command -v "$cc" >/dev/null 2>&1; then
  echo "SKIP fuzz/all: $cc is not installed (scripts/install-deps.sh)" | tee -a "$results"
else
  mpi_cflags=$(mpicc --showme:compile 2>/dev/null || mpicc -show 2>/dev/null | sed 's/^[^ ]* //; s/ -l[^ ]*//g; s/ -L[^ ]*//g; s/ -Wl[^ ]*//g')
  sources="base/error.c base/dtype.c base/log.c base/params.c base/wire.c
           base/table.c runtime/operation.c runtime/negotiate/message.c runtime/negotiate/cache.c
           comm/transport/handshake.c comm/transport/socket.c comm/transport/ctrl.c
           comm/transport/ib/ib_wire.c runtime/negotiate/cycle.c comm/bootstrap/membership_fsm.c
           comm/bootstrap/membership_receive.c comm/bootstrap/membership_coord.c
           comm/bootstrap/membership_wire.c"
  flags="-g -O1 -std=gnu11 -D_GNU_SOURCE -I$src/include -I$src -I$builddir $mpi_cflags"
  if ! (cd "$src" && $cc $flags tests/fuzz/make-seeds.c $sources -o "$work/make-seeds" -lcrypto -lm) \
       >"$work/seeds.build" 2>&1 || ! "$work/make-seeds" "$work/corpus" >"$work/seeds.log" 2>&1; then
    echo "FAIL fuzz/seeds: make-seeds does not build or run" | tee -a "$results"
    tail -n 10 "$work/seeds.build" "$work/seeds.log"
  fi
  # The decoders compiled once, instrumented for coverage and the
  # sanitizers (fuzzer-no-link), two at a time; each target links them.
  sanitize="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
  mkdir -p "$work/obj"
  export cc flags sanitize work
  printf '%s\n' $sources | (cd "$src" && xargs -P 2 -I{} sh -c \
    'o="$work/obj/$(echo "{}" | tr / _).o"; $cc $flags $sanitize -fsanitize=fuzzer-no-link -c "{}" -o "$o" 2>"$o.log" || cat "$o.log"') \
    >"$work/objs.build" 2>&1
  targets="fuzz_hello fuzz_handshake fuzz_requests fuzz_responses fuzz_small fuzz_frames fuzz_ib fuzz_cycle
           fuzz_membership"
  # Linked two at a time too; a target that does not build says so below.
  printf '%s\n' $targets | (cd "$src" && xargs -P 2 -I{} sh -c \
    '$cc $flags $sanitize -fsanitize=fuzzer tests/fuzz/{}.c "$work"/obj/*.o -o "$work/{}" -lcrypto -lm \
       >"$work/{}.build" 2>&1 || rm -f "$work/{}"')
  # Each target runs on a core of its own: two at a time on two cores, so
  # every one still gets its SECONDS of a whole core. Their lines are
  # printed in the list's order once a pair is done.
  fuzz_one() { # target: writes $work/$t.result
    t=$1
    if [ ! -x "$work/$t" ]; then
      { echo "FAIL fuzz/$t: does not build"; tail -n 10 "$work/objs.build" "$work/$t.build"; } >"$work/$t.result"
      return
    fi
    mkdir -p "$work/corpus/$t"
    cp "$here/corpus/$t"/* "$work/corpus/$t/" 2>/dev/null
    if "$work/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=1024 -print_final_stats=1 \
         -artifact_prefix="$work/$t-" "$work/corpus/$t" >"$work/$t.log" 2>&1; then
      runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$t.log" | grep -o '[0-9]*$')
      [ -z "$runs" ] && runs=$(grep -o '#[0-9]*' "$work/$t.log" | tail -n 1 | tr -d '#')
      echo "PASS fuzz/$t (${runs:-?} inputs in ${seconds}s)" >"$work/$t.result"
    else
      {
        echo "FAIL fuzz/$t: crash or leak, reproducer below"
        grep -E 'ERROR|SUMMARY|runtime error|Test unit written' "$work/$t.log" | head -n 10
        for a in "$work/$t"-*; do
          [ -f "$a" ] && od -A d -t x1 "$a" | head -n 8
        done
      } >"$work/$t.result"
    fi
  }
  set -- $targets
  while [ $# -gt 0 ]; do
    pair=$1
    fuzz_one "$1" &
    if [ $# -gt 1 ]; then
      pair="$pair $2"
      fuzz_one "$2" &
    fi
    wait
    for t in $pair; do
      cat "$work/$t.result"
      grep -E '^(PASS|FAIL) ' "$work/$t.result" >>"$results"
    done
    shift
    [ $# -gt 0 ] && shift
  done
fi
p=$(grep -c '^PASS' "$results") f=$(grep -c '^FAIL' "$results") s=$(grep -c '^SKIP' "$results")
[ -n "${HORA_TEST_SUMMARY:-}" ] && echo "$p $f $s" >>"$HORA_TEST_SUMMARY"
echo "$p passed, $f failed, $s skipped"
[ "$f" -eq 0 ]
