#!/bin/sh
# Chaos on an elastic job of real processes (hora's own rendezvous, a
# secret), each trial a schedule drawn from a seed (printed on its line):
#   quorum    6-8 workers; SIGKILLs of random workers at random times, a
#             second one often during a reset (right after the first, or
#             while the others wait for a stopped one); a worker stopped
#             (SIGSTOP) for longer than HORA_PEER_TIMEOUT_SECONDS, then let
#             go (SIGCONT); newcomers started at random times. Never more
#             losses than leave a quorum of every membership, so the job
#             must go on: every worker neither killed nor stopped finishes,
#             newcomers too (unless rank 0, which holds the door, was the
#             one stopped: then it may be told it was not admitted); a
#             stopped one finishes or is told it was left out
#   majority  (seeds of the form 4k+3) perhaps one kill, then more than half
#             of the rest killed at once (perhaps a newcomer knocking just
#             after): every survivor fails, saying there is no quorum,
#             within a bounded time; the newcomer fails clearly too
# The workers (tests/launch/chaos_worker.c) train a small deterministic
# model: w += the average of a gradient that, averaged, depends on the step
# only; after every reset the step and w come from rank 0. After each trial:
# every process that finished names the same epoch, members and checksum of
# w, and that checksum is the one of applying each step once
# (chaos_worker --expect STEPS); nothing hung (each process runs under
# `timeout`); each process that did not finish was killed by the schedule or
# failed with one of the clear errors above, never a crash or an unexplained
# exit; the schedule did hit the job (a kill landed, the epoch moved on).
#   netns     fake hosts (../shared/netns): 3 hosts x 2 workers, host 2's
#             link cut for longer than the timeouts, then restored: hosts 0
#             and 1 go on; host 2's workers fail for want of a quorum within
#             a bounded time; after the restore a newcomer on host 2 is
#             admitted and the job ends right. SKIP when not root or without
#             namespaces.
# One PASS/FAIL/SKIP line per trial.
# usage: tests/launch/check-elastic-chaos.sh BUILDDIR
#   CHAOS_SEED=N       one trial, of seed N (as printed), and no netns variant
#   CHAOS_TRIALS=K     K trials of consecutive seeds (default 5: one or two majority)
#   CHAOS_SEED_BASE=N  the first of them (default: drawn from the clock)
#   CHAOS_NETNS=0|1|only  the fake-host variant: not, also (default), alone
#   CHAOS_KEEP=DIR     keep every trial's logs in DIR
#   CHAOS_LOG_LEVEL=L  the workers' HORA_LOG_LEVEL (default warn; info shows the agreement)
set -u
builddir=$(cd "${1:-.}" && pwd)
srcdir=$(cd "$(dirname "$0")/../.." && pwd)
worker="$builddir/tests/launch/chaos_worker"
work=$(mktemp -d)
launched=""
cleanup() { # the workers still running (by their ids), the fake hosts, the files
  for b in $launched; do
    [ -e "$b.rc" ] && continue # ended: its id may be another process's now
    p=$(cat "$b.pid" 2>/dev/null)
    [ -n "$p" ] && kill -CONT "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null
  done
  [ -n "${netns_up:-}" ] && "$netns/netns-cluster.sh" down >/dev/null 2>&1
  if [ -n "${CHAOS_KEEP:-}" ]; then
    mkdir -p "$CHAOS_KEEP" && cp -r "$work"/. "$CHAOS_KEEP"/
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
for v in $(env | grep -E '^(OMPI_COMM_|PMIX?_|SLURM_|MASTER_|HORA_)[A-Za-z0-9_]*=' | cut -d= -f1); do
  unset "$v"
done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE

# Timeouts, low to keep it short; a sanitizer build gets twice as long.
. "$builddir/tests/config.sh"
f=1
[ -n "$SANITIZERS" ] && [ "$SANITIZERS" != no ] && f=2
peer=$((2 * f)) elastic=$((8 * f))
export HORA_PEER_TIMEOUT_SECONDS=$peer HORA_ELASTIC_TIMEOUT_SECONDS=$elastic \
  HORA_CONNECT_TIMEOUT_SECONDS=$((10 * f)) HORA_LOG_LEVEL="${CHAOS_LOG_LEVEL:-warn}"
steps=250 every=10 step_ms=20   # at least 5 s of steps, whatever the machine
bound=$((45 * f))               # each process's own limit (timeout)
fail_bound=$((elastic + 6 * f)) # the survivors of a majority's loss fail within this
secret="$work/secret"
(umask 077 && echo "the chaos job's secret" >"$secret")
expect=$("$worker" --expect $steps)

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
now() { date +%s.%N; }
since() { awk -v a="$t0" -v b="${1:-$(now)}" 'BEGIN { printf "%.2f", b - a }'; }
sleep_until() { # seconds after t0
  d=$(awk -v a="$t0" -v b="$(now)" -v t="$1" 'BEGIN { d = a + t - b; printf "%.3f", (d > 0 ? d : 0) }')
  sleep "$d"
}

# start T WHO [VAR=VALUE...]: a worker of trial T in the background, under
# timeout; its output in $work/T.WHO.{out,err}, its exit status in .rc, when
# it ended in .end, its process id in .pid (the shell that writes it execs
# the worker). NS=name: inside that fake host's network namespace.
start() {
  t=$1 who=$2
  shift 2
  b="$work/$t.$who"
  if [ -n "${NS:-}" ]; then
    # netns-rsh.sh: the fake host's namespace and its own host name
    # shellcheck disable=SC2016
    (timeout -k 2 $bound "$netns/netns-rsh.sh" "$NS" \
       "echo \$\$ >'$b.pid'; exec env $* HORA_SECRET_FILE='$secret' '$worker' $steps $every" \
       </dev/null >"$b.out" 2>"$b.err"
     echo $? >"$b.rc"
     now >"$b.end") &
  else
    # shellcheck disable=SC2016
    (timeout -k 2 $bound sh -c 'echo $$ >"$0"; exec "$@"' "$b.pid" \
       env "$@" HORA_SECRET_FILE="$secret" "$worker" $steps $every </dev/null >"$b.out" 2>"$b.err"
     echo $? >"$b.rc"
     now >"$b.end") &
  fi
  i=0
  while [ ! -s "$b.pid" ] && [ $i -lt 100 ]; do
    sleep 0.02
    i=$((i + 1))
  done
  launched="$launched $b"
}

# hit T WHO SIGNAL: signals trial T's worker WHO if it still runs; records
# it in $work/T.events ("kill WHO AT", "stop WHO AT", "cont WHO AT")
hit() {
  b="$work/$1.$2"
  p=$(cat "$b.pid" 2>/dev/null)
  if [ -n "$p" ] && [ ! -e "$b.rc" ] && kill -"$3" "$p" 2>/dev/null; then
    case $3 in
      KILL) echo "kill $2 $(since)" >>"$work/$1.events" ;;
      STOP) echo "stop $2 $(since)" >>"$work/$1.events" ;;
      CONT) echo "cont $2 $(since)" >>"$work/$1.events" ;;
    esac
  else
    echo "missed $3 $2 $(since)" >>"$work/$1.events"
  fi
}

# ready T WHO...: waits (20 s at most) until each has trained its first step's state sync
ready() {
  t=$1
  shift
  i=0
  for who in "$@"; do
    while ! grep -q "^id $who: ready" "$work/$t.$who.err" 2>/dev/null && [ $i -lt 400 ]; do
      sleep 0.05
      i=$((i + 1))
    done
  done
  [ $i -lt 400 ]
}

# The schedule of a seed: "n N", "kind quorum|majority", then lines
# "AT kill WHO...", "AT stop WHO SECONDS", "AT new WHO" (AT: seconds after
# the originals are ready), in order. WHO: an original's start-up rank, a
# newcomer's id (100, 101, ...). Python's random, so that a seed means the
# same schedule everywhere.
schedule() { # seed peer-timeout run-seconds
  /usr/bin/python3 - "$@" <<'PY'
import random, sys
seed, peer, run = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
rng = random.Random(seed)
n = rng.choice([6, 7, 8])
majority = seed % 4 == 3
ev = []          # (at, what, args)
starts = {r: 0.0 for r in range(n)}  # who -> when it started
def pick(at, out):
    """A worker started before `at` (newcomers 0.3 s before), not in `out`."""
    c = [w for w, s in sorted(starts.items()) if s + (0.3 if w >= 100 else 0) <= at and w not in out]
    return rng.choice(c)
if not majority:
    # At most (n-1)//2 losses (kills and stops, newcomers' too) in all: then
    # whatever resets they fall into, each loses less than half of its
    # membership (newcomers only make memberships larger).
    budget = (n - 1) // 2
    for k in range(rng.randint(1, 2)):
        starts[100 + k] = round(rng.uniform(0.1, 0.55 * run), 2)
    for w, s in starts.items():
        if w >= 100:
            ev.append((s, "new", [w]))
    gone = set()
    def kill(at):
        w = pick(at, gone)
        gone.add(w)
        ev.append((at, "kill", [w]))
    stop = None
    if rng.random() < 0.6:
        stop = round(rng.uniform(0.3, 0.45 * run), 2)
        w = pick(stop, gone)
        gone.add(w)
        ev.append((stop, "stop", [w, round(rng.uniform(peer + 0.5, peer + 5), 2)]))
    at = round(rng.uniform(0.3, 0.3 * run), 2)
    kill(at)
    if rng.random() < 0.7 and len(gone) < budget:
        if stop is not None and rng.random() < 0.4:
            # during the reset the stopped one starts, once the others
            # find it silent (HORA_PEER_TIMEOUT_SECONDS), while they wait for it
            kill(round(stop + peer + rng.uniform(0.1, 2.0), 2))
        else:
            kill(round(at + rng.uniform(0.02, 0.5), 2))  # during the reset the first starts
    if rng.random() < 0.4 and len(gone) < budget:
        kill(round(rng.uniform(0.4 * run, 0.6 * run), 2))
else:
    # One kill perhaps, then more than half of those left killed at once: a
    # quorum of neither the first membership nor the one after that kill.
    alive = list(range(n))
    if rng.random() < 0.5:
        w = rng.choice(alive)
        alive.remove(w)
        ev.append((round(rng.uniform(0.3, 1.0), 2), "kill", [w]))
    at = round(rng.uniform(1.8, 3.0), 2)
    ev.append((at, "kill", sorted(rng.sample(alive, len(alive) // 2 + 1))))
    if rng.random() < 0.5:
        ev.append((round(at + rng.uniform(0, 0.3), 2), "new", [100]))
print("n", n)
print("kind", "majority" if majority else "quorum")
for at, what, args in sorted(ev, key=lambda e: e[0]):
    print(at, what, *args)
PY
}

# failure T WHO: the worker's FAIL line; finished T WHO: whether it printed its final line
failure() { grep -h '^FAIL' "$work/$1.$2.out" 2>/dev/null | head -n 1; }
finished() { grep -q '^final epoch ' "$work/$1.$2.out" 2>/dev/null; }

no_quorum="a reset needs more than half of them"
left_out="was left out of the job's membership"
not_admitted="not admitted by the job at"

# judge T WHO ROLE: one worker's end, as its role allows; prints what is
# wrong with it (nothing if all is well). ROLE: member (must finish), killed,
# stopped (finish, or left out, or, the job gone, no quorum; a newcomer also
# not admitted), newcomer (finish), late (a newcomer that may also not be
# admitted: the job failed, or rank 0, the door's holder, was stopped, so
# that the next rank 0 could not take the door over until it went), doomed
# (a survivor of a majority's loss: no quorum).
judge() {
  t=$1 who=$2 role=$3
  b="$work/$t.$who"
  rc=$(cat "$b.rc" 2>/dev/null || echo none)
  why=$(failure "$t" "$who")
  if grep -qE "ERROR: (Address|Leak)Sanitizer|WARNING: ThreadSanitizer|runtime error:" "$b.err"; then
    echo " $who: sanitizer report: $(grep -m 1 -hoE "(ERROR: (Address|Leak)Sanitizer|WARNING: ThreadSanitizer|runtime error:).*" "$b.err" | cut -c1-120);"
  fi
  if [ "$role" = killed ]; then
    # killed by the schedule: 137; or it had ended before (then as a member)
    [ "$rc" = 137 ] && return
    role=member
  fi
  case $rc in
    0) finished "$t" "$who" && [ "$role" != doomed ] && return
       echo " $who: exit status 0 but $(finished "$t" "$who" && echo "finished: it should have failed" || echo "no final line");"
       return ;;
    1) ;;
    124|137) echo " $who: hung (killed by timeout after $bound s, exit status $rc);"; return ;;
    *) echo " $who: crashed or exited unexplained (exit status $rc)${why:+ after its error \"$(echo "$why" | cut -c1-100)...\"}: $(tail -n 1 "$b.err" | cut -c1-100);"
       return ;;
  esac
  case $role in
    member) echo " $who: failed, though the job kept a quorum: ${why:-no FAIL line};" ;;
    stopped) echo "$why" | grep -qE "$left_out|$no_quorum|$not_admitted" &&
      { [ "$who" -ge 100 ] || ! echo "$why" | grep -qE "$not_admitted"; } ||
      echo " $who: stopped, then failed unexplained: ${why:-no FAIL line};" ;;
    newcomer) echo " $who: a newcomer, not let in though the job went on: ${why:-no FAIL line};" ;;
    late) echo "$why" | grep -qE "$not_admitted" ||
      echo " $who: a newcomer, failed unexplained: ${why:-no FAIL line};" ;;
    doomed) echo "$why" | grep -qE "$no_quorum" ||
      echo " $who: should have failed for want of a quorum: ${why:-no FAIL line};" ;;
  esac
}

show() { # T: the ends of every worker's output, indented (one PASS/FAIL line per trial)
  for o in "$work/$1".*.out; do
    who=${o%.out}
    who=${who##*.}
    echo "    --- $who (exit status $(cat "$work/$1.$who.rc" 2>/dev/null))"
    tail -n 3 "$o" | sed 's/^/    /'
    grep -v '^id [0-9]*: ready' "$work/$1.$who.err" | tail -n 6 | sed 's/^/    /'
  done
  sed 's/^/    event: /' "$work/$1.events" 2>/dev/null
}

# final_view T WHO...: the final lines the finishers among WHO printed, once each
final_view() {
  t=$1
  shift
  for who in "$@"; do grep -h '^final epoch ' "$work/$t.$who.out" 2>/dev/null; done | sort -u
}

# agree T WHO...: the finishers among WHO all printed one final line, with
# the expected step and checksum, and the final membership holds them all
# and otherwise only killed workers. Prints what is wrong.
agree() {
  view=$(final_view "$@")
  t=$1
  shift
  [ -z "$view" ] && return
  if [ "$(echo "$view" | wc -l)" != 1 ]; then
    echo " different final states: $(echo "$view" | tr '\n' ';');"
    return
  fi
  echo "$view" | grep -q " step $steps checksum $expect\$" ||
    echo " the final state is not the expected one (step $steps checksum $expect): $view;"
  members=$(echo "$view" | sed 's/^final epoch [0-9]* members \(.*\) step .*/\1/')
  for who in "$@"; do
    finished "$t" "$who" || continue
    echo " $members " | grep -q " $who " || echo " $who finished but is not among the members;"
  done
  for m in $members; do
    finished "$t" "$m" && continue
    grep -q "^kill $m " "$work/$t.events" 2>/dev/null ||
      echo " member $m of the final membership did not finish and was not killed;"
  done
}

# trial SEED: one schedule, run and judged: one PASS/FAIL line
trial() {
  seed=$1 t=s$1
  schedule "$seed" "$peer" "$((steps * step_ms / 1000))" >"$work/$t.plan"
  n=$(sed -n 's/^n //p' "$work/$t.plan")
  kind=$(sed -n 's/^kind //p' "$work/$t.plan")
  port=$(free_port)
  rdv="127.0.0.1:$port"
  started=$(now) t0=$(now)
  r=0
  while [ $r -lt "$n" ]; do
    start $t $r HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS=$rdv HORA_SIZE="$n" HORA_RANK=$r HORA_ELASTIC=1 \
      HORA_TEST_STEP_MS=$step_ms
    r=$((r + 1))
  done
  all=$(seq 0 $((n - 1)) | tr '\n' ' ')
  # shellcheck disable=SC2086
  if ! ready $t $all; then
    for r in $all; do hit $t $r KILL; done
    wait
    echo "FAIL elastic-chaos/seed-$seed: the $n workers did not start within 20 s"
    show $t
    return
  fi
  t0=$(now)
  conts=""
  grep -E '^[0-9.]+ ' "$work/$t.plan" >"$work/$t.todo"
  while read -r at what a1 rest; do
    # a stopped worker's SIGCONT due before this event
    for c in $conts; do
      c_at=${c%%@*}
      awk -v a="$c_at" -v b="$at" 'BEGIN { exit !(a <= b) }' || continue
      sleep_until "$c_at"
      hit $t "${c#*@}" CONT
      conts=$(echo "$conts" | tr ' ' '\n' | grep -vx "$c" | tr '\n' ' ')
    done
    sleep_until "$at"
    case $what in
      kill)
        if [ -n "$rest" ]; then # at once: one kill(1) for them all
          pids="" names="$a1 $rest"
          for w in $names; do
            [ -e "$work/$t.$w.rc" ] || pids="$pids $(cat "$work/$t.$w.pid")"
          done
          # shellcheck disable=SC2086
          kill -9 $pids 2>/dev/null
          m_at=$(now)
          for w in $names; do echo "kill $w $(since "$m_at")" >>"$work/$t.events"; done
          echo "majority $m_at" >>"$work/$t.events"
        else
          hit $t "$a1" KILL
        fi ;;
      stop)
        hit $t "$a1" STOP
        conts="$conts $(awk -v a="$at" -v d="$rest" 'BEGIN { printf "%.2f", a + d }')@$a1" ;;
      new)
        start $t "$a1" HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS=$rdv HORA_ELASTIC=1 HORA_TEST_ID="$a1" \
          HORA_TEST_STEP_MS=$step_ms
        all="$all $a1"
        echo "new $a1 $(since)" >>"$work/$t.events" ;;
    esac
  done <"$work/$t.todo"
  for c in $conts; do
    sleep_until "${c%%@*}"
    hit $t "${c#*@}" CONT
  done
  wait
  took=$(awk -v a="$started" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')

  # The verdict.
  bad=""
  killed=$(sed -n 's/^kill \([0-9]*\) .*/\1/p' "$work/$t.events" | tr '\n' ' ')
  # Whether the worker stopped was rank 0 then: every lower id killed before.
  door_stopped=no
  awk '$1 == "kill" { k[$2] = $3 } $1 == "stop" { s = $2; at = $3 }
    END { if (s == "" || s >= 100) exit 1
          for (i = 0; i < s; i++) if (!(i in k) || k[i] + 0 > at + 0) exit 1 }' \
    "$work/$t.events" && door_stopped=yes
  for who in $all; do
    if echo " $killed " | grep -q " $who "; then
      role=killed
    elif grep -q "^stop $who " "$work/$t.events"; then
      role=stopped
    elif [ "$who" -ge 100 ] && { [ "$kind" = majority ] || [ $door_stopped = yes ]; }; then
      role=late
    elif [ "$who" -ge 100 ]; then
      role=newcomer
    elif [ "$kind" = majority ]; then
      role=doomed
    else
      role=member
    fi
    bad="$bad$(judge $t "$who" $role | tr -d "\n")"
  done
  # shellcheck disable=SC2086
  bad="$bad$(agree $t $all | tr -d "\n")"
  # shellcheck disable=SC2086
  view=$(final_view $t $all)
  [ -n "$killed" ] || bad="$bad the schedule killed nobody (every kill came too late);"
  if [ "$kind" = quorum ]; then
    epoch=$(echo "$view" | sed -n 's/^final epoch \([0-9]*\) .*/\1/p' | head -n 1)
    [ -n "$view" ] || bad="$bad nobody finished;"
    [ "${epoch:-0}" -ge 2 ] || bad="$bad the job never went through a reset (epoch ${epoch:-?});"
  else
    # Nobody went on without a quorum; every survivor failed, within
    # fail_bound of the majority's loss.
    [ -z "$view" ] || bad="$bad went on after a majority was lost: $view;"
    m_at=$(sed -n 's/^majority //p' "$work/$t.events")
    slowest=0
    for who in $all; do
      echo " $killed " | grep -q " $who " && continue
      [ "$who" -ge 100 ] && continue
      d=$(awk -v a="$m_at" -v b="$(cat "$work/$t.$who.end")" 'BEGIN { printf "%.2f", b - a }')
      awk -v d="$d" -v s="$slowest" 'BEGIN { exit !(d > s) }' && slowest=$d
      awk -v d="$d" -v m="$fail_bound" 'BEGIN { exit !(d > m) }' &&
        bad="$bad $who: failed $d s after the majority was killed (more than $fail_bound s);"
    done
  fi

  # What happened, in words.
  what=$(awk '
    $1 == "kill" { k = k sep1 $2 "@" $3; sep1 = " " }
    $1 == "stop" { s = s sep2 $2 "@" $3; sep2 = " " }
    $1 == "cont" { c = c sep3 $2 "@" $3; sep3 = " " }
    $1 == "new" { nw = nw sep4 $2 "@" $3; sep4 = " " }
    END {
      printf "killed %s", k == "" ? "none" : k
      if (s != "") printf "; stopped %s, let go %s", s, c
      if (nw != "") printf "; newcomers %s", nw
    }' "$work/$t.events")
  ends=""
  for who in $all; do
    echo " $killed " | grep -q " $who " && continue
    finished $t "$who" && continue
    ends="$ends $who: $(failure $t "$who" | sed "s/^FAIL id [0-9?]* step [0-9]*: [^(]* (//; s/)$//" |
      sed 's/^elastic: \(only [0-9]* of the [0-9]* ranks of membership [0-9]* are left\).*/\1/' | cut -c1-120);"
  done
  if [ -z "$bad" ]; then
    if [ "$kind" = quorum ]; then
      echo "PASS elastic-chaos/seed-$seed: $n workers, $what (s after start): ended in $(echo "$view" | sed 's/ step.*//; s/^final //'), $(echo "$view" | sed 's/.* step /step /') as expected;${ends:+ failed as allowed:$ends} $took s"
    else
      echo "PASS elastic-chaos/seed-$seed: majority: $n workers, $what: every survivor failed within $slowest s:$ends $took s"
    fi
  else
    echo "FAIL elastic-chaos/seed-$seed ($kind, $n workers; rerun: CHAOS_SEED=$seed sh $0 $builddir): $what:$bad"
    show $t
  fi
}

# ---- the fake hosts ------------------------------------------------------------------
netns_variant() {
  netns=
  for d in "${HORA_SHARED_DIR:-}" "$srcdir/../shared" /work/shared; do
    if [ -n "$d" ] && [ -x "$d/netns/netns-cluster.sh" ]; then
      netns="$d/netns"
      break
    fi
  done
  if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP elastic-chaos/netns-cut: not root (network namespaces need it)"
    return
  elif [ -z "$netns" ] || ! command -v ip >/dev/null 2>&1 || ! command -v unshare >/dev/null 2>&1; then
    echo "SKIP elastic-chaos/netns-cut: no ../shared/netns (set HORA_SHARED_DIR), ip or unshare"
    return
  fi
  # A name of our own, so a cluster someone else left up does not collide.
  export NETNS_PREFIX="hc$$x"
  netns_up=1
  if ! "$netns/netns-cluster.sh" up 3 >"$work/up.log" 2>&1; then
    echo "SKIP elastic-chaos/netns-cut: network namespaces unavailable here: $(tail -n 1 "$work/up.log")"
    "$netns/netns-cluster.sh" down >/dev/null 2>&1
    netns_up=
    return
  fi
  # Host 2's link down from 1 s for `cut` seconds: hosts 0 and 1 (4 of 6)
  # hear nothing from it (PEER_TIMEOUT), find it silent (PROBE) and go on
  # with 4; host 2's two find no one (PEER_TIMEOUT, PROBE) and, with no
  # quorum, wait ELASTIC_TIMEOUT for the silent ones before failing: the
  # first to coordinate, then the other, told to ask the next, waits again
  # (2 x ELASTIC_TIMEOUT). Then the link is up again and a newcomer on host
  # 2 must be let in.
  t=net
  el=$((4 * f))
  cut=$((peer + 2 + 2 * el + 4 * f))
  steps=$(((cut + 6) * 1000 / step_ms))
  expect=$("$worker" --expect $steps)
  rdv="10.77.0.1:$(free_port)"
  started=$(now) t0=$(now)
  for r in 0 1 2 3 4 5; do
    NS=$NETNS_PREFIX$((r / 2)) start $t $r HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS=$rdv HORA_SIZE=6 \
      HORA_RANK=$r HORA_ELASTIC=1 HORA_TEST_STEP_MS=$step_ms HORA_ELASTIC_TIMEOUT_SECONDS=$el
  done
  bad=""
  if ! ready $t 0 1 2 3 4 5; then
    bad=" the 6 workers did not start within 20 s;"
    for r in 0 1 2 3 4 5; do hit $t $r KILL; done
  else
    t0=$(now)
    sleep_until 1
    ip -n "${NETNS_PREFIX}2" link set eth0 down && echo "cut 2 $(since)" >>"$work/$t.events"
    sleep_until $((1 + cut))
    # Both of host 2's workers must have failed by now.
    ip -n "${NETNS_PREFIX}2" link set eth0 up && echo "restored 2 $(since)" >>"$work/$t.events"
    for r in 4 5; do
      [ -e "$work/$t.$r.rc" ] || bad="$bad $r: still running when the link came back ($cut s after the cut);"
    done
    sleep 0.5
    NS=${NETNS_PREFIX}2 start $t 100 HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS=$rdv HORA_ELASTIC=1 \
      HORA_TEST_ID=100 HORA_TEST_STEP_MS=$step_ms HORA_ELASTIC_TIMEOUT_SECONDS=$el
    echo "new 100 $(since)" >>"$work/$t.events"
  fi
  wait
  took=$(awk -v a="$started" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  "$netns/netns-cluster.sh" down >/dev/null 2>&1
  netns_up=
  for r in 0 1 2 3; do
    bad="$bad$(judge $t $r member | tr -d "\n")"
  done
  for r in 4 5; do
    bad="$bad$(judge $t $r doomed | tr -d "\n")"
    finished $t $r && continue
    cut_at=$(sed -n 's/^cut 2 //p' "$work/$t.events")
    d=$(awk -v a="$t0" -v c="${cut_at:-0}" -v b="$(cat "$work/$t.$r.end" 2>/dev/null || echo 0)" \
      'BEGIN { printf "%.1f", b - a - c }')
    awk -v d="$d" -v m="$cut" 'BEGIN { exit !(d > m) }' &&
      bad="$bad $r: failed $d s after the cut (more than $cut s);"
    failed_in="$failed_in $r: $d s"
  done
  # Let in after the restore: 100 must finish (as a member).
  bad="$bad$(judge $t 100 member | tr -d "\n")"
  bad="$bad$(agree $t 0 1 2 3 4 5 100 | tr -d "\n")"
  view=$(final_view $t 0 1 2 3 4 5 100)
  echo "$view" | grep -q "members 0 1 2 3 100 step" || bad="$bad the final membership is not 0 1 2 3 100: $view;"
  if [ -z "$bad" ]; then
    echo "PASS elastic-chaos/netns-cut: 3 fake hosts x 2, host 2's link down ${cut} s: hosts 0-1 went on; host 2's workers failed after the cut in$failed_in: $(failure $t 4 | grep -o 'only [0-9]* of the [0-9]* ranks[^:]*'); restored, a newcomer on host 2 let in: $(echo "$view" | sed 's/^final //'); $took s"
  else
    echo "FAIL elastic-chaos/netns-cut:$bad"
    show $t
  fi
}

began=$(date +%s)
if [ "${CHAOS_NETNS:-1}" != only ]; then
  if [ -n "${CHAOS_SEED:-}" ]; then
    seeds=$CHAOS_SEED
  else
    base=${CHAOS_SEED_BASE:-$(($(date +%s) % 100000 * 4))}
    seeds=$(seq "$base" $((base + ${CHAOS_TRIALS:-5} - 1)))
  fi
  echo "   (elastic-chaos: seeds $(echo $seeds | tr '\n' ' '); CHAOS_SEED=N reruns one)"
  for s in $seeds; do
    trial "$s"
  done
fi
if [ -z "${CHAOS_SEED:-}" ] && [ "${CHAOS_NETNS:-1}" != 0 ]; then
  failed_in=""
  netns_variant
fi
echo "   (elastic-chaos: $(($(date +%s) - began)) s)"
