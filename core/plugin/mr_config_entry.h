/*
 * The entries of a settings table, as every module declares its own (the
 * core, flow control, each policy and each plugin). Plugin-facing: the
 * parser itself is the core's (mr_config.h).
 */
#ifndef MR_CONFIG_ENTRY_H
#define MR_CONFIG_ENTRY_H

#include <stddef.h>
#include <stdint.h>

/* Longest value of a string setting, including the terminating NUL. */
#define MR_CONFIG_STRING_MAX 256

typedef enum mr_config_type {
    MR_CONFIG_UINT,   /* Decimal unsigned integer, stored as uint64_t. */
    MR_CONFIG_SIZE,   /* Bytes with an optional K, M or G suffix (powers of 1024), uint64_t. */
    MR_CONFIG_BOOL,   /* yes/no, on/off, true/false, 1/0; stored as bool. */
    MR_CONFIG_ENUM,   /* One of `choices`, stored as the unsigned index. */
    MR_CONFIG_STRING  /* Any text shorter than MR_CONFIG_STRING_MAX, stored as char[]. */
} mr_config_type_t;

typedef struct mr_config_entry {
    const char *name;          /* Full variable name, "MAILRAIL_...". NULL ends a table. */
    const char *default_value; /* Parsed like a value from the environment. */
    mr_config_type_t type;
    size_t offset;             /* Where the value goes in the owner's struct. */
    uint64_t min, max;         /* Allowed range for UINT and SIZE. */
    const char *const *choices;/* NULL-terminated list for ENUM. */
    const char *doc;           /* One or two full sentences. */
} mr_config_entry_t;

#endif /* MR_CONFIG_ENTRY_H */
