#!/bin/sh
# Runs the peer-failure test on 3 ranks, one of which is killed with SIGKILL.
# Both survivors must print "survivor <rank>: ok", the victim's launcher (see
# test_peer_failure.c) must print that its rank died of SIGKILL, and mpiexec
# must end by itself. Every process it started exits 0, yet in about one run
# in six hydra still ends with "EXIT STRING: Hangup (signal 1)" and status 1
# (the killed rank's PMI connection closes without a finalize; the process
# that hydra started did get no signal: checked with a SIGHUP handler in the
# launcher). So 0 and 1 are accepted, and a timeout (124, 137) is not.
#
# Over TCP the test runs twice on the same fixed ports: the second job must
# start cleanly on the ports of the crashed one.
#
# With a third argument "silent", 5 ranks and nobody talks to rank 1: the
# survivors that never connected to it learn of its death from the failure
# notices around the ring (test_peer_failure.c). With "gap", 6 ranks and
# ranks 1-3 die, rank 2 watched by the dead only: the survivors learn of it
# when a notice's connection to it is refused. With "connect", 3 ranks and
# rank 1 dies as all are to call mr_connect(): the survivors leave it.
set -u
mpiexec=$1
test=$2
mode=${3:-}
victims=1
if [ "$mode" = silent ]; then
    ranks=5 survivors="0 2 3 4"
elif [ "$mode" = gap ]; then
    ranks=6 survivors="0 4 5" victims="1 2 3"
else
    ranks=3 survivors="0 2"
fi
nsurvivors=$(echo $survivors | wc -w)

run_once() {
    out=$(MPIEXEC_TIMEOUT=60 timeout -k 5 90 "$mpiexec" -disable-auto-cleanup -n "$ranks" \
          "$test" $mode 2>&1)
    rc=$?
    printf '%s\n' "$out"
    echo "mpiexec exited with $rc"
    for r in $survivors; do
        if ! printf '%s\n' "$out" | grep -q "^survivor $r: ok$"; then
            echo "FAIL: survivor rank $r did not pass" >&2
            exit 1
        fi
    done
    for r in $victims; do
        if ! printf '%s\n' "$out" | grep -q "^victim $r: killed by SIGKILL$"; then
            echo "FAIL: rank $r did not die of SIGKILL" >&2
            exit 1
        fi
    done
    # Each survivor logs the death once, not once per refused send (1000 each).
    lines=$(printf '%s\n' "$out" | grep -c "ank 1 \(failed\|has failed\)\|destination 1")
    if [ "$lines" -gt "$nsurvivors" ]; then
        echo "FAIL: the death of rank 1 was logged $lines times by $nsurvivors survivors" >&2
        exit 1
    fi
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 1 ]; then
        echo "FAIL: mpiexec exited with $rc" >&2
        exit 1
    fi
    echo "rank(s) $victims died of SIGKILL; all $nsurvivors survivors saw the failure and finished"
}

if [ "${MAILRAIL_SUBSTRATE:-}" = tcp ]; then
    # A base port from the pid, away from the ephemeral range.
    MAILRAIL_TCP_PORT=$((20000 + ($$ % 3000) * 4))
    export MAILRAIL_TCP_PORT
    run_once
    echo "again on ports $MAILRAIL_TCP_PORT.. after the crashed run"
    run_once
else
    run_once
fi
