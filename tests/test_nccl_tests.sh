#!/usr/bin/env bash
# Unmodified NVIDIA nccl-tests built against braid's nccl.h and
# libnccl.so.2 (docs/NCCL_COMPAT.md): the standard, independently written
# client of the NCCL API must compile and link against braid as it does
# against NCCL. The six *_perf binaries scripts/gpu-check runs are built,
# for one architecture, into this build directory (the source tree is
# only read: it may be read-only), and must load braid's libnccl.so.2 and
# report its version (nccl-library=). On a machine with a GPU,
# all_reduce_perf also runs one checked size.
#
#   test_nccl_tests.sh TREE OUT_DIR NCCL_H LIBNCCL_SO NVCC [ARCH]
#
# Exits 77 with the reason when TREE is empty or missing, there is no
# nvcc, or NCCL_TESTS_SKIP names a reason (sanitizer builds). Prints the build time.
set -u
tree=$1 out=$2 nccl_h=$3 libnccl=$4 nvcc=$5 arch=${6:-90}
if [ -n "${NCCL_TESTS_SKIP:-}" ]; then
    echo "SKIP: $NCCL_TESTS_SKIP"
    exit 77
fi
if [ -z "$tree" ]; then
    echo "SKIP: no nccl-tests tree given (meson option nccl_tests is empty)"
    exit 77
fi
if [ ! -f "$tree/src/common.cu" ]; then
    echo "SKIP: no nccl-tests source tree at $tree (meson option nccl_tests)"
    exit 77
fi
if [ ! -x "$nvcc" ]; then
    echo "SKIP: no nvcc ($nvcc): nccl-tests is CUDA code"
    exit 77
fi
cuda_home=$(cd "$(dirname "$nvcc")/.." && pwd)

# NCCL_HOME as nccl-tests expects it: include/nccl.h and lib/libnccl.so,
# both braid's. Braid's lib directory goes first on the link line:
# $cuda_home/lib64 may hold NVIDIA's own libnccl.so, which would win.
home=$out/nccl-home
rm -rf "$home"
mkdir -p "$home/include" "$home/lib" "$out/bin"
ln -s "$nccl_h" "$home/include/nccl.h"
ln -s "$libnccl" "$home/lib/libnccl.so"
ln -s "$libnccl" "$home/lib/libnccl.so.2"

perf="all_reduce broadcast reduce reduce_scatter all_gather sendrecv"
targets=
for t in $perf; do targets="$targets $out/bin/${t}_perf"; done
t0=$SECONDS
# shellcheck disable=SC2086
if ! make -C "$tree/src" -j"$(nproc)" MPI=0 BUILDDIR="$out/bin" CUDA_HOME="$cuda_home" NVCC="$nvcc" \
    NCCL_HOME="$home" CUDA_LIB="$home/lib -L$cuda_home/lib64" CUDARTLIB=cudart_static \
    NVCC_GENCODE="-gencode=arch=compute_$arch,code=sm_$arch" $targets > "$out/build.log" 2>&1; then
    tail -n 40 "$out/build.log"
    echo "FAIL: nccl-tests does not build against braid's nccl.h and libnccl.so.2 (log: $out/build.log)"
    exit 1
fi
echo "built ${perf// /, } (sm_$arch) in $((SECONDS - t0)) s"

failed=0
for t in $perf; do
    b=$out/bin/${t}_perf
    # The one libnccl it needs must resolve to braid's.
    got=$(LD_LIBRARY_PATH="$home/lib" ldd "$b" | awk '$1 == "libnccl.so.2" { print $3 }')
    if [ "$(readlink -f "$got")" != "$(readlink -f "$libnccl")" ]; then
        echo "FAIL: $b loads libnccl.so.2 from '$got', not braid's $libnccl"
        failed=1
    fi
done
[ $failed -eq 0 ] && echo "all six link braid's libnccl.so.2"

# Its first line names the library it runs on (printed before any device
# is touched): braid's version, not NVIDIA's.
want=$(sed -n 's/^#define NCCL_VERSION_CODE \([0-9]*\).*/\1/p' "$nccl_h")
first=$(LD_LIBRARY_PATH="$home/lib" timeout 60 "$out/bin/all_reduce_perf" -b 8 -e 8 -g 1 2>&1 | head -n 1)
if ! echo "$first" | grep -q "nccl-library=$want"; then
    echo "FAIL: all_reduce_perf's first line is '$first', want nccl-library=$want (braid's)"
    failed=1
else
    echo "$first"
fi

# With a GPU: one run, checked, and braid's version in its first line.
if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
    log=$out/all_reduce_perf.log
    LD_LIBRARY_PATH="$home/lib" timeout 60 "$out/bin/all_reduce_perf" -b 1M -e 1M -g 1 -c 1 -n 2 -w 1 > "$log" 2>&1
    rc=$?
    if [ $rc -ne 0 ] || ! grep -q "nccl-library=$want" "$log" || ! grep -q 'Out of bounds values : 0 OK' "$log"; then
        cat "$log"
        echo "FAIL: all_reduce_perf on braid (exit $rc; want nccl-library=$want and 0 wrong)"
        failed=1
    else
        grep -m1 'nccl-library' "$log"
    fi
fi
exit $failed
