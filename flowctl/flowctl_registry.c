/*
 * The policies built into this library, looked up by MAILRAIL_FLOWCTL. The
 * list comes from flowctl_names in the top-level meson.build, through the
 * generated mr_flowctl_builtin.h.
 */
#include "mr_flowctl.h"
#include "mr_flowctl_builtin.h"
#include "mr_log.h"

#include <string.h>

#define FLOWCTL_DECLARE(name) extern const mr_flowctl_ops_t mr__flowctl_##name##_ops;
#define FLOWCTL_NAME(name) #name,
#define FLOWCTL_OPS(name) &mr__flowctl_##name##_ops,

MR_FLOWCTL_BUILTIN(FLOWCTL_DECLARE)

const char *const mr__flowctl_names[] = {MR_FLOWCTL_BUILTIN(FLOWCTL_NAME) NULL};

static const mr_flowctl_ops_t *const flowctl_builtin[] = {MR_FLOWCTL_BUILTIN(FLOWCTL_OPS)};

const mr_flowctl_ops_t *mr__flowctl_find(const char *name)
{
    for (size_t i = 0; i < sizeof(flowctl_builtin) / sizeof(flowctl_builtin[0]); i++) {
        const mr_flowctl_ops_t *ops = flowctl_builtin[i];
        if (strcmp(ops->name, name) != 0) continue;
        /* Built in, but checked as a loaded plugin would be: its table must match ours. */
        if (ops->abi_version != MR_FLOWCTL_ABI_VERSION || ops->ops_size != sizeof(*ops)) {
            mr_error("Flow-control policy %s was built for ABI %u (%u bytes), this library has "
                     "%u (%zu bytes).", name, ops->abi_version, ops->ops_size,
                     MR_FLOWCTL_ABI_VERSION, sizeof(*ops));
            return NULL;
        }
        return ops;
    }
    return NULL;
}
