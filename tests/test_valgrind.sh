#!/usr/bin/env bash
# braid-bench's ranks under valgrind memcheck, over TCP and shared memory:
# no invalid access, and nothing definitely or indirectly lost once every
# group is destroyed. Skips (77) without valgrind.
# usage: test_valgrind.sh BRAID_BENCH
set -u
bench=${1:?usage: test_valgrind.sh BRAID_BENCH}
command -v valgrind >/dev/null || { echo "SKIP: valgrind is not installed"; exit 77; }
status=0
for transport in tcp shm; do
  log=$(mktemp)
  BRAID_TRANSPORT=$transport valgrind --trace-children=yes --leak-check=full \
    --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect --error-exitcode=9 -q \
    "$bench" allreduce -t 3 -b 4 -e 1M -f 64 -n 2 -w 1 -c 1 -d all -o all >"$log" 2>&1
  rc=$?
  if [ $rc -ne 0 ] || grep -q "==[0-9]*== " "$log"; then
    echo "FAIL: valgrind over $transport (exit $rc):"
    { grep "==[0-9]*==" "$log" || tail -n 20 "$log"; } | head -60
    status=1
  else
    echo "ok: $transport, 3 ranks, clean"
  fi
  rm -f "$log"
done
exit $status
