/*
 * A substrate double for the tests, never installed: ranks of one host
 * exchange messages as Unix datagrams, and the receiver breaks one of the
 * promises the core relies on, on purpose (MAILRAIL_FAULTY_FAULT), so that
 * test_breaches.c can show each credit-invariant count of mr_stats_t rise and
 * the tests' check fail:
 *
 *   duplicate    every MAILRAIL_FAULTY_EVERY-th data message arrives
 *                1 + MAILRAIL_FAULTY_COPIES times: arrivals beyond the credits,
 *                held beyond the pool while the application holds its slots;
 *   over_return  every control message returns MAILRAIL_FAULTY_COPIES x 1000
 *                credits more than the receiver sent;
 *   unacquired   every MAILRAIL_FAULTY_EVERY-th data message is delivered
 *                again in the slot it already filled;
 *   batch        every MAILRAIL_FAULTY_EVERY-th data message arrives as a
 *                batch of one frame (MR_KIND_BATCH), as a coalescing
 *                substrate delivers it: no promise broken;
 *   bad_batch    every MAILRAIL_FAULTY_EVERY-th data message arrives as a
 *                batch whose frame claims 8 bytes more than follow: the core
 *                must drop it, and still give its credit back;
 *   fat_batch    every MAILRAIL_FAULTY_EVERY-th data message arrives as a
 *                batch of 1 + MAILRAIL_FAULTY_COPIES frames, copies of it, in
 *                one receive slot: messages beyond the grant that take no
 *                more slots than the senders' credits;
 *   drop         every MAILRAIL_FAULTY_EVERY-th data message is lost: the
 *                core never sees it or its credit (exactly-once checks must
 *                name it).
 *
 * Messages that find no receive slot wait in a queue of copies, counted by
 * held(), as a real substrate's arrival queue would be.
 */
#include "mr_substrate_base.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

enum { FAULT_NONE, FAULT_DUPLICATE, FAULT_OVER_RETURN, FAULT_UNACQUIRED, FAULT_BATCH,
       FAULT_BAD_BATCH, FAULT_FAT_BATCH, FAULT_DROP };
static const char *const faulty_fault_names[] = {"none", "duplicate", "over_return", "unacquired",
                                                 "batch", "bad_batch", "fat_batch", "drop",
                                                 NULL};

typedef struct faulty_config {
    unsigned fault;
    uint64_t every;
    uint64_t copies;
} faulty_config_t;

static const mr_config_entry_t faulty_config_table[] = {
    {"MAILRAIL_FAULTY_FAULT", "none", MR_CONFIG_ENUM, offsetof(faulty_config_t, fault), 0, 0,
     faulty_fault_names, "The promise this test double breaks (tests/doubles/substrate_faulty.c)."},
    {"MAILRAIL_FAULTY_EVERY", "5", MR_CONFIG_UINT, offsetof(faulty_config_t, every), 1, 1000000,
     NULL, "Break it on every this-many-th data message received."},
    {"MAILRAIL_FAULTY_COPIES", "1", MR_CONFIG_UINT, offsetof(faulty_config_t, copies), 1, 1000,
     NULL, "Extra copies of a duplicated message; thousands of extra credits per return."},
    {NULL, NULL, 0, 0, 0, 0, NULL, NULL},
};

/* A datagram: this header, then the payload. */
typedef struct faulty_hdr {
    uint8_t control;
    uint8_t kind;
    uint16_t pad;
    uint32_t imm;
    int32_t source;
} faulty_hdr_t;

/* A message that waits for a receive slot. */
typedef struct faulty_held {
    struct faulty_held *next;
    faulty_hdr_t hdr;
    size_t length;
    uint8_t data[];
} faulty_held_t;

struct mr_substrate {
    mr__substrate_base_t base;
    faulty_config_t cfg;
    int fd;
    char job_id[64];
    struct sockaddr_un self;
    socklen_t self_len;
    struct sockaddr_un *peer;  /* Every rank's name, from the job's name (connect). */
    socklen_t *peer_len;
    uint8_t *buf;
    faulty_held_t *held_head, *held_tail;
    uint64_t nheld, data_received;
};
MR__BASE_CHECK();

/* The abstract socket name of `rank` in job `job_id`. */
static socklen_t faulty_name(struct sockaddr_un *sun, const char *job_id, int rank)
{
    memset(sun, 0, sizeof(*sun));
    sun->sun_family = AF_UNIX;
    int n = snprintf(sun->sun_path + 1, sizeof(sun->sun_path) - 1, "mailrail-faulty-%s-%d",
                     job_id, rank);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static mr_status_t faulty_open(const mr_substrate_params_t *p, mr_substrate_t **out)
{
    mr_substrate_t *s;
    mr_status_t st = mr__substrate_alloc(p, sizeof(*s), "faulty substrate", 60000, false, &s);

    if (st != MR_OK) return st;
    memcpy(&s->cfg, p->config, sizeof(s->cfg));
    snprintf(s->job_id, sizeof(s->job_id), "%s", p->job_id);
    s->buf = malloc(sizeof(faulty_hdr_t) + p->datagram_size);
    s->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    s->self_len = faulty_name(&s->self, p->job_id, p->rank);
    if (s->buf == NULL || s->fd < 0 ||
        bind(s->fd, (struct sockaddr *)&s->self, s->self_len) != 0) {
        MR__LOG(s, MR_LOG_ERROR, "faulty substrate: cannot bind its socket: %s.", strerror(errno));
        if (s->fd >= 0) close(s->fd);
        free(s->buf);
        free(s);
        return MR_ERR_TRANSPORT;
    }
    *out = s;
    return MR_OK;
}

static mr_status_t faulty_get_address(mr_substrate_t *s, void *addr, size_t *length)
{
    memcpy(addr, &s->self, s->self_len);
    *length = s->self_len;
    return MR_OK;
}

static mr_status_t faulty_connect(mr_substrate_t *s, const void *addrs, size_t addr_len)
{
    (void)addrs;
    (void)addr_len;
    s->peer = calloc((size_t)s->base.size, sizeof(*s->peer));
    s->peer_len = calloc((size_t)s->base.size, sizeof(*s->peer_len));
    if (s->peer == NULL || s->peer_len == NULL) return MR_ERR_NO_MEMORY;
    for (int r = 0; r < s->base.size; r++) s->peer_len[r] = faulty_name(&s->peer[r], s->job_id, r);
    return MR_OK;
}

static mr_status_t faulty_sendto(mr_substrate_t *s, int dest, const faulty_hdr_t *h,
                                 const void *data, size_t length)
{
    struct iovec iov[2] = {{(void *)h, sizeof(*h)}, {(void *)data, length}};
    struct msghdr msg = {.msg_name = &s->peer[dest], .msg_namelen = s->peer_len[dest],
                         .msg_iov = iov, .msg_iovlen = 2};

    if (sendmsg(s->fd, &msg, MSG_DONTWAIT) >= 0) return MR_OK;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) return MR_AGAIN;
    MR__LOG(s, MR_LOG_ERROR, "faulty substrate: sending to rank %d: %s.", dest, strerror(errno));
    return MR_ERR_PEER_FAILED;
}

static mr_status_t faulty_send(mr_substrate_t *s, int dest, unsigned kind, uint32_t imm,
                               const void *data, size_t length, void *cookie)
{
    faulty_hdr_t h = {.control = 0, .kind = (uint8_t)kind, .imm = imm, .source = s->base.rank};
    mr_status_t st;

    (void)cookie;
    if ((st = mr__send_target_check(s, dest)) != MR_OK) return st;
    st = faulty_sendto(s, dest, &h, data, length);
    return st == MR_OK ? MR_SUBSTRATE_SENT : st; /* The kernel copied it. */
}

static mr_status_t faulty_send_control(mr_substrate_t *s, int dest, uint32_t imm)
{
    faulty_hdr_t h = {.control = 1, .imm = imm, .source = s->base.rank};
    return faulty_sendto(s, dest, &h, NULL, 0);
}

/* Queues a copy of a message that found no slot; held() counts it. */
static void faulty_hold(mr_substrate_t *s, const faulty_hdr_t *h, const void *data, size_t len)
{
    faulty_held_t *e = malloc(sizeof(*e) + len);

    if (e == NULL) {
        MR__LOG(s, MR_LOG_ERROR, "faulty substrate: out of memory; a message is lost.");
        return;
    }
    e->next = NULL;
    e->hdr = *h;
    e->length = len;
    memcpy(e->data, data, len);
    if (s->held_tail != NULL) s->held_tail->next = e;
    else s->held_head = e;
    s->held_tail = e;
    s->nheld++;
}

/* Delivers a copy now when nothing waits before it and a slot is free, else queues it. */
static void faulty_arrive(mr_substrate_t *s, const faulty_hdr_t *h, const void *data, size_t len)
{
    if (s->held_head == NULL &&
        s->base.up.deliver_copy(s->base.core, h->source, h->kind, h->imm, data, len) == MR_OK) {
        return;
    }
    faulty_hold(s, h, data, len);
}

/* Delivers into a slot of its own, then into that same slot again: the core must refuse. */
static void faulty_deliver_twice(mr_substrate_t *s, const faulty_hdr_t *h, const void *data,
                                 size_t len)
{
    void *slot = s->held_head == NULL ? s->base.up.recv_slot_acquire(s->base.core) : NULL;

    if (slot == NULL) {
        faulty_hold(s, h, data, len);
        return;
    }
    memcpy(slot, data, len);
    s->base.up.deliver(s->base.core, h->source, h->kind, h->imm, slot, len, NULL);
    (void)s->base.up.deliver(s->base.core, h->source, h->kind, 0, slot, len, NULL);
}

/*
 * Delivers a data message as a batch of `frames` copies of it (mr_substrate.h),
 * or as a malformed batch of one.
 */
static void faulty_arrive_batch(mr_substrate_t *s, const faulty_hdr_t *h, const void *data,
                                size_t len, bool malformed, uint64_t frames)
{
    size_t size = mr_frame_size(len);
    uint8_t *batch = size * frames <= s->base.datagram_size || frames == 1
                         ? calloc(frames, size) : NULL;
    uint32_t claim = (uint32_t)len + (malformed ? 8 : 0);
    faulty_hdr_t bh = *h;

    if (batch == NULL) {
        MR__LOG(s, MR_LOG_ERROR, "faulty substrate: no room for a batch of %llu frames of %zu "
                "bytes; a message is lost.", (unsigned long long)frames, len);
        return;
    }
    for (uint64_t f = 0; f < frames; f++) {
        uint8_t *frame = batch + f * size;
        for (int i = 0; i < 4; i++) frame[i] = (uint8_t)(claim >> (8 * i));
        memcpy(frame + MR_FRAME_HDR, data, len);
    }
    bh.kind = MR_KIND_BATCH;
    faulty_arrive(s, &bh, batch, size * frames);
    free(batch);
}

static void faulty_data(mr_substrate_t *s, const faulty_hdr_t *h, const void *data, size_t len)
{
    bool due = ++s->data_received % s->cfg.every == 0;

    if (due && s->cfg.fault == FAULT_DROP) return;
    if (due && (s->cfg.fault == FAULT_BATCH || s->cfg.fault == FAULT_BAD_BATCH)) {
        faulty_arrive_batch(s, h, data, len, s->cfg.fault == FAULT_BAD_BATCH, 1);
        return;
    }
    if (due && s->cfg.fault == FAULT_FAT_BATCH) {
        faulty_arrive_batch(s, h, data, len, false, 1 + s->cfg.copies);
        return;
    }

    if (due && s->cfg.fault == FAULT_UNACQUIRED) {
        faulty_deliver_twice(s, h, data, len);
        return;
    }
    faulty_arrive(s, h, data, len);
    if (due && s->cfg.fault == FAULT_DUPLICATE) {
        faulty_hdr_t copy = *h;
        copy.imm = 0; /* Credits come back once; the copy is what breaks the promise. */
        for (uint64_t c = 0; c < s->cfg.copies; c++) faulty_arrive(s, &copy, data, len);
    }
}

/* Hands queued messages slots, in order. */
static int faulty_drain_held(mr_substrate_t *s)
{
    int n = 0;

    while (s->held_head != NULL) {
        faulty_held_t *e = s->held_head;
        if (s->base.up.deliver_copy(s->base.core, e->hdr.source, e->hdr.kind, e->hdr.imm, e->data,
                                    e->length) != MR_OK) {
            break;
        }
        s->held_head = e->next;
        if (s->held_head == NULL) s->held_tail = NULL;
        s->nheld--;
        free(e);
        n++;
    }
    return n;
}

static int faulty_progress(mr_substrate_t *s, int timeout_ms)
{
    int events = faulty_drain_held(s);

    for (int budget = 0; budget < 64; budget++) {
        ssize_t n = recv(s->fd, s->buf, sizeof(faulty_hdr_t) + s->base.datagram_size, 0);
        faulty_hdr_t h;

        if (n < 0 && timeout_ms > 0 && events == 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pfd = {.fd = s->fd, .events = POLLIN};
            (void)poll(&pfd, 1, timeout_ms);
            timeout_ms = 0;
            continue;
        }
        if (n < (ssize_t)sizeof(h)) break;
        memcpy(&h, s->buf, sizeof(h));
        events++;
        if (h.control) {
            if (s->cfg.fault == FAULT_OVER_RETURN) h.imm += (uint32_t)(s->cfg.copies * 1000);
            s->base.up.control(s->base.core, h.source, h.imm);
        } else {
            faulty_data(s, &h, s->buf + sizeof(h), (size_t)n - sizeof(h));
        }
    }
    return events;
}

static uint64_t faulty_held(mr_substrate_t *s)
{
    return s->nheld;
}

static void faulty_format_address(const void *addr, size_t length, char *buf, size_t len)
{
    const struct sockaddr_un *sun = addr;
    size_t path = length > offsetof(struct sockaddr_un, sun_path) + 1
                      ? length - offsetof(struct sockaddr_un, sun_path) - 1
                      : 0;
    snprintf(buf, len, "faulty @%.*s", (int)path, sun->sun_path + 1);
}

static void faulty_close(mr_substrate_t *s)
{
    while (s->held_head != NULL) {
        faulty_held_t *e = s->held_head;
        s->held_head = e->next;
        free(e);
    }
    close(s->fd);
    free(s->peer);
    free(s->peer_len);
    free(s->buf);
    free(s);
}

static const mr_substrate_ops_t faulty_ops = {
    MR__SUBSTRATE_OPS_HEAD,
    .name = "faulty",
    .description = "Test double: Unix datagrams on one host, breaking one promise on purpose",
    .config_table = faulty_config_table,
    .config_size = sizeof(faulty_config_t),
    .open = faulty_open,
    .get_address = faulty_get_address,
    .connect = faulty_connect,
    .send = faulty_send,
    .send_control = faulty_send_control,
    .progress = faulty_progress,
    .format_address = faulty_format_address,
    .closing = mr__substrate_closing,
    .stats = mr__substrate_stats,
    .close = faulty_close,
    .held = faulty_held,
};

MR__SUBSTRATE_ENTRY(faulty_ops)
