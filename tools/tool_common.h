/*
 * Helpers shared by the benchmark tools and the graph kernel: the list of
 * flow-control policies to compare, and the peak resident memory. They are
 * the tools' own, not part of MailRail's API, and are not installed.
 */
#ifndef MAILRAIL_TOOL_COMMON_H
#define MAILRAIL_TOOL_COMMON_H

#include "mailrail.h"

#include <stdbool.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* Seconds on the monotonic clock. */
static inline double tool_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU seconds this process has used so far, user and system, all its threads. */
static inline double tool_cpu_s(void)
{
    struct rusage ru;

    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* The wall clock, in seconds since 1970: to line samples up with other processes'. */
static inline double tool_wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* xorshift64*: a small, seedable generator that gives the same numbers everywhere. */
static inline uint64_t tool_random(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/*
 * A fresh seed for a run that was given none (-s): from the wall clock's
 * nanoseconds and the process id, so that every default run draws new
 * numbers. The tools print it, so that `-s SEED` reproduces the run.
 */
static inline unsigned tool_fresh_seed(void)
{
    struct timespec ts;
    uint64_t state;

    clock_gettime(CLOCK_REALTIME, &ts);
    state = ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 42) ^
            0x9E3779B97F4A7C15ull;
    return (unsigned)(tool_random(&state) >> 32);
}

/*
 * MAILRAIL_TIMEOUT as MailRail reads it (60 s unless set): how long a tool
 * that checks delivery waits with nothing arriving before it names what is
 * missing. mr_init() has refused a value outside its range already.
 */
static inline unsigned tool_timeout_s(void)
{
    const char *text = getenv("MAILRAIL_TIMEOUT");
    uint64_t value = 60;

    if (text != NULL) {
        value = 0;
        for (const char *p = text; *p >= '0' && *p <= '9' && value < 86400; p++) {
            value = value * 10 + (uint64_t)(*p - '0');
        }
    }
    return value >= 1 && value <= 86400 ? (unsigned)value : 60;
}

static inline int tool_compare_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n), n > 0; sorts v. */
static inline double tool_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), tool_compare_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/*
 * Splits a comma-separated list of policies ("none,rank,node") into
 * out[0..max): the names point into `buf`, which must outlive them. Returns
 * the number of names, or -1 when there are more than `max`, a name is not a
 * policy (MailRail says which are, through mr_check_setting()), or the list
 * does not fit in `buf`.
 */
static inline int tool_split_policies(const char *list, char *buf, size_t len, const char *out[],
                                      int max)
{
    int n = 0;

    if (strlen(list) >= len) return -1;
    memcpy(buf, list, strlen(list) + 1);
    for (char *save = NULL, *p = strtok_r(buf, ",", &save); p != NULL;
         p = strtok_r(NULL, ",", &save)) {
        if (n == max || mr_check_setting("MAILRAIL_FLOWCTL", p) != MR_OK) return -1;
        out[n++] = p;
    }
    return n;
}

/*
 * Parses a decimal option value in [min, max] into *out. Returns false, and
 * leaves *out alone, for anything else: junk, a sign, or an overflow.
 */
static inline bool tool_parse_uint(const char *text, uint64_t min, uint64_t max, uint64_t *out)
{
    uint64_t value = 0;

    if (text == NULL || *text == '\0') return false;
    for (const char *p = text; *p != '\0'; p++) {
        if (*p < '0' || *p > '9') return false;
        if (value > (UINT64_MAX - (uint64_t)(*p - '0')) / 10) return false;
        value = value * 10 + (uint64_t)(*p - '0');
    }
    if (value < min || value > max) return false;
    *out = value;
    return true;
}

/* tool_parse_uint() into an int, a long or an unsigned (min >= 0). */
static inline bool tool_parse_int(const char *text, int min, int max, int *out)
{
    uint64_t v;
    if (!tool_parse_uint(text, (uint64_t)min, (uint64_t)max, &v)) return false;
    *out = (int)v;
    return true;
}

static inline bool tool_parse_long(const char *text, long min, long max, long *out)
{
    uint64_t v;
    if (!tool_parse_uint(text, (uint64_t)min, (uint64_t)max, &v)) return false;
    *out = (long)v;
    return true;
}

static inline bool tool_parse_unsigned(const char *text, unsigned *out)
{
    uint64_t v;
    if (!tool_parse_uint(text, 0, UINT32_MAX, &v)) return false;
    *out = (unsigned)v;
    return true;
}

/* A "Vm...: N kB" line of /proc/self/status ("VmHWM: %llu kB", say), in KiB, or 0. */
static inline uint64_t tool_status_kb(const char *format)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kb = 0;

    if (f == NULL) return 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, format, &kb) == 1) break;
    }
    fclose(f);
    return kb;
}

/* The resident-memory high-water mark of this process in KiB (VmHWM), or 0. */
static inline uint64_t tool_peak_rss_kb(void)
{
    return tool_status_kb("VmHWM: %llu kB");
}

/* Resets the high-water mark, so that each trial or phase measures its own (Linux clear_refs 5). */
static inline void tool_reset_peak_rss(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f != NULL) {
        fputs("5", f);
        fclose(f);
    }
}

/*
 * Why `st` (this rank's counters) breaks a credit invariant, written to `why`,
 * or NULL when none is broken: every breach count is 0 and, under a credit
 * policy, never more messages were in flight to this rank than it granted
 * (docs/reliability.md). The tests end every job with it; the tools check it
 * before mr_finalize() and fail when it is not NULL.
 */
static inline const char *tool_invariant_breach(const mr_stats_t *st, const char *policy,
                                                char *why, size_t len)
{
    if (st->breach_uncredited + st->breach_over_returned + st->breach_unacquired +
            st->breach_beyond_grant != 0) {
        snprintf(why, len, "rank %d broke credit invariants: %llu uncredited arrivals, %llu "
                 "credits over-returned, %llu unacquired slots, %llu arrivals beyond the grant",
                 mr_rank(), (unsigned long long)st->breach_uncredited,
                 (unsigned long long)st->breach_over_returned,
                 (unsigned long long)st->breach_unacquired,
                 (unsigned long long)st->breach_beyond_grant);
        return why;
    }
    if (policy != NULL && strcmp(policy, "none") != 0 && st->peak_recv_inflight > st->recv_granted) {
        snprintf(why, len, "rank %d had %llu messages in flight to it under %s, more than the "
                 "%llu it granted", mr_rank(), (unsigned long long)st->peak_recv_inflight,
                 policy, (unsigned long long)st->recv_granted);
        return why;
    }
    return NULL;
}

/* Prints, as `tool`, why this rank broke a credit invariant; false when it did. */
static inline bool tool_invariants_hold(const char *tool)
{
    mr_stats_t st = {.size = sizeof(st)};
    char why[512];

    if (mr_get_stats(&st) != MR_OK) return true; /* Not initialized: nothing to check. */
    if (tool_invariant_breach(&st, mr_flowctl_name(), why, sizeof(why)) == NULL) return true;
    fprintf(stderr, "%s: %s\n", tool, why);
    return false;
}

/*
 * Connects this rank to the `count` ranks of `dests` (mr_connect()), untimed,
 * so that a timed part pays for no dialling; the ranks that list this one are
 * accepted meanwhile. Collective: every rank calls it after mr_init(), with
 * its own list (NULL and 0 join without dialling). Prints, as `tool`, why it
 * failed.
 */
static inline mr_status_t tool_connect(const char *tool, const int *dests, int count)
{
    mr_status_t st = mr_connect(dests, count);

    if (st != MR_OK) {
        fprintf(stderr, "%s: rank %d: mr_connect: %s\n", tool, mr_rank(), mr_status_string(st));
    }
    return st;
}

#endif /* MAILRAIL_TOOL_COMMON_H */
