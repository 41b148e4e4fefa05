/*
 * Wake-ups between the ranks of a node for credits of their shared pools
 * (node_wake.c explains the protocol). Internal to the `node` policy.
 */
#ifndef MR_NODE_WAKE_H
#define MR_NODE_WAKE_H

#include "mr_node_segment.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct mr_node_wake {
    int fd;                 /* This rank's wake-up socket, or -1 (then nobody is woken). */
    bool send_error_logged;
    bool expect;            /* A wake-up was sent to this rank and not yet read. */
    mr_node_segment_t *seg;
    const char *job_id;
    const int *local_rank;  /* The node's ranks, ascending; index = sleeper slot. */
    int nlocal, me;         /* Their number, and this rank's index among them. */
    int cursor;             /* Where the next wake-up starts looking. */
    uint64_t woken;         /* Wake-ups sent. */
} mr_node_wake_t;

void mr__node_wake_init(mr_node_wake_t *w);

/* Binds the socket (a node of one rank needs none). Failing to is only a warning. */
mr_status_t mr__node_wake_open(mr_node_wake_t *w, mr_node_segment_t *seg, const char *job_id,
                              const int *local_rank, int nlocal, int me);
void mr__node_wake_close(mr_node_wake_t *w);

/*
 * Marks this rank as sleeping for credits of receiver `waits_for - 1` (or of
 * any, MR_NODE_WAIT_ANY), of which it can use `want` (at least 1), or, with
 * sleeping = false, as awake again (and reads the wake-ups that came).
 * Returns true when marked: the caller must look at the pools once more
 * before it sleeps.
 */
bool mr__node_wake_sleep(mr_node_wake_t *w, bool sleeping, uint32_t waits_for, uint32_t want);

/* Reads a wake-up that came after the rank woke (cheap when none is expected). */
void mr__node_wake_progress(mr_node_wake_t *w);

/*
 * Credits for receiver `dest` went into the pool: wakes ranks that wait for
 * them until those woken can use `n` (each as many as it said it wants).
 */
void mr__node_wake_others(mr_node_wake_t *w, int dest, uint32_t n);

#endif /* MR_NODE_WAKE_H */
