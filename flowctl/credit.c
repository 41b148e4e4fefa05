/*
 * Credit returns and the zero-credit clock, shared by the rank and node
 * policies.
 */
#include "mr_credit.h"
#include "mr_log.h"
#include "mr_time.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/*
 * The grants cover at least this long at the receiver's best recent rate
 * (MAILRAIL_CREDIT_HORIZON_US; this is its default, for callers that leave
 * it 0): longer than a credit loop through shared memory or a switch, so that
 * a receiver that is not the bottleneck lets its senders run at full speed,
 * and short enough that what waits in a switch in front of a bottlenecked
 * receiver (1 ms at 200 Mbit/s is 25 KB) fits a shallow buffer. A
 * measured loop longer than half of it lengthens it, and so does twice the
 * mean of the latest loops. docs/incast.md has the numbers.
 */
#define CREDIT_HORIZON_NS (1 * MR_NS_PER_MS)
/* Twice the mean of the latest loops (mr_credit_window_t.recent_us) lengthens it up to this. */
#define CREDIT_HORIZON_MAX_NS (500 * MR_NS_PER_MS)
/* Arrivals are counted in intervals of at least this long to estimate the rate. */
#define CREDIT_INTERVAL_NS (1 * MR_NS_PER_MS)
/* The rate estimate loses 2% per interval, at most 50 intervals' worth at once. */
#define CREDIT_RATE_DECAY 0.98
#define CREDIT_DECAY_STEPS_MAX 50
/* Active keys and the shortest loop are taken over epochs this long. */
#define CREDIT_EPOCH_NS (250 * MR_NS_PER_MS)
/*
 * A cumulative return is said again when its key sent nothing for this long,
 * or four mean credit loops if that is longer (up to the maximum): well
 * before TCP's retransmission timeout (200 ms at least) ends the wait. Each
 * return is said at most CREDIT_REPEATS more times, each time through the
 * next of the key's senders.
 */
#define CREDIT_REPEAT_NS (5 * MR_NS_PER_MS)
#define CREDIT_REPEAT_MAX_NS (100 * MR_NS_PER_MS)
#define CREDIT_REPEATS 2
/* A key that sent fewer messages than this in an epoch does not count as active. */
#define CREDIT_ACTIVE_ARRIVALS 2

mr_status_t mr__credit_share(const char *policy, const char *setting, const char *what,
                             uint64_t configured, size_t recv_slots, int keys, uint32_t *out)
{
    uint64_t share = configured ? configured : recv_slots / (uint64_t)keys;
    uint64_t needed = mr__credit_slots_needed(configured, keys);

    if (share == 0 || share * (uint64_t)keys > recv_slots) {
        mr_error("MAILRAIL_FLOWCTL=%s: %s=%llu credits for each of %d %s need %llu receive slots, "
                 "but MAILRAIL_RECV_SLOTS=%zu; set MAILRAIL_RECV_SLOTS=%llu (or leave it unset: "
                 "the pool then grows to what the policy needs), or lower %s.",
                 policy, setting, (unsigned long long)(configured ? configured : 1), keys, what,
                 (unsigned long long)needed, recv_slots, (unsigned long long)needed, setting);
        return MR_ERR_CONFIG;
    }
    if (share > UINT32_MAX) share = UINT32_MAX;
    *out = (uint32_t)share;
    return MR_OK;
}

mr_status_t mr__credit_owed_init(mr_credit_owed_t *o, int nkeys, uint32_t limit, bool adaptive,
                                const uint32_t *weight, const mr_flowctl_params_t *params)
{
    uint32_t initial = mr__credit_initial(limit, adaptive);

    memset(o, 0, sizeof(*o));
    o->nkeys = nkeys;
    o->limit = limit;
    o->threshold = params->return_threshold;
    o->grow = params->grow;
    o->key = calloc((size_t)nkeys, sizeof(*o->key));
    o->retry = calloc((size_t)nkeys, sizeof(*o->retry));
    o->watch = calloc((size_t)nkeys, sizeof(*o->watch));
    o->core = params->core;
    o->send_control = params->send_control;
    if (o->key == NULL || o->retry == NULL || o->watch == NULL) {
        mr_error("Cannot allocate credit-return state for %d senders.", nkeys);
        mr__credit_owed_fini(o);
        return MR_ERR_NO_MEMORY;
    }
    /* Every key starts with `initial` credits; the rest of its share waits here. */
    for (int k = 0; k < nkeys; k++) {
        o->key[k].adaptive = adaptive && weight[k] != 0;
        o->key[k].weight = weight[k];
        o->key[k].held = o->key[k].adaptive ? initial : limit;
        o->key[k].owed = limit - o->key[k].held;
        o->key[k].epoch = UINT32_MAX;
        o->key[k].sender[0] = -1; /* None yet (mr_credit_key_t.sender). */
    }
    o->win.adaptive = adaptive;
    uint64_t horizon = params->horizon_ns != 0 ? params->horizon_ns : CREDIT_HORIZON_NS;
    o->win.horizon_min_ns = horizon < CREDIT_HORIZON_MAX_NS ? horizon : CREDIT_HORIZON_MAX_NS;
    o->win.per_rank_q8 = 0; /* Every holder starts at the floor, MR_CREDIT_INITIAL. */
    o->win.active = 1;
    o->static_return_at = mr__credit_return_at(limit, o->threshold);
    for (int k = 0; k < nkeys; k++) mr__credit_key_refresh(o, &o->key[k]);
    return MR_OK;
}

void mr__credit_key_refresh(const mr_credit_owed_t *o, mr_credit_key_t *k)
{
    k->return_at = mr__credit_owed_return_at(o, (int)(k - o->key));
    k->return_at_q8 = o->win.per_rank_q8;
}

static uint32_t credit_active(const mr_credit_window_t *w)
{
    uint32_t active = w->active > w->active_now ? w->active : w->active_now;
    return active > 0 ? active : 1;
}

/*
 * The mean of the latest loops (0 before MR_CREDIT_LOOPS were measured): by
 * Little's law what a window must cover to keep the rate, the loops that a
 * lost packet stretched by a retransmission included, since the credits of a
 * stalled connection wait in it, not in front of the port.
 */
static uint64_t credit_mean_loop_ns(const mr_credit_window_t *w)
{
    uint64_t sum = 0;

    if (w->nrecent < MR_CREDIT_LOOPS) return 0;
    for (int i = 0; i < MR_CREDIT_LOOPS; i++) sum += w->recent_us[i];
    return sum * 1000u / MR_CREDIT_LOOPS;
}

void mr__credit_owed_fini(mr_credit_owed_t *o)
{
    if (o->win.adaptive && o->win.rate > 0) {
        mr_debug("Credit window: %.2f per rank over %u active sending rank(s); peak rate %.0f messages/s, "
                 "shortest credit loop %.1f us, mean of the latest %.1f us.",
                 (double)o->win.per_rank_q8 / 256.0, credit_active(&o->win), o->win.rate,
                 (double)o->win.loop_ns / 1e3, (double)credit_mean_loop_ns(&o->win) / 1e3);
    }
    if (o->repeats > 0) mr_debug("Credit returns said again: %llu.", (unsigned long long)o->repeats);
    if (o->grows > 0) {
        mr_debug("Credit windows doubled for senders that asked %llu time(s).",
                 (unsigned long long)o->grows);
    }
    free(o->key);
    free(o->retry);
    free(o->watch);
    memset(o, 0, sizeof(*o));
}

void mr__credit_owed_cumulative(mr_credit_owed_t *o)
{
    o->cumulative = true;
}

/* How long a key may send nothing with credits out before its total is said again. */
static uint64_t credit_repeat_after(const mr_credit_owed_t *o)
{
    uint64_t t = 4 * credit_mean_loop_ns(&o->win);

    if (t < CREDIT_REPEAT_NS) t = CREDIT_REPEAT_NS;
    return t > CREDIT_REPEAT_MAX_NS ? CREDIT_REPEAT_MAX_NS : t;
}

/*
 * Notes that `n` credits went back to `key`. When the key held none, its next
 * message can only come on these: the time until it arrives is one credit
 * loop (the return's way, the sender's reaction, the message's way). A
 * cumulative return goes on the watch list, to be said again if it was lost.
 */
static void credit_granted(mr_credit_owed_t *o, int key, uint32_t n)
{
    mr_credit_key_t *k = &o->key[key];
    uint64_t now = 0;

    if (k->adaptive && k->held == 0 && k->probe_t0 == 0) k->probe_t0 = now = mr__now_ns();
    k->owed -= n;
    k->held += n;
    k->total = (k->total + n) & MR_CREDIT_TOTAL_MASK;
    if (!o->cumulative || k->nsenders < 2) return;
    k->arrivals_seen = k->arrivals;
    k->resend_at = (now != 0 ? now : mr__now_ns()) + credit_repeat_after(o);
    k->resend_to = 0;
    k->repeated = 0;
    if (!k->watched) {
        k->watched = 1;
        o->watch[o->nwatch++] = key;
    }
}

uint32_t mr__credit_owed_take(mr_credit_owed_t *o, int key)
{
    mr_credit_key_t *k = &o->key[key];
    uint32_t at, n;

    /*
     * Only from half a return's worth on (rounded up, so at least 1): most
     * data messages then carry no credits, which lets a substrate send them
     * without a header (UCX), and the credits still leave before a control
     * message would take them. What may be returned is at most what is owed.
     */
    if (k->owed == 0) return 0;
    at = (mr__credit_key_return_at(o, k) + 1) / 2;
    if (k->owed < at) return 0;
    n = mr__credit_owed_returnable(o, key);
    if (n < at) return 0;
    /* A total of 0 (mod 2^30) would read as no credits: those go with the next return. */
    if (o->cumulative && ((k->total + n) & MR_CREDIT_TOTAL_MASK) == 0) return 0;
    credit_granted(o, key, n);
    k->last_take = n;
    return n;
}

/* Puts `key` on the list that mr__credit_owed_progress() sends. */
static void credit_queue(mr_credit_owed_t *o, int key)
{
    if (!o->key[key].queued) {
        o->key[key].queued = 1;
        o->retry[o->nretry++] = key;
    }
}

/* Makes `rank` the latest sender of `key`. */
static void credit_note_sender(mr_credit_key_t *k, int rank)
{
    int i = 0, last, keep = k->weight < MR_CREDIT_SENDERS ? (int)k->weight : MR_CREDIT_SENDERS;

    if (k->nsenders != 0 && k->sender[0] == rank) return;
    while (i < k->nsenders && k->sender[i] != rank) i++;
    if (keep < 1) keep = 1;
    last = i < k->nsenders ? i : (k->nsenders < keep ? k->nsenders++ : k->nsenders - 1);
    for (i = last; i > 0; i--) k->sender[i] = k->sender[i - 1];
    k->sender[0] = rank;
}

/*
 * Sends `n` credits to `key` in one control message, to its latest sender.
 * MR_AGAIN leaves them owed for a retry; a sender that is gone leaves them to
 * the next, and when none is left the key's credits no longer matter. One
 * message per return is what makes a node's control traffic k times smaller
 * than k ranks' (its neighbours learn of the credits through the shared pool).
 */
static mr_status_t credit_send(mr_credit_owed_t *o, int key, uint32_t n)
{
    mr_credit_key_t *k = &o->key[key];
    mr_status_t status = MR_OK;

    if (n == 0 || k->nsenders == 0) return MR_OK;
    while (k->nsenders > 0) {
        status = o->send_control(o->core, k->sender[0],
                                 o->cumulative ? (k->total + n) & MR_CREDIT_TOTAL_MASK : n);
        if (status == MR_OK) {
            credit_granted(o, key, n);
            return MR_OK;
        }
        if (status == MR_AGAIN) return MR_AGAIN;
        /* The peer is gone: the next latest sender takes the return. */
        k->nsenders--;
        memmove(&k->sender[0], &k->sender[1], k->nsenders * sizeof(k->sender[0]));
    }
    k->sender[0] = -1;
    k->owed = 0;
    return status;
}

/* Sends what may be returned to `key`; what is not sent goes on the retry list. */
static void credit_owed_return(mr_credit_owed_t *o, int key)
{
    if (credit_send(o, key, mr__credit_owed_returnable(o, key)) == MR_AGAIN) credit_queue(o, key);
}

/* The shortest credit loop of this epoch or the last, or 0. */
static uint64_t credit_shortest_loop_ns(const mr_credit_window_t *w)
{
    return w->loop_fresh_ns != 0 && (w->loop_ns == 0 || w->loop_fresh_ns < w->loop_ns)
               ? w->loop_fresh_ns
               : w->loop_ns;
}

/*
 * Sizes the window: the arrivals of one horizon at the receiver's best recent
 * rate, shared by the ranks that send to it (mr__credit_owed_window() applies
 * the floor of MR_CREDIT_INITIAL per holder).
 */
void mr__credit_window_resize(mr_credit_window_t *w, uint32_t limit)
{
    uint64_t loop = credit_shortest_loop_ns(w);
    uint64_t horizon = 2 * loop > w->horizon_min_ns ? 2 * loop : w->horizon_min_ns;
    /*
     * Twice the mean, as twice the shortest: a window of one mean loop at
     * the rate it allowed only keeps that rate, and the rate could not grow.
     */
    uint64_t mean = 2 * credit_mean_loop_ns(w);

    if (mean > horizon) horizon = mean > CREDIT_HORIZON_MAX_NS ? CREDIT_HORIZON_MAX_NS : mean;
    double per = w->rate * (double)horizon / 1e9 / (double)credit_active(w);

    /* A new per_rank_q8: each key works its return threshold out again when next asked. */
    w->per_rank_q8 = per >= (double)limit ? (uint64_t)limit << 8 : (uint64_t)(per * 256.0) + 1;
}

/*
 * Starts a new epoch: the keys and loops of the last one are what counts now.
 * A loop that no new one replaced in a whole epoch halves, until twice it is
 * within the horizon: holders whose window is wide never run dry, so they
 * time no loops, and one long loop of a job's start (a thousand ranks waking
 * at once) would otherwise keep the window wide for good (docs/incast.md).
 */
static void credit_epoch(mr_credit_window_t *w, uint64_t now)
{
    w->active = w->active_now;
    w->active_now = 0;
    if (w->loop_fresh_ns != 0) {
        w->loop_ns = w->loop_fresh_ns;
    } else if (2 * w->loop_ns > w->horizon_min_ns) {
        w->loop_ns /= 2;
    }
    w->loop_fresh_ns = 0;
    w->epoch++;
    w->epoch_end_ns = now + CREDIT_EPOCH_NS;
}

/*
 * A grown window halves for every whole epoch in which its senders never
 * asked, and the next ask may double it at once.
 */
static void credit_grown_decay(mr_credit_owed_t *o, mr_credit_key_t *k)
{
    uint32_t idle = o->win.epoch - k->asked_epoch;

    if (idle < 2) return;
    k->grown = idle - 1 < 32 ? k->grown >> (idle - 1) : 0;
    k->asked_epoch = o->win.epoch - 1;
    k->grown_ns = 0;
    mr__credit_key_refresh(o, k);
}

/* Counts an arrival for the rate, times loops, rolls epochs over, resizes the window. */
static void credit_window_arrival(mr_credit_owed_t *o, mr_credit_key_t *k)
{
    mr_credit_window_t *w = &o->win;
    uint64_t now = 0;

    if (k->epoch != w->epoch) {
        k->epoch = w->epoch;
        k->epoch_arrivals = 0;
        if (k->grown != 0) credit_grown_decay(o, k);
    }
    if (++k->epoch_arrivals == CREDIT_ACTIVE_ARRIVALS) w->active_now += k->weight;
    if (k->probe_t0 != 0) {
        now = mr__now_ns();
        uint64_t loop = now - k->probe_t0;
        k->probe_t0 = 0;
        if (w->loop_fresh_ns == 0 || loop < w->loop_fresh_ns) w->loop_fresh_ns = loop;
        w->recent_us[w->nrecent++ % MR_CREDIT_LOOPS] =
            loop / 1000u > UINT32_MAX ? UINT32_MAX : (uint32_t)(loop / 1000u);
    }
    if ((++w->interval_arrivals & 15) != 0) return;
    if (now == 0) now = mr__now_ns();
    if (w->interval_start_ns == 0) {
        w->interval_start_ns = now;
        w->epoch_end_ns = now + CREDIT_EPOCH_NS;
        w->interval_arrivals = 0;
        return;
    }
    uint64_t span = now - w->interval_start_ns;
    if (span < CREDIT_INTERVAL_NS) return;
    double rate = (double)w->interval_arrivals / ((double)span / 1e9);
    double decayed = w->rate;
    for (uint64_t t = CREDIT_INTERVAL_NS, steps = 0;
         t <= span && steps < CREDIT_DECAY_STEPS_MAX; t += CREDIT_INTERVAL_NS, steps++) {
        decayed *= CREDIT_RATE_DECAY;
    }
    w->rate = rate > decayed ? rate : decayed;
    w->interval_start_ns = now;
    w->interval_arrivals = 0;
    bool new_epoch = now >= w->epoch_end_ns;

    if (new_epoch) credit_epoch(w, now);
    mr__credit_window_resize(w, o->limit);
    /* The window over time, one line per epoch (docs/incast.md reads it). */
    if (new_epoch) {
        mr_debug("Credit epoch %u: %.2f per rank over %u active sending rank(s); rate %.0f "
                 "messages/s, shortest loop %.1f us, mean of the latest %.1f us, %u loops "
                 "timed so far.",
                 w->epoch, (double)w->per_rank_q8 / 256.0, credit_active(w), w->rate,
                 (double)w->loop_ns / 1e3, (double)credit_mean_loop_ns(w) / 1e3, w->nrecent);
    }
}

void mr__credit_owed_arrived(mr_credit_owed_t *o, int key, int rank)
{
    mr_credit_key_t *k = &o->key[key];

    k->arrivals++;
    if (k->held > 0) {
        k->held--;
    } else {
        o->uncredited++;
        if (!o->underflow_logged) {
            mr_error("A message from rank %d came without a credit this rank granted; do all "
                     "ranks use the same MAILRAIL_FLOWCTL and credit settings?", rank);
            o->underflow_logged = true;
        }
    }
    if (!k->adaptive) return;
    credit_window_arrival(o, k);
    /*
     * Slots that were never granted, or a window that grew, can make credits
     * due without a release (an application may hold its messages while it
     * waits for more): progress sends them, outside this upcall.
     */
    credit_note_sender(k, rank);
    if (!k->queued && mr__credit_owed_returnable(o, key) >= mr__credit_key_return_at(o, k)) {
        credit_queue(o, key);
    }
}

/*
 * How long after a doubling its credits can have come back, or 0 before any
 * credit loop was timed: the mean of the latest loops, twice the shortest, or
 * the shortest horizon, whichever is longest.
 */
static uint64_t credit_settle_ns(const mr_credit_window_t *w)
{
    uint64_t shortest = credit_shortest_loop_ns(w), t = credit_mean_loop_ns(w);

    if (shortest == 0) return 0;
    if (2 * shortest > t) t = 2 * shortest;
    return t > w->horizon_min_ns ? t : w->horizon_min_ns;
}

void mr__credit_owed_asked(mr_credit_owed_t *o, int key)
{
    mr_credit_key_t *k = &o->key[key];
    const mr_credit_window_t *w = &o->win;
    uint64_t now;

    if (!o->grow || !k->adaptive) return;
    k->asked_epoch = w->epoch;
    /* Not before a loop is timed, nor within a loop of the last doubling. */
    uint64_t settle = credit_settle_ns(w);
    if (settle == 0) return;
    now = mr__now_ns();
    if (k->grown_ns != 0 && now - k->grown_ns < settle) return;
    uint32_t window = mr__credit_owed_window(o, key);
    if (window >= o->limit) return;
    k->grown = window < o->limit / 2 ? 2 * window : o->limit;
    o->grows++;
    k->grown_ns = now;
    mr__credit_key_refresh(o, k); /* The return threshold follows the window. */
    if (!k->queued && mr__credit_owed_returnable(o, key) >= k->return_at) credit_queue(o, key);
}

mr_status_t mr__credit_ask(const mr_credit_owed_t *o, int key, int dest)
{
    if (!o->grow || !o->key[key].adaptive) return MR_OK;
    return o->send_control(o->core, dest, MR_CREDIT_ASK);
}

void mr__credit_owed_consume(mr_credit_owed_t *o, int key, int rank)
{
    mr_credit_key_t *k = &o->key[key];

    credit_note_sender(k, rank);
    /* What may be returned is at most what is owed: short of a return's worth, nothing is due. */
    if (++k->owed < mr__credit_key_return_at(o, k) || k->queued) return;
    if (mr__credit_owed_returnable(o, key) >= k->return_at) credit_owed_return(o, key);
}

/*
 * Says the total of `key` again, through the next of its senders after the
 * latest: the connection to the latest may be the one a lost packet holds up.
 */
static mr_status_t credit_repeat(mr_credit_owed_t *o, mr_credit_key_t *k)
{
    int to = k->resend_to + 1 < k->nsenders ? k->resend_to + 1 : 1;
    mr_status_t status = o->send_control(o->core, k->sender[to], k->total);

    if (status == MR_AGAIN) return status;
    k->resend_to = (uint8_t)to;
    k->repeated++;
    if (status == MR_OK) o->repeats++;
    return status;
}

/*
 * The watch list: a key with credits out that sent nothing since a look one
 * repeat interval ago gets its total said again, at most CREDIT_REPEATS times
 * per return; one that sent something, or holds nothing, is fine.
 */
static int credit_watch_progress(mr_credit_owed_t *o)
{
    int sent = 0, kept = 0;
    uint64_t now = mr__now_ns();

    for (int i = 0; i < o->nwatch; i++) {
        int key = o->watch[i];
        mr_credit_key_t *k = &o->key[key];

        if (k->held == 0 || k->nsenders < 2 || k->repeated >= CREDIT_REPEATS) {
            k->watched = 0;
            continue;
        }
        if (k->arrivals != k->arrivals_seen) {
            k->arrivals_seen = k->arrivals;
            k->resend_at = now + credit_repeat_after(o);
        } else if (now >= k->resend_at) {
            mr_status_t status = credit_repeat(o, k);
            if (status == MR_OK) sent++;
            k->resend_at = now + credit_repeat_after(o);
        }
        o->watch[kept++] = key;
    }
    o->nwatch = kept;
    return sent;
}

int mr__credit_owed_retry(mr_credit_owed_t *o)
{
    int sent = o->nwatch > 0 ? credit_watch_progress(o) : 0, kept = 0;

    for (int i = 0; i < o->nretry; i++) {
        int key = o->retry[i];
        mr_credit_key_t *k = &o->key[key];
        uint32_t n = mr__credit_owed_returnable(o, key);
        mr_status_t status;

        /* Piggybacking may have paid the debt meanwhile. */
        if (n < mr__credit_key_return_at(o, k) || n == 0) {
            k->queued = 0;
            continue;
        }
        status = credit_send(o, key, n);
        if (status == MR_AGAIN) {
            o->retry[kept++] = key;
            continue;
        }
        k->queued = 0;
        if (status == MR_OK) sent++;
    }
    o->nretry = kept;
    return sent;
}

int mr__credit_owed_outstanding(const mr_credit_owed_t *o, uint32_t *out, int count)
{
    for (int k = 0; k < count && k < o->nkeys; k++) out[k] = o->key[k].held;
    return o->nkeys;
}

mr_status_t mr__credit_clock_init(mr_credit_clock_t *c, int ndest)
{
    c->total_ns = 0;
    c->since = calloc((size_t)ndest, sizeof(*c->since));
    if (c->since == NULL) {
        mr_error("Cannot allocate the zero-credit clock for %d destinations.", ndest);
        return MR_ERR_NO_MEMORY;
    }
    return MR_OK;
}

void mr__credit_clock_fini(mr_credit_clock_t *c)
{
    free(c->since);
    c->since = NULL;
}

void mr__credit_clock_stop(mr_credit_clock_t *c, int dest)
{
    c->total_ns += mr__now_ns() - c->since[dest];
    c->since[dest] = 0;
}
