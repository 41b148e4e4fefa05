/*
 * An application that embeds MailRail without initializing MPI itself (as
 * mailrail_demo does): mr_init() loads the MPI bootstrap, MPICH, UCX and the
 * substrate. After mr_finalize() every shared object that was loaded must
 * still be loaded: MPI cannot be initialized twice in one process, and MPICH
 * and UCX keep threads and state past their finalize (issue 15). Before
 * that, a failed mr_init() must leave MPI up so that a second one works.
 *
 *   mpiexec -n 2 test_no_unload
 *
 * Prints "no shared object was unloaded" and exits 0, or names what was.
 */
#include "mailrail.h"

#include <link.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_OBJECTS 512

typedef struct objects {
    char *name[MAX_OBJECTS];
    int count;
} objects_t;

static int note_object(struct dl_phdr_info *info, size_t size, void *arg)
{
    objects_t *o = arg;

    (void)size;
    if (info->dlpi_name[0] != '\0' && o->count < MAX_OBJECTS) {
        o->name[o->count++] = strdup(info->dlpi_name);
    }
    return 0;
}

static bool loaded(const objects_t *o, const char *name)
{
    for (int i = 0; i < o->count; i++) {
        if (strcmp(o->name[i], name) == 0) return true;
    }
    return false;
}

static void forget(objects_t *o)
{
    for (int i = 0; i < o->count; i++) free(o->name[i]);
    o->count = 0;
}

/* Receives what is there; counts messages and the ones that are not (source, round). */
static void drain(int round, int *got, int *bad)
{
    mr_message_t m;

    while (mr_receive(&m) == MR_OK) {
        int word[2] = {-1, -1};
        if (m.length == sizeof(word)) memcpy(word, m.data, sizeof(word));
        *bad += word[0] != m.source || word[1] != round;
        (*got)++;
        mr_release(m.data);
    }
}

/* One session: every rank sends one checked message to every rank. */
static int session(int round)
{
    mr_status_t st = mr_init();
    int got = 0, bad = 0;

    if (st != MR_OK) {
        fprintf(stderr, "round %d: mr_init: %s\n", round, mr_status_string(st));
        return 1;
    }
    for (int dest = 0; dest < mr_size() && st == MR_OK; dest++) {
        void *buf;
        while ((st = mr_reserve(&buf)) == MR_AGAIN) drain(round, &got, &bad);
        if (st != MR_OK) break;
        int word[2] = {mr_rank(), round};
        memcpy(buf, word, sizeof(word));
        st = mr_send(buf, sizeof(word), dest);
    }
    if (st == MR_OK) {
        do {
            drain(round, &got, &bad);
        } while ((st = mr_quiesce()) == MR_AGAIN);
    }
    if (st != MR_OK || got != mr_size() || bad != 0) {
        fprintf(stderr, "round %d: %s, %d of %d messages, %d wrong\n", round,
                mr_status_string(st), got, mr_size(), bad);
        mr_finalize();
        return 1;
    }
    return 0;
}

int main(void)
{
    objects_t during = {0}, after = {0};
    int failed = 0, rank;

    /*
     * A failed init after MailRail started MPI (the credits do not fit the
     * pool: every rank fails in the policy's set-up) keeps MPI up, so that
     * the application can fix its settings and try again.
     */
    setenv("MAILRAIL_FLOWCTL", "node", 1);
    setenv("MAILRAIL_NODE_CREDITS", "100000", 1);
    setenv("MAILRAIL_RECV_SLOTS", "1024", 1); /* Set, so that the pool does not grow to it. */
    mr_status_t st = mr_init();
    unsetenv("MAILRAIL_FLOWCTL");
    unsetenv("MAILRAIL_NODE_CREDITS");
    unsetenv("MAILRAIL_RECV_SLOTS");
    if (st != MR_ERR_CONFIG) {
        fprintf(stderr, "mr_init with 100000 node credits: %s, not MR_ERR_CONFIG\n",
                mr_status_string(st));
        return 1;
    }
    if (session(1) != 0) return 1;
    rank = mr_rank();
    dl_iterate_phdr(note_object, &during);
    if (mr_finalize() != MR_OK) return 1;
    dl_iterate_phdr(note_object, &after);
    for (int i = 0; i < during.count; i++) {
        if (!loaded(&after, during.name[i])) {
            fprintf(stderr, "rank %d: mr_finalize unloaded %s\n", rank, during.name[i]);
            failed = 1;
        }
    }
    if (!failed) printf("rank %d: no shared object was unloaded (%d loaded)\n", rank, during.count);
    forget(&during);
    forget(&after);
    return failed;
}
