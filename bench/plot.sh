#!/usr/bin/env bash
# Plot bus bandwidth against message size for one or more braid-bench csv
# files (written with --csv) on one chart. Each distinct label/type/op in each
# file is one series; files or labels let you compare runs, rank counts,
# algorithms or builds. Two other inputs are read too, to compare braid with
# its peers: the text output of nccl-tests (or of braid-bench, which prints
# the same table), and the lines of scripts/torch-gloo-bench; each file is a
# series named after it.
#
# usage: plot.sh [--ip] [--title TEXT] OUT.png FILE [FILE ...]
#   --ip     plot the in-place columns (default: out-of-place, like nccl-tests
#            summaries)
# Installed as braid-bench-plot. Needs gnuplot (Debian: gnuplot-nox).
set -euo pipefail

col=8
title="braid-bench: busbw vs size"
while [ $# -gt 0 ]; do
  case $1 in
    --ip) col=12; shift ;;
    --title) title=${2:?--title needs a value}; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    --) shift; break ;;
    -*) echo "plot.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then
  echo "usage: plot.sh [--ip] [--title TEXT] OUT.png FILE [FILE ...]" >&2
  exit 2
fi
command -v gnuplot >/dev/null 2>&1 || {
  echo "plot.sh: gnuplot not found in PATH (Debian: apt-get install gnuplot-nox)" >&2; exit 2; }
out=$1; shift

# gnuplot double-quoted string
q() { local s=${1//\\/\\\\}; printf '"%s"' "${s//\"/\\\"}"; }

header="size,count,type,redop,root,oop_time_us,oop_algbw,oop_busbw,oop_wrong,ip_time_us,ip_algbw,ip_busbw,ip_wrong,nranks,label,oop_cpu_us,ip_cpu_us"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/plot.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# as_csv FILE: FILE itself when it is a braid-bench csv, else a csv made
# from nccl-tests' table or torch-gloo-bench's lines (label: the file's
# name), else nothing.
as_csv() {
  local f=$1 out first name
  first=$(head -n 1 "$f" | tr -d '\r')
  if [ "$first" = "$header" ]; then echo "$f"; return; fi
  name=$(basename "$f"); name=${name%.*}; name=${name//,/ }
  out="$tmp/$(printf '%03d' "$(ls "$tmp" | wc -l)").csv"
  {
    echo "$header"
    # nccl-tests: size count type redop root, then time algbw busbw #wrong out of place and in place.
    awk -v label="$name" '!/^#/ && NF >= 13 && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ {
        print $1 "," $2 "," $3 "," $4 "," $5 "," $6 "," $7 "," $8 "," $9 "," $10 "," $11 "," $12 "," $13 ",0," label ",," }' "$f"
    # torch-gloo-bench: "torch-gloo ranks=N bytes=B time_us=T busbw_GBps=X ..." (one time for both halves).
    awk '$1 == "torch-gloo" { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        print v["bytes"] "," int(v["bytes"] / 4) ",float,sum,-1," v["time_us"] ",," v["busbw_GBps"] ",0," v["time_us"] ",," \
          v["busbw_GBps"] ",0," v["ranks"] ",torch-gloo " v["ranks"] "r,," }' "$f"
  } > "$out"
  [ "$(wc -l < "$out")" -gt 1 ] && echo "$out"
}

plots=()
for f in "$@"; do
  [ -r "$f" ] || { echo "plot.sh: cannot read $f" >&2; exit 2; }
  src=$f
  f=$(as_csv "$f") || true
  [ -n "$f" ] || { echo "plot.sh: $src is neither a braid-bench csv nor nccl-tests or torch-gloo-bench output" >&2; exit 2; }
  # One series per label/type/op, in order of first appearance.
  keys=$(awk -F, 'NR > 1 && NF >= 15 { k = $15 "\t" $3 "\t" $4; if (!(k in seen)) { seen[k] = 1; print k } }' "$f")
  [ -n "$keys" ] || continue
  ntypes=$(printf '%s\n' "$keys" | cut -f2 | sort -u | wc -l)
  nops=$(printf '%s\n' "$keys" | cut -f3 | sort -u | wc -l)
  while IFS=$'\t' read -r label type op; do
    t=$label
    [ $# -gt 1 ] && [ "$f" = "$src" ] && t="$(basename "$f" .csv): $t"
    [ "$ntypes" -gt 1 ] && t="$t $type"
    [ "$nops" -gt 1 ] && t="$t $op"
    plots+=("$(q "$f") every ::1 using (strcol(15) eq $(q "$label") && strcol(3) eq $(q "$type") && strcol(4) eq $(q "$op") ? \$1 : 1/0):$col with linespoints title $(q "$t")")
  done <<< "$keys"
done
[ ${#plots[@]} -gt 0 ] || { echo "plot.sh: no rows to plot" >&2; exit 2; }

which_half="out of place"; [ $col = 12 ] && which_half="in place"
{
  echo "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 1000,600 } else { set terminal png size 1000,600 }"
  echo "set output $(q "$out")"
  echo "set datafile separator ','"
  echo "set logscale x 2"
  echo "set format x '%.0b %BB'"
  echo "set grid"
  echo "set key top left"
  echo "set xlabel 'message size (bytes)'"
  echo "set ylabel 'bus bandwidth, $which_half (GB/s)'"
  echo "set title $(q "$title")"
  printf 'plot '
  sep=''
  for p in "${plots[@]}"; do printf '%s%s' "$sep" "$p"; sep=', \'$'\n''     '; done
  echo
} | gnuplot
echo "plot.sh: wrote $out (${#plots[@]} series)"
