#!/usr/bin/env bash
# The CI subset of the incast regime matrix (tools/fabric/incast_matrix.sh
# --quick, its 256:1 cell only: the regime of issue 42, and the 64:1 cell's 30 s
# kept CI under 20 minutes): 256:1 on the emulated fabric, mr_wait(100), a CPU
# share per host, the TCP substrate, one trial of none and node. Fails when a
# cell did not complete or node's goodput is below none's in one (the script's
# exit status), or when its CSVs lack the columns the matrix reports (the CPU
# cost, and the phases outside the clock).
#
#   run_incast_matrix.sh INCAST_MATRIX_SH BUILD_DIR
#
# Exits 77 (skipped) without root, ip, tc, ethtool, unshare or gnuplot; fails
# instead when MR_TEST_STRICT=1 (-Dstrict_tests, CI).
set -u
# shellcheck source=skip.sh
. "$(dirname "$0")/skip.sh"
[ $# -eq 2 ] || { echo "usage: $0 INCAST_MATRIX_SH BUILD_DIR" >&2; exit 2; }
matrix=$1 build=$2
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, tc)"
for t in ip tc ethtool unshare gnuplot; do
    command -v "$t" >/dev/null 2>&1 ||
        skip "'$t' is missing (Debian packages: iproute2 ethtool util-linux gnuplot-nox)"
done
unshare --net true 2>/dev/null || skip "network namespaces cannot be created here"
out=$(mktemp -d /tmp/run_incast_matrix.XXXXXX)
pid=
# Stopped (meson's timeout): the script is stopped, and its fabric tears down.
trap 'rm -rf "$out"' EXIT
trap '[ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; exit 1' INT TERM

status=0
"$matrix" --quick --cells 256:w100:host:tcp -o "$out" --build "$build" &
pid=$!
wait "$pid" || status=1
pid=
head -1 "$out/matrix_quick.csv" | grep -q "^ratio,wait,cpu,substrate,policy,trial,seconds,goodput_mbps,line_fraction,cpu_s_per_mib,port_drops,credit_returns," ||
    { echo "FAIL: matrix_quick.csv lacks the matrix's columns"; status=1; }
# A row of none and of node in the cell, each with its CPU cost measured.
rows=$(awk -F, 'NR > 1 && $10 > 0 && ($5 == "none" || $5 == "node") { k[$1 "," $5] = 1 }
                END { print length(k) }' "$out/matrix_quick.csv" 2>/dev/null)
[ "${rows:-0}" -eq 2 ] || { echo "FAIL: $rows (cell, policy) pairs with cpu_s_per_mib > 0, expected 2"; status=1; }
# And what each trial cost outside its clock: mr_init() and mr_finalize() take time.
rows=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
                ("init_s" in col) && $col["init_s"] > 0 && $col["finalize_s"] > 0 &&
                $col["connect_s"] != "" { k[$5] = 1 }
                END { print length(k) }' "$out/matrix_quick.csv" 2>/dev/null)
[ "${rows:-0}" -eq 2 ] || { echo "FAIL: $rows policies with init_s and finalize_s > 0, expected 2"; status=1; }
[ -s "$out/matrix_quick.png" ] || { echo "FAIL: no figure"; status=1; }
exit $status
