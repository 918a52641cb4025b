#!/usr/bin/env bash
# Tests for scripts/gpu-check --quick, without a GPU: a fake payload of
# small shell scripts standing in for the binaries (named as in the payload
# gpu-payload builds), a fake nvidia-smi, python3 and MPS control on PATH,
# and GPU_CHECK_ASSUME_GPU=1 to pass the GPU detection. Checks the verdict
# lines, the summary, the device-collective log requirement, MPS start and
# stop, the figures against their targets, the deadline (a step that
# ignores SIGTERM is cut and killed by it, later steps do not start), the
# budget refusal, and the no-GPU and no-payload runs. About 7 s.
#
# usage: test_gpu_check.sh SCRIPTS/GPU-CHECK
set -uo pipefail

gc=${1:?usage: test_gpu_check.sh SCRIPTS/GPU-CHECK}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_gpu_check.XXXXXX")
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
failures=0

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
# has FILE PATTERN WHAT: FILE has a line matching the extended regex PATTERN.
has() { grep -qE -- "$2" "$1" || fail "$3: no line matching '$2' in $1"; }

code=$(sed -n 's/^#define NCCL_VERSION_CODE \([0-9]*\).*/\1/p' "$(dirname "$gc")/../include/nccl.h")
devcoll_line='rank 0: device collectives on: every rank mapped every region; 8 blocks a call at most'

# fake PATH NAME BODY: an executable shell script.
fake() {
    mkdir -p "$(dirname "$1")"
    printf '#!/usr/bin/env bash\n%s\n' "$2" > "$1"
    chmod +x "$1"
}

# FAKE_HANG=NAME makes that program hang and ignore SIGTERM.
# shellcheck disable=SC2016 # expanded by the fakes
hang='[ "${FAKE_HANG:-}" != "$(basename "$0")" ] || { trap "" TERM; sleep 60; }'
p=$tmp/payload
fake "$p/bc/tests/test_cuda" "$hang
echo '100%: Checks: 94, Failures: 0, Errors: 0'"
# nccl-tests: the wrap build must get NCCL_TESTS_WRAP_DEVICES=1; -t 2 gives wrong results.
nt_body="echo '# nccl-tests version 2.19.6 nccl-headers=$code nccl-library=$code'
case \$LD_LIBRARY_PATH in */bc/src/nccl:*) ;; *) echo 'not braid first'; exit 3 ;; esac
echo '           8             2     float     sum      -1    30.00    0.00    0.00       0    29.00    0.00    0.00       0'"
fake "$p/nccl-tests/stock/all_reduce_perf" "$nt_body
echo '# Out of bounds values : 0 OK'"
fake "$p/nccl-tests/wrap/all_reduce_perf" "$nt_body
[ \"\${NCCL_TESTS_WRAP_DEVICES:-}\" = 1 ] || exit 4
case \" \$* \" in *' -t 2 '*) echo '# Out of bounds values : 2 FAILED'; exit 1 ;; esac
echo '# Out of bounds values : 0 OK'"
# With BRAID_DEVCOLL=1 the kernels stay off here: the step must fail for it.
fake "$p/bc/tests/test_nccl_gpu" "[ \"\${BRAID_DEVCOLL:-}\" != 1 ] || {
    [ \"\$BRAID_DEBUG\" = INFO ] || exit 5
    [ -d \"\${CUDA_MPS_PIPE_DIRECTORY:-/none}\" ] || exit 6
    echo 'rank 0: device collectives off: not every rank has a mapped region' >&2
}
echo '100%: Checks: 5, Failures: 0, Errors: 0'"
fake "$p/bc/tests/test_cuda_coll" "case \$CK_RUN_CASE in
devcoll_dead_3)
    [ \"\${BRAID_DEVCOLL:-}\" = 1 ] && [ \"\$BRAID_DEBUG\" = INFO ] || exit 5
    [ -d \"\${CUDA_MPS_PIPE_DIRECTORY:-/none}\" ] || exit 6
    echo '$devcoll_line' >&2 ;;
pieces_1 | pieces_2 | threads_2 | matrix_2) ;;
*) exit 7 ;;
esac
echo '100%: Checks: 1, Failures: 0, Errors: 0'"
# One dtype below 0.9 of copy: the kernel bench fails naming it.
fake "$p/bc/tests/braid-kernel-bench" "printf '%12s %8s %6s %10s %10s %12s\n' bytes type op GB/s 'copy GB/s' 'of copy'
echo '    67108864      f32    sum     3900.0     3864.1        1.009'
echo '   268435456      f32    sum     4034.0     4156.4        0.971'
echo '   268435456      f16    sum     2277.4     4156.4        0.548'
echo '   268435456  f16>f32    sum     4000.0     4156.4        0.962'
echo '# fused reduce at 268435456 bytes: at least 0.548 of cudaMemcpy D2D bandwidth (lowest: f16), target 0.90: FAIL'
exit 1"
fake "$p/bc/bench/braid-bench" "[ \"\${BRAID_DEVCOLL:-}\" = 1 ] && echo '$devcoll_line' >&2
echo '# braid: ranks 0-1 device memory, cuda_ipc'
echo '           8             2     float     sum      -1     9.50    0.00    0.00      0    10.10    0.00    0.00      0'
echo '      262144         65536     float     sum      -1    20.00   13.11   13.11      0    20.00   13.11   13.11      0'
echo '   268435456      67108864     float     sum      -1   1200.0  223.70  447.40      0   1190.0  225.58  451.16      0'
echo '# Out of bounds values : 0 OK'"
mkdir -p "$p/bc/src/nccl"
: > "$p/bc/src/nccl/libnccl.so.2"
echo "commit fake" > "$p/VERSION"
mkdir -p "$tmp/gz" "$tmp/xz" "$tmp/empty"
tar -czf "$tmp/gz/payload.tar.gz" -C "$p" .

bin=$tmp/bin
fake "$bin/nvidia-smi" "case \$1 in -L) echo 'GPU 0: NVIDIA Fake (UUID: GPU-0)' ;; *) echo 'name, memory.total [MiB], driver_version'; echo 'NVIDIA Fake, 81559 MiB, 580.00' ;; esac"
fake "$bin/python3" "echo 'SKIP: torch sees no CUDA device'; exit 77"
fake "$bin/nvidia-cuda-mps-control" "log=\$CUDA_MPS_LOG_DIRECTORY/control.log
if [ \"\${1:-}\" = -d ]; then echo 'fake mps: started' >> \"\$log\"; else read -r c; echo \"fake mps: \$c\" >> \"\$log\"; fi"

# run NAME ARGS...: gpu-check --quick with the fakes, output in $tmp/NAME.out.
run() {
    local name=$1
    shift
    mkdir -p "$tmp/t"
    TMPDIR=$tmp/t PATH=$bin:$PATH GPU_CHECK_ASSUME_GPU=1 "$gc" --quick "$@" > "$tmp/$name.out" 2>&1
}

# verdicts FILE N: N verdict lines, each of the three forms, and the final line.
verdicts() {
    local n
    n=$(grep -cE '^(PASS [a-z0-9_]+ \([0-9]+s\)|FAIL [a-z0-9_]+ \([0-9]+s\): .+|TIMEOUT [a-z0-9_]+ \([0-9]+s\))$' "$1")
    [ "$n" -eq "$2" ] || fail "$1: $n verdict lines, want $2"
}

# 1. Every step runs; the fakes decide each verdict.
run all "$tmp/gz" "$tmp/all-logs"
rc=$?
o=$tmp/all.out
[ $rc -eq 1 ] || fail "all: exit $rc, want 1"
has "$o" '^gpu-check quick: budget [0-9]+s at most of 420: ' "budget line"
verdicts "$o" 15
for s in info cuda nt_all_reduce_1 nt_all_reduce_g2 nccl_gpu cuda_coll_pieces_1 cuda_coll_pieces_2 \
    cuda_coll_threads_2 cuda_coll_devcoll_dead_3 cuda_coll_matrix_2 bench_devcoll_g2; do
    has "$o" "^PASS $s \\(" "$s passes"
done
has "$o" "^FAIL nt_all_reduce_t2 \\([0-9]+s\\): exit 1; wrong results" "nccl-tests wrong results"
has "$o" "^FAIL nccl_gpu_devcoll \\([0-9]+s\\): device collectives never on" "devcoll log required"
has "$o" "^FAIL torch_nccl \\([0-9]+s\\): skipped: SKIP: torch sees no CUDA device" "exit 77 fails"
has "$o" "^FAIL kernel_bench \\([0-9]+s\\): exit 1; below 0.9 of copy: f16 sum 0.548$" "kernel figure below target"
has "$o" "^   kernel f32 sum at 256 MiB: 0.971 of a D2D copy \\(target >= 0.9\\): ok" "kernel figure"
has "$o" "^   kernel f16>f32 sum at 256 MiB: 0.962 " "kernel figure, casting"
has "$o" "^   device all-reduce busbw, 2 ranks, 256 MiB: 447.40 GB/s \\(target >= 400 GB/s.*: ok$" "busbw figure"
has "$o" "^   device all-reduce latency, 2 ranks, 8 B: 10.10 us \\(target <= 12 us.*: ok$" "latency figure"
has "$o" "^   mps: on" "mps started"
[ "$(grep -c '^   mps: on' "$o")" -eq 2 ] || fail "mps: want it on for two steps"
[ "$(grep -c 'fake mps: started' "$tmp/all-logs/all.log")" -eq 2 ] || fail "mps: two starts in all.log"
[ "$(grep -c 'fake mps: quit' "$tmp/all-logs/all.log")" -eq 2 ] || fail "mps: two quits in all.log"
has "$o" "^   NVIDIA Fake, 81559 MiB" "machine info"
[ "$(tail -n 1 "$o")" = "gpu-check quick: 11 passed, 4 failed" ] || fail "all: last line: $(tail -n 1 "$o")"
[ "$(tail -n 1 "$tmp/all-logs/summary.txt")" = "gpu-check quick: 11 passed, 4 failed" ] ||
    fail "all: summary's last line: $(tail -n 1 "$tmp/all-logs/summary.txt")"
[ -z "$(ls -A "$tmp/t")" ] || fail "all: left behind in TMPDIR: $(ls "$tmp/t")"

# 2. The deadline: test_cuda hangs ignoring SIGTERM; its cap is cut to end
# by the deadline (SIGKILL after the grace) and no later step starts. The
# payload as .tar.xz, where xz is installed.
pk=$tmp/gz
if command -v xz > /dev/null; then
    tar -cJf "$tmp/xz/payload.tar.xz" -C "$p" .
    pk=$tmp/xz
fi
t0=$SECONDS
FAKE_HANG=test_cuda GPU_CHECK_DEADLINE=5 run hang "$pk" "$tmp/hang-logs"
took=$((SECONDS - t0))
o=$tmp/hang.out
verdicts "$o" 15
has "$o" '^PASS info ' "info before the hang"
has "$o" '^TIMEOUT cuda \([345]s\)$' "the hang times out by the deadline"
[ "$(grep -c ': not started: deadline$' "$o")" -eq 13 ] || fail "hang: want 13 steps not started"
has "$o" '^FAIL bench_devcoll_g2 \(0s\): not started: deadline$' "last step not started"
[ "$(tail -n 1 "$o")" = "gpu-check quick: 1 passed, 14 failed" ] || fail "hang: last line: $(tail -n 1 "$o")"
[ $took -le 7 ] || fail "hang: took ${took}s past a 5 s deadline"
[ -z "$(ls -A "$tmp/t")" ] || fail "hang: left behind in TMPDIR: $(ls "$tmp/t")"

# 3. No payload: every step fails saying so, nothing runs.
run empty "$tmp/empty" "$tmp/empty-logs"
rc=$?
verdicts "$tmp/empty.out" 15
[ $rc -eq 1 ] || fail "empty: exit $rc, want 1"
[ "$(grep -c '^FAIL [a-z0-9_]* (0s): no payload: .*payload.tar.gz missing' "$tmp/empty.out")" -eq 15 ] ||
    fail "empty: want 15 'no payload' failures"

# 4. No GPU (only where this machine has none): every step fails at once.
if [ ! -e /dev/nvidiactl ] && ! command -v nvidia-smi > /dev/null; then
    "$gc" --quick "$tmp/gz" "$tmp/nogpu-logs" > "$tmp/nogpu.out" 2>&1
    [ "$(grep -c '^FAIL [a-z0-9_]* (0s): no NVIDIA GPU: /dev/nvidiactl missing and nvidia-smi not found$' "$tmp/nogpu.out")" -eq 15 ] ||
        fail "nogpu: want 15 'no NVIDIA GPU' failures"
    [ "$(tail -n 1 "$tmp/nogpu.out")" = "gpu-check quick: 0 passed, 15 failed" ] || fail "nogpu: last line"
fi

# 5. Caps over the budget: refused before anything runs.
mkdir -p "$tmp/over/scripts"
sed 's/^torch_nccl 60$/torch_nccl 90/' "$gc" > "$tmp/over/scripts/gpu-check"
chmod +x "$tmp/over/scripts/gpu-check"
"$tmp/over/scripts/gpu-check" --quick "$tmp/gz" "$tmp/over-logs" > "$tmp/over.out" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "over budget: exit $rc, want 2"
has "$tmp/over.out" 'more than 420 s: refusing' "over budget"
[ ! -e "$tmp/over-logs" ] || fail "over budget: wrote logs"

if [ $failures -ne 0 ]; then
    for f in "$tmp"/*.out; do
        echo "--- $f"
        cat "$f"
    done
    echo "$failures failure(s)"
    exit 1
fi
echo "gpu-check quick mode: all checks passed"
