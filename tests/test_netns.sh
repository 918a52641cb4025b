#!/usr/bin/env bash
# Failure and soak tests of a multi-host job, simulated with network
# namespaces: four ranks of braid-bench, each in its own namespace with a
# veth link into a bridge (a star: rank - link - switch - link - rank),
# addresses 10.78.0.K+1/24 that exist only inside the namespaces.
#
#  link-down  one rank's link goes down in the middle of an all-reduce
#             loop. Every surviving rank must exit non-zero naming
#             BRAID_ERR_PEER or BRAID_ERR_TIMEOUT within the group timeout
#             (BRAID_TIMEOUT_MS=3000) plus a margin, and the cut-off rank
#             must exit too: nothing hangs. Run with the victim a plain
#             rank and with the victim rank 0 (the rendezvous host).
#  soak       every link gets netem loss 1%, delay 2ms +-1ms, reorder 5%
#             (without sch_netem: 1% drop and 5% reordering from cls_bpf
#             and htb, no delay); all-reduces of random sizes and several
#             types run with result checking, and must all be exact
#             (#wrong = 0, exit 0).
#
# usage: test_netns.sh BRAID_BENCH
# Needs root and iproute2; exits 77 (skip) with the reason when namespaces
# cannot be made or links cannot be impaired. BRAID_NETNS_SEED=N repeats a run's
# random sizes.
set -u

bench=${1:?usage: test_netns.sh BRAID_BENCH}
nranks=4
timeout_ms=3000
margin_s=2.5
prog=test_netns

seed=${BRAID_NETNS_SEED:-$$}
RANDOM=$seed
tag=braid-ft-$$
brns=$tag-br
. "$(dirname "$0")/netns_common.sh"
[ -x "$bench" ] || fail "braid-bench not found at $bench"
command -v tc >/dev/null || skip "iproute2 (tc) is not installed"

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }

# ---- topology ---------------------------------------------------------------
addns "$brns"
ip -n "$brns" link set lo up
ip -n "$brns" link add br0 type bridge
ip -n "$brns" link set br0 up
for ((k = 0; k < nranks; k++)); do
  ns=$tag-r$k
  addns "$ns"
  ip -n "$ns" link set lo up
  # Created in the bridge namespace with its peer moved straight into the
  # rank's: nothing appears in the host namespace.
  ip -n "$brns" link add "v$k" type veth peer name veth0 netns "$ns" || fail "cannot create veth pair $k"
  ip -n "$brns" link set "v$k" master br0 up
  ip -n "$ns" addr add "10.78.0.$((k + 1))/24" dev veth0
  ip -n "$ns" link set veth0 up
done

# The bridge forwards once a TCP connect to rank 0 is refused (nothing
# listens on port 9): proves the path without a ping binary.
reachable() {
  local out
  out=$(ip netns exec "$1" timeout 2 bash -c 'exec 3<>/dev/tcp/10.78.0.1/9' 2>&1 || true)
  [[ $out == *refused* ]]
}
for ((t = 0; t < 50; t++)); do
  ok=1
  for ((k = 1; k < nranks; k++)); do reachable "$tag-r$k" || { ok=0; break; }; done
  [ $ok = 1 ] && break
  sleep 0.2
done
[ $ok = 1 ] || fail "namespaces cannot reach each other through the bridge"

# ---- running a job ----------------------------------------------------------
# start_job NAME PORT LIMIT_S BENCH-ARGS...: ranks in the background, torchrun
# style; pid of rank k in job_pid[k], output in $work/NAME-rK.log.
job_pid=()
job_timeout_ms=$timeout_ms
start_job() {
  local name=$1 port=$2 limit=$3
  shift 3
  for ((k = nranks - 1; k >= 0; k--)); do
    (exec ip netns exec "$tag-r$k" env -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u SLURM_PROCID \
      -u SLURM_NTASKS BRAID_DEBUG=WARN BRAID_TIMEOUT_MS=$job_timeout_ms RANK=$k LOCAL_RANK=0 WORLD_SIZE=$nranks \
      LOCAL_WORLD_SIZE=1 MASTER_ADDR=10.78.0.1 MASTER_PORT=$port BRAID_SOCKET_IFNAME=veth0 \
      timeout --signal=KILL "$limit" "$bench" "$@") >"$work/$name-r$k.log" 2>&1 &
    job_pid[$k]=$!
    pids+=($!)
  done
}

# wait_job T0 DEADLINE_S: reap every rank, recording its exit status in
# job_rc[k] and its end, in seconds after T0, in job_end[k]. Ranks still
# alive DEADLINE_S after T0 are killed and get job_rc 'hung'.
job_rc=()
job_end=()
wait_job() {
  local t0=$1 deadline=$2 live=$nranks st
  job_rc=()
  job_end=()
  while [ $live -gt 0 ]; do
    for ((k = 0; k < nranks; k++)); do
      [ -z "${job_rc[$k]:-}" ] || continue
      if kill -0 "${job_pid[$k]}" 2>/dev/null; then
        if ! le "$(elapsed "$t0" "$(now)")" "$deadline"; then
          # The rank runs under timeout(1), which killing does not pass on.
          pkill -KILL -P "${job_pid[$k]}" 2>/dev/null
          kill -KILL "${job_pid[$k]}" 2>/dev/null
          wait "${job_pid[$k]}" 2>/dev/null
          job_rc[$k]=hung
          job_end[$k]=$(elapsed "$t0" "$(now)")
          live=$((live - 1))
        fi
        continue
      fi
      st=0
      wait "${job_pid[$k]}" || st=$?
      job_rc[$k]=$st
      job_end[$k]=$(elapsed "$t0" "$(now)")
      live=$((live - 1))
    done
    [ $live -gt 0 ] && sleep 0.02
  done
  pids=()
}

failures=0
check() { # check COND-RESULT MESSAGE
  if [ "$1" = 0 ]; then echo "  ok: $2"; else echo "  FAIL: $2"; failures=$((failures + 1)); fi
}

# ---- (a) link down mid-run --------------------------------------------------
link_down() {
  local victim=$1 port=$2 name=down-v$1
  echo "# link-down: rank $victim's veth goes down during an all-reduce loop (timeout ${timeout_ms} ms)"
  # Long enough never to finish by itself: 256 KiB float sums, unchecked.
  start_job "$name" "$port" 120 allreduce -d float -o sum -b 256K -e 256K -n 100000000 -w 1 -c 0
  # Mid-run: rank 0 printed its header (the group is up, the loop running),
  # and a moment later every rank is still busy in it.
  local t=0
  until grep -q '^#  *size' "$work/$name-r0.log" 2>/dev/null; do
    sleep 0.05
    t=$((t + 1))
    [ $t -lt 600 ] || fail "link-down: the job did not start within 30 s"
  done
  sleep 1
  for ((k = 0; k < nranks; k++)); do
    kill -0 "${job_pid[$k]}" 2>/dev/null || fail "link-down: rank $k ended before the fault"
  done
  local t0
  t0=$(now)
  ip -n "$tag-r$victim" link set veth0 down
  local limit
  limit=$(awk -v t="$timeout_ms" -v m="$margin_s" 'BEGIN { printf "%.3f", t / 1000 + m }')
  # Reap with a far later deadline, so a slow rank is measured, not cut.
  wait_job "$t0" 30
  ip -n "$tag-r$victim" link set veth0 up
  local worst=0
  for ((k = 0; k < nranks; k++)); do
    local log=$work/$name-r$k.log rc=${job_rc[$k]} end=${job_end[$k]}
    local err
    err=$(grep -o 'BRAID_ERR_[A-Z_]*' "$log" | head -n 1)
    echo "  rank $k: exit ${rc}, ${end} s after the link went down, ${err:-no braid error}"
    if [ "$k" = "$victim" ]; then
      check "$([ "$rc" != hung ] && [ "$rc" != 0 ] && le "$end" "$limit"; echo $?)" \
        "cut-off rank $victim fails and exits within ${limit} s"
      continue
    fi
    check "$([ "$rc" != hung ] && [ "$rc" != 0 ]; echo $?)" "rank $k exits non-zero"
    check "$(grep -qE 'BRAID_ERR_(PEER|TIMEOUT)' "$log"; echo $?)" "rank $k reports BRAID_ERR_PEER or BRAID_ERR_TIMEOUT"
    check "$(le "$end" "$limit"; echo $?)" "rank $k ends within timeout + ${margin_s} s = ${limit} s"
    le "$end" "$worst" || worst=$end
  done
  echo "# link-down victim $victim: slowest survivor exit $worst s after the fault (limit $limit s)"
}

base_port=$((20000 + RANDOM % 20000))
link_down 2 "$base_port"
link_down 0 "$((base_port + 1))"

# ---- (b) impaired-link soak -------------------------------------------------
# netem gives loss 1%, delay 2ms +-1ms and reorder 5% on every link end.
# Kernels built without sch_netem get the closest stand-in the classic
# qdiscs allow, said so in the output: a classic BPF program (cls_bpf,
# direct action) drops 1% of packets at random, and another one sends 5% of
# them through a slower htb class, so they arrive out of order; there is no
# added delay. Segmentation offload is capped to single packets so a loss
# is one packet, not a 64 KiB super-segment.
netem_qd="netem loss 1% delay 2ms 1ms reorder 5%"
# A = random u32; A >= 2^32/100 ? pass : drop.
bpf_drop='4,32 0 0 4294963256,53 0 1 42949673,6 0 0 0,6 0 0 2'
# A = random u32; A >= 2^32/20 ? class 1:10 : class 1:20.
bpf_slow='4,32 0 0 4294963256,53 1 0 214748365,6 0 0 65568,6 0 0 65552'
impair() { # impair MODE NS DEV
  local mode=$1 ns=$2 dev=$3
  ip -n "$ns" link set dev "$dev" gso_max_segs 1 2>/dev/null || true
  if [ "$mode" = netem ]; then
    # shellcheck disable=SC2086
    tc -n "$ns" qdisc add dev "$dev" root $netem_qd
    return
  fi
  tc -n "$ns" qdisc add dev "$dev" clsact &&
    tc -n "$ns" filter add dev "$dev" egress bpf da bytecode "$bpf_drop" &&
    tc -n "$ns" qdisc add dev "$dev" root handle 1: htb default 10 r2q 1000 &&
    tc -n "$ns" class add dev "$dev" parent 1: classid 1:10 htb rate 10gbit &&
    tc -n "$ns" class add dev "$dev" parent 1: classid 1:20 htb rate 200mbit ceil 200mbit &&
    tc -n "$ns" filter add dev "$dev" parent 1: bpf bytecode "$bpf_slow"
}
mode=netem
if ! tc -n "$brns" qdisc add dev lo root netem delay 1ms 2>"$work/tc.err"; then
  mode=bpf
  echo "# soak: warning: this kernel has no netem qdisc ($(tr -d '\n' <"$work/tc.err")): 1% random drop and" \
    "5% reordering by cls_bpf + htb instead, no added delay"
else
  tc -n "$brns" qdisc del dev lo root
fi
for ((k = 0; k < nranks; k++)); do
  if ! impair $mode "$tag-r$k" veth0 2>"$work/tc.err" || ! impair $mode "$brns" "v$k" 2>>"$work/tc.err"; then
    [ $failures = 0 ] || fail "$failures link-down checks failed"
    skip "link-down passed, but links cannot be impaired for the soak: $(cat "$work/tc.err")"
  fi
done
for ((t = 0; t < 50; t++)); do reachable "$tag-r1" && break; sleep 0.2; done
qd=$netem_qd
[ $mode = netem ] || qd="cls_bpf drop 1% + htb reorder 5%"
retrans() { # TCP segments retransmitted by all ranks so far
  local sum=0 v
  for ((k = 0; k < nranks; k++)); do
    v=$(ip netns exec "$tag-r$k" awk '/^Tcp:/ && !h { for (i = 1; i <= NF; i++) c[$i] = i; h = 1; next }
      /^Tcp:/ { print $c["RetransSegs"] }' /proc/net/snmp)
    sum=$((sum + ${v:-0}))
  done
  echo $sum
}
retrans0=$(retrans)
# A loss burst may stall TCP for a few backed-off retransmission timeouts:
# the soak is about correct data, so it gets a generous group timeout.
job_timeout_ms=60000

echo "# soak: $qd on every link end, seed $seed"
soak_t0=$(now)
soak_calls=0
soak_rows=0
# Random sizes: odd byte counts for the byte types, random element counts for
# the wider ones; every size is checked out of place and in place.
for spec in "uint8 sum" "float sum" "int32 max" "double avg" "int8 min" "bfloat16 sum"; do
  set -- $spec
  dt=$1 op=$2
  b=$((1 + RANDOM % 3000))
  e=$((1024 * 1024 + RANDOM % 65536))
  inc=$((50000 + RANDOM % 100000))
  case $dt in
    uint8|int8) ;;
    bfloat16) b=$((b * 2)); inc=$((inc * 2)); e=$((e / 2 * 2)) ;;
    float|int32) b=$((b * 4)); inc=$((inc * 4)); e=$((e / 4 * 4)) ;;
    double) b=$((b * 8)); inc=$((inc * 8)); e=$((e / 8 * 8)) ;;
  esac
  name=soak-$dt-$op
  t0=$(now)
  start_job "$name" "$((base_port + 2 + soak_calls % 1000))" 200 \
    allreduce -d "$dt" -o "$op" -b "$b" -e "$e" -i "$inc" -n 2 -w 1 -c 1
  soak_calls=$((soak_calls + 1))
  wait_job "$t0" 240
  log=$work/$name-r0.log
  # Table rows only: they start with the size (a log line may have 13 words).
  rows=$(awk '$1 ~ /^[0-9]+$/ && NF >= 13' "$log" | wc -l)
  wrong=$(awk '$1 ~ /^[0-9]+$/ && NF >= 13 { w += $9 + $13 } END { print w + 0 }' "$log")
  soak_rows=$((soak_rows + rows))
  rcs=""
  for ((k = 0; k < nranks; k++)); do rcs="$rcs ${job_rc[$k]}"; done
  echo "  $dt $op: sizes $b..$e step $inc: $rows sizes, #wrong $wrong, exits [$rcs ], ${job_end[0]} s"
  all0=0
  for ((k = 0; k < nranks; k++)); do [ "${job_rc[$k]}" = 0 ] || all0=1; done
  check "$all0" "$dt $op: every rank exits 0"
  check "$([ "$rows" -gt 0 ] && [ "$wrong" = 0 ] && grep -q 'Out of bounds values : 0 OK' "$log"; echo $?)" \
    "$dt $op: $rows sizes all exact (#wrong 0)"
done
soak_s=$(elapsed "$soak_t0" "$(now)")
# Each size runs -w 1 (smallest and largest only), 1 untimed + 2 timed calls
# and 1 checked call, out of place and in place.
echo "# soak: $qd: $soak_rows sizes, about $((soak_rows * 8)) all-reduces of $nranks ranks ($soak_rows" \
  "x2 checked element by element) in $soak_s s, $(($(retrans) - retrans0)) TCP segments retransmitted, seed $seed"

[ $failures = 0 ] || fail "$failures checks failed"
echo "$prog: all checks passed"
