#!/bin/bash
# What the star-shaped control plane costs as the job grows (issue 36):
# every rank holds a control connection to rank 0 from start-up on, and
# rank 0 takes every uncached request and answers every rank; cached
# requests go the ranks' recursive-doubling cycle instead.
#
# np processes of hora-bench-startup --control OPS are started here without
# mpirun (HORA_BOOTSTRAP=tcp, HORA_RENDEZVOUS, HORA_RANK, HORA_SIZE,
# HORA_SECRET_FILE; rank 0 listens), as scripts/bench-startup.sh does, in
# three configurations per repetition (order alternating):
#   default   as shipped; gives the first table
#   smallshm  HORA_SHM_BUFFER_SIZE=64K (--small-shm): the shared-memory
#             transport maps a host segment of 2 x SHM_BUFFER_SIZE per
#             local rank into every rank (MAP_POPULATE), which at 128 ranks
#             on one host is 2 GiB in each, and dominates the start-up;
#             with 64K what remains is the bootstrap's
#   nocache   HORA_CACHE_CAPACITY=0: every request goes to rank 0
# Per launch:
#   start-up   the launcher's fork of rank 0 -> every rank has finished
#              hora_init and its first allreduce (also: the last rank's
#              start -> that moment, without the fork loop's own skew)
#   fds, RSS   /proc/self of rank 0 and the largest of the other ranks',
#              after the first allreduce and OPS x 2 more: descriptors,
#              VmRSS, VmHWM, RssAnon (the process's own heap) and RssShmem
#              (the host's shared-memory segment)
#   latency    per 4-byte allreduce, median over OPS on rank 0: a name
#              never seen (slow path: a full request to rank 0, which
#              answers every rank, and a cycle), the same name each time
#              (cached: a cycle only), and the host's floor for the two
#              shapes without hora: every rank -> rank 0 -> every rank
#              (star) and a dissemination barrier (tree) over loopback UDP
# Medians over the repetitions; then fits of each figure against np,
# a + b*np and a + b*log2(np), with their residuals, and values predicted
# at 1,024 and 16,384 ranks.
# HORA_PEER_TIMEOUT_SECONDS is set to --patience (600 s; 0 keeps the
# default, 30 s) and HORA_CONNECT_TIMEOUT_SECONDS to 180 s (default 60): at
# np 128 on two busy cores rank 0 can go unheard for longer than 30 s, and
# the launch then fails instead of measuring. (Another failure seen there
# is not a timeout: a rank whose hello to the rendezvous takes over 1 s is
# dropped and exits; the others then wait out the connect timeout.)
# usage: scripts/bench-control-plane.sh [--nps "16 32 64 128"] [--reps 3]
#          [--ops 50] [--small-shm 64K] [--patience 600] [--build DIR]
#          [--raw FILE] [--timeout 900]
set -u
export LC_ALL=C
srcdir=$(cd "$(dirname "$0")/.." && pwd)
build=$srcdir reps=3 nps='16 32 64 128' ops=50 small_shm=64K raw='' tmo=900 patience=600
while [ $# -gt 0 ]; do
  case $1 in
    --reps) reps=$2; shift ;;
    --nps) nps=$2; shift ;;
    --ops) ops=$2; shift ;;
    --small-shm) small_shm=$2; shift ;;
    --patience) patience=$2; shift ;;
    --build) build=$(cd "$2" && pwd) || exit 2; shift ;;
    --raw) raw=$2; shift ;;
    --timeout) tmo=$2; shift ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "$0: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
  shift
done
prog=$build/hora-bench-startup
python=${PYTHON:-/usr/bin/python3}
[ -x "$prog" ] || { echo "$0: $prog not built (make, or --build DIR)" >&2; exit 2; }
"$prog" --control x >/dev/null 2>&1
[ $? -eq 2 ] || { echo "$0: $prog has no --control (rebuild it)" >&2; exit 2; }
maxnp=0
for n in $nps; do [ "$n" -gt "$maxnp" ] && maxnp=$n; done
# Each rank: itself and its timeout; rank 0 also a descriptor per rank.
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt $((maxnp + 64)) ]; then
  echo "$0: ulimit -n is $(ulimit -n): rank 0 needs about np + 16 descriptors" >&2
  exit 2
fi

unset HORA_BOOTSTRAP HORA_RENDEZVOUS HORA_RANK HORA_SIZE HORA_SECRET HORA_SECRET_FILE \
  HORA_SHM_BUFFER_SIZE HORA_CACHE_CAPACITY HORA_TRANSPORT HORA_CYCLE_TIME \
  HORA_CONNECT_TIMEOUT_SECONDS HORA_PEER_TIMEOUT_SECONDS
if [ "$patience" != 0 ]; then
  export HORA_CONNECT_TIMEOUT_SECONDS=180 HORA_PEER_TIMEOUT_SECONDS=$patience
fi
load0=$(cut -d' ' -f1-3 /proc/loadavg)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
trap 'exit 1' INT TERM
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/secret")

free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

cfg_env() { # configuration -> its extra variables
  case $1 in
    default) ;;
    smallshm) echo "HORA_SHM_BUFFER_SIZE=$small_shm" ;;
    nocache) echo HORA_CACHE_CAPACITY=0 ;;
  esac
}

# One launch of np ranks; leaves rank r's output in $work/out$r, sets t0.
launch() { # configuration np
  local n=$2 r port pids=() extra
  extra=$(cfg_env "$1")
  rm -f "$work"/out* "$work"/err*
  port=$(free_port)
  t0=$EPOCHREALTIME
  for ((r = 0; r < n; r++)); do
    timeout -k 5 "$tmo" env HORA_BOOTSTRAP=tcp "HORA_RENDEZVOUS=127.0.0.1:$port" \
      "HORA_RANK=$r" "HORA_SIZE=$n" "HORA_SECRET_FILE=$work/secret" $extra \
      "$prog" --control "$ops" </dev/null >"$work/out$r" 2>"$work/err$r" &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r"; done
  t1=$EPOCHREALTIME
}

# Appends to $work/raw: cfg np rep launch_s lastrank_s procmax_s, then for
# rank 0 and the largest of the others: fds vmrss hwm anon shmem (KiB),
# then new cached star tree (us, rank 0's medians), the launch's wall and
# new - cached.
measure() { # configuration np rep
  local c=$1 n=$2 rep=$3 su ct
  launch "$c" "$n"
  su=$(grep -h "^startup np=$n " "$work/out0")
  ct=$(grep -h "^control np=$n " "$work/out0")
  if [ -z "$su" ] || [ -z "$ct" ] ||
    [ "$(cat "$work"/out[0-9]* | grep -c '^resources .* at=ops ')" -ne "$n" ]; then
    echo "# $c np=$n rep $rep: no valid result; last errors:" >&2
    cat "$work"/err[0-9]* | sort | uniq -c | sort -rn | head -n 4 | sed 's/^/#   /' >&2
    return
  fi
  {
    echo "$su"
    echo "$ct"
    cat "$work"/out[0-9]* | grep '^resources .* at=ops '
  } | awk -v c="$c" -v n="$n" -v rep="$rep" -v t0="$t0" -v t1="$t1" '
    { delete v; for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } }
    $1 == "startup" { ar = v["first_allreduce_max"]; done = v["done_realtime_max"]
                      last = v["start_realtime_max"] }
    $1 == "control" { lat = sprintf("%s %s %s %s", v["new_us"], v["cached_us"], v["star_us"], v["tree_us"])
                      extra = v["new_us"] - v["cached_us"] }
    $1 == "resources" {
      r = v["rank"] + 0
      if (r == 0) { split(v["fds"] " " v["vmrss_kib"] " " v["vmhwm_kib"] " " v["rssanon_kib"] " " v["rssshmem_kib"], z, " ") }
      else {
        if (v["fds"] > o1) o1 = v["fds"] + 0; if (v["vmrss_kib"] > o2) o2 = v["vmrss_kib"] + 0
        if (v["vmhwm_kib"] > o3) o3 = v["vmhwm_kib"] + 0; if (v["rssanon_kib"] > o4) o4 = v["rssanon_kib"] + 0
        if (v["rssshmem_kib"] > o5) o5 = v["rssshmem_kib"] + 0
      }
    }
    END { printf "%s %d %d %.6f %.6f %.6f %d %d %d %d %d %d %d %d %d %d %s %.3f %.1f\n", c, n, rep,
            done - t0, done - last, ar, z[1], z[2], z[3], z[4], z[5], o1, o2, o3, o4, o5, lat, t1 - t0,
            extra }' \
    >>"$work/raw"
}

cfgs="default nocache"
[ -n "$small_shm" ] && [ "$small_shm" != 0 ] && cfgs="default smallshm nocache"
echo "# bench-control-plane: one host, $(nproc) cores, np: $nps, $reps repetitions of: $cfgs; $ops operations of each kind per launch" >&2
launch default "${nps%% *}" # warm-up, not counted
for n in $nps; do
  s0=$EPOCHREALTIME
  for ((rep = 1; rep <= reps; rep++)); do
    order=$cfgs
    [ $((rep % 2)) -eq 0 ] && order=$(printf '%s\n' $cfgs | tac | tr '\n' ' ')
    for c in $order; do measure "$c" "$n" "$rep"; done
  done
  awk -v n="$n" -v s0="$s0" -v s1="$EPOCHREALTIME" 'BEGIN { printf "# np=%s done in %.0f s\n", n, s1 - s0 }' >&2
done
touch "$work/raw"
[ -n "$raw" ] && cp "$work/raw" "$raw"

# Column numbers of $work/raw.
C_LAUNCH=4 C_LAST=5 C_PROC=6 C_FD0=7 C_RSS0=8 C_HWM0=9 C_ANON0=10 C_SHM0=11
C_FDN=12 C_RSSN=13 C_HWMN=14 C_ANONN=15 C_SHMN=16 C_NEW=17 C_CACHED=18 C_STAR=19 C_TREE=20
C_EXTRA=22

median() { # configuration np column [scale]
  awk -v c="$1" -v n="$2" -v k="$3" -v s="${4:-1}" '$1 == c && $2 == n { print $k / s }' "$work/raw" |
    sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# "np value" lines of a figure's medians.
series() { # configuration column [scale]
  local n
  for n in $nps; do echo "$n $(median "$1" "$n" "$2" "${3:-1}")"; done | awk '$2 != "-"'
}

# Least squares of y on x = np (lin) or log2(np) (log), from "np y" lines:
# prints "model a b rms r1 r2 ... p1024 p16384" for both models.
fit() {
  awk '{ n[NR] = $1; y[NR] = $2 }
    END {
      for (m = 0; m < 2; m++) {
        sx = sy = sxx = sxy = 0
        for (i = 1; i <= NR; i++) {
          x[i] = m ? log(n[i]) / log(2) : n[i]
          sx += x[i]; sy += y[i]; sxx += x[i] * x[i]; sxy += x[i] * y[i]
        }
        d = NR * sxx - sx * sx
        b = d ? (NR * sxy - sx * sy) / d : 0; a = (sy - b * sx) / NR
        ss = 0; res = ""
        for (i = 1; i <= NR; i++) { r = y[i] - (a + b * x[i]); ss += r * r; res = res sprintf(" %.4g", r) }
        printf "%s %.6g %.6g %.4g%s | %.6g %.6g\n", m ? "log" : "lin", a, b, sqrt(ss / NR), res,
          a + b * (m ? 10 : 1024), a + b * (m ? 14 : 16384)
      }
    }'
}

# The fit that is asked for (lin, log, or best: the smaller rms residual).
pick() { # model, the fits on stdin
  if [ "$1" = best ]; then
    sort -k4,4g | head -n 1
  else
    awk -v m="$1" '$1 == m'
  fi
}

declare -A PRED
# Fits one figure, prints its fits, remembers the chosen fit's predictions.
report_fit() { # key title configuration column scale model
  local key=$1 title=$2 f chosen
  f=$(series "$3" "$4" "$5" | fit)
  chosen=$(echo "$f" | pick "$6")
  printf '# %s (%s):\n' "$title" "$3"
  echo "$f" | awk -v ch="$(echo "$chosen" | cut -d' ' -f1)" -v NPS="${nps// /,}" '{
      split($0, h, "|"); nf = split(h[1], w, " ")
      printf "#   %s  a=%-10.4g b=%-10.4g rms=%-8.3g residuals at np %s:", ($1 == "lin" ? "a+b*np      " : "a+b*log2(np)"), w[2], w[3], w[4], NPS
      for (i = 5; i <= nf; i++) printf " %s", w[i]
      split(h[2], p, " ")
      printf "  -> 1024: %.4g, 16384: %.4g%s\n", p[1], p[2], ($1 == ch ? "  [used]" : "")
    }'
  PRED[$key.1024]=$(echo "$chosen" | awk -F'|' '{ split($2, p, " "); print p[1] }')
  PRED[$key.16384]=$(echo "$chosen" | awk -F'|' '{ split($2, p, " "); print p[2] }')
}

f1() { awk -v x="$1" 'BEGIN { if (x == "-" || x == "") print "-"; else printf "%.1f", x }'; }
f2() { awk -v x="$1" 'BEGIN { if (x == "-" || x == "") print "-"; else printf "%.2f", x }'; }
f0() { awk -v x="$1" 'BEGIN { if (x == "-" || x == "") print "-"; else printf "%.0f", x }'; }

echo "# hora control plane, one host ($(nproc) cores shared with other work: noisy), medians of $reps launches; $(date '+%b %-d %H:%M'); commit $(git -C "$srcdir" rev-parse --short HEAD 2>/dev/null || echo '?'); ulimit -n $(ulimit -n)"
echo "# load average (1, 5, 15 min) at the start: $load0, at the end: $(cut -d' ' -f1-3 /proc/loadavg); connect and peer timeouts: $([ "$patience" != 0 ] && echo "180 and $patience s" || echo defaults)"
echo "# start-up: launcher's fork of rank 0 -> every rank done with hora_init and its first allreduce; rank>0: the largest over ranks 1..np-1;"
echo "# RSS: VmRSS (HWM: VmHWM) in MiB, after the first allreduce and $((2 * ops)) more; slow: a 4-byte allreduce under a new name, cached: under a repeated one (us, median of $ops)"
printf '%6s %10s %7s %9s %9s %7s %9s %9s %9s\n' np start-up_s r0_fds r0_RSS r0_HWM rN_fds rN_RSS slow_us cached_us
for n in $nps; do
  d=default
  printf '%6s %10s %7s %9s %9s %7s %9s %9s %9s\n' "$n" "$(f2 "$(median $d "$n" $C_LAUNCH)")" \
    "$(f0 "$(median $d "$n" $C_FD0)")" "$(f1 "$(median $d "$n" $C_RSS0 1024)")" \
    "$(f1 "$(median $d "$n" $C_HWM0 1024)")" "$(f0 "$(median $d "$n" $C_FDN)")" \
    "$(f1 "$(median $d "$n" $C_RSSN 1024)")" "$(f0 "$(median $d "$n" $C_NEW)")" \
    "$(f0 "$(median $d "$n" $C_CACHED)")"
done
fits=$(
  report_fit su "start-up s, a+b*np" default $C_LAUNCH 1 lin
  report_fit fd0 "rank 0 descriptors, a+b*np" default $C_FD0 1 lin
  report_fit rss0 "rank 0 VmRSS MiB, a+b*np (mostly the host's shared-memory segment)" default $C_RSS0 1024 lin
  report_fit hwm0 "rank 0 VmHWM MiB, a+b*np" default $C_HWM0 1024 lin
  report_fit fdn "rank>0 descriptors, the better fit" default $C_FDN 1 best
  report_fit rssn "rank>0 VmRSS MiB, a+b*np" default $C_RSSN 1024 lin
  report_fit new "slow-path us, the better fit" default $C_NEW 1 best
  report_fit cached "cached us, the better fit" default $C_CACHED 1 best
  report_fit extra "slow minus cached us (per launch), the better fit" default $C_EXTRA 1 best
  report_fit anon0 "rank 0 RssAnon MiB (its own heap), a+b*np" default $C_ANON0 1024 lin
  report_fit anonn "rank>0 RssAnon MiB, the better fit" default $C_ANONN 1024 best
  [[ $cfgs == *smallshm* ]] && report_fit sus "start-up s with HORA_SHM_BUFFER_SIZE=$small_shm, a+b*np" smallshm $C_LAUNCH 1 lin
  report_fit nocache "every request to rank 0 (HORA_CACHE_CAPACITY=0), us, the better fit" nocache $C_CACHED 1 best
  report_fit star "floor, star over UDP, us, the better fit" default $C_STAR 1 best
  report_fit tree "floor, tree over UDP, us, the better fit" default $C_TREE 1 best
  declare -p PRED >"$work/pred"
)
. "$work/pred"
for n in 1024 16384; do
  printf '%6s %10s %7s %9s %9s %7s %9s %9s %9s   (extrapolated)\n' "$n" "$(f2 "${PRED[su.$n]}")" \
    "$(f0 "${PRED[fd0.$n]}")" "$(f1 "${PRED[rss0.$n]}")" "$(f1 "${PRED[hwm0.$n]}")" \
    "$(f0 "${PRED[fdn.$n]}")" "$(f1 "${PRED[rssn.$n]}")" "$(f0 "${PRED[new.$n]}")" \
    "$(f0 "${PRED[cached.$n]}")"
done

echo
echo "# details: start-up with HORA_SHM_BUFFER_SIZE=$small_shm (smallshm) and from the last rank's start (no fork-loop skew);"
echo "# RssAnon (own heap) MiB of rank 0 and the others; RssShmem MiB (the host segment, mapped whole by every rank);"
echo "# slow minus cached (median of the launches' differences), every request to rank 0 (HORA_CACHE_CAPACITY=0, the repeated name),
# and the host's floor without hora (UDP): star and tree, us"
printf '%6s %9s %9s %9s %8s %8s %8s %9s %9s %8s %8s\n' np su_small last_s small_last r0_anon rN_anon shmem slow-cach nocache_us star_us tree_us
for n in $nps; do
  d=default
  printf '%6s %9s %9s %9s %8s %8s %8s %9s %9s %8s %8s\n' "$n" "$(f2 "$(median smallshm "$n" $C_LAUNCH)")" \
    "$(f2 "$(median $d "$n" $C_LAST)")" "$(f2 "$(median smallshm "$n" $C_LAST)")" \
    "$(f2 "$(median $d "$n" $C_ANON0 1024)")" "$(f2 "$(median $d "$n" $C_ANONN 1024)")" \
    "$(f0 "$(median $d "$n" $C_SHM0 1024)")" \
    "$(f0 "$(median $d "$n" $C_EXTRA)")" \
    "$(f0 "$(median nocache "$n" $C_CACHED)")" "$(f0 "$(median $d "$n" $C_STAR)")" \
    "$(f0 "$(median $d "$n" $C_TREE)")"
done
for n in 1024 16384; do
  printf '%6s %9s %9s %9s %8s %8s %8s %9s %9s %8s %8s   (extrapolated)\n' "$n" "$(f2 "${PRED[sus.$n]:-}")" \
    - - "$(f2 "${PRED[anon0.$n]}")" "$(f2 "${PRED[anonn.$n]}")" - "$(f0 "${PRED[extra.$n]}")" \
    "$(f0 "${PRED[nocache.$n]}")" \
    "$(f0 "${PRED[star.$n]}")" "$(f0 "${PRED[tree.$n]}")"
done

echo
echo "# fits (medians against np; rms and residuals in the figure's unit; [used]: the one in the extrapolated rows)"
echo "$fits"
for c in $cfgs; do
  for n in $nps; do
    k=$(awk -v c="$c" -v n="$n" '$1 == c && $2 == n' "$work/raw" | wc -l)
    [ "$k" -lt "$reps" ] && echo "# $c np=$n: $k of $reps launches gave a result (reasons above)"
  done
done
cat <<EOF

# Caveats. All np ranks run on $(nproc) cores: beyond a few ranks every figure
# that waits on other ranks is CPU-bound, not network- or rank-0-bound. A
# 4-byte allreduce needs every rank to be woken and scheduled at least once
# (the cycle: log2(np) times), so its time grows with np here because the
# cores are time-shared, which a job with a core per rank would not see.
# The floor columns show what the host alone costs for the same shapes
# without hora (one datagram per rank and round, every process asleep in
# recv); the latencies above it are hora's engine plus the data plane's
# shared-memory allreduce, both also time-shared. So the latency fits
# describe this machine's scheduler more than rank 0: read the slow-path
# cost as slow minus cached (the request to rank 0 and its answers) and
# compare its growth with the star floor's. Start-up by default is
# dominated by the shared-memory segment (2 x SHM_BUFFER_SIZE per local
# rank, mapped and populated whole by every rank: O(local ranks^2) page
# work), which is per host and does not grow with the job on many hosts;
# the smallshm column is closer to the bootstrap's own cost, and it
# includes forking np processes from one shell. VmRSS at 1,024 or 16,384
# ranks extrapolates that one-host segment and means nothing for a job of
# many hosts: rank 0's own memory is its RssAnon. Other work shares these
# cores, so repeat runs differ by tens of percent.
EOF
