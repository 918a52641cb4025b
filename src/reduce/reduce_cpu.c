/* CPU reduce engine entry points: pick the kernel set once per process
 * (AVX2+F16C when the CPU has both, else scalar) and dispatch through its
 * [dtype][op] table. The kernels themselves live in reduce_scalar.c and
 * reduce_avx2.c. */
#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "log.h"
#include "reduce/reduce.h"
#include "reduce/reduce_impl.h"

static braid__reduce_kernels best_kernels;
static pthread_once_t pick_once = PTHREAD_ONCE_INIT;
static int have_avx2;
/* Read on every call; set once by pick_kernels (or by tests). Acquire/
 * release so a reader that sees the pointer also sees the filled table. */
static _Atomic(const braid__reduce_kernels *) active;

static int cpu_has_avx2_f16c(void)
{
#if defined(__x86_64__) || defined(__i386__)
    /* The compiler's avx2 check also requires the OS to save YMM state
     * (XGETBV), which F16C needs as well. F16C itself is read from CPUID
     * leaf 1 (ECX bit 29): older clang has no "f16c" for cpu_supports. */
    unsigned eax, ebx, ecx, edx;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2"))
        return 0;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx))
        return 0;
    return (ecx & bit_F16C) != 0;
#else
    return 0;
#endif
}

static void pick_kernels(void)
{
    best_kernels = braid__reduce_kernels_scalar;
    if (cpu_has_avx2_f16c())
        have_avx2 = braid__reduce_avx2_fill(&best_kernels);
    atomic_store_explicit(&active, &best_kernels, memory_order_release);
    BRAID_INFO("reduce engine: %s kernels", best_kernels.isa);
}

static const braid__reduce_kernels *kernels(void)
{
    const braid__reduce_kernels *k = atomic_load_explicit(&active, memory_order_acquire);
    if (k == NULL) {
        pthread_once(&pick_once, pick_kernels);
        k = atomic_load_explicit(&active, memory_order_acquire);
    }
    return k;
}

void braid__reduce_force_scalar(int on)
{
    pthread_once(&pick_once, pick_kernels);
    atomic_store_explicit(&active, on ? &braid__reduce_kernels_scalar : &best_kernels,
                          memory_order_release);
}

int braid__reduce_has_avx2(void)
{
    pthread_once(&pick_once, pick_kernels);
    return have_avx2;
}

const char *braid__reduce_isa(void)
{
    return kernels()->isa;
}

/* dtype/op come from braid's own code, which validated the user's values
 * at the public API: a bad one here is a bug, hence assert. */
static int valid(braid_dtype dtype, braid_op op)
{
    return (unsigned)dtype < BRAID_DTYPE_COUNT && (unsigned)op < BRAID_OP_COUNT;
}

void braid__reduce(braid_dtype dtype, braid_op op, void *dst, const void *a, const void *b, size_t count)
{
    assert(valid(dtype, op));
    if (count == 0)
        return;
    kernels()->combine[dtype][op](dst, a, b, count);
}

void braid__reduce_final(braid_dtype dtype, braid_op op, void *dst, const void *a, const void *b,
                         size_t count, int nranks)
{
    assert(valid(dtype, op));
    if (count == 0)
        return;
    const braid__reduce_kernels *k = kernels();
    if (op == BRAID_AVG) {
        assert(nranks > 0);
        k->avg_final[dtype](dst, a, b, count, nranks);
    } else {
        k->combine[dtype][op](dst, a, b, count);
    }
}

void braid__reduce_scale(braid_dtype dtype, braid_op op, void *buf, size_t count, int nranks)
{
    assert(valid(dtype, op));
    if (op != BRAID_AVG || count == 0)
        return;
    assert(nranks > 0);
    kernels()->scale[dtype](buf, count, nranks);
}

void braid__reduce_premul(braid_dtype dtype, void *dst, const void *src, size_t count, const void *scalar)
{
    assert((unsigned)dtype < BRAID_DTYPE_COUNT);
    if (count == 0)
        return;
    kernels()->premul[dtype](dst, src, count, scalar);
}

void braid__cast(braid_dtype dst_type, void *dst, braid_dtype src_type, const void *src, size_t count)
{
    assert((unsigned)dst_type < BRAID_DTYPE_COUNT && (unsigned)src_type < BRAID_DTYPE_COUNT);
    if (count == 0)
        return;
    braid__cast_func_t fn = kernels()->cast[dst_type][src_type];
    assert(fn != NULL && "braid__cast: unsupported dtype pair");
    if (fn == NULL) {
        BRAID_WARN("reduce: no cast from dtype %d to dtype %d (bug: caller must check)", (int)src_type,
                   (int)dst_type);
        return;
    }
    fn(dst, src, count);
}

int braid__cast_supported(braid_dtype dst_type, braid_dtype src_type)
{
    if ((unsigned)dst_type >= BRAID_DTYPE_COUNT || (unsigned)src_type >= BRAID_DTYPE_COUNT)
        return 0;
    return braid__reduce_kernels_scalar.cast[dst_type][src_type] != NULL;
}
