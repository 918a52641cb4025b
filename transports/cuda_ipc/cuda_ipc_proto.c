/* cuda_ipc wire formats and slot accounting (see cuda_ipc_proto.h). All
 * integers little-endian on the wire; everything read is validated. */
#include <stdio.h>
#include <string.h>

#include "cuda_ipc_proto.h"
#include "bytes.h"

static braid_status bad(char *why, size_t why_len, const char *what)
{
    if (why && why_len)
        snprintf(why, why_len, "%s", what);
    return BRAID_ERR_PEER;
}

/* Layout: magic, version, device, nslots, slot_bytes, pid (4 each),
 * host_hash (8), bus_id (16), ring handle (64), event handles (16 x 64),
 * pid namespace (4), zero (4). */
void braid__ipc_setup_encode(const braid_ipc_setup *s, uint8_t out[BRAID_IPC_SETUP_BYTES])
{
    memset(out, 0, BRAID_IPC_SETUP_BYTES);
    braid__put_le32(out, BRAID_IPC_SETUP_MAGIC);
    braid__put_le32(out + 4, s->version);
    braid__put_le32(out + 8, (uint32_t)s->device);
    braid__put_le32(out + 12, s->nslots);
    braid__put_le32(out + 16, s->slot_bytes);
    braid__put_le32(out + 20, s->pid);
    braid__put_le64(out + 24, s->host_hash);
    memcpy(out + 32, s->bus_id, BRAID_IPC_BUS_ID_BYTES);
    out[32 + BRAID_IPC_BUS_ID_BYTES - 1] = '\0';
    memcpy(out + 32 + BRAID_IPC_BUS_ID_BYTES, s->ring, BRAID_IPC_HANDLE_BYTES);
    uint32_t n = s->nslots <= BRAID_IPC_MAX_SLOTS ? s->nslots : BRAID_IPC_MAX_SLOTS;
    memcpy(out + 32 + BRAID_IPC_BUS_ID_BYTES + BRAID_IPC_HANDLE_BYTES, s->events, (size_t)n * BRAID_IPC_HANDLE_BYTES);
    braid__put_le32(out + BRAID_IPC_SETUP_PIDNS_AT, s->pidns);
}

braid_status braid__ipc_setup_decode(const uint8_t in[BRAID_IPC_SETUP_BYTES], braid_ipc_setup *s, char *why,
                                     size_t why_len)
{
    if (braid__get_le32(in) != BRAID_IPC_SETUP_MAGIC)
        return bad(why, why_len, "cuda_ipc set-up message has a bad magic number");
    braid_ipc_setup d;
    memset(&d, 0, sizeof(d));
    d.version = braid__get_le32(in + 4);
    if (d.version != BRAID_IPC_VERSION) {
        if (why && why_len)
            snprintf(why, why_len, "cuda_ipc set-up version %u, expected %u", d.version, BRAID_IPC_VERSION);
        return BRAID_ERR_MISMATCH;
    }
    d.device = (int32_t)braid__get_le32(in + 8);
    d.nslots = braid__get_le32(in + 12);
    d.slot_bytes = braid__get_le32(in + 16);
    d.pid = braid__get_le32(in + 20);
    if (d.nslots > BRAID_IPC_MAX_SLOTS)
        return bad(why, why_len, "cuda_ipc set-up message has a slot count out of range");
    if (d.nslots == 0 ? d.slot_bytes != 0
                      : d.slot_bytes < 4096 || d.slot_bytes % 256 != 0 || d.slot_bytes > (1u << 30))
        return bad(why, why_len, "cuda_ipc set-up message has an invalid slot size");
    d.host_hash = braid__get_le64(in + 24);
    memcpy(d.bus_id, in + 32, BRAID_IPC_BUS_ID_BYTES);
    /* No slots (the sender cannot use IPC): the bus id may be empty. */
    if (memchr(d.bus_id, '\0', BRAID_IPC_BUS_ID_BYTES) == NULL || (d.nslots > 0 && d.bus_id[0] == '\0'))
        return bad(why, why_len, "cuda_ipc set-up message has a malformed PCI bus id");
    memcpy(d.ring, in + 32 + BRAID_IPC_BUS_ID_BYTES, BRAID_IPC_HANDLE_BYTES);
    memcpy(d.events, in + 32 + BRAID_IPC_BUS_ID_BYTES + BRAID_IPC_HANDLE_BYTES,
           (size_t)d.nslots * BRAID_IPC_HANDLE_BYTES);
    /* Unused event slots must be zero: a longer table is a different format
     * (and with no slots there is no ring either). */
    for (size_t i = 32 + BRAID_IPC_BUS_ID_BYTES + BRAID_IPC_HANDLE_BYTES * (d.nslots ? 1 + (size_t)d.nslots : 0);
         i < BRAID_IPC_SETUP_PIDNS_AT; i++)
        if (in[i] != 0)
            return bad(why, why_len, "cuda_ipc set-up message has data past its event table");
    d.pidns = braid__get_le32(in + BRAID_IPC_SETUP_PIDNS_AT);
    if (braid__get_le32(in + BRAID_IPC_SETUP_PIDNS_AT + 4) != 0)
        return bad(why, why_len, "cuda_ipc set-up message has data past its pid namespace");
    *s = d;
    return BRAID_OK;
}

void braid__ipc_ctrl_encode(const braid_ipc_ctrl *c, uint8_t out[BRAID_IPC_CTRL_BYTES])
{
    braid__put_le32(out, (uint32_t)c->kind | (c->last ? 1u << 16 : 0));
    braid__put_le32(out + 4, c->slot);
    braid__put_le64(out + 8, c->len);
}

braid_status braid__ipc_ctrl_decode(const uint8_t in[BRAID_IPC_CTRL_BYTES], uint32_t nslots, uint32_t slot_bytes,
                                    braid_ipc_ctrl *c, char *why, size_t why_len)
{
    uint32_t word = braid__get_le32(in);
    braid_ipc_ctrl d = {.kind = (braid_ipc_ctrl_kind)(word & 0xffff), .slot = braid__get_le32(in + 4), .last = (word >> 16) == 1,
                        .len = braid__get_le64(in + 8)};
    if (d.kind != BRAID_IPC_DATA && d.kind != BRAID_IPC_CREDIT && d.kind != BRAID_IPC_VERDICT && d.kind != BRAID_IPC_BYE)
        return bad(why, why_len, "cuda_ipc control message of unknown kind");
    if (d.kind == BRAID_IPC_BYE) {
        if ((word >> 16) != 0 || d.slot != 0 || d.len != 0)
            return bad(why, why_len, "cuda_ipc bye message is malformed");
        *c = d;
        return BRAID_OK;
    }
    if (d.kind == BRAID_IPC_VERDICT) {
        if ((word >> 16) != 0 || d.slot != 0 || d.len > 1)
            return bad(why, why_len, "cuda_ipc verdict message is malformed");
        *c = d;
        return BRAID_OK;
    }
    if ((word >> 16) > (d.kind == BRAID_IPC_DATA ? 1u : 0u))
        return bad(why, why_len, "cuda_ipc control message has unknown flags");
    if (d.slot >= nslots)
        return bad(why, why_len, "cuda_ipc control message names a slot out of range");
    if (d.kind == BRAID_IPC_DATA && (d.len > slot_bytes || (d.len == 0 && !d.last)))
        return bad(why, why_len, "cuda_ipc data message has a length out of range");
    if (d.kind == BRAID_IPC_CREDIT && d.len != 0)
        return bad(why, why_len, "cuda_ipc credit message has a length");
    *c = d;
    return BRAID_OK;
}

void braid__ipc_window_init(braid_ipc_window *w, uint32_t nslots, uint32_t slot_bytes)
{
    memset(w, 0, sizeof(*w));
    w->nslots = nslots;
    w->slot_bytes = slot_bytes;
    w->credits = nslots;
}

int braid__ipc_window_take(braid_ipc_window *w, size_t left, uint32_t *slot, size_t *len)
{
    if (w->credits == 0)
        return 0;
    *slot = w->send_next;
    *len = left < w->slot_bytes ? left : w->slot_bytes;
    w->send_next = (w->send_next + 1) % w->nslots;
    w->credits--;
    return 1;
}

braid_status braid__ipc_window_credit(braid_ipc_window *w, uint32_t slot)
{
    uint32_t in_flight = w->nslots - w->credits;
    if (in_flight == 0)
        return BRAID_ERR_PEER; /* a credit for nothing we sent */
    uint32_t oldest = (w->send_next + w->nslots - in_flight) % w->nslots;
    if (slot != oldest)
        return BRAID_ERR_PEER;
    w->credits++;
    return BRAID_OK;
}

braid_status braid__ipc_window_arrive(braid_ipc_window *w, uint32_t slot)
{
    if (slot != w->recv_next || w->recv_held >= w->nslots)
        return BRAID_ERR_PEER;
    w->recv_next = (w->recv_next + 1) % w->nslots;
    w->recv_held++;
    return BRAID_OK;
}

uint32_t braid__ipc_window_release(braid_ipc_window *w)
{
    uint32_t oldest = (w->recv_next + w->nslots - w->recv_held) % w->nslots;
    if (w->recv_held > 0)
        w->recv_held--;
    return oldest;
}

uint64_t braid__ipc_host_hash(const char *identity)
{
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)identity; *p; p++) {
        h ^= *p;
        h *= 1099511628211ull;
    }
    return h;
}
