/*
 * connect(), watch() and preconnect(). connect() only reads the address
 * table: a rank connects to a peer when its first message or credit to it
 * leaves (tcp_connector.c), so that it holds a socket and buffers only for
 * the peers it talks to. watch() connects to a ring neighbour at once, so
 * that its death is seen (core/runtime/failures.c); of each pair, the lower
 * rank dials. preconnect() dials a peer for mr_connect() and says when the
 * handshake is done.
 */
#include "tcp_substrate.h"

#include <arpa/inet.h>
#include <netinet/in.h>

mr_status_t tcp__connect(mr_substrate_t *s, const void *addrs, size_t addr_len)
{
    if (s == NULL || s->connect_started) return MR_ERR_INVALID_PARAM;
    s->connect_started = true;
    if (s->base.size > 1 && (addrs == NULL || addr_len < TCP_WIRE_ADDR_LEN)) {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: the address table holds %zu-byte entries, fewer "
                "than the %d bytes of a TCP address.", addr_len, TCP_WIRE_ADDR_LEN);
        return MR_ERR_PROTOCOL;
    }
    for (int r = 0; r < s->base.size && s->base.size > 1; r++) {
        const uint8_t *blob = (const uint8_t *)addrs + (size_t)r * addr_len;
        tcp_conn_t *c = &s->conns[r];
        if (tcp_wire_addr_parse(blob, addr_len, &c->addr, NULL) != MR_OK ||
            c->addr.sin_port == 0 ||
            c->addr.sin_addr.s_addr == htonl(INADDR_ANY)) {
            MR__LOG(s, MR_LOG_ERROR, "TCP substrate: the address of rank %d is not a valid TCP "
                    "substrate address (wrong magic, version, port or IP address).", r);
            return MR_ERR_PROTOCOL;
        }
    }
    s->connected = true;
    return MR_OK;
}

mr_status_t tcp__watch(mr_substrate_t *s, int rank)
{
    mr_status_t st = mr__send_target_check(s, rank);

    if (st != MR_OK) return st;
    if (!s->connected) return MR_ERR_INVALID_PARAM;
    /* The higher rank of the pair is asked too, and waits for our connection. */
    if (rank < s->base.rank) return MR_OK;
    return tcp__conn_dial(s, &s->conns[rank]);
}

/*
 * Dials `rank` as its first message would, and says whether the connection
 * is established: MR_OK once it is, the handshake done from this end (as the
 * connector, the acceptor's ACCEPT checked; as the acceptor, its AUTH checked
 * and the ACCEPT written), MR_AGAIN while the dial or the handshake is under
 * way. When both ranks dial, the lower rank's connection is kept, as for
 * sends (tcp_accept.c).
 */
mr_status_t tcp__preconnect(mr_substrate_t *s, int rank)
{
    mr_status_t st = mr__send_target_check(s, rank);
    tcp_conn_t *c;

    if (st != MR_OK) return st;
    if (!s->connected) return MR_ERR_INVALID_PARAM;
    c = &s->conns[rank];
    switch (c->state) {
    case C_ESTABLISHED:
        return c->hs_off < c->hs_out ? MR_AGAIN : MR_OK;
    case C_FAILED:
    case C_CLOSED:
        return MR_ERR_PEER_FAILED;
    case C_NONE:
        st = tcp__conn_dial(s, c);
        return st == MR_OK ? MR_AGAIN : st;
    default:
        return MR_AGAIN;
    }
}
