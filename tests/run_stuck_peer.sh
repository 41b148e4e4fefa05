#!/bin/sh
# mr_finalize() with a stuck peer returns MR_ERR_TIMEOUT (or MR_ERR_PEER_FAILED:
# the peer was named failed first) within MAILRAIL_TIMEOUT plus a margin,
# instead of blocking in MPI_Finalize until the peer moves
# (tests/test_stuck_peer.c), on every substrate. The three jobs run at once:
# each spends its time waiting.
#
#   tests/run_stuck_peer.sh MPIEXEC TEST_STUCK_PEER
set -u
mpiexec=$1
prog=$2
dir=$(mktemp -d /tmp/run_stuck_peer.XXXXXX)
trap 'rm -rf "$dir"' EXIT
for substrate in tcp ucx mpi; do
    MAILRAIL_SUBSTRATE=$substrate MAILRAIL_TIMEOUT=3 MAILRAIL_LOG_LEVEL=error \
        MPIEXEC_TIMEOUT=60 timeout -k 5 90 "$mpiexec" -n 2 "$prog" >"$dir/$substrate" 2>&1 &
done
wait
status=0
for substrate in tcp ucx mpi; do
    line=$(grep "^finalize: " "$dir/$substrate")
    secs=$(printf '%s\n' "$line" | sed -n 's/.* after \([0-9.]*\) s$/\1/p')
    if [ -z "$secs" ] ||
       ! printf '%s\n' "$line" | grep -q -e "timed out" -e "peer process failed" ||
       ! awk -v s="$secs" 'BEGIN { exit !(s < 8) }'; then
        cat "$dir/$substrate"
        echo "FAIL: over $substrate: '${line:-no finalize line}'"
        status=1
    else
        echo "ok: over $substrate: $line"
    fi
done
exit $status
