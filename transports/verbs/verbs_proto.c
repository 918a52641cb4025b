/* Verbs wire protocol: immediates, chunking, credit windows, the set-up
 * message and device-spec parsing (see verbs_proto.h for the layout). */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verbs_proto.h"
#include "bytes.h"

#define IMM_KIND_SHIFT 30
#define IMM_LAST_BIT (1u << 29)
#define IMM_SLOT_SHIFT 21
#define IMM_SLOT_MASK 0xFFu
#define IMM_LEN_MASK ((1u << 21) - 1)
#define IMM_PAYLOAD_MASK ((1u << 30) - 1)

static braid_status reject(char *why, size_t why_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static braid_status reject(char *why, size_t why_len, const char *fmt, ...)
{
    if (why && why_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return BRAID_ERR_PEER;
}

uint32_t braid__verbs_imm_data(uint32_t slot, uint32_t len, int last)
{
    return ((uint32_t)BRAID_VERBS_IMM_DATA << IMM_KIND_SHIFT) | (last ? IMM_LAST_BIT : 0) |
           ((slot & IMM_SLOT_MASK) << IMM_SLOT_SHIFT) | (len & IMM_LEN_MASK);
}

uint32_t braid__verbs_imm_credit(uint32_t credits)
{
    return ((uint32_t)BRAID_VERBS_IMM_CREDIT << IMM_KIND_SHIFT) | (credits & IMM_PAYLOAD_MASK);
}

uint32_t braid__verbs_imm_close(void)
{
    return (uint32_t)BRAID_VERBS_IMM_CLOSE << IMM_KIND_SHIFT;
}

braid_status braid__verbs_imm_decode(uint32_t imm, uint32_t nslots, uint32_t slot_bytes, braid_verbs_imm *out,
                                     char *why, size_t why_len)
{
    braid_verbs_imm d = {0};
    uint32_t kind = imm >> IMM_KIND_SHIFT;
    switch (kind) {
    case BRAID_VERBS_IMM_DATA:
        d.kind = BRAID_VERBS_IMM_DATA;
        d.last = (imm & IMM_LAST_BIT) != 0;
        d.slot = (imm >> IMM_SLOT_SHIFT) & IMM_SLOT_MASK;
        d.len = imm & IMM_LEN_MASK;
        if (d.slot >= nslots)
            return reject(why, why_len, "immediate 0x%08x names slot %u of a %u-slot ring", imm, d.slot, nslots);
        if (d.len > slot_bytes)
            return reject(why, why_len, "immediate 0x%08x carries %u bytes into %u-byte slots", imm, d.len, slot_bytes);
        if (!d.last && d.len != slot_bytes)
            return reject(why, why_len, "immediate 0x%08x: a non-final chunk of %u bytes (slots hold %u)", imm, d.len,
                          slot_bytes);
        break;
    case BRAID_VERBS_IMM_CREDIT:
        d.kind = BRAID_VERBS_IMM_CREDIT;
        d.credits = imm & IMM_PAYLOAD_MASK;
        /* A peer never owes more than our whole window at once. */
        if (d.credits == 0 || d.credits > BRAID_VERBS_MAX_SLOTS)
            return reject(why, why_len, "immediate 0x%08x returns %u credits", imm, d.credits);
        break;
    case BRAID_VERBS_IMM_CLOSE:
        d.kind = BRAID_VERBS_IMM_CLOSE;
        if (imm & IMM_PAYLOAD_MASK)
            return reject(why, why_len, "close immediate 0x%08x has payload bits set", imm);
        break;
    default:
        return reject(why, why_len, "immediate 0x%08x has the reserved kind %u", imm, kind);
    }
    *out = d;
    return BRAID_OK;
}

uint64_t braid__verbs_chunk_count(size_t len, uint32_t slot_bytes)
{
    if (len == 0)
        return 1;
    /* Written without len + slot_bytes - 1, which overflows near SIZE_MAX. */
    return (uint64_t)(len / slot_bytes) + (len % slot_bytes != 0);
}

void braid__verbs_chunk_at(size_t len, uint32_t slot_bytes, uint64_t i, size_t *off, uint32_t *clen, int *last)
{
    uint64_t count = braid__verbs_chunk_count(len, slot_bytes);
    size_t o = (size_t)i * slot_bytes;
    size_t left = len > o ? len - o : 0;
    *off = o;
    *clen = (uint32_t)(left < slot_bytes ? left : slot_bytes);
    *last = i + 1 == count;
}

void braid__verbs_tx_init(braid_verbs_tx *tx, uint32_t window)
{
    memset(tx, 0, sizeof(*tx));
    tx->window = window;
}

int braid__verbs_tx_can_post(const braid_verbs_tx *tx)
{
    return tx->posted - tx->credited < tx->window && tx->posted - tx->completed < tx->window;
}

void braid__verbs_tx_post(braid_verbs_tx *tx)
{
    tx->posted++;
}

braid_status braid__verbs_tx_credit(braid_verbs_tx *tx, uint32_t n)
{
    if (n > tx->posted - tx->credited)
        return BRAID_ERR_PEER;
    tx->credited += n;
    return BRAID_OK;
}

braid_status braid__verbs_tx_complete(braid_verbs_tx *tx)
{
    if (tx->completed >= tx->posted)
        return BRAID_ERR_INTERNAL;
    tx->completed++;
    return BRAID_OK;
}

void braid__verbs_rx_init(braid_verbs_rx *rx, uint32_t nslots)
{
    memset(rx, 0, sizeof(*rx));
    rx->nslots = nslots;
    /* A quarter of the ring per credit message keeps the control traffic at
     * a few messages per window while the sender still sees slots come
     * back long before it runs dry. */
    rx->batch = nslots / 4 ? nslots / 4 : 1;
}

braid_status braid__verbs_rx_arrive(braid_verbs_rx *rx, uint32_t slot, char *why, size_t why_len)
{
    uint32_t want = (uint32_t)(rx->arrived % rx->nslots);
    if (slot != want)
        return reject(why, why_len, "chunk %llu landed in slot %u, expected slot %u", (unsigned long long)rx->arrived,
                      slot, want);
    if (rx->arrived - rx->returned >= rx->nslots)
        return reject(why, why_len, "chunk %llu overran the %u-slot window (only %llu returned)",
                      (unsigned long long)rx->arrived, rx->nslots, (unsigned long long)rx->returned);
    rx->arrived++;
    return BRAID_OK;
}

uint32_t braid__verbs_rx_next_slot(const braid_verbs_rx *rx)
{
    return (uint32_t)(rx->consumed % rx->nslots);
}

void braid__verbs_rx_consume(braid_verbs_rx *rx)
{
    rx->consumed++;
}

uint32_t braid__verbs_rx_credits_due(const braid_verbs_rx *rx)
{
    uint64_t owed = rx->consumed - rx->returned;
    if (owed == 0)
        return 0;
    if (owed >= rx->batch || rx->consumed == rx->arrived)
        return (uint32_t)owed;
    return 0;
}

void braid__verbs_rx_returned(braid_verbs_rx *rx, uint32_t n)
{
    rx->returned += n;
}

/* ---- set-up message ------------------------------------------------------ */

static const uint8_t info_magic[4] = {'B', 'V', 'Q', '1'};

void braid__verbs_info_encode(const braid_verbs_info *info, uint8_t out[BRAID_VERBS_INFO_BYTES])
{
    memset(out, 0, BRAID_VERBS_INFO_BYTES);
    memcpy(out, info_magic, 4);
    braid__put_le16(out + 4, BRAID_VERBS_INFO_VERSION);
    out[6] = info->link_layer;
    out[7] = info->mtu;
    braid__put_le32(out + 8, info->qpn);
    braid__put_le32(out + 12, info->psn);
    braid__put_le16(out + 16, info->lid);
    braid__put_le16(out + 18, info->flags);
    memcpy(out + 20, info->gid, 16);
    braid__put_le32(out + 36, info->nslots);
    braid__put_le32(out + 40, info->slot_bytes);
    braid__put_le64(out + 44, info->ring_addr);
    braid__put_le32(out + 52, info->ring_rkey);
    braid__put_le32(out + 56, (uint32_t)info->rank);
}

braid_status braid__verbs_info_decode(const uint8_t *buf, size_t len, braid_verbs_info *info, char *why, size_t why_len)
{
    if (len != BRAID_VERBS_INFO_BYTES)
        return reject(why, why_len, "set-up message of %zu bytes, expected %d", len, BRAID_VERBS_INFO_BYTES);
    if (memcmp(buf, info_magic, 4) != 0)
        return reject(why, why_len, "set-up message has a bad magic (not a verbs peer?)");
    uint16_t version = braid__get_le16(buf + 4);
    if (version != BRAID_VERBS_INFO_VERSION)
        return reject(why, why_len, "set-up message version %u, this build speaks %u", version,
                      BRAID_VERBS_INFO_VERSION);
    braid_verbs_info d;
    d.link_layer = buf[6];
    d.mtu = buf[7];
    d.qpn = braid__get_le32(buf + 8);
    d.psn = braid__get_le32(buf + 12);
    d.lid = braid__get_le16(buf + 16);
    d.flags = braid__get_le16(buf + 18);
    memcpy(d.gid, buf + 20, 16);
    d.nslots = braid__get_le32(buf + 36);
    d.slot_bytes = braid__get_le32(buf + 40);
    d.ring_addr = braid__get_le64(buf + 44);
    d.ring_rkey = braid__get_le32(buf + 52);
    d.rank = (int32_t)braid__get_le32(buf + 56);
    uint32_t reserved = braid__get_le32(buf + 60);

    if (d.link_layer != BRAID_VERBS_LINK_IB && d.link_layer != BRAID_VERBS_LINK_ETH)
        return reject(why, why_len, "set-up message has unknown link layer %u", d.link_layer);
    if (braid__verbs_mtu_bytes(d.mtu) == 0)
        return reject(why, why_len, "set-up message has invalid MTU code %u", d.mtu);
    /* QP numbers are 24 bits; 0 and 1 are the special management QPs. */
    if (d.qpn < 2 || d.qpn > 0xFFFFFFu)
        return reject(why, why_len, "set-up message has invalid QP number %u", d.qpn);
    if (d.psn > 0xFFFFFFu)
        return reject(why, why_len, "set-up message has a PSN of more than 24 bits (0x%x)", d.psn);
    if (d.flags & ~BRAID_VERBS_INFO_GID_VALID)
        return reject(why, why_len, "set-up message has unknown flags 0x%x", d.flags);
    if (d.link_layer == BRAID_VERBS_LINK_ETH && !(d.flags & BRAID_VERBS_INFO_GID_VALID))
        return reject(why, why_len, "set-up message from a RoCE port carries no GID");
    if (d.nslots < 1 || d.nslots > BRAID_VERBS_MAX_SLOTS)
        return reject(why, why_len, "set-up message offers %u ring slots (1..%u allowed)", d.nslots,
                      BRAID_VERBS_MAX_SLOTS);
    if (d.slot_bytes < BRAID_VERBS_MIN_SLOT_BYTES || d.slot_bytes > BRAID_VERBS_MAX_SLOT_BYTES)
        return reject(why, why_len, "set-up message offers %u-byte slots (%u..%u allowed)", d.slot_bytes,
                      BRAID_VERBS_MIN_SLOT_BYTES, BRAID_VERBS_MAX_SLOT_BYTES);
    if (d.ring_addr == 0)
        return reject(why, why_len, "set-up message has a null ring address");
    if (d.rank < 0)
        return reject(why, why_len, "set-up message has negative rank %d", (int)d.rank);
    if (reserved != 0)
        return reject(why, why_len, "set-up message has non-zero reserved bits 0x%x", reserved);
    *info = d;
    return BRAID_OK;
}

uint32_t braid__verbs_mtu_bytes(uint8_t mtu)
{
    return mtu >= 1 && mtu <= 5 ? 128u << mtu : 0;
}

/* ---- device selection ---------------------------------------------------- */

braid_status braid__verbs_hca_parse(const char *spec, braid_verbs_hca *out, int max, int *n, char *why, size_t why_len)
{
    int count = 0;
    const char *p = spec;
    for (;;) {
        size_t len = strcspn(p, ",");
        const char *colon = memchr(p, ':', len);
        size_t name_len = colon ? (size_t)(colon - p) : len;
        while (name_len > 0 && isspace((unsigned char)p[name_len - 1]))
            name_len--;
        while (name_len > 0 && isspace((unsigned char)*p)) {
            p++;
            len--;
            name_len--;
        }
        if (name_len == 0) {
            snprintf(why, why_len, "BRAID_IB_HCA='%s' has an empty device name", spec);
            return BRAID_ERR_INVALID_ARG;
        }
        if (name_len >= BRAID_VERBS_HCA_NAME_MAX) {
            snprintf(why, why_len, "BRAID_IB_HCA='%s': device name '%.*s' is too long", spec, (int)name_len, p);
            return BRAID_ERR_INVALID_ARG;
        }
        int port = 0;
        if (colon) {
            char num[8];
            size_t num_len = len - (size_t)(colon - p) - 1;
            char *end;
            if (num_len == 0 || num_len >= sizeof(num)) {
                snprintf(why, why_len, "BRAID_IB_HCA='%s': bad port after '%.*s:'", spec, (int)name_len, p);
                return BRAID_ERR_INVALID_ARG;
            }
            memcpy(num, colon + 1, num_len);
            num[num_len] = '\0';
            errno = 0;
            long v = strtol(num, &end, 10);
            if (errno || *end || end == num || v < 1 || v > 255) {
                snprintf(why, why_len, "BRAID_IB_HCA='%s': port '%s' is not in 1..255", spec, num);
                return BRAID_ERR_INVALID_ARG;
            }
            port = (int)v;
        }
        if (count == max) {
            snprintf(why, why_len, "BRAID_IB_HCA='%s' lists more than %d devices", spec, max);
            return BRAID_ERR_INVALID_ARG;
        }
        memcpy(out[count].name, p, name_len);
        out[count].name[name_len] = '\0';
        out[count].port = port;
        count++;
        p += len;
        if (*p != ',')
            break;
        p++;
    }
    *n = count;
    return BRAID_OK;
}

static int gid_is_zero(const uint8_t *g)
{
    for (int i = 0; i < 16; i++)
        if (g[i])
            return 0;
    return 1;
}

static int gid_is_v4_mapped(const uint8_t *g)
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(g, prefix, 12) == 0;
}

static int gid_is_link_local(const uint8_t *g)
{
    return g[0] == 0xfe && (g[1] & 0xc0) == 0x80;
}

int braid__verbs_gid_pick(const uint8_t (*gids)[16], const braid_verbs_gid_type *types, const int *present, int n)
{
    /* Three passes, best class first, lowest index within a class: index
     * order is how the kernel lists addresses, so the pick is stable. */
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < n; i++) {
            if (!present[i] || types[i] != BRAID_VERBS_GID_ROCE_V2 || gid_is_zero(gids[i]))
                continue;
            if (pass == 0 && !gid_is_v4_mapped(gids[i]))
                continue;
            if (pass == 1 && (gid_is_v4_mapped(gids[i]) || gid_is_link_local(gids[i])))
                continue;
            return i;
        }
    }
    return -1;
}
