/*
 * libFuzzer target: the settings parser. The first byte picks a setting of
 * the core's table (or flow control's, or a policy's), the rest is the value. Whatever the
 * bytes, parsing must not crash or read out of bounds; a value that parses
 * must print and parse back to the same value; a refusal must name the
 * variable.
 */
#include "mr_config.h"
#include "mr_flowctl.h"
#include "mr_log.h"

#include <stdlib.h>
#include <string.h>

static const mr_config_entry_t *fuzz_entry(unsigned pick)
{
    static const mr_config_entry_t *all[64];
    static size_t count;

    if (count == 0) {
        for (const mr_config_entry_t *e = mr__core_config_table; e->name && count < 64; e++) {
            all[count++] = e;
        }
        for (const mr_config_entry_t *e = mr__flowctl_config_table; e->name && count < 64; e++) {
            all[count++] = e;
        }
        for (int i = 0; mr__flowctl_names[i] != NULL; i++) {
            const mr_flowctl_ops_t *ops = mr__flowctl_find(mr__flowctl_names[i]);
            for (const mr_config_entry_t *e = ops && ops->config_table ? ops->config_table : NULL;
                 e != NULL && e->name && count < 64; e++) {
                all[count++] = e;
            }
        }
    }
    return all[pick % count];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Large enough for every table's struct. */
    union {
        mr_core_config_t core;
        uint64_t words[256];
    } cfg, again;
    char value[1024], printed[MR_CONFIG_STRING_MAX + 64], err[512];
    const mr_config_entry_t *e;

    if (size == 0) return 0;
    e = fuzz_entry(data[0]);
    size_t n = size - 1 < sizeof(value) - 1 ? size - 1 : sizeof(value) - 1;
    memcpy(value, data + 1, n);
    value[n] = '\0';
    memset(&cfg, 0, sizeof(cfg));
    if (mr__config_parse_value(e, value, &cfg, err, sizeof(err)) != MR_OK) {
        if (strstr(err, e->name) == NULL) abort();
        return 0;
    }
    mr__config_format_value(e, &cfg, printed, sizeof(printed));
    memset(&again, 0, sizeof(again));
    if (mr__config_parse_value(e, printed, &again, err, sizeof(err)) != MR_OK) abort();
    if (memcmp(&cfg, &again, sizeof(cfg)) != 0) abort();
    return 0;
}
