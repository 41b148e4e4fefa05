#!/bin/sh
# A substrate plugin that cannot load is listed by mailrail_info with the
# reason, and mr_init names it: here a file that is not a shared object, and
# a plugin whose transport library is missing. Then the ops table's header:
# a wrapped plugin with this library's table loads and carries a job, a table
# 8 bytes shorter or longer is refused with both sizes named, as is one that
# names a job-wide setting its settings table lacks. A table without
# preconnect (an optional op, NULL): mr_connect() only synchronizes the ranks,
# says so at debug level, and the job runs (tests/test_connect.c on 2 ranks).
set -eu
info=$1
demo=$2
bootstrap_dir=$3
tcp_plugin=$4
src=$5
mpiexec=$6
test_connect=$7
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "not an ELF file" > "$dir/mailrail_substrate_broken.so"
# A real plugin that needs a library that is not there.
cp "$tcp_plugin" "$dir/mailrail_substrate_orphan.so"
cat > "$dir/needs.c" <<'C'
extern int libmailrail_missing_transport(void);
const void *mr_substrate_get_ops(void) { return (const void *)(long)libmailrail_missing_transport(); }
C
mkdir "$dir/lib"
echo 'int libmailrail_missing_transport(void) { return 0; }' > "$dir/lib/t.c"
cc -shared -fPIC -o "$dir/lib/libmrmissing.so" "$dir/lib/t.c"
cc -shared -fPIC -o "$dir/mailrail_substrate_orphan.so" "$dir/needs.c" -L"$dir/lib" -lmrmissing
rm -r "$dir/lib"

out=$(MAILRAIL_PLUGIN_PATH="$dir:$bootstrap_dir" "$info" -s)
printf '%s\n' "$out"
printf '%s\n' "$out" | grep -q "broken   does not load: .*mailrail_substrate_broken.so"
printf '%s\n' "$out" | grep -q "orphan   does not load: libmrmissing.so"

for name in broken orphan; do
    if out=$(MAILRAIL_PLUGIN_PATH="$dir:$bootstrap_dir" MAILRAIL_SUBSTRATE=$name \
             timeout 60 "$demo" 1 16 2>&1); then
        echo "FAIL: init with substrate $name succeeded"; exit 1
    fi
    printf '%s\n' "$out"
    printf '%s\n' "$out" | grep -q "MAILRAIL_SUBSTRATE=\"$name\" cannot be used"
done

# "size<N>" wraps the TCP plugin, reporting an ops table of N bytes; only
# this library's own size loads (plugins are built with the core).
cat > "$dir/wrap.c" <<'C'
#include "mr_substrate.h"
#include <dlfcn.h>
#include <string.h>
static mr_substrate_ops_t ops;
const mr_substrate_ops_t *mr_substrate_get_ops(void)
{
    void *h = dlopen(TCP_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) return NULL;
    const mr_substrate_ops_t *(*get)(void) =
        (const mr_substrate_ops_t *(*)(void))dlsym(h, "mr_substrate_get_ops");
    memcpy(&ops, get(), sizeof(ops));
    ops.ops_size = OPS_SIZE;
    ops.name = NAME;
#ifdef BAD_JOB_WIDE
    static const char *const job_wide[] = {"MAILRAIL_TCP_NO_SUCH_SETTING", NULL};
    ops.job_wide_settings = job_wide;
#endif
#ifdef NO_PRECONNECT
    ops.preconnect = NULL;
#endif
    return &ops;
}
C
wrap() { # NAME OPS_SIZE [cc flags...]: builds mailrail_substrate_NAME.so
    local name=$1 size=$2
    shift 2
    cc -shared -fPIC -I"$src/core/include" -I"$src/core/plugin" -DTCP_PLUGIN="\"$tcp_plugin\"" \
        -DOPS_SIZE="$size" -DNAME="\"$name\"" "$@" -o "$dir/mailrail_substrate_$name.so" "$dir/wrap.c" -ldl
}
full=$(printf '#include "mr_substrate.h"\n#include <stdio.h>\nint main(void){printf("%%zu", sizeof(mr_substrate_ops_t));}' |
       cc -x c -I"$src/core/include" -I"$src/core/plugin" - -o "$dir/full" && "$dir/full")
wrap same "$full"
out=$(MAILRAIL_PLUGIN_PATH="$dir:$bootstrap_dir" MAILRAIL_SUBSTRATE=same timeout 60 "$demo" 3 64 2>&1) || {
    printf '%s\n' "$out"; echo "FAIL: a wrapped plugin with this library's ops table ($full bytes) did not work"; exit 1; }
printf '%s\n' "$out" | grep -q "all delivered exactly once"
for size in $((full - 8)) $((full + 8)); do
    wrap "size$size" "$size"
    if out=$(MAILRAIL_PLUGIN_PATH="$dir:$bootstrap_dir" MAILRAIL_SUBSTRATE=size$size timeout 60 "$demo" 1 16 2>&1); then
        echo "FAIL: an ops table of $size bytes was accepted"; exit 1
    fi
    printf '%s\n' "$out" | grep -q "ops table of $size bytes, this library needs $full" || {
        printf '%s\n' "$out"; echo "FAIL: an ops table of $size bytes was refused without saying why"; exit 1; }
done
# A job-wide setting the plugin does not declare is refused at load.
wrap badwide "$full" -DBAD_JOB_WIDE
if out=$(MAILRAIL_PLUGIN_PATH="$dir:$bootstrap_dir" MAILRAIL_SUBSTRATE=badwide timeout 60 "$demo" 1 16 2>&1); then
    echo "FAIL: a job-wide setting outside the plugin's table was accepted"; exit 1
fi
printf '%s\n' "$out" | grep -q "job-wide setting MAILRAIL_TCP_NO_SUCH_SETTING is not in its settings table"
# No preconnect: mr_connect() falls back to nothing but the collective.
wrap nopre "$full" -DNO_PRECONNECT
if ! MAILRAIL_PLUGIN_PATH="$dir:$bootstrap_dir" MAILRAIL_SUBSTRATE=nopre MAILRAIL_LOG_LEVEL=debug \
     timeout 60 "$mpiexec" -n 2 "$test_connect" > "$dir/nopre.log" 2>&1; then
    tail -40 "$dir/nopre.log"; echo "FAIL: mr_connect() with an ops table without preconnect"; exit 1
fi
grep -q "substrate cannot connect ahead" "$dir/nopre.log" || {
    tail -40 "$dir/nopre.log"; echo "FAIL: no debug line for the missing preconnect"; exit 1; }
echo "plugin load failures are reported; only an ops table of this library's size ($full bytes) loads; without preconnect mr_connect() only synchronizes"
