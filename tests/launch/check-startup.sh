#!/bin/sh
# Start-up without MPI, given bad input: every process that can be reached
# fails within HORA_CONNECT_TIMEOUT_SECONDS with a message naming the
# variable and the values; strangers at the rendezvous are refused while the
# job starts. Also Slurm's variables (as srun sets them) and the warning
# without a secret. One PASS/FAIL line per check.
#
# usage: tests/launch/check-startup.sh BUILDDIR
set -u
builddir=$(cd "${1:-.}" && pwd)
probe="$builddir/tests/launch/init_probe"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export HORA_CONNECT_TIMEOUT_SECONDS=4
# Only what each check sets decides the start-up.
for v in OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK PMI_SIZE PMI_RANK PMIX_RANK MPI_LOCALNRANKS \
         MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK \
         SLURM_PROCID SLURM_NTASKS SLURM_STEP_ID SLURM_JOB_ID SLURM_STEP_NODELIST SLURM_JOB_NODELIST \
         HORA_BOOTSTRAP HORA_RENDEZVOUS HORA_RANK HORA_SIZE HORA_SECRET HORA_SECRET_FILE; do
  unset "$v"
done

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# start NAME VAR=VALUE...: one probe in the background, output in $work/NAME
start() {
  name=$1
  shift
  (env "$@" timeout 30 "$probe" >"$work/$name" 2>"$work/$name.err"; echo $? >"$work/$name.rc") &
}

# expect CHECK SECONDS PATTERN NAME...: each named probe failed, its line
# matching PATTERN, all within SECONDS of the check's start.
expect_fail() {
  check=$1 limit=$2 pattern=$3
  shift 3
  wait
  took=$(( $(date +%s) - t0 ))
  bad=""
  for n in "$@"; do
    if [ "$(cat "$work/$n.rc" 2>/dev/null)" != 3 ] || ! grep -Eq "^init failed: .*$pattern" "$work/$n"; then
      bad="$bad $n: rc $(cat "$work/$n.rc" 2>/dev/null) '$(head -c 300 "$work/$n")'"
    fi
  done
  if [ -z "$bad" ] && [ "$took" -le "$limit" ]; then
    echo "PASS startup/$check (${took}s)"
  else
    echo "FAIL startup/$check: took ${took}s (limit ${limit}s);$bad"
  fi
}

# env: two processes claim RANK=1
t0=$(date +%s); p=$(free_port)
start dup0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p RANK=0 WORLD_SIZE=3 HORA_SECRET=s
start dup1a MASTER_ADDR=127.0.0.1 MASTER_PORT=$p RANK=1 WORLD_SIZE=3 HORA_SECRET=s
start dup1b MASTER_ADDR=127.0.0.1 MASTER_PORT=$p RANK=1 WORLD_SIZE=3 HORA_SECRET=s
expect_fail env_two_processes_claim_one_rank 8 "two processes claim RANK=1: pid" dup0 dup1a dup1b

# tcp: HORA_SIZE differs between processes
t0=$(date +%s); p=$(free_port)
start size0 HORA_RENDEZVOUS=127.0.0.1:$p HORA_RANK=0 HORA_SIZE=3 HORA_SECRET=s
start size1 HORA_RENDEZVOUS=127.0.0.1:$p HORA_RANK=1 HORA_SIZE=4 HORA_SECRET=s
start size2 HORA_RENDEZVOUS=127.0.0.1:$p HORA_RANK=2 HORA_SIZE=3 HORA_SECRET=s
expect_fail tcp_size_differs 8 "HORA_SIZE differs between processes: rank 0 has HORA_SIZE=3, .*HORA_SIZE=4" \
  size0 size1 size2

# env: a rank out of range
t0=$(date +%s); p=$(free_port)
for r in 0 1 5; do
  start "range$r" MASTER_ADDR=127.0.0.1 MASTER_PORT=$p RANK=$r WORLD_SIZE=3 HORA_SECRET=s
done
expect_fail env_rank_out_of_range 8 "RANK=5 \(pid [0-9]+ on .*\) is out of range: WORLD_SIZE=3 allows 0 to 2" \
  range0 range1 range5

# tcp: nobody listens where rank 0 should
t0=$(date +%s); p=$(free_port)
start unreach1 HORA_RENDEZVOUS=127.0.0.1:$p HORA_RANK=1 HORA_SIZE=2 HORA_SECRET=s
expect_fail tcp_rendezvous_unreachable 9 "could not reach the rendezvous at HORA_RENDEZVOUS=127.0.0.1:$p within 4 s" \
  unreach1

# env: the port is taken by another program. The holder says when it
# listens, and goes only once rank 0 has tried the port (on a slow machine
# fixed sleeps let rank 0 take it first, or after the holder had gone).
p=$(free_port)
/usr/bin/python3 -c "
import socket, time
s = socket.socket(); s.bind(('0.0.0.0', $p)); s.listen()
open('$work/holder.ready', 'w').close(); time.sleep(30)" &
holder=$!
i=0
while [ ! -e "$work/holder.ready" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
t0=$(date +%s)
start inuse0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p RANK=0 WORLD_SIZE=2 HORA_SECRET=s
start inuse1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p RANK=1 WORLD_SIZE=2 HORA_SECRET=s
i=0
while [ ! -e "$work/inuse0.rc" ] && [ $i -lt 80 ]; do sleep 0.1; i=$((i + 1)); done
kill $holder 2>/dev/null
expect_fail env_port_in_use 9 "" inuse0 inuse1
if ! grep -q "cannot listen on port $p for the rendezvous (MASTER_ADDR=127.0.0.1 MASTER_PORT=$p): the port is in use" "$work/inuse0"; then
  echo "FAIL startup/env_port_in_use_named: rank 0 said '$(cat "$work/inuse0")'"
else
  echo "PASS startup/env_port_in_use_named"
fi

# A secret file others can read
t0=$(date +%s)
echo "not so secret" >"$work/secret"
chmod 644 "$work/secret"
start loose HORA_RENDEZVOUS=127.0.0.1:1 HORA_RANK=0 HORA_SIZE=1 HORA_SECRET_FILE="$work/secret"
expect_fail secret_file_readable_by_others 3 "HORA_SECRET_FILE=$work/secret is readable by others \(mode 0644" loose

# torchrun's variables, one missing
t0=$(date +%s)
start nomaster HORA_BOOTSTRAP=env MASTER_ADDR=127.0.0.1 RANK=0 WORLD_SIZE=2
expect_fail env_variable_missing 3 "HORA_BOOTSTRAP=env needs torchrun's variables, and MASTER_PORT is not set" nomaster

# A malformed setting in a job without MPI: that process fails at once,
# naming it; the others time out waiting for it, naming its rank.
t0=$(date +%s); p=$(free_port)
start malformed0 HORA_RENDEZVOUS=127.0.0.1:$p HORA_RANK=0 HORA_SIZE=2 HORA_SECRET=s
start malformed1 HORA_RENDEZVOUS=127.0.0.1:$p HORA_RANK=1 HORA_SIZE=2 HORA_SECRET=s HORA_CYCLE_TIME=fast
expect_fail malformed_setting_without_mpi 8 "" malformed0 malformed1
if grep -q "HORA_CYCLE_TIME='fast' is not a number" "$work/malformed1" &&
   grep -q "HORA_RANK 1 never joined" "$work/malformed0"; then
  echo "PASS startup/malformed_setting_without_mpi_named"
else
  echo "FAIL startup/malformed_setting_without_mpi_named: '$(cat "$work/malformed0" "$work/malformed1")'"
fi

# Strangers during the rendezvous: garbage, silence and a wrong secret are
# refused; the job starts; the wrong secret learns why.
t0=$(date +%s); p=$(free_port)
chmod 600 "$work/secret"
start good0 HORA_RENDEZVOUS=127.0.0.1:$p HORA_RANK=0 HORA_SIZE=2 HORA_SECRET_FILE="$work/secret"
sleep 0.3
/usr/bin/python3 -c "
import socket, time
a = socket.create_connection(('127.0.0.1', $p)); a.sendall(b'GET / HTTP/1.0\r\n\r\n' * 8)
b = socket.create_connection(('127.0.0.1', $p))
time.sleep(1.5)" &
start wrong HORA_RENDEZVOUS=127.0.0.1:$p HORA_RANK=1 HORA_SIZE=2 HORA_SECRET=guess
sleep 0.5
start good1 HORA_RENDEZVOUS=127.0.0.1:$p HORA_RANK=1 HORA_SIZE=2 HORA_SECRET_FILE="$work/secret"
expect_fail stranger_with_a_wrong_secret_refused 8 "did not prove this job's secret" wrong
if grep -q "^init ok: rank 0 of 2 via tcp, sum 2" "$work/good0" && grep -q "^init ok: rank 1 of 2 via tcp, sum 2" "$work/good1" &&
   grep -q "refused a connection from 127.0.0.1" "$work/good0.err"; then
  echo "PASS startup/job_starts_past_strangers"
else
  echo "FAIL startup/job_starts_past_strangers: '$(cat "$work/good0" "$work/good1")' $(head -c 600 "$work/good0.err")"
fi

# No secret: the job starts, rank 0 warns.
p=$(free_port)
start open0 HORA_RENDEZVOUS=127.0.0.1:$p HORA_RANK=0 HORA_SIZE=2
start open1 HORA_RENDEZVOUS=127.0.0.1:$p HORA_RANK=1 HORA_SIZE=2
wait
if grep -q "^init ok: rank 0 of 2 via tcp" "$work/open0" && grep -q "any process that can reach HORA_RENDEZVOUS=127.0.0.1:$p may join" "$work/open0.err"; then
  echo "PASS startup/no_secret_warns"
else
  echo "FAIL startup/no_secret_warns: '$(cat "$work/open0")' $(head -c 400 "$work/open0.err")"
fi

# Slurm's variables as srun sets them for a job step (the program has no
# MPI); the real srun runs in tests/slurm.
p=$(free_port)
for r in 0 1 2; do
  start "slurm$r" SLURM_PROCID=$r SLURM_NTASKS=3 SLURM_LOCALID=$r SLURM_STEP_ID=0 SLURM_JOB_ID=42 \
    SLURM_STEP_NODELIST="$(hostname)" HORA_RENDEZVOUS_PORT=$p HORA_SECRET=s
done
wait
ok=0
for r in 0 1 2; do
  grep -q "^init ok: rank $r of 3 via slurm, sum 3" "$work/slurm$r" && ok=$((ok + 1))
done
if [ $ok = 3 ]; then
  echo "PASS startup/slurm_variables"
else
  echo "FAIL startup/slurm_variables: $(cat "$work/slurm0" "$work/slurm1" "$work/slurm2")"
fi

# A libhora built without MPI (configure --without-mpi), asked for MPI or
# started by an MPI launcher, fails at once and says so: running instead as
# N jobs of one process each would train N models unnoticed.
. "$builddir/tests/config.sh"
if [ "${HAVE_MPI:-yes}" = no ]; then
  t0=$(date +%s)
  start nompi_forced HORA_BOOTSTRAP=mpi
  start nompi_ompi OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=1
  start nompi_pmix PMIX_RANK=0 PMI_SIZE=2
  expect_fail without_mpi_refuses_an_mpi_start 3 "built without MPI \(configure --without-mpi\): start the job with torchrun's variables, srun --mpi=none or HORA_RENDEZVOUS" \
    nompi_forced nompi_ompi nompi_pmix
  if grep -q "^init failed: HORA_BOOTSTRAP=mpi, but" "$work/nompi_forced" &&
     grep -q "^init failed: an MPI launcher started this process (OMPI_COMM_WORLD_SIZE is set), but" "$work/nompi_ompi"; then
    echo "PASS startup/without_mpi_names_the_reason"
  else
    echo "FAIL startup/without_mpi_names_the_reason: '$(cat "$work/nompi_forced" "$work/nompi_ompi")'"
  fi
fi
