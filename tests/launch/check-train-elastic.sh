#!/bin/sh
# examples/train --elastic with processes that die on purpose (its failure
# drills). The processes are started here, one by one (HORA_BOOTSTRAP=tcp):
# tests/launch/launch.sh stops a job when one of its processes dies, which
# is what these tests must not do.
#   1. np=6, undisturbed: the reference accuracy
#   2. np=6, the rank started as 3 killed at step 120, the one started as 1
#      50 ms into the reset that follows: the survivors go on with 4 ranks,
#      each says so, none hangs, and the accuracy is within 0.01 of 1.
#   3. np=4, a fifth process started later joins at a commit and holds the
#      same state as the others (checksum), then the rank started as 2 dies:
#      the job ends with 4
#   4. as 2, under Open MPI's mpirun (--enable-recovery: the survivors are
#      not stopped), hora starting through MPI and the survivors rebuilding
#      over TCP
# Prints PASS/FAIL/SKIP lines.
# usage: check-train-elastic.sh BUILDDIR [quick]   (quick: only 2, shorter
#        and without the accuracy, for sanitizer builds)
set -u
builddir=$(cd "$1" && pwd)
quick=${2:-}
. "$builddir/tests/config.sh"
train="$builddir/examples/train"
if [ ! -x "$train" ]; then
  echo "SKIP train-elastic/all: examples/train was not built (configure found no OpenBLAS or zlib)"
  exit 0
fi
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "SKIP train-elastic/all: Fashion-MNIST is not installed (scripts/install-deps.sh)"
  exit 0
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/hora-train-elastic-XXXXXX") || exit 2
trap 'rm -rf "$work"' EXIT
limit=120 # seconds per process: a hang is a failure, not a stuck suite

# No launcher's variables may leak in (the Open MPI settings stay).
for v in $(env | grep -E '^(OMPI_|PMIX?_|SLURM_|HYDRA_|HYDI_|MPI_LOCAL)[A-Za-z0-9_]*=' | cut -d= -f1); do
  case "$v" in
    OMPI_MCA_*|OMPI_ALLOW_*) continue ;;
  esac
  unset "$v" 2>/dev/null
done
unset HORA_BOOTSTRAP HORA_RENDEZVOUS HORA_RANK HORA_SIZE HORA_SECRET HORA_SECRET_FILE \
  MASTER_ADDR MASTER_PORT RANK WORLD_SIZE
export HORA_ELASTIC=1
(umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$work/secret")

free_port() { # below the ephemeral range, nothing listening
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    p=$((20000 + $(od -An -N4 -tu4 /dev/urandom | tr -d ' ') % 12000))
    if ! command -v ss >/dev/null 2>&1 || [ -z "$(ss -Htln "sport = :$p" 2>/dev/null)" ]; then
      echo "$p"
      return
    fi
  done
  echo 0
}

# start DIR NAME RANK SIZE PORT ARGS...: one process in the background
# (RANK empty: a newcomer); its status lands in DIR/rc.NAME.
start() {
  d=$1 name=$2 r=$3 size=$4 port=$5
  shift 5
  (
    export HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS="127.0.0.1:$port" HORA_SECRET_FILE="$work/secret"
    [ -n "$r" ] && export HORA_RANK="$r" HORA_SIZE="$size"
    timeout -k 5 "$limit" "$train" --elastic --checkpoint "$d/ckpt.$name" "$@" \
      </dev/null >"$d/out.$name" 2>"$d/err.$name"
    echo $? >"$d/rc.$name"
  ) &
}

# job DIR NP ARGS...: NP processes, waited for.
job() {
  d=$1 np=$2
  shift 2
  mkdir -p "$d"
  port=$(free_port)
  r=0
  while [ "$r" -lt "$np" ]; do
    start "$d" "$r" "$r" "$np" "$port" "$@"
    r=$((r + 1))
  done
  wait
}

accuracy() { sed -n 's/^test_accuracy=//p' "$1" 2>/dev/null | tail -n 1; }
rc_of() { cat "$1/rc.$2" 2>/dev/null || echo none; }

# problems DIR NAMES KILLED: what is wrong with the statuses (the killed
# ones must have died by SIGKILL from their drill, the others exited 0).
problems() {
  d=$1 names=$2 killed=$3 bad=
  for n in $names; do
    rc=$(rc_of "$d" "$n")
    case " $killed " in
      *" $n "*)
        if [ "$rc" != 137 ] || ! grep -q 'drill: killing this process' "$d/err.$n"; then
          bad="$bad; $n (to be killed by its drill) ended with status $rc"
        fi ;;
      *)
        [ "$rc" = 124 ] && bad="$bad; $n timed out after ${limit}s"
        [ "$rc" != 0 ] && [ "$rc" != 124 ] && bad="$bad; $n exited with status $rc" ;;
    esac
  done
  echo "${bad#; }"
}

show() { # DIR NAMES: the end of each process's output, for a failure
  for n in $2; do
    echo "---- process $n (status $(rc_of "$1" "$n")): stdout, then stderr"
    tail -n 6 "$1/out.$n" 2>/dev/null
    grep -v 'SECRET' "$1/err.$n" 2>/dev/null | tail -n 8
  done
  echo "----"
}

# The last membership line of each survivor: N ranks, and the same
# checksum everywhere.
last_change() { grep '^elastic: membership .* ranks (was' "$1" | tail -n 1; }
last_checksum() { grep '^elastic: membership .* state checksum' "$1" | tail -n 1 | sed 's/.*checksum //'; }
reset_times() { # files...: "0.35 0.34 ..." from the survivors' lines
  grep -h 'took .* s; state checksum' "$@" | sed 's/.*took \([0-9.]*\) s.*/\1/' | tr '\n' ' '
}

# check_shrunk NAME FILES...: every survivor's last change says 4 ranks,
# and they hold the same state; prints the problem or nothing.
check_shrunk() {
  what=$1
  shift
  sums=
  for f in "$@"; do
    line=$(last_change "$f")
    case "$line" in
      *": 4 ranks (was "*) ;;
      *) echo "$what: a survivor's last membership line is '${line:-missing}', not 4 ranks"; return ;;
    esac
    sums="$sums $(last_checksum "$f")"
  done
  if [ "$(echo $sums | tr ' ' '\n' | sort -u | wc -l)" -ne 1 ]; then
    echo "$what: the survivors' state checksums differ after the last sync:$sums"
  fi
}

close_to() { awk -v a="$1" -v b="$2" 'BEGIN {d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 0.01)}'; }

drills="--die-at 120 --die-rank 3 --die-in-reset-rank 1"
ref=
if [ -n "$quick" ]; then
  len="--max-steps 40"
  drills="--die-at 20 --die-rank 3 --die-in-reset-rank 1"
  echo "SKIP train-elastic/np6_accuracy_as_undisturbed: quick mode (two runs of a whole epoch; the plain build runs it)"
else
  len="--epochs 1"
  start_s=$(date +%s)
  job "$work/u" 6 $len
  ref=$(accuracy "$work/u/out.0")
  bad=$(problems "$work/u" "0 1 2 3 4 5" "")
  if [ -z "$bad" ] && [ -n "$ref" ]; then
    echo "PASS train-elastic/tcp_np6_undisturbed (test_accuracy=$ref in $(($(date +%s) - start_s)) s)"
  else
    echo "FAIL train-elastic/tcp_np6_undisturbed (${bad:-no test_accuracy line})"
    show "$work/u" "0 1 2 3 4 5"
  fi
fi

# 2. Kill in training, kill in the reset.
start_s=$(date +%s)
job "$work/k" 6 $len $drills
secs=$(($(date +%s) - start_s))
acc=$(accuracy "$work/k/out.0")
bad=$(problems "$work/k" "0 1 2 3 4 5" "1 3")
[ -z "$bad" ] && bad=$(check_shrunk "membership" "$work"/k/out.0 "$work"/k/out.2 "$work"/k/out.4 \
  "$work"/k/out.5)
[ -z "$bad" ] && [ -z "$acc" ] && bad="rank 0 printed no test_accuracy"
changes=$(grep '^elastic: membership .* ranks (was' "$work/k/out.0" | sed 's/^elastic: membership \([0-9]*\): \([0-9]*\) ranks (was \([0-9]*\)).*/\3->\2 (membership \1)/' | tr '\n' ' ' | sed 's/ $//')
if [ -z "$bad" ] && [ -z "$quick" ] && ! close_to "$acc" "$ref"; then
  bad="test_accuracy=$acc is not within 0.01 of the undisturbed run's $ref"
fi
if [ -z "$bad" ]; then
  echo "PASS train-elastic/tcp_np6_kill_in_training_and_in_reset (sizes ${changes}; resets of $(reset_times "$work"/k/out.*)s; test_accuracy=$acc${ref:+, undisturbed $ref}; ${secs} s)"
else
  echo "FAIL train-elastic/tcp_np6_kill_in_training_and_in_reset: $bad"
  show "$work/k" "0 1 2 3 4 5"
fi

if [ -n "$quick" ]; then
  echo "SKIP train-elastic/tcp_np4_grow_then_shrink: quick mode"
  echo "SKIP train-elastic/mpirun_np6_kill_in_training_and_in_reset: quick mode"
  exit 0
fi

# 3. A newcomer, once rank 0 is training (its first line), then a loss:
# rank 2 dies at the first step from 100 on at which the job has 5 ranks
# (however long the newcomer's start takes on a loaded machine).
d="$work/g"
mkdir -p "$d"
start_s=$(date +%s)
port=$(free_port)
glen="--max-steps 300"
for r in 0 1 2 3; do
  start "$d" "$r" "$r" 4 "$port" $glen --die-at 100 --die-rank 2 --die-with-ranks 5
done
i=0
while [ $i -lt 600 ] && ! grep -q '^train: 4 ranks' "$d/out.0" 2>/dev/null; do
  sleep 0.1
  i=$((i + 1))
done
start "$d" new "" "" "$port" $glen --die-at 100 --die-rank 2 --die-with-ranks 5
wait
secs=$(($(date +%s) - start_s))
bad=$(problems "$d" "0 1 2 3 new" "2")
if [ -z "$bad" ]; then
  # The membership with 5 ranks: every process says so, with one checksum.
  grown=$(grep -h '^elastic: membership .*: 5 ranks (was 4)' "$d"/out.* | sort -u)
  m5=$(echo "$grown" | sed -n 's/^elastic: membership \([0-9]*\):.*/\1/p' | head -n 1)
  n5=$(grep -l "^elastic: membership $m5: 5 ranks (was 4)" "$d"/out.* 2>/dev/null | wc -l)
  sums=$(grep -h "^elastic: membership $m5: rank .* state checksum" "$d"/out.* 2>/dev/null |
    sed 's/.*checksum //' | sort -u)
  first_new=$(grep -m 1 'state checksum' "$d/out.new" | sed 's/.*checksum //')
  if [ -z "$m5" ] || [ "$n5" -ne 5 ]; then
    bad="the newcomer was not let in ($n5 processes say '5 ranks (was 4)')"
  elif [ "$(echo "$sums" | wc -l)" -ne 1 ] || [ "$first_new" != "$sums" ]; then
    bad="after the newcomer's sync the checksums differ: $(echo $sums) (the newcomer's first: $first_new)"
  else
    bad=$(check_shrunk "after the loss" "$d/out.0" "$d/out.1" "$d/out.3" "$d/out.new")
  fi
fi
acc=$(accuracy "$d/out.0")
[ -z "$bad" ] && [ -z "$acc" ] && bad="rank 0 printed no test_accuracy"
if [ -z "$bad" ]; then
  join_at=$(echo "$grown" | sed -n 's/.*resuming at epoch [0-9]* step \([0-9]*\);.*/\1/p' | head -n 1)
  died_at=$(sed -n 's/.*drill: killing this process at step \([0-9]*\).*/\1/p' "$d/err.2" | head -n 1)
  echo "PASS train-elastic/tcp_np4_grow_then_shrink (joined at step $join_at with checksum $first_new; 5->4 at step $died_at; test_accuracy=$acc after 300 steps; ${secs} s)"
else
  echo "FAIL train-elastic/tcp_np4_grow_then_shrink: $bad"
  show "$d" "0 1 2 3 new"
fi

# 4. Under mpirun.
if [ "$MPI_FLAVOR" != openmpi ]; then
  echo "SKIP train-elastic/mpirun_np6_kill_in_training_and_in_reset: Open MPI's mpirun only (--enable-recovery; this build's MPI is $MPI_FLAVOR)"
  exit 0
fi
d="$work/m"
mkdir -p "$d"
flags="--oversubscribe --bind-to none --enable-recovery"
[ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"
start_s=$(date +%s)
# The wrapper records each rank's status (mpirun's own says little once
# ranks have died on purpose).
timeout -k 10 "$limit" "$MPIEXEC" $flags -x HORA_ELASTIC -np 6 sh -c \
  '"$@"; rc=$?; echo $rc >"'"$d"'/rc.$OMPI_COMM_WORLD_RANK"; exit $rc' sh \
  "$train" --elastic --checkpoint "$d/ckpt" $len $drills </dev/null >"$d/out" 2>"$d/err"
mrc=$?
secs=$(($(date +%s) - start_s))
for r in 1 3; do cp "$d/err" "$d/err.$r"; done # where problems() looks for the drills' lines
bad=$(problems "$d" "0 1 2 3 4 5" "1 3")
[ $mrc -eq 124 ] && bad="mpirun timed out after ${limit}s${bad:+; $bad}"
n4=$(grep -c '^elastic: membership [0-9]*: 4 ranks (was' "$d/out")
sums=$(grep '^elastic: membership .* state checksum' "$d/out" | sed 's/.*checksum //' | sort -u | wc -l)
acc=$(accuracy "$d/out")
[ -z "$bad" ] && [ "$n4" -ne 4 ] && bad="$n4 survivors, not 4, say '4 ranks'"
[ -z "$bad" ] && [ "$sums" -ne 1 ] && bad="the survivors' state checksums differ"
[ -z "$bad" ] && ! close_to "$acc" "$ref" &&
  bad="test_accuracy=${acc:-none} is not within 0.01 of the undisturbed run's $ref"
if [ -z "$bad" ]; then
  echo "PASS train-elastic/mpirun_np6_kill_in_training_and_in_reset (resets of $(reset_times "$d/out")s; test_accuracy=$acc, undisturbed $ref; ${secs} s)"
else
  echo "FAIL train-elastic/mpirun_np6_kill_in_training_and_in_reset: $bad (mpirun status $mrc)"
  tail -n 20 "$d/out"
  grep -v SECRET "$d/err" | tail -n 20
fi
