#!/bin/sh
# The C++ face (core/include/mailrail.hpp) on one substrate: its checks
# (tools/cxx/test_cxx.cpp), a wrong handler order and count, handlers that
# send under backpressure, the C++ histogram
# and the C++ degree count, each on 2, 3 or 4 ranks (the three programs take
# the three sizes in turn, shifted by the substrate) and each result checked
# against a serial reference. Every run is bounded by a timeout.
#
#   tests/run_cxx.sh SUBSTRATE MPIEXEC TOOLS_CXX_DIR
set -eu
substrate=$1
mpiexec=$2
bin=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
case $substrate in
    ucx) shift_by=0 ;;
    mpi) shift_by=1 ;;
    tcp) shift_by=2 ;;
    *) echo "run_cxx.sh: unknown substrate $substrate" >&2; exit 2 ;;
esac
ranks() { echo $(( 2 + ($1 + shift_by) % 3 )); }
export MAILRAIL_SUBSTRATE="$substrate" MPIEXEC_TIMEOUT=60
run() { # NAME RANKS PROGRAM ARGS...: output in $dir/NAME
    name=$1 n=$2
    shift 2
    start=$(date +%s.%N)
    if ! timeout -k 5 75 "$mpiexec" -n "$n" "$@" > "$dir/$name" 2>&1; then
        cat "$dir/$name"
        echo "FAIL: $name on $n ranks over $substrate"
        return 1
    fi
    echo "$name: $n ranks over $substrate, $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
}

n=$(ranks 0)
run checks "$n" "$bin/test_cxx"
[ "$(grep -c '^test_cxx: rank [0-9]*: all checks passed$' "$dir/checks")" -eq "$n" ] ||
    { cat "$dir/checks"; echo "FAIL: not every rank passed the checks"; exit 1; }

# A wrong order (rank 1 swaps two handlers) and a wrong count (rank 0 has
# one more): every rank must refuse with the same line, naming the lowest rank
# that saw its neighbour differ.
run swap 3 "$bin/test_cxx" -swap
want='rank 1 (3 handlers) and rank 0 (3) registered their handlers in another order or with other types; register the same ones in the same order on every rank: invalid parameter'
[ "$(grep -cxF -e "test_cxx: rank 0: mailrail::session::check_handlers: $want" \
    -e "test_cxx: rank 1: mailrail::session::check_handlers: $want" \
    -e "test_cxx: rank 2: mailrail::session::check_handlers: $want" "$dir/swap")" -eq 3 ] ||
    { cat "$dir/swap"; echo "FAIL: the swapped order was not refused on every rank"; exit 1; }
run extra 3 "$bin/test_cxx" -extra
want='rank 0 (4 handlers) and rank 2 (3) registered different handlers; register the same ones in the same order on every rank: invalid parameter'
[ "$(grep -cxF -e "test_cxx: rank 0: mailrail::session::check_handlers: $want" \
    -e "test_cxx: rank 1: mailrail::session::check_handlers: $want" \
    -e "test_cxx: rank 2: mailrail::session::check_handlers: $want" "$dir/extra")" -eq 3 ] ||
    { cat "$dir/extra"; echo "FAIL: the extra handler was not refused on every rank"; exit 1; }

# Handlers that forward with try_async() and return handled::again under
# backpressure (2 send buffers): every relay must arrive once, 4 ranks on.
MAILRAIL_SEND_SLOTS=2 run relay 3 "$bin/test_cxx" -relay
if [ "$(grep -c '^test_cxx: rank [0-9]*: 300 relays arrived, [0-9]* handler retries$' "$dir/relay")" -ne 3 ] ||
    [ "$(grep -c '^test_cxx: rank [0-9]*: all checks passed$' "$dir/relay")" -ne 3 ]; then
    cat "$dir/relay"; echo "FAIL: relays"; exit 1
fi
grep 'relays arrived' "$dir/relay"

# The histogram: every bin of every trial against the serial count.
n=$(ranks 1)
run histogram "$n" "$bin/mailrail_histogram_cxx" -s 14 -i 50000 -t 1
grep "^mailrail_histogram_cxx: $n ranks over $substrate, .*every bin agrees with the serial count$" \
    "$dir/histogram" || { cat "$dir/histogram"; echo "FAIL: histogram"; exit 1; }

# The degree count: every vertex against the serial count, and the degrees
# add up to twice the edges.
n=$(ranks 2)
run degree "$n" "$bin/mailrail_degree_cxx" -v 1000 -e 10000
cat "$dir/degree"
awk -v n="$n" '/^rank [0-9]+: [0-9]+ degrees summed, [0-9]+ handler calls, 0 vertices differ/ {
        sum += $3; ranks++ }
     END { if (ranks != n || sum != 2 * 10000 * n) { print "FAIL: degrees", ranks, sum; exit 1 } }' \
    "$dir/degree"
echo "the C++ face passed over $substrate"
