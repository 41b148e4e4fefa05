#!/bin/sh
# tools/perf_compare.sh must fail loudly: a contender whose run fails (here a
# policy that does not exist) is named on stderr, left out of the ratios, and
# the script exits 1, while the runs that worked still give their ratios.
#
#   tests/run_perf_compare_fails.sh SOURCE_DIR BUILD_DIR
set -u
src=$1
build=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$src/tools/perf_compare.sh" -b "$build" -s 8 -n 500 -r 1 -p none,bogus -S mpi -o "$dir/out" \
    >"$dir/stdout" 2>"$dir/stderr"
status=$?
fail() { echo "FAIL: $1"; cat "$dir/stdout" "$dir/stderr"; exit 1; }
[ "$status" -eq 1 ] || fail "perf_compare exited with $status, not 1"
grep -q "FAILED: mpi 8 B round 1: bogus: exit status" "$dir/stderr" || fail "the failed run is not named"
grep -q "1 runs failed and are left out of the ratios" "$dir/stderr" || fail "no closing count"
grep -q '^mpi,bogus' "$dir/out/perf.csv" && fail "the failed run has a row in perf.csv"
awk -F, '$1 == "mpi" && $2 == "none" && $7 > 0 { ok = 1 } END { exit !ok }' "$dir/out/perf.csv" ||
    fail "the run that worked has no ratio"
echo "perf_compare named the failed run and exited 1; the good run kept its ratio"
