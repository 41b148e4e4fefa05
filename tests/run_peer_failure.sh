#!/bin/sh
# Runs the peer-failure test on 3 ranks, one of which kills itself. mpiexec
# then exits non-zero whatever the survivors did, so the verdict is their
# "survivor <rank>: ok" lines.
set -u
mpiexec=$1
test=$2
out=$(MPIEXEC_TIMEOUT=60 timeout -k 5 90 "$mpiexec" -disable-auto-cleanup -n 3 "$test" 2>&1)
printf '%s\n' "$out"
for r in 0 2; do
    if ! printf '%s\n' "$out" | grep -q "^survivor $r: ok$"; then
        echo "FAIL: survivor rank $r did not pass" >&2
        exit 1
    fi
done
echo "both survivors saw the failure and finished"
