/* CRC32C, two implementations behind one function:
 *  - x86-64 with SSE4.2: the crc32 instruction, 8 bytes at a time, over
 *    three independent streams whose results are merged with a carry-less
 *    shift (the crc32 instruction has a latency of 3 cycles and a
 *    throughput of 1, so three streams keep it busy);
 *  - everywhere else: slice-by-8 tables (8 KiB, built once).
 * The choice is made at run time (__builtin_cpu_supports), so one binary
 * runs on any x86-64. */
#include <pthread.h>
#include <string.h>

#include "crc32c.h"

#define POLY 0x82F63B78u /* reflected Castagnoli polynomial */

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

static uint64_t load_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

uint32_t braid__crc32c_sw(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&table_once, table_init);
    const uint8_t *p = buf;
    uint32_t c = ~crc;
    for (; len && ((uintptr_t)p & 7); len--)
        c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
    for (; len >= 8; len -= 8, p += 8) {
        uint64_t w = load_le64(p) ^ c;
        c = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^ table[4][(w >> 24) & 0xff] ^
            table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^ table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
    }
    for (; len; len--)
        c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
    return ~c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#include <wmmintrin.h>

#define HW_TARGET __attribute__((target("sse4.2,pclmul")))

/* Bytes per stream of one three-stream block. */
#define BLOCK 4096

/* x^(8n-33) mod P and friends, for shifting a CRC over n zero bytes with
 * one carry-less multiply: the standard construction (Intel's "Fast CRC
 * computation for iSCSI polynomial using crc32 instruction"). Computed at
 * start-up rather than copied as magic numbers. */
static uint32_t shift_k1, shift_k2; /* shifts by 2*BLOCK and BLOCK bytes */

/* x^n mod P in the reflected domain. */
static uint32_t xpow_mod(uint64_t n)
{
    uint32_t r = 0x80000000u; /* x^0 */
    for (uint64_t i = 0; i < n; i++)
        r = r & 1 ? (r >> 1) ^ POLY : r >> 1;
    return r;
}

static pthread_once_t shift_once = PTHREAD_ONCE_INIT;

static void shift_init(void)
{
    /* Multiplying by x^(8n - 33), then reducing 64 bits with crc32,
     * shifts a CRC over n zero bytes. */
    shift_k1 = xpow_mod(8ull * 2 * BLOCK - 33);
    shift_k2 = xpow_mod(8ull * BLOCK - 33);
}

/* crc shifted over `k`'s worth of zero bytes: clmul then one crc32 step. */
HW_TARGET static uint32_t shift(uint32_t crc, uint32_t k)
{
    __m128i a = _mm_cvtsi32_si128((int)crc), b = _mm_cvtsi32_si128((int)k);
    uint64_t prod = (uint64_t)_mm_cvtsi128_si64(_mm_clmulepi64_si128(a, b, 0));
    return (uint32_t)_mm_crc32_u64(0, prod);
}

HW_TARGET static uint32_t crc32c_hw(uint32_t crc, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    uint64_t c0 = ~crc;
    for (; len && ((uintptr_t)p & 7); len--)
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    if (len >= 3 * BLOCK) {
        pthread_once(&shift_once, shift_init);
        while (len >= 3 * BLOCK) {
            uint64_t c1 = 0, c2 = 0;
            for (size_t i = 0; i < BLOCK; i += 8) {
                uint64_t w0, w1, w2;
                memcpy(&w0, p + i, 8);
                memcpy(&w1, p + BLOCK + i, 8);
                memcpy(&w2, p + 2 * BLOCK + i, 8);
                c0 = _mm_crc32_u64(c0, w0);
                c1 = _mm_crc32_u64(c1, w1);
                c2 = _mm_crc32_u64(c2, w2);
            }
            /* crc(A B C) = shift(crc(A), |B|+|C|) ^ shift(crc'(B), |C|) ^ crc'(C),
             * where crc' starts from zero: CRCs are linear. */
            c0 = shift((uint32_t)c0, shift_k1) ^ shift((uint32_t)c1, shift_k2) ^ c2;
            p += 3 * BLOCK;
            len -= 3 * BLOCK;
        }
    }
    for (; len >= 8; len -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c0 = _mm_crc32_u64(c0, w);
    }
    for (; len; len--)
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return ~(uint32_t)c0;
}

braid_crc32c_func_t braid__crc32c_hw(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul") ? crc32c_hw : NULL;
}
#else
braid_crc32c_func_t braid__crc32c_hw(void)
{
    return NULL;
}
#endif

static braid_crc32c_func_t chosen;
static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

static void choose(void)
{
    braid_crc32c_func_t hw = braid__crc32c_hw();
    chosen = hw ? hw : braid__crc32c_sw;
}

uint32_t braid__crc32c(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&choose_once, choose);
    return chosen(crc, buf, len);
}

const char *braid__crc32c_impl(void)
{
    pthread_once(&choose_once, choose);
    return chosen == braid__crc32c_sw ? "table" : "sse4.2";
}
