/*
 * The input layout of the TCP wire-format fuzz target, shared by the target
 * (fuzz_tcp_wire.c) and the generator of its seed corpus
 * (make_tcp_wire_corpus.c):
 *
 *     byte  0       acceptor rank (0 to 255)
 *     bytes 1-2     datagram size limit, little-endian (0 to 65535)
 *     byte  3       seed of the chunk sizes of the stream
 *     bytes 4-19    the acceptor's nonce
 *     bytes 20-63   the connector's AUTH message (fewer: truncated)
 *     bytes 64-     the frame stream
 */
#ifndef MR_FUZZ_TCP_WIRE_H
#define MR_FUZZ_TCP_WIRE_H

#include "tcp_wire.h"

#define FUZZ_TCP_NONCE_AT 4
#define FUZZ_TCP_AUTH_AT (FUZZ_TCP_NONCE_AT + TCP_WIRE_NONCE_LEN)
#define FUZZ_TCP_STREAM_AT (FUZZ_TCP_AUTH_AT + TCP_WIRE_AUTH_LEN)

/* The job key of every handshake in the corpus. */
static const uint8_t fuzz_tcp_key[TCP_WIRE_KEY_LEN] = "MailRail-fuzzkey-of-32-bytes....";

#endif /* MR_FUZZ_TCP_WIRE_H */
