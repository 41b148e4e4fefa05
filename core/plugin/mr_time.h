/*
 * The monotonic clock, for the core, the policies and the plugins. Internal.
 */
#ifndef MR_TIME_H
#define MR_TIME_H

#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define MR_NS_PER_MS UINT64_C(1000000)
#define MR_NS_PER_S UINT64_C(1000000000)

/* Nanoseconds on CLOCK_MONOTONIC. */
static inline uint64_t mr__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * MR_NS_PER_S + (uint64_t)ts.tv_nsec;
}

/*
 * Nanoseconds on CLOCK_MONOTONIC_COARSE: a few milliseconds of resolution,
 * but only a memory read, so that periodic checks on the progress path cost
 * next to nothing.
 */
static inline uint64_t mr__coarse_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * MR_NS_PER_S + (uint64_t)ts.tv_nsec;
}

/*
 * Between polls of what only other processes can finish (a collective of the
 * bootstrap, say). With `nap_ns` 0, while every rank has a CPU: yields the
 * core MR_BACKOFF_YIELDS times, then sleeps, longer every 16 polls, from 50 us
 * up to 10 ms. With a nap (mr__backoff_nap_ns(), more ranks than CPUs):
 * sleeps that long at every poll, without yielding first. On 513 ranks over
 * two cores, every rank's first polls of the ramp kept both cores busy, and
 * an 8-byte allreduce took 2.2-4.5 s; with a fixed nap of 20 ms it took
 * 0.34-0.93 s (docs/scale.md). `polls` starts at 0 for each wait.
 */
#define MR_BACKOFF_YIELDS 64
static inline void mr__backoff(unsigned *polls, uint64_t nap_ns)
{
    unsigned n = (*polls)++;
    long ns;

    if (nap_ns > 0) {
        ns = (long)nap_ns;
    } else if (n < MR_BACKOFF_YIELDS) {
        sched_yield();
        return;
    } else {
        unsigned shift = (n - MR_BACKOFF_YIELDS) / 16;
        ns = shift >= 8 ? 10000000L : 50000L << shift;
    }
    struct timespec ts = {.tv_sec = ns / 1000000000L, .tv_nsec = ns % 1000000000L};
    nanosleep(&ts, NULL);
}

/* The CPUs this process may run on, or 0 when the affinity cannot be read. */
static inline long mr__affinity_cpus(void)
{
    cpu_set_t cpus;

    return sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 0;
}

/*
 * The nap of mr__backoff() for `ranks` on this machine: 0 while each has a CPU
 * of this process's affinity, else 80 us per rank per CPU, from 100 us to 50
 * ms, so that all of them together poll about 12,500 times a second per CPU
 * (20 ms for 513 ranks on two cores, the best of 5 to 50 ms there).
 */
#define MR_BACKOFF_NAP_PER_RANK_NS 80000L
static inline uint64_t mr__backoff_nap_ns(long ranks)
{
    long ncpus = mr__affinity_cpus(), ns;

    if (ncpus <= 0) ncpus = 1;
    if (ranks <= ncpus) return 0;
    ns = ranks * MR_BACKOFF_NAP_PER_RANK_NS / ncpus;
    if (ns < 100000L) ns = 100000L;
    if (ns > 50000000L) ns = 50000000L;
    return (uint64_t)ns;
}

/*
 * The ranks on this machine as the launcher says, before the ranks have met:
 * MPICH's hydra (MPI_LOCALNRANKS) or Open MPI (OMPI_COMM_WORLD_LOCAL_SIZE);
 * 0 when neither says.
 */
static inline long mr__launcher_local_ranks(void)
{
    static const char *const names[] = {"MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"};

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        const char *v = getenv(names[i]);
        char *end;
        long n = v != NULL ? strtol(v, &end, 10) : 0;
        if (v != NULL && *v != '\0' && *end == '\0' && n > 0 && n < (1L << 30)) return n;
    }
    return 0;
}

#endif /* MR_TIME_H */
