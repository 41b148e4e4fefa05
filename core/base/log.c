/*
 * Logging to stderr, one line per message.
 */
#include "mr_log.h"

#include <stdarg.h>
#include <stdio.h>

const char *const mr__log_level_names[] = {"error", "warn", "info", "debug", "trace", NULL};

mr_log_level_t mr__log_threshold = MR_LOG_WARN;

static int log_rank = -1;

void mr__log_set_rank(int rank)
{
    log_rank = rank;
}

void mr__log_write(mr_log_level_t level, const char *fmt, ...)
{
    char line[1024];
    va_list ap;

    if (level > mr__log_threshold) return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (log_rank >= 0) {
        fprintf(stderr, "mailrail[%d] %s: %s\n", log_rank, mr__log_level_names[level], line);
    } else {
        fprintf(stderr, "mailrail %s: %s\n", mr__log_level_names[level], line);
    }
}
