#!/bin/sh
# Overlap benchmark: examples/ddp_mlp with gradients handed to the bucketer
# during backward (overlap on) versus after it (--no-overlap), on the same
# model, data and buckets. On/off runs alternate, REPEATS times each, and
# the table shows the median ms/step of each, so that drift in machine load
# hits both sides alike.
#
#   examples/bench_overlap.sh BUILD/examples/ddp_mlp [RANKS]
#   REPEATS=5 STEPS=20 examples/bench_overlap.sh ...
set -eu

exe=${1:?usage: bench_overlap.sh PATH/TO/ddp_mlp [RANKS]}
ranks=${2:-4}
repeats=${REPEATS:-3}
steps=${STEPS:-15}

# name|ddp_mlp arguments
configs="h1024-l2-b25|--hidden 1024 --layers 2
h1024-l2-b1|--hidden 1024 --layers 2 --bucket-mb 1
h2048-l2-b4|--hidden 2048 --layers 2 --bucket-mb 4
h1024-l4-b4|--hidden 1024 --layers 4 --bucket-mb 4"

median() {
    sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

field() { # field NAME < RESULT line
    tr ' ' '\n' | sed -n "s/^$1=//p"
}

printf '| ranks | model | params (MiB of grads) | buckets | overlap on ms/step | overlap off ms/step | speed-up | exposed wait on / off ms |\n'
printf '|---|---|---|---|---|---|---|---|\n'
echo "$configs" | while IFS='|' read -r name args; do
    on=""; off=""; won=""; woff=""; line=""
    i=0
    while [ "$i" -lt "$repeats" ]; do
        # shellcheck disable=SC2086 # args is a list of options
        line=$("$exe" -N "$ranks" --steps "$steps" --batch 256 --print-every 0 $args | grep '^RESULT')
        on="$on $(echo "$line" | field ms_per_step)"
        won="$won $(echo "$line" | field wait_ms)"
        # shellcheck disable=SC2086
        l2=$("$exe" -N "$ranks" --steps "$steps" --batch 256 --print-every 0 --no-overlap $args | grep '^RESULT')
        off="$off $(echo "$l2" | field ms_per_step)"
        woff="$woff $(echo "$l2" | field wait_ms)"
        i=$((i + 1))
    done
    params=$(echo "$line" | field params)
    buckets=$(echo "$line" | field buckets)
    m_on=$(echo "$on" | tr ' ' '\n' | sed '/^$/d' | median)
    m_off=$(echo "$off" | tr ' ' '\n' | sed '/^$/d' | median)
    w_on=$(echo "$won" | tr ' ' '\n' | sed '/^$/d' | median)
    w_off=$(echo "$woff" | tr ' ' '\n' | sed '/^$/d' | median)
    awk -v r="$ranks" -v n="$name" -v p="$params" -v b="$buckets" -v on="$m_on" -v off="$m_off" \
        -v won="$w_on" -v woff="$w_off" \
        'BEGIN { printf "| %s | %s | %.2fM (%.1f) | %s | %.1f | %.1f | %.2fx | %.1f / %.1f |\n", r, n, p / 1e6, p * 4 / 1048576, b, on, off, off / on, won, woff }'
done
