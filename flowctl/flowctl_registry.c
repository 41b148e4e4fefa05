/*
 * The policies built into this library, looked up by MAILRAIL_FLOWCTL.
 */
#include "mr_flowctl.h"

#include <string.h>

const char *const mr_flowctl_names[] = {"none", "rank", "node", NULL};

extern const mr_flowctl_ops_t mr_flowctl_none_ops;
extern const mr_flowctl_ops_t mr_flowctl_rank_ops;
extern const mr_flowctl_ops_t mr_flowctl_node_ops;

static const mr_flowctl_ops_t *const flowctl_builtin[] = {
    &mr_flowctl_none_ops,
    &mr_flowctl_rank_ops,
    &mr_flowctl_node_ops,
};

const mr_flowctl_ops_t *mr_flowctl_find(const char *name)
{
    for (size_t i = 0; i < sizeof(flowctl_builtin) / sizeof(flowctl_builtin[0]); i++) {
        if (strcmp(flowctl_builtin[i]->name, name) == 0) return flowctl_builtin[i];
    }
    return NULL;
}
