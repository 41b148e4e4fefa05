/*
 * Writes the seed corpus of the TCP wire-format fuzz target into a directory
 * (tests/fuzz/corpus/tcp_wire): genuine handshakes followed by good frames,
 * and the malformed inputs a hostile or broken peer could send. The files are
 * committed; rerun this after a change of the wire format:
 *
 *     cc -std=c11 -D_GNU_SOURCE -Icore/include -Icore/plugin -Isubstrates/common -Isubstrates/tcp \
 *        -Itests/fuzz tests/fuzz/make_tcp_wire_corpus.c substrates/tcp/tcp_wire.c -lsodium \
 *        -o /tmp/make_corpus
 *     /tmp/make_corpus tests/fuzz/corpus/tcp_wire
 */
#include "fuzz_corpus.h"
#include "fuzz_tcp_wire.h"

#include <arpa/inet.h>

/* The prefix: acceptor, limit, chunk seed, nonce, and the AUTH of `connector`. */
static void corpus_start(corpus_input_t *in, uint8_t acceptor, uint16_t limit, uint8_t seed,
                         int32_t connector, size_t auth_len)
{
    uint8_t nonce[TCP_WIRE_NONCE_LEN], auth[TCP_WIRE_AUTH_LEN];
    uint8_t head[4] = {acceptor, (uint8_t)limit, (uint8_t)(limit >> 8), seed};

    for (unsigned i = 0; i < sizeof(nonce); i++) nonce[i] = (uint8_t)(0x31 * i + seed);
    tcp_wire_auth_encode(auth, fuzz_tcp_key, nonce, connector, acceptor);
    in->len = 0;
    corpus_put(in, head, sizeof(head));
    corpus_put(in, nonce, sizeof(nonce));
    corpus_put(in, auth, auth_len);
}

static void corpus_frame(corpus_input_t *in, uint8_t channel, uint8_t kind, uint32_t imm,
                         uint32_t length, size_t payload)
{
    uint8_t h[TCP_WIRE_HDR_LEN];

    tcp_wire_frame_encode(h, channel, kind, imm, length);
    corpus_put(in, h, sizeof(h));
    for (size_t i = 0; i < payload; i++) {
        uint8_t b = (uint8_t)(i * 7 + length);
        corpus_put(in, &b, 1);
    }
}

int main(int argc, char **argv)
{
    static corpus_input_t in;
    const char *dir = corpus_dir(argc, argv);

    if (tcp_wire_init() != MR_OK) return 1;

    /* Genuine handshakes and good frames. */
    corpus_start(&in, 4, 4096, 0, 1, TCP_WIRE_AUTH_LEN);
    corpus_write(dir, "handshake_only", &in);
    corpus_frame(&in, TCP_WIRE_CH_CONTROL, 0, 7, 0, 0);
    corpus_frame(&in, TCP_WIRE_CH_DATA, 3, 0x01020304, 5, 5);
    corpus_frame(&in, TCP_WIRE_CH_DATA, 0, 0, 0, 0);
    corpus_frame(&in, TCP_WIRE_CH_CONTROL, 0, 0xffffffffu, 0, 0);
    corpus_frame(&in, TCP_WIRE_CH_DATA, 255, 9, 100, 100);
    corpus_write(dir, "handshake_frames", &in);

    corpus_start(&in, 200, 65535, 0x5c, 199, TCP_WIRE_AUTH_LEN);
    for (uint32_t i = 0; i < 40; i++) {
        corpus_frame(&in, i % 5 == 0 ? TCP_WIRE_CH_CONTROL : TCP_WIRE_CH_DATA, (uint8_t)i, i,
                     i % 5 == 0 ? 0 : i, i % 5 == 0 ? 0 : i);
    }
    corpus_write(dir, "many_small_frames", &in);

    corpus_start(&in, 2, 65535, 0x08, 0, TCP_WIRE_AUTH_LEN);
    corpus_frame(&in, TCP_WIRE_CH_DATA, 1, 1, 3000, 3000);
    corpus_frame(&in, TCP_WIRE_CH_DATA, 2, 2, 65535, 65535 / 4);
    corpus_write(dir, "large_frames", &in);

    /* Malformed handshakes. */
    corpus_start(&in, 4, 4096, 0, 1, 9);
    corpus_write(dir, "auth_truncated", &in);
    corpus_start(&in, 4, 4096, 0, 1, TCP_WIRE_AUTH_LEN);
    in.bytes[FUZZ_TCP_AUTH_AT] ^= 0xff;
    corpus_frame(&in, TCP_WIRE_CH_DATA, 1, 1, 4, 4);
    corpus_write(dir, "auth_bad_magic", &in);
    corpus_start(&in, 4, 4096, 0, 1, TCP_WIRE_AUTH_LEN);
    in.bytes[FUZZ_TCP_AUTH_AT + 4] = 9;
    corpus_write(dir, "auth_bad_version", &in);
    corpus_start(&in, 4, 4096, 0, 1, TCP_WIRE_AUTH_LEN);
    in.bytes[FUZZ_TCP_STREAM_AT - 1] ^= 0x40;
    corpus_write(dir, "auth_wrong_mac", &in);
    corpus_start(&in, 4, 4096, 0, 4, TCP_WIRE_AUTH_LEN);
    corpus_write(dir, "auth_rank_too_high", &in);
    corpus_start(&in, 4, 4096, 0, -1, TCP_WIRE_AUTH_LEN);
    corpus_write(dir, "auth_rank_negative", &in);

    /* Malformed frames after a genuine handshake. */
    corpus_start(&in, 4, 4096, 0, 1, TCP_WIRE_AUTH_LEN);
    corpus_frame(&in, TCP_WIRE_CH_DATA, 1, 1, 4, 4);
    in.len -= 4 + 5; /* Seven bytes of the header. */
    corpus_write(dir, "frame_truncated_header", &in);
    corpus_start(&in, 4, 4096, 0x21, 1, TCP_WIRE_AUTH_LEN);
    corpus_frame(&in, TCP_WIRE_CH_DATA, 1, 1, 200, 50);
    corpus_write(dir, "frame_truncated_payload", &in);
    corpus_start(&in, 4, 4096, 0, 1, TCP_WIRE_AUTH_LEN);
    corpus_frame(&in, TCP_WIRE_CH_DATA, 1, 1, 0xffffffffu, 16);
    corpus_write(dir, "frame_absurd_length", &in);
    corpus_start(&in, 4, 512, 0, 1, TCP_WIRE_AUTH_LEN);
    corpus_frame(&in, TCP_WIRE_CH_DATA, 1, 1, 512, 512);
    corpus_frame(&in, TCP_WIRE_CH_DATA, 1, 1, 513, 513);
    corpus_write(dir, "frame_over_limit", &in);
    corpus_start(&in, 4, 4096, 0, 1, TCP_WIRE_AUTH_LEN);
    corpus_frame(&in, 2, 0, 0, 0, 0);
    corpus_write(dir, "frame_bad_channel", &in);
    corpus_start(&in, 4, 4096, 0, 1, TCP_WIRE_AUTH_LEN);
    corpus_frame(&in, TCP_WIRE_CH_CONTROL, 0, 1, 4, 4);
    corpus_write(dir, "frame_control_payload", &in);
    corpus_start(&in, 4, 4096, 0, 1, TCP_WIRE_AUTH_LEN);
    corpus_frame(&in, TCP_WIRE_CH_DATA, 0, 1, 4, 4);
    in.bytes[in.len - 4 - 1] = 1; /* The reserved field. */
    corpus_write(dir, "frame_bad_reserved", &in);

    /* An address blob, and the same blob with a stranger's magic. */
    struct sockaddr_in sin;
    uint8_t blob[TCP_WIRE_ADDR_LEN];
    memset(&sin, 0, sizeof(sin));
    sin.sin_port = htons(40000);
    sin.sin_addr.s_addr = htonl(0x7f000001);
    tcp_wire_addr_encode(blob, &sin);
    in.len = 0;
    corpus_put(&in, blob, sizeof(blob));
    corpus_write(dir, "addr_valid", &in);
    in.bytes[0] = 'X';
    corpus_write(dir, "addr_bad_magic", &in);
    return 0;
}
