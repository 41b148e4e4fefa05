/*
 * The TCP substrate's open() and its steps: settings and key, the port, the
 * descriptor limit, per-peer state, epoll and the listening socket. Also
 * get_address() (the listener's address as a blob) and format_address().
 */
#include "tcp_substrate.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>

/* ------------------------------------------------------------------------ */
/* open() and its steps.                                                    */

static mr_status_t tcp_resolve(mr_substrate_t *s, const char *text, struct in_addr *out)
{
    struct ifaddrs *ifs, *ifa;
    bool found = false;

    if (inet_pton(AF_INET, text, out) == 1) {
        if (out->s_addr == htonl(INADDR_ANY)) {
            MR__LOG(s, MR_LOG_ERROR,
                    "TCP substrate: MAILRAIL_TCP_ADDR=%s is the wildcard address, which peers "
                    "cannot connect to; name a specific IPv4 address or a network interface.",
                    text);
            return MR_ERR_CONFIG;
        }
        return MR_OK;
    }
    if (getifaddrs(&ifs) != 0) {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: cannot list the network interfaces: %s.",
                strerror(errno));
        return MR_ERR_TRANSPORT;
    }
    for (ifa = ifs; ifa != NULL; ifa = ifa->ifa_next) {
        if (ifa->ifa_addr == NULL || ifa->ifa_addr->sa_family != AF_INET ||
            ifa->ifa_name == NULL || strcmp(ifa->ifa_name, text) != 0) {
            continue;
        }
        memcpy(out, &((const struct sockaddr_in *)(const void *)ifa->ifa_addr)->sin_addr,
               sizeof(*out));
        found = true;
        break;
    }
    freeifaddrs(ifs);
    if (!found) {
        MR__LOG(s, MR_LOG_ERROR,
                "TCP substrate: MAILRAIL_TCP_ADDR=%s is neither an IPv4 address nor the name of a "
                "network interface that has an IPv4 address.",
                text);
        return MR_ERR_CONFIG;
    }
    return MR_OK;
}

/*
 * A rank holds a socket for each peer it talks to, plus its listener, epoll
 * and connections being authenticated: up to one per rank of the job when it
 * talks to every other. The soft RLIMIT_NOFILE is raised towards that (within
 * the hard limit). A hard limit below it is no reason not to start, since
 * most ranks talk to few peers: it is said once, on rank 0, with the number
 * to ask for, and a rank that does run out of descriptors fails the peers it
 * cannot connect to with a message that names the limit (tcp_connector.c).
 */
static void tcp_reserve_descriptors(mr_substrate_t *s)
{
    rlim_t need = (rlim_t)s->base.size + TCP_MAX_PENDING + TCP_SPARE_FDS;
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need) {
        return;
    }
    rlim_t was = rl.rlim_cur, want = need;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) {
        want = rl.rlim_max;
        if (s->base.rank == 0) {
            MR__LOG(s, MR_LOG_WARN,
                    "TCP substrate: the hard descriptor limit (ulimit -Hn) is %llu; a rank that "
                    "talks to every other of these %d ranks needs about %llu. Ranks talking to "
                    "fewer peers run as they are.", (unsigned long long)rl.rlim_max,
                    s->base.size, (unsigned long long)need);
        }
    }
    if (want <= was) return;
    rl.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        MR__LOG(s, MR_LOG_WARN, "TCP substrate: cannot raise the descriptor limit from %llu to "
                "%llu: %s.", (unsigned long long)was, (unsigned long long)want, strerror(errno));
        return;
    }
    MR__LOG(s, MR_LOG_INFO, "TCP substrate: raised the soft descriptor limit from %llu to %llu for "
            "%d ranks.", (unsigned long long)was, (unsigned long long)want, s->base.size);
}

/* Copies the job key and the settings; nothing is open yet. */
static void tcp_init_state(mr_substrate_t *s, const mr_substrate_params_t *p)
{
    _Static_assert(MR_JOB_KEY_LEN == TCP_WIRE_KEY_LEN, "the handshake's key is the job key");
    memcpy(s->key, p->job_key, TCP_WIRE_KEY_LEN);
    memcpy(&s->cfg, p->config, sizeof(s->cfg));
    s->cfg.addr[sizeof(s->cfg.addr) - 1] = '\0';
    s->auth_timeout_ns = s->cfg.auth_timeout_s * MR_NS_PER_S;
    s->epfd = -1;
    s->lfd = -1;
    for (unsigned k = 0; k < TCP_MAX_PENDING; k++) s->pending[k].fd = -1;
}

static mr_status_t tcp_init_mac(mr_substrate_t *s)
{
    if (tcp_wire_init() == MR_OK) return MR_OK;
    MR__LOG(s, MR_LOG_ERROR, "TCP substrate: libsodium cannot be initialized.");
    return MR_ERR_TRANSPORT;
}

/* Rank r listens on MAILRAIL_TCP_PORT + r, which must be a port. */
static mr_status_t tcp_check_port(mr_substrate_t *s)
{
    if (s->cfg.port > 65535 || (s->cfg.port != 0 && s->cfg.port + (uint64_t)s->base.rank > 65535)) {
        MR__LOG(s, MR_LOG_ERROR,
                "TCP substrate: MAILRAIL_TCP_PORT=%llu plus rank %d exceeds the largest port, "
                "65535.",
                (unsigned long long)s->cfg.port, s->base.rank);
        return MR_ERR_CONFIG;
    }
    return MR_OK;
}

/*
 * Per-peer state and the request pool. A connection's buffers come when it is
 * first used (tcp__conn_buffers()); nothing is allocated on the data path.
 */
static mr_status_t tcp_alloc_peers(mr_substrate_t *s)
{
    s->conns = calloc((size_t)s->base.size, sizeof(*s->conns));
    s->reqs = calloc(s->base.max_sends, sizeof(*s->reqs));
    if (s->conns == NULL || s->reqs == NULL || mr__failq_init(&s->failq, s->base.size) != MR_OK) {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: out of memory for %d peers and %zu sends.",
                s->base.size, s->base.max_sends);
        return MR_ERR_NO_MEMORY;
    }
    for (int r = 0; r < s->base.size; r++) {
        tcp_conn_t *c = &s->conns[r];
        c->fd = -1;
        c->rank = r;
        c->state = C_NONE;
    }
    for (size_t i = s->base.max_sends; i-- > 0;) tcp__req_free(s, &s->reqs[i]);
    return MR_OK;
}

/* The epoll instance that drives every socket. */
static mr_status_t tcp_create_epoll(mr_substrate_t *s)
{
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (s->epfd >= 0) return MR_OK;
    MR__LOG(s, MR_LOG_ERROR, "TCP substrate: epoll_create1 failed: %s.", strerror(errno));
    return MR_ERR_TRANSPORT;
}

/* Binds the listening socket to MAILRAIL_TCP_ADDR and the port; sets s->laddr. */
static mr_status_t tcp_bind_listener(mr_substrate_t *s)
{
    struct sockaddr_in sa;
    socklen_t salen = sizeof(s->laddr);
    mr_status_t st;
    int one = 1;

    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)(s->cfg.port ? s->cfg.port + (uint64_t)s->base.rank : 0));
    st = tcp_resolve(s, s->cfg.addr, &sa.sin_addr);
    if (st != MR_OK) return st;
    s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->lfd < 0) {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: cannot create the listening socket: %s.",
                strerror(errno));
        return MR_ERR_TRANSPORT;
    }
    setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(s->lfd, (const struct sockaddr *)&sa, sizeof(sa)) < 0) {
        char a[40];
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: cannot listen on %s (MAILRAIL_TCP_ADDR=%s, "
                "MAILRAIL_TCP_PORT=%llu): %s.", tcp__sin_str(&sa, a, sizeof(a)), s->cfg.addr,
                (unsigned long long)s->cfg.port, strerror(errno));
        return MR_ERR_TRANSPORT;
    }
    if (listen(s->lfd, SOMAXCONN) < 0 ||
        getsockname(s->lfd, (struct sockaddr *)&s->laddr, &salen) < 0) {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: cannot listen: %s.", strerror(errno));
        return MR_ERR_TRANSPORT;
    }
    return MR_OK;
}

/* Adds the listening socket to the epoll set. */
static mr_status_t tcp_watch_listener(mr_substrate_t *s)
{
    bool reg = false;
    uint32_t interest = 0;
    int err = tcp__set_interest(s, s->lfd, TAG(TAG_LISTEN, 0, 0), &reg, &interest, EPOLLIN);

    s->listen_registered = reg;
    if (err != 0) {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: cannot watch the listening socket: %s.",
                strerror(-err));
        return MR_ERR_TRANSPORT;
    }
    if (mr__log_enabled(&s->base, MR_LOG_DEBUG)) {
        char a[40];
        MR__LOG(s, MR_LOG_DEBUG, "TCP substrate: rank %d listens on %s.", s->base.rank,
                tcp__sin_str(&s->laddr, a, sizeof(a)));
    }
    return MR_OK;
}

mr_status_t tcp__open(const mr_substrate_params_t *p, mr_substrate_t **out)
{
    mr_substrate_t *s = NULL;
    mr_status_t st = mr__substrate_alloc(p, sizeof(*s), "TCP substrate", UINT32_MAX, true, &s);

    if (st != MR_OK) return st;
    tcp_init_state(s, p);
    st = tcp_init_mac(s);
    if (st == MR_OK) st = tcp_check_port(s);
    if (st == MR_OK) tcp_reserve_descriptors(s);
    if (st == MR_OK) st = tcp_alloc_peers(s);
    if (st == MR_OK) st = tcp_create_epoll(s);
    if (st == MR_OK) st = tcp_bind_listener(s);
    if (st == MR_OK) st = tcp_watch_listener(s);
    if (st != MR_OK) {
        tcp__close(s);
        return st;
    }
    *out = s;
    return MR_OK;
}

/* ------------------------------------------------------------------------ */
/* Addresses.                                                               */

mr_status_t tcp__get_address(mr_substrate_t *s, void *addr, size_t *length)
{
    uint8_t w[TCP_WIRE_ADDR_LEN];

    if (s == NULL || addr == NULL || length == NULL) return MR_ERR_INVALID_PARAM;
    tcp_wire_addr_encode(w, &s->laddr);
    memcpy(addr, w, sizeof(w));
    *length = sizeof(w);
    return MR_OK;
}

void tcp__format_address(const void *addr, size_t length, char *buf, size_t len)
{
    struct sockaddr_in sin;
    char a[40];

    if (buf == NULL || len == 0) return;
    if (tcp_wire_addr_parse(addr, length, &sin, NULL) != MR_OK) {
        snprintf(buf, len, "tcp (not a TCP substrate address)");
        return;
    }
    snprintf(buf, len, "tcp %s", tcp__sin_str(&sin, a, sizeof(a)));
}
