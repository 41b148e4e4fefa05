/*
 * libFuzzer target: the TCP substrate's wire format (substrates/tcp/tcp_wire.c),
 * the parser of every byte a peer or a stranger sends.
 *
 * The input layout is described in fuzz_tcp_wire.h.
 *
 * The AUTH message goes through the verifier under a fixed job key (the seed
 * corpus holds genuine handshakes made with it by tests/fuzz/make_tcp_wire_corpus.c).
 * The stream is then read the way conn_read() in tcp_input.c reads a
 * socket: chunks of fuzz-chosen sizes land in a small receive buffer, headers
 * are decoded from it, payload goes into an exactly sized slot, partly from
 * the buffer and partly "straight from the socket". The properties checked:
 * no decoder reads past its input (ASan), an accepted data frame is never
 * longer than the limit and re-encodes to the same header, a refusal comes
 * with a negative status and a reason, the bytes consumed never exceed the
 * input, and every delivered payload is exactly the bytes of the stream that
 * followed its header. The address parser gets the whole input as a blob.
 */
#include "fuzz_tcp_wire.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_RXBUF 64 /* Small, so that partial headers and compaction are common. */

/* The stream, handed out in chunks whose sizes a small PRNG draws from the seed. */
typedef struct fuzz_stream {
    const uint8_t *data;
    size_t size, pos;
    uint32_t rng;
} fuzz_stream_t;

/* Copies the next chunk (at most `room` bytes) to `dst`; 0 at the end of the stream. */
static size_t fuzz_recv(fuzz_stream_t *st, uint8_t *dst, size_t room)
{
    size_t left = st->size - st->pos, n;

    st->rng ^= st->rng << 13;
    st->rng ^= st->rng >> 17;
    st->rng ^= st->rng << 5;
    /* Mostly small chunks, sometimes "all that fits". */
    n = (st->rng & 7) == 0 ? room : 1 + (st->rng >> 8) % 23;
    if (n > room) n = room;
    if (n > left) n = left;
    memcpy(dst, st->data + st->pos, n);
    st->pos += n;
    return n;
}

static void fuzz_check_error(mr_status_t status, const tcp_wire_error_t *err)
{
    if (status >= 0 || err->what == NULL || err->what[0] == '\0') abort();
}

static void fuzz_auth(const uint8_t *data, size_t size)
{
    int32_t acceptor = data[0], rank = -1;
    const uint8_t *nonce = data + FUZZ_TCP_NONCE_AT;
    size_t len = size - FUZZ_TCP_AUTH_AT;
    tcp_wire_error_t err;
    uint8_t again[TCP_WIRE_AUTH_LEN];

    if (len > TCP_WIRE_AUTH_LEN) len = TCP_WIRE_AUTH_LEN;
    /* An exact copy, so that ASan catches a read one byte past the end. */
    uint8_t *msg = malloc(len ? len : 1);
    memcpy(msg, data + FUZZ_TCP_AUTH_AT, len);
    int32_t job = acceptor + 2 + data[1] % 8; /* Ranks in the job: at least the acceptor + 1. */
    mr_status_t st = tcp_wire_auth_verify(msg, len, fuzz_tcp_key, nonce, acceptor, job, &rank,
                                          &err);
    if (st == MR_OK) {
        /* Genuine: another rank of the job, and the message is the one it would send. */
        if (rank < 0 || rank >= job || rank == acceptor) abort();
        tcp_wire_auth_encode(again, fuzz_tcp_key, nonce, rank, acceptor);
        if (memcmp(again, msg, TCP_WIRE_AUTH_LEN) != 0) abort();
    } else if (st == MR_AGAIN) {
        if (len >= TCP_WIRE_AUTH_LEN || rank != -1) abort();
    } else {
        fuzz_check_error(st, &err);
        if (rank != -1) abort();
    }
    /* Whatever the nonce, an honest connector passes, and the ACCEPT it gets back too. */
    int32_t honest = (int32_t)((acceptor + 1 + data[3] % (uint32_t)(job - 1)) % (uint32_t)job);
    tcp_wire_auth_encode(again, fuzz_tcp_key, nonce, honest, acceptor);
    if (tcp_wire_auth_verify(again, sizeof(again), fuzz_tcp_key, nonce, acceptor, job, &rank,
                             &err) != MR_OK || rank != honest) {
        abort();
    }
    uint8_t accept[TCP_WIRE_ACCEPT_LEN];
    tcp_wire_accept_encode(accept, fuzz_tcp_key, nonce, honest, acceptor);
    if (tcp_wire_accept_verify(accept, sizeof(accept), fuzz_tcp_key, nonce, honest, acceptor,
                               &err) != MR_OK) {
        abort();
    }
    /* The fuzzed bytes as an ACCEPT: refused unless they are the genuine one. */
    st = tcp_wire_accept_verify(msg, len, fuzz_tcp_key, nonce, honest, acceptor, &err);
    if (st == MR_OK && memcmp(msg, accept, TCP_WIRE_ACCEPT_LEN) != 0) abort();
    if (st < 0) fuzz_check_error(st, &err);
    free(msg);
}

/* Reads the frame stream like conn_read(); returns the bytes of it consumed. */
static size_t fuzz_frames(fuzz_stream_t *st, size_t limit)
{
    uint8_t rxbuf[FUZZ_RXBUF];
    size_t rx_start = 0, rx_end = 0, consumed = 0, payload_at = 0;
    tcp_wire_frame_t frame;
    uint8_t *slot = NULL;
    bool in_payload = false;

    for (;;) {
        if (!in_payload) {
            size_t avail = rx_end - rx_start;
            tcp_wire_frame_t f;
            tcp_wire_error_t err;
            uint8_t again[TCP_WIRE_HDR_LEN];

            /* The decoder sees an exact copy of the unparsed bytes, for ASan's sake. */
            uint8_t *exact = malloc(avail ? avail : 1);
            memcpy(exact, rxbuf + rx_start, avail);
            memset(&f, 0xa5, sizeof(f));
            mr_status_t status = tcp_wire_frame_decode(exact, avail, limit, &f, &err);
            free(exact);
            if (status == MR_OK) {
                if (avail < TCP_WIRE_HDR_LEN || f.got != 0) abort();
                if (f.channel == TCP_WIRE_CH_DATA) {
                    if (f.length > limit) abort();
                } else if (f.channel != TCP_WIRE_CH_CONTROL || f.length != 0) {
                    abort();
                }
                tcp_wire_frame_encode(again, f.channel, f.kind, f.imm, f.length);
                if (memcmp(again, rxbuf + rx_start, TCP_WIRE_HDR_LEN) != 0) abort();
                rx_start += TCP_WIRE_HDR_LEN;
                consumed += TCP_WIRE_HDR_LEN;
                if (f.channel == TCP_WIRE_CH_CONTROL) continue;
                frame = f;
                payload_at = consumed;
                /* Exactly sized, so that ASan catches a write past the payload. */
                slot = malloc(frame.length ? frame.length : 1);
                in_payload = true;
                continue;
            }
            if (status != MR_AGAIN) {
                /* The substrate closes the connection here. */
                fuzz_check_error(status, &err);
                if (avail < TCP_WIRE_HDR_LEN) abort();
                break;
            }
            if (avail >= TCP_WIRE_HDR_LEN) abort();
            if (rx_start > 0) {
                memmove(rxbuf, rxbuf + rx_start, avail);
                rx_start = 0;
                rx_end = avail;
            }
            size_t n = fuzz_recv(st, rxbuf + rx_end, FUZZ_RXBUF - rx_end);
            if (n == 0) break; /* End of stream. */
            rx_end += n;
            continue;
        }

        size_t need = tcp_wire_frame_need(&frame);
        size_t avail = rx_end - rx_start;
        if (avail > 0 && need > 0) {
            size_t off, k = tcp_wire_frame_take(&frame, avail, &off);
            if (k > avail || k > need || off + k > frame.length) abort();
            memcpy(slot + off, rxbuf + rx_start, k);
            rx_start += k;
            consumed += k;
            need -= k;
        }
        if (need == 0) {
            if (frame.got != frame.length) abort();
            /* The payload is exactly the bytes that followed the header. */
            if (frame.length > 0 && memcmp(slot, st->data + payload_at, frame.length) != 0) {
                abort();
            }
            free(slot);
            slot = NULL;
            in_payload = false;
            if (rx_start == rx_end) rx_start = rx_end = 0;
            continue;
        }
        /* The buffer is empty: payload straight into the slot, what follows into rxbuf. */
        uint8_t direct[FUZZ_RXBUF + 4096];
        size_t room = need + FUZZ_RXBUF < sizeof(direct) ? need + FUZZ_RXBUF : sizeof(direct);
        size_t n = fuzz_recv(st, direct, room);
        if (n == 0) break; /* End of stream in the middle of a frame. */
        size_t got = frame.got;
        size_t off, k = tcp_wire_frame_take(&frame, n, &off);
        if (k > n || k > need || off != got || off + k > frame.length) abort();
        if (n - k > FUZZ_RXBUF) abort();
        memcpy(slot + off, direct, k);
        memcpy(rxbuf, direct + k, n - k);
        rx_start = 0;
        rx_end = n - k;
        consumed += k;
    }
    free(slot);
    if (consumed > st->size || consumed > st->pos) abort();
    return consumed;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (tcp_wire_init() != MR_OK) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sockaddr_in sin;
    tcp_wire_error_t err;

    /* The address parser sees the whole input as a blob, copied to its exact size. */
    uint8_t *blob = malloc(size ? size : 1);
    memcpy(blob, data, size);
    mr_status_t st = tcp_wire_addr_parse(size ? blob : NULL, size, &sin, &err);
    if (st == MR_OK) {
        uint8_t again[TCP_WIRE_ADDR_LEN];
        tcp_wire_addr_encode(again, &sin);
        if (size < TCP_WIRE_ADDR_LEN || memcmp(again, blob, 4) != 0 ||
            memcmp(again + 6, blob + 6, 6) != 0) {
            abort();
        }
    } else {
        fuzz_check_error(st, &err);
    }
    free(blob);

    if (size < FUZZ_TCP_AUTH_AT) return 0;
    fuzz_auth(data, size);
    if (size <= FUZZ_TCP_STREAM_AT) return 0;

    fuzz_stream_t stream = {.data = data + FUZZ_TCP_STREAM_AT, .size = size - FUZZ_TCP_STREAM_AT, .pos = 0,
                            .rng = 0x9e3779b9u ^ ((uint32_t)data[3] * 0x01000193u)};
    size_t limit = (size_t)data[1] | ((size_t)data[2] << 8);
    fuzz_frames(&stream, limit);
    return 0;
}
