/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78): the checksum of
 * iSCSI, ext4 and SCTP, which x86 computes with the SSE4.2 crc32
 * instruction. braid uses it for the optional per-chunk checksum
 * (transports/checksum/checksum.c). */
#ifndef BRAID_CRC32C_H
#define BRAID_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extend crc (0 to start) over len bytes of buf: the usual CRC32C with
 * initial value and final xor ~0, so that braid__crc32c(0, "123456789", 9)
 * is 0xE3069283, and crc32c(a || b) == braid__crc32c(braid__crc32c(0, a), b).
 * Uses the fastest implementation this CPU has, chosen on first use. */
uint32_t braid__crc32c(uint32_t crc, const void *buf, size_t len);

/* The table-driven (slice-by-8) implementation, usable on every CPU. */
uint32_t braid__crc32c_sw(uint32_t crc, const void *buf, size_t len);

/* The hardware implementation, or NULL when this CPU (or build) has none.
 * Exposed so tests check both paths against the same vectors. */
typedef uint32_t (*braid_crc32c_func_t)(uint32_t crc, const void *buf, size_t len);
braid_crc32c_func_t braid__crc32c_hw(void);

/* "sse4.2" or "table": the implementation braid__crc32c uses. */
const char *braid__crc32c_impl(void);

#endif
