/*
 * Finding, loading and validating plugins. Internal.
 *
 * A plugin of kind K and name N is the file mailrail_K_N.so. The directories
 * searched are MAILRAIL_PLUGIN_PATH when set, otherwise the mailrail/
 * directory next to the library, the install directory, and the build tree's
 * plugin directories (so tests run without installing).
 */
#ifndef MR_PLUGIN_H
#define MR_PLUGIN_H

#include "mailrail.h"
#include "mr_bootstrap.h"
#include "mr_substrate.h"

#include <stddef.h>

#define MR_PLUGIN_DIRS_MAX 16
#define MR_PLUGIN_PATH_MAX 4096

typedef struct mr_plugin_dirs {
    int count;
    char dir[MR_PLUGIN_DIRS_MAX][MR_PLUGIN_PATH_MAX];
} mr_plugin_dirs_t;

/* Fills `dirs` from `plugin_path` (colon-separated; empty for the defaults). */
void mr__plugin_dirs_init(mr_plugin_dirs_t *dirs, const char *plugin_path);

/*
 * Loads substrate `name`. Sets *handle and *ops only on MR_OK. On failure
 * writes why into `why` (not found, dlopen error, invalid ops table) and
 * returns MR_ERR_PLUGIN without logging.
 */
mr_status_t mr__plugin_load_substrate(const mr_plugin_dirs_t *dirs, const char *name,
                                     void **handle, const mr_substrate_ops_t **ops,
                                     char *why, size_t why_len);

/* Loads bootstrap `name`, like mr__plugin_load_substrate(). */
mr_status_t mr__plugin_load_bootstrap(const mr_plugin_dirs_t *dirs, const char *name,
                                     void **handle, const mr_bootstrap_ops_t **ops,
                                     char *why, size_t why_len);

/*
 * Calls `fn` once for every substrate plugin file found in `dirs`, first
 * occurrence of each name only, with its path, its ops when it loaded (NULL
 * otherwise) and why it did not load.
 */
typedef void (*mr_plugin_visit_fn)(void *arg, const char *name, const char *path,
                                   const mr_substrate_ops_t *ops, const char *why);
void mr__plugin_list_substrates(const mr_plugin_dirs_t *dirs, mr_plugin_visit_fn fn, void *arg);

void mr__plugin_unload(void *handle);

#endif /* MR_PLUGIN_H */
