/*
 * The per-node credit segment of the `node` policy. Internal.
 *
 * One POSIX shared-memory segment per (job, node) holds, for every receiving
 * rank of the job, the credits that the ranks of this node may still spend
 * on it. The node's lowest rank creates it (owner-only permissions), every
 * rank of the node maps it, and the creator unlinks the name as soon as all
 * have mapped it, so that nothing is left behind even if the job is killed.
 */
#ifndef MR_NODE_SEGMENT_H
#define MR_NODE_SEGMENT_H

#include "mailrail.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define MR_NODE_SEGMENT_MAGIC 0x31304e4f4e524d00ull /* "\0MRNON01" */
#define MR_NODE_SEGMENT_VERSION 6
#define MR_NODE_SEGMENT_PREFIX "mailrail-"

/*
 * The credits for one receiving rank, alone on a cache line: the ranks of the
 * node spending credits on one receiver do not slow down those spending on
 * another.
 */
typedef struct mr_node_credit {
    _Alignas(64) _Atomic uint32_t n;
    _Atomic uint32_t total; /* The receiver's cumulative returns applied so far, mod 2^30. */
    _Atomic uint32_t asked; /* A rank asked the receiver for credit since the last deposit. */
} mr_node_credit_t;

/*
 * One per rank of the node (by its index among them): nonzero while the rank
 * sleeps in mr_wait() for credits, the receiving rank it waits for plus one, or
 * MR_NODE_WAIT_ANY, and how many credits it can use at once. A rank that
 * deposits credits wakes sleepers until they can use them all (node_wake.c).
 */
#define MR_NODE_WAIT_ANY UINT32_MAX
typedef struct mr_node_sleeper {
    _Alignas(64) _Atomic uint32_t waits_for;
    _Atomic uint32_t want;
} mr_node_sleeper_t;

typedef struct mr_node_segment {
    uint64_t magic;
    uint32_t version;
    int32_t node;
    int32_t ranks;           /* Entries in credits[]. */
    int32_t creator_pid;     /* Lets a later run see that the creator is gone. */
    uint32_t per_node;       /* Credits granted by each receiver to this node. */
    int32_t local_ranks;     /* Ranks of this node: entries in the sleepers array. */
    char job_id[48];
    _Atomic uint32_t sleeping; /* How many of the sleepers wait now. */
    mr_node_credit_t credits[]; /* Per receiving rank; the sleepers follow. */
} mr_node_segment_t;

/* The sleepers, after the credits. */
static inline mr_node_sleeper_t *mr__node_sleepers(mr_node_segment_t *seg)
{
    return (mr_node_sleeper_t *)(void *)&seg->credits[seg->ranks];
}

/* The segment's name for a job and node: "/mailrail-<job>-n<node>". */
void mr__node_segment_name(char *buf, size_t len, const char *job_id, int node);

/* Creates, sizes and fills the segment; sets *out only on MR_OK. */
mr_status_t mr__node_segment_create(const char *name, const char *job_id, int node, int ranks,
                                   int local_ranks, uint32_t per_node, mr_node_segment_t **out);

/* Maps a segment another rank created, checking that it is this job's. */
mr_status_t mr__node_segment_open(const char *name, const char *job_id, int node, int ranks,
                                 int local_ranks, uint32_t per_node, mr_node_segment_t **out);

/* Removes a segment's name; mappings stay valid. */
void mr__node_segment_unlink(const char *name);

/* Unmaps a segment. */
void mr__node_segment_unmap(mr_node_segment_t *seg);

/*
 * Removes the segments of this user whose creator process is dead: what a
 * killed run left behind. Returns how many were removed.
 */
int mr__node_segment_cleanup_stale(void);

#endif /* MR_NODE_SEGMENT_H */
