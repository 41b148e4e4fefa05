/*
 * The settings parser and the core's own settings table. Flow control's
 * settings live in flowctl/flowctl_settings.c.
 */
#include "mr_config.h"
#include "mr_log.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const mr_config_entry_t mr__core_config_table[] = {
    {"MAILRAIL_SUBSTRATE", "ucx", MR_CONFIG_STRING, offsetof(mr_core_config_t, substrate), 0, 0,
     NULL,
     "The substrate that carries messages: the name of a plugin mailrail_substrate_<name>.so: "
     "ucx (UCX active messages), mpi (MPI point-to-point) or tcp (sockets). `mailrail_info` "
     "lists the ones that load, and why one does not."},
    {"MAILRAIL_DATAGRAM_SIZE", "4K", MR_CONFIG_SIZE, offsetof(mr_core_config_t, datagram_size),
     16, 64u << 20, NULL,
     "The capacity of every send and receive buffer, which is the largest message, in bytes "
     "(suffixes K, M, G)."},
    {"MAILRAIL_SEND_SLOTS", "256", MR_CONFIG_UINT, offsetof(mr_core_config_t, send_slots), 1,
     1u << 20, NULL,
     "Buffers in the send pool: the most messages reserved, deferred or in flight at once. "
     "Beyond it mr_reserve() returns MR_AGAIN (backpressure)."},
    {"MAILRAIL_SEND_BYTES", "256K", MR_CONFIG_SIZE, offsetof(mr_core_config_t, send_bytes), 0,
     UINT64_C(1) << 40, NULL,
     "Bytes of messages sent and not yet completed (in flight or deferred) from which "
     "mr_reserve() returns MR_AGAIN, whatever slots are free; 0: no limit. A sender far ahead "
     "of its receiver with large messages would otherwise cycle through the whole send pool, "
     "and the transport would read buffers that have left the cache. Unset, it is 256K or 64 "
     "datagrams (MAILRAIL_DATAGRAM_SIZE), whichever is more, so that large datagrams do not "
     "leave one at a time."},
    {"MAILRAIL_COALESCE_BYTES", "1K", MR_CONFIG_SIZE, offsetof(mr_core_config_t, coalesce_bytes),
     0, 64u << 20, NULL,
     "Messages of at most this many bytes that follow another to the same rank before the "
     "next progress call (mr_receive, mr_wait) are packed together into one transport "
     "message, which leaves when it is full or at that call; the first one leaves at once. "
     "Each keeps its own credit and receive slot. 0: never. Used by the MPI and UCX "
     "substrates."},
    {"MAILRAIL_RECV_SLOTS", "1024", MR_CONFIG_UINT, offsetof(mr_core_config_t, recv_slots), 1,
     1u << 22, NULL,
     "Buffers in the receive pool: the most messages that can have arrived and not yet been "
     "released. One credit is one of these slots. When it is not set, MAILRAIL_FLOWCTL=rank "
     "and node grow the pool to the credits they grant (one per sending rank or node at "
     "least)."},
    {"MAILRAIL_PLUGIN_PATH", "", MR_CONFIG_STRING, offsetof(mr_core_config_t, plugin_path), 0,
     0, NULL,
     "Colon-separated directories searched for plugins. Empty: the mailrail/ directory next "
     "to libmailrail.so (and, in a build tree, the build's own plugin directories)."},
    {"MAILRAIL_LOG_LEVEL", "warn", MR_CONFIG_ENUM, offsetof(mr_core_config_t, log_level), 0, 0,
     mr__log_level_names, "How much MailRail prints to stderr."},
    {"MAILRAIL_RANKS_PER_NODE", "0", MR_CONFIG_UINT, offsetof(mr_core_config_t, ranks_per_node),
     0, 1u << 20, NULL,
     "Groups the ranks of one host into virtual nodes of this many consecutive ranks, so that "
     "node-level behaviour can be exercised on one machine. 0 uses the real hosts."},
    {"MAILRAIL_NUMA", "yes", MR_CONFIG_BOOL, offsetof(mr_core_config_t, numa), 0, 0, NULL,
     "Allocates the pools on the local NUMA node through libnuma, when the library was built "
     "with it and the system has NUMA support."},
    {"MAILRAIL_YIELD", "auto", MR_CONFIG_ENUM, offsetof(mr_core_config_t, yield), 0, 0,
     mr__when_names,
     "Whether a poll that finds nothing now and then gives the core away (sched_yield): "
     "auto does when this machine (one kernel, whatever the ranks' host names) runs more "
     "ranks than the CPUs this process may use, so that oversubscribed ranks let each other "
     "run, and spins otherwise, as MPI libraries do."},
    {"MAILRAIL_WAIT_NAP", "auto", MR_CONFIG_ENUM, offsetof(mr_core_config_t, wait_nap), 0, 0,
     mr__when_names,
     "Whether mr_wait() naps before it sleeps until news: it polls after naps of 20 us, "
     "each a quarter longer than the last, up to 200 us (about 1 ms in all), and only then "
     "sleeps until the substrate wakes it. Messages that arrive meanwhile wait up to a nap, "
     "and a busy rank is woken once per nap instead of once per message. auto naps when this "
     "machine runs more ranks than the CPUs this process may use (as MAILRAIL_YIELD) and the "
     "substrate's wait is costly (ucx; tcp's is one epoll_wait, and naps only add to it); "
     "never sleeps until news at once. Napping, a wait that the substrate ends early "
     "without news (UCX with work of its own pending, or every receive slot held) naps "
     "200 us at a time to its timeout instead of returning at once."},
    {"MAILRAIL_TIMEOUT", "60", MR_CONFIG_UINT, offsetof(mr_core_config_t, timeout_s), 1, 86400,
     NULL,
     "Seconds that init may wait for the other ranks and finalize may wait for in-flight "
     "sends, before giving up with MR_ERR_TIMEOUT. A peer has failed (MR_ERR_PEER_FAILED) "
     "when its host takes no connection for this long after the first attempt, when it "
     "takes none of the messages deferred to it (no credit, or its substrate takes "
     "nothing) or completes no send in flight to it, and sends nothing, for this long, "
     "and over TCP when nothing at all arrives from its host "
     "(keepalive) or it takes no data for this long."},
    {NULL, NULL, 0, 0, 0, 0, NULL, NULL},
};

const char *const mr__when_names[] = {"auto", "always", "never", NULL};

static const char *const config_bool_true[] = {"1", "yes", "on", "true", "y", NULL};
static const char *const config_bool_false[] = {"0", "no", "off", "false", "n", NULL};

static int config_find_word(const char *const *words, const char *value)
{
    for (int i = 0; words[i] != NULL; i++) {
        if (strcasecmp(words[i], value) == 0) return i;
    }
    return -1;
}

void mr__config_format_allowed(const mr_config_entry_t *entry, char *buf, size_t len)
{
    size_t used = 0;

    buf[0] = '\0';
    switch (entry->type) {
    case MR_CONFIG_UINT:
        snprintf(buf, len, "an integer from %" PRIu64 " to %" PRIu64, entry->min, entry->max);
        break;
    case MR_CONFIG_SIZE:
        snprintf(buf, len, "a size from %" PRIu64 " to %" PRIu64 " bytes (suffixes K, M, G)",
                 entry->min, entry->max);
        break;
    case MR_CONFIG_BOOL:
        snprintf(buf, len, "yes|no (also on|off, true|false, 1|0)");
        break;
    case MR_CONFIG_ENUM:
        for (int i = 0; entry->choices[i] != NULL && used < len; i++) {
            int n = snprintf(buf + used, len - used, "%s%s", i ? "|" : "", entry->choices[i]);
            if (n < 0) break;
            used += (size_t)n;
        }
        break;
    case MR_CONFIG_STRING:
        snprintf(buf, len, "text of at most %d bytes", MR_CONFIG_STRING_MAX - 1);
        break;
    }
}

/* Parses an unsigned decimal number with an optional K/M/G suffix when `sized`. */
static int config_parse_number(const char *value, bool sized, uint64_t *out)
{
    const char *p = value;
    char *end;
    uint64_t n, scale = 1;

    if (!isdigit((unsigned char)*p)) return -1;
    errno = 0;
    n = strtoull(p, &end, 10);
    if (errno != 0) return -1;
    if (sized && *end != '\0') {
        switch (toupper((unsigned char)*end)) {
        case 'K': scale = 1ull << 10; break;
        case 'M': scale = 1ull << 20; break;
        case 'G': scale = 1ull << 30; break;
        default: return -1;
        }
        end++;
        if (toupper((unsigned char)*end) == 'B') end++;
    }
    if (*end != '\0') return -1;
    if (n > UINT64_MAX / scale) return -1;
    *out = n * scale;
    return 0;
}

mr_status_t mr__config_parse_value(const mr_config_entry_t *entry, const char *value,
                                  void *out, char *err, size_t err_len)
{
    char *field = (char *)out + entry->offset;
    char allowed[256];
    uint64_t number;
    int index;

    switch (entry->type) {
    case MR_CONFIG_UINT:
    case MR_CONFIG_SIZE:
        if (config_parse_number(value, entry->type == MR_CONFIG_SIZE, &number) != 0 ||
            number < entry->min || number > entry->max) {
            break;
        }
        memcpy(field, &number, sizeof(number));
        return MR_OK;
    case MR_CONFIG_BOOL:
        if (config_find_word(config_bool_true, value) >= 0) {
            *(bool *)field = true;
            return MR_OK;
        }
        if (config_find_word(config_bool_false, value) >= 0) {
            *(bool *)field = false;
            return MR_OK;
        }
        break;
    case MR_CONFIG_ENUM:
        index = config_find_word(entry->choices, value);
        if (index < 0) break;
        *(unsigned *)field = (unsigned)index;
        return MR_OK;
    case MR_CONFIG_STRING:
        if (strlen(value) >= MR_CONFIG_STRING_MAX) break;
        strcpy(field, value);
        return MR_OK;
    }
    mr__config_format_allowed(entry, allowed, sizeof(allowed));
    snprintf(err, err_len, "%s=\"%.64s\" is invalid: allowed is %s.", entry->name, value,
             allowed);
    return MR_ERR_CONFIG;
}

/* The Levenshtein distance between two short strings, capped at 64 characters each. */
static size_t config_distance(const char *a, const char *b)
{
    size_t la = strlen(a) < 64 ? strlen(a) : 64, lb = strlen(b) < 64 ? strlen(b) : 64;
    size_t row[65];

    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diagonal = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t above = row[j];
            size_t best = diagonal + (a[i - 1] != b[j - 1]);
            if (above + 1 < best) best = above + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diagonal = above;
        }
    }
    return row[lb];
}

int mr__config_warn_unknown(const mr_config_entry_t *const *tables, size_t ntables,
                           const char *const *skip_prefixes,
                           bool (*declared_elsewhere)(void *arg, const char *name), void *arg)
{
    extern char **environ;
    int unknown = 0;

    for (char **env = environ; env != NULL && *env != NULL; env++) {
        const char *var = *env, *eq = strchr(var, '=');
        char name[128];
        const char *closest = NULL;
        size_t closest_distance = 4; /* Suggest only names this near. */
        bool known = false, skipped = false;

        if (strncmp(var, "MAILRAIL_", 9) != 0 || eq == NULL) continue;
        /* A name longer than any setting is unknown; show its start. */
        snprintf(name, sizeof(name), "%.*s", (int)(eq - var), var);
        for (size_t p = 0; skip_prefixes != NULL && skip_prefixes[p] != NULL; p++) {
            skipped |= strncmp(name, skip_prefixes[p], strlen(skip_prefixes[p])) == 0;
        }
        for (size_t t = 0; t < ntables && !known && !skipped; t++) {
            for (const mr_config_entry_t *e = tables[t]; e != NULL && e->name != NULL; e++) {
                size_t d;
                if (strcmp(e->name, name) == 0) {
                    known = true;
                    break;
                }
                d = config_distance(e->name, name);
                if (d < closest_distance) {
                    closest_distance = d;
                    closest = e->name;
                }
            }
        }
        if (known || skipped) continue;
        if (declared_elsewhere != NULL && declared_elsewhere(arg, name)) continue;
        unknown++;
        if (closest != NULL) {
            mr_warn("%s is not a MailRail setting and is ignored; did you mean %s? "
                    "(mailrail_info -c lists every setting)", name, closest);
        } else {
            mr_warn("%s is not a MailRail setting and is ignored (mailrail_info -c lists every "
                    "setting).", name);
        }
    }
    return unknown;
}

uint64_t mr__config_send_bytes(const mr_core_config_t *cfg, bool set)
{
    uint64_t scaled = MR_SEND_BYTES_DATAGRAMS * cfg->datagram_size;

    if (set || cfg->send_bytes == 0) return cfg->send_bytes;
    return scaled > cfg->send_bytes ? scaled : cfg->send_bytes;
}

const mr_config_entry_t *mr__config_find(const mr_config_entry_t *table, const char *name)
{
    for (const mr_config_entry_t *e = table; e != NULL && e->name != NULL; e++) {
        if (strcmp(e->name, name) == 0) return e;
    }
    return NULL;
}

mr_status_t mr__config_parse(const mr_config_entry_t *table, void *out)
{
    char err[512];

    for (const mr_config_entry_t *entry = table; entry->name != NULL; entry++) {
        const char *value = getenv(entry->name);
        mr_status_t status;

        if (value == NULL) {
            status = mr__config_parse_value(entry, entry->default_value, out, err, sizeof(err));
            if (status != MR_OK) {
                mr_error("internal: the default of %s does not parse: %s", entry->name, err);
                return status;
            }
            continue;
        }
        status = mr__config_parse_value(entry, value, out, err, sizeof(err));
        if (status != MR_OK) {
            mr_error("%s", err);
            return status;
        }
    }
    return MR_OK;
}

void mr__config_format_value(const mr_config_entry_t *entry, const void *cfg, char *buf,
                            size_t len)
{
    const char *field = (const char *)cfg + entry->offset;
    uint64_t number;

    switch (entry->type) {
    case MR_CONFIG_UINT:
    case MR_CONFIG_SIZE:
        memcpy(&number, field, sizeof(number));
        snprintf(buf, len, "%" PRIu64, number);
        break;
    case MR_CONFIG_BOOL:
        snprintf(buf, len, "%s", *(const bool *)field ? "yes" : "no");
        break;
    case MR_CONFIG_ENUM:
        snprintf(buf, len, "%s", entry->choices[*(const unsigned *)field]);
        break;
    case MR_CONFIG_STRING:
        snprintf(buf, len, "%s", field);
        break;
    }
}
