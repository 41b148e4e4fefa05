#!/bin/sh
# tools/perf_instructions.sh, small: MailRail's instructions per message over
# TCP under none, with mr_send and through handlers, from the callgrind dumps
# of mailrail_perf -I. Every row must be there, with a positive count of
# MailRail's own instructions below a sanity bound, on both sides.
#
#   tests/run_perf_instructions.sh SOURCE_DIR BUILD_DIR
set -u
src=$1
build=$2
. "$src/tests/skip.sh"
command -v valgrind >/dev/null || skip "valgrind is missing"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
if ! "$src/tools/perf_instructions.sh" -b "$build" -s 8,512 -n 400 -S tcp -p none,none+h \
        -o "$dir/out" >"$dir/stdout" 2>&1; then
    cat "$dir/stdout"
    echo "FAIL: perf_instructions.sh failed"
    exit 1
fi
cat "$dir/stdout"
awk -F, 'NR > 1 { rows++; if ($6 <= 0 || $6 > 100000 || $8 <= 0) bad = bad " " $0 }
    END { if (rows != 8 || bad != "") { print "FAIL: rows " rows ":" bad; exit 1 } }' \
    "$dir/out/instructions.csv" || exit 1
echo "instructions per message counted for 2 sizes x 2 modes x 2 sides"
