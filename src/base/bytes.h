/* The one byte-order codec: fixed-width integers to and from wire bytes,
 * big-endian (network order: the store, the handshake, refusals, shrink,
 * TCP frames) or little-endian (shared-memory ring headers, the cuda_ipc
 * and verbs set-up messages, checksums), whatever the host's order. */
#ifndef BRAID_BYTES_H
#define BRAID_BYTES_H

#include <stdint.h>

static inline void braid__put_be16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static inline void braid__put_be32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (24 - 8 * i));
}

static inline void braid__put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (56 - 8 * i));
}

static inline uint16_t braid__get_be16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

static inline uint32_t braid__get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline uint64_t braid__get_be64(const uint8_t *p)
{
    return (uint64_t)braid__get_be32(p) << 32 | braid__get_be32(p + 4);
}

static inline void braid__put_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void braid__put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void braid__put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint16_t braid__get_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static inline uint32_t braid__get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t braid__get_le64(const uint8_t *p)
{
    return (uint64_t)braid__get_le32(p) | (uint64_t)braid__get_le32(p + 4) << 32;
}

#endif
