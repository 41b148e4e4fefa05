/*
 * The TCP substrate's wire format: encoders and bounds-checked decoders of
 * the address blob, the AUTH message and the frame header (see tcp_wire.h).
 */
#include "tcp_wire.h"

#include "mr_byteorder.h"

#include <arpa/inet.h>
#include <sodium.h>
#include <stdbool.h>
#include <string.h>

#define TCP_WIRE_AUTH_DOMAIN "MRTCP-AUTH"
#define TCP_WIRE_AUTH_DOMAIN_LEN (sizeof(TCP_WIRE_AUTH_DOMAIN) - 1)

mr_status_t tcp_wire_init(void)
{
    return sodium_init() < 0 ? MR_ERR_TRANSPORT : MR_OK;
}

/* ------------------------------------------------------------------------ */
/* The address blob: every field in network byte order.                     */

void tcp_wire_addr_encode(uint8_t out[TCP_WIRE_ADDR_LEN], const struct sockaddr_in *sin)
{
    uint32_t magic = htonl(TCP_WIRE_ADDR_MAGIC);

    memcpy(out, &magic, 4);
    out[4] = TCP_WIRE_ADDR_VERSION;
    out[5] = 0;
    memcpy(out + 6, &sin->sin_port, 2);
    memcpy(out + 8, &sin->sin_addr.s_addr, 4);
}

mr_status_t tcp_wire_addr_parse(const void *blob, size_t length, struct sockaddr_in *out,
                                tcp_wire_error_t *err)
{
    const uint8_t *b = blob;
    uint32_t magic;

    if (b == NULL || length < TCP_WIRE_ADDR_LEN) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, TCP_WIRE_TRUNCATED,
                             "address blob shorter than 12 bytes", b == NULL ? 0 : (long long)length);
    }
    memcpy(&magic, b, 4);
    if (ntohl(magic) != TCP_WIRE_ADDR_MAGIC) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, TCP_WIRE_BAD_MAGIC, "address magic",
                             ntohl(magic));
    }
    if (b[4] != TCP_WIRE_ADDR_VERSION) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, TCP_WIRE_BAD_VERSION, "address version",
                             b[4]);
    }
    memset(out, 0, sizeof(*out));
    out->sin_family = AF_INET;
    memcpy(&out->sin_port, b + 6, 2);
    memcpy(&out->sin_addr.s_addr, b + 8, 4);
    return MR_OK;
}

/* ------------------------------------------------------------------------ */
/* The AUTH message, little-endian.                                          */

_Static_assert(TCP_WIRE_MAC_LEN == crypto_auth_BYTES, "the AUTH MAC is one crypto_auth tag");
_Static_assert(TCP_WIRE_KEY_LEN == crypto_auth_KEYBYTES, "the MAC key is one crypto_auth key");

/* What the MAC of an AUTH message covers. */
static void tcp_wire_auth_input(uint8_t msg[TCP_WIRE_NONCE_LEN + 8 + TCP_WIRE_AUTH_DOMAIN_LEN],
                                const uint8_t nonce[TCP_WIRE_NONCE_LEN], int32_t connector,
                                int32_t acceptor)
{
    memcpy(msg, nonce, TCP_WIRE_NONCE_LEN);
    mr__put_le32(msg + TCP_WIRE_NONCE_LEN, (uint32_t)connector);
    mr__put_le32(msg + TCP_WIRE_NONCE_LEN + 4, (uint32_t)acceptor);
    memcpy(msg + TCP_WIRE_NONCE_LEN + 8, TCP_WIRE_AUTH_DOMAIN, TCP_WIRE_AUTH_DOMAIN_LEN);
}

void tcp_wire_auth_encode(uint8_t out[TCP_WIRE_AUTH_LEN], const uint8_t key[TCP_WIRE_KEY_LEN],
                          const uint8_t nonce[TCP_WIRE_NONCE_LEN], int32_t connector,
                          int32_t acceptor)
{
    mr__put_le32(out, TCP_WIRE_AUTH_MAGIC);
    mr__put_le16(out + 4, TCP_WIRE_AUTH_VERSION);
    mr__put_le16(out + 6, 0);
    uint8_t input[TCP_WIRE_NONCE_LEN + 8 + TCP_WIRE_AUTH_DOMAIN_LEN];

    mr__put_le32(out + 8, (uint32_t)connector);
    tcp_wire_auth_input(input, nonce, connector, acceptor);
    crypto_auth(out + 12, input, sizeof(input), key);
}

mr_status_t tcp_wire_auth_verify(const uint8_t *msg, size_t length,
                                 const uint8_t key[TCP_WIRE_KEY_LEN],
                                 const uint8_t nonce[TCP_WIRE_NONCE_LEN], int32_t acceptor,
                                 int32_t *connector, tcp_wire_error_t *err)
{
    uint8_t input[TCP_WIRE_NONCE_LEN + 8 + TCP_WIRE_AUTH_DOMAIN_LEN];

    if (msg == NULL || length < TCP_WIRE_AUTH_LEN) return MR_AGAIN;
    uint32_t magic = mr__get_le32(msg);
    uint16_t version = mr__get_le16(msg + 4), reserved = mr__get_le16(msg + 6);
    int32_t rank = (int32_t)mr__get_le32(msg + 8);

    if (magic != TCP_WIRE_AUTH_MAGIC) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, TCP_WIRE_BAD_MAGIC, "AUTH magic", magic);
    }
    if (version != TCP_WIRE_AUTH_VERSION) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, TCP_WIRE_BAD_VERSION, "AUTH version",
                             version);
    }
    if (reserved != 0) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, TCP_WIRE_BAD_RESERVED,
                             "nonzero reserved AUTH field", reserved);
    }
    if (rank < 0 || rank >= acceptor) {
        return mr__wire_fail(err, MR_ERR_INVALID_RANK, TCP_WIRE_BAD_RANK,
                             "rank that does not connect to this one", rank);
    }
    tcp_wire_auth_input(input, nonce, rank, acceptor);
    if (crypto_auth_verify(msg + 12, input, sizeof(input), key) != 0) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, TCP_WIRE_BAD_MAC,
                             "wrong proof of the job key for rank", rank);
    }
    *connector = rank;
    return MR_OK;
}

/* ------------------------------------------------------------------------ */
/* Frames.                                                                   */

void tcp_wire_frame_encode(uint8_t out[TCP_WIRE_HDR_LEN], uint8_t channel, uint8_t kind,
                           uint32_t imm, uint32_t length)
{
    mr__put_le32(out, length);
    mr__put_le32(out + 4, imm);
    out[8] = kind;
    out[9] = channel;
    mr__put_le16(out + 10, 0);
}

mr_status_t tcp_wire_frame_decode(const uint8_t *buf, size_t avail, size_t max_length,
                                  tcp_wire_frame_t *out, tcp_wire_error_t *err)
{
    if (buf == NULL || avail < TCP_WIRE_HDR_LEN) return MR_AGAIN;
    uint32_t length = mr__get_le32(buf), imm = mr__get_le32(buf + 4);
    uint8_t kind = buf[8], channel = buf[9];
    uint16_t reserved = mr__get_le16(buf + 10);

    if (reserved != 0) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, TCP_WIRE_BAD_RESERVED,
                             "nonzero reserved header field", reserved);
    }
    if (channel == TCP_WIRE_CH_CONTROL) {
        if (length != 0) {
            return mr__wire_fail(err, MR_ERR_PROTOCOL, TCP_WIRE_CONTROL_PAYLOAD,
                                 "control frame with a payload of bytes", length);
        }
    } else if (channel != TCP_WIRE_CH_DATA) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, TCP_WIRE_BAD_CHANNEL, "unknown channel",
                             channel);
    } else if (length > max_length) {
        return mr__wire_fail(err, MR_ERR_MESSAGE_TOO_LONG, TCP_WIRE_TOO_LONG,
                             "data frame longer than the datagram size, bytes", length);
    }
    out->length = length;
    out->imm = imm;
    out->kind = kind;
    out->channel = channel;
    out->got = 0;
    return MR_OK;
}

size_t tcp_wire_frame_take(tcp_wire_frame_t *f, size_t avail, size_t *offset)
{
    size_t need = tcp_wire_frame_need(f);
    size_t k = avail < need ? avail : need;

    *offset = f->got;
    f->got += (uint32_t)k;
    return k;
}
