/*
 * The plugin loader: search path, dlopen, and validation of the ops tables.
 */
#include "mr_plugin.h"
#include "mr_config.h"
#include "mr_build_paths.h"

#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void plugin_dirs_add(mr_plugin_dirs_t *dirs, const char *dir, size_t len)
{
    if (len == 0 || len >= MR_PLUGIN_PATH_MAX || dirs->count >= MR_PLUGIN_DIRS_MAX) return;
    for (int i = 0; i < dirs->count; i++) {
        if (strlen(dirs->dir[i]) == len && strncmp(dirs->dir[i], dir, len) == 0) return;
    }
    memcpy(dirs->dir[dirs->count], dir, len);
    dirs->dir[dirs->count][len] = '\0';
    dirs->count++;
}

static void plugin_dirs_add_list(mr_plugin_dirs_t *dirs, const char *list)
{
    const char *p = list;

    while (*p != '\0') {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);
        plugin_dirs_add(dirs, p, len);
        if (colon == NULL) break;
        p = colon + 1;
    }
}

void mr__plugin_dirs_init(mr_plugin_dirs_t *dirs, const char *plugin_path)
{
    Dl_info info;

    dirs->count = 0;
    if (plugin_path != NULL && plugin_path[0] != '\0') {
        plugin_dirs_add_list(dirs, plugin_path);
        return;
    }
    /* The mailrail/ directory next to the object this loader is linked into. */
    if (dladdr((void *)&mr__plugin_dirs_init, &info) != 0 && info.dli_fname != NULL) {
        char dir[MR_PLUGIN_PATH_MAX], self[PATH_MAX];
        const char *slash;
        if (realpath(info.dli_fname, self) == NULL) snprintf(self, sizeof(self), "%s", info.dli_fname);
        slash = strrchr(self, '/');
        if (slash != NULL) {
            int n = snprintf(dir, sizeof(dir), "%.*s/mailrail", (int)(slash - self), self);
            if (n > 0 && (size_t)n < sizeof(dir)) plugin_dirs_add(dirs, dir, (size_t)n);
        }
    }
    plugin_dirs_add(dirs, MR_INSTALL_PLUGIN_DIR, strlen(MR_INSTALL_PLUGIN_DIR));
    plugin_dirs_add_list(dirs, MR_BUILD_PLUGIN_DIRS);
}

/* dlopens the first mailrail_<kind>_<name>.so found and resolves `entry`. */
static mr_status_t plugin_open(const mr_plugin_dirs_t *dirs, const char *kind, const char *name,
                               const char *entry, void **handle, void **fn, char *why,
                               size_t why_len)
{
    char path[MR_PLUGIN_PATH_MAX + 128];
    bool found = false;

    if (name[0] == '\0' || strchr(name, '/') != NULL) {
        snprintf(why, why_len, "\"%s\" is not a plugin name", name);
        return MR_ERR_PLUGIN;
    }
    for (int i = 0; i < dirs->count; i++) {
        snprintf(path, sizeof(path), "%s/mailrail_%s_%s.so", dirs->dir[i], kind, name);
        FILE *f = fopen(path, "r");
        if (f == NULL) continue;
        fclose(f);
        found = true;
        /*
         * No plugin is ever unloaded (RTLD_NODELETE, so dlclose only drops the
         * handle): MPI cannot be initialized twice in a process, and MPICH and
         * UCX keep threads, handlers and state past their finalize. A later
         * mr_init() finds the same copy. tests/test_no_unload.c checks this.
         */
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (h == NULL) {
            snprintf(why, why_len, "%s", dlerror());
            return MR_ERR_PLUGIN;
        }
        void *sym = dlsym(h, entry);
        if (sym == NULL) {
            snprintf(why, why_len, "%s does not export %s", path, entry);
            dlclose(h);
            return MR_ERR_PLUGIN;
        }
        *handle = h;
        *fn = sym;
        return MR_OK;
    }
    if (!found) {
        int used = snprintf(why, why_len, "no file mailrail_%s_%s.so in", kind, name);
        for (int i = 0; i < dirs->count && used > 0 && (size_t)used < why_len; i++) {
            used += snprintf(why + used, why_len - (size_t)used, " %s", dirs->dir[i]);
        }
    }
    return MR_ERR_PLUGIN;
}

/*
 * Checks the common header of an ops table: the version and the size are this
 * library's (plugins are built with it), and the name is the file's.
 */
static bool plugin_header_valid(uint32_t abi_version, uint32_t expected_version,
                                uint32_t ops_size, size_t expected_size, const char *ops_name,
                                const char *name, char *why, size_t why_len)
{
    if (abi_version != expected_version) {
        snprintf(why, why_len, "ABI version %u, this library needs %u", abi_version,
                 expected_version);
        return false;
    }
    if (ops_size != expected_size) {
        snprintf(why, why_len, "ops table of %u bytes, this library needs %zu (built from "
                 "another MailRail?)", ops_size, expected_size);
        return false;
    }
    if (ops_name == NULL || strcmp(ops_name, name) != 0) {
        snprintf(why, why_len, "the plugin calls itself \"%s\"", ops_name ? ops_name : "");
        return false;
    }
    return true;
}

static bool plugin_substrate_valid(const mr_substrate_ops_t *ops, const char *name, char *why,
                                   size_t why_len)
{
    if (ops == NULL) {
        snprintf(why, why_len, "the entry point returned no ops table");
        return false;
    }
    if (!plugin_header_valid(ops->abi_version, MR_SUBSTRATE_ABI_VERSION, ops->ops_size,
                             sizeof(*ops), ops->name, name, why, why_len)) {
        return false;
    }
    if (!ops->open || !ops->get_address || !ops->connect || !ops->send || !ops->send_control ||
        !ops->progress || !ops->format_address || !ops->close ||
        (ops->config_table != NULL && ops->config_size == 0)) {
        snprintf(why, why_len, "the ops table lacks a mandatory function");
        return false;
    }
    if (ops->job_wide_settings != NULL) {
        for (const char *const *n = ops->job_wide_settings; *n != NULL; n++) {
            if (mr__config_find(ops->config_table, *n) == NULL) {
                snprintf(why, why_len, "job-wide setting %s is not in its settings table", *n);
                return false;
            }
        }
    }
    return true;
}

mr_status_t mr__plugin_load_substrate(const mr_plugin_dirs_t *dirs, const char *name,
                                     void **handle, const mr_substrate_ops_t **ops,
                                     char *why, size_t why_len)
{
    void *h, *fn;
    mr_status_t status;

    status = plugin_open(dirs, "substrate", name, MR_SUBSTRATE_ENTRY, &h, &fn, why, why_len);
    if (status != MR_OK) return status;
    const mr_substrate_ops_t *o = ((mr_substrate_entry_fn)fn)();
    if (!plugin_substrate_valid(o, name, why, why_len)) {
        dlclose(h);
        return MR_ERR_PLUGIN;
    }
    *handle = h;
    *ops = o;
    return MR_OK;
}

mr_status_t mr__plugin_load_bootstrap(const mr_plugin_dirs_t *dirs, const char *name,
                                     void **handle, const mr_bootstrap_ops_t **ops,
                                     char *why, size_t why_len)
{
    void *h, *fn;
    mr_status_t status;

    status = plugin_open(dirs, "bootstrap", name, MR_BOOTSTRAP_ENTRY, &h, &fn, why, why_len);
    if (status != MR_OK) return status;
    const mr_bootstrap_ops_t *o = ((mr_bootstrap_entry_fn)fn)();
    if (o == NULL) {
        snprintf(why, why_len, "the entry point returned no ops table");
    } else if (plugin_header_valid(o->abi_version, MR_BOOTSTRAP_ABI_VERSION, o->ops_size,
                                   sizeof(*o), o->name, name, why, why_len)) {
        if (o->init && o->iallgather && o->ibcast && o->iallreduce_sum && o->ibarrier &&
            o->test && o->comm && o->finalize) {
            *handle = h;
            *ops = o;
            return MR_OK;
        }
        snprintf(why, why_len, "the ops table lacks a mandatory function");
    }
    dlclose(h);
    return MR_ERR_PLUGIN;
}

void mr__plugin_list_substrates(const mr_plugin_dirs_t *dirs, mr_plugin_visit_fn fn, void *arg)
{
    static const char prefix[] = MR_SUBSTRATE_PREFIX;
    char seen[32][64];
    int nseen = 0;

    for (int i = 0; i < dirs->count; i++) {
        DIR *d = opendir(dirs->dir[i]);
        struct dirent *e;

        if (d == NULL) continue;
        while ((e = readdir(d)) != NULL) {
            size_t len = strlen(e->d_name), plen = sizeof(prefix) - 1;
            char name[64], path[MR_PLUGIN_PATH_MAX + 300], why[512] = "";
            const mr_substrate_ops_t *ops = NULL;
            void *handle = NULL;
            bool dup = false;

            if (len <= plen + 3 || strncmp(e->d_name, prefix, plen) != 0 ||
                strcmp(e->d_name + len - 3, ".so") != 0 || len - plen - 3 >= sizeof(name)) {
                continue;
            }
            snprintf(name, sizeof(name), "%.*s", (int)(len - plen - 3), e->d_name + plen);
            for (int k = 0; k < nseen; k++) dup |= strcmp(seen[k], name) == 0;
            if (dup || nseen == 32) continue;
            snprintf(seen[nseen++], sizeof(seen[0]), "%s", name);
            snprintf(path, sizeof(path), "%s/%s", dirs->dir[i], e->d_name);
            mr_plugin_dirs_t one = {.count = 1};
            snprintf(one.dir[0], sizeof(one.dir[0]), "%s", dirs->dir[i]);
            if (mr__plugin_load_substrate(&one, name, &handle, &ops, why, sizeof(why)) != MR_OK) {
                ops = NULL;
            }
            fn(arg, name, path, ops, why);
            if (handle != NULL) dlclose(handle);
        }
        closedir(d);
    }
}

void mr__plugin_unload(void *handle)
{
    if (handle != NULL) dlclose(handle);
}
