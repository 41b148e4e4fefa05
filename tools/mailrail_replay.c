/*
 * mailrail_replay: replays YGM communication traces through MailRail.
 *
 *   mpiexec -n N mailrail_replay -d DIR [-L auto|old|new] [-p POLICIES] [-t TRIALS] [-c FILE]
 *     Rank r reads DIR/trace_<r>.bin (there must be one file per rank), and
 *     replays its async messages (destination and size) epoch by epoch: the
 *     messages are pushed as items to an aggregator of MailRail's item layer
 *     (mailrail_items.h), which packs them per destination into datagrams
 *     (MAILRAIL_DATAGRAM_SIZE; the paper used 8 KiB), and each barrier ends a
 *     phase of the aggregator, a quiescence. An epoch ends where a barrier begins:
 *     messages a rank sent inside a barrier count in the next epoch, and those
 *     inside or after the last barrier form one final epoch, on every rank.
 *     Reports runtime, events, datagrams and bytes per policy, and checks that
 *     every replayed event and byte arrived.
 *
 *   mailrail_replay -g DIR -R RANKS [-L old|new] [-C] [-e EVENTS] [-E EPOCHS] [-z MAXBYTES] [-S SEED]
 *     Writes synthetic traces in the exact YGM format, for tests: per rank and
 *     epoch EVENTS async records with random destinations and sizes up to
 *     MAXBYTES, some mpi_send/mpi_recv records, and a barrier begin/end pair.
 *     -C (older layout) writes them as YGM's tracer does with YGM_MPI_TRACE=1:
 *     message ids from a counter stepping by RANKS, MPI send completions as
 *     second mpi_send records naming the request id (some not logged, some
 *     inside the barrier), and, on even ranks, two async messages sent inside
 *     every barrier. Prints the async events and bytes written, and the seed:
 *     a fresh one each run unless -S gives it (-S SEED writes the same traces).
 *
 * Record real traces with YGM itself: run the application with
 * YGM_COMM_TRACE=1 (and YGM_MPI_TRACE=1 for MPI records) and
 * YGM_COMM_TRACE_PATH=<dir> (see docs/benchmarks.md).
 */
#include "mailrail.h"
#include "mailrail_items.h"
#include "tool_common.h"
#include "ygm_trace.h"

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define REPLAY_MAX_POLICIES 3
#define REPLAY_MAX_TRIALS 1000

typedef struct replay_options {
    const char *dir;
    ygm_layout_t layout;
    const char *policies[REPLAY_MAX_POLICIES];
    int npolicies;
    int trials;
    const char *csv;
    /* Generator. */
    const char *generate;
    bool gen_ygm_ids;
    int gen_ranks, gen_events, gen_epochs;
    uint32_t gen_max_bytes;
    unsigned seed;
} replay_options_t;

typedef struct replay_event {
    int32_t dest;
    uint32_t size;
} replay_event_t;

typedef struct replay_rank {
    int rank, size;
    replay_event_t *events;   /* Async events in trace order. */
    size_t nevents;
    size_t *epoch_end;        /* Index one past each epoch's last event. */
    int nepochs;
    /*
     * The messages' bytes go through one aggregator of variable-size items. A
     * message larger than piece_max bytes travels as pieces of that size and a
     * shorter last piece, perhaps empty: an item shorter than piece_max ends a
     * message. An item does not straddle datagrams, so a piece that does not
     * fit the room left sends the datagram partly filled: pieces of an eighth
     * of the largest item keep that waste small (on generated traces, about
     * 10% more datagrams than datagrams filled to the byte, against 29% with
     * pieces of the largest size).
     */
    mr_items_t *items;
    size_t piece_max;
    uint8_t *payload;         /* piece_max bytes to copy the items from. */
    /* Counters of one trial. */
    uint64_t *sent_events, *sent_bytes;  /* Per destination. */
    uint64_t recv_events, recv_bytes, datagrams;
} replay_rank_t;

/* ---- Generator ------------------------------------------------------------------------ */

/* The next message id of a generated trace: with -C, YGM's per-rank counter,
 * which steps by the number of ranks; otherwise consecutive numbers. */
static uint64_t replay_next_id(const replay_options_t *o, uint64_t *id)
{
    *id += o->gen_ygm_ids ? (uint64_t)o->gen_ranks : 1;
    return *id;
}

/* Writes one async record with a random destination and size. */
static void replay_generate_async(const replay_options_t *o, FILE *f, ygm_layout_t layout,
                                  uint64_t *rng, uint64_t *id, uint64_t totals[2])
{
    /* Mostly small messages, some large: sizes up to gen_max_bytes. */
    uint32_t size = 1 + (uint32_t)(tool_random(rng) % 64);
    if (tool_random(rng) % 16 == 0) size = 1 + (uint32_t)(tool_random(rng) % o->gen_max_bytes);
    ygm_record_t a = {.kind = YGM_ASYNC, .event_id = replay_next_id(o, id),
                      .peer = (int32_t)(tool_random(rng) % (uint64_t)o->gen_ranks), .size = size};
    ygm_trace_write(f, layout, &a);
    totals[0]++;
    totals[1] += size;
}

static int replay_generate(const replay_options_t *o)
{
    ygm_layout_t layout = o->layout != YGM_LAYOUT_AUTO ? o->layout
                          : o->gen_ygm_ids                ? YGM_LAYOUT_OLD
                                                          : YGM_LAYOUT_NEW;
    uint64_t totals[2] = {0, 0}; /* Async events and bytes, all ranks. */

    if (o->gen_ygm_ids && layout != YGM_LAYOUT_OLD) {
        fprintf(stderr, "mailrail_replay: -C writes the older layout only\n");
        return 2;
    }
    mkdir(o->generate, 0755);
    for (int r = 0; r < o->gen_ranks; r++) {
        char path[4096];
        uint64_t rng = 0x9E3779B97F4A7C15ull ^ ((uint64_t)o->seed << 24) ^ (uint64_t)r;
        uint64_t event = o->gen_ygm_ids ? 0 : (uint64_t)-1, sends = 0, recvs = 0;
        /* -C: request ids and sizes of the sends not completed yet, oldest first. */
        int32_t pending_id[8];
        uint32_t pending_size[8];
        int npending = 0, ncompleted = 0;
        FILE *f;

        snprintf(path, sizeof(path), "%s/trace_%d.bin", o->generate, r);
        f = fopen(path, "wb");
        if (f == NULL) {
            perror(path);
            return 1;
        }
        for (int e = 0; e < o->gen_epochs; e++) {
            for (int k = 0; k < o->gen_events; k++) {
                replay_generate_async(o, f, layout, &rng, &event, totals);
                if (k % 32 != 31) continue;
                uint32_t bytes = o->gen_ygm_ids ? 4096 + 512 * (uint32_t)(k / 32 % 3) : 4096;
                /* YGM takes the request id just before the send's own id. */
                int32_t request = o->gen_ygm_ids ? (int32_t)replay_next_id(o, &event) : 0;
                ygm_record_t s = {.kind = YGM_MPI_SEND, .event_id = replay_next_id(o, &event),
                                  .peer = (r + 1) % o->gen_ranks, .size = bytes};
                ygm_trace_write(f, layout, &s);
                if (o->gen_ygm_ids) {
                    /* YGM completes its sends in order; keep up to 3 in flight, and
                     * leave every fourth completion unlogged, as YGM does for those
                     * it finds with MPI_Testsome. */
                    pending_id[npending] = request;
                    pending_size[npending++] = bytes;
                    if (npending > 3) {
                        if (ncompleted++ % 4 != 3) {
                            ygm_record_t c = {.kind = YGM_MPI_SEND_COMPLETE,
                                              .event_id = replay_next_id(o, &event),
                                              .start_id = (uint64_t)(int64_t)pending_id[0],
                                              .size = pending_size[0]};
                            ygm_trace_write(f, layout, &c);
                        }
                        npending--;
                        memmove(pending_id, pending_id + 1, (size_t)npending * sizeof(int32_t));
                        memmove(pending_size, pending_size + 1,
                                (size_t)npending * sizeof(uint32_t));
                    }
                } else {
                    /* The completion's id is taken in both layouts, so that the
                     * older layout's ids stay as they always were. */
                    ygm_record_t c = {.kind = YGM_MPI_SEND_COMPLETE, .event_id = ++event,
                                      .start_id = s.event_id, .size = bytes};
                    if (layout == YGM_LAYOUT_NEW) ygm_trace_write(f, layout, &c);
                }
                ygm_record_t v = {.kind = YGM_MPI_RECV, .event_id = replay_next_id(o, &event),
                                  .peer = (r + o->gen_ranks - 1) % o->gen_ranks, .size = 4096};
                ygm_trace_write(f, layout, &v);
                sends++;
                recvs++;
            }
            ygm_record_t b = {.kind = YGM_BARRIER_BEGIN, .event_id = replay_next_id(o, &event),
                              .peer = -1, .counters = {sends, recvs, 0, 0, 0}};
            ygm_trace_write(f, layout, &b);
            if (o->gen_ygm_ids) {
                /* Inside the barrier: handlers on even ranks send two messages, and
                 * the sends still in flight complete. */
                for (int m = 0; r % 2 == 0 && m < 2; m++) {
                    replay_generate_async(o, f, layout, &rng, &event, totals);
                }
                for (int p = 0; p < npending; p++) {
                    ygm_record_t c = {.kind = YGM_MPI_SEND_COMPLETE,
                                      .event_id = replay_next_id(o, &event),
                                      .start_id = (uint64_t)(int64_t)pending_id[p],
                                      .size = pending_size[p]};
                    ygm_trace_write(f, layout, &c);
                }
                npending = 0;
            }
            b.kind = YGM_BARRIER_END;
            b.event_id = replay_next_id(o, &event);
            ygm_trace_write(f, layout, &b);
        }
        if (fclose(f) != 0) {
            perror(path);
            return 1;
        }
    }
    printf("mailrail_replay: seed %u (-S %u writes these traces again)\n", o->seed, o->seed);
    printf("mailrail_replay: wrote %d traces (%s layout%s, %d epochs of %d async events) to %s: "
           "%llu async events, %llu bytes\n", o->gen_ranks, ygm_layout_name(layout),
           o->gen_ygm_ids ? " with YGM ids and send completions" : "", o->gen_epochs,
           o->gen_events, o->generate, (unsigned long long)totals[0],
           (unsigned long long)totals[1]);
    return 0;
}

/* ---- Loading --------------------------------------------------------------------------- */

/* Reads this rank's trace into events and epochs. Returns 0 or -1 (message printed). */
static int replay_load(const replay_options_t *o, replay_rank_t *r)
{
    char path[4096], err[1024];
    ygm_trace_t trace;
    size_t cap_epochs = 16;

    snprintf(path, sizeof(path), "%s/trace_%d.bin", o->dir, r->rank);
    if (ygm_trace_read(path, o->layout, r->size, &trace, err, sizeof(err)) != 0) {
        fprintf(stderr, "mailrail_replay: rank %d: %s\n", r->rank, err);
        return -1;
    }
    r->events = malloc((trace.count ? trace.count : 1) * sizeof(*r->events));
    r->epoch_end = malloc(cap_epochs * sizeof(*r->epoch_end));
    for (size_t i = 0; i < trace.count; i++) {
        const ygm_record_t *rec = &trace.records[i];
        if (rec->kind == YGM_ASYNC) {
            r->events[r->nevents].dest = rec->peer;
            r->events[r->nevents].size = rec->size;
            r->nevents++;
        } else if (rec->kind == YGM_BARRIER_BEGIN) {
            if ((size_t)r->nepochs + 1 == cap_epochs) {
                cap_epochs *= 2;
                r->epoch_end = realloc(r->epoch_end, cap_epochs * sizeof(*r->epoch_end));
            }
            r->epoch_end[r->nepochs++] = r->nevents;
        }
    }
    /* Events inside or after the last barrier: main() adds a final epoch on
     * every rank if any rank has some (epoch_end keeps a free slot for it). */
    ygm_trace_free(&trace);
    return 0;
}

/* ---- Replay ---------------------------------------------------------------------------- */

/* Counts the messages and bytes of every item that has arrived. */
static mr_status_t replay_receive_all(replay_rank_t *r)
{
    mr_item_t batch[64];
    size_t n;
    mr_status_t st;

    while ((st = mr_items_pull_batch(r->items, batch, 64, &n)) == MR_OK) {
        for (size_t k = 0; k < n; k++) {
            r->recv_events += batch[k].length < r->piece_max;
            r->recv_bytes += batch[k].length;
        }
    }
    return st == MR_AGAIN ? MR_OK : st;
}

/* Pushes one message as items, receiving while MailRail pushes back. */
static mr_status_t replay_event(replay_rank_t *r, const replay_event_t *e)
{
    size_t left = e->size, piece;
    mr_status_t st;

    do {
        piece = left < r->piece_max ? left : r->piece_max;
        while ((st = mr_items_push(r->items, r->payload, piece, e->dest)) == MR_AGAIN) {
            st = replay_receive_all(r);
            if (st != MR_OK) return st;
        }
        if (st != MR_OK) return st;
        left -= piece;
    } while (piece == r->piece_max);
    r->sent_events[e->dest]++;
    r->sent_bytes[e->dest] += e->size;
    return MR_OK;
}

/* Ends an epoch: receives until every rank has received every item. */
static mr_status_t replay_quiesce(replay_rank_t *r)
{
    mr_status_t st;

    do {
        st = replay_receive_all(r);
        if (st != MR_OK) return st;
        st = mr_items_end_phase(r->items);
    } while (st == MR_AGAIN);
    return st;
}

/* One timed replay of every epoch; *seconds is the max over ranks. */
static mr_status_t replay_trial(replay_rank_t *r, double *seconds)
{
    mr_stats_t before = {.size = sizeof(before)}, after = {.size = sizeof(after)};
    mr_status_t st = MR_OK;
    size_t i = 0;
    double start, mine;

    memset(r->sent_events, 0, (size_t)r->size * sizeof(uint64_t));
    memset(r->sent_bytes, 0, (size_t)r->size * sizeof(uint64_t));
    r->recv_events = r->recv_bytes = 0;
    mr_get_stats(&before);
    MPI_Barrier(MPI_COMM_WORLD);
    start = tool_now();
    for (int e = 0; e < r->nepochs && st == MR_OK; e++) {
        for (; i < r->epoch_end[e] && st == MR_OK; i++) {
            st = replay_event(r, &r->events[i]);
            if (st == MR_OK && (i & 15) == 0) st = replay_receive_all(r);
        }
        if (st == MR_OK) st = replay_quiesce(r);
    }
    mine = tool_now() - start;
    /* The aggregator's datagrams, to oneself included. */
    mr_get_stats(&after);
    r->datagrams = after.messages_sent - before.messages_sent;
    MPI_Allreduce(&mine, seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return st;
}

/* Every rank received exactly the events and bytes that were sent to it. */
static bool replay_verify(replay_rank_t *r, uint64_t totals[3])
{
    uint64_t *sums = calloc(2 * (size_t)r->size, sizeof(uint64_t));
    uint64_t *mine = calloc(2 * (size_t)r->size, sizeof(uint64_t));
    int ok, all_ok = 0;

    for (int d = 0; d < r->size; d++) {
        mine[2 * d] = r->sent_events[d];
        mine[2 * d + 1] = r->sent_bytes[d];
    }
    MPI_Allreduce(mine, sums, 2 * r->size, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    ok = sums[2 * r->rank] == r->recv_events && sums[2 * r->rank + 1] == r->recv_bytes;
    if (!ok) {
        fprintf(stderr, "mailrail_replay: rank %d received %llu events / %llu bytes, %llu / "
                "%llu were sent to it\n", r->rank, (unsigned long long)r->recv_events,
                (unsigned long long)r->recv_bytes, (unsigned long long)sums[2 * r->rank],
                (unsigned long long)sums[2 * r->rank + 1]);
    }
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    uint64_t local[3] = {r->recv_events, r->recv_bytes, r->datagrams};
    MPI_Allreduce(local, totals, 3, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    free(sums);
    free(mine);
    return all_ok;
}

static int replay_parse(int argc, char **argv, replay_options_t *o)
{
    static char policy_buf[64];
    const char *policies = getenv("MAILRAIL_FLOWCTL") ? getenv("MAILRAIL_FLOWCTL") : "none";
    bool ok = true;
    int c;

    o->dir = ".";
    o->trials = 1;
    o->gen_events = 1000;
    o->gen_epochs = 3;
    o->gen_max_bytes = 16384;
    o->seed = tool_fresh_seed(); /* Unless -S gives one. */
    while ((c = getopt(argc, argv, "d:L:p:t:c:g:CR:e:E:z:S:h")) != -1) {
        switch (c) {
        case 'd': o->dir = optarg; break;
        case 'L':
            if (strcmp(optarg, "old") == 0) o->layout = YGM_LAYOUT_OLD;
            else if (strcmp(optarg, "new") == 0) o->layout = YGM_LAYOUT_NEW;
            else if (strcmp(optarg, "auto") == 0) o->layout = YGM_LAYOUT_AUTO;
            else return -1;
            break;
        case 'p': policies = optarg; break;
        case 't': ok &= tool_parse_int(optarg, 1, REPLAY_MAX_TRIALS, &o->trials); break;
        case 'c': o->csv = optarg; break;
        case 'g': o->generate = optarg; break;
        case 'C': o->gen_ygm_ids = true; break;
        case 'R': ok &= tool_parse_int(optarg, 1, 1 << 20, &o->gen_ranks); break;
        case 'e': ok &= tool_parse_int(optarg, 0, INT_MAX, &o->gen_events); break;
        case 'E': ok &= tool_parse_int(optarg, 0, INT_MAX, &o->gen_epochs); break;
        case 'z': ok &= tool_parse_unsigned(optarg, &o->gen_max_bytes) && o->gen_max_bytes > 0; break;
        case 'S': ok &= tool_parse_unsigned(optarg, &o->seed); break;
        default: return -1;
        }
    }
    o->npolicies = tool_split_policies(policies, policy_buf, sizeof(policy_buf), o->policies,
                                       REPLAY_MAX_POLICIES);
    if (!ok) return -1;
    if (o->generate != NULL) return 0;
    return o->npolicies > 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    replay_options_t o = {0};
    replay_rank_t r = {0};
    FILE *csv = NULL;
    int status = 0, loaded, all_loaded = 0;

    if (replay_parse(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: mpiexec -n N mailrail_replay -d DIR [-L auto|old|new] "
                        "[-p none,rank,node] [-t trials] [-c file.csv]\n"
                        "       mailrail_replay -g DIR -R ranks [-L old|new] [-C] [-e events] "
                        "[-E epochs] [-z maxbytes] [-S seed]\n");
        return 2;
    }
    if (o.generate != NULL) return replay_generate(&o);

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &r.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &r.size);
    /* Every rank loads its trace; all stop together if any cannot. */
    loaded = replay_load(&o, &r) == 0;
    MPI_Allreduce(&loaded, &all_loaded, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    /* r.nepochs counts barriers here; events inside or after the last one on
     * any rank make a final epoch on every rank. */
    int epochs_min = 0, epochs_max = 0, tail = 0, any_tail = 0;
    MPI_Allreduce(&r.nepochs, &epochs_min, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&r.nepochs, &epochs_max, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    tail = loaded && (r.nepochs == 0 || r.epoch_end[r.nepochs - 1] != r.nevents);
    MPI_Allreduce(&tail, &any_tail, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (all_loaded && epochs_min == epochs_max && any_tail) r.epoch_end[r.nepochs++] = r.nevents;
    if (!all_loaded || epochs_min != epochs_max) {
        if (r.rank == 0) {
            fprintf(stderr, "mailrail_replay: %s\n",
                    !all_loaded ? "a trace could not be read (see above); nothing replayed"
                                : "the ranks' traces have different numbers of barriers");
        }
        MPI_Finalize();
        return 1;
    }
    r.sent_events = calloc((size_t)r.size, sizeof(uint64_t));
    r.sent_bytes = calloc((size_t)r.size, sizeof(uint64_t));
    uint64_t events_total = 0, mine = r.nevents;
    MPI_Allreduce(&mine, &events_total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (r.rank == 0) {
        printf("# mailrail_replay: %d ranks, traces in %s, %llu async events in %d epoch(s)\n"
               "# %-6s %5s %10s %12s %12s %14s %12s\n", r.size, o.dir,
               (unsigned long long)events_total, r.nepochs, "policy", "trial", "seconds",
               "events", "datagrams", "bytes", "events/s");
        if (o.csv != NULL) {
            csv = fopen(o.csv, "a");
            if (csv != NULL && ftell(csv) == 0) {
                fprintf(csv, "policy,trial,ranks,epochs,events,datagrams,bytes,seconds,"
                             "events_per_s,verified\n");
            }
        }
    }
    for (int p = 0; p < o.npolicies && status == 0; p++) {
        MPI_Comm comm = MPI_COMM_WORLD;
        mr_status_t st;
        setenv("MAILRAIL_FLOWCTL", o.policies[p], 1);
        st = mr_init_mpi(&comm, sizeof(comm));
        if (st != MR_OK) {
            status = 1;
            break;
        }
        st = mr_items_create(MR_ITEMS_VARIABLE, &r.items);
        if (st != MR_OK) {
            mr_finalize();
            status = 1;
            break;
        }
        r.piece_max = mr_items_max_size(r.items) >= 8 ? mr_items_max_size(r.items) / 8
                                                       : mr_items_max_size(r.items);
        r.payload = calloc(r.piece_max, 1);
        for (int k = 0; k < o.trials && status == 0; k++) {
            double seconds;
            uint64_t totals[3];
            st = replay_trial(&r, &seconds);
            if (st != MR_OK || !replay_verify(&r, totals)) {
                if (r.rank == 0) {
                    fprintf(stderr, "mailrail_replay: %s trial %d failed: %s\n", o.policies[p],
                            k, st != MR_OK ? mr_status_string(st) : "verification failed");
                }
                status = 1;
                break;
            }
            if (r.rank == 0) {
                printf("  %-6s %5d %10.4f %12llu %12llu %14llu %12.0f\n", o.policies[p], k,
                       seconds, (unsigned long long)totals[0], (unsigned long long)totals[2],
                       (unsigned long long)totals[1], (double)totals[0] / seconds);
                if (csv != NULL) {
                    fprintf(csv, "%s,%d,%d,%d,%llu,%llu,%llu,%.6f,%.0f,1\n", o.policies[p], k,
                            r.size, r.nepochs, (unsigned long long)totals[0],
                            (unsigned long long)totals[2], (unsigned long long)totals[1],
                            seconds, (double)totals[0] / seconds);
                }
                fflush(stdout);
            }
        }
        mr_items_destroy(r.items);
        free(r.payload);
        if (!tool_invariants_hold("mailrail_replay")) status = 1;
        mr_finalize();
    }
    if (r.rank == 0 && status == 0) {
        printf("mailrail_replay: replayed %llu events per trial under %d policies; every event "
               "and byte arrived\n", (unsigned long long)events_total, o.npolicies);
    }
    if (csv != NULL) fclose(csv);
    free(r.events);
    free(r.epoch_end);
    free(r.sent_events);
    free(r.sent_bytes);
    MPI_Finalize();
    return status;
}
