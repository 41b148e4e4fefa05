#!/bin/sh
# The TCP substrate and the descriptor limit. A rank holds a socket for each
# peer it talks to, so:
#  1. with a low soft limit it raises the limit itself and the job runs;
#  2. with a low hard limit the job still starts and runs when the ranks talk
#     to few peers, and rank 0 says once what a rank talking to every other
#     would need;
#  3. when a rank talks to more peers than its limit allows, the peers it
#     cannot connect to fail with a message that names the limit, every rank
#     gets an error instead of hanging, and the job ends by itself.
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
if [ "$rc" -ne 0 ]; then
    echo "FAIL: with a hard limit of 100, 3 ranks did not run ($rc)"; exit 1
fi
test "$(printf '%s\n' "$out" | grep -c "the hard descriptor limit (ulimit -Hn) is 100; a rank that talks to every other of these 3 ranks needs about 131")" -eq 1
test "$(printf '%s\n' "$out" | grep -c "all delivered exactly once")" -eq 3

# MPICH itself keeps about 35 to 42 descriptors per rank here: 45 leaves a
# few, fewer than 8 ranks talking to all 7 others need.
out=$( (ulimit -n 45 && timeout -k 5 90 "$mpiexec" -n 8 "$demo" 3 64) 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "FAIL: 8 ranks talking to all others under a limit of 45 did not fail cleanly ($rc)"; exit 1
fi
if ! printf '%s\n' "$out" | grep -q "no descriptor left to connect to rank [0-9]* (Too many open files): this rank talks to more peers than its descriptor limit allows; raise ulimit -n (and -Hn) to about 136"; then
    echo "FAIL: no rank named the descriptor limit"; exit 1
fi
echo "descriptor limits are handled"
