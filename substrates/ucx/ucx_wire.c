/*
 * The UCX substrate's wire format: encoders and bounds-checked decoders of
 * the address blob and the message header (see ucx_wire.h).
 */
#include "ucx_wire.h"

#include "mr_byteorder.h"

#include <string.h>

uint64_t mr__ucx_wire_fnv1a64(uint64_t h, const void *data, size_t len)
{
    const uint8_t *p = data;

    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= UINT64_C(0x100000001b3);
    }
    return h;
}

/* ------------------------------------------------------------------------ */
/* The address blob.                                                         */

size_t mr__ucx_wire_addr_encode(uint8_t *out, const ucx_wire_addr_t *a)
{
    mr__put_le32(out, UCX_WIRE_ADDR_MAGIC);
    out[4] = UCX_WIRE_ADDR_VERSION;
    out[5] = out[6] = out[7] = 0;
    mr__put_le32(out + 8, a->pid);
    mr__put_le32(out + 12, (uint32_t)a->worker_len);
    mr__put_le64(out + 16, a->boot_hash);
    mr__put_le64(out + 24, a->pidns);
    if (a->worker_len > 0) memcpy(out + UCX_WIRE_ADDR_HDR_LEN, a->worker, a->worker_len);
    return UCX_WIRE_ADDR_HDR_LEN + a->worker_len;
}

mr_status_t mr__ucx_wire_addr_decode(const void *blob, size_t length, ucx_wire_addr_t *out,
                                     ucx_wire_error_t *err)
{
    const uint8_t *b = blob;
    uint32_t magic, n;

    if (b == NULL || length < UCX_WIRE_ADDR_HDR_LEN) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, UCX_WIRE_TRUNCATED,
                             "address blob shorter than 32 bytes",
                             b == NULL ? 0 : (long long)length);
    }
    magic = mr__get_le32(b);
    if (magic != UCX_WIRE_ADDR_MAGIC) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, UCX_WIRE_BAD_MAGIC, "address magic", magic);
    }
    if (b[4] != UCX_WIRE_ADDR_VERSION) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, UCX_WIRE_BAD_VERSION, "address version",
                             b[4]);
    }
    n = mr__get_le32(b + 12);
    if (n == 0 || n > length - UCX_WIRE_ADDR_HDR_LEN) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, UCX_WIRE_BAD_LENGTH,
                             "worker address length", n);
    }
    out->pid = mr__get_le32(b + 8);
    out->boot_hash = mr__get_le64(b + 16);
    out->pidns = mr__get_le64(b + 24);
    out->worker = b + UCX_WIRE_ADDR_HDR_LEN;
    out->worker_len = n;
    return MR_OK;
}

/* ------------------------------------------------------------------------ */
/* The message header.                                                       */

/* The header's encoder and decoder are inline in ucx_wire.h: they run on every message. */
