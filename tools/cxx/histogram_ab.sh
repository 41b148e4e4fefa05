#!/bin/sh
# The C++ histogram (mailrail_histogram_cxx, through mailrail.hpp) against the
# C one (mailrail_histogram) with the same arguments, interleaved: C, C++, C,
# C++ ... ROUNDS times, so that a shared machine's drift falls on both alike.
# Each run draws the same keys (same generator and seeds) and checks every bin
# itself. Prints each round's inserts/s and C++/C ratio, then the median ratio.
#
#   tools/cxx/histogram_ab.sh BUILD_DIR RANKS ROUNDS [histogram options: -s -i -t -S]
#   e.g. tools/cxx/histogram_ab.sh build 2 5 -s 16 -i 200000 -t 3
set -eu
build=$1 ranks=$2 rounds=$3
shift 3
c_bin=$build/tools/mailrail_histogram
cxx_bin=$build/tools/cxx/mailrail_histogram_cxx
for b in "$c_bin" "$cxx_bin"; do
    [ -x "$b" ] || { echo "histogram_ab.sh: $b is not built" >&2; exit 2; }
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
rate() { # BINARY OPTIONS...: the median inserts/s it reports
    bin=$1
    shift
    MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-300} mpiexec -n "$ranks" "$bin" "$@" > "$out" 2>&1 ||
        { cat "$out" >&2; echo "histogram_ab.sh: $bin failed" >&2; exit 1; }
    sed -n 's/.*median [0-9.]* s, \([0-9]*\) inserts\/s.*/\1/p' "$out" | head -1
}
echo "# round  C inserts/s  C++ inserts/s  C++/C   ($ranks ranks, ${MAILRAIL_SUBSTRATE:-default substrate}, $*)"
ratios=""
r=1
while [ "$r" -le "$rounds" ]; do
    c=$(rate "$c_bin" "$@")
    cxx=$(rate "$cxx_bin" "$@")
    ratio=$(awk -v a="$cxx" -v b="$c" 'BEGIN { printf "%.3f", a / b }')
    printf '  %5d %12s %14s  %s\n' "$r" "$c" "$cxx" "$ratio"
    ratios="$ratios $ratio"
    r=$((r + 1))
done
echo "$ratios" | tr ' ' '\n' | sed '/^$/d' | sort -n |
    awk '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
                             printf "median C++/C inserts/s over %d rounds: %.3f\n", NR, m }'
