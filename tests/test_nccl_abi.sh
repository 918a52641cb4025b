#!/bin/sh
# The dynamic symbols libnccl.so.2 defines must be exactly NCCL's API as
# braid implements it: nothing of braid leaks out, nothing is missing.
# usage: test_nccl_abi.sh path/to/libnccl.so.2
set -eu
lib=$1
command -v nm >/dev/null 2>&1 || { echo "nm not found (binutils): skipping"; exit 77; }

expected='ncclAllGather
ncclAllReduce
ncclBcast
ncclBroadcast
ncclCommAbort
ncclCommCount
ncclCommCuDevice
ncclCommDeregister
ncclCommDestroy
ncclCommFinalize
ncclCommGetAsyncError
ncclCommInitAll
ncclCommInitRank
ncclCommInitRankConfig
ncclCommRegister
ncclCommSplit
ncclCommUserRank
ncclGetErrorString
ncclGetLastError
ncclGetUniqueId
ncclGetVersion
ncclGroupEnd
ncclGroupStart
ncclMemAlloc
ncclMemFree
ncclRecv
ncclRedOpCreatePreMulSum
ncclRedOpDestroy
ncclReduce
ncclReduceScatter
ncclSend'

# Defined, exported functions and data; drop ELF version markers.
actual=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TtDdBbRrVvWwi]$/ { sub(/@.*/, "", $3); print $3 }' | LC_ALL=C sort)
if [ "$actual" != "$expected" ]; then
    echo "exported symbols of $lib differ from the expected NCCL API:"
    printf '%s\n' "$expected" > "${TMPDIR:-/tmp}/nccl_abi_expected.$$"
    printf '%s\n' "$actual" | diff "${TMPDIR:-/tmp}/nccl_abi_expected.$$" - || true
    rm -f "${TMPDIR:-/tmp}/nccl_abi_expected.$$"
    exit 1
fi

soname=$(objdump -p "$lib" 2>/dev/null | awk '$1 == "SONAME" { print $2 }')
if [ -n "$soname" ] && [ "$soname" != "libnccl.so.2" ]; then
    echo "SONAME is $soname, want libnccl.so.2"
    exit 1
fi
echo "libnccl.so.2 exports exactly the $(printf '%s\n' "$expected" | wc -l) expected symbols"
