#!/bin/sh
# The TCP substrate and the descriptor limit: with a low soft limit it raises
# the limit itself and the job runs; with a low hard limit it refuses to start
# on every rank, with a message that says what to raise, and nothing hangs.
#
#   tests/run_tcp_limits.sh MPIEXEC MAILRAIL_DEMO
set -u
mpiexec=$1
demo=$2
export MAILRAIL_SUBSTRATE=tcp MPIEXEC_TIMEOUT=60

out=$( (ulimit -Sn 100 && MAILRAIL_LOG_LEVEL=info timeout -k 5 90 "$mpiexec" -n 3 "$demo" 3 64) 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 0 ]; then
    echo "FAIL: the job with a soft limit of 100 failed ($rc)"; exit 1
fi
test "$(printf '%s\n' "$out" | grep -c "raised the soft descriptor limit from 100 to 131 for 3 ranks")" -eq 3
test "$(printf '%s\n' "$out" | grep -c "all delivered exactly once")" -eq 3

out=$( (ulimit -n 100 && timeout -k 5 90 "$mpiexec" -n 3 "$demo" 3 64) 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "FAIL: with a hard limit of 100 the job did not fail cleanly ($rc)"; exit 1
fi
test "$(printf '%s\n' "$out" | grep -c "3 ranks need about 131 file descriptors per process, but the hard limit is 100 (ulimit -Hn)")" -eq 3
echo "descriptor limits are handled"
