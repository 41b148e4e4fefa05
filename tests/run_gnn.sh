#!/bin/sh
# The GNN aggregation layer (tools/graph/mailrail_gnn.c) on 4 ranks, every
# contender checked bit for bit against the serial reference by the tool:
#  - a small R-MAT graph over every substrate (ucx, mpi, tcp), with every kind
#    of contender: MPI_Alltoallv, MailRail's datagrams under each policy, and
#    its handlers; the CSV rows;
#  - small datagrams and few slots, with idle ranks sleeping (-w), so that
#    mr_reserve() pushes back inside the handlers and the receive loops;
#  - Debian's package graph (a sample in tests/graph/) and the hand-made graph
#    of tests/graph/known.el, whose sizes and hubs are known; -P's counters;
#  - bad input: every run must fail with status 2, name what is wrong, and
#    not hang.
#
#   tests/run_gnn.sh MPIEXEC MAILRAIL_GNN DEBIAN_SAMPLE KNOWN_GRAPH
set -eu
mpiexec=$1
gnn=$2
debian=$3
known=$4
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export MPIEXEC_TIMEOUT=100
export MAILRAIL_LOG_LEVEL=error
all=alltoallv,none,rank,node,none+h,node+h

# Runs the tool on NP ranks; prints its output, and fails on a non-zero exit.
run() {
    np=$1
    shift
    timeout -k 5 120 "$mpiexec" -n "$np" "$gnn" "$@" > "$dir/out" 2>&1 || {
        cat "$dir/out"; echo "FAIL: mailrail_gnn $*"; exit 1; }
    cat "$dir/out"
}

# Fails unless the last run checked every vector and summed up each contender of $1.
expect_summaries() {
    grep -qx "mailrail_gnn: every aggregated vector matches the serial reference" "$dir/out" || {
        echo "FAIL: no 'matches the serial reference' line"; exit 1; }
    for name in $(echo "$1" | tr , ' '); do
        grep -qE "^mailrail_gnn: $(echo "$name" | sed 's/+/\\+/'): median [0-9.]+ s per layer \(min [0-9.]+, max [0-9.]+ over [0-9]+ trials\), [0-9]+ edges/s, hottest rank [0-9]+ received [0-9.]+ MiB" "$dir/out" || {
            echo "FAIL: no summary line for $name"; exit 1; }
    done
}

# Fails unless the last run's output has the fixed string $1.
expect_line() {
    grep -qF -- "$1" "$dir/out" || { echo "FAIL: expected '$1'"; exit 1; }
}

for substrate in ucx mpi tcp; do
    echo "--- $substrate"
    MAILRAIL_SUBSTRATE=$substrate run 4 -r 10 -e 8 -F 16 -t 1 -p "$all" -c "$dir/gnn.csv"
    expect_summaries "$all"
    expect_line "of alltoallv"
done
# One header, then a verified row per substrate and contender, without -P.
test "$(head -1 "$dir/gnn.csv")" = "contender,trial,ranks,nodes,vertices,edges,features,seconds,hottest_rank,hottest_mib,port_bytes,port_packets,port_drops,verified"
test "$(wc -l < "$dir/gnn.csv")" -eq 19
awk -F, 'NR > 1 && !($3 == 4 && $7 == 16 && $11 == -1 && $14 == 1) { bad = 1 } END { exit bad }' \
    "$dir/gnn.csv" || { cat "$dir/gnn.csv"; echo "FAIL: CSV rows"; exit 1; }

echo "--- small datagrams, few slots, -w"
MAILRAIL_SUBSTRATE=ucx MAILRAIL_DATAGRAM_SIZE=256 MAILRAIL_RECV_SLOTS=16 MAILRAIL_SEND_SLOTS=8 \
    run 4 -r 9 -e 8 -F 16 -t 1 -w -p "$all,rank+h" -q
expect_summaries "$all,rank+h"

echo "--- Debian's package graph"
# -P's command counts 1000 bytes and 3 packets more at every call.
probe="n=\$(cat '$dir/port' 2>/dev/null || echo 0); n=\$((n + 1000)); echo \$n > '$dir/port'; echo \$n \$((n / 1000 * 3)) 0"
MAILRAIL_SUBSTRATE=tcp run 4 -f "$debian" -F 16 -t 2 -p alltoallv,none,node,node+h \
    -P "$probe" -c "$dir/debian.csv"
expect_summaries alltoallv,none,node,node+h
expect_line ": 737 vertices, 1200 edges, max degree 147 (vertex 4); 16 features (64 B per vector)"
awk -F, 'NR > 1 && !($5 == 737 && $6 == 1200 && $11 == 1000 && $12 == 3 && $13 == 0) { bad = 1 }
         END { exit bad || NR != 9 }' "$dir/debian.csv" || {
    cat "$dir/debian.csv"; echo "FAIL: -P's counters in the CSV"; exit 1; }

MAILRAIL_SUBSTRATE=tcp run 3 -f "$known" -F 3 -t 1 -p none,alltoallv,rank+h
expect_summaries none,alltoallv,rank+h
expect_line ": 14 vertices, 15 edges, max degree 3 (vertex 1); 3 features"

# One rank: no halo, nothing to send.
MAILRAIL_SUBSTRATE=tcp run 1 -r 6 -F 4 -t 1 -p none,node+h -q
expect_summaries none,node+h

echo "--- bad input"
# Runs the tool expecting status 2 and the fixed string $2 in its output, $3 times at least.
refused() {
    args=$1
    # shellcheck disable=SC2086
    if timeout -k 5 60 "$mpiexec" -n 3 "$gnn" $args > "$dir/out" 2>&1; then
        cat "$dir/out"; echo "FAIL: mailrail_gnn $args was accepted"; exit 1
    else
        status=$?
    fi
    cat "$dir/out"
    test "$status" -eq 2 || { echo "FAIL: mailrail_gnn $args exited with $status, not 2"; exit 1; }
    test "$(grep -cF -- "$2" "$dir/out")" -ge "${3:-1}" || {
        echo "FAIL: mailrail_gnn $args did not say '$2'"; exit 1; }
}
export MAILRAIL_SUBSTRATE=tcp
refused "-r 8 -F 0" "mailrail_gnn: -F 0: the number of features must be an integer from 1 to 1048576"
awk 'BEGIN { for (i = 0; i < 300; i++) print i, i + 1; print "7 x"; print "1 2" }' > "$dir/bad.el"
refused "-f $dir/bad.el" "$dir/bad.el:301: 'x' is not a vertex id" 3
for rank in 0 1 2; do expect_line "mailrail_gnn: rank $rank: $dir/bad.el:301: 'x' is not"; done
refused "-f $dir/missing.el" "missing.el: cannot open" 3
refused "-r 8 -F 2000" "-F 2000: a vector of 8000 bytes"
refused "-r 8 -p alltoallv,fast" "-p alltoallv,fast: a contender is"
refused "-r 8 -f $known" "give either -r SCALE or -f FILE"
refused "-r 8 -c $dir/no/such/dir/gnn.csv" "cannot open for appending"
echo "gnn checks passed"
