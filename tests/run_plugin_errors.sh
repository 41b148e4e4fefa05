#!/bin/sh
# A substrate plugin that cannot load is listed by mailrail_info with the
# reason, and mr_init names it: here a file that is not a shared object, and
# a plugin whose transport library is missing.
set -eu
info=$1
demo=$2
bootstrap_dir=$3
tcp_plugin=$4
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
echo "plugin load failures are reported"
