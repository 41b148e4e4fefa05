/*
 * The monotonic clock, for the core, the policies and the plugins. Internal.
 */
#ifndef MR_TIME_H
#define MR_TIME_H

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

#endif /* MR_TIME_H */
