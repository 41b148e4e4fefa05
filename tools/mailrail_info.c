/*
 * mailrail_info: what this MailRail installation can do, in the spirit of
 * ucx_info and fi_info. Lists the substrate plugins found (and why one does
 * not load), the flow-control policies, and every MAILRAIL_* setting with its
 * default, current value and documentation.
 */
#include "mailrail.h"
#include "mr_config.h"
#include "mr_flowctl.h"
#include "mr_log.h"
#include "mr_plugin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { OUT_TEXT, OUT_MARKDOWN } out_format_t;

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: mailrail_info [-s] [-f] [-c] [--markdown] [-h]\n"
            "  -s          list the substrate plugins found, and why one does not load\n"
            "  -f          list the flow-control policies\n"
            "  -c          list every MAILRAIL_* setting: default, current value, doc\n"
            "  --markdown  print the settings as the Markdown page docs/settings.md\n"
            "With no option, prints all of -s, -f and -c.\n");
}

/* Prints text for a Markdown table cell: a '|' would end the cell. */
static void print_cell(const char *text)
{
    for (const char *p = text; *p != '\0'; p++) {
        if (*p == '|') fputs("\\|", stdout);
        else putchar(*p);
    }
}

static void print_table(const char *owner, const mr_config_entry_t *table, size_t size,
                        out_format_t format)
{
    void *cfg;

    if (table == NULL) return;
    cfg = calloc(1, size);
    if (cfg == NULL) return;
    if (format == OUT_MARKDOWN) {
        printf("\n## %s\n\n| Variable | Default | Allowed | Description |\n"
               "| --- | --- | --- | --- |\n", owner);
    } else {
        printf("\n# %s settings\n", owner);
    }
    for (const mr_config_entry_t *e = table; e->name != NULL; e++) {
        char allowed[256], err[512], current[MR_CONFIG_STRING_MAX + sizeof(err) + 16];
        const char *env = getenv(e->name);

        mr__config_format_allowed(e, allowed, sizeof(allowed));
        if (format == OUT_MARKDOWN) {
            printf("| `%s` | %s%s%s | ", e->name, e->default_value[0] ? "`" : "",
                   e->default_value[0] ? e->default_value : "(empty)",
                   e->default_value[0] ? "`" : "");
            print_cell(allowed);
            fputs(" | ", stdout);
            print_cell(e->doc);
            fputs(" |\n", stdout);
            continue;
        }
        if (env == NULL) {
            mr__config_parse_value(e, e->default_value, cfg, err, sizeof(err));
            mr__config_format_value(e, cfg, current, sizeof(current));
        } else if (mr__config_parse_value(e, env, cfg, err, sizeof(err)) == MR_OK) {
            mr__config_format_value(e, cfg, current, sizeof(current));
        } else {
            snprintf(current, sizeof(current), "INVALID (%s)", err);
        }
        printf("#\n# %s\n#   %s\n#   default: %s   allowed: %s%s\n%s=%s\n", e->name, e->doc,
               e->default_value, allowed, env ? "   (set in the environment)" : "", e->name,
               current);
    }
    free(cfg);
}

typedef struct info_walk {
    bool list;            /* Print the substrate list. */
    bool config;          /* Print each loadable substrate's settings. */
    out_format_t format;
} info_walk_t;

static void visit_substrate(void *arg, const char *name, const char *path,
                            const mr_substrate_ops_t *ops, const char *why)
{
    info_walk_t *walk = arg;
    char owner[128];

    if (walk->list) {
        if (ops != NULL) printf("#   %-8s %s\n#            %s\n", name, ops->description, path);
        else printf("#   %-8s does not load: %s\n#            %s\n", name, why, path);
    }
    if (walk->config && ops != NULL) {
        snprintf(owner, sizeof(owner), "Substrate %s", name);
        print_table(owner, ops->config_table, ops->config_size, walk->format);
    }
}

int main(int argc, char **argv)
{
    bool substrates = false, flowctl = false, config = false;
    out_format_t format = OUT_TEXT;
    mr_plugin_dirs_t *dirs;
    const char *path = getenv("MAILRAIL_PLUGIN_PATH");

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-s") == 0) substrates = true;
        else if (strcmp(argv[i], "-f") == 0) flowctl = true;
        else if (strcmp(argv[i], "-c") == 0) config = true;
        else if (strcmp(argv[i], "--markdown") == 0) format = OUT_MARKDOWN;
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "mailrail_info: unknown option \"%s\".\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (format == OUT_MARKDOWN) {
        substrates = flowctl = false;
        config = true;
    } else if (!substrates && !flowctl && !config) {
        substrates = flowctl = config = true;
    }
    mr__log_threshold = MR_LOG_ERROR;
    dirs = malloc(sizeof(*dirs));
    if (dirs == NULL) return 1;
    mr__plugin_dirs_init(dirs, path);

    if (format == OUT_MARKDOWN) {
        printf("# MailRail settings\n\n"
               "Generated by `mailrail_info --markdown` from the settings tables; a test "
               "checks that this page matches them.\nEvery setting is read from the "
               "environment at `mr_init()`. A malformed or out-of-range value makes "
               "`mr_init()` fail with `MR_ERR_CONFIG` and a message naming the variable, the "
               "value and what is allowed. A `MAILRAIL_*` name that no table declares is "
               "ignored with a warning from rank 0 that suggests the closest setting. The "
               "settings of substrates other than the loaded one are unused, not unknown; the "
               "UCX substrate passes `MAILRAIL_UCX_<NAME>` to UCX, which warns about the "
               "names it does not know.\n");
    } else {
        printf("# MailRail %d.%d.%d\n", MR_VERSION_MAJOR, MR_VERSION_MINOR, MR_VERSION_PATCH);
    }
    if (substrates) {
        printf("#\n# Plugin directories:\n");
        for (int i = 0; i < dirs->count; i++) printf("#   %s\n", dirs->dir[i]);
        printf("#\n# Substrates:\n");
        info_walk_t walk = {.list = true};
        mr__plugin_list_substrates(dirs, visit_substrate, &walk);
    }
    if (flowctl) {
        printf("#\n# Flow-control policies (MAILRAIL_FLOWCTL):\n");
        for (int i = 0; mr__flowctl_names[i] != NULL; i++) {
            const mr_flowctl_ops_t *ops = mr__flowctl_find(mr__flowctl_names[i]);
            printf("#   %-8s %s\n", mr__flowctl_names[i],
                   ops ? ops->description : "not available in this build");
        }
    }
    if (config) {
        print_table("Core", mr__core_config_table, sizeof(mr_core_config_t), format);
        print_table("Flow control", mr__flowctl_config_table, sizeof(mr_flowctl_config_t), format);
        for (int i = 0; mr__flowctl_names[i] != NULL; i++) {
            const mr_flowctl_ops_t *ops = mr__flowctl_find(mr__flowctl_names[i]);
            char owner[128];
            if (ops == NULL) continue;
            snprintf(owner, sizeof(owner), "Flow control %s", ops->name);
            print_table(owner, ops->config_table, ops->config_size, format);
        }
        info_walk_t walk = {.config = true, .format = format};
        mr__plugin_list_substrates(dirs, visit_substrate, &walk);
    }
    free(dirs);
    return 0;
}
