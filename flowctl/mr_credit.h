/*
 * Building blocks shared by the credit policies (rank and node). Internal.
 *
 * mr_credit_owed_t keeps, per key (a sending rank under `rank`, a sending
 * node under `node`), the credits a receiver has freed and not yet given
 * back and those it has granted, sizes the grants (mr_credit_window_t),
 * returns credits in a control message once they reach the threshold, and
 * retries returns the substrate refused. mr_credit_clock_t measures how long
 * sends waited for credit.
 */
#ifndef MR_CREDIT_H
#define MR_CREDIT_H

#include "mr_flowctl.h"
#include "mr_time.h"

#include <stdbool.h>
#include <stdint.h>

/*
 * What a receiver grants one key: `limit` credits are its share of the receive
 * slots and never more are outstanding. With adaptive grants (the default
 * when no credit count is set, for keys on other hosts: between ranks of one
 * host there is no switch to protect) a key starts with MR_CREDIT_INITIAL,
 * and the receiver keeps about `rate x horizon` credits outstanding over the
 * ranks that send to it, shared evenly, at least MR_CREDIT_INITIAL per rank:
 * `rate` is its best recent arrival rate, `horizon` is 1 ms, twice the
 * shortest credit loop it measured lately, or twice the mean of its latest
 * loops (up to 500 ms), whichever is longest. A key that stands
 * for several ranks (a node) gets the shares of its ranks, and one whose
 * senders ask for credit may get more (mr_credit_owed_t.grow). docs/flowctl.md
 * explains it, docs/incast.md measures it. Static grants keep window = limit.
 */
#define MR_CREDIT_INITIAL 2
/*
 * A key that stands for several ranks (a node) remembers this many of its
 * latest distinct senders: a return goes, whole, in one message to the latest,
 * which puts it in the node's pool and wakes the neighbours that wait for it;
 * when that rank is gone, to the next.
 */
#define MR_CREDIT_SENDERS 4

/*
 * The window covers twice the mean of this many latest credit loops too: where
 * senders share their cores with hundreds of ranks, a loop is mostly the time
 * they take to be scheduled, and where packets are lost, some loops last a
 * retransmission; a window sized by the shortest loop would let the rate,
 * and with it the window, shrink round after round.
 */
#define MR_CREDIT_LOOPS 15

typedef struct mr_credit_window {
    bool adaptive;
    uint64_t horizon_min_ns;  /* The shortest horizon (MAILRAIL_CREDIT_HORIZON_US). */
    uint64_t per_rank_q8;     /* Credits per active sending rank, in 1/256ths: a holder
                                 that stands for k ranks gets k times it, rounded up. */
    double rate;              /* Most arrivals per second lately (a decaying maximum). */
    uint64_t loop_ns;         /* Shortest credit loop of the last epoch, or 0. */
    uint64_t loop_fresh_ns;   /* Shortest of this epoch, or 0. */
    uint32_t recent_us[MR_CREDIT_LOOPS]; /* The latest loops (us), a ring, */
    uint32_t nrecent;         /* how many were measured (the ring holds the last ones). */
    uint64_t interval_start_ns;
    uint32_t interval_arrivals;
    uint64_t epoch_end_ns;
    uint32_t epoch;
    uint32_t active, active_now; /* Ranks of the keys that sent in the last epoch, and in
                                    this one. */
} mr_credit_window_t;

/*
 * One key's grant, as its receiver sees it. The fields that a release, an
 * arrival and a piggyback check read come first, together.
 */
typedef struct mr_credit_key {
    uint32_t owed;            /* Freed slots not yet granted back. */
    uint32_t held;            /* Granted credits whose messages have not arrived. */
    /*
     * mr__credit_owed_return_at() as of the window `return_at_q8` (the
     * mr_credit_window_t.per_rank_q8 it was worked out for): the window only
     * changes with per_rank_q8, at most once per interval of arrivals, so the
     * per-message paths compare one word instead of working the window and a
     * division out again (mr__credit_key_return_at()).
     */
    uint32_t return_at;
    uint32_t weight;          /* Adaptive: the sending ranks it stands for. */
    uint64_t return_at_q8;
    /*
     * A window grown because the key's senders asked for credit
     * (mr_credit_owed_t.grow), or 0: the key may hold this many when the
     * window of the rate is smaller.
     */
    uint32_t grown;
    uint8_t nsenders;         /* Its last distinct senders, the latest first: */
    uint8_t queued;           /* On the retry list. */
    bool adaptive;            /* Granted up to the window (else the whole share). */
    int32_t sender[MR_CREDIT_SENDERS]; /* returns go to the first (-1 while there is none). */
    uint32_t epoch;           /* The last epoch it sent in, and how much: */
    uint32_t epoch_arrivals;
    uint64_t probe_t0;        /* When credits went to it with none held, or 0. */
    uint32_t asked_epoch;     /* The last epoch its senders asked for credit in, */
    uint64_t grown_ns;        /* and when `grown` last doubled (or 0). */
    /* Cumulative returns (mr_credit_owed_t.cumulative): */
    uint32_t total;           /* credits granted back so far, mod 2^30: what a return says; */
    uint32_t last_take;       /* the last mr__credit_owed_take(), for a put-back; */
    uint32_t arrivals;        /* messages that came, mod 2^32; */
    uint32_t arrivals_seen;   /* as of the last look at the watch list; */
    uint64_t resend_at;       /* while credits are out: when to say the total again, or 0; */
    uint8_t watched;          /* on the watch list; */
    uint8_t resend_to;        /* the sender[] index the last repeat went to, */
    uint8_t repeated;         /* and how many times the last return was said again. */
} mr_credit_key_t;

typedef struct mr_credit_owed {
    int nkeys;
    uint32_t limit;       /* Credits per key: its share of the receive slots. */
    unsigned threshold;   /* MAILRAIL_CREDIT_RETURN_THRESHOLD. */
    uint32_t static_return_at; /* Return to a static key once this many are returnable. */
    bool underflow_logged;
    uint64_t uncredited;  /* Arrivals beyond a key's credits (mr_stats_t.breach_uncredited). */
    mr_credit_key_t *key;
    int *retry;           /* Keys with a return to send from progress. */
    int nretry;
    mr_credit_window_t win;
    /*
     * MAILRAIL_CREDIT_GROW: a sender that finds no credit asks its receiver
     * for more (mr__credit_ask(): a control message of MR_CREDIT_ASK, once per
     * wait, once per node under `node`), and the receiver doubles the key's
     * window, up to `limit`, at most once per credit loop; a window whose
     * senders stop asking halves every epoch. The window of the rate alone
     * can starve senders that no bottleneck holds back: it covers the rate
     * the window itself let through (docs/flowctl.md).
     */
    bool grow;
    uint64_t grows;       /* How often windows doubled (logged at fini). */
    /*
     * Returns say the total granted back so far instead of the count of this
     * one (`node`): a return said twice, or late, adds nothing, so a return
     * that a lost packet holds up is said again, after a few credit loops
     * without arrivals, through another of the key's senders (credit.c).
     */
    bool cumulative;
    int *watch;           /* Keys with credits out since their last return. */
    int nwatch;
    uint64_t repeats;     /* Returns said again. */
    void *core;
    mr_status_t (*send_control)(void *core, int dest, uint32_t imm);
} mr_credit_owed_t;

/*
 * Control immediates (mr_flowctl_params_t.send_control): a count of credits
 * (`rank`), a total mod 2^30 (`node`, mr_credit_owed_t.cumulative), or
 * MR_CREDIT_ASK, a sender's request for more (mr__credit_ask()). The core
 * keeps bit 31 for failure notices.
 */
#define MR_CREDIT_TOTAL_MASK 0x3fffffffu
#define MR_CREDIT_ASK 0x40000000u

/*
 * The credits a cumulative `total` adds to the total `applied` so far: none
 * when it is the same or older (said twice, or overtaken by a later one).
 * Totals wrap at 2^30; two that are applied one after the other differ by
 * at most a key's share, far less than 2^29.
 */
static inline uint32_t mr__credit_total_gain(uint32_t applied, uint32_t total)
{
    uint32_t gain = (total - applied) & MR_CREDIT_TOTAL_MASK;

    return gain <= MR_CREDIT_TOTAL_MASK / 2 ? gain : 0;
}

/* The credits a sender starts with for a remote receiver: same on both sides. */
static inline uint32_t mr__credit_initial(uint32_t limit, bool adaptive)
{
    return adaptive && limit > MR_CREDIT_INITIAL ? MR_CREDIT_INITIAL : limit;
}

/*
 * The receive slots a policy needs when each of `keys` senders (ranks under
 * `rank`, nodes under `node`) is granted `configured` credits, or an equal
 * share of the pool when `configured` is 0: one slot per key at least.
 */
static inline uint64_t mr__credit_slots_needed(uint64_t configured, int keys)
{
    return (configured ? configured : 1) * (uint64_t)keys;
}

/*
 * The credits each key may have outstanding: `configured`, or the pool shared
 * equally among the keys. When the pool cannot hold that many, logs an error
 * that names `policy`, `setting` (its credit setting), the count of keys
 * (`what`: "ranks" or "nodes") and the MAILRAIL_RECV_SLOTS that would run,
 * and returns MR_ERR_CONFIG.
 */
mr_status_t mr__credit_share(const char *policy, const char *setting, const char *what,
                             uint64_t configured, size_t recv_slots, int keys, uint32_t *out);

/*
 * `weight[k]`: the ranks key k stands for when it is on another host, 0 when it
 * is on this one (adaptive grants apply to keys of nonzero weight, when `adaptive`).
 */
mr_status_t mr__credit_owed_init(mr_credit_owed_t *o, int nkeys, uint32_t limit, bool adaptive,
                                const uint32_t *weight, const mr_flowctl_params_t *params);
void mr__credit_owed_fini(mr_credit_owed_t *o);

/* Sizes per_rank_q8 from the rate, the loops and the horizon (credit.c; tests call it). */
void mr__credit_window_resize(mr_credit_window_t *w, uint32_t limit);

/* The window of the receiver's rate for key `k`, before the floor, growth and limit. */
static inline uint64_t mr__credit_rate_window(const mr_credit_owed_t *o, const mr_credit_key_t *k)
{
    return ((uint64_t)o->win.per_rank_q8 * k->weight + 255) >> 8;
}

/* How many credits `key` may have outstanding now. */
static inline uint32_t mr__credit_owed_window(const mr_credit_owed_t *o, int key)
{
    const mr_credit_key_t *k = &o->key[key];
    uint64_t window = mr__credit_rate_window(o, k);
    uint32_t floor = o->limit < MR_CREDIT_INITIAL ? o->limit : MR_CREDIT_INITIAL;

    if (k->grown > window) window = k->grown;
    if (!k->adaptive || window >= o->limit) return o->limit;
    return window > floor ? (uint32_t)window : floor;
}

/* What may be granted back to `key` now: freed slots, up to its window. */
static inline uint32_t mr__credit_owed_returnable(const mr_credit_owed_t *o, int key)
{
    const mr_credit_key_t *k = &o->key[key];
    uint32_t window = mr__credit_owed_window(o, key);
    uint32_t room = window > k->held ? window - k->held : 0;
    return k->owed < room ? k->owed : room;
}

/* The credit threshold: freed credits are returned after 1/threshold of a grant. */
static inline uint32_t mr__credit_return_at(uint32_t granted, unsigned threshold)
{
    uint32_t at = granted / (threshold ? threshold : 1);
    return at ? at : 1;
}

/* How many returnable credits make a return worth a control message. */
static inline uint32_t mr__credit_owed_return_at(const mr_credit_owed_t *o, int key)
{
    return o->key[key].adaptive ? mr__credit_return_at(mr__credit_owed_window(o, key), o->threshold)
                                : o->static_return_at;
}

/* Works mr_credit_key_t.return_at out again for the window of now (credit.c). */
void mr__credit_key_refresh(const mr_credit_owed_t *o, mr_credit_key_t *k);

/* mr__credit_owed_return_at() of `k`, worked out again only when the window changed. */
static inline uint32_t mr__credit_key_return_at(const mr_credit_owed_t *o, mr_credit_key_t *k)
{
    if (__builtin_expect(k->return_at_q8 != o->win.per_rank_q8, 0)) mr__credit_key_refresh(o, k);
    return k->return_at;
}

/* Makes returns cumulative (mr_credit_owed_t.cumulative); right after init. */
void mr__credit_owed_cumulative(mr_credit_owed_t *o);

/* What a return of `n` credits just taken for `key` says: the total under cumulative, else n. */
static inline uint32_t mr__credit_owed_wire(const mr_credit_owed_t *o, int key, uint32_t n)
{
    return o->cumulative && n != 0 ? o->key[key].total : n;
}

/* A data message of `key`, sent by `rank`, arrived on one of the key's credits. */
void mr__credit_owed_arrived(mr_credit_owed_t *o, int key, int rank);

/*
 * The senders of `key` asked for credit (a control message of MR_CREDIT_ASK):
 * doubles its window, at most once per credit loop (mr_credit_owed_t.grow).
 */
void mr__credit_owed_asked(mr_credit_owed_t *o, int key);

/*
 * The sender's side: a send to `dest`, whose receiver knows this rank as
 * `key` in `o` (symmetric: a key is adaptive on both sides or neither), found
 * no credit; asks for more when the receiver grows windows.
 */
mr_status_t mr__credit_ask(const mr_credit_owed_t *o, int key, int dest);

/* One slot of `key` was freed by a message from `rank`; returns credits when due. */
void mr__credit_owed_consume(mr_credit_owed_t *o, int key, int rank);

/*
 * Takes what may be granted back to `key`, to piggyback it on a data message;
 * 0 while that is less than half a return's worth.
 */
uint32_t mr__credit_owed_take(mr_credit_owed_t *o, int key);

/*
 * The common cases of the three above, for the policies' per-message hooks:
 * each does what its operation would, and returns true, when that is a count
 * and no more (false: it did nothing, call the operation). They call nothing,
 * so that a hook can handle most messages without a stack frame and leave the
 * rest to an out-of-line half that calls the operation.
 */

/* mr__credit_owed_arrived() of a static key that holds credits: one fewer held. */
static inline bool mr__credit_owed_arrived_fast(mr_credit_owed_t *o, int key)
{
    mr_credit_key_t *k = &o->key[key];

    if (k->held == 0 || k->adaptive) return false;
    k->held--;
    k->arrivals++;
    return true;
}

/*
 * mr__credit_owed_consume() from the key's latest sender, when the slot leaves
 * it short of a return's worth owed (returnable credits are at most those owed):
 * one more owed.
 */
static inline bool mr__credit_owed_consume_fast(mr_credit_owed_t *o, int key, int rank)
{
    mr_credit_key_t *k = &o->key[key];

    if (k->sender[0] != rank || k->return_at_q8 != o->win.per_rank_q8 ||
        k->owed + 1 >= k->return_at) {
        return false;
    }
    k->owed++;
    return true;
}

/* True when mr__credit_owed_take() would take nothing: less than half a return's worth owed. */
static inline bool mr__credit_owed_take_none(const mr_credit_owed_t *o, int key)
{
    const mr_credit_key_t *k = &o->key[key];

    return k->owed == 0 ||
           (k->return_at_q8 == o->win.per_rank_q8 && k->owed < (k->return_at + 1) / 2);
}

/*
 * Puts back credits taken with mr__credit_owed_take() that did not travel,
 * given what their message said (mr__credit_owed_wire()); returns how many.
 */
static inline uint32_t mr__credit_owed_put_back(mr_credit_owed_t *o, int key, uint32_t wire)
{
    mr_credit_key_t *k = &o->key[key];
    uint32_t n = o->cumulative && wire != 0 ? k->last_take : wire;

    k->owed += n;
    k->held -= n;
    k->total = (k->total - n) & MR_CREDIT_TOTAL_MASK;
    return n;
}

/* Copies up to `count` keys' outstanding credits into `out`; returns the number of keys. */
int mr__credit_owed_outstanding(const mr_credit_owed_t *o, uint32_t *out, int count);

/* The retry list's half of mr__credit_owed_progress() (credit.c). */
int mr__credit_owed_retry(mr_credit_owed_t *o);

/* Sends returns that were refused or came due outside a release. Returns how many. */
static inline int mr__credit_owed_progress(mr_credit_owed_t *o)
{
    return o->nretry == 0 && o->nwatch == 0 ? 0 : mr__credit_owed_retry(o);
}

typedef struct mr_credit_clock {
    uint64_t *since;      /* Per destination: when it ran out of credit, or 0. */
    uint64_t total_ns;
} mr_credit_clock_t;

mr_status_t mr__credit_clock_init(mr_credit_clock_t *c, int ndest);
void mr__credit_clock_fini(mr_credit_clock_t *c);

/* A send to `dest` found no credit. */
static inline void mr__credit_clock_blocked(mr_credit_clock_t *c, int dest)
{
    if (c->since[dest] == 0) c->since[dest] = mr__now_ns();
}

/* Ends the wait of `dest`, adding it to the total. */
void mr__credit_clock_stop(mr_credit_clock_t *c, int dest);

/* A send to `dest` got a credit. */
static inline void mr__credit_clock_granted(mr_credit_clock_t *c, int dest)
{
    if (c->since[dest] != 0) mr__credit_clock_stop(c, dest);
}

#endif /* MR_CREDIT_H */
