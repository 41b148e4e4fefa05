#!/bin/sh
# The graph kernel on several ranks under every flow-control policy, in one
# MailRail session (messages of the next phase reach ranks still finishing
# the previous one) and with a session per phase (-P):
#  - a hand-made graph whose answers are known (tests/graph/known.el), checked
#    value by value and against the serial reference;
#  - a small R-MAT graph against the serial reference, then written in the
#    binary form and read back to the same result: a fresh seed each run,
#    printed (MR_TEST_SEED=SEED repeats it), the same for every run of the test;
#  - malformed edge lists: every rank names the file and the line, the run
#    fails, and nothing hangs.
#
#   tests/run_graph.sh MPIEXEC MAILRAIL_GRAPH KNOWN_GRAPH
set -eu
mpiexec=$1
graph=$2
known=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export MPIEXEC_TIMEOUT=100
seed=${MR_TEST_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
echo "run_graph.sh: seed $seed (MR_TEST_SEED=$seed repeats this test)"

# Runs the kernel; prints and fails on a non-zero exit.
run() {
    np=$1
    shift
    timeout -k 5 120 "$mpiexec" -n "$np" "$graph" "$@" > "$dir/out" 2>&1 || {
        cat "$dir/out"; echo "FAIL: mailrail_graph $* (seed $seed)"; exit 1; }
    cat "$dir/out"
}

# Prints the value of `key=` in the result line of the last run.
value() {
    sed -n "s/^mailrail_graph: result:.*[ :]$1=\([0-9a-f]*\).*/\1/p" "$dir/out"
}

expect() {
    got=$(value "$1")
    if [ "$got" != "$2" ]; then
        echo "FAIL: $1 is '$got', expected $2 (seed $seed)"
        exit 1
    fi
}

run 3 -f "$known" -V -p none,rank,node
expect vertices 14
expect edges 15
expect triangles 5
expect max_degree 3
expect hub 1
expect edges_read 17
expect self_loops 1
expect duplicates 1
grep -q "the serial reference agrees" "$dir/out"
# One row per policy and phase.
test "$(grep -cE '^  (none|rank|node) +0 (degree|orient|triangle) ' "$dir/out")" -eq 9

# One rank: every record is handled locally, and the answers are the same.
run 1 -f "$known" -V -q
expect triangles 5
expect edges 15

# Small datagrams: many messages per phase, deferred sends and credit returns.
MAILRAIL_DATAGRAM_SIZE=256 MAILRAIL_RECV_SLOTS=16 MAILRAIL_SEND_SLOTS=8 \
    run 4 -r 9 -e 8 -S "$seed" -V -p none,rank,node -c "$dir/graph.csv"
grep -q "the serial reference agrees" "$dir/out"
triangles=$(value triangles)
checksum=$(value checksum)
test "$triangles" -gt 0
# 1 header + 3 policies x 3 phases, and credits were returned under rank.
test "$(wc -l < "$dir/graph.csv")" -eq 10
awk -F, '$1 == "rank" && $3 == "degree" { exit !($12 > 0) }' "$dir/graph.csv"

# A session per phase (-P) gives the same result.
run 3 -r 9 -e 8 -S "$seed" -P -p rank -q
expect triangles "$triangles"
expect checksum "$checksum"

run 2 -r 9 -e 8 -S "$seed" -o "$dir/rmat.bin"
test "$(stat -c %s "$dir/rmat.bin")" -eq $((16 + 16 * 4096))
run 3 -f "$dir/rmat.bin" -q
expect triangles "$triangles"
expect checksum "$checksum"

# Malformed lists: the bad line sits in the last rank's slice, so its number
# must be counted across slices; every rank must report it.
for bad in "7 x|'x' is not a vertex id" "42|one column" "-3 4|negative vertex id '-3'" \
           "5 18446744073709551616|vertex id '18446744073709551616' is larger than 9223372036854775807"; do
    line=${bad%%|*}
    reason=${bad#*|}
    awk 'BEGIN { print "# malformed"; for (i = 0; i < 300; i++) print i, i + 1 }' > "$dir/bad.el"
    echo "$line" >> "$dir/bad.el"
    echo "1 2" >> "$dir/bad.el"
    if timeout -k 5 60 "$mpiexec" -n 3 "$graph" -f "$dir/bad.el" > "$dir/out" 2>&1; then
        cat "$dir/out"; echo "FAIL: a malformed edge list was accepted"; exit 1
    fi
    cat "$dir/out"
    for rank in 0 1 2; do
        grep -qF "mailrail_graph: rank $rank: $dir/bad.el:302: $reason" "$dir/out" || {
            echo "FAIL: rank $rank did not name line 302 ($reason)"; exit 1; }
    done
done
# A conversion that cannot write fails on every rank and leaves no file.
if timeout -k 5 60 "$mpiexec" -n 2 "$graph" -f "$known" -o "$dir/no/such/dir/g.bin" > "$dir/out" 2>&1; then
    cat "$dir/out"; echo "FAIL: writing into a missing directory succeeded"; exit 1
fi
cat "$dir/out"
test ! -e "$dir/no"
# Bad options are refused before anything runs.
for bad in "-r 3x" "-r 10 -t 0" "-r 10 -p fast" "-r 10 -S junk" "-r 41" "-f $known -r 5"; do
    # shellcheck disable=SC2086
    if timeout -k 5 60 "$mpiexec" -n 2 "$graph" $bad > "$dir/out" 2>&1; then
        echo "FAIL: mailrail_graph $bad was accepted"; exit 1
    fi
    grep -q "^usage: " "$dir/out"
done
if timeout -k 5 60 "$mpiexec" -n 2 "$graph" -f "$dir/missing.el" > "$dir/out" 2>&1; then
    echo "FAIL: a missing file was accepted"; exit 1
fi
test "$(grep -c "missing.el: cannot open" "$dir/out")" -eq 2
echo "graph checks passed"
