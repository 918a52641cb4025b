# Shared by the network-namespace tests (sourced, not run): skip/fail,
# namespace bookkeeping and a cleanup that kills every started process and
# deletes every namespace made, on any exit. The caller sets prog and tag
# (namespace name prefix) first, and appends to pids as it starts ranks.
# Needs root and iproute2; skips (77) with the reason otherwise.

skip() { echo "$prog: skip: $*"; exit 77; }
fail() { echo "$prog: FAIL: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"

made=()
pids=()
work=$(mktemp -d "${TMPDIR:-/tmp}/$tag.XXXXXX")

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  # Children too: a rank under timeout(1) outlives a killed timeout.
  for p in "${pids[@]}"; do pkill -KILL -P "$p" 2>/dev/null || true; kill -KILL "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  # Deleting a namespace removes its veth ends and qdiscs with it.
  for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  if [ $rc != 0 ] && [ $rc != 77 ]; then
    for f in "$work"/*.log "$work"/*.dbg; do
      [ -f "$f" ] || continue
      echo "--- $(basename "$f") (last lines)" >&2
      tail -n 8 "$f" >&2
    done
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

addns() {
  ip netns add "$1" 2>"$work/netns.err" || skip "cannot create a network namespace: $(cat "$work/netns.err")"
  made+=("$1")
}
