#!/bin/sh
# The MoE step (tools/moe/mailrail_moe) on 4 ranks, small sizes:
#  - every contender (alltoallv, none, rank, node, and each policy through
#    handlers) over the substrate in $MAILRAIL_SUBSTRATE, each checked by the
#    tool byte for byte against its serial reference, with tokens that fit a
#    datagram and tokens split over three, and packed by the item layer;
#  - a router's trace (tests/moe/routing.txt), whose placement is known: the
#    hottest rank is the one of experts 0 and 1, spread or on the last host;
#  - bad input: E not a multiple of P, k > E, H = 0, a token of more than 64
#    datagrams, routing lines with a repeated or out-of-range id (the error
#    names the line);
#  - faults injected on purpose (a result dropped, duplicated, a byte flipped):
#    the run fails and names the token, the expert and the rank.
# The last two are the tool's own checks of its input and of its results,
# the same whatever the substrate: they run over MPI only.
#
#   tests/run_moe.sh MPIEXEC MAILRAIL_MOE ROUTING_FILE
set -eu
mpiexec=$1
moe=$2
routing=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export MPIEXEC_TIMEOUT=100
all=alltoallv,none,rank,node,none+h,rank+h,node+h

fail() { cat "$dir/out"; echo "FAIL: $*"; exit 1; }

# Runs the step on 4 ranks; fails on a non-zero exit.
run() {
    timeout -k 5 120 "$mpiexec" -n 4 "$moe" "$@" >"$dir/out" 2>&1 || fail "mailrail_moe $*"
    grep -q "^mailrail_moe: every token's combine matches the serial reference$" "$dir/out" ||
        fail "no verdict: mailrail_moe $*"
}

# Runs the step on 4 ranks; it must fail with status $1 and print $2.
refuse() {
    want_status=$1 want=$2
    shift 2
    status=0
    timeout -k 5 120 "$mpiexec" -n 4 "$moe" "$@" >"$dir/out" 2>&1 || status=$?
    [ "$status" -eq "$want_status" ] || fail "exit status $status, expected $want_status: mailrail_moe $*"
    grep -qF -- "$want" "$dir/out" || fail "no '$want' from: mailrail_moe $*"
}

# Every contender has its summary line.
summaries() {
    for c in $(echo "$1" | tr , ' '); do
        grep -q "^mailrail_moe: $c: median " "$dir/out" || fail "no summary line for $c"
    done
}

# 1. Every contender, tokens that fit one datagram, skewed routing, on 2 virtual hosts.
MAILRAIL_RANKS_PER_NODE=2 run -T 48 -H 1000 -k 4 -E 8 -z 1.0 --hot -t 1 -p "$all" -c "$dir/moe.csv"
summaries "$all"
cat "$dir/out"
# 1b. What each timed step cost: CPU for all; credits went back under rank and
#     node (the two hot ranks consume hundreds of messages per step, and
#     their senders' credits go back piggybacked or returned: 570-1,260 per
#     contender in four runs), and none under none or alltoallv.
head -1 "$dir/moe.csv" | grep -q ",verified,packed,cpu_s,credit_returns,piggybacked_credits,zero_credit_s,deferred_sends$" ||
    fail "the CSV lacks the cost columns: $(head -1 "$dir/moe.csv")"
awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    { c = $col["contender"]; credits = $col["credit_returns"] + $col["piggybacked_credits"]
      if ($col["cpu_s"] <= 0) { print c ": no CPU time"; bad = 1 }
      if (c ~ /^(rank|node)/ && credits == 0) { print c ": no credits went back"; bad = 1 }
      if (c ~ /^(none|alltoallv)/ && (credits != 0 || $col["zero_credit_s"] != 0)) { print c ": credit counters"; bad = 1 } }
    END { exit bad }' "$dir/moe.csv" >"$dir/costs" || fail "costs: $(cat "$dir/costs")"
# 2. Tokens of three datagrams (4 KiB datagrams), uniform routing, no warm-up.
run -T 16 -H 10000 -k 2 -E 4 -z 0 -t 1 --warmup 0 -p "$all"
summaries "$all"

# 2b. Packed by the item layer (--pack): three tokens per 16 KiB datagram, and
#     tokens of two pieces with 4 KiB datagrams.
MAILRAIL_DATAGRAM_SIZE=16K MAILRAIL_RANKS_PER_NODE=2 run -T 48 -H 5000 -k 4 -E 8 -z 1.0 --hot -t 1 --pack -p "$all"
summaries "$all"
run -T 16 -H 5000 -k 2 -E 4 -z 0 -t 1 --pack -p none,rank+h
summaries none,rank+h

# 3. A router's trace: experts 0 and 1 are the most popular, so spread over
#    4 ranks they are on ranks 0 and 1, and rank 0 (expert 0) receives most;
#    with --hot on 2 virtual hosts they are on the last host's ranks 2 and 3.
run -T 6 -H 64 -E 8 -r "$routing" -t 1 -p alltoallv,node,node+h
grep -q "k=2 of E=8 experts" "$dir/out" || fail "k was not read from the file"
grep -q "^mailrail_moe: node: .*hottest rank 0 received" "$dir/out" || fail "expert 0 is not on rank 0"
MAILRAIL_RANKS_PER_NODE=2 run -T 6 -H 64 -E 8 -r "$routing" --hot -t 1 -p alltoallv,rank
grep -q "^mailrail_moe: alltoallv: .*hottest rank 2 received" "$dir/out" || fail "expert 0 is not on rank 2"

if [ "${MAILRAIL_SUBSTRATE:-ucx}" != mpi ]; then
    echo "PASS: mailrail_moe over ${MAILRAIL_SUBSTRATE:-ucx} (bad input and injected faults: over mpi)"
    exit 0
fi

# 4. Bad input: a clear error, status 2.
refuse 2 "-E 10 is not a multiple of the 4 ranks" -T 4 -E 10
refuse 2 "-k 9 exceeds -E 8" -T 4 -k 9 -E 8
refuse 2 "-H takes a size of at least 1 byte" -T 4 -H 0
printf '0 1\n2 2\n' >"$dir/repeated"
refuse 2 "$dir/repeated:2: expert 2 appears twice" -T 4 -E 8 -r "$dir/repeated"
printf '# header\n0 1\n\n3 8\n' >"$dir/range"
refuse 2 "$dir/range:4: expert 8 is out of range" -T 4 -E 8 -r "$dir/range"
# A token of more than 64 datagrams: the error says which datagram size would do.
refuse 1 "set it to at least 4712" -T 2 -H 300000 -k 2 -E 4 -t 1 -p node
printf '0 1\n2 3 4\n' >"$dir/count"
refuse 2 "$dir/count:2: 3 experts, expected 2" -T 4 -E 8 -r "$dir/count"

# 5. The checks fail when the step is wrong, and name the pair.
for p in alltoallv node node+h; do
    refuse 1 "rank 0: token 0, expert" -T 8 -H 100 -k 2 -E 8 -t 1 -p $p --inject duplicate
    grep -q "arrived twice" "$dir/out" || fail "$p: the duplicate was not named"
    refuse 1 "rank 0: token 0 (experts" -T 8 -H 100 -k 2 -E 8 -t 1 -p $p --inject flip
    grep -q "of the combine is" "$dir/out" || fail "$p: the flipped byte was not named"
done
refuse 1 "rank 0: token 0 (experts" -T 8 -H 100 -k 2 -E 8 -t 1 -p node+h --pack --inject flip
refuse 1 "arrived twice" -T 8 -H 100 -k 2 -E 8 -t 1 -p rank --pack --inject duplicate
refuse 1 "rank 0: token 0, expert" -T 8 -H 100 -k 2 -E 8 -t 1 -p alltoallv --inject drop
grep -q "the result is missing" "$dir/out" || fail "the dropped result was not named"
refuse 1 "no result after 3 s" -T 8 -H 100 -k 2 -E 8 -t 1 -p rank --inject drop --timeout 3
echo "PASS: mailrail_moe over ${MAILRAIL_SUBSTRATE:-ucx}"
