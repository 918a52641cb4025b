#!/usr/bin/env bash
# `pip install ./python` into a fresh virtual environment, offline, then the
# installed package (imported away from the source tree) loads the libbraid
# that pkg-config's braid.pc names, without BRAID_LIBRARY or
# LD_LIBRARY_PATH, and all-reduces over 2 ranks.
#
# usage: test_python_pkg.sh SOURCE_ROOT BUILD_DIR
# Uses Debian's python3 (venv, setuptools, wheel, numpy; scripts/deps.sh
# test installs them); exits 77 (skipped) where they are missing. The
# build tree's uninstalled braid.pc stands for an installed one: both give
# the library's directory in `pkg-config --libs braid`.
set -uo pipefail
src=${1:?usage: test_python_pkg.sh SOURCE_ROOT BUILD_DIR}
build=$(cd "${2:?usage: test_python_pkg.sh SOURCE_ROOT BUILD_DIR}" && pwd)
py=/usr/bin/python3
if ! [ -x $py ] || ! $py -c 'import venv, setuptools, wheel, numpy' 2>/dev/null; then
  echo "SKIP: Debian's python3 with venv, setuptools, wheel and numpy is needed (scripts/deps.sh test)"
  exit 77
fi
command -v pkg-config >/dev/null || { echo "SKIP: pkg-config is not installed"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_python_pkg.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

$py -m venv --system-site-packages "$tmp/venv" || { echo "FAIL: venv"; exit 1; }
# A copy of python/: pip builds in place, and the source tree stays clean.
cp -r "$src/python" "$tmp/python"
export PKG_CONFIG_PATH=$build/meson-uninstalled
unset BRAID_LIBRARY LD_LIBRARY_PATH PYTHONPATH
start=$(date +%s.%N)
if ! "$tmp/venv/bin/pip" install --no-build-isolation --no-index --no-deps -q "$tmp/python" >"$tmp/pip.log" 2>&1; then
  echo "FAIL: pip install ./python"; cat "$tmp/pip.log"; exit 1
fi
echo "pip install: $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
rm -rf "$tmp/python" # nothing may come from the copy
cd "$tmp" || exit 1
unset PKG_CONFIG_PATH # the recorded path alone must do
"$tmp/venv/bin/python" - "$build" <<'PY'
import multiprocessing as mp
import os
import sys

import numpy as np

import braid

build = sys.argv[1]
where = os.path.realpath(braid.__file__)
assert "/site-packages/braid/" in where, "braid imported from %s, not the venv" % where
lib = os.path.realpath(braid.library_path)
assert lib == os.path.realpath(os.path.join(build, "libbraid.so.0")), "loaded %s" % braid.library_path
from braid import _install
assert _install.LIBRARY, "setup.py recorded no library"


def rank(r, uid, q):
    pg = braid.ProcessGroup(rank=r, size=2, unique_id=uid)
    a = np.arange(1000, dtype=np.float32) * (r + 1)
    pg.allreduce(a, op="sum")
    q.put((r, bool(np.array_equal(a, np.arange(1000, dtype=np.float32) * 3))))


ctx = mp.get_context("fork")
uid = braid.unique_id()
q = ctx.Queue()
procs = [ctx.Process(target=rank, args=(r, uid, q)) for r in range(2)]
for p in procs:
    p.start()
results = dict(q.get(timeout=120) for _ in procs)
for p in procs:
    p.join(60)
assert results == {0: True, 1: True}, results
print("installed package %s loaded %s; 2-rank all-reduce exact" % (where, lib))
PY
rc=$?
[ $rc = 0 ] || { echo "FAIL: the installed package does not work"; exit 1; }
echo "ok"
