/*
 * What the substrates' wire-format parsers (tcp_wire.c, ucx_wire.c) share:
 * the error a decoder returns when it refuses its input. Header only, pure,
 * so that the parsers stay free of everything else. Internal.
 */
#ifndef MR_WIRE_H
#define MR_WIRE_H

#include "mailrail.h"

#include <stddef.h>

/* Why a decoder refused its input: a reason for the log and the offending value. */
typedef struct mr__wire_error {
    int fault;                   /* The parser's own fault enum (tcp_wire_fault_t, ...). */
    const char *what;            /* A phrase such as "unknown channel"; never NULL. */
    long long value;             /* The offending field as read from the wire. */
} mr__wire_error_t;

/* Fills in *err (when given) and returns `status`. */
static inline mr_status_t mr__wire_fail(mr__wire_error_t *err, mr_status_t status, int fault,
                                        const char *what, long long value)
{
    if (err != NULL) {
        err->fault = fault;
        err->what = what;
        err->value = value;
    }
    return status;
}

#endif /* MR_WIRE_H */
