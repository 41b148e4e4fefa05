#!/bin/sh
# A stalled rank (tests/test_stall.c): rank 2 of 3 stopped with SIGSTOP for
# 8 s, longer than MAILRAIL_TIMEOUT=3, then resumed. Both senders must name
# it failed within the timeout plus 3 s of the stop, and then exchange 10
# messages each way; the stalled rank must finish and say what it saw.
#
# With `others BYTES` (test_stall.c), the senders stop sending to rank 2 once
# it is stopped and go on with each other; each must still name it.
#
#   tests/run_stall.sh MPIEXEC TEST_STALL [others BYTES]
set -u
mpiexec=$1
prog=$2
shift 2
timeout_s=3 stall_s=8 bound=6
dir=$(mktemp -d /tmp/run_stall.XXXXXX)
trap 'rm -rf "$dir"' EXIT
out=$(MR_STALL_DIR=$dir MAILRAIL_TIMEOUT=$timeout_s MPIEXEC_TIMEOUT=60 timeout -k 5 90 \
      "$mpiexec" -disable-auto-cleanup -n 3 "$prog" "$stall_s" "$@" 2>&1)
rc=$?
printf '%s\n' "$out"
echo "mpiexec exited with $rc"
status=0
for r in 0 1; do
    line=$(printf '%s\n' "$out" | grep "^sender $r: rank 2 failed after ")
    secs=$(printf '%s\n' "$line" | sed -n 's/.* after \([-0-9.]*\) s .*/\1/p')
    if [ -z "$secs" ] || ! awk -v s="$secs" -v b="$bound" 'BEGIN { exit !(s >= 0 && s <= b) }'; then
        echo "FAIL: sender $r did not name rank 2 failed within $bound s of its stop: '${line:-no line}'"
        status=1
    fi
    printf '%s\n' "$out" | grep -q "^sender $r: ok$" ||
        { echo "FAIL: sender $r did not carry on after the failure"; status=1; }
done
printf '%s\n' "$out" | grep -q "^stalled 2: resumed after " ||
    { echo "FAIL: the stalled rank did not finish"; status=1; }
[ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && { echo "FAIL: mpiexec timed out"; status=1; }
[ "$status" -eq 0 ] && echo "ok: rank 2 stalled for $stall_s s was named failed (MAILRAIL_TIMEOUT=$timeout_s) and the others carried on"
exit $status
