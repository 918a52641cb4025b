#!/usr/bin/env bash
# Hierarchical all-reduce across two simulated hosts: two network
# namespaces joined by a veth pair (10.79.0.1 and 10.79.0.2), two ranks of
# braid-bench in each. Ranks in one namespace share a host identity, so they
# talk over shared memory; ranks in different namespaces over TCP.
#
#  auto    the tuner's own choice over sizes from 4 bytes to 4 MiB, several
#          types and ops: must pick hier for the large sizes
#  forced  -a hier over odd byte counts from 1 byte up
#
# Every run is checked element by element (-c 1): every rank exits 0, no
# wrong element (#wrong 0), and every rank's log (BRAID_DEBUG=INFO) shows the
# hier algorithm and connections over both shm and tcp.
#
# usage: test_netns_hier.sh BRAID_BENCH
# Needs root and iproute2; exits 77 (skip) with the reason when namespaces
# cannot be made. Namespaces and processes are removed on every exit.
set -u

bench=${1:?usage: test_netns_hier.sh BRAID_BENCH}
prog=test_netns_hier
nranks=4

tag=braid-hier-$$
. "$(dirname "$0")/netns_common.sh"
[ -x "$bench" ] || fail "braid-bench not found at $bench"

# ---- two hosts ----------------------------------------------------------------
# Host h (0 or 1) is namespace $tag-h<h> at 10.79.0.<h+1>; ranks 2h and 2h+1
# run there.
addns "$tag-h0"
addns "$tag-h1"
for h in 0 1; do ip -n "$tag-h$h" link set lo up; done
ip -n "$tag-h0" link add veth0 type veth peer name veth0 netns "$tag-h1" || fail "cannot create the veth pair"
for h in 0 1; do
  ip -n "$tag-h$h" addr add "10.79.0.$((h + 1))/24" dev veth0
  ip -n "$tag-h$h" link set veth0 up
done
# Reachable once a TCP connect to host 0 is refused (nothing listens on 9).
ok=0
for ((t = 0; t < 50; t++)); do
  out=$(ip netns exec "$tag-h1" timeout 2 bash -c 'exec 3<>/dev/tcp/10.79.0.1/9' 2>&1 || true)
  if [[ $out == *refused* ]]; then ok=1; break; fi
  sleep 0.2
done
[ $ok = 1 ] || fail "the namespaces cannot reach each other"

# ---- running a job ----------------------------------------------------------
# run_job NAME PORT BENCH-ARGS...: four ranks, torchrun style, each with its
# log in $work/NAME-rK.log and its BRAID_DEBUG=INFO lines in NAME-rK.dbg;
# job_rc[k] is rank k's exit status.
job_rc=()
run_job() {
  local name=$1 port=$2 k h
  shift 2
  local jp=()
  for ((k = nranks - 1; k >= 0; k--)); do
    h=$((k / 2))
    (exec ip netns exec "$tag-h$h" env -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u SLURM_PROCID \
      -u SLURM_NTASKS -u BRAID_HOST_ID -u BRAID_TRANSPORT -u BRAID_ALGO BRAID_DEBUG=INFO \
      BRAID_DEBUG_FILE="$work/$name-r$k.dbg" BRAID_TIMEOUT_MS=60000 RANK=$k LOCAL_RANK=$((k % 2)) \
      WORLD_SIZE=$nranks LOCAL_WORLD_SIZE=2 MASTER_ADDR=10.79.0.1 MASTER_PORT=$port BRAID_SOCKET_IFNAME=veth0 \
      timeout --signal=KILL 240 "$bench" "$@") >"$work/$name-r$k.log" 2>&1 &
    jp[$k]=$!
    pids+=($!)
  done
  job_rc=()
  for ((k = 0; k < nranks; k++)); do
    job_rc[$k]=0
    wait "${jp[$k]}" || job_rc[$k]=$?
  done
  pids=()
}

failures=0
check() { # check COND-RESULT MESSAGE
  if [ "$1" = 0 ]; then echo "  ok: $2"; else echo "  FAIL: $2"; failures=$((failures + 1)); fi
}

# check_job NAME: exits, exactness, algorithm and transports.
check_job() {
  local name=$1 k log=$work/$1-r0.log rows wrong all0=0 rcs=""
  rows=$(awk '!/^#/ && NF >= 13' "$log" | wc -l)
  wrong=$(awk '!/^#/ && NF >= 13 { w += $9 + $13 } END { print w + 0 }' "$log")
  for ((k = 0; k < nranks; k++)); do
    rcs="$rcs ${job_rc[$k]}"
    [ "${job_rc[$k]}" = 0 ] || all0=1
  done
  echo "  $name: $rows sizes, #wrong $wrong, exits [$rcs ]"
  check "$all0" "$name: every rank exits 0"
  check "$([ "$rows" -gt 0 ] && [ "$wrong" = 0 ] && grep -q 'Out of bounds values : 0 OK' "$log"; echo $?)" \
    "$name: $rows sizes all exact (#wrong 0)"
  for ((k = 0; k < nranks; k++)); do
    local dbg=$work/$name-r$k.dbg
    check "$(grep -q 'allreduce algorithm hier .*2 hosts, 2-2 ranks per host' "$dbg"; echo $?)" \
      "$name: rank $k runs the hier all-reduce on 2 hosts x 2 ranks"
    check "$(grep -qE '(connected to|accepted) shared-memory peer' "$dbg"; echo $?)" \
      "$name: rank $k has a shared-memory peer"
    check "$(grep -qE 'connected to peer [0-9]+ at 10\.79\.|accepted peer [0-9]+ from 10\.79\.' "$dbg"; echo $?)" \
      "$name: rank $k has a tcp peer on the other host"
  done
}

port=$((20000 + $$ % 20000))
echo "# auto: the tuner's choice, 4 B .. 4 MiB"
n=0
for spec in "float sum" "int32 avg" "bfloat16 max" "int8 prod"; do
  set -- $spec
  run_job "auto-$1-$2" "$((port + n))" allreduce -d "$1" -o "$2" -b 4 -e 4M -f 8 -n 2 -w 1 -c 1
  check_job "auto-$1-$2"
  n=$((n + 1))
done
echo "# forced: -a hier, odd byte counts"
run_job forced-uint8 "$((port + n))" allreduce -a hier -d uint8 -o sum -b 1 -e 2M -f 7 -n 2 -w 1 -c 1
check_job forced-uint8
run_job forced-double "$((port + n + 1))" allreduce -a hier -d double -o avg -b 8 -e 1M -f 5 -n 2 -w 1 -c 1
check_job forced-double

[ $failures = 0 ] || fail "$failures checks failed"
echo "$prog: all checks passed"
