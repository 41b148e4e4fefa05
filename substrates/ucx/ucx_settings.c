/*
 * The UCX substrate's settings (MAILRAIL_UCX_*), and telling UCX that they
 * are not its own (ucx_substrate.h lists the other files).
 */
#include "ucx_substrate.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <ucs/config/parser.h>

/* ------------------------------------------------------------------------ */
/* Settings.                                                                 */

const char *const ucx__error_modes[] = {"auto", "none", "peer", NULL};

/* The two ends of an endpoint must agree on whether header-less messages are taken. */
const char *const ucx__job_wide_settings[] = {"MAILRAIL_UCX_ERROR_MODE",
                                              "MAILRAIL_UCX_BARE_MAX_RANKS", NULL};

/* The default of MAILRAIL_UCX_BARE_MAX_RANKS below: the most whose AM ids fit in 16 bits. */
_Static_assert(UCX_BARE_MAX_RANKS == 11439, "MAILRAIL_UCX_BARE_MAX_RANKS's default is stale");

const mr_config_entry_t ucx__config_table[] = {
    {.name = "MAILRAIL_UCX_ERROR_MODE",
     .default_value = "auto",
     .type = MR_CONFIG_ENUM,
     .offset = offsetof(ucx_config_t, error_mode),
     .choices = ucx__error_modes,
     .doc = "UCX error handling towards each peer: peer makes UCX report dead peers, but UCX "
            "1.13 then replaces shared memory between ranks of one host by TCP loopback (over "
            "10 times fewer messages per second); none keeps shared memory, and UCX reports no "
            "dead peer; auto is none within a host and peer between hosts. A dead peer on the "
            "same host is detected in every mode, through its process descriptor (pidfd). Must "
            "be the same on every rank."},
    {.name = "MAILRAIL_UCX_ZCOPY_THRESH",
     .default_value = "0",
     .type = MR_CONFIG_SIZE,
     .offset = offsetof(ucx_config_t, zcopy_thresh),
     .min = 0,
     .max = UINT64_C(1) << 30,
     .doc = "Messages of at least this many bytes that UCX lets the receiver keep are delivered "
            "in UCX's buffer instead of being copied into a receive slot (zero copy); each still "
            "takes one receive slot's credit. 0 keeps every buffer UCX allows."},
    {.name = "MAILRAIL_UCX_SPILL_SIZE",
     .default_value = "256K",
     .type = MR_CONFIG_SIZE,
     .offset = offsetof(ucx_config_t, spill_size),
     .min = 0,
     .max = UINT64_C(1) << 32,
     .doc = "Bytes set aside per rank for messages that arrive when every receive slot is taken "
            "(possible only with MAILRAIL_FLOWCTL=none) and that UCX will not let the receiver "
            "keep; beyond it they are copied to the heap. The rank then stops taking messages "
            "until slots free up, so little of it is used."},
    {.name = "MAILRAIL_UCX_BARE",
     .default_value = "yes",
     .type = MR_CONFIG_BOOL,
     .offset = offsetof(ucx_config_t, bare),
     .doc = "Sends a message that carries no credits without MailRail's header, naming the "
            "sender and the kind by the active-message id, so that the receiver reads no header "
            "(jobs of at most 11439 ranks). Receivers take both forms either way."},
    {.name = "MAILRAIL_UCX_BARE_MAX_RANKS",
     .default_value = "11439",
     .type = MR_CONFIG_UINT,
     .offset = offsetof(ucx_config_t, bare_max_ranks),
     .min = 0,
     .max = UCX_BARE_MAX_RANKS,
     .doc = "Jobs of more ranks than this take the large-job path: every message carries "
            "MailRail's header and no rank registers the 4 header-less active-message ids per "
            "rank (O(ranks) handlers at init). The default is the most ranks whose ids fit in 16 "
            "bits; a lower value takes that path in a smaller job (the tests force it on 4 "
            "ranks). Must be the same on every rank."},
    {.name = NULL},
};

/* ------------------------------------------------------------------------ */
/* Telling UCX that the plugin's MAILRAIL_UCX_* settings are not its own.   */

static int known_read(const char *buf, void *dest, const void *arg)
{
    (void)buf;
    (void)dest;
    (void)arg;
    return 1;
}

static int known_write(char *buf, size_t max, const void *src, const void *arg)
{
    (void)src;
    (void)arg;
    if (max > 0) buf[0] = '\0';
    return 1;
}

static ucs_status_t known_clone(const void *src, void *dest, const void *arg)
{
    (void)src;
    (void)dest;
    (void)arg;
    return UCS_OK;
}

static void known_release(void *ptr, const void *arg)
{
    (void)ptr;
    (void)arg;
}

static void known_help(char *buf, size_t max, const void *arg)
{
    (void)arg;
    if (max > 0) buf[0] = '\0';
}

/*
 * UCX warns, once per process, about every set variable that starts with
 * MAILRAIL_UCX_ and that no UCX table read. Parsing our names through a
 * throw-away UCX table with a no-op parser marks them as read.
 */
void ucx__mark_own_settings(void)
{
    enum { MAX_OWN = 8 };
    ucs_config_field_t fields[MAX_OWN + 1];
    size_t n = 0, plen = strlen(UCX_OWN_PREFIX);
    uint64_t dummy = 0;

    memset(fields, 0, sizeof(fields));
    for (const mr_config_entry_t *e = ucx__config_table; e->name != NULL && n < MAX_OWN; e++) {
        if (strncmp(e->name, UCX_OWN_PREFIX, plen) != 0) continue;
        fields[n].name = e->name + plen;
        fields[n].dfl_value = "";
        fields[n].doc = "";
        fields[n].offset = 0;
        fields[n].parser.read = known_read;
        fields[n].parser.write = known_write;
        fields[n].parser.clone = known_clone;
        fields[n].parser.release = known_release;
        fields[n].parser.help = known_help;
        fields[n].parser.arg = NULL;
        n++;
    }
    if (ucs_config_parser_fill_opts(&dummy, fields, UCX_OWN_PREFIX, NULL, 1) == UCS_OK) {
        ucs_config_parser_release_opts(&dummy, fields);
    }
}
