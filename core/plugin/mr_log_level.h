/*
 * Log levels, as plugins get them with their log function. Plugin-facing.
 */
#ifndef MR_LOG_LEVEL_H
#define MR_LOG_LEVEL_H

typedef enum mr_log_level {
    MR_LOG_ERROR = 0,
    MR_LOG_WARN = 1,
    MR_LOG_INFO = 2,
    MR_LOG_DEBUG = 3,
    MR_LOG_TRACE = 4
} mr_log_level_t;

#endif /* MR_LOG_LEVEL_H */
