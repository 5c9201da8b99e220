#!/bin/bash
# scale-bench.sh - hora's collectives end to end on fake hosts (network
# namespaces from ../shared/netns, links shaped to a line rate, TCP between
# hosts, shared memory within one), each forced algorithm and auto side by
# side with Open MPI's collective from the same run and with the floor:
# hora-bench-floor's exchange patterns over plain TCP, no runtime.
#
# usage: scripts/scale-bench.sh [options]        (as root)
#   --layouts "8x1 16x1 4x2"   HOSTSxRANKS_PER_HOST, one table set per layout
#   --ops "allreduce broadcast allgather reducescatter"
#   --sizes MIN:MAX:FACTOR     default 8:64M:8 (hora-bench's -b -e -f; MAX is
#                              run too where the progression misses it)
#   --reps N                   hora-bench -r and hora-bench-floor -r (default 5)
#   --env VAR=VALUE            a setting for every rank of every run (repeatable;
#                              e.g. HORA_EAGER_THRESHOLD=0 for the figures
#                              without eager operations)
#   --rounds K                 every run K times, the algorithms taking turns
#                              (default 1); the tables give the median run
#   --rate RATE                each fake host's egress, tc syntax (default 1gbit)
#   --algorithms "OP:A,B ..."  the forced algorithms per op (default: hora-info
#                              --algorithms where it exists, else ALGORITHMS below)
#   --csv FILE                 every measured figure, one per line
#   --logs DIR                 keep every raw output there
#   --tree DIR                 the built tree (default: this script's)
#   --timeout S                limit per mpirun (default 1800)
#   --spin-us N                HORA_SPIN_TIME_US for hora's ranks (default 0:
#                              each fake host sees this machine's cores as its
#                              own and would spin, while all hosts share them;
#                              on a real host hora spins only where its ranks
#                              have cores to spare, and here none do)
#   --tcp-cc NAME              TCP congestion control for every process, hora's
#                              (HORA_TCP_CONGESTION_CONTROL), Open MPI's and the
#                              floor's (scripts/tcp-congestion-preload.c, built
#                              here); default cubic, Linux's default; "system":
#                              the system's. Under BBR, the default of some
#                              machines, 64 and 128 KiB exchanges on these links
#                              wait for its tail-loss probes (docs/benchmarks.md)
#   --fit                      after the runs, fit the cost model's link constants
#                              to each layout's forced-algorithm times (hora-info
#                              --model --fit) and print HORA_COST_MODEL and every
#                              prediction's error (those over 25% marked)
#   --fit-only CSV             the same from a CSV of an earlier run, nothing run
#   --no-floor                 skip the floor's runs (e.g. auto alone again under
#                              other settings: --algorithms "allreduce:" ...)
#   --quick                    smoke run: layouts "4x1 2x2", sizes 8:256K:32, 3 reps
# e.g. scripts/scale-bench.sh --layouts 8x1 --csv /tmp/scale8.csv
#
# Reps: every (layout, op, algorithm) is ONE mpirun of hora-bench with
# -r REPS, whose figure per size is already the median of REPS timed
# repetitions (each the mean of many back-to-back operations); the script
# takes it as is. Starting mpirun over 16 fake hosts costs seconds, so
# repeating whole runs would cost more for no better median. Open MPI's
# figure comes from auto's run (same processes, same links); the forced
# runs pass --no-mpi and take less time. On a shared machine one run can be
# slower all through: --rounds K runs the forced algorithms, auto and the
# floor in turn K times and takes each figure's median over the rounds, so
# auto's gap to the best forced one is not one run's luck.
#
# Table columns: each forced algorithm's time and auto's (us), Open MPI's,
# auto/MPI (time ratio: < 1 is hora faster), auto against the best forced
# algorithm (%, + is slower), the algorithm auto ran (the selector's pick as
# hora-bench names it; "eager": inside the negotiation cycle), auto's busbw (GB/s; the nccl-tests factors:
# allreduce 2(p-1)/p, broadcast 1, allgather and reducescatter (p-1)/p) and
# its share of the line rate, the floor patterns' times and their best, and
# the cost model's prediction for auto where hora-bench prints a model_us
# column or line ("-" where it does not). hora-bench (hora's and Open
# MPI's loops) and the floor both time from a barrier to the last rank's
# finish.
# Needs root and iproute2; the namespaces get a prefix of their own
# (sb<pid>x) and are always removed at the end, also on failure.
set -uo pipefail

# Forced algorithms per collective (HORA_ALGORITHM_<OP>=name); auto is run
# besides. Those the runtime will have (issue 36):
#   allreduce:ring,rd,rabenseifner broadcast:ring,binomial
#   allgather:ring,bruck reducescatter:ring,allreduce
ALGORITHMS="allreduce:ring broadcast:ring allgather:ring reducescatter:ring"

layouts="8x1 16x1 4x2" ops="allreduce broadcast allgather reducescatter"
sizes=8:64M:8 reps=5 rounds=1 rate=1gbit csv= logs= tree= limit=1800 algos_opt= fit=0 fit_only= spin=0
tcp_cc=cubic floor=1
extra_x=()
while [ $# -gt 0 ]; do
  case $1 in
    --layouts) layouts=$2; shift ;;
    --ops) ops=$2; shift ;;
    --sizes) sizes=$2; shift ;;
    --reps) reps=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --env) extra_x+=(-x "$2"); shift ;;
    --rate) rate=$2; shift ;;
    --algorithms) algos_opt=$2; shift ;;
    --csv) csv=$2; shift ;;
    --fit) fit=1 ;;
    --fit-only) fit_only=$2; shift ;;
    --logs) logs=$2; shift ;;
    --tree) tree=$2; shift ;;
    --timeout) limit=$2; shift ;;
    --spin-us) spin=$2; shift ;;
    --tcp-cc) tcp_cc=$2; shift ;;
    --no-floor) floor=0 ;;
    --quick) layouts="4x1 2x2" sizes=8:256K:32 reps=3 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "scale-bench.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done

[ "$(id -u)" -eq 0 ] || { echo "scale-bench.sh: needs root (network namespaces)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
tree=$(cd "${tree:-$here/..}" && pwd)
for prog in hora-bench hora-bench-floor; do
  [ -x "$tree/$prog" ] || { echo "scale-bench.sh: no $tree/$prog (build the tree)" >&2; exit 2; }
done
netns=
for d in "${HORA_SHARED_DIR:-}" "$tree/../shared" "$here/../../shared"; do
  [ -n "$d" ] && [ -x "$d/netns/netns-cluster.sh" ] && { netns=$(cd "$d/netns" && pwd); break; }
done
[ -n "$netns" ] || { echo "scale-bench.sh: no shared/netns helpers (set HORA_SHARED_DIR)" >&2; exit 2; }

# Bytes from "64M" and the like, and back.
bytes_of() { awk -v s="$1" 'BEGIN { v = s + 0; u = toupper(substr(s, length(s)))
  if (u == "K") v *= 1024; else if (u == "M") v *= 1048576; else if (u == "G") v *= 1073741824
  printf "%.0f\n", v }'; }
IFS=: read -r smin smax sfac <<<"$sizes"
bmin=$(bytes_of "$smin") bmax=$(bytes_of "${smax:-64M}") sfac=${sfac:-8}
# Line rate in GB/s (tc units: SI; bit, kbit, mbit, gbit).
line=$(awk -v r="$rate" 'BEGIN { v = r + 0; s = tolower(r)
  if (s ~ /gbit$/) v *= 1e9; else if (s ~ /mbit$/) v *= 1e6; else if (s ~ /kbit$/) v *= 1e3
  printf "%.6f\n", v / 8 / 1e9 }')

# The forced algorithms of op: --algorithms, else hora-info --algorithms
# (a line "KIND:" then one indented line per algorithm), else ALGORITHMS.
# shm needs one host and hierarchical several ranks per host: layouts that
# cannot run them leave them out (algos_of's second argument: ranks per host).
info_algos=
if [ -z "$algos_opt" ] && info_out=$("$tree/hora-info" --algorithms 2>/dev/null); then
  info_algos=$(printf '%s\n' "$info_out" | awk '
    /^[a-z]+:$/ { k = $1; sub(/:$/, "", k); next }
    /^  [a-z]/ && k ~ /^(allreduce|broadcast|allgather|reducescatter)$/ && $1 != "shm" {
      a[k] = a[k] (a[k] == "" ? "" : ",") $1 }
    END { for (k in a) printf "%s:%s ", k, a[k] }')
fi
algos_of() {
  local spec
  for spec in ${algos_opt:-${info_algos:-$ALGORITHMS}}; do
    if [ "${spec%%:*}" = "$1" ]; then
      local a out=
      for a in $(echo "${spec#*:}" | tr , ' '); do
        [ "$a" = hierarchical ] && [ "${2:-1}" -le 1 ] && continue
        out="$out $a"
      done
      echo $out
      return
    fi
  done
}
echo "# forced algorithms from: $([ -n "$algos_opt" ] && echo --algorithms ||
  { [ -n "$info_algos" ] && echo 'hora-info --algorithms'; } || echo 'ALGORITHMS (script)')"

work=$(mktemp -d)
# Every process's TCP sockets under one congestion control (--tcp-cc).
cc_args=()
if [ "$tcp_cc" != system ] && [ -z "$fit_only" ]; then
  ${CC:-cc} -O2 -shared -fPIC -o "$work/tcpcc.so" "$here/tcp-congestion-preload.c" -ldl ||
    { echo "scale-bench.sh: cannot build tcp-congestion-preload.c" >&2; rm -rf "$work"; exit 2; }
  cc_args=(-x LD_PRELOAD="$work/tcpcc.so" -x TCP_CONGESTION_PRELOAD="$tcp_cc"
    -x HORA_TCP_CONGESTION_CONTROL="$tcp_cc")
fi
[ ${#extra_x[@]} -gt 0 ] && echo "# every rank of every run with:$(printf ' %s' "${extra_x[@]}" | sed 's/ -x / /g')"
[ -z "$fit_only" ] &&
  echo "# TCP congestion control: $tcp_cc (the system's default: $(cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null || echo unknown))"
# Fits the model to the forced algorithms' times of each layout in CSV
# (hora's own figures; auto, MPI and the floor left out).
fit_model() { # csv
  local lay
  for lay in $(awk -F, 'NR > 1 { print $1 }' "$1" | sort -u); do
    awk -F, -v l="$lay" 'NR > 1 && $1 == l && $7 == "hora" && $8 != "auto" && $9 > 0 {
      printf "%s %s %s %.9f\n", $5, $8, $6, $9 / 1e6 }' "$1" >"$work/fit.$lay"
    local hh=${lay%x*} rr=${lay#*x}
    echo
    echo "## cost model fitted to $lay ($1)"
    "$tree/hora-info" --model --ranks $((hh * rr)) --hosts "$hh" --fit "$work/fit.$lay"
  done
}

if [ -n "$fit_only" ]; then
  fit_model "$fit_only"
  rc=$?
  rm -rf "$work"
  exit $rc
fi

[ -n "$logs" ] && mkdir -p "$logs"
export NETNS_PREFIX="sb$$x"
# timeout runs mpirun in a process group of its own, out of reach of a
# signal to ours: the run in flight is stopped through it.
child=
cleanup() {
  if [ -n "$child" ]; then
    kill -TERM "$child" 2>/dev/null
    wait "$child" 2>/dev/null
  fi
  "$netns/netns-cluster.sh" down >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
export OMPI_MCA_mpi_yield_when_idle=1 HWLOC_COMPONENTS=-pci,-linuxio

maxhosts=0
for l in $layouts; do
  h=${l%x*} r=${l#*x}
  case $h$r in *[!0-9]* | '') echo "scale-bench.sh: bad layout $l (HOSTSxRANKS)" >&2; exit 2 ;; esac
  [ "$h" -gt "$maxhosts" ] && maxhosts=$h
done
"$netns/netns-cluster.sh" up "$maxhosts" "$rate" >"$work/up.log" 2>&1 ||
  { cat "$work/up.log" >&2; echo "scale-bench.sh: netns-cluster.sh up failed" >&2; exit 1; }

# hora-bench's sizes go b, b*f, ... up to MAX; MAX itself gets a run of its
# own where they miss it.
ranges="-b $bmin -e $bmax -f $sfac"
last=$(awk -v b="$bmin" -v e="$bmax" -v f="$sfac" 'BEGIN { for (x = b; x <= e * 1.0001; x *= f) l = x; printf "%.0f", l }')
[ "$last" != "$bmax" ] && ranges="$ranges;-b $bmax -e $bmax -f 2"

# Runs PROG under mpirun on the layout's hosts for each range; output appended to $2.
# usage: run_ranges HOSTFILE OUT NP ENV-VAR-OR-- PROG ARGS...
failed=0
run_ranges() {
  local hf=$1 out=$2 np=$3 var=$4 rng rc
  shift 4
  local IFS=';'
  for rng in $ranges; do
    IFS=' '
    # shellcheck disable=SC2086
    timeout "$limit" "$netns/mpirun-netns.sh" "$hf" -np "$np" --bind-to none \
      -x HORA_SPIN_TIME_US="$spin" "${cc_args[@]}" "${extra_x[@]}" ${var:+-x "$var"} "$@" $rng -r "$reps" </dev/null >>"$out" 2>&1 &
    child=$!
    wait "$child"
    rc=$?
    child=
    if [ $rc -ne 0 ]; then
      echo "# FAILED (exit $rc): $* $rng" >>"$out"
      echo "scale-bench.sh: exit $rc: $* $rng (see the log)" >&2
      failed=1
    fi
  done
}

# Records "op source algorithm bytes time_us errors" from hora-bench (source
# hora, mpi, model) and hora-bench-floor (source floor) output. Header names
# like "hora us" are joined to "hora_us", so the columns are found by name.
parse_bench() { # op algorithm
  awk -v op="$1" -v alg="$2" '
    /^#/ && / bytes / && / count / {
      h = $0; sub(/^#/, "", h); gsub(/ us/, "_us", h); n = split(h, f, " ")
      ih = im = ie = imod = ialg = 0
      for (i = 1; i <= n; i++) {
        if (f[i] == "hora_us") ih = i; if (f[i] == "MPI_us") im = i
        if (f[i] == "errors") ie = i; if (f[i] == "model_us") imod = i
        if (f[i] == "algorithm") ialg = i
      }
      next
    }
    $1 ~ /^[0-9]+$/ && ih {
      e = ie ? $ie : 0; last = $1
      printf "%s hora %s %s %s %s\n", op, alg, $1, $ih, e
      if (im && $im != "-") printf "%s mpi %s %s %s %s\n", op, alg, $1, $im, e
      if (imod && $imod != "-") printf "%s model %s %s %s -\n", op, alg, $1, $imod
      if (ialg && $ialg != "-") printf "%s pick %s %s %s -\n", op, alg, $1, $ialg
      next
    }
    /model_us/ && last != "" {
      for (i = 1; i < NF; i++) if ($i ~ /model_us/) { v = $(i + 1) + 0; break }
      if (v > 0) printf "%s model %s %s %s -\n", op, alg, last, v
    }'
}
parse_floor() { # op
  awk -v op="$1" '
    /^#/ && / bytes / && / count / {
      n = split($0, f, " "); k = 0; ie = 0
      for (i = 2; i <= n; i++) {
        if (f[i] ~ /_us$/ && f[i] != "floor_us") { k++; col[k] = i - 1; name[k] = f[i]; sub(/_us$/, "", name[k]) }
        if (f[i] == "errors") ie = i - 1
      }
      next
    }
    $1 ~ /^[0-9]+$/ && k { for (j = 1; j <= k; j++) printf "%s floor %s %s %s %s\n", op, name[j], $1, $col[j], $ie }'
}

[ -n "$csv" ] && echo "layout,hosts,ranks_per_host,ranks,op,bytes,source,algorithm,time_us,busbw_GBps,line_pct,errors" >"$csv"

for l in $layouts; do
  h=${l%x*} r=${l#*x} np=$((${l%x*} * ${l#*x}))
  hf=$work/hosts.$l
  for ((i = 0; i < h; i++)); do echo "${NETNS_PREFIX}$i slots=$r"; done >"$hf"
  rec=$work/rec.$l
  : >"$rec"
  for op in $ops; do
    var=HORA_ALGORITHM_$(echo "$op" | tr '[:lower:]' '[:upper:]')
    for ((round = 1; round <= rounds; round++)); do
      for alg in $(algos_of "$op" "$r") auto; do
        echo "# $l $op $alg (round $round of $rounds) ..." >&2
        raw=$work/raw.$l.$op.$alg.$round
        : >"$raw"
        export "$var=$alg"
        # Open MPI's figure is taken from auto's run: the forced runs skip it.
        if [ "$alg" = auto ]; then mpi_arg=(); else mpi_arg=(--no-mpi); fi
        run_ranges "$hf" "$raw" "$np" "$var" "$tree/hora-bench" -o "$op" "${mpi_arg[@]}"
        unset "$var"
        parse_bench "$op" "$alg" <"$raw" >>"$rec"
        [ -n "$logs" ] && cp "$raw" "$logs/"
      done
      [ $floor = 1 ] || continue
      echo "# $l $op floor (round $round of $rounds) ..." >&2
      raw=$work/raw.$l.$op.floor.$round
      : >"$raw"
      run_ranges "$hf" "$raw" "$np" "" "$tree/hora-bench-floor" -i eth0 -o "$op"
      parse_floor "$op" <"$raw" >>"$rec"
      [ -n "$logs" ] && cp "$raw" "$logs/"
    done
  done
  [ -n "$logs" ] && cp "$rec" "$logs/"
  awk '$6 != "-" && $6 + 0 > 0' "$rec" | grep -q . && { echo "scale-bench.sh: wrong results in $l (see the tables)" >&2; failed=1; }

  for op in $ops; do
    awk -v op="$op" -v algs="$(algos_of "$op" "$r")" -v p="$np" -v rounds="$rounds" -v line="$line" -v l="$l" \
      -v h="$h" -v r="$r" -v rate="$rate" -v csv="$csv" '
      function human(b) {
        return b >= 1048576 && b % 1048576 == 0 ? b / 1048576 "M" : b >= 1024 && b % 1024 == 0 ? b / 1024 "K" : b
      }
      function fmt(v) { return v == "" ? "-" : sprintf("%.1f", v) }
      BEGIN {
        bus = op == "allreduce" ? 2 * (p - 1) / p : op == "broadcast" ? 1 : (p - 1) / p
        na = split(algs, a, " ")
      }
      $1 == op && $2 == "pick" { pick[$3, $4] = $5; next }
      $1 == op {
        key = $2 SUBSEP $3 SUBSEP $4
        vals[key, ++cnt[key]] = $5 + 0; sz[$4] = 1
        if ($2 == "floor" && !($3 in fl)) { fl[$3] = 1; fn[++nf] = $3 }
        if ($6 != "-" && $6 + 0 > 0) bad[$4] = 1
        if (csv != "") {
          bw = $5 > 0 ? $4 / ($5 * 1e3) * bus : 0
          printf "%s,%s,%s,%s,%s,%s,%s,%s,%s,%.4f,%.1f,%s\n", l, h, r, p, op, $4, $2, $3, $5, bw,
            100 * bw / line, $6 >> csv
        }
      }
      END {
        # Each figure: the median of its rounds (the lower middle of an even count).
        for (key in cnt) {
          c = cnt[key]
          for (i = 1; i <= c; i++) w[i] = vals[key, i]
          for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (w[j] < w[i]) { x = w[i]; w[i] = w[j]; w[j] = x }
          t[key] = w[int((c + 1) / 2)]
        }
        printf "\n## %s, %d hosts x %d rank%s (%d ranks), links %s (line %.3f GB/s), us per operation%s\n",
          op, h, r, (r > 1 ? "s" : ""), p, rate, line, (rounds > 1 ? ", median of " rounds " rounds" : "")
        printf "%8s", "bytes"
        for (i = 1; i <= na; i++) printf " %10s", a[i]
        printf " %10s %10s %8s %8s %12s %8s %6s", "auto", "OpenMPI", "auto/MPI", "vs_best", "pick", "busbw", "line%"
        for (i = 1; i <= nf; i++) printf " %10s", "fl_" fn[i]
        printf " %10s %10s\n", "floor", "model"
        ns = 0
        for (s in sz) v[++ns] = s + 0
        for (i = 1; i <= ns; i++) for (j = i + 1; j <= ns; j++) if (v[j] < v[i]) { x = v[i]; v[i] = v[j]; v[j] = x }
        for (k = 1; k <= ns; k++) {
          s = v[k]; best = ""
          printf "%8s", human(s)
          for (i = 1; i <= na; i++) {
            x = t["hora", a[i], s]; printf " %10s", fmt(x)
            if (x != "" && (best == "" || x + 0 < best)) best = x + 0
          }
          au = t["hora", "auto", s]; m = t["mpi", "auto", s]
          printf " %10s %10s", fmt(au), fmt(m)
          printf " %8s", (au != "" && m > 0 ? sprintf("%.2f", au / m) : "-")
          printf " %8s", (au != "" && best > 0 ? sprintf("%+.1f%%", 100 * (au / best - 1)) : "-")
          printf " %12s", ((("auto", s) in pick) ? pick["auto", s] : "-")
          bw = au > 0 ? s / (au * 1e3) * bus : 0
          printf " %8s %6s", (au > 0 ? sprintf("%.4f", bw) : "-"), (au > 0 ? sprintf("%.1f", 100 * bw / line) : "-")
          fb = ""
          for (i = 1; i <= nf; i++) {
            x = t["floor", fn[i], s]; printf " %10s", fmt(x)
            if (x != "" && (fb == "" || x + 0 < fb)) fb = x + 0
          }
          printf " %10s %10s%s\n", fmt(fb), fmt(t["model", "auto", s]), (bad[s] ? "  WRONG RESULTS" : "")
        }
      }' "$rec"
  done
done
if [ $fit = 1 ]; then
  if [ -n "$csv" ]; then
    fit_model "$csv"
  else
    echo "# --fit needs --csv FILE (the figures it fits)" >&2
  fi
fi
[ $failed -eq 0 ] || echo "# some runs failed or gave wrong results (see above)" >&2
exit $failed
