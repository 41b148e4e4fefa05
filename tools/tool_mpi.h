/*
 * What the MPI benchmark tools share beyond tool_common.h: waiting for a
 * collective without spinning, the contenders of the workload tools (MPI's
 * own collectives against MailRail's policies and handlers), and the switch
 * port's counters of tools/fabric/. Not part of MailRail's API; not installed.
 */
#ifndef MAILRAIL_TOOL_MPI_H
#define MAILRAIL_TOOL_MPI_H

#include "mailrail.h"
#include "tool_common.h"

#include <mpi.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/*
 * Completes `req`: MPI_Wait when max_nap_ns is 0, else MPI_Test with naps
 * that grow from 20 us to max_nap_ns. MPI's own waits spin, and hundreds of
 * spinning ranks on two cores leave none of them time to get anything done.
 */
static inline void tool_mpi_wait(MPI_Request *req, long max_nap_ns)
{
    int done = 0;
    long ns = 20000;

    if (max_nap_ns <= 0) {
        MPI_Wait(req, MPI_STATUS_IGNORE);
        return;
    }
    while (MPI_Test(req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = ns < max_nap_ns ? ns : max_nap_ns};
        nanosleep(&ts, NULL);
        if (ns < max_nap_ns) ns += ns / 4;
    }
}

/*
 * The nap of an untimed wait when more ranks than CPUs share this machine, by
 * the launcher's count (MPI_LOCALNRANKS from MPICH's hydra,
 * OMPI_COMM_WORLD_LOCAL_SIZE from Open MPI): 80 us per rank per CPU, up to 50
 * ms, as MailRail's own waits on its bootstrap nap (docs/scale.md). 0 when
 * every rank has a CPU or the launcher does not say.
 */
static inline long tool_mpi_crowd_nap_ns(void)
{
    const char *v = getenv("MPI_LOCALNRANKS");
    cpu_set_t cpus;
    long ranks, ncpus = 1;

    if (v == NULL) v = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    ranks = v != NULL ? strtol(v, NULL, 10) : 0;
    if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0 && CPU_COUNT(&cpus) > 0) {
        ncpus = CPU_COUNT(&cpus);
    }
    if (ranks <= ncpus) return 0;
    return ranks * 80000L / ncpus < 50000000L ? ranks * 80000L / ncpus : 50000000L;
}

/* Completes `req`, sleeping `nap_ns` between tests from the first. */
static inline void tool_mpi_nap_wait(MPI_Request *req, long nap_ns)
{
    int done = 0;
    struct timespec ts = {.tv_sec = nap_ns / 1000000000L, .tv_nsec = nap_ns % 1000000000L};

    while (MPI_Test(req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) nanosleep(&ts, NULL);
}

/*
 * The longest nap of tool_mpi_wait() for a tool whose idle ranks sleep up to
 * wait_ms in mr_wait() (-w, -W), or 0 (spin) without -w: 1 ms at most, since
 * nothing wakes a rank napping on MPI, as a message wakes mr_wait().
 */
static inline long tool_mpi_nap_ns(bool wait, int wait_ms)
{
    if (!wait) return 0;
    return wait_ms >= 1 ? 1000000L : 20000L;
}

/*
 * Stops every rank after this one said why: flushes what it printed and
 * leaves mpiexec 200 ms to forward it (hydra's kill on MPI_Abort can lose a
 * dying rank's last lines), then aborts.
 */
static inline void tool_abort(void)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = 200000000};

    fflush(stdout);
    fflush(stderr);
    nanosleep(&ts, NULL);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/*
 * Runs `command` with sh and reads the "bytes packets drops" it prints first
 * (tools/fabric's $FABRIC_PORT_COUNTERS). Returns false, and says why as
 * `tool`, when it cannot.
 */
static inline bool tool_port_probe(const char *tool, const char *command, long long counters[3])
{
    FILE *p = popen(command, "r");
    int n = 0, status;

    if (p != NULL) {
        n = fscanf(p, "%lld %lld %lld", &counters[0], &counters[1], &counters[2]);
        status = pclose(p);
        if (n == 3 && status == 0) return true;
    }
    fprintf(stderr, "%s: -P '%s' did not print \"bytes packets drops\"\n", tool, command);
    return false;
}

/*
 * One contender of a workload tool: MPI's collectives (`alltoallv`), or
 * MailRail under a flow-control policy, receiving datagrams or, with "+h",
 * running active-message handlers.
 */
typedef struct tool_contender {
    char name[24];       /* As given: "alltoallv", "node", "node+h". */
    char policy[16];     /* MAILRAIL_FLOWCTL, empty for alltoallv. */
    bool mpi;            /* alltoallv. */
    bool handlers;       /* +h. */
} tool_contender_t;

/*
 * Splits a comma-separated list of contenders ("alltoallv,none,rank,node,
 * node+h") into out[0..max). Returns their number, or -1 when there are more
 * than `max`, none, or a name is neither alltoallv nor a policy (MailRail's
 * mr_check_setting() says which are), with or without "+h".
 */
static inline int tool_parse_contenders(const char *list, tool_contender_t *out, int max)
{
    char buf[256];
    int n = 0;

    if (strlen(list) >= sizeof(buf)) return -1;
    memcpy(buf, list, strlen(list) + 1);
    for (char *save = NULL, *p = strtok_r(buf, ",", &save); p != NULL;
         p = strtok_r(NULL, ",", &save)) {
        tool_contender_t c = {0};
        size_t len = strlen(p);

        if (n == max || len >= sizeof(c.name)) return -1;
        memcpy(c.name, p, len + 1);
        if (strcmp(p, "alltoallv") == 0) {
            c.mpi = true;
        } else {
            if (len > 2 && strcmp(p + len - 2, "+h") == 0) {
                c.handlers = true;
                p[len - 2] = '\0';
            }
            if (strlen(p) >= sizeof(c.policy) || mr_check_setting("MAILRAIL_FLOWCTL", p) != MR_OK) {
                return -1;
            }
            memcpy(c.policy, p, strlen(p) + 1);
        }
        out[n++] = c;
    }
    return n > 0 ? n : -1;
}

/* The minimum, median and maximum of v[0..n), n > 0; sorts v. */
static inline void tool_spread(double *v, int n, double *min, double *median, double *max)
{
    *median = tool_median(v, n);
    *min = v[0];
    *max = v[n - 1];
}

#endif /* MAILRAIL_TOOL_MPI_H */
