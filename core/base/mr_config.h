/*
 * Settings tables: the parser and the core's own table. Internal; the entry
 * type plugins use is in plugin/mr_config_entry.h.
 *
 * A table lists settings by name, type, default and documentation. The same
 * table drives the environment parser (mr__config_parse) and the info tool
 * (mailrail_info -c), in the spirit of UCX's config tables. The core, every
 * flow-control policy and every substrate plugin owns one table; each fills a
 * struct of its own through the entries' offsets.
 */
#ifndef MR_CONFIG_H
#define MR_CONFIG_H

#include "mailrail.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mr_config_entry.h"

/*
 * Parses one value into `out` (the owner's struct) at the entry's offset.
 * On failure writes a message naming the variable, the value and what is
 * allowed into `err` and returns MR_ERR_CONFIG; `out` is left unchanged.
 */
mr_status_t mr__config_parse_value(const mr_config_entry_t *entry, const char *value,
                                  void *out, char *err, size_t err_len);

/* The entry of `table` (may be NULL) named `name`, or NULL. */
const mr_config_entry_t *mr__config_find(const mr_config_entry_t *table, const char *name);

/*
 * Fills `out` from the table: each variable from the environment when it is
 * set, from its default otherwise. Logs and returns MR_ERR_CONFIG on the first
 * bad value.
 */
mr_status_t mr__config_parse(const mr_config_entry_t *table, void *out);

/*
 * Warns about every MAILRAIL_* variable in the environment that none of the
 * `ntables` tables declares (NULL tables are skipped), that does not start
 * with one of `skip_prefixes` (NULL-terminated, may be NULL), and for which
 * `declared_elsewhere(arg, name)` (may be NULL; asked only for such names)
 * is false. The warning suggests the closest declared name when one is near,
 * so that a typo does not go unnoticed. Returns the number of unknown
 * variables.
 */
int mr__config_warn_unknown(const mr_config_entry_t *const *tables, size_t ntables,
                           const char *const *skip_prefixes,
                           bool (*declared_elsewhere)(void *arg, const char *name), void *arg);

/* Writes the value the entry has in `cfg` as text. */
void mr__config_format_value(const mr_config_entry_t *entry, const void *cfg, char *buf,
                            size_t len);

/* Writes what the entry allows ("1 to 65536", "none|rank|node", ...). */
void mr__config_format_allowed(const mr_config_entry_t *entry, char *buf, size_t len);

/* The table of the core's own settings, and the struct it fills. */
typedef struct mr_core_config {
    char substrate[MR_CONFIG_STRING_MAX];
    uint64_t datagram_size;
    uint64_t send_slots;
    uint64_t send_bytes;       /* 0: no limit. */
    uint64_t coalesce_bytes;   /* 0: never. */
    uint64_t recv_slots;
    char plugin_path[MR_CONFIG_STRING_MAX];
    unsigned log_level;        /* mr_log_level_t */
    uint64_t ranks_per_node;   /* 0: group ranks by host. */
    bool numa;
    unsigned yield;            /* mr_when_t */
    unsigned wait_nap;         /* mr_when_t */
    uint64_t timeout_s;        /* Bound on collective waits in init and finalize. */
} mr_core_config_t;

/* MAILRAIL_YIELD: when an idle poll gives the core away. */
/* MAILRAIL_YIELD and MAILRAIL_WAIT_NAP: auto (when ranks outnumber CPUs), always, never. */
typedef enum mr_when { MR_WHEN_AUTO, MR_WHEN_ALWAYS, MR_WHEN_NEVER } mr_when_t;
extern const char *const mr__when_names[];

extern const mr_config_entry_t mr__core_config_table[];

/*
 * MAILRAIL_SEND_BYTES left unset bounds the bytes in flight at this many
 * datagrams, or at the table's default (256K, 64 of 4 KiB) if that is more:
 * with large datagrams a fixed 256K would let one message out at a time.
 */
#define MR_SEND_BYTES_DATAGRAMS 64

/* The bound on bytes in flight: `set` (MAILRAIL_SEND_BYTES in the environment) keeps `cfg`'s. */
uint64_t mr__config_send_bytes(const mr_core_config_t *cfg, bool set);

#endif /* MR_CONFIG_H */
