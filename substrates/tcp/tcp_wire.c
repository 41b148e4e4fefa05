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
#define TCP_WIRE_ACCEPT_DOMAIN "MRTCP-ACCEPT"
/* The MAC's input: nonce, both ranks, and the longer domain string at most. */
#define TCP_WIRE_MAC_INPUT_MAX (TCP_WIRE_NONCE_LEN + 8 + sizeof(TCP_WIRE_ACCEPT_DOMAIN) - 1)

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

/*
 * What the MAC of an AUTH or ACCEPT message covers: the nonce, both ranks and
 * the message's domain string. Returns the input's length.
 */
static size_t tcp_wire_mac_input(uint8_t msg[TCP_WIRE_MAC_INPUT_MAX],
                                 const uint8_t nonce[TCP_WIRE_NONCE_LEN], int32_t connector,
                                 int32_t acceptor, const char *domain)
{
    size_t dlen = strlen(domain);

    memcpy(msg, nonce, TCP_WIRE_NONCE_LEN);
    mr__put_le32(msg + TCP_WIRE_NONCE_LEN, (uint32_t)connector);
    mr__put_le32(msg + TCP_WIRE_NONCE_LEN + 4, (uint32_t)acceptor);
    memcpy(msg + TCP_WIRE_NONCE_LEN + 8, domain, dlen);
    return TCP_WIRE_NONCE_LEN + 8 + dlen;
}

/* Writes magic, version, reserved, `rank` and the MAC of an AUTH or ACCEPT message. */
static void tcp_wire_hs_encode(uint8_t *out, uint32_t magic, int32_t rank,
                               const uint8_t key[TCP_WIRE_KEY_LEN],
                               const uint8_t nonce[TCP_WIRE_NONCE_LEN], int32_t connector,
                               int32_t acceptor, const char *domain)
{
    uint8_t input[TCP_WIRE_MAC_INPUT_MAX];
    size_t len = tcp_wire_mac_input(input, nonce, connector, acceptor, domain);

    mr__put_le32(out, magic);
    mr__put_le16(out + 4, TCP_WIRE_AUTH_VERSION);
    mr__put_le16(out + 6, 0);
    mr__put_le32(out + 8, (uint32_t)rank);
    crypto_auth(out + 12, input, len, key);
}

/*
 * Checks the header of an AUTH or ACCEPT message (by `magic`) and reads its
 * rank. MR_AGAIN while it is incomplete.
 */
static mr_status_t tcp_wire_hs_header(const uint8_t *msg, size_t length, uint32_t magic,
                                      int32_t *rank, tcp_wire_error_t *err)
{
    if (msg == NULL || length < 12 + TCP_WIRE_MAC_LEN) return MR_AGAIN;
    uint32_t got = mr__get_le32(msg);
    uint16_t version = mr__get_le16(msg + 4), reserved = mr__get_le16(msg + 6);

    if (got != magic) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, TCP_WIRE_BAD_MAGIC,
                             magic == TCP_WIRE_AUTH_MAGIC ? "AUTH magic" : "ACCEPT magic", got);
    }
    if (version != TCP_WIRE_AUTH_VERSION) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, TCP_WIRE_BAD_VERSION,
                             magic == TCP_WIRE_AUTH_MAGIC ? "AUTH version" : "ACCEPT version",
                             version);
    }
    if (reserved != 0) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, TCP_WIRE_BAD_RESERVED,
                             magic == TCP_WIRE_AUTH_MAGIC ? "nonzero reserved AUTH field"
                                                          : "nonzero reserved ACCEPT field",
                             reserved);
    }
    *rank = (int32_t)mr__get_le32(msg + 8);
    return MR_OK;
}

/* Checks the MAC of an AUTH or ACCEPT message in constant time. */
static bool tcp_wire_hs_mac_ok(const uint8_t *msg, const uint8_t key[TCP_WIRE_KEY_LEN],
                               const uint8_t nonce[TCP_WIRE_NONCE_LEN], int32_t connector,
                               int32_t acceptor, const char *domain)
{
    uint8_t input[TCP_WIRE_MAC_INPUT_MAX];
    size_t len = tcp_wire_mac_input(input, nonce, connector, acceptor, domain);

    return crypto_auth_verify(msg + 12, input, len, key) == 0;
}

void tcp_wire_auth_encode(uint8_t out[TCP_WIRE_AUTH_LEN], const uint8_t key[TCP_WIRE_KEY_LEN],
                          const uint8_t nonce[TCP_WIRE_NONCE_LEN], int32_t connector,
                          int32_t acceptor)
{
    tcp_wire_hs_encode(out, TCP_WIRE_AUTH_MAGIC, connector, key, nonce, connector, acceptor,
                       TCP_WIRE_AUTH_DOMAIN);
}

mr_status_t tcp_wire_auth_verify(const uint8_t *msg, size_t length,
                                 const uint8_t key[TCP_WIRE_KEY_LEN],
                                 const uint8_t nonce[TCP_WIRE_NONCE_LEN], int32_t acceptor,
                                 int32_t size, int32_t *connector, tcp_wire_error_t *err)
{
    int32_t rank;
    mr_status_t st = tcp_wire_hs_header(msg, length, TCP_WIRE_AUTH_MAGIC, &rank, err);

    if (st != MR_OK) return st;
    if (rank < 0 || rank >= size || rank == acceptor) {
        return mr__wire_fail(err, MR_ERR_INVALID_RANK, TCP_WIRE_BAD_RANK,
                             "rank that is not another rank of the job", rank);
    }
    if (!tcp_wire_hs_mac_ok(msg, key, nonce, rank, acceptor, TCP_WIRE_AUTH_DOMAIN)) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, TCP_WIRE_BAD_MAC,
                             "wrong proof of the job key for rank", rank);
    }
    *connector = rank;
    return MR_OK;
}

void tcp_wire_accept_encode(uint8_t out[TCP_WIRE_ACCEPT_LEN], const uint8_t key[TCP_WIRE_KEY_LEN],
                            const uint8_t nonce[TCP_WIRE_NONCE_LEN], int32_t connector,
                            int32_t acceptor)
{
    tcp_wire_hs_encode(out, TCP_WIRE_ACCEPT_MAGIC, acceptor, key, nonce, connector, acceptor,
                       TCP_WIRE_ACCEPT_DOMAIN);
}

mr_status_t tcp_wire_accept_verify(const uint8_t *msg, size_t length,
                                   const uint8_t key[TCP_WIRE_KEY_LEN],
                                   const uint8_t nonce[TCP_WIRE_NONCE_LEN], int32_t connector,
                                   int32_t acceptor, tcp_wire_error_t *err)
{
    int32_t rank;
    mr_status_t st = tcp_wire_hs_header(msg, length, TCP_WIRE_ACCEPT_MAGIC, &rank, err);

    if (st != MR_OK) return st;
    if (rank != acceptor) {
        return mr__wire_fail(err, MR_ERR_INVALID_RANK, TCP_WIRE_BAD_RANK,
                             "ACCEPT from another rank than the one dialled", rank);
    }
    if (!tcp_wire_hs_mac_ok(msg, key, nonce, connector, acceptor, TCP_WIRE_ACCEPT_DOMAIN)) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, TCP_WIRE_BAD_MAC,
                             "wrong proof of the job key in the ACCEPT of rank", rank);
    }
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
