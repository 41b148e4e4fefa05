#!/bin/sh
# Generates YGM traces in both layouts, replays them on 4 ranks under every
# flow-control policy (the replayer checks that every event and byte arrived),
# then checks that a truncated trace is refused on every rank with the file
# and the offset, and that nothing hangs.
set -eu
mpiexec=$1
replay=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for layout in old new; do
    "$replay" -g "$dir/$layout" -R 4 -L "$layout" -e 800 -E 3 -z 20000
    MAILRAIL_DATAGRAM_SIZE=8K MPIEXEC_TIMEOUT=100 timeout -k 5 120 \
        "$mpiexec" -n 4 "$replay" -d "$dir/$layout" -p none,rank,node > "$dir/out" 2>&1 || {
        cat "$dir/out"; exit 1; }
    cat "$dir/out"
    grep -q "every event and byte arrived" "$dir/out"
    # 3 epochs x 800 events x 4 ranks in every row.
    test "$(awk '$1 ~ /^(none|rank|node)$/ && $4 == 9600' "$dir/out" | wc -l)" -eq 3
done
head -c 107 "$dir/new/trace_2.bin" > "$dir/cut"
mv "$dir/cut" "$dir/new/trace_2.bin"
if MPIEXEC_TIMEOUT=60 timeout -k 5 90 "$mpiexec" -n 4 "$replay" -d "$dir/new" > "$dir/out" 2>&1; then
    echo "FAIL: a truncated trace was replayed"; exit 1
fi
cat "$dir/out"
grep -q "trace_2.bin: truncated record at offset 100" "$dir/out"
grep -q "nothing replayed" "$dir/out"
echo "replay checks passed"
