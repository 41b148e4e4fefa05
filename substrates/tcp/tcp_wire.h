/*
 * The byte-level wire format of the TCP substrate: the address blob, the
 * AUTH message of the connection handshake and the frame header. Everything
 * here is pure: no sockets, no allocation, no global state, so that the unit
 * tests and the libFuzzer target (tests/fuzz/fuzz_tcp_wire.c) run exactly the
 * code that reads bytes from the network. docs/substrate-tcp.md
 * describes the protocol; this module is its only parser.
 * Internal to the plugin.
 *
 * Decoders return MR_OK, MR_AGAIN when the input is too short to decide
 * (more bytes are needed), or a negative status with a tcp_wire_error_t that
 * says why. Their output parameters are written on MR_OK only, and the error
 * on a negative status only.
 */
#ifndef MR_TCP_WIRE_H
#define MR_TCP_WIRE_H

#include "mailrail.h"
#include "mr_wire.h"

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>

/* The address blob: "MRTC", version, reserved, port and IPv4, network byte order. */
#define TCP_WIRE_ADDR_MAGIC 0x4d525443u
#define TCP_WIRE_ADDR_VERSION 1
#define TCP_WIRE_ADDR_LEN 12

/*
 * The handshake: a nonce from the acceptor, an AUTH message from the
 * connector, an ACCEPT message from the acceptor. Either rank of a pair may
 * connect (on its first message to the other); both prove the job key.
 */
#define TCP_WIRE_NONCE_LEN 16
#define TCP_WIRE_AUTH_MAGIC 0x4d524155u /* "MRAU" as a number, little-endian on the wire. */
#define TCP_WIRE_ACCEPT_MAGIC 0x4d524143u /* "MRAC" */
#define TCP_WIRE_AUTH_VERSION 3
#define TCP_WIRE_MAC_LEN 32
#define TCP_WIRE_AUTH_LEN (12 + TCP_WIRE_MAC_LEN)
#define TCP_WIRE_ACCEPT_LEN (12 + TCP_WIRE_MAC_LEN)
/* The MAC's key: the job key, all of it. */
#define TCP_WIRE_KEY_LEN 32

/* Frames: a 12-byte header, then `length` payload bytes on the data channel. */
#define TCP_WIRE_HDR_LEN 12
#define TCP_WIRE_CH_DATA 0
#define TCP_WIRE_CH_CONTROL 1

/* What a decoder found wrong. */
typedef enum tcp_wire_fault {
    TCP_WIRE_TRUNCATED = 1,      /* Fewer bytes than the structure has (a blob, not a stream). */
    TCP_WIRE_BAD_MAGIC,          /* Not a MailRail structure at all. */
    TCP_WIRE_BAD_VERSION,        /* Another version of the protocol. */
    TCP_WIRE_BAD_RESERVED,       /* A reserved field is not zero. */
    TCP_WIRE_BAD_RANK,           /* An AUTH or ACCEPT rank that is not the expected peer. */
    TCP_WIRE_BAD_MAC,            /* An AUTH or ACCEPT message without the proof of the job key. */
    TCP_WIRE_BAD_CHANNEL,        /* A frame on a channel other than data and control. */
    TCP_WIRE_CONTROL_PAYLOAD,    /* A control frame that announces payload bytes. */
    TCP_WIRE_TOO_LONG            /* A data frame longer than the datagram size. */
} tcp_wire_fault_t;

/* Why a decoder refused its input; `fault` is a tcp_wire_fault_t. */
typedef mr__wire_error_t tcp_wire_error_t;

/* A decoded frame header, and how much of its payload has been received. */
typedef struct tcp_wire_frame {
    uint32_t length;             /* Payload bytes; always 0 on the control channel. */
    uint32_t imm;
    uint8_t kind;
    uint8_t channel;             /* TCP_WIRE_CH_DATA or TCP_WIRE_CH_CONTROL. */
    uint32_t got;                /* Payload bytes taken by tcp_wire_frame_take(). */
} tcp_wire_frame_t;

/* Writes the address blob of an IPv4 endpoint. */
void tcp_wire_addr_encode(uint8_t out[TCP_WIRE_ADDR_LEN], const struct sockaddr_in *sin);

/*
 * Parses an address blob of `length` bytes (only the first TCP_WIRE_ADDR_LEN
 * are read). Returns MR_OK with *out set, or MR_ERR_PROTOCOL for a missing or
 * short blob, a wrong magic or a wrong version.
 */
mr_status_t tcp_wire_addr_parse(const void *blob, size_t length, struct sockaddr_in *out,
                                tcp_wire_error_t *err);

/* Readies the MAC (libsodium): call once before the AUTH functions. */
mr_status_t tcp_wire_init(void);

/*
 * Writes the AUTH message of `connector` to `acceptor` that answers `nonce`:
 * magic, version, reserved, connector rank, then the MAC under `key`
 * (HMAC-SHA-512-256, libsodium's crypto_auth) of nonce || connector ||
 * acceptor || "MRTCP-AUTH".
 */
void tcp_wire_auth_encode(uint8_t out[TCP_WIRE_AUTH_LEN], const uint8_t key[TCP_WIRE_KEY_LEN],
                          const uint8_t nonce[TCP_WIRE_NONCE_LEN], int32_t connector,
                          int32_t acceptor);

/*
 * Verifies the first TCP_WIRE_AUTH_LEN of the `length` bytes at `msg` as the
 * answer to `nonce` for the rank `acceptor` of a job of `size` ranks, in this
 * order: magic, version and reserved field (MR_ERR_PROTOCOL), a connector rank
 * in [0, size) other than the acceptor (MR_ERR_INVALID_RANK), then the MAC,
 * checked by libsodium in constant time (MR_ERR_PROTOCOL, fault
 * TCP_WIRE_BAD_MAC, value the claimed rank). Returns MR_AGAIN while fewer than
 * TCP_WIRE_AUTH_LEN bytes are there, and MR_OK with *connector set when the
 * message is genuine.
 */
mr_status_t tcp_wire_auth_verify(const uint8_t *msg, size_t length,
                                 const uint8_t key[TCP_WIRE_KEY_LEN],
                                 const uint8_t nonce[TCP_WIRE_NONCE_LEN], int32_t acceptor,
                                 int32_t size, int32_t *connector, tcp_wire_error_t *err);

/*
 * Writes the ACCEPT message with which `acceptor` takes the connection of
 * `connector` that it challenged with `nonce`: magic, version, reserved,
 * acceptor rank, then the MAC under `key` of nonce || connector || acceptor ||
 * "MRTCP-ACCEPT". It proves to the connector that it reached that rank of
 * its own job.
 */
void tcp_wire_accept_encode(uint8_t out[TCP_WIRE_ACCEPT_LEN], const uint8_t key[TCP_WIRE_KEY_LEN],
                            const uint8_t nonce[TCP_WIRE_NONCE_LEN], int32_t connector,
                            int32_t acceptor);

/*
 * Verifies an ACCEPT message as `connector` expects it from `acceptor` after
 * `nonce`: magic, version, reserved (MR_ERR_PROTOCOL), the acceptor's rank
 * (MR_ERR_INVALID_RANK, TCP_WIRE_BAD_RANK), the MAC (MR_ERR_PROTOCOL,
 * TCP_WIRE_BAD_MAC). MR_AGAIN while fewer than TCP_WIRE_ACCEPT_LEN bytes.
 */
mr_status_t tcp_wire_accept_verify(const uint8_t *msg, size_t length,
                                   const uint8_t key[TCP_WIRE_KEY_LEN],
                                   const uint8_t nonce[TCP_WIRE_NONCE_LEN], int32_t connector,
                                   int32_t acceptor, tcp_wire_error_t *err);

/* Writes a frame header. */
void tcp_wire_frame_encode(uint8_t out[TCP_WIRE_HDR_LEN], uint8_t channel, uint8_t kind,
                           uint32_t imm, uint32_t length);

/*
 * Decodes the frame header at the start of the `avail` bytes at `buf`, which
 * are the next bytes of the stream. Returns MR_AGAIN when avail is below
 * TCP_WIRE_HDR_LEN; MR_ERR_PROTOCOL for a nonzero reserved field, an unknown
 * channel or a control frame with payload; MR_ERR_MESSAGE_TOO_LONG for a data
 * frame longer than `max_length`; and MR_OK with *out set (got = 0), in which
 * case the header took exactly TCP_WIRE_HDR_LEN bytes of the stream and a data
 * frame's payload follows.
 */
mr_status_t tcp_wire_frame_decode(const uint8_t *buf, size_t avail, size_t max_length,
                                  tcp_wire_frame_t *out, tcp_wire_error_t *err);

/* Payload bytes of a decoded frame still to be received. */
static inline size_t tcp_wire_frame_need(const tcp_wire_frame_t *f)
{
    return (size_t)f->length - f->got;
}

/*
 * Takes the payload bytes among the next `avail` bytes of the stream: returns
 * how many belong to the frame (never more than avail or than it still needs)
 * and sets *offset to where they go in its payload. Bytes beyond the returned
 * count start the next frame.
 */
size_t tcp_wire_frame_take(tcp_wire_frame_t *f, size_t avail, size_t *offset);

#endif /* MR_TCP_WIRE_H */
