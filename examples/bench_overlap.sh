#!/bin/sh
# Overlap benchmark: examples/ddp_mlp with gradients handed to the bucketer
# during backward (overlap on) versus after it (--no-overlap), on the same
# model, data and buckets. On/off runs alternate, REPEATS times each, so
# that drift in machine load hits both sides alike; the table shows the
# median ms/step of each side, the speed-up (off / on: above 1 means
# overlap helps) and the median time spent waiting in finish(), and a
# summary line follows.
#
#   examples/bench_overlap.sh BUILD/examples/ddp_mlp [RANKS]
#   REPEATS=5 STEPS=20 examples/bench_overlap.sh ...
#   CONFIGS="h1024-l2-b1" REPEATS=1 STEPS=8 examples/bench_overlap.sh ...   # a quick look
#
# Time per step is only meaningful on an otherwise idle machine with a
# core per rank; the header prints the core count and load average.
set -eu

exe=${1:?usage: bench_overlap.sh PATH/TO/ddp_mlp [RANKS]}
ranks=${2:-4}
repeats=${REPEATS:-3}
steps=${STEPS:-15}
warmup=${WARMUP:-3}
only=${CONFIGS:-}

if [ ! -x "$exe" ]; then
    echo "bench_overlap.sh: $exe is not an executable ddp_mlp" >&2
    exit 2
fi
if [ "$steps" -le "$warmup" ]; then
    echo "bench_overlap.sh: STEPS ($steps) must exceed WARMUP ($warmup): warm-up steps are not timed" >&2
    exit 2
fi

# name|ddp_mlp arguments
all_configs="h1024-l2-b25|--hidden 1024 --layers 2
h1024-l2-b1|--hidden 1024 --layers 2 --bucket-mb 1
h2048-l2-b4|--hidden 2048 --layers 2 --bucket-mb 4
h1024-l4-b4|--hidden 1024 --layers 4 --bucket-mb 4"

configs=""
for c in $(echo "$all_configs" | cut -d'|' -f1); do
    if [ -z "$only" ] || echo " $only " | tr ',' ' ' | grep -q " $c "; then
        configs="$configs$(echo "$all_configs" | grep "^$c|")
"
    fi
done
if [ -z "$configs" ]; then
    echo "bench_overlap.sh: CONFIGS='$only' matches none of: $(echo "$all_configs" | cut -d'|' -f1 | tr '\n' ' ')" >&2
    exit 2
fi

median() {
    sed '/^$/d' | sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

field() { # field NAME < RESULT line
    tr ' ' '\n' | sed -n "s/^$1=//p"
}

# One run; prints its RESULT line, or the trainer's output and fails.
run_once() {
    out=$("$exe" -N "$ranks" --steps "$steps" --warmup "$warmup" --batch 256 --print-every 0 "$@" 2>&1) || {
        echo "bench_overlap.sh: ddp_mlp $* failed:" >&2
        echo "$out" >&2
        return 1
    }
    line=$(echo "$out" | grep '^RESULT') || {
        echo "bench_overlap.sh: ddp_mlp $* printed no RESULT line:" >&2
        echo "$out" >&2
        return 1
    }
    echo "$line"
}

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT

load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
printf 'overlap benchmark: %s ranks, %s steps (%s warm-up) x %s repeats per side, %s cores, load average %s\n\n' \
    "$ranks" "$steps" "$warmup" "$repeats" "$(nproc 2>/dev/null || echo "?")" "$load"
printf '| ranks | model | params (MiB of grads) | buckets | overlap on ms/step | overlap off ms/step | speed-up (off/on) | exposed wait on / off ms |\n'
printf '|---|---|---|---|---|---|---|---|\n'
echo "$configs" | sed '/^$/d' | while IFS='|' read -r name args; do
    on=""; off=""; won=""; woff=""; line=""
    i=0
    while [ "$i" -lt "$repeats" ]; do
        # shellcheck disable=SC2086 # args is a list of options
        line=$(run_once $args)
        on="$on $(echo "$line" | field ms_per_step)"
        won="$won $(echo "$line" | field wait_ms)"
        # shellcheck disable=SC2086
        l2=$(run_once --no-overlap $args)
        off="$off $(echo "$l2" | field ms_per_step)"
        woff="$woff $(echo "$l2" | field wait_ms)"
        i=$((i + 1))
    done
    params=$(echo "$line" | field params)
    buckets=$(echo "$line" | field buckets)
    m_on=$(echo "$on" | tr ' ' '\n' | median)
    m_off=$(echo "$off" | tr ' ' '\n' | median)
    w_on=$(echo "$won" | tr ' ' '\n' | median)
    w_off=$(echo "$woff" | tr ' ' '\n' | median)
    echo "$name $m_on $m_off" >>"$tmp"
    awk -v r="$ranks" -v n="$name" -v p="$params" -v b="$buckets" -v on="$m_on" -v off="$m_off" \
        -v won="$w_on" -v woff="$w_off" \
        'BEGIN { printf "| %s | %s | %.2fM (%.1f) | %s | %.1f | %.1f | %.2fx | %.1f / %.1f |\n", r, n, p / 1e6, p * 4 / 1048576, b, on, off, (on > 0 ? off / on : 0), won, woff }'
done

echo
awk '{ printf "summary %s: median step %.1f ms with overlap, %.1f ms without, speed-up %.2fx (%s)\n", $1, $2, $3, ($2 > 0 ? $3 / $2 : 0), ($3 > $2 ? "overlap faster" : ($3 < $2 ? "overlap slower" : "no difference")) }' "$tmp"
awk '{ on += $2; off += $3 } END { if (NR) printf "summary all: mean of medians %.1f ms with overlap, %.1f ms without, speed-up %.2fx over %d models\n", on / NR, off / NR, (on > 0 ? off / on : 0), NR }' "$tmp"
