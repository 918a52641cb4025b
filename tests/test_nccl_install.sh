#!/bin/sh
# Install the build into a scratch directory (meson install --destdir) and
# check what a user of the NCCL drop-in relies on:
#  - libnccl.so.2 (and the libnccl.so link) land in <libdir>/braid-nccl,
#    where <libdir> is meson's (lib/<multiarch> on Debian), and nccl.h in
#    <includedir>/braid-nccl, as docs/NCCL_COMPAT.md says;
#  - `pkg-config --cflags --libs nccl` finds braid's nccl.pc and gives
#    flags with which a program compiles, links and runs on braid's library;
#  - the installed braid-bench's run path is that libdir, so it starts
#    without LD_LIBRARY_PATH, and nccl-tests' *_perf names link to it.
# usage: test_nccl_install.sh BUILD_DIR SOURCE_DIR
set -eu
build=$1
src=$2
command -v pkg-config >/dev/null 2>&1 || { echo "pkg-config not found: skipping"; exit 77; }
cc=${CC:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

meson install -C "$build" --destdir "$tmp/root" --no-rebuild --quiet >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log"; echo "FAIL: meson install"; exit 1; }
opt() { meson introspect --buildoptions "$build" | python3 -c "import json,sys; print([o['value'] for o in json.load(sys.stdin) if o['name'] == '$1'][0])"; }
prefix=$(opt prefix)
libdir=$(opt libdir)
includedir=$(opt includedir)
case $libdir in /*) ;; *) libdir=$prefix/$libdir ;; esac
case $includedir in /*) ;; *) includedir=$prefix/$includedir ;; esac

fail=0
for f in "$libdir/braid-nccl/libnccl.so.2" "$libdir/braid-nccl/libnccl.so" "$includedir/braid-nccl/nccl.h" \
         "$libdir/pkgconfig/nccl.pc"; do
    if [ -e "$tmp/root$f" ]; then echo "installed: $f"; else echo "FAIL: $f not installed"; fail=1; fi
done
[ $fail = 0 ] || { find "$tmp/root" -name 'libnccl*' -o -name 'nccl.*'; exit 1; }
# An installed braid-bench starts without LD_LIBRARY_PATH: its run path is
# the libdir libbraid.so.0 goes to.
bindir=$(opt bindir)
case $bindir in /*) ;; *) bindir=$prefix/$bindir ;; esac
if command -v readelf >/dev/null 2>&1; then
    readelf -d "$tmp/root$bindir/braid-bench" | grep -E 'R(UN)?PATH' | grep -qF "[$libdir]" ||
        { readelf -d "$tmp/root$bindir/braid-bench" | grep -E 'R(UN)?PATH'; echo "FAIL: installed braid-bench has no run path to $libdir"; exit 1; }
    echo "installed: $bindir/braid-bench, run path $libdir"
fi
# nccl-tests' program names are links to braid-bench, each running its
# collective: a script written for nccl-tests runs unchanged.
for p in all_reduce all_gather broadcast reduce_scatter reduce alltoall alltoallv sendrecv gather scatter hypercube; do
    [ "$(readlink "$tmp/root$bindir/${p}_perf")" = braid-bench ] ||
        { echo "FAIL: $bindir/${p}_perf is not a link to braid-bench"; exit 1; }
done
echo "installed: $bindir/{all_reduce,...,hypercube}_perf -> braid-bench"
# The documented location, with Debian's multiarch libdir spelled out.
grep -q 'lib/<multiarch>/braid-nccl' "$src/docs/NCCL_COMPAT.md" ||
    { echo "FAIL: docs/NCCL_COMPAT.md does not give lib/<multiarch>/braid-nccl"; exit 1; }

# pkg-config sees the staged tree through its sysroot (-I and -L get the
# prefix); the run path keeps the final location, so the program is run
# with LD_LIBRARY_PATH pointing into the staged copy.
export PKG_CONFIG_PATH="$tmp/root$libdir/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$tmp/root" PKG_CONFIG_LIBDIR=
flags=$(pkg-config --cflags --libs nccl) || { echo "FAIL: pkg-config --cflags --libs nccl"; exit 1; }
echo "pkg-config --cflags --libs nccl: $flags"
echo "pkg-config --modversion nccl: $(pkg-config --modversion nccl)"
case $flags in *"-Wl,-rpath,"*"$libdir/braid-nccl"*) ;; *) echo "FAIL: no run path to $libdir/braid-nccl"; exit 1 ;; esac
cat > "$tmp/prog.c" <<'PROG'
#include <nccl.h>
#include <stdio.h>
#include <string.h>
int main(void)
{
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess || v != NCCL_VERSION_CODE)
        return 1;
    ncclUniqueId id;
    ncclComm_t comm;
    int x = 21;
    if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess ||
        ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comm, NULL) != ncclSuccess || x != 21 ||
        ncclCommDestroy(comm) != ncclSuccess)
        return 2;
    if (!strstr(ncclGetErrorString(ncclInternalError), "braid"))
        return 3; /* another libnccl answered */
    printf("built with pkg-config nccl, ran on braid's libnccl.so.2 (NCCL %d)\n", v);
    return 0;
}
PROG
# A sanitizer build's library needs its runtime in the program too.
sanitize=$(opt b_sanitize)
case $sanitize in none | "" | "[]") san= ;; *) san="-fsanitize=$(echo "$sanitize" | tr -d "[]' ")" ;; esac
# shellcheck disable=SC2086
"$cc" -std=c11 $san "$tmp/prog.c" -o "$tmp/prog" $flags || { echo "FAIL: compiling with pkg-config's flags"; exit 1; }
LD_LIBRARY_PATH="$tmp/root$libdir/braid-nccl" "$tmp/prog" || { echo "FAIL: the program (exit $?)"; exit 1; }
