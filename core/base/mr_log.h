/*
 * Logging. Internal.
 *
 * The first function that detects an error logs it, once, at MR_LOG_ERROR;
 * callers up the stack only pass the status on.
 */
#ifndef MR_LOG_H
#define MR_LOG_H

#include "mr_log_level.h"

/* Names of the levels, NULL-terminated, in the order of mr_log_level_t. */
extern const char *const mr__log_level_names[];

/* The level in force; messages above it are not printed. */
extern mr_log_level_t mr__log_threshold;

/* Sets the rank shown in every line (-1 before the bootstrap knows it). */
void mr__log_set_rank(int rank);

/*
 * Prints "mailrail[rank] level: message" to stderr when `level` is within the
 * threshold. Plugins get it as their log function.
 */
void mr__log_write(mr_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define mr_log(level, ...)                                                               \
    do {                                                                                 \
        if ((level) <= mr__log_threshold) mr__log_write((level), __VA_ARGS__);             \
    } while (0)
#define mr_error(...) mr_log(MR_LOG_ERROR, __VA_ARGS__)
#define mr_warn(...) mr_log(MR_LOG_WARN, __VA_ARGS__)
#define mr_info(...) mr_log(MR_LOG_INFO, __VA_ARGS__)
#define mr_debug(...) mr_log(MR_LOG_DEBUG, __VA_ARGS__)

#endif /* MR_LOG_H */
