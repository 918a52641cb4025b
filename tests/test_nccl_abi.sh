#!/bin/sh
# libnccl.so.2's dynamic symbols against NVIDIA's NCCL:
#  1. every function NVIDIA's nccl.h declares is exported, and its pnccl*
#     profiling alias wherever NVIDIA's own libnccl.so exports one;
#  2. every nccl* function PyTorch 2.11's libtorch_cuda.so imports (the
#     list below, from `nm -D --undefined-only` on torch 2.11.0+cu130) is
#     exported, so torch loads with braid's library in its place;
#  3. nothing else is: no braid internals leak out;
#  4. the SONAME is libnccl.so.2.
# usage: test_nccl_abi.sh LIB [NVIDIA_NCCL_H [NVIDIA_LIBNCCL]]
# Without NVIDIA's header (no CUDA toolkit with NCCL here) check 1 is
# skipped with a note; the others still run.
set -eu
lib=$1
header=${2:-/usr/local/cuda/include/nccl.h}
nvlib=${3:-/usr/local/cuda/lib64/libnccl.so.2}
command -v nm >/dev/null 2>&1 || { echo "nm not found (binutils): skipping"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

nm -D --defined-only "$lib" | awk '$2 ~ /^[TtDdBbRrVvWwi]$/ { sub(/@.*/, "", $3); print $3 }' | LC_ALL=C sort -u \
    > "$tmp/exported"
fail=0

# 3: only NCCL's names.
if grep -v -E '^p?nccl[A-Z]' "$tmp/exported" > "$tmp/stray"; then
    echo "FAIL: $lib exports symbols outside NCCL's API:"
    sed 's/^/    /' "$tmp/stray"
    fail=1
fi

# 1: NVIDIA's header, comments stripped, every nccl* name declared as a function.
if [ -r "$header" ]; then
    cc=${CC:-cc}
    "$cc" -x c -fpreprocessed -dD -E -P "$header" 2>/dev/null |
        grep -oE '\bnccl[A-Za-z0-9_]*[[:space:]]*\(' | sed -E 's/[[:space:]]*\($//' | LC_ALL=C sort -u > "$tmp/declared"
    total=$(wc -l < "$tmp/declared")
    [ "$total" -gt 30 ] || { echo "FAIL: found only $total functions in $header: parse error?"; exit 1; }
    LC_ALL=C comm -23 "$tmp/declared" "$tmp/exported" > "$tmp/missing"
    have=$((total - $(wc -l < "$tmp/missing")))
    echo "$header (NCCL $(awk '/#define NCCL_(MAJOR|MINOR|PATCH)/ { printf "%s%s", sep, $3; sep = "." }' "$header")) declares $total functions; $lib exports $have of $total"
    if [ -s "$tmp/missing" ]; then
        echo "FAIL: missing:"
        sed 's/^/    /' "$tmp/missing"
        fail=1
    fi
    if [ -r "$nvlib" ]; then
        nm -D --defined-only "$nvlib" | awk '{ sub(/@.*/, "", $3); print $3 }' | LC_ALL=C sort -u > "$tmp/nvidia"
        sed 's/^/p/' "$tmp/declared" | LC_ALL=C comm -12 - "$tmp/nvidia" > "$tmp/pwant"
        ptotal=$(wc -l < "$tmp/pwant")
        LC_ALL=C comm -23 "$tmp/pwant" "$tmp/exported" > "$tmp/pmissing"
        echo "NVIDIA's $nvlib exports $ptotal pnccl* aliases of them; $lib exports $((ptotal - $(wc -l < "$tmp/pmissing"))) of $ptotal"
        if [ -s "$tmp/pmissing" ]; then
            echo "FAIL: missing profiling aliases:"
            sed 's/^/    /' "$tmp/pmissing"
            fail=1
        fi
    else
        echo "note: $nvlib not found: pnccl* aliases not compared"
    fi
else
    echo "note: $header not found: the comparison with NVIDIA's header is skipped"
fi

# 2: what PyTorch 2.11 (built against NCCL 2.28.9) needs at load time.
torch_imports='ncclAllGather ncclAllReduce ncclAlltoAll ncclBcast ncclBroadcast ncclCommAbort ncclCommCount
ncclCommDeregister ncclCommDestroy ncclCommFinalize ncclCommGetAsyncError ncclCommInitAll ncclCommInitRank
ncclCommInitRankConfig ncclCommInitRankScalable ncclCommRegister ncclCommShrink ncclCommSplit ncclCommUserRank
ncclCommWindowDeregister ncclCommWindowRegister ncclDevCommCreate ncclDevCommDestroy ncclGetErrorString
ncclGetLastError ncclGetUniqueId ncclGetVersion ncclGroupEnd ncclGroupSimulateEnd ncclGroupStart ncclMemAlloc
ncclMemFree ncclRecv ncclRedOpCreatePreMulSum ncclRedOpDestroy ncclReduce ncclReduceScatter ncclSend'
printf '%s\n' $torch_imports | LC_ALL=C sort -u > "$tmp/torch"
LC_ALL=C comm -23 "$tmp/torch" "$tmp/exported" > "$tmp/tmissing"
ttotal=$(wc -l < "$tmp/torch")
echo "libtorch_cuda.so (torch 2.11) imports $ttotal nccl* functions; $lib exports $((ttotal - $(wc -l < "$tmp/tmissing"))) of $ttotal"
if [ -s "$tmp/tmissing" ]; then
    echo "FAIL: missing for PyTorch:"
    sed 's/^/    /' "$tmp/tmissing"
    fail=1
fi

# 4
soname=$(objdump -p "$lib" 2>/dev/null | awk '$1 == "SONAME" { print $2 }')
if [ -n "$soname" ] && [ "$soname" != "libnccl.so.2" ]; then
    echo "FAIL: SONAME is $soname, want libnccl.so.2"
    fail=1
fi
exit $fail
