#!/bin/sh
# Generates YGM traces in both layouts, replays them on 4 ranks under every
# flow-control policy (the replayer checks that every event and byte arrived),
# then traces as YGM's tracer writes them with YGM_MPI_TRACE=1 (send
# completions as second mpi_send records naming a request id, messages sent
# inside barriers, the last one included, on even ranks), whose every event and
# byte must be replayed exactly once, then checks that a truncated trace is
# refused on every rank with the file and the offset, and that nothing hangs.
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
# YGM's own layout with send completions: -C prints the async events and bytes
# it wrote; every policy must replay exactly those, in 3 epochs plus the final
# one that the messages sent inside the last barrier make on every rank.
"$replay" -g "$dir/ygm" -R 4 -L old -C -e 800 -E 3 -z 20000 > "$dir/gen"
cat "$dir/gen"
events=$(sed -n 's/.*: \([0-9]*\) async events, \([0-9]*\) bytes$/\1/p' "$dir/gen")
bytes=$(sed -n 's/.*: \([0-9]*\) async events, \([0-9]*\) bytes$/\2/p' "$dir/gen")
test "$events" -eq 9612 # 9600, and 2 in each of 3 barriers on ranks 0 and 2.
for layout in auto old; do
    MAILRAIL_DATAGRAM_SIZE=8K MPIEXEC_TIMEOUT=100 timeout -k 5 120 \
        "$mpiexec" -n 4 "$replay" -d "$dir/ygm" -L "$layout" -p none,rank,node > "$dir/out" 2>&1 || {
        cat "$dir/out"; exit 1; }
    cat "$dir/out"
    grep -q "every event and byte arrived" "$dir/out"
    grep -q "$events async events in 4 epoch(s)" "$dir/out"
    test "$(awk -v e="$events" -v b="$bytes" '$1 ~ /^(none|rank|node)$/ && $4 == e && $6 == b' \
        "$dir/out" | wc -l)" -eq 3
done
# The newer layout does not read them, and says where.
if MPIEXEC_TIMEOUT=60 timeout -k 5 90 "$mpiexec" -n 4 "$replay" -d "$dir/ygm" -L new > "$dir/out" 2>&1; then
    echo "FAIL: an older-layout trace was read as the newer layout"; exit 1
fi
grep -q "trace_0.bin: .* at offset [0-9]" "$dir/out"
head -c 107 "$dir/new/trace_2.bin" > "$dir/cut"
mv "$dir/cut" "$dir/new/trace_2.bin"
if MPIEXEC_TIMEOUT=60 timeout -k 5 90 "$mpiexec" -n 4 "$replay" -d "$dir/new" > "$dir/out" 2>&1; then
    echo "FAIL: a truncated trace was replayed"; exit 1
fi
cat "$dir/out"
grep -q "trace_2.bin: truncated record at offset 100" "$dir/out"
grep -q "nothing replayed" "$dir/out"
echo "replay checks passed"
