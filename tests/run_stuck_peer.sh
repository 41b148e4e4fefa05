#!/bin/sh
# mr_finalize() with a stuck peer returns MR_ERR_TIMEOUT within MAILRAIL_TIMEOUT
# plus a margin, instead of blocking in MPI_Finalize until the peer moves
# (tests/test_stuck_peer.c), on every substrate.
#
#   tests/run_stuck_peer.sh MPIEXEC TEST_STUCK_PEER
set -u
mpiexec=$1
prog=$2
status=0
for substrate in tcp ucx mpi; do
    out=$(MAILRAIL_SUBSTRATE=$substrate MAILRAIL_TIMEOUT=3 MAILRAIL_LOG_LEVEL=error \
          MPIEXEC_TIMEOUT=60 timeout -k 5 90 "$mpiexec" -n 2 "$prog" 2>&1)
    line=$(printf '%s\n' "$out" | grep "^finalize: ")
    secs=$(printf '%s\n' "$line" | sed -n 's/.* after \([0-9.]*\) s$/\1/p')
    if [ -z "$secs" ] || ! printf '%s\n' "$line" | grep -q "timed out" ||
       ! awk -v s="$secs" 'BEGIN { exit !(s < 8) }'; then
        printf '%s\n' "$out"
        echo "FAIL: over $substrate: '${line:-no finalize line}'"
        status=1
    else
        echo "ok: over $substrate: $line"
    fi
done
exit $status
