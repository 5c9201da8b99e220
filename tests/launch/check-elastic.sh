#!/bin/sh
# Elastic training's membership, with hora's own rendezvous (processes
# started here, so that a killed one does not take the others down):
#   shrink    np=6: one rank killed mid-run, another during the reset that
#             follows; the 4 survivors finish, their sums right at every size
#   takeover  np=4: rank 0 (the coordinator) killed; the next one coordinates;
#             a process set made before is refused clearly, a new one works
#   adopt     the coordinator dies between the acceptance of its proposal
#             and the commit: the next one commits it, then goes on
#   grow      np=4 and a newcomer admitted at a commit, then a loss: 4 finish
#   adopt-newcomer  a member dies mid-ballot while a newcomer waits: it is let in
#   early-newcomer  a newcomer that knocks while the job still starts is let
#             in once it runs (not taken for one with another secret)
#   quorum    np=4: ranks 0 and 1 killed together; the other half has no
#             majority and fails with a message saying so, within seconds
#   min-size  HORA_ELASTIC_MIN_SIZE=3, np=3, one killed: the others fail
#   finalize-after-failure  hora_finalize after a reset failed for good
#             closes the listener and the door and ends the listener's
#             thread; a member asking later is told at once
#   finalize-race  hora_finalize while other threads make the elastic calls
#   slow      a member alive but late is left out, and told so when it asks
#   no-secret an elastic job without a secret refuses to start, saying why
#   stranger  garbage and malformed frames at the door (HORA_INSECURE=1):
#             dropped, logged
#   secret    a newcomer with another secret is refused, the job unharmed
#   max-size  HORA_ELASTIC_MAX_SIZE=4: a fifth process is refused
#   no-op     hora_elastic_reset without a failure: a clear error; and in a
#             job that is not elastic
# One PASS/FAIL line per check. usage: tests/launch/check-elastic.sh BUILDDIR
set -u
builddir=$(cd "${1:-.}" && pwd)
probe="$builddir/tests/launch/elastic_probe"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
LATE=
for v in $(env | grep -E '^(OMPI_COMM_|PMIX?_|SLURM_|MASTER_|HORA_)[A-Za-z0-9_]*=' | cut -d= -f1); do
  unset "$v"
done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
export HORA_CONNECT_TIMEOUT_SECONDS=20 HORA_ELASTIC_TIMEOUT_SECONDS=15 HORA_LOG_LEVEL=warn
# Every job has a secret (elastic jobs refuse to start without one) but
# those that say otherwise.
secret="$work/secret" other="$work/other"
(umask 077 && echo "the job's secret" >"$secret" && echo "another secret" >"$other")

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# job NAME NP STEPS COMMIT [VAR=VALUE...]: NP members in the background;
# each's output in $work/NAME.R, status in $work/NAME.R.rc
job() {
  name=$1 np=$2 steps=$3 every=$4
  shift 4
  port=$(free_port)
  echo "127.0.0.1:$port" >"$work/$name.at"
  r=0
  while [ $r -lt "$np" ]; do
    # LATE=R:S: rank R starts S seconds after the others
    ([ "${LATE%%:*}" = $r ] && sleep "${LATE#*:}"
     env HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS="127.0.0.1:$port" HORA_SIZE="$np" HORA_RANK=$r \
       HORA_ELASTIC=1 HORA_SECRET_FILE="$secret" "$@" timeout 90 "$probe" "$steps" "$every" >"$work/$name.$r" 2>"$work/$name.$r.err"
     echo $? >"$work/$name.$r.rc") &
    r=$((r + 1))
  done
}

# newcomer NAME TAG [VAR=VALUE...]: one more process asking the job NAME to admit it
newcomer() {
  name=$1 tag=$2
  shift 2
  (env HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS="$(cat "$work/$name.at")" HORA_ELASTIC=1 \
     HORA_SECRET_FILE="$secret" "$@" \
     timeout 90 "$probe" "$steps" "$every" >"$work/$name.$tag" 2>"$work/$name.$tag.err"
   echo $? >"$work/$name.$tag.rc") &
}

show() { # NAME: everything the job printed, for a failing check
  for f in "$work/$1".*; do
    case "$f" in *.rc|*.at) continue ;; esac
    echo "--- ${f##*/}"
    tail -n 12 "$f"
  done
}

. "$(dirname "$0")/elastic-checks.sh" # survivors, failed

steps=60 every=5
job shrink 6 $steps $every HORA_TEST_STEP_MS=5 HORA_TEST_KILL=20:3,r:1 HORA_SECRET_FILE="$secret"
wait
survivors shrink shrink 4 0 2 4 5
if grep -q "resets" "$work/shrink.1" "$work/shrink.3"; then
  echo "FAIL elastic/shrink-killed: a rank that was to be killed finished"
fi

job takeover 4 $steps $every HORA_TEST_STEP_MS=5 HORA_TEST_KILL=20:0 HORA_TEST_SETS=1
wait
survivors takeover takeover 3 1 2 3
# Process sets: the one made before the reset refused clearly, a new one works.
if [ "$(cat "$work"/takeover.[123] | grep -c '^PASS set after reset')" = 3 ] &&
   ! grep -q '^FAIL' "$work"/takeover.[0-9]; then
  echo "PASS elastic/process-sets: $(grep -ho 'the process set has been destroyed.*' "$work/takeover.1")"
else
  echo "FAIL elastic/process-sets"
  grep -h 'set' "$work"/takeover.[0-9]
fi

# The coordinator dies after its proposal was accepted, before committing:
# the next one commits that proposal (membership 2, the coordinator in it),
# then agrees on one without it (3).
job adopt 5 $steps $every HORA_TEST_STEP_MS=5 HORA_TEST_KILL=20:4 HORA_ELASTIC_TEST_CRASH=accepted@0
wait
survivors adopt adopt 3 1 2 3
grep -q '^membership 3: 1 2 3$' "$work/adopt.1" ||
  echo "FAIL elastic/adopt: the accepted proposal was not committed before the next (want membership 3)"

steps=200 every=10
job grow 4 $steps $every HORA_TEST_STEP_MS=10 HORA_TEST_KILL=150:1 HORA_SECRET_FILE="$secret"
sleep 0.5
newcomer grow new HORA_SECRET_FILE="$secret"
wait
survivors grow grow 4 0 2 3 new
grep -q "size 5 \|rank 4 of 5" "$work/grow.new.err" || echo "FAIL elastic/grow: the newcomer was never one of 5 ranks"

# A newcomer started with the job reaches its start-up rendezvous (rank 2
# comes 1.5 s late): it is turned away there and knocks again until the
# door opens, instead of failing as if the job held another secret.
LATE=2:1.5
job early 3 $steps $every HORA_TEST_STEP_MS=10 HORA_SECRET_FILE="$secret"
LATE=
sleep 0.3
newcomer early new HORA_SECRET_FILE="$secret"
wait
survivors early-newcomer early 4 0 1 2 new

# A newcomer waits at the door and a member dies between its promise and
# its acceptance: the others accepted the proposal that names the newcomer,
# so the next ballot commits it as it was (membership 2); the newcomer must
# be let in by the one after (3), not left waiting until it gives up.
job adoptnew 4 $steps $every HORA_TEST_STEP_MS=10 HORA_ELASTIC_TEST_CRASH=propose@2
sleep 0.5
newcomer adoptnew new
wait
survivors adopt-newcomer adoptnew 4 0 1 3 new

steps=60 every=5
t0=$(date +%s)
job quorum 4 $steps $every HORA_TEST_STEP_MS=5 HORA_TEST_KILL=20:0,20:1
wait
failed quorum quorum "more than half of them" 2 3
took=$(( $(date +%s) - t0 ))
[ $took -le 30 ] || echo "FAIL elastic/quorum: the survivors took $took s to fail"

job minsize 3 $steps $every HORA_TEST_STEP_MS=5 HORA_TEST_KILL=20:2 HORA_ELASTIC_MIN_SIZE=3
wait
failed min-size minsize "HORA_ELASTIC_MIN_SIZE=3" 0 1

# lifecycle_ended CHECK NAME WHO [DOOR]: WHO's "lifecycle:" line (the probe's,
# HORA_TEST_FINALIZE_ON_FAILURE) says hora_finalize succeeded and left no
# port listening or accepting (DOOR among those before) and one thread fewer.
lifecycle_ended() {
  line=$(grep '^lifecycle: ' "$work/$2.$3")
  nb=$(echo "$line" | sed -n 's/.*before: listening on \([0-9]*\) port.*/\1/p')
  tb=$(echo "$line" | sed -n 's/.*before: listening on [^;]*, \([0-9]*\) threads; after.*/\1/p')
  na=$(echo "$line" | sed -n 's/.*after: listening on \([0-9]*\) port.*/\1/p')
  ta=$(echo "$line" | sed -n 's/.*after: listening on [^,]*, \([0-9]*\) threads.*/\1/p')
  open=$(echo "$line" | sed -n 's/.*threads, \([0-9]*\) of the ports before accepting.*/\1/p')
  bad=""
  echo "$line" | grep -q "hora_finalize returned success" || bad="$bad (hora_finalize failed)"
  [ "${nb:-0}" -ge 1 ] || bad="$bad (no port listening before: not a test)"
  if [ $# -ge 4 ] && ! echo "$line" | grep -Eq "before: listening on [0-9]+ port\(s\):[0-9 ]* $4[ ,]"; then
    bad="$bad (the door $4 was not among the ports before)"
  fi
  [ "${na:-1}" = 0 ] && [ "${open:-1}" = 0 ] || bad="$bad (ports still open after hora_finalize)"
  [ -n "$tb" ] && [ "${ta:-0}" = $((tb - 1)) ] || bad="$bad (threads $tb before, $ta after: want one fewer)"
  if [ -z "$bad" ]; then
    echo "PASS elastic/$1: rank $3: ${line#lifecycle: }"
  else
    echo "FAIL elastic/$1: rank $3:$bad: ${line:-no lifecycle line}"
  fi
}

# The job fails for good (no majority left: rank 2 killed, rank 1 later
# than HORA_ELASTIC_TIMEOUT_SECONDS); each process calls hora_finalize 3 s
# after, then stays alive: rank 0's listener and door, rank 1's listener,
# must be closed and the listener's thread gone. Rank 1 asks rank 0 for a
# reset after rank 0 gave up but before its hora_finalize: it must be told
# when that runs, not held until rank 0 exits 4 s later.
job ended 3 $steps $every HORA_TEST_STEP_MS=5 HORA_TEST_KILL=20:2 HORA_TEST_SLOW=1:4 \
  HORA_ELASTIC_TIMEOUT_SECONDS=2 HORA_TEST_FINALIZE_ON_FAILURE=4:3
wait
failed finalize-after-failure-fails ended "more than half of them" 0 1
lifecycle_ended finalize-after-failure ended 0 "$(cut -d: -f2 "$work/ended.at")"
lifecycle_ended finalize-after-failure ended 1
ended0=$(sed -n 's/^lifecycle: .*hora_finalize returned [a-z ]* at \([0-9.]*\) .*/\1/p' "$work/ended.0")
failed1=$(sed -n 's/^lifecycle: failed at \([0-9.]*\),.*/\1/p' "$work/ended.1")
told=$(awk -v a="$ended0" -v b="$failed1" 'BEGIN { if (a != "" && b != "") printf "%.3f", b - a }')
if [ -n "$told" ] && awk -v d="$told" 'BEGIN { exit !(d > -1 && d < 1) }'; then
  echo "PASS elastic/finalize-after-failure-told: rank 1, queued at rank 0, failed $told s after rank 0's hora_finalize returned"
else
  echo "FAIL elastic/finalize-after-failure-told: rank 1 failed ${told:-?} s after rank 0's hora_finalize returned (want within 1 s)"
fi

# hora_finalize on one thread while others call hora_elastic_reset, _commit,
# _epoch and _joined in a loop, 20 times over: no crash, no sanitizer report
# (below), a clear error from each call after it.
port=$(free_port)
env HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS="127.0.0.1:$port" HORA_SIZE=1 HORA_RANK=0 HORA_ELASTIC=1 \
  HORA_SECRET_FILE="$secret" \
  timeout 60 "$builddir/tests/launch/elastic_finalize_race" 20 >"$work/race.0" 2>"$work/race.0.err"
rc=$?
if [ $rc = 0 ] && grep -q '^PASS' "$work/race.0"; then
  echo "PASS elastic/finalize-race: $(sed -n 's/^PASS //p' "$work/race.0")"
else
  echo "FAIL elastic/finalize-race: exit status $rc"
  show race
fi

steps=300 every=10
# A member alive but late (past HORA_ELASTIC_TIMEOUT_SECONDS) is left out;
# when it asks at last it is told so at once.
job slow 4 $steps $every HORA_TEST_STEP_MS=20 HORA_TEST_KILL=20:3 HORA_TEST_SLOW=2:4 \
  HORA_ELASTIC_TIMEOUT_SECONDS=2
wait
survivors slow slow 2 0 1
failed slow-told slow "was left out of the job's membership" 2

# Without a secret an elastic job refuses to start, saying why, unless
# HORA_INSECURE=1 says so.
job nosecret 2 $steps $every HORA_SECRET_FILE=
wait
failed no-secret nosecret "without a secret: anyone who reaches the job's ports could join it" 0 1

# Strangers at the door (HORA_INSECURE=1, no secret): garbage, a frame with an absurd
# length, a reset request whose view claims more members than its bytes
# hold. Each is dropped with a warning; the job is unharmed.
steps=150 every=10
job stranger 3 $steps $every HORA_TEST_STEP_MS=10 HORA_SECRET_FILE= HORA_INSECURE=1
sleep 0.7
/usr/bin/python3 - "$(cut -d: -f2 "$work/stranger.at")" <<'PY' 2>/dev/null
import socket, struct, sys, time
port = int(sys.argv[1])
def send(data):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall(data)
        time.sleep(0.1)
        s.close()
    except OSError:
        pass
send(b"GET / HTTP/1.0\r\n\r\n" * 20)
send(struct.pack("!II", 1, 0xFFFFFFFF))
view = struct.pack("!QII", 1, 3, 1000000)  # epoch, next id, a million members, no bytes
send(struct.pack("!II", 1, 4 + 8 + 4 + 2 + len(view)) + struct.pack("!IQ", 7, 0) + b"\0" * 6 + view)
PY
wait
survivors stranger stranger 3 0 1 2
grep -q "malformed membership frame\|-byte membership frame" "$work/stranger.0.err" &&
  echo "PASS elastic/stranger-logged: $(grep -ho 'elastic: \(dropped a malformed membership frame\|a [0-9]*-byte membership frame\)[^;]*' "$work/stranger.0.err" | head -n 1)" ||
  echo "FAIL elastic/stranger-logged: rank 0 logged nothing about the strangers"

steps=150 every=10
job secret 3 $steps $every HORA_TEST_STEP_MS=10 HORA_SECRET_FILE="$secret"
sleep 0.5
newcomer secret new HORA_SECRET_FILE="$other"
wait
failed secret secret "did not prove this job's secret" new
survivors secret-unharmed secret 3 0 1 2
grep -q "refused a connection from .*secret" "$work/secret.0.err" &&
  echo "PASS elastic/secret-logged: rank 0 logged the refusal" ||
  echo "FAIL elastic/secret-logged: rank 0 did not log the refused newcomer"

job maxsize 4 $steps $every HORA_TEST_STEP_MS=10 HORA_ELASTIC_MAX_SIZE=4
sleep 0.5
newcomer maxsize new HORA_ELASTIC_MAX_SIZE=4
wait
failed max-size maxsize "HORA_ELASTIC_MAX_SIZE=4: no more may join" new
survivors max-size-unharmed maxsize 4 0 1 2 3

steps=10 every=5
job noop 2 $steps $every HORA_TEST_RESET_FIRST=1
wait
if [ "$(grep -c '^PASS reset without a failure' "$work"/noop.0 "$work"/noop.1 | grep -c ':1$')" = 2 ] &&
   grep -q "nothing to reset" "$work/noop.0"; then
  echo "PASS elastic/no-op: $(grep -o 'hora_elastic_reset: nothing to reset[^)]*' "$work/noop.0")"
else
  echo "FAIL elastic/no-op"
  show noop
fi
job notelastic 2 $steps $every HORA_TEST_RESET_FIRST=1 HORA_ELASTIC=0
wait
if grep -q "not elastic" "$work/notelastic.0"; then
  echo "PASS elastic/not-elastic: $(grep -o 'hora_elastic_reset: the job is not elastic[^)]*' "$work/notelastic.0")"
else
  echo "FAIL elastic/not-elastic"
  show notelastic
fi

# Under Open MPI's mpirun with the option that keeps survivors
# (--enable-recovery): started through MPI, rebuilt over TCP after the loss of
# one rank and of another during the reset; then a newcomer started by
# `mpirun -np 1` with hora's rendezvous joins and one more is lost.
. "$builddir/tests/config.sh"
if [ "$HAVE_MPI" != yes ] || [ "$MPI_FLAVOR" != openmpi ]; then
  echo "SKIP elastic/mpirun: not an Open MPI build"
else
  flags="--enable-recovery --oversubscribe --bind-to none"
  [ "$(id -u)" -eq 0 ] && flags="$flags --allow-run-as-root"
  port=$(free_port)
  # Steps of 20 ms: the newcomer, started 2 s in, is let in before rank 0
  # (the rendezvous) goes at step 250, or by the next rank 0 after; where
  # mpirun and a sanitizer slow the job's start it arrives during the first
  # reset instead (elastic/adopt-newcomer's case).
  # shellcheck disable=SC2086
  timeout 120 "$MPIEXEC" $flags -np 6 -x HORA_ELASTIC=1 -x HORA_RENDEZVOUS=127.0.0.1:$port \
    -x HORA_SECRET_FILE="$secret" \
    -x HORA_TEST_STEP_MS=20 -x HORA_TEST_KILL=20:3,r:1,250:0 -x HORA_ELASTIC_TIMEOUT_SECONDS \
    -x HORA_CONNECT_TIMEOUT_SECONDS -x HORA_LOG_LEVEL "$probe" 300 10 >"$work/mpi.job" 2>"$work/mpi.err" &
  sleep 2
  # shellcheck disable=SC2086
  timeout 100 "$MPIEXEC" $flags -np 1 -x HORA_BOOTSTRAP=tcp -x HORA_RENDEZVOUS=127.0.0.1:$port \
    -x HORA_ELASTIC=1 -x HORA_SECRET_FILE="$secret" -x HORA_TEST_STEP_MS=20 \
    -x HORA_ELASTIC_TIMEOUT_SECONDS "$probe" 300 10 \
    >"$work/mpi.new" 2>"$work/mpi.new.err"
  wait
  # (3 resets, or 2 where the newcomer was already waiting when the first
  # loss came: a slow machine, a sanitizer; it is then admitted by that reset)
  if [ "$(grep -c 'size 4 resets [23] step 300$' "$work/mpi.job")" = 3 ] &&
     grep -q 'size 4 resets [0-9] step 300$' "$work/mpi.new"; then
    echo "PASS elastic/mpirun: 6 ranks under mpirun --enable-recovery lost 2 (one during the reset), admitted a newcomer, lost rank 0: 4 ended"
  else
    echo "FAIL elastic/mpirun"
    tail -n 8 "$work/mpi.job" "$work/mpi.err" "$work/mpi.new" "$work/mpi.new.err"
  fi
fi

# Under a sanitizer build, any report in any process's output is a failure.
reports=$(grep -lE "ERROR: (Address|Leak)Sanitizer|WARNING: ThreadSanitizer|runtime error:" "$work"/*.err 2>/dev/null)
if [ -n "$reports" ]; then
  echo "FAIL elastic/sanitizer: reports in $(echo "$reports" | sed 's#.*/##' | tr '\n' ' ')"
  for f in $reports; do grep -A12 -E "ERROR: |WARNING: ThreadSanitizer|runtime error:" "$f" | head -n 30; done
fi
