#!/bin/sh
# Replays the real YGM traces of tests/ygm/ (recorded by YGM's own tracer,
# README.md there) on 2 ranks under every flow-control policy, over the
# substrate in MAILRAIL_SUBSTRATE: communication records only, then with
# YGM's MPI records. The replayer checks that every async event and every
# byte arrived exactly where the trace sent it; this checks the totals
# against what YGM reported when it ran: 335,736 async events (of
# 9,283,514 bytes) in 11 barriers' epochs.
#
#   tests/run_replay_ygm.sh MPIEXEC MAILRAIL_REPLAY TARBALL
set -eu
mpiexec=$1
replay=$2
tarball=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
tar -xJf "$tarball" -C "$dir"
for set in n2_comm n2_both; do
    MAILRAIL_DATAGRAM_SIZE=8K MPIEXEC_TIMEOUT=100 timeout -k 5 120 \
        "$mpiexec" -n 2 "$replay" -d "$dir/traces/$set" -p none,rank,node > "$dir/out" 2>&1 || {
        cat "$dir/out"; echo "FAIL: replay of $set"; exit 1; }
    cat "$dir/out"
    grep -q "335736 async events in 11 epoch(s)" "$dir/out"
    grep -q "every event and byte arrived" "$dir/out"
    # policy trial seconds events datagrams bytes events/s: every policy, exact.
    test "$(awk '$1 ~ /^(none|rank|node)$/ && $4 == 335736 && $6 == 9283514' "$dir/out" | wc -l)" -eq 3 || {
        echo "FAIL: $set: not every policy replayed 335,736 events and 9,283,514 bytes"; exit 1; }
done
echo "real YGM traces replayed exactly over ${MAILRAIL_SUBSTRATE:-ucx}"
