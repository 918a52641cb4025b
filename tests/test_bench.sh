#!/usr/bin/env bash
# Tests for braid-bench and scripts/netns-bench.
#
# usage: test_bench.sh BRAID-BENCH [local|netns NETNS-BENCH]
#   local  (default) forked local ranks: every dtype and op verified at 2, 3
#          and 4 ranks (and with each algorithm), broadcast, the nccl-tests
#          table format, csv append, plot, usage errors, nccl-tests' flags
#          (-t, -g, -N, -c, -m, -z, -C; -G, -R refused with a reason), the
#          memory/transport line, a run without any flag, --buffers device
#          (device buffers on a GPU, a clear refusal elsewhere)
#   netns  two ranks in network namespaces over a shaped link; exits 77
#          (skipped) where network namespaces cannot be created
set -uo pipefail

bench=${1:?usage: test_bench.sh BRAID-BENCH [local|netns NETNS-BENCH]}
mode=${2:-local}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
failures=0
checks=0

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
ok() { checks=$((checks + 1)); }

# check_table FILE ROWS CHECKED WHAT [PROGRAM]: the output is nccl-tests'
# table with ROWS data rows of 13 columns; CHECKED=1: both #wrong columns
# are 0; 0: both N/A; oop: out of place 0, in place N/A (nccl-tests checks
# no in-place alltoall, alltoallv or sendrecv). PROGRAM (default
# braid-bench) is the name the start and end lines give.
# The expected header lines are made with the format strings of the
# vendored nccl-tests 2.19 (src/util.cu), and each row is read by column
# position, as a parser of fixed columns would.
check_table() {
  local f=$1 rows=$2 checked=$3 what=$4 prog=${5:-braid-bench}
  local h1 h2 h3 t=time
  grep -q '^#  *size .*  cputime  ' "$f" && t=cputime # -C 1, as nccl-tests labels it
  h1=$(printf '# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          ' '' '' '' '' '')
  h2=$(printf '# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s' size count type redop root \
    $t algbw busbw '#wrong' $t algbw busbw '#wrong' 0 '')
  h3=$(printf '# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s' '(B)' '(elements)' '' '' '' \
    '(us)' '(GB/s)' '(GB/s)' '' '(us)' '(GB/s)' '(GB/s)' '' 0 '')
  grep -qxF -- "$h1" "$f" && grep -qxF -- "$h2" "$f" && grep -qxF -- "$h3" "$f" ||
    { fail "$what: column header differs from nccl-tests"; return; }
  grep -Eq '^# nccl-tests version [^ ]+ nccl-headers=[0-9]+ nccl-library=[0-9]+$' "$f" ||
    { fail "$what: no version line"; return; }
  grep -qx "# Collective test starting: $prog" "$f" && grep -qx "# Collective test concluded: $prog" "$f" ||
    { fail "$what: no collective test starting/concluded lines"; return; }
  grep -Eq '^# nThread [0-9]+ nGpus [0-9]+ minBytes [0-9]+ maxBytes [0-9]+ step: [0-9]+\((factor|bytes)\) warmup iters: [0-9]+ iters: [0-9]+ agg iters: [0-9]+ validation: [0-9]+ graph: 0 unalign: [0-9]+$' "$f" ||
    { fail "$what: first header line differs from nccl-tests"; return; }
  grep -Eq '^#  Rank  0 Group  0 Pid +[0-9]+ on +[^ ]+ device +[0-9]+ \[0000:00:00\] ' "$f" ||
    { fail "$what: no device line for rank 0"; return; }
  # Fixed columns: "%12li  %12li  %8s  %6s  %6s", then per half
  # "  %7s  %6s  %6s  %6g" (#wrong) or "  %7s  %6s  %6s    N/A" (unchecked).
  local cols
  cols=$(awk '
    function field(at, w,   v) {
      if (substr($0, at - 2, 2) != "  ") return 0
      v = substr($0, at, w); gsub(/^ +/, "", v); return v != "" && v !~ / /
    }
    !/^#/ && NF > 0 {
      # redop: hypercube_perf prints an empty one, as nccl-tests does
      ok = field(15, 12) && field(29, 8) && (field(39, 6) || substr($0, 37, 8) == "        ") && field(47, 6) &&
        substr($0, 1, 12) ~ /^ *[0-9]+$/
      at = 53
      for (h = 0; h < 2 && ok; h++) {
        ok = field(at + 2, 7) && field(at + 11, 6) && field(at + 19, 6)
        if (substr($0, at + 25, 7) == "    N/A") at += 32
        else { ok = ok && field(at + 27, 6); at += 33 }
      }
      if (!ok || length($0) != at - 1) print "not in nccl-tests columns: " $0
    }' "$f")
  [ -z "$cols" ] || { fail "$what: $cols"; return; }
  # braid's line before the table: each rank's memory and transport.
  grep -Eq '^# braid:( ranks? [0-9]+(-[0-9]+)? (host|device) memory, [a-z_+]+;?)+$' "$f" ||
    { fail "$what: no line naming each rank's memory and transport"; return; }
  local got
  # data rows: every non-comment, non-empty line
  got=$(awk '!/^#/ && NF > 0' "$f" | wc -l)
  [ "$got" -eq "$rows" ] || { fail "$what: $got table rows, expected $rows"; return; }
  local bad
  bad=$(awk -v checked="$checked" '
    /^#/ || NF == 0 { next }
    substr($0, 39, 6) == "      " { $0 = substr($0, 1, 38) "     -" substr($0, 45) } # empty redop
    NF != 13 { print "row with " NF " columns: " $0; next }
    $1 !~ /^[0-9]+$/ || $2 !~ /^[0-9]+$/ { print "bad size/count: " $0; next }
    $6 + 0 < 0 || $10 + 0 < 0 { print "negative time: " $0; next }
    checked == 1 && ($9 != "0" || $13 != "0") { print "wrong elements: " $0; next }
    checked == 0 && ($9 != "N/A" || $13 != "N/A") { print "expected N/A: " $0; next }
    checked == "oop" && ($9 != "0" || $13 != "N/A") { print "expected 0 out of place, N/A in place: " $0; next }
  ' "$f")
  [ -z "$bad" ] || { fail "$what: $bad"; return; }
  grep -qx '# Out of bounds values : 0 OK' "$f" || { fail "$what: footer does not say 0 OK"; return; }
  grep -Eq '^# Avg bus bandwidth    : [0-9.e+-]+ $' "$f" || { fail "$what: no average bus bandwidth line"; return; }
  ok
}

# run NAME ARGS...: braid-bench with a time limit; stdout in $tmp/NAME.out.
run() {
  local name=$1; shift
  timeout 300 "$bench" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  local rc=$?
  if [ $rc != 0 ]; then
    fail "$name: braid-bench $* exited $rc"
    sed 's/^/  | /' "$tmp/$name.err" | tail -n 20 >&2
  fi
  return $rc
}

local_tests() {
  local rc
  local sizes=(-b 8 -e 64K -f 8) # 8 64 512 4096 32768: odd counts for wide types, several chunks
  local nsizes=5
  for n in 2 3 4; do
    # Every dtype x op, verified. 10 dtypes (uint32, uint64 included) x 6 ops (mulsum included) x 5 sizes.
    run "ar$n" allreduce -t "$n" "${sizes[@]}" -n 2 -w 1 -c 1 -d all -o all &&
      check_table "$tmp/ar$n.out" $((10 * 6 * nsizes)) 1 "allreduce -t $n -d all -o all"
    # The new types and op on their own, by name.
    for d in uint32 uint64; do
      run "ar$n-$d" allreduce -t "$n" -b 8 -e 8K -f 32 -n 1 -w 1 -c 1 -d "$d" -o mulsum &&
        check_table "$tmp/ar$n-$d.out" 3 1 "allreduce -t $n -d $d -o mulsum"
    done
    # Each requested algorithm must produce right answers too.
    for a in ring rd; do
      run "ar$n-$a" allreduce --nranks "$n" -b 4 -e 1M -f 16 -n 2 -w 1 -c 1 -d float -o sum -a "$a" &&
        check_table "$tmp/ar$n-$a.out" 5 1 "allreduce --nranks $n -a $a"
    done
    # nccl-tests' -a (how times combine over ranks) is a digit; --algo too.
    for avg in 0 1 2; do
      run "ar$n-avg$avg" allreduce --nranks "$n" -b 4 -e 64K -f 16 -n 2 -w 1 -c 1 -d float -o sum -a "$avg" &&
        check_table "$tmp/ar$n-avg$avg.out" 4 1 "allreduce --nranks $n -a $avg"
    done
    run "ar$n-algo" allreduce --nranks "$n" -b 4 -e 64K -f 16 -n 2 -w 1 -c 1 -d float -o sum --algo ring &&
      check_table "$tmp/ar$n-algo.out" 4 1 "allreduce --nranks $n --algo ring"
    # Ranks forked without -t: the header counts them, as -t N would.
    grep -q "^# nThread $n nGpus 1 " "$tmp/ar$n-algo.out" ||
      fail "allreduce --nranks $n: the header does not say nThread $n: $(grep '^# nThread' "$tmp/ar$n-algo.out")"
    # Broadcast from a non-zero root; redop is "none" and root the root.
    run "bc$n" broadcast -t "$n" "${sizes[@]}" -n 2 -w 1 -c 1 -d all -r 1 &&
      check_table "$tmp/bc$n.out" $((10 * nsizes)) 1 "broadcast -t $n" &&
      { awk '!/^#/ && NF > 0 && ($4 != "none" || $5 != "1") { bad = 1 } END { exit bad }' "$tmp/bc$n.out" ||
        fail "broadcast rows must show redop none, root 1"; }
  done
  # allreduce rows show root -1 and the op name.
  awk '!/^#/ && NF > 0 && ($5 != "-1") { bad = 1 } END { exit bad }' "$tmp/ar2.out" ||
    fail "allreduce rows must show root -1"

  # Every nccl-tests program, run under its own name (a link to
  # braid-bench, as installed): every dtype, with every op where it
  # reduces and every root in turn (-r all) where it has one, verified at
  # 3 ranks (odd blocks); hypercube at 4 (it needs a power of two).
  mkdir -p "$tmp/bin"
  local p n args rows prog checked
  for p in all_reduce all_gather broadcast reduce_scatter reduce alltoall alltoallv sendrecv gather scatter hypercube; do
    prog=${p}_perf
    ln -sf "$(cd "$(dirname "$bench")" && pwd)/$(basename "$bench")" "$tmp/bin/$prog"
    n=3 args=() rows=$((10 * 4)) checked=1
    case $p in
      all_reduce | reduce_scatter) args=(-o all); rows=$((rows * 6)) ;;
      reduce) args=(-o all -r all); rows=$((rows * 6 * 3)) ;;
      broadcast | gather | scatter) args=(-r all); rows=$((rows * 3)) ;;
      alltoall | alltoallv | sendrecv) checked=oop ;;
      hypercube) n=4 ;;
    esac
    timeout 300 "$tmp/bin/$prog" -t $n -b 16 -e 64K -f 16 -n 2 -w 1 -c 1 -d all "${args[@]}" \
      >"$tmp/$prog.out" 2>"$tmp/$prog.err" || { fail "$prog exited $?: $(tail -n 5 "$tmp/$prog.err")"; continue; }
    check_table "$tmp/$prog.out" $rows $checked "$prog -t $n" "$prog"
    # -r all: each rank in turn in the root column
    case $p in broadcast | gather | scatter | reduce)
      [ "$(awk '!/^#/ && NF > 0 { print $5 }' "$tmp/$prog.out" | sort -u | tr '\n' ' ')" = "0 1 2 " ] ||
        fail "$prog -r all must show roots 0 1 2" ;;
    esac
  done
  # One rank: every collective still runs and checks (hypercube's only
  # work is the copy of its own block, none at all in place).
  for p in allreduce broadcast reduce allgather reduce_scatter alltoall alltoallv sendrecv gather scatter hypercube; do
    run "one-$p" "$p" -t 1 -b 16 -e 4K -f 16 -n 2 -w 1 -c 1 -z 0 &&
      check_table "$tmp/one-$p.out" 3 "$(case $p in alltoall | alltoallv | sendrecv) echo oop ;; *) echo 1 ;; esac)" \
        "$p at 1 rank"
  done
  # -m 3 (three calls per iteration, one braid group, nesting the groups
  # alltoallv, sendrecv and hypercube make) with -z 0 and -z 3.
  for p in allreduce broadcast reduce allgather reduce_scatter alltoall alltoallv sendrecv gather scatter hypercube; do
    n=3; [ $p = hypercube ] && n=4
    for z in 0 3; do
      run "agg-$p-$z" "$p" -t $n -b 1K -e 256K -f 16 -n 4 -w 1 -m 3 -z $z -c 1 &&
        check_table "$tmp/agg-$p-$z.out" 3 "$(case $p in alltoall | alltoallv | sendrecv) echo oop ;; *) echo 1 ;; esac)" \
          "$p -m 3 -z $z"
    done
  done
  # nccl-tests' size column is the larger buffer and count the call's
  # count, its blocks rounded down to 16 bytes: 64 KiB of floats over 3
  # ranks is 3 blocks of 5460 (not 5461) floats.
  for prog in all_gather_perf reduce_scatter_perf alltoall_perf; do
    awk '!/^#/ && $3 == "float" { print $1, $2 }' "$tmp/$prog.out" | grep -qx '65520 5460' ||
      fail "$prog 64K float: want size 65520, count 5460"
  done
  # busbw as nccl-tests: (n-1)/n x algbw for gathers, algbw for sendrecv and reduce.
  awk '!/^#/ && NF > 0 { d = $8 - $7 * 2 / 3; if (d < -0.0085 || d > 0.0085) bad = 1 } END { exit bad }' \
    "$tmp/all_gather_perf.out" || fail "all_gather_perf busbw/algbw at 3 ranks is not 2/3"
  awk '!/^#/ && NF > 0 && $7 != $8 { bad = 1 } END { exit bad }' "$tmp/sendrecv_perf.out" ||
    fail "sendrecv_perf busbw differs from algbw"
  timeout 60 "$tmp/bin/hypercube_perf" -t 3 -b 1K -e 1K -n 1 >"$tmp/hc3.out" 2>&1
  grep -qx 'nRanks 3 is not a power of 2, skipping' "$tmp/hc3.out" && grep -qx '# Out of bounds values : 0 OK' "$tmp/hc3.out" ||
    fail "hypercube_perf at 3 ranks must skip as nccl-tests does: $(head -c 300 "$tmp/hc3.out")"
  # The collective named on the command line wins over the program name.
  timeout 60 "$tmp/bin/all_reduce_perf" broadcast -t 2 -b 1K -e 1K -n 1 >"$tmp/named.out" 2>&1 &&
    awk '!/^#/ && NF > 0 { exit $4 != "none" }' "$tmp/named.out" || fail "all_reduce_perf broadcast must broadcast"
  # alltoallv's traffic as nccl-tests': uniform (spread 0) and from a matrix.
  NCCL_TESTS_ALLTOALLV_SPREAD=0 run a2av-uniform alltoallv -t 3 -b 1K -e 64K -f 8 -n 2 -w 1 &&
    check_table "$tmp/a2av-uniform.out" 3 oop "alltoallv spread 0"
  printf '0 64 128\n256 16 0\n32 48 1024\n' >"$tmp/matrix.txt"
  NCCL_TESTS_ALLTOALLV_MATRIX_FILE=$tmp/matrix.txt run a2av-matrix alltoallv -t 3 -b 4K -e 4K -n 2 -w 1 &&
    check_table "$tmp/a2av-matrix.out" 1 oop "alltoallv from a matrix" &&
    { awk '!/^#/ && NF > 0 { exit !($1 == 1152 && $2 == 0) }' "$tmp/a2av-matrix.out" ||
      fail "alltoallv matrix: want size 1152 (rank 2 receives 128+0+1024) and count 0"; }
  NCCL_TESTS_ALLTOALLV_MATRIX_FILE=$tmp/matrix.txt "$bench" alltoallv -t 3 -b 1K -e 4K >/dev/null 2>"$tmp/a2av.err"
  [ $? = 2 ] && grep -q -- '-b and -e must be equal' "$tmp/a2av.err" || fail "alltoallv matrix with -b != -e must exit 2"

  # -z 1, 2, 3 (blocking), -u (unaligned buffers), -I/-K (per-iteration
  # columns), -S (timestamps), -M (memory line), as nccl-tests prints them.
  for z in 1 2 3; do
    run "z$z" reduce_scatter -t 3 -b 1K -e 64K -f 8 -n 3 -w 1 -z $z -u 3 &&
      check_table "$tmp/z$z.out" 3 1 "reduce_scatter -z $z -u 3" &&
      { grep -q '^# Blocking Enabled: ' "$tmp/z$z.out" && grep -q ' unalign: 3$' "$tmp/z$z.out" ||
        fail "-z $z -u 3: header lines"; }
  done
  run periter allgather -t 2 -b 1K -e 64K -f 8 -n 6 -w 1 -I 1 -K 2 -S 1 -M 1 && {
    local h2
    h2=$(printf '# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s %*s' \
      size count type redop root time algbw busbw '#wrong' i_min i_max i_p99 'i_cv%' time algbw busbw '#wrong' \
      i_min i_max i_p99 'i_cv%' 19 timestamp)
    grep -qxF -- "$h2" "$tmp/periter.out" || fail "-I 1 -S 1: column header differs from nccl-tests"
    grep -q '^# Per-Iteration Report: .*summary skips first 2 iterations' "$tmp/periter.out" ||
      fail "-I 1 -K 2: no per-iteration line"
    # 21 numbers and a date and time; i_min <= time-ish <= i_max is not
    # promised (means and maxima over ranks differ), but min <= p99 <= max is.
    awk '!/^#/ && NF > 0 { if (NF != 23 || $22 !~ /^[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]$/ || $10 > $12 || $11 < $12 || $18 > $20 || $19 < $20) bad = 1; rows++ }
      END { exit bad || rows != 3 }' "$tmp/periter.out" || fail "-I 1 -S 1 rows: $(grep -v '^#' "$tmp/periter.out")"
    grep -Eq '^# Host memory usage    : Initialization [0-9.]+ [KMG]?B \| User-Allocated [0-9.]+ [KMG]?B \| Collective [0-9.]+ [KMG]?B \| Total  [0-9.]+ [KMG]?B$' \
      "$tmp/periter.out" || fail "-M 1: no memory line"
  }
  # -J: nccl-tests' JSON report, read by the vendored nccl-tests' own
  # analyzer; an existing file is kept (FILE.0 is written), and a secret
  # in the environment is not written out.
  local analyzer nt
  nt=$(dirname "$0")/../../shared/third_party/nccl-tests
  analyzer=$nt/tools/analyze_perf_json.py
  : >"$tmp/r.json"
  BRAID_JOB_SECRET=hunter2-$$ run json reduce_scatter -t 3 -b 1K -e 64K -f 8 -n 5 -w 1 -I 1 -K 1 -J "$tmp/r.json" && {
    grep -qx "# Writing JSON output to $tmp/r.json.0" "$tmp/json.out" && [ ! -s "$tmp/r.json" ] ||
      fail "-J onto an existing file must write FILE.0"
    grep -q "hunter2-$$" "$tmp/r.json.0" && fail "-J wrote the job secret into the report"
    python3 - "$tmp/r.json.0" <<'PY' || fail "-J: the report is not nccl-tests' JSON of the table"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["version"] == 3 and d["config"]["iterations"] == 5 and d["config"]["per_iter_skip"] == 1, d["config"]
assert len(d["config"]["devices"]) == 3
rows = d["results"]
assert [r["size"] for r in rows] == [1008, 8160, 65520], [r["size"] for r in rows]
for r in rows:
    for h in ("out_of_place", "in_place"):
        assert r[h]["nwrong"] == 0 and r[h]["time"] > 0, r
        p = r[h + "_per_iter"]
        assert len(p["times_us"]) == 5 and len(p["per_process_max_times_us"]) == 3, p
        assert p["min_us"] <= p["p50_us"] <= p["p95_us"] <= p["p99_us"] <= p["max_us"], p
assert d["out_of_bounds"] == {"count": 0, "okay": "true"}, d["out_of_bounds"]
assert "BRAID_JOB_SECRET=<redacted>" in d["env"]
PY
    if [ -f "$analyzer" ]; then
      python3 "$analyzer" "$tmp/r.json.0" --all >"$tmp/analyze.out" 2>&1 &&
        grep -q 'Consistency (times_us == max over process rows, OOP): PASS' "$tmp/analyze.out" &&
        grep -q 'PER-PROCESS STRAGGLER ANALYSIS' "$tmp/analyze.out" ||
        fail "nccl-tests' analyze_perf_json.py on braid-bench -J: $(tail -n 5 "$tmp/analyze.out")"
    else
      echo "note: $analyzer not found, -J checked without nccl-tests' analyzer"
    fi
  }

  # Each rank's first log line says which braid this is and what CUDA there is.
  BRAID_DEBUG=INFO timeout 60 "$bench" -t 2 -b 1K -e 1K -n 1 >/dev/null 2>"$tmp/info.err"
  [ "$(grep -Ec 'rank [01]: braid [0-9]+\.[0-9]+\.[0-9]+ \([a-z]+ build, sanitizers [a-z,]+, (no )?verbs, (no )?trace lines\); cuda: (not built in|built in, .*)$' "$tmp/info.err")" = 2 ] ||
    fail "no build line per rank at BRAID_DEBUG=INFO: $(grep -m1 'braid INFO' "$tmp/info.err")"

  # NCCL_TESTS_MIN_BW: an average below 90% of it fails the run (exit 1).
  NCCL_TESTS_MIN_BW=1000000 "$bench" -t 2 -b 1K -e 1K -n 1 >"$tmp/minbw.out" 2>&1; rc=$?
  [ $rc = 1 ] && grep -Eq '^# Avg bus bandwidth    : [0-9.e+-]+ FAILED$' "$tmp/minbw.out" ||
    fail "NCCL_TESTS_MIN_BW above the result must fail (got $rc)"

  # Unverified run: #wrong is N/A; -i steps add; sizes accept suffixes.
  run nocheck allreduce -t 3 -b 1K -e 3K -i 1K -n 2 -w 0 -c 0 -d int32 &&
    check_table "$tmp/nocheck.out" 3 0 "allreduce -c 0 -i 1K" &&
    { [ "$(awk '!/^#/ && NF > 0 { print $1 }' "$tmp/nocheck.out" | tr '\n' ' ')" = "1024 2048 3072 " ] ||
      fail "-b 1K -e 3K -i 1K should give sizes 1024 2048 3072"; }

  # busbw = algbw * 2(n-1)/n for all-reduce (n=4: 1.5x), = algbw for broadcast.
  # Both columns are rounded to 0.01, so allow 0.005 + 1.5 * 0.005.
  awk '!/^#/ && NF > 0 { d = $8 - 1.5 * $7; if (d < -0.0126 || d > 0.0126) bad = 1 } END { exit bad }' \
    "$tmp/ar4.out" || fail "all-reduce busbw/algbw at 4 ranks is not 1.5"
  awk '!/^#/ && NF > 0 && $7 != $8 { bad = 1 } END { exit bad }' "$tmp/bc4.out" ||
    fail "broadcast busbw differs from algbw"

  # csv: a header once, then one row per size per run, appended.
  local csv=$tmp/runs.csv
  run csv1 allreduce -t 2 -b 1K -e 64K -f 4 -n 2 -w 1 --csv "$csv" --label two &&
    run csv2 allreduce -t 4 -b 1K -e 64K -f 4 -n 2 -w 1 --csv "$csv" --label four && {
      local lines heads
      lines=$(wc -l <"$csv")
      heads=$(grep -c '^size,count,type,redop,root,oop_time_us' "$csv")
      [ "$lines" -eq 9 ] && [ "$heads" -eq 1 ] || fail "csv: $lines lines ($heads headers), expected 1 header + 2 x 4 rows"
      # The CPU columns: a number of microseconds per call each, and some
      # CPU time spent over the whole run.
      awk -F, 'NR > 1 && (NF != 17 || $9 != "0" || $13 != "0" || $16 !~ /^[0-9.]+$/ || $17 !~ /^[0-9.]+$/) { bad = 1 }
        NR > 1 { cpu += $16 + $17 } END { exit bad || cpu <= 0 }' "$csv" ||
        fail "csv rows must have 17 fields, 0 wrong and CPU times"
      [ "$(awk -F, 'NR > 1 { print $14 "/" $15 }' "$csv" | sort -u | tr '\n' ' ')" = "2/two 4/four " ] ||
        fail "csv: nranks/label columns wrong"
      ok
    }
  printf 'not,a,braid,csv\n' >"$tmp/other.csv"
  "$bench" allreduce -t 2 -b 1K -e 1K -n 1 -w 0 --csv "$tmp/other.csv" >/dev/null 2>"$tmp/other.err"
  [ $? = 2 ] && grep -q 'not a braid-bench csv' "$tmp/other.err" || fail "a foreign csv must be refused (exit 2)"

  # --plot: a PNG, when gnuplot is installed.
  if command -v gnuplot >/dev/null 2>&1; then
    if run plot allreduce -t 2 -b 1K -e 1M -f 8 -n 2 -w 1 --plot "$tmp/bw.png"; then
      [ "$(head -c 4 "$tmp/bw.png" | od -An -tx1 | tr -d ' \n')" = 89504e47 ] || fail "--plot did not write a PNG"
      ok
    fi
    bench_dir=$(dirname "$0")/../bench
    if [ -x "$bench_dir/plot.sh" ]; then
      "$bench_dir/plot.sh" "$tmp/both.png" "$csv" "$csv" >/dev/null 2>"$tmp/plotsh.err" &&
        [ -s "$tmp/both.png" ] || fail "bench/plot.sh failed: $(cat "$tmp/plotsh.err")"
      # Against peers: nccl-tests' table (braid-bench prints the same) and torch-gloo-bench's lines.
      printf 'torch-gloo ranks=2 bytes=%s time_us=%s busbw_GBps=%s cpu_us=1 ok=1\n' \
        1024 30 0.05 131072 200 0.9 >"$tmp/gloo.txt"
      "$bench_dir/plot.sh" "$tmp/peers.png" "$csv" "$tmp/plot.out" "$tmp/gloo.txt" >"$tmp/peers.msg" \
        2>"$tmp/plotsh.err" && [ "$(head -c 4 "$tmp/peers.png" | od -An -tx1 | tr -d ' \n')" = 89504e47 ] &&
        grep -q '(4 series)' "$tmp/peers.msg" ||
        fail "bench/plot.sh with nccl-tests and torch-gloo input: $(cat "$tmp/peers.msg" "$tmp/plotsh.err")"
      printf 'nothing to plot\n' >"$tmp/junk.txt"
      "$bench_dir/plot.sh" "$tmp/junk.png" "$tmp/junk.txt" >/dev/null 2>"$tmp/junk.err"
      [ $? = 2 ] && grep -q 'neither a braid-bench csv' "$tmp/junk.err" || fail "plot.sh must refuse a foreign file"
    fi
  else
    echo "note: gnuplot not installed, --plot not tested"
    env PATH=/nonexistent "$bench" allreduce -t 2 -b 1K -e 1K -n 1 --plot "$tmp/x.png" >/dev/null 2>"$tmp/np.err"
    grep -q gnuplot "$tmp/np.err" || fail "--plot without gnuplot must say so"
  fi

  # Usage errors: exit 2 with a reason, before any rank starts.
  "$bench" allreduce -t 2 -d float17 >/dev/null 2>"$tmp/e1"; rc=$?
  [ $rc = 2 ] && grep -q "unknown datatype 'float17'" "$tmp/e1" || fail "bad -d must exit 2 with a reason (got $rc)"
  "$bench" broadcast -t 2 -r 5 -b 1K -e 1K >/dev/null 2>"$tmp/e2"; rc=$?
  [ $rc = 2 ] && grep -q "root 5 is not a rank" "$tmp/e2" || fail "-r 5 at 2 ranks must exit 2 (got $rc)"
  "$bench" reduce_scatterx >/dev/null 2>"$tmp/e3"; rc=$?
  [ $rc = 2 ] || fail "unknown collective must exit 2 (got $rc)"
  "$bench" allreduce -b 1M -e 1K >/dev/null 2>"$tmp/e4"; rc=$?
  [ $rc = 2 ] || fail "minbytes > maxbytes must exit 2 (got $rc)"
  "$bench" allreduce -g 0 >/dev/null 2>"$tmp/e5"; rc=$?
  [ $rc = 2 ] && grep -q "invalid gpu count '0'" "$tmp/e5" || fail "-g 0 must exit 2 with a reason (got $rc)"
  # nccl-tests options that cannot apply say why; their defaults pass.
  local opt
  for opt in "-G 1:CUDA graphs" "-R 1:buffer registration" "-D 1:device-initiated" \
    "-d f8e4m3:braid has no f8e4m3 dtype"; do
    "$bench" allreduce ${opt%%:*} >/dev/null 2>"$tmp/e7"; rc=$?
    [ $rc = 2 ] && grep -q -- "${opt%%:*} is not supported: .*${opt#*:}" "$tmp/e7" ||
      fail "$opt must exit 2 saying why (got $rc: $(cat "$tmp/e7"))"
  done
  "$bench" --help >"$tmp/help" || fail "--help must exit 0"
  for w in uint32 uint64 mulsum; do
    grep -qw "$w" "$tmp/help" || fail "--help does not list $w"
  done
  # A failed braid call is printed once, its status name once.
  BRAID_TRANSPORT=carrier-pigeon "$bench" allreduce -t 2 -b 1K -e 1K -n 1 >/dev/null 2>"$tmp/e6"; rc=$?
  [ $rc = 3 ] && grep -q 'joining the group failed: BRAID_ERR_' "$tmp/e6" &&
    ! grep -Eq 'BRAID_ERR_[A-Z_]+: BRAID_ERR_' "$tmp/e6" && ! grep -q 'WARN.*none of the requested' "$tmp/e6" ||
    fail "a failed join must print its status once, no WARN copy (got $rc: $(head -c 400 "$tmp/e6"))"
  # nccl-tests' flags, same meaning. -t and -g multiply to the ranks per
  # process: -t 2 -g 2 forks 4 ranks.
  run tg allreduce -t 2 -g 2 -b 1K -e 1K -n 2 -w 0 -G 0 -R 0 -p 1 -y 0 &&
    check_table "$tmp/tg.out" 1 1 "allreduce -t 2 -g 2" &&
    { [ "$(grep -c '^#  Rank ' "$tmp/tg.out")" = 4 ] && grep -q '^# nThread 2 nGpus 2 ' "$tmp/tg.out" &&
      head -n 1 "$tmp/tg.out" | grep -q 'ranks 0-3 ' || fail "-t 2 -g 2 must run 4 ranks"; }
  # -N: run_cycles, the sweep printed N times; -c 3: three checks per size.
  run cycles allreduce -t 2 -b 1K -e 4K -f 4 -n 2 -w 0 -N 3 -c 3 &&
    check_table "$tmp/cycles.out" 6 1 "allreduce -N 3 -c 3" &&
    { grep -q ' validation: 3 ' "$tmp/cycles.out" || fail "-c 3 must show validation: 3"; }
  # -m (a group of collectives per iteration), -z 1 (blocking), -C 1.
  run agg allreduce -t 3 -b 1K -e 64K -f 8 -n 3 -w 1 -m 4 &&
    check_table "$tmp/agg.out" 3 1 "allreduce -m 4" &&
    { grep -q ' agg iters: 4 ' "$tmp/agg.out" || fail "-m 4 must show agg iters: 4"; }
  run blocking allreduce -t 2 -b 1K -e 64K -f 8 -n 3 -w 1 -z 1 -C 1 &&
    check_table "$tmp/blocking.out" 3 1 "allreduce -z 1 -C 1"
  # Under a launcher each process runs -t ranks: one process, -t 2.
  local port=$((20000 + RANDOM % 12000)) # below the ephemeral range
  env RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 300 "$bench" allreduce -t 2 \
    -b 1K -e 1K -n 2 -w 0 >"$tmp/envt.out" 2>"$tmp/envt.err" &&
    check_table "$tmp/envt.out" 1 1 "launcher -t 2" &&
    { [ "$(grep -c '^#  Rank ' "$tmp/envt.out")" = 2 ] || fail "launcher with -t 2 must run 2 ranks"; } ||
    fail "launcher with -t 2 failed: $(head -c 400 "$tmp/envt.err")"
  # No flags at all: an all-reduce of 32 MiB on 4 local ranks, verified.
  run noflags && check_table "$tmp/noflags.out" 1 1 "braid-bench without flags" &&
    { [ "$(grep -c '^#  Rank ' "$tmp/noflags.out")" = 4 ] &&
      awk '!/^#/ && NF > 0 { exit !($1 == 33554432 && $3 == "float" && $4 == "sum") }' "$tmp/noflags.out" ||
      fail "braid-bench without flags must all-reduce 32M floats on 4 ranks"; }
  # Device buffers: the default on a GPU (verified); --buffers device
  # elsewhere exits 2 with the reason from every rank, never a crash.
  timeout 300 "$bench" allreduce -t 2 --buffers device -b 1K -e 32M -f 8 -n 2 -w 1 -c 1 -d float -o sum \
    >"$tmp/g.out" 2>"$tmp/g.err"; rc=$?
  if [ $rc = 0 ]; then
    check_table "$tmp/g.out" 6 1 "--buffers device on a GPU (32M: the device ring)"
    head -n 1 "$tmp/g.out" | grep -q 'device memory' || fail "--buffers device: first line must say device memory"
    head -n 1 "$tmp/noflags.out" | grep -q 'device memory' ||
      fail "on a GPU the default is device buffers: $(head -n 1 "$tmp/noflags.out")"
  else
    [ $rc = 2 ] && [ "$(grep -c -- '--buffers device needs a CUDA device: ' "$tmp/g.err")" = 2 ] ||
      fail "--buffers device without a GPU must exit 2 with a reason from each rank (got $rc: $(head -c 300 "$tmp/g.err"))"
    head -n 1 "$tmp/ar2.out" | grep -q '^# braid: ranks 0-1 host memory, shm$' ||
      fail "without a GPU the default is host memory over shm: $(head -n 1 "$tmp/ar2.out")"
  fi
  ok
}

netns_tests() {
  local nb=${1:?netns mode needs the netns-bench path}
  local probe=braid-nb-probe-$$
  if [ "$(id -u)" != 0 ]; then
    echo "SKIP: network namespaces need root"; exit 77
  fi
  if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
    echo "SKIP: iproute2 (ip, tc) is not installed"; exit 77
  fi
  if ! ip netns add "$probe" 2>"$tmp/probe.err"; then
    echo "SKIP: 'ip netns add' is not permitted here: $(cat "$tmp/probe.err")"; exit 77
  fi
  ip netns del "$probe"
  local tag=braid-nb-t$$
  timeout 300 "$nb" -n 2 --rate 1gbit --delay 0.1ms --tag "$tag" --bench "$bench" -- \
    allreduce -b 1M -e 1M -n 3 -w 1 -c 1 >"$tmp/nb.out" 2>"$tmp/nb.err"
  local rc=$?
  if [ $rc != 0 ]; then
    fail "netns-bench exited $rc"
    sed 's/^/  | /' "$tmp/nb.err" | tail -n 20 >&2
  else
    check_table "$tmp/nb.out" 1 1 "netns-bench 2 ranks"
    grep -Eq '^# link 1gbit = 0.1250 GB/s: +1048576 B .*= +[0-9.]+%' "$tmp/nb.out" ||
      fail "netns-bench printed no busbw/link summary"
    # The link is shaped: busbw cannot beat 1 Gbit/s by more than tbf's burst.
    awk '!/^#/ && NF == 13 && $8 > 0.14 { bad = 1 } END { exit bad }' "$tmp/nb.out" ||
      fail "busbw above the 1gbit link rate: shaping not applied"
  fi
  local left
  left=$(ip netns list | awk -v t="$tag-" 'index($1, t) == 1 { print $1 }')
  [ -z "$left" ] || fail "netns-bench left namespaces behind: $left"

  # Stopped mid-run (SIGTERM), it must still remove every namespace.
  local ktag=braid-nb-k$$ pid i
  "$nb" -n 2 --rate 1gbit --tag "$ktag" --bench "$bench" -- allreduce -b 64M -e 64M -n 100 -w 0 -c 0 \
    >"$tmp/nbk.out" 2>&1 &
  pid=$!
  for ((i = 0; i < 100; i++)); do
    grep -q '^#  Rank  1' "$tmp/nbk.out" && break
    sleep 0.1
  done
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null
  left=$(ip netns list | awk -v t="$ktag-" 'index($1, t) == 1 { print $1 }')
  [ -z "$left" ] || fail "netns-bench stopped by SIGTERM left namespaces behind: $left"
  ok
}

case $mode in
  local) local_tests ;;
  netns) netns_tests "${3:-}" ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
echo "$checks checks passed, $failures failures"
[ "$failures" = 0 ]
