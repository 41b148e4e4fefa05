/*
 * The monotonic clock, for the core, the policies and the plugins. Internal.
 */
#ifndef MR_TIME_H
#define MR_TIME_H

#include <sched.h>
#include <stdint.h>
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
 * bootstrap, say): yields the core MR_BACKOFF_YIELDS times, then sleeps,
 * longer every 16 polls, from 50 us up to 10 ms, so that a thousand ranks
 * waiting on two cores leave the cores to the ranks that still have work. A
 * sched_yield() loop does not: every waiter stays runnable (docs/scale.md).
 * `polls` starts at 0 for each wait.
 */
#define MR_BACKOFF_YIELDS 64
static inline void mr__backoff(unsigned *polls)
{
    unsigned n = (*polls)++;

    if (n < MR_BACKOFF_YIELDS) {
        sched_yield();
        return;
    }
    unsigned shift = (n - MR_BACKOFF_YIELDS) / 16;
    long ns = shift >= 8 ? 10000000L : 50000L << shift;
    struct timespec ts = {.tv_sec = 0, .tv_nsec = ns < 10000000L ? ns : 10000000L};
    nanosleep(&ts, NULL);
}

#endif /* MR_TIME_H */
